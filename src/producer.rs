//! Producer: publish jobs the way the worker expects them, so a Rust service (or
//! `quota-worker publish`) does not hand-roll the message.
//!
//! A [`Job`] is the contract's JSON object as a struct. [`Producer::publish`] fills in
//! a UUIDv7 id when the job has none, checks the job with the worker's own decoder
//! (so a job the worker would dead-letter as `malformed` is refused here, before it
//! leaves), and publishes it persistent, `application/json`, `message_id` = id, to the
//! jobs exchange, waiting for the broker's confirm. A job that no queue receives
//! (the topology is not declared yet) comes back as an error, not a silent loss.
//!
//! ```no_run
//! use quota_worker::producer::{Job, Producer};
//! use serde_json::json;
//!
//! # async fn example() -> Result<(), quota_worker::producer::ProducerError> {
//! let producer = Producer::connect("amqp://guest:guest@127.0.0.1:5672/%2f", "notify.jobs").await?;
//! let job = Job::new("+8613800000000", "sms")
//!     .category("marketing")
//!     .timezone("Asia/Shanghai")
//!     .payload(json!({ "template": "spring-sale" }));
//! let id = producer.publish(&job).await?; // confirmed by the broker
//! println!("published {id}");
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ExchangeKind};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::amqp::{self, BrokerError, PublishError, Publisher};
use crate::config::{Settings, TlsSettings};
use crate::job::decode;

/// A notification job, as the contract defines it (see the README).
///
/// Unknown fields are kept in [`Job::extra`] and published as they are, so a
/// producer may carry fields the worker does not know yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// The idempotency key (1 to 128 characters); `None`: a UUIDv7 is generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Opaque recipient: an email, a phone number, a user id (1 to 256 characters).
    pub recipient: String,
    /// The channel: selects the send rate and the dispatch queue.
    pub channel: String,
    /// Selects the quota policy; `None` means `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// IANA zone of the recipient, for calendar windows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
    /// Never deliver after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// Never deliver before this instant (a scheduled send).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// While a job of the same recipient with this key waits, a newer one replaces
    /// it: only the newest is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collapse_key: Option<String>,
    /// Anything; the worker passes it through untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// Fields the contract does not name, published as they are.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Job {
    /// A job for `recipient` on `channel`, everything else unset.
    pub fn new(recipient: impl Into<String>, channel: impl Into<String>) -> Job {
        Job {
            id: None,
            recipient: recipient.into(),
            channel: channel.into(),
            category: None,
            timezone: None,
            expires_at: None,
            not_before: None,
            collapse_key: None,
            payload: None,
            extra: Map::new(),
        }
    }

    /// Set the idempotency key.
    pub fn id(mut self, id: impl Into<String>) -> Job {
        self.id = Some(id.into());
        self
    }

    /// Set the category.
    pub fn category(mut self, category: impl Into<String>) -> Job {
        self.category = Some(category.into());
        self
    }

    /// Set the recipient's zone.
    pub fn timezone(mut self, zone: impl Into<String>) -> Job {
        self.timezone = Some(zone.into());
        self
    }

    /// Set the expiry.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Job {
        self.expires_at = Some(at);
        self
    }

    /// Schedule it: never delivered before `at` (then caps and send windows apply
    /// as to any job).
    pub fn not_before(mut self, at: DateTime<Utc>) -> Job {
        self.not_before = Some(at);
        self
    }

    /// Give it a collapse key: a newer job of the recipient with the same key
    /// replaces this one while it waits (only the newest is sent).
    pub fn collapse_key(mut self, key: impl Into<String>) -> Job {
        self.collapse_key = Some(key.into());
        self
    }

    /// Set the payload.
    pub fn payload(mut self, payload: Value) -> Job {
        self.payload = Some(payload);
        self
    }
}

/// The id a job was published under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobId(pub String);

impl JobId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a job was not published.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The broker could not be reached.
    #[error("connecting to the broker: {0}")]
    Connect(#[from] BrokerError),
    /// The jobs exchange does not exist.
    #[error("the exchange `{exchange}` does not exist: start the worker once (it declares its topology) or check amqp.jobs_exchange ({source})")]
    MissingExchange {
        /// Its name.
        exchange: String,
        /// The broker's words.
        source: lapin::Error,
    },
    /// The job does not meet the contract; the worker would dead-letter it.
    #[error("invalid job: {0}")]
    Invalid(String),
    /// The publish was not confirmed.
    #[error("publishing job `{id}`: {source}")]
    Publish {
        /// The job's id.
        id: JobId,
        /// What went wrong.
        source: PublishError,
    },
}

/// Publishes jobs to the jobs exchange with confirms.
#[derive(Debug)]
pub struct Producer {
    conn: Connection,
    publisher: Publisher,
    exchange: String,
    max_body_bytes: usize,
}

impl Producer {
    /// Connect to `url` and publish to `exchange` (a 10 s deadline for the
    /// connection and for every confirm; bodies up to the worker's default
    /// `worker.max_body_bytes`).
    pub async fn connect(url: &str, exchange: &str) -> Result<Producer, ProducerError> {
        Self::connect_with(
            url,
            &TlsSettings::default(),
            exchange,
            Duration::from_secs(10),
            Settings::defaults().worker.max_body_bytes,
        )
        .await
    }

    /// Connect as the worker's settings say: `amqp.url`, `amqp.jobs_exchange`,
    /// `amqp.publish_timeout` and `worker.max_body_bytes`.
    pub async fn from_settings(settings: &Settings) -> Result<Producer, ProducerError> {
        Self::connect_with(
            &settings.amqp.url,
            &settings.amqp.tls,
            &settings.amqp.jobs_exchange,
            settings.amqp.publish_timeout.0,
            settings.worker.max_body_bytes,
        )
        .await
    }

    /// Connect with explicit TLS settings (for an `amqps://` URL), deadline and body
    /// limit.
    pub async fn connect_with(
        url: &str,
        tls: &TlsSettings,
        exchange: &str,
        timeout: Duration,
        max_body_bytes: usize,
    ) -> Result<Producer, ProducerError> {
        let conn = amqp::connect(url, tls, "quota-worker producer", timeout).await?;
        let check = conn.create_channel().await.map_err(BrokerError::from)?;
        let passive = ExchangeDeclareOptions {
            passive: true,
            ..Default::default()
        };
        check
            .exchange_declare(
                exchange.into(),
                ExchangeKind::Fanout,
                passive,
                FieldTable::default(),
            )
            .await
            .map_err(|source| ProducerError::MissingExchange {
                exchange: exchange.to_string(),
                source,
            })?;
        let _ = check.close(200, "checked".into()).await;
        let publisher = Publisher::open(&conn, timeout).await?;
        Ok(Producer {
            conn,
            publisher,
            exchange: exchange.to_string(),
            max_body_bytes,
        })
    }

    /// The body that [`Producer::publish`] would send for `job`, and its id: the job
    /// with an id filled in, as JSON, checked by the worker's decoder. Pure.
    pub fn encode(&self, job: &Job) -> Result<(JobId, Vec<u8>), ProducerError> {
        encode(job, self.max_body_bytes)
    }

    /// Publish one job and wait for the broker's confirm; returns its id.
    pub async fn publish(&self, job: &Job) -> Result<JobId, ProducerError> {
        let (id, body) = self.encode(job)?;
        self.publish_encoded(&id, &body).await?;
        Ok(id)
    }

    /// Publish a body from [`Producer::encode`].
    pub async fn publish_encoded(&self, id: &JobId, body: &[u8]) -> Result<(), ProducerError> {
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(id.as_str()))
            .with_timestamp(Utc::now().timestamp().max(0) as u64);
        self.publisher
            .publish(&self.exchange, "", body, props)
            .await
            .map_err(|source| ProducerError::Publish {
                id: id.clone(),
                source,
            })
    }

    /// Close the connection.
    pub async fn close(self) {
        let _ = self.conn.close(200, "producer done".into()).await;
    }
}

/// Fill in the id, serialise, and check the body with the worker's decoder.
pub fn encode(job: &Job, max_body_bytes: usize) -> Result<(JobId, Vec<u8>), ProducerError> {
    let mut job = job.clone();
    let id = job
        .id
        .get_or_insert_with(|| uuid::Uuid::now_v7().to_string())
        .clone();
    for key in job.extra.keys() {
        if matches!(
            key.as_str(),
            "id" | "recipient" | "channel" | "category" | "timezone" | "expires_at" | "payload"
        ) {
            return Err(ProducerError::Invalid(format!(
                "the extra field `{key}` repeats a field of the contract"
            )));
        }
    }
    let body = serde_json::to_vec(&job).map_err(|e| ProducerError::Invalid(e.to_string()))?;
    decode::decode(&body, max_body_bytes, chrono_tz::UTC)
        .map_err(|m| ProducerError::Invalid(m.0))?;
    Ok((JobId(id), body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_job_without_id_gets_a_uuid_v7() {
        let (id, body) = encode(&Job::new("r", "sms"), 1000).unwrap();
        let parsed = uuid::Uuid::parse_str(id.as_str()).unwrap();
        assert_eq!(parsed.get_version_num(), 7);
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v, json!({"id": id.0, "recipient": "r", "channel": "sms"}));
    }

    #[test]
    fn every_field_round_trips_and_extras_are_kept() {
        let line = r#"{"id":"j1","recipient":"r","channel":"sms","category":"promo",
            "timezone":"Asia/Kolkata","expires_at":"2026-12-01T00:00:00+08:00",
            "payload":{"a":[1,2]},"trace":"abc","priority":5}"#;
        let job: Job = serde_json::from_str(line).unwrap();
        assert_eq!(job.extra.len(), 2);
        let (id, body) = encode(&job, 1000).unwrap();
        assert_eq!(id.as_str(), "j1");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["expires_at"], "2026-11-30T16:00:00Z");
        assert_eq!(v["trace"], "abc");
        assert_eq!(v["payload"], json!({"a": [1, 2]}));
        let back = decode::decode(&body, 1000, chrono_tz::UTC).unwrap();
        assert_eq!(back.category, "promo");
    }

    #[test]
    fn jobs_the_worker_would_refuse_are_refused_here() {
        for (job, why) in [
            (Job::new("", "sms"), "recipient"),
            (Job::new("r", "sms").id("i".repeat(200)), "id"),
            (Job::new("r", "sms").timezone("Mars/Olympus"), "timezone"),
            (
                Job::new("r", "sms").payload(json!("x".repeat(2000))),
                "bytes",
            ),
        ] {
            let err = encode(&job, 1000).unwrap_err().to_string();
            assert!(err.contains(why), "{err} should mention {why}");
        }
    }
}
