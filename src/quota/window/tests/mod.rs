//! Tests of the calendar arithmetic: real tzdb edge cases in tables, and property
//! tests against a brute-force reference. Shared here: the instants' builders and
//! the rules the tables use.

use chrono::{DateTime, Duration, FixedOffset, LocalResult, NaiveDate, Offset, TimeZone, Utc};
use chrono_tz::Tz;

use super::{Rule, Window};

mod calendar;
mod parse;
mod properties;
mod tables;

fn ymd(y: i32, m: u32, d: u32) -> NaiveDate {
    NaiveDate::from_ymd_opt(y, m, d).expect("valid test date")
}

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

/// A local wall-clock time that must exist exactly once.
fn local(tz: Tz, y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    match tz.with_ymd_and_hms(y, mo, d, h, mi, s) {
        LocalResult::Single(t) => t.with_timezone(&Utc),
        other => panic!("{tz} {y}-{mo}-{d} {h}:{mi}:{s} is not unique: {other:?}"),
    }
}

fn offset_at(tz: Tz, at: DateTime<Utc>) -> FixedOffset {
    tz.offset_from_utc_datetime(&at.naive_utc()).fix()
}

fn hours(h: i32) -> FixedOffset {
    FixedOffset::east_opt(h * 3600).unwrap()
}

fn hm(h: i32, m: i32) -> FixedOffset {
    FixedOffset::east_opt(h * 3600 + h.signum() * m * 60).unwrap()
}

fn ms(n: i64) -> Duration {
    Duration::milliseconds(n)
}

const DAY: Window = Window::CalendarDays(1);
const WEEK: Window = Window::CalendarDays(7);
const DAILY_AND_WEEKLY: [Rule; 2] = [
    Rule {
        limit: 1,
        window: DAY,
    },
    Rule {
        limit: 3,
        window: WEEK,
    },
];
