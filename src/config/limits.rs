//! The limits (`[limits.NAME]`): named GCRA buckets over the jobs they match, per
//! all, tenant or sender; as written, checked, and built into the
//! [`Limit`](crate::quota::limits::Limit) values the store works with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::caps::MatchSettings;
use super::channels::gcra;
use super::error::{invalid, ConfigError};
use super::text::Dur;
use super::ChannelSettings;
use crate::quota::limits::{Limit, Per};

/// A limit as written in the file (`[limits.NAME]`).
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSettings {
    /// Units of cost per `period` (at least 1).
    pub rate: u64,
    /// The period `rate` counts in; unset: `1s`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Dur>,
    /// Units of cost that may go at once after a quiet spell; unset: 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u64>,
    /// The jobs it holds (default: every job).
    #[serde(default, rename = "match")]
    pub matches: MatchSettings,
    /// `all` (the default: one bucket), `tenant` or `sender` (one bucket each).
    #[serde(default)]
    pub per: Per,
}

/// Check every limit: a plain name, a possible rate, configured channels, a burst
/// that holds the cost of every channel it matches, and a Redis that is not a
/// cluster (`cluster`: a limit's bucket is shared by many recipients, so it is
/// not in the slot of the recipient's keys that the admission's one atomic call
/// runs in).
pub(super) fn validate(
    limits: &BTreeMap<String, LimitSettings>,
    channels: &BTreeMap<String, ChannelSettings>,
    cluster: bool,
) -> Result<(), ConfigError> {
    for (name, l) in limits {
        let path = format!("limits.{name}");
        if cluster {
            return Err(invalid(
                path,
                "limits need a single Redis node or Sentinel: a limit's bucket is shared \
                 by many recipients, so on a Redis Cluster it is not in the hash slot of \
                 the recipient's keys that the admission checks in one atomic call",
            ));
        }
        let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if name.is_empty() || name.len() > 64 || !name.chars().all(plain) {
            return Err(invalid(
                path,
                "limit names are 1 to 64 characters of a-z, A-Z, 0-9, `_` and `-`",
            ));
        }
        let rate = gcra(&path, l.rate, l.period, l.burst, 1)?;
        for c in l.matches.channels.iter().flatten() {
            if !channels.contains_key(c) {
                return Err(invalid(
                    format!("{path}.match.channels"),
                    format!("channel `{c}` is not configured"),
                ));
            }
        }
        let matched = |c: &String| l.matches.channels.as_ref().is_none_or(|m| m.contains(c));
        for (c, settings) in channels.iter().filter(|(c, _)| matched(c)) {
            if settings.cost > rate.burst {
                return Err(invalid(
                    format!("{path}.burst"),
                    format!(
                        "a burst of {} can never admit a job of channel `{c}`, whose cost \
                         is {} (channels.{c}.cost)",
                        rate.burst, settings.cost
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The limit named `name`, as the store works with it (validated settings).
pub(super) fn build(name: &str, l: &LimitSettings) -> Option<Limit> {
    let rate = gcra(&format!("limits.{name}"), l.rate, l.period, l.burst, 1).ok()?;
    Some(Limit {
        name: name.to_string(),
        rate,
        per: l.per,
        channels: l.matches.channels.clone(),
        categories: l.matches.categories.clone(),
        tenants: l.matches.tenants.clone(),
        quota: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn per_sender(rate: u64, burst: Option<u64>) -> LimitSettings {
        LimitSettings {
            rate,
            period: Some(Dur(Duration::from_secs(1))),
            burst,
            per: Per::Sender,
            ..LimitSettings::default()
        }
    }

    #[test]
    fn a_bad_limit_is_refused_naming_its_key() {
        let sms = ChannelSettings {
            cost: 2,
            ..ChannelSettings::default()
        };
        let channels = BTreeMap::from([("sms".to_string(), sms)]);
        let key = |name: &str, l: LimitSettings, cluster: bool| {
            let limits = BTreeMap::from([(name.to_string(), l)]);
            validate(&limits, &channels, cluster)
                .err()
                .and_then(|e| e.key().map(str::to_string))
        };
        assert_eq!(key("ok", per_sender(1, Some(2)), false), None);
        assert_eq!(
            key("ok", per_sender(0, Some(2)), false).as_deref(),
            Some("limits.ok.rate")
        );
        assert_eq!(
            key("a b", per_sender(1, Some(2)), false).as_deref(),
            Some("limits.a b")
        );
        // the channel's cost of 2 never fits a burst of 1
        assert_eq!(
            key("small", per_sender(1, None), false).as_deref(),
            Some("limits.small.burst")
        );
        let mut fax = per_sender(1, Some(2));
        fax.matches.channels = Some(vec!["fax".into()]);
        assert_eq!(
            key("f", fax, false).as_deref(),
            Some("limits.f.match.channels")
        );
        assert_eq!(
            key("ok", per_sender(1, Some(2)), true).as_deref(),
            Some("limits.ok")
        );
    }

    #[test]
    fn a_limit_is_built_as_written() {
        let l = build("twilio", &per_sender(3, Some(3))).unwrap();
        assert_eq!(l.rate.interval_us, 333_334);
        assert_eq!(l.rate.burst, 3);
        assert_eq!(l.per, Per::Sender);
    }
}
