//! Who may call the mutating endpoints (`POST /reload`): the bearer token of
//! `http.admin_token` when it is set, compared in constant time; without one,
//! any caller on a loopback `http.listen` and nobody on any other. Pure but for
//! the axum middleware at the end.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use secrecy::{ExposeSecret, SecretString};

use crate::config::HttpSettings;

/// Who may call the mutating endpoints.
#[derive(Clone)]
pub enum Guard {
    /// Anyone who reaches the listener (a loopback one without a token).
    Open,
    /// Only a request with `Authorization: Bearer <token>`; the token's BLAKE3
    /// hash is kept, so that comparing hashes (constant time) tells nothing of its
    /// length or its first bytes.
    Token(blake3::Hash),
    /// Nobody (a listener beyond loopback without a token).
    Refused,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Guard::Open => "Open",
            Guard::Token(_) => "Token",
            Guard::Refused => "Refused",
        })
    }
}

/// Why a request was refused: the status (401 or 403) and what to do.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401 (no or a wrong token) or 403 (no token configured beyond loopback).
    pub status: StatusCode,
    /// The answer's body.
    pub message: &'static str,
}

impl Guard {
    /// The guard `http` asks for.
    pub fn new(http: &HttpSettings) -> Guard {
        match &http.admin_token {
            Some(token) => Guard::token(token),
            None if http.loopback() => Guard::Open,
            None => Guard::Refused,
        }
    }

    /// The guard of the preferences API: `http.api_token`, else loopback only.
    pub fn api(http: &HttpSettings) -> Guard {
        match &http.api_token {
            Some(token) => Guard::token(token),
            None if http.loopback() => Guard::Open,
            None => Guard::Refused,
        }
    }

    /// Only `token` passes.
    pub fn token(token: &SecretString) -> Guard {
        Guard::Token(blake3::hash(token.expose_secret().as_bytes()))
    }

    /// Whether `token` is the one this guard asks for (the console's login); an
    /// open guard takes anything, a refusing one nothing.
    pub fn allows(&self, token: &str) -> bool {
        match self {
            Guard::Open => true,
            // blake3::Hash's == is constant-time
            Guard::Token(hash) => blake3::hash(token.trim().as_bytes()) == *hash,
            Guard::Refused => false,
        }
    }

    /// Whether a request with these headers passes.
    pub fn check(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let expected = match self {
            Guard::Open => return Ok(()),
            Guard::Refused => {
                return Err(Refusal {
                    status: StatusCode::FORBIDDEN,
                    message: "refused: http.listen is not loopback and http.admin_token is \
                              not set, so nobody may change this worker over HTTP (send it \
                              SIGHUP, or set http.admin_token)\n",
                })
            }
            Guard::Token(hash) => hash,
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match given {
            // blake3::Hash's == is constant-time
            Some(token) if blake3::hash(token.as_bytes()) == *expected => Ok(()),
            Some(_) => Err(Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "refused: the bearer token is not http.admin_token\n",
            }),
            None => Err(Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "refused: send `Authorization: Bearer <http.admin_token>` \
                          (quota-worker admin reload does)\n",
            }),
        }
    }
}

/// The middleware on the mutating routes: the request goes on only if `guard`
/// lets it.
pub(super) async fn require(State(guard): State<Guard>, request: Request, next: Next) -> Response {
    match guard.check(request.headers()) {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            let mut response = (
                refusal.status,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                refusal.message,
            )
                .into_response();
            if refusal.status == StatusCode::UNAUTHORIZED {
                response.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer realm=\"quota-worker\""),
                );
            }
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(auth: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(a) = auth {
            h.insert(header::AUTHORIZATION, a.parse().unwrap());
        }
        h
    }

    fn http(listen: &str, token: Option<&str>) -> HttpSettings {
        HttpSettings {
            enabled: true,
            listen: listen.into(),
            admin_token: token.map(SecretString::from),
            api_token: None,
        }
    }

    #[test]
    fn each_guard_lets_through_what_it_should() {
        let open = Guard::new(&http("127.0.0.1:9464", None));
        assert!(open.check(&with(None)).is_ok());
        let refused = Guard::new(&http("0.0.0.0:9464", None));
        for auth in [None, Some("Bearer anything")] {
            assert_eq!(
                refused.check(&with(auth)).unwrap_err().status,
                StatusCode::FORBIDDEN
            );
        }
        for listen in ["127.0.0.1:9464", "0.0.0.0:9464"] {
            let token = Guard::new(&http(listen, Some("s3cret")));
            assert!(token.check(&with(Some("Bearer s3cret"))).is_ok());
            assert!(token.check(&with(Some("bearer s3cret"))).is_ok());
            for wrong in [
                None,
                Some("Bearer s3cre"),
                Some("Bearer s3cret2"),
                Some("Basic s3cret"),
                Some("s3cret"),
            ] {
                assert_eq!(
                    token.check(&with(wrong)).unwrap_err().status,
                    StatusCode::UNAUTHORIZED,
                    "{wrong:?}"
                );
            }
        }
        assert!(!format!("{:?}", Guard::token(&"s3cret".into())).contains("s3cret"));
    }
}
