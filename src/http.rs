//! HTTP for operators: `/metrics` (Prometheus text), `/healthz` (the process is up)
//! and `/readyz` (broker connected with the topology declared, and Redis answering).
//!
//! The worker records metrics with the `metrics` crate wherever they happen;
//! [`install_recorder`] installs the Prometheus recorder that collects them, and the
//! router renders its handle. Served on `http.listen` (default `127.0.0.1:9464`),
//! off with `http.enabled = false` or `quota-worker run --no-http`.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
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

/// Upper bounds (seconds) of the admission latency histogram: one Redis round trip
/// is well under a millisecond on a LAN; pacing waits can take seconds.
pub const ADMISSION_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Upper bounds (seconds) of the whole-job latency histogram.
pub const JOB_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

fn builder() -> Result<PrometheusBuilder, HttpError> {
    Ok(PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full("quota_worker_admission_seconds".into()),
            ADMISSION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("quota_worker_admission_call_seconds".into()),
            ADMISSION_BUCKETS,
        )?
        .set_buckets_for_metric(
            Matcher::Full("quota_worker_job_seconds".into()),
            JOB_BUCKETS,
        )?)
}

/// A recorder that is not installed globally, and its handle (tests).
pub fn local_recorder() -> Result<
    (
        metrics_exporter_prometheus::PrometheusRecorder,
        PrometheusHandle,
    ),
    HttpError,
> {
    let recorder = builder()?.build_recorder();
    let handle = recorder.handle();
    Ok((recorder, handle))
}

/// Install the Prometheus recorder for the whole process, describe the worker's
/// metrics, and return the handle `/metrics` renders. Call once, before the worker
/// starts. Spawns the recorder's periodic upkeep (needs a Tokio runtime).
pub fn install_recorder() -> Result<PrometheusHandle, HttpError> {
    let handle = builder()?.install_recorder()?;
    describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// Describe every metric the worker records, and register the error counters at 0
/// so that dashboards see them before the first error.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "quota_worker_jobs_total",
        "Jobs settled, by outcome (dispatched, delayed, duplicate, dead) and dead-letter reason"
    );
    describe_histogram!(
        "quota_worker_admission_seconds",
        Unit::Seconds,
        "Time to decide a job in Redis (caps and send rate, pacing waits included)"
    );
    describe_histogram!(
        "quota_worker_admission_call_seconds",
        Unit::Seconds,
        "Time of one admission script call to Redis (one call decides a batch of jobs), from sending it to its reply"
    );
    describe_histogram!(
        "quota_worker_admission_batch_jobs",
        "Jobs decided by one admission script call"
    );
    describe_histogram!(
        "quota_worker_job_seconds",
        Unit::Seconds,
        "Time from delivery to a confirmed outcome"
    );
    describe_gauge!("quota_worker_in_flight", "Deliveries being processed now");
    describe_counter!(
        "quota_worker_redis_errors_total",
        "Redis calls that failed (the job is held and retried)"
    );
    describe_counter!(
        "quota_worker_broker_errors_total",
        "Broker sessions that ended in an error"
    );
    describe_counter!(
        "quota_worker_reconnects_total",
        "Reconnections to the broker"
    );
    for name in [
        "quota_worker_redis_errors_total",
        "quota_worker_broker_errors_total",
        "quota_worker_reconnects_total",
    ] {
        metrics::counter!(name).absolute(0);
    }
    metrics::gauge!("quota_worker_in_flight").set(0.0);
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
    let handle = install_recorder()?;
    tracing::info!(listen = %settings.http.listen, "serving /metrics, /healthz and /readyz");
    Ok(Some(tokio::spawn(async move {
        if let Err(e) = serve(listener, router(Some(handle), health), shutdown).await {
            tracing::warn!(error = %e, "the HTTP endpoint stopped");
        }
    })))
}
