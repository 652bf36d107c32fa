//! Traces: one per notification, from the producer through every handling of the
//! job to the sender and its feedback (docs/guide/tracing.md).
//!
//! Off unless an OTLP endpoint is configured ([`init`]); off, every hook here is one
//! load of a global and a branch: no span is built and no header is parsed. On, a
//! delivery's handling is a `process <queue>` span (kind CONSUMER) whose parent is
//! the `traceparent` the message carries (or linked to it, `telemetry.parent =
//! "link"`; a job without one starts its own trace), made current for the handling
//! ([`handling`]); the decision is set on it as `quota.*` attributes ([`job`],
//! [`delayed`], [`dead`], [`parked`], [`finish`]); every publish is a `send
//! <exchange>` span (kind PRODUCER) whose context the published copy carries
//! ([`send`]). No recipient is ever put on a span.
//!
//! The header format is [`carrier`]'s; getting spans out, bounded, is [`export`]'s.

use std::sync::OnceLock;
use std::time::Duration;

use chrono::{DateTime, Utc};
use lapin::types::FieldTable;
use lapin::BasicProperties;
use opentelemetry::trace::{Link, SpanKind, Status, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::{TelemetrySettings, TraceParent};
use crate::job::Outcome;

pub mod carrier;
pub mod export;

pub use opentelemetry::trace::FutureExt;

struct Telemetry {
    tracer: SdkTracer,
    // kept so the tracer's provider lives as long as the process
    _provider: SdkTracerProvider,
    queue: export::Queue,
    parent: TraceParent,
}

static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();

fn on() -> Option<&'static Telemetry> {
    TELEMETRY.get()
}

/// Whether spans are made (an endpoint is configured).
pub fn enabled() -> bool {
    on().is_some()
}

/// Start exporting as `settings` and the `OTEL_*` variables say, on the current
/// runtime; `Ok(false)`: tracing stays off (no endpoint, or `OTEL_SDK_DISABLED`).
pub fn init(settings: &TelemetrySettings) -> Result<bool, String> {
    let Some(exporting) = export::Exporting::resolve(settings, |n| std::env::var(n).ok())? else {
        return Ok(false);
    };
    let exporter = exporting.exporter(settings.export_timeout.0)?;
    // one instance id per process, so that a trace across workers tells them apart
    let resource = Resource::builder()
        .with_service_name(exporting.service_name.clone())
        .with_attribute(KeyValue::new(
            "service.instance.id",
            uuid::Uuid::now_v7().to_string(),
        ))
        .build();
    let queue = export::Queue::start(settings, exporter, &resource);
    let provider = SdkTracerProvider::builder()
        .with_span_processor(queue.clone())
        .with_sampler(exporting.sampler())
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("quota-worker");
    let t = Telemetry {
        tracer,
        _provider: provider,
        queue,
        parent: settings.parent,
    };
    if TELEMETRY.set(t).is_err() {
        return Err("tracing was started twice".into());
    }
    tracing::info!(endpoint = %exporting.url, sampler = %exporting.sampler.0, "exporting traces");
    Ok(true)
}

/// Export the spans still queued, waiting at most `within` (at shutdown).
pub async fn flush(within: Duration) {
    if let Some(t) = on() {
        t.queue.flush(within).await;
    }
}

fn messaging(operation: &'static str, destination: &str, routing_key: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("messaging.system", "rabbitmq"),
        KeyValue::new("messaging.operation.name", operation),
        KeyValue::new("messaging.operation.type", operation),
        KeyValue::new("messaging.destination.name", destination.to_string()),
        KeyValue::new(
            "messaging.rabbitmq.destination.routing_key",
            routing_key.to_string(),
        ),
    ]
}

/// The span of one handling of a delivery from `queue`, for the handling to run
/// in (`.with_context(cx)`); `None` while tracing is off. `always`: a delivery
/// without a `traceparent` starts a trace of its own (jobs); otherwise it gets no
/// span (feedback).
pub fn handling(
    headers: Option<&FieldTable>,
    queue: &str,
    routing_key: &str,
    always: bool,
) -> Option<Context> {
    let t = on()?;
    let carried = match headers {
        Some(h) if carrier::carries(Some(h)) => Some(carrier::extract(h)),
        _ if always => None,
        _ => return None,
    };
    let remote = carried
        .as_ref()
        .map(|cx| cx.span().span_context().clone())
        .filter(|sc| sc.is_valid());
    let builder = t
        .tracer
        .span_builder(format!("process {queue}"))
        .with_kind(SpanKind::Consumer)
        .with_attributes(messaging("process", queue, routing_key));
    let span = match (remote, t.parent) {
        (Some(sc), TraceParent::Link) => builder
            .with_links(vec![Link::with_context(sc)])
            .start_with_context(&t.tracer, &Context::new()),
        (Some(_), TraceParent::Child) => {
            builder.start_with_context(&t.tracer, carried.as_ref().expect("carried"))
        }
        (None, _) => builder.start_with_context(&t.tracer, &Context::new()),
    };
    Some(Context::current_with_span(span))
}

/// The trace and span ids of `cx`'s span, as hex (for log lines).
pub fn ids(cx: &Context) -> (String, String) {
    let span = cx.span();
    let sc = span.span_context();
    (sc.trace_id().to_string(), sc.span_id().to_string())
}

/// The trace id of the handling under way, for its note; `None` while tracing is off.
pub fn trace_id() -> Option<String> {
    on()?;
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

fn annotate(attributes: impl FnOnce() -> Vec<KeyValue>) {
    if on().is_some() {
        Context::map_current(|cx| cx.span().set_attributes(attributes()));
    }
}

/// The job the handling is about: its id, policy and attempt.
pub fn job(id: &str, policy: &str, attempt: u64) {
    annotate(|| {
        vec![
            KeyValue::new("messaging.message.id", id.to_string()),
            KeyValue::new("quota.policy", policy.to_string()),
            KeyValue::new("quota.attempt", attempt as i64),
        ]
    });
}

/// The handling delays the job until `until` because of `reason`, held by `held_by`.
pub fn delayed(reason: &str, held_by: &str, until: DateTime<Utc>) {
    annotate(|| {
        vec![
            KeyValue::new("quota.reason", reason.to_string()),
            KeyValue::new("quota.held_by", held_by.to_string()),
            KeyValue::new("quota.next_allowed_at", until.to_rfc3339()),
        ]
    });
}

/// The handling dead-letters the job with `reason`.
pub fn dead(reason: &str) {
    annotate(|| vec![KeyValue::new("quota.reason", reason.to_string())]);
}

/// The handling parks the job in `lane`.
pub fn parked(lane: &str) {
    annotate(|| vec![KeyValue::new("quota.lane", lane.to_string())]);
}

/// Feedback handled: its job's id and event.
pub fn feedback(id: &str, event: &str) {
    annotate(|| {
        vec![
            KeyValue::new("messaging.message.id", id.to_string()),
            KeyValue::new("quota.feedback", event.to_string()),
        ]
    });
}

/// End the handling's span with its outcome (`Err`: handed back to the broker).
pub fn finish<E: std::fmt::Display>(cx: &Context, result: Result<&Outcome, &E>) {
    let span = cx.span();
    match result {
        Ok(outcome) => {
            let (label, _) = Outcome::labels(outcome.kind());
            span.set_attribute(KeyValue::new("quota.outcome", label));
        }
        Err(e) => span.set_status(Status::error(e.to_string())),
    }
    span.end();
}

/// End a feedback handling's span (`Some`: handed back to the broker).
pub fn finish_feedback<E: std::fmt::Display>(cx: &Context, error: Option<&E>) {
    let span = cx.span();
    if let Some(e) = error {
        span.set_status(Status::error(e.to_string()));
    }
    span.end();
}

/// A publish's span: ended when dropped.
pub struct Sending(Option<Context>);

impl Sending {
    /// The publish failed.
    pub fn failed(&self, e: &dyn std::fmt::Display) {
        if let Some(cx) = &self.0 {
            cx.span().set_status(Status::error(e.to_string()));
        }
    }

    /// The publish is a step of a job's route: `quota.route.step` (1 is its own
    /// channel) and, from the second step on, `quota.fallback.cause` (why it left
    /// the one before, in the words of `on`).
    pub fn routed(&self, step: usize, cause: Option<&str>) {
        if let Some(cx) = &self.0 {
            let span = cx.span();
            span.set_attribute(KeyValue::new("quota.route.step", step as i64));
            if let Some(cause) = cause {
                span.set_attribute(KeyValue::new("quota.fallback.cause", cause.to_string()));
            }
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if let Some(cx) = &self.0 {
            cx.span().end();
        }
    }
}

/// A publish to `exchange` with `routing_key` of the message `id`: while tracing is
/// on, a `send <exchange>` span (child of the current handling) whose context
/// `props`' headers then carry; off, `props` as they are.
pub fn send(
    exchange: &str,
    routing_key: &str,
    id: Option<&str>,
    props: BasicProperties,
) -> (BasicProperties, Sending) {
    let Some(t) = on() else {
        return (props, Sending(None));
    };
    let exchange = if exchange.is_empty() {
        "amq.default"
    } else {
        exchange
    };
    let mut attributes = messaging("send", exchange, routing_key);
    if let Some(id) = id {
        attributes.push(KeyValue::new("messaging.message.id", id.to_string()));
    }
    let parent = Context::current();
    let span = t
        .tracer
        .span_builder(format!("send {exchange}"))
        .with_kind(SpanKind::Producer)
        .with_attributes(attributes)
        .start_with_context(&t.tracer, &parent);
    let cx = parent.with_span(span);
    let mut headers = props.headers().clone().unwrap_or_default();
    carrier::inject(&cx, &mut headers);
    (props.with_headers(headers), Sending(Some(cx)))
}
