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
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::quota::send_windows::{Opening, SendWindows};
use crate::quota::window::{Rule, Window};

mod locate;
pub use locate::Origin;

/// The built-in defaults: the commented file shipped in `config/default.toml`.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "QUOTA_WORKER";

/// The built-in `redis.hash_key`: public, so it protects nothing (see
/// [`Settings::warnings`]).
pub const DEFAULT_HASH_KEY: &str = "quota-worker-default-key";

/// What `config check` prints in place of a secret. Refused as a value, so a printed
/// configuration loaded back fails loudly instead of hashing with another key.
pub const REDACTED: &str = "<redacted>";

/// The keys that may also be read from a file named by `<VARIABLE>_FILE` (as the
/// official RabbitMQ, Redis and Postgres images do, for Docker and Kubernetes
/// secrets). Other keys ending in `_file` (`amqp.tls.ca_file`) are paths themselves.
pub const SECRET_KEYS: [&str; 6] = [
    "amqp.url",
    "amqp.urls",
    "redis.url",
    "redis.cluster_urls",
    "redis.sentinel.urls",
    "redis.hash_key",
];

/// The keys that hold a list of URLs (comma-separated in a variable or its file).
const URL_LIST_KEYS: [&str; 3] = ["amqp.urls", "redis.cluster_urls", "redis.sentinel.urls"];

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

/// Broker settings (`[amqp]`). `Debug` hides the URL's password.
#[allow(missing_docs)]
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AmqpSettings {
    pub url: String,
    /// Several broker nodes (a cluster without a load balancer), tried in turn; when
    /// set, `url` is not used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
    #[serde(default)]
    pub tls: TlsSettings,
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

/// Redis settings (`[redis]`). `Debug` hides the URLs' passwords and the hash key;
/// serializing prints the hash key as [`REDACTED`].
#[allow(missing_docs)]
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: String,
    #[serde(default)]
    pub tls: TlsSettings,
    pub cluster: bool,
    pub cluster_urls: Vec<String>,
    /// Redis Sentinel (`[redis.sentinel]`): the sentinels are asked for the master,
    /// and asked again when it stops answering as one (a failover).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelSettings>,
    /// After each admission call, wait until this many replicas have its writes
    /// (`WAIT`) before the verdict counts; 0: do not wait. Replication is
    /// asynchronous, so without it a failover can forget sends the old master had
    /// recorded (and the caps start afresh for them).
    pub wait_replicas: u32,
    /// How long one `WAIT` may take; a job whose admission was not replicated in
    /// time is held and retried, as when Redis is away.
    pub wait_timeout: Dur,
    pub key_prefix: String,
    #[serde(serialize_with = "redacted_secret")]
    pub hash_key: SecretString,
    pub dedupe_window: Dur,
    pub reservation_lease: Dur,
    /// How long the notes about a job (`admin job`), its cancel mark and its
    /// recipient's collapse keys and waiting set are kept after their last write.
    pub record_ttl: Dur,
    /// Whether the worker writes its notes about waiting and ended jobs (`admin
    /// job`, the recipient's waiting count). Cancel marks are spent either way.
    pub notes: bool,
}

/// Redis Sentinel (`[redis.sentinel]`). `Debug` hides the URLs' passwords.
#[allow(missing_docs)]
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelSettings {
    /// The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    pub master_name: String,
    /// The sentinels, tried in turn (`redis://host:26379`; with a password to the
    /// sentinels themselves, `redis://:password@host:26379`).
    pub urls: Vec<String>,
}

impl fmt::Debug for SentinelSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let urls: Vec<String> = self.urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("SentinelSettings")
            .field("master_name", &self.master_name)
            .field("urls", &urls)
            .finish()
    }
}

fn redacted_secret<S: Serializer>(_: &SecretString, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(REDACTED)
}

impl fmt::Debug for AmqpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self;
        f.debug_struct("AmqpSettings")
            .field("url", &redact_url(&a.url))
            .field(
                "urls",
                &a.urls.iter().map(|u| redact_url(u)).collect::<Vec<_>>(),
            )
            .field("tls", &a.tls)
            .field("jobs_exchange", &a.jobs_exchange)
            .field("jobs_queue", &a.jobs_queue)
            .field("dispatch_exchange", &a.dispatch_exchange)
            .field("dispatch_queue_prefix", &a.dispatch_queue_prefix)
            .field("dead_exchange", &a.dead_exchange)
            .field("dead_queue", &a.dead_queue)
            .field("delay_prefix", &a.delay_prefix)
            .field("delay_levels", &a.delay_levels)
            .field("queue_type", &a.queue_type)
            .field("prefetch", &a.prefetch)
            .field("delivery_limit", &a.delivery_limit)
            .field("publish_timeout", &a.publish_timeout)
            .finish()
    }
}

impl fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self;
        let urls: Vec<String> = r.cluster_urls.iter().map(|u| redact_url(u)).collect();
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&r.url))
            .field("tls", &r.tls)
            .field("cluster", &r.cluster)
            .field("cluster_urls", &urls)
            .field("sentinel", &r.sentinel)
            .field("wait_replicas", &r.wait_replicas)
            .field("wait_timeout", &r.wait_timeout)
            .field("key_prefix", &r.key_prefix)
            .field("hash_key", &REDACTED)
            .field("dedupe_window", &r.dedupe_window)
            .field("reservation_lease", &r.reservation_lease)
            .field("record_ttl", &r.record_ttl)
            .field("notes", &r.notes)
            .finish()
    }
}

/// TLS settings of one connection (`[amqp.tls]`, `[redis.tls]`). They apply to an
/// `amqps://` or `rediss://` URL and are refused with a plaintext one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSettings {
    /// PEM file of the CAs to trust, instead of the system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate (chain), for mutual TLS; needs `key_file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file` (PKCS#8, PKCS#1 or SEC1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_file: Option<PathBuf>,
    /// The name the server's certificate must carry, when it is not the URL's host
    /// (AMQP only: the Redis client verifies the URL's host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// Accept any server certificate: encrypted, but anyone on the path can read
    /// and change the traffic. Every start and `config check` warn about it.
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

impl TlsSettings {
    /// Whether any TLS key is set.
    pub fn is_set(&self) -> bool {
        *self != TlsSettings::default()
    }
}

/// Worker settings (`[worker]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    #[serde(with = "zone_name")]
    pub default_timezone: Tz,
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
    #[serde(with = "window_text")]
    pub window: Window,
}

/// A zone written by its IANA name, parsed when the configuration is read.
mod zone_name {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Tz, D::Error> {
        let name = String::deserialize(d)?;
        name.parse::<Tz>()
            .map_err(|_| serde::de::Error::custom(format!("`{name}` is not an IANA time zone")))
    }

    pub fn serialize<S: Serializer>(tz: &Tz, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(tz.name())
    }
}

/// A window written as `"1d"` or `"90m"`, parsed when the configuration is read,
/// and at most 366 days long.
mod window_text {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Window, D::Error> {
        let text = String::deserialize(d)?;
        let window = Window::from_str(&text).map_err(serde::de::Error::custom)?;
        let too_long = match window {
            Window::CalendarDays(days) => days > 366,
            Window::Rolling(d) => d > chrono::Duration::days(366),
        };
        if too_long {
            return Err(serde::de::Error::custom("at most 366 days"));
        }
        Ok(window)
    }

    pub fn serialize<S: Serializer>(w: &Window, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(w)
    }
}

/// Send windows written as `[{ days = "mon-fri", from = "08:00", to = "21:00" }]`,
/// parsed when the configuration is read.
mod send_windows_text {
    use super::*;

    #[derive(Deserialize, Serialize)]
    #[serde(deny_unknown_fields)]
    struct Written {
        days: String,
        from: String,
        to: String,
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SendWindows>, D::Error> {
        let Some(written) = Option::<Vec<Written>>::deserialize(d)? else {
            return Ok(None);
        };
        let openings = written
            .iter()
            .map(|w| Opening::parse(&w.days, &w.from, &w.to))
            .collect::<Result<Vec<_>, _>>()
            .map_err(serde::de::Error::custom)?;
        if openings.is_empty() {
            return Err(serde::de::Error::custom(
                "an empty list never opens; leave `send_windows` out for no restriction",
            ));
        }
        Ok(Some(SendWindows::new(openings)))
    }

    pub fn serialize<S: Serializer>(w: &Option<SendWindows>, s: S) -> Result<S::Ok, S::Error> {
        let written: Option<Vec<Written>> = w.as_ref().map(|w| {
            w.openings()
                .iter()
                .map(|o| {
                    let (days, from, to) = o.parts();
                    Written { days, from, to }
                })
                .collect()
        });
        written.serialize(s)
    }
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

/// Whether a policy holds jobs or only says what it would have done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Its caps, windows and `max_wait` hold and dead-letter jobs.
    #[default]
    Enforce,
    /// Its sends are recorded and its verdict computed and counted
    /// (`quota_worker_shadow_total`), but no job is held or dead-lettered by it.
    Shadow,
}

impl Mode {
    /// `enforce` or `shadow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// A policy as written in the file (`[policies.NAME]`).
#[allow(missing_docs)]
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySettings {
    #[serde(default)]
    pub rules: Vec<RuleSettings>,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub action: Action,
    #[serde(
        default,
        with = "send_windows_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub send_windows: Option<SendWindows>,
    #[serde(default)]
    pub ignore_channel_windows: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait: Option<Dur>,
    #[serde(default)]
    pub mode: Mode,
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
    #[serde(
        default,
        with = "send_windows_text",
        skip_serializing_if = "Option::is_none"
    )]
    pub send_windows: Option<SendWindows>,
}

impl Default for ChannelSettings {
    fn default() -> Self {
        ChannelSettings {
            rate: None,
            period: None,
            burst: None,
            cost: 1,
            send_windows: None,
        }
    }
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

/// A validated policy, ready for the store.
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
    /// When its jobs may go out, in the recipient's zone; `None`: any time.
    pub send_windows: Option<SendWindows>,
    /// Its jobs go out whatever their channel's send windows say.
    pub ignore_channel_windows: bool,
    /// The longest a job may wait, from when the worker first saw it, for its caps
    /// and windows; a job that would wait longer is dead-lettered `capped`.
    pub max_wait: Option<chrono::Duration>,
    /// Enforced, or only counted (shadow).
    pub mode: Mode,
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

impl fmt::Display for Rate {
    /// `12.5 per second, burst 10` (and `, cost 2` when a job costs more than one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_second = 1e6 / self.interval_us as f64 / self.cost as f64;
        write!(f, "{} per second, burst {}", trim(per_second), self.burst)?;
        if self.cost != 1 {
            write!(f, ", cost {}", self.cost)?;
        }
        return Ok(());

        fn trim(x: f64) -> String {
            let s = format!("{x:.3}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
    }
}

/// The environment's values by dotted key, with `<SECRET>_FILE` variables replaced
/// by the file's content, and the variable each key came from.
struct EnvValues {
    values: Vec<(String, config::Value)>,
    origins: BTreeMap<String, String>,
}

impl EnvValues {
    fn read(env: &config::Environment) -> Result<EnvValues, ConfigError> {
        use config::Source;
        let var = |key: &str| format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase());
        let collected = env.collect()?;
        let mut out = EnvValues {
            values: Vec::new(),
            origins: BTreeMap::new(),
        };
        for (key, value) in &collected {
            let Some(base) = key
                .strip_suffix("_file")
                .filter(|base| SECRET_KEYS.contains(base))
            else {
                out.values.push((key.clone(), value.clone()));
                out.origins.insert(key.clone(), var(key));
                continue;
            };
            let at = |reason: String| ConfigError::At {
                origin: Origin::Env { var: var(key) },
                error: Box::new(invalid(base, reason)),
            };
            if collected.contains_key(base) {
                return Err(at(format!(
                    "set twice: by {} and by {}; keep one",
                    var(base),
                    var(key)
                )));
            }
            let path = value.clone().into_string().unwrap_or_default();
            let text = std::fs::read_to_string(&path)
                .map_err(|e| at(format!("cannot read the file `{path}`: {e}")))?;
            let text = text
                .strip_suffix('\n')
                .map(|t| t.strip_suffix('\r').unwrap_or(t))
                .unwrap_or(&text);
            let value = if URL_LIST_KEYS.contains(&base) {
                let urls = text
                    .split([',', '\n'])
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(config::Value::from);
                config::Value::from(urls.collect::<Vec<_>>())
            } else {
                config::Value::from(text)
            };
            out.values.push((base.to_string(), value));
            out.origins.insert(base.to_string(), var(key));
        }
        Ok(out)
    }
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
        self.redis.key_prefix = ns.to_string();
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
        let env = env
            .separator("__")
            .prefix_separator("__")
            .try_parsing(true)
            .list_separator(",")
            .with_list_parse_key("redis.cluster_urls")
            .with_list_parse_key("redis.sentinel.urls")
            .with_list_parse_key("amqp.urls");
        let env = EnvValues::read(&env)?;
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

    /// Check every value that parsing alone cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
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
        match self.redis.hash_key.expose_secret() {
            "" => return Err(invalid("redis.hash_key", "must not be empty")),
            REDACTED => {
                return Err(invalid(
                    "redis.hash_key",
                    format!(
                        "`{REDACTED}` is what `config check` prints in place of the key; \
                         set the real key (a different one forgets every recorded send)"
                    ),
                ))
            }
            _ => {}
        }
        self.amqp_endpoints()?;
        self.redis_endpoints()?;
        if self.redis.cluster && self.redis.cluster_urls.is_empty() {
            return Err(invalid(
                "redis.cluster_urls",
                "cluster = true needs at least one URL",
            ));
        }
        self.check_sentinel()?;
        if self.redis.wait_replicas > 0 && self.redis.cluster {
            return Err(invalid(
                "redis.wait_replicas",
                "not supported with `redis.cluster = true` yet: after a master failed over, \
                 the WAITs on the promoted master held its connection until every call to it \
                 timed out (tests/faults/redis_cluster_failover.rs); use 0 on a cluster",
            ));
        }
        if self.redis.wait_replicas > 0 {
            let t = self.redis.wait_timeout.0;
            if t < Duration::from_millis(1) || t > Duration::from_millis(1500) {
                return Err(invalid(
                    "redis.wait_timeout",
                    "must be between 1ms and 1500ms (every Redis call gives up after 2 s, \
                     and a WAIT holds the connection it runs on)",
                ));
            }
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
        for (name, p) in &self.policies {
            if p.max_wait.is_some_and(|d| d.0 < Duration::from_secs(1)) {
                return Err(invalid(
                    format!("policies.{name}.max_wait"),
                    "must be at least 1s (leave it out for no bound)",
                ));
            }
            if let Some(wait) = p.max_wait.filter(|d| d.0 > self.redis.record_ttl.0) {
                return Err(invalid(
                    "redis.record_ttl",
                    format!(
                        "must be at least the longest max_wait ({} of policy `{name}`): \
                         a job's cancel mark and collapse key must outlive its wait",
                        crate::quota::window::Window::Rolling(
                            chrono::Duration::from_std(wait.0).unwrap_or_default()
                        )
                    ),
                ));
            }
        }
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
            channel_rate(name, &self.channels[name])?;
        }
        Ok(())
    }

    /// The broker URLs the worker connects to, in the order it tries them:
    /// `amqp.urls` when set, else `amqp.url`.
    pub fn amqp_urls(&self) -> Vec<&str> {
        match self.amqp.urls.is_empty() {
            true => vec![self.amqp.url.as_str()],
            false => self.amqp.urls.iter().map(String::as_str).collect(),
        }
    }

    /// The broker URLs ([`Settings::amqp_urls`]), parsed, with their TLS settings
    /// checked (files read): an `amqps://` URL whose TLS cannot be set up, TLS keys
    /// with `amqp://` URLs, and a list mixing both, are errors naming the key.
    pub fn amqp_endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        use lapin::uri::{AMQPScheme, AMQPUri};
        let key = if self.amqp.urls.is_empty() {
            "amqp.url"
        } else {
            "amqp.urls"
        };
        let mut out = Vec::new();
        for url in self.amqp_urls() {
            let uri: AMQPUri = url.parse().map_err(|e| {
                invalid(
                    key,
                    format!("`{}` is not an AMQP URL: {e}", redact_url(url)),
                )
            })?;
            if !(url.starts_with("amqp://") || url.starts_with("amqps://")) {
                return Err(invalid(
                    key,
                    "must start with amqp:// (plaintext) or amqps:// (TLS)",
                ));
            }
            if uri.authority.host.is_empty() {
                return Err(invalid(key, format!("`{}` names no host", redact_url(url))));
            }
            out.push(Endpoint {
                tls: uri.scheme == AMQPScheme::AMQPS,
                host: uri.authority.host,
                port: uri.authority.port,
                vhost: Some(uri.vhost),
            });
        }
        let tls = out.iter().any(|e| e.tls);
        if tls && out.iter().any(|e| !e.tls) {
            return Err(invalid(
                key,
                "mixes amqp:// and amqps:// URLs; use one scheme for every node",
            ));
        }
        self.check_tls(&self.amqp.tls, "amqp", tls)?;
        if tls {
            for e in &out {
                crate::tls::server_name(&self.amqp.tls, &e.host)
                    .map_err(|e| invalid(e.key, e.reason))?;
            }
        }
        Ok(out)
    }

    /// The Redis URLs (`redis.url`, or `redis.cluster_urls` with `cluster = true`),
    /// parsed and checked as [`Settings::amqp_endpoints`] does.
    pub fn redis_endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        use redis::{ConnectionAddr, IntoConnectionInfo};
        let (key, urls) = if self.redis.cluster {
            ("redis.cluster_urls", self.redis.cluster_urls.clone())
        } else {
            ("redis.url", vec![self.redis.url.clone()])
        };
        let mut out = Vec::new();
        for url in &urls {
            let shown = redact_url(url);
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| invalid(key, format!("`{shown}` is not a Redis URL: {e}")))?;
            let endpoint = match info.addr() {
                ConnectionAddr::Tcp(host, port) => Endpoint {
                    tls: false,
                    host: host.clone(),
                    port: *port,
                    vhost: None,
                },
                ConnectionAddr::TcpTls {
                    host,
                    port,
                    insecure,
                    ..
                } => {
                    if *insecure {
                        return Err(invalid(
                            key,
                            format!(
                                "`{shown}`: turn verification off with \
                                 `redis.tls.insecure_skip_verify = true`, not in the URL"
                            ),
                        ));
                    }
                    Endpoint {
                        tls: true,
                        host: host.clone(),
                        port: *port,
                        vhost: None,
                    }
                }
                _ => {
                    return Err(invalid(
                        key,
                        format!("`{shown}`: use redis:// or rediss://"),
                    ))
                }
            };
            out.push(endpoint);
        }
        let tls = out.iter().any(|e| e.tls);
        if tls && out.iter().any(|e| !e.tls) {
            return Err(invalid(
                key,
                "mixes redis:// and rediss:// URLs; use one scheme for every node",
            ));
        }
        self.check_tls(&self.redis.tls, "redis", tls)?;
        if self.redis.tls.server_name.is_some() {
            return Err(invalid(
                "redis.tls.server_name",
                "not supported for Redis: its certificate is verified against the URL's \
                 host, so use the name the certificate carries in the URL",
            ));
        }
        Ok(out)
    }

    /// `[redis.sentinel]`: a master name and plaintext sentinel URLs, not with
    /// `cluster = true`.
    fn check_sentinel(&self) -> Result<(), ConfigError> {
        use redis::{ConnectionAddr, IntoConnectionInfo};
        let Some(sentinel) = &self.redis.sentinel else {
            return Ok(());
        };
        if self.redis.cluster {
            return Err(invalid(
                "redis.sentinel",
                "set together with `redis.cluster = true`; a deployment is a Redis Cluster or \
                 Sentinel-managed replicas, not both",
            ));
        }
        if sentinel.master_name.trim().is_empty() {
            return Err(invalid(
                "redis.sentinel.master_name",
                "must not be empty (the name in `sentinel monitor NAME host port quorum`)",
            ));
        }
        if sentinel.urls.is_empty() {
            return Err(invalid(
                "redis.sentinel.urls",
                "needs at least one sentinel URL",
            ));
        }
        for url in &sentinel.urls {
            let shown = redact_url(url);
            let info = url.as_str().into_connection_info().map_err(|e| {
                invalid(
                    "redis.sentinel.urls",
                    format!("`{shown}` is not a Redis URL: {e}"),
                )
            })?;
            if !matches!(info.addr(), ConnectionAddr::Tcp(..)) {
                return Err(invalid(
                    "redis.sentinel.urls",
                    format!("`{shown}`: only redis:// (TLS with Sentinel is not supported)"),
                ));
            }
        }
        if self.redis.url.starts_with("rediss://") {
            return Err(invalid(
                "redis.url",
                "rediss:// with `[redis.sentinel]`: TLS with Sentinel is not supported",
            ));
        }
        Ok(())
    }

    /// TLS keys only with a TLS URL; their files readable and valid.
    fn check_tls(
        &self,
        tls: &TlsSettings,
        section: &str,
        url_is_tls: bool,
    ) -> Result<(), ConfigError> {
        if !url_is_tls {
            if tls.is_set() {
                let key = tls_key_set(tls);
                let scheme = if section == "amqp" { "amqps" } else { "rediss" };
                return Err(invalid(
                    format!("{section}.tls.{key}"),
                    format!(
                        "is set, but `{section}.url` is plaintext: use a {scheme}:// URL \
                         (or remove the key)"
                    ),
                ));
            }
            return Ok(());
        }
        crate::tls::load(tls, &format!("{section}.tls")).map_err(|e| invalid(e.key, e.reason))?;
        Ok(())
    }

    /// What a careful operator should know before running this configuration:
    /// the built-in hash key, and TLS verification turned off. `run` logs each one
    /// as a warning on every start; `config check` prints them.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.redis.hash_key.expose_secret() == DEFAULT_HASH_KEY {
            out.push(
                "redis.hash_key is the built-in default, which is public: anyone who can \
                 read Redis can tell whether a given phone number or address was sent to, \
                 by hashing it with this key and looking for the key name. Set \
                 redis.hash_key (or QUOTA_WORKER__REDIS__HASH_KEY_FILE) to a long random \
                 secret before the first real send; changing it later forgets every \
                 recorded send"
                    .to_string(),
            );
        }
        for (section, tls) in [("amqp", &self.amqp.tls), ("redis", &self.redis.tls)] {
            if tls.insecure_skip_verify {
                out.push(format!(
                    "{section}.tls.insecure_skip_verify = true: the server's certificate is \
                     not verified, so anyone on the network path can pose as the server and \
                     read the credentials and every message"
                ));
            }
        }
        out
    }

    /// One line per connection saying how it is made (`config check` prints them).
    pub fn connections(&self) -> Vec<String> {
        let describe = |name: &str, section: &str, e: &Endpoint, tls: &TlsSettings| {
            let at = match &e.vhost {
                Some(v) => format!("{}:{} vhost `{v}`", e.host, e.port),
                None => format!("{}:{}", e.host, e.port),
            };
            if !e.tls {
                return format!("{name} {at}: plaintext (no TLS)");
            }
            let mut parts = vec![];
            if tls.insecure_skip_verify {
                parts.push("certificate NOT verified".to_string());
            } else {
                let roots = match &tls.ca_file {
                    Some(p) => format!("CAs of {}", p.display()),
                    None => "the system's roots".to_string(),
                };
                let name = tls.server_name.as_deref().unwrap_or(&e.host);
                parts.push(format!(
                    "certificate verified against `{name}` with {roots}"
                ));
            }
            match &tls.cert_file {
                Some(p) => parts.push(format!("client certificate {}", p.display())),
                None => parts.push("no client certificate".to_string()),
            }
            let _ = section;
            format!("{name} {at}: TLS, {}", parts.join(", "))
        };
        let mut out = Vec::new();
        if let Ok(es) = self.amqp_endpoints() {
            for e in es {
                out.push(describe("broker", "amqp", &e, &self.amqp.tls));
            }
        }
        if let Some(sentinel) = &self.redis.sentinel {
            // the master's address is the sentinels' answer, not `redis.url`'s host
            use redis::{ConnectionAddr, IntoConnectionInfo};
            for url in &sentinel.urls {
                if let Ok(info) = url.as_str().into_connection_info() {
                    if let ConnectionAddr::Tcp(host, port) = info.addr() {
                        out.push(format!(
                            "redis master `{}` as sentinel {host}:{port} names it: plaintext (no TLS)",
                            sentinel.master_name
                        ));
                    }
                }
            }
        } else if let Ok(es) = self.redis_endpoints() {
            for e in es {
                out.push(describe("redis", "redis", &e, &self.redis.tls));
            }
        }
        out
    }

    /// The keys whose change from `self` to `new` a running worker cannot apply
    /// (connections, names of queues and keys, the worker's runtime, HTTP, the set
    /// of channels, each of which names a dispatch queue), as dotted paths; empty
    /// when only policies and channels' rates and windows differ. No value is
    /// printed: some are secrets.
    pub fn needs_restart(&self, new: &Settings) -> Vec<String> {
        fn diff(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
            use serde_json::Value::Object;
            match (a, b) {
                (Object(x), Object(y)) => {
                    let keys: std::collections::BTreeSet<&String> =
                        x.keys().chain(y.keys()).collect();
                    for k in keys {
                        let null = serde_json::Value::Null;
                        let (va, vb) = (x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null));
                        diff(&format!("{path}.{k}"), va, vb, out);
                    }
                }
                (a, b) if a != b => out.push(path.to_string()),
                _ => {}
            }
        }
        let json = |v: &dyn erased::Section| v.json();
        let mut out = Vec::new();
        let sections: [(&str, &dyn erased::Section, &dyn erased::Section); 4] = [
            ("amqp", &self.amqp, &new.amqp),
            ("redis", &self.redis, &new.redis),
            ("worker", &self.worker, &new.worker),
            ("http", &self.http, &new.http),
        ];
        for (name, a, b) in sections {
            diff(name, &json(a), &json(b), &mut out);
        }
        if self.redis.hash_key.expose_secret() != new.redis.hash_key.expose_secret() {
            out.push("redis.hash_key".to_string());
        }
        let (old, now): (Vec<&String>, Vec<&String>) = (
            self.channels.keys().collect(),
            new.channels.keys().collect(),
        );
        for c in old.iter().filter(|c| !now.contains(c)) {
            out.push(format!("channels.{c} (removed)"));
        }
        for c in now.iter().filter(|c| !old.contains(c)) {
            out.push(format!("channels.{c} (added)"));
        }
        out
    }

    /// Every policy, with its rules as read.
    pub fn policies(&self) -> Vec<Policy> {
        self.policies
            .iter()
            .map(|(name, p)| Policy {
                name: name.clone(),
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
            })
            .collect()
    }

    /// A channel's send windows; `None` when it has none (or is not configured).
    pub fn channel_windows(&self, channel: &str) -> Option<&SendWindows> {
        self.channels.get(channel)?.send_windows.as_ref()
    }

    /// A channel's send rate; `None` when it is not paced (or not configured).
    pub fn rate(&self, channel: &str) -> Option<Rate> {
        let c = self.channels.get(channel)?;
        channel_rate(channel, c).ok().flatten()
    }
}

/// A channel's send rate from its settings, checked: `None` when it is not paced.
fn channel_rate(channel: &str, c: &ChannelSettings) -> Result<Option<Rate>, ConfigError> {
    {
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
}

impl Settings {
    /// The settings with secrets replaced, for printing.
    pub fn redacted(&self) -> Settings {
        let mut s = self.clone();
        s.amqp.url = redact_url(&s.amqp.url);
        s.amqp.urls = s.amqp.urls.iter().map(|u| redact_url(u)).collect();
        s.redis.url = redact_url(&s.redis.url);
        s.redis.cluster_urls = s.redis.cluster_urls.iter().map(|u| redact_url(u)).collect();
        if let Some(sentinel) = &mut s.redis.sentinel {
            sentinel.urls = sentinel.urls.iter().map(|u| redact_url(u)).collect();
        }
        s
    }
}

/// Where a connection goes, as parsed from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// `amqps://` or `rediss://`.
    pub tls: bool,
    /// Host as written.
    pub host: String,
    /// Port (the scheme's default when the URL has none).
    pub port: u16,
    /// The AMQP virtual host.
    pub vhost: Option<String>,
}

/// The first TLS key set in `tls`, for an error about all of them.
fn tls_key_set(tls: &TlsSettings) -> &'static str {
    if tls.ca_file.is_some() {
        "ca_file"
    } else if tls.cert_file.is_some() {
        "cert_file"
    } else if tls.key_file.is_some() {
        "key_file"
    } else if tls.server_name.is_some() {
        "server_name"
    } else {
        "insecure_skip_verify"
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

/// A section of the settings as JSON, for [`Settings::needs_restart`].
mod erased {
    pub trait Section {
        fn json(&self) -> serde_json::Value;
    }

    impl<T: serde::Serialize> Section for T {
        fn json(&self) -> serde_json::Value {
            serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
        }
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
        let policies = s.policies();
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
        assert_eq!(s.rate("sms"), None);
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
            s.rate("sms"),
            Some(Rate {
                interval_us: 100_000,
                burst: 1,
                cost: 1
            })
        );
    }

    #[test]
    fn a_restart_is_needed_for_connections_names_and_channels_not_for_rules() {
        let load = |vars: &[(&str, &str)]| Settings::load_with_env(None, env(vars)).unwrap();
        let base = load(&[]);
        let rules_only = load(&[
            ("QUOTA_WORKER__CHANNELS__SMS__RATE", "10"),
            ("QUOTA_WORKER__POLICIES__DEFAULT__MODE", "shadow"),
            ("QUOTA_WORKER__POLICIES__PROMO__MAX_WAIT", "1h"),
        ]);
        assert_eq!(base.needs_restart(&rules_only), Vec::<String>::new());
        assert_eq!(rules_only.policies["default"].mode, Mode::Shadow);
        let fixed = load(&[
            (
                "QUOTA_WORKER__AMQP__URL",
                "amqp://u:secret@10.0.0.1:5672/%2f",
            ),
            ("QUOTA_WORKER__AMQP__JOBS_QUEUE", "other.jobs"),
            (
                "QUOTA_WORKER__REDIS__HASH_KEY",
                "another-key-of-32-characters-or-so",
            ),
            ("QUOTA_WORKER__HTTP__LISTEN", "127.0.0.1:1"),
            ("QUOTA_WORKER__CHANNELS__FAX__RATE", "1"),
        ]);
        let keys = base.needs_restart(&fixed);
        assert_eq!(
            keys,
            [
                "amqp.jobs_queue",
                "amqp.url",
                "http.listen",
                "redis.hash_key",
                "channels.fax (added)"
            ],
            "no value is printed: {keys:?}"
        );
        assert!(!keys.concat().contains("secret"));
    }

    #[test]
    fn several_broker_urls_are_checked_and_redacted_each() {
        let load = |vars: &[(&str, &str)]| Settings::load_with_env(None, env(vars));
        let s = load(&[(
            "QUOTA_WORKER__AMQP__URLS",
            "amqp://u:pw1@10.0.0.1:5672/%2f,amqp://u:pw2@10.0.0.2/prod",
        )])
        .unwrap();
        assert_eq!(
            s.amqp_urls(),
            [
                "amqp://u:pw1@10.0.0.1:5672/%2f",
                "amqp://u:pw2@10.0.0.2/prod"
            ]
        );
        let lines = s.connections();
        assert!(lines[0].starts_with("broker 10.0.0.1:5672"), "{lines:?}");
        assert!(
            lines[1].starts_with("broker 10.0.0.2:5672 vhost `prod`"),
            "{lines:?}"
        );
        let shown = format!("{s} {s:?}");
        assert!(!shown.contains("pw1") && !shown.contains("pw2"), "{shown}");
        // without urls, url alone
        assert_eq!(
            Settings::defaults().amqp_urls(),
            [Settings::defaults().amqp.url]
        );
        let mixed = load(&[(
            "QUOTA_WORKER__AMQP__URLS",
            "amqp://10.0.0.1/%2f,amqps://10.0.0.2/%2f",
        )])
        .unwrap_err()
        .to_string();
        assert!(
            mixed.contains("amqp.urls") && mixed.contains("mixes"),
            "{mixed}"
        );
        let bad = load(&[("QUOTA_WORKER__AMQP__URLS", "amqp://10.0.0.1/%2f,http://x")])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("amqp.urls"), "{bad}");
    }

    #[test]
    fn sentinel_and_replica_waits_are_checked_and_redacted() {
        let load = |vars: &[(&str, &str)]| Settings::load_with_env(None, env(vars));
        let s = load(&[
            ("QUOTA_WORKER__REDIS__SENTINEL__MASTER_NAME", "main"),
            (
                "QUOTA_WORKER__REDIS__SENTINEL__URLS",
                "redis://:pw1@10.0.0.1:26379,redis://:pw2@10.0.0.2:26379",
            ),
            ("QUOTA_WORKER__REDIS__WAIT_REPLICAS", "1"),
        ])
        .unwrap();
        let sentinel = s.redis.sentinel.as_ref().unwrap();
        assert_eq!(sentinel.master_name, "main");
        assert_eq!(sentinel.urls.len(), 2);
        assert_eq!(s.redis.wait_replicas, 1);
        let shown = format!("{s} {s:?}");
        assert!(!shown.contains("pw1") && !shown.contains("pw2"), "{shown}");
        let lines = s.connections();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("redis master `main` as sentinel 10.0.0.2:26379")),
            "{lines:?}"
        );
        assert_eq!(
            Settings::defaults().redis.wait_replicas,
            0,
            "off by default"
        );
        assert!(Settings::defaults().redis.sentinel.is_none());

        let key_of = |vars: &[(&str, &str)]| load(vars).unwrap_err().key().map(str::to_string);
        let name = ("QUOTA_WORKER__REDIS__SENTINEL__MASTER_NAME", "main");
        let urls = (
            "QUOTA_WORKER__REDIS__SENTINEL__URLS",
            "redis://10.0.0.1:26379",
        );
        assert_eq!(
            key_of(&[("QUOTA_WORKER__REDIS__SENTINEL__MASTER_NAME", ""), urls]).as_deref(),
            Some("redis.sentinel.master_name")
        );
        assert_eq!(
            key_of(&[name, ("QUOTA_WORKER__REDIS__SENTINEL__URLS", "http://x")]).as_deref(),
            Some("redis.sentinel.urls")
        );
        assert_eq!(
            key_of(&[
                name,
                (
                    "QUOTA_WORKER__REDIS__SENTINEL__URLS",
                    "rediss://10.0.0.1:26379"
                )
            ])
            .as_deref(),
            Some("redis.sentinel.urls")
        );
        assert_eq!(
            key_of(&[
                name,
                urls,
                ("QUOTA_WORKER__REDIS__CLUSTER", "true"),
                ("QUOTA_WORKER__REDIS__CLUSTER_URLS", "redis://10.0.0.1:7000")
            ])
            .as_deref(),
            Some("redis.sentinel")
        );
        assert_eq!(
            key_of(&[
                ("QUOTA_WORKER__REDIS__WAIT_REPLICAS", "1"),
                ("QUOTA_WORKER__REDIS__WAIT_TIMEOUT", "5s")
            ])
            .as_deref(),
            Some("redis.wait_timeout")
        );
        assert_eq!(
            key_of(&[
                ("QUOTA_WORKER__REDIS__WAIT_REPLICAS", "1"),
                ("QUOTA_WORKER__REDIS__CLUSTER", "true"),
                ("QUOTA_WORKER__REDIS__CLUSTER_URLS", "redis://10.0.0.1:7000")
            ])
            .as_deref(),
            Some("redis.wait_replicas")
        );
    }

    #[test]
    fn a_rate_reads_as_jobs_per_second() {
        let rate = |interval_us, burst, cost| {
            Rate {
                interval_us,
                burst,
                cost,
            }
            .to_string()
        };
        assert_eq!(rate(100_000, 1, 1), "10 per second, burst 1");
        assert_eq!(rate(3_000, 50, 1), "333.333 per second, burst 50");
        assert_eq!(rate(250_000, 4, 2), "2 per second, burst 4, cost 2");
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
            (
                vec![("QUOTA_WORKER__REDIS__RECORD_TTL", "24h")],
                "redis.record_ttl",
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
    fn send_windows_load_typed_and_bad_ones_name_key_and_line() {
        let path = std::env::temp_dir().join(format!("qw-windows-{}.toml", std::process::id()));
        let write_and_load = |text: &str| {
            std::fs::write(&path, text).unwrap();
            let loaded = Settings::load_with_env(Some(&path), env(&[]));
            std::fs::remove_file(&path).unwrap();
            loaded
        };
        let s = write_and_load(
            "[policies.promo]\nrules = [{ limit = 1, window = \"1d\" }]\nmax_wait = \"72h\"\n\
             send_windows = [{ days = \"mon-fri\", from = \"08:00\", to = \"21:00\" },\n\
             { days = \"sat\", from = \"10:00\", to = \"18:00\" }]\n\n\
             [channels.sms]\nsend_windows = [{ days = \"daily\", from = \"22:00\", to = \"06:00\" }]\n",
        )
        .unwrap();
        let promo = s
            .policies()
            .into_iter()
            .find(|p| p.name == "promo")
            .unwrap();
        assert_eq!(
            promo.send_windows.unwrap().to_string(),
            "mon,tue,wed,thu,fri 08:00-21:00; sat 10:00-18:00"
        );
        assert_eq!(promo.max_wait, Some(chrono::Duration::days(3)));
        assert_eq!(
            s.channel_windows("sms").unwrap().to_string(),
            "mon,tue,wed,thu,fri,sat,sun 22:00-06:00"
        );
        // the defaults: `default` waits at most 7 days, `transactional` ignores windows
        let policies = s.policies();
        let by = |n: &str| policies.iter().find(|p| p.name == n).unwrap().clone();
        assert_eq!(by("default").max_wait, Some(chrono::Duration::days(7)));
        assert!(by("transactional").ignore_channel_windows);
        // what a file says back loads again to the same windows
        assert!(s.to_string().contains("send_windows"), "{s}");

        for (text, key, line, says) in [
            (
                "[policies.promo]\nsend_windows = [{ days = \"mon-fry\", from = \"08:00\", to = \"21:00\" }]\n",
                "policies.promo.send_windows",
                2,
                "`fry`",
            ),
            (
                "[channels.sms]\n\nsend_windows = [{ days = \"sat\", from = \"8:00\", to = \"21:00\" }]\n",
                "channels.sms.send_windows",
                3,
                "\"8:00\"",
            ),
            (
                "[channels.sms]\nsend_windows = []\n",
                "channels.sms.send_windows",
                2,
                "never opens",
            ),
            (
                "[policies.promo]\nmax_wait = \"10ms\"\n",
                "policies.promo.max_wait",
                2,
                "at least 1s",
            ),
        ] {
            let err = write_and_load(text).unwrap_err();
            assert_eq!(err.key(), Some(key), "{err}");
            assert_eq!(
                err.origin(),
                Some(&Origin::File {
                    path: path.clone(),
                    line
                }),
                "{err}"
            );
            assert!(err.to_string().contains(says), "{err}");
        }
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
    fn display_loads_back_only_with_the_hash_key_given_again() {
        let s = Settings::load_with_env(None, env(&[])).unwrap();
        let text = s.to_string();
        assert!(
            text.contains(&format!("hash_key = \"{REDACTED}\"")),
            "{text}"
        );
        let path = std::env::temp_dir().join(format!("qw-display-{}.toml", std::process::id()));
        std::fs::write(&path, &text).unwrap();
        // as printed, it would hash with another key: refused, naming the key and line
        let refused = Settings::load_with_env(Some(&path), env(&[]));
        let again = Settings::load_with_env(
            Some(&path),
            env(&[("QUOTA_WORKER__REDIS__HASH_KEY", "the-real-key")]),
        );
        std::fs::remove_file(&path).unwrap();
        let err = refused.unwrap_err();
        assert_eq!(err.key(), Some("redis.hash_key"));
        assert!(matches!(err.origin(), Some(Origin::File { .. })), "{err}");
        let again = again.unwrap();
        assert_eq!(again.to_string(), text);
        assert_eq!(again.redis.hash_key.expose_secret(), "the-real-key");
        assert_eq!(again.amqp.url, "amqp://guest:***@127.0.0.1:5672/%2f");
    }

    #[test]
    fn debug_hides_passwords_and_the_hash_key() {
        let s = Settings::load_with_env(
            None,
            env(&[
                ("QUOTA_WORKER__AMQP__URL", "amqp://u:amqp-secret@h:5672/%2f"),
                ("QUOTA_WORKER__REDIS__URL", "redis://u:redis-secret@h:6379"),
                ("QUOTA_WORKER__REDIS__HASH_KEY", "hash-secret"),
            ]),
        )
        .unwrap();
        let shown = format!("{s:?}");
        for secret in ["amqp-secret", "redis-secret", "hash-secret"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(shown.contains("amqp://u:***@h:5672/%2f"), "{shown}");
    }

    #[test]
    fn secrets_can_come_from_files() {
        let dir = std::env::temp_dir().join(format!("qw-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("hash_key");
        let url = dir.join("amqp_url");
        std::fs::write(&key, "from-a-file\n").unwrap();
        std::fs::write(&url, "amqp://u:p@broker:5672/%2f").unwrap();
        let s = Settings::load_with_env(
            None,
            env(&[
                ("QUOTA_WORKER__REDIS__HASH_KEY_FILE", key.to_str().unwrap()),
                ("QUOTA_WORKER__AMQP__URL_FILE", url.to_str().unwrap()),
            ]),
        );
        let both = Settings::load_with_env(
            None,
            env(&[
                ("QUOTA_WORKER__REDIS__HASH_KEY_FILE", key.to_str().unwrap()),
                ("QUOTA_WORKER__REDIS__HASH_KEY", "x"),
            ]),
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let s = s.unwrap();
        assert_eq!(
            s.redis.hash_key.expose_secret(),
            "from-a-file",
            "one newline trimmed"
        );
        assert_eq!(s.amqp.url, "amqp://u:p@broker:5672/%2f");
        assert!(s.warnings().is_empty(), "{:?}", s.warnings());
        let err = both.unwrap_err();
        assert_eq!(err.key(), Some("redis.hash_key"));
        assert!(err.to_string().contains("set twice"), "{err}");

        let missing = Settings::load_with_env(
            None,
            env(&[("QUOTA_WORKER__REDIS__HASH_KEY_FILE", "/nonexistent/qw-key")]),
        )
        .unwrap_err();
        assert_eq!(missing.key(), Some("redis.hash_key"));
        assert_eq!(
            missing.origin(),
            Some(&Origin::Env {
                var: "QUOTA_WORKER__REDIS__HASH_KEY_FILE".into()
            })
        );
        assert!(
            missing.to_string().contains("/nonexistent/qw-key"),
            "{missing}"
        );
    }

    #[test]
    fn tls_keys_need_a_tls_url_and_urls_are_checked() {
        for (vars, key, says) in [
            (
                vec![("QUOTA_WORKER__AMQP__TLS__CA_FILE", "/etc/ca.pem")],
                "amqp.tls.ca_file",
                "amqps://",
            ),
            (
                vec![("QUOTA_WORKER__REDIS__TLS__INSECURE_SKIP_VERIFY", "true")],
                "redis.tls.insecure_skip_verify",
                "rediss://",
            ),
            (
                vec![
                    ("QUOTA_WORKER__AMQP__URL", "amqps://u:p@h/%2f"),
                    ("QUOTA_WORKER__AMQP__TLS__CA_FILE", "/nonexistent/ca.pem"),
                ],
                "amqp.tls.ca_file",
                "/nonexistent/ca.pem",
            ),
            (
                vec![("QUOTA_WORKER__REDIS__URL", "rediss://h:6380/#insecure")],
                "redis.url",
                "insecure_skip_verify",
            ),
            (
                vec![("QUOTA_WORKER__AMQP__URL", "http://h:5672/")],
                "amqp.url",
                "amqp",
            ),
            (
                vec![
                    ("QUOTA_WORKER__REDIS__URL", "rediss://h:6380"),
                    ("QUOTA_WORKER__REDIS__TLS__SERVER_NAME", "x"),
                ],
                "redis.tls.server_name",
                "not supported",
            ),
        ] {
            let err = Settings::load_with_env(None, env(&vars)).unwrap_err();
            assert_eq!(err.key(), Some(key), "{err}");
            assert!(err.to_string().contains(says), "{err} should say {says}");
        }
    }

    #[test]
    fn connections_say_how_each_is_made_and_warnings_flag_what_is_unsafe() {
        let s = Settings::load_with_env(
            None,
            env(&[
                ("QUOTA_WORKER__AMQP__URL", "amqps://u:p@broker.example/prod"),
                ("QUOTA_WORKER__AMQP__TLS__SERVER_NAME", "rabbit.internal"),
                ("QUOTA_WORKER__REDIS__URL", "rediss://cache.example:6380"),
                ("QUOTA_WORKER__REDIS__TLS__INSECURE_SKIP_VERIFY", "true"),
            ]),
        )
        .unwrap();
        let lines = s.connections();
        assert_eq!(
            lines[0],
            "broker broker.example:5671 vhost `prod`: TLS, certificate verified against \
             `rabbit.internal` with the system's roots, no client certificate"
        );
        assert!(lines[1].starts_with("redis cache.example:6380: TLS, certificate NOT verified"));
        let warnings = s.warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("redis.hash_key is the built-in default"));
        assert!(warnings[1].starts_with("redis.tls.insecure_skip_verify = true"));
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
