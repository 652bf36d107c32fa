//! A job with `fallback` on its route, as the worker carries it out: each further
//! channel admitted through the worker's own admission, and a routed step's next
//! one kept before the step goes. What moves a job on, and why, is the fallback
//! room's ([`crate::fallback`]).

use std::borrow::Cow;

use lapin::message::Delivery;
use tokio_util::sync::CancellationToken;

use super::process::ProcessError;
use super::session::BrokerLink;
use super::Worker;
use crate::admission::{Admission, Request};
use crate::decide::Context;
use crate::fallback;
use crate::job::decode::Job;
use crate::rules::Rules;
use crate::store::RateStep;

impl Worker {
    /// The route of a job with `fallback` (`further`), from its own channel's
    /// `first` admission: each further channel admitted in turn as the job's
    /// policy says (module [`crate::fallback`]).
    pub(super) async fn route<'j>(
        &self,
        s: &BrokerLink,
        job: &Job<'j>,
        further: &[Cow<'j, str>],
        (cx, rules): (&Context<'_>, &Rules),
        first: Admission,
        (offset, from): (usize, Option<String>),
    ) -> Result<fallback::step::Stepped<'j>, ProcessError> {
        let mut channels = Vec::with_capacity(1 + further.len());
        channels.push(job.channel.clone());
        channels.extend(further.iter().cloned());
        let of = fallback::step::RouteOf {
            policy: cx.policy,
            spec: &cx.policy.fallback,
            tz: job.tz,
            now: self.store.redis_now(),
            offset,
            from,
        };
        let all = &channels;
        let admit = move |step: usize| {
            let channel: &str = &all[step];
            async move {
                let req = Request {
                    id: &job.id,
                    recipient: &job.recipient,
                    channel,
                    category: &job.category,
                    tz: job.tz,
                    tenant: job.tenant.as_deref(),
                    priority: job.priority.unwrap_or(cx.policy.priority),
                };
                // a further step waits for its channel's rate here (never parked)
                let admission = self.admit(&req, rules, s, RateStep::Wait(None)).await?;
                admission.ok_or(ProcessError::Interrupted)
            }
        };
        fallback::step::walk(all, first, &of, admit).await
    }

    /// After a routed step's dispatch: its next step, kept for when the sender
    /// reports this one `failed` (module [`crate::fallback::state`]), when its
    /// policy moves on then and a channel is left.
    pub(super) async fn keep_next_step(
        &self,
        job: &Job<'_>,
        (on_step, routed): (&Job<'_>, &fallback::Routed),
        policy: &str,
        delivery: &Delivery,
        stop: &CancellationToken,
    ) -> Result<(), ProcessError> {
        let Some((step, to)) = &routed.on_failure else {
            return Ok(());
        };
        let next = fallback::state::NextStep {
            step: *step,
            policy: policy.to_string(),
            from: on_step.channel.to_string(),
            to: to.clone(),
            body: delivery.data.clone(),
        };
        let ttl = self.settings.redis.record_ttl.0.as_millis() as u64;
        let (tenant, recipient, id) = (job.tenant.as_deref(), &job.recipient, &job.id);
        let keep = || fallback::state::keep(&self.store, tenant, recipient, id, &next, ttl);
        self.retry_redis(keep, stop).await
    }
}
