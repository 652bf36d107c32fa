//! The mixes (`--steps a,b,c`): (a) all allowed, (b) Zipf-skewed recipients (many
//! capped and delayed), (c) all malformed. Each round is a ceiling and, right after
//! it, the real `quota-worker run` draining a preloaded backlog of the mix ([`drain`],
//! which the scale step uses too); the round with the median ratio is reported.

use std::collections::HashMap;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Channel, Connection};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;

use crate::broker::{closed, connect, preload};
use crate::ceiling::ceiling;
use crate::context::{header, Bench};
use crate::jobs::job_bodies;
use crate::metrics::{metric_sum, outcome_counts, quantiles, scrape};
use crate::procs::{spawn_worker, spawn_worker_configured, stop, wait_ready};
use crate::report::{MixResult, Report, RoundResult};
use crate::sample::{cpu_secs, cpu_snapshot, rss_mib};

/// The mixes, in run order; each runs when `--steps` names its first letter.
pub const MIXES: [&str; 3] = ["a-allowed", "b-zipf", "c-malformed"];

/// The step of `--steps` that runs `mix`: its letter.
pub fn step_name(mix: &str) -> &str {
    &mix[..1]
}

/// Runs the paired rounds of `MIXES[i]` and adds the median one to `report`.
pub async fn step(b: &Bench, i: usize, report: &mut Report) -> Result<()> {
    let mix = MIXES[i];
    header(
        step_name(mix),
        format!(
            "{mix}: {} jobs; rounds (a ceiling, then the worker draining them): {}",
            b.jobs, b.rounds
        ),
    );
    let mut done = Vec::new();
    for round in 0..b.rounds {
        let (s, r) = paired_round(b, mix, i, round).await?;
        eprintln!(
            "      {mix} round {}: {:.0} jobs/s, ceiling {:.0} msgs/s ({:.2} of it)",
            round + 1,
            r.jobs_per_sec,
            r.ceiling_jobs_per_sec,
            r.ratio_to_ceiling
        );
        b.teardown.namespace(&s).await;
        done.push(r);
    }
    let ratios: Vec<f64> = done.iter().map(|r| r.ratio_to_ceiling).collect();
    let all: Vec<RoundResult> = done
        .iter()
        .map(|r| RoundResult {
            jobs_per_sec: r.jobs_per_sec,
            ceiling_msgs_per_sec: r.ceiling_jobs_per_sec,
            ratio: r.ratio_to_ceiling,
            cpu_us_per_job: r.cpu_us_per_job.iter().sum(),
            ceiling_cpu_us_per_msg: r.ceiling_cpu_us_per_msg.iter().sum(),
        })
        .collect();
    done.sort_by(|a, b| a.ratio_to_ceiling.total_cmp(&b.ratio_to_ceiling));
    let mut median = done.swap_remove(done.len() / 2);
    median.round_ratios = ratios;
    median.rounds = all;
    report.mixes.push(median);
    Ok(())
}

/// One ceiling and, right after it, one run of `mix`, so both see the same machine;
/// returns the mix's settings (for clean-up) and its result against that ceiling. A
/// round the broker breaks off (RabbitMQ 3.10's segment writer can crash while a
/// deleted quorum queue's segments are truncated, closing every connection) is run
/// again once, on a new connection.
async fn paired_round(
    b: &Bench,
    mix: &str,
    i: usize,
    round: usize,
) -> Result<(Settings, MixResult)> {
    for attempt in 0..2 {
        let c = b.settings(&format!("c{i}r{round}a{attempt}"));
        let s = b.settings(&format!("m{i}r{round}a{attempt}"));
        let conn = connect(&b.args.amqp).await?;
        let result = async {
            let (ceiling, cpu) = ceiling(&c, mix, b.jobs).await?;
            b.teardown.ceiling(&c).await;
            let mut r = drain(&conn, &s, &b.worker, mix, b.jobs, &[], None).await?;
            r.ceiling_jobs_per_sec = ceiling;
            r.ceiling_cpu_us_per_msg = cpu;
            r.ratio_to_ceiling = r.jobs_per_sec / ceiling;
            Ok::<_, anyhow::Error>(r)
        }
        .await;
        match result {
            Ok(r) => {
                let _ = closed(conn.close(200, "bye".into())).await;
                return Ok((s, r));
            }
            Err(e) if attempt == 0 => {
                eprintln!("      round broken off ({e:#}); running it again");
                tokio::time::sleep(Duration::from_secs(5)).await;
                b.teardown.ceiling(&c).await;
                b.teardown.namespace(&s).await;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the second attempt returns")
}

/// `n` jobs of `mix` preloaded into the topology of `s`, then drained by the worker
/// (`bin`, with `env` added to its environment and `config` as its `--config`):
/// jobs per second from the moment it consumes, its outcomes, admission quantiles
/// and Redis calls from its `/metrics`, its RSS over the drain, and CPU per job of
/// the broker, Redis and the worker.
pub async fn drain(
    conn: &Connection,
    s: &Settings,
    bin: &Path,
    mix: &str,
    n: usize,
    env: &[(String, String)],
    config: Option<&Path>,
) -> Result<MixResult> {
    let topology = Topology::from_settings(s);
    topology.declare(conn).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    preload(&ch, &s.amqp.jobs_exchange, "", job_bodies(mix, n)).await?;

    let cpu_before = cpu_snapshot();
    let (mut child, port) = match config {
        Some(config) => spawn_worker_configured(bin, s, env, config)?,
        None => spawn_worker(bin, s, env)?,
    };
    // the clock starts when the worker consumes (its start-up is not throughput)
    wait_ready(port, &mut child).await?;
    let started = Instant::now();
    let watch = conn.create_channel().await?;
    let result = watch_drain(conn, &watch, &topology, &mut child, port, n, started).await;
    let secs = started.elapsed().as_secs_f64();
    let peak = rss_mib(child.id(), "VmHWM").unwrap_or(0.0);
    let cpu_after = cpu_snapshot();
    let worker_cpu = cpu_secs(child.id()).unwrap_or(0.0);
    let per_job = |i: usize| (cpu_after[i] - cpu_before[i]) * 1e6 / n as f64;
    let cpu_us_per_job = [per_job(0), per_job(1), worker_cpu * 1e6 / n as f64];
    stop(&mut child);
    // bounded: a close the broker never confirms must not hold the run
    let _ = closed(watch.close(200, "".into())).await;
    let watched = result?;
    let q = quantiles(&watched.metrics, "quota_worker_admission_seconds");
    let calls = metric_sum(&watched.metrics, "quota_worker_redis_calls_total");
    Ok(MixResult {
        name: mix.into(),
        jobs: n,
        seconds: secs,
        jobs_per_sec: n as f64 / secs,
        outcomes: watched.outcomes,
        admission_p50_ms: q.get("0.5").map(|v| v * 1e3),
        admission_p99_ms: q.get("0.99").map(|v| v * 1e3),
        admission_p999_ms: q.get("0.999").map(|v| v * 1e3),
        redis_calls_per_job: calls.map(|c| c / n as f64),
        peak_rss_mib: peak,
        rss_curve_mib: watched.rss_curve,
        cpu_us_per_job,
        ..Default::default()
    })
}

/// What [`watch_drain`] saw: the last `/metrics` (empty when the worker serves
/// none), the outcomes and the RSS curve (seconds, MiB).
struct Watched {
    metrics: String,
    outcomes: HashMap<String, u64>,
    rss_curve: Vec<(f64, f64)>,
}

/// Until the worker has settled `n` jobs: its RSS every 20 ms; /metrics (which the
/// worker renders, on its own CPU) only once the jobs queue has nothing ready (the
/// broker says so on `watch`, at no cost to the worker: what is left is at most its
/// prefetch), and then only as often as the end could be near: half the time the
/// rate so far needs for what is left, between 10 and 250 ms. (Scraping every few
/// milliseconds through the run cost the worker up to 5 % of its instructions, more
/// the more series it serves.) A worker without a metrics endpoint is followed by
/// the depth of its output queues.
async fn watch_drain(
    conn: &Connection,
    watch: &Channel,
    topology: &Topology,
    child: &mut Child,
    port: u16,
    n: usize,
    started: Instant,
) -> Result<Watched> {
    let mut rss_curve = Vec::new();
    let mut next_scrape = Instant::now();
    let mut backlog_left = true;
    loop {
        tokio::time::sleep(Duration::from_millis(10)).await;
        if rss_curve
            .last()
            .is_none_or(|&(t, _)| started.elapsed().as_secs_f64() - t >= 0.02)
        {
            if let Some(rss) = rss_mib(child.id(), "VmRSS") {
                rss_curve.push((started.elapsed().as_secs_f64(), rss));
            }
        }
        if Instant::now() < next_scrape {
            continue;
        }
        if backlog_left {
            backlog_left = ready_in(watch, &topology.amqp.jobs_queue).await? > 0;
            if backlog_left {
                continue;
            }
        }
        match scrape(port) {
            Ok(metrics) if metrics.contains("quota_worker_jobs_total") => {
                let outcomes = outcome_counts(&metrics);
                let settled = outcomes.values().sum::<u64>();
                if settled >= n as u64 {
                    return Ok(Watched {
                        metrics,
                        outcomes,
                        rss_curve,
                    });
                }
                let left = if settled == 0 {
                    f64::INFINITY
                } else {
                    started.elapsed().as_secs_f64() * (n as u64 - settled) as f64 / settled as f64
                };
                next_scrape =
                    Instant::now() + Duration::from_secs_f64((left / 2.0).clamp(0.01, 0.25));
            }
            _ => {
                // no metrics endpoint: count where the jobs went
                next_scrape = Instant::now() + Duration::from_millis(20);
                let settled = settled_by_queues(conn, topology).await?;
                if settled >= n as u64 {
                    return Ok(Watched {
                        metrics: String::new(),
                        outcomes: HashMap::from([(
                            "settled (by queue depth)".to_string(),
                            settled,
                        )]),
                        rss_curve,
                    });
                }
            }
        }
        if let Some(status) = child.try_wait()? {
            bail!("the worker exited early: {status}");
        }
        if started.elapsed() > Duration::from_secs(1800) {
            bail!("the mix did not finish in 30 minutes");
        }
    }
}

/// The messages ready in `queue` (not counting those delivered and unacked).
async fn ready_in(ch: &lapin::Channel, queue: &str) -> Result<u32> {
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let info = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await?;
    Ok(info.message_count())
}

/// The messages in every queue of `t` but the jobs queue: the jobs settled, counted
/// by where they went.
async fn settled_by_queues(conn: &Connection, t: &Topology) -> Result<u64> {
    let ch = conn.create_channel().await?;
    let mut total = 0u64;
    for q in t.queues().iter().filter(|q| **q != t.amqp.jobs_queue) {
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        if let Ok(info) = ch
            .queue_declare(q.as_str().into(), passive, FieldTable::default())
            .await
        {
            total += info.message_count() as u64;
        }
    }
    let _ = ch.close(200, "".into()).await;
    Ok(total)
}
