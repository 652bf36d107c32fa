//! The Redis section (`[redis]`, with `[redis.sentinel]`): where Redis is (one
//! node, a cluster or Sentinel-managed replicas), how its writes are made durable,
//! and how long what the worker writes there is kept.

use std::fmt;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use super::endpoint::{check_tls, Endpoint};
use super::error::{invalid, ConfigError};
use super::report::redact_url;
use super::text::Dur;
use super::REDACTED;
use crate::tls::TlsSettings;

/// Redis settings (`[redis]`). `Debug` hides the URLs' passwords and the hash key;
/// serializing prints the hash key as [`REDACTED`].
///
/// One field per key of the table (the configuration reference lists them): it
/// mirrors the file's shape, so it has as many fields as `[redis]` has keys.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// The Redis node: `redis://` for plaintext, `rediss://` for TLS (verified as
    /// `tls` says), `redis://user:password@host:6379` with an ACL user. Default
    /// `redis://127.0.0.1:6379`. Not used with `cluster = true`; with `[sentinel]`
    /// it gives only the user, password and database. A secret: may come from the
    /// file named by `QUOTA_WORKER__REDIS__URL_FILE`.
    pub url: String,
    /// TLS of a `rediss://` URL (`[redis.tls]`); refused with `redis://`.
    #[serde(default)]
    pub tls: TlsSettings,
    /// Whether Redis is a Redis Cluster reached through `cluster_urls` (default
    /// false).
    pub cluster: bool,
    /// Seed nodes of the cluster, used with `cluster = true` (which needs at least
    /// one); empty by default. A secret, as `url`.
    pub cluster_urls: Vec<String>,
    /// Redis Sentinel (`[redis.sentinel]`): the sentinels are asked for the master,
    /// and asked again when it stops answering as one (a failover). Unset (the
    /// default): `url` is the master. Not with `cluster = true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelSettings>,
    /// After each admission call, wait until this many replicas have its writes
    /// (`WAIT`) before the verdict counts; 0 (the default): do not wait. Replication
    /// is asynchronous, so without it a failover can forget sends the old master had
    /// recorded (and the caps start afresh for them). On a cluster the `WAIT` follows
    /// each node's call, on connections the admissions keep for themselves; a
    /// master with fewer replicas answering (just promoted, none attached yet)
    /// holds its recipients' jobs, as a short `WAIT` does. A digest
    /// fold is waited for the same way (on a cluster, `WAIT` goes to the master that
    /// holds the fold, on connections the folds keep for themselves).
    pub wait_replicas: u32,
    /// How long one `WAIT` may take, 1ms to 1500ms (default `500ms`); a job whose
    /// admission was not replicated in time is held and retried, as when Redis is
    /// away. Only read when `wait_replicas` is above 0.
    pub wait_timeout: Dur,
    /// Every key the worker writes starts with this (default `qw`); no `{` or `}`.
    pub key_prefix: String,
    /// Secret of the keyed hash that turns recipients into key names. Changing it
    /// forgets every recorded send. The built-in default is public and warned about
    /// on every start; may come from the file named by
    /// `QUOTA_WORKER__REDIS__HASH_KEY_FILE`. Printed as [`REDACTED`].
    #[serde(serialize_with = "redacted_secret")]
    pub hash_key: SecretString,
    /// How long a dispatched job id is remembered, so a second copy is a duplicate
    /// (default `24h`; never shorter in effect than the longest window of the job's
    /// policy).
    pub dedupe_window: Dur,
    /// An admission not yet confirmed as dispatched after this long is taken to
    /// belong to a dead worker, and the job may be admitted again (default `2m`; at
    /// least `1s`).
    pub reservation_lease: Dur,
    /// How long the notes about a job (`admin job`), its cancel mark and its
    /// recipient's collapse keys and waiting set are kept after their last write
    /// (default `192h`); at least the longest `max_wait` of any policy.
    pub record_ttl: Dur,
    /// Whether the worker writes its notes about waiting and ended jobs (`admin
    /// job`, the recipient's waiting count); default true. Cancel marks are spent
    /// either way.
    pub notes: bool,
    /// What to do when Redis comes back without its data (its reset marker gone):
    /// `continue` (the default) or `pause` (hold the jobs that caps or lost
    /// preferences could stop, of enforced policies with rules and of policies that
    /// are not required, until `quota-worker admin resume`).
    #[serde(default)]
    pub on_reset: OnReset,
    /// With `on_reset = "pause"`: how long a held job waits in the delay ladder
    /// before it is decided again (default `60s`; between `1s` and `1h`). After
    /// `admin resume`, the held jobs come back within it.
    pub paused_hold: Dur,
}

/// `redis.on_reset`: what a worker does when Redis lost its data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnReset {
    /// Go on: every recipient's caps start afresh (logged, counted, shown).
    #[default]
    Continue,
    /// Hold the jobs that caps or preferences could stop (of enforced policies with
    /// rules, and of policies that are not required) until `admin resume`.
    Pause,
}

/// Redis Sentinel (`[redis.sentinel]`). `Debug` hides the URLs' passwords.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelSettings {
    /// The name the sentinels monitor the master under (`sentinel monitor NAME ...`).
    pub master_name: String,
    /// The sentinels, tried in turn (`redis://host:26379`; with a password to the
    /// sentinels themselves, `redis://:password@host:26379`). Plaintext only; at
    /// least one. A secret: may come from the file named by
    /// `QUOTA_WORKER__REDIS__SENTINEL__URLS_FILE`.
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
            .field("on_reset", &r.on_reset)
            .field("paused_hold", &r.paused_hold)
            .finish()
    }
}

impl RedisSettings {
    /// The key names `key_prefix` and `hash_key` give.
    pub fn keys(&self) -> crate::quota::keys::Keys {
        use secrecy::ExposeSecret;
        crate::quota::keys::Keys::new(&self.key_prefix, self.hash_key.expose_secret())
    }

    /// Check every value that parsing alone cannot: the key prefix and hash key
    /// ([`RedisSettings::validate_names`]), then the rest
    /// ([`RedisSettings::validate_servers`]).
    #[cfg(test)]
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.validate_names()?;
        self.validate_servers()
    }

    /// The key prefix and the hash key.
    pub(super) fn validate_names(&self) -> Result<(), ConfigError> {
        if self.key_prefix.contains(['{', '}']) {
            return Err(invalid("redis.key_prefix", "must not contain `{` or `}`"));
        }
        match self.hash_key.expose_secret() {
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
        Ok(())
    }

    /// The URLs and their TLS, the cluster, the sentinels, the replica waits and
    /// the reservation lease.
    pub(super) fn validate_servers(&self) -> Result<(), ConfigError> {
        self.endpoints()?;
        if self.cluster && self.cluster_urls.is_empty() {
            return Err(invalid(
                "redis.cluster_urls",
                "cluster = true needs at least one URL",
            ));
        }
        self.check_sentinel()?;
        if self.wait_replicas > 0 {
            let t = self.wait_timeout.0;
            if t < Duration::from_millis(1) || t > Duration::from_millis(1500) {
                return Err(invalid(
                    "redis.wait_timeout",
                    "must be between 1ms and 1500ms (every Redis call gives up after 2 s, \
                     and a WAIT holds the connection it runs on)",
                ));
            }
        }
        if self.reservation_lease.0 < Duration::from_secs(1) {
            return Err(invalid("redis.reservation_lease", "must be at least 1s"));
        }
        let hold = self.paused_hold.0;
        if hold < Duration::from_secs(1) || hold > Duration::from_secs(3600) {
            return Err(invalid("redis.paused_hold", "must be between 1s and 1h"));
        }
        Ok(())
    }

    /// The Redis URLs (`url`, or `cluster_urls` with `cluster = true`), parsed and
    /// checked as [`super::AmqpSettings::endpoints`] does.
    pub(crate) fn endpoints(&self) -> Result<Vec<Endpoint>, ConfigError> {
        use redis::{ConnectionAddr, IntoConnectionInfo};
        let (key, urls) = if self.cluster {
            ("redis.cluster_urls", self.cluster_urls.clone())
        } else {
            ("redis.url", vec![self.url.clone()])
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
        check_tls(&self.tls, "redis", tls)?;
        if self.tls.server_name.is_some() {
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
        let Some(sentinel) = &self.sentinel else {
            return Ok(());
        };
        if self.cluster {
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
        if self.url.starts_with("rediss://") {
            return Err(invalid(
                "redis.url",
                "rediss:// with `[redis.sentinel]`: TLS with Sentinel is not supported",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::env::env;
    use crate::config::Settings;

    #[test]
    fn keys_and_lease_are_checked() {
        let key_of = |change: fn(&mut RedisSettings)| {
            let mut r = Settings::defaults().redis;
            change(&mut r);
            r.validate().unwrap_err().key().map(str::to_string)
        };
        assert_eq!(
            key_of(|r| r.key_prefix = "a{b}".into()).as_deref(),
            Some("redis.key_prefix")
        );
        assert_eq!(
            key_of(|r| r.hash_key = SecretString::from("")).as_deref(),
            Some("redis.hash_key")
        );
        assert_eq!(
            key_of(|r| r.cluster = true).as_deref(),
            Some("redis.cluster_urls")
        );
        assert_eq!(
            key_of(|r| r.reservation_lease = Dur(Duration::from_millis(999))).as_deref(),
            Some("redis.reservation_lease")
        );
        assert_eq!(
            key_of(|r| r.paused_hold = Dur(Duration::from_millis(999))).as_deref(),
            Some("redis.paused_hold")
        );
        assert_eq!(
            key_of(|r| r.paused_hold = Dur(Duration::from_secs(3601))).as_deref(),
            Some("redis.paused_hold")
        );
        assert!(Settings::defaults().redis.validate().is_ok());
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
        // a cluster waits for replicas as Sentinel and a single node do, and its
        // wait_timeout is checked the same way
        let cluster = load(&[
            ("QUOTA_WORKER__REDIS__WAIT_REPLICAS", "1"),
            ("QUOTA_WORKER__REDIS__CLUSTER", "true"),
            ("QUOTA_WORKER__REDIS__CLUSTER_URLS", "redis://10.0.0.1:7000"),
        ])
        .unwrap();
        assert!(cluster.redis.cluster);
        assert_eq!(cluster.redis.wait_replicas, 1);
        assert_eq!(
            key_of(&[
                ("QUOTA_WORKER__REDIS__WAIT_REPLICAS", "1"),
                ("QUOTA_WORKER__REDIS__WAIT_TIMEOUT", "2s"),
                ("QUOTA_WORKER__REDIS__CLUSTER", "true"),
                ("QUOTA_WORKER__REDIS__CLUSTER_URLS", "redis://10.0.0.1:7000")
            ])
            .as_deref(),
            Some("redis.wait_timeout")
        );
    }

    #[test]
    fn on_reset_is_continue_or_pause() {
        let load =
            |v: &str| Settings::load_with_env(None, env(&[("QUOTA_WORKER__REDIS__ON_RESET", v)]));
        assert_eq!(Settings::defaults().redis.on_reset, OnReset::Continue);
        assert_eq!(load("pause").unwrap().redis.on_reset, OnReset::Pause);
        let err = load("stop").unwrap_err();
        assert_eq!(err.key(), Some("redis.on_reset"), "{err}");
    }
}
