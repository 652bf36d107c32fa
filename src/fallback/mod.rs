//! Fallback: a job that names further channels (`fallback`) moves on to the next
//! one when its channel refuses it for a cause its policy's `[policies.NAME.fallback]`
//! names (`capped` by a rule or cap of that channel alone, `opted_out`,
//! `suppressed`), in the same handling: the worker admits it again on the next
//! channel, at once; when the sender reports it `failed`, or no answer came in
//! `answer_within` (`unanswered`), it goes out on the next one.
//!
//! - [`spec`]: what a policy says (`on`, `wait_at_most`, ...), its words. Pure.
//! - [`route`]: whether a step's admission moves the job on, and why (the
//!   `x-notify-fallback-from` text); the dead letter when no channel is left; the
//!   step's headers. Pure.
//! - [`step`]: the loop over the job's channels, asking the store for each. I/O.
//! - [`state`]: a routed step's state in Redis while it may still move on
//!   (pending, answered, moved on), and [`failed`]: the job published again
//!   when the sender reports the step `failed`.
//! - [`log`]: the route as `admin job ID` shows it.
//!
//! `unanswered` (escalation): after a step goes out, the job is published round
//! the delay ladder (`x-notify-escalation`), back at the step's deadline; a
//! `delivered` or `read` feedback meanwhile marks the step answered (in
//! `lua/feedback.lua`), and the escalation that comes back then ends there. No
//! timer waits in the worker: the ladder holds the time, Redis the state.
//!
//! A job without `fallback` never enters this room. Every step is counted by the
//! caps and rules of its own channel; one that spans channels holds the
//! notification on every channel, so the job waits as it would without a route.

pub mod failed;
pub mod log;
pub mod route;
pub mod spec;
pub mod state;
pub mod step;

pub use route::Routed;
pub use spec::{Cause, FallbackSpec};
