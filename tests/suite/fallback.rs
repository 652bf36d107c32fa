//! Fallback (`fallback` on a job, `[policies.NAME.fallback]`), end to end through
//! RabbitMQ and Redis: a cap of the channel alone moves the job on to its next
//! channel in the same handling, a cap that spans channels holds it on every one;
//! opted out and suppressed channels are passed over; every channel gone
//! dead-letters it with the first channel's reason and each channel's cause; an
//! unconfigured, repeated or own channel in `fallback` is a dead letter; a policy's
//! `on` and `wait_at_most` decide what moves a job on.

use std::time::Duration;

use quota_worker::config::{CapSettings, FallbackSettings, MatchSettings, RuleSettings, Settings};
use quota_worker::job::{Outcome, Reason};
use quota_worker::quota::suppression::Kind;
use quota_worker::quota::window::Window;
use serde_json::json;
use testkit::*;

fn daily(limit: u32) -> Vec<RuleSettings> {
    vec![RuleSettings {
        limit,
        window: "1d".parse::<Window>().unwrap(),
    }]
}

/// A cap of `limit` a day on `channels` (every channel when empty).
pub(crate) fn cap(limit: u32, channels: &[&str]) -> CapSettings {
    CapSettings {
        rules: daily(limit),
        matches: MatchSettings {
            channels: (!channels.is_empty())
                .then(|| channels.iter().map(|c| c.to_string()).collect()),
            ..MatchSettings::default()
        },
        ..CapSettings::default()
    }
}

/// Settings whose `default` policy has no rules of its own.
fn free(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.policies.get_mut("default").unwrap().rules.clear();
    s
}

pub(crate) fn job(id: &str, recipient: &str, channel: &str, fallback: &[&str]) -> Vec<u8> {
    json!({ "id": id, "recipient": recipient, "channel": channel, "fallback": fallback })
        .to_string()
        .into_bytes()
}

/// The dispatch of `id` on `channel`: its `x-notify-route` and
/// `x-notify-fallback-from` headers (checking `x-notify-channel` on the way).
pub(crate) async fn sent_on(
    conn: &lapin::Connection,
    s: &Settings,
    channel: &str,
    id: &str,
) -> (String, Option<String>) {
    let queue = topology(s).dispatch_queue(channel);
    let m = take(conn, &queue, Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("{id} dispatched on {channel}"));
    assert_eq!(message_id(&m), id);
    let p = &m.delivery.properties;
    assert_eq!(
        header(p, "x-notify-channel").as_deref(),
        Some(channel),
        "{id}"
    );
    let route = header(p, "x-notify-route").expect("x-notify-route");
    (route, header(p, "x-notify-fallback-from"))
}

/// The next dead letter (of `id`, a job that decoded; a malformed one has no
/// message id): its reason and detail.
async fn dead(conn: &lapin::Connection, s: &Settings, id: &str) -> (String, String) {
    let m = take(conn, &s.amqp.dead_queue, Duration::from_secs(5))
        .await
        .expect("a dead letter");
    if !message_id(&m).is_empty() {
        assert_eq!(message_id(&m), id);
    }
    let p = &m.delivery.properties;
    let reason = header(p, "x-notify-reason").unwrap_or_default();
    (reason, header(p, "x-notify-detail").unwrap_or_default())
}

async fn run(
    w: &quota_worker::worker::Worker,
    conn: &lapin::Connection,
    s: &Settings,
    body: &[u8],
) -> Outcome {
    publish(conn, s, body).await;
    step(w, conn, s).await
}

#[tokio::test]
async fn a_cap_of_the_channel_moves_on_and_a_cap_across_channels_holds_it_everywhere() {
    let ns = unique("fb-capped");
    let mut s = free(&ns);
    s.caps.insert("push_daily".into(), cap(1, &["push"]));
    s.caps.insert("total".into(), cap(2, &[]));
    let (_c, w, conn) = rig(&s).await;

    assert_eq!(
        run(&w, &conn, &s, &job("a1", "r1", "push", &["email", "sms"])).await,
        Outcome::Dispatched
    );
    assert_eq!(sent_on(&conn, &s, "push", "a1").await, ("1/3".into(), None));

    // push's own cap is full: email, in the same handling, counted there once
    assert_eq!(
        run(&w, &conn, &s, &job("a2", "r1", "push", &["email", "sms"])).await,
        Outcome::Dispatched
    );
    let (route, from) = sent_on(&conn, &s, "email", "a2").await;
    assert_eq!(route, "2/3");
    let from = from.expect("x-notify-fallback-from");
    assert!(
        from.starts_with("push: capped (cap push_daily: 1 per 1d until "),
        "{from}"
    );
    assert_eq!(depth(&conn, &topology(&s).dispatch_queue("push")).await, 0);

    // the total across channels is full too: it holds the job on every channel
    let outcome = run(&w, &conn, &s, &job("a3", "r1", "push", &["email", "sms"])).await;
    assert!(matches!(outcome, Outcome::Delayed { .. }), "{outcome:?}");
    for channel in ["push", "email", "sms"] {
        assert_eq!(
            depth(&conn, &topology(&s).dispatch_queue(channel)).await,
            0,
            "{channel}"
        );
    }
}

#[tokio::test]
async fn opted_out_and_suppressed_channels_are_passed_over_and_none_left_is_a_dead_letter() {
    let ns = unique("fb-gone");
    let s = free(&ns);
    let (_c, w, conn) = rig(&s).await;
    let store = w.store();
    quota_worker::preferences::edit::put(store, None, "r1", &json!({"channels": {"push": false}}))
        .await
        .unwrap();
    quota_worker::admin::suppressions::suppress(store, &s, "r1", "sms", Kind::Bounced)
        .await
        .unwrap();

    let outcome = run(&w, &conn, &s, &job("b1", "r1", "push", &["sms", "email"])).await;
    assert_eq!(outcome, Outcome::Dispatched);
    let (route, from) = sent_on(&conn, &s, "email", "b1").await;
    assert_eq!(route, "3/3");
    assert_eq!(from.as_deref(), Some("sms: suppressed (bounced)"));

    let outcome = run(&w, &conn, &s, &job("b2", "r1", "push", &["sms"])).await;
    assert_eq!(outcome, Outcome::Dead(Reason::OptedOut));
    let (reason, detail) = dead(&conn, &s, "b2").await;
    assert_eq!(reason, "opted_out");
    assert_eq!(detail, "push: opted_out; sms: suppressed (bounced)");

    // a job without `fallback` is dead-lettered on its channel as before
    let body = br#"{"id":"b3","recipient":"r1","channel":"push"}"#;
    assert_eq!(
        run(&w, &conn, &s, body).await,
        Outcome::Dead(Reason::OptedOut)
    );
    assert_eq!(dead(&conn, &s, "b3").await.1, "channel push");
}

#[tokio::test]
async fn a_policy_says_what_moves_a_job_on_and_how_long_a_cap_may_hold_it() {
    let ns = unique("fb-policy");
    let mut s = free(&ns);
    s.caps.insert("push_daily".into(), cap(1, &["push"]));
    s.policies
        .insert("patient".into(), s.policies["default"].clone());
    s.policies.get_mut("patient").unwrap().fallback = Some(FallbackSettings {
        on: Some(vec!["opted_out".into(), "capped".into()]),
        wait_at_most: Some(quota_worker::config::Dur(Duration::from_secs(2 * 86_400))),
        answer_within: None,
        answered_by: None,
    });
    let (_c, w, conn) = rig(&s).await;
    let with = |id: &str| {
        json!({ "id": id, "recipient": "r1", "channel": "push", "category": "patient",
            "fallback": ["email"] })
        .to_string()
        .into_bytes()
    };
    assert_eq!(run(&w, &conn, &s, &with("p1")).await, Outcome::Dispatched);
    sent_on(&conn, &s, "push", "p1").await;
    // push allows the next send within a day, less than wait_at_most: it waits
    let outcome = run(&w, &conn, &s, &with("p2")).await;
    assert!(matches!(outcome, Outcome::Delayed { .. }), "{outcome:?}");
    assert_eq!(depth(&conn, &topology(&s).dispatch_queue("email")).await, 0);
}

#[tokio::test]
async fn an_unconfigured_repeated_or_own_channel_in_fallback_is_a_dead_letter() {
    let ns = unique("fb-bad");
    let s = free(&ns);
    let (_c, w, conn) = rig(&s).await;
    let cases: [(&str, &[&str], Reason, &str); 4] = [
        ("u", &["email", "fax"], Reason::UnknownChannel, "`fax`"),
        (
            "r",
            &["email", "email"],
            Reason::Malformed,
            "names channel `email` twice",
        ),
        (
            "o",
            &["push"],
            Reason::Malformed,
            "the job's own channel `push`",
        ),
        ("e", &[], Reason::Malformed, "1 to 4 channels"),
    ];
    for (id, fallback, reason, says) in cases {
        assert_eq!(
            run(&w, &conn, &s, &job(id, "r1", "push", fallback)).await,
            Outcome::Dead(reason),
            "{id}"
        );
        let (_, detail) = dead(&conn, &s, id).await;
        assert!(detail.contains(says), "{id}: {detail}");
    }
}

#[tokio::test]
async fn a_failed_step_goes_out_on_the_next_channel_once() {
    use quota_worker_producer::{Event, Feedback};
    let ns = unique("fb-failed");
    let s = free(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    publish(&conn, &s, &job("f1", "r1", "push", &["email", "sms"])).await;
    assert_eq!(sent_on(&conn, &s, "push", "f1").await, ("1/3".into(), None));

    // the sender reports push failed, twice: email takes it, once
    let failed = Feedback::new("f1", Event::Failed, "r1", "push");
    crate::feedback::send(&conn, &s, &failed).await;
    crate::feedback::send(&conn, &s, &failed).await;
    let (route, from) = sent_on(&conn, &s, "email", "f1").await;
    assert_eq!(
        (route.as_str(), from.as_deref()),
        ("2/3", Some("push: failed"))
    );
    crate::feedback::heard(&s, "f1", Event::Failed).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        depth(&conn, &topology(&s).dispatch_queue("email")).await,
        0,
        "sent once"
    );

    // email fails too: sms, the last channel; a failure there moves nothing on
    crate::feedback::send(
        &conn,
        &s,
        &Feedback::new("f1", Event::Failed, "r1", "email"),
    )
    .await;
    let (route, from) = sent_on(&conn, &s, "sms", "f1").await;
    assert_eq!(
        (route.as_str(), from.as_deref()),
        ("3/3", Some("email: failed"))
    );
    crate::feedback::send(&conn, &s, &Feedback::new("f1", Event::Failed, "r1", "sms")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for channel in ["push", "email", "sms"] {
        assert_eq!(
            depth(&conn, &topology(&s).dispatch_queue(channel)).await,
            0,
            "{channel}"
        );
    }
    stop.cancel();
    handle.await.unwrap();
}
