//! `lua/digest_claim.lua`: the digests due to close, each claimed for a lease.

use redis::Script;

use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// Claim up to `max` digests due to close, each for `lease_ms`.
pub async fn claim(
    conn: &RedisConn,
    script: &Script,
    index: &str,
    lease_ms: u64,
    max: usize,
) -> Result<Vec<String>, StoreError> {
    let mut conn = conn.clone();
    Ok(script
        .key(index)
        .arg(lease_ms)
        .arg(max)
        .invoke_async(&mut conn)
        .await?)
}
