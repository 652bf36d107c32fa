//! Readiness, as `/readyz` reports it: connected to the broker with the topology
//! declared, and Redis answering (watched every second even while no job asks it,
//! by reading the reset marker: [`crate::reset`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::OnReset;
use crate::store::QuotaStore;

/// Readiness, as `/readyz` reports it.
#[derive(Debug, Default)]
pub struct Health {
    /// Connected to the broker with the topology declared.
    pub broker: AtomicBool,
    /// The last Redis call succeeded.
    pub redis: AtomicBool,
    /// Redis resets seen, and the pause.
    pub resets: crate::reset::Resets,
}

impl Health {
    /// Broker and Redis both usable.
    pub fn ready(&self) -> bool {
        self.broker.load(Ordering::Relaxed) && self.redis.load(Ordering::Relaxed)
    }
}

/// Keep `health.redis` current even while no job is asking Redis anything, and
/// look for a Redis that lost its data each second ([`crate::reset`]).
pub(crate) async fn watch_redis(
    health: Arc<Health>,
    store: Arc<QuotaStore>,
    on_reset: OnReset,
    shutdown: CancellationToken,
) {
    loop {
        let check = health.resets.check(&store, on_reset);
        let up = matches!(
            tokio::time::timeout(Duration::from_secs(1), check).await,
            Ok(Ok(()))
        );
        crate::metrics::health(health.broker.load(Ordering::Relaxed), up);
        if health.redis.swap(up, Ordering::Relaxed) != up {
            if up {
                info!("redis is reachable");
            } else {
                warn!("redis is unreachable");
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
