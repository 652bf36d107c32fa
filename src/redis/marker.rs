//! The reset marker and the pause mark (keys of [`Keys::reset`]): the marker is a
//! value a worker writes once (`SET NX`, no expiry) and every worker reads back
//! each second; a Redis that restarted empty, was flushed, or failed over to an
//! empty replica has lost it. The pause mark holds capped jobs on every worker
//! until `quota-worker admin resume` deletes it. Plain commands: one `MGET` a
//! second a worker, none per job.

use redis::Cmd;

use super::conn::RedisConn;
use crate::quota::keys::Keys;
use crate::redis::StoreError;

/// What the two keys hold now.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Seen {
    /// The marker's value; `None`: no marker.
    pub marker: Option<String>,
    /// The pause mark's value (when and why it was set); `None`: not paused.
    pub paused: Option<String>,
}

/// Both keys, in one command (one hash slot).
pub async fn read(conn: &RedisConn, keys: &Keys) -> Result<Seen, StoreError> {
    let (marker, paused) = keys.reset();
    let mut conn = conn.clone();
    let (marker, paused): (Option<String>, Option<String>) = redis::cmd("MGET")
        .arg(&marker)
        .arg(&paused)
        .query_async(&mut conn)
        .await?;
    Ok(Seen { marker, paused })
}

/// Write `value` as the marker unless there is one; the marker in place after.
pub async fn write(conn: &RedisConn, keys: &Keys, value: &str) -> Result<String, StoreError> {
    let (marker, _) = keys.reset();
    let mut conn = conn.clone();
    let set: Option<String> = set_nx(&marker, value).query_async(&mut conn).await?;
    if set.is_some() {
        return Ok(value.to_string());
    }
    let there: Option<String> = redis::cmd("GET")
        .arg(&marker)
        .query_async(&mut conn)
        .await?;
    Ok(there.unwrap_or_else(|| value.to_string()))
}

/// Set the pause mark to `why` unless it is set.
pub async fn pause(conn: &RedisConn, keys: &Keys, why: &str) -> Result<(), StoreError> {
    let (_, paused) = keys.reset();
    let mut conn = conn.clone();
    let _: Option<String> = set_nx(&paused, why).query_async(&mut conn).await?;
    Ok(())
}

/// Delete the pause mark; its value if it was set.
pub async fn resume(conn: &RedisConn, keys: &Keys) -> Result<Option<String>, StoreError> {
    let (_, paused) = keys.reset();
    let mut conn = conn.clone();
    let was: Option<String> = redis::cmd("GETDEL")
        .arg(&paused)
        .query_async(&mut conn)
        .await?;
    Ok(was)
}

fn set_nx(key: &str, value: &str) -> Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(value).arg("NX");
    cmd
}
