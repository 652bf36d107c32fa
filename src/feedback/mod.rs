//! Feedback from the senders: what became of a dispatched job, heard on
//! `notify.feedback` (the contract is docs/guide/feedback.md and
//! the producer crate's [`quota_worker_producer::Feedback`]).
//!
//! [`consume`] is the second consumer of each broker session: decode (pure, the
//! producer crate's decoder), then [`apply`] (Redis: a failed send given back, a
//! channel paused after a 429, a recipient suppressed, each once per feedback id
//! and event), count, ack. [`watch`] keeps the store's suppression check on once
//! any recipient is suppressed; the check itself runs inside `src/admission/lua/`.

pub mod apply;
pub mod consume;
pub mod watch;

pub use apply::{Applied, FeedbackNote, Tuning};
pub use consume::{FeedbackError, Feedbacks, Handled};
