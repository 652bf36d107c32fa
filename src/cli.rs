//! The `publish` and `admin` subcommands: their arguments (clap) and what they print.
//! This is the binary's glue, kept in the library so `main.rs` stays a page long; the
//! work itself is in [`crate::producer`] and [`crate::admin`].
//!
//! Output: tables for people, `--json` for scripts (stdout only ever holds the
//! answer; progress and warnings go to stderr). Exit codes: 0 done, 1 failed,
//! 2 done in part (`publish` skipped bad input lines), 130 interrupted.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::{ArgGroup, Args, Subcommand};
use futures_util::stream::{FuturesOrdered, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

use crate::admin::{
    self, DeadLetter, DeadLetters, RecipientQuery, RecipientStatus, Recipients, Selection, Step,
};
use crate::amqp::{self, Topology};
use crate::config::{redact_url, Settings};
use crate::engine::Engine;
use crate::producer::{Job, JobId, Producer};

/// Exit code: some input lines were bad (the others were published).
pub const EXIT_PARTIAL: u8 = 2;
/// Exit code: stopped by SIGINT/SIGTERM.
pub const EXIT_INTERRUPTED: u8 = 130;

fn parse_instant(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 instant such as 2026-12-01T00:00:00Z: {e}"))
}

fn parse_json(s: &str) -> Result<Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

fn parse_zone(s: &str) -> Result<Tz, String> {
    s.parse::<Tz>()
        .map_err(|_| format!("`{s}` is not an IANA time zone (e.g. Europe/Paris)"))
}

async fn amqp(settings: &Settings) -> anyhow::Result<lapin::Connection> {
    amqp::connect(
        &settings.amqp.url,
        &settings.amqp.tls,
        "quota-worker admin",
        settings.amqp.publish_timeout.0,
    )
    .await
    .with_context(|| format!("connecting to {}", redact_url(&settings.amqp.url)))
}

async fn engine(settings: &Settings) -> anyhow::Result<Engine> {
    Engine::connect(settings)
        .await
        .with_context(|| format!("connecting to Redis at {}", redact_url(&settings.redis.url)))
}

/// A token cancelled by the first SIGINT or SIGTERM: long commands stop between two
/// messages instead of dying in the middle of one.
fn stop_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    tokio::spawn(crate::signals::on_terminate(token.clone()));
    token
}

fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// publish

/// `quota-worker publish`: one job from flags, or JSON lines on stdin.
#[derive(Args, Debug)]
#[command(after_help = "\
Without --recipient, reads one job per line from stdin (JSON, the contract's fields; \
blank lines are skipped) and publishes each with publisher confirms, several at a time. \
Prints each published job's id on stdout, one per line, in input order. A bad line \
(not JSON, not a valid job, or an unconfigured channel) is reported on stderr with its \
line number and skipped; the others are published and the exit code is 2. With \
--strict, every line is checked first and nothing is published if one is bad. \
Jobs without an id get a UUIDv7: give ids in your lines if you may run the same input \
twice, so the worker recognises the copies as duplicates.")]
pub struct PublishArgs {
    /// Recipient of a single job (an email, a phone number, a user id).
    #[arg(long, requires = "channel", conflicts_with_all = ["stdin", "strict"])]
    pub recipient: Option<String>,
    /// Channel of the single job (one of the configured channels).
    #[arg(long, requires = "recipient")]
    pub channel: Option<String>,
    /// Category (selects the quota policy; default `default`).
    #[arg(long, requires = "recipient")]
    pub category: Option<String>,
    /// The recipient's IANA time zone.
    #[arg(long, requires = "recipient")]
    pub timezone: Option<String>,
    /// Never deliver after this instant (RFC 3339).
    #[arg(long, requires = "recipient", value_parser = parse_instant)]
    pub expires_at: Option<DateTime<Utc>>,
    /// Payload, as JSON.
    #[arg(long, requires = "recipient", value_parser = parse_json)]
    pub payload: Option<Value>,
    /// Idempotency key (default: a new UUIDv7).
    #[arg(long, requires = "recipient")]
    pub id: Option<String>,
    /// Read JSON lines from stdin (the default without --recipient).
    #[arg(long)]
    pub stdin: bool,
    /// With stdin: check every line first; publish nothing if one is bad.
    #[arg(long)]
    pub strict: bool,
}

/// Run `publish`.
pub async fn publish(settings: &Settings, args: PublishArgs) -> anyhow::Result<ExitCode> {
    match args.recipient.clone() {
        Some(recipient) => publish_one(settings, args, recipient).await,
        None => publish_lines(settings, args.strict).await,
    }
}

fn check_channel(settings: &Settings, channel: &str) -> Result<(), String> {
    if settings.channels.contains_key(channel) {
        Ok(())
    } else {
        Err(format!(
            "channel `{channel}` is not configured (configured: {}); the worker would dead-letter the job",
            settings.channels.keys().cloned().collect::<Vec<_>>().join(", ")
        ))
    }
}

async fn publish_one(
    settings: &Settings,
    args: PublishArgs,
    recipient: String,
) -> anyhow::Result<ExitCode> {
    let job = Job {
        id: args.id,
        recipient,
        channel: args.channel.unwrap_or_default(),
        category: args.category,
        timezone: args.timezone,
        expires_at: args.expires_at,
        payload: args.payload,
        extra: Default::default(),
    };
    check_channel(settings, &job.channel).map_err(anyhow::Error::msg)?;
    let producer = Producer::from_settings(settings).await?;
    let id = producer.publish(&job).await?;
    println!("{id}");
    producer.close().await;
    Ok(ExitCode::SUCCESS)
}

/// One input line, checked.
fn check_line(
    settings: &Settings,
    producer: &Producer,
    line: &str,
) -> Result<(JobId, Vec<u8>), String> {
    let job: Job = serde_json::from_str(line).map_err(|e| format!("not a job: {e}"))?;
    check_channel(settings, &job.channel)?;
    producer.encode(&job).map_err(|e| e.to_string())
}

fn progress_bar() -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new_spinner().with_style(
        ProgressStyle::with_template("{spinner} {pos} published, {per_sec} {msg}")
            .expect("a valid template"),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

/// Jobs awaiting their confirm at once when reading stdin.
const IN_FLIGHT: usize = 64;

type Sent = (usize, JobId, Result<(), crate::producer::ProducerError>);

async fn send(producer: &Producer, line: usize, id: JobId, body: Vec<u8>) -> Sent {
    let result = producer.publish_encoded(&id, &body).await;
    (line, id, result)
}

async fn publish_lines(settings: &Settings, strict: bool) -> anyhow::Result<ExitCode> {
    let producer = Producer::from_settings(settings).await?;
    let stop = stop_on_signal();
    if std::io::stdin().is_terminal() {
        eprintln!("reading jobs as JSON lines from stdin (end with Ctrl-D)");
    }
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let bar = progress_bar();
    let mut stdout = std::io::stdout();
    let mut bad = 0usize;
    let mut checked: Vec<(usize, JobId, Vec<u8>)> = Vec::new();
    let mut in_flight = FuturesOrdered::new();
    let mut failure: Option<anyhow::Error> = None;
    let mut interrupted = false;
    let mut n = 0usize;
    loop {
        let next = tokio::select! {
            _ = stop.cancelled() => { interrupted = true; break; }
            next = lines.next_line() => next.context("reading stdin")?,
        };
        let Some(line) = next else { break };
        n += 1;
        if line.trim().is_empty() {
            continue;
        }
        match check_line(settings, &producer, &line) {
            Ok((id, body)) if strict => checked.push((n, id, body)),
            Ok((id, body)) => {
                in_flight.push_back(send(&producer, n, id, body));
                while in_flight.len() >= IN_FLIGHT {
                    if let Some(done) = in_flight.next().await {
                        if let Err(e) = settle(done, &mut stdout, &bar) {
                            failure.get_or_insert(e);
                        }
                    }
                }
                if failure.is_some() {
                    break;
                }
            }
            Err(why) => {
                bad += 1;
                bar.suspend(|| eprintln!("line {n}: {why}"));
            }
        }
    }
    if strict && bad > 0 {
        bar.finish_and_clear();
        eprintln!("{bad} bad line(s): nothing published (--strict)");
        return Ok(ExitCode::from(EXIT_PARTIAL));
    }
    for (n, id, body) in checked {
        if failure.is_some() || stop.is_cancelled() {
            interrupted |= stop.is_cancelled();
            break;
        }
        in_flight.push_back(send(&producer, n, id, body));
        while in_flight.len() >= IN_FLIGHT {
            if let Some(done) = in_flight.next().await {
                if let Err(e) = settle(done, &mut stdout, &bar) {
                    failure.get_or_insert(e);
                }
            }
        }
    }
    while let Some(done) = in_flight.next().await {
        if let Err(e) = settle(done, &mut stdout, &bar) {
            failure.get_or_insert(e);
        }
    }
    drop(in_flight);
    bar.finish_and_clear();
    producer.close().await;
    if let Some(e) = failure {
        return Err(e.context("publishing stopped; the ids printed were confirmed"));
    }
    if interrupted {
        eprintln!(
            "interrupted: every id printed was confirmed; the rest of the input was not published"
        );
        return Ok(ExitCode::from(EXIT_INTERRUPTED));
    }
    if bad > 0 {
        eprintln!("{bad} bad line(s) skipped; the others were published");
        return Ok(ExitCode::from(EXIT_PARTIAL));
    }
    Ok(ExitCode::SUCCESS)
}

fn settle((line, id, result): Sent, out: &mut impl Write, bar: &ProgressBar) -> anyhow::Result<()> {
    match result {
        Ok(()) => {
            writeln!(out, "{id}")?;
            bar.inc(1);
            Ok(())
        }
        Err(e) => Err(anyhow::Error::new(e).context(format!("line {line}"))),
    }
}

// ---------------------------------------------------------------------------------
// admin

/// `quota-worker admin`.
#[derive(Subcommand, Debug)]
pub enum AdminCommand {
    /// Every queue of the topology with its ready messages and consumers.
    Queues {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read, replay or purge dead letters (nothing is lost if interrupted).
    #[allow(missing_docs)]
    Dead {
        #[command(subcommand)]
        command: DeadCommand,
    },
    /// A recipient's recorded sends, rule counts and next allowed instant; import or
    /// clear sends.
    Recipient(RecipientArgs),
}

/// Which dead letters: by reason, by id, or all.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("selection").required(true).multiple(true).args(["reason", "id", "all"])))]
pub struct SelectionArgs {
    /// Only dead letters with this reason (repeat for several).
    #[arg(long)]
    pub reason: Vec<String>,
    /// Only the dead letter(s) with this job id (repeat for several).
    #[arg(long)]
    pub id: Vec<String>,
    /// Every dead letter.
    #[arg(long, conflicts_with_all = ["reason", "id"])]
    pub all: bool,
}

impl SelectionArgs {
    fn selection(&self) -> Selection {
        Selection {
            reasons: self.reason.clone(),
            ids: self.id.clone(),
        }
    }

    fn describe(&self) -> String {
        if self.all {
            return "every dead letter".into();
        }
        let mut parts = Vec::new();
        if !self.reason.is_empty() {
            parts.push(format!("reason {}", self.reason.join(" or ")));
        }
        if !self.id.is_empty() {
            parts.push(format!("id {}", self.id.join(" or ")));
        }
        format!("dead letters with {}", parts.join(" and "))
    }
}

/// `admin dead`.
#[derive(Subcommand, Debug)]
#[command(after_help = "\
Dead letters are read by rotating the queue: each message present at the start is \
taken once, a fresh copy is published to the tail (or it is replayed or purged), and \
the original is acked only after that publish is confirmed. Order is kept and the \
broker's delivery count is never raised. Run one of these at a time.")]
pub enum DeadCommand {
    /// List dead letters: id, reason, age, detail.
    #[allow(missing_docs)]
    List {
        /// Only these reasons (repeat for several).
        #[arg(long)]
        reason: Vec<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show the dead letter(s) with a job id: headers, properties and body.
    Show {
        /// The job id.
        id: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Publish a selection back to the jobs exchange, without dead-letter headers.
    #[allow(missing_docs)]
    Replay {
        #[command(flatten)]
        selection: SelectionArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Delete a selection, after confirmation.
    #[allow(missing_docs)]
    Purge {
        #[command(flatten)]
        selection: SelectionArgs,
        /// Do not ask (required when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

/// `admin recipient`.
#[derive(Args, Debug)]
pub struct RecipientArgs {
    /// The recipient, as producers write it.
    pub recipient: String,
    /// Only the policy this category selects (record: the policy to record under).
    #[arg(long, global = true)]
    pub category: Option<String>,
    /// Only this channel, for policies that count per channel.
    #[arg(long, global = true)]
    pub channel: Option<String>,
    /// The recipient's zone (default: worker.default_timezone).
    #[arg(long, global = true, value_parser = parse_zone)]
    pub timezone: Option<Tz>,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[allow(missing_docs)]
    #[command(subcommand)]
    pub action: Option<RecipientAction>,
}

/// What to do to a recipient (nothing: show).
#[derive(Subcommand, Debug)]
pub enum RecipientAction {
    /// Import a past send (for migrating from another system).
    Record {
        /// When it was sent (RFC 3339).
        #[arg(long, value_parser = parse_instant)]
        at: DateTime<Utc>,
        /// Its job id (a later job with this id is a duplicate); default: a new id.
        #[arg(long)]
        id: Option<String>,
    },
    /// Delete every recorded send of the recipient (all policies and channels).
    Reset,
}

/// Run an `admin` subcommand.
pub async fn admin(settings: &Settings, command: AdminCommand) -> anyhow::Result<ExitCode> {
    match command {
        AdminCommand::Queues { json } => queues(settings, json).await,
        AdminCommand::Dead { command } => dead(settings, command).await,
        AdminCommand::Recipient(args) => recipient(settings, args).await,
    }
}

async fn queues(settings: &Settings, json: bool) -> anyhow::Result<ExitCode> {
    let conn = amqp(settings).await?;
    let stats = admin::queue_stats(&conn, &Topology::from_settings(settings)).await?;
    let _ = conn.close(200, "bye".into()).await;
    if json {
        print_json(&stats)?;
        return Ok(ExitCode::SUCCESS);
    }
    let width = stats.iter().map(|q| q.name.len()).max().unwrap_or(5).max(5);
    println!(
        "{:<width$}  {:<14}  {:>9}  {:>9}",
        "QUEUE", "ROLE", "READY", "CONSUMERS"
    );
    for q in &stats {
        let role = match &q.detail {
            Some(d) => format!("{} {d}", q.role),
            None => q.role.to_string(),
        };
        let num = |v: Option<u32>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
        println!(
            "{:<width$}  {:<14}  {:>9}  {:>9}{}",
            q.name,
            role,
            num(q.ready),
            num(q.consumers),
            if q.exists { "" } else { "  (missing)" }
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn age(seconds: Option<i64>) -> String {
    let Some(s) = seconds else { return "?".into() };
    match s {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s => format!("{}d{:02}h", s / 86_400, s % 86_400 / 3600),
    }
}

fn walk_note(report: &admin::WalkReport) {
    if report.interrupted {
        eprintln!(
            "interrupted after {} of {} dead letters; the others were not touched",
            report.visited, report.found
        );
    }
}

async fn dead(settings: &Settings, command: DeadCommand) -> anyhow::Result<ExitCode> {
    let conn = amqp(settings).await?;
    let topology = Topology::from_settings(settings);
    let letters = DeadLetters::new(&conn, &topology, settings.amqp.publish_timeout.0);
    let now = Utc::now();
    let queue = &settings.amqp.dead_queue;
    let code = match command {
        DeadCommand::List { reason, json } => {
            let stop = stop_on_signal();
            let filter = Selection {
                reasons: reason,
                ids: vec![],
            };
            let mut seen = Vec::new();
            let report = letters
                .walk(&stop, |d| {
                    let letter = DeadLetter::read(&d.properties, &d.data, now, false);
                    if filter.matches(&letter) {
                        seen.push(letter);
                    }
                    Step::Keep
                })
                .await?;
            if json {
                print_json(&seen)?;
            } else {
                let width = seen
                    .iter()
                    .map(|d| d.id.as_deref().unwrap_or("-").chars().count())
                    .max()
                    .unwrap_or(2)
                    .clamp(2, 40);
                println!("{:<width$}  {:<16}  {:>7}  DETAIL", "ID", "REASON", "AGE");
                for d in &seen {
                    println!(
                        "{:<width$}  {:<16}  {:>7}  {}",
                        d.id.as_deref().unwrap_or("-"),
                        d.reason,
                        age(d.age_seconds),
                        d.detail
                    );
                }
                eprintln!(
                    "{} of {} dead letter(s) in `{queue}` listed; all kept, in order",
                    seen.len(),
                    report.visited
                );
            }
            walk_note(&report);
            interrupted_or_ok(&report)
        }
        DeadCommand::Show { id, json } => {
            let stop = stop_on_signal();
            let mut seen = Vec::new();
            let report = letters
                .walk(&stop, |d| {
                    let letter = DeadLetter::read(&d.properties, &d.data, now, false);
                    if letter.id.as_deref() == Some(id.as_str()) {
                        seen.push(DeadLetter::read(&d.properties, &d.data, now, true));
                    }
                    Step::Keep
                })
                .await?;
            walk_note(&report);
            if seen.is_empty() {
                bail!("no dead letter with id `{id}` in `{queue}`");
            }
            if json {
                print_json(&seen)?;
            } else {
                for d in &seen {
                    println!("id:          {}", d.id.as_deref().unwrap_or("-"));
                    println!("reason:      {} ({})", d.reason, d.source);
                    println!("detail:      {}", d.detail);
                    println!(
                        "dead since:  {} ({} ago)",
                        d.dead_at.map(|t| t.to_rfc3339()).unwrap_or("?".into()),
                        age(d.age_seconds)
                    );
                    if let Some(a) = d.attempts {
                        println!("attempts:    {a}");
                    }
                    if let Some(t) = d.first_seen {
                        println!("first seen:  {}", t.to_rfc3339());
                    }
                    println!(
                        "properties:  {}",
                        serde_json::to_string_pretty(&d.properties)?
                    );
                    println!("body:        {}", serde_json::to_string_pretty(&d.body)?);
                }
            }
            interrupted_or_ok(&report)
        }
        DeadCommand::Replay { selection, json } => {
            let stop = stop_on_signal();
            let sel = selection.selection();
            let mut replayed = Vec::new();
            let report = letters
                .walk(&stop, |d| {
                    let letter = DeadLetter::read(&d.properties, &d.data, now, false);
                    if sel.matches(&letter) {
                        replayed.push(letter);
                        Step::Replay
                    } else {
                        Step::Keep
                    }
                })
                .await?;
            if json {
                print_json(&serde_json::json!({ "replayed": replayed, "walk": report }))?;
            } else {
                for d in &replayed {
                    println!("replayed {} ({})", d.id.as_deref().unwrap_or("-"), d.reason);
                }
                eprintln!(
                    "{} replayed to `{}`, {} kept in `{queue}`",
                    report.replayed, settings.amqp.jobs_exchange, report.kept
                );
            }
            walk_note(&report);
            interrupted_or_ok(&report)
        }
        DeadCommand::Purge { selection, yes } => {
            let there = letters.count().await?;
            if !yes {
                if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
                    bail!("refusing to purge without a terminal to confirm on; pass --yes");
                }
                eprint!(
                    "Delete {} from `{queue}` ({there} dead letter(s) there now)? This cannot be undone. [y/N] ",
                    selection.describe()
                );
                std::io::stderr().flush()?;
                let mut answer = String::new();
                std::io::stdin().lock().read_line(&mut answer)?;
                if !matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes") {
                    eprintln!("nothing purged");
                    return Ok(ExitCode::FAILURE);
                }
            }
            // after the prompt, so that Ctrl-C at the prompt still quits at once
            let stop = stop_on_signal();
            let sel = selection.selection();
            let report = letters
                .walk(&stop, |d| {
                    if sel.matches(&DeadLetter::read(&d.properties, &d.data, now, false)) {
                        Step::Drop
                    } else {
                        Step::Keep
                    }
                })
                .await?;
            println!(
                "purged {} dead letter(s) from `{queue}`; {} kept",
                report.dropped, report.kept
            );
            walk_note(&report);
            interrupted_or_ok(&report)
        }
    };
    let _ = conn.close(200, "bye".into()).await;
    Ok(code)
}

fn interrupted_or_ok(report: &admin::WalkReport) -> ExitCode {
    if report.interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else {
        ExitCode::SUCCESS
    }
}

async fn recipient(settings: &Settings, args: RecipientArgs) -> anyhow::Result<ExitCode> {
    let engine = engine(settings).await?;
    let recipients = Recipients::new(&engine, settings);
    let tz = match args.timezone {
        Some(tz) => tz,
        None => settings.default_zone()?,
    };
    let query = RecipientQuery {
        recipient: &args.recipient,
        category: args.category.as_deref(),
        channel: args.channel.as_deref(),
        tz,
    };
    match args.action {
        None => {
            let status = recipients.status(&query).await?;
            if args.json {
                print_json(&status)?;
            } else {
                print_status(&status);
            }
        }
        Some(RecipientAction::Record { at, id }) => {
            let id = id.unwrap_or_else(|| format!("imported-{}", uuid::Uuid::now_v7()));
            let recorded = recipients.record(&query, at, &id).await?;
            if args.json {
                print_json(&recorded)?;
            } else if recorded.added {
                println!(
                    "recorded a send at {} under policy `{}`{} as job `{}`; kept until {}",
                    recorded.at.with_timezone(&tz).to_rfc3339(),
                    recorded.policy,
                    recorded
                        .channel
                        .as_ref()
                        .map(|c| format!(" (channel {c})"))
                        .unwrap_or_default(),
                    recorded.id,
                    recorded
                        .key_expires_at
                        .map(|t| t.to_rfc3339())
                        .unwrap_or_else(|| "(no expiry)".into())
                );
            } else {
                println!(
                    "job `{}` was already recorded under policy `{}`; nothing changed",
                    recorded.id, recorded.policy
                );
            }
        }
        Some(RecipientAction::Reset) => {
            let deleted = recipients.reset(&args.recipient).await?;
            if args.json {
                print_json(&serde_json::json!({ "deleted_keys": deleted }))?;
            } else {
                println!("deleted {deleted} key(s): the recipient has no recorded sends");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_status(s: &RecipientStatus) {
    println!(
        "recipient {} (zone {}), Redis time {}",
        s.recipient_tag,
        s.timezone,
        s.now.to_rfc3339()
    );
    for p in &s.policies {
        let channel = p
            .channel
            .as_ref()
            .map(|c| format!(", channel {c}"))
            .unwrap_or_default();
        println!(
            "\npolicy {}{channel} (refused jobs: {})",
            p.policy, p.action
        );
        if p.rules.is_empty() {
            println!("  no caps");
        }
        for r in &p.rules {
            println!(
                "  {:>3} of {:<3} per {:<6}{}",
                r.count,
                r.limit,
                r.window,
                if r.full { "  full" } else { "" }
            );
        }
        if p.sends.is_empty() {
            println!("  no recorded sends");
        }
        for send in &p.sends {
            println!(
                "  sent {}  {}{}",
                send.at_local,
                send.state,
                if send.counting {
                    ""
                } else {
                    "  (no longer counts)"
                }
            );
        }
        match &p.next_allowed {
            None => println!("  next allowed: never (a limit of 0)"),
            Some(n) if n.now => println!("  next allowed: now"),
            Some(n) => println!("  next allowed: {} ({})", n.local, n.utc.to_rfc3339()),
        }
    }
}
