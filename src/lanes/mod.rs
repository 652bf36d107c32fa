//! Lanes, from the decision to the Redis call: a job whose channel's rate would
//! make it wait is not held in the worker; it is parked in its lane's queue
//! (`<lanes.queue_prefix><channel>.<lane>`), and the lane queues are consumed as
//! the rate allows, urgent first (`lua/lanes.lua` decides, for every worker at
//! once). The configuration is `config/lanes.rs` (`[lanes]`); the lane queues are
//! declared with the rest of the topology (`amqp/topology.rs`).
//!
//! A job read from the jobs queue asks the rate as before, in its lane; a wait of
//! at most `lanes.park_after` (a burst above the rate for a moment) it waits out
//! in the worker, in its lane's line, while fewer than half the jobs queue's
//! prefetch of such jobs wait there (past that the jobs queue would move only at
//! the channel's rate); a longer wait, a full line, or a line that keeps it past
//! half `redis.reservation_lease` (lanes above it took the slots) parks it (one extra
//! publish), after its recipient's reservation is given back: nothing is held or
//! counted while it waits. Once a job was parked so, and while this worker's jobs read from the
//! lanes wait for the rate without getting a slot at their first ask (the lanes
//! hold a backlog), a new one is parked behind them without asking Redis. A job
//! read from a lane queue first waits in the worker for a send slot in its lane
//! (as many per lane as the rate needs, at most `lanes.prefetch`), then is decided
//! as any other with that slot taken.
//!
//! In the order a job meets them:
//! - [`share`]: how the lanes of a channel share its rate (pure);
//! - [`step`]: which lane a job is in, and how it takes the rate (pure);
//! - [`park`]: the park itself, and the count of a job read back;
//! - [`slots`] and [`line`]: a channel's lanes in this worker, their backlog, and
//!   the line in which a lane's deliveries wait for their slots, asked of
//!   `lua/lanes.lua` ([`crate::redis::lanes`]);
//! - [`consume`], [`clocks`] and [`prefetch`] (pure): a session's lane consumers,
//!   and how many deliveries each holds;
//! - [`fair`] (pure) and [`tenants`]: fair shares inside a lane: a tenant's jobs
//!   parked in its own queue of the lane, every worker consuming every such queue,
//!   and each slot of the lane given by the lane's schedule (stride scheduling by
//!   `[tenants.NAME] weight`, in the same call of `lua/lanes.lua` that grants the
//!   slots) to the tenant whose turn it is among those waiting in the line.
//!
//! The worker's loop calls the room through the few names below
//! (`worker/lanes.rs` ties them to its session); the store keeps each channel's
//! [`slots::ChannelLanes`] beside its rate.

pub(crate) mod clocks;
pub(crate) mod consume;
pub mod fair;
pub(crate) mod line;
pub(crate) mod pacing;
pub(crate) mod park;
pub mod prefetch;
pub mod share;
pub(crate) mod slots;
pub(crate) mod step;
pub(crate) mod tenants;

pub(crate) use clocks::{LaneClocks, Prefetch};
pub(crate) use consume::LaneConsumers;
pub(crate) use line::Tenant;
pub(crate) use park::{taken, to_lane};
pub use share::{LaneAsk, LaneRate, Priority};
pub(crate) use slots::ChannelLanes;
pub(crate) use step::{before_slot, lane_of, Step};
pub(crate) use tenants::{TenantQueues, Watch};
