//! `lua/digest_close.lua`: a digest closed (no item joins it from then on) and its
//! items read, or not yet (a sliding digest whose close a later item moved).

use redis::Script;

use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// A closed digest as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// Its head (JSON).
    pub head: String,
    /// The settings it opened with.
    pub spec: String,
    /// Redis time at the close (ms).
    pub now_ms: i64,
    /// Its items (JSON), in the order they were folded.
    pub items: Vec<String>,
}

/// What a close found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Close {
    /// The digest is gone (done already).
    Gone,
    /// A later item moved its close to this instant (ms; `sliding`): it stays open.
    NotYet(i64),
    /// Closed: no item joins it from now on.
    Closed(Closed),
}

/// Close the digest at `key` (see `lua/digest_close.lua`): when it is due, or now
/// whatever its close instant (`now`: a flush).
pub async fn close(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    now: bool,
) -> Result<Close, StoreError> {
    let Some((meta, items, order)) = crate::quota::keys::digest_keys(key) else {
        return Ok(Close::Gone);
    };
    let mut conn = conn.clone();
    let reply: Vec<String> = script
        .key(&meta)
        .key(&items)
        .key(&order)
        .arg(if now { "now" } else { "due" })
        .invoke_async(&mut conn)
        .await?;
    let mut parts = reply.into_iter();
    match parts.next().as_deref() {
        Some("1") => {}
        Some("2") => {
            let at = parts
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_default();
            return Ok(Close::NotYet(at));
        }
        _ => return Ok(Close::Gone),
    }
    let head = parts.next().unwrap_or_default();
    let spec = parts.next().unwrap_or_default();
    let now_ms = parts
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    let items = parts.collect();
    Ok(Close::Closed(Closed {
        head,
        spec,
        now_ms,
        items,
    }))
}
