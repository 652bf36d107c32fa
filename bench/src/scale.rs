//! The scale step (`--steps scale`, only when asked for): keys of many recipients
//! already in Redis (10,000 and 10,000,000 in the full run), 1 and 10 policies in
//! use; rounds of a ceiling and every configuration, the order alternating round by
//! round, each a drain of the same number of jobs spread over the recipients: jobs/s
//! and CPU per job. Each recipient count gets a Redis server of its own where
//! `redis-server` can be started.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use quota_worker::config::Settings;

use crate::broker::{closed, connect};
use crate::ceiling::ceiling;
use crate::context::{header, Bench};
use crate::jobs::scale_recipient;
use crate::mixes::drain;
use crate::procs::OwnRedis;
use crate::report::{median, Report, ScaleResult, ScaleRound};
use crate::sample::set_redis_pid;
use crate::teardown::delete_keys;

/// Where the keys of each recipient count live: a Redis of its own, or the shared
/// one (`--redis`), under a prefix of their own.
struct Keyspaces<'a> {
    b: &'a Bench,
    own: HashMap<usize, OwnRedis>,
}

impl Keyspaces<'_> {
    fn prefix(&self, r: usize) -> String {
        format!("{}k{r}", self.b.run_id)
    }

    fn url(&self, r: usize) -> String {
        self.own
            .get(&r)
            .map_or(self.b.args.redis.clone(), |o| o.url.clone())
    }

    /// The pid of the Redis of `r` when it is the step's own (0: the shared one).
    fn pid(&self, r: usize) -> u32 {
        self.own.get(&r).map_or(0, |o| o.child.id())
    }

    /// `s` with the key prefix and the Redis of `r`.
    fn of(&self, mut s: Settings, r: usize) -> Settings {
        s.redis.key_prefix = self.prefix(r);
        s.redis.url = self.url(r);
        s
    }

    /// Writes the keys of `r` recipients for every policy count.
    fn write_keys(&self, r: usize) -> Result<u64> {
        let s = self.of(self.b.settings(&format!("k{r}")), r);
        tokio::task::block_in_place(|| preload_recipients(&s, r, &self.b.args.scale_policies))
    }
}

/// Runs the step into `report`: keys, rounds, medians; then deletes the keys.
pub async fn step(b: &Bench, report: &mut Report) -> Result<()> {
    let recipients = b.args.scale_recipients();
    let files = config_files(b)?;
    // a Redis server for each recipient count, where redis-server can be started;
    // else the shared one (and the keys deleted by prefix at the end)
    let mut own: HashMap<usize, OwnRedis> = HashMap::new();
    for &r in &recipients {
        match OwnRedis::start() {
            Ok(o) => {
                own.insert(r, o);
            }
            Err(e) => {
                header("scale", format!("{e:#}: the keys go to {}", b.args.redis));
                own.clear();
                break;
            }
        }
    }
    let keyspaces = Keyspaces { b, own };
    let result = measure(&keyspaces, &recipients, &files, report).await;
    set_redis_pid(0);
    // the most first: then the scans for the fewer keys have little left to go over
    let mut by_size = recipients.to_vec();
    by_size.sort_unstable_by(|a, b| b.cmp(a));
    for &r in by_size.iter().filter(|r| !keyspaces.own.contains_key(r)) {
        header("scale", format!("deleting the keys of {r} recipients"));
        let _ =
            tokio::task::block_in_place(|| delete_keys(&keyspaces.url(r), &keyspaces.prefix(r)));
    }
    // its own servers go with their keys
    drop(keyspaces);
    result
}

/// The configuration file of each policy count of `--scale-policies`, written to
/// `--out`.
fn config_files(b: &Bench) -> Result<HashMap<usize, PathBuf>> {
    let mut files = HashMap::new();
    for &p in &b.args.scale_policies {
        let path = std::fs::canonicalize(&b.args.out)?.join(format!("scale-policies-{p}.toml"));
        std::fs::write(&path, scale_config(p))?;
        files.insert(p, path);
    }
    Ok(files)
}

/// Every recipient count's keys, then the rounds, then each configuration's medians
/// into `report`.
async fn measure(
    ks: &Keyspaces<'_>,
    recipients: &[usize],
    files: &HashMap<usize, PathBuf>,
    report: &mut Report,
) -> Result<()> {
    let b = ks.b;
    for &r in recipients {
        write_and_rehash(ks, r, report)?;
    }
    let configs: Vec<(usize, usize)> = recipients
        .iter()
        .flat_map(|&r| b.args.scale_policies.iter().map(move |&p| (r, p)))
        .collect();
    let mut runs: HashMap<(usize, usize), Vec<ScaleRound>> = HashMap::new();
    for round in 0..b.rounds {
        let c = b.settings(&format!("sc{round}"));
        let (last_r, last_p) = *configs.last().context("no scale configuration")?;
        let (ceiling, ceiling_cpu) =
            ceiling(&c, &format!("scale:{last_r}:{last_p}:{round}"), b.jobs).await?;
        b.teardown.ceiling(&c).await;
        let mut order = configs.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for (r, p) in order {
            let mut x = run_config(ks, r, p, round, &files[&p]).await?;
            eprintln!(
                "      scale round {}: {r} recipients, {p} policies: {:.0} jobs/s ({:.2} of {ceiling:.0}), CPU/job {:.0} / {:.0} / {:.0} us",
                round + 1,
                x.jobs_per_sec,
                x.jobs_per_sec / ceiling,
                x.cpu_us_per_job[0],
                x.cpu_us_per_job[1],
                x.cpu_us_per_job[2]
            );
            x.ceiling_msgs_per_sec = ceiling;
            x.ratio = x.jobs_per_sec / ceiling;
            x.ceiling_cpu_us_per_msg = ceiling_cpu;
            runs.entry((r, p)).or_default().push(x);
        }
    }
    for (r, p) in &configs {
        let rs = runs.remove(&(*r, *p)).unwrap_or_default();
        report.scale.push(summarise(*r, *p, b.jobs, rs));
    }
    Ok(())
}

/// Writes the keys of `r` recipients and waits until Redis has rehashed them.
fn write_and_rehash(ks: &Keyspaces<'_>, r: usize, report: &mut Report) -> Result<()> {
    header("scale", format!("writing {r} recipients' keys"));
    let started = Instant::now();
    let written = ks.write_keys(r)?;
    let secs = started.elapsed().as_secs_f64();
    eprintln!("      {written} keys in {secs:.1} s");
    report.scale_preload.push((r, written, secs));
    // a keyspace that has just grown is rehashed into a table twice the size,
    // a little at a time, and every lookup until then looks in both tables
    // and moves a bucket: finish it first, so the runs measure the keyspace
    // and not its growth
    let waited = Instant::now();
    let s = ks.of(ks.b.settings(&format!("k{r}")), r);
    match tokio::task::block_in_place(|| wait_rehashed(&s, r, &ks.b.args.scale_policies)) {
        Ok(()) => eprintln!(
            "      rehashed {:.1} s after the last key",
            waited.elapsed().as_secs_f64()
        ),
        Err(e) => eprintln!("      not waiting for the rehash: {e:#}"),
    }
    Ok(())
}

/// One drain of configuration `(r, p)` in `round`; the ceiling's fields are left
/// for the caller.
async fn run_config(
    ks: &Keyspaces<'_>,
    r: usize,
    p: usize,
    round: usize,
    config: &std::path::Path,
) -> Result<ScaleRound> {
    let b = ks.b;
    // few recipients: their keys written again each round, so no round
    // starts with more sends per key than the first
    if r <= 1_000_000 && round > 0 {
        ks.write_keys(r)?;
    }
    let s = b.settings(&format!("s{r}p{p}r{round}"));
    let w = ks.of(s.clone(), r);
    set_redis_pid(ks.pid(r));
    let conn = connect(&b.args.amqp).await?;
    let env = [(
        "QUOTA_WORKER_CONFIG".to_string(),
        config.display().to_string(),
    )];
    let mix = format!("scale:{r}:{p}:{round}");
    let m = drain(&conn, &w, &b.worker, &mix, b.jobs, &env, None).await;
    let _ = closed(conn.close(200, "bye".into())).await;
    // its keys are the recipients' (deleted at the end of the step): a
    // delete by prefix now would scan the whole keyspace between runs
    b.teardown.topology(&s).await;
    let m = m?;
    Ok(ScaleRound {
        jobs_per_sec: m.jobs_per_sec,
        cpu_us_per_job: m.cpu_us_per_job,
        admission_p99_ms: m.admission_p99_ms,
        redis_calls_per_job: m.redis_calls_per_job,
        outcomes: m.outcomes,
        ..Default::default()
    })
}

/// Configuration `(r, p)`: medians over its rounds `rs`.
fn summarise(r: usize, p: usize, n: usize, rs: Vec<ScaleRound>) -> ScaleResult {
    let part = |i: usize| median(rs.iter().map(|x| x.cpu_us_per_job[i]).collect());
    ScaleResult {
        recipients: r,
        policies: p,
        jobs: n,
        jobs_per_sec: median(rs.iter().map(|x| x.jobs_per_sec).collect()),
        ratio_to_ceiling: median(rs.iter().map(|x| x.ratio).collect()),
        cpu_us_per_job: median(rs.iter().map(|x| x.cpu_us_per_job.iter().sum()).collect()),
        cpu_us_per_job_parts: [part(0), part(1), part(2)],
        redis_us_per_job: part(1),
        rounds: rs,
    }
}

/// The scale step's configuration for `policies` policies: `default` and `p1`..,
/// each with two rules like the default policy's (a calendar day and a rolling
/// week) but limits no run reaches, so that every job is admitted and dispatched.
fn scale_config(policies: usize) -> String {
    (0..policies.max(1))
        .map(|k| {
            let name = if k == 0 { "default".to_string() } else { format!("p{k}") };
            format!(
                "[policies.{name}]\nrules = [{{ limit = 100000, window = \"1d\" }}, {{ limit = 300000, window = \"7d\" }}]\n\n"
            )
        })
        .collect()
}

/// Writes, for every recipient below `n` and every policy count in `policies`, the
/// key the engine would use, holding three committed sends of the past week (a
/// copy of one such sorted set by DUMP and RESTORE ... REPLACE, pipelined). Returns
/// the keys written.
fn preload_recipients(s: &Settings, n: usize, policies: &[usize]) -> Result<u64> {
    let keys = s.redis.keys();
    let client = redis::Client::open(s.redis.url.as_str())?;
    let mut c = client.get_connection()?;
    let proto = format!("{}:prototype", s.redis.key_prefix);
    let t: Vec<u64> = redis::cmd("TIME").query(&mut c)?;
    let now_ms = t[0] * 1000;
    let day = 86_400_000u64;
    let _: i64 = redis::cmd("ZADD")
        .arg(&proto)
        .arg((now_ms - day / 2) * 2 + 1)
        .arg("m0000000001a")
        .arg((now_ms - 2 * day) * 2 + 1)
        .arg("m0000000002b")
        .arg((now_ms - 5 * day) * 2 + 1)
        .arg("m0000000003c")
        .query(&mut c)?;
    let payload: Vec<u8> = redis::cmd("DUMP").arg(&proto).query(&mut c)?;
    let _: i64 = redis::cmd("DEL").arg(&proto).query(&mut c)?;
    let ttl = 7 * day;
    let mut written = 0u64;
    let mut in_pipe = 0;
    let mut pipe = redis::pipe();
    for r in 0..n {
        let mut names: Vec<String> = policies.iter().map(|&p| scale_recipient(r, p).1).collect();
        names.dedup();
        names.sort();
        names.dedup();
        let who = format!("s{r}@example.com");
        for policy in names {
            pipe.cmd("RESTORE")
                .arg(keys.recipient(&who, &policy, None))
                .arg(ttl)
                .arg(&payload[..])
                .arg("REPLACE")
                .ignore();
            written += 1;
            in_pipe += 1;
        }
        if in_pipe >= 10_000 {
            pipe.query::<()>(&mut c)?;
            pipe = redis::pipe();
            in_pipe = 0;
        }
    }
    if in_pipe > 0 {
        pipe.query::<()>(&mut c)?;
    }
    Ok(written)
}

/// Until no table of database 0 is being rehashed (`DEBUG HTSTATS 0` lists a
/// "rehashing target" while one is): Redis's cron alone moves about 8,000 keys a
/// second, half an hour for 19,000,000, but every lookup moves a bucket of each
/// table it looks in, so the keys written are looked up (`EXISTS`, pipelined, which
/// also looks up their expiry) 100,000 at a time, in turn, until it is done.
fn wait_rehashed(s: &Settings, n: usize, policies: &[usize]) -> Result<()> {
    let keys = s.redis.keys();
    let mut c = redis::Client::open(s.redis.url.as_str())?.get_connection()?;
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut r = 0;
    loop {
        let stats: String = redis::cmd("DEBUG").arg("HTSTATS").arg(0).query(&mut c)?;
        if !stats.contains("rehashing target") {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("still rehashing after 15 minutes");
        }
        let mut pipe = redis::pipe();
        for _ in 0..100_000 {
            let (who, policy) = scale_recipient(r % n.max(1), policies[r % policies.len()]);
            pipe.cmd("EXISTS")
                .arg(keys.recipient(&who, &policy, None))
                .ignore();
            r += 1;
        }
        pipe.query::<()>(&mut c)?;
    }
}
