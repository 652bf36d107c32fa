//! Named admin tokens (`http.admin_tokens`) in the running worker: each token
//! passes `POST /reload` and the console's login, and the worker's log names who
//! used it; `admin reload --as NAME` picks one; a bad one stops the worker at start
//! naming its key.

use std::process::Stdio;

use super::{on_every_interface, ready, Running};
use crate::cli::*;
use crate::console::{ask, post_login};
use testkit::*;

/// Whether a line of `log` records `action` by `who` (`key=value` or
/// `key="value"`).
fn logged(log: &str, action: &str, who: &str) -> bool {
    let has = |l: &str, k: &str, v: &str| {
        l.contains(&format!("{k}={v}")) || l.contains(&format!("{k}=\"{v}\""))
    };
    log.lines()
        .map(plain)
        .any(|l| has(&l, "action", action) && has(&l, "who", who))
}

/// `line` without its terminal colours (`ESC [ … m`).
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|&c| c == 'm');
        } else {
            out.push(c);
        }
    }
    out
}

#[tokio::test]
async fn each_named_token_passes_as_its_holder_and_the_log_says_who() {
    let ns = unique("guard-named");
    let (s, _c, addr) = on_every_interface(&ns);
    let dir = testkit::temp_dir(&ns);
    let bob = dir.join("bob");
    std::fs::write(&bob, "t-bob-0123456789\n").unwrap();
    let tokens = |cmd: &mut std::process::Command| {
        cmd.env("QUOTA_WORKER__HTTP__ADMIN_TOKEN", "t-admin-0123456789")
            .env(
                "QUOTA_WORKER__HTTP__ADMIN_TOKENS__ALICE",
                "t-alice-0123456789",
            )
            .env("QUOTA_WORKER__HTTP__ADMIN_TOKENS__BOB_FILE", &bob)
            .env("RUST_LOG", "info");
    };

    // a bad one stops the worker at start, naming the key and the variable
    let mut bad = qw(&s, &["run"]);
    tokens(&mut bad);
    bad.env("QUOTA_WORKER__HTTP__ADMIN_TOKENS__EVE", "two words");
    let out = tokio::task::spawn_blocking(move || bad.output())
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("http.admin_tokens.eve")
            && err.contains("QUOTA_WORKER__HTTP__ADMIN_TOKENS__EVE"),
        "{err}"
    );

    let log = dir.join("worker.log");
    let mut run = qw(&s, &["run"]);
    tokens(&mut run);
    let worker = Running(
        run.stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    ready(&addr).await;

    // `admin reload`: alice's token with --as alice; the admin token by default
    for (args, code) in [
        (&["admin", "reload", "--as", "alice"][..], Some(0)),
        (&["admin", "reload"][..], Some(0)),
        (&["admin", "reload", "--as", "carol"][..], Some(1)),
    ] {
        let mut cmd = qw(&s, args);
        tokens(&mut cmd);
        let out = tokio::task::spawn_blocking(move || cmd.output())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(out.status.code(), code, "{args:?}: {}", stderr(&out));
    }

    // the console's login with bob's token (read from its file): bob's session
    let login = post_login(&addr, "t-bob-0123456789", "").await;
    assert_eq!(login.code, 303, "{login:?}");
    let cookie = login.cookie().unwrap();
    let page = ask(&addr, "GET", "/console", Some(&cookie), &[], "").await;
    assert!(page.body.contains("bob"), "{}", page.body);
    assert!(!page.body.contains("t-bob"), "no token on a page");
    let wrong = post_login(&addr, "t-carol", "").await;
    assert_eq!(wrong.code, 401);

    drop(worker);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(logged(&log, "reload", "alice"), "{log}");
    assert!(logged(&log, "reload", "admin"), "{log}");
    assert!(logged(&log, "login", "bob"), "{log}");
    assert!(
        !log.contains("t-alice") && !log.contains("t-bob"),
        "no token in the log"
    );
}
