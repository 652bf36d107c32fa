//! A recipient's preferences in Redis: read, replaced whole, merged (RFC 7386) and
//! removed, for the HTTP API ([`crate::http`]), the console and `admin recipient R
//! preferences`. The set is checked whole first ([`super::set`]); one script
//! (`lua/preferences.lua`, [`super::replace`]) replaces the hash, so an
//! admission never sees half of it. The first set stored writes
//! `prefix:preferences`, which turns the admissions' check on
//! ([`crate::feedback::watch`]).

use std::time::Duration;

use serde_json::Value;

use super::replace::{self as script, Replace};
use super::set::{merge_patch, patch_keys_known, Invalid, Preferences};
use crate::redis::StoreError;
use crate::store::QuotaStore;

/// A stored set: its JSON (as `GET` shows it, with `updated_at`).
pub type Stored = Value;

/// What an edit could not do.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// The set is not valid; nothing was stored.
    #[error("{}: {}", .0.field, .0.error)]
    Invalid(Invalid),
    /// A merge patch that leaves to the stored set what the set needs (a
    /// `quiet_hours` without `windows`) where the stored set has none of it: the
    /// patch conflicts with the state (RFC 5789's 409), and would apply to a set that
    /// has it. Nothing was stored.
    #[error("{}: {} (the patch leaves it to the stored set, which has none)", .0.field, .0.error)]
    Conflict(Invalid),
    /// Redis failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn key(store: &QuotaStore, tenant: Option<&str>, recipient: &str) -> String {
    store.keys().for_tenant(tenant).preferences(recipient)
}

/// `recipient`'s set as stored, with `updated_at`; `None`: none.
pub async fn get(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
) -> Result<Option<Stored>, StoreError> {
    let (set, at) = raw(store, tenant, recipient).await?;
    let Some(mut set) = set.and_then(|s| serde_json::from_str::<Value>(&s).ok()) else {
        return Ok(None);
    };
    if let (Some(map), Some(at)) = (set.as_object_mut(), at) {
        let at = crate::quota::window::from_millis(at);
        map.insert(
            "updated_at".into(),
            Value::String(at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)),
        );
    }
    Ok(Some(set))
}

/// `recipient`'s set as stored (its JSON) and when it was stored (ms).
async fn raw(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
) -> Result<(Option<String>, Option<i64>), StoreError> {
    let mut conn = store.connection();
    Ok(redis::cmd("HMGET")
        .arg(key(store, tenant, recipient))
        .arg("set")
        .arg("updated_at")
        .query_async(&mut conn)
        .await?)
}

fn check(store: &QuotaStore, value: &Value) -> Result<Preferences, EditError> {
    let rules = store.rules();
    Preferences::parse(value, &|ch| rules.channel(ch).is_some()).map_err(EditError::Invalid)
}

/// Replace `recipient`'s set with `value` (checked whole first); the set stored,
/// as `GET` shows it.
pub async fn put(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
    value: &Value,
) -> Result<Stored, EditError> {
    let set = check(store, value)?;
    let now = store.redis_now().timestamp_millis();
    write(store, tenant, recipient, &set, now).await?;
    Ok(get(store, tenant, recipient).await?.unwrap_or(Value::Null))
}

/// Store `set` (checked already) as `recipient`'s, changed at `updated_at` (ms):
/// the one write of a set, for the API, the CLI and `admin preferences import`.
pub async fn write(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
    set: &Preferences,
    updated_at: i64,
) -> Result<(), StoreError> {
    write_if(store, tenant, recipient, set, updated_at, None).await?;
    Ok(())
}

/// [`write`], only while the stored set is still `read` (its JSON, "" for none) when
/// given; whether it was written.
async fn write_if(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
    set: &Preferences,
    updated_at: i64,
    read: Option<&str>,
) -> Result<bool, StoreError> {
    let mut conn = store.connection();
    // the flag first: a set is never stored while admissions skip the check
    let _: () = redis::cmd("SET")
        .arg(store.keys().preferences_flag())
        .arg(1)
        .query_async(&mut conn)
        .await?;
    store.check_preferences(true);
    let json = set.to_json().to_string();
    let mut fields = set.opt_out_fields();
    if let Some(q) = &set.quiet_hours {
        fields.push("quiet".into());
        fields.extend(q.allow.iter().map(|p| format!("qa:{}", p.as_str())));
    }
    let replace = Replace {
        key: key(store, tenant, recipient),
        json: &json,
        updated_at,
        recipient,
        tenant,
        read,
        fields,
    };
    let done = script::replace(&conn, &store.scripts().preferences, &replace).await?;
    Ok(done.is_some())
}

/// Merge `patch` into `recipient`'s set (RFC 7386: `null` removes a key; an absent
/// set is `{}`), check the result whole and store it.
pub async fn patch(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
    patch: &Value,
) -> Result<Stored, EditError> {
    // read, merge, and write only if no other write came between (else again,
    // after a short jittered pause: of the PATCHes that meet, one wins each round):
    // two PATCHes of one recipient at once both apply
    patch_keys_known(patch).map_err(EditError::Invalid)?;
    let mut pauses = crate::backoff::delays(Duration::from_millis(1), Duration::from_millis(50));
    for _ in 0..PATCH_TRIES {
        let (read, _) = raw(store, tenant, recipient).await?;
        let mut value = read
            .as_deref()
            .and_then(|s| serde_json::from_str::<Value>(s).ok())
            .unwrap_or_else(|| Value::Object(Default::default()));
        merge_patch(&mut value, patch);
        let set = check(store, &value).map_err(|e| unmet(e, patch))?;
        let now = store.redis_now().timestamp_millis();
        let read = read.as_deref().unwrap_or("");
        if write_if(store, tenant, recipient, &set, now, Some(read)).await? {
            return Ok(get(store, tenant, recipient).await?.unwrap_or(Value::Null));
        }
        tokio::time::sleep(pauses.next().unwrap_or_default()).await;
    }
    Err(EditError::Store(StoreError::Batch(format!(
        "the preferences of {recipient} changed under {PATCH_TRIES} PATCHes in a row"
    ))))
}

/// `e`, a merged set's refusal, as a [`EditError::Conflict`] when it is only for the
/// `windows` of a `quiet_hours` the patch gives without them.
fn unmet(e: EditError, patch: &Value) -> EditError {
    let leaves_windows =
        patch["quiet_hours"].is_object() && patch["quiet_hours"].get("windows").is_none();
    match e {
        EditError::Invalid(bad) if leaves_windows && bad.field == "quiet_hours.windows" => {
            EditError::Conflict(bad)
        }
        e => e,
    }
}

/// How many times a PATCH reads and merges again when another write came between.
const PATCH_TRIES: usize = 64;

/// Remove `recipient`'s set; whether there was one.
pub async fn delete(
    store: &QuotaStore,
    tenant: Option<&str>,
    recipient: &str,
) -> Result<bool, StoreError> {
    let key = key(store, tenant, recipient);
    script::remove(
        &store.connection(),
        &store.scripts().preferences,
        key,
        recipient,
    )
    .await
}
