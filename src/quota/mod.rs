//! The caps themselves, in pure Rust: calendar and rolling windows in the
//! recipient's zone ([`window`]), send windows ([`send_windows`]), caps in layers
//! over the policies ([`caps`]), the bounds one admission carries to Redis
//! ([`plan`]), the names of the keys that hold the recorded sends ([`keys`]), what
//! a policy and a channel's send rate are once read ([`policy`]), with a policy's
//! digest section ([`digest`]) and its suppression kinds ([`suppression`]).
//! No I/O: the store ([`crate::store`]) carries them to Redis. (Lanes, digests and
//! preferences each have a room of their own: [`crate::lanes`], [`crate::digest`],
//! [`crate::preferences`].)

pub mod caps;
pub mod digest;
pub mod keys;
pub mod limits;
pub(crate) mod plan;
pub mod policy;
pub mod send_windows;
pub mod suppression;
pub mod window;
