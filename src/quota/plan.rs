//! The calendar bounds an admission carries to Redis. Pure: no I/O.
//!
//! Calendar windows need the recipient's local midnights, which Lua cannot compute.
//! The worker computes them here for the local day it believes Redis is in, and
//! `src/admission/lua/` checks that Redis time lies inside that day (module
//! [`crate::store`] explains the one clock).

use chrono::{DateTime, Utc};
use chrono_tz::Tz;

use super::window::{self, Rule, Window};

/// The calendar bounds of one request, computed in Rust for the local day Redis is
/// believed to be in (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Redis time must be at or after this (ms)...
    pub valid_from_ms: i64,
    /// ...and before this (ms).
    pub valid_until_ms: i64,
    /// When a send made now stops counting for every calendar rule (ms; 0 if none).
    pub calendar_expiry_ms: i64,
    /// Per rule: limit, and bound (> 0 inclusive start ms; < 0 minus a rolling length).
    pub rules: Vec<(u32, i64)>,
    /// The policy is in shadow mode: a job its rules refuse is recorded all the same.
    pub shadow: bool,
    /// The policy's `suppressed_by` mask (see [`super::suppression::Kinds`]).
    pub suppressed_by: u8,
}

/// Compute the request's calendar bounds for the instant `now`.
pub fn plan(rules: &[Rule], tz: Tz, now: DateTime<Utc>) -> Plan {
    let mut plan = Plan {
        valid_from_ms: 0,
        valid_until_ms: i64::MAX / 4,
        calendar_expiry_ms: 0,
        rules: Vec::with_capacity(rules.len()),
        shadow: false,
        suppressed_by: 0,
    };
    let mut has_calendar = false;
    for rule in rules {
        match rule.window {
            Window::CalendarDays(_) | Window::CalendarMonths(_) => {
                has_calendar = true;
                let (start, _) = window::window_start(rule.window, tz, now);
                let expiry = window::expires(rule.window, tz, now).timestamp_millis();
                plan.calendar_expiry_ms = plan.calendar_expiry_ms.max(expiry);
                plan.rules
                    .push((rule.limit, start.timestamp_millis().max(1)));
            }
            Window::Rolling(d) => plan.rules.push((rule.limit, -d.num_milliseconds().max(1))),
        }
    }
    if has_calendar {
        let today = window::local_date(tz, now);
        plan.valid_from_ms = window::day_start(tz, today).timestamp_millis();
        plan.valid_until_ms = window::next_day_start(tz, now).timestamp_millis();
    }
    plan
}
