//! `DELETE /v1/recipients/{recipient}` (`?tenant=T`, `?keep_suppression=true`):
//! the recipient erased everywhere ([`crate::erase`]), asked with
//! `http.api_token` as the preferences API is. Answers 200 with what was erased,
//! 400 for a `keep_suppression` other than `true` or `false`,
//! by store (`"nothing": true` for a recipient erased already); 503 when Redis or
//! the broker does not answer (run it again: an erase is idempotent). The action
//! log names the token's holder.

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::delete;
use axum::{Json, Router};
use tokio_util::sync::CancellationToken;

use super::reply::{error, query, query_given, refused};
use super::App;

/// The route.
pub(super) fn routes() -> Router<App> {
    Router::new().route("/v1/recipients/{recipient}", delete(erase))
}

async fn erase(
    State(app): State<App>,
    Path(recipient): Path<String>,
    uri: Uri,
    headers: HeaderMap,
) -> Response {
    let who = match app.api_guard.check(&headers) {
        Ok(who) => who.0,
        Err(refusal) => return refused(&refusal),
    };
    let Some(reloader) = app.status.reloader() else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "the worker is not connected to Redis yet",
            None,
        );
    };
    let (store, settings) = (reloader.store().clone(), reloader.settings());
    // given empty (`?keep_suppression=`), it is neither: refused as any other
    let keep_suppression = match query_given(&uri, "keep_suppression").as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => {
            let why = "keep_suppression is true or false";
            return error(StatusCode::BAD_REQUEST, why, Some("keep_suppression"));
        }
    };
    let tenant = query(&uri, "tenant");
    let conn = match crate::amqp::connect_any(
        &settings.amqp_urls(),
        &settings.amqp.tls,
        "quota-worker erase",
        settings.amqp.publish_timeout.0,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "an erase could not reach the broker");
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "the broker did not answer",
                None,
            );
        }
    };
    let request = crate::erase::Request {
        recipient: &recipient,
        tenant: tenant.as_deref(),
        keep_suppression,
        who: &who,
    };
    let stop = CancellationToken::new();
    let done = crate::erase::erase(&store, &settings, &conn, &request, &stop).await;
    let _ = conn.close(200, "bye".into()).await;
    match done {
        Ok(erased) => (StatusCode::OK, Json(erased)).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "an erase failed; running it again completes it");
            error(
                StatusCode::SERVICE_UNAVAILABLE,
                &format!("the erase did not complete ({e}); run it again"),
                None,
            )
        }
    }
}
