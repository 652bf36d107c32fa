//! The table on stdout: the report in Markdown tables and lines, in the order
//! BENCHMARKS.md quotes them. Prints only; computes nothing the report lacks.

use std::collections::HashMap;

use crate::report::{EndToEnd, FallbackReport, Report};

/// Milliseconds to two decimals, or `n/a`.
pub fn fmt_ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.2}")).unwrap_or_else(|| "n/a".into())
}

/// End-to-end p50 / p99 / p99.9 in milliseconds, or `n/a`.
pub fn fmt_e2e(e: Option<&EndToEnd>) -> String {
    e.map_or_else(
        || "n/a".into(),
        |e| format!("{:.2} / {:.2} / {:.2}", e.p50_ms, e.p99_ms, e.p999_ms),
    )
}

/// Outcomes as `name count`, sorted, comma-separated.
fn outcomes(o: &HashMap<String, u64>) -> String {
    let mut o: Vec<_> = o.iter().map(|(k, v)| format!("{k} {v}")).collect();
    o.sort();
    o.join(", ")
}

/// Every part of the report, on stdout.
pub fn print(r: &Report) {
    print_ceiling_and_engine(r);
    print_engine_limits(r);
    print_mixes(r);
    print_latency_summary(r);
    print_scale(r);
    print_latency_passes(r);
    print_recovery(r);
    print_campaign(r);
    print_digests(r);
    print_fallback(r);
    println!(
        "\nRedis memory: {:.1} bytes per recipient with 3 sends ({} recipients); MEMORY USAGE of one: {} bytes",
        r.memory_bytes_per_recipient, r.memory_recipients, r.memory_usage_one_recipient
    );
}

fn print_ceiling_and_engine(r: &Report) {
    println!("\nmachine: {}", r.machine);
    println!(
        "ceiling (pass-through, quorum, confirms), mean of the paired runs: {:.0} msgs/s",
        r.ceiling_jobs_per_sec
    );
    println!(
        "engine: {:.0} admissions/s ({:.2} Redis calls each); redis-benchmark EVALSHA admit.lua: {}; ratio {}",
        r.engine_admissions_per_sec,
        r.engine_redis_calls_per_admission,
        r.redis_benchmark_evalsha_per_sec.map(|v| format!("{v:.0}/s")).unwrap_or_else(|| "n/a".into()),
        r.engine_ratio.map(|v| format!("{v:.2}")).unwrap_or_else(|| "n/a".into()),
    );
}

/// The engine's admissions with limits: every round, then the medians and their
/// ratio to none.
fn print_engine_limits(r: &Report) {
    let Some(l) = &r.engine_limits else {
        return;
    };
    println!(
        "\nengine with limits, {} admissions per configuration and round:",
        l.jobs_per_round
    );
    println!("| round | configuration | admissions/s | Redis EVALSHA µs/job | Redis CPU µs/job | engine CPU µs/job | jobs/call | Redis commands/job |");
    println!("|---|---|---|---|---|---|---|---|");
    let none = l.medians.first().map(|m| m.per_sec).unwrap_or(0.0);
    for x in l.rounds.iter().chain(&l.medians) {
        let round = match x.round {
            0 => format!("median ({:.2} of none)", x.per_sec / none),
            n => n.to_string(),
        };
        println!(
            "| {round} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} |",
            x.config,
            x.per_sec,
            x.evalsha_us,
            x.redis_cpu_us,
            x.engine_cpu_us,
            x.jobs_per_call,
            x.commands_per_job
        );
    }
}

/// The mixes: one row each, then their CPU per job against the paired ceiling.
fn print_mixes(r: &Report) {
    println!("\n| mix | jobs | jobs/s | ceiling msgs/s | x ceiling (rounds) | p50 ms | p99 ms | p99.9 ms | Redis calls/job | peak RSS MiB | outcomes |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for m in &r.mixes {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.2} ({}) | {} | {} | {} | {} | {:.1} | {} |",
            m.name,
            m.jobs,
            m.jobs_per_sec,
            m.ceiling_jobs_per_sec,
            m.ratio_to_ceiling,
            m.round_ratios
                .iter()
                .map(|v| format!("{v:.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            fmt_ms(m.admission_p50_ms),
            fmt_ms(m.admission_p99_ms),
            fmt_ms(m.admission_p999_ms),
            m.redis_calls_per_job
                .map(|v| format!("{v:.2}"))
                .unwrap_or_else(|| "n/a".into()),
            m.peak_rss_mib,
            outcomes(&m.outcomes)
        );
    }
    println!("\nCPU per job in microseconds (broker / Redis / worker), against the paired ceiling (broker / Redis / pass-through client):");
    for m in &r.mixes {
        let [b, rd, w] = m.cpu_us_per_job;
        let [cb, cr, cc] = m.ceiling_cpu_us_per_msg;
        println!(
            "  {}: {b:.0} / {rd:.0} / {w:.0} = {:.0}; ceiling {cb:.0} / {cr:.0} / {cc:.0} = {:.0}",
            m.name,
            b + rd + w,
            cb + cr + cc
        );
    }
}

fn print_latency_summary(r: &Report) {
    if r.latency_summary.is_empty() {
        return;
    }
    println!("\nend-to-end latency (publish to arrival in the output queue), medians over the rounds, default scheduling:");
    println!("| share of ceiling | rounds | worker p50 / p99 / p99.9 ms | pass-through p50 / p99 / p99.9 ms | p99 gap ms (rounds) | within +2 ms |");
    println!("|---|---|---|---|---|---|");
    for l in &r.latency_summary {
        println!(
            "| {} | {} | {:.2} / {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {:+.2} ({}) | {} |",
            l.share_of_ceiling,
            l.rounds,
            l.worker_p50_ms,
            l.worker_p99_ms,
            l.worker_p999_ms,
            l.pass_through_p50_ms,
            l.pass_through_p99_ms,
            l.pass_through_p999_ms,
            l.p99_gap_median_ms,
            l.p99_gap_ms
                .iter()
                .map(|v| format!("{v:+.2}"))
                .collect::<Vec<_>>()
                .join(", "),
            if l.within_2ms { "yes" } else { "no" }
        );
    }
}

fn print_scale(r: &Report) {
    if r.scale.is_empty() {
        return;
    }
    println!("\nscale: jobs/s and CPU per job with recipients already in Redis and policies in use (medians over the rounds):");
    println!("| recipients | policies | jobs/s | x ceiling (rounds) | CPU us/job broker / Redis / worker = total (rounds' totals) | outcomes (last round) |");
    println!("|---|---|---|---|---|---|");
    for x in &r.scale {
        let [b, rd, w] = x.cpu_us_per_job_parts;
        println!(
            "| {} | {} | {:.0} | {:.2} ({}) | {b:.0} / {rd:.1} / {w:.0} = {:.0} ({}) | {} |",
            x.recipients,
            x.policies,
            x.jobs_per_sec,
            x.ratio_to_ceiling,
            x.rounds
                .iter()
                .map(|v| format!("{:.2}", v.ratio))
                .collect::<Vec<_>>()
                .join(", "),
            x.cpu_us_per_job,
            x.rounds
                .iter()
                .map(|v| format!("{:.0}", v.cpu_us_per_job.iter().sum::<f64>()))
                .collect::<Vec<_>>()
                .join(", "),
            x.rounds
                .last()
                .map(|l| outcomes(&l.outcomes))
                .unwrap_or_default()
        );
    }
}

/// Every latency pass, the real-time one included.
fn print_latency_passes(r: &Report) {
    for l in &r.latency {
        println!(
            "\nround {} at {:.0} jobs/s ({} of the ceiling), scheduling {}: end to end p50 / p99 / p99.9 ms: worker {}, pass-through {}",
            l.round + 1,
            l.offered_jobs_per_sec,
            l.share_of_ceiling,
            l.scheduling,
            fmt_e2e(l.end_to_end.as_ref()),
            fmt_e2e(l.pass_through.as_ref())
        );
        println!(
            "  admission latency, {} jobs over {} s: p50 {} ms, p99 {} ms, p99.9 {} ms",
            l.jobs,
            l.seconds,
            fmt_ms(l.admission_p50_ms),
            fmt_ms(l.admission_p99_ms),
            fmt_ms(l.admission_p999_ms)
        );
        println!(
            "  of which one Redis script call: p50 {} ms, p99 {} ms, p99.9 {} ms ({:.1} jobs per call)",
            fmt_ms(l.redis_call_p50_ms),
            fmt_ms(l.redis_call_p99_ms),
            fmt_ms(l.redis_call_p999_ms),
            l.jobs_per_redis_call.unwrap_or(0.0)
        );
    }
}

/// The recovery step: one row a pass, then every pass's 5-second intervals.
fn print_recovery(r: &Report) {
    if r.recovery.is_empty() {
        return;
    }
    println!("\n| workers | broker restart | jobs | rate/s | drain s | x rate (whole) | x rate (without the outage) | lowest 5 s interval x rate | first 5 s from the first answer x rate | outage s | lane serving again after s | consuming again after s | dispatching again after s | held by the lease (s) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for p in &r.recovery {
        println!(
            "| {} | {} | {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {} | {:.1} | {} | {} | {} | {} ({:.0}) |",
            p.workers,
            if p.broker_restart { "yes" } else { "no" },
            p.jobs,
            p.rate,
            p.drain_secs,
            p.ratio_whole,
            p.ratio_without_outage,
            p.min_interval_ratio,
            p.first_from_answer_ratio
                .map_or("-".to_string(), |s| format!("{s:.3}")),
            p.outage_secs,
            p.lane_serving_after_secs
                .map_or("-".to_string(), |s| format!("{s:.2}")),
            p.consuming_after_secs
                .map_or("-".to_string(), |s| format!("{s:.2}")),
            p.resumed_after_secs
                .map_or("-".to_string(), |s| format!("{s:.2}")),
            p.held,
            p.held_secs
        );
    }
    for p in &r.recovery {
        let cells: Vec<String> = p
            .intervals
            .iter()
            .zip(&p.interval_in_outage)
            .map(|(v, o)| format!("{:.2}{}", v / p.rate as f64, if *o { "*" } else { "" }))
            .collect();
        println!(
            "{} worker(s){}, by 5 s interval (x rate; * = the broker away): {}",
            p.workers,
            if p.broker_restart {
                ", broker restart"
            } else {
                ""
            },
            cells.join(" ")
        );
    }
    for x in &r.bursts {
        println!(
            "burst of {} bulk jobs to the jobs exchange, {} worker(s): published at {:.0}/s, parked at {:.0}/s; an urgent job behind them waits {:.1} s",
            x.jobs, x.workers, x.publish_per_sec, x.parking_per_sec, x.urgent_wait_secs
        );
    }
}

/// The campaign step: one row a pass, then the medians of each kind of pass.
fn print_campaign(r: &Report) {
    if r.campaign.is_empty() {
        return;
    }
    let opt =
        |v: Option<f64>, digits: usize| v.map_or("-".to_string(), |v| format!("{v:.digits$}"));
    println!("\n| campaign pass | round | workers | jobs | tenants | rate/s | ceiling msgs/s | published/s | parked/s | x ceiling | last parked after the last publish s | unparked | urgent p50 / p99 / max ms | urgent dispatched / sent | urgent behind the parked backlog: max ms (jobs) |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in &r.campaign {
        let urgent = c.urgent.as_ref();
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {} | {:.0} | {:.3} | {} | {} | {} | {} | {} |",
            c.pass,
            c.round,
            c.workers,
            c.jobs,
            c.tenants,
            c.rate,
            c.ceiling_msgs_per_sec,
            opt(c.publish_per_sec, 0),
            c.parking_per_sec,
            c.parking_ratio,
            opt(c.lag_secs, 2),
            c.dispatched_unparked,
            urgent.map_or("-".into(), |u| format!(
                "{:.0} / {:.0} / {:.0}",
                u.p50_ms, u.p99_ms, u.max_ms
            )),
            urgent.map_or("-".into(), |u| format!("{} / {}", u.arrived, u.sent)),
            c.urgent_behind_parked
                .as_ref()
                .map_or("-".into(), |u| format!("{:.0} ({})", u.max_ms, u.arrived)),
        );
    }
    println!("\n| campaign pass | workers | rounds | parked x ceiling (median) | parked/s (median) | urgent p50 / p99 / max ms (medians) | urgent max of every round ms | urgent dispatched / sent |");
    println!("|---|---|---|---|---|---|---|---|");
    for k in &r.campaign_summary {
        println!(
            "| {} | {} | {} | {:.3} | {:.0} | {} / {} / {} | {} | {} / {} |",
            k.pass,
            k.workers,
            k.rounds,
            k.parking_ratio_median,
            k.parking_per_sec_median,
            opt(k.urgent_p50_ms_median, 0),
            opt(k.urgent_p99_ms_median, 0),
            opt(k.urgent_max_ms_median, 0),
            opt(k.urgent_max_ms, 0),
            k.urgent_arrived,
            k.urgent_sent,
        );
    }
}

/// The digest step: one row a pass.
fn print_digests(r: &Report) {
    if r.digests.is_empty() {
        return;
    }
    println!("\n| digest pass | jobs | window s | offered/s | digests sent / expected | items in digests | accounted | items folded/s | Redis bytes per held item (held at most) | bytes left per job | window end to dispatch p50 / p99 / max ms | from first_at p50 / p99 ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for d in &r.digests {
        let e = &d.window_end_to_dispatch;
        println!(
            "| {} | {} | {} | {} | {} / {} | {} | {} | {:.0} | {:.0} ({}) | {:.0} | {:.0} / {:.0} / {:.0} | {:.0} / {:.0} |",
            d.pass,
            d.jobs,
            d.window_secs,
            d.offered_jobs_per_sec.map_or("-".into(), |v| format!("{v:.0}")),
            d.digests_sent,
            d.digests_expected,
            d.items_in_digests,
            if d.accounted { "yes" } else { "NO" },
            d.items_folded_per_sec,
            d.redis_bytes_per_held_item,
            d.peak_items_held,
            d.redis_bytes_left_per_job,
            e.p50_ms,
            e.p99_ms,
            e.max_ms,
            d.first_at_to_dispatch_p50_ms,
            d.first_at_to_dispatch_p99_ms,
        );
    }
}

/// The fallback step: every round, the pending escalations, the deadlines.
fn print_fallback(r: &Report) {
    let Some(f) = &r.fallback else { return };
    println!("\n| fallback round | first | routed jobs/s | mix (a) jobs/s | ratio | routed: push / email / sms | worker CPU a job, routed / (a) µs |");
    println!("|---|---|---|---|---|---|---|");
    for (i, x) in f.rounds.iter().enumerate() {
        println!(
            "| {} | {} | {:.0} | {:.0} | {:.3} | {} / {} / {} | {:.1} / {:.1} |",
            i + 1,
            if x.routed_first { "routed" } else { "(a)" },
            x.routed.jobs_per_sec,
            x.mix_a.jobs_per_sec,
            x.ratio,
            x.push,
            x.email,
            x.sms,
            x.routed.cpu_us_per_job[2],
            x.mix_a.cpu_us_per_job[2],
        );
    }
    println!(
        "| **median** | | **{:.0}** | **{:.0}** | **{:.3}** | | |",
        f.routed_jobs_per_sec, f.mix_a_jobs_per_sec, f.ratio_to_mix_a
    );
    print_escalations(f);
}

fn print_escalations(f: &FallbackReport) {
    if let Some(p) = &f.pending {
        println!(
            "\n{} escalations pending ({} s), bodies of {:.0} bytes: Redis {:.0} bytes a job without fallback, {:.0} with: {:.0} bytes per pending escalation; MEMORY USAGE of a route state {:.0} ({} keys), of a route log {:.0} ({} keys)",
            p.jobs, p.answer_within_secs, p.body_bytes, p.plain_bytes_per_job, p.escalating_bytes_per_job,
            p.bytes_per_pending, p.route_state_memory_usage, p.route_states, p.route_log_memory_usage, p.route_logs
        );
        let empty = p.empty_queue_memory.unwrap_or(0);
        for q in &p.queues {
            println!(
                "  {}: {} messages, {} body bytes, {} bytes of memory ({:.0} a message above an empty queue's {empty})",
                q.name,
                q.messages,
                q.message_bytes.map_or("n/a".into(), |b| b.to_string()),
                q.memory,
                q.memory.saturating_sub(empty) as f64 / q.messages.max(1) as f64
            );
        }
    }
    if let Some(d) = &f.deadline {
        println!("\n| step's deadline ({} s) to the next dispatch, {} jobs at {:.0}/s | arrived | p50 ms | p99 ms | max ms | min ms | from the step's arrival + answer_within, p50 / p99 ms |", d.answer_within_secs, d.jobs, d.offered_jobs_per_sec);
        println!("|---|---|---|---|---|---|---|");
        for x in &d.steps {
            let e = &x.to_dispatch;
            println!(
                "| {} → {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} / {:.1} |",
                x.from,
                x.to,
                x.arrived,
                e.p50_ms,
                e.p99_ms,
                e.max_ms,
                x.min_ms,
                x.from_arrival_p50_ms,
                x.from_arrival_p99_ms
            );
        }
    }
}
