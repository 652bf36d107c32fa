//! The tracing section (`[telemetry]`): where the worker exports its spans (OTLP
//! over HTTP/protobuf), how it samples, and how a job's `process` span relates to the
//! context its message carries. The standard `OTEL_*` variables say the same and
//! win over the file (see [`crate::telemetry::Exporting::resolve`]).

use serde::{Deserialize, Serialize, Serializer};

use super::error::{invalid, ConfigError};
use super::text::Dur;
use super::REDACTED;

/// How a job's `process` span relates to the context its message carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceParent {
    /// The span is a child of the carried context: one trace from the producer to
    /// the sender.
    Child,
    /// The span starts a trace of its own, linked to the carried context.
    Link,
}

/// Trace export settings (`[telemetry]`). Off while no endpoint is set.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySettings {
    /// The OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (spans go to its
    /// `/v1/traces`); `OTEL_EXPORTER_OTLP_ENDPOINT` wins over it. Empty (the
    /// default): no spans, and nothing read from messages beyond a header lookup.
    /// `http://` only: the exporter speaks no TLS (run a collector beside the worker).
    pub endpoint: String,
    /// The full URL spans are posted to, instead of `endpoint` + `/v1/traces`
    /// (default empty); `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` wins over it.
    pub traces_endpoint: String,
    /// Headers sent with each export, `key=value,key=value` (default empty);
    /// `OTEL_EXPORTER_OTLP_HEADERS` wins over it. Printed as [`REDACTED`] (they
    /// often carry a token).
    #[serde(serialize_with = "redacted_headers")]
    pub headers: String,
    /// The `service.name` of the spans (default `quota-worker`); `OTEL_SERVICE_NAME`
    /// wins over it.
    pub service_name: String,
    /// The sampler, as `OTEL_TRACES_SAMPLER` names them (default
    /// `parentbased_always_on`; also `always_on`, `always_off`,
    /// `traceidratio`, `parentbased_always_off`, `parentbased_traceidratio`);
    /// `OTEL_TRACES_SAMPLER` wins over it.
    pub sampler: String,
    /// The ratio of the `traceidratio` samplers, 0 to 1 (default 1);
    /// `OTEL_TRACES_SAMPLER_ARG` wins over it.
    pub sampler_arg: f64,
    /// `"child"` (the default): a job's `process` span is a child of the
    /// `traceparent` it carries; `"link"`: it starts a new trace linked to it.
    pub parent: TraceParent,
    /// Spans waiting for export at most (default 2048); beyond it a span is dropped
    /// and counted (`quota_worker_trace_spans_dropped_total`), so a dead or slow
    /// collector never holds a job.
    pub max_queue_size: usize,
    /// Spans per export request at most (default 512).
    pub max_export_batch_size: usize,
    /// How often the queued spans are exported (default `1s`).
    pub export_interval: Dur,
    /// How long one export may take before it is given up (default `10s`).
    pub export_timeout: Dur,
}

fn redacted_headers<S: Serializer>(h: &str, s: S) -> Result<S::Ok, S::Error> {
    if h.is_empty() {
        s.serialize_str("")
    } else {
        s.serialize_str(REDACTED)
    }
}

impl TelemetrySettings {
    /// Sizes of at least one, a ratio between 0 and 1, a known sampler, `http://`
    /// endpoints.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.max_queue_size == 0 {
            return Err(invalid("telemetry.max_queue_size", "must be at least 1"));
        }
        if self.max_export_batch_size == 0 {
            return Err(invalid(
                "telemetry.max_export_batch_size",
                "must be at least 1",
            ));
        }
        if !(0.0..=1.0).contains(&self.sampler_arg) {
            return Err(invalid("telemetry.sampler_arg", "must be between 0 and 1"));
        }
        if !SAMPLERS.contains(&self.sampler.as_str()) {
            return Err(invalid(
                "telemetry.sampler",
                format!("`{}`: one of {}", self.sampler, SAMPLERS.join(", ")),
            ));
        }
        for (key, url) in [
            ("telemetry.endpoint", &self.endpoint),
            ("telemetry.traces_endpoint", &self.traces_endpoint),
        ] {
            if !url.is_empty() && !url.starts_with("http://") {
                return Err(invalid(
                    key,
                    format!("`{url}`: http:// only (the exporter speaks no TLS; run a collector beside the worker)"),
                ));
            }
        }
        if self.export_interval.0.is_zero() {
            return Err(invalid("telemetry.export_interval", "must be more than 0s"));
        }
        Ok(())
    }
}

/// The samplers `telemetry.sampler` and `OTEL_TRACES_SAMPLER` may name.
pub const SAMPLERS: &[&str] = &[
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
];

#[cfg(test)]
mod tests {
    use crate::config::Settings;

    #[test]
    fn endpoints_are_plain_http_and_samplers_known() {
        let load = |vars: &[(&str, &str)]| {
            Settings::load_from_vars(
                None,
                vars.iter().map(|(k, v)| (k.to_string(), v.to_string())),
            )
        };
        let ok = load(&[("QUOTA_WORKER__TELEMETRY__ENDPOINT", "http://c:4318")]).unwrap();
        assert_eq!(ok.telemetry.endpoint, "http://c:4318");
        let err = load(&[("QUOTA_WORKER__TELEMETRY__ENDPOINT", "https://c:4318")]).unwrap_err();
        assert!(err.to_string().contains("telemetry.endpoint"), "{err}");
        let err = load(&[("QUOTA_WORKER__TELEMETRY__SAMPLER", "sometimes")]).unwrap_err();
        assert!(err.to_string().contains("telemetry.sampler"), "{err}");
        let err = load(&[("QUOTA_WORKER__TELEMETRY__PARENT", "sibling")]).unwrap_err();
        assert!(err.to_string().contains("telemetry.parent"), "{err}");
    }
}
