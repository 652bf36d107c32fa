//! Decode: bytes from the broker into a [`Job`], or a `malformed` verdict with a
//! sentence that says why. Pure: no I/O. The body itself is never re-serialised;
//! the worker passes the original bytes through.

use std::borrow::Cow;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::de::IgnoredAny;
use serde::Deserialize;

use crate::priority::Priority;

/// Longest accepted job id, in characters (and never above 255 bytes, the AMQP
/// `message_id` limit).
pub const MAX_ID_CHARS: usize = 128;
/// Longest accepted recipient, in characters.
pub const MAX_RECIPIENT_CHARS: usize = 256;
/// Longest accepted sender, in characters.
pub const MAX_SENDER_CHARS: usize = 128;
/// Largest accepted cost.
pub const MAX_COST: u64 = 100;
/// Longest accepted tenant, in characters.
pub const MAX_TENANT_CHARS: usize = 64;
/// Longest accepted collapse key, in characters.
pub const MAX_COLLAPSE_KEY_CHARS: usize = 128;
/// Longest accepted digest key, in characters.
pub const MAX_DIGEST_KEY_CHARS: usize = 128;
/// Most channels a job's `fallback` names.
pub const MAX_FALLBACK: usize = 4;

/// A decoded job. Borrows from the body where it can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job<'a> {
    /// The idempotency key.
    pub id: Cow<'a, str>,
    /// Opaque recipient.
    pub recipient: Cow<'a, str>,
    /// The channel (checked against the configuration by the worker).
    pub channel: Cow<'a, str>,
    /// The category; `default` when absent.
    pub category: Cow<'a, str>,
    /// The recipient's zone; the configured default when absent.
    pub tz: Tz,
    /// Never deliver after this instant.
    pub expires_at: Option<DateTime<Utc>>,
    /// Never deliver before this instant (a scheduled send).
    pub not_before: Option<DateTime<Utc>>,
    /// Jobs of one recipient with the same collapse key replace each other while
    /// they wait: only the newest is sent.
    pub collapse_key: Option<Cow<'a, str>>,
    /// The lane the job asked for; `None`: its policy's.
    pub priority: Option<Priority>,
    /// The tenant: its recipients are counted apart from other tenants'.
    pub tenant: Option<Cow<'a, str>>,
    /// The digest it is folded into (with its recipient and channel), when its
    /// policy has one; `None`: its category's.
    pub digest_key: Option<Cow<'a, str>>,
    /// The further channels it may move on to, in order (1 to
    /// [`MAX_FALLBACK`], none repeated, not its own `channel`); `None`: its
    /// channel alone.
    pub fallback: Option<Vec<Cow<'a, str>>>,
    /// Who sends it (a from-number, a sending domain, a push app; 1 to
    /// [`MAX_SENDER_CHARS`] characters): limits with `per = "sender"` keep a
    /// bucket per sender. `None`: no sender.
    pub sender: Option<Cow<'a, str>>,
    /// What it takes of its channel's limits (1 to [`MAX_COST`], e.g. the
    /// segments of a long SMS); `None`: its channel's `cost`.
    pub cost: Option<u64>,
}

/// Why a body is not a job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow)]
    recipient: Option<Cow<'a, str>>,
    #[serde(borrow)]
    channel: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    category: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    timezone: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    expires_at: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    not_before: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    collapse_key: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    priority: Option<Cow<'a, str>>,
    tenant: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    digest_key: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    fallback: Option<Vec<Cow<'a, str>>>,
    #[serde(borrow, default)]
    sender: Option<Cow<'a, str>>,
    #[serde(default)]
    cost: Option<serde_json::Value>,
    #[serde(default)]
    #[allow(dead_code)]
    payload: Option<IgnoredAny>,
}

fn required<'a>(
    field: &'static str,
    value: Option<Cow<'a, str>>,
    max_chars: usize,
) -> Result<Cow<'a, str>, Malformed> {
    let value = value.ok_or_else(|| Malformed(format!("the field `{field}` is missing")))?;
    let chars = value.chars().count();
    if chars == 0 || chars > max_chars {
        return Err(Malformed(format!(
            "the field `{field}` must be 1 to {max_chars} characters, not {chars}"
        )));
    }
    Ok(value)
}

/// An optional field: absent, or 1 to `max_chars` characters.
fn optional<'a>(
    field: &'static str,
    value: Option<Cow<'a, str>>,
    max_chars: usize,
) -> Result<Option<Cow<'a, str>>, Malformed> {
    value
        .map(|v| required(field, Some(v), max_chars))
        .transpose()
}

/// Decode a job body. `max_bytes` bounds the body; `default_tz` applies when the
/// job names no zone.
pub fn decode(body: &[u8], max_bytes: usize, default_tz: Tz) -> Result<Job<'_>, Malformed> {
    if body.len() > max_bytes {
        return Err(Malformed(format!(
            "the body is {} bytes, more than the {max_bytes} allowed",
            body.len()
        )));
    }
    let text = std::str::from_utf8(body).map_err(|e| {
        Malformed(format!(
            "the body is not UTF-8 (invalid byte at offset {})",
            e.valid_up_to()
        ))
    })?;
    let wire: Wire<'_> = serde_json::from_str(text).map_err(|e| {
        let what = if e.is_data() {
            "not a job"
        } else {
            "not valid JSON"
        };
        Malformed(format!("the body is {what}: {e}"))
    })?;
    let id = required("id", wire.id, MAX_ID_CHARS)?;
    if id.len() > 255 {
        return Err(Malformed(format!(
            "the field `id` is {} bytes in UTF-8, more than the 255 an AMQP message id holds",
            id.len()
        )));
    }
    let recipient = required("recipient", wire.recipient, MAX_RECIPIENT_CHARS)?;
    let channel = required("channel", wire.channel, 64)?;
    let category = match wire.category {
        None => Cow::Borrowed("default"),
        Some(c) => required("category", Some(c), 64)?,
    };
    let tz = match wire.timezone {
        None => default_tz,
        Some(name) => name.parse::<Tz>().map_err(|_| {
            Malformed(format!(
                "the field `timezone` is not an IANA time zone: {:?}",
                truncate(&name)
            ))
        })?,
    };
    let expires_at = instant("expires_at", wire.expires_at)?;
    let not_before = instant("not_before", wire.not_before)?;
    let collapse_key = optional("collapse_key", wire.collapse_key, MAX_COLLAPSE_KEY_CHARS)?;
    let priority = match wire.priority {
        None => None,
        Some(word) => Some(
            word.parse::<Priority>()
                .map_err(|e| Malformed(format!("the field `priority` is {e}")))?,
        ),
    };
    let tenant = optional("tenant", wire.tenant, MAX_TENANT_CHARS)?;
    let digest_key = optional("digest_key", wire.digest_key, MAX_DIGEST_KEY_CHARS)?;
    let fallback = match wire.fallback {
        None => None,
        Some(list) => Some(fallback(list, &channel)?),
    };
    let sender = optional("sender", wire.sender, MAX_SENDER_CHARS)?;
    let cost = wire.cost.map(cost).transpose()?;
    Ok(Job {
        id,
        recipient,
        channel,
        category,
        tz,
        expires_at,
        not_before,
        collapse_key,
        priority,
        tenant,
        digest_key,
        fallback,
        sender,
        cost,
    })
}

/// A job's `cost`: a whole number from 1 to [`MAX_COST`].
fn cost(value: serde_json::Value) -> Result<u64, Malformed> {
    match value.as_u64() {
        Some(n) if (1..=MAX_COST).contains(&n) => Ok(n),
        _ => Err(Malformed(format!(
            "the field `cost` must be a whole number from 1 to {MAX_COST}, not {}",
            truncate(&value.to_string())
        ))),
    }
}

/// A job's `fallback`: 1 to [`MAX_FALLBACK`] channels, none repeated, not `own`.
fn fallback<'a>(list: Vec<Cow<'a, str>>, own: &str) -> Result<Vec<Cow<'a, str>>, Malformed> {
    if list.is_empty() || list.len() > MAX_FALLBACK {
        return Err(Malformed(format!(
            "the field `fallback` must name 1 to {MAX_FALLBACK} channels, not {}",
            list.len()
        )));
    }
    for (i, c) in list.iter().enumerate() {
        let c = required("fallback", Some(c.clone()), 64)?;
        if c == own {
            return Err(Malformed(format!(
                "the field `fallback` names the job's own channel `{}`",
                truncate(&c)
            )));
        }
        if list[..i].contains(&c) {
            return Err(Malformed(format!(
                "the field `fallback` names channel `{}` twice",
                truncate(&c)
            )));
        }
    }
    Ok(list)
}

/// An optional RFC 3339 field. The date and time are joined by `T` (or `t`), as
/// RFC 3339's grammar and JSON Schema's `date-time` say; chrono would also take a
/// space, which the schema refuses, so it is refused here too.
fn instant(field: &str, text: Option<Cow<'_, str>>) -> Result<Option<DateTime<Utc>>, Malformed> {
    let Some(text) = text else { return Ok(None) };
    if text.as_bytes().get(10) == Some(&b' ') {
        return Err(Malformed(format!(
            "the field `{field}` is not an RFC 3339 instant (a space where `T` joins date and time): {:?}",
            truncate(&text)
        )));
    }
    DateTime::parse_from_rfc3339(&text)
        .map(|t| Some(t.with_timezone(&Utc)))
        .map_err(|e| {
            Malformed(format!(
                "the field `{field}` is not an RFC 3339 instant ({e}): {:?}",
                truncate(&text)
            ))
        })
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(body: &str) -> Job<'_> {
        decode(body.as_bytes(), 1 << 20, Tz::UTC).unwrap()
    }

    fn bad(body: &[u8]) -> String {
        decode(body, 1 << 20, Tz::UTC).unwrap_err().0
    }

    #[test]
    fn a_full_job() {
        let j = ok(
            r#"{"id":"j1","recipient":"+8613800000000","channel":"sms","category":"promo",
            "timezone":"Asia/Shanghai","expires_at":"2026-12-01T00:00:00+08:00",
            "not_before":"2026-11-30T09:00:00+08:00","collapse_key":"cart","payload":{"a":[1,2]},"extra":true,
            "digest_key":"post-17"}"#,
        );
        assert_eq!(j.collapse_key.as_deref(), Some("cart"));
        assert_eq!(j.digest_key.as_deref(), Some("post-17"));
        assert_eq!(j.id, "j1");
        assert_eq!(j.category, "promo");
        assert_eq!(j.tz, chrono_tz::Asia::Shanghai);
        assert_eq!(
            j.expires_at.unwrap().to_rfc3339(),
            "2026-11-30T16:00:00+00:00"
        );
        assert_eq!(
            j.not_before.unwrap().to_rfc3339(),
            "2026-11-30T01:00:00+00:00"
        );
    }

    #[test]
    fn defaults_apply() {
        let j = decode(
            br#"{"id":"j","recipient":"r","channel":"email"}"#,
            100,
            chrono_tz::Europe::Paris,
        )
        .unwrap();
        assert_eq!(j.category, "default");
        assert_eq!(j.tz, chrono_tz::Europe::Paris);
        assert_eq!(j.expires_at, None);
        assert_eq!(j.priority, None);
    }

    #[test]
    fn a_priority_is_one_of_three_words() {
        let j = ok(r#"{"id":"j","recipient":"r","channel":"sms","priority":"urgent"}"#);
        assert_eq!(j.priority, Some(Priority::Urgent));
        let e = bad(br#"{"id":"j","recipient":"r","channel":"sms","priority":"high"}"#);
        assert!(e.contains("`priority`") && e.contains("\"high\""), "{e}");
    }

    #[test]
    fn escaped_strings_decode() {
        let j = ok(r#"{"id":"a\"b","recipient":"{x}:\n\u0000","channel":"sms"}"#);
        assert_eq!(j.id, "a\"b");
        assert_eq!(j.recipient, "{x}:\n\0");
    }

    #[test]
    fn malformed_cases_say_why() {
        let long_id = format!(
            r#"{{"id":"{}","recipient":"r","channel":"sms"}}"#,
            "i".repeat(10_000)
        );
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"\xff\xfe{}".to_vec(), "not UTF-8"),
            (b"not json".to_vec(), "not valid JSON"),
            (b"[1,2]".to_vec(), "not a job"),
            (
                br#"{"recipient":"r","channel":"sms"}"#.to_vec(),
                "`id` is missing",
            ),
            (
                br#"{"id":"","recipient":"r","channel":"sms"}"#.to_vec(),
                "`id` must be 1 to 128",
            ),
            (long_id.into_bytes(), "`id` must be 1 to 128"),
            (
                br#"{"id":"a","channel":"sms"}"#.to_vec(),
                "`recipient` is missing",
            ),
            (
                br#"{"id":"a","recipient":"r","channel":"sms","not_before":"tomorrow"}"#.to_vec(),
                "`not_before` is not an RFC 3339 instant",
            ),
            (
                br#"{"id":"a","recipient":"r","channel":"sms","collapse_key":""}"#.to_vec(),
                "`collapse_key` must be 1 to 128",
            ),
            (
                br#"{"id":"a","recipient":"r","channel":"sms","digest_key":""}"#.to_vec(),
                "`digest_key` must be 1 to 128",
            ),
            (
                format!(
                    r#"{{"id":"a","recipient":"r","channel":"sms","digest_key":"{}"}}"#,
                    "k".repeat(129)
                )
                .into_bytes(),
                "`digest_key` must be 1 to 128 characters, not 129",
            ),
            (
                br#"{"id":"a","recipient":"r","channel":"sms","collapse_key":7}"#.to_vec(),
                "not a job",
            ),
            (
                br#"{"id":1,"recipient":"r","channel":"sms"}"#.to_vec(),
                "not a job",
            ),
            (
                br#"{"id":"a","recipient":"r","channel":"sms","timezone":"../../etc/passwd"}"#
                    .to_vec(),
                "not an IANA",
            ),
            (
                br#"{"id":"a","recipient":"r","channel":"sms","expires_at":"tomorrow"}"#.to_vec(),
                "RFC 3339",
            ),
            (
                br#"{"id":"a","id":"b","recipient":"r","channel":"sms"}"#.to_vec(),
                "duplicate field",
            ),
        ];
        for (body, why) in cases {
            let got = bad(&body);
            assert!(got.contains(why), "{got:?} should say {why:?}");
        }
    }

    #[test]
    fn deep_payloads_pass_through_without_recursion() {
        let deep = format!(
            r#"{{"id":"a","recipient":"r","channel":"sms","payload":{}{}}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert_eq!(ok(&deep).id, "a");
        let deep_id = format!(
            r#"{{"id":{}{},"recipient":"r","channel":"sms"}}"#,
            "[".repeat(10_000),
            "]".repeat(10_000)
        );
        assert!(bad(deep_id.as_bytes()).contains("not a job"));
    }

    #[test]
    fn oversized_bodies_are_refused_before_parsing() {
        let body = vec![b' '; 11];
        assert!(decode(&body, 10, Tz::UTC)
            .unwrap_err()
            .0
            .contains("11 bytes"));
    }

    #[test]
    fn extreme_instants_parse() {
        assert!(ok(
            r#"{"id":"a","recipient":"r","channel":"sms","expires_at":"9999-12-31T23:59:59Z"}"#
        )
        .expires_at
        .is_some());
        assert!(ok(
            r#"{"id":"a","recipient":"r","channel":"sms","expires_at":"1970-01-01T00:00:00Z"}"#
        )
        .expires_at
        .is_some());
    }

    #[test]
    fn multibyte_ids_over_255_bytes_are_refused() {
        let id = "é".repeat(128);
        let body = format!(r#"{{"id":"{id}","recipient":"r","channel":"sms"}}"#);
        assert!(bad(body.as_bytes()).contains("255"));
    }
}
