//! `admin recipient R [--tenant T] preferences set FILE|-` and `clear`: a
//! recipient's set edited from the command line, through the store code the HTTP
//! API uses ([`quota_worker::preferences::edit`]); and `admin preferences export
//! FILE` and `import FILE` (JSON lines, `-` for stdout/stdin, a progress bar on a
//! terminal for large files; [`quota_worker::preferences::files`]).

use std::io::{BufRead, BufWriter, IsTerminal, Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use indicatif::{ProgressBar, ProgressStyle};

use super::{print_json, store, EXIT_PARTIAL};
use quota_worker::config::Settings;
use quota_worker::preferences::edit::{self as stored, EditError};
use quota_worker::preferences::files::{self as preference_files, Imported};
use quota_worker::store::QuotaStore;

/// `admin recipient R preferences`: edit the recipient's set.
#[derive(Subcommand, Debug)]
pub enum EditCommand {
    /// Replace the recipient's set with the JSON set in FILE (`-`: stdin), checked
    /// whole as the HTTP API's PUT checks it: nothing is stored if it is refused.
    Set {
        /// The set's JSON (`-` for stdin).
        file: String,
    },
    /// Remove the recipient's set (every job of theirs is allowed again).
    Clear,
}

/// `admin preferences`: every stored set, out and in.
#[derive(Subcommand, Debug)]
pub enum TransferCommand {
    /// Write every stored set to FILE (`-`: stdout) as JSON lines, one object a
    /// line: {"recipient", "tenant", "preferences", "updated_at"}, sorted.
    Export {
        /// Where to write (`-` for stdout).
        file: String,
    },
    /// Store the sets of FILE (`-`: stdin), JSON lines as `export` writes them:
    /// every line is checked, bad ones reported by number and field (exit 2), the
    /// good ones stored with their `updated_at`.
    Import {
        /// What to read (`-` for stdin).
        file: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Bigger files than this get a progress bar (when stderr is a terminal).
const LARGE_BYTES: u64 = 1 << 20;
/// Exports of more sets than this get a progress bar (when stderr is a terminal).
const LARGE_SETS: u64 = 10_000;

fn bar(len: u64, template: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len).with_style(
        ProgressStyle::with_template(template)
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

fn read_set(file: &str) -> anyhow::Result<serde_json::Value> {
    let mut text = String::new();
    if file == "-" {
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading the set from stdin")?;
    } else {
        text = std::fs::read_to_string(file).with_context(|| format!("reading {file}"))?;
    }
    serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("refused, nothing stored: not JSON: {e}"))
}

/// `admin recipient R [--tenant T] preferences set|clear`.
pub async fn edit(
    store: &QuotaStore,
    recipient: &str,
    tenant: Option<&str>,
    json: bool,
    command: EditCommand,
) -> anyhow::Result<ExitCode> {
    let whose = match tenant {
        Some(t) => format!("`{recipient}` of tenant `{t}`"),
        None => format!("`{recipient}`"),
    };
    match command {
        EditCommand::Set { file } => {
            let value = read_set(&file)?;
            match stored::put(store, tenant, recipient, &value).await {
                Ok(set) if json => print_json(&set)?,
                Ok(set) => println!(
                    "stored the preferences of {whose} (updated_at {})",
                    set["updated_at"].as_str().unwrap_or("-")
                ),
                Err(EditError::Invalid(bad) | EditError::Conflict(bad)) => {
                    if json {
                        print_json(&serde_json::json!({"error": bad.error, "field": bad.field}))?;
                    }
                    anyhow::bail!(
                        "refused, nothing stored: field `{}`: {}",
                        bad.field,
                        bad.error
                    );
                }
                Err(EditError::Store(e)) => return Err(e.into()),
            }
        }
        EditCommand::Clear => {
            let existed = stored::delete(store, tenant, recipient).await?;
            if json {
                print_json(&serde_json::json!({ "removed": existed }))?;
            } else if existed {
                println!("removed the preferences of {whose}");
            } else {
                println!("{whose} had no preferences; nothing changed");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `admin preferences export|import`.
pub async fn transfer(settings: &Settings, command: TransferCommand) -> anyhow::Result<ExitCode> {
    let store = store(settings).await?;
    match command {
        TransferCommand::Export { file } => export(&store, &file).await,
        TransferCommand::Import { file, json } => import(&store, &file, json).await,
    }
}

async fn export(store: &QuotaStore, file: &str) -> anyhow::Result<ExitCode> {
    let keys = preference_files::keys(store).await?;
    let count = keys.len() as u64;
    let bar = if count > LARGE_SETS {
        bar(
            count,
            "{bar:40} {pos}/{len} sets read, {per_sec}, {eta} left",
        )
    } else {
        ProgressBar::hidden()
    };
    let lines = preference_files::export_lines(store, &keys, &|| bar.inc(1)).await?;
    bar.finish_and_clear();
    let out: Box<dyn Write> = if file == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(file).with_context(|| format!("creating {file}"))?)
    };
    let mut out = BufWriter::new(out);
    for line in &lines {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    eprintln!(
        "exported {} set(s){}",
        lines.len(),
        if file == "-" {
            String::new()
        } else {
            format!(" to {file}")
        }
    );
    Ok(ExitCode::SUCCESS)
}

async fn import(store: &QuotaStore, file: &str, json: bool) -> anyhow::Result<ExitCode> {
    if file == "-" && std::io::stdin().is_terminal() {
        eprintln!("reading sets as JSON lines from stdin (end with Ctrl-D)");
    }
    let (input, size): (Box<dyn BufRead + Send>, Option<u64>) = if file == "-" {
        (Box::new(std::io::BufReader::new(std::io::stdin())), None)
    } else {
        let f = std::fs::File::open(file).with_context(|| format!("opening {file}"))?;
        let size = f.metadata().ok().map(|m| m.len());
        (Box::new(std::io::BufReader::new(f)), size)
    };
    let bar = match size {
        Some(size) if size > LARGE_BYTES => bar(
            size,
            "{bar:40} {bytes}/{total_bytes} read, {bytes_per_sec}, {eta} left",
        ),
        _ => ProgressBar::hidden(),
    };
    let done: Imported = preference_files::import(store, input, &|n| bar.inc(n)).await?;
    bar.finish_and_clear();
    if json {
        print_json(&done)?;
    } else {
        for bad in &done.bad {
            let field = if bad.field.is_empty() {
                String::new()
            } else {
                format!(" field `{}`:", bad.field)
            };
            eprintln!("line {}:{field} {}", bad.line, bad.error);
        }
        println!(
            "imported {} set(s); {} bad line(s) skipped",
            done.stored,
            done.bad.len()
        );
    }
    Ok(if done.bad.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PARTIAL)
    })
}
