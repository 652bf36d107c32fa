//! The campaign step (`--steps campaign`): what an urgent job meets behind a
//! campaign published by a producer that knows no lanes. `--jobs` bulk jobs
//! (default 100,000; 10,000 with `--quick`) of a channel paced at
//! `--campaign-rate` (default 100/s), of a policy whose lane is `bulk` and without
//! a `priority` field, published into the jobs exchange as any AMQP client
//! publishes, never to a lane. With `--campaign-tenants N` the jobs (bulk and
//! urgent) belong to N tenants round-robin, so the backlog is parked in N tenant
//! queues of the bulk lane and shared among them; without, they carry no `tenant`
//! (the lane's own queue, as the step ran before fair shares).
//!
//! Each of `--rounds` rounds measures its pass-through ceiling first (as every other
//! step), then runs four passes, each on a fresh namespace:
//! - **campaign**, one worker process and three: the bulk jobs published at a quarter
//!   of the ceiling while the workers run, and an urgent job (category
//!   `transactional`, no `priority`, stamped when published) every 0.3 s from the
//!   first publish until 10 s after every bulk job is parked (so the last ones
//!   wait behind the whole backlog parked): each urgent job's time from its
//!   publish to its arrival in the dispatch queue (read by the benchmark without
//!   acks), and the parking rate (the jobs over the time from the first publish to
//!   the last parked, which the publish rate bounds) and how long after the last
//!   publish the last was parked;
//! - **backlog**, one worker process and three: the same jobs published before the
//!   workers start, parked as fast as they can: the middle 80 % of them over the time
//!   they took, against the ceiling.
//!
//! "Parked" is read from the workers' `quota_worker_lane_jobs_total` (lane `bulk`,
//! step `parked`) every 50 ms, interpolated between samples, plus the bulk jobs the
//! dispatch queue shows dispatched without having been parked (the rate had a slot
//! at once). Every round is reported, then the medians over the rounds
//! ([`summarise`]).

use anyhow::Result;

use crate::ceiling::ceiling;
use crate::context::{header, Bench};
use crate::report::{median, CampaignRun, CampaignSummary, Report};

mod pass;
mod watch;

use pass::Plan;

/// Runs the step into `report`.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let jobs = b
        .args
        .jobs
        .unwrap_or(if b.args.quick { 10_000 } else { 100_000 });
    let rate = b.args.campaign_rate.max(1);
    for round in 1..=b.rounds {
        let c = b.settings(&format!("cpc{round}"));
        let (ceiling_rate, _) = ceiling(&c, "a-allowed", b.jobs.min(50_000)).await?;
        b.teardown.ceiling(&c).await;
        header(
            "campaign",
            format!("round {round}: ceiling {ceiling_rate:.0} msgs/s"),
        );
        let plan = |workers| Plan {
            round,
            workers,
            jobs,
            tenants: b.args.campaign_tenants,
            rate,
            ceiling: ceiling_rate,
        };
        for workers in [1, 3] {
            let run = pass::campaign(b, plan(workers), ceiling_rate / 4.0).await?;
            print_run(&run);
            report.campaign.push(run);
        }
        for workers in [1, 3] {
            let run = pass::backlog(b, plan(workers)).await?;
            print_run(&run);
            report.campaign.push(run);
        }
    }
    report.campaign_summary = summarise(&report.campaign);
    Ok(())
}

/// What a pass measured, on stderr.
fn print_run(r: &CampaignRun) {
    let urgent = r.urgent.as_ref().map_or(String::new(), |u| {
        format!(
            "; urgent p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} of {} dispatched)",
            u.p50_ms, u.p99_ms, u.max_ms, u.arrived, u.sent
        )
    });
    let behind = r.urgent_behind_parked.as_ref().map_or(String::new(), |u| {
        format!(
            "; behind the parked backlog max {:.0} ms ({} jobs)",
            u.max_ms, u.arrived
        )
    });
    eprintln!(
        "      {} tenant(s): parked at {:.0}/s, {:.2} of the ceiling{}{urgent}{behind}",
        r.tenants,
        r.parking_per_sec,
        r.parking_ratio,
        r.lag_secs.map_or(String::new(), |l| format!(
            ", the last {l:.2} s after the last publish"
        )),
    );
}

/// The medians over the rounds of each kind of pass (by pass and workers, in the
/// order they first ran).
pub(crate) fn summarise(runs: &[CampaignRun]) -> Vec<CampaignSummary> {
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for r in runs {
        if !kinds.iter().any(|k| k.0 == r.pass && k.1 == r.workers) {
            kinds.push((r.pass.clone(), r.workers));
        }
    }
    kinds
        .into_iter()
        .map(|(pass, workers)| {
            let of: Vec<&CampaignRun> = runs
                .iter()
                .filter(|r| r.pass == pass && r.workers == workers)
                .collect();
            let urgent: Vec<_> = of.iter().filter_map(|r| r.urgent.as_ref()).collect();
            let quantile = |f: fn(&crate::report::EndToEnd) -> f64| {
                (!urgent.is_empty()).then(|| median(urgent.iter().map(|u| f(u)).collect()))
            };
            CampaignSummary {
                rounds: of.len(),
                parking_ratio_median: median(of.iter().map(|r| r.parking_ratio).collect()),
                parking_per_sec_median: median(of.iter().map(|r| r.parking_per_sec).collect()),
                urgent_p50_ms_median: quantile(|u| u.p50_ms),
                urgent_p99_ms_median: quantile(|u| u.p99_ms),
                urgent_max_ms_median: quantile(|u| u.max_ms),
                urgent_max_ms: urgent.iter().map(|u| u.max_ms).reduce(f64::max),
                urgent_sent: urgent.iter().map(|u| u.sent).sum(),
                urgent_arrived: urgent.iter().map(|u| u.arrived).sum(),
                pass,
                workers,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::EndToEnd;

    #[test]
    fn the_summary_takes_the_medians_of_each_kind_of_pass() {
        let run = |pass: &str, workers, ratio, max_ms| CampaignRun {
            pass: pass.into(),
            workers,
            parking_ratio: ratio,
            urgent: (pass == "campaign").then(|| EndToEnd {
                sent: 10,
                arrived: 10,
                p50_ms: max_ms / 4.0,
                p99_ms: max_ms,
                max_ms,
                ..Default::default()
            }),
            ..Default::default()
        };
        let runs = [
            run("campaign", 1, 0.2, 100.0),
            run("campaign", 3, 0.25, 400.0),
            run("backlog", 1, 1.2, 0.0),
            run("campaign", 1, 0.24, 900.0),
            run("campaign", 1, 0.22, 300.0),
        ];
        let s = summarise(&runs);
        let kinds: Vec<_> = s
            .iter()
            .map(|k| (k.pass.as_str(), k.workers, k.rounds))
            .collect();
        assert_eq!(
            kinds,
            [("campaign", 1, 3), ("campaign", 3, 1), ("backlog", 1, 1)]
        );
        assert_eq!(s[0].parking_ratio_median, 0.22);
        assert_eq!(s[0].urgent_max_ms_median, Some(300.0));
        assert_eq!(s[0].urgent_max_ms, Some(900.0));
        assert_eq!(s[0].urgent_sent, 30);
        assert_eq!(s[2].urgent_max_ms, None);
    }
}
