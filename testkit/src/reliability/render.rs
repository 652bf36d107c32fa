//! RELIABILITY.md from the records: the table of every scenario and form, then a
//! paragraph of details a scenario (`details`), then the fuzzing table.

use std::collections::BTreeMap;

use serde_json::Value;

use super::cell::{cell, run};
use super::details::DETAILS;
use super::text::{HEAD, TAIL};

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
        "fair_kill",
        "`kill -9` of the worker while three tenants' jobs wait in their queues of a lane (fair shares), restarted each time",
    ),
    (
        "fair_broker_restart",
        "RabbitMQ restarted while three tenants' jobs wait in their queues of a lane (a private node)",
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
        "limits_kill",
        "`kill -9` of one of three workers while stacked limits (per second and per 5 s on one account, per sender, costs 1–3) hold the jobs, restarted at once",
    ),
    (
        "limits_sentinel",
        "Redis Sentinel failing the master over to a replica 1.5 s behind while stacked limits hold the jobs (two workers), without and with `redis.wait_replicas = 1`",
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

/// A scenario's records, the long form first.
fn records_of<'a>(records: &'a BTreeMap<String, Value>, name: &str) -> Vec<&'a Value> {
    ["long", "quick"]
        .iter()
        .filter_map(|m| records.get(&format!("{name}.{m}")))
        .collect()
}

/// Render the whole document from the records.
pub fn render(records: &BTreeMap<String, Value>) -> String {
    let mut o = String::new();
    o.push_str(HEAD);
    figures(&mut o, records);
    details(&mut o, records);
    fuzzing(&mut o, records);
    o.push_str(TAIL);
    o
}

/// The table of figures: a row a scenario and form.
fn figures(o: &mut String, records: &BTreeMap<String, Value>) {
    o.push_str("\n## Figures\n\n");
    o.push_str("Written by the suite (`QW_WRITE_RELIABILITY=1`, see the end), one row per scenario and form. ");
    o.push_str("*Lost*: published ids found nowhere at the audit. *Duplicates*: extra dispatched copies of one id. ");
    o.push_str("*Cap violations*: recipients with more distinct jobs dispatched, or sends recorded, than a cap allows, ");
    o.push_str("and dispatched jobs without a committed record. *Recovery*: seconds from the fault's end to work resuming ");
    o.push_str("(restart to consuming, broker back to consuming, Redis back to the next dispatch, SIGTERM to exit).\n\n");
    o.push_str("| Scenario | Form | Jobs | Faults | Lost | Duplicates | Cap violations | Recovery (s) | Run |\n");
    o.push_str("|---|---|---:|---:|---:|---:|---:|---:|---|\n");
    for (name, title) in SCENARIOS {
        let rows = records_of(records, name);
        if rows.is_empty() {
            o.push_str(&format!("| {title} | not run | | | | | | | |\n"));
        }
        for v in rows {
            o.push_str(&figures_row(title, v));
        }
    }
}

/// One row of the table of figures.
fn figures_row(title: &str, v: &Value) -> String {
    if let Some(why) = v["skipped"].as_str() {
        return format!("| {title} | skipped: {why} | | | | | | | {} |\n", run(v));
    }
    format!(
        "| {title} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
        cell(&v["mode"]),
        cell(&v["jobs"]),
        cell(&v["faults"]),
        cell(&v["lost"]),
        cell(&v["duplicates"]),
        cell(&v["violations"]),
        cell(&v["recovery_seconds"]),
        run(v),
    )
}

/// The details: a paragraph a record, scenario by scenario.
fn details(o: &mut String, records: &BTreeMap<String, Value>) {
    o.push_str("\n### Details\n\n");
    for d in DETAILS {
        for v in records_of(records, d.scenario) {
            if d.unless_skipped && v["skipped"].is_string() {
                continue;
            }
            o.push_str(&(d.paragraph)(v));
        }
    }
}

/// The fuzzing table: a row a property and form.
fn fuzzing(o: &mut String, records: &BTreeMap<String, Value>) {
    o.push_str("\n### Fuzzing (proptest)\n\n| Property | Form | Inputs | Jobs | Malformed (with a reason) | Panics | Run |\n|---|---|---:|---:|---:|---:|---|\n");
    for name in FUZZ {
        for v in records_of(records, &format!("fuzz_{name}")) {
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
}
