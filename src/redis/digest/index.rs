//! The plain commands around the digests' scripts: a digest put back in the index
//! of close instants ([`reschedule`]), and a digest done with ([`done`]).

use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// A digest claimed too early (its close moved ahead) goes back in the index at
/// `at` (ms), its claim dropped.
pub async fn reschedule(
    conn: &RedisConn,
    index: &str,
    key: &str,
    at: i64,
) -> Result<(), StoreError> {
    let mut conn = conn.clone();
    let _: i64 = redis::cmd("ZADD")
        .arg(index)
        .arg("XX")
        .arg(at)
        .arg(key)
        .query_async(&mut conn)
        .await?;
    Ok(())
}

/// A closed digest is done with (sent, or it had nothing to send): its keys go,
/// its place in the recipient's open digests, then its place in the index.
pub async fn done(conn: &RedisConn, index: &str, key: &str) -> Result<(), StoreError> {
    let mut conn = conn.clone();
    if let Some(keys) = crate::quota::keys::digest_keys(key) {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys.meta)
            .arg(&keys.items)
            .arg(&keys.order)
            .query_async(&mut conn)
            .await?;
    }
    if let Some((set, id)) = crate::quota::keys::digest_set(key) {
        let _: i64 = redis::cmd("SREM")
            .arg(&set)
            .arg(id)
            .query_async(&mut conn)
            .await?;
    }
    let _: i64 = redis::cmd("ZREM")
        .arg(index)
        .arg(key)
        .query_async(&mut conn)
        .await?;
    Ok(())
}
