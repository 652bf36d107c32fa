//! One delivery to one confirmed outcome: decode; then the first step that settles
//! it decides ([`super::decision`]: a cancel mark, known in memory; triage; the
//! newest of its collapse key; a digest's fold; its schedule and send windows; the
//! store's admission; its route over further channels); then carry out the
//! [`Decision`] (publish, then commit or release; the dispatch is
//! [`super::dispatch`]'s) and note it for `admin job`. The decision itself is pure
//! ([`crate::decide`]); this is its executor.
//!
//! The handling is cut into async functions called in turn, not boxed: each level
//! is a copy of its future's arguments per job, counted by callgrind in
//! BENCHMARKS.md ("The round's cost"). The rare paths (digests, escalations,
//! routes, lanes) are boxed, so a job that does not take them does not carry their
//! state in its own.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::decision::Decided;
use super::error::ProcessError;
use super::handling::{Handling, Route, RouteAt, Seen};
use super::link::BrokerLink;
use super::Worker;
use crate::admission::{Admission, RateStep, Request};
use crate::decide::{self, Decision};
use crate::fallback;
use crate::job::decode::{self, Job};
use crate::job::note::JobState;
use crate::job::Outcome;
use crate::lanes::Priority;
use crate::metrics::JobLabels;
use crate::redis::StoreError;
use crate::rules::Rules;

impl Worker {
    /// How long a job held by the pause after a Redis reset waits (`redis.paused_hold`,
    /// validated to at most an hour, so the conversion cannot fail).
    pub(super) fn paused_hold(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.settings.redis.paused_hold.0).unwrap_or_default()
    }

    /// Decide one delivery and publish its outcome; Ok once the outcome is confirmed
    /// (and counted). The caller acks on Ok and hands the delivery back on Err.
    pub async fn process(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
    ) -> Result<Outcome, ProcessError> {
        self.process_from(s, delivery, None).await
    }

    /// [`Worker::process`] for a delivery read from the queue of lane `from` (`None`:
    /// the jobs queue).
    pub async fn process_from(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        from: Option<Priority>,
    ) -> Result<Outcome, ProcessError> {
        let now = self.store.redis_now();
        // one snapshot of the rules in force for the whole decision (a reload
        // applies from the next job on)
        let rules = self.store.rules();
        let job = match self.decode(delivery) {
            Ok(job) => job,
            Err(m) => {
                let outcome = self.dead(&s.publisher, delivery, None, decide::malformed(m));
                let outcome = outcome.await?;
                rules.metrics.count(&outcome, JobLabels::default());
                return Ok(outcome);
            }
        };
        tracing::Span::current().record("job_id", job.id.as_ref());
        let headers = delivery.properties.headers().as_ref();
        // a job published again after its step's send failed resumes its route
        let resumed = match job.fallback {
            None => fallback::route::Resumed::at_start(job),
            Some(_) => fallback::route::resume(job, headers),
        };
        let fallback::route::Resumed {
            job,
            step: at,
            left,
        } = resumed;
        let policy = rules.policy_of(&job.category, job.tenant.as_deref());
        let labels = rules.labels(&policy.name, &job.channel);
        // an escalation come back: on only while its step is unanswered
        let escalation = job
            .fallback
            .as_ref()
            .and_then(|_| fallback::route::escalation(headers));
        if let Some(awaited) = &escalation {
            if let Some(outcome) = Box::pin(self.escalation_over(s, &job, awaited, at)).await? {
                rules.metrics.count(&outcome, labels);
                return Ok(outcome);
            }
        }
        let seen = Seen::of(headers, now, &policy.name);
        crate::telemetry::job(&job.id, &policy.name, seen.attempt);
        let h = Handling {
            s,
            delivery,
            job: &job,
            seen: &seen,
            rules: &rules,
            policy,
            labels,
            marks: self.cancels.generation(),
        };
        let escalation = escalation.is_some();
        let on_route = RouteAt {
            step: at,
            left,
            escalation,
        };
        let (decision, route) = match self.decide(&h, from, on_route, now).await? {
            Decided::Carry(decision, route) => (decision, route),
            Decided::Settled(outcome) => return Ok(outcome),
        };
        self.settle(&h, decision, route.as_deref(), now).await
    }

    /// Settle the decision on the job of `h`: a `held` digest folds what the caps
    /// would delay; anything else is carried out, and a digest's own job ends it.
    async fn settle(
        &self,
        h: &Handling<'_, '_>,
        decision: Decision,
        route: Option<&Route<'_>>,
        now: DateTime<Utc>,
    ) -> Result<Outcome, ProcessError> {
        let policy = h.policy;
        if let (Decision::Delay { until, cause }, Some(_)) = (&decision, &policy.digest) {
            if let Some(outcome) = Box::pin(self.held_instead(h, *until, cause)).await? {
                return Ok(outcome);
            }
        }
        let outcome = self.carry_out(h, decision, route, now).await;
        if let Ok(outcome) = &outcome {
            if (policy.digest.is_some() || matches!(outcome, Outcome::Dead(_)))
                && crate::digest::is_digest(h.delivery)
            {
                Box::pin(self.digest_done(h, outcome)).await?;
            }
            h.rules.metrics.count(outcome, h.labels);
        }
        outcome
    }

    /// The job in `delivery`, or why it is none: its body within
    /// `worker.max_body_bytes` (a digest's, within room for its items).
    fn decode<'d>(&self, delivery: &'d Delivery) -> Result<Job<'d>, decode::Malformed> {
        let mut max_body = self.settings.worker.max_body_bytes;
        // a digest carries up to `keep` items of at most max_body_bytes each (the
        // header is looked at only for a body over the bound)
        if delivery.data.len() > max_body && crate::digest::is_digest(delivery) {
            max_body = max_body.saturating_mul(crate::quota::digest::MAX_KEEP as usize + 2);
        }
        decode::decode(&delivery.data, max_body, self.default_tz)
    }

    /// Carry a decision out: publish its outcome, then commit or release.
    pub(super) async fn carry_out(
        &self,
        h: &Handling<'_, '_>,
        decision: Decision,
        route: Option<&Route<'_>>,
        now: DateTime<Utc>,
    ) -> Result<Outcome, ProcessError> {
        let (s, delivery, job, seen) = (h.s, h.delivery, h.job, h.seen);
        match decision {
            Decision::Dead(dead) => {
                let dead = match route {
                    Some((routed, _)) => routed.dead_letter(dead),
                    None => dead,
                };
                self.dead_noted(s, delivery, job, seen, dead).await
            }
            Decision::ReleaseThenDead(ticket, dead) => {
                self.retry_redis(|| self.store.release(&ticket), &s.stop)
                    .await?;
                self.dead_noted(s, delivery, job, seen, dead).await
            }
            Decision::Duplicate => {
                info!("duplicate of a job already dispatched; acked, not sent again");
                if let Some((routed, on_step)) = route {
                    // sent before a crash: its escalation may not have been
                    let at = (seen.first_seen, true);
                    let later = self.escalate_later(s, delivery, (on_step, routed), h.policy, at);
                    Box::pin(later).await?;
                }
                Ok(Outcome::Duplicate)
            }
            Decision::Erased => {
                info!("its recipient was erased; acked, not sent");
                Ok(Outcome::Erased)
            }
            Decision::Superseded { by } => {
                info!(
                    by,
                    "superseded by a newer job with its collapse key; acked, not sent"
                );
                self.note(s, job, seen, JobState::Superseded { by }, None);
                Ok(Outcome::Superseded)
            }
            Decision::Delay { until, cause } => self.delay(h, until, &cause).await,
            Decision::Dispatch(ticket) => self.dispatch(h, ticket, route, now).await,
        }
    }
    /// Park the job of `h` in its lane, and count it.
    pub(super) async fn parked(
        &self,
        h: &Handling<'_, '_>,
        lane: (Priority, bool),
    ) -> Result<Outcome, ProcessError> {
        let (job, rules) = (h.job, h.rules);
        let outcome = self
            .park(h.s, (h.delivery, job), h.seen.first_seen, lane)
            .await?;
        let policy = rules.policy(&job.category);
        rules
            .metrics
            .count(&outcome, rules.labels(&policy.name, &job.channel));
        Ok(outcome)
    }

    /// Ask the store, waiting out Redis outages (never a decision without Redis);
    /// `None`: park the job ([`RateStep::Park`]).
    pub(super) async fn admit(
        &self,
        req: &Request<'_>,
        rules: &Rules,
        s: &BrokerLink,
        step: RateStep,
    ) -> Result<Option<Admission>, ProcessError> {
        let started = Instant::now();
        let admit = || self.store.admit_with(req, rules, step);
        let admission = self.retry_redis(admit, &s.stop).await?;
        s.metrics
            .admission_seconds
            .record(started.elapsed().as_secs_f64());
        Ok(admission)
    }

    /// Run a Redis operation until it succeeds, backing off while Redis is away.
    pub(super) async fn retry_redis<'a, T, F, Fut>(
        &'a self,
        op: F,
        stop: &CancellationToken,
    ) -> Result<T, ProcessError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>> + 'a,
    {
        let mut backoff = crate::backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match op().await {
                Ok(v) => {
                    self.health.redis.store(true, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) => {
                    self.health.redis.store(false, Ordering::Relaxed);
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
                    let retry_in = backoff.next().unwrap_or_default();
                    warn!(error = %e, ?retry_in, "redis unavailable; holding the job");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(ProcessError::Interrupted),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                }
            }
        }
    }
}
