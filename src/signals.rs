//! One shutdown signal: SIGTERM or SIGINT cancels the token every loop watches.

use tokio_util::sync::CancellationToken;

/// Cancel `token` on the first SIGTERM or SIGINT.
pub async fn on_terminate(token: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    token.cancel();
}

/// Reload on every `SIGHUP` until `shutdown`, with the reloader `status` holds
/// (installed from the start: a SIGHUP before Redis is reachable is logged and
/// ignored, never the default action, which ends the process).
pub async fn on_hangup(
    status: std::sync::Arc<crate::status::Status>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
        tracing::warn!("no SIGHUP handler: reload with `quota-worker admin reload`");
        return;
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            Some(()) = hup.recv() => match status.reloader() {
                Some(reloader) => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    let _ = reloader.reload();
                }
                None => tracing::warn!("SIGHUP before the worker runs (waiting for Redis): nothing to reload"),
            },
        }
    }
}
