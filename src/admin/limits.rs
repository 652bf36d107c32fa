//! `admin limits`: every limit (`[limits.NAME]`) and quota (a cap with `scope =
//! "tenant"` or `"sender"`), what it holds, and the state of its buckets: the one
//! bucket of a limit counted for all, or one tenant's or sender's bucket when asked
//! for; otherwise how many buckets are in use. Reads Redis; writes nothing.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::quota::limits::{Limit, Per};
use crate::redis::StoreError;
use crate::store::QuotaStore;

/// Whose buckets to show (`--tenant`, `--sender`).
#[derive(Debug, Clone, Default)]
pub struct LimitQuery {
    /// Show this tenant's bucket of every limit counted per tenant.
    pub tenant: Option<String>,
    /// Show this sender's bucket of every limit counted per sender.
    pub sender: Option<String>,
}

/// One limit or quota and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitStatus {
    /// Its name.
    pub name: String,
    /// `limit` or `quota`.
    pub kind: String,
    /// What it allows, as `x-notify-held-by` names it.
    pub rule: String,
    /// `all`, `tenant` or `sender`.
    pub per: String,
    /// The bucket shown (`all`, `tenant T`, `sender S`); `None` when none is.
    pub bucket: Option<String>,
    /// Units of cost (a quota: jobs) it admits now; `None` when no bucket is shown.
    pub available: Option<u64>,
    /// Units a full bucket holds (a quota: its count per period).
    pub capacity: u64,
    /// When the bucket is full again (a quota: when its period ends), RFC 3339;
    /// `None` when it is full (or no bucket is shown).
    pub full_at: Option<String>,
    /// Until when a `throttled` feedback pauses the bucket, RFC 3339.
    pub paused_until: Option<String>,
    /// Buckets in use (keys in Redis) when no one bucket is shown.
    pub in_use: Option<u64>,
}

/// Every limit and quota of the rules in force, with the state `q` asks for.
pub async fn limits(store: &QuotaStore, q: &LimitQuery) -> Result<Vec<LimitStatus>, StoreError> {
    let rules = store.rules();
    let mut conn = store.connection();
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await?;
    let now_us = secs * 1_000_000 + micros;
    let mut out = Vec::new();
    for l in rules.limits() {
        let bucket = match l.per {
            Per::All => Some(("", "", "all".to_string())),
            Per::Tenant => q.tenant.as_deref().map(|t| ("t", t, format!("tenant {t}"))),
            Per::Sender => q.sender.as_deref().map(|s| ("s", s, format!("sender {s}"))),
        };
        let mut status = LimitStatus {
            name: l.name.clone(),
            kind: if l.quota.is_some() { "quota" } else { "limit" }.into(),
            rule: l.to_string(),
            per: l.per.as_str().into(),
            bucket: None,
            available: None,
            capacity: l.quota.map_or(l.rate.burst, |q| u64::from(q.limit)),
            full_at: None,
            paused_until: None,
            in_use: None,
        };
        match bucket {
            Some((kind, value, shown)) => {
                let zone = rules.tenant_zone(q.tenant.as_deref());
                let key = match &l.quota {
                    Some(quota) => {
                        let (start, _) = quota.period(zone, micros_to_time(now_us));
                        let window = quota.window.to_string();
                        let start_ms = start.timestamp_millis();
                        store
                            .keys()
                            .quota(&l.name, &window, (kind, value), start_ms)
                    }
                    None => store.keys().limit(&l.name, (kind, value)),
                };
                let raw: Option<String> =
                    redis::cmd("GET").arg(&key).query_async(&mut conn).await?;
                status.bucket = Some(shown);
                state(&mut status, l, raw.as_deref(), now_us, zone);
            }
            None => status.in_use = Some(in_use(store, l).await?),
        }
        out.push(status);
    }
    Ok(out)
}

/// The state a bucket's value `raw` says at `now_us` (`zone`: a quota's calendar).
fn state(status: &mut LimitStatus, l: &Limit, raw: Option<&str>, now_us: i64, zone: chrono_tz::Tz) {
    if let Some(q) = &l.quota {
        let used: u64 = raw.and_then(|r| r.parse().ok()).unwrap_or(0);
        status.available = Some(u64::from(q.limit).saturating_sub(used));
        let (_, end) = q.period(zone, micros_to_time(now_us));
        status.full_at = (used > 0).then(|| end.to_rfc3339());
        return;
    }
    let mut parts = raw.unwrap_or("0").split(':');
    let tat: i64 = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
    let paused: Option<i64> = parts.next().and_then(|p| p.parse().ok());
    let interval = l.rate.interval_us.max(1) as i64;
    let burst = l.rate.burst as i64;
    let tat = tat.max(now_us);
    let available = ((now_us - (tat - burst * interval)) / interval).clamp(0, burst);
    status.available = Some(available as u64);
    status.full_at = (tat > now_us).then(|| micros_to_time(tat).to_rfc3339());
    status.paused_until = paused
        .filter(|p| *p > now_us)
        .map(|p| micros_to_time(p).to_rfc3339());
}

/// How many buckets of `l` are keys in Redis now (a SCAN of its prefix).
async fn in_use(store: &QuotaStore, l: &Limit) -> Result<u64, StoreError> {
    let pattern = match &l.quota {
        Some(q) => store
            .keys()
            .quota(&l.name, &q.window.to_string(), ("", ""), 0),
        None => store.keys().limit(&l.name, ("", "")),
    };
    // `…:NAME` (a limit) or `…:NAME:WINDOW:0` (a quota): every bucket below it
    let pattern = match &l.quota {
        Some(_) => format!("{}:*", pattern.trim_end_matches(":0")),
        None => format!("{pattern}:*"),
    };
    let mut conn = store.connection();
    let mut cursor: u64 = 0;
    let mut count = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await?;
        count += keys
            .iter()
            .filter(|k| !k.ends_with(":throttle") && !k.contains(":feedback:"))
            .count() as u64;
        if next == 0 {
            return Ok(count);
        }
        cursor = next;
    }
}

fn micros_to_time(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MAX_UTC)
}
