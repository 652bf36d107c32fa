//! One channel's send rate as this worker sees it: how many of its jobs wait here
//! for a slot, and whether its lanes hold a backlog that a new job of the jobs queue
//! is parked behind without asking Redis.
//!
//! The backlog is held for as long as Redis said the wait was (at least
//! `lanes.park_after`, at most [`MAX_HOLD`]); then one new job asks again, the
//! probe, while the others stay parked behind it. A probe that gets its slot at its
//! first ask ends the state: the rate has room, and whatever the lanes hold waits
//! for the machine, not the rate (a stall left it there), so new jobs take the
//! cheap path again (dispatched from the jobs queue, no publish to a lane) and
//! leave the machine the time the lanes need to drain. A probe refused holds it on:
//! parked, for the wait it was answered; dispatched after a short wait, for as long
//! as that took, and the next new job is the next probe. So a real backlog costs
//! one asking job per hold, and a backlog a stall left behind does not keep every
//! new job going through the lanes.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The longest one hold of the saturated state lasts before a probe asks again: a
/// reload's faster rate, or a backlog left by a stall, is found within it.
pub(super) const MAX_HOLD: Duration = Duration::from_secs(1);

/// How many jobs of one channel wait for its send rate here, and whether its lanes
/// hold a backlog. While jobs wait, a newly admitted one joins them rather than
/// racing them for the next free slot. (They do not stampede Redis: the ones that
/// wake together ask in one call.)
#[derive(Debug)]
pub(super) struct Pacer {
    pub(super) waiting: AtomicUsize,
    /// Of those, the ones read from a lane queue.
    pub(super) in_lanes: AtomicUsize,
    /// Until when the lanes hold a backlog, as this worker last saw it (µs after
    /// `epoch`; 0: they do not). Set when a job read from the jobs queue is parked
    /// after asking; cleared when a job of the lanes gets its slot at its first ask,
    /// or a job of the jobs queue gets its slot while it is set (the probe).
    saturated_until: AtomicU64,
    epoch: Instant,
}

impl Default for Pacer {
    fn default() -> Pacer {
        Pacer {
            waiting: AtomicUsize::new(0),
            in_lanes: AtomicUsize::new(0),
            saturated_until: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }
}

impl Pacer {
    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Hold the lanes saturated for `wait` (the wait Redis answered a parked job,
    /// the queue ahead of it counted), at least `least`, at most [`MAX_HOLD`].
    pub(super) fn saturate(&self, wait: Duration, least: Duration) {
        self.saturate_at(self.now_us(), wait.max(least).min(MAX_HOLD));
    }

    fn saturate_at(&self, now_us: u64, hold: Duration) {
        let until = now_us.saturating_add(hold.as_micros() as u64).max(1);
        self.saturated_until.store(until, Ordering::Relaxed);
    }

    /// The lanes hold no backlog the rate causes (any longer).
    pub(super) fn unsaturate(&self) {
        // (a load first: on the path of every job, a store would bounce the line
        // between the cores for nothing)
        if self.saturated_until.load(Ordering::Relaxed) != 0 {
            self.saturated_until.store(0, Ordering::Relaxed);
        }
    }

    /// Whether a new job of the jobs queue is parked without asking: jobs of the
    /// lanes wait here for the rate, and the lanes are held saturated. When a hold
    /// has run out, the first job to find it so asks (the probe: `false`), and the
    /// others are held for `probe` (as long as the probe's ask may take) meanwhile.
    pub(super) fn parks_unasked(&self, probe: Duration) -> bool {
        self.in_lanes.load(Ordering::Relaxed) > 0 && self.parks_at(self.now_us(), probe)
    }

    fn parks_at(&self, now_us: u64, probe: Duration) -> bool {
        let until = self.saturated_until.load(Ordering::Relaxed);
        if until == 0 {
            return false;
        }
        if now_us < until {
            return true;
        }
        let probing = now_us.saturating_add(probe.as_micros() as u64).max(1);
        // whoever moves the hold on is the probe; a job that lost the race parks
        self.saturated_until
            .compare_exchange(until, probing, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    #[test]
    fn a_hold_parks_until_it_runs_out_then_one_job_asks() {
        let p = Pacer::default();
        let probe = Duration::from_millis(300);
        assert!(!p.parks_at(0, probe), "never saturated");
        p.saturate_at(0, Duration::from_millis(250));
        assert!(p.parks_at(100 * MS, probe));
        assert!(p.parks_at(249 * MS, probe));
        // run out: the first to ask is the probe, the next ones are held behind it
        assert!(
            !p.parks_at(250 * MS, probe),
            "no probe once the hold ran out"
        );
        assert!(p.parks_at(251 * MS, probe), "a second probe at once");
        assert!(p.parks_at(549 * MS, probe));
        // a probe that never answered (refused by its caps, say): the next one asks
        assert!(!p.parks_at(550 * MS, probe));
    }

    #[test]
    fn a_probe_that_gets_its_slot_ends_the_state() {
        let p = Pacer::default();
        let probe = Duration::from_millis(300);
        p.saturate_at(0, Duration::from_millis(250));
        assert!(!p.parks_at(260 * MS, probe));
        p.unsaturate();
        assert!(!p.parks_at(261 * MS, probe));
        assert!(!p.parks_at(262 * MS, probe), "every job asks again");
    }

    #[test]
    fn a_hold_is_at_least_park_after_and_at_most_a_second() {
        let p = Pacer::default();
        let least = Duration::from_millis(250);
        p.saturate(Duration::from_millis(3), least);
        let held = Duration::from_micros(p.saturated_until.load(Ordering::Relaxed));
        assert!(held >= least, "{held:?}");
        p.saturate(Duration::from_secs(3600), least);
        let held = Duration::from_micros(p.saturated_until.load(Ordering::Relaxed));
        assert!(held <= p.epoch.elapsed() + MAX_HOLD, "{held:?}");
        assert!(held > MAX_HOLD / 2, "{held:?}");
    }

    #[test]
    fn without_lane_jobs_waiting_nothing_is_parked_unasked() {
        let p = Pacer::default();
        p.saturate(Duration::from_secs(1), Duration::ZERO);
        assert!(!p.parks_unasked(Duration::from_millis(300)));
        p.in_lanes.fetch_add(1, Ordering::Relaxed);
        assert!(p.parks_unasked(Duration::from_millis(300)));
    }
}
