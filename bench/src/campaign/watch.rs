//! What the campaign step watches: the dispatch queue ([`Dispatches`]: each urgent
//! job's publish-to-dispatch time, and the bulk jobs dispatched without being
//! parked) and the workers' count of bulk jobs parked ([`Parking`], every
//! [`SAMPLE`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use lapin::Connection;
use quota_worker::job::headers::PARKED_AT;

use crate::broker::{unix_micros, waited_micros, Watch};
use crate::metrics::{labelled_sum, scrape};
use crate::report::EndToEnd;

/// How often the workers' parked count is read: a backlog of 100,000 parked at
/// 20,000/s takes 5 s, and each crossing is interpolated between two samples.
const SAMPLE: Duration = Duration::from_millis(50);

/// A consumer on the dispatch queue (no acks): the urgent jobs (those stamped with
/// the benchmark's header) and the bulk jobs dispatched without being parked.
pub(super) struct Dispatches {
    /// Each urgent job's (publish instant, µs since the epoch; its wait, µs).
    watch: Watch<(i64, u64)>,
    unparked: Arc<AtomicU64>,
}

impl Dispatches {
    /// Starts consuming `queue`.
    pub(super) async fn start(conn: &Connection, queue: &str) -> Result<Dispatches> {
        let unparked = Arc::new(AtomicU64::new(0));
        let count = unparked.clone();
        let watch = Watch::start(conn, queue, "campaign", move |d| {
            if let Some(waited) = waited_micros(d) {
                return (Some((unix_micros() - waited as i64, waited)), 1);
            }
            let headers = d.properties.headers().as_ref();
            if !headers.is_some_and(|h| h.inner().contains_key(PARKED_AT)) {
                count.fetch_add(1, Ordering::Relaxed);
            }
            (None, 0)
        })
        .await?;
        Ok(Dispatches { watch, unparked })
    }

    /// The bulk jobs dispatched so far without being parked, as it counts them.
    pub(super) fn unparked(&self) -> Arc<AtomicU64> {
        self.unparked.clone()
    }

    /// Waits (at most 60 s) until `sent` urgent jobs have arrived, then stops: their
    /// publish-to-dispatch times, all of them and those of the ones published at or
    /// after `behind` (µs since the epoch: once every bulk job was parked; `None`:
    /// none such).
    pub(super) async fn finish(
        self,
        sent: u64,
        behind: Option<i64>,
    ) -> Result<(EndToEnd, Option<EndToEnd>)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.watch.weight() < sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let kept = self.watch.finish().await?;
        let mut all: Vec<u64> = kept.iter().map(|(_, w)| *w).collect();
        all.sort_unstable();
        let later = behind.map(|at| {
            let mut w: Vec<u64> = kept
                .iter()
                .filter(|(p, _)| *p >= at)
                .map(|(_, w)| *w)
                .collect();
            w.sort_unstable();
            EndToEnd::of(w.len() as u64, &w)
        });
        Ok((EndToEnd::of(sent, &all), later))
    }
}

/// (seconds since the pass started, bulk jobs parked or dispatched unparked).
pub(super) type Sample = (f64, u64);

/// The workers' bulk jobs parked (`quota_worker_lane_jobs_total`, lane `bulk`, step
/// `parked`) plus those dispatched unparked, read every [`SAMPLE`] in a thread.
pub(super) struct Parking {
    stop: Arc<AtomicBool>,
    latest: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Vec<Sample>>,
}

impl Parking {
    /// From now on, the workers at `ports` (a worker not answering yet counts what
    /// it last said, or 0), with `unparked` added; times since `started`.
    pub(super) fn start(ports: Vec<u16>, unparked: Arc<AtomicU64>, started: Instant) -> Parking {
        let stop = Arc::new(AtomicBool::new(false));
        let latest = Arc::new(AtomicU64::new(0));
        let (halt, last) = (stop.clone(), latest.clone());
        let thread = std::thread::spawn(move || {
            let mut said = vec![0u64; ports.len()];
            let mut out = Vec::new();
            let mut next = Instant::now();
            while !halt.load(Ordering::Relaxed) {
                next += SAMPLE;
                if let Some(wait) = next.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                for (port, n) in ports.iter().zip(&mut said) {
                    if let Ok(m) = scrape(*port) {
                        let parked = [("lane", "bulk"), ("step", "parked")];
                        *n = labelled_sum(&m, "quota_worker_lane_jobs_total", &parked) as u64;
                    }
                }
                let total = said.iter().sum::<u64>() + unparked.load(Ordering::Relaxed);
                out.push((started.elapsed().as_secs_f64(), total));
                last.store(total, Ordering::Relaxed);
            }
            out
        });
        Parking {
            stop,
            latest,
            thread,
        }
    }

    /// Waits until `jobs` are parked (or dispatched unparked); an error after `limit`.
    pub(super) async fn until(&self, jobs: u64, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            let now = self.latest.load(Ordering::Relaxed);
            if now >= jobs {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("{now} of {jobs} jobs parked after {} s", limit.as_secs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops reading: every sample, in order.
    pub(super) fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

/// When the samples first reach `n`, interpolated between the sample before and
/// the one that reaches it (`None`: never).
pub(super) fn crossing(samples: &[Sample], n: u64) -> Option<f64> {
    let i = samples.iter().position(|s| s.1 >= n)?;
    let Some(&(t0, c0)) = i.checked_sub(1).map(|j| &samples[j]) else {
        return Some(samples[i].0);
    };
    let (t1, c1) = samples[i];
    Some(t0 + (t1 - t0) * (n - c0) as f64 / (c1 - c0) as f64)
}

/// Jobs per second between the crossings of `lo` and `hi` (fractions of `jobs`).
pub(super) fn rate_between(samples: &[Sample], jobs: u64, (lo, hi): (f64, f64)) -> Option<f64> {
    let (a, b) = ((jobs as f64 * lo) as u64, (jobs as f64 * hi) as u64);
    let secs = crossing(samples, b)? - crossing(samples, a)?;
    (secs > 0.0).then(|| (b - a) as f64 / secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crossing_is_interpolated_between_the_samples_around_it() {
        let s = [(0.0, 0), (1.0, 100), (2.0, 300), (3.0, 300)];
        assert_eq!(crossing(&s, 200), Some(1.5));
        assert_eq!(crossing(&s, 100), Some(1.0));
        assert_eq!(crossing(&s, 0), Some(0.0));
        assert_eq!(crossing(&s, 301), None);
        // 30 and 270 of 300: at 0.3 s and 1.85 s
        let r = rate_between(&s, 300, (0.1, 0.9)).unwrap();
        assert!((r - 240.0 / 1.55).abs() < 1e-9, "{r}");
    }
}
