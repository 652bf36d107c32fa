//! Fair shares inside a lane: tenant `a` parks a bulk backlog on a paced channel,
//! then `b` (weight 1) and `c` (weight 2) publish theirs behind it. While all
//! three wait, the lane's dispatches go 1:1:2; once `c` has nothing waiting its
//! share goes to the others (1:1); a newcomer is served within a second's worth of
//! the channel's slots; an urgent job published behind the multi-tenant backlog is
//! too. One worker and three. Shares are counted from the dispatch order, not the
//! clock; nothing is sent twice and nothing is lost.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use quota_worker::config::TenantSettings;
use quota_worker::lanes::Priority;
use testkit::*;

use crate::lanes::{laned, publish_all, Dispatched};

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

/// Each tenant's share of `ids`.
fn shares(ids: &[(String, Instant)]) -> [f64; 3] {
    let n = ids.len().max(1) as f64;
    let of = |t: &str| ids.iter().filter(|(i, _)| i.starts_with(t)).count() as f64 / n;
    [of("a-"), of("b-"), of("c-")]
}

/// Deletes the tenants' queues the test made (the topology's cleanup knows only
/// the queues it declares).
async fn delete_tenant_queues(s: &quota_worker::config::Settings) {
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
    let mut out = Dispatched::open(&conn, &s).await;
    publish_all(&conn, &s, &jobs("a", A_JOBS)).await;
    // a's backlog parked (the jobs queue read empty), a few of its jobs out
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        out.read_until(Duration::from_millis(300), |ids| ids.len() >= 50)
            .await;
        let left = testkit::audit::depth(&conn, &s.amqp.jobs_queue).await;
        if left == Some(0) && out.ids.len() >= 50 {
            break;
        }
        assert!(Instant::now() < deadline, "a's jobs never parked");
    }
    let b_at = out.ids.len();
    publish_all(&conn, &s, &jobs("b", B_JOBS)).await;
    publish_all(&conn, &s, &jobs("c", C_JOBS)).await;
    // urgent codes of b, each published once the last was dispatched
    let mut urgent_at = Vec::new();
    for i in 0..URGENT {
        let id = format!("u-{i}");
        urgent_at.push((id.clone(), out.ids.len()));
        publish_all(&conn, &s, &[job(&id, "b", "transactional")]).await;
        out.read_until(Duration::from_secs(60), |ids| {
            ids.iter().any(|(x, _)| *x == id)
        })
        .await;
    }
    let total = A_JOBS + B_JOBS + C_JOBS + URGENT;
    let done = |ids: &[(String, Instant)]| {
        let b = ids.iter().filter(|(i, _)| i.starts_with("b-")).count();
        b >= B_JOBS
    };
    out.read_until(Duration::from_secs(600), done).await;
    for (stop, handle) in running {
        stop.cancel();
        handle.await.unwrap();
    }
    delete_tenant_queues(&s).await;
    let ids = &out.ids;
    let unique: HashSet<&str> = ids.iter().map(|(i, _)| i.as_str()).collect();
    assert_eq!(unique.len(), ids.len(), "a job dispatched twice");
    assert!(ids.len() <= total);
    let last = |t: &str| ids.iter().rposition(|(i, _)| i.starts_with(t)).unwrap();
    let first = |t: &str| ids.iter().position(|(i, _)| i.starts_with(t)).unwrap();
    let (b_first, c_first, c_last, b_last) = (first("b-"), first("c-"), last("c-"), last("b-"));
    println!(
        "{workers} worker(s): b published at {b_at}, first b at {b_first}, first c at {c_first}, \
         last c at {c_last}, last b at {b_last}, urgent {urgent_at:?}"
    );
    // a newcomer served within a second's worth of the channel's slots
    assert!(
        b_first - b_at <= RATE,
        "b waited {} dispatches",
        b_first - b_at
    );
    for (id, at) in &urgent_at {
        let p = out.position(id).expect("urgent dispatched");
        assert!(
            p - at <= RATE,
            "{id} waited {} dispatches behind the backlog",
            p - at
        );
    }
    // all three waiting: 1:1:2 (the ends trimmed: a newcomer's start, the last jobs)
    let trim = 20;
    let from = b_first.max(c_first) + trim;
    let window: Vec<(String, Instant)> = ids[from..c_last - trim]
        .iter()
        .filter(|(i, _)| !i.starts_with("u-"))
        .cloned()
        .collect();
    let got = shares(&window);
    println!(
        "{workers} worker(s): shares a, b, c over {}: {got:?}",
        window.len()
    );
    for (share, want) in got.iter().zip([0.25, 0.25, 0.5]) {
        assert!(
            (share / want - 1.0).abs() <= 0.10,
            "shares {got:?} against 1:1:2 over {} dispatches",
            window.len()
        );
    }
    // c done: its share goes to a and b, 1:1
    let after: Vec<(String, Instant)> = ids[c_last + 1..b_last - trim.min(b_last - c_last - 1)]
        .iter()
        .filter(|(i, _)| !i.starts_with("u-"))
        .cloned()
        .collect();
    let got = shares(&after);
    println!(
        "{workers} worker(s): after c, over {}: {got:?}",
        after.len()
    );
    assert_eq!(got[2], 0.0, "c had nothing waiting");
    for share in &got[..2] {
        assert!(
            (share / 0.5 - 1.0).abs() <= 0.10,
            "after c: shares {got:?} against 1:1 over {} dispatches",
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
