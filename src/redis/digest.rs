//! The digests' scripts: `lua/digest_fold.lua` (a job into its group's open digest),
//! `lua/digest_claim.lua` (the digests due, each for a lease) and
//! `lua/digest_close.lua` (no more items, read them; or not yet: a sliding digest); their arguments and replies,
//! and the plain commands around them (the index of close instants, the end of a
//! digest). What they mean is decided in [`crate::quota::digest`] and the worker.

use redis::Script;

use super::conn::RedisConn;
use crate::quota::keys::DigestGroup;
use crate::redis::StoreError;

/// What a fold did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Folded {
    /// It opened the digest (its first item).
    pub opened: bool,
    /// The job had been folded before (into this digest): nothing was added.
    pub again: bool,
    /// The digest's id (`dg-…`).
    pub id: String,
    /// The digest's key (what the index of close instants holds).
    pub key: String,
    /// When its window ends (ms, Redis time).
    pub closes_at: i64,
    /// This item made it reach its `max_items`: it closes now.
    pub full: bool,
}

/// One job to fold.
#[derive(Debug)]
pub struct Fold<'a> {
    /// Its group's keys.
    pub group: &'a DigestGroup,
    /// The job's id.
    pub job: &'a str,
    /// The item (JSON).
    pub item: &'a str,
    /// The digest's head, for the digest it opens (JSON).
    pub head: &'a str,
    /// The settings it opens with ([`crate::quota::digest::DigestSpec::encoded`]).
    pub spec: &'a str,
    /// Its window, ms.
    pub window_ms: u64,
    /// How long the job's mark is kept, ms.
    pub keep_ms: u64,
    /// `sliding`: the longest the digest stays open, ms (0: a fixed window).
    pub max_window_ms: u64,
    /// The job's collapse key: the digest keeps the newest item with it.
    pub collapse_key: Option<&'a str>,
    /// `held`: when the digest it opens closes (ms); 0: its window from now.
    pub close_at_ms: i64,
}

/// Fold a job into its group's open digest, then put the digest in `index` by the
/// instant it closes (now, if full). The second step is a command of its own (the
/// index is in another hash slot) and idempotent: a worker that dies between the
/// two hands the job back, and its redelivery finds it folded and writes the index.
///
/// With `wait` (`redis.wait_replicas` and `redis.wait_timeout` ms), the script call
/// is followed by `WAIT` in the same pipeline: one round trip, and on a Redis
/// Cluster the pipeline goes to the node that owns the group's slot (the script's
/// keys route it; `WAIT` has none), so the `WAIT` is answered by the master that
/// holds the fold. Fewer replicas than asked within the timeout is an error
/// ([`StoreError::Unreplicated`]): the job is not acked and is folded again (found
/// folded) until they answer. `conn` is then, on a cluster, a connection of the
/// folds' own (a `WAIT` holds the connection it runs on).
pub async fn fold(
    conn: &RedisConn,
    script: &Script,
    index: &str,
    f: &Fold<'_>,
    wait: Option<(u32, u64)>,
) -> Result<Folded, StoreError> {
    let mut conn = conn.clone();
    let mark = format!("{}{}", f.group.mark_base, f.job);
    let mut call = redis::cmd("EVALSHA");
    call.arg(script.get_hash())
        .arg(2)
        .arg(&f.group.key)
        .arg(&mark)
        .arg(&f.group.base)
        .arg(&f.group.group)
        .arg(f.job)
        .arg(f.item)
        .arg(f.head)
        .arg(f.spec)
        .arg(f.window_ms)
        .arg(f.keep_ms)
        .arg(f.max_window_ms)
        .arg(f.collapse_key.unwrap_or(""))
        .arg(f.close_at_ms);
    let ((code, id, key, closes_at, full), acked) = match fold_call(&call, &mut conn, wait).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(&mut conn).await?;
            fold_call(&call, &mut conn, wait).await?
        }
        result => result?,
    };
    if let (Some((wanted, _)), Some(acked)) = (wait, acked) {
        if acked < i64::from(wanted) {
            return Err(StoreError::Unreplicated {
                reserved_at: 0,
                recorded: false,
                acked,
                wanted,
            });
        }
    }
    if !(0..=2).contains(&code) {
        return Err(StoreError::Reply {
            script: "digest_fold.lua",
            reply: vec![code],
        });
    }
    let folded = Folded {
        opened: code == 1,
        again: code == 2,
        id,
        key,
        closes_at,
        full: full == 1,
    };
    // opened (or found again: the index may not have it yet) or full: the index
    // learns when it closes; `LT` never puts off a close already due
    if folded.opened || folded.again || folded.full {
        let at = if folded.full { 0 } else { folded.closes_at };
        let _: i64 = redis::cmd("ZADD")
            .arg(index)
            .arg("LT")
            .arg(at)
            .arg(&folded.key)
            .query_async(&mut conn)
            .await?;
    }
    Ok(folded)
}

/// The fold script's reply, as `lua/digest_fold.lua` gives it.
type FoldReply = (i64, String, String, i64, i64);

/// Send the fold script's call, followed by `WAIT` in the same pipeline when
/// waiting is on: its reply, and how many replicas acknowledged.
async fn fold_call(
    call: &redis::Cmd,
    conn: &mut RedisConn,
    wait: Option<(u32, u64)>,
) -> redis::RedisResult<(FoldReply, Option<i64>)> {
    match wait {
        None => Ok((call.query_async(conn).await?, None)),
        Some((replicas, timeout_ms)) => {
            let mut pipe = redis::pipe();
            pipe.add_command(call.clone())
                .cmd("WAIT")
                .arg(replicas)
                .arg(timeout_ms);
            let (reply, acked): (FoldReply, i64) = pipe.query_async(conn).await?;
            Ok((reply, Some(acked)))
        }
    }
}

/// Claim up to `max` digests due to close, each for `lease_ms`.
pub async fn claim(
    conn: &RedisConn,
    script: &Script,
    index: &str,
    lease_ms: u64,
    max: usize,
) -> Result<Vec<String>, StoreError> {
    let mut conn = conn.clone();
    Ok(script
        .key(index)
        .arg(lease_ms)
        .arg(max)
        .invoke_async(&mut conn)
        .await?)
}

/// A closed digest as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// Its head (JSON).
    pub head: String,
    /// The settings it opened with.
    pub spec: String,
    /// Redis time at the close (ms).
    pub now_ms: i64,
    /// Its items (JSON), in the order they were folded.
    pub items: Vec<String>,
}

/// What a close found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Close {
    /// The digest is gone (done already).
    Gone,
    /// A later item moved its close to this instant (ms; `sliding`): it stays open.
    NotYet(i64),
    /// Closed: no item joins it from now on.
    Closed(Closed),
}

/// Close the digest at `key` (see `lua/digest_close.lua`): when it is due, or now
/// whatever its close instant (`now`: a flush).
pub async fn close(
    conn: &RedisConn,
    script: &Script,
    key: &str,
    now: bool,
) -> Result<Close, StoreError> {
    let Some((meta, items, order)) = crate::quota::keys::digest_keys(key) else {
        return Ok(Close::Gone);
    };
    let mut conn = conn.clone();
    let reply: Vec<String> = script
        .key(&meta)
        .key(&items)
        .key(&order)
        .arg(if now { "now" } else { "due" })
        .invoke_async(&mut conn)
        .await?;
    let mut parts = reply.into_iter();
    match parts.next().as_deref() {
        Some("1") => {}
        Some("2") => {
            let at = parts
                .next()
                .and_then(|t| t.parse().ok())
                .unwrap_or_default();
            return Ok(Close::NotYet(at));
        }
        _ => return Ok(Close::Gone),
    }
    let head = parts.next().unwrap_or_default();
    let spec = parts.next().unwrap_or_default();
    let now_ms = parts
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_default();
    let items = parts.collect();
    Ok(Close::Closed(Closed {
        head,
        spec,
        now_ms,
        items,
    }))
}

/// A digest claimed too early (its close moved ahead) goes back in the index at
/// `at` (ms), its claim dropped.
pub async fn reschedule(
    conn: &RedisConn,
    index: &str,
    key: &str,
    at: i64,
) -> Result<(), StoreError> {
    let mut conn = conn.clone();
    let _: i64 = redis::cmd("ZADD")
        .arg(index)
        .arg("XX")
        .arg(at)
        .arg(key)
        .query_async(&mut conn)
        .await?;
    Ok(())
}

/// A closed digest is done with (sent, or it had nothing to send): its keys go,
/// its place in the recipient's open digests, then its place in the index.
pub async fn done(conn: &RedisConn, index: &str, key: &str) -> Result<(), StoreError> {
    let mut conn = conn.clone();
    if let Some((meta, items, order)) = crate::quota::keys::digest_keys(key) {
        let _: i64 = redis::cmd("DEL")
            .arg(&meta)
            .arg(&items)
            .arg(&order)
            .query_async(&mut conn)
            .await?;
    }
    if let Some((set, id)) = crate::quota::keys::digest_set(key) {
        let _: i64 = redis::cmd("SREM")
            .arg(&set)
            .arg(id)
            .query_async(&mut conn)
            .await?;
    }
    let _: i64 = redis::cmd("ZREM")
        .arg(index)
        .arg(key)
        .query_async(&mut conn)
        .await?;
    Ok(())
}

/// A `held` digest refused when it went opens again, closing at `close_at_ms`
/// (see `lua/digest_reopen.lua`), and the index learns when; `false` when it is
/// gone.
pub async fn reopen(
    conn: &RedisConn,
    script: &Script,
    index: &str,
    key: &str,
    close_at_ms: i64,
    keep_ms: u64,
) -> Result<bool, StoreError> {
    let Some((meta, items, order)) = crate::quota::keys::digest_keys(key) else {
        return Ok(false);
    };
    let base = &meta[..meta.rfind("dgm/").unwrap_or(0)];
    let mut conn = conn.clone();
    let done: i64 = script
        .key(&meta)
        .key(&items)
        .key(&order)
        .arg(close_at_ms)
        .arg(base)
        .arg(keep_ms)
        .invoke_async(&mut conn)
        .await?;
    if done == 1 {
        let _: i64 = redis::cmd("ZADD")
            .arg(index)
            .arg(close_at_ms)
            .arg(key)
            .query_async(&mut conn)
            .await?;
    }
    Ok(done == 1)
}
