//! The tenants' queues of a lane (fair shares, [`super::fair`]): a job of a tenant
//! is parked in its tenant's queue of its lane, registered in its channel's set in
//! Redis ([`crate::redis::fair`]) before the publish; every worker consumes every
//! registered queue ([`Watch`]), so that each worker's line holds jobs of every
//! tenant that has some waiting, and the lane's schedule in `lua/lanes.lua` gives
//! each slot to the tenant whose turn it is.
//!
//! A tenant's queue is a durable classic queue in lazy mode (one queue process;
//! at 10,000 tenants a quorum queue each would be 10,000 Raft groups, and
//! RabbitMQ 3.10 deletes a quorum queue only unconditionally, without
//! `if-empty`), its messages persistent, dead-lettered as the lane queues are. A worker lets a queue go
//! when it delivered nothing for [`IDLE`] and none of its deliveries is held: it
//! cancels its consumer, then deletes the queue only if it is empty and no
//! worker consumes it (`if-empty`, `if-unused`: a worker holding one of its
//! deliveries still consumes it), and then forgets its entry only if no park
//! registered it again meanwhile. A park to a queue deleted since it declared it
//! comes back unroutable (the publish is mandatory), and the park declares and
//! registers it again. Nothing expires on its own: a queue that holds jobs stays
//! until they are sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection};
use tokio::sync::mpsc;
use tracing::{debug, info};

use super::clocks::Prefetch;
use super::consume::LaneStream;
use super::fair;
use super::prefetch;
use super::share::Priority;
use crate::amqp::Topology;
use crate::redis::fair::{self as set, QueueSet};
use crate::redis::StoreError;
use crate::store::QuotaStore;

/// A queue that delivered nothing for this long, with none of its deliveries held,
/// is let go by the worker (and deleted by the last one when empty).
pub const IDLE: Duration = Duration::from_secs(30);

/// A park registers its tenant's queue again after this long (a worker that let
/// the queue go then sees a new version and consumes it again).
const REGISTER_EVERY: Duration = Duration::from_secs(1);

/// How often a worker reads its channels' sets of tenant queues (a new tenant's
/// queue is consumed within this and a round trip).
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// How often a worker looks for queues to let go, and at those it let go.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The fewest deliveries a worker holds from one tenant's queue.
const MIN_PREFETCH: u16 = 16;

/// The arguments of every tenant's queue.
pub(crate) fn queue_args(topology: &Topology) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    // its messages go to disk as they come (they are persistent anyway): parking
    // into tenant queues then takes less of the broker (docs/notes/fair-shares.md)
    args.insert("x-queue-mode".into(), AMQPValue::LongString("lazy".into()));
    let dlx = topology.amqp.dead_exchange.as_str();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(dlx.into()),
    );
    args
}

/// One tenant queue's part of its lane's prefetch `target` among the `in_lane`
/// tenant queues of that lane a worker consumes: at least [`MIN_PREFETCH`] (at
/// most the target), so a lane of many tenants still keeps each busy.
fn share_of(target: u16, in_lane: usize) -> u16 {
    let target = target.max(1);
    let share = usize::from(target) / in_lane.max(1);
    (share as u16).clamp(MIN_PREFETCH.min(target), target)
}

/// Declare a tenant's queue on `channel` (idempotent); its ready messages and
/// consumers.
pub(crate) async fn declare(
    channel: &Channel,
    topology: &Topology,
    queue: &str,
) -> Result<(u32, u32), lapin::Error> {
    let options = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let q = channel
        .queue_declare(queue.into(), options, queue_args(topology))
        .await?;
    Ok((q.message_count(), q.consumer_count()))
}

/// The deliveries a worker holds from one tenant's queue.
#[derive(Debug, Default)]
struct Held {
    in_flight: u32,
    last: Option<Instant>,
}

/// A worker's tenant queues: which it declared and registered lately (for its
/// parks), and the deliveries it holds from each (for its consumers).
#[derive(Debug, Default)]
pub(crate) struct TenantQueues {
    set: QueueSet,
    ready: Mutex<HashMap<String, Instant>>,
    held: Mutex<HashMap<String, Held>>,
}

/// A tenant's queue of a lane of a channel, as registered in the channel's set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TenantLane<'a> {
    pub(crate) channel: &'a str,
    pub(crate) lane: Priority,
    pub(crate) tenant: &'a str,
}

/// A tenant queue found in its channel's set: its name, its entry in the set, and
/// the registration's number.
struct Registered<'a> {
    queue: &'a str,
    entry: &'a str,
    seq: u64,
}

impl<'a> Registered<'a> {
    fn of(queue: &'a str, entry: &'a str, seq: u64) -> Registered<'a> {
        Registered { queue, entry, seq }
    }
}

impl TenantQueues {
    /// Whether `queue` was registered and declared by this worker within
    /// [`REGISTER_EVERY`] (a park then publishes to it at once).
    pub(crate) fn fresh(&self, queue: &str) -> bool {
        let ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        ready
            .get(queue)
            .is_some_and(|t| t.elapsed() < REGISTER_EVERY)
    }

    /// Register tenant `tenant`'s queue of `lane` of `channel` in the channel's set
    /// (before its first park's publish: a park never leaves a job in a queue no
    /// worker knows).
    pub(crate) async fn register(
        &self,
        store: &QuotaStore,
        of: TenantLane<'_>,
    ) -> Result<(), StoreError> {
        let TenantLane {
            channel,
            lane,
            tenant,
        } = of;
        let key = store.keys().fair_queues(channel);
        let entry = fair::entry(lane, tenant);
        self.set.register(&store.connection(), &key, &entry).await?;
        Ok(())
    }

    /// `queue` registered and declared now.
    pub(crate) fn readied(&self, queue: &str) {
        let mut ready = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        if ready.len() > 100_000 {
            ready.retain(|_, t| t.elapsed() < REGISTER_EVERY);
        }
        ready.insert(queue.to_string(), Instant::now());
    }

    /// `queue` was found gone (a park came back unroutable): the next park
    /// declares and registers it again.
    pub(crate) fn gone(&self, queue: &str) {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(queue);
    }

    /// A delivery from `queue` came.
    fn delivered(&self, queue: &str) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let h = held.entry(queue.to_string()).or_default();
        h.in_flight += 1;
        h.last = Some(Instant::now());
    }

    /// A delivery of a lane was settled (acked or handed back): if it came from a
    /// tenant's queue, it is no longer held.
    pub(crate) fn settled(&self, delivery: &Delivery) {
        if !delivery.exchange.as_str().is_empty() {
            return;
        }
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = held.get_mut(delivery.routing_key.as_str()) {
            h.in_flight = h.in_flight.saturating_sub(1);
        }
    }

    /// Whether this worker may let `queue` go: nothing delivered for [`IDLE`]
    /// (since `since`, when consumed) and none of its deliveries held.
    fn idle(&self, queue: &str, since: Instant) -> bool {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        match held.get(queue) {
            None => since.elapsed() >= IDLE,
            Some(h) => h.in_flight == 0 && h.last.unwrap_or(since).max(since).elapsed() >= IDLE,
        }
    }

    /// Forget what this worker held of `queue` (let go).
    fn drop_held(&self, queue: &str) {
        self.held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(queue);
    }
}

/// One tenant's queue a session consumes.
#[derive(Debug)]
struct Consumed {
    tag: String,
    /// The number of its entry, as last read.
    seq: u64,
    entry: (usize, String),
    lane: Priority,
    /// The prefetch it was started under.
    prefetch: u16,
    since: Instant,
}

/// A session's consumers of the tenants' queues, and what it let go.
pub(crate) struct Watch {
    /// The store (the sets' keys and connection, the rules).
    pub store: Arc<QuotaStore>,
    /// The worker's topology.
    pub topology: Topology,
    /// The worker's tenant queues.
    pub queues: Arc<TenantQueues>,
    /// The lanes' channel (the consumers are on it, and their acks).
    pub channel: Channel,
    /// The connection (a refused delete closes the channel it was asked on).
    pub conn: Arc<Connection>,
    /// The session's consumer tags (cancelled at its shutdown).
    pub tags: Arc<Mutex<Vec<String>>>,
    /// The session's tag.
    pub tag: String,
    /// What the lanes' prefetch is worked out from.
    pub prefetch: Prefetch,
}

/// What a session's [`Watch`] keeps as it runs.
#[derive(Default)]
struct State {
    consumed: HashMap<String, Consumed>,
    /// Queues let go, with the number of their entry then.
    let_go: HashMap<String, (u64, usize, String)>,
    versions: Vec<u64>,
    started: u64,
}

impl Watch {
    /// Every [`LOOK_EVERY`] until the session drops it: consume the queues newly
    /// registered; every tick of the lanes' tuner ([`super::consume::TICK`]) move
    /// each consumer's prefetch with its share; every [`SWEEP_EVERY`] let idle
    /// ones go.
    pub(crate) async fn run(self, streams: mpsc::UnboundedSender<LaneStream>) {
        let mut state = State {
            versions: vec![u64::MAX; self.topology.laned.len()],
            ..State::default()
        };
        let mut tick = tokio::time::interval(LOOK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut last_sweep, mut last_tune) = (Instant::now(), Instant::now());
        loop {
            tick.tick().await;
            if let Err(e) = self.look(&mut state, &streams).await {
                debug!(error = %e, "tenant queues: a look failed; trying again");
                continue;
            }
            if last_tune.elapsed() >= super::consume::TICK {
                last_tune = Instant::now();
                if let Err(e) = self.retune(&mut state, &streams).await {
                    debug!(error = %e, "tenant queues: a retune failed; trying again");
                }
            }
            if last_sweep.elapsed() >= SWEEP_EVERY {
                last_sweep = Instant::now();
                if let Err(e) = self.sweep(&mut state, &streams).await {
                    debug!(error = %e, "tenant queues: a sweep failed; trying again");
                }
            }
        }
    }

    /// Read each channel's set when its version moved; consume what is new.
    async fn look(
        &self,
        state: &mut State,
        streams: &mpsc::UnboundedSender<LaneStream>,
    ) -> Result<(), WatchError> {
        let conn = self.store.connection();
        for index in 0..self.topology.laned.len() {
            let channel = &self.topology.laned[index];
            let key = self.store.keys().fair_queues(channel);
            let v = set::version(&conn, &key).await?;
            if v == state.versions[index] {
                continue;
            }
            for (entry, seq) in set::entries(&conn, &key).await? {
                let Some((lane, tenant)) = fair::parse_entry(&entry) else {
                    continue;
                };
                let queue = self.topology.tenant_queue(channel, lane, tenant);
                if let Some(c) = state.consumed.get_mut(&queue) {
                    c.seq = seq;
                    continue;
                }
                if state.let_go.get(&queue).is_some_and(|(s, ..)| *s >= seq) {
                    continue;
                }
                state.let_go.remove(&queue);
                self.consume(
                    state,
                    (index, lane),
                    Registered::of(&queue, &entry, seq),
                    streams,
                )
                .await?;
            }
            state.versions[index] = v;
        }
        Ok(())
    }

    /// Consume `queue` (declared first: a registration may have come before its
    /// queue).
    async fn consume(
        &self,
        state: &mut State,
        (index, lane): (usize, Priority),
        registered: Registered<'_>,
        streams: &mpsc::UnboundedSender<LaneStream>,
    ) -> Result<(), WatchError> {
        let Registered { queue, entry, seq } = registered;
        declare(&self.channel, &self.topology, queue).await?;
        let n = self.prefetch_for(state, (index, lane), 1);
        let tag = self.start(state, (index, lane), queue, n, streams).await?;
        let consumed = Consumed {
            tag,
            seq,
            entry: (index, entry.to_string()),
            lane,
            prefetch: n,
            since: Instant::now(),
        };
        state.consumed.insert(queue.to_string(), consumed);
        crate::metrics::tenant_queues(state.consumed.len());
        Ok(())
    }

    /// The deliveries to hold from one tenant queue of `lane` of the `index`-th
    /// channel: the lane's target shared among its tenant queues consumed (with
    /// `more` to come).
    fn prefetch_for(&self, state: &State, (index, lane): (usize, Priority), more: usize) -> u16 {
        let in_lane = state
            .consumed
            .values()
            .filter(|c| c.entry.0 == index && c.lane == lane)
            .count()
            + more;
        share_of(self.prefetch.now(index), in_lane)
    }

    /// A new consumer on `queue` under prefetch `n`, its deliveries to `streams`;
    /// its tag.
    async fn start(
        &self,
        state: &mut State,
        (index, lane): (usize, Priority),
        queue: &str,
        n: u16,
        streams: &mpsc::UnboundedSender<LaneStream>,
    ) -> Result<String, WatchError> {
        state.started += 1;
        let tag = format!("{}-{queue}-{}", self.tag, state.started);
        self.tags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tag.clone());
        self.channel
            .basic_qos(n, BasicQosOptions::default())
            .await?;
        let consumer = self
            .channel
            .basic_consume(
                queue.into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let (queues, name) = (self.queues.clone(), queue.to_string());
        let stream = consumer.map(move |d| {
            if d.is_ok() {
                queues.delivered(&name);
            }
            ((index, lane), d)
        });
        let _ = streams.send(stream.boxed());
        debug!(%queue, prefetch = n, "consuming a tenant's queue");
        Ok(tag)
    }

    /// Move the consumers whose share of their lane's prefetch moved as
    /// [`prefetch::retune`] says a lane queue's must (grown by a quarter, halved)
    /// to a new consumer (the new one first, then the old one cancelled: its
    /// deliveries are still settled on the same channel).
    async fn retune(
        &self,
        state: &mut State,
        streams: &mpsc::UnboundedSender<LaneStream>,
    ) -> Result<(), WatchError> {
        let mut in_lane: HashMap<(usize, Priority), usize> = HashMap::new();
        for c in state.consumed.values() {
            *in_lane.entry((c.entry.0, c.lane)).or_default() += 1;
        }
        let lanes = self.prefetch.bounds();
        let bounds = prefetch::Bounds {
            floor: MIN_PREFETCH.min(lanes.ceiling),
            ceiling: lanes.ceiling,
        };
        let mut targets: HashMap<usize, u16> = HashMap::new();
        let mut moves = Vec::new();
        for (queue, c) in &state.consumed {
            let (index, lane) = (c.entry.0, c.lane);
            let target = *targets
                .entry(index)
                .or_insert_with(|| self.prefetch.now(index));
            let n = share_of(target, in_lane[&(index, lane)]);
            if prefetch::retune(c.prefetch, n, bounds).is_some() {
                moves.push((queue.clone(), index, lane, n));
            }
        }
        for (queue, index, lane, n) in moves {
            let tag = self.start(state, (index, lane), &queue, n, streams).await?;
            if let Some(c) = state.consumed.get_mut(&queue) {
                let old = std::mem::replace(&mut c.tag, tag);
                c.prefetch = n;
                self.cancel(&old).await?;
            }
        }
        Ok(())
    }

    /// Cancel the consumer `tag`.
    async fn cancel(&self, tag: &str) -> Result<(), WatchError> {
        self.channel
            .basic_cancel(tag.into(), BasicCancelOptions::default())
            .await?;
        self.tags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|t| t != tag);
        Ok(())
    }

    /// Let idle queues go (deleted when empty and no worker consumes them), and
    /// look again at those let go: one that holds jobs again is consumed again.
    async fn sweep(
        &self,
        state: &mut State,
        streams: &mpsc::UnboundedSender<LaneStream>,
    ) -> Result<(), WatchError> {
        let idle: Vec<String> = state
            .consumed
            .iter()
            .filter(|(q, c)| self.queues.idle(q, c.since))
            .map(|(q, _)| q.clone())
            .collect();
        for queue in idle {
            let Some(c) = state.consumed.remove(&queue) else {
                continue;
            };
            self.cancel(&c.tag).await?;
            self.queues.drop_held(&queue);
            state.let_go.insert(queue, (c.seq, c.entry.0, c.entry.1));
        }
        crate::metrics::tenant_queues(state.consumed.len());
        let let_go: Vec<(String, (u64, usize, String))> = state
            .let_go
            .iter()
            .map(|(q, v)| (q.clone(), v.clone()))
            .collect();
        for (queue, (seq, index, entry)) in let_go {
            let (ready, consumers) = declare(&self.channel, &self.topology, &queue).await?;
            if ready > 0 && consumers == 0 {
                // jobs came back with no registration seen (or none consumes it)
                state.let_go.remove(&queue);
                let Some((lane, _)) = fair::parse_entry(&entry) else {
                    continue;
                };
                self.consume(
                    state,
                    (index, lane),
                    Registered::of(&queue, &entry, seq),
                    streams,
                )
                .await?;
                continue;
            }
            if ready == 0 && consumers == 0 && self.delete(&queue).await {
                let key = self.store.keys().fair_queues(&self.topology.laned[index]);
                let conn = self.store.connection();
                let forgotten = self.queues.set.forget(&conn, &key, (&entry, seq)).await?;
                info!(%queue, forgotten, "a tenant's queue went quiet: deleted");
                state.let_go.remove(&queue);
            }
        }
        Ok(())
    }

    /// Delete `queue` if it is empty and no worker consumes it, on a channel of its
    /// own (a refusal closes it); whether it was deleted.
    async fn delete(&self, queue: &str) -> bool {
        let Ok(ch) = self.conn.create_channel().await else {
            return false;
        };
        let options = QueueDeleteOptions {
            if_unused: true,
            if_empty: true,
            ..Default::default()
        };
        let deleted = ch.queue_delete(queue.into(), options).await;
        let _ = ch.close(200, "".into()).await;
        match deleted {
            Ok(_) => true,
            Err(e) => {
                debug!(%queue, error = %e, "a tenant's queue not deleted (in use or not empty)");
                false
            }
        }
    }
}

/// Why a look or a sweep failed (tried again at the next tick).
#[derive(Debug, thiserror::Error)]
enum WatchError {
    #[error("{0}")]
    Redis(#[from] StoreError),
    #[error("amqp: {0}")]
    Broker(#[from] lapin::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_queue_holds_its_share_of_the_lane_at_least_the_floor() {
        // (the lane's target, tenant queues in the lane, expected)
        let table = [
            (600, 1, 600),
            (600, 3, 200),
            (600, 64, MIN_PREFETCH),
            (600, 0, 600),
            (8, 3, 8),
            (0, 1, 1),
        ];
        for (target, n, want) in table {
            assert_eq!(share_of(target, n), want, "{target} among {n}");
        }
    }

    #[test]
    fn one_tenant_follows_its_lane_as_a_lane_queue_does() {
        // the lane's target grows by a quarter: the tenant's queue moves at once
        let b = prefetch::Bounds {
            floor: MIN_PREFETCH,
            ceiling: prefetch::AUTO_CEILING,
        };
        assert_eq!(prefetch::retune(400, share_of(500, 1), b), Some(500));
        assert_eq!(prefetch::retune(400, share_of(480, 1), b), None);
    }
}
