//! Fault scenario: kill -9 of a worker while it closes digests.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::{depth, publish_all};
use testkit::procs::WorkerProc;
use testkit::*;

/// 800 jobs of a digest policy over 200 recipients (a 2 s window). The worker
/// process is killed (`kill -9`) at a moment Redis shows it closing a digest, twice,
/// another process started each time; the digests it had claimed come back to the
/// next one when their lease ends (`redis.reservation_lease`, 3 s here) and are
/// closed and published again under the same id. The policy allows one send per
/// 8 s and each recipient had one just before: the digests' jobs wait for the cap,
/// so no dispatch is under way at a kill (a job dispatched and not yet committed
/// at a kill may go twice, as any job: RELIABILITY.md's crash window; this keeps
/// the scenario to the closes). Every digest reaches the dispatch queue exactly
/// once (by `message_id`), and every job is in exactly one digest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_a_digest_close_sends_each_digest_once_with_every_item() {
    let _heavy = heavy().await;
    let ns = unique("digestkill");
    let s = digest_settings(&ns, Duration::from_secs(2), Some((1, "8s")));
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("digestkill");
    declare(&s).await;
    let conn = amqp().await;
    let dispatch = topology(&s).dispatch_queue("sms");
    send_one_each(&s, 200).await;
    let started = Instant::now();
    let jobs = digest_jobs(&ns, 200, 4);
    publish_all(&conn, &s, &jobs).await;
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    let mut kills = Vec::new();
    let mut left = std::collections::BTreeSet::new();
    for k in 0..2 {
        let Some((open, closing)) = until_closing(&s, &left, Duration::from_secs(20)).await else {
            break;
        };
        w.kill9();
        let at = depth(&conn, &dispatch).await.unwrap_or(0);
        eprintln!(
            "kill {k} at {:.1}s: {open} digests in the index, {} closing, {at} dispatched",
            started.elapsed().as_secs_f64(),
            closing.len()
        );
        kills.push(at);
        left.extend(closing);
        w = WorkerProc::spawn(crate::BIN, &s, &dir, &(k + 1).to_string());
    }
    assert_eq!(
        kills.len(),
        2,
        "a close seen for each kill:\n{}",
        w.tail(30)
    );
    assert!(
        kills.iter().all(|&at| at == 0),
        "the cap did not hold the digests' jobs until the kills were over: {kills:?}"
    );
    let settled = until_digests_sent(&conn, &s, 200, Duration::from_secs(60)).await;
    let status = w.stop();
    let sent = drain_dispatch(&conn, &s).await;
    let a = DigestAudit::of(&sent, &jobs);
    // a digest published again by the closer that took it over after a kill is
    // found already sent (its first copy went): acked, not sent again
    let again = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .map(|log| log.matches("duplicate of a job already dispatched").count())
        .sum::<usize>();
    eprintln!("digest jobs found already sent: {again}");
    testkit::reliability::record(json!({
        "scenario": "digest_close_kill",
        "test": "tests/faults/digest_close_kill.rs: kill_9_during_a_digest_close_sends_each_digest_once_with_every_item",
        "jobs": jobs.len(),
        "faults": kills.len(),
        "fault": "kill -9 of the worker while it closes digests, another started",
        "digests": a.digests,
        "duplicates": a.twice.len(),
        "published_again_and_dropped": again,
        "lost": a.lost.len(),
        "elapsed_seconds": started.elapsed().as_secs_f64(),
    }));
    a.assert_end((&dir, &w), settled, status, (&conn, &s), 200)
        .await;
}
