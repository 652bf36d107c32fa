//! The console (`/console`), against the machine's RabbitMQ and Redis, through its
//! HTTP: the login and its cookie, the CSRF token every action asks for, what a job
//! or a recipient brings shown as text, and the flows an operator follows (a
//! recipient held by a one-a-day cap, a waiting job cancelled, dead letters
//! replayed after a confirmation, preferences edited). The real-browser test is
//! `console_browser`.

use std::sync::Arc;
use std::time::Duration;

use quota_worker::config::Settings;
use quota_worker::health::Health;
use quota_worker::http::{App, Guard};
use quota_worker::reload::Reloader;
use quota_worker::status::Status;
use quota_worker::store::QuotaStore;
use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The admin token of these tests.
pub(crate) const TOKEN: &str = "console-test-token-0123456789";

/// The worker's HTTP app on a loopback port over `store`, with `guard` asked for
/// (the console asks for the admin token as `POST /reload` does).
pub(crate) async fn serve(
    s: &Settings,
    store: &Arc<QuotaStore>,
    guard: Guard,
) -> (String, CancellationToken) {
    serve_status(s, store, Arc::new(Status::default()), guard).await
}

/// [`serve`] showing `status` (a running worker's, whose session reads the queues
/// into it).
pub(crate) async fn serve_status(
    s: &Settings,
    store: &Arc<QuotaStore>,
    status: Arc<Status>,
    guard: Guard,
) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    status.attach(Arc::new(Reloader::new(None, s.clone(), store.clone())));
    let health = Arc::new(Health::default());
    let app = App {
        metrics: None,
        health,
        status,
        guard,
        api_guard: Guard::Open,
    };
    let stop = CancellationToken::new();
    tokio::spawn(quota_worker::http::serve(
        listener,
        quota_worker::http::app(app),
        stop.clone(),
    ));
    (addr, stop)
}

/// One answer: status, head (lower-cased names) and body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub code: u16,
    pub head: String,
    pub body: String,
}

impl Answer {
    /// The session cookie it sets, `name=value`.
    pub fn cookie(&self) -> Option<String> {
        self.set_cookie()
            .and_then(|c| c.split(';').next().map(str::to_string))
    }

    /// The whole `Set-Cookie` line.
    pub fn set_cookie(&self) -> Option<&str> {
        self.head
            .lines()
            .find_map(|l| l.strip_prefix("set-cookie: "))
            .map(str::trim)
    }

    /// The CSRF token of the page's forms.
    pub fn csrf(&self) -> String {
        self.field("csrf")
    }

    /// The value of the page's (hidden) field `name`.
    pub fn field(&self, name: &str) -> String {
        let before = format!(r#"name="{name}" value=""#);
        let at = self
            .body
            .find(&before)
            .unwrap_or_else(|| panic!("a form with its field `{name}`: {}", self.body));
        let rest = &self.body[at + before.len()..];
        rest[..rest.find('"').unwrap()].to_string()
    }
}

/// `method path` on `addr`, with the cookie, the form fields and the extra header
/// lines given.
pub(crate) async fn ask(
    addr: &str,
    method: &str,
    path: &str,
    cookie: Option<&str>,
    form: &[(&str, &str)],
    extra: &str,
) -> Answer {
    let mut body = form_urlencoded::Serializer::new(String::new());
    for (k, v) in form {
        body.append_pair(k, v);
    }
    let body = body.finish();
    let cookie = cookie
        .map(|c| format!("Cookie: {c}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{cookie}{extra}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("an answer within 30 s")
        .unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    Answer {
        code: head.split(' ').nth(1).unwrap().parse().unwrap(),
        head: head.to_ascii_lowercase(),
        body: body.to_string(),
    }
}

/// Post the login form with `token`, as a browser does from the form just read
/// (its pre-session cookie and field), with the extra header lines given.
pub(crate) async fn post_login(addr: &str, token: &str, extra: &str) -> Answer {
    let form = ask(addr, "GET", "/console/login", None, &[], "").await;
    let cookie = form.cookie().expect("the login form's cookie");
    let field = form.field("login_csrf");
    let fields = [("token", token), ("login_csrf", field.as_str())];
    ask(
        addr,
        "POST",
        "/console/login",
        Some(&cookie),
        &fields,
        extra,
    )
    .await
}

/// Log in with `token`: the session cookie.
pub(crate) async fn login(addr: &str, token: &str) -> String {
    let a = post_login(addr, token, "").await;
    assert_eq!(a.code, 303, "{a:?}");
    a.cookie().expect("a session cookie")
}

/// A job for `recipient` on `channel`.
pub(crate) fn job(id: &str, recipient: &str, channel: &str, category: &str) -> Vec<u8> {
    serde_json::json!({"id": id, "recipient": recipient, "channel": channel, "category": category})
        .to_string()
        .into_bytes()
}

#[tokio::test]
async fn the_console_asks_for_the_admin_token_and_gives_an_http_only_strict_cookie() {
    let ns = unique("console-access");
    let mut s = settings(&ns);
    s.console.session_ttl = quota_worker::config::Dur(Duration::from_secs(2));
    let _c = Cleanup::new(&s);
    let store = Arc::new(QuotaStore::connect(&s).await.unwrap());
    let (addr, stop) = serve(&s, &store, Guard::token(&TOKEN.into())).await;

    // no session: the login form; a wrong token is refused
    let a = ask(&addr, "GET", "/console", None, &[], "").await;
    assert_eq!(
        (a.code, a.head.contains("location: /console/login")),
        (303, true),
        "{a:?}"
    );
    let a = ask(&addr, "GET", "/console/login", None, &[], "").await;
    assert!(a.body.contains(r#"<label for="token">"#), "{}", a.body);
    let a = post_login(&addr, "not-it", "").await;
    assert_eq!(a.code, 401, "{a:?}");
    assert!(!a.head.contains("qw_console="), "{a:?}");

    // the token: an HttpOnly, SameSite=Strict cookie that expires; Secure behind TLS
    let a = post_login(&addr, TOKEN, "X-Forwarded-Proto: https\r\n").await;
    let line = a.set_cookie().unwrap().to_string();
    for flag in [
        "httponly",
        "samesite=strict",
        "max-age=2",
        "path=/console",
        "secure",
    ] {
        assert!(line.contains(flag), "{flag} in {line}");
    }
    let cookie = login(&addr, TOKEN).await;
    let page = ask(&addr, "GET", "/console", Some(&cookie), &[], "").await;
    assert_eq!(page.code, 200, "{page:?}");
    assert!(page.body.contains("Readiness") && !page.body.contains(TOKEN));
    assert!(page
        .head
        .contains("content-security-policy: default-src 'none'"));

    stop.cancel();
}

/// A broker that refuses the dead-letter log (here a classic queue already holds its
/// name, as a broker without streams refuses a stream) does not stop the worker:
/// the rest of the topology is declared, and the log is said to be missing.
#[tokio::test]
async fn a_broker_that_refuses_the_dead_letter_log_does_not_stop_the_worker() {
    use lapin::options::QueueDeclareOptions;
    let ns = unique("deadlog-refused");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let ch = conn.create_channel().await.unwrap();
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    let log = format!("{}.log", s.amqp.dead_queue);
    ch.queue_declare(log.as_str().into(), durable, Default::default())
        .await
        .unwrap();
    topology(&s)
        .declare(&conn)
        .await
        .expect("the topology, without its log");
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let ch = conn.create_channel().await.unwrap();
    for q in [&s.amqp.jobs_queue, &s.amqp.dead_queue] {
        ch.queue_declare(q.as_str().into(), passive, Default::default())
            .await
            .unwrap_or_else(|e| panic!("{q} declared: {e}"));
    }
}

/// With the broker away, a dead-letter page still answers from the index, saying
/// that it could not catch up with the dead-letter log.
#[tokio::test]
async fn a_dead_letter_page_answers_without_the_broker_and_says_so() {
    let ns = unique("deadlog-away");
    let mut s = settings(&ns);
    let _c = Cleanup::new(&s);
    let store = Arc::new(QuotaStore::connect(&s).await.unwrap());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    s.amqp.url = format!("amqp://guest:guest@127.0.0.1:{port}/%2f");
    s.amqp.urls.clear();
    let (addr, stop) = serve(&s, &store, Guard::Open).await;
    let page = ask(&addr, "GET", "/console", None, &[], "").await;
    let cookie = page.cookie().unwrap();
    let a = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
    assert_eq!(a.code, 200, "{a:?}");
    assert!(a.body.contains("could not catch up"), "{}", a.body);
    assert!(a.body.contains("0 dead letter(s) selected"), "{}", a.body);
    stop.cancel();
}

/// Two workers behind one address: the login form one gives is taken by the
/// other, a session opened on one is the other's too, and a logout on one ends it
/// on both (sessions live in Redis, not in a worker).
#[tokio::test]
async fn a_session_opened_on_one_worker_is_known_to_the_other_until_logged_out() {
    let ns = unique("console-shared");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let store = Arc::new(QuotaStore::connect(&s).await.unwrap());
    let (one, stop_one) = serve(&s, &store, Guard::token(&TOKEN.into())).await;
    let (two, stop_two) = serve(&s, &store, Guard::token(&TOKEN.into())).await;

    // the form from one, posted to the other
    let form = ask(&one, "GET", "/console/login", None, &[], "").await;
    let form_cookie = form.cookie().expect("the login form's cookie");
    let field = form.field("login_csrf");
    let fields = [("token", TOKEN), ("login_csrf", field.as_str())];
    let a = ask(
        &two,
        "POST",
        "/console/login",
        Some(&form_cookie),
        &fields,
        "",
    )
    .await;
    assert_eq!(a.code, 303, "{a:?}");
    let cookie = a.cookie().expect("a session cookie");

    // the session, on both
    for addr in [&one, &two] {
        let page = ask(addr, "GET", "/console", Some(&cookie), &[], "").await;
        assert_eq!(page.code, 200, "{addr}: {page:?}");
    }
    // Redis holds the cookie's hash, never the cookie
    let mut redis = store.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:console:session:*", s.redis.key_prefix))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let id = cookie.split_once('=').map_or(cookie.as_str(), |(_, v)| v);
    assert!(!keys[0].contains(id), "{keys:?}");

    // a logout on one ends it on the other
    let page = ask(&one, "GET", "/console", Some(&cookie), &[], "").await;
    let csrf = page.field("csrf");
    let out = ask(
        &one,
        "POST",
        "/console/logout",
        Some(&cookie),
        &[("csrf", &csrf)],
        "",
    )
    .await;
    assert_eq!(out.code, 303, "{out:?}");
    let after = ask(&two, "GET", "/console", Some(&cookie), &[], "").await;
    assert_eq!(after.code, 303, "{after:?}");
    stop_one.cancel();
    stop_two.cancel();
}

#[tokio::test]
async fn an_action_asks_for_its_forms_csrf_token_and_a_live_cookie() {
    let ns = unique("console-csrf");
    let mut s = settings(&ns);
    s.console.session_ttl = quota_worker::config::Dur(Duration::from_secs(2));
    let _c = Cleanup::new(&s);
    let store = Arc::new(QuotaStore::connect(&s).await.unwrap());
    let (addr, stop) = serve(&s, &store, Guard::token(&TOKEN.into())).await;
    let cookie = login(&addr, TOKEN).await;
    let page = ask(&addr, "GET", "/console", Some(&cookie), &[], "").await;
    // an action without the form's CSRF token, or with another, is refused
    let cancel = |csrf: Option<String>| {
        let mut form = vec![("id", "j1".to_string())];
        form.extend(csrf.map(|c| ("csrf", c)));
        form
    };
    for form in [cancel(None), cancel(Some("forged".into()))] {
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let a = ask(
            &addr,
            "POST",
            "/console/job/cancel",
            Some(&cookie),
            &form,
            "",
        )
        .await;
        assert_eq!(a.code, 403, "{a:?}");
    }
    let none = quota_worker::admin::Jobs::new(&store, &s)
        .explain("j1")
        .await
        .unwrap();
    assert_eq!(none.cancelled_at, None, "a refused action did nothing");
    // with it, the action is done (once confirmed)
    let form = cancel(Some(page.csrf()));
    let mut form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.as_str())).collect();
    form.push(("confirmed", "yes"));
    let a = ask(
        &addr,
        "POST",
        "/console/job/cancel",
        Some(&cookie),
        &form,
        "",
    )
    .await;
    assert_eq!(a.code, 200, "{a:?}");
    let marked = quota_worker::admin::Jobs::new(&store, &s)
        .explain("j1")
        .await
        .unwrap();
    assert!(marked.cancelled_at.is_some());

    // an expired cookie is refused: pages send to the login, actions answer 401
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let a = ask(&addr, "GET", "/console/job", Some(&cookie), &[], "").await;
    assert_eq!(a.code, 303, "{a:?}");
    let a = ask(
        &addr,
        "POST",
        "/console/job/cancel",
        Some(&cookie),
        &form,
        "",
    )
    .await;
    assert_eq!(a.code, 401, "{a:?}");
    stop.cancel();
}

#[tokio::test]
async fn a_recipient_and_a_payload_holding_a_script_are_shown_as_text() {
    let ns = unique("console-escape");
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let (addr, stop) = serve(&s, w.store(), Guard::Open).await;
    let evil = "<script>alert(1)</script>";
    // an unknown channel: dead-lettered, and indexed, with its body
    publish(&conn, &s, &job("x1", evil, "fax", evil)).await;
    step(&w, &conn, &s).await;
    let open = ask(&addr, "GET", "/console", None, &[], "").await;
    let cookie = open.cookie().expect("on an open guard, a session at once");
    let q = |r: &str| form_urlencoded::byte_serialize(r.as_bytes()).collect::<String>();
    let pages = [
        format!("/console/recipient?recipient={}", q(evil)),
        format!("/console/job?id={}", q(evil)),
        "/console/dead".to_string(),
    ];
    wait_for("x1 indexed", Duration::from_secs(5), || async {
        ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "")
            .await
            .body
            .contains("x1")
    })
    .await;
    let list = ask(&addr, "GET", "/console/dead", Some(&cookie), &[], "").await;
    let at = list.body.find("/console/dead/one?key=").unwrap();
    let rest = &list.body[at..];
    let one = rest[..rest.find('"').unwrap()].replace("&amp;", "&");
    for path in pages.iter().chain([&one]) {
        let a = ask(&addr, "GET", path, Some(&cookie), &[], "").await;
        assert_eq!(a.code, 200, "{path}: {a:?}");
        assert!(!a.body.contains("<script>"), "{path}: {}", a.body);
        if path != "/console/dead" {
            assert!(a.body.contains("&lt;script&gt;"), "{path}: {}", a.body);
        }
    }
    stop.cancel();
}

#[tokio::test]
async fn a_login_posted_from_another_site_or_without_the_forms_cookie_is_refused() {
    let ns = unique("console-login-csrf");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let store = Arc::new(QuotaStore::connect(&s).await.unwrap());
    let (addr, stop) = serve(&s, &store, Guard::token(&TOKEN.into())).await;
    let refused = |a: &Answer| a.code == 403 && !a.head.contains("qw_console=");

    // a page elsewhere posting the right token: the browser says where it came from
    for from in [
        "Sec-Fetch-Site: cross-site\r\nOrigin: https://evil.example\r\n",
        "Sec-Fetch-Site: same-site\r\n",
        "Origin: https://evil.example\r\n",
    ] {
        let a = post_login(&addr, TOKEN, from).await;
        assert!(refused(&a), "{from}: {a:?}");
        assert!(a.body.contains("another site"), "{}", a.body);
    }
    // ... and such a post carries no SameSite=Strict cookie: without it, or with a
    // field that is not the cookie's, the login is refused too
    let form = ask(&addr, "GET", "/console/login", None, &[], "").await;
    let cookie = form.cookie().unwrap();
    let line = form.set_cookie().unwrap().to_string();
    for flag in [
        "httponly",
        "samesite=strict",
        "max-age=600",
        "path=/console/login",
    ] {
        assert!(line.contains(flag), "{flag} in {line}");
    }
    let field = form.field("login_csrf");
    let other = ask(&addr, "GET", "/console/login", None, &[], "")
        .await
        .field("login_csrf");
    for (cookie, field) in [
        (None, field.as_str()),
        (Some(cookie.as_str()), other.as_str()),
        (Some(cookie.as_str()), ""),
    ] {
        let fields = [("token", TOKEN), ("login_csrf", field)];
        let a = ask(&addr, "POST", "/console/login", cookie, &fields, "").await;
        assert!(refused(&a), "{cookie:?} {field}: {a:?}");
    }
    // from the console's own form, in a browser that says so: a session
    let own = format!("Sec-Fetch-Site: same-origin\r\nOrigin: http://{addr}\r\n");
    let a = post_login(&addr, TOKEN, &own).await;
    assert_eq!(a.code, 303, "{a:?}");
    assert!(a.head.contains("qw_console="), "{a:?}");
    stop.cancel();
}

mod actions;
mod browser;
mod figures;
mod flows;
mod index;
mod pages;
