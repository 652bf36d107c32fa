//! Figures for RELIABILITY.md. Each scenario records what it measured in
//! `target/reliability/<scenario>.json`; with `QW_WRITE_RELIABILITY=1` every record
//! also re-renders `RELIABILITY.md` at the workspace root from all the records present,
//! so the document's figures are written by the suite, never typed by hand.

use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{json, Value};

static WRITING: Mutex<()> = Mutex::new(());

/// The workspace root (this crate's parent): where RELIABILITY.md and `target/` are.
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("the workspace root").to_path_buf()
}

fn results_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"));
    target.join("reliability")
}

/// Whether the long forms run (`QW_FAULTS_LONG=1`).
pub fn long() -> bool {
    std::env::var("QW_FAULTS_LONG")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// Record one scenario's figures (a JSON object with at least `scenario`).
pub fn record(mut figures: Value) {
    let _g = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let name = figures["scenario"].as_str().expect("scenario").to_string();
    if figures["mode"].is_null() {
        figures["mode"] = json!(if long() { "long" } else { "quick" });
    }
    let mode = figures["mode"].as_str().unwrap().to_string();
    figures["at"] = json!(chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string());
    // the code measured: the commit, `-dirty` with uncommitted changes
    let commit = std::process::Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    figures["commit"] = json!(commit);
    let dir = results_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(
        dir.join(format!("{name}.{mode}.json")),
        serde_json::to_string_pretty(&figures).unwrap(),
    );
    eprintln!("figures: {figures}");
    if std::env::var("QW_WRITE_RELIABILITY")
        .map(|v| v == "1")
        .unwrap_or(false)
    {
        let doc = render(&load());
        let _ = std::fs::write(root().join("RELIABILITY.md"), doc);
    }
}

/// Every record present, by `scenario.mode`.
pub fn load() -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(results_dir()) {
        for e in entries.flatten() {
            if let Ok(text) = std::fs::read_to_string(e.path()) {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    if let (Some(name), Some(mode)) = (v["scenario"].as_str(), v["mode"].as_str()) {
                        out.insert(format!("{name}.{mode}"), v);
                    }
                }
            }
        }
    }
    out
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                format!("{f:.2}")
            } else if let Some(i) = n.as_u64().filter(|i| *i >= 10_000) {
                // 1,000,000
                let digits = i.to_string();
                let mut out = String::new();
                for (k, c) in digits.chars().enumerate() {
                    if k > 0 && (digits.len() - k) % 3 == 0 {
                        out.push(',');
                    }
                    out.push(c);
                }
                out
            } else {
                n.to_string()
            }
        }
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// The scenarios, in the order the document lists them: (name, what it shows).
const SCENARIOS: &[(&str, &str)] = &[
    (
        "kill9",
        "`kill -9` of the worker at random moments, restarted each time",
    ),
    (
        "broker_restart",
        "RabbitMQ restarted under the worker (a private node)",
    ),
    (
        "broker_hang",
        "RabbitMQ hanging (SIGSTOP of the node), then SIGTERM while it hangs",
    ),
    (
        "memory_alarm",
        "RabbitMQ's memory alarm under load (flow control), for 20 s and for 2 minutes",
    ),
    (
        "rabbit_cluster",
        "A three-node RabbitMQ cluster losing a node the worker does not use, then the one it uses",
    ),
    (
        "redis_outage",
        "Redis stopped during a run, then back with its data",
    ),
    (
        "redis_reset",
        "Redis flushed under load (`FLUSHALL`), with `redis.on_reset = \"continue\"` and `\"pause\"`",
    ),
    (
        "redis_sentinel",
        "Redis Sentinel failing the master over to a replica that is behind, without and with `redis.wait_replicas = 1`",
    ),
    (
        "redis_cluster_failover",
        "A Redis Cluster master killed while its replicas are behind; a replica promoted, alone for a while; without and with `redis.wait_replicas = 1`",
    ),
    (
        "four_workers",
        "Four worker processes on one queue, 1,000 jobs for 10 recipients at once",
    ),
    (
        "sigterm",
        "SIGTERM under load (grace long enough; grace too short)",
    ),
    (
        "stale_x_death",
        "A job republished by hand with stale `x-death` headers",
    ),
    (
        "bad_input_end_to_end",
        "Hand-written bad inputs through the running worker",
    ),
    (
        "redis_cluster",
        "The worker on a three-master Redis Cluster",
    ),
    (
        "soak",
        "The soak: three worker processes at a third of their ceiling, a fault every ten minutes in turn (`bench/soak.sh`)",
    ),
];

const FUZZ: &[&str] = &[
    "random_bytes",
    "random_json_structures",
    "mutated_valid_jobs",
    "job_shaped_bodies_with_nasty_fields",
    "header_handling",
];

/// When a record was made, and on which commit.
fn run(v: &Value) -> String {
    match v["commit"].as_str() {
        Some(c) => format!("{} (`{c}`)", cell(&v["at"])),
        None => cell(&v["at"]),
    }
}

/// The soak's paragraph: the run, each fault and what it did, the audit, the
/// workers' RSS and descriptors, Redis memory, and the plot.
fn soak(v: &Value) -> String {
    let faults: Vec<String> = v["fault_list"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| {
                    format!(
                        "{} at {} s ({})",
                        cell(&f["kind"]),
                        cell(&json!(
                            f["at_seconds"].as_f64().unwrap_or(0.0).round() as u64
                        )),
                        cell(&f["detail"])
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let causes: Vec<String> = v["duplicates_by_cause"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, c)| format!("{} after a {k}", cell(&c["duplicates"])))
                .collect()
        })
        .unwrap_or_default();
    let processes: Vec<String> = v["processes"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    let pct = |x: &Value| {
                        x.as_f64()
                            .map(|c| format!("{:+.1} %", c * 100.0))
                            .unwrap_or_else(|| "–".into())
                    };
                    let mib = |x: &Value| {
                        x.as_f64()
                            .map(|k| format!("{:.1}", k / 1024.0))
                            .unwrap_or_else(|| "–".into())
                    };
                    format!(
                        "worker {} (pid {}, {}–{} s{}): RSS {} → {} MiB ({}), descriptors {} → {} ({})",
                        cell(&p["slot"]),
                        cell(&p["pid"]),
                        cell(&json!(p["from_seconds"].as_f64().unwrap_or(0.0).round() as u64)),
                        cell(&json!(p["to_seconds"].as_f64().unwrap_or(0.0).round() as u64)),
                        if p["judged"] == true { "" } else { ", too short a life to judge" },
                        mib(&p["rss_kib_first_quarter"]),
                        mib(&p["rss_kib_last_quarter"]),
                        pct(&p["rss_change"]),
                        cell(&p["fds_first_quarter"]),
                        cell(&p["fds_last_quarter"]),
                        pct(&p["fds_change"]),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mib = |x: &Value| format!("{:.1}", x.as_f64().unwrap_or(0.0) / 1048576.0);
    format!(
        "- **Soak** ({} form, `bench/soak.sh`): {} min of three worker processes on a private RabbitMQ node \
         (through a proxy) and a private Redis with AOF (`appendfsync everysec`). Ceiling measured first: {} \
         uncapped jobs drained at {} jobs/s; then the fault-suite mix published at {} jobs/s (a third), {} jobs \
         in all, a fault every {} s: {}. Audit: {} lost, {} dispatched, {} waiting (capped), {} dead-lettered \
         `malformed`; {} cap violations; {} duplicate dispatches ({}; {} unexplained), {} dispatched jobs left \
         reserved, not committed, by the kills; {} Redis resets seen by the workers (the AOF kept everything). \
         RSS and open descriptors, medians of the first and the last quarter of each process's life (a \
         restarted worker is a new process), counted from the end of the first broker restart it went through \
         (its AMQP client then starts a runtime of its own, once: four descriptors more for good): {}. Redis `used_memory` from {} MiB to a peak of {} MiB, {} bytes \
         per dispatched send beyond the start in the last quarter, bound {} ({} samples over it): the worker \
         keeps a sorted-set member per send for the dedupe window (24 h), and nothing else grows with the jobs. \
         Longest recovery: {} s. ![The soak: dispatch rate, worker RSS and descriptors, Redis memory, faults \
         marked]({})\n",
        cell(&v["mode"]), cell(&v["minutes"]), cell(&v["ceiling_jobs"]), cell(&v["ceiling_jobs_per_second"]),
        cell(&v["rate_per_second"]), cell(&v["jobs"]), cell(&v["fault_every_seconds"]), faults.join("; "),
        cell(&v["lost"]), cell(&v["dispatched"]), cell(&v["waiting"]), cell(&v["dead"]), cell(&v["violations"]),
        cell(&v["duplicates"]), causes.join(", "), cell(&v["duplicates_unexplained"]),
        cell(&v["uncommitted_after_kills"]), cell(&v["redis_resets_logged"]), processes.join("; "),
        mib(&v["redis_baseline_bytes"]), mib(&v["redis_peak_bytes"]),
        cell(&v["redis_bytes_per_send_last_quarter"]), cell(&v["redis_bound"]), cell(&v["redis_over_bound"]),
        cell(&v["recovery_seconds"]), cell(&v["plot"]),
    )
}

/// Render the whole document from the records.
pub fn render(records: &std::collections::BTreeMap<String, Value>) -> String {
    let get = |name: &str| -> Vec<&Value> {
        ["long", "quick"]
            .iter()
            .filter_map(|m| records.get(&format!("{name}.{m}")))
            .collect()
    };
    let mut o = String::new();
    o.push_str(HEAD);

    o.push_str("\n## Figures\n\n");
    o.push_str("Written by the suite (`QW_WRITE_RELIABILITY=1`, see the end), one row per scenario and form. ");
    o.push_str("*Lost*: published ids found nowhere at the audit. *Duplicates*: extra dispatched copies of one id. ");
    o.push_str("*Cap violations*: recipients with more distinct jobs dispatched, or sends recorded, than a cap allows, ");
    o.push_str("and dispatched jobs without a committed record. *Recovery*: seconds from the fault's end to work resuming ");
    o.push_str("(restart to consuming, broker back to consuming, Redis back to the next dispatch, SIGTERM to exit).\n\n");
    o.push_str("| Scenario | Form | Jobs | Faults | Lost | Duplicates | Cap violations | Recovery (s) | Run |\n");
    o.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (name, title) in SCENARIOS {
        let rows = get(name);
        if rows.is_empty() {
            o.push_str(&format!("| {title} | not run | | | | | | | |\n"));
        }
        for v in rows {
            if let Some(why) = v["skipped"].as_str() {
                o.push_str(&format!(
                    "| {title} | skipped: {why} | | | | | | | {} |\n",
                    run(v)
                ));
                continue;
            }
            o.push_str(&format!(
                "| {title} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                cell(&v["mode"]),
                cell(&v["jobs"]),
                cell(&v["faults"]),
                cell(&v["lost"]),
                cell(&v["duplicates"]),
                cell(&v["violations"]),
                cell(&v["recovery_seconds"]),
                run(v),
            ));
        }
    }

    o.push_str("\n### Details\n\n");
    for v in get("kill9") {
        o.push_str(&format!(
            "- **kill -9** ({} form, seed printed by the test): {} jobs at {} dispatches/s, {} kills over {} s; \
             {} dispatched, {} still waiting (capped until the recipient's midnight), {} dead-lettered `malformed` \
             (as published). {} duplicate dispatches, every one explained by a kill: its first copy was among the last \
             {} messages dispatched before that kill (sent, not yet confirmed and recorded). {} extra copies waiting \
             and {} extra dead letters (an outcome confirmed, the kill before the ack; harmless: the copy is recognised \
             when it comes back). {} dispatched jobs left with their send recorded as reserved, not committed (the \
             kill fell between the confirm and the commit batch: the send still counts for the caps; a copy after \
             the lease would be sent again). Longest restart-to-consuming: {} s. Whole run: {} s.\n",
            cell(&v["mode"]), cell(&v["jobs"]), cell(&v["rate_per_second"]), cell(&v["faults"]),
            cell(&v["kills_over_seconds"]), cell(&v["dispatched"]), cell(&v["waiting"]), cell(&v["dead"]),
            cell(&v["duplicates"]), cell(&v["duplicate_farthest_before_kill"]), cell(&v["duplicate_waiting_copies"]),
            cell(&v["duplicate_dead_letters"]), cell(&v["uncommitted_after_kills"]), cell(&v["recovery_seconds"]),
            cell(&v["elapsed_seconds"]),
        ));
    }
    for v in get("broker_restart") {
        if v["skipped"].is_string() {
            continue;
        }
        o.push_str(&format!(
            "- **Broker restart** ({} form): {}. The broker was away {} s each time (its boot takes {} s here); \
             the worker was consuming again {} s after the broker accepted connections. {} lost, {} duplicates.\n",
            cell(&v["mode"]), cell(&v["fault"]), cell(&v["broker_down_seconds"]), cell(&v["broker_boot_seconds"]),
            cell(&v["recovery_seconds"]), cell(&v["lost"]), cell(&v["duplicates"]),
        ));
    }
    for v in get("rabbit_cluster") {
        if v["skipped"].is_string() {
            continue;
        }
        o.push_str(&format!(
            "- **RabbitMQ cluster** ({} form): three private nodes on loopback (booted and clustered in {} s), \
             quorum queues with a replica on each, the worker given every node in `amqp.urls`. {}. After the \
             first kill the next 300 dispatches took {} s (the worker's node was untouched); the nodes were down \
             {} s; with both back, the worker consumed again {} s later. {} lost, {} duplicates, {} cap \
             violations, {} s in all.\n",
            cell(&v["mode"]), cell(&v["cluster_boot_seconds"]), cell(&v["fault"]),
            cell(&v["seconds_to_300_more_after_first_kill"]), cell(&v["nodes_down_seconds"]),
            cell(&v["recovery_seconds"]), cell(&v["lost"]), cell(&v["duplicates"]),
            cell(&v["violations"]), cell(&v["elapsed_seconds"]),
        ));
    }
    for v in get("broker_hang") {
        if v["skipped"].is_string() {
            continue;
        }
        o.push_str(&format!(
            "- **Broker hang** ({} form): the node frozen for {} s (connections open, nothing answering), longer \
             than `amqp.publish_timeout` ({} s). The worker waited for the confirms while the connection lived and \
             held further dispatches once no confirm had come for 300 ms; dispatching went on {} s after the node \
             woke up, on the same connection, with no job sent twice. {} duplicate dispatches in all, from the \
             second hang: the dispatches sent in its first 300 ms (at 200/s), unconfirmed when SIGTERM's grace ran \
             out, their jobs handed back (before waiting for confirms and holding: 378 over the two hangs, up to \
             `amqp.prefetch` = {} per hang); {} lost, {} cap violations. SIGTERM while the broker hung, grace {} s: \
             exit codes {}, after {} s (session running) and {} s (still connecting).\n",
            cell(&v["mode"]), cell(&v["hang_seconds"]), cell(&v["publish_timeout_seconds"]), cell(&v["recovery_seconds"]),
            cell(&v["duplicates"]), cell(&v["prefetch"]), cell(&v["lost"]), cell(&v["violations"]),
            cell(&v["grace_seconds"]), cell(&v["sigterm_exit_codes"]), cell(&v["sigterm_exit_seconds_running"]),
            cell(&v["sigterm_exit_seconds_connecting"]),
        ));
    }
    for v in get("memory_alarm") {
        if v["skipped"].is_string() {
            continue;
        }
        let runs = v["runs"].as_array().cloned().unwrap_or_default();
        let run = |r: &Value| {
            format!(
                "{} s: {} dispatched while it lasted, dispatching again {} s after it cleared",
                cell(&r["alarm_seconds"]),
                cell(&r["dispatched_during_alarm"]),
                cell(&r["recovery_seconds"]),
            )
        };
        o.push_str(&format!(
            "- **Memory alarm** ({} form): {}. The worker logged the block {} times, took no new job while \
             blocked and waited for the held confirms ({} dispatches handed back unconfirmed). {}. {} lost, {} \
             duplicates, {} cap violations.\n",
            cell(&v["mode"]), cell(&v["fault"]), cell(&v["blocked_logged"]), cell(&v["unconfirmed_handed_back"]),
            runs.iter().map(run).collect::<Vec<_>>().join("; "),
            cell(&v["lost"]), cell(&v["duplicates"]), cell(&v["violations"]),
        ));
    }
    for v in get("redis_outage") {
        o.push_str(&format!(
            "- **Redis outage** ({} form): {}. `Health.redis` turned false {} s after the stop; `/readyz` during \
             the outage answered `{}`. Jobs dispatched while Redis was away (after the first second, which lets \
             decisions already taken finish): {}; dead-lettered because of it: {}. After Redis returned the next \
             dispatch came {} s later and `/readyz` answered 200 again after {} s.\n",
            cell(&v["mode"]), cell(&v["fault"]), cell(&v["health_noticed_seconds"]), cell(&v["readyz_during_outage"]),
            cell(&v["dispatched_during_outage"]), cell(&v["dead_lettered_not_malformed"]), cell(&v["recovery_seconds"]),
            cell(&v["health_back_seconds"]),
        ));
    }
    for v in get("redis_reset") {
        let runs = v["runs"].as_array().cloned().unwrap_or_default();
        let run = |r: &Value| {
            format!(
                "with `{}`: noticed {} s after the flush (logged at ERROR, `quota_worker_redis_resets_total` 1), \
                 paused: {}; afterwards {} jobs of the daily and rolling policies dispatched, {} of them while \
                 paused ({} transactional jobs went out during the pause); `admin resume` took effect in {} s; \
                 {} lost, {} duplicates, {} dead-lettered for it, {} cap-audit findings (sends the flush \
                 forgot, as expected: the caps start afresh)",
                cell(&r["on_reset"]), cell(&r["noticed_seconds"]), cell(&r["paused"]),
                r["dispatched_after_known_by_kind"]["Daily"].as_u64().unwrap_or(0)
                    + r["dispatched_after_known_by_kind"]["Rolling"].as_u64().unwrap_or(0),
                cell(&r["capped_dispatched_while_paused"]), cell(&r["dispatched_while_paused"]),
                cell(&r["resumed_seconds_after_admin_resume"]), cell(&r["lost"]), cell(&r["duplicates"]),
                cell(&r["dead_lettered_not_malformed"]), cell(&r["violations"]),
            )
        };
        o.push_str(&format!(
            "- **Redis flushed** ({} form): {}: {}.\n",
            cell(&v["mode"]),
            cell(&v["fault"]),
            runs.iter().map(run).collect::<Vec<_>>().join("; "),
        ));
    }
    for v in get("redis_sentinel") {
        let runs = v["runs"].as_array().cloned().unwrap_or_default();
        let run = |r: &Value| {
            format!(
                "with `redis.wait_replicas = {}`: a replica was {} bytes of replication behind at \
                 the kill; the first sentinel named a new master {} s after the kill and the next dispatch came \
                 {} s after the kill; {} dispatched jobs whose send the new master did not know \
                 (forgotten: the caps no longer count them), {} recipients over a cap, {} sends \
                 left reserved, not committed (their commit was forgotten; they still count), \
                 {} admissions held because no replica acknowledged them in time, {} lost, {} duplicates",
                cell(&r["wait_replicas"]), cell(&r["replica_behind_bytes"]), cell(&r["promoted_seconds"]),
                cell(&r["recovery_seconds"]), cell(&r["violations"]["forgotten_sends"]),
                cell(&r["violations"]["over_cap"]), cell(&r["violations"]["uncommitted"]),
                cell(&r["unreplicated_holds"]), cell(&r["lost"]), cell(&r["duplicates"]),
            )
        };
        o.push_str(&format!(
            "- **Redis Sentinel** ({} form): a master, two replicas and three sentinels started by the test, \
             the worker given the master's name and the sentinels (`[redis.sentinel]`); {}. {} jobs per run. {}.\n",
            cell(&v["mode"]),
            cell(&v["fault"]),
            runs.first().map(|r| cell(&r["jobs"])).unwrap_or_default(),
            runs.iter().map(run).collect::<Vec<_>>().join("; "),
        ));
    }
    for v in get("redis_cluster_failover") {
        let runs = v["runs"].as_array().cloned().unwrap_or_default();
        let run = |r: &Value| {
            format!(
                "with `redis.wait_replicas = {}`: a replica of that master was {} bytes of replication \
                 behind at the kill; the cluster was whole again {} s after the kill and the next dispatch \
                 came {} s after it; the promoted master had no replica from {} s to {} s after the kill \
                 (its first replica online at {} s), and {} jobs were dispatched meanwhile; {} dispatched \
                 jobs whose send the new master did not know (forgotten), {} recipients over a cap, {} sends \
                 left reserved, not committed, {} admissions held because no replica acknowledged them in \
                 time, {} lost, {} duplicates",
                cell(&r["wait_replicas"]), cell(&r["replica_behind_bytes"]), cell(&r["promoted_seconds"]),
                cell(&r["recovery_seconds"]), cell(&r["alone_seconds"][0]), cell(&r["alone_seconds"][1]),
                cell(&r["replica_attached_seconds"]), cell(&r["dispatched_while_alone"]),
                cell(&r["violations"]["forgotten_sends"]), cell(&r["violations"]["over_cap"]),
                cell(&r["violations"]["uncommitted"]), cell(&r["unreplicated_holds"]), cell(&r["lost"]),
                cell(&r["duplicates"]),
            )
        };
        o.push_str(&format!(
            "- **Redis Cluster failover** ({} form): {}; the worker follows the new slot map by itself. {} jobs \
             per run. {}. With `WAIT`, the admissions' calls go on connections of their own: a `WAIT` holds the \
             connection it runs on, and on the shared one (one a node) the waits for a master with no replica \
             answering queued past the 2 s response timeout, with every other call to that node behind them.\n",
            cell(&v["mode"]),
            cell(&v["fault"]),
            runs.first().map(|r| cell(&r["jobs"])).unwrap_or_default(),
            runs.iter().map(run).collect::<Vec<_>>().join("; "),
        ));
    }
    for v in get("four_workers") {
        o.push_str(&format!(
            "- **Four workers** ({} form): {} jobs, {} recipients, cap {}: {} dispatched (exactly the cap for each \
             recipient, and exactly that many sends recorded in Redis), {} waiting, settled in {} s.\n",
            cell(&v["mode"]), cell(&v["jobs"]), cell(&v["recipients"]), cell(&v["cap"]), cell(&v["dispatched"]),
            cell(&v["waiting"]), cell(&v["elapsed_seconds"]),
        ));
    }
    for v in get("sigterm") {
        if let Some(runs) = v["runs"].as_array() {
            for r in runs {
                o.push_str(&format!(
                    "- **SIGTERM** ({} form): paced at {}/s with a grace of {} s: exit code {} after {} s; \
                     {} lost, {} duplicates.\n",
                    cell(&v["mode"]), cell(&r["rate_per_second"]), cell(&r["grace_seconds"]), cell(&r["exit_code"]),
                    cell(&r["exit_seconds"]), cell(&r["lost"]), cell(&r["duplicates"]),
                ));
            }
        }
    }
    for v in get("stale_x_death") {
        o.push_str(&format!(
            "- **Stale `x-death`** ({} form): the republished job was delayed by its cap and dispatched {} s later. \
             Control: a copy sent round the delay ladder *with* its `x-death` kept came back: {} (false means the \
             broker's dead-letter cycle detection dropped it silently; this is what the worker's stripping prevents).\n",
            cell(&v["mode"]), cell(&v["stale_job_dispatched_after_seconds"]),
            cell(&v["control_with_x_death_kept_came_back"]),
        ));
    }
    for v in get("bad_input_end_to_end") {
        let cases: Vec<String> = v["cases"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|c| format!("`{}` → {}", cell(&c["case"]), cell(&c["expected"])))
                    .collect()
            })
            .unwrap_or_default();
        o.push_str(&format!(
            "- **Bad input end to end** ({} form), each found exactly once with that outcome: {}.\n",
            cell(&v["mode"]),
            cases.join("; ")
        ));
    }

    for v in get("soak") {
        o.push_str(&soak(v));
    }

    o.push_str("\n### Fuzzing (proptest)\n\n| Property | Form | Inputs | Jobs | Malformed (with a reason) | Panics | Run |\n|---|---|---:|---:|---:|---:|---|\n");
    for name in FUZZ {
        for v in get(&format!("fuzz_{name}")) {
            let (jobs, bad) = if *name == "header_handling" {
                ("n/a".to_string(), "n/a".to_string())
            } else {
                (cell(&v["jobs"]), cell(&v["malformed"]))
            };
            o.push_str(&format!(
                "| `{name}` | {} ({} cases) | {} | {} | {} | {} | {} |\n",
                cell(&v["mode"]),
                cell(&v["cases_per_property"]),
                cell(&v["inputs"]),
                jobs,
                bad,
                cell(&v["panics"]),
                run(v),
            ));
        }
    }
    o.push_str(TAIL);
    o
}

const HEAD: &str = r#"# Reliability

<!-- Generated by the test suite (testkit/src/reliability.rs); do not edit by hand.
     Regenerate: QW_WRITE_RELIABILITY=1 cargo test --test faults
     and QW_WRITE_RELIABILITY=1 cargo test --test suite -- fuzz:: cluster:: -->

What `quota-worker` promises, what each promise rests on, and the test that checks it.
The figures below come from the last run of each scenario on the machine that
generated this file (RabbitMQ 3.10, Redis 7.0, two cores; quick forms on a debug
build, long forms on a release build); each row names the commit it measured.

## Guarantees

| Guarantee | How | Proven by |
|---|---|---|
| **At-least-once delivery.** Every job ends dispatched, delayed (waiting in the delay ladder) or dead-lettered with a reason; none is lost, whatever crashes. | A delivery is acked only after its outcome's publish is confirmed (`mandatory`, persistent, publisher confirms with a timeout); anything unacked goes back to the queue when the worker's connection drops. Quorum queues with `x-dead-letter-strategy=at-least-once` and `x-overflow=reject-publish` move delayed jobs between delay levels without loss; the jobs queue has an explicit `x-delivery-limit` and dead-letter target, so no broker version drops a job. | `faults.rs`: `kill_9_…`, `broker_restart_…`, `redis_outage_…`, `sigterm_…`, `stale_x_death_…`; `pipeline.rs` |
| **Caps are never exceeded.** No recipient gets more distinct jobs than a cap allows, with any number of workers. | `lua/admit.lua` checks every rule and records the send atomically, on the recipient's own sorted set (one hash slot, so also on a cluster). The send counts from admission (a *reservation*) until dispatch is confirmed (*commit*); a dispatch refused by the broker gives it back; a dispatch whose fate is unknown (no confirm, connection lost) keeps it. | `faults.rs`: `four_workers_…`, and the cap audit of every scenario; `engine.rs` and `cluster.rs`: 200 concurrent admissions admit one |
| **Duplicates only in the named crash window.** A job is dispatched twice only when a crash (or a lost connection) falls between its dispatch publish leaving the worker and its commit in Redis. | A committed job is recognised by id (`duplicate`: acked, not sent again) for the dedupe window. A job reserved but not committed is *in flight*: another worker waits until the reservation lease lapses, then admits it again; that second dispatch is a duplicate if the first one had reached the broker. Both copies carry the same `message_id` (the job id): senders deduplicate on it. | `faults.rs`: `kill_9_…` counts them and checks each against the kill that caused it |
| **No dispatch without a decision.** While Redis is unreachable nothing is dispatched or dead-lettered because of it; readiness reports it; work resumes by itself. | Every Redis call is retried with jittered backoff (`retry_redis`), holding the job; prefetch bounds what is held. `/readyz` answers 503 (`Health.redis` false) from the first failed call, and a watcher reads Redis every second (the reset marker) so it is current while idle too. A job whose admission Redis interrupted takes its own reservation back on retry. | `faults.rs`: `redis_outage_…`, `an_admission_interrupted_by_redis_…` |
| **The worker reconnects by itself.** Broker gone: the session ends, in-flight jobs are handed back, the worker reconnects with jittered backoff (200 ms doubling to 2 s, each delay lengthened by up to itself, so workers do not come back in lockstep). Only the broker's refusals (406 PRECONDITION_FAILED, 403 ACCESS_REFUSED) and a TLS setup that cannot work stop it; a connection closed in the middle of declaring the topology, a node restarting, a quorum queue electing its leader are retried. A Redis that is not there at start is waited for. | A confirm is waited for while its connection is up (lapin's heartbeat bounds a silent one), and connecting, declaring and subscribing have a deadline (3 × `amqp.publish_timeout`); the consumer stream ending or failing ends the session; `BrokerError::is_fatal` is the one rule of what stops it. | `faults.rs`: `broker_restart_…`, `broker_hang_…`; `connections.rs`: `the_worker_outlives_the_broker_closing_its_connection_mid_declare`, `the_worker_waits_for_a_redis_that_is_not_there_yet` |
| **Clean shutdown.** SIGTERM/SIGINT: stop consuming, finish in-flight jobs within `worker.shutdown_grace`, hand back the rest, exit 0, also when the broker does not answer. | One cancellation token, watched while connecting too; in-flight tasks tracked and awaited until the grace deadline; cancelling the consumer and closing the connection bounded by it. | `faults.rs`: `sigterm_…`, `broker_hang_…` |
| **Bad input never crashes the worker or loops.** Each bad message is dead-lettered once, `malformed` with a sentence saying why, body untouched. | The decoder is pure and bounded (size limit before parsing; no recursion into payloads); header values from producers are read defensively. | `fuzz.rs` (proptest, millions of inputs in the long form) and its hand-written end-to-end cases |
| **Runs unchanged on Redis Cluster.** | One hash slot per recipient; scripts loaded on every node at start and again on `NOSCRIPT`. Admissions batched per node: a call declares one key of its node and carries the others; a key whose slot moved since the map was read answers "not here" having written nothing and is asked again on its own, so a stale slot map costs calls, never a decision. | `cluster.rs` (`a_stale_slot_map_costs_calls_not_decisions`, `a_key_on_another_node_answers_not_here_…`) |
| **Follows a Redis failover by itself.** With Sentinel (`[redis.sentinel]`) the worker finds the promoted master; on a Redis Cluster it follows the new slot map. With `redis.wait_replicas = 1` (Sentinel, a cluster, or one node with replicas) no dispatched job's send is forgotten by the failover. | A connection to the master the sentinels name, dropped and asked for again when a command on it fails as a lost or demoted node's would; the cluster client's own slot refresh. `WAIT` after each admission call, in the same round trip (on a cluster after each node's call, on connections the admissions keep for themselves, so a `WAIT` holds up no other call): a job is dispatched only once a replica has its send; one not acknowledged in `redis.wait_timeout` is held and retried, and so is one whose live reservation such a call found (it is not adopted). | `faults.rs`: `sentinel_failover_…` and `cluster_master_killed_…` (each with and without `WAIT`); `cluster.rs`: `waiting_for_replicas_the_masters_lack_…` |

## What happens on each fault

| Fault | What the worker does | What you see |
|---|---|---|
| Worker killed (`kill -9`, OOM, node loss) | Nothing to do: its unacked deliveries return to the queue. Jobs it had admitted but not dispatched are *in flight* for `redis.reservation_lease` (default 2 min), then admitted again. | Some jobs arrive up to one lease late; jobs that were being sent at that instant may arrive twice (same `message_id`). |
| Broker restarts or the connection drops | The session ends; publishes waiting for a confirm fail (their reservations are kept); deliveries go back to the queue; the worker reconnects with backoff and declares its topology again. | A pause; then processing resumes within seconds of the broker being back. |
| Broker hangs (frozen, partitioned: the connection stays open, nothing answers) | Each publish waits for its confirm while the connection is up (lapin's heartbeat gives up on it after twice the negotiated heartbeat, 120 s with RabbitMQ's default 60 s); then its job is handed back with its reservation kept. Connecting and declaring are bounded (3 × `amqp.publish_timeout`); shutdown never waits past its grace period. If the broker wakes before the heartbeat gives up, the same connection goes on and the late confirms settle the jobs, else the worker reconnects. | A hang shorter than the heartbeat limit: dispatching resumes when it ends, no duplicate. A longer one, or SIGTERM during it: dispatches sent during the hang arrive when it ends, and their jobs are sent again (up to `amqp.prefetch` per worker, same `message_id`). |
| Broker memory or disk alarm (flow control: `connection.blocked`) | The worker takes no new delivery while the broker blocks its connection (logged; `quota_worker_broker_blocked` is 1) and the publishes it had sent wait for their confirms, however long the alarm lasts, while the connection is up. | Dispatching pauses for the alarm and resumes when it clears; no duplicate, nothing lost (`memory_alarm` above: 20 s and 2 minutes). |
| Redis unreachable | Every job in flight waits (retrying with jittered backoff up to 1 s, 2 s when it is not there at start); no new decisions; readiness false. | Dispatch stops; nothing is dead-lettered; it resumes within a couple of seconds of Redis returning. |
| The broker refuses the worker (a queue exists with other arguments: 406; the user may not log in or configure: 403) | The worker stops with the broker's words and a hint (exit 1). | Fix the configuration or the broker; restarting alone would repeat the refusal. |
| Redis comes back empty (restart without persistence, `FLUSHALL`, failover to an empty replica) | Noticed within a second: a marker key written once (`prefix:{reset}/marker`) is read by every worker's health watcher each second (one `MGET`, replacing its `PING`; nothing per job); gone or replaced means the data went with it. Logged at ERROR, counted (`quota_worker_redis_resets_total`, alert `QuotaWorkerRedisLostItsData`), shown on the status page. `redis.on_reset = "continue"` (default) goes on; `"pause"` sets a pause mark in Redis that holds, on every worker, the jobs of enforced policies with rules (delayed 60 s at a time, never dead-lettered; an admitted job waiting for its channel's rate gives its admission back) until `quota-worker admin resume`; transactional jobs still go. Not seen: a loss while no worker runs (taken for a first start), and on a cluster the loss of a master other than the marker's. | `redis_reset` above. With `pause`, restore the data if you can (an AOF or RDB copy, `admin recipient R record`), then resume; after it the caps count only what Redis holds. |
| Redis loses its last writes (failover to a lagging replica) | With Sentinel (`[redis.sentinel]`) it finds the new master through the sentinels; on a cluster it follows the new slot map. The marker is old, so this is not a reset. | Recorded sends are forgotten: caps start afresh and earlier jobs are no longer recognised as duplicates (the `redis_sentinel` and `redis_cluster_failover` scenarios count them). Run Redis with AOF (`appendonly yes`) for restarts; for failovers set `redis.wait_replicas = 1` (Sentinel, a cluster, or a single node with replicas): a job is dispatched only once a replica has its send, and a job no replica acknowledges in `redis.wait_timeout` is held and retried. Commits are not waited for: a forgotten commit leaves the send reserved, still counted. |
| A dispatch is returned (no queue bound) or nacked | The quota is given back and the job delayed (5 s, doubling per attempt, at most 5 min). | The job is retried, never acked as sent. |
| SIGTERM | Stop consuming, finish in-flight jobs within the grace period, hand back the rest, exit 0. | Jobs still waiting for the channel's rate when the grace period ends go back to the queue and, being reserved, wait out the lease on the next worker. |
| A malformed, oversized or hostile message | Dead-lettered `malformed` once, with a reason. | It is in `notify.dead` with `x-notify-reason` and `x-notify-detail`. |
| A message republished by hand with the broker's `x-death` headers or the ladder's `notify-delay-*` bits | The worker drops both whenever it publishes a job onwards. | The job goes round the delay ladder normally (with `x-death` kept the broker would drop it silently as a dead-letter cycle; with stale bits it would wait in the wrong queues). |
"#;

const TAIL: &str = r#"
## Running N workers, and a RabbitMQ cluster

- **N workers.** Start as many `quota-worker run` processes as you like with the same
  configuration; they share one jobs queue (each with `amqp.prefetch` deliveries in
  flight) and one Redis. Caps and channel rates are global: they live in Redis, so the
  number of workers changes neither. The four-worker scenario above checks it.
- **RabbitMQ cluster.** Keep `amqp.queue_type = "quorum"` (the default): the jobs, delay and
  dispatch queues are then Raft-replicated, and a publish is confirmed only once a majority
  of the nodes has it, so a confirmed outcome survives the loss of a minority of nodes.
  List every node in `amqp.urls` (no load balancer needed; one behind a load balancer or
  a DNS name in `amqp.url` works too): each broker session takes the next node, so when a
  node goes, the worker's session ends and it reconnects to another one by itself (the
  `rabbit_cluster` scenario above kills two of three nodes under load). The delay ladder
  relies on at-least-once dead-lettering (RabbitMQ ≥ 3.10 quorum queues): a message moves to
  the next level only once the next queue has confirmed it. On RabbitMQ 4.x the worker's
  explicit `x-delivery-limit` (1000) and dead-letter target replace the new default limit
  of 20, so a job that keeps failing is dead-lettered, never dropped.
- **Redis.** A single node (with AOF persistence for the caps to survive a restart), a
  Sentinel-managed master with replicas (`[redis.sentinel]`: the master's name and the
  sentinels' URLs; the worker asks the sentinels for the master again whenever it stops
  answering as one), or a Redis Cluster (`redis.cluster = true`, `redis.cluster_urls`);
  every key of a recipient shares one hash slot, and a channel's rate key has its own.
  Replication is asynchronous, so a failover forgets the sends the old master had not
  yet passed on (the `redis_sentinel` and `redis_cluster_failover` scenarios above count
  them). `redis.wait_replicas = 1` closes that window: each admission call (on a cluster,
  each node's call) is followed by `WAIT 1` and its jobs are dispatched only once a replica
  has it. With it, losing every replica of a master holds that master's recipients (as a
  Redis outage does), so run two replicas a master; on a cluster a master just promoted
  holds its recipients until a replica attaches to it, and the others go on.

What each guarantee rests on:

| Guarantee | Rests on |
|---|---|
| At-least-once delivery | Manual acks after confirmed publishes; quorum queues (durable, replicated); at-least-once dead-lettering between delay levels; every queue the worker publishes to being bound (`mandatory` returns are retried). |
| Caps never exceeded | Redis executing each script atomically; Redis keeping its data; the reservation lease being longer than any worker takes between admission and commit (default 2 min). |
| Duplicates only in the crash window | Senders deduplicating on `message_id` if they must never send twice; the dedupe window (default 24 h) being longer than the longest time a job can take to come back. |
| Redis outages held | The bounded prefetch (jobs held in memory while waiting). |
| Delays on time, no head-of-line blocking | One TTL per delay queue (the binary ladder), and the jobs queue not being backlogged. |

## Running the suite

| What | Command | Time here |
|---|---|---|
| Everything, quick forms (CI) | `cargo test` | under 4 min once built |
| Fault suite, quick | `cargo test --test faults` | about 4.5 min (267 s on 2026-11-25, the Sentinel and cluster-failover scenarios about 50 s and 25 s of it; the cluster-failover scenario runs twice since, about 52 s on 2026-11-26) |
| Fault suite, long (20,000 jobs and 20 kills, a 30 s Redis outage and a 30 s broker hang, two broker restarts, the second a SIGKILL, Sentinel and cluster failovers of 6,000 jobs a run) | `QW_FAULTS_LONG=1 cargo test --release --test faults` | about 5 min, after a release build (about 10 min on two cores) |
| Fuzzing, 1,000,000 cases per property (8 million inputs) | `QW_FUZZ_CASES=1000000 cargo test --release --test suite fuzz::` | about 5 min |
| The soak: three workers at a third of their ceiling for an hour, a fault every ten minutes in turn (kill -9, broker restart, Redis restart with AOF, connections cut, reload), every job audited, RSS, descriptors and Redis memory sampled | `bench/soak.sh` (`QW_SOAK_MINUTES`, `QW_SOAK_FAULT_EVERY`; `QW_WRITE_RELIABILITY=1` for this file and `docs/soak.svg`) | about 70 min after a release build |
| Replay the kill times of a run | `QW_FAULTS_SEED=<seed printed by the test> cargo test --test faults kill_9` | |
| Regenerate this file | `QW_WRITE_RELIABILITY=1 cargo test --test faults`, then `QW_WRITE_RELIABILITY=1 cargo test --test suite -- fuzz:: cluster::` (add the long forms to include them) | |

Figures are kept per scenario and form in `target/reliability/*.json`; a quick run does not
overwrite a long run's figures. The broker-restart scenario starts its own RabbitMQ node
(from `/usr/lib/rabbitmq/bin`, on free ports, in a temp dir) and is recorded as skipped
where that is missing; the Redis outage uses its own `redis-server`; the Sentinel scenario
starts a master, two replicas and three sentinels, the cluster-failover scenario three masters
with two replicas each, and the cluster tests a three-master cluster. Nothing touches the shared RabbitMQ or Redis beyond each test's own
queue names and key prefix.
"#;
