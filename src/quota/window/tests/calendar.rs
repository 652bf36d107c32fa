//! The tzdb facts the tests rely on, and the calendar at its edges: day starts and
//! next day starts across DST gaps and overlaps, whole dates skipped, extreme dates.

use chrono::{DateTime, Duration, FixedOffset, LocalResult, NaiveDate, TimeZone, Utc};
use chrono_tz::{America, Asia, Australia, Europe, Tz};

use super::{hm, hours, ms, offset_at, utc, ymd};
use crate::quota::window::{
    counts, day_start, earliest_allowed, expires, local_date, next_day_start, window_start, Rule,
    Window,
};

/// The tzdb facts the other tests rely on: the UTC offset just before and
/// at each transition instant (as shipped in chrono-tz 0.10).
#[test]
fn tzdb_facts() {
    // (zone, transition instant, offset just before, offset from then on)
    #[rustfmt::skip]
    let cases: &[(Tz, DateTime<Utc>, FixedOffset, FixedOffset)] = &[
        // Europe/Paris spring forward 02:00 CET -> 03:00 CEST.
        (Europe::Paris, utc(2026, 3, 29, 1, 0, 0), hours(1), hours(2)),
        // Europe/Paris fall back 03:00 CEST -> 02:00 CET.
        (Europe::Paris, utc(2026, 10, 25, 1, 0, 0), hours(2), hours(1)),
        // America/Santiago: 2022-09-11 00:00 -04 -> 01:00 -03 (midnight skipped).
        (America::Santiago, utc(2022, 9, 11, 4, 0, 0), hours(-4), hours(-3)),
        // America/Santiago: 2022-04-03 00:00 -03 -> 2022-04-02 23:00 -04.
        (America::Santiago, utc(2022, 4, 3, 3, 0, 0), hours(-3), hours(-4)),
        // America/Havana: 2022-03-13 00:00 CST -> 01:00 CDT (midnight skipped).
        (America::Havana, utc(2022, 3, 13, 5, 0, 0), hours(-5), hours(-4)),
        // America/Havana: 2022-11-06 01:00 CDT -> 00:00 CST (midnight twice).
        (America::Havana, utc(2022, 11, 6, 5, 0, 0), hours(-4), hours(-5)),
        // Asia/Beirut: 2023-03-26 00:00 EET -> 01:00 EEST (midnight skipped).
        (Asia::Beirut, utc(2023, 3, 25, 22, 0, 0), hours(2), hours(3)),
        // Australia/Lord_Howe: 2026-10-04 02:00 +10:30 -> 02:30 +11.
        (Australia::Lord_Howe, utc(2026, 10, 3, 15, 30, 0), hm(10, 30), hours(11)),
        // Australia/Lord_Howe: 2026-04-05 02:00 +11 -> 01:30 +10:30.
        (Australia::Lord_Howe, utc(2026, 4, 4, 15, 0, 0), hours(11), hm(10, 30)),
    ];
    for &(tz, transition, before, after) in cases {
        assert_eq!(
            offset_at(tz, transition - ms(1)),
            before,
            "{tz} before {transition}"
        );
        assert_eq!(offset_at(tz, transition), after, "{tz} at {transition}");
    }
    assert_eq!(
        offset_at(Asia::Kathmandu, utc(2026, 5, 10, 0, 0, 0)),
        hm(5, 45)
    );
    assert_eq!(
        offset_at(Asia::Shanghai, utc(2026, 5, 10, 0, 0, 0)),
        hours(8)
    );
    // Santiago's April fall-back repeats 23:00-24:00 of the previous day:
    // the following midnight itself exists exactly once.
    let santiago = America::Santiago;
    assert!(matches!(
        santiago.from_local_datetime(&ymd(2022, 4, 3).and_hms_opt(0, 0, 0).unwrap()),
        LocalResult::Single(_)
    ));
    assert!(matches!(
        santiago.from_local_datetime(&ymd(2022, 4, 2).and_hms_opt(23, 30, 0).unwrap()),
        LocalResult::Ambiguous(_, _)
    ));
    // Havana's November fall-back really doubles midnight.
    assert!(matches!(
        America::Havana.from_local_datetime(&ymd(2022, 11, 6).and_hms_opt(0, 0, 0).unwrap()),
        LocalResult::Ambiguous(_, _)
    ));
}

#[test]
fn day_start_and_next_day_start() {
    // (zone, date, expected start (UTC), expected start of the next date (UTC), hours in the day)
    type Case = (Tz, NaiveDate, DateTime<Utc>, DateTime<Utc>, f64);
    #[rustfmt::skip]
    let cases: &[Case] = &[
        (Tz::UTC, ymd(2026, 5, 10), utc(2026, 5, 10, 0, 0, 0), utc(2026, 5, 11, 0, 0, 0), 24.0),
        (Asia::Shanghai, ymd(2026, 5, 10), utc(2026, 5, 9, 16, 0, 0), utc(2026, 5, 10, 16, 0, 0), 24.0),
        // 23-hour and 25-hour days.
        (Europe::Paris, ymd(2026, 3, 29), utc(2026, 3, 28, 23, 0, 0), utc(2026, 3, 29, 22, 0, 0), 23.0),
        (Europe::Paris, ymd(2026, 10, 25), utc(2026, 10, 24, 22, 0, 0), utc(2026, 10, 25, 23, 0, 0), 25.0),
        // Midnight skipped: the day starts at 01:00 -03.
        (America::Santiago, ymd(2022, 9, 11), utc(2022, 9, 11, 4, 0, 0), utc(2022, 9, 12, 3, 0, 0), 23.0),
        // Santiago fall-back: 2022-04-02 has 25 hours (23:00-24:00 twice),
        // and 2022-04-03 starts at its single midnight, 00:00 -04.
        (America::Santiago, ymd(2022, 4, 2), utc(2022, 4, 2, 3, 0, 0), utc(2022, 4, 3, 4, 0, 0), 25.0),
        (America::Santiago, ymd(2022, 4, 3), utc(2022, 4, 3, 4, 0, 0), utc(2022, 4, 4, 4, 0, 0), 24.0),
        // Midnight skipped: the day starts at 01:00 CDT.
        (America::Havana, ymd(2022, 3, 13), utc(2022, 3, 13, 5, 0, 0), utc(2022, 3, 14, 4, 0, 0), 23.0),
        // Midnight doubled: the day starts at the earlier one, 00:00 CDT.
        (America::Havana, ymd(2022, 11, 6), utc(2022, 11, 6, 4, 0, 0), utc(2022, 11, 7, 5, 0, 0), 25.0),
        // Midnight skipped: the day starts at 01:00 EEST.
        (Asia::Beirut, ymd(2023, 3, 26), utc(2023, 3, 25, 22, 0, 0), utc(2023, 3, 26, 21, 0, 0), 23.0),
        (Asia::Kathmandu, ymd(2026, 5, 10), utc(2026, 5, 9, 18, 15, 0), utc(2026, 5, 10, 18, 15, 0), 24.0),
        // 30-minute DST changes.
        (Australia::Lord_Howe, ymd(2026, 10, 4), utc(2026, 10, 3, 13, 30, 0), utc(2026, 10, 4, 13, 0, 0), 23.5),
        (Australia::Lord_Howe, ymd(2026, 4, 5), utc(2026, 4, 4, 13, 0, 0), utc(2026, 4, 5, 13, 30, 0), 24.5),
        // Leap day.
        (Tz::UTC, ymd(2028, 2, 29), utc(2028, 2, 29, 0, 0, 0), utc(2028, 3, 1, 0, 0, 0), 24.0),
        (America::New_York, ymd(2028, 2, 29), utc(2028, 2, 29, 5, 0, 0), utc(2028, 3, 1, 5, 0, 0), 24.0),
    ];
    for &(tz, date, start, next, day_hours) in cases {
        assert_eq!(day_start(tz, date), start, "day_start({tz}, {date})");
        // It is the first instant of the date.
        assert_eq!(local_date(tz, start), date, "{tz} {date}");
        assert_eq!(
            local_date(tz, start - ms(1)),
            date.pred_opt().unwrap(),
            "{tz} {date}"
        );
        // next_day_start from anywhere in the day.
        let last = next - ms(1);
        for at in [start, start + (last - start) / 2, last] {
            assert_eq!(local_date(tz, at), date, "{tz} {at}");
            assert_eq!(next_day_start(tz, at), next, "next_day_start({tz}, {at})");
        }
        assert_eq!(
            day_start(tz, date.succ_opt().unwrap()),
            next,
            "{tz} {date} + 1"
        );
        let length = (next - start).num_minutes() as f64 / 60.0;
        assert_eq!(length, day_hours, "length of {date} in {tz}");
    }
}

#[test]
fn whole_date_skipped_starts_at_next_existing_date() {
    // Pacific/Apia skipped 2011-12-30 when it crossed the date line.
    let apia = chrono_tz::Pacific::Apia;
    let start_31 = day_start(apia, ymd(2011, 12, 31));
    assert_eq!(start_31, utc(2011, 12, 30, 10, 0, 0));
    assert_eq!(day_start(apia, ymd(2011, 12, 30)), start_31);
    assert_eq!(next_day_start(apia, start_31 - ms(1)), start_31);
}

#[test]
fn extreme_dates_do_not_panic() {
    let zones = [
        Tz::UTC,
        Asia::Kathmandu,
        America::New_York,
        chrono_tz::Pacific::Kiritimati,
    ];
    for tz in zones {
        for at in [DateTime::<Utc>::MIN_UTC, DateTime::<Utc>::MAX_UTC] {
            let _ = local_date(tz, at);
            let _ = next_day_start(tz, at);
            for window in [
                Window::CalendarDays(u32::MAX),
                Window::Rolling(Duration::days(1)),
            ] {
                let _ = window_start(window, tz, at);
                let _ = expires(window, tz, at);
                let _ = counts(window, tz, at, at);
            }
        }
        for date in [NaiveDate::MIN, NaiveDate::MAX] {
            let _ = day_start(tz, date);
        }
    }
    // A window too long to ever expire within chrono's range.
    let rules = [Rule {
        limit: 1,
        window: Window::CalendarDays(u32::MAX),
    }];
    let now = utc(2026, 1, 1, 0, 0, 0);
    assert_eq!(earliest_allowed(&rules, Tz::UTC, now, &[now]), None);
    assert_eq!(
        expires(rules[0].window, Tz::UTC, now),
        DateTime::<Utc>::MAX_UTC
    );
    assert_eq!(
        window_start(rules[0].window, Tz::UTC, now),
        (DateTime::<Utc>::MIN_UTC, true)
    );
}
