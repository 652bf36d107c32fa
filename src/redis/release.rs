//! `lua/release.lua`: give back the send one admission reserved, in the recipient's
//! key and its caps' keys, only while that reservation is still its own.

use redis::Script;

use super::conn::RedisConn;
use crate::redis::StoreError;

/// Remove `member`'s reservation made at `admitted_ms` from `keys` (one hash slot)
/// where it is still that reservation; how many keys it was removed from.
pub async fn release<'a>(
    conn: &RedisConn,
    script: &Script,
    keys: impl Iterator<Item = &'a String>,
    member: &[u8],
    admitted_ms: i64,
) -> Result<i64, StoreError> {
    let mut conn = conn.clone();
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(key);
    }
    let removed: i64 = call
        .arg(member)
        .arg(admitted_ms * 2)
        .invoke_async(&mut conn)
        .await?;
    Ok(removed)
}
