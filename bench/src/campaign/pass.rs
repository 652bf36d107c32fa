//! The campaign step's two passes, each on a fresh namespace with `workers` worker
//! processes: the campaign ([`campaign`]: published at a set rate while urgent jobs
//! follow it) and the backlog ([`backlog`]: published before the workers start).

use std::process::Child;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Result;
use lapin::options::ConfirmSelectOptions;
use quota_worker::amqp::Topology;
use quota_worker::config::{PolicySettings, Settings};
use quota_worker::lanes::Priority;
use tokio_util::sync::CancellationToken;

use super::watch::{crossing, rate_between, Dispatches, Parking, Sample};
use crate::broker::{closed, connect, every_until, paced, preload, unix_micros};
use crate::context::{header, Bench};
use crate::procs::{spawn_worker, stop, wait_ready};
use crate::report::CampaignRun;

/// How often an urgent job is published while the campaign is read.
const URGENT_EVERY: Duration = Duration::from_millis(300);
/// How long urgent jobs keep coming once every bulk job is parked: what they meet
/// behind the whole backlog parked (in the tenants' queues, with tenants).
const URGENT_BEHIND: Duration = Duration::from_secs(10);
/// The longest a pass may take to park its jobs.
const LIMIT: Duration = Duration::from_secs(600);

/// What a pass is given: its round (from 1), its workers, its jobs, the tenants
/// they belong to (0: none), the channel's rate and the round's ceiling.
#[derive(Debug, Clone, Copy)]
pub(super) struct Plan {
    pub round: usize,
    pub workers: usize,
    pub jobs: usize,
    pub tenants: usize,
    pub rate: u64,
    pub ceiling: f64,
}

/// The pass's settings: `sms` paced at the plan's rate, and the policy `campaign`,
/// no rules, whose jobs are in the `bulk` lane; and the workers' environment.
fn settings(b: &Bench, tag: &str, p: &Plan) -> (Settings, Vec<(String, String)>) {
    let mut s = b.settings(&format!("{tag}{}w{}", p.round, p.workers));
    // paced in the settings too, so that the topology the teardown deletes has
    // the channel's lane queues
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(p.rate);
    }
    let campaign = PolicySettings {
        priority: Priority::Bulk,
        ..PolicySettings::default()
    };
    s.policies.insert("campaign".into(), campaign);
    let env = vec![(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        p.rate.to_string(),
    )];
    (s, env)
}

/// The `tenant` field of job `i` when the jobs belong to `tenants` tenants
/// round-robin (none when 0).
fn tenant_field(i: u64, tenants: usize) -> String {
    match tenants {
        0 => String::new(),
        n => format!(r#","tenant":"{}""#, tenant_name(i % n as u64)),
    }
}

/// The name of the campaign's tenant `t`.
pub(super) fn tenant_name(t: u64) -> String {
    format!("t{t}")
}

/// Bulk job `i` as a plain producer publishes it: category `campaign`, no `priority`.
fn bulk(ns: &str, i: u64, tenants: usize) -> Vec<u8> {
    let tenant = tenant_field(i, tenants);
    format!(
        r#"{{"id":"{ns}-c{i}","recipient":"c{i}","channel":"sms","category":"campaign"{tenant}}}"#
    )
    .into_bytes()
}

/// Urgent job `i`: category `transactional` (the `urgent` lane by its policy), no
/// `priority`.
fn urgent(ns: &str, i: u64, tenants: usize) -> String {
    let tenant = tenant_field(i, tenants);
    format!(
        r#"{{"id":"{ns}-u{i}","recipient":"u{i}","channel":"sms","category":"transactional"{tenant}}}"#
    )
}

/// Ends a pass: stops its workers, deletes its tenants' queues (the teardown knows
/// only the topology's) and its namespace.
async fn end(b: &Bench, s: &Settings, p: &Plan, procs: &mut [Child]) {
    for child in procs {
        stop(child);
    }
    let tenants = (0..p.tenants as u64).map(tenant_name).collect::<Vec<_>>();
    crate::tenants::delete_tenant_queues(s, &tenants).await;
    b.teardown.namespace(s).await;
}

/// Starts the plan's worker processes at once (into `procs`, which the caller
/// stops): their HTTP ports.
fn spawn_all(
    b: &Bench,
    s: &Settings,
    env: &[(String, String)],
    p: &Plan,
    procs: &mut Vec<Child>,
) -> Result<Vec<u16>> {
    let mut ports = Vec::new();
    for _ in 0..p.workers {
        let (child, port) = spawn_worker(&b.worker, s, env)?;
        procs.push(child);
        ports.push(port);
    }
    Ok(ports)
}

/// Waits until each worker of `procs` (at `ports`) is consuming.
async fn all_ready(procs: &mut [Child], ports: &[u16]) -> Result<()> {
    for (child, port) in procs.iter_mut().zip(ports) {
        wait_ready(*port, child).await?;
    }
    Ok(())
}

/// The campaign: `jobs` bulk jobs published at `publish_rate` into the jobs
/// exchange while the workers run, an urgent job every [`URGENT_EVERY`] from the
/// first publish until every bulk job is parked.
pub(super) async fn campaign(b: &Bench, p: Plan, publish_rate: f64) -> Result<CampaignRun> {
    header(
        "campaign",
        format!(
            "round {}: {} bulk jobs{} at {publish_rate:.0}/s to the jobs exchange, the channel at {}/s, urgent jobs every 0.3 s, {} worker(s)",
            p.round, p.jobs, of_tenants(p.tenants), p.rate, p.workers
        ),
    );
    let (s, env) = settings(b, "cp", &p);
    let mut procs = Vec::new();
    let result = async {
        let ports = spawn_all(b, &s, &env, &p, &mut procs)?;
        all_ready(&mut procs, &ports).await?;
        publish_campaign(&s, &p, &ports, publish_rate).await
    }
    .await;
    end(b, &s, &p, &mut procs).await;
    result
}

/// ", of N tenants round-robin" (nothing without tenants).
fn of_tenants(tenants: usize) -> String {
    match tenants {
        0 => String::new(),
        n => format!(" of {n} tenants round-robin"),
    }
}

async fn publish_campaign(
    s: &Settings,
    p: &Plan,
    ports: &[u16],
    publish_rate: f64,
) -> Result<CampaignRun> {
    let conn = connect(&s.amqp.url).await?;
    let topology = Topology::from_settings(s);
    let dispatches = Dispatches::start(&conn, &topology.dispatch_queue("sms")).await?;
    let started = Instant::now();
    let parking = Parking::start(ports.to_vec(), dispatches.unparked(), started);
    let (ns, exchange, jobs) = (&s.redis.key_prefix, &s.amqp.jobs_exchange, p.jobs as u64);
    let tenants = p.tenants;
    let stop_urgent = CancellationToken::new();
    let publishing = async {
        let published = paced(&conn, exchange, jobs, publish_rate, |i| {
            bulk(ns, i, tenants)
        })
        .await
        .map(|()| started.elapsed().as_secs_f64());
        let parked = match published {
            Ok(_) => parking.until(jobs, LIMIT).await.map(|()| unix_micros()),
            Err(_) => Ok(0),
        };
        if parked.is_ok() {
            tokio::time::sleep(URGENT_BEHIND).await;
        }
        stop_urgent.cancel();
        parked.and_then(|at| published.map(|p| (p, at)))
    };
    let every = every_until(&conn, exchange, URGENT_EVERY, stop_urgent.clone(), |i| {
        urgent(ns, i, tenants)
    });
    let (published, sent) = tokio::join!(publishing, every);
    let samples = parking.finish();
    let ((published, behind), sent) = (published?, sent?);
    let unparked = dispatches.unparked().load(Ordering::Relaxed);
    let (urgent, behind) = dispatches.finish(sent, Some(behind)).await?;
    let _ = closed(conn.close(200, "bye".into())).await;
    let parked_at = crossing(&samples, jobs).unwrap_or(f64::NAN);
    let mut run = run_of(p, (&samples, unparked), jobs as f64 / parked_at);
    run.pass = "campaign".into();
    run.publish_per_sec = Some(jobs as f64 / published);
    run.lag_secs = Some(parked_at - published);
    run.urgent = Some(urgent);
    run.urgent_behind_parked = behind;
    Ok(run)
}

/// The figures both passes share, from the plan, the samples (and of them the
/// jobs dispatched unparked) and the parking rate.
fn run_of(p: &Plan, (samples, unparked): (&[Sample], u64), parking_per_sec: f64) -> CampaignRun {
    CampaignRun {
        round: p.round,
        workers: p.workers,
        jobs: p.jobs,
        tenants: p.tenants,
        rate: p.rate,
        ceiling_msgs_per_sec: p.ceiling,
        parking_per_sec,
        parking_ratio: parking_per_sec / p.ceiling,
        parked: samples.last().map_or(0, |s| s.1).saturating_sub(unparked),
        dispatched_unparked: unparked,
        ..Default::default()
    }
}

/// The backlog: `jobs` bulk jobs published into the jobs exchange before the
/// workers start, then read and parked as fast as they can.
pub(super) async fn backlog(b: &Bench, p: Plan) -> Result<CampaignRun> {
    header(
        "campaign",
        format!(
            "round {}: a backlog of {} bulk jobs{} in the jobs queue, the channel at {}/s, {} worker(s)",
            p.round, p.jobs, of_tenants(p.tenants), p.rate, p.workers
        ),
    );
    let (s, env) = settings(b, "cb", &p);
    let mut procs = Vec::new();
    let result = park_backlog(b, &s, &env, &p, &mut procs).await;
    end(b, &s, &p, &mut procs).await;
    result
}

async fn park_backlog(
    b: &Bench,
    s: &Settings,
    env: &[(String, String)],
    p: &Plan,
    procs: &mut Vec<Child>,
) -> Result<CampaignRun> {
    let topology = Topology::from_settings(s);
    let conn = connect(&s.amqp.url).await?;
    topology.declare(&conn).await?;
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let ns = &s.redis.key_prefix;
    let jobs = p.jobs as u64;
    preload(
        &ch,
        &s.amqp.jobs_exchange,
        "",
        (0..jobs).map(|i| bulk(ns, i, p.tenants)),
    )
    .await?;
    let _ = ch.close(200, "".into()).await;
    let dispatches = Dispatches::start(&conn, &topology.dispatch_queue("sms")).await?;
    let started = Instant::now();
    let ports = spawn_all(b, s, env, p, procs)?;
    let parking = Parking::start(ports.clone(), dispatches.unparked(), started);
    let parked = async {
        all_ready(procs, &ports).await?;
        parking.until(jobs, LIMIT).await
    }
    .await;
    let samples = parking.finish();
    parked?;
    let unparked = dispatches.unparked().load(Ordering::Relaxed);
    dispatches.finish(0, None).await?;
    let _ = closed(conn.close(200, "bye".into())).await;
    let rate = rate_between(&samples, jobs, (0.1, 0.9)).unwrap_or(f64::NAN);
    let mut run = run_of(p, (&samples, unparked), rate);
    run.pass = "backlog".into();
    Ok(run)
}
