//! The fallback step (`--steps fallback`): what routing a job over several channels
//! costs, on the real worker binary. Three parts, each in a module of its own:
//!
//! - [`routed`]: `--jobs` jobs (default 100,000; 10,000 with `--quick`) routed
//!   push → email → sms, push capped for half of their recipients (a cap of one push
//!   a day, `channels = ["push"]`, filled by a warm-up job each before the drain), so
//!   half go out on push and half move on to email in the same handling; in each
//!   round against mix (a) (the same jobs on `sms`, no route), which first
//!   alternating: jobs/s and the ratio, CPU per job.
//! - [`pending`]: `--jobs` jobs whose policy escalates after an hour, their first
//!   step dispatched, each escalation pending: Redis bytes per pending escalation
//!   (the growth of `used_memory` on a private `redis-server` against the same jobs
//!   without `fallback`, and `MEMORY USAGE` of a sample of the keys it adds), and the
//!   namespace's queues as `rabbitmqctl list_queues` shows them.
//! - [`deadline`]: a few thousand jobs whose policy escalates after 2 s, offered at a
//!   steady rate, routed push → email → sms with no answer: from each step's
//!   deadline (its route entry's `escalates_at`) to the next step's dispatch arriving
//!   on its queue.

mod deadline;
mod pending;
mod routed;

use std::path::{Path, PathBuf};

use anyhow::Result;
use quota_worker::config::Settings;

use crate::context::{header, Bench};
use crate::report::{FallbackReport, Report};

/// Runs the step into `report`.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let jobs = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 10_000 } else { 100_000 });
    header(
        "fallback",
        format!(
            "{jobs} jobs routed push → email → sms, push capped for half, against mix (a): {} rounds",
            b.rounds
        ),
    );
    let mut r: FallbackReport = routed::rounds(b, jobs).await?;
    header(
        "fallback",
        format!("{jobs} escalations pending ({} s)", pending::WITHIN_SECS),
    );
    r.pending = Some(pending::measure(b, jobs).await?);
    let (n, rate) = if b.args.quick {
        (300, 100.0)
    } else {
        (3_000, 500.0)
    };
    header(
        "fallback",
        format!(
            "{n} jobs escalating after {} s, offered at {rate:.0}/s: deadline to next dispatch",
            deadline::WITHIN_SECS
        ),
    );
    r.deadline = Some(deadline::measure(b, n, rate).await?);
    report.fallback = Some(r);
    Ok(())
}

/// A worker configuration file, removed when dropped.
struct ConfigFile(PathBuf);

impl ConfigFile {
    /// `toml` in a file named after the namespace of `s`.
    fn write(s: &Settings, toml: &str) -> Result<ConfigFile> {
        let path = std::env::temp_dir().join(format!("{}.toml", s.redis.key_prefix));
        std::fs::write(&path, toml)?;
        Ok(ConfigFile(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A policy `alert` with no rules that escalates after `within_secs` when no
/// delivery answers a step.
fn escalating_policy(within_secs: u64) -> String {
    format!(
        "[policies.alert]\nrules = []\n\n[policies.alert.fallback]\non = [\"capped\", \"opted_out\", \"suppressed\", \"failed\", \"unanswered\"]\nanswer_within = \"{within_secs}s\"\n"
    )
}
