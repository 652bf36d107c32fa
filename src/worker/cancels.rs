//! The cancel marks, held in memory so that checking a job costs no Redis round
//! trip: [`watch`] asks Redis for the marks' version every [`CANCEL_POLL`](crate::redis::notes::CANCEL_POLL) and rereads the
//! marks only when it moved (`admin job ID cancel` raises it, and so does a worker
//! that spends a mark). A cancel thus reaches every worker within about one `POLL`.
//! The erase marks ([`crate::erase::marks`]) are held and reread with them (an
//! erase raises the same version).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, RwLock};

use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use super::handling::Handling;
use crate::decide::{self, Decision};
use crate::erase;
use crate::quota::keys::Keys;
use crate::redis::notes;
use crate::redis::StoreError;
use crate::store::QuotaStore;

use crate::redis::notes::CANCEL_POLL as POLL;

/// The cancelled job ids a worker knows of, with when each was cancelled.
#[derive(Debug)]
pub struct Cancels {
    marks: RwLock<HashMap<String, DateTime<Utc>>>,
    /// The erased recipients' marks, with when each was erased (ms).
    erased: RwLock<HashMap<String, i64>>,
    /// Whether `erased` holds any mark (read without its lock).
    any_erased: AtomicBool,
    /// The version read last (-1: never read): the marks' generation.
    version: AtomicI64,
}

impl Default for Cancels {
    fn default() -> Self {
        Cancels {
            marks: RwLock::default(),
            erased: RwLock::default(),
            any_erased: AtomicBool::new(false),
            version: AtomicI64::new(-1),
        }
    }
}

impl Cancels {
    /// When job `id` was cancelled, if it was.
    pub fn get(&self, id: &str) -> Option<DateTime<Utc>> {
        let marks = self.marks.read().unwrap_or_else(|e| e.into_inner());
        if marks.is_empty() {
            return None;
        }
        marks.get(id).copied()
    }

    /// Whether any recipient is erased (while none is, a job costs nothing more).
    pub fn any_erased(&self) -> bool {
        self.any_erased.load(Ordering::Acquire)
    }

    /// The marks' generation: it moves whenever the marks held here change (a
    /// cancel, an erase, a mark spent). A job checked against the marks at one
    /// generation needs no second look while it has not moved: a job that
    /// waited (in a line, for its slot, for the broker) is checked again at its
    /// final go only if it moved meanwhile.
    pub fn generation(&self) -> i64 {
        self.version.load(Ordering::Acquire)
    }

    /// When the recipient whose erase mark is `mark` was erased (ms), if it was.
    pub fn erased_at(&self, mark: &str) -> Option<i64> {
        let erased = self.erased.read().unwrap_or_else(|e| e.into_inner());
        erased.get(mark).copied()
    }

    /// Reread the marks if their version moved since the last read.
    pub async fn refresh(&self, store: &QuotaStore) -> Result<(), StoreError> {
        let conn = store.connection();
        let version = notes::cancel_version(&conn, store.keys()).await?;
        if version == self.version.load(Ordering::Acquire) {
            return Ok(());
        }
        let marks = notes::cancel_marks(&conn, store.keys()).await?;
        let erased = crate::erase::marks::read(&conn, store.keys()).await?;
        *self.marks.write().unwrap_or_else(|e| e.into_inner()) = marks.into_iter().collect();
        let any = !erased.is_empty();
        *self.erased.write().unwrap_or_else(|e| e.into_inner()) = erased.into_iter().collect();
        self.any_erased.store(any, Ordering::Release);
        // after the marks: whoever reads this generation finds them
        self.version.store(version, Ordering::Release);
        Ok(())
    }
}

/// The marks as a job's handling meets them, at its first check and at each final go.
impl Cancels {
    /// What stops the job of `h` at its final go (its admission, its park, its
    /// dispatch's publish) that its first check did not: a cancel mark, or its
    /// recipient's erase, come since. Looked at only when the marks' generation
    /// moved since its handling began: a job that did not wait, or waited while
    /// no mark came, costs one atomic read.
    pub(super) fn stopped_since(&self, h: &Handling<'_, '_>, keys: &Keys) -> Option<Decision> {
        if self.generation() == h.marks {
            return None;
        }
        if let Some(at) = self.get(&h.job.id) {
            return Some(Decision::Dead(decide::cancelled(at)));
        }
        self.erased(h, keys).then_some(Decision::Erased)
    }

    /// Whether the job's recipient was erased after a worker first saw the job
    /// (`crate::erase::marks`); nothing is computed while no recipient is.
    pub(super) fn erased(&self, h: &Handling<'_, '_>, keys: &Keys) -> bool {
        let (job, delivery) = (h.job, h.delivery);
        if !self.any_erased() {
            return false;
        }
        let keys = keys.for_tenant(job.tenant.as_deref());
        let Some(at) = self.erased_at(&keys.erase_mark(&job.recipient)) else {
            return false;
        };
        let p = &delivery.properties;
        let said = erase::marks::since_ms(p.headers().as_ref(), *p.timestamp());
        // this handling's first sight counts too: a job held in a line since
        // its first read carries no header yet
        let seen = h.seen.first_seen.timestamp_millis();
        erase::marks::drops(at, Some(said.map_or(seen, |t| t.min(seen))))
    }
}

/// Keep `cancels` up to date until `stop`.
pub async fn watch(cancels: Arc<Cancels>, store: Arc<QuotaStore>, stop: CancellationToken) {
    let mut warned = false;
    loop {
        match cancels.refresh(&store).await {
            Ok(()) => warned = false,
            Err(e) if !warned => {
                tracing::warn!(error = %e, "could not read the cancel marks; retrying");
                warned = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}
