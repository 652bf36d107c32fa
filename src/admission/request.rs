//! What an admission asks and answers: the data the quota store
//! ([`crate::store`]) and the pure decision ([`crate::decide`]) share. Types only.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use std::sync::Arc;

use crate::lanes::share::LaneAsk;
use crate::preferences::set::QuietHours;
use crate::quota::policy::{Action, Rate};
use crate::quota::window::Rule;

/// What the store needs to know of a job.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The idempotency key.
    pub id: &'a str,
    /// Opaque recipient (hashed before it reaches Redis).
    pub recipient: &'a str,
    /// The channel: selects the send rate.
    pub channel: &'a str,
    /// The category: selects the policy (unknown ones use `default`).
    pub category: &'a str,
    /// The recipient's zone, for calendar windows.
    pub tz: Tz,
    /// The tenant: the recipient is counted apart from the same recipient of
    /// another tenant, and the tenant's overrides apply. `None`: no tenant.
    pub tenant: Option<&'a str>,
    /// Its priority (its own, else its policy's): the recipient's quiet hours let
    /// the ones they `allow` through.
    pub priority: quota_worker_producer::Priority,
    /// An escalation's step (module `crate::fallback`): the notification is
    /// counted already by the policy and caps that span channels, so it is
    /// counted and held by those of its channel alone (its policy's rules then
    /// only when they count per channel).
    pub counted: bool,
    /// Who sends it: limits with `per = "sender"` keep a bucket per sender.
    /// `None`: no sender (such limits do not hold it).
    pub sender: Option<&'a str>,
    /// What it takes of the limits it meets (1 to 100); `None`: its channel's
    /// `cost`.
    pub cost: Option<u64>,
}

/// How the admission (`QuotaStore::admit_with`) takes the channel's rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RateStep {
    /// Take it; when it refuses, wait for it here (in the lane, when given).
    Wait(Option<LaneAsk>),
    /// Take it; when it refuses, give the recipient's reservation back and answer
    /// `None`: the job is parked in its lane.
    Park(Option<LaneAsk>),
    /// Already taken (the TAT the take left): only the recipient is asked.
    Taken(i64),
}

/// A granted admission: what [`QuotaStore::commit`] or [`QuotaStore::release`] needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub(crate) key: String,
    pub(crate) member: Box<[u8]>,
    /// Redis time of the admission.
    pub admitted_at: DateTime<Utc>,
    pub(crate) channel: String,
    /// The sorted sets of the caps it was counted toward (same slot as `key`);
    /// `None` for none. (Thin boxes: at 128 bytes a ticket moves through the
    /// commit queue without a `memcpy` call, BENCHMARKS.md item 31.)
    #[allow(clippy::box_collection)] // a thin box on purpose: see above
    pub(crate) layer_keys: Option<Box<Vec<String>>>,
    /// The channel's rate and the TAT its take left, when the channel is paced.
    pub(crate) rate: Option<(Rate, i64)>,
    /// What it took from the limits it meets (`None`: none), given back with its
    /// reservation when it is released or parked instead of sent.
    #[allow(clippy::box_collection)] // a thin box on purpose, as `layer_keys`
    pub(crate) limits: Option<Box<Vec<crate::quota::limits::Take>>>,
    /// It took over this job's own reservation from an earlier attempt that never
    /// confirmed (a worker killed, a dispatch unconfirmed), whose dispatch may have
    /// gone out: given back, it keeps the reservation rather than free the
    /// recipient's slot for another job.
    pub(crate) inherited: bool,
}

#[cfg(test)]
impl Ticket {
    /// A ticket for pure tests of what is done with one.
    pub(crate) fn for_tests(admitted_at: DateTime<Utc>) -> Ticket {
        Ticket {
            key: "k".into(),
            member: Box::new([1]),
            admitted_at,
            channel: "sms".into(),
            layer_keys: None,
            rate: None,
            limits: None,
            inherited: false,
        }
    }
}

/// The store's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Every rule passed and the channel's rate allowed it: dispatch now, then commit.
    Admitted(Ticket),
    /// A shadow policy's caps would have refused it; its send is recorded as
    /// admitted all the same (dispatch now, then commit). The fields say what
    /// enforcing the policy would have done.
    Shadowed {
        /// The admission, as for [`Admission::Admitted`].
        ticket: Ticket,
        /// The first instant at which every rule passes; `None`: never.
        retry_at: Option<DateTime<Utc>>,
        /// The policy's action for refused jobs.
        action: Action,
        /// A rule that is full now.
        rule: Option<Rule>,
        /// How many other sends of the recipient it saw remembered.
        seen: usize,
    },
    /// A recipient cap refused it.
    Refused {
        /// The first instant at which every rule passes; `None`: never (a limit of 0).
        retry_at: Option<DateTime<Utc>>,
        /// The policy's action for refused jobs.
        action: Action,
        /// The policy that refused it.
        policy: String,
        /// A rule that is full now, for the logs.
        rule: Option<Rule>,
        /// How many sends of the recipient it saw remembered.
        seen: usize,
        /// Its recipient's quiet hours, when they do not allow it (outside them
        /// now): the instant it waits for is pushed past them too.
        quiet: Option<Arc<QuietHours>>,
        /// Whether a rule or cap that refuses it spans channels (then it holds the
        /// notification on every channel: a fallback waits as well).
        spanning: bool,
    },
    /// A cap refused it (the layer whose own next allowed instant is the latest of
    /// all the job's layers).
    Capped {
        /// The first instant at which its policy and every cap it meets pass;
        /// `None`: never (a limit of 0).
        retry_at: Option<DateTime<Utc>>,
        /// The job's policy's action for refused jobs.
        action: Action,
        /// The job's policy's name.
        policy: String,
        /// The cap that holds it.
        cap: String,
        /// A rule of that cap that is full now.
        rule: Option<Rule>,
        /// How many sends that cap remembers.
        seen: usize,
        /// Its recipient's quiet hours, as for [`Admission::Refused`].
        quiet: Option<Arc<QuietHours>>,
        /// Whether a rule or cap that refuses it spans channels, as for
        /// [`Admission::Refused`].
        spanning: bool,
    },
    /// A limit (`[limits.NAME]`) it meets refused it; nothing was recorded or
    /// taken anywhere.
    Limited {
        /// The instant at which every limit that refused it allows it (the
        /// latest); `None`: never (its cost is above a limit's burst).
        retry_at: Option<DateTime<Utc>>,
        /// The limit that allows last, as `x-notify-held-by` names it.
        limit: String,
        /// Whether that is a quota (a cap with `scope = "tenant"` or `"sender"`):
        /// then the job's policy's `action` says whether it waits for the next
        /// period or is dead-lettered `quota_exceeded`.
        quota: bool,
    },
    /// This job was already dispatched.
    Duplicate,
    /// Its recipient is suppressed on its channel by a kind its policy is held by.
    Suppressed(crate::quota::suppression::Suppression),
    /// Its recipient opted out of its category, its channel or the pair (their
    /// preferences), and its policy is not required.
    OptedOut(crate::preferences::set::OptOut),
    /// Its recipient's quiet hours hold it until `until` (nothing was recorded).
    Quiet {
        /// Where the quiet hours end.
        until: DateTime<Utc>,
        /// The quiet hours (an instant their end gives that send windows push
        /// further is pushed past them again).
        hours: Arc<QuietHours>,
    },
    /// Another worker holds a live reservation for this job (it is being dispatched);
    /// look again at `retry_at`, when that reservation would lapse.
    Reserved {
        /// When the reservation lapses.
        retry_at: DateTime<Utc>,
    },
}
