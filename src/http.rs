//! HTTP for operators: `/metrics` (Prometheus text), `/healthz` (the process is up)
//! and `/readyz` (broker connected with the topology declared, and Redis answering).
//!
//! The worker records metrics with the `metrics` crate wherever they happen;
//! [`crate::metrics::install_recorder`] installs the Prometheus recorder that
//! collects them, and the router renders its handle. Served on `http.listen` (default `127.0.0.1:9464`),
//! off with `http.enabled = false` or `quota-worker run --no-http`.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

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
        /// The address asked for.
        addr: String,
        /// What the operating system said.
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

/// Where a client on this machine reaches `http.listen`: an unspecified address
/// (`0.0.0.0`, `[::]`) is asked on loopback.
pub fn local_address(listen: &str) -> Result<SocketAddr, std::net::AddrParseError> {
    let mut addr: SocketAddr = listen.parse()?;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(addr)
}

/// `GET path` on the worker at `addr` (HTTP/1.1, no client library, so the image
/// needs no curl): the status code, within `timeout`.
pub async fn probe(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<u16> {
    use std::io::{Error, ErrorKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::new();
        let mut buf = [0u8; 256];
        while !head.contains(&b'\n') && head.len() < 4096 {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        // "HTTP/1.1 200 OK"
        let line = String::from_utf8_lossy(&head);
        line.split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "not an HTTP response"))
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| Error::new(ErrorKind::TimedOut, format!("no answer within {timeout:?}")))?
}
