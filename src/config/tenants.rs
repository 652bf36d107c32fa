//! The tenants (`[tenants.NAME]`): per tenant, overrides of named policies and caps
//! (`[tenants.acme.policies.promotions]`, `[tenants.acme.caps.daily_total]`), each a
//! whole definition that replaces the shared one for that tenant's jobs. A tenant
//! need not be written here to be used: a job's `tenant` is an open set, and a
//! tenant without a section meets the shared policies and caps.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::caps::{self, CapSettings};
use super::error::{invalid, ConfigError};
use super::policies::{self, PolicySettings};
use super::ChannelSettings;
use quota_worker_producer::decode::MAX_TENANT_CHARS;

/// One tenant's overrides (`[tenants.NAME]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TenantSettings {
    /// The tenant's weight among the tenants whose jobs wait in one lane of a paced
    /// channel: each gets a share of the lane proportional to it (1 to
    /// [`MAX_WEIGHT`]; default 1). Changed by a reload.
    #[serde(default = "one")]
    pub weight: u32,
    /// Policies that replace the shared ones of the same name for this tenant's
    /// jobs; each must name a policy of `[policies]`.
    #[serde(default)]
    pub policies: BTreeMap<String, PolicySettings>,
    /// Caps that replace the shared ones of the same name for this tenant's jobs;
    /// each must name a cap of `[caps]`.
    #[serde(default)]
    pub caps: BTreeMap<String, CapSettings>,
    /// The IANA zone of the tenant's calendar: the days and months its quotas
    /// (caps with `scope = "tenant"` or `"sender"`) count in; unset:
    /// `worker.default_timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

/// The largest `weight`.
pub const MAX_WEIGHT: u32 = 1000;

fn one() -> u32 {
    1
}

impl Default for TenantSettings {
    fn default() -> Self {
        TenantSettings {
            weight: 1,
            policies: BTreeMap::new(),
            caps: BTreeMap::new(),
            timezone: None,
        }
    }
}

/// Check every tenant: a name of 1 to 64 characters, and overrides of policies and
/// caps that exist, each valid as its shared section would be.
pub(super) fn validate(
    tenants: &BTreeMap<String, TenantSettings>,
    shared_policies: &BTreeMap<String, PolicySettings>,
    shared_caps: &BTreeMap<String, CapSettings>,
    channels: &BTreeMap<String, ChannelSettings>,
    record_ttl: Duration,
) -> Result<(), ConfigError> {
    for (tenant, t) in tenants {
        let chars = tenant.chars().count();
        if chars == 0 || chars > MAX_TENANT_CHARS {
            return Err(invalid(
                format!("tenants.{tenant}"),
                format!("tenant names are 1 to {MAX_TENANT_CHARS} characters"),
            ));
        }
        if t.weight == 0 || t.weight > MAX_WEIGHT {
            return Err(invalid(
                format!("tenants.{tenant}.weight"),
                format!("must be from 1 to {MAX_WEIGHT}, not {}", t.weight),
            ));
        }
        for name in t.policies.keys() {
            if !shared_policies.contains_key(name) {
                return Err(invalid(
                    format!("tenants.{tenant}.policies.{name}"),
                    format!(
                        "there is no policy `{name}` to override (policies: {})",
                        shared_policies
                            .keys()
                            .cloned()
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
        }
        policies::validate_each(&t.policies, record_ttl, &format!("tenants.{tenant}."))?;
        for (name, cap) in &t.caps {
            let path = format!("tenants.{tenant}.caps.{name}");
            if !shared_caps.contains_key(name) {
                let names: Vec<String> = shared_caps.keys().cloned().collect();
                return Err(invalid(
                    path,
                    format!(
                        "there is no cap `{name}` to override (caps: {})",
                        if names.is_empty() {
                            "none".to_string()
                        } else {
                            names.join(", ")
                        }
                    ),
                ));
            }
            caps::validate_one(&path, name, cap, channels)?;
            let quota = |c: &CapSettings| c.scope.quota().is_some();
            if quota(cap) || shared_caps.get(name).is_some_and(quota) {
                return Err(invalid(
                    path,
                    "a cap with scope `tenant` or `sender` is not overridden per tenant: \
                     write one that matches the tenant (`match = { tenants = [...] }`)",
                ));
            }
        }
        if let Some(zone) = &t.timezone {
            if zone.parse::<chrono_tz::Tz>().is_err() {
                return Err(invalid(
                    format!("tenants.{tenant}.timezone"),
                    format!("`{zone}` is not an IANA time zone"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_overrides_only_what_exists() {
        let day = Duration::from_secs(86_400);
        let shared = BTreeMap::from([("default".to_string(), PolicySettings::default())]);
        let channels = BTreeMap::from([("sms".to_string(), ChannelSettings::default())]);
        let key = |t: TenantSettings, name: &str| {
            let tenants = BTreeMap::from([(name.to_string(), t)]);
            validate(&tenants, &shared, &BTreeMap::new(), &channels, day)
                .err()
                .and_then(|e| e.key().map(str::to_string))
        };
        let of_policy = |name: &str| TenantSettings {
            policies: BTreeMap::from([(name.to_string(), PolicySettings::default())]),
            ..TenantSettings::default()
        };
        assert_eq!(key(of_policy("default"), "acme"), None);
        assert_eq!(
            key(of_policy("promo"), "acme").as_deref(),
            Some("tenants.acme.policies.promo")
        );
        let of_cap = TenantSettings {
            caps: BTreeMap::from([("daily".to_string(), CapSettings::default())]),
            ..TenantSettings::default()
        };
        assert_eq!(
            key(of_cap, "acme").as_deref(),
            Some("tenants.acme.caps.daily")
        );
        let heavy = TenantSettings {
            weight: 0,
            ..TenantSettings::default()
        };
        assert_eq!(key(heavy, "acme").as_deref(), Some("tenants.acme.weight"));
        assert_eq!(
            key(TenantSettings::default(), &"x".repeat(65)).as_deref(),
            Some(format!("tenants.{}", "x".repeat(65)).as_str())
        );
    }
}
