//! The "Details" section of RELIABILITY.md: a paragraph a scenario, in the order the
//! document lists them, each from its record.

use serde_json::Value;

use super::cell::{cell, each};
use super::soak::soak;

/// One scenario's paragraph.
pub(super) struct Detail {
    /// The scenario's record name.
    pub scenario: &'static str,
    /// Whether a skipped record (`skipped` set) is left out.
    pub unless_skipped: bool,
    /// The paragraph, from one record.
    pub paragraph: fn(&Value) -> String,
}

const fn detail(
    scenario: &'static str,
    unless_skipped: bool,
    paragraph: fn(&Value) -> String,
) -> Detail {
    Detail {
        scenario,
        unless_skipped,
        paragraph,
    }
}

/// The paragraphs, in the document's order.
pub(super) const DETAILS: &[Detail] = &[
    detail("kill9", false, kill9),
    detail("broker_restart", true, broker_restart),
    detail("fair_kill", false, fair),
    detail("fair_broker_restart", true, fair),
    detail("rabbit_cluster", true, rabbit_cluster),
    detail("broker_hang", true, broker_hang),
    detail("memory_alarm", true, memory_alarm),
    detail("redis_outage", false, redis_outage),
    detail("redis_reset", false, redis_reset),
    detail("redis_sentinel", false, redis_sentinel),
    detail("redis_cluster_failover", false, redis_cluster_failover),
    detail("four_workers", false, four_workers),
    detail("sigterm", false, sigterm),
    detail("stale_x_death", false, stale_x_death),
    detail("bad_input_end_to_end", false, bad_input_end_to_end),
    detail("soak", false, soak),
];

/// The jobs of a record's first run (empty without runs).
fn first_run_jobs(v: &Value) -> String {
    v["runs"]
        .get(0)
        .map(|r| cell(&r["jobs"]))
        .unwrap_or_default()
}

fn kill9(v: &Value) -> String {
    format!(
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
    )
}

fn broker_restart(v: &Value) -> String {
    format!(
        "- **Broker restart** ({} form): {}. The broker was away {} s each time (its boot takes {} s here); \
         the worker was consuming again {} s after the broker accepted connections. {} lost, {} duplicates.\n",
        cell(&v["mode"]), cell(&v["fault"]), cell(&v["broker_down_seconds"]), cell(&v["broker_boot_seconds"]),
        cell(&v["recovery_seconds"]), cell(&v["lost"]), cell(&v["duplicates"]),
    )
}

/// The fair shares' faults: the audit, and the rate from a tap on the dispatches.
fn fair(v: &Value) -> String {
    format!(
        "- **{}** ({} form): {}; {} jobs of three tenants at {} dispatches/s, {} fault(s). {} dispatched, \
         {} lost, {} dead, {} duplicate dispatches{}. The rate held: no interval \
         of the jobs' first dispatches, as a tap on the dispatch exchange saw them, held more than the \
         burst plus the rate times its length by over {} (it held {} beyond; the tolerance is the lines' \
         look-ahead and the tap's measured jitter at the rate).\n",
        if v["scenario"] == "fair_kill" { "Fair shares, kill -9" } else { "Fair shares, broker restart" },
        cell(&v["mode"]), cell(&v["fault"]), cell(&v["jobs"]), cell(&v["rate_per_second"]),
        cell(&v["faults"]), cell(&v["dispatched"]), cell(&v["lost"]), cell(&v["dead"]),
        cell(&v["duplicates"]),
        match &v["duplicates_unexplained"] {
            Value::Null => String::new(),
            n => format!(" ({} that no kill explains: a kill explains a copy of a job among the last dispatched before it)", cell(n)),
        },
        cell(&v["rate_tolerance"]),
        cell(&v["rate_excess"]),
    )
}

fn rabbit_cluster(v: &Value) -> String {
    format!(
        "- **RabbitMQ cluster** ({} form): three private nodes on loopback (booted and clustered in {} s), \
         quorum queues with a replica on each, the worker given every node in `amqp.urls`. {}. After the \
         first kill the next 300 dispatches took {} s (the worker's node was untouched); the nodes were down \
         {} s; with both back, the worker consumed again {} s later. {} lost, {} duplicates, {} cap \
         violations, {} s in all.\n",
        cell(&v["mode"]), cell(&v["cluster_boot_seconds"]), cell(&v["fault"]),
        cell(&v["seconds_to_300_more_after_first_kill"]), cell(&v["nodes_down_seconds"]),
        cell(&v["recovery_seconds"]), cell(&v["lost"]), cell(&v["duplicates"]),
        cell(&v["violations"]), cell(&v["elapsed_seconds"]),
    )
}

fn broker_hang(v: &Value) -> String {
    format!(
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
    )
}

fn memory_alarm_run(r: &Value) -> String {
    format!(
        "{} s: {} dispatched while it lasted, dispatching again {} s after it cleared",
        cell(&r["alarm_seconds"]),
        cell(&r["dispatched_during_alarm"]),
        cell(&r["recovery_seconds"]),
    )
}

fn memory_alarm(v: &Value) -> String {
    format!(
        "- **Memory alarm** ({} form): {}. The worker logged the block {} times, took no new job while \
         blocked and waited for the held confirms ({} dispatches handed back unconfirmed). {}. {} lost, {} \
         duplicates, {} cap violations.\n",
        cell(&v["mode"]), cell(&v["fault"]), cell(&v["blocked_logged"]), cell(&v["unconfirmed_handed_back"]),
        each(&v["runs"], memory_alarm_run).join("; "),
        cell(&v["lost"]), cell(&v["duplicates"]), cell(&v["violations"]),
    )
}

fn redis_outage(v: &Value) -> String {
    format!(
        "- **Redis outage** ({} form): {}. `Health.redis` turned false {} s after the stop; `/readyz` during \
         the outage answered `{}`. Jobs dispatched while Redis was away (after the first second, which lets \
         decisions already taken finish): {}; dead-lettered because of it: {}. After Redis returned the next \
         dispatch came {} s later and `/readyz` answered 200 again after {} s.\n",
        cell(&v["mode"]), cell(&v["fault"]), cell(&v["health_noticed_seconds"]), cell(&v["readyz_during_outage"]),
        cell(&v["dispatched_during_outage"]), cell(&v["dead_lettered_not_malformed"]), cell(&v["recovery_seconds"]),
        cell(&v["health_back_seconds"]),
    )
}

fn redis_reset_run(r: &Value) -> String {
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
}

fn redis_reset(v: &Value) -> String {
    format!(
        "- **Redis flushed** ({} form): {}: {}.\n",
        cell(&v["mode"]),
        cell(&v["fault"]),
        each(&v["runs"], redis_reset_run).join("; "),
    )
}

fn redis_sentinel_run(r: &Value) -> String {
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
}

fn redis_sentinel(v: &Value) -> String {
    format!(
        "- **Redis Sentinel** ({} form): a master, two replicas and three sentinels started by the test, \
         the worker given the master's name and the sentinels (`[redis.sentinel]`); {}. {} jobs per run. {}.\n",
        cell(&v["mode"]),
        cell(&v["fault"]),
        first_run_jobs(v),
        each(&v["runs"], redis_sentinel_run).join("; "),
    )
}

fn redis_cluster_failover_run(r: &Value) -> String {
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
}

fn redis_cluster_failover(v: &Value) -> String {
    format!(
        "- **Redis Cluster failover** ({} form): {}; the worker follows the new slot map by itself. {} jobs \
         per run. {}. With `WAIT`, the admissions' calls go on connections of their own: a `WAIT` holds the \
         connection it runs on, and on the shared one (one a node) the waits for a master with no replica \
         answering queued past the 2 s response timeout, with every other call to that node behind them.\n",
        cell(&v["mode"]),
        cell(&v["fault"]),
        first_run_jobs(v),
        each(&v["runs"], redis_cluster_failover_run).join("; "),
    )
}

fn four_workers(v: &Value) -> String {
    format!(
        "- **Four workers** ({} form): {} jobs, {} recipients, cap {}: {} dispatched (exactly the cap for each \
         recipient, and exactly that many sends recorded in Redis), {} waiting, settled in {} s.\n",
        cell(&v["mode"]), cell(&v["jobs"]), cell(&v["recipients"]), cell(&v["cap"]), cell(&v["dispatched"]),
        cell(&v["waiting"]), cell(&v["elapsed_seconds"]),
    )
}

/// A line a run (a grace long enough, then too short).
fn sigterm(v: &Value) -> String {
    each(&v["runs"], |r| {
        format!(
            "- **SIGTERM** ({} form): paced at {}/s with a grace of {} s: exit code {} after {} s; \
             {} lost, {} duplicates.\n",
            cell(&v["mode"]), cell(&r["rate_per_second"]), cell(&r["grace_seconds"]), cell(&r["exit_code"]),
            cell(&r["exit_seconds"]), cell(&r["lost"]), cell(&r["duplicates"]),
        )
    })
    .concat()
}

fn stale_x_death(v: &Value) -> String {
    format!(
        "- **Stale `x-death`** ({} form): the republished job was delayed by its cap and dispatched {} s later. \
         Control: a copy sent round the delay ladder *with* its `x-death` kept came back: {} (false means the \
         broker's dead-letter cycle detection dropped it silently; this is what the worker's stripping prevents).\n",
        cell(&v["mode"]), cell(&v["stale_job_dispatched_after_seconds"]),
        cell(&v["control_with_x_death_kept_came_back"]),
    )
}

fn bad_input_end_to_end(v: &Value) -> String {
    let cases = each(&v["cases"], |c| {
        format!("`{}` → {}", cell(&c["case"]), cell(&c["expected"]))
    });
    format!(
        "- **Bad input end to end** ({} form), each found exactly once with that outcome: {}.\n",
        cell(&v["mode"]),
        cases.join("; ")
    )
}
