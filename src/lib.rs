//! # quota-worker
//!
//! Takes outgoing-notification jobs from RabbitMQ, lets each through only when its
//! recipient's caps and its channel's send rate allow it, and otherwise holds it
//! until the exact moment it becomes allowed, or dead-letters it with a reason.
//!
//! ## One job's path through the rooms
//!
//! ```text
//!  producers ─▶ notify.jobs ─▶ decode ─▶ triage ─▶ digest ─▶ admission ─▶ lanes ─▶ fallback ─┬─▶ dispatch  notify.dispatch.<channel>
//!  (exchange)   (quorum)       job/      decide/   digest/   admission/   lanes/   fallback/  ├─▶ delay     notify.delay.x<n> ─▶ notify.jobs
//!                                                  (fold)                 (park)   (move on)  └─▶ dead      notify.dead (reason, detail)
//!  senders ─▶ notify.feedback ─▶ feedback/ ;  operators ─▶ admin/, console/, cli/
//! ```
//!
//! The worker's loop ([`worker`]) carries one delivery through these rooms in this
//! order, each reached through a few names of its `mod.rs`:
//!
//! 1. **Consume.** [`worker::session`] consumes `notify.jobs` with a bounded
//!    prefetch and runs one task per delivery; [`worker::process`] takes it from
//!    there (one delivery to one confirmed outcome): `worker/decision.rs` asks, in
//!    the order below, what settles it; `worker/process.rs` carries the decision
//!    out and `worker/dispatch.rs` a dispatch.
//! 2. **Decode** ([`job`]): [`job::decode()`] turns the body into a [`job::Job`],
//!    or a `malformed` dead letter. Pure.
//! 3. **Triage** ([`decide`]): what needs no admission settles first: a cancel mark
//!    (`worker::cancels`, held in memory); [`decide::triage`] (an unconfigured
//!    channel, a job already expired; pure).
//! 4. **Digest fold** ([`digest`]): for a policy with a `window` or `sliding`
//!    digest, the fold into its group's open digest ([`digest::store`],
//!    `lua/digest_fold.lua`); each session's closer ([`digest::close`]) sends each
//!    digest, when its window ends, as one job. A `held` digest folds, after the
//!    admission, what its caps would delay ([`digest::select`]).
//! 5. **Hold**: for a job with a `collapse_key`, whether a newer one replaced it
//!    ([`redis::collapse`]); a `not_before` ahead, send windows closed now
//!    ([`decide::hold`], [`quota::send_windows`]; pure).
//! 6. **Admission** ([`admission`], one folder; its module doc reads in this order):
//!    [`store::QuotaStore::admit`] asks Redis: the recipient's caps, its
//!    policy's and those of every `[caps.NAME]` layer the job meets
//!    ([`rules::Rules::layers`], [`quota::caps`]; the answer read by name in
//!    [`admission::protocol`] and as an admission by [`admission::verdict`], pure), the recipient's suppressions
//!    ([`quota::suppression`]) and preferences ([`preferences`]: opt-outs and quiet
//!    hours, [`preferences::checks`]), all in the one call (the script in `src/admission/lua/`, with the
//!    calendar bounds of [`quota::plan`] and the key names of [`quota::keys`],
//!    keyed per tenant), and the channel's send rate ([`redis::rate`],
//!    `lua/rate.lua`), each batched: the jobs that ask at the same moment share one
//!    call (on a Redis Cluster, one call per node, grouped by [`redis::slots`]).
//!    One clock: Redis `TIME`. [`admission::decision::after_admission`] turns the answer into a
//!    [`decide::Decision`]: dispatch, delay until the exact instant every rule
//!    passes and the send windows are open ([`quota::window`]: pure calendar
//!    arithmetic; over several layers, the latest of each layer's instant), bounded
//!    by `expires_at` and `max_wait`, duplicate, or dead-letter. For a shadow
//!    policy, [`decide::shadow`] says what enforcing it would have done (counted).
//! 7. **Lanes** ([`lanes`]): a job its channel's rate would make wait is parked in
//!    its lane instead (a queue per paced channel and priority, consumed as the
//!    rate allows, urgent first, the shares decided for every worker by
//!    `lua/lanes.lua`, [`redis::lanes`]).
//! 8. **Fallback** ([`fallback`]): a job that names further channels moves on to
//!    the next one when its channel refuses it for a cause its policy names, or
//!    when the sender reports it failed or never answers (`worker/routing.rs`).
//! 9. **Dispatch, delay, dead** ([`amqp`]): [`worker::process`] carries the
//!    decision out: publish with a confirm ([`amqp::publisher`]), to the dispatch
//!    exchange, to the delay ladder ([`amqp::ladder`], headers from
//!    [`job::headers`]) or to the dead letters; then commit the dispatch in Redis
//!    (`worker::commits`) or give the admission back ([`redis::refund`]), and ack
//!    the delivery ([`amqp::acks`]). What became of a job that waits or waited is
//!    noted for `admin job` ([`job::note`], [`redis::notes`]) in the commits'
//!    pipeline.
//! 10. **Feedback** ([`feedback`]): each session's second consumer, on
//!     `notify.feedback`: what became of a dispatched job, decoded by the producer
//!     crate's decoder (pure) and applied once in Redis ([`feedback::apply`]:
//!     `lua/feedback.lua` gives a failed send back or suppresses a recipient,
//!     `lua/throttle.lua` pauses a channel's rate and ramps it back);
//!     [`feedback::watch`] turns the admission's suppression and preference checks
//!     on once some recipient has either.
//! 11. **Operators** ([`admin`], [`console`], the binary's `cli/`): queue depths,
//!     dead letters read/replayed/purged without loss, a recipient's recorded sends,
//!     waiting jobs, digests and preferences, one job explained or cancelled; the
//!     console's dead letters browsed from an index caught up, when someone looks,
//!     from the stream the broker copies every dead letter to ([`admin::dead_log`]). A
//!     recipient's preferences are edited over HTTP (`/v1/recipients/R/preferences`,
//!     `http/preferences.rs`, described by [`http::openapi`] at `/v1/openapi.json`)
//!     and from the CLI, stored by [`preferences::edit`] (`lua/preferences.lua`),
//!     and go out and come back in as JSON lines ([`preferences::files`]).
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
//! - [`amqp::topology`]: every exchange and queue (the lanes' too), declared at each
//!   session's start.
//! - [`backoff`]: the one jittered backoff every retry uses; [`counted`]: a count
//!   held for as long as a wait lasts; [`signals`]: SIGTERM and SIGINT into one
//!   shutdown token.
//! - [`rules`]: the policies and channel rates and windows in force, one immutable
//!   value the store swaps whole; [`reload`]: SIGHUP and `POST /reload` read the
//!   configuration again and swap them, or refuse naming why.
//! - [`reset`]: a Redis that lost its data noticed within a second (a marker read
//!   back by the health watcher), and `redis.on_reset = "pause"`'s hold.
//! - [`health`]: readiness (broker and Redis); [`metrics`]: every metric name once;
//!   [`http`]: `/` (the status page, from [`status`]), `/status.json`, `/metrics`,
//!   `/healthz`, `/readyz`, `POST /reload`, the preferences API;
//!   [`console`]: `/console`, the operators' pages and actions over [`admin`].
//! - [`producer`]: the `quota-worker-producer` crate (`producer/`: the job as a
//!   struct, its JSON Schema, the decoder [`job::decode()`] and the confirm-mode
//!   [`amqp::publisher`] the worker shares), connected as the settings say.
//!
//! ## Layers
//! This table is the one statement of which module may import which: a file
//! imports only from its own layer and the layers below it, and its layer is that
//! of the longest module path a row names that contains it (`lanes::share` in the
//! domain, though `lanes` is a face around the store). `cargo test --test suite
//! layers::` reads the table below and every `use` and inline path of the crate, and
//! names the file and line of any import it does not allow, or a file no row
//! places; it also finds that no source file of any crate of the workspace is in
//! an import circle. `docs/notes/architecture.md` says what each room owns. A room (lanes, digests, preferences, feedback, fallback)
//! spans layers, from its pure decision to its Redis call; its pure files sit with
//! the domain, and lower layers import those files themselves, never the room's
//! `mod.rs`, which only the worker's loop and the rooms above name. From the
//! bottom:
//!
//! | layer | modules | does I/O |
//! |---|---|---|
//! | domain, pure | [`quota`] (calendar windows, send windows, plans, policies and rates, caps in layers, suppressions, key names), the admission's pure files ([`admission`], its face; [`admission::request`], what it asks and answers; [`admission::command`], the script's arguments; [`admission::protocol`], its answers by name), the rooms' pure files ([`lanes::share`], [`lanes::prefetch`], [`lanes::fair`], [`preferences::set`], [`preferences::lines`], [`digest::message`], [`fallback::spec`]), [`backoff`], [`counted`], [`tls`] | no (`tls` reads certificate files) |
//! | configuration | [`config`]: builds the domain's values from the file and environment | reads files |
//! | messages | [`amqp`] (connect, flow control, topology, ladder, publisher, acks), [`job`] (decode, headers, the job's note, outcomes) | broker |
//! | decision, pure | [`decide`]: triage, hold, a shadow policy's verdict; the admission's answer as a decision ([`admission::decision`]); which deliveries a digest takes ([`digest::select`]), which lane and rate step ([`lanes::step`]) | no |
//! | counting | [`metrics`] (names and handles), [`rules`] (the policies and channels in force, with their counters), [`telemetry`] (spans and their export) | exports spans |
//! | Redis | [`redis`]: the scripts' wrappers, connections, batching, notes, the reset marker; owns [`redis::StoreError`]; the admission's batched call ([`admission::batch`]) and the test that its script and protocol agree (`admission::protocol::tests`); the rooms' Redis sides the store holds ([`lanes::pacing`], each channel's rate and lanes, with [`lanes::slots`] and [`lanes::line`]; [`digest::store`], [`preferences::checks`]) | Redis |
//! | quota store | [`store`]: the connection, the rate, commits, releases, the clock; the admission's call ([`admission::admit`]), its caps in layers ([`admission::layers`]), quiet hours settled ([`admission::quiet`]), its answer read ([`admission::verdict`]) and its own state ([`admission::state`]) | Redis |
//! | around the store | [`reset`], [`health`], [`reload`], the rooms' edges ([`lanes::park`], [`lanes::consume`], [`lanes::clocks`], [`lanes::tenants`], [`digest::close`], [`preferences::edit`], [`preferences::files`]) and the rooms' faces, their `mod.rs` ([`lanes`], [`digest`], [`preferences`]), [`feedback`], [`fallback`], [`admin`], [`erase`] | Redis, broker |
//! | service | [`status`], [`worker`] (session, process, and its calls into the rooms), [`http`], [`console`], [`signals`], [`producer`] | all |
//! | binary | `cli` (with `src/main.rs`: arguments, logging, what the commands print) | all |
//!
//! The binary (`src/main.rs`, `src/cli/`) sits on top and prints what the library
//! returns: arguments, logging, the async runtime (one thread unless
//! `worker.threads` says more), jemalloc as the allocator, and what the `publish`
//! and `admin` subcommands print. `bench/` is the benchmark, a crate of its own in
//! the workspace.
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
pub mod erase;
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
