//! The tenants step with `--tenants-count N`: N tenants active at once in the bulk
//! lane of one channel, and what that costs. `--tenants-jobs-each` bulk jobs of each
//! tenant (default 5), round-robin over the tenants, published into the jobs
//! exchange as fast as the benchmark can while the workers run (so they are parked
//! in the tenants' queues), the channel paced at `--tenants-rate`; a private
//! `redis-server` (so its memory is the pass's alone). `--tenants-workers` worker
//! processes (default one, then three).
//!
//! Read when the jobs queue is first empty (every tenant's jobs parked or held):
//! the tenant queues the broker has (`rabbitmqctl list_queues`), their memory and
//! jobs; the broker's whole memory (`rabbitmqctl status`, shared with whatever else
//! runs on it); Redis's `used_memory` and the entries of the channel's set of
//! tenant queues; each worker's RSS (`/proc/<pid>/status`). Then the drain (the
//! dispatch queue's depth every 200 ms): jobs a second over the middle 80 %. Then
//! the quiet (at most `--tenants-quiet-secs`, 0 to skip): how long after the last
//! dispatch the tenant queues and the set's entries are gone, and the fair shares'
//! keys left with their time to live (and how many other keys: the recipients').
//!
//! With `--tenants-count 1` and a rate above what the worker drains, this is the
//! one-tenant drain that an A/B of two worker binaries (`--worker`) compares.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lapin::options::{ConfirmSelectOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::lanes::Priority;

use crate::broker::{closed, connect, preload};
use crate::context::{header, Bench};
use crate::procs::{spawn_worker, stop, wait_ready, OwnRedis};
use crate::report::ManyTenantsRun;

/// The longest the parking, and then the drain, may take.
const LIMIT: Duration = Duration::from_secs(900);

/// Runs the many-tenants passes into `out`.
pub async fn step(b: &Bench, out: &mut Vec<ManyTenantsRun>) -> Result<()> {
    for &workers in &b.args.tenants_workers {
        let run = pass(b, workers).await?;
        out.push(run);
    }
    Ok(())
}

/// Tenant `t`'s name.
fn tenant(t: usize) -> String {
    format!("m{t}")
}

fn job(ns: &str, tenants: usize, i: usize) -> Vec<u8> {
    let t = tenant(i % tenants);
    format!(
        r#"{{"id":"{ns}-{i}","recipient":"r{i}","channel":"sms","category":"default","priority":"bulk","tenant":"{t}"}}"#
    )
    .into_bytes()
}

async fn pass(b: &Bench, workers: usize) -> Result<ManyTenantsRun> {
    let (tenants, each, rate) = (
        b.args.tenants_count,
        b.args.tenants_jobs_each.max(1),
        b.args.tenants_rate.max(1),
    );
    header(
        "tenants",
        format!("{tenants} tenants, {each} bulk jobs each, the channel at {rate}/s; {workers} worker(s); {}", b.worker.display()),
    );
    let redis = OwnRedis::start()?;
    let mut s = b.settings(&format!("tm{workers}"));
    s.redis.url = redis.url.clone();
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(rate);
    }
    let mut run = ManyTenantsRun {
        workers,
        tenants,
        jobs_each: each,
        rate,
        worker: b.worker.display().to_string(),
        ..Default::default()
    };
    let mut procs = Vec::new();
    let result = measure(b, &s, &mut run, &mut procs).await;
    for child in &mut procs {
        stop(child);
    }
    let names: Vec<String> = (0..tenants).map(tenant).collect();
    super::delete_tenant_queues_of(&s, &names, &[Priority::Bulk]).await;
    b.teardown.namespace(&s).await;
    drop(redis);
    result.map(|()| run)
}

async fn measure(
    b: &Bench,
    s: &Settings,
    run: &mut ManyTenantsRun,
    procs: &mut Vec<Child>,
) -> Result<()> {
    let conn = connect(&s.amqp.url).await?;
    let topology = Topology::from_settings(s);
    topology.declare(&conn).await?;
    let lane_prefix = tenant_queue_prefix(&topology);
    run.broker_rss_before = broker_rss()?;
    run.redis_used_before = used_memory(&s.redis.url)?;
    let env = vec![(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        run.rate.to_string(),
    )];
    let mut ports = Vec::new();
    for _ in 0..run.workers {
        let (child, port) = spawn_worker(&b.worker, s, &env)?;
        procs.push(child);
        ports.push(port);
    }
    for (child, port) in procs.iter_mut().zip(&ports) {
        wait_ready(*port, child).await?;
    }
    run.worker_rss_ready = procs.iter().map(|c| rss_of(c.id())).collect();
    let total = run.tenants * run.jobs_each;
    let dispatch = topology.dispatch_queue("sms");
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let (ns, tenants) = (s.redis.key_prefix.clone(), run.tenants);
    let started = Instant::now();
    let bodies = (0..total).map(|i| job(&ns, tenants, i));
    preload(&ch, &s.amqp.jobs_exchange, "", bodies).await?;
    run.publish_secs = started.elapsed().as_secs_f64();
    let mut drain = Vec::new();
    while depth(&conn, &s.amqp.jobs_queue).await? > 0 {
        drain.push((
            started.elapsed().as_secs_f64(),
            depth(&conn, &dispatch).await?,
        ));
        if started.elapsed() > LIMIT {
            bail!("not parked within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    run.parked_secs = started.elapsed().as_secs_f64();
    active(s, run, procs, &lane_prefix)?;
    drain_until(&conn, &dispatch, total as u64, started, &mut drain).await?;
    run.drained_secs = started.elapsed().as_secs_f64();
    run.drain_per_sec = middle_rate(&drain, total as u64).unwrap_or(f64::NAN);
    let _ = closed(ch.close(200, "".into())).await;
    let _ = closed(conn.close(200, "bye".into())).await;
    quiet(b, s, run, &lane_prefix).await
}

/// The figures of the moment every tenant is active.
fn active(s: &Settings, run: &mut ManyTenantsRun, procs: &[Child], prefix: &str) -> Result<()> {
    let queues = tenant_queues(prefix)?;
    run.tenant_queues = queues.len();
    run.tenant_queue_bytes = queues.iter().map(|q| q.1).sum();
    run.tenant_queue_jobs = queues.iter().map(|q| q.2).sum();
    run.broker_rss_active = broker_rss()?;
    run.redis_used_active = used_memory(&s.redis.url)?;
    run.registry_entries = registry(s)?;
    run.worker_rss_active = procs.iter().map(|c| rss_of(c.id())).collect();
    eprintln!(
        "      active: {} tenant queues ({} bytes, {} jobs ready), broker RSS {} MB, Redis {} kB, workers {:?} MB",
        run.tenant_queues,
        run.tenant_queue_bytes,
        run.tenant_queue_jobs,
        run.broker_rss_active >> 20,
        run.redis_used_active >> 10,
        run.worker_rss_active.iter().map(|r| r >> 20).collect::<Vec<_>>()
    );
    Ok(())
}

/// Reads the dispatch queue's depth every 200 ms into `samples` until it holds
/// `total`.
async fn drain_until(
    conn: &Connection,
    dispatch: &str,
    total: u64,
    started: Instant,
    samples: &mut Vec<(f64, u64)>,
) -> Result<()> {
    loop {
        let n = depth(conn, dispatch).await?;
        samples.push((started.elapsed().as_secs_f64(), n));
        if n >= total {
            return Ok(());
        }
        if started.elapsed() > LIMIT * 2 {
            bail!("{n} of {total} dispatched within {:?}", LIMIT * 2);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After the last dispatch: how long until the tenant queues and the set's entries
/// are gone (read every 2 s), and what is left at the end.
async fn quiet(b: &Bench, s: &Settings, run: &mut ManyTenantsRun, prefix: &str) -> Result<()> {
    let limit = Duration::from_secs(b.args.tenants_quiet_secs);
    let since = Instant::now();
    while since.elapsed() < limit {
        let queues = tenant_queues(prefix)?.len();
        let entries = registry(s)?;
        let at = since.elapsed().as_secs_f64();
        if queues == 0 && run.queues_gone_secs.is_none() {
            run.queues_gone_secs = Some(at);
        }
        if entries == 0 && run.registry_gone_secs.is_none() {
            run.registry_gone_secs = Some(at);
        }
        if queues == 0 && entries == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    run.queues_left = tenant_queues(prefix)?.len();
    run.keys_left = keys_left(&s.redis.url, &format!("{}:fair:", s.redis.key_prefix))?;
    let all: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}*", s.redis.key_prefix))
        .query(&mut redis_conn(&s.redis.url)?)?;
    run.other_keys_left = (all.len() - run.keys_left.len()) as u64;
    eprintln!(
        "      quiet: tenant queues gone after {:?} s, entries after {:?} s; left: {} queues, fair keys {:?}, {} other keys",
        run.queues_gone_secs, run.registry_gone_secs, run.queues_left, run.keys_left, run.other_keys_left
    );
    Ok(())
}

/// Jobs a second between the crossings of 10 % and 90 % of `total`.
fn middle_rate(samples: &[(f64, u64)], total: u64) -> Option<f64> {
    let at = |n: u64| samples.iter().find(|s| s.1 >= n).map(|s| s.0);
    let (lo, hi) = (total / 10, total * 9 / 10);
    let secs = at(hi)? - at(lo)?;
    (secs > 0.0).then(|| (hi - lo) as f64 / secs)
}

/// The name every tenant queue of `sms`'s bulk lane starts with.
fn tenant_queue_prefix(t: &Topology) -> String {
    let q = t.tenant_queue("sms", Priority::Bulk, "x");
    q.strip_suffix('x').unwrap_or(&q).to_string()
}

async fn depth(conn: &Connection, queue: &str) -> Result<u64> {
    let ch = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await?;
    let _ = ch.close(200, "".into()).await;
    Ok(q.message_count() as u64)
}

/// The broker's queues whose name starts with `prefix`: (name, memory, messages).
fn tenant_queues(prefix: &str) -> Result<Vec<(String, u64, u64)>> {
    let out = rabbitmqctl(&[
        "list_queues",
        "-q",
        "--no-table-headers",
        "name",
        "memory",
        "messages",
    ])?;
    Ok(out
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?;
            let memory = f.next()?.parse().ok()?;
            let messages = f.next()?.parse().ok()?;
            name.starts_with(prefix)
                .then(|| (name.to_string(), memory, messages))
        })
        .collect())
}

/// The broker node's RSS, bytes (`rabbitmqctl status`).
fn broker_rss() -> Result<u64> {
    let out = rabbitmqctl(&["status", "--formatter", "json"])?;
    let v: serde_json::Value = serde_json::from_str(&out).context("rabbitmqctl status")?;
    v["memory"]["total"]["rss"]
        .as_u64()
        .context("no memory.total.rss in rabbitmqctl status")
}

fn rabbitmqctl(args: &[&str]) -> Result<String> {
    let out = Command::new("rabbitmqctl").args(args).output()?;
    if !out.status.success() {
        bail!(
            "rabbitmqctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A process's resident set, bytes (0 when gone).
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("status"));
    status
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn redis_conn(url: &str) -> Result<redis::Connection> {
    Ok(redis::Client::open(url)?.get_connection()?)
}

fn used_memory(url: &str) -> Result<u64> {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(&mut redis_conn(url)?)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("used_memory")
}

/// The entries of `sms`'s set of tenant queues.
fn registry(s: &Settings) -> Result<u64> {
    let key = format!("{}:fair:{{sms}}:queues", s.redis.key_prefix);
    Ok(redis::cmd("ZCARD")
        .arg(key)
        .query(&mut redis_conn(&s.redis.url)?)?)
}

/// Every key under `prefix`: (name, type, entries of a set or sorted set, TTL).
fn keys_left(url: &str, prefix: &str) -> Result<Vec<(String, String, u64, i64)>> {
    let mut c = redis_conn(url)?;
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}*")).query(&mut c)?;
    let mut out = Vec::new();
    for k in keys {
        let kind: String = redis::cmd("TYPE").arg(&k).query(&mut c)?;
        let n: u64 = match kind.as_str() {
            "zset" => redis::cmd("ZCARD").arg(&k).query(&mut c)?,
            "set" => redis::cmd("SCARD").arg(&k).query(&mut c)?,
            "hash" => redis::cmd("HLEN").arg(&k).query(&mut c)?,
            _ => 1,
        };
        let ttl: i64 = redis::cmd("TTL").arg(&k).query(&mut c)?;
        out.push((k, kind, n, ttl));
    }
    out.sort();
    Ok(out)
}
