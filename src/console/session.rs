//! Who is looking: the console's sessions, its logout, and the checks every page
//! ([`enter`]) and every action ([`act`]) make (the login is `login.rs`). A session is a random
//! id in an `HttpOnly`, `SameSite=Strict` cookie scoped to `/console` (`Secure`
//! when the request came through TLS, `X-Forwarded-Proto: https`), kept in Redis
//! under its BLAKE3 hash (`prefix:console:session:<hash>`, so Redis never holds a
//! cookie that works) for `console.session_ttl`, with a CSRF token of its own that
//! every form carries and every action checks (compared in constant time). Every
//! worker behind one address knows every session, and a restart logs nobody out.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;

use super::fields::Fields;
use super::layout;
use super::layout::Visitor;
use super::Console;
use crate::config::Settings;
use crate::http::guard::Guard;
use crate::store::QuotaStore;

/// The session cookie's name.
pub const COOKIE: &str = "qw_console";

/// One login.
#[derive(Debug, Clone)]
pub struct Session {
    /// Who logged in: the name of the admin token given (`admin` for
    /// `http.admin_token`, else its name in `http.admin_tokens`), or `loopback` (no
    /// token asked).
    pub who: String,
    csrf: String,
}

/// What a page or an action works with.
pub(super) struct Ctx {
    pub app: Arc<Console>,
    pub store: Arc<QuotaStore>,
    pub settings: Settings,
    pub visitor: Visitor,
}

fn random_id() -> String {
    format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Where Redis keeps the session whose cookie is `id`: under the id's hash.
fn session_key(store: &QuotaStore, id: &str) -> String {
    let hash = blake3::hash(id.as_bytes()).to_hex();
    format!("{}:console:session:{hash}", store.keys().prefix())
}

/// The value of the cookie `name` that `headers` carry.
pub(super) fn cookie_named<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find_map(|(k, v)| (k == name).then_some(v))
}

fn cookie_of(headers: &HeaderMap) -> Option<&str> {
    cookie_named(headers, COOKIE)
}

/// Whether the request came through TLS (`X-Forwarded-Proto: https`): its cookies
/// are `Secure`.
pub(super) fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

impl Console {
    /// The live session of `headers`' cookie (Redis forgets an expired one); none
    /// when Redis cannot say (logged).
    async fn session(&self, store: &QuotaStore, headers: &HeaderMap) -> Option<Session> {
        let key = session_key(store, cookie_of(headers)?);
        let mut conn = store.connection();
        let mut get = redis::cmd("GET");
        get.arg(&key);
        match get.query_async::<Option<String>>(&mut conn).await {
            Ok(value) => {
                let (who, csrf) = value?.split_once('\n').map(|(w, c)| (w.into(), c.into()))?;
                Some(Session { who, csrf })
            }
            Err(e) => {
                tracing::warn!(error = %e, "console: a session could not be read");
                None
            }
        }
    }

    /// Open a session for `who`, lasting `ttl`: the visitor, with the cookie to set
    /// (a session Redis could not keep is logged, and its cookie leads back to the
    /// login).
    pub(super) async fn open(
        &self,
        store: &QuotaStore,
        who: &str,
        ttl: Duration,
        secure: bool,
    ) -> Visitor {
        let id = random_id();
        let csrf = random_id();
        let mut conn = store.connection();
        let mut set = redis::cmd("SET");
        set.arg(session_key(store, &id))
            .arg(format!("{who}\n{csrf}"))
            .arg("PX")
            .arg(ttl.as_millis().max(1) as u64);
        if let Err(e) = set.query_async::<()>(&mut conn).await {
            tracing::warn!(error = %e, who, "console: a session could not be kept");
        }
        Visitor::new(
            who.to_string(),
            csrf,
            Some(format!(
                "{COOKIE}={id}; Path=/console; Max-Age={}; HttpOnly; SameSite=Strict{}",
                ttl.as_secs(),
                if secure { "; Secure" } else { "" }
            )),
        )
    }

    async fn close(&self, store: &QuotaStore, headers: &HeaderMap) {
        if let Some(id) = cookie_of(headers) {
            let mut conn = store.connection();
            let mut del = redis::cmd("DEL");
            del.arg(session_key(store, id));
            if let Err(e) = del.query_async::<i64>(&mut conn).await {
                tracing::warn!(error = %e, "console: a session could not be forgotten");
            }
        }
    }
}

/// The store and settings, once the worker is connected; 404 with the console off.
// the error is the handler's early answer, returned once a request (as axum's own
// extractors return theirs)
#[allow(clippy::result_large_err)]
pub(super) fn ready(app: &Console) -> Result<(Arc<QuotaStore>, Settings), Response> {
    let Some(reloader) = app.status.reloader() else {
        return Err(layout::bare(
            StatusCode::SERVICE_UNAVAILABLE,
            "Starting",
            html! { p { "The worker is not connected to Redis yet; try again in a moment." } },
        ));
    };
    let settings = reloader.settings();
    if !settings.console.enabled {
        return Err((
            StatusCode::NOT_FOUND,
            "the console is off (console.enabled)\n",
        )
            .into_response());
    }
    Ok((reloader.store().clone(), settings))
}

/// A page's context and its query's fields, as a handler takes them: the checks
/// of [`enter`]; a request that fails them is answered by them.
pub(super) struct Page(pub Ctx, pub Fields);

impl FromRequestParts<Arc<Console>> for Page {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &Arc<Console>) -> Result<Page, Response> {
        let mut ctx = enter(app, &parts.headers).await?;
        let fields = Fields::of_query(&parts.uri);
        ctx.visitor.tz =
            layout::viewer_zone(&fields, cookie_named(&parts.headers, layout::ZONE_COOKIE));
        ctx.visitor.here = parts
            .uri
            .path_and_query()
            .map_or("/console".into(), |p| p.to_string());
        Ok(Page(ctx, fields))
    }
}

/// An action's context and its form's fields, as a handler takes them: the checks
/// of [`act`]; a request that fails them is answered by them.
pub(super) struct Action(pub Ctx, pub Fields);

impl FromRequest<Arc<Console>> for Action {
    type Rejection = Response;

    async fn from_request(request: Request, app: &Arc<Console>) -> Result<Action, Response> {
        let headers = request.headers().clone();
        let body = Bytes::from_request(request, app)
            .await
            .map_err(IntoResponse::into_response)?;
        let (ctx, fields) = act(app, &headers, &body).await?;
        Ok(Action(ctx, fields))
    }
}

/// A page's visitor: its session; else, on an open guard, a new session; else the
/// login form (303), or 403 where nobody may log in.
async fn enter(app: &Arc<Console>, headers: &HeaderMap) -> Result<Ctx, Response> {
    let (store, settings) = ready(app)?;
    let visitor = match app.session(&store, headers).await {
        Some(s) => Visitor::new(s.who, s.csrf, None),
        None => match &app.guard {
            Guard::Open => {
                let ttl = settings.console.session_ttl.0;
                let loopback = crate::http::guard::LOOPBACK;
                app.open(&store, loopback, ttl, behind_tls(headers)).await
            }
            Guard::Tokens(_) => {
                return Err((
                    StatusCode::SEE_OTHER,
                    [(header::LOCATION, "/console/login")],
                )
                    .into_response())
            }
            Guard::Refused => return Err(refused()),
        },
    };
    Ok(Ctx {
        app: app.clone(),
        store,
        settings,
        visitor,
    })
}

/// The answer where nobody may log in.
pub(super) fn refused() -> Response {
    layout::bare(
        StatusCode::FORBIDDEN,
        "Refused",
        html! { p { "http.listen is not loopback and no admin token is set: nobody may use the console (set http.admin_token, or http.admin_tokens)." } },
    )
}

/// An action's visitor and fields: a live session (401 without one) and the
/// session's CSRF token in the form (403 without it).
async fn act(
    app: &Arc<Console>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Ctx, Fields), Response> {
    let (store, settings) = ready(app)?;
    let Some(session) = app.session(&store, headers).await else {
        return Err((
            StatusCode::UNAUTHORIZED,
            "refused: no console session (log in at /console/login)\n",
        )
            .into_response());
    };
    let fields = Fields::parse(body);
    let given = fields.get("csrf").unwrap_or("");
    if blake3::hash(given.as_bytes()) != blake3::hash(session.csrf.as_bytes()) {
        tracing::warn!(who = %session.who, "console: an action without its CSRF token refused");
        return Err((
            StatusCode::FORBIDDEN,
            "refused: the form's CSRF token is missing or wrong\n",
        )
            .into_response());
    }
    let mut visitor = Visitor::new(session.who, session.csrf, None);
    visitor.tz = layout::viewer_zone(
        &Fields::default(),
        cookie_named(headers, layout::ZONE_COOKIE),
    );
    Ok((
        Ctx {
            app: app.clone(),
            store,
            settings,
            visitor,
        },
        fields,
    ))
}

/// `GET /console/zone?tz=NAME&back=PATH`: remember the viewer's zone (an IANA
/// name; empty or `UTC`: UTC alone) in a cookie, and go back to the page.
pub(super) async fn zone(Page(ctx, f): Page) -> Response {
    let tz = match f.get("tz").map(str::parse::<chrono_tz::Tz>) {
        Some(Err(e)) => {
            return layout::failed(&ctx.visitor, StatusCode::BAD_REQUEST, "Your zone", e)
        }
        Some(Ok(tz)) => Some(tz),
        None => None,
    };
    let back = f
        .get("back")
        .filter(|b| b.starts_with("/console") && !b.contains("//"))
        .unwrap_or("/console");
    let mut response = (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, back.to_string())],
    )
        .into_response();
    layout::set_cookie(&mut response, Some(&layout::zone_cookie(tz)));
    layout::set_cookie(&mut response, ctx.visitor.set_cookie.as_deref());
    response
}

/// `POST /console/logout`.
pub(super) async fn logout(headers: HeaderMap, Action(ctx, _): Action) -> Response {
    ctx.app.close(&ctx.store, &headers).await;
    tracing::info!(who = %ctx.visitor.who, action = "logout", "console");
    let mut response = (
        StatusCode::SEE_OTHER,
        [(header::LOCATION, "/console/login")],
    )
        .into_response();
    let gone = format!("{COOKIE}=; Path=/console; Max-Age=0; HttpOnly; SameSite=Strict");
    layout::set_cookie(&mut response, Some(&gone));
    response
}
