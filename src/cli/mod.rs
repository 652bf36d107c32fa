//! The `publish` and `admin` subcommands: their arguments (clap) and what they
//! print (and the hidden `reference`, the command-line reference written from them). The binary's own modules (the library never prints); the work itself is
//! in [`quota_worker::producer`] and [`quota_worker::admin`].
//!
//! Output: tables for people, `--json` for scripts (stdout only ever holds the
//! answer; progress and warnings go to stderr). Exit codes: 0 done, 1 failed,
//! 2 done in part (`publish` skipped bad input lines), 130 interrupted.

pub mod admin;
mod dead;
mod digest;
pub mod preferences;
pub mod publish;
pub mod reference;
pub mod resume;
pub mod suppress;

use std::io::Write;

use anyhow::Context;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use quota_worker::amqp;
use quota_worker::config::{redact_url, Settings};
use quota_worker::store::QuotaStore;

/// Exit code: some input lines were bad (the others were published).
pub const EXIT_PARTIAL: u8 = 2;
/// Exit code: stopped by SIGINT/SIGTERM.
pub const EXIT_INTERRUPTED: u8 = 130;

pub(crate) fn parse_instant(s: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| format!("not an RFC 3339 instant such as 2026-12-01T00:00:00Z: {e}"))
}

pub(crate) fn parse_json(s: &str) -> Result<Value, String> {
    serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))
}

pub(crate) fn parse_zone(s: &str) -> Result<Tz, String> {
    s.parse::<Tz>()
        .map_err(|_| format!("`{s}` is not an IANA time zone (e.g. Europe/Paris)"))
}

pub(crate) async fn amqp(settings: &Settings) -> anyhow::Result<lapin::Connection> {
    let urls = settings.amqp_urls();
    amqp::connect_any(
        &urls,
        &settings.amqp.tls,
        "quota-worker admin",
        settings.amqp.publish_timeout.0,
    )
    .await
    .with_context(|| {
        let shown: Vec<String> = urls.iter().map(|u| redact_url(u)).collect();
        format!("connecting to {}", shown.join(" or "))
    })
}

pub(crate) async fn store(settings: &Settings) -> anyhow::Result<QuotaStore> {
    QuotaStore::connect(settings)
        .await
        .with_context(|| format!("connecting to Redis at {}", redact_url(&settings.redis.url)))
}

/// A token cancelled by the first SIGINT or SIGTERM: long commands stop between two
/// messages instead of dying in the middle of one.
pub(crate) fn stop_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    tokio::spawn(quota_worker::signals::on_terminate(token.clone()));
    token
}

pub(crate) fn print_json(v: &impl serde::Serialize) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, v)?;
    writeln!(out)?;
    Ok(())
}
