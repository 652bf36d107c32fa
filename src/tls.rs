//! TLS for the broker and Redis connections: rustls with the ring provider, the
//! system's roots unless a CA file replaces them, an optional client certificate
//! (mutual TLS), and a loud opt-out of verification.
//!
//! An `amqps://` or `rediss://` URL never connects without TLS: the AMQP stream is
//! upgraded with [`amqp_client_config`] before a byte of AMQP is sent, and anything that
//! keeps TLS from being set up (an unreadable CA file, a key that does not parse)
//! is an error naming the key, at `config check` and at start alike. The files are
//! read here and nowhere else.
//!
//! The settings of one connection's TLS ([`TlsSettings`]) are defined here; the
//! configuration reads them into its `[amqp.tls]` and `[redis.tls]` sections and
//! calls `load` to check them. This module knows nothing of the configuration.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Once};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

use serde::{Deserialize, Serialize};

/// TLS settings of one connection (`[amqp.tls]`, `[redis.tls]`). They apply to an
/// `amqps://` or `rediss://` URL and are refused with a plaintext one. Unset, the
/// server's certificate is verified against the URL's host with the system's roots,
/// and no client certificate is sent.
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
    pub(crate) fn is_set(&self) -> bool {
        *self != TlsSettings::default()
    }
}

/// TLS could not be set up as configured; `key` names the setting to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for `{key}`: {reason}")]
pub struct TlsError {
    /// Dotted key, e.g. `amqp.tls.ca_file`.
    pub key: String,
    /// What is wrong with its value.
    pub reason: String,
}

fn error(section: &str, key: &str, reason: impl Into<String>) -> TlsError {
    TlsError {
        key: format!("{section}.{key}"),
        reason: reason.into(),
    }
}

/// Install ring as the process's rustls provider (once; both clients use it).
pub fn install_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err only if another provider was installed first, which is as good
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// The PEM files one connection's TLS settings name, read and checked.
#[derive(Clone)]
pub(crate) struct Material {
    /// The CA file's text and its certificates, when one replaces the system roots.
    pub ca: Option<(Vec<u8>, Vec<CertificateDer<'static>>)>,
    /// The client certificate's and key's text, for mutual TLS.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("ca", &self.ca.as_ref().map(|(_, c)| c.len()))
            .field("client", &self.client.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

fn read(section: &str, key: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| {
        error(
            section,
            key,
            format!("cannot read `{}`: {e}", path.display()),
        )
    })
}

/// Read and check the files of `tls` (`section`: `amqp.tls` or `redis.tls`, for
/// the errors).
pub(crate) fn load(tls: &TlsSettings, section: &str) -> Result<Material, TlsError> {
    let ca = match &tls.ca_file {
        None => None,
        Some(path) => {
            let text = read(section, "ca_file", path)?;
            let certs = CertificateDer::pem_slice_iter(&text)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| error(section, "ca_file", format!("`{}`: {e}", path.display())))?;
            if certs.is_empty() {
                return Err(error(
                    section,
                    "ca_file",
                    format!("`{}` holds no PEM certificate", path.display()),
                ));
            }
            let mut roots = RootCertStore::empty();
            for cert in &certs {
                roots
                    .add(cert.clone())
                    .map_err(|e| error(section, "ca_file", format!("`{}`: {e}", path.display())))?;
            }
            Some((text, certs))
        }
    };
    let client = match (&tls.cert_file, &tls.key_file) {
        (None, None) => None,
        (Some(_), None) => return Err(error(section, "key_file", "`cert_file` needs a key")),
        (None, Some(_)) => return Err(error(section, "cert_file", "`key_file` needs a cert")),
        (Some(cert_path), Some(key_path)) => {
            let cert = read(section, "cert_file", cert_path)?;
            let key = read(section, "key_file", key_path)?;
            let chain = client_chain(&cert).map_err(|e| {
                error(
                    section,
                    "cert_file",
                    format!("`{}`: {e}", cert_path.display()),
                )
            })?;
            if chain.is_empty() {
                return Err(error(
                    section,
                    "cert_file",
                    format!("`{}` holds no PEM certificate", cert_path.display()),
                ));
            }
            PrivateKeyDer::from_pem_slice(&key).map_err(|e| {
                error(
                    section,
                    "key_file",
                    format!("`{}`: no PEM private key ({e})", key_path.display()),
                )
            })?;
            Some((cert, key))
        }
    };
    Ok(Material { ca, client })
}

fn client_chain(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, rustls::pki_types::pem::Error> {
    CertificateDer::pem_slice_iter(pem).collect()
}

/// The rustls client configuration for the broker: the CA file's certificates or
/// the system's roots, the client certificate if any, or no verification at all
/// when `insecure_skip_verify` says so.
pub(crate) fn amqp_client_config(tls: &TlsSettings) -> Result<ClientConfig, TlsError> {
    install_provider();
    let section = "amqp.tls";
    let material = load(tls, section)?;
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| error(section, "ca_file", e.to_string()))?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AcceptAnyCertificate(provider)))
    } else {
        let mut roots = RootCertStore::empty();
        match material.ca {
            Some((_, certs)) => {
                for cert in certs {
                    roots
                        .add(cert)
                        .map_err(|e| error(section, "ca_file", e.to_string()))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(error(
                        section,
                        "ca_file",
                        "not set, and the system has no root certificates (install \
                         ca-certificates, or name the CA file)",
                    ));
                }
            }
        }
        builder.with_root_certificates(roots)
    };
    match material.client {
        None => Ok(builder.with_no_client_auth()),
        Some((cert, key)) => {
            let chain =
                client_chain(&cert).map_err(|e| error(section, "cert_file", e.to_string()))?;
            let key = PrivateKeyDer::from_pem_slice(&key)
                .map_err(|e| error(section, "key_file", e.to_string()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| error(section, "key_file", e.to_string()))
        }
    }
}

/// The name the broker's certificate is verified against: `server_name`, or the
/// URL's host.
pub(crate) fn server_name(tls: &TlsSettings, host: &str) -> Result<ServerName<'static>, TlsError> {
    let name = tls.server_name.as_deref().unwrap_or(host);
    ServerName::try_from(name.to_string()).map_err(|e| {
        let key = if tls.server_name.is_some() {
            "server_name"
        } else {
            "server_name (the URL's host)"
        };
        error("amqp.tls", key, format!("`{name}`: {e}"))
    })
}

/// `insecure_skip_verify`: any certificate, any name. The handshake's signatures
/// are still checked, so the session is encrypted to whoever answered.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// The certificates the Redis client needs for `tls` (`None`: the system's roots,
/// no client certificate).
pub(crate) fn redis_certificates(
    tls: &TlsSettings,
) -> Result<Option<redis::TlsCertificates>, TlsError> {
    install_provider();
    let material = load(tls, "redis.tls")?;
    if material.ca.is_none() && material.client.is_none() {
        return Ok(None);
    }
    Ok(Some(redis::TlsCertificates {
        client_tls: material
            .client
            .map(|(client_cert, client_key)| redis::ClientTlsConfig {
                client_cert,
                client_key,
            }),
        root_cert: material.ca.map(|(text, _)| text),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(ca: Option<&Path>) -> TlsSettings {
        TlsSettings {
            ca_file: ca.map(Path::to_path_buf),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_ca_file_names_its_key() {
        let err = load(
            &settings(Some(Path::new("/nonexistent/ca.pem"))),
            "amqp.tls",
        )
        .unwrap_err();
        assert_eq!(err.key, "amqp.tls.ca_file");
        assert!(err.reason.contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn a_file_without_certificates_is_refused() {
        let path = std::env::temp_dir().join(format!("qw-tls-empty-{}.pem", std::process::id()));
        std::fs::write(&path, "not a certificate\n").unwrap();
        let err = load(&settings(Some(&path)), "redis.tls").unwrap_err();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(err.key, "redis.tls.ca_file");
        assert!(err.reason.contains("no PEM certificate"), "{err}");
    }

    #[test]
    fn a_certificate_needs_its_key_and_a_key_its_certificate() {
        let cert_only = TlsSettings {
            cert_file: Some("/x.pem".into()),
            ..Default::default()
        };
        assert_eq!(
            load(&cert_only, "amqp.tls").unwrap_err().key,
            "amqp.tls.key_file"
        );
        let key_only = TlsSettings {
            key_file: Some("/x.key".into()),
            ..Default::default()
        };
        assert_eq!(
            load(&key_only, "amqp.tls").unwrap_err().key,
            "amqp.tls.cert_file"
        );
    }

    #[test]
    fn the_system_roots_serve_when_no_ca_file_is_named() {
        // this machine has ca-certificates
        amqp_client_config(&TlsSettings::default()).unwrap();
    }

    #[test]
    fn the_server_name_defaults_to_the_host() {
        let tls = TlsSettings::default();
        assert_eq!(
            server_name(&tls, "broker.example").unwrap(),
            ServerName::try_from("broker.example").unwrap()
        );
        let named = TlsSettings {
            server_name: Some("rabbit.internal".into()),
            ..Default::default()
        };
        assert_eq!(
            server_name(&named, "10.0.0.7").unwrap(),
            ServerName::try_from("rabbit.internal").unwrap()
        );
    }
}
