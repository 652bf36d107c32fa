//! The decision as a table: every admission and expiry to its outcome. Its fixtures
//! (a job, a policy, its context, a time of day) serve the other decision tests too.

use super::*;
use crate::admission::decision::after_admission;
use crate::quota::window::Window;
use chrono::TimeZone;
use chrono_tz::Tz;

pub(super) fn at(h: u32, m: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 1, h, m, 0).unwrap()
}

pub(super) fn job(expires_at: Option<DateTime<Utc>>) -> Job<'static> {
    Job {
        id: "j1".into(),
        recipient: "r".into(),
        channel: "sms".into(),
        category: "default".into(),
        tz: Tz::UTC,
        expires_at,
        not_before: None,
        collapse_key: None,
        priority: None,
        tenant: None,
        digest_key: None,
        fallback: None,
        sender: None,
        cost: None,
    }
}

pub(crate) fn policy() -> Policy {
    Policy {
        name: "default".into(),
        rules: daily().into_iter().collect(),
        scope: Default::default(),
        action: Action::Delay,
        send_windows: None,
        ignore_channel_windows: false,
        max_wait: None,
        mode: Mode::Enforce,
        priority: Default::default(),
        suppressed_by: crate::quota::suppression::Kinds::ALL,
        caps: Default::default(),
        required: false,
        digest: None,
        fallback: Default::default(),
    }
}

pub(super) fn cx(policy: &Policy) -> Context<'_> {
    Context {
        policy,
        channel_windows: None,
        first_seen: at(10, 0),
    }
}

fn windows(text: &[&str]) -> SendWindows {
    SendWindows::new(text.iter().map(|o| o.parse().unwrap()).collect())
}

fn daily() -> Option<Rule> {
    Some(Rule {
        limit: 1,
        window: Window::CalendarDays(1),
    })
}

fn refused(retry_at: Option<DateTime<Utc>>, action: Action) -> Admission {
    Admission::Refused {
        retry_at,
        action,
        policy: "default".into(),
        rule: daily(),
        seen: 1,
        quiet: None,
        spanning: true,
    }
}

fn reason(d: &Decision) -> Option<Reason> {
    match d {
        Decision::Dead(d) | Decision::ReleaseThenDead(_, d) => Some(d.reason),
        _ => None,
    }
}

#[test]
fn each_admission_leads_to_its_decision() {
    let ticket = Ticket::for_tests(at(10, 0));
    let now = at(10, 0);
    let cap = DelayCause::Cap {
        policy: "default".into(),
        rule: daily(),
        seen: 1,
        quiet: false,
    };
    #[rustfmt::skip]
    let table: Vec<(Option<DateTime<Utc>>, Admission, Decision)> = vec![
        // admitted: dispatch, unless it expired while its channel paced it
        (None, Admission::Admitted(ticket.clone()), Decision::Dispatch(ticket.clone())),
        (Some(at(11, 0)), Admission::Admitted(ticket.clone()), Decision::Dispatch(ticket.clone())),
        (Some(at(10, 0)), Admission::Admitted(ticket.clone()), Decision::ReleaseThenDead(
            ticket.clone(), DeadLetter { reason: Reason::Expired,
            detail: "it expired at 2026-03-01T10:00:00+00:00 while waiting for the channel's send rate".into() })),
        // refused by a cap: wait for the retry time, unless it expires first
        (None, refused(Some(at(23, 0)), Action::Delay), Decision::Delay { until: at(23, 0), cause: cap.clone() }),
        (Some(at(23, 0)), refused(Some(at(23, 0)), Action::Delay), Decision::Delay { until: at(23, 0), cause: cap.clone() }),
        (Some(at(22, 59)), refused(Some(at(23, 0)), Action::Delay), dead(Reason::Expired,
            "policy `default` (at most 1 per 1d) allows it next at 2026-03-01T23:00:00+00:00, after it expires at 2026-03-01T22:59:00+00:00".into())),
        // refused for good, or by a policy that drops
        (None, refused(None, Action::Delay), dead(Reason::Capped, "policy `default` can never admit it (at most 1 per 1d)".into())),
        (None, refused(Some(at(23, 0)), Action::Drop), dead(Reason::Capped,
            "policy `default` refused it (at most 1 per 1d) and drops refused jobs; next allowed 2026-03-01T23:00:00+00:00".into())),
        // another worker's reservation; a duplicate
        (None, Admission::Reserved { retry_at: at(10, 2) }, Decision::Delay { until: at(10, 2), cause: DelayCause::Reserved }),
        (Some(at(9, 0)), Admission::Duplicate, Decision::Duplicate),
    ];
    for (expires, admission, expected) in table {
        let shown = format!("{admission:?} expiring {expires:?}");
        let p = policy();
        assert_eq!(
            after_admission(&job(expires), &cx(&p), admission, now),
            expected,
            "{shown}"
        );
    }
}

#[test]
fn triage_catches_what_needs_no_redis() {
    let channels = vec!["email".to_string(), "sms".to_string()];
    let now = at(10, 0);
    let with = |channel: &'static str, expires_at| Job {
        channel: channel.into(),
        ..job(expires_at)
    };
    assert_eq!(triage(&with("sms", None), &channels, now), None);
    assert_eq!(
        triage(&with("email", Some(at(10, 1))), &channels, now),
        None
    );
    assert_eq!(
        triage(&with("fax", None), &channels, now),
        Some(dead(
            Reason::UnknownChannel,
            "channel `fax` is not configured (configured: email, sms)".into()
        ))
    );
    let expired = triage(&with("sms", Some(now)), &channels, now);
    assert_eq!(expired.as_ref().and_then(reason), Some(Reason::Expired));
    let m = malformed(Malformed("the field `id` is missing".into()));
    assert_eq!(m.reason, Reason::Malformed);
}

#[test]
fn holds_for_schedules_and_windows_bounded_by_expiry_and_max_wait() {
    // 2026-03-01 is a Sunday
    let now = at(10, 0);
    let weekdays = windows(&["mon-fri 08:00-21:00"]);
    let sundays = windows(&["sun 09:00-12:00"]);
    let mut p = policy();
    let plain = cx(&p);
    let held = |until, cause| Some(Decision::Delay { until, cause });
    let window = |of, name: &str| DelayCause::Window {
        of,
        name: name.into(),
    };
    let scheduled = |at| Job {
        not_before: Some(at),
        ..job(None)
    };
    let monday_8 = Utc.with_ymd_and_hms(2026, 3, 2, 8, 0, 0).unwrap();

    // nothing to hold: ask Redis
    assert_eq!(hold(&job(None), &plain, now), None);
    assert_eq!(hold(&scheduled(at(9, 0)), &plain, now), None);
    assert_eq!(hold(&scheduled(now), &plain, now), None);
    // a schedule ahead: held until then, not bounded by max_wait
    p.max_wait = Some(Duration::minutes(1));
    assert_eq!(
        hold(&scheduled(at(18, 0)), &cx(&p), now),
        held(at(18, 0), DelayCause::Schedule)
    );
    let late = Job {
        expires_at: Some(at(17, 0)),
        ..scheduled(at(18, 0))
    };
    assert_eq!(
        hold(&late, &cx(&p), now).as_ref().and_then(reason),
        Some(Reason::Expired)
    );
    p.max_wait = None;
    // the channel's windows closed on a Sunday: Monday's opening
    let on_channel = Context {
        channel_windows: Some(&weekdays),
        ..cx(&p)
    };
    assert_eq!(
        hold(&job(None), &on_channel, now),
        held(monday_8, window(WindowsOf::Channel, "sms"))
    );
    // ... unless the policy ignores them
    p.ignore_channel_windows = true;
    assert_eq!(
        hold(
            &job(None),
            &Context {
                channel_windows: Some(&weekdays),
                ..cx(&p)
            },
            now
        ),
        None
    );
    p.ignore_channel_windows = false;
    // the policy's open, the channel's closed; both closed and never together
    p.send_windows = Some(sundays.clone());
    let both = Context {
        channel_windows: Some(&weekdays),
        ..cx(&p)
    };
    let never = hold(&job(None), &both, now);
    assert_eq!(never.as_ref().and_then(reason), Some(Reason::Capped));
    // the policy's windows alone: open now
    assert_eq!(hold(&job(None), &cx(&p), now), None);
    assert_eq!(
        hold(&job(None), &cx(&p), at(13, 0)),
        held(
            Utc.with_ymd_and_hms(2026, 3, 8, 9, 0, 0).unwrap(),
            window(WindowsOf::Policy, "default")
        )
    );

    // a cap's retry time at 23:00 falls outside Sunday 09:00-12:00: next Sunday's opening
    let refused_until_23 = refused(Some(at(23, 0)), Action::Delay);
    let cap = DelayCause::Cap {
        policy: "default".into(),
        rule: daily(),
        seen: 1,
        quiet: false,
    };
    assert_eq!(
        after_admission(&job(None), &cx(&p), refused_until_23.clone(), now),
        Decision::Delay {
            until: Utc.with_ymd_and_hms(2026, 3, 8, 9, 0, 0).unwrap(),
            cause: cap.clone()
        }
    );
    // ... which max_wait of 3 days refuses, naming the instant
    p.max_wait = Some(Duration::days(3));
    match after_admission(&job(None), &cx(&p), refused_until_23.clone(), now) {
        Decision::Dead(d) => {
            assert_eq!(d.reason, Reason::Capped);
            assert!(
                d.detail.contains("2026-03-08T09:00:00+00:00"),
                "{}",
                d.detail
            );
            assert!(d.detail.contains("max_wait"), "{}", d.detail);
        }
        other => panic!("{other:?}"),
    }
    // without windows, the retry time itself; max_wait counts from the first sighting
    p.send_windows = None;
    let seen_long_ago = Context {
        first_seen: at(10, 0) - Duration::days(3),
        ..cx(&p)
    };
    assert_eq!(
        after_admission(&job(None), &cx(&p), refused_until_23.clone(), now),
        Decision::Delay {
            until: at(23, 0),
            cause: cap
        }
    );
    assert_eq!(
        reason(&after_admission(
            &job(None),
            &seen_long_ago,
            refused_until_23,
            now
        )),
        Some(Reason::Capped)
    );
}

#[test]
fn causes_say_what_holds_the_job() {
    let cap = DelayCause::Cap {
        policy: "default".into(),
        rule: daily(),
        seen: 1,
        quiet: false,
    };
    assert_eq!(cap.to_string(), "policy `default` (at most 1 per 1d)");
    assert_eq!(cap.label(), "cap");
    let w = DelayCause::Window {
        of: WindowsOf::Channel,
        name: "sms".into(),
    };
    assert_eq!(w.to_string(), "the send windows of channel `sms`");
    assert_eq!(DelayCause::Schedule.label(), "schedule");
}

#[test]
fn a_cancelled_job_is_dead_cancelled_saying_when() {
    let d = cancelled(at(9, 30));
    assert_eq!(d.reason, Reason::Cancelled);
    assert_eq!(d.reason.as_str(), "cancelled");
    assert_eq!(
        d.detail,
        "cancelled by an operator at 2026-03-01T09:30:00+00:00"
    );
}

#[test]
fn a_shadow_policy_holds_nothing_and_says_what_it_would_have_done() {
    let ticket = Ticket::for_tests(at(10, 0));
    let now = at(10, 0);
    let shadowed = |retry_at, action| Admission::Shadowed {
        ticket: ticket.clone(),
        retry_at,
        action,
        rule: daily(),
        seen: 1,
    };
    let mut p = policy();
    p.mode = Mode::Shadow;
    p.max_wait = Some(Duration::hours(6));
    let c = cx(&p);
    let j = job(None);
    use ShadowVerdict::*;
    #[rustfmt::skip]
    let table = [
        (Admission::Admitted(ticket.clone()), Some(Allowed)),
        // its caps would hold it till 15:00, inside max_wait (6 h from 10:00)
        (shadowed(Some(at(15, 0)), Action::Delay), Some(HeldCap)),
        // ... or till 17:00, past max_wait; or never; or its action drops
        (shadowed(Some(at(17, 0)), Action::Delay), Some(Dead)),
        (shadowed(None, Action::Delay), Some(Dead)),
        (shadowed(Some(at(15, 0)), Action::Drop), Some(Dead)),
        // no verdict without an admission
        (Admission::Duplicate, None),
        (Admission::Reserved { retry_at: at(10, 2) }, None),
    ];
    for (admission, verdict) in table {
        let shown = format!("{admission:?}");
        assert_eq!(shadow(&j, &c, &admission, now), verdict, "{shown}");
        // whatever the verdict, a shadowed or admitted job is dispatched
        if matches!(
            admission,
            Admission::Admitted(_) | Admission::Shadowed { .. }
        ) {
            assert_eq!(
                after_admission(&j, &c, admission, now),
                Decision::Dispatch(ticket.clone())
            );
        }
    }

    // its windows hold nothing either, and are its verdict when closed
    p.send_windows = Some(windows(&["daily 12:00-13:00"]));
    let c = cx(&p);
    assert_eq!(
        hold(&j, &c, now),
        None,
        "a shadow policy's window holds nothing"
    );
    let admitted = Admission::Admitted(ticket.clone());
    assert_eq!(shadow(&j, &c, &admitted, now), Some(HeldWindow));
    assert_eq!(shadow(&j, &c, &admitted, at(12, 30)), Some(Allowed));
    // the channel's windows are still enforced for its jobs
    let sms = windows(&["daily 12:00-13:00"]);
    let c = Context {
        channel_windows: Some(&sms),
        ..cx(&p)
    };
    assert!(matches!(hold(&j, &c, now), Some(Decision::Delay { until, .. }) if until == at(12, 0)));

    // the same policy enforced holds the job instead
    p.mode = Mode::Enforce;
    let c = cx(&p);
    assert!(matches!(hold(&j, &c, now), Some(Decision::Delay { until, .. }) if until == at(12, 0)));
    assert_eq!(
        shadow(&j, &c, &admitted, now),
        None,
        "no verdict for an enforced policy"
    );
}

#[test]
fn a_refused_dispatch_backs_off_to_five_minutes() {
    let now = at(10, 0);
    let waits: Vec<i64> = [0, 1, 2, 5, 6, 60]
        .map(|attempt| (retry_refused_dispatch_at(attempt, now) - now).num_seconds())
        .to_vec();
    assert_eq!(waits, [5, 10, 20, 160, 300, 300]);
}

#[test]
fn a_cap_holds_drops_or_never_admits_naming_itself() {
    let now = at(10, 0);
    let capped = |retry_at, action| Admission::Capped {
        retry_at,
        action,
        policy: "default".into(),
        cap: "daily_total".into(),
        rule: Some(Rule {
            limit: 5,
            window: Window::CalendarDays(1),
        }),
        seen: 5,
        quiet: None,
        spanning: true,
    };
    let p = policy();
    let c = cx(&p);
    let held = after_admission(&job(None), &c, capped(Some(at(23, 0)), Action::Delay), now);
    let Decision::Delay { until, cause } = held else {
        panic!("{held:?}")
    };
    assert_eq!(until, at(23, 0));
    assert_eq!(cause.to_string(), "cap daily_total: 5 per 1d");
    assert_eq!(cause.label(), "cap");
    let dead_letter = |d: Decision| match d {
        Decision::Dead(d) => d,
        other => panic!("{other:?}"),
    };
    let dropped = dead_letter(after_admission(
        &job(None),
        &c,
        capped(Some(at(23, 0)), Action::Drop),
        now,
    ));
    assert_eq!(dropped.reason, Reason::Capped);
    assert!(
        dropped
            .detail
            .starts_with("cap daily_total: 5 per 1d refused it"),
        "{}",
        dropped.detail
    );
    let never = dead_letter(after_admission(
        &job(None),
        &c,
        capped(None, Action::Delay),
        now,
    ));
    assert_eq!(never.reason, Reason::Capped);
    // max_wait bounds a cap's hold as a policy's
    let mut p = policy();
    p.max_wait = Some(Duration::hours(1));
    let late = after_admission(
        &job(None),
        &cx(&p),
        capped(Some(at(23, 0)), Action::Delay),
        now,
    );
    assert_eq!(dead_letter(late).reason, Reason::Capped);
}

fn quiet(text: &[&str]) -> std::sync::Arc<QuietHours> {
    std::sync::Arc::new(QuietHours {
        timezone: None,
        windows: windows(text),
        allow: vec![quota_worker_producer::Priority::Urgent],
    })
}

fn delay(d: Decision) -> (DateTime<Utc>, DelayCause) {
    match d {
        Decision::Delay { until, cause } => (until, cause),
        other => panic!("{other:?}"),
    }
}

/// Refused by a daily cap until tomorrow's midnight, with quiet `hours`.
fn refused_quiet(hours: std::sync::Arc<QuietHours>) -> Admission {
    Admission::Refused {
        retry_at: Some(day2(0, 0)),
        action: Action::Delay,
        policy: "default".into(),
        rule: daily(),
        seen: 1,
        quiet: Some(hours),
        spanning: true,
    }
}

/// Whether quiet hours pushed a cap's instant.
fn pushed(cause: &DelayCause) -> bool {
    matches!(
        cause,
        DelayCause::Cap { quiet: true, .. } | DelayCause::Capped { quiet: true, .. }
    )
}

fn day2(h: u32, m: u32) -> DateTime<Utc> {
    at(h, m) + Duration::days(1)
}

#[test]
fn a_cap_instant_inside_quiet_hours_waits_to_their_end_as_one_instant() {
    let p = policy();
    let c = cx(&p);
    let now = at(15, 0);
    let refused_with = |hours: &[&str]| refused_quiet(quiet(hours));
    // the cap allows the next send at midnight, inside 22:00-07:00: held to 07:00
    let (until, cause) = delay(after_admission(
        &job(None),
        &c,
        refused_with(&["daily 22:00-07:00"]),
        now,
    ));
    assert_eq!((until, cause.label()), (day2(7, 0), "cap"));
    assert_eq!(
        cause.to_string(),
        "policy `default` (at most 1 per 1d) and the recipient's quiet_hours"
    );
    // quiet hours that do not cover the cap's instant leave it as it was
    let (until, cause) = delay(after_admission(
        &job(None),
        &c,
        refused_with(&["daily 01:00-07:00"]),
        now,
    ));
    assert_eq!((until, cause.label()), (day2(0, 0), "cap"));
    assert!(!pushed(&cause), "{cause}");
    // a cap layer as its policy
    let capped = Admission::Capped {
        retry_at: Some(day2(0, 0)),
        action: Action::Delay,
        policy: "default".into(),
        cap: "total".into(),
        rule: daily(),
        seen: 1,
        quiet: Some(quiet(&["daily 23:00-06:30"])),
        spanning: true,
    };
    let (until, cause) = delay(after_admission(&job(None), &c, capped, now));
    assert_eq!((until, cause.label()), (day2(6, 30), "cap"));
    assert!(pushed(&cause), "{cause}");
    // max_wait counts to the pushed instant
    let mut short = policy();
    short.max_wait = Some(Duration::hours(20));
    let d = after_admission(
        &job(None),
        &cx(&short),
        refused_with(&["daily 22:00-07:00"]),
        now,
    );
    assert_eq!(reason(&d), Some(Reason::Capped), "{d:?}");
}

#[test]
fn quiet_hours_and_send_windows_push_each_other_to_a_fixpoint() {
    let p = policy();
    // the channel opens at 08:30; quiet hours 22:00-07:00 and 08:00-09:00
    let open = windows(&["daily 08:30-20:00"]);
    let c = Context {
        channel_windows: Some(&open),
        ..cx(&p)
    };
    let hours = quiet(&["daily 22:00-07:00", "daily 08:00-09:00"]);
    let refused = refused_quiet(hours.clone());
    // midnight: quiet to 07:00, closed to 08:30, quiet to 09:00, open: 09:00
    let (until, cause) = delay(after_admission(&job(None), &c, refused, at(15, 0)));
    assert_eq!(until, day2(9, 0));
    assert!(pushed(&cause), "{cause}");
    // the same from quiet hours the job met now
    let quiet_now = Admission::Quiet {
        until: day2(7, 0),
        hours,
    };
    let (until, cause) = delay(after_admission(&job(None), &c, quiet_now, at(23, 0)));
    assert_eq!((until, cause.label()), (day2(9, 0), "quiet_hours"));
    // a window that opens outside them is taken as it is
    let late = windows(&["daily 10:00-20:00"]);
    let c = Context {
        channel_windows: Some(&late),
        ..cx(&p)
    };
    let refused = refused_quiet(quiet(&["daily 22:00-07:00"]));
    let (until, _) = delay(after_admission(&job(None), &c, refused, at(15, 0)));
    assert_eq!(until, day2(10, 0));
}

#[test]
fn quiet_hours_always_on_stop_after_bounded_steps() {
    let p = policy();
    let refused = refused_quiet(quiet(&["daily 00:00-24:00"]));
    // never outside them: held (decided again then), never sent, never looping
    let (until, cause) = delay(after_admission(&job(None), &cx(&p), refused, at(15, 0)));
    assert!(until > day2(0, 0), "{until}");
    assert!(pushed(&cause), "{cause}");
}
