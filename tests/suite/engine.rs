//! The quota engine against the machine's real Redis: caps, exact retry times,
//! duplicates, reservations, the GCRA rate, concurrency, one clock, memory.

use std::sync::Arc;
use std::time::Duration;

use crate::scenarios::{self, admitted, engine, req, retry_at};
use chrono_tz::Tz;
use quota_worker::admission::Admission;
use quota_worker::config::RuleSettings;
use quota_worker::quota::window;
use quota_worker::redis::StoreError;
use quota_worker::store::QuotaStore;
use testkit::{settings, unique, RedisGuard};

/// One burst: `n` admissions at once, each in a task of its own, so that they wait
/// for Redis together and share calls. `job(i)` gives job i's id, recipient, zone and
/// category; the outcomes come back in job order.
async fn burst(
    e: &Arc<QuotaStore>,
    n: usize,
    job: impl Fn(usize) -> (String, String, Tz, &'static str),
) -> Vec<Result<Admission, StoreError>> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let e = e.clone();
            let (id, who, tz, category) = job(i);
            tokio::spawn(async move {
                let mut r = req(&id, &who, tz);
                r.category = category;
                e.admit(&r).await
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(n);
    for t in tasks {
        outcomes.push(t.await.unwrap());
    }
    outcomes
}

#[tokio::test]
async fn second_job_same_local_day_waits_for_the_recipients_next_midnight() {
    let ns = unique("day");
    let _g = RedisGuard(ns.clone());
    scenarios::second_job_same_local_day_waits_for_the_next_midnight(settings(&ns)).await;
}

#[tokio::test]
async fn fourth_job_in_seven_days_waits_until_the_oldest_leaves_the_window() {
    let ns = unique("week");
    let _g = RedisGuard(ns.clone());
    let s = settings(&ns);
    let e = engine(&s).await;
    let tz: Tz = "Europe/Paris".parse().unwrap();
    let now = e.sync_clock().await.unwrap();
    let today = window::local_date(tz, now);
    // three committed sends at local noon 6, 4 and 2 days ago
    let key = e.keys().recipient("alice", "default", None);
    let mut c = testkit::redis_sync();
    let mut oldest = None;
    for (i, back) in [6i64, 4, 2].iter().enumerate() {
        let day = today - chrono::Duration::days(*back);
        let at = window::day_start(tz, day) + chrono::Duration::hours(12);
        oldest.get_or_insert(day);
        let _: () = redis::cmd("ZADD")
            .arg(&key)
            .arg(at.timestamp_millis() * 2 + 1)
            .arg(quota_worker::quota::keys::member(&format!("old-{i}")))
            .query(&mut c)
            .unwrap();
    }
    let refused = e.admit(&req("job-4", "alice", tz)).await.unwrap();
    let expected = window::day_start(tz, oldest.unwrap() + chrono::Duration::days(7));
    assert_eq!(retry_at(&refused), expected);
    assert!(matches!(refused, Admission::Refused { rule: Some(r), .. } if r.limit == 3));
    // nothing was recorded for the refused job
    let n: i64 = redis::cmd("ZCARD").arg(&key).query(&mut c).unwrap();
    assert_eq!(n, 3);
}

#[tokio::test]
async fn rolling_window_retry_is_exact() {
    let ns = unique("rolling");
    let _g = RedisGuard(ns.clone());
    scenarios::rolling_window_retry_is_exact(settings(&ns)).await;
}

#[tokio::test]
async fn same_job_twice_is_in_flight_then_a_duplicate_and_counts_once() {
    let ns = unique("dup");
    let _g = RedisGuard(ns.clone());
    scenarios::same_job_twice_is_in_flight_then_a_duplicate_and_counts_once(settings(&ns)).await;
}

#[tokio::test]
async fn an_abandoned_reservation_is_admitted_again_after_its_lease() {
    let ns = unique("lease");
    let _g = RedisGuard(ns.clone());
    let mut s = settings(&ns);
    s.redis.reservation_lease = quota_worker::config::Dur(Duration::from_secs(1));
    let e = engine(&s).await;
    admitted(&e.admit(&req("crashy", "dave", Tz::UTC)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = e.admit(&req("crashy", "dave", Tz::UTC)).await.unwrap();
    e.commit(admitted(&again)).await.unwrap();
    let key = e.keys().recipient("dave", "default", None);
    let n: i64 = redis::cmd("ZCARD")
        .arg(&key)
        .query(&mut testkit::redis_sync())
        .unwrap();
    assert_eq!(n, 1);
}

/// A worker killed after its dispatch went out but before it confirmed leaves a
/// reservation that the job's next attempt takes over; if that attempt is given
/// back (parked in a lane, its dispatch refused), the first one may still have been
/// sent: the recipient's slot stays taken, and the job takes it back when it comes.
#[tokio::test]
async fn a_taken_over_reservation_given_back_still_counts() {
    let ns = unique("inherit");
    let _g = RedisGuard(ns.clone());
    let mut s = settings(&ns);
    s.redis.reservation_lease = quota_worker::config::Dur(Duration::from_secs(1));
    let e = engine(&s).await;
    admitted(&e.admit(&req("sent-maybe", "erin", Tz::UTC)).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let again = e.admit(&req("sent-maybe", "erin", Tz::UTC)).await.unwrap();
    e.release(admitted(&again)).await.unwrap();
    let other = e.admit(&req("another", "erin", Tz::UTC)).await.unwrap();
    assert!(
        matches!(other, Admission::Refused { .. }),
        "the slot of a job that may have been sent went to another: {other:?}"
    );
    // this worker takes its kept reservation back at once, and confirms it
    let third = e.admit(&req("sent-maybe", "erin", Tz::UTC)).await.unwrap();
    e.commit(admitted(&third)).await.unwrap();
    let key = e.keys().recipient("erin", "default", None);
    let n: i64 = redis::cmd("ZCARD")
        .arg(&key)
        .query(&mut testkit::redis_sync())
        .unwrap();
    assert_eq!(n, 1);
}

/// An attempt slower than the lease is overtaken by another copy of its job; giving
/// the slow one back must not free the slot the other now holds (whose dispatch
/// then confirms: the recipient has one send, committed).
#[tokio::test]
async fn a_slow_attempt_given_back_leaves_the_overtaking_copys_reservation() {
    let ns = unique("overtaken");
    let _g = RedisGuard(ns.clone());
    let mut s = settings(&ns);
    s.redis.reservation_lease = quota_worker::config::Dur(Duration::from_secs(1));
    let e = engine(&s).await;
    let slow = e.admit(&req("twice", "fred", Tz::UTC)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let fast = e.admit(&req("twice", "fred", Tz::UTC)).await.unwrap();
    e.release(admitted(&slow)).await.unwrap();
    let other = e.admit(&req("another", "fred", Tz::UTC)).await.unwrap();
    assert!(
        matches!(other, Admission::Refused { .. }),
        "the overtaking copy's slot went to another job: {other:?}"
    );
    e.commit(admitted(&fast)).await.unwrap();
    let key = e.keys().recipient("fred", "default", None);
    let scores: Vec<(Vec<u8>, i64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut testkit::redis_sync())
        .unwrap();
    assert_eq!(scores.len(), 1);
    assert_eq!(scores[0].1 % 2, 1, "committed");
}

#[tokio::test]
async fn release_gives_the_quota_back() {
    let ns = unique("release");
    let _g = RedisGuard(ns.clone());
    scenarios::release_gives_the_quota_back(settings(&ns)).await;
}

#[tokio::test]
async fn a_refused_job_leaves_no_trace_in_the_rate() {
    let ns = unique("trace");
    let _g = RedisGuard(ns.clone());
    scenarios::a_refused_job_leaves_no_trace_in_the_rate(settings(&ns)).await;
}

#[tokio::test]
async fn two_hundred_concurrent_admissions_over_eight_connections_admit_one() {
    let ns = unique("race");
    let _g = RedisGuard(ns.clone());
    scenarios::concurrent_admissions_admit_one(settings(&ns)).await;
}

#[tokio::test]
async fn channel_rate_holds_under_concurrency() {
    let ns = unique("gcra");
    let _g = RedisGuard(ns.clone());
    scenarios::channel_rate_holds_under_concurrency(settings(&ns), 8, Duration::from_millis(1500))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_takes_drain_the_rate() {
    let ns = unique("gcra-batch");
    let _g = RedisGuard(ns.clone());
    scenarios::batched_takes_drain_the_rate(settings(&ns), 3, Duration::from_secs(2)).await;
}

#[tokio::test]
async fn gcra_replies_and_state_are_exact_integers() {
    let ns = unique("gcra-int");
    let _g = RedisGuard(ns.clone());
    scenarios::gcra_replies_and_state_are_exact_integers(settings(&ns)).await;
}

#[tokio::test]
async fn refund_credits_only_what_is_unspent() {
    let ns = unique("refund");
    let _g = RedisGuard(ns.clone());
    scenarios::refund_credits_only_what_is_unspent(settings(&ns)).await;
}

#[tokio::test]
async fn workers_with_skewed_clocks_agree_on_the_day() {
    let ns = unique("clock");
    let _g = RedisGuard(ns.clone());
    let s = settings(&ns);
    let ahead = engine(&s).await;
    let behind = engine(&s).await;
    ahead.skew_clock_for_tests(chrono::Duration::hours(13));
    behind.skew_clock_for_tests(chrono::Duration::hours(-13));
    let tz: Tz = "Asia/Kathmandu".parse().unwrap();
    let a = ahead.admit(&req("a", "henry", tz)).await.unwrap();
    let b = behind.admit(&req("b", "henry", tz)).await.unwrap();
    let t = admitted(&a).admitted_at;
    // the second worker is refused until the recipient's next midnight by Redis time
    assert_eq!(retry_at(&b), window::next_day_start(tz, t));
}

#[tokio::test]
async fn idle_recipients_expire_and_three_sends_fit_in_150_bytes() {
    let ns = unique("mem");
    let _g = RedisGuard(ns.clone());
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules = vec![RuleSettings {
        limit: 3,
        window: "7d".parse().unwrap(),
    }];
    s.redis.key_prefix = "q".into();
    let e = engine(&s).await;
    // a recipient that exists only in this test run
    let who = format!("{ns}@example.com");
    for i in 0..3 {
        let id = uuid::Uuid::now_v7().to_string();
        let _ = i;
        e.commit(admitted(&e.admit(&req(&id, &who, Tz::UTC)).await.unwrap()))
            .await
            .unwrap();
    }
    let key = e.keys().recipient(&who, "default", None);
    let mut c = testkit::redis_sync();
    let bytes: i64 = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(&key)
        .query(&mut c)
        .unwrap();
    let pttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut c).unwrap();
    let _: () = redis::cmd("DEL").arg(&key).query(&mut c).unwrap();
    println!("MEMORY USAGE of a recipient with 3 sends: {bytes} bytes (key {key})");
    assert!(bytes <= 150, "{bytes} bytes");
    assert!(pttl > 0 && pttl <= 8 * 86_400_000, "pttl {pttl}");
}

/// Admissions waiting at the same moment share one script call, and each is decided
/// as if it had come alone: a burst of 300 jobs, half of them second jobs of the
/// same recipients, admits exactly one per recipient in far fewer calls than jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_is_decided_in_batches_with_each_job_seeing_the_ones_before() {
    let ns = unique("batch");
    let _g = RedisGuard(ns.clone());
    let s = settings(&ns);
    let e = Arc::new(engine(&s).await);
    let before = e.calls();
    let outcomes = burst(&e, 300, |i| {
        (
            format!("job-{i}"),
            format!("who-{}", i % 150),
            Tz::UTC,
            "default",
        )
    })
    .await;
    let mut admitted_per = std::collections::HashMap::<usize, usize>::new();
    let mut refused = 0;
    for (i, outcome) in outcomes.into_iter().enumerate() {
        match outcome.unwrap() {
            Admission::Admitted(_) => *admitted_per.entry(i % 150).or_default() += 1,
            Admission::Refused { .. } => refused += 1,
            other => panic!("job {i}: {other:?}"),
        }
    }
    assert_eq!(admitted_per.len(), 150, "every recipient got one");
    assert!(admitted_per.values().all(|&n| n == 1), "{admitted_per:?}");
    assert_eq!(refused, 150);
    let calls = e.calls() - before;
    assert!(calls < 300, "{calls} calls for 300 admissions: not batched");
}

/// One call carries each distinct plan (policy, time zone, local day) once and every
/// job names its own: a burst mixing five zones and two policies decides each job
/// by its own zone's day. Every recipient has a send from 13 hours ago, which is
/// today in some zones and yesterday in others; the pure calendar code says which.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_mixing_zones_and_policies_decides_each_job_by_its_own_plan() {
    let ns = unique("plans");
    let _g = RedisGuard(ns.clone());
    let s = settings(&ns);
    let e = Arc::new(engine(&s).await);
    let zones = [
        Tz::UTC,
        Tz::Pacific__Kiritimati,
        Tz::Pacific__Pago_Pago,
        Tz::Asia__Kolkata,
        Tz::America__St_Johns,
    ];
    let earlier = chrono::Utc::now() - chrono::Duration::hours(13);
    let mut c = testkit::redis_sync();
    for i in 0..100 {
        let key = e.keys().recipient(&format!("who-{i}"), "default", None);
        let score = earlier.timestamp_millis() * 2 + 1;
        let _: () = redis::pipe()
            .zadd(&key, "earlier", score)
            .pexpire(&key, 86_400_000)
            .query(&mut c)
            .unwrap();
    }
    let calls_before = e.calls();
    let before = chrono::Utc::now();
    // two jobs per recipient; odd recipients' jobs are transactional (no caps)
    let outcomes: Vec<Admission> = burst(&e, 200, |j| {
        let i = j % 100;
        let category = if i % 2 == 1 {
            "transactional"
        } else {
            "default"
        };
        (
            format!("job-{j}"),
            format!("who-{i}"),
            zones[i % zones.len()],
            category,
        )
    })
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    let after = chrono::Utc::now();
    // per recipient, how many of its two jobs were admitted: both if transactional,
    // else one if the earlier send was yesterday in its zone and none if today
    let rules = &e.policy("default").rules;
    let mut checked = 0;
    for i in 0..100 {
        let tz = zones[i % zones.len()];
        let got = [i, i + 100]
            .iter()
            .filter(|&&j| matches!(outcomes[j], Admission::Admitted(_)))
            .count();
        let expected = if i % 2 == 1 {
            2
        } else {
            let admits = window::admits(rules, tz, before, &[earlier]);
            if admits != window::admits(rules, tz, after, &[earlier]) {
                continue; // a local midnight passed during the burst
            }
            usize::from(admits)
        };
        assert_eq!(
            got,
            expected,
            "recipient {i} in {tz}: {:?}",
            [&outcomes[i], &outcomes[i + 100]]
        );
        checked += 1;
    }
    assert!(checked >= 90, "{checked}");
    let calls = e.calls() - calls_before;
    assert!(calls < 200, "{calls} calls for 200 admissions: not batched");
    let zones_admitting = zones
        .iter()
        .filter(|tz| window::admits(rules, **tz, before, &[earlier]))
        .count();
    assert!(
        zones_admitting > 0 && zones_admitting < zones.len(),
        "the earlier send should be today in some zones only ({zones_admitting})"
    );
}

/// A recipient key that holds another type fails that job alone; the jobs batched
/// with it are decided normally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_key_fails_its_own_job_only() {
    let ns = unique("badkey");
    let _g = RedisGuard(ns.clone());
    let s = settings(&ns);
    let e = Arc::new(engine(&s).await);
    let bad = e.keys().recipient("broken", "default", None);
    let _: () = redis::cmd("SET")
        .arg(&bad)
        .arg("not a sorted set")
        .query(&mut testkit::redis_sync())
        .unwrap();
    for round in 0..5 {
        let outcomes = burst(&e, 40, |i| {
            let who = if i == 20 {
                "broken".to_string()
            } else {
                format!("ok-{round}-{i}")
            };
            (format!("r{round}-{i}"), who, Tz::UTC, "default")
        })
        .await;
        for (i, result) in outcomes.into_iter().enumerate() {
            if i == 20 {
                let err = result.expect_err("the broken key's job fails");
                assert!(err.to_string().contains("admit.lua"), "{err}");
            } else {
                admitted(&result.unwrap());
            }
        }
    }
}
