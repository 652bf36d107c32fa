//! The channel's send rate: takes (batched per channel), refunds, and waiting for
//! the rate in the worker or, for a parked job, in its lane.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::{Pacer, QuotaStore};
use crate::quota::lanes::LaneAsk;
use crate::quota::policy::Rate;
use crate::redis::rate::{self, RateBatcher, RateReply};
use crate::redis::{refund, StoreError};

impl QuotaStore {
    /// Whether a new job of `channel` belongs behind the backlog its lanes hold,
    /// parked without asking Redis: this worker has jobs read from the lanes
    /// waiting for the rate, and the rate is saturated as it last saw it (a job was
    /// parked after asking, and no job of the lanes has since had its slot at its
    /// first ask). Lane jobs waiting a moment for their slot are no backlog: a rule
    /// of "any lane job waiting" parked every job that followed, for good.
    pub(crate) fn is_pacing(&self, channel: &str) -> bool {
        self.pacers.get(channel).is_some_and(|p| {
            p.in_lanes.load(Ordering::Relaxed) > 0 && p.saturated.load(Ordering::Relaxed)
        })
    }

    /// How far ahead this worker's lane lines of `channel` take slots now (how long
    /// a lane delivery may wait for a slot already its own).
    pub(crate) fn lane_ahead(&self, channel: &str) -> Duration {
        self.rates
            .get(channel)
            .map_or(Duration::ZERO, RateBatcher::lane_ahead)
    }

    /// Wait until `channel`'s rate gives a job of `ask.lane` a send slot; returns
    /// the TAT the take left (for [`RateStep::Taken`]).
    pub(crate) async fn pace_in_lane(
        &self,
        channel: &str,
        rate: Rate,
        ask: LaneAsk,
    ) -> Result<i64, StoreError> {
        let pacer = self
            .pacers
            .get(channel)
            .ok_or_else(|| StoreError::UnknownChannel(channel.to_string()))?;
        let _in_lanes = Counted::new(&pacer.in_lanes);
        let Some(batcher) = self.rates.get(channel) else {
            let (tat, asks) = self.pace_counting(channel, rate, pacer, Some(ask)).await?;
            if asks == 1 {
                // a slot at once: the lanes hold no backlog (any longer)
                pacer.saturated.store(false, Ordering::Relaxed);
            }
            return Ok(tat);
        };
        // in the lane's line of this worker (src/redis/rate_line.rs), then to the
        // slot's time
        let _waiting = Counted::new(&pacer.waiting);
        let slot = batcher.slot(rate, ask).await?;
        if slot.at_once {
            pacer.saturated.store(false, Ordering::Relaxed);
        }
        if !slot.wait.is_zero() {
            tokio::time::sleep(slot.wait).await;
        }
        Ok(slot.tat_us)
    }

    /// Wait until the channel's rate allows one more job, one waiter at a time;
    /// returns the TAT the take left and how many asks it took.
    async fn pace_counting(
        &self,
        channel: &str,
        rate: Rate,
        pacer: &Pacer,
        lane: Option<LaneAsk>,
    ) -> Result<(i64, u32), StoreError> {
        let paced = self.pace_within(channel, rate, pacer, lane, None).await?;
        Ok(paced.expect("a wait without a budget ends with a slot"))
    }

    /// [`QuotaStore::pace_counting`] for as long as the rate's refusals add up to
    /// at most `budget` (the `retry_after` of each refusal, not the time Redis
    /// took to answer); `None` when the next refusal would pass it.
    pub(super) async fn pace_within(
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
                1 => return Ok(Some((reply.tat_us, asks))),
                0 => {
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
        self.count_call();
        let key = self.keys.rate(channel);
        refund::refund(&self.conn, &self.scripts.refund, key, rate, tat).await
    }

    /// Take one job of `rate.cost` from the channel's rate, in one call with the
    /// channel's other jobs asking at the same moment.
    pub async fn take_rate(&self, channel: &str, rate: Rate) -> Result<RateReply, StoreError> {
        self.take_rate_in(channel, rate, None).await
    }

    /// [`QuotaStore::take_rate`] for a job in a lane (`lua/lanes.lua`) when `lane` is given.
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
        self.count_call();
        let key = self.keys.rate(channel);
        rate::take(&self.conn, &self.scripts.rate, key, rate, cost).await
    }
}

/// One more in a count for as long as it lives: a wait given up (a shutdown, a job
/// parked after all) leaves the count as it found it.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Counted<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
