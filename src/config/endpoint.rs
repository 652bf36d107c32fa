//! Where a connection goes, as its URL says, and the check that a section's TLS
//! keys go with a TLS URL (their files read and parsed by [`crate::tls`]).

use super::error::{invalid, ConfigError};
use crate::tls::TlsSettings;

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

/// TLS keys only with a TLS URL; their files readable and valid. `section` is
/// `amqp` or `redis`, for the errors.
pub(super) fn check_tls(
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
