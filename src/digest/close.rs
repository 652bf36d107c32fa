//! The closer (a task of each broker session, [`Closer::run`]): it claims the
//! digests due, builds each one's message ([`super::message`]) and publishes it,
//! confirmed, to the jobs exchange as one job with the `x-notify-digest` header: it
//! then meets the admission (caps, send windows, preferences, the rate) as any job
//! does, and is never folded again. Its id (`dg-…`) is fixed when the digest
//! opens, so a digest closed twice (its first closer died after publishing) is the
//! same job twice, and the second copy is a duplicate.

use std::sync::Arc;
use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::message::{message, DigestHead, StoredItem, DIGEST_HEADER};
use crate::amqp::{PublishError, Publisher};
use crate::quota::digest::{DigestMode, DigestSpec};
use crate::redis::digest::close::Close;
use crate::redis::StoreError;
use crate::store::QuotaStore;

/// Why one digest was not closed (it is claimed again after its lease).
#[derive(Debug, thiserror::Error)]
pub(crate) enum CloseError {
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Its head is not what the fold wrote.
    #[error("a digest's head unreadable: {0}")]
    Head(#[from] serde_json::Error),
    /// Its settings are not what the fold wrote.
    #[error("a digest's settings unreadable: {0:?}")]
    Spec(String),
    /// Its message was not published (refused or unconfirmed).
    #[error("a digest's message not published: {0}")]
    Publish(#[from] PublishError),
}

/// How long a closer holds a digest it claimed: one that dies mid-close lets
/// another claim it again after this (or after `redis.reservation_lease`, when
/// that is shorter: [`Closer::lease`]).
pub(crate) const CLOSE_LEASE: Duration = Duration::from_secs(30);
/// How long a held digest sent as a job is left before a closer looks at it again
/// (its job normally settles it well before).
const HELD_RECHECK: Duration = Duration::from_secs(3600);
/// How often a closer looks for digests due.
const TICK: Duration = Duration::from_millis(200);
/// The most digests claimed at once.
const CLAIM: usize = 64;

/// Whether a job id was cancelled (`admin job ID cancel`), as the worker knows.
pub(crate) type Cancelled = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// What a session's closer needs.
pub(crate) struct Closer {
    /// The store (the digests' side of Redis, the rules in force).
    pub store: Arc<QuotaStore>,
    /// An item cancelled while it waited in its digest is left out.
    pub cancelled: Cancelled,
    /// Where a digest goes: the jobs exchange (`amqp.jobs_exchange`).
    pub exchange: String,
    /// `redis.reservation_lease`.
    pub reservation_lease: Duration,
}

impl Closer {
    /// How long a closer holds a digest it claimed: [`CLOSE_LEASE`], or
    /// `redis.reservation_lease` when that is shorter (the time after which a
    /// worker's claim on a send is taken for a dead worker's, here a claim on a
    /// close).
    pub(crate) fn lease(&self) -> Duration {
        CLOSE_LEASE.min(self.reservation_lease)
    }

    /// Every [`TICK`], the digests due are claimed and sent on `publisher`, until
    /// `stop`. While no policy in force has a digest section, it looks only every
    /// fiftieth tick (digests opened before a reload still close).
    pub(crate) async fn run(self, publisher: Publisher, stop: CancellationToken) {
        let mut tick: u64 = 0;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(TICK) => {}
            }
            tick += 1;
            let any = self.store.rules().has_digests();
            if !any && !tick.is_multiple_of(50) {
                continue;
            }
            loop {
                match self.close_due(&publisher).await {
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

    /// Claim the digests due and send them, all at once (one after the other, each
    /// waiting for its publish's confirm, a closer sent 300 to 550 a second, behind
    /// 1,000 to 1,300 a second falling due in the benchmark's digest step,
    /// BENCHMARKS.md "Digests"); how many were claimed.
    async fn close_due(&self, publisher: &Publisher) -> Result<usize, StoreError> {
        let lease = self.lease().as_millis() as u64;
        let claimed = self.store.digests().claim(lease, CLAIM).await?;
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
    async fn close_one(&self, publisher: &Publisher, key: &str) -> Result<(), CloseError> {
        let closed = match self.store.digests().close(key, false).await? {
            Close::Closed(closed) => closed,
            Close::NotYet(at) => {
                self.store.digests().reschedule(key, at).await?;
                return Ok(());
            }
            Close::Gone => {
                self.store.digests().end(key).await?;
                return Ok(());
            }
        };
        let mut head: DigestHead = serde_json::from_str(&closed.head)?;
        head.id = key.rsplit("/dgm/").next().unwrap_or_default().to_string();
        let spec = DigestSpec::decode(&closed.spec)
            .ok_or_else(|| CloseError::Spec(closed.spec.clone()))?;
        // an item cancelled while it waited in the digest (`admin job ID cancel`)
        // is left out
        let items: Vec<StoredItem> = closed
            .items
            .iter()
            .filter_map(|i| serde_json::from_str::<StoredItem>(i).ok())
            .filter(|i| !(self.cancelled)(&i.id))
            .collect();
        let rules = self.store.rules();
        let policy = rules
            .policy_of(&head.category, head.tenant.as_deref())
            .name
            .clone();
        let Some(built) = message(&head, &spec, &items, closed.now_ms) else {
            info!(digest = %head.id, "a digest with no item left sends nothing");
            crate::metrics::digest_ended(&policy, "empty", 0);
            self.store.digests().end(key).await?;
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
        let exchange = &self.exchange;
        let held = spec.mode == DigestMode::Held;
        if held {
            // kept until its job is decided: dispatched, it is done with; refused,
            // it opens again (`lua/digest_reopen.lua`, which writes the index
            // itself: hence this first); looked at again in an hour should neither
            // happen (its job is then a duplicate, or goes)
            let later = closed.now_ms + HELD_RECHECK.as_millis() as i64;
            self.store.digests().reschedule(key, later).await?;
        }
        if let Err(e) = publisher.publish(exchange, "", &built.body, props).await {
            if held {
                let lease = closed.now_ms + self.lease().as_millis() as i64;
                let _ = self.store.digests().reschedule(key, lease).await;
            }
            return Err(e.into());
        }
        crate::metrics::digest_ended(&policy, "sent", built.count);
        info!(digest = %head.id, count = built.count, expired = built.expired, "digest closed and sent as one job");
        if !held {
            self.store.digests().end(key).await?;
        }
        Ok(())
    }
}
