//! Fault scenario: Redis down under load.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::Dur;
use serde_json::json;
use testkit::audit::{depth, noon_zone, publish_all};
use testkit::procs::{self};
use testkit::reliability::{long, record};
use testkit::*;

/// GET `path` on `addr`: (status, body), (0, "") when nothing answers.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    testkit::http_get(&addr.to_string(), path)
        .await
        .unwrap_or((0, String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_holds_jobs_and_processing_resumes_when_it_returns() {
    let _heavy = heavy().await;
    let outage = Duration::from_secs(if long() { 30 } else { 8 });
    let n = if long() { 6_000 } else { 1_500 };
    let mut redis = procs::RedisServer::new(false);
    let ns = unique("redisdown");
    let mut s = fault_settings(&ns, 150);
    s.redis.url = redis.url();
    // the default lease: a job must not wait out a lease because of the outage
    s.redis.reservation_lease = Dur(Duration::from_secs(120));
    let _c = Cleanup::new(&s);
    declare(&s).await;
    let mix = Mix::new(&ns, n, &noon_zone());
    let conn = amqp().await;
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");

    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    // the worker's /readyz, served for this in-process worker's health
    let listener = quota_worker::http::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    tokio::spawn(quota_worker::http::serve(
        listener,
        quota_worker::http::router(None, w.health.clone()),
        stop.clone(),
    ));
    let started = Instant::now();
    while depth(&conn, &dispatch).await.unwrap_or(0) < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress before the outage"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Redis goes away (SHUTDOWN SAVE: it comes back with its data, as a Redis with
    // persistence would)
    redis.stop();
    let down_at = Instant::now();
    let mut noticed = None;
    let mut at_one_second = None;
    while down_at.elapsed() < outage {
        if noticed.is_none() && !w.health.redis.load(Ordering::Relaxed) {
            noticed = Some(down_at.elapsed());
        }
        if at_one_second.is_none() && down_at.elapsed() >= Duration::from_secs(1) {
            at_one_second = Some(depth(&conn, &dispatch).await.unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_return = depth(&conn, &dispatch).await.unwrap_or(0);
    let dead_during = depth(&conn, &s.amqp.dead_queue).await.unwrap_or(0);
    let ready_during = w.health.ready();
    let readyz_during = http_get(http, "/readyz").await;

    redis.start().expect("redis restarts");
    let up_at = Instant::now();
    let mut resumed = None;
    let mut healthy = None;
    while up_at.elapsed() < Duration::from_secs(30) && (resumed.is_none() || healthy.is_none()) {
        if resumed.is_none() && depth(&conn, &dispatch).await.unwrap_or(0) > before_return {
            resumed = Some(up_at.elapsed());
        }
        if healthy.is_none() && http_get(http, "/readyz").await.0 == 200 {
            healthy = Some(up_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let end = finish(
        &conn,
        &s,
        &mix,
        Duration::from_secs(if long() { 600 } else { 120 }),
        async {
            stop.cancel();
            handle.await.unwrap();
        },
    )
    .await;
    let elapsed = end.quiet_at - started;
    let a = &end.audit;
    let during = before_return as i64 - at_one_second.unwrap_or(0) as i64;
    record(json!({
        "scenario": "redis_outage",
        "test": "tests/faults/redis_outage.rs: redis_outage_holds_jobs_and_processing_resumes_when_it_returns",
        "jobs": n,
        "faults": 1,
        "fault": format!("redis-server stopped for {} s (SHUTDOWN SAVE, then restarted with its data)", outage.as_secs()),
        "outage_seconds": outage.as_secs(),
        "lost": end.lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "violations": end.violations.len(),
        "dispatched_during_outage": during,
        "dead_lettered_not_malformed": end.wrong_dead.len(),
        "health_noticed_seconds": noticed.map(|d| d.as_secs_f64()),
        "ready_during_outage": ready_during,
        "readyz_during_outage": format!("{} {}", readyz_during.0, readyz_during.1.trim().replace('\n', " / ")),
        "recovery_seconds": resumed.map(|d| d.as_secs_f64()),
        "health_back_seconds": healthy.map(|d| d.as_secs_f64()),
        "dead_during_outage": dead_during,
        "elapsed_seconds": elapsed.as_secs_f64(),
    }));
    assert!(
        end.settled,
        "the run did not settle: {}",
        a.summary(&mix.jobs)
    );
    assert!(end.lost.is_empty(), "lost: {:?}", end.lost);
    assert!(
        end.violations.is_empty(),
        "violations: {:#?}",
        end.violations
    );
    assert_eq!(during, 0, "jobs dispatched while Redis was down");
    assert!(
        end.wrong_dead.is_empty(),
        "jobs dead-lettered because of the outage: {:?}",
        end.wrong_dead
    );
    assert!(noticed.is_some(), "Health.redis never reported the outage");
    assert!(!ready_during, "ready while Redis was down");
    assert_eq!(
        readyz_during.0, 503,
        "/readyz during the outage: {readyz_during:?}"
    );
    assert!(readyz_during.1.contains("redis: down"), "{readyz_during:?}");
    let healthy = healthy.expect("/readyz never came back to 200");
    assert!(
        healthy < Duration::from_secs(5),
        "/readyz ready {healthy:?} after Redis returned"
    );
    let resumed = resumed.expect("processing never resumed");
    assert!(
        resumed < Duration::from_secs(5),
        "resumed {resumed:?} after Redis returned"
    );
    assert_eq!(a.duplicate_dispatches(), 0);
}
