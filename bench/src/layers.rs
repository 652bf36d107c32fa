//! Part of the engine step (run after [`crate::engine::step`]): what caps in layers
//! cost Redis. The same admissions (distinct recipients, every one admitted) run
//! twice on a private `redis-server` (nothing else runs on it, so its counters are
//! this run's alone): once under the
//! policy alone (one layer), once under the policy and two caps that match every job
//! (three layers). Redis's own accounting gives the time spent in `EVALSHA` per job
//! (`INFO commandstats`) and its whole CPU per job (`INFO cpu`).

use std::sync::Arc;

use anyhow::{Context, Result};
use quota_worker::config::{CapSettings, RuleSettings, Settings};
use quota_worker::store::QuotaStore;
use testkit::procs::RedisServer;

use crate::context::Bench;
use crate::engine::{on_many_tasks, sms_request, with_default_rule};
use crate::report::{LayersCost, Report};

/// Measures [`LayersCost`] into `report` (its engine step's part), with at most
/// 20,000 admissions per configuration.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let cost = measure(&b.settings("l"), b.jobs.min(20_000)).await?;
    eprintln!(
        "      Redis per job: EVALSHA {:.1} µs with one layer, {:.1} µs with three; CPU {:.1} µs, {:.1} µs",
        cost.evalsha_us_one_layer,
        cost.evalsha_us_three_layers,
        cost.cpu_us_one_layer,
        cost.cpu_us_three_layers
    );
    report.engine_layers = Some(cost);
    Ok(())
}

/// Measures [`LayersCost`] with `n` admissions per configuration.
async fn measure(s: &Settings, n: usize) -> Result<LayersCost> {
    let redis = RedisServer::new(false);
    let mut one = with_default_rule(s, 3, "24h");
    one.redis.url = redis.url();
    one.redis.cluster = false;
    let mut three = one.clone();
    for (name, window) in [("daily_total", "1d"), ("weekly_total", "7d")] {
        let cap = CapSettings {
            rules: vec![RuleSettings {
                limit: 5,
                window: window.parse().expect("a window"),
            }],
            ..CapSettings::default()
        };
        three.caps.insert(name.into(), cap);
    }
    let (evalsha_one, cpu_one) = run(&one, &redis, n, "one").await?;
    let (evalsha_three, cpu_three) = run(&three, &redis, n, "three").await?;
    Ok(LayersCost {
        evalsha_us_one_layer: evalsha_one,
        evalsha_us_three_layers: evalsha_three,
        cpu_us_one_layer: cpu_one,
        cpu_us_three_layers: cpu_three,
    })
}

/// `n` admissions under `s`: Redis's EVALSHA time and CPU per job (µs).
async fn run(s: &Settings, redis: &RedisServer, n: usize, tag: &'static str) -> Result<(f64, f64)> {
    let mut c = redis.connection();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c)?;
    let cpu_before = cpu_us(&mut c)?;
    let engine = Arc::new(QuotaStore::connect(s).await?);
    let shared = engine.clone();
    on_many_tasks(n, move |i| {
        let engine = shared.clone();
        async move {
            let (id, who) = (format!("{tag}{i}"), format!("{tag}-r{i}"));
            engine.admit(&sms_request(&id, &who)).await.expect("admit");
        }
    })
    .await?;
    let cpu = cpu_us(&mut c)? - cpu_before;
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut c)?;
    let usec = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .and_then(|l| l.split(',').find_map(|f| f.strip_prefix("usec=")))
        .and_then(|v| v.parse::<f64>().ok())
        .context("no cmdstat_evalsha in INFO commandstats")?;
    Ok((usec / n as f64, cpu / n as f64))
}

/// `used_cpu_user + used_cpu_sys` of `INFO cpu`, in µs.
pub fn cpu_us(c: &mut redis::Connection) -> Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query(c)?;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((field("used_cpu_user:") + field("used_cpu_sys:")) * 1e6)
}
