//! The broker side: connecting ([`mod@connect`], plaintext or TLS), the topology the
//! worker declares ([`topology`]), publishing with confirms ([`publisher`]), the
//! delay ladder's names and bits ([`ladder`]), acking deliveries in batches
//! ([`acks`]), and the broker's flow control ([`flow`]). AMQP code only moves messages; it decides nothing.

pub(crate) mod acks;
pub(crate) mod connect;
pub mod flow;
pub mod ladder;
pub(crate) mod topology;

/// Publishing with confirms: the producer crate's, shared by the worker.
pub use quota_worker_producer::publisher;

pub use connect::{connect, connect_any, BrokerError};
pub use publisher::{confirmed, PublishError, Publisher};
pub use topology::{dead_log_name, delete_all, Topology};
