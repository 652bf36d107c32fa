//! The audit every fault scenario ends with: publish a known set of jobs, then find
//! each job id exactly once as dispatched, delayed (still waiting in the delay ladder
//! or the jobs queue) or dead-lettered with a reason; count duplicates; check caps.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection};
use quota_worker::config::Settings;

use crate::topology;

/// One job the test published.
#[derive(Debug, Clone)]
pub struct Published {
    /// Its id (also its AMQP `message_id`).
    pub id: String,
    /// Its recipient (empty for malformed bodies).
    pub recipient: String,
    /// Its body.
    pub body: Vec<u8>,
}

/// A job body for the contract.
pub fn job_body(id: &str, recipient: &str, channel: &str, category: &str, zone: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","recipient":"{recipient}","channel":"{channel}","category":"{category}","timezone":"{zone}","payload":{{"text":"hello"}}}}"#
    )
    .into_bytes()
}

impl Published {
    /// The properties a producer publishes the job with: JSON, its id as the
    /// message id, persistent.
    pub fn props(&self) -> BasicProperties {
        BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(self.id.as_str().into())
            .with_delivery_mode(2)
    }
}

/// Publish every job to the jobs exchange on one confirm channel, waiting for the
/// confirms in batches. Panics unless every publish is confirmed.
pub async fn publish_all(conn: &Connection, s: &Settings, jobs: &[Published]) {
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    for batch in jobs.chunks(500) {
        let mut confirms = Vec::with_capacity(batch.len());
        for j in batch {
            confirms.push(
                ch.basic_publish(
                    s.amqp.jobs_exchange.as_str().into(),
                    "".into(),
                    BasicPublishOptions::default(),
                    &j.body,
                    j.props(),
                )
                .await
                .expect("publish"),
            );
        }
        for c in confirms {
            assert!(c.await.expect("confirm").is_ack(), "job not confirmed");
        }
    }
    let _ = ch.close(200, "published".into()).await;
}

/// Ready messages in `queue` (None when the queue or the connection is not there).
pub async fn depth(conn: &Connection, queue: &str) -> Option<u32> {
    Some(crate::inspect(conn, queue).await?.message_count())
}

/// Consumers of `queue`.
pub async fn consumers(conn: &Connection, queue: &str) -> Option<u32> {
    Some(crate::inspect(conn, queue).await?.consumer_count())
}

/// A message taken from a queue by the audit.
#[derive(Debug, Clone)]
pub struct Taken {
    /// `message_id`.
    pub id: String,
    /// `x-notify-reason`, on dead letters.
    pub reason: Option<String>,
    /// Its body.
    pub body: Vec<u8>,
    /// Its headers.
    pub props: BasicProperties,
}

/// Take every message out of `queue` (no ack: they are gone), in queue order.
/// Nothing may be consuming it meanwhile.
pub async fn drain(conn: &Connection, queue: &str) -> Vec<Taken> {
    let Some(n) = depth(conn, queue).await else {
        return Vec::new();
    };
    let mut out = Vec::with_capacity(n as usize);
    if n == 0 {
        return out;
    }
    let ch = conn.create_channel().await.unwrap();
    ch.basic_qos(1000, BasicQosOptions::default())
        .await
        .unwrap();
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "audit".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .unwrap();
    // until nothing more comes within 2 s: the queue is empty (messages arriving
    // later, e.g. from a lower delay level, are taken by the next drain)
    while let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_secs(2), consumer.next()).await
    {
        out.push(Taken {
            id: d
                .properties
                .message_id()
                .as_ref()
                .map(|m| m.as_str().to_string())
                .unwrap_or_default(),
            reason: crate::header(&d.properties, "x-notify-reason"),
            body: d.data,
            props: d.properties,
        });
    }
    let _ = ch.close(200, "drained".into()).await;
    out
}

/// Where every job ended up, after the workers have stopped.
#[derive(Debug, Default)]
pub struct Audit {
    /// id -> copies in the dispatch queues, with their positions (queue order).
    pub dispatched: BTreeMap<String, Vec<usize>>,
    /// id -> copies waiting (delay ladder, back in the jobs queue, or in a lane).
    pub waiting: BTreeMap<String, usize>,
    /// id -> the queues its waiting copies were found in.
    pub waiting_in: BTreeMap<String, Vec<String>>,
    /// id -> reasons of its dead letters.
    pub dead: BTreeMap<String, Vec<String>>,
    /// ids found that the test never published.
    pub strangers: BTreeSet<String>,
}

impl Audit {
    /// Drain every queue of the topology (delay ladder from the top level down, so a
    /// message moving down during the drain is still found) and sort what is found.
    pub async fn collect(conn: &Connection, s: &Settings, published: &[Published]) -> Audit {
        let t = topology(s);
        let known: BTreeSet<&str> = published.iter().map(|p| p.id.as_str()).collect();
        let mut a = Audit::default();
        let mut pos = 0usize;
        for c in &t.channels {
            for m in drain(conn, &t.dispatch_queue(c)).await {
                a.dispatched.entry(m.id.clone()).or_default().push(pos);
                pos += 1;
                if !known.contains(m.id.as_str()) {
                    a.strangers.insert(m.id);
                }
            }
        }
        for m in drain(conn, &s.amqp.dead_queue).await {
            a.dead
                .entry(m.id.clone())
                .or_default()
                .push(m.reason.unwrap_or_else(|| "<none>".into()));
            if !known.contains(m.id.as_str()) {
                a.strangers.insert(m.id);
            }
        }
        let ladder = t.ladder();
        let mut waiting_queues: Vec<String> =
            (0..ladder.levels).rev().map(|n| ladder.queue(n)).collect();
        waiting_queues.push(s.amqp.jobs_queue.clone());
        waiting_queues.extend(t.lane_queues().map(|(q, ..)| q));
        for q in waiting_queues {
            for m in drain(conn, &q).await {
                *a.waiting.entry(m.id.clone()).or_default() += 1;
                a.waiting_in
                    .entry(m.id.clone())
                    .or_default()
                    .push(q.clone());
                if !known.contains(m.id.as_str()) {
                    a.strangers.insert(m.id);
                }
            }
        }
        a
    }

    /// Published ids found nowhere.
    pub fn lost(&self, published: &[Published]) -> Vec<String> {
        published
            .iter()
            .filter(|p| {
                !self.dispatched.contains_key(&p.id)
                    && !self.waiting.contains_key(&p.id)
                    && !self.dead.contains_key(&p.id)
            })
            .map(|p| p.id.clone())
            .collect()
    }

    /// ids found in more than one of dispatched / waiting / dead.
    pub fn in_two_places(&self) -> Vec<String> {
        let mut out = Vec::new();
        let all: BTreeSet<&String> = self
            .dispatched
            .keys()
            .chain(self.waiting.keys())
            .chain(self.dead.keys())
            .collect();
        for id in all {
            let n = self.dispatched.contains_key(id) as u8
                + self.waiting.contains_key(id) as u8
                + self.dead.contains_key(id) as u8;
            if n > 1 {
                out.push(id.clone());
            }
        }
        out
    }

    /// Extra dispatched copies (a job sent twice counts 1).
    pub fn duplicate_dispatches(&self) -> usize {
        self.dispatched.values().map(|v| v.len() - 1).sum()
    }

    /// ids dispatched more than once.
    pub fn duplicated_ids(&self) -> Vec<(&String, &Vec<usize>)> {
        self.dispatched
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .collect()
    }

    /// Extra waiting copies.
    pub fn duplicate_waiting(&self) -> usize {
        self.waiting.values().map(|n| n - 1).sum()
    }

    /// Extra dead letters.
    pub fn duplicate_dead(&self) -> usize {
        self.dead.values().map(|v| v.len() - 1).sum()
    }

    /// Total messages dispatched (copies included).
    pub fn dispatch_copies(&self) -> usize {
        self.dispatched.values().map(|v| v.len()).sum()
    }

    /// Distinct ids dispatched per recipient.
    pub fn dispatched_per_recipient(&self, published: &[Published]) -> BTreeMap<String, usize> {
        let mut out = BTreeMap::new();
        for p in published {
            if self.dispatched.contains_key(&p.id) {
                *out.entry(p.recipient.clone()).or_default() += 1;
            }
        }
        out
    }

    /// A one-line summary for logs.
    pub fn summary(&self, published: &[Published]) -> String {
        format!(
            "{} jobs: {} dispatched ({} copies), {} waiting ({} copies), {} dead ({} copies), {} lost, {} in two places, {} strangers",
            published.len(),
            self.dispatched.len(),
            self.dispatch_copies(),
            self.waiting.len(),
            self.waiting.values().sum::<usize>(),
            self.dead.len(),
            self.dead.values().map(|v| v.len()).sum::<usize>(),
            self.lost(published).len(),
            self.in_two_places().len(),
            self.strangers.len()
        )
    }
}

/// The recorded sends (ms, committed?) of one recipient's sorted set, read on `conn`.
pub async fn recorded<C: redis::aio::ConnectionLike>(
    conn: &mut C,
    key: &str,
) -> Vec<(i64, bool, Vec<u8>)> {
    let raw: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(conn)
        .await
        .unwrap_or_default();
    raw.into_iter()
        .map(|(m, s)| {
            let s = s as i64;
            (s / 2, s % 2 == 1, m)
        })
        .collect()
}

/// Whether a list of send times (ms) ever puts more than `limit` sends in a rolling
/// window of `window_ms`. Returns the first offending pair.
pub fn rolling_violation(times: &[i64], limit: usize, window_ms: i64) -> Option<(i64, i64)> {
    let mut t = times.to_vec();
    t.sort();
    for i in 0..t.len() {
        if i + limit < t.len() && t[i + limit] - t[i] < window_ms {
            return Some((t[i], t[i + limit]));
        }
    }
    None
}

/// A zone where it is now around noon, so a calendar-day cap cannot roll over to
/// the next day while a test runs.
pub fn noon_zone() -> String {
    use chrono::Timelike;
    let h = chrono::Utc::now().hour() as i32;
    let offset = 12 - h; // local = utc + offset
                         // Etc/GMT-3 is UTC+3 (POSIX signs)
    match offset {
        0 => "Etc/GMT".into(),
        o if o > 0 => format!("Etc/GMT-{o}"),
        o => format!("Etc/GMT+{}", -o),
    }
}

/// A small deterministic PRNG (xorshift64*), seeded and printed by each scenario.
pub struct Rng(u64);

impl Rng {
    /// From `QW_FAULTS_SEED` or the clock.
    pub fn from_env() -> Rng {
        let seed = std::env::var("QW_FAULTS_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos() as u64
            });
        eprintln!("QW_FAULTS_SEED={seed}");
        Rng(seed | 1)
    }

    /// Next value.
    #[allow(clippy::should_implement_trait)] // a generator without end, not an iterator
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}
