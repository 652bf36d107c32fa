//! The tenants step (`--steps tenants`): fair shares inside a lane. Tenant `a`
//! publishes `--jobs` bulk jobs (default 200,000; 20,000 with `--quick`) into the
//! jobs exchange as fast as it can; once the workers have parked them (the jobs
//! queue empty), tenants `b` (weight 1) and `c` (weight 2) publish 2,000 bulk jobs
//! each. The channel is paced at `--tenants-rate` (default 60/s), so `a`'s backlog
//! lasts far longer than the pass. One worker process and three.
//!
//! Measured from the dispatch queue (read without acks): each tenant's share of the
//! dispatches over the 60 s after both `b` and `c` are first dispatched, against
//! 1:1:2; how long `b` and `c` took from their publish to their last dispatch,
//! against what their shares promise (`c`: 2,000 at half the rate; `b`: a quarter of
//! the rate until `c` is done, then half); and how long after its publish each of
//! `b` and `c` was first dispatched.
//!
//! With `--tenants-count N`, N tenants active at once instead ([`many`]): what
//! they cost the broker, Redis and the worker, the drain, and what is left after.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, ConfirmSelectOptions, QueueDeleteOptions};
use lapin::types::FieldTable;
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::lanes::Priority;

use crate::broker::{closed, connect, preload};
use crate::context::{header, Bench};
use crate::procs::{spawn_worker_configured, stop, wait_ready};
use crate::report::{Report, TenantsRun};

mod many;

/// Jobs of each of `b` and `c`.
const SMALL: usize = 2_000;
/// The window over which the shares are counted.
const WINDOW: Duration = Duration::from_secs(60);
/// The longest a pass may take.
const LIMIT: Duration = Duration::from_secs(900);

/// Runs the step: one worker, then three; with `--tenants-count`, the many
/// tenants' passes ([`many`]) instead.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    if b.args.tenants_count > 0 {
        return many::step(b, &mut report.many_tenants).await;
    }
    let out = &mut report.tenants;
    let a_jobs = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 20_000 } else { 200_000 });
    let rate = b.args.tenants_rate.max(4);
    for workers in [1, 3] {
        let run = pass(b, workers, a_jobs, rate).await?;
        eprintln!("      {run:?}");
        out.push(run);
    }
    Ok(())
}

fn job(ns: &str, tenant: &str, i: usize) -> Vec<u8> {
    format!(
        r#"{{"id":"{ns}-{tenant}-{i}","recipient":"{tenant}{i}","channel":"sms","category":"default","priority":"bulk","tenant":"{tenant}"}}"#
    )
    .into_bytes()
}

/// The configuration file of the pass: `c` weighs 2.
fn config_file(ns: &str) -> Result<PathBuf> {
    let path = std::env::temp_dir().join(format!("{ns}-tenants.toml"));
    std::fs::write(&path, "[tenants.c]\nweight = 2\n")?;
    Ok(path)
}

async fn pass(b: &Bench, workers: usize, a_jobs: usize, rate: u64) -> Result<TenantsRun> {
    header(
        "tenants",
        format!("{a_jobs} bulk jobs of a, then 2,000 of b (weight 1) and of c (weight 2); the channel at {rate}/s; {workers} worker(s)"),
    );
    let mut s = b.settings(&format!("tn{workers}"));
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(rate);
    }
    let env = vec![(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        rate.to_string(),
    )];
    let config = config_file(&s.redis.key_prefix)?;
    let mut procs = Vec::new();
    let result = async {
        let conn = connect(&s.amqp.url).await?;
        Topology::from_settings(&s).declare(&conn).await?;
        let mut ports = Vec::new();
        for _ in 0..workers {
            let (child, port) = spawn_worker_configured(&b.worker, &s, &env, &config)?;
            procs.push(child);
            ports.push(port);
        }
        for (child, port) in procs.iter_mut().zip(&ports) {
            wait_ready(*port, child).await?;
        }
        let run = measure(&s, &conn, (workers, a_jobs, rate)).await;
        let _ = closed(conn.close(200, "bye".into())).await;
        run
    }
    .await;
    for child in &mut procs {
        stop(child);
    }
    delete_tenant_queues(&s, &["a", "b", "c"].map(String::from)).await;
    b.teardown.namespace(&s).await;
    let _ = std::fs::remove_file(config);
    result
}

/// The dispatches as they arrive: (tenant's letter, when).
type Arrivals = Arc<Mutex<Vec<(u8, Instant)>>>;

async fn read_dispatches(conn: &lapin::Connection, s: &Settings) -> Result<Arrivals> {
    let ch = conn.create_channel().await?;
    let queue = Topology::from_settings(s).dispatch_queue("sms");
    let options = BasicConsumeOptions {
        no_ack: true,
        ..Default::default()
    };
    let mut consumer = ch
        .basic_consume(
            queue.as_str().into(),
            "tenants".into(),
            options,
            FieldTable::default(),
        )
        .await?;
    let arrivals: Arrivals = Arc::default();
    let into = arrivals.clone();
    let ns = s.redis.key_prefix.clone();
    tokio::spawn(async move {
        while let Some(Ok(d)) = consumer.next().await {
            let id = d.properties.message_id().as_ref().map(|i| i.to_string());
            let letter = id
                .as_deref()
                .and_then(|i| i.strip_prefix(&format!("{ns}-")))
                .and_then(|rest| rest.bytes().next())
                .unwrap_or(b'?');
            into.lock().unwrap().push((letter, Instant::now()));
        }
    });
    Ok(arrivals)
}

async fn measure(
    s: &Settings,
    conn: &lapin::Connection,
    (workers, a_jobs, rate): (usize, usize, u64),
) -> Result<TenantsRun> {
    let arrivals = read_dispatches(conn, s).await?;
    let ns = s.redis.key_prefix.clone();
    let ch = conn.create_channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default()).await?;
    let exchange = s.amqp.jobs_exchange.clone();
    let started = Instant::now();
    preload(&ch, &exchange, "", (0..a_jobs).map(|i| job(&ns, "a", i))).await?;
    let a_publish_secs = started.elapsed().as_secs_f64();
    let topology = Topology::from_settings(s);
    loop {
        let q = ch
            .queue_declare(
                s.amqp.jobs_queue.as_str().into(),
                lapin::options::QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        if q.message_count() == 0 {
            break;
        }
        if started.elapsed() > LIMIT {
            bail!("a's jobs not parked within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let a_parked_secs = started.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let small = (0..SMALL)
        .map(|i| job(&ns, "b", i))
        .chain((0..SMALL).map(|i| job(&ns, "c", i)));
    preload(&ch, &exchange, "", small).await?;
    let _ = topology;
    loop {
        let done = {
            let a = arrivals.lock().unwrap();
            let n = |t: u8| a.iter().filter(|(l, _)| *l == t).count();
            n(b'b') >= SMALL && n(b'c') >= SMALL
        };
        if done {
            break;
        }
        if t0.elapsed() > LIMIT {
            bail!("b's and c's jobs not dispatched within {LIMIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = closed(ch.close(200, "".into())).await;
    let arrivals = arrivals.lock().unwrap().clone();
    Ok(figures(
        &arrivals,
        t0,
        (workers, a_jobs, rate),
        (a_publish_secs, a_parked_secs),
    ))
}

fn figures(
    arrivals: &[(u8, Instant)],
    t0: Instant,
    (workers, a_jobs, rate): (usize, usize, u64),
    (a_publish_secs, a_parked_secs): (f64, f64),
) -> TenantsRun {
    let since = |t: Instant| t.saturating_duration_since(t0).as_secs_f64();
    let of = |l: u8| arrivals.iter().filter(move |(x, t)| *x == l && *t >= t0);
    let first = |l: u8| of(l).map(|(_, t)| *t).min().unwrap_or(t0);
    let last = |l: u8| of(l).map(|(_, t)| *t).max().unwrap_or(t0);
    let from = first(b'b').max(first(b'c'));
    let window: Vec<u8> = arrivals
        .iter()
        .filter(|(_, t)| *t >= from && *t < from + WINDOW)
        .map(|(l, _)| *l)
        .collect();
    let n = window.len().max(1) as f64;
    let share = |l: u8| window.iter().filter(|x| **x == l).count() as f64 / n;
    let shares = [share(b'a'), share(b'b'), share(b'c')];
    let weights = [0.25, 0.25, 0.5];
    let r = rate as f64;
    let c_promised = SMALL as f64 / (r / 2.0);
    let b_promised = c_promised + (SMALL as f64 - r / 4.0 * c_promised) / (r / 2.0);
    TenantsRun {
        workers,
        a_jobs,
        rate,
        a_publish_secs,
        a_parked_secs,
        window_dispatches: window.len(),
        shares,
        share_errors: [0, 1, 2].map(|i| shares[i] / weights[i] - 1.0),
        b_first_secs: since(first(b'b')),
        c_first_secs: since(first(b'c')),
        b_done_secs: since(last(b'b')),
        c_done_secs: since(last(b'c')),
        b_promised_secs: b_promised,
        c_promised_secs: c_promised,
    }
}

/// Deletes the queues of `tenants` on `sms`, every lane (the teardown knows only the
/// topology's); one channel for all, opened again after a refusal.
pub(crate) async fn delete_tenant_queues(s: &Settings, tenants: &[String]) {
    delete_tenant_queues_of(s, tenants, &Priority::ALL).await
}

/// [`delete_tenant_queues`] of the lanes `lanes` only.
pub(crate) async fn delete_tenant_queues_of(s: &Settings, tenants: &[String], lanes: &[Priority]) {
    let Ok(conn) = connect(&s.amqp.url).await else {
        return;
    };
    let t = Topology::from_settings(s);
    let mut ch = None;
    for tenant in tenants {
        for &lane in lanes {
            if ch.is_none() {
                ch = conn.create_channel().await.ok();
            }
            let Some(c) = &ch else { continue };
            let q = t.tenant_queue("sms", lane, tenant);
            let deleted = c
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
            if deleted.is_err() {
                ch = None;
            }
        }
    }
    let _ = closed(conn.close(200, "bye".into())).await;
}
