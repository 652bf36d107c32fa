//! The worker: consume jobs, decide, then dispatch, delay or dead-letter each one,
//! and ack the delivery only once that outcome is confirmed by the broker.
//!
//! [`Worker::run`] keeps a session alive (reconnecting with backoff); a session
//! declares the topology, consumes with a bounded prefetch and runs one task per
//! delivery. [`Worker::process`] is the one-step entry point: one delivery in, one
//! confirmed [`Outcome`] out.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, info_span, warn, Instrument};

use crate::amqp::acks::{Acks, Settle};
use crate::amqp::{self, BrokerError, PublishError, Publisher, Topology};
use crate::commits::Commits;
use crate::config::Settings;
use crate::decide::{self, DeadLetter, Decision};
use crate::engine::{Admission, Engine, EngineError, Request, Ticket};
use crate::job::decode::{self, Job};
use crate::job::headers;
use crate::job::Outcome;

/// The per-job metrics' handles, looked up in the recorder once per session instead
/// of once per job (every outcome's counter thereby shows from the start, at 0).
struct JobMetrics {
    in_flight: metrics::Gauge,
    job_seconds: metrics::Histogram,
    admission_seconds: metrics::Histogram,
    outcomes: [metrics::Counter; Outcome::KINDS],
}

impl std::fmt::Debug for JobMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobMetrics")
    }
}

impl JobMetrics {
    fn new() -> JobMetrics {
        JobMetrics {
            in_flight: metrics::gauge!("quota_worker_in_flight"),
            job_seconds: metrics::histogram!("quota_worker_job_seconds"),
            admission_seconds: metrics::histogram!("quota_worker_admission_seconds"),
            outcomes: std::array::from_fn(|k| {
                let (outcome, reason) = Outcome::labels(k);
                metrics::counter!("quota_worker_jobs_total", "outcome" => outcome, "reason" => reason)
            }),
        }
    }
}

/// Why a delivery could not be settled (it is handed back to the broker).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Publishing its outcome failed.
    #[error("publishing the outcome: {0}")]
    Publish(#[from] PublishError),
    /// The worker is shutting down while waiting for Redis.
    #[error("interrupted by shutdown")]
    Interrupted,
}

/// What the jobs of one broker session share.
#[derive(Debug)]
pub struct Session {
    /// Confirm-mode publisher for outcomes.
    pub publisher: Publisher,
    commits: Commits,
    /// Cancelled on shutdown or when the broker connection is lost: jobs waiting for
    /// Redis give up and are handed back.
    pub stop: CancellationToken,
    metrics: JobMetrics,
}

/// Readiness, as `/readyz` reports it.
#[derive(Debug, Default)]
pub struct Health {
    /// Connected to the broker with the topology declared.
    pub broker: AtomicBool,
    /// The last Redis call succeeded.
    pub redis: AtomicBool,
}

impl Health {
    /// Broker and Redis both usable.
    pub fn ready(&self) -> bool {
        self.broker.load(Ordering::Relaxed) && self.redis.load(Ordering::Relaxed)
    }
}

/// The running service.
#[derive(Debug)]
pub struct Worker {
    settings: Settings,
    engine: Arc<Engine>,
    topology: Topology,
    default_tz: Tz,
    /// Readiness flags.
    pub health: Arc<Health>,
}

/// A fatal error: the worker cannot start or go on.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The broker refused the topology or the login, or TLS cannot be set up:
    /// retrying cannot help ([`BrokerError::is_fatal`]).
    #[error(transparent)]
    Broker(BrokerError),
}

impl Worker {
    /// A worker for validated settings and a connected engine.
    pub fn new(settings: Settings, engine: Arc<Engine>) -> Worker {
        let topology = Topology::from_settings(&settings);
        let default_tz = settings.default_zone().expect("validated");
        Worker {
            settings,
            engine,
            topology,
            default_tz,
            health: Arc::new(Health {
                broker: AtomicBool::new(false),
                redis: AtomicBool::new(true),
            }),
        }
    }

    /// A session context on `publisher` (for driving [`Worker::process`] one job at a
    /// time); the returned task commits dispatched jobs until the session is dropped.
    pub fn session_context(
        &self,
        publisher: Publisher,
        stop: CancellationToken,
    ) -> (Session, tokio::task::JoinHandle<()>) {
        let (commits, committer) = Commits::start(self.engine.clone(), stop.clone());
        (
            Session {
                publisher,
                commits,
                stop,
                metrics: JobMetrics::new(),
            },
            committer,
        )
    }

    /// The topology this worker declares.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Run until `shutdown`, reconnecting to the broker whenever the session drops.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            self.clone().watch_redis(shutdown.clone()),
        ));
        let delays = || crate::backoff::delays(Duration::from_millis(200), Duration::from_secs(2));
        let mut backoff = delays();
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let started = Instant::now();
            match self.session(&shutdown).await {
                Ok(()) => return Ok(()),
                Err(e) if e.is_fatal() => return Err(WorkerError::Broker(e)),
                Err(e) => {
                    self.health.broker.store(false, Ordering::Relaxed);
                    metrics::counter!("quota_worker_broker_errors_total").increment(1);
                    if started.elapsed() > Duration::from_secs(30) {
                        backoff = delays();
                    }
                    let retry_in = backoff.next().unwrap_or_default();
                    warn!(error = %e, ?retry_in, "broker session ended; reconnecting");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                    metrics::counter!("quota_worker_reconnects_total").increment(1);
                }
            }
        }
    }

    /// Keep `health.redis` current even while no job is asking Redis anything.
    async fn watch_redis(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            let up = matches!(
                tokio::time::timeout(Duration::from_secs(1), self.engine.ping()).await,
                Ok(Ok(()))
            );
            if self.health.redis.swap(up, Ordering::Relaxed) != up {
                if up {
                    info!("redis is reachable");
                } else {
                    warn!("redis is unreachable");
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn session(self: &Arc<Self>, shutdown: &CancellationToken) -> Result<(), BrokerError> {
        let a = &self.settings.amqp;
        let timeout = a.publish_timeout.0;
        let tag = format!("quota-worker-{}", uuid::Uuid::now_v7());
        // Connecting, declaring and subscribing, bounded (a broker that accepts the
        // connection but never answers must not stall the worker) and cut short by
        // shutdown.
        let setup = async {
            let conn = amqp::connect(&a.url, &a.tls, "quota-worker", timeout).await?;
            self.topology.declare(&conn).await?;
            let publisher = Publisher::open(&conn, timeout).await?;
            let consume = conn.create_channel().await?;
            consume
                .basic_qos(a.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = consume
                .basic_consume(
                    a.jobs_queue.as_str().into(),
                    tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            Ok::<_, BrokerError>((conn, publisher, consume, consumer))
        };
        let limit = timeout * 3;
        let (conn, publisher, consume, mut consumer) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            setup = tokio::time::timeout(limit, setup) => setup
                .map_err(|_| BrokerError::Timeout("connecting and declaring the topology", limit))??,
        };
        self.health.broker.store(true, Ordering::Relaxed);
        info!(queue = %a.jobs_queue, prefetch = a.prefetch, "consuming");

        let tasks = tokio_util::task::TaskTracker::new();
        let stop = shutdown.child_token();
        let (session, committer) = self.session_context(publisher, stop.clone());
        let session = Arc::new(session);
        let (acks, batcher) = Acks::start(consume.clone());
        let result = loop {
            tokio::select! {
                _ = shutdown.cancelled() => break Ok(()),
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        tasks.spawn(self.clone().handle(session.clone(), acks.clone(), delivery));
                    }
                    Some(Err(e)) => break Err(BrokerError::Amqp(e)),
                    None => break Err(BrokerError::Timeout("consumer stream (closed)", Duration::ZERO)),
                },
            }
        };
        tasks.close();
        // Every broker call from here on has a deadline: a broker that stopped
        // answering (hung, partitioned) must not hold the shutdown past its grace
        // period, nor a reconnect, until lapin's heartbeat gives up on it (minutes).
        let mut close_by = tokio::time::Instant::now() + Duration::from_secs(1);
        if result.is_ok() {
            info!("shutting down: no new jobs; finishing those in flight");
            let grace = self.settings.worker.shutdown_grace.0;
            let deadline = tokio::time::Instant::now() + grace;
            let cancel = consume.basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
            let _ = tokio::time::timeout_at(deadline, cancel).await;
            if tokio::time::timeout_at(deadline, tasks.wait())
                .await
                .is_err()
            {
                warn!(
                    ?grace,
                    "grace period over; unfinished jobs go back to the queue"
                );
            }
            close_by = deadline.max(tokio::time::Instant::now() + Duration::from_millis(200));
        } else {
            // the connection is gone: jobs waiting for Redis give up, the broker
            // delivers them again
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await;
        }
        // everything after the grace period shares one deadline
        let close_by = close_by.max(tokio::time::Instant::now() + Duration::from_millis(200));
        drop(acks);
        drop(session);
        let _ = tokio::time::timeout_at(close_by, batcher).await;
        let _ = tokio::time::timeout_at(close_by, committer).await;
        // one round trip on the channel, so the broker has applied the last acks
        // before the channel closes (quorum queues can lose acks sent just before)
        let _ = tokio::time::timeout_at(
            close_by,
            consume.basic_qos(a.prefetch, BasicQosOptions::default()),
        )
        .await;
        let close = conn.close(200, "bye".into());
        if tokio::time::timeout_at(close_by, close).await.is_err() {
            warn!("the broker did not answer the connection close; leaving it");
        }
        result
    }

    /// One delivery's task. Its own state stays at about a kilobyte: the decision's
    /// larger state (about three) lives in one box instead of being copied along each
    /// time the task is built, moved and spawned.
    async fn handle(self: Arc<Self>, s: Arc<Session>, acks: Acks, delivery: Delivery) {
        s.metrics.in_flight.increment(1.0);
        let span = info_span!(
            "job",
            job_id = tracing::field::Empty,
            tag = delivery.delivery_tag
        );
        let started = Instant::now();
        let result = Box::pin(self.process(&s, &delivery))
            .instrument(span.clone())
            .await;
        // In a closure, never `span.enter()` across an await: a guard held over an
        // await leaks the span into other tasks, and tracing-subscriber then panics
        // in a later task's `info_span!` ("tried to clone a span that already
        // closed"), killing that task before it settles its delivery.
        span.in_scope(|| match result {
            Ok(outcome) => {
                s.metrics.outcomes[outcome.kind()].increment(1);
                s.metrics
                    .job_seconds
                    .record(started.elapsed().as_secs_f64());
                acks.settle(delivery.delivery_tag, Settle::Ack);
            }
            Err(e) => {
                warn!(error = %e, "job handed back to the broker");
                acks.settle(delivery.delivery_tag, Settle::Requeue);
            }
        });
        s.metrics.in_flight.decrement(1.0);
    }

    /// Decide one delivery and publish its outcome; Ok once the outcome is confirmed.
    /// The caller acks on Ok and hands the delivery back on Err.
    pub async fn process(&self, s: &Session, delivery: &Delivery) -> Result<Outcome, ProcessError> {
        let now = self.engine.redis_now();
        let max_body = self.settings.worker.max_body_bytes;
        let job = match decode::decode(&delivery.data, max_body, self.default_tz) {
            Ok(job) => job,
            Err(m) => {
                return self
                    .dead(&s.publisher, delivery, None, decide::malformed(m))
                    .await
            }
        };
        tracing::Span::current().record("job_id", job.id.as_ref());
        if let Some(decision) = decide::triage(&job, &self.topology.channels, now) {
            return self.execute(s, delivery, &job, decision, now).await;
        }
        let req = Request {
            id: &job.id,
            recipient: &job.recipient,
            channel: &job.channel,
            category: &job.category,
            tz: job.tz,
        };
        let admission = self.admit(&req, s).await?;
        let decision = decide::decide(&job, admission, self.engine.redis_now());
        self.execute(s, delivery, &job, decision, now).await
    }

    /// Carry out a decision: publish its outcome, then commit or release; Ok once
    /// the broker confirmed the outcome. `now`: when the delivery was taken up.
    async fn execute(
        &self,
        s: &Session,
        delivery: &Delivery,
        job: &Job<'_>,
        decision: Decision,
        now: DateTime<Utc>,
    ) -> Result<Outcome, ProcessError> {
        match decision {
            Decision::Dead(dead) => self.dead(&s.publisher, delivery, Some(job), dead).await,
            Decision::ReleaseThenDead(ticket, dead) => {
                self.retry_redis(|| self.engine.release(&ticket), &s.stop)
                    .await?;
                self.dead(&s.publisher, delivery, Some(job), dead).await
            }
            Decision::Duplicate => {
                info!("duplicate of a job already dispatched; acked, not sent again");
                Ok(Outcome::Duplicate)
            }
            Decision::Delay { until, .. } => self.delay(&s.publisher, delivery, job, until).await,
            Decision::Dispatch(ticket) => self.dispatch(s, delivery, job, ticket, now).await,
        }
    }

    /// Publish an admitted job to the dispatch exchange and commit its ticket; give
    /// the admission back when the broker refuses the dispatch.
    async fn dispatch(
        &self,
        s: &Session,
        delivery: &Delivery,
        job: &Job<'_>,
        ticket: Ticket,
        now: DateTime<Utc>,
    ) -> Result<Outcome, ProcessError> {
        let headers = delivery.properties.headers().as_ref();
        let mut props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(job.id.as_ref()));
        if let Some(h) = headers::dispatch_headers(headers, now) {
            props = props.with_headers(h);
        }
        let exchange = &self.settings.amqp.dispatch_exchange;
        match s
            .publisher
            .publish(exchange, &job.channel, &delivery.data, props)
            .await
        {
            Ok(()) => {
                s.commits.commit(ticket);
                debug!(channel = %job.channel, "dispatched");
                Ok(Outcome::Dispatched)
            }
            Err(e @ (PublishError::Returned | PublishError::Nacked)) => {
                warn!(error = %e, "dispatch refused by the broker; giving the quota back");
                self.retry_redis(|| self.engine.release(&ticket), &s.stop)
                    .await?;
                let (attempt, _) = headers::attempt_info(headers);
                let decision = decide::after_refused_dispatch(attempt, now);
                Box::pin(self.execute(s, delivery, job, decision, now)).await
            }
            Err(e) => {
                // No confirm in time, or the connection dropped: the dispatch may
                // have been delivered. Keep its reservation so the recipient's slot
                // is not given to another job; the retry of this job takes it back
                // (see Engine::keep_reservation).
                warn!(error = %e, "dispatch unconfirmed; keeping its reservation and handing the job back");
                self.engine.keep_reservation(&ticket);
                Err(e.into())
            }
        }
    }

    /// Ask the engine, waiting out Redis outages (never a decision without Redis).
    async fn admit(&self, req: &Request<'_>, s: &Session) -> Result<Admission, ProcessError> {
        let started = Instant::now();
        let admission = self.retry_redis(|| self.engine.admit(req), &s.stop).await?;
        s.metrics
            .admission_seconds
            .record(started.elapsed().as_secs_f64());
        Ok(admission)
    }

    /// Run a Redis operation until it succeeds, backing off while Redis is away.
    async fn retry_redis<'a, T, F, Fut>(
        &'a self,
        op: F,
        stop: &CancellationToken,
    ) -> Result<T, ProcessError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, EngineError>> + 'a,
    {
        let mut backoff = crate::backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match op().await {
                Ok(v) => {
                    self.health.redis.store(true, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) => {
                    self.health.redis.store(false, Ordering::Relaxed);
                    metrics::counter!("quota_worker_redis_errors_total").increment(1);
                    let retry_in = backoff.next().unwrap_or_default();
                    warn!(error = %e, ?retry_in, "redis unavailable; holding the job");
                    tokio::select! {
                        _ = stop.cancelled() => return Err(ProcessError::Interrupted),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                }
            }
        }
    }

    async fn delay(
        &self,
        publisher: &Publisher,
        delivery: &Delivery,
        job: &Job<'_>,
        until: DateTime<Utc>,
    ) -> Result<Outcome, ProcessError> {
        let ladder = self.topology.ladder();
        let now = self.engine.redis_now();
        let seconds = ladder.seconds(now, until);
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(job.id.as_ref()))
            .with_headers({
                let mut headers =
                    headers::next_headers(delivery.properties.headers().as_ref(), now, Some(until));
                ladder.mark(&mut headers, seconds);
                headers
            });
        publisher
            .publish("", &ladder.entry(seconds), &delivery.data, props)
            .await?;
        debug!(until = %until.to_rfc3339(), seconds, "delayed");
        Ok(Outcome::Delayed { until })
    }

    async fn dead(
        &self,
        publisher: &Publisher,
        delivery: &Delivery,
        job: Option<&Job<'_>>,
        dead: DeadLetter,
    ) -> Result<Outcome, ProcessError> {
        let DeadLetter { reason, detail } = dead;
        let mut props = BasicProperties::default()
            .with_headers(headers::dead_headers(
                delivery.properties.headers().as_ref(),
                reason.as_str(),
                &detail,
            ))
            .with_timestamp(Utc::now().timestamp().max(0) as u64);
        if let Some(ct) = delivery.properties.content_type() {
            props = props.with_content_type(ct.clone());
        }
        if let Some(job) = job {
            props = props.with_message_id(ShortString::from(job.id.as_ref()));
        } else if let Some(id) = delivery.properties.message_id() {
            props = props.with_message_id(id.clone());
        }
        publisher
            .publish(&self.settings.amqp.dead_exchange, "", &delivery.data, props)
            .await?;
        info!(reason = reason.as_str(), detail, "dead-lettered");
        Ok(Outcome::Dead(reason))
    }
}
