//! Erasing a recipient (issue #70), end to end through RabbitMQ and Redis, with
//! three workers (two in this process, one a `quota-worker` process): a recipient
//! with recorded sends, preferences, a suppression, a job waiting in the delay
//! ladder, one in an open digest, a pending escalation, a dead letter, and on its
//! paced channel one job held in a worker's line for its send slot (read from the
//! jobs queue), one read from its lane and held in its lane's line, one parked in
//! its lane's queue, is erased; an erase stopped before its dead-letter walk, the
//! worker process killed (`kill -9`) meanwhile, is completed by running it again;
//! afterwards no Redis key and no message holding the recipient is left (by its
//! clear value or its keyed hash), and none of its jobs is dispatched while the
//! other recipients' jobs all are; a third erase finds nothing and says so. With
//! `--keep-suppression` only the suppression stays.

use std::time::Duration;

use chrono::Utc;
use quota_worker::config::{
    DigestSettings, Dur, FallbackSettings, PolicySettings, RuleSettings, Settings,
};
use quota_worker::erase::{self, Erased, Request};
use quota_worker::quota::digest::{DigestMode, KeepFrom};
use quota_worker::store::QuotaStore;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::cli::run;
use quota_worker::config::LanePrefetch;
use quota_worker::lanes::Priority;
use quota_worker::quota::policy::Rate;
use testkit::audit::{consumers, drain};
use testkit::procs::WorkerProc;
use testkit::*;

const R: &str = "+33 6 00 00 70 70";
const O: &str = "+33 6 00 00 70 71";

/// Three delay levels (a wait goes round every 7 s); `sms` paced at 1/s with its
/// lanes (a job read from the jobs queue waits up to 9 s in a line before it is
/// parked, and at most half `redis.reservation_lease`, 5 s; a worker holds one
/// delivery of a lane at a time); policies `capped` (5 a day), `digest` (an hour's window) and `default`
/// (no rules, escalating after 30 s without an answer).
fn erasing(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.amqp.delay_levels = 3;
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(1);
    sms.burst = Some(1);
    s.lanes.park_after = Dur(Duration::from_secs(9));
    s.lanes.prefetch = LanePrefetch::Max(1);
    // a job waits at most 5 s in a line before it is parked; the killed
    // worker's reservations lapse within the test
    s.redis.reservation_lease = Dur(Duration::from_secs(10));
    let capped = PolicySettings {
        rules: vec![RuleSettings {
            limit: 5,
            window: "1d".parse().unwrap(),
        }],
        ..PolicySettings::default()
    };
    s.policies.insert("capped".into(), capped);
    let digest = PolicySettings {
        digest: Some(DigestSettings {
            mode: DigestMode::Window,
            window: Some(Dur(Duration::from_secs(3600))),
            max_window: None,
            max_items: 10,
            keep: 2,
            keep_from: KeepFrom::First,
        }),
        ..PolicySettings::default()
    };
    s.policies.insert("digest".into(), digest);
    let p = s.policies.get_mut("default").unwrap();
    p.rules.clear();
    p.fallback = Some(FallbackSettings {
        on: Some(vec!["unanswered".into()]),
        wait_at_most: None,
        answer_within: Some(Dur(Duration::from_secs(30))),
        answered_by: None,
    });
    s.validate().expect("valid settings");
    s
}

fn job(id: &str, recipient: &str, channel: &str, category: &str, extra: &str) -> Vec<u8> {
    format!(
        r#"{{"id":"{id}","recipient":"{recipient}","channel":"{channel}","category":"{category}","payload":{{"to":"{recipient}"}}{extra}}}"#
    )
    .into_bytes()
}

/// Every key of the test's prefix whose name or value holds one of `needles`.
async fn traces(s: &Settings, needles: &[String]) -> Vec<String> {
    let client = redis::Client::open(s.redis.url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let pattern = format!("{}*", s.redis.key_prefix);
    let mut found = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .unwrap();
        for key in keys {
            let text = value_text(&mut c, &key).await;
            if needles.iter().any(|n| key.contains(n) || text.contains(n)) {
                found.push(key);
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    found.sort();
    found
}

/// A key's value as text, whatever its type.
async fn value_text(c: &mut redis::aio::MultiplexedConnection, key: &str) -> String {
    let kind: String = redis::cmd("TYPE").arg(key).query_async(c).await.unwrap();
    let cmd = match kind.as_str() {
        "string" => redis::cmd("GET").arg(key).clone(),
        "hash" => redis::cmd("HGETALL").arg(key).clone(),
        "zset" => redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).clone(),
        "list" => redis::cmd("LRANGE").arg(key).arg(0).arg(-1).clone(),
        "set" => redis::cmd("SMEMBERS").arg(key).clone(),
        _ => return String::new(),
    };
    let v: redis::Value = cmd.query_async(c).await.unwrap_or(redis::Value::Nil);
    format!("{v:?}")
        + &match v {
            redis::Value::Array(items) => items
                .into_iter()
                .filter_map(|i| redis::from_redis_value::<Vec<u8>>(i).ok())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect::<Vec<_>>()
                .join(" "),
            other => redis::from_redis_value::<Vec<u8>>(other)
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default(),
        }
}

async fn erase_once(
    store: &QuotaStore,
    s: &Settings,
    conn: &lapin::Connection,
    stop: &CancellationToken,
) -> Erased {
    let req = Request {
        recipient: R,
        tenant: None,
        keep_suppression: false,
        who: "test",
    };
    erase::erase(store, s, conn, &req, stop).await.unwrap()
}

/// Take what reaches `queues` into `sent` until `done` says so; panics after `within`.
async fn collect(
    conn: &lapin::Connection,
    queues: &[&str],
    sent: &mut Vec<String>,
    within: Duration,
    done: impl Fn(&[String]) -> bool,
) {
    let deadline = std::time::Instant::now() + within;
    while !done(sent) {
        assert!(
            std::time::Instant::now() < deadline,
            "not all sent: {sent:?}"
        );
        for q in queues {
            while let Some(m) = take(conn, q, Duration::from_millis(50)).await {
                sent.push(message_id(&m).to_string());
            }
        }
    }
}

/// Publish R's and O's jobs of every kind, and wait until each is where it waits.
async fn set_up(s: &Settings, store: &QuotaStore, conn: &lapin::Connection) {
    let later = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let soon = (Utc::now() + chrono::Duration::seconds(6)).to_rfc3339();
    for (who, tag) in [(R, "r"), (O, "o")] {
        let prefs = json!({"categories": {"marketing": false}});
        quota_worker::preferences::edit::put(store, None, who, &prefs)
            .await
            .unwrap();
        publish(
            conn,
            s,
            &job(&format!("{tag}-sent"), who, "push", "capped", ""),
        )
        .await;
        publish(
            conn,
            s,
            &job(&format!("{tag}-dead"), who, "fax", "default", ""),
        )
        .await;
    }
    let out = run(
        s,
        &[
            "admin",
            "recipient",
            R,
            "suppress",
            "--channel",
            "email",
            "--event",
            "bounced",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let ladder = format!(r#","not_before":"{later}""#);
    publish(conn, s, &job("r-ladder", R, "push", "default", &ladder)).await;
    let soon = format!(r#","not_before":"{soon}""#);
    publish(conn, s, &job("o-ladder", O, "push", "default", &soon)).await;
    publish(conn, s, &job("r-digest", R, "push", "digest", "")).await;
    publish(
        conn,
        s,
        &job(
            "r-escalate",
            R,
            "push",
            "default",
            r#","fallback":["email"]"#,
        ),
    )
    .await;
    let push = topology(s).dispatch_queue("push");
    let mut sent = Vec::new();
    let first = ["r-sent", "o-sent", "r-escalate"];
    collect(conn, &[&push], &mut sent, Duration::from_secs(20), |sent| {
        first.iter().all(|id| sent.iter().any(|s| s == id))
    })
    .await;
    wait_for("the two dead letters", Duration::from_secs(10), || async {
        depth(conn, &s.amqp.dead_queue).await >= 2
    })
    .await;
}

/// A job as a producer publishes it: with its AMQP `timestamp`.
fn stamped() -> lapin::BasicProperties {
    lapin::BasicProperties::default()
        .with_content_type("application/json".into())
        .with_timestamp(Utc::now().timestamp() as u64)
}

/// O's jobs on `sms` that wait at the erase (then are sent).
const O_SMS: [&str; 8] = [
    "o-sms-0", "o-sms-1", "o-sms-2", "o-sms-3", "o-lane-0", "o-lane-1", "o-lane-2", "o-lane-3",
];

/// Jobs on `sms` that wait when the erase comes: its rate taken 8 s ahead (as a
/// slow channel's would be), then R's `r-line-*` read from the jobs queue, one
/// by each worker (a wait of 8 s is within `lanes.park_after`: each waits in a
/// worker's line, 5 s, then is parked, after the erase; the killed worker's is
/// read again), O's behind them, R's `r-lane-held`
/// published to its lane first (a worker reads it at once and holds it in its
/// lane's line), then O's, then R's `r-lane-parked` (each worker holds one lane
/// delivery: it waits in the lane's queue).
async fn hold_sms(s: &Settings, store: &QuotaStore, conn: &lapin::Connection) {
    let ahead = Rate {
        interval_us: 8_000_000,
        burst: 1,
        cost: 1,
    };
    let taken = store.call_rate("sms", ahead, 1).await.unwrap();
    assert_eq!(taken.allowed, 1, "the rate taken 8 s ahead: {taken:?}");
    for id in ["r-line-0", "r-line-1", "r-line-2"] {
        publish_with(conn, s, &job(id, R, "sms", "default", ""), stamped()).await;
    }
    for id in &O_SMS[..4] {
        publish_with(conn, s, &job(id, O, "sms", "default", ""), stamped()).await;
    }
    to_lane(s, conn, "r-lane-held", R).await;
    for id in &O_SMS[4..] {
        to_lane(s, conn, id, O).await;
    }
    to_lane(s, conn, "r-lane-parked", R).await;
}

/// Publish job `id` of `who` to `sms`'s normal lane, as a producer that knows
/// its lane does.
async fn to_lane(s: &Settings, conn: &lapin::Connection, id: &str, who: &str) {
    let lane = topology(s).lane_queue("sms", Priority::Normal);
    let p = quota_worker::amqp::Publisher::open(conn, Duration::from_secs(10))
        .await
        .unwrap();
    let props = stamped().with_message_id(id.into());
    let body = job(id, who, "sms", "default", "");
    p.publish("", &lane, &body, props).await.unwrap();
}

#[tokio::test]
async fn erase_forgets_a_recipient_everywhere_and_none_of_its_waiting_jobs_is_sent() {
    let ns = unique("erase");
    let s = erasing(&ns);
    let (_c, w1, conn) = rig(&s).await;
    let store = w1.store();
    let mut workers = vec![spawn_worker(w1.clone()).await];
    workers.push(spawn_worker(worker(&s).await).await);
    let dir = temp_dir("erase");
    let mut killed = WorkerProc::spawn(crate::BIN, &s, &dir, "killed");
    wait_for("three workers", Duration::from_secs(30), || async {
        consumers(&conn, &s.amqp.jobs_queue).await == Some(3)
    })
    .await;
    set_up(&s, store, &conn).await;
    hold_sms(&s, store, &conn).await;
    let tag = store.keys().recipient_tag(R);
    let needles = vec![R.to_string(), tag.clone()];
    let before = traces(&s, &needles).await;
    for store_name in [
        "/prefs",
        "/suppressed",
        "/waiting",
        "/dgm/",
        "/route:",
        ":capped",
    ] {
        assert!(
            before.iter().any(|k| k.contains(store_name)),
            "R has a {store_name} key before the erase: {before:?}"
        );
    }

    // an erase stopped before its dead-letter walk, the worker process killed
    // meanwhile (what it held goes back to its queues, to the other workers)
    let stopped = CancellationToken::new();
    stopped.cancel();
    let first = {
        let (store, s, conn, stopped) = (store.clone(), s.clone(), &conn, stopped.clone());
        let erasing = async move { erase_once(&store, &s, conn, &stopped).await };
        let kill = async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            killed.kill9();
        };
        tokio::join!(erasing, kill).0
    };
    assert!(first.interrupted && !first.nothing, "{first:?}");
    assert_eq!(first.recipient_tag, tag);
    for name in [
        "sends",
        "preferences",
        "suppressions",
        "waiting",
        "digests",
        "routes",
    ] {
        assert!(
            first.keys.get(name).copied().unwrap_or(0) >= 1,
            "{name}: {first:?}"
        );
    }
    assert_eq!(
        (first.open_digests, first.digest_items),
        (1, 1),
        "{first:?}"
    );
    assert!(first.waiting_jobs >= 1, "{first:?}");
    // run again: it completes (the dead letter), finding the keys gone; R's jobs
    // on sms wait for a slot 8 s after they were published: none came yet
    let sms = topology(&s).dispatch_queue("sms");
    let push = topology(&s).dispatch_queue("push");
    let mut sent = Vec::new();
    for q in [&sms, &push] {
        while let Some(m) = take(&conn, q, Duration::from_millis(50)).await {
            sent.push(message_id(&m).to_string());
        }
    }
    let second = erase_once(store, &s, &conn, &CancellationToken::new()).await;
    assert!(!second.interrupted, "{second:?}");
    assert_eq!(second.dead_letters, 1, "{second:?}");
    let indexed = first.dead_index_entries + second.dead_index_entries;
    assert_eq!(
        indexed, 1,
        "the console's index entry: {first:?} {second:?}"
    );
    assert!(second.keys.is_empty(), "{second:?}");

    // R's waiting jobs come back (the ladder's 7 s) or get their slot (sms at 1/s
    // after 8 s) and are dropped; O's are sent
    collect(
        &conn,
        &[&sms, &push],
        &mut sent,
        Duration::from_secs(90),
        |sent| {
            O_SMS.iter().all(|id| sent.iter().any(|s| s == id))
                && sent.contains(&"o-ladder".to_string())
        },
    )
    .await;
    // one more round of the ladder and of the escalation's wait for R's jobs
    tokio::time::sleep(Duration::from_secs(9)).await;
    for (stop, handle) in workers.drain(..) {
        stop.cancel();
        let _ = handle.await;
    }
    let topo = topology(&s);
    let mut held = Vec::new();
    for q in topo.queues() {
        for m in drain(&conn, &q).await {
            if q == sms || q == push {
                sent.push(m.id.clone());
            }
            let body = String::from_utf8_lossy(&m.body);
            if body.contains(R) {
                held.push(format!("{q}: {}", m.id));
            }
            if q == s.amqp.dead_queue {
                assert_eq!(m.id, "o-dead", "only O's dead letter stays");
            }
        }
    }
    assert!(held.is_empty(), "messages still holding R: {held:?}");
    let r_sent: Vec<&String> = sent.iter().filter(|id| id.starts_with("r-")).collect();
    assert!(
        r_sent.is_empty(),
        "R's jobs sent after the erase: {r_sent:?}"
    );
    let left = traces(&s, &needles).await;
    assert!(left.is_empty(), "keys still holding R: {left:?}");

    // O is untouched: its preferences and recorded send are there
    let o = traces(&s, &[store.keys().recipient_tag(O)]).await;
    assert!(o.iter().any(|k| k.ends_with("/prefs")), "{o:?}");
    assert!(o.iter().any(|k| k.ends_with(":capped")), "{o:?}");

    // a third erase finds nothing and says so
    let out = run(&s, &["admin", "recipient", R, "erase"], None);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nothing to erase"), "{text}");
    assert!(!text.contains(R), "{text}");
}

#[tokio::test]
async fn erase_keeping_the_suppression_leaves_its_keyed_tombstone_only() {
    let ns = unique("erase-keep");
    let s = settings(&ns);
    let (_c, w, _conn) = rig(&s).await;
    let store = w.store();
    let prefs = json!({"categories": {"marketing": false}});
    quota_worker::preferences::edit::put(store, None, R, &prefs)
        .await
        .unwrap();
    let out = run(
        &s,
        &[
            "admin",
            "recipient",
            R,
            "suppress",
            "--channel",
            "email",
            "--event",
            "complained",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let out = run(
        &s,
        &[
            "admin",
            "recipient",
            R,
            "erase",
            "--keep-suppression",
            "--json",
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let erased: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(erased["keys"], json!({"preferences": 1}), "{erased}");
    assert_eq!(erased["kept"], json!(["suppressions"]), "{erased}");
    let tag = store.keys().recipient_tag(R);
    let left = traces(&s, &[R.to_string(), tag.clone()]).await;
    assert_eq!(left, [store.keys().suppressed(R)]);
    // the tombstone holds the kind and times alone, never the recipient
    let list = quota_worker::admin::suppressions::list(store, R, None)
        .await
        .unwrap();
    assert_eq!(list.len(), 1, "{list:?}");
}

#[tokio::test]
async fn erase_over_http_asks_for_the_api_token_and_answers_by_store() {
    let ns = unique("erase-http");
    let s = settings(&ns);
    let (_c, w, _conn) = rig(&s).await;
    let store = w.store().clone();
    let token = "erase-token-0123456789".to_string();
    let guard = quota_worker::http::guard::Guard::token(&token.clone().into());
    let (addr, stop) = crate::preference_api::serve(&s, &store, guard).await;
    let prefs = json!({"categories": {"marketing": false}});
    quota_worker::preferences::edit::put(&store, Some("acme"), R, &prefs)
        .await
        .unwrap();
    let path = "/v1/recipients/%2B33%206%2000%2000%2070%2070?tenant=acme";
    let call = |token| crate::preference_api::call(&addr, "DELETE", path, "", token);
    let (status, _) = call(None).await;
    assert_eq!(status, 401);
    let got = |status, body: String| {
        assert_eq!(status, 200, "{body}");
        let json: serde_json::Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| {
            // a chunked body: its one chunk's text
            let inner = body.lines().nth(1).unwrap_or_default().to_string();
            serde_json::from_str(&inner).unwrap_or_else(|_| panic!("{e}: {body}"))
        });
        assert!(!body.contains("+33"), "{body}");
        json
    };
    let (status, body) = call(Some(&token)).await;
    let first = got(status, body);
    assert_eq!(first["keys"], json!({"preferences": 1}), "{first}");
    assert_eq!(first["tenant"], json!("acme"), "{first}");
    let tag = store.keys().for_tenant(Some("acme")).recipient_tag(R);
    assert_eq!(first["recipient_tag"], json!(tag));
    let (status, body) = call(Some(&token)).await;
    assert_eq!(got(status, body)["nothing"], json!(true));
    assert!(traces(&s, &[R.to_string(), tag]).await.is_empty());
    stop.cancel();
}

/// Publish `n` dead letters to the dead-letter exchange, each confirmed.
async fn dead_letters(conn: &lapin::Connection, s: &Settings, n: usize) {
    let p = quota_worker::amqp::Publisher::open(conn, Duration::from_secs(10))
        .await
        .unwrap();
    for i in 0..n {
        let props = lapin::BasicProperties::default().with_message_id(format!("d{i}").into());
        p.publish(&s.amqp.dead_exchange, "", b"{}", props)
            .await
            .unwrap();
    }
}

#[tokio::test]
async fn the_dead_letter_queue_is_bounded_and_one_declared_before_is_kept_as_it_was() {
    // declared bounded: the oldest dead letters beyond the length are dropped
    let mut s = settings(&unique("erase-dead-bound"));
    s.amqp.dead_max_length = 2;
    let (_c, _w, conn) = rig(&s).await;
    dead_letters(&conn, &s, 3).await;
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 2);
    let kept: Vec<String> = drain(&conn, &s.amqp.dead_queue)
        .await
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(kept, ["d1", "d2"]);

    // a queue declared before the bounds (as earlier versions did) refuses them:
    // the topology is declared all the same, the queue as it was
    let mut s = settings(&unique("erase-dead-old"));
    s.amqp.dead_max_length = 2;
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let ch = conn.create_channel().await.unwrap();
    let mut args = lapin::types::FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        lapin::types::AMQPValue::LongString("quorum".into()),
    );
    args.insert(
        "x-delivery-limit".into(),
        lapin::types::AMQPValue::LongLongInt(i32::MAX as i64),
    );
    let durable = lapin::options::QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(s.amqp.dead_queue.as_str().into(), durable, args)
        .await
        .unwrap();
    topology(&s).declare(&conn).await.expect("declared");
    dead_letters(&conn, &s, 3).await;
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 3, "its own bounds");
}

/// The broker's CPU time so far (`beam.smp`, user and system), in ms; `None`
/// when it is not a process of this machine.
fn broker_cpu_ms() -> Option<u64> {
    let tick = 1000 / 100; // USER_HZ is 100 on Linux
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if comm.trim() == "beam.smp" {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let after = stat.rsplit_once(") ")?.1;
            let f: Vec<&str> = after.split(' ').collect();
            let (u, s): (u64, u64) = (f[11].parse().ok()?, f[12].parse().ok()?);
            return Some((u + s) * tick);
        }
    }
    None
}

/// Redis's CPU time so far (ms) and commands processed.
async fn redis_load(s: &Settings) -> (f64, u64) {
    let client = redis::Client::open(s.redis.url.as_str()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("all")
        .query_async(&mut c)
        .await
        .unwrap();
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let cpu = (field("used_cpu_user") + field("used_cpu_sys")) * 1000.0;
    (cpu, field("total_commands_processed") as u64)
}

/// Figures (BENCHMARKS.md, "An erase among waiting jobs"): R with `QW_ERASE_MINE`
/// (1,000) jobs waiting in the delay ladder among `QW_ERASE_OTHERS` (100,000) of
/// 10,000 other recipients, put there by a worker (`QW_BIN`, else the debug build);
/// then R erased, timed, with the broker's and Redis's CPU and Redis's commands
/// meanwhile (both shared with whatever else runs on the machine). Ignored: run it
/// with `--run-ignored only`.
#[tokio::test]
#[ignore]
async fn figures_an_erase_among_waiting_jobs() {
    let count = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (mine, others) = (
        count("QW_ERASE_MINE", 1_000),
        count("QW_ERASE_OTHERS", 100_000),
    );
    let s = settings(&unique("erase-figures"));
    let (_c, w, conn) = rig(&s).await;
    let bin = std::env::var("QW_BIN").unwrap_or_else(|_| crate::BIN.to_string());
    let dir = temp_dir("erase-figures");
    let mut worker = WorkerProc::spawn(&bin, &s, &dir, "w");
    let later = (Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let extra = format!(r#","not_before":"{later}""#);
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(30))
        .await
        .unwrap();
    let total = mine + others;
    let every = total / mine.max(1);
    for chunk in (0..total).collect::<Vec<_>>().chunks(500) {
        let sends = chunk.iter().map(|n| {
            let who = if n % every == 0 && n / every < mine {
                R.to_string()
            } else {
                format!("+1555{:07}", n % 10_000)
            };
            let body = job(&format!("j{n}"), &who, "push", "default", &extra);
            let p = &p;
            let exchange = &s.amqp.jobs_exchange;
            async move { p.publish(exchange, "", &body, stamped()).await.unwrap() }
        });
        futures_util::future::join_all(sends).await;
    }
    let topo = topology(&s);
    let ladder: Vec<String> = topo
        .queues()
        .into_iter()
        .filter(|q| q.starts_with(&s.amqp.delay_prefix))
        .collect();
    let placed = std::time::Instant::now();
    loop {
        let mut n = 0;
        for q in &ladder {
            n += depth(&conn, q).await as usize;
        }
        if n >= total {
            break;
        }
        assert!(worker.running(), "{}", worker.tail(20));
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let placed = placed.elapsed();
    let (broker0, (redis_cpu0, cmds0)) = (broker_cpu_ms(), redis_load(&s).await);
    let started = std::time::Instant::now();
    let erased = erase_once(w.store(), &s, &conn, &CancellationToken::new()).await;
    let took = started.elapsed();
    let (broker1, (redis_cpu1, cmds1)) = (broker_cpu_ms(), redis_load(&s).await);
    worker.stop();
    assert!(!erased.nothing && !erased.interrupted, "{erased:?}");
    println!(
        "figures: {mine} of R among {total} waiting jobs (placed by the worker in {placed:?}): \
         erase {took:?} (of which {:?} the marks' poll), {} keys, {} waiting jobs noted; \
         broker CPU {:?} ms, Redis CPU {:.0} ms, Redis commands {} (the machine's, meanwhile)",
        CANCEL_WAIT,
        erased.keys.values().sum::<u64>(),
        erased.waiting_jobs,
        broker1.zip(broker0).map(|(a, b)| a - b),
        redis_cpu1 - redis_cpu0,
        cmds1 - cmds0,
    );
}

/// What an erase waits for the workers to know its mark (`crate::erase`).
const CANCEL_WAIT: Duration = Duration::from_millis(1100);
