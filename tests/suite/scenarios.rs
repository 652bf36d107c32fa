//! QuotaStore scenarios that must hold on a single Redis node and on a Redis Cluster
//! alike. Each takes the settings of one test (its own key prefix, pointing at the
//! backend); `engine` runs them on the machine's Redis and `cluster` on a local
//! three-master cluster. Checks read Redis through the
//! engine's own connection, so they work on both.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use quota_worker::admission::{Admission, Request, Ticket};
use quota_worker::config::{RuleSettings, Settings};
use quota_worker::quota::policy::Rate;
use quota_worker::quota::window;
use quota_worker::redis::RedisConn;
use quota_worker::store::QuotaStore;

pub fn req<'a>(id: &'a str, recipient: &'a str, tz: Tz) -> Request<'a> {
    Request {
        id,
        recipient,
        channel: "sms",
        category: "default",
        tz,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    }
}

pub async fn engine(s: &Settings) -> QuotaStore {
    QuotaStore::connect(s).await.expect("redis")
}

pub fn admitted(a: &Admission) -> &Ticket {
    match a {
        Admission::Admitted(t) => t,
        other => panic!("expected admitted, got {other:?}"),
    }
}

pub fn retry_at(a: &Admission) -> DateTime<Utc> {
    match a {
        Admission::Refused {
            retry_at: Some(t), ..
        } => *t,
        other => panic!("expected refused with a retry time, got {other:?}"),
    }
}

/// One command on the engine's connection (single node or cluster).
async fn query<T: redis::FromRedisValue>(conn: &mut RedisConn, cmd: &str, key: &str) -> T {
    redis::cmd(cmd).arg(key).query_async(conn).await.unwrap()
}

/// A second job on the same local day waits for the recipient's next midnight, in
/// zones with odd offsets and daylight saving.
pub async fn second_job_same_local_day_waits_for_the_next_midnight(s: Settings) {
    let e = engine(&s).await;
    for zone in [
        "Asia/Shanghai",
        "America/Santiago",
        "Asia/Kathmandu",
        "Australia/Lord_Howe",
    ] {
        let tz: Tz = zone.parse().unwrap();
        let who = format!("user-{zone}");
        let t = admitted(&e.admit(&req("job-1", &who, tz)).await.unwrap()).clone();
        e.commit(&t).await.unwrap();
        let second = e.admit(&req("job-2", &who, tz)).await.unwrap();
        assert_eq!(
            retry_at(&second),
            window::next_day_start(tz, t.admitted_at),
            "{zone}"
        );
    }
}

/// With "2 per 3 s", the third job may go exactly 3 s after the first.
pub async fn rolling_window_retry_is_exact(mut s: Settings) {
    s.policies.get_mut("default").unwrap().rules = vec![RuleSettings {
        limit: 2,
        window: "3s".parse().unwrap(),
    }];
    let e = engine(&s).await;
    let first = admitted(&e.admit(&req("a", "bob", Tz::UTC)).await.unwrap()).admitted_at;
    admitted(&e.admit(&req("b", "bob", Tz::UTC)).await.unwrap());
    let refused = e.admit(&req("c", "bob", Tz::UTC)).await.unwrap();
    assert_eq!(retry_at(&refused), first + chrono::Duration::seconds(3));
}

/// The same job again is in flight while reserved, a duplicate once committed, and
/// counts once.
pub async fn same_job_twice_is_in_flight_then_a_duplicate_and_counts_once(s: Settings) {
    let e = engine(&s).await;
    let ticket = admitted(&e.admit(&req("same", "carol", Tz::UTC)).await.unwrap()).clone();
    assert_eq!(
        e.admit(&req("same", "carol", Tz::UTC)).await.unwrap(),
        Admission::Reserved {
            retry_at: ticket.admitted_at + chrono::Duration::minutes(2)
        }
    );
    e.commit(&ticket).await.unwrap();
    assert_eq!(
        e.admit(&req("same", "carol", Tz::UTC)).await.unwrap(),
        Admission::Duplicate
    );
    let key = e.keys().recipient("carol", "default", None);
    let n: i64 = query(&mut e.connection(), "ZCARD", &key).await;
    assert_eq!(n, 1);
}

/// A released admission gives the recipient's quota back.
pub async fn release_gives_the_quota_back(s: Settings) {
    let e = engine(&s).await;
    let a = e.admit(&req("x", "erin", Tz::UTC)).await.unwrap();
    e.release(admitted(&a)).await.unwrap();
    admitted(&e.admit(&req("y", "erin", Tz::UTC)).await.unwrap());
}

/// A job refused by its recipient's cap gives back the rate token it took.
pub async fn a_refused_job_leaves_no_trace_in_the_rate(mut s: Settings) {
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(1);
    sms.period = Some(quota_worker::config::Dur(Duration::from_secs(3600)));
    sms.burst = Some(2);
    let e = engine(&s).await;
    let mut c = e.connection();
    admitted(&e.admit(&req("1", "frank", Tz::UTC)).await.unwrap());
    let rate_key = e.keys().rate("sms");
    let before: i64 = query(&mut c, "GET", &rate_key).await;
    assert!(matches!(
        e.admit(&req("2", "frank", Tz::UTC)).await.unwrap(),
        Admission::Refused { .. }
    ));
    let after: i64 = query(&mut c, "GET", &rate_key).await;
    assert!(after <= before, "rate TAT moved from {before} to {after}");
    // so another recipient still gets the second token of the burst at once
    admitted(&e.admit(&req("3", "grace", Tz::UTC)).await.unwrap());
}

/// GCRA replies and the stored state are exact integers; a cost above the burst is
/// "never"; a cost of 0 writes nothing.
pub async fn gcra_replies_and_state_are_exact_integers(s: Settings) {
    let e = engine(&s).await;
    let mut c = e.connection();
    let rate = Rate {
        interval_us: 333_334,
        burst: 3,
        cost: 1,
    };
    let first = e.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!((first.allowed, first.remaining), (1, 2));
    let raw: String = query(&mut c, "GET", &e.keys().rate("sms")).await;
    assert!(
        raw.parse::<i64>().is_ok(),
        "TAT stored as an integer: {raw}"
    );
    assert_eq!(e.call_rate("sms", rate, 2).await.unwrap().allowed, 1);
    let refused = e.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!(refused.allowed, 0);
    assert!(
        refused.retry_after > Duration::ZERO
            && refused.retry_after <= Duration::from_micros(333_334)
    );
    assert_eq!(e.call_rate("sms", rate, 4).await.unwrap().allowed, -1);
    assert_eq!(e.call_rate("other", rate, 0).await.unwrap().allowed, 1);
    let exists: i64 = query(&mut c, "EXISTS", &e.keys().rate("other")).await;
    assert_eq!(exists, 0);
}

/// 200 admissions of one recipient at once, over eight connections: one admitted.
pub async fn concurrent_admissions_admit_one(s: Settings) {
    let mut engines = Vec::new();
    for _ in 0..8 {
        engines.push(Arc::new(engine(&s).await));
    }
    let mut tasks = Vec::new();
    for i in 0..200 {
        let e = engines[i % 8].clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("job-{i}");
            matches!(
                e.admit(&req(&id, "hot", Tz::UTC)).await.unwrap(),
                Admission::Admitted(_)
            )
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.unwrap() as usize;
    }
    assert_eq!(n, 1, "1 per calendar day");
}

/// `connections` engines hammer a 50/s rate with a burst of 5 for `run`: never more
/// than the burst plus 50 per second pass.
pub async fn channel_rate_holds_under_concurrency(s: Settings, connections: usize, run: Duration) {
    let rate = Rate {
        interval_us: 20_000,
        burst: 5,
        cost: 1,
    };
    let mut engines = Vec::new();
    for _ in 0..connections {
        engines.push(Arc::new(engine(&s).await));
    }
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for e in engines {
        tasks.push(tokio::spawn(async move {
            let mut allowed = 0u64;
            while started.elapsed() < run {
                if e.call_rate("sms", rate, 1).await.unwrap().allowed == 1 {
                    allowed += 1;
                }
            }
            allowed
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let ceiling = 5 + (elapsed * 50.0).ceil() as u64;
    assert!(
        total <= ceiling,
        "{total} allowed in {elapsed:.3}s, at most {ceiling}"
    );
    assert!(total >= 5, "the burst passes at once");
}

/// `engines` engines, each with 64 jobs asking a 2,000/s rate (burst 20) at once
/// for `run`, each job waiting as long as the rate says when refused: the takes
/// of a channel go in batches (far fewer calls than asks), and what passes is the
/// rate, within 5 % (neither more, nor less: batching loses no slot).
pub async fn batched_takes_drain_the_rate(s: Settings, engines: usize, run: Duration) {
    let rate = Rate {
        interval_us: 500,
        burst: 20,
        cost: 1,
    };
    let mut all = Vec::new();
    for _ in 0..engines {
        all.push(Arc::new(engine(&s).await));
    }
    let calls_before: u64 = all.iter().map(|e| e.calls()).sum();
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for e in &all {
        for _ in 0..64 {
            let e = e.clone();
            tasks.push(tokio::spawn(async move {
                let (mut granted, mut asks) = (0u64, 0u64);
                while started.elapsed() < run {
                    asks += 1;
                    let reply = e.take_rate("sms", rate).await.unwrap();
                    if reply.allowed == 1 {
                        granted += 1;
                    } else {
                        tokio::time::sleep(reply.retry_after.max(Duration::from_micros(100))).await;
                    }
                }
                (granted, asks)
            }));
        }
    }
    let (mut granted, mut asks) = (0u64, 0u64);
    for t in tasks {
        let (g, a) = t.await.unwrap();
        granted += g;
        asks += a;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let calls: u64 = all.iter().map(|e| e.calls()).sum::<u64>() - calls_before;
    let expected = 20.0 + elapsed * 2000.0;
    eprintln!("{granted} granted of {asks} asks in {calls} calls over {elapsed:.3} s; the rate allows {expected:.0}");
    assert!(
        (granted as f64 - expected).abs() <= expected * 0.05,
        "{granted} granted in {elapsed:.3} s, expected {expected:.0} ± 5 %"
    );
    assert!(
        calls * 4 <= asks,
        "{calls} calls for {asks} asks: not batched"
    );
}

/// A refund gives back only what its take added and is still unspent: at once it
/// gives the whole token back, but after the bucket refilled (the take's span of
/// time is past) it gives nothing, so a late refund never lets a job through
/// early. One per 2 s, burst 1: take A, refund A at once (the next take passes),
/// take B, wait 3 s, take C, refund B late: D, right after C, is refused.
pub async fn refund_credits_only_what_is_unspent(s: Settings) {
    let e = engine(&s).await;
    let rate = Rate {
        interval_us: 2_000_000,
        burst: 1,
        cost: 1,
    };
    let a = e.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!(a.allowed, 1);
    let credit = e.refund("sms", rate, a.tat_us).await.unwrap();
    assert!(
        credit > Duration::from_millis(1500) && credit <= Duration::from_secs(2),
        "a refund right after the take gives the token back: {credit:?}"
    );
    let b = e.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!(b.allowed, 1, "the refunded token is there again");

    tokio::time::sleep(Duration::from_secs(3)).await;
    let c = e.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!(c.allowed, 1, "the bucket refilled");
    let late = e.refund("sms", rate, b.tat_us).await.unwrap();
    assert_eq!(late, Duration::ZERO, "B's span is past: nothing is owed");
    let d = e.call_rate("sms", rate, 1).await.unwrap();
    assert_eq!(
        d.allowed, 0,
        "one per 2 s: D right after C must wait (a late refund must not let it through)"
    );
    assert!(
        d.retry_after > Duration::from_secs(1),
        "{:?}",
        d.retry_after
    );
}
