//! The report: what every step measured, as written to `bench.json` (the field names
//! are that file's contract with `bench/ab.sh`, BENCHMARKS.md and the tests), and
//! the quantile and median arithmetic the steps summarise with. Pure but for
//! [`write`].

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

#[derive(Serialize, Debug, Clone, Default)]
pub struct MixResult {
    pub name: String,
    pub jobs: usize,
    pub seconds: f64,
    pub jobs_per_sec: f64,
    pub ceiling_jobs_per_sec: f64,
    pub ratio_to_ceiling: f64,
    pub outcomes: HashMap<String, u64>,
    pub admission_p50_ms: Option<f64>,
    pub admission_p99_ms: Option<f64>,
    pub admission_p999_ms: Option<f64>,
    pub redis_calls_per_job: Option<f64>,
    pub peak_rss_mib: f64,
    pub rss_curve_mib: Vec<(f64, f64)>,
    /// CPU microseconds per job: broker, Redis, worker.
    pub cpu_us_per_job: [f64; 3],
    /// CPU microseconds per message in the paired ceiling: broker, Redis, client.
    pub ceiling_cpu_us_per_msg: [f64; 3],
    /// The ratio to the ceiling of every paired round, in run order.
    pub round_ratios: Vec<f64>,
    /// Every paired round, in run order.
    pub rounds: Vec<RoundResult>,
}

/// One paired round: the mix and its own ceiling.
#[derive(Serialize, Debug, Clone, Default)]
pub struct RoundResult {
    pub jobs_per_sec: f64,
    pub ceiling_msgs_per_sec: f64,
    pub ratio: f64,
    /// Broker + Redis + worker CPU microseconds per job.
    pub cpu_us_per_job: f64,
    /// Broker + client CPU microseconds per message in the ceiling.
    pub ceiling_cpu_us_per_msg: f64,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct Latency {
    /// How the worker and Redis were scheduled: "default", or "SCHED_FIFO 10" for
    /// both (the broker and the load generator keep the default).
    pub scheduling: String,
    pub offered_jobs_per_sec: f64,
    pub seconds: u64,
    pub jobs: u64,
    pub admission_p50_ms: Option<f64>,
    pub admission_p99_ms: Option<f64>,
    pub admission_p999_ms: Option<f64>,
    /// One admission script call (a batch of jobs) from sending it to its reply.
    pub redis_call_p50_ms: Option<f64>,
    pub redis_call_p99_ms: Option<f64>,
    pub redis_call_p999_ms: Option<f64>,
    /// Jobs per admission script call, on average.
    pub jobs_per_redis_call: Option<f64>,
    /// The round (each round measures its own ceiling) and the share of that ceiling
    /// offered.
    pub round: usize,
    pub share_of_ceiling: f64,
    pub ceiling_msgs_per_sec: f64,
    /// Publish to arrival in the dispatch queue, as the load generator sees it.
    pub end_to_end: Option<EndToEnd>,
    /// The same for the pass-through (the ceiling's relay, live) at the same rate in
    /// the same round: publish to arrival in its output queue.
    pub pass_through: Option<EndToEnd>,
}

/// One pass: the urgent jobs' wait with `workers` workers behind `backlog` bulk jobs.
#[derive(Serialize, Debug, Clone, Default)]
pub struct LaneWait {
    pub workers: usize,
    pub backlog: usize,
    pub rate: u64,
    /// Bulk jobs still waiting in their lane when the last urgent job was published.
    pub bulk_waiting: u32,
    pub urgent: EndToEnd,
}

/// Publish-to-arrival times of one pass, from a header the load generator stamps
/// and a consumer in the benchmark on the output queue.
#[derive(Serialize, Debug, Clone, Default)]
pub struct EndToEnd {
    pub sent: u64,
    pub arrived: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
    pub max_ms: f64,
    /// (quantile, ms), denser towards the tail, for the plot.
    pub curve: Vec<(f64, f64)>,
}

/// One offered rate over the latency rounds: medians of the end-to-end quantiles,
/// worker against pass-through, and every round's p99s.
#[derive(Serialize, Debug, Clone, Default)]
pub struct LatencySummary {
    pub share_of_ceiling: f64,
    pub rounds: usize,
    pub offered_jobs_per_sec: Vec<f64>,
    pub worker_p50_ms: f64,
    pub worker_p99_ms: f64,
    pub worker_p999_ms: f64,
    pub pass_through_p50_ms: f64,
    pub pass_through_p99_ms: f64,
    pub pass_through_p999_ms: f64,
    /// Worker p99 minus pass-through p99, each round, and their median.
    pub p99_gap_ms: Vec<f64>,
    pub p99_gap_median_ms: f64,
    pub admission_p99_ms: Vec<Option<f64>>,
    /// The median gap is at most 2 ms.
    pub within_2ms: bool,
}

/// One scale configuration (recipients already in Redis, policies in use) over the
/// rounds.
#[derive(Serialize, Debug, Clone, Default)]
pub struct ScaleResult {
    pub recipients: usize,
    pub policies: usize,
    pub jobs: usize,
    /// Medians over the rounds.
    pub jobs_per_sec: f64,
    pub ratio_to_ceiling: f64,
    pub cpu_us_per_job: f64,
    /// Broker / Redis / worker, medians of each.
    pub cpu_us_per_job_parts: [f64; 3],
    pub redis_us_per_job: f64,
    pub rounds: Vec<ScaleRound>,
}

#[derive(Serialize, Debug, Clone, Default)]
pub struct ScaleRound {
    pub jobs_per_sec: f64,
    pub ceiling_msgs_per_sec: f64,
    pub ratio: f64,
    pub cpu_us_per_job: [f64; 3],
    pub ceiling_cpu_us_per_msg: [f64; 3],
    pub admission_p99_ms: Option<f64>,
    pub redis_calls_per_job: Option<f64>,
    pub outcomes: HashMap<String, u64>,
}

#[derive(Serialize, Debug, Default)]
pub struct Report {
    pub machine: String,
    pub quick: bool,
    pub jobs_per_mix: usize,
    pub ceiling_jobs_per_sec: f64,
    pub redis_benchmark_evalsha_per_sec: Option<f64>,
    pub engine_admissions_per_sec: f64,
    pub engine_ratio: Option<f64>,
    pub engine_redis_calls_per_admission: f64,
    /// Redis's time per job with one layer (the policy) and with three (two caps).
    pub engine_layers: Option<LayersCost>,
    /// The engine step's limit variant (`engine-limits`): every round of three
    /// matching limits, of three matching nothing, and of none.
    pub engine_limits: Option<LimitsCost>,
    /// One channel's rate key: decisions per second, one per call (redis-benchmark).
    pub rate_key_evalsha_per_sec: Option<f64>,
    /// The same key through the engine's batched takes, 256 jobs asking at once.
    pub rate_key_engine_per_sec: Option<f64>,
    /// Redis calls per take of those.
    pub rate_key_engine_calls_per_take: Option<f64>,
    pub mixes: Vec<MixResult>,
    pub latency: Vec<Latency>,
    pub latency_summary: Vec<LatencySummary>,
    pub scale: Vec<ScaleResult>,
    /// Seconds to write the scale step's keys, and the keys written.
    pub scale_preload: Vec<(usize, u64, f64)>,
    pub memory_recipients: usize,
    pub memory_bytes_per_recipient: f64,
    pub memory_usage_one_recipient: i64,
    /// The lanes step: the urgent wait behind a bulk backlog, by workers.
    pub lanes: Vec<LaneWait>,
    /// The recovery step: a parked backlog drained at the channel's rate, by pass.
    pub recovery: Vec<Recovery>,
    /// The recovery step's bursts: how fast a campaign published to the jobs queue
    /// is parked, by workers.
    pub bursts: Vec<Burst>,
    /// The digest step: the backlog pass, then the paced one.
    pub digests: Vec<DigestRun>,
    /// The fallback step.
    pub fallback: Option<FallbackReport>,
    /// The campaign step: every pass of every round, in run order.
    pub campaign: Vec<CampaignRun>,
    /// The tenants step: one worker, then three.
    pub tenants: Vec<TenantsRun>,
    /// The tenants step with `--tenants-count`: many tenants at once.
    pub many_tenants: Vec<ManyTenantsRun>,
    /// The campaign step's medians over its rounds, by pass and workers.
    pub campaign_summary: Vec<CampaignSummary>,
}

impl EndToEnd {
    /// Quantiles of sorted microseconds.
    pub fn of(sent: u64, sorted: &[u64]) -> EndToEnd {
        let at = |q: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let i = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            sorted[i] as f64 / 1e3
        };
        // quantiles 1 - 10^-x for x = 0, 0.05, ... as far as the data reach
        let mut curve = Vec::new();
        let mut x = 0.0f64;
        while sorted.len() as f64 >= 10f64.powf(x) {
            let q = 1.0 - 10f64.powf(-x);
            curve.push((q, at(q)));
            x += 0.05;
        }
        EndToEnd {
            sent,
            arrived: sorted.len() as u64,
            p50_ms: at(0.5),
            p99_ms: at(0.99),
            p999_ms: at(0.999),
            max_ms: at(1.0),
            curve,
        }
    }
}

/// The median (of an even count, the mean of the middle two); 0 for none.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Writes `r` to `<out>/bench.json`, pretty-printed.
pub fn write(r: &Report, out: &Path) -> Result<()> {
    std::fs::write(out.join("bench.json"), serde_json::to_string_pretty(r)?)?;
    Ok(())
}

/// Redis's time per admitted job, in microseconds, with one layer and with three.
#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct LayersCost {
    /// `EVALSHA` time per job (`cmdstat_evalsha` usec / jobs), the policy alone.
    pub evalsha_us_one_layer: f64,
    /// The same with the policy and two caps.
    pub evalsha_us_three_layers: f64,
    /// Redis CPU (user + system) per job, the policy alone.
    pub cpu_us_one_layer: f64,
    /// The same with the policy and two caps.
    pub cpu_us_three_layers: f64,
}

/// What limits cost the engine's admissions (`--steps engine-limits`).
#[derive(Serialize, Debug, Default, Clone)]
pub struct LimitsCost {
    /// Admissions per configuration per round.
    pub jobs_per_round: usize,
    /// Every run, in the order they ran.
    pub rounds: Vec<LimitsRound>,
    /// Each configuration's medians over its rounds (`crate::limits::CONFIGS`' order).
    pub medians: Vec<LimitsRound>,
}

/// One run of one configuration (or, in [`LimitsCost::medians`], the medians of
/// its runs, `round` 0).
#[derive(Serialize, Debug, Default, Clone)]
pub struct LimitsRound {
    pub round: usize,
    pub config: String,
    /// Admissions per second.
    pub per_sec: f64,
    /// Redis's `EVALSHA` time per job (µs).
    pub evalsha_us: f64,
    /// Redis's CPU per job (µs).
    pub redis_cpu_us: f64,
    /// The benchmark's own CPU per job (the engine's side; µs).
    pub engine_cpu_us: f64,
    /// Jobs per `EVALSHA` (the batches' mean size).
    pub jobs_per_call: f64,
    /// Redis commands per job (every command Redis counted).
    pub commands_per_job: f64,
}

impl LimitsCost {
    /// The medians of `config`'s rounds, field by field.
    pub fn median(&self, config: &str) -> LimitsRound {
        let runs: Vec<&LimitsRound> = self.rounds.iter().filter(|r| r.config == config).collect();
        let median = |f: fn(&LimitsRound) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(|r| f(r)).collect();
            v.sort_by(|a, b| a.total_cmp(b));
            match v.len() {
                0 => 0.0,
                n if n % 2 == 1 => v[n / 2],
                n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
            }
        };
        LimitsRound {
            round: 0,
            config: config.to_string(),
            per_sec: median(|r| r.per_sec),
            evalsha_us: median(|r| r.evalsha_us),
            redis_cpu_us: median(|r| r.redis_cpu_us),
            engine_cpu_us: median(|r| r.engine_cpu_us),
            jobs_per_call: median(|r| r.jobs_per_call),
            commands_per_job: median(|r| r.commands_per_job),
        }
    }
}

/// Seconds per reported interval.
pub const INTERVAL_SECS: u64 = 5;

/// One pass of the recovery step (`recovery`).
#[derive(Serialize, Debug, Clone, Default)]
pub struct Recovery {
    pub workers: usize,
    /// Whether the broker was restarted half-way through the drain.
    pub broker_restart: bool,
    pub jobs: usize,
    /// The channel's rate (half the ceiling), jobs per second.
    pub rate: u64,
    /// The ceiling it was derived from, messages per second.
    pub ceiling_msgs_per_sec: f64,
    /// From the first dispatched job to the last.
    pub drain_secs: f64,
    /// Jobs dispatched over the whole drain, per second, divided by the rate.
    pub ratio_whole: f64,
    /// The same, without the seconds the broker was away.
    pub ratio_without_outage: f64,
    /// Seconds from the broker's last answer as it stopped to its return for the drain: the lane
    /// queue with the backlog serving a consumer again, or the dispatch queue's first
    /// answer after its start (holding at least what it held before the stop) if that
    /// is later.
    pub outage_secs: f64,
    /// Seconds from asking the broker to stop to its last answer before it went away
    /// (the workers dispatch meanwhile; the outage begins at that answer).
    pub stopping_secs: Option<f64>,
    /// Seconds from the broker's first answer to every worker consuming again (its
    /// `/readyz` at 200 after its session ended): the reconnect, and the broker
    /// answering each consumer of the session (a quorum queue holding a backlog
    /// answers its consumer last, once it has read its log again).
    pub consuming_after_secs: Option<f64>,
    /// Seconds from the broker's first answer until the bulk lane queue serves a consumer
    /// again (the bench's own, which holds at most one job and hands it back at once):
    /// no worker can drain it before.
    pub lane_serving_after_secs: Option<f64>,
    /// The first interval after the restart counted from the dispatch queue's first
    /// answer instead of the lane serving again (5 s, or to the drain's end if at
    /// least 2 s), against the rate: the broker's recovery of its queues included.
    pub first_from_answer_ratio: Option<f64>,
    /// Seconds from the broker's first answer to the first sample with more jobs dispatched
    /// (the workers' reconnect as the drain sees it, to within a sample).
    pub resumed_after_secs: Option<f64>,
    /// Jobs per second in each 5-second interval of the drain, from the first
    /// dispatch to the broker going away and from its return on (a last one of a
    /// part shorter, if at least 2 s), with the outage as an interval of its own.
    pub intervals: Vec<f64>,
    /// Each interval's length, seconds (5, a last one of a segment shorter).
    pub interval_secs: Vec<f64>,
    /// Each interval's start, seconds since the drain began (a part's last interval
    /// shorter than 2 s is left out, so they need not follow one another).
    pub interval_starts: Vec<f64>,
    /// For each interval, whether it is the broker's absence.
    pub interval_in_outage: Vec<bool>,
    /// The lowest interval's ratio to the rate, outage intervals left out.
    pub min_interval_ratio: f64,
    /// Jobs dispatched only after the drain stood still 5 s or more (those whose
    /// dispatch was in flight when the broker went away wait out
    /// `redis.reservation_lease`: they may have been sent); the figures above end
    /// at that stall.
    pub held: usize,
    /// How long the held jobs waited after the stall began.
    pub held_secs: f64,
    /// The broker's return (the dispatch queue's first answer) in the curve's
    /// seconds.
    pub returned_at_secs: Option<f64>,
    /// Dispatched jobs against seconds from the first one (a point a sample).
    pub curve: Vec<(f64, f64)>,
}

impl Recovery {
    /// Each interval's end, seconds since the drain began.
    pub fn interval_ends(&self) -> impl Iterator<Item = f64> + '_ {
        self.interval_starts
            .iter()
            .zip(&self.interval_secs)
            .map(|(a, l)| a + l)
    }
}

/// The recovery step's burst: `jobs` bulk jobs published to the jobs exchange as fast
/// as the benchmark can (a producer that knows no lanes), read and parked in their
/// lane by `workers` workers.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Burst {
    pub workers: usize,
    pub jobs: usize,
    /// Jobs per second the benchmark published (every one confirmed).
    pub publish_per_sec: f64,
    /// Jobs per second the workers read and parked: `jobs` over the time from the
    /// first publish to the jobs queue empty.
    pub parking_per_sec: f64,
    /// How long an urgent job published right behind the burst waits to be read:
    /// `jobs / parking − jobs / publish` (0 when parking keeps up), in seconds.
    pub urgent_wait_secs: f64,
}

/// One pass of the campaign step (`campaign`): `jobs` bulk jobs of a paced channel
/// published to the jobs exchange by a producer that knows no lanes (a policy whose
/// lane is `bulk`, no `priority` field), read and parked by `workers` workers.
#[derive(Serialize, Debug, Clone, Default)]
pub struct CampaignRun {
    /// `campaign`: published at `publish_per_sec` (a quarter of the ceiling) while
    /// urgent jobs are published every 0.3 s; `backlog`: published before the
    /// workers start, parked as fast as they can.
    pub pass: String,
    /// The round (from 1): its ceiling is measured at its start.
    pub round: usize,
    pub workers: usize,
    pub jobs: usize,
    /// The tenants the jobs belong to, round-robin (0: no `tenant` field).
    pub tenants: usize,
    /// The channel's rate, jobs per second.
    pub rate: u64,
    /// The round's pass-through ceiling, messages per second.
    pub ceiling_msgs_per_sec: f64,
    /// Jobs per second published (every one confirmed); `None` for the backlog.
    pub publish_per_sec: Option<f64>,
    /// Campaign: `jobs` over the time from the first publish until every job is
    /// parked (or dispatched without being parked). Backlog: the middle 80 % of the
    /// jobs over the time they took (the workers' start-up left out).
    pub parking_per_sec: f64,
    /// `parking_per_sec` over the round's ceiling.
    pub parking_ratio: f64,
    /// Campaign: seconds from the last publish until every job is parked.
    pub lag_secs: Option<f64>,
    /// Bulk jobs dispatched from the jobs queue without being parked (the rate had
    /// a slot for them at once).
    pub dispatched_unparked: u64,
    /// Bulk jobs the workers counted parked.
    pub parked: u64,
    /// Campaign: the urgent jobs' publish-to-dispatch times.
    pub urgent: Option<EndToEnd>,
    /// Campaign: the same of the urgent jobs published once every bulk job was
    /// parked (the workers' count read every 50 ms), behind the whole backlog.
    pub urgent_behind_parked: Option<EndToEnd>,
}

/// The campaign step's passes of one kind (`pass`, `workers`) over its rounds.
#[derive(Serialize, Debug, Clone, Default)]
pub struct CampaignSummary {
    pub pass: String,
    pub workers: usize,
    pub rounds: usize,
    pub parking_ratio_median: f64,
    pub parking_per_sec_median: f64,
    /// Campaign passes: medians of the rounds' urgent p50, p99 and max, ms.
    pub urgent_p50_ms_median: Option<f64>,
    pub urgent_p99_ms_median: Option<f64>,
    pub urgent_max_ms_median: Option<f64>,
    /// The highest urgent wait of every round, ms.
    pub urgent_max_ms: Option<f64>,
    /// Urgent jobs published and dispatched, over every round.
    pub urgent_sent: u64,
    pub urgent_arrived: u64,
}

/// One pass of the digest step (`digest`): jobs of a policy with a `window` digest,
/// ten a recipient one after the other, folded and sent by the real worker.
#[derive(Serialize, Debug, Clone, Default)]
pub struct DigestRun {
    /// `backlog` (published before the worker starts) or `paced` (offered at
    /// `offered_jobs_per_sec`).
    pub pass: String,
    /// Jobs published.
    pub jobs: u64,
    /// Recipients (groups), ten jobs each.
    pub recipients: u64,
    /// The digest's window, seconds.
    pub window_secs: u64,
    pub offered_jobs_per_sec: Option<f64>,
    /// Digests read from the dispatch queue.
    pub digests_sent: u64,
    /// Groups × windows: one digest per recipient (its ten jobs fall in one window).
    pub digests_expected: u64,
    /// The sum of the digests' `count`.
    pub items_in_digests: u64,
    /// Digests sent = expected, and items in them = jobs.
    pub accounted: bool,
    /// Items folded (the worker's `quota_worker_digest_items_total`).
    pub items_folded: u64,
    /// From the last sample before the first fold to the first with them all.
    pub fold_secs: f64,
    pub items_folded_per_sec: f64,
    /// Items held (folded, their digest not sent yet) at the sample holding most.
    pub peak_items_held: u64,
    /// Redis `used_memory` growth at that sample, less what the folded jobs leave
    /// after their digests are sent, over the items held.
    pub redis_bytes_per_held_item: f64,
    /// `used_memory` growth once every digest is sent, per job (marks kept
    /// `redis.record_ttl`, notes for `admin job`, the groups' hashes).
    pub redis_bytes_left_per_job: f64,
    /// From a window's end (the digest's opening instant, in its id, + the window)
    /// to its arrival on the dispatch queue.
    pub window_end_to_dispatch: EndToEnd,
    /// The same from the digest's `first_at` + the window.
    pub first_at_to_dispatch_p50_ms: f64,
    pub first_at_to_dispatch_p99_ms: f64,
    /// The worker's outcomes (`folded` the jobs, `dispatched` the digests).
    pub outcomes: HashMap<String, u64>,
}

/// The fallback step (`fallback`): jobs routed push → email → sms against mix (a),
/// what pending escalations hold, and the time from a step's deadline to the next
/// step's dispatch.
#[derive(Serialize, Debug, Clone, Default)]
pub struct FallbackReport {
    /// Jobs per drain (routed, and mix (a)).
    pub jobs: usize,
    /// Every round, in run order.
    pub rounds: Vec<FallbackRound>,
    /// Medians over the rounds.
    pub routed_jobs_per_sec: f64,
    pub mix_a_jobs_per_sec: f64,
    /// The median of each round's routed jobs/s over its mix (a)'s.
    pub ratio_to_mix_a: f64,
    pub pending: Option<PendingEscalations>,
    pub deadline: Option<DeadlineToDispatch>,
}

/// One round of the fallback step: mix (a) and the routed drain, one after the
/// other (which first alternates).
#[derive(Serialize, Debug, Clone, Default)]
pub struct FallbackRound {
    /// Whether the routed drain ran first.
    pub routed_first: bool,
    pub mix_a: Drained,
    pub routed: Drained,
    /// Routed jobs/s over mix (a)'s.
    pub ratio: f64,
    /// Dispatches of the routed drain on each channel (push less the warm-up's).
    pub push: u64,
    pub email: u64,
    pub sms: u64,
}

/// One drain of a fallback round, as [`MixResult`] gives it, without its curves.
#[derive(Serialize, Debug, Clone, Default)]
pub struct Drained {
    pub jobs_per_sec: f64,
    /// Broker, Redis, worker.
    pub cpu_us_per_job: [f64; 3],
    pub redis_calls_per_job: Option<f64>,
    pub admission_p99_ms: Option<f64>,
    pub outcomes: HashMap<String, u64>,
}

impl From<&MixResult> for Drained {
    fn from(m: &MixResult) -> Drained {
        Drained {
            jobs_per_sec: m.jobs_per_sec,
            cpu_us_per_job: m.cpu_us_per_job,
            redis_calls_per_job: m.redis_calls_per_job,
            admission_p99_ms: m.admission_p99_ms,
            outcomes: m.outcomes.clone(),
        }
    }
}

/// Pending escalations: jobs whose policy escalates after `answer_within`, their
/// first step dispatched, each waiting round the delay ladder.
#[derive(Serialize, Debug, Clone, Default)]
pub struct PendingEscalations {
    pub jobs: usize,
    pub answer_within_secs: u64,
    /// The mean job body, bytes.
    pub body_bytes: f64,
    /// `used_memory` growth per job, the same jobs without `fallback`.
    pub plain_bytes_per_job: f64,
    /// The same with `fallback` and an escalation pending.
    pub escalating_bytes_per_job: f64,
    /// The difference: Redis bytes per pending escalation.
    pub bytes_per_pending: f64,
    /// Route state keys (`<prefix>:{tag}/route:<hash>`) found, and the median
    /// `MEMORY USAGE` of a sample of them.
    pub route_states: u64,
    pub route_state_memory_usage: f64,
    /// Route logs (`<prefix>:route:<id>`) found, and the median `MEMORY USAGE` of a
    /// sample.
    pub route_logs: u64,
    pub route_log_memory_usage: f64,
    /// Keys sampled of each kind.
    pub sampled: usize,
    /// The namespace's queues holding messages once the escalating pass is done
    /// (`rabbitmqctl list_queues`), empty where it could not be read.
    pub queues: Vec<QueueFigures>,
    /// The median memory of the namespace's empty queues then: what a queue holds
    /// before its first message.
    pub empty_queue_memory: Option<u64>,
}

/// One queue as `rabbitmqctl list_queues name messages message_bytes memory` shows
/// it.
#[derive(Serialize, Debug, Clone, Default)]
pub struct QueueFigures {
    pub name: String,
    pub messages: u64,
    /// The bodies' bytes (properties and headers not counted); a quorum queue
    /// gives none.
    pub message_bytes: Option<u64>,
    /// The queue process's memory.
    pub memory: u64,
}

/// From a step's deadline (its route entry's `escalates_at`) to the next step's
/// dispatch arriving on its queue, each step of a route with `answer_within`.
#[derive(Serialize, Debug, Clone, Default)]
pub struct DeadlineToDispatch {
    pub jobs: u64,
    pub answer_within_secs: u64,
    pub offered_jobs_per_sec: f64,
    pub steps: Vec<StepDeadline>,
}

/// One step's move on (`from` → `to`) over every job.
#[derive(Serialize, Debug, Clone, Default)]
pub struct StepDeadline {
    pub from: String,
    pub to: String,
    /// Dispatches on `to` read, and of them those whose `from` step's deadline
    /// was found in the route.
    pub arrived: u64,
    pub with_deadline: u64,
    /// Deadline to arrival on `to`'s dispatch queue.
    pub to_dispatch: EndToEnd,
    /// The earliest, ms (negative: before the deadline).
    pub min_ms: f64,
    /// From the `from` step's arrival on its dispatch queue plus `answer_within`
    /// to the arrival on `to`'s (the wait as a consumer of both queues sees it),
    /// p50 and p99.
    pub from_arrival_p50_ms: f64,
    pub from_arrival_p99_ms: f64,
}

/// The tenants step's pass (`tenants.rs`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct TenantsRun {
    /// Worker processes.
    pub workers: usize,
    /// `a`'s jobs.
    pub a_jobs: usize,
    /// The channel's rate, jobs a second.
    pub rate: u64,
    /// Seconds `a` took to publish its jobs, and until they were parked.
    pub a_publish_secs: f64,
    pub a_parked_secs: f64,
    /// Dispatches in the window, and each tenant's share of them (a, b, c).
    pub window_dispatches: usize,
    pub shares: [f64; 3],
    /// Each share over its weight's (1:1:2), less 1.
    pub share_errors: [f64; 3],
    /// `b` and `c`: seconds from their publish to their first and last dispatch,
    /// and what their shares promise for the last.
    pub b_first_secs: f64,
    pub c_first_secs: f64,
    pub b_done_secs: f64,
    pub c_done_secs: f64,
    pub b_promised_secs: f64,
    pub c_promised_secs: f64,
}

/// One pass of the tenants step with `--tenants-count` (`tenants/many.rs`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ManyTenantsRun {
    pub workers: usize,
    pub tenants: usize,
    pub jobs_each: usize,
    /// The channel's rate, jobs a second.
    pub rate: u64,
    /// The worker binary.
    pub worker: String,
    /// Seconds to publish every job, and until the jobs queue was empty.
    pub publish_secs: f64,
    pub parked_secs: f64,
    /// When every tenant was active: the broker's queues of the lane's tenants,
    /// their memory (bytes) and jobs ready.
    pub tenant_queues: usize,
    pub tenant_queue_bytes: u64,
    pub tenant_queue_jobs: u64,
    /// The broker's RSS (bytes) before the workers started, and when every tenant
    /// was active (the whole node: anything else on it counts too).
    pub broker_rss_before: u64,
    pub broker_rss_active: u64,
    /// Redis `used_memory` before and when every tenant was active, and the
    /// entries of the channel's set of tenant queues then.
    pub redis_used_before: u64,
    pub redis_used_active: u64,
    pub registry_entries: u64,
    /// Each worker's RSS (bytes) when ready, and when every tenant was active.
    pub worker_rss_ready: Vec<u64>,
    pub worker_rss_active: Vec<u64>,
    /// Jobs dispatched a second over the middle 80 % of the drain, and the seconds
    /// from the first publish to the last dispatch.
    pub drain_per_sec: f64,
    pub drained_secs: f64,
    /// Seconds after the last dispatch until no tenant queue was left and the set
    /// was empty (`None`: not within the quiet's limit, or skipped).
    pub queues_gone_secs: Option<f64>,
    pub registry_gone_secs: Option<f64>,
    /// What was left at the end of the quiet: tenant queues, the fair shares' keys
    /// (name, type, entries, seconds to live; -1 none), and how many other keys
    /// (the recipients' sends, kept for their policy's window).
    pub queues_left: usize,
    pub keys_left: Vec<(String, String, u64, i64)>,
    pub other_keys_left: u64,
}
