//! The pages an operator works from, over HTTP against the machine's RabbitMQ and
//! Redis: one dead letter purged or replayed from its own page, through the same
//! confirmation and token as a filtered set, touches that one only.

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
