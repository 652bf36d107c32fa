//! Every metric the worker records, named once here: the names, their
//! descriptions and histogram buckets, the Prometheus recorder `/metrics` renders,
//! the outcome counters the rules in force look up once ([`JobMetrics`]), the
//! per-session handles ([`SessionMetrics`]), and the gauges sampled in the
//! background (queue depths, readiness, the process).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::job::Outcome;

/// Counter: jobs with a confirmed outcome, by `outcome` and dead-letter `reason`.
pub(crate) const JOBS_TOTAL: &str = "quota_worker_jobs_total";
/// Counter: jobs delayed, by `cause` (cap, window, schedule, in_flight,
/// dispatch_refused).
pub(crate) const DELAYS_TOTAL: &str = "quota_worker_delays_total";
/// Histogram: time to decide a job in Redis, pacing waits included.
pub(crate) const ADMISSION_SECONDS: &str = "quota_worker_admission_seconds";
/// Histogram: one admission script call, from sending it to its reply.
pub(crate) const ADMISSION_CALL_SECONDS: &str = "quota_worker_admission_call_seconds";
/// Histogram: jobs decided by one admission script call.
pub(crate) const ADMISSION_BATCH_JOBS: &str = "quota_worker_admission_batch_jobs";
/// Histogram: time from delivery to a confirmed outcome.
pub(crate) const JOB_SECONDS: &str = "quota_worker_job_seconds";
/// Gauge: deliveries being processed now.
pub(crate) const IN_FLIGHT: &str = "quota_worker_in_flight";
/// Counter: Redis commands sent (script calls included).
pub(crate) const REDIS_CALLS_TOTAL: &str = "quota_worker_redis_calls_total";
/// Counter: Redis calls that failed (the job is held and retried).
pub(crate) const REDIS_ERRORS_TOTAL: &str = "quota_worker_redis_errors_total";
/// Counter: connections made to a Redis master named by the sentinels (the first,
/// then one per failover or lost connection).
pub(crate) const REDIS_MASTER_CHANGES_TOTAL: &str = "quota_worker_redis_master_connections_total";
/// Counter: `WAIT`s after admission calls (`redis.wait_replicas`), by `result`
/// (replicated, short: fewer replicas than asked within `redis.wait_timeout`).
pub(crate) const REPLICA_WAITS_TOTAL: &str = "quota_worker_replica_waits_total";
/// Counter: times this worker found Redis without its data (its reset marker gone).
pub const REDIS_RESETS_TOTAL: &str = "quota_worker_redis_resets_total";
/// Gauge: 1 while jobs of policies with rules or not required are held after a Redis reset
/// (`redis.on_reset = "pause"`), until `admin resume`.
pub const PAUSED: &str = "quota_worker_paused";
/// Gauge: 1 while the broker blocks the worker's connection (`connection.blocked`:
/// a memory or disk alarm); no new jobs are taken meanwhile.
pub const BROKER_BLOCKED: &str = "quota_worker_broker_blocked";
/// Counter: broker sessions that ended in an error.
pub(crate) const BROKER_ERRORS_TOTAL: &str = "quota_worker_broker_errors_total";
/// Counter: reconnections to the broker.
pub(crate) const RECONNECTS_TOTAL: &str = "quota_worker_reconnects_total";
/// Histogram: how long a delayed job is held, by `cause`.
pub(crate) const DELAY_SECONDS: &str = "quota_worker_delay_seconds";
/// Gauge: messages ready in each queue of the topology, by `role` and `queue`.
pub(crate) const QUEUE_MESSAGES: &str = "quota_worker_queue_messages";
/// Gauge: consumers of each queue of the topology, by `role` and `queue`.
pub(crate) const QUEUE_CONSUMERS: &str = "quota_worker_queue_consumers";
/// Gauge: 1 while ready (broker connected with the topology declared, Redis up).
pub const READY: &str = "quota_worker_ready";
/// Gauge: 1 while a `dependency` (broker, redis) is up.
pub(crate) const UP: &str = "quota_worker_up";
/// Gauge: always 1, labelled with the `version`.
pub(crate) const BUILD_INFO: &str = "quota_worker_build_info";
/// Counter: verdicts of shadow policies, by `policy` and `verdict`.
pub(crate) const SHADOW_TOTAL: &str = "quota_worker_shadow_total";
/// Counter: feedback from the senders, by `event` (`malformed` for bad feedback).
pub const FEEDBACK_TOTAL: &str = "quota_worker_feedback_total";
/// Recipients suppressed on a channel by feedback or the admin, by `kind`.
pub const SUPPRESSIONS_TOTAL: &str = "quota_worker_suppressions_total";
/// Counter: jobs the recipients' preferences stopped or held, by `outcome`
/// (`opted_out`, `quiet_hours`).
pub const PREFERENCE_TOTAL: &str = "quota_worker_preference_total";
/// Counter: jobs that moved on to their next channel, by `policy`, `from`, `to`
/// and `cause` (`capped`, `opted_out`, `suppressed`, `failed`, `unanswered`).
pub const FALLBACK_TOTAL: &str = "quota_worker_fallback_total";
/// Counter: requests to the preferences API (`/v1/recipients/...`), by `status`.
pub const PREFERENCE_REQUESTS_TOTAL: &str = "quota_worker_preference_requests_total";
/// Seconds from a job's dispatch (its recorded send) to its `delivered` feedback.
pub const DELIVERY_SECONDS: &str = "quota_worker_delivery_seconds";
/// Each paced channel's send rate in force, jobs per second: the configured rate,
/// 0 while paused after a provider's throttling, then climbing back.
pub const CHANNEL_RATE: &str = "quota_worker_channel_rate";
/// Counter: configuration reloads, by `result` (applied, refused).
pub(crate) const RELOADS_TOTAL: &str = "quota_worker_reloads_total";

/// Counter: spans the trace exporter dropped: its queue was full (a slow or dead
/// collector) or their export failed.
pub const TRACE_SPANS_DROPPED_TOTAL: &str = "quota_worker_trace_spans_dropped_total";

/// Counter: jobs of paced channels by lane, by `channel`, `lane` and `step`
/// (parked: put in the lane's queue; taken: given a send slot from it).
pub const LANE_JOBS_TOTAL: &str = "quota_worker_lane_jobs_total";
/// Counter: of the jobs parked, those parked without asking Redis, behind this
/// worker's lane jobs waiting for the rate, by `channel` and `lane`.
pub const LANE_PARKED_UNASKED_TOTAL: &str = "quota_worker_lane_parked_unasked_total";
/// Histogram: how long a job waited in its lane, from being parked (or published
/// to the lane) to its send slot, by `channel` and `lane`.
pub const LANE_WAIT_SECONDS: &str = "quota_worker_lane_wait_seconds";

/// Gauge: deliveries this worker holds at most from each lane queue of a paced
/// channel, by `channel` (what its rate needs, within `lanes.prefetch`).
pub const LANE_PREFETCH: &str = "quota_worker_lane_prefetch";
/// Gauge: tenants' queues of the lanes (fair shares) this worker consumes, all
/// channels and lanes together (no label per tenant).
pub const TENANT_QUEUES: &str = "quota_worker_tenant_queues";
/// Gauge: how far ahead of now this worker's lane lines of a paced channel take
/// send slots (twice the longest recent round trip of their asks to Redis, within
/// 10 ms and 250 ms), by `channel` and `lane`.
pub const LANE_LOOK_AHEAD_SECONDS: &str = "quota_worker_lane_look_ahead_seconds";

/// Counter: jobs folded into digests, by `policy`.
pub const DIGEST_ITEMS_TOTAL: &str = "quota_worker_digest_items_total";
/// Counter: digests closed, by `policy` and `result` (sent: published as one job;
/// empty: no item left, nothing sent; dead: its job, sent, was dead-lettered).
pub const DIGESTS_TOTAL: &str = "quota_worker_digests_total";
/// Histogram: items per digest sent, by `policy`.
pub const DIGEST_ITEMS: &str = "quota_worker_digest_items";
/// Upper bounds of the items-per-digest histogram.
pub(crate) const DIGEST_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 10000.0,
];

/// Upper bounds (seconds) of the lane wait histogram: urgent jobs should take
/// well under a second; bulk ones may wait hours behind a campaign.
pub const LANE_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0,
];

/// Upper bounds (seconds) of the admission latency histogram: one Redis round trip
/// is well under a millisecond on a LAN; pacing waits can take seconds.
pub(crate) const ADMISSION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) of the whole-job latency histogram.
pub(crate) const JOB_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Upper bounds of the jobs-per-admission-call histogram (at most
/// [`crate::admission::batch::MAX_BATCH`]).
pub(crate) const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];

/// Upper bounds (seconds) of the delay-length histogram: from the ladder's first
/// level (1 s) through a minute, an hour and a day to a week and its 12-day top.
pub(crate) const DELAY_BUCKETS: &[f64] = &[
    1.0, 10.0, 60.0, 300.0, 900.0, 3600.0, 10800.0, 21600.0, 43200.0, 86400.0, 172800.0, 604800.0,
    1048576.0,
];

fn builder() -> Result<PrometheusBuilder, BuildError> {
    PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full(ADMISSION_SECONDS.into()), ADMISSION_BUCKETS)?
        .set_buckets_for_metric(
            Matcher::Full(ADMISSION_CALL_SECONDS.into()),
            ADMISSION_BUCKETS,
        )?
        .set_buckets_for_metric(Matcher::Full(ADMISSION_BATCH_JOBS.into()), BATCH_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(DELAY_SECONDS.into()), DELAY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(JOB_SECONDS.into()), JOB_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(LANE_WAIT_SECONDS.into()), LANE_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(DIGEST_ITEMS.into()), DIGEST_BUCKETS)
}

/// A recorder that is not installed globally, and its handle (tests).
pub fn local_recorder() -> Result<
    (
        metrics_exporter_prometheus::PrometheusRecorder,
        PrometheusHandle,
    ),
    BuildError,
> {
    let recorder = builder()?.build_recorder();
    let handle = recorder.handle();
    Ok((recorder, handle))
}

/// Install the Prometheus recorder for the whole process, describe the worker's
/// metrics, and return the handle `/metrics` renders. Call once, before the worker
/// starts. Spawns the recorder's periodic upkeep (needs a Tokio runtime).
pub(crate) fn install_recorder() -> Result<PrometheusHandle, BuildError> {
    let handle = builder()?.install_recorder()?;
    describe();
    process_collector().describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// The process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_open_fds`, ...), as Prometheus's own clients name them; read from
/// `/proc` each time `/metrics` is rendered.
pub(crate) fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: std::sync::OnceLock<metrics_process::Collector> = std::sync::OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

/// What kind of metric a name is.
#[derive(Clone, Copy)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}
use Kind::{Counter, Gauge, Histogram};

/// A metric's description for `/metrics`: its name, kind, unit and help text.
struct Described {
    name: &'static str,
    kind: Kind,
    seconds: bool,
    help: &'static str,
}

impl Described {
    const fn new(kind: Kind, name: &'static str, help: &'static str) -> Described {
        Described {
            name,
            kind,
            seconds: false,
            help,
        }
    }

    const fn in_seconds(kind: Kind, name: &'static str, help: &'static str) -> Described {
        Described {
            name,
            kind,
            seconds: true,
            help,
        }
    }

    /// Hand the description to the recorder.
    fn describe(&self) {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        let (name, help) = (self.name, self.help);
        match (self.kind, self.seconds) {
            (Counter, false) => describe_counter!(name, help),
            (Counter, true) => describe_counter!(name, Unit::Seconds, help),
            (Gauge, false) => describe_gauge!(name, help),
            (Gauge, true) => describe_gauge!(name, Unit::Seconds, help),
            (Histogram, false) => describe_histogram!(name, help),
            (Histogram, true) => describe_histogram!(name, Unit::Seconds, help),
        }
    }
}

/// Every metric the worker records, described.
const DESCRIBED: &[Described] = &[
    Described::new(Counter, TRACE_SPANS_DROPPED_TOTAL,
        "Spans the trace exporter dropped: its queue was full (a slow or dead collector) or their export failed"),
    Described::new(Counter, FEEDBACK_TOTAL,
        "Feedback from the senders, by event (delivered, failed, throttled, bounced, complained, unsubscribed, malformed); a duplicate is not counted again"),
    Described::new(Counter, SUPPRESSIONS_TOTAL,
        "Recipients suppressed on a channel, by kind (bounced, complained, unsubscribed)"),
    Described::new(Counter, PREFERENCE_TOTAL,
        "Jobs the recipients' preferences stopped or held, by outcome (opted_out, quiet_hours)"),
    Described::new(Counter, FALLBACK_TOTAL,
        "Jobs that moved on to their next channel, by policy, from, to and cause (capped, opted_out, suppressed, failed, unanswered)"),
    Described::new(Counter, PREFERENCE_REQUESTS_TOTAL,
        "Requests to the preferences API (/v1/recipients/R/preferences), by HTTP status"),
    Described::in_seconds(Histogram, DELIVERY_SECONDS,
        "Time from a job's dispatch to its delivered feedback"),
    Described::new(Gauge, CHANNEL_RATE,
        "Each paced channel's send rate in force, jobs per second (0 while paused after a provider's 429, then ramping back)"),
    Described::new(Counter, JOBS_TOTAL,
        "Jobs settled, by outcome (dispatched, delayed, duplicate, dead), dead-letter reason, policy and channel (empty when the job has none: malformed, or an unconfigured channel)"),
    Described::new(Counter, DELAYS_TOTAL,
        "Jobs delayed, by cause: cap, window (send windows closed), schedule (not_before ahead), in_flight (another worker holds it), dispatch_refused, paused, quiet_hours (the recipient's)"),
    Described::in_seconds(Histogram, ADMISSION_SECONDS,
        "Time to decide a job in Redis (caps and send rate, pacing waits included)"),
    Described::in_seconds(Histogram, ADMISSION_CALL_SECONDS,
        "Time of one admission script call to Redis (one call decides a batch of jobs), from sending it to its reply"),
    Described::new(Histogram, ADMISSION_BATCH_JOBS,
        "Jobs decided by one admission script call"),
    Described::in_seconds(Histogram, JOB_SECONDS,
        "Time from delivery to a confirmed outcome"),
    Described::new(Gauge, IN_FLIGHT,
        "Deliveries being processed now"),
    Described::new(Counter, REDIS_ERRORS_TOTAL,
        "Redis calls that failed (the job is held and retried)"),
    Described::new(Counter, BROKER_ERRORS_TOTAL,
        "Broker sessions that ended in an error"),
    Described::new(Counter, RECONNECTS_TOTAL,
        "Reconnections to the broker"),
    Described::new(Counter, REDIS_MASTER_CHANGES_TOTAL,
        "Connections made to the Redis master the sentinels name (the first, then one per failover or lost connection)"),
    Described::new(Counter, REPLICA_WAITS_TOTAL,
        "WAITs after admission calls (redis.wait_replicas), by result: replicated, or short (fewer replicas than asked in time: the jobs are held and retried)"),
    Described::new(Counter, REDIS_CALLS_TOTAL,
        "Redis commands sent (a script call or a pipeline counts once)"),
    Described::in_seconds(Histogram, DELAY_SECONDS,
        "How long a delayed job is held before it is decided again, by cause"),
    Described::new(Gauge, QUEUE_MESSAGES,
        "Messages ready in each queue of the topology, by role (jobs, lane, delay, dispatch, dead) and queue; read every 5 s"),
    Described::new(Gauge, QUEUE_CONSUMERS,
        "Consumers of each queue of the topology, by role and queue; read every 5 s"),
    Described::new(Gauge, READY,
        "1 while the worker is ready: broker connected with the topology declared, and Redis answering"),
    Described::new(Gauge, UP,
        "1 while a dependency (broker, redis) is up"),
    Described::new(Gauge, BUILD_INFO,
        "Always 1; the labels say which build runs"),
    Described::new(Counter, SHADOW_TOTAL,
        "Jobs of shadow policies, by what enforcing the policy would have done (allowed, held_cap, held_window, dead)"),
    Described::new(Counter, RELOADS_TOTAL,
        "Configuration reloads (SIGHUP, admin reload), by result (applied, refused)"),
    Described::new(Counter, LANE_JOBS_TOTAL,
        "Jobs of paced channels by channel, lane (urgent, normal, bulk) and step: parked (put in the lane's queue), taken (given a send slot from it)"),
    Described::new(Counter, LANE_PARKED_UNASKED_TOTAL,
        "Of the jobs parked, those parked without asking Redis: behind this worker's lane jobs waiting for the rate, while it holds its channel saturated; by channel and lane"),
    Described::in_seconds(Histogram, LANE_WAIT_SECONDS,
        "How long a job waited in its lane for its channel's rate, by channel and lane"),
    Described::new(Counter, DIGEST_ITEMS_TOTAL,
        "Jobs folded into digests, by policy"),
    Described::new(Counter, DIGESTS_TOTAL,
        "Digests closed, by policy and result (sent: published as one job; empty: no item left, nothing sent; dead: its job, sent, was dead-lettered)"),
    Described::new(Histogram, DIGEST_ITEMS,
        "Items per digest sent, by policy"),
    Described::new(Gauge, TENANT_QUEUES,
        "Tenants' queues of the lanes (fair shares) this worker consumes, all channels and lanes together"),
    Described::new(Gauge, LANE_PREFETCH,
        "Deliveries this worker holds at most from each lane queue of a paced channel (what its rate needs, within lanes.prefetch), by channel"),
    Described::in_seconds(Gauge, LANE_LOOK_AHEAD_SECONDS,
        "How far ahead of now this worker's lane lines take send slots: twice the longest recent round trip of their asks to Redis, within 10 ms and 250 ms; by channel and lane"),
    Described::new(Counter, REDIS_RESETS_TOTAL,
        "Times Redis was found without its data (restarted empty, flushed, failed over to an empty replica): every recorded send forgotten"),
    Described::new(Gauge, PAUSED,
        "1 while jobs of policies with rules or not required are held after a Redis reset (redis.on_reset = pause), until admin resume"),
    Described::new(Gauge, BROKER_BLOCKED,
        "1 while the broker blocks the connection (a memory or disk alarm): no new jobs taken, outcomes wait for their confirms"),
];

/// Describe every metric the worker records, and register the error counters at 0
/// so that dashboards see them before the first error.
pub fn describe() {
    for d in DESCRIBED {
        d.describe();
    }
    metrics::gauge!(PAUSED).set(0.0);
    metrics::gauge!(BROKER_BLOCKED).set(0.0);
    for name in [
        REDIS_ERRORS_TOTAL,
        BROKER_ERRORS_TOTAL,
        RECONNECTS_TOTAL,
        REDIS_RESETS_TOTAL,
    ] {
        metrics::counter!(name).absolute(0);
    }
    for result in ["applied", "refused"] {
        metrics::counter!(RELOADS_TOTAL, "result" => result).absolute(0);
    }
    metrics::gauge!(IN_FLIGHT).set(0.0);
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    health(false, false);
}

/// Record whether the broker blocks the connection (flow control: [`crate::amqp::flow`]).
pub(crate) fn broker_blocked(blocked: bool) {
    metrics::gauge!(BROKER_BLOCKED).set(if blocked { 1.0 } else { 0.0 });
}

/// Record readiness: the broker and Redis, each up or not.
pub fn health(broker: bool, redis: bool) {
    let one = |up: bool| if up { 1.0 } else { 0.0 };
    metrics::gauge!(READY).set(one(broker && redis));
    metrics::gauge!(UP, "dependency" => "broker").set(one(broker));
    metrics::gauge!(UP, "dependency" => "redis").set(one(redis));
}

/// Record the depth and consumers of one queue.
pub fn queue(role: &'static str, queue: &str, messages: u32, consumers: u32) {
    let labels = [("role", role.to_string()), ("queue", queue.to_string())];
    metrics::gauge!(QUEUE_MESSAGES, &labels).set(f64::from(messages));
    metrics::gauge!(QUEUE_CONSUMERS, &labels).set(f64::from(consumers));
}

/// Count one verdict of a shadow policy.
pub(crate) fn shadowed(policy: &str, verdict: crate::decide::ShadowVerdict) {
    metrics::counter!(SHADOW_TOTAL, "policy" => policy.to_string(), "verdict" => verdict.label())
        .increment(1);
    let mut seen = SHADOW_SEEN.lock().unwrap_or_else(|e| e.into_inner());
    *seen
        .entry((policy.to_string(), verdict.label()))
        .or_default() += 1;
}

/// The shadow verdicts counted by this process, by policy and verdict (the
/// console's policies page).
static SHADOW_SEEN: std::sync::Mutex<std::collections::BTreeMap<(String, &'static str), u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// How many jobs of one policy got one shadow verdict in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShadowCount {
    /// The policy.
    pub policy: String,
    /// What enforcing it would have done.
    pub verdict: &'static str,
    /// How many jobs.
    pub jobs: u64,
}

/// The shadow verdicts counted by this process, by policy and verdict.
pub fn shadow_counts() -> Vec<ShadowCount> {
    let seen = SHADOW_SEEN.lock().unwrap_or_else(|e| e.into_inner());
    seen.iter()
        .map(|((policy, verdict), jobs)| ShadowCount {
            policy: policy.clone(),
            verdict,
            jobs: *jobs,
        })
        .collect()
}

/// Count one job folded into a digest of `policy`.
pub(crate) fn digest_folded(policy: &str) {
    metrics::counter!(DIGEST_ITEMS_TOTAL, "policy" => policy.to_string()).increment(1);
}

/// Count one digest of `policy` closed with `result` (`sent`, `empty`, `dead`: its
/// job dead-lettered), holding `items`.
pub(crate) fn digest_ended(policy: &str, result: &'static str, items: usize) {
    let policy = policy.to_string();
    metrics::counter!(DIGESTS_TOTAL, "policy" => policy.clone(), "result" => result).increment(1);
    if result == "sent" {
        metrics::histogram!(DIGEST_ITEMS, "policy" => policy).record(items as f64);
    }
}

/// Jobs settled by this process, by outcome kind (for the status page, which
/// cannot read the recorder's counters back).
static SETTLED: [AtomicU64; Outcome::KINDS] = [const { AtomicU64::new(0) }; Outcome::KINDS];

/// Jobs this process settled so far, by outcome kind (see [`Outcome::labels`]).
pub fn settled() -> [u64; Outcome::KINDS] {
    std::array::from_fn(|k| SETTLED[k].load(Ordering::Relaxed))
}

/// The `policy` and `channel` labels a job's outcome is counted under, as indexes
/// into the configured policies and channels (both sorted by name); `None`: the
/// empty label (a body that is not a job has neither, a job naming an unconfigured
/// channel has no channel). Bounded by the configuration, whatever jobs say.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JobLabels {
    /// Index of the job's policy.
    pub policy: Option<usize>,
    /// Index of the job's channel.
    pub channel: Option<usize>,
}

/// The handles a broker session records per job, looked up once per session.
pub(crate) struct SessionMetrics {
    pub in_flight: metrics::Gauge,
    pub job_seconds: metrics::Histogram,
    pub admission_seconds: metrics::Histogram,
    /// Delays and their lengths, by cause ([`crate::decide::DelayCause::index`]).
    delays: [(metrics::Counter, metrics::Histogram); crate::decide::DelayCause::LABELS.len()],
}

impl SessionMetrics {
    pub fn new() -> SessionMetrics {
        SessionMetrics {
            in_flight: metrics::gauge!(IN_FLIGHT),
            job_seconds: metrics::histogram!(JOB_SECONDS),
            admission_seconds: metrics::histogram!(ADMISSION_SECONDS),
            delays: crate::decide::DelayCause::LABELS.map(|cause| {
                (
                    metrics::counter!(DELAYS_TOTAL, "cause" => cause),
                    metrics::histogram!(DELAY_SECONDS, "cause" => cause),
                )
            }),
        }
    }

    /// Count one delay by its cause, with how long it holds the job.
    pub fn delayed(&self, cause: &crate::decide::DelayCause, held: Duration) {
        let (count, length) = &self.delays[cause.index()];
        count.increment(1);
        length.record(held.as_secs_f64());
    }
}

impl std::fmt::Debug for SessionMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SessionMetrics")
    }
}

/// The outcome counters of every (policy, channel), looked up in the recorder once
/// for the rules in force instead of once per job (every outcome's counter thereby
/// shows from the start, at 0).
pub(crate) struct JobMetrics {
    /// By (policy, channel), each an array by outcome kind.
    outcomes: Vec<[metrics::Counter; Outcome::KINDS]>,
    channels: usize,
    policies: usize,
}

impl std::fmt::Debug for JobMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobMetrics")
    }
}

impl JobMetrics {
    /// Handles for every outcome of every (policy, channel) of these sorted names.
    pub fn new(policies: &[String], channels: &[String]) -> JobMetrics {
        let label = |names: &[String], i: usize| names.get(i).cloned().unwrap_or_default();
        let mut outcomes = Vec::with_capacity((policies.len() + 1) * (channels.len() + 1));
        for p in 0..=policies.len() {
            for c in 0..=channels.len() {
                let (policy, channel) = (label(policies, p), label(channels, c));
                outcomes.push(std::array::from_fn(|k| {
                    let (outcome, reason) = Outcome::labels(k);
                    metrics::counter!(JOBS_TOTAL, "outcome" => outcome, "reason" => reason,
                        "policy" => policy.clone(), "channel" => channel.clone())
                }));
            }
        }
        JobMetrics {
            outcomes,
            channels: channels.len(),
            policies: policies.len(),
        }
    }

    /// Count one confirmed outcome.
    pub fn count(&self, outcome: &Outcome, labels: JobLabels) {
        let p = labels.policy.unwrap_or(self.policies).min(self.policies);
        let c = labels.channel.unwrap_or(self.channels).min(self.channels);
        self.outcomes[p * (self.channels + 1) + c][outcome.kind()].increment(1);
        SETTLED[outcome.kind()].fetch_add(1, Ordering::Relaxed);
    }
}

/// Show `channel`'s rate in force: `interval` µs per unit of `rate.cost` (`None`:
/// paused).
pub fn channel_rate(channel: &str, rate: crate::quota::policy::Rate, interval: Option<u64>) {
    let per_second = interval.map_or(0.0, |i| 1e6 / i.max(1) as f64 / rate.cost.max(1) as f64);
    metrics::gauge!(CHANNEL_RATE, "channel" => channel.to_string()).set(per_second);
    let mut rates = CHANNEL_RATES.lock().unwrap_or_else(|e| e.into_inner());
    rates.insert(channel.to_string(), per_second);
}

/// Set [`LANE_LOOK_AHEAD_SECONDS`] for `channel`.
pub(crate) fn lane_look_ahead(channel: &str, lane: &'static str, ahead: std::time::Duration) {
    metrics::gauge!(
        LANE_LOOK_AHEAD_SECONDS,
        "channel" => channel.to_string(),
        "lane" => lane
    )
    .set(ahead.as_secs_f64());
}

/// Set [`TENANT_QUEUES`].
pub(crate) fn tenant_queues(n: usize) {
    metrics::gauge!(TENANT_QUEUES).set(n as f64);
}

/// Set [`LANE_PREFETCH`] for `channel`.
pub(crate) fn lane_prefetch(channel: &str, n: u16) {
    metrics::gauge!(LANE_PREFETCH, "channel" => channel.to_string()).set(f64::from(n));
}

/// The feedback events counted, in the order of `quota_worker_feedback_total`'s
/// `event` label values (the status page shows them).
pub const FEEDBACK_EVENTS: [&str; 7] = [
    "delivered",
    "failed",
    "throttled",
    "bounced",
    "complained",
    "unsubscribed",
    "malformed",
];
static FEEDBACK_SEEN: [AtomicU64; 7] = [const { AtomicU64::new(0) }; 7];
static SUPPRESSIONS_ADDED: [AtomicU64; 3] = [const { AtomicU64::new(0) }; 3];
static CHANNEL_RATES: std::sync::Mutex<std::collections::BTreeMap<String, f64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Count one feedback of `event` (one of [`FEEDBACK_EVENTS`]).
pub fn feedback(event: &'static str) {
    metrics::counter!(FEEDBACK_TOTAL, "event" => event).increment(1);
    if let Some(i) = FEEDBACK_EVENTS.iter().position(|e| *e == event) {
        FEEDBACK_SEEN[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Count one suppression added, of `kind` (`bounced`, `complained`, `unsubscribed`).
pub fn suppression_added(kind: &'static str) {
    metrics::counter!(SUPPRESSIONS_TOTAL, "kind" => kind).increment(1);
    if let Some(i) = FEEDBACK_EVENTS[3..6].iter().position(|e| *e == kind) {
        SUPPRESSIONS_ADDED[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// Feedback counted by this process, by event.
pub fn feedback_counts() -> Vec<(&'static str, u64)> {
    FEEDBACK_EVENTS
        .iter()
        .zip(&FEEDBACK_SEEN)
        .map(|(e, n)| (*e, n.load(Ordering::Relaxed)))
        .collect()
}

/// Suppressions added by this process, by kind.
pub fn suppressions_added() -> Vec<(&'static str, u64)> {
    FEEDBACK_EVENTS[3..6]
        .iter()
        .zip(&SUPPRESSIONS_ADDED)
        .map(|(e, n)| (*e, n.load(Ordering::Relaxed)))
        .collect()
}

/// Each paced channel's rate in force as last seen by this process, jobs/s.
pub fn channel_rates() -> Vec<(String, f64)> {
    let rates = CHANNEL_RATES.lock().unwrap_or_else(|e| e.into_inner());
    rates.iter().map(|(c, r)| (c.clone(), *r)).collect()
}
