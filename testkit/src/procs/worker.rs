//! The `quota-worker` binary as a child process.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use quota_worker::config::Settings;

use super::{signal, wait_child, watchdog};
use crate::env::{env_for, worker_env, worker_toml};

/// `quota-worker run` as a child process, configured for one test's names.
pub struct WorkerProc {
    child: Option<Child>,
    /// Its log (JSON lines on stderr).
    pub log: PathBuf,
    /// When it was started.
    pub started: Instant,
}

impl WorkerProc {
    /// Start `bin run` (the `quota-worker` binary) for `s`; `dir` holds its config
    /// file and log.
    pub fn spawn(bin: impl AsRef<Path>, s: &Settings, dir: &Path, tag: &str) -> WorkerProc {
        Self::spawn_with(bin.as_ref(), s, dir, tag, worker_env(s))
    }

    /// [`WorkerProc::spawn`], serving HTTP as `s.http` says.
    pub fn spawn_serving(bin: impl AsRef<Path>, s: &Settings, dir: &Path, tag: &str) -> WorkerProc {
        Self::spawn_with(bin.as_ref(), s, dir, tag, env_for(s))
    }

    /// [`WorkerProc::spawn`] with the environment `env` (e.g. [`worker_env`] and more).
    pub fn spawn_env(
        bin: impl AsRef<Path>,
        s: &Settings,
        dir: &Path,
        tag: &str,
        env: Vec<(String, String)>,
    ) -> WorkerProc {
        Self::spawn_with(bin.as_ref(), s, dir, tag, env)
    }

    fn spawn_with(
        bin: &Path,
        s: &Settings,
        dir: &Path,
        tag: &str,
        env: Vec<(String, String)>,
    ) -> WorkerProc {
        let config = dir.join("worker.toml");
        if !config.exists() {
            fs::write(&config, worker_toml(s)).unwrap();
        }
        let log = dir.join(format!("worker-{tag}.log"));
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(bin)
            .args(["--log-format", "json", "--config"])
            .arg(&config)
            .arg("run")
            .envs(env)
            .env(
                "RUST_LOG",
                std::env::var("QW_WORKER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .process_group(0)
            .spawn()
            .expect("quota-worker binary");
        watchdog(child.id(), false, "quota-worker");
        WorkerProc {
            child: Some(child),
            log,
            started: Instant::now(),
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGHUP: reload the configuration.
    pub fn hup(&self) {
        if let Some(c) = &self.child {
            signal(&c.id().to_string(), "HUP");
        }
    }

    /// SIGTERM (graceful shutdown).
    pub fn term(&self) {
        if let Some(c) = &self.child {
            signal(&c.id().to_string(), "TERM");
        }
    }

    /// SIGTERM, then wait (30 s at most) for it to exit.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.term();
        self.wait(Duration::from_secs(30))
    }

    /// Wait for it to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_child(self.child.as_mut()?, timeout)?;
        self.child = None;
        Some(status)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The last `n` lines of its log, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        super::tail_of(&self.log, n)
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill9();
    }
}
