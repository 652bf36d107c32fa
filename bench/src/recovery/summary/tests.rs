//! The pass's figures from hand-made depth samples: a steady drain, an outage, the
//! lane queue serving late, a zero read after the return, jobs held after a stall.

use super::summarise;
use crate::recovery::restart::Restart;

#[test]
fn a_steady_drain_is_at_the_rate_in_every_interval() {
    // 100 jobs a second from t = 2 on, 1,000 jobs
    let samples: Vec<(f64, u32)> = (1..=12)
        .map(|t| (t as f64, ((t - 2).max(0) * 100) as u32))
        .collect();
    let r = summarise(1, 1_000, 100, &samples, None);
    assert_eq!(r.drain_secs, 10.0);
    assert!((r.ratio_whole - 1.0).abs() < 1e-9);
    assert_eq!(r.intervals, vec![100.0, 100.0]);
    assert!((r.min_interval_ratio - 1.0).abs() < 1e-9);
}

#[test]
fn an_outage_is_marked_and_left_out_of_the_lowest_interval() {
    // 100/s, then nothing from t = 5 to t = 10, then 100/s again
    let mut samples = Vec::new();
    let mut d = 0u32;
    for t in 1..=16 {
        if !(6..=10).contains(&t) {
            d += 100;
        }
        samples.push((t as f64, d));
    }
    let away = |asked, answered, serving| {
        Some(Restart {
            asked,
            gone: asked,
            answered,
            serving,
        })
    };
    let r = summarise(1, 1_100, 100, &samples, away(5.0, 10.0, None));
    assert!(r.broker_restart);
    assert_eq!(r.interval_in_outage, vec![false, true, false]);
    assert!(r.ratio_whole < 0.75);
    assert!((r.min_interval_ratio - 1.0).abs() < 1e-9);
    // the first sample after the return with more dispatched is at t = 11
    assert_eq!(r.resumed_after_secs, Some(1.0));
    let steady = summarise(1, 1_600, 100, &samples, None);
    assert_eq!(steady.resumed_after_secs, None);
    // the lane queue serving again before the first answer: the answer ends it
    let early = summarise(1, 1_100, 100, &samples, away(5.0, 10.0, Some(9.5)));
    assert_eq!(early.outage_secs, 5.0);
    assert_eq!(early.lane_serving_after_secs, Some(-0.5));
}

#[test]
fn the_broker_is_back_once_its_lane_queue_serves_again() {
    // 100/s to t = 5; away until its first answer at t = 10; its lane queue
    // serves again at t = 11, then 100/s to 1,500 jobs at t = 20
    let mut samples: Vec<(f64, u32)> = (1..=5).map(|t| (t as f64, t * 100)).collect();
    samples.extend((10..=11).map(|t| (t as f64, 500)));
    samples.extend((12..=20).map(|t| (t as f64, 500 + (t - 11) * 100)));
    let restart = Restart {
        asked: 4.5,
        gone: 5.0,
        answered: 10.0,
        serving: Some(11.0),
    };
    let r = summarise(1, 1_400, 100, &samples, Some(restart));
    assert_eq!(r.outage_secs, 6.0);
    assert_eq!(r.lane_serving_after_secs, Some(1.0));
    assert_eq!(r.interval_in_outage, vec![false, true, false, false]);
    assert_eq!(r.interval_starts, vec![0.0, 5.0, 11.0, 16.0]);
    assert_eq!(r.interval_secs, vec![5.0, 6.0, 5.0, 4.0]);
    assert!(
        (r.min_interval_ratio - 1.0).abs() < 1e-9,
        "{}",
        r.min_interval_ratio
    );
    // counted from the first answer, the first interval lost the second before
    // the lane served
    let first = r.first_from_answer_ratio.unwrap();
    assert!((first - 0.8).abs() < 1e-9, "{first}");
    assert_eq!(r.returned_at_secs, Some(10.0));
    assert_eq!(r.stopping_secs, Some(0.5));
}

#[test]
fn a_zero_read_after_the_return_and_late_jobs_in_two_steps_end_the_drain_at_the_first_stall() {
    // 10,000/s to 42,000 by 4.2 s; the broker away from 4.25 s to 17.6 s; a read
    // of 0 as it comes back, then the rest to 99,971 by 19.9 s; the last 29 (and
    // copies) only at 127.5 s and 127.7 s, after the lease
    let mut samples: Vec<(f64, u32)> = (1..=42).map(|i| (i as f64 / 10.0, i * 1_000)).collect();
    samples.push((18.0, 0));
    samples.push((18.2, 86_000));
    samples.extend((1..=16).map(|i| (18.2 + i as f64 / 10.0, 86_000 + i * 873)));
    samples.push((19.9, 99_971));
    samples.extend((1..=1075).map(|i| (19.9 + i as f64 / 10.0, 99_971)));
    samples.push((127.5, 99_974));
    samples.push((127.7, 100_029));
    let restart = Restart {
        asked: 4.25,
        gone: 4.25,
        answered: 17.6,
        serving: None,
    };
    let r = summarise(3, 100_000, 10_000, &samples, Some(restart));
    assert_eq!(r.held, 29);
    assert!((r.drain_secs - 19.9).abs() < 1e-9, "{}", r.drain_secs);
    assert!((r.held_secs - (127.7 - 19.9)).abs() < 1e-9);
    assert!(r.min_interval_ratio > 0.5, "{}", r.min_interval_ratio);
    assert!((r.resumed_after_secs.unwrap() - 0.6).abs() < 1e-9);
}

#[test]
fn jobs_that_come_only_after_a_long_stall_are_held_apart() {
    // 100/s to 900 by t = 10, then nothing until t = 130, when the last 100 come
    let mut samples: Vec<(f64, u32)> = (1..=10)
        .map(|t| (t as f64, (t * 100 - 100) as u32))
        .collect();
    for t in 11..130 {
        samples.push((t as f64, 900));
    }
    samples.push((130.0, 1_000));
    let r = summarise(1, 1_000, 100, &samples, None);
    assert_eq!(r.held, 100);
    assert!((r.held_secs - 120.0).abs() < 1e-9);
    assert_eq!(r.drain_secs, 9.0);
    assert!((r.ratio_whole - 1.0).abs() < 1e-9);
    // a short pause at the end is part of the drain
    let mut short = samples[..12].to_vec();
    short.push((12.0, 1_000));
    let r = summarise(1, 1_000, 100, &short, None);
    assert_eq!(r.held, 0);
    assert_eq!(r.drain_secs, 11.0);
}
