//! The topology: every exchange, queue and binding the worker needs, declared
//! idempotently at the start of each broker session (there is no setup step), and
//! deleted as a whole for a test's or a benchmark's namespace.

use lapin::options::{
    ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{Connection, ExchangeKind};

use super::ladder::Ladder;
use super::BrokerError;
use crate::config::{AmqpSettings, LaneSettings, QueueType, Settings};
use crate::lanes::share::Priority;

/// The dead-letter log's name ([`crate::admin::dead_log`] reads it): the dead-letter
/// queue's, then `.log`.
pub fn dead_log_name(dead_queue: &str) -> String {
    format!("{dead_queue}.log")
}

/// The dead-letter log's arguments: a stream that keeps a dead letter `max_age`
/// (`console.dead_log_max_age`).
pub fn dead_log_args(max_age: std::time::Duration) -> FieldTable {
    let mut args = FieldTable::default();
    let long = |s: &str| AMQPValue::LongString(LongString::from(s));
    args.insert("x-queue-type".into(), long("stream"));
    let age = format!("{}s", max_age.as_secs().max(1));
    args.insert("x-max-age".into(), long(&age));
    args
}

/// Every name of the topology, derived from the settings.
#[derive(Debug, Clone)]
pub struct Topology {
    /// The settings it comes from.
    pub amqp: AmqpSettings,
    /// The configured channels.
    pub channels: Vec<String>,
    /// Each delay level's queue, by level (a delayed job is published to one).
    delay_queues: Vec<String>,
    /// Where jobs that wait for their channel's rate wait.
    pub lanes: LaneSettings,
    /// The channels with lanes (the paced ones, as configured at start).
    pub laned: Vec<String>,
    /// The feedback exchange and queue (`feedback.exchange`, `feedback.queue`).
    pub feedback: (String, String),
    /// The dead-letter log, a stream bound to the dead-letter exchange
    /// ([`crate::admin::dead_log`]), while `console.dead_index` is not 0.
    pub dead_log: Option<String>,
    /// How long the dead-letter log keeps a dead letter (`console.dead_log_max_age`).
    pub dead_log_max_age: std::time::Duration,
}

/// Delete `queues` and `exchanges` (each on a fresh channel after a failure, since a
/// failed delete closes its channel); every one is tried, the first error returned.
pub async fn delete_all(
    conn: &Connection,
    queues: Vec<String>,
    exchanges: Vec<String>,
) -> Result<(), BrokerError> {
    let queues = queues.into_iter().map(|q| (q, true));
    let exchanges = exchanges.into_iter().map(|x| (x, false));
    let mut first = None;
    let mut ch = conn.create_channel().await?;
    for (name, is_queue) in queues.chain(exchanges) {
        let deleted = if is_queue {
            ch.queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                .await
                .map(|_| ())
        } else {
            ch.exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                .await
        };
        if let Err(e) = deleted {
            first.get_or_insert(e);
            ch = conn.create_channel().await?;
        }
    }
    let _ = ch.close(200, "".into()).await;
    match first {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

fn long(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

impl Topology {
    /// The topology `settings` names.
    pub fn from_settings(settings: &Settings) -> Topology {
        let ladder = Ladder {
            prefix: settings.amqp.delay_prefix.clone(),
            levels: settings.amqp.delay_levels,
        };
        Topology {
            amqp: settings.amqp.clone(),
            channels: settings.channels.keys().cloned().collect(),
            delay_queues: (0..ladder.levels).map(|n| ladder.queue(n)).collect(),
            lanes: settings.lanes.clone(),
            laned: settings
                .channels
                .keys()
                .filter(|c| settings.rate(c).is_some())
                .cloned()
                .collect(),
            feedback: (
                settings.feedback.exchange.clone(),
                settings.feedback.queue.clone(),
            ),
            dead_log: (settings.console.dead_index > 0)
                .then(|| dead_log_name(&settings.amqp.dead_queue)),
            dead_log_max_age: settings.console.dead_log_max_age.0,
        }
    }

    /// The queue of `channel`'s `lane`: `<lanes.queue_prefix><channel>.<lane>`.
    pub fn lane_queue(&self, channel: &str, lane: Priority) -> String {
        format!("{}{}", self.lanes.queue_prefix, lane.routing_key(channel))
    }

    /// The queue of `tenant`'s jobs in `channel`'s `lane` (fair shares):
    /// `<lanes.queue_prefix><channel>.<lane>.t.<tenant>`
    /// ([`crate::lanes::fair::queue_suffix`]).
    pub fn tenant_queue(&self, channel: &str, lane: Priority, tenant: &str) -> String {
        let suffix = crate::lanes::fair::queue_suffix(tenant);
        format!("{}{suffix}", self.lane_queue(channel, lane))
    }

    /// Whether `channel` has lane queues.
    pub fn has_lanes(&self, channel: &str) -> bool {
        self.laned.iter().any(|c| c == channel)
    }

    /// Every lane queue with its channel and lane, channel by channel, urgent first.
    pub fn lane_queues(&self) -> impl Iterator<Item = (String, &str, Priority)> + '_ {
        self.laned
            .iter()
            .flat_map(move |c| Priority::ALL.map(|p| (self.lane_queue(c, p), c.as_str(), p)))
    }

    /// The queue a job delayed by `seconds` is published to ([`Ladder::entry`],
    /// named once rather than per delayed job).
    pub(crate) fn delay_entry(&self, seconds: u64) -> &str {
        let level = Ladder::entry_level(seconds, self.amqp.delay_levels);
        &self.delay_queues[level as usize]
    }

    /// The delay ladder.
    pub fn ladder(&self) -> Ladder {
        Ladder {
            prefix: self.amqp.delay_prefix.clone(),
            levels: self.amqp.delay_levels,
        }
    }

    /// The dispatch queue of `channel`.
    pub fn dispatch_queue(&self, channel: &str) -> String {
        format!("{}{channel}", self.amqp.dispatch_queue_prefix)
    }

    /// Every queue, in the order an operator reads them: jobs, lanes, delays,
    /// dispatch, dead, feedback.
    pub fn queues(&self) -> Vec<String> {
        let ladder = self.ladder();
        let mut q = vec![self.amqp.jobs_queue.clone()];
        q.extend(self.lane_queues().map(|(name, ..)| name));
        q.extend((0..ladder.levels).map(|n| ladder.queue(n)));
        q.extend(self.channels.iter().map(|c| self.dispatch_queue(c)));
        q.push(self.amqp.dead_queue.clone());
        q.push(self.feedback.1.clone());
        q
    }

    /// Every exchange: jobs, dispatch, dead, the ladder's, then feedback.
    pub fn exchanges(&self) -> Vec<String> {
        let ladder = self.ladder();
        let mut x = vec![
            self.amqp.jobs_exchange.clone(),
            self.amqp.dispatch_exchange.clone(),
            self.amqp.dead_exchange.clone(),
            self.lanes.exchange.clone(),
        ];
        x.extend((0..ladder.levels).map(|n| ladder.exchange(n)));
        x.push(self.feedback.0.clone());
        x
    }

    /// Delete every queue and exchange of the topology, and the messages in them: the
    /// tear-down of a namespace made for a test or a benchmark. What does not exist is
    /// skipped; a failed delete does not stop the others (each gets its own channel
    /// after an error), and the first error is returned.
    pub async fn delete(&self, conn: &Connection) -> Result<(), BrokerError> {
        let mut queues = self.queues();
        queues.extend(self.dead_log.clone());
        delete_all(conn, queues, self.exchanges()).await
    }

    fn queue_args(&self, dead_letter_to: Option<&str>) -> FieldTable {
        let mut args = FieldTable::default();
        if self.amqp.queue_type == QueueType::Quorum {
            args.insert("x-queue-type".into(), long("quorum"));
        }
        if let Some(dlx) = dead_letter_to {
            args.insert("x-dead-letter-exchange".into(), long(dlx));
            if self.amqp.queue_type == QueueType::Quorum {
                args.insert("x-dead-letter-strategy".into(), long("at-least-once"));
                args.insert("x-overflow".into(), long("reject-publish"));
            }
        }
        args
    }

    /// Declare every exchange, queue and binding. Idempotent. Any failure is a
    /// [`BrokerError::Declare`] naming the step: fatal when the broker refused it (a
    /// queue that exists with other arguments), transient otherwise (the connection
    /// closed in the middle).
    ///
    /// The steps go out at once, in order, on one channel, and their answers are
    /// awaited together: the broker takes a channel's methods one after another, so an
    /// exchange is there before the binding that names it, and the whole topology
    /// costs about one round trip instead of one a step (about ninety with the default
    /// ladder), which is drain lost at every reconnect. The first step to fail is the
    /// one reported: the broker closes the channel on it, and the steps after it fail
    /// for that reason only.
    pub async fn declare(&self, conn: &Connection) -> Result<(), BrokerError> {
        // the dead letters' exchange and queue first, so that every queue after them
        // has where to dead-letter to even if a later step is refused
        self.declare_dead_queue(conn).await?;
        let mut steps = Steps::open(conn, "a channel for the topology").await?;
        self.declare_jobs_and_dispatch(&mut steps);
        self.declare_lanes(&mut steps);
        self.declare_feedback(&mut steps);
        self.declare_ladder(&mut steps);
        steps.run().await?;
        self.declare_dead_log(conn).await
    }

    /// The dead-letter queue's arguments: bounded by `amqp.dead_ttl` and
    /// `amqp.dead_max_length` when `bounded`.
    fn dead_args(&self, bounded: bool) -> FieldTable {
        let mut args = self.limited(self.queue_args(None), i32::MAX as u32);
        let a = &self.amqp;
        if bounded && !a.dead_ttl.0.is_zero() {
            let ms = a.dead_ttl.0.as_millis().min(i32::MAX as u128) as i64;
            args.insert("x-message-ttl".into(), AMQPValue::LongLongInt(ms));
        }
        if bounded && a.dead_max_length > 0 {
            let n = a.dead_max_length as i64;
            args.insert("x-max-length".into(), AMQPValue::LongLongInt(n));
        }
        args
    }

    /// The dead-letter queue, bound, on a channel of its own, with its bounds. A
    /// queue declared before without them (or with others) refuses the arguments
    /// (the broker compares them at each declaration): it is then declared as it
    /// was, and the worker says at start that its bound is not the configured one
    /// (a broker policy gives it one: docs/guide/operating.md).
    async fn declare_dead_queue(&self, conn: &Connection) -> Result<(), BrokerError> {
        let a = &self.amqp;
        let run = |bounded: bool| async move {
            let mut steps = Steps::open(conn, "a channel for the dead-letter queue").await?;
            let fanout = ExchangeKind::Fanout;
            steps.exchange(a.dead_exchange.clone(), fanout, FieldTable::default());
            steps.queue(a.dead_queue.clone(), self.dead_args(bounded));
            let bind = FieldTable::default();
            steps.bind(&a.dead_queue, &a.dead_exchange, String::new(), bind);
            steps.run().await
        };
        match run(true).await {
            Err(e) if e.is_fatal() => {
                run(false).await?;
                tracing::warn!(
                    queue = %a.dead_queue,
                    refused = %e,
                    "the dead-letter queue exists without the bounds of amqp.dead_ttl and \
                     amqp.dead_max_length (declared before them, or with others): it keeps its \
                     own; bound it with a broker policy (docs/guide/operating.md, \
                     \"Retention\"), or delete it once empty so the worker declares it bounded"
                );
                Ok(())
            }
            done => done,
        }
    }

    /// The dead-letter log ([`crate::admin::dead_log`]), after the rest, on a
    /// channel of its own: a broker without streams (before RabbitMQ 3.9, or its
    /// `stream_queue` feature flag off) refuses it, and the worker goes on without
    /// it, saying so (the console's dead-letter pages then show nothing new).
    async fn declare_dead_log(&self, conn: &Connection) -> Result<(), BrokerError> {
        let Some(log) = &self.dead_log else {
            return Ok(());
        };
        let mut steps = Steps::open(conn, "a channel for the dead-letter log").await?;
        steps.queue(log.clone(), dead_log_args(self.dead_log_max_age));
        let dead_exchange = &self.amqp.dead_exchange;
        steps.bind(log, dead_exchange, String::new(), FieldTable::default());
        match steps.run().await {
            Err(e) if e.is_fatal() => {
                tracing::warn!(error = %e, "no dead-letter log: the console's dead-letter pages show nothing new (a broker with streams, RabbitMQ 3.9 or later with the stream_queue feature flag, has one; console.dead_index = 0 asks for none)");
                Ok(())
            }
            done => done,
        }
    }

    /// Quorum queues count deliveries, and RabbitMQ 4 drops a message after 20
    /// unless told otherwise: every queue a consumer reads gets an explicit limit.
    fn limited(&self, mut args: FieldTable, limit: u32) -> FieldTable {
        if self.amqp.queue_type == QueueType::Quorum {
            args.insert(
                "x-delivery-limit".into(),
                AMQPValue::LongLongInt(limit as i64),
            );
        }
        args
    }

    /// A queue a consumer reads that can dead-letter: its messages go to
    /// `notify.dead`, after `amqp.delivery_limit` deliveries at most.
    fn dead_lettered(&self) -> FieldTable {
        let a = &self.amqp;
        self.limited(self.queue_args(Some(&a.dead_exchange)), a.delivery_limit)
    }

    /// The jobs, dispatch and dead exchanges; the jobs queue and a dispatch queue a
    /// channel, bound (the dead queue is declared before them, on its own channel).
    fn declare_jobs_and_dispatch(&self, steps: &mut Steps) {
        let a = &self.amqp;
        for (name, kind) in [
            (&a.jobs_exchange, ExchangeKind::Fanout),
            (&a.dispatch_exchange, ExchangeKind::Direct),
            (&a.dead_exchange, ExchangeKind::Fanout),
        ] {
            steps.exchange(name.clone(), kind, FieldTable::default());
        }
        steps.queue(a.jobs_queue.clone(), self.dead_lettered());
        steps.bind(
            &a.jobs_queue,
            &a.jobs_exchange,
            String::new(),
            FieldTable::default(),
        );
        for c in &self.channels {
            let q = self.dispatch_queue(c);
            steps.queue(q.clone(), self.dead_lettered());
            steps.bind(&q, &a.dispatch_exchange, c.clone(), FieldTable::default());
        }
    }

    /// Lanes: a direct exchange whose unroutable messages (a channel with no lanes)
    /// go on to the jobs exchange, and a queue per paced channel and lane.
    fn declare_lanes(&self, steps: &mut Steps) {
        let mut lanes_args = FieldTable::default();
        lanes_args.insert("alternate-exchange".into(), long(&self.amqp.jobs_exchange));
        let lanes = &self.lanes.exchange;
        steps.exchange(lanes.clone(), ExchangeKind::Direct, lanes_args);
        for (q, c, p) in self.lane_queues() {
            steps.queue(q.clone(), self.dead_lettered());
            steps.bind(&q, lanes, p.routing_key(c), FieldTable::default());
        }
    }

    /// Feedback from the senders: bad feedback is dead-lettered by the worker
    /// (`malformed_feedback`); the delivery limit catches a poison message.
    fn declare_feedback(&self, steps: &mut Steps) {
        let (fx, fq) = &self.feedback;
        steps.exchange(fx.clone(), ExchangeKind::Fanout, FieldTable::default());
        steps.queue(fq.clone(), self.dead_lettered());
        steps.bind(fq, fx, String::new(), FieldTable::default());
    }

    /// The delay ladder: a level's headers exchange falls through to the level
    /// below (the jobs exchange under the first), and its queue holds a message
    /// 2^n seconds before dead-lettering it there.
    fn declare_ladder(&self, steps: &mut Steps) {
        let ladder = self.ladder();
        for n in 0..ladder.levels {
            let next = if n == 0 {
                self.amqp.jobs_exchange.clone()
            } else {
                ladder.exchange(n - 1)
            };
            let mut x_args = FieldTable::default();
            x_args.insert("alternate-exchange".into(), long(&next));
            let name = ladder.exchange(n);
            steps.exchange(name.clone(), ExchangeKind::Headers, x_args);
            let mut args = self.queue_args(Some(&next));
            args.insert(
                "x-message-ttl".into(),
                AMQPValue::LongLongInt((1i64 << n) * 1000),
            );
            let q = ladder.queue(n);
            steps.queue(q.clone(), args);
            steps.bind(&q, &name, String::new(), ladder.binding(n));
        }
    }
}

/// The steps of [`Topology::declare`], in order, on one channel: each method goes
/// out when its step is first polled.
struct Steps {
    ch: lapin::Channel,
    steps: Vec<Step>,
}

impl Steps {
    /// Steps on a channel of their own (`what` names it if it cannot be opened).
    async fn open(conn: &Connection, what: &str) -> Result<Steps, BrokerError> {
        let ch = conn
            .create_channel()
            .await
            .map_err(failed(what.to_string()))?;
        Ok(Steps {
            ch,
            steps: Vec::new(),
        })
    }

    /// Declare a durable exchange.
    fn exchange(&mut self, name: String, kind: ExchangeKind, args: FieldTable) {
        let ch = self.ch.clone();
        self.steps.push(Box::pin(async move {
            let durable = ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.exchange_declare(name.as_str().into(), kind, durable, args)
                .await
                .map_err(failed(format!("exchange `{name}`")))
        }));
    }

    /// Declare a durable queue.
    fn queue(&mut self, name: String, args: FieldTable) {
        let ch = self.ch.clone();
        self.steps.push(Box::pin(async move {
            let opts = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(name.as_str().into(), opts, args)
                .await
                .map(|_| ())
                .map_err(failed(format!("queue `{name}`")))
        }));
    }

    /// Bind `queue` to `exchange` with a routing key and arguments.
    fn bind(&mut self, queue: &str, exchange: &str, key: String, args: FieldTable) {
        let (ch, queue, exchange) = (self.ch.clone(), queue.to_string(), exchange.to_string());
        self.steps.push(Box::pin(async move {
            ch.queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                ShortString::from(key),
                QueueBindOptions::default(),
                args,
            )
            .await
            .map_err(failed(format!("the binding of `{queue}` to `{exchange}`")))
        }));
    }

    /// Send every step and await their answers together: the first failure, or
    /// the channel closed after them all.
    async fn run(self) -> Result<(), BrokerError> {
        let answers = futures_util::future::join_all(self.steps).await;
        match answers.into_iter().find_map(Result::err) {
            Some(first) => Err(first),
            None => {
                let _ = self.ch.close(200, "topology declared".into()).await;
                Ok(())
            }
        }
    }
}

/// One step of [`Topology::declare`]: its method goes out when it is first polled.
type Step = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), BrokerError>> + Send>>;

/// A failed step of [`Topology::declare`], named.
fn failed(what: String) -> impl FnOnce(lapin::Error) -> BrokerError {
    move |error| BrokerError::Declare { what, error }
}
