//! Fallback: a job that names further channels (`fallback`) moves on to the next
//! one when its channel refuses it for a cause its policy's `[policies.NAME.fallback]`
//! names (`capped` by a rule or cap of that channel alone, `opted_out`,
//! `suppressed`), in the same handling: the worker admits it again on the next
//! channel, at once.
//!
//! - [`spec`]: what a policy says (`on`, `wait_at_most`, ...), its words. Pure.
//! - [`route`]: whether a step's admission moves the job on, and why (the
//!   `x-notify-fallback-from` text); the dead letter when no channel is left; the
//!   step's headers. Pure.
//! - [`step`]: the loop over the job's channels, asking the store for each. I/O.
//!
//! A job without `fallback` never enters this room. Every step is counted by the
//! caps and rules of its own channel; one that spans channels holds the
//! notification on every channel, so the job waits as it would without a route.

pub mod failed;
pub mod route;
pub mod spec;
pub mod state;
pub mod step;

pub use route::Routed;
pub use spec::{Cause, FallbackSpec};
