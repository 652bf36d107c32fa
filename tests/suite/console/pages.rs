//! The pages an operator works from, over HTTP against the machine's RabbitMQ and
//! Redis: one dead letter purged or replayed from its own page, through the same
//! confirmation and token as a filtered set, touches that one only. The overview
//! shows the tenants waiting in each lane of a paced channel.

use std::time::Duration;

use quota_worker::http::Guard;
use testkit::*;

use super::flows::{drain_ids, token_of};
use super::{ask, job, serve};

/// The index key of the dead letter of job `id`, read from the link of its row
/// in the list filtered by that id.
async fn key_of(addr: &str, cookie: &str, id: &str) -> String {
    let path = format!("/console/dead?id={id}");
    let page = ask(addr, "GET", &path, Some(cookie), &[], "").await;
    assert!(
        page.body.contains("1 dead letter(s) selected"),
        "{}",
        page.body
    );
    let link = "/console/dead/one?key=";
    let at = page.body.find(link).expect("a link to the letter") + link.len();
    let encoded = page.body[at..].split('"').next().unwrap();
    let query = format!("key={encoded}");
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "key")
        .map(|(_, v)| v.into_owned())
        .unwrap()
}

/// Confirm `action` on the letter `key` from its page, then carry it out: the
/// result's text.
async fn one_letter(addr: &str, cookie: &str, csrf: &str, key: &str, action: &str) -> String {
    let path = format!("/console/dead/one{}", query_of(key));
    let page = ask(addr, "GET", &path, Some(cookie), &[], "").await;
    assert!(
        page.body.contains("Purge this one") && page.body.contains("Replay this one"),
        "{}",
        page.body
    );
    let form = [("csrf", csrf), ("key", key), ("action", action)];
    let confirm = ask(
        addr,
        "POST",
        "/console/dead/confirm",
        Some(cookie),
        &form,
        "",
    )
    .await;
    assert!(
        confirm.body.contains(r#"<strong class="count">1</strong>"#)
            && confirm.body.contains("this dead letter"),
        "{}",
        confirm.body
    );
    let token = token_of(&confirm.body);
    let apply = [("csrf", csrf), ("token", token.as_str())];
    let done = ask(
        addr,
        "POST",
        "/console/dead/apply",
        Some(cookie),
        &apply,
        "",
    )
    .await;
    assert_eq!(done.code, 200, "{}", done.body);
    // the same form again does nothing
    let again = ask(
        addr,
        "POST",
        "/console/dead/apply",
        Some(cookie),
        &apply,
        "",
    )
    .await;
    assert_eq!(again.code, 409, "{}", again.body);
    done.body
}

fn query_of(key: &str) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("key", key);
    format!("?{}", q.finish())
}

#[tokio::test]
async fn one_dead_letter_purged_or_replayed_from_its_page_is_the_only_one_touched() {
    let ns = unique("console-one");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, w.store(), Guard::Open).await;
    // four of one reason, recipient and channel: any filter but the id takes them all
    for id in ["o1", "o2", "o3", "o4"] {
        publish(&conn, &s, &job(id, "r-one", "fax", "default")).await;
    }
    publish(&conn, &s, b"not json").await;
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

    let key = key_of(&addr, &cookie, "o2").await;
    let done = one_letter(&addr, &cookie, &csrf, &key, "purge").await;
    assert!(done.contains("1 of the 1"), "{done}");
    assert_eq!(depth(&conn, &s.amqp.dead_queue).await, 4);
    let all = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
    assert!(
        all.body.contains("4 dead letter(s) selected"),
        "{}",
        all.body
    );
    assert!(!all.body.contains(">o2<"), "{}", all.body);

    let key = key_of(&addr, &cookie, "o3").await;
    let done = one_letter(&addr, &cookie, &csrf, &key, "replay").await;
    assert!(done.contains("1 of the 1"), "{done}");
    assert_eq!(drain_ids(&conn, &s.amqp.jobs_queue).await, ["o3"]);
    // what stays in the queue: the others, the malformed one among them
    let mut left = drain_ids(&conn, &s.amqp.dead_queue).await;
    left.retain(|id| id.starts_with('o'));
    assert_eq!(left, ["o1", "o4"]);
    stop.cancel();
}

/// A job for `recipient` on `channel` of `tenant`, decided in `zone`.
fn job_of(id: &str, recipient: &str, channel: &str, tenant: &str, zone: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "recipient": recipient, "channel": channel,
        "category": "default", "tenant": tenant, "timezone": zone})
    .to_string()
    .into_bytes()
}

#[tokio::test]
async fn the_pages_show_choices_each_jobs_zone_the_body_as_received_and_what_waits() {
    let ns = unique("console-pages");
    let mut s = settings(&ns);
    s.amqp.delay_levels = 3;
    // acme replaces the default policy with one of its own
    let mut acme = quota_worker::config::TenantSettings::default();
    acme.policies
        .insert("default".into(), s.policies["default"].clone());
    s.tenants.insert("acme".into(), acme);
    limits_and_a_quota(&mut s);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop_http) = serve(&s, w.store(), Guard::Open).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    // dead letters: two of acme on an unknown channel, one body as its sender wrote it
    publish(
        &conn,
        &s,
        &job_of("p1", "Ann@Example", "fax", "acme", "UTC"),
    )
    .await;
    publish(&conn, &s, &job_of("p2", "bob", "fax", "acme", "UTC")).await;
    publish(&conn, &s, b"{\"zeta\": 1, \"alpha\": \"\xff<b>\"}").await;
    // a recipient held by the one-a-day cap in Shanghai's day
    publish(
        &conn,
        &s,
        &job_of("z1", "held-sh", "sms", "beta", "Asia/Shanghai"),
    )
    .await;
    publish(
        &conn,
        &s,
        &job_of("z2", "held-sh", "sms", "beta", "Asia/Shanghai"),
    )
    .await;
    super::flows::wait_delayed(w.store(), &s, "z2").await;
    wait_for(
        "the three dead letters",
        Duration::from_secs(20),
        || async { depth(&conn, &s.amqp.dead_queue).await == 3 },
    )
    .await;
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let cookie = page.cookie().unwrap();
    let get = |path: String| {
        let (addr, cookie) = (addr.clone(), cookie.clone());
        async move { ask(&addr, "GET", &path, Some(&cookie), &[], "").await }
    };
    wait_for("the three indexed", Duration::from_secs(10), || async {
        get("/console/dead".into())
            .await
            .body
            .contains("3 dead letter(s) selected")
    })
    .await;

    // filters as choices, the tenant in any case, the recipient column
    let dead = get("/console/dead?tenant=ACME".into()).await.body;
    for expected in [
        "2 dead letter(s) selected",
        "tenant `acme`",
        r#"<select id="reason" name="reason">"#,
        r#"<option value="unknown_channel">"#,
        r#"<option value="default">"#,
        r#"<option value="sms">"#,
        r#"<option value="acme">"#,
        "/console/recipient?recipient=Ann%40Example&amp;tenant=acme",
    ] {
        assert!(dead.contains(expected), "{expected} in {dead}");
    }
    // the body as received: its keys in their order, a byte not UTF-8 escaped, a tag as text
    let malformed = get("/console/dead?reason=malformed".into()).await.body;
    let link = "/console/dead/one?key=";
    let at = malformed.find(link).expect("a malformed letter") + link.len();
    let key = malformed[at..].split('"').next().unwrap().to_string();
    let one = get(format!("{link}{key}")).await.body;
    assert!(
        one.contains(r#"{&quot;zeta&quot;: 1, &quot;alpha&quot;: &quot;\xFF&lt;b&gt;&quot;}"#)
            && one.contains("not UTF-8"),
        "{one}"
    );

    // the tenants' overrides beside the policies
    let policies = get("/console/policies".into()).await.body;
    assert!(
        policies.contains("Tenant overrides")
            && policies.contains("[tenants.acme.policies.default]")
            && policies.contains("[[tenants.acme.policies.default.rules]]"),
        "{policies}"
    );

    // the limits and quotas in force, each as configured
    for expected in [
        "<code>ses_per_second</code>",
        "14 per 1s",
        "channels sms",
        "<code>new_ip</code>",
        "from 2026-01-05: 50, 100 a day",
        "<code>plan_month</code>",
        "50000 per 1mo",
    ] {
        assert!(policies.contains(expected), "{expected} in {policies}");
    }
    // the held recipient counted in its jobs' zone; the waiting job listed without it
    let recipient = get("/console/recipient?recipient=held-sh&tenant=beta".into())
        .await
        .body;
    assert!(
        recipient.contains("Counted in <strong class=\"zone\">Asia/Shanghai</strong>, the zone of waiting job(s) <code>z2</code>"),
        "{recipient}"
    );
    assert!(recipient.contains(" Asia/Shanghai</td>"), "{recipient}");
    let waiting = get("/console/waiting".into()).await.body;
    assert!(
        waiting.contains("/console/job?id=z2") && waiting.contains("Asia/Shanghai"),
        "{waiting}"
    );
    let by_policy = get("/console/waiting?policy=no-such".into()).await.body;
    assert!(!by_policy.contains("/console/job?id=z2"), "{by_policy}");
    let by_tenant = get("/console/waiting?tenant=BETA&policy=default".into())
        .await
        .body;
    assert!(by_tenant.contains("/console/job?id=z2"), "{by_tenant}");
    let other = get("/console/waiting?tenant=acme".into()).await.body;
    assert!(!other.contains("/console/job?id=z2"), "{other}");

    // the viewer's zone, remembered, beside UTC
    let set = get("/console/zone?tz=Europe/Paris&back=/console/dead".into()).await;
    assert_eq!(set.code, 303, "{set:?}");
    assert!(
        set.head.contains("set-cookie: qw_tz=europe/paris"),
        "{}",
        set.head
    );
    let both = format!("{cookie}; qw_tz=Europe/Paris");
    let zoned = ask(&addr, "GET", "/console/dead", Some(&both), &[], "").await;
    assert!(zoned.body.contains(" Europe/Paris)"), "{}", zoned.body);
    stop.cancel();
    handle.await.unwrap();
    stop_http.cancel();
}

#[tokio::test]
async fn a_replayed_dead_letters_job_page_no_longer_says_it_is_in_the_queue() {
    let ns = unique("console-replayed");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, w.store(), Guard::Open).await;
    publish(&conn, &s, &job("rp1", "r-rp", "fax", "default")).await;
    step(&w, &conn, &s).await;
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let (cookie, csrf) = (page.cookie().unwrap(), page.csrf());
    wait_for("indexed", Duration::from_secs(5), || async {
        let all = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
        all.body.contains("1 dead letter(s) selected")
    })
    .await;
    let before = ask(&addr, "GET", "/console/job?id=rp1", Some(&cookie), &[], "").await;
    assert!(
        before.body.contains("in the dead-letter queue"),
        "{}",
        before.body
    );
    let key = key_of(&addr, &cookie, "rp1").await;
    one_letter(&addr, &cookie, &csrf, &key, "replay").await;
    let after = ask(&addr, "GET", "/console/job?id=rp1", Some(&cookie), &[], "").await;
    assert!(
        !after.body.contains("in the dead-letter queue")
            && after.body.contains("taken out of the dead-letter queue"),
        "{}",
        after.body
    );
    stop.cancel();
}

/// An SES-style limit, a warm-up per sender and a tenant's monthly quota, as the
/// policies page lists them (none holds the pages' few jobs back).
pub(crate) fn limits_and_a_quota(s: &mut quota_worker::config::Settings) {
    use quota_worker::config::{
        CapScope, CapSettings, Dur, LimitSettings, MatchSettings, RuleSettings, WarmupSettings,
    };
    use quota_worker::quota::limits::Per;
    let ses = LimitSettings {
        rate: 14,
        period: Some(Dur(Duration::from_secs(1))),
        burst: Some(14),
        matches: MatchSettings {
            channels: Some(vec!["sms".into()]),
            ..MatchSettings::default()
        },
        per: Per::All,
        warmup: None,
    };
    s.limits.insert("ses_per_second".into(), ses.clone());
    let new_ip = LimitSettings {
        per: Per::Sender,
        warmup: Some(WarmupSettings {
            start: "2026-01-05".into(),
            daily: vec![50, 100],
        }),
        ..ses
    };
    s.limits.insert("new_ip".into(), new_ip);
    let month = CapSettings {
        rules: vec![RuleSettings {
            limit: 50_000,
            window: "1mo".parse().unwrap(),
        }],
        scope: CapScope::Tenant,
        ..CapSettings::default()
    };
    s.caps.insert("plan_month".into(), month);
}

/// The overview shows, for the bulk lane of a paced channel, how many tenants have
/// jobs waiting in their own queues and those with the most (read by the worker's
/// session with the queues, every 5 s).
#[tokio::test]
async fn the_overview_shows_the_tenants_waiting_in_each_lane() {
    let ns = unique("console-tenants");
    // `sms` at 1/s: the tenants' jobs wait in their queues
    let s = crate::lanes::laned(&ns, 1);
    let w = testkit::worker(&s).await;
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let (addr, stop_http) = super::serve_status(&s, w.store(), w.status.clone(), Guard::Open).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let of = |tenant: &str, n: usize| -> Vec<String> {
        (0..n)
            .map(|i| serde_json::json!({"id": format!("{tenant}-{i}"), "recipient": format!("{tenant}-{i}"),
                "channel": "sms", "category": "campaign", "tenant": tenant}).to_string())
            .collect()
    };
    // alpha holds the most ready, beta next, whatever the worker holds: it takes up
    // to the lane's prefetch (32 at 1/s) of the first tenant queue, and when the
    // second comes, a consumer of its share (16) before those are settled: at most
    // 48 of alpha's and of beta's
    crate::lanes::publish_all(&conn, &s, &of("alpha", 150)).await;
    crate::lanes::publish_all(&conn, &s, &of("beta", 60)).await;
    let cookie = ask(&addr, "GET", "/console", None, &[], "")
        .await
        .cookie()
        .unwrap();
    // the queues are read every 5 s: a few reads
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = ask(&addr, "GET", "/console", Some(&cookie), &[], "")
            .await
            .body;
        if page.contains("Tenants waiting by lane") && page.contains("beta") {
            break page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no tenants on the overview: {page}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    stop.cancel();
    handle.await.unwrap();
    stop_http.cancel();
    // the tenants' queues go with the clean-up (`Cleanup` deletes the registered ones)
    let rows = page.split("Tenants waiting by lane").nth(1).unwrap();
    let row = rows
        .split("</tr>")
        .find(|r| r.contains("sms.bulk"))
        .expect("the bulk lane's row");
    assert!(
        row.contains(r#"<td class="n">2</td>"#),
        "two tenants waiting: {row}"
    );
    let (alpha, beta) = (row.find("alpha").unwrap(), row.find("beta").unwrap());
    assert!(alpha < beta, "the tenant with the most first: {row}");
    // no other lane has tenants waiting
    assert!(
        !rows.contains("sms.urgent") && !rows.contains("sms.normal"),
        "{rows}"
    );
}
