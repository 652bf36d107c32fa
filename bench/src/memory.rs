//! The memory step (`--steps memory`): Redis `used_memory` growth per recipient
//! holding three sends, and `MEMORY USAGE` of one such key, through the engine.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use quota_worker::config::Settings;
use quota_worker::store::QuotaStore;

use crate::context::{header, Bench};
use crate::engine::{on_many_tasks, sms_request, with_default_rule};
use crate::report::Report;
use crate::teardown::delete_keys;

/// Runs the step into `report`; deletes its keys.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let recipients = b.args.recipients();
    header(
        "memory",
        format!("{recipients} recipients with three sends each"),
    );
    // the default key prefix's length, so MEMORY USAGE is what a user sees
    let s = b.settings_in("qb");
    let (per, one) = memory(&s, recipients).await?;
    report.memory_recipients = recipients;
    report.memory_bytes_per_recipient = per;
    report.memory_usage_one_recipient = one;
    delete_keys(&s.redis.url, &s.redis.key_prefix)
}

/// Redis memory per recipient holding three sends, at scale.
async fn memory(s: &Settings, n: usize) -> Result<(f64, i64)> {
    let s = with_default_rule(s, 3, "7d");
    let engine = Arc::new(QuotaStore::connect(&s).await?);
    let client = redis::Client::open(s.redis.url.as_str())?;
    let mut c = client.get_connection()?;
    let used = |c: &mut redis::Connection| -> Result<i64> {
        let info: String = redis::cmd("INFO").arg("memory").query(c)?;
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .context("used_memory")
    };
    // keys deleted by earlier steps are freed in the background: wait for that, or
    // their memory would be counted against this step
    for _ in 0..300 {
        let info: String = redis::cmd("INFO").arg("memory").query(&mut c)?;
        if info
            .lines()
            .any(|l| l.trim() == "lazyfree_pending_objects:0")
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // and for the keyspace's tables to shrink after those deletes (Redis resizes them
    // in its cron): until used_memory holds still for half a second
    let mut before = used(&mut c)?;
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(500));
        let now = used(&mut c)?;
        let settled = (now - before).abs() < 64 * 1024;
        before = now;
        if settled {
            break;
        }
    }
    let shared = engine.clone();
    on_many_tasks(n * 3, move |i| {
        let engine = shared.clone();
        async move {
            let (id, who) = (
                uuid::Uuid::now_v7().to_string(),
                format!("user{}@example.com", i % n),
            );
            let req = sms_request(&id, &who);
            if let quota_worker::admission::Admission::Admitted(t) =
                engine.admit(&req).await.expect("admit")
            {
                engine.commit(&t).await.expect("commit");
            }
        }
    })
    .await?;
    let after = used(&mut c)?;
    let key = engine
        .keys()
        .recipient("user0@example.com", "default", None);
    let one: i64 = redis::cmd("MEMORY").arg("USAGE").arg(&key).query(&mut c)?;
    Ok(((after - before) as f64 / n as f64, one))
}
