//! Property tests against a brute-force reference: whatever the arrivals, the caps
//! hold and the earliest allowed instant is exact.

use chrono::{DateTime, Datelike, Duration, Utc};
use chrono_tz::{America, Asia, Australia, Europe, Tz};
use proptest::prelude::*;

use super::{ms, utc};
use crate::quota::window::{
    admits, counts, day_start, earliest_allowed, expires, local_date, next_day_start, refusal,
    window_start, Rule, Window,
};

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
