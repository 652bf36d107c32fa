//! What every step is given ([`Bench`]): the arguments, the run's id (every queue
//! and key of the run starts with it), the worker binary and what to delete; and
//! the progress line every step prints ([`header`]).

use std::fmt::Display;
use std::path::PathBuf;

use anyhow::{bail, Result};
use quota_worker::config::Settings;

use crate::cli::Args;
use crate::teardown::Teardown;

/// What every step is given.
pub struct Bench {
    pub args: Args,
    /// `bench<pid>`: every queue and key of the run starts with it.
    pub run_id: String,
    /// The worker binary.
    pub worker: PathBuf,
    /// Jobs per mix (and per latency ceiling and scale drain).
    pub jobs: usize,
    /// Paired rounds.
    pub rounds: usize,
    pub teardown: Teardown,
}

impl Bench {
    /// Settings of the run in the namespace `<run id><suffix>`.
    pub fn settings(&self, suffix: &str) -> Settings {
        self.settings_in(&format!("{}{suffix}", self.run_id))
    }

    /// Settings of the run in the namespace `ns`: the services of the arguments,
    /// their prefetch.
    pub fn settings_in(&self, ns: &str) -> Settings {
        let args = &self.args;
        let mut s = Settings::defaults().in_namespace(ns);
        s.amqp.url = args.amqp.clone();
        s.redis.url = args.redis.clone();
        if !args.redis_cluster.is_empty() {
            s.redis.cluster = true;
            s.redis.cluster_urls = args.redis_cluster.clone();
        }
        if let Some(p) = args.prefetch {
            s.amqp.prefetch = p;
        }
        s
    }
}

/// A step's progress line on stderr, headed by its name in `--steps`.
pub fn header(step: &str, what: impl Display) {
    eprintln!("[{step}] {what}");
}

/// The run's [`Bench`], once the worker binary is found and `--out` exists.
pub fn prepare(args: Args) -> Result<Bench> {
    let worker = match &args.worker {
        Some(p) => p.clone(),
        None => std::env::current_exe()?.with_file_name("quota-worker"),
    };
    if !worker.exists() {
        bail!(
            "{} not found: build it first (cargo build --release --bins)",
            worker.display()
        );
    }
    std::fs::create_dir_all(&args.out)?;
    let run_id = format!("bench{}", std::process::id());
    // every queue and key of the run starts with this
    eprintln!("run {run_id}");
    let (jobs, rounds) = (args.jobs(), args.rounds());
    let teardown = Teardown::new(&args.amqp, args.defer_deletes || jobs >= 500_000);
    Ok(Bench {
        args,
        run_id,
        worker,
        jobs,
        rounds,
        teardown,
    })
}
