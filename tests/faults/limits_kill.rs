//! Fault scenario: kill -9 of a worker process while stacked limits hold the
//! jobs. Three workers share an account's limits (a rate per second and a
//! larger window on one bucket) and each sender's rate, every job taking its own
//! cost (1 to 3); one worker is killed twice and restarted at once. Afterwards,
//! from the dispatch record (each dispatched job's admission instant as its
//! recipient's key recorded it, in Redis time): no window of any limit holds more
//! than the limit allows (`testkit::limit_log`), and every job is dispatched,
//! none lost, a duplicate only where a kill explains it.
//!
//! What a kill leaves in the buckets: a job admitted by the killed worker and not
//! dispatched keeps its take (the buckets never give back what a dead worker took:
//! stricter, never looser); a job dispatched and not yet committed is admitted
//! again after the reservation lease and takes again, so that a duplicate a kill
//! causes is counted in every bucket it passed (its recipient's key keeps the
//! later admission, which the check reads).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::*;
use quota_worker::config::{ChannelSettings, Dur, LimitSettings, MatchSettings, Settings};
use quota_worker::quota::limits::Per;
use serde_json::json;
use testkit::audit::{self, depth, Audit, Published, Rng};
use testkit::limit_log::{self, Lookup, Sent};
use testkit::procs::WorkerProc;
use testkit::*;

pub(crate) const SENDERS: usize = 8;
const KILLS: usize = 2;

pub(crate) fn limit(rate: u64, period_ms: u64, burst: u64, per: Per) -> LimitSettings {
    LimitSettings {
        rate,
        period: Some(Dur(Duration::from_millis(period_ms))),
        burst: Some(burst),
        matches: MatchSettings {
            channels: Some(vec!["sms".into()]),
            ..MatchSettings::default()
        },
        per,
        warmup: None,
    }
}

/// An account's 40 units a second (burst 10) and 100 per 5 s (burst 40) on one
/// bucket, 4 a second for each sender (burst 4); `sms` paced at 200/s (never
/// the one that holds), a 3 s reservation lease. (Every rate divides its period
/// into whole µs, as the buckets count.)
pub(crate) fn stacked(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.redis.reservation_lease = Dur(Duration::from_secs(3));
    s.worker.shutdown_grace = Dur(Duration::from_secs(10));
    s.policies.get_mut("default").unwrap().rules = vec![];
    s.channels.insert(
        "sms".into(),
        ChannelSettings {
            rate: Some(200),
            burst: Some(20),
            ..Default::default()
        },
    );
    s.limits
        .insert("account_second".into(), limit(40, 1_000, 10, Per::All));
    s.limits
        .insert("account_window".into(), limit(100, 5_000, 40, Per::All));
    s.limits
        .insert("per_sender".into(), limit(4, 1_000, 4, Per::Sender));
    s
}

/// `n` jobs over [`SENDERS`] senders, costs 1 to 3, each its own recipient.
pub(crate) fn jobs(ns: &str, n: usize) -> (Vec<Published>, BTreeMap<String, Sent>) {
    let mut published = Vec::with_capacity(n);
    let mut sent = BTreeMap::new();
    for i in 0..n {
        let id = format!("{ns}-{i}");
        let recipient = format!("r-{i}");
        let sender = format!("s{}", i % SENDERS);
        let cost = 1 + (i / SENDERS) as u64 % 3;
        let body = format!(
            r#"{{"id":"{id}","recipient":"{recipient}","channel":"sms","sender":"{sender}","cost":{cost},"payload":{{"text":"hello"}}}}"#
        );
        sent.insert(
            id.clone(),
            Sent {
                id: id.clone(),
                at_ms: 0,
                cost,
                channel: "sms".into(),
                category: "default".into(),
                tenant: None,
                sender: Some(sender),
            },
        );
        published.push(Published {
            id,
            recipient,
            body: body.into_bytes(),
        });
    }
    (published, sent)
}

/// What the dispatch record says of the limits after a run: the dispatched jobs
/// with their admission instants (those whose send no key records apart), and the
/// windows exceeded.
pub(crate) struct Judged {
    pub(crate) sent: Vec<Sent>,
    /// Dispatched jobs no recipient's key records (a failover forgot them).
    pub(crate) unrecorded: Vec<String>,
    pub(crate) exceeded: Vec<limit_log::Window>,
    pub(crate) fullest: Vec<limit_log::Window>,
}

pub(crate) async fn judge_limits(
    s: &Settings,
    a: &Audit,
    published: &[Published],
    by_id: &BTreeMap<String, Sent>,
) -> Judged {
    let lookups: Vec<Lookup> = published
        .iter()
        .filter(|p| a.dispatched.contains_key(&p.id))
        .map(|p| Lookup {
            id: &p.id,
            recipient: &p.recipient,
            tenant: None,
        })
        .collect();
    let mut sent = Vec::new();
    let mut unrecorded = Vec::new();
    for (id, at) in limit_log::admitted_at(s, "default", &lookups).await {
        match at {
            Some(at_ms) => sent.push(Sent {
                at_ms,
                ..by_id[&id].clone()
            }),
            None => unrecorded.push(id),
        }
    }
    let fullest = limit_log::fullest_windows(&s.limits, &sent);
    for w in &fullest {
        eprintln!("fullest window: {w}");
    }
    Judged {
        exceeded: limit_log::exceeded(&s.limits, &sent),
        sent,
        unrecorded,
        fullest,
    }
}

async fn start_three(
    s: &Settings,
    dir: &std::path::Path,
    conn: &lapin::Connection,
) -> Vec<WorkerProc> {
    let procs: Vec<WorkerProc> = (0..3)
        .map(|n| WorkerProc::spawn(crate::BIN, s, dir, &n.to_string()))
        .collect();
    wait_consumers(conn, &s.amqp.jobs_queue, 3, Duration::from_secs(60))
        .await
        .unwrap_or_else(|| panic!("three consumers:\n{}", procs[0].tail(30)));
    procs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_during_stacked_limits_exceeds_no_window_and_loses_nothing() {
    let _heavy = heavy().await;
    let ns = unique("limitskill");
    let s = stacked(&ns);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir("limitskill");
    declare(&s).await;
    let n = if testkit::reliability::long() {
        1_500
    } else {
        300
    };
    let (published, by_id) = jobs(&ns, n);
    let conn = amqp().await;
    let mut procs = start_three(&s, &dir, &conn).await;
    audit::publish_all(&conn, &s, &published).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let mut rng = Rng::from_env();
    let mut kill_depths = Vec::new();
    for k in 0..KILLS {
        tokio::time::sleep(Duration::from_millis(rng.range(2_000, 5_000))).await;
        let victim = k % procs.len();
        procs[victim].kill9();
        wait_consumers(&conn, &s.amqp.jobs_queue, 2, Duration::from_secs(10)).await;
        kill_depths.push(depth(&conn, &dispatch).await.unwrap_or(0) as usize);
        procs[victim] = WorkerProc::spawn(crate::BIN, &s, &dir, &format!("{victim}-{}", k + 1));
        wait_consumers(&conn, &s.amqp.jobs_queue, 3, Duration::from_secs(60))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "restarted worker never consumed:\n{}",
                    procs[victim].tail(30)
                )
            });
    }
    eprintln!("killed with {kill_depths:?} dispatched");
    let settled = wait_until_quiet(&conn, &s, n, 0, Duration::from_secs(120)).await;
    let statuses: Vec<_> = procs.iter_mut().map(|w| w.stop()).collect();
    let a = Audit::collect(&conn, &s, &published).await;
    eprintln!("{}", a.summary(&published));
    let window = s.amqp.prefetch as usize + s.lanes.prefetch.ceiling() as usize;
    let (explained, _, unexplained) = explain_duplicates(&a, &kill_depths, window);
    let judged = judge_limits(&s, &a, &published, &by_id).await;
    let units: u64 = judged.sent.iter().map(|x| x.cost).sum();
    let figures = json!({
        "scenario": "limits_kill",
        "test": "tests/faults/limits_kill.rs: kill_9_during_stacked_limits_exceeds_no_window_and_loses_nothing",
        "fault": "kill -9 of one of three workers while stacked limits (per second and per 5 s on one account, per sender) hold the jobs, restarted at once",
        "jobs": n,
        "units": units,
        "faults": kill_depths.len(),
        "duplicates": a.duplicate_dispatches(),
        "duplicates_explained": explained,
        "duplicates_unexplained": unexplained.len(),
        "dispatched": a.dispatched.len(),
        "dead": a.dead.len(),
        "unrecorded": judged.unrecorded.len(),
        "violations": judged.exceeded.len(),
        "fullest_windows": judged.fullest.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
    });
    conclude(
        &dir,
        figures,
        settled,
        &a.lost(&published),
        &a.summary(&published),
    );
    for st in statuses {
        assert!(st.is_some_and(|x| x.success()), "worker exit {st:?}");
    }
    assert!(a.dead.is_empty(), "dead letters: {:?}", a.dead);
    assert!(a.strangers.is_empty(), "{:?}", a.strangers);
    assert_eq!(a.dispatched.len(), n, "jobs dispatched");
    assert!(
        unexplained.is_empty(),
        "duplicates no kill explains: {unexplained:?}"
    );
    assert!(
        judged.unrecorded.is_empty(),
        "no send recorded: {:?}",
        judged.unrecorded
    );
    assert!(
        judged.exceeded.is_empty(),
        "windows exceeded: {:#?}",
        judged.exceeded
    );
    let burst = s.limits["account_window"].burst.unwrap();
    assert!(units > burst, "the account's window never held a job");
}
