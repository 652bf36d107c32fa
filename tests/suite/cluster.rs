//! The engine and the worker against a Redis Cluster: a local three-master cluster
//! started from the machine's `redis-server` (cluster mode, no persistence, free
//! loopback ports, temp dirs), shared by every test of this module and killed when
//! the test process exits. Each test keeps its own key prefix.
//!
//! They run the engine scenarios (`scenarios`) that `engine` runs on a single node
//! (caps, exact retry times, duplicates, release, the GCRA rate, concurrent
//! admissions), the cluster's own cases (scripts on every node, keys spread over the
//! masters) and one end-to-end run of the worker, with `redis.cluster = true`, and
//! one of digests.

use std::sync::OnceLock;
use std::time::Duration;

use crate::scenarios::{self, admitted, engine, req};
use chrono_tz::Tz;
use quota_worker::config::Settings;
use quota_worker::redis::RedisConn;
use serde_json::json;
use testkit::audit::{self, noon_zone, publish_all, Audit, Published};
use testkit::procs::RedisCluster;
use testkit::reliability::record;
use testkit::*;

static CLUSTER: OnceLock<RedisCluster> = OnceLock::new();

/// The two tests that flush the scripts on every node run one at a time.
static SCRIPTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster() -> &'static RedisCluster {
    CLUSTER.get_or_init(RedisCluster::start)
}

/// Settings for one test: unique names, Redis Cluster.
pub(crate) fn cluster_settings(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.redis.cluster = true;
    s.redis.cluster_urls = cluster().urls();
    s.redis.url = "redis://127.0.0.1:1".into(); // must not be used
    s
}

/// Deletes the test's keys on every node when dropped.
pub(crate) struct ClusterKeys(pub(crate) String);

impl Drop for ClusterKeys {
    fn drop(&mut self) {
        cluster().delete_prefix(&self.0);
    }
}

#[tokio::test]
async fn the_connection_is_a_cluster_connection() {
    let ns = unique("c-kind");
    let e = engine(&cluster_settings(&ns)).await;
    assert!(matches!(e.connection(), RedisConn::Cluster(..)));
    e.ping().await.unwrap();
    e.sync_clock().await.unwrap();
}

#[tokio::test]
async fn second_job_same_local_day_waits_for_the_recipients_next_midnight() {
    let ns = unique("c-day");
    let _k = ClusterKeys(ns.clone());
    scenarios::second_job_same_local_day_waits_for_the_next_midnight(cluster_settings(&ns)).await;
}

#[tokio::test]
async fn feedback_events_on_the_cluster() {
    let ns = unique("c-feedback");
    let _k = ClusterKeys(ns.clone());
    crate::feedback::engine_scenario(cluster_settings(&ns)).await;
}

#[tokio::test]
async fn rolling_window_retry_is_exact() {
    let ns = unique("c-rolling");
    let _k = ClusterKeys(ns.clone());
    scenarios::rolling_window_retry_is_exact(cluster_settings(&ns)).await;
}

#[tokio::test]
async fn same_job_twice_is_in_flight_then_a_duplicate_and_counts_once() {
    let ns = unique("c-dup");
    let _k = ClusterKeys(ns.clone());
    scenarios::same_job_twice_is_in_flight_then_a_duplicate_and_counts_once(cluster_settings(&ns))
        .await;
}

#[tokio::test]
async fn release_gives_the_quota_back() {
    let ns = unique("c-release");
    let _k = ClusterKeys(ns.clone());
    scenarios::release_gives_the_quota_back(cluster_settings(&ns)).await;
}

#[tokio::test]
async fn a_refused_job_leaves_no_trace_in_the_rate() {
    let ns = unique("c-trace");
    let _k = ClusterKeys(ns.clone());
    scenarios::a_refused_job_leaves_no_trace_in_the_rate(cluster_settings(&ns)).await;
}

/// The channel's rate key is one slot, on one node: batched takes keep its calls
/// far below the jobs asking, and the rate exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_takes_drain_the_rate() {
    let ns = unique("c-gcra-batch");
    let _k = ClusterKeys(ns.clone());
    scenarios::batched_takes_drain_the_rate(cluster_settings(&ns), 3, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn gcra_replies_and_state_are_exact_integers() {
    let ns = unique("c-gcra");
    let _k = ClusterKeys(ns.clone());
    scenarios::gcra_replies_and_state_are_exact_integers(cluster_settings(&ns)).await;
}

#[tokio::test]
async fn two_hundred_concurrent_admissions_over_eight_connections_admit_one() {
    let ns = unique("c-race");
    let _k = ClusterKeys(ns.clone());
    scenarios::concurrent_admissions_admit_one(cluster_settings(&ns)).await;
}

#[tokio::test]
async fn fifty_concurrent_jobs_under_a_total_of_two_dispatch_exactly_two() {
    let ns = unique("c-caps-race");
    let _k = ClusterKeys(ns.clone());
    crate::caps::concurrent_jobs_under_a_total_dispatch_exactly_the_total(
        cluster_settings(&ns),
        5,
        50,
    )
    .await;
}

#[tokio::test]
async fn channel_rate_holds_under_concurrency() {
    let ns = unique("c-gcra-load");
    let _k = ClusterKeys(ns.clone());
    scenarios::channel_rate_holds_under_concurrency(
        cluster_settings(&ns),
        4,
        Duration::from_millis(1000),
    )
    .await;
}

/// A node that lost its scripts (restart, failover, `SCRIPT FLUSH`) answers
/// NOSCRIPT; the engine loads the script on every node and goes on.
#[tokio::test]
async fn scripts_flushed_on_every_node_are_loaded_again() {
    let _one = SCRIPTS.lock().await;
    let ns = unique("c-noscript");
    let _k = ClusterKeys(ns.clone());
    let e = engine(&cluster_settings(&ns)).await;
    admitted(&e.admit(&req("a", "ivan", Tz::UTC)).await.unwrap());
    let _: Vec<String> = cluster().each(&redis::cmd("SCRIPT").arg("FLUSH").clone());
    for i in 0..20 {
        let id = format!("after-{i}");
        let who = format!("who-{i}");
        admitted(&e.admit(&req(&id, &who, Tz::UTC)).await.unwrap());
    }
    // and the scripts are on every node again (loaded where they were needed)
    let sha = redis::Script::new(quota_worker::redis::scripts::ADMIT_LUA)
        .get_hash()
        .to_string();
    let exists: Vec<Vec<i64>> =
        cluster().each(&redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).clone());
    assert!(exists.iter().all(|v| v == &vec![1]), "{exists:?}");
}

/// Recipients land on every master (one hash slot per recipient), so these tests
/// exercise routing to all three nodes.
#[tokio::test]
async fn recipients_spread_over_the_three_masters() {
    let ns = unique("c-spread");
    let _k = ClusterKeys(ns.clone());
    let e = engine(&cluster_settings(&ns)).await;
    for i in 0..60 {
        let id = format!("j-{i}");
        let who = format!("r-{i}");
        e.commit(admitted(&e.admit(&req(&id, &who, Tz::UTC)).await.unwrap()))
            .await
            .unwrap();
    }
    let per_node: Vec<Vec<String>> =
        cluster().each(&redis::cmd("KEYS").arg(format!("{ns}:*")).clone());
    let counts: Vec<usize> = per_node.iter().map(|k| k.len()).collect();
    assert_eq!(counts.iter().sum::<usize>(), 60, "{counts:?}");
    assert!(counts.iter().all(|&n| n > 0), "keys per node: {counts:?}");
}

/// 300 admissions at once (150 recipients, two jobs each, one per day) for a
/// cluster: each node gets one call for the jobs whose slots it owns, and each job
/// is decided as if alone: exactly one admitted per recipient, in far fewer calls
/// than jobs (each job its own call before batching per node).
async fn burst_on_cluster(e: &std::sync::Arc<quota_worker::store::QuotaStore>, ns: &str) -> u64 {
    let before = e.calls();
    let admissions = (0..300).map(|i| {
        let e = e.clone();
        let (id, who) = (format!("{ns}-{i}"), format!("who-{}", i % 150));
        tokio::spawn(async move { e.admit(&req(&id, &who, Tz::UTC)).await })
    });
    let mut admitted = std::collections::HashMap::<usize, usize>::new();
    for (i, handle) in admissions.collect::<Vec<_>>().into_iter().enumerate() {
        match handle.await.unwrap().unwrap() {
            quota_worker::admission::Admission::Admitted(_) => {
                *admitted.entry(i % 150).or_default() += 1
            }
            quota_worker::admission::Admission::Refused { .. } => {}
            other => panic!("job {i}: {other:?}"),
        }
    }
    assert_eq!(admitted.len(), 150, "every recipient got one");
    assert!(admitted.values().all(|&n| n == 1), "{admitted:?}");
    e.calls() - before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_goes_to_each_node_in_one_call() {
    let ns = unique("c-burst");
    let _k = ClusterKeys(ns.clone());
    let e = std::sync::Arc::new(engine(&cluster_settings(&ns)).await);
    let calls = burst_on_cluster(&e, &ns).await;
    eprintln!("{calls} Redis calls for 300 admissions on three masters");
    // one by one they were 300 calls; batched per node, a few per burst
    assert!(
        calls < 100,
        "{calls} calls for 300 admissions: not batched per node"
    );
}

/// A slot map that is wrong (every slot put on one node, as if the others' slots
/// had moved to it): the calls go where the map says, the keys that node does not
/// own answer "not here" having written nothing, and those jobs are asked again on
/// their own; every decision stays exact, and the map is read again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_slot_map_costs_calls_not_decisions() {
    let ns = unique("c-stale");
    let _k = ClusterKeys(ns.clone());
    let e = std::sync::Arc::new(engine(&cluster_settings(&ns)).await);
    let RedisConn::Cluster(_, slots, _) = e.connection() else {
        panic!("a cluster connection")
    };
    let first = &cluster().urls()[0];
    let port: i64 = first
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let all_on_one = redis::Value::Array(vec![redis::Value::Array(vec![
        redis::Value::Int(0),
        redis::Value::Int(16383),
        redis::Value::Array(vec![
            redis::Value::BulkString(b"127.0.0.1".to_vec()),
            redis::Value::Int(port),
        ]),
    ])]);
    let wrong = quota_worker::redis::slots::SlotMap::from_reply(&all_on_one).unwrap();
    slots.set(wrong.clone());
    let calls = burst_on_cluster(&e, &ns).await;
    eprintln!("{calls} Redis calls for 300 admissions with a wrong slot map");
    let now = slots.current().unwrap();
    assert!(
        slots.needs_refresh() || *now != wrong,
        "the map was not marked stale nor read again"
    );
}

/// The per-node call itself: sent to one node with a key it owns declared and a
/// key of another node carried as an argument, the script admits the first and
/// answers `elsewhere` for the second, having written nothing for it.
#[tokio::test]
async fn a_key_on_another_node_answers_not_here_and_is_left_untouched() {
    let ns = unique("c-nothere");
    let _k = ClusterKeys(ns.clone());
    // loads the flagged script on every node
    let _e = engine(&cluster_settings(&ns)).await;
    let urls = cluster().urls();
    let mut first = redis::Client::open(urls[0].as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let reply: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut first)
        .unwrap();
    let map = quota_worker::redis::slots::SlotMap::from_reply(&reply).unwrap();
    let key = |i: usize| format!("{ns}:{{r{i}}}:default");
    let owner = |i: usize| map.owner(key(i).as_bytes()).unwrap();
    let here = (0..).find(|&i| owner(i) == owner(0)).unwrap();
    let there = (0..).find(|&i| owner(i) != owner(0)).unwrap();
    let node = &map.nodes()[owner(0)];
    let mut conn = redis::Client::open(format!("redis://{}:{}", node.host, node.port))
        .unwrap()
        .get_connection()
        .unwrap();
    let sha = quota_worker::redis::Scripts::default()
        .admit_cross_slot
        .get_hash()
        .to_string();
    let flat: Vec<i64> = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(key(here))
        // lease, dedupe, one undeclared key, one plan (3 per rolling day), no
        // layers, suppression, preferences or limits section
        .arg(120_000)
        .arg(86_400_000)
        .arg(1)
        .arg(1)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(0)
        .arg(9_007_199_254_740_991i64)
        .arg(0)
        .arg(0)
        .arg(1)
        .arg(3)
        .arg(-86_400_000)
        .arg("m-here")
        .arg(1)
        .arg("m-there")
        .arg(1)
        .arg(key(there))
        .query(&mut conn)
        .unwrap();
    // each answer: code, flags, payload length (src/admission/lua/protocol.lua): the first
    // job `admitted` (1), the second `elsewhere` (8)
    assert_eq!(flat[1..], [1, 0, 0, 8, 0, 0], "{flat:?}");
    let elsewhere = &map.nodes()[owner(there)];
    let mut owner_conn =
        redis::Client::open(format!("redis://{}:{}", elsewhere.host, elsewhere.port))
            .unwrap()
            .get_connection()
            .unwrap();
    let exists: i64 = redis::cmd("EXISTS")
        .arg(key(there))
        .query(&mut owner_conn)
        .unwrap();
    assert_eq!(exists, 0, "nothing written for the key elsewhere");
    let admitted: i64 = redis::cmd("EXISTS")
        .arg(key(here))
        .query(&mut conn)
        .unwrap();
    assert_eq!(admitted, 1, "the key here holds its send");
}

/// The worker end to end on the cluster: dispatch, a cap delay to the recipient's
/// midnight, a duplicate, a malformed job, and 200 jobs for 20 recipients under a
/// one-per-day cap (exactly one each dispatched).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_unchanged_on_the_cluster() {
    let ns = unique("c-pipeline");
    let _k = ClusterKeys(ns.clone());
    let s = cluster_settings(&ns);
    let _c = Cleanup::new(&s);
    let zone = noon_zone();
    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let conn = amqp().await;
    let mut jobs = Vec::new();
    for i in 0..200 {
        let id = format!("{ns}-{i}");
        let r = format!("r{}", i % 20);
        jobs.push(Published {
            body: audit::job_body(&id, &r, "sms", "default", &zone),
            id,
            recipient: r,
        });
    }
    jobs.push(Published {
        id: format!("{ns}-bad"),
        recipient: String::new(),
        body: b"{\"id\":\"x\"".to_vec(),
    });
    publish_all(&conn, &s, &jobs).await;
    // a second copy of a job: a duplicate once the first is dispatched
    tokio::time::sleep(Duration::from_secs(2)).await;
    publish_all(&conn, &s, &jobs[..1]).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let started = std::time::Instant::now();
    loop {
        let d = audit::depth(&conn, &dispatch).await.unwrap_or(0);
        let j = audit::depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        let x = audit::depth(&conn, &s.amqp.dead_queue).await.unwrap_or(0);
        if (d >= 20 && j == 0 && x >= 1) || started.elapsed() > Duration::from_secs(60) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    handle.await.unwrap();
    let a = Audit::collect(&conn, &s, &jobs).await;
    eprintln!("{}", a.summary(&jobs));
    assert!(a.lost(&jobs).is_empty());
    assert!(a.in_two_places().is_empty());
    assert_eq!(a.dispatched.len(), 20);
    assert_eq!(
        a.duplicate_dispatches(),
        0,
        "the second copy is a duplicate"
    );
    assert!(a.dispatched_per_recipient(&jobs).values().all(|&n| n == 1));
    assert_eq!(a.waiting.len(), 180);
    assert_eq!(
        a.dead.get(&format!("{ns}-bad")),
        Some(&vec!["malformed".to_string()])
    );
    record(json!({
        "scenario": "redis_cluster",
        "test": "tests/suite/cluster.rs (engine scenarios and the_worker_runs_unchanged_on_the_cluster)",
        "jobs": jobs.len() + 1,
        "nodes": 3,
        "dispatched": a.dispatched.len(),
        "waiting": a.waiting.len(),
        "lost": a.lost(&jobs).len(),
        "duplicates": a.duplicate_dispatches(),
        "violations": a.dispatched_per_recipient(&jobs).values().filter(|&&n| n > 1).count(),
    }));
}

/// At start the engine loads its scripts on every master, as on a single node
/// (run alone to see it: other tests of this binary load them on first use too).
#[tokio::test]
async fn the_scripts_are_loaded_on_every_node_at_start() {
    let _one = SCRIPTS.lock().await;
    let ns = unique("c-load");
    let _: Vec<String> = cluster().each(&redis::cmd("SCRIPT").arg("FLUSH").clone());
    let _e = engine(&cluster_settings(&ns)).await;
    for lua in [
        quota_worker::redis::scripts::ADMIT_LUA,
        quota_worker::redis::scripts::RATE_LUA,
        quota_worker::redis::scripts::REFUND_LUA,
    ] {
        let sha = redis::Script::new(lua).get_hash().to_string();
        let exists: Vec<Vec<i64>> =
            cluster().each(&redis::cmd("SCRIPT").arg("EXISTS").arg(&sha).clone());
        assert!(exists.iter().all(|v| v == &vec![1]), "{exists:?}");
    }
}

/// `redis.wait_replicas` on a cluster whose masters have no replica: each node's
/// call ends with its `WAIT`, which answers 0 after `redis.wait_timeout`, so every
/// admission is held; a second try of a held job finds its own reservation and is
/// held again, not taken as admitted. The waits run on the admissions' own
/// connections: the shared one answers at once meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_the_masters_lack_holds_every_admission() {
    use quota_worker::redis::StoreError;
    let ns = unique("c-wait");
    let _k = ClusterKeys(ns.clone());
    let mut s = cluster_settings(&ns);
    s.redis.wait_replicas = 1;
    s.redis.wait_timeout = quota_worker::config::Dur(Duration::from_millis(1000));
    let e = std::sync::Arc::new(engine(&s).await);
    let started = std::time::Instant::now();
    let admits: Vec<_> = (0..30)
        .map(|i| {
            let e = e.clone();
            tokio::spawn(async move {
                let (id, who) = (format!("w{i}"), format!("r{i}"));
                e.admit(&req(&id, &who, Tz::UTC)).await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ping = std::time::Instant::now();
    e.ping().await.unwrap();
    assert!(
        ping.elapsed() < Duration::from_millis(500),
        "a ping waited {:?} behind the admissions' WAITs",
        ping.elapsed()
    );
    for a in admits {
        match a.await.unwrap() {
            Err(StoreError::Unreplicated {
                acked: 0,
                wanted: 1,
                recorded: true,
                ..
            }) => {}
            other => panic!("expected a held admission, got {other:?}"),
        }
    }
    assert!(started.elapsed() >= Duration::from_millis(1000));
    match e.admit(&req("w0", "r0", Tz::UTC)).await {
        Err(StoreError::Unreplicated {
            acked: 0,
            recorded: false,
            ..
        }) => {}
        other => panic!("a second try: expected held again, got {other:?}"),
    }
}

/// `admin preferences export` on a cluster: the sets spread over the three masters
/// (each in its recipient's slot) are all found, `SCAN` on each primary, and an
/// import under another prefix exports the same lines.
#[tokio::test]
async fn preferences_export_scans_every_master() {
    use quota_worker::preferences::{edit as stored, files as preference_files};
    let (ns, into_ns) = (unique("c-prefs"), unique("c-prefs-in"));
    let (_k, _k2) = (ClusterKeys(ns.clone()), ClusterKeys(into_ns.clone()));
    let e = engine(&cluster_settings(&ns)).await;
    for i in 0..30 {
        let tenant = (i % 3 == 0).then_some("acme");
        let set = json!({"categories": {format!("c{i}"): false}});
        stored::put(&e, tenant, &format!("r-{i}"), &set)
            .await
            .unwrap();
    }
    let per_node: Vec<Vec<String>> =
        cluster().each(&redis::cmd("KEYS").arg(format!("{ns}:*/prefs")).clone());
    assert!(per_node.iter().all(|k| !k.is_empty()), "{per_node:?}");
    let keys = preference_files::keys(&e).await.unwrap();
    assert_eq!(keys.len(), 30);
    let lines = preference_files::export_lines(&e, &keys, &|| {})
        .await
        .unwrap();
    assert_eq!(lines.len(), 30);
    let other = engine(&cluster_settings(&into_ns)).await;
    let text = lines.join("\n");
    let done = preference_files::import(&other, text.as_bytes(), &|_| {})
        .await
        .unwrap();
    assert_eq!((done.stored, done.bad.len()), (30, 0));
    let keys = preference_files::keys(&other).await.unwrap();
    let again = preference_files::export_lines(&other, &keys, &|| {})
        .await
        .unwrap();
    assert_eq!(again, lines);
}

/// Digests on the cluster: jobs of five recipients (keys spread over the masters)
/// folded in one window arrive as one digest each; the admin finds one by its id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn digests_fold_and_close_on_the_cluster() {
    let ns = unique("c-digest");
    let _k = ClusterKeys(ns.clone());
    let mut s = cluster_settings(&ns);
    s.policies.insert(
        "social".into(),
        quota_worker::config::PolicySettings {
            digest: Some(quota_worker::config::DigestSettings {
                mode: quota_worker::quota::digest::DigestMode::Window,
                window: Some(quota_worker::config::Dur(Duration::from_secs(2))),
                max_window: None,
                max_items: 100,
                keep: 2,
                keep_from: Default::default(),
            }),
            ..Default::default()
        },
    );
    s.validate().unwrap();
    let _c = Cleanup::new(&s);
    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let conn = amqp().await;
    for i in 0..20 {
        let body = format!(
            r#"{{"id":"{ns}-{i}","recipient":"r{}","channel":"sms","category":"social","payload":{{"i":{i}}}}}"#,
            i % 5
        );
        publish(&conn, &s, body.as_bytes()).await;
    }
    let open = quota_worker::admin::Digests::new(w.store());
    wait_for("r3's digest open", Duration::from_secs(10), || async {
        open.of("r3", None)
            .await
            .unwrap()
            .first()
            .is_some_and(|d| d.count == 4)
    })
    .await;
    let id = open.of("r3", None).await.unwrap()[0].id.clone();
    assert_eq!(open.show(&id).await.unwrap().recipient, "r3");
    let dispatch = topology(&s).dispatch_queue("sms");
    let mut got = Vec::new();
    for _ in 0..5 {
        let m = take(&conn, &dispatch, Duration::from_secs(15))
            .await
            .expect("a digest");
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        assert_eq!(body["digest"]["count"], 4, "{body}");
        got.push(body["recipient"].as_str().unwrap().to_string());
    }
    got.sort();
    assert_eq!(got, ["r0", "r1", "r2", "r3", "r4"]);
    assert!(take(&conn, &dispatch, Duration::from_secs(2))
        .await
        .is_none());
    stop.cancel();
    handle.await.unwrap();
}

/// Preferences at admission on the cluster (recipients spread over the three
/// masters, each set in its recipient's slot): an opted-out job is dead-lettered
/// `opted_out`, a job inside quiet hours waits to their end, and a job the one-a-day
/// cap refuses, whose next day starts inside quiet hours, waits once to their end.
#[tokio::test]
async fn preferences_hold_and_stop_jobs_on_the_cluster() {
    use chrono::{DurationRound, Timelike};
    use quota_worker::job::{Outcome, Reason};
    use quota_worker::preferences::edit as stored;
    let ns = unique("c-prefs-admit");
    let _k = ClusterKeys(ns.clone());
    let mut s = cluster_settings(&ns);
    let daily = quota_worker::config::RuleSettings {
        limit: 1,
        window: "1d".parse().unwrap(),
    };
    s.policies.get_mut("default").unwrap().rules = vec![daily];
    let marketing = s.policies["default"].clone();
    s.policies.insert("marketing".into(), marketing);
    let (_c, w, conn) = rig(&s).await;
    // quiet now in UTC: from this hour to two hours later
    let now = chrono::Utc::now();
    let hour = now.hour();
    let quiet_end =
        now.duration_trunc(chrono::Duration::hours(1)).unwrap() + chrono::Duration::hours(2);
    let quiet_now = json!({"categories": {"marketing": false},
        "quiet_hours": {"timezone": "UTC", "windows": [{"days": "daily",
            "from": format!("{hour:02}:00"), "to": format!("{:02}:00", (hour + 2) % 24)}]}});
    // noon where they live, quiet 22:00-07:00 there
    let (zone, seven) = crate::preferences::zone_at(12, 7);
    let quiet_night =
        json!({"quiet_hours": {"windows": [{"days": "daily", "from": "22:00", "to": "07:00"}]}});
    let recipients: Vec<String> = (0..9).map(|i| format!("r{i}")).collect();
    for (i, r) in recipients.iter().enumerate() {
        let set = if i % 2 == 0 { &quiet_now } else { &quiet_night };
        stored::put(w.store(), None, r, set).await.unwrap();
    }
    assert!(w.store().checks_preferences());
    let per_node: Vec<Vec<String>> =
        cluster().each(&redis::cmd("KEYS").arg(format!("{ns}:*/prefs")).clone());
    assert!(
        per_node.iter().filter(|k| !k.is_empty()).count() >= 2,
        "{per_node:?}"
    );
    let body = |id: &str, r: &str, category: &str| {
        format!(
            r#"{{"id":"{id}","recipient":"{r}","channel":"sms","category":"{category}","timezone":"{zone}"}}"#
        )
    };
    for (i, r) in recipients.iter().enumerate() {
        if i % 2 == 0 {
            publish(
                &conn,
                &s,
                body(&format!("{r}-m"), r, "marketing").as_bytes(),
            )
            .await;
            assert_eq!(
                step(&w, &conn, &s).await,
                Outcome::Dead(Reason::OptedOut),
                "{r}"
            );
            let m = take(&conn, &s.amqp.dead_queue, Duration::from_secs(5))
                .await
                .expect("a dead letter");
            let p = &m.delivery.properties;
            assert_eq!(header(p, "x-notify-reason").as_deref(), Some("opted_out"));
            publish(&conn, &s, body(&format!("{r}-q"), r, "default").as_bytes()).await;
            assert_eq!(
                step(&w, &conn, &s).await,
                Outcome::Delayed { until: quiet_end },
                "{r}"
            );
        } else {
            publish(&conn, &s, body(&format!("{r}-1"), r, "default").as_bytes()).await;
            assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched, "{r}");
            publish(&conn, &s, body(&format!("{r}-2"), r, "default").as_bytes()).await;
            assert_eq!(
                step(&w, &conn, &s).await,
                Outcome::Delayed { until: seven },
                "{r}: one delay, to the quiet hours' end ({zone})"
            );
        }
    }
}

/// `redis.wait_replicas` for digest folds on a Redis Cluster (three masters, one
/// replica each, started for this test): each fold's `WAIT` goes to the master that
/// holds its group. With the replica of one master stopped, a fold of a recipient
/// on that master is held (0 of 1 replicas; the shared connection answers at once
/// meanwhile), a fold of a recipient on another master is not; once the replica is
/// back, the held job's fold again finds it folded: one item.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_replicas_a_fold_waits_on_the_master_that_holds_it() {
    use quota_worker::config::{DigestSettings, Dur, PolicySettings};
    use quota_worker::digest::FoldJob;
    use quota_worker::quota::digest::{DigestMode, KeepFrom};
    use quota_worker::redis::StoreError;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::with_replicas(1, 15_000))
        .await
        .unwrap();
    let ns = unique("c-fold-wait");
    let mut s = settings(&ns);
    s.redis.cluster = true;
    s.redis.cluster_urls = cluster.urls();
    s.redis.url = "redis://127.0.0.1:1".into();
    s.redis.wait_replicas = 1;
    s.redis.wait_timeout = Dur(Duration::from_millis(1000));
    s.policies.insert(
        "social".into(),
        PolicySettings {
            digest: Some(DigestSettings {
                mode: DigestMode::Window,
                window: Some(Dur(Duration::from_secs(3600))),
                max_window: None,
                max_items: 100,
                keep: 10,
                keep_from: KeepFrom::First,
            }),
            ..PolicySettings::default()
        },
    );
    s.validate().unwrap();
    let e = std::sync::Arc::new(engine(&s).await);
    let spec = e
        .rules()
        .policy_of("social", None)
        .digest
        .expect("a digest section");
    let fold = |e: std::sync::Arc<quota_worker::store::QuotaStore>, id: String, who: String| async move {
        let body = format!(r#"{{"id":"{id}","recipient":"{who}","payload":{{}}}}"#);
        let job = FoldJob {
            id: &id,
            recipient: &who,
            channel: "sms",
            category: "social",
            tenant: None,
            timezone: None,
            key: "social",
            first_seen: chrono::Utc::now(),
            expires_at: None,
            body: body.as_bytes(),
            collapse_key: None,
            closes_at: None,
        };
        e.digests().fold(&job, &spec).await
    };
    // ten recipients folded while every replica answers; the master of each
    let mut owner = Vec::new();
    for i in 0..10 {
        let folded = fold(e.clone(), format!("f{i}"), format!("r{i}"))
            .await
            .expect("replicated");
        let node = (0..3)
            .map(|m| cluster.masters()[m])
            .find(|&m| {
                redis::cmd("EXISTS")
                    .arg(&folded.key)
                    .query::<i64>(&mut cluster.nodes[m].connection())
                    .is_ok_and(|n| n == 1)
            })
            .expect("a master holds the digest");
        owner.push(node);
    }
    let victim = owner[0];
    let other = owner
        .iter()
        .position(|&m| m != victim)
        .expect("recipients on two masters");
    let port = cluster.nodes[victim].port;
    let replica = (0..cluster.nodes.len())
        .find(|&i| {
            cluster.nodes[i]
                .replication()
                .contains(&format!("master_port:{port}"))
        })
        .expect("the victim's replica");
    let replica_pid = cluster.nodes[replica].pid().unwrap().to_string();
    testkit::procs::signal(&replica_pid, "STOP");
    struct Cont(String);
    impl Drop for Cont {
        fn drop(&mut self) {
            testkit::procs::signal(&self.0, "CONT");
        }
    }
    let cont = Cont(replica_pid);
    let started = std::time::Instant::now();
    let held = tokio::spawn(fold(e.clone(), "g0".into(), "r0".into()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ping = std::time::Instant::now();
    e.ping().await.unwrap();
    assert!(
        ping.elapsed() < Duration::from_millis(500),
        "a ping waited {:?} behind the fold's WAIT",
        ping.elapsed()
    );
    // a recipient on another master: its replica answers
    let elsewhere = fold(e.clone(), "g1".into(), format!("r{other}")).await;
    assert!(elsewhere.is_ok(), "{elsewhere:?}");
    match held.await.unwrap() {
        Err(StoreError::Unreplicated {
            acked: 0,
            wanted: 1,
            ..
        }) => {}
        other => panic!("expected a held fold, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(1000));
    drop(cont);
    let again = loop {
        match fold(e.clone(), "g0".into(), "r0".into()).await {
            Ok(f) => break f,
            Err(StoreError::Unreplicated { .. }) => {
                assert!(
                    started.elapsed() < Duration::from_secs(15),
                    "never replicated"
                );
            }
            Err(other) => panic!("{other:?}"),
        }
    };
    assert!(again.again, "found folded: {again:?}");
    let digests = quota_worker::admin::Digests::new(&e);
    let open = digests.of("r0", None).await.unwrap();
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].count, 2, "f0 and g0, once each");
}

#[tokio::test]
async fn suppressions_and_preferences_written_elsewhere_turn_the_checks_on() {
    // the two flags live in different slots: the worker's poll must read both
    let ns = unique("c-flags");
    let _k = ClusterKeys(ns.clone());
    let e = engine(&cluster_settings(&ns)).await;
    quota_worker::feedback::watch::refresh(&e)
        .await
        .expect("the poll reads both flags on a cluster");
    assert!(!e.checks_suppressions() && !e.checks_preferences());
    let keys = e.keys();
    let (flag_s, flag_p) = (keys.suppressions_flag(), keys.preferences_flag());
    assert_ne!(
        quota_worker::redis::slots::slot(flag_s.as_bytes()),
        quota_worker::redis::slots::slot(flag_p.as_bytes()),
        "the flags share a slot: the test proves nothing"
    );
    // another worker's suppression and an admin's preferences, as Redis holds them
    let mut conn = e.connection();
    for flag in [&flag_s, &flag_p] {
        let _: () = redis::cmd("SET")
            .arg(flag)
            .arg(1)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    quota_worker::feedback::watch::refresh(&e)
        .await
        .expect("the poll reads both flags on a cluster");
    assert!(e.checks_suppressions(), "suppressions never checked");
    assert!(e.checks_preferences(), "preferences never checked");
}

#[tokio::test]
async fn a_job_is_cancelled_on_the_cluster() {
    // the cancel marks and their version live in different slots
    let ns = unique("c-cancel");
    let _k = ClusterKeys(ns.clone());
    let s = cluster_settings(&ns);
    let e = engine(&s).await;
    let (set, version) = e.keys().cancelled();
    assert_ne!(
        quota_worker::redis::slots::slot(set.as_bytes()),
        quota_worker::redis::slots::slot(version.as_bytes()),
        "the keys share a slot: the test proves nothing"
    );
    let jobs = quota_worker::admin::Jobs::new(&e, &s);
    let first = jobs.cancel("c1").await.expect("cancelled on the cluster");
    assert!(!first.already);
    assert!(jobs.cancel("c1").await.unwrap().already);
    let mut conn = e.connection();
    let v: i64 = redis::cmd("GET")
        .arg(&version)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(v, 2, "each cancel raises the version workers watch");
}

/// Fallback on a cluster: a job its channel's own cap holds goes out on the next
/// channel, and when that step fails, its next one (kept in the recipient's slot)
/// goes out on the channel after, once.
#[tokio::test]
async fn a_route_moves_on_and_resumes_after_a_failure_on_a_cluster() {
    use quota_worker_producer::{Event, Feedback};
    let ns = unique("c-route");
    let _k = ClusterKeys(ns.clone());
    let mut s = cluster_settings(&ns);
    s.policies.get_mut("default").unwrap().rules.clear();
    s.caps
        .insert("push_daily".into(), crate::fallback::cap(1, &["push"]));
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let route = ["email", "sms"];
    publish(&conn, &s, &crate::fallback::job("c1", "rc", "push", &route)).await;
    assert_eq!(
        crate::fallback::sent_on(&conn, &s, "push", "c1").await.0,
        "1/3"
    );
    publish(&conn, &s, &crate::fallback::job("c2", "rc", "push", &route)).await;
    assert_eq!(
        crate::fallback::sent_on(&conn, &s, "email", "c2").await.0,
        "2/3"
    );
    let failed = Feedback::new("c2", Event::Failed, "rc", "email");
    crate::feedback::send(&conn, &s, &failed).await;
    crate::feedback::send(&conn, &s, &failed).await;
    let (step, from) = crate::fallback::sent_on(&conn, &s, "sms", "c2").await;
    assert_eq!(
        (step.as_str(), from.as_deref()),
        ("3/3", Some("email: failed"))
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        depth(&conn, &topology(&s).dispatch_queue("sms")).await,
        0,
        "sent once"
    );
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test]
async fn an_escalation_moves_on_once_and_an_answer_stops_it_on_a_cluster() {
    use quota_worker_producer::{Event, Feedback};
    let ns = unique("c-escalate");
    let _k = ClusterKeys(ns.clone());
    let mut s = cluster_settings(&ns);
    let p = s.policies.get_mut("default").unwrap();
    p.rules.clear();
    p.fallback = Some(quota_worker::config::FallbackSettings {
        on: Some(vec!["unanswered".into()]),
        wait_at_most: None,
        answer_within: Some(quota_worker::config::Dur(Duration::from_secs(1))),
        answered_by: None,
    });
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    for id in ["e1", "e2"] {
        publish(&conn, &s, &crate::fallback::job(id, id, "push", &["email"])).await;
        crate::fallback::sent_on(&conn, &s, "push", id).await;
    }
    // e2 answered in its recipient's slot; e1 moves on
    let delivered = Feedback::new("e2", Event::Delivered, "e2", "push");
    crate::feedback::send(&conn, &s, &delivered).await;
    let (step, from) = crate::fallback::sent_on(&conn, &s, "email", "e1").await;
    assert_eq!(
        (step.as_str(), from.as_deref()),
        ("2/2", Some("push: unanswered (no delivery within 1s)"))
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        depth(&conn, &topology(&s).dispatch_queue("email")).await,
        0,
        "e2 answered, e1 sent once"
    );
    stop.cancel();
    handle.await.unwrap();
}
