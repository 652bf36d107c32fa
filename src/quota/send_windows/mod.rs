//! Send windows: the hours of the recipient's week in which a job may go out
//! (`send_windows = [{ days = "mon-fri", from = "08:00", to = "21:00" }]`). Pure:
//! no I/O, "now" is a parameter.
//!
//! An [`Opening`] on a local date `d` whose weekday it lists spans
//! `[first instant reading d from, first instant reading d' to)`, where `d'` is `d`,
//! or the next date when `to` is not after `from` (an opening past midnight, such
//! as 22:00 to 06:00). "The first instant reading X" is the first instant whose
//! local wall clock reads X or later ([`window::first_reading`]): an opening at
//! 02:30 on a day whose 02:00 to 03:00 does not exist opens at 03:00, and an hour
//! the clock repeats is inside an opening once, the first time (after it closes the
//! second 01:30 does not open it again). An instant is allowed by a
//! [`SendWindows`] when one of its openings holds it, and by several sets (a
//! policy's and a channel's) when each of them allows it; [`next_open`] gives the
//! earliest such instant, exact to the millisecond.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Datelike, Days, Duration, NaiveDate, NaiveTime, Utc, Weekday};
use chrono_tz::Tz;

use super::window;

/// Minutes in a day: `to = "24:00"` is the end of the day.
const DAY_MINUTES: u16 = 24 * 60;

/// One opening of a send window: on `days`, from `from` to `to`, local time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opening {
    /// Bit `n` set: open on the weekday `n` days after Monday.
    days: u8,
    /// Minutes after local midnight, below 24:00.
    from: u16,
    /// Minutes after local midnight, up to 24:00; not after `from`: the next day.
    to: u16,
}

/// A set of openings (a policy's or a channel's `send_windows`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWindows(Vec<Opening>);

/// Which set of windows a job waits for, when several apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed {
    /// The index (in the slice given to [`next_open`]) of the set that was closed
    /// at the instant asked about and moved the answer last.
    pub by: usize,
}

/// Why a send window's text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpeningError(pub String);

/// An opening as the configuration writes it: `days = "mon,tue"`, `from = "09:00"`,
/// `to = "17:30"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpeningParts {
    /// Its days, comma-separated (`mon,tue,…`).
    pub days: String,
    /// When it opens, `HH:MM` local.
    pub from: String,
    /// When it closes, `HH:MM` local.
    pub to: String,
}

impl fmt::Display for OpeningError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OpeningError {}

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Parses `"mon-fri"`, `"sat"`, `"mon,wed,fri"`, `"fri-mon"` (a range may wrap
/// past Sunday), `"sat-sun,wed"`, or `"daily"`, into a weekday bit set.
pub(crate) fn parse_days(text: &str) -> Result<u8, OpeningError> {
    let day = |name: &str| {
        DAY_NAMES
            .iter()
            .position(|d| name.trim().eq_ignore_ascii_case(d))
            .ok_or_else(|| {
                OpeningError(format!(
                    "`{}` in days = {text:?} is not a day; write mon, tue, wed, thu, fri, sat, sun, \
                     ranges such as \"mon-fri\", lists such as \"mon,wed,fri\", or \"daily\"",
                    name.trim()
                ))
            })
    };
    if text.trim().eq_ignore_ascii_case("daily") {
        return Ok(0x7f);
    }
    let mut days = 0u8;
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut d = a;
                loop {
                    days |= 1 << d;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days |= 1 << day(part)?,
        }
    }
    Ok(days)
}

/// Parses `"HH:MM"` (24-hour, `"24:00"` only where `end` allows it) into minutes.
pub(crate) fn parse_time(text: &str, end: bool) -> Result<u16, OpeningError> {
    let bad = || {
        OpeningError(format!(
            "{text:?} is not a time of day; write \"HH:MM\" from \"00:00\" to \"23:59\"{}",
            if end { " (or \"24:00\")" } else { "" }
        ))
    };
    let (h, m) = text.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 || !(h.bytes().chain(m.bytes())).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let (h, m): (u16, u16) = (h.parse().map_err(|_| bad())?, m.parse().map_err(|_| bad())?);
    let minutes = h * 60 + m;
    if m > 59 || minutes > DAY_MINUTES || (minutes == DAY_MINUTES && !end) {
        return Err(bad());
    }
    Ok(minutes)
}

impl Opening {
    /// An opening on the days of `days` (as [`parse_days`] reads them), from `from`
    /// to `to` (`"HH:MM"`).
    pub fn parse(days: &str, from: &str, to: &str) -> Result<Opening, OpeningError> {
        let opening = Opening {
            days: parse_days(days)?,
            from: parse_time(from, false)?,
            to: parse_time(to, true)?,
        };
        if opening.from == opening.to {
            return Err(OpeningError(format!(
                "from = {from:?} and to = {to:?} open for no time (a whole day is \"00:00\" to \"24:00\")"
            )));
        }
        Ok(opening)
    }

    /// The days, `from` and `to` as the configuration writes them.
    pub fn parts(&self) -> OpeningParts {
        let hm = |m: u16| format!("{:02}:{:02}", m / 60, m % 60);
        let days: Vec<&str> = (0..7)
            .filter(|d| self.days & (1 << d) != 0)
            .map(|d| DAY_NAMES[d])
            .collect();
        OpeningParts {
            days: days.join(","),
            from: hm(self.from),
            to: hm(self.to),
        }
    }

    fn on(&self, weekday: Weekday) -> bool {
        self.days & (1 << weekday.num_days_from_monday()) != 0
    }

    /// The span this opening starts on local date `date`, if it opens that day
    /// (one where DST leaves it no time is empty and skipped).
    fn span(&self, tz: Tz, date: NaiveDate) -> Option<(DateTime<Utc>, DateTime<Utc>)> {
        if !self.on(date.weekday()) {
            return None;
        }
        let open = reading(tz, date, self.from);
        let close = if self.to > self.from {
            reading(tz, date, self.to)
        } else {
            reading(tz, date.checked_add_days(Days::new(1))?, self.to)
        };
        (open < close).then_some((open, close))
    }
}

/// The first instant whose local clock in `tz` reads `minutes` past the midnight of
/// `date`, or later.
fn reading(tz: Tz, date: NaiveDate, minutes: u16) -> DateTime<Utc> {
    let local = date.and_time(NaiveTime::MIN) + Duration::minutes(i64::from(minutes));
    window::first_reading(tz, local)
}

impl SendWindows {
    /// A set of openings; an empty set never opens.
    pub fn new(openings: Vec<Opening>) -> SendWindows {
        SendWindows(openings)
    }

    /// The openings, as written.
    pub(crate) fn openings(&self) -> &[Opening] {
        &self.0
    }

    /// The earliest instant at or after `at` inside one of the openings; `None` when
    /// the set never opens.
    pub(crate) fn next_open(&self, tz: Tz, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let today = window::local_date(tz, at);
        let mut best: Option<DateTime<Utc>> = None;
        // yesterday's openings may reach past midnight; a week and a day covers
        // every weekday even when a zone skips a date
        let mut date = today.pred_opt()?;
        for _ in 0..10 {
            if best.is_some_and(|b| b <= window::day_start(tz, date)) {
                break;
            }
            for o in &self.0 {
                if let Some((open, close)) = o.span(tz, date) {
                    if close > at {
                        let candidate = open.max(at);
                        best = Some(best.map_or(candidate, |b| b.min(candidate)));
                    }
                }
            }
            date = date.succ_opt()?;
        }
        best
    }

    /// The first instant at or after `at` inside none of the openings (`at` itself
    /// when it is outside them): where quiet hours end. Openings that chain into
    /// each other are followed; a set open all the time answers a week ahead.
    pub(crate) fn next_closed(&self, tz: Tz, at: DateTime<Utc>) -> DateTime<Utc> {
        let mut t = at;
        for _ in 0..64 {
            let date = window::local_date(tz, t);
            let Some(yesterday) = date.pred_opt() else {
                return t;
            };
            let mut until = None;
            for day in [yesterday, date] {
                for o in &self.0 {
                    if let Some((open, close)) = o.span(tz, day) {
                        if open <= t && t < close {
                            until = Some(until.map_or(close, |u: DateTime<Utc>| u.max(close)));
                        }
                    }
                }
            }
            match until {
                Some(u) => t = u,
                None => return t,
            }
        }
        t
    }

    /// Whether `at` is inside one of the openings.
    pub fn contains(&self, tz: Tz, at: DateTime<Utc>) -> bool {
        self.next_open(tz, at) == Some(at)
    }
}

/// The earliest instant at or after `at` that every set of `sets` allows, and, when
/// that is later than `at`, which set held it last. `None` when the sets have no
/// instant in common within the next 15 days (they never overlap).
pub(crate) fn next_open(
    sets: &[&SendWindows],
    tz: Tz,
    at: DateTime<Utc>,
) -> Option<(DateTime<Utc>, Option<Closed>)> {
    let horizon = at + Duration::days(15);
    let mut t = at;
    let mut closed = None;
    while t <= horizon {
        let mut moved = false;
        for (i, set) in sets.iter().enumerate() {
            let open = set.next_open(tz, t)?;
            if open > t {
                t = open;
                moved = true;
                closed = Some(Closed { by: i });
            }
        }
        if !moved {
            return Some((t, closed));
        }
    }
    None
}

impl fmt::Display for Opening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let OpeningParts { days, from, to } = self.parts();
        write!(f, "{days} {from}-{to}")
    }
}

impl fmt::Display for SendWindows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|o| o.to_string()).collect();
        f.write_str(&parts.join("; "))
    }
}

impl FromStr for Opening {
    type Err = OpeningError;

    /// `"mon-fri 08:00-21:00"`, the form [`Opening`]'s `Display` writes.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || OpeningError(format!("{s:?} is not \"DAYS HH:MM-HH:MM\""));
        let (days, hours) = s.trim().split_once(' ').ok_or_else(bad)?;
        let (from, to) = hours.trim().split_once('-').ok_or_else(bad)?;
        Opening::parse(days, from, to)
    }
}

#[cfg(test)]
mod tests;
