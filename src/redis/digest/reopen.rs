//! `lua/digest_reopen.lua`: a `held` digest refused when it went, open again until
//! its caps' next instant, and the index told when it closes.

use redis::Script;

use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// A `held` digest refused when it went opens again, closing at `close_at_ms`
/// (see `lua/digest_reopen.lua`), and the index learns when; `false` when it is
/// gone.
pub async fn reopen(
    conn: &RedisConn,
    script: &Script,
    index: &str,
    key: &str,
    close_at_ms: i64,
    keep_ms: u64,
) -> Result<bool, StoreError> {
    let Some((meta, items, order)) = crate::quota::keys::digest_keys(key) else {
        return Ok(false);
    };
    let base = &meta[..meta.rfind("dgm/").unwrap_or(0)];
    let mut conn = conn.clone();
    let done: i64 = script
        .key(&meta)
        .key(&items)
        .key(&order)
        .arg(close_at_ms)
        .arg(base)
        .arg(keep_ms)
        .invoke_async(&mut conn)
        .await?;
    if done == 1 {
        let _: i64 = redis::cmd("ZADD")
            .arg(index)
            .arg(close_at_ms)
            .arg(key)
            .query_async(&mut conn)
            .await?;
    }
    Ok(done == 1)
}
