//! The recovery step (`--steps recovery`): how fast a paced channel's backlog drains
//! once it sits in a lane. A ceiling first (the broker's pass-through, as in every
//! other step); the channel is then paced at half of it. A backlog of bulk jobs
//! (`--jobs`, default 100,000; 10,000 with `--quick`) is parked in the channel's bulk
//! lane before any worker runs, as a fault leaves it; then the workers start and the
//! dispatch queue's depth is read every 100 ms until every job is there. Four passes:
//! one worker and three, each without and with a broker restart in the middle of the
//! drain (the stop is asked as soon as the drain has begun: the workers go on
//! dispatching for the 2–10 s `rabbitmqctl stop` takes on this loaded machine, so the
//! broker goes away in the middle of the drain; a stop asked later left three workers
//! little or nothing to drain after the return). The restart passes run on a private
//! RabbitMQ node the step starts, so the shared broker is never restarted; they are
//! skipped where no node can be started.
//!
//! Reported: the drain rate over the whole drain and by 5-second interval, against the
//! channel's rate, and the seconds the broker was away: from its last answer as it
//! stops until the lane queue with the backlog serves a consumer again (a quorum
//! queue answers a declare before it has read its log again, and serves consumers
//! only after: no worker can drain it before). The intervals that overlap the restart are marked,
//! the whole-drain figure is also given without them, and the first interval counted
//! from the broker's first answer instead is given beside.
//!
//! Then the burst ([`burst`](burst::burst)): the same number of bulk jobs published to the jobs
//! exchange as fast as the benchmark can, as a producer that knows no lanes sends a
//! campaign, while one worker (then three) reads and parks them: the publish rate, the
//! parking rate, and how long an urgent job published right behind them waits.

use anyhow::{bail, Result};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::lanes::Priority;
use testkit::procs::RabbitNode;

use crate::broker::{closed, connect, preload};
use crate::ceiling::ceiling;
use crate::context::{header, Bench};
use crate::lanes::ready;
use crate::procs::{spawn_worker, stop, wait_ready};
use crate::report::{Recovery, Report};

mod burst;
mod restart;
mod summary;
mod watch;

use burst::burst;
use summary::summarise;
use watch::watch;

/// Runs the step into `report`.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let jobs = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 10_000 } else { 100_000 });
    let c = b.settings("rcceil");
    let (ceiling_rate, _) = ceiling(&c, "a-allowed", b.jobs.min(50_000)).await?;
    b.teardown.ceiling(&c).await;
    let rate = ((ceiling_rate / 2.0).round() as u64).max(1);
    header(
        "recovery",
        format!("ceiling {ceiling_rate:.0} msgs/s: the channel paced at {rate}/s"),
    );
    let restart_possible = RabbitNode::available();
    // `QW_BENCH_RECOVERY=restart`: only the passes with a broker restart (no burst)
    let restart_only = std::env::var("QW_BENCH_RECOVERY").is_ok_and(|v| v == "restart");
    for restart in [false, true] {
        if restart_only && !restart {
            continue;
        }
        if restart && !restart_possible {
            eprintln!("      no RabbitMQ node can be started here: the restart passes are skipped");
            continue;
        }
        for workers in [1, 3] {
            let mut r = pass(b, workers, jobs, rate, restart).await?;
            r.ceiling_msgs_per_sec = ceiling_rate;
            print_pass(&r);
            report.recovery.push(r);
        }
    }
    for workers in [1, 3] {
        if restart_only {
            break;
        }
        let burst = burst(b, workers, jobs, rate).await?;
        eprintln!(
            "      published at {:.0}/s, parked at {:.0}/s: an urgent job behind them waits {:.1} s",
            burst.publish_per_sec, burst.parking_per_sec, burst.urgent_wait_secs
        );
        report.bursts.push(burst);
    }
    Ok(())
}

/// What a pass measured, on stderr.
fn print_pass(r: &Recovery) {
    eprintln!(
        "      drained {} jobs in {:.1} s: {:.3} of the rate (without the outage {:.3}); lowest 5 s interval {:.3}{}",
        r.jobs, r.drain_secs, r.ratio_whole, r.ratio_without_outage, r.min_interval_ratio,
        r.resumed_after_secs.map_or(String::new(), |s| format!("; dispatching again {s:.2} s after the broker's first answer"))
    );
    if let Some(secs) = r.stopping_secs {
        eprintln!("      the broker answered for {secs:.2} s after it was asked to stop");
    }
    if let Some(secs) = r.consuming_after_secs {
        eprintln!("      every worker consuming again {secs:.2} s after the broker's first answer");
    }
    if let Some(secs) = r.lane_serving_after_secs {
        eprintln!("      its lane queue serving a consumer again {secs:.2} s after the broker's first answer");
    }
    if let Some(first) = r.first_from_answer_ratio {
        eprintln!("      the first interval counted from the broker's first answer instead: {first:.3} of the rate");
    }
}

async fn pass(
    b: &Bench,
    workers: usize,
    jobs: usize,
    rate: u64,
    restart: bool,
) -> Result<Recovery> {
    header(
        "recovery",
        format!(
            "{workers} worker(s), {jobs} bulk jobs parked, paced at {rate}/s{}",
            if restart {
                ", the broker restarted in the middle"
            } else {
                ""
            }
        ),
    );
    let suffix = format!("rc{workers}{}", if restart { "r" } else { "" });
    let mut s = b.settings(&suffix);
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(rate);
    }
    let mut node = None;
    if restart {
        let mut n = RabbitNode::new();
        n.start().await;
        s.amqp.url = n.url();
        node = Some(n);
    }
    let result = drain(b, &s, workers, jobs, rate, node.as_mut()).await;
    if let Some(mut n) = node {
        n.stop();
        // the keys are on the shared Redis; the queues went with the node
        s.amqp.url = b.args.amqp.clone();
    }
    b.teardown.namespace(&s).await;
    result
}

async fn drain(
    b: &Bench,
    s: &Settings,
    workers: usize,
    jobs: usize,
    rate: u64,
    node: Option<&mut RabbitNode>,
) -> Result<Recovery> {
    let topology = Topology::from_settings(s);
    let conn = connect(&s.amqp.url).await?;
    topology.declare(&conn).await?;
    let lane = topology.lane_queue("sms", Priority::Bulk);
    let dispatch = topology.dispatch_queue("sms");
    let ns = &s.redis.key_prefix;
    let bodies = (0..jobs).map(|i| {
        format!(r#"{{"id":"{ns}-r{i}","recipient":"r{i}","channel":"sms","category":"transactional","priority":"bulk"}}"#)
            .into_bytes()
    });
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    preload(
        &ch,
        &s.lanes.exchange,
        &Priority::Bulk.routing_key("sms"),
        bodies,
    )
    .await?;
    let parked = ready(&conn, &lane).await?;
    if parked as usize != jobs {
        bail!("{parked} of {jobs} jobs parked in {lane}");
    }
    let _ = closed(conn.close(200, "bye".into())).await;

    let env = [(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        rate.to_string(),
    )];
    let (mut procs, mut ports) = (Vec::new(), Vec::new());
    for _ in 0..workers {
        let (mut child, port) = spawn_worker(&b.worker, s, &env)?;
        wait_ready(port, &mut child).await?;
        procs.push(child);
        ports.push(port);
    }
    let watched = watch(s, (&dispatch, &lane), (jobs, rate), &ports, node).await;
    for child in &mut procs {
        stop(child);
    }
    let watched = watched?;
    let mut r = summarise(workers, jobs, rate, &watched.samples, watched.restart);
    r.consuming_after_secs = watched.consuming_after;
    Ok(r)
}
