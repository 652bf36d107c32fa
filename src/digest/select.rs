//! Which jobs a digest takes: a job of a `held` policy whose caps would delay it
//! ([`held`]), a digest refused when it went ([`held_digest`]), and never a digest
//! itself ([`is_digest`]). (A job of a `window` or `sliding` policy is folded
//! whenever it comes, unless it is scheduled for later.) Pure: no I/O.

use lapin::message::Delivery;

use super::message::DIGEST_HEADER;
use crate::decide::DelayCause;
use crate::quota::digest::{DigestMode, DigestSpec};
use crate::quota::policy::Policy;

/// The digest of a `held` policy a delayed job is folded into instead: `Some` when
/// the policy's digest is `held`, the delay is its caps' (a cap of its policy or a
/// `[caps.NAME]` layer) and the delivery is not a digest itself.
pub(crate) fn held<'p>(
    policy: &'p Policy,
    cause: &DelayCause,
    delivery: &Delivery,
) -> Option<&'p DigestSpec> {
    let spec = policy.digest.as_ref()?;
    let by_caps = matches!(cause, DelayCause::Cap { .. } | DelayCause::Capped { .. });
    (spec.mode == DigestMode::Held && by_caps && !is_digest(delivery)).then_some(spec)
}

/// Whether a delivery is a digest of a `held` policy (refused, it opens again).
pub(crate) fn held_digest(policy: &Policy, delivery: &Delivery) -> bool {
    policy
        .digest
        .as_ref()
        .is_some_and(|d| d.mode == DigestMode::Held)
        && is_digest(delivery)
}

/// Whether a delivery is a digest (it carries `x-notify-digest`): never folded.
pub(crate) fn is_digest(delivery: &Delivery) -> bool {
    delivery
        .properties
        .headers()
        .as_ref()
        .is_some_and(|h| h.inner().contains_key(DIGEST_HEADER))
}
