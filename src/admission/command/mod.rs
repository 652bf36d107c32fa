//! One call of `src/admission/lua/` as a command: the header of fixed positions, the plans
//! once, two arguments per job, the undeclared keys, then each optional section
//! where the header says it starts (see `src/admission/lua/protocol.lua`). Pure: builds the
//! command, sends nothing.

use std::fmt::Write as _;
use std::sync::Arc;

use foldhash::HashMap as FastMap;

use super::protocol::Verdict;
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
    /// The preferences section's arguments for the job, given only while some
    /// recipient may have a set.
    pub prefs: Option<PrefsArgs>,
    /// The caps the job meets, in order (empty for most jobs: then the call carries
    /// nothing more for it).
    pub layers: Vec<LayerArgs>,
    /// The limits the job meets, in order (empty for most jobs).
    pub limits: Vec<LimitArgs>,
}

/// A job's arguments of the preferences section, as the script takes them.
#[derive(Debug, Clone, Default)]
pub(crate) struct PrefsArgs {
    /// Its category ("": its policy is required), channel and priority.
    pub words: [String; 3],
    /// The version of the recipient's quiet hours this worker knows (0: none).
    pub version: i64,
    /// Where those quiet hours end, as this worker knows them (ms).
    pub until: i64,
}

/// One limit a job meets, as the script takes it.
#[derive(Debug, Clone)]
pub struct LimitArgs {
    /// The limit's bucket (shared: the jobs of a tenant or sender name one key).
    pub key: Arc<str>,
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
        let limited = jobs.iter().any(|j| !j.limits.is_empty());
        let limits = place(limited, buckets.args() + 2);
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

/// The distinct buckets of a call's limits, grouped by what the script needs of
/// their limit (a group: interval, burst and, for a counter, its period's end),
/// and each job's limits as numbers among them (from 0, in group order), in order.
#[derive(Default)]
struct Buckets<'a> {
    /// Each group's buckets (the first names the group's limit).
    groups: Vec<Vec<&'a LimitArgs>>,
    /// Every job's limits' numbers, one job after the other ([`per_job`]).
    numbers: Vec<usize>,
}

impl<'a> Buckets<'a> {
    /// Numbers the buckets of `jobs`' limits: most jobs of a call share their
    /// buckets (one for all, one per tenant), sent once, and the buckets of one
    /// limit share its interval, burst and end, sent once.
    fn of(jobs: &[&'a AdmitArgs]) -> Buckets<'a> {
        if jobs.iter().all(|j| j.limits.is_empty()) {
            return Buckets::default();
        }
        // the same key is mostly the same `Arc` (made once, `BucketKeys::get`):
        // known by its address (one key under two addresses is sent twice, and the
        // script shares its state by key all the same)
        let mut group_of: FastMap<(u64, u64, u64), usize> = FastMap::default();
        let mut key_of: Vec<FastMap<usize, usize>> = Vec::new();
        let mut groups: Vec<Vec<&'a LimitArgs>> = Vec::new();
        // (group, bucket in it) of each job's limits, numbered once all are seen
        let mut places: Vec<(usize, usize)> = Vec::with_capacity(3 * jobs.len());
        for l in jobs.iter().flat_map(|job| &job.limits) {
            let g = *group_of
                .entry((l.interval_us, l.burst, expires(l)))
                .or_insert_with(|| {
                    groups.push(Vec::new());
                    key_of.push(FastMap::default());
                    groups.len() - 1
                });
            let b = *key_of[g].entry(l.key.as_ptr() as usize).or_insert_with(|| {
                groups[g].push(l);
                groups[g].len() - 1
            });
            places.push((g, b));
        }
        let mut first = Vec::with_capacity(groups.len());
        let mut next = 0;
        for buckets in &groups {
            first.push(next);
            next += buckets.len();
        }
        let numbers = places.into_iter().map(|(g, b)| first[g] + b).collect();
        Buckets { groups, numbers }
    }

    /// The buckets, by number.
    fn distinct(&self) -> impl Iterator<Item = &'a LimitArgs> + '_ {
        self.groups.iter().flatten().copied()
    }

    /// How many arguments the section's groups and buckets take.
    fn args(&self) -> usize {
        1 + self.groups.iter().map(|b| 4 + 2 * b.len()).sum::<usize>()
    }

    /// What the jobs would take from each bucket, by number: the sum of their
    /// costs (a counter: their number).
    fn totals(&self, jobs: &[&AdmitArgs]) -> Vec<u64> {
        let counter: Vec<bool> = self.distinct().map(|l| l.interval_us == 0).collect();
        let mut totals = vec![0; counter.len()];
        for (job, numbers) in per_job(jobs, &self.numbers) {
            let cost = job_cost(&job.limits);
            for &n in numbers {
                totals[n] += if counter[n] { 1 } else { cost };
            }
        }
        totals
    }

    /// The numbering kept for the reply: each bucket's key as the first number
    /// that has it.
    fn numbering(self) -> Numbering {
        let mut first: FastMap<&str, usize> = FastMap::default();
        let key_of = self
            .distinct()
            .enumerate()
            .map(|(n, l)| *first.entry(&*l.key).or_insert(n))
            .collect();
        let interval = self
            .distinct()
            .map(|l| i64::try_from(l.interval_us).unwrap_or(i64::MAX))
            .collect();
        Numbering {
            numbers: self.numbers,
            key_of,
            interval,
        }
    }
}

/// Each job of `jobs` with its limits' numbers: the next `limits.len()` of the
/// flat `numbers`.
fn per_job<'j, 'n>(
    jobs: &'j [&'j AdmitArgs],
    numbers: &'n [usize],
) -> impl Iterator<Item = (&'j AdmitArgs, &'n [usize])> {
    let mut rest = numbers;
    jobs.iter().map(move |job| {
        let (own, after) = rest.split_at(job.limits.len().min(rest.len()));
        rest = after;
        (*job, own)
    })
}

/// A call's limits as numbered, kept from [`command`] to work out the TAT each
/// take left from the reply's tail ([`Numbering::replay`]).
#[derive(Debug, Default)]
pub(crate) struct Numbering {
    /// Every job's buckets' numbers (from 0), in its limits' order, one job
    /// after the other.
    numbers: Vec<usize>,
    /// Each bucket's key, as the first bucket number with that key.
    key_of: Vec<usize>,
    /// Each bucket's interval as sent (0: a counter).
    interval: Vec<i64>,
}

impl Numbering {
    /// Fills the takes of every job of `verdicts` that took (admitted or
    /// shadowed, meeting limits): the TAT (µs) or count each of its takes left,
    /// in its limits' order. The script's `tail` holds each bucket's base, then
    /// the buckets whose interval in force is not the one sent (a throttled
    /// bucket's, stretched): their count, then (number from 1, interval) pairs.
    /// A take leaves the base plus what the takes of the bucket's key added up to
    /// it, its own included. `None` if the tail does not read so (a call without
    /// limits has none).
    pub(crate) fn replay(
        &self,
        jobs: &[&AdmitArgs],
        verdicts: &mut [Verdict],
        tail: &[i64],
    ) -> Option<()> {
        if self.key_of.is_empty() {
            return tail.is_empty().then_some(());
        }
        let (bases, rest) = tail.split_at_checked(self.key_of.len())?;
        let (&stretched, pairs) = rest.split_first()?;
        if pairs.len() != 2 * usize::try_from(stretched).ok()? {
            return None;
        }
        let mut interval = self.interval.clone();
        for pair in pairs.chunks_exact(2) {
            let n = usize::try_from(pair[0]).ok()?.checked_sub(1)?;
            *interval.get_mut(n)? = pair[1];
        }
        let mut added = vec![0i64; self.key_of.len()];
        for ((job, numbers), v) in per_job(jobs, &self.numbers).zip(verdicts) {
            let (Verdict::Admitted(.., taken) | Verdict::Shadowed(.., taken)) = v else {
                continue;
            };
            let cost = i64::try_from(job_cost(&job.limits)).ok()?;
            *taken = numbers
                .iter()
                .map(|&n| {
                    let key = self.key_of[n];
                    added[key] += if interval[n] == 0 {
                        1
                    } else {
                        interval[n] * cost
                    };
                    bases[n] + added[key]
                })
                .collect();
        }
        Some(())
    }
}

/// The `EVALSHA` of one call for `jobs`, declaring the keys of the first
/// `declared` and carrying the others' as arguments. The command is built directly
/// (no per-argument buffers).
pub(crate) fn command(
    call: &Call<'_>,
    jobs: &[&AdmitArgs],
    declared: usize,
) -> (redis::Cmd, Numbering) {
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
            let PrefsArgs {
                words,
                version,
                until,
            } = job.prefs.as_ref().unwrap_or(&none);
            cmd.arg(&words[..]).arg(version).arg(until);
        }
    }
    if layout.limits > 0 {
        limits_section(&mut cmd, jobs, &buckets);
    }
    (cmd, buckets.numbering())
}

/// A counter's period's end (ms; its [`LimitArgs::cost`]), 0 for a bucket.
fn expires(l: &LimitArgs) -> u64 {
    match l.interval_us {
        0 => l.cost,
        _ => 0,
    }
}

/// A job's cost, as its limits take it: each bucket's (one and the same: the
/// job's own, else its channel's), 1 when it meets counters only (they count one).
fn job_cost(limits: &[LimitArgs]) -> u64 {
    let mut buckets = limits.iter().filter(|l| l.interval_us > 0);
    let cost = buckets.next().map_or(1, |l| l.cost);
    debug_assert!(buckets.all(|l| l.cost == cost), "one cost a job");
    cost
}

/// The limits section: the groups, each with its limit's interval, burst and a
/// counter's end, and its buckets (each its key and the total its jobs would
/// take); then which jobs meet limits (a byte a job, `1` when it does) and, in
/// one value, each of those jobs' cost and its buckets' numbers (one job from the
/// next by `;`).
fn limits_section(cmd: &mut redis::Cmd, jobs: &[&AdmitArgs], buckets: &Buckets<'_>) {
    cmd.arg(buckets.groups.len());
    let mut totals = buckets.totals(jobs).into_iter();
    for group in &buckets.groups {
        let l = group[0];
        cmd.arg(l.interval_us)
            .arg(l.burst)
            .arg(expires(l))
            .arg(group.len());
        for (b, total) in group.iter().zip(&mut totals) {
            cmd.arg(&*b.key).arg(total);
        }
    }
    let has: String = jobs
        .iter()
        .map(|j| if j.limits.is_empty() { '0' } else { '1' })
        .collect();
    let mut words = String::with_capacity(16 * jobs.len());
    for (job, numbers) in per_job(jobs, &buckets.numbers) {
        if job.limits.is_empty() {
            continue;
        }
        if !words.is_empty() {
            words.push(';');
        }
        let _ = write!(words, "{}", job_cost(&job.limits));
        for n in numbers {
            let _ = write!(words, " {}", n + 1);
        }
    }
    cmd.arg(has).arg(words);
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
