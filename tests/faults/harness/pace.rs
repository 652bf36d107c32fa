//! The channel's rate as its dispatches show it, across a fault: a tap ([`Tap`]), a
//! queue of the test's own bound to the dispatch exchange with the channel's key, so
//! it receives a copy of every dispatch while the dispatch queue keeps the originals
//! for the audit. Its consumer notes when each copy arrives, reconnecting after a
//! broker restart. Beside them it publishes a probe to the tap every 50 ms, stamped
//! with its send time: what a probe took to arrive is the delay between a
//! publish and its arrival here, and how much that delay varies ([`Tapped::spread`])
//! is how far the arrival times can bunch dispatches that the worker spaced. How
//! late the probes' ticks fire ([`Tapped::late`]) is how long a process here may
//! wait to be run: the worker's timer for a slot, too.
//!
//! [`excess`]: the most dispatches of any interval beyond what the rate allows in
//! it, `max over i ≤ j of (j − i + 1) − rate · (t_j − t_i)`. A GCRA of rate `r`
//! and burst `b` lets at most `b + r·T` jobs through in any interval of length `T`,
//! so the excess of the slots' times is at most `b`; of arrival times that lag
//! the slots by between `d_min` and `d_max`, at most `b + r·(d_max − d_min)`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use quota_worker::config::Settings;
use tokio_util::sync::CancellationToken;

/// How often a probe is published.
const PROBE_EVERY: Duration = Duration::from_millis(50);
/// The probes' message id.
const PROBE: &str = "pace-probe";

/// What the tap saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tapped {
    /// When each dispatch's copy arrived (seconds since the tap started), and its
    /// job's id, in order.
    pub arrivals: Vec<(f64, String)>,
    /// What each probe took from its publish to its arrival, seconds.
    pub lags: Vec<f64>,
    /// Copies found waiting in the tap when it reconnected (their arrival times are
    /// their reconnection's, not their dispatch's).
    pub held_on_reconnect: u32,
    /// Times the tap connected.
    pub connections: u32,
    /// The most a probe's tick fired after its time, seconds: how long a process
    /// on this machine can wait to be run (the worker's timers wait as long).
    pub late: f64,
}

impl Tapped {
    /// The arrival of each job's first copy, in order (a second copy is a duplicate
    /// the fault explains, counted by the audit; its job took its slot at its first).
    pub fn firsts(&self) -> Vec<f64> {
        let mut seen = std::collections::HashSet::new();
        self.arrivals
            .iter()
            .filter(|(_, id)| seen.insert(id.as_str()))
            .map(|(t, _)| *t)
            .collect()
    }

    /// How many arrivals were second copies.
    pub fn repeats(&self) -> usize {
        self.arrivals.len() - self.firsts().len()
    }

    /// How far an arrival's time here can be from its dispatch's slot: how much the
    /// probes' delay varied, plus the most a tick fired late, seconds.
    pub fn jitter(&self) -> f64 {
        self.spread() + self.late
    }

    /// How much the probes' delay varied: the longest less the shortest, seconds.
    pub fn spread(&self) -> f64 {
        let max = self.lags.iter().cloned().fold(0.0, f64::max);
        let min = self.lags.iter().cloned().fold(f64::INFINITY, f64::min);
        if self.lags.is_empty() {
            0.0
        } else {
            max - min
        }
    }
}

/// A tap on the dispatches of one channel.
pub(crate) struct Tap {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    seen: Arc<Mutex<Tapped>>,
    url: String,
    queue: String,
    started: Instant,
}

impl Tap {
    /// Starts tapping `channel`'s dispatches of `s` on the broker at `url` (the tap
    /// queue is declared before this returns).
    pub(crate) async fn start(url: &str, s: &Settings, channel: &str) -> Tap {
        let queue = format!("{}.pace-tap.{channel}", s.redis.key_prefix);
        let seen = Arc::new(Mutex::new(Tapped::default()));
        let stop = CancellationToken::new();
        let started = Instant::now();
        let first = Connection::connect(url, ConnectionProperties::default())
            .await
            .expect("the tap's broker");
        let bind = (s.amqp.dispatch_exchange.clone(), channel.to_string());
        let ready = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tap(
            (url.to_string(), queue.clone(), bind),
            (Some(first), Some(ready.0)),
            (seen.clone(), started),
            stop.clone(),
        ));
        let _ = ready.1.await;
        Tap {
            stop,
            task,
            seen,
            url: url.to_string(),
            queue,
            started,
        }
    }

    /// Now, on the tap's clock (seconds since it started).
    pub(crate) fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// What it has seen so far.
    pub(crate) fn so_far(&self) -> Tapped {
        self.seen.lock().unwrap().clone()
    }

    /// Stops tapping and deletes the tap: what it saw.
    pub(crate) async fn finish(self) -> Tapped {
        // the last copies are in by now: the caller waited for the queues to go quiet
        self.stop.cancel();
        let _ = self.task.await;
        if let Ok(conn) = Connection::connect(&self.url, ConnectionProperties::default()).await {
            if let Ok(ch) = conn.create_channel().await {
                let _ = ch
                    .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }
            let _ = conn.close(200, "".into()).await;
        }
        let seen = self.seen.lock().unwrap().clone();
        seen
    }
}

type Bind = (String, String, (String, String));

/// The tap's task: a session on each connection until stopped, connecting again
/// every 100 ms after the broker goes.
async fn tap(
    (url, queue, bind): Bind,
    (mut first, mut ready): (Option<Connection>, Option<tokio::sync::oneshot::Sender<()>>),
    (seen, started): (Arc<Mutex<Tapped>>, Instant),
    stop: CancellationToken,
) {
    while !stop.is_cancelled() {
        let conn = match first.take() {
            Some(c) => c,
            None => match Connection::connect(&url, ConnectionProperties::default()).await {
                Ok(c) => c,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let ended = session(
            &conn,
            (&queue, &bind),
            (&seen, started),
            (&stop, &mut ready),
        )
        .await;
        if let Err(e) = ended {
            eprintln!("the tap lost its broker: {e}");
        }
        let _ = conn.close(200, "".into()).await;
    }
}

/// One connection's consumer and prober, until stopped or the connection fails.
async fn session(
    conn: &Connection,
    (queue, (exchange, key)): (&str, &(String, String)),
    (seen, started): (&Arc<Mutex<Tapped>>, Instant),
    (stop, ready): (
        &CancellationToken,
        &mut Option<tokio::sync::oneshot::Sender<()>>,
    ),
) -> Result<(), lapin::Error> {
    let ch = conn.create_channel().await?;
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), durable, FieldTable::default())
        .await?;
    let bind = QueueBindOptions::default();
    ch.queue_bind(
        queue.into(),
        exchange.as_str().into(),
        key.as_str().into(),
        bind,
        FieldTable::default(),
    )
    .await?;
    {
        let mut s = seen.lock().unwrap();
        s.connections += 1;
        if s.connections > 1 {
            s.held_on_reconnect += q.message_count();
        }
    }
    let no_ack = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    let mut consumer = ch
        .basic_consume(
            queue.into(),
            "pace-tap".into(),
            no_ack,
            FieldTable::default(),
        )
        .await?;
    if let Some(r) = ready.take() {
        let _ = r.send(());
    }
    // the probes from a task of their own, so that a publish held up never holds up
    // the noting of arrivals
    let probing = tokio::spawn(probe(
        (conn.create_channel().await?, queue.to_string()),
        (seen.clone(), started),
        stop.child_token(),
    ));
    let _probing = AbortOnDrop(probing);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            d = consumer.next() => {
                let d = match d {
                    Some(d) => d?,
                    None => return Ok(()),
                };
                let at = started.elapsed().as_secs_f64();
                let mut s = seen.lock().unwrap();
                if d.properties.message_id().as_ref().is_some_and(|m| m.as_str() == PROBE) {
                    let sent: f64 = std::str::from_utf8(&d.data).ok().and_then(|t| t.parse().ok()).unwrap_or(at);
                    s.lags.push(at - sent);
                } else {
                    let id = d.properties.message_id().as_ref().map(|m| m.to_string());
                    s.arrivals.push((at, id.unwrap_or_default()));
                }
            }
        }
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A probe to the tap every [`PROBE_EVERY`], its send time as its body, until
/// stopped or the channel fails.
async fn probe(
    (ch, queue): (lapin::Channel, String),
    (seen, started): (Arc<Mutex<Tapped>>, Instant),
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(PROBE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let due = tokio::select! {
            _ = stop.cancelled() => return,
            due = tick.tick() => due,
        };
        let late = due.elapsed().as_secs_f64();
        {
            let mut s = seen.lock().unwrap();
            s.late = s.late.max(late);
        }
        let sent = started.elapsed().as_secs_f64().to_string();
        let props = BasicProperties::default().with_message_id(PROBE.into());
        let options = BasicPublishOptions::default();
        let published = ch
            .basic_publish(
                "".into(),
                queue.as_str().into(),
                options,
                sent.as_bytes(),
                props,
            )
            .await;
        if published.is_err() {
            return;
        }
    }
}

/// The most of `times` (sorted) in any interval beyond `rate` per second of its
/// length, and the interval (its first and last time): `max over i ≤ j of
/// (j − i + 1) − rate · (t_j − t_i)`, in one pass (the `i` that minimises
/// `i − rate · t_i` so far).
pub(crate) fn excess(times: &[f64], rate: f64) -> (f64, (f64, f64)) {
    let mut best = (0.0, (0.0, 0.0));
    let mut low: Option<(f64, f64)> = None;
    for (j, &t) in times.iter().enumerate() {
        let here = j as f64 - rate * t;
        // (the latest of equals: the shortest interval of the most)
        if low.is_none_or(|(v, _)| here <= v) {
            low = Some((here, t));
        }
        let (v, from) = low.unwrap();
        let e = here - v + 1.0;
        if e > best.0 {
            best = (e, (from, t));
        }
    }
    best
}

#[test]
fn the_excess_is_what_an_interval_holds_beyond_the_rate() {
    // 8/s, evenly (times exact in binary): one in any interval beyond the rate
    let even: Vec<f64> = (0..48).map(|i| i as f64 * 0.125).collect();
    assert_eq!(excess(&even, 8.0).0, 1.0);
    // four more at 3 s: five in an instant
    let mut bunched = even.clone();
    bunched.extend([3.0; 4]);
    bunched.sort_by(f64::total_cmp);
    assert_eq!(excess(&bunched, 8.0), (5.0, (3.0, 3.0)));
    // twice the rate for a second: 8 beyond it
    let fast: Vec<f64> = (0..16).map(|i| i as f64 * 0.0625).collect();
    assert_eq!(excess(&fast, 8.0).0, 16.0 - 8.0 * 0.9375);
    assert_eq!(excess(&[], 8.0).0, 0.0);
}
