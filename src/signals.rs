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
