//! W3C trace context in AMQP headers: `traceparent` and `tracestate` as long
//! strings, read from a delivery and written on each published copy. Pure.

use lapin::types::{AMQPValue, FieldTable, LongString};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::Context;
use opentelemetry_sdk::propagation::TraceContextPropagator;

/// The header naming the trace and the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The header with vendors' trace state.
pub const TRACESTATE: &str = "tracestate";

/// Whether `headers` carry a `traceparent` (one map lookup: the cheap check).
pub fn carries(headers: Option<&FieldTable>) -> bool {
    headers.is_some_and(|h| h.inner().contains_key(TRACEPARENT))
}

struct Reader<'a>(&'a FieldTable);

impl Extractor for Reader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match self.0.inner().get(key)? {
            AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok(),
            AMQPValue::ShortString(s) => Some(s.as_str()),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0.inner().keys().map(|k| k.as_str()).collect()
    }
}

struct Writer<'a>(&'a mut FieldTable);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0
            .insert(key.into(), AMQPValue::LongString(LongString::from(value)));
    }
}

/// The remote context `headers` carry (an empty context when they carry none or a
/// malformed one).
pub fn extract(headers: &FieldTable) -> Context {
    TraceContextPropagator::new().extract(&Reader(headers))
}

/// Write `cx`'s span context into `headers`, replacing what they carried (both
/// headers are written, `tracestate` empty when the context has none).
pub fn inject(cx: &Context, headers: &mut FieldTable) {
    TraceContextPropagator::new().inject_context(cx, &mut Writer(headers));
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TraceContextExt;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_goes_in_and_comes_out_as_a_long_string() {
        let mut h = FieldTable::default();
        h.insert(TRACEPARENT.into(), AMQPValue::LongString(PARENT.into()));
        h.insert(TRACESTATE.into(), AMQPValue::LongString("k=v".into()));
        assert!(carries(Some(&h)));
        let cx = extract(&h);
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && sc.is_sampled());
        assert_eq!(
            sc.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        let mut out = FieldTable::default();
        inject(&cx, &mut out);
        assert!(
            matches!(out.inner().get(TRACEPARENT), Some(AMQPValue::LongString(s)) if s.as_bytes() == PARENT.as_bytes())
        );
        assert!(
            matches!(out.inner().get(TRACESTATE), Some(AMQPValue::LongString(s)) if s.as_bytes() == b"k=v")
        );
    }

    #[test]
    fn no_or_a_bad_traceparent_is_no_context() {
        assert!(!carries(None));
        let mut h = FieldTable::default();
        h.insert(TRACEPARENT.into(), AMQPValue::LongString("nonsense".into()));
        assert!(!extract(&h).span().span_context().is_valid());
    }
}
