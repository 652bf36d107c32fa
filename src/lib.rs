//! # quota-worker
//!
//! Takes outgoing-notification jobs from RabbitMQ, lets each through only when its
//! recipient's caps and its channel's send rate allow it, and otherwise holds it
//! until the exact moment it becomes allowed, or dead-letters it with a reason.
//!
//! ## A tour, in the order a job flows
//! - [`config`]: the typed configuration (defaults file, `--config`, environment);
//!   errors name the key and the file line or variable that set it.
//! - [`window`]: pure calendar arithmetic: local days, window starts, the exact
//!   earliest instant a refused job becomes allowed. No I/O; "now" is a parameter.
//! - [`keys`]: Redis key names (recipients hashed, one hash slot per recipient).
//! - [`engine`]: the Redis side of a decision: `lua/admit.lua` (caps, sorted set per
//!   recipient) and `lua/rate.lua` (per-channel GCRA), one clock (Redis `TIME`).
#![warn(missing_docs)]

pub mod acks;
pub mod broker;
pub mod commits;
pub mod config;
pub mod decode;
pub mod delay;
pub mod engine;
pub mod keys;
pub mod signals;
pub mod window;
pub mod worker;
