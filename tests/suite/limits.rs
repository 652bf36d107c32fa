//! Limits (`[limits.NAME]`), end to end through Redis (the admission's own Redis
//! time) and RabbitMQ: a sender held at 1/s while another goes at 100/s, two limits
//! stacked on one bucket never exceeded in any window, a job's cost taken, a
//! refused job taking nothing from its caps, and bad configurations named by key.

use std::time::Duration;

use chrono::{DateTime, Datelike, Utc};
use chrono_tz::Tz;
use quota_worker::admission::{Admission, Request};
use quota_worker::config::{
    CapSettings, Dur, LimitSettings, MatchSettings, RuleSettings, Settings,
};
use quota_worker::job::{Outcome, Reason};
use quota_worker::quota::limits::Per;
use quota_worker::store::QuotaStore;
use testkit::*;

fn limit(rate: u64, period_s: u64, burst: u64, per: Per) -> LimitSettings {
    LimitSettings {
        rate,
        period: Some(Dur(Duration::from_secs(period_s))),
        burst: Some(burst),
        matches: MatchSettings::default(),
        per,
        warmup: None,
    }
}

/// Test settings whose `default` policy holds nothing: only the limits do.
fn limited(ns: &str, limits: &[(&str, LimitSettings)]) -> Settings {
    let mut s = settings(ns);
    s.policies.get_mut("default").unwrap().rules = vec![];
    for (name, l) in limits {
        s.limits.insert(name.to_string(), l.clone());
    }
    s
}

fn req<'a>(id: &'a str, recipient: &'a str, sender: &'a str, cost: Option<u64>) -> Request<'a> {
    Request {
        id,
        recipient,
        channel: "sms",
        category: "default",
        tz: Tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: Some(sender),
        cost,
    }
}

/// Admit `r`, waiting out every limit refusal until it is admitted: its
/// admission's Redis time, and every instant a refusal named (each one at or
/// before the admission).
async fn admit_when_allowed(
    e: &QuotaStore,
    r: &Request<'_>,
) -> (DateTime<Utc>, Vec<DateTime<Utc>>) {
    let mut named = Vec::new();
    loop {
        match e.admit(r).await.unwrap() {
            Admission::Admitted(t) => return (t.admitted_at, named),
            Admission::Limited {
                retry_at: Some(at), ..
            } => {
                named.push(at);
                let ahead = (at - Utc::now()).to_std().unwrap_or_default();
                tokio::time::sleep(ahead + Duration::from_millis(2)).await;
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Whether admissions at `times` (in order) each of cost `cost` keep to a GCRA of
/// `interval_ms` and `burst`: any n of them span at least (n·cost − burst)
/// intervals, so no window holds more than its burst and rate allow.
fn within(times: &[DateTime<Utc>], cost: i64, interval_ms: i64, burst: i64) -> bool {
    (0..times.len()).all(|i| {
        (i..times.len()).all(|j| {
            let n = (j - i + 1) as i64;
            let span = (times[j] - times[i]).num_milliseconds();
            // Redis time is read in µs and admissions are seen in ms: 1 ms of slack
            span + 1 >= (n * cost - burst) * interval_ms
        })
    })
}

#[tokio::test]
async fn a_slow_sender_waits_its_second_while_a_fast_one_goes_on() {
    let ns = unique("limits-senders");
    let _g = RedisGuard(ns.clone());
    // long codes send one a second each, short codes a hundred (by tenant here)
    let mut slow = limit(1, 1, 1, Per::Sender);
    slow.matches.tenants = Some(vec!["longcodes".into()]);
    let mut fast = limit(100, 1, 100, Per::Sender);
    fast.matches.tenants = Some(vec!["shortcodes".into()]);
    let s = limited(&ns, &[("long_code", slow), ("short_code", fast)]);
    let e = QuotaStore::connect(&s).await.unwrap();
    let mut slow_times: Vec<DateTime<Utc>> = Vec::new();
    for i in 0..4 {
        let id = format!("slow{i}");
        let recipient = format!("r{i}");
        let slow = Request {
            tenant: Some("longcodes"),
            ..req(&id, &recipient, "+15550100", None)
        };
        let (at, named) = admit_when_allowed(&e, &slow).await;
        // every instant a refusal named is exactly a second after the one before
        if let (Some(last), Some(first)) = (slow_times.last(), named.first()) {
            let gap = (*first - *last).num_milliseconds();
            assert!((1000..=1001).contains(&gap), "named {gap} ms after");
            assert!(at >= *first);
        }
        slow_times.push(at);
        // meanwhile another sender is never held by the slow one's bucket
        for k in 0..3 {
            let id = format!("fast{i}-{k}");
            let fast = Request {
                tenant: Some("shortcodes"),
                ..req(&id, "f", "55501", None)
            };
            let a = e.admit(&fast).await.unwrap();
            assert!(matches!(a, Admission::Admitted(_)), "{a:?}");
        }
    }
    assert!(within(&slow_times, 1, 1000, 1), "{slow_times:?}");
}

#[tokio::test]
async fn two_limits_stacked_on_one_sender_are_never_exceeded_in_any_window() {
    let ns = unique("limits-stacked");
    let _g = RedisGuard(ns.clone());
    let s = limited(
        &ns,
        &[
            ("per_second", limit(2, 1, 1, Per::Sender)),
            ("per_ten_seconds", limit(5, 10, 3, Per::Sender)),
        ],
    );
    let e = QuotaStore::connect(&s).await.unwrap();
    let mut times = Vec::new();
    let mut refusals = 0;
    for i in 0..6 {
        let id = format!("j{i}");
        let (at, named) = admit_when_allowed(&e, &req(&id, &format!("r{i}"), "acct", None)).await;
        refusals += named.len();
        times.push(at);
    }
    assert!(within(&times, 1, 500, 1), "2/s exceeded: {times:?}");
    assert!(within(&times, 1, 2000, 3), "5 per 10 s exceeded: {times:?}");
    // the second limit held some of them past what the first alone allows
    let span = (times[5] - times[0]).num_milliseconds();
    assert!(span + 1 >= 3 * 2000, "{span} ms: {times:?}");
    assert!(refusals >= 3);
}

#[tokio::test]
async fn a_jobs_cost_is_taken_and_a_refused_job_takes_nothing_from_its_caps() {
    let ns = unique("limits-cost");
    let _g = RedisGuard(ns.clone());
    let mut s = limited(&ns, &[("segments", limit(1, 1, 3, Per::Sender))]);
    s.caps.insert(
        "total".into(),
        CapSettings {
            rules: vec![RuleSettings {
                limit: 10,
                window: "1d".parse().unwrap(),
            }],
            ..CapSettings::default()
        },
    );
    let e = QuotaStore::connect(&s).await.unwrap();
    let Admission::Admitted(first) = e.admit(&req("a", "r", "x", Some(3))).await.unwrap() else {
        panic!("a cost of 3 passes a full burst of 3")
    };
    let Admission::Limited {
        retry_at: Some(at),
        limit,
        ..
    } = e.admit(&req("b", "r", "x", Some(1))).await.unwrap()
    else {
        panic!("the burst is spent")
    };
    assert_eq!(
        limit,
        "limit `segments` (1 per second, burst 3, per sender)"
    );
    // three units taken: one more fits a second later (µs read as ms: ≤ 1 ms)
    let gap = (at - first.admitted_at).num_milliseconds();
    assert!((1000..=1001).contains(&gap), "{gap}");
    // the refused job recorded nothing in its cap or its policy's key
    let keys = s.redis.keys();
    let mut r = redis_sync();
    let cap: usize = redis::cmd("ZCARD")
        .arg(keys.cap("r", "total", None))
        .query(&mut r)
        .unwrap();
    assert_eq!(cap, 1);
    // a cost above the burst is never admitted
    let never = e.admit(&req("c", "r2", "y", Some(4))).await.unwrap();
    assert!(
        matches!(never, Admission::Limited { retry_at: None, .. }),
        "{never:?}"
    );
    // the bucket expires once it is full again: at the end of the second after
    // the one its TAT (3 s ahead) is in
    let ttl: i64 = redis::cmd("PTTL")
        .arg(keys.limit("segments", ("s", "x")))
        .query(&mut r)
        .unwrap();
    assert!((3000..=5000).contains(&ttl), "{ttl}");
}

/// A take whose TAT stays in the second of the one read keeps the key's expiry
/// (its TAT moved in place); one that crosses into a later second sets it anew;
/// and a value the in-place move cannot read (no script writes one) is set whole.
#[tokio::test]
async fn a_bucket_keeps_its_expiry_within_a_second_and_is_set_whole_when_it_must() {
    let ns = unique("limits-expiry");
    let _g = RedisGuard(ns.clone());
    // 1,000 a second, burst 2,000: a take adds 1 ms, and passes up to 2 s ahead
    let s = limited(&ns, &[("per_sender", limit(1000, 1, 2000, Per::Sender))]);
    let e = QuotaStore::connect(&s).await.unwrap();
    let key = s.redis.keys().limit("per_sender", ("s", "x"));
    let mut r = redis_sync();
    let now_us = |r: &mut redis::Connection| {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query(r).unwrap();
        secs * 1_000_000 + micros
    };
    let expiry = |tat_us: i64| (tat_us / 1_000_000 + 2) * 1000;
    // a TAT up to 1 s ahead, in the middle of its second, its key expiring a
    // minute later than the rule's (`expiry`): a take in the same second moves the
    // TAT and keeps that expiry
    let ahead = (now_us(&mut r) + 500_000) / 1_000_000 * 1_000_000 + 500_000;
    let far = expiry(ahead) + 60_000;
    // the bucket holding `value`, its key expiring at `far`; then one take
    let take_after = |value: String, id: &'static str, recipient: &'static str| {
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .arg("PXAT")
            .arg(far)
            .query(&mut redis_sync())
            .unwrap();
        let e = &e;
        async move { e.admit(&req(id, recipient, "x", None)).await.unwrap() }
    };
    let admitted = take_after(ahead.to_string(), "a", "r1").await;
    assert!(matches!(admitted, Admission::Admitted(_)), "{admitted:?}");
    assert_eq!(
        number_at(&key),
        Some(ahead + 1_000),
        "the TAT moved by one take"
    );
    let at: i64 = redis::cmd("PEXPIRETIME").arg(&key).query(&mut r).unwrap();
    assert_eq!(at, far, "the expiry kept");
    // the same value with a leading zero: read as the same TAT, but not an
    // integer INCRBY takes, so set whole, with the rule's expiry
    let admitted = take_after(format!("0{ahead}"), "b", "r2").await;
    assert!(matches!(admitted, Admission::Admitted(_)), "{admitted:?}");
    let raw: String = redis::cmd("GET").arg(&key).query(&mut r).unwrap();
    assert_eq!(raw, (ahead + 1_000).to_string());
    let at: i64 = redis::cmd("PEXPIRETIME").arg(&key).query(&mut r).unwrap();
    assert_eq!(at, expiry(ahead + 1_000), "set anew by the rule");
}

/// The number the Redis key `key` holds (a TAT), if any.
fn number_at(key: &str) -> Option<i64> {
    let raw: Option<String> = redis::cmd("GET").arg(key).query(&mut redis_sync()).unwrap();
    raw.map(|v| v.split(':').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn a_released_job_gives_back_its_limits_and_its_own_cost_of_the_channels_rate() {
    let ns = unique("limits-release");
    let _g = RedisGuard(ns.clone());
    let mut s = limited(&ns, &[("per_sender", limit(1, 60, 3, Per::Sender))]);
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(1);
    sms.period = Some(Dur(Duration::from_secs(60)));
    sms.burst = Some(3);
    let e = QuotaStore::connect(&s).await.unwrap();
    let keys = s.redis.keys();
    let admit = |id: &'static str, cost: u64| {
        let e = &e;
        async move {
            let r = req(id, id, "x", Some(cost));
            // a take of the channel's rate that was not given back would make
            // this wait a minute: that is a failure here
            tokio::time::timeout(Duration::from_secs(20), e.admit(&r))
                .await
                .expect("the buckets were given back")
                .unwrap()
        }
    };
    let Admission::Admitted(first) = admit("a", 3).await else {
        panic!("a cost of 3 passes full buckets of 3")
    };
    // the channel's rate took the job's cost (3 minutes' worth), not the
    // channel's cost of 1
    let tat_ms = number_at(&keys.rate("sms")).unwrap() / 1000;
    let ahead = tat_ms - first.admitted_at.timestamp_millis();
    assert!((179_000..=181_000).contains(&ahead), "{ahead} ms");
    assert!(
        matches!(
            admit("b", 1).await,
            Admission::Limited {
                retry_at: Some(_),
                ..
            }
        ),
        "the limit is spent"
    );
    // released (its dispatch failed): what it took is back in both buckets
    e.release(&first).await.unwrap();
    assert_eq!(number_at(&keys.limit("per_sender", ("s", "x"))), None);
    assert_eq!(number_at(&keys.rate("sms")), None);
    let again = admit("c", 3).await;
    assert!(matches!(again, Admission::Admitted(_)), "{again:?}");
    // a cost the channel's rate never passes is refused for good, naming it
    let never = admit("d", 4).await;
    let Admission::Limited {
        retry_at: None,
        limit,
        ..
    } = never
    else {
        panic!("{never:?}")
    };
    assert!(limit.contains("channel `sms`"), "{limit}");
}

fn job(id: &str, sender: &str, extra: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"r-{id}","channel":"sms","sender":"{sender}"{extra}}}"#)
        .into_bytes()
}

#[tokio::test]
async fn through_the_worker_a_held_job_waits_for_its_limit_and_names_it() {
    let ns = unique("limits-worker");
    let s = limited(&ns, &[("per_sender", limit(1, 60, 1, Per::Sender))]);
    let (_c, w, conn) = rig(&s).await;
    publish(&conn, &s, &job("s1", "slow", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    let keys = s.redis.keys();
    let tat: String = redis::cmd("GET")
        .arg(keys.limit("per_sender", ("s", "slow")))
        .query(&mut redis_sync())
        .unwrap();
    let tat_us: i64 = tat.parse().unwrap();
    publish(&conn, &s, &job("s2", "slow", "")).await;
    let until = DateTime::from_timestamp_millis((tat_us + 999) / 1000).unwrap();
    assert_eq!(step(&w, &conn, &s).await, Outcome::Delayed { until });
    publish(&conn, &s, &job("f1", "fast", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    for (extra, field) in [
        (r#","cost":0"#, "cost"),
        (r#","cost":101"#, "cost"),
        (r#","cost":"2""#, "cost"),
    ] {
        publish(&conn, &s, &job("bad", "x", extra)).await;
        assert_eq!(
            step(&w, &conn, &s).await,
            Outcome::Dead(Reason::Malformed),
            "{field}"
        );
    }
    let long = "s".repeat(129);
    publish(&conn, &s, &job("bad", &long, "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::Malformed));
}

/// A configuration file with `body`: the error, as text.
fn load_error(body: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.toml", unique("limits-config")));
    std::fs::write(&path, body).unwrap();
    let err = Settings::load(Some(&path)).unwrap_err().to_string();
    let _ = std::fs::remove_file(&path);
    err
}

#[test]
fn a_bad_limit_names_its_key() {
    let err = load_error("[limits.twilio]\nrate = 0\n");
    assert!(err.contains("`limits.twilio.rate`"), "{err}");
    let err = load_error("[limits.twilio]\nrate = 1\nper = \"recipient\"\n");
    assert!(err.contains("limits.twilio.per"), "{err}");
    let err = load_error("[channels.sms]\ncost = 2\n\n[limits.twilio]\nrate = 1\nburst = 1\n");
    assert!(err.contains("`limits.twilio.burst`"), "{err}");
    assert!(err.contains("never admit"), "{err}");
    let err = load_error("[limits.twilio]\nrate = 1\nmatch = { channels = [\"fax\"] }\n");
    assert!(err.contains("`limits.twilio.match.channels`"), "{err}");
    let err = load_error(
        "[redis]\ncluster = true\ncluster_urls = [\"redis://127.0.0.1:7000\"]\n\n[limits.twilio]\nrate = 1\n",
    );
    assert!(
        err.contains("`limits.twilio`") && err.contains("Cluster"),
        "{err}"
    );
}

/// A job of `tenant` from `sender` on `sms`, in the normal lane.
fn sent_by(id: &str, tenant: &str, sender: &str) -> String {
    format!(
        r#"{{"id":"{id}","recipient":"{id}","channel":"sms","tenant":"{tenant}","sender":"{sender}"}}"#
    )
}

/// Two senders on one lane of a paced channel, one held at 1/s and one at 100/s:
/// a held job of the slow one waits on its own (the delay ladder, to the instant
/// its limit allows), and the fast one's jobs behind it in the lane go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sender_held_by_its_limit_never_holds_another_in_its_lane() {
    let ns = unique("limits-lane");
    let mut s = crate::lanes::laned(&ns, 100);
    s.policies.get_mut("default").unwrap().rules = vec![];
    let mut slow = limit(1, 1, 1, Per::Sender);
    slow.matches.tenants = Some(vec!["longcodes".into()]);
    let mut fast = limit(100, 1, 100, Per::Sender);
    fast.matches.tenants = Some(vec!["shortcodes".into()]);
    s.limits.insert("long_code".into(), slow);
    s.limits.insert("short_code".into(), fast);
    let _c = Cleanup::new(&s);
    let running = spawn_worker(worker(&s).await).await;
    let conn = amqp().await;
    let mut out = crate::lanes::Dispatched::open(&conn, &s).await;
    // the slow sender's jobs each followed by 20 of the fast one's, in one lane
    const SLOW: usize = 4;
    const PER_SLOW: usize = 20;
    let mut bodies = Vec::new();
    for k in 0..SLOW {
        bodies.push(sent_by(&format!("slow-{k}"), "longcodes", "+15550100"));
        for i in 0..PER_SLOW {
            let id = format!("fast-{}", k * PER_SLOW + i);
            bodies.push(sent_by(&id, "shortcodes", "55501"));
        }
    }
    crate::lanes::publish_all(&conn, &s, &bodies).await;
    let total = bodies.len();
    out.read_until(Duration::from_secs(60), |ids| ids.len() >= total)
        .await;
    running.0.cancel();
    running.1.await.unwrap();
    assert_eq!(out.ids.len(), total, "every job is dispatched once");
    let at = |id: &str| {
        let p = out
            .position(id)
            .unwrap_or_else(|| panic!("{id} never dispatched"));
        (p, out.ids[p].1)
    };
    // the slow sender's jobs a second apart at least (its limit; the reader's
    // arrival times jitter by far less than the 100 ms allowed here)
    // (in the order they went: the held ones come back from the delay ladder
    // together and are admitted one a second, in any order)
    let mut slow: Vec<_> = (0..SLOW).map(|k| at(&format!("slow-{k}"))).collect();
    slow.sort();
    for w in slow.windows(2) {
        let gap = w[1].1.duration_since(w[0].1);
        assert!(
            gap >= Duration::from_millis(900),
            "{gap:?} between slow jobs"
        );
    }
    // none of the fast sender's jobs held behind a slow one: every one of them
    // out before the slow sender's last job, which its limit holds (SLOW - 1)
    // seconds after its first (the fast ones need SLOW * PER_SLOW / 100 s of the
    // channel's rate)
    let fast: Vec<usize> = (0..SLOW * PER_SLOW)
        .map(|i| at(&format!("fast-{i}")).0)
        .collect();
    let last_slow = slow.last().unwrap().0;
    assert!(
        fast.iter().all(|p| *p < last_slow),
        "a fast job went out after the slow sender's last: {:?}",
        out.ids
    );
}

/// A `throttled` feedback naming a sender (or a limit) pauses only that bucket:
/// its sender's next job waits for the pause, another sender's goes at once, and
/// the channel's own rate is untouched; naming a limit counted for all pauses it
/// for every sender.
#[tokio::test]
async fn a_throttle_naming_a_sender_pauses_that_sender_only() {
    use quota_worker::feedback::apply::{self, Applied, Tuning};
    use quota_worker_producer::{Event, Feedback};
    let ns = unique("limits-throttle");
    let _g = RedisGuard(ns.clone());
    let mut s = limited(
        &ns,
        &[
            ("per_sender", limit(100, 1, 10, Per::Sender)),
            ("account", limit(1000, 1, 100, Per::All)),
        ],
    );
    s.channels.get_mut("sms").unwrap().rate = Some(1000);
    let e = QuotaStore::connect(&s).await.unwrap();
    let tuning = Tuning::from_settings(&s);
    let throttled = |id: &str, sender: Option<&str>, limit: Option<&str>| Feedback {
        retry_after: Some(3.0),
        sender: sender.map(str::to_string),
        limit: limit.map(str::to_string),
        ..Feedback::new(id, Event::Throttled, "r", "sms")
    };
    let f = throttled("t1", Some("slow"), None);
    let Applied::First { now_ms, at_ms } = apply::apply(&e, &tuning, &f).await.unwrap() else {
        panic!("applied once")
    };
    assert!(
        (2_990..=3_010).contains(&(at_ms - now_ms)),
        "{at_ms} {now_ms}"
    );
    assert_eq!(apply::apply(&e, &tuning, &f).await.unwrap(), Applied::Again);
    // the throttled sender waits for the pause's end; another goes at once
    let held = e.admit(&req("a", "r1", "slow", None)).await.unwrap();
    let Admission::Limited {
        retry_at: Some(until),
        limit,
        ..
    } = held
    else {
        panic!("{held:?}")
    };
    assert!(limit.contains("per_sender"), "{limit}");
    assert!(until.timestamp_millis() >= at_ms, "{until} before {at_ms}");
    let other = e.admit(&req("b", "r2", "fast", None)).await.unwrap();
    assert!(matches!(other, Admission::Admitted(_)), "{other:?}");
    // the channel's rate was not paused
    let keys = s.redis.keys();
    let rate = number_at(&keys.rate("sms")).unwrap_or(0);
    assert!(rate / 1000 < at_ms - 2_000, "the channel's rate was pushed");
    // a limit named: its one bucket (per all) pauses, for every sender
    let f = throttled("t2", None, Some("account"));
    assert!(matches!(
        apply::apply(&e, &tuning, &f).await.unwrap(),
        Applied::First { .. }
    ));
    let held = e.admit(&req("c", "r3", "fast", None)).await.unwrap();
    assert!(
        matches!(&held, Admission::Limited { limit, .. } if limit.contains("account")),
        "{held:?}"
    );
    // without a ramp the pause leaves a plain TAT, its key expiring by the rule
    // the admission keeps to (the end of the second after the TAT's): a take in
    // that second keeps the expiry it finds
    let tuning = Tuning {
        ramp: std::time::Duration::ZERO,
        ..tuning
    };
    let f = throttled("t3", Some("plain"), None);
    assert!(matches!(
        apply::apply(&e, &tuning, &f).await.unwrap(),
        Applied::First { .. }
    ));
    let key = keys.limit("per_sender", ("s", "plain"));
    let raw: String = redis::cmd("GET")
        .arg(&key)
        .query(&mut redis_sync())
        .unwrap();
    let tat: i64 = raw.parse().expect("a plain TAT");
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query(&mut redis_sync())
        .unwrap();
    assert_eq!(at, (tat / 1_000_000 + 2) * 1000, "{raw}");
}

/// A quota (a cap with `scope = "tenant"`): `limit` jobs per calendar `window`.
fn quota(limit: u32, window: &str, scope: quota_worker::config::CapScope) -> CapSettings {
    CapSettings {
        rules: vec![RuleSettings {
            limit,
            window: window.parse().unwrap(),
        }],
        scope,
        ..CapSettings::default()
    }
}

/// A tenant's monthly quota counts its jobs across recipients in its own zone,
/// in one counter per month that expires with it; a refused job waits for the
/// next month (or is dead `quota_exceeded` when its policy drops), a released
/// one is given back, and a job a limit refuses in the same call takes nothing
/// from the quota.
#[tokio::test]
async fn a_tenants_monthly_quota_counts_across_recipients_until_its_next_month() {
    use quota_worker::config::{CapScope, TenantSettings};
    let ns = unique("limits-quota");
    let _g = RedisGuard(ns.clone());
    let mut s = limited(&ns, &[("per_sender", limit(1, 60, 1, Per::Sender))]);
    s.caps
        .insert("plan".into(), quota(2, "1mo", CapScope::Tenant));
    let zone: Tz = "Pacific/Auckland".parse().unwrap();
    let acme = TenantSettings {
        timezone: Some(zone.name().to_string()),
        ..TenantSettings::default()
    };
    s.tenants.insert("acme".into(), acme);
    let e = QuotaStore::connect(&s).await.unwrap();
    let of = |id: &'static str, tenant: &'static str, sender: &'static str| Request {
        tenant: Some(tenant),
        ..req(id, id, sender, None)
    };
    let Admission::Admitted(first) = e.admit(&of("a1", "acme", "s1")).await.unwrap() else {
        panic!("the first of the month")
    };
    // a second job of the same sender: its limit refuses it, and the quota
    // counts nothing for it
    let held = e.admit(&of("a2", "acme", "s1")).await.unwrap();
    assert!(
        matches!(&held, Admission::Limited { quota: false, .. }),
        "{held:?}"
    );
    let a3 = e.admit(&of("a3", "acme", "s2")).await.unwrap();
    assert!(matches!(a3, Admission::Admitted(_)), "{a3:?}");
    // the quota is used up (2 this month), whoever the recipient and sender
    let over = e.admit(&of("a4", "acme", "s3")).await.unwrap();
    let Admission::Limited {
        retry_at: Some(until),
        limit,
        quota: true,
    } = over
    else {
        panic!("{over:?}")
    };
    assert_eq!(limit, "quota `plan` (2 per 1mo, per tenant)");
    // the next month starts at midnight on its first day in the tenant's zone
    let today = quota_worker::quota::window::local_date(zone, first.admitted_at);
    let next = chrono::NaiveDate::from_ymd_opt(
        today.year() + i32::from(today.month() == 12),
        today.month() % 12 + 1,
        1,
    )
    .unwrap();
    assert_eq!(until, quota_worker::quota::window::day_start(zone, next));
    // another tenant has its own counter
    let other = e.admit(&of("b1", "other", "s4")).await.unwrap();
    assert!(matches!(other, Admission::Admitted(_)), "{other:?}");
    // one counter (a number, not a set of sends) that expires with its month
    let mut r = redis_sync();
    let pattern = format!("{}:quota:plan:1mo:t:*", s.redis.key_prefix);
    let keys: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut r).unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    // (acme's ends at its month's end in Auckland; the other's in UTC, 13 h later)
    let to_end = (until - Utc::now()).num_milliseconds();
    let mut ttls = Vec::new();
    for key in &keys {
        let kind: String = redis::cmd("TYPE").arg(key).query(&mut r).unwrap();
        assert_eq!(kind, "string");
        let left: i64 = redis::cmd("PTTL").arg(key).query(&mut r).unwrap();
        assert!(
            left > 0 && left < to_end + 14 * 3_600_000,
            "{left} {to_end}"
        );
        ttls.push(left);
    }
    assert!(
        ttls.iter().any(|left| (left - to_end).abs() < 5_000),
        "{ttls:?} {to_end}"
    );
    // released (its dispatch failed): the month has one more
    e.release(&first).await.unwrap();
    let again = e.admit(&of("a5", "acme", "s5")).await.unwrap();
    assert!(matches!(again, Admission::Admitted(_)), "{again:?}");
}

/// Jobs asking at once go to Redis together (one call decides many, each bucket
/// read and written once): they take from their shared buckets exactly as one by
/// one. Sixty jobs of three senders against 5 a sender and 12 in all: exactly 12
/// pass, none of a sender past 5, each bucket's TAT is its first take's instant
/// plus what was taken; a tenant's daily quota of 7 passes exactly 7 of thirty;
/// every take released, each bucket and counter is as if none had been.
#[tokio::test]
async fn jobs_asking_at_once_share_their_buckets_exactly() {
    use futures_util::future::join_all;
    use quota_worker::config::CapScope;
    let ns = unique("limits-at-once");
    let _g = RedisGuard(ns.clone());
    let mut s = limited(
        &ns,
        &[
            ("per_sender", limit(1, 60, 5, Per::Sender)),
            ("all", limit(1, 60, 12, Per::All)),
        ],
    );
    s.caps
        .insert("daily".into(), quota(7, "1d", CapScope::Tenant));
    let e = std::sync::Arc::new(QuotaStore::connect(&s).await.unwrap());
    let at_once = |n: usize, tag: &'static str, tenant: Option<&'static str>| {
        let e = e.clone();
        join_all((0..n).map(move |i| {
            let e = e.clone();
            async move {
                let (id, sender) = (format!("{tag}{i}"), format!("s{}", i % 3));
                let r = Request {
                    tenant,
                    ..req(&id, &id, &sender, None)
                };
                (sender.clone(), e.admit(&r).await.unwrap())
            }
        }))
    };
    let answers = at_once(60, "a", None).await;
    let mut admitted = Vec::new();
    for (sender, a) in answers {
        match a {
            Admission::Admitted(t) => admitted.push((sender, t)),
            Admission::Limited {
                retry_at: Some(_), ..
            } => {}
            a => panic!("{a:?}"),
        }
    }
    assert_eq!(admitted.len(), 12, "the `all` bucket's burst, exactly");
    let keys = s.redis.keys();
    let first_us = |of: &dyn Fn(&str) -> bool| {
        let times = admitted.iter().filter(|(x, _)| of(x));
        times
            .map(|(_, t)| t.admitted_at.timestamp_millis() * 1000)
            .min()
    };
    let all = keys.limit("all", ("", ""));
    let tat = number_at(&all).unwrap() - first_us(&|_| true).unwrap();
    assert!((0..1000).contains(&(tat - 12 * 60_000_000)), "{tat}");
    for sender in ["s0", "s1", "s2"] {
        let n = admitted.iter().filter(|(x, _)| x == sender).count() as i64;
        assert!(n <= 5, "{sender}: {n}");
        let Some(first) = first_us(&|x| x == sender) else {
            continue;
        };
        let tat = number_at(&keys.limit("per_sender", ("s", sender))).unwrap() - first;
        assert!(
            (0..1000).contains(&(tat - n * 60_000_000)),
            "{sender}: {tat}"
        );
    }
    for (_, t) in &admitted {
        e.release(t).await.unwrap();
    }
    assert_eq!(number_at(&all), None, "every take given back");

    // a quota's counter, thirty jobs of one tenant at once (distinct buckets of
    // the limits above are full again)
    let answers = at_once(30, "q", Some("acme")).await;
    let quota_held = |a: &Admission| matches!(a, Admission::Limited { quota: true, .. });
    let passed: Vec<_> = answers
        .iter()
        .filter_map(|(_, a)| match a {
            Admission::Admitted(t) => Some(t),
            _ => None,
        })
        .collect();
    assert_eq!(passed.len(), 7, "the quota's count, exactly");
    assert!(answers.iter().any(|(_, a)| quota_held(a)));
    let pattern = format!("{}:quota:daily:1d:t:*", s.redis.key_prefix);
    let mut r = redis_sync();
    let counters: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut r).unwrap();
    assert_eq!(counters.len(), 1, "{counters:?}");
    assert_eq!(number_at(&counters[0]), Some(7));
    for t in passed {
        e.release(t).await.unwrap();
    }
    assert!(matches!(number_at(&counters[0]), None | Some(0)));
}

/// When every bucket of a call holds what all its jobs would take, the jobs'
/// limits are not checked one by one (`src/admission/lua/limits.lua`, a `sure`
/// call): a job that does not take (found reserved by its own earlier
/// admission) takes nothing all the same, and the TAT each take left is worked
/// out exactly (every take released, the bucket is as if none had been).
#[tokio::test]
async fn a_call_whose_buckets_hold_all_its_jobs_takes_for_the_admitted_only() {
    use futures_util::future::join_all;
    let ns = unique("limits-sure");
    let _g = RedisGuard(ns.clone());
    let s = limited(&ns, &[("per_sender", limit(1, 60, 100, Per::Sender))]);
    let e = std::sync::Arc::new(QuotaStore::connect(&s).await.unwrap());
    let mut admitted = Vec::new();
    for i in 0..10 {
        let id = format!("d{i}");
        match e.admit(&req(&id, &id, "x", None)).await.unwrap() {
            Admission::Admitted(t) => admitted.push(t),
            a => panic!("{a:?}"),
        }
    }
    // the ten again (each reserved by its first admission) and twenty new ones
    let ids: Vec<String> = (0..10)
        .map(|i| format!("d{i}"))
        .chain((0..20).map(|i| format!("n{i}")))
        .collect();
    let answers = join_all(ids.iter().map(|id| {
        let e = e.clone();
        async move { (id.clone(), e.admit(&req(id, id, "x", None)).await.unwrap()) }
    }))
    .await;
    for (id, a) in answers {
        match a {
            Admission::Admitted(t) if id.starts_with('n') => admitted.push(t),
            Admission::Admitted(_) => panic!("{id} was admitted twice"),
            _ => assert!(id.starts_with('d'), "{id}: {a:?}"),
        }
    }
    assert_eq!(admitted.len(), 30);
    let key = s.redis.keys().limit("per_sender", ("s", "x"));
    let first = admitted[0].admitted_at.timestamp_millis() * 1000;
    let tat = number_at(&key).unwrap() - first;
    assert!((0..1000).contains(&(tat - 30 * 60_000_000)), "{tat}");
    for t in &admitted {
        e.release(t).await.unwrap();
    }
    assert_eq!(number_at(&key), None, "every take given back, exactly");
}

/// Through the worker: a sender's daily quota delays a refused job to its next
/// day, or dead-letters it `quota_exceeded` when its policy drops refused jobs.
#[tokio::test]
async fn through_the_worker_a_quota_delays_to_its_next_day_or_drops() {
    use quota_worker::config::CapScope;
    use quota_worker::quota::policy::Action;
    let ns = unique("limits-quota-worker");
    let mut s = limited(&ns, &[]);
    s.caps
        .insert("per_number".into(), quota(1, "1d", CapScope::Sender));
    let (_c, w, conn) = rig(&s).await;
    publish(&conn, &s, &job("q1", "n1", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    publish(&conn, &s, &job("q2", "n1", "")).await;
    let tz = s.worker.default_timezone;
    let next = quota_worker::quota::window::next_day_start(tz, Utc::now());
    assert_eq!(step(&w, &conn, &s).await, Outcome::Delayed { until: next });
    drop(w);
    s.policies.get_mut("default").unwrap().action = Action::Drop;
    let w = worker(&s).await;
    publish(&conn, &s, &job("q3", "n1", "")).await;
    assert_eq!(
        step(&w, &conn, &s).await,
        Outcome::Dead(Reason::QuotaExceeded)
    );
    // another sender has its own day
    publish(&conn, &s, &job("q4", "n2", "")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
}

#[test]
fn a_bad_quota_names_its_key() {
    let err =
        load_error("[caps.plan]\nscope = \"tenant\"\nrules = [{ limit = 5, window = \"7d\" }]\n");
    assert!(err.contains("`caps.plan.rules`"), "{err}");
    let err = load_error(
        "[caps.plan]\nscope = \"sender\"\nmode = \"shadow\"\nrules = [{ limit = 5, window = \"1mo\" }]\n",
    );
    assert!(err.contains("`caps.plan.mode`"), "{err}");
    let err = load_error("[tenants.acme]\ntimezone = \"Mars/Olympus\"\n");
    assert!(err.contains("`tenants.acme.timezone`"), "{err}");
    let err = load_error(
        "[redis]\ncluster = true\ncluster_urls = [\"redis://127.0.0.1:7000\"]\n\n[caps.plan]\nscope = \"tenant\"\nrules = [{ limit = 5, window = \"1mo\" }]\n",
    );
    assert!(err.contains("`caps.plan.scope`"), "{err}");
}

/// Every TOML example of the guide page "Limits and quotas" is a configuration the
/// worker accepts, and each names what it says.
#[test]
fn the_guides_examples_are_valid_configurations() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = std::fs::read_to_string(root.join("docs/guide/limits.md")).unwrap();
    let blocks: Vec<&str> = page
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert!(blocks.len() >= 4, "{} examples", blocks.len());
    for body in &blocks {
        let path = std::env::temp_dir().join(format!("{}.toml", unique("limits-guide")));
        std::fs::write(&path, body).unwrap();
        let loaded = Settings::load(Some(&path));
        let _ = std::fs::remove_file(&path);
        let s = loaded.unwrap_or_else(|e| panic!("{e}\n{body}"));
        assert!(!s.limits().is_empty(), "{body}");
    }
    let all = blocks.concat();
    for name in [
        "ses_per_day",
        "long_code",
        "short_code",
        "plan_rate",
        "plan_month",
    ] {
        assert!(all.contains(name), "{name}");
    }
}

/// `admin limits`: each limit and quota with its state, one sender's or tenant's
/// buckets on request, else how many are in use.
#[tokio::test]
async fn admin_limits_shows_each_limit_and_a_keys_state_on_request() {
    use quota_worker::admin::limits::{limits, LimitQuery};
    use quota_worker::config::CapScope;
    let ns = unique("limits-admin");
    let _g = RedisGuard(ns.clone());
    let mut s = limited(
        &ns,
        &[
            ("account", limit(10, 1, 10, Per::All)),
            ("per_sender", limit(1, 60, 3, Per::Sender)),
        ],
    );
    s.caps
        .insert("plan".into(), quota(100, "1d", CapScope::Tenant));
    let e = QuotaStore::connect(&s).await.unwrap();
    let r = Request {
        tenant: Some("acme"),
        ..req("a", "r", "+1555", Some(2))
    };
    assert!(matches!(e.admit(&r).await.unwrap(), Admission::Admitted(_)));
    let all = limits(&e, &LimitQuery::default()).await.unwrap();
    let names: Vec<(&str, &str)> = all
        .iter()
        .map(|l| (l.name.as_str(), l.kind.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("account", "limit"),
            ("per_sender", "limit"),
            ("plan", "quota")
        ]
    );
    // the one bucket of `account` took the job's cost of 2
    assert_eq!(all[0].available, Some(8));
    assert!(all[0].full_at.is_some());
    assert_eq!(all[1].in_use, Some(1));
    assert_eq!(all[2].in_use, Some(1));
    let q = LimitQuery {
        tenant: Some("acme".into()),
        sender: Some("+1555".into()),
    };
    let one = limits(&e, &q).await.unwrap();
    assert_eq!(one[1].bucket.as_deref(), Some("sender +1555"));
    assert_eq!((one[1].available, one[1].capacity), (Some(1), 3));
    assert_eq!(one[2].bucket.as_deref(), Some("tenant acme"));
    assert_eq!((one[2].available, one[2].capacity), (Some(99), 100));
    let other = LimitQuery {
        sender: Some("+1666".into()),
        ..LimitQuery::default()
    };
    let fresh = limits(&e, &other).await.unwrap();
    assert_eq!(fresh[1].available, Some(3));
    assert_eq!(fresh[1].full_at, None);
}

/// A warm-up schedule: each sender's bucket admits day i's count at most (the
/// first day's from its start), besides its rate; past the schedule's end the
/// limit's own rate alone.
#[tokio::test]
async fn a_warmup_holds_each_sender_to_its_days_count_until_it_ends() {
    use quota_worker::config::WarmupSettings;
    let ns = unique("limits-warmup");
    let _g = RedisGuard(ns.clone());
    let today = Utc::now().date_naive();
    let mut warming = limit(100, 1, 100, Per::Sender);
    warming.warmup = Some(WarmupSettings {
        start: today.to_string(),
        daily: vec![2, 5],
    });
    let mut warmed = limit(100, 1, 100, Per::Sender);
    warmed.matches.tenants = Some(vec!["old".into()]);
    warmed.warmup = Some(WarmupSettings {
        start: (today - chrono::Days::new(10)).to_string(),
        daily: vec![1],
    });
    warming.matches.tenants = Some(vec!["new".into()]);
    let s = limited(&ns, &[("new_ip", warming), ("old_ip", warmed)]);
    let e = QuotaStore::connect(&s).await.unwrap();
    let of = |id: &'static str, tenant: &'static str, sender: &'static str| Request {
        tenant: Some(tenant),
        ..req(id, id, sender, None)
    };
    for id in ["a1", "a2"] {
        let a = e.admit(&of(id, "new", "ip1")).await.unwrap();
        assert!(matches!(a, Admission::Admitted(_)), "{a:?}");
    }
    let held = e.admit(&of("a3", "new", "ip1")).await.unwrap();
    let Admission::Limited {
        retry_at: Some(until),
        limit,
        quota: false,
    } = held
    else {
        panic!("{held:?}")
    };
    assert!(limit.contains("new_ip"), "{limit}");
    let tz = s.worker.default_timezone;
    assert_eq!(
        until,
        quota_worker::quota::window::next_day_start(tz, Utc::now())
    );
    // another sender has its own day
    let other = e.admit(&of("b1", "new", "ip2")).await.unwrap();
    assert!(matches!(other, Admission::Admitted(_)), "{other:?}");
    // past its schedule, the limit's rate alone: more than its last day's 1
    for id in ["c1", "c2", "c3"] {
        let a = e.admit(&of(id, "old", "ip3")).await.unwrap();
        assert!(matches!(a, Admission::Admitted(_)), "{a:?}");
    }
    let err =
        load_error("[limits.w]\nrate = 1\nburst = 1\nwarmup = { start = \"soon\", daily = [1] }\n");
    assert!(err.contains("`limits.w.warmup.start`"), "{err}");
    let err = load_error(
        "[limits.w]\nrate = 1\nburst = 1\nwarmup = { start = \"2026-01-01\", daily = [] }\n",
    );
    assert!(err.contains("`limits.w.warmup.daily`"), "{err}");
}

/// `n` admissions of distinct recipients (tenant `t`, sender by `i % senders`),
/// 256 in flight: admissions per second.
async fn admissions_per_second(
    e: &std::sync::Arc<QuotaStore>,
    tag: &str,
    n: usize,
    senders: usize,
) -> f64 {
    use futures_util::StreamExt;
    let started = std::time::Instant::now();
    futures_util::stream::iter(0..n)
        .map(|i| {
            let e = e.clone();
            let (id, who, sender) = (
                format!("{tag}{i}"),
                format!("{tag}-r{i}"),
                format!("s{}", i % senders),
            );
            async move {
                let r = Request {
                    tenant: Some("t"),
                    ..req(&id, &who, &sender, None)
                };
                let a = e.admit(&r).await.unwrap();
                assert!(matches!(a, Admission::Admitted(_)), "{a:?}");
            }
        })
        .buffer_unordered(256)
        .collect::<Vec<()>>()
        .await;
    n as f64 / started.elapsed().as_secs_f64()
}

/// Figures for BENCHMARKS.md (not a check: run with `--run-ignored only
/// --no-capture`): admissions per second with three matching limits, and with
/// three limits that match nothing, against none (8 alternated rounds); Redis
/// memory per sender's bucket over 100,000 senders, and that idle buckets expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement for BENCHMARKS.md"]
async fn cost_of_limits_measured() {
    let ns = unique("limits-cost-bench");
    let _g = RedisGuard(ns.clone());
    let fast = |per| limit(1_000_000, 1, 1_000_000, per);
    let none = limited(&ns, &[]);
    let three = limited(
        &ns,
        &[
            ("a", fast(Per::All)),
            ("t", fast(Per::Tenant)),
            ("s", fast(Per::Sender)),
        ],
    );
    let mut elsewhere = three.clone();
    for l in elsewhere.limits.values_mut() {
        l.matches.channels = Some(vec!["email".into()]);
    }
    let stores = [
        std::sync::Arc::new(QuotaStore::connect(&none).await.unwrap()),
        std::sync::Arc::new(QuotaStore::connect(&three).await.unwrap()),
        std::sync::Arc::new(QuotaStore::connect(&elsewhere).await.unwrap()),
    ];
    let n = 4_000;
    let mut rates: [Vec<f64>; 3] = Default::default();
    for round in 0..8 {
        // the order turns round by round (none first in one round, last in another)
        for k in (0..stores.len()).map(|i| (i + round) % stores.len()) {
            let e = &stores[k];
            let rate = admissions_per_second(e, &format!("x{round}-{k}-"), n, 1_000).await;
            rates[k].push(rate);
        }
        println!(
            "round {}: none {:.0}, three matching limits {:.0}, three limits matching nothing {:.0} admissions/s",
            round + 1,
            rates[0][round],
            rates[1][round],
            rates[2][round]
        );
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        (v[3] + v[4]) / 2.0
    };
    let [mut a, mut b, mut c] = rates;
    let (a, b, c) = (median(&mut a), median(&mut b), median(&mut c));
    println!("admissions/s (median of 8 alternated rounds of {n}): none {a:.0}, three matching limits {b:.0} ({:.2}), three limits matching nothing {c:.0} ({:.2})", b / a, c / a);

    // 100,000 senders, one bucket each (a limit of 1 per 30 s per sender: each
    // bucket lives 30 s after its take, to the end of the second after that)
    let per_sender = limited(&ns, &[("one_per_second", limit(1, 30, 1, Per::Sender))]);
    let e = std::sync::Arc::new(QuotaStore::connect(&per_sender).await.unwrap());
    let mut r = redis_sync();
    let used = |r: &mut redis::Connection| -> i64 {
        let info: String = redis::cmd("INFO").arg("memory").query(r).unwrap();
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let senders = 100_000;
    let before = used(&mut r);
    let first_take = std::time::Instant::now();
    admissions_per_second(&e, "m", senders, senders).await;
    let last_take = std::time::Instant::now();
    println!("100,000 senders admitted in {:?}", first_take.elapsed());
    let after = used(&mut r);
    let keys = per_sender.redis.keys();
    let mut sample = Vec::new();
    for i in (0..senders).step_by(1_000) {
        let key = keys.limit("one_per_second", ("s", &format!("s{i}")));
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .query(&mut r)
            .unwrap();
        let ttl: i64 = redis::cmd("PTTL").arg(&key).query(&mut r).unwrap();
        assert!(
            ttl > 0 && ttl <= 32_000,
            "an idle bucket expires once full again: {ttl}"
        );
        sample.push(bytes);
    }
    let per_key = sample.iter().sum::<i64>() as f64 / sample.len() as f64;
    println!(
        "100,000 senders: MEMORY USAGE {per_key:.0} bytes per bucket key; used_memory grew {:.0} bytes per sender (recipients' keys included, other tenants' load on this Redis too)",
        (after - before) as f64 / senders as f64
    );
    let idle = Duration::from_millis(32_100);
    tokio::time::sleep(idle.saturating_sub(last_take.elapsed())).await;
    let pattern = format!("{}:limit:one_per_second:*", per_sender.redis.key_prefix);
    let mut left = 0usize;
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(10_000)
            .query(&mut r)
            .unwrap();
        left += found.len();
        if next == 0 {
            break;
        }
        cursor = next;
    }
    println!("32.1 s after the last take: {left} of {senders} bucket keys left");
    assert_eq!(left, 0);
}
