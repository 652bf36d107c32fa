//! A Redis that lost its data (a restart without persistence, a `FLUSHALL`, a
//! failover to an empty replica) forgets every recorded send. Each worker notices
//! within a second: a marker written once ([`crate::redis::marker`]) is read back by
//! the health watcher every second (and so at once after a reconnect, which the
//! same watcher sees); a marker gone or replaced means the data went with it. That
//! is logged at ERROR, counted (`quota_worker_redis_resets_total`), shown on the
//! status page, and with `redis.on_reset = "pause"` the pause mark is set in Redis:
//! every worker then holds the jobs that caps or preferences could stop (of
//! enforced policies with rules, and of policies that are not required:
//! [`crate::decide::paused`]) until `quota-worker admin resume` deletes it. [`judge`] is pure; [`Resets::check`]
//! does the I/O.
//!
//! Cost: one `MGET` a second a worker (it replaces the watcher's `PING`), nothing
//! per job but one atomic load. A Redis that lost its data while no worker ran is
//! taken for a first start (nothing tells them apart); on a Redis Cluster the
//! marker lives on the master that owns its slot, so only that master's loss is
//! seen.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::OnReset;
use crate::redis::{marker, StoreError};
use crate::store::QuotaStore;

/// What one look at the marker says, given the marker this worker knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// This worker's first look and no marker: write one (a first start).
    Write,
    /// This worker's first look, or the same marker as before: keep it.
    Keep(String),
    /// The marker this worker knew is gone (`None`) or replaced by another
    /// worker's: Redis lost its data.
    Lost {
        /// What it found instead.
        found: Option<String>,
    },
}

/// What the marker seen now means, given the one this worker knew. Pure.
pub fn judge(known: Option<&str>, seen: Option<&str>) -> Verdict {
    match (known, seen) {
        (None, None) => Verdict::Write,
        (None, Some(v)) => Verdict::Keep(v.to_string()),
        (Some(k), Some(v)) if k == v => Verdict::Keep(v.to_string()),
        (Some(_), found) => Verdict::Lost {
            found: found.map(str::to_string),
        },
    }
}

/// This worker's view of Redis resets and of the pause.
#[derive(Debug, Default)]
pub struct Resets {
    known: Mutex<Option<String>>,
    paused: AtomicBool,
    count: AtomicU64,
    last: Mutex<Option<DateTime<Utc>>>,
    pause_reason: Mutex<Option<String>>,
}

/// What the status page shows of it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ResetView {
    /// Times this worker found Redis without its data.
    pub resets: u64,
    /// The last time.
    pub last: Option<DateTime<Utc>>,
    /// Whether jobs of policies with rules or not required are held (until
    /// `admin resume`).
    pub paused: bool,
    /// Why, as the pause mark says.
    pub paused_because: Option<String>,
}

impl Resets {
    /// Whether the pause holds jobs now (see [`crate::decide::paused`]).
    pub fn paused(&self) -> bool {
        self.paused.load(Ordering::Relaxed)
    }

    /// What the status page shows.
    pub fn view(&self) -> ResetView {
        ResetView {
            resets: self.count.load(Ordering::Relaxed),
            last: *self.last.lock().unwrap_or_else(|e| e.into_inner()),
            paused: self.paused(),
            paused_because: self
                .pause_reason
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        }
    }

    /// Look at the marker and the pause mark once (the health watcher, every
    /// second): note a reset and react to it as `on_reset` says, and follow the
    /// pause mark. An error is Redis not answering.
    pub async fn check(&self, store: &QuotaStore, on_reset: OnReset) -> Result<(), StoreError> {
        let conn = store.connection();
        let keys = store.keys();
        let mut seen = marker::read(&conn, keys).await?;
        let known = self.known.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let fresh = || uuid::Uuid::now_v7().to_string();
        let now_known = match judge(known.as_deref(), seen.marker.as_deref()) {
            Verdict::Keep(v) => v,
            Verdict::Write => {
                let v = marker::write(&conn, keys, &fresh()).await?;
                tracing::info!(marker = %v, "wrote the redis reset marker (no marker: a first start)");
                v
            }
            Verdict::Lost { found } => {
                let at = store.redis_now();
                self.count.fetch_add(1, Ordering::Relaxed);
                *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
                metrics::counter!(crate::metrics::REDIS_RESETS_TOTAL).increment(1);
                tracing::error!(
                    was = known.as_deref().unwrap_or(""),
                    found = found.as_deref().unwrap_or("(none)"),
                    on_reset = ?on_reset,
                    "redis lost its data (its reset marker is gone): every recorded send is \
                     forgotten, so recipients may be sent to again within their caps; \
                     restarted without persistence, flushed, or failed over to an empty replica?"
                );
                if on_reset == OnReset::Pause {
                    let why = format!(
                        "redis found without its data at {}; jobs of policies with rules or not required held until `quota-worker admin resume`",
                        at.to_rfc3339()
                    );
                    marker::pause(&conn, keys, &why).await?;
                    seen.paused = Some(seen.paused.unwrap_or(why));
                }
                match found {
                    Some(v) => v,
                    None => marker::write(&conn, keys, &fresh()).await?,
                }
            }
        };
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = Some(now_known);
        let paused = seen.paused.is_some();
        if self.paused.swap(paused, Ordering::Relaxed) != paused {
            metrics::gauge!(crate::metrics::PAUSED).set(if paused { 1.0 } else { 0.0 });
            if paused {
                tracing::warn!(
                    because = seen.paused.as_deref().unwrap_or(""),
                    "holding the jobs of policies with rules or not required until `quota-worker admin resume`"
                );
            } else {
                tracing::info!(
                    "resumed: jobs of policies with rules or not required are decided again"
                );
            }
        }
        *self.pause_reason.lock().unwrap_or_else(|e| e.into_inner()) = seen.paused;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_gone_or_replaced_is_a_reset_a_first_look_is_not() {
        assert_eq!(judge(None, None), Verdict::Write);
        assert_eq!(judge(None, Some("a")), Verdict::Keep("a".into()));
        assert_eq!(judge(Some("a"), Some("a")), Verdict::Keep("a".into()));
        assert_eq!(judge(Some("a"), None), Verdict::Lost { found: None });
        // another worker saw the loss first and wrote a new marker
        assert_eq!(
            judge(Some("a"), Some("b")),
            Verdict::Lost {
                found: Some("b".into())
            }
        );
    }
}
