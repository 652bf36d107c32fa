//! The job, as the contract defines it: decoding a body ([`mod@decode`]), the headers
//! that travel with it ([`headers`]), what became of it ([`outcome`]) and what the
//! worker notes about it for `admin job` ([`note`]). Pure.

/// Decoding a body: the producer crate's decoder, so producers check a job exactly as
/// the worker reads it.
pub use quota_worker_producer::decode;
pub mod headers;
pub mod note;
pub(crate) mod outcome;

pub use outcome::{Outcome, Reason};
pub use quota_worker_producer::decode::{Job, Malformed};
