//! The latency step (`--steps latency`): in each round a ceiling, then jobs offered
//! at half its rate and at a quarter, to the worker and to the pass-through (the
//! ceiling's relay, live) in turn, the order alternating; publish-to-arrival times
//! from the header the load generator stamps, and the worker's admission quantiles
//! as the breakdown. Then a last pass with the worker and Redis under `SCHED_FIFO`.

use std::collections::HashMap;
use std::path::Path;
use std::process::Child;
use std::time::Duration;

use anyhow::Result;
use lapin::Connection;
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;

use crate::broker::{connect, offer, Arrivals};
use crate::ceiling::{ceiling, live_pass_through};
use crate::context::{header, Bench};
use crate::jobs::latency_job;
use crate::metrics::{metric_sum, outcome_counts, quantiles, scrape};
use crate::procs::{redis_pid, spawn_worker, stop, wait_ready, Realtime};
use crate::report::{median, EndToEnd, Latency, LatencySummary, Report};
use crate::table::{fmt_e2e, fmt_ms};

/// The shares of each round's ceiling offered, in order.
const SHARES: [f64; 2] = [0.5, 0.25];

/// Runs the step into `report`: every round, the summary, the real-time pass.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let conn = connect(&b.args.amqp).await?;
    let secs = b.args.latency_secs();
    // `QW_BENCH_RATE` fixes the first rate (the second is half of it)
    let fixed: Option<f64> = std::env::var("QW_BENCH_RATE")
        .ok()
        .and_then(|r| r.parse().ok());
    let mut half_rate = 0.0;
    for round in 0..b.rounds {
        let c = b.settings(&format!("lc{round}"));
        let (ceiling, _) = ceiling(&c, "a-allowed", b.jobs).await?;
        b.teardown.ceiling(&c).await;
        let reference = fixed.map_or(ceiling, |r| r * 2.0);
        for (k, share) in SHARES.into_iter().enumerate() {
            let rate = reference * share;
            if k == 0 {
                half_rate = rate;
            }
            let mut l = worker_and_pass_through(b, &conn, round, k, rate, ceiling, secs).await?;
            l.round = round;
            l.share_of_ceiling = share;
            l.ceiling_msgs_per_sec = ceiling;
            eprintln!(
                "      end to end p50/p99/p99.9 ms: worker {}, pass-through {}; admission p99 {} ms",
                fmt_e2e(l.end_to_end.as_ref()),
                fmt_e2e(l.pass_through.as_ref()),
                fmt_ms(l.admission_p99_ms)
            );
            report.latency.push(l);
        }
    }
    report.latency_summary = summarise_latency(&report.latency);
    if !b.args.no_realtime {
        if let Some(l) = realtime_pass(b, &conn, half_rate, secs).await {
            report.latency.push(l);
        }
    }
    Ok(())
}

/// Share `k` of round `round`, whose ceiling is `ceiling`: jobs offered at `rate` to
/// the worker and to the pass-through in turn (which goes first alternates); the
/// worker's pass with the pass-through's beside it.
async fn worker_and_pass_through(
    b: &Bench,
    conn: &Connection,
    round: usize,
    k: usize,
    rate: f64,
    ceiling: f64,
    secs: u64,
) -> Result<Latency> {
    let worker_first = (round + k) % 2 == 1;
    header(
        "latency",
        format!(
            "round {}: {rate:.0} jobs/s ({} of the ceiling of {ceiling:.0}) for {secs} s, {} first",
            round + 1,
            SHARES[k],
            if worker_first {
                "worker"
            } else {
                "pass-through"
            }
        ),
    );
    let mut measured = None;
    let mut pass = None;
    for worker_turn in [worker_first, !worker_first] {
        if worker_turn {
            let s = b.settings(&format!("l{round}{k}"));
            measured = Some(latency(conn, &s, &b.worker, rate, secs, None).await?);
            b.teardown.namespace(&s).await;
        } else {
            let p = b.settings(&format!("lp{round}{k}"));
            pass = Some(live_pass_through(conn, &p, rate, secs).await?);
            b.teardown.ceiling(&p).await;
        }
    }
    let mut l = measured.expect("the worker's pass ran");
    l.pass_through = pass;
    Ok(l)
}

/// The worker's pass again at `rate`, the worker and Redis under SCHED_FIFO 10;
/// `None` where that cannot be (said on stderr).
async fn realtime_pass(b: &Bench, conn: &Connection, rate: f64, secs: u64) -> Option<Latency> {
    let pid = match redis_pid(&b.settings_in("qb")) {
        Ok(pid) => pid,
        Err(e) => {
            eprintln!("      real-time pass skipped: {e:#}");
            return None;
        }
    };
    header(
        "latency",
        format!("again at {rate:.0} jobs/s, the worker and Redis (pid {pid}) under SCHED_FIFO 10"),
    );
    let s = b.settings("lr");
    let l = match latency(conn, &s, &b.worker, rate, secs, Some(pid)).await {
        Ok(mut l) => {
            l.share_of_ceiling = 0.5;
            Some(l)
        }
        Err(e) => {
            eprintln!("      skipped: {e:#}");
            None
        }
    };
    b.teardown.namespace(&s).await;
    l
}

/// Admission latency with jobs arriving at `rate` per second (no backlog); with
/// `realtime_redis`, the worker and that Redis run under SCHED_FIFO.
async fn latency(
    conn: &Connection,
    s: &Settings,
    bin: &Path,
    rate: f64,
    secs: u64,
    realtime_redis: Option<u32>,
) -> Result<Latency> {
    let topology = Topology::from_settings(s);
    topology.declare(conn).await?;
    let (mut child, port) = spawn_worker(bin, s, &[])?;
    let measured = offer_to_worker(
        conn,
        &topology,
        &mut child,
        port,
        rate,
        secs,
        realtime_redis,
    )
    .await;
    stop(&mut child);
    let (sent, end_to_end, metrics) = measured?;
    if let Ok(dir) = std::env::var("QW_BENCH_METRICS_DIR") {
        let _ = std::fs::write(Path::new(&dir).join("latency-metrics.txt"), &metrics);
    }
    let q = quantiles(&metrics, "quota_worker_admission_seconds");
    let call = quantiles(&metrics, "quota_worker_admission_call_seconds");
    let ms = |q: &HashMap<String, f64>, k: &str| q.get(k).map(|v| v * 1e3);
    Ok(Latency {
        scheduling: if realtime_redis.is_some() {
            "SCHED_FIFO 10".into()
        } else {
            "default".into()
        },
        offered_jobs_per_sec: rate,
        seconds: secs,
        jobs: sent,
        admission_p50_ms: ms(&q, "0.5"),
        admission_p99_ms: ms(&q, "0.99"),
        admission_p999_ms: ms(&q, "0.999"),
        redis_call_p50_ms: ms(&call, "0.5"),
        redis_call_p99_ms: ms(&call, "0.99"),
        redis_call_p999_ms: ms(&call, "0.999"),
        jobs_per_redis_call: metric_sum(&metrics, "quota_worker_admission_batch_jobs_sum")
            .zip(metric_sum(
                &metrics,
                "quota_worker_admission_batch_jobs_count",
            ))
            .filter(|(_, n)| *n > 0.0)
            .map(|(sum, n)| sum / n),
        end_to_end: Some(end_to_end),
        ..Default::default()
    })
}

/// Offers jobs at `rate` for `secs` to the worker `child` (ready on `port`), times
/// their arrival in the dispatch queue, then lets the last jobs through: the jobs
/// sent, their publish-to-arrival times and the worker's last `/metrics`.
async fn offer_to_worker(
    conn: &Connection,
    topology: &Topology,
    child: &mut Child,
    port: u16,
    rate: f64,
    secs: u64,
    realtime_redis: Option<u32>,
) -> Result<(u64, EndToEnd, String)> {
    // with `realtime_redis`, the worker and Redis run ahead of the broker and the load
    // generator whenever they are ready to (restored when the guards drop)
    let _realtime = match realtime_redis {
        Some(redis) => Some((Realtime::set(child.id())?, Realtime::set(redis)?)),
        None => None,
    };
    wait_ready(port, child).await?;
    let arrivals = Arrivals::start(conn, &topology.dispatch_queue("sms")).await?;
    let sent = offer(
        conn,
        &topology.amqp.jobs_exchange,
        "",
        rate,
        secs,
        latency_job,
    )
    .await?;
    let end_to_end = arrivals.finish(sent).await?;
    // let the last jobs through
    let mut metrics = String::new();
    for _ in 0..100 {
        metrics = scrape(port).unwrap_or_default();
        if outcome_counts(&metrics).values().sum::<u64>() >= sent {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok((sent, end_to_end, metrics))
}

/// Per offered share of the ceiling, the medians over the rounds (default
/// scheduling, the passes with a pass-through beside them).
fn summarise_latency(all: &[Latency]) -> Vec<LatencySummary> {
    [0.5, 0.25]
        .into_iter()
        .filter_map(|share| {
            let ls: Vec<&Latency> = all
                .iter()
                .filter(|l| l.share_of_ceiling == share && l.pass_through.is_some())
                .collect();
            if ls.is_empty() {
                return None;
            }
            let w = |f: fn(&EndToEnd) -> f64| {
                median(
                    ls.iter()
                        .filter_map(|l| l.end_to_end.as_ref().map(f))
                        .collect(),
                )
            };
            let p = |f: fn(&EndToEnd) -> f64| {
                median(
                    ls.iter()
                        .filter_map(|l| l.pass_through.as_ref().map(f))
                        .collect(),
                )
            };
            let gaps: Vec<f64> = ls
                .iter()
                .filter_map(|l| {
                    Some(l.end_to_end.as_ref()?.p99_ms - l.pass_through.as_ref()?.p99_ms)
                })
                .collect();
            let gap = median(gaps.clone());
            Some(LatencySummary {
                share_of_ceiling: share,
                rounds: ls.len(),
                offered_jobs_per_sec: ls.iter().map(|l| l.offered_jobs_per_sec).collect(),
                worker_p50_ms: w(|e| e.p50_ms),
                worker_p99_ms: w(|e| e.p99_ms),
                worker_p999_ms: w(|e| e.p999_ms),
                pass_through_p50_ms: p(|e| e.p50_ms),
                pass_through_p99_ms: p(|e| e.p99_ms),
                pass_through_p999_ms: p(|e| e.p999_ms),
                p99_gap_ms: gaps,
                p99_gap_median_ms: gap,
                admission_p99_ms: ls.iter().map(|l| l.admission_p99_ms).collect(),
                within_2ms: gap <= 2.0,
            })
        })
        .collect()
}
