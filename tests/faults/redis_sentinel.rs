//! Fault scenario: Redis Sentinel (a master, two replicas, three sentinels, all
//! started here) fails the master over under load, the worker finding the new master
//! through the sentinels (`[redis.sentinel]`). The master dies while its replicas
//! are behind (their replication links cut a moment before the kill), so the
//! replica promoted lacks the last sends the old master recorded. Run twice:
//! without `redis.wait_replicas` (what a failover costs the caps) and with it set
//! to 1 (each admission dispatched only once a replica has it: nothing forgotten).
//! Two replicas, so that the new master still has one to wait for.

use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::{Dur, SentinelSettings};
use serde_json::json;
use testkit::audit::depth;
use testkit::procs::RedisSentinel;
use testkit::reliability::long;
use testkit::*;

/// How long the replica is kept behind before the master is killed.
const BEHIND: Duration = Duration::from_millis(1500);

async fn failover(wait: bool) -> serde_json::Value {
    let n = if long() { 6_000 } else { 1_500 };
    let mut group = RedisSentinel::start(2, 1000);
    let ns = unique(if wait { "sentinelwait" } else { "sentinel" });
    let mut s = fault_settings(&ns, 300);
    s.redis.url = group.nodes[0].url();
    s.redis.sentinel = Some(SentinelSettings {
        master_name: group.master_name.clone(),
        urls: group.urls(),
    });
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
    } = load_and_start(&s, &ns, n, "sentinel").await;

    // the replicas fall behind, then the master dies
    let master_port = group.nodes[0].port;
    cut_replication(&group.nodes[0], &group.nodes[1..]);
    tokio::time::sleep(BEHIND).await;
    let master_offset = repl_offset(&group.nodes[0].replication());
    let replica_offset = repl_offset(&group.nodes[1].replication());
    group.nodes[0].kill9();
    let killed = Instant::now();
    let at_kill = depth(&conn, &dispatch).await.unwrap_or(0);
    restore_replication(&group.nodes[1..]);
    let (promoted, resumed) = watch_failover(&conn, &dispatch, killed, at_kill, || {
        group.master_port(0).is_some_and(|p| p != master_port)
    })
    .await;
    let promoted = promoted.unwrap_or_else(|| {
        panic!(
            "the sentinels never promoted the replica: {:?}",
            group.master_state(0)
        )
    });
    let limit = Duration::from_secs(if long() { 600 } else { 180 });
    let end = finish(&conn, &s, &mix, limit, async { w.stop() }).await;
    let run = Failover {
        jobs: n,
        replica_behind_bytes: master_offset.zip(replica_offset).map(|(m, r)| m - r),
        promoted,
        resumed,
        started,
    };
    conclude_failover(
        "sentinel failover",
        &s,
        &end,
        &mix,
        &w,
        &dir,
        run,
        json!({ "master_port": master_port }),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_under_load_forgets_sends_unless_admissions_wait_for_a_replica() {
    let _heavy = heavy().await;
    let without = failover(false).await;
    let with = failover(true).await;
    // with WAIT no dispatched job's send is forgotten, and no cap is exceeded
    record_failover_pair(
        "redis_sentinel",
        "tests/faults/redis_sentinel.rs: sentinel_failover_under_load_forgets_sends_unless_admissions_wait_for_a_replica",
        format!(
            "the replica kept from resyncing for {} ms, then SIGKILL of the master; Sentinel (three sentinels, quorum 2, down-after 1 s) promotes the replica",
            BEHIND.as_millis()
        ),
        &without,
        &with,
    );
}
