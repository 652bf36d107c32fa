//! The worker: consume jobs, decide, then dispatch, delay or dead-letter each one,
//! and ack the delivery only once that outcome is confirmed by the broker.
//!
//! [`Worker::run`] keeps a broker session alive, reconnecting with jittered backoff
//! ([`session`]: declare the topology, consume with a bounded prefetch, one task per
//! delivery). [`Worker::process`] ([`process`]) is the one-step entry point: one
//! delivery in, one confirmed [`crate::job::Outcome`] out: `decision.rs` asks what
//! settles it, in the order a job meets them; `process.rs` carries the pure
//! [`crate::decide`] decision out, `dispatch.rs` a dispatch. Dispatched jobs are committed, and what became of
//! waiting jobs noted, in batches ([`commits`]); cancel marks are kept in memory
//! ([`cancels`]); readiness is kept in [`crate::health`].
//!
//! The worker holds rooms, not their fields. [`Worker`] is the connection's life
//! (this file and `session.rs`); a job's path is [`process::JobPath`] (`process.rs`,
//! `decision.rs`), which holds the worker's side of each room it calls through the
//! room's `mod.rs`: [`lanes::LaneSide`] (the rate step, the park, the lane
//! consumers' prefetch, [`crate::lanes`]), [`digest::DigestSide`] (the fold and the
//! session's closer, [`crate::digest`]), `routing.rs`'s `Routes` (a job's route,
//! [`crate::fallback`]) and `outcomes.rs`'s `Outcomes` (delay, dead letter, note,
//! and the dispatch of `dispatch.rs`). What every step of a job's handling shares
//! has a file of its own, imported from there: its error ([`ProcessError`],
//! `error.rs`), the session's link ([`BrokerLink`], `link.rs`), the store asked
//! under an outage (`asks.rs`) and what a delivery's handling reads
//! (`handling.rs`).

mod asks;
pub(crate) mod cancels;
pub(crate) mod commits;
mod decision;
pub(crate) mod digest;
mod dispatch;
mod error;
mod handling;
pub(crate) mod lanes;
mod link;
mod outcomes;
pub(crate) mod process;
mod routing;
pub(crate) mod session;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lapin::message::Delivery;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::amqp::{BrokerError, Publisher, Topology};
use crate::config::Settings;
use crate::job::Outcome;
use crate::lanes::Priority;
use crate::metrics::SessionMetrics;
use crate::store::QuotaStore;
use commits::Commits;
use process::{JobPath, Parts};

use crate::health::{self, Health};
pub use error::ProcessError;
pub use link::BrokerLink;

/// The running service.
#[derive(Debug)]
pub struct Worker {
    settings: Settings,
    store: Arc<QuotaStore>,
    /// A job's path through the rooms.
    path: JobPath,
    /// The feedback consumer's state (a second consumer in each session).
    pub feedback: Arc<crate::feedback::Feedbacks>,
    topology: Topology,
    /// The cancelled job ids, as last read from Redis.
    pub cancels: Arc<cancels::Cancels>,
    /// Readiness flags.
    pub health: Arc<Health>,
    /// What the status page shows (queue depths read by the session).
    pub status: Arc<crate::status::Status>,
    /// Which of the broker URLs the next session takes (starting at a random one,
    /// so that workers spread over a cluster's nodes).
    next_url: std::sync::atomic::AtomicUsize,
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
    /// A worker for validated settings and a connected store.
    pub fn new(settings: Settings, store: Arc<QuotaStore>) -> Worker {
        let topology = Topology::from_settings(&settings);
        let cancels: Arc<cancels::Cancels> = Arc::default();
        let health = Arc::new(Health {
            broker: AtomicBool::new(false),
            redis: AtomicBool::new(true),
            resets: Default::default(),
        });
        let parts = Parts {
            store: store.clone(),
            health: health.clone(),
            cancels: cancels.clone(),
            topology: topology.clone(),
        };
        Worker {
            feedback: Arc::new(crate::feedback::Feedbacks::new(&settings, store.clone())),
            path: JobPath::new(&settings, parts),
            settings,
            store,
            topology,
            cancels,
            health,
            status: Arc::default(),
            next_url: std::sync::atomic::AtomicUsize::new(uuid::Uuid::now_v7().as_u128() as usize),
        }
    }

    /// Record queue depths into `status` (served by the status page, which started
    /// before the worker) instead of a state of its own.
    pub fn sharing_status(mut self, status: Arc<crate::status::Status>) -> Worker {
        self.status = status;
        self
    }

    /// Report readiness into `health` (already served by `/readyz` while the store
    /// was connecting) instead of a flag set of its own.
    pub fn sharing_health(mut self, health: Arc<Health>) -> Worker {
        health
            .redis
            .store(self.health.redis.load(Ordering::Relaxed), Ordering::Relaxed);
        self.path = self.path.sharing_health(&health);
        self.health = health;
        self
    }

    /// Decide one delivery and publish its outcome; Ok once the outcome is confirmed
    /// (and counted). The caller acks on Ok and hands the delivery back on Err.
    pub async fn process(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
    ) -> Result<Outcome, ProcessError> {
        self.path.process(s, delivery).await
    }

    /// [`Worker::process`] for a delivery read from the queue of lane `from` (`None`:
    /// the jobs queue).
    pub async fn process_from(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        from: Option<Priority>,
    ) -> Result<Outcome, ProcessError> {
        self.path.process_from(s, delivery, from).await
    }

    /// A session context on `publisher` (for driving [`Worker::process`] one job at a
    /// time); the returned task commits dispatched jobs until the session is dropped.
    pub fn session_context(
        &self,
        publisher: Publisher,
        stop: CancellationToken,
    ) -> (BrokerLink, tokio::task::JoinHandle<()>) {
        let (commits, committer) = Commits::start(self.store.clone(), stop.clone());
        (
            BrokerLink {
                publisher,
                commits,
                stop,
                metrics: SessionMetrics::new(),
            },
            committer,
        )
    }

    /// The store this worker decides with.
    pub fn store(&self) -> &Arc<QuotaStore> {
        &self.store
    }

    /// The topology this worker declares.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Run until `shutdown`, reconnecting to the broker whenever the session drops.
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let _watch = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(health::watch_redis(
            self.health.clone(),
            self.store.clone(),
            self.settings.redis.on_reset,
            shutdown.clone(),
        )));
        // the cancel marks before the first job, then kept up to date
        if let Err(e) = self.cancels.refresh(&self.store).await {
            warn!(error = %e, "could not read the cancel marks; reading them again shortly");
        }
        let _cancels = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(cancels::watch(
            self.cancels.clone(),
            self.store.clone(),
            shutdown.clone(),
        )));
        // whether admissions check suppressions, then kept up to date
        let _ = crate::feedback::watch::refresh(&self.store).await;
        let _suppressions = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            crate::feedback::watch::watch(self.store.clone(), shutdown.clone()),
        ));
        // short: each try at a broker that is away costs a refused connection, and the
        // time between its return and the next try is drain lost (50 ms doubling
        // to 100 ms, each lengthened by up to itself: a try every 0.1 to 0.2 s)
        let delays =
            || crate::backoff::delays(Duration::from_millis(50), Duration::from_millis(100));
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
                    metrics::counter!(crate::metrics::BROKER_ERRORS_TOTAL).increment(1);
                    if started.elapsed() > Duration::from_secs(30) {
                        backoff = delays();
                    }
                    let retry_in = backoff.next().unwrap_or_default();
                    warn!(error = %e, ?retry_in, "broker session ended; reconnecting");
                    tokio::select! {
                        _ = shutdown.cancelled() => return Ok(()),
                        _ = tokio::time::sleep(retry_in) => {}
                    }
                    metrics::counter!(crate::metrics::RECONNECTS_TOTAL).increment(1);
                }
            }
        }
    }
}
