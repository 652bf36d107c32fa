//! The worker's side of digests ([`crate::digest`]): which deliveries a digest takes
//! (named here for the worker's loop), a decoded job folded into its digest under
//! the session's stop, and the session's closer.

use lapin::message::Delivery;
use tracing::debug;

use super::error::ProcessError;
use super::link::BrokerLink;
use super::Worker;
use crate::digest::{Closer, FoldJob};
use crate::job::decode::Job;
use crate::quota::digest::DigestSpec;
use crate::quota::window::from_millis;

pub(crate) use crate::digest::{held, held_digest, is_digest};

impl Worker {
    /// Fold `job` into its group's open digest; the delivery is acked once this
    /// answers (the write is confirmed by Redis), waiting out Redis outages. The
    /// digest's id and when it closes (for the job's note).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn fold(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        job: &Job<'_>,
        first_seen: chrono::DateTime<chrono::Utc>,
        policy: &str,
        spec: &DigestSpec,
        closes_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(String, chrono::DateTime<chrono::Utc>), ProcessError> {
        let timezone = (job.tz != self.default_tz).then(|| job.tz.name());
        let fold = FoldJob {
            id: &job.id,
            recipient: &job.recipient,
            channel: &job.channel,
            category: &job.category,
            tenant: job.tenant.as_deref(),
            timezone,
            key: job.digest_key.as_deref().unwrap_or(&job.category),
            first_seen,
            expires_at: job.expires_at,
            body: &delivery.data,
            collapse_key: job.collapse_key.as_deref(),
            closes_at,
        };
        let folded = self
            .retry_redis(|| self.store.digests().fold(&fold, spec), &s.stop)
            .await?;
        if !folded.again {
            crate::metrics::digest_folded(policy);
        }
        debug!(
            digest = %folded.id,
            opened = folded.opened,
            again = folded.again,
            full = folded.full,
            "folded into a digest"
        );
        Ok((folded.id, from_millis(folded.closes_at)))
    }

    /// A session's closer of digests.
    pub(crate) fn closer(&self) -> Closer {
        let cancels = self.cancels.clone();
        Closer {
            store: self.store.clone(),
            cancelled: std::sync::Arc::new(move |id| cancels.get(id).is_some()),
            exchange: self.settings.amqp.jobs_exchange.clone(),
            reservation_lease: self.settings.redis.reservation_lease.0,
        }
    }
}
