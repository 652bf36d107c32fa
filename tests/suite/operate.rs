//! Operating a running worker: shadow mode, policy changes without a restart
//! (SIGHUP and `admin reload`), the metrics operators read, and the status page in
//! a real headless Chromium. Each test runs `quota-worker run` with HTTP on a free
//! port and its own queue names and key prefix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::*;
use quota_worker::config::Settings;
use serde_json::Value;
use testkit::procs::{self, WorkerProc};
use testkit::*;

/// A serving worker for `s` with `extra` TOML after the test's policies and
/// channels; returns it with its config file.
async fn serving(s: &mut Settings, dir: &Path, extra: &str) -> (WorkerProc, PathBuf) {
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", testkit::free_port(None));
    let config = dir.join("worker.toml");
    std::fs::write(&config, format!("{}{extra}", testkit::env::worker_toml(s))).unwrap();
    let w = WorkerProc::spawn_serving(crate::BIN, s, dir, "0");
    let addr = s.http.listen.clone();
    wait_for("/readyz 200", Duration::from_secs(30), || async {
        matches!(http_get(&addr, "/readyz").await, Some((200, _)))
    })
    .await;
    (w, config)
}

async fn metrics(s: &Settings) -> String {
    http_get(&s.http.listen, "/metrics").await.unwrap().1
}

async fn status(s: &Settings) -> Value {
    let (code, body) = http_get(&s.http.listen, "/status.json").await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

fn job(id: &str, recipient: &str, category: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"{recipient}","channel":"sms","category":"{category}"}}"#)
        .into_bytes()
}

/// Wait until `queue` holds `n` messages.
async fn wait_depth(conn: &lapin::Connection, queue: &str, n: u32) {
    wait_for(
        &format!("{n} messages in {queue}"),
        Duration::from_secs(20),
        || async { depth(conn, queue).await == n },
    )
    .await;
}

/// The messages in every delay queue.
async fn delayed(conn: &lapin::Connection, s: &Settings) -> u32 {
    let ladder = topology(s).ladder();
    let mut n = 0;
    for level in 0..ladder.levels {
        n += depth(conn, &ladder.queue(level)).await;
    }
    n
}

#[tokio::test]
async fn a_shadow_policy_sends_every_job_records_it_and_counts_what_it_would_have_held() {
    let ns = unique("shadow");
    let mut s = settings(&ns);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir(&ns);
    let promo = "[policies.promo]\nrules = [{ limit = 1, window = \"1d\" }]\nmode = \"shadow\"\n";
    let (mut w, config) = serving(&mut s, &dir, promo).await;
    let conn = amqp().await;
    for i in 1..=3 {
        publish(&conn, &s, &job(&format!("p{i}"), "r1", "promo")).await;
    }
    // the same under the enforced default policy: the second is held
    publish(&conn, &s, &job("d1", "r2", "default")).await;
    publish(&conn, &s, &job("d2", "r2", "default")).await;
    let sms = topology(&s).dispatch_queue("sms");
    wait_depth(&conn, &sms, 4).await;
    // (d2's delay is confirmed apart from d1's dispatch: it may land a moment later)
    wait_for("d2 in a delay queue", Duration::from_secs(20), || async {
        delayed(&conn, &s).await >= 1
    })
    .await;
    assert_eq!(
        delayed(&conn, &s).await,
        1,
        "only the enforced policy held one"
    );
    assert_eq!(depth(&conn, &sms).await, 4, "and sent the others");

    // every shadow send is recorded, so caps that start enforcing count them
    let args = ["admin", "recipient", "r1", "--category", "promo", "--json"];
    let out = qw_with_config(&s, &config, &args);
    let sends = json(&out)["policies"][0]["sends"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(sends.len(), 3, "{}", stdout(&out));

    let m = metrics(&s).await;
    for expected in [
        r#"quota_worker_shadow_total{policy="promo",verdict="allowed"} 1"#,
        r#"quota_worker_shadow_total{policy="promo",verdict="held_cap"} 2"#,
        r#"quota_worker_jobs_total{outcome="dispatched",reason="",policy="promo",channel="sms"} 3"#,
        r#"quota_worker_delays_total{cause="cap"} 1"#,
    ] {
        assert!(m.contains(expected), "{expected} in\n{m}");
    }
    assert!(
        !m.contains(r#"policy="default",verdict"#),
        "no verdicts for enforced policies"
    );
    let st = status(&s).await;
    let policy = st["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "promo")
        .unwrap();
    assert_eq!(policy["mode"], "shadow");
    assert_eq!(w.stop().map(|s| s.success()), Some(true));
}

#[tokio::test]
async fn metrics_answer_operators_questions_each_with_help_and_histograms_not_summaries() {
    let ns = unique("opmetrics");
    let mut s = settings(&ns);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir(&ns);
    let (mut w, _) = serving(&mut s, &dir, "").await;
    let conn = amqp().await;
    publish(&conn, &s, &job("m1", "r1", "default")).await;
    publish(&conn, &s, &job("m2", "r1", "default")).await;
    publish(&conn, &s, b"not json").await;
    let jobs = s.amqp.jobs_queue.clone();
    let dead = s.amqp.dead_queue.clone();
    // the depth gauges come from passive declares every 5 s
    let (m_jobs, m_dead) = (
        format!(r#"quota_worker_queue_messages{{role="jobs",queue="{jobs}"}} 0"#),
        format!(r#"quota_worker_queue_messages{{role="dead",queue="{dead}"}} 1"#),
    );
    wait_for(
        "the queue depths in /metrics",
        Duration::from_secs(20),
        || async {
            let m = metrics(&s).await;
            m.contains(&m_jobs) && m.contains(&m_dead)
        },
    )
    .await;
    let m = metrics(&s).await;
    let consumers = format!(r#"quota_worker_queue_consumers{{role="jobs",queue="{jobs}"}} 1"#);
    for expected in [
        consumers.as_str(),
        "quota_worker_ready 1",
        r#"quota_worker_up{dependency="broker"} 1"#,
        r#"quota_worker_up{dependency="redis"} 1"#,
        &format!(
            r#"quota_worker_build_info{{version="{}"}} 1"#,
            env!("CARGO_PKG_VERSION")
        ),
        "# TYPE quota_worker_admission_batch_jobs histogram",
        r#"quota_worker_admission_batch_jobs_bucket{le="128"}"#,
        r#"quota_worker_delay_seconds_bucket{cause="cap",le="86400"}"#,
        r#"quota_worker_jobs_total{outcome="dead",reason="malformed",policy="",channel=""} 1"#,
        "# TYPE process_cpu_seconds_total counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# TYPE process_open_fds gauge",
        r#"quota_worker_reloads_total{result="applied"} 0"#,
    ] {
        assert!(m.contains(expected), "{expected} in\n{m}");
    }
    // the one delay holds m2 until the next midnight (UTC): its length is recorded
    let value = |series: &str| -> f64 {
        let prefix = format!("{series} ");
        m.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("{series} in\n{m}"))
            .parse()
            .unwrap()
    };
    let now = chrono::Utc::now();
    let midnight = (now.date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let to_midnight = (midnight.and_utc() - now).num_milliseconds() as f64 / 1000.0;
    assert_eq!(
        value(r#"quota_worker_delay_seconds_count{cause="cap"}"#),
        1.0
    );
    let held = value(r#"quota_worker_delay_seconds_sum{cause="cap"}"#);
    assert!(
        (held - to_midnight).abs() < 60.0,
        "held {held} s, {to_midnight} s to midnight"
    );
    assert_eq!(
        value(r#"quota_worker_delay_seconds_bucket{cause="cap",le="86400"}"#),
        1.0
    );
    // every family has a HELP line, none is a summary, names follow the conventions
    let types: Vec<&str> = m
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    assert!(types.len() >= 20, "{types:?}");
    for t in &types {
        let (name, kind) = t.split_once(' ').unwrap();
        assert!(m.contains(&format!("# HELP {name} ")), "no HELP for {name}");
        assert_ne!(kind, "summary", "{name} is a summary");
        assert!(
            name.starts_with("quota_worker_") || name.starts_with("process_"),
            "{name}"
        );
        if kind == "counter" {
            assert!(name.ends_with("_total"), "counter {name} ends in _total");
        }
    }
    assert_eq!(w.stop().map(|s| s.success()), Some(true));
}

#[tokio::test]
async fn a_reload_applies_new_rules_keeps_recorded_sends_and_refuses_what_it_cannot_apply() {
    let ns = unique("reload");
    let mut s = settings(&ns);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir(&ns);
    let (mut w, config) = serving(&mut s, &dir, "").await;
    let written = std::fs::read_to_string(&config).unwrap();
    let conn = amqp().await;
    let sms = topology(&s).dispatch_queue("sms");

    // under the default policy (1 a day): one sent, one held
    publish(&conn, &s, &job("j1", "r", "default")).await;
    wait_depth(&conn, &sms, 1).await;
    publish(&conn, &s, &job("j2", "r", "default")).await;
    wait_for("j2 held", Duration::from_secs(20), || async {
        delayed(&conn, &s).await == 1
    })
    .await;

    // two a day from now on: `admin reload` applies it and says what changed
    let two_a_day = written.replace(
        "[policies.default]\nrules = [{ limit = 1, window = \"1d\" }, { limit = 3, window = \"7d\" }]",
        "[policies.default]\nrules = [{ limit = 2, window = \"1d\" }]",
    );
    assert_ne!(two_a_day, written, "the test's file has the default rules");
    std::fs::write(&config, &two_a_day).unwrap();
    let out = qw_with_config(&s, &config, &["admin", "reload"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "applied: policy `default` changed\n");
    // j1's send is still counted: the third of the day is held
    publish(&conn, &s, &job("j3", "r", "default")).await;
    wait_depth(&conn, &sms, 2).await;
    publish(&conn, &s, &job("j4", "r", "default")).await;
    wait_for("j4 held", Duration::from_secs(20), || async {
        delayed(&conn, &s).await == 2
    })
    .await;

    // an invalid file (SIGHUP this time): refused with the error `run` would give,
    // and the rules in force stay
    let bad = two_a_day.replace("window = \"1d\"", "window = \"1 day\"");
    std::fs::write(&config, &bad).unwrap();
    let check = qw_with_config(&s, &config, &["config", "check"]);
    assert!(!check.status.success());
    let start_error = stderr(&check)
        .trim()
        .trim_start_matches("error: ")
        .to_string();
    assert!(
        start_error.contains("policies.default.rules"),
        "{start_error}"
    );
    procs::signal(&w.pid().to_string(), "HUP");
    wait_for("the refusal", Duration::from_secs(10), || async {
        status(&s).await["last_reload"]["result"] == "refused"
    })
    .await;
    let last = status(&s).await["last_reload"].clone();
    let said = last["detail"][0].as_str().unwrap();
    assert!(said.contains(&start_error), "{said}\nvs\n{start_error}");
    assert!(w.running(), "a bad file does not stop the worker");
    // still two a day: a new recipient gets two
    publish(&conn, &s, &job("k1", "q", "default")).await;
    publish(&conn, &s, &job("k2", "q", "default")).await;
    wait_depth(&conn, &sms, 4).await;

    // a new channel needs its queue declared: a restart, says the refusal
    std::fs::write(&config, format!("{two_a_day}\n[channels.fax]\n")).unwrap();
    let out = qw_with_config(&s, &config, &["admin", "reload"]);
    assert_eq!(out.status.code(), Some(2), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("a restart is needed to change channels.fax (added)"),
        "{}",
        stderr(&out)
    );
    let m = metrics(&s).await;
    assert!(
        m.contains(r#"quota_worker_reloads_total{result="applied"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"quota_worker_reloads_total{result="refused"} 2"#),
        "{m}"
    );
    assert_eq!(w.stop().map(|s| s.success()), Some(true));
}

/// `quota-worker --config FILE ARGS` for settings `s`.
fn qw_with_config(s: &Settings, config: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    qw(s, &all).output().unwrap()
}

/// The page in headless Chromium (the script gets 4 s of virtual time).
fn browse(chrome: &Path, profile: &Path, args: &[&str], url: &str) -> std::process::Output {
    testkit::browser::headless(chrome, profile, 4000, args, url)
}

#[tokio::test]
async fn the_status_page_shows_the_worker_state_in_a_real_browser() {
    let Some(chrome) = testkit::browser::chromium() else {
        eprintln!(
            "skipped: chromium not found (Debian: apt-get install chromium; .ci/run installs it)"
        );
        return;
    };
    let ns = unique("page");
    let mut s = settings(&ns);
    // the cleanup knows sms is paced (its rate comes from `extra` below), so that it
    // deletes the lane queues too
    let mut paced = s.clone();
    paced.channels.get_mut("sms").unwrap().rate = Some(20);
    let _c = Cleanup::new(&paced);
    let dir = testkit::temp_dir(&ns);
    let extra = "[policies.promo]\nrules = [{ limit = 1, window = \"1d\" }]\nmode = \"shadow\"\nsend_windows = [{ days = \"mon-fri\", from = \"08:00\", to = \"21:00\" }]\n";
    let extra = format!("{extra}\n[channels.sms]\nrate = 20\nperiod = \"1s\"\nburst = 5\n");
    // the test's channels without sms, which `extra` gives with a rate
    s.channels.remove("sms");
    let (mut w, _) = serving(&mut s, &dir, &extra).await;
    let conn = amqp().await;
    publish(&conn, &s, &job("s1", "r1", "default")).await;
    publish(&conn, &s, &job("s2", "r2", "default")).await;
    publish(&conn, &s, &job("s3", "r2", "default")).await;
    publish(&conn, &s, b"{\"id\": 42}").await;
    publish(&conn, &s, b"{\"id\": 43}").await;
    let sms = topology(&s).dispatch_queue("sms");
    wait_depth(&conn, &sms, 2).await;
    // the page's state: the queues read after the jobs settled
    let published = chrono::Utc::now();
    wait_for(
        "the queues read and the jobs sampled",
        Duration::from_secs(20),
        || async {
            let st = status(&s).await;
            let read = st["queues_at"]
                .as_str()
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                .is_some_and(|t| t > published + chrono::Duration::milliseconds(200));
            let sampled: u64 = st["rates"][0]["counts"]
                .as_array()
                .map_or(0, |c| c.iter().filter_map(Value::as_u64).sum());
            read && sampled == 2
        },
    )
    .await;
    let url = format!("http://{}/", s.http.listen);

    let dom = browse(&chrome, &dir.join("profile-dom"), &["--dump-dom"], &url);
    let dom = String::from_utf8_lossy(&dom.stdout).to_string();
    assert!(
        dom.contains(r#"data-loaded="yes""#),
        "the script ran:\n{dom}"
    );
    assert!(
        dom.contains(r#"<span id="ready" class="badge ok">ready</span>"#),
        "{dom}"
    );
    let row = |cells: &[&str]| {
        let tds: Vec<String> = cells
            .iter()
            .map(|c| match c.parse::<u64>() {
                Ok(_) => format!(r#"<td class="n">{c}</td>"#),
                Err(_) => format!("<td>{c}</td>"),
            })
            .collect();
        format!("<tr>{}</tr>", tds.concat())
    };
    for expected in [
        row(&["jobs", &s.amqp.jobs_queue, "0", "1"]),
        row(&["dispatch", &sms, "2", "0"]),
        row(&["dead", &s.amqp.dead_queue, "2", "0"]),
        row(&["malformed", "2"]),
        row(&["dispatched", "2"]),
        row(&["delayed", "1"]),
        row(&["sms", "20 per second, burst 5", "20.0", "–"]),
    ] {
        assert!(dom.contains(&expected), "{expected} in\n{dom}");
    }
    assert!(
        dom.contains(r#"<span>promo</span> <span class="shadow">shadow</span>"#),
        "{dom}"
    );
    assert!(
        dom.contains("<td>mon,tue,wed,thu,fri 08:00-21:00</td>"),
        "{dom}"
    );
    // the charts: one per outcome, with a bar for the jobs dispatched
    for outcome in ["dispatched", "delayed", "duplicate", "superseded", "dead"] {
        assert!(
            dom.contains(&format!(r#"id="chart-{outcome}""#)),
            "{outcome}"
        );
    }
    assert!(
        dom.contains(r##"fill="#12805c""##),
        "a dispatched bar:\n{dom}"
    );

    // the picture the operating guide shows (`QW_WRITE_PICTURES=1`: docs/status-page.png)
    let png = crate::picture_path("status-page.png", "QW_SCREENSHOT", &dir);
    let shot = browse(
        &chrome,
        &dir.join("profile-shot"),
        &[
            "--window-size=1280,1000",
            &format!("--screenshot={}", png.display()),
        ],
        &url,
    );
    let bytes = std::fs::read(&png).unwrap_or_default();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "a screenshot of the page: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    assert_eq!(w.stop().map(|s| s.success()), Some(true));
}
