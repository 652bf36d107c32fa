//! Fault scenario: a Redis Sentinel failover while stacked limits hold the jobs
//! (the limits and workers of `limits_kill`, two workers, a master with two
//! replicas and three sentinels started here). The replicas are kept behind for
//! a moment, then the master is killed, so the replica promoted lacks the last
//! writes the old master acknowledged. A limit's take is written by the same
//! atomic call as the job's recorded send, so it is replicated, and forgotten,
//! with it.
//!
//! Run twice. Without `redis.wait_replicas`: what the failover forgets is
//! measured (the dispatched jobs whose send, and so whose takes, the new master
//! does not know: their units went out without being counted, and the buckets
//! let as many through again). With `redis.wait_replicas = 1`: a job is
//! dispatched only once a replica has its admission, takes included, so the new
//! master knows every take of every job sent: no window of any limit exceeded
//! (checked from the dispatch record), nothing forgotten, lost or sent twice.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::harness::*;
use crate::limits_kill::{jobs, judge_limits, stacked};
use quota_worker::config::{Dur, SentinelSettings};
use serde_json::json;
use testkit::audit::{self, depth, Audit};
use testkit::limit_log::{self, Sent};
use testkit::procs::{RedisSentinel, WorkerProc};
use testkit::*;

/// How long the replicas are kept behind before the master is killed.
const BEHIND: Duration = Duration::from_millis(1500);

async fn failover(wait: bool) -> serde_json::Value {
    let n = if testkit::reliability::long() {
        1_500
    } else {
        300
    };
    let mut group = RedisSentinel::start(2, 1000);
    let ns = unique(if wait { "limitssentwait" } else { "limitssent" });
    let mut s = stacked(&ns);
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
    let dir = testkit::temp_dir("limitssent");
    declare(&s).await;
    let (published, by_id) = jobs(&ns, n);
    let conn = amqp().await;
    let mut procs: Vec<WorkerProc> = (0..2)
        .map(|k| WorkerProc::spawn(crate::BIN, &s, &dir, &k.to_string()))
        .collect();
    wait_consumers(&conn, &s.amqp.jobs_queue, 2, Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("two consumers:\n{}", procs[0].tail(30)));
    let started = Instant::now();
    audit::publish_all(&conn, &s, &published).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    // under way: past the account's burst, held by its rates
    wait_for(
        "the limits holding jobs",
        Duration::from_secs(120),
        || async { depth(&conn, &dispatch).await.unwrap_or(0) >= 60 },
    )
    .await;
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
    let promoted = promoted.unwrap_or_else(|| panic!("no promotion: {:?}", group.master_state(0)));
    let settled = wait_until_quiet(&conn, &s, n, 0, Duration::from_secs(120)).await;
    let statuses: Vec<_> = procs.iter_mut().map(|w| w.stop()).collect();
    let a = Audit::collect(&conn, &s, &published).await;
    eprintln!("{}", a.summary(&published));
    let judged = judge_limits(&s, &a, &published, &by_id).await;
    let forgotten_units: u64 = judged.unrecorded.iter().map(|id| by_id[id].cost).sum();
    let estimate = with_forgotten(&a, &judged.sent, &judged.unrecorded, &by_id);
    let estimated = limit_log::exceeded(&s.limits, &estimate);
    let most_over = estimated.iter().map(|w| w.fill.over()).fold(0.0, f64::max);
    let figures = json!({
        "wait_replicas": s.redis.wait_replicas,
        "jobs": n,
        "replica_behind_bytes": master_offset.zip(replica_offset).map(|(m, r)| m - r),
        "promoted_seconds": promoted.as_secs_f64(),
        "recovery_seconds": resumed.map(|d| d.as_secs_f64()),
        "elapsed_seconds": started.elapsed().as_secs_f64(),
        "lost": a.lost(&published).len(),
        "duplicates": a.duplicate_dispatches(),
        "forgotten_jobs": judged.unrecorded.len(),
        "forgotten_units": forgotten_units,
        "windows_exceeded": judged.exceeded.len(),
        "estimated_windows_exceeded": estimated.len(),
        "estimated_most_units_over": (most_over * 1000.0).round() / 1000.0,
        "fullest_windows": judged.fullest.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
        "worker_panics": worker_panics(&dir).len(),
    });
    eprintln!(
        "limits, sentinel failover, wait_replicas = {}: {figures}",
        s.redis.wait_replicas
    );
    assert!(worker_panics(&dir).is_empty(), "{:?}", worker_panics(&dir));
    assert!(settled, "the run did not settle: {}", a.summary(&published));
    for st in statuses {
        assert!(st.is_some_and(|x| x.success()), "worker exit {st:?}");
    }
    assert!(a.lost(&published).is_empty(), "{}", a.summary(&published));
    assert!(a.in_two_places().is_empty(), "{}", a.summary(&published));
    assert!(a.dead.is_empty(), "dead letters: {:?}", a.dead);
    assert!(a.strangers.is_empty(), "{:?}", a.strangers);
    assert!(resumed.is_some(), "dispatch never resumed");
    if wait {
        assert_eq!(a.duplicate_dispatches(), 0, "{}", a.summary(&published));
        assert!(
            judged.unrecorded.is_empty(),
            "forgotten: {:?}",
            judged.unrecorded
        );
        assert!(
            judged.exceeded.is_empty(),
            "windows exceeded: {:#?}",
            judged.exceeded
        );
    }
    figures
}

/// The dispatched jobs with the forgotten ones placed in time: each at the
/// admission of the last recorded job dispatched before it (the dispatch queue
/// holds the dispatches in the order they were published, close to the order of
/// their admissions). An estimate: what a forgotten take let through again.
fn with_forgotten(
    a: &Audit,
    sent: &[Sent],
    forgotten: &[String],
    by_id: &BTreeMap<String, Sent>,
) -> Vec<Sent> {
    let at: BTreeMap<&str, i64> = sent.iter().map(|x| (x.id.as_str(), x.at_ms)).collect();
    let mut order: Vec<(usize, &str)> = a
        .dispatched
        .iter()
        .map(|(id, positions)| (positions[0], id.as_str()))
        .collect();
    order.sort();
    let first = sent.iter().map(|x| x.at_ms).min().unwrap_or(0);
    let mut last = first;
    let mut out = sent.to_vec();
    for (_, id) in order {
        match at.get(id) {
            Some(t) => last = *t,
            None if forgotten.iter().any(|f| f == id) => out.push(Sent {
                at_ms: last,
                ..by_id[id].clone()
            }),
            None => {}
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_during_stacked_limits_exceeds_no_window_with_wait() {
    let _heavy = heavy().await;
    let without = failover(false).await;
    let with = failover(true).await;
    let sum = |key: &str| without[key].as_u64().unwrap_or(0) + with[key].as_u64().unwrap_or(0);
    testkit::reliability::record(json!({
        "scenario": "limits_sentinel",
        "test": "tests/faults/limits_sentinel.rs: sentinel_failover_during_stacked_limits_exceeds_no_window_with_wait",
        "fault": format!(
            "stacked limits (per second and per 5 s on one account, per sender) on two workers; the replicas kept from resyncing for {} ms, then SIGKILL of the master; Sentinel promotes a replica",
            BEHIND.as_millis()
        ),
        "jobs": sum("jobs"),
        "faults": 2,
        "lost": sum("lost"),
        "duplicates": sum("duplicates"),
        "violations": format!(
            "{} jobs ({} units) of takes forgotten without WAIT (by estimate {} windows exceeded, by up to {} units), {} with; windows exceeded with WAIT: {}",
            without["forgotten_jobs"],
            without["forgotten_units"],
            without["estimated_windows_exceeded"],
            without["estimated_most_units_over"],
            with["forgotten_jobs"],
            with["windows_exceeded"]
        ),
        "recovery_seconds": [without["recovery_seconds"].clone(), with["recovery_seconds"].clone()],
        "runs": [without, with],
    }));
}
