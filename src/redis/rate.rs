//! `lua/rate.lua`: take jobs from a channel's GCRA send rate; its arguments and its
//! reply (one per job, [`RateReply`]; `lua/lanes.lua` answers the same way). The
//! takes of the jobs that ask at the same moment share one call
//! ([`super::rate_batch`]).

use std::time::Duration;

use redis::Script;

use super::conn::RedisConn;
use crate::quota::policy::Rate;
use crate::redis::StoreError;

/// The fields of the GCRA scripts' reply, by name: `GCRA` in `lua/gcra.lua`, then
/// `RATE` of `lua/rate.lua` or `LANE` of `lua/lanes.lua`; each its position in the
/// reply, counted from 1 as the scripts count (a test checks that both sides name
/// the same positions). Read with [`field`].
pub(crate) struct Field;

impl Field {
    pub(crate) const ALLOWED: usize = 1;
    pub(crate) const REMAINING: usize = 2;
    pub(crate) const RETRY_AFTER_US: usize = 3;
    pub(crate) const RESET_AFTER_US: usize = 4;
    pub(crate) const TAT_US: usize = 5;
    pub(crate) const GRANTED: usize = 6;
    /// `rate.lua`, only while the channel is paused or ramping: the interval in force.
    pub(crate) const INTERVAL_US: usize = 7;
    /// `lanes.lua`, when allowed: the first granted slot's time less now.
    pub(crate) const FIRST_SLOT_IN_US: usize = 7;
    /// `lanes.lua`, when allowed: the span of one job.
    pub(crate) const SPAN_US: usize = 8;
    /// The fields of `GCRA`, `RATE` and `LANE`, with their names in the scripts.
    #[cfg(test)]
    pub(crate) const ALL: [(&'static str, &'static [(usize, &'static str)]); 3] = [
        (
            "GCRA",
            &[
                (Field::ALLOWED, "allowed"),
                (Field::REMAINING, "remaining"),
                (Field::RETRY_AFTER_US, "retry_after_us"),
                (Field::RESET_AFTER_US, "reset_after_us"),
                (Field::TAT_US, "tat_us"),
                (Field::GRANTED, "granted"),
            ],
        ),
        ("RATE", &[(Field::INTERVAL_US, "interval_us")]),
        (
            "LANE",
            &[
                (Field::FIRST_SLOT_IN_US, "first_slot_in_us"),
                (Field::SPAN_US, "span_us"),
            ],
        ),
    ];
}

/// Field `at` ([`Field`]) of a GCRA script's reply; `None` when the reply is
/// shorter.
pub(crate) fn field(reply: &[i64], at: usize) -> Option<i64> {
    reply.get(at.checked_sub(1)?).copied()
}

/// What a GCRA script's `allowed` says (`ALLOWED` in `lua/gcra.lua`).
pub struct Allowed;

impl Allowed {
    /// For the first `granted` jobs.
    pub const YES: i64 = 1;
    /// Ask again after `retry_after`.
    pub const NOT_YET: i64 = 0;
    /// The cost is above the burst.
    pub const NEVER: i64 = -1;
    /// Every value, with its name in the script.
    #[cfg(test)]
    pub(crate) const ALL: [(i64, &'static str); 3] = [
        (Allowed::YES, "yes"),
        (Allowed::NOT_YET, "not_yet"),
        (Allowed::NEVER, "never"),
    ];
}

/// The reply of the GCRA script for one job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateReply {
    /// One of [`Allowed`]: 1 allowed, 0 not yet, -1 never.
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
    let interval = field(&reply, Field::INTERVAL_US).map(|i| i.max(1) as u64);
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
    let at = |f| field(reply, f);
    let allowed = at(Field::ALLOWED)?;
    let remaining = at(Field::REMAINING)?;
    let retry_after = at(Field::RETRY_AFTER_US)?;
    let reset_after = at(Field::RESET_AFTER_US)?;
    let tat_us = at(Field::TAT_US)?;
    let granted = usize::try_from(at(Field::GRANTED)?)
        .ok()
        .filter(|g| *g <= asking)?;
    if allowed == Allowed::YES && granted == 0 {
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
            Allowed::YES if i < granted => RateReply {
                allowed: Allowed::YES,
                remaining,
                retry_after: Duration::ZERO,
                tat_us: tat_us.saturating_sub(span.saturating_mul((granted - 1 - i) as i64)),
            },
            Allowed::YES => RateReply {
                allowed: Allowed::NOT_YET,
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
    use crate::redis::lua_tables::{lua_table, positional_returns};

    const GCRA: &str = include_str!("../../lua/gcra.lua");
    const RATE: &str = include_str!("../../lua/rate.lua");
    const LANES: &str = include_str!("../../lua/lanes.lua");

    /// The scripts and this module name the same fields at the same positions, and
    /// the same values of `allowed`: changing one side only fails here.
    #[test]
    fn the_scripts_and_the_reader_name_the_same_fields() {
        for (table, fields) in Field::ALL {
            let lua = match table {
                "GCRA" => GCRA,
                "RATE" => RATE,
                _ => LANES,
            };
            let ours: Vec<(String, i64)> = fields
                .iter()
                .map(|(at, name)| (name.to_string(), *at as i64))
                .collect();
            assert_eq!(lua_table(lua, table), ours, "{table}");
        }
        let allowed: Vec<(String, i64)> = Allowed::ALL
            .iter()
            .map(|(v, name)| (name.to_string(), *v))
            .collect();
        assert_eq!(lua_table(GCRA, "ALLOWED"), allowed);
    }

    /// Neither script answers by position: every reply is built by name.
    #[test]
    fn the_scripts_answer_by_name() {
        let mut found = positional_returns("gcra.lua", GCRA);
        found.extend(positional_returns("rate.lua", RATE));
        found.extend(positional_returns("lanes.lua", LANES));
        assert!(found.is_empty(), "{found:#?}");
    }

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
