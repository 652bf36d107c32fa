//! Running the `quota-worker` binary in tests: the same unique names as the
//! in-process settings, passed as QUOTA_WORKER__SECTION__KEY variables.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use quota_worker::config::Settings;
use serde_json::Value;

/// The environment that makes the binary use `s`'s names and servers.
pub fn env_for(s: &Settings) -> Vec<(String, String)> {
    let a = &s.amqp;
    let mut vars = vec![
        ("AMQP__URL", a.url.clone()),
        ("AMQP__JOBS_EXCHANGE", a.jobs_exchange.clone()),
        ("AMQP__JOBS_QUEUE", a.jobs_queue.clone()),
        ("AMQP__DISPATCH_EXCHANGE", a.dispatch_exchange.clone()),
        (
            "AMQP__DISPATCH_QUEUE_PREFIX",
            a.dispatch_queue_prefix.clone(),
        ),
        ("AMQP__DEAD_EXCHANGE", a.dead_exchange.clone()),
        ("AMQP__DEAD_QUEUE", a.dead_queue.clone()),
        ("AMQP__DELAY_PREFIX", a.delay_prefix.clone()),
        ("AMQP__DELIVERY_LIMIT", a.delivery_limit.to_string()),
        ("REDIS__URL", s.redis.url.clone()),
        ("REDIS__KEY_PREFIX", s.redis.key_prefix.clone()),
        ("WORKER__THREADS", s.worker.threads.to_string()),
        ("HTTP__ENABLED", s.http.enabled.to_string()),
        ("HTTP__LISTEN", s.http.listen.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect::<Vec<_>>();
    for (name, p) in &s.policies {
        if name != "default" && name != "transactional" {
            let scope = match p.scope {
                quota_worker::config::Scope::Channel => "channel",
                quota_worker::config::Scope::Recipient => "recipient",
            };
            vars.push((
                format!("POLICIES__{}__SCOPE", name.to_uppercase()),
                scope.to_string(),
            ));
        }
    }
    vars.into_iter()
        .map(|(k, v)| (format!("QUOTA_WORKER__{k}"), v))
        .collect()
}

/// `quota-worker ARGS` for settings `s`, with no inherited configuration.
pub fn qw(s: &Settings, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quota-worker"));
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
