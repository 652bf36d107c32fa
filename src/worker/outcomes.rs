//! What the worker publishes for a job that does not go out now: its wait in the
//! delay ladder, its dead letter, and the note `admin job` reads of it; with its
//! dispatch (`dispatch.rs`), what [`Outcomes`] publishes.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::ShortString;
use lapin::BasicProperties;
use tracing::{debug, info};

use super::asks::Asks;
use super::cancels::Cancels;
use super::error::ProcessError;
use super::handling::{Handling, Seen};
use super::link::BrokerLink;
use crate::amqp::{Publisher, Topology};
use crate::config::Settings;
use crate::decide::{DeadLetter, DelayCause};
use crate::job::decode::Job;
use crate::job::note::{JobNote, JobState};
use crate::job::{headers, Outcome, Reason};
use crate::redis::notes::{Note, Waiting};

/// What the worker publishes for a job, and notes of it.
#[derive(Debug)]
pub(crate) struct Outcomes {
    pub(super) asks: Asks,
    /// The cancel and erase marks a dispatch's final go is checked against.
    pub(super) cancels: Arc<Cancels>,
    /// The delay ladder and its entries, the dispatch exchange.
    pub(super) topology: Topology,
    /// Where dispatches go (`amqp.dispatch_exchange`).
    pub(super) dispatch_exchange: String,
    /// Where dead letters go (`amqp.dead_exchange`).
    dead_exchange: String,
    /// Whether jobs' notes are written (`redis.notes`).
    notes: bool,
}

impl Outcomes {
    /// The outcomes over `topology` for `settings`, asking `asks`.
    pub(super) fn new(
        asks: Asks,
        cancels: Arc<Cancels>,
        topology: &Topology,
        settings: &Settings,
    ) -> Outcomes {
        Outcomes {
            asks,
            cancels,
            topology: topology.clone(),
            dispatch_exchange: settings.amqp.dispatch_exchange.clone(),
            dead_exchange: settings.amqp.dead_exchange.clone(),
            notes: settings.redis.notes,
        }
    }

    /// Send the job of `h` round the delay ladder until `until`, held for `cause`
    /// (what it says in `x-notify-held-by`, from the rules in force), and note it.
    pub(super) async fn delay(
        &self,
        h: &Handling<'_, '_>,
        until: DateTime<Utc>,
        cause: &DelayCause,
    ) -> Result<Outcome, ProcessError> {
        let (s, delivery, job, seen) = (h.s, h.delivery, h.job, h.seen);
        let held_by = &h.rules.held_by(cause);
        let ladder = self.topology.ladder();
        let now = self.asks.store.redis_now();
        let seconds = ladder.seconds(now, until);
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(job.id.as_ref()))
            .with_headers({
                let original = delivery.properties.headers().as_ref();
                let mut headers = headers::next_headers(original, seen.first_seen, Some(until));
                headers::held_by(&mut headers, held_by);
                ladder.mark(&mut headers, seconds);
                headers
            });
        crate::telemetry::delayed(cause.label(), held_by, until);
        let entry = self.topology.delay_entry(seconds);
        let (props, sending) = crate::telemetry::send("", entry, Some(&job.id), props);
        let published = s.publisher.publish("", entry, &delivery.data, props).await;
        if let Err(e) = &published {
            sending.failed(e);
        }
        drop(sending);
        published?;
        s.metrics
            .delayed(cause, (until - now).to_std().unwrap_or_default());
        debug!(until = %until.to_rfc3339(), seconds, cause = cause.label(), "delayed");
        let step = JobState::Delayed {
            until,
            seconds,
            cause: cause.label().to_string(),
            held_by: held_by.to_string(),
            sends_seen: match cause {
                DelayCause::Cap { seen, .. } | DelayCause::Capped { seen, .. } => Some(*seen),
                _ => None,
            },
        };
        self.note(s, job, seen, step, Some(until));
        Ok(Outcome::Delayed { until })
    }

    /// Dead-letter a job, and note it (spending its cancel mark if that was why).
    pub(super) async fn dead_noted(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        job: &Job<'_>,
        seen: &Seen<'_>,
        dead: DeadLetter,
    ) -> Result<Outcome, ProcessError> {
        let step = JobState::Dead {
            reason: dead.reason.as_str().to_string(),
            detail: dead.detail.clone(),
        };
        let outcome = self.dead(&s.publisher, delivery, Some(job), dead).await?;
        self.note(s, job, seen, step, None);
        Ok(outcome)
    }

    /// Note what became of `job` for `admin job` (and, when it waits or has waited,
    /// in its recipient's waiting jobs): written with the next batch of commits.
    /// With `redis.notes = false` only a spent cancel mark is written.
    pub(super) fn note(
        &self,
        s: &BrokerLink,
        job: &Job<'_>,
        seen: &Seen<'_>,
        step: JobState,
        waits_until: Option<DateTime<Utc>>,
    ) {
        let spend_cancel =
            matches!(&step, JobState::Dead { reason, .. } if reason == Reason::Cancelled.as_str());
        let notes = self.notes;
        if !notes && !spend_cancel {
            return;
        }
        let waiting = match waits_until {
            _ if !notes => Waiting::Untouched,
            Some(until) => Waiting::Until {
                key: self.waiting_key(job),
                until,
            },
            None if seen.attempt > 0 => Waiting::Gone {
                key: self.waiting_key(job),
            },
            None => Waiting::Untouched,
        };
        s.commits.note(Note {
            id: job.id.to_string(),
            record: notes.then(|| JobNote {
                step,
                at: self.asks.store.redis_now(),
                attempt: seen.attempt,
                first_seen: seen.first_seen,
                policy: Some(seen.policy.to_string()),
                channel: job.channel.to_string(),
                zone: Some(job.tz.name().to_string()),
                trace_id: crate::telemetry::trace_id(),
                tenant: job.tenant.as_deref().map(str::to_string),
            }),
            waiting,
            spend_cancel,
        });
    }

    /// The set of the waiting jobs of `job`'s recipient (of its tenant).
    pub(super) fn waiting_key(&self, job: &Job<'_>) -> String {
        let keys = self.asks.store.keys().for_tenant(job.tenant.as_deref());
        keys.waiting(&job.recipient)
    }

    pub(super) async fn dead(
        &self,
        publisher: &Publisher,
        delivery: &Delivery,
        job: Option<&Job<'_>>,
        dead: DeadLetter,
    ) -> Result<Outcome, ProcessError> {
        let DeadLetter { reason, detail } = dead;
        let mut props = BasicProperties::default()
            .with_headers(headers::dead_headers(
                delivery.properties.headers().as_ref(),
                reason.as_str(),
                &detail,
            ))
            .with_timestamp(Utc::now().timestamp().max(0) as u64);
        if let Some(ct) = delivery.properties.content_type() {
            props = props.with_content_type(ct.clone());
        }
        if let Some(job) = job {
            props = props.with_message_id(ShortString::from(job.id.as_ref()));
        } else if let Some(id) = delivery.properties.message_id() {
            props = props.with_message_id(id.clone());
        }
        crate::telemetry::dead(reason.as_str());
        let exchange = &self.dead_exchange;
        let (props, sending) = crate::telemetry::send(exchange, "", job.map(|j| &*j.id), props);
        let published = publisher.publish(exchange, "", &delivery.data, props).await;
        if let Err(e) = &published {
            sending.failed(e);
        }
        drop(sending);
        published?;
        info!(reason = reason.as_str(), detail, "dead-lettered");
        Ok(Outcome::Dead(reason))
    }
}
