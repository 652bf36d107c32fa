//! A broker session's lane consumers ([`LaneConsumers`]): one channel, a consumer
//! per lane queue, each under the prefetch its channel's rate needs
//! ([`super::clocks::Prefetch`]), every delivery with its channel's index and its
//! lane; and their tuner ([`Tuner`]), which moves them to another prefetch as the
//! worker runs.
//!
//! RabbitMQ applies a consumer's prefetch when the consumer starts, so each of a
//! channel's lane queues gets a new consumer under the new value before the old
//! one is cancelled: the old one's deliveries are still read to the end and
//! settled on the same channel, and the queue is never without a consumer.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::stream::{self, BoxStream, StreamExt};
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::clocks::Prefetch;
use super::prefetch;
use super::share::Priority;
use crate::amqp::BrokerError;

/// How often a session's tuner looks.
pub(crate) const TICK: Duration = Duration::from_millis(500);

/// One lane delivery, with the index of its channel among the laned ones.
pub(crate) type LaneItem = ((usize, Priority), Result<Delivery, lapin::Error>);
/// One lane consumer's deliveries.
pub(crate) type LaneStream = BoxStream<'static, LaneItem>;

/// A broker session's lane consumers.
pub(crate) struct LaneConsumers {
    /// The channel they consume on (acks go back on it).
    pub channel: Channel,
    /// Every lane's deliveries, merged.
    pub deliveries: stream::SelectAll<LaneStream>,
    /// The current consumer tags, to cancel them at shutdown.
    pub tags: Arc<Mutex<Vec<String>>>,
    /// What moves them to another prefetch as the worker runs.
    pub tuner: Tuner,
}

impl LaneConsumers {
    /// Consume every lane queue of the topology of `prefetch` (none: `None`), each
    /// under the prefetch it says.
    pub(crate) async fn start(
        prefetch: Prefetch,
        conn: &Connection,
        tag: &str,
    ) -> Result<Option<LaneConsumers>, BrokerError> {
        let topology = &prefetch.topology;
        if topology.laned.is_empty() {
            return Ok(None);
        }
        let channel = conn.create_channel().await?;
        let held: Vec<u16> = (0..topology.laned.len())
            .map(|i| prefetch.start(i))
            .collect();
        let mut deliveries = stream::SelectAll::new();
        let mut lanes = Vec::new();
        for (queue, name, lane) in topology.lane_queues() {
            let index = topology.laned.iter().position(|c| c == name).unwrap_or(0);
            let lane_tag = format!("{tag}-{queue}");
            let stream = consume(&channel, &queue, &lane_tag, held[index], (index, lane)).await?;
            deliveries.push(stream);
            lanes.push((queue, index, lane, lane_tag));
        }
        let tags = Arc::new(Mutex::new(lanes.iter().map(|l| l.3.clone()).collect()));
        let tuner = Tuner {
            channel: channel.clone(),
            lanes,
            tags: tags.clone(),
            held,
            tag: tag.to_string(),
            prefetch,
        };
        Ok(Some(LaneConsumers {
            channel,
            deliveries,
            tags,
            tuner,
        }))
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
    /// What the prefetch is worked out from.
    pub prefetch: Prefetch,
}

impl Tuner {
    /// Every [`TICK`] until the session drops it: take in the clocks, and move each
    /// channel's lane consumers to a new prefetch when [`prefetch::retune`] says so.
    /// New consumers' deliveries go to `streams`. A broker call that fails ends the
    /// tuning (the session sees the broken connection on its own).
    pub(crate) async fn run(mut self, streams: mpsc::UnboundedSender<LaneStream>) {
        let prefetch = self.prefetch.clone();
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut generation = 0u64;
        loop {
            tick.tick().await;
            generation += 1;
            for index in 0..self.held.len() {
                let name = &prefetch.topology.laned[index];
                let estimate = prefetch.clocks.update(index);
                let target = prefetch.target(name, estimate);
                let bounds = prefetch.bounds();
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
