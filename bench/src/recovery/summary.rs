//! The pass's figures from its depth samples (pure): the drain's start and end, the
//! jobs held apart after a stall, the drain rate as a whole and by interval, and
//! the times around a broker restart.

use super::restart::Restart;
use crate::report::{Recovery, INTERVAL_SECS};

#[cfg(test)]
mod tests;

/// A drain whose depth stands still this long before its last jobs arrive ends at
/// the stall (see [`summarise`]).
const STALL_SECS: f64 = 5.0;

/// The pass's figures from its depth samples (pure).
pub fn summarise(
    workers: usize,
    jobs: usize,
    rate: u64,
    samples: &[(f64, u32)],
    restart: Option<Restart>,
) -> Recovery {
    let outage = restart.map(|r| (r.gone, r.back()));
    let samples = running_most(samples);
    let samples = samples.as_slice();
    let (first, t0) = drain_start(samples);
    let stall = first_stall(samples, outage.map_or(f64::NEG_INFINITY, |(_, z)| z));
    let last = stall.map_or(samples.len().saturating_sub(1), |i| i);
    let end = samples.get(last).map_or(t0, |s| s.0);
    let drain_secs = (end - t0).max(f64::EPSILON);
    let dispatched = samples.get(last).map_or(0, |s| s.1) as f64;
    let held = stall.map_or(0, |i| jobs.saturating_sub(samples[i].1 as usize));
    let held_secs = stall.map_or(0.0, |i| samples.last().map_or(0.0, |l| l.0) - samples[i].0);
    let outage_secs = outage.map_or(0.0, |(a, z)| z - a);
    let rate_f = rate as f64;
    let at = |t: f64| depth_at(samples, t);
    let intervals = Intervals::over(segments(outage, t0, end), t0, at);
    let min_interval_ratio = intervals.lowest_outside_outage(rate_f);
    Recovery {
        workers,
        broker_restart: outage.is_some(),
        jobs,
        rate,
        ceiling_msgs_per_sec: 0.0,
        drain_secs,
        ratio_whole: dispatched / drain_secs / rate_f,
        ratio_without_outage: dispatched / (drain_secs - outage_secs).max(f64::EPSILON) / rate_f,
        outage_secs,
        resumed_after_secs: restart.and_then(|r| resumed_after(samples, r)),
        consuming_after_secs: None,
        lane_serving_after_secs: restart.and_then(|r| r.serving.map(|s| s - r.answered)),
        first_from_answer_ratio: restart
            .and_then(|r| first_from_answer(r, end, at))
            .map(|x| x / rate_f),
        stopping_secs: restart.map(|r| r.gone - r.asked),
        intervals: intervals.rates,
        interval_in_outage: intervals.in_outage,
        interval_secs: intervals.secs,
        interval_starts: intervals.starts,
        held,
        held_secs,
        min_interval_ratio: if min_interval_ratio.is_finite() {
            min_interval_ratio
        } else {
            0.0
        },
        returned_at_secs: restart.map(|r| r.answered - t0),
        curve: samples[first.saturating_sub(1)..]
            .iter()
            .map(|&(t, d)| (t - t0, d as f64))
            .collect(),
    }
}

/// The samples with each depth the most read so far: the dispatch queue only grows,
/// so a read that comes back lower (a quorum queue not yet up after the broker's
/// restart answers 0) counts as the one before it.
fn running_most(samples: &[(f64, u32)]) -> Vec<(f64, u32)> {
    samples
        .iter()
        .scan(0u32, |most, &(t, d)| {
            *most = (*most).max(d);
            Some((t, *most))
        })
        .collect()
}

/// The first sample with a dispatched job, and the drain's start: the last sample
/// before it.
fn drain_start(samples: &[(f64, u32)]) -> (usize, f64) {
    let first = samples.iter().position(|&(_, d)| d > 0).unwrap_or(0);
    let t0 = if first == 0 {
        0.0
    } else {
        samples[first - 1].0
    };
    (first, t0)
}

/// The first stall of [`STALL_SECS`] or more at or after `back_at` (the broker's
/// return) with jobs still to come. Jobs that arrive only after it (jobs whose
/// dispatch was in flight when the broker went away: they may have been sent, so
/// they wait out redis.reservation_lease, and not all at one moment) end the drain
/// there, and are reported apart.
fn first_stall(samples: &[(f64, u32)], back_at: f64) -> Option<usize> {
    let last_depth = samples.last().map_or(0, |s| s.1);
    (0..samples.len()).find(|&i| {
        let (at, d) = samples[i];
        let still = samples[i..].iter().take_while(|s| s.1 == d).last();
        at >= back_at && d > 0 && d < last_depth && still.is_some_and(|s| s.0 - at >= STALL_SECS)
    })
}

/// The depth at `t`: the last sample at or before it.
fn depth_at(samples: &[(f64, u32)], t: f64) -> f64 {
    samples
        .iter()
        .take_while(|s| s.0 <= t + 1e-9)
        .last()
        .map_or(0.0, |s| s.1 as f64)
}

/// The drain's stretches (start, end, during the outage): before the broker went
/// away, the outage, and from its return on; the whole drain without an outage
/// inside it.
fn segments(outage: Option<(f64, f64)>, t0: f64, end: f64) -> Vec<(f64, f64, bool)> {
    match outage {
        Some((oa, oz)) if oa > t0 && oz < end => {
            vec![(t0, oa, false), (oa, oz, true), (oz, end, false)]
        }
        _ => vec![(t0, end, false)],
    }
}

/// The drain by interval.
struct Intervals {
    /// Jobs dispatched per second in each.
    rates: Vec<f64>,
    /// Whether each is the outage.
    in_outage: Vec<bool>,
    /// Each one's length.
    secs: Vec<f64>,
    /// Each one's start, from the drain's.
    starts: Vec<f64>,
}

impl Intervals {
    /// 5-second windows of each segment outside the outage (a last shorter one of
    /// at least 2 s counted over its own length), and the outage as one window of
    /// its own; `at` is the depth at an instant.
    fn over(segments: Vec<(f64, f64, bool)>, t0: f64, at: impl Fn(f64) -> f64) -> Intervals {
        let step = INTERVAL_SECS as f64;
        let mut out = Intervals {
            rates: Vec::new(),
            in_outage: Vec::new(),
            secs: Vec::new(),
            starts: Vec::new(),
        };
        for (a0, z0, away) in segments {
            let mut a = a0;
            while a < z0 - 1e-9 {
                let z = if away { z0 } else { (a + step).min(z0) };
                if z - a >= 2.0 || away {
                    out.rates.push((at(z) - at(a)) / (z - a));
                    out.in_outage.push(away);
                    out.secs.push(z - a);
                    out.starts.push(a - t0);
                }
                a = z;
            }
        }
        out
    }

    /// The lowest rate of the intervals outside the outage, as a share of `rate`
    /// (infinite: none).
    fn lowest_outside_outage(&self, rate: f64) -> f64 {
        self.rates
            .iter()
            .zip(&self.in_outage)
            .filter(|(_, o)| !**o)
            .map(|(v, _)| v / rate)
            .fold(f64::INFINITY, f64::min)
    }
}

/// Seconds from the broker's first answer to the first sample with more dispatched
/// than then.
fn resumed_after(samples: &[(f64, u32)], r: Restart) -> Option<f64> {
    let back = depth_at(samples, r.answered);
    samples
        .iter()
        .find(|s| s.0 > r.answered && s.1 as f64 > back)
        .map(|s| s.0 - r.answered)
}

/// The drain rate of the first interval counted from the broker's first answer
/// instead (5 s, or to the drain's `end` if at least 2 s), in jobs per second.
fn first_from_answer(r: Restart, end: f64, at: impl Fn(f64) -> f64) -> Option<f64> {
    let z = (r.answered + INTERVAL_SECS as f64).min(end);
    (z - r.answered >= 2.0).then(|| (at(z) - at(r.answered)) / (z - r.answered))
}
