//! `admin preferences export` and `import`: every stored set out as JSON lines, and
//! lines back in ([`super::lines`]). Export finds the sets with
//! `SCAN` (on each primary of a cluster), never `KEYS`, and writes them sorted by
//! tenant and recipient, so exporting what an import wrote gives the same bytes.
//! Import checks every line with the parser the HTTP API uses, reports each bad
//! one by its number and field, and stores the good ones through the API's own
//! write ([`super::edit::write`]), keeping their `updated_at`.

use std::io::BufRead;

use serde::Serialize;

use super::edit::write;
use super::lines::{parse_line, write_line, Line};
use crate::admin::AdminError;
use crate::quota::window::from_millis;
use crate::redis::scan::{escape_glob, scan_match};
use crate::store::QuotaStore;

/// Sets read from Redis at once.
const IN_FLIGHT: usize = 64;

/// A line `import` refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BadLine {
    /// Its number, from 1.
    pub line: u64,
    /// The field (`preferences.channels.fax`; empty: the line as a whole).
    pub field: String,
    /// What is wrong.
    pub error: String,
}

/// What `import` did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Imported {
    /// Sets stored.
    pub stored: u64,
    /// Lines refused (nothing of them stored).
    pub bad: Vec<BadLine>,
}

/// Every stored set's key (`prefix:{tag}/prefs`), by `SCAN`.
pub async fn keys(store: &QuotaStore) -> Result<Vec<String>, AdminError> {
    let pattern = format!("{}:{{*}}/prefs", escape_glob(store.keys().prefix()));
    Ok(scan_match(&store.connection(), &pattern).await?)
}

/// A stored set as export reads it; `None` when the hash went since the scan, or
/// is not a set (nothing else ends in /prefs).
struct Stored {
    set: String,
    updated_at: i64,
    recipient: String,
    /// Its tenant (`None` for none).
    tenant: Option<String>,
}

async fn read_one(
    mut conn: crate::redis::RedisConn,
    key: String,
) -> Result<Option<Stored>, AdminError> {
    let (set, at, recipient, tenant): (_, _, _, Option<String>) = redis::cmd("HMGET")
        .arg(key)
        .arg("set")
        .arg("updated_at")
        .arg("recipient")
        .arg("tenant")
        .query_async(&mut conn)
        .await?;
    Ok(match (set, at, recipient) {
        (Some(set), Some(updated_at), Some(recipient)) => Some(Stored {
            set,
            updated_at,
            recipient,
            tenant: tenant.filter(|t| !t.is_empty()),
        }),
        _ => None,
    })
}

/// One exported line with what it is sorted by.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Exported {
    tenant: String,
    recipient: String,
    line: String,
}

/// The lines of the sets stored under `keys`, sorted by tenant then recipient;
/// `each` hears of every set read (a progress bar).
pub async fn export_lines(
    store: &QuotaStore,
    keys: &[String],
    each: &(dyn Fn() + Sync),
) -> Result<Vec<String>, AdminError> {
    let conn = store.connection();
    let mut rows: Vec<Exported> = Vec::with_capacity(keys.len());
    for chunk in keys.chunks(IN_FLIGHT) {
        let reads = chunk.iter().map(|k| read_one(conn.clone(), k.clone()));
        for got in futures_util::future::join_all(reads).await {
            each();
            // removed since the scan, or not a set (nothing else ends in /prefs)
            let Some(stored) = got? else {
                continue;
            };
            let Ok(set) = serde_json::from_str::<serde_json::Value>(&stored.set) else {
                continue;
            };
            let (recipient, tenant) = (stored.recipient, stored.tenant);
            let at = from_millis(stored.updated_at);
            let line = write_line(&recipient, tenant.as_deref(), &set, at);
            rows.push(Exported {
                tenant: tenant.unwrap_or_default(),
                recipient,
                line,
            });
        }
    }
    rows.sort();
    Ok(rows.into_iter().map(|r| r.line).collect())
}

/// Read `input` line by line (blank lines skipped), check each, store the good
/// ones (an `updated_at` kept as it is; without one, Redis time now), up to
/// 64 at once; `each` hears of the bytes of every line read (a progress
/// bar). Two lines for the same recipient and tenant end as a sequential import
/// would: the later one stored.
pub async fn import(
    store: &QuotaStore,
    input: impl BufRead + Send,
    each: &(dyn Fn(u64) + Sync),
) -> Result<Imported, AdminError> {
    let rules = store.rules();
    let known = |ch: &str| rules.channel(ch).is_some();
    let mut done = Imported::default();
    let mut batch: Vec<Line> = Vec::with_capacity(IN_FLIGHT);
    for (n, text) in input.lines().enumerate() {
        let text = text.map_err(|e| AdminError::Invalid(format!("reading line {}: {e}", n + 1)))?;
        each(text.len() as u64 + 1);
        if text.trim().is_empty() {
            continue;
        }
        match parse_line(&text, &known) {
            Ok(line) => {
                batch.push(line);
                done.stored += 1;
                if batch.len() == IN_FLIGHT {
                    store_batch(store, &mut batch).await?;
                }
            }
            Err(bad) => done.bad.push(BadLine {
                line: n as u64 + 1,
                field: bad.field,
                error: bad.error,
            }),
        }
    }
    store_batch(store, &mut batch).await?;
    Ok(done)
}

/// Store the lines of `batch` at once (of two for the same recipient and tenant,
/// the later), and empty it.
async fn store_batch(store: &QuotaStore, batch: &mut Vec<Line>) -> Result<(), AdminError> {
    let mut last = std::collections::HashMap::new();
    for (i, line) in batch.iter().enumerate() {
        last.insert((line.tenant.as_deref(), line.recipient.as_str()), i);
    }
    let writes = batch
        .iter()
        .enumerate()
        .filter(|(i, line)| last[&(line.tenant.as_deref(), line.recipient.as_str())] == *i)
        .map(|(_, line)| {
            let at = line
                .updated_at
                .unwrap_or_else(|| store.redis_now())
                .timestamp_millis();
            write(
                store,
                line.tenant.as_deref(),
                &line.recipient,
                &line.preferences,
                at,
            )
        });
    for result in futures_util::future::join_all(writes).await {
        result?;
    }
    batch.clear();
    Ok(())
}
