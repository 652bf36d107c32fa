//! The recipient's dead letters: dropped from the dead-letter queue by one walk
//! of it ([`crate::admin::DeadLetters::walk`]: every other dead letter is put back,
//! in order), and its entries taken out of the console's index (caught up with
//! the dead-letter log first, so that none comes back from it). The log itself (a
//! stream) cannot drop one entry: it keeps every dead letter
//! `console.dead_log_max_age`.

use tokio_util::sync::CancellationToken;

use crate::admin::dead_index::{self, Filter};
use crate::admin::{dead_log, AdminError, DeadLetters, WalkAction};
use crate::amqp::Topology;
use crate::config::{Settings, WorkerSettings};
use crate::job::decode;
use crate::store::QuotaStore;

/// Whether dead letter `body` is a job of `recipient` under `tenant`.
fn is_of(body: &[u8], w: &WorkerSettings, recipient: &str, tenant: Option<&str>) -> bool {
    // a digest's body carries its items: room for them, as the worker gives it
    let max = w
        .max_body_bytes
        .saturating_mul(crate::quota::digest::MAX_KEEP as usize + 2);
    decode::decode(body, max, w.default_timezone)
        .is_ok_and(|job| job.recipient == recipient && job.tenant.as_deref() == tenant)
}

/// Drop the recipient's dead letters from the queue; how many. `stop` ends the
/// walk between two messages (what is not visited stays).
pub async fn purge_queue(
    conn: &lapin::Connection,
    settings: &Settings,
    (recipient, tenant): (&str, Option<&str>),
    stop: &CancellationToken,
) -> Result<(u64, bool), AdminError> {
    let topology = Topology::from_settings(settings);
    let letters = DeadLetters::new(conn, &topology, settings.amqp.publish_timeout.0);
    let report = letters
        .walk(stop, |d| {
            if is_of(&d.data, &settings.worker, recipient, tenant) {
                WalkAction::Drop
            } else {
                WalkAction::Keep
            }
        })
        .await?;
    Ok((report.dropped as u64, report.interrupted))
}

/// Forget the index's entries of the recipient whose tag is `tag`; how many.
/// Nothing with `console.dead_index = 0`.
pub async fn forget_in_index(
    conn: &lapin::Connection,
    store: &QuotaStore,
    settings: &Settings,
    tag: &str,
) -> Result<u64, AdminError> {
    if settings.console.dead_index == 0 {
        return Ok(0);
    }
    dead_log::catch_up(conn, store, settings).await?;
    let (redis, keys) = (store.connection(), store.keys());
    let filter = Filter {
        recipient_tag: Some(tag.to_string()),
        ..Filter::default()
    };
    let chosen = dead_index::select(&redis, keys, &filter).await?;
    dead_index::forget(&redis, keys, &chosen).await?;
    Ok(chosen.len() as u64)
}
