//! HTTP for operators: `/metrics` (Prometheus text), `/healthz` (the process is up)
//! and `/readyz` (broker connected with the topology declared, and Redis answering).
//!
//! The worker records metrics with the `metrics` crate wherever they happen;
//! [`crate::metrics::install_recorder`] installs the Prometheus recorder that
//! collects them, and the router renders its handle. Served on `http.listen` (default `127.0.0.1:9464`),
//! off with `http.enabled = false` or `quota-worker run --no-http`.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::worker::Health;

/// What the HTTP endpoint could not do.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The metrics recorder could not be built or installed.
    #[error("installing the metrics recorder: {0}")]
    Recorder(#[from] metrics_exporter_prometheus::BuildError),
    /// The listen address could not be bound.
    #[error("listening on {addr} (set http.listen, or turn HTTP off with http.enabled = false or --no-http): {source}")]
    Bind {
        /// The address.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
}

#[derive(Clone)]
struct AppState {
    metrics: Option<PrometheusHandle>,
    health: Arc<Health>,
}

/// The routes: `/metrics`, `/healthz`, `/readyz`. Without a handle, `/metrics`
/// answers 404.
pub fn router(metrics: Option<PrometheusHandle>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { metrics, health })
}

async fn render_metrics(State(state): State<AppState>) -> impl IntoResponse {
    match state.metrics {
        Some(handle) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            handle.render(),
        ),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "metrics are not recorded in this process\n".to_string(),
        ),
    }
}

async fn ready(State(state): State<AppState>) -> impl IntoResponse {
    let broker = state.health.broker.load(Ordering::Relaxed);
    let redis = state.health.redis.load(Ordering::Relaxed);
    let word = |up: bool| if up { "up" } else { "down" };
    let body = format!(
        "{}\nbroker: {}{}\nredis: {}{}\n",
        if broker && redis {
            "ready"
        } else {
            "not ready"
        },
        word(broker),
        if broker {
            ""
        } else {
            " (not connected, or the topology is not declared yet)"
        },
        word(redis),
        if redis {
            ""
        } else {
            " (the last call failed; jobs are held until it answers)"
        },
    );
    let status = if state.health.ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
}

/// Bind `addr`.
pub async fn bind(addr: &str) -> Result<TcpListener, HttpError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| HttpError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// Serve `router` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// What `quota-worker run` does: unless HTTP is off, install the recorder, bind
/// `http.listen` and serve in the background until `shutdown`. Binding happens
/// before this returns, so a taken port stops the worker at start.
pub async fn start(
    settings: &Settings,
    health: Arc<Health>,
    shutdown: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, HttpError> {
    if !settings.http.enabled {
        return Ok(None);
    }
    let listener = bind(&settings.http.listen).await?;
    let handle = crate::metrics::install_recorder()?;
    tracing::info!(listen = %settings.http.listen, "serving /metrics, /healthz and /readyz");
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = serve(listener, router(Some(handle), health), shutdown).await {
            tracing::warn!(error = %e, "the HTTP endpoint stopped");
        }
    })))
}
