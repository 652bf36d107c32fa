//! Digests, from the decision to the Redis call (docs/guide/digests.md): a job of a
//! policy with a digest section is folded into its group's open digest instead of
//! going on its own, and the digest goes, when its window ends, as one job. The
//! policy's digest section is read by `config/digest.rs` into
//! [`crate::quota::digest::DigestSpec`] (a part of the policy); the scripts are
//! `lua/digest_*.lua`, their wrappers [`crate::redis::digest`].
//!
//! In the order a job meets them:
//! - [`select`]: which deliveries a digest takes (a `held` policy's: only those
//!   its caps would delay) and which are digests themselves (never folded; pure);
//! - [`store`]: the fold, acked once Redis confirmed the write, and the rest of the
//!   digests' Redis side ([`Digests`], kept by the quota store);
//! - [`close`]: the closer of each session, which claims the digests due, builds
//!   each one's [`message`] (pure) and publishes it to the jobs exchange, where it
//!   meets the admission as any job does.
//!
//! The worker's loop calls the room through the names below (`worker/digest_side.rs`
//! folds a decoded job and starts the closer); `admin/digests.rs` shows them to
//! operators.

pub(crate) mod close;
pub mod message;
pub(crate) mod select;
pub mod store;

pub(crate) use close::Closer;
pub use message::DIGEST_HEADER;
pub(crate) use select::{held, held_digest, is_digest};
pub use store::{Digests, FoldJob};
