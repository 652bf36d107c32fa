//! `lua/collapse.lua`: whether a job is the newest of its recipient's jobs with the
//! same collapse key (registering it if so); its arguments and its reply.

use chrono::{DateTime, Utc};
use redis::Script;

use super::conn::RedisConn;
use crate::redis::StoreError;

/// The script's answer codes (`COLLAPSE` in `lua/collapse.lua`; a test checks
/// that both sides name the same numbers).
struct Code;

impl Code {
    const SUPERSEDED: i64 = 0;
    const NEWEST: i64 = 1;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 2] =
        [(Code::SUPERSEDED, "superseded"), (Code::NEWEST, "newest")];
}

/// The script's answer for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Collapse {
    /// This job is the newest with its key (and is now registered as such).
    Newest,
    /// A newer job, with this id, holds the key: this one is superseded.
    SupersededBy(String),
}

/// Ask whether job `id`, first seen at `first_seen`, is the newest under `field`
/// in the recipient's hash `key` (kept `ttl` after this write).
pub async fn collapse(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    field: &str,
    id: &str,
    first_seen: DateTime<Utc>,
    ttl: std::time::Duration,
) -> Result<Collapse, StoreError> {
    let mut conn = conn.clone();
    let (code, newer): (i64, String) = script
        .key(key)
        .arg(field)
        .arg(id)
        .arg(first_seen.timestamp_millis())
        .arg(ttl.as_millis() as u64)
        .invoke_async(&mut conn)
        .await?;
    match code {
        Code::NEWEST => Ok(Collapse::Newest),
        Code::SUPERSEDED => Ok(Collapse::SupersededBy(newer)),
        _ => Err(StoreError::Reply {
            script: "collapse.lua",
            reply: vec![code],
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::redis::lua_tables::speaks_by_name;

    const LUA: &str = include_str!("../../lua/collapse.lua");

    /// The script and [`Code`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        speaks_by_name("collapse.lua", LUA, "COLLAPSE", &Code::ALL);
    }
}
