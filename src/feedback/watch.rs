//! Whether admissions check suppressions: only once some recipient is suppressed.
//! [`watch`] asks Redis every [`POLL`] whether the key `prefix:suppressions`
//! exists (one `EXISTS` a poll, none per job); a worker that suppresses someone
//! turns its own check on at once, the others within a poll. The key is written
//! with the first suppression and never expires (a lapsed bounce leaves the check
//! on: one HGET per job); deleting it turns the check off everywhere. The same
//! poll reads `prefix:preferences`, written with the first recipient's preferences
//! (the preferences section of `src/admission/lua/`: one HMGET per job while it exists).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::redis::StoreError;
use crate::store::QuotaStore;

/// How often workers look for the key.
pub const POLL: Duration = Duration::from_millis(500);

/// Read the keys once and set the store's checks. Two commands sent at once, not
/// one pipeline: on a cluster the two keys live in different slots, and a
/// pipeline of both is refused (`CROSSSLOT`); on one node the multiplexed
/// connection still sends them together.
pub async fn refresh(store: &QuotaStore) -> Result<(), StoreError> {
    let (mut a, mut b) = (store.connection(), store.connection());
    let exists_cmd = |key: String| {
        let mut cmd = redis::cmd("EXISTS");
        cmd.arg(key);
        cmd
    };
    let (suppressions, preferences) = (
        exists_cmd(store.keys().suppressions_flag()),
        exists_cmd(store.keys().preferences_flag()),
    );
    let (exists, prefs): (bool, bool) = tokio::try_join!(
        suppressions.query_async(&mut a),
        preferences.query_async(&mut b),
    )?;
    store.check_suppressions(exists);
    store.check_preferences(prefs);
    Ok(())
}

/// Keep the store's check up to date until `stop`.
pub async fn watch(store: Arc<QuotaStore>, stop: CancellationToken) {
    let mut warned = false;
    loop {
        match refresh(&store).await {
            Ok(()) => warned = false,
            Err(e) if !warned => {
                tracing::warn!(error = %e, "could not read whether suppressions exist; retrying");
                warned = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}
