//! `lua/digest_fold.lua`: a job folded into its group's open digest, then the
//! digest put in the index of close instants; its arguments ([`Fold`]) and its
//! reply ([`Folded`]).

use redis::Script;

use crate::quota::keys::DigestGroup;
use crate::redis::conn::RedisConn;
use crate::redis::StoreError;

/// The script's answer codes (`FOLD` in `lua/digest_fold.lua`; a test checks that
/// both sides name the same numbers).
struct Code;

impl Code {
    const JOINED: i64 = 0;
    const OPENED: i64 = 1;
    const AGAIN: i64 = 2;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 3] = [
        (Code::JOINED, "joined"),
        (Code::OPENED, "opened"),
        (Code::AGAIN, "again"),
    ];
}

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
    let (reply, acked) = match fold_call(&call, &mut conn, wait).await {
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
    let folded = reply.folded()?;
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

/// The fold script's reply, as `lua/digest_fold.lua` gives it: its code, the
/// digest's id and key, when it closes (ms) and whether it is full (1).
struct FoldReply {
    code: i64,
    id: String,
    key: String,
    closes_at: i64,
    full: i64,
}

impl FoldReply {
    /// What the fold did, read by the reply's code.
    fn folded(self) -> Result<Folded, StoreError> {
        let (opened, again) = match self.code {
            Code::OPENED => (true, false),
            Code::AGAIN => (false, true),
            Code::JOINED => (false, false),
            code => {
                return Err(StoreError::Reply {
                    script: "digest_fold.lua",
                    reply: vec![code],
                })
            }
        };
        Ok(Folded {
            opened,
            again,
            id: self.id,
            key: self.key,
            closes_at: self.closes_at,
            full: self.full == 1,
        })
    }
}

impl redis::FromRedisValue for FoldReply {
    fn from_redis_value(v: redis::Value) -> Result<Self, redis::ParsingError> {
        let (code, id, key, closes_at, full) = redis::FromRedisValue::from_redis_value(v)?;
        Ok(FoldReply {
            code,
            id,
            key,
            closes_at,
            full,
        })
    }
}

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
            let (reply, acked) = pipe.query_async(conn).await?;
            Ok((reply, Some(acked)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::redis::lua_tables::speaks_by_name;

    const LUA: &str = include_str!("../../../lua/digest_fold.lua");

    /// The script and [`Code`] name the same answers by the same numbers, and the
    /// script answers by name.
    #[test]
    fn the_script_and_the_reader_name_the_same_answers() {
        speaks_by_name("digest_fold.lua", LUA, "FOLD", &Code::ALL);
    }
}
