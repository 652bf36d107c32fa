//! The environment layer: `QUOTA_WORKER__SECTION__KEY` variables override the file,
//! and a secret may be read from the file its `<VARIABLE>_FILE` names (as Docker
//! and Kubernetes mount secrets). Reads the named files; nothing else here does I/O.

use std::collections::BTreeMap;

use super::error::{invalid, ConfigError};
use super::locate::Origin;

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "QUOTA_WORKER";

/// The keys that may also be read from a file named by `<VARIABLE>_FILE` (as the
/// official RabbitMQ, Redis and Postgres images do, for Docker and Kubernetes
/// secrets). Other keys ending in `_file` (`amqp.tls.ca_file`) are paths themselves.
pub const SECRET_KEYS: [&str; 8] = [
    "amqp.url",
    "amqp.urls",
    "redis.url",
    "redis.cluster_urls",
    "redis.sentinel.urls",
    "redis.hash_key",
    "http.admin_token",
    "http.api_token",
];

/// The table whose every entry is a secret (`QUOTA_WORKER__HTTP__ADMIN_TOKENS__ALICE_FILE`).
const SECRET_TABLES: [&str; 1] = ["http.admin_tokens"];

/// Whether `key` may be read from a file: one of [`SECRET_KEYS`], or an entry of a
/// table of secrets (`http.admin_tokens.alice`).
pub fn is_secret_key(key: &str) -> bool {
    SECRET_KEYS.contains(&key)
        || SECRET_TABLES.iter().any(|table| {
            key.strip_prefix(table)
                .and_then(|rest| rest.strip_prefix('.'))
                .is_some_and(|name| !name.is_empty() && !name.contains('.'))
        })
}

/// The keys that hold a list of URLs (comma-separated in a variable or its file).
const URL_LIST_KEYS: [&str; 3] = ["amqp.urls", "redis.cluster_urls", "redis.sentinel.urls"];

/// `env` read as the configuration's variables are written: `__` between the
/// prefix, the section and the key, values parsed as numbers and booleans where
/// they look like one, and the URL lists split at commas.
pub(super) fn layout(env: config::Environment) -> config::Environment {
    env.separator("__")
        .prefix_separator("__")
        .try_parsing(true)
        .list_separator(",")
        .with_list_parse_key("redis.cluster_urls")
        .with_list_parse_key("redis.sentinel.urls")
        .with_list_parse_key("amqp.urls")
}

/// The environment's values by dotted key, with `<SECRET>_FILE` variables replaced
/// by the file's content, and the variable each key came from.
pub(super) struct EnvValues {
    /// The values to lay over the file, by dotted key.
    pub values: Vec<(String, config::Value)>,
    /// The variable that set each dotted key.
    pub origins: BTreeMap<String, String>,
}

impl EnvValues {
    pub(super) fn read(env: &config::Environment) -> Result<EnvValues, ConfigError> {
        use config::Source;
        let var = |key: &str| format!("{ENV_PREFIX}__{}", key.replace('.', "__").to_uppercase());
        let collected = env.collect()?;
        let mut out = EnvValues {
            values: Vec::new(),
            origins: BTreeMap::new(),
        };
        for (key, value) in &collected {
            let Some(base) = key.strip_suffix("_file").filter(|base| is_secret_key(base)) else {
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

/// The environment made of `vars` alone, for the tests.
#[cfg(test)]
pub(super) fn env(vars: &[(&str, &str)]) -> config::Environment {
    let map = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config::Environment::with_prefix(ENV_PREFIX).source(Some(map))
}

#[cfg(test)]
mod tests {
    use secrecy::ExposeSecret;

    use super::*;
    use crate::config::Settings;
    use crate::quota::policy::Rate;

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
}
