//! Configuration: one typed struct, read from the built-in defaults
//! (`config/default.toml`), an optional file, and `QUOTA_WORKER__SECTION__KEY`
//! environment variables, in that order. [`Settings::load`] validates everything
//! and names the offending key in its error, and where its value was set (the
//! file and line, or the variable), so a bad configuration stops the worker at
//! start with a message that points at the fix. The printed form ([`Settings`]'s
//! `Display`, what `config check` shows) is TOML with secrets redacted.
//!
//! One file per section, each with its type, its checks and its tests: `amqp`,
//! `redis` (with Sentinel), `worker`, `http`, `policies` (built into
//! [`crate::quota::policy::Policy`]), `channels` (their rates built into
//! [`crate::quota::policy::Rate`]), `caps` (built into [`crate::quota::caps::Cap`])
//! and `tenants` (overrides of policies and caps). Around them: how durations, zones and windows
//! are written (`text`), the environment and `_FILE` layer (`env`), where a key
//! was set (`locate`), the errors (`error`), what `config check` prints (`report`)
//! and what a reload cannot change (`restart`). The settings are data; the only
//! I/O is reading the files they name.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

mod amqp;
mod caps;
mod channels;
mod console;
mod digest;
mod endpoint;
mod env;
mod error;
mod fallback;
mod feedback;
mod http;
mod lanes;
mod limits;
mod locate;
mod policies;
mod redis;
mod report;
mod restart;
mod telemetry;
mod tenants;
#[cfg(test)]
mod tests;
mod text;
mod worker;

pub use amqp::{AmqpSettings, QueueType};
pub use caps::{CapScope, CapSettings, MatchSettings};
pub use channels::ChannelSettings;
pub use console::ConsoleSettings;
pub use digest::DigestSettings;
pub use endpoint::Endpoint;
pub use env::{is_secret_key, ENV_PREFIX, SECRET_KEYS};
pub use error::ConfigError;
pub use fallback::FallbackSettings;
pub use feedback::{FeedbackSettings, SuppressionSettings};
pub use http::{HttpSettings, ADMIN_TOKEN_NAME};
pub use lanes::{LanePrefetch, LaneSettings};
pub use limits::{LimitSettings, WarmupSettings};
pub use locate::Origin;
pub use policies::{PolicySettings, RuleSettings};
pub use redis::{OnReset, RedisSettings, SentinelSettings};
pub use report::redact_url;
pub(crate) use restart::needs_restart;
pub use telemetry::{TelemetrySettings, TraceParent, SAMPLERS};
pub use tenants::TenantSettings;
pub use text::Dur;
pub use worker::WorkerSettings;

use crate::quota::policy::{Policy, Rate};
use crate::quota::send_windows::SendWindows;
use error::from_serde;

/// The built-in defaults: the commented file shipped in `config/default.toml`.
pub(crate) const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// The built-in `redis.hash_key`: public, so it protects nothing (see
/// [`Settings::warnings`]).
pub const DEFAULT_HASH_KEY: &str = "quota-worker-default-key";

/// What `config check` prints in place of a secret. Refused as a value, so a printed
/// configuration loaded back fails loudly instead of hashing with another key.
pub(crate) const REDACTED: &str = "<redacted>";

/// The whole configuration.
///
/// One field per section of the file (`[amqp]`, `[redis]`, …), each a type of
/// its own file with its own validation: it mirrors the file's shape, so it has
/// as many fields as the file has sections.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The broker and the topology on it (`[amqp]`).
    pub amqp: AmqpSettings,
    /// Redis, where the sends are recorded (`[redis]`).
    pub redis: RedisSettings,
    /// The worker process (`[worker]`).
    pub worker: WorkerSettings,
    /// The status, metrics, health and reload endpoints (`[http]`).
    pub http: HttpSettings,
    /// The operators' console under `/console` (`[console]`).
    pub console: ConsoleSettings,
    /// The policies by name (`[policies.NAME]`); a `default` one is required.
    pub policies: BTreeMap<String, PolicySettings>,
    /// The channels by name (`[channels.NAME]`); at least one.
    pub channels: BTreeMap<String, ChannelSettings>,
    /// Where jobs that wait for their channel's rate wait, by priority (`[lanes]`).
    pub lanes: LaneSettings,
    /// Feedback from the senders (`[feedback]`) and suppressions (`[suppression]`).
    pub feedback: FeedbackSettings,
    /// How long a bounce suppresses (`[suppression]`).
    pub suppression: SuppressionSettings,
    /// Where spans are exported, and how (`[telemetry]`); off by default.
    pub telemetry: TelemetrySettings,
    /// The caps by name (`[caps.NAME]`), checked for every job they match in
    /// addition to its policy; none by default.
    #[serde(default)]
    pub caps: BTreeMap<String, CapSettings>,
    /// The limits by name (`[limits.NAME]`): GCRA buckets over the jobs they
    /// match, one for all, per tenant or per sender; none by default.
    #[serde(default)]
    pub limits: BTreeMap<String, LimitSettings>,
    /// Per-tenant overrides of policies and caps (`[tenants.NAME]`); none by default.
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantSettings>,
}

impl Settings {
    /// Read defaults, then `file` (if any), then the environment, and validate.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_with_env(file, config::Environment::with_prefix(ENV_PREFIX))
    }

    /// The built-in defaults alone (no file, no environment).
    pub fn defaults() -> Settings {
        Self::load_from_vars(None, Vec::new()).expect("config/default.toml is valid")
    }

    /// These settings with every name the worker gives the broker and Redis
    /// (exchanges, queues, the delay ladder, the key prefix) starting with `ns`: one
    /// deployment's topology beside another's on the same broker and Redis (tests
    /// and the benchmark run each in a namespace of its own).
    pub fn in_namespace(mut self, ns: &str) -> Settings {
        let a = &mut self.amqp;
        a.jobs_exchange = format!("{ns}.jobs");
        a.jobs_queue = format!("{ns}.jobs");
        a.dispatch_exchange = format!("{ns}.dispatch");
        a.dispatch_queue_prefix = format!("{ns}.dispatch.");
        a.dead_exchange = format!("{ns}.dead");
        a.dead_queue = format!("{ns}.dead");
        a.delay_prefix = format!("{ns}.delay");
        self.feedback.exchange = format!("{ns}.feedback");
        self.feedback.queue = format!("{ns}.feedback");
        self.redis.key_prefix = ns.to_string();
        self.lanes.exchange = format!("{ns}.lanes");
        self.lanes.queue_prefix = format!("{ns}.lanes.");
        self
    }

    /// As [`Settings::load`], with the environment given as variables
    /// (`QUOTA_WORKER__SECTION__KEY`, value) instead of read from the process.
    pub fn load_from_vars(
        file: Option<&Path>,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let map = vars.into_iter().collect();
        Self::load_with_env(
            file,
            config::Environment::with_prefix(ENV_PREFIX).source(Some(map)),
        )
    }

    /// As [`Settings::load`], with the environment source given.
    fn load_with_env(
        file: Option<&Path>,
        env: config::Environment,
    ) -> Result<Settings, ConfigError> {
        let text =
            match file {
                Some(path) => Some(std::fs::read_to_string(path).map_err(|cause| {
                    ConfigError::Unreadable {
                        path: path.to_path_buf(),
                        cause,
                    }
                })?),
                None => None,
            };
        let env = env::EnvValues::read(&env::layout(env))?;
        let sources = locate::Sources::new(file.zip(text.as_deref()), env.origins.clone())?;
        Self::merge(text.as_deref(), env.values).map_err(|e| sources.attach(e))
    }

    /// Defaults, then the file's text, then the environment; deserialized and validated.
    fn merge(
        file: Option<&str>,
        env: Vec<(String, config::Value)>,
    ) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder().add_source(config::File::from_str(
            DEFAULT_TOML,
            config::FileFormat::Toml,
        ));
        if let Some(text) = file {
            builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
        }
        for (key, value) in env {
            builder = builder.set_override(key, value)?;
        }
        let merged = builder.build()?;
        let settings: Settings = serde_path_to_error::deserialize(merged).map_err(from_serde)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Check every value that parsing alone cannot, section by section; the first
    /// refused value is the error (the broker's names before Redis's, both before
    /// the connections, then the rest in the order of the sections).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.amqp.validate_values()?;
        self.redis.validate_names()?;
        self.amqp.endpoints()?;
        self.redis.validate_servers()?;
        self.worker.validate()?;
        self.http.validate()?;
        self.console.validate()?;
        self.feedback.validate()?;
        self.suppression.validate()?;
        self.telemetry.validate()?;
        policies::validate(&self.policies, self.redis.record_ttl.0)?;
        channels::validate(&self.channels)?;
        self.lanes.validate(&self.channels)?;
        caps::validate(&self.caps, &self.channels)?;
        limits::validate(&self.limits, &self.channels, self.redis.cluster)?;
        if let Some(name) = self.caps.iter().find(|(_, c)| c.scope.quota().is_some()) {
            if self.redis.cluster {
                return Err(error::invalid(
                    format!("caps.{}.scope", name.0),
                    "a cap with scope `tenant` or `sender` needs a single Redis node or \
                     Sentinel: its counter is shared by many recipients, so on a Redis Cluster \
                     it is not in the hash slot of the recipient's keys that the admission \
                     checks in one atomic call",
                ));
            }
        }
        tenants::validate(
            &self.tenants,
            &self.policies,
            &self.caps,
            &self.channels,
            self.redis.record_ttl.0,
        )
    }

    /// The broker URLs the worker connects to, in the order it tries them:
    /// `amqp.urls` when set, else `amqp.url`.
    pub fn amqp_urls(&self) -> Vec<&str> {
        self.amqp.connect_urls()
    }

    /// The broker URLs ([`Settings::amqp_urls`]), parsed, with their TLS settings
    /// checked (files read): an `amqps://` URL whose TLS cannot be set up, TLS keys
    /// with `amqp://` URLs, and a list mixing both, are errors naming the key.
    pub(crate) fn amqp_endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        self.amqp.endpoints()
    }

    /// The Redis URLs (`redis.url`, or `redis.cluster_urls` with `cluster = true`),
    /// parsed and checked as [`Settings::amqp_endpoints`] does.
    pub(crate) fn redis_endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        self.redis.endpoints()
    }

    /// Every policy, with its rules as read.
    pub fn policies(&self) -> Vec<Policy> {
        self.policies
            .iter()
            .map(|(name, p)| policies::build(name, p))
            .collect()
    }

    /// Every cap, as read.
    pub fn caps(&self) -> Vec<crate::quota::caps::Cap> {
        self.caps
            .iter()
            .filter(|(_, c)| c.scope.quota().is_none())
            .map(|(name, c)| caps::build(name, c))
            .collect()
    }

    /// Every limit, as read (validated settings), then the quotas (caps with
    /// `scope = "tenant"` or `"sender"`), which the admission takes with them.
    pub fn limits(&self) -> Vec<crate::quota::limits::Limit> {
        let limits = self
            .limits
            .iter()
            .filter_map(|(name, l)| limits::build(name, l));
        let quotas = self.caps.iter().flat_map(|(name, c)| caps::quotas(name, c));
        limits.chain(quotas).collect()
    }

    /// The zone of `tenant`'s calendar (`[tenants.NAME] timezone`, else
    /// `worker.default_timezone`).
    pub fn tenant_zone(&self, tenant: &str) -> chrono_tz::Tz {
        self.tenants
            .get(tenant)
            .and_then(|t| t.timezone.as_deref())
            .and_then(|z| z.parse().ok())
            .unwrap_or(self.worker.default_timezone)
    }

    /// A tenant's overrides, built: its policies and its caps.
    pub fn tenant_overrides(&self, tenant: &str) -> (Vec<Policy>, Vec<crate::quota::caps::Cap>) {
        let Some(t) = self.tenants.get(tenant) else {
            return Default::default();
        };
        let p = t
            .policies
            .iter()
            .map(|(n, p)| policies::build(n, p))
            .collect();
        let c = t.caps.iter().map(|(n, c)| caps::build(n, c)).collect();
        (p, c)
    }

    /// A channel's send windows; `None` when it has none (or is not configured).
    pub(crate) fn channel_windows(&self, channel: &str) -> Option<&SendWindows> {
        self.channels.get(channel)?.send_windows.as_ref()
    }

    /// A channel's send rate; `None` when it is not paced (or not configured).
    pub fn rate(&self, channel: &str) -> Option<Rate> {
        let c = self.channels.get(channel)?;
        channels::rate(channel, c).ok().flatten()
    }

    /// How a paced channel's lanes share its rate; `None` when it is not paced.
    pub fn lane_rate(&self, channel: &str) -> Option<crate::lanes::share::LaneRate> {
        let c = self.channels.get(channel)?;
        let rate = self.rate(channel)?;
        Some(crate::lanes::share::LaneRate::new(
            rate,
            c.reserve,
            c.normal_share,
        ))
    }
}
