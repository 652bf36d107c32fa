//! The digests' side of the store: a job folded into its group's open digest, the
//! digests due claimed, closed and ended ([`crate::redis::digest`] for the calls,
//! docs/guide/digests.md for the whole).

use chrono::{DateTime, Utc};

use super::QuotaStore;
use crate::quota::digest::{DigestHead, DigestMode, DigestSpec, StoredItem};
use crate::redis::digest::{self, Close, Fold, Folded};
use crate::redis::StoreError;

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

impl QuotaStore {
    /// Fold `job` into its group's open digest (opening one with `spec`), and put
    /// the digest in the index of close instants.
    pub async fn fold(&self, job: &FoldJob<'_>, spec: &DigestSpec) -> Result<Folded, StoreError> {
        let keys = self.keys.for_tenant(job.tenant);
        let group = keys.digest_group(job.recipient, job.channel, job.key);
        let item = StoredItem {
            id: job.id.to_string(),
            at: job.first_seen.timestamp_millis(),
            exp: job.expires_at.map(|t| t.timestamp_millis()),
            payload: crate::quota::digest::payload_of(job.body).unwrap_or_else(|| {
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
            keep_ms: self.record_ttl.as_millis() as u64,
            max_window_ms: match spec.mode {
                DigestMode::Sliding => spec.max_window.map_or(0, |d| d.as_millis() as u64),
                _ => 0,
            },
            collapse_key: job.collapse_key,
            close_at_ms: job.closes_at.map_or(0, |t| t.timestamp_millis().max(1)),
        };
        self.count_call();
        let index = self.keys.digests();
        let lent = self.fold_conn().await;
        let conn = lent.as_deref().unwrap_or(&self.conn);
        digest::fold(
            conn,
            &self.scripts.digest_fold,
            &index,
            &fold,
            self.fold_wait,
        )
        .await
    }

    /// One of the folds' own connections (waiting for replicas on a cluster): the
    /// first free one from the next in turn, else the next in turn once it is free;
    /// `None` when there are none (the shared connection is used).
    async fn fold_conn(&self) -> Option<tokio::sync::MutexGuard<'_, crate::redis::RedisConn>> {
        let n = self.fold_conns.len();
        if n == 0 {
            return None;
        }
        let first = self
            .fold_next
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for i in 0..n {
            if let Ok(guard) = self.fold_conns[(first + i) % n].try_lock() {
                return Some(guard);
            }
        }
        Some(self.fold_conns[first % n].lock().await)
    }

    /// Claim up to `max` digests due to close, each for `lease_ms`.
    pub async fn claim_digests(
        &self,
        lease_ms: u64,
        max: usize,
    ) -> Result<Vec<String>, StoreError> {
        self.count_call();
        let index = self.keys.digests();
        digest::claim(
            &self.conn,
            &self.scripts.digest_claim,
            &index,
            lease_ms,
            max,
        )
        .await
    }

    /// Close the digest at `key` if it is due (`now`: whatever its close instant):
    /// no item joins it from then on; its items, read.
    pub async fn close_digest(&self, key: &str, now: bool) -> Result<Close, StoreError> {
        self.count_call();
        digest::close(&self.conn, &self.scripts.digest_close, key, now).await
    }

    /// Put the digest at `key`, claimed too early, back in the index at `at` (ms).
    pub async fn reschedule_digest(&self, key: &str, at: i64) -> Result<(), StoreError> {
        self.count_call();
        digest::reschedule(&self.conn, &self.keys.digests(), key, at).await
    }

    /// The key of digest `id` of `recipient` (of `tenant`).
    pub fn digest_key(&self, tenant: Option<&str>, recipient: &str, id: &str) -> String {
        let group = self.keys.for_tenant(tenant).digest_group(recipient, "", "");
        format!("{}dgm/{id}", group.base)
    }

    /// A `held` digest refused when it went: open again until `close_at`.
    pub async fn reopen_digest(
        &self,
        key: &str,
        close_at: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.count_call();
        let keep_ms = self.record_ttl.as_millis() as u64;
        let at = close_at.timestamp_millis();
        let index = self.keys.digests();
        digest::reopen(
            &self.conn,
            &self.scripts.digest_reopen,
            &index,
            key,
            at,
            keep_ms,
        )
        .await
    }

    /// The digest at `key` is done with: its keys and its place in the index go.
    pub async fn end_digest(&self, key: &str) -> Result<(), StoreError> {
        self.count_call();
        digest::done(&self.conn, &self.keys.digests(), key).await
    }
}
