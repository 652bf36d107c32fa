//! The console in a real browser: Debian's Chromium driven over WebDriver
//! (`chromedriver`, spoken to as JSON over HTTP, no client library). Logs in, reads
//! the next allowed instant of a recipient held by a one-a-day cap, cancels a
//! waiting job and finds it dead-lettered `cancelled`, replays a filtered set of
//! dead letters and finds them back in the jobs queue, edits a recipient's
//! preferences and sees the next job opted out; a login posted from a page on
//! another site is refused. Then, against `quota-worker run` serving the console
//! with traffic published (recipients of two tenants held by the one-a-day cap in
//! four zones, acme with a default policy of its own, expired and malformed dead
//! letters) and its queues read and settled jobs sampled, every page is opened
//! 1280 and 390 pixels wide: its key elements are there, and at 390 the page does
//! not scroll sideways (`document.scrollingElement.scrollWidth <= innerWidth`).
//! They draw the screenshots of `docs/console/` (written there with
//! `QW_WRITE_PICTURES=1`:
//! `QW_WRITE_PICTURES=1 cargo nextest run --test suite -E 'test(/console::browser/)'`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use quota_worker::http::Guard;
use quota_worker::job::{Outcome, Reason};
use serde_json::{json, Value};
use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::flows::{dead_reason, drain_ids, next_allowed, wait_delayed};
use super::{job, serve, TOKEN};

/// The W3C name of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A chromedriver and one browser session in it.
struct Driver {
    addr: String,
    session: String,
    child: Child,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn call(addr: &str, method: &str, path: &str, body: Option<&Value>) -> Value {
    let body = body.map(Value::to_string).unwrap_or_default();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    // chromedriver keeps the connection open: read the head, then Content-Length
    let read = async {
        let mut raw = Vec::new();
        let mut buf = vec![0u8; 65536];
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw).to_string();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("content-length")
                            .then(|| v.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if body.len() >= length || n == 0 {
                    return body.to_string();
                }
            }
            assert!(n > 0, "chromedriver closed before answering: {text}");
        }
    };
    let body = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .expect("chromedriver answers within 60 s");
    let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    assert!(v["value"].get("error").is_none(), "{method} {path}: {v}");
    v["value"].clone()
}

impl Driver {
    /// chromedriver on a free port, and a headless Chromium session `width` wide.
    async fn start(chrome: &Path, profile: &Path) -> Driver {
        let port = free_port(None);
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs");
        let addr = format!("127.0.0.1:{port}");
        wait_for(
            "chromedriver listening",
            Duration::from_secs(20),
            || async { port_open(port) },
        )
        .await;
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-sync",
            "--hide-scrollbars",
            "--window-size=1280,1000",
        ];
        let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome",
            "goog:chromeOptions": {"binary": chrome.to_str().unwrap(), "args": args}}}});
        let session = call(&addr, "POST", "/session", Some(&caps)).await;
        let session = session["sessionId"].as_str().unwrap().to_string();
        Driver {
            addr,
            session,
            child,
        }
    }

    async fn ask(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let path = format!("/session/{}{path}", self.session);
        call(&self.addr, method, &path, body.as_ref()).await
    }

    async fn goto(&self, url: &str) {
        self.ask("POST", "/url", Some(json!({"url": url}))).await;
    }

    async fn find(&self, css: &str) -> String {
        let found = self
            .ask(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        found[ELEMENT]
            .as_str()
            .unwrap_or_else(|| panic!("{css}: {found}"))
            .to_string()
    }

    async fn click(&self, css: &str) {
        let el = self.find(css).await;
        self.ask("POST", &format!("/element/{el}/click"), Some(json!({})))
            .await;
    }

    async fn fill(&self, css: &str, text: &str) {
        let el = self.find(css).await;
        self.ask("POST", &format!("/element/{el}/clear"), Some(json!({})))
            .await;
        self.ask(
            "POST",
            &format!("/element/{el}/value"),
            Some(json!({"text": text})),
        )
        .await;
    }

    async fn text(&self, css: &str) -> String {
        let el = self.find(css).await;
        self.ask("GET", &format!("/element/{el}/text"), None)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Run `script` (a function body) in the page: what it returns.
    async fn run(&self, script: &str) -> Value {
        self.ask(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .await
    }

    async fn source(&self) -> String {
        self.ask("GET", "/source", None)
            .await
            .as_str()
            .unwrap()
            .to_string()
    }

    /// Wait until the page shows `text` (a click's navigation may still be under way).
    async fn shows(&self, text: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let source = self.source().await;
            if source.contains(text) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{text} not in {source}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn width(&self, width: u32) {
        self.ask(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": 1000})),
        )
        .await;
    }

    /// A screenshot of the page as `docs/console/<name>.png` (see `picture_path`).
    async fn shoot(&self, dir: &Path, name: &str) -> PathBuf {
        let png = self.ask("GET", "/screenshot", None).await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        assert_eq!(&png[1..4], b"PNG");
        let file = format!("console/{name}.png");
        let path = crate::picture_path(&file, "QW_CONSOLE_PICTURES_UNUSED", dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, png).unwrap();
        path
    }
}

fn chromedriver() -> bool {
    Command::new("chromedriver")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[tokio::test]
async fn an_operator_finds_cancels_replays_and_edits_in_a_real_browser() {
    let Some(chrome) = testkit::browser::chromium().filter(|_| chromedriver()) else {
        eprintln!("skipped: chromium or chromedriver not found (Debian: apt-get install chromium chromium-driver; .ci/run installs them)");
        return;
    };
    // the walk through every page is one large future: on the heap
    Box::pin(walk(chrome)).await;
}

/// What every step of the walk works with.
struct Walk {
    s: quota_worker::config::Settings,
    w: std::sync::Arc<quota_worker::worker::Worker>,
    conn: lapin::Connection,
    dir: PathBuf,
    addr: String,
    d: Driver,
}

impl Walk {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

async fn walk(chrome: PathBuf) {
    let ns = unique("console-browser");
    let mut s = settings(&ns);
    s.amqp.delay_levels = 3;
    let (_c, w, conn) = rig(&s).await;
    let dir = testkit::temp_dir(&ns);
    let (addr, stop_http) = serve(&s, w.store(), Guard::token(&TOKEN.into())).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let d = Driver::start(&chrome, &dir.join("profile")).await;
    let t = Walk {
        s,
        w,
        conn,
        dir,
        addr,
        d,
    };
    a_login_from_another_site_is_refused(&t).await;
    log_in_find_and_cancel(&t).await;
    // the worker stopped, so that what is replayed stays in the jobs queue
    let before = depth(&t.conn, &t.s.amqp.dead_queue).await;
    for id in ["f1", "f2"] {
        publish(&t.conn, &t.s, &job(id, "browser-dead", "fax", "default")).await;
    }
    wait_for(
        "f1 and f2 dead-lettered",
        Duration::from_secs(20),
        || async { depth(&t.conn, &t.s.amqp.dead_queue).await == before + 2 },
    )
    .await;
    stop.cancel();
    handle.await.unwrap();
    replay_a_filtered_set(&t).await;
    edit_preferences(&t).await;
    t.d.ask("DELETE", "", None).await;
    stop_http.cancel();
}

/// A page on another site (`localhost`, the console being on `127.0.0.1`) whose
/// button posts the login form with the admin token and a pre-session token of the
/// console's own: the browser sends it cross-site, without the form's cookie, and
/// the console refuses it and opens no session.
async fn a_login_from_another_site_is_refused(t: &Walk) {
    let d = &t.d;
    d.goto(&t.url("/console/login")).await;
    let form = super::ask(&t.addr, "GET", "/console/login", None, &[], "").await;
    let page = format!(
        r#"<!doctype html><form method="post" action="{}">
<input type="hidden" name="token" value="{TOKEN}">
<input type="hidden" name="login_csrf" value="{}">
<button type="submit">Win a prize</button></form>"#,
        t.url("/console/login"),
        form.field("login_csrf")
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head).await;
            let answer = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
            let _ = stream.write_all(answer.as_bytes()).await;
        }
    });
    d.goto(&format!("http://localhost:{port}/")).await;
    d.click("button[type=submit]").await;
    d.shows("another site").await;
    server.abort();
    d.goto(&t.url("/console")).await;
    d.shows("Log in").await;
}

/// Log in, read the next allowed instant of a recipient held by a one-a-day cap,
/// cancel its waiting job and find it dead-lettered `cancelled`.
async fn log_in_find_and_cancel(t: &Walk) {
    let (d, s, dir) = (&t.d, &t.s, &t.dir);
    d.goto(&t.url("/console")).await;
    d.shoot(dir, "login").await;
    d.width(390).await;
    fits(d, "login").await;
    d.width(1280).await;
    d.fill("#token", TOKEN).await;
    d.click("button[type=submit]").await;
    d.shows("Readiness").await;
    publish(&t.conn, s, &job("b1", "browser-held", "sms", "default")).await;
    publish(&t.conn, s, &job("b2", "browser-held", "sms", "default")).await;
    wait_delayed(t.w.store(), s, "b2").await;
    let (local, utc) = next_allowed(t.w.store(), s, "browser-held").await;
    d.goto(&t.url("/console/recipient")).await;
    d.fill("#recipient", "browser-held").await;
    d.click("form[role=search] button").await;
    d.shows("What holds them").await;
    assert_eq!(d.text(".next-allowed .local").await, local);
    assert_eq!(d.text(".next-allowed .utc").await, utc);
    d.click("a[href='/console/job?id=b2']").await;
    d.shows("Cancel this job").await;
    d.click("form[action='/console/job/cancel'] button").await;
    d.shows("Cancel job").await;
    d.click("form[action='/console/job/cancel'] button").await;
    d.shows("marked cancelled").await;
    let reason = dead_reason(&t.conn, &s.amqp.dead_queue, "b2").await;
    assert_eq!(reason, "cancelled");
}

/// Filter the dead letters by reason, look at one, replay the set after its
/// confirmation, and find them back in the jobs queue.
async fn replay_a_filtered_set(t: &Walk) {
    let d = &t.d;
    d.goto(&t.url("/console/dead")).await;
    d.click("#reason option[value=unknown_channel]").await;
    d.click("form[role=search] button").await;
    d.shows("2 dead letter(s) selected").await;
    d.click("table tbody tr td a").await;
    d.shows("Headers and properties").await;
    d.goto(&t.url("/console/dead?reason=unknown_channel")).await;
    d.click("form[action='/console/dead/confirm'] button").await;
    d.shows("dead letter(s) selected by reason").await;
    assert_eq!(d.text(".count").await, "2");
    d.click("form[action='/console/dead/apply'] button").await;
    d.shows("2 of the 2 dead letter(s) listed").await;
    let back = drain_ids(&t.conn, &t.s.amqp.jobs_queue).await;
    assert_eq!(back, ["f1", "f2"]);
}

/// Opt a recipient out of a category: their next job is dead-lettered `opted_out`.
async fn edit_preferences(t: &Walk) {
    let d = &t.d;
    d.goto(&t.url("/console/recipient?recipient=browser-prefs"))
        .await;
    d.fill("#preferences", r#"{"categories": {"marketing": false}}"#)
        .await;
    d.click("form[action='/console/recipient/preferences'] button")
        .await;
    d.shows("Preferences saved.").await;
    publish(
        &t.conn,
        &t.s,
        &job("m1", "browser-prefs", "sms", "marketing"),
    )
    .await;
    let mut outcomes = Vec::new();
    for _ in 0..20 {
        let outcome = step(&t.w, &t.conn, &t.s).await;
        if outcome == Outcome::Dead(Reason::OptedOut) {
            return;
        }
        outcomes.push(outcome);
    }
    panic!("m1 not dead-lettered opted_out: {outcomes:?}");
}

/// Recipients of two tenants, each held by the one-a-day cap in its own zone (a
/// job sent, the next waiting), and dead letters: expired jobs of `acme` and
/// malformed bodies.
async fn traffic(
    conn: &lapin::Connection,
    s: &quota_worker::config::Settings,
    store: &quota_worker::store::QuotaStore,
) {
    let dead_before = depth(conn, &s.amqp.dead_queue).await;
    let zones = ["Europe/Paris", "Asia/Shanghai", "America/New_York", "UTC"];
    for i in 0..8 {
        let tenant = if i % 2 == 0 { "acme" } else { "beta" };
        for n in 0..2 {
            let body = json!({"id": format!("t{i}-{n}"), "recipient": format!("user{i}@example.com"),
                "channel": "sms", "category": "default", "tenant": tenant, "timezone": zones[i % 4]});
            publish(conn, s, body.to_string().as_bytes()).await;
        }
    }
    for i in 0..3 {
        let body = json!({"id": format!("x{i}"), "recipient": format!("late{i}@example.com"),
            "channel": "sms", "category": "default", "tenant": "acme",
            "expires_at": "2020-01-01T00:00:00Z"});
        publish(conn, s, body.to_string().as_bytes()).await;
    }
    publish(conn, s, b"{\"recipient\": \"no-id\", \"channel\": 7}").await;
    publish(conn, s, b"not json \xff").await;
    for i in 0..8 {
        wait_delayed(store, s, &format!("t{i}-1")).await;
    }
    wait_for("the dead letters", Duration::from_secs(20), || async {
        depth(conn, &s.amqp.dead_queue).await >= dead_before + 5
    })
    .await;
}

/// At 390 pixels wide the page does not scroll sideways; `name` says which page.
async fn fits(d: &Driver, name: &str) {
    let widths = d
        .run("return [document.scrollingElement.scrollWidth, window.innerWidth];")
        .await;
    let (scroll, inner) = (widths[0].as_u64().unwrap(), widths[1].as_u64().unwrap());
    assert!(
        scroll <= inner,
        "{name} at 390 px: scrolls sideways ({scroll} > {inner})"
    );
}

/// Every page, 1280 then 390 pixels wide: its key elements, no sideways scroll at
/// 390, and its screenshots (`NAME.png`, `NAME-390.png`).
async fn every_page_at_1280_and_390(d: &Driver, addr: &str, dir: &Path) {
    let url = |path: &str| format!("http://{addr}{path}");
    let pages: [(&str, &str, &[&str]); 7] = [
        (
            "overview",
            "/console",
            &["#h-ready", "#h-queues", "#h-settled", "th.n"],
        ),
        (
            "recipient",
            "/console/recipient?recipient=user1%40example.com&tenant=beta",
            &[
                "#h-who",
                ".next-allowed .local",
                "section[aria-labelledby=h-waiting] table",
                "#viewer-tz",
            ],
        ),
        (
            "job",
            "/console/job?id=t1-1",
            &["ol.timeline", "form[action='/console/job/cancel']"],
        ),
        (
            "dead-letters",
            "/console/dead",
            &[
                "select#reason",
                "select#policy",
                "select#channel",
                "input#tenant",
                "table.stack tbody tr",
            ],
        ),
        (
            "dead-letter",
            "",
            &[
                "#h-headers",
                "pre.body",
                "form[action='/console/dead/confirm']",
            ],
        ),
        (
            "policies",
            "/console/policies",
            &[
                "#h-policies",
                "#h-limits",
                "section[aria-labelledby=h-limits] table.stack",
                "#h-quotas",
                "section[aria-labelledby=h-quotas] table.stack",
                "#h-tenants",
                "#h-channels",
            ],
        ),
        (
            "waiting",
            "/console/waiting",
            &[
                "section[aria-labelledby=h-held] table",
                "section[aria-labelledby=h-jobs] table",
                "select#policy",
            ],
        ),
    ];
    for width in [1280, 390] {
        d.width(width).await;
        for (name, path, keys) in pages {
            if path.is_empty() {
                // the dead letter of the list's first row
                d.goto(&url("/console/dead?reason=expired")).await;
                d.click("table tbody tr td a").await;
                d.shows("Body, as received").await;
            } else {
                d.goto(&url(path)).await;
            }
            for key in keys {
                let found = d
                    .ask(
                        "POST",
                        "/elements",
                        Some(json!({"using": "css selector", "value": key})),
                    )
                    .await;
                let source = d.source().await;
                assert!(
                    found.as_array().is_some_and(|a| !a.is_empty()),
                    "{name}: no {key} in {source}"
                );
            }
            let shot = if width == 390 {
                format!("{name}-390")
            } else {
                name.to_string()
            };
            if width == 390 {
                fits(d, name).await;
            }
            d.shoot(dir, &shot).await;
        }
        // a confirmation, left unconfirmed
        d.goto(&url("/console/dead?reason=expired")).await;
        d.click("form[action='/console/dead/confirm'] button.danger")
            .await;
        d.shows("dead letter(s) selected by reason").await;
        assert_eq!(d.text(".count").await, "3");
        if width == 390 {
            fits(d, "dead-letters-confirm").await;
        }
        let shot = if width == 390 {
            "dead-letters-confirm-390"
        } else {
            "dead-letters-confirm"
        };
        d.shoot(dir, shot).await;
    }
    d.width(1280).await;
}

#[tokio::test]
async fn every_page_of_a_running_worker_with_traffic_at_1280_and_390_pixels() {
    let Some(chrome) = testkit::browser::chromium().filter(|_| chromedriver()) else {
        eprintln!("skipped: chromium or chromedriver not found");
        return;
    };
    Box::pin(every_page(chrome)).await;
}

/// `quota-worker run` serving the console (loopback, no token: a session opens by
/// itself), acme's own default policy, the traffic published, then every page.
async fn every_page(chrome: PathBuf) {
    let ns = unique("console-pages-browser");
    let mut s = settings(&ns);
    s.amqp.delay_levels = 3;
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", free_port(None));
    super::pages::limits_and_a_quota(&mut s);
    let (_c, w, conn) = rig(&s).await;
    let dir = testkit::temp_dir(&ns);
    let toml = format!(
        "{}\n[tenants.acme.policies.default]\nrules = [{{ limit = 1, window = \"1d\" }}, {{ limit = 5, window = \"7d\" }}]\n",
        testkit::env::worker_toml(&s)
    );
    std::fs::write(dir.join("worker.toml"), toml).unwrap();
    let _worker = testkit::procs::WorkerProc::spawn_serving(crate::BIN, &s, &dir, "0");
    let addr = s.http.listen.clone();
    wait_for("/readyz 200", Duration::from_secs(30), || async {
        matches!(http_get(&addr, "/readyz").await, Some((200, _)))
    })
    .await;
    traffic(&conn, &s, w.store()).await;
    // the overview once the queues are read and two samples taken
    wait_for(
        "queues read and settled jobs sampled",
        Duration::from_secs(30),
        || async {
            let Some((200, body)) = http_get(&addr, "/status.json").await else {
                return false;
            };
            let r: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            !r["queues_at"].is_null()
                && r["rates"][0]["counts"]
                    .as_array()
                    .is_some_and(|c| c.len() >= 2)
        },
    )
    .await;
    let d = Driver::start(&chrome, &dir.join("profile")).await;
    d.goto(&format!("http://{addr}/console")).await;
    d.shows("Readiness").await;
    every_page_at_1280_and_390(&d, &addr, &dir).await;
    d.ask("DELETE", "", None).await;
}
