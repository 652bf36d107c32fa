//! One call of `src/admission/lua/` as a command: the header of fixed positions, the plans
//! once, two arguments per job, the undeclared keys, then each optional section
//! where the header says it starts (see `src/admission/lua/protocol.lua`). Pure: builds the
//! command, sends nothing.

use std::collections::HashMap;
use std::sync::Arc;

use crate::quota::plan::Plan;

/// One job's admission, as the script takes it.
#[derive(Debug, Clone)]
pub(crate) struct AdmitArgs {
    /// The recipient's sorted set.
    pub key: String,
    /// The job id's hash.
    pub member: Vec<u8>,
    /// Calendar bounds for the day Redis is believed to be in (shared by the jobs
    /// of one policy and zone on one day).
    pub plan: Arc<Plan>,
    /// The job's channel, given only while some recipient may be suppressed (the
    /// call then carries the suppression section).
    pub channel: Option<String>,
    /// Preferences section: category ("": required), channel, priority, quiet (v, ms).
    pub prefs: Option<([String; 3], i64, i64)>,
    /// The caps the job meets, in order (empty for most jobs: then the call carries
    /// nothing more for it).
    pub layers: Vec<LayerArgs>,
    /// The limits the job meets, in order (empty for most jobs).
    pub limits: Vec<LimitArgs>,
}

/// One limit a job meets, as the script takes it.
#[derive(Debug, Clone)]
pub struct LimitArgs {
    /// The limit's bucket.
    pub key: String,
    /// µs per unit of cost.
    pub interval_us: u64,
    /// Units of cost a full bucket holds.
    pub burst: u64,
    /// The job's cost (a quota's counter: its period's end, ms).
    pub cost: u64,
}

/// One cap a job meets, as the script takes it.
#[derive(Debug, Clone)]
pub struct LayerArgs {
    /// The cap's sorted set for the job's recipient (in the slot of the job's key).
    pub key: String,
    /// The cap's calendar bounds.
    pub plan: Arc<Plan>,
    /// Whether the cap may refuse the job (else it only counts it).
    pub holds: bool,
}

/// The header's positions (`ARG` in `src/admission/lua/protocol.lua`): the arguments
/// before the first plan.
const HEADER: usize = 8;

/// What one call sends besides its jobs.
pub(crate) struct Call<'a> {
    /// The script's SHA.
    pub sha: &'a str,
    pub lease_ms: i64,
    pub dedupe_ms: i64,
    /// The key prefix's length (the suppression and preferences sections' L).
    pub prefix_len: usize,
}

/// Where each optional section starts (1-based, as the script counts ARGV; 0: not
/// carried), and how many arguments the call has.
#[derive(Debug, PartialEq, Eq)]
struct Layout {
    layers: usize,
    suppression: usize,
    preferences: usize,
    limits: usize,
    len: usize,
}

impl Layout {
    fn of(
        jobs: &[&AdmitArgs],
        declared: usize,
        plans: &[&Arc<Plan>],
        buckets: &Buckets<'_>,
    ) -> Layout {
        let plan_args: usize = plans.iter().map(|p| 5 + 2 * p.rules.len()).sum();
        let mut next = HEADER + plan_args + 2 * jobs.len() + (jobs.len() - declared) + 1;
        let mut place = |carried: bool, len: usize| match carried {
            true => {
                let at = next;
                next += len;
                at
            }
            false => 0,
        };
        let layered = jobs.iter().filter(|j| !j.layers.is_empty());
        let layer_args: usize = layered.clone().map(|j| 2 + 3 * j.layers.len()).sum();
        let layers = place(layered.count() > 0, 1 + layer_args);
        let suppression = place(
            jobs.iter().any(|j| j.channel.is_some()),
            1 + plans.len() + jobs.len(),
        );
        let preferences = place(jobs.iter().any(|j| j.prefs.is_some()), 1 + 5 * jobs.len());
        let limited = jobs.iter().filter(|j| !j.limits.is_empty());
        let limit_args: usize = limited.clone().map(|j| 2 + 2 * j.limits.len()).sum();
        let bucket_args = 1 + 3 * buckets.distinct.len();
        let limits = place(limited.count() > 0, bucket_args + 1 + limit_args);
        Layout {
            layers,
            suppression,
            preferences,
            limits,
            len: next - 1,
        }
    }
}

/// `plan`'s number among the distinct `plans` of a call (1-based), adding it when
/// it is new.
fn plan_number<'a>(plans: &mut Vec<&'a Arc<Plan>>, plan: &'a Arc<Plan>) -> usize {
    let same = |a: &Arc<Plan>| Arc::ptr_eq(a, plan) || **a == **plan;
    match plans.iter().position(|p| same(p)) {
        Some(i) => i + 1,
        None => {
            plans.push(plan);
            plans.len()
        }
    }
}

/// The distinct buckets of a call's limits (a bucket: its key, interval and
/// burst), and each job's limits as numbers among them (1-based), in order.
#[derive(Default)]
struct Buckets<'a> {
    distinct: Vec<&'a LimitArgs>,
    numbers: Vec<Vec<usize>>,
}

impl<'a> Buckets<'a> {
    /// Numbers the buckets of `jobs`' limits: most jobs of a call share their
    /// buckets (one for all, one per tenant), sent once.
    fn of(jobs: &[&'a AdmitArgs]) -> Buckets<'a> {
        if jobs.iter().all(|j| j.limits.is_empty()) {
            return Buckets::default();
        }
        let mut seen: HashMap<(&str, u64, u64), usize> = HashMap::new();
        let mut distinct = Vec::new();
        let numbers = jobs
            .iter()
            .map(|job| {
                let limits = job.limits.iter();
                let number = |l: &'a LimitArgs| {
                    *seen
                        .entry((l.key.as_str(), l.interval_us, l.burst))
                        .or_insert_with(|| {
                            distinct.push(l);
                            distinct.len()
                        })
                };
                limits.map(number).collect()
            })
            .collect();
        Buckets { distinct, numbers }
    }
}

/// The `EVALSHA` of one call for `jobs`, declaring the keys of the first
/// `declared` and carrying the others' as arguments. The command is built directly
/// (no per-argument buffers).
pub(crate) fn command(call: &Call<'_>, jobs: &[&AdmitArgs], declared: usize) -> redis::Cmd {
    let mut plans: Vec<&Arc<Plan>> = Vec::with_capacity(2);
    let numbers: Vec<usize> = jobs
        .iter()
        .map(|job| plan_number(&mut plans, &job.plan))
        .collect();
    let layer_numbers: Vec<Vec<usize>> = jobs
        .iter()
        .map(|job| {
            let layers = job.layers.iter();
            layers.map(|l| plan_number(&mut plans, &l.plan)).collect()
        })
        .collect();
    let buckets = Buckets::of(jobs);
    let layout = Layout::of(jobs, declared, &plans, &buckets);
    // room for every argument, and about 80 bytes of them per job (key, member)
    let mut cmd = redis::Cmd::with_capacity(3 + declared + layout.len, 64 + 80 * jobs.len());
    cmd.arg("EVALSHA").arg(call.sha).arg(declared);
    for job in &jobs[..declared] {
        cmd.arg(&job.key);
    }
    cmd.arg(call.lease_ms)
        .arg(call.dedupe_ms)
        .arg(jobs.len() - declared)
        .arg(plans.len())
        .arg(layout.layers)
        .arg(layout.suppression)
        .arg(layout.preferences)
        .arg(layout.limits);
    for p in &plans {
        plan_args(&mut cmd, p);
    }
    for (job, number) in jobs.iter().zip(numbers) {
        cmd.arg(&job.member[..]).arg(number);
    }
    for job in &jobs[declared..] {
        cmd.arg(&job.key);
    }
    if layout.layers > 0 {
        layers_section(&mut cmd, jobs, &layer_numbers);
    }
    if layout.suppression > 0 {
        cmd.arg(call.prefix_len);
        for p in &plans {
            cmd.arg(p.suppressed_by);
        }
        for job in jobs {
            cmd.arg(job.channel.as_deref().unwrap_or(""));
        }
    }
    if layout.preferences > 0 {
        cmd.arg(call.prefix_len);
        let none = Default::default();
        for job in jobs {
            let (words, version, until) = job.prefs.as_ref().unwrap_or(&none);
            cmd.arg(&words[..]).arg(version).arg(until);
        }
    }
    if layout.limits > 0 {
        limits_section(&mut cmd, jobs, &buckets);
    }
    cmd
}

/// The limits section: the distinct buckets, then the jobs that meet limits,
/// each with its limits (a bucket's number and the job's cost).
fn limits_section(cmd: &mut redis::Cmd, jobs: &[&AdmitArgs], buckets: &Buckets<'_>) {
    cmd.arg(buckets.distinct.len());
    for l in &buckets.distinct {
        cmd.arg(&l.key).arg(l.interval_us).arg(l.burst);
    }
    cmd.arg(jobs.iter().filter(|j| !j.limits.is_empty()).count());
    for (k, (job, numbers)) in jobs.iter().zip(&buckets.numbers).enumerate() {
        if job.limits.is_empty() {
            continue;
        }
        cmd.arg(k + 1).arg(job.limits.len());
        for (l, number) in job.limits.iter().zip(numbers) {
            cmd.arg(*number).arg(l.cost);
        }
    }
}

/// One plan: its day's bounds, calendar expiry, shadow mode and rules.
fn plan_args(cmd: &mut redis::Cmd, p: &Plan) {
    cmd.arg(p.valid_from_ms)
        .arg(p.valid_until_ms)
        .arg(p.calendar_expiry_ms)
        .arg(u8::from(p.shadow))
        .arg(p.rules.len());
    for (limit, bound) in &p.rules {
        cmd.arg(*limit).arg(*bound);
    }
}

/// The layers section: the jobs that meet caps, each with its caps.
fn layers_section(cmd: &mut redis::Cmd, jobs: &[&AdmitArgs], numbers: &[Vec<usize>]) {
    cmd.arg(jobs.iter().filter(|j| !j.layers.is_empty()).count());
    for (k, (job, numbers)) in jobs.iter().zip(numbers).enumerate() {
        if job.layers.is_empty() {
            continue;
        }
        cmd.arg(k + 1).arg(job.layers.len());
        for (layer, number) in job.layers.iter().zip(numbers) {
            cmd.arg(&layer.key).arg(*number).arg(u8::from(layer.holds));
        }
    }
}

#[cfg(test)]
mod tests;
