//! The feedback consumer: the worker's second consumer, on `notify.feedback`, in
//! each broker session beside the jobs' one. A delivery is decoded
//! ([`quota_worker_producer::decode_feedback`], pure), applied once
//! ([`super::apply`]), counted, then acked; bad feedback is dead-lettered with
//! reason `malformed_feedback` (confirmed) and acked, having changed nothing.
//! While Redis is away a feedback waits (backing off), and on shutdown it goes back
//! to the queue unapplied or applied-but-unacked: applying it again changes nothing.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::apply::{self, Applied, Tuning};
use crate::amqp::{BrokerError, PublishError, Publisher};
use crate::config::Settings;
use crate::fallback::failed::{self, MoveOnError};
use crate::job::{headers, Reason};
use crate::store::QuotaStore;
use quota_worker_producer::{decode_feedback, Event};

/// What became of one feedback delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Applied now.
    Applied(Event),
    /// Applied before (the same id and event): nothing changed.
    Again(Event),
    /// Dead-lettered `malformed_feedback`; the detail says why.
    Malformed(String),
}

/// Why a feedback delivery was not settled (it goes back to the queue).
#[derive(Debug, thiserror::Error)]
pub enum FeedbackError {
    /// Dead-lettering bad feedback failed.
    #[error("dead-lettering bad feedback: {0}")]
    Publish(#[from] PublishError),
    /// Shutting down while waiting for Redis.
    #[error("interrupted by shutdown")]
    Interrupted,
}

/// What the consumer needs: the store, the settings it applies with, and names.
#[derive(Debug, Clone)]
pub struct Feedbacks {
    store: Arc<QuotaStore>,
    tuning: Tuning,
    channels: Vec<String>,
    queue: String,
    dead_exchange: String,
    jobs_exchange: String,
    prefetch: u16,
}

impl Feedbacks {
    /// As `settings` say, on `store`.
    pub fn new(settings: &Settings, store: Arc<QuotaStore>) -> Feedbacks {
        Feedbacks {
            store,
            tuning: Tuning::from_settings(settings),
            channels: settings.channels.keys().cloned().collect(),
            queue: settings.feedback.queue.clone(),
            dead_exchange: settings.amqp.dead_exchange.clone(),
            jobs_exchange: settings.amqp.jobs_exchange.clone(),
            prefetch: settings.feedback.prefetch,
        }
    }

    /// One delivery to its settled outcome (the one-step entry point); the caller
    /// acks on Ok.
    pub async fn handle(
        &self,
        publisher: &Publisher,
        delivery: &Delivery,
        stop: &CancellationToken,
    ) -> Result<Handled, FeedbackError> {
        let f = match decode_feedback(&delivery.data, Some(&self.channels)) {
            Ok(f) => f,
            Err(detail) => {
                let props = BasicProperties::default()
                    .with_headers(headers::dead_headers(
                        delivery.properties.headers().as_ref(),
                        Reason::MalformedFeedback.as_str(),
                        &detail,
                    ))
                    .with_timestamp(Utc::now().timestamp().max(0) as u64);
                let (props, sending) = crate::telemetry::send(&self.dead_exchange, "", None, props);
                let published = publisher
                    .publish(&self.dead_exchange, "", &delivery.data, props)
                    .await;
                if let Err(e) = &published {
                    sending.failed(e);
                }
                drop(sending);
                published?;
                crate::metrics::feedback("malformed");
                info!(reason = "malformed_feedback", %detail, "dead-lettered");
                return Ok(Handled::Malformed(detail));
            }
        };
        let mut backoff = crate::backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
        let applied = loop {
            match apply::apply(&self.store, &self.tuning, &f).await {
                Ok(a) => break a,
                Err(e) => {
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
                    let retry_in = backoff.next().unwrap_or_default();
                    warn!(error = %e, ?retry_in, "redis unavailable; holding the feedback");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(FeedbackError::Interrupted),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                }
            }
        };
        let event = f.event;
        if event == Event::Failed {
            // a routed job's step that failed: on to its next channel (again after
            // a crash: the next step's admission sends it once)
            self.move_on(publisher, &f, stop).await?;
        }
        if applied == Applied::Again {
            debug!(
                event = event.as_str(),
                "feedback applied before; nothing changed"
            );
            return Ok(Handled::Again(event));
        }
        crate::metrics::feedback(event.as_str());
        crate::telemetry::feedback(&f.id, event.as_str());
        if let (Event::Delivered, Applied::First { now_ms, at_ms }) = (event, applied) {
            if at_ms > 0 {
                metrics::histogram!(crate::metrics::DELIVERY_SECONDS)
                    .record((now_ms - at_ms).max(0) as f64 / 1000.0);
            }
        }
        debug!(event = event.as_str(), "feedback applied");
        Ok(Handled::Applied(event))
    }

    /// A failed step's job on to its next channel, when its route kept one
    /// ([`crate::fallback::failed`]); waits while Redis is away.
    async fn move_on(
        &self,
        publisher: &Publisher,
        f: &quota_worker_producer::Feedback,
        stop: &CancellationToken,
    ) -> Result<(), FeedbackError> {
        let mut backoff = crate::backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match failed::move_on(&self.store, publisher, &self.jobs_exchange, f).await {
                Ok(_) => return Ok(()),
                Err(MoveOnError::Publish(e)) => return Err(FeedbackError::Publish(e)),
                Err(MoveOnError::Redis(e)) => {
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
                    let retry_in = backoff.next().unwrap_or_default();
                    warn!(error = %e, ?retry_in, "redis unavailable; holding the feedback");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(FeedbackError::Interrupted),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                }
            }
        }
    }

    /// Consume the feedback queue until `stop`, then let the feedback in hand
    /// finish (within `grace`). It consumes on the channel of `publisher`, the
    /// session's own, through which bad feedback is dead-lettered: a channel fewer
    /// on the connection (lapin reads the flow state of every channel for each frame
    /// it sends). The prefetch applies to this consumer alone (`basic.qos` without
    /// `global` limits each consumer the channel starts afterwards), and feedback is
    /// acked one delivery at a time, so the channel's publishes are not touched.
    pub async fn consume(
        self: Arc<Self>,
        publisher: Publisher,
        stop: CancellationToken,
        grace: Duration,
    ) -> Result<(), BrokerError> {
        let publisher = Arc::new(publisher);
        let ch = publisher.channel().clone();
        ch.basic_qos(self.prefetch, BasicQosOptions::default())
            .await?;
        let tag = format!("quota-worker-feedback-{}", uuid::Uuid::now_v7());
        let mut consumer = ch
            .basic_consume(
                self.queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let tasks = tokio_util::task::TaskTracker::new();
        let result = loop {
            tokio::select! {
                _ = stop.cancelled() => break Ok(()),
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        let (me, publisher, stop) = (self.clone(), publisher.clone(), stop.clone());
                        tasks.spawn(async move { me.settle(&publisher, delivery, &stop).await });
                    }
                    Some(Err(e)) => break Err(BrokerError::Amqp(e)),
                    None => break Ok(()),
                },
            }
        };
        tasks.close();
        let _ = tokio::time::timeout(
            grace,
            ch.basic_cancel(tag.as_str().into(), BasicCancelOptions::default()),
        )
        .await;
        let _ = tokio::time::timeout(grace, tasks.wait()).await;
        // one round trip, so the broker has applied the acks before the session
        // closes the connection (the channel is the session's publisher's)
        let qos = ch.basic_qos(self.prefetch, BasicQosOptions::default());
        let _ = tokio::time::timeout(Duration::from_secs(1), qos).await;
        result
    }

    async fn settle(&self, publisher: &Publisher, delivery: Delivery, stop: &CancellationToken) {
        // applying must not be cut short by the session's stop once begun: only the
        // wait for Redis is (the feedback then goes back to the queue)
        let otel = crate::telemetry::handling(
            delivery.properties.headers().as_ref(),
            &self.queue,
            delivery.routing_key.as_str(),
            false,
        );
        let handled = match &otel {
            None => self.handle(publisher, &delivery, stop).await,
            Some(cx) => {
                use crate::telemetry::FutureExt as _;
                let handled = self
                    .handle(publisher, &delivery, stop)
                    .with_context(cx.clone())
                    .await;
                crate::telemetry::finish_feedback(cx, handled.as_ref().err());
                handled
            }
        };
        match handled {
            Ok(_) => {
                let _ = delivery.acker.ack(BasicAckOptions::default()).await;
            }
            Err(e) => {
                warn!(error = %e, "feedback handed back to the broker");
                let requeue = BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                };
                let _ = delivery.acker.nack(requeue).await;
            }
        }
    }
}
