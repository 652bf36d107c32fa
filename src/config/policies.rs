//! The policies (`[policies.NAME]`): as written, checked, and built into the
//! [`Policy`] values the store works with.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::digest::DigestSettings;
use super::error::{invalid, ConfigError};
use super::fallback::FallbackSettings;
use super::text::{send_windows_text, window_text, Dur};
use crate::lanes::share::Priority;
use crate::quota::caps::CapsMode;
use crate::quota::policy::{Action, Mode, Policy, Scope};
use crate::quota::send_windows::SendWindows;
use crate::quota::suppression::{Kind, Kinds};
use crate::quota::window::{Rule, Window};

/// One rule as written in the file: `{ limit = 1, window = "1d" }`.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSettings {
    /// At most this many jobs per `window` to one recipient (required).
    pub limit: u32,
    /// The window the limit counts in: calendar days in the recipient's zone
    /// (`"1d"`, `"7d"`) or a rolling duration (`"90m"`, `"24h"`); at most 366 days
    /// (required).
    #[serde(with = "window_text")]
    pub window: Window,
}

/// A policy as written in the file (`[policies.NAME]`); a job's `category` picks
/// it, and an unknown category picks `default`.
///
/// One field per key of the table: it mirrors the file's shape, so it has as many
/// fields as `[policies.NAME]` has keys.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    /// Its caps, every one of which a job must pass; empty (the default): none.
    #[serde(default)]
    pub rules: Vec<RuleSettings>,
    /// What the caps count (default `recipient`).
    #[serde(default)]
    pub scope: Scope,
    /// What becomes of a job the caps refuse (default `delay`).
    #[serde(default)]
    pub action: Action,
    /// When its jobs may go out, in the recipient's zone, e.g.
    /// `[{ days = "mon-fri", from = "08:00", to = "21:00" }]`; a job must fit these
    /// and its channel's. Unset (the default): any time; an empty list is refused.
    #[serde(
        default,
        with = "send_windows_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub send_windows: Option<SendWindows>,
    /// Its jobs go out whatever their channel's send windows say (default false).
    #[serde(default)]
    pub ignore_channel_windows: bool,
    /// The longest a job may wait for its caps and windows, counted from when a
    /// worker first saw it; one that would wait longer is dead-lettered `capped`.
    /// At least `1s` and at most `redis.record_ttl`; unset (the default): unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Dur>,
    /// `enforce` (the default) or `shadow`: a shadow policy holds no job; its sends
    /// are recorded and what it would have done is counted.
    #[serde(default)]
    pub mode: Mode,
    /// The lane of its jobs that carry no `priority`: `urgent`, `normal` (the
    /// default) or `bulk`. Jobs wait in their lane only while their channel's rate
    /// makes them wait; urgent ones take the channel's next send slots.
    #[serde(default)]
    pub priority: Priority,
    /// Which suppressions hold its jobs (dead-lettered `suppressed`): a list of
    /// `bounced`, `complained`, `unsubscribed`. Unset: all three, except for the
    /// policy named `transactional`, held by `bounced` only (a receipt still reaches
    /// someone who unsubscribed from promotions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suppressed_by: Option<Vec<Kind>>,
    /// What the caps (`[caps.NAME]`) do to its jobs: `enforce` (the default: held by
    /// the caps that match them, and counted toward them), `count` (never held by
    /// them, but counted toward them) or `ignore` (neither).
    #[serde(default)]
    pub caps: CapsMode,
    /// Its jobs pass the recipients' preferences (opt-outs and quiet hours): for
    /// what a recipient may not turn off (receipts, codes). Unset: false, except
    /// for the policy named `transactional`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// Its jobs are folded into digests (`[policies.NAME.digest]`, docs/guide/digests.md);
    /// unset (the default): none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<DigestSettings>,
    /// When its jobs that name further channels (`fallback`) move on to the next
    /// (`[policies.NAME.fallback]`, docs/guide/fallback.md); unset: on `capped`,
    /// `opted_out`, `suppressed` and `failed`, at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<FallbackSettings>,
}

/// Check the policies: a `default` one, and each `max_wait` at least a second and
/// within `record_ttl` (the time a cancel mark and a collapse key are kept).
pub(super) fn validate(
    policies: &BTreeMap<String, PolicySettings>,
    record_ttl: Duration,
) -> Result<(), ConfigError> {
    if !policies.contains_key("default") {
        return Err(invalid(
            "policies.default",
            "a `default` policy is required",
        ));
    }
    validate_each(policies, record_ttl, "")
}

/// Check each policy's `max_wait` and digest section, naming keys under `prefix` (`""`, or a tenant's
/// `tenants.NAME.`).
pub(super) fn validate_each(
    policies: &BTreeMap<String, PolicySettings>,
    record_ttl: Duration,
    prefix: &str,
) -> Result<(), ConfigError> {
    for (name, p) in policies {
        if let Some(d) = &p.digest {
            super::digest::validate(d, &format!("{prefix}policies.{name}.digest"))?;
        }
        if let Some(f) = &p.fallback {
            super::fallback::validate(f, &format!("{prefix}policies.{name}.fallback"))?;
        }
        if p.max_wait.is_some_and(|d| d.0 < Duration::from_secs(1)) {
            return Err(invalid(
                format!("{prefix}policies.{name}.max_wait"),
                "must be at least 1s (leave it out for no bound)",
            ));
        }
        if let Some(wait) = p.max_wait.filter(|d| d.0 > record_ttl) {
            return Err(invalid(
                "redis.record_ttl",
                format!(
                    "must be at least the longest max_wait ({} of policy `{name}`): \
                     a job's cancel mark and collapse key must outlive its wait",
                    Window::Rolling(chrono::Duration::from_std(wait.0).unwrap_or_default())
                ),
            ));
        }
    }
    Ok(())
}

/// The policy named `name`, as the store works with it.
pub(super) fn build(name: &str, p: &PolicySettings) -> Policy {
    Policy {
        name: name.to_string(),
        rules: p
            .rules
            .iter()
            .map(|r| Rule {
                limit: r.limit,
                window: r.window,
            })
            .collect(),
        scope: p.scope,
        action: p.action,
        send_windows: p.send_windows.clone(),
        ignore_channel_windows: p.ignore_channel_windows,
        max_wait: p
            .max_wait
            .and_then(|d| chrono::Duration::from_std(d.0).ok()),
        mode: p.mode,
        priority: p.priority,
        suppressed_by: match &p.suppressed_by {
            Some(kinds) => Kinds::of(kinds),
            None if name == "transactional" => Kinds::of(&[Kind::Bounced]),
            None => Kinds::ALL,
        },
        caps: p.caps,
        required: p.required.unwrap_or(name == "transactional"),
        digest: p.digest.as_ref().map(super::digest::build),
        fallback: p
            .fallback
            .as_ref()
            .map(super::fallback::build)
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_wait(wait: Option<Duration>) -> BTreeMap<String, PolicySettings> {
        let p = PolicySettings {
            max_wait: wait.map(Dur),
            ..PolicySettings::default()
        };
        BTreeMap::from([("default".to_string(), p)])
    }

    #[test]
    fn a_default_policy_and_waits_within_the_record_ttl() {
        let day = Duration::from_secs(86_400);
        assert!(validate(&with_wait(None), day).is_ok());
        assert!(validate(&with_wait(Some(day)), day).is_ok());
        let key_of = |p, ttl| validate(&p, ttl).unwrap_err().key().map(str::to_string);
        assert_eq!(
            key_of(BTreeMap::new(), day).as_deref(),
            Some("policies.default")
        );
        assert_eq!(
            key_of(with_wait(Some(Duration::from_millis(10))), day).as_deref(),
            Some("policies.default.max_wait")
        );
        let err = validate(&with_wait(Some(day * 2)), day).unwrap_err();
        assert_eq!(err.key(), Some("redis.record_ttl"));
        assert!(
            err.to_string().contains("(48h of policy `default`)"),
            "{err}"
        );
    }

    #[test]
    fn a_policy_is_built_as_written() {
        let p = PolicySettings {
            rules: vec![RuleSettings {
                limit: 2,
                window: Window::CalendarDays(7),
            }],
            scope: Scope::Channel,
            max_wait: Some(Dur(Duration::from_secs(3600))),
            mode: Mode::Shadow,
            ..PolicySettings::default()
        };
        let built = build("promo", &p);
        assert_eq!(built.name, "promo");
        assert_eq!(
            built.rules,
            [Rule {
                limit: 2,
                window: Window::CalendarDays(7)
            }]
        );
        assert_eq!(built.scope, Scope::Channel);
        assert_eq!(built.action, Action::Delay);
        assert_eq!(built.max_wait, Some(chrono::Duration::hours(1)));
        assert_eq!(built.mode, Mode::Shadow);
        assert_eq!(built.suppressed_by, Kinds::ALL);
    }

    #[test]
    fn transactional_is_held_by_bounces_alone_unless_told() {
        let p = PolicySettings::default();
        assert_eq!(build("transactional", &p).suppressed_by, Kinds(1));
        assert_eq!(build("promo", &p).suppressed_by, Kinds::ALL);
        let told = PolicySettings {
            suppressed_by: Some(vec![Kind::Unsubscribed, Kind::Complained]),
            ..PolicySettings::default()
        };
        assert_eq!(build("transactional", &told).suppressed_by, Kinds(6));
    }
}
