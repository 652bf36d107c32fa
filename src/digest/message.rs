//! The message a closed digest becomes ([`message`]): its items as stored
//! ([`StoredItem`]), whom it is for ([`DigestHead`]), the expired ones left out, the
//! first or last `keep` in full. Pure: no I/O.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::quota::digest::{DigestSpec, KeepFrom};

/// Header on a digest (as a job on the jobs queue, then on its dispatch): how many
/// items it holds. A job that carries it is never folded again.
pub const DIGEST_HEADER: &str = "x-notify-digest";

/// One item of a digest as stored: the job's id, when the worker first saw it, its
/// `expires_at`, and its payload as the job carried it (raw JSON, `null` without).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoredItem {
    /// The job's id.
    pub id: String,
    /// When a worker first saw it (ms).
    pub at: i64,
    /// Its `expires_at` (ms), if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    /// Its payload, untouched.
    pub payload: Box<RawValue>,
}

/// What a job's body carries that its digest item keeps: its payload as written
/// (`None` if the body has none).
pub fn payload_of(body: &[u8]) -> Option<Box<RawValue>> {
    #[derive(Deserialize)]
    struct Payload {
        #[serde(default)]
        payload: Option<Box<RawValue>>,
    }
    serde_json::from_slice::<Payload>(body).ok()?.payload
}

/// Whom and what a digest is for: its group, as the first item said.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DigestHead {
    /// The digest's id (`dg-…`), its message id.
    pub id: String,
    /// The recipient.
    pub recipient: String,
    /// The channel.
    pub channel: String,
    /// The category (the first item's).
    pub category: String,
    /// The tenant.
    pub tenant: Option<String>,
    /// The recipient's zone (the first item's), when it named one.
    pub timezone: Option<String>,
    /// The group's key: the items' `digest_key`, or else their category.
    pub key: String,
}

/// What a closed digest amounts to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Built {
    /// The message body (a job: the worker admits it as one).
    pub body: Vec<u8>,
    /// The items it counts.
    pub count: usize,
    /// The items left out because their `expires_at` had passed.
    pub expired: usize,
}

fn rfc3339(ms: i64) -> String {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .unwrap_or_default()
        .to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// The message of a digest closed at `now_ms` holding `items` (in the order they
/// were folded): the items past their `expires_at` left out (and counted apart),
/// the first or last `keep` in full, the count and the number omitted.
/// `None` when no item is left (a digest with no items sends nothing).
pub fn message(
    head: &DigestHead,
    spec: &DigestSpec,
    items: &[StoredItem],
    now_ms: i64,
) -> Option<Built> {
    let live: Vec<&StoredItem> = items
        .iter()
        .filter(|i| i.exp.is_none_or(|e| e > now_ms))
        .collect();
    let expired = items.len() - live.len();
    let (first, last) = (live.first()?, live.last()?);
    let keep = (spec.keep as usize).min(live.len());
    let kept = match spec.keep_from {
        KeepFrom::First => &live[..keep],
        KeepFrom::Last => &live[live.len() - keep..],
    };
    #[derive(Serialize)]
    struct Item<'a> {
        id: &'a str,
        at: String,
        payload: &'a RawValue,
    }
    #[derive(Serialize)]
    struct Digest<'a> {
        key: &'a str,
        count: usize,
        items: Vec<Item<'a>>,
        omitted: usize,
        first_at: String,
        last_at: String,
    }
    #[derive(Serialize)]
    struct Body<'a> {
        id: &'a str,
        recipient: &'a str,
        channel: &'a str,
        category: &'a str,
        tenant: Option<&'a str>,
        #[serde(skip_serializing_if = "Option::is_none")]
        timezone: Option<&'a str>,
        digest: Digest<'a>,
    }
    let body = Body {
        id: &head.id,
        recipient: &head.recipient,
        channel: &head.channel,
        category: &head.category,
        tenant: head.tenant.as_deref(),
        timezone: head.timezone.as_deref(),
        digest: Digest {
            key: &head.key,
            count: live.len(),
            items: kept
                .iter()
                .map(|i| Item {
                    id: &i.id,
                    at: rfc3339(i.at),
                    payload: &i.payload,
                })
                .collect(),
            omitted: live.len() - keep,
            first_at: rfc3339(first.at),
            last_at: rfc3339(last.at),
        },
    };
    Some(Built {
        body: serde_json::to_vec(&body).expect("a digest is JSON"),
        count: live.len(),
        expired,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(keep: u32, keep_from: KeepFrom) -> DigestSpec {
        DigestSpec::window_for_tests(keep, keep_from)
    }

    fn head() -> DigestHead {
        DigestHead {
            id: "dg-x".into(),
            recipient: "r".into(),
            channel: "sms".into(),
            category: "social".into(),
            tenant: None,
            timezone: None,
            key: "social".into(),
        }
    }

    fn item(n: i64, exp: Option<i64>) -> StoredItem {
        StoredItem {
            id: format!("j{n}"),
            at: 1_700_000_000_000 + n * 1000,
            exp,
            payload: RawValue::from_string(format!(r#"{{"n":{n}}}"#)).unwrap(),
        }
    }

    #[test]
    fn keep_first_or_last_with_the_rest_omitted() {
        let items: Vec<_> = (1..=5).map(|n| item(n, None)).collect();
        let b = message(&head(), &spec(2, KeepFrom::First), &items, 0).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b.body).unwrap();
        assert_eq!(v["id"], "dg-x");
        assert_eq!(v["tenant"], serde_json::Value::Null);
        assert!(v.get("timezone").is_none());
        let d = &v["digest"];
        assert_eq!(
            (d["count"].as_u64(), d["omitted"].as_u64()),
            (Some(5), Some(3))
        );
        assert_eq!(d["items"][0]["id"], "j1");
        assert_eq!(d["items"][1]["payload"], serde_json::json!({"n": 2}));
        assert_eq!(d["first_at"], "2023-11-14T22:13:21.000Z");
        assert_eq!(d["last_at"], "2023-11-14T22:13:25.000Z");
        let b = message(&head(), &spec(2, KeepFrom::Last), &items, 0).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&b.body).unwrap();
        let ids: Vec<_> = v["digest"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(ids, ["j4", "j5"]);
    }

    #[test]
    fn expired_items_are_left_out_and_an_empty_digest_sends_nothing() {
        let now = 1_800_000_000_000;
        let items = [
            item(1, Some(now - 1)),
            item(2, None),
            item(3, Some(now + 1)),
        ];
        let b = message(&head(), &spec(10, KeepFrom::First), &items, now).unwrap();
        assert_eq!((b.count, b.expired), (2, 1));
        assert!(message(&head(), &spec(10, KeepFrom::First), &items[..1], now).is_none());
    }

    #[test]
    fn a_payload_is_kept_as_written() {
        let body = br#"{"id":"a","payload":{"b": [1, 2.50]}}"#;
        assert_eq!(payload_of(body).unwrap().get(), r#"{"b": [1, 2.50]}"#);
        assert!(payload_of(br#"{"id":"a"}"#).is_none());
    }
}
