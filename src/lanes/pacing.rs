//! Each channel's send rate in this worker: its takes (batched per channel), its
//! refunds, and the waits for it, in the worker or, for a job read from a lane, in
//! its lane's line ([`ChannelLanes`]). The quota store holds it whole; the
//! admission asks it for the channel's rate it takes with a recipient's caps.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use crate::config::Settings;
use crate::counted::Counted;
use crate::lanes::line::Tenant;
use crate::lanes::share::{LaneAsk, Priority};
use crate::lanes::slots::{Asker, ChannelLanes};
use crate::quota::keys::Keys;
use crate::quota::policy::Rate;
use crate::redis::conn::count_call;
use crate::redis::rate::{self, Allowed, RateReply};
use crate::redis::rate_batch::{RateBatcher, Taker};
use crate::redis::{refund, RedisConn, Scripts, StoreError};

/// How many jobs of one channel wait for its send rate. While any do, a newly
/// admitted job joins them rather than racing them for the next free slot. (They
/// do not stampede Redis: the ones that wake together ask in one call.) With the
/// channel's lanes in this worker.
#[derive(Debug)]
pub(crate) struct Pacer {
    pub(crate) waiting: AtomicUsize,
    pub(crate) lanes: ChannelLanes,
}

/// The send rates of the configured channels in this worker (the set of channels
/// never changes while running).
pub struct Pacing {
    conn: RedisConn,
    keys: Keys,
    /// `lua/rate.lua`.
    rate: Script,
    /// `lua/refund.lua`.
    refund: Script,
    /// Redis commands sent (the store's counter).
    calls: Arc<AtomicU64>,
    /// One per configured channel.
    pacers: HashMap<String, Pacer>,
    /// One per configured channel: its rate's takes, batched.
    rates: HashMap<String, RateBatcher>,
    /// The longest rate wait a job read from the jobs queue waits out here rather
    /// than being parked in its lane (`lanes.park_after`).
    park_after: Duration,
    /// The most jobs read from the jobs queue that wait in a paced channel's lane
    /// lines before the next one is parked: half the jobs queue's prefetch.
    line_cap: usize,
}

impl std::fmt::Debug for Pacing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pacing")
            .field("pacers", &self.pacers)
            .field("park_after", &self.park_after)
            .finish_non_exhaustive()
    }
}

impl Pacing {
    /// The configured channels' rates and lanes, on `conn` (`calls` counts the
    /// commands sent).
    pub(crate) fn new(
        conn: &RedisConn,
        scripts: &Scripts,
        keys: &Keys,
        settings: &Settings,
        calls: &Arc<AtomicU64>,
    ) -> Pacing {
        let rates = rate_batchers(conn, scripts, keys, settings, calls);
        let pacers = pacers(conn, scripts, keys, settings, calls);
        Pacing {
            conn: conn.clone(),
            keys: keys.clone(),
            rate: scripts.channel.rate.clone(),
            refund: scripts.channel.refund.clone(),
            calls: calls.clone(),
            pacers,
            rates,
            park_after: settings.lanes.park_after.0,
            line_cap: (settings.amqp.prefetch as usize / 2).max(1),
        }
    }

    /// The pacer of `channel` (`None`: not a configured channel).
    pub(crate) fn pacer(&self, channel: &str) -> Option<&Pacer> {
        self.pacers.get(channel)
    }

    /// The lanes of `channel` in this worker (`None`: not a configured channel).
    pub(crate) fn lanes(&self, channel: &str) -> Option<&ChannelLanes> {
        self.pacers.get(channel).map(|p| &p.lanes)
    }

    /// The longest rate wait a job read from the jobs queue waits out here
    /// (`lanes.park_after`).
    pub(crate) fn park_after(&self) -> Duration {
        self.park_after
    }

    /// The most jobs read from the jobs queue that wait in a channel's lane lines.
    pub(crate) fn line_cap(&self) -> usize {
        self.line_cap
    }

    /// Whether a job that may be parked waits its rate out here: refused for at
    /// most `lanes.park_after` (a burst above the rate for a moment, waited out at
    /// no extra publish), counting the jobs already waiting here, each a slot
    /// ahead of this one.
    pub(crate) fn short(&self, reply: &RateReply, r: Rate, pacer: &Pacer) -> bool {
        let ahead = pacer.waiting.load(Ordering::Relaxed) as u64;
        let queued_us = r.interval_us.saturating_mul(r.cost).saturating_mul(ahead);
        let wait_us = (reply.retry_after.as_micros() as u64).saturating_add(queued_us);
        reply.allowed == Allowed::NOT_YET && wait_us <= self.park_after.as_micros() as u64
    }

    /// Wait until `channel`'s rate gives a job of `ask.lane` a send slot, in its
    /// lane's line of this worker ([`ChannelLanes::slot`]), as a job of `tenant`, counted among the jobs
    /// that wait for the rate; returns the TAT the take left (for
    /// [`RateStep::Taken`](crate::admission::RateStep::Taken)).
    pub(crate) async fn pace_in_lane(
        &self,
        channel: &str,
        rate: Rate,
        ask: LaneAsk,
        tenant: Tenant,
    ) -> Result<i64, StoreError> {
        let pacer = self
            .pacers
            .get(channel)
            .ok_or_else(|| StoreError::UnknownChannel(channel.to_string()))?;
        let _waiting = Counted::new(&pacer.waiting);
        pacer.lanes.slot(rate, ask, tenant).await
    }

    /// Wait until the channel's rate allows one more job, for as long as the
    /// rate's refusals add up to at most `budget` (the `retry_after` of each
    /// refusal, not the time Redis took to answer; `None`: for good); returns the
    /// TAT the take left and how many asks it took, `None` when the next refusal
    /// would pass the budget.
    pub(crate) async fn pace_within(
        &self,
        channel: &str,
        rate: Rate,
        pacer: &Pacer,
        lane: Option<LaneAsk>,
        budget: Option<Duration>,
    ) -> Result<Option<(i64, u32)>, StoreError> {
        let _waiting = Counted::new(&pacer.waiting);
        let mut asks = 0u32;
        let mut refused = Duration::ZERO;
        loop {
            let reply = self.take_rate_in(channel, rate, lane).await?;
            asks = asks.saturating_add(1);
            match reply.allowed {
                Allowed::YES => return Ok(Some((reply.tat_us, asks))),
                Allowed::NOT_YET => {
                    let wait = reply.retry_after.max(Duration::from_micros(100));
                    refused += wait;
                    if budget.is_some_and(|b| refused > b) {
                        return Ok(None);
                    }
                    tokio::time::sleep(wait).await
                }
                _ => {
                    return Err(StoreError::CostAboveBurst {
                        channel: channel.to_string(),
                        cost: rate.cost,
                        burst: rate.burst,
                    })
                }
            }
        }
    }

    /// Give back what one take of `channel`'s rate added and is still unspent
    /// (`tat`: the TAT that take left); returns the credit given back.
    pub async fn refund(
        &self,
        channel: &str,
        rate: Rate,
        tat: i64,
    ) -> Result<Duration, StoreError> {
        count_call(&self.calls);
        let key = self.keys.rate(channel);
        refund::refund(&self.conn, &self.refund, key, rate, tat).await
    }

    /// Take one job of `rate.cost` from the channel's rate, in one call with the
    /// channel's other jobs asking at the same moment.
    pub async fn take_rate(&self, channel: &str, rate: Rate) -> Result<RateReply, StoreError> {
        self.take_rate_in(channel, rate, None).await
    }

    /// [`Pacing::take_rate`] for a job in a lane (`lua/lanes.lua`) when `lane` is given.
    pub async fn take_rate_in(
        &self,
        channel: &str,
        rate: Rate,
        lane: Option<LaneAsk>,
    ) -> Result<RateReply, StoreError> {
        match self.rates.get(channel) {
            Some(batcher) => batcher.take(rate, lane).await,
            // (no batcher: boxed, so that a batched take's future stays small)
            None => Box::pin(self.call_rate(channel, rate, rate.cost)).await,
        }
    }

    /// Ask the channel's GCRA for `cost` jobs (tests and the admin use this directly).
    pub async fn call_rate(
        &self,
        channel: &str,
        rate: Rate,
        cost: u64,
    ) -> Result<RateReply, StoreError> {
        count_call(&self.calls);
        let key = self.keys.rate(channel);
        rate::take(&self.conn, &self.rate, key, rate, cost).await
    }
}

/// A pacer a channel, with the channel's lanes, which ask `lua/lanes.lua` on the
/// channel's keys.
fn pacers(
    conn: &RedisConn,
    scripts: &Scripts,
    keys: &Keys,
    settings: &Settings,
    calls: &Arc<AtomicU64>,
) -> HashMap<String, Pacer> {
    settings
        .channels
        .keys()
        .map(|c| {
            let asker = Asker {
                conn: conn.clone(),
                script: scripts.channel.lanes.clone(),
                keys: (keys.rate(c), keys.lanes(c)),
                schedules: Priority::ALL.map(|p| {
                    let schedule = keys.fair_schedule(c, p.as_str());
                    (schedule.clone(), format!("{schedule}:seen"))
                }),
                calls: calls.clone(),
                channel: c.clone(),
            };
            let pacer = Pacer {
                waiting: AtomicUsize::new(0),
                lanes: ChannelLanes::new(asker),
            };
            (c.clone(), pacer)
        })
        .collect()
}

/// A rate batcher a channel, each on its own key of `lua/rate.lua` and
/// `lua/lanes.lua`; a paced channel's rate in force shown in the metrics at once.
fn rate_batchers(
    conn: &RedisConn,
    scripts: &Scripts,
    keys: &Keys,
    settings: &Settings,
    calls: &Arc<AtomicU64>,
) -> HashMap<String, RateBatcher> {
    settings
        .channels
        .keys()
        .map(|c| {
            let taker = Taker {
                conn: conn.clone(),
                script: scripts.channel.rate.clone(),
                key: keys.rate(c),
                lanes_script: scripts.channel.lanes.clone(),
                lanes_key: keys.lanes(c),
                calls: calls.clone(),
                channel: c.clone(),
                shown: AtomicU64::new(settings.rate(c).map_or(0, |r| {
                    crate::metrics::channel_rate(c, r, Some(r.interval_us));
                    r.interval_us
                })),
            };
            (c.clone(), RateBatcher::start(taker))
        })
        .collect()
}
