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

/// The job ids in `channel`'s dispatch queue, in queue order (the queue emptied).
async fn sent_in_order(
    conn: &lapin::Connection,
    s: &quota_worker::config::Settings,
    channel: &str,
) -> Vec<String> {
    drain(conn, &topology(s).dispatch_queue(channel))
        .await
        .into_iter()
        .map(|m| {
            m.props
                .message_id()
                .as_ref()
                .map(|i| i.to_string())
                .unwrap_or_default()
        })
        .collect()
}

/// The messages of `queue` on `node` not yet settled: ready, or delivered and not
/// acked (`rabbitmqctl list_queues`; `u64::MAX` when it does not answer).
fn unsettled(node: &testkit::procs::RabbitNode, queue: &str) -> u64 {
    let out = node.ctl(&["list_queues", "name", "messages", "--silent"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .find(|(name, _)| name.trim() == queue)
        .and_then(|(_, n)| n.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

/// How many times each job id is in `ids`.
fn counted(ids: &[String]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for id in ids {
        *out.entry(id.clone()).or_default() += 1;
    }
    out
}

/// The depth of a queue as polled over time: `(when, depth)`, oldest first.
#[derive(Default)]
struct Timeline(Vec<(Instant, u32)>);

impl Timeline {
    /// How many messages of the queue may have arrived by `at`: the depth of the
    /// first poll after it (every later message arrived after that poll's
    /// predecessor, so after `at`), or all of them when no poll came after.
    fn arrived_by(&self, at: Instant, all: usize) -> usize {
        self.0
            .iter()
            .find(|(t, _)| *t > at)
            .map_or(all, |(_, d)| *d as usize)
    }
}

/// 300 jobs routed push → email whose policy escalates after 8 s; the first
/// steps go out, the even jobs are answered (`delivered`), then the worker is
/// killed (-9) and the private RabbitMQ node stopped and started again with the
/// 300 escalations in its delay queues. A new worker takes them: each odd job goes
/// out on email once, no even job does, and no push goes twice. No escalation goes
/// before its deadline: one that went before the kill is an odd job whose first
/// step may have gone out 8 s before the kill (read from the push queue's depth
/// as polled, so a machine slow enough to take longer than 8 s over the setup
/// sees some go, as they should, and the check still holds). Likewise an answered
/// job never moves on, unless its deadline may have come before every answer was
/// applied (seen in the broker: the feedback queue empty of ready and unacked).
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
    let mut timeline = Timeline::default();
    let mut progress = Progress::new(Duration::from_secs(60));
    loop {
        let d = depth(&conn, &push).await.unwrap_or(0);
        timeline.0.push((Instant::now(), d));
        if d >= JOBS as u32 {
            break;
        }
        progress.see(u64::from(d), u64::MAX);
        assert!(!progress.stalled(), "first steps:\n{}", w.tail(30));
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
    // every answer applied: none left in the feedback queue, ready or unacked
    // (the worker acks a feedback once its effect is in Redis)
    let mut progress = Progress::new(Duration::from_secs(60));
    loop {
        let left = unsettled(node, &s.feedback.queue);
        if left == 0 {
            break;
        }
        progress.see(0, left);
        assert!(!progress.stalled(), "feedback:\n{}", w.tail(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let answered = Instant::now();
    drop(feedback);
    w.kill9();
    let killed = Instant::now();
    let pending = depth(&conn, &topology(&s).dispatch_queue("email"))
        .await
        .unwrap_or(0) as usize;
    // the first steps that may have gone out an answer_within before the kill, and
    // before every answer was applied (their escalation may come before the answer)
    let due_by = |at: Instant| {
        at.checked_sub(Duration::from_secs(8))
            .map_or(0, |at| timeline.arrived_by(at, JOBS))
    };
    let (due, due_unanswered) = (due_by(killed), due_by(answered));
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
    let (push_order, email_order) = (
        sent_in_order(&conn, &s, "push").await,
        sent_in_order(&conn, &s, "email").await,
    );
    // the escalations that went before the kill are the email queue's first
    let early: Vec<&String> = email_order[..pending.min(email_order.len())]
        .iter()
        .filter(|id| !push_order[..due.min(push_order.len())].contains(id))
        .collect();
    let (pushed, escalated) = (counted(&push_order), counted(&email_order));
    let twice = |m: &BTreeMap<String, usize>| m.values().filter(|n| **n > 1).count();
    let odd: Vec<String> = (1..JOBS).step_by(2).map(|i| format!("{ns}-{i}")).collect();
    let lost: Vec<&String> = odd
        .iter()
        .filter(|id| !escalated.contains_key(*id))
        .collect();
    // an answered job moves on only if its deadline may have come before its answer
    let answered_sent = escalated
        .keys()
        .filter(|id| !odd.contains(id))
        .filter(|id| !push_order[..due_unanswered.min(push_order.len())].contains(id))
        .count();
    let answered_late = escalated.keys().filter(|id| !odd.contains(id)).count() - answered_sent;
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
        "escalated_before_the_kill": pending,
        "first_steps_due_by_the_kill": due,
        "first_steps_due_before_their_answer": due_unanswered,
        "answered_after_the_deadline_and_sent": answered_late,
        "elapsed_seconds": started.elapsed().as_secs_f64(),
    }));
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "worker exit {status:?}:\n{}",
        w.tail(30)
    );
    assert!(
        early.is_empty(),
        "escalations went before their deadline ({pending} before the kill, \
         {due} first steps out 8 s before it): {early:?}"
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
