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
//!    it ([`redis::collapse`], `lua/collapse.lua`); for a policy with a `window` or
//!    `sliding` digest, the fold into its group's open digest (`worker::digest`,
//!    `lua/digest_fold.lua`; a closer in each session sends each digest, when its
//!    window ends, as one job; a `held` digest folds, after step 5, what its caps
//!    would delay); [`decide::hold`] (a `not_before`
//!    ahead, send windows closed now: [`quota::send_windows`]; pure).
//! 4. [`store::QuotaStore::admit`] (the quota store: what an admission asks and
//!    answers is [`admission`]) asks Redis: the recipient's caps, its policy's
//!    and those of every `[caps.NAME]` layer the job meets ([`rules::Rules::layers`],
//!    [`quota::caps`]), all in the one call ([`redis::admit`], `lua/admit/`, with
//!    the calendar bounds of [`quota::plan`] and the key names of [`quota::keys`],
//!    keyed per tenant) and the channel's send
//!    rate ([`redis::rate`], `lua/rate.lua`), each batched: the jobs that ask at the
//!    same moment share one call (on a Redis Cluster, one call per node, grouped
//!    by [`redis::slots`]). One clock: Redis `TIME`.
//! 5. [`decide::after_admission`] turns the store's answer into a [`decide::Decision`]:
//!    dispatch, delay until the exact instant every rule passes and the send
//!    windows are open ([`quota::window`], [`quota::send_windows`]: pure calendar
//!    arithmetic; over several layers, the latest of each layer's instant), bounded
//!    by `expires_at` and `max_wait`, duplicate, or dead-letter.
//!    For a shadow policy, [`decide::shadow`] says what enforcing it would have done
//!    (counted), and the job goes out as admitted. A job its channel's rate would
//!    make wait is parked in its lane instead (`worker::lanes`: a queue per paced
//!    channel and priority, consumed as the rate allows, urgent first, the shares
//!    decided for every worker by `lua/lanes.lua` and [`quota::lanes`]).
//! 6. [`worker::process`] carries the decision out over [`amqp`]: publish with a
//!    confirm ([`amqp::publisher`]), to the dispatch exchange, to the delay ladder
//!    ([`amqp::ladder`], headers from [`job::headers`]) or to the dead letters; then
//!    commit the dispatch in Redis ([`worker::commits`]) or give the admission back
//!    ([`redis::refund`]), and ack the delivery ([`amqp::acks`]). What became of a
//!    job that waits or waited is noted for `admin job` ([`job::note`],
//!    [`redis::notes`]) in the commits' pipeline.
//!
//! ## Hearing back from the senders
//! [`feedback`] is each session's second consumer, on `notify.feedback`: what became
//! of a dispatched job, decoded by the producer crate's decoder (pure) and applied
//! once in Redis ([`feedback::apply`]: `lua/feedback.lua` gives a failed send back or
//! suppresses a recipient, `lua/throttle.lua` pauses a channel's rate and ramps it
//! back). `lua/admit/` dead-letters a suppressed recipient's job (`suppressed`,
//! [`quota::suppression`]) in the admission call it already makes, once
//! [`feedback::watch`] has seen that some recipient is suppressed.
//!
//! ## The recipient's own say
//! A recipient's preferences ([`quota::preferences`]: opt-outs by category, channel
//! or the pair, quiet hours; pure) are edited over HTTP (`/v1/recipients/R/preferences`,
//! `http/preferences.rs`, described by [`http::openapi`] at `/v1/openapi.json`) and
//! from the CLI, and stored by [`admin::preferences`] (`lua/preferences.lua`); every
//! set goes out and comes back in as JSON lines ([`admin::preference_files`],
//! [`quota::preference_lines`]).
//! `lua/admit/` dead-letters an opted-out job (`opted_out`) in the admission call
//! it already makes, once [`feedback::watch`] has seen the key `prefix:preferences`;
//! a `required` policy's jobs pass.
//!
//! ## Around the flow
//! - [`config`]: the typed configuration, a file per section (defaults file,
//!   `--config`, environment, `*_FILE` secrets); errors name the key and the file
//!   line or variable. It builds the domain's values: [`quota::policy`] (policies,
//!   rates) and the key names ([`quota::keys`]).
//! - [`telemetry`]: traces over OTLP, off by default: a `process` span per handling
//!   (its decision as `quota.*` attributes), a `send` span per publish, the W3C
//!   context in the AMQP headers of every copy (docs/guide/tracing.md).
//! - [`tls`]: rustls for `amqps://` and `rediss://`, never falling back to plaintext.
//! - [`amqp::topology`]: every exchange and queue, declared at each session's start.
//! - [`backoff`]: the one jittered backoff every retry uses; [`signals`]: SIGTERM
//!   and SIGINT into one shutdown token.
//! - [`rules`]: the policies and channel rates and windows in force, one immutable
//!   value the store swaps whole; [`reload`]: SIGHUP and `POST /reload` read the
//!   configuration again and swap them, or refuse naming why.
//! - [`reset`]: a Redis that lost its data noticed within a second (a marker read
//!   back by the health watcher), and `redis.on_reset = "pause"`'s hold.
//! - [`health`]: readiness (broker and Redis); [`metrics`]: every metric name once; [`http`]: `/` (the status page, from
//!   [`status`]), `/status.json`, `/metrics`, `/healthz`, `/readyz`, `POST /reload`;
//!   [`console`]: `/console`, the operators' pages and actions over [`admin`].
//! - [`producer`]: the `quota-worker-producer` crate (`producer/`: the job as a
//!   struct, its JSON Schema, the decoder [`job::decode()`] and the confirm-mode
//!   [`amqp::publisher`] the worker shares), connected as the settings say.
//! - [`admin`]: queue depths, dead letters read/replayed/purged without loss, a
//!   recipient's recorded sends and waiting jobs, one job explained or cancelled.
//!
//! ## Layers
//! Each layer imports only from the layers below it; no source file of any crate
//! of the workspace is in an import circle (`cargo test --test suite layers::`
//! checks every crate). From the bottom:
//!
//! | layer | modules | does I/O |
//! |---|---|---|
//! | domain, pure | [`quota`] (calendar windows, send windows, plans, policies and rates, caps in layers, lanes, suppressions, key names), [`admission`] (what an admission asks and answers), [`backoff`], [`tls`] | no (`tls` reads certificate files) |
//! | configuration | [`config`]: builds the domain's values from the file and environment | reads files |
//! | messages | [`amqp`] (connect, flow control, topology, ladder, publisher, acks), [`job`] (decode, headers, the job's note, outcomes) | broker |
//! | decision, pure | [`decide`]: triage, hold, after the admission | no |
//! | counting | [`metrics`] (names and handles), [`rules`] (the policies and channels in force, with their counters) | no |
//! | Redis | [`redis`]: the scripts' wrappers, connections, batching, notes, the reset marker; owns [`redis::StoreError`] | Redis |
//! | quota store | [`store`]: admissions (with their layers), the rate and the lanes' takes, commits, releases, the clock | Redis |
//! | around the store | [`reset`] (a Redis that lost its data), [`health`], [`reload`], [`feedback`] (the senders' feedback: decode, apply once, consume), [`admin`] | Redis, broker |
//! | service | [`status`], [`worker`] (session, process, lanes, commits, cancels), [`http`], [`signals`], [`producer`] | all |
//!
//! The binary (`src/main.rs`, `src/cli/`) sits on top and prints what the library
//! returns.
//!
//! `src/main.rs` and `src/cli/` are the binary: arguments, logging, the async runtime
//! (one thread unless `worker.threads` says more), jemalloc as the allocator, and
//! what the `publish` and `admin` subcommands print. `bench/` is the benchmark, a
//! crate of its own in the workspace.
#![warn(missing_docs)]

pub mod admin;
pub mod admission;
pub mod amqp;
pub(crate) mod backoff;
pub mod config;
pub mod console;
pub(crate) mod counted;
pub(crate) mod decide;
pub mod digest;
pub mod fallback;
pub mod feedback;
pub mod health;
pub mod http;
pub mod job;
pub mod lanes;
pub mod metrics;
pub mod preferences;
pub mod producer;
pub mod quota;
pub mod redis;
pub mod reload;
pub(crate) mod reset;
pub(crate) mod rules;
pub mod signals;
pub mod status;
pub mod store;
pub mod telemetry;
pub mod tls;
pub mod worker;
