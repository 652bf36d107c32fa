//! A delivery's decision, the first step that settles it deciding: a cancel mark
//! (known in memory), triage, its further channels' names, a digest's fold, the
//! newest of its collapse key (asked of Redis only for jobs that carry one), its
//! schedule and send windows, the pause after a Redis reset, then the store's
//! admission (its channel's rate taken as its lane says) and its route over further
//! channels. What each step decides is [`crate::decide`]'s, pure; this asks.

use lapin::message::Delivery;
use tracing::debug;

use super::handling::{request, Decided, Handling, RouteAt};
use super::process::JobPath;
use crate::admission::{Admission, RateStep};
use crate::decide::{self, Context, Decision};
use crate::fallback;
use crate::job::decode::Job;
use crate::job::note::JobState;
use crate::job::Outcome;
use crate::lanes::{self, Priority, Step};
use crate::quota::digest::{DigestMode, DigestSpec};
use crate::quota::policy::Policy;
use crate::redis::collapse::Collapse;
use chrono::{DateTime, Utc};

use super::error::ProcessError;

impl JobPath {
    /// Decide the job of `h`, read from lane `from` (`None`: the jobs queue), at
    /// `at` on its route.
    pub(super) async fn decide<'j>(
        &self,
        h: &Handling<'_, 'j>,
        from: Option<Priority>,
        at: RouteAt,
        now: DateTime<Utc>,
    ) -> Result<Decided<'j>, ProcessError> {
        let (s, job, rules) = (h.s, h.job, h.rules);
        if let Some(decision) = self.settled_before(h, now) {
            return Ok(Decided::Carry(decision, None));
        }
        if let Some(spec) = folds_now(h.policy, job, h.delivery, now) {
            return Box::pin(self.fold_now(h, spec)).await.map(Decided::Settled);
        }
        if let Some(superseded) = self.superseded(h).await? {
            return Ok(Decided::Carry(superseded, None));
        }
        let channel_rules = rules.channel(&job.channel);
        let cx = Context {
            policy: h.policy,
            channel_windows: channel_rules.and_then(|c| c.windows.as_ref()),
            first_seen: h.seen.first_seen,
        };
        if let Some(decision) = self.held_back(job, &cx, now) {
            return Ok(Decided::Carry(decision, None));
        }
        let lane = lanes::lane_of(job, cx.policy, from);
        // the lanes' steps are boxed: a job of a channel without lanes does not
        // carry (and copy) their state in its own
        let step = match channel_rules.and_then(|c| c.laned_for(job.cost)) {
            None => RateStep::Wait(None),
            Some(paced) => match Box::pin(self.lanes.rate_step(s, job, lane, from, paced)).await? {
                Step::Admit(step) => step,
                Step::Park(lane) => {
                    let parked = self.parked(h, (lane, false));
                    return Box::pin(parked).await.map(Decided::Settled);
                }
            },
        };
        let req = request(job, &job.channel, cx.policy, at.escalation);
        let Some(admission) = self.asks.admit(&req, rules, s, step).await? else {
            // it may have waited in its line: stopped meanwhile, it is not parked
            if let Some(stop) = self.stopped_since(h) {
                return Ok(Decided::Carry(stop, None));
            }
            let parked = self.parked(h, (lane, true));
            return Box::pin(parked).await.map(Decided::Settled);
        };
        if let (Some(lane), RateStep::Taken(_)) = (from, step) {
            self.lanes.taken(h.delivery, &job.channel, lane);
        }
        let (admission, route) = match job.fallback.as_deref() {
            None => (admission, None),
            Some(further) => {
                let walk = self
                    .routes
                    .route(s, job, further, (&cx, rules), admission, at);
                let stepped = Box::pin(walk).await?;
                let on_step = Job {
                    channel: stepped.channel,
                    ..job.clone()
                };
                (stepped.admission, Some(Box::new((stepped.routed, on_step))))
            }
        };
        let on = route.as_deref().map_or(job, |(_, on_step)| on_step);
        if let Some(back) = Box::pin(self.given_back(h, on, &cx, &admission, now)).await? {
            let route = route.filter(|_| !matches!(back, Decision::Erased));
            return Ok(Decided::Carry(back, route));
        }
        let now = self.asks.store.redis_now();
        shadowed(on, &cx, &admission, now);
        let decision = crate::admission::decision::after_admission(on, &cx, admission, now);
        Ok(Decided::Carry(decision, route))
    }

    /// A job with a `collapse_key` that a newer one of its recipient replaced
    /// (asked of Redis only for jobs that carry one).
    async fn superseded(&self, h: &Handling<'_, '_>) -> Result<Option<Decision>, ProcessError> {
        let job = h.job;
        let Some(key) = job.collapse_key.as_deref() else {
            return Ok(None);
        };
        let newest = || {
            let (recipient, id, tenant) = (&job.recipient, &job.id, job.tenant.as_deref());
            let store = &self.asks.store;
            store.collapse(tenant, recipient, key, id, h.seen.first_seen)
        };
        Ok(match self.asks.retry_redis(newest, &h.s.stop).await? {
            Collapse::SupersededBy(by) => Some(Decision::Superseded { by }),
            _ => None,
        })
    }

    /// A job stopped after its admission (given back, admitted or not): cancelled,
    /// or its recipient erased, while it waited (in its line, for its send slot,
    /// for its admission); or paused while it waited for its admission or its
    /// channel's rate (it waits as the others do).
    async fn given_back(
        &self,
        h: &Handling<'_, '_>,
        on: &Job<'_>,
        cx: &Context<'_>,
        admission: &Admission,
        now: DateTime<Utc>,
    ) -> Result<Option<Decision>, ProcessError> {
        let back = match (self.stopped_since(h), admission) {
            (Some(stop), _) => stop,
            (None, Admission::Admitted(_)) if self.asks.health.resets.paused() => {
                match decide::paused(on, cx, now, self.paused_hold()) {
                    Some(paused) => paused,
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        if let Admission::Admitted(ticket) | Admission::Shadowed { ticket, .. } = admission {
            let release = || self.asks.store.release(ticket);
            self.asks.retry_redis(release, &h.s.stop).await?;
        }
        Ok(Some(back))
    }

    /// What stops the job of `h` at its final go that its first check did not
    /// ([`Cancels::stopped_since`](super::cancels::Cancels::stopped_since)).
    pub(super) fn stopped_since(&self, h: &Handling<'_, '_>) -> Option<Decision> {
        self.cancels.stopped_since(h, self.asks.store.keys())
    }

    /// What settles a job before anything is asked of Redis: a cancel mark, its
    /// recipient's erase, triage, an unconfigured channel among its further ones.
    fn settled_before(&self, h: &Handling<'_, '_>, now: DateTime<Utc>) -> Option<Decision> {
        let job = h.job;
        if let Some(at) = self.cancels.get(&job.id) {
            return Some(Decision::Dead(decide::cancelled(at)));
        }
        if self.cancels.erased(h, self.asks.store.keys()) {
            return Some(Decision::Erased);
        }
        if let Some(decision) = decide::triage(job, &self.topology.channels, now) {
            return Some(decision);
        }
        let further = job.fallback.as_deref()?;
        let dead = fallback::route::unknown_channel(further, &self.topology.channels)?;
        Some(Decision::Dead(dead))
    }

    /// A job held back by its schedule or send windows, or by the pause after a
    /// Redis reset.
    fn held_back(&self, job: &Job<'_>, cx: &Context<'_>, now: DateTime<Utc>) -> Option<Decision> {
        if let Some(decision) = decide::hold(job, cx, now) {
            return Some(decision);
        }
        if self.asks.health.resets.paused() {
            return decide::paused(job, cx, now, self.paused_hold());
        }
        None
    }

    /// Fold a job of a policy with a digest into it, and note and count it.
    async fn fold_now(
        &self,
        h: &Handling<'_, '_>,
        spec: &DigestSpec,
    ) -> Result<Outcome, ProcessError> {
        let fold = self.digests.fold(h, spec, None);
        let (digest, closes_at) = fold.await?;
        let step = JobState::Folded { digest, closes_at };
        self.outcomes.note(h.s, h.job, h.seen, step, None);
        h.rules.metrics.count(&Outcome::Folded, h.labels);
        Ok(Outcome::Folded)
    }
}

/// The digest a job is folded into now: its policy's, when the policy folds as jobs
/// come (not `held`), the job is not a digest itself, nor scheduled for later (it is
/// folded when it comes back).
fn folds_now<'p>(
    policy: &'p Policy,
    job: &Job<'_>,
    delivery: &Delivery,
    now: DateTime<Utc>,
) -> Option<&'p DigestSpec> {
    let spec = policy
        .digest
        .as_ref()
        .filter(|d| d.mode != DigestMode::Held)?;
    let due = job.not_before.is_none_or(|t| t <= now);
    (due && !crate::digest::is_digest(delivery)).then_some(spec)
}

/// A shadow policy's verdict: what enforcing it would have done, counted and logged.
fn shadowed(job: &Job<'_>, cx: &Context<'_>, admission: &Admission, now: DateTime<Utc>) {
    if let Some(verdict) = decide::shadow(job, cx, admission, now) {
        crate::metrics::shadowed(&cx.policy.name, verdict);
        debug!(
            policy = %cx.policy.name,
            verdict = verdict.label(),
            "shadow policy: what enforcing it would have done"
        );
    }
}
