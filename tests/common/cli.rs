//! Running the `quota-worker` binary in tests (`common::cli`): the same unique names as the
//! in-process settings, passed as QUOTA_WORKER__SECTION__KEY variables.
#![allow(dead_code)]

use std::io::Write;
use std::process::{Command, Output, Stdio};

use quota_worker::config::Settings;
use serde_json::Value;

/// The environment that gives the binary `s`'s scalar sections (`[amqp]` with its
/// `[amqp.tls]`, `[redis]` with `[redis.tls]`, `[worker]`, `[http]`) and each custom
/// policy's scope and action, as `QUOTA_WORKER__SECTION__KEY` variables. The hash
/// key is left out (it serializes redacted); a test that needs its own sets it.
/// Rules, lists of tables, cannot be variables: `procs::WorkerProc` writes them to a
/// file.
pub fn env_for(s: &Settings) -> Vec<(String, String)> {
    let v = serde_json::to_value(s).unwrap();
    let scalar = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
            .join(","),
        other => other.to_string(),
    };
    let mut env = Vec::new();
    for section in ["amqp", "redis", "worker", "http"] {
        let var = |k: &str| {
            format!(
                "QUOTA_WORKER__{}__{}",
                section.to_uppercase(),
                k.to_uppercase()
            )
        };
        for (k, v) in v[section].as_object().unwrap() {
            match v {
                Value::Object(tls) => {
                    for (k2, v2) in tls {
                        env.push((format!("{}__{}", var(k), k2.to_uppercase()), scalar(v2)));
                    }
                }
                Value::Array(a) if a.is_empty() => {}
                _ if k == "hash_key" => {}
                v => env.push((var(k), scalar(v))),
            }
        }
    }
    for (name, p) in &s.policies {
        if name != "default" && name != "transactional" {
            let p = serde_json::to_value(p).unwrap();
            for key in ["scope", "action"] {
                env.push((
                    format!(
                        "QUOTA_WORKER__POLICIES__{}__{}",
                        name.to_uppercase(),
                        key.to_uppercase()
                    ),
                    scalar(&p[key]),
                ));
            }
        }
    }
    env
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
