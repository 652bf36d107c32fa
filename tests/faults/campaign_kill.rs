//! Fault scenario: kill -9 of the worker while it parks a campaign. A producer that
//! knows no lanes publishes a campaign to the jobs exchange at a steady pace (bulk
//! jobs of a policy whose lane is `bulk`, no `priority` field, an urgent
//! `transactional` one every 50th) faster than the channel's rate, so the worker
//! parks it in the lanes as it reads it; the worker is killed while it does
//! (each kill while the campaign is still being published or read), restarted
//! at once each time, and then left to drain the lanes. Afterwards every job is
//! found: dispatched once (a duplicate only in the window a kill explains: a
//! dispatch confirmed, its commit not yet made), none lost, none dead-lettered,
//! every dispatch recorded in Redis.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::{PolicySettings, Settings};
use quota_worker::lanes::Priority;
use serde_json::json;
use testkit::audit::{self, depth, Audit, Published, Rng};
use testkit::procs::WorkerProc;
use testkit::reliability::long;
use testkit::*;

/// Every this many jobs of the campaign, one is urgent.
const URGENT_EVERY: usize = 50;

/// The fault settings (channel `sms` paced at `rate`, a 3 s lease) with the policy
/// `campaign` in the bulk lane and `transactional` in the urgent one.
fn campaign_settings(ns: &str, rate: u64) -> Settings {
    let mut s = fault_settings(ns, rate);
    let bulk = PolicySettings {
        priority: Priority::Bulk,
        ..policy(&[])
    };
    s.policies.insert("campaign".into(), bulk);
    if let Some(t) = s.policies.get_mut("transactional") {
        t.priority = Priority::Urgent;
    }
    s
}

/// The campaign: `n` jobs, each its own recipient, as a plain producer writes them.
fn campaign(ns: &str, n: usize) -> Vec<Published> {
    (0..n)
        .map(|i| {
            let id = format!("{ns}-{i}");
            let (recipient, category) = match i % URGENT_EVERY == URGENT_EVERY - 1 {
                true => (format!("u-{i}"), "transactional"),
                false => (format!("c-{i}"), "campaign"),
            };
            let body = audit::job_body(&id, &recipient, "sms", category, "UTC");
            Published {
                id,
                recipient,
                body,
            }
        })
        .collect()
}

/// Publishes `jobs` at `per_sec`, a tenth of a second's worth at a time, every one
/// confirmed; sets `done` at the end.
async fn publish_paced(s: Settings, jobs: Vec<Published>, per_sec: usize, done: Arc<AtomicBool>) {
    let conn = amqp().await;
    let started = Instant::now();
    for (i, batch) in jobs.chunks(per_sec / 10).enumerate() {
        let due = started + Duration::from_millis(100 * i as u64);
        tokio::time::sleep_until(due.into()).await;
        audit::publish_all(&conn, &s, batch).await;
    }
    done.store(true, Ordering::Relaxed);
    let _ = conn.close(200, "".into()).await;
}

/// The scenario's size: jobs, kills, the channel's rate and the publish rate.
struct Form {
    n: usize,
    kills: usize,
    rate: u64,
    per_sec: usize,
}

impl Form {
    fn now() -> Form {
        let (n, kills, rate, per_sec) = if long() {
            (20_000, 10, 1_000, 2_000)
        } else {
            (8_000, 4, 400, 1_000)
        };
        Form {
            n,
            kills,
            rate,
            per_sec,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_parking_a_campaign_loses_nothing() {
    let _heavy = heavy().await;
    let f = Form::now();
    let ns = unique("cpkill");
    let s = campaign_settings(&ns, f.rate);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("cpkill");
    declare(&s).await;
    let jobs = campaign(&ns, f.n);
    let conn = amqp().await;
    let started = Instant::now();
    let w = WorkerProc::spawn(crate::BIN, &s, &dir, "0");
    wait_consumers(&conn, &s.amqp.jobs_queue, 1, Duration::from_secs(30))
        .await
        .expect("worker consumes");
    let published = Arc::new(AtomicBool::new(false));
    let publishing = tokio::spawn(publish_paced(
        s.clone(),
        jobs.clone(),
        f.per_sec,
        published.clone(),
    ));
    let (mut w, kill_depths, recovery) =
        kill_while_parked(&conn, &s, &dir, w, f.kills, &published).await;
    let kills_done_at = started.elapsed().as_secs_f64();
    publishing.await.unwrap();
    let limit = Duration::from_secs(if long() { 600 } else { 180 });
    let settled = wait_until_quiet(&conn, &s, f.n, 0, limit).await;
    let quiet_at = started.elapsed().as_secs_f64();
    let status = w.stop();
    let a = Audit::collect(&conn, &s, &jobs).await;
    eprintln!("{}", a.summary(&jobs));
    // the deliveries a worker may hold at a kill: the jobs queue's and a lane's
    let window = s.amqp.prefetch as usize + s.lanes.prefetch.ceiling() as usize;
    let (explained, farthest, unexplained) = explain_duplicates(&a, &kill_depths, window);
    let (uncommitted, unrecorded) = unrecorded_dispatches(&s, &jobs, &a).await;
    // a kill after a job's delayed copy (its reservation held by another delivery)
    // was confirmed, before its delivery was acked: the copy comes back as a
    // duplicate, never a second send (as in the kill -9 scenario)
    let twice = a.in_two_places();
    let stray = twice
        .iter()
        .filter(|id| a.dispatched.contains_key(*id) && a.waiting.contains_key(*id))
        .count();
    let mut figures = json!({
        "duplicates_explained": explained,
        "duplicates_unexplained": unexplained.len(),
        "duplicate_farthest_before_kill": farthest,
        "dispatched_and_waiting": stray,
        "uncommitted_after_kills": uncommitted,
        "dispatched_unrecorded": unrecorded.len(),
        "recovery_seconds": recovery.iter().max().map_or(0.0, Duration::as_secs_f64),
        "faults": kill_depths.len(),
        "kills_over_seconds": kills_done_at,
        "elapsed_seconds": quiet_at,
    });
    add_figures(&mut figures, &f, &a);
    conclude(&dir, figures, settled, &a.lost(&jobs), &a.summary(&jobs));
    let worker = w.tail(30);
    assert!(
        status.is_some_and(|s| s.success()),
        "worker exit {status:?}:\n{worker}"
    );
    assert_eq!(
        kill_depths.len(),
        f.kills,
        "kills while the campaign was parked"
    );
    assert!(a.strangers.is_empty(), "unknown ids: {:?}", a.strangers);
    assert!(a.dead.is_empty(), "dead letters: {:?}", a.dead);
    assert_eq!(stray, twice.len(), "jobs in two places: {twice:?}");
    assert!(
        stray <= f.kills * window,
        "{stray} dispatched jobs still waiting"
    );
    assert_eq!(a.dispatched.len(), f.n, "jobs dispatched");
    assert!(
        unexplained.is_empty(),
        "duplicates no kill explains: {unexplained:?}"
    );
    assert!(
        unrecorded.is_empty(),
        "dispatched without a recorded send: {unrecorded:?}"
    );
    let most = f.kills * 512; // worker::commits::BATCH a kill
    assert!(
        uncommitted <= most,
        "{uncommitted} uncommitted after the kills"
    );
}

/// The figures every run records besides its own: the scenario, its form and the
/// audit's counts.
fn add_figures(figures: &mut serde_json::Value, f: &Form, a: &Audit) {
    let more = json!({
        "scenario": "campaign_kill",
        "test": "tests/faults/campaign_kill.rs: kill_9_while_parking_a_campaign_loses_nothing",
        "fault": "kill -9 of the worker while it parks a campaign published to the jobs exchange, restarted at once",
        "jobs": f.n,
        "published_per_second": f.per_sec,
        "rate_per_second": f.rate,
        "duplicates": a.duplicate_dispatches(),
        "duplicate_waiting_copies": a.duplicate_waiting(),
        "dispatched": a.dispatched.len(),
        "waiting": a.waiting.len(),
        "dead": a.dead.len(),
    });
    for (k, v) in more.as_object().into_iter().flatten() {
        figures[k] = v.clone();
    }
}

/// Kills the worker `w` `kills` times, at random moments while the campaign is
/// still being published or read (`published` set and the jobs queue empty: no
/// more kills), restarting it at once each time: the worker running at the end,
/// the dispatch queue's depth at each kill, and each restart's time to consume.
async fn kill_while_parked(
    conn: &lapin::Connection,
    s: &Settings,
    dir: &std::path::Path,
    mut w: WorkerProc,
    kills: usize,
    published: &AtomicBool,
) -> (WorkerProc, Vec<usize>, Vec<Duration>) {
    let dispatch = topology(s).dispatch_queue("sms");
    let mut rng = Rng::from_env();
    let (mut kill_depths, mut recovery) = (Vec::new(), Vec::new());
    for k in 0..kills {
        tokio::time::sleep(Duration::from_millis(rng.range(400, 1000))).await;
        let unread = depth(conn, &s.amqp.jobs_queue).await.unwrap_or(0);
        if published.load(Ordering::Relaxed) && unread == 0 {
            break;
        }
        w.kill9();
        wait_consumers(conn, &s.amqp.jobs_queue, 0, Duration::from_secs(10)).await;
        kill_depths.push(depth(conn, &dispatch).await.unwrap_or(0) as usize);
        w = WorkerProc::spawn(crate::BIN, s, dir, &(k + 1).to_string());
        recovery.push(
            wait_consumers(conn, &s.amqp.jobs_queue, 1, Duration::from_secs(30))
                .await
                .unwrap_or_else(|| panic!("restarted worker never consumed:\n{}", w.tail(30))),
        );
    }
    (w, kill_depths, recovery)
}

/// Of the dispatched jobs, how many have their send recorded only as reserved (a
/// kill between the confirm and the commit), and which have none recorded.
async fn unrecorded_dispatches(
    s: &Settings,
    jobs: &[Published],
    a: &Audit,
) -> (usize, Vec<String>) {
    let keys = s.redis.keys();
    let mut conn = quota_worker::redis::RedisConn::connect(&s.redis)
        .await
        .expect("redis for the audit");
    let (mut uncommitted, mut unrecorded) = (0, Vec::new());
    for j in jobs.iter().filter(|j| a.dispatched.contains_key(&j.id)) {
        let policy = if j.recipient.starts_with("u-") {
            "transactional"
        } else {
            "campaign"
        };
        let sends = audit::recorded(&mut conn, &keys.recipient(&j.recipient, policy, None)).await;
        let member = quota_worker::quota::keys::member(&j.id);
        match sends.iter().find(|(_, _, m)| *m == member) {
            Some((_, true, _)) => {}
            Some((_, false, _)) => uncommitted += 1,
            None => unrecorded.push(j.id.clone()),
        }
    }
    (uncommitted, unrecorded)
}
