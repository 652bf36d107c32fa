//! Connecting to the broker: plaintext for `amqp://`, TLS for `amqps://` (never
//! plaintext), with a deadline; and what a broker error means for the worker.
//!
//! Only the broker's own refusals, 406 PRECONDITION_FAILED (a queue or exchange
//! exists with other arguments) and 403 ACCESS_REFUSED (the user may not log in, or
//! may not use a resource), and a TLS setup that cannot work, are fatal
//! ([`BrokerError::is_fatal`]). Everything else (a reset connection, a timeout, a
//! quorum queue without a leader yet, a node going down) is transient: the worker
//! reconnects with backoff.

use std::sync::Arc;
use std::time::Duration;

use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};

use crate::tls::TlsSettings;
use crate::tls::{self, TlsError};

/// A broker failure.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// The connection or channel failed. (Not a `source`: lapin's message already
    /// says what its source says, and error chains would print it twice.)
    #[error("amqp: {0}")]
    Amqp(lapin::Error),
    /// No answer within the deadline.
    #[error("{0} timed out after {1:?}")]
    Timeout(&'static str, Duration),
    /// Declaring a queue or exchange failed. Fatal when the broker refused it (406:
    /// it exists with other arguments; 403: no permission), transient otherwise.
    #[error("cannot declare {what}: {error}{}", declare_hint(.error))]
    Declare {
        /// Which declaration.
        what: String,
        /// The broker's words.
        error: lapin::Error,
    },
    /// The URL is not an AMQP URL.
    #[error("invalid value for `amqp.url`: {0}")]
    Url(String),
    /// TLS cannot be set up as configured (never falls back to plaintext).
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl From<lapin::Error> for BrokerError {
    fn from(e: lapin::Error) -> BrokerError {
        BrokerError::Amqp(e)
    }
}

/// The broker's reply code in `error`, when it is the broker's refusal.
fn reply_code(error: &lapin::Error) -> Option<u16> {
    match error.kind() {
        lapin::ErrorKind::ProtocolError(e) => Some(e.get_id()),
        _ => None,
    }
}

/// 406 PRECONDITION_FAILED and 403 ACCESS_REFUSED: retrying cannot help.
fn refused(error: &lapin::Error) -> bool {
    matches!(reply_code(error), Some(403 | 406))
}

fn declare_hint(error: &lapin::Error) -> &'static str {
    match reply_code(error) {
        Some(406) => ". An existing queue or exchange has other arguments; delete it or change the names in [amqp]",
        Some(403) => ". The user in amqp.url may not configure this resource in its vhost",
        _ => "",
    }
}

impl BrokerError {
    /// Whether retrying cannot help, so the worker stops with this error: the
    /// broker refused a declaration or the login (406, 403), or TLS or the URL
    /// is misconfigured.
    pub fn is_fatal(&self) -> bool {
        match self {
            BrokerError::Declare { error, .. } | BrokerError::Amqp(error) => refused(error),
            BrokerError::Url(_) | BrokerError::Tls(_) => true,
            BrokerError::Timeout(..) => false,
        }
    }
}

/// Connect with a deadline: plaintext for `amqp://`, TLS for `amqps://` (verified
/// as `tls` says; never plaintext).
pub async fn connect(
    url: &str,
    tls: &TlsSettings,
    name: &str,
    timeout: Duration,
) -> Result<Connection, BrokerError> {
    let uri: AMQPUri = url
        .parse()
        .map_err(|e| BrokerError::Url(format!("{}: {e}", crate::config::redact_url(url))))?;
    let props = ConnectionProperties::default().with_connection_name(name.into());
    let connect = async {
        match uri.scheme {
            AMQPScheme::AMQP => Connection::connect_uri(uri, props)
                .await
                .map_err(BrokerError::from),
            AMQPScheme::AMQPS => connect_tls(uri, tls, props).await,
        }
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| BrokerError::Timeout("connecting to the broker", timeout))?
}

/// Connect to the first of `urls` that answers, trying them in order (the CLI's
/// connections; the worker itself moves to the next URL with each session). The
/// last error when none does; a fatal one ([`BrokerError::is_fatal`]) at once.
pub async fn connect_any(
    urls: &[&str],
    tls: &TlsSettings,
    name: &str,
    timeout: Duration,
) -> Result<Connection, BrokerError> {
    let mut last = BrokerError::Url("no broker URL configured".into());
    for url in urls {
        match connect(url, tls, name, timeout).await {
            Ok(conn) => return Ok(conn),
            Err(e) if e.is_fatal() => return Err(e),
            Err(e) => {
                tracing::debug!(error = %e, broker = %crate::config::redact_url(url), "trying the next broker");
                last = e;
            }
        }
    }
    Err(last)
}

/// The TLS connection: TCP, then the rustls handshake with our own configuration
/// (CA file or system roots, client certificate, server name), then AMQP.
async fn connect_tls(
    uri: AMQPUri,
    tls: &TlsSettings,
    props: ConnectionProperties,
) -> Result<Connection, BrokerError> {
    let connector = RustlsConnector::from(Arc::new(tls::amqp_client_config(tls)?));
    let server_name = tls::server_name(tls, &uri.authority.host)?;
    let server_name = server_name.to_str().into_owned();
    let runtime = lapin::runtime::default_runtime()?;
    let handshake = async move |uri: AMQPUri, runtime| {
        let addrs: Vec<std::net::SocketAddr> =
            tokio::net::lookup_host((uri.authority.host.as_str(), uri.authority.port))
                .await?
                .collect();
        let stream = AsyncTcpStream::connect(&runtime, addrs).await?;
        let (host, port) = (&uri.authority.host, uri.authority.port);
        let tls = stream.into_rustls(&connector, &server_name).await;
        Ok(tls.map_err(|e| {
            // a plaintext listener answers the ClientHello with AMQP's protocol header
            let hint = match e.to_string().contains("InvalidContentType") {
                true => " (the port does not speak TLS: amqps:// needs the broker's TLS listener, 5671 by default)",
                false => "",
            };
            std::io::Error::new(
                e.kind(),
                format!("TLS with {host}:{port} as `{server_name}` failed: {e}{hint}"),
            )
        })?)
    };
    Ok(Connection::connector(uri, runtime, handshake, props).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::protocol::{AMQPError, AMQPErrorKind, AMQPHardError, AMQPSoftError};

    fn broker_said(kind: AMQPErrorKind) -> lapin::Error {
        lapin::ErrorKind::ProtocolError(AMQPError::new(kind, "words".into())).into()
    }

    #[test]
    fn only_the_brokers_refusals_and_tls_setup_are_fatal() {
        let declare = |error| BrokerError::Declare {
            what: "queue `q`".into(),
            error,
        };
        let soft = |e| broker_said(AMQPErrorKind::Soft(e));
        let hard = |e| broker_said(AMQPErrorKind::Hard(e));
        for (error, fatal) in [
            (declare(soft(AMQPSoftError::PRECONDITIONFAILED)), true),
            (declare(soft(AMQPSoftError::ACCESSREFUSED)), true),
            (BrokerError::Amqp(soft(AMQPSoftError::ACCESSREFUSED)), true),
            (declare(hard(AMQPHardError::CONNECTIONFORCED)), false),
            (declare(soft(AMQPSoftError::RESOURCELOCKED)), false),
            (declare(hard(AMQPHardError::INTERNALERROR)), false),
            (
                declare(std::io::Error::from(std::io::ErrorKind::ConnectionReset).into()),
                false,
            ),
            (
                BrokerError::Timeout("declaring", Duration::from_secs(1)),
                false,
            ),
            (
                BrokerError::Tls(TlsError {
                    key: "amqp.tls.ca_file".into(),
                    reason: "unreadable".into(),
                }),
                true,
            ),
        ] {
            assert_eq!(error.is_fatal(), fatal, "{error}");
        }
    }

    #[test]
    fn a_refused_declaration_says_what_to_do() {
        let error = BrokerError::Declare {
            what: "queue `q`".into(),
            error: broker_said(AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED)),
        };
        assert!(error.to_string().contains("has other arguments"), "{error}");
    }
}
