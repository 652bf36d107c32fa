//! Publishing jobs with confirms: [`Producer`].

use std::time::Duration;

use chrono::Utc;
use lapin::options::ExchangeDeclareOptions;
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ExchangeKind};

use crate::publisher::{PublishError, Publisher};
use crate::{Job, JobId};

/// The worker's default `worker.max_body_bytes`: larger bodies are dead-lettered
/// `malformed`.
pub const DEFAULT_MAX_BODY_BYTES: usize = 262_144;

/// Why a job was not published.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    /// The broker could not be reached (or TLS not set up).
    #[error("connecting to the broker: {0}")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
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
    /// The lanes exchange, for jobs that name their priority ([`Producer::with_lanes`]).
    lanes: Option<String>,
    max_body_bytes: usize,
}

impl Producer {
    /// Connect to `url` and publish to `exchange`, jobs with a `priority` to the
    /// lanes exchange beside it when the worker declared one ([`lanes_beside`]; a 10 s deadline for the
    /// connection and for every confirm; bodies up to the worker's default
    /// `worker.max_body_bytes`, [`DEFAULT_MAX_BODY_BYTES`]). An `amqps://` URL is
    /// verified with the system's root certificates; for other TLS settings, connect
    /// yourself and use [`Producer::on_connection`].
    pub async fn connect(url: &str, exchange: &str) -> Result<Producer, ProducerError> {
        let timeout = Duration::from_secs(10);
        let props = lapin::ConnectionProperties::default()
            .with_connection_name("quota-worker producer".into());
        let conn = tokio::time::timeout(timeout, Connection::connect(url, props))
            .await
            .map_err(|_| ProducerError::Connect(format!("no answer within {timeout:?}").into()))?
            .map_err(|e| ProducerError::Connect(e.into()))?;
        Self::on_connection(conn, exchange, timeout, DEFAULT_MAX_BODY_BYTES).await
    }

    /// Publish on `conn` to `exchange`, waiting `timeout` at most for each confirm,
    /// refusing bodies over `max_body_bytes` (the worker's `worker.max_body_bytes`).
    /// Checks that the exchange exists. A job with a `priority` goes to the lanes
    /// exchange beside it ([`lanes_beside`]) when that exists (every worker that has
    /// lanes declares it), so that a campaign never sits in the jobs queue in front of
    /// urgent jobs; [`Producer::with_lanes`] names another, [`Producer::without_lanes`]
    /// sends every job to `exchange`.
    pub async fn on_connection(
        conn: Connection,
        exchange: &str,
        timeout: Duration,
        max_body_bytes: usize,
    ) -> Result<Producer, ProducerError> {
        let connect = |e: lapin::Error| ProducerError::Connect(e.into());
        let check = conn.create_channel().await.map_err(connect)?;
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
        // the lanes exchange beside the jobs exchange, if the worker declared it
        let mut lanes = None;
        if let Some(beside) = lanes_beside(exchange) {
            let check = conn.create_channel().await.map_err(connect)?;
            let found = check
                .exchange_declare(
                    beside.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await;
            if found.is_ok() {
                let _ = check.close(200, "checked".into()).await;
                lanes = Some(beside);
            }
        }
        let publisher = Publisher::open(&conn, timeout).await.map_err(connect)?;
        Ok(Producer {
            conn,
            publisher,
            exchange: exchange.to_string(),
            lanes,
            max_body_bytes,
        })
    }

    /// Publish jobs that carry a `priority` to `exchange`, the worker's lanes
    /// exchange (`lanes.exchange`), routed `<channel>.<priority>`, so that they wait
    /// in their lane and never behind a campaign in the jobs queue: the default
    /// (see [`lanes_beside`]) when the worker's exchanges are not named as its
    /// defaults are. A channel with no lanes (not paced) gets them through the
    /// exchange's alternate, the jobs exchange. Jobs without a priority still go
    /// to the jobs exchange.
    pub fn with_lanes(mut self, exchange: &str) -> Producer {
        self.lanes = Some(exchange.to_string());
        self
    }

    /// Publish every job to the jobs exchange, `priority` or not (the worker reads
    /// it there and parks it in its lane if its channel's rate makes it wait).
    pub fn without_lanes(mut self) -> Producer {
        self.lanes = None;
        self
    }

    /// The lanes exchange jobs with a `priority` go to, if any.
    pub fn lanes(&self) -> Option<&str> {
        self.lanes.as_deref()
    }

    /// Where [`Producer::publish`] sends `job`: the exchange and the routing key.
    pub fn destination(&self, job: &Job) -> (&str, String) {
        match (&self.lanes, job.priority) {
            (Some(lanes), Some(p)) => (lanes, p.routing_key(&job.channel)),
            _ => (&self.exchange, String::new()),
        }
    }

    /// The body that [`Producer::publish`] would send for `job`, and its id: the job
    /// with an id filled in, as JSON, checked by the worker's decoder. Pure.
    pub fn encode(&self, job: &Job) -> Result<(JobId, Vec<u8>), ProducerError> {
        encode(job, self.max_body_bytes)
    }

    /// Publish one job and wait for the broker's confirm; returns its id.
    pub async fn publish(&self, job: &Job) -> Result<JobId, ProducerError> {
        let (id, body) = self.encode(job)?;
        let (exchange, key) = self.destination(job);
        self.publish_to(exchange, &key, &id, &body).await?;
        Ok(id)
    }

    /// Publish a body from [`Producer::encode`] to the jobs exchange.
    pub async fn publish_encoded(&self, id: &JobId, body: &[u8]) -> Result<(), ProducerError> {
        self.publish_to(&self.exchange, "", id, body).await
    }

    /// Publish a body from [`Producer::encode`] to `exchange` with `routing_key`
    /// (a [`Producer::destination`]).
    pub async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        id: &JobId,
        body: &[u8],
    ) -> Result<(), ProducerError> {
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(id.as_str()))
            .with_timestamp(Utc::now().timestamp().max(0) as u64);
        let props = crate::trace::with_current_context(props);
        self.publisher
            .publish(exchange, routing_key, body, props)
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

/// The lanes exchange the worker declares beside the jobs exchange `jobs_exchange`
/// when they are named as its defaults are (`notify.jobs`: `notify.lanes`;
/// `<prefix>.jobs`: `<prefix>.lanes`); none for another name. Pure.
pub fn lanes_beside(jobs_exchange: &str) -> Option<String> {
    let prefix = jobs_exchange.strip_suffix(".jobs")?;
    (!prefix.is_empty()).then(|| format!("{prefix}.lanes"))
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
            "id" | "recipient"
                | "channel"
                | "category"
                | "timezone"
                | "expires_at"
                | "priority"
                | "payload"
        ) {
            return Err(ProducerError::Invalid(format!(
                "the extra field `{key}` repeats a field of the contract"
            )));
        }
    }
    let body = serde_json::to_vec(&job).map_err(|e| ProducerError::Invalid(e.to_string()))?;
    crate::decode::decode(&body, max_body_bytes, chrono_tz::UTC)
        .map_err(|m| ProducerError::Invalid(m.0))?;
    Ok((JobId(id), body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    #[test]
    fn the_lanes_exchange_is_found_beside_the_jobs_exchange() {
        // (jobs exchange, lanes exchange)
        let table = [
            ("notify.jobs", Some("notify.lanes")),
            ("t42.jobs", Some("t42.lanes")),
            ("a.b.jobs", Some("a.b.lanes")),
            (".jobs", None),
            ("jobs", None),
            ("notify.work", None),
            ("notify.jobs.x", None),
        ];
        for (jobs, lanes) in table {
            assert_eq!(lanes_beside(jobs).as_deref(), lanes, "{jobs}");
        }
    }

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
            "payload":{"a":[1,2]},"trace":"abc","tier":5}"#;
        let job: Job = serde_json::from_str(line).unwrap();
        assert_eq!(job.extra.len(), 2);
        let (id, body) = encode(&job, 1000).unwrap();
        assert_eq!(id.as_str(), "j1");
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["expires_at"], "2026-11-30T16:00:00Z");
        assert_eq!(v["trace"], "abc");
        assert_eq!(v["payload"], json!({"a": [1, 2]}));
        let back = crate::decode::decode(&body, 1000, chrono_tz::UTC).unwrap();
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
