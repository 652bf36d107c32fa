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
        let end = finish(&conn, &s, &mix, Duration::from_secs(120), async {
            f.stop()
        })
        .await;
        assert!(end.stopped.map(|s| s.success()).unwrap_or(false));
        let a = &end.audit;
        eprintln!("rate {rate}/s, grace {grace}s: exit {status:?} after {took:?}");
        let mut panics = worker_panics(&dir);
        panics.extend(worker_panics(&fdir));
        assert!(panics.is_empty(), "worker panics: {panics:#?}");
        figures.push(json!({
            "rate_per_second": rate,
            "grace_seconds": grace,
            "exit_code": status.and_then(|s| s.code()),
            "exit_seconds": took.as_secs_f64(),
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
            took < Duration::from_secs(grace) + Duration::from_millis(1500),
            "took {took:?} for a grace of {grace}s"
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
