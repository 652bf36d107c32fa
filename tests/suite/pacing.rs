//! The channel send rate paces a backlog: jobs wait inside the worker (holding their
//! delivery) and go out at the configured rate, with one worker and with three
//! sharing the rate through Redis. Nothing is churned through the delay queues.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions};
use lapin::types::FieldTable;
use testkit::*;

const RATE: u64 = 50; // jobs per second
const WINDOW: Duration = Duration::from_secs(10);

async fn paced_dispatch(workers: usize) {
    let ns = unique(&format!("pace{workers}"));
    let mut s = settings(&ns);
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(RATE);
    sms.burst = Some(5);
    let _c = Cleanup::new(&s);
    let mut running = Vec::new();
    for _ in 0..workers {
        running.push(spawn_worker(worker(&s).await).await);
    }
    let conn = amqp().await;
    // a backlog well beyond what the window drains
    let total = RATE as usize * 14;
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    for i in 0..total {
        let body = format!(
            r#"{{"id":"p-{i}","recipient":"r-{i}","channel":"sms","category":"transactional"}}"#
        );
        p.publish(
            &s.amqp.jobs_exchange,
            "",
            body.as_bytes(),
            lapin::BasicProperties::default(),
        )
        .await
        .unwrap();
    }
    // record when each dispatched job arrives
    let ch = conn.create_channel().await.unwrap();
    let mut consumer = ch
        .basic_consume(
            format!("{ns}.dispatch.sms").as_str().into(),
            "pace-test".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await
        .unwrap();
    let mut arrivals = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(14);
    while Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_millis(500), consumer.next()).await {
            Ok(Some(Ok(d))) => {
                arrivals.push(Instant::now());
                d.ack(BasicAckOptions::default()).await.unwrap();
            }
            Ok(_) => break,
            Err(_) => {}
        }
    }
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    // skip the first second (the burst and start-up), then count over the window
    let start = arrivals[0] + Duration::from_secs(1);
    let n = arrivals
        .iter()
        .filter(|t| **t >= start && **t < start + WINDOW)
        .count() as f64;
    let expected = RATE as f64 * WINDOW.as_secs_f64();
    println!("{workers} worker(s): {n} dispatched in {WINDOW:?} (rate {RATE}/s => {expected})");
    assert!(
        (n - expected).abs() <= expected * 0.05,
        "{n} dispatched, expected {expected} ± 5%"
    );
    // paced, not bounced: nothing went round the delay ladder
    let ladder = topology(&s).ladder();
    for level in 0..ladder.levels {
        assert_eq!(depth(&conn, &ladder.queue(level)).await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_dispatches_at_the_channel_rate() {
    paced_dispatch(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_workers_share_the_channel_rate() {
    paced_dispatch(3).await;
}
