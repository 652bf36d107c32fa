//! Dead letters, read, replayed and purged without loss.
//!
//! ## Reading dead letters without losing them
//! AMQP has no way to browse a queue. Taking a message and handing it back
//! (`basic.nack` with requeue, or closing the channel unacked) counts as a delivery:
//! on this broker (3.10, quorum queues) each such read raises the message's
//! `x-delivery-count` (checked: basic.get + nack, consume + close, basic.get + close
//! all do), and a quorum queue with a delivery limit (RabbitMQ 4 gives every quorum
//! queue a limit of 20 by default) drops a message past it. Listing the dead letters
//! twenty times would then delete them.
//!
//! So a walk *rotates* the queue instead: it counts the messages there at the start
//! (N), consumes them with manual acks, and for each one either publishes a fresh copy
//! (same body, same properties) to the tail of the dead-letter queue, or replays it to
//! the jobs exchange, or drops it; the original is acked only once that publish is
//! confirmed. After N steps every kept message is back, in the same order, with a
//! delivery count of zero, and nothing was handed back. The prefetch P = min(N, 256)
//! pipelines the reads (about 2,000 messages a second here); the last P acks are
//! held until the consumer is cancelled, so the broker never has the credit to
//! deliver one of the copies (see [`DeadLetters::walk`]).
//!
//! If the command is interrupted (SIGINT/SIGTERM stop it between two messages; a
//! crash at any point), nothing is lost: messages already delivered but not visited
//! are copied to the tail untouched (they move behind the others), and at worst, after
//! a crash, a message whose copy was confirmed but whose original was not yet acked is
//! there twice. Messages that arrive during a walk land among the copies, in arrival
//! order. Run one walk at a time per dead-letter queue, and nothing else should
//! consume it.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions,
    BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, PublisherConfirm};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{is_not_found, AdminError};
use crate::amqp::{self, PublishError, Topology};
use crate::job::headers;

/// What a walk does with one dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkAction {
    /// Put a fresh copy back at the tail of the dead-letter queue.
    Keep,
    /// Publish it to the jobs exchange, without its dead-letter headers.
    Replay,
    /// Remove it.
    Drop,
}

/// What a walk did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct WalkReport {
    /// Messages in the queue when the walk started.
    pub found: u32,
    /// Messages visited.
    pub visited: u32,
    /// Put back.
    pub kept: u32,
    /// Replayed to the jobs exchange.
    pub replayed: u32,
    /// Acked and gone for good (a purge).
    pub dropped: u32,
    /// Stopped early by a signal (everything not visited is untouched).
    pub interrupted: bool,
}

/// Publishes awaiting their confirm, at most this many at once.
const WINDOW: usize = 64;

/// Largest prefetch of a walk.
pub(crate) const MAX_PREFETCH: u16 = 256;

/// With no delivery for this long, the queue holds fewer messages than were counted
/// (something else consumed them): the walk ends.
const IDLE: Duration = Duration::from_secs(5);

/// The dead-letter queue, walked as the module docs describe.
#[derive(Debug)]
pub struct DeadLetters<'a> {
    conn: &'a Connection,
    topology: &'a Topology,
    timeout: Duration,
    prefetch: u16,
}

struct Pending {
    confirm: PublisherConfirm,
    delivery: Delivery,
    what: String,
}

/// AckBudget with a budget: only the first `free` deliveries are acked as they settle;
/// the rest are held until the consumer is cancelled, so the broker never has credit
/// to deliver a message beyond the ones counted at the start (our own copies).
/// One walk under way: its channels, its consumer, the publishes awaiting their
/// confirms, the acks held back, and what it did so far.
struct Walking {
    prefetch: u32,
    consume: lapin::Channel,
    publish: lapin::Channel,
    tag: String,
    consumer: lapin::Consumer,
    pending: VecDeque<Pending>,
    acks: AckBudget,
    report: WalkReport,
}

struct AckBudget {
    free: u32,
    done: u32,
    held: Vec<Delivery>,
}

impl AckBudget {
    async fn ack(&mut self, delivery: Delivery) -> Result<(), AdminError> {
        if self.done < self.free {
            self.done += 1;
            delivery.acker.ack(BasicAckOptions::default()).await?;
        } else {
            self.held.push(delivery);
        }
        Ok(())
    }
}

async fn hand_back(delivery: Delivery) {
    let _ = delivery
        .acker
        .nack(BasicNackOptions {
            requeue: true,
            ..Default::default()
        })
        .await;
}

impl<'a> DeadLetters<'a> {
    /// Walk `topology`'s dead-letter queue over `conn`; every confirm waits at most `timeout`.
    pub fn new(conn: &'a Connection, topology: &'a Topology, timeout: Duration) -> Self {
        DeadLetters {
            conn,
            topology,
            timeout,
            prefetch: MAX_PREFETCH,
        }
    }

    /// Use another prefetch (at least 1; tests use small ones).
    pub fn with_prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch.max(1);
        self
    }

    /// Messages ready in the queue now.
    pub async fn count(&self) -> Result<u32, AdminError> {
        let queue = &self.topology.amqp.dead_queue;
        let ch = self.conn.create_channel().await?;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let q = ch
            .queue_declare(queue.as_str().into(), passive, FieldTable::default())
            .await
            .map_err(|e| {
                if is_not_found(&e) {
                    AdminError::NoDeadQueue(queue.clone())
                } else {
                    e.into()
                }
            })?;
        let _ = ch.close(200, "counted".into()).await;
        Ok(q.message_count())
    }

    /// Visit every message present at the start once, in queue order, and do with it
    /// what `choose` says. Stops between two messages when `stop` is cancelled.
    ///
    /// The messages are consumed with a prefetch of P = min(N, 256) and manual acks.
    /// A kept, replayed or dropped message is acked once its publish is confirmed, but
    /// only the first N - P of them right away: the last P acks wait until the
    /// consumer is cancelled. At most P deliveries are ever unacked, so the broker can
    /// deliver exactly the N messages counted and never one of the copies behind them.
    pub async fn walk<F>(
        &self,
        stop: &CancellationToken,
        choose: F,
    ) -> Result<WalkReport, AdminError>
    where
        F: FnMut(&Delivery) -> WalkAction,
    {
        let found = self.count().await?;
        if found == 0 {
            return Ok(WalkReport {
                found,
                ..Default::default()
            });
        }
        let mut w = self.open(found).await?;
        let mut failure = self.visit(&mut w, stop, choose).await;
        self.put_back(&mut w, &mut failure).await;
        self.finish(w, failure).await
    }

    /// Start a walk over the `found` messages: a consuming channel with a prefetch
    /// of min(N, 256), a publishing channel in confirm mode.
    async fn open(&self, found: u32) -> Result<Walking, AdminError> {
        let prefetch = (self.prefetch as u32).min(found);
        let consume = self.conn.create_channel().await?;
        consume
            .basic_qos(prefetch as u16, BasicQosOptions::default())
            .await?;
        let publish = self.conn.create_channel().await?;
        publish
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let tag = format!("quota-worker-admin-{}", uuid::Uuid::now_v7());
        let consumer = consume
            .basic_consume(
                self.topology.amqp.dead_queue.as_str().into(),
                tag.as_str().into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Walking {
            prefetch,
            consume,
            publish,
            tag,
            consumer,
            pending: VecDeque::new(),
            acks: AckBudget {
                free: found - prefetch,
                done: 0,
                held: Vec::new(),
            },
            report: WalkReport {
                found,
                ..Default::default()
            },
        })
    }

    /// Visit the messages in order, each as `choose` says, until every one found
    /// was visited, `stop` is cancelled, the queue has nothing more to deliver, or
    /// a step fails (that failure returned).
    async fn visit<F>(
        &self,
        w: &mut Walking,
        stop: &CancellationToken,
        mut choose: F,
    ) -> Option<AdminError>
    where
        F: FnMut(&Delivery) -> WalkAction,
    {
        while w.report.visited < w.report.found {
            let next = tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    w.report.interrupted = true;
                    return None;
                }
                next = tokio::time::timeout(IDLE, w.consumer.next()) => next,
            };
            let delivery = match next {
                Ok(Some(Ok(delivery))) => delivery,
                Ok(Some(Err(e))) => return Some(e.into()),
                // cancelled by the broker, or nothing more to deliver
                Ok(None) | Err(_) => return None,
            };
            w.report.visited += 1;
            let step = choose(&delivery);
            if let Err(e) = self.apply_in(w, step, delivery).await {
                return Some(e);
            }
        }
        None
    }

    /// Cancel the consumer, then put the messages delivered but not visited
    /// (interrupted) back at the tail, untouched, rather than handed back (which
    /// would raise their delivery count); after a failure, hand them back.
    async fn put_back(&self, w: &mut Walking, failure: &mut Option<AdminError>) {
        let _ = w
            .consume
            .basic_cancel(w.tag.as_str().into(), BasicCancelOptions::default())
            .await;
        while let Ok(Some(Ok(delivery))) =
            tokio::time::timeout(Duration::from_millis(200), w.consumer.next()).await
        {
            if failure.is_some() {
                hand_back(delivery).await;
                continue;
            }
            if let Err(e) = self.apply_in(w, WalkAction::Keep, delivery).await {
                *failure = Some(e);
            }
        }
    }

    /// Await the publishes still pending and ack their originals, send the held
    /// acks, and close both channels: the report, or the walk's first failure.
    async fn finish(
        &self,
        mut w: Walking,
        mut failure: Option<AdminError>,
    ) -> Result<WalkReport, AdminError> {
        while let Some(p) = w.pending.pop_front() {
            if let Err(e) = self.confirm_then_ack(p, &mut w.acks).await {
                failure.get_or_insert(e);
            }
        }
        // The held acks go as one multiple ack, then a round trip on the channel
        // before it closes: acks still in flight when a channel closes can be lost
        // by quorum queues (seen on 3.10 under load), and the message would come back.
        if let Some(last) = w.acks.held.iter().map(|d| d.delivery_tag).max() {
            w.consume
                .basic_ack(last, BasicAckOptions { multiple: true })
                .await?;
        }
        w.consume
            .basic_qos(w.prefetch as u16, BasicQosOptions::default())
            .await?;
        let _ = w.publish.close(200, "walk done".into()).await;
        let _ = w.consume.close(200, "walk done".into()).await;
        match failure {
            Some(e) => Err(e),
            None => Ok(w.report),
        }
    }

    /// [`apply`](Self::apply) within a walk.
    async fn apply_in(
        &self,
        w: &mut Walking,
        step: WalkAction,
        delivery: Delivery,
    ) -> Result<(), AdminError> {
        let Walking {
            publish,
            pending,
            acks,
            report,
            ..
        } = w;
        self.apply(step, delivery, publish, pending, acks, report)
            .await
    }

    async fn apply(
        &self,
        step: WalkAction,
        delivery: Delivery,
        publish: &lapin::Channel,
        pending: &mut VecDeque<Pending>,
        acks: &mut AckBudget,
        report: &mut WalkReport,
    ) -> Result<(), AdminError> {
        let dead_queue = self.topology.amqp.dead_queue.as_str();
        let (exchange, routing_key, props, what) = match step {
            WalkAction::Drop => {
                report.dropped += 1;
                return acks.ack(delivery).await;
            }
            WalkAction::Keep => {
                report.kept += 1;
                (
                    "",
                    dead_queue,
                    keep_properties(&delivery.properties),
                    "the copy of a kept dead letter".to_string(),
                )
            }
            WalkAction::Replay => {
                report.replayed += 1;
                (
                    self.topology.amqp.jobs_exchange.as_str(),
                    "",
                    replay_properties(&delivery.properties),
                    format!(
                        "the replay of `{}`",
                        delivery
                            .properties
                            .message_id()
                            .as_ref()
                            .map(|s| s.as_str())
                            .unwrap_or("(no id)")
                    ),
                )
            }
        };
        let confirm = match publish
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                &delivery.data,
                props.with_delivery_mode(2),
            )
            .await
        {
            Ok(confirm) => confirm,
            Err(e) => {
                hand_back(delivery).await;
                return Err(e.into());
            }
        };
        pending.push_back(Pending {
            confirm,
            delivery,
            what,
        });
        // keep fewer publishes unsettled than the prefetch, so acks keep flowing
        if pending.len() >= WINDOW.min(self.prefetch as usize - 1).max(1) {
            let oldest = pending.pop_front().expect("not empty");
            self.confirm_then_ack(oldest, acks).await?;
        }
        Ok(())
    }

    /// Wait for a publish's confirm, then ack its original; on failure hand the
    /// original back (it stays in the queue).
    async fn confirm_then_ack(&self, p: Pending, acks: &mut AckBudget) -> Result<(), AdminError> {
        let outcome = match tokio::time::timeout(self.timeout, p.confirm).await {
            Err(_) => Err(PublishError::Timeout(self.timeout)),
            Ok(Err(e)) => Err(PublishError::Amqp(e)),
            Ok(Ok(confirmation)) => amqp::confirmed(confirmation),
        };
        match outcome {
            Ok(()) => acks.ack(p.delivery).await,
            Err(source) => {
                hand_back(p.delivery).await;
                Err(AdminError::Publish {
                    what: p.what,
                    source,
                })
            }
        }
    }
}

fn filtered_headers(props: &BasicProperties, drop: impl Fn(&str) -> bool) -> FieldTable {
    let mut out = FieldTable::default();
    if let Some(h) = props.headers() {
        for (k, v) in h.inner() {
            if !drop(k.as_str()) {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    out
}

/// A kept copy: everything as it was, less the broker's per-delivery count.
fn keep_properties(props: &BasicProperties) -> BasicProperties {
    let headers = filtered_headers(props, |k| k == "x-delivery-count");
    props.clone().with_headers(headers)
}

/// A replayed job: its id, content type and own headers (attempt count, first seen),
/// without the dead-letter reason and detail, and without the broker's `x-death`
/// family (a message carrying those into a dead-letter cycle can be dropped).
pub(crate) fn replay_properties(props: &BasicProperties) -> BasicProperties {
    let headers = filtered_headers(props, |k| {
        k == headers::REASON
            || k == headers::DETAIL
            || k == "x-death"
            || k == "x-delivery-count"
            || k.starts_with("x-first-death")
            || k.starts_with("x-last-death")
    });
    let mut out = BasicProperties::default()
        .with_headers(headers)
        .with_timestamp(Utc::now().timestamp().max(0) as u64);
    if let Some(id) = props.message_id() {
        out = out.with_message_id(id.clone());
    }
    if let Some(ct) = props.content_type() {
        out = out.with_content_type(ct.clone());
    }
    out
}
