//! The feedback sections: where senders publish what became of a dispatched job
//! and how a provider's throttling slows a channel (`[feedback]`), and how long a
//! bounce suppresses its recipient (`[suppression]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::text::Dur;

/// Feedback from the senders (`[feedback]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FeedbackSettings {
    /// The fanout exchange senders publish feedback to (default `notify.feedback`).
    pub exchange: String,
    /// The quorum queue the worker consumes feedback from (default
    /// `notify.feedback`); bad feedback goes to `amqp.dead_exchange` with reason
    /// `malformed_feedback`.
    pub queue: String,
    /// Feedback deliveries handled at once (default 32; at least 1).
    pub prefetch: u16,
    /// How long the same feedback (job id and event) is remembered, so that a
    /// second copy changes nothing (default `1h`; at least `1s`).
    pub dedupe_window: Dur,
    /// The pause of a `throttled` without `retry_after`: this long the first time,
    /// doubled at each further 429 within `throttle_max_backoff` of the last one
    /// (default `1s`).
    pub throttle_backoff: Dur,
    /// The longest pause a `throttled` causes, `retry_after` included (default `5m`).
    pub throttle_max_backoff: Dur,
    /// After a pause the channel's rate climbs linearly from a tenth of its
    /// configured rate back to all of it over this long (default `10s`; `0s`: at
    /// once).
    pub ramp: Dur,
}

/// Suppressions (`[suppression]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SuppressionSettings {
    /// How long a `bounced` suppresses its recipient on its channel (default
    /// `720h`, 30 days; at least `1s`). `complained` and `unsubscribed` hold until
    /// removed (`admin recipient R unsuppress --channel C`).
    pub bounced_ttl: Dur,
}

impl FeedbackSettings {
    /// Names set, and durations in range.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for (key, name) in [
            ("feedback.exchange", &self.exchange),
            ("feedback.queue", &self.queue),
        ] {
            if name.is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        if self.prefetch == 0 {
            return Err(invalid("feedback.prefetch", "must be at least 1"));
        }
        if self.dedupe_window.0 < Duration::from_secs(1) {
            return Err(invalid("feedback.dedupe_window", "must be at least 1s"));
        }
        if self.throttle_backoff.0 < Duration::from_millis(1) {
            return Err(invalid("feedback.throttle_backoff", "must be at least 1ms"));
        }
        if self.throttle_max_backoff.0 < self.throttle_backoff.0 {
            return Err(invalid(
                "feedback.throttle_max_backoff",
                "must be at least feedback.throttle_backoff",
            ));
        }
        Ok(())
    }
}

impl SuppressionSettings {
    /// A bounce suppresses for at least a second.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.bounced_ttl.0 < Duration::from_secs(1) {
            return Err(invalid("suppression.bounced_ttl", "must be at least 1s"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Dur, Settings};
    use std::time::Duration;

    #[test]
    fn defaults_and_refusals_name_their_key() {
        let s = Settings::defaults();
        assert_eq!(s.feedback.exchange, "notify.feedback");
        assert_eq!(s.feedback.queue, "notify.feedback");
        assert_eq!(
            s.suppression.bounced_ttl.0,
            Duration::from_secs(30 * 86_400)
        );
        let mut f = s.feedback.clone();
        f.throttle_max_backoff = Dur(Duration::from_millis(10));
        assert_eq!(
            f.validate().unwrap_err().key(),
            Some("feedback.throttle_max_backoff")
        );
        f.queue.clear();
        assert_eq!(f.validate().unwrap_err().key(), Some("feedback.queue"));
        let mut b = s.suppression.clone();
        b.bounced_ttl = Dur(Duration::ZERO);
        assert_eq!(
            b.validate().unwrap_err().key(),
            Some("suppression.bounced_ttl")
        );
    }
}
