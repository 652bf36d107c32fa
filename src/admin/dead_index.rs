//! The browsable index of the dead letters, in Redis beside the dead-letter queue:
//! filled from the dead-letter log, a stream the broker copies every dead letter
//! to, by whoever reads the index ([`super::dead_log`]: a batch of entries a call,
//! [`record_many`], `lua/dead_index.lua`), the oldest dropped beyond
//! `console.dead_index`; the console's dead-letter pages read it ([`page`],
//! [`entry`]) and never the queue, whose only reading is a walk that takes and
//! puts back every message. Replaying or purging still walks the queue
//! ([`super::DeadLetters`]), selecting by the ids the index found, and then
//! forgets those entries ([`forget`]).
//!
//! The index is a sorted set of short summaries (when, id, reason, policy,
//! channel, recipient tag) scored by when; a hash holds each whole entry (headers
//! and body), read only for the page shown. Beside it, one sorted set per value of
//! each field a filter names (`…:v2:by:channel:sms`), holding the summaries with that
//! value at the index's score: the script that adds, drops and forgets entries
//! keeps them with the index, so a filtered page reads one range of one set, or the
//! intersection of a few (`lua/dead_page.lua`), instead of every summary. Every key
//! carries the hash tag `{dead}`: one slot on a cluster.

use std::sync::LazyLock;

use chrono::{DateTime, TimeZone, Utc};
use lapin::BasicProperties;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::DeadLetterInfo;
use crate::quota::keys::Keys;
use crate::redis::{RedisConn, StoreError};

static SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(crate::redis::scripts::DEAD_INDEX_LUA));

static PAGE_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(crate::redis::scripts::DEAD_PAGE_LUA));

/// Summaries forgotten by one call of the script (a purge may select thousands).
const FORGET_CHUNK: usize = 1000;

/// Bodies longer than this are cut in the index (the queue keeps them whole).
const BODY_MAX: usize = 16 * 1024;

/// One dead letter as the index keeps it.
///
/// Its fields are those of the JSON record the index keeps in Redis (the
/// entries' hash), one each: it mirrors that record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// Its summary: the entry's name in the index.
    #[serde(skip)]
    pub key: String,
    /// The job id, when known.
    pub id: Option<String>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// The worker's detail.
    pub detail: String,
    /// When.
    pub at: DateTime<Utc>,
    /// Times the worker handled it.
    pub attempts: Option<i64>,
    /// The policy of its category, when decoded.
    pub policy: Option<String>,
    /// Its channel, when decoded.
    pub channel: Option<String>,
    /// Its recipient's hash tag (of its tenant), when decoded.
    pub recipient_tag: Option<String>,
    /// Its tenant.
    pub tenant: Option<String>,
    /// Its print ([`super::dead_letter_info::print`]): which message in the queue it is.
    #[serde(default)]
    pub print: String,
    /// Every header and property.
    pub properties: Value,
    /// The body (JSON when it is JSON, else text; cut at 16 KiB).
    pub body: Value,
    /// The body's bytes as received (cut at 16 KiB), base64: what the console
    /// shows, neither re-serialised nor re-encoded (absent from entries written
    /// before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
}

/// What the summary says of an entry: enough to filter on (when, id, reason,
/// policy, channel, recipient tag, a nonce, tenant, print).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Summary(
    i64,
    Option<String>,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    String,
);

/// Which dead letters: every field given must match; `None` matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only this reason.
    pub reason: Option<String>,
    /// Only this policy.
    pub policy: Option<String>,
    /// Only this channel.
    pub channel: Option<String>,
    /// Only this recipient tag (of its tenant).
    pub recipient_tag: Option<String>,
    /// Only this tenant.
    pub tenant: Option<String>,
    /// Only this job id.
    pub id: Option<String>,
    /// Only those dead-lettered at or after this instant.
    pub since: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant.
    pub until: Option<DateTime<Utc>>,
}

impl Filter {
    /// Whether `e` is selected.
    pub fn matches(&self, e: &Entry) -> bool {
        let is = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        self.reason.as_ref().is_none_or(|r| *r == e.reason)
            && is(&self.policy, &e.policy)
            && is(&self.channel, &e.channel)
            && is(&self.recipient_tag, &e.recipient_tag)
            && is(&self.tenant, &e.tenant)
            && is(&self.id, &e.id)
            // (in whole milliseconds, as the index scores them)
            && self.since.is_none_or(|s| ms(e.at) >= ms(s))
            && self.until.is_none_or(|u| ms(e.at) < ms(u))
    }

    /// Whether it selects every dead letter.
    pub fn is_everything(&self) -> bool {
        *self == Filter::default()
    }

    /// The filter in words, for a confirmation: "reason `capped` and tenant `acme`".
    pub fn describe(&self) -> String {
        let mut parts: Vec<String> = [
            ("reason", &self.reason),
            ("policy", &self.policy),
            ("channel", &self.channel),
            ("recipient tag", &self.recipient_tag),
            ("tenant", &self.tenant),
            ("job id", &self.id),
        ]
        .into_iter()
        .filter_map(|(name, v)| Some(format!("{name} `{}`", v.as_ref()?)))
        .collect();
        if let Some(s) = self.since {
            parts.push(format!("since {}", s.to_rfc3339()));
        }
        if let Some(u) = self.until {
            parts.push(format!("before {}", u.to_rfc3339()));
        }
        if parts.is_empty() {
            "every dead letter".into()
        } else {
            parts.join(" and ")
        }
    }
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

/// The field sets `filter` intersects (`lua/dead_index.lua` names them alike);
/// none for no field (its time range is a range of scores).
fn sets(filter: &Filter, names: &Names) -> Vec<String> {
    [
        ("id", &filter.id),
        ("reason", &filter.reason),
        ("policy", &filter.policy),
        ("channel", &filter.channel),
        ("recipient", &filter.recipient_tag),
        ("tenant", &filter.tenant),
    ]
    .into_iter()
    .filter_map(|(field, value)| Some(format!("{}{field}:{}", names.by, value.as_ref()?)))
    .collect()
}

/// The scores (ms) `filter`'s time range selects, as `lua/dead_page.lua` takes them.
fn score_range(filter: &Filter) -> (String, String) {
    (
        filter
            .since
            .map_or("-inf".into(), |s| s.timestamp_millis().to_string()),
        filter
            .until
            .map_or("+inf".into(), |u| format!("({}", u.timestamp_millis())),
    )
}

/// What the job said of itself, for the index (the worker knows it once decoded).
#[derive(Debug, Clone, Default)]
pub struct Known {
    /// The policy of its category.
    pub policy: Option<String>,
    /// Its channel.
    pub channel: Option<String>,
    /// Its recipient's tag.
    pub recipient_tag: Option<String>,
    /// Its tenant.
    pub tenant: Option<String>,
}

/// The index, its entries and the field sets' common beginning: one hash tag, so
/// one script takes them all on a cluster.
struct Names {
    index: String,
    entries: String,
    by: String,
    offset: String,
    catching: String,
}

fn names(keys: &Keys) -> Names {
    let p = keys.prefix();
    Names {
        index: format!("{p}:{{dead}}:v2:index"),
        entries: format!("{p}:{{dead}}:v2:entries"),
        by: format!("{p}:{{dead}}:v2:by:"),
        offset: format!("{p}:{{dead}}:v2:offset"),
        catching: format!("{p}:{{dead}}:catching"),
    }
}

/// The entry of a dead letter published with `props` and `body`: when it was
/// dead-lettered (its timestamp, else the broker's `x-death`), else `now`.
pub fn entry(props: &BasicProperties, body: &[u8], known: Known, now: DateTime<Utc>) -> Entry {
    let cut = &body[..body.len().min(BODY_MAX)];
    let info = DeadLetterInfo::read(props, cut, now, true);
    let print = super::dead_letter_info::print(props, body);
    Entry {
        key: String::new(),
        id: info.id,
        reason: info.reason,
        detail: info.detail,
        at: info.dead_at.unwrap_or(now),
        attempts: info.attempts,
        policy: known.policy,
        channel: known.channel,
        recipient_tag: known.recipient_tag,
        tenant: known.tenant,
        print,
        properties: info.properties.unwrap_or(Value::Null),
        body: info.body.unwrap_or(Value::Null),
        raw: Some(base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            cut,
        )),
    }
}

impl Entry {
    /// The body's bytes as received (cut at 16 KiB), when the entry kept them.
    pub fn raw_body(&self) -> Option<Vec<u8>> {
        let raw = self.raw.as_deref()?;
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, raw).ok()
    }

    /// Whether the body was cut at 16 KiB in the index.
    pub fn body_cut_at() -> usize {
        BODY_MAX
    }
}

/// Add `entry` to the index, keeping `bound` entries at most; the entries kept.
pub async fn record(
    conn: &RedisConn,
    keys: &Keys,
    entry: &Entry,
    bound: u32,
) -> Result<u64, StoreError> {
    record_many(conn, keys, std::slice::from_ref(entry), bound, None).await
}

/// Add `entries` to the index in one call, keeping `bound` entries at most, and
/// with them the dead-letter log's offset they were read up to (`log_offset`, the
/// next to read; [`super::dead_log`]); the entries kept.
pub async fn record_many(
    conn: &RedisConn,
    keys: &Keys,
    entries: &[Entry],
    bound: u32,
    log_offset: Option<i64>,
) -> Result<u64, StoreError> {
    let names = names(keys);
    let mut invocation = SCRIPT.prepare_invoke();
    invocation
        .key(names.index)
        .key(names.entries)
        .key(names.offset)
        .arg("add")
        .arg(names.by)
        .arg(bound)
        .arg(log_offset.map_or(String::new(), |o| o.to_string()));
    for entry in entries {
        let ms = entry.at.timestamp_millis();
        // two dead letters of one id in one millisecond stay two entries
        let nonce = uuid::Uuid::now_v7().simple().to_string();
        let summary = Summary(
            ms,
            entry.id.clone(),
            entry.reason.clone(),
            entry.policy.clone(),
            entry.channel.clone(),
            entry.recipient_tag.clone(),
            nonce,
            entry.tenant.clone(),
            entry.print.clone(),
        );
        // an entry is strings and JSON values: it always serializes
        invocation
            .arg(serde_json::to_string(&summary).unwrap_or_default())
            .arg(ms)
            .arg(serde_json::to_string(entry).unwrap_or_default());
    }
    let mut conn = conn.clone();
    Ok(invocation.invoke_async(&mut conn).await?)
}

/// Every tenant the index holds an entry of, sorted (a set the script keeps
/// with the index: one read of at most as many tenants as entries).
pub async fn tenants(conn: &RedisConn, keys: &Keys) -> Result<Vec<String>, StoreError> {
    let mut conn = conn.clone();
    let mut found: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{}values:tenant", names(keys).by))
        .query_async(&mut conn)
        .await?;
    found.sort();
    Ok(found)
}

/// The lease of the catch-up under way ([`super::dead_log`]), in the index's slot.
pub(super) fn catch_up_lease(keys: &Keys) -> String {
    names(keys).catching
}

/// The log's offset the index was caught up to, if it ever was.
pub(super) async fn log_offset(conn: &RedisConn, keys: &Keys) -> Result<Option<i64>, StoreError> {
    let mut conn = conn.clone();
    Ok(redis::cmd("GET")
        .arg(names(keys).offset)
        .query_async(&mut conn)
        .await?)
}

/// One page of the entries `filter` selects, newest first: how many it selects in
/// all, and the `limit` after the first `offset`.
pub async fn page(
    conn: &RedisConn,
    keys: &Keys,
    filter: &Filter,
    offset: usize,
    limit: usize,
) -> Result<(usize, Vec<Entry>), StoreError> {
    let (count, shown) = summaries(conn, keys, filter, offset, limit.max(1)).await?;
    Ok((count, read(conn, keys, &shown).await?))
}

/// The summaries `filter` selects, newest first: how many in all, and the `limit`
/// after the first `offset` (0: all of them). One range of one set, or of the
/// intersection of the field sets the filter names.
async fn summaries(
    conn: &RedisConn,
    keys: &Keys,
    filter: &Filter,
    offset: usize,
    limit: usize,
) -> Result<(usize, Vec<String>), StoreError> {
    let names = names(keys);
    let mut sets = sets(filter, &names);
    if sets.is_empty() {
        sets.push(names.index);
    }
    let mut invocation = PAGE_SCRIPT.prepare_invoke();
    for set in sets {
        invocation.key(set);
    }
    let (low, high) = score_range(filter);
    let mut conn = conn.clone();
    Ok(invocation
        .arg(offset)
        .arg(limit)
        .arg(low)
        .arg(high)
        .invoke_async(&mut conn)
        .await?)
}

/// Every summary `filter` selects, newest first.
pub async fn select(
    conn: &RedisConn,
    keys: &Keys,
    filter: &Filter,
) -> Result<Vec<String>, StoreError> {
    Ok(summaries(conn, keys, filter, 0, 0).await?.1)
}

/// The summaries of the entries with print `print` (one dead letter, or several
/// identical ones), oldest first.
pub async fn with_print(
    conn: &RedisConn,
    keys: &Keys,
    print: &str,
) -> Result<Vec<String>, StoreError> {
    let mut conn = conn.clone();
    Ok(redis::cmd("ZRANGE")
        .arg(format!("{}print:{print}", names(keys).by))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await?)
}

/// The entries named `selected`, in that order (one gone meanwhile is left out).
pub async fn read(
    conn: &RedisConn,
    keys: &Keys,
    selected: &[String],
) -> Result<Vec<Entry>, StoreError> {
    if selected.is_empty() {
        return Ok(Vec::new());
    }
    let mut conn = conn.clone();
    let found: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(names(keys).entries)
        .arg(selected)
        .query_async(&mut conn)
        .await?;
    Ok(selected
        .iter()
        .zip(found)
        .filter_map(|(key, json)| {
            let mut e: Entry = serde_json::from_str(&json?).ok()?;
            e.key = key.clone();
            Some(e)
        })
        .collect())
}

/// The newest entry of job `id`, if the index has one.
pub async fn entry_of(
    conn: &RedisConn,
    keys: &Keys,
    id: &str,
) -> Result<Option<Entry>, StoreError> {
    let filter = Filter {
        id: Some(id.to_string()),
        ..Filter::default()
    };
    let (_, newest) = summaries(conn, keys, &filter, 0, 1).await?;
    Ok(read(conn, keys, &newest).await?.pop())
}

/// Forget the entries `selected` (replayed or purged), with their place in the
/// field sets (each chunk in one call; an index being caught up keeps them too:
/// [`super::dead_log::catch_up`] first).
pub async fn forget(conn: &RedisConn, keys: &Keys, selected: &[String]) -> Result<(), StoreError> {
    let names = names(keys);
    let mut conn = conn.clone();
    for chunk in selected.chunks(FORGET_CHUNK) {
        SCRIPT
            .key(&names.index)
            .key(&names.entries)
            .arg("forget")
            .arg(&names.by)
            .arg(chunk)
            .invoke_async::<u64>(&mut conn)
            .await?;
    }
    Ok(())
}

/// When a summary says its entry was written.
pub fn when(key: &str) -> Option<DateTime<Utc>> {
    let s: Summary = serde_json::from_str(key).ok()?;
    Utc.timestamp_millis_opt(s.0).single()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_filter_names_one_set_per_field_it_filters_on_in_the_index_slot() {
        let names = names(&Keys::new("qw", "k"));
        assert_eq!(names.index, "qw:{dead}:v2:index");
        assert!(sets(&Filter::default(), &names).is_empty());
        let capped_sms = Filter {
            reason: Some("capped".into()),
            channel: Some("sms".into()),
            ..Filter::default()
        };
        assert_eq!(
            sets(&capped_sms, &names),
            [
                "qw:{dead}:v2:by:reason:capped",
                "qw:{dead}:v2:by:channel:sms"
            ]
        );
        let everything = Filter {
            reason: Some("r".into()),
            policy: Some("p".into()),
            channel: Some("c".into()),
            recipient_tag: Some("t".into()),
            tenant: Some("acme".into()),
            id: Some("j".into()),
            ..Filter::default()
        };
        let named = sets(&everything, &names);
        assert_eq!(named.len(), 6);
        assert!(named.iter().all(|s| s.starts_with("qw:{dead}:v2:by:")));
    }
}
