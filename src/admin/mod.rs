//! Admin: what an operator reads and repairs. Queue depths ([`queues`]), dead
//! letters read, replayed and purged without loss ([`dead_letters`]), a
//! recipient's recorded sends ([`recipients`]) and suppressions ([`suppressions`]), and one job by its id: where it is,
//! why, and cancelling it ([`jobs`]); digests shown and flushed ([`digests`]); a
//! recipient's own preferences ([`preferences`]) and every stored set exported and
//! imported as JSON lines ([`preference_files`]); every limit and quota with its
//! buckets' state ([`limits`]). Returns data; the binary prints it.

pub mod dead_action;
pub mod dead_index;
pub(crate) mod dead_letter_info;
pub(crate) mod dead_letters;
pub mod dead_log;
pub mod dead_select;
pub mod digests;
pub(crate) mod jobs;
pub mod limits;
pub mod preferences;
pub(crate) mod queues;
pub mod recipients;
pub mod suppressions;

use crate::amqp::{BrokerError, PublishError};
use crate::redis::StoreError;

pub use dead_letter_info::{DeadLetterInfo, Selection};
pub use dead_letters::{DeadLetters, WalkAction, WalkReport};
pub use digests::{DigestInfo, Digests, Flushed, OpenDigest};
pub use jobs::{Cancelled, JobStatus, Jobs};
pub use queues::{queue_stats, tenants_waiting, QueueStat, TenantsWaiting};
pub use recipients::{RecipientQuery, RecipientStatus, Recipients, Recorded};
pub use suppressions::SuppressionInfo;

/// What an admin command could not do.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The broker failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// Redis failed.
    #[error(transparent)]
    QuotaStore(#[from] StoreError),
    /// The dead-letter queue is not there.
    #[error("the dead-letter queue `{0}` does not exist (the worker declares it at start)")]
    NoDeadQueue(String),
    /// A copy or a replay was not confirmed; the walk stopped and the message stays.
    #[error("{what} was not confirmed ({source}); the dead letter stays in the queue")]
    Publish {
        /// What was being published.
        what: String,
        /// Why it failed.
        source: PublishError,
    },
    /// The request does not make sense.
    #[error("{0}")]
    Invalid(String),
}

impl From<lapin::Error> for AdminError {
    fn from(e: lapin::Error) -> Self {
        AdminError::Broker(BrokerError::Amqp(e))
    }
}

impl From<redis::RedisError> for AdminError {
    fn from(e: redis::RedisError) -> Self {
        AdminError::QuotaStore(StoreError::Redis(e))
    }
}

pub(crate) fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(p) if p.kind().get_id() == 404)
}
