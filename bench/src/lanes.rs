//! The lanes step (`--steps lanes`): the urgent wait behind a bulk backlog. A channel
//! paced at 100 jobs/s, a backlog of bulk jobs (`--jobs`, default 100,000; 10,000
//! with `--quick`) parked in its lane, then urgent jobs offered at 2/s for 12 s, as a
//! producer that knows nothing of lanes sends them (`transactional`, no `priority`,
//! to the jobs exchange), each stamped when published: publish-to-dispatch times of
//! the urgent jobs, on one worker and on three.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use lapin::options::QueueDeclareOptions;
use lapin::types::FieldTable;
use lapin::Connection;

use crate::broker::{connect, offer, preload, Arrivals};
use crate::context::{header, Bench};
use crate::procs::{spawn_worker, stop, wait_ready};
use crate::report::{EndToEnd, LaneWait, Report};
use crate::table::fmt_e2e;
use quota_worker::amqp::Topology;
use quota_worker::lanes::Priority;

/// The channel's rate, jobs per second.
const RATE: u64 = 100;
/// Urgent jobs offered per second, and for how long.
const URGENT_RATE: f64 = 2.0;
const URGENT_SECS: u64 = 12;

/// Runs the step into `report`: one worker, then three.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let conn = connect(&b.args.amqp).await?;
    let backlog = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 10_000 } else { 100_000 });
    for workers in [1, 3] {
        let l = pass(b, &conn, workers, backlog).await?;
        eprintln!(
            "      urgent publish-to-dispatch p50/p99/p99.9 ms: {} ({} of {} arrived; {} bulk still waiting)",
            fmt_e2e(Some(&l.urgent)),
            l.urgent.arrived,
            l.urgent.sent,
            l.bulk_waiting
        );
        report.lanes.push(l);
    }
    Ok(())
}

async fn pass(b: &Bench, conn: &Connection, workers: usize, backlog: usize) -> Result<LaneWait> {
    header(
        "lanes",
        format!("{workers} worker(s), {backlog} bulk jobs at {RATE}/s, urgent jobs at {URGENT_RATE}/s for {URGENT_SECS} s"),
    );
    let mut s = b.settings(&format!("ln{workers}"));
    // paced in the settings too, so that the topology the teardown deletes has
    // the channel's lane queues
    if let Some(sms) = s.channels.get_mut("sms") {
        sms.rate = Some(RATE);
    }
    let env = [(
        "QUOTA_WORKER__CHANNELS__SMS__RATE".to_string(),
        RATE.to_string(),
    )];
    let mut procs = Vec::new();
    for _ in 0..workers {
        let (mut child, port) = spawn_worker(&b.worker, &s, &env)?;
        wait_ready(port, &mut child).await?;
        procs.push(child);
    }
    let result = measure(conn, &s, backlog).await;
    for child in &mut procs {
        stop(child);
    }
    b.teardown.namespace(&s).await;
    let (bulk_waiting, urgent) = result?;
    Ok(LaneWait {
        workers,
        backlog,
        rate: RATE,
        bulk_waiting,
        urgent,
    })
}

async fn measure(
    conn: &Connection,
    s: &quota_worker::config::Settings,
    backlog: usize,
) -> Result<(u32, EndToEnd)> {
    let topology = Topology::from_settings(s);
    let ns = &s.redis.key_prefix;
    let bulk = (0..backlog).map(|i| {
        format!(r#"{{"id":"{ns}-b{i}","recipient":"b{i}","channel":"sms","category":"transactional","priority":"bulk"}}"#)
            .into_bytes()
    });
    let ch = conn.create_channel().await?;
    ch.confirm_select(Default::default()).await?;
    preload(&ch, &s.amqp.jobs_exchange, "", bulk).await?;
    // every bulk job read and parked: the jobs queue is empty, the lane holds them
    let deadline = Instant::now() + Duration::from_secs(600);
    while ready(conn, &s.amqp.jobs_queue).await? > 0 {
        if Instant::now() > deadline {
            bail!("the jobs queue was not read within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let arrivals = Arrivals::start(conn, &topology.dispatch_queue("sms")).await?;
    let body = |i: u64| {
        format!(
            r#"{{"id":"{ns}-u{i}","recipient":"u{i}","channel":"sms","category":"transactional"}}"#
        )
    };
    let sent = offer(
        conn,
        &s.amqp.jobs_exchange,
        "",
        URGENT_RATE,
        URGENT_SECS,
        body,
    )
    .await?;
    let bulk_waiting = ready(conn, &topology.lane_queue("sms", Priority::Bulk)).await?;
    // the last urgent ones' way through (the count also sees bulk arrivals)
    tokio::time::sleep(Duration::from_secs(3)).await;
    let urgent = arrivals.finish(sent).await?;
    let _ = ch.close(200, "".into()).await;
    Ok((bulk_waiting, urgent))
}

/// Messages ready in `queue` (a passive declare).
pub(crate) async fn ready(conn: &Connection, queue: &str) -> Result<u32> {
    let ch = conn.create_channel().await?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let q = ch
        .queue_declare(queue.into(), passive, FieldTable::default())
        .await?;
    let _ = ch.close(200, "".into()).await;
    Ok(q.message_count())
}
