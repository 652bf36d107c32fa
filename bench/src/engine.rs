//! The engine step (`--steps engine`): `redis-benchmark` running `src/admission/lua/` by
//! EVALSHA, then the engine's own admissions with 256 in flight, on the same Redis.
//! Also the tools the rate and memory steps drive the engine with: a policy of one
//! rule, an `sms` request, and many admissions in flight.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use quota_worker::admission::Request;
use quota_worker::config::{RuleSettings, Settings};
use quota_worker::store::QuotaStore;

use crate::context::{header, Bench};
use crate::report::Report;
use crate::teardown::delete_keys;
use testkit::redis_host_port;

/// Runs the step into `report`; deletes its keys.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    header("engine", "admissions through Redis");
    let s = b.settings("e");
    let n = b.jobs.min(100_000);
    report.redis_benchmark_evalsha_per_sec = redis_benchmark(&s, n).ok();
    let (rate, calls) = engine_admissions(&s, n).await?;
    report.engine_admissions_per_sec = rate;
    report.engine_redis_calls_per_admission = calls;
    report.engine_ratio = report.redis_benchmark_evalsha_per_sec.map(|b| rate / b);
    eprintln!(
        "      engine {:.0}/s, redis-benchmark EVALSHA {:?}/s",
        rate, report.redis_benchmark_evalsha_per_sec
    );
    delete_keys(&s.redis.url, &s.redis.key_prefix)
}

/// `s` with the default policy's rules replaced by one: `limit` per `window`.
pub fn with_default_rule(s: &Settings, limit: u32, window: &str) -> Settings {
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

/// `redis-benchmark` running the admission script by EVALSHA (50 clients).
fn redis_benchmark(s: &Settings, n: usize) -> Result<f64> {
    let key = format!("{}:{{bench__rand_int__}}:default", s.redis.key_prefix);
    evalsha_per_sec(
        s,
        n,
        quota_worker::redis::scripts::ADMIT_LUA,
        &[
            &key,
            // lease, dedupe, no undeclared keys, one plan, no layers, suppression,
            // preferences or limits section (the header of src/admission/lua/protocol.lua);
            // the plan: valid from 0 to 2^53, no calendar expiry, not shadow, one
            // rule (3 per rolling day); then the job: member, plan 1
            "120000",
            "86400000",
            "0",
            "1",
            "0",
            "0",
            "0",
            "0",
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
pub fn evalsha_per_sec(s: &Settings, n: usize, script: &str, args: &[&str]) -> Result<f64> {
    let client = redis::Client::open(s.redis.url.as_str())?;
    let mut c = client.get_connection()?;
    let sha: String = redis::cmd("SCRIPT").arg("LOAD").arg(script).query(&mut c)?;
    let url = redis_host_port(&s.redis.url);
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

/// The engine's admissions per second with 256 in flight (distinct recipients, a
/// rolling rule so every admission runs the whole script).
async fn engine_admissions(s: &Settings, n: usize) -> Result<(f64, f64)> {
    let s = with_default_rule(s, 3, "24h");
    let engine = Arc::new(QuotaStore::connect(&s).await?);
    timed_on_many_tasks(&engine, n, |engine, i| async move {
        let (id, who) = (format!("e{i}"), format!("r{i}"));
        let req = sms_request(&id, &who);
        engine.admit(&req).await.expect("admit");
    })
    .await
}

/// Runs `job(engine, i)` for every `i` below `n` with [`on_many_tasks`]: jobs per
/// second, and the engine's Redis calls per job.
pub async fn timed_on_many_tasks<F, Fut>(
    engine: &Arc<QuotaStore>,
    n: usize,
    job: F,
) -> Result<(f64, f64)>
where
    F: Fn(Arc<QuotaStore>, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let started = Instant::now();
    let calls_before = engine.calls();
    let shared = engine.clone();
    on_many_tasks(n, move |i| job(shared.clone(), i)).await?;
    let secs = started.elapsed().as_secs_f64();
    Ok((
        n as f64 / secs,
        (engine.calls() - calls_before) as f64 / n as f64,
    ))
}

/// An admission of an `sms` job of the default policy, for a recipient in UTC.
pub fn sms_request<'a>(id: &'a str, recipient: &'a str) -> Request<'a> {
    Request {
        id,
        recipient,
        channel: "sms",
        category: "default",
        tz: chrono_tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    }
}

/// Runs `job(i)` for every `i` below `n` on 256 tasks (the default prefetch: as
/// many admissions in flight as one worker has).
pub async fn on_many_tasks<F, Fut>(n: usize, job: F) -> Result<()>
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
