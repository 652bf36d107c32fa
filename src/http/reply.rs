//! What the API's routes answer with, said once: the error body `{"error", "field"}`,
//! the refusal of a request the guard turned away (with `WWW-Authenticate` on a 401),
//! and a field of the query string.

use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::guard::Refusal;

/// `{"error", "field"}` with `status`.
pub(super) fn error(status: StatusCode, error: &str, field: Option<&str>) -> Response {
    let body = match field {
        Some(f) => json!({ "error": error, "field": f }),
        None => json!({ "error": error }),
    };
    (status, Json(body)).into_response()
}

/// The answer to a request the API guard refused: 403 when the API may not be
/// opened at all, else 401 naming the token to send.
pub(super) fn refused(refusal: &Refusal) -> Response {
    let message = match refusal.status {
        StatusCode::FORBIDDEN => "http.listen is not loopback and http.api_token is not set",
        _ => "send `Authorization: Bearer <http.api_token>`",
    };
    let mut response = error(refusal.status, message, None);
    if refusal.status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            axum::http::header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"quota-worker\""),
        );
    }
    response
}

/// Field `name` of the query string, percent-decoded (none when empty).
pub(super) fn query(uri: &Uri, name: &str) -> Option<String> {
    query_given(uri, name).filter(|t| !t.is_empty())
}

/// The value of query parameter `name` as given, an empty one included
/// (`?name=`: `Some("")`).
pub(super) fn query_given(uri: &Uri, name: &str) -> Option<String> {
    let query = uri.query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}
