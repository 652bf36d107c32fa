//! The recipients' preferences API: `PUT` (replace), `PATCH` (RFC 7386 merge),
//! `GET` (with `updated_at`; 404 when none) and `DELETE` (204) on
//! `/v1/recipients/{recipient}/preferences`, the recipient percent-encoded,
//! `?tenant=T` scoping it to a tenant. Every method asks for `http.api_token`
//! ([`Guard::api`]). Bad input is refused whole with 400 and
//! `{"error", "field"}`; a merge patch that leaves `quiet_hours.windows` to a stored
//! set that has none with 409 (it would apply to one that has them); a body over
//! 64 KiB with 413. Each answer is counted by
//! status (`quota_worker_preference_requests_total`).

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::Value;

use super::reply::{error, query, refused};
use super::App;
use crate::preferences::edit::{self as stored, EditError};
use crate::preferences::set::MAX_BYTES;

/// The routes, with their body limit.
pub(super) fn routes() -> Router<App> {
    Router::new()
        .route(
            "/v1/recipients/{recipient}/preferences",
            get(read).put(replace).patch(merge).delete(remove),
        )
        .layer(DefaultBodyLimit::max(MAX_BYTES))
}

fn counted(response: Response) -> Response {
    metrics::counter!(
        crate::metrics::PREFERENCE_REQUESTS_TOTAL,
        "status" => response.status().as_u16().to_string()
    )
    .increment(1);
    response
}

/// The `tenant` of the query string, percent-decoded.
fn tenant(uri: &Uri) -> Option<String> {
    query(uri, "tenant")
}

/// The guard's verdict, then the store (503 before it is connected).
fn authorize(
    app: &App,
    headers: &HeaderMap,
) -> Result<std::sync::Arc<crate::store::QuotaStore>, Box<Response>> {
    if let Err(refusal) = app.api_guard.check(headers) {
        return Err(Box::new(refused(&refusal)));
    }
    match app.status.reloader() {
        Some(r) => Ok(r.store().clone()),
        None => Err(Box::new(error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the worker is not connected to Redis yet",
            None,
        ))),
    }
}

fn redis_down(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "the preferences API could not reach Redis");
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "Redis did not answer",
        None,
    )
}

fn edited(result: Result<Value, EditError>) -> Response {
    match result {
        Ok(set) => (StatusCode::OK, Json(set)).into_response(),
        Err(EditError::Invalid(bad)) => {
            error(StatusCode::BAD_REQUEST, &bad.error, Some(&bad.field))
        }
        Err(EditError::Conflict(bad)) => error(StatusCode::CONFLICT, &bad.error, Some(&bad.field)),
        Err(EditError::Store(e)) => redis_down(e),
    }
}

fn body(bytes: &Bytes) -> Result<Value, Box<Response>> {
    serde_json::from_slice(bytes).map_err(|e| {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            &format!("not JSON: {e}"),
            Some(""),
        ))
    })
}

async fn read(
    State(app): State<App>,
    Path(recipient): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    counted(match authorize(&app, &headers) {
        Err(r) => *r,
        Ok(store) => match stored::get(&store, tenant(&uri).as_deref(), &recipient).await {
            Ok(Some(set)) => Json(set).into_response(),
            Ok(None) => error(
                StatusCode::NOT_FOUND,
                "no preferences for this recipient",
                None,
            ),
            Err(e) => redis_down(e),
        },
    })
}

async fn replace(
    State(app): State<App>,
    Path(recipient): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    counted(match (authorize(&app, &headers), body(&bytes)) {
        (Err(r), _) | (_, Err(r)) => *r,
        (Ok(store), Ok(value)) => {
            edited(stored::put(&store, tenant(&uri).as_deref(), &recipient, &value).await)
        }
    })
}

async fn merge(
    State(app): State<App>,
    Path(recipient): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    bytes: Bytes,
) -> Response {
    counted(match (authorize(&app, &headers), body(&bytes)) {
        (Err(r), _) | (_, Err(r)) => *r,
        (Ok(store), Ok(value)) => {
            edited(stored::patch(&store, tenant(&uri).as_deref(), &recipient, &value).await)
        }
    })
}

async fn remove(
    State(app): State<App>,
    Path(recipient): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    counted(match authorize(&app, &headers) {
        Err(r) => *r,
        Ok(store) => match stored::delete(&store, tenant(&uri).as_deref(), &recipient).await {
            Ok(_) => StatusCode::NO_CONTENT.into_response(),
            Err(e) => redis_down(e),
        },
    })
}
