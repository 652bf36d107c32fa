//! The caps (`[caps.NAME]`): rules checked for every job they match, in addition to
//! the job's policy; as written, checked, and built into the
//! [`Cap`](crate::quota::caps::Cap) values the store works with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::policies::RuleSettings;
use super::ChannelSettings;
use crate::quota::caps::Cap;
use crate::quota::policy::{Mode, Scope};
use crate::quota::window::Rule;

/// Which jobs a cap is checked for (`match = { channels = ["sms"] }`); every list
/// left out matches everything, so `match = {}` matches every job.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSettings {
    /// Only jobs on these channels (each a configured channel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<Vec<String>>,
    /// Only jobs of these categories (as the job writes it; a job without one is
    /// `default`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<Vec<String>>,
    /// Only jobs of these tenants (a job without a tenant matches no such list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
}

/// A cap as written in the file (`[caps.NAME]`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CapSettings {
    /// Its rules, every one of which a job it matches must pass (at least one).
    #[serde(default)]
    pub rules: Vec<RuleSettings>,
    /// The jobs it is checked for (default: every job).
    #[serde(default, rename = "match")]
    pub matches: MatchSettings,
    /// What it counts: `recipient` (the default: all the recipient's matching jobs,
    /// any channel) or `channel` (a recipient's matching jobs on one channel).
    #[serde(default)]
    pub scope: Scope,
    /// `enforce` (the default) or `shadow`: a shadow cap counts the jobs it
    /// matches and holds none.
    #[serde(default)]
    pub mode: Mode,
}

/// Check one cap, written at `path` (`caps.NAME`, or a tenant's override): a name
/// of 1 to 64 characters of `a-z`, `A-Z`, `0-9`, `_` and `-`, at least one rule,
/// and channels that are configured.
pub(super) fn validate_one(
    path: &str,
    name: &str,
    cap: &CapSettings,
    channels: &BTreeMap<String, ChannelSettings>,
) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(invalid(
            path,
            "cap names are 1 to 64 characters of a-z, A-Z, 0-9, `_` and `-`",
        ));
    }
    if cap.rules.is_empty() {
        return Err(invalid(
            format!("{path}.rules"),
            "a cap needs at least one rule, e.g. [{ limit = 5, window = \"1d\" }]",
        ));
    }
    for c in cap.matches.channels.iter().flatten() {
        if !channels.contains_key(c) {
            return Err(invalid(
                format!("{path}.match.channels"),
                format!(
                    "channel `{c}` is not configured (configured: {})",
                    channels.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Check every cap.
pub(super) fn validate(
    caps: &BTreeMap<String, CapSettings>,
    channels: &BTreeMap<String, ChannelSettings>,
) -> Result<(), ConfigError> {
    for (name, cap) in caps {
        validate_one(&format!("caps.{name}"), name, cap, channels)?;
    }
    Ok(())
}

/// The cap named `name`, as the store works with it.
pub(super) fn build(name: &str, c: &CapSettings) -> Cap {
    Cap {
        name: name.to_string(),
        rules: c
            .rules
            .iter()
            .map(|r| Rule {
                limit: r.limit,
                window: r.window,
            })
            .collect(),
        scope: c.scope,
        mode: c.mode,
        channels: c.matches.channels.clone(),
        categories: c.matches.categories.clone(),
        tenants: c.matches.tenants.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::window::Window;

    fn daily(limit: u32) -> Vec<RuleSettings> {
        vec![RuleSettings {
            limit,
            window: Window::CalendarDays(1),
        }]
    }

    #[test]
    fn a_cap_needs_a_rule_a_plain_name_and_configured_channels() {
        let channels = BTreeMap::from([("sms".to_string(), ChannelSettings::default())]);
        let key = |name: &str, cap: CapSettings| {
            let caps = BTreeMap::from([(name.to_string(), cap)]);
            validate(&caps, &channels)
                .err()
                .and_then(|e| e.key().map(str::to_string))
        };
        let ok = CapSettings {
            rules: daily(5),
            ..CapSettings::default()
        };
        assert_eq!(key("daily_total", ok.clone()), None);
        assert_eq!(key("a b", ok.clone()).as_deref(), Some("caps.a b"));
        assert_eq!(
            key("empty", CapSettings::default()).as_deref(),
            Some("caps.empty.rules")
        );
        let fax = CapSettings {
            matches: MatchSettings {
                channels: Some(vec!["sms".into(), "fax".into()]),
                ..MatchSettings::default()
            },
            ..ok
        };
        assert_eq!(key("c", fax).as_deref(), Some("caps.c.match.channels"));
    }

    #[test]
    fn a_category_no_policy_is_named_is_a_warning_not_an_error() {
        let mut s = crate::config::Settings::defaults();
        s.caps.insert(
            "promos".into(),
            CapSettings {
                rules: daily(1),
                matches: MatchSettings {
                    categories: Some(vec!["default".into(), "promo".into()]),
                    ..MatchSettings::default()
                },
                ..CapSettings::default()
            },
        );
        assert!(s.validate().is_ok());
        let about: Vec<String> = s
            .warnings()
            .into_iter()
            .filter(|w| w.starts_with("caps."))
            .collect();
        assert_eq!(about.len(), 1, "{about:?}");
        assert!(about[0].contains("`promo`"), "{}", about[0]);
    }

    #[test]
    fn a_cap_is_built_as_written() {
        let c = CapSettings {
            rules: daily(2),
            matches: MatchSettings {
                channels: Some(vec!["sms".into()]),
                categories: None,
                tenants: Some(vec!["acme".into()]),
            },
            scope: Scope::Channel,
            mode: Mode::Shadow,
        };
        let cap = build("sms_daily", &c);
        assert_eq!(cap.name, "sms_daily");
        assert_eq!(cap.rules.len(), 1);
        assert_eq!(cap.scope, Scope::Channel);
        assert_eq!(cap.mode, Mode::Shadow);
        assert!(cap.matches("sms", "x", Some("acme")));
        assert!(!cap.matches("sms", "x", None));
    }
}
