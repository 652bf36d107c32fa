//! What the jobs of one broker session share ([`BrokerLink`]), in a file of its own:
//! the session builds it, and every step of a job's handling takes it.

use tokio_util::sync::CancellationToken;

use super::commits::Commits;
use crate::amqp::Publisher;
use crate::metrics::SessionMetrics;

/// What the jobs of one broker session share.
#[derive(Debug)]
pub struct BrokerLink {
    /// Confirm-mode publisher for outcomes.
    pub publisher: Publisher,
    pub(crate) commits: Commits,
    /// Cancelled on shutdown or when the broker connection is lost: jobs waiting for
    /// Redis give up and are handed back.
    pub stop: CancellationToken,
    pub(crate) metrics: SessionMetrics,
}
