//! Caps in layers: what a cap is once read ([`Cap`]), which jobs it matches, what a
//! policy lets its caps do ([`CapsMode`]), and the one instant at which every layer
//! of a refused job passes ([`refusal`]). Pure: no I/O.
//!
//! A job meets its policy (the first layer) and every cap that matches it (one
//! layer each). Each layer counts its own sends in a sorted set of its own, so the
//! earliest instant at which all of them admit one more send is the latest of each
//! layer's earliest instant (a layer's counts only fall as time passes, so once a
//! layer admits, it keeps admitting until a new send is recorded).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

pub use super::policy::CapsMode;
use super::policy::{Mode, Scope};
use super::window::{self, Rule};

/// A validated cap (`[caps.NAME]`), ready for the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cap {
    /// Its name.
    pub name: String,
    /// Its rules, every one of which a job it holds must pass.
    pub rules: Vec<Rule>,
    /// What it counts: all the recipient's matching jobs, or those of one channel.
    pub scope: Scope,
    /// Enforced, or only counted (shadow: it records its jobs but holds none).
    pub mode: Mode,
    /// The channels it matches; `None`: every channel.
    pub channels: Option<Vec<String>>,
    /// The categories it matches (as the job writes it; no category is `default`);
    /// `None`: every category.
    pub categories: Option<Vec<String>>,
    /// The tenants it matches; `None`: every job, with a tenant or without.
    pub tenants: Option<Vec<String>>,
}

impl Cap {
    /// Whether a job of `channel`, `category` and `tenant` meets this cap.
    pub fn matches(&self, channel: &str, category: &str, tenant: Option<&str>) -> bool {
        let within = |set: &Option<Vec<String>>, x: &str| {
            set.as_ref().is_none_or(|s| s.iter().any(|v| v == x))
        };
        within(&self.channels, channel)
            && within(&self.categories, category)
            && match (&self.tenants, tenant) {
                (None, _) => true,
                (Some(set), Some(t)) => set.iter().any(|v| v == t),
                (Some(_), None) => false,
            }
    }

    /// Whether it counts one channel alone: its scope is `channel`, or it matches
    /// one channel only.
    pub fn of_one_channel(&self) -> bool {
        self.scope == Scope::Channel || self.channels.as_ref().is_some_and(|c| c.len() == 1)
    }

    /// The cap as `cap daily_total: 5 per 1d` (its first rule, or `rule` when given),
    /// as `x-notify-held-by` and the dead-letter details name it.
    pub fn describe(name: &str, rule: Option<Rule>) -> String {
        match rule {
            Some(r) => format!("cap {name}: {} per {}", r.limit, r.window),
            None => format!("cap {name}: no rule passes"),
        }
    }
}

/// Which layer of a job holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerRefusal {
    /// The first instant after `now` at which every layer passes; `None`: never.
    pub retry_at: Option<DateTime<Utc>>,
    /// The layer whose own earliest instant is that one (the first such, in the
    /// order given): the one that holds the job.
    pub layer: usize,
    /// That layer's first rule that is full now.
    pub rule: Option<Rule>,
}

/// The refusal at `now` of a job that must pass every layer: each layer is its rules
/// and the sends it remembers. The retry time is the latest of each layer's earliest
/// admitted instant, and at least a millisecond after `now`, as
/// [`window::refusal`]'s is.
pub fn refusal(layers: &[(&[Rule], &[DateTime<Utc>])], tz: Tz, now: DateTime<Utc>) -> LayerRefusal {
    let mut out = LayerRefusal {
        retry_at: Some(now + chrono::Duration::milliseconds(1)),
        layer: 0,
        rule: None,
    };
    let mut binding: Option<Option<DateTime<Utc>>> = None;
    for (i, (rules, sends)) in layers.iter().enumerate() {
        let r = window::refusal(rules, tz, now, sends);
        if r.rule.is_none() {
            continue;
        }
        // `None` (never) is later than any instant
        let later = match (binding, r.retry_at) {
            (None, _) => true,
            (Some(None), _) => false,
            (Some(Some(_)), None) => true,
            (Some(Some(b)), Some(t)) => t > b,
        };
        if later {
            binding = Some(r.retry_at);
            out.layer = i;
            out.rule = r.rule;
        }
    }
    out.retry_at =
        earliest(layers, tz, now).map(|t| t.max(now + chrono::Duration::milliseconds(1)));
    out
}

/// The earliest instant at or after `now` at which every layer admits one more
/// send, assuming no further sends; `None`: never.
pub fn earliest(
    layers: &[(&[Rule], &[DateTime<Utc>])],
    tz: Tz,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    layers.iter().try_fold(now, |at, (rules, sends)| {
        window::earliest_allowed(rules, tz, now, sends).map(|t| at.max(t))
    })
}

#[cfg(test)]
mod tests;
