//! The recipients' preferences (issue #38), end to end through the HTTP API,
//! RabbitMQ and Redis: opt-outs by category, channel and the pair dead-letter
//! `opted_out` naming what; a `required` policy passes them; a job waiting in the
//! ladder meets an opt-out made while it waited; every bad-input class answers 400
//! naming its field, a large body 413; the API's 401 and 403; `admin job` says
//! `opted_out` and `quiet_hours`.

use std::sync::Arc;
use std::time::Duration;

use quota_worker::config::Settings;
use quota_worker::http::Guard;
use quota_worker::job::{Outcome, Reason};
use quota_worker::worker::Worker;
use serde_json::{json, Value};
use testkit::*;
use tokio_util::sync::CancellationToken;

/// The preferences API of `worker`, served on a loopback port with `guard`.
async fn serve(s: &Settings, w: &Arc<Worker>, guard: Guard) -> (String, CancellationToken) {
    crate::preference_api::serve(s, w.store(), guard).await
}

/// `method path` with `body` and an optional bearer token: status and JSON body.
async fn call(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, Value) {
    let (status, body) = crate::preference_api::call(addr, method, path, body, token).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn path(recipient: &str) -> String {
    format!("/v1/recipients/{recipient}/preferences")
}

fn job(id: &str, recipient: &str, channel: &str, category: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","recipient":"{recipient}","channel":"{channel}","category":"{category}"}}"#
    )
    .into_bytes()
}

async fn dead_detail(conn: &lapin::Connection, s: &Settings, id: &str) -> String {
    let m = take(conn, &s.amqp.dead_queue, Duration::from_secs(5))
        .await
        .expect("a dead letter");
    assert_eq!(message_id(&m), id);
    let p = &m.delivery.properties;
    assert_eq!(header(p, "x-notify-reason").as_deref(), Some("opted_out"));
    header(p, "x-notify-detail").unwrap_or_default()
}

fn settings_for(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.policies.get_mut("default").unwrap().rules.clear();
    for (name, p) in [("marketing", "default"), ("reminders", "default")] {
        let base = s.policies[p].clone();
        s.policies.insert(name.into(), base);
    }
    s
}

#[tokio::test]
async fn opt_outs_dead_letter_naming_what_and_required_policies_pass() {
    let ns = unique("prefs-opt");
    let s = settings_for(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    assert!(!w.store().checks_preferences(), "no preferences yet");
    let set = json!({ "categories": { "marketing": false, "reminders": { "sms": false } },
        "channels": { "push": false } });
    let (code, stored) = call(&addr, "PUT", &path("r%2B1"), &set.to_string(), None).await;
    assert_eq!(code, 200, "{stored}");
    assert!(stored["updated_at"].is_string(), "{stored}");
    assert!(w.store().checks_preferences());

    // (job, recipient, channel, category, dead detail or None: dispatched)
    let cases = [
        (
            "m-sms",
            "r+1",
            "sms",
            "marketing",
            Some("category marketing"),
        ),
        (
            "m-email",
            "r+1",
            "email",
            "marketing",
            Some("category marketing"),
        ),
        (
            "rem-sms",
            "r+1",
            "sms",
            "reminders",
            Some("category reminders, channel sms"),
        ),
        ("rem-email", "r+1", "email", "reminders", None),
        ("push", "r+1", "push", "default", Some("channel push")),
        ("receipt", "r+1", "push", "transactional", None),
        ("other", "r2", "sms", "marketing", None),
    ];
    for (id, r, ch, cat, detail) in cases {
        publish(&conn, &s, &job(id, r, ch, cat)).await;
        let outcome = step(&w, &conn, &s).await;
        match detail {
            Some(detail) => {
                assert_eq!(outcome, Outcome::Dead(Reason::OptedOut), "{id}");
                assert_eq!(dead_detail(&conn, &s, id).await, detail, "{id}");
            }
            None => assert_eq!(outcome, Outcome::Dispatched, "{id}"),
        }
    }

    // PATCH merges (null removes), GET shows it, DELETE removes it
    let patch = json!({"categories": {"marketing": null}, "channels": {"sms": false}});
    let (code, merged) = call(&addr, "PATCH", &path("r%2B1"), &patch.to_string(), None).await;
    assert_eq!(code, 200, "{merged}");
    assert_eq!(merged["categories"], json!({"reminders": {"sms": false}}));
    assert_eq!(merged["channels"], json!({"push": false, "sms": false}));
    let (code, got) = call(&addr, "GET", &path("r%2B1"), "", None).await;
    assert_eq!((code, got.clone()), (200, merged));
    publish(&conn, &s, &job("m-email-2", "r+1", "email", "marketing")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    assert_eq!(call(&addr, "DELETE", &path("r%2B1"), "", None).await.0, 204);
    assert_eq!(call(&addr, "GET", &path("r%2B1"), "", None).await.0, 404);
    publish(&conn, &s, &job("push-2", "r+1", "push", "default")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    stop.cancel();
}

#[tokio::test]
async fn a_tenant_has_its_own_set() {
    let ns = unique("prefs-tenant");
    let s = settings_for(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    let set = json!({"channels": {"sms": false}}).to_string();
    assert_eq!(
        call(
            &addr,
            "PUT",
            &format!("{}?tenant=acme", path("r")),
            &set,
            None
        )
        .await
        .0,
        200
    );
    assert_eq!(call(&addr, "GET", &path("r"), "", None).await.0, 404);
    // the admin's view of the recipient shows the tenant's set (`admin recipient --json`)
    let recipients = quota_worker::admin::recipients::Recipients::new(w.store(), &s);
    let query = |tenant| quota_worker::admin::recipients::RecipientQuery {
        recipient: "r",
        category: None,
        channel: None,
        tz: chrono_tz::Tz::UTC,
        tenant,
    };
    let shown = recipients.status(&query(Some("acme"))).await.unwrap();
    assert_eq!(
        shown.preferences.unwrap()["channels"],
        json!({"sms": false})
    );
    assert!(recipients
        .status(&query(None))
        .await
        .unwrap()
        .preferences
        .is_none());
    let with_tenant = br#"{"id":"t1","recipient":"r","channel":"sms","tenant":"acme"}"#;
    publish(&conn, &s, with_tenant).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::OptedOut));
    assert_eq!(dead_detail(&conn, &s, "t1").await, "channel sms");
    publish(&conn, &s, &job("t2", "r", "sms", "default")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    stop.cancel();
}

#[tokio::test]
async fn a_job_waiting_in_the_ladder_meets_a_new_opt_out() {
    let ns = unique("prefs-ladder");
    let s = settings_for(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    let later = (chrono::Utc::now() + chrono::Duration::seconds(2)).to_rfc3339();
    let body = format!(
        r#"{{"id":"wait","recipient":"rw","channel":"sms","category":"marketing","not_before":"{later}"}}"#
    );
    publish(&conn, &s, body.as_bytes()).await;
    assert!(matches!(step(&w, &conn, &s).await, Outcome::Delayed { .. }));
    let set = json!({"categories": {"marketing": false}}).to_string();
    assert_eq!(call(&addr, "PUT", &path("rw"), &set, None).await.0, 200);
    // back from the ladder, decided again
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::OptedOut));
    assert_eq!(dead_detail(&conn, &s, "wait").await, "category marketing");
    stop.cancel();
}

#[tokio::test]
async fn bad_input_is_refused_whole_naming_its_field() {
    let ns = unique("prefs-bad");
    let s = settings_for(&ns);
    let (_c, w, _conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    let w0 = |k: &str, v: &str| {
        let mut win = json!({"days": "daily", "from": "22:00", "to": "07:00"});
        win[k] = json!(v);
        json!({"quiet_hours": {"windows": [win]}})
    };
    let cases = [
        (json!({"colour": "red"}), "colour"),
        (w0("from", "25:00"), "quiet_hours.windows[0].from"),
        (w0("to", "7"), "quiet_hours.windows[0].to"),
        (w0("days", "someday"), "quiet_hours.windows[0].days"),
        (
            json!({"quiet_hours": {"timezone": "Mars/Olympus", "windows": []}}),
            "quiet_hours.timezone",
        ),
        (
            json!({"quiet_hours": {"windows": [], "allow": ["asap"]}}),
            "quiet_hours.allow[0]",
        ),
        (json!({"channels": {"fax": false}}), "channels.fax"),
        (
            json!({"categories": {"a": {"fax": false}}}),
            "categories.a.fax",
        ),
    ];
    for (body, field) in cases {
        let (code, answer) = call(&addr, "PUT", &path("rb"), &body.to_string(), None).await;
        assert_eq!(code, 400, "{body}: {answer}");
        assert_eq!(answer["field"], json!(field), "{body}: {answer}");
        assert!(answer["error"].is_string());
        let (code, _) = call(&addr, "PATCH", &path("rb"), &body.to_string(), None).await;
        assert_eq!(code, 400, "PATCH {body}");
    }
    assert_eq!(
        call(&addr, "GET", &path("rb"), "", None).await.0,
        404,
        "nothing stored"
    );
    let big = json!({"categories": {"x": false}, "pad": "a".repeat(70 * 1024)}).to_string();
    assert_eq!(call(&addr, "PUT", &path("rb"), &big, None).await.0, 413);
    stop.cancel();
}

#[tokio::test]
async fn the_api_answers_401_without_its_token_and_403_beyond_loopback() {
    let ns = unique("prefs-auth");
    let s = settings_for(&ns);
    let (_c, w, _conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::token(&"api-s3cret".into())).await;
    for method in ["GET", "PUT", "PATCH", "DELETE"] {
        for token in [None, Some("wrong")] {
            assert_eq!(
                call(&addr, method, &path("ra"), "{}", token).await.0,
                401,
                "{method}"
            );
        }
    }
    assert_eq!(
        call(&addr, "PUT", &path("ra"), "{}", Some("api-s3cret"))
            .await
            .0,
        200
    );
    assert_eq!(
        call(&addr, "GET", &path("ra"), "", Some("api-s3cret"))
            .await
            .0,
        200
    );
    stop.cancel();
    let (addr, stop) = serve(&s, &w, Guard::Refused).await;
    for method in ["GET", "PUT", "PATCH", "DELETE"] {
        assert_eq!(
            call(&addr, method, &path("ra"), "{}", Some("api-s3cret"))
                .await
                .0,
            403
        );
    }
    stop.cancel();
}

#[tokio::test]
async fn quiet_hours_across_midnight_delay_to_their_end_unless_allowed_or_required() {
    use chrono::{Duration as Span, TimeZone, Timelike};
    let ns = unique("prefs-quiet");
    let s = settings_for(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    // a zone where it is 23:xx now, so 22:00-07:00 holds and ends tomorrow
    let now = chrono::Utc::now();
    let mut x = 23 - now.hour() as i32;
    if x > 14 {
        x -= 24;
    }
    if now.minute() >= 58 {
        // too close to midnight to be sure of the zone's hour: one hour further
        x = if x == -12 { 12 } else { x - 1 };
    }
    let zone = match x {
        0 => "Etc/GMT".to_string(),
        x if x > 0 => format!("Etc/GMT-{x}"),
        x => format!("Etc/GMT+{}", -x),
    };
    let tz: chrono_tz::Tz = zone.parse().unwrap();
    let local = now.with_timezone(&tz);
    let end_local = (local.date_naive() + Span::days(if local.hour() >= 22 { 1 } else { 0 }))
        .and_hms_opt(7, 0, 0)
        .unwrap();
    let end = tz
        .from_local_datetime(&end_local)
        .unwrap()
        .with_timezone(&chrono::Utc);
    let set = json!({"quiet_hours": {"timezone": zone,
        "windows": [{"days": "daily", "from": "22:00", "to": "07:00"}]}});
    let (code, answer) = call(&addr, "PUT", &path("rq"), &set.to_string(), None).await;
    assert_eq!(code, 200, "{answer}");

    publish(&conn, &s, &job("q-normal", "rq", "sms", "default")).await;
    match step(&w, &conn, &s).await {
        Outcome::Delayed { until } => assert_eq!(until, end, "{zone}"),
        other => panic!("{other:?}"),
    }
    // known now: the next one is held without reading the set again
    publish(&conn, &s, &job("q-normal-2", "rq", "email", "default")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Delayed { until: end });
    let urgent = br#"{"id":"q-urgent","recipient":"rq","channel":"sms","priority":"urgent"}"#;
    publish(&conn, &s, urgent).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Dispatched,
        "allow: urgent"
    );
    publish(&conn, &s, &job("q-receipt", "rq", "sms", "transactional")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched, "required");
    // a new version that allows normal too
    let mut set = set;
    set["quiet_hours"]["allow"] = json!(["urgent", "normal"]);
    assert_eq!(
        call(&addr, "PUT", &path("rq"), &set.to_string(), None)
            .await
            .0,
        200
    );
    publish(&conn, &s, &job("q-normal-3", "rq", "sms", "default")).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Dispatched,
        "allowed now"
    );
    // outside the quiet hours: goes out, and then still does from what is known
    let outside = json!({"quiet_hours": {"timezone": zone,
        "windows": [{"days": "daily", "from": "09:00", "to": "10:00"}]}});
    assert_eq!(
        call(&addr, "PUT", &path("rq"), &outside.to_string(), None)
            .await
            .0,
        200
    );
    for id in ["q-day-1", "q-day-2"] {
        publish(&conn, &s, &job(id, "rq", "sms", "default")).await;
        assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched, "{id}");
    }
    stop.cancel();
}

#[tokio::test]
async fn admin_job_says_opted_out_and_quiet_hours() {
    use chrono::Timelike;
    let ns = unique("prefs-job");
    let s = settings_for(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    // quiet now in UTC: from this hour to two hours later (past midnight allowed)
    let hour = chrono::Utc::now().hour();
    let set = json!({"categories": {"marketing": false},
        "quiet_hours": {"timezone": "UTC", "windows": [{"days": "daily",
            "from": format!("{hour:02}:00"), "to": format!("{:02}:00", (hour + 2) % 24)}]}});
    let (code, answer) = call(&addr, "PUT", &path("rj"), &set.to_string(), None).await;
    assert_eq!(code, 200, "{answer}");
    publish(&conn, &s, &job("j-out", "rj", "sms", "marketing")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::OptedOut));
    assert_eq!(dead_detail(&conn, &s, "j-out").await, "category marketing");
    publish(&conn, &s, &job("j-quiet", "rj", "sms", "default")).await;
    assert!(matches!(step(&w, &conn, &s).await, Outcome::Delayed { .. }));
    let jobs = quota_worker::admin::Jobs::new(w.store(), &s);
    let out = serde_json::to_value(jobs.explain("j-out").await.unwrap()).unwrap();
    assert_eq!(out["record"]["reason"], "opted_out", "{out}");
    assert_eq!(out["record"]["detail"], "category marketing", "{out}");
    let quiet = serde_json::to_value(jobs.explain("j-quiet").await.unwrap()).unwrap();
    assert_eq!(quiet["record"]["cause"], "quiet_hours", "{quiet}");
    // and the binary says so
    let text =
        crate::cli::stdout(&crate::cli::run_async(&s, &["admin", "job", "j-out"], None).await);
    assert!(
        text.contains("dead:        opted_out: category marketing"),
        "{text}"
    );
    let text =
        crate::cli::stdout(&crate::cli::run_async(&s, &["admin", "job", "j-quiet"], None).await);
    assert!(text.contains("quiet_hours"), "{text}");
    stop.cancel();
}

/// `schema/preferences.schema.json` (in `docs/reference/schemas.md`) and the worker's
/// own parser agree: every set below that the parser takes, the schema takes, and
/// every set the schema refuses, the parser refuses too (the parser checks more: a
/// configured channel, day and zone names).
#[test]
fn the_preferences_schema_and_the_parser_agree() {
    use quota_worker::preferences::set::Preferences;
    let schema: Value =
        serde_json::from_str(include_str!("../../schema/preferences.schema.json")).unwrap();
    let validator = jsonschema::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema is a valid JSON Schema");
    let known = |c: &str| ["sms", "email", "push"].contains(&c);
    let good = [
        json!({}),
        json!({ "categories": { "marketing": false, "reminders": { "sms": false } },
                "channels": { "sms": false },
                "quiet_hours": { "timezone": "Europe/Berlin",
                                 "windows": [ { "days": "daily", "from": "22:00", "to": "07:00" } ],
                                 "allow": ["urgent"] } }),
        json!({ "channels": { "email": true }, "updated_at": "2026-11-26T22:00:00Z" }),
        json!({ "quiet_hours": { "windows": [ { "days": "mon-fri", "from": "00:00", "to": "24:00" } ],
                                 "allow": [] } }),
    ];
    for v in &good {
        assert!(
            Preferences::parse(v, &known).is_ok(),
            "the parser refuses {v}"
        );
        assert!(validator.is_valid(v), "the schema refuses {v}");
    }
    let bad = [
        json!({ "colour": "red" }),
        json!({ "channels": { "sms": "no" } }),
        json!({ "categories": { "a:b": false } }),
        json!({ "categories": { "promo": 0 } }),
        json!({ "quiet_hours": { "windows": [ { "days": "daily", "from": "7:00", "to": "08:00" } ] } }),
        json!({ "quiet_hours": { "windows": [ { "days": "daily", "from": "24:00", "to": "08:00" } ] } }),
        json!({ "quiet_hours": { "windows": [ { "days": "daily", "from": "22:00" } ] } }),
        json!({ "quiet_hours": { "allow": ["soon"] } }),
        json!({ "quiet_hours": { "zone": "Europe/Berlin" } }),
    ];
    for v in &bad {
        assert!(
            Preferences::parse(v, &known).is_err(),
            "the parser takes {v}"
        );
        assert!(!validator.is_valid(v), "the schema takes {v}");
    }
}

/// A zone (`Etc/GMT±x`) where the local hour is `hour` now, and the instant of
/// `at` o'clock local tomorrow there.
pub(crate) fn zone_at(hour: u32, at: u32) -> (String, chrono::DateTime<chrono::Utc>) {
    use chrono::{Duration as Span, TimeZone, Timelike};
    let now = chrono::Utc::now();
    let mut x = hour as i32 - now.hour() as i32;
    if x > 14 {
        x -= 24;
    } else if x < -12 {
        x += 24;
    }
    let zone = match x {
        0 => "Etc/GMT".to_string(),
        x if x > 0 => format!("Etc/GMT-{x}"),
        x => format!("Etc/GMT+{}", -x),
    };
    let tz: chrono_tz::Tz = zone.parse().unwrap();
    let local = (now.with_timezone(&tz).date_naive() + Span::days(1))
        .and_hms_opt(at, 0, 0)
        .unwrap();
    let instant = tz.from_local_datetime(&local).unwrap().to_utc();
    (zone, instant)
}

#[tokio::test]
async fn a_cap_instant_inside_quiet_hours_is_one_delay_to_their_end() {
    let ns = unique("prefs-one");
    let mut s = settings_for(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![quota_worker::config::RuleSettings {
        limit: 1,
        window: "1d".parse().unwrap(),
    }];
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    // noon where the recipient lives: the day's one send goes, the next waits for
    // tomorrow's midnight, which is inside their quiet hours 22:00-07:00 (in the
    // job's zone: the set names none)
    let (zone, seven) = zone_at(12, 7);
    let (_, midnight) = zone_at(12, 0);
    let set =
        json!({"quiet_hours": {"windows": [{"days": "daily", "from": "22:00", "to": "07:00"}]}});
    let (code, answer) = call(&addr, "PUT", &path("ro"), &set.to_string(), None).await;
    assert_eq!(code, 200, "{answer}");
    let body = |id: &str, r: &str| {
        format!(r#"{{"id":"{id}","recipient":"{r}","channel":"sms","timezone":"{zone}"}}"#)
    };
    for r in ["ro", "rc"] {
        publish(&conn, &s, body(&format!("{r}-1"), r).as_bytes()).await;
        assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched, "{r}");
    }
    // one delay, to the quiet hours' end: not to midnight first
    publish(&conn, &s, body("ro-2", "ro").as_bytes()).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Delayed { until: seven },
        "{zone}"
    );
    // a recipient without quiet hours waits for the cap alone
    publish(&conn, &s, body("rc-2", "rc").as_bytes()).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Delayed { until: midnight },
        "{zone}"
    );
    let jobs = quota_worker::admin::Jobs::new(w.store(), &s);
    let out = serde_json::to_value(jobs.explain("ro-2").await.unwrap()).unwrap();
    let record = &out["record"];
    assert_eq!(record["state"], "delayed", "{out}");
    // held by its cap and the quiet hours, one instant for both
    assert_eq!(record["cause"], "cap", "{out}");
    let held_by = record["held_by"].as_str().unwrap_or_default();
    assert!(
        held_by.ends_with("and the recipient's quiet_hours"),
        "{out}"
    );
    assert_eq!(record["attempt"], 0, "one delay: {out}");
    let until: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(record["until"].clone()).unwrap();
    assert_eq!(until, seven, "{out}");
    let capped = serde_json::to_value(jobs.explain("rc-2").await.unwrap()).unwrap();
    assert_eq!(capped["record"]["cause"], "cap", "{capped}");
    let held_by = capped["record"]["held_by"].as_str().unwrap_or_default();
    assert!(!held_by.contains("quiet_hours"), "{capped}");
    stop.cancel();
}

/// `admin job ID --json`'s record once the job has one (the worker binary writes it).
async fn record_of(s: &Settings, id: &str, w: &testkit::procs::WorkerProc) -> Value {
    for _ in 0..100 {
        let out = crate::cli::run_async(s, &["admin", "job", id, "--json"], None).await;
        if out.status.success() {
            let v: Value = serde_json::from_str(&crate::cli::stdout(&out)).unwrap_or(Value::Null);
            if v["record"].is_object() {
                return v["record"].clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no record of {id}:\n{}", w.tail(30));
}

/// Quiet hours 22:00-07:00 that span a DST change in the recipient's zone end at
/// 07:00 local after the change, through the worker binary and a Redis whose clocks
/// read a few seconds before the change (`testkit::clock`; RabbitMQ keeps real time,
/// its delays being relative): Berlin springs forward (07:00 CEST is 05:00 UTC, not
/// 06:00), New York falls back (07:00 EST is 12:00 UTC, not 11:00). A job before
/// the change and one after it wait to the same instant; an urgent one passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_hours_across_a_dst_change_end_at_the_right_instant() {
    use chrono::{DateTime, Utc};
    use testkit::clock::ShiftedClock;
    use testkit::procs::{RedisServer, WorkerProc};
    // (zone, the change in UTC, where 07:00 local falls after it)
    let cases = [
        (
            "Europe/Berlin",
            "2027-03-28T01:00:00Z",
            "2027-03-28T05:00:00Z",
        ),
        (
            "America/New_York",
            "2027-11-07T06:00:00Z",
            "2027-11-07T12:00:00Z",
        ),
    ];
    for (zone, change, end) in cases {
        let change: DateTime<Utc> = change.parse().unwrap();
        let end: DateTime<Utc> = end.parse().unwrap();
        let ns = unique("prefs-dst");
        let mut s = settings_for(&ns);
        let clock = ShiftedClock::at(change - chrono::Duration::seconds(8));
        let redis = RedisServer::with_clock(&clock);
        s.redis.url = redis.url();
        let _c = Cleanup::new(&s);
        let dir = temp_dir(&ns);
        let set = json!({"quiet_hours": {"timezone": zone,
            "windows": [{"days": "daily", "from": "22:00", "to": "07:00"}]}});
        let out = crate::cli::run_async(
            &s,
            &["admin", "recipient", "rd", "preferences", "set", "-"],
            Some(&set.to_string()),
        )
        .await;
        assert!(out.status.success(), "{}", crate::cli::stderr(&out));
        let env = [testkit::env::worker_env(&s), clock.env()].concat();
        let mut w = WorkerProc::spawn_env(crate::BIN, &s, &dir, "w", env);
        let conn = amqp().await;
        crate::tracing::consuming(&conn, &s, &w).await;
        let dispatch = format!("{}sms", s.amqp.dispatch_queue_prefix);

        assert!(clock.now() < change, "{zone}: started too late");
        publish(&conn, &s, &job("before", "rd", "sms", "default")).await;
        let record = record_of(&s, "before", &w).await;
        assert!(clock.now() < change, "{zone}: decided too late");
        while clock.now() < change + chrono::Duration::seconds(1) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        publish(&conn, &s, &job("after", "rd", "sms", "default")).await;
        let after = record_of(&s, "after", &w).await;
        for (id, r) in [("before", record), ("after", after)] {
            assert_eq!(r["state"], "delayed", "{zone} {id}: {r}");
            assert_eq!(r["cause"], "quiet_hours", "{zone} {id}: {r}");
            let until: DateTime<Utc> = serde_json::from_value(r["until"].clone()).unwrap();
            assert_eq!(until, end, "{zone} {id}: {r}");
        }
        let urgent = br#"{"id":"urgent","recipient":"rd","channel":"sms","priority":"urgent"}"#;
        publish(&conn, &s, urgent).await;
        let sent = take(&conn, &dispatch, Duration::from_secs(10))
            .await
            .unwrap_or_else(|| panic!("{zone}: the urgent job goes:\n{}", w.tail(30)));
        assert_eq!(message_id(&sent), "urgent", "{zone}: nothing else is sent");
        w.stop();
    }
}

/// `redis.on_reset = "pause"` holds the jobs that preferences could stop: Redis loses
/// the test's keys (its reset marker and the recipient's opt-out with them); while
/// paused, a job of a policy without rules that is not required is held, not sent
/// (the lost opt-out can no longer stop it), and a transactional one goes; after the
/// sets are imported again from an export and `admin resume`, the opt-out stops it.
#[tokio::test]
async fn the_pause_after_a_reset_holds_what_lost_preferences_could_stop() {
    use quota_worker::config::OnReset;
    let ns = unique("prefs-reset");
    let mut s = settings_for(&ns);
    s.redis.on_reset = OnReset::Pause;
    assert!(s.policies["marketing"].rules.is_empty());
    let (_c, w, conn) = rig(&s).await;
    let resets = &w.health.resets;
    let check = || resets.check(w.store(), OnReset::Pause);
    check().await.unwrap();
    assert!(!resets.paused());
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    let set = json!({"categories": {"marketing": false}}).to_string();
    assert_eq!(call(&addr, "PUT", &path("rl"), &set, None).await.0, 200);
    publish(&conn, &s, &job("m-1", "rl", "sms", "marketing")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::OptedOut));
    assert_eq!(dead_detail(&conn, &s, "m-1").await, "category marketing");
    // the backup
    let dir = temp_dir(&ns);
    let file = dir.join("prefs.jsonl");
    let file = file.to_str().unwrap();
    let out = crate::cli::run_async(&s, &["admin", "preferences", "export", file], None).await;
    assert!(out.status.success(), "{}", crate::cli::stderr(&out));

    // Redis loses its data: the marker and the set go
    drop(RedisGuard(ns.clone()));
    assert_eq!(call(&addr, "GET", &path("rl"), "", None).await.0, 404);
    check().await.unwrap();
    assert!(resets.paused(), "paused after the reset");
    publish(&conn, &s, &job("m-2", "rl", "sms", "marketing")).await;
    assert!(
        matches!(step(&w, &conn, &s).await, Outcome::Delayed { .. }),
        "held, not sent"
    );
    let jobs = quota_worker::admin::Jobs::new(w.store(), &s);
    let held = serde_json::to_value(jobs.explain("m-2").await.unwrap()).unwrap();
    assert_eq!(held["record"]["cause"], "paused", "{held}");
    publish(&conn, &s, &job("receipt", "rl", "sms", "transactional")).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Dispatched,
        "required jobs go"
    );
    let dispatch = format!("{}sms", s.amqp.dispatch_queue_prefix);
    let sent = take(&conn, &dispatch, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(
        message_id(&sent),
        "receipt",
        "only the transactional job is sent"
    );

    // restored from the export, then resumed: the opt-out stops the job again
    let out = crate::cli::run_async(&s, &["admin", "preferences", "import", file], None).await;
    assert!(out.status.success(), "{}", crate::cli::stderr(&out));
    let out = crate::cli::run_async(&s, &["admin", "resume"], None).await;
    assert!(out.status.success(), "{}", crate::cli::stderr(&out));
    check().await.unwrap();
    assert!(!resets.paused(), "resumed");
    publish(&conn, &s, &job("m-2", "rl", "sms", "marketing")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::OptedOut));
    assert_eq!(dead_detail(&conn, &s, "m-2").await, "category marketing");
    assert!(take(&conn, &dispatch, Duration::from_millis(500))
        .await
        .is_none());
    stop.cancel();
}

/// A job met inside quiet hours whose caps would still refuse it at their end waits
/// once, for the first instant its caps and the quiet hours both allow, not to the
/// quiet hours' end and then again: a rolling one-per-24h recipient who got an
/// urgent job (allowed through the quiet hours) has a normal one held to 24 hours
/// after it, or, when that falls in the next day's quiet hours, to their end.
#[tokio::test]
async fn a_job_inside_quiet_hours_that_its_caps_refuse_at_their_end_waits_once() {
    use chrono::{Datelike, DurationRound, Timelike};
    let ns = unique("prefs-inside");
    let mut s = settings_for(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![quota_worker::config::RuleSettings {
        limit: 1,
        window: "24h".parse().unwrap(),
    }];
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, &w, Guard::Open).await;
    let now = chrono::Utc::now();
    let hour = now.hour();
    let quiet_end =
        now.duration_trunc(chrono::Duration::hours(1)).unwrap() + chrono::Duration::hours(2);
    let set = |days: &str| {
        json!({"quiet_hours": {"timezone": "UTC", "windows": [{"days": days,
            "from": format!("{hour:02}:00"), "to": format!("{:02}:00", (hour + 2) % 24)}]}})
        .to_string()
    };
    let today = now.weekday().to_string().to_lowercase();
    // (recipient, quiet days, where the normal job waits (None: 24 h after the
    // urgent send, for its cap), whether the quiet hours pushed that instant)
    let day = chrono::Duration::hours(24);
    let cases = [
        ("ri-daily", "daily", Some(quiet_end + day), true),
        ("ri-today", today.as_str(), None, false),
    ];
    for (r, days, expected, quiet_too) in cases {
        let (code, answer) = call(&addr, "PUT", &path(r), &set(days), None).await;
        assert_eq!(code, 200, "{answer}");
        let urgent = format!(
            r#"{{"id":"{r}-urgent","recipient":"{r}","channel":"sms","priority":"urgent"}}"#
        );
        let before = chrono::Utc::now();
        publish(&conn, &s, urgent.as_bytes()).await;
        assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched, "{r}");
        let after = chrono::Utc::now();
        let id = format!("{r}-normal");
        publish(&conn, &s, &job(&id, r, "sms", "default")).await;
        let Outcome::Delayed { until } = step(&w, &conn, &s).await else {
            panic!("{r}: held")
        };
        match expected {
            Some(at) => assert_eq!(until, at, "{r}"),
            None => {
                let slack = chrono::Duration::seconds(1);
                assert!(
                    until >= before + day - slack && until <= after + day + slack,
                    "{r}: {until} is not 24 h after the urgent send ({before} .. {after}); quiet until {quiet_end}"
                );
            }
        }
        let jobs = quota_worker::admin::Jobs::new(w.store(), &s);
        let out = serde_json::to_value(jobs.explain(&id).await.unwrap()).unwrap();
        assert_eq!(out["record"]["cause"], "cap", "{r}: {out}");
        let held_by = out["record"]["held_by"].as_str().unwrap_or_default();
        assert_eq!(held_by.contains("quiet_hours"), quiet_too, "{r}: {out}");
        assert_eq!(out["record"]["attempt"], 0, "{r}: one delay: {out}");
    }
    // a recipient with no send yet waits to the quiet hours' end
    assert_eq!(
        call(&addr, "PUT", &path("ri-free"), &set("daily"), None)
            .await
            .0,
        200
    );
    publish(&conn, &s, &job("ri-free-1", "ri-free", "sms", "default")).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Delayed { until: quiet_end }
    );
    stop.cancel();
}
