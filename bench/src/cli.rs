//! The command line: every option of `bench`, and the defaults that depend on
//! `--quick`. Pure: no I/O.

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Benchmark quota-worker against the broker's own ceiling")]
pub struct Args {
    /// A short run (under a minute) for CI.
    #[arg(long)]
    pub quick: bool,
    /// Jobs per mix (default 30,000 quick, 200,000 full).
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Recipients for the memory step (default 10,000 quick, 1,000,000 full).
    #[arg(long)]
    pub recipients: Option<usize>,
    /// Steps to run (comma-separated: engine, engine-limits, rate, a, b, c, latency, lanes, recovery,
    /// campaign, tenants, digest, fallback, memory, scale); each mix, each latency round and each
    /// scale round measure their own ceiling right before. `scale` is not in the
    /// default run (it preloads millions of keys), nor `lanes` (the urgent wait behind
    /// a bulk backlog of `--jobs`, default 100,000, paced at 100/s: about 20 minutes per
    /// pass), nor `recovery` (a backlog of `--jobs` parked in a lane drained at half the
    /// ceiling, four passes), nor `campaign` (`--jobs`, default 100,000, bulk jobs of a
    /// channel paced at `--campaign-rate`, of `--campaign-tenants` tenants, published
    /// to the jobs exchange at a quarter of the ceiling with urgent jobs every 0.3 s
    /// until 10 s after they are parked, then the same as a backlog; one and
    /// three workers, `--rounds` rounds of about 2 minutes), nor `digest` (`--jobs`,
    /// default 100,000, folded into digests of a 2 s window, ten a recipient: a
    /// backlog, then paced at half its fold rate), nor `fallback` (`--jobs`, default
    /// 100,000, routed push → email → sms against mix (a) in `--rounds` rounds; as many
    /// escalations pending; 3,000 escalating after 2 s), nor `tenants` (`--jobs`,
    /// default 200,000, bulk jobs of tenant a, then 2,000 of b and of c (weight 2),
    /// paced at `--tenants-rate`; one and three workers, a few minutes each), nor
    /// `engine-limits` (admissions with three limits, three matching nothing and
    /// none, `--rounds` rounds, default 8, of `--jobs`, default 20,000).
    #[arg(
        long,
        default_value = "engine,a,b,c,latency,memory",
        value_delimiter = ','
    )]
    pub steps: Vec<String>,
    /// Seconds each latency pass offers jobs (default 10 quick, 30 full).
    #[arg(long)]
    pub latency_secs: Option<u64>,
    /// The scale step: recipients already in Redis, one run each (default 10,000 and
    /// 100,000 quick; 10,000 and 10,000,000 full).
    #[arg(long, value_delimiter = ',')]
    pub scale_recipients: Vec<usize>,
    /// The scale step: policies in use, one run each with every recipient count.
    #[arg(long, value_delimiter = ',', default_value = "1,10")]
    pub scale_policies: Vec<usize>,
    /// Paired runs (ceiling, then mix) per mix; the round with the median ratio is
    /// reported, and every round's ratio is listed (default 1 quick, 5 full).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// The campaign step: the channel's rate, jobs per second.
    #[arg(long, default_value_t = 100)]
    pub campaign_rate: u64,
    /// The campaign step: the tenants the jobs belong to, round-robin (job `i` and
    /// urgent job `i` of tenant `t<i mod N>`); 0 (the default): jobs without a
    /// `tenant`, as the step ran before tenants had lanes of their own.
    #[arg(long, default_value_t = 0)]
    pub campaign_tenants: usize,
    /// The tenants step: the channel's rate, jobs per second.
    #[arg(long, default_value_t = 60)]
    pub tenants_rate: u64,
    /// The tenants step: N tenants active at once in one lane instead (what they
    /// cost the broker, Redis and the worker, the drain, what is left after); 0
    /// (the default): tenants a, b and c.
    /// The engine-limits step: senders the jobs take turns with (each call then
    /// meets about as many sender buckets as it has jobs, up to this many).
    #[arg(long, default_value_t = 1_000)]
    pub limits_senders: usize,
    #[arg(long, default_value_t = 0)]
    pub tenants_count: usize,
    /// With `--tenants-count`: bulk jobs of each tenant.
    #[arg(long, default_value_t = 5)]
    pub tenants_jobs_each: usize,
    /// With `--tenants-count`: worker processes of each pass, one pass each.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub tenants_workers: Vec<usize>,
    /// With `--tenants-count`: at most how long to wait, after the last dispatch,
    /// for the tenants' queues and entries to go (0: not at all).
    #[arg(long, default_value_t = 300)]
    pub tenants_quiet_secs: u64,
    /// Prefetch for the ceiling and the worker alike (default: the worker's default).
    #[arg(long)]
    pub prefetch: Option<u16>,
    /// Skip the latency step's second pass, with the worker and Redis under
    /// real-time scheduling (SCHED_FIFO, by `chrt`).
    #[arg(long)]
    pub no_realtime: bool,
    /// Delete queues only at the end of the run (always so from 500,000 jobs per mix).
    #[arg(long)]
    pub defer_deletes: bool,
    /// Where to write bench.json and bench.svg.
    #[arg(long, default_value = "target/bench")]
    pub out: PathBuf,
    /// The worker binary (default: `quota-worker` next to this one).
    #[arg(long)]
    pub worker: Option<PathBuf>,
    /// AMQP URL.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp: String,
    /// Redis URL.
    #[arg(long, default_value = "redis://127.0.0.1:6379")]
    pub redis: String,
    /// Run the worker on a Redis Cluster instead, given its nodes' URLs
    /// (comma-separated; `bench/cluster.sh` starts three masters on loopback).
    /// Mixes and the latency step only; Redis CPU is the sum of the nodes'.
    #[arg(long, value_delimiter = ',')]
    pub redis_cluster: Vec<String>,
}

impl Args {
    /// Jobs per mix.
    pub fn jobs(&self) -> usize {
        self.jobs
            .unwrap_or(if self.quick { 30_000 } else { 200_000 })
    }

    /// Paired rounds per mix, latency share and scale configuration.
    pub fn rounds(&self) -> usize {
        self.rounds.unwrap_or(if self.quick { 1 } else { 5 }).max(1)
    }

    /// Recipients of the memory step.
    pub fn recipients(&self) -> usize {
        self.recipients
            .unwrap_or(if self.quick { 10_000 } else { 1_000_000 })
    }

    /// Seconds each latency pass offers jobs.
    pub fn latency_secs(&self) -> u64 {
        self.latency_secs
            .unwrap_or(if self.quick { 10 } else { 30 })
    }

    /// Recipient counts of the scale step.
    pub fn scale_recipients(&self) -> Vec<usize> {
        match (self.scale_recipients.is_empty(), self.quick) {
            (false, _) => self.scale_recipients.clone(),
            (true, true) => vec![10_000, 100_000],
            (true, false) => vec![10_000, 10_000_000],
        }
    }

    /// Whether `--steps` names `step`.
    pub fn runs(&self, step: &str) -> bool {
        self.steps.iter().any(|s| s == step)
    }
}
