//! The rate step (`--steps rate`): one channel's rate key, one call per decision
//! (`redis-benchmark` running `lua/rate.lua`) against the engine's batched takes.

use std::sync::Arc;

use anyhow::Result;
use quota_worker::config::Settings;
use quota_worker::store::QuotaStore;

use crate::context::{header, Bench};
use crate::engine::{evalsha_per_sec, timed_on_many_tasks};
use crate::report::Report;
use crate::teardown::delete_keys;

/// Runs the step into `report`; deletes its keys.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    header("rate", "decisions per second on one channel's rate key");
    let s = b.settings("r");
    let (one, batched, calls) = rate_key(&s, b.jobs.min(100_000)).await?;
    report.rate_key_evalsha_per_sec = Some(one);
    report.rate_key_engine_per_sec = Some(batched);
    report.rate_key_engine_calls_per_take = Some(calls);
    eprintln!(
        "      rate key: {one:.0} decisions/s one per call (redis-benchmark EVALSHA), {batched:.0}/s through the engine's batched takes ({calls:.3} calls each)"
    );
    delete_keys(&s.redis.url, &s.redis.key_prefix)
}

/// One channel's rate key: decisions per second when each is a call of its own
/// (`redis-benchmark -c 50` running `lua/rate.lua` by EVALSHA on one key), and
/// through the engine's batched takes with 256 jobs asking at once; and the
/// engine's calls per decision. The rate is set far above both, so every take is
/// granted and only the key's own speed counts.
async fn rate_key(s: &Settings, n: usize) -> Result<(f64, f64, f64)> {
    let key = format!("{}:rate:bench", s.redis.key_prefix);
    let one_per_call = evalsha_per_sec(
        s,
        n,
        quota_worker::redis::scripts::RATE_LUA,
        &[&key, "1", "1000000000", "1", "1"],
    )?;
    let engine = Arc::new(QuotaStore::connect(s).await?);
    let rate = quota_worker::quota::policy::Rate {
        interval_us: 1,
        burst: 1_000_000_000,
        cost: 1,
    };
    let (per_sec, calls) = timed_on_many_tasks(&engine, n, move |engine, _| async move {
        let reply = engine.take_rate("sms", rate).await.expect("take");
        assert_eq!(reply.allowed, 1, "the rate is far above the load");
    })
    .await?;
    Ok((one_per_call, per_sec, calls))
}
