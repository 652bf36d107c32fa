//! Fault scenario: Redis flushed under load (`FLUSHALL` on a private
//! `redis-server`, as a restart without persistence or a failover to an empty
//! replica would leave it), with `redis.on_reset = "continue"` and `"pause"`.

use std::time::{Duration, Instant};

use crate::harness::*;
use quota_worker::config::{Dur, OnReset};
use serde_json::json;
use testkit::audit::{depth, noon_zone, publish_all};
use testkit::procs;
use testkit::reliability::{long, record};
use testkit::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_redis_is_noticed_and_continue_or_pause_as_configured() {
    let _heavy = heavy().await;
    let mut runs = Vec::new();
    for on_reset in [OnReset::Continue, OnReset::Pause] {
        runs.push(flush_under_load(on_reset).await);
    }
    record(json!({
        "scenario": "redis_reset",
        "test": "tests/faults/redis_reset.rs: a_flushed_redis_is_noticed_and_continue_or_pause_as_configured",
        "jobs": runs.iter().map(|r| r["jobs"].as_u64().unwrap()).sum::<u64>(),
        "faults": runs.len(),
        "fault": "FLUSHALL of a private redis-server under load, once with redis.on_reset = \"continue\", once with \"pause\"",
        "lost": runs.iter().map(|r| r["lost"].as_u64().unwrap()).sum::<u64>(),
        "duplicates": runs.iter().map(|r| r["duplicates"].as_u64().unwrap()).sum::<u64>(),
        "violations": runs.iter().map(|r| r["violations"].as_u64().unwrap()).sum::<u64>(),
        "recovery_seconds": runs.iter().filter_map(|r| r["noticed_seconds"].as_f64()).fold(0.0, f64::max),
        "runs": runs,
    }));
}

/// One run: a mix at 150/s, `FLUSHALL` once a fifth went out; the worker must
/// notice within 5 s. With `pause`, no job of a policy with rules is dispatched
/// from then on until `admin resume`, while transactional jobs keep going.
async fn flush_under_load(on_reset: OnReset) -> serde_json::Value {
    let n = if long() { 6_000 } else { 1_500 };
    let redis = procs::RedisServer::new(false);
    let ns = unique("reset");
    let mut s = fault_settings(&ns, 150);
    s.redis.url = redis.url();
    s.redis.on_reset = on_reset;
    s.redis.reservation_lease = Dur(Duration::from_secs(120));
    // the held jobs come back 5 s after they were held (a minute by default): the
    // run settles soon after `admin resume`
    s.redis.paused_hold = Dur(Duration::from_secs(5));
    let _c = Cleanup::new(&s);
    declare(&s).await;
    let mix = Mix::new(&ns, n, &noon_zone());
    let conn = amqp().await;
    publish_all(&conn, &s, &mix.jobs).await;
    let dispatch = topology(&s).dispatch_queue("sms");
    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let started = Instant::now();
    while depth(&conn, &dispatch).await.unwrap_or(0) < (n / 5) as u32 {
        assert!(started.elapsed() < Duration::from_secs(60), "no progress");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let mut r = redis.connection();
    let _: () = redis::cmd("FLUSHALL").query(&mut r).unwrap();
    let flushed = Instant::now();
    let mut noticed = None;
    while flushed.elapsed() < Duration::from_secs(10) {
        if w.health.resets.view().resets > 0 {
            noticed = Some(flushed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // decisions taken before the worker knew finish; from here on, dispatches are
    // after it knew
    tokio::time::sleep(Duration::from_millis(500)).await;
    let knew_at = depth(&conn, &dispatch).await.unwrap_or(0) as usize;
    let paused = w.health.resets.paused();
    let mut resumed_after = None;
    let mut during_pause = 0;
    if on_reset == OnReset::Pause {
        // transactional jobs keep going while the capped ones wait
        tokio::time::sleep(Duration::from_secs(5)).await;
        during_pause = depth(&conn, &dispatch).await.unwrap_or(0) as usize - knew_at;
        let out = tokio::task::spawn_blocking({
            let env = testkit::env::env_for(&s);
            move || {
                std::process::Command::new(crate::BIN)
                    .args(["admin", "resume"])
                    .env_clear()
                    .env("PATH", std::env::var("PATH").unwrap_or_default())
                    .envs(env)
                    .output()
                    .unwrap()
            }
        })
        .await
        .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success() && said.starts_with("resumed"),
            "{said} {out:?}"
        );
        let asked = Instant::now();
        while w.health.resets.paused() && asked.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        resumed_after = Some(asked.elapsed());
    }

    let end = finish(&conn, &s, &mix, Duration::from_secs(180), async {
        stop.cancel();
        handle.await.unwrap();
    })
    .await;
    let a = &end.audit;
    // what went out after the worker knew, by kind
    let mut after: std::collections::BTreeMap<String, usize> = Default::default();
    let mut capped_while_paused = 0;
    let pause_end = knew_at + during_pause;
    for (id, positions) in &a.dispatched {
        let Some(kind) = mix.kinds.get(id) else {
            continue;
        };
        let first = positions[0];
        if first >= knew_at {
            *after.entry(format!("{kind:?}")).or_default() += 1;
            if first < pause_end && !matches!(kind, Kind::Free) {
                capped_while_paused += 1;
            }
        }
    }
    let figures = json!({
        "on_reset": format!("{on_reset:?}").to_lowercase(),
        "jobs": n,
        "noticed_seconds": noticed.map(|d| d.as_secs_f64()),
        "paused": paused,
        "dispatched_before_known": knew_at,
        "dispatched_while_paused": during_pause,
        "capped_dispatched_while_paused": capped_while_paused,
        "resumed_seconds_after_admin_resume": resumed_after.map(|d| d.as_secs_f64()),
        "dispatched_after_known_by_kind": after,
        "lost": end.lost.len(),
        "duplicates": a.duplicate_dispatches(),
        "violations": end.violations.len(),
        "dead_lettered_not_malformed": end.wrong_dead.len(),
        "settled": end.settled,
    });
    eprintln!("redis_reset {on_reset:?}: {figures}");
    assert!(end.settled, "did not settle: {}", a.summary(&mix.jobs));
    assert!(end.lost.is_empty(), "lost: {:?}", end.lost);
    assert!(
        end.wrong_dead.is_empty(),
        "dead-lettered: {:?}",
        end.wrong_dead
    );
    let noticed = noticed.expect("the flush was never noticed");
    assert!(
        noticed < Duration::from_secs(5),
        "noticed after {noticed:?}"
    );
    assert_eq!(w.health.resets.view().resets, 1, "one flush, one reset");
    match on_reset {
        OnReset::Continue => {
            assert!(!paused);
            assert!(
                after.get("Rolling").copied().unwrap_or(0) > 0,
                "capped jobs went on: {after:?}"
            );
        }
        OnReset::Pause => {
            assert!(paused, "not paused after the flush");
            assert_eq!(
                capped_while_paused, 0,
                "jobs of policies with rules dispatched while paused"
            );
            assert!(during_pause > 0, "transactional jobs held by the pause");
            assert!(resumed_after.unwrap() < Duration::from_secs(3));
        }
    }
    figures
}
