//! What this worker knows of its recipients' quiet hours: per preferences hash, the
//! version of the set it read, its quiet hours, and the instant before which they
//! do not begin (computed from Redis time). Admissions send the last two
//! (`lua/admit/`'s preferences section), so a recipient outside their quiet
//! hours costs no extra round trip; a new version, or the instant passed, answers
//! 11 and [`QuotaStore::quiet_end`] reads the set once and computes again (pure:
//! [`crate::quota::preferences::QuietHours::end`]). A job held by them whose caps
//! would still refuse it at their end waits for the caps' instant instead, so that
//! it is delayed once ([`QuotaStore::caps_at`]).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::layers::{layered_refusal, JobLayer};
use super::QuotaStore;
use crate::admission::Admission;
use crate::quota::policy::{Action, Mode, Policy};
use crate::quota::preferences::{Preferences, QuietHours};
use crate::quota::window;
use crate::redis::StoreError;

/// Entries kept at most (the map is cleared past it).
const MAX_KNOWN: usize = 50_000;

/// One recipient's quiet hours as known.
#[derive(Debug, Clone)]
pub(crate) struct Known {
    version: i64,
    hours: Option<Arc<QuietHours>>,
    clear_until: i64,
}

impl QuotaStore {
    /// (version, instant ms) to send for `hash`; (0, 0) when nothing is known.
    pub(super) fn quiet_known(&self, hash: &str) -> (i64, i64) {
        let known = self.quiet.lock().unwrap_or_else(|e| e.into_inner());
        known
            .get(hash)
            .map_or((0, 0), |k| (k.version, k.clear_until))
    }

    /// Where the quiet hours of version `version` of `hash` end, seen at `now`
    /// (ms), for a job of priority `priority` in zone `tz`: `None` when `now` is
    /// outside them or they allow it (then the instant before which they do not
    /// begin is remembered, and the job is asked again); and the quiet hours
    /// themselves unless they allow it (for the decision to push any later instant
    /// past them too). Read from what is known of that version, else with one HGET.
    pub(super) async fn quiet_end(
        &self,
        hash: &str,
        version: i64,
        now: i64,
        tz: Tz,
        priority: quota_worker_producer::Priority,
    ) -> Result<(Option<DateTime<Utc>>, Option<Arc<QuietHours>>), StoreError> {
        let cached = {
            let known = self.quiet.lock().unwrap_or_else(|e| e.into_inner());
            known.get(hash).filter(|k| k.version == version).cloned()
        };
        let hours = match cached {
            Some(k) => k.hours,
            None => {
                let mut conn = self.connection();
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
        let mut known = self.quiet.lock().unwrap_or_else(|e| e.into_inner());
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

    /// For a job `hours` hold until `until`: the refusal its policy's rules and the
    /// caps that hold it would give at `until`, from the sends they remember now
    /// (one read of their sorted sets, all in the recipient's slot), with `hours`
    /// for the decision to push that instant past them again; `None` when they
    /// would admit it then (or never, or its policy drops refused jobs: it is
    /// decided again at `until`), and without a read when it meets no rule. Sends made meanwhile can only make the true
    /// instant later, and the job is admitted again there, so it is never early.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn caps_at(
        &self,
        key: &str,
        member: &[u8],
        policy: &Policy,
        layers: &[JobLayer],
        tz: Tz,
        until: DateTime<Utc>,
        hours: &Arc<QuietHours>,
    ) -> Result<Option<Admission>, StoreError> {
        let policy_holds = policy.mode == Mode::Enforce && !policy.rules.is_empty();
        let held: Vec<&JobLayer> = layers
            .iter()
            .filter(|l| l.1 && !l.0.rules.is_empty())
            .collect();
        if policy.action != Action::Delay || (!policy_holds && held.is_empty()) {
            return Ok(None);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
        for l in layers {
            pipe.cmd("ZRANGE")
                .arg(&l.2)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        self.count_call();
        let mut conn = self.connection();
        let sets: Vec<Vec<(Vec<u8>, f64)>> = pipe.query_async(&mut conn).await?;
        // scores are ms * 2 + state; the job's own reservation is not another send
        let blocks: Vec<Vec<i64>> = sets
            .into_iter()
            .map(|set| {
                set.into_iter()
                    .filter(|(m, _)| m.as_slice() != member)
                    .map(|(_, score)| (score as i64).div_euclid(2))
                    .collect()
            })
            .collect();
        let refusal = layered_refusal(
            policy,
            layers,
            tz,
            until.timestamp_millis(),
            blocks,
            Some(hours.clone()),
        );
        Ok(match refusal {
            Admission::Refused {
                rule: Some(_),
                retry_at: Some(_),
                ..
            }
            | Admission::Capped {
                rule: Some(_),
                retry_at: Some(_),
                ..
            } => Some(refusal),
            _ => None,
        })
    }
}
