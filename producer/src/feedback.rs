//! Feedback: what a sender tells the worker about a dispatched job (the contract
//! of `notify.feedback`), its decoder (the worker's own), and a publisher with
//! confirms for senders written in Rust.

use std::time::Duration;

use lapin::types::ShortString;
use lapin::{BasicProperties, Connection};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::publisher::{PublishError, Publisher};

/// What became of a dispatched job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Event {
    /// The provider accepted or delivered it.
    Delivered,
    /// The send failed (the provider's 5xx, a timeout): given back to the caps.
    Failed,
    /// The provider answered 429: the channel pauses for every worker.
    Throttled,
    /// The address bounced: suppressed for `suppression.bounced_ttl`.
    Bounced,
    /// The recipient complained: suppressed until removed.
    Complained,
    /// The recipient opted out: suppressed until removed.
    Unsubscribed,
    /// The recipient opened or saw it (answers a step whose policy escalates on
    /// `answered_by = "read"`, and any step that a delivery answers).
    Read,
}

impl Event {
    /// Every event.
    pub const ALL: [Event; 7] = [
        Event::Delivered,
        Event::Failed,
        Event::Throttled,
        Event::Bounced,
        Event::Complained,
        Event::Unsubscribed,
        Event::Read,
    ];

    /// Its word in the JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Delivered => "delivered",
            Event::Failed => "failed",
            Event::Throttled => "throttled",
            Event::Bounced => "bounced",
            Event::Complained => "complained",
            Event::Unsubscribed => "unsubscribed",
            Event::Read => "read",
        }
    }
}

/// One feedback, as published to `notify.feedback`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Feedback {
    /// The job's id (required).
    pub id: String,
    /// What became of it (required).
    pub event: Event,
    /// The job's recipient (required).
    pub recipient: String,
    /// The job's channel (required; a configured one).
    pub channel: String,
    /// The job's tenant, when jobs carry one.
    #[serde(default)]
    pub tenant: Option<String>,
    /// For `throttled`: seconds the provider asked to wait.
    #[serde(default)]
    pub retry_after: Option<f64>,
    /// For `throttled`: the job's sender (its `sender` field). The pause then holds
    /// only that sender's buckets of the limits counted per sender on the channel
    /// (or of `limit`, when named), and every other sender goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// For `throttled`: the limit (`[limits.NAME]`) whose bucket the provider
    /// throttled: only that bucket pauses (of the job's `sender` or `tenant` when
    /// the limit counts per sender or tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<String>,
    /// Free text for people (the provider's answer).
    #[serde(default)]
    pub detail: Option<String>,
}

impl Feedback {
    /// Feedback `event` about job `id` sent to `recipient` on `channel`.
    pub fn new(id: &str, event: Event, recipient: &str, channel: &str) -> Feedback {
        Feedback {
            id: id.to_string(),
            event,
            recipient: recipient.to_string(),
            channel: channel.to_string(),
            tenant: None,
            retry_after: None,
            sender: None,
            limit: None,
            detail: None,
        }
    }
}

/// The feedback's JSON Schema (draft 2020-12), as `schema/feedback.schema.json`
/// holds it. The worker's decoder ([`decode_feedback`]) also refuses an empty `id`
/// or `recipient`, an unconfigured channel and a negative `retry_after`.
pub fn feedback_schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Feedback)).expect("a schema is JSON")
}

/// Decode a feedback body as the worker does: JSON with the required fields, a
/// known event, one of `channels` (when given), a finite `retry_after` of at
/// least 0. The error says what is wrong (the dead letter's detail).
pub fn decode_feedback(body: &[u8], channels: Option<&[String]>) -> Result<Feedback, String> {
    let f: Feedback = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if f.id.is_empty() {
        return Err("`id` is empty".into());
    }
    if f.recipient.is_empty() {
        return Err("`recipient` is empty".into());
    }
    if let Some(channels) = channels {
        if !channels.contains(&f.channel) {
            return Err(format!("channel `{}` is not configured", f.channel));
        }
    }
    if let Some(r) = f.retry_after {
        if !r.is_finite() || r < 0.0 {
            return Err(format!("`retry_after` {r} is not a number of seconds"));
        }
    }
    Ok(f)
}

/// Publishes feedback to the feedback exchange with confirms.
#[derive(Debug)]
pub struct FeedbackPublisher {
    publisher: Publisher,
    exchange: String,
}

impl FeedbackPublisher {
    /// Publish on `conn` to `exchange` (`notify.feedback`), waiting `timeout` at
    /// most for each confirm.
    pub async fn open(
        conn: &Connection,
        exchange: &str,
        timeout: Duration,
    ) -> Result<FeedbackPublisher, lapin::Error> {
        Ok(FeedbackPublisher {
            publisher: Publisher::open(conn, timeout).await?,
            exchange: exchange.to_string(),
        })
    }

    /// Publish one feedback and wait for the broker's confirm.
    pub async fn publish(&self, feedback: &Feedback) -> Result<(), PublishError> {
        let body = serde_json::to_vec(feedback).expect("feedback serializes");
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_delivery_mode(2)
            .with_message_id(ShortString::from(feedback.id.as_str()));
        let props = crate::trace::with_current_context(props);
        self.publisher
            .publish(&self.exchange, "", &body, props)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_contract_decodes_and_bad_feedback_says_why() {
        let channels = vec!["sms".to_string()];
        let ok =
            br#"{ "id": "order-4711-shipped", "event": "failed", "recipient": "+8613800000000",
            "channel": "sms", "tenant": null, "retry_after": null, "detail": "provider 503" }"#;
        let f = decode_feedback(ok, Some(&channels)).unwrap();
        assert_eq!(f.event, Event::Failed);
        assert_eq!(f.detail.as_deref(), Some("provider 503"));
        let minimal =
            br#"{"id":"a","event":"throttled","recipient":"r","channel":"sms","retry_after":5}"#;
        assert_eq!(
            decode_feedback(minimal, Some(&channels))
                .unwrap()
                .retry_after,
            Some(5.0)
        );
        for bad in [
            &b"not json"[..],
            br#"{"id":"a","event":"opened","recipient":"r","channel":"sms"}"#,
            br#"{"id":"a","event":"failed","channel":"sms"}"#,
            br#"{"id":"a","event":"failed","recipient":"r","channel":"fax"}"#,
            br#"{"id":"","event":"failed","recipient":"r","channel":"sms"}"#,
            br#"{"id":"a","event":"throttled","recipient":"r","channel":"sms","retry_after":-1}"#,
        ] {
            assert!(decode_feedback(bad, Some(&channels)).is_err());
        }
        let json = serde_json::to_string(&Feedback::new("a", Event::Bounced, "r", "sms")).unwrap();
        assert!(json.contains(r#""event":"bounced""#), "{json}");
    }
}
