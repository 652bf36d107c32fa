//! Production connections against servers the tests start: a private RabbitMQ node
//! with a TLS listener and a `redis-server --tls-port`, both with certificates made
//! here (`testkit::pki`). Jobs flow end to end over `amqps://` and `rediss://` with
//! mutual TLS; a wrong CA, a missing client certificate, a wrong server name and a
//! plaintext port are refused; Redis with an ACL user; and the worker outlives the
//! broker closing its connection again and again, in the middle of declaring.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quota_worker::admission::{Admission, Request};
use quota_worker::amqp::{self, BrokerError, Topology};
use quota_worker::config::Settings;
use quota_worker::producer::Job;
use quota_worker::store::QuotaStore;
use quota_worker::tls::TlsSettings;
use quota_worker::worker::Worker;
use testkit::pki::Pki;
use testkit::procs::{RabbitNode, RedisServer, WorkerProc};
use testkit::temp_dir;
use testkit::{free_port, settings, unique};
use tokio_util::sync::CancellationToken;

fn tls(ca: &Path, client: Option<&Pki>) -> TlsSettings {
    TlsSettings {
        ca_file: Some(ca.to_path_buf()),
        cert_file: client.map(|p| p.client_cert.clone()),
        key_file: client.map(|p| p.client_key.clone()),
        ..Default::default()
    }
}

async fn connect(url: &str, tls: &TlsSettings) -> Result<lapin::Connection, BrokerError> {
    amqp::connect(url, tls, "tls test", Duration::from_secs(10)).await
}

fn request(id: &str) -> Request<'_> {
    Request {
        id,
        recipient: id,
        channel: "sms",
        category: "default",
        tz: chrono_tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    }
}

/// Take up to `n` messages from `queue` within `wait`; their message ids.
async fn take_ids(conn: &lapin::Connection, queue: &str, n: usize, wait: Duration) -> Vec<String> {
    let mut ids = Vec::new();
    let deadline = Instant::now() + wait;
    while ids.len() < n && Instant::now() < deadline {
        match testkit::take(conn, queue, Duration::from_millis(200)).await {
            Some(m) => ids.push(testkit::message_id(&m).to_string()),
            None => continue,
        }
    }
    ids.sort();
    ids
}

/// Settings of one test against `node` and `redis` over TLS (mutual TLS).
fn tls_settings(ns: &str, pki: &Pki, node: &RabbitNode, redis: &RedisServer) -> Settings {
    let mut s = settings(ns);
    s.amqp.url = node.tls_url();
    s.amqp.tls = tls(&pki.ca, Some(pki));
    s.redis.url = redis.tls_url();
    s.redis.tls = tls(&pki.ca, Some(pki));
    s.validate().expect("TLS settings are valid");
    s
}

/// Certificates, a private RabbitMQ node and a redis-server, both listening with
/// TLS and requiring a client certificate; `None` (the test skipped, and saying so)
/// where this machine cannot start a RabbitMQ node.
async fn tls_servers() -> Option<(Pki, RabbitNode, RedisServer)> {
    if !RabbitNode::available() {
        eprintln!("skipped: no RabbitMQ scripts to start a private node");
        return None;
    }
    let pki = Pki::new();
    let mut node = RabbitNode::with_tls(&pki, true);
    node.start().await;
    let redis = RedisServer::with_tls(&pki, true);
    Some((pki, node, redis))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_flow_end_to_end_over_amqps_and_rediss_with_mutual_tls() {
    let Some((pki, node, redis)) = tls_servers().await else {
        return;
    };
    let ns = unique("tls-flow");
    let s = tls_settings(&ns, &pki, &node, &redis);

    let engine = Arc::new(QuotaStore::connect(&s).await.expect("redis over TLS"));
    let worker = Arc::new(Worker::new(s.clone(), engine.clone()));
    let stop = CancellationToken::new();
    let run = tokio::spawn(worker.clone().run(stop.clone()));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !worker
        .health
        .broker
        .load(std::sync::atomic::Ordering::Relaxed)
    {
        assert!(
            Instant::now() < deadline,
            "the worker never connected over TLS"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let producer = quota_worker::producer::from_settings(&s)
        .await
        .expect("producer over TLS");
    let mut sent = Vec::new();
    for i in 0..3 {
        let id = format!("tls-{i}");
        producer
            .publish(&Job::new(format!("r{i}"), "sms").id(id.clone()))
            .await
            .expect("published over TLS");
        sent.push(id);
    }
    let conn = connect(&s.amqp.url, &s.amqp.tls).await.unwrap();
    let topology = Topology::from_settings(&s);
    let got = take_ids(
        &conn,
        &topology.dispatch_queue("sms"),
        3,
        Duration::from_secs(30),
    )
    .await;
    assert_eq!(got, sent, "every job dispatched, over TLS both ways");
    // the sends are recorded in the TLS Redis: the same recipient is now capped
    let again = engine.admit(&request("r0")).await.unwrap();
    assert!(matches!(again, Admission::Refused { .. }), "{again:?}");

    stop.cancel();
    run.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_verified_is_refused_with_a_clear_error() {
    let Some((pki, node, redis)) = tls_servers().await else {
        return;
    };
    let url = node.tls_url();

    // the right CA and a client certificate: connects
    let good = tls(&pki.ca, Some(&pki));
    connect(&url, &good).await.expect("mutual TLS connects");

    // a CA that did not sign the broker's certificate
    let err = connect(&url, &tls(&pki.other_ca, Some(&pki)))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("UnknownIssuer"), "{err}");

    // no client certificate, while the broker requires one
    assert!(connect(&url, &tls(&pki.ca, None)).await.is_err());

    // a name the certificate does not carry
    let wrong_name = TlsSettings {
        server_name: Some("not-the-broker.example".into()),
        ..good.clone()
    };
    let err = connect(&url, &wrong_name).await.unwrap_err().to_string();
    assert!(err.contains("not valid for name"), "{err}");

    // verification turned off by its key: the wrong CA then connects
    let insecure = TlsSettings {
        insecure_skip_verify: true,
        ..tls(&pki.other_ca, Some(&pki))
    };
    connect(&url, &insecure)
        .await
        .expect("insecure_skip_verify accepts any certificate");

    // amqps:// aimed at the node's plaintext port fails instead of connecting
    let plain_port = format!("amqps://guest:guest@localhost:{}/%2f", node.port);
    let err = connect(&plain_port, &good).await.unwrap_err().to_string();
    assert!(err.contains("does not speak TLS"), "{err}");

    // Redis: the wrong CA, and no client certificate, are refused; the right ones work
    let mut s = settings(&unique("tls-refused"));
    s.redis.url = redis.tls_url();
    s.redis.tls = tls(&pki.other_ca, Some(&pki));
    let err = QuotaStore::connect(&s).await.unwrap_err().to_string();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    s.redis.tls = tls(&pki.ca, None);
    assert!(
        QuotaStore::connect(&s).await.is_err(),
        "no client certificate"
    );
    s.redis.tls = tls(&pki.ca, Some(&pki));
    let engine = QuotaStore::connect(&s).await.expect("mutual TLS to Redis");
    assert!(matches!(
        engine.admit(&request("r")).await.unwrap(),
        Admission::Admitted(_)
    ));

    // the CLI says why, naming what failed
    let mut s = settings(&unique("tls-cli"));
    s.amqp.url = url.clone();
    let out = crate::cli::qw(&s, &["admin", "queues"])
        .env("QUOTA_WORKER__AMQP__TLS__CA_FILE", &pki.other_ca)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("connecting to amqps://guest:***@") && stderr.contains("UnknownIssuer"),
        "{stderr}"
    );
}

#[tokio::test]
async fn redis_with_an_acl_user() {
    let redis = RedisServer::with_acl("qwuser", "s3cret");
    let mut s = settings(&unique("acl"));
    s.redis.url = format!("redis://qwuser:s3cret@127.0.0.1:{}", redis.port);
    let engine = QuotaStore::connect(&s)
        .await
        .expect("the ACL user connects");
    assert!(matches!(
        engine.admit(&request("r")).await.unwrap(),
        Admission::Admitted(_)
    ));
    s.redis.url = format!("redis://qwuser:wrong@127.0.0.1:{}", redis.port);
    let err = QuotaStore::connect(&s).await.unwrap_err().to_string();
    assert!(
        err.to_lowercase().contains("authentication failed"),
        "{err}"
    );
}

/// The broker closes the worker's connection (`rabbitmqctl close_all_connections`)
/// again and again: while it declares its topology at start (each time a few more
/// of its queues exist, so the close lands in the middle of the declarations or of
/// the session's start), and
/// then while it consumes. The worker never exits, comes back after each close,
/// and then dispatches a job as if nothing happened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_outlives_the_broker_closing_its_connection_mid_declare() {
    if !RabbitNode::available() {
        eprintln!("skipped: no RabbitMQ scripts to start a private node");
        return;
    }
    let mut node = RabbitNode::new();
    node.start().await;
    let ns = unique("closed");
    let mut s = settings(&ns);
    s.amqp.url = node.url();
    // a close that lands in the AMQP handshake leaves the connect waiting for its
    // deadline (this one, 10 s by default): 3 s keeps the test short
    s.amqp.publish_timeout = quota_worker::config::Dur(Duration::from_secs(3));
    // the private node goes with the test; the recipient key it writes in the
    // machine's Redis would not
    let _cleanup = testkit::Cleanup::new(&s);
    let dir = temp_dir("closed");

    // Closes inside the broker, each as soon as the node holds N queues and the
    // worker holds a connection the closer has not closed yet: the broker creates the
    // worker's queues one by one (25 with the defaults), so a close falls among the
    // answers to its declarations (or, when the closer lags behind them, just after,
    // while it opens its channels and consumers: still a session ended at start). Waiting for a new connection keeps a lagging close from
    // landing while the worker backs off, or on the one just closed, ending nothing.
    let closes_while_declaring = [3, 8, 13, 18];
    let burst = format!(
        "Close = fun(N, Closed) -> \
             WaitFor = fun Again() -> \
                 L = rabbit_networking:connections() -- Closed, \
                 case length(rabbit_amqqueue:list()) >= N andalso L =/= [] of \
                     true -> L; false -> timer:sleep(2), Again() end end, \
             Live = WaitFor(), \
             rabbit_networking:close_all_connections(\"closed by the test\"), \
             Closed ++ Live end, \
         lists:foldl(Close, [], {closes_while_declaring:?})."
    );
    let (out, mut worker) = std::thread::scope(|scope| {
        let closer = scope.spawn(|| node.ctl(&["eval", &burst]));
        std::thread::sleep(Duration::from_millis(500));
        let worker = WorkerProc::spawn(crate::BIN, &s, &dir, "w");
        (closer.join().unwrap(), worker)
    });
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log_path = worker.log.clone();
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let count = |text: &str, what: &str| text.matches(what).count();
    let wait_for = |n: usize, what: &'static str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(&log(), what) < n {
            assert!(Instant::now() < deadline, "no {n}th `{what}`:\n{}", log());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for(closes_while_declaring.len(), "broker session ended");
    // a session that ended before it was consuming ended while it connected,
    // declared or subscribed (the declarations go out together, so a close lands
    // among their answers or just after them)
    let (mut mid_setup, mut mid_declare, mut consuming) = (0, 0, false);
    for line in log().lines() {
        if line.contains("\"consuming\"") {
            consuming = true;
        } else if line.contains("broker session ended") {
            mid_setup += usize::from(!consuming);
            mid_declare += usize::from(line.contains("cannot declare"));
            consuming = false;
        }
    }
    assert!(
        mid_setup >= 1,
        "no close landed while the session started:\n{}",
        log()
    );
    wait_for(1, "\"consuming\"");
    assert!(worker.running(), "the worker exited:\n{}", worker.tail(20));

    // while it consumes: it reconnects after each close
    for i in 1..=3 {
        let out = node.ctl(&["close_all_connections", "closed by the test"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        wait_for(i + 1, "\"consuming\"");
        assert!(worker.running(), "the worker exited:\n{}", worker.tail(20));
    }
    let ended = count(&log(), "broker session ended");

    // it comes back, and works
    let conn = connect(&s.amqp.url, &s.amqp.tls).await.unwrap();
    let producer = quota_worker::producer::from_settings(&s).await.unwrap();
    producer
        .publish(&Job::new("r-after", "sms").id("after-the-closes"))
        .await
        .unwrap();
    let queue = Topology::from_settings(&s).dispatch_queue("sms");
    let got = take_ids(&conn, &queue, 1, Duration::from_secs(30)).await;
    assert_eq!(got, ["after-the-closes"], "{}", worker.tail(20));
    assert!(worker.running());
    worker.term();
    let status = worker
        .wait(Duration::from_secs(30))
        .expect("the worker stops");
    assert!(status.success(), "{status:?}");
    eprintln!(
        "{ended} sessions ended by the broker, {mid_setup} of them while starting ({mid_declare} while declaring)"
    );
}

/// Redis is not there when the worker starts (it starts later, or restarts): the
/// worker waits for it with backoff instead of exiting, then works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_waits_for_a_redis_that_is_not_there_yet() {
    let port = free_port(None);
    let ns = unique("late-redis");
    let mut s = settings(&ns);
    s.redis.url = format!("redis://127.0.0.1:{port}");
    let _cleanup = testkit::Cleanup::new(&s);
    let dir = temp_dir("late-redis");
    let mut worker = WorkerProc::spawn(crate::BIN, &s, &dir, "w");
    let log_path = worker.log.clone();
    let log = move || std::fs::read_to_string(&log_path).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while log().matches("redis unavailable at start").count() < 2 {
        assert!(Instant::now() < deadline, "{}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(worker.running(), "the worker exited:\n{}", worker.tail(10));

    let _redis = RedisServer::at_port(port);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log().contains("\"consuming\"") {
        assert!(Instant::now() < deadline, "{}", log());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let producer = quota_worker::producer::from_settings(&s).await.unwrap();
    producer
        .publish(&Job::new("r", "sms").id("after-redis-came"))
        .await
        .unwrap();
    let conn = testkit::amqp().await;
    let queue = Topology::from_settings(&s).dispatch_queue("sms");
    let got = take_ids(&conn, &queue, 1, Duration::from_secs(30)).await;
    assert_eq!(got, ["after-redis-came"], "{}", worker.tail(10));
    worker.term();
    assert!(worker.wait(Duration::from_secs(30)).unwrap().success());
}

/// The topology's steps go out together (one round trip, not one a step), yet they
/// keep their order and the first refusal is the one reported: with a delay queue
/// half-way down the ladder already there as a classic queue, the declaration fails
/// on that queue, named, as fatal (the broker refused it); what comes before it was
/// declared, and what comes after it was not.
#[tokio::test]
async fn a_refused_declaration_names_its_step_and_stops_the_ones_after_it() {
    let ns = unique("refused");
    let s = settings(&ns);
    let _cleanup = testkit::Cleanup::new(&s);
    let t = Topology::from_settings(&s);
    let ladder = t.ladder();
    let (clash, after) = (ladder.queue(5), ladder.queue(6));
    let conn = testkit::amqp().await;
    let ch = conn.create_channel().await.unwrap();
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(clash.as_str().into(), durable, Default::default())
        .await
        .unwrap();

    let err = t.declare(&conn).await.unwrap_err();
    match &err {
        BrokerError::Declare { what, .. } => assert_eq!(what, &format!("queue `{clash}`")),
        other => panic!("not a declaration error: {other:?}"),
    }
    assert!(err.is_fatal(), "{err}");
    let exists = |name: String| {
        let conn = &conn;
        async move {
            let ch = conn.create_channel().await.unwrap();
            let passive = lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            };
            ch.queue_declare(name.as_str().into(), passive, Default::default())
                .await
                .is_ok()
        }
    };
    assert!(exists(s.amqp.dead_queue.clone()).await);
    assert!(exists(ladder.queue(4)).await);
    assert!(
        !exists(after).await,
        "a step after the refused one was declared"
    );
    // the connection itself is still good (only the topology's channel was closed)
    assert!(exists(s.amqp.jobs_queue.clone()).await);
}
