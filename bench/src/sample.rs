//! What the machine and its processes use, read from `/proc`: CPU seconds of the
//! broker, Redis and this process, and a process's resident memory. Which Redis is
//! counted: the machine's oldest `redis-server`, the one the scale step started
//! ([`set_redis_pid`]), or every node of the cluster ([`crate::cluster`]).

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, Result};

/// The Redis server whose CPU [`cpu_snapshot`] counts, when not the machine's
/// oldest `redis-server` (0: that one).
static REDIS_PID: AtomicU32 = AtomicU32::new(0);

/// Counts the CPU of the Redis server `pid` from now on (0: the machine's oldest).
pub fn set_redis_pid(pid: u32) {
    REDIS_PID.store(pid, Ordering::Relaxed);
}

/// The cores and the CPU model, for the report.
pub fn machine() -> String {
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    format!("{cpus} cores, {model}")
}

/// CPU seconds (user + system) a process has used so far.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// A field of `/proc/<pid>/status` in kB (`VmRSS`, `VmHWM`), in MiB.
pub fn rss_mib(pid: u32, field: &str) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU seconds used so far by the broker, Redis and this process.
pub fn cpu_snapshot() -> [f64; 3] {
    let pid_of = |name: &str| -> Option<u32> {
        let out = Command::new("pgrep").arg("-o").arg(name).output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    let redis = match crate::cluster::urls() {
        [] => match REDIS_PID.load(Ordering::Relaxed) {
            0 => pid_of("redis-server"),
            pid => Some(pid),
        }
        .and_then(cpu_secs)
        .unwrap_or(0.0),
        nodes => nodes
            .iter()
            .filter_map(|url| server_pid(url).ok())
            .filter_map(cpu_secs)
            .sum(),
    };
    [
        pid_of("beam.smp").and_then(cpu_secs).unwrap_or(0.0),
        redis,
        cpu_secs(std::process::id()).unwrap_or(0.0),
    ]
}

/// The pid `INFO server` of the Redis at `url` gives.
pub fn server_pid(url: &str) -> Result<u32> {
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut conn)?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
        .context("no process_id in INFO server")
}
