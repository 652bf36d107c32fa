//! Committing dispatched jobs in batches. Once a dispatch is confirmed, its
//! reservation in Redis is marked committed so that a later copy of the job is a
//! duplicate. The delivery is acked without waiting for that mark: a crash between
//! the confirm and the mark is the one window in which a job can be sent twice
//! (see `RELIABILITY.md`). Marks are sent in one pipeline per batch.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, Ticket};

/// Largest batch sent at once.
pub const BATCH: usize = 512;

/// Handle to a committer task.
#[derive(Debug, Clone)]
pub struct Commits {
    tx: mpsc::UnboundedSender<Ticket>,
}

impl Commits {
    /// Start a committer on `engine`; it ends when every handle is dropped, after
    /// committing what it was given (retrying while Redis is away, until `stop`).
    pub fn start(
        engine: Arc<Engine>,
        stop: CancellationToken,
    ) -> (Commits, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Commits { tx }, tokio::spawn(run(engine, rx, stop)))
    }

    /// Commit `ticket` soon.
    pub fn commit(&self, ticket: Ticket) {
        let _ = self.tx.send(ticket);
    }
}

async fn run(
    engine: Arc<Engine>,
    mut rx: mpsc::UnboundedReceiver<Ticket>,
    stop: CancellationToken,
) {
    let mut batch = Vec::with_capacity(BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(t) => batch.push(t),
                Err(_) => break,
            }
        }
        let mut backoff = crate::backoff::delays(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            match engine.commit_many(&batch).await {
                Ok(()) => break,
                Err(e) => {
                    metrics::counter!(crate::metrics::REDIS_ERRORS_TOTAL).increment(1);
                    tracing::warn!(error = %e, jobs = batch.len(), "could not mark dispatched jobs as committed; retrying");
                    tokio::select! {
                        _ = stop.cancelled() => {
                            tracing::error!(jobs = batch.len(), "shutting down with dispatched jobs not marked committed: a copy of one arriving after its lease would be sent again");
                            break;
                        }
                        _ = tokio::time::sleep(backoff.next().unwrap_or_default()) => {}
                    }
                }
            }
        }
        batch.clear();
    }
}
