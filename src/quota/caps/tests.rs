//! The earliest instant over several layers, against a brute-force reference: every
//! instant at which some send of some layer stops counting is a candidate, and the
//! answer is the first candidate at which every layer admits.

use super::*;
use crate::quota::window::{Rule, Window};
use chrono::{Duration, TimeZone};
use chrono_tz::{America, Australia, Europe, Pacific};
use proptest::prelude::*;

const ZONES: [Tz; 5] = [
    Tz::UTC,
    Europe::Paris,
    America::Santiago,
    Australia::Lord_Howe,
    Pacific::Apia,
];

fn ms(n: i64) -> Duration {
    Duration::milliseconds(n)
}

/// Counting written apart from `window::counts`: local dates by `with_timezone`.
fn counts(window: Window, tz: Tz, at: DateTime<Utc>, send: DateTime<Utc>) -> bool {
    if send > at {
        return false;
    }
    match window {
        Window::Rolling(d) => send > at - d,
        Window::CalendarDays(n) => {
            let day = |t: DateTime<Utc>| {
                use chrono::Datelike;
                t.with_timezone(&tz).date_naive().num_days_from_ce()
            };
            day(send) + n as i32 > day(at)
        }
        Window::CalendarMonths(n) => {
            use chrono::Datelike;
            let month = |t: DateTime<Utc>| {
                let d = t.with_timezone(&tz).date_naive();
                d.year() * 12 + d.month0() as i32
            };
            month(send) + n as i32 > month(at)
        }
    }
}

fn admits_all(layers: &[(Vec<Rule>, Vec<DateTime<Utc>>)], tz: Tz, at: DateTime<Utc>) -> bool {
    layers.iter().all(|(rules, sends)| {
        rules.iter().all(|r| {
            sends
                .iter()
                .filter(|&&s| counts(r.window, tz, at, s))
                .count()
                < r.limit as usize
        })
    })
}

/// The first instant >= now at which every layer admits, by trying every instant
/// at which anything can change.
fn brute_force(
    layers: &[(Vec<Rule>, Vec<DateTime<Utc>>)],
    tz: Tz,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let mut candidates = vec![now];
    for (rules, sends) in layers {
        for r in rules {
            for &s in sends {
                let end = match r.window {
                    Window::Rolling(d) => s + d,
                    // (never generated here; the window's own answer)
                    Window::CalendarMonths(_) => window::expires(r.window, tz, s),
                    Window::CalendarDays(n) => {
                        let date = s.with_timezone(&tz).date_naive() + chrono::Days::new(n as u64);
                        // the first instant whose local date is `date` or later:
                        // hours forward, then a bisection over whole milliseconds
                        let local =
                            |ms: i64| window::from_millis(ms).with_timezone(&tz).date_naive();
                        let mut hi = s.timestamp_millis();
                        while local(hi) < date {
                            hi += 3_600_000;
                        }
                        let mut lo = hi - 3_600_000;
                        while hi - lo > 1 {
                            let mid = lo + (hi - lo) / 2;
                            if local(mid) >= date {
                                hi = mid;
                            } else {
                                lo = mid;
                            }
                        }
                        window::from_millis(hi)
                    }
                };
                candidates.push(end);
            }
        }
    }
    candidates.sort();
    candidates
        .into_iter()
        .filter(|&t| t >= now)
        .find(|&t| admits_all(layers, tz, t))
}

fn rule(limit: u32, window: Window) -> Rule {
    Rule { limit, window }
}

#[test]
fn a_daily_cap_and_a_weekly_cap_hold_until_the_later_of_the_two() {
    let tz = Europe::Paris;
    let at = |d, h| Utc.with_ymd_and_hms(2026, 3, d, h, 0, 0).unwrap();
    let now = at(4, 10);
    // the policy: 1 a day (a send today at 08:00); the cap: 2 a week (sends on the
    // 1st and today): the policy allows tomorrow, the cap on the 8th (Paris midnight)
    let policy = [rule(1, Window::CalendarDays(1))];
    let cap = [rule(2, Window::CalendarDays(7))];
    let today = [at(4, 8)];
    let week = [at(1, 9), at(4, 8)];
    let r = refusal(&[(&policy, &today), (&cap, &week)], tz, now);
    assert_eq!(r.layer, 1);
    assert_eq!(r.rule, Some(cap[0]));
    assert_eq!(
        r.retry_at,
        Some(Utc.with_ymd_and_hms(2026, 3, 7, 23, 0, 0).unwrap())
    );
    // without the cap's first send, the policy holds until tomorrow
    let r = refusal(&[(&policy, &today), (&cap, &week[1..])], tz, now);
    assert_eq!((r.layer, r.rule), (0, Some(policy[0])));
    assert_eq!(
        r.retry_at,
        Some(Utc.with_ymd_and_hms(2026, 3, 4, 23, 0, 0).unwrap())
    );
    // a limit of 0 anywhere: never
    let zero = [rule(0, Window::CalendarDays(1))];
    let r = refusal(&[(&policy, &today), (&zero, &[])], tz, now);
    assert_eq!((r.retry_at, r.layer), (None, 1));
    // the same instant in two layers: the first names it
    let r = refusal(&[(&policy, &today), (&policy, &today)], tz, now);
    assert_eq!(r.layer, 0);
}

#[test]
fn a_cap_matches_by_channel_category_and_tenant() {
    let mut cap = Cap {
        name: "c".into(),
        rules: vec![],
        scope: Scope::Recipient,
        mode: Mode::Enforce,
        channels: None,
        categories: None,
        tenants: None,
    };
    assert!(cap.matches("sms", "promo", None));
    assert!(cap.matches("sms", "promo", Some("acme")));
    cap.channels = Some(vec!["sms".into()]);
    assert!(cap.matches("sms", "promo", None));
    assert!(!cap.matches("email", "promo", None));
    cap.categories = Some(vec!["promo".into(), "news".into()]);
    assert!(cap.matches("sms", "news", None));
    assert!(!cap.matches("sms", "default", None));
    cap.tenants = Some(vec!["acme".into()]);
    assert!(!cap.matches("sms", "news", None));
    assert!(cap.matches("sms", "news", Some("acme")));
    assert!(!cap.matches("sms", "news", Some("other")));
    assert_eq!(
        Cap::describe("daily_total", Some(rule(5, Window::CalendarDays(1)))),
        "cap daily_total: 5 per 1d"
    );
}

fn window_choice() -> impl Strategy<Value = Window> {
    prop::sample::select(vec![
        Window::CalendarDays(1),
        Window::CalendarDays(2),
        Window::CalendarDays(7),
        Window::Rolling(Duration::minutes(90)),
        Window::Rolling(Duration::hours(24)),
    ])
}

fn layer() -> impl Strategy<Value = (Vec<Rule>, Vec<i64>)> {
    (
        prop::collection::vec((1u32..=3, window_choice()), 1..=2),
        prop::collection::vec(
            prop_oneof![0i64..10_000, 0i64..86_400_000, 0i64..864_000_000],
            0..8,
        ),
    )
        .prop_map(|(rules, ages)| (rules.into_iter().map(|(l, w)| rule(l, w)).collect(), ages))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_earliest_instant_over_layers_is_the_brute_forces(
        zone in 0usize..ZONES.len(),
        now_ms in 1_640_995_200_000i64..1_830_000_000_000,
        layers in prop::collection::vec(layer(), 1..=3),
    ) {
        let tz = ZONES[zone];
        let now = window::from_millis(now_ms);
        let layers: Vec<(Vec<Rule>, Vec<DateTime<Utc>>)> = layers
            .into_iter()
            .map(|(rules, ages)| (rules, ages.into_iter().map(|a| now - ms(a)).collect()))
            .collect();
        let view: Vec<(&[Rule], &[DateTime<Utc>])> =
            layers.iter().map(|(r, s)| (r.as_slice(), s.as_slice())).collect();
        let expected = brute_force(&layers, tz, now);
        prop_assert_eq!(earliest(&view, tz, now), expected);
        let t = expected.expect("limits are >= 1");
        prop_assert!(admits_all(&layers, tz, t));
        if t > now {
            prop_assert!(!admits_all(&layers, tz, t - ms(1)), "admitted before {}", t);
            let r = refusal(&view, tz, now);
            prop_assert_eq!(r.retry_at, Some(t));
            // the layer named holds on its own until that instant
            let (rules, sends) = view[r.layer];
            prop_assert_eq!(window::earliest_allowed(rules, tz, now, sends), Some(t));
        }
    }
}
