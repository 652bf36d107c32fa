//! Fault scenario: the broker restarted while digests are open.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::{depth, publish_all};
use testkit::procs::WorkerProc;
use testkit::*;

/// 600 jobs of a digest policy over 200 recipients (a 6 s window), all folded;
/// the private RabbitMQ node is stopped while their 200 digests are open and
/// started again (their windows end while it is down, or soon after). The worker
/// reconnects by itself; every digest reaches the dispatch queue once, with every
/// job in exactly one digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_with_digests_open_sends_each_once_with_every_item() {
    let _heavy = heavy().await;
    let Some(mut guard) = private_node_or_skip("digest_broker_restart").await else {
        return;
    };
    let (node, _) = &mut *guard;
    let ns = unique("digestrestart");
    let mut s = digest_settings(&ns, Duration::from_secs(6), None);
    s.amqp.url = node.url();
    let _g = RedisGuard(ns.clone());
    let dir = testkit::temp_dir("digestrestart");
    let mut conn = connect_node(&node.url()).await;
    topology(&s).declare(&conn).await.expect("topology");
    let jobs = digest_jobs(&ns, 200, 3);
    let started = Instant::now();
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    publish_all(&conn, &s, &jobs).await;
    // every job folded, every digest still open
    let mut progress = Progress::new(Duration::from_secs(30));
    loop {
        let (open, closing) = digest_state(&s);
        let queued = depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        if open == 200 && queued == 0 {
            assert!(
                closing.is_empty(),
                "a digest closed before the broker stopped"
            );
            break;
        }
        progress.see(open as u64, u64::from(queued));
        assert!(
            !progress.stalled(),
            "not folded: {open} digests, {queued} jobs queued:\n{}",
            w.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let sent_before = depth(&conn, &topology(&s).dispatch_queue("sms"))
        .await
        .unwrap_or(0);
    assert_eq!(sent_before, 0, "a digest went before the broker stopped");
    let down_at = Instant::now();
    node.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.start().await;
    let down_for = down_at.elapsed().as_secs_f64();
    conn = connect_node(&node.url()).await;
    wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("the worker never came back:\n{}", w.tail(40)));
    let settled = until_digests_sent(&conn, &s, 200, Duration::from_secs(60)).await;
    let status = w.stop();
    let sent = drain_dispatch(&conn, &s).await;
    let a = DigestAudit::of(&sent, &jobs);
    testkit::reliability::record(json!({
        "scenario": "digest_broker_restart",
        "test": "tests/faults/digest_broker_restart.rs: broker_restart_with_digests_open_sends_each_once_with_every_item",
        "jobs": jobs.len(),
        "faults": 1,
        "fault": "rabbitmqctl stop + start with 200 digests open",
        "broker_down_seconds": down_for,
        "digests": a.digests,
        "duplicates": a.twice.len(),
        "lost": a.lost.len(),
        "elapsed_seconds": started.elapsed().as_secs_f64(),
    }));
    a.assert_end((&dir, &w), settled, status, (&conn, &s), 200)
        .await;
    drop(conn);
}
