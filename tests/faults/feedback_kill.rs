//! Fault scenario: kill -9 of the worker while it applies feedback. Every feedback
//! is published twice; the worker is killed three times while it drains them.
//! Afterwards nothing is lost (every failed send given back, every opt-out in
//! force, every 429 counted) and nothing is applied twice (the channel's 429 count
//! is exactly the number of distinct throttles, and a copy of a `failed` published
//! after its job was admitted again gives nothing back).

use std::time::Duration;

use crate::harness::*;
use quota_worker::admission::{Admission, Request};
use quota_worker::store::QuotaStore;
use quota_worker_producer::{Event, Feedback, FeedbackPublisher};
use serde_json::json;
use testkit::audit::{depth, Rng};
use testkit::procs::WorkerProc;
use testkit::*;

const N: usize = 300;

fn req<'a>(id: &'a str, recipient: &'a str) -> Request<'a> {
    Request {
        id,
        recipient,
        channel: "sms",
        category: "daily",
        tz: chrono_tz::Tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    }
}

async fn send_and_commit(store: &QuotaStore, id: &str, recipient: &str) {
    match store.admit(&req(id, recipient)).await.unwrap() {
        Admission::Admitted(t) => store.commit(&t).await.unwrap(),
        other => panic!("{id}: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_applying_feedback_applies_each_once_and_loses_none() {
    let _heavy = heavy().await;
    let ns = unique("fbkill");
    let mut s = fault_settings(&ns, 100);
    s.feedback.prefetch = 8;
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("fbkill");
    declare(&s).await;
    let store = QuotaStore::connect(&s).await.unwrap();
    let ids: Vec<(String, String)> = (0..N)
        .map(|i| (format!("f-{i}"), format!("rf-{i}")))
        .collect();
    for (id, r) in &ids {
        send_and_commit(&store, id, r).await;
    }
    let conn = amqp().await;
    let p = FeedbackPublisher::open(&conn, &s.feedback.exchange, Duration::from_secs(10))
        .await
        .unwrap();
    let mut all = Vec::new();
    for (i, (id, r)) in ids.iter().enumerate() {
        all.push(Feedback::new(id, Event::Failed, r, "sms"));
        all.push(Feedback::new(
            &format!("u-{i}"),
            Event::Unsubscribed,
            &format!("ru-{i}"),
            "sms",
        ));
        let mut t = Feedback::new(&format!("t-{i}"), Event::Throttled, "rt", "sms");
        t.retry_after = Some(0.001);
        all.push(t);
    }
    for _copy in 0..2 {
        for f in &all {
            p.publish(f).await.unwrap();
        }
    }
    let published = all.len() * 2;

    let mut rng = Rng::from_env();
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    let mut kills = 0;
    for k in 0..3 {
        wait_consumers(&conn, &s.feedback.queue, 1, Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("worker never consumed feedback:\n{}", w.tail(30)));
        tokio::time::sleep(Duration::from_millis(rng.range(100, 400))).await;
        let left = depth(&conn, &s.feedback.queue).await.unwrap_or(0);
        w.kill9();
        if left > 0 {
            kills += 1;
        }
        wait_consumers(&conn, &s.feedback.queue, 0, Duration::from_secs(10)).await;
        w = WorkerProc::spawn(crate::BIN, &s, &dir, &(k + 1).to_string());
    }
    // drained
    let mut drained = false;
    for _ in 0..300 {
        let q = inspect(&conn, &s.feedback.queue).await.unwrap();
        if q.message_count() == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(drained, "the feedback queue drained:\n{}", w.tail(30));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // nothing lost: every failed send given back (admitted again), every opt-out in force
    let mut given_back = 0;
    for (id, r) in &ids {
        if let Admission::Admitted(t) = store.admit(&req(id, r)).await.unwrap() {
            store.commit(&t).await.unwrap();
            given_back += 1;
        }
    }
    let mut suppressed = 0;
    for i in 0..N {
        let r = format!("ru-{i}");
        let list =
            quota_worker::feedback::apply::suppressions(&store.connection(), store.keys(), &r)
                .await
                .unwrap();
        suppressed += usize::from(list.len() == 1);
    }
    // nothing applied twice: exactly N throttles counted
    let mut r = redis_sync();
    let strikes: i64 = redis::cmd("HGET")
        .arg(store.keys().throttle("sms"))
        .arg("strikes")
        .query(&mut r)
        .unwrap();
    // a copy of each `failed` again, after the jobs went again: gives nothing back
    for (id, rcp) in &ids {
        p.publish(&Feedback::new(id, Event::Failed, rcp, "sms"))
            .await
            .unwrap();
    }
    for _ in 0..300 {
        if depth(&conn, &s.feedback.queue).await == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut still_counted = 0;
    for (id, rcp) in &ids {
        if matches!(
            store.admit(&req(id, rcp)).await.unwrap(),
            Admission::Duplicate
        ) {
            still_counted += 1;
        }
    }
    let dead = depth(&conn, &s.amqp.dead_queue).await.unwrap_or(0);
    let status = w.stop();
    conclude(
        &dir,
        json!({
            "scenario": "feedback_kill9",
            "test": "tests/faults/feedback_kill.rs: kill_9_while_applying_feedback_applies_each_once_and_loses_none",
            "feedback_published": published,
            "kills_with_feedback_left": kills,
            "failed_given_back": given_back,
            "suppressed": suppressed,
            "throttles_counted": strikes,
            "copies_that_gave_back": N - still_counted,
            "dead_letters": dead,
        }),
        true,
        &[],
        "",
    );
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "{}",
        w.tail(30)
    );
    assert!(kills >= 1, "a kill landed while feedback was left");
    assert_eq!(given_back, N, "every failed send given back");
    assert_eq!(suppressed, N, "every opt-out in force");
    assert_eq!(strikes, N as i64, "each throttle counted once");
    assert_eq!(
        still_counted, N,
        "a late copy of a failed gave nothing back"
    );
    assert_eq!(dead, 0);
}
