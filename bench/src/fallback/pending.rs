//! What a pending escalation holds. Two passes of `--jobs` jobs of policy `alert`
//! (no rules; it escalates after [`WITHIN_SECS`] when no delivery answers a step),
//! each drained from a backlog by a worker of its own on a `redis-server` of its own
//! (so that `used_memory` is the pass's alone): *plain*, the jobs on push without
//! `fallback`; *escalating*, the same jobs routed on to email and sms, each first
//! step dispatched and its escalation pending round the delay ladder. Once every job
//! is dispatched and the key count holds still (a route's log entry is written by a
//! task of its own, after the dispatch), the growth of `used_memory` per job in each;
//! their difference is the Redis bytes of one pending escalation. Beside it, the keys
//! the escalating pass adds, counted and a sample measured by `MEMORY USAGE`: the
//! step's state (`<prefix>:{tag}/route:<hash>`: where it is, its next step and the
//! job's body) and the route's log (`<prefix>:route:<id>`, for `admin job`); and the
//! namespace's queues that hold messages, as `rabbitmqctl list_queues` shows them
//! (the escalations in the ladder's queues, the dispatches beside them).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::{escalating_policy, ConfigFile};
use crate::broker::{closed, connect};
use crate::context::Bench;
use crate::digest::used_memory;
use crate::jobs::job_bodies;
use crate::mixes::drain;
use crate::procs::OwnRedis;
use crate::report::{median, PendingEscalations, QueueFigures};

/// `answer_within`, seconds: long enough that nothing escalates while measured.
pub const WITHIN_SECS: u64 = 3600;
/// Keys of each kind measured by `MEMORY USAGE`.
const SAMPLE: usize = 1_000;

/// The two passes; the figures of a pending escalation.
pub async fn measure(b: &Bench, jobs: usize) -> Result<PendingEscalations> {
    if !b.args.redis_cluster.is_empty() {
        bail!("the fallback step runs on a private redis-server, not with --redis-cluster");
    }
    let plain = pass(b, jobs, false).await?;
    let escalating = pass(b, jobs, true).await?;
    let body_bytes =
        job_bodies("f-alert", jobs).map(|b| b.len()).sum::<usize>() as f64 / jobs.max(1) as f64;
    let keys = escalating.keys.unwrap_or_default();
    let r = PendingEscalations {
        jobs,
        answer_within_secs: WITHIN_SECS,
        body_bytes,
        plain_bytes_per_job: plain.bytes_per_job,
        escalating_bytes_per_job: escalating.bytes_per_job,
        bytes_per_pending: escalating.bytes_per_job - plain.bytes_per_job,
        route_states: keys.states,
        route_state_memory_usage: keys.state_usage,
        route_logs: keys.logs,
        route_log_memory_usage: keys.log_usage,
        sampled: SAMPLE,
        queues: escalating.queues,
        empty_queue_memory: escalating.empty_queue_memory,
    };
    eprintln!(
        "      Redis bytes per job: {:.0} plain, {:.0} escalating: {:.0} per pending escalation; MEMORY USAGE: route state {:.0} ({} keys), route log {:.0} ({} keys)",
        r.plain_bytes_per_job,
        r.escalating_bytes_per_job,
        r.bytes_per_pending,
        r.route_state_memory_usage,
        r.route_states,
        r.route_log_memory_usage,
        r.route_logs
    );
    let empty = r.empty_queue_memory.unwrap_or(0);
    for q in &r.queues {
        eprintln!(
            "      {}: {} messages, {} bytes of memory ({:.0} a message above an empty queue's {empty})",
            q.name,
            q.messages,
            q.memory,
            q.memory.saturating_sub(empty) as f64 / q.messages as f64
        );
    }
    Ok(r)
}

/// What one pass measured.
#[derive(Default)]
struct Pass {
    bytes_per_job: f64,
    keys: Option<Keys>,
    queues: Vec<QueueFigures>,
    empty_queue_memory: Option<u64>,
}

/// The escalating pass's keys: counts and median `MEMORY USAGE` of a sample.
#[derive(Default)]
struct Keys {
    states: u64,
    state_usage: f64,
    logs: u64,
    log_usage: f64,
}

async fn pass(b: &Bench, jobs: usize, routed: bool) -> Result<Pass> {
    let redis = OwnRedis::start()?;
    let ns = format!("{}{}", b.run_id, if routed { "fpe" } else { "fpp" });
    let mut s = b.settings_in(&ns);
    s.redis.url = redis.url.clone();
    let config = ConfigFile::write(&s, &escalating_policy(WITHIN_SECS))?;
    let result = async {
        let mut r = redis::Client::open(s.redis.url.as_str())?.get_connection()?;
        let baseline = used_memory(&mut r)?;
        let conn = connect(&s.amqp.url).await?;
        let mix = if routed { "f-alert" } else { "f-plain" };
        let m = drain(&conn, &s, &b.worker, mix, jobs, &[], Some(config.path())).await;
        let _ = closed(conn.close(200, "bye".into())).await;
        let m = m?;
        if m.outcomes.get("dispatched") != Some(&(jobs as u64)) {
            bail!("not every job was dispatched: {:?}", m.outcomes);
        }
        settle(&mut r)?;
        let grown = used_memory(&mut r)? - baseline;
        let mut p = Pass {
            bytes_per_job: grown as f64 / jobs as f64,
            ..Default::default()
        };
        if routed {
            p.keys = Some(sample_keys(&mut r, &s.redis.key_prefix)?);
            (p.queues, p.empty_queue_memory) = queues_holding(&ns, jobs as u64).await;
        }
        anyhow::Ok(p)
    }
    .await;
    // the keys go with the private server
    b.teardown.topology(&s).await;
    drop(redis);
    result
}

/// Until the key count has held still for a second (at most 30 s).
fn settle(r: &mut redis::Connection) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last: i64 = redis::cmd("DBSIZE").query(r)?;
    let mut still = Instant::now();
    while Instant::now() < deadline && still.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(100));
        let now: i64 = redis::cmd("DBSIZE").query(r)?;
        if now != last {
            (last, still) = (now, Instant::now());
        }
    }
    Ok(())
}

/// The route states and logs under `prefix`, counted, and the median `MEMORY
/// USAGE` of the first [`SAMPLE`] of each.
fn sample_keys(r: &mut redis::Connection, prefix: &str) -> Result<Keys> {
    let log_prefix = format!("{prefix}:route:");
    let (mut states, mut logs) = (Vec::new(), Vec::new());
    let mut k = Keys::default();
    crate::teardown::scan_under(r, prefix, |_, keys| {
        for key in keys {
            if key.contains("}/route:") {
                k.states += 1;
                if states.len() < SAMPLE {
                    states.push(key);
                }
            } else if key.starts_with(&log_prefix) {
                k.logs += 1;
                if logs.len() < SAMPLE {
                    logs.push(key);
                }
            }
        }
        Ok(())
    })?;
    k.state_usage = memory_usage(r, &states)?;
    k.log_usage = memory_usage(r, &logs)?;
    Ok(k)
}

/// The median `MEMORY USAGE` of `keys`.
fn memory_usage(r: &mut redis::Connection, keys: &[String]) -> Result<f64> {
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.cmd("MEMORY").arg("USAGE").arg(key);
    }
    let sizes: Vec<Option<i64>> = pipe.query(r)?;
    Ok(median(
        sizes.into_iter().flatten().map(|v| v as f64).collect(),
    ))
}

/// The queues of namespace `ns` holding messages, once two of them hold `jobs`
/// (a quorum queue's count follows its log; at most 30 s), and the median memory
/// of its empty queues; nothing when `rabbitmqctl` cannot be run.
async fn queues_holding(ns: &str, jobs: u64) -> (Vec<QueueFigures>, Option<u64>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let queues = match list_queues(ns) {
            Ok(q) => q,
            Err(e) => {
                eprintln!("      rabbitmqctl list_queues: {e:#}");
                return (Vec::new(), None);
            }
        };
        let held = queues.iter().filter(|q| q.messages >= jobs).count();
        // the dispatch queue and the ladder's queue both hold every job
        if held >= 2 || Instant::now() > deadline {
            let (holding, empty): (Vec<_>, Vec<_>) =
                queues.into_iter().partition(|q| q.messages > 0);
            let empty = median(empty.iter().map(|q| q.memory as f64).collect());
            return (holding, (empty > 0.0).then_some(empty as u64));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// `rabbitmqctl list_queues name messages message_bytes memory`, the queues of
/// `ns`.
fn list_queues(ns: &str) -> Result<Vec<QueueFigures>> {
    let out = Command::new("rabbitmqctl")
        .args([
            "list_queues",
            "-q",
            "name",
            "messages",
            "message_bytes",
            "memory",
        ])
        .output()
        .context("running rabbitmqctl")?;
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(parse_queues(&String::from_utf8_lossy(&out.stdout), ns))
}

/// The rows of `rabbitmqctl list_queues` output whose name starts with `ns.`
/// (headers and other lines skipped).
fn parse_queues(text: &str, ns: &str) -> Vec<QueueFigures> {
    let mut out: Vec<QueueFigures> = text
        .lines()
        .filter_map(|l| {
            // tab-separated; a quorum queue leaves message_bytes empty
            let f: Vec<&str> = l.split('\t').map(str::trim).collect();
            let [name, messages, bytes, memory] = f[..] else {
                return None;
            };
            Some(QueueFigures {
                name: name.to_string(),
                messages: messages.parse().ok()?,
                message_bytes: bytes.parse().ok(),
                memory: memory.parse().ok()?,
            })
        })
        .filter(|q| q.name.starts_with(&format!("{ns}.")))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[cfg(test)]
mod tests {
    use super::parse_queues;

    #[test]
    fn the_namespaces_queues_holding_messages_are_read_from_rabbitmqctl() {
        let text = "name\tmessages\tmessage_bytes\tmemory\n\
            b1fpe.jobs\t0\t0\t143960\n\
            b1fpe.delay.2048s\t1000\t\t2000000\n\
            b1fpe.dispatch.push\t1000\t150000\t1500000\n\
            other.jobs\t5\t10\t100\n";
        let q = parse_queues(text, "b1fpe");
        let names: Vec<&str> = q.iter().map(|q| q.name.as_str()).collect();
        assert_eq!(
            names,
            ["b1fpe.delay.2048s", "b1fpe.dispatch.push", "b1fpe.jobs"]
        );
        assert_eq!(
            (q[0].messages, q[0].message_bytes, q[0].memory),
            (1000, None, 2_000_000)
        );
    }
}
