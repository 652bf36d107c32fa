//! Processes a test starts and must not leave behind: a private `redis-server`, a
//! three-master Redis Cluster (with or without a replica per master), a Sentinel
//! group (master, replica, three sentinels), a private RabbitMQ node, and the
//! worker binary.
//!
//! Every process is killed when its handle drops. Because a handle kept in a static
//! (the shared cluster) never drops, and a test process can itself be killed, each
//! process also gets a watchdog: a tiny `sh` loop that kills it (by pid or process
//! group, nothing broader) once the test process is gone. Temp dirs get one too.
//!
//! By what they start: `redis_node` (one `redis-server`), `redis_groups` (a Redis
//! Cluster, a Sentinel group), `rabbit` (private RabbitMQ nodes and a cluster of
//! them), `worker` (the `quota-worker` binary).

use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

mod rabbit;
mod redis_groups;
mod redis_node;
mod worker;

pub use rabbit::{RabbitCluster, RabbitNode};
pub use redis_groups::{RedisCluster, RedisSentinel};
pub use redis_node::RedisServer;
pub use worker::WorkerProc;

/// Kill `pid` (or its process group) once this test process has exited, unless it
/// has exited first. `comm` guards against a recycled pid. (`sh` may be dash, whose
/// `kill` takes a negative pid for a group but no `--`.)
pub(crate) fn watchdog(pid: u32, group: bool, comm: &str) {
    let script = r#"
t=$1; c=$2; g=$3; comm=$4
while kill -0 "$t" 2>/dev/null; do
  if [ "$g" = 1 ]; then kill -0 "-$c" 2>/dev/null || exit 0
  else kill -0 "$c" 2>/dev/null || exit 0; fi
  sleep 0.5
done
if [ "$g" = 1 ]; then kill -9 "-$c" 2>/dev/null
elif [ "$(cat /proc/$c/comm 2>/dev/null)" = "$comm" ]; then kill -9 "$c" 2>/dev/null; fi
"#;
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("qw-watchdog")
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .arg(if group { "1" } else { "0" })
        .arg(comm)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
}

/// The last `n` lines of the file at `path` (empty if unreadable), for failure
/// messages.
pub(crate) fn tail_of(path: &std::path::Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Send `signal` (e.g. "TERM", "KILL", "STOP", "CONT") to one pid, or to a process
/// group when `pid` is given negative as text.
pub fn signal(target: &str, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target)
        .stderr(Stdio::null())
        .status();
}

pub(crate) fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
