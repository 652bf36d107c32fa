//! Limits through a whole run: an SES-style account limit (a rate per second and
//! a larger window stacked on one bucket), Twilio-style rates per sender with
//! each job's cost (segments), and a tenant's monthly quota, through RabbitMQ and
//! Redis with three worker processes. Checked from the dispatch record (each
//! dispatched job's admission instant, as its recipient's key recorded it in
//! Redis time): no window of any limit exceeded, no job admitted before the
//! instant its limits allowed, the quota's dead letters exactly the jobs past it,
//! a throttle of one sender pausing that sender only, nothing lost or sent twice.
//! (The checker, `testkit::limit_log`, is the fault scenarios' too.)

use std::collections::BTreeMap;
use std::time::Duration;

use quota_worker::config::{
    CapScope, CapSettings, Dur, LimitSettings, MatchSettings, PolicySettings, RuleSettings,
    Settings, TenantSettings,
};
use quota_worker::quota::limits::Per;
use quota_worker::quota::policy::Action;
use quota_worker_producer::{Event, Feedback};
use testkit::audit::{self, Audit, Published};
use testkit::limit_log::{self, Lookup, Sent};
use testkit::procs::WorkerProc;
use testkit::*;

/// A limit of `rate` units per `period_ms`, `burst` at once, held `per`, for the
/// jobs of `tenants` (all when `None`).
pub(crate) fn limit(
    rate: u64,
    period_ms: u64,
    burst: u64,
    per: Per,
    tenants: Option<&[&str]>,
) -> LimitSettings {
    LimitSettings {
        rate,
        period: Some(Dur(Duration::from_millis(period_ms))),
        burst: Some(burst),
        matches: MatchSettings {
            channels: Some(vec!["sms".into()]),
            tenants: tenants.map(|t| t.iter().map(|x| x.to_string()).collect()),
            ..MatchSettings::default()
        },
        per,
        warmup: None,
    }
}

/// A job of the run: who sends it, for whom, at what cost.
#[derive(Debug, Clone)]
pub(crate) struct Job {
    pub(crate) id: String,
    pub(crate) recipient: String,
    pub(crate) tenant: &'static str,
    pub(crate) sender: &'static str,
    pub(crate) cost: u64,
    pub(crate) category: &'static str,
}

impl Job {
    pub(crate) fn published(&self) -> Published {
        let body = format!(
            r#"{{"id":"{}","recipient":"{}","channel":"sms","category":"{}","tenant":"{}","sender":"{}","cost":{},"payload":{{"text":"hello"}}}}"#,
            self.id, self.recipient, self.category, self.tenant, self.sender, self.cost
        );
        Published {
            id: self.id.clone(),
            recipient: self.recipient.clone(),
            body: body.into_bytes(),
        }
    }

    /// As the limits see it, admitted at `at_ms`.
    pub(crate) fn sent(&self, at_ms: i64) -> Sent {
        Sent {
            id: self.id.clone(),
            at_ms,
            cost: self.cost,
            channel: "sms".into(),
            category: self.category.into(),
            tenant: Some(self.tenant.into()),
            sender: Some(self.sender.into()),
        }
    }
}

/// The account's larger window, scaled from a day to 20 s so that a run
/// reaches it: 20 units at once, then 2.5 a second. (Every rate here divides its
/// period into whole µs, as the worker's buckets count.)
const DAY: (u64, u64, u64) = (50, 20_000, 20);
/// The tenant's monthly quota.
const MONTH: u32 = 12;
const ACME_PER_SENDER: usize = 10;
const BETA_PER_SENDER: usize = 12;
/// The sender the provider throttles, and how long it asks to wait.
const THROTTLED: &str = "55501";
const RETRY_AFTER_MS: i64 = 3_000;

/// SES: 10 a second (burst 5) and the scaled day on the one account; Twilio: a
/// long code (tenant `acme`) sends a segment a second (a job of up to 3 segments
/// at once), a short code (tenant `beta`) 4; `acme`'s plan: 12 jobs a month,
/// a job past it dead-lettered (its policy drops).
fn ses_twilio_plan(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.policies.get_mut("default").unwrap().rules = vec![];
    let drop = PolicySettings {
        action: Action::Drop,
        ..PolicySettings::default()
    };
    s.policies.insert("plan".into(), drop);
    let limits = [
        ("ses_per_second", limit(10, 1_000, 5, Per::All, None)),
        ("ses_per_day", limit(DAY.0, DAY.1, DAY.2, Per::All, None)),
        (
            "long_code",
            limit(1, 1_000, 3, Per::Sender, Some(&["acme"])),
        ),
        (
            "short_code",
            limit(4, 1_000, 4, Per::Sender, Some(&["beta"])),
        ),
    ];
    for (name, l) in limits {
        s.limits.insert(name.into(), l);
    }
    let month = CapSettings {
        rules: vec![RuleSettings {
            limit: MONTH,
            window: "1mo".parse().unwrap(),
        }],
        matches: MatchSettings {
            tenants: Some(vec!["acme".into()]),
            ..MatchSettings::default()
        },
        scope: CapScope::Tenant,
        ..CapSettings::default()
    };
    s.caps.insert("plan_month".into(), month);
    // a zone where it is about noon: the month cannot turn during the run
    let acme = TenantSettings {
        timezone: Some(audit::noon_zone()),
        ..TenantSettings::default()
    };
    s.tenants.insert("acme".into(), acme);
    s.feedback.ramp = Dur(Duration::from_secs(1));
    s
}

/// `acme`'s jobs on two long codes (category `plan`, costs 1 to 3), `beta`'s on
/// two short codes (costs 1 and 2), interleaved.
fn jobs(ns: &str) -> Vec<Job> {
    let mut out = Vec::new();
    for i in 0..BETA_PER_SENDER.max(ACME_PER_SENDER) {
        let mut add = |tenant, sender, cost, category| {
            let id = format!("{ns}-{sender}-{i}");
            out.push(Job {
                recipient: format!("r-{id}"),
                id,
                tenant,
                sender,
                cost,
                category,
            })
        };
        if i < ACME_PER_SENDER {
            add("acme", "+15550100", 1 + i as u64 % 3, "plan");
            add("acme", "+15550101", 1 + (i as u64 + 1) % 3, "plan");
        }
        if i < BETA_PER_SENDER {
            add("beta", THROTTLED, 1 + i as u64 % 2, "default");
            add("beta", "55502", 1 + (i as u64 + 1) % 2, "default");
        }
    }
    out
}

/// Wait until `dispatched` and `dead` are in their queues, failing once a
/// minute went by without one more (a deadline that follows the run).
async fn until_done(conn: &lapin::Connection, s: &Settings, dispatched: u32, dead: u32) {
    let queue = topology(s).dispatch_queue("sms");
    let mut best = (0, std::time::Instant::now());
    loop {
        let d = audit::depth(conn, &queue).await.unwrap_or(0);
        let x = audit::depth(conn, &s.amqp.dead_queue).await.unwrap_or(0);
        if d + x >= dispatched + dead {
            return;
        }
        if d + x > best.0 {
            best = (d + x, std::time::Instant::now());
        }
        assert!(
            best.1.elapsed() < Duration::from_secs(60),
            "stalled at {d} dispatched, {x} dead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Publish a `throttled` for `THROTTLED` once the run is under way and return
/// the instant (µs of Redis time) until which its bucket is paused, as the
/// bucket says (`TAT:P:R`).
async fn throttle(conn: &lapin::Connection, s: &Settings, first: &Job) -> i64 {
    let queue = topology(s).dispatch_queue("sms");
    wait_for("a few dispatches", Duration::from_secs(60), || async {
        audit::depth(conn, &queue).await.unwrap_or(0) >= 6
    })
    .await;
    let f = Feedback {
        retry_after: Some(RETRY_AFTER_MS as f64 / 1000.0),
        tenant: Some("beta".into()),
        sender: Some(THROTTLED.into()),
        ..Feedback::new(&first.id, Event::Throttled, &first.recipient, "sms")
    };
    crate::feedback::send(conn, s, &f).await;
    let key = s.redis.keys().limit("short_code", ("s", THROTTLED));
    let mut paused = None;
    wait_for("the throttle applied", Duration::from_secs(60), || {
        let raw: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query(&mut redis_sync())
            .unwrap();
        paused = raw.and_then(|v| v.split(':').nth(1).map(|p| p.parse().unwrap()));
        std::future::ready(paused.is_some())
    })
    .await;
    paused.unwrap()
}

/// The admissions of `sender` between `from` and `to` (ms, both excluded).
fn admitted_between(sent: &[Sent], sender: &str, (from, to): (i64, i64)) -> usize {
    sent.iter()
        .filter(|x| x.sender.as_deref() == Some(sender) && x.at_ms > from && x.at_ms < to)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ses_twilio_and_a_monthly_plan_are_admitted_exactly_on_three_workers() {
    let ns = unique("limits-run");
    let s = ses_twilio_plan(&ns);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    topology(&s).declare(&conn).await.expect("topology");
    let dir = temp_dir("limits-run");
    let mut procs: Vec<WorkerProc> = (0..3)
        .map(|n| WorkerProc::spawn(crate::BIN, &s, &dir, &n.to_string()))
        .collect();
    wait_for("three consumers", Duration::from_secs(60), || async {
        audit::consumers(&conn, &s.amqp.jobs_queue).await == Some(3)
    })
    .await;
    let jobs = jobs(&ns);
    let published: Vec<Published> = jobs.iter().map(Job::published).collect();
    audit::publish_all(&conn, &s, &published).await;
    let first_throttled = jobs.iter().find(|j| j.sender == THROTTLED).unwrap();
    let paused_until_us = throttle(&conn, &s, first_throttled).await;
    let acme = jobs.iter().filter(|j| j.tenant == "acme").count() as u32;
    let dispatched = jobs.len() as u32 - acme + MONTH;
    until_done(&conn, &s, dispatched, acme - MONTH).await;
    for w in &mut procs {
        let status = w.stop();
        assert!(status.is_some_and(|x| x.success()), "{}", w.tail(20));
    }
    let a = Audit::collect(&conn, &s, &published).await;
    // nothing lost, nothing twice, nothing unknown
    assert!(a.lost(&published).is_empty(), "{}", a.summary(&published));
    assert!(a.in_two_places().is_empty(), "{}", a.summary(&published));
    assert_eq!(a.duplicate_dispatches(), 0, "{}", a.summary(&published));
    assert!(a.strangers.is_empty(), "{:?}", a.strangers);
    // the quota: exactly MONTH of acme's jobs dispatched, the rest dead-lettered
    // `quota_exceeded`; none of beta's dead
    let by_id: BTreeMap<&str, &Job> = jobs.iter().map(|j| (j.id.as_str(), j)).collect();
    let acme_out = a
        .dispatched
        .keys()
        .filter(|id| by_id[id.as_str()].tenant == "acme");
    assert_eq!(acme_out.count() as u32, MONTH);
    assert_eq!(a.dead.len() as u32, acme - MONTH, "{:?}", a.dead);
    for (id, reasons) in &a.dead {
        assert_eq!(by_id[id.as_str()].tenant, "acme", "{id}");
        assert_eq!(reasons, &["quota_exceeded"], "{id}");
    }
    check_windows(&s, &a, &by_id, paused_until_us).await;
}

/// The dispatch record read back and checked: every limit over every window,
/// each admission at or after the instant its limits allowed, the throttled
/// sender silent through its pause while the other one went on.
async fn check_windows(s: &Settings, a: &Audit, by_id: &BTreeMap<&str, &Job>, paused_us: i64) {
    let mut sent = Vec::new();
    for policy in ["plan", "default"] {
        let of_policy: Vec<Lookup> = a
            .dispatched
            .keys()
            .map(|id| by_id[id.as_str()])
            .filter(|j| j.category == policy)
            .map(|j| Lookup {
                id: &j.id,
                recipient: &j.recipient,
                tenant: Some(j.tenant),
            })
            .collect();
        for (id, at) in limit_log::admitted_at(s, policy, &of_policy).await {
            let at = at.unwrap_or_else(|| panic!("{id} dispatched, no send recorded"));
            sent.push(by_id[id.as_str()].sent(at));
        }
    }
    let units: u64 = sent.iter().map(|x| x.cost).sum();
    assert!(units > DAY.2, "the account's window was never reached");
    for w in limit_log::fullest_windows(&s.limits, &sent) {
        println!("fullest window: {w}");
    }
    let over = limit_log::exceeded(&s.limits, &sent);
    assert!(over.is_empty(), "windows exceeded: {over:#?}");
    let late = limit_log::lateness(&s.limits, &sent);
    let early: Vec<_> = late.iter().filter(|(_, ms)| **ms < 0).collect();
    assert!(early.is_empty(), "admitted before allowed: {early:?}");
    let mut ms: Vec<i64> = late.values().copied().collect();
    ms.sort();
    println!(
        "after the instant allowed (ms): median {}, 90th {}, max {}",
        ms[ms.len() / 2],
        ms[ms.len() * 9 / 10],
        ms[ms.len() - 1]
    );
    // the pause: the throttled sender admitted nothing from the feedback to its
    // end (its bucket says P, pushed RETRY_AFTER_MS from the feedback's
    // instant), the other short code went on meanwhile, and the throttled one
    // went on after it
    let resume_ms = paused_us / 1000;
    let during = (resume_ms - RETRY_AFTER_MS, resume_ms);
    assert_eq!(admitted_between(&sent, THROTTLED, during), 0);
    let other = admitted_between(&sent, "55502", during);
    assert!(other > 0, "the other sender waited too");
    let after = admitted_between(&sent, THROTTLED, (resume_ms - 1, i64::MAX));
    assert!(after > 0, "the throttled sender had nothing left to send");
    println!(
        "during the pause: the other short code sent {other}; the paused one {after} after it"
    );
}

/// The checker itself: admissions at the rate pass, one 2 ms early is found.
#[test]
fn the_window_check_finds_an_admission_two_ms_early() {
    let l = limit(2, 1_000, 1, Per::All, None);
    let at: Vec<(i64, u64)> = (0..5).map(|i| (i * 500, 1)).collect();
    let fill = limit_log::fullest(&l, &at).unwrap();
    assert!(fill.over() <= 0.0, "{fill:?}");
    let mut early = at.clone();
    early[3].0 -= 2;
    let fill = limit_log::fullest(&l, &early).unwrap();
    assert!(fill.over() > 0.0, "{fill:?}");
    // a cost of 3 at once from a burst of 3, then one a second
    let l = limit(1, 1_000, 3, Per::Sender, None);
    let ok = [(0, 3), (1_000, 1), (2_000, 1)];
    assert!(limit_log::fullest(&l, &ok).is_some_and(|w| w.over() <= 0.0));
    let bad = [(0, 3), (990, 1)];
    assert!(limit_log::fullest(&l, &bad).is_some_and(|w| w.over() > 0.0));
}
