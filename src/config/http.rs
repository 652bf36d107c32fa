//! The HTTP section (`[http]`): whether the status, metrics, health and reload
//! endpoints are served, and where.

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};

/// HTTP endpoint settings (`[http]`): `/` (the status page), `/status.json`,
/// `/metrics`, `/healthz`, `/readyz` and `POST /reload`. Nothing there asks who is
/// calling: keep it on loopback or a private network.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    /// Whether the endpoints are served (default true; `run --no-http` also turns
    /// them off).
    pub enabled: bool,
    /// The socket address to listen on, `host:port` (default `127.0.0.1:9464`);
    /// only read when `enabled`.
    pub listen: String,
}

impl HttpSettings {
    /// An enabled endpoint needs an address to listen on.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled {
            self.listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| invalid("http.listen", format!("`{}`: {e}", self.listen)))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_address_is_checked_only_when_enabled() {
        let mut h = HttpSettings {
            enabled: true,
            listen: "localhost".into(),
        };
        let err = h.validate().unwrap_err();
        assert_eq!(err.key(), Some("http.listen"));
        assert!(err.to_string().contains("`localhost`"), "{err}");
        h.enabled = false;
        assert!(h.validate().is_ok());
        h.listen = "127.0.0.1:9464".into();
        h.enabled = true;
        assert!(h.validate().is_ok());
    }
}
