//! Writes that follow an outcome, in batches: commits of dispatched jobs, and the
//! notes about delayed and ended jobs (`admin job`, the recipient's waiting count).
//! Once a dispatch is confirmed, its reservation in Redis is marked committed so
//! that a later copy of the job is a duplicate. The delivery is acked without
//! waiting for that mark: a crash between the confirm and the mark is the one
//! window in which a job can be sent twice (see `RELIABILITY.md`). Everything
//! handed over at one moment goes in one pipeline; a job never waits for its note.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admission::Ticket;
use crate::redis::notes::Note;
use crate::store::QuotaStore;

/// Largest batch sent at once.
pub const BATCH: usize = 512;

/// One write.
#[derive(Debug)]
enum Write {
    Commit(Ticket),
    Note(Box<Note>),
}

/// Handle to a committer task.
#[derive(Debug, Clone)]
pub struct Commits {
    tx: mpsc::UnboundedSender<Write>,
}

impl Commits {
    /// Start a committer on `store`; it ends when every handle is dropped, after
    /// writing what it was given (retrying while Redis is away, until `stop`).
    pub fn start(
        store: Arc<QuotaStore>,
        stop: CancellationToken,
    ) -> (Commits, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Commits { tx }, tokio::spawn(run(store, rx, stop)))
    }

    /// Commit `ticket` soon.
    pub fn commit(&self, ticket: Ticket) {
        let _ = self.tx.send(Write::Commit(ticket));
    }

    /// Write `note` soon.
    pub fn note(&self, note: Note) {
        let _ = self.tx.send(Write::Note(Box::new(note)));
    }
}

async fn run(
    store: Arc<QuotaStore>,
    mut rx: mpsc::UnboundedReceiver<Write>,
    stop: CancellationToken,
) {
    let mut tickets = Vec::with_capacity(BATCH);
    let mut notes = Vec::new();
    let take = |w: Write, tickets: &mut Vec<Ticket>, notes: &mut Vec<Note>| match w {
        Write::Commit(t) => tickets.push(t),
        Write::Note(n) => notes.push(*n),
    };
    while let Some(first) = rx.recv().await {
        take(first, &mut tickets, &mut notes);
        while tickets.len() + notes.len() < BATCH {
            match rx.try_recv() {
                Ok(w) => take(w, &mut tickets, &mut notes),
                Err(_) => break,
            }
        }
        let mut backoff = crate::backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match store.write_after(&tickets, &notes).await {
                Ok(()) => break,
                Err(e) => {
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
                    tracing::warn!(error = %e, jobs = tickets.len(), notes = notes.len(), "could not mark dispatched jobs as committed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => {
                            tracing::error!(jobs = tickets.len(), "shutting down with dispatched jobs not marked committed: a copy of one arriving after its lease would be sent again");
                            break;
                        }
                        _ = tokio::time::sleep(backoff.next().unwrap_or_default()) => {}
                    }
                }
            }
        }
        tickets.clear();
        notes.clear();
    }
}
