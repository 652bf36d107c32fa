//! # quota-worker
//!
//! Takes outgoing-notification jobs from RabbitMQ, lets each through only when its
//! recipient's caps and its channel's send rate allow it, and otherwise holds it
//! until the exact moment it becomes allowed, or dead-letters it with a reason.
//!
//! ## A tour, in the order a job flows
//! - [`config`]: the typed configuration (defaults file, `--config`, environment).
//! - [`window`]: pure calendar arithmetic: local days, window starts, the exact
//!   earliest instant a refused job becomes allowed. No I/O; "now" is a parameter.
//! - [`keys`]: Redis key names (recipients hashed, one hash slot per recipient).
//! - [`engine`]: the Redis side of a decision: `lua/admit.lua` (caps, sorted set per
//!   recipient) and `lua/rate.lua` (per-channel GCRA), one clock (Redis `TIME`).
//! - [`decode`], [`delay`], [`broker`], [`worker`]: the running service (consume,
//!   decide, dispatch / delay / dead-letter, ack once the outcome is confirmed).
//!
//! ## Around the worker
//! - [`producer`]: [`producer::Producer::publish`], the contract's job as a struct,
//!   published with confirms (`quota-worker publish` uses it).
//! - [`admin`]: queue depths, dead letters read/replayed/purged without loss, a
//!   recipient's recorded sends (`quota-worker admin ...`).
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`cli`]: the `publish` and `admin` subcommands' arguments and output.
#![warn(missing_docs)]

pub mod admin;
pub mod broker;
pub mod cli;
pub mod config;
pub mod decode;
pub mod delay;
pub mod engine;
pub mod http;
pub mod keys;
pub mod producer;
pub mod signals;
pub mod window;
pub mod worker;
