//! `peer`: the worker the source articles suggest, written the straightforward way,
//! for the benchmark to run beside `quota-worker` on the same broker settings: one job
//! at a time (prefetch 1), each job its own sorted-set script call (a rolling 1-day
//! and 7-day cap, the seed article's shape), then its own GCRA call, then a publish
//! to the dispatch exchange waiting for its confirm, then the ack. A refused job is
//! dead-lettered (the articles do not hold it). It reads the same
//! `QUOTA_WORKER__*` settings and answers `/readyz` on `http.listen`, so `bench
//! --worker target/release/peer` drives it like the real worker, and counts its
//! outcomes from the queues.
//!
//! Not for use: it is what batching, the single admission call and the pipelined
//! confirms are measured against (BENCHMARKS.md).

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{Context, Result};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;

/// The seed article's cap: trim what left the week, count the day and the week,
/// record the send when both allow it.
const CAP: &str = r"
local now = tonumber(redis.call('TIME')[1]) * 1000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 604800000)
local day = redis.call('ZCOUNT', KEYS[1], now - 86400000, '+inf')
local week = redis.call('ZCARD', KEYS[1])
if day >= tonumber(ARGV[2]) or week >= tonumber(ARGV[3]) then return 0 end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('PEXPIRE', KEYS[1], 604800000)
return 1
";

/// GCRA, one key per channel (interval and burst in microseconds and jobs).
const GCRA: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then tat = now end
local new = tat + interval
if new - now > interval * burst then return 0 end
redis.call('SET', KEYS[1], string.format('%.0f', new), 'PX', 60000)
return 1
";

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let s = Settings::load(None)?;
    let topology = Topology::from_settings(&s);
    let conn = Connection::connect(&s.amqp.url, ConnectionProperties::default()).await?;
    topology.declare(&conn).await?;
    let publish = conn.create_channel().await?;
    publish
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    let consume = conn.create_channel().await?;
    consume.basic_qos(1, BasicQosOptions::default()).await?;
    let mut deliveries = consume
        .basic_consume(
            s.amqp.jobs_queue.as_str().into(),
            "peer".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut redis = redis::Client::open(s.redis.url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let (cap, gcra) = (redis::Script::new(CAP), redis::Script::new(GCRA));
    serve_ready(&s.http.listen)?;

    while let Some(delivery) = deliveries.next().await {
        let delivery = delivery?;
        let job: serde_json::Value = serde_json::from_slice(&delivery.data).unwrap_or_default();
        let (id, recipient, channel) = (
            job["id"].as_str().unwrap_or_default(),
            job["recipient"].as_str().unwrap_or_default(),
            job["channel"].as_str().unwrap_or_default(),
        );
        let allowed = !id.is_empty() && !recipient.is_empty() && {
            let key = format!("{}:peer:{recipient}", s.redis.key_prefix);
            let capped: i64 = cap
                .key(&key)
                .arg(id)
                .arg(1)
                .arg(3)
                .invoke_async(&mut redis)
                .await?;
            let rate_key = format!("{}:peer-rate:{channel}", s.redis.key_prefix);
            let paced: i64 = gcra
                .key(&rate_key)
                .arg(1)
                .arg(1_000_000)
                .invoke_async(&mut redis)
                .await?;
            capped == 1 && paced == 1
        };
        let (exchange, key) = match allowed {
            true => (s.amqp.dispatch_exchange.as_str(), channel),
            false => (s.amqp.dead_exchange.as_str(), ""),
        };
        publish
            .basic_publish(
                exchange.into(),
                key.into(),
                BasicPublishOptions::default(),
                &delivery.data,
                BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into()),
            )
            .await?
            .await
            .context("the confirm")?;
        delivery.ack(BasicAckOptions::default()).await?;
    }
    Ok(())
}

/// Answer every request on `listen` with 200 (the benchmark waits for `/readyz`).
fn serve_ready(listen: &str) -> Result<()> {
    let listener = std::net::TcpListener::bind(listen)?;
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
            let mut buf = [0u8; 1024];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 6\r\n\r\nready\n");
        }
    });
    Ok(())
}
