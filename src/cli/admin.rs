//! `quota-worker admin`: queues, dead letters (list, show, replay, purge),
//! recipients, and one job (explain, cancel), printed as tables or `--json`.

use std::process::ExitCode;

use anyhow::Context;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::{Args, Subcommand};

use super::{amqp, parse_instant, parse_zone, print_json, store};
use quota_worker::admin::recipients::{CapStatus, PolicyStatus, RuleStatus};
use quota_worker::admin::{
    self, JobStatus, Jobs, RecipientQuery, RecipientStatus, Recipients, Recorded,
};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::fallback::log::StepOutcome;
use quota_worker::job::note::{JobNote, JobState, Place};
use quota_worker::quota::suppression::Kind;

use super::dead::{age, dead, DeadCommand};

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
    /// One job by its id: where it is, until when it waits and why; or cancel it.
    Job(JobArgs),
    /// Every recipient's preferences out to a file and in from one (JSON lines).
    #[allow(missing_docs)]
    Preferences {
        #[command(subcommand)]
        command: super::preferences::TransferCommand,
    },
    /// One digest by its id (`dg-…`): its group, items and when it closes; or
    /// close it now.
    Digest(super::digest::DigestArgs),
    /// Ask the running worker (on http.listen) to read its configuration again and
    /// apply changed policies, rules, windows and channel rates (as SIGHUP does).
    Reload {
        /// Ask this address instead of http.listen.
        #[arg(long)]
        addr: Option<std::net::SocketAddr>,
        /// Send the admin token of this name (`admin`: http.admin_token; else a name
        /// of http.admin_tokens), which the worker's log names. Default:
        /// http.admin_token, else the only one of http.admin_tokens.
        #[arg(long = "as", value_name = "NAME")]
        holder: Option<String>,
    },
    /// Every limit and quota with its state: the bucket of a limit counted for all,
    /// a tenant's or sender's bucket when asked for, else how many are in use.
    Limits {
        /// Show this tenant's bucket of the limits and quotas counted per tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Show this sender's bucket of the limits and quotas counted per sender.
        #[arg(long)]
        sender: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// After Redis lost its data with `redis.on_reset = "pause"`: let every worker
    /// decide the jobs it holds again (of policies with rules or not required;
    /// deletes the pause mark in Redis;
    /// each worker sees it within a second).
    Resume {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

/// `admin job`.
#[derive(Args, Debug)]
pub struct JobArgs {
    /// The job id.
    pub id: String,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[allow(missing_docs)]
    #[command(subcommand)]
    pub action: Option<JobAction>,
}

/// What to do to a job (nothing: explain it).
#[derive(Subcommand, Debug)]
pub enum JobAction {
    /// Make the waiting job end as a dead letter `cancelled` (replayable) the next
    /// time a worker handles it, wherever it waits.
    Cancel,
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
    /// The recipient's zone (default: the zone of its waiting jobs, as their notes
    /// say; else worker.default_timezone).
    #[arg(long, global = true, value_parser = parse_zone)]
    pub timezone: Option<Tz>,
    /// The recipient's tenant, as jobs carry it (default: no tenant).
    #[arg(long, global = true)]
    pub tenant: Option<String>,
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
    /// Forget the recipient everywhere: recorded sends, preferences, suppressions,
    /// collapse keys, waiting set, open digests' items, dead letters; its waiting
    /// jobs are dropped unsent. Answers with what it erased, by store.
    Erase {
        /// Keep its suppressions (a tombstone keyed by its keyed hash), so that a
        /// bounced or complained address stays suppressed.
        #[arg(long)]
        keep_suppression: bool,
    },
    /// Suppress the recipient on `--channel` (its jobs are dead-lettered
    /// `suppressed` by the policies held by that kind).
    Suppress {
        /// `bounced` (for suppression.bounced_ttl), `complained` or `unsubscribed`.
        #[arg(long, value_parser = super::suppress::parse_kind)]
        event: Kind,
    },
    /// Lift the recipient's suppression on `--channel`.
    Unsuppress,
    /// Edit the recipient's own preferences (as the HTTP API does).
    #[allow(missing_docs)]
    Preferences {
        #[command(subcommand)]
        command: super::preferences::EditCommand,
    },
}

/// Run an `admin` subcommand.
pub async fn admin(settings: &Settings, command: AdminCommand) -> anyhow::Result<ExitCode> {
    match command {
        AdminCommand::Queues { json } => queues(settings, json).await,
        AdminCommand::Dead { command } => dead(settings, command).await,
        AdminCommand::Recipient(args) => recipient(settings, args).await,
        AdminCommand::Job(args) => job(settings, args).await,
        AdminCommand::Preferences { command } => {
            super::preferences::transfer(settings, command).await
        }
        AdminCommand::Digest(args) => super::digest::digest(settings, args).await,
        AdminCommand::Reload { addr, holder } => reload(settings, addr, holder.as_deref()).await,
        AdminCommand::Resume { json } => super::resume::resume(settings, json).await,
        AdminCommand::Limits {
            tenant,
            sender,
            json,
        } => limits(settings, admin::limits::LimitQuery { tenant, sender }, json).await,
    }
}

/// `admin limits`: a row per limit and quota.
async fn limits(
    settings: &Settings,
    q: admin::limits::LimitQuery,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let store = store(settings).await?;
    let rows = admin::limits::limits(&store, &q).await?;
    if json {
        print_json(&rows)?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        println!("no limits or quotas are configured");
    }
    for r in rows {
        let state = match (&r.bucket, r.available, r.in_use) {
            (Some(b), Some(a), _) => {
                let mut s = format!("{b}: {a} of {} available now", r.capacity);
                if let Some(at) = &r.full_at {
                    s.push_str(&format!(", full again at {at}"));
                }
                if let Some(p) = &r.paused_until {
                    s.push_str(&format!(", throttled until {p}"));
                }
                s
            }
            (_, _, Some(n)) => format!("{n} buckets in use (--{} to see one)", r.per),
            _ => String::new(),
        };
        println!("{}  {}", r.rule, state);
    }
    Ok(ExitCode::SUCCESS)
}

/// The admin token `admin reload` sends: the one named `holder`; without a name,
/// `http.admin_token`, else the only one of `http.admin_tokens`; none when none is
/// set.
fn admin_token<'a>(
    settings: &'a Settings,
    holder: Option<&str>,
) -> anyhow::Result<Option<&'a secrecy::SecretString>> {
    let tokens = settings.http.admin_tokens();
    let Some(holder) = holder else {
        if tokens.len() > 1 && settings.http.admin_token.is_none() {
            anyhow::bail!(
                "several admin tokens are set (http.admin_tokens): say whose with --as NAME"
            );
        }
        return Ok(tokens.first().map(|(_, t)| *t));
    };
    match tokens.into_iter().find(|(name, _)| name == holder) {
        Some((_, token)) => Ok(Some(token)),
        None => anyhow::bail!(
            "no admin token is named `{holder}` (`admin` is http.admin_token; the others are the names in http.admin_tokens)"
        ),
    }
}

/// `admin reload`: POST /reload to the running worker, with an admin token when
/// one is set ([`admin_token`]); 0 when applied, 2 when refused (the worker says
/// why: a bad configuration, or 401/403 for the token), 1 when it cannot be asked.
async fn reload(
    settings: &Settings,
    addr: Option<std::net::SocketAddr>,
    holder: Option<&str>,
) -> anyhow::Result<ExitCode> {
    let token = admin_token(settings, holder)?;
    let addr = match addr {
        Some(addr) => addr,
        None if !settings.http.enabled => {
            anyhow::bail!("HTTP is off (http.enabled = false): send the worker SIGHUP instead")
        }
        None => quota_worker::http::local_address(&settings.http.listen)?,
    };
    let timeout = std::time::Duration::from_secs(10);
    let (code, body) = quota_worker::http::ask_as(addr, "POST", "/reload", token, timeout)
        .await
        .with_context(|| format!("asking the worker on {addr} to reload (is it running?)"))?;
    match code {
        200 => {
            print!("{body}");
            Ok(ExitCode::SUCCESS)
        }
        _ => {
            eprint!("{body}");
            Ok(ExitCode::from(2))
        }
    }
}

async fn job(settings: &Settings, args: JobArgs) -> anyhow::Result<ExitCode> {
    let store = store(settings).await?;
    let jobs = Jobs::new(&store, settings);
    match args.action {
        None => {
            let status = jobs.explain(&args.id).await?;
            if args.json {
                print_json(&status)?;
            } else {
                print_job(&status, settings.redis.notes);
            }
        }
        Some(JobAction::Cancel) => {
            let done = jobs.cancel(&args.id).await?;
            if args.json {
                print_json(&done)?;
            } else {
                println!(
                    "job `{}` {} at {}; it ends as a dead letter `cancelled` the next time a worker handles it (every worker knows within {} ms)",
                    done.id,
                    if done.already { "was cancelled already" } else { "cancelled" },
                    done.at.to_rfc3339(),
                    done.known_within_ms
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_place(place: &Place, record: Option<&JobNote>, now: DateTime<Utc>) -> String {
    let until = record.and_then(|r| match &r.step {
        JobState::Delayed { until, .. } => Some(*until),
        _ => None,
    });
    match place {
        Place::DelayQueue { queue } => format!(
            "in the delay queue `{queue}`, waiting until {} (in {})",
            until.map(|t| t.to_rfc3339()).unwrap_or_default(),
            age(until.map(|t| (t - now).num_seconds()))
        ),
        Place::JobsQueue { since } => format!(
            "back in the jobs queue since {} ({} ago), waiting for a worker",
            since.to_rfc3339(),
            age(Some((now - *since).num_seconds()))
        ),
        Place::Dead => "in the dead-letter queue (unless replayed or purged since)".into(),
        Place::Dispatched => "dispatched".into(),
        Place::Superseded => "superseded: acked unsent".into(),
        Place::Digest { digest, closes_at } => format!(
            "in the digest `{digest}`, sent with it when it closes at {} (`admin digest {digest}`)",
            closes_at.to_rfc3339()
        ),
        Place::Unknown => "unknown: no record (sent at its first handling, still in the jobs queue for the first time, or its record expired)".into(),
    }
}

/// A routed job's steps, and its pending escalation.
fn print_route(s: &JobStatus) {
    for e in &s.route {
        let what = match e.outcome {
            StepOutcome::Dispatched => "dispatched",
            StepOutcome::Answered => "answered: its escalation sent nothing more",
        };
        let left = e
            .left
            .as_deref()
            .map(|l| format!(" (left {l})"))
            .unwrap_or_default();
        println!(
            "route:       step {}/{} on {} at {}: {what}{left}",
            e.step,
            e.of,
            e.channel,
            e.at.to_rfc3339()
        );
    }
    if let Some(at) = s.escalates_at {
        println!(
            "escalates:   at {} unless answered (`admin job {} cancel` cancels it)",
            at.to_rfc3339(),
            s.id
        );
    }
}

fn print_job(s: &JobStatus, notes: bool) {
    println!("job:         {}", s.id);
    println!(
        "where:       {}",
        print_place(&s.place, s.record.as_ref(), s.now)
    );
    if !notes && s.record.is_none() {
        println!("notes:       off (`redis.notes = false`): the workers note no job");
    }
    if let Some(at) = s.cancelled_at {
        println!(
            "cancelled:   at {} (ends as a dead letter `cancelled` when a worker next handles it)",
            at.to_rfc3339()
        );
    }
    for f in &s.feedback {
        println!("{}", super::suppress::feedback_line(f));
    }
    print_route(s);
    let Some(r) = &s.record else { return };
    println!(
        "since:       {} ({} ago)",
        r.at.to_rfc3339(),
        age(Some((s.now - r.at).num_seconds()))
    );
    match &r.step {
        JobState::Delayed {
            cause,
            held_by,
            sends_seen,
            ..
        } => {
            let seen = sends_seen
                .map(|n| format!("; saw {n} send(s) of the recipient remembered"))
                .unwrap_or_default();
            println!("held by:     {held_by} ({cause}{seen})");
        }
        JobState::Dead { reason, detail } => println!("dead:        {reason}: {detail}"),
        JobState::Dispatched => println!("dispatched:  after waiting"),
        JobState::Superseded { by } => println!("superseded:  by job `{by}`"),
        JobState::Folded { digest, .. } => println!("folded:      into the digest `{digest}`"),
    }
    println!(
        "policy:      {}, channel {}",
        r.policy.as_deref().unwrap_or("-"),
        r.channel
    );
    println!(
        "handled:     {} time(s) before; first seen {}",
        r.attempt,
        r.first_seen.to_rfc3339()
    );
    if let Some(t) = &r.trace_id {
        println!("trace:       {t}");
    }
}

async fn queues(settings: &Settings, json: bool) -> anyhow::Result<ExitCode> {
    let conn = amqp(settings).await?;
    let topology = Topology::from_settings(settings);
    let mut stats = admin::queue_stats(&conn, &topology).await?;
    if !topology.laned.is_empty() {
        let store = store(settings).await?;
        admin::tenants_waiting(&conn, &store, &topology, (&mut stats, usize::MAX)).await?;
    }
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
        if let Some(t) = q.tenants.as_ref().filter(|t| t.waiting > 0) {
            let top: Vec<String> = t.top.iter().map(|(n, c)| format!("{n} {c}")).collect();
            println!(
                "  tenants waiting: {} (most: {})",
                t.waiting,
                top.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn recipient(settings: &Settings, args: RecipientArgs) -> anyhow::Result<ExitCode> {
    let store = store(settings).await?;
    if let Some(RecipientAction::Preferences { command }) = args.action {
        return super::preferences::edit(
            &store,
            &args.recipient,
            args.tenant.as_deref(),
            args.json,
            command,
        )
        .await;
    }
    if let Some(RecipientAction::Erase { keep_suppression }) = args.action {
        return erase(settings, &store, &args, keep_suppression).await;
    }
    let recipients = Recipients::new(&store, settings);
    let (tz, zone_from) = recipients.zone(&args.recipient, args.timezone).await?;
    let query = RecipientQuery {
        recipient: &args.recipient,
        category: args.category.as_deref(),
        channel: args.channel.as_deref(),
        tz,
        tenant: args.tenant.as_deref(),
    };
    match args.action {
        None => {
            let mut status = recipients.status(&query).await?;
            status.timezone_from = Some(zone_from);
            if args.json {
                print_json(&status)?;
            } else {
                print_status(&status);
            }
        }
        Some(RecipientAction::Record { at, id }) => {
            let id = id.unwrap_or_else(|| format!("imported-{}", uuid::Uuid::now_v7()));
            let recorded = recipients.import_send(&query, at, &id).await?;
            if args.json {
                print_json(&recorded)?;
            } else {
                print_recorded(&recorded, tz);
            }
        }
        Some(action @ (RecipientAction::Suppress { .. } | RecipientAction::Unsuppress)) => {
            let kind = match action {
                RecipientAction::Suppress { event } => Some(event),
                _ => None,
            };
            return super::suppress::edit(
                &store,
                settings,
                &args.recipient,
                args.channel.as_deref(),
                args.json,
                kind,
            )
            .await;
        }
        Some(RecipientAction::Preferences { .. } | RecipientAction::Erase { .. }) => {
            unreachable!("handled above")
        }
        Some(RecipientAction::Reset) => {
            let deleted = recipients
                .reset(&args.recipient, args.tenant.as_deref())
                .await?;
            if args.json {
                print_json(&serde_json::json!({ "deleted_keys": deleted }))?;
            } else {
                println!("deleted {deleted} key(s): the recipient has no recorded sends");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `admin recipient R erase`: the action log names the system user who ran it.
async fn erase(
    settings: &Settings,
    store: &quota_worker::store::QuotaStore,
    args: &RecipientArgs,
    keep_suppression: bool,
) -> anyhow::Result<ExitCode> {
    let conn = amqp(settings).await?;
    let who = format!(
        "cli:{}",
        std::env::var("USER").unwrap_or_else(|_| "unknown".into())
    );
    let request = quota_worker::erase::Request {
        recipient: &args.recipient,
        tenant: args.tenant.as_deref(),
        keep_suppression,
        who: &who,
    };
    let stop = super::stop_on_signal();
    let erased = quota_worker::erase::erase(store, settings, &conn, &request, &stop).await;
    let _ = conn.close(200, "bye".into()).await;
    let erased = erased?;
    if args.json {
        print_json(&erased)?;
    } else {
        print_erased(&erased);
    }
    Ok(if erased.interrupted {
        ExitCode::from(super::EXIT_INTERRUPTED)
    } else {
        ExitCode::SUCCESS
    })
}

fn print_erased(e: &quota_worker::erase::Erased) {
    if e.interrupted {
        eprintln!("interrupted during the dead-letter walk: run the erase again to complete it");
    }
    if e.nothing {
        println!(
            "nothing to erase for recipient {}: it was erased already or never known",
            e.recipient_tag
        );
        return;
    }
    println!(
        "erased recipient {} at {}:",
        e.recipient_tag,
        e.at.to_rfc3339()
    );
    for (store, n) in &e.keys {
        println!("  {store:<16} {n} key(s)");
    }
    println!(
        "  waiting jobs     {} (dropped unsent when they come back)",
        e.waiting_jobs
    );
    println!(
        "  open digests     {} ({} item(s), never sent)",
        e.open_digests, e.digest_items
    );
    println!("  dead letters     {}", e.dead_letters);
    println!("  dead-letter index {} entry(ies)", e.dead_index_entries);
    if !e.kept.is_empty() {
        println!(
            "  kept             {} (keyed by the hash only)",
            e.kept.join(", ")
        );
    }
}

/// A send imported by `admin recipient record`, or why nothing changed.
fn print_recorded(recorded: &Recorded, tz: Tz) {
    if !recorded.added {
        println!(
            "job `{}` was already recorded under policy `{}`; nothing changed",
            recorded.id, recorded.policy
        );
        return;
    }
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
}

fn print_status(s: &RecipientStatus) {
    let from = s
        .timezone_from
        .as_ref()
        .map(|f| format!(", {f}"))
        .unwrap_or_default();
    println!(
        "recipient {}{} (zone {}{from}), Redis time {}",
        s.recipient_tag,
        s.tenant
            .as_ref()
            .map(|t| format!(" of tenant {t}"))
            .unwrap_or_default(),
        s.timezone,
        s.now.to_rfc3339()
    );
    match s.waiting {
        Some(n) => println!("{n} job(s) waiting in the delay ladder"),
        None => println!("waiting jobs not counted (`redis.notes = false`)"),
    }
    super::suppress::print(&s.suppressions);
    super::digest::print_open(&s.digests);
    for p in &s.policies {
        print_policy(p);
    }
    for c in &s.caps {
        print_cap(c);
    }
}

/// `, channel C`, or nothing for a count across channels.
fn channel_suffix(channel: &Option<String>) -> String {
    channel
        .as_ref()
        .map(|c| format!(", channel {c}"))
        .unwrap_or_default()
}

/// Each rule's count against its limit.
fn print_rules(rules: &[RuleStatus]) {
    for r in rules {
        println!(
            "  {:>3} of {:<3} per {:<6}{}",
            r.count,
            r.limit,
            r.window,
            if r.full { "  full" } else { "" }
        );
    }
}

/// One policy's rules, recorded sends, send windows and next allowed instant.
fn print_policy(p: &PolicyStatus) {
    println!(
        "\npolicy {}{} (refused jobs: {})",
        p.policy,
        channel_suffix(&p.channel),
        p.action
    );
    if p.rules.is_empty() {
        println!("  no caps");
    }
    print_rules(&p.rules);
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
    for w in &p.send_windows {
        println!("  send windows of the {w}");
    }
    print_next(&p.next_allowed);
}

/// One cap's rules, recorded sends and next allowed instant.
fn print_cap(c: &CapStatus) {
    println!("\ncap {}{} ({})", c.cap, channel_suffix(&c.channel), c.mode);
    print_rules(&c.rules);
    println!("  {} recorded send(s)", c.sends.len());
    print_next(&c.next_allowed);
}

fn print_next(next: &Option<quota_worker::admin::recipients::NextAllowed>) {
    match next {
        None => println!("  next allowed: never (a limit of 0, or windows never open together)"),
        Some(n) if n.now => println!("  next allowed: now"),
        Some(n) => println!("  next allowed: {} ({})", n.local, n.utc.to_rfc3339()),
    }
}
