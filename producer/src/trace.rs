//! The caller's trace context on what the producer publishes: with the
//! `opentelemetry` feature, a job or feedback published while a span is current
//! carries W3C `traceparent` and `tracestate` headers (long strings), so the
//! worker's spans continue the caller's trace. Without the feature, nothing.

use lapin::BasicProperties;

/// `props` with the current OpenTelemetry context's `traceparent` and
/// `tracestate` headers (as they are without a current, valid span).
#[cfg(feature = "opentelemetry")]
pub fn with_current_context(props: BasicProperties) -> BasicProperties {
    use lapin::types::{AMQPValue, LongString};
    use opentelemetry::trace::{TraceContextExt, TraceFlags};
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let sc = span.span_context();
    if !sc.is_valid() {
        return props;
    }
    let mut headers = props.headers().clone().unwrap_or_default();
    let flags = (sc.trace_flags() & TraceFlags::SAMPLED).to_u8();
    let parent = format!("00-{}-{}-{flags:02x}", sc.trace_id(), sc.span_id());
    headers.insert(
        "traceparent".into(),
        AMQPValue::LongString(LongString::from(parent)),
    );
    let state = sc.trace_state().header();
    if !state.is_empty() {
        headers.insert(
            "tracestate".into(),
            AMQPValue::LongString(LongString::from(state)),
        );
    }
    props.with_headers(headers)
}

/// `props` as they are (the `opentelemetry` feature is off).
#[cfg(not(feature = "opentelemetry"))]
pub fn with_current_context(props: BasicProperties) -> BasicProperties {
    props
}

#[cfg(all(test, feature = "opentelemetry"))]
mod tests {
    use super::*;
    use lapin::types::AMQPValue;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };

    #[test]
    fn a_current_span_is_carried_and_none_adds_nothing() {
        assert!(with_current_context(BasicProperties::default())
            .headers()
            .is_none());
        let sc = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::SAMPLED,
            true,
            TraceState::from_key_value([("k", "v")]).unwrap(),
        );
        let _guard = opentelemetry::Context::current()
            .with_remote_span_context(sc)
            .attach();
        let props = with_current_context(BasicProperties::default());
        let h = props.headers().as_ref().unwrap().inner();
        assert!(
            matches!(h.get("traceparent"), Some(AMQPValue::LongString(s))
            if s.as_bytes() == b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
        );
        assert!(
            matches!(h.get("tracestate"), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"k=v")
        );
    }
}
