//! `quota-worker publish`: one job from flags, or JSON lines from stdin, each
//! published with a confirm; the ids printed in input order.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use clap::Args;
use futures_util::stream::{FuturesOrdered, StreamExt};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use super::{parse_instant, parse_json, stop_on_signal, EXIT_INTERRUPTED, EXIT_PARTIAL};
use quota_worker::config::Settings;
use quota_worker::lanes::Priority;
use quota_worker::producer::{Job, JobId, Producer};

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
twice, so the worker recognises the copies as duplicates. A job with a `priority` \
(a line's field or --priority) goes to the lanes exchange (lanes.exchange), routed \
<channel>.<priority>: it waits in its lane, never in the jobs queue behind a campaign.")]
// Its fields are the command's flags, one each, as clap reads them: it mirrors
// the command line, so it has as many fields as `publish` has flags.
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
    /// Never deliver before this instant (RFC 3339): a scheduled send.
    #[arg(long, requires = "recipient", value_parser = parse_instant)]
    pub not_before: Option<DateTime<Utc>>,
    /// Collapse key: a newer job of the recipient with the same key replaces this
    /// one while it waits.
    #[arg(long, requires = "recipient")]
    pub collapse_key: Option<String>,
    /// Lane of the job while its channel's rate makes it wait: urgent, normal or
    /// bulk (default: its policy's). Published to the lanes exchange.
    #[arg(long, requires = "recipient")]
    pub priority: Option<Priority>,
    /// Tenant: its recipients are counted apart from other tenants', and its
    /// overrides of policies and caps apply.
    #[arg(long, requires = "recipient")]
    pub tenant: Option<String>,
    /// Sender (1 to 128 characters: a from-number, a sending domain): limits with
    /// `per = "sender"` keep a bucket per sender.
    #[arg(long, requires = "recipient")]
    pub sender: Option<String>,
    /// Cost (1 to 100): what the job takes of the limits it meets; unset: its
    /// channel's `cost`.
    #[arg(long, requires = "recipient", value_parser = clap::value_parser!(u8).range(1..=100))]
    pub cost: Option<u8>,
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
        not_before: args.not_before,
        collapse_key: args.collapse_key,
        priority: args.priority,
        tenant: args.tenant,
        digest_key: None,
        fallback: None,
        sender: args.sender,
        cost: args.cost,
        payload: args.payload,
        extra: Default::default(),
    };
    check_channel(settings, &job.channel).map_err(anyhow::Error::msg)?;
    let producer = quota_worker::producer::from_settings(settings).await?;
    let id = producer.publish(&job).await?;
    println!("{id}");
    producer.close().await;
    Ok(ExitCode::SUCCESS)
}

/// A job ready to publish: its id, its body, and where it goes (exchange and
/// routing key: the lanes exchange for a job with a `priority`).
struct Checked {
    id: JobId,
    body: Vec<u8>,
    to: (String, String),
}

/// One input line, checked.
fn check_line(settings: &Settings, producer: &Producer, line: &str) -> Result<Checked, String> {
    let job: Job = serde_json::from_str(line).map_err(|e| format!("not a job: {e}"))?;
    check_channel(settings, &job.channel)?;
    let (id, body) = producer.encode(&job).map_err(|e| e.to_string())?;
    let (exchange, key) = producer.destination(&job);
    Ok(Checked {
        id,
        body,
        to: (exchange.to_string(), key),
    })
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
const UNCONFIRMED: usize = 64;

/// A line's job sent: the line, the job's id, and its confirm.
struct Sent {
    line: usize,
    id: JobId,
    result: Result<(), quota_worker::producer::ProducerError>,
}

async fn send(producer: &Producer, line: usize, job: Checked) -> Sent {
    let Checked { id, body, to } = job;
    let result = producer.publish_to(&to.0, &to.1, &id, &body).await;
    Sent { line, id, result }
}

async fn publish_lines(settings: &Settings, strict: bool) -> anyhow::Result<ExitCode> {
    let producer = quota_worker::producer::from_settings(settings).await?;
    let stop = stop_on_signal();
    if std::io::stdin().is_terminal() {
        eprintln!("reading jobs as JSON lines from stdin (end with Ctrl-D)");
    }
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let bar = progress_bar();
    let mut bad = 0usize;
    let mut checked: Vec<(usize, Checked)> = Vec::new();
    let mut confirms = Confirms::new(&bar);
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
            Ok(job) if strict => checked.push((n, job)),
            Ok(job) => {
                confirms.push(send(&producer, n, job)).await;
                if confirms.failure.is_some() {
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
    for (n, job) in checked {
        if confirms.failure.is_some() || stop.is_cancelled() {
            interrupted |= stop.is_cancelled();
            break;
        }
        confirms.push(send(&producer, n, job)).await;
    }
    let failure = confirms.finish().await;
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

/// Publishes awaiting their confirm, at most [`UNCONFIRMED`]; each id is printed once
/// confirmed, in input order. The first failure is kept (what follows it is not
/// printed as published).
struct Confirms<'a, F: std::future::Future<Output = Sent>> {
    unconfirmed: FuturesOrdered<F>,
    bar: &'a ProgressBar,
    failure: Option<anyhow::Error>,
}

impl<'a, F: std::future::Future<Output = Sent>> Confirms<'a, F> {
    fn new(bar: &'a ProgressBar) -> Self {
        Confirms {
            unconfirmed: FuturesOrdered::new(),
            bar,
            failure: None,
        }
    }

    /// Add a publish, waiting for confirms while [`UNCONFIRMED`] are out.
    async fn push(&mut self, publish: F) {
        self.unconfirmed.push_back(publish);
        while self.unconfirmed.len() >= UNCONFIRMED {
            self.next().await;
        }
    }

    async fn next(&mut self) {
        let Some(Sent { line, id, result }) = self.unconfirmed.next().await else {
            return;
        };
        let printed = result
            .map_err(|e| anyhow::Error::new(e).context(format!("line {line}")))
            .and_then(|()| Ok(writeln!(std::io::stdout(), "{id}")?));
        match printed {
            Ok(()) => self.bar.inc(1),
            Err(e) => {
                self.failure.get_or_insert(e);
            }
        }
    }

    /// Wait for every confirm; the first failure, if any.
    async fn finish(mut self) -> Option<anyhow::Error> {
        while !self.unconfirmed.is_empty() {
            self.next().await;
        }
        self.failure
    }
}
