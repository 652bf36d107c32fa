//! `lua/refund.lua`: give back what one take of a channel's rate added and is still
//! unspent; its arguments and its reply.

use std::time::Duration;

use redis::Script;

use super::conn::RedisConn;
use crate::quota::policy::Rate;
use crate::redis::StoreError;

/// Refund the take that left the TAT `tat` (µs) at `key`; the credit given back.
pub async fn refund(
    conn: &RedisConn,
    script: &Script,
    key: String,
    rate: Rate,
    tat: i64,
) -> Result<Duration, StoreError> {
    let mut conn = conn.clone();
    let credit: i64 = script
        .key(key)
        .arg(rate.interval_us)
        .arg(rate.cost)
        .arg(tat)
        .invoke_async(&mut conn)
        .await?;
    Ok(Duration::from_micros(credit.max(0) as u64))
}
