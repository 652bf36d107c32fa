//! `lua/admit.lua`, batched: the admissions waiting at one moment go to Redis as
//! one call of the script; its arguments (plans once, two per job) and its flat
//! reply ([`verdicts`]).
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
//! each job's slot ([`super::slots`]), and each node gets one call: it declares the
//! first job's key (which routes it there) and carries the others' keys as
//! arguments, run by a copy of the script flagged `allow-cross-slot-keys` (Redis
//! 7.0 and later). A key the node turns out not to own (the slots moved) answers
//! code 7 having written nothing, and that job is asked again on its own. Each
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

use super::conn::RedisConn;
use crate::quota::plan::Plan;
use crate::redis::StoreError;

/// Most jobs in one script call (Redis runs a call without interruption: 128 jobs
/// hold it for well under a millisecond).
pub(crate) const MAX_BATCH: usize = 128;
/// Script calls out at once; more admissions wait for a permit and share it.
pub(crate) const OUTSTANDING: usize = 4;

/// One job's admission, as the script takes it.
#[derive(Debug, Clone)]
pub(crate) struct AdmitArgs {
    /// The recipient's sorted set.
    pub key: String,
    /// The job id's hash.
    pub member: Vec<u8>,
    /// Calendar bounds for the day Redis is believed to be in (shared by the jobs
    /// of one policy and zone on one day).
    pub plan: Arc<Plan>,
    /// The job's channel, given only while some recipient may be suppressed (the
    /// call then carries the suppression section of `lua/admit.lua`).
    pub channel: Option<String>,
    /// Preferences section: category ("": required), channel, priority, quiet (v, ms).
    pub prefs: Option<([String; 3], i64, i64)>,
    /// The caps the job meets, in order (empty for most jobs: then the call carries
    /// nothing more for it).
    pub layers: Vec<LayerArgs>,
}

/// One cap a job meets, as the script takes it.
#[derive(Debug, Clone)]
pub struct LayerArgs {
    /// The cap's sorted set for the job's recipient (in the slot of the job's key).
    pub key: String,
    /// The cap's calendar bounds.
    pub plan: Arc<Plan>,
    /// Whether the cap may refuse the job (else it only counts it).
    pub holds: bool,
}

/// One job's answer from `lua/admit.lua`; each carries the call's Redis time `now`
/// (ms).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Admitted and recorded at `now`; `true` when it took over its own abandoned
    /// reservation (whose dispatch may have gone out: see [`crate::admission::Ticket::inherited`]).
    Admitted(i64, bool),
    /// Refused; the times (ms) of the sends still remembered; the version of the
    /// recipient's quiet hours when they do not allow the job (code 14).
    Refused(i64, Vec<i64>, Option<i64>),
    /// A shadow policy's rules would refuse it; recorded at `now` all the same; the
    /// times (ms) of the other sends still remembered; inherited as for `Admitted`.
    Shadowed(i64, Vec<i64>, bool),
    /// Already dispatched.
    Duplicate(i64),
    /// Another worker's live reservation, made at the second time (ms).
    Reserved(i64, i64),
    /// `now` is outside the day the plan was made for.
    Clock(i64),
    /// The recipient's key holds another type than a sorted set.
    WrongType(i64),
    /// The key is not on the node the call went to (a cluster's slots moved):
    /// nothing was written; ask again with the key declared.
    Elsewhere(i64),
    /// The recipient is suppressed on the job's channel by a kind its policy is
    /// held by: the kind's bit, since and until (ms; 0: until removed).
    Suppressed(i64, u8, i64, i64),
    /// The recipient opted out: 1 its category, 2 its channel, 3 the pair.
    OptedOut(i64, i64),
    /// The recipient has quiet hours (of this version) to compute first.
    Quiet(i64, i64),
    /// A job with layers, refused by its policy or a cap: the times (ms) of the
    /// sends each layer remembers, its policy's first, then each cap's in the order
    /// given (none for a cap that only counts); the quiet hours' version as for
    /// `Refused` (code 15).
    Layered(i64, Vec<Vec<i64>>, Option<i64>),
}

impl Verdict {
    /// Redis time of the call.
    pub fn now(&self) -> i64 {
        match self {
            Verdict::Admitted(now, _)
            | Verdict::Refused(now, ..)
            | Verdict::Shadowed(now, ..)
            | Verdict::Duplicate(now)
            | Verdict::Reserved(now, _)
            | Verdict::Clock(now)
            | Verdict::WrongType(now)
            | Verdict::Elsewhere(now)
            | Verdict::Suppressed(now, ..)
            | Verdict::OptedOut(now, _)
            | Verdict::Quiet(now, _) => *now,
            Verdict::Layered(now, ..) => *now,
        }
    }
}

/// The verdicts of `jobs` jobs from the script's flat reply (see `lua/admit.lua`):
/// `now`, then each job's code followed by what that code carries. `None` if the
/// reply does not have that shape.
pub fn verdicts(flat: &[i64], jobs: usize) -> Option<Vec<Verdict>> {
    let (&now, mut rest) = flat.split_first()?;
    let mut out = Vec::with_capacity(jobs);
    while let Some((&code, tail)) = rest.split_first() {
        rest = tail;
        // 14 and 15: a refusal (0, 8) followed by the quiet hours' version
        let (code, quiet) = match code {
            14 | 15 => {
                let (&v, tail) = rest.split_first()?;
                rest = tail;
                (if code == 14 { 0 } else { 8 }, Some(v))
            }
            _ => (code, None),
        };
        out.push(match code {
            1 | 12 => Verdict::Admitted(now, code == 12),
            0 | 6 | 13 => {
                let (&m, tail) = rest.split_first()?;
                let m = usize::try_from(m).ok().filter(|m| *m <= tail.len())?;
                rest = &tail[m..];
                let times = tail[..m].to_vec();
                match code {
                    0 => Verdict::Refused(now, times, quiet),
                    _ => Verdict::Shadowed(now, times, code == 13),
                }
            }
            2 => Verdict::Duplicate(now),
            3 | 10 | 11 => {
                let at = *rest.first()?;
                rest = &rest[1..];
                match code {
                    3 => Verdict::Reserved(now, at),
                    10 => Verdict::OptedOut(now, at),
                    _ => Verdict::Quiet(now, at),
                }
            }
            4 => Verdict::Clock(now),
            5 => Verdict::WrongType(now),
            7 => Verdict::Elsewhere(now),
            8 => {
                let (&n, tail) = rest.split_first()?;
                rest = tail;
                let mut blocks = Vec::with_capacity(usize::try_from(n).ok()?.min(64));
                for _ in 0..n {
                    let (&m, tail) = rest.split_first()?;
                    let m = usize::try_from(m).ok().filter(|m| *m <= tail.len())?;
                    blocks.push(tail[..m].to_vec());
                    rest = &tail[m..];
                }
                Verdict::Layered(now, blocks, quiet)
            }
            9 => {
                let (v, tail) = (rest.get(..3)?, &rest[3..]);
                rest = tail;
                Verdict::Suppressed(now, u8::try_from(v[0]).ok()?, v[1], v[2])
            }
            _ => return None,
        });
    }
    (out.len() == jobs).then_some(out)
}

type Reply = Result<Verdict, StoreError>;

/// `plan`'s number among the distinct `plans` of a call (1-based), adding it when
/// it is new.
fn plan_number<'a>(plans: &mut Vec<&'a Arc<Plan>>, plan: &'a Arc<Plan>) -> usize {
    let same = |a: &Arc<Plan>| Arc::ptr_eq(a, plan) || **a == **plan;
    match plans.iter().position(|p| same(p)) {
        Some(i) => i + 1,
        None => {
            plans.push(plan);
            plans.len()
        }
    }
}

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
    /// carrying the others' as arguments: one reply per job, in order. The distinct
    /// plans go once, each job names its own by number (see `lua/admit.lua`); the
    /// command is built directly (no per-argument buffers) and the script loaded on
    /// NOSCRIPT. With waiting on, a job admitted by a call that too few replicas
    /// acknowledged, or found reserved by it, gets [`StoreError::Unreplicated`]
    /// instead of its verdict.
    pub async fn call(
        &self,
        conn: &RedisConn,
        jobs: &[&AdmitArgs],
        declared: usize,
    ) -> Result<Vec<Reply>, StoreError> {
        let declared = declared.min(jobs.len());
        let layered = jobs.iter().filter(|j| !j.layers.is_empty()).count();
        // a job's caps are keys it does not declare: on a cluster, that takes the
        // flag (on a single node, Redis does not check)
        let cluster = matches!(conn, RedisConn::Cluster(..));
        let script = match declared < jobs.len() || (layered > 0 && cluster) {
            true => &self.cross_slot,
            false => &self.script,
        };
        let mut plans: Vec<&Arc<Plan>> = Vec::with_capacity(2);
        let numbers: Vec<usize> = jobs
            .iter()
            .map(|job| plan_number(&mut plans, &job.plan))
            .collect();
        let layer_numbers: Vec<Vec<usize>> = match layered {
            0 => Vec::new(),
            _ => jobs
                .iter()
                .map(|job| {
                    let layers = job.layers.iter();
                    layers.map(|l| plan_number(&mut plans, &l.plan)).collect()
                })
                .collect(),
        };
        // room for every argument, and about 80 bytes of them per job (key, member)
        let mut cmd = redis::Cmd::with_capacity(
            6 + 3 * jobs.len() + plans.iter().map(|p| 5 + 2 * p.rules.len()).sum::<usize>(),
            64 + 80 * jobs.len(),
        );
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(declared);
        for job in &jobs[..declared] {
            cmd.arg(&job.key);
        }
        cmd.arg(self.lease_ms)
            .arg(self.dedupe_ms)
            .arg(jobs.len() - declared)
            .arg(plans.len());
        for p in &plans {
            cmd.arg(p.valid_from_ms)
                .arg(p.valid_until_ms)
                .arg(p.calendar_expiry_ms)
                .arg(u8::from(p.shadow))
                .arg(p.rules.len());
            for (limit, bound) in &p.rules {
                cmd.arg(*limit).arg(*bound);
            }
        }
        for (job, number) in jobs.iter().zip(numbers) {
            cmd.arg(&job.member[..]).arg(number);
        }
        for job in &jobs[declared..] {
            cmd.arg(&job.key);
        }
        if layered > 0 {
            // the layers section (see `lua/admit.lua`)
            cmd.arg("L").arg(layered);
            for (k, (job, numbers)) in jobs.iter().zip(&layer_numbers).enumerate() {
                if job.layers.is_empty() {
                    continue;
                }
                cmd.arg(k + 1).arg(job.layers.len());
                for (layer, number) in job.layers.iter().zip(numbers) {
                    cmd.arg(&layer.key).arg(*number).arg(u8::from(layer.holds));
                }
            }
        }
        if jobs.iter().any(|j| j.channel.is_some()) {
            // the suppression section (see `lua/admit.lua`)
            cmd.arg("S").arg(self.prefix_len);
            for p in &plans {
                cmd.arg(p.suppressed_by);
            }
            for job in jobs {
                cmd.arg(job.channel.as_deref().unwrap_or(""));
            }
        }
        // the preferences section (see `lua/admit.lua`)
        if jobs.iter().any(|j| j.prefs.is_some()) {
            cmd.arg("P").arg(self.prefix_len);
            let none = Default::default();
            for job in jobs {
                let (words, version, until) = job.prefs.as_ref().unwrap_or(&none);
                cmd.arg(&words[..]).arg(version).arg(until);
            }
        }
        super::conn::count_call(&self.calls);
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
        let verdicts = verdicts(&flat, jobs.len()).ok_or(StoreError::Reply {
            script: "admit.lua",
            reply: flat,
        })?;
        let short = match (self.wait, acked) {
            (Some((wanted, _)), Some(acked)) => {
                let short = acked < i64::from(wanted);
                let result = if short { "short" } else { "replicated" };
                metrics::counter!(crate::metrics::REPLICA_WAITS_TOTAL, "result" => result)
                    .increment(1);
                short.then_some((acked, wanted))
            }
            _ => None,
        };
        Ok(verdicts
            .into_iter()
            .map(|v| match (short, &v) {
                (Some((acked, wanted)), Verdict::Admitted(at, _) | Verdict::Shadowed(at, ..)) => {
                    Err(StoreError::Unreplicated {
                        reserved_at: *at,
                        recorded: true,
                        acked,
                        wanted,
                    })
                }
                // a live reservation: adopting it as this worker's own would
                // dispatch a send no replica may have (the script wrote, so the
                // WAIT covered it; short, it is not known to be replicated)
                (Some((acked, wanted)), Verdict::Reserved(_, at)) => {
                    Err(StoreError::Unreplicated {
                        reserved_at: *at,
                        recorded: false,
                        acked,
                        wanted,
                    })
                }
                _ => Ok(v),
            })
            .collect())
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
            let groups = super::conn::group_by_node(batch.into_iter(), map.as_deref(), |job, m| {
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

/// Hand each job of `jobs` its reply, or, the call having failed as a whole (Redis
/// away, a timeout), the error: every job of it is retried by its caller.
fn deliver(result: Result<Vec<Reply>, StoreError>, jobs: Vec<(AdmitArgs, oneshot::Sender<Reply>)>) {
    match result {
        Ok(replies) => {
            for ((_, tx), reply) in jobs.into_iter().zip(replies) {
                let _ = tx.send(reply);
            }
        }
        Err(e) => super::fail_all(e, jobs.into_iter().map(|(_, tx)| tx)),
    }
}

async fn run(
    caller: Arc<Caller>,
    mut rx: mpsc::UnboundedReceiver<(AdmitArgs, oneshot::Sender<Reply>)>,
) {
    let permits = Arc::new(Semaphore::new(OUTSTANDING));
    // everything that queued up while waiting for a permit goes along
    while let Some((permit, batch)) = super::next_batch(&mut rx, &permits, MAX_BATCH).await {
        let caller = caller.clone();
        tokio::spawn(async move {
            caller.answer(batch).await;
            drop(permit);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::{verdicts, Verdict};

    #[test]
    fn a_flat_reply_splits_into_each_jobs_verdict() {
        let now = 1_700_000_000_000;
        let flat = [
            now, 1, 0, 2, 10, 20, 2, 3, 55, 4, 0, 0, 5, 6, 1, 30, 7, 8, 3, 1, 5, 0, 2, 6, 7, 9, 4,
            9, 0, 12, 13, 1, 40,
        ];
        assert_eq!(
            verdicts(&flat, 13),
            Some(vec![
                Verdict::Admitted(now, false),
                Verdict::Refused(now, vec![10, 20], None),
                Verdict::Duplicate(now),
                Verdict::Reserved(now, 55),
                Verdict::Clock(now),
                Verdict::Refused(now, vec![], None),
                Verdict::WrongType(now),
                Verdict::Shadowed(now, vec![30], false),
                Verdict::Elsewhere(now),
                Verdict::Layered(now, vec![vec![5], vec![], vec![6, 7]], None),
                Verdict::Suppressed(now, 4, 9, 0),
                Verdict::Admitted(now, true),
                Verdict::Shadowed(now, vec![40], true),
            ])
        );
        assert_eq!(Verdict::Reserved(now, 55).now(), now);
    }

    #[test]
    fn a_refusal_with_quiet_hours_carries_their_version() {
        let now = 1_700_000_000_000;
        let flat = [now, 14, 7, 1, 10, 15, 8, 2, 1, 5, 0, 1];
        assert_eq!(
            verdicts(&flat, 3),
            Some(vec![
                Verdict::Refused(now, vec![10], Some(7)),
                Verdict::Layered(now, vec![vec![5], vec![]], Some(8)),
                Verdict::Admitted(now, false),
            ])
        );
        assert_eq!(verdicts(&[now, 14], 1), None, "no version");
        assert_eq!(verdicts(&[now, 14, 7], 1), None, "no refusal after it");
    }

    #[test]
    fn a_reply_of_another_shape_is_refused() {
        let now = 1_700_000_000_000;
        assert_eq!(verdicts(&[], 0), None, "no time");
        assert_eq!(verdicts(&[now, 1], 2), None, "a job short");
        assert_eq!(verdicts(&[now, 1, 1], 1), None, "a job over");
        assert_eq!(verdicts(&[now, 10], 1), None, "an unknown code");
        assert_eq!(
            verdicts(&[now, 0, 3, 10, 20], 1),
            None,
            "fewer times than said"
        );
        assert_eq!(verdicts(&[now, 0, -1], 1), None, "a negative count");
        assert_eq!(verdicts(&[now, 3], 1), None, "no reservation time");
        assert_eq!(verdicts(&[now, 8, 2, 1, 5], 1), None, "a layer short");
        assert_eq!(verdicts(&[now, 9, 1, 2], 1), None, "a suppression short");
        assert_eq!(verdicts(&[now], 0), Some(vec![]));
    }
}
