//! The store's side of caps in layers: the plans of policies and caps, made once
//! per zone and local day ([`cached`]), and a layered refusal turned into the
//! [`Admission`] that names the layer holding the job ([`layered_refusal`]). Pure:
//! no I/O.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use crate::admission::Admission;
use crate::preferences::set::QuietHours;
use crate::quota::caps::{self, Cap};
use crate::quota::plan::{plan, Plan};
use crate::quota::policy::{Mode, Policy, Scope};
use crate::quota::window;

/// A cap a job meets.
#[derive(Debug, Clone)]
pub(crate) struct JobLayer {
    /// The cap, as in force.
    pub(crate) cap: Arc<Cap>,
    /// Whether it may hold the job (a cap in shadow mode only counts it).
    pub(crate) holds: bool,
    /// The recipient's sorted set for it.
    pub(crate) key: String,
}

/// Plans by policy (or cap) as in force (the address of its `Arc`, which the entry
/// keeps alive: a tenant's override of a policy and the shared one have plans of
/// their own; a reload's new policy makes new plans, and the old ones are dropped),
/// then zone, each with the local date it is for.
pub(crate) type PlanCache<T> = HashMap<usize, HashMap<Tz, CachedPlan<T>>>;

/// A plan kept in a [`PlanCache`]: the local date it is for, its owner (kept alive)
/// and the plan.
pub(crate) struct CachedPlan<T> {
    date: chrono::NaiveDate,
    owner: Arc<T>,
    plan: Arc<Plan>,
}

/// The plan for `rules` of `owner` (a policy or a cap, as in force), zone and local
/// date, from `cache` or made and kept there (see [`PlanCache`]); the pair is what
/// the plan carries besides its rules: shadow mode and the suppression mask.
pub(crate) fn cached<T>(
    cache: &std::sync::Mutex<PlanCache<T>>,
    owner: &Arc<T>,
    rules: &[window::Rule],
    (shadow, suppressed_by): (bool, u8),
    tz: Tz,
    now: DateTime<Utc>,
) -> Arc<Plan> {
    let date = window::local_date(tz, now);
    let id = Arc::as_ptr(owner) as *const () as usize;
    let mut plans = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(kept) = plans.get(&id).and_then(|z| z.get(&tz)) {
        if kept.date == date && Arc::ptr_eq(&kept.owner, owner) {
            return kept.plan.clone();
        }
    }
    let mut made = plan(rules, tz, now);
    made.shadow = shadow;
    made.suppressed_by = suppressed_by;
    let p = Arc::new(made);
    let kept = CachedPlan {
        date,
        owner: owner.clone(),
        plan: p.clone(),
    };
    plans.entry(id).or_default().insert(tz, kept);
    p
}

/// A job with layers that its policy or a cap refused at `now` (ms): the layer whose
/// own next allowed instant is the latest holds it, until every layer allows it
/// (module [`crate::quota::caps`]). A shadow policy and the caps that only count
/// the job hold nothing.
pub(crate) fn layered_refusal(
    policy: &Policy,
    layers: &[JobLayer],
    tz: Tz,
    now: i64,
    blocks: Vec<Vec<i64>>,
    quiet: Option<Arc<QuietHours>>,
) -> Admission {
    let sends: Vec<Vec<DateTime<Utc>>> = blocks
        .into_iter()
        .map(|b| b.into_iter().map(window::from_millis).collect())
        .collect();
    let none: &[window::Rule] = &[];
    let policy_rules = match policy.mode {
        Mode::Enforce => &policy.rules[..],
        Mode::Shadow => none,
    };
    let rules = std::iter::once(policy_rules).chain(layers.iter().map(|l| {
        if l.holds {
            &l.cap.rules[..]
        } else {
            none
        }
    }));
    let view: Vec<(&[window::Rule], &[DateTime<Utc>])> = rules
        .zip(
            sends
                .iter()
                .map(Vec::as_slice)
                .chain(std::iter::repeat(&[][..])),
        )
        .collect();
    let at = window::from_millis(now);
    let r = caps::refusal(&view, tz, at);
    let seen = view[r.layer].1.len();
    let spanning = spanning(policy, layers, &view, tz, at);
    match r.layer {
        0 => Admission::Refused {
            retry_at: r.retry_at,
            action: policy.action,
            policy: policy.name.clone(),
            rule: r.rule,
            seen,
            quiet,
            spanning,
        },
        i => Admission::Capped {
            retry_at: r.retry_at,
            action: policy.action,
            policy: policy.name.clone(),
            cap: layers[i - 1].cap.name.clone(),
            rule: r.rule,
            seen,
            quiet,
            spanning,
        },
    }
}

/// Whether a layer that refuses the job at `now` spans channels: the policy unless
/// its scope is `channel`, a cap unless its scope is `channel` or it matches one
/// channel alone.
fn spanning(
    policy: &Policy,
    layers: &[JobLayer],
    view: &[(&[window::Rule], &[DateTime<Utc>])],
    tz: Tz,
    now: DateTime<Utc>,
) -> bool {
    let spans = |i: usize| match i {
        0 => policy.scope != Scope::Channel,
        i => !layers[i - 1].cap.of_one_channel(),
    };
    view.iter().enumerate().any(|(i, (rules, sends))| {
        spans(i) && window::refusal(rules, tz, now, sends).rule.is_some()
    })
}
