//! One paced channel's lanes in this worker ([`ChannelLanes`]): whether they hold a
//! backlog, as this worker last saw it, and the lines ([`super::line`]) in which
//! the deliveries read from them wait for their send slots, asked of
//! `lua/lanes.lua` by the channel's [`Asker`].
//!
//! A job read from the jobs queue is parked without asking Redis while this
//! worker's lane deliveries wait for the rate and the rate is saturated
//! ([`ChannelLanes::holds_backlog`]): a job was parked after asking (the store
//! marks it, [`ChannelLanes::saturate`]), and no lane delivery has since had its
//! slot at its first ask. Lane deliveries waiting a moment for their slot are no
//! backlog: a rule of "any lane job waiting" parked every job that followed, for
//! good.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use super::line::{AskSlots, Lines, Tenant};
use super::share::LaneAsk;
use crate::counted::Counted;
use crate::quota::policy::Rate;
use crate::redis::conn::{count_call, RedisConn};
use crate::redis::lanes::{self, Candidate, Granted, LaneKeys};
use crate::redis::StoreError;

/// Who asks `lua/lanes.lua` for the slots of one channel's lines.
pub(crate) struct Asker {
    /// The connection.
    pub conn: RedisConn,
    /// `lua/lanes.lua`.
    pub script: Script,
    /// The channel's rate key and lane state.
    pub keys: LaneKeys,
    /// The schedules of the channel's lanes (fair shares) and their `seen` sets,
    /// by lane rank.
    pub schedules: [(String, String); 3],
    /// Redis commands sent (shared with the store's counter).
    pub calls: Arc<AtomicU64>,
    /// The channel's name (the label of the lanes' metrics).
    pub channel: String,
}

impl AskSlots for Asker {
    fn channel(&self) -> &str {
        &self.channel
    }

    async fn slots(
        &self,
        ask: (Rate, LaneAsk),
        wanted: usize,
        ahead: Duration,
        candidates: &[Candidate],
    ) -> Result<Granted, StoreError> {
        count_call(&self.calls);
        let keys = self.keys.clone();
        let (schedule, seen) = &self.schedules[ask.1.lane.rank().min(2)];
        let keys_of = (schedule.as_str(), seen.as_str());
        let fair = (!candidates.is_empty()).then_some((keys_of, candidates));
        let asked = (wanted, ahead);
        lanes::slots(&self.conn, &self.script, keys, ask, asked, fair).await
    }
}

/// One channel's lanes in this worker.
pub(crate) struct ChannelLanes {
    /// The deliveries read from the lanes that wait for the rate here.
    in_lanes: AtomicUsize,
    /// Of those, the jobs read from the jobs queue that wait in a line rather than
    /// being parked ([`ChannelLanes::wait_in_line`]).
    from_jobs: AtomicUsize,
    /// Whether the channel's rate holds a backlog, as this worker last saw it: set
    /// when a job read from the jobs queue is parked after asking (the rate's own
    /// answers put its wait past `lanes.park_after`; the time Redis takes to answer
    /// never counts), cleared when a job read from a lane gets its slot at its
    /// first ask.
    saturated: AtomicBool,
    /// The deliveries read from the lanes, waiting for their slots.
    lines: Lines,
    asker: Arc<Asker>,
}

impl std::fmt::Debug for ChannelLanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelLanes")
            .field("channel", &self.asker.channel)
            .finish_non_exhaustive()
    }
}

impl ChannelLanes {
    /// The lanes of the channel `asker` asks for.
    pub(crate) fn new(asker: Asker) -> ChannelLanes {
        ChannelLanes {
            in_lanes: AtomicUsize::new(0),
            from_jobs: AtomicUsize::new(0),
            saturated: AtomicBool::new(false),
            lines: Lines::default(),
            asker: Arc::new(asker),
        }
    }

    /// Whether a new job of the channel belongs behind the backlog its lanes hold,
    /// parked without asking Redis: this worker has jobs read from the lanes
    /// waiting for the rate, and the rate is saturated as it last saw it.
    pub(crate) fn holds_backlog(&self) -> bool {
        self.in_lanes.load(Ordering::Relaxed) > 0 && self.saturated.load(Ordering::Relaxed)
    }

    /// A job read from the jobs queue is parked after asking: the rate holds a
    /// backlog.
    pub(crate) fn saturate(&self) {
        self.saturated.store(true, Ordering::Relaxed);
    }

    /// How many jobs read from the jobs queue wait in this channel's lines now.
    pub(crate) fn jobs_in_line(&self) -> usize {
        self.from_jobs.load(Ordering::Relaxed)
    }

    /// [`ChannelLanes::slot`] for a job read from the jobs queue that its rate
    /// refused for a moment: it waits in its lane's line, served in turn with the
    /// lane's deliveries, instead of asking Redis again at every slot.
    /// It waits as a job of its tenant (name and weight), in that tenant's turn: waiting as a job
    /// without one, a tenant's jobs read from the jobs queue took the share of the
    /// jobs without a tenant on top of their own.
    pub(crate) async fn wait_in_line(
        &self,
        rate: Rate,
        ask: LaneAsk,
        (tenant, weight): (Option<&str>, u32),
    ) -> Result<i64, StoreError> {
        let _from_jobs = Counted::new(&self.from_jobs);
        let tenant = Tenant {
            name: tenant.map(std::sync::Arc::from),
            weight,
        };
        self.slot(rate, ask, tenant).await
    }

    /// How far ahead this worker's lines of the channel take slots now (how long a
    /// lane delivery may wait for a slot already its own).
    pub(crate) fn ahead(&self) -> Duration {
        self.lines.ahead()
    }

    /// Wait in `ask.lane`'s line of this worker for a send slot of `rate`, as a job
    /// of `tenant`, then to the slot's time; returns the TAT the take left.
    pub(crate) async fn slot(
        &self,
        rate: Rate,
        ask: LaneAsk,
        tenant: Tenant,
    ) -> Result<i64, StoreError> {
        let _in_lanes = Counted::new(&self.in_lanes);
        let slot = self.lines.slot(&self.asker, (rate, ask), tenant).await?;
        if slot.at_once {
            // a slot at once: the lanes hold no backlog (any longer)
            self.saturated.store(false, Ordering::Relaxed);
        }
        if !slot.wait.is_zero() {
            tokio::time::sleep(slot.wait).await;
        }
        Ok(slot.tat_us)
    }
}
