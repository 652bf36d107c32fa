//! What `config check` shows of a configuration: the settings as TOML with secrets
//! redacted ([`Settings`]'s `Display`), one line per connection, and the warnings
//! an operator should read before running it.

use std::fmt;

use secrecy::ExposeSecret;

use super::endpoint::Endpoint;
use super::{Settings, DEFAULT_HASH_KEY};
use crate::tls::TlsSettings;

impl Settings {
    /// What a careful operator should know before running this configuration:
    /// the built-in hash key, mutating endpoints refused beyond loopback for want
    /// of a token, TLS verification turned off, and a cap matching a category no
    /// policy is named (categories are open: never an error). `run` logs each one
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
        out.extend(self.http.warning());
        for (section, tls) in [("amqp", &self.amqp.tls), ("redis", &self.redis.tls)] {
            if tls.insecure_skip_verify {
                out.push(format!(
                    "{section}.tls.insecure_skip_verify = true: the server's certificate is \
                     not verified, so anyone on the network path can pose as the server and \
                     read the credentials and every message"
                ));
            }
        }
        for (name, cap) in &self.caps {
            for c in cap.matches.categories.iter().flatten() {
                if !self.policies.contains_key(c) {
                    out.push(format!(
                        "caps.{name}.match.categories names `{c}`, which no policy is named: \
                         the cap still matches jobs of that category (they meet policy \
                         `default`), but check the spelling"
                    ));
                }
            }
        }
        out
    }

    /// One line per connection saying how it is made (`config check` prints them).
    pub fn connections(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Ok(es) = self.amqp_endpoints() {
            for e in es {
                out.push(describe("broker", &e, &self.amqp.tls));
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
                out.push(describe("redis", &e, &self.redis.tls));
            }
        }
        out
    }

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

/// `broker host:port vhost `v`: TLS, certificate verified against ...`: how the
/// connection `name` to `e` is made.
fn describe(name: &str, e: &Endpoint, tls: &TlsSettings) -> String {
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
    format!("{name} {at}: TLS, {}", parts.join(", "))
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
    use secrecy::ExposeSecret;

    use super::*;
    use crate::config::env::env;
    use crate::config::{Origin, REDACTED};

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
