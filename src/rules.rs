//! The rules in force: the part of the configuration a running worker may change
//! (policies with their rules, windows, `max_wait` and mode; the caps in layers over
//! them; the tenants' overrides; each channel's send rate and windows). The store holds one [`Rules`] behind an atomic pointer; a reload
//! ([`crate::reload`]) builds a new one from the re-read file and swaps it in whole,
//! so a decision sees either the old rules or the new ones, never a mix. Recorded
//! sends live in Redis and are untouched by a swap.

use std::collections::BTreeMap;
use std::sync::Arc;

use std::borrow::Cow;

use crate::config::Settings;
use crate::decide::DelayCause;
use crate::metrics::{JobLabels, JobMetrics};
use crate::quota::caps::{Cap, CapsMode};
use crate::quota::limits::{Limit, Subject};
use crate::quota::policy::{Mode, Policy, Rate, Scope};
use crate::quota::send_windows::SendWindows;

/// What applies to one channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelRules {
    /// Its send rate; `None`: not paced.
    pub rate: Option<Rate>,
    /// Its send windows; `None`: any time.
    pub windows: Option<SendWindows>,
    /// How its lanes share its rate; `None`: not paced.
    pub lanes: Option<crate::lanes::share::LaneRate>,
    /// What one of its jobs takes of the limits it meets when it names no cost
    /// (`channels.NAME.cost`).
    pub cost: u64,
}

impl ChannelRules {
    /// Channel `c`'s rules in `settings` (validated: `c` is configured).
    fn of(settings: &Settings, c: &str) -> ChannelRules {
        ChannelRules {
            rate: settings.rate(c),
            windows: settings.channel_windows(c).cloned(),
            lanes: settings.lane_rate(c),
            cost: settings.channels[c].cost,
        }
    }

    /// Its rate as a job of cost `cost` takes it (its own cost: segments of a
    /// long SMS; `None`: the channel's), with its lanes; `None` when it is not
    /// paced, or the rate never passes that cost (the admission refuses the job).
    pub fn laned_for(&self, cost: Option<u64>) -> Option<(Rate, crate::lanes::share::LaneRate)> {
        let (rate, lanes) = self.rate.zip(self.lanes)?;
        let rate = rate.for_cost(cost);
        (rate.cost <= rate.burst).then_some((rate, lanes))
    }
}

/// The zone of each tenant's calendar, and the default
/// (`worker.default_timezone`).
fn zones(settings: &Settings) -> (BTreeMap<String, chrono_tz::Tz>, chrono_tz::Tz) {
    let named = settings.tenants.keys();
    let zones = named.map(|t| (t.clone(), settings.tenant_zone(t)));
    (zones.collect(), settings.worker.default_timezone)
}

/// One tenant's overrides: its policies by name, and every cap as it applies to the
/// tenant's jobs (the shared ones, with its overrides in their place).
#[derive(Debug, PartialEq)]
struct TenantRules {
    /// Its weight in the fair shares of a lane.
    weight: u32,
    policies: BTreeMap<String, Arc<Policy>>,
    caps: Vec<Arc<Cap>>,
}

/// A cap that a job meets, and whether it may hold the job (`enforce`) or only
/// counts it (the policy's `caps = "count"`, or a shadow cap).
pub type Layer<'a> = (&'a Arc<Cap>, bool);

/// Policies, caps, tenants and channels, as one immutable value.
#[derive(Debug)]
pub struct Rules {
    policies: BTreeMap<String, Arc<Policy>>,
    channels: BTreeMap<String, ChannelRules>,
    /// The caps, by name.
    caps: Vec<Arc<Cap>>,
    tenants: BTreeMap<String, TenantRules>,
    /// The limits (`[limits.NAME]`), in name order, then the quotas (caps with
    /// `scope = "tenant"` or `"sender"`).
    limits: Vec<Arc<Limit>>,
    /// The zone of each tenant's calendar that names one, and the default.
    zones: (BTreeMap<String, chrono_tz::Tz>, chrono_tz::Tz),
    /// The outcome counters by (policy, channel) of these names.
    pub(crate) metrics: JobMetrics,
    /// What each cap of each policy says when it holds a job (the
    /// `x-notify-held-by` header), written once: formatting it for every delayed
    /// job cost more than the rest of the delay (BENCHMARKS.md item 20).
    held_by: Vec<(DelayCause, String)>,
    /// The policies as escalations' steps meet them ([`Rules::of_its_channel`]),
    /// by the address of the policy they are made of (kept alive by `policies`
    /// and `tenants`).
    of_channel: std::sync::Mutex<std::collections::HashMap<usize, Arc<Policy>>>,
}

impl Rules {
    /// The rules `settings` name (validated settings: `default` exists).
    pub fn from_settings(settings: &Settings) -> Rules {
        let policies: BTreeMap<String, Arc<Policy>> = settings
            .policies()
            .into_iter()
            .map(|p| (p.name.clone(), Arc::new(p)))
            .collect();
        let channels: BTreeMap<String, ChannelRules> = settings
            .channels
            .keys()
            .map(|c| (c.clone(), ChannelRules::of(settings, c)))
            .collect();
        let policy_names: Vec<String> = policies.keys().cloned().collect();
        let channel_names: Vec<String> = channels.keys().cloned().collect();
        let caps: Vec<Arc<Cap>> = settings.caps().into_iter().map(Arc::new).collect();
        let tenants: BTreeMap<String, TenantRules> = settings
            .tenants
            .keys()
            .map(|t| {
                let (own_policies, own_caps) = settings.tenant_overrides(t);
                let caps = caps
                    .iter()
                    .map(|c| match own_caps.iter().find(|o| o.name == c.name) {
                        Some(o) => Arc::new(o.clone()),
                        None => c.clone(),
                    })
                    .collect();
                let policies = own_policies
                    .into_iter()
                    .map(|p| (p.name.clone(), Arc::new(p)))
                    .collect();
                let weight = settings.tenants[t].weight;
                (
                    t.clone(),
                    TenantRules {
                        weight,
                        policies,
                        caps,
                    },
                )
            })
            .collect();
        let every_cap = caps.iter().chain(tenants.values().flat_map(|t| &t.caps));
        let cap_causes = every_cap.flat_map(|c| {
            let rules = c.rules.iter().map(|r| Some(*r)).chain([None]);
            rules.map(|rule| DelayCause::Capped {
                cap: c.name.clone(),
                rule,
                seen: 0,
                quiet: false,
            })
        });
        let every_policy = policies
            .values()
            .chain(tenants.values().flat_map(|t| t.policies.values()));
        let held_by = every_policy
            .flat_map(|p| {
                let rules = p.rules.iter().map(|r| Some(*r)).chain([None]);
                rules.map(|rule| DelayCause::Cap {
                    policy: p.name.clone(),
                    rule,
                    seen: 0,
                    quiet: false,
                })
            })
            .chain(cap_causes)
            .map(|cause| {
                let text = cause.to_string();
                (cause, text)
            })
            .collect();
        Rules {
            metrics: JobMetrics::new(&policy_names, &channel_names),
            policies,
            channels,
            caps,
            tenants,
            limits: settings.limits().into_iter().map(Arc::new).collect(),
            zones: zones(settings),
            held_by,
            of_channel: Default::default(),
        }
    }

    /// Every limit, in the order of their names, then the quotas.
    pub fn limits(&self) -> impl Iterator<Item = &Arc<Limit>> {
        self.limits.iter()
    }

    /// The zone of `tenant`'s calendar (its quotas' days and months).
    pub fn tenant_zone(&self, tenant: Option<&str>) -> chrono_tz::Tz {
        tenant
            .and_then(|t| self.zones.0.get(t).copied())
            .unwrap_or(self.zones.1)
    }

    /// The limits that hold a job of `subject`, each with its bucket (see
    /// [`Limit::bucket`]); empty (no allocation) when none is configured.
    pub fn limits_of<'a>(
        &self,
        subject: &Subject<'a>,
    ) -> Vec<(Arc<Limit>, (&'static str, &'a str))> {
        self.limits
            .iter()
            .filter_map(|l| l.bucket(subject).map(|b| (l.clone(), b)))
            .collect()
    }

    /// What holds a job delayed by `cause`, in words (as [`DelayCause`] displays
    /// it; a cap's text is looked up, not formatted).
    pub fn held_by<'a>(&'a self, cause: &DelayCause) -> Cow<'a, str> {
        let known = self.held_by.iter().find(|(c, _)| match (c, cause) {
            (
                DelayCause::Cap {
                    policy: p, rule: r, ..
                },
                DelayCause::Cap {
                    policy,
                    rule,
                    quiet: false,
                    ..
                },
            ) => p == policy && r == rule,
            (
                DelayCause::Capped {
                    cap: p, rule: r, ..
                },
                DelayCause::Capped {
                    cap,
                    rule,
                    quiet: false,
                    ..
                },
            ) => p == cap && r == rule,
            _ => false,
        });
        if let Some((_, text)) = known {
            return Cow::Borrowed(text);
        }
        Cow::Owned(cause.to_string())
    }

    /// Whether some policy in force (shared or a tenant's) has a digest section.
    pub fn has_digests(&self) -> bool {
        self.policies.values().any(|p| p.digest.is_some())
            || self
                .tenants
                .values()
                .any(|t| t.policies.values().any(|p| p.digest.is_some()))
    }

    /// The policy a category selects (an unknown category: `default`).
    pub fn policy(&self, category: &str) -> &Arc<Policy> {
        self.policies
            .get(category)
            .or_else(|| self.policies.get("default"))
            .expect("a default policy is required by validation")
    }

    /// The weight of `tenant` in the fair shares of a lane (1 for a tenant not
    /// configured, and for the jobs without a tenant).
    pub fn tenant_weight(&self, tenant: Option<&str>) -> u32 {
        tenant
            .and_then(|t| self.tenants.get(t))
            .map_or(1, |t| t.weight.max(1))
    }

    /// The policy a job of `category` and `tenant` meets: the category's (an unknown
    /// category: `default`), or the tenant's override of it.
    /// `policy` as an escalation's step meets it (`Request::counted`): as it is
    /// when it counts per channel; else without rules, on its channel's key (which
    /// then records the step, so that it goes out once). One per policy and
    /// rules in force, so that its plans are cached as the policy's are.
    pub fn of_its_channel(&self, policy: &Arc<Policy>) -> Arc<Policy> {
        if policy.scope == Scope::Channel {
            return policy.clone();
        }
        let id = Arc::as_ptr(policy) as usize;
        let mut made = self.of_channel.lock().unwrap_or_else(|e| e.into_inner());
        made.entry(id)
            .or_insert_with(|| {
                let mut p = Policy::clone(policy);
                p.rules.clear();
                p.scope = Scope::Channel;
                Arc::new(p)
            })
            .clone()
    }

    pub fn policy_of(&self, category: &str, tenant: Option<&str>) -> &Arc<Policy> {
        let shared = self.policy(category);
        match tenant.and_then(|t| self.tenants.get(t)) {
            Some(t) => t.policies.get(&shared.name).unwrap_or(shared),
            None => shared,
        }
    }

    /// Whether any cap is configured (without one, no job has layers).
    pub fn has_caps(&self) -> bool {
        !self.caps.is_empty()
    }

    /// Every cap as it applies to `tenant`'s jobs (a job with no tenant, or a tenant
    /// with no overrides: the shared caps).
    pub fn caps_of(&self, tenant: Option<&str>) -> &[Arc<Cap>] {
        match tenant.and_then(|t| self.tenants.get(t)) {
            Some(t) => &t.caps,
            None => &self.caps,
        }
    }

    /// The caps a job of `policy` on `channel`, of `category` and `tenant`, meets, in
    /// name order, each with whether it may hold the job: none when no cap is
    /// configured or the policy's `caps` is `ignore` (no allocation then).
    pub fn layers(
        &self,
        policy: &Policy,
        channel: &str,
        category: &str,
        tenant: Option<&str>,
    ) -> Vec<Layer<'_>> {
        if self.caps.is_empty() || policy.caps == CapsMode::Ignore {
            return Vec::new();
        }
        self.caps_of(tenant)
            .iter()
            .filter(|c| c.matches(channel, category, tenant))
            .map(|c| {
                let holds = policy.caps == CapsMode::Enforce && c.mode == Mode::Enforce;
                (c, holds)
            })
            .collect()
    }

    /// Every policy, by name.
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Policy>> {
        self.policies.values()
    }

    /// A configured channel's rules.
    pub fn channel(&self, name: &str) -> Option<&ChannelRules> {
        self.channels.get(name)
    }

    /// Every channel with its rules, by name.
    pub fn channels(&self) -> impl Iterator<Item = (&String, &ChannelRules)> {
        self.channels.iter()
    }

    /// The labels a job of `policy` on `channel` is counted under.
    pub fn labels(&self, policy: &str, channel: &str) -> JobLabels {
        JobLabels {
            policy: self.policies.keys().position(|p| p == policy),
            channel: self.channels.keys().position(|c| c == channel),
        }
    }

    /// What differs from `before`, one line per policy or channel, for the log of a
    /// reload (empty: nothing changed).
    pub(crate) fn changes_from(&self, before: &Rules) -> Vec<String> {
        let mut out = Vec::new();
        for (name, p) in &self.policies {
            match before.policies.get(name) {
                None => out.push(format!("policy `{name}` added")),
                Some(old) if old != p => out.push(format!("policy `{name}` changed")),
                Some(_) => {}
            }
        }
        for name in before.policies.keys() {
            if !self.policies.contains_key(name) {
                out.push(format!("policy `{name}` removed"));
            }
        }
        for (name, c) in &self.channels {
            if before.channels.get(name) != Some(c) {
                out.push(format!("channel `{name}` changed"));
            }
        }
        for c in &self.caps {
            match before.caps.iter().find(|o| o.name == c.name) {
                None => out.push(format!("cap `{}` added", c.name)),
                Some(old) if old != c => out.push(format!("cap `{}` changed", c.name)),
                Some(_) => {}
            }
        }
        for c in &before.caps {
            if !self.caps.iter().any(|n| n.name == c.name) {
                out.push(format!("cap `{}` removed", c.name));
            }
        }
        for (name, t) in &self.tenants {
            if before.tenants.get(name) != Some(t) {
                out.push(format!("tenant `{name}` changed"));
            }
        }
        for name in before.tenants.keys() {
            if !self.tenants.contains_key(name) {
                out.push(format!("tenant `{name}` removed"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caps_held_by_text_is_looked_up_and_says_what_formatting_it_says() {
        let rules = Rules::from_settings(&Settings::defaults());
        let policy = rules.policy("default").clone();
        assert!(!policy.rules.is_empty());
        let causes = policy.rules.iter().map(|r| Some(*r)).chain([None]);
        for rule in causes {
            let cause = DelayCause::Cap {
                policy: policy.name.clone(),
                rule,
                seen: 7,
                quiet: false,
            };
            let text = rules.held_by(&cause);
            assert!(matches!(text, Cow::Borrowed(_)), "{cause:?}");
            assert_eq!(text, cause.to_string());
        }
        // a policy these rules do not know, and the other causes, are formatted
        for cause in [
            DelayCause::Cap {
                policy: "gone".into(),
                rule: None,
                seen: 0,
                quiet: false,
            },
            DelayCause::Cap {
                policy: policy.name.clone(),
                rule: None,
                seen: 0,
                quiet: true,
            },
            DelayCause::Schedule,
            DelayCause::DispatchRefused,
        ] {
            let text = rules.held_by(&cause);
            assert!(matches!(text, Cow::Owned(_)));
            assert_eq!(text, cause.to_string());
        }
    }
}
