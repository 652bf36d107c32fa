//! Waiting jobs, end to end through RabbitMQ and Redis: cancelled from any level of
//! the delay ladder, superseded by a newer job with the same collapse key, explained
//! by `admin job`, and counted per recipient by `admin recipient`.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::cli::run;
use chrono::Utc;
use quota_worker::admin::{JobStatus, Jobs, RecipientQuery, Recipients};
use quota_worker::config::{PolicySettings, RuleSettings, Settings};
use quota_worker::job::note::{JobState, Place};
use quota_worker::job::Outcome;
use quota_worker::store::QuotaStore;
use testkit::*;

async fn explain(engine: &QuotaStore, s: &Settings, id: &str) -> JobStatus {
    Jobs::new(engine, s).explain(id).await.unwrap()
}

async fn waiting(engine: &QuotaStore, s: &Settings, recipient: &str) -> Option<u64> {
    let q = RecipientQuery {
        recipient,
        category: None,
        channel: None,
        tz: chrono_tz::UTC,
        tenant: None,
    };
    Recipients::new(engine, s).status(&q).await.unwrap().waiting
}

/// The reason of every dead letter that arrives within `within`, by job id, until
/// `n` have.
async fn dead_letters(
    conn: &lapin::Connection,
    s: &Settings,
    n: usize,
    within: Duration,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + within;
    while out.len() < n && std::time::Instant::now() < deadline {
        if let Some(m) = take(conn, &s.amqp.dead_queue, Duration::from_millis(200)).await {
            let reason = header(&m.delivery.properties, "x-notify-reason").unwrap_or_default();
            out.push((message_id(&m).to_string(), reason));
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn a_cancelled_job_ends_cancelled_from_any_delay_level() {
    let ns = unique("cancel");
    let mut s = settings(&ns);
    // three levels (4 s, 2 s, 1 s): a job scheduled an hour ahead goes round every
    // 7 s, through each level in turn
    s.amqp.delay_levels = 3;
    let (_c, w, conn) = rig(&s).await;
    let engine = QuotaStore::connect(&s).await.unwrap();
    let (stop, handle) = spawn_worker(w.clone()).await;
    let later = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let body = |id: &str| {
        format!(r#"{{"id":"{id}","recipient":"held","channel":"sms","not_before":"{later}"}}"#)
            .into_bytes()
    };
    // staggered, so that at some moment each sits at another level
    for (id, pause) in [("c1", 1500), ("c2", 3000), ("c3", 0)] {
        publish(&conn, &s, &body(id)).await;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    let ids = ["c1", "c2", "c3"];
    let mut levels = BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while levels.len() < 3 && std::time::Instant::now() < deadline {
        levels.clear();
        for id in ids {
            if let Place::DelayQueue { queue } = explain(&engine, &s, id).await.place {
                levels.insert(queue);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ladder = topology(&s).ladder();
    let all: BTreeSet<String> = (0..3).map(|n| ladder.queue(n)).collect();
    assert_eq!(
        levels, all,
        "the three jobs were never at three levels at once"
    );
    let status = explain(&engine, &s, "c1").await;
    match status.record.as_ref().map(|r| &r.step) {
        Some(JobState::Delayed { cause, held_by, .. }) => {
            assert_eq!(
                (cause.as_str(), held_by.as_str()),
                ("schedule", "its not_before")
            );
        }
        other => panic!("c1 should be noted as delayed, not {other:?}"),
    }
    assert_eq!(waiting(&engine, &s, "held").await, Some(3));

    // cancel them where they are: c1 and c2 through the library, c3 through the CLI
    let jobs = Jobs::new(&engine, &s);
    for id in ["c1", "c2"] {
        let done = jobs.cancel(id).await.unwrap();
        assert!(!done.already);
        assert!(matches!(done.place, Place::DelayQueue { .. }), "{done:?}");
    }
    let out = run(&s, &["admin", "job", "c3", "cancel"], None);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("job `c3` cancelled"), "{text}");
    assert!(jobs.cancel("c3").await.unwrap().already);

    let dead = dead_letters(&conn, &s, 3, Duration::from_secs(30)).await;
    let expected: Vec<(String, String)> = ids
        .iter()
        .map(|id| (id.to_string(), "cancelled".to_string()))
        .collect();
    assert_eq!(dead, expected);
    stop.cancel();
    handle.await.unwrap();
    assert_eq!(depth(&conn, &topology(&s).dispatch_queue("sms")).await, 0);

    // each is noted dead, its mark spent; the recipient has nothing waiting
    let status = explain(&engine, &s, "c2").await;
    assert_eq!(status.place, Place::Dead);
    assert_eq!(status.cancelled_at, None);
    assert!(
        matches!(&status.record.unwrap().step, JobState::Dead { reason, detail }
            if reason == "cancelled" && detail.starts_with("cancelled by an operator at ")),
    );
    assert_eq!(waiting(&engine, &s, "held").await, Some(0));
    // a job that ended cannot be cancelled; the CLI says why
    let out = run(&s, &["admin", "job", "c1", "cancel"], None);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("went to the dead-letter queue (reason `cancelled`)"),
        "{err}"
    );
}

#[tokio::test]
async fn five_jobs_with_one_collapse_key_held_by_a_cap_give_one_dispatch_of_the_newest() {
    let ns = unique("collapse");
    let mut s = settings(&ns);
    s.policies.insert(
        "cart".into(),
        PolicySettings {
            rules: vec![RuleSettings {
                limit: 1,
                window: "4s".parse().unwrap(),
            }],
            ..Default::default()
        },
    );
    let (_c, w, conn) = rig(&s).await;
    let engine = QuotaStore::connect(&s).await.unwrap();
    let body = |id: &str, collapse: &str| {
        format!(
            r#"{{"id":"{id}","recipient":"shopper","channel":"sms","category":"cart"{collapse}}}"#
        )
        .into_bytes()
    };
    // a first send fills the cap; five reminders with one collapse key are held
    publish(&conn, &s, &body("sent", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    let ids = ["r1", "r2", "r3", "r4", "r5"];
    for id in ids {
        publish(&conn, &s, &body(id, r#","collapse_key":"cart""#)).await;
        let outcome = step(&w, &conn, &s).await;
        assert!(
            matches!(outcome, Outcome::Delayed { .. }),
            "{id}: {outcome:?}"
        );
    }
    assert_eq!(waiting(&engine, &s, "shopper").await, Some(5));
    // explained: where, until when, why, with the count it saw
    let status = explain(&engine, &s, "r3").await;
    assert!(
        matches!(status.place, Place::DelayQueue { .. }),
        "{status:?}"
    );
    let record = status.record.unwrap();
    assert_eq!(record.policy.as_deref(), Some("cart"));
    match &record.step {
        JobState::Delayed {
            cause,
            held_by,
            sends_seen,
            ..
        } => {
            assert_eq!(cause, "cap");
            assert_eq!(held_by, "policy `cart` (at most 1 per 4s)");
            assert_eq!(*sends_seen, Some(1));
        }
        other => panic!("{other:?}"),
    }
    // and through the CLI, as JSON
    let out = run(&s, &["admin", "job", "r3", "--json"], None);
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["where"]["place"], "delay_queue");
    assert_eq!(json["record"]["state"], "delayed");
    assert_eq!(json["record"]["cause"], "cap");

    // when they come back, only the newest is sent
    let (stop, handle) = spawn_worker(w.clone()).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let first = take(&conn, &dispatch, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(message_id(&first), "sent");
    let m = take(&conn, &dispatch, Duration::from_secs(30))
        .await
        .expect("the newest reminder dispatched");
    assert_eq!(message_id(&m), "r5");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut superseded = 0;
    while superseded < 4 && std::time::Instant::now() < deadline {
        superseded = 0;
        for id in &ids[..4] {
            let status = explain(&engine, &s, id).await;
            if let Some(JobState::Superseded { by }) = status.record.map(|r| r.step) {
                assert_eq!(by, "r5");
                assert_eq!(status.place, Place::Superseded);
                superseded += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(superseded, 4, "r1 to r4 superseded by r5");
    stop.cancel();
    handle.await.unwrap();
    assert_eq!(depth(&conn, &dispatch).await, 0, "nothing else sent");
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 0, "nothing dead");
    assert_eq!(explain(&engine, &s, "r5").await.place, Place::Dispatched);
    assert_eq!(waiting(&engine, &s, "shopper").await, Some(0));
    // a job never delayed has no record
    assert_eq!(explain(&engine, &s, "sent").await.place, Place::Unknown);
}

#[tokio::test]
async fn with_notes_off_nothing_is_noted_and_a_cancel_still_ends_the_job() {
    let ns = unique("nonotes");
    let mut s = settings(&ns);
    s.redis.notes = false;
    s.amqp.delay_levels = 3;
    let (_c, w, conn) = rig(&s).await;
    let engine = QuotaStore::connect(&s).await.unwrap();
    let at = |secs| (Utc::now() + chrono::Duration::seconds(secs)).to_rfc3339();
    let body = |id: &str, not_before: String| {
        format!(r#"{{"id":"{id}","recipient":"held","channel":"sms","not_before":"{not_before}"}}"#)
            .into_bytes()
    };
    // one job held for an hour, one for two seconds: both wait, the second is sent
    // after its wait
    publish(&conn, &s, &body("c1", at(3600))).await;
    publish(&conn, &s, &body("s1", at(2))).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let m = take(&conn, &dispatch, Duration::from_secs(20))
        .await
        .expect("s1 dispatched after its wait");
    assert_eq!(message_id(&m), "s1");
    // both waited and one ended, and none of it was noted (with notes on, each
    // has a record and c1 an entry in the recipient's waiting set by now: see
    // the tests above)
    let keys = engine.keys();
    let mut r = redis_sync();
    for key in [keys.job("c1"), keys.job("s1"), keys.waiting("held")] {
        let exists: bool = redis::cmd("EXISTS").arg(&key).query(&mut r).unwrap();
        assert!(!exists, "{key} written with notes off");
    }
    let status = explain(&engine, &s, "c1").await;
    assert_eq!((status.place, status.record), (Place::Unknown, None));
    assert_eq!(waiting(&engine, &s, "held").await, None);
    let out = run(&s, &["admin", "recipient", "held"], None);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("waiting jobs not counted (`redis.notes = false`)"),
        "{text}"
    );
    let out = run(&s, &["admin", "recipient", "held", "--json"], None);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["waiting"].is_null(), "{json}");
    let out = run(&s, &["admin", "job", "c1"], None);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("notes:       off (`redis.notes = false`)"),
        "{text}"
    );

    // a cancel needs no note: the job ends `cancelled` and its mark is spent
    let jobs = Jobs::new(&engine, &s);
    assert!(!jobs.cancel("c1").await.unwrap().already);
    let dead = dead_letters(&conn, &s, 1, Duration::from_secs(30)).await;
    assert_eq!(dead, [("c1".to_string(), "cancelled".to_string())]);
    wait_for("c1's cancel mark spent", Duration::from_secs(5), || async {
        explain(&engine, &s, "c1").await.cancelled_at.is_none()
    })
    .await;
    stop.cancel();
    handle.await.unwrap();
    assert_eq!(depth(&conn, &dispatch).await, 0, "nothing else sent");
}

#[tokio::test]
async fn admin_recipient_takes_the_zone_of_the_recipients_waiting_jobs() {
    let ns = unique("zone");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let body = |id: &str| {
        format!(r#"{{"id":"{id}","recipient":"sh","channel":"sms","timezone":"Asia/Shanghai"}}"#)
    };
    // one a day: the first goes, the second waits for Shanghai's midnight
    publish(&conn, &s, body("z1").as_bytes()).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    publish(&conn, &s, body("z2").as_bytes()).await;
    assert!(matches!(step(&w, &conn, &s).await, Outcome::Delayed { .. }));

    let status = |who: &str, extra: &[&str]| {
        let mut args = vec!["admin", "recipient", who, "--json"];
        args.extend_from_slice(extra);
        let out = run(&s, &args, None);
        crate::cli::json(&out)
    };
    let st = status("sh", &[]);
    assert_eq!(st["timezone"], "Asia/Shanghai", "{st}");
    assert_eq!(st["timezone_from"]["source"], "waiting_job", "{st}");
    assert_eq!(st["timezone_from"]["job"], "z2", "{st}");
    let next = st["policies"][0]["next_allowed"]["local"].as_str().unwrap();
    assert!(
        next.ends_with("T00:00:00+08:00"),
        "Shanghai's midnight: {next}"
    );
    // the text says which zone and where it came from
    let text = crate::cli::stdout(&run(&s, &["admin", "recipient", "sh"], None));
    assert!(
        text.contains("zone Asia/Shanghai, from the note of waiting job `z2`"),
        "{text}"
    );
    // --timezone wins; a recipient with no waiting job gets the default
    let st = status("sh", &["--timezone", "Europe/Paris"]);
    assert_eq!(
        (&st["timezone"], &st["timezone_from"]["source"]),
        (&"Europe/Paris".into(), &"option".into())
    );
    let st = status("nobody", &[]);
    assert_eq!(
        (&st["timezone"], &st["timezone_from"]["source"]),
        (&"UTC".into(), &"default".into())
    );
}
