//! The digests' side of Redis ([`Digests`], kept by the quota store): a job folded
//! into its group's open digest, the digests due claimed, closed, put back, opened
//! again and ended, each through its script's wrapper ([`crate::redis::digest`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::{Mutex, MutexGuard};

use super::message::{payload_of, DigestHead, StoredItem};
use crate::quota::digest::{DigestMode, DigestSpec};
use crate::quota::keys::Keys;
use crate::redis::conn::{count_call, RedisConn};
use crate::redis::digest::close::Close;
use crate::redis::digest::fold::{Fold, Folded};
use crate::redis::digest::{claim, close, fold, index, reopen};
use crate::redis::scripts::DigestScripts;
use crate::redis::{Scripts, StoreError};

/// How many connections the folds keep for themselves when they wait for replicas
/// on a Redis Cluster (folds beyond these at one moment wait for one to be free).
pub(crate) const FOLD_CONNS: usize = 4;

/// One job to fold, as the worker decoded it.
#[derive(Debug)]
pub struct FoldJob<'a> {
    /// The job's id.
    pub id: &'a str,
    /// Its recipient, channel, tenant and category.
    pub recipient: &'a str,
    /// Its channel.
    pub channel: &'a str,
    /// Its category.
    pub category: &'a str,
    /// Its tenant.
    pub tenant: Option<&'a str>,
    /// Its zone as the job named it (`None`: it named none).
    pub timezone: Option<&'a str>,
    /// Its `digest_key`, or else its category.
    pub key: &'a str,
    /// When a worker first saw it.
    pub first_seen: DateTime<Utc>,
    /// Its `expires_at`.
    pub expires_at: Option<DateTime<Utc>>,
    /// Its body (its payload is kept as written).
    pub body: &'a [u8],
    /// Its collapse key: the digest keeps the newest item with it.
    pub collapse_key: Option<&'a str>,
    /// `held`: the caps' next allowed instant, when the digest it opens closes.
    pub closes_at: Option<DateTime<Utc>>,
}

/// The digests' side of Redis.
pub struct Digests {
    conn: RedisConn,
    keys: Keys,
    scripts: DigestScripts,
    /// Redis commands sent (shared with the store's counter).
    calls: Arc<AtomicU64>,
    /// How long a folded job's mark and a reopened digest are kept
    /// (`redis.record_ttl`).
    keep: Duration,
    /// `redis.wait_replicas` and `redis.wait_timeout` (ms) for folds.
    wait: Option<(u32, u64)>,
    /// With waiting on a cluster, connections of the folds' own (a fold's `WAIT`
    /// holds its connection; see [`RedisConn::dedicated`]), taken in turn; empty
    /// otherwise (the folds use the shared connection).
    fold_conns: Vec<Mutex<RedisConn>>,
    /// The next of `fold_conns` to try first.
    fold_next: AtomicUsize,
}

impl std::fmt::Debug for Digests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Digests")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl Digests {
    /// The digests' side on `conn`, with the folds' own connections when folds
    /// wait for replicas (`wait`: `redis.wait_replicas` and `redis.wait_timeout`);
    /// `keep`, how long an ended digest's record stays (`redis.record_ttl`).
    pub(crate) async fn connect(
        conn: &RedisConn,
        scripts: &Scripts,
        keys: &Keys,
        calls: &Arc<AtomicU64>,
        keep: Duration,
        wait: Option<(u32, u64)>,
    ) -> Result<Digests, StoreError> {
        let fold_conns = match wait {
            Some(_) => conn.dedicated(FOLD_CONNS).await?,
            None => Vec::new(),
        };
        Ok(Digests {
            conn: conn.clone(),
            keys: keys.clone(),
            scripts: scripts.digest.clone(),
            calls: calls.clone(),
            keep,
            wait,
            fold_conns: fold_conns.into_iter().map(Mutex::new).collect(),
            fold_next: AtomicUsize::new(0),
        })
    }

    /// Fold `job` into its group's open digest (opening one with `spec`), and put
    /// the digest in the index of close instants.
    pub async fn fold(&self, job: &FoldJob<'_>, spec: &DigestSpec) -> Result<Folded, StoreError> {
        let keys = self.keys.for_tenant(job.tenant);
        let group = keys.digest_group(job.recipient, job.channel, job.key);
        let item = StoredItem {
            id: job.id.to_string(),
            at: job.first_seen.timestamp_millis(),
            exp: job.expires_at.map(|t| t.timestamp_millis()),
            payload: payload_of(job.body).unwrap_or_else(|| {
                serde_json::value::RawValue::from_string("null".into()).expect("null is JSON")
            }),
        };
        let item = serde_json::to_string(&item).expect("an item is JSON");
        let head = DigestHead {
            id: String::new(),
            recipient: job.recipient.to_string(),
            channel: job.channel.to_string(),
            category: job.category.to_string(),
            tenant: job.tenant.map(str::to_string),
            timezone: job.timezone.map(str::to_string),
            key: job.key.to_string(),
        };
        let head = serde_json::to_string(&head).expect("a head is JSON");
        let spec_text = spec.encoded();
        let fold = Fold {
            group: &group,
            job: job.id,
            item: &item,
            head: &head,
            spec: &spec_text,
            window_ms: spec.window.as_millis() as u64,
            keep_ms: self.keep.as_millis() as u64,
            max_window_ms: match spec.mode {
                DigestMode::Sliding => spec.max_window.map_or(0, |d| d.as_millis() as u64),
                _ => 0,
            },
            collapse_key: job.collapse_key,
            close_at_ms: job.closes_at.map_or(0, |t| t.timestamp_millis().max(1)),
        };
        count_call(&self.calls);
        let index = self.keys.digests();
        let lent = self.fold_conn().await;
        let conn = lent.as_deref().unwrap_or(&self.conn);
        fold::fold(conn, &self.scripts.fold, &index, &fold, self.wait).await
    }

    /// One of the folds' own connections (waiting for replicas on a cluster): the
    /// first free one from the next in turn, else the next in turn once it is free;
    /// `None` when there are none (the shared connection is used).
    async fn fold_conn(&self) -> Option<MutexGuard<'_, RedisConn>> {
        let n = self.fold_conns.len();
        if n == 0 {
            return None;
        }
        let first = self.fold_next.fetch_add(1, Ordering::Relaxed);
        for i in 0..n {
            if let Ok(guard) = self.fold_conns[(first + i) % n].try_lock() {
                return Some(guard);
            }
        }
        Some(self.fold_conns[first % n].lock().await)
    }

    /// Claim up to `max` digests due to close, each for `lease_ms`.
    pub async fn claim(&self, lease_ms: u64, max: usize) -> Result<Vec<String>, StoreError> {
        count_call(&self.calls);
        let index = self.keys.digests();
        claim::claim(&self.conn, &self.scripts.claim, &index, lease_ms, max).await
    }

    /// Close the digest at `key` if it is due (`now`: whatever its close instant):
    /// no item joins it from then on; its items, read.
    pub async fn close(&self, key: &str, now: bool) -> Result<Close, StoreError> {
        count_call(&self.calls);
        close::close(&self.conn, &self.scripts.close, key, now).await
    }

    /// Put the digest at `key`, claimed too early, back in the index at `at` (ms).
    pub async fn reschedule(&self, key: &str, at: i64) -> Result<(), StoreError> {
        count_call(&self.calls);
        index::reschedule(&self.conn, &self.keys.digests(), key, at).await
    }

    /// The key of digest `id` of `recipient` (of `tenant`).
    pub fn key(&self, tenant: Option<&str>, recipient: &str, id: &str) -> String {
        let group = self.keys.for_tenant(tenant).digest_group(recipient, "", "");
        format!("{}dgm/{id}", group.base)
    }

    /// A `held` digest refused when it went: open again until `close_at`.
    pub async fn reopen(&self, key: &str, close_at: DateTime<Utc>) -> Result<bool, StoreError> {
        count_call(&self.calls);
        let keep_ms = self.keep.as_millis() as u64;
        let at = close_at.timestamp_millis();
        let index = self.keys.digests();
        let script = &self.scripts.reopen;
        reopen::reopen(&self.conn, script, &index, key, at, keep_ms).await
    }

    /// The digest at `key` is done with: its keys and its place in the index go.
    pub async fn end(&self, key: &str) -> Result<(), StoreError> {
        count_call(&self.calls);
        index::done(&self.conn, &self.keys.digests(), key).await
    }
}
