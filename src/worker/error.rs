//! Why a delivery could not be settled: the one error every step of the worker's
//! handling of a job returns (in a file of its own: the steps in the sibling files
//! import it from here, not through `worker/mod.rs`).

use crate::amqp::PublishError;

/// Why a delivery could not be settled (it is handed back to the broker).
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// Publishing its outcome failed.
    #[error("publishing the outcome: {0}")]
    Publish(#[from] PublishError),
    /// The worker is shutting down while waiting for Redis.
    #[error("interrupted by shutdown")]
    Interrupted,
}
