//! Fault scenario: a three-node RabbitMQ cluster (quorum queues replicated on every
//! node) loses, under load, first a node the worker is not connected to, then the
//! one it is connected to (the queues then have no majority), and both come back.
//! The worker is given every node's URL (`amqp.urls`) and no load balancer.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::{depth, noon_zone, publish_all};
use testkit::procs::{RabbitCluster, RabbitNode, WorkerProc};
use testkit::reliability::{long, record};
use testkit::*;

async fn connect_any(urls: &[String]) -> lapin::Connection {
    for _ in 0..600 {
        for url in urls {
            let connect = lapin::Connection::connect(url, lapin::ConnectionProperties::default());
            if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), connect).await {
                return c;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no node of the cluster answers");
}

/// Wait until the dispatch queue holds `target`, reading it through any live node.
async fn wait_dispatched(
    conn: &mut lapin::Connection,
    urls: &[String],
    queue: &str,
    target: u32,
    w: &WorkerProc,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        match depth(conn, queue).await {
            Some(d) if d >= target => return started.elapsed(),
            Some(_) => {}
            None if conn.status().connected() => {}
            None => *conn = connect_any(urls).await,
        }
        assert!(
            started.elapsed() < limit,
            "no progress to {target} dispatched:\n{}",
            w.tail(40)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rabbit_cluster_nodes_killed_under_load_the_worker_follows_and_loses_nothing() {
    let _heavy = heavy().await;
    if !RabbitNode::available() {
        record(
            json!({"scenario": "rabbit_cluster", "skipped": "no rabbitmq-server on this machine"}),
        );
        return;
    }
    let boot = Instant::now();
    let mut cluster = RabbitCluster::start(3).await;
    let boot = boot.elapsed().as_secs_f64();
    let urls = cluster.urls();
    let n = if long() { 8_000 } else { 2_000 };
    let ns = unique("rabbitcluster");
    let mut s = fault_settings(&ns, 200);
    s.amqp.url = urls[0].clone();
    s.amqp.urls = urls.clone();
    let _g = RedisGuard(ns.clone());
    let dir = testkit::temp_dir("rabbitcluster");
    let mut conn = connect_any(&urls).await;
    topology(&s).declare(&conn).await.unwrap();
    // every quorum queue has a replica on each node
    let members = cluster.nodes[0].ctl(&["list_queues", "name", "members", "--formatter", "json"]);
    let members: serde_json::Value = serde_json::from_slice(&members.stdout).unwrap();
    let jobs_members = members
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == s.amqp.jobs_queue.as_str())
        .map(|q| q["members"].as_array().map_or(0, Vec::len));
    assert_eq!(jobs_members, Some(3), "{members}");

    let mix = Mix::new(&ns, n, &noon_zone());
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let started = Instant::now();
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    let limit = Duration::from_secs(if long() { 600 } else { 180 });
    wait_dispatched(&mut conn, &urls, &dispatch, 300, &w, limit).await;

    // 1. a node the worker is not connected to
    let using = cluster
        .connected_node(w.pid())
        .expect("the worker is connected to a node");
    let other = (using + 1) % 3;
    let first_kill = Instant::now();
    cluster.nodes[other].kill();
    if other == 0 || using == 0 {
        conn = connect_any(&urls).await;
    }
    let moved_on = wait_dispatched(&mut conn, &urls, &dispatch, 600, &w, limit).await;
    let still_using = cluster.connected_node(w.pid());
    eprintln!(
        "node {other} killed: 300 more dispatched {moved_on:?} later; the worker on node {still_using:?}"
    );

    // 2. the node it is connected to: one node of three left, no majority
    let using = cluster.connected_node(w.pid()).unwrap_or(using);
    let second_kill = Instant::now();
    cluster.nodes[using].kill();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(w.running(), "the worker exited:\n{}", w.tail(40));

    // 3. both back
    let down = [first_kill.elapsed(), second_kill.elapsed()];
    let restarting = cluster
        .nodes
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| *i == other || *i == using)
        .map(|(_, node)| node.start());
    futures_util::future::join_all(restarting).await;
    let back_at = Instant::now();
    conn = connect_any(&urls).await;
    let resumed = wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(120))
        .await
        .unwrap_or_else(|| panic!("the worker never consumed again:\n{}", w.tail(40)));
    eprintln!("both nodes back; the worker consumed again {resumed:?} later");
    let _ = back_at;

    let end = finish(&conn, &s, &mix, limit, async { w.stop() }).await;
    let elapsed = end.quiet_at - started;
    let (a, status) = (&end.audit, end.stopped);
    if !end.settled {
        explain_stuck(a, &mix, &w);
    }
    conclude(
        &dir,
        json!({
            "scenario": "rabbit_cluster",
            "test": "tests/faults/rabbit_cluster.rs: rabbit_cluster_nodes_killed_under_load_the_worker_follows_and_loses_nothing",
            "jobs": n,
            "faults": 2,
            "fault": "SIGKILL of a node the worker is not connected to, then of the one it is (leaving one node of three: no majority), then both restarted",
            "cluster_boot_seconds": boot,
            "seconds_to_300_more_after_first_kill": moved_on.as_secs_f64(),
            "nodes_down_seconds": down.iter().map(|d| d.as_secs_f64()).collect::<Vec<_>>(),
            "recovery_seconds": resumed.as_secs_f64(),
            "duplicates": a.duplicate_dispatches(),
            "duplicate_waiting_copies": a.duplicate_waiting(),
            "duplicate_dead_letters": a.duplicate_dead(),
            "violations": end.violations.len(),
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
        end.wrong_dead.is_empty(),
        "dead letters: {:?}",
        end.wrong_dead
    );
}
