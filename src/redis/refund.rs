//! `lua/refund.lua`: give back what one take of a channel's rate added and is still
//! unspent; its arguments and its reply.

use std::time::Duration;

use redis::Script;

use super::conn::RedisConn;
use crate::quota::policy::Rate;
use crate::redis::StoreError;

/// The script's one named answer (`REFUND` in `lua/refund.lua`; a test checks that
/// both sides name the same number): nothing was owed. Any other answer is the
/// credit, µs.
const NOTHING: i64 = 0;

/// Refund the take that left the TAT `tat` (µs) at `key`; the credit given back.
pub async fn refund(
    conn: &RedisConn,
    script: &Script,
    key: String,
    rate: Rate,
    tat: i64,
) -> Result<Duration, StoreError> {
    refund_take(conn, script, &key, (rate.interval_us, rate.cost), tat).await
}

/// Refund the take of `cost` units at `interval_us` each that left the TAT `tat`
/// (µs) at `key` (a channel's rate or a limit's bucket); the credit given back.
pub async fn refund_take(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    (interval_us, cost): (u64, u64),
    tat: i64,
) -> Result<Duration, StoreError> {
    let mut conn = conn.clone();
    let credit: i64 = script
        .key(key)
        .arg(interval_us)
        .arg(cost)
        .arg(tat)
        .invoke_async(&mut conn)
        .await?;
    match credit {
        NOTHING => Ok(Duration::ZERO),
        credit => Ok(Duration::from_micros(credit.max(0) as u64)),
    }
}

#[cfg(test)]
mod tests {
    use crate::redis::lua_tables::{lua_table, positional_returns};

    const LUA: &str = include_str!("../../lua/refund.lua");

    /// The script and [`super::NOTHING`] name the same answer by the same number,
    /// and the script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        assert_eq!(
            lua_table(LUA, "REFUND"),
            [("nothing".to_string(), super::NOTHING)]
        );
        let found = positional_returns("refund.lua", LUA);
        assert!(found.is_empty(), "{found:#?}");
    }
}
