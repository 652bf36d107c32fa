//! Fault scenario: kill -9 of the worker at random moments.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::{depth, noon_zone, publish_all, Rng};
use testkit::procs::WorkerProc;
use testkit::reliability::long;
use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_nothing_and_breaks_no_cap() {
    let _heavy = heavy().await;
    let (n, kills, rate) = if long() {
        (20_000, 20, 600)
    } else {
        (2_000, 5, 250)
    };
    let ns = unique("kill");
    let s = fault_settings(&ns, rate);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("kill");
    declare(&s).await;
    let mix = Mix::new(&ns, n, &noon_zone());
    let conn = amqp().await;
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let mut rng = Rng::from_env();
    let started = Instant::now();

    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    let mut recovery = Vec::new();
    recovery.push(
        wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(30))
            .await
            .expect("worker consumes"),
    );
    let mut kill_depths = Vec::new();
    for k in 0..kills {
        let pause = if long() {
            rng.range(500, 2500)
        } else {
            rng.range(300, 1500)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        w.kill9();
        wait_consumers(&conn, &s.amqp.jobs_queue, 0, Duration::from_secs(10)).await;
        kill_depths.push(depth(&conn, &dispatch).await.unwrap_or(0) as usize);
        w = WorkerProc::spawn(crate::BIN, &s, &dir, &(k + 1).to_string());
        recovery.push(
            wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(30))
                .await
                .unwrap_or_else(|| panic!("restarted worker never consumed:\n{}", w.tail(30))),
        );
    }
    let kills_done_at = started.elapsed();
    let end = finish(
        &conn,
        &s,
        &mix,
        Duration::from_secs(if long() { 900 } else { 180 }),
        async { w.stop() },
    )
    .await;
    let elapsed = end.quiet_at - started;
    let status = end.stopped;
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "worker exit {status:?}:\n{}",
        w.tail(30)
    );
    let a = &end.audit;
    let (explained, farthest, unexplained) =
        explain_duplicates(a, &kill_depths, s.amqp.prefetch as usize);
    let max_recovery = recovery.iter().max().unwrap().as_secs_f64();
    conclude(
        &dir,
        json!({
            "scenario": "kill9",
            "test": "tests/faults/kill_9.rs: kill_9_at_random_moments_loses_nothing_and_breaks_no_cap",
            "jobs": n,
            "faults": kills,
            "fault": "kill -9 of the worker process, restarted at once",
            "duplicates": a.duplicate_dispatches(),
            "duplicates_explained": explained,
            "duplicate_farthest_before_kill": farthest,
            "duplicate_waiting_copies": a.duplicate_waiting(),
            "duplicate_dead_letters": a.duplicate_dead(),
            "violations": end.broken().len(),
            "uncommitted_after_kills": end.uncommitted.len(),
            "recovery_seconds": max_recovery,
            "dispatched": a.dispatched.len(),
            "waiting": a.waiting.len(),
            "dead": a.dead.len(),
            "elapsed_seconds": elapsed.as_secs_f64(),
            "kills_over_seconds": kills_done_at.as_secs_f64(),
            "rate_per_second": rate,
        }),
        end.settled,
        &end.lost,
        &a.summary(&mix.jobs),
    );
    end.assert_sound_after_kills(&mix, kills, &unexplained);
}
