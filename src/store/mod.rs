//! The quota store: the Redis side of every decision.
//!
//! [`QuotaStore::admit`] asks two scripts: `src/admission/lua/` (the recipient's caps, one
//! sorted set per recipient and policy) and `lua/rate.lua` (the channel's GCRA send
//! rate). When the channel is not pacing, both go out at once on the multiplexed
//! connection, so the allow path costs one round trip; the dispatch is then
//! confirmed with [`QuotaStore::commit`] (or undone with [`QuotaStore::release`]).
//! Admissions that wait at the same moment share one call (module
//! [`crate::admission::batch`]) on a single node.
//!
//! The admission itself (the call, its plans and caps in layers, quiet hours
//! settled, the answer read) is the admission room's ([`crate::admission`]), which
//! reaches the fields below. Its own file beside this one: `writes.rs` (commits,
//! notes, releases, collapse keys). Beside the connection it holds, whole, the
//! rooms the admission calls: each channel's send rate and lanes ([`Pacing`], the
//! lanes room's), the digests' side ([`Digests`]) and what admissions check of
//! preferences (`crate::preferences::checks`); their state and logic are theirs.
//!
//! ## One clock
//! Every admission decision uses Redis `TIME`, never the worker's clock. Calendar
//! windows need the recipient's local midnights, which Lua cannot compute, so the
//! worker computes them in Rust (module [`crate::quota::window`]) for the local day it
//! *believes* Redis is in (its own clock plus the offset last seen from Redis), and
//! sends that day's bounds with the request. The script checks that Redis time lies
//! inside that day; if not (the worker's clock is off around a midnight), it answers
//! with its own time, and the worker plans again for that instant. So two workers
//! whose clocks are a minute apart still agree on which day a send belongs to.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::admission::batch::{Admitter, Caller};
use crate::admission::state::AdmissionState;
use crate::config::Settings;
use crate::digest::store::Digests;
use crate::lanes::pacing::Pacing;
use crate::preferences::checks::Checks;
use crate::quota::keys::Keys;
use crate::quota::policy::{Policy, Rate};
use crate::quota::window;
use crate::redis::conn::count_call;
use crate::redis::rate::RateReply;
use crate::redis::{RedisConn, Scripts, StoreError};
use crate::rules::Rules;

mod writes;

/// The quota store. Cheap to share behind an `Arc`.
///
/// Why its methods span more than two files: beside its own (`mod.rs`, the writes
/// after a decision in `writes.rs`), the admission's call and its settling
/// (`src/admission/admit.rs`, `src/admission/quiet.rs`) are methods of it, because
/// they take the connection, the rules in force, the channel's pacing and the
/// admission's state together.
pub struct QuotaStore {
    pub(crate) conn: RedisConn,
    pub(crate) keys: Keys,
    /// The rules in force, swapped whole by a reload.
    pub(crate) rules: arc_swap::ArcSwap<Rules>,
    /// Each channel's send rate and lanes in this worker (the lanes room's).
    pub(crate) pacing: Pacing,
    /// How long notes, cancel marks and collapse keys are kept (`redis.record_ttl`).
    pub(crate) record_ttl: Duration,
    /// The admission's own state (the admission room's).
    pub(crate) admission: AdmissionState,
    pub(crate) scripts: Scripts,
    pub(crate) offset_ms: AtomicI64,
    pub(crate) calls: Arc<AtomicU64>,
    /// What admissions check of preferences (the preferences room's): whether
    /// some recipient may have a set, and what this worker knows of quiet hours.
    pub(crate) preferences: Checks,
    /// The digests' side of Redis (the digests' room's).
    pub(crate) digests: Digests,
}

impl std::fmt::Debug for QuotaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuotaStore")
            .field("keys", &self.keys)
            .finish_non_exhaustive()
    }
}

impl QuotaStore {
    /// Connect to Redis, load the scripts and read Redis's clock.
    pub async fn connect(settings: &Settings) -> Result<QuotaStore, StoreError> {
        let conn = RedisConn::connect(&settings.redis).await?;
        Self::with_connection(conn, settings).await
    }

    /// [`QuotaStore::connect`], waiting out a Redis that is not there yet (it starts
    /// after the worker, restarts, fails over) with the jittered backoff; `None` when
    /// `shutdown` comes first. What waiting cannot fix ([`StoreError::is_fatal`])
    /// returns at once.
    pub async fn connect_patiently(
        settings: &Settings,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Result<Option<QuotaStore>, StoreError> {
        let mut backoff =
            crate::backoff::delays(Duration::from_millis(200), Duration::from_secs(2));
        loop {
            match QuotaStore::connect(settings).await {
                Ok(store) => return Ok(Some(store)),
                Err(e) if e.is_fatal() => return Err(e),
                Err(e) => {
                    let retry_in = backoff.next().unwrap_or_default();
                    tracing::warn!(error = %e, ?retry_in, "redis unavailable at start; waiting for it");
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(None),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                }
            }
        }
    }

    /// Build on an existing connection (tests share one).
    pub(crate) async fn with_connection(
        conn: RedisConn,
        settings: &Settings,
    ) -> Result<QuotaStore, StoreError> {
        let rules = arc_swap::ArcSwap::from_pointee(Rules::from_settings(settings));
        let lease_ms = settings.redis.reservation_lease.0.as_millis() as i64;
        let calls = Arc::new(AtomicU64::new(0));
        let scripts = Scripts::default();
        scripts.load(&conn).await?;
        let keys = settings.redis.keys();
        let wait = (settings.redis.wait_replicas > 0).then_some((
            settings.redis.wait_replicas,
            settings.redis.wait_timeout.0.as_millis() as u64,
        ));
        let waiting = match wait {
            Some(_) => conn.dedicated(crate::admission::batch::OUTSTANDING).await?,
            None => Vec::new(),
        };
        let keep = settings.redis.record_ttl.0;
        let digests = Digests::connect(&conn, &scripts, &keys, &calls, keep, wait).await?;
        let admitter = Admitter::start(Caller {
            prefix_len: keys.prefix().len(),
            conn: conn.clone(),
            script: scripts.admit.clone(),
            cross_slot: scripts.admit_cross_slot.clone(),
            lease_ms,
            dedupe_ms: settings.redis.dedupe_window.0.as_millis() as i64,
            calls: calls.clone(),
            wait,
            waiting: std::sync::Mutex::new(waiting),
        });
        let pacing = Pacing::new(&conn, &scripts, &keys, settings, &calls);
        let store = QuotaStore {
            conn,
            keys,
            rules,
            pacing,
            record_ttl: settings.redis.record_ttl.0,
            admission: AdmissionState::new(admitter, lease_ms),
            scripts,
            offset_ms: AtomicI64::new(0),
            calls,
            preferences: Checks::default(),
            digests,
        };
        store.sync_clock().await?;
        Ok(store)
    }

    /// The key names in use.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The scripts, loaded (the admin's import uses `record`).
    pub fn scripts(&self) -> &Scripts {
        &self.scripts
    }

    /// The digests' side of Redis.
    pub fn digests(&self) -> &Digests {
        &self.digests
    }

    /// Each channel's send rate and lanes in this worker.
    pub(crate) fn pacing(&self) -> &Pacing {
        &self.pacing
    }

    /// [`Pacing::refund`] (the tests and the benchmark ask the store).
    pub async fn refund(
        &self,
        channel: &str,
        rate: Rate,
        tat: i64,
    ) -> Result<Duration, StoreError> {
        self.pacing.refund(channel, rate, tat).await
    }

    /// [`Pacing::take_rate`] (the tests and the benchmark ask the store).
    pub async fn take_rate(&self, channel: &str, rate: Rate) -> Result<RateReply, StoreError> {
        self.pacing.take_rate(channel, rate).await
    }

    /// [`Pacing::call_rate`] (the tests and the benchmark ask the store).
    pub async fn call_rate(
        &self,
        channel: &str,
        rate: Rate,
        cost: u64,
    ) -> Result<RateReply, StoreError> {
        self.pacing.call_rate(channel, rate, cost).await
    }

    /// A clone of the connection, for admin reads.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Redis commands (script calls included) sent so far, for the benchmark.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    pub(crate) fn count_call(&self) {
        count_call(&self.calls);
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// Put `rules` in force for every decision from now on (a reload); returns the
    /// ones they replace. The plans made for the replaced ones are dropped.
    pub(crate) fn set_rules(&self, rules: Rules) -> Arc<Rules> {
        let before = self.rules.swap(Arc::new(rules));
        self.admission.forget_plans();
        before
    }

    /// The policy a category selects, as in force now.
    pub fn policy(&self, category: &str) -> Arc<Policy> {
        self.rules.load().policy(category).clone()
    }

    /// Read Redis `TIME` and remember how far it is from this machine's clock.
    pub async fn sync_clock(&self) -> Result<DateTime<Utc>, StoreError> {
        let mut conn = self.conn.clone();
        self.count_call();
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
        let now = secs * 1000 + micros / 1000;
        self.observe(now);
        Ok(window::from_millis(now))
    }

    /// Ping Redis (readiness).
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        Ok(())
    }

    pub(crate) fn observe(&self, redis_now_ms: i64) {
        self.offset_ms.store(
            redis_now_ms - Utc::now().timestamp_millis(),
            Ordering::Relaxed,
        );
    }

    /// Move this store's idea of Redis time (tests simulate a skewed worker clock).
    #[cfg(feature = "test-util")]
    pub fn skew_clock_for_tests(&self, by: chrono::Duration) {
        self.offset_ms
            .fetch_add(by.num_milliseconds(), Ordering::Relaxed);
    }

    /// This machine's clock, corrected by the offset last seen from Redis.
    pub(crate) fn redis_now(&self) -> DateTime<Utc> {
        window::from_millis(Utc::now().timestamp_millis() + self.offset_ms.load(Ordering::Relaxed))
    }
}
