//! The digest step (`--steps digest`): what folding a policy's jobs into digests
//! costs, on the real worker binary. The policy (`social`, no rules) has
//! `[digest] mode = "window"`, `window = "2s"` ([`WINDOW_SECS`]); `--jobs` jobs
//! (default 100,000; 10,000 with `--quick`) go to [`ITEMS_PER_GROUP`] = 10 a
//! recipient (10,000 recipients), each recipient's ten one after the other, so that
//! each falls in one window: the digests expected are one per recipient (group × one
//! window), each of ten items. The worker runs on a private `redis-server` (so that
//! `used_memory` is this step's alone) and its own queue names and key prefix. Two
//! passes:
//!
//! - **backlog**: the jobs are published before the worker starts, which folds them
//!   as fast as it can: the items folded per second. The digests closed meanwhile go
//!   to the jobs queue behind what is left of the backlog, so their dispatch waits
//!   for it: the pass's window-end-to-dispatch times are that wait.
//! - **paced**: the jobs offered at half the backlog pass's fold rate, the jobs queue
//!   near empty: the time from a window's end to its digest's dispatch as a sender
//!   sees it.
//!
//! In each pass a consumer on the channel's dispatch queue reads every digest: its
//! arrival time, its `count`, its `first_at`, and the instant it opened (in its id,
//! `dg-GROUP-<ms>-<seq>`, Redis's clock on this machine): the window ends `window`
//! after that instant. Every 100 ms the worker's `/metrics` (items folded, items in
//! digests sent) and Redis's `used_memory` are read: bytes per held item are the
//! growth of `used_memory` at the sample holding the most items, less what every
//! folded job leaves after its digest is sent (its mark, kept `redis.record_ttl`,
//! and its note for `admin job`, measured once every digest is sent), over the items
//! held then. Checked: digests received = digests expected, items in them = jobs
//! published.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use lapin::Connection;
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;

use crate::broker::{closed, connect, paced, preload, Watch};
use crate::context::{header, Bench};
use crate::metrics::{metric_sum, outcome_counts, scrape};
use crate::procs::{spawn_worker_configured, stop, wait_ready, OwnRedis};
use crate::report::{median, DigestRun, EndToEnd, Report};

/// The digest's window, seconds.
pub const WINDOW_SECS: u64 = 2;
/// Jobs a recipient (a group): each recipient's come one after the other.
pub const ITEMS_PER_GROUP: usize = 10;
/// How often the worker's metrics and Redis's memory are read.
const SAMPLE: Duration = Duration::from_millis(100);

/// Runs the step into `report`.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    if !b.args.redis_cluster.is_empty() {
        bail!("the digest step runs on a private redis-server, not with --redis-cluster");
    }
    let jobs = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 10_000 } else { 100_000 });
    let backlog = pass(b, jobs, None).await?;
    print_pass(&backlog);
    // half the fold rate measured, whole seconds of offering
    let rate = (backlog.items_folded_per_sec / 2.0).max(10.0);
    report.digests.push(backlog);
    let paced = pass(b, jobs, Some(rate)).await?;
    print_pass(&paced);
    report.digests.push(paced);
    Ok(())
}

fn print_pass(r: &DigestRun) {
    eprintln!(
        "      {}: {} digests of {} expected, {} items in them of {} jobs ({}); {:.0} items folded/s; {:.0} bytes per held item ({} held at most); window end to dispatch p50 {:.0} ms, p99 {:.0} ms",
        r.pass,
        r.digests_sent,
        r.digests_expected,
        r.items_in_digests,
        r.jobs,
        if r.accounted { "all accounted for" } else { "MISMATCH" },
        r.items_folded_per_sec,
        r.redis_bytes_per_held_item,
        r.peak_items_held,
        r.window_end_to_dispatch.p50_ms,
        r.window_end_to_dispatch.p99_ms,
    );
}

/// The worker's configuration file: the `social` policy with its digest.
fn policy_toml() -> String {
    format!(
        "[policies.social]\nrules = []\n\n[policies.social.digest]\nmode = \"window\"\nwindow = \"{WINDOW_SECS}s\"\nmax_items = 100\nkeep = 10\nkeep_from = \"first\"\n"
    )
}

/// Job `i`: recipient `i / ITEMS_PER_GROUP`, category `social`, a small payload.
pub fn digest_job(ns: &str, i: u64) -> String {
    let r = i / ITEMS_PER_GROUP as u64;
    format!(
        r#"{{"id":"{ns}-d{i}","recipient":"u{r}","channel":"sms","category":"social","payload":{{"who":"user-{i}","post":"p-{r}","text":"liked your post"}}}}"#
    )
}

/// One pass: `None` the backlog, `Some(rate)` offered at `rate` jobs per second.
async fn pass(b: &Bench, jobs: usize, rate: Option<f64>) -> Result<DigestRun> {
    let name = if rate.is_some() { "paced" } else { "backlog" };
    header(
        "digest",
        format!(
            "{name}: {jobs} jobs, {ITEMS_PER_GROUP} a recipient, window {WINDOW_SECS} s{}",
            rate.map_or(String::new(), |r| format!(", offered at {r:.0}/s"))
        ),
    );
    let redis = OwnRedis::start()?;
    let mut s = b.settings(if rate.is_some() { "dgp" } else { "dgb" });
    s.redis.url = redis.url.clone();
    let config = std::env::temp_dir().join(format!("{}.toml", s.redis.key_prefix));
    std::fs::write(&config, policy_toml())?;
    let result = run_pass(b, &s, &config, jobs, rate).await;
    let _ = std::fs::remove_file(&config);
    // the keys go with the private server
    b.teardown.topology(&s).await;
    drop(redis);
    let mut r = result?;
    r.pass = name.to_string();
    Ok(r)
}

/// One digest as the dispatch queue's consumer saw it.
#[derive(Debug, Clone, Copy)]
struct Seen {
    /// Arrival, ms since the epoch.
    arrived_ms: i64,
    /// When it opened (from its id), ms since the epoch.
    opened_ms: Option<i64>,
    /// Its `first_at`, ms since the epoch.
    first_ms: Option<i64>,
    count: u64,
}

/// A sample: seconds since the pass started, items folded, items in digests sent,
/// Redis `used_memory`.
type Sample = (f64, f64, f64, i64);

async fn run_pass(
    b: &Bench,
    s: &Settings,
    config: &std::path::Path,
    jobs: usize,
    rate: Option<f64>,
) -> Result<DigestRun> {
    let topology = Topology::from_settings(s);
    let conn = connect(&s.amqp.url).await?;
    topology.declare(&conn).await?;
    let ns = s.redis.key_prefix.clone();
    let mut r = redis::Client::open(s.redis.url.as_str())?.get_connection()?;
    let baseline = used_memory(&mut r)?;
    if rate.is_none() {
        let ch = conn.create_channel().await?;
        ch.confirm_select(Default::default()).await?;
        let bodies = (0..jobs as u64).map(|i| digest_job(&ns, i).into_bytes());
        preload(&ch, &s.amqp.jobs_exchange, "", bodies).await?;
        let _ = ch.close(200, "".into()).await;
    }
    let consumer = watch_digests(&conn, &topology.dispatch_queue("sms")).await?;
    let (mut child, port) = spawn_worker_configured(&b.worker, s, &[], config)?;
    let started = Instant::now();
    let sampling = Sampler::start(port, s.redis.url.clone(), started);
    let outcome = async {
        wait_ready(port, &mut child).await?;
        let sent = match rate {
            None => jobs as u64,
            Some(rate) => {
                let body = |i| digest_job(&ns, i).into_bytes();
                paced(&conn, &s.amqp.jobs_exchange, jobs as u64, rate, body).await?;
                jobs as u64
            }
        };
        // every item in a digest on the dispatch queue, or the deadline
        let deadline = Instant::now() + Duration::from_secs(120 + sent / 500);
        while consumer.weight() < sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // a moment for a digest too many, should there be one
        tokio::time::sleep(Duration::from_millis(500)).await;
        // the worker counts a digest's outcome once the broker confirmed its
        // dispatch, which may come after the digest arrived: the counts are read
        // once they have caught up with what arrived (a loaded machine lags)
        let settle = Instant::now() + Duration::from_secs(60);
        let metrics = loop {
            let metrics = scrape(port).unwrap_or_default();
            let counted = outcome_counts(&metrics).get("dispatched").copied();
            if counted.unwrap_or(0) >= consumer.arrived() || Instant::now() >= settle {
                break metrics;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        anyhow::Ok((sent, metrics))
    }
    .await;
    let samples = sampling.finish();
    stop(&mut child);
    let seen = consumer.finish().await?;
    let (sent, metrics) = outcome?;
    // what every folded job leaves once its digest is gone (its mark, its note)
    let left = used_memory(&mut r)? - baseline;
    let _ = closed(conn.close(200, "bye".into())).await;
    let mut run = summarise(sent, rate, &samples, &seen, baseline, left);
    run.outcomes = outcome_counts(&metrics);
    Ok(run)
}

/// The pass's figures (pure).
fn summarise(
    sent: u64,
    rate: Option<f64>,
    samples: &[Sample],
    seen: &[Seen],
    baseline: i64,
    left: i64,
) -> DigestRun {
    let window_ms = (WINDOW_SECS * 1000) as i64;
    let groups = sent.div_ceil(ITEMS_PER_GROUP as u64);
    let items: u64 = seen.iter().map(|d| d.count).sum();
    // the fold: from the last sample before the first fold to the first that has
    // them all
    let first = samples.iter().position(|x| x.1 > 0.0).unwrap_or(0);
    let t0 = first.checked_sub(1).map_or(0.0, |i| samples[i].0);
    let t1 = samples
        .iter()
        .find(|x| x.1 >= sent as f64)
        .or(samples.last())
        .map_or(t0, |x| x.0);
    let fold_secs = (t1 - t0).max(f64::EPSILON);
    let folded = samples.iter().map(|x| x.1).fold(0.0, f64::max);
    // the sample holding the most items
    let left_per_job = left as f64 / sent.max(1) as f64;
    let peak = samples
        .iter()
        .max_by(|a, b| (a.1 - a.2).total_cmp(&(b.1 - b.2)))
        .copied();
    let (held, bytes_per_held) = peak.map_or((0.0, 0.0), |(_, f, done, used)| {
        let held = (f - done).max(0.0);
        let bytes = (used - baseline) as f64 - left_per_job * f;
        (held, if held > 0.0 { bytes / held } else { 0.0 })
    });
    let mut from_end: Vec<u64> = seen
        .iter()
        .filter_map(|d| Some((d.arrived_ms - (d.opened_ms? + window_ms)).max(0) as u64 * 1000))
        .collect();
    from_end.sort_unstable();
    let from_first: Vec<f64> = seen
        .iter()
        .filter_map(|d| Some((d.arrived_ms - (d.first_ms? + window_ms)) as f64))
        .collect();
    let quantile = |mut v: Vec<f64>, q: f64| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        v.sort_by(f64::total_cmp);
        v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
    };
    DigestRun {
        pass: String::new(),
        jobs: sent,
        recipients: groups,
        window_secs: WINDOW_SECS,
        offered_jobs_per_sec: rate,
        digests_sent: seen.len() as u64,
        digests_expected: groups,
        items_in_digests: items,
        accounted: seen.len() as u64 == groups && items == sent,
        items_folded: folded as u64,
        fold_secs,
        items_folded_per_sec: folded / fold_secs,
        peak_items_held: held as u64,
        redis_bytes_per_held_item: bytes_per_held,
        redis_bytes_left_per_job: left_per_job,
        window_end_to_dispatch: EndToEnd::of(seen.len() as u64, &from_end),
        first_at_to_dispatch_p50_ms: median(from_first.clone()),
        first_at_to_dispatch_p99_ms: quantile(from_first, 0.99),
        outcomes: HashMap::new(),
    }
}

/// Redis's `used_memory`.
pub fn used_memory(c: &mut redis::Connection) -> Result<i64> {
    let info: String = redis::cmd("INFO").arg("memory").query(c)?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("used_memory")
}

/// Now, ms since the epoch.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// When a digest opened, from its id (`dg-GROUP-<ms>-<seq>`; GROUP may hold `-`).
pub fn opened_ms(id: &str) -> Option<i64> {
    let mut parts = id.rsplitn(3, '-');
    let _seq = parts.next()?;
    parts.next()?.parse().ok()
}

/// Milliseconds since the epoch of an RFC 3339 UTC time as the digest writes it
/// (`2026-11-24T09:12:00.118Z`).
pub fn rfc3339_ms(t: &str) -> Option<i64> {
    let (date, time) = t.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut h = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (h.next()?.ok()?, h.next()?.ok()?, h.next()?.ok()?);
    let ms: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    // days from the civil date (Howard Hinnant's algorithm)
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms)
}

/// A [`Watch`] of the dispatch queue that reads every digest, weighed by its items.
async fn watch_digests(conn: &Connection, queue: &str) -> Result<Watch<Seen>> {
    Watch::start(conn, queue, "digests", |d| {
        let arrived_ms = unix_ms();
        let body: serde_json::Value =
            serde_json::from_slice(&d.data).unwrap_or(serde_json::Value::Null);
        let count = body["digest"]["count"].as_u64().unwrap_or(0);
        let seen = Seen {
            arrived_ms,
            opened_ms: body["id"].as_str().and_then(opened_ms),
            first_ms: body["digest"]["first_at"].as_str().and_then(rfc3339_ms),
            count,
        };
        (Some(seen), count)
    })
    .await
}

/// Reads the worker's metrics and Redis's memory every [`SAMPLE`], on a thread of
/// its own (both reads block).
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Sampler {
    fn start(port: u16, redis_url: String, started: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut out = Vec::new();
            let Ok(mut c) =
                redis::Client::open(redis_url.as_str()).and_then(|c| c.get_connection())
            else {
                return out;
            };
            let mut next = Instant::now();
            while !halt.load(Ordering::Relaxed) {
                next += SAMPLE;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                let Ok(m) = scrape(port) else { continue };
                let Ok(used) = used_memory(&mut c) else {
                    continue;
                };
                let folded = metric_sum(&m, "quota_worker_digest_items_total").unwrap_or(0.0);
                let done = metric_sum(&m, "quota_worker_digest_items_sum").unwrap_or(0.0);
                out.push((started.elapsed().as_secs_f64(), folded, done, used));
            }
            out
        });
        Sampler { stop, thread }
    }

    fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_digest_id_gives_its_opening_instant() {
        assert_eq!(
            opened_ms("dg-Xb3k9Q-mZtR2w-1764234720000-1"),
            Some(1_764_234_720_000)
        );
        assert_eq!(opened_ms("nonsense"), None);
    }

    #[test]
    fn first_at_is_read_to_the_millisecond() {
        assert_eq!(rfc3339_ms("1970-01-01T00:00:01.250Z"), Some(1_250));
        // 2023-11-14T22:13:20Z is 1,700,000,000 s
        assert_eq!(
            rfc3339_ms("2023-11-14T22:13:21.000Z"),
            Some(1_700_000_001_000)
        );
        assert_eq!(rfc3339_ms("2024-02-29T00:00:00Z"), Some(1_709_164_800_000));
    }

    #[test]
    fn every_item_and_digest_is_accounted_for_and_the_held_bytes_exclude_what_stays() {
        // 20 jobs, 2 recipients: two digests of ten; the peak holds 20 items at
        // 10,000 bytes above the baseline, and 2,000 bytes stay once both are sent
        // (100 a job)
        let samples = vec![
            (0.0, 0.0, 0.0, 1_000),
            (0.1, 10.0, 0.0, 6_000),
            (0.2, 20.0, 0.0, 11_000),
            (2.5, 20.0, 20.0, 3_000),
        ];
        let seen = vec![
            Seen {
                arrived_ms: 3_100,
                opened_ms: Some(1_000),
                first_ms: Some(1_000),
                count: 10,
            },
            Seen {
                arrived_ms: 3_300,
                opened_ms: Some(1_100),
                first_ms: Some(1_090),
                count: 10,
            },
        ];
        let r = summarise(20, None, &samples, &seen, 1_000, 2_000);
        assert!(r.accounted, "{r:?}");
        assert_eq!((r.digests_expected, r.items_in_digests), (2, 20));
        assert!((r.fold_secs - 0.2).abs() < 1e-9);
        assert!((r.items_folded_per_sec - 100.0).abs() < 1e-6);
        assert_eq!(r.peak_items_held, 20);
        // (11,000 - 1,000 - 100 x 20) / 20
        assert!((r.redis_bytes_per_held_item - 400.0).abs() < 1e-9);
        assert_eq!(r.window_end_to_dispatch.p50_ms, 100.0);
        assert_eq!(r.window_end_to_dispatch.max_ms, 200.0);
        let short = summarise(30, None, &samples, &seen, 1_000, 2_000);
        assert!(!short.accounted);
    }
}
