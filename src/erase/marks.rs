//! The erase mark: `prefix:erased`, a sorted set of erased recipients' marks (a
//! keyed hash of the recipient and its tenant, other than its tag:
//! [`Keys::erase_mark`]) scored by when each was erased (ms), kept one round
//! of the delay ladder and an hour more (a waiting job comes back to a worker at
//! least that often), and at least `redis.record_ttl`. Every worker holds it in memory
//! beside the cancel marks (it is reread when the cancel marks' version moves,
//! which an erase raises), and drops unsent, without a dead letter, every job of
//! an erased recipient that it first saw no later than the erase: a job waiting
//! in the delay ladder, parked in a lane, held in a line or coming back for a
//! fallback step. A job first seen after the erase is a new one and is decided as
//! any other. Pure but for [`read`] and [`set`].

use chrono::{DateTime, Utc};
use lapin::types::FieldTable;

use crate::job::headers;
use crate::quota::keys::Keys;
use crate::redis::{RedisConn, StoreError};

/// When the job with these headers and AMQP `timestamp` (seconds) was first seen,
/// in ms: its `x-notify-first-seen` header (a job delayed once), else its
/// `x-notify-parked-at` (a job parked at its first handling), else the timestamp
/// its producer gave it. `None`: nothing says (taken for a job newer than any
/// erase).
pub fn since_ms(headers: Option<&FieldTable>, timestamp: Option<u64>) -> Option<i64> {
    let header = |name: &str| {
        headers
            .and_then(|h| h.inner().get(name))
            .and_then(headers::as_i64)
    };
    header(headers::FIRST_SEEN)
        .or_else(|| header(headers::PARKED_AT))
        .or_else(|| timestamp.map(|s| (s as i64).saturating_mul(1000)))
}

/// Whether a job first seen at `since` (ms) is one the erase at `erased_at` (ms)
/// drops: one seen no later than it.
pub fn drops(erased_at: i64, since: Option<i64>) -> bool {
    since.is_some_and(|s| s <= erased_at)
}

/// Every erase mark still kept: the mark and when (ms).
pub async fn read(conn: &RedisConn, keys: &Keys) -> Result<Vec<(String, i64)>, StoreError> {
    let mut conn = conn.clone();
    let marks: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.erased())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    Ok(marks.into_iter().map(|(t, s)| (t, s as i64)).collect())
}

/// Set erase mark `mark` at `now` (a second erase moves the mark to its own time),
/// forget the marks older than `keep_ms`, and raise the cancel marks' version so
/// that every worker rereads them within one poll.
pub async fn set(
    conn: &RedisConn,
    keys: &Keys,
    mark: &str,
    now: DateTime<Utc>,
    keep_ms: u64,
) -> Result<(), StoreError> {
    let (set, version) = (keys.erased(), keys.cancelled().1);
    let now_ms = now.timestamp_millis();
    let mut conn = conn.clone();
    // the set and the version are two slots on a cluster: two commands, the mark
    // first, so a worker that sees the version moved finds the mark
    let _: (i64, i64, i64) = redis::pipe()
        .cmd("ZADD")
        .arg(&set)
        .arg(now_ms)
        .arg(mark)
        .cmd("ZREMRANGEBYSCORE")
        .arg(&set)
        .arg("-inf")
        .arg(format!("({}", now_ms - keep_ms as i64))
        .cmd("PEXPIRE")
        .arg(&set)
        .arg(keep_ms)
        .query_async(&mut conn)
        .await?;
    let _: i64 = redis::cmd("INCR")
        .arg(version)
        .query_async(&mut conn)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::AMQPValue;

    #[test]
    fn a_job_is_dropped_only_if_first_seen_no_later_than_the_erase() {
        let mut h = FieldTable::default();
        assert_eq!(since_ms(None, Some(5)), Some(5000));
        assert_eq!(since_ms(None, None), None);
        h.insert(headers::PARKED_AT.into(), AMQPValue::LongLongInt(7000));
        assert_eq!(since_ms(Some(&h), Some(5)), Some(7000));
        h.insert(headers::FIRST_SEEN.into(), AMQPValue::LongLongInt(6000));
        assert_eq!(since_ms(Some(&h), Some(5)), Some(6000));
        assert!(drops(6000, Some(6000)));
        assert!(drops(6000, Some(1)));
        assert!(!drops(6000, Some(6001)));
        assert!(!drops(6000, None));
    }
}
