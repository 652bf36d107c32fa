//! `lua/rate.lua`: take `cost` jobs from a channel's GCRA send rate; its arguments
//! and its reply.

use std::time::Duration;

use redis::Script;

use super::conn::RedisConn;
use crate::config::Rate;
use crate::engine::EngineError;

/// The reply of the GCRA script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateReply {
    /// 1 allowed, 0 not yet, -1 never.
    pub allowed: i64,
    /// Jobs that could still go right now.
    pub remaining: i64,
    /// When not allowed: how long until it would be.
    pub retry_after: Duration,
    /// The TAT the call left (µs of Redis time): what a refund of this take passes.
    pub tat_us: i64,
}

/// Ask the rate at `key` for `cost` jobs.
pub async fn take(
    conn: &RedisConn,
    script: &Script,
    key: String,
    rate: Rate,
    cost: u64,
) -> Result<RateReply, EngineError> {
    let mut conn = conn.clone();
    let reply: Vec<i64> = script
        .key(key)
        .arg(rate.interval_us)
        .arg(rate.burst)
        .arg(cost)
        .invoke_async(&mut conn)
        .await?;
    match reply[..] {
        [allowed, remaining, retry_after, _reset_after, tat_us] => Ok(RateReply {
            allowed,
            remaining,
            retry_after: Duration::from_micros(retry_after.max(0) as u64),
            tat_us,
        }),
        _ => Err(EngineError::Reply {
            script: "rate.lua",
            reply,
        }),
    }
}
