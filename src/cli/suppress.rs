//! `admin recipient R suppress|unsuppress --channel C`, and how suppressions and a
//! job's feedback print.

use std::process::ExitCode;

use anyhow::bail;
use quota_worker::admin::{suppressions, SuppressionInfo};
use quota_worker::config::Settings;
use quota_worker::feedback::FeedbackNote;
use quota_worker::quota::suppression::Kind;
use quota_worker::store::QuotaStore;

use super::print_json;

/// `bounced`, `complained` or `unsubscribed`.
pub fn parse_kind(word: &str) -> Result<Kind, String> {
    Kind::parse(word).ok_or_else(|| format!("`{word}`: one of bounced, complained, unsubscribed"))
}

/// Suppress recipient `r` on `channel` (`--channel`, required) by `kind`, or
/// (`None`) lift its suppression there; `json`: print JSON.
pub async fn edit(
    store: &QuotaStore,
    settings: &Settings,
    r: &str,
    channel: Option<&str>,
    json: bool,
    kind: Option<Kind>,
) -> anyhow::Result<ExitCode> {
    let Some(channel) = channel else {
        bail!("--channel is required to suppress or unsuppress");
    };
    match kind {
        Some(event) => {
            let s = suppressions::suppress(store, settings, r, channel, event).await?;
            if json {
                print_json(&s)?;
            } else {
                print(std::slice::from_ref(&s));
            }
        }
        None => {
            let had = suppressions::unsuppress(store, r, channel).await?;
            if json {
                print_json(&serde_json::json!({ "channel": channel, "removed": had }))?;
            } else if had {
                println!("suppression on channel {channel} removed");
            } else {
                println!("the recipient was not suppressed on channel {channel}; nothing changed");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Print suppressions, one a line.
pub fn print(list: &[SuppressionInfo]) {
    for s in list {
        println!(
            "suppressed on {} by `{}` since {}, {}",
            s.channel,
            s.event,
            s.since.to_rfc3339(),
            s.until.map_or("until removed".to_string(), |u| format!(
                "until {}",
                u.to_rfc3339()
            ))
        );
    }
}

/// One feedback of a job, as `admin job` prints it.
pub fn feedback_line(f: &FeedbackNote) -> String {
    let mut line = format!("feedback:    {}", f.event);
    if let Some(at) = &f.at {
        line.push_str(&format!(" at {at}"));
    }
    if let Some(ms) = f.retry_after_ms {
        line.push_str(&format!(" (retry after {ms} ms)"));
    }
    if let Some(d) = &f.detail {
        line.push_str(&format!(": {d}"));
    }
    line
}
