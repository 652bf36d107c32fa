//! What the admission checks of a recipient's preferences ([`Checks`], kept by the
//! quota store): whether any recipient may have a set at all (the key
//! `prefix:preferences` exists, as [`crate::feedback::watch`] last saw it: only
//! then do admissions check them), and what this worker knows of its recipients'
//! quiet hours: per preferences hash, the version of the set it read, its quiet
//! hours, and the instant before which they do not begin (computed from Redis
//! time). Admissions send the last two (`src/admission/lua/`'s preferences section), so a
//! recipient outside their quiet hours costs no extra round trip; a new version,
//! or the instant passed, and the script answers that they must be looked at
//! again: [`Checks::quiet_end`] reads the set once and computes again (pure:
//! [`QuietHours::end`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use quota_worker_producer::Priority;

use super::set::{Preferences, QuietHours};
use crate::quota::window;
use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// Entries kept at most (the map is cleared past it).
const MAX_KNOWN: usize = 50_000;

/// One recipient's quiet hours as known.
#[derive(Debug, Clone)]
struct Known {
    version: i64,
    hours: Option<Arc<QuietHours>>,
    clear_until: i64,
}

/// What the admission checks of preferences.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    /// Whether some recipient may have preferences.
    on: AtomicBool,
    /// What this worker knows of recipients' quiet hours, by preferences hash.
    quiet: Mutex<HashMap<String, Known>>,
}

impl Checks {
    /// Whether admissions check preferences (some recipient may have a set).
    pub(crate) fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// Check preferences from now on, or not.
    pub(crate) fn set(&self, on: bool) {
        self.on.store(on, Ordering::Relaxed);
    }

    /// The known quiet hours, locked (a panic while they were held does not poison
    /// them for good).
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Known>> {
        self.quiet.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// (version, instant ms) to send for `hash`; (0, 0) when nothing is known.
    pub(crate) fn quiet_known(&self, hash: &str) -> (i64, i64) {
        self.lock()
            .get(hash)
            .map_or((0, 0), |k| (k.version, k.clear_until))
    }

    /// Where the quiet hours of version `version` of `hash` end, seen at `now`
    /// (ms), for a job of priority `priority` in zone `tz`: `None` when `now` is
    /// outside them or they allow it (then the instant before which they do not
    /// begin is remembered, and the job is asked again); and the quiet hours
    /// themselves unless they allow it (for the decision to push any later instant
    /// past them too). Read from what is known of that version, else with one HGET.
    pub(crate) async fn quiet_end(
        &self,
        conn: &RedisConn,
        hash: &str,
        version: i64,
        now: i64,
        tz: Tz,
        priority: Priority,
    ) -> Result<(Option<DateTime<Utc>>, Option<Arc<QuietHours>>), StoreError> {
        let cached = {
            let known = self.lock();
            known.get(hash).filter(|k| k.version == version).cloned()
        };
        let hours = match cached {
            Some(k) => k.hours,
            None => {
                let mut conn = conn.clone();
                let set: Option<String> = redis::cmd("HGET")
                    .arg(hash)
                    .arg("set")
                    .query_async(&mut conn)
                    .await?;
                set.and_then(|s| serde_json::from_str(&s).ok())
                    .and_then(|v| Preferences::parse(&v, &|_| true).ok())
                    .and_then(|p| p.quiet_hours)
                    .map(Arc::new)
            }
        };
        let at = window::from_millis(now);
        let holding = hours.clone().filter(|q| !q.allow.contains(&priority));
        let (end, clear_until) = match &holding {
            Some(q) => {
                let end = q.end(tz, at);
                // inside them, `at` itself: the next job is held too
                let next = q
                    .next_start(tz, at)
                    .map_or(i64::MAX, |t| t.timestamp_millis());
                (Some(end).filter(|e| *e > at), next)
            }
            // allowed: the worker's answer would be the same every time; one known
            // for this job's priority only, so asked again for another
            _ => (None, 0),
        };
        let mut known = self.lock();
        if known.len() >= MAX_KNOWN {
            known.clear();
        }
        known.insert(
            hash.to_string(),
            Known {
                version,
                hours,
                clear_until,
            },
        );
        Ok((end, holding))
    }
}
