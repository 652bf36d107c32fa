//! The engine step's limit variant (`--steps engine-limits`): admissions per
//! second with three limits that match every job (one bucket for all, one per
//! tenant, one per sender over `--limits-senders` senders, 1,000 by default;
//! rates that never refuse), with the same three limits matching another channel
//! only, and with none. The policy of the engine step (3 per rolling day,
//! distinct recipients: every job runs the whole script), on a private
//! `redis-server` (its counters are this step's alone). The three configurations
//! alternate in each round (the first moving round by round), each run from an
//! empty keyspace, and every round is kept: admissions per second, Redis's
//! `EVALSHA` time and CPU per job, and this process's CPU per job (the engine's
//! own side of the admission).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use quota_worker::admission::Request;
use quota_worker::config::{Dur, LimitSettings, Settings};
use quota_worker::quota::limits::Per;
use quota_worker::store::QuotaStore;
use testkit::procs::RedisServer;

use crate::context::{header, Bench};
use crate::engine::{on_many_tasks, with_default_rule};
use crate::report::{LimitsCost, LimitsRound, Report};

/// The configurations, in the order of [`LimitsCost::medians`].
pub const CONFIGS: [&str; 3] = ["none", "three matching", "three matching nothing"];

/// Runs the step into `report`: `--rounds` rounds (default 8) of `--jobs`
/// admissions (default 20,000; 5,000 with `--quick`) per configuration.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let rounds = b.args.rounds.unwrap_or(8).max(1);
    let n = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 5_000 } else { 20_000 });
    header(
        "engine-limits",
        format!("admissions with three limits against none: {rounds} rounds of {n}"),
    );
    let redis = RedisServer::new(false);
    let mut none = with_default_rule(&b.settings("el"), 3, "24h");
    none.redis.url = redis.url();
    none.redis.cluster = false;
    let (three, nothing) = with_limits(&none);
    let mut stores = Vec::new();
    for s in [&none, &three, &nothing] {
        stores.push(Arc::new(QuotaStore::connect(s).await?));
    }
    let mut cost = LimitsCost {
        jobs_per_round: n,
        ..Default::default()
    };
    for round in 0..rounds {
        for k in (0..CONFIGS.len()).map(|i| (i + round) % CONFIGS.len()) {
            let tag = format!("{round}-{k}-");
            let r = measure(&stores[k], &redis, (n, b.args.limits_senders.max(1)), &tag).await?;
            let r = LimitsRound {
                round: round + 1,
                config: CONFIGS[k].to_string(),
                ..r
            };
            eprintln!(
                "      round {} {:>24}: {:>8.0} admissions/s, Redis EVALSHA {:.1} µs/job, Redis CPU {:.1} µs/job, engine CPU {:.1} µs/job, {:.1} jobs a call, {:.2} Redis commands a job",
                r.round, r.config, r.per_sec, r.evalsha_us, r.redis_cpu_us, r.engine_cpu_us, r.jobs_per_call, r.commands_per_job
            );
            cost.rounds.push(r);
        }
    }
    cost.medians = CONFIGS.iter().map(|c| cost.median(c)).collect();
    report.engine_limits = Some(cost);
    Ok(())
}

/// `none` with three limits that match every job, and with the same three
/// matching the `email` channel only.
fn with_limits(none: &Settings) -> (Settings, Settings) {
    let limit = |per| LimitSettings {
        rate: 1_000_000,
        period: Some(Dur(Duration::from_secs(1))),
        burst: Some(1_000_000),
        per,
        ..LimitSettings::default()
    };
    let mut three = none.clone();
    for (name, per) in [
        ("all", Per::All),
        ("tenant", Per::Tenant),
        ("sender", Per::Sender),
    ] {
        three.limits.insert(name.into(), limit(per));
    }
    let mut nothing = three.clone();
    for l in nothing.limits.values_mut() {
        l.matches.channels = Some(vec!["email".into()]);
    }
    (three, nothing)
}

/// `n` admissions on `engine` (256 in flight, distinct recipients, tenant `t`,
/// `senders` senders): one round's figures.
async fn measure(
    engine: &Arc<QuotaStore>,
    redis: &RedisServer,
    (n, senders): (usize, usize),
    tag: &str,
) -> Result<LimitsRound> {
    let mut c = redis.connection();
    // every run from an empty keyspace: one that grows from run to run rehashes its
    // table in whichever run crosses a power of two, and slows that run alone
    let _: () = redis::cmd("FLUSHALL").arg("SYNC").query(&mut c)?;
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query(&mut c)?;
    let redis_cpu = crate::layers::cpu_us(&mut c)?;
    let own_cpu = crate::sample::cpu_secs(std::process::id()).unwrap_or(0.0);
    let started = Instant::now();
    let (shared, tag) = (engine.clone(), Arc::<str>::from(tag));
    on_many_tasks(n, move |i| {
        let (engine, tag) = (shared.clone(), tag.clone());
        async move {
            let (id, who, sender) = (
                format!("{tag}{i}"),
                format!("{tag}r{i}"),
                format!("s{}", i % senders),
            );
            let req = Request {
                tenant: Some("t"),
                sender: Some(&sender),
                ..crate::engine::sms_request(&id, &who)
            };
            engine.admit(&req).await.expect("admit");
        }
    })
    .await?;
    let secs = started.elapsed().as_secs_f64();
    let own_cpu = crate::sample::cpu_secs(std::process::id()).unwrap_or(0.0) - own_cpu;
    let redis_cpu = crate::layers::cpu_us(&mut c)? - redis_cpu;
    let stats: String = redis::cmd("INFO").arg("commandstats").query(&mut c)?;
    let evalsha = stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:"))
        .context("no cmdstat_evalsha in INFO commandstats")?;
    let field = |name: &str| {
        evalsha
            .split(',')
            .find_map(|f| f.strip_prefix(name))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let (usec, calls) = (field("usec="), field("calls="));
    // every command but this step's own (INFO, CONFIG) and the scripts' loading
    let commands: f64 = stats
        .lines()
        .filter(|l| {
            !["cmdstat_info:", "cmdstat_config|", "cmdstat_script|"]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .filter_map(|l| {
            l.split(':')
                .nth(1)?
                .split(',')
                .next()?
                .strip_prefix("calls=")
        })
        .filter_map(|v| v.parse::<f64>().ok())
        .sum();
    // a moment between runs: the next one starts from an idle Redis
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(LimitsRound {
        round: 0,
        config: String::new(),
        per_sec: n as f64 / secs,
        evalsha_us: usec / n as f64,
        redis_cpu_us: redis_cpu / n as f64,
        engine_cpu_us: own_cpu * 1e6 / n as f64,
        jobs_per_call: n as f64 / calls.max(1.0),
        commands_per_job: commands / n as f64,
    })
}
