//! Limits (`[limits.NAME]`): named GCRA buckets over the jobs they match, one
//! bucket for all of them, one per tenant or one per sender, each taking a job's
//! cost. What a limit is once read, which jobs it matches, and what key its bucket
//! has for a job. Pure: no I/O (the admission carries them to Redis, in the same
//! call as the caps: `src/admission/lua/limits.lua`).

use std::fmt;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use super::policy::Rate;
use super::window::{self, Window};

/// Which jobs share one bucket of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Per {
    /// One bucket for every job the limit matches.
    #[default]
    All,
    /// One bucket per tenant (jobs without a tenant are not held by it).
    Tenant,
    /// One bucket per sender (jobs without a sender are not held by it).
    Sender,
}

impl Per {
    /// `all`, `tenant` or `sender`.
    pub fn as_str(self) -> &'static str {
        match self {
            Per::All => "all",
            Per::Tenant => "tenant",
            Per::Sender => "sender",
        }
    }
}

/// A validated limit, ready for the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    /// Its name.
    pub name: String,
    /// Its GCRA: the interval between two units of cost and the burst (in units
    /// of cost); its `cost` field is unused (each job brings its own).
    pub rate: Rate,
    /// Which jobs share a bucket.
    pub per: Per,
    /// The channels it matches; `None`: every channel.
    pub channels: Option<Vec<String>>,
    /// The categories it matches; `None`: every category.
    pub categories: Option<Vec<String>>,
    /// The tenants it matches; `None`: every job, with a tenant or without.
    pub tenants: Option<Vec<String>>,
    /// For a quota (a cap with `scope = "tenant"` or `"sender"`): its rule, a
    /// count per calendar day or month (then `rate` is unused); `None` for a
    /// limit.
    pub quota: Option<Quota>,
    /// Its warm-up schedule, if any (a limit's, never a quota's).
    pub warmup: Option<Warmup>,
}

/// A warm-up schedule: from `start` (a local date), day `i` admits at most
/// `daily[i]` jobs of each bucket, besides the limit's rate; before `start` the
/// first day's count holds, and past the last day the limit's own rate alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warmup {
    /// Its first day.
    pub start: chrono::NaiveDate,
    /// Jobs per calendar day, day by day.
    pub daily: Vec<u32>,
}

impl Warmup {
    /// Today's count (`today`: the local date), as a daily quota; `None` past
    /// the schedule's end.
    pub fn today(&self, today: chrono::NaiveDate) -> Option<Quota> {
        let day = today.signed_duration_since(self.start).num_days().max(0);
        let limit = *self.daily.get(usize::try_from(day).ok()?)?;
        Some(Quota {
            limit,
            window: Window::CalendarDays(1),
        })
    }
}

/// A quota's rule: at most `limit` jobs per calendar `window` (`1d` or `1mo`) in
/// the tenant's zone, counted in one counter per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Jobs per period (notifications, whatever their cost).
    pub limit: u32,
    /// `CalendarDays(1)` or `CalendarMonths(1)`.
    pub window: Window,
}

impl Quota {
    /// The period (start, end) that `now` is in, in zone `tz`.
    pub fn period(&self, tz: Tz, now: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let (start, _) = window::window_start(self.window, tz, now);
        (start, window::expires(self.window, tz, now))
    }
}

/// What one admission took from one limit's bucket: given back (the part still
/// unspent, `lua/refund.lua`) when the job is released or parked instead of sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Take {
    /// The bucket's key (shared with the admission's arguments: no copy a take).
    pub key: std::sync::Arc<str>,
    /// The limit's interval (µs per unit of cost).
    pub interval_us: u64,
    /// The job's cost.
    pub cost: u64,
    /// The TAT (µs of Redis time) the take left.
    pub tat_us: i64,
}

/// What a job shows a limit: its channel, category, tenant and sender.
#[derive(Debug, Clone, Copy)]
pub struct Subject<'a> {
    /// Its channel.
    pub channel: &'a str,
    /// Its category (`default` when it names none).
    pub category: &'a str,
    /// Its tenant, if any.
    pub tenant: Option<&'a str>,
    /// Its sender, if any.
    pub sender: Option<&'a str>,
}

impl Limit {
    /// The bucket's part of the key for a job of `s` (empty for `per = "all"`);
    /// `None` when the limit does not hold the job: it does not match, or it
    /// counts per tenant (or sender) and the job has none.
    pub fn bucket<'a>(&self, s: &Subject<'a>) -> Option<(&'static str, &'a str)> {
        let within = |set: &Option<Vec<String>>, x: &str| {
            set.as_ref().is_none_or(|v| v.iter().any(|y| y == x))
        };
        let tenant_ok = match (&self.tenants, s.tenant) {
            (None, _) => true,
            (Some(set), Some(t)) => set.iter().any(|y| y == t),
            (Some(_), None) => false,
        };
        if !(within(&self.channels, s.channel) && within(&self.categories, s.category) && tenant_ok)
        {
            return None;
        }
        match self.per {
            Per::All => Some(("", "")),
            Per::Tenant => s.tenant.map(|t| ("t", t)),
            Per::Sender => s.sender.map(|x| ("s", x)),
        }
    }

    /// Whether a job of cost `cost` can ever pass it (its burst holds the cost).
    pub fn admits_cost(&self, cost: u64) -> bool {
        match &self.quota {
            // a quota counts jobs, not cost
            Some(q) => q.limit > 0,
            None => cost <= self.rate.burst,
        }
    }
}

impl fmt::Display for Limit {
    /// `limit per_sender (1 per second, burst 1, per sender)` or `quota plan
    /// (50000 per 1mo, per tenant)`, as `x-notify-held-by` and the dead-letter
    /// details name it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(q) = &self.quota {
            return write!(
                f,
                "quota `{}` ({} per {}, per {})",
                self.name,
                q.limit,
                q.window,
                self.per.as_str()
            );
        }
        let per_second = 1e6 / self.rate.interval_us as f64;
        let text = format!("{per_second:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        write!(
            f,
            "limit `{}` ({} per second, burst {}, per {})",
            self.name,
            text,
            self.rate.burst,
            self.per.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per: Per, tenants: Option<Vec<String>>) -> Limit {
        Limit {
            name: "l".into(),
            rate: Rate {
                interval_us: 1_000_000,
                burst: 3,
                cost: 1,
            },
            per,
            channels: Some(vec!["sms".into()]),
            categories: None,
            tenants,
            quota: None,
            warmup: None,
        }
    }

    fn subject<'a>(
        channel: &'a str,
        tenant: Option<&'a str>,
        sender: Option<&'a str>,
    ) -> Subject<'a> {
        Subject {
            channel,
            category: "default",
            tenant,
            sender,
        }
    }

    #[test]
    fn a_limit_holds_the_jobs_it_matches_in_the_bucket_its_per_names() {
        let all = limit(Per::All, None);
        assert_eq!(all.bucket(&subject("sms", None, None)), Some(("", "")));
        assert_eq!(all.bucket(&subject("email", None, None)), None);
        let senders = limit(Per::Sender, None);
        assert_eq!(senders.bucket(&subject("sms", None, None)), None);
        assert_eq!(
            senders.bucket(&subject("sms", None, Some("+15550100"))),
            Some(("s", "+15550100"))
        );
        let tenants = limit(Per::Tenant, Some(vec!["acme".into()]));
        assert_eq!(tenants.bucket(&subject("sms", None, Some("x"))), None);
        assert_eq!(tenants.bucket(&subject("sms", Some("other"), None)), None);
        assert_eq!(
            tenants.bucket(&subject("sms", Some("acme"), None)),
            Some(("t", "acme"))
        );
    }

    #[test]
    fn a_warmup_grows_by_day_and_ends() {
        let d = |day: u32| chrono::NaiveDate::from_ymd_opt(2026, 3, day).unwrap();
        let w = Warmup {
            start: d(10),
            daily: vec![50, 100, 500],
        };
        let limit_on = |day| w.today(d(day)).map(|q| q.limit);
        assert_eq!(limit_on(1), Some(50), "before its start: its first day");
        assert_eq!(limit_on(10), Some(50));
        assert_eq!(limit_on(11), Some(100));
        assert_eq!(limit_on(12), Some(500));
        assert_eq!(limit_on(13), None, "past its end: the limit's own rate");
    }

    #[test]
    fn a_limit_says_itself_and_what_cost_it_can_pass() {
        let l = limit(Per::Sender, None);
        assert_eq!(
            l.to_string(),
            "limit `l` (1 per second, burst 3, per sender)"
        );
        assert!(l.admits_cost(3));
        assert!(!l.admits_cost(4));
    }
}
