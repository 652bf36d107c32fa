//! Who may call the mutating endpoints (`POST /reload`) and log in to the
//! console: the bearer of an admin token (`http.admin_token`, named `admin`, and
//! `http.admin_tokens`, each by its name) when one is set, compared in constant
//! time, the token's name being who the action log names; without one, any caller
//! on a loopback `http.listen` (named `loopback`) and nobody on any other. Pure but
//! for the axum middleware at the end, which hands the handler a [`Who`].

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
    /// Only a request with `Authorization: Bearer <token>` for one of these tokens,
    /// each with its name; the token's BLAKE3 hash is kept, so that comparing
    /// hashes (constant time) tells nothing of its length or its first bytes.
    Tokens(Vec<(String, blake3::Hash)>),
    /// Nobody (a listener beyond loopback without a token).
    Refused,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Guard::Open => f.write_str("Open"),
            Guard::Tokens(tokens) => f
                .debug_tuple("Tokens")
                .field(&tokens.iter().map(|(n, _)| n).collect::<Vec<_>>())
                .finish(),
            Guard::Refused => f.write_str("Refused"),
        }
    }
}

/// Who a request came from, as the action log names them: the name of the token
/// it carried, or `loopback` where no token is asked for. The middleware puts it
/// in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who(pub String);

/// The name of whoever reaches an open guard.
pub const LOOPBACK: &str = "loopback";

/// Why a request was refused: the status (401 or 403) and what to do.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// 401 (no or a wrong token) or 403 (no token configured beyond loopback).
    pub status: StatusCode,
    /// The answer's body.
    pub message: &'static str,
}

impl Guard {
    /// The guard `http` asks for: its admin tokens by name.
    pub fn new(http: &HttpSettings) -> Guard {
        let tokens = http.admin_tokens();
        match tokens.is_empty() {
            false => Guard::named(tokens.iter().map(|(n, t)| (n.as_str(), *t))),
            true if http.loopback() => Guard::Open,
            true => Guard::Refused,
        }
    }

    /// The guard of the preferences API: `http.api_token` (named `api`), else
    /// loopback only.
    pub fn api(http: &HttpSettings) -> Guard {
        match &http.api_token {
            Some(token) => Guard::named([("api", token)]),
            None if http.loopback() => Guard::Open,
            None => Guard::Refused,
        }
    }

    /// Only `token` passes, named `admin`.
    pub fn token(token: &SecretString) -> Guard {
        Guard::named([(crate::config::ADMIN_TOKEN_NAME, token)])
    }

    /// Only these tokens pass, each under its name.
    pub fn named<'a>(tokens: impl IntoIterator<Item = (&'a str, &'a SecretString)>) -> Guard {
        Guard::Tokens(
            tokens
                .into_iter()
                .map(|(name, t)| (name.to_string(), blake3::hash(t.expose_secret().as_bytes())))
                .collect(),
        )
    }

    /// Who holds `token`, if this guard takes it (the console's login): an open
    /// guard takes anything ([`LOOPBACK`]), a refusing one nothing.
    pub fn holder(&self, token: &str) -> Option<Who> {
        match self {
            Guard::Open => Some(Who(LOOPBACK.to_string())),
            Guard::Tokens(tokens) => holder(tokens, token.trim()),
            Guard::Refused => None,
        }
    }

    /// Who sent a request with these headers, if it passes.
    pub fn check(&self, headers: &HeaderMap) -> Result<Who, Refusal> {
        let tokens = match self {
            Guard::Open => return Ok(Who(LOOPBACK.to_string())),
            Guard::Refused => {
                return Err(Refusal {
                    status: StatusCode::FORBIDDEN,
                    message: "refused: http.listen is not loopback and http.admin_token is \
                              not set, so nobody may change this worker over HTTP (send it \
                              SIGHUP, or set http.admin_token)\n",
                })
            }
            Guard::Tokens(tokens) => tokens,
        };
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim());
        match given.map(|token| (token, holder(tokens, token))) {
            Some((_, Some(who))) => Ok(who),
            Some((_, None)) => Err(Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "refused: the bearer token is not an admin token (http.admin_token, \
                          http.admin_tokens)\n",
            }),
            None => Err(Refusal {
                status: StatusCode::UNAUTHORIZED,
                message: "refused: send `Authorization: Bearer <http.admin_token>` \
                          (quota-worker admin reload does)\n",
            }),
        }
    }
}

/// The name of the token among `tokens` that `token` is, compared with every one
/// in constant time.
fn holder(tokens: &[(String, blake3::Hash)], token: &str) -> Option<Who> {
    let given = blake3::hash(token.as_bytes());
    let mut found = None;
    for (name, hash) in tokens {
        // blake3::Hash's == is constant-time; every token is compared
        if *hash == given {
            found = Some(Who(name.clone()));
        }
    }
    found
}

/// The middleware on the mutating routes: the request goes on, with its [`Who`],
/// only if `guard` lets it.
pub(super) async fn require(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    match guard.check(request.headers()) {
        Ok(who) => {
            request.extensions_mut().insert(who);
            next.run(request).await
        }
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
            admin_tokens: Default::default(),
            api_token: None,
        }
    }

    #[test]
    fn each_guard_lets_through_what_it_should() {
        let open = Guard::new(&http("127.0.0.1:9464", None));
        assert_eq!(open.check(&with(None)), Ok(Who("loopback".into())));
        let refused = Guard::new(&http("0.0.0.0:9464", None));
        for auth in [None, Some("Bearer anything")] {
            assert_eq!(
                refused.check(&with(auth)).unwrap_err().status,
                StatusCode::FORBIDDEN
            );
        }
        for listen in ["127.0.0.1:9464", "0.0.0.0:9464"] {
            let token = Guard::new(&http(listen, Some("s3cret")));
            assert_eq!(
                token.check(&with(Some("Bearer s3cret"))),
                Ok(Who("admin".into()))
            );
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

    #[test]
    fn each_named_token_passes_as_its_holder() {
        let mut h = http("0.0.0.0:9464", Some("t-admin"));
        for (name, t) in [("alice", "t-alice"), ("bob", "t-bob")] {
            h.admin_tokens.insert(name.into(), t.into());
        }
        let guard = Guard::new(&h);
        for (token, who) in [("t-admin", "admin"), ("t-alice", "alice"), ("t-bob", "bob")] {
            let bearer = format!("Bearer {token}");
            assert_eq!(guard.check(&with(Some(&bearer))), Ok(Who(who.into())));
            assert_eq!(guard.holder(token), Some(Who(who.into())));
        }
        assert_eq!(
            guard
                .check(&with(Some("Bearer t-carol")))
                .unwrap_err()
                .status,
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(guard.holder("t-carol"), None);
        let shown = format!("{guard:?}");
        assert!(
            shown.contains("alice") && !shown.contains("t-alice"),
            "{shown}"
        );
        h.admin_token = None;
        assert_eq!(Guard::new(&h).holder("t-admin"), None);
        assert_eq!(Guard::new(&h).holder("t-bob"), Some(Who("bob".into())));
    }
}
