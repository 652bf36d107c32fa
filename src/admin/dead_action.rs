//! A replay or a purge that touches exactly the dead letters it showed.
//!
//! A confirmation takes a snapshot ([`take`]): the index's entries the filter
//! selects then, stored in Redis under a token (`prefix:{dead}:v2:snapshot:T`, an
//! hour) that the confirming form carries. Carrying it out ([`carry_out`]) walks
//! the queue once ([`super::DeadLetters::walk`]) and replays or purges a message
//! only if its print ([`super::dead_select::print`]) is one the snapshot listed,
//! each as many times as listed; every other message, one that arrived since
//! included, is put back at the tail untouched (the kept ones keep their order
//! among themselves; letters arriving meanwhile land among them). It refuses when
//! an entry listed is gone from the index (replayed or purged since: the set
//! changed), while another replay or purge walks the queue (a lease,
//! `prefix:{dead}:v2:walking`), and a second time for one token (an idempotency
//! key, `prefix:{dead}:v2:done:T`, a day, holding what the first did). Afterwards
//! the index forgets the entries touched, and those the whole walk did not find
//! (the queue no longer holds them), so that the list agrees with the queue.
//!
//! A worker that dies mid-walk loses nothing (see [`super::dead_letters`]); the
//! token stays used, its outcome unknown, and the letters not yet touched are
//! still listed for a new confirmation.

use std::time::Duration;

use lapin::Connection;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::dead_index::{self, Entry};
use super::dead_select::{print, Prints};
use super::{AdminError, DeadLetters, WalkAction, WalkReport};
use crate::amqp::Topology;
use crate::config::Settings;
use crate::quota::keys::Keys;
use crate::redis::{RedisConn, StoreError};
use crate::store::QuotaStore;

/// How long a confirmation holds its snapshot.
const SNAPSHOT_FOR: Duration = Duration::from_secs(3600);

/// How long a token, once used, answers that it was.
const DONE_FOR: Duration = Duration::from_secs(86_400);

/// How long a walk's lease lasts (a walk of the largest queues ends well within).
const WALK_FOR: Duration = Duration::from_secs(1800);

/// What an action does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// Publish them again to the jobs exchange.
    Replay,
    /// Delete them.
    Purge,
}

impl Verb {
    /// From a form's or a command's word.
    pub fn parse(word: &str) -> Option<Verb> {
        match word {
            "replay" => Some(Verb::Replay),
            "purge" => Some(Verb::Purge),
            _ => None,
        }
    }

    /// The form's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Replay => "replay",
            Verb::Purge => "purge",
        }
    }

    /// The word on a button: "Replay", "Purge".
    pub fn title(self) -> &'static str {
        match self {
            Verb::Replay => "Replay",
            Verb::Purge => "Purge",
        }
    }

    /// What a walk does with a letter it touches.
    pub fn walk_action(self) -> WalkAction {
        match self {
            Verb::Replay => WalkAction::Replay,
            Verb::Purge => WalkAction::Drop,
        }
    }

    fn done(self) -> &'static str {
        match self {
            Verb::Replay => "replayed",
            Verb::Purge => "purged",
        }
    }
}

/// The set a confirmation showed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Its token.
    pub token: String,
    /// What is to be done.
    pub verb: Verb,
    /// The filter that selected it, in words.
    pub filter: String,
    /// The index's entries (their summaries), newest first.
    pub keys: Vec<String>,
}

/// What carrying a snapshot out came to.
#[derive(Debug, Clone, PartialEq)]
pub enum Carried {
    /// Done: what was done.
    Done(Outcome),
    /// This token was used before: what it did then.
    Already(String),
    /// Entries listed are gone from the index: nothing done.
    Changed {
        /// Listed and gone.
        gone: usize,
        /// Listed.
        of: usize,
    },
    /// No snapshot with this token (never taken, or expired).
    Unknown,
    /// Another replay or purge walks the queue now.
    Busy,
}

/// What a carried-out snapshot touched.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// What was done.
    pub verb: Verb,
    /// Letters listed.
    pub listed: usize,
    /// The prints of the letters touched, in queue order.
    pub touched: Vec<String>,
    /// Listed letters the walk did not find in the queue (forgotten in the index).
    pub missing: usize,
    /// The walk.
    pub walk: WalkReport,
    /// The outcome in one sentence.
    pub said: String,
}

fn key(keys: &Keys, what: &str, token: &str) -> String {
    format!("{}:{{dead}}:v2:{what}:{token}", keys.prefix())
}

/// Take a snapshot of `selected` (summaries from [`dead_index::select`]) for
/// `verb`, selected by `filter` (in words).
pub async fn take(
    conn: &RedisConn,
    keys: &Keys,
    verb: Verb,
    filter: String,
    selected: Vec<String>,
) -> Result<Snapshot, StoreError> {
    let snapshot = Snapshot {
        token: uuid::Uuid::new_v4().simple().to_string(),
        verb,
        filter,
        keys: selected,
    };
    let mut c = conn.clone();
    redis::cmd("SET")
        .arg(key(keys, "snapshot", &snapshot.token))
        .arg(serde_json::to_string(&snapshot).unwrap_or_default())
        .arg("PX")
        .arg(SNAPSHOT_FOR.as_millis() as u64)
        .query_async::<()>(&mut c)
        .await?;
    Ok(snapshot)
}

/// The snapshot with `token`, if it is still held.
pub async fn load(
    conn: &RedisConn,
    keys: &Keys,
    token: &str,
) -> Result<Option<Snapshot>, StoreError> {
    let mut c = conn.clone();
    let json: Option<String> = redis::cmd("GET")
        .arg(key(keys, "snapshot", token))
        .query_async(&mut c)
        .await?;
    Ok(json.and_then(|j| serde_json::from_str(&j).ok()))
}

/// Carry out the snapshot `token` (the index caught up first by the caller), as
/// the module docs say.
pub async fn carry_out(
    amqp: &Connection,
    store: &QuotaStore,
    settings: &Settings,
    token: &str,
) -> Result<Carried, AdminError> {
    let (conn, keys) = (store.connection(), store.keys());
    let done_key = key(keys, "done", token);
    let mut c = conn.clone();
    if let Some(said) = redis::cmd("GET")
        .arg(&done_key)
        .query_async::<Option<String>>(&mut c)
        .await?
    {
        return Ok(Carried::Already(said));
    }
    let Some(snapshot) = load(&conn, keys, token).await? else {
        return Ok(Carried::Unknown);
    };
    let entries = dead_index::read(&conn, keys, &snapshot.keys).await?;
    if entries.len() < snapshot.keys.len() {
        return Ok(Carried::Changed {
            gone: snapshot.keys.len() - entries.len(),
            of: snapshot.keys.len(),
        });
    }
    let lease = format!("{}:{{dead}}:v2:walking", keys.prefix());
    if !claim(&conn, &lease, token, WALK_FOR).await? {
        return Ok(Carried::Busy);
    }
    let claimed = claim(&conn, &done_key, "under way", DONE_FOR).await;
    let outcome = match claimed {
        Ok(true) => Some(walk(amqp, store, settings, &snapshot, &entries).await),
        Ok(false) => None,
        Err(e) => Some(Err(e)),
    };
    let script = &store.scripts().dead.lease;
    let _ = crate::redis::lease::renew_or_end(&conn, script, &lease, token, None).await;
    let Some(outcome) = outcome else {
        return Ok(Carried::Already("under way".into()));
    };
    let said = match &outcome {
        Ok(o) => o.said.clone(),
        Err(e) => format!("failed ({e}); what was not touched is still listed"),
    };
    let _ = redis::cmd("SET")
        .arg(&done_key)
        .arg(&said)
        .arg("PX")
        .arg(DONE_FOR.as_millis() as u64)
        .query_async::<()>(&mut c)
        .await;
    let _ = redis::cmd("DEL")
        .arg(key(keys, "snapshot", token))
        .query_async::<()>(&mut c)
        .await;
    outcome.map(Carried::Done)
}

/// `SET key value NX PX ttl`: whether it was set.
async fn claim(
    conn: &RedisConn,
    key: &str,
    value: &str,
    ttl: Duration,
) -> Result<bool, AdminError> {
    let mut c = conn.clone();
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(ttl.as_millis() as u64)
        .query_async(&mut c)
        .await?;
    Ok(set.is_some())
}

/// Walk the queue once, doing the snapshot's verb to the letters whose prints
/// `entries` list, then forget in the index what was touched (and, after a whole
/// walk, what was not found).
async fn walk(
    amqp: &Connection,
    store: &QuotaStore,
    settings: &Settings,
    snapshot: &Snapshot,
    entries: &[Entry],
) -> Result<Outcome, AdminError> {
    let topology = Topology::from_settings(settings);
    let mut wanted = Prints::of(entries.iter().map(|e| e.print.as_str()));
    let mut touched = Vec::new();
    let action = snapshot.verb.walk_action();
    let walked = DeadLetters::new(amqp, &topology, settings.amqp.publish_timeout.0)
        .walk(&CancellationToken::new(), |d| {
            let p = print(&d.properties, &d.data);
            if wanted.take(&p) {
                touched.push(p);
                action
            } else {
                WalkAction::Keep
            }
        })
        .await;
    let whole = walked
        .as_ref()
        .is_ok_and(|r| r.visited == r.found && !r.interrupted);
    let mut were = Prints::of(touched.iter().map(String::as_str));
    let forget: Vec<String> = entries
        .iter()
        .filter(|e| were.take(&e.print) || whole)
        .map(|e| e.key.clone())
        .collect();
    dead_index::forget(&store.connection(), store.keys(), &forget).await?;
    let walk = walked?;
    let missing = if whole { wanted.left() as usize } else { 0 };
    let said = say(snapshot, touched.len(), missing, &walk);
    Ok(Outcome {
        verb: snapshot.verb,
        listed: entries.len(),
        touched,
        missing,
        walk,
        said,
    })
}

fn say(snapshot: &Snapshot, touched: usize, missing: usize, walk: &WalkReport) -> String {
    let mut said = format!(
        "{} of the {} dead letter(s) listed for {} {}",
        touched,
        snapshot.keys.len(),
        snapshot.filter,
        snapshot.verb.done()
    );
    if missing > 0 {
        said.push_str(&format!(
            "; {missing} listed were no longer in the queue (no longer listed either)"
        ));
    }
    said.push_str(&format!(
        "; {} other(s) put back at the tail of the queue, in their order.",
        walk.kept
    ));
    said
}

/// Forget in the index the entries of the letters with `prints` (each as many
/// times as it comes, the oldest entries first): what `admin dead` touched.
pub async fn forget_prints(
    conn: &RedisConn,
    keys: &Keys,
    prints: &[String],
) -> Result<(), StoreError> {
    let mut counted: Vec<(&str, usize)> = Vec::new();
    for p in prints {
        match counted.iter_mut().find(|(q, _)| *q == p.as_str()) {
            Some((_, n)) => *n += 1,
            None => counted.push((p, 1)),
        }
    }
    let mut chosen = Vec::new();
    for (p, n) in counted {
        let mut with = dead_index::with_print(conn, keys, p).await?;
        with.truncate(n);
        chosen.extend(with);
    }
    dead_index::forget(conn, keys, &chosen).await
}
