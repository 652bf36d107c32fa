//! The quota store: the Redis side of every decision.
//!
//! [`QuotaStore::admit`] asks two scripts: `lua/admit.lua` (the recipient's caps, one
//! sorted set per recipient and policy) and `lua/rate.lua` (the channel's GCRA send
//! rate). When the channel is not pacing, both go out at once on the multiplexed
//! connection, so the allow path costs one round trip; the dispatch is then
//! confirmed with [`QuotaStore::commit`] (or undone with [`QuotaStore::release`]).
//! Admissions that wait at the same moment share one `admit.lua` call (module
//! [`crate::redis::admit`]) on a single node.
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

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use crate::admission::{Admission, Request, Ticket};
use crate::config::Settings;
use crate::quota::keys::{self, Keys};
use crate::quota::plan::{plan, Plan};
use crate::quota::policy::{Mode, Policy, Rate, Scope};
use crate::quota::window;
use crate::redis::admit::{AdmitArgs, Admitter, Caller, Verdict};
use crate::redis::collapse::Collapse;
use crate::redis::conn::count_call;
use crate::redis::notes::Note;
use crate::redis::rate::{self, RateBatcher, RateReply, Taker};
use crate::redis::{refund, RedisConn, Scripts, StoreError};
use crate::rules::Rules;

/// How many jobs of one channel wait for its send rate. While any do, a newly
/// admitted job joins them rather than racing them for the next free slot. (They
/// do not stampede Redis: the ones that wake together ask in one call.)
#[derive(Debug, Default)]
struct Pacer {
    waiting: AtomicUsize,
}

/// The quota store. Cheap to share behind an `Arc`.
pub struct QuotaStore {
    conn: RedisConn,
    keys: Keys,
    /// The rules in force, swapped whole by a reload.
    rules: arc_swap::ArcSwap<Rules>,
    /// One per configured channel (the set of channels never changes while running).
    pacers: HashMap<String, Pacer>,
    /// One per configured channel: its rate's takes, batched.
    rates: HashMap<String, RateBatcher>,
    lease_ms: i64,
    /// How long notes, cancel marks and collapse keys are kept (`redis.record_ttl`).
    record_ttl: Duration,
    admitter: Admitter,
    scripts: Scripts,
    offset_ms: AtomicI64,
    calls: Arc<AtomicU64>,
    /// Reservations this store recorded for admissions that then failed (Redis went
    /// away mid-decision, or the dispatch's fate is unknown), by (key, member) ->
    /// reserved_at ms. The retry of the same job takes its own reservation back
    /// instead of waiting out the lease as if another worker held it.
    orphans: std::sync::Mutex<HashMap<(String, Vec<u8>), i64>>,
    /// The last plan made per (policy, zone), with the local date it is for: a
    /// plan depends only on the policy's rules, the zone and the local date, and
    /// every job of a policy in a zone on one day shares it.
    plans: std::sync::Mutex<PlanCache>,
    /// Whether some recipient may be suppressed (the key `prefix:suppressions`
    /// exists, as last seen): only then do admissions check suppressions.
    suppressions: AtomicBool,
}

/// Plans by policy name, then zone, each with the local date and the policy (as in
/// force when it was made: a reload's new policy makes new plans) it is for.
type PlanCache = HashMap<String, HashMap<Tz, (chrono::NaiveDate, Arc<Policy>, Arc<Plan>)>>;

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
        let pacers = settings
            .channels
            .keys()
            .map(|c| (c.clone(), Pacer::default()))
            .collect();
        let lease_ms = settings.redis.reservation_lease.0.as_millis() as i64;
        let calls = Arc::new(AtomicU64::new(0));
        let scripts = Scripts::default();
        scripts.load(&conn).await?;
        let keys = Keys::from_settings(&settings.redis);
        let admitter = Admitter::start(Caller {
            prefix_len: keys.prefix().len(),
            conn: conn.clone(),
            script: scripts.admit.clone(),
            cross_slot: scripts.admit_cross_slot.clone(),
            lease_ms,
            dedupe_ms: settings.redis.dedupe_window.0.as_millis() as i64,
            calls: calls.clone(),
            wait: (settings.redis.wait_replicas > 0).then_some((
                settings.redis.wait_replicas,
                settings.redis.wait_timeout.0.as_millis() as u64,
            )),
        });
        let rates = settings
            .channels
            .keys()
            .map(|c| {
                let taker = Taker {
                    conn: conn.clone(),
                    script: scripts.rate.clone(),
                    key: keys.rate(c),
                    calls: calls.clone(),
                    channel: c.clone(),
                    shown: AtomicU64::new(settings.rate(c).map_or(0, |r| {
                        crate::metrics::channel_rate(c, r, Some(r.interval_us));
                        r.interval_us
                    })),
                };
                (c.clone(), RateBatcher::start(taker))
            })
            .collect();
        let store = QuotaStore {
            conn,
            keys,
            rates,
            rules,
            pacers,
            lease_ms,
            record_ttl: settings.redis.record_ttl.0,
            admitter,
            scripts,
            offset_ms: AtomicI64::new(0),
            calls,
            orphans: Default::default(),
            plans: Default::default(),
            suppressions: AtomicBool::new(false),
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

    /// A clone of the connection, for admin reads.
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Redis commands (script calls included) sent so far, for the benchmark.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    fn count_call(&self) {
        count_call(&self.calls);
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.load_full()
    }

    /// Put `rules` in force for every decision from now on (a reload); returns the
    /// ones they replace. Plans made for a replaced policy are not used again.
    pub fn set_rules(&self, rules: Rules) -> Arc<Rules> {
        self.rules.swap(Arc::new(rules))
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

    fn observe(&self, redis_now_ms: i64) {
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
    pub fn redis_now(&self) -> DateTime<Utc> {
        window::from_millis(Utc::now().timestamp_millis() + self.offset_ms.load(Ordering::Relaxed))
    }

    fn recipient_key(&self, req: &Request<'_>, policy: &Policy) -> String {
        let channel = (policy.scope == Scope::Channel).then_some(req.channel);
        self.keys.recipient(req.recipient, &policy.name, channel)
    }

    /// Decide one job: check its recipient's caps and its channel's rate.
    ///
    /// When the channel's rate refuses, this waits (pacing) until it allows; a
    /// recipient refusal returns at once with the exact retry time.
    pub async fn admit(&self, req: &Request<'_>) -> Result<Admission, StoreError> {
        let rules = self.rules();
        self.admit_under(req, &rules).await
    }

    /// [`QuotaStore::admit`] under `rules` (the caller's snapshot of the rules in force,
    /// so that one decision never mixes the rules before and after a reload).
    pub async fn admit_under(
        &self,
        req: &Request<'_>,
        rules: &Rules,
    ) -> Result<Admission, StoreError> {
        let unknown = || StoreError::UnknownChannel(req.channel.to_string());
        let rate = rules.channel(req.channel).ok_or_else(unknown)?.rate;
        let pacer = self.pacers.get(req.channel).ok_or_else(unknown)?;
        let policy = rules.policy(req.category).clone();
        let key = self.recipient_key(req, &policy);
        let member = keys::member(req.id);

        let pacing = rate.is_some() && pacer.waiting.load(Ordering::Relaxed) > 0;
        let (first, rate_reply) = match rate {
            Some(r) if !pacing => {
                let (a, b) = tokio::join!(
                    self.call_admit(&key, &member, &policy, req, None),
                    self.take_rate(req.channel, r)
                );
                let a = a?;
                match b {
                    Ok(b) => (a, Some(b)),
                    Err(e) => {
                        if let Verdict::Admitted(at) = a {
                            self.orphan(&key, &member, at);
                        }
                        return Err(e);
                    }
                }
            }
            _ => (
                self.call_admit(&key, &member, &policy, req, None).await?,
                None,
            ),
        };
        let mut reply = first;
        for _ in 0..3 {
            match reply {
                Verdict::Clock(now) => {
                    reply = self
                        .call_admit(&key, &member, &policy, req, Some(now))
                        .await?
                }
                _ => break,
            }
        }
        if let Verdict::Reserved(_, at) = reply {
            if self.adopt(&key, &member, at) {
                reply = Verdict::Admitted(at);
            }
        }
        let taken = rate_reply.filter(|r| r.allowed == 1).map(|r| r.tat_us);
        let mut admission = match reply {
            Verdict::Admitted(now) => Admission::Admitted(Ticket {
                key,
                member,
                admitted_at: window::from_millis(now),
                channel: req.channel.to_string(),
                rate: rate.zip(taken),
            }),
            Verdict::Refused(now, sends) => {
                let sends: Vec<DateTime<Utc>> =
                    sends.into_iter().map(window::from_millis).collect();
                let refusal =
                    window::refusal(&policy.rules, req.tz, window::from_millis(now), &sends);
                Admission::Refused {
                    retry_at: refusal.retry_at,
                    action: policy.action,
                    policy: policy.name.clone(),
                    rule: refusal.rule,
                    seen: sends.len(),
                }
            }
            Verdict::Shadowed(now, sends) => {
                let sends: Vec<DateTime<Utc>> =
                    sends.into_iter().map(window::from_millis).collect();
                let at = window::from_millis(now);
                let refusal = window::refusal(&policy.rules, req.tz, at, &sends);
                Admission::Shadowed {
                    ticket: Ticket {
                        key,
                        member,
                        admitted_at: at,
                        channel: req.channel.to_string(),
                        rate: rate.zip(taken),
                    },
                    retry_at: refusal.retry_at,
                    action: policy.action,
                    rule: refusal.rule,
                    seen: sends.len(),
                }
            }
            Verdict::Duplicate(_) => Admission::Duplicate,
            Verdict::Suppressed(now, kind, since, until) => {
                let value = format!("{kind}:{since}:{until}");
                match crate::quota::suppression::Suppression::decode(&value) {
                    Some(s) => Admission::Suppressed(s),
                    // a value no worker writes: an error, retried (never a decision)
                    None => {
                        return Err(StoreError::Reply {
                            script: "admit.lua",
                            reply: vec![8, now, i64::from(kind), since, until],
                        })
                    }
                }
            }
            Verdict::Reserved(_, reserved_at) => Admission::Reserved {
                retry_at: window::from_millis(reserved_at + self.lease_ms),
            },
            // still outside the planned day after three plans (a wrong type never
            // gets here: call_admit turns it into an error)
            // (the admitter asks a job that answered 7 again on its own; one that
            // still does is an error, retried like Redis being away)
            Verdict::Clock(now) | Verdict::WrongType(now) | Verdict::Elsewhere(now) => {
                let code = match reply {
                    Verdict::Clock(_) => 4,
                    Verdict::WrongType(_) => 5,
                    _ => 7,
                };
                return Err(StoreError::Reply {
                    script: "admit.lua",
                    reply: vec![code, now],
                });
            }
        };
        match (&mut admission, rate) {
            (Admission::Admitted(ticket) | Admission::Shadowed { ticket, .. }, Some(r))
                if taken.is_none() =>
            {
                if let Some(reply) = rate_reply {
                    if reply.allowed < 0 {
                        // never reached: validation keeps cost <= burst
                        return Err(StoreError::CostAboveBurst {
                            channel: req.channel.to_string(),
                            cost: r.cost,
                            burst: r.burst,
                        });
                    }
                }
                match self.pace(req.channel, r, pacer).await {
                    Ok(tat) => ticket.rate = Some((r, tat)),
                    Err(e) => {
                        if self.release_recipient(ticket).await.is_err() {
                            self.keep_reservation(ticket);
                        }
                        return Err(e);
                    }
                }
            }
            (Admission::Admitted(_) | Admission::Shadowed { .. }, _) => {}
            (_, Some(r)) => {
                if let Some(tat) = taken {
                    self.refund(req.channel, r, tat).await?;
                }
            }
            _ => {}
        }
        Ok(admission)
    }

    /// Wait until the channel's rate allows one more job, one waiter at a time;
    /// returns the TAT the take left.
    async fn pace(&self, channel: &str, rate: Rate, pacer: &Pacer) -> Result<i64, StoreError> {
        pacer.waiting.fetch_add(1, Ordering::Relaxed);
        let result = async {
            loop {
                let reply = self.take_rate(channel, rate).await?;
                match reply.allowed {
                    1 => return Ok(reply.tat_us),
                    0 => {
                        tokio::time::sleep(reply.retry_after.max(Duration::from_micros(100))).await
                    }
                    _ => {
                        return Err(StoreError::CostAboveBurst {
                            channel: channel.to_string(),
                            cost: rate.cost,
                            burst: rate.burst,
                        })
                    }
                }
            }
        }
        .await;
        pacer.waiting.fetch_sub(1, Ordering::Relaxed);
        result
    }

    /// Keep an admission's reservation (its send stays counted) when the job's fate
    /// is unknown, e.g. its dispatch was sent but never confirmed: if this worker
    /// sees the job again it takes the reservation back at once; any other worker
    /// waits out the lease. Either way the recipient's slot is never freed for
    /// another job while the first may have been sent.
    pub fn keep_reservation(&self, ticket: &Ticket) {
        self.orphan(
            &ticket.key,
            &ticket.member,
            ticket.admitted_at.timestamp_millis(),
        );
    }

    fn orphan(&self, key: &str, member: &[u8], reserved_at: i64) {
        let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let lapsed = reserved_at - self.lease_ms;
        orphans.retain(|_, at| *at > lapsed);
        orphans.insert((key.to_string(), member.to_vec()), reserved_at);
    }

    /// Whether the reservation made at `reserved_at` is one of ours (then forget it).
    fn adopt(&self, key: &str, member: &[u8], reserved_at: i64) -> bool {
        let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let id = (key.to_string(), member.to_vec());
        if orphans.get(&id) == Some(&reserved_at) {
            orphans.remove(&id);
            true
        } else {
            false
        }
    }

    /// Mark an admitted job as dispatched: a later copy is then a duplicate.
    pub async fn commit(&self, ticket: &Ticket) -> Result<(), StoreError> {
        self.write_after(std::slice::from_ref(ticket), &[]).await
    }

    /// Commit `tickets` (as [`QuotaStore::commit`]) and write `notes`: one pipeline on a
    /// single node (one round trip), concurrent commands on a cluster (their keys
    /// live in different slots).
    pub(crate) async fn write_after(
        &self,
        tickets: &[Ticket],
        notes: &[Note],
    ) -> Result<(), StoreError> {
        let zadd = |t: &Ticket| {
            // sized up front: growing the buffers argument by argument cost more
            // than the rest of the commit
            let mut cmd = redis::Cmd::with_capacity(5, t.key.len() + t.member.len() + 32);
            cmd.arg("ZADD")
                .arg(&t.key)
                .arg("XX")
                .arg(t.admitted_at.timestamp_millis() * 2 + 1)
                .arg(&t.member);
            cmd
        };
        let ttl_ms = self.record_ttl.as_millis() as u64;
        let cmds = tickets
            .iter()
            .map(zadd)
            .chain(crate::redis::notes::commands(&self.keys, notes, ttl_ms));
        let trips = self.conn.send_all(cmds).await?;
        for _ in 0..trips {
            self.count_call();
        }
        Ok(())
    }

    /// Whether job `id` of `recipient`, first seen at `first_seen`, is the newest of
    /// the recipient's jobs with collapse key `field` (it is then registered as such).
    pub async fn collapse(
        &self,
        recipient: &str,
        field: &str,
        id: &str,
        first_seen: DateTime<Utc>,
    ) -> Result<Collapse, StoreError> {
        self.count_call();
        let key = self.keys.collapse(recipient);
        let script = &self.scripts.collapse;
        crate::redis::collapse::collapse(
            &self.conn,
            script,
            &key,
            field,
            id,
            first_seen,
            self.record_ttl,
        )
        .await
    }

    /// Whether admissions check suppressions (some recipient may be suppressed).
    pub fn checks_suppressions(&self) -> bool {
        self.suppressions.load(Ordering::Relaxed)
    }

    /// Check suppressions from now on (`on`: the key `prefix:suppressions` exists,
    /// or this worker just wrote it) or stop checking.
    pub fn check_suppressions(&self, on: bool) {
        self.suppressions.store(on, Ordering::Relaxed);
    }

    /// How long notes, cancel marks and collapse keys are kept.
    pub fn record_ttl(&self) -> Duration {
        self.record_ttl
    }

    /// Undo an admission whose dispatch failed: the recipient's send and the
    /// channel's rate are given back.
    pub async fn release(&self, ticket: &Ticket) -> Result<(), StoreError> {
        self.release_recipient(ticket).await?;
        if let Some((rate, tat)) = ticket.rate {
            self.refund(&ticket.channel, rate, tat).await?;
        }
        Ok(())
    }

    async fn release_recipient(&self, ticket: &Ticket) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        self.count_call();
        let _: i64 = redis::cmd("ZREM")
            .arg(&ticket.key)
            .arg(&ticket.member)
            .query_async(&mut conn)
            .await?;
        Ok(())
    }

    /// Give back what one take of `channel`'s rate added and is still unspent
    /// (`tat`: the TAT that take left); returns the credit given back.
    pub async fn refund(
        &self,
        channel: &str,
        rate: Rate,
        tat: i64,
    ) -> Result<Duration, StoreError> {
        self.count_call();
        let key = self.keys.rate(channel);
        refund::refund(&self.conn, &self.scripts.refund, key, rate, tat).await
    }

    /// Take one job of `rate.cost` from the channel's rate, in one call with the
    /// channel's other jobs asking at the same moment.
    pub async fn take_rate(&self, channel: &str, rate: Rate) -> Result<RateReply, StoreError> {
        match self.rates.get(channel) {
            Some(batcher) => batcher.take(rate).await,
            None => self.call_rate(channel, rate, rate.cost).await,
        }
    }

    /// Ask the channel's GCRA for `cost` jobs (tests and the admin use this directly).
    pub async fn call_rate(
        &self,
        channel: &str,
        rate: Rate,
        cost: u64,
    ) -> Result<RateReply, StoreError> {
        self.count_call();
        let key = self.keys.rate(channel);
        rate::take(&self.conn, &self.scripts.rate, key, rate, cost).await
    }

    /// `plan(&policy.rules, tz, now)`, made once per policy (as in force), zone and
    /// local date.
    fn cached_plan(&self, policy: &Arc<Policy>, tz: Tz, now: DateTime<Utc>) -> Arc<Plan> {
        let date = window::local_date(tz, now);
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((d, of, p)) = plans.get(policy.name.as_str()).and_then(|z| z.get(&tz)) {
            if *d == date && Arc::ptr_eq(of, policy) {
                return p.clone();
            }
        }
        let mut made = plan(&policy.rules, tz, now);
        made.shadow = policy.mode == Mode::Shadow;
        made.suppressed_by = policy.suppressed_by.0;
        let p = Arc::new(made);
        plans
            .entry(policy.name.clone())
            .or_default()
            .insert(tz, (date, policy.clone(), p.clone()));
        p
    }

    async fn call_admit(
        &self,
        key: &str,
        member: &[u8],
        policy: &Arc<Policy>,
        req: &Request<'_>,
        now: Option<i64>,
    ) -> Result<Verdict, StoreError> {
        let plan = self.cached_plan(
            policy,
            req.tz,
            now.map(window::from_millis)
                .unwrap_or_else(|| self.redis_now()),
        );
        let reply = match self
            .admitter
            .admit(AdmitArgs {
                key: key.to_string(),
                member: member.to_vec(),
                plan,
                channel: self
                    .suppressions
                    .load(Ordering::Relaxed)
                    .then(|| req.channel.to_string()),
            })
            .await
        {
            Err(StoreError::Unreplicated {
                reserved_at,
                acked,
                wanted,
            }) => {
                // ours: the retry takes it back instead of waiting out the lease
                self.orphan(key, member, reserved_at);
                return Err(StoreError::Unreplicated {
                    reserved_at,
                    acked,
                    wanted,
                });
            }
            reply => reply?,
        };
        self.observe(reply.now());
        match reply {
            Verdict::WrongType(now) => Err(StoreError::Reply {
                script: "admit.lua",
                reply: vec![5, now],
            }),
            reply => Ok(reply),
        }
    }
}
