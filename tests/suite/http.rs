//! HTTP: the router in-process, and `quota-worker run` serving /metrics and /readyz.

use std::process::{Child, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cli::*;
use quota_worker::health::Health;
use testkit::*;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn readiness_follows_health_and_metrics_render() {
    let (recorder, handle) = quota_worker::metrics::local_recorder().unwrap();
    metrics::with_local_recorder(&recorder, || {
        metrics::counter!("quota_worker_jobs_total", "outcome" => "dispatched", "reason" => "")
            .increment(3);
        metrics::histogram!("quota_worker_admission_seconds").record(0.002);
    });
    let health = Arc::new(Health::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let server = tokio::spawn(quota_worker::http::serve(
        listener,
        quota_worker::http::router(Some(handle), health.clone()),
        stop.clone(),
    ));

    assert_eq!(testkit::http_get(&addr, "/healthz").await.unwrap().0, 200);
    let (status, body) = testkit::http_get(&addr, "/readyz").await.unwrap();
    assert_eq!(status, 503);
    assert!(
        body.contains("broker: down") && body.contains("redis: down"),
        "{body}"
    );
    health.broker.store(true, Ordering::Relaxed);
    let (status, body) = testkit::http_get(&addr, "/readyz").await.unwrap();
    assert_eq!(status, 503);
    assert!(
        body.contains("broker: up") && body.contains("redis: down"),
        "{body}"
    );
    health.redis.store(true, Ordering::Relaxed);
    assert_eq!(
        testkit::http_get(&addr, "/readyz").await.unwrap(),
        (200, "ready\nbroker: up\nredis: up\n".into())
    );

    let (status, body) = testkit::http_get(&addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"quota_worker_jobs_total{outcome="dispatched",reason=""} 3"#),
        "{body}"
    );
    // a histogram with the configured buckets, not a summary
    assert!(
        body.contains(r#"quota_worker_admission_seconds_bucket{le="0.0025"} 1"#),
        "{body}"
    );
    assert_eq!(testkit::http_get(&addr, "/nope").await.unwrap().0, 404);
    stop.cancel();
    server.await.unwrap().unwrap();
}

/// Kills the child if the test fails before it stops it.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test]
async fn run_serves_metrics_and_readiness_and_stops_on_sigterm() {
    serves_metrics_and_stops_on_sigterm(1).await;
}

#[tokio::test]
async fn run_on_a_multi_threaded_runtime_serves_and_stops_alike() {
    serves_metrics_and_stops_on_sigterm(3).await;
}

/// `quota-worker run` with `worker.threads = threads`: ready, a job dispatched and
/// counted in /metrics, exit 0 on SIGTERM.
async fn serves_metrics_and_stops_on_sigterm(threads: usize) {
    let ns = unique("http");
    let mut s = settings(&ns);
    s.worker.threads = threads;
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", testkit::free_port(None));
    let _c = Cleanup::new(&s);
    let addr = s.http.listen.clone();
    let mut running = Running(Some(
        qw(&s, &["run"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));

    wait_for("/readyz 200", Duration::from_secs(30), || async {
        matches!(testkit::http_get(&addr, "/readyz").await, Some((200, _)))
    })
    .await;
    assert_eq!(testkit::http_get(&addr, "/healthz").await.unwrap().0, 200);
    // the image's health check: the binary asks http.listen itself
    let health = qw(&s, &["health"]).output().unwrap();
    assert!(health.status.success(), "{health:?}");
    let ready = qw(&s, &["health", "--path", "/readyz"]).output().unwrap();
    assert!(ready.status.success(), "{ready:?}");

    let conn = amqp().await;
    publish(
        &conn,
        &s,
        br#"{"id":"m-1","recipient":"r","channel":"sms"}"#,
    )
    .await;
    let dispatched = r#"quota_worker_jobs_total{outcome="dispatched",reason="",policy="default",channel="sms"} 1"#;
    wait_for("the job in /metrics", Duration::from_secs(15), || async {
        testkit::http_get(&addr, "/metrics")
            .await
            .is_some_and(|(_, body)| body.contains(dispatched))
    })
    .await;
    let metrics = testkit::http_get(&addr, "/metrics").await.unwrap().1;
    for expected in [
        "# TYPE quota_worker_jobs_total counter",
        "# TYPE quota_worker_admission_seconds histogram",
        "quota_worker_admission_seconds_bucket{le=\"0.001\"}",
        "# TYPE quota_worker_admission_call_seconds histogram",
        "quota_worker_admission_call_seconds_bucket{le=\"0.001\"}",
        "quota_worker_redis_errors_total 0",
        // every outcome shows from the start, at 0 until it happens
        "quota_worker_jobs_total{outcome=\"dead\",reason=\"expired\",policy=\"transactional\",channel=\"push\"} 0",
        // a body that is no job is counted under neither
        "quota_worker_jobs_total{outcome=\"dead\",reason=\"malformed\",policy=\"\",channel=\"\"} 0",
        "quota_worker_in_flight 0",
    ] {
        assert!(metrics.contains(expected), "{expected} in\n{metrics}");
    }

    // SIGTERM: exit 0, and the port is released
    let child = running.0.as_mut().unwrap();
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.success(), "{status:?}");
    running.0 = None;
    assert!(testkit::http_get(&addr, "/healthz").await.is_none());
    // nothing listens now: unhealthy, and it says why
    let health = qw(&s, &["health"]).output().unwrap();
    assert_eq!(health.status.code(), Some(1));
    let said = String::from_utf8_lossy(&health.stderr);
    assert!(
        said.contains(&format!("unhealthy: /healthz on {addr}")),
        "{said}"
    );
}

#[test]
fn health_asks_loopback_for_an_unspecified_listen_address() {
    use quota_worker::http::local_address;
    assert_eq!(
        local_address("0.0.0.0:9464").unwrap().to_string(),
        "127.0.0.1:9464"
    );
    assert_eq!(
        local_address("[::]:9464").unwrap().to_string(),
        "[::1]:9464"
    );
    assert_eq!(
        local_address("10.1.2.3:80").unwrap().to_string(),
        "10.1.2.3:80"
    );
}

#[tokio::test]
async fn run_no_http_serves_nothing() {
    let ns = unique("nohttp");
    let mut s = settings(&ns);
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", testkit::free_port(None));
    let _c = Cleanup::new(&s);
    let _running = Running(Some(
        qw(&s, &["run", "--no-http"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let conn = amqp().await;
    let jobs = s.amqp.jobs_queue.clone();
    wait_for("the worker consuming", Duration::from_secs(30), || {
        let conn = &conn;
        let jobs = jobs.clone();
        async move {
            let Ok(ch) = conn.create_channel().await else {
                return false;
            };
            let passive = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            match ch
                .queue_declare(jobs.as_str().into(), passive, Default::default())
                .await
            {
                Ok(q) => q.consumer_count() > 0,
                Err(_) => false,
            }
        }
    })
    .await;
    assert!(testkit::http_get(&s.http.listen, "/healthz")
        .await
        .is_none());
}
