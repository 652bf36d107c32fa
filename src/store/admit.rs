//! Admissions: a job's policy and the caps it meets, asked of `lua/admit/` with the
//! plans of the day, the channel's rate taken with it, and the reservations this
//! store keeps for jobs whose dispatch failed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::layers::{cached, layered_refusal, JobLayer};
use super::QuotaStore;
use crate::admission::{Admission, RateStep, Request, Ticket};
use crate::preferences::set::OptOut;
use crate::quota::keys::{self, Keys};
use crate::quota::plan::Plan;
use crate::quota::policy::{Mode, Policy, Scope};
use crate::quota::window;
use crate::redis::admit::{AdmitArgs, LayerArgs, Verdict};
use crate::redis::rate::RateReply;
use crate::redis::StoreError;
use crate::rules::Rules;

impl QuotaStore {
    pub(super) fn recipient_key(keys: &Keys, req: &Request<'_>, policy: &Policy) -> String {
        let channel = (policy.scope == Scope::Channel).then_some(req.channel);
        keys.recipient(req.recipient, &policy.name, channel)
    }

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
    /// recipient's reservation, if one was taken, is given back).
    pub(crate) async fn admit_with(
        &self,
        req: &Request<'_>,
        rules: &Rules,
        step: RateStep,
    ) -> Result<Option<Admission>, StoreError> {
        let unknown = || StoreError::UnknownChannel(req.channel.to_string());
        let rate = rules.channel(req.channel).ok_or_else(unknown)?.rate;
        let pacer = self.pacers.get(req.channel).ok_or_else(unknown)?;
        let mut policy = rules.policy_of(req.category, req.tenant).clone();
        if req.counted {
            policy = rules.of_its_channel(&policy);
        }
        let names = self.keys.for_tenant(req.tenant);
        let key = Self::recipient_key(&names, req, &policy);
        let member = keys::member(req.id);
        let layers: Vec<JobLayer> = rules
            .layers(&policy, req.channel, req.category, req.tenant)
            .into_iter()
            .filter(|(cap, _)| !req.counted || cap.of_one_channel())
            .map(|(cap, holds)| {
                let channel = (cap.scope == Scope::Channel).then_some(req.channel);
                let key = names.cap(req.recipient, &cap.name, channel);
                (cap.clone(), holds, key)
            })
            .collect();
        drop(names);
        let layers = &layers[..];

        // while jobs wait here for the rate, a new one joins them rather than racing
        // them; one that may be parked asks at once, to learn how long it would wait
        let parking = matches!(step, RateStep::Park(_));
        let pacing = rate.is_some() && !parking && pacer.waiting.load(Ordering::Relaxed) > 0;
        let lane = match step {
            RateStep::Wait(lane) | RateStep::Park(lane) => lane,
            RateStep::Taken(_) => None,
        };
        let (first, rate_reply) = match (rate, step) {
            (Some(_), RateStep::Taken(tat_us)) => {
                let a = self
                    .call_admit(&key, &member, &policy, layers, req, None)
                    .await?;
                let taken = RateReply {
                    allowed: 1,
                    remaining: 0,
                    retry_after: Duration::ZERO,
                    tat_us,
                };
                (a, Some(taken))
            }
            (Some(r), _) if !pacing => {
                let (a, b) = tokio::join!(
                    self.call_admit(&key, &member, &policy, layers, req, None),
                    self.take_rate_in(req.channel, r, lane)
                );
                let a = a?;
                match b {
                    Ok(b) => (a, Some(b)),
                    Err(e) => {
                        if let Verdict::Admitted(at, _) = a {
                            self.orphan(&key, &member, at);
                        }
                        return Err(e);
                    }
                }
            }
            _ => (
                self.call_admit(&key, &member, &policy, layers, req, None)
                    .await?,
                None,
            ),
        };
        let mut reply = first;
        let mut quiet_until = None;
        for _ in 0..3 {
            match reply {
                Verdict::Quiet(now, version) => {
                    let hash = self.keys.for_tenant(req.tenant).preferences(req.recipient);
                    match self
                        .quiet_end(&hash, version, now, req.tz, req.priority)
                        .await?
                    {
                        (Some(until), Some(hours)) => {
                            quiet_until = Some((until, hours));
                            break;
                        }
                        _ => {
                            reply = self
                                .call_admit(&key, &member, &policy, layers, req, None)
                                .await?
                        }
                    }
                }
                Verdict::Clock(now) => {
                    reply = self
                        .call_admit(&key, &member, &policy, layers, req, Some(now))
                        .await?
                }
                _ => break,
            }
        }
        if let Verdict::Reserved(_, at) = reply {
            if self.adopt(&key, &member, at) {
                reply = Verdict::Admitted(at, true);
            }
        }
        // a refusal of a recipient with quiet hours that hold the job: what they
        // are (known, or one HGET for a version not known), so that the instant it
        // waits for is pushed past them as well
        let quiet = match reply {
            Verdict::Refused(now, _, Some(version)) | Verdict::Layered(now, _, Some(version)) => {
                let hash = self.keys.for_tenant(req.tenant).preferences(req.recipient);
                self.quiet_end(&hash, version, now, req.tz, req.priority)
                    .await?
                    .1
            }
            _ => None,
        };
        let taken = rate_reply.filter(|r| r.allowed == 1).map(|r| r.tat_us);
        let layer_keys =
            || (!layers.is_empty()).then(|| Box::new(layers.iter().map(|l| l.2.clone()).collect()));
        let mut admission = match reply {
            Verdict::Admitted(now, inherited) => Admission::Admitted(Ticket {
                key,
                member: member.into_boxed_slice(),
                admitted_at: window::from_millis(now),
                channel: req.channel.to_string(),
                layer_keys: layer_keys(),
                rate: rate.zip(taken),
                inherited,
            }),
            Verdict::Layered(now, blocks, _) => {
                layered_refusal(&policy, layers, req.tz, now, blocks, quiet)
            }
            Verdict::Refused(now, sends, _) => {
                let sends: Vec<DateTime<Utc>> =
                    sends.into_iter().map(window::from_millis).collect();
                let refusal =
                    window::refusal(&policy.rules, req.tz, window::from_millis(now), &sends);
                Admission::Refused {
                    retry_at: refusal.retry_at,
                    action: policy.action,
                    policy: policy.name.clone(),
                    rule: refusal.rule,
                    seen: sends.len(),
                    quiet,
                    spanning: policy.scope != Scope::Channel,
                }
            }
            Verdict::Shadowed(now, sends, inherited) => {
                let sends: Vec<DateTime<Utc>> =
                    sends.into_iter().map(window::from_millis).collect();
                let at = window::from_millis(now);
                let refusal = window::refusal(&policy.rules, req.tz, at, &sends);
                Admission::Shadowed {
                    ticket: Ticket {
                        key,
                        member: member.into_boxed_slice(),
                        admitted_at: at,
                        channel: req.channel.to_string(),
                        layer_keys: layer_keys(),
                        rate: rate.zip(taken),
                        inherited,
                    },
                    retry_at: refusal.retry_at,
                    action: policy.action,
                    rule: refusal.rule,
                    seen: sends.len(),
                }
            }
            Verdict::Duplicate(_) => Admission::Duplicate,
            Verdict::Suppressed(_, kind, since, until) => {
                let value = format!("{kind}:{since}:{until}");
                match crate::quota::suppression::Suppression::decode(&value) {
                    Some(s) => Admission::Suppressed(s),
                    // a value no worker writes: an error, retried (never a decision)
                    None => {
                        return Err(unexpected(&reply));
                    }
                }
            }
            Verdict::Quiet(..) => match quiet_until {
                Some((until, hours)) => {
                    metrics::counter!(crate::metrics::PREFERENCE_TOTAL, "outcome" => "quiet_hours")
                        .increment(1);
                    // one instant with its caps: their refusal at the quiet hours'
                    // end, if they would refuse it then
                    let at_end = self
                        .caps_at(&key, &member, &policy, layers, req.tz, until, &hours)
                        .await?;
                    at_end.unwrap_or(Admission::Quiet { until, hours })
                }
                None => return Err(unexpected(&reply)),
            },
            Verdict::OptedOut(_, what) => match OptOut::from_code(what) {
                Some(what) => {
                    metrics::counter!(crate::metrics::PREFERENCE_TOTAL, "outcome" => "opted_out")
                        .increment(1);
                    Admission::OptedOut(what)
                }
                None => return Err(unexpected(&reply)),
            },
            Verdict::Reserved(_, reserved_at) => Admission::Reserved {
                retry_at: window::from_millis(reserved_at + self.lease_ms),
            },
            // still outside the planned day after three plans (a wrong type never
            // gets here: call_admit turns it into an error)
            // (the admitter asks a job that answered 7 again on its own; one that
            // still does is an error, retried like Redis being away)
            Verdict::Clock(_) | Verdict::WrongType(_) | Verdict::Elsewhere(_) => {
                return Err(unexpected(&reply));
            }
        };
        match (&mut admission, rate) {
            (Admission::Admitted(ticket) | Admission::Shadowed { ticket, .. }, Some(r))
                if taken.is_none() =>
            {
                if let Some(reply) = rate_reply {
                    if reply.allowed < 0 {
                        // never reached: validation keeps cost <= burst
                        return Err(StoreError::CostAboveBurst {
                            channel: req.channel.to_string(),
                            cost: r.cost,
                            burst: r.burst,
                        });
                    }
                }
                // parked only when the wait is longer than lanes.park_after: a
                // shorter one (a burst above the rate for a moment) is waited out
                // here, in the job's lane, at no extra publish. The wait counts the
                // jobs already waiting here, each a slot ahead of this one: the
                // jobs queue must not stall behind a prefetch of waiting jobs.
                let ahead = pacer.waiting.load(Ordering::Relaxed) as u64;
                let queued_us = r.interval_us.saturating_mul(r.cost).saturating_mul(ahead);
                let short = |reply: &RateReply| {
                    let wait_us = (reply.retry_after.as_micros() as u64).saturating_add(queued_us);
                    reply.allowed == 0 && wait_us <= self.park_after.as_micros() as u64
                };
                if parking && !rate_reply.as_ref().is_some_and(short) {
                    pacer.lanes.saturate();
                    self.release_recipient(ticket).await?;
                    return Ok(None);
                }
                // waited out here while the rate's own answers add up to at most
                // lanes.park_after (a lane above it may take the slots meanwhile);
                // then parked after all. The time Redis takes to answer does not
                // count: a slow Redis is no backlog, and parking would only add a
                // publish and a delivery to every job while it is slow.
                let budget = parking.then_some(self.park_after);
                match self.pace_within(req.channel, r, pacer, lane, budget).await {
                    Ok(Some((tat, _))) => ticket.rate = Some((r, tat)),
                    Ok(None) => {
                        pacer.lanes.saturate();
                        self.release_recipient(ticket).await?;
                        return Ok(None);
                    }
                    Err(e) => {
                        if self.release_recipient(ticket).await.is_err() {
                            self.keep_reservation(ticket);
                        }
                        return Err(e);
                    }
                }
            }
            (Admission::Admitted(_) | Admission::Shadowed { .. }, _) => {}
            (_, Some(r)) => {
                if let Some(tat) = taken {
                    self.refund(req.channel, r, tat).await?;
                }
            }
            _ => {}
        }
        Ok(Some(admission))
    }

    /// Keep an admission's reservation (its send stays counted) when the job's fate
    /// is unknown, e.g. its dispatch was sent but never confirmed: if this worker
    /// sees the job again it takes the reservation back at once; any other worker
    /// waits out the lease. Either way the recipient's slot is never freed for
    /// another job while the first may have been sent.
    pub fn keep_reservation(&self, ticket: &Ticket) {
        self.orphan(
            &ticket.key,
            &ticket.member,
            ticket.admitted_at.timestamp_millis(),
        );
    }

    pub(super) fn orphan(&self, key: &str, member: &[u8], reserved_at: i64) {
        let mut orphans = self.orphans.lock().unwrap_or_else(|e| e.into_inner());
        let lapsed = reserved_at - self.lease_ms;
        orphans.retain(|_, at| *at > lapsed);
        orphans.insert((key.to_string(), member.to_vec()), reserved_at);
    }

    /// Whether the reservation made at `reserved_at` is one of ours (then forget it).
    pub(super) fn adopt(&self, key: &str, member: &[u8], reserved_at: i64) -> bool {
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
    pub(super) fn cached_plan(
        &self,
        policy: &Arc<Policy>,
        tz: Tz,
        now: DateTime<Utc>,
    ) -> Arc<Plan> {
        let shadow = policy.mode == Mode::Shadow;
        cached(
            &self.plans,
            policy,
            &policy.rules,
            (shadow, policy.suppressed_by.0),
            tz,
            now,
        )
    }

    pub(super) async fn call_admit(
        &self,
        key: &str,
        member: &[u8],
        policy: &Arc<Policy>,
        layers: &[JobLayer],
        req: &Request<'_>,
        now: Option<i64>,
    ) -> Result<Verdict, StoreError> {
        let now = now
            .map(window::from_millis)
            .unwrap_or_else(|| self.redis_now());
        let tz = req.tz;
        let plan = self.cached_plan(policy, tz, now);
        let layers = layers
            .iter()
            .map(|(cap, holds, key)| LayerArgs {
                key: key.clone(),
                plan: cached(&self.cap_plans, cap, &cap.rules, (false, 0), tz, now),
                holds: *holds,
            })
            .collect();
        let reply = match self
            .admitter
            .admit(AdmitArgs {
                key: key.to_string(),
                member: member.to_vec(),
                plan,
                channel: self
                    .suppressions
                    .load(Ordering::Relaxed)
                    .then(|| req.channel.to_string()),
                prefs: self.preferences.on().then(|| {
                    let category = if policy.required { "" } else { req.category };
                    let hash = self.keys.for_tenant(req.tenant).preferences(req.recipient);
                    let (version, until) = self.preferences.quiet_known(&hash);
                    let words = [category, req.channel, req.priority.as_str()];
                    (words.map(str::to_string), version, until)
                }),
                layers,
            })
            .await
        {
            Err(StoreError::Unreplicated {
                reserved_at,
                recorded,
                acked,
                wanted,
            }) => {
                // recorded by this call, so ours: the retry takes it back instead of
                // waiting out the lease (one found there stays as it was: ours only
                // if already noted)
                if recorded {
                    self.orphan(key, member, reserved_at);
                }
                return Err(StoreError::Unreplicated {
                    reserved_at,
                    recorded,
                    acked,
                    wanted,
                });
            }
            reply => reply?,
        };
        self.observe(reply.now());
        match reply {
            Verdict::WrongType(_) => Err(unexpected(&reply)),
            reply => Ok(reply),
        }
    }
}

/// An answer of `lua/admit/` the worker cannot act on, as an error (retried like
/// Redis being away, never a decision).
fn unexpected(verdict: &Verdict) -> StoreError {
    StoreError::Answer {
        script: "admit.lua",
        answer: format!("{verdict:?}"),
    }
}
