//! What the Redis failover scenarios (`redis_sentinel`, `redis_cluster_failover`)
//! share: cutting and restoring replication, the figures and checks of a run, and
//! the two runs (without and with `redis.wait_replicas = 1`) recorded as one row.

use std::time::{Duration, Instant};

use quota_worker::config::Settings;
use testkit::audit::depth;
use testkit::procs::{self, WorkerProc};
use testkit::*;

use super::*;

/// Keep replicas from resyncing with their master: each asks the master for a
/// password the master does not have, so every reconnection attempt fails. With
/// [`procs::RedisServer::kill9`] of the master a moment later this is the window a
/// failover forgets: writes the master acknowledged that no replica has. (On
/// loopback a replica otherwise trails its master by well under a millisecond,
/// too little to measure what the window costs.)
pub(crate) fn cut_replication(master: &procs::RedisServer, replicas: &[procs::RedisServer]) {
    for replica in replicas {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("masterauth")
            .arg("not-the-password")
            .query(&mut replica.connection())
            .expect("CONFIG SET masterauth");
    }
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut master.connection())
        .expect("CLIENT KILL TYPE replica");
}

/// Undo [`cut_replication`] on the replicas.
pub(crate) fn restore_replication(replicas: &[procs::RedisServer]) {
    for replica in replicas {
        let _: redis::RedisResult<()> = redis::cmd("CONFIG")
            .arg("SET")
            .arg("masterauth")
            .arg("")
            .query(&mut replica.connection());
    }
}

/// `master_repl_offset` of a node's `INFO replication` (bytes of its replication
/// stream so far).
pub(crate) fn repl_offset(info: &str) -> Option<i64> {
    info.lines()
        .find_map(|l| l.strip_prefix("master_repl_offset:"))
        .and_then(|v| v.trim().parse().ok())
}

/// The violations of a failover run, by kind: dispatched jobs whose send the new
/// master does not know (forgotten), recipients over a cap, sends recorded only as
/// reserved (their commit was forgotten: still counted for the caps).
pub(crate) fn failover_violations(violations: &[String]) -> serde_json::Value {
    let forgotten = violations
        .iter()
        .filter(|v| v.ends_with("dispatched without a recorded send"))
        .count();
    let uncommitted = violations
        .iter()
        .filter(|v| v.ends_with(UNCOMMITTED))
        .count();
    let over_cap = violations.len() - forgotten - uncommitted;
    serde_json::json!({
        "forgotten_sends": forgotten,
        "over_cap": over_cap,
        "uncommitted": uncommitted,
    })
}

/// The worker's warnings and errors in `log` (JSON lines), by message, most
/// frequent first: what a run that did not settle kept running into.
pub(crate) fn log_warnings(log: &str) -> Vec<(usize, String)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let level = v["level"].as_str().unwrap_or_default();
        if level != "WARN" && level != "ERROR" {
            continue;
        }
        let fields = &v["fields"];
        let message = fields["message"].as_str().unwrap_or_default();
        let error = fields["error"].as_str().unwrap_or_default();
        let error: String = error.chars().take(160).collect();
        *counts
            .entry(format!("{level} {message}: {error}"))
            .or_default() += 1;
    }
    let mut out: Vec<(usize, String)> = counts.into_iter().map(|(m, n)| (n, m)).collect();
    out.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    out
}

/// What a Redis failover scenario measured around the kill of the master.
pub(crate) struct Failover {
    pub(crate) jobs: usize,
    /// How far the replica that took over was behind at the kill.
    pub(crate) replica_behind_bytes: Option<i64>,
    /// From the kill to a replica serving as master.
    pub(crate) promoted: Duration,
    /// From the kill to the next dispatch.
    pub(crate) resumed: Option<Duration>,
    pub(crate) started: Instant,
}

/// The end of a Redis failover scenario: its figures (`extra`'s fields first) and
/// the checks every such scenario makes: the worker exited cleanly and never
/// panicked, the run settled, no job was lost, in two places or dead-lettered for
/// a wrong reason, and dispatch resumed after the kill.
#[allow(clippy::too_many_arguments)]
pub(crate) fn conclude_failover(
    what: &str,
    s: &Settings,
    end: &Ending<Option<std::process::ExitStatus>>,
    mix: &Mix,
    w: &WorkerProc,
    dir: &std::path::Path,
    run: Failover,
    extra: serde_json::Value,
) -> serde_json::Value {
    let a = &end.audit;
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    if !end.settled {
        explain_stuck(a, mix, w);
        for (count, message) in log_warnings(&log).into_iter().take(15) {
            eprintln!(
                "{what}, wait_replicas = {}: {count} x {message}",
                s.redis.wait_replicas
            );
        }
    }
    for v in end.violations.iter().take(20) {
        eprintln!("{what}, wait_replicas = {}: {v}", s.redis.wait_replicas);
    }
    let mut figures = extra;
    figures["wait_replicas"] = s.redis.wait_replicas.into();
    figures["jobs"] = run.jobs.into();
    figures["replica_behind_bytes"] = run.replica_behind_bytes.into();
    figures["promoted_seconds"] = run.promoted.as_secs_f64().into();
    figures["recovery_seconds"] = run.resumed.map(|d| d.as_secs_f64()).into();
    figures["unreplicated_holds"] = log.matches("replicas in time").count().into();
    figures["lost"] = end.lost.len().into();
    figures["duplicates"] = a.duplicate_dispatches().into();
    figures["violations"] = failover_violations(&end.violations);
    figures["elapsed_seconds"] = (end.quiet_at - run.started).as_secs_f64().into();
    figures["worker_panics"] = worker_panics(dir).len().into();
    eprintln!(
        "{what}, wait_replicas = {}: {figures}",
        s.redis.wait_replicas
    );
    assert!(
        end.stopped.map(|st| st.success()).unwrap_or(false),
        "worker exit:\n{}",
        w.tail(30)
    );
    assert!(worker_panics(dir).is_empty(), "{:?}", worker_panics(dir));
    assert!(
        end.settled,
        "the run did not settle: {}",
        a.summary(&mix.jobs)
    );
    assert!(end.lost.is_empty(), "lost: {:?}", end.lost);
    assert!(end.twice.is_empty(), "in two places: {:?}", end.twice);
    assert!(
        end.wrong_dead.is_empty(),
        "dead letters: {:?}",
        end.wrong_dead
    );
    assert!(
        run.resumed.is_some(),
        "dispatch never resumed:\n{}",
        w.tail(40)
    );
    figures
}
/// A failover scenario's two runs, without and with `redis.wait_replicas = 1`,
/// recorded as one row (`scenario`, `test`, `fault`), and its claim checked: with
/// the admissions waiting for a replica, no dispatched job's send is forgotten and
/// no cap is exceeded.
pub(crate) fn record_failover_pair(
    scenario: &str,
    test: &str,
    fault: String,
    without: &serde_json::Value,
    with: &serde_json::Value,
) {
    let sum = |key: &str| without[key].as_u64().unwrap_or(0) + with[key].as_u64().unwrap_or(0);
    let bad = |v: &serde_json::Value| {
        v["violations"]["forgotten_sends"].as_u64().unwrap_or(0)
            + v["violations"]["over_cap"].as_u64().unwrap_or(0)
    };
    testkit::reliability::record(serde_json::json!({
        "scenario": scenario,
        "test": test,
        "jobs": sum("jobs"),
        "faults": 2,
        "fault": fault,
        "lost": sum("lost"),
        "duplicates": sum("duplicates"),
        "violations": format!("{} without WAIT, {} with", bad(without), bad(with)),
        "recovery_seconds": [without["recovery_seconds"].clone(), with["recovery_seconds"].clone()],
        "runs": [without.clone(), with.clone()],
    }));
    assert_eq!(bad(with), 0, "with wait_replicas = 1: {with}");
}

/// After the master's kill at `killed` (with `at_kill` dispatched then): how long
/// until `promoted` says a replica serves as master, and until the next dispatch
/// (each `None` if not within a minute).
pub(crate) async fn watch_failover(
    conn: &lapin::Connection,
    dispatch: &str,
    killed: Instant,
    at_kill: u32,
    mut promoted: impl FnMut() -> bool,
) -> (Option<Duration>, Option<Duration>) {
    let (mut promoted_at, mut resumed) = (None, None);
    while killed.elapsed() < Duration::from_secs(60) && (promoted_at.is_none() || resumed.is_none())
    {
        if promoted_at.is_none() && promoted() {
            promoted_at = Some(killed.elapsed());
        }
        if resumed.is_none() && depth(conn, dispatch).await.unwrap_or(0) > at_kill {
            resumed = Some(killed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    (promoted_at, resumed)
}

/// Declare `s`'s topology, publish a mix of `n` jobs, start a worker process (its
/// log under a temp dir named `tag`) and wait until a fifth of them went out.
pub(crate) async fn load_and_start(s: &Settings, ns: &str, n: usize, tag: &str) -> Loaded {
    let loaded = publish_and_start(amqp().await, s, ns, n, tag).await;
    loaded
        .until_dispatched((n / 5) as u32, Duration::from_secs(120))
        .await;
    loaded
}
