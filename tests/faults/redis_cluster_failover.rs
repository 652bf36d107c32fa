//! Fault scenario: a Redis Cluster of three masters, each with two replicas, loses
//! a master under load; a replica is promoted and the worker follows the new slot
//! map by itself (`redis.cluster_urls` names every node, the dead one included). As
//! in the Sentinel scenario, the replicas are kept behind for a moment before the
//! kill, so the audit counts the sends the failover forgot; and they stay cut off
//! until a while after the promotion, so the new master first serves with no
//! replica at all. Run twice: without `redis.wait_replicas` (what a failover costs
//! the caps) and with it set to 1 (each admission dispatched only once a replica
//! has it: nothing forgotten; while the new master has no replica its recipients'
//! jobs are held and retried, and the other masters' recipients go on).

use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::Dur;
use serde_json::json;
use testkit::audit::depth;
use testkit::procs::RedisCluster;
use testkit::reliability::long;
use testkit::*;

/// How long the replica is kept behind before its master is killed.
const BEHIND: Duration = Duration::from_millis(1500);
/// How long the promoted master serves with no replica (its sibling kept from
/// attaching).
const ALONE: Duration = Duration::from_secs(3);
/// `cluster-node-timeout` of the nodes (ms): a master unreachable this long is
/// failed over.
const NODE_TIMEOUT_MS: u32 = 1000;

/// The port of the master that `replica`'s `INFO replication` names.
fn master_of(info: &str) -> Option<u16> {
    info.lines()
        .find_map(|l| l.strip_prefix("master_port:"))
        .and_then(|p| p.trim().parse().ok())
}

async fn failover(wait: bool) -> serde_json::Value {
    let n = if long() { 6_000 } else { 1_500 };
    let mut cluster = RedisCluster::with_replicas(2, NODE_TIMEOUT_MS);
    let ns = unique(if wait { "clusterfowait" } else { "clusterfo" });
    let mut s = fault_settings(&ns, 300);
    s.redis.cluster = true;
    s.redis.cluster_urls = cluster.urls();
    if wait {
        s.redis.wait_replicas = 1;
        s.redis.wait_timeout = Dur(Duration::from_millis(500));
    }
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
    let replica_offsets: Vec<Option<i64>> = replicas
        .iter()
        .map(|&r| repl_offset(&cluster.nodes[r].replication()))
        .collect();
    let replica_offset = replica_offsets[0];
    cluster.nodes[victim].kill9();
    let killed = Instant::now();
    let at_kill = depth(&conn, &dispatch).await.unwrap_or(0);
    let (promoted, resumed) = watch_failover(&conn, &dispatch, killed, at_kill, || {
        replicas
            .iter()
            .any(|&r| cluster.nodes[r].replication().contains("role:master"))
            && cluster.ok()
    })
    .await;
    let promoted = promoted.expect("the replica was never promoted");
    let at_promotion = depth(&conn, &dispatch).await.unwrap_or(0);
    // the new master serves alone for a while, then its sibling may attach
    tokio::time::sleep((promoted + ALONE).saturating_sub(killed.elapsed())).await;
    let before = depth(&conn, &dispatch).await.unwrap_or(0);
    for &r in &replicas {
        restore_replication(std::slice::from_ref(&cluster.nodes[r]));
    }
    let restored = killed.elapsed();
    let new_master = replicas
        .iter()
        .copied()
        .find(|&r| cluster.nodes[r].replication().contains("role:master"))
        .expect("the promoted replica");
    let mut attached = None;
    while killed.elapsed() < restored + Duration::from_secs(30) {
        let info = cluster.nodes[new_master].replication();
        if info
            .lines()
            .any(|l| l.starts_with("slave0:") && l.contains("state=online"))
        {
            attached = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
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
    let alone = promoted.as_secs_f64()..restored.as_secs_f64();
    conclude_failover(
        "cluster failover",
        &s,
        &end,
        &mix,
        &w,
        &dir,
        run,
        json!({
            // from the kill: the promoted master alone, and its first replica online
            "alone_seconds": [alone.start, alone.end],
            "replica_attached_seconds": attached.map(|d| d.as_secs_f64()),
            "dispatched_while_alone": before.saturating_sub(at_promotion),
            "replica_offsets_at_kill": replica_offsets,
            "master_offset_at_kill": master_offset,
            "promoted_replica": replicas.iter().position(|&r| r == new_master),
        }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_under_load_forgets_sends_unless_admissions_wait_for_a_replica() {
    let _heavy = heavy().await;
    let without = failover(false).await;
    let with = failover(true).await;
    // with WAIT no dispatched job's send is forgotten, and no cap is exceeded
    record_failover_pair(
        "redis_cluster_failover",
        "tests/faults/redis_cluster_failover.rs: cluster_master_killed_under_load_forgets_sends_unless_admissions_wait_for_a_replica",
        format!(
            "a master's replicas kept from resyncing for {} ms, then SIGKILL of that master (three masters with two replicas each, cluster-node-timeout {} ms); the promoted replica serves {} s with no replica before its sibling may attach",
            BEHIND.as_millis(), NODE_TIMEOUT_MS, ALONE.as_secs()
        ),
        &without,
        &with,
    );
}
