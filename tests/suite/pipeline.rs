//! The worker end to end against the machine's RabbitMQ and Redis: every outcome of
//! the contract, one job at a time through `Worker::process`, and the running loop.

use std::time::Duration;

use chrono::Utc;
use chrono_tz::Tz;
use lapin::options::QueueDeleteOptions;
use quota_worker::amqp::Publisher;
use quota_worker::config::RuleSettings;
use quota_worker::job::{Outcome, Reason};
use quota_worker::quota::window;
use testkit::*;

const WAIT: Duration = Duration::from_secs(10);

fn job(id: &str, recipient: &str, extra: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"{recipient}","channel":"sms"{extra},"payload":{{"text":"hi"}}}}"#).into_bytes()
}

#[tokio::test]
async fn one_job_is_dispatched_byte_for_byte() {
    let ns = unique("one");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let body = br#"{"id":"j-1","recipient":"+15550001","channel":"sms",  "future_field":[1,2],"payload":{"x":1}}"#;
    publish(&conn, &s, body).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    let m = take(&conn, &format!("{ns}.dispatch.sms"), WAIT)
        .await
        .expect("dispatched");
    assert_eq!(m.delivery.data, body.to_vec());
    assert_eq!(message_id(&m), "j-1");
    assert_eq!(m.delivery.properties.delivery_mode(), &Some(2));
}

#[tokio::test]
async fn second_job_same_local_day_is_delayed_to_the_recipients_midnight() {
    let ns = unique("midnight");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    publish(&conn, &s, &job("a", "r1", r#","timezone":"Asia/Shanghai""#)).await;
    publish(&conn, &s, &job("b", "r1", r#","timezone":"Asia/Shanghai""#)).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    let outcome = step(&w, &conn, &s).await;
    let tz: Tz = "Asia/Shanghai".parse().unwrap();
    let expected = window::next_day_start(tz, Utc::now());
    assert_eq!(outcome, Outcome::Delayed { until: expected });
    // it waits in the ladder, carrying its attempt count and target instant
    let ladder = quota_worker::amqp::Topology::from_settings(&s).ladder();
    let mut found = None;
    for n in 0..ladder.levels {
        if let Some(m) = take(&conn, &ladder.queue(n), Duration::ZERO).await {
            found = Some(m);
        }
    }
    let m = found.expect("the delayed job sits in a delay queue");
    assert_eq!(
        header(&m.delivery.properties, "x-notify-attempt").as_deref(),
        Some("1")
    );
    assert_eq!(
        header(&m.delivery.properties, "x-notify-not-before"),
        Some(expected.timestamp_millis().to_string())
    );
}

#[tokio::test]
async fn fourth_job_in_seven_days_waits_for_the_oldest_to_leave() {
    let ns = unique("fourth");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let tz: Tz = "America/Santiago".parse().unwrap();
    let today = window::local_date(tz, Utc::now());
    let key = s.redis.keys().recipient("r4", "default", None);
    let mut r = redis_sync();
    let mut oldest = None;
    for (i, back) in [5i64, 3, 1].iter().enumerate() {
        let day = today - chrono::Duration::days(*back);
        oldest.get_or_insert(day);
        let at = window::day_start(tz, day) + chrono::Duration::hours(9);
        let _: () = redis::cmd("ZADD")
            .arg(&key)
            .arg(at.timestamp_millis() * 2 + 1)
            .arg(quota_worker::quota::keys::member(&format!("past-{i}")))
            .query(&mut r)
            .unwrap();
    }
    publish(
        &conn,
        &s,
        &job("4th", "r4", r#","timezone":"America/Santiago""#),
    )
    .await;
    let expected = window::day_start(tz, oldest.unwrap() + chrono::Duration::days(7));
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Delayed { until: expected }
    );
}

#[tokio::test]
async fn expired_jobs_are_dead_lettered() {
    let ns = unique("expired");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    // already past
    publish(
        &conn,
        &s,
        &job("old", "r", r#","expires_at":"1970-01-01T00:00:00Z""#),
    )
    .await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::Expired));
    // allowed again only after it expires
    let soon = (Utc::now() + chrono::Duration::minutes(1)).to_rfc3339();
    publish(&conn, &s, &job("first", "r", "")).await;
    publish(
        &conn,
        &s,
        &job("second", "r", &format!(r#","expires_at":"{soon}""#)),
    )
    .await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::Expired));
    let dead = &format!("{ns}.dead");
    let m = take(&conn, dead, WAIT).await.unwrap();
    assert_eq!(
        header(&m.delivery.properties, "x-notify-reason").as_deref(),
        Some("expired")
    );
    let m = take(&conn, dead, WAIT).await.unwrap();
    assert_eq!(
        header(&m.delivery.properties, "x-notify-reason").as_deref(),
        Some("expired")
    );
    assert!(header(&m.delivery.properties, "x-notify-detail")
        .unwrap()
        .contains("after it expires"));
}

#[tokio::test]
async fn the_same_job_twice_is_a_duplicate() {
    let ns = unique("dupe");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules.clear();
    let (_c, w, conn) = rig(&s).await;
    publish(&conn, &s, &job("same", "r", "")).await;
    publish(&conn, &s, &job("same", "r", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    assert_eq!(step(&w, &conn, &s).await, Outcome::Duplicate);
    assert_eq!(depth(&conn, &format!("{ns}.dispatch.sms")).await, 1);
    assert_eq!(depth(&conn, &format!("{ns}.dead")).await, 0);
}

#[tokio::test]
async fn malformed_and_unknown_channel_jobs_are_dead_lettered_untouched() {
    let ns = unique("malformed");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"\xff\xfe not utf-8".to_vec(), "malformed"),
        (b"{not json".to_vec(), "malformed"),
        (
            br#"{"recipient":"r","channel":"sms"}"#.to_vec(),
            "malformed",
        ),
        (
            br#"{"id":"z","recipient":"r","channel":"sms","timezone":"../../etc/passwd"}"#.to_vec(),
            "malformed",
        ),
        (vec![b' '; 300_000], "malformed"),
        (
            br#"{"id":"p","recipient":"r","channel":"pigeon"}"#.to_vec(),
            "unknown_channel",
        ),
    ];
    for (body, _) in &cases {
        publish(&conn, &s, body).await;
    }
    for (body, reason) in &cases {
        let outcome = step(&w, &conn, &s).await;
        assert!(matches!(outcome, Outcome::Dead(_)), "{outcome:?}");
        let m = take(&conn, &format!("{ns}.dead"), WAIT).await.unwrap();
        assert_eq!(&m.delivery.data, body);
        assert_eq!(
            header(&m.delivery.properties, "x-notify-reason").as_deref(),
            Some(*reason)
        );
        assert!(!header(&m.delivery.properties, "x-notify-detail")
            .unwrap()
            .is_empty());
    }
}

#[tokio::test]
async fn a_returned_dispatch_gives_the_quota_back_and_loses_nothing() {
    let ns = unique("returned");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(
        format!("{ns}.dispatch.sms").as_str().into(),
        QueueDeleteOptions::default(),
    )
    .await
    .unwrap();
    publish(&conn, &s, &job("lost?", "r", "")).await;
    let outcome = step(&w, &conn, &s).await;
    assert!(
        matches!(outcome, Outcome::Delayed { .. }),
        "retried later: {outcome:?}"
    );
    // the quota was given back: the recipient has no recorded send
    let key = s.redis.keys().recipient("r", "default", None);
    let mut r = redis_sync();
    let n: i64 = redis::cmd("ZCARD").arg(&key).query(&mut r).unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn a_delayed_job_comes_back_and_is_dispatched_on_time() {
    let ns = unique("ontime");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![RuleSettings {
        limit: 1,
        window: "3s".parse().unwrap(),
    }];
    let _c = Cleanup::new(&s);
    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let conn = amqp().await;
    // taken before the first is published, so before its admission: a slow `take`
    // of the first on a loaded machine cannot shorten what is measured
    let published_at = Utc::now();
    publish(&conn, &s, &job("first", "r", "")).await;
    publish(&conn, &s, &job("second", "r", "")).await;
    let dispatch = format!("{ns}.dispatch.sms");
    let first = take(&conn, &dispatch, WAIT)
        .await
        .expect("first dispatched");
    let second = take(&conn, &dispatch, Duration::from_secs(15))
        .await
        .expect("second comes back");
    let second_at = Utc::now();
    assert_eq!(message_id(&first), "first");
    assert_eq!(message_id(&second), "second");
    let waited = (second_at - published_at).num_milliseconds();
    // never early (3 s after the first admission), and back within the ladder's
    // 1 s rounding plus generous slack for a loaded machine
    assert!(waited >= 2_900, "dispatched after {waited} ms");
    assert!(waited <= 7_000, "dispatched after {waited} ms");
    // handled twice: refused once, then dispatched
    assert_eq!(
        header(&second.delivery.properties, "x-notify-attempt").as_deref(),
        Some("2")
    );
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn the_ladder_holds_each_delay_exactly_without_head_of_line_blocking() {
    let ns = unique("ladder");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let _w = worker(&s).await; // declares the topology
    let conn = amqp().await;
    let ladder = topology(&s).ladder();
    let p = Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    // a long delay first, then short ones: the short ones must not wait behind it
    let sent = std::time::Instant::now();
    for secs in [600u64, 4, 1, 3] {
        let mut headers = lapin::types::FieldTable::default();
        ladder.mark(&mut headers, secs);
        let props = lapin::BasicProperties::default()
            .with_message_id(secs.to_string().into())
            .with_headers(headers);
        p.publish("", &ladder.entry(secs), b"{}", props)
            .await
            .unwrap();
    }
    let mut back = Vec::new();
    while back.len() < 3 {
        let m = take(&conn, &s.amqp.jobs_queue, Duration::from_secs(8))
            .await
            .expect("short delays come back");
        let secs: u64 = message_id(&m).parse().unwrap();
        let waited = sent.elapsed();
        assert!(
            waited >= Duration::from_secs(secs),
            "{secs}s delay back after {waited:?}"
        );
        assert!(
            waited <= Duration::from_secs(secs) + Duration::from_millis(1500),
            "{secs}s delay back after {waited:?}"
        );
        back.push(secs);
    }
    assert_eq!(back, vec![1, 3, 4]);
    // the 10-minute one still waits, in the 512 s queue (its highest bit)
    assert_eq!(depth(&conn, &ladder.queue(9)).await, 1);
}

#[tokio::test]
async fn deleting_the_topology_removes_every_queue_and_exchange() {
    let s = settings(&unique("teardown"));
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let t = topology(&s);
    t.declare(&conn).await.unwrap();
    t.delete(&conn).await.unwrap();
    for q in t.queues() {
        assert!(
            inspect(&conn, &q).await.is_none(),
            "queue {q} is still there"
        );
    }
    // a passive declare of a deleted exchange fails (and closes its channel)
    for x in t.exchanges() {
        let ch = conn.create_channel().await.unwrap();
        let found = ch
            .exchange_declare(
                x.as_str().into(),
                lapin::ExchangeKind::Fanout,
                lapin::options::ExchangeDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                Default::default(),
            )
            .await
            .is_ok();
        assert!(!found, "exchange {x} is still there");
    }
    // deleting again is not an error: there is nothing left
    t.delete(&conn).await.unwrap();
}
