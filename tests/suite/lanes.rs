//! Lanes: jobs that wait for their channel's rate wait by priority, and urgent ones
//! take the next send slots on every worker. An urgent job overtakes a paced bulk
//! backlog (one worker and three; published by a producer that knows nothing of
//! lanes, as a `transactional` job, and by one that publishes to the lane); the
//! one rate holds with every lane busy, and `normal` keeps its minimum share; a
//! delayed job comes back to its own lane. Assertions are on order, not speed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use quota_worker::amqp::Publisher;
use quota_worker::config::{PolicySettings, Settings};
use quota_worker::job::headers::PARKED_AT;
use quota_worker::lanes::Priority;
use quota_worker_producer::{Job, Producer};
use testkit::*;

/// Settings with `sms` paced at `rate`/s (burst 5) and a rule-less `campaign`
/// policy whose jobs are bulk.
pub(crate) fn laned(ns: &str, rate: u64) -> Settings {
    let mut s = settings(ns);
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(rate);
    sms.burst = Some(5);
    let campaign = PolicySettings {
        priority: Priority::Bulk,
        ..PolicySettings::default()
    };
    s.policies.insert("campaign".into(), campaign);
    s
}

/// Points `s` at its Redis through a loopback proxy that delays each direction by
/// `delay` (the proxy serves for as long as it lives).
fn behind_a_slow_redis(s: &mut Settings, delay: Duration) -> testkit::proxy::Proxy {
    let (host, port) = redis_host_port(&s.redis.url);
    let target = std::net::ToSocketAddrs::to_socket_addrs(&format!("{host}:{port}"))
        .unwrap()
        .next()
        .unwrap();
    let proxy = testkit::proxy::Proxy::delayed(target, delay);
    s.redis.url = format!("redis://{}", proxy.addr());
    proxy
}

pub(crate) fn body(id: &str, category: &str, priority: Option<&str>) -> String {
    let lane = priority.map_or(String::new(), |p| format!(r#","priority":"{p}""#));
    format!(r#"{{"id":"{id}","recipient":"{id}","channel":"sms","category":"{category}"{lane}}}"#)
}

pub(crate) async fn publish_all(conn: &lapin::Connection, s: &Settings, bodies: &[String]) {
    publish_to(conn, (&s.amqp.jobs_exchange, ""), bodies).await;
}

/// Publish `bodies` to `exchange` with `routing_key`, a few at a time, each confirmed.
async fn publish_to(
    conn: &lapin::Connection,
    (exchange, routing_key): (&str, &str),
    bodies: &[String],
) {
    let p = Publisher::open(conn, Duration::from_secs(10))
        .await
        .unwrap();
    for chunk in bodies.chunks(64) {
        let sends = chunk.iter().map(|b| {
            let props =
                lapin::BasicProperties::default().with_content_type("application/json".into());
            p.publish(exchange, routing_key, b.as_bytes(), props)
        });
        for r in futures_util::future::join_all(sends).await {
            r.unwrap();
        }
    }
}

/// The dispatch queue of `sms`, read in order: every job id with its arrival.
pub(crate) struct Dispatched {
    consumer: lapin::Consumer,
    pub(crate) ids: Vec<(String, Instant)>,
    /// The ids that were parked in a lane on their way (the header a parked job
    /// carries to its dispatch).
    parked: std::collections::HashSet<String>,
}

impl Dispatched {
    pub(crate) async fn open(conn: &lapin::Connection, s: &Settings) -> Dispatched {
        let ch = conn.create_channel().await.unwrap();
        let consumer = ch
            .basic_consume(
                topology(s).dispatch_queue("sms").as_str().into(),
                "lanes-test".into(),
                // no acks to wait for: the reader keeps up with the dispatches even
                // on a loaded machine, so arrival times stay close to dispatch times
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        Dispatched {
            consumer,
            ids: Vec::new(),
            parked: Default::default(),
        }
    }

    /// Read until `done` says so or `limit` passes.
    pub(crate) async fn read_until(
        &mut self,
        limit: Duration,
        done: impl Fn(&[(String, Instant)]) -> bool,
    ) {
        let deadline = Instant::now() + limit;
        while !done(&self.ids) && Instant::now() < deadline {
            if let Ok(Some(Ok(d))) =
                tokio::time::timeout(Duration::from_millis(200), self.consumer.next()).await
            {
                let id = d.properties.message_id().as_ref().unwrap().to_string();
                let headers = d.properties.headers().as_ref();
                if headers.is_some_and(|h| h.inner().contains_key(PARKED_AT)) {
                    self.parked.insert(id.clone());
                }
                self.ids.push((id, Instant::now()));
            }
        }
    }

    /// How many of the dispatches at `range` were parked on their way.
    fn parked_among(&self, range: std::ops::Range<usize>) -> usize {
        self.ids[range]
            .iter()
            .filter(|(id, _)| self.parked.contains(id))
            .count()
    }

    pub(crate) fn position(&self, id: &str) -> Option<usize> {
        self.ids.iter().position(|(i, _)| i == id)
    }
}

const BACKLOG: usize = 2_000;
const URGENT: usize = 20;

/// 2,000 bulk jobs at 100/s, then 20 urgent ones once 100 are out: each urgent one
/// is dispatched within the next 100 sends, while well over 1,500 bulk jobs still wait.
async fn urgent_overtakes(workers: usize) {
    let ns = unique(&format!("lanes{workers}"));
    let s = laned(&ns, 100);
    let _c = Cleanup::new(&s);
    let mut running = Vec::new();
    for _ in 0..workers {
        running.push(spawn_worker(worker(&s).await).await);
    }
    let conn = amqp().await;
    let bulk: Vec<String> = (0..BACKLOG)
        .map(|i| body(&format!("b-{i}"), "campaign", None))
        .collect();
    publish_all(&conn, &s, &bulk).await;
    let mut out = Dispatched::open(&conn, &s).await;
    out.read_until(Duration::from_secs(30), |ids| ids.len() >= 100)
        .await;
    let before = out.ids.len();
    // half from a producer that knows nothing of lanes (a transactional job, no
    // priority, to notify.jobs), half to the lane itself (the producer crate)
    let old: Vec<String> = (0..URGENT / 2)
        .map(|i| body(&format!("u-old-{i}"), "transactional", None))
        .collect();
    publish_all(&conn, &s, &old).await;
    let producer = Producer::on_connection(
        amqp().await,
        &s.amqp.jobs_exchange,
        Duration::from_secs(10),
        1 << 20,
    )
    .await
    .unwrap()
    .with_lanes(&s.lanes.exchange);
    for i in 0..URGENT / 2 {
        let job = Job::new(format!("u-new-{i}"), "sms")
            .id(format!("u-new-{i}"))
            .priority(Priority::Urgent);
        producer.publish(&job).await.unwrap();
    }
    let urgent: Vec<String> = (0..URGENT / 2)
        .flat_map(|i| [format!("u-old-{i}"), format!("u-new-{i}")])
        .collect();
    let all_in = |ids: &[(String, Instant)]| urgent.iter().all(|u| ids.iter().any(|(i, _)| i == u));
    out.read_until(Duration::from_secs(30), all_in).await;
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    producer.close().await;
    let positions: Vec<usize> = urgent
        .iter()
        .map(|u| {
            out.position(u)
                .unwrap_or_else(|| panic!("{u} never dispatched"))
        })
        .collect();
    let last = *positions.iter().max().unwrap();
    println!(
        "{workers} worker(s): urgent jobs published after {before} sends, dispatched at positions {positions:?}"
    );
    assert!(
        last < before + 100 + URGENT,
        "the last urgent job went out {} sends after they were published",
        last - before
    );
    assert!(
        BACKLOG - last > 1_500,
        "the backlog had drained before the urgent jobs went out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_job_overtakes_a_paced_backlog_on_one_worker() {
    urgent_overtakes(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_urgent_job_overtakes_a_paced_backlog_on_three_workers() {
    urgent_overtakes(3).await;
}

/// Three workers, every lane with a backlog: together they stay within the rate
/// (±5 % over 10 s), urgent gets most of it, normal at least about its minimum
/// share (10 %), and bulk waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lanes_share_one_rate_and_normal_keeps_its_share() {
    const RATE: u64 = 100;
    // 10 s in CI; the issue's figure is over 60 s (QW_LANES_SHARE_SECS=60)
    let window = Duration::from_secs(
        std::env::var("QW_LANES_SHARE_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(10),
    );
    // every lane busy for the whole window (each alone could fill it)
    let per_lane = (window.as_secs() + 5) * RATE;
    let ns = unique("lanesrate");
    let s = laned(&ns, RATE);
    let _c = Cleanup::new(&s);
    let conn = amqp().await;
    let mut bodies = Vec::new();
    for i in 0..per_lane {
        bodies.push(body(&format!("u-{i}"), "transactional", None));
        bodies.push(body(&format!("n-{i}"), "transactional", Some("normal")));
        bodies.push(body(&format!("b-{i}"), "campaign", None));
    }
    // the topology first, then the backlog, then the workers
    worker(&s).await;
    publish_all(&conn, &s, &bodies).await;
    let mut running = Vec::new();
    for _ in 0..3 {
        running.push(spawn_worker(worker(&s).await).await);
    }
    let mut out = Dispatched::open(&conn, &s).await;
    out.read_until(window + Duration::from_secs(10), |ids| {
        ids.first()
            .is_some_and(|(_, t0)| t0.elapsed() > window + Duration::from_secs(2))
    })
    .await;
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    let start = out.ids[0].1 + Duration::from_secs(1);
    let mut by_lane: HashMap<char, usize> = HashMap::new();
    for (id, t) in &out.ids {
        if *t >= start && *t < start + window {
            *by_lane.entry(id.chars().next().unwrap()).or_default() += 1;
        }
    }
    let n: usize = by_lane.values().sum();
    let expected = RATE as f64 * window.as_secs_f64();
    println!("dispatched in {window:?}: {by_lane:?} (rate {RATE}/s => {expected})");
    assert!(
        (n as f64 - expected).abs() <= expected * 0.05,
        "{n} dispatched, expected {expected} ± 5%"
    );
    let of = |c| by_lane.get(&c).copied().unwrap_or(0) as f64;
    assert!(of('n') >= 0.08 * n as f64, "normal kept {} of {n}", of('n'));
    assert!(of('u') >= 0.7 * n as f64, "urgent got {} of {n}", of('u'));
    assert!(of('b') <= 0.05 * n as f64, "bulk took {} of {n}", of('b'));
}

/// A lane's backlog drains at its channel's rate when Redis is slow to answer: with
/// Redis behind a proxy that adds 20 ms each way (a round trip of 40 ms and more,
/// four times the lane line's shortest look-ahead), one worker drains 2,000 bulk
/// jobs parked in their lane at 400/s (burst 1) at 0.9 of the rate or better over
/// 3 s from half a second after its first dispatch (the worker's first asks time
/// the round trip). A line that asked only 10 ms ahead lost every slot between the
/// end of one grant and its next ask (a burst of 1 keeps no unused slot) and
/// drained at 0.2 of the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_drains_at_its_rate_through_a_slow_redis() {
    const RATE: u64 = 400;
    const JOBS: usize = 2_000;
    let window = Duration::from_secs(3);
    let ns = unique("lanesslow");
    let mut s = laned(&ns, RATE);
    s.channels.get_mut("sms").unwrap().burst = Some(1);
    let _c = Cleanup::new(&s);
    let _proxy = behind_a_slow_redis(&mut s, Duration::from_millis(20));
    // the topology first, then the backlog straight into the bulk lane, then the worker
    worker(&s).await;
    let conn = amqp().await;
    let lane = topology(&s).lane_queue("sms", Priority::Bulk);
    let bodies: Vec<String> = (0..JOBS)
        .map(|i| body(&format!("b-{i}"), "campaign", None))
        .collect();
    publish_to(&conn, ("", &lane), &bodies).await;
    let mut out = Dispatched::open(&conn, &s).await;
    let running = spawn_worker(worker(&s).await).await;
    out.read_until(Duration::from_secs(60), |ids| {
        ids.first()
            .is_some_and(|(_, t0)| t0.elapsed() > window + Duration::from_secs(2))
    })
    .await;
    running.0.cancel();
    running.1.await.unwrap();
    let first = out.ids.first().expect("nothing dispatched").1;
    let t0 = first + Duration::from_millis(500);
    let n = out
        .ids
        .iter()
        .filter(|(_, t)| *t >= t0 && *t < t0 + window)
        .count();
    let curve: Vec<usize> = (0..8)
        .map(|k| {
            let from = first + Duration::from_millis(500 * k);
            let to = from + Duration::from_millis(500);
            out.ids
                .iter()
                .filter(|(_, t)| *t >= from && *t < to)
                .count()
        })
        .collect();
    println!("by half-seconds: {curve:?}");
    let expected = RATE as f64 * window.as_secs_f64();
    println!(
        "through a Redis 40 ms away: {n} dispatched in {window:?} from 0.5 s after the \
         first ({:.2} of the rate)",
        n as f64 / expected
    );
    assert!(
        n as f64 >= 0.9 * expected,
        "{n} dispatched in {window:?}, the rate allows {expected}"
    );
    assert!(
        n as f64 <= 1.05 * expected + 1.0,
        "{n} dispatched in {window:?}: above the rate ({expected})"
    );
}

/// A burst above the rate for a moment is waited out in the worker, a backlog is
/// parked: at 100/s (burst 5) with `lanes.park_after` 1 s, 20 jobs at once (about
/// 150 ms of waiting) all go out without a park; 400 at once (about 4 s) are
/// parked, all but the first second's worth. Told by the header a parked job
/// carries to its dispatch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_burst_waits_in_the_worker_and_a_backlog_is_parked() {
    let ns = unique("lanesburst");
    let mut s = laned(&ns, 100);
    s.lanes.park_after = quota_worker::config::Dur(Duration::from_secs(1));
    let _c = Cleanup::new(&s);
    let running = spawn_worker(worker(&s).await).await;
    let conn = amqp().await;
    let mut out = Dispatched::open(&conn, &s).await;
    let burst: Vec<String> = (0..20)
        .map(|i| body(&format!("s-{i}"), "campaign", None))
        .collect();
    publish_all(&conn, &s, &burst).await;
    out.read_until(Duration::from_secs(30), |ids| ids.len() >= 20)
        .await;
    assert_eq!(out.ids.len(), 20, "the short burst was not all dispatched");
    let parked = out.parked_among(0..20);
    assert_eq!(parked, 0, "{parked} of a 150 ms burst were parked");

    let backlog: Vec<String> = (0..400)
        .map(|i| body(&format!("l-{i}"), "campaign", None))
        .collect();
    publish_all(&conn, &s, &backlog).await;
    out.read_until(Duration::from_secs(30), |ids| ids.len() >= 270)
        .await;
    running.0.cancel();
    running.1.await.unwrap();
    let long = out.ids.len() - 20;
    let parked = out.parked_among(20..out.ids.len());
    println!(
        "short burst: 0 of 20 parked; backlog: {parked} of the first {long} dispatched parked"
    );
    assert_eq!(long, 250, "the backlog's first 250 were not dispatched");
    // at most about 105 can go out within their first second of waiting
    assert!(parked >= 100, "only {parked} of 250 were parked");
}

/// A wait made long by a slow Redis, not by the rate, parks nothing: through a
/// Redis 300 ms away a round trip (longer than `lanes.park_after`, 250 ms), 40 jobs
/// at once at 400/s (burst 5: 100 ms of the rate, five slots an ask) all go out
/// from the worker without a park, though the last wait more than a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_redis_parks_no_job_the_rate_would_serve_soon() {
    const JOBS: usize = 40;
    let ns = unique("lanesslowpark");
    let mut s = laned(&ns, 400);
    let _c = Cleanup::new(&s);
    let _proxy = behind_a_slow_redis(&mut s, Duration::from_millis(150));
    let running = spawn_worker(worker(&s).await).await;
    let conn = amqp().await;
    let mut out = Dispatched::open(&conn, &s).await;
    let bodies: Vec<String> = (0..JOBS)
        .map(|i| body(&format!("j-{i}"), "campaign", None))
        .collect();
    publish_all(&conn, &s, &bodies).await;
    out.read_until(Duration::from_secs(60), |ids| ids.len() >= JOBS)
        .await;
    running.0.cancel();
    running.1.await.unwrap();
    assert_eq!(out.ids.len(), JOBS, "not all were dispatched");
    let took = out.ids[JOBS - 1].1 - out.ids[0].1;
    let parked = out.parked_among(0..JOBS);
    println!("{JOBS} jobs through a Redis 300 ms away: {parked} parked, the last {took:?} after the first");
    assert_eq!(parked, 0, "{parked} of {JOBS} were parked for a slow Redis");
}

/// A job delayed by its schedule while its channel is busy comes back to its own
/// lane: an urgent one goes out as soon as its `not_before` passes, ahead of the
/// bulk backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_job_returns_to_its_own_lane() {
    let ns = unique("lanesdelay");
    let s = laned(&ns, 50);
    let _c = Cleanup::new(&s);
    let running = spawn_worker(worker(&s).await).await;
    let conn = amqp().await;
    let bulk: Vec<String> = (0..1_000)
        .map(|i| body(&format!("b-{i}"), "campaign", None))
        .collect();
    publish_all(&conn, &s, &bulk).await;
    let mut out = Dispatched::open(&conn, &s).await;
    out.read_until(Duration::from_secs(20), |ids| ids.len() >= 20)
        .await;
    let at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let delayed = format!(
        r#"{{"id":"late","recipient":"late","channel":"sms","priority":"urgent","not_before":"{}"}}"#,
        at.to_rfc3339()
    );
    publish_all(&conn, &s, &[delayed]).await;
    out.read_until(Duration::from_secs(20), |ids| {
        ids.iter().any(|(i, _)| i == "late")
    })
    .await;
    running.0.cancel();
    running.1.await.unwrap();
    let due = out
        .ids
        .iter()
        .position(|(_, t)| {
            chrono::Utc::now() - chrono::Duration::from_std(t.elapsed()).unwrap() >= at
        })
        .expect("sends after its not_before");
    let late = out
        .position("late")
        .expect("the delayed job was dispatched");
    println!("due at send {due}, dispatched at send {late}");
    assert!(
        late >= due.saturating_sub(1),
        "it went out before its not_before"
    );
    assert!(
        late < due + 50,
        "it waited {} sends behind the backlog after its not_before",
        late - due
    );
}
