//! `bench`: throughput, latency and memory of the worker against the broker's own
//! ceiling, measured in one run on one machine.
//!
//! ```text
//! cargo build --release --bins && target/release/bench --quick
//! ```
//!
//! Steps, each on a fresh set of queues and keys:
//! 1. **ceiling**: a minimal pass-through with the worker's broker settings (quorum
//!    queues, persistent messages, publisher confirms, manual acks after the confirm,
//!    the same prefetch); no Redis.
//! 2. **engine**: `redis-benchmark` running `lua/admit.lua` by EVALSHA, then the
//!    engine's own admissions with many in flight, on the same Redis.
//! 3. **mixes** (a) all allowed, (b) Zipf-skewed recipients (many capped and
//!    delayed), (c) all malformed: the real `quota-worker run` binary drains a
//!    preloaded backlog; its `/metrics` gives latency and Redis calls, `/proc` its RSS.
//! 4. **latency**: in each round, a ceiling, then jobs offered at half its rate and
//!    at a quarter, to the worker and to the pass-through (the ceiling's relay, live)
//!    in turn, the order alternating. The load generator stamps each job with a
//!    header (`x-bench-sent-us`) and a consumer in the benchmark on the output queue
//!    records publish-to-arrival times (end to end, as the pipe sees it); the
//!    admission quantiles from the worker's histogram are the breakdown. A last pass
//!    with the worker and Redis under `SCHED_FIFO` (by `chrt`, where permitted).
//! 5. **memory**: Redis `used_memory` growth per recipient holding three sends.
//! 6. **scale** (only when asked for): keys of 10,000 and of 10,000,000 recipients
//!    already in Redis, 1 and 10 policies in use; rounds of a ceiling and every
//!    configuration, the order alternating: jobs/s and CPU per job.
//!
//! Results: a table on stdout, `<out>/bench.json` and `<out>/bench.svg`.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use quota_worker::amqp::{delete_all, Topology};
use quota_worker::config::{RuleSettings, Settings};
use quota_worker::engine::{Engine, Request};
use quota_worker::job::headers;
use rand::SeedableRng;
use rand_distr::Distribution;
use serde::Serialize;

#[derive(Parser, Debug)]
#[command(about = "Benchmark quota-worker against the broker's own ceiling")]
struct Args {
    /// A short run (under a minute) for CI.
    #[arg(long)]
    quick: bool,
    /// Jobs per mix (default 30,000 quick, 200,000 full).
    #[arg(long)]
    jobs: Option<usize>,
    /// Recipients for the memory step (default 10,000 quick, 1,000,000 full).
    #[arg(long)]
    recipients: Option<usize>,
    /// Steps to run (comma-separated: engine, rate, a, b, c, latency, memory, scale);
    /// each mix, each latency round and each scale round measure their own ceiling
    /// right before. `scale` is not in the default run (it preloads millions of keys).
    #[arg(
        long,
        default_value = "engine,a,b,c,latency,memory",
        value_delimiter = ','
    )]
    steps: Vec<String>,
    /// Seconds each latency pass offers jobs (default 10 quick, 30 full).
    #[arg(long)]
    latency_secs: Option<u64>,
    /// The scale step: recipients already in Redis, one run each (default 10,000 and
    /// 100,000 quick; 10,000 and 10,000,000 full).
    #[arg(long, value_delimiter = ',')]
    scale_recipients: Vec<usize>,
    /// The scale step: policies in use, one run each with every recipient count.
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    scale_policies: Vec<usize>,
    /// Paired runs (ceiling, then mix) per mix; the round with the median ratio is
    /// reported, and every round's ratio is listed (default 1 quick, 5 full).
    #[arg(long)]
    rounds: Option<usize>,
    /// Prefetch for the ceiling and the worker alike (default: the worker's default).
    #[arg(long)]
    prefetch: Option<u16>,
    /// Skip the latency step's second pass, with the worker and Redis under
    /// real-time scheduling (SCHED_FIFO, by `chrt`).
    #[arg(long)]
    no_realtime: bool,
    /// Delete queues only at the end of the run (always so from 500,000 jobs per mix).
    #[arg(long)]
    defer_deletes: bool,
    /// Where to write bench.json and bench.svg.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// The worker binary (default: `quota-worker` next to this one).
    #[arg(long)]
    worker: Option<PathBuf>,
    /// AMQP URL.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    amqp: String,
    /// Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    redis: String,
    /// Run the worker on a Redis Cluster instead, given its nodes' URLs
    /// (comma-separated; `bench/cluster.sh` starts three masters on loopback).
    /// Mixes and the latency step only; Redis CPU is the sum of the nodes'.
    #[arg(long, value_delimiter = ',')]
    redis_cluster: Vec<String>,
}

/// The Redis Cluster nodes of `--redis-cluster` (empty: one node, `--redis`).
static CLUSTER_URLS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

fn cluster_urls() -> &'static [String] {
    CLUSTER_URLS.get().map(Vec::as_slice).unwrap_or_default()
}

#[derive(Serialize, Debug, Clone, Default)]
struct MixResult {
    name: String,
    jobs: usize,
    seconds: f64,
    jobs_per_sec: f64,
    ceiling_jobs_per_sec: f64,
    ratio_to_ceiling: f64,
    outcomes: HashMap<String, u64>,
    admission_p50_ms: Option<f64>,
    admission_p99_ms: Option<f64>,
    admission_p999_ms: Option<f64>,
    redis_calls_per_job: Option<f64>,
    peak_rss_mib: f64,
    rss_curve_mib: Vec<(f64, f64)>,
    /// CPU microseconds per job: broker, Redis, worker.
    cpu_us_per_job: [f64; 3],
    /// CPU microseconds per message in the paired ceiling: broker, Redis, client.
    ceiling_cpu_us_per_msg: [f64; 3],
    /// The ratio to the ceiling of every paired round, in run order.
    round_ratios: Vec<f64>,
    /// Every paired round, in run order.
    rounds: Vec<RoundResult>,
}

/// One paired round: the mix and its own ceiling.
#[derive(Serialize, Debug, Clone, Default)]
struct RoundResult {
    jobs_per_sec: f64,
    ceiling_msgs_per_sec: f64,
    ratio: f64,
    /// Broker + Redis + worker CPU microseconds per job.
    cpu_us_per_job: f64,
    /// Broker + client CPU microseconds per message in the ceiling.
    ceiling_cpu_us_per_msg: f64,
}

#[derive(Serialize, Debug, Clone, Default)]
struct Latency {
    /// How the worker and Redis were scheduled: "default", or "SCHED_FIFO 10" for
    /// both (the broker and the load generator keep the default).
    scheduling: String,
    offered_jobs_per_sec: f64,
    seconds: u64,
    jobs: u64,
    admission_p50_ms: Option<f64>,
    admission_p99_ms: Option<f64>,
    admission_p999_ms: Option<f64>,
    /// One admission script call (a batch of jobs) from sending it to its reply.
    redis_call_p50_ms: Option<f64>,
    redis_call_p99_ms: Option<f64>,
    redis_call_p999_ms: Option<f64>,
    /// Jobs per admission script call, on average.
    jobs_per_redis_call: Option<f64>,
    /// The round (each round measures its own ceiling) and the share of that ceiling
    /// offered.
    round: usize,
    share_of_ceiling: f64,
    ceiling_msgs_per_sec: f64,
    /// Publish to arrival in the dispatch queue, as the load generator sees it.
    end_to_end: Option<EndToEnd>,
    /// The same for the pass-through (the ceiling's relay, live) at the same rate in
    /// the same round: publish to arrival in its output queue.
    pass_through: Option<EndToEnd>,
}

/// Publish-to-arrival times of one pass, from a header the load generator stamps
/// and a consumer in the benchmark on the output queue.
#[derive(Serialize, Debug, Clone, Default)]
struct EndToEnd {
    sent: u64,
    arrived: u64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// (quantile, ms), denser towards the tail, for the plot.
    curve: Vec<(f64, f64)>,
}

/// One offered rate over the latency rounds: medians of the end-to-end quantiles,
/// worker against pass-through, and every round's p99s.
#[derive(Serialize, Debug, Clone, Default)]
struct LatencySummary {
    share_of_ceiling: f64,
    rounds: usize,
    offered_jobs_per_sec: Vec<f64>,
    worker_p50_ms: f64,
    worker_p99_ms: f64,
    worker_p999_ms: f64,
    pass_through_p50_ms: f64,
    pass_through_p99_ms: f64,
    pass_through_p999_ms: f64,
    /// Worker p99 minus pass-through p99, each round, and their median.
    p99_gap_ms: Vec<f64>,
    p99_gap_median_ms: f64,
    admission_p99_ms: Vec<Option<f64>>,
    /// The median gap is at most 2 ms.
    within_2ms: bool,
}

/// One scale configuration (recipients already in Redis, policies in use) over the
/// rounds.
#[derive(Serialize, Debug, Clone, Default)]
struct ScaleResult {
    recipients: usize,
    policies: usize,
    jobs: usize,
    /// Medians over the rounds.
    jobs_per_sec: f64,
    ratio_to_ceiling: f64,
    cpu_us_per_job: f64,
    /// Broker / Redis / worker, medians of each.
    cpu_us_per_job_parts: [f64; 3],
    redis_us_per_job: f64,
    rounds: Vec<ScaleRound>,
}

#[derive(Serialize, Debug, Clone, Default)]
struct ScaleRound {
    jobs_per_sec: f64,
    ceiling_msgs_per_sec: f64,
    ratio: f64,
    cpu_us_per_job: [f64; 3],
    ceiling_cpu_us_per_msg: [f64; 3],
    admission_p99_ms: Option<f64>,
    redis_calls_per_job: Option<f64>,
    outcomes: HashMap<String, u64>,
}

#[derive(Serialize, Debug, Default)]
struct Report {
    machine: String,
    quick: bool,
    jobs_per_mix: usize,
    ceiling_jobs_per_sec: f64,
    redis_benchmark_evalsha_per_sec: Option<f64>,
    engine_admissions_per_sec: f64,
    engine_ratio: Option<f64>,
    engine_redis_calls_per_admission: f64,
    /// One channel's rate key: decisions per second, one per call (redis-benchmark).
    rate_key_evalsha_per_sec: Option<f64>,
    /// The same key through the engine's batched takes, 256 jobs asking at once.
    rate_key_engine_per_sec: Option<f64>,
    /// Redis calls per take of those.
    rate_key_engine_calls_per_take: Option<f64>,
    mixes: Vec<MixResult>,
    latency: Vec<Latency>,
    latency_summary: Vec<LatencySummary>,
    scale: Vec<ScaleResult>,
    /// Seconds to write the scale step's keys, and the keys written.
    scale_preload: Vec<(usize, u64, f64)>,
    memory_recipients: usize,
    memory_bytes_per_recipient: f64,
    memory_usage_one_recipient: i64,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(args))
}

/// `s` with the default policy's rules replaced by one: `limit` per `window`.
fn with_default_rule(s: &Settings, limit: u32, window: &str) -> Settings {
    let mut s = s.clone();
    s.policies
        .get_mut("default")
        .expect("a default policy")
        .rules = vec![RuleSettings {
        limit,
        window: window.parse().expect("a valid window"),
    }];
    s
}

fn base_settings(args: &Args, ns: &str) -> Result<Settings> {
    let mut s = Settings::defaults().in_namespace(ns);
    s.amqp.url = args.amqp.clone();
    s.redis.url = args.redis.clone();
    if !args.redis_cluster.is_empty() {
        s.redis.cluster = true;
        s.redis.cluster_urls = args.redis_cluster.clone();
    }
    if let Some(p) = args.prefetch {
        s.amqp.prefetch = p;
    }
    Ok(s)
}

fn worker_env(s: &Settings, port: u16) -> Vec<(String, String)> {
    let a = &s.amqp;
    [
        ("AMQP__URL", a.url.clone()),
        ("AMQP__JOBS_EXCHANGE", a.jobs_exchange.clone()),
        ("AMQP__JOBS_QUEUE", a.jobs_queue.clone()),
        ("AMQP__DISPATCH_EXCHANGE", a.dispatch_exchange.clone()),
        (
            "AMQP__DISPATCH_QUEUE_PREFIX",
            a.dispatch_queue_prefix.clone(),
        ),
        ("AMQP__DEAD_EXCHANGE", a.dead_exchange.clone()),
        ("AMQP__DEAD_QUEUE", a.dead_queue.clone()),
        ("AMQP__DELAY_PREFIX", a.delay_prefix.clone()),
        ("AMQP__PREFETCH", a.prefetch.to_string()),
        ("REDIS__URL", s.redis.url.clone()),
        ("REDIS__KEY_PREFIX", s.redis.key_prefix.clone()),
        ("REDIS__CLUSTER", s.redis.cluster.to_string()),
        ("REDIS__CLUSTER_URLS", s.redis.cluster_urls.join(",")),
        ("WORKER__THREADS", s.worker.threads.to_string()),
        ("HTTP__ENABLED", "true".into()),
        ("HTTP__LISTEN", format!("127.0.0.1:{port}")),
    ]
    .into_iter()
    .map(|(k, v)| (format!("QUOTA_WORKER__{k}"), v))
    .collect()
}

async fn run(args: Args) -> Result<()> {
    let jobs = args
        .jobs
        .unwrap_or(if args.quick { 30_000 } else { 200_000 });
    let rounds = args.rounds.unwrap_or(if args.quick { 1 } else { 5 }).max(1);
    let recipients = args
        .recipients
        .unwrap_or(if args.quick { 10_000 } else { 1_000_000 });
    let worker_bin = match &args.worker {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("quota-worker"),
    };
    if !worker_bin.exists() {
        bail!(
            "{} not found: build it first (cargo build --release --bins)",
            worker_bin.display()
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let run_id = format!("bench{}", std::process::id());
    // every queue and key of the run starts with this
    eprintln!("run {run_id}");
    let conn = connect(&args.amqp).await?;
    let teardown = Teardown {
        amqp: args.amqp.clone(),
        defer: args.defer_deletes || jobs >= 500_000,
        pending: Default::default(),
    };
    let mut report = Report {
        machine: machine(),
        quick: args.quick,
        jobs_per_mix: jobs,
        ..Default::default()
    };

    if !args.redis_cluster.is_empty() {
        CLUSTER_URLS.set(args.redis_cluster.clone()).ok();
        if args
            .steps
            .iter()
            .any(|s| ["engine", "rate", "memory"].contains(&s.as_str()))
        {
            bail!(
                "--redis-cluster runs the mixes and the latency step only (--steps a,b,c,latency)"
            );
        }
    }
    let step = |name: &str| args.steps.iter().any(|s| s == name);

    if step("engine") {
        eprintln!("[2/4] engine: admissions through Redis");
        let s = base_settings(&args, &format!("{run_id}e"))?;
        report.redis_benchmark_evalsha_per_sec = redis_benchmark(&s, jobs.min(100_000)).ok();
        let (rate, calls) = engine_admissions(&s, jobs.min(100_000)).await?;
        report.engine_admissions_per_sec = rate;
        report.engine_redis_calls_per_admission = calls;
        report.engine_ratio = report.redis_benchmark_evalsha_per_sec.map(|b| rate / b);
        eprintln!(
            "      engine {:.0}/s, redis-benchmark EVALSHA {:?}/s",
            rate, report.redis_benchmark_evalsha_per_sec
        );
        delete_keys(&s.redis.url, &s.redis.key_prefix)?;
    }

    if step("rate") {
        eprintln!("      rate: decisions per second on one channel's rate key");
        let s = base_settings(&args, &format!("{run_id}r"))?;
        let (one, batched, calls) = rate_key(&s, jobs.min(100_000)).await?;
        report.rate_key_evalsha_per_sec = Some(one);
        report.rate_key_engine_per_sec = Some(batched);
        report.rate_key_engine_calls_per_take = Some(calls);
        eprintln!(
            "      rate key: {one:.0} decisions/s one per call (redis-benchmark EVALSHA), {batched:.0}/s through the engine's batched takes ({calls:.3} calls each)"
        );
        delete_keys(&s.redis.url, &s.redis.key_prefix)?;
    }

    eprintln!("[3/4] worker mixes");
    for (i, mix) in ["a-allowed", "b-zipf", "c-malformed"]
        .into_iter()
        .enumerate()
    {
        if !step(&mix[..1]) {
            continue;
        }
        let mut done = Vec::new();
        for round in 0..rounds {
            let (s, r) =
                paired_round(&args, &teardown, &run_id, &worker_bin, mix, i, round, jobs).await?;
            eprintln!(
                "      {mix} round {}: {:.0} jobs/s, ceiling {:.0} msgs/s ({:.2} of it)",
                round + 1,
                r.jobs_per_sec,
                r.ceiling_jobs_per_sec,
                r.ratio_to_ceiling
            );
            teardown.namespace(&s).await;
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
    }
    if !report.mixes.is_empty() {
        report.ceiling_jobs_per_sec = report
            .mixes
            .iter()
            .map(|m| m.ceiling_jobs_per_sec)
            .sum::<f64>()
            / report.mixes.len() as f64;
    }

    if step("latency") {
        let conn = connect(&args.amqp).await?;
        let secs = args
            .latency_secs
            .unwrap_or(if args.quick { 10 } else { 30 });
        // `QW_BENCH_RATE` fixes the first rate (the second is half of it)
        let fixed: Option<f64> = std::env::var("QW_BENCH_RATE")
            .ok()
            .and_then(|r| r.parse().ok());
        let mut half_rate = 0.0;
        for round in 0..rounds {
            let c = base_settings(&args, &format!("{run_id}lc{round}"))?;
            let (ceiling, _) = ceiling(&c, "a-allowed", jobs).await?;
            teardown.ceiling(&c).await;
            let reference = fixed.map_or(ceiling, |r| r * 2.0);
            for (k, share) in [0.5, 0.25].into_iter().enumerate() {
                let rate = reference * share;
                if k == 0 {
                    half_rate = rate;
                }
                // alternate which of the two goes first
                let worker_first = (round + k) % 2 == 1;
                eprintln!(
                    "[3b] latency round {}: {rate:.0} jobs/s ({share} of the ceiling of {ceiling:.0}) for {secs} s, {} first",
                    round + 1,
                    if worker_first { "worker" } else { "pass-through" }
                );
                let mut measured = None;
                let mut pass = None;
                for worker_turn in [worker_first, !worker_first] {
                    if worker_turn {
                        let s = base_settings(&args, &format!("{run_id}l{round}{k}"))?;
                        measured = Some(latency(&conn, &s, &worker_bin, rate, secs, None).await?);
                        teardown.namespace(&s).await;
                    } else {
                        let p = base_settings(&args, &format!("{run_id}lp{round}{k}"))?;
                        pass = Some(live_pass_through(&conn, &p, rate, secs).await?);
                        teardown.ceiling(&p).await;
                    }
                }
                let mut l = measured.expect("the worker's pass ran");
                l.round = round;
                l.share_of_ceiling = share;
                l.ceiling_msgs_per_sec = ceiling;
                l.pass_through = pass;
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
        if !args.no_realtime {
            match redis_pid(&base_settings(&args, "qb")?) {
                Ok(pid) => {
                    eprintln!(
                        "[3b] latency again at {half_rate:.0} jobs/s, the worker and Redis (pid {pid}) under SCHED_FIFO 10"
                    );
                    let s = base_settings(&args, &format!("{run_id}lr"))?;
                    match latency(&conn, &s, &worker_bin, half_rate, secs, Some(pid)).await {
                        Ok(mut l) => {
                            l.share_of_ceiling = 0.5;
                            report.latency.push(l)
                        }
                        Err(e) => eprintln!("      skipped: {e:#}"),
                    }
                    teardown.namespace(&s).await;
                }
                Err(e) => eprintln!("      real-time pass skipped: {e:#}"),
            }
        }
    }

    if step("scale") {
        let recipients = if args.scale_recipients.is_empty() {
            if args.quick {
                vec![10_000, 100_000]
            } else {
                vec![10_000, 10_000_000]
            }
        } else {
            args.scale_recipients.clone()
        };
        scale(
            &args,
            &teardown,
            &run_id,
            &worker_bin,
            &recipients,
            jobs,
            rounds,
            &mut report,
        )
        .await?;
    }

    if step("memory") {
        eprintln!("[4/4] memory: {recipients} recipients with three sends each");
        // the default key prefix's length, so MEMORY USAGE is what a user sees
        let s = base_settings(&args, "qb")?;
        let (per, one) = memory(&s, recipients).await?;
        report.memory_recipients = recipients;
        report.memory_bytes_per_recipient = per;
        report.memory_usage_one_recipient = one;
        delete_keys(&s.redis.url, &s.redis.key_prefix)?;
    }

    print_table(&report);
    std::fs::write(
        args.out.join("bench.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    plot(&report, &args.out.join("bench.svg"))?;
    eprintln!("wrote {0}/bench.json and {0}/bench.svg", args.out.display());
    let _ = closed(conn.close(200, "bye".into())).await;
    teardown.finish().await;
    Ok(())
}

async fn connect(url: &str) -> Result<Connection> {
    Connection::connect(url, ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ")
}

/// One ceiling and, right after it, one run of `mix`, so both see the same machine;
/// returns the mix's settings (for clean-up) and its result against that ceiling. A
/// round the broker breaks off (RabbitMQ 3.10's segment writer can crash while a
/// deleted quorum queue's segments are truncated, closing every connection) is run
/// again once, on a new connection.
#[allow(clippy::too_many_arguments)]
async fn paired_round(
    args: &Args,
    teardown: &Teardown,
    run_id: &str,
    worker_bin: &Path,
    mix: &str,
    i: usize,
    round: usize,
    jobs: usize,
) -> Result<(Settings, MixResult)> {
    for attempt in 0..2 {
        let c = base_settings(args, &format!("{run_id}c{i}r{round}a{attempt}"))?;
        let s = base_settings(args, &format!("{run_id}m{i}r{round}a{attempt}"))?;
        let conn = connect(&args.amqp).await?;
        let result = async {
            let (ceiling, cpu) = ceiling(&c, mix, jobs).await?;
            teardown.ceiling(&c).await;
            let mut r = run_mix(&conn, &s, worker_bin, mix, jobs).await?;
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
                teardown.ceiling(&c).await;
                teardown.namespace(&s).await;
            }
            Err(e) => return Err(e),
        }
    }
    unreachable!("the second attempt returns")
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    format!("{cpus} cores, {model}")
}

fn quorum() -> FieldTable {
    let mut t = FieldTable::default();
    t.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    t
}

async fn preload(
    ch: &Channel,
    exchange: &str,
    routing_key: &str,
    bodies: impl Iterator<Item = Vec<u8>>,
) -> Result<()> {
    let mut pending = FuturesUnordered::new();
    let props = BasicProperties::default()
        .with_delivery_mode(2)
        .with_content_type("application/json".into());
    for body in bodies {
        let c = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                &body,
                props.clone(),
            )
            .await?;
        pending.push(c);
        while pending.len() >= 2_000 {
            pending.next().await.transpose()?;
        }
    }
    while pending.next().await.transpose()?.is_some() {}
    Ok(())
}

/// The broker's own ceiling: consume, publish with confirm, ack — no decision — on
/// the same `n` job bodies as `mix`. The pass-through runs as the worker does by
/// default (`worker.threads = 1`): on a thread of its own with a single-threaded
/// runtime and its own connection, so the two differ by the worker's work only.
async fn ceiling(s: &Settings, mix: &str, n: usize) -> Result<(f64, [f64; 3])> {
    let (s, mix) = (s.clone(), mix.to_string());
    tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                let conn = connect(&s.amqp.url).await?;
                let result = pass_through(&conn, &s, &mix, n).await;
                let _ = closed(conn.close(200, "bye".into())).await;
                result
            })
    })
    .await?
}

async fn pass_through(
    conn: &Connection,
    s: &Settings,
    mix: &str,
    n: usize,
) -> Result<(f64, [f64; 3])> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let [src, dst] = ceiling_queues(s);
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    for q in [&src, &dst] {
        ch.queue_declare(q.as_str().into(), durable, quorum())
            .await?;
    }
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
    stop: Option<&tokio_util::sync::CancellationToken>,
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
    stop: Option<&tokio_util::sync::CancellationToken>,
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

/// The ceiling's two queues.
fn ceiling_queues(s: &Settings) -> [String; 2] {
    [
        format!("{}.src", s.amqp.jobs_queue),
        format!("{}.dst", s.amqp.jobs_queue),
    ]
}

/// Deletes what the steps declared: right after each step, or, for long runs, all at
/// the end. RabbitMQ 3.10's quorum-queue segment writer can crash (closing every
/// connection) while it truncates the segments of a queue of a million messages
/// deleted a moment before; a run that deletes nothing until it has measured
/// everything is not broken off by it.
struct Teardown {
    amqp: String,
    defer: bool,
    pending: std::sync::Mutex<Vec<Leftover>>,
}

/// What a step leaves to delete.
enum Leftover {
    /// A ceiling's two queues.
    Ceiling(Settings),
    /// A worker's whole topology and its Redis keys.
    Namespace(Settings),
    /// A worker's whole topology; its keys are someone else's to delete.
    Topology(Settings),
}

impl Teardown {
    /// Delete the ceiling's queues of `s` (now, or at the end of the run).
    async fn ceiling(&self, s: &Settings) {
        self.delete(Leftover::Ceiling(s.clone())).await;
    }

    /// Delete the topology and keys of `s` (now, or at the end of the run).
    async fn namespace(&self, s: &Settings) {
        self.delete(Leftover::Namespace(s.clone())).await;
    }

    /// Delete the topology of `s`, not its keys (now, or at the end of the run).
    async fn topology(&self, s: &Settings) {
        self.delete(Leftover::Topology(s.clone())).await;
    }

    async fn delete(&self, what: Leftover) {
        if self.defer {
            self.pending.lock().unwrap().push(what);
        } else {
            self.delete_now(what).await;
        }
    }

    async fn delete_now(&self, what: Leftover) {
        let Ok(conn) = connect(&self.amqp).await else {
            return;
        };
        // a busy broker can fail the delete of a quorum queue holding 200,000
        // messages: try again a few times, then say what is left
        let (queues, exchanges, keys) = match &what {
            Leftover::Ceiling(s) => (ceiling_queues(s).to_vec(), Vec::new(), None),
            Leftover::Namespace(s) => {
                let topology = Topology::from_settings(s);
                (topology.queues(), topology.exchanges(), Some(s))
            }
            Leftover::Topology(s) => {
                let topology = Topology::from_settings(s);
                (topology.queues(), topology.exchanges(), None)
            }
        };
        let mut result = Ok(());
        for attempt in 0..5 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            result = delete_all(&conn, queues.clone(), exchanges.clone()).await;
            if result.is_ok() {
                break;
            }
        }
        if let Err(e) = result {
            eprintln!("      could not delete every one of {queues:?} {exchanges:?}: {e}");
        }
        match keys {
            Some(s) => {
                let _ = delete_keys(&s.redis.url, &s.redis.key_prefix);
            }
            // give the segment writer time with large queues before the next step
            None => tokio::time::sleep(Duration::from_secs(2)).await,
        }
        let _ = closed(conn.close(200, "bye".into())).await;
    }

    /// Everything deferred so far.
    async fn finish(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap());
        for what in pending {
            self.delete_now(what).await;
        }
    }
}

/// `redis-benchmark` running the admission script by EVALSHA (50 clients).
fn redis_benchmark(s: &Settings, n: usize) -> Result<f64> {
    let key = format!("{}:{{bench__rand_int__}}:default", s.redis.key_prefix);
    evalsha_per_sec(
        s,
        n,
        quota_worker::redis::scripts::ADMIT_LUA,
        &[
            &key,
            // lease, dedupe, no undeclared keys, one plan: valid from 0 to 2^53,
            // no calendar expiry, not shadow, one rule (3 per rolling day); then
            // the job: member, plan 1 (the layout lua/admit.lua opens with)
            "120000",
            "86400000",
            "0",
            "1",
            "0",
            "9007199254740991",
            "0",
            "0",
            "1",
            "3",
            "-86400000",
            "m__rand_int__",
            "1",
        ],
    )
}

/// `redis-benchmark -c 50` running `script` by EVALSHA with one key and `args`
/// (the key first): calls per second.
fn evalsha_per_sec(s: &Settings, n: usize, script: &str, args: &[&str]) -> Result<f64> {
    let client = redis::Client::open(s.redis.url.as_str())?;
    let mut c = client.get_connection()?;
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(script).query(&mut c)?;
    let url = url_host_port(&s.redis.url);
    let out = Command::new("redis-benchmark")
        .args([
            "-h",
            &url.0,
            "-p",
            &url.1,
            "-n",
            &n.to_string(),
            "-c",
            "50",
            "-r",
            "1000000",
            "-q",
        ])
        .args(["EVALSHA", &sha, "1"])
        .args(args)
        .output()
        .context("running redis-benchmark")?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 41152.26 requests per second, p50=..."
    let rate = text
        .split("requests per second")
        .next()
        .and_then(|head| head.rsplit(' ').find(|w| !w.is_empty()))
        .and_then(|w| w.trim().parse::<f64>().ok())
        .with_context(|| format!("unexpected redis-benchmark output: {text}"))?;
    Ok(rate)
}

/// One channel's rate key: decisions per second when each is a call of its own
/// (`redis-benchmark -c 50` running `lua/rate.lua` by EVALSHA on one key), and
/// through the engine's batched takes with 256 jobs asking at once; and the
/// engine's calls per decision. The rate is set far above both, so every take is
/// granted and only the key's own speed counts.
async fn rate_key(s: &Settings, n: usize) -> Result<(f64, f64, f64)> {
    let key = format!("{}:rate:bench", s.redis.key_prefix);
    let one_per_call = evalsha_per_sec(
        s,
        n,
        quota_worker::redis::scripts::RATE_LUA,
        &[&key, "1", "1000000000", "1", "1"],
    )?;
    let engine = Arc::new(Engine::connect(s).await?);
    let rate = quota_worker::quota::policy::Rate {
        interval_us: 1,
        burst: 1_000_000_000,
        cost: 1,
    };
    let started = Instant::now();
    let calls_before = engine.calls();
    let shared = engine.clone();
    on_many_tasks(n, move |_| {
        let engine = shared.clone();
        async move {
            let reply = engine.take_rate("sms", rate).await.expect("take");
            assert_eq!(reply.allowed, 1, "the rate is far above the load");
        }
    })
    .await?;
    let secs = started.elapsed().as_secs_f64();
    let calls = (engine.calls() - calls_before) as f64 / n as f64;
    Ok((one_per_call, n as f64 / secs, calls))
}

fn url_host_port(url: &str) -> (String, String) {
    let rest = url.trim_start_matches("redis://");
    let hostport = rest
        .rsplit('@')
        .next()
        .unwrap_or(rest)
        .split('/')
        .next()
        .unwrap_or(rest);
    match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.to_string()),
        None => (hostport.to_string(), "6379".into()),
    }
}

/// The engine's admissions per second with 256 in flight (distinct recipients, a
/// rolling rule so every admission runs the whole script).
async fn engine_admissions(s: &Settings, n: usize) -> Result<(f64, f64)> {
    let s = with_default_rule(s, 3, "24h");
    let engine = Arc::new(Engine::connect(&s).await?);
    let started = Instant::now();
    let calls_before = engine.calls();
    let shared = engine.clone();
    on_many_tasks(n, move |i| {
        let engine = shared.clone();
        async move {
            let (id, who) = (format!("e{i}"), format!("r{i}"));
            let req = sms_request(&id, &who);
            engine.admit(&req).await.expect("admit");
        }
    })
    .await?;
    let secs = started.elapsed().as_secs_f64();
    Ok((
        n as f64 / secs,
        (engine.calls() - calls_before) as f64 / n as f64,
    ))
}

/// An admission of an `sms` job of the default policy, for a recipient in UTC.
fn sms_request<'a>(id: &'a str, recipient: &'a str) -> Request<'a> {
    Request {
        id,
        recipient,
        channel: "sms",
        category: "default",
        tz: chrono_tz::UTC,
    }
}

/// Runs `job(i)` for every `i` below `n` on 256 tasks (the default prefetch: as
/// many admissions in flight as one worker has).
async fn on_many_tasks<F, Fut>(n: usize, job: F) -> Result<()>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let job = Arc::new(job);
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..256 {
        let (job, next) = (job.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                if i >= n {
                    break;
                }
                job(i).await;
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(())
}

fn job_bodies(mix: &str, n: usize) -> Box<dyn Iterator<Item = Vec<u8>>> {
    match mix {
        "a-allowed" => Box::new((0..n).map(|i| format!(r#"{{"id":"a{i}","recipient":"user{i}@example.com","channel":"sms","timezone":"Europe/Paris","payload":{{"text":"Your code is {i}"}}}}"#).into_bytes())),
        "b-zipf" => {
            let zipf = rand_distr::Zipf::new(100_000.0, 1.1).expect("zipf");
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            Box::new((0..n).map(move |i| {
                let who = zipf.sample(&mut rng) as u64;
                format!(r#"{{"id":"b{i}","recipient":"user{who}@example.com","channel":"sms","timezone":"Asia/Shanghai","payload":{{"text":"news {i}"}}}}"#).into_bytes()
            }))
        }
        scale if scale.starts_with("scale:") => {
            // scale:<recipients>:<policies>:<round>, see `scale_job`
            let v: Vec<usize> = scale[6..].split(':').filter_map(|v| v.parse().ok()).collect();
            let (recipients, policies, round) = (v[0], v[1], v[2]);
            Box::new((0..n).map(move |i| scale_job(recipients, policies, round, n, i).into_bytes()))
        }
        _ => Box::new((0..n).map(|i| format!(r#"{{"id":"c{i}","channel":"sms","payload":"no recipient"}}"#).into_bytes())),
    }
}

/// Recipient `r` of the scale step, and the policy (category) its jobs and keys use
/// with `policies` policies in use: `default`, `p1` .. `p9` in turn.
fn scale_recipient(r: usize, policies: usize) -> (String, String) {
    let policy = match r % policies.max(1) {
        0 => "default".to_string(),
        k => format!("p{k}"),
    };
    (format!("s{r}@example.com"), policy)
}

/// Job `i` of `n` of a scale run: recipients spread over all `recipients` (a
/// stride coprime with them; each round starts further on, so that with many
/// recipients no key is hit twice over the rounds).
fn scale_job(recipients: usize, policies: usize, round: usize, n: usize, i: usize) -> String {
    let r = ((round * n + i) as u64 * 7919 % recipients as u64) as usize;
    let (who, policy) = scale_recipient(r, policies);
    format!(
        r#"{{"id":"s{recipients}p{policies}r{round}j{i}","recipient":"{who}","channel":"sms","category":"{policy}","timezone":"Europe/Paris","payload":{{"text":"Your code is {i}"}}}}"#
    )
}

/// The scale step's configuration for `policies` policies: `default` and `p1`..,
/// each with two rules like the default policy's (a calendar day and a rolling
/// week) but limits no run reaches, so that every job is admitted and dispatched.
fn scale_config(policies: usize) -> String {
    (0..policies.max(1))
        .map(|k| {
            let name = if k == 0 { "default".to_string() } else { format!("p{k}") };
            format!(
                "[policies.{name}]\nrules = [{{ limit = 100000, window = \"1d\" }}, {{ limit = 300000, window = \"7d\" }}]\n\n"
            )
        })
        .collect()
}

/// Writes, for every recipient below `n` and every policy count in `policies`, the
/// key the engine would use, holding three committed sends of the past week (a
/// copy of one such sorted set by DUMP and RESTORE ... REPLACE, pipelined). Returns
/// the keys written.
fn preload_recipients(s: &Settings, n: usize, policies: &[usize]) -> Result<u64> {
    let keys = quota_worker::quota::keys::Keys::from_settings(&s.redis);
    let client = redis::Client::open(s.redis.url.as_str())?;
    let mut c = client.get_connection()?;
    let proto = format!("{}:prototype", s.redis.key_prefix);
    let t: Vec<u64> = redis::cmd("TIME").query(&mut c)?;
    let now_ms = t[0] * 1000;
    let day = 86_400_000u64;
    let _: i64 = redis::cmd("ZADD")
        .arg(&proto)
        .arg((now_ms - day / 2) * 2 + 1)
        .arg("m0000000001a")
        .arg((now_ms - 2 * day) * 2 + 1)
        .arg("m0000000002b")
        .arg((now_ms - 5 * day) * 2 + 1)
        .arg("m0000000003c")
        .query(&mut c)?;
    let payload: Vec<u8> = redis::cmd("DUMP").arg(&proto).query(&mut c)?;
    let _: i64 = redis::cmd("DEL").arg(&proto).query(&mut c)?;
    let ttl = 7 * day;
    let mut written = 0u64;
    let mut in_pipe = 0;
    let mut pipe = redis::pipe();
    for r in 0..n {
        let mut names: Vec<String> = policies.iter().map(|&p| scale_recipient(r, p).1).collect();
        names.dedup();
        names.sort();
        names.dedup();
        let who = format!("s{r}@example.com");
        for policy in names {
            pipe.cmd("RESTORE")
                .arg(keys.recipient(&who, &policy, None))
                .arg(ttl)
                .arg(&payload[..])
                .arg("REPLACE")
                .ignore();
            written += 1;
            in_pipe += 1;
        }
        if in_pipe >= 10_000 {
            pipe.query::<()>(&mut c)?;
            pipe = redis::pipe();
            in_pipe = 0;
        }
    }
    if in_pipe > 0 {
        pipe.query::<()>(&mut c)?;
    }
    Ok(written)
}

/// Until no table of database 0 is being rehashed (`DEBUG HTSTATS 0` lists a
/// "rehashing target" while one is): Redis's cron alone moves about 8,000 keys a
/// second, half an hour for 19,000,000, but every lookup moves a bucket of each
/// table it looks in, so the keys written are looked up (`EXISTS`, pipelined, which
/// also looks up their expiry) 100,000 at a time, in turn, until it is done.
fn wait_rehashed(s: &Settings, n: usize, policies: &[usize]) -> Result<()> {
    let keys = quota_worker::quota::keys::Keys::from_settings(&s.redis);
    let mut c = redis::Client::open(s.redis.url.as_str())?.get_connection()?;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut r = 0;
    loop {
        let stats: String = redis::cmd("DEBUG").arg("HTSTATS").arg(0).query(&mut c)?;
        if !stats.contains("rehashing target") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("still rehashing after 15 minutes");
        }
        let mut pipe = redis::pipe();
        for _ in 0..100_000 {
            let (who, policy) = scale_recipient(r % n.max(1), policies[r % policies.len()]);
            pipe.cmd("EXISTS")
                .arg(keys.recipient(&who, &policy, None))
                .ignore();
            r += 1;
        }
        pipe.query::<()>(&mut c)?;
    }
}

/// The scale step: for each recipient count, keys already in Redis; then rounds of
/// (ceiling, then every configuration of recipients and policies, in an order that
/// alternates round by round), each a drain of `n` jobs spread over the recipients.
#[allow(clippy::too_many_arguments)]
async fn scale(
    args: &Args,
    teardown: &Teardown,
    run_id: &str,
    worker_bin: &Path,
    recipients: &[usize],
    n: usize,
    rounds: usize,
    report: &mut Report,
) -> Result<()> {
    let prefix = |r: usize| format!("{run_id}k{r}");
    let configs: Vec<(usize, usize)> = recipients
        .iter()
        .flat_map(|&r| args.scale_policies.iter().map(move |&p| (r, p)))
        .collect();
    let mut files = HashMap::new();
    for &p in &args.scale_policies {
        let path = std::fs::canonicalize(&args.out)?.join(format!("scale-policies-{p}.toml"));
        std::fs::write(&path, scale_config(p))?;
        files.insert(p, path);
    }
    // a Redis server for each recipient count, where redis-server can be started;
    // else the shared one (and the keys deleted by prefix at the end)
    let mut own: HashMap<usize, OwnRedis> = HashMap::new();
    for &r in recipients {
        match OwnRedis::start() {
            Ok(o) => {
                own.insert(r, o);
            }
            Err(e) => {
                eprintln!("[scale] {e:#}: the keys go to {}", args.redis);
                own.clear();
                break;
            }
        }
    }
    let redis_of = |r: usize| own.get(&r).map_or(args.redis.clone(), |o| o.url.clone());
    let pid_of = |r: usize| own.get(&r).map_or(0, |o| o.child.id());
    let result = async {
        for &r in recipients {
            let mut s = base_settings(args, &prefix(r))?;
            s.redis.key_prefix = prefix(r);
            s.redis.url = redis_of(r);
            eprintln!("[scale] writing {r} recipients' keys");
            let started = Instant::now();
            let written =
                tokio::task::block_in_place(|| preload_recipients(&s, r, &args.scale_policies))?;
            let secs = started.elapsed().as_secs_f64();
            eprintln!("      {written} keys in {secs:.1} s");
            report.scale_preload.push((r, written, secs));
            // a keyspace that has just grown is rehashed into a table twice the size,
            // a little at a time, and every lookup until then looks in both tables
            // and moves a bucket: finish it first, so the runs measure the keyspace
            // and not its growth
            let waited = Instant::now();
            match tokio::task::block_in_place(|| {
                wait_rehashed(&s, r, &args.scale_policies)
            }) {
                Ok(()) => eprintln!(
                    "      rehashed {:.1} s after the last key",
                    waited.elapsed().as_secs_f64()
                ),
                Err(e) => eprintln!("      not waiting for the rehash: {e:#}"),
            }
        }
        let mut runs: HashMap<(usize, usize), Vec<ScaleRound>> = HashMap::new();
        for round in 0..rounds {
            let c = base_settings(args, &format!("{run_id}sc{round}"))?;
            let (last_r, last_p) = *configs.last().context("no scale configuration")?;
            let (ceiling, ceiling_cpu) =
                ceiling(&c, &format!("scale:{last_r}:{last_p}:{round}"), n).await?;
            teardown.ceiling(&c).await;
            let mut order = configs.clone();
            if round % 2 == 1 {
                order.reverse();
            }
            for (r, p) in order {
                // few recipients: their keys written again each round, so no round
                // starts with more sends per key than the first
                if r <= 1_000_000 && round > 0 {
                    let mut s = base_settings(args, &prefix(r))?;
                    s.redis.key_prefix = prefix(r);
                    s.redis.url = redis_of(r);
                    tokio::task::block_in_place(|| {
                        preload_recipients(&s, r, &args.scale_policies)
                    })?;
                }
                let s = base_settings(args, &format!("{run_id}s{r}p{p}r{round}"))?;
                let mut w = s.clone();
                w.redis.key_prefix = prefix(r);
                w.redis.url = redis_of(r);
                REDIS_PID.store(pid_of(r), Ordering::Relaxed);
                let conn = connect(&args.amqp).await?;
                let env = [("QUOTA_WORKER_CONFIG".to_string(), files[&p].display().to_string())];
                let m = run_mix_with(&conn, &w, worker_bin, &format!("scale:{r}:{p}:{round}"), n, &env).await;
                let _ = closed(conn.close(200, "bye".into())).await;
                // its keys are the recipients' (deleted at the end of the step): a
                // delete by prefix now would scan the whole keyspace between runs
                teardown.topology(&s).await;
                let m = m?;
                eprintln!(
                    "      scale round {}: {r} recipients, {p} policies: {:.0} jobs/s ({:.2} of {ceiling:.0}), CPU/job {:.0} / {:.0} / {:.0} us",
                    round + 1,
                    m.jobs_per_sec,
                    m.jobs_per_sec / ceiling,
                    m.cpu_us_per_job[0],
                    m.cpu_us_per_job[1],
                    m.cpu_us_per_job[2]
                );
                runs.entry((r, p)).or_default().push(ScaleRound {
                    jobs_per_sec: m.jobs_per_sec,
                    ceiling_msgs_per_sec: ceiling,
                    ratio: m.jobs_per_sec / ceiling,
                    cpu_us_per_job: m.cpu_us_per_job,
                    ceiling_cpu_us_per_msg: ceiling_cpu,
                    admission_p99_ms: m.admission_p99_ms,
                    redis_calls_per_job: m.redis_calls_per_job,
                    outcomes: m.outcomes,
                });
            }
        }
        for (r, p) in &configs {
            let rs = runs.remove(&(*r, *p)).unwrap_or_default();
            let part = |i: usize| median(rs.iter().map(|x| x.cpu_us_per_job[i]).collect());
            report.scale.push(ScaleResult {
                recipients: *r,
                policies: *p,
                jobs: n,
                jobs_per_sec: median(rs.iter().map(|x| x.jobs_per_sec).collect()),
                ratio_to_ceiling: median(rs.iter().map(|x| x.ratio).collect()),
                cpu_us_per_job: median(rs.iter().map(|x| x.cpu_us_per_job.iter().sum()).collect()),
                cpu_us_per_job_parts: [part(0), part(1), part(2)],
                redis_us_per_job: part(1),
                rounds: rs,
            });
        }
        Ok::<_, anyhow::Error>(())
    }
    .await;
    REDIS_PID.store(0, Ordering::Relaxed);
    // the most first: then the scans for the fewer keys have little left to go over
    let mut by_size = recipients.to_vec();
    by_size.sort_unstable_by(|a, b| b.cmp(a));
    for &r in by_size.iter().filter(|r| !own.contains_key(r)) {
        eprintln!("[scale] deleting the keys of {r} recipients");
        let _ = tokio::task::block_in_place(|| delete_keys(&redis_of(r), &prefix(r)));
    }
    // its own servers go with their keys
    drop(own);
    result
}

async fn run_mix(
    conn: &Connection,
    s: &Settings,
    bin: &Path,
    mix: &str,
    n: usize,
) -> Result<MixResult> {
    run_mix_with(conn, s, bin, mix, n, &[]).await
}

/// [`run_mix`] with more environment for the worker.
async fn run_mix_with(
    conn: &Connection,
    s: &Settings,
    bin: &Path,
    mix: &str,
    n: usize,
    env: &[(String, String)],
) -> Result<MixResult> {
    let topology = Topology::from_settings(s);
    topology.declare(conn).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    preload(&ch, &s.amqp.jobs_exchange, "", job_bodies(mix, n)).await?;

    let cpu_before = cpu_snapshot();
    let (mut child, port) = spawn_worker_with(bin, s, env)?;
    // the clock starts when the worker consumes (its start-up is not throughput)
    wait_ready(port, &mut child).await?;
    let started = Instant::now();
    let mut rss_curve = Vec::new();
    let mut outcomes = HashMap::new();
    // RSS every 20 ms; /metrics (which the worker renders, on its own CPU) only
    // once the jobs queue has nothing ready (the broker says so, at no cost to the
    // worker: what is left is at most its prefetch), and then only as often as the
    // end could be near: half the time the rate so far needs for what is left,
    // between 10 and 250 ms. (Scraping every few milliseconds through the run cost
    // the worker up to 5 % of its instructions, more the more series it serves.)
    let mut next_scrape = Instant::now();
    let watch = conn.create_channel().await?;
    let mut backlog_left = true;
    let result = async {
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
                backlog_left = ready_in(&watch, &s.amqp.jobs_queue).await? > 0;
                if backlog_left {
                    continue;
                }
            }
            match scrape(port) {
                Ok(metrics) if metrics.contains("quota_worker_jobs_total") => {
                    outcomes = outcome_counts(&metrics);
                    let settled = outcomes.values().sum::<u64>();
                    if settled >= n as u64 {
                        return Ok(metrics);
                    }
                    let left = if settled == 0 {
                        f64::INFINITY
                    } else {
                        started.elapsed().as_secs_f64() * (n as u64 - settled) as f64
                            / settled as f64
                    };
                    next_scrape =
                        Instant::now() + Duration::from_secs_f64((left / 2.0).clamp(0.01, 0.25));
                }
                _ => {
                    // no metrics endpoint: count where the jobs went
                    next_scrape = Instant::now() + Duration::from_millis(20);
                    let settled = settled_by_queues(conn, &topology).await?;
                    if settled >= n as u64 {
                        outcomes =
                            HashMap::from([("settled (by queue depth)".to_string(), settled)]);
                        return Ok(String::new());
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
    .await;
    let secs = started.elapsed().as_secs_f64();
    let peak = rss_mib(child.id(), "VmHWM").unwrap_or(0.0);
    let cpu_after = cpu_snapshot();
    let worker_cpu = cpu_secs(child.id()).unwrap_or(0.0);
    let per_job = |i: usize| (cpu_after[i] - cpu_before[i]) * 1e6 / n as f64;
    let cpu_us_per_job = [per_job(0), per_job(1), worker_cpu * 1e6 / n as f64];
    stop(&mut child);
    // bounded: a close the broker never confirms must not hold the run
    let _ = closed(watch.close(200, "".into())).await;
    let metrics = result?;
    let q = quantiles(&metrics, "quota_worker_admission_seconds");
    let calls = metric_sum(&metrics, "quota_worker_redis_calls_total");
    Ok(MixResult {
        name: mix.into(),
        jobs: n,
        seconds: secs,
        jobs_per_sec: n as f64 / secs,
        ceiling_jobs_per_sec: 0.0,
        ratio_to_ceiling: 0.0,
        outcomes,
        admission_p50_ms: q.get("0.5").map(|v| v * 1e3),
        admission_p99_ms: q.get("0.99").map(|v| v * 1e3),
        admission_p999_ms: q.get("0.999").map(|v| v * 1e3),
        redis_calls_per_job: calls.map(|c| c / n as f64),
        peak_rss_mib: peak,
        rss_curve_mib: rss_curve,
        cpu_us_per_job,
        ceiling_cpu_us_per_msg: [0.0; 3],
        round_ratios: Vec::new(),
        rounds: Vec::new(),
    })
}

/// A connection's or channel's close, bounded: a close the broker never confirms
/// (seen now and then after a run) must not hold the benchmark.
async fn closed<T>(close: impl std::future::Future<Output = T>) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), close)
        .await
        .ok()
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

/// Admission latency with jobs arriving at `rate` per second (no backlog).
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
    let (mut child, port) = spawn_worker(bin, s)?;
    // with `realtime_redis`, the worker and Redis run ahead of the broker and the load
    // generator whenever they are ready to (restored when the guards drop)
    let _realtime = match realtime_redis {
        Some(redis) => match Realtime::set(child.id()).and_then(|w| Ok((w, Realtime::set(redis)?)))
        {
            Ok(guards) => Some(guards),
            Err(e) => {
                stop(&mut child);
                return Err(e);
            }
        },
        None => None,
    };
    wait_ready(port, &mut child).await?;
    let dispatch = topology.dispatch_queue("sms");
    let arrivals = match Arrivals::start(conn, &dispatch).await {
        Ok(a) => a,
        Err(e) => {
            stop(&mut child);
            return Err(e);
        }
    };
    let sent = offer(conn, &s.amqp.jobs_exchange, "", rate, secs, |i| {
        format!(
            r#"{{"id":"l{i}","recipient":"lat{i}@example.com","channel":"sms","timezone":"Europe/Paris"}}"#
        )
    })
    .await;
    let sent = match sent {
        Ok(n) => n,
        Err(e) => {
            stop(&mut child);
            return Err(e);
        }
    };
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
    stop(&mut child);
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

/// The header the load generator stamps on each job it offers: when it published
/// it, in microseconds since the Unix epoch. The worker keeps a job's own headers on
/// its dispatch (and the pass-through copies them), so the consumer on the output
/// queue reads it back; the job's body is not touched.
const SENT_HEADER: &str = "x-bench-sent-us";

fn unix_micros() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Publishes jobs at `rate` per second for `secs` seconds (each millisecond's jobs
/// handed to the client together, so they cost the load generator one hand-over to
/// lapin's I/O thread instead of one each), each stamped with [`SENT_HEADER`];
/// returns how many it published, every one confirmed.
async fn offer(
    conn: &Connection,
    exchange: &str,
    routing_key: &str,
    rate: f64,
    secs: u64,
    body: impl Fn(u64) -> String,
) -> Result<u64> {
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    let mut sent = 0u64;
    let started = Instant::now();
    let mut pending = FuturesUnordered::new();
    while started.elapsed() < Duration::from_secs(secs) {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as u64;
        let tick_jobs: Vec<_> = (sent..due)
            .map(|i| {
                let body = body(i);
                let mut h = FieldTable::default();
                h.insert(SENT_HEADER.into(), AMQPValue::LongLongInt(unix_micros()));
                let props = BasicProperties::default()
                    .with_delivery_mode(2)
                    .with_content_type("application/json".into())
                    .with_headers(h);
                let ch = &ch;
                async move {
                    ch.basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        BasicPublishOptions::default(),
                        body.as_bytes(),
                        props,
                    )
                    .await
                }
            })
            .collect();
        for confirm in futures_util::future::join_all(tick_jobs).await {
            pending.push(confirm?);
        }
        sent = sent.max(due);
        while let Some(Some(r)) = futures_util::FutureExt::now_or_never(pending.next()) {
            r?;
        }
    }
    while pending.next().await.transpose()?.is_some() {}
    let _ = ch.close(200, "".into()).await;
    Ok(sent)
}

/// A consumer on an output queue (no acks, so it asks the broker for nothing per
/// message) that records arrival minus [`SENT_HEADER`] for every message.
struct Arrivals {
    count: Arc<AtomicU64>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<Vec<u64>>>,
}

impl Arrivals {
    async fn start(conn: &Connection, queue: &str) -> Result<Arrivals> {
        let ch = conn.create_channel().await?;
        let opts = BasicConsumeOptions {
            no_ack: true,
            ..Default::default()
        };
        let mut consumer = ch
            .basic_consume(queue.into(), "e2e".into(), opts, FieldTable::default())
            .await?;
        let count = Arc::new(AtomicU64::new(0));
        let stop = tokio_util::sync::CancellationToken::new();
        let (n, halt) = (count.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut micros = Vec::new();
            loop {
                let d = tokio::select! {
                    _ = halt.cancelled() => break,
                    d = consumer.next() => d,
                };
                let Some(d) = d else { break };
                let d = d?;
                let now = unix_micros();
                let sent = d
                    .properties
                    .headers()
                    .as_ref()
                    .and_then(|h| h.inner().get(SENT_HEADER))
                    .and_then(|v| match v {
                        AMQPValue::LongLongInt(v) => Some(*v),
                        _ => None,
                    });
                if let Some(sent) = sent {
                    micros.push((now - sent).max(0) as u64);
                }
                n.fetch_add(1, Ordering::Relaxed);
            }
            let _ = ch.close(200, "".into()).await;
            Ok(micros)
        });
        Ok(Arrivals { count, stop, task })
    }

    /// Waits (at most 60 s) until `sent` messages have arrived, then stops.
    async fn finish(self, sent: u64) -> Result<EndToEnd> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.count.load(Ordering::Relaxed) < sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.stop.cancel();
        let mut micros = self.task.await??;
        micros.sort_unstable();
        Ok(EndToEnd::of(sent, &micros))
    }
}

impl EndToEnd {
    /// Quantiles of sorted microseconds.
    fn of(sent: u64, sorted: &[u64]) -> EndToEnd {
        let at = |q: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[i] as f64 / 1e3
        };
        // quantiles 1 - 10^-x for x = 0, 0.05, ... as far as the data reach
        let mut curve = Vec::new();
        let mut x = 0.0f64;
        while sorted.len() as f64 >= 10f64.powf(x) {
            let q = 1.0 - 10f64.powf(-x);
            curve.push((q, at(q)));
            x += 0.05;
        }
        EndToEnd {
            sent,
            arrived: sorted.len() as u64,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            p999_ms: at(0.999),
            max_ms: at(1.0),
            curve,
        }
    }
}

fn fmt_e2e(e: Option<&EndToEnd>) -> String {
    e.map_or_else(
        || "n/a".into(),
        |e| format!("{:.2} / {:.2} / {:.2}", e.p50_ms, e.p99_ms, e.p999_ms),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
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

/// The pass-through, live: its relay forwards from its source queue to its output
/// queue (as in the ceiling, on a thread and runtime of its own) while the load
/// generator offers jobs at `rate` to the source and a consumer times their arrival
/// in the output.
async fn live_pass_through(
    conn: &Connection,
    s: &Settings,
    rate: f64,
    secs: u64,
) -> Result<EndToEnd> {
    let [src, dst] = ceiling_queues(s);
    {
        let ch = conn.create_channel().await?;
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        for q in [&src, &dst] {
            ch.queue_declare(q.as_str().into(), durable, quorum())
                .await?;
        }
        let _ = ch.close(200, "".into()).await;
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let relay_stop = stop.clone();
    let (url, prefetch, (from, to)) = (
        s.amqp.url.clone(),
        s.amqp.prefetch,
        (src.clone(), dst.clone()),
    );
    let relay = tokio::task::spawn_blocking(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(async {
                let conn = connect(&url).await?;
                let result =
                    relay(&conn, prefetch, &from, &to, usize::MAX, Some(&relay_stop)).await;
                let _ = closed(conn.close(200, "bye".into())).await;
                result
            })
    });
    let result = async {
        let arrivals = Arrivals::start(conn, &dst).await?;
        let sent = offer(conn, "", &src, rate, secs, |i| {
            format!(
                r#"{{"id":"l{i}","recipient":"lat{i}@example.com","channel":"sms","timezone":"Europe/Paris"}}"#
            )
        })
        .await?;
        arrivals.finish(sent).await
    }
    .await;
    stop.cancel();
    relay.await??;
    result
}

/// A process (every thread of it) under SCHED_FIFO priority 10 until dropped, then
/// back to SCHED_OTHER. Needs `chrt` (util-linux) and the right to raise priority
/// (root, or CAP_SYS_NICE).
struct Realtime(u32);

impl Realtime {
    fn set(pid: u32) -> Result<Realtime> {
        let out = Command::new("chrt")
            .args(["-a", "-f", "-p", "10", &pid.to_string()])
            .output()
            .context("running chrt")?;
        if !out.status.success() {
            bail!(
                "chrt -a -f -p 10 {pid}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Realtime(pid))
    }
}

impl Drop for Realtime {
    fn drop(&mut self) {
        let _ = Command::new("chrt")
            .args(["-a", "-o", "-p", "0", &self.0.to_string()])
            .output();
    }
}

/// The pid of the Redis server, when it runs on this machine.
fn redis_pid(s: &Settings) -> Result<u32> {
    let (host, _) = url_host_port(&s.redis.url);
    if !["127.0.0.1", "localhost", "::1", "[::1]"].contains(&host.as_str()) {
        bail!("Redis at {host} is not on this machine");
    }
    let mut conn = redis::Client::open(s.redis.url.as_str())?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .context("no process_id in INFO server")
}

fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    for _ in 0..100 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// CPU seconds (user + system) a process has used so far.
fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// The Redis server whose CPU [`cpu_snapshot`] counts, when not the machine's
/// oldest `redis-server` (the scale step's own servers).
static REDIS_PID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A Redis server of the benchmark's own (no persistence, loopback, a free port),
/// shut down when dropped: the scale step gives each recipient count one, so that
/// the keyspace of one is not the other's.
struct OwnRedis {
    child: Child,
    url: String,
}

impl OwnRedis {
    fn start() -> Result<OwnRedis> {
        let port = free_port()?;
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            // DEBUG HTSTATS, to see when the keyspace's tables stop rehashing
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        let url = format!("redis://127.0.0.1:{port}");
        let mut own = OwnRedis { child, url };
        for _ in 0..100 {
            let up = redis::Client::open(own.url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if up.is_ok() {
                return Ok(own);
            }
            if let Some(status) = own.child.try_wait()? {
                bail!("redis-server exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("redis-server on port {port} did not answer")
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// CPU seconds used so far by the broker, Redis and this process.
fn cpu_snapshot() -> [f64; 3] {
    let pid_of = |name: &str| -> Option<u32> {
        let out = Command::new("pgrep").arg("-o").arg(name).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    let redis = match cluster_urls() {
        [] => match REDIS_PID.load(Ordering::Relaxed) {
            0 => pid_of("redis-server"),
            pid => Some(pid),
        }
        .and_then(cpu_secs)
        .unwrap_or(0.0),
        nodes => nodes
            .iter()
            .filter_map(|url| server_pid(url).ok())
            .filter_map(cpu_secs)
            .sum(),
    };
    [
        pid_of("beam.smp").and_then(cpu_secs).unwrap_or(0.0),
        redis,
        cpu_secs(std::process::id()).unwrap_or(0.0),
    ]
}

/// The pid `INFO server` of the Redis at `url` gives.
fn server_pid(url: &str) -> Result<u32> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .context("no process_id in INFO server")
}

/// `quota-worker run` for `s`, quiet, its HTTP endpoint on a free port.
fn spawn_worker(bin: &Path, s: &Settings) -> Result<(Child, u16)> {
    spawn_worker_with(bin, s, &[])
}

/// [`spawn_worker`] with more environment.
fn spawn_worker_with(bin: &Path, s: &Settings, env: &[(String, String)]) -> Result<(Child, u16)> {
    let port = free_port()?;
    let child = Command::new(bin)
        .arg("run")
        .envs(worker_env(s, port))
        .envs(env.iter().cloned())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting the worker")?;
    Ok((child, port))
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

fn rss_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Wait until the worker's `/readyz` answers 200: it is connected and consuming.
async fn wait_ready(port: u16, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if get(port, "/readyz")
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
        {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the worker exited before it was ready: {status}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("the worker was not ready within 30 s")
}

fn scrape(port: u16) -> Result<String> {
    get(port, "/metrics")
}

fn get(port: u16, path: &str) -> Result<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(text)
}

fn outcome_counts(metrics: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("quota_worker_jobs_total{"))
    {
        let label = |name: &str| {
            line.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        let (outcome, reason) = (label("outcome"), label("reason"));
        let key = if reason.is_empty() {
            outcome
        } else {
            format!("{outcome}:{reason}")
        };
        let v: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        // the worker shows every outcome from the start, most at 0
        if v > 0.0 {
            *out.entry(key).or_insert(0) += v as u64;
        }
    }
    out
}

/// Quantiles of a histogram or summary in Prometheus text. For a histogram, the
/// quantile is interpolated linearly inside its bucket, as Prometheus's
/// `histogram_quantile` does.
fn quantiles(metrics: &str, name: &str) -> HashMap<String, f64> {
    let mut buckets: Vec<(f64, f64)> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket{{")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    if !buckets.is_empty() {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let total = buckets.last().map(|b| b.1).unwrap_or(0.0);
        let mut out = HashMap::new();
        for q in ["0.5", "0.99", "0.999"] {
            let target = q.parse::<f64>().unwrap() * total;
            let mut lower = (0.0, 0.0);
            for &(le, count) in &buckets {
                if count >= target && total > 0.0 {
                    let upper = if le.is_finite() { le } else { lower.0 };
                    let span = count - lower.1;
                    let frac = if span > 0.0 {
                        (target - lower.1) / span
                    } else {
                        1.0
                    };
                    out.insert(q.to_string(), lower.0 + (upper - lower.0) * frac);
                    break;
                }
                lower = (le, count);
            }
        }
        return out;
    }
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{quantile=\"")))
        .filter_map(|l| {
            let q = l
                .split("quantile=\"")
                .nth(1)?
                .split('"')
                .next()?
                .to_string();
            let v = l.rsplit(' ').next()?.parse().ok()?;
            Some((q, v))
        })
        .collect()
}

fn metric_sum(metrics: &str, name: &str) -> Option<f64> {
    let values: Vec<f64> = metrics
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// Redis memory per recipient holding three sends, at scale.
async fn memory(s: &Settings, n: usize) -> Result<(f64, i64)> {
    let s = with_default_rule(s, 3, "7d");
    let engine = Arc::new(Engine::connect(&s).await?);
    let client = redis::Client::open(s.redis.url.as_str())?;
    let mut c = client.get_connection()?;
    let used = |c: &mut redis::Connection| -> Result<i64> {
        let info: String = redis::cmd("INFO").arg("memory").query(c)?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .context("used_memory")
    };
    // keys deleted by earlier steps are freed in the background: wait for that, or
    // their memory would be counted against this step
    for _ in 0..300 {
        let info: String = redis::cmd("INFO").arg("memory").query(&mut c)?;
        if info
            .lines()
            .any(|l| l.trim() == "lazyfree_pending_objects:0")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // and for the keyspace's tables to shrink after those deletes (Redis resizes them
    // in its cron): until used_memory holds still for half a second
    let mut before = used(&mut c)?;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        let now = used(&mut c)?;
        let settled = (now - before).abs() < 64 * 1024;
        before = now;
        if settled {
            break;
        }
    }
    let shared = engine.clone();
    on_many_tasks(n * 3, move |i| {
        let engine = shared.clone();
        async move {
            let (id, who) = (
                uuid::Uuid::now_v7().to_string(),
                format!("user{}@example.com", i % n),
            );
            let req = sms_request(&id, &who);
            if let quota_worker::engine::Admission::Admitted(t) =
                engine.admit(&req).await.expect("admit")
            {
                engine.commit(&t).await.expect("commit");
            }
        }
    })
    .await?;
    let after = used(&mut c)?;
    let key = engine
        .keys()
        .recipient("user0@example.com", "default", None);
    let one: i64 = redis::cmd("MEMORY").arg("USAGE").arg(&key).query(&mut c)?;
    Ok(((after - before) as f64 / n as f64, one))
}

fn delete_keys(url: &str, prefix: &str) -> Result<()> {
    if !cluster_urls().is_empty() {
        // each node its own keys, one key a command (a cluster node refuses a
        // command whose keys lie in different slots)
        for url in cluster_urls() {
            let mut c = redis::Client::open(url.as_str())?.get_connection()?;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}:*"))
                .query(&mut c)?;
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("UNLINK").arg(key).ignore();
            }
            let _: () = pipe.query(&mut c)?;
        }
        return Ok(());
    }
    let client = redis::Client::open(url)?;
    let mut c = client.get_connection()?;
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(10_000)
            .query(&mut c)?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK").arg(&keys).query(&mut c)?;
        }
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "n/a".into())
}

fn print_table(r: &Report) {
    println!("\nmachine: {}", r.machine);
    println!(
        "ceiling (pass-through, quorum, confirms), mean of the paired runs: {:.0} msgs/s",
        r.ceiling_jobs_per_sec
    );
    println!(
        "engine: {:.0} admissions/s ({:.2} Redis calls each); redis-benchmark EVALSHA admit.lua: {}; ratio {}",
        r.engine_admissions_per_sec,
        r.engine_redis_calls_per_admission,
        r.redis_benchmark_evalsha_per_sec.map(|v| format!("{v:.0}/s")).unwrap_or_else(|| "n/a".into()),
        r.engine_ratio.map(|v| format!("{v:.2}")).unwrap_or_else(|| "n/a".into()),
    );
    println!("\n| mix | jobs | jobs/s | ceiling msgs/s | x ceiling (rounds) | p50 ms | p99 ms | p99.9 ms | Redis calls/job | peak RSS MiB | outcomes |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for m in &r.mixes {
        let mut o: Vec<_> = m.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect();
        o.sort();
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} ({}) | {} | {} | {} | {} | {:.1} | {} |",
            m.name,
            m.jobs,
            m.jobs_per_sec,
            m.ceiling_jobs_per_sec,
            m.ratio_to_ceiling,
            m.round_ratios
                .iter()
                .map(|v| format!("{v:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            fmt_ms(m.admission_p50_ms),
            fmt_ms(m.admission_p99_ms),
            fmt_ms(m.admission_p999_ms),
            m.redis_calls_per_job
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            m.peak_rss_mib,
            o.join(", ")
        );
    }
    println!("\nCPU per job in microseconds (broker / Redis / worker), against the paired ceiling (broker / Redis / pass-through client):");
    for m in &r.mixes {
        let [b, rd, w] = m.cpu_us_per_job;
        let [cb, cr, cc] = m.ceiling_cpu_us_per_msg;
        println!(
            "  {}: {b:.0} / {rd:.0} / {w:.0} = {:.0}; ceiling {cb:.0} / {cr:.0} / {cc:.0} = {:.0}",
            m.name,
            b + rd + w,
            cb + cr + cc
        );
    }
    if !r.latency_summary.is_empty() {
        println!("\nend-to-end latency (publish to arrival in the output queue), medians over the rounds, default scheduling:");
        println!("| share of ceiling | rounds | worker p50 / p99 / p99.9 ms | pass-through p50 / p99 / p99.9 ms | p99 gap ms (rounds) | within +2 ms |");
        println!("|---|---|---|---|---|---|");
        for l in &r.latency_summary {
            println!(
                "| {} | {} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:+.2} ({}) | {} |",
                l.share_of_ceiling,
                l.rounds,
                l.worker_p50_ms,
                l.worker_p99_ms,
                l.worker_p999_ms,
                l.pass_through_p50_ms,
                l.pass_through_p99_ms,
                l.pass_through_p999_ms,
                l.p99_gap_median_ms,
                l.p99_gap_ms
                    .iter()
                    .map(|v| format!("{v:+.2}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                if l.within_2ms { "yes" } else { "no" }
            );
        }
    }
    if !r.scale.is_empty() {
        println!("\nscale: jobs/s and CPU per job with recipients already in Redis and policies in use (medians over the rounds):");
        println!("| recipients | policies | jobs/s | x ceiling (rounds) | CPU us/job broker / Redis / worker = total (rounds' totals) | outcomes (last round) |");
        println!("|---|---|---|---|---|---|");
        for x in &r.scale {
            let [b, rd, w] = x.cpu_us_per_job_parts;
            let mut o: Vec<_> = x
                .rounds
                .last()
                .map(|l| l.outcomes.iter().map(|(k, v)| format!("{k} {v}")).collect())
                .unwrap_or_default();
            o.sort();
            println!(
                "| {} | {} | {:.0} | {:.2} ({}) | {b:.0} / {rd:.1} / {w:.0} = {:.0} ({}) | {} |",
                x.recipients,
                x.policies,
                x.jobs_per_sec,
                x.ratio_to_ceiling,
                x.rounds
                    .iter()
                    .map(|v| format!("{:.2}", v.ratio))
                    .collect::<Vec<_>>()
                    .join(", "),
                x.cpu_us_per_job,
                x.rounds
                    .iter()
                    .map(|v| format!("{:.0}", v.cpu_us_per_job.iter().sum::<f64>()))
                    .collect::<Vec<_>>()
                    .join(", "),
                o.join(", ")
            );
        }
    }
    for l in &r.latency {
        println!(
            "\nround {} at {:.0} jobs/s ({} of the ceiling), scheduling {}: end to end p50 / p99 / p99.9 ms: worker {}, pass-through {}",
            l.round + 1,
            l.offered_jobs_per_sec,
            l.share_of_ceiling,
            l.scheduling,
            fmt_e2e(l.end_to_end.as_ref()),
            fmt_e2e(l.pass_through.as_ref())
        );
        println!(
            "  admission latency, {} jobs over {} s: p50 {} ms, p99 {} ms, p99.9 {} ms",
            l.jobs,
            l.seconds,
            fmt_ms(l.admission_p50_ms),
            fmt_ms(l.admission_p99_ms),
            fmt_ms(l.admission_p999_ms)
        );
        println!(
            "  of which one Redis script call: p50 {} ms, p99 {} ms, p99.9 {} ms ({:.1} jobs per call)",
            fmt_ms(l.redis_call_p50_ms),
            fmt_ms(l.redis_call_p99_ms),
            fmt_ms(l.redis_call_p999_ms),
            l.jobs_per_redis_call.unwrap_or(0.0)
        );
    }
    println!(
        "\nRedis memory: {:.1} bytes per recipient with 3 sends ({} recipients); MEMORY USAGE of one: {} bytes",
        r.memory_bytes_per_recipient, r.memory_recipients, r.memory_usage_one_recipient
    );
}

fn plot(r: &Report, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1440, 840)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(420);
    let (e2e, scale_panel) = lower.split_horizontally(720);
    plot_end_to_end(r, &e2e)?;
    plot_scale(r, &scale_panel)?;
    let (left, rest) = upper.split_horizontally(480);
    let (right, memory) = rest.split_horizontally(480);
    let mut bars: Vec<(String, f64)> = vec![("ceiling".into(), r.ceiling_jobs_per_sec)];
    bars.extend(r.mixes.iter().map(|m| (m.name.clone(), m.jobs_per_sec)));
    let top = bars.iter().map(|b| b.1).fold(1.0, f64::max) * 1.15;
    let mut chart = ChartBuilder::on(&left)
        .caption("Throughput (jobs/s)", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..bars.len() as f64, 0f64..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).draw()?;
    for (i, (name, v)) in bars.iter().enumerate() {
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, *v)],
            BLUE.mix(0.6).filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{name}: {v:.0}"),
            (x + 0.1, v + top * 0.03),
            ("sans-serif", 12),
        )))?;
    }
    let lat: Vec<(String, [f64; 3])> = r
        .mixes
        .iter()
        .map(|m| {
            (
                m.name.clone(),
                [
                    m.admission_p50_ms.unwrap_or(0.0),
                    m.admission_p99_ms.unwrap_or(0.0),
                    m.admission_p999_ms.unwrap_or(0.0),
                ],
            )
        })
        .chain(r.latency.iter().filter(|l| l.round == 0).map(|l| {
            (
                format!("{}x, {}", l.share_of_ceiling, l.scheduling),
                [
                    l.admission_p50_ms.unwrap_or(0.0),
                    l.admission_p99_ms.unwrap_or(0.0),
                    l.admission_p999_ms.unwrap_or(0.0),
                ],
            )
        }))
        .collect();
    let top = lat.iter().flat_map(|l| l.1).fold(0.1, f64::max) * 1.2;
    let mut chart = ChartBuilder::on(&right)
        .caption(
            "Admission latency (ms): p50, p99, p99.9",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..lat.len().max(1) as f64, 0f64..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).draw()?;
    let colors = [GREEN, RED, BLACK];
    for (i, (name, qs)) in lat.iter().enumerate() {
        for (j, v) in qs.iter().enumerate() {
            let x = i as f64 + 0.1 + j as f64 * 0.27;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x, 0.0), (x + 0.25, *v)],
                colors[j].mix(0.6).filled(),
            )))?;
        }
        chart.draw_series(std::iter::once(Text::new(
            name.clone(),
            (i as f64 + 0.1, top * 0.95),
            ("sans-serif", 12),
        )))?;
    }
    let secs = r
        .mixes
        .iter()
        .flat_map(|m| m.rss_curve_mib.last().map(|p| p.0))
        .fold(1.0, f64::max);
    let mib = r
        .mixes
        .iter()
        .flat_map(|m| m.rss_curve_mib.iter().map(|p| p.1))
        .fold(8.0, f64::max)
        * 1.2;
    let mut chart = ChartBuilder::on(&memory)
        .caption("Worker RSS (MiB) while draining", ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..secs, 0f64..mib)?;
    chart.configure_mesh().x_desc("seconds").draw()?;
    let palette = [BLUE, RED, GREEN, BLACK];
    for (i, m) in r.mixes.iter().enumerate() {
        let color = palette[i % palette.len()];
        chart
            .draw_series(LineSeries::new(m.rss_curve_mib.iter().copied(), color))?
            .label(m.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// End-to-end latency by quantile, worker and pass-through on one panel: for each
/// offered share of the ceiling, the round whose worker p99 is the median one. The
/// x axis is in nines (1 = p90, 2 = p99, 3 = p99.9), the y axis logarithmic.
fn plot_end_to_end(
    r: &Report,
    area: &plotters::prelude::DrawingArea<
        plotters::prelude::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
) -> Result<()> {
    use plotters::prelude::*;
    /// A curve's legend, its points (nines, ms) and colour.
    type Curve = (String, Vec<(f64, f64)>, RGBColor);
    let mut lines: Vec<Curve> = Vec::new();
    let colors = [(RED, BLUE), (MAGENTA, CYAN)];
    for (k, share) in [0.5, 0.25].into_iter().enumerate() {
        let mut ls: Vec<&Latency> = r
            .latency
            .iter()
            .filter(|l| l.share_of_ceiling == share && l.pass_through.is_some())
            .collect();
        ls.sort_by(|a, b| {
            let p = |l: &Latency| l.end_to_end.as_ref().map_or(0.0, |e| e.p99_ms);
            p(a).total_cmp(&p(b))
        });
        let Some(l) = ls.get(ls.len() / 2) else {
            continue;
        };
        let nines = |e: &EndToEnd| -> Vec<(f64, f64)> {
            e.curve
                .iter()
                .map(|&(q, ms)| (-(1.0 - q).max(1e-9).log10(), ms.max(0.01)))
                .collect()
        };
        let (wc, pc) = colors[k];
        if let Some(e) = &l.end_to_end {
            lines.push((
                format!(
                    "worker, {share} x ceiling ({:.0}/s)",
                    l.offered_jobs_per_sec
                ),
                nines(e),
                wc,
            ));
        }
        if let Some(e) = &l.pass_through {
            lines.push((format!("pass-through, {share} x ceiling"), nines(e), pc));
        }
    }
    let x_max = lines
        .iter()
        .flat_map(|l| l.1.last().map(|p| p.0))
        .fold(1.0, f64::max)
        .ceil();
    let y_max = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(1.0, f64::max)
        * 1.5;
    let y_min = lines
        .iter()
        .flat_map(|l| l.1.iter().map(|p| p.1))
        .fold(y_max, f64::min)
        / 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "End-to-end latency (ms, publish to dispatch queue) by quantile",
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, (y_min..y_max).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("quantile (the last point of a curve is its maximum)")
        .x_labels(x_max as usize + 1)
        .x_label_formatter(&|x| {
            let q = 100.0 * (1.0 - 10f64.powf(-x));
            format!("p{}", (q * 1000.0).round() / 1000.0)
        })
        .draw()?;
    for (name, points, color) in lines {
        chart
            .draw_series(LineSeries::new(points, color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

/// The scale step: CPU per job (broker, Redis, worker stacked) for each
/// configuration, its ratio to the paired ceiling written above.
fn plot_scale(
    r: &Report,
    area: &plotters::prelude::DrawingArea<
        plotters::prelude::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
) -> Result<()> {
    use plotters::prelude::*;
    let top = r
        .scale
        .iter()
        .map(|x| x.cpu_us_per_job_parts.iter().sum::<f64>())
        .fold(10.0, f64::max)
        * 1.25;
    let mut chart = ChartBuilder::on(area)
        .caption(
            "CPU per job (us; blue broker, red Redis, green worker): recipients, policies",
            ("sans-serif", 16),
        )
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..r.scale.len().max(1) as f64, 0f64..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).draw()?;
    let colors = [BLUE, RED, GREEN];
    for (i, x) in r.scale.iter().enumerate() {
        let mut base = 0.0;
        for (j, v) in x.cpu_us_per_job_parts.iter().enumerate() {
            let x0 = i as f64 + 0.2;
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x0, base), (x0 + 0.6, base + v)],
                colors[j].mix(0.6).filled(),
            )))?;
            base += v;
        }
        chart.draw_series(std::iter::once(Text::new(
            format!(
                "{} rcpt, {} pol: {:.2}x",
                x.recipients, x.policies, x.ratio_to_ceiling
            ),
            (i as f64 + 0.05, base + top * 0.04),
            ("sans-serif", 11),
        )))?;
    }
    Ok(())
}
