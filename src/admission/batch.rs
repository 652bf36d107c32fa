//! The admission's script (`src/admission/lua/`), batched: the admissions waiting at one moment go to Redis as one
//! call of the script. The call's arguments are built by [`super::command`] (plans once,
//! two per job, each section where the header says); its reply is read by
//! [`super::protocol`] (each job's answer, by name).
//!
//! Deliveries reach the worker in bursts (a quorum queue hands out what one Raft
//! write made ready), so many jobs ask Redis at once. One script call per job costs
//! Redis a script invocation each (about three quarters of the script's time); one
//! call for the whole burst pays that once, and its jobs all get their answer after
//! one round trip instead of queueing behind each other's calls.
//!
//! There is no timer: a lone admission goes out at once. While [`OUTSTANDING`] calls
//! are out, new admissions wait and leave together with the next free permit, up to
//! [`MAX_BATCH`] in one call. Within a call the script decides the jobs in order,
//! each seeing what the previous ones recorded, exactly as if they had come one by
//! one.
//!
//! On a Redis Cluster the jobs of a batch live in different hash slots, and a call
//! may declare keys of one slot only. So the batch is split by the node that owns
//! each job's slot ([`crate::redis::slots`]), and each node gets one call: it declares the
//! first job's key (which routes it there) and carries the others' keys as
//! arguments, run by a copy of the script flagged `allow-cross-slot-keys` (Redis
//! 7.0 and later). A key the node turns out not to own (the slots moved) answers
//! `elsewhere` having written nothing, and that job is asked again on its own. Each
//! node's jobs are answered as soon as its call is, so a slow node holds only its
//! own jobs.
//!
//! With `redis.wait_replicas`, each call is followed by `WAIT` in the same round
//! trip. `WAIT` holds the connection it runs on, so on a cluster a batch's calls go
//! on connections kept for the admissions, one set lent to each batch in flight
//! ([`RedisConn::dedicated`]); on the shared connection one `WAIT` for a master
//! with no replica answering held up every call queued behind it.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use redis::Script;
use tokio::sync::{mpsc, oneshot, Semaphore};

use super::command::{self, AdmitArgs};
use super::protocol::{self, Verdict};
use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// Most jobs in one script call (Redis runs a call without interruption: 128 jobs
/// hold it for well under a millisecond).
pub(crate) const MAX_BATCH: usize = 128;
/// Script calls out at once; more admissions wait for a permit and share it.
pub(crate) const OUTSTANDING: usize = 4;

type Reply = Result<Verdict, StoreError>;

/// Sends admissions to Redis, batched (on a cluster, one call per node).
pub(crate) struct Admitter {
    caller: Arc<Caller>,
    tx: Option<mpsc::UnboundedSender<(AdmitArgs, oneshot::Sender<Reply>)>>,
}

/// What a script call needs.
pub(crate) struct Caller {
    pub conn: RedisConn,
    pub script: Script,
    /// The script flagged `allow-cross-slot-keys`, for calls that carry keys they
    /// do not declare (a cluster's per-node calls).
    pub cross_slot: Script,
    pub lease_ms: i64,
    pub dedupe_ms: i64,
    /// Redis commands sent (shared with the store's counter).
    pub calls: Arc<AtomicU64>,
    /// `redis.wait_replicas` and `redis.wait_timeout` (ms), when waiting is on.
    pub wait: Option<(u32, u64)>,
    /// With waiting on a cluster, [`OUTSTANDING`] connections of the admissions'
    /// own, one lent to each batch in flight (see [`RedisConn::dedicated`]); empty
    /// otherwise.
    pub waiting: std::sync::Mutex<Vec<RedisConn>>,
    /// The key prefix's length (the suppression section's L).
    pub prefix_len: usize,
}

impl Admitter {
    /// An admitter and its batching task (which ends when the admitter is
    /// dropped). Call inside a Tokio runtime.
    pub fn start(caller: Caller) -> Admitter {
        let caller = Arc::new(caller);
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(caller.clone(), rx));
        Admitter {
            caller,
            tx: Some(tx),
        }
    }

    /// The script's reply for one job.
    pub async fn admit(&self, args: AdmitArgs) -> Reply {
        let args = match &self.tx {
            Some(tx) => {
                let (reply_tx, reply_rx) = oneshot::channel();
                match tx.send((args, reply_tx)) {
                    Ok(()) => {
                        return reply_rx.await.unwrap_or_else(|_| {
                            Err(StoreError::Batch("the batching task stopped".into()))
                        })
                    }
                    // the batching task is gone (its runtime shut down): go direct
                    Err(mpsc::error::SendError((args, _))) => args,
                }
            }
            None => args,
        };
        // boxed: every admission's future would otherwise carry this rare path's
        // state (BENCHMARKS.md item 31)
        Box::pin(self.direct(args)).await
    }

    /// One job asked without the batching task.
    async fn direct(&self, args: AdmitArgs) -> Reply {
        let lent = self.caller.lend();
        let conn = lent.as_ref().unwrap_or(&self.caller.conn);
        let replies = self.caller.call(conn, &[&args], 1).await;
        self.caller.give_back(lent);
        replies?.pop().ok_or(StoreError::Reply {
            script: "admit.lua",
            reply: vec![],
        })?
    }
}

impl Caller {
    /// One script call for `jobs`, declaring the keys of the first `declared` and
    /// carrying the others' as arguments: one reply per job, in order. The script
    /// is loaded on NOSCRIPT. With waiting on, a job admitted by a call that too few
    /// replicas acknowledged, or found reserved by it, gets
    /// [`StoreError::Unreplicated`] instead of its verdict.
    pub async fn call(
        &self,
        conn: &RedisConn,
        jobs: &[&AdmitArgs],
        declared: usize,
    ) -> Result<Vec<Reply>, StoreError> {
        let declared = declared.min(jobs.len());
        // a job's caps are keys it does not declare: on a cluster, that takes the
        // flag (on a single node, Redis does not check)
        let cluster = matches!(conn, RedisConn::Cluster(..));
        let layered = jobs.iter().any(|j| !j.layers.is_empty());
        let script = match declared < jobs.len() || (layered && cluster) {
            true => &self.cross_slot,
            false => &self.script,
        };
        let call = command::Call {
            sha: script.get_hash(),
            lease_ms: self.lease_ms,
            dedupe_ms: self.dedupe_ms,
            prefix_len: self.prefix_len,
        };
        let (cmd, numbering) = command::command(&call, jobs, declared);
        crate::redis::conn::count_call(&self.calls);
        let mut conn = conn.clone();
        let started = std::time::Instant::now();
        let (flat, acked) = match self.call_once(&cmd, &mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.prepare_invoke().load_async(&mut conn).await?;
                self.call_once(&cmd, &mut conn).await?
            }
            result => result?,
        };
        metrics::histogram!(crate::metrics::ADMISSION_CALL_SECONDS)
            .record(started.elapsed().as_secs_f64());
        let verdicts = protocol::verdicts(&flat, jobs.len()).and_then(|(mut verdicts, tail)| {
            numbering.replay(jobs, &mut verdicts, tail)?;
            Some(verdicts)
        });
        let verdicts = verdicts.ok_or(StoreError::Reply {
            script: "admit.lua",
            reply: flat,
        })?;
        let short = self.short_of_replicas(acked);
        Ok(verdicts
            .into_iter()
            .map(|v| unreplicated(short, v))
            .collect())
    }

    /// With waiting on, whether the call's `WAIT` found too few replicas: how many
    /// acknowledged and how many are wanted (counted either way).
    fn short_of_replicas(&self, acked: Option<i64>) -> Option<(i64, u32)> {
        let ((wanted, _), acked) = self.wait.zip(acked)?;
        let short = acked < i64::from(wanted);
        let result = if short { "short" } else { "replicated" };
        metrics::counter!(crate::metrics::REPLICA_WAITS_TOTAL, "result" => result).increment(1);
        short.then_some((acked, wanted))
    }

    /// Send the script call, followed by `WAIT` in the same pipeline when waiting
    /// is on: the flat reply, and how many replicas acknowledged.
    async fn call_once(
        &self,
        cmd: &redis::Cmd,
        conn: &mut RedisConn,
    ) -> redis::RedisResult<(Vec<i64>, Option<i64>)> {
        match self.wait {
            None => Ok((cmd.query_async(conn).await?, None)),
            Some((replicas, timeout_ms)) => {
                let mut pipe = redis::pipe();
                pipe.add_command(cmd.clone())
                    .cmd("WAIT")
                    .arg(replicas)
                    .arg(timeout_ms);
                let (flat, acked): (Vec<i64>, i64) = pipe.query_async(conn).await?;
                Ok((flat, Some(acked)))
            }
        }
    }

    /// The verdicts of one node's jobs (all of them on a single node): one call,
    /// then each job its key's node did not own asked again on its own.
    async fn node_call(
        &self,
        conn: &RedisConn,
        jobs: &[&AdmitArgs],
        declared: usize,
    ) -> Result<Vec<Reply>, StoreError> {
        let mut replies = self.call(conn, jobs, declared).await?;
        for (i, reply) in replies.iter_mut().enumerate() {
            if let Ok(Verdict::Elsewhere(_)) = reply {
                self.conn.slots_moved();
                *reply = self
                    .call(conn, &[jobs[i]], 1)
                    .await?
                    .pop()
                    .ok_or(StoreError::Reply {
                        script: "admit.lua",
                        reply: vec![],
                    })?;
            }
        }
        Ok(replies)
    }

    /// Run one batch and hand each job its reply: one call on a single node; on a
    /// cluster one call per node, all at once, each node's jobs answered as soon as
    /// their call is (a node that fails or is slow holds only its own jobs). With
    /// waiting on a cluster, the batch's calls go on a connection of its own (see
    /// [`RedisConn::dedicated`]).
    async fn answer(&self, batch: Vec<(AdmitArgs, oneshot::Sender<Reply>)>) {
        let lent = self.lend();
        let conn = lent.as_ref().unwrap_or(&self.conn);
        if !matches!(self.conn, RedisConn::Cluster(..)) {
            let jobs: Vec<&AdmitArgs> = batch.iter().map(|(args, _)| args).collect();
            metrics::histogram!(crate::metrics::ADMISSION_BATCH_JOBS).record(jobs.len() as f64);
            let result = self.node_call(conn, &jobs, jobs.len()).await;
            deliver(result, batch);
        } else {
            let map = self.conn.slot_map().await;
            let groups =
                crate::redis::conn::group_by_node(batch.into_iter(), map.as_deref(), |job, m| {
                    m.owner(job.0.key.as_bytes())
                });
            let calls = groups.into_iter().map(|(_, group)| async move {
                let jobs: Vec<&AdmitArgs> = group.iter().map(|(args, _)| args).collect();
                metrics::histogram!(crate::metrics::ADMISSION_BATCH_JOBS).record(jobs.len() as f64);
                let result = self.node_call(conn, &jobs, 1).await;
                deliver(result, group);
            });
            futures_util::future::join_all(calls).await;
        }
        self.give_back(lent);
    }

    /// A connection of the batch's own, when there are some (waiting on a
    /// cluster); else the shared one is used.
    fn lend(&self) -> Option<RedisConn> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give_back(&self, conn: Option<RedisConn>) {
        if let Some(conn) = conn {
            self.waiting
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(conn);
        }
    }
}

/// A verdict of a call whose `WAIT` found too few replicas (`short`): an admission
/// it recorded, or a live reservation it found, is held as
/// [`StoreError::Unreplicated`]; any other verdict stands.
fn unreplicated(short: Option<(i64, u32)>, v: Verdict) -> Reply {
    let Some((acked, wanted)) = short else {
        return Ok(v);
    };
    match v {
        Verdict::Admitted(at, ..) | Verdict::Shadowed(at, ..) => Err(StoreError::Unreplicated {
            reserved_at: at,
            recorded: true,
            acked,
            wanted,
        }),
        // a live reservation: adopting it as this worker's own would dispatch a
        // send no replica may have (the script wrote, so the WAIT covered it;
        // short, it is not known to be replicated)
        Verdict::Reserved(_, at) => Err(StoreError::Unreplicated {
            reserved_at: at,
            recorded: false,
            acked,
            wanted,
        }),
        v => Ok(v),
    }
}

/// Hand each job of `jobs` its reply, or, the call having failed as a whole (Redis
/// away, a timeout), the error: every job of it is retried by its caller.
fn deliver(result: Result<Vec<Reply>, StoreError>, jobs: Vec<(AdmitArgs, oneshot::Sender<Reply>)>) {
    match result {
        Ok(replies) => {
            for ((_, tx), reply) in jobs.into_iter().zip(replies) {
                let _ = tx.send(reply);
            }
        }
        Err(e) => crate::redis::fail_all(e, jobs.into_iter().map(|(_, tx)| tx)),
    }
}

async fn run(
    caller: Arc<Caller>,
    mut rx: mpsc::UnboundedReceiver<(AdmitArgs, oneshot::Sender<Reply>)>,
) {
    let permits = Arc::new(Semaphore::new(OUTSTANDING));
    // everything that queued up while waiting for a permit goes along
    while let Some((permit, batch)) = crate::redis::next_batch(&mut rx, &permits, MAX_BATCH).await {
        let caller = caller.clone();
        tokio::spawn(async move {
            caller.answer(batch).await;
            drop(permit);
        });
    }
}
