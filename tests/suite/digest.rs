//! Digests (issue #39), `window`, `sliding` and `held` modes, end to end through RabbitMQ and Redis: the
//! jobs of a policy with a digest section, folded in one window, arrive as one
//! message with the count, the items kept (first or last), the number omitted; two
//! digest keys make two digests; three workers folding one group at once make
//! one digest; `max_items` closes a digest at once; a bad `digest_key` is a dead
//! letter saying why; a digest meets its policy's caps as one send; cancelled,
//! expired and collapsed items are left out (an empty digest sends nothing); a closer that dies
//! mid-close leaves the digest to another, which sends it once under the same id;
//! sliding windows; the admin commands; feedback `failed` on a digest gives its send
//! back; an open digest keeps its settings across a reload; Redis memory per item;
//! `held`: what the caps hold goes at their next instant, and a held digest refused
//! then opens again and goes on collecting; a fold the replicas do not acknowledge
//! is not acked.

use std::time::Duration;

use quota_worker::config::{DigestSettings, Dur, PolicySettings, RuleSettings, Settings};
use quota_worker::job::{Outcome, Reason};
use quota_worker::quota::digest::{DigestMode, KeepFrom};
use serde_json::{json, Value};
use testkit::*;

/// Settings with policies `social` (window `window`, keep 2 first), `social_last`
/// (the same, keep 2 last) and `capped` (the same, at most 1 a day).
fn digested(ns: &str, window: Duration, max_items: u32) -> Settings {
    let mut s = settings(ns);
    let digest = |keep_from| DigestSettings {
        mode: DigestMode::Window,
        window: Some(Dur(window)),
        max_window: None,
        max_items,
        keep: 2,
        keep_from,
    };
    let policy = |keep_from| PolicySettings {
        digest: Some(digest(keep_from)),
        ..PolicySettings::default()
    };
    s.policies.insert("social".into(), policy(KeepFrom::First));
    s.policies
        .insert("social_last".into(), policy(KeepFrom::Last));
    let mut capped = policy(KeepFrom::First);
    capped.rules = vec![RuleSettings {
        limit: 1,
        window: "1d".parse().unwrap(),
    }];
    s.policies.insert("capped".into(), capped);
    s.validate().expect("valid settings");
    s
}

/// Publish `bodies` to the jobs exchange all at once (each confirmed), as a burst
/// of one recipient's jobs reaches the workers together.
async fn publish_at_once(conn: &lapin::Connection, s: &Settings, bodies: &[Vec<u8>]) {
    let p = quota_worker::amqp::Publisher::open(conn, Duration::from_secs(10))
        .await
        .unwrap();
    let sends = bodies.iter().map(|b| {
        let props = lapin::BasicProperties::default().with_content_type("application/json".into());
        p.publish(&s.amqp.jobs_exchange, "", b, props)
    });
    for r in futures_util::future::join_all(sends).await {
        r.unwrap();
    }
}

fn job(id: &str, recipient: &str, category: &str, extra: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","recipient":"{recipient}","channel":"sms","category":"{category}","payload":{{"n":"{id}", "x": [1, 2.50]}}{extra}}}"#
    )
    .into_bytes()
}

/// The next message on the `sms` dispatch queue within `wait`: (message id, the
/// `x-notify-digest` header, body).
async fn dispatched(
    conn: &lapin::Connection,
    s: &Settings,
    wait: Duration,
) -> Option<(String, Option<String>, Value)> {
    let queue = topology(s).dispatch_queue("sms");
    let m = take(conn, &queue, wait).await?;
    let id = message_id(&m).to_string();
    let count = header(&m.delivery.properties, "x-notify-digest");
    let body = serde_json::from_slice(&m.delivery.data).expect("a JSON body");
    Some((id, count, body))
}

fn ids(digest: &Value) -> Vec<String> {
    digest["digest"]["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn jobs_in_one_window_arrive_as_one_digest_keeping_the_first_or_the_last() {
    let s = digested(&unique("digest-window"), Duration::from_secs(2), 100);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    for n in 1..=5 {
        publish(&conn, &s, &job(&format!("a{n}"), "r1", "social", "")).await;
        publish(&conn, &s, &job(&format!("b{n}"), "r1", "social_last", "")).await;
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            dispatched(&conn, &s, Duration::from_secs(15))
                .await
                .expect("a digest"),
        );
    }
    got.sort_by(|a, b| a.2["category"].as_str().cmp(&b.2["category"].as_str()));
    for (id, count, body) in &got {
        assert!(id.starts_with("dg-"), "{id}");
        assert_eq!(body["id"], id.as_str());
        assert_eq!(count.as_deref(), Some("5"));
        assert_eq!(body["recipient"], "r1");
        assert_eq!(body["channel"], "sms");
        assert_eq!(body["tenant"], Value::Null);
        let d = &body["digest"];
        assert_eq!(
            (d["count"].as_u64(), d["omitted"].as_u64()),
            (Some(5), Some(3))
        );
        assert_eq!(d["key"], body["category"]);
        assert!(d["first_at"].as_str().unwrap() <= d["last_at"].as_str().unwrap());
    }
    let (first, last) = (&got[0].2, &got[1].2);
    assert_eq!(first["category"], "social");
    assert_eq!(ids(first), ["a1", "a2"]);
    assert_eq!(ids(last), ["b4", "b5"]);
    // the payload is the job's, untouched
    assert_eq!(
        first["digest"]["items"][1]["payload"],
        json!({"n": "a2", "x": [1, 2.5]})
    );
    assert!(first["digest"]["items"][0]["at"].is_string());
    // nothing else: the items themselves are not sent
    assert!(dispatched(&conn, &s, Duration::from_secs(3))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn digest_keys_make_separate_digests_and_a_bad_one_is_a_dead_letter() {
    let s = digested(&unique("digest-keys"), Duration::from_secs(2), 100);
    let (_c, w, conn) = rig(&s).await;
    // a digest_key outside 1 to 128 characters: malformed, naming the field
    publish(
        &conn,
        &s,
        &job("bad", "r2", "social", r#","digest_key":"""#),
    )
    .await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::Malformed));
    let dead = take(&conn, &s.amqp.dead_queue, Duration::from_secs(5))
        .await
        .expect("a dead letter");
    let detail = header(&dead.delivery.properties, "x-notify-detail").unwrap();
    assert!(detail.contains("`digest_key` must be 1 to 128"), "{detail}");

    let (stop, handle) = spawn_worker(w.clone()).await;
    for (id, key) in [("p1", "post-1"), ("p2", "post-2"), ("p3", "post-1")] {
        let extra = format!(r#","digest_key":"{key}""#);
        publish(&conn, &s, &job(id, "r2", "social", &extra)).await;
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        got.push(
            dispatched(&conn, &s, Duration::from_secs(15))
                .await
                .expect("a digest")
                .2,
        );
    }
    got.sort_by(|a, b| {
        a["digest"]["key"]
            .as_str()
            .cmp(&b["digest"]["key"].as_str())
    });
    assert_eq!(got[0]["digest"]["key"], "post-1");
    assert_eq!(ids(&got[0]), ["p1", "p3"]);
    assert_eq!(got[1]["digest"]["key"], "post-2");
    assert_eq!(ids(&got[1]), ["p2"]);
    assert_ne!(got[0]["id"], got[1]["id"]);
    assert!(dispatched(&conn, &s, Duration::from_secs(3))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn three_workers_folding_one_group_at_once_make_one_digest() {
    let s = digested(&unique("digest-three"), Duration::from_secs(3), 1000);
    let (_c, w, conn) = rig(&s).await;
    let mut running = Vec::new();
    for _ in 0..3 {
        let other = if running.is_empty() {
            w.clone()
        } else {
            worker(&s).await
        };
        running.push(spawn_worker(other).await);
    }
    let bodies: Vec<Vec<u8>> = (0..60)
        .map(|n| job(&format!("t{n}"), "r3", "social", ""))
        .collect();
    publish_at_once(&conn, &s, &bodies).await;
    let (_, count, body) = dispatched(&conn, &s, Duration::from_secs(20))
        .await
        .expect("a digest");
    assert_eq!(count.as_deref(), Some("60"));
    assert_eq!(body["digest"]["count"], 60);
    assert_eq!(body["digest"]["omitted"], 58);
    assert!(
        dispatched(&conn, &s, Duration::from_secs(4))
            .await
            .is_none(),
        "one digest, not two"
    );
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
}

#[tokio::test]
async fn max_items_closes_a_digest_at_once_and_a_digest_is_one_send() {
    // an hour's window: only max_items closes these
    let s = digested(&unique("digest-max"), Duration::from_secs(3600), 3);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    for n in 1..=7 {
        publish(&conn, &s, &job(&format!("m{n}"), "r4", "social", "")).await;
    }
    let mut got = Vec::new();
    for _ in 0..2 {
        let (_, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
            .await
            .expect("a full digest, closed at once");
        assert_eq!(count.as_deref(), Some("3"));
        got.extend(ids(&body).into_iter().map(|i| i.to_string()));
    }
    got.sort();
    assert_eq!(got, ["m1", "m2", "m4", "m5"], "the first two of each three");
    assert!(dispatched(&conn, &s, Duration::from_secs(2))
        .await
        .is_none());

    // `capped` allows one a day: its first digest goes, the next one waits
    for n in 1..=6 {
        publish(&conn, &s, &job(&format!("c{n}"), "r5", "capped", "")).await;
    }
    let (_, count, _) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the first digest of `capped`");
    assert_eq!(count.as_deref(), Some("3"), "its items counted for nothing");
    assert!(
        dispatched(&conn, &s, Duration::from_secs(3))
            .await
            .is_none(),
        "the second digest waits for the cap"
    );
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn cancelled_expired_and_collapsed_items_are_left_out_and_an_empty_digest_sends_nothing() {
    let s = digested(&unique("digest-gone"), Duration::from_secs(3), 100);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let soon = (chrono::Utc::now() + chrono::Duration::milliseconds(1500)).to_rfc3339();
    let expiring = format!(r#","expires_at":"{soon}""#);
    publish(&conn, &s, &job("g1", "r6", "social", "")).await;
    publish(&conn, &s, &job("g2", "r6", "social", &expiring)).await;
    publish(&conn, &s, &job("g3", "r6", "social", "")).await;
    publish(&conn, &s, &job("g4", "r7", "social", &expiring)).await;
    // of two items with one collapse key, the digest keeps the newest
    let cart = r#","collapse_key":"cart""#;
    publish(&conn, &s, &job("k1", "r6", "social", cart)).await;
    publish(&conn, &s, &job("k2", "r6", "social", cart)).await;
    // g3 cancelled while its digest is open
    wait_for("the items folded", Duration::from_secs(5), || async {
        let mut r = redis_sync();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*dgj/g*", s.redis.key_prefix))
            .query(&mut r)
            .unwrap();
        keys.len() == 4
    })
    .await;
    wait_for(
        "the collapsed items folded",
        Duration::from_secs(5),
        || async {
            let mut r = redis_sync();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{}:*dgj/k*", s.redis.key_prefix))
                .query(&mut r)
                .unwrap();
            keys.len() == 2
        },
    )
    .await;
    let jobs = quota_worker::admin::Jobs::new(w.store(), &s);
    jobs.cancel("g3").await.unwrap();
    let (_, count, body) = dispatched(&conn, &s, Duration::from_secs(15))
        .await
        .expect("r6's digest");
    assert_eq!(count.as_deref(), Some("2"));
    assert_eq!(
        ids(&body),
        ["g1", "k2"],
        "g2 expired, g3 cancelled, k1 replaced"
    );
    assert_eq!(body["recipient"], "r6");
    assert!(
        dispatched(&conn, &s, Duration::from_secs(3))
            .await
            .is_none(),
        "r7's digest had no item left: nothing sent"
    );
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn a_closer_that_dies_mid_close_leaves_the_digest_to_another_and_it_is_sent_once() {
    let s = digested(&unique("digest-lease"), Duration::from_secs(1), 100);
    let (_c, w, conn) = rig(&s).await;
    // folded one step at a time, no closer running
    for n in 1..=3 {
        publish(&conn, &s, &job(&format!("l{n}"), "r8", "social", "")).await;
        assert_eq!(step(&w, &conn, &s).await, Outcome::Folded);
    }
    // a job delivered again after its fold is not folded twice
    publish(&conn, &s, &job("l3", "r8", "social", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Folded);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // a closer claims it for 2 s, closes it, and dies before sending
    let claimed = w.store().digests().claim(2000, 64).await.unwrap();
    assert_eq!(claimed.len(), 1);
    let closed = w.store().digests().close(&claimed[0], false).await.unwrap();
    assert!(matches!(
        closed,
        quota_worker::redis::digest::close::Close::Closed(_)
    ));
    // closed: the group's next job opens a digest of its own
    publish(&conn, &s, &job("l4", "r8", "social", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Folded);
    let (stop, handle) = spawn_worker(w.clone()).await;
    let mut got = Vec::new();
    for _ in 0..2 {
        let (id, _, body) = dispatched(&conn, &s, Duration::from_secs(10))
            .await
            .expect("a digest");
        got.push((id, body["digest"]["count"].as_u64().unwrap(), ids(&body)));
    }
    got.sort_by_key(|g| std::cmp::Reverse(g.1));
    assert_eq!(
        (got[0].1, got[0].2.clone()),
        (3, vec!["l1".to_string(), "l2".into()])
    );
    assert_eq!((got[1].1, got[1].2.clone()), (1, vec!["l4".to_string()]));
    assert_eq!(got[0].0, claimed[0].rsplit("/dgm/").next().unwrap());
    assert!(dispatched(&conn, &s, Duration::from_secs(3))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn sliding_each_item_keeps_the_digest_open_up_to_max_window() {
    let mut s = digested(&unique("digest-sliding"), Duration::from_secs(2), 100);
    let d = s
        .policies
        .get_mut("social")
        .unwrap()
        .digest
        .as_mut()
        .unwrap();
    d.mode = DigestMode::Sliding;
    d.max_window = Some(Dur(Duration::from_secs(4)));
    s.validate().expect("a valid sliding digest");
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let started = std::time::Instant::now();
    // items at about 0 s, 1.5 s and 3 s: each moves the close 2 s on, up to 4 s
    for (n, at) in [(1, 0), (2, 1500), (3, 3000)] {
        let due = Duration::from_millis(at);
        tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
        publish(&conn, &s, &job(&format!("s{n}"), "r9", "social", "")).await;
    }
    let queue = topology(&s).dispatch_queue("sms");
    assert_eq!(depth(&conn, &queue).await, 0, "not closed at its first 2 s");
    let (_, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the digest");
    let closed_after = started.elapsed();
    assert_eq!(count.as_deref(), Some("3"));
    assert_eq!(body["digest"]["count"], 3);
    assert!(
        closed_after < Duration::from_millis(4900),
        "closed at max_window (4 s), not 2 s after the last item: {closed_after:?}"
    );
    assert!(dispatched(&conn, &s, Duration::from_secs(2))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn the_admin_shows_a_recipients_open_digests_and_one_digest_and_flushes_it() {
    // an hour's window: only the flush closes it
    let s = digested(&unique("digest-admin"), Duration::from_secs(3600), 100);
    let (_c, w, conn) = rig(&s).await;
    for n in 1..=3 {
        let extra = r#","digest_key":"post-9""#;
        publish(&conn, &s, &job(&format!("d{n}"), "r10", "social", extra)).await;
        assert_eq!(step(&w, &conn, &s).await, Outcome::Folded);
    }
    let digests = quota_worker::admin::Digests::new(w.store());
    let open = digests.of("r10", None).await.unwrap();
    // `admin job` says which digest holds a job, and when it closes
    let jobs = quota_worker::admin::Jobs::new(w.store(), &s);
    let place = jobs.explain("d2").await.unwrap().place;
    match &place {
        quota_worker::job::note::Place::Digest { digest, closes_at } => {
            assert_eq!(digest, &open[0].id);
            assert_eq!(Some(*closes_at), open[0].closes_at);
        }
        other => panic!("{other:?}"),
    }
    let out = crate::cli::run_async(&s, &["admin", "job", "d2"], None).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("in the digest `{}`", open[0].id)),
        "{text}"
    );
    assert_eq!(open.len(), 1, "{open:?}");
    let d = &open[0];
    assert_eq!(
        (d.channel.as_str(), d.key.as_str(), d.count),
        ("sms", "post-9", 3)
    );
    assert_eq!(d.state, "open");
    assert!(d.closes_at.unwrap() > chrono::Utc::now() + chrono::Duration::minutes(59));
    assert!(digests.of("r10", Some("acme")).await.unwrap().is_empty());
    // `admin recipient` lists it
    let recipients = quota_worker::admin::Recipients::new(w.store(), &s);
    let query = quota_worker::admin::RecipientQuery {
        recipient: "r10",
        category: None,
        channel: None,
        tz: chrono_tz::Tz::UTC,
        tenant: None,
    };
    assert_eq!(recipients.status(&query).await.unwrap().digests, open);

    // `admin digest ID --json`
    let out = crate::cli::run_async(&s, &["admin", "digest", &d.id, "--json"], None).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["id"], d.id.as_str());
    assert_eq!(shown["recipient"], "r10");
    assert_eq!(shown["items"], json!(["d1", "d2", "d3"]));
    assert_eq!(shown["settings"]["mode"], "window");
    assert_eq!(shown["count"], 3);
    let out = crate::cli::run_async(&s, &["admin", "digest", "dg-nothing"], None).await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no open digest `dg-nothing`"));

    // `admin digest ID flush`: closed now, sent by the running worker's closer
    let out = crate::cli::run_async(&s, &["admin", "digest", &d.id, "flush"], None).await;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("closed at"), "{text}");
    assert_eq!(digests.of("r10", None).await.unwrap()[0].state, "closing");
    // the group's next job opens a new digest
    publish(
        &conn,
        &s,
        &job("d4", "r10", "social", r#","digest_key":"post-9""#),
    )
    .await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Folded);
    let (stop, handle) = spawn_worker(w.clone()).await;
    let (id, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the flushed digest");
    assert_eq!((id.as_str(), count.as_deref()), (d.id.as_str(), Some("3")));
    assert_eq!(body["digest"]["key"], "post-9");
    let left = digests.of("r10", None).await.unwrap();
    assert_eq!(left.len(), 1, "d4's digest: {left:?}");
    assert_eq!(left[0].count, 1);
    assert!(digests.show(&d.id).await.is_err(), "sent: no longer open");
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn feedback_failed_on_a_digests_id_gives_its_one_send_back() {
    let s = digested(&unique("digest-feedback"), Duration::from_secs(3600), 3);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    for n in 1..=3 {
        publish(&conn, &s, &job(&format!("f{n}"), "r11", "capped", "")).await;
    }
    let (id, _, _) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the full digest");
    let keys = s.redis.keys();
    let sends = || async {
        let client = redis::Client::open(redis_url()).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        testkit::audit::recorded(&mut c, &keys.recipient("r11", "capped", None))
            .await
            .len()
    };
    assert_eq!(sends().await, 1, "a digest is one send, its items none");
    let failed = quota_worker_producer::Feedback::new(
        &id,
        quota_worker_producer::Event::Failed,
        "r11",
        "sms",
    );
    crate::feedback::send(&conn, &s, &failed).await;
    crate::feedback::heard(&s, &id, quota_worker_producer::Event::Failed).await;
    assert_eq!(sends().await, 0, "given back");
    stop.cancel();
    handle.await.unwrap();
}

/// What an open digest costs Redis, per item: its keys' `MEMORY USAGE` over a
/// digest of 100 items with a 200-byte payload each (the guide quotes it).
#[tokio::test]
async fn redis_memory_per_held_item_is_measured_and_bounded() {
    let s = digested(&unique("digest-memory"), Duration::from_secs(3600), 1000);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let payload = "x".repeat(200);
    let bodies: Vec<Vec<u8>> = (0..100)
        .map(|n| {
            format!(
                r#"{{"id":"mem-{n:04}","recipient":"r12","channel":"sms","category":"social","payload":{{"text":"{payload}"}}}}"#
            )
            .into_bytes()
        })
        .collect();
    for b in &bodies {
        publish(&conn, &s, b).await;
    }
    let digests = quota_worker::admin::Digests::new(w.store());
    wait_for("100 items folded", Duration::from_secs(20), || async {
        digests
            .of("r12", None)
            .await
            .unwrap()
            .first()
            .is_some_and(|d| d.count == 100)
    })
    .await;
    let mut r = redis_sync();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:*/dg*", s.redis.key_prefix))
        .query(&mut r)
        .unwrap();
    let mut bytes = 0u64;
    for k in &keys {
        let used: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(k)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut r)
            .unwrap();
        bytes += used.unwrap_or(0);
    }
    let per_item = bytes / 100;
    eprintln!(
        "digest memory: {bytes} bytes in {} keys for 100 items of a 200-byte payload: {per_item} bytes per item",
        keys.len()
    );
    // the item (its payload, id, instants) and its mark: well under a kilobyte
    // above the payload
    assert!(per_item < 200 + 1024, "{per_item} bytes per item");
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn an_open_digest_keeps_the_settings_it_opened_with_across_a_reload() {
    let s = digested(&unique("digest-reload"), Duration::from_secs(2), 100);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    for n in 1..=2 {
        publish(&conn, &s, &job(&format!("o{n}"), "r13", "social", "")).await;
    }
    let digests = quota_worker::admin::Digests::new(w.store());
    wait_for("the digest opened", Duration::from_secs(5), || async {
        digests
            .of("r13", None)
            .await
            .unwrap()
            .first()
            .is_some_and(|d| d.count == 2)
    })
    .await;
    // a reload: an hour's window, every item kept
    let mut reloaded = s.clone();
    let d = reloaded.policies.get_mut("social").unwrap();
    let d = d.digest.as_mut().unwrap();
    d.window = Some(Dur(Duration::from_secs(3600)));
    d.keep = 10;
    reloaded.validate().unwrap();
    let reloader = quota_worker::reload::Reloader::new(None, s.clone(), w.store().clone());
    reloader.apply(reloaded).unwrap();
    for n in 3..=4 {
        publish(&conn, &s, &job(&format!("o{n}"), "r13", "social", "")).await;
    }
    // closed at its own 2 s, keeping its own 2 items in full
    let (first, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the digest, at its own window's end");
    assert_eq!(count.as_deref(), Some("4"));
    assert_eq!(ids(&body), ["o1", "o2"]);
    // the next one opens with the new settings
    publish(&conn, &s, &job("o5", "r13", "social", "")).await;
    wait_for("the next digest opened", Duration::from_secs(5), || async {
        let open = digests.of("r13", None).await.unwrap();
        open.len() == 1 && open[0].id != first
    })
    .await;
    let next = &digests.of("r13", None).await.unwrap()[0];
    let shown = digests.show(&next.id).await.unwrap();
    let settings = shown.settings.unwrap();
    assert_eq!((settings.window_ms, settings.keep), (3_600_000, 10));
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn held_what_the_caps_would_delay_goes_as_one_digest_at_their_next_allowed_instant() {
    let mut s = digested(&unique("digest-held"), Duration::from_secs(2), 100);
    s.policies.insert(
        "held".into(),
        PolicySettings {
            rules: vec![RuleSettings {
                limit: 1,
                window: "4s".parse().unwrap(),
            }],
            digest: Some(DigestSettings {
                mode: DigestMode::Held,
                window: None,
                max_window: None,
                max_items: 100,
                keep: 10,
                keep_from: KeepFrom::First,
            }),
            ..PolicySettings::default()
        },
    );
    s.validate().expect("a valid held digest");
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    // the first goes as today; the three the cap would delay are folded
    for n in 1..=4 {
        publish(&conn, &s, &job(&format!("h{n}"), "r14", "held", "")).await;
    }
    let (first, header_count, _) = dispatched(&conn, &s, Duration::from_secs(5))
        .await
        .expect("h1, as today");
    assert_eq!((first.as_str(), header_count), ("h1", None));
    let sent_at = std::time::Instant::now();
    let (id, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the digest, at the cap's next allowed instant");
    let waited = sent_at.elapsed();
    assert!(id.starts_with("dg-"), "{id}");
    assert_eq!(count.as_deref(), Some("3"));
    assert_eq!(ids(&body), ["h2", "h3", "h4"]);
    assert!(
        waited > Duration::from_millis(3000),
        "sent when the cap allows the next send (4 s after h1): {waited:?}"
    );
    // the digest was one send: the next job is held again, into a new digest
    publish(&conn, &s, &job("h5", "r14", "held", "")).await;
    assert!(
        dispatched(&conn, &s, Duration::from_secs(2))
            .await
            .is_none(),
        "h5 waits: the digest used the cap"
    );
    let (next, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("h5's digest");
    assert_ne!(next, id);
    assert_eq!(
        (count.as_deref(), ids(&body)),
        (Some("1"), vec!["h5".to_string()])
    );
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn a_fold_the_replicas_asked_for_do_not_acknowledge_is_not_acked() {
    let mut s = digested(&unique("digest-wait"), Duration::from_secs(3600), 100);
    // one replica asked; the test's Redis has none
    s.redis.wait_replicas = 1;
    s.redis.wait_timeout = Dur(Duration::from_millis(100));
    let (_c, w, conn) = rig(&s).await;
    publish(&conn, &s, &job("w1", "r15", "social", "")).await;
    let m = take(&conn, &s.amqp.jobs_queue, Duration::from_secs(10))
        .await
        .expect("the job");
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let (session, committer) = w.session_context(p.clone(), stop.clone());
    let held = tokio::time::timeout(
        Duration::from_millis(1500),
        w.process(&session, &m.delivery),
    );
    assert!(
        held.await.is_err(),
        "not settled while no replica acknowledges"
    );
    stop.cancel();
    drop(session);
    committer.await.unwrap();
    // its redelivery, once replicas answer (here: a worker that asks for none), is
    // found folded: one item, not two
    let mut s0 = s.clone();
    s0.redis.wait_replicas = 0;
    let w0 = worker(&s0).await;
    let (session, committer) = w0.session_context(p, tokio_util::sync::CancellationToken::new());
    let outcome = w0.process(&session, &m.delivery).await.unwrap();
    assert_eq!(outcome, Outcome::Folded);
    drop(session);
    committer.await.unwrap();
    let open = quota_worker::admin::Digests::new(w0.store())
        .of("r15", None)
        .await
        .unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].count, 1);
}

#[tokio::test]
async fn a_held_digest_refused_when_it_goes_waits_and_goes_on_collecting() {
    let mut s = digested(&unique("digest-held-again"), Duration::from_secs(2), 100);
    // the policy allows one per 3 s; a cap over every sms two per 7 s, which
    // `transactional` jobs count toward without being held by it
    s.policies.insert(
        "held".into(),
        PolicySettings {
            rules: vec![RuleSettings {
                limit: 1,
                window: "3s".parse().unwrap(),
            }],
            digest: Some(DigestSettings {
                mode: DigestMode::Held,
                window: None,
                max_window: None,
                max_items: 100,
                keep: 10,
                keep_from: KeepFrom::First,
            }),
            ..PolicySettings::default()
        },
    );
    s.caps.insert(
        "sms_total".into(),
        quota_worker::config::CapSettings {
            rules: vec![RuleSettings {
                limit: 2,
                window: "7s".parse().unwrap(),
            }],
            ..Default::default()
        },
    );
    s.validate().expect("valid settings");
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let started = std::time::Instant::now();
    for n in 1..=3 {
        publish(&conn, &s, &job(&format!("a{n}"), "r16", "held", "")).await;
    }
    let (first, _, _) = dispatched(&conn, &s, Duration::from_secs(5))
        .await
        .expect("a1, as today");
    assert_eq!(first, "a1");
    // a2 and a3 are held by the policy until 3 s; at 1 s a receipt fills the cap
    tokio::time::sleep(Duration::from_millis(1000).saturating_sub(started.elapsed())).await;
    publish(&conn, &s, &job("t1", "r16", "transactional", "")).await;
    let (receipt, _, _) = dispatched(&conn, &s, Duration::from_secs(5))
        .await
        .expect("the receipt");
    assert_eq!(receipt, "t1");
    // at 3 s the policy allows the digest, the cap does not (until a1 leaves it,
    // at 7 s): it opens again, and a job the cap holds meanwhile (at 4 s) joins it
    tokio::time::sleep(Duration::from_millis(4000).saturating_sub(started.elapsed())).await;
    publish(&conn, &s, &job("a4", "r16", "held", "")).await;
    // one digest, open again, holding the three
    let digests = quota_worker::admin::Digests::new(w.store());
    wait_for("a4 folded", Duration::from_secs(2), || async {
        let open = digests.of("r16", None).await.unwrap();
        open.len() == 1 && open[0].count == 3 && open[0].state == "open"
    })
    .await;
    let reopened = digests.of("r16", None).await.unwrap()[0].id.clone();
    assert!(started.elapsed() < Duration::from_millis(6500));
    let (id, count, body) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .expect("the digest, when the cap allows it");
    assert_eq!(id, reopened, "the same digest, sent once");
    let at = started.elapsed();
    wait_for("the digest done with", Duration::from_secs(2), || async {
        digests.of("r16", None).await.unwrap().is_empty()
    })
    .await;
    assert!(id.starts_with("dg-"));
    assert_eq!(count.as_deref(), Some("3"), "{body}");
    assert_eq!(ids(&body), ["a2", "a3", "a4"]);
    assert!(
        at > Duration::from_millis(6500),
        "sent at the cap's 7 s: {at:?}"
    );
    assert!(dispatched(&conn, &s, Duration::from_secs(2))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn a_digest_larger_than_max_body_bytes_is_still_a_job() {
    let mut s = digested(&unique("digest-large"), Duration::from_secs(3600), 3);
    s.worker.max_body_bytes = 400;
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let text = "x".repeat(200);
    for n in 1..=3 {
        let body = format!(
            r#"{{"id":"big-{n}","recipient":"r17","channel":"sms","category":"social","payload":{{"text":"{text}"}}}}"#
        );
        assert!(body.len() < 400);
        publish(&conn, &s, body.as_bytes()).await;
    }
    let m = take(
        &conn,
        &topology(&s).dispatch_queue("sms"),
        Duration::from_secs(10),
    )
    .await
    .expect("the digest");
    assert!(
        m.delivery.data.len() > 400,
        "{} bytes",
        m.delivery.data.len()
    );
    assert_eq!(
        header(&m.delivery.properties, "x-notify-digest").as_deref(),
        Some("3")
    );
    // nothing dead-lettered `malformed` for its size
    assert!(take(&conn, &s.amqp.dead_queue, Duration::from_millis(500))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

/// The jobs a worker process counts as folded (`quota_worker_digest_items_total`
/// of policy `social` on its `/metrics`).
async fn folded_by(addr: &str) -> u64 {
    let (_, text) = http_get(addr, "/metrics").await.expect("its metrics");
    text.lines()
        .filter(|l| l.starts_with("quota_worker_digest_items_total{") && l.contains("\"social\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Three `quota-worker` processes on one group: 90 jobs of one recipient published
/// at once, taken by the three as they come (each holds up to its prefetch), all
/// folded into one digest that holds every job once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_folding_one_group_at_once_make_one_digest_of_every_item_once() {
    let mut s = digested(&unique("digest-procs"), Duration::from_secs(4), 1000);
    // every item carried in full, so each can be counted
    s.policies
        .get_mut("social")
        .unwrap()
        .digest
        .as_mut()
        .unwrap()
        .keep = 100;
    s.amqp.prefetch = 10;
    let (_c, _w, conn) = rig(&s).await;
    let dir = testkit::temp_dir("digest-procs");
    let mut procs = Vec::new();
    let mut addrs = Vec::new();
    for n in 0..3 {
        let mut one = s.clone();
        one.http.enabled = true;
        one.http.listen = format!("127.0.0.1:{}", testkit::free_port(None));
        addrs.push(one.http.listen.clone());
        let tag = n.to_string();
        procs.push(testkit::procs::WorkerProc::spawn_serving(
            crate::BIN,
            &one,
            &dir,
            &tag,
        ));
    }
    wait_for("three consumers", Duration::from_secs(30), || async {
        testkit::audit::consumers(&conn, &s.amqp.jobs_queue).await == Some(3)
    })
    .await;
    let bodies: Vec<Vec<u8>> = (0..90)
        .map(|n| job(&format!("q{n}"), "r20", "social", ""))
        .collect();
    publish_at_once(&conn, &s, &bodies).await;
    let (id, count, body) = dispatched(&conn, &s, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("a digest; worker 0:\n{}", procs[0].tail(20)));
    assert!(id.starts_with("dg-"), "{id}");
    assert_eq!(count.as_deref(), Some("90"));
    assert_eq!(
        (
            body["digest"]["count"].as_u64(),
            body["digest"]["omitted"].as_u64()
        ),
        (Some(90), Some(0))
    );
    let mut got = ids(&body);
    got.sort();
    let mut want: Vec<String> = (0..90).map(|n| format!("q{n}")).collect();
    want.sort();
    assert_eq!(got, want, "every job once");
    assert!(
        dispatched(&conn, &s, Duration::from_secs(5))
            .await
            .is_none(),
        "one digest, not two"
    );
    assert_eq!(depth(&conn, &s.amqp.jobs_queue).await, 0);
    // the three folded into it: each its share, 90 in all
    let mut folded = Vec::new();
    for addr in &addrs {
        folded.push(folded_by(addr).await);
    }
    assert_eq!(folded.iter().sum::<u64>(), 90, "{folded:?}");
    assert!(
        folded.iter().filter(|n| **n > 0).count() >= 2,
        "more than one process folded: {folded:?}"
    );
    for w in &mut procs {
        let status = w.stop();
        assert!(status.is_some_and(|s| s.success()), "{}", w.tail(20));
    }
    let panics = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path()).ok())
        .filter(|log| log.contains("panicked"))
        .count();
    assert_eq!(panics, 0, "a worker panicked");
}

/// `recipient`'s open digests once one of them is as `wanted` says (10 s at most).
async fn open_digests(
    digests: &quota_worker::admin::Digests<'_>,
    recipient: &str,
    wanted: impl Fn(&quota_worker::admin::OpenDigest) -> bool,
) -> Vec<quota_worker::admin::OpenDigest> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let open = digests.of(recipient, None).await.unwrap();
        if open.iter().any(&wanted) {
            return open;
        }
        assert!(std::time::Instant::now() < deadline, "{open:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `held` against a one-a-day cap across a change of daylight saving time, on the
/// real services: a private Redis and the worker binary on a clock set to 23:59:35
/// in Berlin on 28 March 2027, the day summer time began there (23 hours long:
/// 2027-03-27T23:00Z to 2027-03-28T22:00Z); RabbitMQ on real time. The first job
/// goes; the three after it are folded into one digest that closes at the
/// recipient's next midnight, 2027-03-28T22:00:00Z exactly (24 hours after the day
/// began would be an hour late), and is dispatched then, counted as one send. The
/// next job is held again, into a digest of the next (24-hour) day.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_against_one_a_day_across_a_dst_change_goes_at_the_midnight_ending_the_short_day() {
    use chrono::TimeZone;
    let utc = |d, h, m, s| chrono::Utc.with_ymd_and_hms(2027, 3, d, h, m, s).unwrap();
    let (day_start, midnight) = (utc(27, 23, 0, 0), utc(28, 22, 0, 0));
    assert_eq!(midnight - day_start, chrono::Duration::hours(23));
    let clock = testkit::clock::ShiftedClock::at(utc(28, 21, 59, 35));
    let redis =
        tokio::task::spawn_blocking(move || testkit::procs::RedisServer::with_clock(&clock))
            .await
            .unwrap();
    let mut s = settings(&unique("digest-dst"));
    s.redis.url = redis.url();
    s.policies.insert(
        "held".into(),
        PolicySettings {
            rules: vec![RuleSettings {
                limit: 1,
                window: "1d".parse().unwrap(),
            }],
            digest: Some(DigestSettings {
                mode: DigestMode::Held,
                window: None,
                max_window: None,
                max_items: 100,
                keep: 10,
                keep_from: KeepFrom::First,
            }),
            ..PolicySettings::default()
        },
    );
    s.validate().unwrap();
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    topology(&s).declare(&conn).await.unwrap();
    let dir = testkit::temp_dir("digest-dst");
    let mut env = testkit::env::worker_env(&s);
    env.extend(clock.env());
    let mut w = testkit::procs::WorkerProc::spawn_env(crate::BIN, &s, &dir, "0", env);
    wait_for("the worker consumes", Duration::from_secs(30), || async {
        testkit::audit::consumers(&conn, &s.amqp.jobs_queue).await == Some(1)
    })
    .await;
    let berlin = r#","timezone":"Europe/Berlin""#;
    for n in 1..=4 {
        publish(
            &conn,
            &s,
            &job(&format!("d{n}"), "r-berlin", "held", berlin),
        )
        .await;
    }
    let (first, header_count, _) = dispatched(&conn, &s, Duration::from_secs(10))
        .await
        .unwrap_or_else(|| panic!("d1, as today:\n{}", w.tail(20)));
    assert_eq!((first.as_str(), header_count), ("d1", None));
    // the three after it, folded into one digest closing at the next local midnight
    let store = quota_worker::store::QuotaStore::connect(&s).await.unwrap();
    let digests = quota_worker::admin::Digests::new(&store);
    let open = open_digests(&digests, "r-berlin", |d| d.count == 3).await;
    assert!(
        clock.now() < midnight,
        "the first job and the folds were on the 28th (too slow a start): {}",
        clock.now()
    );
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].closes_at, Some(midnight));
    let (id, count, body) = dispatched(&conn, &s, Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("the digest at midnight:\n{}", w.tail(20)));
    assert!(clock.now() >= midnight, "sent at {}", clock.now());
    assert_eq!(id, open[0].id);
    assert_eq!(count.as_deref(), Some("3"));
    assert_eq!(ids(&body), ["d2", "d3", "d4"]);
    // two sends recorded: d1 on the 28th, the digest (one send) on the 29th
    let keys = s.redis.keys();
    let mut rc = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let sends = testkit::audit::recorded(&mut rc, &keys.recipient("r-berlin", "held", None)).await;
    let times: Vec<i64> = sends.iter().map(|(t, ..)| *t).collect();
    assert_eq!(times.len(), 2, "{times:?}");
    assert!(times[0] < midnight.timestamp_millis(), "{times:?}");
    assert!(times[1] >= midnight.timestamp_millis(), "{times:?}");
    // the 29th's one send is used: the next job is held into the next day's digest,
    // which closes at the midnight after (a 24-hour day)
    publish(&conn, &s, &job("d5", "r-berlin", "held", berlin)).await;
    let open = open_digests(&digests, "r-berlin", |d| d.count == 1).await;
    let next = open.iter().find(|d| d.count == 1).unwrap();
    assert_ne!(next.id, id);
    assert_eq!(next.closes_at, Some(utc(29, 22, 0, 0)));
    assert!(dispatched(&conn, &s, Duration::from_secs(1))
        .await
        .is_none());
    let status = w.stop();
    assert!(status.is_some_and(|s| s.success()), "{}", w.tail(20));
}
