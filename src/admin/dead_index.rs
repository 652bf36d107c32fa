//! The browsable index of the dead letters, in Redis beside the dead-letter queue:
//! the worker writes one entry for each job it dead-letters ([`record`], one
//! script, `lua/dead_index.lua`), the oldest dropped beyond `console.dead_index`;
//! the console's dead-letter pages read it ([`page`], [`entry`]) and never the
//! queue, whose only reading is a walk that takes and puts back every message.
//! Replaying or purging still walks the queue ([`super::DeadLetters`]), selecting
//! by the ids the index found, and then forgets those entries ([`forget`]).
//!
//! The index is a sorted set of short summaries (when, id, reason, policy,
//! channel, recipient tag) scored by when, so a filter reads the summaries alone;
//! a hash holds each whole entry (headers and body), read only for the page shown.
//! What the broker dead-letters by itself (a delivery limit) is not in it.

use std::sync::LazyLock;

use chrono::{DateTime, TimeZone, Utc};
use lapin::BasicProperties;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DeadLetterInfo;
use crate::quota::keys::Keys;
use crate::redis::{RedisConn, StoreError};

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../lua/dead_index.lua")));

/// Bodies longer than this are cut in the index (the queue keeps them whole).
const BODY_MAX: usize = 16 * 1024;

/// One dead letter as the index keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Its summary: the entry's name in the index.
    #[serde(skip)]
    pub key: String,
    /// The job id, when known.
    pub id: Option<String>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// The worker's detail.
    pub detail: String,
    /// When.
    pub at: DateTime<Utc>,
    /// Times the worker handled it.
    pub attempts: Option<i64>,
    /// The policy of its category, when decoded.
    pub policy: Option<String>,
    /// Its channel, when decoded.
    pub channel: Option<String>,
    /// Its recipient's hash tag (of its tenant), when decoded.
    pub recipient_tag: Option<String>,
    /// Its tenant.
    pub tenant: Option<String>,
    /// Every header and property.
    pub properties: Value,
    /// The body (JSON when it is JSON, else text; cut at 16 KiB).
    pub body: Value,
}

/// What the summary says of an entry: enough to filter on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Summary(
    i64,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
);

/// Which entries a page shows; `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this reason.
    pub reason: Option<String>,
    /// Only this policy.
    pub policy: Option<String>,
    /// Only this channel.
    pub channel: Option<String>,
    /// Only this recipient tag.
    pub recipient_tag: Option<String>,
    /// Only this job id.
    pub id: Option<String>,
}

impl Filter {
    fn matches(&self, s: &Summary) -> bool {
        let is = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        self.reason.as_ref().is_none_or(|r| *r == s.2)
            && is(&self.id, &s.1)
            && is(&self.policy, &s.3)
            && is(&self.channel, &s.4)
            && is(&self.recipient_tag, &s.5)
    }
}

/// What the job said of itself, for the index (the worker knows it once decoded).
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// The policy of its category.
    pub policy: Option<String>,
    /// Its channel.
    pub channel: Option<String>,
    /// Its recipient's tag.
    pub recipient_tag: Option<String>,
    /// Its tenant.
    pub tenant: Option<String>,
}

/// The index and its entries: one hash tag, so one script takes both on a cluster.
fn names(keys: &Keys) -> (String, String) {
    let p = keys.prefix();
    (
        format!("{p}:{{dead}}:index"),
        format!("{p}:{{dead}}:entries"),
    )
}

/// The entry of a dead letter published with `props` and `body`.
pub fn entry(props: &BasicProperties, body: &[u8], known: Known, now: DateTime<Utc>) -> Entry {
    let cut = &body[..body.len().min(BODY_MAX)];
    let info = DeadLetterInfo::read(props, cut, now, true);
    Entry {
        key: String::new(),
        id: info.id,
        reason: info.reason,
        detail: info.detail,
        at: now,
        attempts: info.attempts,
        policy: known.policy,
        channel: known.channel,
        recipient_tag: known.recipient_tag,
        tenant: known.tenant,
        properties: info.properties.unwrap_or(Value::Null),
        body: info.body.unwrap_or(Value::Null),
    }
}

/// Add `entry` to the index, keeping `bound` entries at most; the entries kept.
pub async fn record(
    conn: &RedisConn,
    keys: &Keys,
    entry: &Entry,
    bound: u32,
) -> Result<u64, StoreError> {
    let (index, entries) = names(keys);
    let ms = entry.at.timestamp_millis();
    // two dead letters of one id in one millisecond stay two entries
    let nonce = uuid::Uuid::now_v7().simple().to_string();
    let summary = Summary(
        ms,
        entry.id.clone(),
        entry.reason.clone(),
        entry.policy.clone(),
        entry.channel.clone(),
        entry.recipient_tag.clone(),
        nonce,
    );
    // an entry is strings and JSON values: it always serializes
    let json = serde_json::to_string(entry).unwrap_or_default();
    let mut conn = conn.clone();
    Ok(SCRIPT
        .key(index)
        .key(entries)
        .arg(serde_json::to_string(&summary).unwrap_or_default())
        .arg(ms)
        .arg(json)
        .arg(bound)
        .invoke_async(&mut conn)
        .await?)
}

/// One page of the entries `filter` selects, newest first: how many it selects in
/// all, and the `limit` after the first `offset`.
pub async fn page(
    conn: &RedisConn,
    keys: &Keys,
    filter: &Filter,
    offset: usize,
    limit: usize,
) -> Result<(usize, Vec<Entry>), StoreError> {
    if *filter == Filter::default() {
        return newest(conn, keys, offset, limit).await;
    }
    let selected = select(conn, keys, filter).await?;
    let shown: Vec<String> = selected.iter().skip(offset).take(limit).cloned().collect();
    Ok((selected.len(), read(conn, keys, &shown).await?))
}

/// [`page`] without a filter: the index's count and one range of it, whatever its
/// size.
async fn newest(
    conn: &RedisConn,
    keys: &Keys,
    offset: usize,
    limit: usize,
) -> Result<(usize, Vec<Entry>), StoreError> {
    let (index, _) = names(keys);
    let mut c = conn.clone();
    let (count, shown): (usize, Vec<String>) = redis::pipe()
        .cmd("ZCARD")
        .arg(&index)
        .cmd("ZRANGE")
        .arg(&index)
        .arg(offset)
        .arg(offset + limit.max(1) - 1)
        .arg("REV")
        .query_async(&mut c)
        .await?;
    Ok((count, read(conn, keys, &shown).await?))
}

/// Every summary `filter` selects, newest first.
pub async fn select(
    conn: &RedisConn,
    keys: &Keys,
    filter: &Filter,
) -> Result<Vec<String>, StoreError> {
    let (index, _) = names(keys);
    let mut conn = conn.clone();
    let all: Vec<String> = redis::cmd("ZRANGE")
        .arg(index)
        .arg(0)
        .arg(-1)
        .arg("REV")
        .query_async(&mut conn)
        .await?;
    // a summary holds each value it is filtered on as a JSON string: one that does
    // not is not parsed
    let wanted: Vec<String> = [
        &filter.reason,
        &filter.policy,
        &filter.channel,
        &filter.recipient_tag,
        &filter.id,
    ]
    .into_iter()
    .flatten()
    .map(|v| serde_json::to_string(v).unwrap_or_default())
    .collect();
    Ok(all
        .into_iter()
        .filter(|m| wanted.iter().all(|w| m.contains(w.as_str())))
        .filter(|m| serde_json::from_str::<Summary>(m).is_ok_and(|s| filter.matches(&s)))
        .collect())
}

/// The ids of the summaries `selected`.
pub fn ids(selected: &[String]) -> Vec<String> {
    let mut ids: Vec<String> = selected
        .iter()
        .filter_map(|m| serde_json::from_str::<Summary>(m).ok()?.1)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// The entries named `selected`, in that order (one gone meanwhile is left out).
pub async fn read(
    conn: &RedisConn,
    keys: &Keys,
    selected: &[String],
) -> Result<Vec<Entry>, StoreError> {
    if selected.is_empty() {
        return Ok(Vec::new());
    }
    let (_, entries) = names(keys);
    let mut conn = conn.clone();
    let found: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(entries)
        .arg(selected)
        .query_async(&mut conn)
        .await?;
    Ok(selected
        .iter()
        .zip(found)
        .filter_map(|(key, json)| {
            let mut e: Entry = serde_json::from_str(&json?).ok()?;
            e.key = key.clone();
            Some(e)
        })
        .collect())
}

/// The newest entry of job `id`, if the index has one.
pub async fn entry_of(
    conn: &RedisConn,
    keys: &Keys,
    id: &str,
) -> Result<Option<Entry>, StoreError> {
    let filter = Filter {
        id: Some(id.to_string()),
        ..Filter::default()
    };
    let selected = select(conn, keys, &filter).await?;
    Ok(read(conn, keys, &selected[..selected.len().min(1)])
        .await?
        .pop())
}

/// Forget the entries `selected` (replayed or purged).
pub async fn forget(conn: &RedisConn, keys: &Keys, selected: &[String]) -> Result<(), StoreError> {
    if selected.is_empty() {
        return Ok(());
    }
    let (index, entries) = names(keys);
    let mut conn = conn.clone();
    redis::pipe()
        .cmd("ZREM")
        .arg(&index)
        .arg(selected)
        .ignore()
        .cmd("HDEL")
        .arg(&entries)
        .arg(selected)
        .ignore()
        .query_async::<()>(&mut conn)
        .await?;
    Ok(())
}

/// When a summary says its entry was written.
pub fn when(key: &str) -> Option<DateTime<Utc>> {
    let s: Summary = serde_json::from_str(key).ok()?;
    Utc.timestamp_millis_opt(s.0).single()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(reason: &str, channel: Option<&str>) -> Summary {
        Summary(
            1,
            Some("j1".into()),
            reason.into(),
            Some("default".into()),
            channel.map(str::to_string),
            Some("tag".into()),
            "n".into(),
        )
    }

    #[test]
    fn a_filter_matches_what_it_names_and_nothing_else() {
        let all = Filter::default();
        assert!(all.matches(&summary("capped", None)));
        let capped_sms = Filter {
            reason: Some("capped".into()),
            channel: Some("sms".into()),
            ..Filter::default()
        };
        assert!(capped_sms.matches(&summary("capped", Some("sms"))));
        assert!(!capped_sms.matches(&summary("capped", Some("email"))));
        assert!(!capped_sms.matches(&summary("capped", None)));
        assert!(!capped_sms.matches(&summary("expired", Some("sms"))));
        let tag = Filter {
            recipient_tag: Some("other".into()),
            ..Filter::default()
        };
        assert!(!tag.matches(&summary("capped", None)));
    }
}
