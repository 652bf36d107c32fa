//! One run of the benchmark: the steps `--steps` names, in a fixed order, then the
//! table, `bench.json` and `bench.svg`. [`Bench`] is what every step is given: the
//! arguments, the run's id (every queue and key of the run starts with it), the
//! worker binary and what to delete.

use std::fmt::Display;
use std::path::PathBuf;

use anyhow::{bail, Result};
use quota_worker::config::Settings;

use crate::broker::{closed, connect};
use crate::cli::Args;
use crate::mixes::{step_name, MIXES};
use crate::report::Report;
use crate::teardown::Teardown;
use crate::{cluster, engine, latency, memory, mixes, plot, rate, report, sample, scale, table};

/// What every step is given.
pub struct Bench {
    pub args: Args,
    /// `bench<pid>`: every queue and key of the run starts with it.
    pub run_id: String,
    /// The worker binary.
    pub worker: PathBuf,
    /// Jobs per mix (and per latency ceiling and scale drain).
    pub jobs: usize,
    /// Paired rounds.
    pub rounds: usize,
    pub teardown: Teardown,
}

impl Bench {
    /// Settings of the run in the namespace `<run id><suffix>`.
    pub fn settings(&self, suffix: &str) -> Settings {
        self.settings_in(&format!("{}{suffix}", self.run_id))
    }

    /// Settings of the run in the namespace `ns`: the services of the arguments,
    /// their prefetch.
    pub fn settings_in(&self, ns: &str) -> Settings {
        let args = &self.args;
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
        s
    }
}

/// A step's progress line on stderr, headed by its name in `--steps`.
pub fn header(step: &str, what: impl Display) {
    eprintln!("[{step}] {what}");
}

/// Runs the steps `args` names, then writes the table, the JSON and the plot.
pub async fn run(args: Args) -> Result<()> {
    let b = prepare(args)?;
    let conn = connect(&b.args.amqp).await?;
    check_cluster(&b.args)?;
    let mut report = Report {
        machine: sample::machine(),
        quick: b.args.quick,
        jobs_per_mix: b.jobs,
        ..Default::default()
    };
    if b.args.runs("engine") {
        engine::step(&b, &mut report).await?;
    }
    if b.args.runs("rate") {
        rate::step(&b, &mut report).await?;
    }
    for (i, mix) in MIXES.into_iter().enumerate() {
        if b.args.runs(step_name(mix)) {
            mixes::step(&b, i, &mut report).await?;
        }
    }
    if b.args.runs("latency") {
        latency::step(&b, &mut report).await?;
    }
    if b.args.runs("scale") {
        scale::step(&b, &mut report).await?;
    }
    if b.args.runs("memory") {
        memory::step(&b, &mut report).await?;
    }
    write_results(&b, &mut report)?;
    let _ = closed(conn.close(200, "bye".into())).await;
    b.teardown.finish().await;
    Ok(())
}

/// The run's [`Bench`], once the worker binary is found and `--out` exists.
fn prepare(args: Args) -> Result<Bench> {
    let worker = match &args.worker {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("quota-worker"),
    };
    if !worker.exists() {
        bail!(
            "{} not found: build it first (cargo build --release --bins)",
            worker.display()
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let run_id = format!("bench{}", std::process::id());
    // every queue and key of the run starts with this
    eprintln!("run {run_id}");
    let (jobs, rounds) = (args.jobs(), args.rounds());
    let teardown = Teardown::new(&args.amqp, args.defer_deletes || jobs >= 500_000);
    Ok(Bench {
        args,
        run_id,
        worker,
        jobs,
        rounds,
        teardown,
    })
}

/// With `--redis-cluster`: its nodes set, and only the steps that run on one.
fn check_cluster(args: &Args) -> Result<()> {
    if args.redis_cluster.is_empty() {
        return Ok(());
    }
    cluster::set(args.redis_cluster.clone());
    if ["engine", "rate", "memory"].iter().any(|s| args.runs(s)) {
        bail!("--redis-cluster runs the mixes and the latency step only (--steps a,b,c,latency)");
    }
    Ok(())
}

/// The mean ceiling of the mixes, then the table, `bench.json` and `bench.svg`.
fn write_results(b: &Bench, report: &mut Report) -> Result<()> {
    if !report.mixes.is_empty() {
        report.ceiling_jobs_per_sec = report
            .mixes
            .iter()
            .map(|m| m.ceiling_jobs_per_sec)
            .sum::<f64>()
            / report.mixes.len() as f64;
    }
    table::print(report);
    report::write(report, &b.args.out)?;
    plot::plot(report, &b.args.out.join("bench.svg"))?;
    eprintln!(
        "wrote {0}/bench.json and {0}/bench.svg",
        b.args.out.display()
    );
    Ok(())
}
