//! The recovery step (`--steps recovery`): how fast a paced channel's backlog drains
//! once it sits in a lane. A ceiling first (the broker's pass-through, as in every
//! other step); the channel is then paced at half of it. A backlog of bulk jobs
//! (`--jobs`, default 100,000; 10,000 with `--quick`) is parked in the channel's bulk
//! lane before any worker runs, as a fault leaves it; then the workers start and the
//! dispatch queue's depth is read every 100 ms until every job is there. Four passes:
//! one worker and three, each without and with a broker restart in the middle of the
//! drain (the stop is asked as soon as the drain has begun: the workers go on
//! dispatching for the 2–10 s `rabbitmqctl stop` takes on this loaded machine, so the
//! broker goes away in the middle of the drain; a stop asked later left three workers
//! little or nothing to drain after the return). The restart passes run on a private
//! RabbitMQ node the step starts, so the shared broker is never restarted; they are
//! skipped where no node can be started.
//!
//! Reported: the drain rate over the whole drain and by 5-second interval, against the
//! channel's rate, and the seconds the broker was away: from its last answer as it
//! stops until the lane queue with the backlog serves a consumer again (a quorum
//! queue answers a declare before it has read its log again, and serves consumers
//! only after: no worker can drain it before). The intervals that overlap the restart are marked,
//! the whole-drain figure is also given without them, and the first interval counted
//! from the broker's first answer instead is given beside.
//!
//! Then the burst ([`burst`]): the same number of bulk jobs published to the jobs
//! exchange as fast as the benchmark can, as a producer that knows no lanes sends a
//! campaign, while one worker (then three) reads and parks them: the publish rate, the
//! parking rate, and how long an urgent job published right behind them waits.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::quota::lanes::Priority;
use testkit::procs::RabbitNode;

use crate::broker::{closed, connect, preload};
use crate::ceiling::ceiling;
use crate::context::{header, Bench};
use crate::lanes::ready;
use crate::procs::{is_ready, spawn_worker, stop, wait_ready};
use crate::report::{Burst, Recovery, Report, INTERVAL_SECS};

/// Runs the step into `report`.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let jobs = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 10_000 } else { 100_000 });
    let c = b.settings("rcceil");
    let (ceiling_rate, _) = ceiling(&c, "a-allowed", b.jobs.min(50_000)).await?;
    b.teardown.ceiling(&c).await;
    let rate = ((ceiling_rate / 2.0).round() as u64).max(1);
    header(
        "recovery",
        format!("ceiling {ceiling_rate:.0} msgs/s: the channel paced at {rate}/s"),
    );
    let restart_possible = RabbitNode::available();
    // `QW_BENCH_RECOVERY=restart`: only the passes with a broker restart (no burst)
    let restart_only = std::env::var("QW_BENCH_RECOVERY").is_ok_and(|v| v == "restart");
    for restart in [false, true] {
        if restart_only && !restart {
            continue;
        }
        if restart && !restart_possible {
            eprintln!("      no RabbitMQ node can be started here: the restart passes are skipped");
            continue;
        }
        for workers in [1, 3] {
            let mut r = pass(b, workers, jobs, rate, restart).await?;
            r.ceiling_msgs_per_sec = ceiling_rate;
            eprintln!(
                "      drained {} jobs in {:.1} s: {:.3} of the rate (without the outage {:.3}); lowest 5 s interval {:.3}{}",
                r.jobs, r.drain_secs, r.ratio_whole, r.ratio_without_outage, r.min_interval_ratio,
                r.resumed_after_secs.map_or(String::new(), |s| format!("; dispatching again {s:.2} s after the broker's first answer"))
            );
            if let Some(secs) = r.stopping_secs {
                eprintln!("      the broker answered for {secs:.2} s after it was asked to stop");
            }
            if let Some(secs) = r.consuming_after_secs {
                eprintln!(
                    "      every worker consuming again {secs:.2} s after the broker's first answer"
                );
            }
            if let Some(secs) = r.lane_serving_after_secs {
                eprintln!("      its lane queue serving a consumer again {secs:.2} s after the broker's first answer");
            }
            if let Some(first) = r.first_from_answer_ratio {
                eprintln!("      the first interval counted from the broker's first answer instead: {first:.3} of the rate");
            }
            report.recovery.push(r);
        }
    }
    for workers in [1, 3] {
        if restart_only {
            break;
        }
        let burst = burst(b, workers, jobs, rate).await?;
        eprintln!(
            "      published at {:.0}/s, parked at {:.0}/s: an urgent job behind them waits {:.1} s",
            burst.publish_per_sec, burst.parking_per_sec, burst.urgent_wait_secs
        );
        report.bursts.push(burst);
    }
    Ok(())
}

/// `jobs` bulk jobs published to the jobs exchange at once while `workers` workers
/// run, the channel paced at `rate`: how fast they are published and parked.
async fn burst(b: &Bench, workers: usize, jobs: usize, rate: u64) -> Result<Burst> {
    header(
        "recovery",
        format!(
            "burst: {jobs} bulk jobs to the jobs exchange, {workers} worker(s), paced at {rate}/s"
        ),
    );
    let mut s = b.settings(&format!("rb{workers}"));
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(rate);
    }
    let env = [(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        rate.to_string(),
    )];
    let mut procs = Vec::new();
    let result = async {
        for _ in 0..workers {
            let (child, port) = spawn_worker(&b.worker, &s, &env)?;
            procs.push(child);
            wait_ready(port, procs.last_mut().expect("just pushed")).await?;
        }
        let conn = connect(&s.amqp.url).await?;
        let ns = &s.redis.key_prefix;
        let bodies = (0..jobs).map(|i| {
            format!(r#"{{"id":"{ns}-c{i}","recipient":"c{i}","channel":"sms","category":"transactional","priority":"bulk"}}"#)
                .into_bytes()
        });
        let ch = conn.create_channel().await?;
        ch.confirm_select(Default::default()).await?;
        let started = Instant::now();
        preload(&ch, &s.amqp.jobs_exchange, "", bodies).await?;
        let published = started.elapsed().as_secs_f64();
        let deadline = started + Duration::from_secs(600);
        while ready(&conn, &s.amqp.jobs_queue).await? > 0 {
            if Instant::now() > deadline {
                bail!("the jobs queue was not read within 10 minutes");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let parked = started.elapsed().as_secs_f64();
        let _ = closed(conn.close(200, "bye".into())).await;
        let (publish, parking) = (jobs as f64 / published, jobs as f64 / parked);
        Ok(Burst {
            workers,
            jobs,
            publish_per_sec: publish,
            parking_per_sec: parking,
            urgent_wait_secs: (parked - published).max(0.0),
        })
    }
    .await;
    for child in &mut procs {
        stop(child);
    }
    b.teardown.namespace(&s).await;
    result
}

async fn pass(
    b: &Bench,
    workers: usize,
    jobs: usize,
    rate: u64,
    restart: bool,
) -> Result<Recovery> {
    header(
        "recovery",
        format!(
            "{workers} worker(s), {jobs} bulk jobs parked, paced at {rate}/s{}",
            if restart {
                ", the broker restarted in the middle"
            } else {
                ""
            }
        ),
    );
    let suffix = format!("rc{workers}{}", if restart { "r" } else { "" });
    let mut s = b.settings(&suffix);
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(rate);
    }
    let mut node = None;
    if restart {
        let mut n = RabbitNode::new();
        n.start().await;
        s.amqp.url = n.url();
        node = Some(n);
    }
    let result = drain(b, &s, workers, jobs, rate, node.as_mut()).await;
    if let Some(mut n) = node {
        n.stop();
        // the keys are on the shared Redis; the queues went with the node
        s.amqp.url = b.args.amqp.clone();
    }
    b.teardown.namespace(&s).await;
    result
}

async fn drain(
    b: &Bench,
    s: &Settings,
    workers: usize,
    jobs: usize,
    rate: u64,
    node: Option<&mut RabbitNode>,
) -> Result<Recovery> {
    let topology = Topology::from_settings(s);
    let conn = connect(&s.amqp.url).await?;
    topology.declare(&conn).await?;
    let lane = topology.lane_queue("sms", Priority::Bulk);
    let dispatch = topology.dispatch_queue("sms");
    let ns = &s.redis.key_prefix;
    let bodies = (0..jobs).map(|i| {
        format!(r#"{{"id":"{ns}-r{i}","recipient":"r{i}","channel":"sms","category":"transactional","priority":"bulk"}}"#)
            .into_bytes()
    });
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    preload(
        &ch,
        &s.lanes.exchange,
        &Priority::Bulk.routing_key("sms"),
        bodies,
    )
    .await?;
    let parked = ready(&conn, &lane).await?;
    if parked as usize != jobs {
        bail!("{parked} of {jobs} jobs parked in {lane}");
    }
    let _ = closed(conn.close(200, "bye".into())).await;

    let env = [(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        rate.to_string(),
    )];
    let (mut procs, mut ports) = (Vec::new(), Vec::new());
    for _ in 0..workers {
        let (mut child, port) = spawn_worker(&b.worker, s, &env)?;
        wait_ready(port, &mut child).await?;
        procs.push(child);
        ports.push(port);
    }
    let watched = watch(s, (&dispatch, &lane), (jobs, rate), &ports, node).await;
    for child in &mut procs {
        stop(child);
    }
    let watched = watched?;
    let mut r = summarise(workers, jobs, rate, &watched.samples, watched.restart);
    r.consuming_after_secs = watched.consuming_after;
    Ok(r)
}

/// How often the drain reads the dispatch queue's depth: a drain of 100,000 jobs at
/// 12,000/s lasts 8 s, and its start and end are each known to within a sample.
const SAMPLE: Duration = Duration::from_millis(100);

/// Reads the dispatch queue's depth every [`SAMPLE`] until it holds `jobs`; with `node`,
/// stops and starts it again once the drain has begun, and follows the workers'
/// readiness (at `ports`) meanwhile.
async fn watch(
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
    let (mut restart, mut consuming, mut probe) = (None, None, None);
    let mut conn = connect(&s.amqp.url).await?;
    let mut next = started;
    loop {
        next += SAMPLE;
        tokio::time::sleep_until(next.into()).await;
        let d = ready(&conn, dispatch).await?;
        samples.push((started.elapsed().as_secs_f64(), d));
        // (a drain shorter than two samples, as in the harness's tests, meets its
        // restart at its end)
        if d as usize >= jobs && (restart.is_some() || node.is_none()) {
            break;
        }
        if started.elapsed() > limit {
            bail!("{d} of {jobs} jobs dispatched after {} s", limit.as_secs());
        }
        if restart.is_none() && d > 0 {
            if let Some(n) = node.as_deref_mut() {
                let ready_again = readiness(ports.to_vec(), started);
                let from = started.elapsed().as_secs_f64();
                let at = || chrono::Utc::now().format("%H:%M:%S%.3f");
                eprintln!("      {} stopping the broker", at());
                // the depth is read on while the broker stops (the workers dispatch
                // meanwhile), until it no longer answers: it is gone after the last read
                let reads = tokio::spawn(read_while_up(conn, dispatch.to_string(), started));
                tokio::task::block_in_place(|| n.stop());
                let reads = reads.await.unwrap_or_default();
                let gone = reads.last().map_or(from, |r| r.0);
                let d = reads.iter().map(|r| r.1).max().unwrap_or(d).max(d);
                samples.extend(reads);
                eprintln!("      {} starting it", at());
                n.start().await;
                eprintln!("      {} it accepts a connection", at());
                conn = connect(&s.amqp.url).await?;
                let serving = lane_serving(&conn, lane, started).await?;
                // the outage ends at the queue's first answer after the start, read
                // again until it holds what was dispatched before (a quorum queue not
                // yet up answers 0): the drain after the return is counted from
                // there, not from the depth read before the stop (the workers go on
                // dispatching while the broker stops)
                let before = d;
                let mut back = ready(&conn, dispatch).await?;
                for _ in 0..50 {
                    if back >= before {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    back = ready(&conn, dispatch).await?;
                }
                eprintln!("      {} its dispatch queue answers {back}", at());
                let returned = started.elapsed().as_secs_f64();
                restart = Some(Restart {
                    asked: from,
                    gone,
                    answered: returned,
                    serving: None,
                });
                consuming = Some(ready_again);
                probe = Some(serving);
                samples.push((returned, back));
                next = Instant::now();
            }
        }
    }
    let _ = closed(conn.close(200, "bye".into())).await;
    let consuming_after = match (consuming, restart) {
        (Some(ready_again), Some(r)) => {
            let at = tokio::task::spawn_blocking(move || ready_again.join()).await;
            at.ok()
                .and_then(|at| at.ok())
                .flatten()
                .map(|at| at - r.answered)
        }
        _ => None,
    };
    if let (Some(r), Some(serving)) = (restart.as_mut(), probe) {
        r.serving = serving.await.ok().flatten();
    }
    Ok(Watched {
        samples,
        restart,
        consuming_after,
    })
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
struct Watched {
    /// (seconds since the start, depth of the dispatch queue) every [`SAMPLE`].
    samples: Vec<(f64, u32)>,
    /// The broker's restart, in the same seconds.
    restart: Option<Restart>,
    /// Seconds from the broker's first answer to every worker consuming again (its
    /// `/readyz` at 200 after it was not).
    consuming_after: Option<f64>,
}

/// A broker restart as the drain saw it, in seconds since the drain was first read.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Restart {
    /// The broker asked to stop.
    pub asked: f64,
    /// The last answer before it went away (the workers dispatch while it stops).
    pub gone: f64,
    /// Its dispatch queue's first answer after its start, holding at least what it
    /// held before the stop.
    pub answered: f64,
    /// The lane queue with the backlog serving a consumer again (`None`: not seen).
    pub serving: Option<f64>,
}

impl Restart {
    /// Its end for the drain: the lane queue serving again, or the first answer if
    /// that came later (or the serving was not seen).
    pub fn back(&self) -> f64 {
        self.serving.map_or(self.answered, |s| s.max(self.answered))
    }
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

/// A drain whose depth stands still this long before its last jobs arrive ends at
/// the stall (see [`summarise`]).
const STALL_SECS: f64 = 5.0;

/// The pass's figures from its depth samples (pure).
pub fn summarise(
    workers: usize,
    jobs: usize,
    rate: u64,
    samples: &[(f64, u32)],
    restart: Option<Restart>,
) -> Recovery {
    let outage = restart.map(|r| (r.gone, r.back()));
    // the dispatch queue only grows: a read that comes back lower (a quorum queue
    // not yet up after the broker's restart answers 0) counts as the one before it
    let samples: Vec<(f64, u32)> = samples
        .iter()
        .scan(0u32, |most, &(t, d)| {
            *most = (*most).max(d);
            Some((t, *most))
        })
        .collect();
    let samples = samples.as_slice();
    // the drain starts at the last sample before the first dispatched job
    let first = samples.iter().position(|&(_, d)| d > 0).unwrap_or(0);
    let t0 = if first == 0 {
        0.0
    } else {
        samples[first - 1].0
    };
    // jobs that arrive only after a stall of [`STALL_SECS`] or more (jobs whose
    // dispatch was in flight when the broker went away: they may have been sent, so
    // they wait out redis.reservation_lease, and not all at one moment) end the
    // drain at the first such stall after the broker's return, and are reported apart
    let last_depth = samples.last().map_or(0, |s| s.1);
    let back_at = outage.map_or(f64::NEG_INFINITY, |(_, z)| z);
    let stall = (0..samples.len()).find(|&i| {
        let (at, d) = samples[i];
        let still = samples[i..].iter().take_while(|s| s.1 == d).last();
        at >= back_at && d > 0 && d < last_depth && still.is_some_and(|s| s.0 - at >= STALL_SECS)
    });
    let last = stall.map_or(samples.len().saturating_sub(1), |i| i);
    let end = samples.get(last).map_or(t0, |s| s.0);
    let drain_secs = (end - t0).max(f64::EPSILON);
    let dispatched = samples.get(last).map_or(0, |s| s.1) as f64;
    let held = stall.map_or(0, |i| jobs.saturating_sub(samples[i].1 as usize));
    let held_secs = stall.map_or(0.0, |i| samples.last().map_or(0.0, |l| l.0) - samples[i].0);
    let outage_secs = outage.map_or(0.0, |(a, z)| z - a);
    let rate_f = rate as f64;
    let ratio_whole = dispatched / drain_secs / rate_f;
    let ratio_without_outage = dispatched / (drain_secs - outage_secs).max(f64::EPSILON) / rate_f;
    // depth at t (the last sample at or before it)
    let at = |t: f64| -> f64 {
        samples
            .iter()
            .take_while(|s| s.0 <= t + 1e-9)
            .last()
            .map_or(0.0, |s| s.1 as f64)
    };
    // 5-second windows before the broker went away and from its return on (a last
    // shorter one of at least 2 s counted over its own length), and the outage as
    // one window of its own
    let step = INTERVAL_SECS as f64;
    let segments = match outage {
        Some((oa, oz)) if oa > t0 && oz < end => {
            vec![(t0, oa, false), (oa, oz, true), (oz, end, false)]
        }
        _ => vec![(t0, end, false)],
    };
    let (mut intervals, mut in_outage, mut interval_secs) = (Vec::new(), Vec::new(), Vec::new());
    let mut interval_starts = Vec::new();
    for (a0, z0, away) in segments {
        let mut a = a0;
        while a < z0 - 1e-9 {
            let z = if away { z0 } else { (a + step).min(z0) };
            if z - a >= 2.0 || away {
                intervals.push((at(z) - at(a)) / (z - a));
                in_outage.push(away);
                interval_secs.push(z - a);
                interval_starts.push(a - t0);
            }
            a = z;
        }
    }
    let resumed_after_secs = restart.and_then(|r| {
        let back = at(r.answered);
        samples
            .iter()
            .find(|s| s.0 > r.answered && s.1 as f64 > back)
            .map(|s| s.0 - r.answered)
    });
    // the first interval counted from the broker's first answer instead (5 s, or to
    // the drain's end if at least 2 s)
    let first_from_answer_ratio = restart.and_then(|r| {
        let z = (r.answered + step).min(end);
        (z - r.answered >= 2.0).then(|| (at(z) - at(r.answered)) / (z - r.answered) / rate_f)
    });
    let min_interval_ratio = intervals
        .iter()
        .zip(&in_outage)
        .filter(|(_, o)| !**o)
        .map(|(v, _)| v / rate_f)
        .fold(f64::INFINITY, f64::min);
    Recovery {
        workers,
        broker_restart: outage.is_some(),
        jobs,
        rate,
        ceiling_msgs_per_sec: 0.0,
        drain_secs,
        ratio_whole,
        ratio_without_outage,
        outage_secs,
        resumed_after_secs,
        consuming_after_secs: None,
        lane_serving_after_secs: restart.and_then(|r| r.serving.map(|s| s - r.answered)),
        first_from_answer_ratio,
        stopping_secs: restart.map(|r| r.gone - r.asked),
        intervals,
        interval_in_outage: in_outage,
        interval_secs,
        interval_starts,
        held,
        held_secs,
        min_interval_ratio: if min_interval_ratio.is_finite() {
            min_interval_ratio
        } else {
            0.0
        },
        returned_at_secs: restart.map(|r| r.answered - t0),
        curve: samples[first.saturating_sub(1)..]
            .iter()
            .map(|&(t, d)| (t - t0, d as f64))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_steady_drain_is_at_the_rate_in_every_interval() {
        // 100 jobs a second from t = 2 on, 1,000 jobs
        let samples: Vec<(f64, u32)> = (1..=12)
            .map(|t| (t as f64, ((t - 2).max(0) * 100) as u32))
            .collect();
        let r = summarise(1, 1_000, 100, &samples, None);
        assert_eq!(r.drain_secs, 10.0);
        assert!((r.ratio_whole - 1.0).abs() < 1e-9);
        assert_eq!(r.intervals, vec![100.0, 100.0]);
        assert!((r.min_interval_ratio - 1.0).abs() < 1e-9);
    }

    #[test]
    fn an_outage_is_marked_and_left_out_of_the_lowest_interval() {
        // 100/s, then nothing from t = 5 to t = 10, then 100/s again
        let mut samples = Vec::new();
        let mut d = 0u32;
        for t in 1..=16 {
            if !(6..=10).contains(&t) {
                d += 100;
            }
            samples.push((t as f64, d));
        }
        let away = |asked, answered, serving| {
            Some(Restart {
                asked,
                gone: asked,
                answered,
                serving,
            })
        };
        let r = summarise(1, 1_100, 100, &samples, away(5.0, 10.0, None));
        assert!(r.broker_restart);
        assert_eq!(r.interval_in_outage, vec![false, true, false]);
        assert!(r.ratio_whole < 0.75);
        assert!((r.min_interval_ratio - 1.0).abs() < 1e-9);
        // the first sample after the return with more dispatched is at t = 11
        assert_eq!(r.resumed_after_secs, Some(1.0));
        let steady = summarise(1, 1_600, 100, &samples, None);
        assert_eq!(steady.resumed_after_secs, None);
        // the lane queue serving again before the first answer: the answer ends it
        let early = summarise(1, 1_100, 100, &samples, away(5.0, 10.0, Some(9.5)));
        assert_eq!(early.outage_secs, 5.0);
        assert_eq!(early.lane_serving_after_secs, Some(-0.5));
    }

    #[test]
    fn the_broker_is_back_once_its_lane_queue_serves_again() {
        // 100/s to t = 5; away until its first answer at t = 10; its lane queue
        // serves again at t = 11, then 100/s to 1,500 jobs at t = 20
        let mut samples: Vec<(f64, u32)> = (1..=5).map(|t| (t as f64, t * 100)).collect();
        samples.extend((10..=11).map(|t| (t as f64, 500)));
        samples.extend((12..=20).map(|t| (t as f64, 500 + (t - 11) * 100)));
        let restart = Restart {
            asked: 4.5,
            gone: 5.0,
            answered: 10.0,
            serving: Some(11.0),
        };
        let r = summarise(1, 1_400, 100, &samples, Some(restart));
        assert_eq!(r.outage_secs, 6.0);
        assert_eq!(r.lane_serving_after_secs, Some(1.0));
        assert_eq!(r.interval_in_outage, vec![false, true, false, false]);
        assert_eq!(r.interval_starts, vec![0.0, 5.0, 11.0, 16.0]);
        assert_eq!(r.interval_secs, vec![5.0, 6.0, 5.0, 4.0]);
        assert!(
            (r.min_interval_ratio - 1.0).abs() < 1e-9,
            "{}",
            r.min_interval_ratio
        );
        // counted from the first answer, the first interval lost the second before
        // the lane served
        let first = r.first_from_answer_ratio.unwrap();
        assert!((first - 0.8).abs() < 1e-9, "{first}");
        assert_eq!(r.returned_at_secs, Some(10.0));
        assert_eq!(r.stopping_secs, Some(0.5));
    }

    #[test]
    fn a_zero_read_after_the_return_and_late_jobs_in_two_steps_end_the_drain_at_the_first_stall() {
        // 10,000/s to 42,000 by 4.2 s; the broker away from 4.25 s to 17.6 s; a read
        // of 0 as it comes back, then the rest to 99,971 by 19.9 s; the last 29 (and
        // copies) only at 127.5 s and 127.7 s, after the lease
        let mut samples: Vec<(f64, u32)> = (1..=42).map(|i| (i as f64 / 10.0, i * 1_000)).collect();
        samples.push((18.0, 0));
        samples.push((18.2, 86_000));
        samples.extend((1..=16).map(|i| (18.2 + i as f64 / 10.0, 86_000 + i * 873)));
        samples.push((19.9, 99_971));
        samples.extend((1..=1075).map(|i| (19.9 + i as f64 / 10.0, 99_971)));
        samples.push((127.5, 99_974));
        samples.push((127.7, 100_029));
        let restart = Restart {
            asked: 4.25,
            gone: 4.25,
            answered: 17.6,
            serving: None,
        };
        let r = summarise(3, 100_000, 10_000, &samples, Some(restart));
        assert_eq!(r.held, 29);
        assert!((r.drain_secs - 19.9).abs() < 1e-9, "{}", r.drain_secs);
        assert!((r.held_secs - (127.7 - 19.9)).abs() < 1e-9);
        assert!(r.min_interval_ratio > 0.5, "{}", r.min_interval_ratio);
        assert!((r.resumed_after_secs.unwrap() - 0.6).abs() < 1e-9);
    }

    #[test]
    fn jobs_that_come_only_after_a_long_stall_are_held_apart() {
        // 100/s to 900 by t = 10, then nothing until t = 130, when the last 100 come
        let mut samples: Vec<(f64, u32)> = (1..=10)
            .map(|t| (t as f64, (t * 100 - 100) as u32))
            .collect();
        for t in 11..130 {
            samples.push((t as f64, 900));
        }
        samples.push((130.0, 1_000));
        let r = summarise(1, 1_000, 100, &samples, None);
        assert_eq!(r.held, 100);
        assert!((r.held_secs - 120.0).abs() < 1e-9);
        assert_eq!(r.drain_secs, 9.0);
        assert!((r.ratio_whole - 1.0).abs() < 1e-9);
        // a short pause at the end is part of the drain
        let mut short = samples[..12].to_vec();
        short.push((12.0, 1_000));
        let r = summarise(1, 1_000, 100, &short, None);
        assert_eq!(r.held, 0);
        assert_eq!(r.drain_secs, 11.0);
    }
}
