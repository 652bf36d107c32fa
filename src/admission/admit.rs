//! Admissions: a job's policy and the caps it meets, asked of the admission's script with the
//! plans of the day, the channel's rate taken with it, and the reservations this
//! store keeps for jobs whose dispatch failed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::command::{AdmitArgs, LayerArgs, LimitArgs, PrefsArgs};
use super::layers::JobLayer;
use super::protocol::Verdict;
use super::verdict::{self, Asked, QuietUntil};
use crate::admission::{Admission, RateStep, Request, Ticket};
use crate::counted::Counted;
use crate::lanes::pacing::Pacer;
use crate::lanes::share::LaneAsk;
use crate::preferences::set::QuietHours;
use crate::quota::keys::{self, Keys};
use crate::quota::limits::{Limit, Subject};
use crate::quota::policy::{Policy, Rate, Scope};
use crate::quota::window;
use crate::redis::rate::{Allowed, RateReply};
use crate::redis::StoreError;
use crate::rules::Rules;
use crate::store::QuotaStore;

/// A paced channel an admission takes the rate of: its name, its rate and its
/// pacer in this worker, and the job's tenant (whose share of the lane a wait in
/// the line takes).
struct PacedChannel<'a> {
    name: &'a str,
    rate: Rate,
    pacer: &'a Pacer,
    tenant: Option<&'a str>,
}

/// One admission asked of the quota store: it borrows the store whole, since the
/// call reaches its connection, key names, the channel's pacing, the admission's
/// state and the preferences' checks, and gives a reservation back through it.
/// Its methods are this file's (the call) and `quiet.rs`'s (quiet hours settled).
pub(crate) struct Admit<'a> {
    pub(crate) store: &'a QuotaStore,
}

/// The key of `req`'s recipient under `policy` (of its channel alone when the
/// policy counts per channel).
fn recipient_key(keys: &Keys, req: &Request<'_>, policy: &Policy) -> String {
    let channel = (policy.scope == Scope::Channel).then_some(req.channel);
    keys.recipient(req.recipient, &policy.name, channel)
}

impl Admit<'_> {
    /// [`QuotaStore::admit_under`], the channel's rate taken as `step` says; `None`
    /// when `step` is [`RateStep::Park`] and the rate would make the job wait (the
    /// recipient's reservation, if one was taken, is given back).
    pub(crate) async fn with(
        &self,
        req: &Request<'_>,
        rules: &Rules,
        step: RateStep,
    ) -> Result<Option<Admission>, StoreError> {
        let unknown = || StoreError::UnknownChannel(req.channel.to_string());
        // the job's own cost is what it takes of its channel's rate
        let rate = rules.channel(req.channel).ok_or_else(unknown)?.rate;
        let rate = rate.map(|r| r.for_cost(req.cost));
        let pacer = self.store.pacing.pacer(req.channel).ok_or_else(unknown)?;
        let asked = self.asked(req, rules);
        if let Some(never) = verdict::cost_never_admitted(&asked, req.channel, rate) {
            return Ok(Some(never));
        }
        let (first, rate_reply) = self.first_reply(req, &asked, (rate, pacer), step).await?;
        let (reply, quiet_until) = self.settled_reply(req, &asked, first).await?;
        // a refusal of a recipient with quiet hours that hold the job: what they
        // are (known, or one HGET for a version not known), so that the instant it
        // waits for is pushed past them as well
        let quiet = match reply {
            Verdict::Refused(now, _, Some(version)) | Verdict::Layered(now, _, Some(version)) => {
                self.quiet_end(req, version, now).await?.1
            }
            _ => None,
        };
        let taken = rate_reply
            .as_ref()
            .filter(|r| r.allowed == Allowed::YES)
            .map(|r| r.tat_us);
        let mut admission = match (reply, quiet_until) {
            (Verdict::QuietHours(..), Some((until, hours))) => {
                self.quiet_admission(req, &asked, until, hours).await?
            }
            (reply, _) => verdict::admission(
                req,
                asked,
                reply,
                quiet,
                rate.zip(taken),
                self.store.admission.lease_ms,
            )
            .map_err(|reply| unexpected(&reply))?,
        };
        match (&mut admission, rate) {
            (Admission::Admitted(ticket) | Admission::Shadowed { ticket, .. }, Some(r))
                if taken.is_none() =>
            {
                let channel = PacedChannel {
                    name: req.channel,
                    rate: r,
                    pacer,
                    tenant: req.tenant,
                };
                let paced = self.pace_admitted(ticket, channel, rate_reply, step);
                if !paced.await? {
                    return Ok(None);
                }
            }
            (Admission::Admitted(_) | Admission::Shadowed { .. }, _) => {}
            (_, Some(r)) => {
                if let Some(tat) = taken {
                    self.store.pacing.refund(req.channel, r, tat).await?;
                }
            }
            _ => {}
        }
        Ok(Some(admission))
    }

    /// What `src/admission/lua/` is asked for `req`: its policy (of its channel alone for
    /// an escalation), its recipient's key and member, the caps it is counted toward.
    fn asked(&self, req: &Request<'_>, rules: &Rules) -> Asked {
        let mut policy = rules.policy_of(req.category, req.tenant).clone();
        if req.counted {
            policy = rules.of_its_channel(&policy);
        }
        let names = self.store.keys.for_tenant(req.tenant);
        let key = recipient_key(&names, req, &policy);
        let layers = rules
            .layers(&policy, req.channel, req.category, req.tenant)
            .into_iter()
            .filter(|(cap, _)| !req.counted || cap.of_one_channel())
            .map(|(cap, holds)| {
                let channel = (cap.scope == Scope::Channel).then_some(req.channel);
                let key = names.cap(req.recipient, &cap.name, channel);
                JobLayer {
                    cap: cap.clone(),
                    holds,
                    key,
                }
            })
            .collect();
        let (limited, limits) = self.limits_of(req, rules).into_iter().unzip();
        Asked {
            policy,
            key,
            member: keys::member(req.id),
            layers,
            limits,
            limited,
        }
    }

    /// The limits a job of `req` meets, each with what the script takes for it
    /// (its bucket, its GCRA, the job's cost: its own, else its channel's).
    fn limits_of(&self, req: &Request<'_>, rules: &Rules) -> Vec<(Arc<Limit>, LimitArgs)> {
        let subject = Subject {
            channel: req.channel,
            category: req.category,
            tenant: req.tenant,
            sender: req.sender,
        };
        let limits = rules.limits_of(&subject);
        if limits.is_empty() {
            return Vec::new();
        }
        let cost = req
            .cost
            .or_else(|| rules.channel(req.channel).map(|c| c.cost))
            .unwrap_or(1);
        let now = self.store.redis_now();
        let zone = rules.tenant_zone(req.tenant);
        // a limit warming up meets a daily count as well, as a quota does
        let warming = limits.iter().filter_map(|(l, bucket)| {
            let q = l.warmup.as_ref()?.today(window::local_date(zone, now))?;
            let (start, end) = q.period(zone, now);
            let key = self
                .store
                .keys
                .warmup(&l.name, *bucket, start.timestamp_millis());
            let args = LimitArgs {
                key: key.into(),
                interval_us: 0,
                burst: u64::from(q.limit),
                cost: end.timestamp_millis().max(0) as u64,
            };
            Some((l.clone(), args))
        });
        let warming: Vec<_> = warming.collect();
        let mut bucket_keys = self.store.admission.bucket_keys();
        limits
            .into_iter()
            .map(|(l, bucket)| {
                let args = match &l.quota {
                    // a quota: its counter of the period now is in (interval 0,
                    // the count it allows, the period's end in ms)
                    Some(q) => {
                        let (start, end) = q.period(rules.tenant_zone(req.tenant), now);
                        let window = q.window.to_string();
                        LimitArgs {
                            key: self
                                .store
                                .keys
                                .quota(&l.name, &window, bucket, start.timestamp_millis())
                                .into(),
                            interval_us: 0,
                            burst: u64::from(q.limit),
                            cost: end.timestamp_millis().max(0) as u64,
                        }
                    }
                    None => LimitArgs {
                        key: bucket_keys
                            .get(&l.name, bucket, || self.store.keys.limit(&l.name, bucket)),
                        interval_us: l.rate.interval_us,
                        burst: l.rate.burst,
                        cost,
                    },
                };
                (l, args)
            })
            .chain(warming)
            .collect()
    }

    /// The script's first answer, and the channel's rate's: taken with it (in one
    /// round trip's time), or taken already (`step`), or not asked (a channel
    /// without a rate, or jobs waiting here for it: a new one joins them rather
    /// than racing them; one that may be parked asks at once, to learn how long it
    /// would wait).
    async fn first_reply(
        &self,
        req: &Request<'_>,
        a: &Asked,
        (rate, pacer): (Option<Rate>, &Pacer),
        step: RateStep,
    ) -> Result<(Verdict, Option<RateReply>), StoreError> {
        let parking = matches!(step, RateStep::Park(_));
        let pacing = rate.is_some() && !parking && pacer.waiting.load(Ordering::Relaxed) > 0;
        let lane = match step {
            RateStep::Wait(lane) | RateStep::Park(lane) => lane,
            RateStep::Taken(_) => None,
        };
        let admit = self.call_admit(a, req, None);
        match (rate, step) {
            (Some(_), RateStep::Taken(tat_us)) => {
                let taken = RateReply {
                    allowed: 1,
                    remaining: 0,
                    retry_after: Duration::ZERO,
                    tat_us,
                };
                Ok((admit.await?, Some(taken)))
            }
            (Some(r), _) if !pacing => {
                let (verdict, rate) =
                    tokio::join!(admit, self.store.pacing.take_rate_in(req.channel, r, lane));
                let verdict = verdict?;
                match rate {
                    Ok(rate) => Ok((verdict, Some(rate))),
                    Err(e) => {
                        if let Verdict::Admitted(at, ..) = verdict {
                            self.store.admission.orphan(&a.key, &a.member, at);
                        }
                        Err(e)
                    }
                }
            }
            _ => Ok((admit.await?, None)),
        }
    }

    /// The script's answer once settled: quiet hours to compute first (then asked
    /// again, unless they hold the job: their end and what they are), a plan for
    /// another day (asked again with the Redis time it answered), at most three
    /// times; a reservation of its own taken back.
    async fn settled_reply(
        &self,
        req: &Request<'_>,
        a: &Asked,
        mut reply: Verdict,
    ) -> Result<(Verdict, QuietUntil), StoreError> {
        let mut quiet_until = None;
        for _ in 0..3 {
            let now = match reply {
                Verdict::QuietHours(now, version) => {
                    if let (Some(until), Some(hours)) = self.quiet_end(req, version, now).await? {
                        quiet_until = Some((until, hours));
                        break;
                    }
                    None
                }
                Verdict::Replan(now) => Some(now),
                _ => break,
            };
            reply = self.call_admit(a, req, now).await?;
        }
        if let Verdict::Reserved(_, at) = reply {
            if self.store.admission.adopt(&a.key, &a.member, at) {
                reply = Verdict::Admitted(at, true, Vec::new());
            }
        }
        Ok((reply, quiet_until))
    }

    /// A job its recipient's quiet hours hold until `until`: with its caps, their
    /// refusal at the quiet hours' end, if they would refuse it then.
    async fn quiet_admission(
        &self,
        req: &Request<'_>,
        a: &Asked,
        until: DateTime<Utc>,
        hours: Arc<QuietHours>,
    ) -> Result<Admission, StoreError> {
        metrics::counter!(crate::metrics::PREFERENCE_TOTAL, "outcome" => "quiet_hours")
            .increment(1);
        let at_end = self.caps_at(a, req.tz, until, &hours).await?;
        Ok(at_end.unwrap_or(Admission::Quiet { until, hours }))
    }

    /// An admission whose channel's rate was not taken with it: the rate waited for
    /// here, into `ticket` (true), or, for a job that may be parked (`step`) and
    /// would wait longer than `lanes.park_after`, its recipient's reservation given
    /// back (false: park it).
    async fn pace_admitted(
        &self,
        ticket: &mut Ticket,
        paced: PacedChannel<'_>,
        rate_reply: Option<RateReply>,
        step: RateStep,
    ) -> Result<bool, StoreError> {
        let PacedChannel {
            name: channel,
            rate: r,
            pacer,
            tenant,
        } = paced;
        if let Some(reply) = &rate_reply {
            if reply.allowed == Allowed::NEVER {
                // never reached: validation keeps cost <= burst
                return Err(StoreError::CostAboveBurst {
                    channel: channel.to_string(),
                    cost: r.cost,
                    burst: r.burst,
                });
            }
        }
        let (parking, lane) = match step {
            RateStep::Park(lane) => (true, lane),
            RateStep::Wait(lane) => (false, lane),
            RateStep::Taken(_) => (false, None),
        };
        let short = |reply: &RateReply| self.store.pacing.short(reply, r, pacer);
        if parking && !rate_reply.as_ref().is_some_and(short) {
            return self.park_instead(ticket, pacer).await;
        }
        let waited = match (parking, lane) {
            // a job that may be parked waits in its lane's line (one ask serves the
            // line), while the jobs read from the jobs queue waiting in the lines
            // are fewer than half its prefetch: past that the jobs queue would move
            // only at the channel's rate, behind jobs that wait
            (true, Some(_)) if pacer.lanes.jobs_in_line() >= self.store.pacing.line_cap() => {
                Ok(None)
            }
            // (lanes above it may take the slots meanwhile: after half its
            // reservation's lease in the line it is parked after all, so the
            // reservation never outlives it; a slow Redis alone never comes near)
            (true, Some(ask)) => self.wait_in_line(pacer, r, ask, tenant).await,
            // waited out here while the rate's own answers add up to at most
            // lanes.park_after (a lane above it may take the slots meanwhile);
            // then parked after all. The time Redis takes to answer does not
            // count: a slow Redis is no backlog, and parking would only add a
            // publish and a delivery to every job while it is slow.
            _ => {
                let budget = parking.then_some(self.store.pacing.park_after());
                let paced = self
                    .store
                    .pacing
                    .pace_within(channel, r, pacer, lane, budget)
                    .await;
                paced.map(|p| p.map(|(tat, _)| tat))
            }
        };
        match waited {
            Ok(Some(tat)) => {
                ticket.rate = Some((r, tat));
                Ok(true)
            }
            Ok(None) => self.park_instead(ticket, pacer).await,
            Err(e) => {
                if self.store.release_recipient(ticket).await.is_err() {
                    self.store.keep_reservation(ticket);
                }
                Err(e)
            }
        }
    }

    /// A job that may be parked, waiting in its lane's line for at most half its
    /// reservation's lease: the TAT its take left, `None` when the wait ran out.
    async fn wait_in_line(
        &self,
        pacer: &Pacer,
        r: Rate,
        ask: LaneAsk,
        tenant: Option<&str>,
    ) -> Result<Option<i64>, StoreError> {
        let _waiting = Counted::new(&pacer.waiting);
        let limit = Duration::from_millis(self.store.admission.lease_ms.max(2) as u64 / 2);
        let tenant = (tenant, self.store.rules().tenant_weight(tenant));
        let in_line = pacer.lanes.wait_in_line(r, ask, tenant);
        match tokio::time::timeout(limit, in_line).await {
            Ok(taken) => taken.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Park the job rather than wait: the rate holds a backlog; its recipient's
    /// reservation is given back (nothing is held or counted while it is parked).
    async fn park_instead(&self, ticket: &mut Ticket, pacer: &Pacer) -> Result<bool, StoreError> {
        pacer.lanes.saturate();
        self.store.release_recipient(ticket).await?;
        Ok(false)
    }

    pub(super) async fn call_admit(
        &self,
        a: &Asked,
        req: &Request<'_>,
        now: Option<i64>,
    ) -> Result<Verdict, StoreError> {
        let (key, member, policy, layers) = (&a.key, &a.member, &a.policy, &a.layers);
        let now = now
            .map(window::from_millis)
            .unwrap_or_else(|| self.store.redis_now());
        let tz = req.tz;
        let plan = self.store.admission.policy_plan(policy, tz, now);
        let layers = layers
            .iter()
            .map(|l| LayerArgs {
                key: l.key.clone(),
                plan: self.store.admission.cap_plan(&l.cap, tz, now),
                holds: l.holds,
            })
            .collect();
        let reply = match self
            .store
            .admission
            .admitter
            .admit(AdmitArgs {
                key: key.to_string(),
                member: member.to_vec(),
                plan,
                channel: self
                    .store
                    .admission
                    .checks_suppressions()
                    .then(|| req.channel.to_string()),
                prefs: self.store.preferences.on().then(|| {
                    let category = if policy.required { "" } else { req.category };
                    let hash = self
                        .store
                        .keys
                        .for_tenant(req.tenant)
                        .preferences(req.recipient);
                    let (version, until) = self.store.preferences.quiet_known(&hash);
                    let words = [category, req.channel, req.priority.as_str()];
                    PrefsArgs {
                        words: words.map(str::to_string),
                        version,
                        until,
                    }
                }),
                layers,
                limits: a.limits.clone(),
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
                    self.store.admission.orphan(key, member, reserved_at);
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
        self.store.observe(reply.now());
        match reply {
            Verdict::WrongType(_) => Err(unexpected(&reply)),
            reply => Ok(reply),
        }
    }
}

/// An answer of `src/admission/lua/` the worker cannot act on, as an error (retried like
/// Redis being away, never a decision).
fn unexpected(verdict: &Verdict) -> StoreError {
    StoreError::Answer {
        script: "admit.lua",
        answer: format!("{verdict:?}"),
    }
}
