//! What the admission keeps in this worker, its own state (the quota store holds
//! it whole, as [`crate::store::QuotaStore`]'s `admission`): the batched call, the
//! reservations kept for jobs whose dispatch failed, the plans of policies and caps,
//! the limits' bucket keys, and whether admissions check suppressions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use foldhash::HashMap as FastMap;

use super::batch::Admitter;
use super::layers::{cached, PlanCache};
use crate::quota::caps::Cap;
use crate::quota::plan::Plan;
use crate::quota::policy::{Mode, Policy};

/// The admission's state in this worker.
pub(crate) struct AdmissionState {
    /// The batched call.
    pub(crate) admitter: Admitter,
    /// A reservation's lease (`redis.reservation_lease`), ms.
    pub(crate) lease_ms: i64,
    /// Reservations this worker recorded for admissions that then failed (Redis
    /// went away mid-decision, or the dispatch's fate is unknown), by (key, member)
    /// -> reserved_at ms. The retry of the same job takes its own reservation back
    /// instead of waiting out the lease as if another worker held it.
    orphans: Mutex<HashMap<(String, Vec<u8>), i64>>,
    /// The last plan made per (policy, zone), with the local date it is for: a
    /// plan depends only on the policy's rules, the zone and the local date, and
    /// every job of a policy in a zone on one day shares it.
    plans: Mutex<PlanCache<Policy>>,
    /// The same for the caps.
    cap_plans: Mutex<PlanCache<Cap>>,
    /// Whether some recipient may be suppressed (the key `prefix:suppressions`
    /// exists, as last seen): only then do admissions check suppressions.
    suppressions: AtomicBool,
    /// The limits' bucket keys made so far (see [`BucketKeys`]).
    bucket_keys: Mutex<BucketKeys>,
}

/// Most bucket keys kept: past it they are all forgotten (and made again as
/// jobs need them).
const MAX_BUCKET_KEYS: usize = 32_768;

/// The keys of the limits' buckets made so far, by limit name, then by the kind
/// of its bucket (all, tenant, sender) and the tenant or sender: a tenant's or
/// sender's key is a keyed hash of it (`Keys::limit`), the same for every job
/// of it, so it is made once and shared (the jobs of one call then name one key).
#[derive(Default)]
pub(crate) struct BucketKeys {
    // foldhash: the keys are the worker's own limit names and keyed hashes, not
    // an attacker's choice, and each job looks up several
    by_limit: FastMap<String, [FastMap<String, Arc<str>>; 3]>,
    len: usize,
}

impl BucketKeys {
    /// The key of limit `name`'s bucket `(kind, value)` (see
    /// [`crate::quota::limits::Limit::bucket`]): the one made before, else
    /// `make()`'s, kept.
    pub(crate) fn get(
        &mut self,
        name: &str,
        (kind, value): (&str, &str),
        make: impl FnOnce() -> String,
    ) -> Arc<str> {
        let slot = match kind {
            "t" => 1,
            "s" => 2,
            _ => 0,
        };
        let known = self.by_limit.get(name).and_then(|k| k[slot].get(value));
        if let Some(key) = known {
            return key.clone();
        }
        let key: Arc<str> = make().into();
        if self.len >= MAX_BUCKET_KEYS {
            *self = BucketKeys::default();
        }
        if !self.by_limit.contains_key(name) {
            self.by_limit.insert(name.to_string(), Default::default());
        }
        let kinds = self.by_limit.get_mut(name).expect("inserted above");
        if kinds[slot].insert(value.to_string(), key.clone()).is_none() {
            self.len += 1;
        }
        key
    }
}

impl AdmissionState {
    /// The state of a worker that has admitted nothing yet.
    pub(crate) fn new(admitter: Admitter, lease_ms: i64) -> AdmissionState {
        AdmissionState {
            admitter,
            lease_ms,
            orphans: Mutex::default(),
            plans: Mutex::default(),
            cap_plans: Mutex::default(),
            suppressions: AtomicBool::new(false),
            bucket_keys: Mutex::default(),
        }
    }

    /// Keep the reservation of `member` in `key`, made at `reserved_at` (ms), as
    /// this worker's own until its lease lapses.
    pub(crate) fn orphan(&self, key: &str, member: &[u8], reserved_at: i64) {
        let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let lapsed = reserved_at - self.lease_ms;
        orphans.retain(|_, at| *at > lapsed);
        orphans.insert((key.to_string(), member.to_vec()), reserved_at);
    }

    /// Whether the reservation made at `reserved_at` is one of ours (then forget it).
    pub(crate) fn adopt(&self, key: &str, member: &[u8], reserved_at: i64) -> bool {
        let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let id = (key.to_string(), member.to_vec());
        if orphans.get(&id) == Some(&reserved_at) {
            orphans.remove(&id);
            true
        } else {
            false
        }
    }

    /// `plan(&policy.rules, tz, now)`, made once per policy (as in force), zone and
    /// local date.
    pub(crate) fn policy_plan(
        &self,
        policy: &Arc<Policy>,
        tz: Tz,
        now: DateTime<Utc>,
    ) -> Arc<Plan> {
        let shadow = policy.mode == Mode::Shadow;
        let carried = (shadow, policy.suppressed_by.0);
        cached(&self.plans, policy, &policy.rules, carried, tz, now)
    }

    /// The plan of `cap`'s rules, made once per cap (as in force), zone and local
    /// date.
    pub(crate) fn cap_plan(&self, cap: &Arc<Cap>, tz: Tz, now: DateTime<Utc>) -> Arc<Plan> {
        cached(&self.cap_plans, cap, &cap.rules, (false, 0), tz, now)
    }

    /// Drop every plan made (the rules they were made for are replaced).
    pub(crate) fn forget_plans(&self) {
        self.plans.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let caps = self.cap_plans.lock();
        caps.unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The keys of the limits' buckets made so far, held for one job's limits
    /// (one lock for all of them).
    pub(crate) fn bucket_keys(&self) -> MutexGuard<'_, BucketKeys> {
        self.bucket_keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether admissions check suppressions.
    pub(crate) fn checks_suppressions(&self) -> bool {
        self.suppressions.load(Ordering::Relaxed)
    }

    /// Check suppressions from now on, or stop.
    pub(crate) fn check_suppressions(&self, on: bool) {
        self.suppressions.store(on, Ordering::Relaxed);
    }
}
