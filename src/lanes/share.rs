//! How the lanes of one paced channel share its send rate: the values
//! `lua/lanes.lua` takes beside the channel's GCRA. Pure: no I/O.
//!
//! While a higher lane has jobs waiting for the rate, a lower lane may take only
//! while the bucket keeps `reserve` of it (a fraction of `burst × interval`) per
//! waiting lane above it; `urgent` never keeps one, except toward `normal` while
//! `normal` is owed its minimum share (`normal_share` of the rate).

pub use quota_worker_producer::Priority;

use crate::quota::policy::Rate;

/// A take by a job in a lane: its lane, and how the channel's lanes share the rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneAsk {
    /// The job's lane.
    pub lane: Priority,
    /// The channel's reserve and normal share.
    pub lanes: LaneRate,
}

/// The lane arithmetic of one channel, from its rate and its lane settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LaneRate {
    /// What a lower lane leaves in the bucket per waiting lane above it, µs.
    pub reserve_us: u64,
    /// `normal`'s minimum share as the interval of its own GCRA, µs (0: none).
    pub share_interval_us: u64,
}

impl LaneRate {
    /// `reserve` and `normal_share` are fractions in `[0, 0.5]` and `[0, 1]`
    /// (validated by the configuration).
    pub fn new(rate: Rate, reserve: f64, normal_share: f64) -> LaneRate {
        let bucket = rate.interval_us.saturating_mul(rate.burst) as f64;
        let share_interval_us = if normal_share > 0.0 {
            (rate.interval_us as f64 * rate.cost.max(1) as f64 / normal_share).ceil() as u64
        } else {
            0
        };
        LaneRate {
            reserve_us: (bucket * reserve).round() as u64,
            share_interval_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_is_a_fraction_of_the_bucket_and_a_share_an_interval() {
        let rate = Rate {
            interval_us: 10_000,
            burst: 4,
            cost: 1,
        };
        let l = LaneRate::new(rate, 0.5, 0.1);
        assert_eq!(l.reserve_us, 20_000);
        assert_eq!(l.share_interval_us, 100_000);
        assert_eq!(LaneRate::new(rate, 0.0, 0.0).share_interval_us, 0);
    }
}
