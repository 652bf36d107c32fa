//! The worker section (`[worker]`): the zone of jobs that name none, the largest
//! body, the shutdown grace and the runtime's threads.

use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::text::{zone_name, Dur};

/// Worker settings (`[worker]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    /// The IANA zone of jobs that carry no `timezone`, in which their calendar days
    /// and send windows are reckoned (default `UTC`).
    #[serde(with = "zone_name")]
    pub default_timezone: Tz,
    /// Larger job bodies, in bytes, are dead-lettered as `malformed` (default
    /// 262144; at least 1).
    pub max_body_bytes: usize,
    /// On SIGTERM or SIGINT the worker stops consuming and gives the jobs in flight
    /// at most this long to finish (default `20s`).
    pub shutdown_grace: Dur,
    /// Threads of the async runtime that runs `quota-worker run` (default 1:
    /// everything on the main thread; at least 1).
    pub threads: usize,
}

impl WorkerSettings {
    /// Check the numbers parsing alone cannot.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_body_bytes == 0 {
            return Err(invalid("worker.max_body_bytes", "must be at least 1"));
        }
        if self.threads == 0 {
            return Err(invalid("worker.threads", "must be at least 1"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    #[test]
    fn at_least_one_byte_and_one_thread() {
        let mut w = Settings::defaults().worker;
        assert!(w.validate().is_ok());
        w.threads = 0;
        assert_eq!(w.validate().unwrap_err().key(), Some("worker.threads"));
        w.max_body_bytes = 0;
        assert_eq!(
            w.validate().unwrap_err().key(),
            Some("worker.max_body_bytes")
        );
    }
}
