//! The caps (`[caps.NAME]`): rules checked for every job they match, in addition to
//! the job's policy; as written, checked, and built into the
//! [`Cap`](crate::quota::caps::Cap) values the store works with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::policies::RuleSettings;
use super::ChannelSettings;
use crate::quota::caps::Cap;
use crate::quota::limits::{Limit, Per, Quota};
use crate::quota::policy::{Mode, Rate, Scope};
use crate::quota::window::{Rule, Window};

/// What a cap counts (`scope`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CapScope {
    /// All of a recipient's matching jobs, any channel (the default).
    #[default]
    Recipient,
    /// A recipient's matching jobs on one channel.
    Channel,
    /// Every matching job of a tenant, across all its recipients: a counter per
    /// calendar day or month in the tenant's zone.
    Tenant,
    /// Every matching job of a sender, across all its recipients: a counter per
    /// calendar day or month in its tenant's zone.
    Sender,
}

impl CapScope {
    /// Who shares one counter, for a quota (`tenant`, `sender`); `None` for a
    /// cap of a recipient.
    pub fn quota(self) -> Option<Per> {
        match self {
            CapScope::Tenant => Some(Per::Tenant),
            CapScope::Sender => Some(Per::Sender),
            CapScope::Recipient | CapScope::Channel => None,
        }
    }
}

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
    /// any channel), `channel` (a recipient's matching jobs on one channel),
    /// `tenant` or `sender` (every matching job of the tenant or sender, across
    /// all its recipients, per calendar day `"1d"` or month `"1mo"` in the
    /// tenant's zone).
    #[serde(default)]
    pub scope: CapScope,
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
    if cap.scope.quota().is_some() {
        validate_quota(path, cap)?;
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

/// A quota (a cap with `scope = "tenant"` or `"sender"`): a counter per calendar
/// period, so each rule counts one calendar day or one calendar month, and it
/// holds jobs (a shadow quota would count what it never holds).
fn validate_quota(path: &str, cap: &CapSettings) -> Result<(), ConfigError> {
    let one_period = |r: &RuleSettings| {
        matches!(
            r.window,
            Window::CalendarDays(1) | Window::CalendarMonths(1)
        )
    };
    if !cap.rules.iter().all(one_period) {
        return Err(invalid(
            format!("{path}.rules"),
            "a cap with scope `tenant` or `sender` counts per calendar day or month: \
             each rule's window is \"1d\" or \"1mo\"",
        ));
    }
    if cap.mode == Mode::Shadow {
        return Err(invalid(
            format!("{path}.mode"),
            "a cap with scope `tenant` or `sender` holds jobs: mode `shadow` is for caps \
             of a recipient",
        ));
    }
    Ok(())
}

/// The quotas of the cap `name` (one per rule), as the admission takes them with
/// the limits; empty for a cap of a recipient.
pub(super) fn quotas(name: &str, c: &CapSettings) -> Vec<Limit> {
    let Some(per) = c.scope.quota() else {
        return Vec::new();
    };
    c.rules
        .iter()
        .map(|r| Limit {
            name: name.to_string(),
            rate: Rate {
                interval_us: 1,
                burst: 1,
                cost: 1,
            },
            per,
            channels: c.matches.channels.clone(),
            categories: c.matches.categories.clone(),
            tenants: c.matches.tenants.clone(),
            quota: Some(Quota {
                limit: r.limit,
                window: r.window,
            }),
        })
        .collect()
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
        scope: match c.scope {
            CapScope::Channel => Scope::Channel,
            _ => Scope::Recipient,
        },
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
            scope: CapScope::Channel,
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
