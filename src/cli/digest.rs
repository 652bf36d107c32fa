//! `quota-worker admin digest ID [--json] [flush]`: one digest (docs/guide/digests.md),
//! shown or closed now; and the lines `admin recipient` prints for open digests.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::{print_json, store};
use quota_worker::admin::{DigestInfo, Digests, OpenDigest};
use quota_worker::config::Settings;

/// `admin digest`.
#[derive(Args, Debug)]
pub struct DigestArgs {
    /// The digest's id (`dg-…`, its message id).
    pub id: String,
    /// Print JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[allow(missing_docs)]
    #[command(subcommand)]
    pub action: Option<DigestAction>,
}

/// What to do to a digest (nothing: show it).
#[derive(Subcommand, Debug)]
pub enum DigestAction {
    /// Close it now: no item joins it from now on, and a running worker sends it
    /// within a moment (as one job, through the caps, windows and rate).
    Flush,
}

/// Run `admin digest`.
pub async fn digest(settings: &Settings, args: DigestArgs) -> anyhow::Result<ExitCode> {
    let store = store(settings).await?;
    let digests = Digests::new(&store);
    match args.action {
        None => {
            let d = digests.show(&args.id).await?;
            if args.json {
                print_json(&d)?;
            } else {
                print_digest(&d);
            }
        }
        Some(DigestAction::Flush) => {
            let done = digests.flush(&args.id).await?;
            if args.json {
                print_json(&done)?;
            } else {
                println!(
                    "digest `{}` closed at {} with {} item(s); a running worker sends it within a moment",
                    done.id,
                    done.at.to_rfc3339(),
                    done.count
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_digest(d: &DigestInfo) {
    let at =
        |t: Option<chrono::DateTime<chrono::Utc>>| t.map(|t| t.to_rfc3339()).unwrap_or("-".into());
    println!("digest:      {} ({})", d.id, d.state);
    println!(
        "group:       channel {}, key {}{}",
        d.channel,
        d.key,
        d.tenant
            .as_ref()
            .map(|t| format!(", tenant {t}"))
            .unwrap_or_default()
    );
    println!("category:    {}", d.category);
    println!("items:       {}", d.count);
    println!("opened:      {}", at(d.opened_at));
    println!("closes:      {}", at(d.closes_at));
    if let Some(s) = &d.settings {
        let max_window = s
            .max_window_ms
            .map(|ms| format!(", max_window {ms} ms"))
            .unwrap_or_default();
        println!(
            "settings:    {} {} ms{max_window}, max_items {}, keep {} ({})",
            s.mode, s.window_ms, s.max_items, s.keep, s.keep_from
        );
    }
    for id in &d.items {
        println!("  item {id}");
    }
}

/// The lines `admin recipient` prints for the recipient's open digests.
pub fn print_open(digests: &[OpenDigest]) {
    if digests.is_empty() {
        return;
    }
    println!("{} open digest(s):", digests.len());
    for d in digests {
        println!(
            "  {}  channel {}, key {}: {} item(s), {}, closes {}",
            d.id,
            d.channel,
            d.key,
            d.count,
            d.state,
            d.closes_at.map(|t| t.to_rfc3339()).unwrap_or("-".into())
        );
    }
}
