//! The integration tests, one module per area of the worker, in one binary over the
//! support the tests and the benchmark share (`testkit`, the workspace's
//! `quota-worker-testkit`). `cargo test --test suite waiting::` runs one area.
//!
//! Every test has names of its own (queues, keys; `testkit::unique`) and cleans up
//! after itself, so the tests of every area run in parallel in this one process. A
//! test that changes what is process-wide runs in a child process of its own
//! ([`in_own_process`]): only `observability`'s, which installs the worker's metrics
//! recorder, as `quota-worker run` does.
//!
//! Besides the areas: `cli` runs the binary, `scenarios` are the engine scenarios that
//! `engine` runs on one Redis and `cluster` on a Redis Cluster.

mod cli;
mod scenarios;

mod admin;
mod campaign;
mod caps;
mod cluster;
mod compose;
mod config_cli;
mod connections;
mod console;
mod dashboard;
mod digest;
mod docs;
mod engine;
mod erase;
mod escalation;
mod examples;
mod fair;
mod fallback;
mod feedback;
mod fuzz;
mod guard;
mod http;
mod lanes;
mod layers;
mod limits;
mod limits_run;
mod observability;
mod operate;
mod pacing;
mod pipeline;
mod preference_api;
mod preference_tools;
mod preferences;
mod privileges;
mod producer;
mod reference;
mod tracing;
mod waiting;
mod windows;

use std::process::Command;

/// The `quota-worker` binary cargo built for these tests.
const BIN: &str = env!("CARGO_BIN_EXE_quota-worker");

/// Where a test that draws a picture for the documentation writes it: with
/// `QW_WRITE_PICTURES=1`, `docs/<name>` in the repository (the picture the guide shows);
/// else the path in the environment variable `var` if set, else `<dir>/<name>`, so a
/// test run leaves the repository's pictures as they are.
fn picture_path(name: &str, var: &str, dir: &std::path::Path) -> std::path::PathBuf {
    if std::env::var("QW_WRITE_PICTURES").is_ok_and(|v| v == "1") {
        return std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("docs")
            .join(name);
    }
    std::env::var(var)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| dir.join(name))
}

/// Set in the child process [`in_own_process`] starts.
const OWN_PROCESS: &str = "QW_SUITE_OWN_PROCESS";

/// Run the test `name` (its path in this binary, e.g. `observability::...`) alone in
/// a child process of this binary, for a test that sets what a process has once: the
/// global metrics recorder, which would also count the jobs of every test running
/// beside it. In the test process this runs the child and asserts that the test
/// passed there, then returns true (the test is done); in the child it returns false
/// (the test goes on, alone). The child's output is printed as the test's own.
fn in_own_process(name: &str) -> bool {
    if std::env::var_os(OWN_PROCESS).is_some() {
        return false;
    }
    let out = Command::new(std::env::current_exe().expect("the test binary"))
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(OWN_PROCESS, "1")
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in a process of its own: {}",
        out.status
    );
    true
}
