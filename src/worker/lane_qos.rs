//! How many deliveries the worker holds from each lane queue, adjusted as it runs:
//! what its channel's rate needs for the time a lane job takes besides its wait for
//! the rate ([`crate::quota::prefetch`], the arithmetic), within a floor and
//! `lanes.prefetch`.
//!
//! The worker measures as it goes ([`LaneClocks`]): for each paced channel, the time
//! its lane deliveries take from delivery to settle, and their waits for the rate.
//! Every [`TICK`], a session's tuner takes those sums into a moving estimate (kept
//! across sessions: a reconnect starts from what the last session learned) and,
//! when the number it would hold changed enough, sets it with `basic.qos` on the
//! lane channel. RabbitMQ applies a consumer's prefetch when the consumer starts,
//! so each of the channel's lane queues gets a new consumer under the new value
//! before the old one is cancelled: the old one's deliveries are still read to the
//! end and settled on the same channel, and the queue is never without a consumer.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{BoxStream, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::Channel;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::Worker;
use crate::amqp::acks::HOLD;
use crate::amqp::{BrokerError, Topology};
use crate::quota::lanes::Priority;
use crate::quota::policy::Rate;
use crate::quota::prefetch::{self, Bounds, Estimate};

/// How often a session's tuner looks.
pub(crate) const TICK: Duration = Duration::from_millis(500);

/// One lane delivery, with the index of its channel among the laned ones.
pub(crate) type LaneItem = ((usize, Priority), Result<Delivery, lapin::Error>);
/// One lane consumer's deliveries.
pub(crate) type LaneStream = BoxStream<'static, LaneItem>;

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
    fn update(&self, index: usize) -> Estimate {
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

impl Worker {
    /// The deliveries to hold now from each lane queue of the `index`-th paced
    /// channel, `channel`, given `estimate`: besides the time each takes outside its
    /// wait for the rate, the line's look-ahead (the slots it takes ahead of now are
    /// held by deliveries waiting for them) and the ack's hold.
    fn lane_target(&self, channel: &str, estimate: Estimate) -> u16 {
        let rules = self.store.rules();
        let rate = rules.channel(channel).and_then(|c| c.rate).map(per_second);
        let bounds = Bounds::under(self.topology.lanes.prefetch.ceiling());
        let beside = HOLD + self.store.lane_ahead(channel);
        prefetch::target(rate, estimate.service(), beside, bounds)
    }

    /// The deliveries a session starts with from the lane queues of the `index`-th
    /// paced channel.
    pub(crate) fn lane_start(&self, index: usize) -> u16 {
        let channel = &self.topology.laned[index];
        let n = self.lane_target(channel, self.lane_clocks.estimate(index));
        crate::metrics::lane_prefetch(channel, n);
        n
    }
}

/// A lane consumer on `queue` under `prefetch`, its deliveries marked with the
/// channel's index and the lane.
pub(crate) async fn consume(
    channel: &Channel,
    queue: &str,
    tag: &str,
    prefetch: u16,
    mark: (usize, Priority),
) -> Result<LaneStream, BrokerError> {
    channel
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let consumer = channel
        .basic_consume(
            queue.into(),
            tag.into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok(consumer.map(move |d| (mark, d)).boxed())
}

/// One session's lane consumers as the tuner keeps them: each lane queue's current
/// consumer tag (read at shutdown to cancel them), and what each channel holds.
#[derive(Debug)]
pub(crate) struct Tuner {
    pub channel: Channel,
    /// (queue, channel index, lane, current tag), one per lane queue.
    pub lanes: Vec<(String, usize, Priority, String)>,
    /// The current tags, shared with the session for its shutdown.
    pub tags: Arc<Mutex<Vec<String>>>,
    /// Deliveries held per lane queue, by channel index.
    pub held: Vec<u16>,
    /// The session's tag, the prefix of each new consumer's.
    pub tag: String,
}

impl Tuner {
    /// Every [`TICK`] until the session drops it: take in the clocks, and move each
    /// channel's lane consumers to a new prefetch when [`prefetch::retune`] says so.
    /// New consumers' deliveries go to `streams`. A broker call that fails ends the
    /// tuning (the session sees the broken connection on its own).
    pub(crate) async fn run(
        mut self,
        worker: Arc<Worker>,
        streams: mpsc::UnboundedSender<LaneStream>,
    ) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut generation = 0u64;
        loop {
            tick.tick().await;
            generation += 1;
            for index in 0..self.held.len() {
                let name = &worker.topology.laned[index];
                let estimate = worker.lane_clocks.update(index);
                let target = worker.lane_target(name, estimate);
                let bounds = Bounds::under(worker.topology.lanes.prefetch.ceiling());
                let Some(n) = prefetch::retune(self.held[index], target, bounds) else {
                    continue;
                };
                debug!(
                    channel = %name,
                    from = self.held[index],
                    to = n,
                    service_ms = estimate.service().as_secs_f64() * 1e3,
                    "lane prefetch"
                );
                if let Err(e) = self.move_to(index, n, generation, &streams).await {
                    warn!(error = %e, "lane prefetch: the broker refused a change; kept as it was");
                    return;
                }
                self.held[index] = n;
                crate::metrics::lane_prefetch(name, n);
            }
        }
    }

    /// Every lane queue of the `index`-th channel to a new consumer under `n`.
    async fn move_to(
        &mut self,
        index: usize,
        n: u16,
        generation: u64,
        streams: &mpsc::UnboundedSender<LaneStream>,
    ) -> Result<(), BrokerError> {
        for (i, (queue, c, lane, tag)) in self.lanes.iter_mut().enumerate() {
            if *c != index {
                continue;
            }
            let new_tag = format!("{}-{queue}-{generation}", self.tag);
            // known to the shutdown before it exists (a cancel of a tag the broker
            // never saw is answered all the same)
            self.tags.lock().unwrap_or_else(|e| e.into_inner())[i] = new_tag.clone();
            let stream = consume(&self.channel, queue, &new_tag, n, (*c, *lane)).await?;
            if streams.send(stream).is_err() {
                return Ok(());
            }
            let old = std::mem::replace(tag, new_tag);
            self.channel
                .basic_cancel(old.as_str().into(), BasicCancelOptions::default())
                .await?;
        }
        Ok(())
    }
}
