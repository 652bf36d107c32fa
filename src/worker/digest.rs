//! The worker's side of digests ([`crate::digest`]): a decoded job folded into its
//! digest under the session's stop, a `held` digest's job folded (or the digest
//! opened again) instead of waiting, a digest done with once it is settled, and the
//! session's closer ([`DigestSide`]).

use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use tracing::debug;

use super::asks::Asks;
use super::cancels::Cancels;
use super::error::ProcessError;
use super::handling::Handling;
use super::outcomes::Outcomes;
use crate::config::Settings;
use crate::decide::DelayCause;
use crate::digest::{held, held_digest, Closer, FoldJob};
use crate::job::note::JobState;
use crate::job::Outcome;
use crate::quota::digest::DigestSpec;
use crate::quota::window::from_millis;

/// The worker's side of digests.
#[derive(Debug)]
pub(crate) struct DigestSide {
    pub(super) asks: Asks,
    /// The cancelled job ids (a digest's jobs cancelled are left out when it closes).
    cancels: Arc<Cancels>,
    /// The zone of a job that names none: a folded job of another zone keeps its own.
    default_tz: Tz,
    /// The exchange a closed digest is published to (`amqp.jobs_exchange`).
    jobs_exchange: String,
    /// How long a closer's claim on a digest lasts (`redis.reservation_lease`).
    reservation_lease: Duration,
}

impl DigestSide {
    /// The digests' side for `settings`, asking `asks`.
    pub(super) fn new(asks: Asks, cancels: Arc<Cancels>, settings: &Settings) -> DigestSide {
        DigestSide {
            asks,
            cancels,
            default_tz: settings.worker.default_timezone,
            jobs_exchange: settings.amqp.jobs_exchange.clone(),
            reservation_lease: settings.redis.reservation_lease.0,
        }
    }

    /// Fold the job of `h` into its group's open digest; the delivery is acked once this
    /// answers (the write is confirmed by Redis), waiting out Redis outages. The
    /// digest's id and when it closes (for the job's note).
    pub(super) async fn fold(
        &self,
        h: &Handling<'_, '_>,
        spec: &DigestSpec,
        closes_at: Option<chrono::DateTime<chrono::Utc>>,
    ) -> Result<(String, chrono::DateTime<chrono::Utc>), ProcessError> {
        let (s, delivery, job) = (h.s, h.delivery, h.job);
        let (first_seen, policy) = (h.seen.first_seen, &h.policy.name);
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
            .asks
            .retry_redis(|| self.asks.store.digests().fold(&fold, spec), &s.stop)
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

    /// A job of a `held` digest's policy that its caps would delay until `until`:
    /// folded instead, its digest closing then (a held digest refused when it goes
    /// opens again and goes on collecting); `None` when it waits after all.
    pub(super) async fn held_instead(
        &self,
        h: &Handling<'_, '_>,
        until: chrono::DateTime<chrono::Utc>,
        cause: &DelayCause,
        outcomes: &Outcomes,
    ) -> Result<Option<Outcome>, ProcessError> {
        let (s, job) = (h.s, h.job);
        if held_digest(h.policy, h.delivery) {
            let digests = self.asks.store.digests();
            let key = digests.key(job.tenant.as_deref(), &job.recipient, &job.id);
            let reopen = || digests.reopen(&key, until);
            if self.asks.retry_redis(reopen, &s.stop).await? {
                debug!(until = %until.to_rfc3339(), "a held digest refused: open again until then");
                h.rules.metrics.count(&Outcome::Folded, h.labels);
                return Ok(Some(Outcome::Folded));
            }
        }
        let Some(spec) = held(h.policy, cause, h.delivery) else {
            return Ok(None);
        };
        let fold = self.fold(h, spec, Some(until));
        let (digest, closes_at) = fold.await?;
        outcomes.note(s, job, h.seen, JobState::Folded { digest, closes_at }, None);
        h.rules.metrics.count(&Outcome::Folded, h.labels);
        Ok(Some(Outcome::Folded))
    }

    /// A digest settled with `outcome`: sent (or a duplicate, or dead), its keys go
    /// (a held digest's stay while it waits, for it to open again if refused); one
    /// dead-lettered (opted out, expired, cancelled, …) is counted as ended.
    pub(super) async fn digest_done(
        &self,
        h: &Handling<'_, '_>,
        outcome: &Outcome,
    ) -> Result<(), ProcessError> {
        if h.policy.digest.is_some()
            && !matches!(outcome, Outcome::Delayed { .. } | Outcome::Parked)
        {
            let digests = self.asks.store.digests();
            let key = digests.key(h.job.tenant.as_deref(), &h.job.recipient, &h.job.id);
            self.asks
                .retry_redis(|| digests.end(&key), &h.s.stop)
                .await?;
        }
        if matches!(outcome, Outcome::Dead(_)) {
            crate::metrics::digest_ended(&h.policy.name, "dead", 0);
        }
        Ok(())
    }

    /// A session's closer of digests.
    pub(crate) fn closer(&self) -> Closer {
        let cancels = self.cancels.clone();
        Closer {
            store: self.asks.store.clone(),
            cancelled: Arc::new(move |id| cancels.get(id).is_some()),
            exchange: self.jobs_exchange.clone(),
            reservation_lease: self.reservation_lease,
        }
    }
}
