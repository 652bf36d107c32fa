//! Jobs routed push → email → sms against mix (a). Each round drains mix (a)
//! (`a-allowed`: distinct recipients on `sms`, the `default` policy, no route) and
//! the routed jobs ([`crate::jobs::routed_job`]: the same recipients, zone and
//! payload, on `push` with `"fallback": ["email", "sms"]`), which first alternating,
//! each by a worker of its own on a namespace of its own. The routed drain's worker
//! has a cap of one push a day (`[caps.push_daily]`, `channels = ["push"]`: push's
//! own), filled for every other recipient by a warm-up drain of one push each
//! ([`crate::jobs::warm_job`], of a policy without rules, so that it counts toward
//! the cap alone) before the measured drain starts: half of the routed jobs go out
//! on push, half find push capped and go out on email in the same handling. Every
//! routed step with a channel after it is kept in Redis before it goes (the
//! default `on` has `failed`), as in any deployment that routes.

use anyhow::{bail, Result};
use lapin::Connection;
use quota_worker::amqp::Topology;

use super::ConfigFile;
use crate::broker::{closed, connect};
use crate::context::Bench;
use crate::lanes::ready;
use crate::mixes::drain;
use crate::report::{median, Drained, FallbackReport, FallbackRound};

/// The routed drain's worker configuration: push's own cap, and the warm-up's
/// policy.
const CONFIG: &str = "[caps.push_daily]\nrules = [{ limit = 1, window = \"1d\" }]\nmatch = { channels = [\"push\"] }\n\n[policies.warm]\nrules = []\n";

/// Runs `b.rounds` rounds of `jobs` jobs each; the medians.
pub async fn rounds(b: &Bench, jobs: usize) -> Result<FallbackReport> {
    let mut done = Vec::new();
    for round in 0..b.rounds {
        let r = round_of(b, jobs, round).await?;
        eprintln!(
            "      round {}: routed {:.0} jobs/s, mix (a) {:.0} jobs/s ({:.3} of it); routed: {} on push, {} on email, {} on sms; worker CPU a job {:.1} µs routed, {:.1} µs (a)",
            round + 1,
            r.routed.jobs_per_sec,
            r.mix_a.jobs_per_sec,
            r.ratio,
            r.push,
            r.email,
            r.sms,
            r.routed.cpu_us_per_job[2],
            r.mix_a.cpu_us_per_job[2],
        );
        done.push(r);
    }
    let of = |f: fn(&FallbackRound) -> f64| median(done.iter().map(f).collect());
    Ok(FallbackReport {
        jobs,
        routed_jobs_per_sec: of(|r| r.routed.jobs_per_sec),
        mix_a_jobs_per_sec: of(|r| r.mix_a.jobs_per_sec),
        ratio_to_mix_a: of(|r| r.ratio),
        rounds: done,
        ..Default::default()
    })
}

/// One round: mix (a) and the routed drain, the routed one first in odd rounds.
async fn round_of(b: &Bench, jobs: usize, round: usize) -> Result<FallbackRound> {
    let conn = connect(&b.args.amqp).await?;
    let routed_first = round % 2 == 1;
    let (mut mix_a, mut routed) = (None, None);
    for routed_turn in [routed_first, !routed_first] {
        if routed_turn {
            routed = Some(routed_drain(b, &conn, jobs, round).await?);
        } else {
            let s = b.settings(&format!("fa{round}"));
            let m = drain(&conn, &s, &b.worker, "a-allowed", jobs, &[], None).await;
            b.teardown.namespace(&s).await;
            mix_a = Some(Drained::from(&m?));
        }
    }
    let _ = closed(conn.close(200, "bye".into())).await;
    let (Some(mix_a), Some((routed, [push, email, sms]))) = (mix_a, routed) else {
        unreachable!("both drains ran");
    };
    Ok(FallbackRound {
        routed_first,
        ratio: routed.jobs_per_sec / mix_a.jobs_per_sec,
        mix_a,
        routed,
        push,
        email,
        sms,
    })
}

/// The warm-up (one push for every other recipient), then the measured drain of
/// `jobs` routed jobs; its figures and its dispatches on push (less the warm-up's),
/// email and sms.
async fn routed_drain(
    b: &Bench,
    conn: &Connection,
    jobs: usize,
    round: usize,
) -> Result<(Drained, [u64; 3])> {
    let s = b.settings(&format!("ff{round}"));
    let config = ConfigFile::write(&s, CONFIG)?;
    let result = async {
        let warm = jobs / 2;
        let w = drain(
            conn,
            &s,
            &b.worker,
            "f-warm",
            warm,
            &[],
            Some(config.path()),
        )
        .await?;
        if w.outcomes.get("dispatched") != Some(&(warm as u64)) {
            bail!("the warm-up did not dispatch every job: {:?}", w.outcomes);
        }
        let m = drain(
            conn,
            &s,
            &b.worker,
            "f-routed",
            jobs,
            &[],
            Some(config.path()),
        )
        .await?;
        let topology = Topology::from_settings(&s);
        let mut sent = [0u64; 3];
        for (n, channel) in sent.iter_mut().zip(["push", "email", "sms"]) {
            *n = ready(conn, &topology.dispatch_queue(channel)).await? as u64;
        }
        sent[0] = sent[0].saturating_sub(warm as u64);
        Ok((Drained::from(&m), sent))
    }
    .await;
    b.teardown.namespace(&s).await;
    result
}
