//! Tables of sends to what the windows count: a refusal and the rule it names,
//! counts, window starts and expiries, and the earliest allowed instant.

use chrono::{DateTime, Duration, Utc};
use chrono_tz::{America, Europe, Tz};

use super::{local, ms, utc, ymd, DAILY_AND_WEEKLY, DAY, WEEK};
use crate::quota::window::{
    admits, counts, day_start, earliest_allowed, expires, refusal, window_start, Refusal, Rule,
    Window,
};

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
