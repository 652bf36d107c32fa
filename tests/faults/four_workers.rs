//! Fault scenario: four workers on one queue.

use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::RuleSettings;
use serde_json::json;
use testkit::audit::{self, noon_zone, publish_all, Audit, Published};
use testkit::procs::WorkerProc;
use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_one_queue_hold_the_caps_exactly() {
    let _heavy = heavy().await;
    let (n, limit, recipients, workers) = (1_000usize, 5usize, 10usize, 4usize);
    let ns = unique("four");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![RuleSettings {
        limit: limit as u32,
        window: "1d".parse().unwrap(),
    }];
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("four");
    declare(&s).await;
    let conn = amqp().await;
    let zone = noon_zone();
    let jobs: Vec<Published> = (0..n)
        .map(|i| {
            let id = format!("{ns}-{i}");
            let r = format!("shared-{}", i % recipients);
            let body = audit::job_body(&id, &r, "sms", "default", &zone);
            Published {
                id,
                recipient: r,
                body,
            }
        })
        .collect();
    let mut procs: Vec<WorkerProc> = (0..workers)
        .map(|i| WorkerProc::spawn(crate::BIN, &s, &dir, &i.to_string()))
        .collect();
    wait_consumers(
        &conn,
        &s.amqp.jobs_queue,
        workers as u32,
        Duration::from_secs(30),
    )
    .await
    .expect("four consumers");
    let started = Instant::now();
    publish_all(&conn, &s, &jobs).await;
    let done = wait_until_quiet(&conn, &s, limit * recipients, 0, Duration::from_secs(120)).await;
    let elapsed = started.elapsed();
    for p in &procs {
        p.term();
    }
    for p in procs.iter_mut() {
        assert!(p
            .wait(Duration::from_secs(30))
            .map(|s| s.success())
            .unwrap_or(false));
    }
    let a = Audit::collect(&conn, &s, &jobs).await;
    eprintln!("{}", a.summary(&jobs));
    let per = a.dispatched_per_recipient(&jobs);
    let keys = s.redis.keys();
    let mut r = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut violations = Vec::new();
    for i in 0..recipients {
        let who = format!("shared-{i}");
        let sent = per.get(&who).copied().unwrap_or(0);
        let recorded = audit::recorded(&mut r, &keys.recipient(&who, "default", None)).await;
        let committed = recorded.iter().filter(|(_, c, _)| *c).count();
        if sent != limit || recorded.len() != limit || committed != limit {
            violations.push(format!(
                "{who}: {sent} dispatched, {} recorded ({committed} committed); cap {limit}",
                recorded.len()
            ));
        }
    }
    let lost = a.lost(&jobs);
    conclude(
        &dir,
        json!({
            "scenario": "four_workers",
            "test": "tests/faults/four_workers.rs: four_workers_one_queue_hold_the_caps_exactly",
            "jobs": n,
            "workers": workers,
            "recipients": recipients,
            "cap": format!("{limit} per local day"),
            "dispatched": a.dispatched.len(),
            "waiting": a.waiting.len(),
            "duplicates": a.duplicate_dispatches(),
            "violations": violations.len(),
            "elapsed_seconds": elapsed.as_secs_f64(),
        }),
        done,
        &lost,
        &a.summary(&jobs),
    );
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(a.dispatched.len(), limit * recipients);
    assert_eq!(a.waiting.len(), n - limit * recipients);
    assert_eq!(a.duplicate_dispatches(), 0);
}
