//! A campaign published by a producer that knows no lanes: bulk jobs of a paced
//! channel (a policy whose lane is `bulk`, no `priority` field) published to the jobs
//! exchange, with urgent jobs (`transactional`, no `priority`) published among them.
//! The urgent jobs are dispatched while the campaign is still being parked: when
//! each one reaches the dispatch queue, bulk jobs published after it are still in
//! the jobs queue, and it went out ahead of most of the bulk jobs published before
//! it. One worker and three; assertions on order and on what the queues hold, not
//! on speed.

use std::time::{Duration, Instant};

use crate::lanes::{body, laned, publish_all, Dispatched};
use quota_worker::config::Dur;
use testkit::audit::depth;
use testkit::*;

/// Bulk jobs before each group of urgent ones, and after the last group (enough that
/// three workers, parking several thousand a second, are still reading them when
/// the last urgent job reaches the dispatch queue).
const AHEAD: usize = 1_000;
const TAIL: usize = 20_000;
/// Groups of urgent jobs, and urgent jobs a group.
const GROUPS: usize = 2;
const PER_GROUP: usize = 3;

/// The campaign as the jobs queue holds it: `AHEAD` bulk jobs, a group of urgent
/// ones, `AHEAD` bulk jobs, a group, then `TAIL` bulk jobs. Each part is published
/// (and confirmed) before the next, so the queue holds them in this order.
fn campaign() -> Vec<Vec<String>> {
    let mut parts = Vec::new();
    let mut bulk = 0;
    let mut bulk_part = |n: usize| {
        let part: Vec<String> = (bulk..bulk + n)
            .map(|i| body(&format!("b-{i}"), "campaign", None))
            .collect();
        bulk += n;
        part
    };
    for g in 0..GROUPS {
        parts.push(bulk_part(AHEAD));
        parts.push(
            (0..PER_GROUP)
                .map(|i| body(&format!("u-{g}-{i}"), "transactional", None))
                .collect(),
        );
    }
    parts.push(bulk_part(TAIL));
    parts
}

/// What the dispatch queue and the jobs queue showed when an urgent job arrived.
#[derive(Debug)]
struct Seen {
    id: String,
    /// Its place in the dispatch queue.
    position: usize,
    /// Bulk jobs published before it.
    bulk_ahead: usize,
    /// Jobs ready in the jobs queue as it arrived (not yet read by any worker).
    jobs_queue: u32,
}

/// The campaign published before the workers run (as a producer faster than the
/// parking leaves it), then `workers` workers, the channel paced at `rate` and
/// `lanes.park_after` at `park_after`: each urgent job is read from the dispatch
/// queue, and the jobs queue's depth read as it arrives.
async fn urgent_jobs_pass_a_campaign_being_parked(workers: usize, rate: u64, park_after: u64) {
    let ns = unique(&format!("campaign{workers}r{rate}"));
    let mut s = laned(&ns, rate);
    s.lanes.park_after = Dur(Duration::from_millis(park_after));
    let _c = Cleanup::new(&s);
    let mut ready = Vec::new();
    for _ in 0..workers {
        // (declares the topology, so that what is published now is routed)
        ready.push(worker(&s).await);
    }
    let conn = amqp().await;
    for part in campaign() {
        publish_all(&conn, &s, &part).await;
    }
    let mut out = Dispatched::open(&conn, &s).await;
    let mut running = Vec::new();
    for w in ready {
        running.push(spawn_worker(w).await);
    }
    let is_urgent = |id: &str| id.starts_with("u-");
    let urgent = GROUPS * PER_GROUP;
    let mut seen = Vec::new();
    while seen.len() < urgent {
        let had = seen.len();
        let more =
            |ids: &[(String, Instant)]| ids.iter().filter(|(i, _)| is_urgent(i)).count() > had;
        out.read_until(Duration::from_secs(120), more).await;
        let jobs_queue = depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(0);
        let arrived: Vec<(usize, String)> = out
            .ids
            .iter()
            .enumerate()
            .filter(|(_, (i, _))| is_urgent(i))
            .map(|(p, (i, _))| (p, i.clone()))
            .collect();
        assert!(
            arrived.len() > had,
            "urgent jobs dispatched: {arrived:?} of {urgent}"
        );
        for (position, id) in arrived.into_iter().skip(had) {
            let group: usize = id[2..3].parse().unwrap();
            let bulk_ahead = AHEAD * (group + 1);
            seen.push(Seen {
                id,
                position,
                bulk_ahead,
                jobs_queue,
            });
        }
    }
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    println!("{workers} worker(s), {rate}/s: {seen:#?}");
    for u in &seen {
        // the campaign still being parked: jobs published after it not yet read
        assert!(
            u.jobs_queue > 0,
            "{}: the campaign had been read whole when it went out: {u:?}",
            u.id
        );
        // ahead of most of the bulk jobs published before it
        assert!(
            u.position < u.bulk_ahead / 2,
            "{}: went out behind half the bulk jobs published before it: {u:?}",
            u.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_jobs_pass_a_campaign_still_being_parked_on_one_worker() {
    urgent_jobs_pass_a_campaign_being_parked(1, 100, 250).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_jobs_pass_a_campaign_still_being_parked_on_three_workers() {
    urgent_jobs_pass_a_campaign_being_parked(3, 100, 250).await;
}

// A channel fast beside `lanes.park_after` (the default `amqp.prefetch`, 256 jobs
// of 5 ms each, waits 1.28 s, less than 2 s), as a channel of thousands a second
// is beside the default 250 ms: every job's wait for the rate is short, so what
// parks the campaign is the bound on the jobs read from the jobs queue that wait
// in the lanes' lines (half the prefetch), not their wait.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_jobs_pass_a_campaign_on_a_fast_channel_on_one_worker() {
    urgent_jobs_pass_a_campaign_being_parked(1, 200, 2_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn urgent_jobs_pass_a_campaign_on_a_fast_channel_on_three_workers() {
    urgent_jobs_pass_a_campaign_being_parked(3, 200, 2_000).await;
}
