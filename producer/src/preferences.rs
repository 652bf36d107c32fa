//! A small client for the worker's recipients' preferences API (feature
//! `preferences-client`): `GET`, `PUT`, `PATCH` (RFC 7386) and `DELETE` on
//! `/v1/recipients/{recipient}/preferences`, the recipient percent-encoded,
//! `?tenant=T` when a tenant is given, with `Authorization: Bearer <http.api_token>`.
//! Plain HTTP/1.1 through hyper, one connection a call: for a preference page's
//! backend next to the worker (put a TLS proxy in front of a worker elsewhere).
//!
//! ```no_run
//! use quota_worker_producer::preferences::PreferencesClient;
//! use serde_json::json;
//!
//! # async fn example() -> Result<(), quota_worker_producer::preferences::ClientError> {
//! let client = PreferencesClient::new("http://127.0.0.1:9464", Some("api-token".into()))?;
//! client.patch("+8613800000000", None, &json!({"categories": {"marketing": false}})).await?;
//! let set = client.get("+8613800000000", None).await?; // Some(set), with updated_at
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// What a call could not do.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The base URL is not `http://host:port`.
    #[error("not an http://host:port URL: {0}")]
    Url(String),
    /// The worker refused: its status and what it said (`field`: the set's field a
    /// 400 names).
    #[error("the worker answered {status}: {error}{}", .field.as_ref().map(|f| format!(" (field `{f}`)")).unwrap_or_default())]
    Refused {
        /// The HTTP status.
        status: u16,
        /// Its `error`.
        error: String,
        /// Its `field`, on a 400.
        field: Option<String>,
    },
    /// The connection failed.
    #[error("connecting to the worker: {0}")]
    Io(#[from] std::io::Error),
    /// HTTP failed.
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer was not the JSON expected.
    #[error("the answer is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The preferences API of one worker.
#[derive(Debug, Clone)]
pub struct PreferencesClient {
    authority: String,
    token: Option<String>,
    timeout: Duration,
}

/// `s` percent-encoded for a path segment or a query value (all but unreserved).
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

impl PreferencesClient {
    /// The API at `base` (`http://127.0.0.1:9464`: the worker's `http.listen`),
    /// with `http.api_token` when the worker asks for one. Calls time out after 10 s.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, ClientError> {
        let authority = base
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|a| !a.is_empty() && !a.contains('/'))
            .ok_or_else(|| ClientError::Url(base.to_string()))?;
        Ok(PreferencesClient {
            authority: authority.to_string(),
            token,
            timeout: Duration::from_secs(10),
        })
    }

    /// The same client with another timeout per call.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    fn path(recipient: &str, tenant: Option<&str>) -> String {
        let mut path = format!("/v1/recipients/{}/preferences", percent_encode(recipient));
        if let Some(t) = tenant {
            path.push_str("?tenant=");
            path.push_str(&percent_encode(t));
        }
        path
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, &Value)>,
    ) -> Result<(StatusCode, Bytes), ClientError> {
        let work = async {
            let stream = tokio::net::TcpStream::connect(&self.authority).await?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(conn);
            let mut request = Request::builder()
                .method(method)
                .uri(path)
                .header(hyper::header::HOST, &self.authority)
                .header(hyper::header::ACCEPT, "application/json");
            if let Some(token) = &self.token {
                request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
            }
            let bytes = match body {
                Some((media, value)) => {
                    request = request.header(hyper::header::CONTENT_TYPE, media);
                    Bytes::from(serde_json::to_vec(value)?)
                }
                None => Bytes::new(),
            };
            let request = request
                .body(Full::new(bytes))
                .map_err(|e| ClientError::Url(e.to_string()))?;
            let response = sender.send_request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, ClientError>((status, body))
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .map_err(|_| ClientError::Timeout(self.timeout))?
    }

    fn refused(status: StatusCode, body: &[u8]) -> ClientError {
        let said: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        ClientError::Refused {
            status: status.as_u16(),
            error: said["error"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_string()),
            field: said["field"].as_str().map(str::to_string),
        }
    }

    /// The recipient's set, with `updated_at`; `None` when they have none (404).
    pub async fn get(
        &self,
        recipient: &str,
        tenant: Option<&str>,
    ) -> Result<Option<Value>, ClientError> {
        let (status, body) = self
            .call(Method::GET, &Self::path(recipient, tenant), None)
            .await?;
        match status {
            StatusCode::OK => Ok(Some(serde_json::from_slice(&body)?)),
            StatusCode::NOT_FOUND => Ok(None),
            other => Err(Self::refused(other, &body)),
        }
    }

    async fn edit(
        &self,
        method: Method,
        media: &str,
        recipient: &str,
        tenant: Option<&str>,
        value: &Value,
    ) -> Result<Value, ClientError> {
        let (status, body) = self
            .call(method, &Self::path(recipient, tenant), Some((media, value)))
            .await?;
        match status {
            StatusCode::OK => Ok(serde_json::from_slice(&body)?),
            other => Err(Self::refused(other, &body)),
        }
    }

    /// Replace the recipient's set; the set stored, with `updated_at`. A refused
    /// set is [`ClientError::Refused`] with status 400 and its `field`.
    pub async fn put(
        &self,
        recipient: &str,
        tenant: Option<&str>,
        set: &Value,
    ) -> Result<Value, ClientError> {
        self.edit(Method::PUT, "application/json", recipient, tenant, set)
            .await
    }

    /// Merge `patch` into the recipient's set (RFC 7386: `null` removes a key);
    /// the set stored.
    pub async fn patch(
        &self,
        recipient: &str,
        tenant: Option<&str>,
        patch: &Value,
    ) -> Result<Value, ClientError> {
        let media = "application/merge-patch+json";
        self.edit(Method::PATCH, media, recipient, tenant, patch)
            .await
    }

    /// Remove the recipient's set (done also when there was none).
    pub async fn delete(&self, recipient: &str, tenant: Option<&str>) -> Result<(), ClientError> {
        let (status, body) = self
            .call(Method::DELETE, &Self::path(recipient, tenant), None)
            .await?;
        match status {
            StatusCode::NO_CONTENT | StatusCode::OK => Ok(()),
            other => Err(Self::refused(other, &body)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_percent_encoded_and_urls_checked() {
        assert_eq!(
            PreferencesClient::path("+86 138/0", Some("a&b")),
            "/v1/recipients/%2B86%20138%2F0/preferences?tenant=a%26b"
        );
        assert!(PreferencesClient::new("http://127.0.0.1:9464/", None).is_ok());
        for bad in ["https://x:1", "127.0.0.1:9464", "http://", "http://x/y"] {
            assert!(PreferencesClient::new(bad, None).is_err(), "{bad}");
        }
    }
}
