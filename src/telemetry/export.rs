//! Getting spans out: what the settings and the standard `OTEL_*` variables say
//! ([`Exporting::resolve`], pure), and a bounded queue in front of the OTLP/HTTP
//! exporter ([`Queue`]): a span that finds the queue full is dropped and counted,
//! never waited for, so a dead or slow collector never holds a job.

use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Sampler, Span, SpanData, SpanExporter as _, SpanProcessor};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, oneshot};

use crate::config::{TelemetrySettings, SAMPLERS};

/// Where and how spans are exported, the settings and the environment merged.
#[derive(Debug, Clone, PartialEq)]
pub struct Exporting {
    /// The URL spans are posted to.
    pub url: String,
    /// Headers sent with each export.
    pub headers: Vec<(String, String)>,
    /// The `service.name`.
    pub service_name: String,
    /// The sampler's name and ratio.
    pub sampler: (String, f64),
}

impl Exporting {
    /// What `settings` and the variables `var` looks up say; `None`: tracing is off
    /// (no endpoint, or `OTEL_SDK_DISABLED=true`). A variable that is set wins over
    /// its key; an unknown sampler or a bad ratio in a variable is an error.
    pub fn resolve(
        settings: &TelemetrySettings,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Exporting>, String> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let url = match var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| Some(settings.traces_endpoint.clone()).filter(|s| !s.is_empty()))
        {
            Some(url) => url,
            None => match var("OTEL_EXPORTER_OTLP_ENDPOINT")
                .or_else(|| Some(settings.endpoint.clone()).filter(|s| !s.is_empty()))
            {
                Some(base) => format!("{}/v1/traces", base.trim_end_matches('/')),
                None => return Ok(None),
            },
        };
        if !url.starts_with("http://") {
            return Err(format!(
                "the traces endpoint `{url}` is not http://: the exporter speaks plain HTTP (run a collector beside the worker)"
            ));
        }
        let headers = var("OTEL_EXPORTER_OTLP_HEADERS").unwrap_or_else(|| settings.headers.clone());
        let headers = headers
            .split(',')
            .filter(|kv| !kv.trim().is_empty())
            .map(|kv| match kv.split_once('=') {
                Some((k, v)) => Ok((k.trim().to_string(), v.trim().to_string())),
                None => Err("OTLP headers are written key=value,key=value".to_string()),
            })
            .collect::<Result<_, _>>()?;
        let sampler = var("OTEL_TRACES_SAMPLER").unwrap_or_else(|| settings.sampler.clone());
        if !SAMPLERS.contains(&sampler.as_str()) {
            return Err(format!(
                "OTEL_TRACES_SAMPLER `{sampler}`: one of {}",
                SAMPLERS.join(", ")
            ));
        }
        let ratio = match var("OTEL_TRACES_SAMPLER_ARG") {
            Some(v) => v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|r| (0.0..=1.0).contains(r))
                .ok_or_else(|| format!("OTEL_TRACES_SAMPLER_ARG `{v}`: a number from 0 to 1"))?,
            None => settings.sampler_arg,
        };
        Ok(Some(Exporting {
            url,
            headers,
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| settings.service_name.clone()),
            sampler: (sampler, ratio),
        }))
    }

    /// The SDK's sampler for [`Exporting::sampler`].
    pub fn sampler(&self) -> Sampler {
        let (name, ratio) = (&self.sampler.0, self.sampler.1);
        let root = |name: &str| match name {
            "always_off" => Sampler::AlwaysOff,
            "traceidratio" => Sampler::TraceIdRatioBased(ratio),
            _ => Sampler::AlwaysOn,
        };
        match name.strip_prefix("parentbased_") {
            Some(inner) => Sampler::ParentBased(Box::new(root(inner))),
            None => root(name),
        }
    }

    /// The OTLP/HTTP exporter (protobuf, over hyper).
    pub fn exporter(&self, timeout: Duration) -> Result<SpanExporter, String> {
        SpanExporter::builder()
            .with_http()
            .with_endpoint(self.url.clone())
            .with_timeout(timeout)
            .with_headers(self.headers.iter().cloned().collect())
            .build()
            .map_err(|e| format!("building the OTLP exporter: {e}"))
    }
}

/// The bounded queue in front of the exporter: the SDK hands it each ended,
/// sampled span.
#[derive(Debug, Clone)]
pub struct Queue {
    spans: mpsc::Sender<SpanData>,
    flushes: mpsc::Sender<oneshot::Sender<()>>,
}

impl Queue {
    /// A queue of `settings.max_queue_size` spans, and its export loop spawned on
    /// the current runtime, posting what `exporter` is given in batches.
    pub fn start(
        settings: &TelemetrySettings,
        mut exporter: SpanExporter,
        resource: &Resource,
    ) -> Queue {
        exporter.set_resource(resource);
        let (spans, rx) = mpsc::channel(settings.max_queue_size);
        let (flushes, flush_rx) = mpsc::channel(1);
        let batch = settings.max_export_batch_size;
        let every = settings.export_interval.0;
        let timeout = settings.export_timeout.0;
        tokio::spawn(export_loop(exporter, rx, flush_rx, batch, every, timeout));
        Queue { spans, flushes }
    }

    /// Export what is queued; waits for it at most `within`.
    pub async fn flush(&self, within: Duration) {
        let (done, wait) = oneshot::channel();
        if self.flushes.try_send(done).is_ok() {
            let _ = tokio::time::timeout(within, wait).await;
        }
    }
}

fn dropped(n: usize) {
    metrics::counter!(crate::metrics::TRACE_SPANS_DROPPED_TOTAL).increment(n as u64);
}

async fn export_loop(
    exporter: SpanExporter,
    mut rx: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
    batch: usize,
    every: Duration,
    timeout: Duration,
) {
    let mut buf = Vec::with_capacity(batch);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // gather until a batch is full, the tick, or a flush
        let mut flushed = None;
        let room = batch - buf.len();
        tokio::select! {
            n = rx.recv_many(&mut buf, room) => {
                if n == 0 {
                    break;
                }
                if buf.len() < batch {
                    continue;
                }
            }
            _ = tick.tick() => {}
            f = flushes.recv() => flushed = f,
        }
        if flushed.is_some() {
            while let Ok(s) = rx.try_recv() {
                buf.push(s);
            }
        }
        while !buf.is_empty() {
            let rest = buf.split_off(batch.min(buf.len()));
            let spans = std::mem::replace(&mut buf, rest);
            let n = spans.len();
            match tokio::time::timeout(timeout, exporter.export(spans)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, spans = n, "trace export failed; spans dropped");
                    dropped(n);
                }
                Err(_) => {
                    tracing::debug!(spans = n, "trace export timed out; spans dropped");
                    dropped(n);
                }
            }
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            dropped(1);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> TelemetrySettings {
        crate::config::Settings::defaults().telemetry
    }

    #[test]
    fn off_without_an_endpoint_or_when_disabled() {
        assert_eq!(Exporting::resolve(&settings(), |_| None), Ok(None));
        let vars = |n: &str| match n {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://c:4318".into()),
            "OTEL_SDK_DISABLED" => Some("true".into()),
            _ => None,
        };
        assert_eq!(Exporting::resolve(&settings(), vars), Ok(None));
    }

    #[test]
    fn the_variables_win_over_the_keys() {
        let mut s = settings();
        s.endpoint = "http://file:4318/".into();
        let e = Exporting::resolve(&s, |_| None).unwrap().unwrap();
        assert_eq!(e.url, "http://file:4318/v1/traces");
        assert_eq!(e.service_name, "quota-worker");
        let vars = |n: &str| match n {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://env:4318".into()),
            "OTEL_EXPORTER_OTLP_HEADERS" => Some("a=1, b = 2".into()),
            "OTEL_SERVICE_NAME" => Some("w".into()),
            "OTEL_TRACES_SAMPLER" => Some("parentbased_traceidratio".into()),
            "OTEL_TRACES_SAMPLER_ARG" => Some("0.01".into()),
            _ => None,
        };
        let e = Exporting::resolve(&s, vars).unwrap().unwrap();
        assert_eq!(e.url, "http://env:4318/v1/traces");
        assert_eq!(
            e.headers,
            vec![("a".into(), "1".into()), ("b".into(), "2".into())]
        );
        assert_eq!(e.service_name, "w");
        assert_eq!(e.sampler, ("parentbased_traceidratio".into(), 0.01));
        let vars = |n: &str| {
            (n == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").then(|| "http://t:1/x".to_string())
        };
        assert_eq!(
            Exporting::resolve(&s, vars).unwrap().unwrap().url,
            "http://t:1/x"
        );
    }

    #[test]
    fn bad_values_are_refused() {
        let mut s = settings();
        s.endpoint = "https://c:4318".into();
        assert!(Exporting::resolve(&s, |_| None).is_err());
        s.endpoint = "http://c:4318".into();
        let bad = |n: &str| (n == "OTEL_TRACES_SAMPLER_ARG").then(|| "2".to_string());
        assert!(Exporting::resolve(&s, bad).is_err());
    }
}
