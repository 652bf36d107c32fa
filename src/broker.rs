//! Broker plumbing: connecting (plaintext or TLS), declaring the whole topology
//! (idempotently, refusing to start on a conflicting queue), and publishing with
//! confirms and a deadline.
//!
//! What stops the worker and what it waits out: only the broker's own refusals,
//! 406 PRECONDITION_FAILED (a queue or exchange exists with other arguments) and
//! 403 ACCESS_REFUSED (the user may not log in, or may not use a resource), and a
//! TLS setup that cannot work, are fatal ([`BrokerError::is_fatal`]). Everything
//! else (a reset connection, a timeout, a quorum queue without a leader yet, a node
//! going down) is transient: the worker reconnects with backoff.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions,
    QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::Confirmation;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};

use crate::config::{AmqpSettings, QueueType, Settings, TlsSettings};
use crate::delay::Ladder;
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

/// Why a publish did not land.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The message could not be routed (mandatory) and came back.
    #[error("returned by the broker as unroutable")]
    Returned,
    /// The broker refused it.
    #[error("nacked by the broker")]
    Nacked,
    /// The broker did not confirm in time.
    #[error("no confirm within {0:?}")]
    Timeout(Duration),
    /// The channel or connection failed.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
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

/// Publishes on one confirm-mode channel; every publish waits for its confirm, with
/// a deadline, and a returned (unroutable) message counts as a failure.
#[derive(Clone, Debug)]
pub struct Publisher {
    channel: Channel,
    timeout: Duration,
}

impl Publisher {
    /// Open a confirm-mode channel on `conn`.
    pub async fn open(conn: &Connection, timeout: Duration) -> Result<Publisher, BrokerError> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        Ok(Publisher { channel, timeout })
    }

    /// Publish persistently and mandatorily; Ok only once the broker confirmed it and
    /// did not return it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let properties = properties.with_delivery_mode(2);
        let work = async {
            let confirm = self
                .channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    options,
                    body,
                    properties,
                )
                .await?;
            confirmed(confirm.await?)
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| PublishError::Timeout(self.timeout))?
    }
}

/// A publisher confirm as a result: a returned (unroutable) message is a failure.
pub fn confirmed(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(PublishError::Returned),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
    }
}

/// Every name of the topology, derived from the settings.
#[derive(Debug, Clone)]
pub struct Topology {
    /// The settings it comes from.
    pub amqp: AmqpSettings,
    /// The configured channels.
    pub channels: Vec<String>,
}

/// Delete `queues` and `exchanges` (each on a fresh channel after a failure, since a
/// failed delete closes its channel); every one is tried, the first error returned.
pub async fn delete_all(
    conn: &Connection,
    queues: Vec<String>,
    exchanges: Vec<String>,
) -> Result<(), BrokerError> {
    let queues = queues.into_iter().map(|q| (q, true));
    let exchanges = exchanges.into_iter().map(|x| (x, false));
    let mut first = None;
    let mut ch = conn.create_channel().await?;
    for (name, is_queue) in queues.chain(exchanges) {
        let deleted = if is_queue {
            ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .map(|_| ())
        } else {
            ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                .await
        };
        if let Err(e) = deleted {
            first.get_or_insert(e);
            ch = conn.create_channel().await?;
        }
    }
    let _ = ch.close(200, "".into()).await;
    match first {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

impl Topology {
    /// The topology `settings` names.
    pub fn from_settings(settings: &Settings) -> Topology {
        Topology {
            amqp: settings.amqp.clone(),
            channels: settings.channels.keys().cloned().collect(),
        }
    }

    /// The delay ladder.
    pub fn ladder(&self) -> Ladder {
        Ladder {
            prefix: self.amqp.delay_prefix.clone(),
            levels: self.amqp.delay_levels,
        }
    }

    /// The dispatch queue of `channel`.
    pub fn dispatch_queue(&self, channel: &str) -> String {
        format!("{}{channel}", self.amqp.dispatch_queue_prefix)
    }

    /// Every queue, in the order an operator reads them: jobs, delays, dispatch, dead.
    pub fn queues(&self) -> Vec<String> {
        let ladder = self.ladder();
        let mut q = vec![self.amqp.jobs_queue.clone()];
        q.extend((0..ladder.levels).map(|n| ladder.queue(n)));
        q.extend(self.channels.iter().map(|c| self.dispatch_queue(c)));
        q.push(self.amqp.dead_queue.clone());
        q
    }

    /// Every exchange: jobs, dispatch, dead, then the ladder's.
    pub fn exchanges(&self) -> Vec<String> {
        let ladder = self.ladder();
        let mut x = vec![
            self.amqp.jobs_exchange.clone(),
            self.amqp.dispatch_exchange.clone(),
            self.amqp.dead_exchange.clone(),
        ];
        x.extend((0..ladder.levels).map(|n| ladder.exchange(n)));
        x
    }

    /// Delete every queue and exchange of the topology, and the messages in them: the
    /// tear-down of a namespace made for a test or a benchmark. What does not exist is
    /// skipped; a failed delete does not stop the others (each gets its own channel
    /// after an error), and the first error is returned.
    pub async fn delete(&self, conn: &Connection) -> Result<(), BrokerError> {
        delete_all(conn, self.queues(), self.exchanges()).await
    }

    fn queue_args(&self, dead_letter_to: Option<&str>) -> FieldTable {
        let mut args = FieldTable::default();
        if self.amqp.queue_type == QueueType::Quorum {
            args.insert("x-queue-type".into(), long("quorum"));
        }
        if let Some(dlx) = dead_letter_to {
            args.insert("x-dead-letter-exchange".into(), long(dlx));
            if self.amqp.queue_type == QueueType::Quorum {
                args.insert("x-dead-letter-strategy".into(), long("at-least-once"));
                args.insert("x-overflow".into(), long("reject-publish"));
            }
        }
        args
    }

    /// Declare every exchange, queue and binding. Idempotent; a queue that exists with
    /// other arguments is a fatal [`BrokerError::Declare`].
    pub async fn declare(&self, conn: &Connection) -> Result<(), BrokerError> {
        let ch = conn.create_channel().await?;
        let a = &self.amqp;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let exchange = |name: String, kind: ExchangeKind| {
            let ch = ch.clone();
            async move {
                ch.exchange_declare(name.as_str().into(), kind, durable, FieldTable::default())
                    .await
                    .map_err(|error| BrokerError::Declare {
                        what: format!("exchange `{name}`"),
                        error,
                    })
            }
        };
        let queue = |name: String, args: FieldTable| {
            let ch = ch.clone();
            async move {
                let opts = QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                };
                ch.queue_declare(name.as_str().into(), opts, args)
                    .await
                    .map_err(|error| BrokerError::Declare {
                        what: format!("queue `{name}`"),
                        error,
                    })
            }
        };
        exchange(a.jobs_exchange.clone(), ExchangeKind::Fanout).await?;
        exchange(a.dispatch_exchange.clone(), ExchangeKind::Direct).await?;
        exchange(a.dead_exchange.clone(), ExchangeKind::Fanout).await?;

        // Quorum queues count deliveries, and RabbitMQ 4 drops a message after 20
        // unless told otherwise: every queue a consumer reads gets an explicit limit,
        // and those that can dead-letter send the message to `notify.dead`.
        let limited = |mut args: FieldTable, limit: u32| {
            if a.queue_type == QueueType::Quorum {
                args.insert(
                    "x-delivery-limit".into(),
                    AMQPValue::LongLongInt(limit as i64),
                );
            }
            args
        };
        queue(
            a.dead_queue.clone(),
            limited(self.queue_args(None), i32::MAX as u32),
        )
        .await?;
        bind(&ch, &a.dead_queue, &a.dead_exchange, "").await?;

        let jobs_args = limited(self.queue_args(Some(&a.dead_exchange)), a.delivery_limit);
        queue(a.jobs_queue.clone(), jobs_args).await?;
        bind(&ch, &a.jobs_queue, &a.jobs_exchange, "").await?;

        for c in &self.channels {
            let q = self.dispatch_queue(c);
            let args = limited(self.queue_args(Some(&a.dead_exchange)), a.delivery_limit);
            queue(q.clone(), args).await?;
            bind(&ch, &q, &a.dispatch_exchange, c).await?;
        }

        let ladder = self.ladder();
        for n in 0..ladder.levels {
            let next = if n == 0 {
                a.jobs_exchange.clone()
            } else {
                ladder.exchange(n - 1)
            };
            let mut x_args = FieldTable::default();
            x_args.insert("alternate-exchange".into(), long(&next));
            let name = ladder.exchange(n);
            ch.exchange_declare(name.as_str().into(), ExchangeKind::Headers, durable, x_args)
                .await
                .map_err(|error| BrokerError::Declare {
                    what: format!("exchange `{name}`"),
                    error,
                })?;
            let mut args = self.queue_args(Some(&next));
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt((1i64 << n) * 1000),
            );
            let q = ladder.queue(n);
            queue(q.clone(), args).await?;
            ch.queue_bind(
                q.as_str().into(),
                name.as_str().into(),
                ShortString::from(""),
                QueueBindOptions::default(),
                ladder.binding(n),
            )
            .await?;
        }
        let _ = ch.close(200, "topology declared".into()).await;
        Ok(())
    }
}

async fn bind(ch: &Channel, queue: &str, exchange: &str, key: &str) -> Result<(), BrokerError> {
    ch.queue_bind(
        queue.into(),
        exchange.into(),
        ShortString::from(key),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    Ok(())
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
