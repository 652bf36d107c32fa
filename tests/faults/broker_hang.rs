//! Fault scenario: a broker that hangs.

use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::Dur;
use serde_json::json;
use testkit::audit::depth;
use testkit::procs::WorkerProc;
use testkit::reliability::long;
use testkit::*;

/// A broker that hangs instead of going away (SIGSTOP of the node: connections stay
/// open, nothing answers, as in a network partition). The worker waits for the
/// confirms while the connection lives and holds further dispatches once none has
/// come for 300 ms; when the broker wakes up it goes on by itself on the same
/// connection, no job sent twice. Then SIGTERM while the broker hangs, once with a
/// session running and once while connecting: the worker exits 0 within its grace
/// period all the same. A fresh worker finishes the run; nothing is lost. The
/// dispatches sent before the second hang was noticed, unconfirmed at the SIGTERM,
/// are dispatched again (the named window: sent, not recorded); counted. "Within
/// its grace period" is measured on the machine as it is at that moment: the worker
/// signalled while connecting has nothing to finish, so the time it takes to exit
/// is what delivering a signal and ending a process cost then, and the running
/// worker gets its grace, half a second to close, and that much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_hang_every_wait_has_a_deadline_and_nothing_is_lost() {
    let _heavy = heavy().await;
    let Some(guard) = private_node_or_skip("broker_hang").await else {
        return;
    };
    let node = &guard.0;
    let hang = Duration::from_secs(if long() { 30 } else { 12 });
    let grace = 5;
    let n = 2_000;
    let ns = unique("brokerhang");
    let mut s = node_settings(node, &ns, 200);
    s.worker.shutdown_grace = Dur(Duration::from_secs(grace));
    let _g = RedisGuard(ns.clone());
    let run = start_on_node(node, &s, &ns, n, "brokerhang").await;
    run.until_dispatched(300, Duration::from_secs(60)).await;
    let Loaded {
        conn,
        mix,
        dispatch,
        dir,
        mut w,
        ..
    } = run;
    let _ = conn.close(200, "".into()).await;

    // 1. the broker hangs, then wakes up
    node.freeze();
    let thaw = Thaw(node);
    tokio::time::sleep(hang).await;
    drop(thaw);
    let woke = Instant::now();
    let conn = connect_node(&node.url()).await;
    // sends confirmed late land at once; then paced dispatching must go on
    tokio::time::sleep(Duration::from_secs(1)).await;
    let landed = depth(&conn, &dispatch).await.unwrap_or(0);
    let mut resumed = None;
    while woke.elapsed() < Duration::from_secs(60) {
        if depth(&conn, &dispatch).await.unwrap_or(0) > landed + 20 {
            resumed = Some(woke.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(w.running(), "the worker exited:\n{}", w.tail(30));
    let _ = conn.close(200, "".into()).await;

    // 2. SIGTERM while the broker hangs: a running session, and one connecting
    node.freeze();
    let thaw = Thaw(node);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut connecting = WorkerProc::spawn(crate::BIN, &s, &dir, "connecting");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let termed = Instant::now();
    w.term();
    connecting.term();
    let status_connecting = connecting.wait(Duration::from_secs(60));
    let exit_connecting = termed.elapsed();
    let status = w.wait(Duration::from_secs(grace + 120));
    let exit_running = termed.elapsed();
    drop(thaw);

    // 3. a fresh worker finishes the run
    let conn = connect_node(&node.url()).await;
    let mut f = WorkerProc::spawn(crate::BIN, &s, &dir, "finish");
    let end = finish(
        &conn,
        &s,
        &mix,
        Duration::from_secs(if long() { 600 } else { 180 }),
        async { f.stop() },
    )
    .await;
    let (a, finish_status) = (&end.audit, end.stopped);
    conclude(
        &dir,
        json!({
            "scenario": "broker_hang",
            "test": "tests/faults/broker_hang.rs: broker_hang_every_wait_has_a_deadline_and_nothing_is_lost",
            "jobs": n,
            "faults": 2,
            "fault": format!("RabbitMQ node frozen (SIGSTOP) for {} s, then frozen again for a SIGTERM", hang.as_secs()),
            "hang_seconds": hang.as_secs(),
            "publish_timeout_seconds": s.amqp.publish_timeout.0.as_secs(),
            "prefetch": s.amqp.prefetch,
            "duplicates": a.duplicate_dispatches(),
            "duplicate_waiting_copies": a.duplicate_waiting(),
            "duplicate_dead_letters": a.duplicate_dead(),
            "violations": end.violations.len(),
            "recovery_seconds": resumed.map(|d| d.as_secs_f64()),
            "grace_seconds": grace,
            "sigterm_exit_seconds_running": exit_running.as_secs_f64(),
            "sigterm_exit_seconds_connecting": exit_connecting.as_secs_f64(),
            "sigterm_exit_codes": [status.and_then(|s| s.code()), status_connecting.and_then(|s| s.code())],
        }),
        end.settled,
        &end.lost,
        &a.summary(&mix.jobs),
    );
    let _ = conn.close(200, "".into()).await;
    assert!(
        resumed.is_some_and(|d| d < Duration::from_secs(10)),
        "dispatching resumed {resumed:?} after the broker woke up"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", w.tail(30));
    assert_eq!(
        status_connecting.and_then(|s| s.code()),
        Some(0),
        "{}",
        connecting.tail(30)
    );
    assert!(
        exit_running < Duration::from_millis(grace * 1000 + 500) + exit_connecting,
        "exit took {exit_running:?} (a worker with nothing to finish {exit_connecting:?})"
    );
    assert!(
        exit_connecting < Duration::from_millis(grace * 1000 + 500),
        "exit took {exit_connecting:?}"
    );
    assert!(finish_status.map(|s| s.success()).unwrap_or(false));
    end.assert_clean();
}
