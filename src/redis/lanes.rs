//! `lua/lanes.lua`: take from a channel's GCRA send rate for jobs of one lane; its
//! arguments and its two replies: one per job, as `lua/rate.lua`'s
//! ([`take_many`], for the batched takes of [`super::rate::RateBatcher`]), or the
//! slots due within a look-ahead ([`slots`], for the lines of
//! [`crate::lanes::line`]). How the lanes share the rate is the lanes room's
//! ([`crate::lanes::share`]); the script decides, for every worker at once.

use std::time::Duration;

use redis::Script;

use super::conn::RedisConn;
use super::rate::{field, split, Allowed, Field, RateReply};
use crate::lanes::share::LaneAsk;
use crate::quota::policy::Rate;
use crate::redis::StoreError;

/// The keys of one channel's call: its rate's key (as `lua/rate.lua`'s) and its
/// lanes' state.
pub(crate) type LaneKeys = (String, String);

/// A tenant whose jobs wait in a line, presented to the lane's schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Its member in the schedule ([`crate::lanes::fair::member`]).
    pub member: String,
    /// Its stride ([`crate::lanes::fair::stride`]).
    pub stride: u64,
    /// Its jobs waiting in the line.
    pub waiting: usize,
}

/// The tenants of one ask, and the lane's schedule and its `seen` set.
pub(crate) type Fair<'a> = Option<((&'a str, &'a str), &'a [Candidate])>;

/// Ask the rate for `asking` jobs of `ask.lane`, in one call: one reply per job, in
/// order (as [`super::rate::take_many`]).
pub async fn take_many(
    conn: &RedisConn,
    script: &Script,
    keys: LaneKeys,
    rate: Rate,
    ask: LaneAsk,
    asking: usize,
) -> Result<Vec<RateReply>, StoreError> {
    let reply = call(conn, script, keys, (rate, ask), (asking, None), None).await?;
    split(&reply, rate.interval_us, rate.burst, rate.cost, asking).ok_or(StoreError::Reply {
        script: "lanes.lua",
        reply,
    })
}

/// Ask the rate for up to `wanted` slots of `ask.lane` due within `ahead`; with
/// `fair`, which of its candidates each slot goes to.
pub(crate) async fn slots(
    conn: &RedisConn,
    script: &Script,
    keys: LaneKeys,
    (rate, ask): (Rate, LaneAsk),
    (wanted, ahead): (usize, Duration),
    fair: Fair<'_>,
) -> Result<Granted, StoreError> {
    let ahead = Some(ahead.as_micros() as u64);
    let reply = call(conn, script, keys, (rate, ask), (wanted, ahead), fair).await?;
    granted(&reply).ok_or(StoreError::Reply {
        script: "lanes.lua",
        reply,
    })
}

/// One call of `lua/lanes.lua` for `asking` jobs of `ask.lane`, with the look-ahead
/// (µs) of a lane's line when given; its raw reply.
async fn call(
    conn: &RedisConn,
    script: &Script,
    (key, state): LaneKeys,
    (rate, ask): (Rate, LaneAsk),
    (asking, ahead_us): (usize, Option<u64>),
    fair: Fair<'_>,
) -> Result<Vec<i64>, StoreError> {
    let mut conn = conn.clone();
    let mut call = script.key(key);
    call.key(state);
    if let Some(((schedule, seen), _)) = fair {
        call.key(schedule).key(seen);
    }
    call.arg(rate.interval_us)
        .arg(rate.burst)
        .arg(rate.cost)
        .arg(asking)
        .arg(ask.lane.rank())
        .arg(ask.lanes.reserve_us)
        .arg(ask.lanes.share_interval_us);
    if let Some(ahead) = ahead_us {
        call.arg(ahead);
    }
    if let Some((_, candidates)) = fair {
        call.arg(candidates.len());
        for c in candidates {
            call.arg(&c.member).arg(c.stride).arg(c.waiting);
        }
    }
    Ok(call.invoke_async(&mut conn).await?)
}

/// What one ask of a lane's line got.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Granted {
    /// Slots, in order: the TAT each take left and how long until it is due; and,
    /// when the ask presented candidates, which of them each slot goes to.
    Slots(Vec<(i64, Duration)>, Vec<usize>),
    /// None yet: ask again after this.
    NotYet(Duration),
    /// The cost is above the burst: never.
    Never,
}

/// The slots of `lua/lanes.lua`'s reply to an ask with a look-ahead (`None`: a reply
/// of another shape).
pub(crate) fn granted(reply: &[i64]) -> Option<Granted> {
    let at = |f| field(reply, f);
    match at(Field::ALLOWED)? {
        Allowed::YES => {
            let tat_us = at(Field::TAT_US)?;
            let granted = at(Field::GRANTED)?;
            let first_in = at(Field::FIRST_SLOT_IN_US)?;
            let span = at(Field::SPAN_US)?;
            let granted = usize::try_from(granted).ok().filter(|g| *g > 0)?;
            let slots = (0..granted)
                .map(|i| {
                    let later = (granted - 1 - i) as i64;
                    let due_in = first_in.saturating_add(span.saturating_mul(i as i64));
                    (
                        tat_us.saturating_sub(span.saturating_mul(later)),
                        Duration::from_micros(due_in.max(0) as u64),
                    )
                })
                .collect();
            let picks = reply
                .get(8..)
                .unwrap_or_default()
                .iter()
                .map(|p| usize::try_from(*p).unwrap_or(usize::MAX))
                .collect();
            Some(Granted::Slots(slots, picks))
        }
        Allowed::NOT_YET => Some(Granted::NotYet(Duration::from_micros(
            at(Field::RETRY_AFTER_US)?.max(0) as u64,
        ))),
        Allowed::NEVER => Some(Granted::Never),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grant_with_a_look_ahead_gives_each_slot_its_time() {
        // three granted, the first due 2 ms ago, each 1 ms apart, TAT ending at 9000
        let g = granted(&[1, 0, 0, 4000, 9000, 3, -2000, 1000]).unwrap();
        assert_eq!(
            g,
            Granted::Slots(
                vec![
                    (7000, Duration::ZERO),
                    (8000, Duration::ZERO),
                    (9000, Duration::from_micros(0)),
                ],
                vec![]
            )
        );
        let later = granted(&[1, 0, 0, 4000, 9000, 2, 500, 1000]).unwrap();
        assert_eq!(
            later,
            Granted::Slots(
                vec![
                    (8000, Duration::from_micros(500)),
                    (9000, Duration::from_micros(1500)),
                ],
                vec![]
            )
        );
        let fair = granted(&[1, 0, 0, 4000, 9000, 2, 500, 1000, 1, 0]).unwrap();
        assert!(matches!(fair, Granted::Slots(s, p) if s.len() == 2 && p == vec![1, 0]));
    }

    #[test]
    fn refusals_and_odd_replies() {
        assert_eq!(
            granted(&[0, 0, 1200, 5000, 9000, 0]),
            Some(Granted::NotYet(Duration::from_micros(1200)))
        );
        assert_eq!(granted(&[-1, 0, -1, 0, 0, 0]), Some(Granted::Never));
        assert_eq!(
            granted(&[1, 0, 0, 0, 0, 3]),
            None,
            "no slot times (no look-ahead asked)"
        );
        assert_eq!(granted(&[1, 0, 0, 0, 0, 0, 0, 10]), None, "none granted");
        assert_eq!(granted(&[]), None);
        assert_eq!(granted(&[7]), None);
    }
}
