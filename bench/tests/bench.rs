//! The benchmark harness (`bench/src/main.rs`) runs end to end: every step, small,
//! on the debug build. It checks that every job is accounted for with the outcome its
//! mix must give, that the report and the plot are written and that the run leaves no
//! queue behind; it checks no speed (figures come from `target/release/bench`).

use std::path::PathBuf;
use std::process::Command;

use lapin::{Connection, ConnectionProperties};
use serde_json::Value;
use testkit::{amqp_url, redis_url};

/// The worker binary the benchmark runs: beside the bench binary in the workspace's
/// target directory (`cargo test` at the root builds it; alone, build it here).
fn worker_binary() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_bench"));
    let worker = bench.with_file_name("quota-worker");
    if !worker.exists() {
        let built = Command::new(env!("CARGO"))
            .args(["build", "-p", "quota-worker", "--bin", "quota-worker"])
            .status()
            .expect("cargo");
        assert!(built.success(), "building quota-worker failed");
    }
    worker
}

/// Whether `queue` exists (a passive declare).
async fn exists(conn: &Connection, queue: &str) -> bool {
    let Ok(ch) = conn.create_channel().await else {
        return false;
    };
    let passive = lapin::options::QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let found = ch
        .queue_declare(queue.into(), passive, Default::default())
        .await
        .is_ok();
    let _ = ch.close(200, "".into()).await;
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_runs_every_step_and_accounts_for_every_job() {
    let jobs = 1_500u64;
    let run = run_quick(
        "all",
        &[
            "--no-realtime",
            "--rounds",
            "1",
            "--jobs",
            &jobs.to_string(),
            "--recipients",
            "500",
            "--steps",
            "engine,a,b,c,latency,memory,scale",
            "--latency-secs",
            "3",
            "--scale-recipients",
            "300,1000",
            "--scale-policies",
            "1,10",
        ],
        &[("QW_BENCH_RATE", "200")],
    );
    let report = &run.report;
    let svg = std::fs::read_to_string(run.out.join("bench.svg")).unwrap();
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
    assert_eq!(
        latency.len(),
        2,
        "--no-realtime, one round: half and a quarter of the rate, default scheduling"
    );
    for (l, share) in latency.iter().zip([0.5, 0.25]) {
        assert_eq!(l["scheduling"], "default");
        assert_eq!(l["share_of_ceiling"], share);
        let sent = l["jobs"].as_u64().unwrap();
        assert!(sent > 0, "{l}");
        assert!(l["admission_p99_ms"].as_f64().is_some());
        assert!(l["redis_call_p99_ms"].as_f64().is_some());
        assert!(l["jobs_per_redis_call"].as_f64().unwrap() >= 1.0);
        // every job offered arrives in the dispatch queue (the worker) or the output
        // queue (the pass-through), its timestamp header intact
        for side in ["end_to_end", "pass_through"] {
            let e = &l[side];
            assert!(e["sent"].as_u64().unwrap() > 0, "{side}: {l}");
            assert_eq!(e["arrived"], e["sent"], "{side}: {l}");
            assert!(e["p99_ms"].as_f64().unwrap() > 0.0, "{side}: {l}");
            assert!(!e["curve"].as_array().unwrap().is_empty(), "{side}: {l}");
        }
        assert_eq!(l["end_to_end"]["sent"], sent, "{l}");
    }
    assert!(svg.contains("End-to-end latency"));
    let summary = report["latency_summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2, "{summary:?}");

    // scale: every configuration of recipients and policies, every job dispatched
    let scale = report["scale"].as_array().unwrap();
    let configs: Vec<(u64, u64)> = scale
        .iter()
        .map(|x| {
            (
                x["recipients"].as_u64().unwrap(),
                x["policies"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(configs, [(300, 1), (300, 10), (1000, 1), (1000, 10)]);
    for x in scale {
        let rounds = x["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 1, "{x}");
        assert_eq!(outcome(&rounds[0], "dispatched"), jobs, "{x}");
        assert!(x["cpu_us_per_job"].as_f64().unwrap() > 0.0, "{x}");
    }
    // the keys written for it: 300 + 1000 with one policy, and with ten policies
    // the nine tenths of them whose policy is not `default`
    let preload = report["scale_preload"].as_array().unwrap();
    assert_eq!(preload[0][1], 300 + 270);
    assert_eq!(preload[1][1], 1000 + 900);
    assert!(report["engine_admissions_per_sec"].as_f64().unwrap() > 0.0);
    assert_eq!(report["memory_recipients"], 500);
    assert!(report["memory_usage_one_recipient"].as_i64().unwrap() > 0);

    // nothing is left behind: the run's names carry the bench process's id
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("rabbitmq");
    let pid = run.pid;
    for q in [
        format!("bench{pid}m0r0a0.jobs"),
        format!("bench{pid}c0r0a0.jobs.src"),
        format!("bench{pid}l00.jobs"),
        format!("bench{pid}lp01.jobs.src"),
        format!("bench{pid}s1000p10r0.jobs"),
    ] {
        assert!(!exists(&conn, &q).await, "{q} left behind");
    }
    assert_no_keys_left(&run);
}

/// The run id the benchmark prints (`run bench<pid>`).
fn stderr_pid(stderr: &str) -> Option<u32> {
    stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("run bench"))
        .and_then(|p| p.trim().parse().ok())
}

/// What one small run of the benchmark left: its report, what it printed, its run id
/// and its output directory.
struct Run {
    report: Value,
    stdout: String,
    pid: u32,
    out: PathBuf,
}

/// `bench --quick` with `args` (and `env`) against the machine's broker and Redis,
/// into a directory of its own (`tag`); it must succeed.
fn run_quick(tag: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
    let out = std::env::temp_dir().join(format!("qwt-bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&out).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--worker")
        .arg(worker_binary())
        .arg("--quick")
        .args(args)
        .arg("--out")
        .arg(&out)
        .args(["--amqp", &amqp_url(), "--redis", &redis_url()])
        .envs(env.iter().copied())
        .output()
        .expect("running bench");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed: {stderr}");
    let report: Value =
        serde_json::from_slice(&std::fs::read(out.join("bench.json")).unwrap()).unwrap();
    let pid = stderr_pid(&stderr).unwrap_or_else(|| panic!("no run id in: {stderr}"));
    Run {
        report,
        stdout: String::from_utf8_lossy(&run.stdout).into_owned(),
        pid,
        out,
    }
}

/// No key of run `pid` left in Redis; its output directory removed.
fn assert_no_keys_left(run: &Run) {
    let mut redis = redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("bench{}*", run.pid))
        .query(&mut redis)
        .unwrap();
    assert!(keys.is_empty(), "keys left behind: {keys:?}");
    let _ = std::fs::remove_dir_all(&run.out);
}

/// The recovery step, small: a backlog parked in the bulk lane of a channel paced at
/// half the ceiling is drained, every job reaching the dispatch queue, by one worker
/// and by three, and again with a broker restart in the middle (on a private node, where
/// one can be started); a burst of as many to the jobs exchange is read and parked;
/// the report, the table and `recovery.svg` say so, and the run leaves no key behind.
/// No speed is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recovery_step_drains_a_parked_backlog_and_reports_each_interval() {
    let run = run_quick("rc", &["--steps", "recovery", "--jobs", "1200"], &[]);
    assert!(run.stdout.contains("by 5 s interval"), "{}", run.stdout);
    let report = &run.report;
    let passes = report["recovery"].as_array().unwrap();
    let restart = testkit::procs::RabbitNode::available();
    let expected: &[(u64, bool)] = if restart {
        &[(1, false), (3, false), (1, true), (3, true)]
    } else {
        &[(1, false), (3, false)]
    };
    let got: Vec<(u64, bool)> = passes
        .iter()
        .map(|p| {
            (
                p["workers"].as_u64().unwrap(),
                p["broker_restart"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    for p in passes {
        assert_eq!(p["jobs"], 1200, "{p}");
        let rate = p["rate"].as_u64().unwrap();
        assert!(
            rate > 0 && p["ceiling_msgs_per_sec"].as_f64().unwrap() >= rate as f64,
            "{p}"
        );
        // the last point of the curve: every job in the dispatch queue (a restart
        // may add a copy of a dispatch it left unconfirmed)
        let curve = p["curve"].as_array().unwrap();
        assert!(curve.last().unwrap()[1].as_f64().unwrap() >= 1200.0, "{p}");
        assert!(p["ratio_whole"].as_f64().unwrap() > 0.0, "{p}");
        // every interval with its start, for the plot
        let intervals = p["intervals"].as_array().unwrap().len();
        assert_eq!(
            p["interval_starts"].as_array().unwrap().len(),
            intervals,
            "{p}"
        );
        if p["broker_restart"] == true {
            assert!(p["outage_secs"].as_f64().unwrap() > 0.0, "{p}");
            // every worker's session ended with the broker and started again
            assert!(p["consuming_after_secs"].as_f64().is_some(), "{p}");
            // and the lane queue served a consumer again
            assert!(p["lane_serving_after_secs"].as_f64().is_some(), "{p}");
            // the broker's last answer as it stopped was read (at or after the ask)
            assert!(p["stopping_secs"].as_f64().unwrap() >= 0.0, "{p}");
        } else {
            assert!(p["consuming_after_secs"].is_null(), "{p}");
            assert!(p["lane_serving_after_secs"].is_null(), "{p}");
            assert!(p["stopping_secs"].is_null(), "{p}");
        }
    }
    // the bursts: every job read from the jobs queue and parked, by one worker and three
    let bursts = report["bursts"].as_array().unwrap();
    let workers: Vec<u64> = bursts
        .iter()
        .map(|x| x["workers"].as_u64().unwrap())
        .collect();
    assert_eq!(workers, [1, 3]);
    for x in bursts {
        assert_eq!(x["jobs"], 1200, "{x}");
        assert!(x["parking_per_sec"].as_f64().unwrap() > 0.0, "{x}");
        assert!(
            x["publish_per_sec"].as_f64().unwrap() >= x["parking_per_sec"].as_f64().unwrap(),
            "{x}"
        );
        assert!(x["urgent_wait_secs"].as_f64().unwrap() >= 0.0, "{x}");
    }
    let svg = std::fs::read_to_string(run.out.join("recovery.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("Lane drain after a fault"));
    assert_no_keys_left(&run);
}

/// The digest step, small: 1,000 jobs of a policy with a 2 s `window` digest, ten a
/// recipient, folded by the worker binary from a backlog and then offered at half
/// that rate: in each pass every digest expected (one a recipient) reaches the
/// dispatch queue and the items in them are the jobs published, the worker counts
/// them folded and the digests dispatched, and the memory and timing figures are
/// there; the table says so, and the run leaves no queue or key behind. No speed
/// is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_digest_step_accounts_for_every_item_in_the_digests_expected() {
    let run = run_quick("dg", &["--steps", "digest", "--jobs", "1000"], &[]);
    assert!(run.stdout.contains("| digest pass |"), "{}", run.stdout);
    let report = &run.report;
    let passes = report["digests"].as_array().unwrap();
    let names: Vec<&str> = passes.iter().map(|p| p["pass"].as_str().unwrap()).collect();
    assert_eq!(names, ["backlog", "paced"]);
    for p in passes {
        assert_eq!(p["jobs"], 1000, "{p}");
        assert_eq!(p["window_secs"], 2, "{p}");
        assert_eq!(p["digests_expected"], 100, "{p}");
        assert_eq!(p["digests_sent"], 100, "{p}");
        assert_eq!(p["items_in_digests"], 1000, "{p}");
        assert_eq!(p["accounted"], true, "{p}");
        assert_eq!(p["items_folded"], 1000, "{p}");
        assert_eq!(p["outcomes"]["folded"], 1000, "{p}");
        assert_eq!(p["outcomes"]["dispatched"], 100, "{p}");
        assert!(p["items_folded_per_sec"].as_f64().unwrap() > 0.0, "{p}");
        assert!(p["peak_items_held"].as_u64().unwrap() > 0, "{p}");
        assert!(
            p["redis_bytes_per_held_item"].as_f64().unwrap() > 0.0,
            "{p}"
        );
        let e = &p["window_end_to_dispatch"];
        assert_eq!(e["arrived"], 100, "{p}");
        assert!(e["max_ms"].as_f64().unwrap() >= e["p50_ms"].as_f64().unwrap());
    }
    assert!(passes[1]["offered_jobs_per_sec"].as_f64().unwrap() > 0.0);
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("rabbitmq");
    let pid = run.pid;
    for q in [format!("bench{pid}dgb.jobs"), format!("bench{pid}dgp.jobs")] {
        assert!(!exists(&conn, &q).await, "{q} left behind");
    }
    assert_no_keys_left(&run);
}

/// The fallback step, small: 1,000 jobs routed push → email → sms with push capped
/// for every other recipient go out half on push and half on email (none on sms),
/// against mix (a) in the same round; 1,000 escalations pending leave a route state
/// and a route log each in Redis; each escalating job moves on at its deadlines, every
/// dispatch on email and sms timed from the deadline in its route; the table says so,
/// and the run leaves no queue or key behind. No speed is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_step_routes_every_job_and_times_each_escalation() {
    let run = run_quick(
        "fb",
        &["--steps", "fallback", "--jobs", "1000", "--rounds", "1"],
        &[],
    );
    assert!(run.stdout.contains("| fallback round |"), "{}", run.stdout);
    let f = &run.report["fallback"];
    assert_eq!(f["jobs"], 1000, "{f}");
    let rounds = f["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 1, "{f}");
    let r = &rounds[0];
    assert_eq!(
        (&r["push"], &r["email"], &r["sms"]),
        (&500.into(), &500.into(), &0.into()),
        "{r}"
    );
    assert_eq!(r["routed"]["outcomes"]["dispatched"], 1000, "{r}");
    assert_eq!(r["mix_a"]["outcomes"]["dispatched"], 1000, "{r}");
    assert!(f["ratio_to_mix_a"].as_f64().unwrap() > 0.0, "{f}");

    let p = &f["pending"];
    assert_eq!(
        (&p["route_states"], &p["route_logs"]),
        (&1000.into(), &1000.into()),
        "{p}"
    );
    assert!(p["route_state_memory_usage"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["bytes_per_pending"].as_f64().unwrap() > 0.0, "{p}");

    let d = &f["deadline"];
    let sent = d["jobs"].as_u64().unwrap();
    assert!(sent > 0, "{d}");
    let steps = d["steps"].as_array().unwrap();
    let moves: Vec<(&str, &str)> = steps
        .iter()
        .map(|x| (x["from"].as_str().unwrap(), x["to"].as_str().unwrap()))
        .collect();
    assert_eq!(moves, [("push", "email"), ("email", "sms")]);
    for x in steps {
        assert_eq!(x["arrived"], sent, "{x}");
        assert_eq!(x["with_deadline"], sent, "{x}");
        // nothing moves on before its deadline (the deadline is the worker's
        // estimate of Redis's clock, the arrival the benchmark's: a few ms apart)
        assert!(x["min_ms"].as_f64().unwrap() >= -50.0, "{x}");
    }
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("rabbitmq");
    let pid = run.pid;
    for q in [
        format!("bench{pid}fa0.jobs"),
        format!("bench{pid}ff0.jobs"),
        format!("bench{pid}fpe.jobs"),
        format!("bench{pid}fdl.jobs"),
    ] {
        assert!(!exists(&conn, &q).await, "{q} left behind");
    }
    assert_no_keys_left(&run);
}

/// The campaign step, small: two rounds, each a ceiling and four passes (the
/// campaign published at a quarter of it with urgent jobs every 0.3 s, then the same
/// jobs as a backlog; one worker and three): every bulk job parked (or dispatched
/// unparked) and every urgent job published dispatched, every pass reported with
/// its round's ceiling, the medians by pass and workers, the table saying so, and
/// nothing left behind. No speed is checked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_campaign_step_parks_every_job_and_times_every_urgent_one() {
    let run = run_quick(
        "cp",
        &["--steps", "campaign", "--jobs", "1500", "--rounds", "2"],
        &[],
    );
    assert!(run.stdout.contains("| campaign pass |"), "{}", run.stdout);
    let report = &run.report;
    let runs = report["campaign"].as_array().unwrap();
    let kinds: Vec<(u64, &str, u64)> = runs
        .iter()
        .map(|r| {
            let pass = r["pass"].as_str().unwrap();
            (
                r["round"].as_u64().unwrap(),
                pass,
                r["workers"].as_u64().unwrap(),
            )
        })
        .collect();
    let each = [
        ("campaign", 1),
        ("campaign", 3),
        ("backlog", 1),
        ("backlog", 3),
    ];
    let expected: Vec<(u64, &str, u64)> = (1..=2)
        .flat_map(|round| each.map(|(p, w)| (round, p, w)))
        .collect();
    assert_eq!(kinds, expected);
    for r in runs {
        assert_eq!(r["jobs"], 1500, "{r}");
        assert_eq!(r["rate"], 100, "{r}");
        let accounted = r["parked"].as_u64().unwrap() + r["dispatched_unparked"].as_u64().unwrap();
        assert!(accounted >= 1500, "{r}");
        assert!(r["ceiling_msgs_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["parking_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        if r["pass"] == "campaign" {
            let u = &r["urgent"];
            assert!(u["sent"].as_u64().unwrap() >= 1, "{r}");
            assert_eq!(u["arrived"], u["sent"], "{r}");
            assert!(r["lag_secs"].as_f64().is_some(), "{r}");
            assert!(r["publish_per_sec"].as_f64().unwrap() > 0.0, "{r}");
        } else {
            assert!(r["urgent"].is_null(), "{r}");
        }
    }
    let summary = report["campaign_summary"].as_array().unwrap();
    let kinds: Vec<(&str, u64, u64)> = summary
        .iter()
        .map(|k| {
            let pass = k["pass"].as_str().unwrap();
            (
                pass,
                k["workers"].as_u64().unwrap(),
                k["rounds"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(kinds, each.map(|(p, w)| (p, w, 2)));
    let conn = Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .unwrap();
    for round in 1..=2 {
        for q in ["cp", "cb"].map(|p| format!("bench{}{p}{round}w3.jobs", run.pid)) {
            assert!(!exists(&conn, &q).await, "{q} left behind");
        }
    }
    assert_no_keys_left(&run);
}
