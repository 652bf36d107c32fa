//! The console's figures of BENCHMARKS.md, measured on demand (ignored in a test
//! run: it writes 100,000 index entries and prints times, which no test asserts):
//! `cargo nextest run --test suite --run-ignored only -E 'test(/^console::figures/)' --no-capture`.

use std::time::{Duration, Instant};

use chrono::Utc;
use quota_worker::admin::dead_index::{self, Known};
use quota_worker::admin::{RecipientQuery, Recipients};
use quota_worker::config::RuleSettings;
use quota_worker::http::Guard;
use testkit::*;

use super::{ask, serve};

/// The median of `n` answers to `GET path`, each checked for a 200 and `expect`.
async fn median(addr: &str, cookie: &str, path: &str, expect: &str, n: usize) -> Duration {
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
    times.sort();
    times[n / 2]
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
    // a recipient with 1,000 counted sends and 100 waiting jobs
    let q = RecipientQuery {
        recipient: "busy",
        category: None,
        channel: None,
        tz: chrono_tz::UTC,
        tenant: None,
    };
    let recipients = Recipients::new(store, &s);
    let now = Utc::now();
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
    // 100,000 dead letters in the index
    let props = lapin::BasicProperties::default().with_message_id("d".into());
    for i in 0..100_000u32 {
        let known = Known {
            policy: Some("default".into()),
            channel: Some(["sms", "email"][i as usize % 2].into()),
            ..Known::default()
        };
        let body = format!(r#"{{"id":"d{i}","recipient":"r{i}","channel":"fax"}}"#);
        let entry = dead_index::entry(&props, body.as_bytes(), known, now);
        dead_index::record(&store.connection(), store.keys(), &entry, 100_000)
            .await
            .unwrap();
    }
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let cookie = page.cookie().unwrap();
    let recipient = median(
        &addr,
        &cookie,
        "/console/recipient?recipient=busy",
        "1000 / 5000 per 30d",
        21,
    )
    .await;
    let dead = median(
        &addr,
        &cookie,
        "/console/dead",
        "100000 dead letter(s) selected",
        21,
    )
    .await;
    let filtered = median(
        &addr,
        &cookie,
        "/console/dead?channel=email&page=100",
        "50000 dead letter(s) selected",
        21,
    )
    .await;
    println!(
        "recipient page, 1,000 counted sends and 100 waiting jobs: {recipient:?} (median of 21)"
    );
    println!("dead-letter page over 100,000 dead letters: {dead:?} (median of 21)");
    println!("the same, filtered by channel, page 100: {filtered:?} (median of 21)");
    stop.cancel();
}
