//! The producer examples (`examples/python/publish.py`, `examples/node/publish.js`) run
//! as subprocesses, configured by the same `QUOTA_WORKER__*` variables as the worker,
//! against the machine's RabbitMQ and a worker running in this process: their jobs are
//! dispatched byte for byte under their ids, a second copy of an id is a duplicate, and
//! a job no queue receives or an exchange that is not there makes them fail. And
//! `examples/python/preferences.py` edits a recipient's set through the worker's
//! preferences API.
//!
//! An example whose runtime or client library is missing is skipped with a line on
//! stderr saying how to install it (`.ci/run` installs both).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use crate::cli::{stderr, stdout};
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ExchangeKind};
use quota_worker::config::Settings;
use serde_json::{json, Value};
use testkit::audit::{Audit, Published};
use testkit::env::env_for;
use testkit::*;

const WAIT: Duration = Duration::from_secs(10);

/// A payload with what JSON round trips can get wrong: non-ASCII text, escapes,
/// nesting, floats, null and the largest integer a JavaScript number holds exactly.
const PAYLOAD: &str = r#"{"text":"Grüße, 你好 👋 \"quoted\"\n","n":[1,2.5,-3],"nested":{"ok":true,"none":null},"big":9007199254740991}"#;

/// One example and how to run it.
struct Example {
    name: &'static str,
    program: &'static str,
    script: PathBuf,
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The Python example, or why it cannot run here.
fn python() -> Result<Example, String> {
    let imports = std::process::Command::new("python3")
        .args(["-c", "import pika"])
        .output();
    match imports {
        Ok(out) if out.status.success() => Ok(Example {
            name: "python",
            program: "python3",
            script: examples_dir().join("python/publish.py"),
        }),
        Ok(_) => Err(
            "python3 cannot import pika; install it with `python3 -m pip install -r examples/python/requirements.txt`".into(),
        ),
        Err(e) => Err(format!("python3 does not run ({e}); install Python 3")),
    }
}

/// The Node example, or why it cannot run here.
fn node() -> Result<Example, String> {
    let dir = examples_dir().join("node");
    if !dir.join("node_modules/amqplib").is_dir() {
        return Err(
            "examples/node/node_modules/amqplib is missing; install it with `cd examples/node && npm ci`".into(),
        );
    }
    if let Err(e) = std::process::Command::new("node").arg("--version").output() {
        return Err(format!(
            "node does not run ({e}); install Node.js 18.3 or later"
        ));
    }
    Ok(Example {
        name: "node",
        program: "node",
        script: dir.join("publish.js"),
    })
}

impl Example {
    /// Run the example with `s`'s environment (and nothing inherited from ours).
    async fn run(&self, s: &Settings, args: &[&str]) -> Output {
        let mut cmd = tokio::process::Command::new(self.program);
        for (k, _) in std::env::vars() {
            if k.starts_with("QUOTA_WORKER") {
                cmd.env_remove(k);
            }
        }
        cmd.arg(&self.script)
            .args(args)
            .envs(env_for(s))
            .output()
            .await
            .unwrap_or_else(|e| panic!("running the {} example: {e}", self.name))
    }

    /// Run it, expect success, and return the id it printed.
    async fn publish(&self, s: &Settings, args: &[&str]) -> String {
        let out = self.run(s, args).await;
        assert!(
            out.status.success(),
            "the {} example failed ({:?})\nstdout: {}\nstderr: {}",
            self.name,
            out.status,
            stdout(&out),
            stderr(&out)
        );
        let printed = stdout(&out);
        let id = printed.trim_end_matches('\n');
        assert!(
            !id.is_empty() && !id.contains('\n'),
            "one id per run: {printed:?}"
        );
        id.to_string()
    }
}

/// A queue of the test's own bound to the (fanout) jobs exchange: it receives a copy
/// of every job exactly as the example published it. Exclusive, so it goes with `conn`.
async fn tap_jobs_exchange(conn: &Connection, s: &Settings) -> String {
    let ch = conn.create_channel().await.unwrap();
    let name = format!("{}.tap", s.amqp.jobs_queue);
    ch.queue_declare(
        name.as_str().into(),
        QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    ch.queue_bind(
        name.as_str().into(),
        s.amqp.jobs_exchange.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await
    .unwrap();
    name
}

/// The next job the example published, as it published it: properties checked, body
/// returned.
async fn published(conn: &Connection, tap: &str, id: &str) -> Vec<u8> {
    let m = take(conn, tap, WAIT)
        .await
        .expect("the example's job reached the exchange");
    let p = &m.delivery.properties;
    assert_eq!(message_id(&m), id, "message_id is the job id");
    assert_eq!(
        p.content_type().as_ref().map(|c| c.as_str()),
        Some("application/json")
    );
    assert_eq!(p.delivery_mode(), &Some(2), "persistent");
    m.delivery.data
}

/// Publish through `example`: a job with an id and every field the example takes, one
/// with no id (it generates one), each dispatched to its channel's queue byte for byte;
/// then the first id again, which the worker counts as a duplicate and sends nowhere.
/// Then an exchange with no queue bound and one that does not exist: both refused.
async fn publishes_jobs_the_worker_dispatches(example: Result<Example, String>) {
    let example = match example {
        Ok(e) => e,
        Err(why) => {
            // straight to stderr, past the test harness's capture, so it shows
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: the producer example cannot run here: {why}"
            );
            return;
        }
    };
    let ns = unique(example.name);
    let s = settings(&ns);
    let (_c, w, conn) = rig(&s).await;
    let tap = tap_jobs_exchange(&conn, &s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let t = topology(&s);

    let id = format!("{ns}-order-4711");
    let given = [
        "--id",
        &id,
        "--recipient",
        "+8613800000000",
        "--channel",
        "sms",
        "--category",
        "default",
        "--timezone",
        "Asia/Shanghai",
        "--payload",
        PAYLOAD,
    ];
    assert_eq!(example.publish(&s, &given).await, id);
    let generated = example
        .publish(
            &s,
            &["--recipient", "user-42@example.com", "--channel", "email"],
        )
        .await;
    assert_ne!(generated, id);
    uuid::Uuid::parse_str(&generated).expect("a generated id is a UUID");

    let payload: Value = serde_json::from_str(PAYLOAD).unwrap();
    let expected = [
        (
            id.as_str(),
            "sms",
            json!({"id": id, "recipient": "+8613800000000", "channel": "sms",
                   "category": "default", "timezone": "Asia/Shanghai",
                   "payload": payload}),
        ),
        (
            generated.as_str(),
            "email",
            json!({"id": generated, "recipient": "user-42@example.com", "channel": "email"}),
        ),
    ];
    for (id, channel, job) in &expected {
        let body = published(&conn, &tap, id).await;
        let sent: Value = serde_json::from_slice(&body).expect("the example published JSON");
        assert_eq!(
            &sent, job,
            "the example's job carries exactly its arguments"
        );
        let m = take(&conn, &t.dispatch_queue(channel), WAIT)
            .await
            .unwrap_or_else(|| panic!("job {id} dispatched to {channel}"));
        assert_eq!(message_id(&m), *id);
        assert_eq!(m.delivery.data, body, "dispatched byte for byte");
    }

    // the same id again: acked as a duplicate, not sent a second time
    assert_eq!(example.publish(&s, &given).await, id);
    published(&conn, &tap, &id).await;
    let deadline = std::time::Instant::now() + WAIT;
    while depth(&conn, &s.amqp.jobs_queue).await > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    handle.await.unwrap();
    // with the worker stopped, a copy it had not finished would be back in the jobs
    // queue: found nowhere, the copy was consumed and acked without an outcome that
    // sends it (dispatch), keeps it (the delay ladder) or dead-letters it
    let jobs: Vec<Published> = expected
        .iter()
        .map(|(id, _, _)| Published {
            id: id.to_string(),
            recipient: String::new(),
            body: Vec::new(),
        })
        .collect();
    let a = Audit::collect(&conn, &s, &jobs).await;
    assert!(a.dispatched.is_empty(), "sent twice: {:?}", a.dispatched);
    assert!(a.waiting.is_empty(), "still waiting: {:?}", a.waiting_in);
    assert!(a.dead.is_empty(), "dead-lettered: {:?}", a.dead);
    assert!(a.strangers.is_empty(), "unknown jobs: {:?}", a.strangers);

    // an exchange no queue is bound to: the job comes back (mandatory), the example fails
    let unbound = settings(&format!("{ns}-unbound"));
    let _cu = Cleanup::new(&unbound);
    let ch = conn.create_channel().await.unwrap();
    ch.exchange_declare(
        unbound.amqp.jobs_exchange.as_str().into(),
        ExchangeKind::Fanout,
        ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        },
        FieldTable::default(),
    )
    .await
    .unwrap();
    let args = ["--recipient", "r", "--channel", "sms"];
    let out = example.run(&unbound, &args).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "",
        "no id printed for a job that was not published"
    );
    assert!(stderr(&out).contains("unroutable"), "{}", stderr(&out));

    // an exchange that is not there: the broker closes the channel, the example fails
    let missing = settings(&format!("{ns}-missing"));
    let out = example.run(&missing, &args).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(stderr(&out).contains("NOT_FOUND"), "{}", stderr(&out));
}

#[tokio::test]
async fn the_python_example_publishes_jobs_the_worker_dispatches() {
    publishes_jobs_the_worker_dispatches(python()).await;
}

#[tokio::test]
async fn the_node_example_publishes_jobs_the_worker_dispatches() {
    publishes_jobs_the_worker_dispatches(node()).await;
}

/// A job given `--priority` goes to the lanes exchange (routing key
/// `<channel>.<priority>`): into its lane queue when its channel is paced, on to the
/// jobs exchange when it is not; a job without one goes to the jobs exchange. So a
/// campaign sent with the example never sits in the jobs queue in front of urgent
/// jobs.
async fn routes_a_job_with_a_priority_to_its_lane(example: Result<Example, String>) {
    let example = match example {
        Ok(e) => e,
        Err(why) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED: the producer example cannot run here: {why}"
            );
            return;
        }
    };
    let ns = unique(&format!("{}lane", example.name));
    let mut s = settings(&ns);
    s.channels.get_mut("sms").unwrap().rate = Some(100);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let t = topology(&s);
    t.declare(&conn).await.expect("topology");
    let sms = |id: &'static str, priority: Option<&'static str>| {
        let mut a = vec!["--id", id, "--recipient", "r", "--channel", "sms"];
        a.extend(priority.map(|p| ["--priority", p]).into_iter().flatten());
        a
    };
    example.publish(&s, &sms("ex-bulk", Some("bulk"))).await;
    example.publish(&s, &sms("ex-urgent", Some("urgent"))).await;
    example.publish(&s, &sms("ex-none", None)).await;
    let email = ["--id", "ex-email", "--recipient", "e", "--channel", "email"];
    example
        .publish(&s, &[&email[..], &["--priority", "urgent"]].concat())
        .await;
    let ids = |queue: String| {
        let conn = &conn;
        async move {
            let mut ids = Vec::new();
            while let Some(m) = take(conn, &queue, Duration::from_millis(300)).await {
                ids.push(message_id(&m).to_string());
            }
            ids
        }
    };
    use quota_worker::lanes::Priority;
    assert_eq!(ids(t.lane_queue("sms", Priority::Bulk)).await, ["ex-bulk"]);
    assert_eq!(
        ids(t.lane_queue("sms", Priority::Urgent)).await,
        ["ex-urgent"]
    );
    let mut jobs = ids(s.amqp.jobs_queue.clone()).await;
    jobs.sort();
    assert_eq!(jobs, ["ex-email", "ex-none"]);
}

#[tokio::test]
async fn the_python_example_routes_a_job_with_a_priority_to_its_lane() {
    routes_a_job_with_a_priority_to_its_lane(python()).await;
}

#[tokio::test]
async fn the_node_example_routes_a_job_with_a_priority_to_its_lane() {
    routes_a_job_with_a_priority_to_its_lane(node()).await;
}

/// `examples/python/preferences.py` (standard library only) against the worker's
/// preferences API: it merges an opt-out and quiet hours into a set, keeping what it
/// did not touch, prints the set stored, and exits 1 with the worker's field on a
/// refused set, or on a wrong token.
#[tokio::test]
async fn the_python_example_edits_a_set() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: python3 does not run; install Python 3");
        return;
    }
    let s = settings(&unique("prefs-python"));
    let _c = Cleanup::new(&s);
    let store = crate::preference_tools::connected(&s).await;
    let (addr, stop) = crate::preference_api::serve(
        &s,
        &store,
        quota_worker::http::Guard::token(&"api-s3cret".into()),
    )
    .await;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/python/preferences.py");
    let url = format!("http://{addr}");
    let run = |token: &'static str, args: &[&str]| {
        let mut cmd = tokio::process::Command::new("python3");
        cmd.arg(&script)
            .args(["--url", &url])
            .args(args)
            .env("QUOTA_WORKER__HTTP__API_TOKEN", token);
        async move { cmd.output().await }
    };
    quota_worker::preferences::edit::put(
        &store,
        Some("acme"),
        "anna",
        &json!({"channels": {"sms": false}}),
    )
    .await
    .unwrap();
    let out = run(
        "api-s3cret",
        &[
            "anna",
            "--tenant",
            "acme",
            "--opt-out",
            "marketing",
            "--quiet",
            "22:00-07:00",
            "--timezone",
            "Europe/Berlin",
        ],
    )
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let got = quota_worker::preferences::edit::get(&store, Some("acme"), "anna")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(printed, got);
    assert_eq!(got["channels"], json!({"sms": false}), "kept: {got}");
    assert_eq!(got["categories"], json!({"marketing": false}));
    assert_eq!(
        got["quiet_hours"]["windows"],
        json!([{"days": "daily", "from": "22:00", "to": "07:00"}])
    );
    // a refused set: the worker's field, exit 1
    let out = run(
        "api-s3cret",
        &["anna", "--tenant", "acme", "--quiet", "25:00-07:00"],
    )
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("quiet_hours.windows[0].from"), "{err}");
    // a wrong token
    let out = run("nope", &["anna", "--opt-out", "x"]).await.unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    stop.cancel();
}
