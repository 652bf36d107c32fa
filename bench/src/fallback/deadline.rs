//! From a step's deadline to the next step's dispatch. Jobs of policy `alert` (no
//! rules; it escalates after [`WITHIN_SECS`] when no delivery answers a step),
//! routed push → email → sms, offered at a steady rate to a running worker, and no
//! feedback sent: each moves on to email at its push step's deadline and to sms at
//! its email step's. Consumers in the benchmark on the email and sms dispatch queues
//! (no acks) record each dispatch's arrival; once every one has arrived, each job's
//! route is read from Redis (`<prefix>:route:<id>`, what `admin job` shows): a step's
//! `escalates_at` is its deadline (Redis's clock, on this machine), and the next
//! step's entry its decision. The wait round the delay ladder is whole seconds, and
//! `answer_within` is whole seconds here, so the ladder adds no rounding: what is
//! measured is the ladder's expiry, the jobs queue and the next step's handling.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use lapin::Connection;
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::fallback::log::RouteEntry;

use super::{escalating_policy, ConfigFile};
use crate::broker::{closed, connect, offer, unix_micros, Watch};
use crate::context::Bench;
use crate::jobs::alert_job;
use crate::procs::{spawn_worker_configured, stop, wait_ready};
use crate::report::{median, DeadlineToDispatch, EndToEnd, StepDeadline};

/// `answer_within`, seconds.
pub const WITHIN_SECS: u64 = 2;
/// The route's channels, in order.
const ROUTE: [&str; 3] = ["push", "email", "sms"];

/// `jobs` jobs offered at `rate` a second; each move on's figures.
pub async fn measure(b: &Bench, jobs: u64, rate: f64) -> Result<DeadlineToDispatch> {
    let s = b.settings("fdl");
    let config = ConfigFile::write(&s, &escalating_policy(WITHIN_SECS))?;
    let result = run(b, &s, config.path(), jobs, rate).await;
    b.teardown.namespace(&s).await;
    let (sent, arrivals, routes) = result?;
    let steps: Vec<StepDeadline> = (1..ROUTE.len())
        .map(|i| {
            let left: HashMap<String, i64> = arrivals[i - 1].iter().cloned().collect();
            let moved = (ROUTE[i - 1], ROUTE[i]);
            summarise(moved, sent, (&left, &arrivals[i]), &routes)
        })
        .collect();
    for x in &steps {
        eprintln!(
            "      {} → {}: {} of {} dispatched; deadline to dispatch p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms, min {:.0} ms; from the step's arrival + {WITHIN_SECS} s p50 {:.0} ms, p99 {:.0} ms",
            x.from, x.to, x.arrived, sent, x.to_dispatch.p50_ms, x.to_dispatch.p99_ms,
            x.to_dispatch.max_ms, x.min_ms, x.from_arrival_p50_ms, x.from_arrival_p99_ms
        );
    }
    Ok(DeadlineToDispatch {
        jobs: sent,
        answer_within_secs: WITHIN_SECS,
        offered_jobs_per_sec: rate,
        steps,
    })
}

/// A dispatch as read: the job's id and its arrival, µs since the epoch.
type Arrival = (String, i64);

/// Offers the jobs to a worker and waits for every dispatch on each channel of
/// [`ROUTE`]: the jobs sent, the arrivals on each, and every job's route.
async fn run(
    b: &Bench,
    s: &Settings,
    config: &Path,
    jobs: u64,
    rate: f64,
) -> Result<(u64, Vec<Vec<Arrival>>, HashMap<String, Vec<RouteEntry>>)> {
    let topology = Topology::from_settings(s);
    let conn = connect(&s.amqp.url).await?;
    topology.declare(&conn).await?;
    let mut watches = Vec::new();
    for channel in ROUTE {
        watches.push(arrivals(&conn, &topology.dispatch_queue(channel), channel).await?);
    }
    let (mut child, port) = spawn_worker_configured(&b.worker, s, &[], config)?;
    let sent = async {
        wait_ready(port, &mut child).await?;
        let secs = (jobs as f64 / rate).ceil() as u64;
        let sent = offer(&conn, &s.amqp.jobs_exchange, "", rate, secs, |i| {
            alert_job(i, true)
        })
        .await?;
        // two deadlines, then the dispatches' way (at most a minute more)
        let until = Instant::now() + Duration::from_secs(2 * WITHIN_SECS + 60);
        while watches.iter().any(|w| w.weight() < sent) && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::Ok(sent)
    }
    .await;
    stop(&mut child);
    let mut seen = Vec::new();
    for w in watches {
        seen.push(w.finish().await?);
    }
    let _ = closed(conn.close(200, "bye".into())).await;
    let sent = sent?;
    let routes = read_routes(s, sent)?;
    Ok((sent, seen, routes))
}

/// A [`Watch`] of a dispatch queue keeping each message's id and arrival.
async fn arrivals(conn: &Connection, queue: &str, tag: &str) -> Result<Watch<Arrival>> {
    Watch::start(conn, queue, tag, |d| {
        let at = unix_micros();
        let id = d
            .properties
            .message_id()
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default();
        (Some((id, at)), 1)
    })
    .await
}

/// The routes of jobs `e0` .. `e<sent>`, by id.
fn read_routes(s: &Settings, sent: u64) -> Result<HashMap<String, Vec<RouteEntry>>> {
    let keys = s.redis.keys();
    let mut r = redis::Client::open(s.redis.url.as_str())?.get_connection()?;
    let ids: Vec<String> = (0..sent).map(|i| format!("e{i}")).collect();
    let mut out = HashMap::new();
    for chunk in ids.chunks(1_000) {
        let mut pipe = redis::pipe();
        for id in chunk {
            pipe.cmd("LRANGE").arg(keys.job_route(id)).arg(0).arg(-1);
        }
        let lists: Vec<Vec<String>> = pipe.query(&mut r)?;
        for (id, list) in chunk.iter().zip(lists) {
            let entries = list
                .iter()
                .filter_map(|e| serde_json::from_str(e).ok())
                .collect();
            out.insert(id.clone(), entries);
        }
    }
    Ok(out)
}

/// The figures of the move from `from` to `to` (pure): over the dispatches `seen`
/// on `to`, each against its `from` step's deadline in `routes`, and against that
/// step's arrival (in `left`) plus `answer_within`.
fn summarise(
    (from, to): (&str, &str),
    sent: u64,
    (left, seen): (&HashMap<String, i64>, &[Arrival]),
    routes: &HashMap<String, Vec<RouteEntry>>,
) -> StepDeadline {
    let deadline = |id: &str| {
        routes
            .get(id)?
            .iter()
            .find(|e| e.channel == from)?
            .escalates_at
            .map(|t| t.timestamp_micros())
    };
    let waits: Vec<i64> = seen
        .iter()
        .filter_map(|(id, at)| Some(at - deadline(id)?))
        .collect();
    let within_us = (WITHIN_SECS * 1_000_000) as i64;
    let from_arrival: Vec<f64> = seen
        .iter()
        .filter_map(|(id, at)| Some((at - left.get(id)? - within_us) as f64 / 1e3))
        .collect();
    let min_ms = waits.iter().min().map_or(0.0, |&w| w as f64 / 1e3);
    let mut micros: Vec<u64> = waits.iter().map(|&w| w.max(0) as u64).collect();
    micros.sort_unstable();
    let mut sorted = from_arrival.clone();
    sorted.sort_by(f64::total_cmp);
    let p99 = sorted
        .get(((sorted.len() as f64 * 0.99).ceil() as usize).saturating_sub(1))
        .copied()
        .unwrap_or(0.0);
    StepDeadline {
        from: from.into(),
        to: to.into(),
        arrived: seen.len() as u64,
        with_deadline: waits.len() as u64,
        to_dispatch: EndToEnd::of(sent, &micros),
        min_ms,
        from_arrival_p50_ms: median(from_arrival),
        from_arrival_p99_ms: p99,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use quota_worker::fallback::log::StepOutcome;

    fn entry(step: usize, channel: &str, at_ms: i64, escalates_ms: Option<i64>) -> RouteEntry {
        let t = |ms| Utc.timestamp_millis_opt(ms).unwrap();
        RouteEntry {
            step,
            of: 3,
            channel: channel.into(),
            at: t(at_ms),
            outcome: StepOutcome::Dispatched,
            left: None,
            escalates_at: escalates_ms.map(t),
        }
    }

    #[test]
    fn each_dispatch_is_timed_from_the_deadline_of_the_step_it_left() {
        let routes = HashMap::from([
            (
                "e0".to_string(),
                vec![
                    entry(1, "push", 1_000, Some(3_000)),
                    entry(2, "email", 3_010, Some(5_010)),
                ],
            ),
            ("e1".to_string(), vec![entry(1, "push", 1_500, Some(3_500))]),
        ]);
        // e0 on email 30 ms after its push deadline, e1 20 ms; e2 has no route
        let seen = vec![
            ("e0".to_string(), 3_030_000),
            ("e1".to_string(), 3_520_000),
            ("e2".to_string(), 9_000_000),
        ];
        // push arrivals: e0's 10 ms after its entry; e1's not read
        let left = HashMap::from([("e0".to_string(), 1_010_000)]);
        let x = summarise(("push", "email"), 3, (&left, &seen), &routes);
        assert_eq!((x.arrived, x.with_deadline), (3, 2));
        assert_eq!(x.to_dispatch.max_ms, 30.0);
        assert_eq!(x.min_ms, 20.0);
        // e0: 3,030 - (1,010 + 2,000) ms
        assert_eq!(x.from_arrival_p50_ms, 20.0);
        assert_eq!(x.from_arrival_p99_ms, 20.0);
    }
}
