//! Step three of a decision: the store's answer for a job turned into a
//! [`Decision`]. Pure: no I/O.

use chrono::{DateTime, Utc};

use crate::admission::{Admission, Ticket};
use crate::decide::{
    dead, describe, open_and_not_quiet, wait, Context, DeadLetter, Decision, DelayCause,
};
use crate::job::decode::Job;
use crate::job::Reason;
use crate::preferences::set::QuietHours;
use crate::quota::caps::Cap;
use crate::quota::policy::Action;
use crate::quota::window::Rule;

/// The store's answer for `job`, at `now` (Redis time, after the admission).
pub(crate) fn after_admission(
    job: &Job<'_>,
    cx: &Context<'_>,
    admission: Admission,
    now: DateTime<Utc>,
) -> Decision {
    match admission {
        Admission::Admitted(ticket) | Admission::Shadowed { ticket, .. } => {
            admitted(ticket, job.expires_at, now)
        }
        Admission::Refused {
            retry_at,
            action,
            policy,
            rule,
            seen,
            quiet,
            ..
        } => refused(job, cx, Refusal { retry_at, action, by: By::Policy(policy), rule, seen, quiet }),
        Admission::Capped {
            retry_at,
            action,
            policy,
            cap,
            rule,
            seen,
            quiet,
            ..
        } => refused(job, cx, Refusal { retry_at, action, by: By::Cap { policy, cap }, rule, seen, quiet }),
        Admission::Reserved { retry_at } => Decision::Delay {
            until: retry_at,
            cause: DelayCause::Reserved,
        },
        Admission::Limited {
            retry_at,
            limit,
            quota,
        } => limited(job, cx, retry_at, limit, quota),
        Admission::Duplicate => Decision::Duplicate,
        Admission::Quiet { until, hours } => match open_and_not_quiet(job, cx, until, Some(&hours)) {
            Ok((at, _)) => wait(job, cx, at, DelayCause::QuietHours, false),
            Err(never) => Decision::Dead(never),
        },
        Admission::OptedOut(what) => dead(
            Reason::OptedOut,
            what.describe(&job.category, &job.channel),
        ),
        Admission::Suppressed(s) => dead(
            Reason::Suppressed,
            format!(
                "its recipient is suppressed on channel `{}` by `{}` since {}{}, and policy `{}` is held by it",
                job.channel,
                s.kind,
                s.since.to_rfc3339(),
                s.until.map(|u| format!(" until {}", u.to_rfc3339())).unwrap_or_default(),
                cx.policy.name
            ),
        ),
    }
}

/// An admitted job: dispatched, unless it expired while it waited for the rate.
fn admitted(ticket: Ticket, expires: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Decision {
    match expires {
        Some(exp) if exp <= now => Decision::ReleaseThenDead(
            ticket,
            DeadLetter {
                reason: Reason::Expired,
                detail: format!(
                    "it expired at {} while waiting for the channel's send rate",
                    exp.to_rfc3339()
                ),
            },
        ),
        _ => Decision::Dispatch(ticket),
    }
}

/// A job a limit refused: it waits for the instant every limit allows it (its
/// windows open), or is dead when no instant ever will (its cost is above a
/// limit's burst).
fn limited(
    job: &Job<'_>,
    cx: &Context<'_>,
    retry_at: Option<DateTime<Utc>>,
    limit: String,
    quota: bool,
) -> Decision {
    let Some(at) = retry_at else {
        return dead(Reason::Capped, format!("{limit} can never admit it"));
    };
    if quota && cx.policy.action == Action::Drop {
        return dead(
            Reason::QuotaExceeded,
            format!("{limit} is used up until {}", at.to_rfc3339()),
        );
    }
    match open_and_not_quiet(job, cx, at, None) {
        Ok((until, _)) => wait(job, cx, until, DelayCause::Limited { limit }, false),
        Err(never) => Decision::Dead(never),
    }
}

/// What refused a job: its policy, or a cap (with the job's policy).
enum By {
    Policy(String),
    Cap { policy: String, cap: String },
}

/// A refusal by a policy or a cap, as the store gave it.
struct Refusal {
    retry_at: Option<DateTime<Utc>>,
    action: Action,
    by: By,
    rule: Option<Rule>,
    seen: usize,
    quiet: Option<std::sync::Arc<QuietHours>>,
}

/// A refused job: dead when nothing will ever admit it or its policy drops refused
/// jobs, else it waits for the first instant every rule passes (its windows open,
/// past its recipient's quiet hours).
fn refused(job: &Job<'_>, cx: &Context<'_>, r: Refusal) -> Decision {
    let Some(at) = r.retry_at else {
        let detail = match &r.by {
            By::Policy(policy) => format!(
                "policy `{policy}` can never admit it ({})",
                describe(r.rule)
            ),
            By::Cap { cap, .. } => format!("{} can never admit it", Cap::describe(cap, r.rule)),
        };
        return dead(Reason::Capped, detail);
    };
    if r.action == Action::Drop {
        let detail = match &r.by {
            By::Policy(policy) => format!(
                "policy `{policy}` refused it ({}) and drops refused jobs; next allowed {}",
                describe(r.rule),
                at.to_rfc3339()
            ),
            By::Cap { policy, cap } => format!(
                "{} refused it, and policy `{policy}` drops refused jobs; next allowed {}",
                Cap::describe(cap, r.rule),
                at.to_rfc3339()
            ),
        };
        return dead(Reason::Capped, detail);
    }
    match open_and_not_quiet(job, cx, at, r.quiet.as_deref()) {
        Ok((until, quiet)) => {
            let (rule, seen) = (r.rule, r.seen);
            let cause = match r.by {
                By::Policy(policy) => DelayCause::Cap {
                    policy,
                    rule,
                    seen,
                    quiet,
                },
                By::Cap { cap, .. } => DelayCause::Capped {
                    cap,
                    rule,
                    seen,
                    quiet,
                },
            };
            wait(job, cx, until, cause, false)
        }
        Err(never) => Decision::Dead(never),
    }
}
