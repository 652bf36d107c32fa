//! HTTP for operators: `/` (the status page), `/status.json` (what it shows),
//! `/metrics` (Prometheus text), `/healthz` (the process is up), `/readyz` (broker
//! connected with the topology declared, and Redis answering) and `POST /reload`
//! (re-read the configuration, as SIGHUP does; `quota-worker admin reload`). The
//! mutating endpoints ask for an admin token (`http.admin_token`, or one of
//! `http.admin_tokens`, [`guard`]), and log who used it. The recipients'
//! preferences API (`/v1/recipients/{recipient}/preferences`, `preferences.rs`)
//! asks for `http.api_token` on every method; its OpenAPI 3.1 description
//! (`/v1/openapi.json`, [`openapi`]) is public. The operators' console
//! (`/console`, [`crate::console`]) asks for `http.admin_token` as `POST /reload` does.
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
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Settings;
use crate::health::Health;
use crate::status::Status;

mod erase;
pub mod guard;
pub mod openapi;
mod preferences;
mod reply;

pub use guard::Guard;

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

/// What the routes serve from.
#[derive(Clone)]
pub struct App {
    /// The recorder's handle; `None`: `/metrics` answers 404.
    pub metrics: Option<PrometheusHandle>,
    /// Broker and Redis readiness, as `/readyz` answers it.
    pub health: Arc<Health>,
    /// The status page's state (with the reloader once the store is connected).
    pub status: Arc<Status>,
    /// Who may call the mutating endpoints.
    pub guard: Guard,
    /// Who may call the preferences API (`http.api_token`).
    pub api_guard: Guard,
}

/// The routes: `/metrics`, `/healthz`, `/readyz`, `/`, `/status.json`, `POST
/// /reload` (open, as on a loopback listener without a token). Without a handle,
/// `/metrics` answers 404.
pub fn router(metrics: Option<PrometheusHandle>, health: Arc<Health>) -> Router {
    app(App {
        metrics,
        health,
        status: Arc::default(),
        guard: Guard::Open,
        api_guard: Guard::Open,
    })
}

/// [`router`] on `app`.
pub fn app(app: App) -> Router {
    let console = crate::console::router(crate::console::Console::new(
        app.status.clone(),
        app.health.clone(),
        app.guard.clone(),
    ));
    let mutating = Router::new().route("/reload", post(reload)).route_layer(
        axum::middleware::from_fn_with_state(app.guard.clone(), guard::require),
    );
    Router::new()
        .route("/", get(page))
        .route("/status.json", get(status_json))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .merge(mutating)
        .merge(preferences::routes())
        .merge(erase::routes())
        .route(openapi::OPENAPI_PATH, get(openapi::serve))
        .with_state(app)
        .merge(console)
}

/// The status page: one HTML document with its script and style inline (no
/// external assets), drawing `/status.json` every 5 s.
async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        include_str!("../status/page.html"),
    )
}

async fn status_json(State(app): State<App>) -> impl IntoResponse {
    (
        [(header::CACHE_CONTROL, "no-store")],
        axum::Json(app.status.report(&app.health)),
    )
}

async fn reload(
    State(app): State<App>,
    who: Option<axum::Extension<guard::Who>>,
) -> impl IntoResponse {
    let who = who.map_or_else(|| guard::LOOPBACK.to_string(), |w| w.0 .0);
    tracing::info!(who, action = "reload", "http");
    let text = |code, body: String| {
        (
            code,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            body,
        )
    };
    let Some(reloader) = app.status.reloader().cloned() else {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the worker is not running yet (waiting for Redis): nothing to reload\n".into(),
        );
    };
    match tokio::task::spawn_blocking(move || reloader.reload()).await {
        Ok(Ok(changes)) if changes.is_empty() => text(
            StatusCode::OK,
            "applied: no policy or channel changed\n".into(),
        ),
        Ok(Ok(changes)) => text(StatusCode::OK, format!("applied: {}\n", changes.join("; "))),
        Ok(Err(e @ crate::reload::ReloadError::NeedsRestart(_))) => {
            text(StatusCode::CONFLICT, format!("refused: {e}\n"))
        }
        Ok(Err(e)) => text(StatusCode::UNPROCESSABLE_ENTITY, format!("refused: {e}\n")),
        Err(e) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reload failed: {e}\n"),
        ),
    }
}

async fn render_metrics(State(state): State<App>) -> impl IntoResponse {
    match state.metrics {
        Some(handle) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            {
                crate::metrics::process_collector().collect();
                handle.render()
            },
        ),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            "metrics are not recorded in this process\n".to_string(),
        ),
    }
}

async fn ready(State(state): State<App>) -> impl IntoResponse {
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
    status: Arc<Status>,
    shutdown: CancellationToken,
) -> Result<Option<tokio::task::JoinHandle<()>>, HttpError> {
    if !settings.http.enabled {
        return Ok(None);
    }
    let listener = bind(&settings.http.listen).await?;
    let handle = crate::metrics::install_recorder()?;
    tokio::spawn(crate::status::sample(status.clone(), shutdown.clone()));
    tracing::info!(listen = %settings.http.listen, "serving / (status), /console, /metrics, /healthz, /readyz, POST /reload, the preferences API and /v1/openapi.json");
    let guard = Guard::new(&settings.http);
    if matches!(guard, Guard::Refused) {
        tracing::warn!(listen = %settings.http.listen, "POST /reload and the console answer 403: http.listen is not loopback and no admin token is set (http.admin_token, http.admin_tokens)");
    }
    let app = App {
        metrics: Some(handle),
        health,
        status,
        guard,
        api_guard: Guard::api(&settings.http),
    };
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = serve(listener, self::app(app), shutdown).await {
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
    ask(addr, "GET", path, timeout).await.map(|(code, _)| code)
}

/// `method path` on the worker at `addr` with an empty body: the status code and
/// the body (read to the end: the request says `Connection: close`), within
/// `timeout`.
pub async fn ask(
    addr: SocketAddr,
    method: &str,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    ask_as(addr, method, path, None, timeout).await
}

/// [`ask`], with `Authorization: Bearer <token>` when a token is given (the
/// mutating endpoints ask for `http.admin_token`).
pub async fn ask_as(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&secrecy::SecretString>,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    use secrecy::ExposeSecret;
    use std::io::{Error, ErrorKind};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authorization = token
        .map(|t| format!("Authorization: Bearer {}\r\n", t.expose_secret()))
        .unwrap_or_default();
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut all = Vec::new();
        stream.read_to_end(&mut all).await?;
        let text = String::from_utf8_lossy(&all);
        // "HTTP/1.1 200 OK", headers, a blank line, the body
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .ok_or_else(|| Error::new(ErrorKind::InvalidData, "not an HTTP response"))?;
        let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Ok((code, body.to_string()))
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| Error::new(ErrorKind::TimedOut, format!("no answer within {timeout:?}")))?
}
