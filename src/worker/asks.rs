//! The quota store as a job's handling asks it ([`Asks`]): every call waits out a
//! Redis that is away (never a decision without Redis), reporting Redis's
//! readiness as it goes; the admission is timed for the session's metrics.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::error::ProcessError;
use super::link::BrokerLink;
use crate::admission::{Admission, RateStep, Request};
use crate::health::Health;
use crate::redis::StoreError;
use crate::rules::Rules;
use crate::store::QuotaStore;

/// The store, and the readiness its answers (or their absence) are reported to.
#[derive(Debug, Clone)]
pub(super) struct Asks {
    pub(super) store: Arc<QuotaStore>,
    pub(super) health: Arc<Health>,
}

impl Asks {
    /// Ask the store, waiting out Redis outages (never a decision without Redis);
    /// `None`: park the job ([`RateStep::Park`]).
    pub(super) async fn admit(
        &self,
        req: &Request<'_>,
        rules: &Rules,
        s: &BrokerLink,
        step: RateStep,
    ) -> Result<Option<Admission>, ProcessError> {
        let started = Instant::now();
        let admit = || self.store.admit_with(req, rules, step);
        let admission = self.retry_redis(admit, &s.stop).await?;
        s.metrics
            .admission_seconds
            .record(started.elapsed().as_secs_f64());
        Ok(admission)
    }

    /// Run a Redis operation until it succeeds, backing off while Redis is away.
    pub(super) async fn retry_redis<'a, T, F, Fut>(
        &'a self,
        op: F,
        stop: &CancellationToken,
    ) -> Result<T, ProcessError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, StoreError>> + 'a,
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
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
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
}
