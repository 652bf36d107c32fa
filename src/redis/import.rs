//! `lua/import.lua`: record one past send in a recipient's sorted set (the admin's
//! import, so caps hold from the first day); its arguments and its reply.

use chrono::{DateTime, Utc};
use redis::Script;

use super::conn::RedisConn;
use crate::quota::window;
use crate::redis::StoreError;

/// The script's answer codes (`IMPORT` in `lua/import.lua`; a test checks that
/// both sides name the same numbers).
struct Code;

impl Code {
    const KNOWN: i64 = 0;
    const ADDED: i64 = 1;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 2] = [(Code::KNOWN, "known"), (Code::ADDED, "added")];
}

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
    let added = match reply[..] {
        [Code::ADDED, _] => true,
        [Code::KNOWN, _] => false,
        _ => {
            return Err(StoreError::Reply {
                script: "import.lua",
                reply,
            })
        }
    };
    let expire = reply[1];
    Ok(ImportReply {
        added,
        key_expires_at: (expire >= 0).then(|| window::from_millis(expire)),
    })
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::redis::lua_tables::speaks_by_name;

    const LUA: &str = include_str!("../../lua/import.lua");

    /// The script and [`Code`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        speaks_by_name("import.lua", LUA, "IMPORT", &Code::ALL);
    }
}
