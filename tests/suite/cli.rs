//! Running the `quota-worker` binary in tests: the same unique names as the in-process
//! settings, passed as QUOTA_WORKER__SECTION__KEY variables (`testkit::env::env_for`).

use std::io::Write;
use std::process::{Command, Output, Stdio};

use quota_worker::config::Settings;
use serde_json::Value;
use testkit::env::env_for;

/// `quota-worker ARGS` for settings `s`, with no inherited configuration.
pub fn qw(s: &Settings, args: &[&str]) -> Command {
    let mut cmd = Command::new(crate::BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("QUOTA_WORKER") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env_for(s))
        .env("RUST_LOG", "warn")
        .args(["--log-format", "text"])
        .args(args);
    cmd
}

/// Run it to the end, feeding `stdin` (an empty, closed stdin when `None`).
pub fn run(s: &Settings, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = qw(s, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the quota-worker binary runs");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// Run it off the async runtime's threads.
pub async fn run_async(s: &Settings, args: &[&str], stdin: Option<&str>) -> Output {
    let s = s.clone();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let stdin = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&s, &args, stdin.as_deref())
    })
    .await
    .unwrap()
}

/// Stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A successful run's stdout, parsed as JSON.
pub fn json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status,
        stdout(out),
        stderr(out)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stdout(out)))
}
