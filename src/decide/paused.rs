//! While the worker is paused after Redis lost its data (`redis.on_reset =
//! "pause"`, [`crate::reset`]): which jobs wait. Pure.

use chrono::{DateTime, Utc};

use super::{Context, Decision, DelayCause};
use crate::job::Job;
use crate::quota::policy::Mode;

/// How long a job held by the pause waits before it is looked at again.
pub const PAUSED_HOLD: chrono::Duration = chrono::Duration::seconds(60);

/// While the worker is paused after Redis lost its data: a job of an enforced
/// policy with rules is held [`PAUSED_HOLD`] (not beyond its `expires_at`, and not
/// bounded by `max_wait`: the pause is no cap), never dead-lettered for it; a job of
/// a policy without rules (transactional) or a shadow one goes on (`None`).
pub fn paused(job: &Job<'_>, cx: &Context<'_>, now: DateTime<Utc>) -> Option<Decision> {
    if cx.policy.mode != Mode::Enforce || cx.policy.rules.is_empty() {
        return None;
    }
    let hold = now + PAUSED_HOLD;
    let until = job.expires_at.map_or(hold, |exp| exp.min(hold));
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

    #[test]
    fn the_pause_holds_enforced_policies_with_rules_only_and_never_past_expiry() {
        let p = policy();
        let now = at(10, 0);
        let held = |j: &Job<'_>, p: &Policy| match paused(j, &cx(p), now) {
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
        assert_eq!(held(&job(None), &no_rules), None, "transactional jobs go");
        let shadow = Policy {
            mode: Mode::Shadow,
            ..policy()
        };
        assert_eq!(
            held(&job(None), &shadow),
            None,
            "a shadow policy holds nothing"
        );
    }
}
