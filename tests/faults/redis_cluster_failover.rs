//! Fault scenario: a Redis Cluster of three masters, each with two replicas, loses
//! a master under load; a replica is promoted and the worker follows the new slot
//! map by itself (`redis.cluster_urls` names every node, the dead one included). As
//! in the Sentinel scenario, the replicas are kept behind for a moment before the
//! kill, so the audit counts the sends the failover forgot. (`redis.wait_replicas`
//! is refused on a cluster: with it, the calls to the promoted master timed out
//! until the end of the run.)

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::depth;
use testkit::procs::RedisCluster;
use testkit::reliability::{long, record};
use testkit::*;

/// How long the replica is kept behind before its master is killed.
const BEHIND: Duration = Duration::from_millis(1500);
/// `cluster-node-timeout` of the nodes (ms): a master unreachable this long is
/// failed over.
const NODE_TIMEOUT_MS: u32 = 1000;

/// The port of the master that `replica`'s `INFO replication` names.
fn master_of(info: &str) -> Option<u16> {
    info.lines()
        .find_map(|l| l.strip_prefix("master_port:"))
        .and_then(|p| p.trim().parse().ok())
}

async fn failover() -> serde_json::Value {
    let n = if long() { 6_000 } else { 1_500 };
    let mut cluster = RedisCluster::with_replicas(2, NODE_TIMEOUT_MS);
    let ns = unique("clusterfo");
    let mut s = fault_settings(&ns, 300);
    s.redis.cluster = true;
    s.redis.cluster_urls = cluster.urls();
    let _c = Cleanup::new(&s);
    let Loaded {
        conn,
        mix,
        dispatch,
        dir,
        started,
        mut w,
    } = load_and_start(&s, &ns, n, "clusterfo").await;

    // one master's replicas fall behind, then that master dies
    let victim = cluster.masters()[0];
    let victim_port = cluster.nodes[victim].port;
    let replicas: Vec<usize> = (0..cluster.nodes.len())
        .filter(|&i| master_of(&cluster.nodes[i].replication()) == Some(victim_port))
        .collect();
    assert_eq!(replicas.len(), 2, "replicas of the victim");
    for &r in &replicas {
        cut_replication(
            &cluster.nodes[victim],
            std::slice::from_ref(&cluster.nodes[r]),
        );
    }
    tokio::time::sleep(BEHIND).await;
    let master_offset = repl_offset(&cluster.nodes[victim].replication());
    let replica_offset = repl_offset(&cluster.nodes[replicas[0]].replication());
    cluster.nodes[victim].kill9();
    let killed = Instant::now();
    let at_kill = depth(&conn, &dispatch).await.unwrap_or(0);
    for &r in &replicas {
        restore_replication(std::slice::from_ref(&cluster.nodes[r]));
    }
    let (promoted, resumed) = watch_failover(&conn, &dispatch, killed, at_kill, || {
        replicas
            .iter()
            .any(|&r| cluster.nodes[r].replication().contains("role:master"))
            && cluster.ok()
    })
    .await;
    let promoted = promoted.expect("the replica was never promoted");
    // the audit reads the cluster through the nodes still running
    let mut audit_settings = s.clone();
    audit_settings.redis.cluster_urls = cluster.urls();
    let limit = Duration::from_secs(if long() { 600 } else { 180 });
    let end = finish(&conn, &audit_settings, &mix, limit, async { w.stop() }).await;
    let run = Failover {
        jobs: n,
        replica_behind_bytes: master_offset.zip(replica_offset).map(|(m, r)| m - r),
        promoted,
        resumed,
        started,
    };
    conclude_failover("cluster failover", &s, &end, &mix, &w, &dir, run, json!({}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_under_load_the_worker_follows_its_replica() {
    let _heavy = heavy().await;
    let run = failover().await;
    let mut figures = json!({
        "scenario": "redis_cluster_failover",
        "test": "tests/faults/redis_cluster_failover.rs: cluster_master_killed_under_load_the_worker_follows_its_replica",
        "faults": 1,
        "fault": format!(
            "a master's replicas kept from resyncing for {} ms, then SIGKILL of that master (three masters with two replicas each, cluster-node-timeout {} ms)",
            BEHIND.as_millis(), NODE_TIMEOUT_MS
        ),
    });
    for (k, v) in run.as_object().unwrap() {
        figures[k] = v.clone();
    }
    figures["violations"] = json!(
        run["violations"]["forgotten_sends"].as_u64().unwrap_or(0)
            + run["violations"]["over_cap"].as_u64().unwrap_or(0)
    );
    figures["violations_by_kind"] = run["violations"].clone();
    record(figures);
}
