//! Fault scenario: RabbitMQ's memory alarm under load (flow control: the broker
//! blocks every publishing connection with `connection.blocked` until the alarm
//! clears), for 10 s and for 25 s with a publish timeout of 5 s (20 s and 2 minutes
//! with the default 10 s in the long form), on a private node.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::depth;
use testkit::procs::RabbitNode;
use testkit::reliability::long;
use testkit::*;

/// Raise the node's memory alarm (a high watermark of 0 trips it at once) or
/// clear it (back to the default 0.4).
fn alarm(node: &RabbitNode, on: bool) {
    let watermark = if on { "0" } else { "0.4" };
    let out = node.ctl(&["set_vm_memory_high_watermark", watermark]);
    assert!(out.status.success(), "rabbitmqctl: {out:?}");
}

/// Whether the node says a memory alarm is in force.
fn alarmed(node: &RabbitNode) -> bool {
    let out = node.ctl(&["eval", "rabbit_alarm:get_alarms()."]);
    String::from_utf8_lossy(&out.stdout).contains("memory")
}

/// Whether the broker says it blocked a connection (one that published while the
/// alarm was in force; a connection that did not publish is only `blocking`). The
/// test's own connection publishes nothing, so a blocked one is the worker's.
fn blocked_a_connection(node: &RabbitNode) -> bool {
    let out = node.ctl(&["list_connections", "state", "--silent"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == "blocked")
}

/// When the worker logged that the broker blocked its connection (the
/// timestamps of those lines of its JSON log).
fn blocks_logged(log: &str) -> Vec<chrono::DateTime<chrono::Utc>> {
    log.lines()
        .filter(|l| l.contains("the broker blocked the connection"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["timestamp"].as_str()?.parse().ok())
        .collect()
}

/// Clears the alarm when dropped, also when the test panics.
struct Clear<'a>(&'a RabbitNode);

impl Drop for Clear<'_> {
    fn drop(&mut self) {
        alarm(self.0, false);
    }
}

/// A worker draining a mix at 300 dispatches/s (slower where `rabbitmqctl` is slow,
/// so that the alarms come while it has work); the memory alarm raised for twice
/// the publish timeout once 600 went out, and for five times it (twelve in the long
/// form) once half of them did. Every job must be
/// found exactly once: no dispatch handed back while its confirm was only held by
/// the alarm (the worker waits for it while the connection lives), nothing lost.
/// Whether an alarm blocked the worker is the broker's word (the connection's
/// state before the alarm clears), not a guess from how much work was left when
/// `rabbitmqctl` got round to raising it: each alarm that blocked the worker is
/// logged by it once, and none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_alarm_of_any_length_costs_no_duplicate() {
    let _heavy = heavy().await;
    let Some(guard) = private_node_or_skip("memory_alarm").await else {
        return;
    };
    let node = &guard.0;
    // twice and then several times the publish timeout: the quick form's is 5 s
    // (alarms of 10 and 25 s), the long form's the default 10 s (20 s and 2 minutes)
    let ns = unique("memalarm");
    let n = if long() { 20_000 } else { 6_000 };
    // an alarm is raised by a `rabbitmqctl` call, which a loaded machine makes
    // slow: the channel is paced so that the work left when the second alarm is
    // raised (about 38 % of the jobs) lasts three such calls as timed now, at
    // 300 dispatches/s at most (a machine quick enough keeps that rate)
    let asked = Instant::now();
    let _ = alarmed(node);
    let ctl = asked.elapsed().as_secs_f64().max(0.1);
    let rate = ((n as f64 * 0.38) / (3.0 * ctl)).clamp(20.0, 300.0) as u64;
    let mut s = node_settings(node, &ns, rate);
    if !long() {
        s.amqp.publish_timeout = quota_worker::config::Dur(Duration::from_secs(5));
    }
    let timeout = s.amqp.publish_timeout.0;
    let alarms = [timeout * 2, timeout * if long() { 12 } else { 5 }];
    let _g = RedisGuard(ns.clone());
    let Loaded {
        conn,
        mix,
        dispatch,
        dir,
        started: _,
        mut w,
    } = start_on_node(node, &s, &ns, n, "memalarm").await;
    let mut runs = Vec::new();
    for (i, length) in alarms.iter().enumerate() {
        let before = if i == 0 { 600 } else { n / 2 } as u32;
        let mut progress = Progress::new(Duration::from_secs(60));
        loop {
            let out = depth(&conn, &dispatch).await.unwrap_or(0);
            if out >= before {
                break;
            }
            progress.see(u64::from(out), u64::MAX);
            assert!(!progress.stalled(), "no progress:\n{}", w.tail(30));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let raised_at = chrono::Utc::now();
        alarm(node, true);
        let clear = Clear(node);
        let raised = Instant::now();
        assert!(alarmed(node), "the memory alarm did not go off");
        // (a machine loaded enough may let the worker dispatch everything it can
        // before the alarm goes off: then it has nothing to publish, the broker
        // blocks nothing, and the run says so)
        let out = depth(&conn, &dispatch).await.unwrap_or(0) as usize;
        let work_left = out + 100 < mix.expected_dispatched();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let at_start = depth(&conn, &dispatch).await.unwrap_or(0);
        tokio::time::sleep(length.saturating_sub(raised.elapsed())).await;
        let at_end = depth(&conn, &dispatch).await.unwrap_or(0);
        let blocked = blocked_a_connection(node);
        drop(clear);
        let cleared = Instant::now();
        // resumed: 20 more dispatched, or all there are when fewer were left (at
        // once when none was: the block held something else than a dispatch)
        let again = (at_end as usize + 20).min(mix.expected_dispatched()) as u32;
        let mut resumed = None;
        while cleared.elapsed() < Duration::from_secs(60) {
            if depth(&conn, &dispatch).await.unwrap_or(0) >= again {
                resumed = Some(cleared.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(w.running(), "the worker exited:\n{}", w.tail(30));
        runs.push(json!({
            "alarm_seconds": length.as_secs(),
            "dispatched_before": before,
            "dispatched_during_alarm": at_end as i64 - at_start as i64,
            "recovery_seconds": resumed.map(|d| d.as_secs_f64()),
            "work_left": work_left,
            "blocked": blocked,
            "raised_at": raised_at.to_rfc3339(),
        }));
    }
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    let blocks = blocks_logged(&log);
    let blocked_seen = blocks.len();
    // the blocks logged from each alarm's raising to the next one's
    let raised: Vec<chrono::DateTime<chrono::Utc>> = runs
        .iter()
        .filter_map(|r| r["raised_at"].as_str()?.parse().ok())
        .collect();
    for (i, r) in runs.iter_mut().enumerate() {
        let from = raised[i];
        let to = raised.get(i + 1).copied();
        let logged = blocks
            .iter()
            .filter(|t| **t >= from && to.is_none_or(|to| **t < to))
            .count();
        r["blocks_logged"] = logged.into();
    }
    let unconfirmed = log.matches("dispatch unconfirmed").count();
    let end = finish(
        &conn,
        &s,
        &mix,
        Duration::from_secs(if long() { 600 } else { 240 }),
        async { w.stop() },
    )
    .await;
    let a = &end.audit;
    conclude(
        &dir,
        json!({
            "scenario": "memory_alarm",
            "test": "tests/faults/memory_alarm.rs: a_memory_alarm_of_any_length_costs_no_duplicate",
            "jobs": n,
            "faults": alarms.len(),
            "fault": format!("RabbitMQ's memory alarm (set_vm_memory_high_watermark 0, then 0.4) for {} s, then for {} s, at {rate} dispatches/s, publish timeout {} s", alarms[0].as_secs(), alarms[1].as_secs(), timeout.as_secs()),
            "rate_per_second": rate,
            "rabbitmqctl_seconds": ctl,
            "duplicates": a.duplicate_dispatches(),
            "duplicate_waiting_copies": a.duplicate_waiting(),
            "duplicate_dead_letters": a.duplicate_dead(),
            "violations": end.violations.len(),
            "recovery_seconds": runs.iter().filter_map(|r| r["recovery_seconds"].as_f64()).fold(0.0, f64::max),
            "blocked_logged": blocked_seen,
            "unconfirmed_handed_back": unconfirmed,
            "publish_timeout_seconds": s.amqp.publish_timeout.0.as_secs(),
            "runs": runs,
        }),
        end.settled,
        &end.lost,
        &a.summary(&mix.jobs),
    );
    let _ = conn.close(200, "".into()).await;
    assert_eq!(
        a.duplicate_dispatches(),
        0,
        "duplicates: {:?}",
        a.duplicated_ids()
    );
    end.assert_clean();
    // the broker blocked the worker in at least one alarm; the worker logged each
    // block once (a publish in the moment between the broker's word and the
    // alarm's end may add a block it did not report, logged all the same)
    let blocking = runs.iter().filter(|r| r["blocked"] == true).count();
    assert!(blocking >= 1, "no alarm blocked the worker: {runs:?}");
    assert_eq!(raised.len(), runs.len(), "every alarm's time: {runs:?}");
    assert!(
        blocked_seen <= runs.len(),
        "the worker logged {blocked_seen} blocks in {} alarms",
        runs.len()
    );
    for r in &runs {
        let logged = r["blocks_logged"].as_u64().unwrap();
        assert!(logged <= 1, "a block logged {logged} times: {r}");
        assert!(
            logged == 1 || r["blocked"] == false,
            "the worker did not log a block: {r}"
        );
        assert!(
            r["dispatched_during_alarm"].as_i64().unwrap() <= 0,
            "dispatched during an alarm: {r}"
        );
        assert!(
            r["recovery_seconds"].is_number() || r["blocked"] == false,
            "dispatching never resumed: {r}"
        );
    }
}
