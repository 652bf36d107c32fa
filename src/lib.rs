//! # quota-worker
//!
//! Takes outgoing-notification jobs from RabbitMQ, lets each through only when its
//! recipient's caps and its channel's send rate allow it, and otherwise holds it
//! until the exact moment it becomes allowed, or dead-letters it with a reason.
//!
//! ## One job's path through the folders
//!
//! ```text
//!  producers ──▶ notify.jobs ──▶ decode ──▶ triage ──▶ admit ──▶ decide ──┬──▶ dispatch  notify.dispatch ─▶ notify.dispatch.<channel>
//!  (exchange)    (quorum queue)  job/       decide     store    decide   ├──▶ delay     notify.delay.x<n> ─▶ ... ─▶ back to notify.jobs
//!                                                      (Redis)            └──▶ dead      notify.dead (reason, detail)
//! ```
//!
//! 1. [`worker::session`] consumes `notify.jobs` with a bounded prefetch and runs one
//!    task per delivery; [`worker::process`] takes it from there.
//! 2. [`job::decode()`] turns the body into a [`job::Job`], or a `malformed` dead
//!    letter. Pure.
//! 3. What needs no admission settles first: a cancel mark ([`worker::cancels`],
//!    held in memory); [`decide::triage`] (an unconfigured channel, a job already
//!    expired; pure); for a job with a `collapse_key`, whether a newer one replaced
//!    it ([`redis::collapse`], `lua/collapse.lua`); [`decide::hold`] (a `not_before`
//!    ahead, send windows closed now: [`quota::send_windows`]; pure).
//! 4. [`store::QuotaStore::admit`] asks Redis: the recipient's caps
//!    ([`redis::admit`], `lua/admit.lua`, with the calendar bounds of
//!    [`quota::plan`] and the key names of [`quota::keys`]) and the channel's send
//!    rate ([`redis::rate`], `lua/rate.lua`), each batched: the jobs that ask at the
//!    same moment share one call (on a Redis Cluster, one call per node, grouped
//!    by [`redis::slots`]). One clock: Redis `TIME`.
//! 5. [`decide::after_admission`] turns the store's answer into a [`decide::Decision`]:
//!    dispatch, delay until the exact instant every rule passes and the send
//!    windows are open ([`quota::window`], [`quota::send_windows`]: pure calendar
//!    arithmetic), bounded by `expires_at` and `max_wait`, duplicate, or dead-letter.
//!    For a shadow policy, [`decide::shadow`] says what enforcing it would have done
//!    (counted), and the job goes out as admitted.
//! 6. [`worker::process`] carries the decision out over [`amqp`]: publish with a
//!    confirm ([`amqp::publisher`]), to the dispatch exchange, to the delay ladder
//!    ([`amqp::ladder`], headers from [`job::headers`]) or to the dead letters; then
//!    commit the dispatch in Redis ([`worker::commits`]) or give the admission back
//!    ([`redis::refund`]), and ack the delivery ([`amqp::acks`]). What became of a
//!    job that waits or waited is noted for `admin job` ([`job::record`],
//!    [`redis::notes`]) in the commits' pipeline.
//!
//! ## Hearing back from the senders
//! [`feedback`] is each session's second consumer, on `notify.feedback`: what became
//! of a dispatched job, decoded by the producer crate's decoder (pure) and applied
//! once in Redis ([`feedback::apply`]: `lua/feedback.lua` gives a failed send back or
//! suppresses a recipient, `lua/throttle.lua` pauses a channel's rate and ramps it
//! back). `lua/admit.lua` dead-letters a suppressed recipient's job (`suppressed`,
//! [`quota::suppression`]) in the admission call it already makes, once
//! [`feedback::watch`] has seen that some recipient is suppressed.
//!
//! ## Around the flow
//! - [`config`]: the typed configuration (defaults file, `--config`, environment,
//!   `*_FILE` secrets); errors name the key and the file line or variable.
//! - [`tls`]: rustls for `amqps://` and `rediss://`, never falling back to plaintext.
//! - [`amqp::topology`]: every exchange and queue, declared at each session's start.
//! - [`backoff`]: the one jittered backoff every retry uses; [`signals`]: SIGTERM
//!   and SIGINT into one shutdown token.
//! - [`rules`]: the policies and channel rates and windows in force, one immutable
//!   value the store swaps whole; [`reload`]: SIGHUP and `POST /reload` read the
//!   configuration again and swap them, or refuse naming why.
//! - [`metrics`]: every metric name once; [`http`]: `/` (the status page, from
//!   [`status`]), `/status.json`, `/metrics`, `/healthz`, `/readyz`, `POST /reload`.
//! - [`producer`]: the `quota-worker-producer` crate (`producer/`: the job as a
//!   struct, its JSON Schema, the decoder [`job::decode()`] and the confirm-mode
//!   [`amqp::publisher`] the worker shares), connected as the settings say.
//! - [`admin`]: queue depths, dead letters read/replayed/purged without loss, a
//!   recipient's recorded sends and waiting jobs, one job explained or cancelled.
//!
//! `src/main.rs` and `src/cli/` are the binary: arguments, logging, the async runtime
//! (one thread unless `worker.threads` says more), jemalloc as the allocator, and
//! what the `publish` and `admin` subcommands print. `bench/` is the benchmark, a
//! crate of its own in the workspace.
#![warn(missing_docs)]

pub mod admin;
pub mod admission;
pub mod amqp;
pub mod backoff;
pub mod config;
pub mod decide;
pub mod feedback;
pub mod health;
pub mod http;
pub mod job;
pub mod metrics;
pub mod producer;
pub mod quota;
pub mod redis;
pub mod reload;
pub mod rules;
pub mod signals;
pub mod status;
pub mod store;
pub mod tls;
pub mod worker;
