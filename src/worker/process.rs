//! One delivery to one confirmed outcome: decode; then the first step that settles
//! it decides ([`super::decision`]: a cancel mark, known in memory; triage; the
//! newest of its collapse key; a digest's fold; its schedule and send windows; the
//! store's admission; its route over further channels); then carry out the
//! [`Decision`] (publish, then commit or release; the dispatch is
//! [`super::dispatch`]'s) and note it for `admin job`. The decision itself is pure
//! ([`crate::decide`]); this is its executor, [`JobPath`], which holds the worker's
//! sides of the rooms a job meets (lanes, digests, routes, outcomes), each a type
//! of its own file.
//!
//! The handling is cut into async functions called in turn, not boxed: each level
//! is a copy of its future's arguments per job, counted by callgrind in
//! BENCHMARKS.md ("The round's cost"). The rare paths (digests, escalations,
//! routes, lanes) are boxed, so a job that does not take them does not carry their
//! state in its own.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use lapin::message::Delivery;
use tracing::info;

use super::asks::Asks;
use super::cancels::Cancels;
use super::digest::DigestSide;
use super::dispatch::Sent;
use super::error::ProcessError;
use super::handling::{Decided, Handling, Route, RouteAt, Seen};
use super::lanes::LaneSide;
use super::link::BrokerLink;
use super::outcomes::Outcomes;
use super::routing::Routes;
use crate::amqp::Topology;
use crate::config::Settings;
use crate::decide::{self, Decision};
use crate::fallback;
use crate::health::Health;
use crate::job::decode::{self, Job};
use crate::job::note::JobState;
use crate::job::Outcome;
use crate::lanes::Priority;
use crate::metrics::JobLabels;
use crate::store::QuotaStore;

/// A job's path through the rooms, from its delivery to its confirmed outcome: what
/// decides it ([`super::decision`]), and the worker's sides of the rooms it meets.
#[derive(Debug)]
pub(crate) struct JobPath {
    pub(super) asks: Asks,
    /// The cancelled job ids and erased recipients, as last read from Redis.
    pub(super) cancels: Arc<Cancels>,
    pub(super) topology: Topology,
    /// The zone of a job that names none (`worker.default_timezone`).
    default_tz: Tz,
    /// `worker.max_body_bytes`.
    max_body_bytes: usize,
    /// How long a job held by the pause after a Redis reset waits
    /// (`redis.paused_hold`, validated to at most an hour).
    paused_hold: chrono::Duration,
    /// The rate step and the park, with the lanes' clocks and tenants' queues.
    pub(super) lanes: LaneSide,
    /// The fold, a held digest's fold, a digest done with, the session's closer.
    pub(super) digests: DigestSide,
    /// A routed job's further channels and escalations.
    pub(super) routes: Routes,
    /// What is published for a job: its dispatch, delay, dead letter, note.
    pub(super) outcomes: Outcomes,
}

/// What [`JobPath`] is built from.
pub(crate) struct Parts {
    pub(crate) store: Arc<QuotaStore>,
    pub(crate) health: Arc<Health>,
    pub(crate) cancels: Arc<Cancels>,
    pub(crate) topology: Topology,
}

impl JobPath {
    /// The job's path for `settings`, on the store and readiness of `parts`.
    pub(crate) fn new(settings: &Settings, parts: Parts) -> JobPath {
        let Parts {
            store,
            health,
            cancels,
            topology,
        } = parts;
        let asks = Asks { store, health };
        let default_tz = settings.worker.default_timezone;
        JobPath {
            lanes: LaneSide::new(asks.clone(), &topology),
            digests: DigestSide::new(asks.clone(), cancels.clone(), settings),
            routes: Routes::new(asks.clone(), &topology),
            outcomes: Outcomes::new(asks.clone(), cancels.clone(), &topology, settings),
            asks,
            cancels,
            topology,
            default_tz,
            max_body_bytes: settings.worker.max_body_bytes,
            paused_hold: chrono::Duration::from_std(settings.redis.paused_hold.0)
                .unwrap_or_default(),
        }
    }

    /// The same, reporting Redis's readiness into `health`.
    pub(crate) fn sharing_health(mut self, health: &Arc<Health>) -> JobPath {
        for asks in [
            &mut self.asks,
            &mut self.lanes.asks,
            &mut self.digests.asks,
            &mut self.routes.asks,
            &mut self.outcomes.asks,
        ] {
            asks.health = health.clone();
        }
        self
    }

    /// How long a job held by the pause after a Redis reset waits.
    pub(super) fn paused_hold(&self) -> chrono::Duration {
        self.paused_hold
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

    /// [`JobPath::process`] for a delivery read from the queue of lane `from` (`None`:
    /// the jobs queue).
    pub async fn process_from(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        from: Option<Priority>,
    ) -> Result<Outcome, ProcessError> {
        let now = self.asks.store.redis_now();
        // one snapshot of the rules in force for the whole decision (a reload
        // applies from the next job on)
        let rules = self.asks.store.rules();
        let job = match self.decode(delivery) {
            Ok(job) => job,
            Err(m) => {
                let malformed = decide::malformed(m);
                let outcome = self.outcomes.dead(&s.publisher, delivery, None, malformed);
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
            if let Some(outcome) =
                Box::pin(self.routes.escalation_over(s, &job, awaited, at)).await?
            {
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
            if let Some(outcome) =
                Box::pin(self.digests.held_instead(h, *until, cause, &self.outcomes)).await?
            {
                return Ok(outcome);
            }
        }
        let outcome = self.carry_out(h, decision, route, now).await;
        if let Ok(outcome) = &outcome {
            if (policy.digest.is_some() || matches!(outcome, Outcome::Dead(_)))
                && crate::digest::is_digest(h.delivery)
            {
                Box::pin(self.digests.digest_done(h, outcome)).await?;
            }
            h.rules.metrics.count(outcome, h.labels);
        }
        outcome
    }

    /// The job in `delivery`, or why it is none: its body within
    /// `worker.max_body_bytes` (a digest's, within room for its items).
    fn decode<'d>(&self, delivery: &'d Delivery) -> Result<Job<'d>, decode::Malformed> {
        let mut max_body = self.max_body_bytes;
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
                self.outcomes.dead_noted(s, delivery, job, seen, dead).await
            }
            Decision::ReleaseThenDead(ticket, dead) => {
                let release = || self.asks.store.release(&ticket);
                self.asks.retry_redis(release, &s.stop).await?;
                self.outcomes.dead_noted(s, delivery, job, seen, dead).await
            }
            Decision::Duplicate => {
                info!("duplicate of a job already dispatched; acked, not sent again");
                if let Some((routed, on_step)) = route {
                    // sent before a crash: its escalation may not have been
                    let at = (seen.first_seen, true);
                    let later =
                        self.routes
                            .escalate_later(s, delivery, (on_step, routed), h.policy, at);
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
                let superseded = JobState::Superseded { by };
                self.outcomes.note(s, job, seen, superseded, None);
                Ok(Outcome::Superseded)
            }
            Decision::Delay { until, cause } => self.outcomes.delay(h, until, &cause).await,
            Decision::Dispatch(ticket) => {
                let sent = self.outcomes.dispatch(h, ticket, route, &self.routes, now);
                match sent.await? {
                    Sent::Out(outcome) => Ok(outcome),
                    // a final go after a wait: a cancel or an erase came meanwhile
                    Sent::Stopped(stop) => Box::pin(self.carry_out(h, stop, route, now)).await,
                }
            }
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
            .lanes
            .park(h.s, (h.delivery, job), h.seen.first_seen, lane)
            .await?;
        let policy = rules.policy(&job.category);
        rules
            .metrics
            .count(&outcome, rules.labels(&policy.name, &job.channel));
        Ok(outcome)
    }
}
