//! One run of the benchmark: the steps `--steps` names, in a fixed order, then the
//! table, `bench.json` and `bench.svg`. The steps sit below this module: each is
//! given a [`Bench`] (module `context`) and never calls back up here.

use anyhow::{bail, Result};

use crate::broker::{closed, connect};
use crate::cli::Args;
use crate::context::{prepare, Bench};
use crate::mixes::{step_name, MIXES};
use crate::report::Report;
use crate::{
    campaign, cluster, digest, engine, fallback, lanes, latency, layers, memory, mixes, plot, rate,
    recovery, report, sample, scale, table,
};

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
        layers::step(&b, &mut report).await?;
    }
    if b.args.runs("engine-limits") {
        crate::limits::step(&b, &mut report).await?;
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
    if b.args.runs("lanes") {
        lanes::step(&b, &mut report).await?;
    }
    if b.args.runs("recovery") {
        recovery::step(&b, &mut report).await?;
    }
    if b.args.runs("campaign") {
        campaign::step(&b, &mut report).await?;
    }
    if b.args.runs("tenants") {
        crate::tenants::step(&b, &mut report).await?;
    }
    if b.args.runs("digest") {
        digest::step(&b, &mut report).await?;
    }
    if b.args.runs("fallback") {
        fallback::step(&b, &mut report).await?;
    }
    if b.args.runs("memory") {
        memory::step(&b, &mut report).await?;
    }
    write_results(&b, &mut report)?;
    let _ = closed(conn.close(200, "bye".into())).await;
    b.teardown.finish().await;
    Ok(())
}

/// With `--redis-cluster`: its nodes set, and only the steps that run on one.
fn check_cluster(args: &Args) -> Result<()> {
    if args.redis_cluster.is_empty() {
        return Ok(());
    }
    cluster::set(args.redis_cluster.clone());
    if ["engine", "engine-limits", "rate", "memory"]
        .iter()
        .any(|s| args.runs(s))
    {
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
    if !report.recovery.is_empty() {
        plot::plot_recovery(report, &b.args.out.join("recovery.svg"))?;
    }
    eprintln!(
        "wrote {0}/bench.json and {0}/bench.svg",
        b.args.out.display()
    );
    Ok(())
}
