//! The console section (`[console]`): the operators' pages under `/console` on
//! `http.listen` ([`crate::console`]): how long a login lasts, where a job's trace
//! is shown, and how many dead letters the browsable index keeps.

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::text::Dur;

/// Console settings (`[console]`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleSettings {
    /// Whether `/console` is served (default true; only when `http.enabled`).
    pub enabled: bool,
    /// How long a login lasts (default `8h`): the session cookie's `Max-Age`, and
    /// the session is forgotten by the worker after it.
    pub session_ttl: Dur,
    /// A job's trace as a link: the URL with `{trace_id}` in it, e.g.
    /// `https://jaeger.example/trace/{trace_id}`. Empty (the default): the trace id is
    /// shown as text.
    pub trace_url: String,
    /// Dead letters the browsable index in Redis keeps at most (default 10000), the
    /// oldest dropped beyond it: the broker copies every dead letter to the stream
    /// `<amqp.dead_queue>.log`, and the console catches the index up from it when
    /// someone looks. The console's dead-letter pages read the index, never the
    /// queue. 0: no stream and no index (the console's dead-letter pages are empty).
    pub dead_index: u32,
    /// How long the dead-letter log (the stream `<amqp.dead_queue>.log`) keeps a
    /// dead letter (`x-max-age`), default `168h` (7 days), at least `1h`. A stream
    /// cannot drop one entry (an erase cannot reach it): this is its bound. Applied
    /// when the stream is declared; one declared with another keeps its own, and
    /// the worker says so at start.
    pub dead_log_max_age: Dur,
}

impl ConsoleSettings {
    /// A session of at least a second; a trace URL with its `{trace_id}`.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.dead_log_max_age.0 < std::time::Duration::from_secs(3600) {
            return Err(invalid("console.dead_log_max_age", "must be at least 1h"));
        }
        if self.session_ttl.0 < std::time::Duration::from_secs(1) {
            return Err(invalid("console.session_ttl", "must be at least 1s"));
        }
        if !self.trace_url.is_empty() && !self.trace_url.contains("{trace_id}") {
            return Err(invalid(
                "console.trace_url",
                format!("`{}` has no `{{trace_id}}` to fill in", self.trace_url),
            ));
        }
        Ok(())
    }

    /// The trace link of `trace_id`, when `trace_url` is set.
    pub fn trace_link(&self, trace_id: &str) -> Option<String> {
        (!self.trace_url.is_empty()).then(|| self.trace_url.replace("{trace_id}", trace_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn console(ttl: u64, url: &str) -> ConsoleSettings {
        ConsoleSettings {
            enabled: true,
            session_ttl: Dur(std::time::Duration::from_secs(ttl)),
            trace_url: url.into(),
            dead_index: 10,
            dead_log_max_age: Dur(std::time::Duration::from_secs(3600)),
        }
    }

    #[test]
    fn a_session_lasts_a_second_at_least_and_a_trace_url_names_the_trace() {
        assert!(console(1, "").validate().is_ok());
        assert_eq!(
            console(0, "").validate().unwrap_err().key(),
            Some("console.session_ttl")
        );
        let bad = console(60, "https://jaeger.example/trace/").validate();
        assert_eq!(bad.unwrap_err().key(), Some("console.trace_url"));
        let c = console(60, "https://j.example/trace/{trace_id}?x=1");
        assert!(c.validate().is_ok());
        assert_eq!(
            c.trace_link("ab12").as_deref(),
            Some("https://j.example/trace/ab12?x=1")
        );
        assert_eq!(console(60, "").trace_link("ab12"), None);
    }
}
