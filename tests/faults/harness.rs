//! What every fault scenario shares: the settings and the job mix it publishes,
//! waiting until the queues are quiet, the checks of the caps and of the
//! duplicates, the worker panics looked for in the logs, the set-up of a run
//! ([`publish_and_start`]) and the closing checks. The one private RabbitMQ node of
//! the broker scenarios is in `node`, what the Redis failover scenarios share in
//! `failover`, the channel's rate read from its dispatches in `pace`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use quota_worker::config::{ChannelSettings, Dur, PolicySettings, RuleSettings, Settings};
use testkit::audit::{self, depth, Audit, Published};
use testkit::procs::WorkerProc;
use testkit::*;

mod digests;
mod failover;
mod node;
mod pace;

pub(crate) use digests::*;
pub(crate) use failover::*;
pub(crate) use node::*;
pub(crate) use pace::*;

/// Scenarios load the machine; run them one at a time.
pub(crate) static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub(crate) async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    HEAVY.lock().await
}

pub(crate) fn policy(rules: &[(u32, &str)]) -> PolicySettings {
    PolicySettings {
        rules: rules
            .iter()
            .map(|(limit, window)| RuleSettings {
                limit: *limit,
                window: window.parse().unwrap(),
            })
            .collect(),
        ..Default::default()
    }
}

/// Settings for a fault scenario: three policies (no cap, one per local day, two per
/// rolling 2 s), channel `sms` paced at `rate` per second, a 3 s reservation lease so
/// jobs orphaned by a crash come back within the test.
pub(crate) fn fault_settings(ns: &str, rate: u64) -> Settings {
    let mut s = settings(ns);
    s.redis.reservation_lease = Dur(Duration::from_secs(3));
    s.worker.shutdown_grace = Dur(Duration::from_secs(10));
    s.policies.insert("transactional".into(), policy(&[]));
    s.policies.insert("daily".into(), policy(&[(1, "1d")]));
    s.policies.insert("rolling".into(), policy(&[(2, "2s")]));
    s.channels.insert(
        "sms".into(),
        ChannelSettings {
            rate: Some(rate),
            burst: Some(20),
            ..Default::default()
        },
    );
    s
}

/// What a job of the mix is expected to become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// No cap: dispatched.
    Free,
    /// One per local day: the recipient's first is dispatched, the rest wait.
    Daily,
    /// Two per rolling 2 s: all dispatched, paced by the cap.
    Rolling,
    /// Not a job: dead-lettered `malformed`.
    Malformed,
}

impl Kind {
    /// The kind of the `i`-th job of a [`Mix`] (the last part of its id).
    pub(crate) fn at(i: usize) -> Kind {
        match i % 100 {
            0..=2 => Kind::Malformed,
            3..=12 => Kind::Daily,
            13..=19 => Kind::Rolling,
            _ => Kind::Free,
        }
    }

    /// The part of a [`Mix`]'s jobs of this kind.
    pub(crate) fn share(self) -> f64 {
        (0..100).filter(|&i| Kind::at(i) == self).count() as f64 / 100.0
    }

    /// The kind of a [`Mix`]'s job by its id (`None`: not an id of a mix).
    pub(crate) fn of_id(id: &str) -> Option<Kind> {
        let (_, i) = id.rsplit_once('-')?;
        Some(Kind::at(i.parse().ok()?))
    }
}

/// A job `id` of the `r`-th rolling-capped recipient: its recipient and its body.
pub(crate) fn rolling_job(id: &str, r: usize, zone: &str) -> (String, Vec<u8>) {
    let recipient = format!("roll-{r}");
    let body = audit::job_body(id, &recipient, "sms", "rolling", zone);
    (recipient, body)
}

pub(crate) struct Mix {
    pub(crate) jobs: Vec<Published>,
    pub(crate) kinds: BTreeMap<String, Kind>,
}

impl Mix {
    /// `n` jobs: 80 % uncapped over 500 recipients (in the three lanes), 10 % daily-capped over n/100
    /// recipients, 7 % rolling-capped over n/50, 3 % malformed.
    pub(crate) fn new(ns: &str, n: usize, zone: &str) -> Mix {
        let mut jobs = Vec::with_capacity(n);
        let mut kinds = BTreeMap::new();
        let (mut daily, mut rolling, mut free) = (0usize, 0usize, 0usize);
        for i in 0..n {
            let id = format!("{ns}-{i}");
            let (kind, recipient, body) = match Kind::at(i) {
                Kind::Malformed => (
                    Kind::Malformed,
                    String::new(),
                    format!(r#"{{"id":"{id}","recipient":42,"channel":"sms"}}"#).into_bytes(),
                ),
                Kind::Daily => {
                    daily += 1;
                    let r = format!("daily-{}", daily % (n / 100).max(1));
                    let b = audit::job_body(&id, &r, "sms", "daily", zone);
                    (Kind::Daily, r, b)
                }
                Kind::Rolling => {
                    rolling += 1;
                    let (r, b) = rolling_job(&id, rolling % Mix::rolling_recipients(n), zone);
                    (Kind::Rolling, r, b)
                }
                Kind::Free => {
                    free += 1;
                    let r = format!("free-{}", free % 500);
                    let mut b = audit::job_body(&id, &r, "sms", "transactional", zone);
                    // lane traffic: a third urgent, a third bulk, the rest their
                    // policy's (normal); sms is paced, so they wait in their lanes
                    if let Some(lane) = [Some("urgent"), Some("bulk"), None][free % 3] {
                        b.pop();
                        b.extend_from_slice(format!(r#","priority":"{lane}"}}"#).as_bytes());
                    }
                    (Kind::Free, r, b)
                }
            };
            kinds.insert(id.clone(), kind);
            jobs.push(Published {
                id,
                recipient,
                body,
            });
        }
        Mix { jobs, kinds }
    }

    /// The rolling-capped recipients of a mix of `n` jobs.
    pub(crate) fn rolling_recipients(n: usize) -> usize {
        (n / 50).max(1)
    }

    pub(crate) fn count(&self, k: Kind) -> usize {
        self.kinds.values().filter(|v| **v == k).count()
    }

    pub(crate) fn daily_recipients(&self) -> BTreeSet<String> {
        self.jobs
            .iter()
            .filter(|j| self.kinds[&j.id] == Kind::Daily)
            .map(|j| j.recipient.clone())
            .collect()
    }

    /// How many distinct jobs end up dispatched.
    pub(crate) fn expected_dispatched(&self) -> usize {
        self.count(Kind::Free) + self.count(Kind::Rolling) + self.daily_recipients().len()
    }
}

/// Declare the topology once, so jobs published before a worker starts are routed.
pub(crate) async fn declare(s: &Settings) {
    let conn = amqp().await;
    topology(s).declare(&conn).await.expect("topology");
    let _ = conn.close(200, "".into()).await;
}

/// Wait until the dispatch and dead queues hold at least the expected numbers, the
/// jobs queue is empty and the short delay levels (up to 16 s) are empty, three
/// polls in a row. Returns false once `stalled` went by without progress: the
/// deadline follows what the run does (each poll that finds more dispatched or
/// dead-lettered, or fewer jobs left to take, than ever before moves it on), so a
/// machine slow enough to take longer still settles, and a run that stopped
/// moving still fails.
pub(crate) async fn wait_until_quiet(
    conn: &lapin::Connection,
    s: &Settings,
    dispatched: usize,
    dead: usize,
    stalled: Duration,
) -> bool {
    let t = topology(s);
    let ladder = t.ladder();
    let mut progress = Progress::new(stalled);
    let mut calm = 0;
    let mut last = String::new();
    while !progress.stalled() {
        let d = depth(conn, &t.dispatch_queue("sms")).await.unwrap_or(0) as usize;
        let x = depth(conn, &s.amqp.dead_queue).await.unwrap_or(0) as usize;
        let j = depth(conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        let mut short = 0;
        for n in 0..5 {
            short += depth(conn, &ladder.queue(n)).await.unwrap_or(1);
        }
        let mut lanes = 0;
        for (q, ..) in t.lane_queues() {
            lanes += depth(conn, &q).await.unwrap_or(1);
        }
        last = format!(
            "dispatch {d}/{dispatched}, dead {x}/{dead}, jobs queue {j}, short delays {short}, lanes {lanes}"
        );
        progress.see((d + x) as u64, u64::from(j + short + lanes));
        if d >= dispatched && x >= dead && j == 0 && short == 0 && lanes == 0 {
            calm += 1;
            if calm >= 3 {
                return true;
            }
        } else {
            calm = 0;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("did not settle: nothing moved for {stalled:?}: {last}");
    false
}

/// A deadline that moves on with progress: it passes once `stalled` went by
/// since the last time `done` was higher, or `left` lower, than ever before.
/// Both only improve a bounded number of times, so a run going round in circles
/// still ends.
pub(crate) struct Progress {
    stalled: Duration,
    since: Instant,
    best: Option<(u64, u64)>,
}

impl Progress {
    pub(crate) fn new(stalled: Duration) -> Progress {
        Progress {
            stalled,
            since: Instant::now(),
            best: None,
        }
    }

    /// A poll found `done` of the work done and `left` still to do.
    pub(crate) fn see(&mut self, done: u64, left: u64) {
        match self.best {
            // the first poll sets the mark; the clock runs from `since`
            None => self.best = Some((done, left)),
            Some((d, l)) if done > d || left < l => {
                self.best = Some((d.max(done), l.min(left)));
                self.since = Instant::now();
            }
            Some(_) => {}
        }
    }

    /// Whether `stalled` went by without progress.
    pub(crate) fn stalled(&self) -> bool {
        self.since.elapsed() >= self.stalled
    }
}

/// How the run of a mix ended: whether the queues became quiet, when, what stopping
/// the worker returned, and the audit of every job with the checks the scenarios
/// assert on.
pub(crate) struct Ending<T> {
    pub(crate) settled: bool,
    /// When the queues became quiet, or the wait gave up.
    pub(crate) quiet_at: Instant,
    /// What the `stop` future given to [`finish`] returned.
    pub(crate) stopped: T,
    pub(crate) audit: Audit,
    pub(crate) lost: Vec<String>,
    pub(crate) twice: Vec<String>,
    /// `amqp.prefetch`: the deliveries a worker holds, so what a kill can leave half done.
    pub(crate) prefetch: usize,
    pub(crate) violations: Vec<String>,
    /// The violations that are jobs dispatched whose send is recorded only as
    /// reserved, not committed: after a kill -9 between a confirmed dispatch and
    /// its commit (the crash window `RELIABILITY.md` names), the reservation still
    /// counts for the caps but a copy of the job after the lease would be sent again.
    /// Only a scenario that kills the worker may accept them.
    pub(crate) uncommitted: Vec<String>,
    /// Jobs dead-lettered that are not malformed, or for another reason.
    pub(crate) wrong_dead: Vec<String>,
}

/// The end of every mix scenario: wait until the queues are quiet (at most
/// `timeout`), stop the worker with `stop`, then audit every job of the mix and
/// check the caps.
pub(crate) async fn finish<T>(
    conn: &lapin::Connection,
    s: &Settings,
    mix: &Mix,
    timeout: Duration,
    stop: impl std::future::Future<Output = T>,
) -> Ending<T> {
    let settled = wait_until_quiet(
        conn,
        s,
        mix.expected_dispatched(),
        mix.count(Kind::Malformed),
        timeout,
    )
    .await;
    let quiet_at = Instant::now();
    let stopped = stop.await;
    let audit = Audit::collect(conn, s, &mix.jobs).await;
    judge(s, mix, audit, settled, quiet_at, stopped).await
}

/// The checks of [`finish`] on an audit already collected (a scenario that took
/// some dispatches out of the queues itself adds them to `audit` first).
pub(crate) async fn judge<T>(
    s: &Settings,
    mix: &Mix,
    audit: Audit,
    settled: bool,
    quiet_at: Instant,
    stopped: T,
) -> Ending<T> {
    eprintln!("{}", audit.summary(&mix.jobs));
    let wrong_dead = audit
        .dead
        .iter()
        .filter(|(id, reasons)| {
            mix.kinds.get(*id) != Some(&Kind::Malformed) || reasons.iter().any(|r| r != "malformed")
        })
        .map(|(id, r)| format!("{id}: {r:?}"))
        .collect();
    let violations = check_caps(s, mix, &audit).await;
    Ending {
        settled,
        quiet_at,
        stopped,
        lost: audit.lost(&mix.jobs),
        twice: audit.in_two_places(),
        prefetch: s.amqp.prefetch as usize,
        uncommitted: violations
            .iter()
            .filter(|v| v.ends_with(UNCOMMITTED))
            .cloned()
            .collect(),
        violations,
        wrong_dead,
        audit,
    }
}

/// Panics reported in the logs of every worker process a scenario ran (`dir` holds
/// them). A panicking task never settles its delivery, so there must be none.
pub(crate) fn worker_panics(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("worker-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text.lines().filter(|l| l.contains("panicked at")) {
            out.push(format!("{name}: {line}"));
        }
    }
    out
}

/// After a run that did not settle: the jobs found where they should not be, and
/// what the worker's log says about them.
pub(crate) fn explain_stuck(a: &Audit, mix: &Mix, w: &WorkerProc) {
    let log = std::fs::read_to_string(&w.log).unwrap_or_default();
    for (id, queues) in &a.waiting_in {
        let kind = mix.kinds.get(id);
        if kind == Some(&Kind::Daily) && queues.iter().all(|q| !q.ends_with(".jobs")) {
            continue;
        }
        eprintln!("stuck: {id} ({kind:?}) found in {queues:?}; its log lines:");
        for line in log.lines().filter(|l| l.contains(&format!("\"{id}\""))) {
            eprintln!("    {}", &line[..line.len().min(400)]);
        }
    }
}

/// Cap and record checks for a mix, after the audit. Returns the violations, each a
/// sentence.
/// How [`check_caps`] names a dispatched job whose send is only reserved.
pub(crate) const UNCOMMITTED: &str = ": dispatched, recorded only as reserved";

pub(crate) async fn check_caps(s: &Settings, mix: &Mix, a: &Audit) -> Vec<String> {
    let mut violations = Vec::new();
    let per = a.dispatched_per_recipient(&mix.jobs);
    for r in mix.daily_recipients() {
        let n = per.get(&r).copied().unwrap_or(0);
        if n != 1 {
            violations.push(format!(
                "daily recipient {r}: {n} distinct jobs dispatched, cap 1 (and 1 expected)"
            ));
        }
    }
    let keys = s.redis.keys();
    // as the worker connects: one node, the master the sentinels name, or a cluster
    let mut conn = quota_worker::redis::RedisConn::connect(&s.redis)
        .await
        .expect("redis for the audit");
    let mut by_recipient: BTreeMap<(&str, &'static str), Vec<&Published>> = BTreeMap::new();
    for j in &mix.jobs {
        let policy = match mix.kinds[&j.id] {
            Kind::Free => "transactional",
            Kind::Daily => "daily",
            Kind::Rolling => "rolling",
            Kind::Malformed => continue,
        };
        by_recipient
            .entry((&j.recipient, policy))
            .or_default()
            .push(j);
    }
    for ((r, policy), jobs) in by_recipient {
        let sends = audit::recorded(&mut conn, &keys.recipient(r, policy, None)).await;
        let members: BTreeMap<&[u8], bool> =
            sends.iter().map(|(_, c, m)| (m.as_slice(), *c)).collect();
        for j in jobs {
            if a.dispatched.contains_key(&j.id) {
                match members.get(quota_worker::quota::keys::member(&j.id).as_slice()) {
                    Some(true) => {}
                    Some(false) => violations.push(format!("{}{UNCOMMITTED}", j.id)),
                    None => {
                        violations.push(format!("{}: dispatched without a recorded send", j.id))
                    }
                }
            }
        }
        if policy == "rolling" {
            let times: Vec<i64> = sends.iter().map(|(t, _, _)| *t).collect();
            if let Some((a, b)) = audit::rolling_violation(&times, 2, 2000) {
                violations.push(format!(
                    "rolling recipient {r}: 3 sends within {} ms",
                    b - a
                ));
            }
        }
        if policy == "daily" && sends.len() > 1 {
            violations.push(format!(
                "daily recipient {r}: {} sends recorded",
                sends.len()
            ));
        }
    }
    violations
}

/// For each duplicated dispatch, whether a crash explains it: its first copy was
/// among the last `window` messages dispatched before a kill.
/// Also returns the largest distance (in messages) between a duplicate's first copy
/// and the kill that explains it.
pub(crate) fn explain_duplicates(
    a: &Audit,
    kill_depths: &[usize],
    window: usize,
) -> (usize, usize, Vec<String>) {
    let mut explained = 0;
    let mut farthest = 0;
    let mut unexplained = Vec::new();
    for (id, positions) in a.duplicated_ids() {
        let first = positions[0];
        match kill_depths
            .iter()
            .filter(|&&d| first < d && d - first <= window)
            .map(|&d| d - first)
            .min()
        {
            Some(distance) => {
                explained += positions.len() - 1;
                farthest = farthest.max(distance);
            }
            None => unexplained.push(format!("{id} at positions {positions:?}")),
        }
    }
    (explained, farthest, unexplained)
}

pub(crate) async fn wait_consumers(
    conn: &lapin::Connection,
    queue: &str,
    want: u32,
    timeout: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if audit::consumers(conn, queue).await == Some(want) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// The end every audited scenario shares: record its figures (with the worker
/// panics found in the logs under `dir` and the jobs lost), then assert that no
/// worker panicked, that the run settled and that nothing was lost. Each scenario's
/// own assertions follow.
pub(crate) fn conclude(
    dir: &std::path::Path,
    mut figures: serde_json::Value,
    settled: bool,
    lost: &[String],
    summary: &str,
) {
    let panics = worker_panics(dir);
    figures["worker_panics"] = serde_json::json!(panics.len());
    figures["lost"] = serde_json::json!(lost.len());
    testkit::reliability::record(figures);
    assert!(panics.is_empty(), "worker panics: {panics:#?}");
    assert!(settled, "the run did not settle: {summary}");
    assert!(
        lost.is_empty(),
        "lost {} jobs: {:?}",
        lost.len(),
        &lost[..lost.len().min(20)]
    );
}

/// A scenario under way: its mix published, one worker process running.
pub(crate) struct Loaded {
    pub(crate) conn: lapin::Connection,
    pub(crate) mix: Mix,
    /// The dispatch queue of channel `sms`.
    pub(crate) dispatch: String,
    /// The temp dir of the worker processes' configuration and logs.
    pub(crate) dir: std::path::PathBuf,
    /// When the worker process was started.
    pub(crate) started: Instant,
    pub(crate) w: WorkerProc,
}

/// Declare `s`'s topology on `conn`, publish a mix of `n` jobs there and start a
/// worker process (its log under a temp dir named `tag`).
pub(crate) async fn publish_and_start(
    conn: lapin::Connection,
    s: &Settings,
    ns: &str,
    n: usize,
    tag: &str,
) -> Loaded {
    topology(s).declare(&conn).await.expect("topology");
    let mix = Mix::new(ns, n, &audit::noon_zone());
    audit::publish_all(&conn, s, &mix.jobs).await;
    let dispatch = topology(s).dispatch_queue("sms");
    let dir = testkit::temp_dir(tag);
    let started = Instant::now();
    let w = WorkerProc::spawn(crate::BIN, s, &dir, "0");
    Loaded {
        conn,
        mix,
        dispatch,
        dir,
        started,
        w,
    }
}

impl Loaded {
    /// Wait until at least `jobs` were dispatched; panics with the worker's log if
    /// `stalled` goes by with no new dispatch (the first one counted from the
    /// worker's start).
    pub(crate) async fn until_dispatched(&self, jobs: u32, stalled: Duration) {
        let mut progress = Progress::new(stalled);
        progress.since = self.started;
        loop {
            let out = depth(&self.conn, &self.dispatch).await.unwrap_or(0);
            if out >= jobs {
                return;
            }
            progress.see(u64::from(out), u64::MAX);
            assert!(
                !progress.stalled(),
                "no progress ({jobs} dispatches wanted, {out} so far):\n{}",
                self.w.tail(40)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl<T> Ending<T> {
    /// The violations besides the sends left reserved by a kill ([`Ending::uncommitted`]).
    pub(crate) fn broken(&self) -> Vec<&String> {
        self.violations
            .iter()
            .filter(|v| !self.uncommitted.contains(v))
            .collect()
    }

    /// No job found in two places, and no violation of any kind.
    pub(crate) fn assert_clean(&self) {
        assert!(self.twice.is_empty(), "in two places: {:?}", self.twice);
        assert!(
            self.violations.is_empty(),
            "violations: {:#?}",
            self.violations
        );
    }

    /// The checks of a run whose workers were killed `kills` times: no job in two
    /// places, no id the mix does not know, no violation but sends left reserved
    /// (at most a commit batch a kill), no wrong dead letter, every duplicate
    /// explained by a fault (`unexplained` empty), every job dispatched that should.
    pub(crate) fn assert_sound_after_kills(&self, mix: &Mix, kills: usize, unexplained: &[String]) {
        let a = &self.audit;
        // A kill after a job's delayed copy was confirmed but before its delivery was
        // acked: the delivery comes back, may then be dispatched, and the delayed copy
        // still waits. It is no second send: it comes back within the dedupe window
        // (the mix's caps hold a job a day at most), and its admission finds the
        // dispatch and drops it as a duplicate. Such copies are bounded by the
        // deliveries in flight at the kills; any other id in two places fails.
        let (stray, twice): (Vec<&String>, Vec<&String>) = self.twice.iter().partition(|id| {
            a.dispatched.contains_key(*id)
                && a.waiting.contains_key(*id)
                && !a.dead.contains_key(*id)
        });
        assert!(twice.is_empty(), "jobs in two places: {twice:?}");
        assert!(
            stray.len() <= kills * self.prefetch,
            "{} dispatched jobs still waiting after {kills} kills: {stray:?}",
            stray.len()
        );
        if !stray.is_empty() {
            eprintln!(
                "{} dispatched jobs with a delayed copy left by a kill (dropped as duplicates when they come back): {stray:?}",
                stray.len()
            );
        }
        assert!(a.strangers.is_empty(), "unknown ids: {:?}", a.strangers);
        // a kill between a dispatch's confirm and its commit leaves its send reserved
        // (still counted for the caps); at most one commit batch per kill
        let broken = self.broken();
        assert!(broken.is_empty(), "cap violations: {broken:#?}");
        assert!(
            self.uncommitted.len() <= kills * 512, // worker::commits::BATCH
            "{} uncommitted after {kills} kills",
            self.uncommitted.len()
        );
        assert!(
            self.wrong_dead.is_empty(),
            "unexpected dead letters: {:?}",
            self.wrong_dead
        );
        assert!(
            unexplained.is_empty(),
            "duplicates no fault explains: {unexplained:?}"
        );
        assert_eq!(a.dispatched.len(), mix.expected_dispatched());
    }
}
