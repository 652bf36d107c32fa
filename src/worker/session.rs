//! One broker session: connect, declare the topology, consume with a bounded
//! prefetch, run one task per delivery, and on shutdown or a lost connection let
//! the jobs in flight finish (within `worker.shutdown_grace`) before closing.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::FieldTable;
use tokio_util::sync::CancellationToken;
use tracing::{info, info_span, warn, Instrument};

use super::link::BrokerLink;
use super::Worker;
use crate::amqp::acks::{Acks, Settle};
use crate::amqp::{self, BrokerError, Publisher};
use crate::lanes::{LaneConsumers, Priority};

impl Worker {
    pub(crate) async fn session(
        self: &Arc<Self>,
        shutdown: &CancellationToken,
    ) -> Result<(), BrokerError> {
        let a = &self.settings.amqp;
        let timeout = a.publish_timeout.0;
        // each session goes to the next broker URL (a cluster without a load
        // balancer: a dead node costs one backoff step)
        let urls = self.settings.amqp_urls();
        let url = urls[self.next_url.fetch_add(1, Ordering::Relaxed) % urls.len()];
        let tag = format!("quota-worker-{}", uuid::Uuid::now_v7());
        // Connecting, declaring and subscribing, bounded (a broker that accepts the
        // connection but never answers must not stall the worker) and cut short by
        // shutdown.
        let began = Instant::now();
        let mut took = [Duration::ZERO; 2];
        let setup = async {
            let conn = amqp::connect(url, &a.tls, "quota-worker", timeout).await?;
            took[0] = began.elapsed();
            self.topology.declare(&conn).await?;
            took[1] = began.elapsed() - took[0];
            let publisher = Publisher::open(&conn, timeout).await?;
            let consume = conn.create_channel().await?;
            consume
                .basic_qos(a.prefetch, BasicQosOptions::default())
                .await?;
            let consumer = consume
                .basic_consume(
                    a.jobs_queue.as_str().into(),
                    tag.as_str().into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await?;
            let lanes = LaneConsumers::start(self.lane_prefetch(), &conn, &tag).await?;
            Ok::<_, BrokerError>((conn, publisher, consume, consumer, lanes))
        };
        let limit = timeout * 3;
        let (conn, publisher, consume, mut consumer, lanes) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            setup = tokio::time::timeout(limit, setup) => setup
                .map_err(|_| BrokerError::Timeout("connecting and declaring the topology", limit))??,
        };
        self.health.broker.store(true, Ordering::Relaxed);
        let broker = crate::config::redact_url(url);
        // how long the session took to start, by part: after a broker's restart this
        // is drain lost (docs/guide/recovery.md)
        let [connect_ms, declare_ms] = took.map(|d| d.as_millis() as u64);
        let setup_ms = began.elapsed().as_millis() as u64;
        info!(queue = %a.jobs_queue, prefetch = a.prefetch, %broker, connect_ms, declare_ms, setup_ms, "consuming");
        let (mut blocked, flow) = amqp::flow::follow(&conn);
        let _flow = tokio_util::task::AbortOnDropHandle::new(flow);
        let conn = Arc::new(conn);
        let _queues =
            tokio_util::task::AbortOnDropHandle::new(tokio::spawn(crate::status::watch_queues(
                self.status.clone(),
                conn.clone(),
                self.topology.clone(),
                shutdown.child_token(),
            )));

        let tasks = tokio_util::task::TaskTracker::new();
        let stop = shutdown.child_token();
        // the digests' closer (docs/guide/digests.md): one per session, on its
        // publisher; one killed mid-close leaves its digest to the next after the
        // lease
        let _closer = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(
            self.closer().run(publisher.clone(), stop.clone()),
        ));
        // the second consumer: feedback from the senders, on the session's
        // publisher's channel (its dead letters go through it); if it ends on its own,
        // it ends the session through `ended` (one token for the loop below to wait
        // on, not a task handle polled for every delivery)
        let ended = shutdown.child_token();
        let mut feedback = tokio::spawn({
            let (feedback, stop) = (self.feedback.clone(), stop.clone());
            let (publisher, ended) = (publisher.clone(), ended.clone());
            let grace = self.settings.worker.shutdown_grace.0;
            async move {
                let result = feedback.consume(publisher, stop, grace).await;
                ended.cancel();
                result
            }
        });
        let (session, committer) = self.session_context(publisher, stop.clone());
        let session = Arc::new(session);
        let (acks, batcher) = Acks::start(consume.clone());
        let (lane_channel, mut lane_deliveries, lane_tags, tuner) = match lanes {
            Some(l) => (Some(l.channel), l.deliveries, l.tags, Some(l.tuner)),
            None => Default::default(),
        };
        // the lanes' prefetch follows what their channel's rate needs: the tuner's
        // new consumers come in here
        let (new_lanes, mut new_lane_streams) = tokio::sync::mpsc::unbounded_channel();
        let tuner =
            tuner.map(|t| tokio_util::task::AbortOnDropHandle::new(tokio::spawn(t.run(new_lanes))));
        // never ends, so that a session without lanes waits on the jobs alone
        lane_deliveries.push(futures_util::stream::pending().boxed());
        let lane_acks = lane_channel.clone().map(Acks::start);
        // a session without lanes never polls them
        let has_lanes = lane_acks.is_some();
        let mut feedback_ended = false;
        let result = loop {
            // blocked by the broker (an alarm): take no new delivery until it lifts;
            // those taken already wait for their confirms
            if *blocked.borrow_and_update() {
                tokio::select! {
                    _ = shutdown.cancelled() => break Ok(()),
                    _ = blocked.changed() => continue,
                }
            }
            // (a block that begins while this waits lets at most the next delivery
            // in; the check above holds the one after)
            tokio::select! {
                _ = ended.cancelled() => {
                    if shutdown.is_cancelled() {
                        break Ok(());
                    }
                    // the feedback consumer ended on its own: the session is broken
                    feedback_ended = true;
                    break match (&mut feedback).await {
                        Ok(Err(e)) => Err(e),
                        _ => Err(BrokerError::Timeout("feedback consumer (ended)", Duration::ZERO)),
                    };
                }
                next = consumer.next() => match next {
                    Some(Ok(delivery)) => {
                        tasks.spawn(self.clone().handle(session.clone(), acks.clone(), delivery, None));
                    }
                    Some(Err(e)) => break Err(BrokerError::Amqp(e)),
                    None => break Err(BrokerError::Timeout("consumer stream (closed)", Duration::ZERO)),
                },
                Some(stream) = new_lane_streams.recv(), if has_lanes => lane_deliveries.push(stream),
                Some((lane, next)) = lane_deliveries.next(), if has_lanes => match (next, &lane_acks) {
                    (Ok(delivery), Some((acks, _))) => {
                        tasks.spawn(self.clone().handle(session.clone(), acks.clone(), delivery, Some(lane)));
                    }
                    (Ok(_), None) => unreachable!("lane deliveries come with their channel"),
                    (Err(e), _) => break Err(BrokerError::Amqp(e)),
                },
            }
        };
        tasks.close();
        // Every broker call from here on has a deadline: a broker that stopped
        // answering (hung, partitioned) must not hold the shutdown past its grace
        // period, nor a reconnect, until lapin's heartbeat gives up on it (minutes).
        let mut close_by = tokio::time::Instant::now() + Duration::from_secs(1);
        if result.is_ok() {
            info!("shutting down: no new jobs; finishing those in flight");
            let grace = self.settings.worker.shutdown_grace.0;
            let deadline = tokio::time::Instant::now() + grace;
            let cancel = consume.basic_cancel(tag.as_str().into(), BasicCancelOptions::default());
            let _ = tokio::time::timeout_at(deadline, cancel).await;
            // no new lane consumer from here on
            drop(tuner);
            let lane_tags = lane_tags.lock().unwrap_or_else(|e| e.into_inner()).clone();
            if let Some(ch) = &lane_channel {
                for lane_tag in &lane_tags {
                    let cancel =
                        ch.basic_cancel(lane_tag.as_str().into(), BasicCancelOptions::default());
                    let _ = tokio::time::timeout_at(deadline, cancel).await;
                }
            }

            if tokio::time::timeout_at(deadline, tasks.wait())
                .await
                .is_err()
            {
                warn!(
                    ?grace,
                    "grace period over; unfinished jobs go back to the queue"
                );
            }
            close_by = deadline.max(tokio::time::Instant::now() + Duration::from_millis(200));
        } else {
            // the connection is gone: jobs waiting for Redis give up, the broker
            // delivers them again
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), tasks.wait()).await;
        }
        // everything after the grace period shares one deadline
        let close_by = close_by.max(tokio::time::Instant::now() + Duration::from_millis(200));
        stop.cancel();
        if !feedback_ended && tokio::time::timeout_at(close_by, feedback).await.is_err() {
            warn!("the feedback consumer did not finish in time");
        }
        drop(acks);
        drop(session);
        let _ = tokio::time::timeout_at(close_by, batcher).await;
        if let Some((lane_acks, lane_batcher)) = lane_acks {
            drop(lane_acks);
            let _ = tokio::time::timeout_at(close_by, lane_batcher).await;
        }
        if let Some(ch) = &lane_channel {
            let qos = ch.basic_qos(1, BasicQosOptions::default());
            let _ = tokio::time::timeout_at(close_by, qos).await;
        }
        let _ = tokio::time::timeout_at(close_by, committer).await;
        // one round trip on the channel, so the broker has applied the last acks
        // before the channel closes (quorum queues can lose acks sent just before)
        let _ = tokio::time::timeout_at(
            close_by,
            consume.basic_qos(a.prefetch, BasicQosOptions::default()),
        )
        .await;
        let close = conn.close(200, "bye".into());
        if tokio::time::timeout_at(close_by, close).await.is_err() {
            warn!("the broker did not answer the connection close; leaving it");
        }
        result
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
        let process = Box::pin(self.process_from(&s, &delivery, lane.map(|(_, l)| l)));
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
            self.lane_clocks.settled(index, started.elapsed());
        }
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
        s.metrics.in_flight.decrement(1.0);
    }
}
