//! The HTTP section (`[http]`): whether the status, metrics, health and reload
//! endpoints are served, where, and the tokens the mutating ones ask for, each
//! with the name the action log gives its holder.

use std::collections::BTreeMap;
use std::fmt;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};

use super::error::{invalid, ConfigError};
use super::REDACTED;

/// HTTP endpoint settings (`[http]`): `/` (the status page), `/status.json`,
/// `/metrics`, `/healthz`, `/readyz`, and the mutating `POST /reload`, which needs
/// an admin token, `admin_token` or one of `admin_tokens` (or a loopback
/// `listen`). `Debug` and the printed form hide the tokens.
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
    /// warns). The console's login takes it too; the action log names its holder
    /// `admin`. `quota-worker admin reload` sends it. A secret:
    /// may come from the file named by `QUOTA_WORKER__HTTP__ADMIN_TOKEN_FILE`;
    /// printed as [`REDACTED`].
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "redacted_token"
    )]
    pub admin_token: Option<SecretString>,
    /// Further admin tokens by name, e.g. `admin_tokens = { alice = "…", bob = "…" }`:
    /// each is taken wherever `admin_token` is (`POST /reload`, the console's login),
    /// and the action log names who used it (`who = "alice"`; `admin_token` is the
    /// token named `admin`). A name is lower-case letters, digits, `-` and `_`, and
    /// not `admin` while `admin_token` is set; no two tokens are the same. Secrets:
    /// each may come from the file named by `QUOTA_WORKER__HTTP__ADMIN_TOKENS__NAME_FILE`;
    /// printed as [`REDACTED`].
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        serialize_with = "redacted_tokens"
    )]
    pub admin_tokens: BTreeMap<String, SecretString>,
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

fn redacted_tokens<S: Serializer>(
    tokens: &BTreeMap<String, SecretString>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_map(tokens.keys().map(|name| (name, REDACTED)))
}

/// The name `admin_token` goes by in the action log.
pub const ADMIN_TOKEN_NAME: &str = "admin";

impl fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpSettings")
            .field("enabled", &self.enabled)
            .field("listen", &self.listen)
            .field("admin_token", &self.admin_token.as_ref().map(|_| REDACTED))
            .field(
                "admin_tokens",
                &self
                    .admin_tokens
                    .keys()
                    .map(|n| (n, REDACTED))
                    .collect::<BTreeMap<_, _>>(),
            )
            .field("api_token", &self.api_token.as_ref().map(|_| REDACTED))
            .finish()
    }
}

/// A named token's name: a plain word the log can show (what an environment
/// variable's name can hold, lower-cased); not [`ADMIN_TOKEN_NAME`] beside `admin_token`.
fn check_name(key: &str, name: &str, admin_token_set: bool) -> Result<(), ConfigError> {
    let plain = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_';
    if name.is_empty() || name.len() > 64 || !name.bytes().all(plain) {
        return Err(invalid(
            key,
            format!(
                "`{name}` is not a token's name: 1 to 64 lower-case letters, digits, `-` or `_`"
            ),
        ));
    }
    if name == ADMIN_TOKEN_NAME && admin_token_set && key != "http.admin_token" {
        return Err(invalid(
            key,
            "`admin` is the name of http.admin_token, which is set too: keep one",
        ));
    }
    Ok(())
}

/// A token is not empty, not the printed placeholder, and fits in a header.
fn check_token(key: &str, token: Option<&SecretString>) -> Result<(), ConfigError> {
    let Some(token) = token else { return Ok(()) };
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
    Ok(())
}

impl HttpSettings {
    /// An enabled endpoint needs an address to listen on; a token is not empty,
    /// not the printed placeholder, and fits in a header; a named token's name is a
    /// plain word, and no two admin tokens are the same.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled {
            self.listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.listen)))?;
        }
        check_token("http.admin_token", self.admin_token.as_ref())?;
        check_token("http.api_token", self.api_token.as_ref())?;
        let named = self
            .admin_tokens
            .iter()
            .map(|(n, t)| (format!("http.admin_tokens.{n}"), n.as_str(), t));
        let all = (self.admin_token.iter())
            .map(|t| ("http.admin_token".to_string(), ADMIN_TOKEN_NAME, t))
            .chain(named);
        let mut seen: Vec<(String, &SecretString)> = Vec::new();
        for (key, name, token) in all {
            check_name(&key, name, self.admin_token.is_some())?;
            check_token(&key, Some(token))?;
            if let Some((other, _)) = seen
                .iter()
                .find(|(_, t)| t.expose_secret() == token.expose_secret())
            {
                return Err(invalid(
                    &key,
                    format!("the same token as {other}: each holder needs their own, so the log can say who"),
                ));
            }
            seen.push((key, token));
        }
        Ok(())
    }

    /// Every admin token with its name: `admin_token` as [`ADMIN_TOKEN_NAME`], then
    /// `admin_tokens`.
    pub fn admin_tokens(&self) -> Vec<(String, &SecretString)> {
        let named = self.admin_tokens.iter().map(|(n, t)| (n.clone(), t));
        self.admin_token
            .iter()
            .map(|t| (ADMIN_TOKEN_NAME.to_string(), t))
            .chain(named)
            .collect()
    }

    /// Whether any admin token is set.
    pub fn has_admin_token(&self) -> bool {
        self.admin_token.is_some() || !self.admin_tokens.is_empty()
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
        (self.enabled && !self.has_admin_token() && !self.loopback()).then(|| {
            format!(
                "http.listen = {} is not loopback and http.admin_token is not set (nor \
                 http.admin_tokens): POST /reload and the console answer 403 to everyone \
                 (use SIGHUP, or set http.admin_token, or \
                 QUOTA_WORKER__HTTP__ADMIN_TOKEN_FILE, to a long random secret)",
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
            admin_tokens: BTreeMap::new(),
            api_token: None,
        }
    }

    fn named(token: Option<&str>, tokens: &[(&str, &str)]) -> HttpSettings {
        let mut h = http("0.0.0.0:9464", token);
        for (name, t) in tokens {
            h.admin_tokens
                .insert(name.to_string(), SecretString::from(*t));
        }
        h
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
    fn named_tokens_are_checked_by_their_key_and_never_shown() {
        let h = named(Some("t-admin"), &[("alice", "t-alice"), ("bob-2", "t-bob")]);
        assert!(h.validate().is_ok());
        let names: Vec<String> = h.admin_tokens().into_iter().map(|(n, _)| n).collect();
        assert_eq!(names, ["admin", "alice", "bob-2"]);
        let shown = toml::to_string(&h).unwrap();
        assert!(
            !shown.contains("t-alice") && !shown.contains("t-bob"),
            "{shown}"
        );
        assert!(shown.contains("alice = \"<redacted>\""), "{shown}");
        assert!(!format!("{h:?}").contains("t-alice"));
        assert!(named(None, &[("admin", "t")]).validate().is_ok());
        for (bad, key, says) in [
            (
                named(None, &[("Alice", "t")]),
                "http.admin_tokens.Alice",
                "lower-case",
            ),
            (
                named(None, &[("a b", "t")]),
                "http.admin_tokens.a b",
                "lower-case",
            ),
            (
                named(None, &[("alice", "")]),
                "http.admin_tokens.alice",
                "empty",
            ),
            (
                named(None, &[("alice", REDACTED)]),
                "http.admin_tokens.alice",
                "real one",
            ),
            (
                named(Some("t"), &[("admin", "u")]),
                "http.admin_tokens.admin",
                "keep one",
            ),
            (
                named(Some("t"), &[("bob", "t")]),
                "http.admin_tokens.bob",
                "http.admin_token",
            ),
            (
                named(None, &[("alice", "t"), ("bob", "t")]),
                "http.admin_tokens.bob",
                "http.admin_tokens.alice",
            ),
        ] {
            let err = bad.validate().unwrap_err();
            assert_eq!(err.key(), Some(key), "{err}");
            assert!(err.to_string().contains(says), "{err}");
            assert!(!err.to_string().contains("\"t\""), "{err}");
        }
        assert!(named(None, &[("alice", "t")]).warning().is_none());
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
