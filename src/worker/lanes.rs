//! The worker's side of lanes ([`crate::lanes`], [`LaneSide`]): a paced channel's
//! job takes its rate as the lanes room says, waiting for its send slot under the
//! session's stop and timed for the lanes' prefetch; a parked job is published on
//! the session's publisher. It owns what the lane deliveries took (their clocks)
//! and the tenants' queues this worker parks in and consumes.

use std::sync::Arc;
use std::time::Instant;

use chrono::{DateTime, Utc};

use lapin::message::Delivery;

use super::asks::Asks;
use super::error::ProcessError;
use super::link::BrokerLink;
use crate::admission::RateStep;
use crate::amqp::{PublishError, Topology};
use crate::job::decode::Job;
use crate::job::Outcome;
use crate::lanes::tenants::TenantLane;
use crate::lanes::{
    self, ChannelLanes, LaneAsk, LaneClocks, LaneRate, Prefetch, Priority, Step, Tenant,
    TenantQueues, Watch,
};
use crate::quota::policy::Rate;

/// A session's lanes' channel, as its tuner holds it: the channel, the tags of
/// its consumers, and the tuner's tag.
pub(crate) struct LanesChannel {
    pub(crate) channel: lapin::Channel,
    pub(crate) tags: Arc<std::sync::Mutex<Vec<String>>>,
    pub(crate) tag: String,
}

/// The worker's side of lanes.
#[derive(Debug)]
pub(crate) struct LaneSide {
    pub(super) asks: Asks,
    topology: Topology,
    /// What the lane deliveries took, per paced channel (for their prefetch).
    pub(super) clocks: Arc<LaneClocks>,
    /// The tenants' queues of the lanes this worker parks in and consumes.
    tenant_queues: Arc<TenantQueues>,
}

impl LaneSide {
    /// The lanes of `topology`, asking `asks`.
    pub(super) fn new(asks: Asks, topology: &Topology) -> LaneSide {
        LaneSide {
            asks,
            clocks: Arc::new(LaneClocks::new(topology)),
            topology: topology.clone(),
            tenant_queues: Arc::default(),
        }
    }

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
            let lanes = self.asks.store.pacing().lanes(&job.channel);
            lanes.is_some_and(ChannelLanes::holds_backlog)
        };
        if let Some(step) = lanes::before_slot(&self.topology, &job.channel, ask, from, backlog) {
            return Ok(step);
        }
        let tenant = Tenant {
            name: job.tenant.as_deref().map(Arc::from),
            weight: self.asks.store.rules().tenant_weight(job.tenant.as_deref()),
        };
        let slot = || {
            self.asks
                .store
                .pacing()
                .pace_in_lane(&job.channel, rate, ask, tenant.clone())
        };
        let asked = Instant::now();
        let tat = tokio::select! {
            _ = s.stop.cancelled() => return Err(ProcessError::Interrupted),
            tat = self.asks.retry_redis(slot, &s.stop) => tat?,
        };
        if let Some(index) = self.topology.laned.iter().position(|c| *c == job.channel) {
            self.clocks.waited(index, asked.elapsed());
        }
        Ok(Step::Admit(RateStep::Taken(tat)))
    }

    /// Count a job of a lane queue given its send slot, and how long it waited.
    pub(crate) fn taken(&self, delivery: &Delivery, channel: &str, lane: Priority) {
        let now_ms = self.asks.store.redis_now().timestamp_millis();
        lanes::taken(delivery, channel, lane, now_ms);
    }

    /// Publish the delivery to its lane's queue, or for a job of a tenant to its
    /// tenant's queue of the lane (registered and declared first), confirmed; the
    /// caller acks it. `asked`: whether the job asked the rate first.
    pub(crate) async fn park(
        &self,
        s: &BrokerLink,
        (delivery, job): (&Delivery, &Job<'_>),
        first_seen: DateTime<Utc>,
        lane: (Priority, bool),
    ) -> Result<Outcome, ProcessError> {
        let now = (self.asks.store.redis_now(), first_seen);
        let Some(tenant) = job.tenant.as_deref() else {
            let queue = self.topology.lane_queue(&job.channel, lane.0);
            let parked = lanes::to_lane(&s.publisher, &queue, now, (delivery, job), lane);
            return Ok(parked.await?);
        };
        let queue = self.topology.tenant_queue(&job.channel, lane.0, tenant);
        let of = TenantLane {
            channel: job.channel.as_ref(),
            lane: lane.0,
            tenant,
        };
        let queues = &self.tenant_queues;
        for _ in 0..2 {
            if !queues.fresh(&queue) {
                let register = || queues.register(&self.asks.store, of);
                self.asks.retry_redis(register, &s.stop).await?;
                let on = s.publisher.channel();
                let declared = lanes::tenants::declare(on, &self.topology, &queue).await;
                declared.map_err(PublishError::Amqp)?;
                queues.readied(&queue);
            }
            let parked = lanes::to_lane(&s.publisher, &queue, now, (delivery, job), lane);
            match parked.await {
                // deleted since this worker declared it (it went quiet): again
                Err(PublishError::Returned) => queues.gone(&queue),
                parked => return Ok(parked?),
            }
        }
        Err(PublishError::Returned.into())
    }

    /// A session's consumers of the tenants' queues, on its lanes' channel.
    pub(crate) fn tenant_watch(&self, conn: Arc<lapin::Connection>, on: LanesChannel) -> Watch {
        let LanesChannel { channel, tags, tag } = on;
        Watch {
            store: self.asks.store.clone(),
            topology: self.topology.clone(),
            queues: self.tenant_queues.clone(),
            channel,
            conn,
            tags,
            tag,
            prefetch: self.prefetch(),
        }
    }

    /// A lane delivery settled: no longer held from its tenant's queue.
    pub(crate) fn settled(&self, delivery: &Delivery) {
        self.tenant_queues.settled(delivery);
    }

    /// What the lanes' prefetch of a session is worked out from.
    pub(crate) fn prefetch(&self) -> Prefetch {
        Prefetch {
            store: self.asks.store.clone(),
            topology: self.topology.clone(),
            clocks: self.clocks.clone(),
        }
    }
}
