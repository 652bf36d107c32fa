//! A job's route over its channels: whether a step's admission moves it on and
//! why, what the next step's dispatch carries, and the dead letter when no channel
//! is left. Pure: no I/O.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use lapin::types::{AMQPValue, FieldTable, ShortString};

use super::spec::{Cause, FallbackSpec};
use crate::admission::Admission;
use crate::decide::DeadLetter;
use crate::job::decode::Job;
use crate::job::Reason;
use crate::quota::caps::Cap;
use crate::quota::policy::Policy;
use crate::quota::window::Rule;

/// Where a job with `fallback` is on its route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routed {
    /// The step it goes out (or waits, or dies) on: 0 is its own channel.
    pub step: usize,
    /// How many channels its route has.
    pub of: usize,
    /// Why it left the channel before this step (`x-notify-fallback-from`), from
    /// the second step on.
    pub from: Option<String>,
    /// Every channel gone (none left, none to wait for): the dead letter's detail,
    /// naming each channel's cause.
    pub gone: Option<String>,
    /// The step it goes on to when this one fails or goes unanswered, and that
    /// step's channel (its policy moves on when `failed` or `unanswered` and a
    /// channel is left).
    pub next: Option<(usize, String)>,
}

impl Routed {
    /// The dispatch headers of this step: `x-notify-channel`, `x-notify-route`
    /// (`"2/3"`) and, from the second step on, `x-notify-fallback-from`.
    pub fn headers<'a>(&'a self, channel: &'a str) -> Vec<(&'static str, Cow<'a, str>)> {
        let mut out = vec![
            ("x-notify-channel", Cow::Borrowed(channel)),
            (
                "x-notify-route",
                Cow::Owned(format!("{}/{}", self.step + 1, self.of)),
            ),
        ];
        if let Some(from) = &self.from {
            out.push((FALLBACK_FROM, Cow::Borrowed(from.as_str())));
        }
        out
    }

    /// The dead letter of a job whose every channel is gone: the first channel's
    /// reason (`first`), and the detail naming each channel's cause.
    pub(crate) fn dead_letter(&self, first: DeadLetter) -> DeadLetter {
        match &self.gone {
            Some(detail) => DeadLetter {
                reason: first.reason,
                detail: detail.clone(),
            },
            None => first,
        }
    }
}

/// The dispatch headers of a routed job: its own (`own`, as a dispatch without a
/// route would carry them) and its step's ([`Routed::headers`]).
pub(crate) fn with_headers(own: Option<FieldTable>, routed: &Routed, channel: &str) -> FieldTable {
    let mut map = own.map(|h| h.inner().clone()).unwrap_or_default();
    // how it came back is the worker's business, not the sender's
    map.remove(RESUME_AT);
    map.remove(ESCALATION);
    let mut out = FieldTable::from(map);
    for (name, value) in routed.headers(channel) {
        let value = AMQPValue::LongString(value.as_ref().into());
        out.insert(ShortString::from(name), value);
    }
    out
}

/// The header that says at which step a job published again resumes its route
/// (after its step's send failed: [`super::state`]).
pub const RESUME_AT: &str = "x-notify-route-step";
/// The header that says why it left the channel before.
pub const FALLBACK_FROM: &str = "x-notify-fallback-from";
/// The header of an escalation (a job published round the delay ladder to resume
/// its route when its step goes unanswered): the channel whose answer it awaits.
pub const ESCALATION: &str = "x-notify-escalation";

/// The channel an escalation awaits an answer on (its [`ESCALATION`] header), for
/// a job that is one.
pub fn escalation(headers: Option<&FieldTable>) -> Option<String> {
    match headers?.inner().get(ESCALATION)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    }
}

/// The cause in a `x-notify-fallback-from` text (``push: capped (…)``).
pub fn cause_of(from: &str) -> Option<Cause> {
    let (_, why) = from.split_once(": ")?;
    Cause::parse(why.split([' ', '(']).next()?)
}

/// A job where it resumes its route: see [`resume`].
#[derive(Debug)]
pub struct Resumed<'a> {
    /// The job on the channel of the step it resumes at.
    pub job: Job<'a>,
    /// That step (0: the job's own channel).
    pub step: usize,
    /// Why it left the step before (`x-notify-fallback-from`).
    pub left: Option<String>,
}

impl<'a> Resumed<'a> {
    /// A job at the start of its route: on its own channel, step 0.
    pub fn at_start(job: Job<'a>) -> Self {
        Resumed {
            job,
            step: 0,
            left: None,
        }
    }
}

/// A job with `fallback` published again to resume its route at step k (the
/// [`RESUME_AT`] header, 1 to the length of `fallback`): itself on the channel of
/// that step, with the channels after it as its fallback; the step and why it left
/// the one before. Any other job: as it is, at step 0.
pub fn resume<'a>(mut job: Job<'a>, headers: Option<&FieldTable>) -> Resumed<'a> {
    let text = |name: &str| match headers?.inner().get(name)? {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    };
    let len = job.fallback.as_ref().map_or(0, Vec::len);
    let k = match text(RESUME_AT).and_then(|t| t.parse::<usize>().ok()) {
        Some(k) if (1..=len).contains(&k) => k,
        _ => return Resumed::at_start(job),
    };
    let mut rest = job
        .fallback
        .take()
        .unwrap_or_default()
        .into_iter()
        .skip(k - 1);
    job.channel = rest.next().unwrap_or_default();
    job.fallback = Some(rest.collect());
    Resumed {
        job,
        step: k,
        left: text(FALLBACK_FROM),
    }
}

/// Whether the admission of a step on `channel` moves the job on under `spec`, and
/// the words that say why (``capped (policy `p` (at most 1 per 1d) until …)``).
pub fn moves_on(
    admission: &Admission,
    policy: &Policy,
    spec: &FallbackSpec,
    tz: Tz,
    now: DateTime<Utc>,
) -> Option<(Cause, String)> {
    let further = |retry_at: &Option<DateTime<Utc>>| match retry_at {
        Some(t) => *t - now > spec.wait_at_most,
        None => true,
    };
    let (cause, why) = match admission {
        Admission::OptedOut(_) => (Cause::OptedOut, "opted_out".to_string()),
        Admission::Suppressed(s) => (Cause::Suppressed, format!("suppressed ({})", s.kind)),
        Admission::Refused {
            retry_at,
            rule,
            spanning: false,
            ..
        } if further(retry_at) => {
            let held = format!("policy `{}` ({})", policy.name, rule_text(*rule));
            (Cause::Capped, capped(&held, retry_at, tz))
        }
        Admission::Capped {
            retry_at,
            cap,
            rule,
            spanning: false,
            ..
        } if further(retry_at) => (
            Cause::Capped,
            capped(&Cap::describe(cap, *rule), retry_at, tz),
        ),
        _ => return None,
    };
    spec.moves_on(cause).then_some((cause, why))
}

fn rule_text(rule: Option<Rule>) -> String {
    match rule {
        Some(r) => format!("at most {} per {}", r.limit, r.window),
        None => "no rule passes".into(),
    }
}

fn capped(held: &str, retry_at: &Option<DateTime<Utc>>, tz: Tz) -> String {
    match retry_at {
        Some(t) => format!(
            "capped ({held} until {})",
            t.with_timezone(&tz).to_rfc3339()
        ),
        None => format!("capped ({held}, never)"),
    }
}

/// The channels of a job's route that are not configured, if any (the job is
/// then dead-lettered `unknown_channel`).
pub(crate) fn unknown_channel(
    fallback: &[Cow<'_, str>],
    channels: &[String],
) -> Option<DeadLetter> {
    let unknown: Vec<&str> = fallback
        .iter()
        .map(|c| c.as_ref())
        .filter(|c| !channels.iter().any(|k| k == c))
        .collect();
    (!unknown.is_empty()).then(|| DeadLetter {
        reason: Reason::UnknownChannel,
        detail: format!(
            "the fallback channel(s) `{}` are not configured",
            unknown.join("`, `")
        ),
    })
}

#[cfg(test)]
mod tests;
