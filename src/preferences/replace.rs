//! `lua/preferences.lua`: one recipient's preferences hash replaced whole
//! ([`replace`]), only while it is still the set the caller read when asked, or
//! removed ([`remove`]). What a set is and which fields the admission reads are the
//! preferences room's ([`crate::preferences`]).

use redis::Script;

use crate::redis::conn::RedisConn;
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

/// The script's answers (`WRITE` in `lua/preferences.lua`; a test checks that both
/// sides name the same numbers).
struct Write;

impl Write {
    const STALE: i64 = -1;
    const ABSENT: i64 = 0;
    const EXISTED: i64 = 1;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 3] = [
        (Write::STALE, "stale"),
        (Write::ABSENT, "absent"),
        (Write::EXISTED, "existed"),
    ];

    /// `Some(whether the hash existed before)`, `None` for a stale write.
    fn read(code: i64) -> Result<Option<bool>, StoreError> {
        match code {
            Write::EXISTED => Ok(Some(true)),
            Write::ABSENT => Ok(Some(false)),
            Write::STALE => Ok(None),
            _ => Err(StoreError::Reply {
                script: "preferences.lua",
                reply: vec![code],
            }),
        }
    }
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
    let code: i64 = call.invoke_async(&mut conn).await?;
    Write::read(code)
}

/// Remove the hash at `key` (of `recipient`); whether there was one.
pub(crate) async fn remove(
    conn: &RedisConn,
    script: &Script,
    key: String,
    recipient: &str,
) -> Result<bool, StoreError> {
    let mut conn = conn.clone();
    let code: i64 = script
        .key(key)
        .arg("")
        .arg(0)
        .arg(recipient)
        .arg("")
        .invoke_async(&mut conn)
        .await?;
    // a removal never finds the set stale (it names no set it read)
    Ok(Write::read(code)? == Some(true))
}

#[cfg(test)]
mod tests {
    use super::Write;
    use crate::redis::lua_tables::speaks_by_name;

    const LUA: &str = include_str!("../../lua/preferences.lua");

    /// The script and [`Write`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        speaks_by_name("preferences.lua", LUA, "WRITE", &Write::ALL);
    }
}
