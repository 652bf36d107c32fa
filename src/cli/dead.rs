//! `quota-worker admin dead`: list, show, replay and purge the dead letters, printed
//! as tables or `--json`; a walk interrupted by a signal exits with
//! [`EXIT_INTERRUPTED`].

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;

use anyhow::bail;
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args, Subcommand};
use lapin::message::Delivery;

use super::{amqp, print_json, stop_on_signal, EXIT_INTERRUPTED};
use quota_worker::admin::dead_index::{self, Filter};
use quota_worker::admin::{self, DeadLetterInfo, DeadLetters, Selection, WalkAction};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;

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

pub(super) fn age(seconds: Option<i64>) -> String {
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

pub(super) async fn dead(settings: &Settings, command: DeadCommand) -> anyhow::Result<ExitCode> {
    let conn = amqp(settings).await?;
    let topology = Topology::from_settings(settings);
    let walk = Walk {
        letters: DeadLetters::new(&conn, &topology, settings.amqp.publish_timeout.0),
        now: Utc::now(),
        queue: &settings.amqp.dead_queue,
    };
    let code = match command {
        DeadCommand::List { reason, json } => walk.list(reason, json).await?,
        DeadCommand::Show { id, json } => walk.show(&id, json).await?,
        DeadCommand::Replay { selection, json } => {
            let (code, replayed) = walk
                .replay(&selection, json, &settings.amqp.jobs_exchange)
                .await?;
            forget_in_index(settings, &conn, &replayed).await;
            code
        }
        DeadCommand::Purge { selection, yes } => {
            if !yes && !walk.confirm_purge(&selection).await? {
                eprintln!("nothing purged");
                return Ok(ExitCode::FAILURE);
            }
            let (code, purged) = walk.purge(&selection).await?;
            forget_in_index(settings, &conn, &purged).await;
            code
        }
    };
    let _ = conn.close(200, "bye".into()).await;
    Ok(code)
}

/// Take the dead letters a replay or a purge walked out of the console's index
/// (caught up with the dead-letter log first, so none comes back from it): each
/// by its job id and reason. The queue is what counts: an index that cannot be
/// reached is said on stderr and left as it is.
async fn forget_in_index(settings: &Settings, conn: &lapin::Connection, walked: &[DeadLetterInfo]) {
    if settings.console.dead_index == 0 || walked.is_empty() {
        return;
    }
    let forgotten = async {
        let store = super::store(settings).await?;
        admin::dead_log::catch_up(conn, &store, settings).await?;
        let (redis, keys) = (store.connection(), store.keys());
        let mut chosen = Vec::new();
        for d in walked {
            let Some(id) = &d.id else { continue };
            let filter = Filter {
                id: Some(id.clone()),
                reason: Some(d.reason.clone()),
                ..Filter::default()
            };
            chosen.extend(dead_index::select(&redis, keys, &filter).await?);
        }
        chosen.sort();
        chosen.dedup();
        dead_index::forget(&redis, keys, &chosen).await?;
        anyhow::Ok(())
    };
    if let Err(e) = forgotten.await {
        eprintln!("the console's dead-letter index still lists what was walked: {e:#}");
    }
}

/// What every `admin dead` command walks: the dead letters, read at one instant,
/// in one queue.
struct Walk<'a> {
    letters: DeadLetters<'a>,
    now: DateTime<Utc>,
    queue: &'a str,
}

impl Walk<'_> {
    /// The dead letter a delivery holds, its body and properties left out unless
    /// `full`.
    fn read(&self, d: &Delivery, full: bool) -> DeadLetterInfo {
        DeadLetterInfo::read(&d.properties, &d.data, self.now, full)
    }

    /// `admin dead list`.
    async fn list(&self, reason: Vec<String>, json: bool) -> anyhow::Result<ExitCode> {
        let stop = stop_on_signal();
        let filter = Selection {
            reasons: reason,
            ids: vec![],
        };
        let mut seen = Vec::new();
        let report = self
            .letters
            .walk(&stop, |d| {
                let letter = self.read(d, false);
                if filter.matches(&letter) {
                    seen.push(letter);
                }
                WalkAction::Keep
            })
            .await?;
        if json {
            print_json(&seen)?;
        } else {
            print_list(&seen);
            eprintln!(
                "{} of {} dead letter(s) in `{}` listed; all kept, in order",
                seen.len(),
                report.visited,
                self.queue
            );
        }
        walk_note(&report);
        Ok(interrupted_or_ok(&report))
    }

    /// `admin dead show`.
    async fn show(&self, id: &str, json: bool) -> anyhow::Result<ExitCode> {
        let stop = stop_on_signal();
        let mut seen = Vec::new();
        let report = self
            .letters
            .walk(&stop, |d| {
                if self.read(d, false).id.as_deref() == Some(id) {
                    seen.push(self.read(d, true));
                }
                WalkAction::Keep
            })
            .await?;
        walk_note(&report);
        if seen.is_empty() {
            bail!("no dead letter with id `{id}` in `{}`", self.queue);
        }
        if json {
            print_json(&seen)?;
        } else {
            for d in &seen {
                print_letter(d)?;
            }
        }
        Ok(interrupted_or_ok(&report))
    }

    /// `admin dead replay`: the selection published again to `exchange`.
    async fn replay(
        &self,
        selection: &SelectionArgs,
        json: bool,
        exchange: &str,
    ) -> anyhow::Result<(ExitCode, Vec<DeadLetterInfo>)> {
        let stop = stop_on_signal();
        let sel = selection.selection();
        let mut replayed = Vec::new();
        let report = self
            .letters
            .walk(&stop, |d| {
                let letter = self.read(d, false);
                if sel.matches(&letter) {
                    replayed.push(letter);
                    WalkAction::Replay
                } else {
                    WalkAction::Keep
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
                "{} replayed to `{exchange}`, {} kept in `{}`",
                report.replayed, report.kept, self.queue
            );
        }
        walk_note(&report);
        Ok((interrupted_or_ok(&report), replayed))
    }

    /// Whether the operator, asked on the terminal, confirms the purge of the
    /// selection (an error without a terminal).
    async fn confirm_purge(&self, selection: &SelectionArgs) -> anyhow::Result<bool> {
        let there = self.letters.count().await?;
        if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
            bail!("refusing to purge without a terminal to confirm on; pass --yes");
        }
        eprint!(
            "Delete {} from `{}` ({there} dead letter(s) there now)? This cannot be undone. [y/N] ",
            selection.describe(),
            self.queue
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
    }

    /// `admin dead purge`, once confirmed.
    async fn purge(
        &self,
        selection: &SelectionArgs,
    ) -> anyhow::Result<(ExitCode, Vec<DeadLetterInfo>)> {
        // after the prompt, so that Ctrl-C at the prompt still quits at once
        let stop = stop_on_signal();
        let sel = selection.selection();
        let mut purged = Vec::new();
        let report = self
            .letters
            .walk(&stop, |d| {
                let letter = self.read(d, false);
                if sel.matches(&letter) {
                    purged.push(letter);
                    WalkAction::Drop
                } else {
                    WalkAction::Keep
                }
            })
            .await?;
        println!(
            "purged {} dead letter(s) from `{}`; {} kept",
            report.dropped, self.queue, report.kept
        );
        walk_note(&report);
        Ok((interrupted_or_ok(&report), purged))
    }
}

/// The listed dead letters as a table: id, reason, age, detail.
fn print_list(seen: &[DeadLetterInfo]) {
    let width = seen
        .iter()
        .map(|d| d.id.as_deref().unwrap_or("-").chars().count())
        .max()
        .unwrap_or(2)
        .clamp(2, 40);
    println!("{:<width$}  {:<16}  {:>7}  DETAIL", "ID", "REASON", "AGE");
    for d in seen {
        println!(
            "{:<width$}  {:<16}  {:>7}  {}",
            d.id.as_deref().unwrap_or("-"),
            d.reason,
            age(d.age_seconds),
            d.detail
        );
    }
}

/// One dead letter in full: headers, properties and body.
fn print_letter(d: &DeadLetterInfo) -> anyhow::Result<()> {
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
    Ok(())
}

fn interrupted_or_ok(report: &admin::WalkReport) -> ExitCode {
    if report.interrupted {
        ExitCode::from(EXIT_INTERRUPTED)
    } else {
        ExitCode::SUCCESS
    }
}
