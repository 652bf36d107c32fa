//! Fault scenario: escalations pending through a kill -9 of the worker and a
//! broker restart.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::{Dur, FallbackSettings};
use quota_worker_producer::{Event, Feedback, FeedbackPublisher};
use serde_json::json;
use testkit::audit::{depth, drain};
use testkit::procs::WorkerProc;
use testkit::*;

const JOBS: usize = 300;

/// How many times each job id reached `channel`'s dispatch queue.
async fn sent(
    conn: &lapin::Connection,
    s: &quota_worker::config::Settings,
    channel: &str,
) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for m in drain(conn, &topology(s).dispatch_queue(channel)).await {
        let id = m
            .props
            .message_id()
            .as_ref()
            .map(|i| i.to_string())
            .unwrap_or_default();
        *out.entry(id).or_default() += 1;
    }
    out
}

/// 300 jobs routed push → email whose policy escalates after 8 s; the first
/// steps go out, the even jobs are answered (`delivered`), then the worker is
/// killed (-9) and the private RabbitMQ node stopped and started again with the
/// 300 escalations in its delay queues. A new worker takes them: each odd job goes
/// out on email once, no even job does, and no push goes twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escalations_pending_through_a_kill_9_and_a_broker_restart_go_out_once() {
    let _heavy = heavy().await;
    let Some(mut guard) = private_node_or_skip("escalation_restart").await else {
        return;
    };
    let (node, _) = &mut *guard;
    let ns = unique("escrestart");
    let mut s = settings(&ns);
    s.amqp.url = node.url();
    let p = s.policies.get_mut("default").unwrap();
    p.rules.clear();
    p.fallback = Some(FallbackSettings {
        on: Some(vec!["failed".into(), "unanswered".into()]),
        wait_at_most: None,
        answer_within: Some(Dur(Duration::from_secs(8))),
        answered_by: None,
    });
    let _g = RedisGuard(ns.clone());
    let dir = testkit::temp_dir("escrestart");
    let mut conn = connect_node(&node.url()).await;
    topology(&s).declare(&conn).await.expect("topology");
    let started = Instant::now();
    let mut w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    for i in 0..JOBS {
        let body = json!({"id": format!("{ns}-{i}"), "recipient": format!("r{i}"),
            "channel": "push", "fallback": ["email"]});
        publish(&conn, &s, body.to_string().as_bytes()).await;
    }
    let push = topology(&s).dispatch_queue("push");
    while depth(&conn, &push).await.unwrap_or(0) < JOBS as u32 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "first steps:\n{}",
            w.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let feedback = FeedbackPublisher::open(&conn, &s.feedback.exchange, Duration::from_secs(10))
        .await
        .unwrap();
    for i in (0..JOBS).step_by(2) {
        let f = Feedback::new(
            &format!("{ns}-{i}"),
            Event::Delivered,
            &format!("r{i}"),
            "push",
        );
        feedback.publish(&f).await.unwrap();
    }
    while depth(&conn, &s.feedback.queue).await.unwrap_or(1) > 0 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "feedback:\n{}",
            w.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(feedback);
    tokio::time::sleep(Duration::from_millis(300)).await;
    w.kill9();
    let pending = depth(&conn, &topology(&s).dispatch_queue("email"))
        .await
        .unwrap_or(0);
    assert_eq!(pending, 0, "an escalation went before its deadline");
    let down_at = Instant::now();
    node.stop();
    tokio::time::sleep(Duration::from_secs(2)).await;
    node.start().await;
    let down_for = down_at.elapsed().as_secs_f64();
    conn = connect_node(&node.url()).await;
    w = WorkerProc::spawn(crate::BIN, &s, &dir, "1");
    let email = topology(&s).dispatch_queue("email");
    let deadline = Instant::now() + Duration::from_secs(90);
    while depth(&conn, &email).await.unwrap_or(0) < (JOBS / 2) as u32 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // the escalations of the answered jobs come back too: give them time to end
    tokio::time::sleep(Duration::from_secs(5)).await;
    let status = w.stop();
    let (pushed, escalated) = (
        sent(&conn, &s, "push").await,
        sent(&conn, &s, "email").await,
    );
    let twice = |m: &BTreeMap<String, usize>| m.values().filter(|n| **n > 1).count();
    let odd: Vec<String> = (1..JOBS).step_by(2).map(|i| format!("{ns}-{i}")).collect();
    let lost: Vec<&String> = odd
        .iter()
        .filter(|id| !escalated.contains_key(*id))
        .collect();
    let answered_sent = escalated.keys().filter(|id| !odd.contains(id)).count();
    testkit::reliability::record(json!({
        "scenario": "escalation_restart",
        "test": "tests/faults/escalation_restart.rs: escalations_pending_through_a_kill_9_and_a_broker_restart_go_out_once",
        "jobs": JOBS,
        "faults": 2,
        "fault": "kill -9 of the worker, then rabbitmqctl stop + start, with 300 escalations pending",
        "broker_down_seconds": down_for,
        "duplicates": twice(&pushed) + twice(&escalated),
        "lost": lost.len(),
        "answered_but_sent": answered_sent,
        "elapsed_seconds": started.elapsed().as_secs_f64(),
    }));
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "worker exit {status:?}:\n{}",
        w.tail(30)
    );
    assert_eq!(pushed.len(), JOBS, "every first step");
    assert_eq!(
        (twice(&pushed), twice(&escalated)),
        (0, 0),
        "none sent twice"
    );
    assert!(
        lost.is_empty(),
        "escalations lost: {lost:?}\n{}",
        w.tail(30)
    );
    assert_eq!(answered_sent, 0, "an answered step moved on");
    drop(conn);
}
