//! What an answer of `src/admission/lua/` admits: the admission a settled [`Verdict`] is,
//! for the job that was asked ([`Asked`]). Pure: the calls that settle the answer
//! (quiet hours, another day's plan) are made before, in `admit.rs`.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::command::LimitArgs;
use super::layers::{layered_refusal, JobLayer};
use super::protocol::Verdict;
use crate::admission::{Admission, Request, Ticket};
use crate::preferences::set::{OptOut, QuietHours};
use crate::quota::limits::{Limit, Take};
use crate::quota::policy::{Policy, Rate, Scope};
use crate::quota::window;

/// A job's admission as asked of `src/admission/lua/`: its policy (of its channel alone
/// for an escalation), its recipient's key and member, the caps it is counted
/// toward.
pub(super) struct Asked {
    pub(super) policy: Arc<Policy>,
    pub(super) key: String,
    pub(super) member: Vec<u8>,
    pub(super) layers: Vec<JobLayer>,
    /// The limits it meets, as the script takes them, and the same limits as
    /// read (in the same order).
    pub(super) limits: Vec<LimitArgs>,
    pub(super) limited: Vec<Arc<Limit>>,
}

/// A job whose cost a limit it meets, or its channel's rate (`rate`, as the job
/// takes it), can never admit (its cost is above the burst): refused for good
/// before anything is asked.
pub(super) fn cost_never_admitted(
    a: &Asked,
    channel: &str,
    rate: Option<Rate>,
) -> Option<Admission> {
    if let Some(r) = rate.filter(|r| r.cost > r.burst) {
        return Some(Admission::Limited {
            quota: false,
            retry_at: None,
            limit: format!(
                "channel `{channel}`'s rate (burst {}), which a cost of {} never passes",
                r.burst, r.cost
            ),
        });
    }
    let (limit, args) =
        a.limited
            .iter()
            .zip(&a.limits)
            .find(|(l, args)| match args.interval_us {
                // a counter (a quota, or a limit's warm-up day): never only at 0
                0 => args.burst == 0,
                _ => !l.admits_cost(args.cost),
            })?;
    Some(Admission::Limited {
        quota: limit.quota.is_some(),
        retry_at: None,
        limit: format!("{limit}, which a cost of {} never passes", args.cost),
    })
}

/// What an admission took from its limits: the TATs its takes left (worked out
/// by `command::Numbering::replay`), in the order of its limits (`None`: none).
#[allow(clippy::box_collection)] // the ticket's thin box
fn takes(limits: &[LimitArgs], tats: Vec<i64>) -> Option<Box<Vec<Take>>> {
    let takes: Vec<Take> = limits
        .iter()
        .zip(tats)
        .map(|(l, tat_us)| Take {
            key: l.key.clone(),
            interval_us: l.interval_us,
            cost: l.cost,
            tat_us,
        })
        .collect();
    (!takes.is_empty()).then(|| Box::new(takes))
}

/// The end of quiet hours that hold a job, and what they are.
pub(super) type QuietUntil = Option<(DateTime<Utc>, Arc<QuietHours>)>;

/// The admission `reply` is for the job `a` asked: `quiet`, the recipient's quiet
/// hours that a refusal's instant is pushed past; `rate`, the channel's rate and
/// the TAT its take left, when taken; `lease_ms`, a reservation's lease. Quiet
/// hours that hold the job are settled by the caller; any answer it cannot act on
/// comes back as it is (an error, retried, never a decision).
pub(super) fn admission(
    req: &Request<'_>,
    a: Asked,
    reply: Verdict,
    quiet: Option<Arc<QuietHours>>,
    rate: Option<(Rate, i64)>,
    lease_ms: i64,
) -> Result<Admission, Verdict> {
    let Asked {
        policy,
        key,
        member,
        layers,
        limits,
        limited,
    } = a;
    let takes = |tats: Vec<i64>| takes(&limits, tats);
    let layer_keys =
        || (!layers.is_empty()).then(|| Box::new(layers.iter().map(|l| l.key.clone()).collect()));
    let ticket = |at: DateTime<Utc>, inherited: bool, tats: Vec<i64>| Ticket {
        key,
        member: member.into_boxed_slice(),
        admitted_at: at,
        channel: req.channel.to_string(),
        layer_keys: layer_keys(),
        rate,
        limits: takes(tats),
        inherited,
    };
    Ok(match reply {
        Verdict::Admitted(now, inherited, tats) => {
            Admission::Admitted(ticket(window::from_millis(now), inherited, tats))
        }
        Verdict::Layered(now, blocks, _) => {
            layered_refusal(&policy, &layers, req.tz, now, blocks, quiet)
        }
        Verdict::Refused(now, sends, _) => refused(req, &policy, now, &sends, quiet),
        Verdict::Shadowed(now, sends, inherited, tats) => {
            let sends: Vec<DateTime<Utc>> = sends.into_iter().map(window::from_millis).collect();
            let at = window::from_millis(now);
            let refusal = window::refusal(&policy.rules, req.tz, at, &sends);
            Admission::Shadowed {
                ticket: ticket(at, inherited, tats),
                retry_at: refusal.retry_at,
                action: policy.action,
                rule: refusal.rule,
                seen: sends.len(),
            }
        }
        Verdict::Limited(now, at, which) => return limited_until(&limited, now, at, which),
        Verdict::Duplicate(_) => Admission::Duplicate,
        Verdict::Suppressed(_, s) => Admission::Suppressed(s),
        Verdict::OptedOut(_, what) => match OptOut::from_code(what) {
            Some(what) => {
                metrics::counter!(crate::metrics::PREFERENCE_TOTAL, "outcome" => "opted_out")
                    .increment(1);
                Admission::OptedOut(what)
            }
            None => return Err(reply),
        },
        Verdict::Reserved(_, reserved_at) => Admission::Reserved {
            retry_at: window::from_millis(reserved_at + lease_ms),
        },
        // quiet hours that hold it are the caller's; still outside the planned day
        // after three plans; a wrong type (never here: the call turns it into an
        // error); a key on another node
        Verdict::QuietHours(..)
        | Verdict::Replan(_)
        | Verdict::WrongType(_)
        | Verdict::Elsewhere(_) => return Err(reply),
    })
}

/// A refusal by the limit `which` of `limited` (the one that allows last), until
/// `at` (ms); an index the job has no limit at is an answer it cannot act on.
fn limited_until(
    limited: &[Arc<Limit>],
    now: i64,
    at: i64,
    which: usize,
) -> Result<Admission, Verdict> {
    match limited.get(which) {
        Some(limit) => Ok({
            metrics::counter!(crate::metrics::LIMITED_TOTAL, "limit" => limit.name.clone())
                .increment(1);
            Admission::Limited {
                quota: limit.quota.is_some(),
                retry_at: Some(window::from_millis(at)),
                limit: limit.to_string(),
            }
        }),
        None => Err(Verdict::Limited(now, at, which)),
    }
}

/// A refusal by the job's policy: when it may go, and what refused it.
fn refused(
    req: &Request<'_>,
    policy: &Policy,
    now: i64,
    sends: &[i64],
    quiet: Option<Arc<QuietHours>>,
) -> Admission {
    let sends: Vec<DateTime<Utc>> = sends.iter().copied().map(window::from_millis).collect();
    let refusal = window::refusal(&policy.rules, req.tz, window::from_millis(now), &sends);
    Admission::Refused {
        retry_at: refusal.retry_at,
        action: policy.action,
        policy: policy.name.clone(),
        rule: refusal.rule,
        seen: sends.len(),
        quiet,
        spanning: policy.scope != Scope::Channel,
    }
}
