//! Fault scenario: the broker restarted under load.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::depth;
use testkit::reliability::long;
use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_the_worker_reconnects_by_itself_and_loses_nothing() {
    let _heavy = heavy().await;
    let Some(mut guard) = private_node_or_skip("broker_restart").await else {
        return;
    };
    let (node, boot) = &mut *guard;
    let boot = *boot;
    let restarts: &[&str] = if long() { &["stop", "kill"] } else { &["stop"] };
    let n = if long() { 8_000 } else { 2_000 };
    let ns = unique("brokerrestart");
    let s = node_settings(node, &ns, 200);
    let _g = RedisGuard(ns.clone());
    let Loaded {
        mut conn,
        mix,
        dispatch,
        dir,
        started,
        mut w,
    } = start_on_node(node, &s, &ns, n, "brokerrestart").await;
    let mut recovery = Vec::new();
    let mut down_for = Vec::new();
    for (i, how) in restarts.iter().enumerate() {
        let target = 300 * (i + 1) as u32;
        while depth(&conn, &dispatch).await.unwrap_or(0) < target {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no progress:\n{}",
                w.tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let down_at = Instant::now();
        match *how {
            "stop" => node.stop(),
            _ => node.kill(),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        node.start().await;
        down_for.push(down_at.elapsed().as_secs_f64());
        let back_at = Instant::now();
        conn = connect_node(&node.url()).await;
        let back = wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("the worker never came back:\n{}", w.tail(40)));
        eprintln!(
            "broker {how}: back after {:.1}s; the worker consumed again {back:?} later",
            down_for[i]
        );
        let _ = back_at;
        recovery.push(back);
        assert!(w.running(), "the worker exited:\n{}", w.tail(40));
    }
    let end = finish(
        &conn,
        &s,
        &mix,
        Duration::from_secs(if long() { 600 } else { 180 }),
        async { w.stop() },
    )
    .await;
    let elapsed = end.quiet_at - started;
    let (a, status) = (&end.audit, end.stopped);
    if !end.settled {
        explain_stuck(a, &mix, &w);
    }
    let max_recovery = recovery.iter().max().unwrap().as_secs_f64();
    conclude(
        &dir,
        json!({
            "scenario": "broker_restart",
            "test": "tests/faults/broker_restart.rs: broker_restart_the_worker_reconnects_by_itself_and_loses_nothing",
            "jobs": n,
            "faults": restarts.len(),
            "fault": restarts.iter().map(|h| if *h == "stop" { "rabbitmqctl stop + start" } else { "SIGKILL of the node + start" }).collect::<Vec<_>>().join(", "),
            "broker_down_seconds": down_for,
            "broker_boot_seconds": boot,
            "duplicates": a.duplicate_dispatches(),
            "duplicate_waiting_copies": a.duplicate_waiting(),
            "duplicate_dead_letters": a.duplicate_dead(),
            "violations": end.violations.len(),
            "recovery_seconds": max_recovery,
            "elapsed_seconds": elapsed.as_secs_f64(),
        }),
        end.settled,
        &end.lost,
        &a.summary(&mix.jobs),
    );
    drop(conn);
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "worker exit {status:?}:\n{}",
        w.tail(30)
    );
    end.assert_clean();
    assert!(
        max_recovery < 5.0,
        "reconnected {max_recovery:.1}s after the broker was back"
    );
}
