//! The set of a channel's tenant queues (`crate::lanes::tenants`): a sorted set of
//! entries `<lane>|<tenant>` (see [`crate::lanes::fair::entry`]), each scored by the
//! number its last registration drew from the counter beside it
//! (`<set>:seq`, whose value is also the set's version). A park registers its
//! tenant's queue before it publishes to it; a worker that deleted an empty queue
//! forgets its entry only if no park registered it again since.

use redis::Script;

use super::conn::RedisConn;
use super::StoreError;

/// Register an entry: a new number from the counter, the entry scored by it.
const REGISTER_LUA: &str = r"
local seq = redis.call('INCR', KEYS[2])
redis.call('ZADD', KEYS[1], seq, ARGV[1])
return seq
";

/// Forget an entry if its score is still the one the caller read.
const FORGET_LUA: &str = r"
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
local forgotten = 0
if score and tonumber(score) == tonumber(ARGV[2]) then
  forgotten = redis.call('ZREM', KEYS[1], ARGV[1])
end
return forgotten
";

/// The scripts of the set.
#[derive(Debug, Clone)]
pub(crate) struct QueueSet {
    register: Script,
    forget: Script,
}

impl Default for QueueSet {
    fn default() -> Self {
        QueueSet {
            register: Script::new(REGISTER_LUA),
            forget: Script::new(FORGET_LUA),
        }
    }
}

/// The counter beside the set `key`.
fn seq_key(key: &str) -> String {
    format!("{key}:seq")
}

impl QueueSet {
    /// Register `entry` in the set `key`; the number it drew.
    pub(crate) async fn register(
        &self,
        conn: &RedisConn,
        key: &str,
        entry: &str,
    ) -> Result<u64, StoreError> {
        let mut conn = conn.clone();
        let mut call = self.register.key(key);
        call.key(seq_key(key)).arg(entry);
        Ok(call.invoke_async(&mut conn).await?)
    }

    /// Forget `entry` of the set `key` if it is still scored `seq`; whether it was.
    pub(crate) async fn forget(
        &self,
        conn: &RedisConn,
        key: &str,
        (entry, seq): (&str, u64),
    ) -> Result<bool, StoreError> {
        let mut conn = conn.clone();
        let mut call = self.forget.key(key);
        call.arg(entry).arg(seq);
        let n: i64 = call.invoke_async(&mut conn).await?;
        Ok(n > 0)
    }
}

/// The set's version: its counter (0: none yet).
pub(crate) async fn version(conn: &RedisConn, key: &str) -> Result<u64, StoreError> {
    let mut conn = conn.clone();
    let v: Option<u64> = redis::cmd("GET")
        .arg(seq_key(key))
        .query_async(&mut conn)
        .await?;
    Ok(v.unwrap_or(0))
}

/// Every entry of the set with its number.
pub(crate) async fn entries(conn: &RedisConn, key: &str) -> Result<Vec<(String, u64)>, StoreError> {
    let mut conn = conn.clone();
    let v: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    Ok(v.into_iter().map(|(e, s)| (e, s as u64)).collect())
}
