//! Fault scenario: stale `x-death` headers.

use std::time::{Duration, Instant};

use crate::harness::*;
use serde_json::json;
use testkit::audit::{self, depth, noon_zone, publish_all, Audit, Published};
use testkit::reliability::record;
use testkit::*;

fn x_death(entries: &[(&str, &str)]) -> lapin::types::FieldTable {
    use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString};
    let mut deaths = Vec::new();
    for (queue, exchange) in entries {
        let mut t = FieldTable::default();
        t.insert("count".into(), AMQPValue::LongLongInt(3));
        t.insert(
            "reason".into(),
            AMQPValue::LongString(LongString::from("expired")),
        );
        t.insert(
            "queue".into(),
            AMQPValue::LongString(LongString::from(*queue)),
        );
        t.insert(
            "exchange".into(),
            AMQPValue::LongString(LongString::from(*exchange)),
        );
        t.insert(
            "time".into(),
            AMQPValue::Timestamp(chrono::Utc::now().timestamp() as u64),
        );
        t.insert(
            "routing-keys".into(),
            AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::LongString(
                LongString::from("#"),
            )])),
        );
        deaths.push(AMQPValue::FieldTable(t));
    }
    let mut h = FieldTable::default();
    h.insert(
        "x-death".into(),
        AMQPValue::FieldArray(FieldArray::from(deaths)),
    );
    h.insert(
        "x-first-death-queue".into(),
        AMQPValue::LongString(LongString::from(entries[0].0)),
    );
    h.insert(
        "x-first-death-reason".into(),
        AMQPValue::LongString(LongString::from("expired")),
    );
    h.insert(
        "x-first-death-exchange".into(),
        AMQPValue::LongString(LongString::from(entries[0].1)),
    );
    h.insert(
        "trace-id".into(),
        AMQPValue::LongString(LongString::from("kept")),
    );
    h
}

/// A job republished by hand with the `x-death` headers of an earlier trip through
/// the delay ladder: refused by its recipient's cap, it goes round the ladder again
/// and must come back (the worker strips the broker's headers when it delays, so
/// the broker's dead-letter cycle detection has nothing to match). A control copy
/// sent round the ladder with its `x-death` kept shows what the broker does
/// without the stripping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_x_death_headers_do_not_get_a_delayed_job_dropped() {
    let _heavy = heavy().await;
    let ns = unique("xdeath");
    let mut s = fault_settings(&ns, 1_000);
    s.policies.insert("rolling".into(), policy(&[(1, "2s")]));
    let _c = Cleanup::new(&s);
    declare(&s).await;
    let t = topology(&s);
    let ladder = t.ladder();
    let mut every: Vec<(String, String)> = (0..ladder.levels)
        .map(|n| (ladder.queue(n), ladder.exchange(n)))
        .collect();
    every.push((s.amqp.jobs_queue.clone(), s.amqp.jobs_exchange.clone()));
    let every: Vec<(&str, &str)> = every
        .iter()
        .map(|(q, x)| (q.as_str(), x.as_str()))
        .collect();
    let conn = amqp().await;
    let zone = noon_zone();

    // control: straight into the ladder for 1 s with x-death kept, no worker running
    let control = audit::job_body(&format!("{ns}-control"), "c", "sms", "transactional", &zone);
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    let mut headers = x_death(&every);
    ladder.mark(&mut headers, 1);
    p.publish(
        "",
        &ladder.entry(1),
        &control,
        lapin::BasicProperties::default()
            .with_message_id(format!("{ns}-control").as_str().into())
            .with_headers(headers),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    let control_back = audit::drain(&conn, &s.amqp.jobs_queue).await.len();
    let control_still_waiting = depth(&conn, &ladder.queue(0)).await.unwrap_or(0);

    // the scenario: the recipient is at its cap; the republished job is refused,
    // delayed about 2 s, and must come back and be dispatched
    let first = Published {
        id: format!("{ns}-first"),
        recipient: "x".into(),
        body: audit::job_body(&format!("{ns}-first"), "x", "sms", "rolling", &zone),
    };
    let stale = Published {
        id: format!("{ns}-stale"),
        recipient: "x".into(),
        body: audit::job_body(&format!("{ns}-stale"), "x", "sms", "rolling", &zone),
    };
    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w).await;
    publish_all(&conn, &s, std::slice::from_ref(&first)).await;
    let mut h = x_death(&every);
    h.insert(
        quota_worker::job::headers::ATTEMPT.into(),
        lapin::types::AMQPValue::LongLongInt(7),
    );
    // and a stale routing bit of the delay ladder: kept, it would send the job to
    // the 2^19 s (six-day) queue instead of a 2 s wait
    h.insert(
        format!("{}19", quota_worker::amqp::ladder::BIT_PREFIX).into(),
        lapin::types::AMQPValue::LongString("1".into()),
    );
    publish_with(
        &conn,
        &s,
        &stale.body,
        lapin::BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(stale.id.as_str().into())
            .with_headers(h),
    )
    .await;
    let dispatch = t.dispatch_queue("sms");
    let started = Instant::now();
    while depth(&conn, &dispatch).await.unwrap_or(0) < 2
        && started.elapsed() < Duration::from_secs(20)
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back_after = started.elapsed();
    stop.cancel();
    handle.await.unwrap();
    let jobs = vec![first, stale.clone()];
    let dispatched = audit::drain(&conn, &dispatch).await;
    let a = Audit::collect(&conn, &s, &jobs).await;
    let stale_copy = dispatched.iter().find(|m| m.id == stale.id);
    record(json!({
        "scenario": "stale_x_death",
        "test": "tests/faults/stale_x_death.rs: stale_x_death_headers_do_not_get_a_delayed_job_dropped",
        "jobs": 2,
        "lost": (stale_copy.is_none() && a.lost(&jobs).contains(&stale.id)) as u32,
        "duplicates": dispatched.len().saturating_sub(2),
        "violations": 0,
        "stale_job_dispatched_after_seconds": back_after.as_secs_f64(),
        "control_with_x_death_kept_came_back": control_back > 0,
        "control_still_in_ladder": control_still_waiting,
    }));
    eprintln!("control copy with x-death kept: came back {control_back}, still waiting {control_still_waiting}");
    let stale_copy = stale_copy.expect("the job with stale x-death headers was dispatched");
    assert_eq!(dispatched.len(), 2, "{dispatched:?}");
    let h = stale_copy.props.headers().as_ref().unwrap();
    assert!(!h.contains_key("x-death") && !h.contains_key("x-first-death-queue"));
    assert!(h.inner().keys().all(|k| !k
        .as_str()
        .starts_with(quota_worker::amqp::ladder::BIT_PREFIX)));
    assert_eq!(
        header(&stale_copy.props, "trace-id").as_deref(),
        Some("kept")
    );
    assert_eq!(
        header(&stale_copy.props, "x-notify-attempt").as_deref(),
        Some("9")
    );
}
