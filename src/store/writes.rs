//! What the store writes for a job: its admission (a reservation, asked through the
//! admission room's [`Admit`]); what follows the decision: commits and notes in one
//! pipeline, releases, collapse keys; and whether admissions check suppressions.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::QuotaStore;
use crate::admission::admit::Admit;
use crate::admission::{Admission, RateStep, Request, Ticket};
use crate::redis::collapse::Collapse;
use crate::redis::notes::Note;
use crate::redis::StoreError;
use crate::rules::Rules;

/// A quota's take given back: its period's counter less one, while it lasts.
static UNCOUNT: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('EXISTS', KEYS[1]) == 1 and tonumber(redis.call('GET', KEYS[1])) > 0 \
         then return redis.call('DECR', KEYS[1]) end return 0",
    )
});

impl QuotaStore {
    /// Decide one job: check its recipient's caps and its channel's rate.
    ///
    /// When the channel's rate refuses, this waits (pacing) until it allows; a
    /// recipient refusal returns at once with the exact retry time.
    pub async fn admit(&self, req: &Request<'_>) -> Result<Admission, StoreError> {
        let rules = self.rules();
        self.admit_under(req, &rules).await
    }

    /// [`QuotaStore::admit`] under `rules` (the caller's snapshot of the rules in force,
    /// so that one decision never mixes the rules before and after a reload).
    pub(crate) async fn admit_under(
        &self,
        req: &Request<'_>,
        rules: &Rules,
    ) -> Result<Admission, StoreError> {
        let admission = self.admit_with(req, rules, RateStep::Wait(None)).await?;
        admission.ok_or_else(|| StoreError::Batch("a waiting admission was parked".into()))
    }

    /// [`QuotaStore::admit_under`], the channel's rate taken as `step` says; `None`
    /// when `step` is [`RateStep::Park`] and the rate would make the job wait (the
    /// recipient's reservation, if one was taken, is given back). The admission
    /// room's call ([`Admit`]).
    pub(crate) async fn admit_with(
        &self,
        req: &Request<'_>,
        rules: &Rules,
        step: RateStep,
    ) -> Result<Option<Admission>, StoreError> {
        Admit { store: self }.with(req, rules, step).await
    }

    /// Mark an admitted job as dispatched: a later copy is then a duplicate.
    pub async fn commit(&self, ticket: &Ticket) -> Result<(), StoreError> {
        self.write_after(std::slice::from_ref(ticket), &[]).await
    }

    /// Commit `tickets` (as [`QuotaStore::commit`]) and write `notes`: one pipeline on a
    /// single node (one round trip), concurrent commands on a cluster (their keys
    /// live in different slots).
    pub(crate) async fn write_after(
        &self,
        tickets: &[Ticket],
        notes: &[Note],
    ) -> Result<(), StoreError> {
        let zadd = |t: &Ticket| {
            // sized up front: growing the buffers argument by argument cost more
            // than the rest of the commit
            let mut cmd = redis::Cmd::with_capacity(5, t.key.len() + t.member.len() + 32);
            cmd.arg("ZADD")
                .arg(&t.key)
                .arg("XX")
                .arg(t.admitted_at.timestamp_millis() * 2 + 1)
                .arg(&t.member[..]);
            cmd
        };
        let ttl_ms = self.record_ttl.as_millis() as u64;
        let cmds = tickets
            .iter()
            .map(zadd)
            .chain(crate::redis::notes::commands(&self.keys, notes, ttl_ms));
        let trips = self.conn.send_all(cmds).await?;
        for _ in 0..trips {
            self.count_call();
        }
        Ok(())
    }

    /// Whether job `id` of `recipient` (of `tenant`), first seen at `first_seen`, is
    /// the newest of the recipient's jobs with collapse key `field` (it is then
    /// registered as such).
    pub async fn collapse(
        &self,
        tenant: Option<&str>,
        recipient: &str,
        field: &str,
        id: &str,
        first_seen: DateTime<Utc>,
    ) -> Result<Collapse, StoreError> {
        self.count_call();
        let key = self.keys.for_tenant(tenant).collapse(recipient);
        let script = &self.scripts.collapse;
        crate::redis::collapse::collapse(
            &self.conn,
            script,
            &key,
            field,
            id,
            first_seen,
            self.record_ttl,
        )
        .await
    }

    /// Whether admissions check suppressions (some recipient may be suppressed).
    pub fn checks_suppressions(&self) -> bool {
        self.admission.checks_suppressions()
    }

    /// Whether admissions check preferences (some recipient may have a set).
    pub fn checks_preferences(&self) -> bool {
        self.preferences.on()
    }

    /// Check preferences from now on (`on`: the key `prefix:preferences` exists,
    /// as read by [`crate::feedback::watch`]) or not.
    pub fn check_preferences(&self, on: bool) {
        self.preferences.set(on);
    }

    /// Check suppressions from now on (`on`: the key `prefix:suppressions` exists,
    /// or this worker just wrote it) or stop checking.
    pub fn check_suppressions(&self, on: bool) {
        self.admission.check_suppressions(on);
    }

    /// How long notes, cancel marks and collapse keys are kept.
    pub(crate) fn record_ttl(&self) -> Duration {
        self.record_ttl
    }

    /// Undo an admission whose dispatch failed: the recipient's send and the
    /// channel's rate are given back.
    pub async fn release(&self, ticket: &Ticket) -> Result<(), StoreError> {
        self.release_recipient(ticket).await?;
        if let Some((rate, tat)) = ticket.rate {
            self.pacing.refund(&ticket.channel, rate, tat).await?;
        }
        Ok(())
    }

    /// Keep an admission's reservation (its send stays counted) when the job's fate
    /// is unknown, e.g. its dispatch was sent but never confirmed: if this worker
    /// sees the job again it takes the reservation back at once; any other worker
    /// waits out the lease. Either way the recipient's slot is never freed for
    /// another job while the first may have been sent.
    pub fn keep_reservation(&self, ticket: &Ticket) {
        self.admission.orphan(
            &ticket.key,
            &ticket.member,
            ticket.admitted_at.timestamp_millis(),
        );
    }

    pub(crate) async fn release_recipient(&self, ticket: &Ticket) -> Result<(), StoreError> {
        self.give_back_limits(ticket).await?;
        if ticket.inherited {
            // an earlier attempt's dispatch may have gone out: the send stays
            // counted (this worker takes the reservation back when it meets the
            // job again; another waits out the lease)
            self.keep_reservation(ticket);
            return Ok(());
        }
        // only while the reservation is still this admission's own (and, with the
        // caps it was counted toward, theirs too: one hash slot, one call)
        self.count_call();
        let keys =
            std::iter::once(&ticket.key).chain(ticket.layer_keys.iter().flat_map(|k| k.iter()));
        crate::redis::release::release(
            &self.conn,
            &self.scripts.release,
            keys,
            &ticket.member,
            ticket.admitted_at.timestamp_millis(),
        )
        .await?;
        Ok(())
    }

    /// Give back what an admission took from its limits and is still unspent (its
    /// job is released or parked instead of sent). An inherited admission's takes
    /// are its own too (the earlier attempt's stay taken), so they go back as well.
    async fn give_back_limits(&self, ticket: &Ticket) -> Result<(), StoreError> {
        for take in ticket.limits.iter().flat_map(|t| t.iter()) {
            self.count_call();
            if take.interval_us == 0 {
                // a quota's counter: one job less, while its period lasts
                let mut conn = self.conn.clone();
                let _: i64 = UNCOUNT.key(&*take.key).invoke_async(&mut conn).await?;
                continue;
            }
            crate::redis::refund::refund_take(
                &self.conn,
                &self.scripts.channel.refund,
                &take.key,
                (take.interval_us, take.cost),
                take.tat_us,
            )
            .await?;
        }
        Ok(())
    }
}
