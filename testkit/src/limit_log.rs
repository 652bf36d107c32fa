//! The limits (`[limits.NAME]`) checked against what was sent: every dispatched
//! job's admission instant, as its recipient's key recorded it (Redis time, in
//! ms: the clock the limits' buckets run on), with its cost, channel, category,
//! tenant and sender, and each bucket's admissions checked over every window.
//!
//! A GCRA of `rate` units per `period` with `burst` lets at most
//! `burst + rate * T / period` units through in any interval of length `T` (both
//! ends included), and that is the check: for every pair of admissions of one
//! bucket, the units from the first to the last. Its slack is derived, not
//! guessed: the buckets run in µs of Redis `TIME` while a send is recorded in
//! whole ms (the µs cut off), so an interval between two records is up to 999 µs
//! longer than the records say; and a limit's interval between two units is
//! `period / rate` in whole µs, up to 1 µs shorter than the exact quotient, which
//! lets up to one µs of the period through per unit. Nothing else is allowed.

use std::collections::BTreeMap;

use quota_worker::config::{LimitSettings, Settings};
use quota_worker::quota::limits::Per;
use quota_worker::redis::RedisConn;

use crate::audit;

/// One dispatched job as the limits see it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub id: String,
    /// Its admission (ms of Redis time).
    pub at_ms: i64,
    pub cost: u64,
    pub channel: String,
    pub category: String,
    pub tenant: Option<String>,
    pub sender: Option<String>,
}

/// The µs an interval between two records may be longer than the records say.
pub const RECORD_SLACK_US: i64 = 999;

/// The admissions of one bucket from one to another: when the first and the
/// last were, the units sent from one to the other (both included), and the
/// units allowed over that interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fill {
    pub from_ms: i64,
    pub to_ms: i64,
    pub units: u64,
    /// `burst + rate * (to - from) / period`, the records' slack included.
    pub allowed: f64,
}

impl Fill {
    /// The units over what is allowed (negative: under it).
    pub fn over(&self) -> f64 {
        self.units as f64 - self.allowed
    }
}

/// A limit's bucket and its fullest [`Fill`].
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub limit: String,
    /// The bucket (`""` for a limit counted for all, else the tenant or sender).
    pub bucket: String,
    pub fill: Fill,
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = &self.fill;
        write!(
            f,
            "limit `{}` bucket {:?}: {} units in {} ms, {:.3} allowed",
            self.limit,
            self.bucket,
            w.units,
            w.to_ms - w.from_ms,
            w.allowed
        )
    }
}

/// The bucket of limit `l` that holds `s` (`""` for one counted for all), or
/// `None` when it does not hold it (as the worker matches: a list left out
/// matches every job; a job without a tenant matches no list of tenants, and is
/// not held by a limit counted per tenant, or without a sender per sender).
pub fn bucket_of(l: &LimitSettings, s: &Sent) -> Option<String> {
    let m = &l.matches;
    let within = |set: &Option<Vec<String>>, x: Option<&str>| match (set, x) {
        (None, _) => true,
        (Some(v), Some(x)) => v.iter().any(|y| y == x),
        (Some(_), None) => false,
    };
    if !(within(&m.channels, Some(&s.channel))
        && within(&m.categories, Some(&s.category))
        && within(&m.tenants, s.tenant.as_deref()))
    {
        return None;
    }
    match l.per {
        Per::All => Some(String::new()),
        Per::Tenant => s.tenant.clone(),
        Per::Sender => s.sender.clone(),
    }
}

/// The admissions (ms) and costs of every bucket of every limit of `limits`
/// that holds some of `sent`, in time order.
pub fn buckets<'a>(
    limits: &'a BTreeMap<String, LimitSettings>,
    sent: &[Sent],
) -> BTreeMap<(&'a str, String), Vec<(i64, u64)>> {
    let mut out: BTreeMap<(&str, String), Vec<(i64, u64)>> = BTreeMap::new();
    for (name, l) in limits {
        for s in sent {
            if let Some(b) = bucket_of(l, s) {
                out.entry((name.as_str(), b))
                    .or_default()
                    .push((s.at_ms, s.cost));
            }
        }
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

/// The fullest window of one bucket's admissions `times` (sorted, with costs)
/// under `l`: the one whose units exceed what it allows by the most (or come
/// closest to it). `None` for no admission.
pub fn fullest(l: &LimitSettings, times: &[(i64, u64)]) -> Option<Fill> {
    let period_us = l.period.map_or(1_000_000, |p| p.0.as_micros() as i64) as f64;
    let (rate, burst) = (l.rate as f64, l.burst.unwrap_or(1) as f64);
    let mut best: Option<Fill> = None;
    for (i, &(from_ms, _)) in times.iter().enumerate() {
        let mut units = 0u64;
        for &(to_ms, cost) in &times[i..] {
            units += cost;
            let span_us = (to_ms - from_ms) * 1000 + RECORD_SLACK_US + units as i64;
            let fill = Fill {
                from_ms,
                to_ms,
                units,
                allowed: burst + rate * span_us as f64 / period_us,
            };
            if best.is_none_or(|b| fill.over() > b.over()) {
                best = Some(fill);
            }
        }
    }
    best
}

/// The fullest window of every bucket of every limit over `sent`.
pub fn fullest_windows(limits: &BTreeMap<String, LimitSettings>, sent: &[Sent]) -> Vec<Window> {
    buckets(limits, sent)
        .into_iter()
        .filter_map(|((name, bucket), times)| {
            let fill = fullest(&limits[name], &times)?;
            Some(Window {
                limit: name.to_string(),
                bucket,
                fill,
            })
        })
        .collect()
}

/// The windows of [`fullest_windows`] that hold more than their limit allows:
/// none when no limit was exceeded over any window.
pub fn exceeded(limits: &BTreeMap<String, LimitSettings>, sent: &[Sent]) -> Vec<Window> {
    fullest_windows(limits, sent)
        .into_iter()
        .filter(|w| w.fill.over() > 1e-9)
        .collect()
}

/// How late each admission came after the earliest instant its limits allowed
/// it (ms; negative: before it, which [`exceeded`] reports as a window), given
/// the admissions before it: a GCRA replayed over the records, per bucket.
/// Throttles are not replayed (a paused bucket's admissions come later).
pub fn lateness(limits: &BTreeMap<String, LimitSettings>, sent: &[Sent]) -> BTreeMap<String, i64> {
    let mut order: Vec<&Sent> = sent.iter().collect();
    order.sort_by_key(|s| s.at_ms);
    let mut tat: BTreeMap<(&str, String), f64> = BTreeMap::new();
    let mut out = BTreeMap::new();
    for s in order {
        let now = (s.at_ms * 1000) as f64;
        let mut allowed_at = f64::MIN;
        let mut takes = Vec::new();
        for (name, l) in limits {
            let Some(b) = bucket_of(l, s) else { continue };
            let period_us = l.period.map_or(1_000_000, |p| p.0.as_micros() as i64) as f64;
            // the worker's interval: whole µs
            let interval = (period_us / l.rate as f64).floor();
            let key = (name.as_str(), b);
            let t = tat.get(&key).copied().unwrap_or(f64::MIN).max(now);
            let burst = l.burst.unwrap_or(1) as f64;
            allowed_at = allowed_at.max(t + interval * (s.cost as f64 - burst));
            takes.push((key, t + interval * s.cost as f64));
        }
        for (key, t) in takes {
            tat.insert(key, t);
        }
        if allowed_at > f64::MIN {
            out.insert(s.id.clone(), s.at_ms - (allowed_at / 1000.0).ceil() as i64);
        }
    }
    out
}

/// A dispatched job whose admission is looked up: its id, recipient and tenant
/// (the tenant keys its recipient's names).
pub struct Lookup<'a> {
    pub id: &'a str,
    pub recipient: &'a str,
    pub tenant: Option<&'a str>,
}

/// The admission instant (ms of Redis time) of each of `jobs` under `policy`, as
/// its recipient's key records it, read as the worker connects (one node, the
/// master the sentinels name): `None` for a job no key records.
pub async fn admitted_at(
    s: &Settings,
    policy: &str,
    jobs: &[Lookup<'_>],
) -> BTreeMap<String, Option<i64>> {
    let keys = s.redis.keys();
    let mut conn = RedisConn::connect(&s.redis).await.expect("redis");
    let mut out = BTreeMap::new();
    for j in jobs {
        let key = keys
            .for_tenant(j.tenant)
            .recipient(j.recipient, policy, None);
        let sends = audit::recorded(&mut conn, &key).await;
        let member = quota_worker::quota::keys::member(j.id);
        let at = sends
            .iter()
            .find(|(_, _, m)| *m == member)
            .map(|(t, _, _)| *t);
        out.insert(j.id.to_string(), at);
    }
    out
}
