//! # quota-worker
//!
//! Takes outgoing-notification jobs from RabbitMQ, lets each through only when its
//! recipient's caps and its channel's send rate allow it, and otherwise holds it
//! until the exact moment it becomes allowed, or dead-letters it with a reason.
//!
//! ## A tour, in the order a job flows
//!
//! ```text
//!  producers ──▶ notify.jobs ──▶ decode ──▶ decide ──┬──▶ dispatch  notify.dispatch ─▶ notify.dispatch.<channel>
//!  (exchange)    (quorum queue)              (Redis)  ├──▶ delay     notify.delay.x<n> ─▶ ... ─▶ back to notify.jobs
//!                                                     └──▶ dead      notify.dead (reason, detail)
//! ```
//!
//! - [`config`]: the typed configuration (defaults file, `--config`, environment);
//!   errors name the key and the file line or variable that set it.
//! - [`decode`]: bytes into a [`decode::Job`], or a `malformed` verdict (pure).
//! - [`window`]: pure calendar arithmetic: local days, window starts, the exact
//!   earliest instant a refused job becomes allowed. No I/O; "now" is a parameter.
//! - [`keys`]: Redis key names (recipients hashed, one hash slot per recipient).
//! - [`engine`]: the decision, the Redis side: `lua/admit.lua` (caps, a sorted set
//!   per recipient), `lua/rate.lua` and `lua/refund.lua` (per-channel GCRA), one
//!   clock (Redis `TIME`), pacing when a channel's rate refuses.
//! - [`batch`]: the admissions waiting at one moment go to Redis as one script call.
//! - [`delay`]: the delay ladder's names and headers (pure): how a refused job waits
//!   in RabbitMQ without a plugin.
//! - [`broker`]: connecting, declaring the topology, publishing with confirms.
//! - [`worker`]: the consume loop and [`worker::Worker::process`], one delivery to one
//!   confirmed outcome (dispatched, delayed, duplicate, dead-lettered).
//! - [`acks`] and [`commits`]: settling deliveries and marking dispatches in batches.
//! - [`signals`]: SIGTERM/SIGINT into one shutdown token.
//!
//!
//! ## Around the worker
//! - [`producer`]: [`producer::Producer::publish`], the contract's job as a struct,
//!   published with confirms (`quota-worker publish` uses it).
//! - [`admin`]: queue depths, dead letters read/replayed/purged without loss, a
//!   recipient's recorded sends (`quota-worker admin ...`).
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`.
//! - [`cli`]: the `publish` and `admin` subcommands' arguments and output.
//!
//! `src/main.rs` only parses arguments, builds the async runtime (one thread unless
//! `worker.threads` says more), sets jemalloc as the allocator and calls into these;
//! `bench/` is the benchmark, a crate of its own in the workspace.
#![warn(missing_docs)]

pub mod admin;
pub mod amqp;
pub mod backoff;
pub mod cli;
pub mod config;
pub mod decide;
pub mod engine;
pub mod http;
pub mod job;
pub mod metrics;
pub mod producer;
pub mod quota;
pub mod redis;
pub mod signals;
pub mod tls;
pub mod worker;
