//! The benchmark's own broker work: connecting, closing with a bound, quorum queues,
//! publishing a backlog, publishing at a rate as a plain producer does ([`paced`]),
//! offering jobs at a rate or at an interval stamped with [`SENT_HEADER`], and
//! timing their arrival in an output queue ([`Arrivals`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use crate::report::EndToEnd;

/// A connection to the broker at `url`.
pub async fn connect(url: &str) -> Result<Connection> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")
}

/// A connection's or channel's close, bounded: a close the broker never confirms
/// (seen now and then after a run) must not hold the benchmark.
pub async fn closed<T>(close: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), close)
        .await
        .ok()
}

/// Declares `queues`, durable quorum queues, on a channel of their own.
pub async fn declare_quorum(conn: &Connection, queues: &[&String]) -> Result<()> {
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for q in queues {
        ch.queue_declare(q.as_str().into(), durable, quorum())
            .await?;
    }
    let _ = ch.close(200, "".into()).await;
    Ok(())
}

fn quorum() -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    t
}

/// Publishes `bodies` (persistent, confirmed, at most 2,000 unconfirmed at a time).
pub async fn preload(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    bodies: impl Iterator<Item = Vec<u8>>,
) -> Result<()> {
    let mut pending = FuturesUnordered::new();
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    for body in bodies {
        let c = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                &body,
                props.clone(),
            )
            .await?;
        pending.push(c);
        while pending.len() >= 2_000 {
            pending.next().await.transpose()?;
        }
    }
    while pending.next().await.transpose()?.is_some() {}
    Ok(())
}

/// The header the load generator stamps on each job it offers: when it published
/// it, in microseconds since the Unix epoch. The worker keeps a job's own headers on
/// its dispatch (and the pass-through copies them), so the consumer on the output
/// queue reads it back; the job's body is not touched.
pub const SENT_HEADER: &str = "x-bench-sent-us";

/// Now, in microseconds since the Unix epoch.
pub fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Publishes jobs at `rate` per second for `secs` seconds (each millisecond's jobs
/// handed to the client together, so they cost the load generator one hand-over to
/// lapin's I/O thread instead of one each), each stamped with [`SENT_HEADER`];
/// returns how many it published, every one confirmed.
pub async fn offer(
    conn: &Connection,
    exchange: &str,
    routing_key: &str,
    rate: f64,
    secs: u64,
    body: impl Fn(u64) -> String,
) -> Result<u64> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0u64;
    let started = Instant::now();
    let mut pending = FuturesUnordered::new();
    while started.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        let tick_jobs: Vec<_> = (sent..due)
            .map(|i| {
                let body = body(i);
                let props = stamped();
                let ch = &ch;
                async move {
                    ch.basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        props,
                    )
                    .await
                }
            })
            .collect();
        for confirm in futures_util::future::join_all(tick_jobs).await {
            pending.push(confirm?);
        }
        sent = sent.max(due);
        while let Some(Some(r)) = futures_util::FutureExt::now_or_never(pending.next()) {
            r?;
        }
    }
    while pending.next().await.transpose()?.is_some() {}
    let _ = ch.close(200, "".into()).await;
    Ok(sent)
}

/// Publishes `n` jobs (`body(i)` for `i` in `0..n`) to `exchange` at `rate` a second,
/// as a plain producer does (persistent, JSON, no header; each millisecond's
/// together, every one confirmed).
pub async fn paced(
    conn: &Connection,
    exchange: &str,
    n: u64,
    rate: f64,
    body: impl Fn(u64) -> Vec<u8>,
) -> Result<()> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let (started, mut sent) = (Instant::now(), 0u64);
    let mut pending = FuturesUnordered::new();
    while sent < n {
        tick.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate) as u64).min(n);
        for i in sent..due {
            let opts = BasicPublishOptions::default();
            let confirm = ch
                .basic_publish(exchange.into(), "".into(), opts, &body(i), props.clone())
                .await?;
            pending.push(confirm);
        }
        sent = sent.max(due);
        while let Some(Some(r)) = futures_util::FutureExt::now_or_never(pending.next()) {
            r?;
        }
    }
    while pending.next().await.transpose()?.is_some() {}
    let _ = ch.close(200, "".into()).await;
    Ok(())
}

/// Publishes one job (`body(i)`, `i` counting from 0) to `exchange` every `every`,
/// stamped with [`SENT_HEADER`], until `stop` is cancelled; returns how many it
/// published, every one confirmed.
pub async fn every_until(
    conn: &Connection,
    exchange: &str,
    every: Duration,
    stop: tokio_util::sync::CancellationToken,
    body: impl Fn(u64) -> String,
) -> Result<u64> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut tick = tokio::time::interval(every);
    let mut sent = 0u64;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let props = stamped();
        let opts = BasicPublishOptions::default();
        let body = body(sent);
        ch.basic_publish(exchange.into(), "".into(), opts, body.as_bytes(), props)
            .await?
            .await?;
        sent += 1;
    }
    let _ = ch.close(200, "".into()).await;
    Ok(sent)
}

/// A consumer on a queue without acks (so it asks the broker for nothing per
/// message) that keeps what `read` makes of each delivery as it arrives, and adds
/// up the weight `read` gives each, until it is stopped.
pub struct Watch<T> {
    weight: Arc<AtomicU64>,
    arrived: Arc<AtomicU64>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<Vec<T>>>,
}

impl<T: Send + 'static> Watch<T> {
    /// Starts consuming `queue` under consumer tag `tag`.
    pub async fn start<F>(
        conn: &Connection,
        queue: &str,
        tag: &str,
        mut read: F,
    ) -> Result<Watch<T>>
    where
        F: FnMut(&lapin::message::Delivery) -> (Option<T>, u64) + Send + 'static,
    {
        let ch = conn.create_channel().await?;
        let opts = BasicConsumeOptions {
            no_ack: true,
            ..Default::default()
        };
        let mut consumer = ch
            .basic_consume(queue.into(), tag.into(), opts, FieldTable::default())
            .await?;
        let weight = Arc::new(AtomicU64::new(0));
        let arrived = Arc::new(AtomicU64::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let (n, halt, count) = (weight.clone(), stop.clone(), arrived.clone());
        let task = tokio::spawn(async move {
            let mut kept = Vec::new();
            loop {
                let d = tokio::select! {
                    _ = halt.cancelled() => break,
                    d = consumer.next() => d,
                };
                let Some(d) = d else { break };
                let (k, w) = read(&d?);
                kept.extend(k);
                n.fetch_add(w, Ordering::Relaxed);
                count.fetch_add(1, Ordering::Relaxed);
            }
            let _ = ch.close(200, "".into()).await;
            Ok(kept)
        });
        Ok(Watch {
            weight,
            arrived,
            stop,
            task,
        })
    }

    /// The weight of what arrived so far.
    pub fn weight(&self) -> u64 {
        self.weight.load(Ordering::Relaxed)
    }

    /// How many messages arrived so far.
    pub fn arrived(&self) -> u64 {
        self.arrived.load(Ordering::Relaxed)
    }

    /// Stops consuming: what was kept, in the order it arrived.
    pub async fn finish(self) -> Result<Vec<T>> {
        self.stop.cancel();
        self.task.await?
    }
}

/// Microseconds from a delivery's [`SENT_HEADER`] to now (`None`: it has none).
pub fn waited_micros(d: &lapin::message::Delivery) -> Option<u64> {
    let now = unix_micros();
    let sent = d
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(SENT_HEADER))
        .and_then(|v| match v {
            AMQPValue::LongLongInt(v) => Some(*v),
            _ => None,
        })?;
    Some((now - sent).max(0) as u64)
}

/// A [`Watch`] of an output queue that records arrival minus [`SENT_HEADER`] for
/// every message.
pub struct Arrivals(Watch<u64>);

impl Arrivals {
    /// Starts consuming `queue`.
    pub async fn start(conn: &Connection, queue: &str) -> Result<Arrivals> {
        let watch = Watch::start(conn, queue, "e2e", |d| (waited_micros(d), 1)).await?;
        Ok(Arrivals(watch))
    }

    /// Waits (at most 60 s) until `sent` messages have arrived, then stops.
    pub async fn finish(self, sent: u64) -> Result<EndToEnd> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.0.weight() < sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut micros = self.0.finish().await?;
        micros.sort_unstable();
        Ok(EndToEnd::of(sent, &micros))
    }
}

/// A persistent JSON message's properties, stamped with the time it is sent
/// ([`SENT_HEADER`], µs since the epoch).
fn stamped() -> BasicProperties {
    let mut h = FieldTable::default();
    h.insert(SENT_HEADER.into(), AMQPValue::LongLongInt(unix_micros()));
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into())
        .with_headers(h)
}
