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
pub use paused::{paused, PAUSED_HOLD};

use crate::admission::{Admission, Ticket};
use crate::job::decode::{Job, Malformed};
use crate::job::Reason;
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
pub enum Decision {
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
    /// Publish to the dead-letter queue.
    Dead(DeadLetter),
    /// Give the admission back (it was admitted, but expired while waiting for
    /// its channel's send rate), then dead-letter it.
    ReleaseThenDead(Ticket, DeadLetter),
}

/// Why a job goes to the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
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
    /// Redis lost its data and `redis.on_reset = "pause"` holds the jobs of
    /// policies with rules until `admin resume` ([`paused`]).
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
    pub const LABELS: [&'static str; 6] = [
        "cap",
        "window",
        "schedule",
        "in_flight",
        "dispatch_refused",
        "paused",
    ];

    /// Its index in [`DelayCause::LABELS`].
    pub fn index(&self) -> usize {
        match self {
            DelayCause::Cap { .. } => 0,
            DelayCause::Window { .. } => 1,
            DelayCause::Schedule => 2,
            DelayCause::Reserved => 3,
            DelayCause::DispatchRefused => 4,
            DelayCause::Paused => 5,
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
            DelayCause::Cap { policy, rule, .. } => {
                write!(f, "policy `{policy}` ({})", describe(*rule))
            }
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
            DelayCause::Paused => f.write_str(
                "the pause after Redis lost its data (until `quota-worker admin resume`)",
            ),
        }
    }
}

fn dead(reason: Reason, detail: String) -> Decision {
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
pub fn triage(job: &Job<'_>, channels: &[String], now: DateTime<Utc>) -> Option<Decision> {
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

/// Hold `job` until `until` for `cause`, unless it expires first or would wait
/// longer than its policy's `max_wait` (a schedule the producer asked for is not
/// bounded by it; nor is any wait by a shadow policy's, unless `as_enforced`).
fn wait(
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

/// The store's answer for `job`, at `now` (Redis time, after the admission).
pub fn after_admission(
    job: &Job<'_>,
    cx: &Context<'_>,
    admission: Admission,
    now: DateTime<Utc>,
) -> Decision {
    let expires = job.expires_at;
    match admission {
        Admission::Admitted(ticket) | Admission::Shadowed { ticket, .. } => match expires {
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
        },
        Admission::Refused {
            retry_at: None,
            policy,
            rule,
            ..
        } => dead(
            Reason::Capped,
            format!("policy `{policy}` can never admit it ({})", describe(rule)),
        ),
        Admission::Refused {
            action: Action::Drop,
            policy,
            rule,
            retry_at,
            ..
        } => dead(
            Reason::Capped,
            format!(
                "policy `{policy}` refused it ({}) and drops refused jobs; next allowed {}",
                describe(rule),
                retry_at.map(|t| t.to_rfc3339()).unwrap_or_default()
            ),
        ),
        Admission::Refused {
            retry_at: Some(at),
            policy,
            rule,
            seen,
            ..
        } => match windows_open(job, cx, at, false) {
            Ok((until, _)) => {
                let cause = DelayCause::Cap { policy, rule, seen };
                wait(job, cx, until, cause, false)
            }
            Err(never) => Decision::Dead(never),
        },
        Admission::Reserved { retry_at } => Decision::Delay {
            until: retry_at,
            cause: DelayCause::Reserved,
        },
        Admission::Duplicate => Decision::Duplicate,
    }
}

/// What a shadow policy would have done with a job it let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShadowVerdict {
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

    /// Every verdict, in label order.
    pub const ALL: [ShadowVerdict; 4] = [
        ShadowVerdict::Allowed,
        ShadowVerdict::HeldCap,
        ShadowVerdict::HeldWindow,
        ShadowVerdict::Dead,
    ];
}

/// For a job of a shadow policy, what enforcing that policy would have done, given
/// the store's answer at `now`: its windows first (as [`hold`] checks them before
/// Redis), then its caps as [`decide`] would have held or dead-lettered it. `None`
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
pub fn retry_refused_dispatch_at(attempt: u64, now: DateTime<Utc>) -> DateTime<Utc> {
    now + Duration::seconds(5i64 << attempt.min(6)).min(Duration::minutes(5))
}

fn describe(rule: Option<Rule>) -> String {
    match rule {
        Some(r) => format!("at most {} per {}", r.limit, r.window),
        None => "no rule passes".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::window::Window;
    use chrono::TimeZone;
    use chrono_tz::Tz;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 1, h, m, 0).unwrap()
    }

    fn job(expires_at: Option<DateTime<Utc>>) -> Job<'static> {
        Job {
            id: "j1".into(),
            recipient: "r".into(),
            channel: "sms".into(),
            category: "default".into(),
            tz: Tz::UTC,
            expires_at,
            not_before: None,
            collapse_key: None,
        }
    }

    fn policy() -> Policy {
        Policy {
            name: "default".into(),
            rules: daily().into_iter().collect(),
            scope: Default::default(),
            action: Action::Delay,
            send_windows: None,
            ignore_channel_windows: false,
            max_wait: None,
            mode: Mode::Enforce,
        }
    }

    fn cx(policy: &Policy) -> Context<'_> {
        Context {
            policy,
            channel_windows: None,
            first_seen: at(10, 0),
        }
    }

    fn windows(text: &[&str]) -> SendWindows {
        SendWindows::new(text.iter().map(|o| o.parse().unwrap()).collect())
    }

    fn daily() -> Option<Rule> {
        Some(Rule {
            limit: 1,
            window: Window::CalendarDays(1),
        })
    }

    fn refused(retry_at: Option<DateTime<Utc>>, action: Action) -> Admission {
        Admission::Refused {
            retry_at,
            action,
            policy: "default".into(),
            rule: daily(),
            seen: 1,
        }
    }

    fn reason(d: &Decision) -> Option<Reason> {
        match d {
            Decision::Dead(d) | Decision::ReleaseThenDead(_, d) => Some(d.reason),
            _ => None,
        }
    }

    #[test]
    fn each_admission_leads_to_its_decision() {
        let ticket = Ticket::for_tests(at(10, 0));
        let now = at(10, 0);
        let cap = DelayCause::Cap {
            policy: "default".into(),
            rule: daily(),
            seen: 1,
        };
        #[rustfmt::skip]
        let table: Vec<(Option<DateTime<Utc>>, Admission, Decision)> = vec![
            // admitted: dispatch, unless it expired while its channel paced it
            (None, Admission::Admitted(ticket.clone()), Decision::Dispatch(ticket.clone())),
            (Some(at(11, 0)), Admission::Admitted(ticket.clone()), Decision::Dispatch(ticket.clone())),
            (Some(at(10, 0)), Admission::Admitted(ticket.clone()), Decision::ReleaseThenDead(
                ticket.clone(), DeadLetter { reason: Reason::Expired,
                detail: "it expired at 2026-03-01T10:00:00+00:00 while waiting for the channel's send rate".into() })),
            // refused by a cap: wait for the retry time, unless it expires first
            (None, refused(Some(at(23, 0)), Action::Delay), Decision::Delay { until: at(23, 0), cause: cap.clone() }),
            (Some(at(23, 0)), refused(Some(at(23, 0)), Action::Delay), Decision::Delay { until: at(23, 0), cause: cap.clone() }),
            (Some(at(22, 59)), refused(Some(at(23, 0)), Action::Delay), dead(Reason::Expired,
                "policy `default` (at most 1 per 1d) allows it next at 2026-03-01T23:00:00+00:00, after it expires at 2026-03-01T22:59:00+00:00".into())),
            // refused for good, or by a policy that drops
            (None, refused(None, Action::Delay), dead(Reason::Capped, "policy `default` can never admit it (at most 1 per 1d)".into())),
            (None, refused(Some(at(23, 0)), Action::Drop), dead(Reason::Capped,
                "policy `default` refused it (at most 1 per 1d) and drops refused jobs; next allowed 2026-03-01T23:00:00+00:00".into())),
            // another worker's reservation; a duplicate
            (None, Admission::Reserved { retry_at: at(10, 2) }, Decision::Delay { until: at(10, 2), cause: DelayCause::Reserved }),
            (Some(at(9, 0)), Admission::Duplicate, Decision::Duplicate),
        ];
        for (expires, admission, expected) in table {
            let shown = format!("{admission:?} expiring {expires:?}");
            let p = policy();
            assert_eq!(
                after_admission(&job(expires), &cx(&p), admission, now),
                expected,
                "{shown}"
            );
        }
    }

    #[test]
    fn triage_catches_what_needs_no_redis() {
        let channels = vec!["email".to_string(), "sms".to_string()];
        let now = at(10, 0);
        let with = |channel: &'static str, expires_at| Job {
            channel: channel.into(),
            ..job(expires_at)
        };
        assert_eq!(triage(&with("sms", None), &channels, now), None);
        assert_eq!(
            triage(&with("email", Some(at(10, 1))), &channels, now),
            None
        );
        assert_eq!(
            triage(&with("fax", None), &channels, now),
            Some(dead(
                Reason::UnknownChannel,
                "channel `fax` is not configured (configured: email, sms)".into()
            ))
        );
        let expired = triage(&with("sms", Some(now)), &channels, now);
        assert_eq!(expired.as_ref().and_then(reason), Some(Reason::Expired));
        let m = malformed(Malformed("the field `id` is missing".into()));
        assert_eq!(m.reason, Reason::Malformed);
    }

    #[test]
    fn holds_for_schedules_and_windows_bounded_by_expiry_and_max_wait() {
        // 2026-03-01 is a Sunday
        let now = at(10, 0);
        let weekdays = windows(&["mon-fri 08:00-21:00"]);
        let sundays = windows(&["sun 09:00-12:00"]);
        let mut p = policy();
        let plain = cx(&p);
        let held = |until, cause| Some(Decision::Delay { until, cause });
        let window = |of, name: &str| DelayCause::Window {
            of,
            name: name.into(),
        };
        let scheduled = |at| Job {
            not_before: Some(at),
            ..job(None)
        };
        let monday_8 = Utc.with_ymd_and_hms(2026, 3, 2, 8, 0, 0).unwrap();

        // nothing to hold: ask Redis
        assert_eq!(hold(&job(None), &plain, now), None);
        assert_eq!(hold(&scheduled(at(9, 0)), &plain, now), None);
        assert_eq!(hold(&scheduled(now), &plain, now), None);
        // a schedule ahead: held until then, not bounded by max_wait
        p.max_wait = Some(Duration::minutes(1));
        assert_eq!(
            hold(&scheduled(at(18, 0)), &cx(&p), now),
            held(at(18, 0), DelayCause::Schedule)
        );
        let late = Job {
            expires_at: Some(at(17, 0)),
            ..scheduled(at(18, 0))
        };
        assert_eq!(
            hold(&late, &cx(&p), now).as_ref().and_then(reason),
            Some(Reason::Expired)
        );
        p.max_wait = None;
        // the channel's windows closed on a Sunday: Monday's opening
        let on_channel = Context {
            channel_windows: Some(&weekdays),
            ..cx(&p)
        };
        assert_eq!(
            hold(&job(None), &on_channel, now),
            held(monday_8, window(WindowsOf::Channel, "sms"))
        );
        // ... unless the policy ignores them
        p.ignore_channel_windows = true;
        assert_eq!(
            hold(
                &job(None),
                &Context {
                    channel_windows: Some(&weekdays),
                    ..cx(&p)
                },
                now
            ),
            None
        );
        p.ignore_channel_windows = false;
        // the policy's open, the channel's closed; both closed and never together
        p.send_windows = Some(sundays.clone());
        let both = Context {
            channel_windows: Some(&weekdays),
            ..cx(&p)
        };
        let never = hold(&job(None), &both, now);
        assert_eq!(never.as_ref().and_then(reason), Some(Reason::Capped));
        // the policy's windows alone: open now
        assert_eq!(hold(&job(None), &cx(&p), now), None);
        assert_eq!(
            hold(&job(None), &cx(&p), at(13, 0)),
            held(
                Utc.with_ymd_and_hms(2026, 3, 8, 9, 0, 0).unwrap(),
                window(WindowsOf::Policy, "default")
            )
        );

        // a cap's retry time at 23:00 falls outside Sunday 09:00-12:00: next Sunday's opening
        let refused_until_23 = refused(Some(at(23, 0)), Action::Delay);
        let cap = DelayCause::Cap {
            policy: "default".into(),
            rule: daily(),
            seen: 1,
        };
        assert_eq!(
            after_admission(&job(None), &cx(&p), refused_until_23.clone(), now),
            Decision::Delay {
                until: Utc.with_ymd_and_hms(2026, 3, 8, 9, 0, 0).unwrap(),
                cause: cap.clone()
            }
        );
        // ... which max_wait of 3 days refuses, naming the instant
        p.max_wait = Some(Duration::days(3));
        match after_admission(&job(None), &cx(&p), refused_until_23.clone(), now) {
            Decision::Dead(d) => {
                assert_eq!(d.reason, Reason::Capped);
                assert!(
                    d.detail.contains("2026-03-08T09:00:00+00:00"),
                    "{}",
                    d.detail
                );
                assert!(d.detail.contains("max_wait"), "{}", d.detail);
            }
            other => panic!("{other:?}"),
        }
        // without windows, the retry time itself; max_wait counts from the first sighting
        p.send_windows = None;
        let seen_long_ago = Context {
            first_seen: at(10, 0) - Duration::days(3),
            ..cx(&p)
        };
        assert_eq!(
            after_admission(&job(None), &cx(&p), refused_until_23.clone(), now),
            Decision::Delay {
                until: at(23, 0),
                cause: cap
            }
        );
        assert_eq!(
            reason(&after_admission(
                &job(None),
                &seen_long_ago,
                refused_until_23,
                now
            )),
            Some(Reason::Capped)
        );
    }

    #[test]
    fn causes_say_what_holds_the_job() {
        let cap = DelayCause::Cap {
            policy: "default".into(),
            rule: daily(),
            seen: 1,
        };
        assert_eq!(cap.to_string(), "policy `default` (at most 1 per 1d)");
        assert_eq!(cap.label(), "cap");
        let w = DelayCause::Window {
            of: WindowsOf::Channel,
            name: "sms".into(),
        };
        assert_eq!(w.to_string(), "the send windows of channel `sms`");
        assert_eq!(DelayCause::Schedule.label(), "schedule");
    }

    #[test]
    fn a_cancelled_job_is_dead_cancelled_saying_when() {
        let d = cancelled(at(9, 30));
        assert_eq!(d.reason, Reason::Cancelled);
        assert_eq!(d.reason.as_str(), "cancelled");
        assert_eq!(
            d.detail,
            "cancelled by an operator at 2026-03-01T09:30:00+00:00"
        );
    }

    #[test]
    fn a_shadow_policy_holds_nothing_and_says_what_it_would_have_done() {
        let ticket = Ticket::for_tests(at(10, 0));
        let now = at(10, 0);
        let shadowed = |retry_at, action| Admission::Shadowed {
            ticket: ticket.clone(),
            retry_at,
            action,
            rule: daily(),
            seen: 1,
        };
        let mut p = policy();
        p.mode = Mode::Shadow;
        p.max_wait = Some(Duration::hours(6));
        let c = cx(&p);
        let j = job(None);
        use ShadowVerdict::*;
        #[rustfmt::skip]
        let table = [
            (Admission::Admitted(ticket.clone()), Some(Allowed)),
            // its caps would hold it till 15:00, inside max_wait (6 h from 10:00)
            (shadowed(Some(at(15, 0)), Action::Delay), Some(HeldCap)),
            // ... or till 17:00, past max_wait; or never; or its action drops
            (shadowed(Some(at(17, 0)), Action::Delay), Some(Dead)),
            (shadowed(None, Action::Delay), Some(Dead)),
            (shadowed(Some(at(15, 0)), Action::Drop), Some(Dead)),
            // no verdict without an admission
            (Admission::Duplicate, None),
            (Admission::Reserved { retry_at: at(10, 2) }, None),
        ];
        for (admission, verdict) in table {
            let shown = format!("{admission:?}");
            assert_eq!(shadow(&j, &c, &admission, now), verdict, "{shown}");
            // whatever the verdict, a shadowed or admitted job is dispatched
            if matches!(
                admission,
                Admission::Admitted(_) | Admission::Shadowed { .. }
            ) {
                assert_eq!(
                    after_admission(&j, &c, admission, now),
                    Decision::Dispatch(ticket.clone())
                );
            }
        }

        // its windows hold nothing either, and are its verdict when closed
        p.send_windows = Some(windows(&["daily 12:00-13:00"]));
        let c = cx(&p);
        assert_eq!(
            hold(&j, &c, now),
            None,
            "a shadow policy's window holds nothing"
        );
        let admitted = Admission::Admitted(ticket.clone());
        assert_eq!(shadow(&j, &c, &admitted, now), Some(HeldWindow));
        assert_eq!(shadow(&j, &c, &admitted, at(12, 30)), Some(Allowed));
        // the channel's windows are still enforced for its jobs
        let sms = windows(&["daily 12:00-13:00"]);
        let c = Context {
            channel_windows: Some(&sms),
            ..cx(&p)
        };
        assert!(
            matches!(hold(&j, &c, now), Some(Decision::Delay { until, .. }) if until == at(12, 0))
        );

        // the same policy enforced holds the job instead
        p.mode = Mode::Enforce;
        let c = cx(&p);
        assert!(
            matches!(hold(&j, &c, now), Some(Decision::Delay { until, .. }) if until == at(12, 0))
        );
        assert_eq!(
            shadow(&j, &c, &admitted, now),
            None,
            "no verdict for an enforced policy"
        );
    }

    #[test]
    fn a_refused_dispatch_backs_off_to_five_minutes() {
        let now = at(10, 0);
        let waits: Vec<i64> = [0, 1, 2, 5, 6, 60]
            .map(|attempt| (retry_refused_dispatch_at(attempt, now) - now).num_seconds())
            .to_vec();
        assert_eq!(waits, [5, 10, 20, 160, 300, 300]);
    }
}
