//! Pure calendar and window arithmetic for per-recipient notification caps.
//!
//! Nothing here does I/O or reads a clock: "now" is always a parameter. All
//! instants are `DateTime<Utc>` at millisecond precision (callers truncate to
//! whole milliseconds) and calendar questions are answered in the recipient's
//! IANA zone (`chrono_tz::Tz`).
//!
//! # Windows
//!
//! A [`Rule`] says "at most `limit` sends per `window`". A [`Window`] is one of:
//!
//! * [`Window::CalendarDays(n)`](Window::CalendarDays) — "today and the previous
//!   `n - 1` local days" in the recipient's zone. A send counts at `at` iff its
//!   local date is on or after `local_date(at) - (n - 1)` days. The window
//!   therefore resets at local midnight, whatever the length of the local day
//!   (23 h, 23.5 h, 24.5 h or 25 h around DST changes), and not every
//!   `n * 86400` seconds. Written `"1d"`, `"7d"`, ...
//! * [`Window::CalendarMonths(n)`](Window::CalendarMonths) — "this month and the
//!   previous `n - 1` local months": a send counts at `at` iff its local month
//!   is at most `n - 1` months before `at`'s. It resets at the local midnight
//!   that starts a month. Written `"1mo"`, `"3mo"`, ...
//! * [`Window::Rolling(d)`](Window::Rolling) — a sliding window of fixed
//!   length: a send counts at `at` iff `at - d < send <= at`, so a send exactly
//!   `d` ago no longer counts. Written `"500ms"`, `"30s"`, `"10m"`, `"24h"`.
//!
//! A send recorded after `at` never counts at `at`.
//!
//! # Local days
//!
//! The start of a local date ([`day_start`]) is its local midnight. Where
//! midnight does not exist (a DST gap at 00:00, as in America/Santiago,
//! America/Havana or Asia/Beirut), the day starts at the first instant that
//! does exist on that date (e.g. 01:00). Where midnight happens twice (a
//! fall-back ending at 00:00, as in America/Havana in November), the day
//! starts at the earlier one. In every case `day_start(tz, d)` is the first
//! instant whose local date is `d` or later (if a zone skipped a whole date,
//! such as Pacific/Apia on 2011-12-30, it is the first instant of the next
//! date that exists).
//!
//! # Admission
//!
//! One more send at `at` is admitted ([`admits`]) iff, for every rule, fewer
//! than `limit` recorded sends count at `at`. Because counts only fall as time
//! passes when no new sends are recorded, the earliest admitted instant
//! ([`earliest_allowed`]) is computed exactly from the instants at which
//! individual sends stop counting ([`expires`]). This relies on the local date
//! never moving backwards, i.e. on no fall-back crossing midnight backwards
//! (fall-backs that end at 24:00, as in America/Santiago and Asia/Beirut, or
//! at 00:00, as in America/Havana, are fine).
//!
//! Instants or dates beyond chrono's representable range saturate to
//! `DateTime::<Utc>::MIN_UTC` / `MAX_UTC` (or `NaiveDate::MIN` / `MAX`)
//! instead of panicking.

use std::fmt;
use std::str::FromStr;

use chrono::{
    DateTime, Datelike, Days, Duration, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset,
    TimeZone, Utc,
};
use chrono_tz::Tz;

/// The span over which a [`Rule`] counts sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Window {
    /// Today and the previous `n - 1` local calendar days in the recipient's
    /// zone (`n >= 1`; a window of 0 days never counts anything).
    CalendarDays(u32),
    /// This local calendar month and the previous `n - 1` in the recipient's
    /// zone (`n >= 1`; a window of 0 months never counts anything).
    CalendarMonths(u32),
    /// A sliding window of this length: a send counts at `at` iff
    /// `at - d < send <= at` (a non-positive duration never counts anything).
    Rolling(Duration),
}

/// A cap: at most `limit` sends per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    /// Maximum number of sends that may count within the window (0 forbids
    /// sending altogether).
    pub limit: u32,
    /// The window over which sends are counted.
    pub window: Window,
}

/// Error returned when parsing a [`Window`] from text fails; its message names
/// the rejected text and the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowParseError(String);

impl fmt::Display for WindowParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WindowParseError {}

const MS_PER_SECOND: i64 = 1_000;
const MS_PER_MINUTE: i64 = 60 * MS_PER_SECOND;
const MS_PER_HOUR: i64 = 60 * MS_PER_MINUTE;

impl WindowParseError {
    fn new(text: &str, reason: &str) -> Self {
        WindowParseError(format!(
            "invalid window {text:?}: {reason}; expected a whole number >= 1 followed by a unit: \
             \"d\" for calendar days in the recipient's zone (e.g. \"1d\", \"7d\"), \"mo\" for calendar \
             months (e.g. \"1mo\"), or \"ms\", \
             \"s\", \"m\", \"h\" for a rolling duration (e.g. \"500ms\", \"30s\", \"10m\", \"24h\")"
        ))
    }
}

impl FromStr for Window {
    type Err = WindowParseError;

    /// Parses `"<n>d"` as [`Window::CalendarDays`] and `"<n>ms"`, `"<n>s"`,
    /// `"<n>m"`, `"<n>h"` as [`Window::Rolling`], where `<n>` is a whole
    /// decimal number >= 1 (ASCII digits only: no sign, no fraction, no
    /// spaces; units are lower case).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let digits_end = text
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len());
        let (digits, unit) = text.split_at(digits_end);
        if digits.is_empty() {
            return Err(WindowParseError::new(text, "missing a leading number"));
        }
        let unit_ms = match unit {
            "d" | "mo" => None,
            "h" => Some(MS_PER_HOUR),
            "m" => Some(MS_PER_MINUTE),
            "s" => Some(MS_PER_SECOND),
            "ms" => Some(1),
            "" => return Err(WindowParseError::new(text, "missing a unit")),
            _ => return Err(WindowParseError::new(text, "unknown unit")),
        };
        let value: u64 = digits
            .parse()
            .map_err(|_| WindowParseError::new(text, "number is too large"))?;
        if value == 0 {
            return Err(WindowParseError::new(text, "the number must be at least 1"));
        }
        match unit_ms {
            None if unit == "mo" => u32::try_from(value)
                .map(Window::CalendarMonths)
                .map_err(|_| WindowParseError::new(text, "number of months is too large")),
            None => u32::try_from(value)
                .map(Window::CalendarDays)
                .map_err(|_| WindowParseError::new(text, "number of days is too large")),
            Some(unit_ms) => i64::try_from(value)
                .ok()
                .and_then(|v| v.checked_mul(unit_ms))
                .and_then(Duration::try_milliseconds)
                .map(Window::Rolling)
                .ok_or_else(|| WindowParseError::new(text, "duration is too large")),
        }
    }
}

impl fmt::Display for Window {
    /// Formats as `"<n>d"` for calendar days, and for rolling windows with
    /// the largest of `h`, `m`, `s`, `ms` that divides the duration exactly
    /// (e.g. `"24h"`, `"90m"`, `"1500ms"`), so that the output parses back to
    /// the same value. Durations that are not a positive whole number of
    /// milliseconds (which the parser never produces) are shown truncated to
    /// milliseconds and do not round-trip; neither does `CalendarDays(0)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Window::CalendarDays(n) => write!(f, "{n}d"),
            Window::CalendarMonths(n) => write!(f, "{n}mo"),
            Window::Rolling(d) => {
                let ms = d.num_milliseconds();
                if ms != 0 {
                    for (unit_ms, unit) in [
                        (MS_PER_HOUR, "h"),
                        (MS_PER_MINUTE, "m"),
                        (MS_PER_SECOND, "s"),
                    ] {
                        if ms % unit_ms == 0 {
                            return write!(f, "{}{unit}", ms / unit_ms);
                        }
                    }
                }
                write!(f, "{ms}ms")
            }
        }
    }
}

/// A date's month counted from year 0 (months apart = the difference).
fn month_number(date: NaiveDate) -> i64 {
    i64::from(date.year()) * 12 + i64::from(date.month0())
}

/// The first day of the month `months` after `date`'s (before, when negative);
/// `None` beyond chrono's range.
pub(crate) fn month_first(date: NaiveDate, months: i64) -> Option<NaiveDate> {
    let m = month_number(date).checked_add(months)?;
    let year = i32::try_from(m.div_euclid(12)).ok()?;
    NaiveDate::from_ymd_opt(year, m.rem_euclid(12) as u32 + 1, 1)
}

/// The recipient's local calendar date at instant `at` in zone `tz`
/// (saturating to `NaiveDate::MIN` / `MAX` at the edges of chrono's range).
pub fn local_date(tz: Tz, at: DateTime<Utc>) -> NaiveDate {
    let utc = at.naive_utc();
    let offset = tz.offset_from_utc_datetime(&utc).fix();
    match utc.checked_add_offset(offset) {
        Some(local) => local.date(),
        None if offset.local_minus_utc() > 0 => NaiveDate::MAX,
        None => NaiveDate::MIN,
    }
}

/// First instant of local date `date` in `tz`: local midnight, or if midnight
/// does not exist that day (DST gap at 00:00, e.g. America/Santiago,
/// America/Havana, Asia/Beirut historically) the first instant that does exist
/// on that date; if midnight happens twice (fall-back at 00:00) the earlier
/// one.
///
/// Equivalently: the first instant whose local date is `date` or later (if
/// the zone skipped the whole date, the start of the next date that exists).
/// Saturates to `MIN_UTC` / `MAX_UTC` for dates at the edges of chrono's range
/// whose start cannot be represented.
pub fn day_start(tz: Tz, date: NaiveDate) -> DateTime<Utc> {
    day_start_checked(tz, date).unwrap_or(if date.year() < 1970 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

/// Start of the local day after the one containing `at`.
pub fn next_day_start(tz: Tz, at: DateTime<Utc>) -> DateTime<Utc> {
    match local_date(tz, at).succ_opt() {
        Some(next) => day_start(tz, next),
        None => DateTime::<Utc>::MAX_UTC,
    }
}

/// Whether a send recorded at `send` counts toward `window` when evaluated at
/// `at` (send <= at assumed; return false if send > at).
///
/// * `Rolling(d)`: counts iff `at - d < send <= at` (a send exactly `d` ago no
///   longer counts).
/// * `CalendarDays(n)`: counts iff `local_date(send) >= local_date(at) - (n-1)`
///   days, i.e. "today and the previous n-1 local days".
pub fn counts(window: Window, tz: Tz, at: DateTime<Utc>, send: DateTime<Utc>) -> bool {
    let (today, date) = (date_for(window, tz, at), date_for(window, tz, send));
    counts_dated(window, at, today, send, date)
}

/// `t`'s local date where `window` counts calendar days; where it does not, a
/// placeholder it never reads (no zone lookup).
fn date_for(window: Window, tz: Tz, t: DateTime<Utc>) -> NaiveDate {
    match window {
        Window::CalendarDays(_) | Window::CalendarMonths(_) => local_date(tz, t),
        Window::Rolling(_) => NaiveDate::MIN,
    }
}

/// [`counts`] given the local dates of `at` (`today`) and of `send` (`date`),
/// which only calendar windows read.
fn counts_dated(
    window: Window,
    at: DateTime<Utc>,
    today: NaiveDate,
    send: DateTime<Utc>,
    date: NaiveDate,
) -> bool {
    if send > at {
        return false;
    }
    match window {
        // `send > at - d` rewritten as `at - send < d` so that it cannot overflow.
        Window::Rolling(d) => at.signed_duration_since(send) < d,
        Window::CalendarDays(n) => today.signed_duration_since(date).num_days() < i64::from(n),
        Window::CalendarMonths(n) => month_number(today) - month_number(date) < i64::from(n),
    }
}

/// Earliest instant from which sends count at `at`, and whether that bound is
/// inclusive:
///
/// * `Rolling(d)` => `(at - d, false)` (exclusive);
/// * `CalendarDays(n)` => `(day_start(tz, local_date(at) - (n-1) days), true)`
///   (inclusive).
///
/// For a send `s <= at`, `counts(window, tz, at, s)` holds iff `s` is after
/// (or, when inclusive, at) the bound. Saturates to `MIN_UTC` when the bound
/// lies before chrono's range.
pub(crate) fn window_start(window: Window, tz: Tz, at: DateTime<Utc>) -> (DateTime<Utc>, bool) {
    match window {
        Window::Rolling(d) => (
            at.checked_sub_signed(d).unwrap_or(if d > Duration::zero() {
                DateTime::<Utc>::MIN_UTC
            } else {
                DateTime::<Utc>::MAX_UTC
            }),
            false,
        ),
        Window::CalendarMonths(n) => {
            let first = month_first(local_date(tz, at), 1 - i64::from(n));
            match first {
                Some(first) if n > 0 => (day_start(tz, first), true),
                None if n > 0 => (DateTime::<Utc>::MIN_UTC, true),
                _ => (DateTime::<Utc>::MAX_UTC, true),
            }
        }
        Window::CalendarDays(n) => {
            let today = local_date(tz, at);
            let first = match n {
                0 => today.checked_add_days(Days::new(1)),
                n => today.checked_sub_days(Days::new(u64::from(n - 1))),
            };
            match first {
                Some(first) => (day_start(tz, first), true),
                None if n == 0 => (DateTime::<Utc>::MAX_UTC, true),
                None => (DateTime::<Utc>::MIN_UTC, true),
            }
        }
    }
}

/// The first instant at which `send` stops counting toward `window` (its
/// "relevant until"): `Rolling(d)` => `send + d`; `CalendarDays(n)` =>
/// `day_start(tz, local_date(send) + n days)`.
///
/// For every `at >= send`, `counts(window, tz, at, send)` holds iff
/// `at < expires(window, tz, send)`. Saturates to `MAX_UTC` when the instant
/// lies beyond chrono's range (the send then never stops counting within it).
pub fn expires(window: Window, tz: Tz, send: DateTime<Utc>) -> DateTime<Utc> {
    expires_checked(window, tz, send).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Whether one more send at `at` is allowed: for every rule, the number of
/// `sends` counting at `at` is < limit.
pub fn admits(rules: &[Rule], tz: Tz, at: DateTime<Utc>, sends: &[DateTime<Utc>]) -> bool {
    rules.iter().all(|rule| {
        let counting = sends
            .iter()
            .filter(|&&send| counts(rule.window, tz, at, send))
            .count();
        (counting as u64) < u64::from(rule.limit)
    })
}

/// The earliest instant t >= now at which `admits(rules, tz, t, sends)` holds,
/// assuming no further sends (sends may be unsorted, all <= now). None if
/// never (a rule with limit 0). Returns `now` itself when already admitted.
///
/// Counts only fall as time passes, so for a rule with `k` counting sends and
/// limit `L` (`k >= L`) the `(k-L+1)`-th oldest counting send must stop
/// counting: `t_rule = expires(window, tz, that send)`; the answer is the
/// maximum over all rules (and `now`). Also `None` if that instant lies
/// beyond chrono's representable range.
pub(crate) fn earliest_allowed(
    rules: &[Rule],
    tz: Tz,
    now: DateTime<Utc>,
    sends: &[DateTime<Utc>],
) -> Option<DateTime<Utc>> {
    scan(rules, tz, now, sends).0
}

/// One pass over `rules` at `now`: the earliest admitted instant (as
/// [`earliest_allowed`]) and the first rule that is full at `now` (as
/// [`admits`] would find it, one rule at a time). Each send's local date and
/// today's are computed once, however many calendar rules there are: a refused
/// job's retry time is worked out on every refusal.
fn scan(
    rules: &[Rule],
    tz: Tz,
    now: DateTime<Utc>,
    sends: &[DateTime<Utc>],
) -> (Option<DateTime<Utc>>, Option<Rule>) {
    let calendar = rules.iter().any(|r| {
        matches!(
            r.window,
            Window::CalendarDays(_) | Window::CalendarMonths(_)
        )
    });
    // (send, its local date): the date only when a calendar rule needs it
    let dated: Vec<(DateTime<Utc>, NaiveDate)> = sends
        .iter()
        .map(|&send| {
            let date = if calendar {
                local_date(tz, send)
            } else {
                NaiveDate::MIN
            };
            (send, date)
        })
        .collect();
    let today = if calendar {
        local_date(tz, now)
    } else {
        NaiveDate::MIN
    };
    let mut earliest = Some(now);
    let mut full = None;
    let mut counting: Vec<(DateTime<Utc>, NaiveDate)> = Vec::with_capacity(sends.len());
    for rule in rules {
        counting.clear();
        counting.extend(
            dated
                .iter()
                .copied()
                .filter(|&(send, date)| counts_dated(rule.window, now, today, send, date)),
        );
        if (counting.len() as u64) < u64::from(rule.limit) {
            continue;
        }
        full.get_or_insert(*rule);
        // A rule with limit 0 never admits; otherwise the (k-L+1)-th oldest
        // counting send must stop counting.
        earliest = match (earliest, rule.limit) {
            (None, _) | (_, 0) => None,
            (Some(at), limit) => {
                let index = counting.len() - limit as usize;
                let (_, &mut (must_expire, date), _) =
                    counting.select_nth_unstable_by_key(index, |&(send, _)| send);
                expiry_dated(rule.window, tz, must_expire, date).map(|e| at.max(e))
            }
        };
    }
    (earliest, full)
}

/// Milliseconds since the epoch (Redis time, as the scripts answer it) as an
/// instant; out of range saturates at the latest instant chrono holds.
pub fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// Why and until when a job was refused, as the worker reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    /// The first instant after `now` at which every rule passes; `None`: never.
    pub retry_at: Option<DateTime<Utc>>,
    /// The first rule that is full at `now`.
    pub rule: Option<Rule>,
}

/// The refusal of a job at `now` by `rules`, given the recorded `sends` that Redis
/// answered with. The retry time is at least a millisecond after `now`, so a job
/// refused at the very instant its window turns comes back after it.
pub fn refusal(rules: &[Rule], tz: Tz, now: DateTime<Utc>, sends: &[DateTime<Utc>]) -> Refusal {
    let (earliest, rule) = scan(rules, tz, now, sends);
    let retry_at = earliest.map(|t| t.max(now + Duration::milliseconds(1)));
    Refusal { retry_at, rule }
}

/// `expires` without saturation: `None` when the instant is not representable.
fn expires_checked(window: Window, tz: Tz, send: DateTime<Utc>) -> Option<DateTime<Utc>> {
    expiry_dated(window, tz, send, date_for(window, tz, send))
}

/// [`expires_checked`] given `send`'s local date (`date`, which only calendar
/// windows read).
fn expiry_dated(
    window: Window,
    tz: Tz,
    send: DateTime<Utc>,
    date: NaiveDate,
) -> Option<DateTime<Utc>> {
    match window {
        Window::Rolling(d) => send.checked_add_signed(d),
        Window::CalendarMonths(n) => day_start_checked(tz, month_first(date, i64::from(n))?),
        Window::CalendarDays(n) => {
            day_start_checked(tz, date.checked_add_days(Days::new(u64::from(n)))?)
        }
    }
}

/// `day_start` without saturation: `None` when no representable instant has
/// a local date on or after `date` within two days of its midnight.
fn day_start_checked(tz: Tz, date: NaiveDate) -> Option<DateTime<Utc>> {
    first_reading_checked(tz, date.and_time(NaiveTime::MIN))
}

/// The first instant at which the local wall clock in `tz` reads `local` or later:
/// `local` itself where it exists (the earlier one where the clock repeats it), the
/// end of the gap where it does not. Saturates as [`day_start`] does.
pub(crate) fn first_reading(tz: Tz, local: NaiveDateTime) -> DateTime<Utc> {
    first_reading_checked(tz, local).unwrap_or(if local.year() < 1970 {
        DateTime::<Utc>::MIN_UTC
    } else {
        DateTime::<Utc>::MAX_UTC
    })
}

fn first_reading_checked(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    if let Some(start) = earliest_existing(tz, local) {
        return Some(start);
    }
    // `local` falls in a gap (or outside chrono's range). Find the first local
    // minute that exists, then the first existing second before it: zone offsets
    // and transitions are whole seconds, so that second is the exact end of the
    // gap. Gaps are 30 min to 1 h in practice; the scan allows up to two days so
    // that even a skipped date ends the gap.
    const SCAN_MINUTES: i64 = 48 * 60;
    for minute in 1..=SCAN_MINUTES {
        let Some(later) = local.checked_add_signed(Duration::minutes(minute)) else {
            break;
        };
        if let Some(found) = earliest_existing(tz, later) {
            for second in (1..=59).rev() {
                let candidate = later - Duration::seconds(second);
                if let Some(earlier) = earliest_existing(tz, candidate) {
                    return Some(earlier);
                }
            }
            return Some(found);
        }
    }
    None
}

/// The earliest instant at which the local wall clock in `tz` reads `local`,
/// if any.
fn earliest_existing(tz: Tz, local: NaiveDateTime) -> Option<DateTime<Utc>> {
    match tz.from_local_datetime(&local) {
        LocalResult::Single(t) => Some(t.with_timezone(&Utc)),
        LocalResult::Ambiguous(a, b) => Some(a.with_timezone(&Utc).min(b.with_timezone(&Utc))),
        LocalResult::None => None,
    }
}

#[cfg(test)]
mod tests;
