//! The console's figures of BENCHMARKS.md, measured on demand (ignored in a test
//! run: it writes 100,000 index entries and prints times, which no test asserts;
//! each page is asked 21 times, every time printed, and the median):
//! `cargo nextest run --test suite --run-ignored only -E 'test(/^console::figures/)' --no-capture`.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lapin::types::AMQPValue;
use quota_worker::admin::dead_index::{self, Known};
use quota_worker::admin::{RecipientQuery, Recipients};
use quota_worker::config::{RuleSettings, Settings};
use quota_worker::http::Guard;
use quota_worker::store::QuotaStore;
use testkit::*;

use super::{ask, serve};

/// Answers asked for each page.
const ASKED: usize = 21;

/// The median of [`ASKED`] answers to `GET path`, each checked for a 200 and
/// `expect`, printed with every answer's time under `what`.
async fn median(addr: &str, cookie: &str, what: &str, path: &str, expect: &str) -> Duration {
    let n = ASKED;
    let mut times = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let a = ask(addr, "GET", path, Some(cookie), &[], "").await;
        times.push(t.elapsed());
        assert!(
            a.code == 200 && a.body.contains(expect),
            "{path}: {}",
            a.code
        );
    }
    let each: Vec<String> = times.iter().map(|t| format!("{:.1}", ms(*t))).collect();
    times.sort();
    println!(
        "{what}: median {:.1} ms of {n} (in ms, as asked: {})",
        ms(times[n / 2]),
        each.join(" ")
    );
    times[n / 2]
}

fn ms(t: Duration) -> f64 {
    t.as_secs_f64() * 1000.0
}

/// A recipient with 1,000 counted sends and 100 waiting jobs.
async fn a_busy_recipient(store: &QuotaStore, s: &Settings, now: DateTime<Utc>) {
    let q = RecipientQuery {
        recipient: "busy",
        category: None,
        channel: None,
        tz: chrono_tz::UTC,
        tenant: None,
    };
    let recipients = Recipients::new(store, s);
    for i in 0..1000 {
        let at = now - chrono::Duration::minutes(i + 1);
        recipients
            .import_send(&q, at, &format!("sent-{i}"))
            .await
            .unwrap();
    }
    let mut conn = store.connection();
    let waiting = store.keys().waiting("busy");
    for i in 0..100 {
        let until = (now + chrono::Duration::hours(i + 1)).timestamp_millis();
        let _: () = redis::cmd("ZADD")
            .arg(&waiting)
            .arg(until)
            .arg(format!("w-{i}"))
            .query_async(&mut conn)
            .await
            .unwrap();
    }
}

/// 100,000 dead letters in the index: half by sms, half by email, 1,000 for each of
/// 100 recipients (`r0` to `r99`), one policy.
async fn dead_letters(store: &QuotaStore, now: DateTime<Utc>) {
    for i in 0..100_000u32 {
        let props = lapin::BasicProperties::default().with_message_id(format!("d{i}").into());
        let known = Known {
            policy: Some("default".into()),
            channel: Some(["sms", "email"][i as usize % 2].into()),
            recipient_tag: Some(store.keys().recipient_tag(&format!("r{}", i % 100))),
            tenant: None,
        };
        let body = format!(r#"{{"id":"d{i}","recipient":"r{i}","channel":"fax"}}"#);
        let entry = dead_index::entry(&props, body.as_bytes(), known, now);
        dead_index::record(&store.connection(), store.keys(), &entry, 100_000)
            .await
            .unwrap();
    }
}

#[tokio::test]
#[ignore = "a measurement: run it on demand (see the module docs)"]
async fn figures() {
    let ns = unique("console-figures");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![RuleSettings {
        limit: 5000,
        window: "30d".parse().unwrap(),
    }];
    s.console.dead_index = 100_000;
    let (_c, w, _conn) = rig(&s).await;
    let store = w.store();
    let (addr, stop) = serve(&s, store, Guard::Open).await;
    let now = Utc::now();
    a_busy_recipient(store, &s, now).await;
    dead_letters(store, now).await;
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let cookie = page.cookie().unwrap();
    let pages = [
        (
            "recipient page, 1,000 counted sends and 100 waiting jobs",
            "/console/recipient?recipient=busy",
            "1000 / 5000 per 30d",
        ),
        (
            "dead letters, unfiltered, over 100,000",
            "/console/dead",
            "100000 dead letter(s) selected",
        ),
        (
            "dead letters by channel (50,000), page 100",
            "/console/dead?channel=email&page=100",
            "50000 dead letter(s) selected",
        ),
        (
            "dead letters by channel and policy (50,000 of 50,000 and 100,000), page 100",
            "/console/dead?channel=email&policy=default&page=100",
            "50000 dead letter(s) selected",
        ),
        (
            "the same, the middle page (500), the furthest walk",
            "/console/dead?channel=email&policy=default&page=500",
            "50000 dead letter(s) selected",
        ),
        (
            "the same, the last page (1,000)",
            "/console/dead?channel=email&policy=default&page=1000",
            "50000 dead letter(s) selected",
        ),
        (
            "dead letters by channel and recipient (1,000 of 50,000 and 1,000), page 10",
            "/console/dead?channel=email&recipient=r7&page=10",
            "1000 dead letter(s) selected",
        ),
        (
            "a job's page, its dead letter found among 100,000",
            "/console/job?id=d77",
            "d77",
        ),
    ];
    for (what, path, expect) in pages {
        median(&addr, &cookie, what, path, expect).await;
    }
    stop.cancel();
    catch_up_figure(&s, store).await;
}

/// The first look after a storm: 20,000 dead letters in the dead-letter log that
/// the index has not seen, caught up at once (each a job the index decodes).
async fn catch_up_figure(s: &Settings, store: &QuotaStore) {
    const STORM: usize = 20_000;
    let conn = amqp().await;
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    for i in 0..STORM {
        let body = format!(r#"{{"id":"storm{i}","recipient":"s{i}","channel":"sms"}}"#);
        let mut headers = lapin::types::FieldTable::default();
        let reason = lapin::types::LongString::from("capped");
        headers.insert("x-notify-reason".into(), AMQPValue::LongString(reason));
        let props = lapin::BasicProperties::default()
            .with_timestamp(Utc::now().timestamp() as u64)
            .with_headers(headers);
        p.publish(&s.amqp.dead_exchange, "", body.as_bytes(), props)
            .await
            .unwrap();
    }
    let t = Instant::now();
    let caught = quota_worker::admin::dead_log::catch_up(&conn, store, s)
        .await
        .unwrap();
    let took = t.elapsed();
    assert_eq!(caught.indexed, STORM as u64);
    println!(
        "catch-up of {STORM} dead letters the index had not seen: {:.2} s, {:.0} a second",
        took.as_secs_f64(),
        STORM as f64 / took.as_secs_f64()
    );
}
