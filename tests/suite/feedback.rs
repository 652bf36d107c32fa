//! Feedback from the senders, end to end through RabbitMQ and Redis: each event,
//! the same feedback twice, bad feedback, suppression by kind (with the
//! `transactional` exception), and a provider's 429 pausing a channel for every
//! worker, then ramping back.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use lapin::Connection;
use quota_worker::config::Settings;
use quota_worker::feedback::apply;
use quota_worker_producer::{Event, Feedback, FeedbackPublisher};
use testkit::*;

/// Publish `f` (confirmed) to the test's feedback exchange.
pub(crate) async fn send(conn: &Connection, s: &Settings, f: &Feedback) {
    let p = FeedbackPublisher::open(conn, &s.feedback.exchange, Duration::from_secs(10))
        .await
        .unwrap();
    p.publish(f).await.expect("feedback confirmed");
}

/// Wait until the worker noted `event` for job `id` (`admin job` shows it).
pub(crate) async fn heard(s: &Settings, id: &str, event: Event) {
    let keys = s.redis.keys();
    let client = redis::Client::open(redis_url()).unwrap();
    let conn = quota_worker::redis::RedisConn::Single(
        redis::aio::ConnectionManager::new(client).await.unwrap(),
    );
    wait_for(
        &format!("the worker to hear `{}` about {id}", event.as_str()),
        Duration::from_secs(10),
        || {
            let (conn, keys) = (conn.clone(), keys.clone());
            let id = id.to_string();
            async move {
                apply::notes(&conn, &keys, &id)
                    .await
                    .unwrap()
                    .iter()
                    .any(|n| n.event == event.as_str())
            }
        },
    )
    .await;
}

fn job(id: &str, recipient: &str, channel: &str, category: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","recipient":"{recipient}","channel":"{channel}","category":"{category}"}}"#
    )
    .into_bytes()
}

async fn dispatched(conn: &Connection, s: &Settings, channel: &str) -> Option<String> {
    let q = format!("{}{channel}", s.amqp.dispatch_queue_prefix);
    take(conn, &q, Duration::from_secs(5))
        .await
        .map(|m| message_id(&m).to_string())
}

async fn dead(conn: &Connection, s: &Settings) -> Option<(String, String, String)> {
    let m = take(conn, &s.amqp.dead_queue, Duration::from_secs(5)).await?;
    let p = &m.delivery.properties;
    Some((
        message_id(&m).to_string(),
        header(p, "x-notify-reason").unwrap_or_default(),
        header(p, "x-notify-detail").unwrap_or_default(),
    ))
}

async fn recorded_sends(s: &Settings, recipient: &str, policy: &str) -> usize {
    let keys = s.redis.keys();
    let client = redis::Client::open(redis_url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    testkit::audit::recorded(&mut c, &keys.recipient(recipient, policy, None))
        .await
        .len()
}

#[tokio::test]
async fn failed_gives_the_send_back_once_and_the_job_goes_again() {
    let ns = unique("fb-failed");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w).await;

    publish(&conn, &s, &job("j1", "r1", "sms", "default")).await;
    assert_eq!(dispatched(&conn, &s, "sms").await.as_deref(), Some("j1"));
    // a copy of it is a duplicate, and the cap (1 a day) is spent
    publish(&conn, &s, &job("j1", "r1", "sms", "default")).await;
    publish(&conn, &s, &job("j2", "r1", "sms", "default")).await;
    assert_eq!(dispatched(&conn, &s, "sms").await, None);
    assert_eq!(recorded_sends(&s, "r1", "default").await, 1);

    let failed = Feedback {
        detail: Some("provider 503".into()),
        ..Feedback::new("j1", Event::Failed, "r1", "sms")
    };
    send(&conn, &s, &failed).await;
    heard(&s, "j1", Event::Failed).await;
    assert_eq!(recorded_sends(&s, "r1", "default").await, 0, "given back");

    // republished: through the caps again as a new attempt, dispatched once more
    publish(&conn, &s, &job("j1", "r1", "sms", "default")).await;
    assert_eq!(dispatched(&conn, &s, "sms").await.as_deref(), Some("j1"));
    assert_eq!(recorded_sends(&s, "r1", "default").await, 1);
    // the same feedback again changes nothing: the new attempt stays counted
    send(&conn, &s, &failed).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(recorded_sends(&s, "r1", "default").await, 1, "counted once");
    // and a failed about a job never sent changes nothing either
    send(
        &conn,
        &s,
        &Feedback::new("never", Event::Failed, "r1", "sms"),
    )
    .await;
    heard(&s, "never", Event::Failed).await;
    assert_eq!(recorded_sends(&s, "r1", "default").await, 1);
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn suppressions_hold_jobs_by_kind_and_transactional_only_by_bounces() {
    let ns = unique("fb-supp");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules.clear();
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    assert!(!w.store().checks_suppressions(), "nothing suppressed yet");

    send(&conn, &s, &Feedback::new("b0", Event::Bounced, "rb", "sms")).await;
    send(
        &conn,
        &s,
        &Feedback::new("u0", Event::Unsubscribed, "ru", "sms"),
    )
    .await;
    send(
        &conn,
        &s,
        &Feedback::new("c0", Event::Complained, "rc", "sms"),
    )
    .await;
    heard(&s, "b0", Event::Bounced).await;
    heard(&s, "u0", Event::Unsubscribed).await;
    heard(&s, "c0", Event::Complained).await;
    assert!(w.store().checks_suppressions());

    // (job, recipient, channel, category, dispatched?)
    let cases = [
        ("b-promo", "rb", "sms", "default", false),
        ("b-receipt", "rb", "sms", "transactional", false),
        ("b-email", "rb", "email", "default", true),
        ("u-promo", "ru", "sms", "default", false),
        ("u-receipt", "ru", "sms", "transactional", true),
        ("c-promo", "rc", "sms", "default", false),
        ("c-receipt", "rc", "sms", "transactional", true),
        ("other", "r-free", "sms", "default", true),
    ];
    for (id, r, ch, cat, _) in cases {
        publish(&conn, &s, &job(id, r, ch, cat)).await;
    }
    let mut sent = Vec::new();
    for ch in ["sms", "email"] {
        while let Some(id) = dispatched(&conn, &s, ch).await {
            sent.push(id);
        }
    }
    let mut deads = Vec::new();
    while let Some(d) = dead(&conn, &s).await {
        deads.push(d);
    }
    for (id, _, _, _, goes) in cases {
        assert_eq!(sent.contains(&id.to_string()), goes, "{id}: sent {sent:?}");
        if !goes {
            let (_, reason, detail) = deads.iter().find(|d| d.0 == id).expect(id);
            assert_eq!(reason, "suppressed", "{id}");
            let kind = match &id[..1] {
                "b" => "bounced",
                "u" => "unsubscribed",
                _ => "complained",
            };
            assert!(
                detail.contains(kind) && detail.contains("since"),
                "{detail}"
            );
        }
    }
    assert_eq!(deads.len(), 4);
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn a_bounce_lapses_after_its_ttl_and_an_opt_out_stays() {
    let ns = unique("fb-ttl");
    let mut s = settings(&ns);
    s.suppression.bounced_ttl = quota_worker::config::Dur(Duration::from_secs(1));
    let store = quota_worker::store::QuotaStore::connect(&s).await.unwrap();
    let _g = RedisGuard(ns.clone());
    let t = apply::Tuning::from_settings(&s);
    for (id, e) in [("b", Event::Bounced), ("u", Event::Unsubscribed)] {
        let f = Feedback::new(id, e, "r", if id == "b" { "sms" } else { "email" });
        assert!(matches!(
            apply::apply(&store, &t, &f).await.unwrap(),
            apply::Applied::First { .. }
        ));
        assert_eq!(
            apply::apply(&store, &t, &f).await.unwrap(),
            apply::Applied::Again
        );
    }
    let conn = store.connection();
    let now = apply::suppressions(&conn, store.keys(), "r").await.unwrap();
    assert_eq!(now.len(), 2, "{now:?}");
    let bounce = now.iter().find(|(c, _)| c == "sms").unwrap().1;
    assert!(bounce.until.is_some());
    tokio::time::sleep(Duration::from_millis(1300)).await;
    let later = apply::suppressions(&conn, store.keys(), "r").await.unwrap();
    assert_eq!(later.len(), 1, "{later:?}");
    assert_eq!(later[0].0, "email");
    assert_eq!(later[0].1.until, None);
}

#[tokio::test]
async fn bad_feedback_is_dead_lettered_and_changes_nothing() {
    let ns = unique("fb-bad");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    let bodies: [&[u8]; 4] = [
        b"not json",
        br#"{"id":"x","event":"opened","recipient":"r","channel":"sms"}"#,
        br#"{"id":"x","event":"bounced","channel":"sms"}"#,
        br#"{"id":"x","event":"bounced","recipient":"r","channel":"fax"}"#,
    ];
    for body in bodies {
        p.publish(&s.feedback.exchange, "", body, Default::default())
            .await
            .unwrap();
    }
    let mut reasons = Vec::new();
    for _ in 0..bodies.len() {
        let (_, reason, detail) = dead(&conn, &s).await.expect("a dead letter");
        assert!(!detail.is_empty());
        reasons.push(reason);
    }
    assert!(
        reasons.iter().all(|r| r == "malformed_feedback"),
        "{reasons:?}"
    );
    // nothing was suppressed: no key but the worker's reset marker
    let mut r = redis_sync();
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{ns}:*"))
        .query(&mut r)
        .unwrap();
    keys.retain(|k| !k.ends_with("{reset}/marker"));
    assert!(keys.is_empty(), "{keys:?}");
    assert!(!w.store().checks_suppressions());
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn delivered_is_noted_with_its_time_and_counted_once() {
    let ns = unique("fb-deliv");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    publish(&conn, &s, &job("d1", "rd", "push", "default")).await;
    assert_eq!(dispatched(&conn, &s, "push").await.as_deref(), Some("d1"));
    // the one-step entry point: the first copy applies, the second changes nothing
    let f = Feedback::new("d1", Event::Delivered, "rd", "push");
    let body = serde_json::to_vec(&f).unwrap();
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    stop.cancel();
    handle.await.unwrap();
    let mut handled = Vec::new();
    for _ in 0..2 {
        p.publish(&s.feedback.exchange, "", &body, Default::default())
            .await
            .unwrap();
        let m = take(&conn, &s.feedback.queue, Duration::from_secs(5))
            .await
            .expect("feedback queued");
        let token = tokio_util::sync::CancellationToken::new();
        handled.push(w.feedback.handle(&p, &m.delivery, &token).await.unwrap());
    }
    use quota_worker::feedback::Handled;
    assert_eq!(
        handled,
        [
            Handled::Applied(Event::Delivered),
            Handled::Again(Event::Delivered)
        ]
    );
    let keys = s.redis.keys();
    let notes = apply::notes(&w.store().connection(), &keys, "d1")
        .await
        .unwrap();
    assert_eq!(notes.len(), 1);
    assert!(notes[0].at.is_some(), "{notes:?}");
    // delivered leaves the send counted
    assert_eq!(recorded_sends(&s, "rd", "default").await, 1);
}

#[tokio::test]
async fn throttled_pauses_the_channel_for_every_worker_then_ramps_back() {
    // the issue's figure: 100 jobs/s over three workers, retry_after 5 s
    const RATE: u64 = 100;
    let ns = unique("fb-429");
    let mut s = settings(&ns);
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(RATE);
    sms.burst = Some(2);
    s.feedback.ramp = quota_worker::config::Dur(Duration::from_secs(3));
    let _c = Cleanup::new(&s);
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(spawn_worker(worker(&s).await).await);
    }
    let conn = amqp().await;
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    for i in 0..(RATE as usize * 13) {
        p.publish(
            &s.amqp.jobs_exchange,
            "",
            &job(&format!("t-{i}"), &format!("r-{i}"), "sms", "transactional"),
            Default::default(),
        )
        .await
        .unwrap();
    }
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            format!("{ns}.dispatch.sms").as_str().into(),
            "throttle-test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let mut arrivals = Vec::new();
    let mut throttled_at = None;
    while started.elapsed() < Duration::from_secs(12) {
        if throttled_at.is_none() && started.elapsed() > Duration::from_millis(1500) {
            let f = Feedback {
                retry_after: Some(5.0),
                ..Feedback::new("t-0", Event::Throttled, "r-0", "sms")
            };
            send(&conn, &s, &f).await;
            throttled_at = Some(Instant::now());
        }
        if let Ok(Some(Ok(d))) =
            tokio::time::timeout(Duration::from_millis(100), consumer.next()).await
        {
            arrivals.push(Instant::now());
            d.ack(BasicAckOptions::default()).await.unwrap();
        }
    }
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    let t0 = throttled_at.unwrap();
    let at = |t: &Instant| t.saturating_duration_since(t0).as_secs_f64();
    let before = arrivals.iter().filter(|t| **t < t0).count();
    // the largest gap after the feedback: the pause (5 s, less the time the
    // feedback took to reach a worker; generous tolerance)
    // (from the feedback's publish on: 0.0)
    let after: Vec<f64> = [0.0]
        .into_iter()
        .chain(arrivals.iter().filter(|t| **t >= t0).map(at))
        .collect();
    let (gap_start, gap) = after
        .windows(2)
        .map(|w| (w[0], w[1] - w[0]))
        .fold((0.0, 0.0), |m, g| if g.1 > m.1 { g } else { m });
    let resume = gap_start + gap;
    println!("before {before}, pause {gap:.3}s from {gap_start:.3}s, resumed at {resume:.3}s");
    assert!(before > 10, "jobs flowed before the throttle: {before}");
    assert!(
        gap_start < 0.5,
        "paused soon after the feedback: {gap_start}"
    );
    assert!((4.6..5.6).contains(&gap), "a pause of about 5 s: {gap}");
    // the ramp: the first second after the resume carries fewer than the
    // configured rate, the second after the ramp about all of it
    let count = |from: f64, to: f64| after.iter().filter(|t| **t >= from && **t < to).count();
    let early = count(resume, resume + 1.0);
    let late = count(resume + 3.2, resume + 4.2);
    let steady = arrivals
        .iter()
        .filter(|t| **t < t0 && t0.duration_since(**t) < Duration::from_secs(1))
        .count();
    let later = count(resume + 4.2, resume + 5.2);
    println!(
        "the second before the throttle {steady}; first second after the resume {early}, \
         seconds after the ramp {late}, {later}"
    );
    assert!(early < late, "ramping back: {early} then {late}");
    assert!(early > 0, "some went in the first second");
}

#[tokio::test]
async fn the_admin_shows_edits_suppressions_and_a_jobs_feedback() {
    use crate::cli::{run_async, stdout};
    let ns = unique("fb-admin");
    let s = settings(&ns);
    let _g = RedisGuard(ns.clone());
    let out = run_async(
        &s,
        &[
            "admin",
            "recipient",
            "+331",
            "suppress",
            "--channel",
            "sms",
            "--event",
            "unsubscribed",
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let shown = run_async(
        &s,
        &["admin", "recipient", "+331", "--channel", "sms", "--json"],
        None,
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    let supp = v["suppressions"].as_array().unwrap();
    assert_eq!(supp.len(), 1, "{v}");
    assert_eq!(supp[0]["event"], "unsubscribed");
    assert_eq!(supp[0]["channel"], "sms");
    assert!(
        supp[0]["since"].is_string() && supp[0]["until"].is_null(),
        "{v}"
    );
    let bad = run_async(
        &s,
        &[
            "admin",
            "recipient",
            "+331",
            "suppress",
            "--channel",
            "fax",
            "--event",
            "bounced",
        ],
        None,
    )
    .await;
    assert!(!bad.status.success());
    let out = run_async(
        &s,
        &[
            "admin",
            "recipient",
            "+331",
            "unsuppress",
            "--channel",
            "sms",
            "--json",
        ],
        None,
    )
    .await;
    assert!(
        stdout(&out).contains(r#""removed": true"#),
        "{}",
        stdout(&out)
    );
    let shown = run_async(&s, &["admin", "recipient", "+331", "--json"], None).await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&shown)).unwrap();
    assert_eq!(v["suppressions"].as_array().unwrap().len(), 0);

    // a job's feedback
    let store = quota_worker::store::QuotaStore::connect(&s).await.unwrap();
    let f = Feedback {
        detail: Some("provider 503".into()),
        ..Feedback::new("job-7", Event::Failed, "+331", "sms")
    };
    apply::apply(&store, &apply::Tuning::from_settings(&s), &f)
        .await
        .unwrap();
    let out = run_async(&s, &["admin", "job", "job-7", "--json"], None).await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["feedback"][0]["event"], "failed", "{v}");
    assert_eq!(v["feedback"][0]["detail"], "provider 503");
    let out = run_async(&s, &["admin", "job", "job-7"], None).await;
    assert!(
        stdout(&out).contains("feedback:    failed at"),
        "{}",
        stdout(&out)
    );
}

/// The store's side of every event, run on one Redis here and on a Redis Cluster
/// by `cluster`: a burst of admissions (on a cluster, one call per node carrying
/// the other slots' keys) with the suppression check on, a failed send given back
/// and admitted again, and a throttle pausing the channel's rate.
pub(crate) async fn engine_scenario(mut s: Settings) {
    use quota_worker::admission::{Admission, Request};
    use std::sync::Arc;
    s.policies.get_mut("default").unwrap().rules = vec![quota_worker::config::RuleSettings {
        limit: 1,
        window: quota_worker::quota::window::Window::CalendarDays(1),
    }];
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(1000);
    sms.burst = Some(100);
    let store = Arc::new(quota_worker::store::QuotaStore::connect(&s).await.unwrap());
    let t = apply::Tuning::from_settings(&s);
    let req = |id: &'static str, recipient: &'static str, category: &'static str| Request {
        id,
        recipient,
        channel: "sms",
        category,
        tz: chrono_tz::Tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    };
    // suppress four recipients (spread over the slots), then admit twelve at once
    let names: [&'static str; 12] = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"];
    for r in &names[..4] {
        let f = Feedback::new("s", Event::Unsubscribed, r, "sms");
        apply::apply(&store, &t, &f).await.unwrap();
    }
    assert!(store.checks_suppressions());
    let asks = names.iter().map(|r| {
        let store = store.clone();
        async move { store.admit(&req("j", r, "default")).await.unwrap() }
    });
    let answers = futures_util::future::join_all(asks).await;
    for (r, a) in names.iter().zip(&answers) {
        match a {
            Admission::Suppressed(s) if names[..4].contains(r) => {
                assert_eq!(s.kind, quota_worker::quota::suppression::Kind::Unsubscribed)
            }
            Admission::Admitted(_) if !names[..4].contains(r) => {}
            other => panic!("{r}: {other:?}"),
        }
    }
    // a transactional job of a suppressed recipient goes (held by bounces only)
    assert!(matches!(
        store.admit(&req("t", "a", "transactional")).await.unwrap(),
        Admission::Admitted(_)
    ));
    // failed: the send of `e` given back; the same job is admitted again, once
    let Admission::Admitted(ticket) = &answers[4] else {
        unreachable!()
    };
    store.commit(ticket).await.unwrap();
    assert!(matches!(
        store.admit(&req("j", "e", "default")).await.unwrap(),
        Admission::Duplicate
    ));
    let failed = Feedback::new("j", Event::Failed, "e", "sms");
    assert!(matches!(
        apply::apply(&store, &t, &failed).await.unwrap(),
        apply::Applied::First { at_ms, .. } if at_ms > 0
    ));
    assert_eq!(
        apply::apply(&store, &t, &failed).await.unwrap(),
        apply::Applied::Again
    );
    assert!(matches!(
        store.admit(&req("j", "e", "default")).await.unwrap(),
        Admission::Admitted(_)
    ));
    // throttled: the channel's rate refuses until the resume, for everyone
    let mut f = Feedback::new("j", Event::Throttled, "e", "sms");
    f.retry_after = Some(1.5);
    let Ok(apply::Applied::First { now_ms, at_ms }) = apply::apply(&store, &t, &f).await else {
        panic!("throttle applied")
    };
    assert!(
        (1400..=1600).contains(&(at_ms - now_ms)),
        "{}",
        at_ms - now_ms
    );
    let rate = store.rules().channel("sms").unwrap().rate.unwrap();
    let r = store.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!(r.allowed, 0);
    assert!(
        r.retry_after > Duration::from_millis(1300),
        "{:?}",
        r.retry_after
    );
    assert_eq!(
        apply::apply(&store, &t, &f).await.unwrap(),
        apply::Applied::Again
    );
}

#[tokio::test]
async fn every_event_in_the_store() {
    let ns = unique("fb-engine");
    let _g = RedisGuard(ns.clone());
    engine_scenario(settings(&ns)).await;
}

/// What one suppressed recipient costs in Redis (printed for BENCHMARKS.md/README).
#[tokio::test]
async fn memory_per_suppressed_recipient() {
    let ns = unique("fb-mem");
    let s = settings(&ns);
    let _g = RedisGuard(ns.clone());
    let store = quota_worker::store::QuotaStore::connect(&s).await.unwrap();
    let t = apply::Tuning::from_settings(&s);
    let mut r = redis_sync();
    let mut sizes = Vec::new();
    for (e, ch) in [(Event::Bounced, "sms"), (Event::Unsubscribed, "email")] {
        let f = Feedback::new("m", e, "+8613800000000", ch);
        apply::apply(&store, &t, &f).await.unwrap();
        let hash = store.keys().suppressed("+8613800000000");
        let mark = store
            .keys()
            .feedback_mark("+8613800000000", "m", e.as_str(), ch);
        let h: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&hash)
            .query(&mut r)
            .unwrap();
        let m: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&mark)
            .query(&mut r)
            .unwrap();
        sizes.push((h, m));
    }
    println!(
        "MEMORY USAGE: suppressions hash {} bytes with one channel, {} with two; \
         each feedback mark {} bytes (for feedback.dedupe_window)",
        sizes[0].0, sizes[1].0, sizes[0].1
    );
    assert!(sizes[0].0 > 0 && sizes[0].0 < 200, "{sizes:?}");
}

/// `examples/python/sender.py` against a worker in this process: it consumes the
/// dispatch queue, calls its fake provider (200, 503, 429 then 200, 410) and
/// publishes the feedback, and the worker acts on each.
#[tokio::test]
async fn the_python_sender_closes_the_loop() {
    let pika = std::process::Command::new("python3")
        .args(["-c", "import pika"])
        .output();
    if !pika.map(|o| o.status.success()).unwrap_or(false) {
        eprintln!("SKIPPED: python3 cannot import pika; `python3 -m pip install -r examples/python/requirements.txt`");
        return;
    }
    let ns = unique("fb-py");
    let mut s = settings(&ns);
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(50);
    sms.burst = Some(5);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    for (id, r) in [
        ("ok-1", "ok-a"),
        ("fail-1", "fail-a"),
        ("slow-1", "slow-a"),
        ("bounce-1", "bounce-a"),
    ] {
        publish(&conn, &s, &job(id, r, "sms", "default")).await;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/python/sender.py");
    let env = testkit::env::env_for(&s);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args([script, "--channel", "sms", "--idle", "3"])
            .envs(env)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<&str> = printed.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "bounce-1 bounced",
            "fail-1 failed",
            "ok-1 delivered",
            "slow-1 delivered",
            "slow-1 throttled"
        ]
    );
    for (id, e) in [
        ("ok-1", Event::Delivered),
        ("fail-1", Event::Failed),
        ("slow-1", Event::Throttled),
        ("slow-1", Event::Delivered),
        ("bounce-1", Event::Bounced),
    ] {
        heard(&s, id, e).await;
    }
    // failed: given back; bounced: the next job of that address is dead-lettered
    assert_eq!(recorded_sends(&s, "fail-a", "default").await, 0);
    assert_eq!(recorded_sends(&s, "ok-a", "default").await, 1);
    publish(
        &conn,
        &s,
        &job("bounce-2", "bounce-a", "sms", "transactional"),
    )
    .await;
    let (id, reason, _) = dead(&conn, &s).await.expect("dead-lettered");
    assert_eq!((id.as_str(), reason.as_str()), ("bounce-2", "suppressed"));
    stop.cancel();
    handle.await.unwrap();
}
