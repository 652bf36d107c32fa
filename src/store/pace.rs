//! The channel's send rate: takes (batched per channel), refunds, and waiting for
//! the rate in the worker or, for a job read from a lane, in its lane's line (the
//! lanes room's [`ChannelLanes`]).

use std::time::Duration;

use super::{Pacer, QuotaStore};
use crate::counted::Counted;
use crate::lanes::line::Tenant;
use crate::lanes::share::LaneAsk;
use crate::lanes::slots::ChannelLanes;
use crate::quota::policy::Rate;
use crate::redis::rate::{self, Allowed, RateReply};
use crate::redis::{refund, StoreError};

impl QuotaStore {
    /// The lanes of `channel` in this worker (`None`: not a configured channel).
    pub(crate) fn lanes(&self, channel: &str) -> Option<&ChannelLanes> {
        self.pacers.get(channel).map(|p| &p.lanes)
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
