//! Send windows, scheduled sends and the bound on waiting, end to end through
//! RabbitMQ and Redis: where a held job goes, until when, and what its headers say.

use std::time::Duration;

use chrono::{DateTime, Datelike, TimeZone, Timelike, Utc};
use chrono_tz::Tz;
use quota_worker::config::{PolicySettings, RuleSettings};
use quota_worker::job::{Outcome, Reason};
use quota_worker::quota::send_windows::SendWindows;
use quota_worker::quota::window;
use testkit::*;

fn job(id: &str, zone: &str, extra: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"r-{id}","channel":"sms","timezone":"{zone}"{extra}}}"#)
        .into_bytes()
}

/// One opening `[from, from + 1 h)` on the weekday of `from`, local time in `tz`.
fn opening_at(tz: Tz, from: DateTime<Utc>) -> SendWindows {
    let local = from.with_timezone(&tz);
    let to = local + chrono::Duration::hours(1);
    let day = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
        [local.weekday().num_days_from_monday() as usize];
    let text = format!(
        "{day} {:02}:{:02}-{:02}:{:02}",
        local.hour(),
        local.minute(),
        to.hour(),
        to.minute()
    );
    SendWindows::new(vec![text.parse().unwrap()])
}

/// The next whole minute at least `lead` from now.
fn next_minute(lead: Duration) -> DateTime<Utc> {
    let t = Utc::now() + chrono::Duration::from_std(lead).unwrap();
    let ms = t.timestamp_millis();
    window::from_millis(ms - ms.rem_euclid(60_000) + 60_000)
}

/// The delayed message of this test's ladder (taken off it), found level by level.
async fn take_delayed(
    conn: &lapin::Connection,
    s: &quota_worker::config::Settings,
) -> lapin::message::BasicGetMessage {
    let ladder = topology(s).ladder();
    for n in 0..ladder.levels {
        if let Some(m) = take(conn, &ladder.queue(n), Duration::from_millis(100)).await {
            return m;
        }
    }
    panic!("nothing in the delay ladder");
}

#[tokio::test]
async fn a_job_outside_its_window_is_held_to_the_next_opening_in_its_zone() {
    let ns = unique("window");
    let mut s = settings(&ns);
    let tz: Tz = "Asia/Kathmandu".parse().unwrap();
    let opens = next_minute(Duration::from_secs(10));
    s.channels.get_mut("sms").unwrap().send_windows = Some(opening_at(tz, opens));
    let (_c, w, conn) = rig(&s).await;
    publish(&conn, &s, &job("w1", "Asia/Kathmandu", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Delayed { until: opens });
    // a transactional job is not held by the channel's windows
    publish(
        &conn,
        &s,
        &job("t1", "Asia/Kathmandu", r#","category":"transactional""#),
    )
    .await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    assert!(
        Utc::now() < opens,
        "the window opened during the test's first steps"
    );
    let early = take(&conn, &topology(&s).dispatch_queue("sms"), WAIT)
        .await
        .unwrap();
    assert_eq!(message_id(&early), "t1");

    // it comes back at the opening and is dispatched then, not before
    let (stop, handle) = spawn_worker(w.clone()).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let m = take(&conn, &dispatch, Duration::from_secs(90))
        .await
        .expect("dispatched at the opening");
    let arrived = Utc::now();
    stop.cancel();
    handle.await.unwrap();
    assert_eq!(message_id(&m), "w1");
    assert!(
        arrived >= opens,
        "arrived {arrived} before the opening {opens}"
    );
    assert!(
        arrived - opens < chrono::Duration::seconds(5),
        "arrived {arrived}, {} after the opening",
        arrived - opens
    );
    // the header that said what held it stays behind
    assert_eq!(header(&m.delivery.properties, "x-notify-held-by"), None);
}

#[tokio::test]
async fn a_capped_job_held_overnight_comes_out_at_the_windows_opening() {
    let ns = unique("overnight");
    let mut s = settings(&ns);
    // one a local day, sent only 08:00-21:00 on any day, in a zone where it is noon now
    let zone = testkit::audit::noon_zone();
    let tz: Tz = zone.parse().unwrap();
    s.policies.insert(
        "reminder".into(),
        PolicySettings {
            rules: vec![RuleSettings {
                limit: 1,
                window: "1d".parse().unwrap(),
            }],
            send_windows: Some(SendWindows::new(vec!["daily 08:00-21:00".parse().unwrap()])),
            ..Default::default()
        },
    );
    let (_c, w, conn) = rig(&s).await;
    let cat = r#","category":"reminder""#;
    let body = |id: &str| {
        format!(r#"{{"id":"{id}","recipient":"same","channel":"sms","timezone":"{zone}"{cat}}}"#)
            .into_bytes()
    };
    publish(&conn, &s, &body("first")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    publish(&conn, &s, &body("second")).await;
    let outcome = step(&w, &conn, &s).await;
    // the cap allows it at the next local midnight; the window opens at 08:00
    let tomorrow = window::local_date(tz, Utc::now()).succ_opt().unwrap();
    let morning = tz
        .from_local_datetime(&tomorrow.and_hms_opt(8, 0, 0).unwrap())
        .single()
        .unwrap()
        .with_timezone(&Utc);
    assert_eq!(outcome, Outcome::Delayed { until: morning });
    let held = take_delayed(&conn, &s).await;
    assert_eq!(message_id(&held), "second");
    assert_eq!(
        header(&held.delivery.properties, "x-notify-held-by").as_deref(),
        Some("policy `reminder` (at most 1 per 1d)")
    );
    assert_eq!(
        header(&held.delivery.properties, "x-notify-not-before"),
        Some(morning.timestamp_millis().to_string())
    );
    // `admin recipient` shows the windows and the same next allowed instant
    let engine = quota_worker::store::QuotaStore::connect(&s).await.unwrap();
    let status = quota_worker::admin::recipients::Recipients::new(&engine, &s)
        .status(&quota_worker::admin::recipients::RecipientQuery {
            recipient: "same",
            category: Some("reminder"),
            channel: None,
            tz,
            tenant: None,
        })
        .await
        .unwrap();
    let p = &status.policies[0];
    assert_eq!(
        p.send_windows,
        ["policy: mon,tue,wed,thu,fri,sat,sun 08:00-21:00"]
    );
    assert_eq!(p.next_allowed.as_ref().map(|n| n.utc), Some(morning));
}

#[tokio::test]
async fn a_scheduled_job_arrives_at_its_time() {
    let ns = unique("schedule");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let at = window::from_millis((Utc::now() + chrono::Duration::seconds(3)).timestamp_millis());
    let extra = format!(r#","not_before":"{}""#, at.to_rfc3339());
    publish(&conn, &s, &job("s1", "UTC", &extra)).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Delayed { until: at });
    let (stop, handle) = spawn_worker(w.clone()).await;
    let m = take(
        &conn,
        &topology(&s).dispatch_queue("sms"),
        Duration::from_secs(20),
    )
    .await
    .expect("dispatched at its time");
    let arrived = Utc::now();
    stop.cancel();
    handle.await.unwrap();
    assert_eq!(message_id(&m), "s1");
    assert!(arrived >= at, "arrived {arrived}, scheduled {at}");
    assert!(
        arrived - at < chrono::Duration::seconds(5),
        "arrived {arrived}, scheduled {at}"
    );
    // a schedule in the past is no schedule
    let past = (Utc::now() - chrono::Duration::hours(1)).to_rfc3339();
    publish(
        &conn,
        &s,
        &job("s2", "UTC", &format!(r#","not_before":"{past}""#)),
    )
    .await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
}

#[tokio::test]
async fn a_job_that_would_wait_longer_than_max_wait_is_dead_lettered_capped() {
    let ns = unique("maxwait");
    let mut s = settings(&ns);
    let zone = testkit::audit::noon_zone();
    s.policies.get_mut("default").unwrap().max_wait =
        Some(quota_worker::config::Dur(Duration::from_secs(3600)));
    let (_c, w, conn) = rig(&s).await;
    let body = |id: &str| {
        format!(r#"{{"id":"{id}","recipient":"same","channel":"sms","timezone":"{zone}"}}"#)
            .into_bytes()
    };
    publish(&conn, &s, &body("first")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    // the daily cap holds the second until local midnight, twelve hours away
    publish(&conn, &s, &body("second")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::Capped));
    let dead = take(&conn, &s.amqp.dead_queue, WAIT)
        .await
        .expect("dead letter");
    let detail = header(&dead.delivery.properties, "x-notify-detail").unwrap();
    assert!(detail.contains("max_wait of 1h"), "{detail}");
    let tz: Tz = zone.parse().unwrap();
    let midnight = window::next_day_start(tz, Utc::now());
    assert!(detail.contains(&midnight.to_rfc3339()), "{detail}");
}

const WAIT: Duration = Duration::from_secs(10);

/// The tests' shifted clock (testkit::clock) moves a private Redis's `TIME`, which the
/// scripts read, to the chosen instant, and the clock moves on from there.
#[test]
fn a_shifted_clock_moves_the_time_redis_reads() {
    let at = Utc.with_ymd_and_hms(2027, 3, 28, 0, 59, 50).unwrap();
    let clock = testkit::clock::ShiftedClock::at(at);
    let redis = procs::RedisServer::with_clock(&clock);
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(&mut redis.connection()).unwrap();
    let seen = window::from_millis(secs * 1000 + micros / 1000);
    let drift = (seen - at).num_milliseconds();
    assert!(
        (0..5_000).contains(&drift),
        "Redis reads {seen}, {drift} ms from {at}"
    );
    assert!((clock.now() - seen).num_milliseconds().abs() < 1_000);
}
