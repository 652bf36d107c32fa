//! The soak (`#[ignore]`: `cargo test` never runs it; `bench/soak.sh` does): three
//! worker processes at a third of their measured ceiling for `QW_SOAK_MINUTES`
//! (default 60), a fault every `QW_SOAK_FAULT_EVERY` seconds (default 600) in turn:
//! kill -9 of one worker (restarted at once), a broker restart, a Redis restart
//! (graceful SHUTDOWN, then start, the AOF bringing every write back), every
//! connection between the workers and the broker cut by a proxy, and a reload
//! (SIGHUP to every worker, with a channel rate changed in their file). Then every
//! job is audited.
//!
//! Everything it runs is its own: a private RabbitMQ node ([`private_node`]), a
//! private `redis-server` with `appendonly yes` and `appendfsync everysec` (a
//! graceful SHUTDOWN writes and fsyncs the AOF, so a restart keeps every
//! acknowledged write; `everysec` is what production runs, its one-second window
//! only matters to a crash of Redis or of the machine, which the soak does not
//! inject; `always` would fsync every admission and measure the disk), a TCP proxy
//! ([`testkit::proxy`]) between the workers and the broker (not Redis: a Redis restart
//! already drops every Redis connection, whereas a broker that stays up while the
//! connections drop is a fault no other one of the five makes: the unconfirmed
//! dispatches may have been routed, the deliveries go back at once), and the three
//! workers.
//!
//! 1. *Ceiling*: a backlog of `QW_SOAK_CEILING_JOBS` (default 20,000) uncapped jobs,
//!    the channel unpaced, drained by the three workers through the proxy: jobs/s
//!    between a tenth and nine tenths of the backlog dispatched (the drain's
//!    ceiling). Then the soak's own loop offered that rate for
//!    `QW_SOAK_SUSTAINED_SECS` (default 45): the jobs/s the jobs queue is drained
//!    by, published and all, after the first third ([`sustained`]). The ceiling is
//!    the lower of the two.
//! 2. *Soak*: the harness's mix ([`Mix`]: uncapped in three lanes, daily and rolling
//!    caps, malformed) published steadily at a third of the ceiling, the channel
//!    paced at it, in chunks of ten seconds of jobs so that the rolling cap runs at
//!    a third of its capacity at any ceiling, each rolling recipient's jobs three at
//!    a time so that it still refuses some ([`chunk_for`], [`in_threes`]); a
//!    downstream consumer takes the dispatches as they come (as a
//!    sender would, so the broker does not hold an hour of them) and keeps their ids
//!    in order. Every `QW_SOAK_SAMPLE` seconds (default 5): each worker's RSS
//!    (`VmRSS`) and open descriptors (`/proc/PID/fd`), Redis `used_memory`, the
//!    queue depths (each lane's too), dispatched and published counts, printed as a
//!    line as it goes (with the rolling jobs not yet dispatched). Every
//!    `QW_SOAK_METRICS` seconds (default 60), each worker's own counters of where
//!    its jobs go (outcomes, delays, each lane's parks and takes, its lane prefetch;
//!    the workers serve their metrics on ports of their own), printed and kept in
//!    the sample (`worker_metrics`). The faults come in the order `QW_SOAK_FAULTS`
//!    gives ([`fault_order`]).
//! 3. *Audit*: publishing stops, the queues settle, the workers stop (SIGTERM), every
//!    job is looked for ([`judge`]): none lost, no cap exceeded, every duplicate
//!    dispatch explained by a fault RELIABILITY.md names (a kill -9, or a lost
//!    connection: broker restart, proxy cut), found within the dispatches in flight
//!    at that fault (`amqp.prefetch` for one worker, three times that for all three).
//!    Each worker process: the medians of its RSS and of its descriptors over the
//!    first and the last quarter of its life within 10 %, its life counted from the
//!    end of the first broker restart it went through (the worker's AMQP client
//!    starts a runtime of its own, four descriptors, the first time a connection is
//!    lost and does not come straight back: once per process, see [`flatness`]),
//!    judged when that is at least a third of the run (a worker killed late is too
//!    young to judge and is listed as such).
//!    Redis memory within `baseline + 512 bytes × sends recorded + 16 MiB`: the
//!    worker keeps one sorted-set member per send for the dedupe window (24 h, longer
//!    than the run), so memory grows with sends and with nothing else.
//!    After each fault (but the reload), the jobs queue and the lanes back to their
//!    depth before it within 5 minutes while publishing goes on
//!    ([`testkit::catch_up`]: the time is in the figures as `catch_up`).
//!
//! Writes `target/reliability/soak.json` (every sample), its figures
//! (`target/reliability/soak.{quick,long}.json`, the long form from 60 minutes on),
//! `target/reliability/soak.svg` (dispatch rate, RSS, descriptors and Redis memory
//! over time, the faults marked) and, with `QW_WRITE_RELIABILITY=1`, `docs/soak.svg`
//! and the soak's section of RELIABILITY.md.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::harness::*;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions,
};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties};
use quota_worker::config::Settings;
use serde_json::{json, Value};
use testkit::audit::{depth, noon_zone, publish_all, Audit, Published};
use testkit::catch_up::{catch_up_seconds, Depths};
use testkit::procs::{RedisServer, WorkerProc};
use testkit::proxy::Proxy;
use testkit::timeline::{self, Panel, Series};
use testkit::*;
use tokio::sync::{watch, RwLock};
use tokio_util::sync::CancellationToken;

const WORKERS: usize = 3;
/// Jobs made at once for the feed, at least (each chunk a [`Mix`] of its own; its
/// recipients' names repeat from chunk to chunk, so the caps apply across them).
const CHUNK: usize = 10_000;
/// Seconds of the feed in one chunk ([`chunk_for`]).
const CHUNK_SECONDS: f64 = 10.0;

/// Jobs in one chunk of the feed at `rate` jobs/s: [`CHUNK_SECONDS`] of them, at
/// least [`CHUNK`] (`QW_SOAK_CHUNK` sets it). A mix's capped recipients are a fixed
/// part of its jobs (rolling: one per 50, offered 7 jobs in 100), so ten seconds a
/// chunk offer each rolling recipient 0.35 jobs/s against the 1/s its cap lets
/// through (two per rolling 2 s), whatever the machine's ceiling. A chunk of a fixed
/// 10,000 gave 200 rolling recipients, 200 jobs/s at most, and a ceiling of 8,064
/// offered them 188/s: the cap itself, not the worker, then held a backlog that
/// grew with each job's trip back through the delay ladder and never settled
/// (docs/notes/recovery-drain.md). The feed gives each rolling recipient its jobs
/// three at a time ([`in_threes`]), so the cap still refuses a third of them.
fn chunk_for(rate: f64) -> usize {
    let asked = env_f64("QW_SOAK_CHUNK", 0.0) as usize;
    if asked > 0 {
        return asked;
    }
    ((rate * CHUNK_SECONDS).round() as usize).max(CHUNK)
}

/// The `n`-th rolling job of the feed, given to a recipient of `recipients` three
/// at a time: the three come within milliseconds of each other, the cap (two per
/// rolling 2 s) lets two go and delays the third about two seconds. Spread one by
/// one, as a mix gives them, the cap would refuse none of them at any load below
/// its capacity (each recipient's jobs evenly spaced more than a second apart).
fn in_threes(mut job: Published, n: usize, recipients: usize, zone: &str) -> Published {
    (job.recipient, job.body) = rolling_job(&job.id, (n / 3) % recipients, zone);
    job
}

/// Rolling-capped jobs published and dispatched so far (a live figure: the cap's
/// backlog is the difference).
#[derive(Default)]
struct RollingCount {
    published: AtomicU64,
    dispatched: AtomicU64,
}
/// Redis memory allowed per recorded send (see the module doc).
const BYTES_PER_SEND: f64 = 512.0;
const REDIS_SLACK: f64 = 16.0 * 1024.0 * 1024.0;
/// After each fault, the jobs queue and every lane are back to their depth before it
/// within this many seconds, while publishing goes on ([`catch_up_seconds`]).
const CATCH_UP_SECONDS: f64 = 300.0;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

async fn connect(url: &str) -> Connection {
    for _ in 0..600 {
        if let Ok(Ok(c)) = tokio::time::timeout(
            Duration::from_secs(5),
            Connection::connect(url, ConnectionProperties::default()),
        )
        .await
        {
            return c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("no connection to {url}");
}

/// Lets the publisher and the downstream consumer stand aside while the broker
/// restarts (they are the test's, not what it tests): each holds a read lock while
/// it talks to the broker and lets go when `want` turns true; the restart holds the
/// write lock.
struct Pause {
    want: watch::Sender<bool>,
    gate: RwLock<()>,
}

impl Pause {
    fn new() -> Arc<Pause> {
        Arc::new(Pause {
            want: watch::channel(false).0,
            gate: RwLock::new(()),
        })
    }

    async fn hold(&self) -> tokio::sync::RwLockWriteGuard<'_, ()> {
        self.want.send_replace(true);
        self.gate.write().await
    }

    fn release(&self) {
        self.want.send_replace(false);
    }

    async fn until_allowed(&self) {
        let mut rx = self.want.subscribe();
        let _ = rx.wait_for(|w| !*w).await;
    }
}

/// What the publisher sent: every job confirmed, in order, with its kind.
#[derive(Default)]
struct Fed {
    jobs: Vec<Published>,
    kinds: BTreeMap<String, Kind>,
    /// Jobs published again after their batch failed (the test's own duplicates).
    republished: BTreeSet<String>,
    skipped_seconds: f64,
}

#[allow(clippy::too_many_arguments)]
/// Publish the mix at `rate` per second (in 100 ms steps, confirmed) until `stop`;
/// catching up after a pause is capped at one second of jobs.
async fn publish_steadily(
    url: String,
    s: Settings,
    ns: String,
    rate: f64,
    pause: Arc<Pause>,
    stop: CancellationToken,
    fed: Arc<Mutex<Fed>>,
    published: Arc<AtomicU64>,
    rolling: Arc<RollingCount>,
) {
    let zone = noon_zone();
    let chunk_size = chunk_for(rate);
    let mut rolled = 0usize;
    let mut pending: VecDeque<(Published, Kind)> = VecDeque::new();
    let mut chunk = 0usize;
    let mut conn: Option<(Connection, lapin::Channel)> = None;
    let started = Instant::now();
    let mut sent = 0u64;
    let mut skipped = 0.0f64;
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        pause.until_allowed().await;
        let _active = pause.gate.read().await;
        let mut due = (rate * started.elapsed().as_secs_f64() - skipped).max(0.0) as u64;
        if due > sent + rate as u64 {
            skipped += (due - sent - rate as u64) as f64;
            due = sent + rate as u64;
        }
        let n = due.saturating_sub(sent) as usize;
        if n == 0 {
            continue;
        }
        while pending.len() < n {
            let mix = Mix::new(&format!("{ns}-{chunk}"), chunk_size, &zone);
            chunk += 1;
            for mut j in mix.jobs {
                let k = mix.kinds[&j.id];
                if k == Kind::Rolling {
                    j = in_threes(j, rolled, Mix::rolling_recipients(chunk_size), &zone);
                    rolled += 1;
                }
                pending.push_back((j, k));
            }
        }
        let batch: Vec<(Published, Kind)> = pending.drain(..n).collect();
        let mut attempt = 0;
        loop {
            if conn.is_none() {
                let c = connect(&url).await;
                let ch = c.create_channel().await.expect("channel");
                ch.confirm_select(ConfirmSelectOptions::default())
                    .await
                    .expect("confirms");
                conn = Some((c, ch));
            }
            let ch = &conn.as_ref().unwrap().1;
            let mut ok = true;
            let mut confirms = Vec::with_capacity(batch.len());
            for (j, _) in &batch {
                match ch
                    .basic_publish(
                        s.amqp.jobs_exchange.as_str().into(),
                        "".into(),
                        BasicPublishOptions::default(),
                        &j.body,
                        j.props(),
                    )
                    .await
                {
                    Ok(c) => confirms.push(c),
                    Err(_) => {
                        ok = false;
                        break;
                    }
                }
            }
            for c in confirms {
                if !matches!(c.await, Ok(conf) if conf.is_ack()) {
                    ok = false;
                }
            }
            if ok {
                break;
            }
            attempt += 1;
            eprintln!("soak publisher: batch of {n} failed (attempt {attempt}); again");
            conn = None;
            fed.lock()
                .unwrap()
                .republished
                .extend(batch.iter().map(|(j, _)| j.id.clone()));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        sent += n as u64;
        published.fetch_add(n as u64, Ordering::Relaxed);
        let rolled = batch.iter().filter(|(_, k)| *k == Kind::Rolling).count();
        rolling
            .published
            .fetch_add(rolled as u64, Ordering::Relaxed);
        let mut guard = fed.lock().unwrap();
        let f = &mut *guard;
        for (j, k) in batch {
            f.kinds.insert(j.id.clone(), k);
            // the body is not needed by the audit: keep an hour of jobs small
            f.jobs.push(Published {
                id: j.id,
                recipient: j.recipient,
                body: Vec::new(),
            });
        }
        f.skipped_seconds = skipped / rate;
        drop(guard);
    }
    if let Some((c, ch)) = conn {
        let _ = ch.close(200, "done".into()).await;
        let _ = c.close(200, "done".into()).await;
    }
}

/// What the downstream consumer took from the dispatch queue, in order.
#[derive(Default)]
struct Taken {
    /// id -> positions (the order of the dispatch queue).
    dispatched: BTreeMap<String, Vec<usize>>,
    count: usize,
    /// Deliveries the broker gave again (`redelivered`) of an id already taken:
    /// the consumer's own doing (an ack lost with its connection), not a dispatch.
    redelivered_again: usize,
}

/// Take the dispatches as they come (manual acks), until `stop`; stand aside while
/// the broker restarts.
async fn take_dispatches(
    url: String,
    queue: String,
    pause: Arc<Pause>,
    stop: CancellationToken,
    taken: Arc<Mutex<Taken>>,
    rolling: Arc<RollingCount>,
) {
    let mut want = pause.want.subscribe();
    'session: loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = pause.until_allowed() => {}
        }
        let _active = pause.gate.read().await;
        let conn = connect(&url).await;
        let Ok(ch) = conn.create_channel().await else {
            continue;
        };
        let _ = ch.basic_qos(500, BasicQosOptions::default()).await;
        let Ok(mut consumer) = ch
            .basic_consume(
                queue.as_str().into(),
                "soak-downstream".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
        else {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        };
        if *want.borrow_and_update() {
            // a pause asked for while this session was starting
            let _ = ch.close(200, "pause".into()).await;
            let _ = conn.close(200, "pause".into()).await;
            continue;
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    let _ = ch.basic_cancel("soak-downstream".into(), BasicCancelOptions::default()).await;
                    let _ = ch.close(200, "done".into()).await;
                    let _ = conn.close(200, "done".into()).await;
                    return;
                }
                _ = want.changed() => {
                    if *want.borrow() {
                        let _ = ch.basic_cancel("soak-downstream".into(), BasicCancelOptions::default()).await;
                        let _ = ch.close(200, "pause".into()).await;
                        let _ = conn.close(200, "pause".into()).await;
                        continue 'session;
                    }
                }
                d = consumer.next() => match d {
                    Some(Ok(d)) => {
                        let id = d
                            .properties
                            .message_id()
                            .as_ref()
                            .map(|m| m.as_str().to_string())
                            .unwrap_or_default();
                        {
                            let mut t = taken.lock().unwrap();
                            if d.redelivered && t.dispatched.contains_key(&id) {
                                t.redelivered_again += 1;
                            } else {
                                let pos = t.count;
                                let kind = Kind::of_id(&id);
                                let at = t.dispatched.entry(id).or_default();
                                if at.is_empty() && kind == Some(Kind::Rolling) {
                                    rolling.dispatched.fetch_add(1, Ordering::Relaxed);
                                }
                                at.push(pos);
                                t.count += 1;
                            }
                        }
                        let _ = d.acker.ack(BasicAckOptions::default()).await;
                    }
                    _ => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        continue 'session;
                    }
                },
            }
        }
    }
}

/// The faults in turn: `QW_SOAK_FAULTS` (names separated by commas, e.g.
/// `reload,kill9`), else kill -9, broker restart, Redis restart, connections cut,
/// reload.
fn fault_order() -> Vec<&'static str> {
    const ALL: [&str; 5] = [
        "kill9",
        "broker_restart",
        "redis_restart",
        "proxy_cut",
        "reload",
    ];
    let Ok(asked) = std::env::var("QW_SOAK_FAULTS") else {
        return ALL.to_vec();
    };
    asked
        .split(',')
        .map(|k| {
            let k = k.trim();
            *ALL.iter()
                .find(|a| **a == k)
                .unwrap_or_else(|| panic!("QW_SOAK_FAULTS: no fault `{k}` (one of {ALL:?})"))
        })
        .collect()
}

/// One sample of the run.
#[derive(Clone, Debug, serde::Serialize)]
struct Sample {
    t: f64,
    pids: [u32; WORKERS],
    rss_kib: [Option<u64>; WORKERS],
    fds: [Option<u64>; WORKERS],
    fd_kinds: [BTreeMap<String, u32>; WORKERS],
    redis_used_memory: Option<u64>,
    jobs_queue: Option<u32>,
    dispatch_queue: Option<u32>,
    dead_queue: Option<u32>,
    /// The delay ladder and the lanes.
    waiting: Option<u32>,
    /// The lanes alone.
    lanes: Option<u32>,
    /// Each lane queue's, in the order of `Topology::lane_queues`.
    lane_depths: Option<Vec<u32>>,
    /// Taken downstream plus still in the dispatch queue (copies included).
    dispatched: Option<u64>,
    published: u64,
    /// Each worker's [`lane_metrics`], every `QW_SOAK_METRICS` seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    worker_metrics: Option<Vec<BTreeMap<String, f64>>>,
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

fn fd_count(pid: u32) -> Option<u64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64)
}

/// A process's open descriptors by what they are (`socket`, `anon_inode:[eventpoll]`,
/// `pipe`, a path), to tell which kind grows.
fn fd_kinds(pid: u32) -> BTreeMap<String, u32> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        let kind = t.split(":[").next().unwrap_or(&t).to_string();
        let kind = if kind == "anon_inode" {
            t.to_string()
        } else {
            kind
        };
        *out.entry(kind).or_default() += 1;
    }
    out
}

async fn redis_used_memory(url: &str) -> Option<u64> {
    let client = redis::Client::open(url).ok()?;
    let mut c = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .ok()?
    .ok()?;
    let info: String = tokio::time::timeout(
        Duration::from_secs(2),
        redis::cmd("INFO").arg("memory").query_async(&mut c),
    )
    .await
    .ok()?
    .ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Ready messages of the delay ladder's queues.
async fn ladder_depth(conn: &Connection, s: &Settings) -> Option<u32> {
    let ladder = topology(s).ladder();
    let mut n = 0;
    for level in 0..ladder.levels {
        n += depth(conn, &ladder.queue(level)).await?;
    }
    Some(n)
}

/// Each lane queue's last name part, ready messages and consumers, in the order of
/// `Topology::lane_queues`.
async fn lane_states(conn: &Connection, s: &Settings) -> Option<Vec<(String, u32, u32)>> {
    let mut out = Vec::new();
    for (q, ..) in topology(s).lane_queues() {
        let info = testkit::inspect(conn, &q).await?;
        let short = q.rsplit('.').next().unwrap_or(&q).to_string();
        out.push((short, info.message_count(), info.consumer_count()));
    }
    Some(out)
}

/// Everything dispatched so far: taken downstream plus waiting in the dispatch queue.
async fn dispatched_now(conn: &Connection, dispatch: &str, taken: &Mutex<Taken>) -> Option<u64> {
    let d = depth(conn, dispatch).await?;
    Some(taken.lock().unwrap().count as u64 + d as u64)
}

#[allow(clippy::too_many_arguments)]
async fn sample_every(
    (every, metrics_every, ports): (Duration, Duration, [u16; WORKERS]),
    url: String,
    s: Settings,
    pids: Arc<Mutex<[u32; WORKERS]>>,
    taken: Arc<Mutex<Taken>>,
    published: Arc<AtomicU64>,
    rolling: Arc<RollingCount>,
    started: Instant,
    stop: CancellationToken,
    out: Arc<Mutex<Vec<Sample>>>,
) {
    let dispatch = topology(&s).dispatch_queue("sms");
    let mut conn: Option<Connection> = None;
    let mut tick = tokio::time::interval(every);
    let mut scraped: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let t = started.elapsed().as_secs_f64();
        let worker_metrics = if scraped.is_none_or(|at| at.elapsed() >= metrics_every) {
            scraped = Some(Instant::now());
            let mut each = Vec::with_capacity(WORKERS);
            for (i, port) in ports.iter().enumerate() {
                let m = lane_metrics(*port).await;
                eprintln!("soak: t={t:.0} s worker {i} metrics: {}", compact(&m));
                each.push(m);
            }
            Some(each)
        } else {
            None
        };
        let p = *pids.lock().unwrap();
        let rss = p.map(rss_kib);
        let fds = p.map(fd_count);
        let kinds = p.map(fd_kinds);
        let used = redis_used_memory(&s.redis.url).await;
        if conn.as_ref().is_none_or(|c| !c.status().connected()) {
            conn = tokio::time::timeout(
                Duration::from_secs(2),
                Connection::connect(&url, ConnectionProperties::default()),
            )
            .await
            .ok()
            .and_then(|c| c.ok());
        }
        let (jq, dq, xq, ladder, lanes) = match &conn {
            Some(c) => (
                depth(c, &s.amqp.jobs_queue).await,
                depth(c, &dispatch).await,
                depth(c, &s.amqp.dead_queue).await,
                ladder_depth(c, &s).await,
                lane_states(c, &s).await,
            ),
            None => (None, None, None, None, None),
        };
        // taken downstream plus still in the dispatch queue
        let d = dq.map(|dq| taken.lock().unwrap().count as u64 + dq as u64);
        let lane_depths: Option<Vec<u32>> = lanes.as_ref().map(|l| l.iter().map(|x| x.1).collect());
        let in_lanes = lane_depths.as_ref().map(|l| l.iter().sum::<u32>());
        if let Some(lanes) = &lanes {
            // one line a sample while it runs: each lane queue's ready depth and
            // consumers, so a lane that stops draining shows when it stops
            let lanes: String = lanes
                .iter()
                .map(|(q, ready, consumers)| format!(" {q}={ready}/{consumers}c"))
                .collect();
            let rolled = rolling.published.load(Ordering::Relaxed);
            let rolled_out = rolling.dispatched.load(Ordering::Relaxed);
            eprintln!(
                "soak: t={t:.0} s jobs={} dispatch={} lanes:{lanes} dispatched={} published={} rolling waiting={}",
                jq.map_or("?".into(), |v| v.to_string()),
                dq.map_or("?".into(), |v| v.to_string()),
                d.map_or("?".into(), |v| v.to_string()),
                published.load(Ordering::Relaxed),
                rolled.saturating_sub(rolled_out)
            );
        }
        out.lock().unwrap().push(Sample {
            t,
            pids: p,
            rss_kib: rss,
            fds,
            fd_kinds: kinds,
            redis_used_memory: used,
            jobs_queue: jq,
            dispatch_queue: dq,
            dead_queue: xq,
            waiting: ladder.zip(in_lanes).map(|(l, n)| l + n),
            lanes: in_lanes,
            lane_depths,
            dispatched: d,
            published: published.load(Ordering::Relaxed),
            worker_metrics,
        });
    }
}

/// A soak worker: `quota-worker run` for `s`, its metrics served on `port`.
fn serving(s: &Settings, dir: &std::path::Path, tag: &str, port: u16) -> WorkerProc {
    let mut s = s.clone();
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{port}");
    WorkerProc::spawn_serving(crate::BIN, &s, dir, tag)
}

/// The metrics that show where a worker's jobs go (outcomes, delays, each lane's
/// parks and takes, its parks without asking, the prefetch it holds, how far ahead
/// its lane lines take slots, in flight),
/// each series as exported (name and labels) with its value, those at 0 left out;
/// empty when the worker does not answer.
async fn lane_metrics(port: u16) -> BTreeMap<String, f64> {
    const KEPT: [&str; 8] = [
        "quota_worker_jobs_total",
        "quota_worker_delays_total",
        "quota_worker_lane_jobs_total",
        "quota_worker_lane_parked_unasked_total",
        "quota_worker_lane_prefetch",
        "quota_worker_lane_look_ahead_seconds",
        "quota_worker_in_flight",
        "quota_worker_channel_rate",
    ];
    let Some((200, body)) = http_get(&format!("127.0.0.1:{port}"), "/metrics").await else {
        return BTreeMap::new();
    };
    body.lines()
        .filter(|l| {
            KEPT.iter().any(|k| {
                l.strip_prefix(k)
                    .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
        })
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            // the series every worker registers at 0 say nothing
            (value != 0.0).then(|| (series.to_string(), value))
        })
        .collect()
}

/// One line of [`lane_metrics`]: each series without its metric's common prefix.
fn compact(m: &BTreeMap<String, f64>) -> String {
    if m.is_empty() {
        return "(no answer)".into();
    }
    m.iter()
        .map(|(k, v)| format!("{}={v}", k.trim_start_matches("quota_worker_")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The ceiling: `n` uncapped jobs published first, then drained by three workers
/// through the proxy, the channel unpaced. Returns jobs/s between a tenth and nine
/// tenths of them dispatched.
async fn ceiling(node_url: &str, proxy_url: &str, redis: &RedisServer, n: usize) -> f64 {
    let ns = unique("soakceil");
    let mut s = fault_settings(&ns, 1_000_000);
    s.amqp.url = proxy_url.to_string();
    s.redis.url = redis.url();
    let conn = connect(node_url).await;
    topology(&s).declare(&conn).await.expect("topology");
    let mix = Mix::new(&ns, n * 100 / 80 + 100, &noon_zone());
    let jobs: Vec<Published> = mix
        .jobs
        .into_iter()
        .filter(|j| mix.kinds[&j.id] == Kind::Free)
        .take(n)
        .collect();
    publish_all(&conn, &s, &jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let dir = testkit::temp_dir("soakceil");
    let workers: Vec<WorkerProc> = (0..WORKERS)
        .map(|i| WorkerProc::spawn(crate::BIN, &s, &dir, &format!("ceiling-{i}")))
        .collect();
    let started = Instant::now();
    let (mut t10, mut t90) = (None, None);
    while t90.is_none() {
        let d = depth(&conn, &dispatch).await.unwrap_or(0) as usize;
        if t10.is_none() && d >= n / 10 {
            t10 = Some((Instant::now(), d));
        }
        if d >= n * 9 / 10 {
            t90 = Some((Instant::now(), d));
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the ceiling's backlog was not drained: {d} of {n}:\n{}",
            workers[0].tail(20)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ((a, da), (b, db)) = (t10.unwrap(), t90.unwrap());
    let rate = (db - da) as f64 / (b - a).as_secs_f64();
    end_measure(workers, &dir, &s, conn, redis, "ceiling").await;
    rate
}

/// The sustained ceiling: the soak's own loop for `secs` (the mix published at
/// `offered` jobs/s, more than it can take, confirmed; three workers through the
/// proxy, the channel paced at `offered`; the downstream consumer taking the
/// dispatches). Returns the jobs/s taken from the jobs queue (published less what
/// the queue gained) over the run after its first third. The drain's ceiling leaves
/// out what the soak adds to every job (its publish and confirm, the mix's delays
/// and dead letters, the downstream consumer), about as much broker work again:
/// a third of the drain's ceiling was more than the two cores sustained (2026-11-26,
/// the jobs queue grew by 1,000 to 2,500 jobs a second).
async fn sustained(
    node_url: &str,
    proxy_url: &str,
    redis: &RedisServer,
    offered: f64,
    secs: f64,
) -> f64 {
    let ns = unique("soaksus");
    let mut s = fault_settings(&ns, offered.round() as u64);
    s.amqp.url = proxy_url.to_string();
    s.redis.url = redis.url();
    let conn = connect(node_url).await;
    topology(&s).declare(&conn).await.expect("topology");
    let dir = testkit::temp_dir("soaksus");
    let workers: Vec<WorkerProc> = (0..WORKERS)
        .map(|i| WorkerProc::spawn(crate::BIN, &s, &dir, &format!("sustained-{i}")))
        .collect();
    consuming_again(&conn, &s, Instant::now(), tails(&workers)).await;
    let (pause, stop) = (Pause::new(), CancellationToken::new());
    let published = Arc::new(AtomicU64::new(0));
    let feeder = tokio::spawn(publish_steadily(
        node_url.to_string(),
        s.clone(),
        ns.clone(),
        offered,
        pause.clone(),
        stop.clone(),
        Arc::new(Mutex::new(Fed::default())),
        published.clone(),
        Arc::default(),
    ));
    let taker = tokio::spawn(take_dispatches(
        node_url.to_string(),
        topology(&s).dispatch_queue("sms"),
        pause,
        stop.clone(),
        Arc::new(Mutex::new(Taken::default())),
        Arc::default(),
    ));
    let reading = || async {
        let depth = depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(0) as f64;
        (
            Instant::now(),
            published.load(Ordering::Relaxed) as f64,
            depth,
        )
    };
    tokio::time::sleep(Duration::from_secs_f64(secs / 3.0)).await;
    let (t0, p0, d0) = reading().await;
    tokio::time::sleep(Duration::from_secs_f64(secs * 2.0 / 3.0)).await;
    let (t1, p1, d1) = reading().await;
    stop.cancel();
    let _ = feeder.await;
    let _ = taker.await;
    end_measure(workers, &dir, &s, conn, redis, "sustained").await;
    ((p1 - p0) - (d1 - d0)) / (t1 - t0).as_secs_f64()
}

/// The end of a ceiling's measure: its workers stopped (none panicked), its queues
/// deleted, and its Redis records too (they are not the soak's memory).
async fn end_measure(
    mut workers: Vec<WorkerProc>,
    dir: &std::path::Path,
    s: &Settings,
    conn: Connection,
    redis: &RedisServer,
    label: &str,
) {
    for w in &mut workers {
        tokio::task::block_in_place(|| w.stop());
    }
    let panics = worker_panics(dir);
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    let _ = topology(s).delete(&conn).await;
    let _ = conn.close(200, label.into()).await;
    let mut r = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", s.redis.key_prefix))
        .query(&mut r)
        .unwrap_or_default();
    for k in keys {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(k).query(&mut r);
    }
}

/// One fault as it happened.
#[derive(Debug, Clone, serde::Serialize)]
struct Fault {
    kind: &'static str,
    at_seconds: f64,
    /// Dispatches (copies) before it: duplicates it causes have their first copy
    /// just before this position.
    dispatched_before: usize,
    /// Until the workers consumed again (kill, broker, cut) or the next dispatch
    /// (Redis); none for a reload.
    recovery_seconds: Option<f64>,
    /// When the fault and the recovery from it were over.
    ended_seconds: f64,
    detail: String,
}

/// The median of `v` (none when empty).
fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    Some(v[v.len() / 2])
}

/// Each worker process: the medians of its RSS and descriptors over the first and
/// the last quarter of its life within the run, counted from the end of the first
/// broker restart it lived through (`outages`): the first time a worker's broker
/// connection is lost and does not come straight back, its AMQP client starts a
/// runtime of its own, once per process: four more descriptors (epolls, an eventfd,
/// a copy of the signal socket) for good, 13 to 17 here. Judged when that span is at
/// least a third of the run (a worker killed late is too young).
fn flatness(samples: &[Sample], run: f64, outages: &[f64]) -> Vec<Value> {
    let mut out = Vec::new();
    for slot in 0..WORKERS {
        let mut pids: Vec<u32> = samples.iter().map(|s| s.pids[slot]).collect();
        pids.dedup();
        for pid in pids {
            let mine: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.pids[slot] == pid && s.rss_kib[slot].is_some())
                .collect();
            let (Some(first), Some(last)) = (mine.first(), mine.last()) else {
                continue;
            };
            let (born, to) = (first.t, last.t);
            // from the end of the first broker outage it lived through
            let from = outages
                .iter()
                .copied()
                .find(|&o| o > born && o < to)
                .unwrap_or(born);
            let life = to - from;
            let quarter = |lo: f64, hi: f64, f: &dyn Fn(&Sample) -> Option<u64>| {
                median(
                    mine.iter()
                        .filter(|s| s.t >= lo && s.t <= hi)
                        .filter_map(|s| f(s).map(|v| v as f64))
                        .collect(),
                )
            };
            let rss = |s: &Sample| s.rss_kib[slot];
            let fds = |s: &Sample| s.fds[slot];
            let q1 = from + life / 4.0;
            let q3 = to - life / 4.0;
            let (r1, r4) = (quarter(from, q1, &rss), quarter(q3, to, &rss));
            let (f1, f4) = (quarter(from, q1, &fds), quarter(q3, to, &fds));
            let change = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if a > 0.0 => Some((b - a) / a),
                _ => None,
            };
            let judged = life >= run / 3.0;
            let fds_at_birth = first.fds[slot];
            let fds_at_end = last.fds[slot];
            let (rc, fc) = (change(r1, r4), change(f1, f4));
            out.push(json!({
                "slot": slot,
                "pid": pid,
                "born_seconds": born,
                "from_seconds": from,
                "to_seconds": to,
                "fds_at_birth": fds_at_birth,
                "fds_at_end": fds_at_end,
                "judged": judged,
                "rss_kib_first_quarter": r1,
                "rss_kib_last_quarter": r4,
                "rss_change": rc,
                "fds_first_quarter": f1,
                "fds_last_quarter": f4,
                "fds_change": fc,
                "flat": !judged || (rc.is_some_and(|c| c.abs() <= 0.10) && fc.is_some_and(|c| c.abs() <= 0.10)),
            }));
        }
    }
    out
}

/// Redis memory against its bound at every sample: `baseline + BYTES_PER_SEND ×
/// dispatched + REDIS_SLACK`. Returns (the largest bytes per dispatched send beyond
/// the baseline in the last quarter, samples over the bound).
fn redis_bound(samples: &[Sample], baseline: f64, run: f64) -> (Option<f64>, Vec<String>) {
    let mut over = Vec::new();
    let mut last_quarter = Vec::new();
    for s in samples {
        let (Some(used), Some(d)) = (s.redis_used_memory, s.dispatched) else {
            continue;
        };
        let bound = baseline + BYTES_PER_SEND * d as f64 + REDIS_SLACK;
        if used as f64 > bound {
            over.push(format!(
                "{:.0} s: used_memory {used} > {bound:.0} ({d} dispatched)",
                s.t
            ));
        }
        if s.t >= run * 0.75 && d > 0 {
            last_quarter.push((used as f64 - baseline) / d as f64);
        }
    }
    (median(last_quarter), over)
}

fn plot(samples: &[Sample], faults: &[Fault], run: f64, ceiling: f64, rate: f64) -> String {
    let colors = ["steelblue", "darkorange", "seagreen"];
    let mut rate_pts = Vec::new();
    let mut prev: Option<(f64, u64)> = None;
    for s in samples {
        if let Some(d) = s.dispatched {
            if let Some((t0, d0)) = prev {
                if s.t > t0 {
                    rate_pts.push((s.t, d.saturating_sub(d0) as f64 / (s.t - t0)));
                }
            }
            prev = Some((s.t, d));
        }
    }
    let per_slot = |f: &dyn Fn(&Sample, usize) -> Option<f64>| -> Vec<Series> {
        (0..WORKERS)
            .map(|slot| Series {
                name: format!("worker {slot}"),
                color: colors[slot],
                points: samples
                    .iter()
                    .filter_map(|s| f(s, slot).map(|v| (s.t, v)))
                    .collect(),
            })
            .collect()
    };
    let panels = vec![
        Panel {
            title: format!(
                "Dispatched per second (published at {rate:.0}/s, a third of the ceiling {ceiling:.0}/s)"
            ),
            series: vec![Series {
                name: "dispatched/s".into(),
                color: "black",
                points: rate_pts,
            }],
        },
        Panel {
            title: "Worker RSS (MiB)".into(),
            series: per_slot(&|s, i| s.rss_kib[i].map(|k| k as f64 / 1024.0)),
        },
        Panel {
            title: "Worker open file descriptors".into(),
            series: per_slot(&|s, i| s.fds[i].map(|n| n as f64)),
        },
        Panel {
            title: "Redis used_memory (MiB)".into(),
            series: vec![Series {
                name: "used_memory".into(),
                color: "purple",
                points: samples
                    .iter()
                    .filter_map(|s| s.redis_used_memory.map(|m| (s.t, m as f64 / 1048576.0)))
                    .collect(),
            }],
        },
    ];
    let marks: Vec<(f64, String)> = faults
        .iter()
        .map(|f| (f.at_seconds, f.kind.to_string()))
        .collect();
    timeline::render(
        &format!(
            "Soak: three workers, {:.0} min, a fault every {:.0} s in turn",
            run / 60.0,
            faults
                .get(1)
                .map(|f| f.at_seconds - faults[0].at_seconds)
                .unwrap_or(run)
        ),
        run,
        &panels,
        &marks,
    )
}

/// Wait until the three workers consume the jobs queue again, from `since`.
async fn consuming_again(conn: &Connection, s: &Settings, since: Instant, tails: String) -> f64 {
    wait_consumers(
        conn,
        &s.amqp.jobs_queue,
        WORKERS as u32,
        Duration::from_secs(120),
    )
    .await
    .unwrap_or_else(|| panic!("the workers did not all consume again:\n{tails}"));
    since.elapsed().as_secs_f64()
}

fn tails(workers: &[WorkerProc]) -> String {
    workers
        .iter()
        .map(|w| format!("{}:\n{}", w.log.display(), w.tail(15)))
        .collect::<Vec<_>>()
        .join("\n")
}

fn count_in_logs(dir: &std::path::Path, needle: &str) -> usize {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("worker-w"))
        .map(|e| {
            std::fs::read_to_string(e.path())
                .unwrap_or_default()
                .matches(needle)
                .count()
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "an hour long: bench/soak.sh runs it"]
async fn soak() {
    let _heavy = heavy().await;
    let minutes = env_f64("QW_SOAK_MINUTES", 60.0);
    let fault_every = Duration::from_secs_f64(env_f64("QW_SOAK_FAULT_EVERY", 600.0));
    let sample = Duration::from_secs_f64(env_f64("QW_SOAK_SAMPLE", 5.0));
    let metrics_every = Duration::from_secs_f64(env_f64("QW_SOAK_METRICS", 60.0));
    let ceiling_jobs = env_f64("QW_SOAK_CEILING_JOBS", 20_000.0) as usize;
    let sustained_secs = env_f64("QW_SOAK_SUSTAINED_SECS", 45.0);
    let run = Duration::from_secs_f64(minutes * 60.0);
    let Some(mut guard) = private_node().await else {
        panic!("the soak needs /usr/lib/rabbitmq/bin/rabbitmq-server for its private node");
    };
    let (node, _boot) = &mut *guard;
    let node_url = node.url();
    let mut redis = RedisServer::with_aof("everysec");
    let proxy = Proxy::start(([127, 0, 0, 1], node.port).into());
    let proxy_url = format!("amqp://guest:guest@{}/%2f", proxy.addr());

    let drain = ceiling(&node_url, &proxy_url, &redis, ceiling_jobs).await;
    let ceiling = sustained(&node_url, &proxy_url, &redis, drain, sustained_secs)
        .await
        .min(drain);
    let rate = (ceiling / 3.0).floor().max(1.0);
    eprintln!("soak: ceiling {ceiling:.0} jobs/s sustained (the drain's {drain:.0}); publishing {rate:.0}/s for {minutes} min, a fault every {fault_every:?}; the feed in chunks of {}", chunk_for(rate));

    let ns = unique("soak");
    let mut s = fault_settings(&ns, ceiling.round() as u64);
    s.amqp.url = proxy_url.clone();
    s.redis.url = redis.url();
    let mut conn = connect(&node_url).await;
    topology(&s).declare(&conn).await.expect("topology");
    let dispatch = topology(&s).dispatch_queue("sms");
    let baseline = redis_used_memory(&redis.url()).await.unwrap_or(0) as f64;
    let dir = testkit::temp_dir("soak");
    let mut generation = [0usize; WORKERS];
    // each worker serves its metrics on a port of its own: the sampler reads its lane
    // counters every `QW_SOAK_METRICS` seconds
    let ports: [u16; WORKERS] = std::array::from_fn(|_| free_port(None));
    let mut workers: Vec<WorkerProc> = (0..WORKERS)
        .map(|i| serving(&s, &dir, &format!("w{i}-0"), ports[i]))
        .collect();
    let pids = Arc::new(Mutex::new([0u32; WORKERS]));
    *pids.lock().unwrap() = std::array::from_fn(|i| workers[i].pid());
    consuming_again(&conn, &s, Instant::now(), tails(&workers)).await;

    let pause = Pause::new();
    let stop_feed = CancellationToken::new();
    let stop_taking = CancellationToken::new();
    let stop_sampling = CancellationToken::new();
    let fed = Arc::new(Mutex::new(Fed::default()));
    let taken = Arc::new(Mutex::new(Taken::default()));
    let published = Arc::new(AtomicU64::new(0));
    let rolling = Arc::new(RollingCount::default());
    let samples = Arc::new(Mutex::new(Vec::new()));
    let started = Instant::now();
    let feeder = tokio::spawn(publish_steadily(
        node_url.clone(),
        s.clone(),
        ns.clone(),
        rate,
        pause.clone(),
        stop_feed.clone(),
        fed.clone(),
        published.clone(),
        rolling.clone(),
    ));
    let taker = tokio::spawn(take_dispatches(
        node_url.clone(),
        dispatch.clone(),
        pause.clone(),
        stop_taking.clone(),
        taken.clone(),
        rolling.clone(),
    ));
    let sampler = tokio::spawn(sample_every(
        (sample, metrics_every, ports),
        node_url.clone(),
        s.clone(),
        pids.clone(),
        taken.clone(),
        published.clone(),
        rolling.clone(),
        started,
        stop_sampling.clone(),
        samples.clone(),
    ));

    let kinds = fault_order();
    let mut faults: Vec<Fault> = Vec::new();
    let mut kills = 0usize;
    let mut next = fault_every;
    while started.elapsed() < run {
        for (i, w) in workers.iter_mut().enumerate() {
            assert!(w.running(), "worker {i} exited by itself:\n{}", w.tail(40));
        }
        if started.elapsed() < next || next >= run {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        next += fault_every;
        let kind = kinds[faults.len() % kinds.len()];
        let at = started.elapsed().as_secs_f64();
        eprintln!("soak: {at:.0} s: {kind}");
        let fault = match kind {
            "kill9" => {
                let slot = kills % WORKERS;
                kills += 1;
                let t0 = Instant::now();
                workers[slot].kill9();
                wait_consumers(
                    &conn,
                    &s.amqp.jobs_queue,
                    (WORKERS - 1) as u32,
                    Duration::from_secs(10),
                )
                .await;
                let before = dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0) as usize;
                generation[slot] += 1;
                workers[slot] = serving(
                    &s,
                    &dir,
                    &format!("w{slot}-{}", generation[slot]),
                    ports[slot],
                );
                pids.lock().unwrap()[slot] = workers[slot].pid();
                let restarted = Instant::now();
                let back = consuming_again(&conn, &s, restarted, tails(&workers)).await;
                Fault {
                    kind: "kill -9",
                    at_seconds: at,
                    dispatched_before: before,
                    recovery_seconds: Some(back),
                    ended_seconds: started.elapsed().as_secs_f64(),
                    detail: format!(
                        "worker {slot} killed, restarted {:.2} s later, consuming {back:.2} s after its restart",
                        (restarted - t0).as_secs_f64()
                    ),
                }
            }
            "broker_restart" => {
                let held = pause.hold().await;
                let t0 = Instant::now();
                let _ = conn.close(200, "restart".into()).await;
                tokio::task::block_in_place(|| node.stop());
                tokio::time::sleep(Duration::from_secs(2)).await;
                node.start().await;
                let down = t0.elapsed().as_secs_f64();
                conn = connect(&node_url).await;
                let before = dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0) as usize;
                let up = Instant::now();
                drop(held);
                pause.release();
                let back = consuming_again(&conn, &s, up, tails(&workers)).await;
                Fault {
                    kind: "broker restart",
                    at_seconds: at,
                    dispatched_before: before,
                    recovery_seconds: Some(back),
                    ended_seconds: started.elapsed().as_secs_f64(),
                    detail: format!(
                        "rabbitmqctl stop, start: away {down:.1} s; the workers consumed again {back:.2} s after it was back"
                    ),
                }
            }
            "redis_restart" => {
                let before = dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0);
                let used_before = redis_used_memory(&redis.url()).await;
                let t0 = Instant::now();
                tokio::task::block_in_place(|| redis.stop());
                let stopped = t0.elapsed().as_secs_f64();
                tokio::task::block_in_place(|| redis.start())
                    .expect("redis-server restarts from its AOF");
                let down = t0.elapsed().as_secs_f64();
                let up = Instant::now();
                let at_start = dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0);
                let mut resumed = None;
                while up.elapsed() < Duration::from_secs(60) {
                    if dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0) > at_start {
                        resumed = Some(up.elapsed().as_secs_f64());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                let used_after = redis_used_memory(&redis.url()).await;
                Fault {
                    kind: "Redis restart",
                    at_seconds: at,
                    dispatched_before: before as usize,
                    recovery_seconds: resumed,
                    ended_seconds: started.elapsed().as_secs_f64(),
                    detail: format!(
                        "SHUTDOWN in {stopped:.2} s, back from its AOF {down:.2} s after the stop; used_memory {} before, {} after",
                        used_before.map_or("?".into(), |m| m.to_string()),
                        used_after.map_or("?".into(), |m| m.to_string())
                    ),
                }
            }
            "proxy_cut" => {
                let t0 = Instant::now();
                let cut_before = proxy.cut_connections();
                proxy.cut();
                tokio::time::sleep(Duration::from_millis(300)).await;
                let before = dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0) as usize;
                let back = consuming_again(&conn, &s, t0, tails(&workers)).await;
                Fault {
                    kind: "connections cut",
                    at_seconds: at,
                    dispatched_before: before,
                    recovery_seconds: Some(back),
                    ended_seconds: started.elapsed().as_secs_f64(),
                    detail: format!(
                        "{} connections through the proxy closed at once; all three workers consuming again {back:.2} s later",
                        proxy.cut_connections() - cut_before
                    ),
                }
            }
            _ => {
                // a live change: the channel's rate one higher, in the file the
                // workers (and any restarted later) read
                let before = count_in_logs(&dir, "channel `sms` changed");
                let full = ceiling.round() as u64;
                let now = s.channels["sms"].rate.unwrap_or(full);
                s.channels.get_mut("sms").unwrap().rate =
                    Some(if now == full { full * 9 / 10 } else { full });
                std::fs::write(dir.join("worker.toml"), testkit::env::worker_toml(&s)).unwrap();
                for w in &workers {
                    w.hup();
                }
                let t0 = Instant::now();
                while count_in_logs(&dir, "channel `sms` changed") < before + WORKERS
                    && t0.elapsed() < Duration::from_secs(10)
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let applied = count_in_logs(&dir, "channel `sms` changed") - before;
                let refused = count_in_logs(&dir, "configuration reload refused");
                assert_eq!(applied, WORKERS, "reloads logged:\n{}", tails(&workers));
                assert_eq!(refused, 0, "a reload was refused:\n{}", tails(&workers));
                let before = dispatched_now(&conn, &dispatch, &taken).await.unwrap_or(0) as usize;
                Fault {
                    kind: "reload",
                    at_seconds: at,
                    dispatched_before: before,
                    recovery_seconds: None,
                    ended_seconds: started.elapsed().as_secs_f64(),
                    detail: format!(
                        "SIGHUP to the three workers, the channel rate now {}/s: {applied} reloads applied in {:.2} s",
                        s.channels["sms"].rate.unwrap_or(0),
                        t0.elapsed().as_secs_f64()
                    ),
                }
            }
        };
        eprintln!("soak: {fault:?}");
        faults.push(fault);
    }
    let run_seconds = started.elapsed().as_secs_f64();

    // the end: publishing stops, the downstream consumer stops, the rest settles
    stop_feed.cancel();
    feeder.await.unwrap();
    stop_sampling.cancel();
    sampler.await.unwrap();
    stop_taking.cancel();
    taker.await.unwrap();
    let (jobs, kinds_of, republished, skipped_seconds) = {
        let mut f = fed.lock().unwrap();
        (
            std::mem::take(&mut f.jobs),
            std::mem::take(&mut f.kinds),
            std::mem::take(&mut f.republished),
            f.skipped_seconds,
        )
    };
    let mix = Mix {
        jobs,
        kinds: kinds_of,
    };
    let taken = std::mem::take(&mut *taken.lock().unwrap());
    let remaining = mix
        .expected_dispatched()
        .saturating_sub(taken.dispatched.len());
    let settled = wait_until_quiet(
        &conn,
        &s,
        remaining,
        mix.count(Kind::Malformed),
        Duration::from_secs(600),
    )
    .await;
    let quiet_at = Instant::now();
    let mut exits = Vec::new();
    for w in &mut workers {
        exits.push(tokio::task::block_in_place(|| w.stop()));
    }
    let mut audit = Audit::collect(&conn, &s, &mix.jobs).await;
    // the dispatches taken downstream came first, in this order
    for positions in audit.dispatched.values_mut() {
        for p in positions.iter_mut() {
            *p += taken.count;
        }
    }
    for (id, mut positions) in taken.dispatched {
        let entry = audit.dispatched.entry(id).or_default();
        positions.append(entry);
        *entry = positions;
    }
    let end = judge(&s, &mix, audit, settled, quiet_at, exits).await;
    let a = &end.audit;
    if !end.settled {
        explain_stuck(a, &mix, &workers[0]);
    }

    // every duplicate dispatch and the fault that explains it
    let prefetch = s.amqp.prefetch as usize;
    let at = |kind: &str| -> Vec<usize> {
        faults
            .iter()
            .filter(|f| f.kind == kind)
            .map(|f| f.dispatched_before)
            .collect()
    };
    let mut unexplained: Option<BTreeSet<String>> = None;
    let mut by_cause = serde_json::Map::new();
    for (cause, window) in [
        ("kill -9", prefetch),
        ("broker restart", WORKERS * prefetch),
        ("connections cut", WORKERS * prefetch),
    ] {
        let (explained, farthest, left) = explain_duplicates(a, &at(cause), window);
        by_cause.insert(
            cause.into(),
            json!({"duplicates": explained, "farthest_before_fault": farthest, "window": window}),
        );
        let left: BTreeSet<String> = left.into_iter().collect();
        unexplained = Some(match unexplained {
            None => left,
            Some(u) => u.intersection(&left).cloned().collect(),
        });
    }
    let unexplained: Vec<String> = unexplained
        .unwrap_or_default()
        .into_iter()
        .filter(|u| !republished.contains(u.split(' ').next().unwrap_or("")))
        .collect();

    let samples = std::mem::take(&mut *samples.lock().unwrap());
    let outages: Vec<f64> = faults
        .iter()
        .filter(|f| f.kind == "broker restart")
        .map(|f| f.ended_seconds)
        .collect();
    let flat = flatness(&samples, run_seconds, &outages);
    // after each fault: the time until the jobs queue and the lanes are back to their
    // depth before it, while the load goes on (the faults but the reload)
    let depths: Vec<Depths> = samples
        .iter()
        .map(|x| Depths {
            t: x.t,
            jobs_queue: x.jobs_queue,
            lanes: x.lane_depths.clone(),
        })
        .collect();
    let catch_up: Vec<Value> = faults
        .iter()
        .filter(|f| f.kind != "reload")
        .map(|f| {
            json!({
                "kind": f.kind,
                "at_seconds": f.at_seconds,
                "catch_up_seconds": catch_up_seconds(&depths, f.at_seconds, f.ended_seconds),
            })
        })
        .collect();
    let slow: Vec<&Value> = catch_up
        .iter()
        .filter(|c| {
            c["catch_up_seconds"]
                .as_f64()
                .is_none_or(|x| x > CATCH_UP_SECONDS)
        })
        .collect();
    let catch_up_max = catch_up
        .iter()
        .map(|c| c["catch_up_seconds"].as_f64().unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max);
    let not_flat: Vec<&Value> = flat.iter().filter(|f| f["flat"] == false).collect();
    let (bytes_per_send, over_bound) = redis_bound(&samples, baseline, run_seconds);
    let peak_redis = samples
        .iter()
        .filter_map(|s| s.redis_used_memory)
        .max()
        .unwrap_or(0);
    let svg = plot(&samples, &faults, run_seconds, ceiling, rate);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let results = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
        .join("reliability");
    let _ = std::fs::create_dir_all(&results);
    std::fs::write(results.join("soak.svg"), &svg).unwrap();
    let writing = std::env::var("QW_WRITE_RELIABILITY").is_ok_and(|v| v == "1");
    if writing {
        std::fs::write(root.join("docs/soak.svg"), &svg).unwrap();
    }
    let resets = count_in_logs(&dir, "redis lost its data");
    let max_recovery = faults
        .iter()
        .filter_map(|f| f.recovery_seconds)
        .fold(0.0, f64::max);
    let mut figures = json!({
        "scenario": "soak",
        "mode": if minutes >= 60.0 { "long" } else { "quick" },
        "test": "tests/faults/soak.rs: soak (bench/soak.sh)",
        "minutes": minutes,
        "fault_every_seconds": fault_every.as_secs_f64(),
        "sample_seconds": sample.as_secs_f64(),
        "workers": WORKERS,
        "ceiling_jobs": ceiling_jobs,
        "ceiling_jobs_per_second": ceiling,
        "rate_per_second": rate,
        "jobs": mix.jobs.len(),
        "faults": faults.len(),
        "fault_list": faults,
        "fault": faults.iter().map(|f| f.kind).collect::<Vec<_>>().join(", "),
        "duplicates": a.duplicate_dispatches(),
        "duplicates_by_cause": by_cause,
        "duplicates_unexplained": unexplained.len(),
        "duplicate_waiting_copies": a.duplicate_waiting(),
        "duplicate_dead_letters": a.duplicate_dead(),
        "downstream_redelivered_again": taken.redelivered_again,
        "publisher_republished": republished.len(),
        "publisher_skipped_seconds": skipped_seconds,
        "violations": end.broken().len(),
        "uncommitted_after_kills": end.uncommitted.len(),
        "in_two_places": end.twice.len(),
        "wrong_dead": end.wrong_dead.len(),
        "redis_resets_logged": resets,
        "recovery_seconds": max_recovery,
        "dispatched": a.dispatched.len(),
        "waiting": a.waiting.len(),
        "dead": a.dead.len(),
        "processes": flat,
        "redis_baseline_bytes": baseline,
        "redis_peak_bytes": peak_redis,
        "redis_bytes_per_send_last_quarter": bytes_per_send,
        "redis_bound": format!("baseline + {BYTES_PER_SEND} bytes × dispatched + {} MiB", REDIS_SLACK / 1048576.0),
        "redis_over_bound": over_bound.len(),
        "run_seconds": run_seconds,
        "settle_seconds": (quiet_at - started).as_secs_f64() - run_seconds,
        "plot": "docs/soak.svg",
    });
    // the drain's ceiling and how long the sustained one was measured (beside the
    // ceiling, the lower of the two)
    figures["drain_ceiling_jobs_per_second"] = json!(drain);
    figures["sustained_seconds"] = json!(sustained_secs);
    // the rolling cap's load: jobs offered a recipient a second against the one a
    // second its cap lets through ([`chunk_for`])
    let chunk = chunk_for(rate);
    let recipients = Mix::rolling_recipients(chunk);
    figures["feed_chunk"] = json!(chunk);
    figures["rolling_recipients"] = json!(recipients);
    figures["rolling_load"] = json!(rate * Kind::Rolling.share() / recipients as f64);
    figures["catch_up"] = json!(catch_up);
    figures["catch_up_max_seconds"] = if catch_up_max.is_finite() {
        json!(catch_up_max)
    } else {
        Value::Null
    };
    figures["catch_up_bound_seconds"] = json!(CATCH_UP_SECONDS);
    let mut full = figures.clone();
    full["samples"] = json!(samples);
    std::fs::write(
        results.join("soak.json"),
        serde_json::to_string_pretty(&full).unwrap(),
    )
    .unwrap();
    let _ = topology(&s).delete(&conn).await;
    let _ = conn.close(200, "soak".into()).await;
    conclude(&dir, figures, end.settled, &end.lost, &a.summary(&mix.jobs));
    assert!(
        end.stopped.iter().all(|e| e.is_some_and(|e| e.success())),
        "worker exits {:?}:\n{}",
        end.stopped,
        tails(&workers)
    );
    end.assert_sound_after_kills(&mix, kills, &unexplained);
    assert_eq!(resets, 0, "a worker took the Redis restart for a reset");
    assert!(
        not_flat.is_empty(),
        "RSS or descriptors not flat: {not_flat:#?}"
    );
    assert!(
        over_bound.is_empty(),
        "Redis memory over its bound: {over_bound:?}"
    );
    assert!(
        slow.is_empty(),
        "the queues did not catch up within {CATCH_UP_SECONDS} s after: {slow:?}"
    );
}
