//! Redis: one wrapper module per script, each owning its arguments and its reply,
//! every script registered (its source and its SHA) and loaded at start in
//! [`scripts`]:
//!
//! | script | wrapper | called from |
//! |---|---|---|
//! | `src/admission/lua/` | in its room: [`crate::admission::batch`] (a recipient's caps, many jobs a call) | the store |
//! | `lua/rate.lua` | [`rate`]: a channel's GCRA | the store, batched by [`rate_batch`] |
//! | `lua/lanes.lua` | [`lanes`]: the GCRA taken by a job of a lane | [`rate_batch`], the lanes' lines ([`crate::lanes`]) |
//! | `lua/refund.lua`, `lua/release.lua` | [`refund`], [`release`]: a take, a reservation, given back | the store |
//! | `lua/collapse.lua` | [`collapse`]: the newest job of a collapse key | the store |
//! | `lua/import.lua` | [`import`]: the admin's import of past sends | the admin |
//! | `lua/digest_*.lua` | [`digest`]: a module per script (fold, claim, close, reopen) | the digests ([`crate::digest`]) |
//! | `lua/lease.lua` | [`lease`]: a lease renewed or ended, if still its taker's | the admin's dead-letter catch-up and replays |
//! | `lua/preferences.lua` | [`preferences`]: a set replaced or removed | the preferences ([`crate::preferences`]) |
//!
//! Five scripts have their call (arguments and reply) in the room that uses them
//! rather than a wrapper here, registered in [`scripts`] all the same:
//! `lua/feedback.lua` and `lua/throttle.lua` ([`crate::feedback::apply`]),
//! `lua/route_claim.lua` (`fallback/state.rs`), and `lua/dead_index.lua` with
//! `lua/dead_page.lua` ([`crate::admin::dead_index`]). The admission's script lives
//! in its room (`src/admission/lua/`).
//!
//! Besides the scripts: what the worker notes about waiting and ended jobs, and the
//! cancel marks ([`notes`], plain commands); the reset marker and the pause mark
//! ([`marker`]); every key of a pattern by `SCAN`, on each primary of a cluster
//! ([`scan`]); the hash slots of a cluster ([`slots`]); and the connection
//! ([`conn`]). What the answers mean is decided elsewhere (the store, the rooms,
//! [`crate::decide`]).

pub(crate) mod collapse;
pub(crate) mod conn;
pub mod digest;
pub(crate) mod fair;
pub(crate) mod import;
pub(crate) mod lanes;
pub(crate) mod lease;
pub mod marker;
pub(crate) mod notes;
pub(crate) mod rate;
pub(crate) mod rate_batch;
pub(crate) mod refund;
pub(crate) mod release;
pub(crate) mod scan;
pub mod scripts;
pub mod slots;

mod error;
#[cfg(test)]
pub(crate) mod lua_tables;

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
