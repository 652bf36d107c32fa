//! What the worker notes in Redis besides the caps, and the admin reads back: a
//! job's [`JobNote`] (`admin job ID`), the recipient's set of waiting jobs (how
//! many wait, counted without reading the queues) and the cancel marks. Plain
//! commands, no script: each note is a few writes sent in the committer's pipeline
//! (see `worker::writes`), never a round trip of the job's own.

use chrono::{DateTime, Utc};
use redis::Cmd;

use super::conn::RedisConn;
use crate::job::note::JobNote;
use crate::quota::keys::Keys;
use crate::quota::window;
use crate::redis::StoreError;

/// How often workers look for new cancel marks (their version, one `GET`).
pub(crate) const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(500);

/// A waiting job whose end was not noted (its worker died between the two) stops
/// counting as waiting this long after the instant it waited for.
pub(crate) const WAITING_GRACE_MS: i64 = 3_600_000;

/// One job's note.
#[derive(Debug, Clone)]
pub(crate) struct Note {
    /// The job id.
    pub id: String,
    /// What happened to it; `None` when notes are off (`redis.notes = false`) and
    /// the note only spends a cancel mark.
    pub record: Option<JobNote>,
    /// What becomes of it in its recipient's set of waiting jobs.
    pub waiting: Waiting,
    /// Its cancel mark is spent (it has just been dead-lettered `cancelled`).
    pub spend_cancel: bool,
}

/// A job in its recipient's set of waiting jobs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// It never waited and does not now: nothing to write.
    Untouched,
    /// It waits in the set `key` until `until`.
    Until {
        /// The recipient's set.
        key: String,
        /// The instant it waits for.
        until: DateTime<Utc>,
    },
    /// It waited and has ended: out of the set `key`.
    Gone {
        /// The recipient's set.
        key: String,
    },
}

/// The commands that write `notes`, kept `ttl_ms`: a `SET` of each job's record;
/// then, per recipient, one `ZADD` of its jobs that wait and one `PEXPIRE`, and one
/// `ZREM` of those that ended (a batch often holds many jobs of one recipient: one
/// command for them all, not two each).
pub fn commands(keys: &Keys, notes: &[Note], ttl_ms: u64) -> Vec<Cmd> {
    let mut out = Vec::with_capacity(notes.len() + 4);
    // (key, score, id) of the jobs that wait, and (key, id) of those that ended
    let mut waits: Vec<(&str, i64, &str)> = Vec::new();
    let mut ends: Vec<(&str, &str)> = Vec::new();
    for note in notes {
        if let Some(record) = &note.record {
            // every buffer sized up front: growing them argument by argument cost
            // more than the rest of the note
            let record = record.encode();
            let key = keys.job(&note.id);
            let mut set = Cmd::with_capacity(5, key.len() + record.len() + 32);
            set.arg("SET").arg(key).arg(record).arg("PX").arg(ttl_ms);
            out.push(set);
        }
        if note.spend_cancel {
            let (set, version) = keys.cancelled();
            let mut rem = redis::cmd("ZREM");
            rem.arg(set).arg(&note.id);
            out.push(rem);
            let mut incr = redis::cmd("INCR");
            incr.arg(version);
            out.push(incr);
        }
        match &note.waiting {
            Waiting::Untouched => {}
            // no trim here: a set empties itself (Redis deletes an empty key), and
            // what a dead worker left behind is trimmed when it is read, or expires
            Waiting::Until { key, until } => waits.push((key, until.timestamp_millis(), &note.id)),
            Waiting::Gone { key } => ends.push((key, &note.id)),
        }
    }
    // grouped by key (a stable sort keeps each recipient's jobs in batch order)
    waits.sort_by(|a, b| a.0.cmp(b.0));
    ends.sort_by(|a, b| a.0.cmp(b.0));
    for group in waits.chunk_by(|a, b| a.0 == b.0) {
        let key = group[0].0;
        let bytes = key.len() + group.iter().map(|(_, _, id)| id.len() + 24).sum::<usize>();
        let mut add = Cmd::with_capacity(2 + 2 * group.len(), bytes + 8);
        add.arg("ZADD").arg(key);
        for (_, score, id) in group {
            add.arg(score).arg(id);
        }
        out.push(add);
        let mut expire = Cmd::with_capacity(3, key.len() + 32);
        expire.arg("PEXPIRE").arg(key).arg(ttl_ms);
        out.push(expire);
    }
    for group in ends.chunk_by(|a, b| a.0 == b.0) {
        let key = group[0].0;
        let bytes = key.len() + group.iter().map(|(_, id)| id.len() + 4).sum::<usize>();
        let mut rem = Cmd::with_capacity(2 + group.len(), bytes + 8);
        rem.arg("ZREM").arg(key);
        for (_, id) in group {
            rem.arg(id);
        }
        out.push(rem);
    }
    out
}

/// Job `id`'s note, if one is kept.
pub async fn read(conn: &RedisConn, keys: &Keys, id: &str) -> Result<Option<JobNote>, StoreError> {
    let mut conn = conn.clone();
    let text: Option<String> = redis::cmd("GET")
        .arg(keys.job(id))
        .query_async(&mut conn)
        .await?;
    Ok(text.and_then(|t| JobNote::decode(&t)))
}

/// How many jobs of `recipient` wait at `now`; those whose end went unnoted are
/// dropped from the set [`WAITING_GRACE_MS`] after the instant they waited for.
pub async fn waiting(
    conn: &RedisConn,
    keys: &Keys,
    recipient: &str,
    now: DateTime<Utc>,
) -> Result<u64, StoreError> {
    let mut conn = conn.clone();
    let key = keys.waiting(recipient);
    let (_, count): (i64, u64) = redis::pipe()
        .cmd("ZREMRANGEBYSCORE")
        .arg(&key)
        .arg("-inf")
        .arg(format!("({}", now.timestamp_millis() - WAITING_GRACE_MS))
        .cmd("ZCARD")
        .arg(&key)
        .query_async(&mut conn)
        .await?;
    Ok(count)
}

/// The first `limit` of `recipient`'s waiting jobs, soonest first: each id and
/// the instant it waits for (the console's recipient page).
pub async fn waiting_jobs(
    conn: &RedisConn,
    keys: &Keys,
    recipient: &str,
    limit: usize,
) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
    let mut conn = conn.clone();
    let found: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.waiting(recipient))
        .arg(0)
        .arg(limit.max(1) as isize - 1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    Ok(found
        .into_iter()
        .map(|(id, ms)| (id, crate::quota::window::from_millis(ms as i64)))
        .collect())
}

/// How many of a recipient's waiting jobs [`waiting_zone`] reads the notes of.
const ZONE_LOOKS: isize = 20;

/// The zone the latest-noted of `recipient`'s waiting jobs was decided in, with
/// that job's id and when it was noted; `None` when no waiting job's note knows a
/// zone. Reads the notes of the [`ZONE_LOOKS`] jobs that wait longest (one `GET`
/// each: on a cluster they live on other nodes than the set).
pub async fn waiting_zone(
    conn: &RedisConn,
    keys: &Keys,
    recipient: &str,
) -> Result<Option<(String, JobNote)>, StoreError> {
    let mut conn = conn.clone();
    let ids: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.waiting(recipient))
        .arg(0)
        .arg(ZONE_LOOKS - 1)
        .arg("REV")
        .query_async(&mut conn)
        .await?;
    let mut latest: Option<(String, JobNote)> = None;
    for id in ids {
        let Some(note) = read(&conn, keys, &id).await? else {
            continue;
        };
        let newer = latest.as_ref().is_none_or(|(_, l)| note.at > l.at);
        if note.zone.is_some() && newer {
            latest = Some((id, note));
        }
    }
    Ok(latest)
}

/// Mark job `id` cancelled at `now` (kept `ttl_ms`; older marks are dropped), and
/// raise the version workers watch. Returns whether it was marked already. The
/// mark and the version are two keys in different slots of a cluster, so they go
/// in two calls: the mark first, so that a worker that sees the new version finds it.
pub async fn cancel(
    conn: &RedisConn,
    keys: &Keys,
    id: &str,
    now: DateTime<Utc>,
    ttl_ms: u64,
) -> Result<bool, StoreError> {
    let (set, version) = keys.cancelled();
    let mut conn = conn.clone();
    let (added, _, _): (u32, i64, i64) = redis::pipe()
        .cmd("ZADD")
        .arg(&set)
        .arg("NX")
        .arg(now.timestamp_millis())
        .arg(id)
        .cmd("ZREMRANGEBYSCORE")
        .arg(&set)
        .arg("-inf")
        .arg(format!("({}", now.timestamp_millis() - ttl_ms as i64))
        .cmd("PEXPIRE")
        .arg(&set)
        .arg(ttl_ms)
        .query_async(&mut conn)
        .await?;
    let _: i64 = redis::cmd("INCR")
        .arg(&version)
        .query_async(&mut conn)
        .await?;
    Ok(added == 0)
}

/// The version of the cancel marks (0 before the first).
pub(crate) async fn cancel_version(conn: &RedisConn, keys: &Keys) -> Result<i64, StoreError> {
    let mut conn = conn.clone();
    let v: Option<i64> = redis::cmd("GET")
        .arg(keys.cancelled().1)
        .query_async(&mut conn)
        .await?;
    Ok(v.unwrap_or(0))
}

/// Every cancel mark: job id and when it was cancelled.
pub(crate) async fn cancel_marks(
    conn: &RedisConn,
    keys: &Keys,
) -> Result<Vec<(String, DateTime<Utc>)>, StoreError> {
    let mut conn = conn.clone();
    let marks: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(keys.cancelled().0)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    Ok(marks
        .into_iter()
        .map(|(id, ms)| (id, window::from_millis(ms.round() as i64)))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::note::JobState;

    fn note(id: &str, waiting: Waiting) -> Note {
        let t = window::from_millis(1_000);
        Note {
            id: id.into(),
            record: Some(JobNote {
                step: JobState::Dispatched,
                at: t,
                attempt: 1,
                first_seen: t,
                policy: None,
                channel: "sms".into(),
                zone: None,
                trace_id: None,
                tenant: None,
            }),
            waiting,
            spend_cancel: false,
        }
    }

    fn words(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<other>".into(),
            })
            .collect()
    }

    #[test]
    fn a_recipients_jobs_of_one_batch_share_one_zadd_one_pexpire_and_one_zrem() {
        let keys = Keys::new("qw", "k");
        let until = |ms| Waiting::Until {
            key: "w:a".into(),
            until: window::from_millis(ms),
        };
        let notes = [
            note("j1", until(10)),
            note("j2", Waiting::Untouched),
            note("j3", until(20)),
            note("j4", Waiting::Gone { key: "w:b".into() }),
            note(
                "j5",
                Waiting::Until {
                    key: "w:b".into(),
                    until: window::from_millis(30),
                },
            ),
            note("j6", Waiting::Gone { key: "w:b".into() }),
        ];
        let cmds: Vec<Vec<String>> = commands(&keys, &notes, 500).iter().map(words).collect();
        let verbs: Vec<&str> = cmds.iter().map(|c| c[0].as_str()).collect();
        assert_eq!(
            verbs,
            [
                "SET", "SET", "SET", "SET", "SET", "SET", "ZADD", "PEXPIRE", "ZADD", "PEXPIRE",
                "ZREM"
            ]
        );
        assert_eq!(cmds[6], ["ZADD", "w:a", "10", "j1", "20", "j3"]);
        assert_eq!(cmds[7], ["PEXPIRE", "w:a", "500"]);
        assert_eq!(cmds[8], ["ZADD", "w:b", "30", "j5"]);
        assert_eq!(cmds[10], ["ZREM", "w:b", "j4", "j6"]);
        assert_eq!(cmds[0][3..], ["PX", "500"]);
    }

    #[test]
    fn with_notes_off_only_a_cancel_mark_is_spent() {
        let keys = Keys::new("qw", "k");
        let spent = Note {
            record: None,
            spend_cancel: true,
            ..note("j1", Waiting::Untouched)
        };
        let cmds: Vec<Vec<String>> = commands(&keys, &[spent], 500).iter().map(words).collect();
        let (set, version) = keys.cancelled();
        assert_eq!(
            cmds,
            [
                vec!["ZREM".to_string(), set, "j1".into()],
                vec!["INCR".to_string(), version]
            ]
        );
    }
}
