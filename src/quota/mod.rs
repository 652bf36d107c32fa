//! The caps themselves, in pure Rust: calendar and rolling windows in the
//! recipient's zone ([`window`]), the bounds one admission carries to Redis
//! ([`plan`]), and the names of the keys that hold the recorded sends ([`keys`]).
//! No I/O: the store ([`crate::store`]) carries them to Redis.

pub mod keys;
pub mod plan;
pub mod send_windows;
pub mod window;
