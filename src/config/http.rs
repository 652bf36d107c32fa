//! The HTTP section (`[http]`): whether the status, metrics, health and reload
//! endpoints are served, where, and the token the mutating ones ask for.

use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use super::error::{invalid, ConfigError};
use super::REDACTED;

/// HTTP endpoint settings (`[http]`): `/` (the status page), `/status.json`,
/// `/metrics`, `/healthz`, `/readyz`, and the mutating `POST /reload`, which needs
/// `admin_token` (or a loopback `listen`). `Debug` and the
/// printed form hide the token.
#[derive(Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Whether the endpoints are served (default true; `run --no-http` also turns
    /// them off).
    pub enabled: bool,
    /// The socket address to listen on, `host:port` (default `127.0.0.1:9464`);
    /// only read when `enabled`.
    pub listen: String,
    /// The bearer token the mutating endpoints (`POST /reload`) ask for: `Authorization: Bearer <token>`, compared in constant time;
    /// without it or with another one they answer 401. Unset (the default): they
    /// answer on a loopback `listen` only, and 403 on any other (`config check`
    /// warns). `quota-worker admin reload` sends it. A secret:
    /// may come from the file named by `QUOTA_WORKER__HTTP__ADMIN_TOKEN_FILE`;
    /// printed as [`REDACTED`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "redacted_token"
    )]
    pub admin_token: Option<SecretString>,
    /// The bearer token the preferences API (`/v1/recipients/{recipient}/preferences`,
    /// every method) asks for: `Authorization: Bearer <token>`, its own, not
    /// `admin_token`; without it or with another one the API answers 401. Unset
    /// (the default): the API answers on a loopback `listen` only, and 403 on any
    /// other. A secret: may come from the file named by
    /// `QUOTA_WORKER__HTTP__API_TOKEN_FILE`; printed as [`REDACTED`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "redacted_token"
    )]
    pub api_token: Option<SecretString>,
}

fn redacted_token<S: Serializer>(_: &Option<SecretString>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(REDACTED)
}

impl fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSettings")
            .field("enabled", &self.enabled)
            .field("listen", &self.listen)
            .field("admin_token", &self.admin_token.as_ref().map(|_| REDACTED))
            .field("api_token", &self.api_token.as_ref().map(|_| REDACTED))
            .finish()
    }
}

impl HttpSettings {
    /// An enabled endpoint needs an address to listen on; a token is not empty,
    /// not the printed placeholder, and fits in a header.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled {
            self.listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.listen)))?;
        }
        for (key, token) in [
            ("http.admin_token", &self.admin_token),
            ("http.api_token", &self.api_token),
        ] {
            let Some(token) = token else { continue };
            let token = token.expose_secret();
            if token.is_empty() {
                return Err(invalid(key, "must not be empty (unset it instead)"));
            }
            if token == REDACTED {
                return Err(invalid(
                    key,
                    format!("`{REDACTED}` is what `config check` prints in place of the token; set the real one"),
                ));
            }
            if !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(invalid(
                    key,
                    "only printable ASCII without spaces (it is sent in a header)",
                ));
            }
        }
        Ok(())
    }

    /// Whether the endpoints listen on loopback only (`127.0.0.0/8`, `::1`).
    pub fn loopback(&self) -> bool {
        self.listen
            .parse::<std::net::SocketAddr>()
            .is_ok_and(|a| a.ip().is_loopback())
    }

    /// `config check`'s warning: the mutating endpoints are refused (403) because
    /// the endpoints listen beyond loopback without a token.
    pub(super) fn warning(&self) -> Option<String> {
        (self.enabled && self.admin_token.is_none() && !self.loopback()).then(|| {
            format!(
                "http.listen = {} is not loopback and http.admin_token is not set: POST \
                 /reload answers 403 to everyone (use SIGHUP, or set \
                 http.admin_token, or QUOTA_WORKER__HTTP__ADMIN_TOKEN_FILE, to a long \
                 random secret)",
                self.listen
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn http(listen: &str, token: Option<&str>) -> HttpSettings {
        HttpSettings {
            enabled: true,
            listen: listen.into(),
            admin_token: token.map(SecretString::from),
            api_token: None,
        }
    }

    #[test]
    fn the_address_is_checked_only_when_enabled() {
        let mut h = http("localhost", None);
        let err = h.validate().unwrap_err();
        assert_eq!(err.key(), Some("http.listen"));
        assert!(err.to_string().contains("`localhost`"), "{err}");
        h.enabled = false;
        assert!(h.validate().is_ok());
        h.listen = "127.0.0.1:9464".into();
        h.enabled = true;
        assert!(h.validate().is_ok());
    }

    #[test]
    fn a_token_is_checked_and_never_shown() {
        for bad in ["", REDACTED, "two words", "é"] {
            let err = http("127.0.0.1:9464", Some(bad)).validate().unwrap_err();
            assert_eq!(err.key(), Some("http.admin_token"), "{bad:?}");
        }
        let h = http("0.0.0.0:9464", Some("s3cret-token"));
        assert!(h.validate().is_ok());
        assert!(!format!("{h:?}").contains("s3cret"));
        let shown = toml::to_string(&h).unwrap();
        assert!(
            !shown.contains("s3cret") && shown.contains(REDACTED),
            "{shown}"
        );
        assert!(!toml::to_string(&http("0.0.0.0:1", None))
            .unwrap()
            .contains("admin_token"));
    }

    #[test]
    fn beyond_loopback_without_a_token_is_warned_about() {
        assert!(http("127.0.0.1:9464", None).warning().is_none());
        assert!(http("[::1]:9464", None).warning().is_none());
        assert!(http("0.0.0.0:9464", Some("t")).warning().is_none());
        let w = http("0.0.0.0:9464", None).warning().unwrap();
        assert!(w.contains("http.admin_token") && w.contains("403"), "{w}");
        let mut off = http("10.0.0.5:9464", None);
        off.enabled = false;
        assert!(off.warning().is_none());
    }
}
