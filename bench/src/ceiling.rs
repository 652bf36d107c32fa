//! The broker's own ceiling: a pass-through that consumes, publishes with confirm and
//! acks, with no decision, on the worker's broker settings (quorum queues, persistent
//! messages, the same prefetch). It runs as the worker does by default
//! (`worker.threads = 1`): on a thread of its own with a single-threaded runtime and
//! its own connection, so the two differ by the worker's work only. Measured on a
//! preloaded backlog ([`ceiling`]) or live at an offered rate ([`live_pass_through`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection};
use quota_worker::config::Settings;
use quota_worker::job::headers;
use tokio_util::sync::CancellationToken;

use crate::broker::{closed, connect, declare_quorum, offer, preload, Arrivals};
use crate::jobs::{job_bodies, latency_job};
use crate::report::EndToEnd;
use crate::sample::cpu_snapshot;

/// The ceiling's two queues: its source and its output.
pub fn ceiling_queues(s: &Settings) -> [String; 2] {
    [
        format!("{}.src", s.amqp.jobs_queue),
        format!("{}.dst", s.amqp.jobs_queue),
    ]
}

/// Work on a connection of its own to `url`, closed after it.
type OnConnection<T> =
    Box<dyn for<'c> FnOnce(&'c Connection) -> Pin<Box<dyn Future<Output = Result<T>> + 'c>> + Send>;

/// Runs `work` as the worker runs: on a blocking thread with a single-threaded
/// runtime and a connection to `url` of its own.
fn on_own_thread<T: Send + 'static>(
    url: String,
    work: OnConnection<T>,
) -> tokio::task::JoinHandle<Result<T>> {
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                let conn = connect(&url).await?;
                let result = work(&conn).await;
                let _ = closed(conn.close(200, "bye".into())).await;
                result
            })
    })
}

/// The ceiling on the same `n` job bodies as `mix`, preloaded: messages per second,
/// and CPU microseconds per message of the broker, Redis and this process.
pub async fn ceiling(s: &Settings, mix: &str, n: usize) -> Result<(f64, [f64; 3])> {
    let (s, mix) = (s.clone(), mix.to_string());
    let url = s.amqp.url.clone();
    on_own_thread(
        url,
        Box::new(move |conn| Box::pin(async move { pass_through(conn, &s, &mix, n).await })),
    )
    .await?
}

async fn pass_through(
    conn: &Connection,
    s: &Settings,
    mix: &str,
    n: usize,
) -> Result<(f64, [f64; 3])> {
    let [src, dst] = ceiling_queues(s);
    declare_quorum(conn, &[&src, &dst]).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    preload(&ch, "", &src, job_bodies(mix, n)).await?;

    let (mut consumer, publish) = relay_channels(conn, s.amqp.prefetch, &src).await?;
    let cpu_before = cpu_snapshot();
    let started = Instant::now();
    let done = relay_loop(&mut consumer, &publish, &dst, n, None).await?;
    let secs = started.elapsed().as_secs_f64();
    let cpu_after = cpu_snapshot();
    let cpu: [f64; 3] = std::array::from_fn(|i| (cpu_after[i] - cpu_before[i]) * 1e6 / n as f64);
    Ok((done as f64 / secs, cpu))
}

/// The pass-through's consumer on `src` (prefetch as the worker's) and its
/// publishing channel (confirms).
async fn relay_channels(
    conn: &Connection,
    prefetch: u16,
    src: &str,
) -> Result<(lapin::Consumer, Channel)> {
    let consume = conn.create_channel().await?;
    consume
        .basic_qos(prefetch, BasicQosOptions::default())
        .await?;
    let publish = conn.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let consumer = consume
        .basic_consume(
            src.into(),
            "ceiling".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    Ok((consumer, publish))
}

/// The pass-through at work on its own connection: [`relay_channels`], then
/// [`relay_loop`] until `stop`.
async fn relay(
    conn: &Connection,
    prefetch: u16,
    src: &str,
    dst: &str,
    limit: usize,
    stop: Option<&CancellationToken>,
) -> Result<u64> {
    let (mut consumer, publish) = relay_channels(conn, prefetch, src).await?;
    relay_loop(&mut consumer, &publish, dst, limit, stop).await
}

/// Consume, publish with confirm, ack — no decision — for `limit` deliveries or
/// until `stop`; returns how many were forwarded. A delivery's own headers go with
/// it (the latency step's timestamp); the preloaded backlog of the ceiling has none.
async fn relay_loop(
    consumer: &mut lapin::Consumer,
    publish: &Channel,
    dst: &str,
    limit: usize,
    stop: Option<&CancellationToken>,
) -> Result<u64> {
    // `QW_BENCH_CEILING_HEADERS=1`: the pass-through adds the two headers a job back
    // from the delay ladder carries (what they cost the broker, BENCHMARKS.md)
    let headers = std::env::var("QW_BENCH_CEILING_HEADERS").is_ok_and(|v| v == "1");
    let done = Arc::new(AtomicU64::new(0));
    let tasks = tokio_util::task::TaskTracker::new();
    let mut taken = 0;
    while taken < limit {
        let d = match stop {
            None => consumer.next().await,
            Some(stop) => tokio::select! {
                _ = stop.cancelled() => break,
                d = consumer.next() => d,
            },
        };
        let d = d.context("consumer ended")??;
        taken += 1;
        let publish = publish.clone();
        let dst = dst.to_string();
        let done = done.clone();
        tasks.spawn(async move {
            let mut props = BasicProperties::default().with_delivery_mode(2);
            let mut h = d.properties.headers().clone();
            if headers {
                let h = h.get_or_insert_with(FieldTable::default);
                h.insert(headers::ATTEMPT.into(), AMQPValue::LongLongInt(2));
                h.insert(
                    headers::FIRST_SEEN.into(),
                    AMQPValue::LongLongInt(1_763_950_000_000),
                );
            }
            if let Some(h) = h {
                props = props.with_headers(h);
            }
            let opts = BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            };
            let c = publish
                .basic_publish("".into(), dst.as_str().into(), opts, &d.data, props)
                .await;
            if let Ok(c) = c {
                if c.await.is_ok() {
                    let _ = d.ack(BasicAckOptions::default()).await;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
    }
    tasks.close();
    tasks.wait().await;
    Ok(done.load(Ordering::Relaxed))
}

/// The pass-through, live: its relay forwards from its source queue to its output
/// queue (as in the ceiling, on a thread and runtime of its own) while the load
/// generator offers jobs at `rate` to the source and a consumer times their arrival
/// in the output.
pub async fn live_pass_through(
    conn: &Connection,
    s: &Settings,
    rate: f64,
    secs: u64,
) -> Result<EndToEnd> {
    let [src, dst] = ceiling_queues(s);
    declare_quorum(conn, &[&src, &dst]).await?;
    let stop = CancellationToken::new();
    let relay_stop = stop.clone();
    let prefetch = s.amqp.prefetch;
    let (from, to) = (src.clone(), dst.clone());
    let relay = on_own_thread(
        s.amqp.url.clone(),
        Box::new(move |conn| {
            Box::pin(async move {
                relay(conn, prefetch, &from, &to, usize::MAX, Some(&relay_stop)).await
            })
        }),
    );
    let result = async {
        let arrivals = Arrivals::start(conn, &dst).await?;
        let sent = offer(conn, "", &src, rate, secs, latency_job).await?;
        arrivals.finish(sent).await
    }
    .await;
    stop.cancel();
    relay.await??;
    result
}
