//! While the worker is paused after Redis lost its data (`redis.on_reset =
//! "pause"`, [`crate::reset`]): which jobs wait. Pure.

use chrono::{DateTime, Utc};

use super::{Context, Decision, DelayCause};
use crate::job::Job;
use crate::quota::policy::Mode;

/// While the worker is paused after Redis lost its data: a job its caps or its
/// recipient's preferences could stop is held for `hold` (`redis.paused_hold`: how
/// long it waits before it is looked at again; not beyond its
/// `expires_at`, and not bounded by `max_wait`: the pause is no cap), never
/// dead-lettered for it. That is a job of an enforced policy with rules (the sends
/// they counted are gone), and a job of any policy that is not `required` (the
/// recipients' preferences may be gone: an opt-out or quiet hours that would stop
/// it, whatever the policy's mode). A job of a required policy without enforced
/// rules (transactional) goes on (`None`).
pub fn paused(
    job: &Job<'_>,
    cx: &Context<'_>,
    now: DateTime<Utc>,
    hold: chrono::Duration,
) -> Option<Decision> {
    let caps = cx.policy.mode == Mode::Enforce && !cx.policy.rules.is_empty();
    let preferences = !cx.policy.required;
    if !caps && !preferences {
        return None;
    }
    let held_until = now + hold;
    let until = job.expires_at.map_or(held_until, |exp| exp.min(held_until));
    Some(Decision::Delay {
        until,
        cause: DelayCause::Paused,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decide::tests::{at, cx, job, policy};
    use crate::quota::policy::Policy;

    /// `redis.paused_hold`'s default.
    const PAUSED_HOLD: chrono::Duration = chrono::Duration::seconds(60);

    #[test]
    fn the_pause_holds_what_caps_or_preferences_could_stop_and_never_past_expiry() {
        let p = policy();
        let now = at(10, 0);
        let held = |j: &Job<'_>, p: &Policy| match paused(j, &cx(p), now, PAUSED_HOLD) {
            Some(Decision::Delay { until, cause }) => {
                assert_eq!(cause, DelayCause::Paused);
                Some(until)
            }
            None => None,
            other => panic!("{other:?}"),
        };
        assert_eq!(held(&job(None), &p), Some(now + PAUSED_HOLD));
        assert_eq!(
            held(&job(Some(at(10, 0) + chrono::Duration::seconds(5))), &p),
            Some(at(10, 0) + chrono::Duration::seconds(5))
        );
        let no_rules = Policy {
            rules: vec![],
            ..policy()
        };
        assert_eq!(
            held(&job(None), &no_rules),
            Some(now + PAUSED_HOLD),
            "without rules, preferences could stop it"
        );
        let required = Policy {
            required: true,
            ..no_rules.clone()
        };
        assert_eq!(held(&job(None), &required), None, "transactional jobs go");
        let required_with_rules = Policy {
            required: true,
            ..policy()
        };
        assert_eq!(
            held(&job(None), &required_with_rules),
            Some(now + PAUSED_HOLD),
            "its caps could stop it"
        );
        let shadow = Policy {
            mode: Mode::Shadow,
            ..policy()
        };
        assert_eq!(
            held(&job(None), &shadow),
            Some(now + PAUSED_HOLD),
            "a shadow policy's caps hold nothing, preferences still could"
        );
        let shadow_required = Policy {
            required: true,
            ..shadow
        };
        assert_eq!(held(&job(None), &shadow_required), None);
    }
}
