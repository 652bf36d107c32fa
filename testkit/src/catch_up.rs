//! How long the queues take to catch up after a fault, from depth samples taken as a
//! run goes on (the soak's): the jobs queue and every lane queue are back to their
//! depth before the fault when each is at or below its own highest depth of the
//! minute before it (with a little slack: a steady run's depths move by a few
//! deliveries between samples). Pure.

/// One sample: seconds since the run began, and the depths (none when the broker
/// could not be asked).
#[derive(Debug, Clone)]
pub struct Depths {
    pub t: f64,
    pub jobs_queue: Option<u32>,
    /// Each lane queue's, always in the same order.
    pub lanes: Option<Vec<u32>>,
}

/// The seconds before a fault whose highest depths are "the depth before it".
pub const BEFORE_SECONDS: f64 = 60.0;

/// Messages a depth may be above its level before the fault and still count as back.
pub const SLACK: u32 = 200;

/// Seconds from `fault_at` to the first sample after `ended_at` (when the fault and
/// the reconnection were over) at which the jobs queue and every lane queue are back
/// to their depth before the fault; none if they never are within the samples.
pub fn catch_up_seconds(samples: &[Depths], fault_at: f64, ended_at: f64) -> Option<f64> {
    let before = samples
        .iter()
        .filter(|s| s.t < fault_at && s.t >= fault_at - BEFORE_SECONDS);
    let (mut jobs, mut lanes) = (0u32, Vec::<u32>::new());
    for s in before {
        jobs = jobs.max(s.jobs_queue.unwrap_or(0));
        for (i, &d) in s.lanes.iter().flatten().enumerate() {
            match lanes.get_mut(i) {
                Some(l) => *l = (*l).max(d),
                None => lanes.push(d),
            }
        }
    }
    let back = |l: &[u32]| {
        l.iter()
            .enumerate()
            .all(|(i, &d)| d <= lanes.get(i).copied().unwrap_or(0) + SLACK)
    };
    samples
        .iter()
        .filter(|s| s.t >= ended_at)
        .find(|s| match (s.jobs_queue, &s.lanes) {
            (Some(j), Some(l)) => j <= jobs + SLACK && back(l),
            _ => false,
        })
        .map(|s| s.t - fault_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(depths: &[(u32, u32)]) -> Vec<Depths> {
        depths
            .iter()
            .enumerate()
            .map(|(i, &(j, l))| Depths {
                t: i as f64 * 5.0,
                jobs_queue: Some(j),
                lanes: Some(vec![l, 0]),
            })
            .collect()
    }

    #[test]
    fn back_when_both_queues_are_at_their_level_before_the_fault() {
        // a fault at 20 s: the jobs queue is back by 30 s, the lanes (grown to
        // 5,000) within the slack of their level by 40 s
        let s = run(&[
            (10, 50),
            (12, 40),
            (9, 60),
            (11, 50),
            (3_000, 5_000),
            (800, 4_000),
            (100, 2_000),
            (20, 900),
            (15, 200),
            (10, 60),
        ]);
        assert_eq!(catch_up_seconds(&s, 20.0, 22.0), Some(20.0));
    }

    #[test]
    fn each_lane_is_judged_against_its_own_depth_before() {
        // two lanes: the first drains below its level while the second still holds
        // what the fault left; their sum is back long before the second is
        let mut s = run(&[(0, 1_000), (0, 1_000), (0, 1_000)]);
        for (t, second) in [(15.0, 3_000), (20.0, 900), (25.0, 0)] {
            s.push(Depths {
                t,
                jobs_queue: Some(0),
                lanes: Some(vec![0, second]),
            });
        }
        assert_eq!(catch_up_seconds(&s, 15.0, 15.0), Some(10.0));
    }

    #[test]
    fn never_back_is_none_and_an_unanswered_sample_does_not_count() {
        let mut s = run(&[(10, 50), (10, 50), (5_000, 9_000), (5_000, 9_000)]);
        assert_eq!(catch_up_seconds(&s, 10.0, 10.0), None);
        s.push(Depths {
            t: 20.0,
            jobs_queue: None,
            lanes: None,
        });
        assert_eq!(catch_up_seconds(&s, 10.0, 10.0), None);
        s.push(Depths {
            t: 25.0,
            jobs_queue: Some(0),
            lanes: Some(vec![0, 0]),
        });
        assert_eq!(catch_up_seconds(&s, 10.0, 10.0), Some(15.0));
    }
}
