//! Fault scenario: SIGTERM under load.

use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::Dur;
use serde_json::json;
use testkit::audit::{depth, noon_zone, publish_all};
use testkit::procs::WorkerProc;
use testkit::reliability::record;
use testkit::*;

/// SIGTERM with a backlog: the worker stops consuming, finishes what it holds (or,
/// when the grace period is shorter than that, hands it back) and exits 0 within
/// the grace period; a fresh worker then finishes the run and nothing is lost.
/// "Within the grace period" allows, besides 1.5 s to close, what stopping that
/// fresh worker with nothing left to do took: the machine's own cost of a signal
/// and an exit at the time, so a loaded machine does not fail the check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_zero_within_the_grace_period_and_loses_nothing() {
    let _heavy = heavy().await;
    let mut figures = Vec::new();
    // (rate per second, grace): the first drains its in-flight jobs in time
    // (256 at 200/s), the second cannot (256 at 20/s in 3 s) and hands them back
    for (rate, grace) in [(200u64, 10u64), (20, 3)] {
        let n = 1_500;
        let ns = unique("sigterm");
        let mut s = fault_settings(&ns, rate);
        s.worker.shutdown_grace = Dur(Duration::from_secs(grace));
        let _c = Cleanup::new(&s);
        let dir = testkit::temp_dir("sigterm");
        declare(&s).await;
        let mix = Mix::new(&ns, n, &noon_zone());
        let conn = amqp().await;
        publish_all(&conn, &s, &mix.jobs).await;
        let dispatch = topology(&s).dispatch_queue("sms");
        let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
        let started = Instant::now();
        while depth(&conn, &dispatch).await.unwrap_or(0) < 40 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no progress:\n{}",
                w.tail(20)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let termed = Instant::now();
        w.term();
        let status = w.wait(Duration::from_secs(grace + 30));
        let took = termed.elapsed();
        let in_queue = depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(0);
        // a fresh, unpaced worker finishes the run
        let mut unpaced = s.clone();
        unpaced.channels.get_mut("sms").unwrap().rate = Some(1_000);
        let fdir = testkit::temp_dir("sigterm-finish");
        let mut f = WorkerProc::spawn(crate::BIN, &unpaced, &fdir, "finish");
        let end = finish(
            &conn,
            &s,
            &mix,
            Duration::from_secs(120),
            timed_stop(&mut f),
        )
        .await;
        let (finished, idle_stop) = end.stopped;
        assert!(finished.map(|s| s.success()).unwrap_or(false));
        let a = &end.audit;
        eprintln!(
            "rate {rate}/s, grace {grace}s: exit {status:?} after {took:?} \
             (a worker with nothing to do: {idle_stop:?})"
        );
        let mut panics = worker_panics(&dir);
        panics.extend(worker_panics(&fdir));
        assert!(panics.is_empty(), "worker panics: {panics:#?}");
        figures.push(json!({
            "rate_per_second": rate,
            "grace_seconds": grace,
            "exit_code": status.and_then(|s| s.code()),
            "exit_seconds": took.as_secs_f64(),
            "idle_exit_seconds": idle_stop.as_secs_f64(),
            "jobs_queue_after_exit": in_queue,
            "lost": end.lost.len(),
            "duplicates": a.duplicate_dispatches(),
            "violations": end.violations.len(),
        }));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "exit status:\n{}",
            w.tail(20)
        );
        assert!(
            took < Duration::from_secs(grace) + Duration::from_millis(1500) + idle_stop,
            "took {took:?} for a grace of {grace}s (a worker with nothing to do {idle_stop:?})"
        );
        assert!(end.settled, "did not settle: {}", a.summary(&mix.jobs));
        assert!(end.lost.is_empty(), "lost: {:?}", end.lost);
        assert!(end.violations.is_empty(), "{:#?}", end.violations);
        assert_eq!(a.duplicate_dispatches(), 0);
    }
    let worst = figures
        .iter()
        .map(|f| f["exit_seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);
    record(json!({
        "scenario": "sigterm",
        "test": "tests/faults/sigterm.rs: sigterm_under_load_exits_zero_within_the_grace_period_and_loses_nothing",
        "jobs": 1_500 * figures.len(),
        "faults": figures.len(),
        "fault": "SIGTERM with a paced backlog (grace long enough to drain; grace too short)",
        "lost": figures.iter().map(|f| f["lost"].as_u64().unwrap()).sum::<u64>(),
        "duplicates": figures.iter().map(|f| f["duplicates"].as_u64().unwrap()).sum::<u64>(),
        "violations": figures.iter().map(|f| f["violations"].as_u64().unwrap()).sum::<u64>(),
        "recovery_seconds": worst,
        "runs": figures,
    }));
}

/// Stop `w` (SIGTERM, then wait): its exit status and how long that took.
async fn timed_stop(w: &mut WorkerProc) -> (Option<std::process::ExitStatus>, Duration) {
    let t = Instant::now();
    let status = w.stop();
    (status, t.elapsed())
}

/// The Helm chart's stop: `(terminationGracePeriodSeconds, preStopSleepSeconds,
/// config.worker.shutdown_grace)` of its values.
fn chart_stop() -> (u64, u64, Duration) {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/helm/quota-worker/values.yaml"
    );
    let values: serde_norway::Value =
        serde_norway::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let grace = values["config"]["worker"]["shutdown_grace"]
        .as_str()
        .unwrap();
    (
        values["terminationGracePeriodSeconds"].as_u64().unwrap(),
        values["preStopSleepSeconds"].as_u64().unwrap(),
        serde_json::from_value::<Dur>(json!(grace)).unwrap().0,
    )
}

/// SIGTERM as the Helm chart's pods get it: the worker's default shutdown grace (the
/// chart's `config.worker.shutdown_grace`), a paced channel whose lanes hold a backlog,
/// capped jobs waiting in the delay ladder. The worker cancels its consumers at once
/// (the jobs queue and every lane show no consumer within a second), settles or hands
/// back what it holds and exits 0 within the grace, which fits in the chart's
/// `terminationGracePeriodSeconds` after its preStop hook; a fresh worker then
/// finishes the run, nothing lost and nothing sent twice. The second and the 1.5 s
/// to close allowed besides are lengthened by what stopping that fresh worker with
/// nothing left to do took (the machine's own cost of a signal and an exit then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_the_charts_grace_stops_consuming_at_once_and_loses_nothing() {
    let _heavy = heavy().await;
    let (pod_grace, pre_stop, grace) = chart_stop();
    assert_eq!(
        grace,
        quota_worker::config::Settings::defaults()
            .worker
            .shutdown_grace
            .0,
        "the chart keeps the worker's default shutdown grace"
    );
    let n = 3_000;
    let ns = unique("sigterm-chart");
    let mut s = fault_settings(&ns, 200);
    s.worker.shutdown_grace = Dur(grace);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("sigterm-chart");
    declare(&s).await;
    let mix = Mix::new(&ns, n, &noon_zone());
    let conn = amqp().await;
    publish_all(&conn, &s, &mix.jobs).await;
    let topology = topology(&s);
    let dispatch = topology.dispatch_queue("sms");
    let lanes: Vec<String> = topology.lane_queues().map(|(q, _, _)| q).collect();
    assert_eq!(lanes.len(), 3, "{lanes:?}");
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    // under load: dispatching at the rate, the lanes holding a backlog
    let started = Instant::now();
    loop {
        let mut parked = 0;
        for q in &lanes {
            parked += depth(&conn, q).await.unwrap_or(0);
        }
        if depth(&conn, &dispatch).await.unwrap_or(0) >= 100 && parked > 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no load:\n{}",
            w.tail(20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let termed = Instant::now();
    w.term();
    // it stops taking deliveries: every queue it consumes loses its consumer
    let mut watched = lanes.clone();
    watched.push(s.amqp.jobs_queue.clone());
    let stopped_consuming = loop {
        let mut consumers = 0;
        for q in &watched {
            consumers += inspect(&conn, q)
                .await
                .map(|q| q.consumer_count())
                .unwrap_or(0);
        }
        if consumers == 0 {
            break termed.elapsed();
        }
        assert!(
            termed.elapsed() < grace,
            "still consuming after {:?}:\n{}",
            termed.elapsed(),
            w.tail(20)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let status = w.wait(grace + Duration::from_secs(30));
    let took = termed.elapsed();
    let mut unpaced = s.clone();
    unpaced.channels.get_mut("sms").unwrap().rate = Some(1_000);
    let fdir = testkit::temp_dir("sigterm-chart-finish");
    let mut f = WorkerProc::spawn(crate::BIN, &unpaced, &fdir, "finish");
    let end = finish(
        &conn,
        &s,
        &mix,
        Duration::from_secs(180),
        timed_stop(&mut f),
    )
    .await;
    let idle_stop = end.stopped.1;
    let a = &end.audit;
    eprintln!(
        "SIGTERM with a {grace:?} grace: consumers gone after {stopped_consuming:?}, \
         exit {status:?} after {took:?} (pod grace {pod_grace} s, preStop {pre_stop} s; \
         a worker with nothing to do exited in {idle_stop:?})"
    );
    let mut panics = worker_panics(&dir);
    panics.extend(worker_panics(&fdir));
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit:\n{}",
        w.tail(20)
    );
    assert!(
        stopped_consuming < Duration::from_secs(1) + idle_stop,
        "consumers gone after {stopped_consuming:?} (a worker with nothing to do exited in {idle_stop:?})"
    );
    assert!(
        took < grace + Duration::from_millis(1500) + idle_stop,
        "took {took:?} for a grace of {grace:?} (a worker with nothing to do exited in {idle_stop:?})"
    );
    assert!(
        Duration::from_secs(pre_stop) + took < Duration::from_secs(pod_grace),
        "preStop {pre_stop} s + {took:?} exceeds the pod's {pod_grace} s"
    );
    assert!(end.settled, "did not settle: {}", a.summary(&mix.jobs));
    assert!(end.lost.is_empty(), "lost: {:?}", end.lost);
    assert!(end.violations.is_empty(), "{:#?}", end.violations);
    assert_eq!(a.duplicate_dispatches(), 0);
}

/// SIGTERM with digests open: 800 jobs of a digest policy (an 8 s window) over 200
/// recipients are folded, and the worker is stopped with the chart's grace while
/// their digests are open. It exits 0 within the grace; the digests stay in Redis,
/// and a fresh worker closes each once with every item: nothing lost, no digest twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_with_digests_open_leaves_them_to_the_next_worker_whole() {
    let _heavy = heavy().await;
    let (_, _, grace) = chart_stop();
    let ns = unique("sigterm-digest");
    let mut s = digest_settings(&ns, Duration::from_secs(8), None);
    s.worker.shutdown_grace = Dur(grace);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("sigterm-digest");
    declare(&s).await;
    let conn = amqp().await;
    let jobs = digest_jobs(&ns, 200, 4);
    publish_all(&conn, &s, &jobs).await;
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    // every job folded (the jobs queue empty), the digests open: none may have
    // closed yet (what the scenario needs is the state itself, however long the
    // machine takes to reach it; a run that stops moving fails)
    let dispatch = topology(&s).dispatch_queue("sms");
    let mut progress = Progress::new(Duration::from_secs(60));
    loop {
        let (open, _) = digest_state(&s);
        let waiting = depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        if open == 200 && waiting == 0 {
            break;
        }
        let closed = depth(&conn, &dispatch).await.unwrap_or(0);
        assert_eq!(
            closed,
            0,
            "a digest closed before every job was folded ({open} open, {waiting} waiting):\n{}",
            w.tail(20)
        );
        progress.see(open as u64, u64::from(waiting));
        assert!(
            !progress.stalled(),
            "not folded ({open} open, {waiting} waiting):\n{}",
            w.tail(20)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let termed = Instant::now();
    w.term();
    let status = w.wait(grace + Duration::from_secs(30));
    let took = termed.elapsed();
    let (open_after, _) = digest_state(&s);
    eprintln!("SIGTERM with {open_after} digests open: exit {status:?} after {took:?}");
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit:\n{}",
        w.tail(20)
    );
    assert!(took < grace, "took {took:?} for a grace of {grace:?}");
    let mut next = WorkerProc::spawn(crate::BIN, &s, &dir, "1");
    let settled = until_digests_sent(&conn, &s, 200, Duration::from_secs(60)).await;
    let stopped = next.stop();
    let sent = drain_dispatch(&conn, &s).await;
    let a = DigestAudit::of(&sent, &jobs);
    a.assert_end((&dir, &next), settled, stopped, (&conn, &s), 200)
        .await;
}
