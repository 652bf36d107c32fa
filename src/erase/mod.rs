//! Forgetting one recipient on request (`admin recipient R erase`,
//! `DELETE /v1/recipients/{recipient}`), in one pass, in this order:
//! 1. the erase mark ([`marks`]): every worker knows it within one poll of the
//!    cancel marks and from then on drops unsent, without a dead letter, each job
//!    of the recipient it first saw before the erase, wherever it waited (delay
//!    ladder, lane, line, fallback step); the erase waits that poll out, so that no
//!    worker writes for the recipient after its keys are gone;
//! 2. every Redis key of the recipient ([`store`]): recorded sends of every policy
//!    and cap, preferences and quiet hours, suppressions (or kept as they are, a
//!    tombstone keyed by the recipient's keyed hash, with `keep_suppression`),
//!    collapse keys, the waiting set, feedback marks, route steps, and its open
//!    digests with their items (out of the index of digests to close: never sent);
//! 3. its dead letters ([`dead`]): dropped from the dead-letter queue, and their
//!    entries from the console's index.
//!
//! Why a mark by recipient rather than the cancel mark of each job: the jobs of a
//! recipient are known by id only where a note says so (the waiting set with
//! `redis.notes`, not a job parked in a lane, held in a line, or whose escalation
//! is pending), so no list of ids is exact; the recipient's keyed hash is on every
//! job a worker reads, and comparing the job's first sight with the erase keeps a
//! job published after it (the recipient's new activity).
//!
//! Idempotent: a second erase finds nothing and says so ([`Erased::nothing`]); an
//! erase interrupted anywhere is completed by running it again. The action log
//! (the `erase` event) names who, when and how much, and the recipient by its keyed
//! hash only.

pub mod dead;
pub mod marks;
pub mod store;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::admin::AdminError;
use crate::config::Settings;
use crate::redis::notes::CANCEL_POLL;
use crate::store::QuotaStore;

/// Who asks to erase whom.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The recipient, as producers write it.
    pub recipient: &'a str,
    /// Its tenant (`None`: no tenant).
    pub tenant: Option<&'a str>,
    /// Keep its suppressions (a keyed-hash tombstone), so that a bounced or
    /// complained address stays suppressed.
    pub keep_suppression: bool,
    /// Who asked, as the action log names them.
    pub who: &'a str,
}

/// What an erase erased, by store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Erased {
    /// The recipient's keyed hash (of its tenant): the only name the answer and
    /// the action log give it.
    pub recipient_tag: String,
    /// Its tenant.
    pub tenant: Option<String>,
    /// When (Redis time).
    pub at: DateTime<Utc>,
    /// Redis keys deleted, by store (`sends`, `preferences`, `suppressions`,
    /// `collapse_keys`, `waiting`, `feedback_marks`, `routes`, `digests`, `other`).
    pub keys: BTreeMap<String, u64>,
    /// Jobs its waiting set held (each dropped when it comes back).
    pub waiting_jobs: u64,
    /// Open digests taken out unsent, and their items.
    pub open_digests: u64,
    /// Items of those digests.
    pub digest_items: u64,
    /// Dead letters dropped from the dead-letter queue.
    pub dead_letters: u64,
    /// Entries taken out of the console's dead-letter index.
    pub dead_index_entries: u64,
    /// Stores kept as asked (`suppressions`).
    pub kept: Vec<String>,
    /// Whether nothing was found to erase (a second erase).
    pub nothing: bool,
    /// Stopped by a signal during the dead-letter walk: run the erase again.
    pub interrupted: bool,
}

/// Erase `req.recipient` everywhere, as the module says.
pub async fn erase(
    store: &QuotaStore,
    settings: &Settings,
    broker: &lapin::Connection,
    req: &Request<'_>,
    stop: &CancellationToken,
) -> Result<Erased, AdminError> {
    let keys = store.keys().for_tenant(req.tenant);
    let tag = keys.recipient_tag(req.recipient);
    let at = store.sync_clock().await?;
    let redis = store.connection();
    let keep = mark_kept(settings, store.record_ttl());
    marks::set(
        &redis,
        store.keys(),
        &keys.erase_mark(req.recipient),
        at,
        keep,
    )
    .await?;
    // every worker rereads the marks within a poll; one more for a read under way
    tokio::time::sleep(CANCEL_POLL * 2 + Duration::from_millis(100)).await;
    let erased = store::erase_keys(&redis, &keys, &tag, req.keep_suppression).await?;
    let (dead_letters, interrupted) =
        dead::purge_queue(broker, settings, (req.recipient, req.tenant), stop).await?;
    let dead_index_entries = dead::forget_in_index(broker, store, settings, &tag).await?;
    let nothing = erased.by_store.is_empty() && dead_letters == 0 && dead_index_entries == 0;
    let out = Erased {
        recipient_tag: tag,
        tenant: req.tenant.map(str::to_string),
        at,
        keys: erased.by_store,
        waiting_jobs: erased.waiting_jobs,
        open_digests: erased.open_digests,
        digest_items: erased.digest_items,
        dead_letters,
        dead_index_entries,
        kept: erased.kept,
        nothing,
        interrupted,
    };
    log(req.who, &out);
    Ok(out)
}

/// How long an erase mark is kept: a waiting job comes back to a worker at
/// least once each round of the delay ladder (its longest delay), so a mark kept
/// that long and an hour more meets every job waiting at the erase; and at least
/// `redis.record_ttl`, as the cancel marks. In ms.
fn mark_kept(settings: &Settings, record_ttl: Duration) -> u64 {
    let ladder = crate::amqp::Topology::from_settings(settings).ladder();
    let round = Duration::from_secs(ladder.max_seconds() + 3600);
    record_ttl.max(round).as_millis() as u64
}

/// The action log's line: who, when, how much; the recipient by its keyed hash.
fn log(who: &str, e: &Erased) {
    let keys: u64 = e.keys.values().sum();
    tracing::info!(
        who,
        action = "erase",
        recipient_tag = %e.recipient_tag,
        tenant = e.tenant.as_deref().unwrap_or(""),
        at = %e.at.to_rfc3339(),
        keys,
        waiting_jobs = e.waiting_jobs,
        digest_items = e.digest_items,
        dead_letters = e.dead_letters,
        dead_index_entries = e.dead_index_entries,
        kept = %e.kept.join(","),
        nothing = e.nothing,
        interrupted = e.interrupted,
        "erase"
    );
}
