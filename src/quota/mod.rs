//! The caps themselves, in pure Rust: calendar and rolling windows in the
//! recipient's zone ([`window`]), caps in layers over the policies ([`caps`]), the bounds one admission carries to Redis
//! ([`plan`]), the names of the keys that hold the recorded sends ([`keys`]), and
//! what a policy and a channel's send rate are once read ([`policy`]), and how the
//! lanes of a paced channel share its rate ([`lanes`]) and how many deliveries a
//! worker holds from a lane ([`prefetch`]).
//! No I/O: the store ([`crate::store`]) carries them to Redis.

pub mod caps;
pub mod digest;
pub mod keys;
pub(crate) mod plan;
pub mod policy;
pub mod send_windows;
pub mod suppression;
pub mod window;
