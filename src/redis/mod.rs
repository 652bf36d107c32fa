//! Redis, one module per script: each owns its arguments and its reply
//! ([`admit`]: a recipient's caps, many jobs a call; [`rate`] and [`refund`]: a
//! channel's GCRA; [`import`]: the admin's import of past sends; [`collapse`]: the newest job of a
//! collapse key; [`digest`]: digests folded, claimed and closed; [`notes`]: what the worker notes about waiting and ended jobs, and
//! the cancel marks), all registered in [`scripts`]; the reset marker and the pause
//! mark ([`marker`], plain commands); every key of a pattern by `SCAN`, on each
//! primary of a cluster ([`scan`]); and the connection ([`conn`]). What the answers mean is decided
//! elsewhere ([`crate::store`], [`crate::decide`]).

pub(crate) mod admit;
pub(crate) mod collapse;
pub(crate) mod conn;
pub mod digest;
pub(crate) mod import;
pub(crate) mod lanes;
pub mod marker;
pub(crate) mod notes;
pub(crate) mod preferences;
pub(crate) mod rate;
pub(crate) mod rate_batch;
pub(crate) mod refund;
pub(crate) mod release;
pub(crate) mod scan;
pub mod scripts;
pub mod slots;

mod error;

pub use conn::RedisConn;
pub use error::StoreError;
pub use scripts::Scripts;

/// The next batch of a batcher (admissions, rate takes): wait for a request and
/// for a permit to call, then take what else queued meanwhile, up to `max`.
/// `None` once every sender is gone (or the permits are closed).
pub(crate) async fn next_batch<T>(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    permits: &std::sync::Arc<tokio::sync::Semaphore>,
    max: usize,
) -> Option<(tokio::sync::OwnedSemaphorePermit, Vec<T>)> {
    let first = rx.recv().await?;
    let permit = permits.clone().acquire_owned().await.ok()?;
    let mut batch = Vec::with_capacity(max.min(16));
    batch.push(first);
    while batch.len() < max {
        match rx.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
    Some((permit, batch))
}

/// A batched call failed as a whole (Redis away, a timeout): every job of it hears
/// so and is retried by its caller; the first gets the error itself, the others
/// its text.
pub(crate) fn fail_all<T>(
    e: crate::redis::StoreError,
    waiters: impl IntoIterator<Item = tokio::sync::oneshot::Sender<Result<T, crate::redis::StoreError>>>,
) {
    let text = e.to_string();
    let mut first = Some(e);
    for tx in waiters {
        let err = first
            .take()
            .unwrap_or_else(|| crate::redis::StoreError::Batch(text.clone()));
        let _ = tx.send(Err(err));
    }
}
