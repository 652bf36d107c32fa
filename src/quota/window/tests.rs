//! Tests of the calendar arithmetic: real tzdb edge cases in tables, and property
//! tests against a brute-force reference.

use super::*;
use chrono::FixedOffset;
use chrono_tz::{America, Asia, Australia, Europe};
use proptest::prelude::*;

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

/// The tzdb facts the other tests rely on: the UTC offset just before and
/// at each transition instant (as shipped in chrono-tz 0.10).
#[test]
fn a_refusal_names_the_full_rule_and_the_instant_every_rule_passes() {
    let rules = [
        Rule {
            limit: 1,
            window: Window::CalendarDays(1),
        },
        Rule {
            limit: 3,
            window: Window::CalendarDays(7),
        },
    ];
    let tz = Tz::Asia__Kathmandu;
    let now = local(tz, 2026, 3, 4, 20, 0, 0);
    // one send today: the daily rule is full; the weekly one is not
    let today = [local(tz, 2026, 3, 4, 9, 0, 0)];
    assert_eq!(
        refusal(&rules, tz, now, &today),
        Refusal {
            retry_at: Some(local(tz, 2026, 3, 5, 0, 0, 0)),
            rule: Some(rules[0])
        }
    );
    // three sends this week, none today: the weekly rule is full until the
    // oldest leaves the seven local days
    let week = [
        local(tz, 2026, 2, 27, 9, 0, 0),
        local(tz, 2026, 3, 1, 9, 0, 0),
        local(tz, 2026, 3, 2, 9, 0, 0),
    ];
    assert_eq!(
        refusal(&rules, tz, now, &week),
        Refusal {
            retry_at: Some(local(tz, 2026, 3, 6, 0, 0, 0)),
            rule: Some(rules[1])
        }
    );
    // a limit of 0: never
    let never = [Rule {
        limit: 0,
        window: Window::CalendarDays(1),
    }];
    assert_eq!(
        refusal(&never, tz, now, &[]),
        Refusal {
            retry_at: None,
            rule: Some(never[0])
        }
    );
    // refused at the very instant it passes: back a millisecond later
    let rolling = [Rule {
        limit: 1,
        window: Window::Rolling(Duration::hours(1)),
    }];
    let sent = [now - Duration::hours(1)];
    assert_eq!(
        refusal(&rolling, tz, now, &sent).retry_at,
        Some(now + ms(1))
    );
}

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

#[test]
fn counts_table() {
    let paris = Europe::Paris;
    let rolling3s = Window::Rolling(Duration::seconds(3));
    let t = utc(2026, 6, 10, 12, 0, 0);
    // (window, zone, at, send, counts)
    type Case = (Window, Tz, DateTime<Utc>, DateTime<Utc>, bool);
    #[rustfmt::skip]
    let cases: &[Case] = &[
        (rolling3s, paris, t, t, true),
        (rolling3s, paris, t, t - ms(2_999), true),
        (rolling3s, paris, t, t - ms(3_000), false),
        (rolling3s, paris, t, t + ms(1), false),
        // 23:59:59.999 local vs 00:00:00.000 local.
        (DAY, paris, local(paris, 2026, 6, 11, 0, 0, 0), local(paris, 2026, 6, 10, 23, 59, 59) + ms(999), false),
        (DAY, paris, local(paris, 2026, 6, 10, 23, 59, 59) + ms(999), local(paris, 2026, 6, 10, 0, 0, 0), true),
        (DAY, paris, local(paris, 2026, 6, 11, 23, 59, 59) + ms(999), local(paris, 2026, 6, 11, 0, 0, 0), true),
        (WEEK, paris, local(paris, 2026, 6, 10, 23, 59, 59) + ms(999), local(paris, 2026, 6, 4, 0, 0, 0), true),
        (WEEK, paris, local(paris, 2026, 6, 11, 0, 0, 0), local(paris, 2026, 6, 4, 0, 0, 0), false),
        (WEEK, paris, local(paris, 2026, 6, 10, 0, 0, 0), local(paris, 2026, 6, 3, 23, 59, 59) + ms(999), false),
        // Same UTC instants, different zones, different answers.
        (DAY, Tz::UTC, utc(2026, 6, 10, 22, 30, 0), utc(2026, 6, 10, 21, 30, 0), true),
        (DAY, paris, utc(2026, 6, 10, 22, 30, 0), utc(2026, 6, 10, 21, 30, 0), false),
        (DAY, paris, t, t + ms(1), false),
        // Degenerate windows never count.
        (Window::CalendarDays(0), paris, t, t, false),
        (Window::Rolling(Duration::zero()), paris, t, t, false),
    ];
    for &(window, tz, at, send, expected) in cases {
        assert_eq!(
            counts(window, tz, at, send),
            expected,
            "counts({window}, {tz}, {at}, {send})"
        );
    }
}

#[test]
fn window_start_and_expires_table() {
    let paris = Europe::Paris;
    let at = local(paris, 2026, 3, 30, 12, 0, 0);
    assert_eq!(
        window_start(WEEK, paris, at),
        (local(paris, 2026, 3, 24, 0, 0, 0), true)
    );
    assert_eq!(
        window_start(DAY, paris, at),
        (local(paris, 2026, 3, 30, 0, 0, 0), true)
    );
    assert_eq!(
        window_start(Window::Rolling(Duration::hours(24)), paris, at),
        (at - Duration::hours(24), false)
    );
    // Santiago: the window start lands on a skipped midnight.
    let santiago = America::Santiago;
    assert_eq!(
        window_start(
            Window::CalendarDays(2),
            santiago,
            local(santiago, 2022, 9, 12, 8, 0, 0)
        ),
        (utc(2022, 9, 11, 4, 0, 0), true)
    );

    let send = local(paris, 2026, 3, 23, 10, 0, 0);
    assert_eq!(
        expires(WEEK, paris, send),
        local(paris, 2026, 3, 30, 0, 0, 0)
    );
    assert_eq!(
        expires(DAY, paris, send),
        local(paris, 2026, 3, 24, 0, 0, 0)
    );
    assert_eq!(
        expires(Window::Rolling(Duration::minutes(90)), paris, send),
        send + Duration::minutes(90)
    );
    // Havana: the expiry lands on a doubled midnight (the earlier one).
    let havana = America::Havana;
    assert_eq!(
        expires(DAY, havana, local(havana, 2022, 11, 5, 18, 0, 0)),
        utc(2022, 11, 6, 4, 0, 0)
    );
}

#[test]
fn earliest_allowed_table() {
    let ny = America::New_York;
    let paris = Europe::Paris;
    let rolling = [Rule {
        limit: 1,
        window: Window::Rolling(Duration::seconds(3)),
    }];
    let t0 = utc(2026, 5, 4, 13, 0, 0) + ms(250);
    let zero = [
        Rule {
            limit: 0,
            window: DAY,
        },
        DAILY_AND_WEEKLY[1],
    ];
    // (name, rules, zone, now, sends, expected)
    type Case<'a> = (
        &'a str,
        &'a [Rule],
        Tz,
        DateTime<Utc>,
        Vec<DateTime<Utc>>,
        Option<DateTime<Utc>>,
    );
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        ("no sends", &DAILY_AND_WEEKLY, ny, local(ny, 2026, 5, 4, 9, 0, 0), vec![], Some(local(ny, 2026, 5, 4, 9, 0, 0))),
        (
            "second send on the same local day waits for local midnight",
            &DAILY_AND_WEEKLY,
            ny,
            local(ny, 2026, 5, 4, 18, 0, 0),
            vec![local(ny, 2026, 5, 4, 9, 0, 0)],
            Some(utc(2026, 5, 5, 4, 0, 0)),
        ),
        (
            "fourth in seven days waits for the oldest send's day + 7",
            &DAILY_AND_WEEKLY,
            ny,
            local(ny, 2026, 5, 10, 12, 0, 0),
            vec![
                local(ny, 2026, 5, 8, 11, 0, 0),
                local(ny, 2026, 5, 4, 9, 0, 0),
                local(ny, 2026, 5, 6, 10, 0, 0),
            ],
            Some(local(ny, 2026, 5, 11, 0, 0, 0)),
        ),
        (
            "sends outside the week are ignored",
            &DAILY_AND_WEEKLY,
            ny,
            local(ny, 2026, 5, 11, 0, 0, 0),
            vec![
                local(ny, 2026, 5, 8, 11, 0, 0),
                local(ny, 2026, 5, 4, 9, 0, 0),
                local(ny, 2026, 5, 6, 10, 0, 0),
            ],
            Some(local(ny, 2026, 5, 11, 0, 0, 0)),
        ),
        (
            "both rules blocking: the later instant wins",
            &DAILY_AND_WEEKLY,
            ny,
            local(ny, 2026, 5, 10, 12, 0, 0),
            vec![
                local(ny, 2026, 5, 10, 8, 0, 0),
                local(ny, 2026, 5, 7, 9, 0, 0),
                local(ny, 2026, 5, 6, 10, 0, 0),
                local(ny, 2026, 5, 4, 9, 0, 0),
            ],
            // Counting in the week at 05-10: 05-04, 05-06, 05-07, 05-10 (k=4, L=3):
            // the 2nd oldest (05-06) must expire, at 05-13 00:00.
            Some(local(ny, 2026, 5, 13, 0, 0, 0)),
        ),
        ("rolling 1 per 3s", &rolling, ny, t0 + ms(1_000), vec![t0], Some(t0 + ms(3_000))),
        ("rolling 1 per 3s, just before", &rolling, ny, t0 + ms(2_999), vec![t0], Some(t0 + ms(3_000))),
        ("rolling 1 per 3s, exactly 3s later", &rolling, ny, t0 + ms(3_000), vec![t0], Some(t0 + ms(3_000))),
        ("limit 0", &zero, ny, t0, vec![], None),
        (
            "seven days across the Paris spring-forward end at local midnight",
            &DAILY_AND_WEEKLY,
            paris,
            local(paris, 2026, 3, 28, 12, 0, 0),
            vec![
                local(paris, 2026, 3, 23, 10, 0, 0),
                local(paris, 2026, 3, 25, 10, 0, 0),
                local(paris, 2026, 3, 27, 10, 0, 0),
            ],
            // 2026-03-30 00:00 CEST, 6 days 23 hours after 2026-03-23 00:00 CET.
            Some(utc(2026, 3, 29, 22, 0, 0)),
        ),
        (
            "send at 23:59:59.999 local blocks only until 00:00:00.000",
            &DAILY_AND_WEEKLY,
            paris,
            local(paris, 2026, 6, 10, 23, 59, 59) + ms(999),
            vec![local(paris, 2026, 6, 10, 23, 59, 59) + ms(999)],
            Some(local(paris, 2026, 6, 11, 0, 0, 0)),
        ),
        (
            "send at 00:00:00.000 local blocks the whole day",
            &DAILY_AND_WEEKLY,
            paris,
            local(paris, 2026, 6, 11, 0, 0, 0),
            vec![local(paris, 2026, 6, 11, 0, 0, 0)],
            Some(local(paris, 2026, 6, 12, 0, 0, 0)),
        ),
        (
            "Santiago: next day starts at 01:00 after a skipped midnight",
            &DAILY_AND_WEEKLY,
            America::Santiago,
            utc(2022, 9, 11, 2, 0, 0),
            vec![utc(2022, 9, 10, 15, 0, 0)],
            Some(utc(2022, 9, 11, 4, 0, 0)),
        ),
    ];
    for (name, rules, tz, now, sends, expected) in cases {
        let got = earliest_allowed(rules, tz, now, &sends);
        assert_eq!(got, expected, "{name}");
        if let Some(t) = got {
            assert!(t >= now, "{name}");
            assert!(admits(rules, tz, t, &sends), "{name}: admitted at {t}");
            assert_eq!(admits(rules, tz, now, &sends), t == now, "{name}");
            if t > now {
                assert!(
                    !admits(rules, tz, t - ms(1), &sends),
                    "{name}: refused just before {t}"
                );
            }
        }
    }
    // The DST case is not "oldest send + 7 * 86400 s" nor "its midnight + 7 * 86400 s".
    let oldest = local(paris, 2026, 3, 23, 10, 0, 0);
    let got = earliest_allowed(
        &DAILY_AND_WEEKLY,
        paris,
        local(paris, 2026, 3, 28, 12, 0, 0),
        &[
            oldest,
            local(paris, 2026, 3, 25, 10, 0, 0),
            local(paris, 2026, 3, 27, 10, 0, 0),
        ],
    )
    .unwrap();
    assert_ne!(got, oldest + Duration::seconds(7 * 86_400));
    assert_ne!(
        got,
        day_start(paris, ymd(2026, 3, 23)) + Duration::seconds(7 * 86_400)
    );
}

#[test]
fn window_parse_and_display() {
    #[rustfmt::skip]
    let ok: &[(&str, Window, &str)] = &[
        ("1d", Window::CalendarDays(1), "1d"),
        ("7d", Window::CalendarDays(7), "7d"),
        ("500ms", Window::Rolling(ms(500)), "500ms"),
        ("1500ms", Window::Rolling(ms(1_500)), "1500ms"),
        ("30s", Window::Rolling(Duration::seconds(30)), "30s"),
        ("10m", Window::Rolling(Duration::minutes(10)), "10m"),
        ("90m", Window::Rolling(Duration::minutes(90)), "90m"),
        ("24h", Window::Rolling(Duration::hours(24)), "24h"),
        ("60s", Window::Rolling(Duration::minutes(1)), "1m"),
        ("3600000ms", Window::Rolling(Duration::hours(1)), "1h"),
        ("07d", Window::CalendarDays(7), "7d"),
    ];
    for &(text, window, shown) in ok {
        assert_eq!(text.parse::<Window>(), Ok(window), "{text}");
        assert_eq!(window.to_string(), shown, "{text}");
        assert_eq!(shown.parse::<Window>(), Ok(window), "{shown}");
    }
    #[rustfmt::skip]
    let bad = [
        "", "0d", "7", "3w", "-1s", "1.5h", "0ms", "0h", "d", "ms",
        " 7d", "7d ", "7 d", "+7d", "7D", "1y", "1dd", "4294967296d", "99999999999999999999999s", "9223372036854775807h",
    ];
    for text in bad {
        let err = text.parse::<Window>().expect_err(text);
        let message = err.to_string();
        assert!(message.contains(&format!("{text:?}")), "{message}");
        for form in ["\"1d\"", "\"500ms\"", "\"30s\"", "\"10m\"", "\"24h\""] {
            assert!(message.contains(form), "{message}");
        }
        let _: &dyn std::error::Error = &err;
    }
    assert_eq!(
        "4294967295d".parse::<Window>(),
        Ok(Window::CalendarDays(u32::MAX))
    );
}

const ZONES: [Tz; 8] = [
    Tz::UTC,
    Europe::Paris,
    America::Santiago,
    Asia::Kathmandu,
    Australia::Lord_Howe,
    America::Havana,
    Asia::Beirut,
    America::New_York,
];

fn window_choices() -> [Window; 6] {
    [
        Window::CalendarDays(1),
        Window::CalendarDays(2),
        Window::CalendarDays(7),
        Window::Rolling(Duration::seconds(3)),
        Window::Rolling(Duration::minutes(90)),
        Window::Rolling(Duration::hours(24)),
    ]
}

/// Counting written independently of `counts`: local dates via
/// `with_timezone` and day numbers, rolling windows via instant arithmetic.
fn reference_counts(window: Window, tz: Tz, at: DateTime<Utc>, send: DateTime<Utc>) -> bool {
    if send > at {
        return false;
    }
    match window {
        Window::Rolling(d) => send > at - d,
        Window::CalendarDays(n) => {
            let day = |t: DateTime<Utc>| t.with_timezone(&tz).date_naive().num_days_from_ce();
            day(send) + n as i32 > day(at)
        }
    }
}

fn reference_admits(rules: &[Rule], tz: Tz, at: DateTime<Utc>, sends: &[DateTime<Utc>]) -> bool {
    rules.iter().all(|r| {
        sends
            .iter()
            .filter(|&&s| reference_counts(r.window, tz, at, s))
            .count()
            < r.limit as usize
    })
}

/// A start instant (ms precision) in 2022-2027, biased towards the months
/// before DST changes of the zones under test.
fn start_instant() -> impl Strategy<Value = DateTime<Utc>> {
    (
        2022i32..=2027,
        prop::sample::select(vec![1u32, 2, 3, 3, 4, 6, 8, 9, 9, 10, 10, 12]),
        1u32..=28,
        0i64..86_400_000,
    )
        .prop_map(|(y, m, d, ms_of_day)| utc(y, m, d, 0, 0, 0) + ms(ms_of_day))
}

fn rules_strategy() -> impl Strategy<Value = Vec<Rule>> {
    prop::collection::vec((1u32..=4, 0usize..6), 1..=3).prop_map(|rules| {
        rules
            .into_iter()
            .map(|(limit, w)| Rule {
                limit,
                window: window_choices()[w],
            })
            .collect()
    })
}

/// Gaps between arrivals: a mix of bursts, hours and days (~30 days in all).
fn gaps_strategy() -> impl Strategy<Value = Vec<i64>> {
    prop::collection::vec(
        prop_oneof![0i64..5_000, 0i64..7_200_000, 0i64..172_800_000],
        1..80,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn simulation_respects_caps_and_earliest_allowed_is_exact(
        zone in 0usize..ZONES.len(),
        rules in rules_strategy(),
        start in start_instant(),
        gaps in gaps_strategy(),
    ) {
        let tz = ZONES[zone];
        let mut sends: Vec<DateTime<Utc>> = Vec::new();
        let mut a = start;
        for gap in gaps {
            a += ms(gap);
            let admitted = admits(&rules, tz, a, &sends);
            prop_assert_eq!(admitted, reference_admits(&rules, tz, a, &sends));
            let r = earliest_allowed(&rules, tz, a, &sends)
                .expect("limits are >= 1 so a send is eventually allowed");
            if admitted {
                prop_assert_eq!(r, a);
                sends.push(a);
            } else {
                prop_assert!(r > a, "refused at {} but earliest_allowed = {}", a, r);
                prop_assert!(admits(&rules, tz, r, &sends), "not admitted at {}", r);
                prop_assert!(reference_admits(&rules, tz, r, &sends));
                prop_assert!(!admits(&rules, tz, r - ms(1), &sends), "admitted before {}", r);
                prop_assert!(!reference_admits(&rules, tz, r - ms(1), &sends));
            }
        }
        // Brute force: at each recorded send, every cap holds including it.
        for &s in &sends {
            for rule in &rules {
                let n = sends.iter().filter(|&&o| reference_counts(rule.window, tz, s, o)).count();
                prop_assert!(n <= rule.limit as usize, "{} sends count at {} for {:?}", n, s, rule);
            }
        }
    }

    #[test]
    fn earliest_allowed_is_exact_for_arbitrary_history(
        zone in 0usize..ZONES.len(),
        rules in rules_strategy(),
        now in start_instant(),
        ages in prop::collection::vec(
            prop_oneof![0i64..10_000, 0i64..86_400_000, 0i64..864_000_000],
            0..20,
        ),
    ) {
        // Unsorted sends, possibly already over the limits.
        let tz = ZONES[zone];
        let sends: Vec<DateTime<Utc>> = ages.iter().map(|&age| now - ms(age)).collect();
        let r = earliest_allowed(&rules, tz, now, &sends)
            .expect("limits are >= 1 so a send is eventually allowed");
        prop_assert!(r >= now);
        prop_assert!(admits(&rules, tz, r, &sends), "not admitted at {}", r);
        prop_assert!(reference_admits(&rules, tz, r, &sends));
        prop_assert_eq!(r == now, admits(&rules, tz, now, &sends));
        if r > now {
            prop_assert!(!admits(&rules, tz, r - ms(1), &sends), "admitted before {}", r);
            prop_assert!(!reference_admits(&rules, tz, r - ms(1), &sends));
        }
    }

    #[test]
    fn a_refusal_agrees_with_admits_rule_by_rule_and_with_earliest_allowed(
        zone in 0usize..ZONES.len(),
        rules in rules_strategy(),
        now in start_instant(),
        ages in prop::collection::vec(
            prop_oneof![-5_000i64..10_000, 0i64..86_400_000, 0i64..864_000_000],
            0..20,
        ),
    ) {
        // Sends possibly after `now` (another worker's clock), which never count.
        let tz = ZONES[zone];
        let sends: Vec<DateTime<Utc>> = ages.iter().map(|&age| now - ms(age)).collect();
        let r = refusal(&rules, tz, now, &sends);
        let first_full = rules
            .iter()
            .find(|rule| !reference_admits(std::slice::from_ref(rule), tz, now, &sends))
            .copied();
        prop_assert_eq!(r.rule, first_full);
        let earliest = earliest_allowed(&rules, tz, now, &sends)
            .expect("limits are >= 1 so a send is eventually allowed");
        prop_assert_eq!(r.retry_at, Some(earliest.max(now + ms(1))));
    }

    #[test]
    fn counts_agrees_with_window_start_expires_and_reference(
        zone in 0usize..ZONES.len(),
        w in 0usize..6,
        send in start_instant(),
        delta in prop_oneof![0i64..10_000, 0i64..86_400_000, 0i64..1_000_000_000],
    ) {
        let tz = ZONES[zone];
        let window = window_choices()[w];
        let at = send + ms(delta);
        let c = counts(window, tz, at, send);
        prop_assert_eq!(c, reference_counts(window, tz, at, send));
        let (bound, inclusive) = window_start(window, tz, at);
        prop_assert_eq!(c, if inclusive { send >= bound } else { send > bound });
        prop_assert_eq!(c, at < expires(window, tz, send));
        prop_assert!(!counts(window, tz, send, at + ms(1)));
    }

    #[test]
    fn day_start_is_first_instant_of_the_date(
        zone in 0usize..ZONES.len(),
        at in start_instant(),
        extra_days in 0i64..60,
    ) {
        let tz = ZONES[zone];
        let at = at + Duration::days(extra_days);
        let date = local_date(tz, at);
        let start = day_start(tz, date);
        let next = next_day_start(tz, at);
        prop_assert!(start <= at && at < next);
        prop_assert_eq!(local_date(tz, start), date);
        prop_assert!(local_date(tz, start - ms(1)) < date);
        prop_assert_eq!(local_date(tz, next), date.succ_opt().unwrap());
        prop_assert_eq!(local_date(tz, next - ms(1)), date);
    }

    #[test]
    fn window_display_round_trips(days in 1u32.., millis in 1i64..=i64::MAX / 1_000_000) {
        let w = Window::CalendarDays(days);
        prop_assert_eq!(w.to_string().parse::<Window>(), Ok(w));
        let w = Window::Rolling(ms(millis));
        prop_assert_eq!(w.to_string().parse::<Window>(), Ok(w));
        let w = Window::Rolling(Duration::seconds(millis % 1_000_000_000 + 1));
        prop_assert_eq!(w.to_string().parse::<Window>(), Ok(w));
    }
}
