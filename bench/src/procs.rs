//! The processes the benchmark starts and steers: the worker (`quota-worker run`,
//! quiet, its HTTP endpoint on a free port), Redis servers of its own, and real-time
//! scheduling of a process by `chrt`. Each is stopped with SIGTERM, then killed.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use quota_worker::config::Settings;

use crate::metrics::get;
use crate::sample::server_pid;
use testkit::{free_port, redis_host_port};

/// `quota-worker run` for `s`, quiet, its HTTP endpoint on a free port, with `env`
/// added to its environment.
pub fn spawn_worker(bin: &Path, s: &Settings, env: &[(String, String)]) -> Result<(Child, u16)> {
    spawn(bin, s, env, None)
}

/// [`spawn_worker`] with the configuration file `config` (`--config`: policies and
/// channels, which cannot be environment variables).
pub fn spawn_worker_configured(
    bin: &Path,
    s: &Settings,
    env: &[(String, String)],
    config: &Path,
) -> Result<(Child, u16)> {
    spawn(bin, s, env, Some(config))
}

fn spawn(
    bin: &Path,
    s: &Settings,
    env: &[(String, String)],
    config: Option<&Path>,
) -> Result<(Child, u16)> {
    let port = free_port(None);
    let mut w = s.clone();
    w.http.enabled = true;
    w.http.listen = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(bin);
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    cmd.arg("run")
        .envs(testkit::env::env_for(&w))
        .envs(env.iter().cloned())
        .stdout(Stdio::null());
    // QW_BENCH_WORKER_LOGS=DIR: each worker's log, at info, in DIR/worker-<port>.log
    // (when its session started and how long that took, every reconnect)
    match std::env::var_os("QW_BENCH_WORKER_LOGS") {
        Some(dir) => {
            let path = Path::new(&dir).join(format!("worker-{port}.log"));
            let log = std::fs::File::create(&path)
                .with_context(|| format!("creating {}", path.display()))?;
            cmd.env("RUST_LOG", "info").stderr(log)
        }
        None => cmd.env("RUST_LOG", "warn").stderr(Stdio::null()),
    };
    let child = cmd.spawn().context("starting the worker")?;
    Ok((child, port))
}

/// Whether the worker's `/readyz` answers 200: it is connected and consuming.
pub fn is_ready(port: u16) -> bool {
    get(port, "/readyz")
        .is_ok_and(|r| r.starts_with("HTTP/1.1 200") || r.starts_with("HTTP/1.0 200"))
}

/// Wait until the worker's `/readyz` answers 200: it is connected and consuming.
pub async fn wait_ready(port: u16, child: &mut Child) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if is_ready(port) {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("the worker exited before it was ready: {status}");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    bail!("the worker was not ready within 30 s")
}

/// SIGTERM, then up to 10 s for the process to exit, then SIGKILL.
pub fn stop(child: &mut Child) {
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status();
    for _ in 0..100 {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A Redis server of the benchmark's own (no persistence, loopback, a free port),
/// shut down when dropped: the scale step gives each recipient count one, so that
/// the keyspace of one is not the other's.
pub struct OwnRedis {
    pub child: Child,
    pub url: String,
}

impl OwnRedis {
    pub fn start() -> Result<OwnRedis> {
        let port = free_port(None);
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            // DEBUG HTSTATS, to see when the keyspace's tables stop rehashing
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting redis-server")?;
        let url = format!("redis://127.0.0.1:{port}");
        let mut own = OwnRedis { child, url };
        for _ in 0..100 {
            let up = redis::Client::open(own.url.as_str())
                .and_then(|c| c.get_connection())
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if up.is_ok() {
                return Ok(own);
            }
            if let Some(status) = own.child.try_wait()? {
                bail!("redis-server exited: {status}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("redis-server on port {port} did not answer")
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// A process (every thread of it) under SCHED_FIFO priority 10 until dropped, then
/// back to SCHED_OTHER. Needs `chrt` (util-linux) and the right to raise priority
/// (root, or CAP_SYS_NICE).
pub struct Realtime(u32);

impl Realtime {
    pub fn set(pid: u32) -> Result<Realtime> {
        let out = Command::new("chrt")
            .args(["-a", "-f", "-p", "10", &pid.to_string()])
            .output()
            .context("running chrt")?;
        if !out.status.success() {
            bail!(
                "chrt -a -f -p 10 {pid}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Realtime(pid))
    }
}

impl Drop for Realtime {
    fn drop(&mut self) {
        let _ = Command::new("chrt")
            .args(["-a", "-o", "-p", "0", &self.0.to_string()])
            .output();
    }
}

/// The pid of the Redis server, when it runs on this machine.
pub fn redis_pid(s: &Settings) -> Result<u32> {
    let (host, _) = redis_host_port(&s.redis.url);
    if !["127.0.0.1", "localhost", "::1", "[::1]"].contains(&host.as_str()) {
        bail!("Redis at {host} is not on this machine");
    }
    server_pid(&s.redis.url)
}
