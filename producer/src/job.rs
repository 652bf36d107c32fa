//! The job as the contract defines it: a struct to build and publish, and the JSON
//! Schema generated from it.

use std::fmt;

use chrono::{DateTime, Utc};
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::priority::Priority;

/// A notification job, as the contract defines it (see the README).
///
/// Unknown fields are kept in [`Job::extra`] and published as they are, so a
/// producer may carry fields the worker does not know yet.
///
/// Its JSON Schema ([`schema`], checked in as `schema/job.schema.json`) is generated
/// from this type; on the wire the `id` is required (a producer fills it in).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(
    title = "quota-worker job",
    description = "An outgoing-notification job, published as JSON (content_type application/json, message_id = id) to the jobs exchange. Unknown fields are kept and passed through.",
    transform = id_required
)]
pub struct Job {
    /// The idempotency key (1 to 128 characters, at most 255 bytes in UTF-8, the
    /// AMQP message id's limit); `None`: a UUIDv7 is generated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        with = "String",
        length(min = 1, max = 128),
        description = "The idempotency key: a second job with this id is a duplicate (1 to 128 characters, at most 255 bytes in UTF-8, the AMQP message id's limit)."
    )]
    pub id: Option<String>,
    /// Opaque recipient: an email, a phone number, a user id (1 to 256 characters).
    /// Hashed before it reaches Redis, never logged.
    #[schemars(length(min = 1, max = 256))]
    pub recipient: String,
    /// The channel: selects the send rate and the dispatch queue (one the worker
    /// is configured with).
    #[schemars(length(min = 1, max = 64))]
    pub channel: String,
    /// Selects the quota policy; absent or null: `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub category: Option<String>,
    /// IANA zone of the recipient, for calendar windows and send windows; absent or
    /// null: the worker's `default_timezone`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "timezone_schema")]
    pub timezone: Option<String>,
    /// Never deliver after this instant (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub expires_at: Option<DateTime<Utc>>,
    /// Never deliver before this instant (RFC 3339): a scheduled send.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<String>", extend("format" = "date-time"))]
    pub not_before: Option<DateTime<Utc>>,
    /// While a job of the same recipient with this key waits, a newer one replaces
    /// it: only the newest is sent (1 to 128 characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub collapse_key: Option<String>,
    /// The lane the job waits in when its channel's rate makes it wait: `urgent`
    /// jobs take the next send slots, then `normal`, then `bulk`; absent or null:
    /// its policy's (`normal` unless the policy says otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
    /// The tenant the recipient belongs to (1 to 64 characters): the same recipient
    /// under two tenants is counted as two, and the tenant's overrides of policies
    /// and caps apply; absent or null: no tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub tenant: Option<String>,
    /// Jobs of a policy with a digest are folded into one message per recipient,
    /// channel and this key (1 to 128 characters); absent or null: per category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub digest_key: Option<String>,
    /// Further channels, in order (1 to 4, none repeated, not `channel`): when its
    /// channel refuses it (capped, opted out, suppressed) or its send fails, it
    /// moves on to the next; absent or null: its channel alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4), extend("uniqueItems" = true))]
    pub fallback: Option<Vec<String>>,
    /// Who sends it (1 to 128 characters: the from-number, the sending domain, the
    /// push app): limits with `per = "sender"` keep a bucket per sender; absent or
    /// null: no sender.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub sender: Option<String>,
    /// What it takes of its channel's limits (1 to 100, e.g. the segments of a
    /// long SMS); absent or null: its channel's `cost`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub cost: Option<u8>,
    /// Anything: the worker passes the body through untouched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<Value>,
    /// Fields the contract does not name, published as they are.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Job {
    /// A job for `recipient` on `channel`, everything else unset.
    pub fn new(recipient: impl Into<String>, channel: impl Into<String>) -> Job {
        Job {
            id: None,
            recipient: recipient.into(),
            channel: channel.into(),
            category: None,
            timezone: None,
            expires_at: None,
            not_before: None,
            collapse_key: None,
            priority: None,
            tenant: None,
            digest_key: None,
            fallback: None,
            sender: None,
            cost: None,
            payload: None,
            extra: Map::new(),
        }
    }

    /// Set the idempotency key.
    pub fn id(mut self, id: impl Into<String>) -> Job {
        self.id = Some(id.into());
        self
    }

    /// Set the category.
    pub fn category(mut self, category: impl Into<String>) -> Job {
        self.category = Some(category.into());
        self
    }

    /// Set the recipient's zone.
    pub fn timezone(mut self, zone: impl Into<String>) -> Job {
        self.timezone = Some(zone.into());
        self
    }

    /// Set the expiry.
    pub fn expires_at(mut self, at: DateTime<Utc>) -> Job {
        self.expires_at = Some(at);
        self
    }

    /// Schedule it: never delivered before `at` (then caps and send windows apply
    /// as to any job).
    pub fn not_before(mut self, at: DateTime<Utc>) -> Job {
        self.not_before = Some(at);
        self
    }

    /// Give it a collapse key: a newer job of the recipient with the same key
    /// replaces this one while it waits (only the newest is sent).
    pub fn collapse_key(mut self, key: impl Into<String>) -> Job {
        self.collapse_key = Some(key.into());
        self
    }

    /// Put it in a lane (`urgent`, `normal` or `bulk`) instead of its policy's.
    pub fn priority(mut self, priority: Priority) -> Job {
        self.priority = Some(priority);
        self
    }

    /// Set the sender: limits with `per = "sender"` keep a bucket per sender.
    pub fn sender(mut self, sender: impl Into<String>) -> Job {
        self.sender = Some(sender.into());
        self
    }

    /// Set the cost (1 to 100): what it takes of its channel's limits.
    pub fn cost(mut self, cost: u8) -> Job {
        self.cost = Some(cost);
        self
    }

    /// Set the tenant: its recipients are counted apart from other tenants', and its
    /// overrides of policies and caps apply.
    pub fn tenant(mut self, tenant: impl Into<String>) -> Job {
        self.tenant = Some(tenant.into());
        self
    }

    /// Set the digest key: a policy with a digest folds its jobs of one recipient,
    /// channel and key into one message.
    pub fn digest_key(mut self, key: impl Into<String>) -> Job {
        self.digest_key = Some(key.into());
        self
    }

    /// Set the further channels it may move on to, in order.
    pub fn fallback<S: Into<String>>(mut self, channels: impl IntoIterator<Item = S>) -> Job {
        self.fallback = Some(channels.into_iter().map(Into::into).collect());
        self
    }

    /// Set the payload.
    pub fn payload(mut self, payload: Value) -> Job {
        self.payload = Some(payload);
        self
    }
}

/// The id a job was published under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct JobId(pub String);

impl JobId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The `id` is optional in [`Job`] (a producer fills it in) but required on the wire.
fn id_required(schema: &mut Schema) {
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.insert(0, Value::from("id"));
    }
}

/// Every zone name the worker accepts (the IANA database as chrono-tz has it).
fn timezone_schema(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name()).collect();
    schemars::json_schema!({
        "description": "An IANA time zone name, e.g. Asia/Shanghai",
        "anyOf": [
            { "type": "string", "enum": names },
            { "type": "null" }
        ]
    })
}

/// The job's JSON Schema (draft 2020-12), as `schema/job.schema.json` holds it.
pub fn schema() -> Value {
    serde_json::to_value(schemars::schema_for!(Job)).expect("a schema is JSON")
}
