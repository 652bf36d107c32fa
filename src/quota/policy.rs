//! What a policy and a channel's send rate are, once read: the values the rules in
//! force ([`crate::rules`]), the store and the decision work with. The
//! configuration builds them from its sections ([`crate::config::Settings::policies`],
//! [`crate::config::Settings::rate`]); nothing here knows where they were written.
//!
//! Pure: no I/O. `Scope`, `Action` and `Mode` read and print as their lowercase
//! names, the words a configuration file uses for them.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::send_windows::SendWindows;
use super::window::Rule;

/// What counts toward a policy's caps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// All of a recipient's jobs under the policy, whatever the channel.
    #[default]
    Recipient,
    /// A recipient's jobs under the policy on one channel.
    Channel,
}

/// What happens to a job its recipient's caps refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Hold it until the first instant it is allowed.
    #[default]
    Delay,
    /// Dead-letter it with reason `capped`.
    Drop,
}

/// Whether a policy holds jobs or only says what it would have done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Its caps, windows and `max_wait` hold and dead-letter jobs.
    #[default]
    Enforce,
    /// Its sends are recorded and its verdict computed and counted
    /// (`quota_worker_shadow_total`), but no job is held or dead-lettered by it.
    Shadow,
}

impl Mode {
    /// `enforce` or `shadow`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Shadow => "shadow",
        }
    }
}

/// A validated policy, ready for the store.
///
/// Its fields mirror the keys of `[policies.NAME]` ([`crate::config::PolicySettings`]),
/// one each, validated: it has as many as the table has keys, not a concern each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Its name (the job category that selects it).
    pub name: String,
    /// Caps; empty means none.
    pub rules: Vec<Rule>,
    /// What the caps count.
    pub scope: Scope,
    /// What happens to a refused job.
    pub action: Action,
    /// When its jobs may go out, in the recipient's zone; `None`: any time.
    pub send_windows: Option<SendWindows>,
    /// Its jobs go out whatever their channel's send windows say.
    pub ignore_channel_windows: bool,
    /// The longest a job may wait, from when the worker first saw it, for its caps
    /// and windows; a job that would wait longer is dead-lettered `capped`.
    pub max_wait: Option<chrono::Duration>,
    /// Enforced, or only counted (shadow).
    pub mode: Mode,
    /// The lane of its jobs that name none (`policies.NAME.priority`).
    pub priority: quota_worker_producer::Priority,
    /// The kinds of suppression that dead-letter its jobs (`suppressed`).
    pub suppressed_by: super::suppression::Kinds,
    /// What the caps (`quota::caps`) do to its jobs.
    pub caps: CapsMode,
    /// Its jobs pass the recipients' opt-outs and quiet hours
    /// (`policies.NAME.required`).
    pub required: bool,
    /// Its jobs are folded into digests (`policies.NAME.digest`); `None`: never.
    pub digest: Option<super::digest::DigestSpec>,
    /// When its jobs that name further channels move on (`policies.NAME.fallback`).
    pub fallback: crate::fallback::spec::FallbackSpec,
}

/// What a policy lets the caps do to its jobs (`policies.NAME.caps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum CapsMode {
    /// Its jobs are held by the caps that match them, and counted toward them.
    #[default]
    Enforce,
    /// Its jobs are never held by the caps, but counted toward them.
    Count,
    /// The caps neither hold nor count its jobs.
    Ignore,
}

impl TryFrom<String> for CapsMode {
    type Error = String;

    fn try_from(word: String) -> Result<CapsMode, String> {
        match word.as_str() {
            "enforce" => Ok(CapsMode::Enforce),
            "count" => Ok(CapsMode::Count),
            "ignore" => Ok(CapsMode::Ignore),
            _ => Err(format!(
                "`{word}` is not one of \"enforce\" (held by the caps and counted toward them), \
                 \"count\" (counted toward them, never held) or \"ignore\" (neither)"
            )),
        }
    }
}

/// A validated channel send rate: at most `burst` at once, then one every `interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    /// `period / rate`, in microseconds (at least 1).
    pub interval_us: u64,
    /// Jobs that may go at once from a full bucket.
    pub burst: u64,
    /// What one job costs.
    pub cost: u64,
}

impl Rate {
    /// This rate as a job of cost `cost` takes it (`None`: the channel's `cost`).
    pub fn for_cost(self, cost: Option<u64>) -> Rate {
        Rate {
            cost: cost.unwrap_or(self.cost),
            ..self
        }
    }
}

impl fmt::Display for Rate {
    /// `12.5 per second, burst 10` (and `, cost 2` when a job costs more than one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let per_second = 1e6 / self.interval_us as f64 / self.cost as f64;
        write!(f, "{} per second, burst {}", trim(per_second), self.burst)?;
        if self.cost != 1 {
            write!(f, ", cost {}", self.cost)?;
        }
        return Ok(());

        fn trim(x: f64) -> String {
            let s = format!("{x:.3}");
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_reads_as_jobs_per_second() {
        let rate = |interval_us, burst, cost| {
            Rate {
                interval_us,
                burst,
                cost,
            }
            .to_string()
        };
        assert_eq!(rate(100_000, 1, 1), "10 per second, burst 1");
        assert_eq!(rate(3_000, 50, 1), "333.333 per second, burst 50");
        assert_eq!(rate(250_000, 4, 2), "2 per second, burst 4, cost 2");
    }
}
