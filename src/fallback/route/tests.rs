use chrono::{TimeZone, Utc};
use chrono_tz::Tz;

use super::{moves_on, unknown_channel, Routed};
use crate::admission::Admission;
use crate::decide::DeadLetter;
use crate::fallback::spec::{Cause, FallbackSpec};
use crate::job::Reason;
use crate::preferences::set::OptOut;
use crate::quota::policy::{Action, Policy};
use crate::quota::suppression::{Kind, Suppression};

fn policy() -> Policy {
    crate::decide::tests::policy()
}

fn refused(hours: i64, spanning: bool) -> Admission {
    Admission::Refused {
        retry_at: Some(now() + chrono::Duration::hours(hours)),
        action: Action::Delay,
        policy: "default".into(),
        rule: None,
        seen: 1,
        quiet: None,
        spanning,
    }
}

fn now() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap()
}

#[test]
fn what_moves_a_step_on() {
    let p = policy();
    let spec = FallbackSpec::default();
    let on =
        |a: &Admission, spec: &FallbackSpec| moves_on(a, &p, spec, Tz::UTC, now()).map(|(c, _)| c);
    assert_eq!(
        on(&Admission::OptedOut(OptOut::Channel), &spec),
        Some(Cause::OptedOut)
    );
    let s = Suppression {
        kind: Kind::Bounced,
        since: now(),
        until: None,
    };
    assert_eq!(
        on(&Admission::Suppressed(s), &spec),
        Some(Cause::Suppressed)
    );
    assert_eq!(
        on(&refused(1, false), &spec),
        Some(Cause::Capped),
        "the channel's own"
    );
    assert_eq!(
        on(&refused(1, true), &spec),
        None,
        "a rule across channels holds it"
    );
    assert_eq!(on(&Admission::Duplicate, &spec), None);
    let patient = FallbackSpec {
        wait_at_most: chrono::Duration::hours(2),
        ..FallbackSpec::default()
    };
    assert_eq!(
        on(&refused(1, false), &patient),
        None,
        "within wait_at_most"
    );
    assert_eq!(
        on(&refused(3, false), &patient),
        Some(Cause::Capped),
        "beyond it"
    );
    let only_capped = FallbackSpec {
        on: vec![Cause::Capped],
        ..FallbackSpec::default()
    };
    assert_eq!(
        on(&Admission::OptedOut(OptOut::Channel), &only_capped),
        None
    );
}

#[test]
fn a_capped_step_says_why_in_the_recipients_zone() {
    let p = policy();
    let paris: Tz = "Europe/Paris".parse().unwrap();
    let (_, why) = moves_on(
        &refused(15, false),
        &p,
        &FallbackSpec::default(),
        paris,
        now(),
    )
    .unwrap();
    assert_eq!(
        why,
        "capped (policy `default` (no rule passes) until 2026-12-02T01:00:00+01:00)"
    );
}

#[test]
fn a_steps_headers_and_the_dead_letter_of_a_route_gone() {
    let second = Routed {
        step: 1,
        of: 3,
        from: Some("push: opted_out".into()),
        gone: None,
        next: None,
    };
    let h: Vec<(&str, String)> = second
        .headers("email")
        .into_iter()
        .map(|(k, v)| (k, v.into_owned()))
        .collect();
    assert_eq!(
        h,
        [
            ("x-notify-channel", "email".to_string()),
            ("x-notify-route", "2/3".to_string()),
            ("x-notify-fallback-from", "push: opted_out".to_string()),
        ]
    );
    let first = DeadLetter {
        reason: Reason::OptedOut,
        detail: "channel push".into(),
    };
    let gone = Routed {
        step: 0,
        of: 2,
        from: None,
        gone: Some("push: opted_out; sms: opted_out".into()),
        next: None,
    };
    let dead = gone.dead_letter(first);
    assert_eq!(
        (dead.reason, dead.detail.as_str()),
        (Reason::OptedOut, "push: opted_out; sms: opted_out")
    );
    let known = ["push".to_string(), "email".to_string()];
    assert!(unknown_channel(&["email".into()], &known).is_none());
    let dead = unknown_channel(&["email".into(), "fax".into()], &known).unwrap();
    assert_eq!(dead.reason, Reason::UnknownChannel);
}
