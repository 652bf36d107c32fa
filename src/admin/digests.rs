//! Digests for the operator (docs/guide/digests.md): one by its id
//! ([`Digests::show`]), closed now ([`Digests::flush`]: a running worker's closer
//! sends it within a moment), and a recipient's open digests ([`Digests::of`], in
//! `admin recipient`).

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::AdminError;
use crate::digest::message::DigestHead;
use crate::quota::digest::DigestSpec;
use crate::quota::keys::{digest_keys, digest_set};
use crate::redis::digest::close::Close;
use crate::redis::RedisConn;
use crate::store::QuotaStore;

/// What `admin digest ID` shows.
///
/// Its fields are the keys of the JSON `admin digest ID` prints, one each: it
/// mirrors that output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DigestInfo {
    /// Its id (`dg-…`), the message id it is sent under.
    pub id: String,
    /// `open` (items join it), `full` (it reached `max_items`: closing) or `closing`
    /// (a closer has it: it is being sent).
    pub state: String,
    /// The recipient, as its first job named it.
    pub recipient: String,
    /// The channel.
    pub channel: String,
    /// The category of its first item (its policy admits it).
    pub category: String,
    /// The tenant.
    pub tenant: Option<String>,
    /// The group's key: the items' `digest_key`, or else their category.
    pub key: String,
    /// Items it holds (cancelled ones included until it closes).
    pub count: u64,
    /// When its first item opened it.
    pub opened_at: Option<DateTime<Utc>>,
    /// When it closes (sliding: as its latest item moved it).
    pub closes_at: Option<DateTime<Utc>>,
    /// The settings it opened with: `mode`, `window`, `max_window`, `max_items`,
    /// `keep`, `keep_from`.
    pub settings: Option<DigestSettingsView>,
    /// The ids of its items, in the order they were folded.
    pub items: Vec<String>,
    /// Redis time.
    pub now: DateTime<Utc>,
}

/// The settings a digest opened with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DigestSettingsView {
    /// `window` or `sliding`.
    pub mode: String,
    /// Its window, ms.
    pub window_ms: u64,
    /// `sliding`: the longest it stays open, ms.
    pub max_window_ms: Option<u64>,
    /// It closes at once with this many items.
    pub max_items: u32,
    /// Items carried in full.
    pub keep: u32,
    /// `first` or `last`.
    pub keep_from: String,
}

/// One open digest of a recipient (`admin recipient R`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OpenDigest {
    /// Its id.
    pub id: String,
    /// Its group: channel and key.
    pub channel: String,
    /// The group's key (`digest_key` or category).
    pub key: String,
    /// Items it holds.
    pub count: u64,
    /// When it closes.
    pub closes_at: Option<DateTime<Utc>>,
    /// `open`, `full` or `closing`.
    pub state: String,
}

/// What `admin digest ID flush` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flushed {
    /// The digest's id.
    pub id: String,
    /// Items it holds.
    pub count: usize,
    /// When (Redis time).
    pub at: DateTime<Utc>,
}

/// Reads and flushes digests.
#[derive(Debug)]
pub struct Digests<'a> {
    store: &'a QuotaStore,
}

fn instant(ms: Option<&String>) -> Option<DateTime<Utc>> {
    DateTime::from_timestamp_millis(ms?.parse().ok()?)
}

/// Read fields of a digest's hash: (field -> value).
async fn fields(
    conn: &RedisConn,
    meta: &str,
) -> Result<std::collections::HashMap<String, String>, AdminError> {
    let mut conn = conn.clone();
    Ok(redis::cmd("HGETALL")
        .arg(meta)
        .query_async(&mut conn)
        .await
        .map_err(crate::redis::StoreError::from)?)
}

/// `open`, `full` or `closing`, from a digest's hash and its group's open digest.
fn state_of(f: &std::collections::HashMap<String, String>, open_id: Option<&str>) -> String {
    match f.get("state").map(String::as_str) {
        Some("closing") => "closing".into(),
        // its group opens a new digest from now on: it reached max_items
        _ if open_id != f.get("id").map(String::as_str) => "full".into(),
        _ => "open".into(),
    }
}

impl<'a> Digests<'a> {
    /// Over a connected store.
    pub fn new(store: &'a QuotaStore) -> Self {
        Digests { store }
    }

    /// The key of digest `id`, from the index of close instants.
    async fn find(&self, id: &str) -> Result<String, AdminError> {
        if !id.starts_with("dg-") || id.contains(['*', '?', '[', ']', '\\']) {
            return Err(AdminError::Invalid(format!(
                "`{id}` is not a digest id (they begin with `dg-`)"
            )));
        }
        let mut conn = self.store.connection();
        let index = self.store.keys().digests();
        let pattern = format!("*}}/dgm/{id}");
        let mut cursor = 0u64;
        loop {
            let (next, found): (u64, Vec<String>) = redis::cmd("ZSCAN")
                .arg(&index)
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(crate::redis::StoreError::from)?;
            // ZSCAN answers member, score, member, score…
            if let Some(key) = found.into_iter().step_by(2).next() {
                return Ok(key);
            }
            if next == 0 {
                return Err(AdminError::Invalid(format!(
                    "no open digest `{id}` (sent already, or never opened)"
                )));
            }
            cursor = next;
        }
    }

    /// Digest `id`: its group, items, settings and when it closes.
    pub async fn show(&self, id: &str) -> Result<DigestInfo, AdminError> {
        let now = self.store.sync_clock().await?;
        let key = self.find(id).await?;
        let conn = self.store.connection();
        let f = fields(&conn, &key).await?;
        let head: DigestHead = f
            .get("head")
            .and_then(|h| serde_json::from_str(h).ok())
            .ok_or_else(|| AdminError::Invalid(format!("no open digest `{id}` (sent already)")))?;
        let open_id = self.open_of(&f).await?;
        let order = digest_keys(&key).expect("a digest's key").order;
        let mut c = conn.clone();
        let items: Vec<String> = redis::cmd("LRANGE")
            .arg(&order)
            .arg(0)
            .arg(-1)
            .query_async(&mut c)
            .await
            .map_err(crate::redis::StoreError::from)?;
        let settings =
            f.get("spec")
                .and_then(|s| DigestSpec::decode(s))
                .map(|s| DigestSettingsView {
                    mode: s.mode.as_str().into(),
                    window_ms: s.window.as_millis() as u64,
                    max_window_ms: s.max_window.map(|d| d.as_millis() as u64),
                    max_items: s.max_items,
                    keep: s.keep,
                    keep_from: s.keep_from.as_str().into(),
                });
        Ok(DigestInfo {
            id: id.to_string(),
            state: state_of(&f, open_id.as_deref()),
            recipient: head.recipient,
            channel: head.channel,
            category: head.category,
            tenant: head.tenant,
            key: head.key,
            count: f.get("count").and_then(|c| c.parse().ok()).unwrap_or(0),
            opened_at: instant(f.get("opened_at")),
            closes_at: instant(f.get("close_at")),
            settings,
            items,
            now,
        })
    }

    /// The id of the open digest of the group of a digest's hash `f`.
    async fn open_of(
        &self,
        f: &std::collections::HashMap<String, String>,
    ) -> Result<Option<String>, AdminError> {
        let Some(group) = f.get("group") else {
            return Ok(None);
        };
        let mut conn = self.store.connection();
        Ok(redis::cmd("HGET")
            .arg(group)
            .arg("open")
            .query_async(&mut conn)
            .await
            .map_err(crate::redis::StoreError::from)?)
    }

    /// Close digest `id` now (no item joins it from now on) and make it due: a
    /// running worker's closer sends it within a moment.
    pub async fn flush(&self, id: &str) -> Result<Flushed, AdminError> {
        let key = self.find(id).await?;
        let closed = match self.store.digests().close(&key, true).await? {
            Close::Closed(closed) => closed,
            _ => {
                return Err(AdminError::Invalid(format!(
                    "no open digest `{id}` (sent already)"
                )))
            }
        };
        self.store.digests().reschedule(&key, 0).await?;
        Ok(Flushed {
            id: id.to_string(),
            count: closed.items.len(),
            at: DateTime::from_timestamp_millis(closed.now_ms).unwrap_or_default(),
        })
    }

    /// The open digests of `recipient` (of `tenant`).
    pub async fn of(
        &self,
        recipient: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<OpenDigest>, AdminError> {
        let keys = self.store.keys().for_tenant(tenant);
        let group = keys.digest_group(recipient, "", "");
        let set = format!("{}dgs", group.base);
        let mut conn = self.store.connection();
        let mut ids: Vec<String> = redis::cmd("SMEMBERS")
            .arg(&set)
            .query_async(&mut conn)
            .await
            .map_err(crate::redis::StoreError::from)?;
        ids.sort();
        let mut out = Vec::new();
        for id in ids {
            let meta = format!("{}dgm/{id}", group.base);
            debug_assert_eq!(digest_set(&meta).map(|(s, _)| s), Some(set.clone()));
            let f = fields(&conn, &meta).await?;
            let Some(head) = f
                .get("head")
                .and_then(|h| serde_json::from_str::<DigestHead>(h).ok())
            else {
                continue;
            };
            let open_id = self.open_of(&f).await?;
            out.push(OpenDigest {
                state: state_of(&f, open_id.as_deref()),
                id,
                channel: head.channel,
                key: head.key,
                count: f.get("count").and_then(|c| c.parse().ok()).unwrap_or(0),
                closes_at: instant(f.get("close_at")),
            });
        }
        Ok(out)
    }
}
