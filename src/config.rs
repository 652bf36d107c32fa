//! Configuration: one typed struct, read from the built-in defaults
//! (`config/default.toml`), an optional file, and `QUOTA_WORKER__SECTION__KEY`
//! environment variables, in that order. [`Settings::load`] validates everything
//! and names the offending key in its error, and where its value was set (the
//! file and line, or the variable), so a bad configuration stops the worker at
//! start with a message that points at the fix. The printed form ([`Settings`]'s
//! `Display`, what `config check` shows) is TOML with secrets redacted.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use chrono_tz::Tz;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::window::{Rule, Window};

mod locate;
pub use locate::Origin;

/// The built-in defaults: the commented file shipped in `config/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "QUOTA_WORKER";

/// A configuration that could not be read or is not valid.
///
/// Errors about one key name it (dotted, e.g. `channels.sms.rate`) and, wrapped in
/// [`ConfigError::At`], where its value was set: the line of the `--config` file,
/// the environment variable, or the line of the built-in defaults.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file given with `--config` could not be read.
    #[error("cannot read configuration file {}: {cause}", path.display())]
    Unreadable {
        /// The file as given.
        path: PathBuf,
        /// Why (missing, a directory, not UTF-8, permissions).
        cause: std::io::Error,
    },
    /// The file given with `--config` is not valid TOML.
    #[error("{}:{line}:{column}: not valid TOML: {message}", path.display())]
    Syntax {
        /// The file as given.
        path: PathBuf,
        /// Line of the error (1-based).
        line: usize,
        /// Column of the error (1-based, in characters).
        column: usize,
        /// What the TOML parser expected.
        message: String,
    },
    /// An environment variable could not be read, or the sources not merged.
    #[error(transparent)]
    Read(#[from] config::ConfigError),
    /// A key that is not part of the configuration.
    #[error("unknown key `{key}`: {reason}")]
    Unknown {
        /// Dotted path of the key.
        key: String,
        /// The keys allowed there.
        reason: String,
    },
    /// A value was read but is not acceptable.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the key, e.g. `channels.sms.rate`.
        key: String,
        /// Why it is refused.
        reason: String,
    },
    /// An error about one key, with where that key was set.
    #[error("{origin}: {error}")]
    At {
        /// The file line, environment variable or default that set the key.
        origin: Origin,
        /// The error.
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The dotted key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Unknown { key, .. } | ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::At { error, .. } => error.key(),
            _ => None,
        }
    }

    /// Where the key the error is about was set, when known.
    pub fn origin(&self) -> Option<&Origin> {
        match self {
            ConfigError::At { origin, .. } => Some(origin),
            _ => None,
        }
    }
}

/// A deserialization error, named by the path serde was at.
fn from_serde(e: serde_path_to_error::Error<config::ConfigError>) -> ConfigError {
    let key = e.path().to_string();
    if key == "." {
        return ConfigError::Read(e.into_inner());
    }
    // A missing field: the `config` crate names it by its whole path, glued to
    // the path of its table (`policies.x.rules[0]window`).
    if let config::ConfigError::NotFound(full) = e.inner() {
        let field = full.strip_prefix(key.as_str()).unwrap_or(full);
        let field = field.trim_start_matches('.');
        return ConfigError::Invalid {
            key: format!("{key}.{field}"),
            reason: "required, and not set (it has no default)".into(),
        };
    }
    let reason = core_message(e.inner());
    if reason.starts_with("unknown field") {
        ConfigError::Unknown { key, reason }
    } else {
        ConfigError::Invalid { key, reason }
    }
}

/// The `config` crate's message without the key and origin it appends (the path
/// from serde names the key; [`Origin`] says where it was set).
fn core_message(e: &config::ConfigError) -> String {
    match e {
        config::ConfigError::Type {
            unexpected,
            expected,
            ..
        } => format!("invalid type: {unexpected}, expected {expected}"),
        config::ConfigError::At { error, .. } => core_message(error),
        other => other.to_string(),
    }
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// A duration written as `"500ms"`, `"30s"`, `"10m"` or `"24h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match Window::from_str(&text) {
            Ok(Window::Rolling(d)) => d
                .to_std()
                .map(Dur)
                .map_err(|_| serde::de::Error::custom(format!("`{text}` is not a duration"))),
            Ok(Window::CalendarDays(_)) => Err(serde::de::Error::custom(format!(
                "`{text}` is a calendar window; write a duration such as \"30s\", \"10m\" or \"24h\""
            ))),
            Err(e) => Err(serde::de::Error::custom(e)),
        }
    }
}

impl Serialize for Dur {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let w = chrono::Duration::from_std(self.0).map_err(serde::ser::Error::custom)?;
        s.collect_str(&Window::Rolling(w))
    }
}

/// Broker settings (`[amqp]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    pub url: String,
    pub jobs_exchange: String,
    pub jobs_queue: String,
    pub dispatch_exchange: String,
    pub dispatch_queue_prefix: String,
    pub dead_exchange: String,
    pub dead_queue: String,
    pub delay_prefix: String,
    pub delay_levels: u32,
    pub queue_type: QueueType,
    pub prefetch: u16,
    pub delivery_limit: u32,
    pub publish_timeout: Dur,
}

/// Queue type of the jobs and delay queues.
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueType {
    Quorum,
    Classic,
}

/// Redis settings (`[redis]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    pub cluster: bool,
    pub cluster_urls: Vec<String>,
    pub key_prefix: String,
    pub hash_key: String,
    pub dedupe_window: Dur,
    pub reservation_lease: Dur,
}

/// Worker settings (`[worker]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    pub default_timezone: String,
    pub max_body_bytes: usize,
    pub shutdown_grace: Dur,
    /// Threads of the async runtime that runs `quota-worker run` (1: everything on
    /// the main thread).
    pub threads: usize,
}

/// HTTP endpoint settings (`[http]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub enabled: bool,
    pub listen: String,
}

/// One rule as written in the file: `{ limit = 1, window = "1d" }`.
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSettings {
    pub limit: u32,
    pub window: String,
}

/// What counts toward a policy's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// All of a recipient's jobs under the policy, whatever the channel.
    #[default]
    Recipient,
    /// A recipient's jobs under the policy on one channel.
    Channel,
}

/// What happens to a job its recipient's caps refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Hold it until the first instant it is allowed.
    #[default]
    Delay,
    /// Dead-letter it with reason `capped`.
    Drop,
}

/// A policy as written in the file (`[policies.NAME]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    #[serde(default)]
    pub rules: Vec<RuleSettings>,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub action: Action,
}

/// A channel (`[channels.NAME]`), with an optional GCRA send rate.
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ChannelSettings {
    pub rate: Option<u64>,
    pub period: Option<Dur>,
    pub burst: Option<u64>,
    #[serde(default = "one")]
    pub cost: u64,
}

fn one() -> u64 {
    1
}

/// The whole configuration.
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub amqp: AmqpSettings,
    pub redis: RedisSettings,
    pub worker: WorkerSettings,
    pub http: HttpSettings,
    pub policies: BTreeMap<String, PolicySettings>,
    pub channels: BTreeMap<String, ChannelSettings>,
}

/// A validated policy, ready for the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Its name (the job category that selects it).
    pub name: String,
    /// Caps; empty means none.
    pub rules: Vec<Rule>,
    /// What the caps count.
    pub scope: Scope,
    /// What happens to a refused job.
    pub action: Action,
}

/// A validated channel send rate: at most `burst` at once, then one every `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// `period / rate`, in microseconds (at least 1).
    pub interval_us: u64,
    /// Jobs that may go at once from a full bucket.
    pub burst: u64,
    /// What one job costs.
    pub cost: u64,
}

impl Settings {
    /// Read defaults, then `file` (if any), then the environment, and validate.
    pub fn load(file: Option<&Path>) -> Result<Settings, ConfigError> {
        Self::load_with_env(file, config::Environment::with_prefix(ENV_PREFIX))
    }

    /// As [`Settings::load`], with the environment source given (tests pass a map).
    pub fn load_with_env(
        file: Option<&Path>,
        env: config::Environment,
    ) -> Result<Settings, ConfigError> {
        use config::Source;
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
        let env = env
            .separator("__")
            .prefix_separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("redis.cluster_urls");
        let env_keys = env.collect()?.into_keys();
        let sources = locate::Sources::new(file.zip(text.as_deref()), env_keys)?;
        Self::merge(text.as_deref(), env).map_err(|e| sources.attach(e))
    }

    /// Defaults, then the file's text, then the environment; deserialized and validated.
    fn merge(file: Option<&str>, env: config::Environment) -> Result<Settings, ConfigError> {
        let mut builder = config::Config::builder().add_source(config::File::from_str(
            DEFAULT_TOML,
            config::FileFormat::Toml,
        ));
        if let Some(text) = file {
            builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
        }
        let merged = builder.add_source(env).build()?;
        let settings: Settings = serde_path_to_error::deserialize(merged).map_err(from_serde)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Check every value that parsing alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.default_zone()?;
        if self.amqp.prefetch == 0 {
            return Err(invalid("amqp.prefetch", "must be at least 1"));
        }
        if !(1..=30).contains(&self.amqp.delay_levels) {
            return Err(invalid("amqp.delay_levels", "must be between 1 and 30"));
        }
        if self.amqp.delivery_limit == 0 {
            return Err(invalid("amqp.delivery_limit", "must be at least 1"));
        }
        for (key, name) in [
            ("amqp.jobs_exchange", &self.amqp.jobs_exchange),
            ("amqp.jobs_queue", &self.amqp.jobs_queue),
            ("amqp.dispatch_exchange", &self.amqp.dispatch_exchange),
            ("amqp.dead_exchange", &self.amqp.dead_exchange),
            ("amqp.dead_queue", &self.amqp.dead_queue),
            ("amqp.delay_prefix", &self.amqp.delay_prefix),
        ] {
            if name.is_empty() || name.len() > 200 {
                return Err(invalid(key, "must be 1 to 200 characters"));
            }
        }
        // the prefix plus a channel name (up to 64) must fit AMQP's 255-byte names
        if self.amqp.dispatch_queue_prefix.len() > 191 {
            return Err(invalid(
                "amqp.dispatch_queue_prefix",
                "must be at most 191 characters",
            ));
        }
        if self.redis.key_prefix.contains(['{', '}']) {
            return Err(invalid("redis.key_prefix", "must not contain `{` or `}`"));
        }
        if self.redis.hash_key.is_empty() {
            return Err(invalid("redis.hash_key", "must not be empty"));
        }
        if self.redis.cluster && self.redis.cluster_urls.is_empty() {
            return Err(invalid(
                "redis.cluster_urls",
                "cluster = true needs at least one URL",
            ));
        }
        if self.redis.reservation_lease.0 < Duration::from_secs(1) {
            return Err(invalid("redis.reservation_lease", "must be at least 1s"));
        }
        if self.worker.max_body_bytes == 0 {
            return Err(invalid("worker.max_body_bytes", "must be at least 1"));
        }
        if self.worker.threads == 0 {
            return Err(invalid("worker.threads", "must be at least 1"));
        }
        if self.http.enabled {
            self.http
                .listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.http.listen)))?;
        }
        if !self.policies.contains_key("default") {
            return Err(invalid(
                "policies.default",
                "a `default` policy is required",
            ));
        }
        self.policies()?;
        if self.channels.is_empty() {
            return Err(invalid("channels", "at least one channel is required"));
        }
        for name in self.channels.keys() {
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(invalid(
                    format!("channels.{name}"),
                    "channel names are 1 to 64 characters of a-z, A-Z, 0-9, `_` and `-`",
                ));
            }
            self.rate(name)?;
        }
        Ok(())
    }

    /// The zone for jobs without one.
    pub fn default_zone(&self) -> Result<Tz, ConfigError> {
        self.worker.default_timezone.parse::<Tz>().map_err(|_| {
            invalid(
                "worker.default_timezone",
                format!(
                    "`{}` is not an IANA time zone",
                    self.worker.default_timezone
                ),
            )
        })
    }

    /// Every policy, validated.
    pub fn policies(&self) -> Result<Vec<Policy>, ConfigError> {
        self.policies
            .iter()
            .map(|(name, p)| {
                let rules = p
                    .rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let key = format!("policies.{name}.rules[{i}]");
                        let window = Window::from_str(&r.window)
                            .map_err(|e| invalid(format!("{key}.window"), e.to_string()))?;
                        if let Window::CalendarDays(d) = window {
                            if d > 366 {
                                return Err(invalid(format!("{key}.window"), "at most 366 days"));
                            }
                        }
                        if let Window::Rolling(d) = window {
                            if d > chrono::Duration::days(366) {
                                return Err(invalid(format!("{key}.window"), "at most 366 days"));
                            }
                        }
                        Ok(Rule {
                            limit: r.limit,
                            window,
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Policy {
                    name: name.clone(),
                    rules,
                    scope: p.scope,
                    action: p.action,
                })
            })
            .collect()
    }

    /// A channel's send rate, `None` when it is not paced.
    pub fn rate(&self, channel: &str) -> Result<Option<Rate>, ConfigError> {
        let Some(c) = self.channels.get(channel) else {
            return Err(invalid(format!("channels.{channel}"), "no such channel"));
        };
        let key = |k: &str| format!("channels.{channel}.{k}");
        let Some(rate) = c.rate else {
            if c.period.is_some() || c.burst.is_some() {
                return Err(invalid(key("rate"), "`period` and `burst` need a `rate`"));
            }
            return Ok(None);
        };
        if rate == 0 {
            return Err(invalid(
                key("rate"),
                "must be at least 1 (leave it out for no limit)",
            ));
        }
        let period = c.period.map(|d| d.0).unwrap_or(Duration::from_secs(1));
        if period.is_zero() {
            return Err(invalid(key("period"), "must be longer than 0"));
        }
        let burst = c.burst.unwrap_or(1);
        if burst == 0 {
            return Err(invalid(key("burst"), "must be at least 1"));
        }
        if c.cost > burst {
            return Err(invalid(
                key("cost"),
                format!("a cost of {} can never pass a burst of {burst}", c.cost),
            ));
        }
        // Redis's Lua numbers are doubles, exact to 2^53 µs (about 285 years, of
        // which the current time takes 56): keep the bucket well inside that.
        const MAX_BUCKET_US: u64 = 100 * 366 * 86_400 * 1_000_000;
        if period.as_micros() > MAX_BUCKET_US as u128 {
            return Err(invalid(key("period"), "must be at most 100 years"));
        }
        let interval_us = (period.as_micros() as u64).div_ceil(rate).max(1);
        if interval_us
            .checked_mul(burst)
            .is_none_or(|bucket| bucket > MAX_BUCKET_US)
        {
            return Err(invalid(
                key("burst"),
                format!(
                    "a burst of {burst} at one per {interval_us} µs is a bucket of over 100 years, \
                     more than Redis's Lua numbers hold exactly"
                ),
            ));
        }
        Ok(Some(Rate {
            interval_us,
            burst,
            cost: c.cost,
        }))
    }

    /// The settings with secrets replaced, for printing.
    pub fn redacted(&self) -> Settings {
        let mut s = self.clone();
        s.amqp.url = redact_url(&s.amqp.url);
        s.redis.url = redact_url(&s.redis.url);
        s.redis.cluster_urls = s.redis.cluster_urls.iter().map(|u| redact_url(u)).collect();
        s.redis.hash_key = "<redacted>".into();
        s
    }
}

/// Replace the password of `scheme://user:password@host` with `***`.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((userinfo, host)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    match userinfo.split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***@{host}"),
        None => url.to_string(),
    }
}

/// The effective configuration as TOML, secrets redacted (what `config check` prints).
/// The output is itself a valid configuration file.
impl fmt::Display for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = toml::to_string_pretty(&self.redacted()).map_err(|_| fmt::Error)?;
        f.write_str(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> config::Environment {
        let map = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        config::Environment::with_prefix(ENV_PREFIX).source(Some(map))
    }

    #[test]
    fn defaults_are_valid_and_as_documented() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        assert_eq!(s.amqp.url, "amqp://guest:guest@127.0.0.1:5672/%2f");
        assert_eq!(s.redis.url, "redis://127.0.0.1:6379");
        assert_eq!(
            s.channels.keys().collect::<Vec<_>>(),
            ["email", "push", "sms"]
        );
        let policies = s.policies().unwrap();
        let default = policies.iter().find(|p| p.name == "default").unwrap();
        assert_eq!(
            default.rules,
            vec![
                Rule {
                    limit: 1,
                    window: Window::CalendarDays(1)
                },
                Rule {
                    limit: 3,
                    window: Window::CalendarDays(7)
                }
            ]
        );
        let transactional = policies.iter().find(|p| p.name == "transactional").unwrap();
        assert!(transactional.rules.is_empty());
        assert_eq!(s.rate("sms").unwrap(), None);
    }

    #[test]
    fn environment_overrides_the_file() {
        let s = Settings::load_with_env(
            None,
            env(&[
                ("QUOTA_WORKER__REDIS__URL", "redis://10.0.0.1:6380"),
                ("QUOTA_WORKER__AMQP__PREFETCH", "32"),
                ("QUOTA_WORKER__CHANNELS__SMS__RATE", "10"),
            ]),
        )
        .unwrap();
        assert_eq!(s.redis.url, "redis://10.0.0.1:6380");
        assert_eq!(s.amqp.prefetch, 32);
        assert_eq!(
            s.rate("sms").unwrap(),
            Some(Rate {
                interval_us: 100_000,
                burst: 1,
                cost: 1
            })
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (vars, key) in [
            (
                vec![("QUOTA_WORKER__WORKER__DEFAULT_TIMEZONE", "Mars/Olympus")],
                "worker.default_timezone",
            ),
            (
                vec![("QUOTA_WORKER__CHANNELS__SMS__RATE", "0")],
                "channels.sms.rate",
            ),
            (
                vec![
                    ("QUOTA_WORKER__CHANNELS__SMS__RATE", "5"),
                    ("QUOTA_WORKER__CHANNELS__SMS__BURST", "0"),
                ],
                "channels.sms.burst",
            ),
            (vec![("QUOTA_WORKER__AMQP__PREFETCH", "0")], "amqp.prefetch"),
            (
                vec![("QUOTA_WORKER__REDIS__RESERVATION_LEASE", "1d")],
                "reservation_lease",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&vars))
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err} should name {key}");
        }
    }

    #[test]
    fn errors_in_a_file_carry_its_path_and_line() {
        let path = std::env::temp_dir().join(format!("qw-config-{}.toml", std::process::id()));
        std::fs::write(&path, "[amqp]\nprefetch = 8\n\n[channels.sms]\nrate = 0\n").unwrap();
        let err = Settings::load_with_env(Some(&path), env(&[])).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(err.key(), Some("channels.sms.rate"));
        assert_eq!(
            err.origin(),
            Some(&Origin::File {
                path: path.clone(),
                line: 5
            })
        );
        assert!(err
            .to_string()
            .starts_with(&format!("{}:5: ", path.display())));
    }

    #[test]
    fn errors_from_the_environment_name_the_variable() {
        let err = Settings::load_with_env(None, env(&[("QUOTA_WORKER__AMQP__PREFETCH", "0")]))
            .unwrap_err();
        assert_eq!(
            err.origin(),
            Some(&Origin::Env {
                var: "QUOTA_WORKER__AMQP__PREFETCH".into()
            })
        );
    }

    #[test]
    fn display_is_a_valid_configuration_file() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        let text = s.to_string();
        let path = std::env::temp_dir().join(format!("qw-display-{}.toml", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        let again = Settings::load_with_env(Some(&path), env(&[]));
        std::fs::remove_file(&path).unwrap();
        let again = again.unwrap();
        assert_eq!(again.to_string(), text);
        assert_eq!(again.amqp.url, "amqp://guest:***@127.0.0.1:5672/%2f");
    }

    #[test]
    fn redaction_hides_passwords() {
        assert_eq!(
            redact_url("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:***@host:5672/%2f"
        );
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        let shown = s.to_string();
        assert!(!shown.contains("guest:guest"));
        assert!(!shown.contains("quota-worker-default-key"));
    }
}
