//! The drain watched: the dispatch queue's depth read every [`SAMPLE`], the broker
//! restarted in the middle when asked, and the workers' readiness and the lane
//! queue's serving followed around the restart.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use quota_worker::config::Settings;
use testkit::procs::RabbitNode;

use super::restart::Restart;
use crate::broker::{closed, connect};
use crate::lanes::ready;
use crate::procs::is_ready;

/// How often the drain reads the dispatch queue's depth: a drain of 100,000 jobs at
/// 12,000/s lasts 8 s, and its start and end are each known to within a sample.
const SAMPLE: Duration = Duration::from_millis(100);

/// Reads the dispatch queue's depth every [`SAMPLE`] until it holds `jobs`; with `node`,
/// stops and starts it again once the drain has begun, and follows the workers'
/// readiness (at `ports`) meanwhile.
pub(super) async fn watch(
    s: &Settings,
    (dispatch, lane): (&str, &str),
    (jobs, rate): (usize, u64),
    ports: &[u16],
    mut node: Option<&mut RabbitNode>,
) -> Result<Watched> {
    let started = Instant::now();
    // twice the time the rate needs, and two minutes for the workers and a restart
    let limit = Duration::from_secs(jobs as u64 * 2 / rate + 120);
    let mut samples = Vec::new();
    let mut restarted: Option<Restarted> = None;
    let mut conn = connect(&s.amqp.url).await?;
    let mut next = started;
    loop {
        next += SAMPLE;
        tokio::time::sleep_until(next.into()).await;
        let d = ready(&conn, dispatch).await?;
        samples.push((started.elapsed().as_secs_f64(), d));
        // (a drain shorter than two samples, as in the harness's tests, meets its
        // restart at its end)
        if d as usize >= jobs && (restarted.is_some() || node.is_none()) {
            break;
        }
        if started.elapsed() > limit {
            bail!("{d} of {jobs} jobs dispatched after {} s", limit.as_secs());
        }
        if restarted.is_none() && d > 0 {
            if let Some(n) = node.as_deref_mut() {
                let queues = (dispatch, lane);
                let (again, r) = restart_broker(s, n, conn, queues, ports, (started, d)).await?;
                conn = again;
                samples.extend(r.reads.iter().copied());
                restarted = Some(r);
                next = Instant::now();
            }
        }
    }
    let _ = closed(conn.close(200, "bye".into())).await;
    let Some(r) = restarted else {
        return Ok(Watched {
            samples,
            restart: None,
            consuming_after: None,
        });
    };
    let mut restart = r.restart;
    let consuming_after = consuming_after(r.ready_again, restart.answered).await;
    restart.serving = r.serving.await.ok().flatten();
    Ok(Watched {
        samples,
        restart: Some(restart),
        consuming_after,
    })
}

/// A broker restart in the middle of the drain, as [`restart_broker`] made it.
struct Restarted {
    /// Its times (without the lane serving again: see `serving`).
    restart: Restart,
    /// The depth reads while it stopped, then its dispatch queue's first answer.
    reads: Vec<(f64, u32)>,
    /// When every worker consumed again ([`readiness`]).
    ready_again: std::thread::JoinHandle<Option<f64>>,
    /// When the lane queue served a consumer again ([`lane_serving`]).
    serving: tokio::task::JoinHandle<Option<f64>>,
}

/// Stop the broker `n` while the depth is read on (on `conn`, which goes with it),
/// start it again, and read its dispatch queue until it holds at least the depth
/// `d` it held before; the workers' readiness (at `ports`) and the lane queue's
/// serving followed meanwhile. Returns a fresh connection and the restart.
async fn restart_broker(
    s: &Settings,
    n: &mut RabbitNode,
    conn: lapin::Connection,
    (dispatch, lane): (&str, &str),
    ports: &[u16],
    (started, d): (Instant, u32),
) -> Result<(lapin::Connection, Restarted)> {
    let ready_again = readiness(ports.to_vec(), started);
    let from = started.elapsed().as_secs_f64();
    let at = || chrono::Utc::now().format("%H:%M:%S%.3f");
    eprintln!("      {} stopping the broker", at());
    // the depth is read on while the broker stops (the workers dispatch
    // meanwhile), until it no longer answers: it is gone after the last read
    let reads = tokio::spawn(read_while_up(conn, dispatch.to_string(), started));
    tokio::task::block_in_place(|| n.stop());
    let mut reads = reads.await.unwrap_or_default();
    let gone = reads.last().map_or(from, |r| r.0);
    let before = reads.iter().map(|r| r.1).max().unwrap_or(d).max(d);
    eprintln!("      {} starting it", at());
    n.start().await;
    eprintln!("      {} it accepts a connection", at());
    let conn = connect(&s.amqp.url).await?;
    let serving = lane_serving(&conn, lane, started).await?;
    // the outage ends at the queue's first answer after the start, read again until
    // it holds what was dispatched before (a quorum queue not yet up answers 0): the
    // drain after the return is counted from there, not from the depth read before
    // the stop (the workers go on dispatching while the broker stops)
    let back = depth_back(&conn, dispatch, before).await?;
    eprintln!("      {} its dispatch queue answers {back}", at());
    let returned = started.elapsed().as_secs_f64();
    reads.push((returned, back));
    let restart = Restart {
        asked: from,
        gone,
        answered: returned,
        serving: None,
    };
    let restarted = Restarted {
        restart,
        reads,
        ready_again,
        serving,
    };
    Ok((conn, restarted))
}

/// The dispatch queue's depth once it holds `before` again (read every 20 ms, 50
/// times at most: then whatever it holds).
async fn depth_back(conn: &lapin::Connection, dispatch: &str, before: u32) -> Result<u32> {
    let mut back = ready(conn, dispatch).await?;
    for _ in 0..50 {
        if back >= before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        back = ready(conn, dispatch).await?;
    }
    Ok(back)
}

/// Seconds from the broker's first answer (`answered`) to every worker consuming
/// again, once [`readiness`] has ended.
async fn consuming_after(
    ready_again: std::thread::JoinHandle<Option<f64>>,
    answered: f64,
) -> Option<f64> {
    let at = tokio::task::spawn_blocking(move || ready_again.join()).await;
    at.ok()
        .and_then(|at| at.ok())
        .flatten()
        .map(|at| at - answered)
}

/// The dispatch queue's depth on `conn` every [`SAMPLE`] (seconds since `started`,
/// depth) until it does not answer within a second: the broker stopping.
async fn read_while_up(
    conn: lapin::Connection,
    dispatch: String,
    started: Instant,
) -> Vec<(f64, u32)> {
    let mut reads = Vec::new();
    let mut next = Instant::now();
    loop {
        next += SAMPLE;
        tokio::time::sleep_until(next.into()).await;
        match tokio::time::timeout(Duration::from_secs(1), ready(&conn, &dispatch)).await {
            Ok(Ok(d)) => reads.push((started.elapsed().as_secs_f64(), d)),
            _ => break,
        }
    }
    let _ = tokio::time::timeout(
        Duration::from_secs(1),
        closed(conn.close(200, "bye".into())),
    )
    .await;
    reads
}

/// What [`watch`] saw.
pub(super) struct Watched {
    /// (seconds since the start, depth of the dispatch queue) every [`SAMPLE`].
    pub samples: Vec<(f64, u32)>,
    /// The broker's restart, in the same seconds.
    pub restart: Option<Restart>,
    /// Seconds from the broker's first answer to every worker consuming again (its
    /// `/readyz` at 200 after it was not).
    pub consuming_after: Option<f64>,
}

/// From now on, in a task: the seconds since `started` at which `lane` serves a
/// consumer again (its `basic.consume` answered; a quorum queue holding a backlog
/// answers last, once it has read its log again, and its passive declare answers
/// before that). The bench's consumer holds at most one job and closes its channel at
/// once, which hands the job back. `None` if the broker refused.
async fn lane_serving(
    conn: &lapin::Connection,
    lane: &str,
    started: Instant,
) -> Result<tokio::task::JoinHandle<Option<f64>>> {
    let ch = conn.create_channel().await?;
    let lane = lane.to_string();
    Ok(tokio::spawn(async move {
        ch.basic_qos(1, Default::default()).await.ok()?;
        let tag = "bench-recovery-probe";
        let opts = Default::default();
        let args = Default::default();
        let consumer = ch.basic_consume(lane.as_str().into(), tag.into(), opts, args);
        consumer.await.ok()?;
        let at = started.elapsed().as_secs_f64();
        let _ = ch.close(200, "probed".into()).await;
        Some(at)
    }))
}

/// From now on, each worker's `/readyz` every 10 ms, in a thread: the seconds since
/// `started` at which every one of them, having been not ready (its session ended),
/// is ready again (its session is consuming); `None` after two minutes.
fn readiness(ports: Vec<u16>, started: Instant) -> std::thread::JoinHandle<Option<f64>> {
    std::thread::spawn(move || {
        let mut was_down = vec![false; ports.len()];
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            let up: Vec<bool> = ports.iter().map(|&p| is_ready(p)).collect();
            for (d, u) in was_down.iter_mut().zip(&up) {
                *d |= !u;
            }
            if was_down.iter().all(|d| *d) && up.iter().all(|u| *u) {
                return Some(started.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    })
}
