//! How many deliveries a worker holds from a lane queue (its `basic.qos` there),
//! in pure arithmetic: Little's law. To keep a channel's rate busy, a worker needs
//! `rate × time each delivery stays unacked` deliveries in hand, a little more for
//! the jitter. The time a delivery stays unacked, apart from its wait for the rate,
//! is measured as the worker runs ([`Estimate`]): from its delivery to its settle,
//! less the time it waited for its send slot, plus the time the ack may be held
//! behind an earlier delivery (`amqp::acks`) and the wait for a slot the lane's line
//! took ahead of time (its look-ahead). The result is kept between a floor
//! and a ceiling (`lanes.prefetch`), so memory stays flat whatever the rate.
//!
//! The wait for the rate is left out on purpose: counting it would make the answer
//! feed itself (more deliveries in hand, longer waits, more deliveries in hand).
//! The look-ahead does not: it follows the round trip of the line's asks to Redis,
//! not the number held.

use std::time::Duration;

/// The ceiling when `lanes.prefetch` is `"auto"`: deliveries per lane queue and
/// worker (about a kilobyte each while held).
pub const AUTO_CEILING: u16 = 1024;
/// The floor: what a lane holds however slow its channel (at most the ceiling).
/// It is what every lane held before the number adapted: a slow channel's lanes
/// behave as they did (enough of a backlog waits in the worker that the worker sees
/// its lanes saturated, and parks the jobs queue's new jobs behind them at once).
pub const FLOOR: u16 = 32;
/// In hand beyond what the rate uses exactly (jitter of the service time and of the
/// broker's next delivery).
pub const HEADROOM: f64 = 1.5;
/// The service time assumed before the first measurement.
pub const PRIOR: Duration = Duration::from_millis(20);
/// Weight of a new window's mean in the moving estimate.
pub const WEIGHT: f64 = 0.5;

/// A moving estimate of the time a lane delivery takes outside its wait for the
/// rate (an exponentially weighted mean of each window's mean).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    secs: f64,
}

impl Default for Estimate {
    fn default() -> Estimate {
        Estimate {
            secs: PRIOR.as_secs_f64(),
        }
    }
}

impl Estimate {
    /// An estimate that starts at `service` (zero: none yet, [`PRIOR`]).
    pub fn from_service(service: Duration) -> Estimate {
        if service.is_zero() {
            return Estimate::default();
        }
        Estimate {
            secs: service.as_secs_f64(),
        }
    }

    /// The estimate now.
    pub fn service(&self) -> Duration {
        Duration::from_secs_f64(self.secs)
    }

    /// Take in one window: `count` deliveries settled in it, `total_us` the sum of
    /// their times from delivery to settle, `wait_us` the sum of their waits for the
    /// rate. A window without deliveries leaves the estimate as it was.
    pub fn observe(&mut self, count: u64, total_us: u64, wait_us: u64) {
        if count == 0 {
            return;
        }
        let mean = total_us.saturating_sub(wait_us) as f64 / count as f64 / 1e6;
        self.secs = self.secs * (1.0 - WEIGHT) + mean * WEIGHT;
    }
}

/// What bounds the deliveries held from one lane queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// The least held.
    pub floor: u16,
    /// The most held (`lanes.prefetch`).
    pub ceiling: u16,
}

impl Bounds {
    /// The bounds under a ceiling (the floor is at most the ceiling, and both at
    /// least one).
    pub fn under(ceiling: u16) -> Bounds {
        let ceiling = ceiling.max(1);
        Bounds {
            floor: FLOOR.min(ceiling),
            ceiling,
        }
    }
}

/// The deliveries to hold from a lane queue of a channel paced at `per_second`
/// jobs (`None`: not paced any more, the ceiling), each taking `service` besides its
/// wait for the rate, and held `beside` longer at most (its ack held after its
/// settle, its wait for a slot its lane's line took ahead of time): `per_second ×
/// (service + beside) × HEADROOM`, rounded up, within `bounds`.
pub fn target(per_second: Option<f64>, service: Duration, beside: Duration, bounds: Bounds) -> u16 {
    let Some(rate) = per_second.filter(|r| r.is_finite() && *r > 0.0) else {
        return bounds.ceiling;
    };
    let want = (rate * (service + beside).as_secs_f64() * HEADROOM).ceil();
    if want >= bounds.ceiling as f64 {
        bounds.ceiling
    } else {
        (want as u16).max(bounds.floor)
    }
}

/// Whether to change the deliveries held from `current` to `target`: at once when
/// it must grow by a quarter or more (the channel waits on it), only when it can
/// halve to shrink (each change costs the broker a new consumer), and always to
/// reach a bound.
pub fn retune(current: u16, target: u16, bounds: Bounds) -> Option<u16> {
    let grow = target as u32 * 4 >= current as u32 * 5;
    let shrink = target as u32 * 2 <= current as u32;
    let bound = target != current && (target == bounds.ceiling || target == bounds.floor);
    (target != current && (grow || shrink || bound)).then_some(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn the_target_is_rate_times_latency_with_headroom_within_bounds() {
        let b = Bounds::under(AUTO_CEILING);
        // (jobs/s, service ms, beside ms, expected)
        let table: [(Option<f64>, u64, u64, u16); 10] = [
            (Some(100.0), 20, 50, FLOOR),
            (Some(500.0), 20, 50, 53),
            (Some(1_000.0), 20, 50, 105),
            (Some(6_696.0), 10, 50, 603),
            (Some(6_696.0), 40, 50, 904),
            (Some(10_000.0), 40, 50, AUTO_CEILING),
            (Some(1.0), 20, 50, FLOOR),
            (Some(0.0), 20, 50, AUTO_CEILING),
            (None, 20, 50, AUTO_CEILING),
            (Some(f64::INFINITY), 20, 50, AUTO_CEILING),
        ];
        for (rate, service, beside, want) in table {
            assert_eq!(
                target(rate, MS(service), MS(beside), b),
                want,
                "{rate:?}/s, {service} ms + {beside} ms"
            );
        }
    }

    #[test]
    fn a_number_is_the_ceiling_and_the_floor_stays_under_it() {
        assert_eq!(
            Bounds::under(64),
            Bounds {
                floor: 32,
                ceiling: 64
            }
        );
        assert_eq!(
            Bounds::under(4),
            Bounds {
                floor: 4,
                ceiling: 4
            }
        );
        assert_eq!(
            Bounds::under(0),
            Bounds {
                floor: 1,
                ceiling: 1
            }
        );
        let b = Bounds::under(64);
        assert_eq!(target(Some(6_696.0), MS(10), MS(50), b), 64);
        assert_eq!(target(Some(10.0), MS(10), MS(50), b), 32);
        assert_eq!(target(Some(6_696.0), MS(10), MS(50), Bounds::under(4)), 4);
    }

    #[test]
    fn the_estimate_leaves_the_wait_for_the_rate_out() {
        let us = |e: &Estimate| (e.service().as_secs_f64() * 1e6).round() as u64;
        let mut e = Estimate::default();
        assert_eq!(e.service(), PRIOR);
        assert_eq!(Estimate::from_service(Duration::ZERO), e);
        assert_eq!(Estimate::from_service(MS(3)).service(), MS(3));
        e.observe(0, 5_000_000, 0);
        assert_eq!(e.service(), PRIOR, "an empty window changes nothing");
        // 100 deliveries, 1 s each in all, 990 ms of it waiting for the rate: 10 ms
        e.observe(100, 100_000_000, 99_000_000);
        assert_eq!(us(&e), 15_000);
        e.observe(100, 100_000_000, 99_000_000);
        assert_eq!(us(&e), 12_500);
        // waits counted in a window whose deliveries settle in the next: no underflow
        e.observe(10, 1_000, 5_000);
        assert_eq!(us(&e), 6_250);
    }

    #[test]
    fn it_grows_at_once_and_shrinks_only_by_half() {
        let b = Bounds::under(AUTO_CEILING);
        // (current, target, expected)
        let table = [
            (40, 40, None),
            (40, 49, None),
            (40, 50, Some(50)),
            (100, 600, Some(600)),
            (600, 400, None),
            (600, 300, Some(300)),
            (1000, AUTO_CEILING, Some(AUTO_CEILING)),
            (40, FLOOR, Some(FLOOR)),
            (60, 33, None),
            (AUTO_CEILING, AUTO_CEILING, None),
        ];
        for (current, t, want) in table {
            assert_eq!(retune(current, t, b), want, "{current} -> {t}");
        }
    }
}
