//! One delivery to one confirmed outcome: decode; then the first step that settles
//! it decides (a cancel mark, known in memory; triage; the newest of its collapse
//! key, asked of Redis only for jobs that carry one; for a policy with a digest,
//! the fold into its digest ([`super::digest`]); its schedule and send windows;
//! the store's admission); then carry out the [`Decision`] (publish, then commit
//! or release) and note it for `admin job`. The decision itself is pure
//! ([`crate::decide`]); this is its executor.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::ShortString;
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::error::ProcessError;
use super::link::BrokerLink;
use super::Worker;
use crate::admission::{Admission, RateStep, Request};
use crate::amqp::PublishError;
use crate::decide::{self, Context, Decision, DelayCause};
use crate::fallback;
use crate::job::decode::{self, Job};
use crate::job::note::JobState;
use crate::job::{headers, Outcome};
use crate::lanes::{self, Priority, Step};
use crate::metrics::JobLabels;
use crate::quota::digest::DigestMode;
use crate::redis::collapse::Collapse;
use crate::redis::StoreError;
use crate::rules::Rules;

/// What the worker knows of a job's past: the times it was handled before, when a
/// worker first saw it, and its policy's name.
pub(super) struct Seen<'a> {
    pub(super) attempt: u64,
    pub(super) first_seen: DateTime<Utc>,
    pub(super) policy: &'a str,
}

impl Worker {
    /// How long a job held by the pause after a Redis reset waits (`redis.paused_hold`,
    /// validated to at most an hour, so the conversion cannot fail).
    fn paused_hold(&self) -> chrono::Duration {
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
        let mut max_body = self.settings.worker.max_body_bytes;
        // a digest carries up to `keep` items of at most max_body_bytes each (the
        // header is looked at only for a body over the bound)
        if delivery.data.len() > max_body && super::digest::is_digest(delivery) {
            max_body = max_body.saturating_mul(crate::quota::digest::MAX_KEEP as usize + 2);
        }
        let job = match decode::decode(&delivery.data, max_body, self.default_tz) {
            Ok(job) => job,
            Err(m) => {
                let dead = decide::malformed(m);
                let outcome = self.dead(&s.publisher, delivery, None, dead).await?;
                rules.metrics.count(&outcome, JobLabels::default());
                return Ok(outcome);
            }
        };
        tracing::Span::current().record("job_id", job.id.as_ref());
        let headers = delivery.properties.headers().as_ref();
        // a job published again after its step's send failed resumes its route
        let (job, resumed) = match job.fallback {
            None => (job, (0, None)),
            Some(_) => {
                let (job, at, from) = fallback::route::resume(job, headers);
                (job, (at, from))
            }
        };
        let policy = rules.policy_of(&job.category, job.tenant.as_deref());
        let labels = rules.labels(&policy.name, &job.channel);
        // an escalation come back: on only while its step is unanswered
        let escalation = job
            .fallback
            .as_ref()
            .and_then(|_| fallback::route::escalation(headers));
        if let Some(awaited) = &escalation {
            let over = self.escalation_over(s, &job, awaited, resumed.0);
            if let Some(outcome) = Box::pin(over).await? {
                rules.metrics.count(&outcome, labels);
                return Ok(outcome);
            }
        }
        let (attempt, first_seen) = headers::attempt_info(headers);
        let seen = Seen {
            attempt,
            first_seen: first_seen.map_or(now, crate::quota::window::from_millis),
            policy: &policy.name,
        };
        crate::telemetry::job(&job.id, &policy.name, attempt);
        // a job with `fallback`: where it is on its route, and itself on the
        // channel of that step (`None` for every other job)
        let mut route: Option<(fallback::Routed, Job<'_>)> = None;
        // Each step may settle the job; the first that does, decides.
        let decision = 'decided: {
            if let Some(at) = self.cancels.get(&job.id) {
                break 'decided Decision::Dead(decide::cancelled(at));
            }
            if let Some(decision) = decide::triage(&job, &self.topology.channels, now) {
                break 'decided decision;
            }
            if let Some(further) = job.fallback.as_deref() {
                if let Some(dead) =
                    fallback::route::unknown_channel(further, &self.topology.channels)
                {
                    break 'decided Decision::Dead(dead);
                }
            }
            // a policy with a digest folds its jobs (not a digest itself, nor a job
            // scheduled for later: it is folded when it comes back)
            if let Some(spec) = policy
                .digest
                .as_ref()
                .filter(|d| d.mode != DigestMode::Held)
            {
                if job.not_before.is_none_or(|t| t <= now) && !super::digest::is_digest(delivery) {
                    let fold =
                        self.fold(s, delivery, &job, seen.first_seen, &policy.name, spec, None);
                    let (digest, closes_at) = Box::pin(fold).await?;
                    let step = JobState::Folded { digest, closes_at };
                    self.note(s, &job, &seen, step, None);
                    rules.metrics.count(&Outcome::Folded, labels);
                    return Ok(Outcome::Folded);
                }
            }
            if let Some(key) = job.collapse_key.as_deref() {
                let newest = || {
                    let (recipient, id, tenant) = (&job.recipient, &job.id, job.tenant.as_deref());
                    self.store
                        .collapse(tenant, recipient, key, id, seen.first_seen)
                };
                if let Collapse::SupersededBy(by) = self.retry_redis(newest, &s.stop).await? {
                    break 'decided Decision::Superseded { by };
                }
            }
            let channel_rules = rules.channel(&job.channel);
            let cx = Context {
                policy,
                channel_windows: channel_rules.and_then(|c| c.windows.as_ref()),
                first_seen: seen.first_seen,
            };
            if let Some(decision) = decide::hold(&job, &cx, now) {
                break 'decided decision;
            }
            if self.health.resets.paused() {
                if let Some(decision) = decide::paused(&job, &cx, now, self.paused_hold()) {
                    break 'decided decision;
                }
            }
            let req = Request {
                id: &job.id,
                recipient: &job.recipient,
                channel: &job.channel,
                category: &job.category,
                tz: job.tz,
                tenant: job.tenant.as_deref(),
                priority: job.priority.unwrap_or(cx.policy.priority),
                counted: escalation.is_some(),
            };
            let lane = lanes::lane_of(&job, cx.policy, from);
            // the lanes' steps are boxed: a job of a channel without lanes does not
            // carry (and copy) their state in its own
            let step = match channel_rules.and_then(|c| c.rate.zip(c.lanes)) {
                None => RateStep::Wait(None),
                Some(paced) => match Box::pin(self.rate_step(s, &job, lane, from, paced)).await? {
                    Step::Admit(step) => step,
                    Step::Park(lane) => {
                        return Box::pin(self.parked(s, delivery, &job, (lane, false), &rules))
                            .await
                    }
                },
            };
            let Some(admission) = self.admit(&req, &rules, s, step).await? else {
                return Box::pin(self.parked(s, delivery, &job, (lane, true), &rules)).await;
            };
            if let (Some(lane), RateStep::Taken(_)) = (from, step) {
                self.lane_taken(delivery, &job.channel, lane);
            }
            let admission = match job.fallback.as_deref() {
                None => admission,
                Some(further) => {
                    let at = (resumed.0, resumed.1.clone(), escalation.is_some());
                    let walk = self.route(s, &job, further, (&cx, &rules), admission, at);
                    let stepped = Box::pin(walk).await?;
                    let on_step = Job {
                        channel: stepped.channel,
                        ..job.clone()
                    };
                    route = Some((stepped.routed, on_step));
                    stepped.admission
                }
            };
            let job = route.as_ref().map_or(&job, |(_, on_step)| on_step);
            // paused while it waited for its admission or its channel's rate: its
            // admission is given back and it waits as the others do
            if let (true, Admission::Admitted(ticket)) = (self.health.resets.paused(), &admission) {
                if let Some(decision) = decide::paused(&job, &cx, now, self.paused_hold()) {
                    Box::pin(self.retry_redis(|| self.store.release(ticket), &s.stop)).await?;
                    break 'decided decision;
                }
            }
            let now = self.store.redis_now();
            if let Some(verdict) = decide::shadow(&job, &cx, &admission, now) {
                crate::metrics::shadowed(&policy.name, verdict);
                debug!(
                    policy = %policy.name,
                    verdict = verdict.label(),
                    "shadow policy: what enforcing it would have done"
                );
            }
            decide::after_admission(job, &cx, admission, now)
        };
        // a `held` digest: what the caps would delay is folded instead, and its
        // digest closes at the instant the caps allow the next send
        if let Decision::Delay { until, cause } = &decision {
            // a held digest refused when it goes opens again and goes on collecting
            if super::digest::held_digest(policy, delivery) {
                let key = self
                    .store
                    .digest_key(job.tenant.as_deref(), &job.recipient, &job.id);
                let reopen = || self.store.reopen_digest(&key, *until);
                if Box::pin(self.retry_redis(reopen, &s.stop)).await? {
                    debug!(until = %until.to_rfc3339(), "a held digest refused: open again until then");
                    rules.metrics.count(&Outcome::Folded, labels);
                    return Ok(Outcome::Folded);
                }
            }
            if let Some(spec) = super::digest::held(policy, cause, delivery) {
                let fold = self.fold(
                    s,
                    delivery,
                    &job,
                    seen.first_seen,
                    &policy.name,
                    spec,
                    Some(*until),
                );
                let (digest, closes_at) = Box::pin(fold).await?;
                self.note(s, &job, &seen, JobState::Folded { digest, closes_at }, None);
                rules.metrics.count(&Outcome::Folded, labels);
                return Ok(Outcome::Folded);
            }
        }
        // Carry the decision out: publish its outcome, then commit or release. (One
        // match here rather than a function of its own: each level of async call is
        // a copy of its future per job, BENCHMARKS.md item 15.)
        let outcome = match decision {
            Decision::Dead(dead) => {
                let dead = match &route {
                    Some((routed, _)) => routed.dead_letter(dead),
                    None => dead,
                };
                self.dead_noted(s, delivery, &job, &seen, dead).await
            }
            Decision::ReleaseThenDead(ticket, dead) => {
                self.retry_redis(|| self.store.release(&ticket), &s.stop)
                    .await?;
                self.dead_noted(s, delivery, &job, &seen, dead).await
            }
            Decision::Duplicate => {
                info!("duplicate of a job already dispatched; acked, not sent again");
                if let Some((routed, on_step)) = &route {
                    // sent before a crash: its escalation may not have been
                    let later = self.escalate_later(
                        s,
                        delivery,
                        (on_step, routed),
                        policy,
                        (seen.first_seen, true),
                    );
                    Box::pin(later).await?;
                }
                Ok(Outcome::Duplicate)
            }
            Decision::Superseded { by } => {
                info!(
                    by,
                    "superseded by a newer job with its collapse key; acked, not sent"
                );
                self.note(s, &job, &seen, JobState::Superseded { by }, None);
                Ok(Outcome::Superseded)
            }
            Decision::Delay { until, cause } => {
                let held_by = rules.held_by(&cause);
                self.delay(s, delivery, &job, &seen, until, &cause, &held_by)
                    .await
            }
            Decision::Dispatch(ticket) => {
                let mut props = BasicProperties::default()
                    .with_content_type("application/json".into())
                    .with_message_id(ShortString::from(job.id.as_ref()));
                let channel = route.as_ref().map_or(&job.channel, |(_, j)| &j.channel);
                match (headers::dispatch_headers(headers, now), &route) {
                    (h, Some((routed, _))) => {
                        props =
                            props.with_headers(fallback::route::with_headers(h, routed, channel));
                    }
                    (Some(h), None) => props = props.with_headers(h),
                    (None, None) => {}
                }
                let exchange = &self.settings.amqp.dispatch_exchange;
                let (props, sending) =
                    crate::telemetry::send(exchange, channel, Some(&job.id), props);
                // a routed step's next one is kept before it goes, so that a failure
                // the sender reports at once finds it
                if let Some((routed, on_step)) = &route {
                    sending.routed(
                        routed.step + 1,
                        routed
                            .from
                            .as_deref()
                            .and_then(fallback::route::cause_of)
                            .map(|c| c.as_str()),
                    );
                    let keep =
                        self.keep_next_step(&job, (on_step, routed), policy, delivery, &s.stop);
                    if let Err(e) = Box::pin(keep).await {
                        drop(sending);
                        if self.store.release(&ticket).await.is_err() {
                            self.store.keep_reservation(&ticket);
                        }
                        return Err(e);
                    }
                }
                // a broker that blocks or stopped answering would hold the dispatch
                // until it answers: hold it here instead, so that a shutdown meanwhile
                // hands the job back unsent rather than sent twice
                if !s.publisher.is_flowing() {
                    s.publisher.flowing().await;
                }
                if !s.publisher.is_connected() {
                    // the session is gone and nothing was sent: the send is given
                    // back (kept if Redis cannot be told), and the broker delivers
                    // the job again, to whichever worker, without a lease to wait
                    drop(sending);
                    if self.store.release(&ticket).await.is_err() {
                        self.store.keep_reservation(&ticket);
                    }
                    return Err(ProcessError::Interrupted);
                }
                let published = s
                    .publisher
                    .publish(exchange, channel, &delivery.data, props)
                    .await;
                if let Err(e) = &published {
                    sending.failed(e);
                }
                drop(sending);
                match published {
                    Ok(()) => {
                        s.commits.commit(ticket);
                        if let Some((routed, on_step)) = &route {
                            let later = self.escalate_later(
                                s,
                                delivery,
                                (on_step, routed),
                                policy,
                                (seen.first_seen, false),
                            );
                            Box::pin(later).await?;
                        }
                        if attempt > 0 {
                            // it had waited: out of its recipient's waiting jobs
                            self.note(s, &job, &seen, JobState::Dispatched, None);
                        }
                        debug!(channel = %channel, "dispatched");
                        Ok(Outcome::Dispatched)
                    }
                    Err(e @ (PublishError::Returned | PublishError::Nacked)) => {
                        warn!(error = %e, "dispatch refused by the broker; giving the quota back");
                        self.retry_redis(|| self.store.release(&ticket), &s.stop)
                            .await?;
                        let until = decide::retry_refused_dispatch_at(attempt, now);
                        let cause = DelayCause::DispatchRefused;
                        let held_by = rules.held_by(&cause);
                        self.delay(s, delivery, &job, &seen, until, &cause, &held_by)
                            .await
                    }
                    Err(e) => {
                        // No confirm in time, or the connection dropped: the dispatch may
                        // have been delivered. Keep its reservation so the recipient's slot
                        // is not given to another job; the retry of this job takes it back
                        // (see QuotaStore::keep_reservation).
                        warn!(error = %e, "dispatch unconfirmed; keeping its reservation and handing the job back");
                        self.store.keep_reservation(&ticket);
                        Err(e.into())
                    }
                }
            }
        };
        if let Ok(outcome) = &outcome {
            // a digest sent (or a duplicate, or dead) is done with: its keys go
            // (a held digest's stay until then, for it to open again if refused)
            if policy.digest.is_some()
                && !matches!(outcome, Outcome::Delayed { .. } | Outcome::Parked)
                && super::digest::is_digest(delivery)
            {
                let key = self
                    .store
                    .digest_key(job.tenant.as_deref(), &job.recipient, &job.id);
                Box::pin(self.retry_redis(|| self.store.end_digest(&key), &s.stop)).await?;
            }
            // a digest's job dead-lettered (opted out, expired, cancelled, …)
            if matches!(outcome, Outcome::Dead(_)) && super::digest::is_digest(delivery) {
                crate::metrics::digest_ended(&policy.name, "dead", 0);
            }
            rules.metrics.count(outcome, labels);
        }
        outcome
    }

    /// Park a job in its lane, and count it.
    async fn parked(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        job: &Job<'_>,
        lane: (Priority, bool),
        rules: &Rules,
    ) -> Result<Outcome, ProcessError> {
        let outcome = self.park(s, delivery, job, lane).await?;
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
