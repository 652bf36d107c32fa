//! One dead letter as an operator reads it ([`DeadLetterInfo`]): its job id, the
//! reason and detail the worker or the broker gave, when and how often it was
//! handled, and its properties and body as JSON; and which dead letters a command
//! selects ([`Selection`]). Pure: reads a delivery's properties and body.

use chrono::{DateTime, TimeZone, Utc};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use serde::Serialize;
use serde_json::{json, Value};

use crate::job::headers;

/// One dead letter, as an operator reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeadLetterInfo {
    /// The job id: the `message_id`, or else the body's `id` field.
    pub id: Option<String>,
    /// `x-notify-reason` (`malformed`, `unknown_channel`, `capped`, `expired`), or for a
    /// message the broker dead-lettered, the `x-death` reason (e.g. `delivery_limit`).
    pub reason: String,
    /// `x-notify-detail`, or a sentence built from `x-death`.
    pub detail: String,
    /// `worker` (published by the worker) or `broker` (dead-lettered by RabbitMQ).
    pub source: &'static str,
    /// When it was dead-lettered, when known.
    pub dead_at: Option<DateTime<Utc>>,
    /// Seconds since then.
    pub age_seconds: Option<i64>,
    /// Times the worker handled the job (`x-notify-attempt`).
    pub attempts: Option<i64>,
    /// When the worker first saw the job (`x-notify-first-seen`).
    pub first_seen: Option<DateTime<Utc>>,
    /// Body size in bytes.
    pub bytes: usize,
    /// Every header and property, for `show`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub properties: Option<Value>,
    /// The body (as JSON when it is JSON, else as text), for `show`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<Value>,
}

impl DeadLetterInfo {
    /// Read a dead letter's properties and body; `full` keeps headers and body.
    pub fn read(props: &BasicProperties, body: &[u8], now: DateTime<Utc>, full: bool) -> Self {
        let headers = props.headers().as_ref();
        let header = |name: &str| headers.and_then(|h| h.inner().get(name));
        // (a copy read from the dead-letter log, a stream, keeps the broker's
        // x-first-death-* headers but not its x-death table)
        let death = header("x-death")
            .and_then(first_death)
            .or_else(|| first_death_headers(&header));
        let (reason, detail, source) = match header(headers::REASON).and_then(headers::as_string) {
            Some(reason) => (
                reason,
                header(headers::DETAIL)
                    .and_then(headers::as_string)
                    .unwrap_or_default(),
                "worker",
            ),
            None => match &death {
                Some(d) => (
                    d.reason.clone(),
                    format!(
                        "dead-lettered by the broker from queue `{}` ({}, {} time(s))",
                        d.queue, d.reason, d.count
                    ),
                    "broker",
                ),
                None => (
                    "unknown".to_string(),
                    "no x-notify-reason and no x-death header".to_string(),
                    "unknown",
                ),
            },
        };
        let dead_at = props
            .timestamp()
            .and_then(|s| Utc.timestamp_opt(s as i64, 0).single())
            .or(death.as_ref().and_then(|d| d.time));
        let (attempt, first_seen) = headers::attempt_info(headers);
        DeadLetterInfo {
            id: props
                .message_id()
                .as_ref()
                .map(|s| s.as_str().to_string())
                .or_else(|| body_id(body)),
            reason,
            detail,
            source,
            dead_at,
            age_seconds: dead_at.map(|t| (now - t).num_seconds().max(0)),
            attempts: (attempt > 0).then_some(attempt as i64),
            first_seen: first_seen.and_then(|ms| Utc.timestamp_millis_opt(ms).single()),
            bytes: body.len(),
            properties: full.then(|| properties_json(props)),
            body: full.then(|| body_json(body)),
        }
    }
}

/// The `id` field of a JSON body, for messages published without a `message_id`.
fn body_id(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Id {
        id: String,
    }
    serde_json::from_slice::<Id>(body).ok().map(|b| b.id)
}

struct Death {
    reason: String,
    queue: String,
    count: i64,
    time: Option<DateTime<Utc>>,
}

/// The first death as the broker's `x-first-death-reason` and `-queue` headers
/// tell it (no count, no time).
fn first_death_headers<'h>(header: &impl Fn(&str) -> Option<&'h AMQPValue>) -> Option<Death> {
    Some(Death {
        reason: header("x-first-death-reason").and_then(headers::as_string)?,
        queue: header("x-first-death-queue")
            .and_then(headers::as_string)
            .unwrap_or_default(),
        count: 1,
        time: None,
    })
}

fn first_death(v: &AMQPValue) -> Option<Death> {
    let AMQPValue::FieldArray(deaths) = v else {
        return None;
    };
    let AMQPValue::FieldTable(t) = deaths.as_slice().first()? else {
        return None;
    };
    let get = |k: &str| t.inner().get(k);
    Some(Death {
        reason: get("reason")
            .and_then(headers::as_string)
            .unwrap_or_else(|| "unknown".into()),
        queue: get("queue")
            .and_then(headers::as_string)
            .unwrap_or_default(),
        count: get("count").and_then(headers::as_i64).unwrap_or(1),
        time: get("time")
            .and_then(headers::as_i64)
            .and_then(|s| Utc.timestamp_opt(s, 0).single()),
    })
}

/// An AMQP field value as JSON.
pub(crate) fn amqp_json(v: &AMQPValue) -> Value {
    match v {
        AMQPValue::Boolean(b) => json!(b),
        AMQPValue::ShortShortInt(x) => json!(x),
        AMQPValue::ShortShortUInt(x) => json!(x),
        AMQPValue::ShortInt(x) => json!(x),
        AMQPValue::ShortUInt(x) => json!(x),
        AMQPValue::LongInt(x) => json!(x),
        AMQPValue::LongUInt(x) => json!(x),
        AMQPValue::LongLongInt(x) => json!(x),
        AMQPValue::Float(x) => json!(x),
        AMQPValue::Double(x) => json!(x),
        AMQPValue::DecimalValue(d) => json!(format!("{}e-{}", d.value, d.scale)),
        AMQPValue::ShortString(s) => json!(s.as_str()),
        AMQPValue::LongString(s) => json!(String::from_utf8_lossy(s.as_bytes())),
        AMQPValue::FieldArray(a) => Value::Array(a.as_slice().iter().map(amqp_json).collect()),
        AMQPValue::Timestamp(t) => json!(Utc
            .timestamp_opt(*t as i64, 0)
            .single()
            .map(|t| t.to_rfc3339())
            .unwrap_or_else(|| t.to_string())),
        AMQPValue::FieldTable(t) => table_json(t),
        AMQPValue::ByteArray(b) => json!(String::from_utf8_lossy(b.as_slice())),
        AMQPValue::Void => Value::Null,
    }
}

fn table_json(t: &FieldTable) -> Value {
    Value::Object(
        t.inner()
            .iter()
            .map(|(k, v)| (k.as_str().to_string(), amqp_json(v)))
            .collect(),
    )
}

fn properties_json(p: &BasicProperties) -> Value {
    let s = |v: &Option<ShortString>| v.as_ref().map(|s| s.as_str().to_string());
    json!({
        "message_id": s(p.message_id()),
        "content_type": s(p.content_type()),
        "delivery_mode": p.delivery_mode(),
        "timestamp": p.timestamp(),
        "headers": p.headers().as_ref().map(table_json).unwrap_or(Value::Null),
    })
}

fn body_json(body: &[u8]) -> Value {
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => v,
        Err(_) => Value::String(String::from_utf8_lossy(body).into_owned()),
    }
}

/// The print of a dead letter: a hash of its body and of what the broker keeps
/// alike in the dead-letter queue and in the log (its id, timestamp, the worker's
/// reason, detail and attempt headers, the broker's first death), leaving out what
/// differs between the two copies or from one walk to the next (`x-death`,
/// `x-delivery-count`, `x-stream-offset`). Two dead letters with one print are
/// the same bytes with the same story: either stands for the other.
pub fn print(props: &BasicProperties, body: &[u8]) -> String {
    let headers = props.headers().as_ref();
    let text = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(headers::as_string)
    };
    let number = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(headers::as_i64)
    };
    let story = serde_json::json!([
        props.message_id().as_ref().map(|s| s.as_str()),
        props.timestamp(),
        text(headers::REASON),
        text(headers::DETAIL),
        number(headers::ATTEMPT),
        number(headers::FIRST_SEEN),
        text("x-first-death-reason"),
        text("x-first-death-queue"),
        text("x-first-death-exchange"),
    ]);
    let mut hasher = blake3::Hasher::new();
    hasher.update(story.to_string().as_bytes());
    hasher.update(&[0]);
    hasher.update(body);
    hasher.finalize().to_hex()[..32].to_string()
}

/// Which dead letters a command applies to. Empty lists match everything; given
/// lists must all match (a reason from `reasons` and an id from `ids`).
#[derive(Debug, Clone, Default)]
pub struct Selection {
    /// Reasons to match.
    pub reasons: Vec<String>,
    /// Job ids to match.
    pub ids: Vec<String>,
}

impl Selection {
    /// Whether `d` is selected.
    pub fn matches(&self, d: &DeadLetterInfo) -> bool {
        (self.reasons.is_empty() || self.reasons.contains(&d.reason))
            && (self.ids.is_empty() || d.id.as_ref().is_some_and(|id| self.ids.contains(id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(reason: &str, extra: Option<(&str, AMQPValue)>) -> BasicProperties {
        let mut h = FieldTable::default();
        h.insert(headers::REASON.into(), AMQPValue::LongString(reason.into()));
        if let Some((k, v)) = extra {
            h.insert(k.into(), v);
        }
        BasicProperties::default().with_headers(h)
    }

    #[test]
    fn a_print_ignores_what_the_broker_adds_per_copy_and_sees_the_rest() {
        let plain = print(&letter("capped", None), b"{}");
        let counted = letter("capped", Some(("x-delivery-count", AMQPValue::LongInt(3))));
        assert_eq!(print(&counted, b"{}"), plain);
        let offset = letter(
            "capped",
            Some(("x-stream-offset", AMQPValue::LongLongInt(9))),
        );
        assert_eq!(print(&offset, b"{}"), plain);
        assert_ne!(print(&letter("expired", None), b"{}"), plain);
        assert_ne!(print(&letter("capped", None), b"{ }"), plain);
        let short = letter(
            "capped",
            Some((headers::ATTEMPT, AMQPValue::ShortShortInt(2))),
        );
        let long = letter(
            "capped",
            Some((headers::ATTEMPT, AMQPValue::LongLongInt(2))),
        );
        assert_eq!(print(&short, b"{}"), print(&long, b"{}"));
    }
}
