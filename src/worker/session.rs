//! One broker session: connect, declare the topology, consume with a bounded
//! prefetch, run one task per delivery, and on shutdown or a lost connection let
//! the jobs in flight finish (within `worker.shutdown_grace`) before closing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::Mutex;

use futures_util::stream::SelectAll;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection, Consumer};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::{AbortOnDropHandle, TaskTracker};
use tracing::{info, info_span, warn, Instrument};

use super::lanes::LanesChannel;
use super::link::BrokerLink;
use super::Worker;
use crate::amqp::acks::{Acks, Settle};
use crate::amqp::{self, BrokerError, Publisher};
use crate::lanes::consume::LaneStream;
use crate::lanes::{LaneConsumers, Priority, Watch};

/// A session's connection as set up: the connection, its confirm-mode publisher,
/// the jobs' channel and consumer, and the lanes' consumers (none without lanes).
struct Opened {
    conn: Connection,
    publisher: Publisher,
    consume: Channel,
    consumer: Consumer,
    lanes: Option<LaneConsumers>,
}

/// What a session's lanes bring to its loop and its close (empty without lanes).
struct SessionLanes {
    channel: Option<Channel>,
    deliveries: SelectAll<LaneStream>,
    tags: Arc<Mutex<Vec<String>>>,
    tuner: Option<AbortOnDropHandle<()>>,
    new_streams: UnboundedReceiver<LaneStream>,
    acks: Option<(Acks, JoinHandle<()>)>,
}

/// The session's consumer of the jobs queue: its channel, and its tag.
struct JobsConsumer {
    channel: Channel,
    consumer: Consumer,
    tag: String,
}

/// The session's feedback consumer, and the token it cancels when it ends.
struct FeedbackTask {
    /// Cancelled when the feedback consumer ends (on its own: the session broke).
    ended: CancellationToken,
    handle: JoinHandle<Result<(), BrokerError>>,
}

/// A running session, from its loop to its close.
struct Live {
    conn: Arc<Connection>,
    jobs: JobsConsumer,
    tasks: TaskTracker,
    /// Cancelled to stop the session's jobs waiting for Redis, and its closer.
    stop: CancellationToken,
    feedback: FeedbackTask,
    link: Arc<BrokerLink>,
    committer: JoinHandle<()>,
    acks: Acks,
    batcher: JoinHandle<()>,
    lanes: SessionLanes,
    blocked: watch::Receiver<bool>,
    /// The broker's flow, the queues' watch and the digests' closer: aborted with
    /// the session.
    _around: [AbortOnDropHandle<()>; 3],
}

impl Worker {
    pub(crate) async fn session(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        // each session goes to the next broker URL (a cluster without a load
        // balancer: a dead node costs one backoff step)
        let urls = self.settings.amqp_urls();
        let url = urls[self.next_url.fetch_add(1, Ordering::Relaxed) % urls.len()];
        let tag = format!("quota-worker-{}", uuid::Uuid::now_v7());
        // Connecting, declaring and subscribing, bounded (a broker that accepts the
        // connection but never answers must not stall the worker) and cut short by
        // shutdown.
        let limit = self.settings.amqp.publish_timeout.0 * 3;
        let opened = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            opened = tokio::time::timeout(limit, self.open(url, &tag)) => opened
                .map_err(|_| BrokerError::Timeout("connecting and declaring the topology", limit))??,
        };
        self.health.broker.store(true, Ordering::Relaxed);
        let mut live = self.go_live(opened, tag, shutdown);
        let (result, feedback_ended) = self.consume_until(&mut live, shutdown).await;
        let close_by = self.finish(&mut live, result.is_ok()).await;
        self.close(live, close_by, feedback_ended).await;
        result
    }

    /// Connect to `url`, declare the topology, open the publisher, and consume the
    /// jobs queue and the lanes as `tag`; logs how long each part took.
    async fn open(&self, url: &str, tag: &str) -> Result<Opened, BrokerError> {
        let a = &self.settings.amqp;
        let timeout = a.publish_timeout.0;
        let began = Instant::now();
        let conn = amqp::connect(url, &a.tls, "quota-worker", timeout).await?;
        let connect_ms = began.elapsed().as_millis() as u64;
        self.topology.declare(&conn).await?;
        let declare_ms = began.elapsed().as_millis() as u64 - connect_ms;
        let publisher = Publisher::open(&conn, timeout).await?;
        let consume = conn.create_channel().await?;
        consume
            .basic_qos(a.prefetch, BasicQosOptions::default())
            .await?;
        let consumer = consume
            .basic_consume(
                a.jobs_queue.as_str().into(),
                tag.into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        let lanes = LaneConsumers::start(self.path.lanes.prefetch(), &conn, tag).await?;
        // how long the session took to start, by part: after a broker's restart this
        // is drain lost (docs/guide/recovery.md)
        let broker = crate::config::redact_url(url);
        let setup_ms = began.elapsed().as_millis() as u64;
        info!(queue = %a.jobs_queue, prefetch = a.prefetch, %broker, connect_ms, declare_ms, setup_ms, "consuming");
        Ok(Opened {
            conn,
            publisher,
            consume,
            consumer,
            lanes,
        })
    }

    /// Start what runs beside the session's loop: the broker's flow, the queues'
    /// watch, the digests' closer, the feedback consumer, the commits, the acks and
    /// the lanes' tuner.
    fn go_live(self: &Arc<Self>, o: Opened, tag: String, shutdown: &CancellationToken) -> Live {
        let (blocked, flow) = amqp::flow::follow(&o.conn, crate::metrics::broker_blocked);
        let conn = Arc::new(o.conn);
        let status = self.status.clone();
        let watch = crate::status::watch_queues(
            status,
            (conn.clone(), self.store.clone()),
            self.topology.clone(),
            shutdown.child_token(),
        );
        let stop = shutdown.child_token();
        // the digests' closer (docs/guide/digests.md): one per session, on its
        // publisher; one killed mid-close leaves its digest to the next after the
        // lease
        let closer = tokio::spawn(
            self.path
                .digests
                .closer()
                .run(o.publisher.clone(), stop.clone()),
        );
        // the second consumer: feedback from the senders, on the session's
        // publisher's channel (its dead letters go through it); if it ends on its own,
        // it ends the session through `ended` (one token for the loop to wait on, not
        // a task handle polled for every delivery)
        let ended = shutdown.child_token();
        let feedback = tokio::spawn({
            let (feedback, stop) = (self.feedback.clone(), stop.clone());
            let (publisher, ended) = (o.publisher.clone(), ended.clone());
            let grace = self.settings.worker.shutdown_grace.0;
            async move {
                let result = feedback.consume(publisher, stop, grace).await;
                ended.cancel();
                result
            }
        });
        let (link, committer) = self.session_context(o.publisher, stop.clone());
        let (acks, batcher) = Acks::start(o.consume.clone());
        let lanes = SessionLanes::of(o.lanes, |parts| {
            self.path.lanes.tenant_watch(conn.clone(), parts)
        });
        Live {
            conn,
            jobs: JobsConsumer {
                channel: o.consume,
                consumer: o.consumer,
                tag,
            },
            tasks: TaskTracker::new(),
            stop,
            feedback: FeedbackTask {
                ended,
                handle: feedback,
            },
            link: Arc::new(link),
            committer,
            acks,
            batcher,
            lanes,
            blocked,
            _around: [flow, tokio::spawn(watch), closer].map(AbortOnDropHandle::new),
        }
    }

    /// Run one task per delivery, of the jobs queue and the lanes, until shutdown
    /// or a broken session; whether the feedback consumer ended on its own.
    async fn consume_until(
        self: &Arc<Self>,
        live: &mut Live,
        shutdown: &CancellationToken,
    ) -> (Result<(), BrokerError>, bool) {
        // a session without lanes never polls them
        let has_lanes = live.lanes.acks.is_some();
        let lanes = &mut live.lanes;
        loop {
            // blocked by the broker (an alarm): take no new delivery until it lifts;
            // those taken already wait for their confirms
            if *live.blocked.borrow_and_update() {
                tokio::select! {
                    _ = shutdown.cancelled() => return (Ok(()), false),
                    _ = live.blocked.changed() => continue,
                }
            }
            // (a block that begins while this waits lets at most the next delivery
            // in; the check above holds the one after)
            tokio::select! {
                _ = live.feedback.ended.cancelled() => {
                    if shutdown.is_cancelled() {
                        return (Ok(()), false);
                    }
                    // the feedback consumer ended on its own: the session is broken
                    return match (&mut live.feedback.handle).await {
                        Ok(Err(e)) => (Err(e), true),
                        _ => (Err(BrokerError::Timeout("feedback consumer (ended)", Duration::ZERO)), true),
                    };
                }
                next = live.jobs.consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        let (link, acks) = (live.link.clone(), live.acks.clone());
                        live.tasks.spawn(self.clone().handle(link, acks, delivery, None));
                    }
                    Some(Err(e)) => return (Err(BrokerError::Amqp(e)), false),
                    None => return (Err(BrokerError::Timeout("consumer stream (closed)", Duration::ZERO)), false),
                },
                Some(stream) = lanes.new_streams.recv(), if has_lanes => lanes.deliveries.push(stream),
                Some((lane, next)) = lanes.deliveries.next(), if has_lanes => match (next, &lanes.acks) {
                    (Ok(delivery), Some((acks, _))) => {
                        let (link, acks) = (live.link.clone(), acks.clone());
                        live.tasks.spawn(self.clone().handle(link, acks, delivery, Some(lane)));
                    }
                    (Ok(_), None) => unreachable!("lane deliveries come with their channel"),
                    (Err(e), _) => return (Err(BrokerError::Amqp(e)), false),
                },
            }
        }
    }

    /// Let the jobs in flight finish: on shutdown (`clean`), no new delivery and
    /// `worker.shutdown_grace` for them; with the connection gone, jobs waiting for
    /// Redis give up (the broker delivers them again). The deadline every broker
    /// call after this shares: a broker that stopped answering (hung, partitioned)
    /// must not hold the shutdown past its grace period, nor a reconnect, until
    /// lapin's heartbeat gives up on it (minutes).
    async fn finish(&self, live: &mut Live, clean: bool) -> tokio::time::Instant {
        live.tasks.close();
        if !clean {
            live.stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), live.tasks.wait()).await;
            return tokio::time::Instant::now() + Duration::from_millis(200);
        }
        info!("shutting down: no new jobs; finishing those in flight");
        let grace = self.settings.worker.shutdown_grace.0;
        let deadline = tokio::time::Instant::now() + grace;
        let cancel = live
            .jobs
            .channel
            .basic_cancel(live.jobs.tag.as_str().into(), BasicCancelOptions::default());
        let _ = tokio::time::timeout_at(deadline, cancel).await;
        // no new lane consumer from here on
        live.lanes.tuner = None;
        let lane_tags = live
            .lanes
            .tags
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(ch) = &live.lanes.channel {
            for lane_tag in &lane_tags {
                let cancel =
                    ch.basic_cancel(lane_tag.as_str().into(), BasicCancelOptions::default());
                let _ = tokio::time::timeout_at(deadline, cancel).await;
            }
        }
        if tokio::time::timeout_at(deadline, live.tasks.wait())
            .await
            .is_err()
        {
            warn!(
                ?grace,
                "grace period over; unfinished jobs go back to the queue"
            );
        }
        deadline.max(tokio::time::Instant::now() + Duration::from_millis(200))
    }

    /// Close the session by `close_by`: the feedback consumer, the acks, the
    /// commits, the channels, the connection.
    async fn close(&self, live: Live, close_by: tokio::time::Instant, feedback_ended: bool) {
        live.stop.cancel();
        if !feedback_ended
            && tokio::time::timeout_at(close_by, live.feedback.handle)
                .await
                .is_err()
        {
            warn!("the feedback consumer did not finish in time");
        }
        drop(live.acks);
        drop(live.link);
        let _ = tokio::time::timeout_at(close_by, live.batcher).await;
        if let Some((lane_acks, lane_batcher)) = live.lanes.acks {
            drop(lane_acks);
            let _ = tokio::time::timeout_at(close_by, lane_batcher).await;
        }
        if let Some(ch) = &live.lanes.channel {
            let qos = ch.basic_qos(1, BasicQosOptions::default());
            let _ = tokio::time::timeout_at(close_by, qos).await;
        }
        let _ = tokio::time::timeout_at(close_by, live.committer).await;
        // one round trip on the channel, so the broker has applied the last acks
        // before the channel closes (quorum queues can lose acks sent just before)
        let prefetch = self.settings.amqp.prefetch;
        let qos = live
            .jobs
            .channel
            .basic_qos(prefetch, BasicQosOptions::default());
        let _ = tokio::time::timeout_at(close_by, qos).await;
        let close = live.conn.close(200, "bye".into());
        if tokio::time::timeout_at(close_by, close).await.is_err() {
            warn!("the broker did not answer the connection close; leaving it");
        }
    }

    /// One delivery's task. Its own state stays at about a kilobyte: the decision's
    /// larger state (about three) lives in one box instead of being copied along each
    /// time the task is built, moved and spawned.
    async fn handle(
        self: Arc<Self>,
        s: Arc<BrokerLink>,
        acks: Acks,
        delivery: Delivery,
        lane: Option<(usize, Priority)>,
    ) {
        s.metrics.in_flight.increment(1.0);
        let span = info_span!(
            "job",
            job_id = tracing::field::Empty,
            tag = delivery.delivery_tag,
            trace_id = tracing::field::Empty,
            span_id = tracing::field::Empty,
        );
        let started = Instant::now();
        let process = Box::pin(self.path.process_from(&s, &delivery, lane.map(|(_, l)| l)));
        let otel = crate::telemetry::enabled().then(|| {
            let queue = match lane {
                None => self.settings.amqp.jobs_queue.clone(),
                Some((i, p)) => self.topology.lane_queue(&self.topology.laned[i], p),
            };
            let headers = delivery.properties.headers().as_ref();
            crate::telemetry::handling(headers, &queue, delivery.routing_key.as_str(), true)
        });
        let otel = otel.flatten();
        let result = match &otel {
            None => process.instrument(span.clone()).await,
            Some(cx) => {
                let (trace_id, span_id) = crate::telemetry::ids(cx);
                span.record("trace_id", trace_id).record("span_id", span_id);
                use crate::telemetry::FutureExt as _;
                let result = process
                    .with_context(cx.clone())
                    .instrument(span.clone())
                    .await;
                crate::telemetry::finish(cx, result.as_ref());
                result
            }
        };
        // In a closure, never `span.enter()` across an await: a guard held over an
        // await leaks the span into other tasks, and tracing-subscriber then panics
        // in a later task's `info_span!` ("tried to clone a span that already
        // closed"), killing that task before it settles its delivery.
        if let Some((index, _)) = lane {
            self.path.lanes.clocks.settled(index, started.elapsed());
        }
        let settled = delivery.exchange.as_str().is_empty() && lane.is_some();
        span.in_scope(|| match result {
            Ok(_) => {
                s.metrics
                    .job_seconds
                    .record(started.elapsed().as_secs_f64());
                acks.settle(delivery.delivery_tag, Settle::Ack);
            }
            Err(e) => {
                warn!(error = %e, "job handed back to the broker");
                acks.settle(delivery.delivery_tag, Settle::Requeue);
            }
        });
        if settled {
            self.path.lanes.settled(&delivery);
        }
        s.metrics.in_flight.decrement(1.0);
    }
}

impl SessionLanes {
    /// The lanes' parts (none without lanes); the tuner's new consumers come in
    /// through `new_streams`, as the lanes' prefetch follows what their channel's
    /// rate needs.
    /// The consumers of the tenants' queues (`watch`) run beside the tuner.
    fn of(lanes: Option<LaneConsumers>, watch: impl FnOnce(LanesChannel) -> Watch) -> SessionLanes {
        let (channel, mut deliveries, tags, tuner) = match lanes {
            Some(l) => (Some(l.channel), l.deliveries, l.tags, Some(l.tuner)),
            None => Default::default(),
        };
        let (new_lanes, new_streams) = tokio::sync::mpsc::unbounded_channel();
        let tuner = tuner.map(|t| {
            let watch = watch(LanesChannel {
                channel: t.channel.clone(),
                tags: tags.clone(),
                tag: t.tag.clone(),
            });
            let watched = new_lanes.clone();
            AbortOnDropHandle::new(tokio::spawn(async move {
                tokio::join!(t.run(new_lanes), watch.run(watched));
            }))
        });
        // never ends, so that a session without lanes waits on the jobs alone
        deliveries.push(futures_util::stream::pending().boxed());
        let acks = channel.clone().map(Acks::start);
        SessionLanes {
            channel,
            deliveries,
            tags,
            tuner,
            new_streams,
            acks,
        }
    }
}
