//! `quota-worker admin` against the machine's RabbitMQ and Redis, output parsed.

use std::time::Duration;

use crate::cli::*;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use lapin::options::{BasicGetOptions, BasicNackOptions, QueueDeleteOptions};
use quota_worker::admin::dead_index::{self, Filter};
use quota_worker::admin::dead_log;
use quota_worker::admission::{Admission, Request};
use quota_worker::amqp::Publisher;
use quota_worker::config::{PolicySettings, Settings};
use quota_worker::job::Outcome;
use quota_worker::quota::policy::Scope;
use quota_worker::quota::window;
use quota_worker::store::QuotaStore;
use serde_json::Value;
use testkit::*;
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn queues_shows_every_queue_with_counts_and_missing_ones() {
    let ns = unique("queues");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    topology(&s).declare(&conn).await.unwrap();
    for i in 0..2 {
        publish(
            &conn,
            &s,
            format!(r#"{{"id":"q{i}","recipient":"r","channel":"sms"}}"#).as_bytes(),
        )
        .await;
    }
    let ch = conn.create_channel().await.unwrap();
    ch.queue_delete(
        format!("{ns}.dispatch.push").as_str().into(),
        QueueDeleteOptions::default(),
    )
    .await
    .unwrap();

    let out = json(&run_async(&s, &["admin", "queues", "--json"], None).await);
    let queues = out.as_array().unwrap();
    assert_eq!(queues.len(), 1 + 20 + 3 + 1 + 1);
    let find = |name: &str| {
        queues
            .iter()
            .find(|q| q["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed"))
            .clone()
    };
    let jobs = find(&s.amqp.jobs_queue);
    assert_eq!(jobs["role"], "jobs");
    assert_eq!(jobs["ready"], 2);
    assert_eq!(jobs["consumers"], 0);
    assert_eq!(queues[0]["name"], s.amqp.jobs_queue.as_str(), "jobs first");
    assert_eq!(queues[1]["name"], format!("{ns}.delay.1s"));
    assert_eq!(queues[1]["detail"], "1s");
    let push = find(&format!("{ns}.dispatch.push"));
    assert_eq!(push["exists"], false);
    assert_eq!(push["ready"], Value::Null);
    let sms = find(&format!("{ns}.dispatch.sms"));
    assert_eq!(
        (sms["exists"].clone(), sms["ready"].clone()),
        (true.into(), 0.into())
    );
    let dead = &queues[queues.len() - 2];
    assert_eq!(
        (dead["role"].clone(), dead["ready"].clone()),
        ("dead".into(), 0.into())
    );
    let feedback = queues.last().unwrap();
    assert_eq!(
        (feedback["role"].clone(), feedback["name"].clone()),
        ("feedback".into(), s.feedback.queue.as_str().into())
    );

    // the table names the same queues
    let out = run_async(&s, &["admin", "queues"], None).await;
    let table = stdout(&out);
    assert!(out.status.success());
    assert!(table.contains("(missing)"));
    assert_eq!(table.lines().count(), 1 + queues.len());
}

/// `n` dead letters `d0`, `d1`, … (reason `capped`), published to the dead exchange.
async fn publish_dead_letters(p: &Publisher, s: &Settings, n: u32) {
    for i in 0..n {
        let props = lapin::BasicProperties::default().with_headers(
            quota_worker::job::headers::dead_headers(None, "capped", "a test dead letter"),
        );
        p.publish(
            &s.amqp.dead_exchange,
            "",
            format!(r#"{{"id":"d{i}","recipient":"r","channel":"sms"}}"#).as_bytes(),
            props,
        )
        .await
        .unwrap();
    }
}

async fn list(s: &Settings) -> Vec<Value> {
    json(&run_async(s, &["admin", "dead", "list", "--json"], None).await)
        .as_array()
        .unwrap()
        .clone()
}

/// The console's index of the dead letters, caught up with the dead-letter log
/// first: each entry's job id and reason, sorted.
async fn indexed(conn: &lapin::Connection, s: &Settings) -> Vec<(Option<String>, String)> {
    let store = QuotaStore::connect(s).await.unwrap();
    dead_log::catch_up(conn, &store, s).await.unwrap();
    let (redis, keys) = (store.connection(), store.keys());
    let all = dead_index::select(&redis, keys, &Filter::default())
        .await
        .unwrap();
    let mut entries: Vec<_> = dead_index::read(&redis, keys, &all)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.id, e.reason))
        .collect();
    entries.sort();
    entries
}

/// The keys of the console's index in Redis.
async fn index_keys(s: &Settings) -> Vec<String> {
    let store = QuotaStore::connect(s).await.unwrap();
    let mut redis = store.connection();
    redis::cmd("KEYS")
        .arg(format!("{}:{{dead}}:*", s.redis.key_prefix))
        .query_async(&mut redis)
        .await
        .unwrap()
}

fn ids_reasons(list: &[Value]) -> Vec<(Value, String)> {
    list.iter()
        .map(|d| (d["id"].clone(), d["reason"].as_str().unwrap().to_string()))
        .collect()
}

#[tokio::test]
async fn dead_letters_are_listed_shown_replayed_and_purged_without_loss() {
    let ns = unique("dead");
    let mut s = settings(&ns);
    s.amqp.delivery_limit = 1;
    let (_c, w, conn) = rig(&s).await;

    // three dead letters from the worker...
    for body in [
        &br#"{"id":"exp","recipient":"r","channel":"sms","expires_at":"1970-01-01T00:00:00Z"}"#[..],
        br#"{"id":"pigeon","recipient":"r","channel":"pigeon"}"#,
        b"{not json",
    ] {
        publish(&conn, &s, body).await;
        assert!(matches!(step(&w, &conn, &s).await, Outcome::Dead(_)));
    }
    // ...and one the broker dead-letters past the jobs queue's delivery limit
    publish(
        &conn,
        &s,
        br#"{"id":"poison","recipient":"r","channel":"sms"}"#,
    )
    .await;
    let ch = conn.create_channel().await.unwrap();
    for _ in 0..5 {
        if depth(&conn, &s.amqp.dead_queue).await == 4 {
            break;
        }
        if let Some(m) = ch
            .basic_get(
                s.amqp.jobs_queue.as_str().into(),
                BasicGetOptions { no_ack: false },
            )
            .await
            .unwrap()
        {
            m.delivery
                .acker
                .nack(BasicNackOptions {
                    requeue: true,
                    ..Default::default()
                })
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let expected = vec![
        (Value::from("exp"), "expired".to_string()),
        (Value::from("pigeon"), "unknown_channel".to_string()),
        (Value::Null, "malformed".to_string()),
        (Value::from("poison"), "delivery_limit".to_string()),
    ];

    // the worker wrote nothing for them beside the queue (the broker copied each to
    // the dead-letter log); the console's index, caught up from the log, has all
    // four, the broker's own among them
    assert_eq!(index_keys(&s).await, Vec::<String>::new());
    let some = |id: &str, reason: &str| (Some(id.to_string()), reason.to_string());
    let mut sorted = vec![
        (None, "malformed".to_string()),
        some("exp", "expired"),
        some("pigeon", "unknown_channel"),
        some("poison", "delivery_limit"),
    ];
    assert_eq!(indexed(&conn, &s).await, sorted);

    // listing twice changes nothing: same letters, same order
    let first = list(&s).await;
    assert_eq!(ids_reasons(&first), expected);
    assert_eq!(first[0]["source"], "worker");
    assert!(first[0]["detail"].as_str().unwrap().contains("expired at"));
    assert!(first[0]["age_seconds"].as_i64().unwrap() >= 0);
    assert_eq!(first[3]["source"], "broker");
    assert!(first[3]["detail"]
        .as_str()
        .unwrap()
        .contains(&s.amqp.jobs_queue));
    assert_eq!(ids_reasons(&list(&s).await), expected);
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 4);

    // a filtered list
    let capped = json(
        &run_async(
            &s,
            &["admin", "dead", "list", "--json", "--reason", "malformed"],
            None,
        )
        .await,
    );
    assert_eq!(capped.as_array().unwrap().len(), 1);

    // show: every header and the body; reading never raised the delivery count
    let shown = json(&run_async(&s, &["admin", "dead", "show", "poison", "--json"], None).await);
    let shown = &shown.as_array().unwrap()[0];
    assert_eq!(shown["body"]["id"], "poison");
    let headers = &shown["properties"]["headers"];
    assert!(headers["x-death"].is_array(), "{headers}");
    assert_eq!(headers["x-death"][0]["reason"], "delivery_limit");
    // a quorum queue adds x-delivery-count once a message was handed back
    assert!(
        headers["x-delivery-count"].is_null() || headers["x-delivery-count"] == 0,
        "{headers}"
    );
    let missing = run_async(&s, &["admin", "dead", "show", "nope"], None).await;
    assert!(!missing.status.success());

    // replay by reason moves exactly those, without their dead-letter headers
    let replayed = json(
        &run_async(
            &s,
            &["admin", "dead", "replay", "--reason", "expired", "--json"],
            None,
        )
        .await,
    );
    assert_eq!(replayed["replayed"].as_array().unwrap().len(), 1);
    assert_eq!(replayed["replayed"][0]["id"], "exp");
    assert_eq!(replayed["walk"]["kept"], 3);
    let job = take(&conn, &s.amqp.jobs_queue, WAIT)
        .await
        .expect("replayed");
    assert_eq!(message_id(&job), "exp");
    assert!(job.delivery.data.starts_with(br#"{"id":"exp""#));
    for h in ["x-notify-reason", "x-notify-detail", "x-death"] {
        assert_eq!(header(&job.delivery.properties, h), None, "{h} stripped");
    }
    assert_eq!(ids_reasons(&list(&s).await), expected[1..].to_vec());
    // ...and forgets them in the console's index (caught up again, twice over: the
    // log still holds what was replayed, and the index does not take it back)
    sorted.retain(|e| e.0.as_deref() != Some("exp"));
    assert_eq!(indexed(&conn, &s).await, sorted);

    // purge asks first, and refuses without a terminal
    let refused = run_async(
        &s,
        &["admin", "dead", "purge", "--reason", "malformed"],
        None,
    )
    .await;
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("--yes"), "{}", stderr(&refused));
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 3);
    let purged = run_async(
        &s,
        &["admin", "dead", "purge", "--reason", "malformed", "--yes"],
        None,
    )
    .await;
    assert!(purged.status.success(), "{}", stderr(&purged));
    assert!(stdout(&purged).contains("purged 1"), "{}", stdout(&purged));
    assert_eq!(
        ids_reasons(&list(&s).await),
        vec![expected[1].clone(), expected[3].clone()]
    );

    // replay by id: the broker's x-death headers do not travel back
    let out = run_async(&s, &["admin", "dead", "replay", "--id", "poison"], None).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let job = take(&conn, &s.amqp.jobs_queue, WAIT)
        .await
        .expect("replayed");
    assert_eq!(header(&job.delivery.properties, "x-death"), None);
    let headers = job
        .delivery
        .properties
        .headers()
        .clone()
        .unwrap_or_default();
    assert!(
        !headers
            .inner()
            .keys()
            .any(|k| k.as_str().starts_with("x-first-death") || k.as_str() == "x-notify-reason"),
        "{headers:?}"
    );

    // a selection is required; --all takes the rest
    let out = run_async(&s, &["admin", "dead", "replay"], None).await;
    assert!(!out.status.success());
    let out = run_async(&s, &["admin", "dead", "purge", "--all", "--yes"], None).await;
    assert!(out.status.success());
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 0);
    assert!(list(&s).await.is_empty());
    // the index forgot every one purged, those without a job id too (by their prints)
    assert_eq!(indexed(&conn, &s).await, vec![]);
}

fn instant(v: &Value) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(v.as_str().unwrap_or_else(|| panic!("{v} is an instant")))
        .unwrap()
        .with_timezone(&Utc)
}

async fn status(s: &Settings, recipient: &str, extra: &[&str]) -> Value {
    let mut args = vec!["admin", "recipient", recipient, "--json"];
    args.extend_from_slice(extra);
    json(&run_async(s, &args, None).await)
}

fn policy<'a>(status: &'a Value, name: &str) -> &'a Value {
    status["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == name)
        .unwrap_or_else(|| panic!("policy {name} in {status}"))
}

#[tokio::test]
async fn recipient_show_record_and_reset() {
    let ns = unique("recipient");
    let mut s = settings(&ns);
    s.policies.insert(
        "promo".into(),
        PolicySettings {
            scope: Scope::Channel,
            ..Default::default()
        },
    );
    let _c = Cleanup::new(&s);
    let engine = QuotaStore::connect(&s).await.unwrap();
    let tz: Tz = "Asia/Shanghai".parse().unwrap();
    let zone = ["--timezone", "Asia/Shanghai"];

    // nothing recorded: every rule at 0, allowed now
    let st = status(&s, "+8613800000000", &zone).await;
    assert_eq!(st["timezone"], "Asia/Shanghai");
    assert_eq!(
        st["recipient_tag"],
        engine.keys().recipient_tag("+8613800000000")
    );
    let default = policy(&st, "default");
    assert!(default["sends"].as_array().unwrap().is_empty());
    let counts: Vec<(i64, i64)> = default["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["count"].as_i64().unwrap(), r["limit"].as_i64().unwrap()))
        .collect();
    assert_eq!(counts, vec![(0, 1), (0, 3)]);
    assert_eq!(default["next_allowed"]["now"], true);
    // the per-channel policy shows one entry per channel
    assert_eq!(
        st["policies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["policy"] == "promo")
            .count(),
        3
    );

    // import a send made yesterday (local) at 10:00
    let now = Utc::now();
    let yesterday = window::local_date(tz, now) - chrono::Duration::days(1);
    let at = window::day_start(tz, yesterday) + chrono::Duration::hours(10);
    let at_text = at.to_rfc3339();
    let mut record = vec![
        "admin",
        "recipient",
        "+8613800000000",
        "record",
        "--at",
        &at_text,
        "--id",
        "imp-1",
        "--json",
    ];
    record.extend_from_slice(&zone);
    let rec = json(&run_async(&s, &record, None).await);
    assert_eq!(rec["added"], true);
    assert_eq!(rec["policy"], "default");
    assert_eq!(instant(&rec["at"]), at);
    // kept until it leaves the 7-day window
    assert_eq!(
        instant(&rec["key_expires_at"]),
        window::day_start(tz, yesterday + chrono::Duration::days(7))
    );
    let st = status(
        &s,
        "+8613800000000",
        &[&zone[..], &["--category", "default"]].concat(),
    )
    .await;
    assert_eq!(st["policies"].as_array().unwrap().len(), 1);
    let default = policy(&st, "default");
    assert_eq!(default["sends"][0]["state"], "committed");
    assert_eq!(instant(&default["sends"][0]["at"]), at);
    assert_eq!(default["rules"][0]["count"], 0, "yesterday is not today");
    assert_eq!(default["rules"][1]["count"], 1);
    assert_eq!(default["next_allowed"]["now"], true);

    // the same id again changes nothing
    let again = json(&run_async(&s, &record, None).await);
    assert_eq!(again["added"], false);

    // a send today fills the daily rule: next allowed at the recipient's midnight
    let today_text = (Utc::now() - chrono::Duration::seconds(1)).to_rfc3339();
    let mut record2 = vec![
        "admin",
        "recipient",
        "+8613800000000",
        "record",
        "--at",
        &today_text,
        "--id",
        "imp-2",
    ];
    record2.extend_from_slice(&zone);
    let out = run_async(&s, &record2, None).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let st = status(&s, "+8613800000000", &zone).await;
    let default = policy(&st, "default");
    assert_eq!(default["rules"][0]["count"], 1);
    assert_eq!(default["rules"][0]["full"], true);
    let next = &default["next_allowed"];
    assert_eq!(next["now"], false);
    assert_eq!(
        instant(&next["utc"]),
        window::next_day_start(tz, instant(&st["now"]))
    );
    assert!(next["local"].as_str().unwrap().ends_with("T00:00:00+08:00"));

    // the worker sees an imported id as already sent
    let req = Request {
        id: "imp-1",
        recipient: "+8613800000000",
        channel: "sms",
        category: "default",
        tz,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    };
    assert_eq!(engine.admit(&req).await.unwrap(), Admission::Duplicate);

    // refused: the future, a per-channel policy without a channel
    let future = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let out = run_async(
        &s,
        &["admin", "recipient", "x", "record", "--at", &future],
        None,
    )
    .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("future"), "{}", stderr(&out));
    let recent = (Utc::now() - chrono::Duration::minutes(5)).to_rfc3339();
    let record = [
        "admin",
        "recipient",
        "+8613800000000",
        "record",
        "--at",
        &recent,
        "--category",
        "promo",
    ];
    let out = run_async(&s, &record, None).await;
    assert!(stderr(&out).contains("--channel"), "{}", stderr(&out));
    let with_channel = [&record[..], &["--channel", "push", "--json"]].concat();
    let rec = json(&run_async(&s, &with_channel, None).await);
    assert_eq!(rec["channel"], "push");
    assert!(rec["key"].as_str().unwrap().ends_with(":promo:push"));

    // reset clears every policy and channel
    let reset = json(
        &run_async(
            &s,
            &["admin", "recipient", "+8613800000000", "reset", "--json"],
            None,
        )
        .await,
    );
    assert_eq!(reset["deleted_keys"], 2);
    let st = status(&s, "+8613800000000", &zone).await;
    for p in st["policies"].as_array().unwrap() {
        assert!(p["sends"].as_array().unwrap().is_empty(), "{p}");
        assert_eq!(p["key_expires_at"], Value::Null);
    }
}

#[tokio::test]
async fn an_interrupted_replay_loses_nothing_and_keeps_the_order() {
    use quota_worker::admin::{DeadLetterInfo, DeadLetters, WalkAction};
    let ns = unique("interrupt");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let t = topology(&s);
    t.declare(&conn).await.unwrap();
    let p = Publisher::open(&conn, WAIT).await.unwrap();
    publish_dead_letters(&p, &s, 6).await;
    let letters = DeadLetters::new(&conn, &t, WAIT);
    // a signal arrives while the third dead letter is being replayed
    let stop = CancellationToken::new();
    let mut seen = 0;
    let report = letters
        .walk(&stop, |_| {
            seen += 1;
            if seen == 3 {
                stop.cancel();
            }
            WalkAction::Replay
        })
        .await
        .unwrap();
    assert!(report.interrupted);
    assert_eq!((report.visited, report.replayed), (3, 3));
    // the three replayed are in the jobs queue, the other three still dead, once each
    assert_eq!(depth(&conn, &s.amqp.jobs_queue).await, 3);
    let mut left = Vec::new();
    let report = letters
        .walk(&CancellationToken::new(), |d| {
            left.push(DeadLetterInfo::read(&d.properties, &d.data, Utc::now(), false).id);
            WalkAction::Keep
        })
        .await
        .unwrap();
    assert_eq!(report.found, 3);
    assert_eq!(
        left,
        vec![Some("d3".into()), Some("d4".into()), Some("d5".into())]
    );
}

#[tokio::test]
async fn a_walk_longer_than_its_prefetch_sees_each_message_once() {
    use quota_worker::admin::{DeadLetterInfo, DeadLetters, WalkAction};
    let ns = unique("prefetch");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let t = topology(&s);
    t.declare(&conn).await.unwrap();
    let p = Publisher::open(&conn, WAIT).await.unwrap();
    let n = 300;
    publish_dead_letters(&p, &s, n).await;
    let expected: Vec<Option<String>> = (0..n).map(|i| Some(format!("d{i}"))).collect();
    for prefetch in [10, 64, 256, 300, 64, 256, 64, 256, 300, 64, 256] {
        let letters = DeadLetters::new(&conn, &t, WAIT).with_prefetch(prefetch);
        let mut ids = Vec::new();
        let mut counted = 0;
        let report = letters
            .walk(&CancellationToken::new(), |d| {
                ids.push(DeadLetterInfo::read(&d.properties, &d.data, Utc::now(), false).id);
                if header(&d.properties, "x-delivery-count").is_some_and(|c| c != "0") {
                    counted += 1;
                }
                WalkAction::Keep
            })
            .await
            .unwrap();
        assert_eq!(report.visited, n, "prefetch {prefetch}");
        assert_eq!(ids, expected, "prefetch {prefetch}");
        assert_eq!(
            counted, 0,
            "prefetch {prefetch}: no delivery was counted twice"
        );
        assert_eq!(
            depth(&conn, &s.amqp.dead_queue).await,
            n,
            "prefetch {prefetch}"
        );
    }
}
