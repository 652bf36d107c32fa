//! Batched admissions: the admissions waiting at one moment go to Redis as one call
//! of `lua/admit.lua`.
//!
//! Deliveries reach the worker in bursts (a quorum queue hands out what one Raft
//! write made ready), so many jobs ask Redis at once. One script call per job costs
//! Redis a script invocation each (about three quarters of the script's time); one
//! call for the whole burst pays that once, and its jobs all get their answer after
//! one round trip instead of queueing behind each other's calls.
//!
//! There is no timer: a lone admission goes out at once. While [`IN_FLIGHT`] calls
//! are out, new admissions wait and leave together with the next free slot, up to
//! [`MAX_BATCH`] in one call. Within a call the script decides the jobs in order,
//! each seeing what the previous ones recorded, exactly as if they had come one by
//! one. On a Redis Cluster the jobs of one call would live in different hash slots,
//! so there every admission is a call of its own.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use redis::Script;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::engine::{EngineError, Plan, RedisConn};

/// Most jobs in one script call (Redis runs a call without interruption: 128 jobs
/// hold it for well under a millisecond).
pub const MAX_BATCH: usize = 128;
/// Script calls out at once; more admissions wait for a slot and share it.
pub const IN_FLIGHT: usize = 4;

/// One job's admission, as the script takes it.
#[derive(Debug, Clone)]
pub struct AdmitArgs {
    /// The recipient's sorted set.
    pub key: String,
    /// The job id's hash.
    pub member: Vec<u8>,
    /// Calendar bounds for the day Redis is believed to be in (shared by the jobs
    /// of one policy and zone on one day).
    pub plan: Arc<Plan>,
}

type Reply = Result<Vec<i64>, EngineError>;

/// Sends admissions to Redis, batched on a single node, one by one on a cluster.
pub(crate) struct Admitter {
    caller: Arc<Caller>,
    tx: Option<mpsc::UnboundedSender<(AdmitArgs, oneshot::Sender<Reply>)>>,
}

/// What a script call needs.
pub(crate) struct Caller {
    pub conn: RedisConn,
    pub script: Script,
    pub lease_ms: i64,
    pub dedupe_ms: i64,
    /// Redis commands sent (shared with the engine's counter).
    pub calls: Arc<AtomicU64>,
}

impl Admitter {
    /// An admitter; on a single node it starts the batching task (which ends when
    /// the admitter is dropped). Call inside a Tokio runtime.
    pub fn start(caller: Caller) -> Admitter {
        let caller = Arc::new(caller);
        let tx = match caller.conn {
            RedisConn::Single(_) => {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(caller.clone(), rx));
                Some(tx)
            }
            RedisConn::Cluster(_) => None,
        };
        Admitter { caller, tx }
    }

    /// The script's reply for one job.
    pub async fn admit(&self, args: AdmitArgs) -> Reply {
        let args = match &self.tx {
            Some(tx) => {
                let (reply_tx, reply_rx) = oneshot::channel();
                match tx.send((args, reply_tx)) {
                    Ok(()) => {
                        return reply_rx.await.unwrap_or_else(|_| {
                            Err(EngineError::Batch("the batching task stopped".into()))
                        })
                    }
                    // the batching task is gone (its runtime shut down): go direct
                    Err(mpsc::error::SendError((args, _))) => args,
                }
            }
            None => args,
        };
        let mut replies = self.caller.call(&[&args]).await?;
        Ok(replies.pop().unwrap_or_default())
    }
}

impl Caller {
    /// One script call for `jobs`: one reply per job, in order. The distinct plans
    /// go once, each job names its own by number (see `lua/admit.lua`); the command
    /// is built directly (no per-argument buffers) and the script loaded on NOSCRIPT.
    pub async fn call(&self, jobs: &[&AdmitArgs]) -> Result<Vec<Vec<i64>>, EngineError> {
        let same = |a: &Arc<Plan>, b: &Arc<Plan>| Arc::ptr_eq(a, b) || a == b;
        let mut plans: Vec<&Arc<Plan>> = Vec::with_capacity(2);
        let numbers: Vec<usize> = jobs
            .iter()
            .map(|job| match plans.iter().position(|p| same(p, &job.plan)) {
                Some(i) => i + 1,
                None => {
                    plans.push(&job.plan);
                    plans.len()
                }
            })
            .collect();
        // room for every argument, and about 80 bytes of them per job (key, member)
        let mut cmd = redis::Cmd::with_capacity(
            6 + 3 * jobs.len() + plans.iter().map(|p| 4 + 2 * p.rules.len()).sum::<usize>(),
            64 + 80 * jobs.len(),
        );
        cmd.arg("EVALSHA")
            .arg(self.script.get_hash())
            .arg(jobs.len());
        for job in jobs {
            cmd.arg(&job.key);
        }
        cmd.arg(self.lease_ms).arg(self.dedupe_ms).arg(plans.len());
        for p in &plans {
            cmd.arg(p.valid_from_ms)
                .arg(p.valid_until_ms)
                .arg(p.calendar_expiry_ms)
                .arg(p.rules.len());
            for (limit, bound) in &p.rules {
                cmd.arg(*limit).arg(*bound);
            }
        }
        for (job, number) in jobs.iter().zip(numbers) {
            cmd.arg(&job.member[..]).arg(number);
        }
        crate::engine::count_call(&self.calls);
        let mut conn = self.conn.clone();
        let started = std::time::Instant::now();
        let replies: Vec<Vec<i64>> = match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(&mut conn).await?;
                cmd.query_async(&mut conn).await?
            }
            result => result?,
        };
        metrics::histogram!("quota_worker_admission_call_seconds")
            .record(started.elapsed().as_secs_f64());
        if replies.len() != jobs.len() {
            return Err(EngineError::Reply {
                script: "admit.lua",
                reply: vec![replies.len() as i64],
            });
        }
        Ok(replies)
    }

    /// Run one batch and hand each job its reply.
    async fn settle(&self, batch: Vec<(AdmitArgs, oneshot::Sender<Reply>)>) {
        let jobs: Vec<&AdmitArgs> = batch.iter().map(|(args, _)| args).collect();
        metrics::histogram!("quota_worker_admission_batch_jobs").record(jobs.len() as f64);
        match self.call(&jobs).await {
            Ok(replies) => {
                for ((_, tx), reply) in batch.into_iter().zip(replies) {
                    let _ = tx.send(Ok(reply));
                }
            }
            Err(e) => {
                // the call as a whole failed (Redis away, a timeout): every job of it
                // hears so and is retried by its caller
                let text = e.to_string();
                let mut first = Some(e);
                for (_, tx) in batch {
                    let err = match first.take() {
                        Some(e) => e,
                        None => EngineError::Batch(text.clone()),
                    };
                    let _ = tx.send(Err(err));
                }
            }
        }
    }
}

async fn run(
    caller: Arc<Caller>,
    mut rx: mpsc::UnboundedReceiver<(AdmitArgs, oneshot::Sender<Reply>)>,
) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        // everything that queued up while waiting for the slot goes along
        let mut batch = Vec::with_capacity(16);
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        let caller = caller.clone();
        tokio::spawn(async move {
            caller.settle(batch).await;
            drop(slot);
        });
    }
}
