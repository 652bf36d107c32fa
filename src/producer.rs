//! Producer: the `quota-worker-producer` crate (the job contract, its schema, and
//! publishing with confirms), plus connecting it as the worker's settings say.
//!
//! A service that only publishes depends on `quota-worker-producer` alone; the CLI's
//! `publish` uses [`from_settings`], which connects with `amqp.url` and its
//! `[amqp.tls]` (custom CAs, client certificates) through the worker's connector.

pub use quota_worker_producer::{
    encode, lanes_beside, schema, Job, JobId, Producer, ProducerError,
};

use crate::amqp;
use crate::config::Settings;

/// A producer connected as the worker's settings say: `amqp.url` with
/// `[amqp.tls]`, `amqp.jobs_exchange`, `amqp.publish_timeout` and
/// `worker.max_body_bytes`; jobs with a `priority` go to `lanes.exchange`.
pub async fn from_settings(settings: &Settings) -> Result<Producer, ProducerError> {
    let a = &settings.amqp;
    let timeout = a.publish_timeout.0;
    let urls = settings.amqp_urls();
    let conn = amqp::connect_any(&urls, &a.tls, "quota-worker producer", timeout)
        .await
        .map_err(|e| ProducerError::Connect(e.into()))?;
    Producer::on_connection(
        conn,
        &a.jobs_exchange,
        timeout,
        settings.worker.max_body_bytes,
    )
    .await
    .map(|p| p.with_lanes(&settings.lanes.exchange))
}
