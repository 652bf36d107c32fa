//! Redis, one module per script: each owns its arguments and its reply
//! ([`admit`]: a recipient's caps, many jobs a call; [`rate`] and [`refund`]: a
//! channel's GCRA; [`record`]: the admin's import; [`collapse`]: the newest job of a
//! collapse key; [`notes`]: what the worker notes about waiting and ended jobs, and
//! the cancel marks), all registered in
//! [`scripts`]; and the connection ([`conn`]). What the answers mean is decided
//! elsewhere ([`crate::engine`], [`crate::decide`]).

pub(crate) mod admit;
pub mod collapse;
pub mod conn;
pub mod notes;
pub mod rate;
pub mod record;
pub mod refund;
pub mod scripts;
pub mod slots;

pub use conn::RedisConn;
pub use scripts::Scripts;

/// A batched call failed as a whole (Redis away, a timeout): every job of it hears
/// so and is retried by its caller; the first gets the error itself, the others
/// its text.
pub(crate) fn fail_all<T>(
    e: crate::engine::EngineError,
    waiters: impl IntoIterator<
        Item = tokio::sync::oneshot::Sender<Result<T, crate::engine::EngineError>>,
    >,
) {
    let text = e.to_string();
    let mut first = Some(e);
    for tx in waiters {
        let err = first
            .take()
            .unwrap_or_else(|| crate::engine::EngineError::Batch(text.clone()));
        let _ = tx.send(Err(err));
    }
}
