//! `lua/rate.lua`: take jobs from a channel's GCRA send rate; its arguments and its
//! reply, and [`RateBatcher`], which takes for all the jobs of a channel that ask at
//! the same moment in one call.
//!
//! A channel's rate is one key, so on a Redis Cluster every job of the channel meets
//! one shard: called once per job, that key would cap the channel at what one Redis
//! core runs of the script (BENCHMARKS.md item 21 measures it). Batched, a call
//! decides as many jobs as asked at once, and the rate itself is unchanged: the
//! script grants them in order, each exactly as if it had come alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::conn::RedisConn;
use super::rate_line::{granted, AskSlots, Granted, Lines, Slot};
pub use crate::quota::lanes::LaneAsk;
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
async fn take_many_paced(
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

/// [`take_many`] for jobs of one lane (`lua/lanes.lua`, with the channel's lane
/// state at `state`).
pub async fn take_many_in_lane(
    conn: &RedisConn,
    script: &Script,
    (key, state): (String, String),
    rate: Rate,
    ask: LaneAsk,
    asking: usize,
) -> Result<Vec<RateReply>, StoreError> {
    let reply = call_lanes(conn, script, (key, state), rate, ask, asking, None).await?;
    split(&reply, rate.interval_us, rate.burst, rate.cost, asking).ok_or(StoreError::Reply {
        script: "lanes.lua",
        reply,
    })
}

/// One call of `lua/lanes.lua` for `asking` jobs of `ask.lane`, with the look-ahead
/// (µs) of a lane's line when given; its raw reply.
async fn call_lanes(
    conn: &RedisConn,
    script: &Script,
    (key, state): (String, String),
    rate: Rate,
    ask: LaneAsk,
    asking: usize,
    ahead_us: Option<u64>,
) -> Result<Vec<i64>, StoreError> {
    let mut conn = conn.clone();
    let mut call = script.key(key);
    call.key(state)
        .arg(rate.interval_us)
        .arg(rate.burst)
        .arg(rate.cost)
        .arg(asking)
        .arg(ask.lane.rank())
        .arg(ask.lanes.reserve_us)
        .arg(ask.lanes.share_interval_us);
    if let Some(ahead) = ahead_us {
        call.arg(ahead);
    }
    Ok(call.invoke_async(&mut conn).await?)
}

/// One reply per job from the script's reply for `asking` jobs (see `lua/rate.lua`).
fn split(
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

type Reply = Result<RateReply, StoreError>;
/// What one job asks: the rate, and its lane when it has one.
type Ask = (Rate, Option<LaneAsk>);

/// Takes from one channel's rate for the jobs that ask at the same moment in one
/// call (while [`OUTSTANDING`] calls are out, new asks wait and leave together).
pub(crate) struct RateBatcher {
    tx: mpsc::UnboundedSender<(Ask, oneshot::Sender<Reply>)>,
    taker: Arc<Taker>,
    /// The deliveries read from the channel's lanes, waiting for their slots.
    lines: Lines,
}

/// What a call needs.
pub(crate) struct Taker {
    pub conn: RedisConn,
    pub script: Script,
    /// The channel's key.
    pub key: String,
    /// `lua/lanes.lua`.
    pub lanes_script: Script,
    /// The channel's lane state.
    pub lanes_key: String,
    /// Redis commands sent (shared with the store's counter).
    pub calls: Arc<AtomicU64>,
    /// The channel's name (the label of `quota_worker_channel_rate`).
    pub channel: String,
    /// The interval (µs) last shown in `quota_worker_channel_rate`; 0: none yet.
    pub shown: AtomicU64,
}

/// Calls out at once for one channel.
pub(crate) const OUTSTANDING: usize = 4;
/// Most jobs in one call.
pub(crate) const MAX_BATCH: usize = 256;

impl RateBatcher {
    /// A batcher and its task (which ends when the batcher is dropped). Call inside
    /// a Tokio runtime.
    pub fn start(taker: Taker) -> RateBatcher {
        let taker = Arc::new(taker);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(taker.clone(), rx));
        RateBatcher {
            tx,
            taker,
            lines: Lines::default(),
        }
    }

    /// Wait in `ask.lane`'s line of this worker for a slot (see [`super::rate_line`]).
    pub async fn slot(&self, rate: Rate, ask: LaneAsk) -> Result<Slot, StoreError> {
        self.lines.slot(&self.taker, rate, ask).await
    }

    /// How far ahead this worker's lane lines take slots now.
    pub fn lane_ahead(&self) -> Duration {
        self.lines.ahead()
    }

    /// Take one job of `rate.cost` from the channel's rate (in `lane` when given).
    pub async fn take(&self, rate: Rate, lane: Option<LaneAsk>) -> Reply {
        let (reply_tx, reply_rx) = oneshot::channel();
        if self.tx.send(((rate, lane), reply_tx)).is_err() {
            // the task is gone (its runtime shut down): ask directly (boxed: every
            // take's future would otherwise carry this rare path's state)
            return Box::pin(self.direct(rate, lane)).await;
        }
        answered(reply_rx.await)
    }

    /// One take asked without the batching task.
    async fn direct(&self, rate: Rate, lane: Option<LaneAsk>) -> Reply {
        let (tx, rx) = oneshot::channel();
        self.taker.answer((rate, lane), vec![tx]).await;
        answered(rx.await)
    }
}

/// A take's reply, or an error if its sender was dropped unanswered.
fn answered(reply: Result<Reply, oneshot::error::RecvError>) -> Reply {
    reply.unwrap_or_else(|_| Err(StoreError::Batch("the rate task stopped".into())))
}

impl AskSlots for Taker {
    fn channel(&self) -> &str {
        &self.channel
    }

    async fn slots(
        &self,
        (rate, ask): (Rate, LaneAsk),
        wanted: usize,
        ahead: Duration,
    ) -> Result<Granted, StoreError> {
        super::conn::count_call(&self.calls);
        let keys = (self.key.clone(), self.lanes_key.clone());
        let ahead = Some(ahead.as_micros() as u64);
        let reply = call_lanes(
            &self.conn,
            &self.lanes_script,
            keys,
            rate,
            ask,
            wanted,
            ahead,
        )
        .await?;
        granted(&reply).ok_or(StoreError::Reply {
            script: "lanes.lua",
            reply,
        })
    }
}

impl Taker {
    /// One call for `asks` (all of one rate and lane), each told its answer.
    async fn answer(&self, (rate, lane): Ask, asks: Vec<oneshot::Sender<Reply>>) {
        super::conn::count_call(&self.calls);
        let result = match lane {
            None => {
                let key = self.key.clone();
                take_many_paced(&self.conn, &self.script, key, rate, rate.cost, asks.len()).await
            }
            Some(ask) => {
                let keys = (self.key.clone(), self.lanes_key.clone());
                let script = &self.lanes_script;
                take_many_in_lane(&self.conn, script, keys, rate, ask, asks.len())
                    .await
                    .map(|replies| (replies, None))
            }
        };
        match result {
            Ok((replies, paced)) => {
                // the gauge moves only when the interval in force does
                let interval = paced.unwrap_or(rate.interval_us);
                if self.shown.swap(interval, Ordering::Relaxed) != interval {
                    crate::metrics::channel_rate(&self.channel, rate, Some(interval));
                }
                for (tx, reply) in asks.into_iter().zip(replies) {
                    let _ = tx.send(Ok(reply));
                }
            }
            Err(e) => super::fail_all(e, asks),
        }
    }
}

async fn run(taker: Arc<Taker>, mut rx: mpsc::UnboundedReceiver<(Ask, oneshot::Sender<Reply>)>) {
    let permits = Arc::new(Semaphore::new(OUTSTANDING));
    while let Some((permit, batch)) = super::next_batch(&mut rx, &permits, MAX_BATCH).await {
        // one call per rate and lane among them (a reload may change the rate
        // while jobs ask)
        let mut groups: Vec<(Ask, Vec<oneshot::Sender<Reply>>)> = Vec::new();
        for (rate, tx) in batch {
            match groups.iter_mut().find(|(r, _)| *r == rate) {
                Some((_, txs)) => txs.push(tx),
                None => groups.push((rate, vec![tx])),
            }
        }
        let taker = taker.clone();
        tokio::spawn(async move {
            for (rate, txs) in groups {
                taker.answer(rate, txs).await;
            }
            drop(permit);
        });
    }
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
