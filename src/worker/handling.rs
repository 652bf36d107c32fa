//! What each part of a delivery's handling reads: the job's past ([`Seen`]), the
//! delivery with its job, rules and policy ([`Handling`]), where a routed job
//! stands on its route ([`Route`], [`RouteAt`]), what the store is asked of it
//! ([`request`]), and how its decision ends ([`Decided`]).

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::FieldTable;

use super::link::BrokerLink;
use crate::admission::Request;
use crate::decide::Decision;
use crate::fallback;
use crate::job::decode::Job;
use crate::job::{headers, Outcome};
use crate::metrics::JobLabels;
use crate::quota::policy::Policy;
use crate::rules::Rules;

/// What the worker knows of a job's past: the times it was handled before, when a
/// worker first saw it, and its policy's name.
pub(super) struct Seen<'a> {
    pub(super) attempt: u64,
    pub(super) first_seen: DateTime<Utc>,
    pub(super) policy: &'a str,
}

impl<'a> Seen<'a> {
    /// From the delivery's headers (a job never handled before: first seen `now`).
    pub(super) fn of(
        headers: Option<&FieldTable>,
        now: DateTime<Utc>,
        policy: &'a str,
    ) -> Seen<'a> {
        let (attempt, first_seen) = headers::attempt_info(headers);
        Seen {
            attempt,
            first_seen: first_seen.map_or(now, crate::quota::window::from_millis),
            policy,
        }
    }
}

/// A routed job's step: where it is on its route, and itself on that step's channel.
pub(super) type Route<'j> = (fallback::Routed, Job<'j>);

/// One delivery being handled: what each part of its handling reads.
pub(super) struct Handling<'h, 'j> {
    pub(super) s: &'h BrokerLink,
    pub(super) delivery: &'h Delivery,
    pub(super) job: &'h Job<'j>,
    pub(super) seen: &'h Seen<'h>,
    pub(super) rules: &'h Rules,
    pub(super) policy: &'h Policy,
    pub(super) labels: JobLabels,
    /// The cancel and erase marks' generation when its handling began
    /// ([`super::cancels::Cancels::generation`]): the marks it was first checked
    /// against, or newer ones.
    pub(super) marks: i64,
}

/// Where a job stands on its route when it comes in.
pub(super) struct RouteAt {
    /// The step it resumes at (0: its own channel).
    pub(super) step: usize,
    /// Why it left the step before.
    pub(super) left: Option<String>,
    /// Whether it is an escalation (its notification counted already).
    pub(super) escalation: bool,
}

/// How the decision ends: a decision to carry out (with the job's route, for a job
/// with `fallback`), or an outcome settled and counted already (folded into a
/// digest, parked in its lane).
pub(super) enum Decided<'j> {
    Carry(Decision, Option<Box<Route<'j>>>),
    Settled(Outcome),
}

/// What the store is asked for `job` of `policy` on `channel` (its own, or a step
/// of its route); `counted`: an escalation, its notification counted already where
/// caps span channels.
pub(super) fn request<'r>(
    job: &'r Job<'_>,
    channel: &'r str,
    policy: &Policy,
    counted: bool,
) -> Request<'r> {
    Request {
        id: &job.id,
        recipient: &job.recipient,
        channel,
        category: &job.category,
        tz: job.tz,
        tenant: job.tenant.as_deref(),
        priority: job.priority.unwrap_or(policy.priority),
        counted,
        sender: job.sender.as_deref(),
        cost: job.cost,
    }
}
