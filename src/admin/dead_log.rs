//! The dead-letter log: a RabbitMQ stream (`<amqp.dead_queue>.log`, declared with
//! the topology while `console.dead_index` is not 0) bound to the dead-letter
//! exchange beside the dead-letter queue, so the broker keeps a copy of every dead
//! letter, the worker's and those it makes itself (a delivery limit), at no cost
//! to the worker; and the catch-up ([`catch_up`]) that reads into the browsable
//! index ([`super::dead_index`]) what the index has not seen yet. Whoever reads the
//! index catches it up first (the console's pages, the CLI's replay and purge):
//! while no one looks, nothing runs.
//!
//! A catch-up publishes a marker to the stream (confirmed; through the default
//! exchange, so its user writes to `amq.default`, as the worker does for its
//! delays; one who may not reads until the stream is quiet for 300 ms instead),
//! then reads from the offset the index keeps (`prefix:{dead}:v2:offset`, the next one to read; the
//! stream's first when there is none) up to its marker, and writes the entries a
//! batch a call with the offset after them: every dead letter published before it
//! began is in the index when it returns, and one cut short resumes where it
//! stopped, without writing an entry twice. One catch-up runs at a time over every
//! process (`prefix:{dead}:catching`, a lease taken with `SET NX PX` for a
//! minute and renewed each batch, `lua/lease.lua`); one that
//! finds the lease taken waits for it to end and leaves what came after the other's
//! marker to the next look.
//! The stream keeps dead letters for `console.dead_log_max_age`: one not caught up within it is
//! still in the queue (the CLI walks it), but not in the index.

use std::time::{Duration, Instant};

use chrono::Utc;
use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};

use super::dead_index::{self, Entry};
use super::AdminError;
use crate::config::Settings;
use crate::store::QuotaStore;

/// The header that marks a catch-up's marker (its value: the catch-up's token).
pub const MARKER: &str = "x-quota-worker-marker";

pub use crate::amqp::topology::{dead_log_args as stream_args, dead_log_name as stream_name};

/// Entries written to the index in one call.
const BATCH: usize = 200;

/// Deliveries the catch-up's consumer holds at once.
const PREFETCH: u16 = 1000;

/// How long a catch-up's lease lasts from its last batch (one that died lets the
/// next in after it; one that lives renews it each batch).
const LEASE_FOR: Duration = Duration::from_secs(60);

/// With no delivery for this long, the marker is not coming (the stream was
/// deleted or trimmed under it): the catch-up stops where it is.
const QUIET: Duration = Duration::from_secs(5);

/// Without a marker (its publish refused: a user who may not write to
/// `amq.default`), the catch-up ends when no delivery came for this long.
const UNMARKED_QUIET: Duration = Duration::from_millis(300);

/// What a catch-up did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CaughtUp {
    /// Dead letters written to the index.
    pub indexed: u64,
    /// Whether another process's catch-up ran meanwhile (this one waited for it).
    pub waited: bool,
}

/// Catch the index up with the log: every dead letter published to the log before
/// this began is in the index when it returns (unless `console.dead_index` is 0:
/// then nothing is done).
pub async fn catch_up(
    conn: &Connection,
    store: &QuotaStore,
    settings: &Settings,
) -> Result<CaughtUp, AdminError> {
    if settings.console.dead_index == 0 {
        return Ok(CaughtUp::default());
    }
    let redis = store.connection();
    let lease = dead_index::catch_up_lease(store.keys());
    let token = uuid::Uuid::new_v4().simple().to_string();
    let taken_at = Instant::now();
    while !take_lease(&redis, &lease, &token).await? {
        if taken_at.elapsed() > LEASE_FOR * 10 {
            return Err(AdminError::Invalid(format!(
                "the dead-letter index's catch-up lease `{lease}` stayed taken for {:?}",
                LEASE_FOR * 10
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        if !lease_taken(&redis, &lease).await? {
            return Ok(CaughtUp {
                indexed: 0,
                waited: true,
            });
        }
    }
    let read = read_log(conn, store, settings, &token).await;
    let script = &store.scripts().dead.lease;
    if let Err(e) = crate::redis::lease::renew_or_end(&redis, script, &lease, &token, None).await {
        tracing::warn!(error = %e, "the dead-letter index's catch-up lease runs out by itself");
    }
    Ok(CaughtUp {
        indexed: read?,
        waited: false,
    })
}

async fn take_lease(
    redis: &crate::redis::RedisConn,
    lease: &str,
    token: &str,
) -> Result<bool, AdminError> {
    let mut c = redis.clone();
    let set: Option<String> = redis::cmd("SET")
        .arg(lease)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(LEASE_FOR.as_millis() as u64)
        .query_async(&mut c)
        .await?;
    Ok(set.is_some())
}

async fn lease_taken(redis: &crate::redis::RedisConn, lease: &str) -> Result<bool, AdminError> {
    let mut c = redis.clone();
    let n: i64 = redis::cmd("EXISTS").arg(lease).query_async(&mut c).await?;
    Ok(n == 1)
}

/// Publish the marker `token`, then read the log from the index's offset up to it
/// into the index; the entries written.
async fn read_log(
    conn: &Connection,
    store: &QuotaStore,
    settings: &Settings,
    token: &str,
) -> Result<u64, AdminError> {
    let stream = stream_name(&settings.amqp.dead_queue);
    let mut ch = conn.create_channel().await?;
    let marked = mark(&ch, &stream, token).await;
    if let Err(e) = &marked {
        // (a user without write on `amq.default`, e.g. an operator's: the
        // refusal closed the channel) read until the log is quiet instead
        tracing::debug!(error = %e, "no marker in the dead-letter log; reading until it is quiet");
        let _ = ch.close(200, "no marker".into()).await;
        ch = conn.create_channel().await?;
    }
    let quiet = if marked.is_ok() {
        QUIET
    } else {
        UNMARKED_QUIET
    };
    let done = async {
        let from = dead_index::log_offset(&store.connection(), store.keys()).await?;
        ch.basic_qos(PREFETCH, BasicQosOptions::default()).await?;
        let mut args = FieldTable::default();
        let offset = from.map_or(
            AMQPValue::LongString(LongString::from("first")),
            AMQPValue::LongLongInt,
        );
        args.insert("x-stream-offset".into(), offset);
        let consumer = ch
            .basic_consume(
                stream.as_str().into(),
                "quota-worker dead-letter index".into(),
                BasicConsumeOptions::default(),
                args,
            )
            .await?;
        index_up_to(consumer, (store, settings), token, quiet).await
    }
    .await;
    let _ = ch.close(200, "caught up".into()).await;
    done
}

/// Publish the marker `token` to the stream, confirmed.
async fn mark(ch: &lapin::Channel, stream: &str, token: &str) -> Result<(), AdminError> {
    ch.confirm_select(Default::default()).await?;
    let mut headers = FieldTable::default();
    headers.insert(
        MARKER.into(),
        AMQPValue::LongString(LongString::from(token)),
    );
    let props = BasicProperties::default().with_headers(headers);
    let confirm = ch
        .basic_publish(
            "".into(),
            stream.into(),
            BasicPublishOptions::default(),
            b"",
            props,
        )
        .await?
        .await?;
    if confirm.is_nack() {
        return Err(AdminError::Invalid(format!(
            "the broker refused the catch-up's marker in `{stream}`"
        )));
    }
    Ok(())
}

/// Read deliveries until the marker `token` (or until none came for `quiet`),
/// writing the entries a batch a call with the offset after them; the entries
/// written.
async fn index_up_to(
    mut consumer: lapin::Consumer,
    (store, settings): (&QuotaStore, &Settings),
    token: &str,
    quiet: Duration,
) -> Result<u64, AdminError> {
    let mut batch: Vec<Entry> = Vec::with_capacity(BATCH);
    let mut written = 0u64;
    let mut next = None;
    loop {
        let delivery = match tokio::time::timeout(quiet, consumer.next()).await {
            Ok(Some(d)) => d?,
            Ok(None) | Err(_) => break,
        };
        let offset = offset_of(&delivery);
        let marker = marker_of(&delivery);
        if marker.is_none() {
            batch.push(entry_of(&delivery, store, settings));
        }
        next = offset.map(|o| o + 1).or(next);
        let ours = marker.as_deref() == Some(token);
        if batch.len() >= BATCH || ours {
            written += flush(&mut batch, store, settings, next).await?;
            renew(store, token).await?;
            delivery
                .acker
                .ack(BasicAckOptions { multiple: true })
                .await?;
        }
        if ours {
            return Ok(written);
        }
    }
    written += flush(&mut batch, store, settings, next).await?;
    Ok(written)
}

/// Renew this catch-up's lease (`token`) for [`LEASE_FOR`]: a long one keeps it
/// while it writes; one whose lease was lost stops (another runs now).
async fn renew(store: &QuotaStore, token: &str) -> Result<(), AdminError> {
    let lease = dead_index::catch_up_lease(store.keys());
    let (conn, script) = (store.connection(), &store.scripts().dead.lease);
    let ttl = Some(LEASE_FOR.as_millis() as u64);
    if !crate::redis::lease::renew_or_end(&conn, script, &lease, token, ttl).await? {
        return Err(AdminError::Invalid(format!(
            "the dead-letter index's catch-up lost its lease `{lease}`; another catches up now"
        )));
    }
    Ok(())
}

async fn flush(
    batch: &mut Vec<Entry>,
    store: &QuotaStore,
    settings: &Settings,
    next: Option<i64>,
) -> Result<u64, AdminError> {
    if batch.is_empty() && next.is_none() {
        return Ok(0);
    }
    let bound = settings.console.dead_index;
    let conn = store.connection();
    dead_index::record_many(&conn, store.keys(), batch, bound, next).await?;
    let n = batch.len() as u64;
    batch.clear();
    Ok(n)
}

/// The delivery's place in the stream (`x-stream-offset`).
fn offset_of(d: &lapin::message::Delivery) -> Option<i64> {
    let headers = d.properties.headers().as_ref()?;
    match headers.inner().get("x-stream-offset")? {
        AMQPValue::LongLongInt(n) => Some(*n),
        AMQPValue::LongInt(n) => Some(i64::from(*n)),
        AMQPValue::LongUInt(n) => Some(i64::from(*n)),
        AMQPValue::Timestamp(n) => i64::try_from(*n).ok(),
        _ => None,
    }
}

/// The token of a catch-up's marker, when the delivery is one.
fn marker_of(d: &lapin::message::Delivery) -> Option<String> {
    let headers = d.properties.headers().as_ref()?;
    match headers.inner().get(MARKER)? {
        AMQPValue::LongString(s) => Some(String::from_utf8_lossy(s.as_bytes()).into_owned()),
        AMQPValue::ShortString(s) => Some(s.as_str().to_string()),
        _ => Some(String::new()),
    }
}

/// The index's entry of a dead letter read from the log: what its body says of
/// the job (when it decodes), with the rules in force.
fn entry_of(d: &lapin::message::Delivery, store: &QuotaStore, settings: &Settings) -> Entry {
    let known = super::dead_select::known(&d.data, store, &settings.worker);
    dead_index::entry(&d.properties, &d.data, known, Utc::now())
}
