//! The worker's side of lanes ([`crate::lanes`]): a paced channel's job takes its
//! rate as the lanes room says, waiting for its send slot under the session's stop
//! and timed for the lanes' prefetch; a parked job is published on the session's
//! publisher.

use std::time::Instant;

use chrono::{DateTime, Utc};

use lapin::message::Delivery;

use super::error::ProcessError;
use super::link::BrokerLink;
use super::Worker;
use crate::admission::RateStep;
use crate::job::decode::Job;
use crate::job::Outcome;
use crate::lanes::{self, ChannelLanes, LaneAsk, LaneRate, Prefetch, Priority, Step};
use crate::quota::policy::Rate;

impl Worker {
    /// How to take the rate of `job`'s paced channel (its rate and how its lanes
    /// share it, [`lanes::before_slot`]); for a job read from a lane queue, this
    /// waits for its send slot (and gives up at `s.stop`).
    pub(crate) async fn rate_step(
        &self,
        s: &BrokerLink,
        job: &Job<'_>,
        lane: Priority,
        from: Option<Priority>,
        (rate, lanes): (Rate, LaneRate),
    ) -> Result<Step, ProcessError> {
        let ask = LaneAsk { lane, lanes };
        let backlog = || {
            let lanes = self.store.lanes(&job.channel);
            lanes.is_some_and(ChannelLanes::holds_backlog)
        };
        if let Some(step) = lanes::before_slot(&self.topology, &job.channel, ask, from, backlog) {
            return Ok(step);
        }
        let slot = || self.store.pace_in_lane(&job.channel, rate, ask);
        let asked = Instant::now();
        let tat = tokio::select! {
            _ = s.stop.cancelled() => return Err(ProcessError::Interrupted),
            tat = self.retry_redis(slot, &s.stop) => tat?,
        };
        if let Some(index) = self.topology.laned.iter().position(|c| *c == job.channel) {
            self.lane_clocks.waited(index, asked.elapsed());
        }
        Ok(Step::Admit(RateStep::Taken(tat)))
    }

    /// Count a job of a lane queue given its send slot, and how long it waited.
    pub(crate) fn lane_taken(&self, delivery: &Delivery, channel: &str, lane: Priority) {
        let now_ms = self.store.redis_now().timestamp_millis();
        lanes::taken(delivery, channel, lane, now_ms);
    }

    /// Publish the delivery to its lane's queue (confirmed), noting when a worker
    /// first saw it; the caller acks it. `asked`: whether the job asked the rate
    /// first.
    pub(crate) async fn park(
        &self,
        s: &BrokerLink,
        (delivery, job): (&Delivery, &Job<'_>),
        first_seen: DateTime<Utc>,
        lane: (Priority, bool),
    ) -> Result<Outcome, ProcessError> {
        let at = (self.store.redis_now(), first_seen);
        let parked = lanes::to_lane(&s.publisher, &self.topology, at, (delivery, job), lane);
        Ok(parked.await?)
    }

    /// What the lanes' prefetch of a session is worked out from.
    pub(crate) fn lane_prefetch(&self) -> Prefetch {
        Prefetch {
            store: self.store.clone(),
            topology: self.topology.clone(),
            clocks: self.lane_clocks.clone(),
        }
    }
}
