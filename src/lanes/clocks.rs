//! How many deliveries the worker holds from each lane queue, as it runs: what its
//! channel's rate needs for the time a lane job takes besides its wait for the rate
//! ([`super::prefetch`], the arithmetic), within a floor and `lanes.prefetch`.
//!
//! The worker measures as it goes ([`LaneClocks`]): for each paced channel, the time
//! its lane deliveries take from delivery to settle, and their waits for the rate.
//! A session's tuner ([`super::consume::Tuner`]) takes those sums into a moving
//! estimate every tick (kept across sessions: a reconnect starts from what the last
//! session learned) and asks [`Prefetch`] what to hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::prefetch::{self, Bounds, Estimate};
use crate::amqp::acks::HOLD;
use crate::amqp::Topology;
use crate::quota::policy::Rate;
use crate::store::QuotaStore;

/// What the worker measured of one paced channel's lane deliveries since its
/// tuner last looked, and its moving estimate.
#[derive(Debug, Default)]
struct Clock {
    count: AtomicU64,
    total_us: AtomicU64,
    wait_us: AtomicU64,
    /// The estimate, as `f64` bits of seconds (0: none yet).
    estimate: AtomicU64,
}

/// The clocks of every paced channel, in the order of `Topology::laned`.
#[derive(Debug, Default)]
pub(crate) struct LaneClocks(Vec<Clock>);

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl LaneClocks {
    /// A clock per channel of `topology` with lanes.
    pub(crate) fn new(topology: &Topology) -> LaneClocks {
        LaneClocks(topology.laned.iter().map(|_| Clock::default()).collect())
    }

    /// A lane delivery of the `index`-th channel waited `wait` for its send slot.
    pub(crate) fn waited(&self, index: usize, wait: Duration) {
        if let Some(c) = self.0.get(index) {
            c.wait_us.fetch_add(micros(wait), Ordering::Relaxed);
        }
    }

    /// A lane delivery of the `index`-th channel was settled `took` after it came.
    pub(crate) fn settled(&self, index: usize, took: Duration) {
        if let Some(c) = self.0.get(index) {
            c.total_us.fetch_add(micros(took), Ordering::Relaxed);
            c.count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The `index`-th channel's estimate, with what was measured since the last
    /// look taken in.
    pub(crate) fn update(&self, index: usize) -> Estimate {
        let Some(c) = self.0.get(index) else {
            return Estimate::default();
        };
        let mut e = self.estimate(index);
        let count = c.count.swap(0, Ordering::Relaxed);
        let total = c.total_us.swap(0, Ordering::Relaxed);
        let wait = c.wait_us.swap(0, Ordering::Relaxed);
        e.observe(count, total, wait);
        c.estimate
            .store(e.service().as_secs_f64().to_bits(), Ordering::Relaxed);
        e
    }

    /// The `index`-th channel's estimate as last taken in.
    fn estimate(&self, index: usize) -> Estimate {
        let secs = self
            .0
            .get(index)
            .map_or(0.0, |c| f64::from_bits(c.estimate.load(Ordering::Relaxed)));
        Estimate::from_service(Duration::from_secs_f64(secs))
    }
}

/// Jobs per second a rate lets through.
fn per_second(rate: Rate) -> f64 {
    1e6 / (rate.interval_us.max(1) as f64 * rate.cost.max(1) as f64)
}

/// What the lanes' prefetch is worked out from: the rules in force and the lines'
/// look-ahead (the store), the paced channels and `lanes.prefetch` (the topology),
/// and what the worker measured (the clocks).
#[derive(Debug, Clone)]
pub(crate) struct Prefetch {
    /// The store the worker decides with.
    pub store: Arc<QuotaStore>,
    /// The worker's topology.
    pub topology: Topology,
    /// The worker's clocks (kept across sessions).
    pub clocks: Arc<LaneClocks>,
}

impl Prefetch {
    /// The bounds of every lane's prefetch.
    pub(crate) fn bounds(&self) -> Bounds {
        Bounds::under(self.topology.lanes.prefetch.ceiling())
    }

    /// The deliveries to hold now from each lane queue of the paced channel
    /// `channel`, given `estimate`: besides the time each takes outside its wait
    /// for the rate, the line's look-ahead (the slots it takes ahead of now are
    /// held by deliveries waiting for them) and the ack's hold.
    pub(crate) fn target(&self, channel: &str, estimate: Estimate) -> u16 {
        let rules = self.store.rules();
        let rate = rules.channel(channel).and_then(|c| c.rate).map(per_second);
        let ahead = self
            .store
            .pacing()
            .lanes(channel)
            .map_or(Duration::ZERO, |l| l.ahead());
        prefetch::target(rate, estimate.service(), HOLD + ahead, self.bounds())
    }

    /// The deliveries to hold now from the lane queues of the `index`-th paced
    /// channel, as last estimated.
    pub(crate) fn now(&self, index: usize) -> u16 {
        let channel = &self.topology.laned[index];
        self.target(channel, self.clocks.estimate(index))
    }

    /// The deliveries a session starts with from the lane queues of the `index`-th
    /// paced channel.
    pub(crate) fn start(&self, index: usize) -> u16 {
        let channel = &self.topology.laned[index];
        let n = self.target(channel, self.clocks.estimate(index));
        crate::metrics::lane_prefetch(channel, n);
        n
    }
}
