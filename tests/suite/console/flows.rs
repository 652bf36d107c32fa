//! The console's flows over HTTP: a recipient held by a one-a-day cap and its
//! waiting job cancelled; dead letters replayed by a filter after a confirmation;
//! preferences edited through the REST API's validation.

use std::time::Duration;

use quota_worker::admin::{RecipientQuery, Recipients};
use quota_worker::http::Guard;
use quota_worker::job::note::JobState;
use quota_worker::job::{Outcome, Reason};
use testkit::*;

use super::{ask, job, serve};

/// The first dead letter of job `id` within 30 s: its reason.
pub(crate) async fn dead_reason(conn: &lapin::Connection, queue: &str, id: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if let Some(m) = take(conn, queue, Duration::from_millis(300)).await {
            if message_id(&m) == id {
                return header(&m.delivery.properties, "x-notify-reason").unwrap_or_default();
            }
        }
    }
    panic!("no dead letter of {id} within 30 s");
}

/// The next allowed instant of `recipient` under the default policy, as `admin
/// recipient` tells it, written as the console writes it: (in their zone, in UTC).
pub(crate) async fn next_allowed(
    store: &quota_worker::store::QuotaStore,
    s: &quota_worker::config::Settings,
    recipient: &str,
) -> (String, String) {
    let q = RecipientQuery {
        recipient,
        category: None,
        channel: None,
        tz: s.worker.default_timezone,
        tenant: None,
    };
    let status = Recipients::new(store, s).status(&q).await.unwrap();
    let p = status
        .policies
        .iter()
        .find(|p| p.policy == "default")
        .unwrap();
    let next = p.next_allowed.clone().expect("a next allowed instant");
    assert!(!next.now, "{next:?}");
    let tz = s.worker.default_timezone;
    (
        format!(
            "{} {}",
            next.utc.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S"),
            tz.name()
        ),
        next.utc.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

/// The ids of every message in `queue` (taken), sorted.
pub(crate) async fn drain_ids(conn: &lapin::Connection, queue: &str) -> Vec<String> {
    let mut ids = Vec::new();
    while let Some(m) = take(conn, queue, Duration::from_millis(500)).await {
        ids.push(message_id(&m).to_string());
    }
    ids.sort();
    ids
}

/// Wait until job `id` is noted delayed.
pub(crate) async fn wait_delayed(
    store: &quota_worker::store::QuotaStore,
    s: &quota_worker::config::Settings,
    id: &str,
) {
    wait_for(
        &format!("{id} delayed"),
        Duration::from_secs(20),
        || async {
            let st = quota_worker::admin::Jobs::new(store, s)
                .explain(id)
                .await
                .unwrap();
            matches!(st.record.map(|r| r.step), Some(JobState::Delayed { .. }))
        },
    )
    .await;
}

#[tokio::test]
async fn a_recipient_held_by_a_one_a_day_cap_shows_when_and_its_cancelled_job_ends_dead() {
    let ns = unique("console-held");
    let mut s = settings(&ns);
    // a job held a day goes round the ladder every 7 s: a cancel is seen soon
    s.amqp.delay_levels = 3;
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop_http) = serve(&s, w.store(), Guard::Open).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    publish(&conn, &s, &job("h1", "held-1", "sms", "default")).await;
    publish(&conn, &s, &job("h2", "held-1", "sms", "default")).await;
    wait_delayed(w.store(), &s, "h2").await;
    let (local, utc) = next_allowed(w.store(), &s, "held-1").await;

    let page = ask(
        &addr,
        "GET",
        "/console/recipient?recipient=held-1",
        None,
        &[],
        "",
    )
    .await;
    assert_eq!(page.code, 200, "{page:?}");
    for expected in [
        &local,
        &utc,
        "1 / 1 per 1d",
        "/console/job?id=h2",
        "1 waiting",
    ] {
        assert!(page.body.contains(expected), "{expected} in {}", page.body);
    }
    let cookie = page.cookie().unwrap();
    let csrf = page.csrf();
    let job_page = ask(&addr, "GET", "/console/job?id=h2", Some(&cookie), &[], "").await;
    assert!(
        job_page.body.contains("delayed") && job_page.body.contains("Cancel this job"),
        "{}",
        job_page.body
    );
    // a confirmation first, which changes nothing
    let asked = ask(
        &addr,
        "POST",
        "/console/job/cancel",
        Some(&cookie),
        &[("csrf", &csrf), ("id", "h2")],
        "",
    )
    .await;
    assert!(
        asked.body.contains("Cancel job <code>h2</code>?"),
        "{}",
        asked.body
    );
    let still = ask(&addr, "GET", "/console/job?id=h2", Some(&cookie), &[], "").await;
    assert!(
        !still.body.contains("<strong>Cancelled</strong>"),
        "{}",
        still.body
    );
    let a = ask(
        &addr,
        "POST",
        "/console/job/cancel",
        Some(&cookie),
        &[("csrf", &csrf), ("id", "h2"), ("confirmed", "yes")],
        "",
    )
    .await;
    assert_eq!(a.code, 200, "{a:?}");
    assert!(a.body.contains("marked cancelled"), "{}", a.body);
    let job_page = ask(&addr, "GET", "/console/job?id=h2", Some(&cookie), &[], "").await;
    assert!(
        job_page.body.contains("<strong>Cancelled</strong>"),
        "{}",
        job_page.body
    );
    let path = "/console/recipient?recipient=held-1";
    let listed = ask(&addr, "GET", path, Some(&cookie), &[], "").await;
    if listed.body.contains("/console/job?id=h2") {
        assert!(
            listed.body.contains("<strong>cancelled</strong>"),
            "{}",
            listed.body
        );
    }
    assert_eq!(
        dead_reason(&conn, &s.amqp.dead_queue, "h2").await,
        "cancelled"
    );
    // an id never seen: said so, and a mark only when asked for
    let unseen = [("csrf", csrf.as_str()), ("id", "never-seen-1")];
    let asked = ask(
        &addr,
        "POST",
        "/console/job/cancel",
        Some(&cookie),
        &unseen,
        "",
    )
    .await;
    assert!(
        asked
            .body
            .contains("No job with id <code>never-seen-1</code> was seen"),
        "{}",
        asked.body
    );
    let confirmed = [
        ("csrf", csrf.as_str()),
        ("id", "never-seen-1"),
        ("confirmed", "yes"),
    ];
    let a = ask(
        &addr,
        "POST",
        "/console/job/cancel",
        Some(&cookie),
        &confirmed,
        "",
    )
    .await;
    assert!(
        a.body
            .contains("No job with id never-seen-1 was seen; a cancel mark is left"),
        "{}",
        a.body
    );
    stop.cancel();
    handle.await.unwrap();
    stop_http.cancel();
}

/// The confirmation's token (`name="token" value="…"`).
pub(crate) fn token_of(body: &str) -> String {
    let at = body.find(r#"name="token" value=""#).expect("a token") + 20;
    body[at..].split('"').next().unwrap().to_string()
}

#[tokio::test]
async fn dead_letters_a_filter_selects_are_replayed_exactly_as_confirmed_and_once() {
    let ns = unique("console-replay");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, w.store(), Guard::Open).await;
    for id in ["d1", "d2", "d3"] {
        publish(&conn, &s, &job(id, "r-dead", "fax", "default")).await;
    }
    // two malformed dead letters without a job id
    publish(&conn, &s, b"not json").await;
    publish(&conn, &s, b"not json either").await;
    for _ in 0..5 {
        step(&w, &conn, &s).await;
    }
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let (cookie, csrf) = (page.cookie().unwrap(), page.csrf());
    wait_for("the five indexed", Duration::from_secs(5), || async {
        let all = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
        all.body.contains("5 dead letter(s) selected")
    })
    .await;
    let path = "/console/dead?reason=unknown_channel";
    let filtered = ask(&addr, "GET", path, Some(&cookie), &[], "").await;
    assert!(filtered.body.contains("3 dead letter(s) selected"));
    let form = [
        ("csrf", csrf.as_str()),
        ("reason", "unknown_channel"),
        ("action", "replay"),
    ];
    let confirm = ask(
        &addr,
        "POST",
        "/console/dead/confirm",
        Some(&cookie),
        &form,
        "",
    )
    .await;
    assert!(
        confirm.body.contains(r#"<strong class="count">3</strong>"#)
            && confirm.body.contains("reason `unknown_channel`"),
        "{}",
        confirm.body
    );
    for id in ["d1", "d2", "d3"] {
        assert!(confirm.body.contains(id), "{id} listed: {}", confirm.body);
    }
    // the confirmation alone changed nothing; one the filter selects arrives after it
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 5);
    publish(&conn, &s, &job("d4", "r-dead", "fax", "default")).await;
    step(&w, &conn, &s).await;
    let token = token_of(&confirm.body);
    let apply = [("csrf", csrf.as_str()), ("token", token.as_str())];
    let done = ask(
        &addr,
        "POST",
        "/console/dead/apply",
        Some(&cookie),
        &apply,
        "",
    )
    .await;
    assert!(
        done.body
            .contains("3 of the 3 dead letter(s) listed for reason `unknown_channel` replayed"),
        "{}",
        done.body
    );
    assert_eq!(
        drain_ids(&conn, &s.amqp.jobs_queue).await,
        ["d1", "d2", "d3"]
    );
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 3);
    // the same form again does nothing
    let again = ask(
        &addr,
        "POST",
        "/console/dead/apply",
        Some(&cookie),
        &apply,
        "",
    )
    .await;
    assert_eq!(again.code, 409, "{}", again.body);
    assert!(again.body.contains("already carried out"), "{}", again.body);
    assert!(drain_ids(&conn, &s.amqp.jobs_queue).await.is_empty());
    // the malformed ones, without ids, are purged like the others
    let purge = [
        ("csrf", csrf.as_str()),
        ("reason", "malformed"),
        ("action", "purge"),
    ];
    let confirm = ask(
        &addr,
        "POST",
        "/console/dead/confirm",
        Some(&cookie),
        &purge,
        "",
    )
    .await;
    assert!(
        confirm.body.contains(r#"<strong class="count">2</strong>"#),
        "{}",
        confirm.body
    );
    let token = token_of(&confirm.body);
    let apply = [("csrf", csrf.as_str()), ("token", token.as_str())];
    let done = ask(
        &addr,
        "POST",
        "/console/dead/apply",
        Some(&cookie),
        &apply,
        "",
    )
    .await;
    assert!(done.body.contains("2 of the 2"), "{}", done.body);
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 1);
    let all = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
    assert!(
        all.body.contains("1 dead letter(s) selected"),
        "{}",
        all.body
    );
    assert!(all.body.contains("d4"), "{}", all.body);
    stop.cancel();
}

#[tokio::test]
async fn a_tenant_filtered_purge_removes_that_tenants_dead_letters_only() {
    let ns = unique("console-tenant");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, w.store(), Guard::Open).await;
    let of = |id: &str, tenant: &str| {
        format!(
            r#"{{"id":"{id}","recipient":"r-t","channel":"fax","category":"default","tenant":"{tenant}"}}"#
        )
    };
    for (id, tenant) in [
        ("a1", "acme"),
        ("b1", "beta"),
        ("a2", "acme"),
        ("b2", "beta"),
    ] {
        publish(&conn, &s, of(id, tenant).as_bytes()).await;
    }
    publish(&conn, &s, &job("n1", "r-t", "fax", "default")).await;
    for _ in 0..5 {
        step(&w, &conn, &s).await;
    }
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let (cookie, csrf) = (page.cookie().unwrap(), page.csrf());
    wait_for("the five indexed", Duration::from_secs(5), || async {
        let all = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
        all.body.contains("5 dead letter(s) selected")
    })
    .await;
    let count = |path: &'static str| {
        let (addr, cookie) = (addr.clone(), cookie.clone());
        async move { ask(&addr, "GET", path, Some(&cookie), &[], "").await.body }
    };
    assert!(count("/console/dead?tenant=acme")
        .await
        .contains("2 dead letter(s) selected"));
    assert!(count("/console/dead?tenant=no-such-tenant")
        .await
        .contains("0 dead letter(s) selected"));
    let purge = [
        ("csrf", csrf.as_str()),
        ("tenant", "acme"),
        ("action", "purge"),
    ];
    let confirm = ask(
        &addr,
        "POST",
        "/console/dead/confirm",
        Some(&cookie),
        &purge,
        "",
    )
    .await;
    assert!(
        confirm.body.contains(r#"<strong class="count">2</strong>"#)
            && confirm.body.contains("tenant `acme`"),
        "{}",
        confirm.body
    );
    let token = token_of(&confirm.body);
    let apply = [("csrf", csrf.as_str()), ("token", token.as_str())];
    let done = ask(
        &addr,
        "POST",
        "/console/dead/apply",
        Some(&cookie),
        &apply,
        "",
    )
    .await;
    assert!(done.body.contains("2 of the 2"), "{}", done.body);
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 3);
    let left = count("/console/dead").await;
    assert!(left.contains("3 dead letter(s) selected"), "{left}");
    for id in ["b1", "b2", "n1"] {
        assert!(left.contains(id), "{id} kept: {left}");
    }
    assert!(count("/console/dead?tenant=acme")
        .await
        .contains("0 dead letter(s) selected"));
    stop.cancel();
}

#[tokio::test]
async fn preferences_edited_in_the_console_are_checked_as_the_api_checks_them() {
    let ns = unique("console-prefs");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, w.store(), Guard::Open).await;
    let page = ask(
        &addr,
        "GET",
        "/console/recipient?recipient=p1",
        None,
        &[],
        "",
    )
    .await;
    let (cookie, csrf) = (page.cookie().unwrap(), page.csrf());
    assert!(
        page.body.contains(r#"<label for="preferences">"#),
        "{}",
        page.body
    );
    let save = |set: &'static str| {
        let (addr, cookie, csrf) = (addr.clone(), cookie.clone(), csrf.clone());
        async move {
            let form = [
                ("csrf", csrf.as_str()),
                ("recipient", "p1"),
                ("preferences", set),
            ];
            ask(
                &addr,
                "POST",
                "/console/recipient/preferences",
                Some(&cookie),
                &form,
                "",
            )
            .await
        }
    };
    let bad = save(r#"{"categories": {"marketing": "no"}}"#).await;
    assert_eq!(bad.code, 400, "{bad:?}");
    assert!(bad.body.contains("categories.marketing"), "{}", bad.body);
    assert_eq!(
        save(r#"{"categories": {"marketing": false}}"#).await.code,
        200
    );
    publish(&conn, &s, &job("p-1", "p1", "sms", "marketing")).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dead(Reason::OptedOut));
    let page = ask(
        &addr,
        "GET",
        "/console/recipient?recipient=p1",
        Some(&cookie),
        &[],
        "",
    )
    .await;
    assert!(
        page.body.contains("&quot;marketing&quot;: false"),
        "{}",
        page.body
    );
    stop.cancel();
}
