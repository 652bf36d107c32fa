//! One backoff for every wait on a service: exponential, doubling from `min` up to
//! `max`, each delay lengthened by a random part of itself (backon's jitter: a delay
//! `d` becomes somewhere in `[d, 2d)`), so that N workers that lost the same broker
//! or Redis at the same moment do not all come back in the same millisecond.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Delays for retry after retry, without end.
pub fn delays(min: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    ExponentialBuilder::new()
        .with_min_delay(min)
        .with_max_delay(max)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_are_jittered() {
        let min = Duration::from_millis(100);
        let max = Duration::from_secs(1);
        let first: Vec<Duration> = delays(min, max).take(12).collect();
        for (i, d) in first.iter().enumerate() {
            let base = (min * 2u32.pow(i.min(10) as u32)).min(max);
            assert!(
                *d >= base && *d < base * 2,
                "delay {i}: {d:?} against {base:?}"
            );
        }
        // two sequences (two workers) do not agree delay for delay
        let other: Vec<Duration> = delays(min, max).take(12).collect();
        assert_ne!(first, other);
    }
}
