//! Fair shares inside a lane: tenant `a` parks a bulk backlog on a paced channel,
//! then `b` (weight 1) and `c` (weight 2) publish theirs behind it. While all
//! three wait, the lane's dispatches go 1:1:2; once `c` has nothing waiting its
//! share goes to the others (1:1); a newcomer is served within a second's worth of
//! the channel's slots; an urgent job published behind the multi-tenant backlog is
//! too. One worker and three. Shares are counted from the dispatch order, not the
//! clock; nothing is sent twice and nothing is lost.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lapin::options::BasicConsumeOptions;
use lapin::types::FieldTable;
use quota_worker::config::{Settings, TenantSettings};
use quota_worker::lanes::Priority;
use testkit::*;

use crate::lanes::{laned, publish_all};

/// Rate of the channel (jobs a second).
const RATE: usize = 200;
const A_JOBS: usize = 2_000;
const B_JOBS: usize = 400;
const C_JOBS: usize = 400;
/// Urgent jobs published behind the backlog.
const URGENT: usize = 3;

fn job(id: &str, tenant: &str, category: &str) -> String {
    format!(
        r#"{{"id":"{id}","recipient":"{id}","channel":"sms","category":"{category}","tenant":"{tenant}"}}"#
    )
}

fn jobs(tenant: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| job(&format!("{tenant}-{i}"), tenant, "campaign"))
        .collect()
}

/// Deletes the tenants' queues the test made (the topology's cleanup knows only
/// the queues it declares).
async fn delete_tenant_queues(s: &Settings) {
    let conn = amqp().await;
    let t = topology(s);
    for tenant in ["a", "b", "c"] {
        for lane in Priority::ALL {
            let ch = conn.create_channel().await.unwrap();
            let q = t.tenant_queue("sms", lane, tenant);
            let _ = ch.queue_delete(q.as_str().into(), Default::default()).await;
        }
    }
    let _ = conn.close(200, "".into()).await;
}

/// The dispatch queue read as it fills, by a task of its own (positions taken at
/// any moment are what had arrived by then).
#[derive(Clone, Default)]
struct Reader(Arc<Mutex<Vec<String>>>);

impl Reader {
    async fn start(conn: &lapin::Connection, s: &Settings) -> Reader {
        let ch = conn.create_channel().await.unwrap();
        let mut consumer = ch
            .basic_consume(
                topology(s).dispatch_queue("sms").as_str().into(),
                "fair-test".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .unwrap();
        let r = Reader::default();
        let ids = r.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let id = d.properties.message_id().as_ref().unwrap().to_string();
                ids.lock().unwrap().push(id);
            }
        });
        r
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn ids(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    /// Wait until `done` says so (at most `limit`).
    async fn until(&self, limit: Duration, done: impl Fn(&[String]) -> bool) {
        let deadline = Instant::now() + limit;
        while !done(&self.0.lock().unwrap()) {
            assert!(Instant::now() < deadline, "not dispatched within {limit:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Each tenant's share of `ids` (urgent jobs left out).
fn shares_of(ids: &[String]) -> [f64; 3] {
    let ids: Vec<&String> = ids.iter().filter(|i| !i.starts_with("u-")).collect();
    let n = ids.len().max(1) as f64;
    let of = |t: &str| ids.iter().filter(|i| i.starts_with(t)).count() as f64 / n;
    [of("a-"), of("b-"), of("c-")]
}

async fn weights_share_a_lane(workers: usize) {
    let ns = unique(&format!("fair{workers}"));
    let mut s = laned(&ns, RATE as u64);
    s.tenants.insert(
        "c".into(),
        TenantSettings {
            weight: 2,
            ..TenantSettings::default()
        },
    );
    let _c = Cleanup::new(&s);
    let mut running = Vec::new();
    for _ in 0..workers {
        running.push(spawn_worker(worker(&s).await).await);
    }
    let conn = amqp().await;
    let out = Reader::start(&conn, &s).await;
    publish_all(&conn, &s, &jobs("a", A_JOBS)).await;
    // a's backlog parked (the jobs queue read empty), some of its jobs out
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let left = testkit::audit::depth(&conn, &s.amqp.jobs_queue).await;
        if left == Some(0) && out.len() >= 50 {
            break;
        }
        assert!(Instant::now() < deadline, "a's jobs never parked");
    }
    // b's first job alone, then the rest of b's and c's
    let b_at = out.len();
    let b = jobs("b", B_JOBS);
    publish_all(&conn, &s, &b[..1]).await;
    publish_all(&conn, &s, &b[1..]).await;
    publish_all(&conn, &s, &jobs("c", C_JOBS)).await;
    // urgent codes of b, each published once the last was dispatched
    let mut urgent_at = Vec::new();
    for i in 0..URGENT {
        let id = format!("u-{i}");
        urgent_at.push((id.clone(), out.len()));
        publish_all(&conn, &s, &[job(&id, "b", "transactional")]).await;
        out.until(Duration::from_secs(60), |ids| ids.contains(&id))
            .await;
    }
    let total = A_JOBS + B_JOBS + C_JOBS + URGENT;
    let done = |ids: &[String]| ids.iter().filter(|i| i.starts_with("b-")).count() >= B_JOBS;
    out.until(Duration::from_secs(600), done).await;
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    delete_tenant_queues(&s).await;
    let ids = out.ids();
    let unique: HashSet<&str> = ids.iter().map(|i| i.as_str()).collect();
    assert_eq!(unique.len(), ids.len(), "a job dispatched twice");
    assert!(ids.len() <= total);
    let last = |t: &str| ids.iter().rposition(|i| i.starts_with(t)).unwrap();
    let first = |t: &str| ids.iter().position(|i| i.starts_with(t)).unwrap();
    let (b_first, c_first, c_last, b_last) = (first("b-"), first("c-"), last("c-"), last("b-"));
    let urgent: Vec<(String, usize, usize)> = urgent_at
        .iter()
        .map(|(id, at)| (id.clone(), *at, ids.iter().position(|i| i == id).unwrap()))
        .collect();
    // all three waiting: 1:1:2 (the ends trimmed: a newcomer's start, the last jobs)
    let trim = 20;
    let window = &ids[b_first.max(c_first) + trim..c_last - trim];
    let during = shares_of(window);
    // c done: its share goes to a and b, 1:1
    let after = &ids[c_last + 1..b_last.saturating_sub(trim).max(c_last + 2)];
    let since = shares_of(after);
    println!(
        "{workers} worker(s): b published at {b_at}, first b at {b_first}, first c at {c_first}, \
         last c at {c_last}, last b at {b_last}; urgent (published at, dispatched at) {urgent:?}; \
         shares a, b, c over {}: {during:?}; after c, over {}: {since:?}",
        window.len(),
        after.len()
    );
    // a newcomer served within a second's worth of the channel's slots (two: the
    // machine may be loaded by other tests; the bench's `tenants` step times it)
    assert!(
        b_first - b_at <= 2 * RATE,
        "b waited {} dispatches",
        b_first - b_at
    );
    for (id, at, p) in &urgent {
        assert!(
            p - at <= RATE,
            "{id} waited {} dispatches behind the backlog",
            p - at
        );
    }
    for (share, want) in during.iter().zip([0.25, 0.25, 0.5]) {
        assert!(
            (share / want - 1.0).abs() <= 0.10,
            "shares {during:?} against 1:1:2 over {} dispatches",
            window.len()
        );
    }
    assert_eq!(since[2], 0.0, "c had nothing waiting");
    for share in &since[..2] {
        assert!(
            (share / 0.5 - 1.0).abs() <= 0.10,
            "after c: shares {since:?} against 1:1 over {} dispatches",
            after.len()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_share_a_lane_on_one_worker() {
    weights_share_a_lane(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weights_share_a_lane_on_three_workers() {
    weights_share_a_lane(3).await;
}

/// `admin queues` shows, for the bulk lane of a paced channel, how many tenants have
/// jobs waiting in their queues and the ones with the most.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_queues_shows_the_tenants_waiting_in_a_lane() {
    let ns = unique("fairadmin");
    let s = laned(&ns, 1);
    let _c = Cleanup::new(&s);
    let (stop, handle) = spawn_worker(worker(&s).await).await;
    let conn = amqp().await;
    publish_all(&conn, &s, &jobs("a", 30)).await;
    publish_all(&conn, &s, &jobs("b", 10)).await;
    let t = topology(&s);
    let (qa, qb) = (
        t.tenant_queue("sms", Priority::Bulk, "a"),
        t.tenant_queue("sms", Priority::Bulk, "b"),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let a = testkit::audit::depth(&conn, &qa).await.unwrap_or(0);
        let b = testkit::audit::depth(&conn, &qb).await.unwrap_or(0);
        if a >= 20 && b >= 5 {
            break;
        }
        assert!(Instant::now() < deadline, "not parked: a {a}, b {b}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // stopped: the depths hold still while the CLI reads them
    stop.cancel();
    handle.await.unwrap();
    let out =
        crate::cli::json(&crate::cli::run_async(&s, &["admin", "queues", "--json"], None).await);
    let bulk = out
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == t.lane_queue("sms", Priority::Bulk).as_str())
        .expect("the bulk lane listed")
        .clone();
    let tenants = &bulk["tenants"];
    assert_eq!(tenants["waiting"], 2, "{bulk}");
    assert_eq!(tenants["top"][0][0], "a", "{bulk}");
    assert_eq!(tenants["top"][1][0], "b", "{bulk}");
    let table = crate::cli::stdout(&crate::cli::run_async(&s, &["admin", "queues"], None).await);
    assert!(table.contains("tenants waiting: 2 (most: a "), "{table}");
    delete_tenant_queues(&s).await;
}
