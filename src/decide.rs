//! Decide: what becomes of one job, as data. Pure: no I/O; "now" is a parameter.
//!
//! Three steps, around the one question only Redis answers. [`triage`] looks at the
//! job alone (a channel that is not configured, already expired; a body that is not
//! a job is [`malformed`]); [`hold`] at the job and its [`Context`] (a `not_before`
//! still ahead, send windows closed now); [`after_admission`] turns the store's
//! [`Admission`] into a [`Decision`], holding a capped job until the first instant
//! at which every cap passes *and* its send windows are open. Every hold is bounded:
//! by the job's `expires_at` (dead `expired`) and by its policy's `max_wait` counted
//! from when a worker first saw it (dead `capped`). The worker then carries the
//! decision out (publish, then commit or release, then ack); when the broker
//! refuses a dispatch, [`retry_refused_dispatch_at`] says when to try again.

use chrono::{DateTime, Duration, Utc};

mod paused;
pub(crate) use paused::paused;

use crate::admission::{Admission, Ticket};
use crate::job::decode::{Job, Malformed};
use crate::job::Reason;
use crate::preferences::set::QuietHours;
use crate::quota::caps::Cap;
use crate::quota::policy::{Action, Mode, Policy};
use crate::quota::send_windows::{self, SendWindows};
use crate::quota::window::Rule;

/// What a decision knows besides the job and the store's answer.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The job's policy (its category's, or `default`).
    pub policy: &'a Policy,
    /// The send windows of the job's channel, if it has any.
    pub channel_windows: Option<&'a SendWindows>,
    /// When a worker first saw the job (its first-seen header; now at its first
    /// handling).
    pub first_seen: DateTime<Utc>,
}

/// What the worker must do with one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Publish to the dispatch exchange, then commit the ticket.
    Dispatch(Ticket),
    /// Hold it in the delay ladder until `until`, then decide again.
    Delay {
        /// When it comes back.
        until: DateTime<Utc>,
        /// What holds it.
        cause: DelayCause,
    },
    /// Already dispatched: ack it, send nothing.
    Duplicate,
    /// A newer job of its recipient with its collapse key replaced it: ack it, send
    /// nothing.
    Superseded {
        /// The newer job's id.
        by: String,
    },
    /// Its recipient was erased after it was first seen: ack it, send nothing.
    Erased,
    /// Publish to the dead-letter queue.
    Dead(DeadLetter),
    /// Give the admission back (it was admitted, but expired while waiting for
    /// its channel's send rate), then dead-letter it.
    ReleaseThenDead(Ticket, DeadLetter),
}

/// Why a job goes to the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeadLetter {
    /// The `x-notify-reason`.
    pub reason: Reason,
    /// The `x-notify-detail`: a sentence that says why.
    pub detail: String,
}

/// What holds a delayed job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DelayCause {
    /// A cap of `policy` (`rule`: one that is full now); its send windows, if any,
    /// are open at the instant it waits for.
    Cap {
        /// The policy's name.
        policy: String,
        /// A rule that refused it.
        rule: Option<Rule>,
        /// How many sends of the recipient it saw remembered.
        seen: usize,
        /// The recipient's quiet hours pushed the instant the caps gave (it waits
        /// for their end, one instant for both).
        quiet: bool,
    },
    /// A cap (`[caps.NAME]`) the job meets: `rule` is one that is full now.
    Capped {
        /// The cap's name.
        cap: String,
        /// A rule that refused it.
        rule: Option<Rule>,
        /// How many sends that cap remembers.
        seen: usize,
        /// As for [`DelayCause::Cap`].
        quiet: bool,
    },
    /// A limit (`[limits.NAME]`) it meets: the text names the limit, its rate and
    /// what it counts per.
    Limited {
        /// The limit as it says itself (`limit `NAME` (1 per second, ...)`).
        limit: String,
    },
    /// Send windows closed now.
    Window {
        /// Whose windows held it last.
        of: WindowsOf,
        /// The policy's or the channel's name.
        name: String,
    },
    /// Its `not_before` is still ahead.
    Schedule,
    /// Another worker holds its reservation; look again when that lapses.
    Reserved,
    /// The broker refused its dispatch; try again later.
    DispatchRefused,
    /// Its recipient's quiet hours (their preferences).
    QuietHours,
    /// Redis lost its data and `redis.on_reset = "pause"` holds the jobs its caps
    /// or its recipient's preferences could stop until `admin resume` ([`paused`]).
    Paused,
}

/// Whose send windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowsOf {
    /// The job's policy's.
    Policy,
    /// The job's channel's.
    Channel,
}

impl DelayCause {
    /// Every label, in the order of [`DelayCause::index`].
    pub(crate) const LABELS: [&'static str; 8] = [
        "cap",
        "window",
        "schedule",
        "in_flight",
        "dispatch_refused",
        "paused",
        "quiet_hours",
        "limit",
    ];

    /// Its index in [`DelayCause::LABELS`].
    pub fn index(&self) -> usize {
        match self {
            DelayCause::Cap { .. } | DelayCause::Capped { .. } => 0,
            DelayCause::Window { .. } => 1,
            DelayCause::Schedule => 2,
            DelayCause::Reserved => 3,
            DelayCause::DispatchRefused => 4,
            DelayCause::Paused => 5,
            DelayCause::QuietHours => 6,
            DelayCause::Limited { .. } => 7,
        }
    }

    /// A short label: `cap`, `window`, `schedule`, `in_flight`, `dispatch_refused`,
    /// `paused`.
    pub fn label(&self) -> &'static str {
        Self::LABELS[self.index()]
    }
}

impl std::fmt::Display for DelayCause {
    /// What holds the job, as the `x-notify-held-by` header and the logs say it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DelayCause::Cap {
                policy,
                rule,
                quiet,
                ..
            } => {
                write!(f, "policy `{policy}` ({})", describe(*rule))?;
                f.write_str(if *quiet { QUIET_TOO } else { "" })
            }
            DelayCause::Capped {
                cap, rule, quiet, ..
            } => {
                f.write_str(&Cap::describe(cap, *rule))?;
                f.write_str(if *quiet { QUIET_TOO } else { "" })
            }
            DelayCause::Limited { limit } => f.write_str(limit),
            DelayCause::Window {
                of: WindowsOf::Policy,
                name,
            } => {
                write!(f, "the send windows of policy `{name}`")
            }
            DelayCause::Window {
                of: WindowsOf::Channel,
                name,
            } => {
                write!(f, "the send windows of channel `{name}`")
            }
            DelayCause::Schedule => f.write_str("its not_before"),
            DelayCause::Reserved => f.write_str("another worker's reservation of it"),
            DelayCause::DispatchRefused => f.write_str("the broker's refusal of its dispatch"),
            DelayCause::QuietHours => f.write_str("the recipient's quiet_hours"),
            DelayCause::Paused => f.write_str(
                "the pause after Redis lost its data (until `quota-worker admin resume`)",
            ),
        }
    }
}

/// What a cap's cause adds when quiet hours pushed its instant.
const QUIET_TOO: &str = " and the recipient's quiet_hours";

pub(crate) fn dead(reason: Reason, detail: String) -> Decision {
    Decision::Dead(DeadLetter { reason, detail })
}

/// A body that is not a job.
pub fn malformed(m: Malformed) -> DeadLetter {
    DeadLetter {
        reason: Reason::Malformed,
        detail: m.0,
    }
}

/// A job an operator cancelled at `at` (`admin job ID cancel`).
pub fn cancelled(at: DateTime<Utc>) -> DeadLetter {
    DeadLetter {
        reason: Reason::Cancelled,
        detail: format!("cancelled by an operator at {}", at.to_rfc3339()),
    }
}

/// The job alone, before Redis is asked: `None` when Redis must decide.
/// `channels`: the configured channels, sorted.
pub(crate) fn triage(job: &Job<'_>, channels: &[String], now: DateTime<Utc>) -> Option<Decision> {
    if channels
        .binary_search_by(|c| c.as_str().cmp(&job.channel))
        .is_err()
    {
        let detail = format!(
            "channel `{}` is not configured (configured: {})",
            job.channel,
            channels.join(", ")
        );
        return Some(dead(Reason::UnknownChannel, detail));
    }
    let exp = job.expires_at.filter(|exp| *exp <= now)?;
    let detail = format!("it expired at {} before it could be sent", exp.to_rfc3339());
    Some(dead(Reason::Expired, detail))
}

/// The job and its context, before Redis is asked: `None` when Redis must decide.
/// Holds a job whose `not_before` is ahead until then, and a job whose send windows
/// are closed `now` until they open (Redis is asked then, so that the caps see the
/// sends recorded in between). A shadow policy's windows hold nothing.
pub fn hold(job: &Job<'_>, cx: &Context<'_>, now: DateTime<Utc>) -> Option<Decision> {
    if let Some(at) = job.not_before.filter(|at| *at > now) {
        return Some(wait(job, cx, at, DelayCause::Schedule, false));
    }
    match windows_open(job, cx, now, false) {
        Ok((_, None)) => None,
        Ok((at, Some(cause))) => Some(wait(job, cx, at, cause, false)),
        Err(never) => Some(Decision::Dead(never)),
    }
}

/// Whether the job's policy holds and dead-letters jobs: enforced, or `as_enforced`
/// (what a shadow policy would have done).
fn enforced(cx: &Context<'_>, as_enforced: bool) -> bool {
    as_enforced || cx.policy.mode == Mode::Enforce
}

/// The first instant at or after `at` at which the send windows that apply to `job`
/// are all open, and what held it when that is later than `at`; a dead letter when
/// they never are open together. A shadow policy's windows count only `as_enforced`.
fn windows_open(
    job: &Job<'_>,
    cx: &Context<'_>,
    at: DateTime<Utc>,
    as_enforced: bool,
) -> Result<(DateTime<Utc>, Option<DelayCause>), DeadLetter> {
    let policy = (cx.policy.send_windows.as_ref()).filter(|_| enforced(cx, as_enforced));
    let channel = cx
        .channel_windows
        .filter(|_| !cx.policy.ignore_channel_windows);
    let (sets, of, n) = match (policy, channel) {
        (None, None) => return Ok((at, None)),
        (Some(p), None) => ([p, p], [WindowsOf::Policy; 2], 1),
        (None, Some(c)) => ([c, c], [WindowsOf::Channel; 2], 1),
        (Some(p), Some(c)) => ([p, c], [WindowsOf::Policy, WindowsOf::Channel], 2),
    };
    match send_windows::next_open(&sets[..n], job.tz, at) {
        Some((t, closed)) => Ok((
            t,
            closed.map(|c| DelayCause::Window {
                of: of[c.by],
                name: match of[c.by] {
                    WindowsOf::Policy => cx.policy.name.clone(),
                    WindowsOf::Channel => job.channel.to_string(),
                },
            }),
        )),
        None => Err(DeadLetter {
            reason: Reason::Capped,
            detail: format!(
                "the send windows of policy `{}` and channel `{}` are never open together",
                cx.policy.name, job.channel
            ),
        }),
    }
}

/// Steps at most in the search for an instant that both the send windows and the
/// recipient's quiet hours allow (each step moves past one of them).
const QUIET_STEPS: usize = 16;

/// The first instant at or after `at` at which the send windows that apply to
/// `job` are open and its recipient's `quiet` hours (if any) are over: each pushes
/// the other until neither moves it (quiet hours that end inside a closed window,
/// a window that opens inside quiet hours), in at most [`QUIET_STEPS`] steps, after
/// which the last instant is taken (the job is decided again there, so it is never
/// sent inside either). `true` when the quiet hours moved it. A cap that allows a
/// send at `at` allows it later too, so this is also the first instant its caps,
/// its send windows and the quiet hours all allow.
pub(crate) fn open_and_not_quiet(
    job: &Job<'_>,
    cx: &Context<'_>,
    at: DateTime<Utc>,
    quiet: Option<&QuietHours>,
) -> Result<(DateTime<Utc>, bool), DeadLetter> {
    let mut t = at;
    let mut moved = false;
    for _ in 0..QUIET_STEPS {
        let (open, _) = windows_open(job, cx, t, false)?;
        let Some(end) = quiet.map(|q| q.end(job.tz, open)).filter(|e| *e > open) else {
            return Ok((open, moved));
        };
        moved = true;
        t = end;
    }
    Ok((t, moved))
}

/// Hold `job` until `until` for `cause`, unless it expires first or would wait
/// longer than its policy's `max_wait` (a schedule the producer asked for is not
/// bounded by it; nor is any wait by a shadow policy's, unless `as_enforced`).
pub(crate) fn wait(
    job: &Job<'_>,
    cx: &Context<'_>,
    until: DateTime<Utc>,
    cause: DelayCause,
    as_enforced: bool,
) -> Decision {
    if let Some(exp) = job.expires_at.filter(|exp| until > *exp) {
        let detail = format!(
            "{cause} allows it next at {}, after it expires at {}",
            until.to_rfc3339(),
            exp.to_rfc3339()
        );
        return dead(Reason::Expired, detail);
    }
    let bounded =
        !matches!(cause, DelayCause::Schedule | DelayCause::Reserved) && enforced(cx, as_enforced);
    if let Some(max) = cx
        .policy
        .max_wait
        .filter(|m| bounded && until - cx.first_seen > *m)
    {
        let detail = format!(
            "{cause} allows it next at {}, more than policy `{}`'s max_wait of {} after it was first seen at {}",
            until.to_rfc3339(),
            cx.policy.name,
            crate::quota::window::Window::Rolling(max),
            cx.first_seen.to_rfc3339()
        );
        return dead(Reason::Capped, detail);
    }
    Decision::Delay { until, cause }
}

/// What a shadow policy would have done with a job it let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ShadowVerdict {
    /// Sent: its caps and windows allow it now.
    Allowed,
    /// Held by its caps (until they, and its windows, allow it).
    HeldCap,
    /// Held by its send windows.
    HeldWindow,
    /// Dead-lettered `capped`: refused with `action = "drop"`, never allowed, or
    /// allowed only after its `max_wait`.
    Dead,
}

impl ShadowVerdict {
    /// The `verdict` label: `allowed`, `held_cap`, `held_window`, `dead`.
    pub fn label(self) -> &'static str {
        match self {
            ShadowVerdict::Allowed => "allowed",
            ShadowVerdict::HeldCap => "held_cap",
            ShadowVerdict::HeldWindow => "held_window",
            ShadowVerdict::Dead => "dead",
        }
    }
}

/// For a job of a shadow policy, what enforcing that policy would have done, given
/// the store's answer at `now`: its windows first (as [`hold`] checks them before
/// Redis), then its caps as [`after_admission`] would have held or dead-lettered it. `None`
/// for an enforced policy, and for answers that carry no verdict (a duplicate,
/// another worker's reservation). The channel's own windows and rate are enforced
/// whatever the policy's mode, so they are not part of the verdict.
pub fn shadow(
    job: &Job<'_>,
    cx: &Context<'_>,
    admission: &Admission,
    now: DateTime<Utc>,
) -> Option<ShadowVerdict> {
    if cx.policy.mode != Mode::Shadow {
        return None;
    }
    let held = |d: Decision| match d {
        Decision::Delay { .. } => ShadowVerdict::HeldCap,
        _ => ShadowVerdict::Dead,
    };
    let policy_only = Context {
        channel_windows: None,
        ..*cx
    };
    match admission {
        Admission::Admitted(_) | Admission::Shadowed { .. } => {}
        _ => return None,
    }
    if let Ok((_, Some(_))) = windows_open(job, &policy_only, now, true) {
        return Some(ShadowVerdict::HeldWindow);
    }
    Some(match admission {
        Admission::Shadowed {
            retry_at: Some(at),
            action: Action::Delay,
            rule,
            seen,
            ..
        } => match windows_open(job, &policy_only, *at, true) {
            Ok((until, _)) => {
                let cause = DelayCause::Cap {
                    policy: cx.policy.name.clone(),
                    rule: *rule,
                    seen: *seen,
                    quiet: false,
                };
                held(wait(job, cx, until, cause, true))
            }
            Err(_) => ShadowVerdict::Dead,
        },
        Admission::Shadowed { .. } => ShadowVerdict::Dead,
        _ => ShadowVerdict::Allowed,
    })
}

/// The broker refused the dispatch of a job handled `attempt` times before: when to
/// try again (it waits in the delay ladder until then): after 5 s, doubling with
/// each attempt, at most 5 minutes.
pub(crate) fn retry_refused_dispatch_at(attempt: u64, now: DateTime<Utc>) -> DateTime<Utc> {
    now + Duration::seconds(5i64 << attempt.min(6)).min(Duration::minutes(5))
}

pub(crate) fn describe(rule: Option<Rule>) -> String {
    match rule {
        Some(r) => format!("at most {} per {}", r.limit, r.window),
        None => "no rule passes".into(),
    }
}

#[cfg(test)]
pub(crate) mod tests;
