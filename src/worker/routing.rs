//! A job with `fallback` on its route, as the worker carries it out: each further
//! channel admitted through the worker's own admission, a routed step's next one
//! kept before the step goes, its escalation published after, and an escalation
//! that comes back checked against its step's answer. What moves a job on, and why, is the fallback
//! room's ([`crate::fallback`]); this is the worker's side of it ([`Routes`]).

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::{AMQPValue, ShortString};
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::asks::Asks;
use super::error::ProcessError;
use super::handling::{request, RouteAt};
use super::link::BrokerLink;
use crate::admission::{Admission, RateStep};
use crate::amqp::Topology;
use crate::decide::Context;
use crate::fallback;
use crate::fallback::log::{RouteEntry, StepOutcome};
use crate::fallback::route::{ESCALATION, FALLBACK_FROM, RESUME_AT};
use crate::fallback::spec::{AnsweredBy, Cause};
use crate::fallback::state::{self, Answers, NextStep, StepOf, Way};
use crate::job::decode::Job;
use crate::job::{headers, Outcome};
use crate::quota::policy::Policy;
use crate::quota::window::Window;
use crate::rules::Rules;

/// The worker's side of routes: the store asked for each further channel, the
/// delay ladder an escalation goes round.
#[derive(Debug)]
pub(crate) struct Routes {
    pub(super) asks: Asks,
    topology: Topology,
}

impl Routes {
    /// The routes over `topology`, asking `asks`.
    pub(super) fn new(asks: Asks, topology: &Topology) -> Routes {
        Routes {
            asks,
            topology: topology.clone(),
        }
    }

    /// The route of a job with `fallback` (`further`), from its own channel's
    /// `first` admission: each further channel admitted in turn as the job's
    /// policy says (module [`crate::fallback`]); `counted` when it is an
    /// escalation (its notification counted already where channels are spanned).
    pub(super) async fn route<'j>(
        &self,
        s: &BrokerLink,
        job: &Job<'j>,
        further: &[Cow<'j, str>],
        (cx, rules): (&Context<'_>, &Rules),
        first: Admission,
        at: RouteAt,
    ) -> Result<fallback::step::Stepped<'j>, ProcessError> {
        let RouteAt {
            step: offset,
            left: from,
            escalation: counted,
        } = at;
        let mut channels = Vec::with_capacity(1 + further.len());
        channels.push(job.channel.clone());
        channels.extend(further.iter().cloned());
        let of = fallback::step::RouteOf {
            policy: cx.policy,
            spec: &cx.policy.fallback,
            tz: job.tz,
            now: self.asks.store.redis_now(),
            offset,
            from,
        };
        let all = &channels;
        let admit = move |step: usize| {
            let channel: &str = &all[step];
            async move {
                let req = request(job, channel, cx.policy, counted);
                // a further step waits for its channel's rate here (never parked)
                let admission = self
                    .asks
                    .admit(&req, rules, s, RateStep::Wait(None))
                    .await?;
                admission.ok_or(ProcessError::Interrupted)
            }
        };
        fallback::step::walk(all, first, &of, admit).await
    }

    /// Before a routed step's dispatch: its next step, kept pending for when the
    /// sender reports this one `failed` or it goes unanswered (module
    /// [`crate::fallback::state`]), when its policy moves on then and a channel is
    /// left.
    pub(super) async fn keep_next_step(
        &self,
        job: &Job<'_>,
        (on_step, routed): (&Job<'_>, &fallback::Routed),
        policy: &Policy,
        delivery: &Delivery,
        stop: &CancellationToken,
    ) -> Result<(), ProcessError> {
        let Some((step, to)) = &routed.next else {
            return Ok(());
        };
        let next = NextStep {
            step: *step,
            policy: policy.name.clone(),
            from: on_step.channel.to_string(),
            to: to.clone(),
            body: delivery.data.clone(),
        };
        let spec = &policy.fallback;
        let (answers, within) = match (spec.moves_on(Cause::Unanswered), spec.answer_within) {
            (true, Some(within)) => match spec.answered_by {
                AnsweredBy::Delivered => (Answers::Delivery, within),
                AnsweredBy::Read => (Answers::Read, within),
            },
            _ => (Answers::Nothing, Duration::ZERO),
        };
        // kept while it may still move on: its escalation's wait, then as long
        // as a record (a late failure)
        let ttl = (self.asks.store.record_ttl() + within).as_millis() as u64;
        let of = StepOf {
            tenant: job.tenant.as_deref(),
            recipient: &job.recipient,
            id: &job.id,
            channel: &next.from,
        };
        let keep = || state::keep(&self.asks.store, of, &next, answers, ttl);
        self.asks.retry_redis(keep, stop).await
    }

    /// After a routed step went out (`again`: found sent before, by a copy that a
    /// crash may have stopped short of this):
    /// when its policy escalates and a channel is left, the job published round
    /// the delay ladder to come back at the step's deadline and move on unless
    /// answered; and the step in the job's route. No escalation starts after the
    /// job's `expires_at`.
    pub(super) async fn escalate_later(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        (on_step, routed): (&Job<'_>, &fallback::Routed),
        policy: &Policy,
        (first_seen, again): (DateTime<Utc>, bool),
    ) -> Result<(), ProcessError> {
        let now = self.asks.store.redis_now();
        let spec = &policy.fallback;
        let deadline = match (&routed.next, spec.answer_within) {
            (Some(_), Some(within)) if spec.moves_on(Cause::Unanswered) => {
                let at = now + chrono::Duration::from_std(within).unwrap_or_default();
                on_step.expires_at.is_none_or(|e| at < e).then_some(at)
            }
            _ => None,
        };
        let entry = RouteEntry {
            step: routed.step + 1,
            of: routed.of,
            channel: on_step.channel.to_string(),
            at: now,
            outcome: StepOutcome::Dispatched,
            left: routed.from.clone(),
            escalates_at: deadline,
        };
        if !again {
            fallback::log::append(&self.asks.store, &on_step.id, entry);
        }
        let (Some(until), Some((step, _))) = (deadline, &routed.next) else {
            return Ok(());
        };
        let ladder = self.topology.ladder();
        let seconds = ladder.seconds(now, until);
        let channel = on_step.channel.as_ref();
        let original = delivery.properties.headers().as_ref();
        let mut headers = headers::next_headers(original, first_seen, Some(until));
        let answer = match spec.answered_by {
            AnsweredBy::Delivered => "delivery",
            AnsweredBy::Read => "read",
        };
        let within = spec.answer_within.unwrap_or_default();
        let within = Window::Rolling(chrono::Duration::from_std(within).unwrap_or_default());
        let text = |s: String| AMQPValue::LongString(s.into());
        headers.insert(RESUME_AT.into(), text(step.to_string()));
        headers.insert(ESCALATION.into(), text(channel.to_string()));
        let why = format!("{channel}: unanswered (no {answer} within {within})");
        headers.insert(FALLBACK_FROM.into(), text(why));
        headers::held_by(&mut headers, &format!("an answer on `{channel}`"));
        ladder.mark(&mut headers, seconds);
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(on_step.id.as_ref()))
            .with_headers(headers);
        let entry = self.topology.delay_entry(seconds);
        let (props, sending) = crate::telemetry::send("", entry, Some(&on_step.id), props);
        let published = s.publisher.publish("", entry, &delivery.data, props).await;
        if let Err(e) = &published {
            sending.failed(e);
        }
        published?;
        debug!(until = %until.to_rfc3339(), channel, "escalates unless answered");
        Ok(())
    }

    /// An escalation come back (`awaited`: the channel whose answer it waited
    /// for): `None` when it claims the step's move on (it goes on to the next
    /// step now), `Some(Answered)` when that step was answered or moved on
    /// already (by a failure): nothing more is sent.
    pub(super) async fn escalation_over(
        &self,
        s: &BrokerLink,
        job: &Job<'_>,
        awaited: &str,
        at: usize,
    ) -> Result<Option<Outcome>, ProcessError> {
        let of = StepOf {
            tenant: job.tenant.as_deref(),
            recipient: &job.recipient,
            id: &job.id,
            channel: awaited,
        };
        let claim = || state::claim(&self.asks.store, of, Way::Escalation);
        if let Ok(next) = self.asks.retry_redis(claim, &s.stop).await? {
            metrics::counter!(
                crate::metrics::FALLBACK_TOTAL,
                "policy" => next.policy,
                "from" => next.from,
                "to" => next.to,
                "cause" => Cause::Unanswered.as_str(),
            )
            .increment(1);
            return Ok(None);
        }
        debug!(
            channel = awaited,
            "escalation: its step was answered; nothing more sent"
        );
        fallback::log::append(
            &self.asks.store,
            &job.id,
            RouteEntry {
                step: at,
                of: at + job.fallback.as_ref().map_or(0, Vec::len) + 1,
                channel: awaited.to_string(),
                at: self.asks.store.redis_now(),
                outcome: StepOutcome::Answered,
                left: None,
                escalates_at: None,
            },
        );
        Ok(Some(Outcome::Answered))
    }
}
