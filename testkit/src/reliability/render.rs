//! RELIABILITY.md from the records: the table of every scenario and form, then a
//! paragraph of details a scenario.

use serde_json::{json, Value};

use super::text::{HEAD, TAIL};

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
    let catch_up: Vec<String> = v["catch_up"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    let secs = c["catch_up_seconds"]
                        .as_f64()
                        .map_or("never".into(), |x| format!("{x:.0} s"));
                    format!("{} {secs}", cell(&c["kind"]))
                })
                .collect()
        })
        .unwrap_or_default();
    let catch_up = if catch_up.is_empty() {
        String::new()
    } else {
        format!(
            " Time until the jobs queue and the lanes were back to their depth before each fault, \
             publishing going on (bound {} s): {}.",
            cell(&v["catch_up_bound_seconds"]),
            catch_up.join(", ")
        )
    };
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
         Longest recovery: {} s.{} ![The soak: dispatch rate, worker RSS and descriptors, Redis memory, faults \
         marked]({})\n",
        cell(&v["mode"]), cell(&v["minutes"]), cell(&v["ceiling_jobs"]), cell(&v["ceiling_jobs_per_second"]),
        cell(&v["rate_per_second"]), cell(&v["jobs"]), cell(&v["fault_every_seconds"]), faults.join("; "),
        cell(&v["lost"]), cell(&v["dispatched"]), cell(&v["waiting"]), cell(&v["dead"]), cell(&v["violations"]),
        cell(&v["duplicates"]), causes.join(", "), cell(&v["duplicates_unexplained"]),
        cell(&v["uncommitted_after_kills"]), cell(&v["redis_resets_logged"]), processes.join("; "),
        mib(&v["redis_baseline_bytes"]), mib(&v["redis_peak_bytes"]),
        cell(&v["redis_bytes_per_send_last_quarter"]), cell(&v["redis_bound"]), cell(&v["redis_over_bound"]),
        cell(&v["recovery_seconds"]), catch_up, cell(&v["plot"]),
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
