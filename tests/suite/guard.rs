//! The mutating endpoints' guard (`http.admin_token`): 401 without the token or with
//! another, 403 beyond loopback without one configured; `admin reload` sends it;
//! the status page and `/status.json` show no secret and no recipient.

use std::process::{Child, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::cli::*;
use quota_worker::health::Health;
use quota_worker::http::{App, Guard};
use testkit::*;
use tokio_util::sync::CancellationToken;

/// `method path` with an optional bearer token: the status code.
async fn call(addr: &str, method: &str, path: &str, token: Option<&str>) -> u16 {
    let token = token.map(|t| secrecy::SecretString::from(t.to_string()));
    quota_worker::http::ask_as(
        addr.parse().unwrap(),
        method,
        path,
        token.as_ref(),
        Duration::from_secs(5),
    )
    .await
    .unwrap()
    .0
}

#[tokio::test]
async fn mutating_endpoints_answer_401_or_403_and_the_others_answer_anyone() {
    for (guard, expect) in [
        (
            Guard::token(&"s3cret".into()),
            [(None, 401), (Some("wrong"), 401), (Some("s3cret"), 503)],
        ),
        (
            Guard::Refused,
            [(None, 403), (Some("wrong"), 403), (Some("s3cret"), 403)],
        ),
        (
            Guard::Open,
            [(None, 503), (Some("wrong"), 503), (Some("s3cret"), 503)],
        ),
    ] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = CancellationToken::new();
        let app = App {
            metrics: None,
            health: Arc::new(Health::default()),
            status: Arc::default(),
            guard: guard.clone(),
            api_guard: Guard::Open,
        };
        let server = tokio::spawn(quota_worker::http::serve(
            listener,
            quota_worker::http::app(app),
            stop.clone(),
        ));
        // 503: through the guard, to a worker not running yet
        for (token, code) in expect {
            assert_eq!(
                call(&addr, "POST", "/reload", token).await,
                code,
                "{guard:?} {token:?}"
            );
        }
        for path in ["/", "/status.json", "/healthz"] {
            assert_eq!(
                call(&addr, "GET", path, None).await,
                200,
                "{guard:?} {path}"
            );
        }
        stop.cancel();
        server.await.unwrap().unwrap();
    }
}

/// Kills the child if the test fails before it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Settings `ns` with HTTP on every interface (so the mutating endpoints ask for
/// a token), their cleanup, and the address to ask the worker on.
fn on_every_interface(ns: &str) -> (quota_worker::config::Settings, Cleanup, String) {
    let mut s = settings(ns);
    s.http.enabled = true;
    let port = testkit::free_port(None);
    s.http.listen = format!("0.0.0.0:{port}");
    let c = Cleanup::new(&s);
    (s, c, format!("127.0.0.1:{port}"))
}

/// Wait until the worker at `addr` is ready.
async fn ready(addr: &str) {
    wait_for("/readyz 200", Duration::from_secs(30), || async {
        matches!(testkit::http_get(addr, "/readyz").await, Some((200, _)))
    })
    .await;
}

#[tokio::test]
async fn admin_reload_sends_the_token_and_the_pages_show_no_secret_and_no_recipient() {
    let ns = unique("guard");
    let (s, _c, addr) = on_every_interface(&ns);
    let token = format!("token-{}", uuid::Uuid::now_v7().simple());
    let hash_key = format!("hash-key-{}", uuid::Uuid::now_v7().simple());
    let recipient = "+15550001234";

    // without a token: `config check` warns, and the running worker answers 403
    let check = run_async(&s, &["config", "check"], None).await;
    assert!(
        stderr(&check).contains("http.admin_token is not set"),
        "{}",
        stderr(&check)
    );
    {
        let _worker = Running(
            qw(&s, &["run"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        ready(&addr).await;
        let refused = run_async(&s, &["admin", "reload"], None).await;
        assert_eq!(refused.status.code(), Some(2), "{}", stderr(&refused));
        assert!(
            stderr(&refused).contains("http.admin_token is not set"),
            "{}",
            stderr(&refused)
        );
    }

    let with_token = |s: &quota_worker::config::Settings, args: &[&str]| {
        let mut cmd = qw(s, args);
        cmd.env("QUOTA_WORKER__HTTP__ADMIN_TOKEN", &token)
            .env("QUOTA_WORKER__REDIS__HASH_KEY", &hash_key);
        cmd
    };
    let _worker = Running(
        with_token(&s, &["run"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    ready(&addr).await;
    // the CLI with the token: applied; without it: 401, exit 2
    let cmd = with_token(&s, &["admin", "reload"]);
    let applied = tokio::task::spawn_blocking(move || {
        let mut cmd = cmd;
        cmd.output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(applied.status.success(), "{}", stderr(&applied));
    assert!(
        stdout(&applied).starts_with("applied"),
        "{}",
        stdout(&applied)
    );
    let unauthorized = run_async(&s, &["admin", "reload"], None).await;
    assert_eq!(unauthorized.status.code(), Some(2));
    assert!(
        stderr(&unauthorized).contains("Bearer"),
        "{}",
        stderr(&unauthorized)
    );
    assert_eq!(call(&addr, "POST", "/reload", Some("not-it")).await, 401);

    // a job for a recipient, then the pages
    let conn = amqp().await;
    let body = format!(r#"{{"id":"g-1","recipient":"{recipient}","channel":"sms"}}"#);
    publish(&conn, &s, body.as_bytes()).await;
    wait_for("the job dispatched", Duration::from_secs(15), || async {
        testkit::http_get(&addr, "/status.json")
            .await
            .is_some_and(|(_, b)| b.contains(r#"["dispatched",1]"#))
    })
    .await;
    for path in ["/", "/status.json"] {
        let (code, page) = testkit::http_get(&addr, path).await.unwrap();
        assert_eq!(code, 200);
        for secret in [
            token.as_str(),
            hash_key.as_str(),
            recipient,
            "guest:guest",
            "5550001234",
        ] {
            assert!(!page.contains(secret), "{path} shows `{secret}`");
        }
    }
}

mod named;
