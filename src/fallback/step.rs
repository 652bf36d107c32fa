//! The loop over a job's route: each channel in turn, asked of the store through
//! the worker's own admission (`admit`), until one lets it out, holds it for a
//! cause that spans channels, or none is left. The only I/O is `admit`'s.

use std::borrow::Cow;
use std::future::Future;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::route::{moves_on, Routed};
use super::spec::{Cause, FallbackSpec};
use crate::admission::Admission;
use crate::quota::policy::Policy;

/// What the route decided: the admission that stands, the channel of its step,
/// and where the job is on its route.
pub(crate) struct Stepped<'a> {
    pub admission: Admission,
    pub channel: Cow<'a, str>,
    pub routed: Routed,
}

/// What a route needs besides its channels: the job's policy and its fallback,
/// the recipient's zone, Redis time, and where the walk starts: the step of its
/// first channel (0 unless it resumes after a failed send) and why it left the one
/// before.
pub(crate) struct RouteOf<'p> {
    pub policy: &'p Policy,
    pub spec: &'p FallbackSpec,
    pub tz: Tz,
    pub now: DateTime<Utc>,
    pub offset: usize,
    pub from: Option<String>,
}

/// Walk `channels` (the job's own first, whose admission is `first`), asking
/// `admit` for each further one, until a step's admission stands. When every
/// channel moved it on: the earliest of the capped steps, to wait for (it is
/// decided again then from its first channel); with none capped, the first
/// channel's admission, with the detail naming each channel's cause.
pub(crate) async fn walk<'a, E, F, Fut>(
    channels: &[Cow<'a, str>],
    first: Admission,
    of: &RouteOf<'_>,
    mut admit: F,
) -> Result<Stepped<'a>, E>
where
    F: FnMut(usize) -> Fut,
    Fut: Future<Output = Result<Admission, E>>,
{
    let n = channels.len();
    let total = of.offset + n;
    let mut whys: Vec<String> = Vec::with_capacity(n);
    whys.extend(of.from.clone());
    let mut earliest: Option<(usize, Admission)> = None;
    let mut gone: Option<Admission> = None;
    let mut first = Some(first);
    for step in 0..n {
        let admission = match first.take() {
            Some(first) => first,
            None => admit(step).await?,
        };
        let Some((cause, why)) = moves_on(&admission, of.policy, of.spec, of.tz, of.now) else {
            let later = of.spec.moves_on(Cause::Failed) || of.spec.moves_on(Cause::Unanswered);
            let failing = later && step + 1 < n;
            let routed = Routed {
                step: of.offset + step,
                of: total,
                from: whys.pop(),
                gone: None,
                next: failing.then(|| (of.offset + step + 1, channels[step + 1].to_string())),
            };
            let channel = channels[step].clone();
            return Ok(Stepped {
                admission,
                channel,
                routed,
            });
        };
        whys.push(format!("{}: {why}", channels[step]));
        if let Some(next) = channels.get(step + 1) {
            counted(of.policy, &channels[step], next, cause);
        }
        if cause == Cause::Capped {
            if earliest
                .as_ref()
                .is_none_or(|(_, e)| retry_at(&admission) < retry_at(e))
            {
                earliest = Some((step, admission));
            }
        } else if gone.is_none() {
            gone = Some(admission);
        }
    }
    let routed = |step, gone| Routed {
        step: of.offset + step,
        of: total,
        from: None,
        gone,
        next: None,
    };
    Ok(match (earliest, gone) {
        (Some((step, admission)), _) => Stepped {
            admission,
            channel: channels[step].clone(),
            routed: routed(step, None),
        },
        (None, Some(admission)) => Stepped {
            admission,
            channel: channels[0].clone(),
            routed: routed(0, Some(whys.join("; "))),
        },
        (None, None) => unreachable!("a route has at least one channel"),
    })
}

/// The instant a capped admission waits for, ordered with `None` (never) last.
fn retry_at(admission: &Admission) -> (bool, Option<DateTime<Utc>>) {
    match admission {
        Admission::Refused { retry_at, .. } | Admission::Capped { retry_at, .. } => {
            (retry_at.is_none(), *retry_at)
        }
        _ => (true, None),
    }
}

fn counted(policy: &Policy, from: &str, to: &str, cause: Cause) {
    metrics::counter!(
        crate::metrics::FALLBACK_TOTAL,
        "policy" => policy.name.clone(),
        "from" => from.to_string(),
        "to" => to.to_string(),
        "cause" => cause.as_str(),
    )
    .increment(1);
}
