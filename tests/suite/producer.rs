//! Producers: the Rust API and `quota-worker publish`, against the machine's RabbitMQ.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cli::*;
use quota_worker::producer::{Job, Producer, ProducerError};
use serde_json::{json, Value};
use testkit::*;

async fn declared(ns: &str) -> (quota_worker::config::Settings, Cleanup, lapin::Connection) {
    let s = settings(ns);
    let cleanup = Cleanup::new(&s);
    let conn = amqp().await;
    topology(&s).declare(&conn).await.expect("topology");
    (s, cleanup, conn)
}

/// Every message in the jobs queue: (message id, body as JSON).
async fn drain_jobs(
    conn: &lapin::Connection,
    s: &quota_worker::config::Settings,
) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    while let Some(m) = take(conn, &s.amqp.jobs_queue, Duration::from_millis(300)).await {
        let p = &m.delivery.properties;
        assert_eq!(
            p.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        assert_eq!(p.delivery_mode(), &Some(2), "persistent");
        out.push((
            p.message_id().as_ref().unwrap().as_str().to_string(),
            serde_json::from_slice(&m.delivery.data).unwrap(),
        ));
    }
    out
}

#[tokio::test]
async fn the_api_publishes_a_confirmed_job_with_a_generated_id() {
    let ns = unique("api");
    let (s, _c, conn) = declared(&ns).await;
    let producer = quota_worker::producer::from_settings(&s).await.unwrap();
    let mut job = Job::new("+15550100", "sms")
        .category("promo")
        .timezone("Europe/Paris")
        .payload(json!({"text": "hello", "n": [1, 2]}));
    job.extra.insert("trace_id".into(), json!("t-9"));
    let id = producer.publish(&job).await.unwrap();
    producer.close().await;

    let jobs = drain_jobs(&conn, &s).await;
    assert_eq!(jobs.len(), 1);
    let (message_id, body) = &jobs[0];
    assert_eq!(message_id, id.as_str());
    assert_eq!(
        uuid::Uuid::parse_str(id.as_str())
            .unwrap()
            .get_version_num(),
        7
    );
    assert_eq!(
        body,
        &json!({"id": id.as_str(), "recipient": "+15550100", "channel": "sms",
                "category": "promo", "timezone": "Europe/Paris",
                "payload": {"text": "hello", "n": [1, 2]}, "trace_id": "t-9"})
    );
}

#[tokio::test]
async fn the_api_refuses_bad_jobs_and_missing_exchanges_before_sending() {
    let ns = unique("apibad");
    let (s, _c, conn) = declared(&ns).await;
    let producer = quota_worker::producer::from_settings(&s).await.unwrap();
    let err = producer
        .publish(&Job::new("r", "sms").timezone("Mars/Olympus"))
        .await
        .unwrap_err();
    assert!(matches!(err, ProducerError::Invalid(_)), "{err}");
    assert!(err.to_string().contains("timezone"), "{err}");
    assert_eq!(depth(&conn, &s.amqp.jobs_queue).await, 0);

    let err = Producer::connect(&s.amqp.url, &format!("{ns}.no-such-exchange"))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProducerError::MissingExchange { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn publish_one_job_from_flags() {
    let ns = unique("cli1");
    let (s, _c, conn) = declared(&ns).await;
    let out = run_async(
        &s,
        &[
            "publish",
            "--recipient",
            "user-42",
            "--channel",
            "email",
            "--category",
            "promo",
            "--timezone",
            "Asia/Kolkata",
            "--expires-at",
            "2030-01-01T00:00:00+05:30",
            "--payload",
            r#"{"subject":"hi","tags":["a"]}"#,
            "--id",
            "cli-1",
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "cli-1\n");
    let jobs = drain_jobs(&conn, &s).await;
    assert_eq!(
        jobs,
        vec![(
            "cli-1".to_string(),
            json!({"id": "cli-1", "recipient": "user-42", "channel": "email",
                   "category": "promo", "timezone": "Asia/Kolkata",
                   "expires_at": "2029-12-31T18:30:00Z",
                   "payload": {"subject": "hi", "tags": ["a"]}})
        )]
    );

    // a channel the configuration does not know is refused, nothing is sent
    let out = run_async(
        &s,
        &["publish", "--recipient", "r", "--channel", "pigeon"],
        None,
    )
    .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("pigeon"), "{}", stderr(&out));
    assert_eq!(depth(&conn, &s.amqp.jobs_queue).await, 0);
}

#[tokio::test]
async fn publish_many_from_stdin_skips_bad_lines_and_says_which() {
    let ns = unique("clin");
    let (s, _c, conn) = declared(&ns).await;
    let input = [
        r#"{"recipient":"a","channel":"sms"}"#,
        r#"{"id":"s-2","recipient":"b","channel":"push","payload":{"x":1},"extra":true}"#,
        r#"{"recipient":"c","channel":"sms""#,
        "",
        r#"{"recipient":"d","channel":"sms","timezone":"Nowhere/City"}"#,
        r#"{"recipient":"e","channel":"email"}"#,
    ]
    .join("\n");
    let out = run_async(&s, &["publish"], Some(&input)).await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("line 3:"), "{err}");
    assert!(err.contains("line 5:") && err.contains("timezone"), "{err}");
    let ids: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(ids[1], "s-2", "ids come out in input order");
    let published: BTreeSet<String> = drain_jobs(&conn, &s)
        .await
        .into_iter()
        .map(|(id, body)| {
            assert_eq!(body["id"], id.as_str());
            id
        })
        .collect();
    assert_eq!(published, ids.into_iter().collect());
}

#[tokio::test]
async fn publish_strict_sends_nothing_when_a_line_is_bad() {
    let ns = unique("strict");
    let (s, _c, conn) = declared(&ns).await;
    let input = "{\"recipient\":\"a\",\"channel\":\"sms\"}\nnot json\n";
    let out = run_async(&s, &["publish", "--stdin", "--strict"], Some(input)).await;
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("line 2:"), "{}", stderr(&out));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(depth(&conn, &s.amqp.jobs_queue).await, 0);

    let good =
        "{\"recipient\":\"a\",\"channel\":\"sms\"}\n{\"recipient\":\"b\",\"channel\":\"sms\"}\n";
    let out = run_async(&s, &["publish", "--stdin", "--strict"], Some(good)).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2);
    assert_eq!(drain_jobs(&conn, &s).await.len(), 2);
}

/// The ids in `queue`, in order.
async fn ids_in(conn: &lapin::Connection, queue: &str) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(m) = take(conn, queue, Duration::from_millis(300)).await {
        let id = m.delivery.properties.message_id().as_ref().unwrap();
        ids.push(id.as_str().to_string());
    }
    ids
}

/// A producer that knows nothing of lanes (the API as it connects, `quota-worker
/// publish` from flags and from lines) sends a job that carries a `priority` to the
/// lanes exchange: it waits in its lane, never in the jobs queue behind a campaign.
/// A channel without lanes gets it through the alternate exchange; `without_lanes`
/// and a job without a priority go to the jobs exchange.
#[tokio::test]
async fn a_job_with_a_priority_goes_to_its_lane_from_the_api_and_the_cli() {
    use quota_worker::lanes::Priority;
    let ns = unique("route");
    let mut s = settings(&ns);
    s.channels.get_mut("sms").unwrap().rate = Some(100);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let t = topology(&s);
    t.declare(&conn).await.expect("topology");

    let producer = Producer::on_connection(
        amqp().await,
        &s.amqp.jobs_exchange,
        Duration::from_secs(10),
        1 << 20,
    )
    .await
    .unwrap();
    assert_eq!(producer.lanes(), Some(s.lanes.exchange.as_str()));
    let sms = |id: &str| Job::new(id, "sms").id(id);
    producer
        .publish(&sms("api-bulk").priority(Priority::Bulk))
        .await
        .unwrap();
    producer.publish(&sms("api-none")).await.unwrap();
    // email is not paced: no lane, on to the jobs exchange
    let email = Job::new("e", "email")
        .id("api-email")
        .priority(Priority::Urgent);
    producer.publish(&email).await.unwrap();
    let old = producer.without_lanes();
    assert_eq!(old.lanes(), None);
    old.publish(&sms("api-old").priority(Priority::Bulk))
        .await
        .unwrap();
    old.close().await;

    let flags = [
        "publish",
        "--recipient",
        "r",
        "--channel",
        "sms",
        "--priority",
        "urgent",
        "--id",
        "cli-urgent",
    ];
    let out = run_async(&s, &flags, None).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let lines = concat!(
        r#"{"id":"cli-bulk","recipient":"r","channel":"sms","priority":"bulk"}"#,
        "\n",
        r#"{"id":"cli-none","recipient":"r","channel":"sms"}"#,
        "\n",
    );
    let out = run_async(&s, &["publish"], Some(lines)).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "cli-bulk\ncli-none\n");

    assert_eq!(
        ids_in(&conn, &t.lane_queue("sms", Priority::Bulk)).await,
        ["api-bulk", "cli-bulk"]
    );
    assert_eq!(
        ids_in(&conn, &t.lane_queue("sms", Priority::Urgent)).await,
        ["cli-urgent"]
    );
    let mut jobs = ids_in(&conn, &s.amqp.jobs_queue).await;
    jobs.sort();
    assert_eq!(jobs, ["api-email", "api-none", "api-old", "cli-none"]);
}
