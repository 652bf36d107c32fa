//! The soak's paragraph of RELIABILITY.md: the run, each fault and what it did, the
//! audit, the workers' RSS and descriptors, Redis memory, and the plot.

use serde_json::Value;

use super::cell::{cell, each, whole_seconds};

/// Each fault: its kind, when, and what it did.
fn faults(v: &Value) -> String {
    each(&v["fault_list"], |f| {
        format!(
            "{} at {} s ({})",
            cell(&f["kind"]),
            whole_seconds(&f["at_seconds"]),
            cell(&f["detail"])
        )
    })
    .join("; ")
}

/// The duplicate dispatches by the fault that caused them.
fn causes(v: &Value) -> String {
    v["duplicates_by_cause"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, c)| format!("{} after a {k}", cell(&c["duplicates"])))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
        .join(", ")
}

/// A change as a signed percentage (`–` when absent).
fn percent(x: &Value) -> String {
    x.as_f64()
        .map(|c| format!("{:+.1} %", c * 100.0))
        .unwrap_or_else(|| "–".into())
}

/// KiB as MiB (`–` when absent).
fn kib_as_mib(x: &Value) -> String {
    x.as_f64()
        .map(|k| format!("{:.1}", k / 1024.0))
        .unwrap_or_else(|| "–".into())
}

/// Bytes as MiB (0 when absent).
fn bytes_as_mib(x: &Value) -> String {
    format!("{:.1}", x.as_f64().unwrap_or(0.0) / 1048576.0)
}

/// One worker process: its life, RSS and descriptors at its start and its end.
fn process(p: &Value) -> String {
    format!(
        "worker {} (pid {}, {}–{} s{}): RSS {} → {} MiB ({}), descriptors {} → {} ({})",
        cell(&p["slot"]),
        cell(&p["pid"]),
        whole_seconds(&p["from_seconds"]),
        whole_seconds(&p["to_seconds"]),
        if p["judged"] == true {
            ""
        } else {
            ", too short a life to judge"
        },
        kib_as_mib(&p["rss_kib_first_quarter"]),
        kib_as_mib(&p["rss_kib_last_quarter"]),
        percent(&p["rss_change"]),
        cell(&p["fds_first_quarter"]),
        cell(&p["fds_last_quarter"]),
        percent(&p["fds_change"]),
    )
}

/// The sentence on how long the queues took to catch up after each fault (empty
/// when the record has none).
fn catch_up(v: &Value) -> String {
    let each_fault = each(&v["catch_up"], |c| {
        let secs = c["catch_up_seconds"]
            .as_f64()
            .map_or("never".into(), |x| format!("{x:.0} s"));
        format!("{} {secs}", cell(&c["kind"]))
    });
    if each_fault.is_empty() {
        return String::new();
    }
    format!(
        " Time until the jobs queue and the lanes were back to their depth before each fault, \
         publishing going on (bound {} s): {}.",
        cell(&v["catch_up_bound_seconds"]),
        each_fault.join(", ")
    )
}

/// The soak's paragraph.
pub(super) fn soak(v: &Value) -> String {
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
        cell(&v["rate_per_second"]), cell(&v["jobs"]), cell(&v["fault_every_seconds"]), faults(v),
        cell(&v["lost"]), cell(&v["dispatched"]), cell(&v["waiting"]), cell(&v["dead"]), cell(&v["violations"]),
        cell(&v["duplicates"]), causes(v), cell(&v["duplicates_unexplained"]),
        cell(&v["uncommitted_after_kills"]), cell(&v["redis_resets_logged"]), each(&v["processes"], process).join("; "),
        bytes_as_mib(&v["redis_baseline_bytes"]), bytes_as_mib(&v["redis_peak_bytes"]),
        cell(&v["redis_bytes_per_send_last_quarter"]), cell(&v["redis_bound"]), cell(&v["redis_over_bound"]),
        cell(&v["recovery_seconds"]), catch_up(v), cell(&v["plot"]),
    )
}
