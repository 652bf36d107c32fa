//! The takes of a channel's send rate, batched ([`RateBatcher`]): all the jobs of a
//! channel that ask at the same moment share one call of `lua/rate.lua`
//! ([`super::rate`]), or of `lua/lanes.lua` for the jobs of one lane
//! ([`super::lanes`]).
//!
//! A channel's rate is one key, so on a Redis Cluster every job of the channel meets
//! one shard: called once per job, that key would cap the channel at what one Redis
//! core runs of the script (BENCHMARKS.md item 21 measures it). Batched, a call
//! decides as many jobs as asked at once, and the rate itself is unchanged: the
//! script grants them in order, each exactly as if it had come alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::Script;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::conn::RedisConn;
use super::rate::{take_many_paced, RateReply};
use crate::lanes::share::LaneAsk;
use crate::quota::policy::Rate;
use crate::redis::StoreError;

type Reply = Result<RateReply, StoreError>;
/// What one job asks: the rate, and its lane when it has one.
type Ask = (Rate, Option<LaneAsk>);

/// Takes from one channel's rate for the jobs that ask at the same moment in one
/// call (while [`OUTSTANDING`] calls are out, new asks wait and leave together).
pub(crate) struct RateBatcher {
    tx: mpsc::UnboundedSender<(Ask, oneshot::Sender<Reply>)>,
    taker: Arc<Taker>,
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
        RateBatcher { tx, taker }
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
                super::lanes::take_many(&self.conn, script, keys, rate, ask, asks.len())
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
