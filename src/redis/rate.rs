//! `lua/rate.lua`: take jobs from a channel's GCRA send rate; its arguments and its
//! reply (one per job, [`RateReply`]; `lua/lanes.lua` answers the same way). The
//! takes of the jobs that ask at the same moment share one call
//! ([`super::rate_batch`]).

use std::time::Duration;

use redis::Script;

use super::conn::RedisConn;
use crate::quota::policy::Rate;
use crate::redis::StoreError;

/// The reply of the GCRA script for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateReply {
    /// 1 allowed, 0 not yet, -1 never.
    pub allowed: i64,
    /// Jobs that could still go right now.
    pub remaining: i64,
    /// When not allowed: how long until it would be.
    pub retry_after: Duration,
    /// The TAT the take left (µs of Redis time): what a refund of this take passes.
    pub tat_us: i64,
}

/// Ask the rate at `key` for one job of `cost`.
pub async fn take(
    conn: &RedisConn,
    script: &Script,
    key: String,
    rate: Rate,
    cost: u64,
) -> Result<RateReply, StoreError> {
    let mut replies = take_many(conn, script, key, rate, cost, 1).await?;
    replies.pop().ok_or(StoreError::Reply {
        script: "rate.lua",
        reply: vec![],
    })
}

/// Ask the rate at `key` for `asking` jobs of `cost` each, in one call: one reply
/// per job, in order (the first ones granted, the rest told when to ask again).
pub(crate) async fn take_many(
    conn: &RedisConn,
    script: &Script,
    key: String,
    rate: Rate,
    cost: u64,
    asking: usize,
) -> Result<Vec<RateReply>, StoreError> {
    Ok(take_many_paced(conn, script, key, rate, cost, asking)
        .await?
        .0)
}

/// [`take_many`], with the interval in force (µs) while the channel is paused or
/// ramping back after a provider's throttling (`lua/throttle.lua`).
pub(crate) async fn take_many_paced(
    conn: &RedisConn,
    script: &Script,
    key: String,
    rate: Rate,
    cost: u64,
    asking: usize,
) -> Result<(Vec<RateReply>, Option<u64>), StoreError> {
    let mut conn = conn.clone();
    let reply: Vec<i64> = script
        .key(key)
        .arg(rate.interval_us)
        .arg(rate.burst)
        .arg(cost)
        .arg(asking)
        .invoke_async(&mut conn)
        .await?;
    let interval = reply.get(6).map(|&i| i.max(1) as u64);
    match split(&reply, rate.interval_us, rate.burst, cost, asking) {
        Some(replies) => Ok((replies, interval)),
        None => Err(StoreError::Reply {
            script: "rate.lua",
            reply,
        }),
    }
}

/// One reply per job from the script's reply for `asking` jobs (see `lua/rate.lua`;
/// `lua/lanes.lua` answers the same way).
pub(crate) fn split(
    reply: &[i64],
    interval_us: u64,
    burst: u64,
    cost: u64,
    asking: usize,
) -> Option<Vec<RateReply>> {
    let &[allowed, remaining, retry_after, reset_after, tat_us, granted, ..] = reply else {
        return None;
    };
    let granted = usize::try_from(granted).ok().filter(|g| *g <= asking)?;
    if allowed == 1 && granted == 0 {
        return None;
    }
    // saturating: a cost no configuration gives (above the burst, answered -1)
    // must not overflow here
    let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let span = as_i64(interval_us.saturating_mul(cost));
    // after the granted ones, the next job fits once the TAT has come within the
    // burst's tolerance of now
    let next_in = reset_after
        .saturating_add(span)
        .saturating_sub(as_i64(interval_us.saturating_mul(burst)))
        .max(0);
    let out = (0..asking)
        .map(|i| match allowed {
            1 if i < granted => RateReply {
                allowed: 1,
                remaining,
                retry_after: Duration::ZERO,
                tat_us: tat_us.saturating_sub(span.saturating_mul((granted - 1 - i) as i64)),
            },
            1 => RateReply {
                allowed: 0,
                remaining: 0,
                retry_after: Duration::from_micros(next_in as u64),
                tat_us,
            },
            _ => RateReply {
                allowed,
                remaining,
                retry_after: Duration::from_micros(retry_after.max(0) as u64),
                tat_us,
            },
        })
        .collect();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_for_several_jobs_splits_into_each_ones_span_of_the_tat() {
        // interval 1000 us, burst 5, cost 1: three of four granted, TAT ends at 9000
        let replies = split(&[1, 0, 0, 4000, 9000, 3], 1000, 5, 1, 4).unwrap();
        let tats: Vec<i64> = replies.iter().map(|r| r.tat_us).collect();
        assert_eq!(tats[..3], [7000, 8000, 9000]);
        assert!(replies[..3].iter().all(|r| r.allowed == 1));
        // the fourth: the next fits when the TAT is within 5 intervals of now:
        // 4000 + 1000 - 5000 = 0 us from now
        assert_eq!(replies[3].allowed, 0);
        assert_eq!(replies[3].retry_after, Duration::ZERO);
        let later = split(&[1, 0, 0, 6500, 9000, 3], 1000, 5, 1, 4).unwrap();
        assert_eq!(later[3].retry_after, Duration::from_micros(2500));
    }

    #[test]
    fn refusals_and_odd_replies() {
        let not_yet = split(&[0, 0, 1200, 5000, 9000, 0], 1000, 5, 1, 2).unwrap();
        assert!(not_yet
            .iter()
            .all(|r| r.allowed == 0 && r.retry_after == Duration::from_micros(1200)));
        let never = split(&[-1, 0, -1, 0, 0, 0], 1000, 5, 9, 1).unwrap();
        assert_eq!(never[0].allowed, -1);
        assert_eq!(
            split(&[1, 0, 0, 0, 0, 3], 1000, 5, 1, 2),
            None,
            "more granted than asked"
        );
        assert_eq!(
            split(&[1, 0, 0, 0, 0, 0], 1000, 5, 1, 2),
            None,
            "allowed, none granted"
        );
        assert_eq!(split(&[1, 0, 0, 0, 0], 1000, 5, 1, 1), None, "old shape");
        // a cost no configuration gives does not overflow
        let huge = split(&[-1, 0, -1, 0, 5, 0], 10_000_000, 3, u64::MAX, 1).unwrap();
        assert_eq!(huge[0].allowed, -1);
    }
}
