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
use quota_worker::admin::dead_select::{self, Prints};
use quota_worker::admin::{self, dead_action, DeadLetterInfo, DeadLetters, WalkAction};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::store::QuotaStore;

/// Which dead letters a command reads: every flag given must match (one of the
/// reasons and one of the ids given, when repeated).
#[derive(Args, Debug, Clone, Default)]
pub struct FilterArgs {
    /// Only dead letters with this reason (repeat for several).
    #[arg(long)]
    pub reason: Vec<String>,
    /// Only the dead letter(s) with this job id (repeat for several).
    #[arg(long)]
    pub id: Vec<String>,
    /// Only jobs of this policy (as the rules in force name it).
    #[arg(long)]
    pub policy: Option<String>,
    /// Only jobs on this channel.
    #[arg(long)]
    pub channel: Option<String>,
    /// Only jobs to this recipient (of `--tenant`'s, or of no tenant).
    #[arg(long)]
    pub recipient: Option<String>,
    /// Only jobs of this tenant.
    #[arg(long)]
    pub tenant: Option<String>,
    /// Only those dead-lettered at or after this instant (RFC 3339).
    #[arg(long)]
    pub since: Option<DateTime<Utc>>,
    /// Only those dead-lettered before this instant (RFC 3339).
    #[arg(long)]
    pub until: Option<DateTime<Utc>>,
}

/// Which dead letters an action takes: a filter, or all.
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("selection").required(true).multiple(true).args(
    ["reason", "id", "policy", "channel", "recipient", "tenant", "since", "until", "all"]
)))]
pub struct SelectionArgs {
    #[command(flatten)]
    #[allow(missing_docs)]
    pub filter: FilterArgs,
    /// Every dead letter.
    #[arg(long, conflicts_with_all = ["reason", "id", "policy", "channel", "recipient", "tenant", "since", "until"])]
    pub all: bool,
}

impl FilterArgs {
    /// Whether matching needs what the body says of its job (the rules, Redis).
    fn needs_job(&self) -> bool {
        self.policy.is_some()
            || self.channel.is_some()
            || self.recipient.is_some()
            || self.tenant.is_some()
    }

    /// The filters, one per reason and id given (any of them selects).
    fn filters(&self, store: Option<&QuotaStore>) -> Vec<Filter> {
        let recipient_tag = self.recipient.as_ref().and_then(|r| {
            let keys = store?.keys().for_tenant(self.tenant.as_deref());
            Some(keys.recipient_tag(r))
        });
        let base = Filter {
            policy: self.policy.clone(),
            channel: self.channel.clone(),
            recipient_tag,
            tenant: self.tenant.clone(),
            since: self.since,
            until: self.until,
            ..Filter::default()
        };
        let some = |v: &[String]| -> Vec<Option<String>> {
            if v.is_empty() {
                vec![None]
            } else {
                v.iter().cloned().map(Some).collect()
            }
        };
        let mut out = Vec::new();
        for reason in some(&self.reason) {
            for id in some(&self.id) {
                out.push(Filter {
                    reason: reason.clone(),
                    id,
                    ..base.clone()
                });
            }
        }
        out
    }

    fn describe(&self, filters: &[Filter]) -> String {
        let words: Vec<String> = filters.iter().map(Filter::describe).collect();
        words.join(", or ")
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
        #[command(flatten)]
        filter: FilterArgs,
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
    let needs_job = match &command {
        DeadCommand::List { filter, .. } => filter.needs_job(),
        DeadCommand::Replay { selection, .. } | DeadCommand::Purge { selection, .. } => {
            selection.filter.needs_job()
        }
        DeadCommand::Show { .. } => false,
    };
    // (the rules, to decode a job's policy, and its recipient's tag; the index)
    let store = match super::store(settings).await {
        Ok(store) => Some(store),
        Err(e) if needs_job => return Err(e),
        Err(_) => None,
    };
    let walk = Walk {
        letters: DeadLetters::new(&conn, &topology, settings.amqp.publish_timeout.0),
        now: Utc::now(),
        queue: &settings.amqp.dead_queue,
        store: store.as_ref(),
        settings,
    };
    let code = match command {
        DeadCommand::List { filter, json } => walk.list(&filter, json).await?,
        DeadCommand::Show { id, json } => walk.show(&id, json).await?,
        DeadCommand::Replay { selection, json } => {
            let (code, replayed) = walk
                .replay(&selection, json, &settings.amqp.jobs_exchange)
                .await?;
            forget_in_index(settings, &conn, store.as_ref(), &replayed).await;
            code
        }
        DeadCommand::Purge { selection, yes } => {
            let (code, purged) = walk.purge(&selection, yes).await?;
            forget_in_index(settings, &conn, store.as_ref(), &purged).await;
            code
        }
    };
    let _ = conn.close(200, "bye".into()).await;
    Ok(code)
}

/// Take the dead letters a replay or a purge touched out of the console's index
/// (caught up with the dead-letter log first, so none comes back from it): each
/// by its print. The queue is what counts: an index that cannot be reached is
/// said on stderr and left as it is.
async fn forget_in_index(
    settings: &Settings,
    conn: &lapin::Connection,
    store: Option<&QuotaStore>,
    touched: &[String],
) {
    if settings.console.dead_index == 0 || touched.is_empty() {
        return;
    }
    let forgotten = async {
        let store = store.ok_or_else(|| anyhow::anyhow!("Redis could not be reached"))?;
        admin::dead_log::catch_up(conn, store, settings).await?;
        dead_action::forget_prints(&store.connection(), store.keys(), touched).await?;
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
    store: Option<&'a QuotaStore>,
    settings: &'a Settings,
}

/// One walk of the dead letters: its report, the letters it touched, and their
/// prints.
struct Walked {
    report: admin::WalkReport,
    touched: Vec<DeadLetterInfo>,
    prints: Vec<String>,
}

impl Walk<'_> {
    /// The dead letter a delivery holds, its body and properties left out unless
    /// `full`.
    fn read(&self, d: &Delivery, full: bool) -> DeadLetterInfo {
        DeadLetterInfo::read(&d.properties, &d.data, self.now, full)
    }

    /// Whether one of `filters` selects the delivery (the same predicate as the
    /// console's: [`Filter::matches`] on the letter's entry).
    fn selects(&self, filters: &[Filter], d: &Delivery) -> bool {
        let known = match self.store {
            Some(store) => dead_select::known(&d.data, store, &self.settings.worker),
            None => Default::default(),
        };
        let entry = dead_index::entry(&d.properties, &d.data, known, self.now);
        filters.iter().any(|f| f.matches(&entry))
    }

    /// `admin dead list`.
    async fn list(&self, filter: &FilterArgs, json: bool) -> anyhow::Result<ExitCode> {
        let stop = stop_on_signal();
        let filters = filter.filters(self.store);
        let mut seen = Vec::new();
        let report = self
            .letters
            .walk(&stop, |d| {
                if self.selects(&filters, d) {
                    seen.push(self.read(d, false));
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

    fn filters(&self, selection: &SelectionArgs) -> Vec<Filter> {
        if selection.all {
            vec![Filter::default()]
        } else {
            selection.filter.filters(self.store)
        }
    }

    /// Walk once, doing `action` to what `choose` selects: the letters touched,
    /// and their prints ([`Walked`]).
    async fn act<F>(&self, action: WalkAction, mut choose: F) -> anyhow::Result<Walked>
    where
        F: FnMut(&Delivery) -> bool,
    {
        let stop = stop_on_signal();
        let (mut touched, mut prints) = (Vec::new(), Vec::new());
        let report = self
            .letters
            .walk(&stop, |d| {
                if choose(d) {
                    touched.push(self.read(d, false));
                    prints.push(dead_select::print(&d.properties, &d.data));
                    action
                } else {
                    WalkAction::Keep
                }
            })
            .await?;
        Ok(Walked {
            report,
            touched,
            prints,
        })
    }

    /// `admin dead replay`: what the selection selects as the walk reads it,
    /// published again to `exchange`; the prints replayed.
    async fn replay(
        &self,
        selection: &SelectionArgs,
        json: bool,
        exchange: &str,
    ) -> anyhow::Result<(ExitCode, Vec<String>)> {
        let filters = self.filters(selection);
        let Walked {
            report,
            touched: replayed,
            prints,
        } = self
            .act(WalkAction::Replay, |d| self.selects(&filters, d))
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
        Ok((interrupted_or_ok(&report), prints))
    }

    /// The letters the selection selects now, read by a walk that keeps them all:
    /// each with its print.
    async fn preview(&self, filters: &[Filter]) -> anyhow::Result<Vec<(DeadLetterInfo, String)>> {
        let stop = stop_on_signal();
        let mut seen = Vec::new();
        let report = self
            .letters
            .walk(&stop, |d| {
                if self.selects(filters, d) {
                    let print = dead_select::print(&d.properties, &d.data);
                    seen.push((self.read(d, false), print));
                }
                WalkAction::Keep
            })
            .await?;
        if report.interrupted {
            bail!("interrupted while reading what to purge; nothing purged");
        }
        Ok(seen)
    }

    /// Whether the operator, shown the letters `seen` (by reason, and the first
    /// ones), confirms their purge on the terminal (an error without one).
    fn confirm_purge(
        &self,
        described: &str,
        seen: &[(DeadLetterInfo, String)],
    ) -> anyhow::Result<bool> {
        if !std::io::stdin().is_terminal() || !std::io::stderr().is_terminal() {
            bail!("refusing to purge without a terminal to confirm on; pass --yes");
        }
        let mut reasons: Vec<(&str, usize)> = Vec::new();
        for (d, _) in seen {
            match reasons.iter_mut().find(|(r, _)| *r == d.reason) {
                Some((_, n)) => *n += 1,
                None => reasons.push((&d.reason, 1)),
            }
        }
        eprintln!(
            "{} dead letter(s) in `{}` selected by {described}:",
            seen.len(),
            self.queue
        );
        for (r, n) in &reasons {
            eprintln!("  {n:>6}  {r}");
        }
        let first: Vec<DeadLetterInfo> = seen.iter().take(20).map(|(d, _)| d.clone()).collect();
        print_list(&first);
        if seen.len() > first.len() {
            eprintln!("and {} more", seen.len() - first.len());
        }
        eprint!(
            "Delete exactly these {} (not those arriving meanwhile)? This cannot be undone. [y/N] ",
            seen.len()
        );
        std::io::stderr().flush()?;
        let mut answer = String::new();
        std::io::stdin().lock().read_line(&mut answer)?;
        Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
    }

    /// `admin dead purge`: with `--yes`, what the selection selects as the walk
    /// reads it; else what a first walk read and the operator confirmed, exactly
    /// (by their prints); the prints purged.
    async fn purge(
        &self,
        selection: &SelectionArgs,
        yes: bool,
    ) -> anyhow::Result<(ExitCode, Vec<String>)> {
        let filters = self.filters(selection);
        let Walked { report, prints, .. } = if yes {
            self.act(WalkAction::Drop, |d| self.selects(&filters, d))
                .await?
        } else {
            let seen = self.preview(&filters).await?;
            let described = if selection.all {
                "every dead letter".to_string()
            } else {
                selection.filter.describe(&filters)
            };
            if seen.is_empty() || !self.confirm_purge(&described, &seen)? {
                eprintln!("nothing purged");
                return Ok((ExitCode::FAILURE, Vec::new()));
            }
            let mut wanted = Prints::of(seen.iter().map(|(_, p)| p.as_str()));
            let outcome = self
                .act(WalkAction::Drop, |d| {
                    wanted.take(&dead_select::print(&d.properties, &d.data))
                })
                .await?;
            if wanted.left() > 0 {
                eprintln!(
                    "{} of those confirmed were no longer in `{}`",
                    wanted.left(),
                    self.queue
                );
            }
            outcome
        };
        println!(
            "purged {} dead letter(s) from `{}`; {} kept",
            report.dropped, self.queue, report.kept
        );
        walk_note(&report);
        Ok((interrupted_or_ok(&report), prints))
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
