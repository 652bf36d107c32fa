//! A job a recipient's quiet hours hold (where they end: the preferences room's
//! [`crate::preferences::checks`]): when its caps would still refuse it at their
//! end, it waits for the caps' instant instead, so that it is delayed once
//! ([`Admit::caps_at`]).

use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::admit::Admit;
use super::layers::{layered_refusal, JobLayer};
use super::request::Request;
use super::verdict::Asked;
use crate::admission::Admission;
use crate::preferences::set::QuietHours;
use crate::quota::policy::{Action, Mode};
use crate::redis::StoreError;

impl Admit<'_> {
    /// Where the quiet hours of `req`'s recipient (at `version`, as the script
    /// answered at `now`) that hold a job of its priority end, and what they are
    /// (known, or one `HGET` for a version not known): `(None, _)` when none hold
    /// it now.
    pub(super) async fn quiet_end(
        &self,
        req: &Request<'_>,
        version: i64,
        now: i64,
    ) -> Result<(Option<DateTime<Utc>>, Option<Arc<QuietHours>>), StoreError> {
        let hash = self
            .store
            .keys
            .for_tenant(req.tenant)
            .preferences(req.recipient);
        let checks = &self.store.preferences;
        let conn = &self.store.conn;
        checks
            .quiet_end(conn, &hash, version, now, req.tz, req.priority)
            .await
    }

    /// For the job `a` asked, which `hours` hold until `until`: the refusal its policy's rules and the
    /// caps that hold it would give at `until`, from the sends they remember now
    /// (one read of their sorted sets, all in the recipient's slot), with `hours`
    /// for the decision to push that instant past them again; `None` when they
    /// would admit it then (or never, or its policy drops refused jobs: it is
    /// decided again at `until`), and without a read when it meets no rule. Sends made meanwhile can only make the true
    /// instant later, and the job is admitted again there, so it is never early.
    pub(super) async fn caps_at(
        &self,
        a: &Asked,
        tz: Tz,
        until: DateTime<Utc>,
        hours: &Arc<QuietHours>,
    ) -> Result<Option<Admission>, StoreError> {
        let Asked {
            key,
            member,
            policy,
            layers,
            ..
        } = a;
        let policy_holds = policy.mode == Mode::Enforce && !policy.rules.is_empty();
        let held: Vec<&JobLayer> = layers
            .iter()
            .filter(|l| l.holds && !l.cap.rules.is_empty())
            .collect();
        if policy.action != Action::Delay || (!policy_holds && held.is_empty()) {
            return Ok(None);
        }
        let mut pipe = redis::pipe();
        pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
        for l in layers {
            pipe.cmd("ZRANGE")
                .arg(&l.key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES");
        }
        self.store.count_call();
        let mut conn = self.store.connection();
        let sets: Vec<Vec<(Vec<u8>, f64)>> = pipe.query_async(&mut conn).await?;
        // scores are ms * 2 + state; the job's own reservation is not another send
        let blocks: Vec<Vec<i64>> = sets
            .into_iter()
            .map(|set| {
                set.into_iter()
                    .filter(|(m, _)| m != member)
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
