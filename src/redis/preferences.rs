//! `lua/preferences.lua`: one recipient's preferences hash replaced whole
//! ([`replace`]), only while it is still the set the caller read when asked, or
//! removed ([`remove`]). What a set is and which fields the admission reads are the
//! preferences room's ([`crate::preferences`]).

use redis::Script;

use super::conn::RedisConn;
use crate::redis::StoreError;

/// One replace: the recipient's hash, the set's JSON, when it was changed (ms),
/// whose it is, and the fields `src/admission/lua/`'s preferences section reads.
#[derive(Debug)]
pub(crate) struct Replace<'a> {
    /// The recipient's hash (`prefix:{tag}/prefs`).
    pub key: String,
    /// The set (JSON).
    pub json: &'a str,
    /// When it was changed, ms.
    pub updated_at: i64,
    /// The recipient and its tenant (kept for the export).
    pub recipient: &'a str,
    /// Its tenant (`None`: no tenant).
    pub tenant: Option<&'a str>,
    /// A write that must find the set it read (a PATCH): that set's JSON ("" for
    /// none).
    pub read: Option<&'a str>,
    /// The opt-out fields, and with quiet hours `quiet` and `qa:PRIORITY`.
    pub fields: Vec<String>,
}

/// Replace the hash: `Some(whether it existed before)`, or `None`, writing nothing,
/// when the set is no longer the one the caller read.
pub(crate) async fn replace(
    conn: &RedisConn,
    script: &Script,
    r: &Replace<'_>,
) -> Result<Option<bool>, StoreError> {
    let mut conn = conn.clone();
    let mut call = script.key(&r.key);
    call.arg(r.json)
        .arg(r.updated_at)
        .arg(r.recipient)
        .arg(r.tenant.unwrap_or(""));
    if let Some(read) = r.read {
        call.arg("=").arg(read);
    }
    for field in &r.fields {
        call.arg(field);
    }
    let done: i64 = call.invoke_async(&mut conn).await?;
    Ok((done >= 0).then_some(done == 1))
}

/// Remove the hash at `key` (of `recipient`); whether there was one.
pub(crate) async fn remove(
    conn: &RedisConn,
    script: &Script,
    key: String,
    recipient: &str,
) -> Result<bool, StoreError> {
    let mut conn = conn.clone();
    let existed: i64 = script
        .key(key)
        .arg("")
        .arg(0)
        .arg(recipient)
        .arg("")
        .invoke_async(&mut conn)
        .await?;
    Ok(existed == 1)
}
