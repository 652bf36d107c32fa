//! The benchmark harness (`src/bin/bench.rs`) runs end to end: every step, small,
//! on the debug build. It checks that every job is accounted for with the outcome its
//! mix must give, that the report and the plot are written and that the run leaves no
//! queue behind; it checks no speed (figures come from `target/release/bench`).

mod common;

use std::process::Command;

use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_runs_every_step_and_accounts_for_every_job() {
    let out = common::procs::temp_dir("bench");
    let jobs = 1_500u64;
    let run = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--quick", "--no-realtime", "--rounds", "1"])
        .args(["--jobs", &jobs.to_string(), "--recipients", "500"])
        .args(["--steps", "engine,a,b,c,latency,memory"])
        .arg("--out")
        .arg(&out)
        .args([
            "--amqp",
            &common::amqp_url(),
            "--redis",
            &common::redis_url(),
        ])
        .env("QW_BENCH_RATE", "200")
        .output()
        .expect("running bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed: {stderr}");

    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("bench.json")).unwrap()).unwrap();
    let svg = std::fs::read_to_string(out.join("bench.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Admission latency"));

    let mixes = report["mixes"].as_array().unwrap();
    let names: Vec<&str> = mixes.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a-allowed", "b-zipf", "c-malformed"]);
    let outcome = |m: &Value, k: &str| m["outcomes"][k].as_u64().unwrap_or(0);
    // (a) distinct recipients: all dispatched
    assert_eq!(outcome(&mixes[0], "dispatched"), jobs, "{}", mixes[0]);
    // (b) Zipf-skewed recipients, one send a day each: the rest waits in the ladder
    let (sent, delayed) = (
        outcome(&mixes[1], "dispatched"),
        outcome(&mixes[1], "delayed"),
    );
    assert_eq!(sent + delayed, jobs, "{}", mixes[1]);
    assert!(delayed > jobs / 2 && sent > 0, "{}", mixes[1]);
    // (c) all malformed: all dead-lettered with that reason
    assert_eq!(outcome(&mixes[2], "dead:malformed"), jobs, "{}", mixes[2]);
    for m in &mixes[..2] {
        assert!(m["admission_p99_ms"].as_f64().is_some(), "{m}");
        assert!(m["redis_calls_per_job"].as_f64().unwrap() > 0.0, "{m}");
    }
    for m in mixes {
        assert!(m["ceiling_jobs_per_sec"].as_f64().unwrap() > 0.0, "{m}");
        assert!(m["peak_rss_mib"].as_f64().unwrap() > 0.0, "{m}");
        assert!(!m["rss_curve_mib"].as_array().unwrap().is_empty(), "{m}");
        let rounds = m["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 1, "--rounds 1: {m}");
        assert_eq!(rounds[0]["ratio"], m["ratio_to_ceiling"], "{m}");
    }

    let latency = report["latency"].as_array().unwrap();
    assert_eq!(latency.len(), 1, "--no-realtime: the default pass only");
    assert_eq!(latency[0]["scheduling"], "default");
    assert!(latency[0]["jobs"].as_u64().unwrap() > 0);
    assert!(latency[0]["admission_p99_ms"].as_f64().is_some());
    assert!(latency[0]["redis_call_p99_ms"].as_f64().is_some());
    assert!(latency[0]["jobs_per_redis_call"].as_f64().unwrap() >= 1.0);
    assert!(report["engine_admissions_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(report["memory_recipients"], 500);
    assert!(report["memory_usage_one_recipient"].as_i64().unwrap() > 0);

    // nothing is left behind: the run's names carry the bench process's id
    let conn = common::amqp().await;
    let pid = stderr_pid(&stderr).unwrap_or_else(|| panic!("no run id in: {stderr}"));
    for q in [
        format!("bench{pid}m0r0a0.jobs"),
        format!("bench{pid}c0r0a0.jobs.src"),
        format!("bench{pid}l.jobs"),
    ] {
        assert!(
            common::inspect(&conn, &q).await.is_none(),
            "{q} left behind"
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

/// The run id the benchmark prints (`run bench<pid>`).
fn stderr_pid(stderr: &str) -> Option<u32> {
    stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("run bench"))
        .and_then(|p| p.trim().parse().ok())
}
