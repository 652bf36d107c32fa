//! `bench`: throughput, latency and memory of the worker against the broker's own
//! ceiling, measured in one run on one machine.
//!
//! ```text
//! cargo build --release --bins && target/release/bench --quick
//! ```
//!
//! Steps (`--steps`), each on a fresh set of queues and keys, each in a module of its
//! own; [`run`] runs them in this order:
//! - **ceiling** ([`ceiling`], inside the other steps): a minimal pass-through with
//!   the worker's broker settings (quorum queues, persistent messages, publisher
//!   confirms, manual acks after the confirm, the same prefetch); no Redis.
//! - **engine** ([`engine`]): `redis-benchmark` running `src/admission/lua/` by EVALSHA,
//!   then the engine's own admissions with many in flight, on the same Redis; then
//!   ([`layers`]) Redis's time and CPU per job with one layer (the policy) and with
//!   three (two caps over it), on a private `redis-server`.
//! - **engine-limits** ([`limits`], only when asked for): the engine's admissions
//!   with three limits that match every job (all, per tenant, per sender), with
//!   the same three matching nothing, and with none, alternated over `--rounds`
//!   rounds (default 8) on a private `redis-server`: every round's admissions per
//!   second, Redis's time and CPU per job and the engine's CPU per job.
//! - **rate** ([`rate`]): one channel's rate key, one call per decision against the
//!   engine's batched takes.
//! - **a**, **b**, **c** ([`mixes`]): (a) all allowed, (b) Zipf-skewed recipients
//!   (many capped and delayed), (c) all malformed: the real `quota-worker run` binary
//!   drains a preloaded backlog; its `/metrics` gives latency and Redis calls, `/proc`
//!   its RSS.
//! - **latency** ([`latency`]): in each round, a ceiling, then jobs offered at half
//!   its rate and at a quarter, to the worker and to the pass-through (the ceiling's
//!   relay, live) in turn, the order alternating. The load generator stamps each job
//!   with a header (`x-bench-sent-us`) and a consumer in the benchmark on the output
//!   queue records publish-to-arrival times (end to end, as the pipe sees it); the
//!   admission quantiles from the worker's histogram are the breakdown. A last pass
//!   with the worker and Redis under `SCHED_FIFO` (by `chrt`, where permitted).
//! - **scale** ([`scale`], only when asked for): keys of 10,000 and of 10,000,000
//!   recipients already in Redis, 1 and 10 policies in use; rounds of a ceiling and
//!   every configuration, the order alternating: jobs/s and CPU per job.
//! - **lanes** ([`lanes`], only when asked for): a channel paced at 100 jobs/s, a
//!   bulk backlog parked in its lane (`--jobs`, default 100,000), then urgent jobs at
//!   2/s as an old producer sends them: their publish-to-dispatch times, on one
//!   worker and on three.
//! - **recovery** ([`recovery`], only when asked for): a channel paced at half the
//!   ceiling, a bulk backlog (`--jobs`, default 100,000) parked in its lane before
//!   the workers start, then drained, on one worker and on three, without and with a
//!   broker restart half-way (on a private node): the drain rate against the rate,
//!   whole and by 5-second interval, and `<out>/recovery.svg`; then a burst of as many
//!   bulk jobs to the jobs exchange: how fast they are published and parked.
//! - **campaign** ([`campaign`], only when asked for): bulk jobs (`--jobs`, default
//!   100,000) of a channel paced at `--campaign-rate` (100/s), of
//!   `--campaign-tenants` tenants round-robin (default none), published to the jobs
//!   exchange by a producer that knows no lanes, at a quarter of the ceiling, with
//!   an urgent job every 0.3 s until 10 s after they are parked: the urgent jobs'
//!   publish-to-dispatch times and the parking rate; then the same jobs as a
//!   backlog: how fast the workers park them, against the ceiling. One worker and
//!   three, `--rounds` rounds, each with its own ceiling.
//! - **tenants** ([`tenants`], only when asked for): fair shares inside a lane:
//!   tenant `a`'s `--jobs` bulk jobs (default 200,000) parked, then 2,000 of `b`
//!   (weight 1) and of `c` (weight 2), the channel at `--tenants-rate` (60/s): each
//!   tenant's share of the dispatches over 60 s against 1:1:2, and `b`'s and `c`'s
//!   completion against what their shares promise. One worker and three.
//! - **digest** ([`digest`], only when asked for): a policy with a `window` digest
//!   (2 s), `--jobs` jobs (default 100,000) ten a recipient, on a private
//!   `redis-server`: a backlog folded as fast as the worker can, then the same
//!   offered at half that rate: digests sent against those expected, items in them
//!   against jobs, items folded per second, Redis bytes per held item, and the time
//!   from a window's end to its digest's arrival on the dispatch queue.
//! - **fallback** ([`fallback`], only when asked for): `--jobs` jobs (default
//!   100,000) routed push → email → sms with push capped for half of their
//!   recipients, against mix (a) in the same rounds (which first alternating):
//!   jobs/s and the ratio; as many escalations pending (an hour), on a private
//!   `redis-server`: Redis bytes per pending escalation and the broker's queues;
//!   jobs escalating after 2 s at a steady rate: from each step's deadline to the
//!   next step's dispatch.
//! - **memory** ([`memory`]): Redis `used_memory` growth per recipient holding three
//!   sends.
//!
//! Results ([`report`]): a table on stdout ([`table`]), `<out>/bench.json` and
//! `<out>/bench.svg` ([`plot`]).
//!
//! Around the steps: [`cli`] the arguments, [`jobs`] the job bodies, [`broker`] the
//! benchmark's own broker work (backlogs, offered rates, arrival times), [`procs`]
//! the worker and Redis processes, [`sample`] CPU and RSS from `/proc`, [`metrics`]
//! the worker's HTTP endpoint and its Prometheus text, [`teardown`] deleting what the
//! steps declared, [`context`] what every step is given, [`cluster`] the nodes of
//! `--redis-cluster`. Free ports, URLs and the worker's environment come from the
//! support crate the tests share (`testkit`).

mod broker;
mod campaign;
mod ceiling;
mod cli;
mod cluster;
mod context;
mod digest;
mod engine;
mod fallback;
mod jobs;
mod lanes;
mod latency;
mod layers;
mod limits;
mod memory;
mod metrics;
mod mixes;
mod plot;
mod procs;
mod rate;
mod recovery;
mod report;
mod run;
mod sample;
mod scale;
mod table;
mod teardown;
mod tenants;

use anyhow::Result;
use clap::Parser;

fn main() -> Result<()> {
    let args = cli::Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run::run(args))
}
