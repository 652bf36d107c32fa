//! `lua/collapse.lua`: whether a job is the newest of its recipient's jobs with the
//! same collapse key (registering it if so); its arguments and its reply.

use chrono::{DateTime, Utc};
use redis::Script;

use super::conn::RedisConn;
use crate::redis::StoreError;

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
        1 => Ok(Collapse::Newest),
        0 => Ok(Collapse::SupersededBy(newer)),
        _ => Err(StoreError::Reply {
            script: "collapse.lua",
            reply: vec![code],
        }),
    }
}
