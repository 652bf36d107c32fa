//! `lua/import.lua`: record one past send in a recipient's sorted set (the admin's
//! import, so caps hold from the first day); its arguments and its reply.

use chrono::{DateTime, Utc};
use redis::Script;

use super::conn::RedisConn;
use crate::quota::window;
use crate::redis::StoreError;

/// What recording one send did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ImportReply {
    /// Whether the send was new (a send of the same id was there already).
    pub added: bool,
    /// When the key now expires, if it has a TTL.
    pub key_expires_at: Option<DateTime<Utc>>,
}

/// Record the send of `member` at `at` in `key`, counting until `until`.
pub async fn import_send(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    member: &[u8],
    at: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<ImportReply, StoreError> {
    let mut conn = conn.clone();
    let reply: Vec<i64> = script
        .key(key)
        .arg(member)
        .arg(at.timestamp_millis() * 2 + 1)
        .arg(until.timestamp_millis())
        .invoke_async(&mut conn)
        .await?;
    let [added, expire] = reply[..] else {
        return Err(StoreError::Reply {
            script: "import.lua",
            reply,
        });
    };
    Ok(ImportReply {
        added: added == 1,
        key_expires_at: (expire >= 0).then(|| window::from_millis(expire)),
    })
}
