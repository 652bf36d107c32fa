//! Digests in the worker (docs/guide/digests.md): a job of a policy with a digest
//! section is folded into its group's open digest ([`Worker::fold`], acked once
//! Redis confirmed the write; `held`: only a job its caps would delay, [`held`]), and the closer ([`close_loop`], a task of each
//! session) claims the digests due, builds each one's message
//! ([`crate::quota::digest::message`]) and publishes it, confirmed, to the jobs
//! exchange as one job with the `x-notify-digest` header: it then meets the
//! admission (caps, send windows, preferences, the rate) as any job does, and is
//! never folded again. Its id (`dg-…`) is fixed when the digest opens, so a digest
//! closed twice (its first closer died after publishing) is the same job twice,
//! and the second copy is a duplicate.

use std::sync::Arc;
use std::time::Duration;

use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::error::ProcessError;
use super::link::BrokerLink;
use super::Worker;
use crate::amqp::Publisher;
use crate::decide::DelayCause;
use crate::job::decode::Job;
use crate::quota::digest::{self, DigestHead, DigestMode, DigestSpec, StoredItem, DIGEST_HEADER};
use crate::redis::digest::Close;
use crate::store::digest::FoldJob;

/// How long a closer holds a digest it claimed: one that dies mid-close lets
/// another claim it again after this (or after `redis.reservation_lease`, when
/// that is shorter: [`Worker::close_lease`]).
pub(crate) const CLOSE_LEASE: Duration = Duration::from_secs(30);
/// How long a held digest sent as a job is left before a closer looks at it again
/// (its job normally settles it well before).
const HELD_RECHECK: Duration = Duration::from_secs(3600);
/// How often a closer looks for digests due.
const TICK: Duration = Duration::from_millis(200);
/// The most digests claimed at once.
const CLAIM: usize = 64;

/// The digest of a `held` policy a delayed job is folded into instead: `Some` when
/// the policy's digest is `held`, the delay is its caps' (a cap of its policy or a
/// `[caps.NAME]` layer) and the delivery is not a digest itself.
pub(crate) fn held<'p>(
    policy: &'p crate::quota::policy::Policy,
    cause: &DelayCause,
    delivery: &Delivery,
) -> Option<&'p DigestSpec> {
    let spec = policy.digest.as_ref()?;
    let by_caps = matches!(cause, DelayCause::Cap { .. } | DelayCause::Capped { .. });
    (spec.mode == DigestMode::Held && by_caps && !is_digest(delivery)).then_some(spec)
}

/// Whether a delivery is a digest of a `held` policy (refused, it opens again).
pub(crate) fn held_digest(policy: &crate::quota::policy::Policy, delivery: &Delivery) -> bool {
    policy
        .digest
        .as_ref()
        .is_some_and(|d| d.mode == DigestMode::Held)
        && is_digest(delivery)
}

/// Whether a delivery is a digest (it carries `x-notify-digest`): never folded.
pub(crate) fn is_digest(delivery: &Delivery) -> bool {
    delivery
        .properties
        .headers()
        .as_ref()
        .is_some_and(|h| h.inner().contains_key(DIGEST_HEADER))
}

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
            .retry_redis(|| self.store.fold(&fold, spec), &s.stop)
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
        let closes_at = crate::quota::window::from_millis(folded.closes_at);
        Ok((folded.id, closes_at))
    }

    /// How long a closer holds a digest it claimed: [`CLOSE_LEASE`], or
    /// `redis.reservation_lease` when that is shorter (the time after which a
    /// worker's claim on a send is taken for a dead worker's, here a claim on a
    /// close).
    pub(crate) fn close_lease(&self) -> Duration {
        CLOSE_LEASE.min(self.settings.redis.reservation_lease.0)
    }

    /// Claim the digests due and send them, all at once (one after the other, each
    /// waiting for its publish's confirm, a closer sent 300 to 550 a second, behind
    /// 1,000 to 1,300 a second falling due in the benchmark's digest step,
    /// BENCHMARKS.md "Digests"); how many were claimed.
    async fn close_due(&self, publisher: &Publisher) -> Result<usize, crate::redis::StoreError> {
        let lease = self.close_lease().as_millis() as u64;
        let claimed = self.store.claim_digests(lease, CLAIM).await?;
        let closes = claimed
            .iter()
            .map(|key| async move { (key, self.close_one(publisher, key).await) });
        for (key, closed) in futures_util::future::join_all(closes).await {
            if let Err(e) = closed {
                // its lease runs out and it is claimed again
                warn!(error = %e, digest = %key, "closing a digest failed; it is retried after its lease");
            }
        }
        Ok(claimed.len())
    }

    /// Close the digest at `key`, publish its message (confirmed), end it.
    async fn close_one(&self, publisher: &Publisher, key: &str) -> anyhow::Result<()> {
        let closed = match self.store.close_digest(key, false).await? {
            Close::Closed(closed) => closed,
            Close::NotYet(at) => {
                self.store.reschedule_digest(key, at).await?;
                return Ok(());
            }
            Close::Gone => {
                self.store.end_digest(key).await?;
                return Ok(());
            }
        };
        let mut head: DigestHead = serde_json::from_str(&closed.head)?;
        head.id = key.rsplit("/dgm/").next().unwrap_or_default().to_string();
        let spec = DigestSpec::decode(&closed.spec)
            .ok_or_else(|| anyhow::anyhow!("a digest's settings unreadable: {:?}", closed.spec))?;
        // an item cancelled while it waited in the digest (`admin job ID cancel`)
        // is left out
        let items: Vec<StoredItem> = closed
            .items
            .iter()
            .filter_map(|i| serde_json::from_str::<StoredItem>(i).ok())
            .filter(|i| self.cancels.get(&i.id).is_none())
            .collect();
        let rules = self.store.rules();
        let policy = rules
            .policy_of(&head.category, head.tenant.as_deref())
            .name
            .clone();
        let Some(built) = digest::message(&head, &spec, &items, closed.now_ms) else {
            info!(digest = %head.id, "a digest with no item left sends nothing");
            crate::metrics::digest_ended(&policy, "empty", 0);
            self.store.end_digest(key).await?;
            return Ok(());
        };
        let mut headers = FieldTable::default();
        headers.insert(
            DIGEST_HEADER.into(),
            AMQPValue::LongLongInt(built.count as i64),
        );
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(head.id.as_str()))
            .with_headers(headers);
        let exchange = &self.settings.amqp.jobs_exchange;
        let held = spec.mode == DigestMode::Held;
        if held {
            // kept until its job is decided: dispatched, it is done with; refused,
            // it opens again (`lua/digest_reopen.lua`, which writes the index
            // itself: hence this first); looked at again in an hour should neither
            // happen (its job is then a duplicate, or goes)
            let later = closed.now_ms + HELD_RECHECK.as_millis() as i64;
            self.store.reschedule_digest(key, later).await?;
        }
        if let Err(e) = publisher.publish(exchange, "", &built.body, props).await {
            if held {
                let lease = closed.now_ms + self.close_lease().as_millis() as i64;
                let _ = self.store.reschedule_digest(key, lease).await;
            }
            return Err(e.into());
        }
        crate::metrics::digest_ended(&policy, "sent", built.count);
        info!(digest = %head.id, count = built.count, expired = built.expired, "digest closed and sent as one job");
        if !held {
            self.store.end_digest(key).await?;
        }
        Ok(())
    }
}

/// The closer of one session: every [`TICK`], the digests due are claimed and
/// sent on `publisher`, until `stop`. While no policy in force has a digest
/// section, it looks only every fiftieth tick (digests opened before a reload
/// still close).
pub(crate) async fn close_loop(worker: Arc<Worker>, publisher: Publisher, stop: CancellationToken) {
    let mut tick: u64 = 0;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        tick += 1;
        let any = worker.store.rules().has_digests();
        if !any && !tick.is_multiple_of(50) {
            continue;
        }
        loop {
            match worker.close_due(&publisher).await {
                Ok(n) if n == CLAIM && !stop.is_cancelled() => continue,
                Ok(_) => break,
                Err(e) => {
                    warn!(error = %e, "looking for digests due failed; trying again shortly");
                    break;
                }
            }
        }
    }
}
