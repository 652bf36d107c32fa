//! Tests of send windows: tzdb edge cases in a table, and a property test against a
//! brute-force reference that walks the clock minute by minute.

use super::*;
use chrono::{NaiveDateTime, TimeZone};
use chrono_tz::{America, Asia, Australia, Europe};
use proptest::prelude::*;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

fn set(openings: &[&str]) -> SendWindows {
    SendWindows::new(openings.iter().map(|o| o.parse().unwrap()).collect())
}

/// A named case: windows, zone, the instant asked about, the answer expected.
type Case = (
    &'static str,
    SendWindows,
    Tz,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

#[test]
fn next_open_table() {
    let ny = America::New_York;
    let cases: Vec<Case> = vec![
        (
            "inside: at once",
            set(&["mon-fri 08:00-21:00"]),
            ny,
            utc(2026, 11, 23, 15, 0),
            Some(utc(2026, 11, 23, 15, 0)),
        ),
        (
            "saturday waits for monday's opening in the recipient's zone",
            set(&["mon-fri 08:00-21:00"]),
            ny,
            utc(2026, 11, 21, 15, 0),
            Some(utc(2026, 11, 23, 13, 0)),
        ),
        (
            "a second opening on saturday",
            set(&["mon-fri 08:00-21:00", "sat 10:00-18:00"]),
            ny,
            utc(2026, 11, 21, 13, 0),
            Some(utc(2026, 11, 21, 15, 0)),
        ),
        (
            "the closing instant is outside",
            set(&["mon-fri 08:00-21:00"]),
            ny,
            utc(2026, 11, 24, 2, 0),
            Some(utc(2026, 11, 24, 13, 0)),
        ),
        (
            "past midnight: still open at 05:59",
            set(&["daily 22:00-06:00"]),
            ny,
            utc(2026, 11, 24, 10, 59),
            Some(utc(2026, 11, 24, 10, 59)),
        ),
        (
            "past midnight: at 06:00 it waits for 22:00",
            set(&["daily 22:00-06:00"]),
            ny,
            utc(2026, 11, 24, 11, 0),
            Some(utc(2026, 11, 25, 3, 0)),
        ),
        (
            "to 24:00 is the end of the day",
            set(&["tue 20:00-24:00"]),
            Tz::UTC,
            utc(2026, 11, 24, 23, 59),
            Some(utc(2026, 11, 24, 23, 59)),
        ),
        (
            "an opening at 02:30 on the day 02:00-03:00 does not exist opens at 03:00",
            set(&["sun 02:30-05:00"]),
            ny,
            utc(2026, 3, 8, 5, 0),
            Some(utc(2026, 3, 8, 7, 0)),
        ),
        (
            "an opening inside the gap only is empty that day: next week",
            set(&["sun 02:10-02:40"]),
            ny,
            utc(2026, 3, 8, 5, 0),
            Some(utc(2026, 3, 15, 6, 10)),
        ),
        (
            "the repeated hour: open the first time",
            set(&["sun 01:00-01:30"]),
            ny,
            utc(2026, 11, 1, 5, 15),
            Some(utc(2026, 11, 1, 5, 15)),
        ),
        (
            "the repeated hour is not a second window",
            set(&["sun 01:00-01:30"]),
            ny,
            utc(2026, 11, 1, 6, 15),
            Some(utc(2026, 11, 8, 6, 0)),
        ),
        (
            "a midnight that does not exist: the day opens at 01:00",
            set(&["sun 00:00-02:00"]),
            America::Santiago,
            utc(2026, 9, 6, 3, 0),
            Some(utc(2026, 9, 6, 4, 0)),
        ),
        (
            "no openings: never",
            SendWindows::new(vec![]),
            ny,
            utc(2026, 11, 24, 0, 0),
            None,
        ),
    ];
    for (name, windows, tz, at, want) in cases {
        assert_eq!(windows.next_open(tz, at), want, "{name}");
        assert_eq!(
            reference_next_open(&windows, tz, at),
            want,
            "{name} (reference)"
        );
        if let Some(w) = want {
            assert!(windows.contains(tz, w), "{name}: open at its answer");
            if w > at {
                assert!(
                    !windows.contains(tz, w - Duration::milliseconds(1)),
                    "{name}"
                );
            }
        }
    }
}

#[test]
fn sets_together_open_only_where_each_does() {
    let ny = America::New_York;
    let policy = set(&["mon-fri 08:00-21:00"]);
    let channel = set(&["daily 09:00-17:00"]);
    // saturday: monday 09:00, the channel's opening the later one
    let (at, closed) = next_open(&[&policy, &channel], ny, utc(2026, 11, 21, 15, 0)).unwrap();
    assert_eq!(at, utc(2026, 11, 23, 14, 0));
    assert_eq!(closed, Some(Closed { by: 1 }));
    // inside both: at once, nothing closed
    let t = utc(2026, 11, 23, 15, 0);
    assert_eq!(next_open(&[&policy, &channel], ny, t), Some((t, None)));
    // no set: at once
    assert_eq!(next_open(&[], ny, t), Some((t, None)));
    // weekdays against weekends never meet
    let weekend = set(&["sat-sun 10:00-18:00"]);
    assert_eq!(next_open(&[&policy, &weekend], ny, t), None);
    // an opening across midnight against a morning one
    let night = set(&["daily 22:00-06:00"]);
    let morning = set(&["daily 05:00-09:00"]);
    assert_eq!(
        next_open(&[&night, &morning], ny, utc(2026, 11, 23, 15, 0)).map(|x| x.0),
        Some(utc(2026, 11, 24, 10, 0))
    );
}

#[test]
fn text_forms_and_their_errors() {
    let o: Opening = "fri-mon 22:00-06:00".parse().unwrap();
    assert_eq!(o.to_string(), "mon,fri,sat,sun 22:00-06:00");
    assert_eq!(o.to_string().parse::<Opening>().unwrap(), o);
    assert_eq!(parse_days("mon,wed,fri").unwrap(), 0b0010101);
    assert_eq!(parse_days("daily").unwrap(), 0x7f);
    assert_eq!(parse_days("Sat-Sun").unwrap(), 0b1100000);
    for (days, from, to, says) in [
        ("mon-xyz", "08:00", "09:00", "`xyz`"),
        ("", "08:00", "09:00", "not a day"),
        ("mon", "8:00", "09:00", "\"8:00\""),
        ("mon", "24:00", "09:00", "\"24:00\""),
        ("mon", "08:00", "24:01", "\"24:01\""),
        ("mon", "08:60", "09:00", "\"08:60\""),
        ("mon", "08:00", "08:00", "no time"),
    ] {
        let e = Opening::parse(days, from, to).unwrap_err().to_string();
        assert!(e.contains(says), "{days} {from} {to}: {e}");
    }
}

/// The brute-force reference: walk the clock a minute at a time from two days
/// before `at`, keeping the latest local time the clock has read so far (`m`); an
/// instant is inside an opening of date `d` iff `d from <= m < d' to`. (The first
/// instant reading X or later is exactly where `m` reaches X.)
fn reference_next_open(w: &SendWindows, tz: Tz, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
    let minute = Duration::minutes(1);
    let floor =
        |t: DateTime<Utc>| t - Duration::milliseconds(t.timestamp_millis().rem_euclid(60_000));
    let mut t = floor(at) - Duration::days(2);
    let mut m: Option<NaiveDateTime> = None;
    let end = at + Duration::days(10);
    while t <= end {
        let local = tz.from_utc_datetime(&t.naive_utc()).naive_local();
        let latest = m.map_or(local, |m| m.max(local));
        m = Some(latest);
        if t >= floor(at) {
            let open = w.openings().iter().any(|o| {
                [latest.date().pred_opt().unwrap(), latest.date()]
                    .into_iter()
                    .any(|d| {
                        let at_min = |d: NaiveDate, min: u16| {
                            d.and_time(NaiveTime::MIN) + Duration::minutes(i64::from(min))
                        };
                        let close_day = if o.to > o.from {
                            d
                        } else {
                            d.succ_opt().unwrap()
                        };
                        o.on(d.weekday())
                            && at_min(d, o.from) <= latest
                            && latest < at_min(close_day, o.to)
                    })
            });
            if open {
                return Some(t.max(at));
            }
        }
        t += minute;
    }
    None
}

const ZONES: [Tz; 6] = [
    Tz::UTC,
    Europe::Paris,
    America::Santiago,
    Asia::Kathmandu,
    Australia::Lord_Howe,
    America::New_York,
];

fn opening_strategy() -> impl Strategy<Value = Opening> {
    (1u8..=0x7f, 0u16..48, 1u16..=48).prop_filter_map("empty", |(days, from, to)| {
        let (from, to) = (from * 30, to * 30);
        (from != to).then_some(Opening { days, from, to })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn next_open_agrees_with_the_reference(
        zone in 0usize..ZONES.len(),
        openings in prop::collection::vec(opening_strategy(), 1..=3),
        // whole minutes in 2026, biased towards DST changes (March, April, September to November)
        month in prop::sample::select(vec![1u32, 3, 3, 4, 9, 10, 10, 11]),
        day in 1u32..=28,
        minute in 0i64..1440,
    ) {
        let tz = ZONES[zone];
        let w = SendWindows::new(openings);
        let at = utc(2026, month, day, 0, 0) + Duration::minutes(minute);
        let got = w.next_open(tz, at);
        prop_assert_eq!(got, reference_next_open(&w, tz, at), "{} in {}", w, tz);
        let got = got.expect("a non-empty set opens within a week");
        prop_assert!(w.contains(tz, got));
        if got > at {
            prop_assert!(!w.contains(tz, got - Duration::milliseconds(1)));
        }
    }
}
