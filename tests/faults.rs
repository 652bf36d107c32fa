//! The fault suite: the worker under kill -9, a broker restart, a broker hang, a
//! Redis outage, four competing processes, SIGTERM under load and stale `x-death`
//! headers. Every scenario publishes a known set of jobs and ends with an audit (see
//! `common::audit`): each job id found exactly once as dispatched, waiting or
//! dead-lettered; caps checked against what was dispatched and what Redis recorded;
//! duplicates counted and explained. Figures go to `target/reliability/*.json` and,
//! with `QW_WRITE_RELIABILITY=1`, into RELIABILITY.md.
//!
//! Quick form (CI): `cargo test --test faults`. Long form:
//! `QW_FAULTS_LONG=1 cargo test --release --test faults` (20,000 jobs and 20 kills,
//! a 30 s Redis outage, a 30 s broker hang, two broker restarts, the second a
//! SIGKILL). Scenarios run one at a time (they load the machine); `QW_FAULTS_SEED`
//! replays the random kill times; `QW_WORKER_LOG` sets the worker processes'
//! `RUST_LOG` (their logs are in the scenario's temp dir, kept with `QW_KEEP_TMP=1`).
//! Any panic in a worker process's log fails the scenario.
//! The broker scenarios start their own RabbitMQ node (never the shared one) and are
//! skipped (and recorded as skipped) where `/usr/lib/rabbitmq/bin/rabbitmq-server`
//! is missing; the Redis outage starts its own `redis-server`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::audit::{self, depth, noon_zone, publish_all, Audit, Published, Rng};
use common::procs::{self, WorkerProc};
use common::reliability::{long, record};
use common::*;
use quota_worker::config::{ChannelSettings, Dur, PolicySettings, RuleSettings, Settings};
use serde_json::json;

/// Scenarios load the machine; run them one at a time.
static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    HEAVY.lock().await
}

fn policy(rules: &[(u32, &str)]) -> PolicySettings {
    PolicySettings {
        rules: rules
            .iter()
            .map(|(limit, window)| RuleSettings {
                limit: *limit,
                window: window.parse().unwrap(),
            })
            .collect(),
        scope: Default::default(),
        action: Default::default(),
    }
}

/// Settings for a fault scenario: three policies (no cap, one per local day, two per
/// rolling 2 s), channel `sms` paced at `rate` per second, a 3 s reservation lease so
/// jobs orphaned by a crash come back within the test.
fn fault_settings(ns: &str, rate: u64) -> Settings {
    let mut s = settings(ns);
    s.redis.reservation_lease = Dur(Duration::from_secs(3));
    s.worker.shutdown_grace = Dur(Duration::from_secs(10));
    s.policies.insert("transactional".into(), policy(&[]));
    s.policies.insert("daily".into(), policy(&[(1, "1d")]));
    s.policies.insert("rolling".into(), policy(&[(2, "2s")]));
    s.channels.insert(
        "sms".into(),
        ChannelSettings {
            rate: Some(rate),
            period: None,
            burst: Some(20),
            cost: 1,
        },
    );
    s
}

/// What a job of the mix is expected to become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No cap: dispatched.
    Free,
    /// One per local day: the recipient's first is dispatched, the rest wait.
    Daily,
    /// Two per rolling 2 s: all dispatched, paced by the cap.
    Rolling,
    /// Not a job: dead-lettered `malformed`.
    Malformed,
}

struct Mix {
    jobs: Vec<Published>,
    kinds: BTreeMap<String, Kind>,
}

impl Mix {
    /// `n` jobs: 80 % uncapped over 500 recipients, 10 % daily-capped over n/100
    /// recipients, 7 % rolling-capped over n/50, 3 % malformed.
    fn new(ns: &str, n: usize, zone: &str) -> Mix {
        let mut jobs = Vec::with_capacity(n);
        let mut kinds = BTreeMap::new();
        let (mut daily, mut rolling, mut free) = (0usize, 0usize, 0usize);
        for i in 0..n {
            let id = format!("{ns}-{i}");
            let (kind, recipient, body) = match i % 100 {
                0..=2 => (
                    Kind::Malformed,
                    String::new(),
                    format!(r#"{{"id":"{id}","recipient":42,"channel":"sms"}}"#).into_bytes(),
                ),
                3..=12 => {
                    daily += 1;
                    let r = format!("daily-{}", daily % (n / 100).max(1));
                    let b = audit::job_body(&id, &r, "sms", "daily", zone);
                    (Kind::Daily, r, b)
                }
                13..=19 => {
                    rolling += 1;
                    let r = format!("roll-{}", rolling % (n / 50).max(1));
                    let b = audit::job_body(&id, &r, "sms", "rolling", zone);
                    (Kind::Rolling, r, b)
                }
                _ => {
                    free += 1;
                    let r = format!("free-{}", free % 500);
                    let b = audit::job_body(&id, &r, "sms", "transactional", zone);
                    (Kind::Free, r, b)
                }
            };
            kinds.insert(id.clone(), kind);
            jobs.push(Published {
                id,
                recipient,
                body,
            });
        }
        Mix { jobs, kinds }
    }

    fn count(&self, k: Kind) -> usize {
        self.kinds.values().filter(|v| **v == k).count()
    }

    fn daily_recipients(&self) -> BTreeSet<String> {
        self.jobs
            .iter()
            .filter(|j| self.kinds[&j.id] == Kind::Daily)
            .map(|j| j.recipient.clone())
            .collect()
    }

    /// How many distinct jobs end up dispatched.
    fn expected_dispatched(&self) -> usize {
        self.count(Kind::Free) + self.count(Kind::Rolling) + self.daily_recipients().len()
    }
}

/// Declare the topology once, so jobs published before a worker starts are routed.
async fn declare(s: &Settings) {
    let conn = amqp().await;
    topology(s).declare(&conn).await.expect("topology");
    let _ = conn.close(200, "".into()).await;
}

/// Wait until the dispatch and dead queues hold at least the expected numbers, the
/// jobs queue is empty and the short delay levels (up to 16 s) are empty, three
/// polls in a row. Returns false on timeout.
async fn settle_down(
    conn: &lapin::Connection,
    s: &Settings,
    dispatched: usize,
    dead: usize,
    timeout: Duration,
) -> bool {
    let t = topology(s);
    let ladder = t.ladder();
    let deadline = Instant::now() + timeout;
    let mut calm = 0;
    let mut last = String::new();
    while Instant::now() < deadline {
        let d = depth(conn, &t.dispatch_queue("sms")).await.unwrap_or(0) as usize;
        let x = depth(conn, &s.amqp.dead_queue).await.unwrap_or(0) as usize;
        let j = depth(conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        let mut short = 0;
        for n in 0..5 {
            short += depth(conn, &ladder.queue(n)).await.unwrap_or(1);
        }
        last = format!(
            "dispatch {d}/{dispatched}, dead {x}/{dead}, jobs queue {j}, short delays {short}"
        );
        if d >= dispatched && x >= dead && j == 0 && short == 0 {
            calm += 1;
            if calm >= 3 {
                return true;
            }
        } else {
            calm = 0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("did not settle in {timeout:?}: {last}");
    false
}

/// Panics reported in the logs of every worker process a scenario ran (`dir` holds
/// them). A panicking task never settles its delivery, so there must be none.
fn worker_panics(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("worker-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("panicked at")) {
            out.push(format!("{name}: {line}"));
        }
    }
    out
}

/// After a run that did not settle: the jobs found where they should not be, and
/// what the worker's log says about them.
fn explain_stuck(a: &Audit, mix: &Mix, w: &WorkerProc) {
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    for (id, queues) in &a.waiting_in {
        let kind = mix.kinds.get(id);
        if kind == Some(&Kind::Daily) && queues.iter().all(|q| !q.ends_with(".jobs")) {
            continue;
        }
        eprintln!("stuck: {id} ({kind:?}) found in {queues:?}; its log lines:");
        for line in log.lines().filter(|l| l.contains(&format!("\"{id}\""))) {
            eprintln!("    {}", &line[..line.len().min(400)]);
        }
    }
}

/// Cap and record checks for a mix, after the audit. Returns the violations, each a
/// sentence.
async fn check_caps(s: &Settings, mix: &Mix, a: &Audit) -> Vec<String> {
    let mut violations = Vec::new();
    let per = a.dispatched_per_recipient(&mix.jobs);
    for r in mix.daily_recipients() {
        let n = per.get(&r).copied().unwrap_or(0);
        if n != 1 {
            violations.push(format!(
                "daily recipient {r}: {n} distinct jobs dispatched, cap 1 (and 1 expected)"
            ));
        }
    }
    let keys = quota_worker::quota::keys::Keys::from_settings(&s.redis);
    let mut conn = redis::Client::open(s.redis.url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut by_recipient: BTreeMap<(&str, &'static str), Vec<&Published>> = BTreeMap::new();
    for j in &mix.jobs {
        let policy = match mix.kinds[&j.id] {
            Kind::Free => "transactional",
            Kind::Daily => "daily",
            Kind::Rolling => "rolling",
            Kind::Malformed => continue,
        };
        by_recipient
            .entry((&j.recipient, policy))
            .or_default()
            .push(j);
    }
    for ((r, policy), jobs) in by_recipient {
        let sends = audit::recorded(&mut conn, &keys.recipient(r, policy, None)).await;
        let members: BTreeMap<&[u8], bool> =
            sends.iter().map(|(_, c, m)| (m.as_slice(), *c)).collect();
        for j in jobs {
            if a.dispatched.contains_key(&j.id) {
                match members.get(quota_worker::quota::keys::member(&j.id).as_slice()) {
                    Some(true) => {}
                    Some(false) => {
                        violations.push(format!("{}: dispatched, recorded only as reserved", j.id))
                    }
                    None => {
                        violations.push(format!("{}: dispatched without a recorded send", j.id))
                    }
                }
            }
        }
        if policy == "rolling" {
            let times: Vec<i64> = sends.iter().map(|(t, _, _)| *t).collect();
            if let Some((a, b)) = audit::rolling_violation(&times, 2, 2000) {
                violations.push(format!(
                    "rolling recipient {r}: 3 sends within {} ms",
                    b - a
                ));
            }
        }
        if policy == "daily" && sends.len() > 1 {
            violations.push(format!(
                "daily recipient {r}: {} sends recorded",
                sends.len()
            ));
        }
    }
    violations
}

/// For each duplicated dispatch, whether a crash explains it: its first copy was
/// among the last `window` messages dispatched before a kill.
/// Also returns the largest distance (in messages) between a duplicate's first copy
/// and the kill that explains it.
fn explain_duplicates(
    a: &Audit,
    kill_depths: &[usize],
    window: usize,
) -> (usize, usize, Vec<String>) {
    let mut explained = 0;
    let mut farthest = 0;
    let mut unexplained = Vec::new();
    for (id, positions) in a.duplicated_ids() {
        let first = positions[0];
        match kill_depths
            .iter()
            .filter(|&&d| first < d && d - first <= window)
            .map(|&d| d - first)
            .min()
        {
            Some(distance) => {
                explained += positions.len() - 1;
                farthest = farthest.max(distance);
            }
            None => unexplained.push(format!("{id} at positions {positions:?}")),
        }
    }
    (explained, farthest, unexplained)
}

async fn wait_consumers(
    conn: &lapin::Connection,
    queue: &str,
    want: u32,
    timeout: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if audit::consumers(conn, queue).await == Some(want) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_moments_loses_nothing_and_breaks_no_cap() {
    let _heavy = heavy().await;
    let (n, kills, rate) = if long() {
        (20_000, 20, 600)
    } else {
        (2_000, 5, 250)
    };
    let ns = unique("kill");
    let s = fault_settings(&ns, rate);
    let _c = Cleanup::new(&s);
    let dir = procs::temp_dir("kill");
    declare(&s).await;
    let mix = Mix::new(&ns, n, &noon_zone());
    let conn = amqp().await;
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let mut rng = Rng::from_env();
    let started = Instant::now();

    let mut w = WorkerProc::spawn(&s, &dir, "0");
    let mut recovery = Vec::new();
    recovery.push(
        wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(30))
            .await
            .expect("worker consumes"),
    );
    let mut kill_depths = Vec::new();
    for k in 0..kills {
        let pause = if long() {
            rng.range(500, 2500)
        } else {
            rng.range(300, 1500)
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
        w.kill9();
        wait_consumers(&conn, &s.amqp.jobs_queue, 0, Duration::from_secs(10)).await;
        kill_depths.push(depth(&conn, &dispatch).await.unwrap_or(0) as usize);
        w = WorkerProc::spawn(&s, &dir, &(k + 1).to_string());
        recovery.push(
            wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(30))
                .await
                .unwrap_or_else(|| panic!("restarted worker never consumed:\n{}", w.tail(30))),
        );
    }
    let kills_done_at = started.elapsed();
    let done = settle_down(
        &conn,
        &s,
        mix.expected_dispatched(),
        mix.count(Kind::Malformed),
        Duration::from_secs(if long() { 900 } else { 180 }),
    )
    .await;
    let elapsed = started.elapsed();
    w.term();
    let status = w.wait(Duration::from_secs(30));
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "worker exit {status:?}:\n{}",
        w.tail(30)
    );

    let a = Audit::collect(&conn, &s, &mix.jobs).await;
    eprintln!("{}", a.summary(&mix.jobs));
    let lost = a.lost(&mix.jobs);
    let twice = a.in_two_places();
    let violations = check_caps(&s, &mix, &a).await;
    let (explained, farthest, unexplained) =
        explain_duplicates(&a, &kill_depths, s.amqp.prefetch as usize);
    let wrong_dead: Vec<_> = a
        .dead
        .iter()
        .filter(|(id, reasons)| {
            mix.kinds.get(*id) != Some(&Kind::Malformed) || reasons.iter().any(|r| r != "malformed")
        })
        .map(|(id, r)| format!("{id}: {r:?}"))
        .collect();
    let max_recovery = recovery.iter().max().unwrap().as_secs_f64();
    let panics = worker_panics(&dir);
    record(json!({
        "scenario": "kill9",
        "worker_panics": panics.len(),
        "test": "tests/faults.rs: kill_9_at_random_moments_loses_nothing_and_breaks_no_cap",
        "jobs": n,
        "faults": kills,
        "fault": "kill -9 of the worker process, restarted at once",
        "lost": lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "duplicates_explained": explained,
        "duplicate_farthest_before_kill": farthest,
        "duplicate_waiting_copies": a.duplicate_waiting(),
        "duplicate_dead_letters": a.duplicate_dead(),
        "violations": violations.len(),
        "recovery_seconds": max_recovery,
        "dispatched": a.dispatched.len(),
        "waiting": a.waiting.len(),
        "dead": a.dead.len(),
        "elapsed_seconds": elapsed.as_secs_f64(),
        "kills_over_seconds": kills_done_at.as_secs_f64(),
        "rate_per_second": rate,
    }));
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    assert!(done, "the run did not settle: {}", a.summary(&mix.jobs));
    assert!(
        lost.is_empty(),
        "lost {} jobs: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
    assert!(twice.is_empty(), "jobs in two places: {twice:?}");
    assert!(a.strangers.is_empty(), "unknown ids: {:?}", a.strangers);
    assert!(violations.is_empty(), "cap violations: {violations:#?}");
    assert!(
        wrong_dead.is_empty(),
        "unexpected dead letters: {wrong_dead:?}"
    );
    assert!(
        unexplained.is_empty(),
        "duplicates no crash explains: {unexplained:?}"
    );
    assert_eq!(a.dispatched.len(), mix.expected_dispatched());
}

/// GET `path` on `addr`: (status, body), (0, "") when nothing answers.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    common::http_get(&addr.to_string(), path)
        .await
        .unwrap_or((0, String::new()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_holds_jobs_and_processing_resumes_when_it_returns() {
    let _heavy = heavy().await;
    let outage = Duration::from_secs(if long() { 30 } else { 8 });
    let n = if long() { 6_000 } else { 1_500 };
    let mut redis = procs::RedisServer::new(false);
    let ns = unique("redisdown");
    let mut s = fault_settings(&ns, 150);
    s.redis.url = redis.url();
    // the default lease: a job must not wait out a lease because of the outage
    s.redis.reservation_lease = Dur(Duration::from_secs(120));
    let _c = Cleanup::new(&s);
    declare(&s).await;
    let mix = Mix::new(&ns, n, &noon_zone());
    let conn = amqp().await;
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");

    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    // the worker's /readyz, served for this in-process worker's health
    let listener = quota_worker::http::bind("127.0.0.1:0").await.unwrap();
    let http = listener.local_addr().unwrap();
    tokio::spawn(quota_worker::http::serve(
        listener,
        quota_worker::http::router(None, w.health.clone()),
        stop.clone(),
    ));
    let started = Instant::now();
    while depth(&conn, &dispatch).await.unwrap_or(0) < 200 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress before the outage"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Redis goes away (SHUTDOWN SAVE: it comes back with its data, as a Redis with
    // persistence would)
    redis.stop();
    let down_at = Instant::now();
    let mut noticed = None;
    let mut at_one_second = None;
    while down_at.elapsed() < outage {
        if noticed.is_none() && !w.health.redis.load(Ordering::Relaxed) {
            noticed = Some(down_at.elapsed());
        }
        if at_one_second.is_none() && down_at.elapsed() >= Duration::from_secs(1) {
            at_one_second = Some(depth(&conn, &dispatch).await.unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before_return = depth(&conn, &dispatch).await.unwrap_or(0);
    let dead_during = depth(&conn, &s.amqp.dead_queue).await.unwrap_or(0);
    let ready_during = w.health.ready();
    let readyz_during = http_get(http, "/readyz").await;

    redis.start().expect("redis restarts");
    let up_at = Instant::now();
    let mut resumed = None;
    let mut healthy = None;
    while up_at.elapsed() < Duration::from_secs(30) && (resumed.is_none() || healthy.is_none()) {
        if resumed.is_none() && depth(&conn, &dispatch).await.unwrap_or(0) > before_return {
            resumed = Some(up_at.elapsed());
        }
        if healthy.is_none() && http_get(http, "/readyz").await.0 == 200 {
            healthy = Some(up_at.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let done = settle_down(
        &conn,
        &s,
        mix.expected_dispatched(),
        mix.count(Kind::Malformed),
        Duration::from_secs(if long() { 600 } else { 120 }),
    )
    .await;
    let elapsed = started.elapsed();
    stop.cancel();
    handle.await.unwrap();

    let a = Audit::collect(&conn, &s, &mix.jobs).await;
    eprintln!("{}", a.summary(&mix.jobs));
    let lost = a.lost(&mix.jobs);
    let violations = check_caps(&s, &mix, &a).await;
    let dead_not_malformed = a
        .dead
        .iter()
        .filter(|(id, r)| mix.kinds[*id] != Kind::Malformed || r.iter().any(|r| r != "malformed"))
        .count();
    let during = before_return as i64 - at_one_second.unwrap_or(0) as i64;
    record(json!({
        "scenario": "redis_outage",
        "test": "tests/faults.rs: redis_outage_holds_jobs_and_processing_resumes_when_it_returns",
        "jobs": n,
        "faults": 1,
        "fault": format!("redis-server stopped for {} s (SHUTDOWN SAVE, then restarted with its data)", outage.as_secs()),
        "outage_seconds": outage.as_secs(),
        "lost": lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "violations": violations.len(),
        "dispatched_during_outage": during,
        "dead_lettered_not_malformed": dead_not_malformed,
        "health_noticed_seconds": noticed.map(|d| d.as_secs_f64()),
        "ready_during_outage": ready_during,
        "readyz_during_outage": format!("{} {}", readyz_during.0, readyz_during.1.trim().replace('\n', " / ")),
        "recovery_seconds": resumed.map(|d| d.as_secs_f64()),
        "health_back_seconds": healthy.map(|d| d.as_secs_f64()),
        "dead_during_outage": dead_during,
        "elapsed_seconds": elapsed.as_secs_f64(),
    }));
    assert!(done, "the run did not settle: {}", a.summary(&mix.jobs));
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(violations.is_empty(), "violations: {violations:#?}");
    assert_eq!(during, 0, "jobs dispatched while Redis was down");
    assert_eq!(
        dead_not_malformed, 0,
        "jobs dead-lettered because of the outage"
    );
    assert!(noticed.is_some(), "Health.redis never reported the outage");
    assert!(!ready_during, "ready while Redis was down");
    assert_eq!(
        readyz_during.0, 503,
        "/readyz during the outage: {readyz_during:?}"
    );
    assert!(readyz_during.1.contains("redis: down"), "{readyz_during:?}");
    let healthy = healthy.expect("/readyz never came back to 200");
    assert!(
        healthy < Duration::from_secs(5),
        "/readyz ready {healthy:?} after Redis returned"
    );
    let resumed = resumed.expect("processing never resumed");
    assert!(
        resumed < Duration::from_secs(5),
        "resumed {resumed:?} after Redis returned"
    );
    assert_eq!(a.duplicate_dispatches(), 0);
}

/// Regression: a job whose admission Redis interrupted after its reservation was
/// recorded (here: while it waited for the channel's rate) used to find its own
/// reservation on retry, take it for another worker's, and wait out the whole
/// reservation lease (2 min by default) before being dispatched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_interrupted_by_redis_takes_its_own_reservation_back() {
    use quota_worker::engine::{Admission, Engine, Request};
    let mut redis = procs::RedisServer::new(false);
    let ns = unique("orphan");
    let mut s = fault_settings(&ns, 1);
    s.channels.get_mut("sms").unwrap().burst = Some(1);
    s.redis.url = redis.url();
    s.redis.reservation_lease = Dur(Duration::from_secs(120));
    let e = Arc::new(Engine::connect(&s).await.unwrap());
    let req = |id: &'static str, who: &'static str| Request {
        id,
        recipient: who,
        channel: "sms",
        category: "daily",
        tz: chrono_tz::Tz::UTC,
    };
    // the first job takes the channel's only token; the second is admitted by its
    // recipient's cap and then waits about a second for the rate
    assert!(matches!(
        e.admit(&req("a", "r1")).await.unwrap(),
        Admission::Admitted(_)
    ));
    let e2 = e.clone();
    let waiting = tokio::spawn(async move { e2.admit(&req("b", "r2")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.stop();
    assert!(
        waiting.await.unwrap().is_err(),
        "the admission fails with Redis gone"
    );
    redis.start().unwrap();
    // the retry of the same job on the same worker is admitted at once
    let retry = loop {
        match e.admit(&req("b", "r2")).await {
            Ok(a) => break a,
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    };
    assert!(matches!(retry, Admission::Admitted(_)), "{retry:?}");
    // and it still counts once for its recipient
    let key = e.keys().recipient("r2", "daily", None);
    let n: i64 = redis::cmd("ZCARD")
        .arg(&key)
        .query(&mut redis.connection())
        .unwrap();
    assert_eq!(n, 1);
    // another job of the same recipient is still refused by the 1-per-day cap
    assert!(matches!(
        e.admit(&req("c", "r2")).await.unwrap(),
        Admission::Refused { .. }
    ));
}

/// A dispatch whose fate is unknown keeps its recipient's slot: the same job on the
/// same worker gets its reservation back at once, another job of that recipient is
/// refused, and a second worker (another engine) waits out the lease.
#[tokio::test]
async fn an_unconfirmed_dispatch_keeps_its_slot() {
    use quota_worker::engine::{Admission, Engine, Request};
    let ns = unique("keep");
    let _g = RedisGuard(ns.clone());
    let s = fault_settings(&ns, 1000);
    let e = Engine::connect(&s).await.unwrap();
    let other = Engine::connect(&s).await.unwrap();
    let req = |id: &'static str| Request {
        id,
        recipient: "kept",
        channel: "sms",
        category: "daily",
        tz: chrono_tz::Tz::UTC,
    };
    let Admission::Admitted(ticket) = e.admit(&req("x")).await.unwrap() else {
        panic!("admitted")
    };
    e.keep_reservation(&ticket);
    assert!(matches!(
        other.admit(&req("x")).await.unwrap(),
        Admission::InFlight { .. }
    ));
    assert!(matches!(
        e.admit(&req("y")).await.unwrap(),
        Admission::Refused { .. }
    ));
    let Admission::Admitted(again) = e.admit(&req("x")).await.unwrap() else {
        panic!("the same worker takes its reservation back")
    };
    assert_eq!(again.admitted_at, ticket.admitted_at);
    e.commit(&again).await.unwrap();
    assert_eq!(e.admit(&req("x")).await.unwrap(), Admission::Duplicate);
}

/// One private RabbitMQ node for the broker scenarios of this binary (its boot takes
/// 10 to 15 s here), and how long that boot took.
static NODE: tokio::sync::OnceCell<tokio::sync::Mutex<(procs::RabbitNode, f64)>> =
    tokio::sync::OnceCell::const_new();

async fn private_node() -> Option<tokio::sync::MutexGuard<'static, (procs::RabbitNode, f64)>> {
    if !procs::RabbitNode::available() {
        eprintln!("SKIPPED: no /usr/lib/rabbitmq/bin/rabbitmq-server to start a private node");
        return None;
    }
    let cell = NODE
        .get_or_init(|| async {
            let mut node = procs::RabbitNode::new();
            let boot = node.start().await;
            eprintln!("private rabbitmq node {} up in {boot:?}", node.name);
            tokio::sync::Mutex::new((node, boot.as_secs_f64()))
        })
        .await;
    Some(cell.lock().await)
}

/// Thaws a frozen node when dropped, also when the test panics.
struct Thaw<'a>(&'a procs::RabbitNode);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_restart_the_worker_reconnects_by_itself_and_loses_nothing() {
    let _heavy = heavy().await;
    let Some(mut guard) = private_node().await else {
        record(
            json!({"scenario": "broker_restart", "skipped": "no rabbitmq-server on this machine"}),
        );
        return;
    };
    let (node, boot) = &mut *guard;
    let boot = *boot;
    let restarts: &[&str] = if long() { &["stop", "kill"] } else { &["stop"] };
    let n = if long() { 8_000 } else { 2_000 };
    let ns = unique("brokerrestart");
    let mut s = fault_settings(&ns, 200);
    s.amqp.url = node.url();
    let _g = RedisGuard(ns.clone());
    let dir = procs::temp_dir("brokerrestart");
    let connect = |url: String| async move {
        lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("private node")
    };
    let mut conn = connect(node.url()).await;
    topology(&s).declare(&conn).await.unwrap();
    let mix = Mix::new(&ns, n, &noon_zone());
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let started = Instant::now();
    let mut w = WorkerProc::spawn(&s, &dir, "0");
    let mut recovery = Vec::new();
    let mut down_for = Vec::new();
    for (i, how) in restarts.iter().enumerate() {
        let target = 300 * (i + 1) as u32;
        while depth(&conn, &dispatch).await.unwrap_or(0) < target {
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no progress:\n{}",
                w.tail(30)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let down_at = Instant::now();
        match *how {
            "stop" => node.stop(),
            _ => node.kill(),
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        node.start().await;
        down_for.push(down_at.elapsed().as_secs_f64());
        let back_at = Instant::now();
        conn = connect(node.url()).await;
        let back = wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("the worker never came back:\n{}", w.tail(40)));
        eprintln!(
            "broker {how}: back after {:.1}s; the worker consumed again {back:?} later",
            down_for[i]
        );
        let _ = back_at;
        recovery.push(back);
        assert!(w.running(), "the worker exited:\n{}", w.tail(40));
    }
    let done = settle_down(
        &conn,
        &s,
        mix.expected_dispatched(),
        mix.count(Kind::Malformed),
        Duration::from_secs(if long() { 600 } else { 180 }),
    )
    .await;
    let elapsed = started.elapsed();
    w.term();
    let status = w.wait(Duration::from_secs(30));
    let a = Audit::collect(&conn, &s, &mix.jobs).await;
    eprintln!("{}", a.summary(&mix.jobs));
    if !done {
        explain_stuck(&a, &mix, &w);
    }
    let lost = a.lost(&mix.jobs);
    let twice = a.in_two_places();
    let violations = check_caps(&s, &mix, &a).await;
    let max_recovery = recovery.iter().max().unwrap().as_secs_f64();
    let panics = worker_panics(&dir);
    record(json!({
        "scenario": "broker_restart",
        "worker_panics": panics.len(),
        "test": "tests/faults.rs: broker_restart_the_worker_reconnects_by_itself_and_loses_nothing",
        "jobs": n,
        "faults": restarts.len(),
        "fault": restarts.iter().map(|h| if *h == "stop" { "rabbitmqctl stop + start" } else { "SIGKILL of the node + start" }).collect::<Vec<_>>().join(", "),
        "broker_down_seconds": down_for,
        "broker_boot_seconds": boot,
        "lost": lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "duplicate_waiting_copies": a.duplicate_waiting(),
        "duplicate_dead_letters": a.duplicate_dead(),
        "violations": violations.len(),
        "recovery_seconds": max_recovery,
        "elapsed_seconds": elapsed.as_secs_f64(),
    }));
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    drop(conn);
    assert!(
        status.map(|s| s.success()).unwrap_or(false),
        "worker exit {status:?}:\n{}",
        w.tail(30)
    );
    assert!(done, "the run did not settle: {}", a.summary(&mix.jobs));
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(twice.is_empty(), "in two places: {twice:?}");
    assert!(violations.is_empty(), "violations: {violations:#?}");
    assert!(
        max_recovery < 5.0,
        "reconnected {max_recovery:.1}s after the broker was back"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_workers_one_queue_hold_the_caps_exactly() {
    let _heavy = heavy().await;
    let (n, limit, recipients, workers) = (1_000usize, 5usize, 10usize, 4usize);
    let ns = unique("four");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![RuleSettings {
        limit: limit as u32,
        window: "1d".parse().unwrap(),
    }];
    let _c = Cleanup::new(&s);
    let dir = procs::temp_dir("four");
    declare(&s).await;
    let conn = amqp().await;
    let zone = noon_zone();
    let jobs: Vec<Published> = (0..n)
        .map(|i| {
            let id = format!("{ns}-{i}");
            let r = format!("shared-{}", i % recipients);
            let body = audit::job_body(&id, &r, "sms", "default", &zone);
            Published {
                id,
                recipient: r,
                body,
            }
        })
        .collect();
    let mut procs: Vec<WorkerProc> = (0..workers)
        .map(|i| WorkerProc::spawn(&s, &dir, &i.to_string()))
        .collect();
    wait_consumers(
        &conn,
        &s.amqp.jobs_queue,
        workers as u32,
        Duration::from_secs(30),
    )
    .await
    .expect("four consumers");
    let started = Instant::now();
    publish_all(&conn, &s, &jobs).await;
    let done = settle_down(&conn, &s, limit * recipients, 0, Duration::from_secs(120)).await;
    let elapsed = started.elapsed();
    for p in &procs {
        p.term();
    }
    for p in procs.iter_mut() {
        assert!(p
            .wait(Duration::from_secs(30))
            .map(|s| s.success())
            .unwrap_or(false));
    }
    let a = Audit::collect(&conn, &s, &jobs).await;
    eprintln!("{}", a.summary(&jobs));
    let per = a.dispatched_per_recipient(&jobs);
    let keys = quota_worker::quota::keys::Keys::from_settings(&s.redis);
    let mut r = redis::Client::open(redis_url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let mut violations = Vec::new();
    for i in 0..recipients {
        let who = format!("shared-{i}");
        let sent = per.get(&who).copied().unwrap_or(0);
        let recorded = audit::recorded(&mut r, &keys.recipient(&who, "default", None)).await;
        let committed = recorded.iter().filter(|(_, c, _)| *c).count();
        if sent != limit || recorded.len() != limit || committed != limit {
            violations.push(format!(
                "{who}: {sent} dispatched, {} recorded ({committed} committed); cap {limit}",
                recorded.len()
            ));
        }
    }
    let lost = a.lost(&jobs);
    let panics = worker_panics(&dir);
    record(json!({
        "scenario": "four_workers",
        "worker_panics": panics.len(),
        "test": "tests/faults.rs: four_workers_one_queue_hold_the_caps_exactly",
        "jobs": n,
        "workers": workers,
        "recipients": recipients,
        "cap": format!("{limit} per local day"),
        "dispatched": a.dispatched.len(),
        "waiting": a.waiting.len(),
        "lost": lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "violations": violations.len(),
        "elapsed_seconds": elapsed.as_secs_f64(),
    }));
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    assert!(done, "did not settle: {}", a.summary(&jobs));
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(violations.is_empty(), "{violations:#?}");
    assert_eq!(a.dispatched.len(), limit * recipients);
    assert_eq!(a.waiting.len(), n - limit * recipients);
    assert_eq!(a.duplicate_dispatches(), 0);
}

/// SIGTERM with a backlog: the worker stops consuming, finishes what it holds (or,
/// when the grace period is shorter than that, hands it back) and exits 0 within
/// the grace period; a fresh worker then finishes the run and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_zero_within_the_grace_period_and_loses_nothing() {
    let _heavy = heavy().await;
    let mut figures = Vec::new();
    // (rate per second, grace): the first drains its in-flight jobs in time
    // (256 at 200/s), the second cannot (256 at 20/s in 3 s) and hands them back
    for (rate, grace) in [(200u64, 10u64), (20, 3)] {
        let n = 1_500;
        let ns = unique("sigterm");
        let mut s = fault_settings(&ns, rate);
        s.worker.shutdown_grace = Dur(Duration::from_secs(grace));
        let _c = Cleanup::new(&s);
        let dir = procs::temp_dir("sigterm");
        declare(&s).await;
        let mix = Mix::new(&ns, n, &noon_zone());
        let conn = amqp().await;
        publish_all(&conn, &s, &mix.jobs).await;
        let dispatch = topology(&s).dispatch_queue("sms");
        let mut w = WorkerProc::spawn(&s, &dir, "0");
        let started = Instant::now();
        while depth(&conn, &dispatch).await.unwrap_or(0) < 40 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "no progress:\n{}",
                w.tail(20)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let termed = Instant::now();
        w.term();
        let status = w.wait(Duration::from_secs(grace + 30));
        let took = termed.elapsed();
        let in_queue = depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(0);
        // a fresh, unpaced worker finishes the run
        let mut finish = s.clone();
        finish.channels.get_mut("sms").unwrap().rate = Some(1_000);
        let fdir = procs::temp_dir("sigterm-finish");
        let mut f = WorkerProc::spawn(&finish, &fdir, "finish");
        let done = settle_down(
            &conn,
            &s,
            mix.expected_dispatched(),
            mix.count(Kind::Malformed),
            Duration::from_secs(120),
        )
        .await;
        f.term();
        assert!(f
            .wait(Duration::from_secs(30))
            .map(|s| s.success())
            .unwrap_or(false));
        let a = Audit::collect(&conn, &s, &mix.jobs).await;
        eprintln!(
            "rate {rate}/s, grace {grace}s: exit {status:?} after {took:?}; {}",
            a.summary(&mix.jobs)
        );
        let lost = a.lost(&mix.jobs);
        let violations = check_caps(&s, &mix, &a).await;
        let mut panics = worker_panics(&dir);
        panics.extend(worker_panics(&fdir));
        assert!(panics.is_empty(), "worker panics: {panics:#?}");
        figures.push(json!({
            "rate_per_second": rate,
            "grace_seconds": grace,
            "exit_code": status.and_then(|s| s.code()),
            "exit_seconds": took.as_secs_f64(),
            "jobs_queue_after_exit": in_queue,
            "lost": lost.len(),
            "duplicates": a.duplicate_dispatches(),
            "violations": violations.len(),
        }));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "exit status:\n{}",
            w.tail(20)
        );
        assert!(
            took < Duration::from_secs(grace) + Duration::from_millis(1500),
            "took {took:?} for a grace of {grace}s"
        );
        assert!(done, "did not settle: {}", a.summary(&mix.jobs));
        assert!(lost.is_empty(), "lost: {lost:?}");
        assert!(violations.is_empty(), "{violations:#?}");
        assert_eq!(a.duplicate_dispatches(), 0);
    }
    let worst = figures
        .iter()
        .map(|f| f["exit_seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);
    record(json!({
        "scenario": "sigterm",
        "test": "tests/faults.rs: sigterm_under_load_exits_zero_within_the_grace_period_and_loses_nothing",
        "jobs": 1_500 * figures.len(),
        "faults": figures.len(),
        "fault": "SIGTERM with a paced backlog (grace long enough to drain; grace too short)",
        "lost": figures.iter().map(|f| f["lost"].as_u64().unwrap()).sum::<u64>(),
        "duplicates": figures.iter().map(|f| f["duplicates"].as_u64().unwrap()).sum::<u64>(),
        "violations": figures.iter().map(|f| f["violations"].as_u64().unwrap()).sum::<u64>(),
        "recovery_seconds": worst,
        "runs": figures,
    }));
}

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
    ladder.mark(&mut h, 1 << 19);
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
        "test": "tests/faults.rs: stale_x_death_headers_do_not_get_a_delayed_job_dropped",
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

/// A broker that hangs instead of going away (SIGSTOP of the node: connections stay
/// open, nothing answers, as in a network partition). Every wait of the worker has a
/// deadline: publishes time out (their jobs are handed back, their reservations
/// kept), and when the broker wakes up the worker goes on by itself. Then SIGTERM
/// while the broker hangs, once with a session running and once while connecting:
/// the worker exits 0 within its grace period all the same. A fresh worker finishes
/// the run; nothing is lost. Dispatches sent during the hang and confirmed only
/// after it are dispatched again (the named window: sent, not recorded); counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_hang_every_wait_has_a_deadline_and_nothing_is_lost() {
    let _heavy = heavy().await;
    let Some(guard) = private_node().await else {
        record(json!({"scenario": "broker_hang", "skipped": "no rabbitmq-server on this machine"}));
        return;
    };
    let node = &guard.0;
    let hang = Duration::from_secs(if long() { 30 } else { 12 });
    let grace = 5;
    let n = 2_000;
    let ns = unique("brokerhang");
    let mut s = fault_settings(&ns, 200);
    s.amqp.url = node.url();
    s.worker.shutdown_grace = Dur(Duration::from_secs(grace));
    let _g = RedisGuard(ns.clone());
    let dir = procs::temp_dir("brokerhang");
    let connect = |url: String| async move {
        lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
            .await
            .expect("private node")
    };
    let conn = connect(node.url()).await;
    topology(&s).declare(&conn).await.unwrap();
    let mix = Mix::new(&ns, n, &noon_zone());
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let started = Instant::now();
    let mut w = WorkerProc::spawn(&s, &dir, "0");
    while depth(&conn, &dispatch).await.unwrap_or(0) < 300 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no progress:\n{}",
            w.tail(30)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = conn.close(200, "".into()).await;

    // 1. the broker hangs, then wakes up
    node.freeze();
    let thaw = Thaw(node);
    tokio::time::sleep(hang).await;
    drop(thaw);
    let woke = Instant::now();
    let conn = connect(node.url()).await;
    // sends confirmed late land at once; then paced dispatching must go on
    tokio::time::sleep(Duration::from_secs(1)).await;
    let landed = depth(&conn, &dispatch).await.unwrap_or(0);
    let mut resumed = None;
    while woke.elapsed() < Duration::from_secs(60) {
        if depth(&conn, &dispatch).await.unwrap_or(0) > landed + 20 {
            resumed = Some(woke.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(w.running(), "the worker exited:\n{}", w.tail(30));
    let _ = conn.close(200, "".into()).await;

    // 2. SIGTERM while the broker hangs: a running session, and one connecting
    node.freeze();
    let thaw = Thaw(node);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let mut connecting = WorkerProc::spawn(&s, &dir, "connecting");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let termed = Instant::now();
    w.term();
    connecting.term();
    let status_connecting = connecting.wait(Duration::from_secs(60));
    let exit_connecting = termed.elapsed();
    let status = w.wait(Duration::from_secs(grace + 120));
    let exit_running = termed.elapsed();
    drop(thaw);

    // 3. a fresh worker finishes the run
    let conn = connect(node.url()).await;
    let mut f = WorkerProc::spawn(&s, &dir, "finish");
    let done = settle_down(
        &conn,
        &s,
        mix.expected_dispatched(),
        mix.count(Kind::Malformed),
        Duration::from_secs(if long() { 600 } else { 180 }),
    )
    .await;
    f.term();
    let finish_status = f.wait(Duration::from_secs(30));
    let a = Audit::collect(&conn, &s, &mix.jobs).await;
    eprintln!("{}", a.summary(&mix.jobs));
    let lost = a.lost(&mix.jobs);
    let twice = a.in_two_places();
    let violations = check_caps(&s, &mix, &a).await;
    let panics = worker_panics(&dir);
    record(json!({
        "scenario": "broker_hang",
        "worker_panics": panics.len(),
        "test": "tests/faults.rs: broker_hang_every_wait_has_a_deadline_and_nothing_is_lost",
        "jobs": n,
        "faults": 2,
        "fault": format!("RabbitMQ node frozen (SIGSTOP) for {} s, then frozen again for a SIGTERM", hang.as_secs()),
        "hang_seconds": hang.as_secs(),
        "publish_timeout_seconds": s.amqp.publish_timeout.0.as_secs(),
        "prefetch": s.amqp.prefetch,
        "lost": lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "duplicate_waiting_copies": a.duplicate_waiting(),
        "duplicate_dead_letters": a.duplicate_dead(),
        "violations": violations.len(),
        "recovery_seconds": resumed.map(|d| d.as_secs_f64()),
        "grace_seconds": grace,
        "sigterm_exit_seconds_running": exit_running.as_secs_f64(),
        "sigterm_exit_seconds_connecting": exit_connecting.as_secs_f64(),
        "sigterm_exit_codes": [status.and_then(|s| s.code()), status_connecting.and_then(|s| s.code())],
    }));
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    let _ = conn.close(200, "".into()).await;
    assert!(
        resumed.is_some_and(|d| d < Duration::from_secs(10)),
        "dispatching resumed {resumed:?} after the broker woke up"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", w.tail(30));
    assert_eq!(
        status_connecting.and_then(|s| s.code()),
        Some(0),
        "{}",
        connecting.tail(30)
    );
    assert!(
        exit_running < Duration::from_millis(grace * 1000 + 500),
        "exit took {exit_running:?}"
    );
    assert!(
        exit_connecting < Duration::from_millis(grace * 1000 + 500),
        "exit took {exit_connecting:?}"
    );
    assert!(finish_status.map(|s| s.success()).unwrap_or(false));
    assert!(done, "the run did not settle: {}", a.summary(&mix.jobs));
    assert!(lost.is_empty(), "lost: {lost:?}");
    assert!(twice.is_empty(), "in two places: {twice:?}");
    assert!(violations.is_empty(), "violations: {violations:#?}");
}
