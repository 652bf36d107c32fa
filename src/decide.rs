//! Decide: what becomes of one job, as data. Pure: no I/O; "now" is a parameter.
//!
//! Two steps, around the one question only Redis answers. [`triage`] looks at the
//! job alone (a channel that is not configured, already expired; a body that is not
//! a job is [`malformed`]), and [`decide`] turns the engine's [`Admission`] into a
//! [`Decision`]. The worker then carries the decision out (publish, then commit or
//! release, then ack); when the broker refuses a dispatch,
//! [`retry_refused_dispatch_at`] says when to try again.

use chrono::{DateTime, Duration, Utc};

use crate::config::Action;
use crate::engine::{Admission, Ticket};
use crate::job::decode::{Job, Malformed};
use crate::job::Reason;
use crate::quota::window::Rule;

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
    /// A cap of `policy` (`rule`: one that is full now).
    Cap {
        /// The policy's name.
        policy: String,
        /// A rule that refused it.
        rule: Option<Rule>,
    },
    /// Another worker holds its reservation; look again when that lapses.
    InFlight,
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

/// The engine's answer for `job`, at `now` (Redis time, after the admission).
pub fn decide(job: &Job<'_>, admission: Admission, now: DateTime<Utc>) -> Decision {
    let expires = job.expires_at;
    match admission {
        Admission::Admitted(ticket) => match expires {
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
            ..
        } => match expires {
            Some(exp) if at > exp => dead(
                Reason::Expired,
                format!(
                    "policy `{policy}` ({}) allows it next at {}, after it expires at {}",
                    describe(rule),
                    at.to_rfc3339(),
                    exp.to_rfc3339()
                ),
            ),
            _ => Decision::Delay {
                until: at,
                cause: DelayCause::Cap { policy, rule },
            },
        },
        Admission::InFlight { retry_at } => Decision::Delay {
            until: retry_at,
            cause: DelayCause::InFlight,
        },
        Admission::Duplicate => Decision::Duplicate,
    }
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
        }
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
            (None, Admission::InFlight { retry_at: at(10, 2) }, Decision::Delay { until: at(10, 2), cause: DelayCause::InFlight }),
            (Some(at(9, 0)), Admission::Duplicate, Decision::Duplicate),
        ];
        for (expires, admission, expected) in table {
            let shown = format!("{admission:?} expiring {expires:?}");
            assert_eq!(decide(&job(expires), admission, now), expected, "{shown}");
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
    fn a_refused_dispatch_backs_off_to_five_minutes() {
        let now = at(10, 0);
        let waits: Vec<i64> = [0, 1, 2, 5, 6, 60]
            .map(|attempt| (retry_refused_dispatch_at(attempt, now) - now).num_seconds())
            .to_vec();
        assert_eq!(waits, [5, 10, 20, 160, 300, 300]);
    }
}
