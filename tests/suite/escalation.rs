//! Escalation (`unanswered` in a policy's `[fallback].on`), end to end through
//! RabbitMQ and Redis: a step no answer follows within `answer_within` moves on
//! once; an answer in time ends it, one after the move sends nothing more; `read`
//! answers when the policy waits for a read; `admin job ID cancel` ends a pending
//! escalation as a dead letter `cancelled`; three workers, with failures racing
//! the escalations, send each next step once.

use std::time::Duration;

use quota_worker::admin::{JobStatus, Jobs};
use quota_worker::config::{Dur, FallbackSettings, Settings};
use quota_worker::fallback::log::StepOutcome;
use quota_worker::store::QuotaStore;
use quota_worker_producer::{Event, Feedback};
use testkit::*;

use crate::fallback::{job, sent_on};
use crate::feedback::send;

/// Settings whose `default` policy has no rules and escalates after `within`,
/// answered by `answered_by` (`None`: a delivery).
fn escalating(ns: &str, within: Duration, answered_by: Option<&str>) -> Settings {
    let mut s = settings(ns);
    let p = s.policies.get_mut("default").unwrap();
    p.rules.clear();
    p.fallback = Some(FallbackSettings {
        on: Some(
            ["capped", "opted_out", "suppressed", "failed", "unanswered"]
                .map(String::from)
                .to_vec(),
        ),
        wait_at_most: None,
        answer_within: Some(Dur(within)),
        answered_by: answered_by.map(String::from),
    });
    s
}

async fn explain(store: &QuotaStore, s: &Settings, id: &str) -> JobStatus {
    Jobs::new(store, s).explain(id).await.unwrap()
}

/// Wait until job `id`'s route holds `n` entries; its status then.
async fn route_of(store: &QuotaStore, s: &Settings, id: &str, n: usize) -> JobStatus {
    wait_for(
        &format!("{n} route entries of {id}"),
        Duration::from_secs(10),
        || async move { explain(store, s, id).await.route.len() >= n },
    )
    .await;
    explain(store, s, id).await
}

fn feedback(id: &str, event: Event, recipient: &str, channel: &str) -> Feedback {
    Feedback::new(id, event, recipient, channel)
}

async fn quiet(conn: &lapin::Connection, s: &Settings, channels: &[&str]) {
    for channel in channels {
        assert_eq!(
            depth(conn, &topology(s).dispatch_queue(channel)).await,
            0,
            "nothing more on {channel}"
        );
    }
}

#[tokio::test]
async fn an_unanswered_step_moves_on_once_and_an_answer_in_time_or_late_sends_nothing_more() {
    let ns = unique("esc-unanswered");
    let s = escalating(&ns, Duration::from_secs(1), None);
    let (_c, w, conn) = rig(&s).await;
    let store = w.store();
    let (stop, handle) = spawn_worker(w.clone()).await;

    // e2 is answered in time: its escalation comes back and ends there
    publish(&conn, &s, &job("e2", "r2", "push", &["email", "sms"])).await;
    assert_eq!(sent_on(&conn, &s, "push", "e2").await, ("1/3".into(), None));
    send(&conn, &s, &feedback("e2", Event::Delivered, "r2", "push")).await;

    // e1 is not: email takes it after a second, saying why
    publish(&conn, &s, &job("e1", "r1", "push", &["email", "sms"])).await;
    assert_eq!(sent_on(&conn, &s, "push", "e1").await, ("1/3".into(), None));
    let pending = explain(store, &s, "e1").await;
    assert!(pending.escalates_at.is_some(), "{pending:?}");
    let (route, from) = sent_on(&conn, &s, "email", "e1").await;
    assert_eq!(route, "2/3");
    assert_eq!(
        from.as_deref(),
        Some("push: unanswered (no delivery within 1s)")
    );
    // answers: a late one for push, a timely one for email; sms never goes
    send(&conn, &s, &feedback("e1", Event::Delivered, "r1", "push")).await;
    send(&conn, &s, &feedback("e1", Event::Delivered, "r1", "email")).await;

    let e2 = route_of(store, &s, "e2", 2).await;
    assert_eq!(e2.route[1].outcome, StepOutcome::Answered);
    assert_eq!(e2.escalates_at, None);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    quiet(&conn, &s, &["push", "email", "sms"]).await;
    let e1 = route_of(store, &s, "e1", 2).await;
    let steps: Vec<(usize, &str, StepOutcome)> = e1
        .route
        .iter()
        .map(|e| (e.step, e.channel.as_str(), e.outcome))
        .collect();
    assert!(
        steps.starts_with(&[
            (1, "push", StepOutcome::Dispatched),
            (2, "email", StepOutcome::Dispatched)
        ]),
        "{steps:?}"
    );
    assert_eq!(e1.escalates_at, None, "answered on email");
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn a_policy_waiting_for_a_read_moves_on_after_a_delivery_alone() {
    let ns = unique("esc-read");
    let s = escalating(&ns, Duration::from_secs(1), Some("read"));
    let (_c, w, conn) = rig(&s).await;
    let store = w.store();
    let (stop, handle) = spawn_worker(w.clone()).await;

    publish(&conn, &s, &job("d1", "r1", "push", &["sms"])).await;
    sent_on(&conn, &s, "push", "d1").await;
    send(&conn, &s, &feedback("d1", Event::Delivered, "r1", "push")).await;
    publish(&conn, &s, &job("r1", "r2", "push", &["sms"])).await;
    sent_on(&conn, &s, "push", "r1").await;
    send(&conn, &s, &feedback("r1", Event::Read, "r2", "push")).await;

    // delivered is not read: d1 moves on; r1 was read
    let (route, from) = sent_on(&conn, &s, "sms", "d1").await;
    assert_eq!(route, "2/2");
    assert_eq!(
        from.as_deref(),
        Some("push: unanswered (no read within 1s)")
    );
    let r1 = route_of(store, &s, "r1", 2).await;
    assert_eq!(r1.route[1].outcome, StepOutcome::Answered);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    quiet(&conn, &s, &["push", "sms"]).await;
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn cancel_ends_a_pending_escalation_as_a_dead_letter() {
    let ns = unique("esc-cancel");
    let s = escalating(&ns, Duration::from_secs(3), None);
    let (_c, w, conn) = rig(&s).await;
    let store = w.store();
    let (stop, handle) = spawn_worker(w.clone()).await;

    publish(&conn, &s, &job("c1", "r1", "push", &["email"])).await;
    sent_on(&conn, &s, "push", "c1").await;
    let status = route_of(store, &s, "c1", 1).await;
    assert!(status.escalates_at.is_some(), "{status:?}");
    let cancelled = Jobs::new(store, &s).cancel("c1").await.unwrap();
    assert!(!cancelled.already);

    let m = take(&conn, &s.amqp.dead_queue, Duration::from_secs(10))
        .await
        .expect("the escalation, dead-lettered");
    assert_eq!(message_id(&m), "c1");
    assert_eq!(
        header(&m.delivery.properties, "x-notify-reason").as_deref(),
        Some("cancelled")
    );
    quiet(&conn, &s, &["email"]).await;
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn three_workers_with_failures_racing_the_escalations_send_each_next_step_once() {
    let ns = unique("esc-three");
    let s = escalating(&ns, Duration::from_secs(1), None);
    let (_c, w, conn) = rig(&s).await;
    let mut running = vec![spawn_worker(w.clone()).await];
    for _ in 0..2 {
        running.push(spawn_worker(worker(&s).await).await);
    }
    let n = 40;
    for i in 0..n {
        publish(
            &conn,
            &s,
            &job(&format!("t{i}"), &format!("r{i}"), "push", &["email"]),
        )
        .await;
    }
    let push = topology(&s).dispatch_queue("push");
    wait_for("every first step", Duration::from_secs(20), || {
        let (conn, push) = (&conn, &push);
        async move { depth(conn, push).await >= n }
    })
    .await;
    // half of them also fail, about when their escalation comes back
    tokio::time::sleep(Duration::from_millis(900)).await;
    for i in (0..n).step_by(2) {
        let f = feedback(&format!("t{i}"), Event::Failed, &format!("r{i}"), "push");
        send(&conn, &s, &f).await;
    }
    let email = topology(&s).dispatch_queue("email");
    wait_for("every next step", Duration::from_secs(20), || {
        let (conn, email) = (&conn, &email);
        async move { depth(conn, email).await >= n }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let sent = testkit::audit::drain(&conn, &email).await;
    let mut ids: Vec<String> = sent
        .iter()
        .map(|m| {
            m.props
                .message_id()
                .as_ref()
                .map(|i| i.to_string())
                .unwrap_or_default()
        })
        .collect();
    ids.sort();
    let total = ids.len();
    ids.dedup();
    assert_eq!((total, ids.len()), (n as usize, n as usize), "each once");
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
}

#[tokio::test]
async fn an_escalation_is_held_by_its_channel_alone_and_none_starts_after_expiry() {
    let ns = unique("esc-count");
    let mut s = escalating(&ns, Duration::from_secs(1), None);
    // two a day in all, one a day on email
    s.caps.insert("total".into(), crate::fallback::cap(2, &[]));
    s.caps
        .insert("email_daily".into(), crate::fallback::cap(1, &["email"]));
    let (_c, w, conn) = rig(&s).await;
    let store = w.store();
    let (stop, handle) = spawn_worker(w.clone()).await;

    publish(
        &conn,
        &s,
        br#"{"id":"k0","recipient":"r1","channel":"email"}"#,
    )
    .await;
    let email = topology(&s).dispatch_queue("email");
    let k0 = take(&conn, &email, Duration::from_secs(5))
        .await
        .expect("k0");
    assert_eq!(message_id(&k0), "k0");
    publish(&conn, &s, &job("k1", "r1", "push", &["email", "sms"])).await;
    sent_on(&conn, &s, "push", "k1").await;
    // the total is full (k0, k1) but counts k1 once: its escalation is not held by
    // it; email's own cap is full (k0): the escalation moves on to sms
    let (route, from) = sent_on(&conn, &s, "sms", "k1").await;
    assert_eq!(route, "3/3");
    let from = from.unwrap_or_default();
    assert!(
        from.starts_with("email: capped (cap email_daily: 1 per 1d until "),
        "{from}"
    );

    // a step whose deadline is past the job's expiry does not escalate
    let expires = chrono::Utc::now() + chrono::Duration::milliseconds(900);
    let body = serde_json::json!({"id": "x1", "recipient": "r2", "channel": "push",
        "fallback": ["email"], "expires_at": expires.to_rfc3339()});
    publish(&conn, &s, body.to_string().as_bytes()).await;
    sent_on(&conn, &s, "push", "x1").await;
    let x1 = route_of(store, &s, "x1", 1).await;
    assert_eq!(x1.escalates_at, None, "{x1:?}");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    quiet(&conn, &s, &["push", "email", "sms"]).await;
    stop.cancel();
    handle.await.unwrap();
}
