//! Deleting what the steps declared: queues and exchanges on the broker, keys in
//! Redis (by prefix, or node by node on a cluster), now or at the end of the run.

use std::time::Duration;

use anyhow::Result;
use quota_worker::amqp::{dead_log_name, delete_all, Topology};
use quota_worker::config::Settings;

use crate::broker::{closed, connect};
use crate::ceiling::ceiling_queues;

/// Deletes what the steps declared: right after each step, or, for long runs, all at
/// the end. RabbitMQ 3.10's quorum-queue segment writer can crash (closing every
/// connection) while it truncates the segments of a queue of a million messages
/// deleted a moment before; a run that deletes nothing until it has measured
/// everything is not broken off by it.
pub struct Teardown {
    amqp: String,
    defer: bool,
    pending: std::sync::Mutex<Vec<Leftover>>,
}

/// What a step leaves to delete.
enum Leftover {
    /// A ceiling's two queues.
    Ceiling(Settings),
    /// A worker's whole topology and its Redis keys.
    Namespace(Settings),
    /// A worker's whole topology; its keys are someone else's to delete.
    Topology(Settings),
}

impl Teardown {
    /// Deletes on the broker at `amqp`; with `defer`, only in [`Teardown::finish`].
    pub fn new(amqp: &str, defer: bool) -> Teardown {
        Teardown {
            amqp: amqp.to_string(),
            defer,
            pending: Default::default(),
        }
    }

    /// Delete the ceiling's queues of `s` (now, or at the end of the run).
    pub async fn ceiling(&self, s: &Settings) {
        self.delete(Leftover::Ceiling(s.clone())).await;
    }

    /// Delete the topology and keys of `s` (now, or at the end of the run).
    pub async fn namespace(&self, s: &Settings) {
        self.delete(Leftover::Namespace(s.clone())).await;
    }

    /// Delete the topology of `s`, not its keys (now, or at the end of the run).
    pub async fn topology(&self, s: &Settings) {
        self.delete(Leftover::Topology(s.clone())).await;
    }

    async fn delete(&self, what: Leftover) {
        if self.defer {
            self.pending.lock().unwrap().push(what);
        } else {
            self.delete_now(what).await;
        }
    }

    async fn delete_now(&self, what: Leftover) {
        let Ok(conn) = connect(&self.amqp).await else {
            return;
        };
        // a busy broker can fail the delete of a quorum queue holding 200,000
        // messages: try again a few times, then say what is left
        let (queues, exchanges, keys) = match &what {
            Leftover::Ceiling(s) => (ceiling_queues(s).to_vec(), Vec::new(), None),
            Leftover::Namespace(s) => (
                every_queue(s),
                Topology::from_settings(s).exchanges(),
                Some(s),
            ),
            Leftover::Topology(s) => (every_queue(s), Topology::from_settings(s).exchanges(), None),
        };
        let mut result = Ok(());
        for attempt in 0..5 {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            result = delete_all(&conn, queues.clone(), exchanges.clone()).await;
            if result.is_ok() {
                break;
            }
        }
        if let Err(e) = result {
            eprintln!("      could not delete every one of {queues:?} {exchanges:?}: {e}");
        }
        match keys {
            Some(s) => {
                let _ = delete_keys(&s.redis.url, &s.redis.key_prefix);
            }
            // give the segment writer time with large queues before the next step
            None => tokio::time::sleep(Duration::from_secs(2)).await,
        }
        let _ = closed(conn.close(200, "bye".into())).await;
    }

    /// Everything deferred so far.
    pub async fn finish(&self) {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap());
        for what in pending {
            self.delete_now(what).await;
        }
    }
}

/// Unlinks every key under `prefix:` at `url` (on a cluster, on every node).
pub fn delete_keys(url: &str, prefix: &str) -> Result<()> {
    if !crate::cluster::urls().is_empty() {
        // each node its own keys, one key a command (a cluster node refuses a
        // command whose keys lie in different slots)
        for url in crate::cluster::urls() {
            let mut c = redis::Client::open(url.as_str())?.get_connection()?;
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}:*"))
                .query(&mut c)?;
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("UNLINK").arg(key).ignore();
            }
            let _: () = pipe.query(&mut c)?;
        }
        return Ok(());
    }
    let client = redis::Client::open(url)?;
    let mut c = client.get_connection()?;
    scan_under(&mut c, prefix, |c, keys| {
        if !keys.is_empty() {
            let _: i64 = redis::cmd("UNLINK").arg(&keys).query(c)?;
        }
        Ok(())
    })
}

/// Walks the keys under `prefix:` with `SCAN` (10,000 a step), each step's batch
/// handed to `each` with the connection.
pub fn scan_under(
    c: &mut redis::Connection,
    prefix: &str,
    mut each: impl FnMut(&mut redis::Connection, Vec<String>) -> Result<()>,
) -> Result<()> {
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(10_000)
            .query(c)?;
        each(c, keys)?;
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// Every queue of the topology of `s`, with the dead-letter log a worker of
/// another configuration (`console.dead_index`) may have declared beside it.
fn every_queue(s: &Settings) -> Vec<String> {
    let mut queues = Topology::from_settings(s).queues();
    let log = dead_log_name(&s.amqp.dead_queue);
    if !queues.contains(&log) {
        queues.push(log);
    }
    queues
}
