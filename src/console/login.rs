//! The login form (`/console/login`) and what a login must show: an admin token
//! (any of them, the session taking its name) and that the post comes from this
//! console's own form. A page elsewhere could otherwise post its own token from a
//! visitor's browser and log it in as someone else (login CSRF), before any
//! session's CSRF token exists. So the form carries a pre-session token that a
//! short-lived `SameSite=Strict` cookie scoped to `/console/login` carries too: a
//! page elsewhere can neither read the field nor have the cookie sent. The token
//! is minted by this process (`EXPIRES.NONCE.MAC`, keyed by a secret drawn at
//! start: nothing kept per visitor) and lasts ten minutes. Before that, a
//! browser's `Sec-Fetch-Site` other than `same-origin`, or without it an `Origin`
//! other than the host asked, is refused. Pure but for the two handlers.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use maud::html;

use super::fields::Fields;
use super::layout;
use super::session::{behind_tls, cookie_named, ready, refused};
use super::Console;
use crate::http::guard::Guard;

/// The pre-session cookie's name, and the form field holding the same token.
pub const LOGIN_COOKIE: &str = "qw_login";
const FIELD: &str = "login_csrf";

/// How long a login form lasts, in seconds.
const FORM_TTL: i64 = 600;

/// A new pre-session token, valid until `now` + [`FORM_TTL`] (seconds).
fn mint(key: &[u8; 32], now: i64) -> String {
    let nonce = uuid::Uuid::new_v4().simple().to_string();
    let expires = now + FORM_TTL;
    let mac = blake3::keyed_hash(key, format!("{expires}.{nonce}").as_bytes());
    format!("{expires}.{nonce}.{}", mac.to_hex())
}

/// Whether `token` was minted with `key` and has not expired at `now`.
fn valid(key: &[u8; 32], token: &str, now: i64) -> bool {
    let Some((signed, mac)) = token.rsplit_once('.') else {
        return false;
    };
    let Some(expires) = signed
        .split_once('.')
        .and_then(|(e, _)| e.parse::<i64>().ok())
    else {
        return false;
    };
    // blake3::Hash's == is constant-time
    expires > now
        && blake3::Hash::from_hex(mac)
            .is_ok_and(|m| m == blake3::keyed_hash(key, signed.as_bytes()))
}

fn header_of<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Whether `origin` (`scheme://host[:port]`) names the host the request was sent
/// to (`X-Forwarded-Host` behind a proxy, else `Host`).
fn same_origin(origin: &str, headers: &HeaderMap) -> bool {
    let asked = header_of(headers, "x-forwarded-host").or(header_of(headers, "host"));
    let named = origin
        .split_once("://")
        .map(|(_, host)| host.trim_end_matches('/'));
    matches!((named, asked), (Some(n), Some(a)) if n.eq_ignore_ascii_case(a.trim()))
}

/// Why a login post is not this console's own form, if it is not: a browser says
/// it came from elsewhere, or the form's token is not the cookie's, not minted
/// here, or expired.
fn foreign(
    key: &[u8; 32],
    headers: &HeaderMap,
    field: Option<&str>,
    now: i64,
) -> Option<&'static str> {
    match (
        header_of(headers, "sec-fetch-site"),
        header_of(headers, "origin"),
    ) {
        (Some(site), _) if !matches!(site, "same-origin" | "none") => {
            return Some("it was sent from another site (Sec-Fetch-Site)")
        }
        (None, Some(origin)) if !same_origin(origin, headers) => {
            return Some("it was sent from another site (Origin)")
        }
        _ => {}
    }
    let cookie = cookie_named(headers, LOGIN_COOKIE);
    match (field, cookie) {
        (Some(f), Some(c))
            if blake3::hash(f.as_bytes()) == blake3::hash(c.as_bytes()) && valid(key, c, now) =>
        {
            None
        }
        _ => Some("the form expired, or is not this console's"),
    }
}

/// The login form with a fresh pre-session token, and its cookie.
fn login_page(
    app: &Console,
    headers: &HeaderMap,
    status: StatusCode,
    error: Option<&str>,
) -> Response {
    let token = mint(&app.login_key, chrono::Utc::now().timestamp());
    let mut response = layout::bare(
        status,
        "Log in",
        html! {
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form method="post" action="/console/login" {
                input type="hidden" name=(FIELD) value=(token);
                label for="token" { "Admin token (http.admin_token, or yours in http.admin_tokens)" }
                input #token type="password" name="token" autocomplete="current-password" required autofocus;
                button type="submit" { "Log in" }
            }
        },
    );
    let cookie = format!(
        "{LOGIN_COOKIE}={token}; Path=/console/login; Max-Age={FORM_TTL}; HttpOnly; SameSite=Strict{}",
        if behind_tls(headers) { "; Secure" } else { "" }
    );
    layout::set_cookie(&mut response, Some(&cookie));
    response
}

/// `GET /console/login`.
pub(super) async fn form(State(app): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if matches!(app.guard, Guard::Refused) {
        return refused();
    }
    login_page(&app, &headers, StatusCode::OK, None)
}

/// `POST /console/login`: from this console's own form, an admin token for a
/// session cookie named after the token.
pub(super) async fn login(
    State(app): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (store, settings) = match ready(&app) {
        Ok(r) => r,
        Err(response) => return response,
    };
    if matches!(app.guard, Guard::Refused) {
        return refused();
    }
    let fields = Fields::parse(&body);
    let now = chrono::Utc::now().timestamp();
    if let Some(why) = foreign(&app.login_key, &headers, fields.get(FIELD), now) {
        tracing::warn!(
            why,
            "console: a login not from the console's own form refused"
        );
        let say = format!("Refused: {why}. Log in with this form.");
        return login_page(&app, &headers, StatusCode::FORBIDDEN, Some(&say));
    }
    let Some(who) = app.guard.holder(fields.get("token").unwrap_or("")) else {
        tracing::warn!("console: a login with a wrong token refused");
        let say = "That is not an admin token.";
        return login_page(&app, &headers, StatusCode::UNAUTHORIZED, Some(say));
    };
    let ttl = settings.console.session_ttl.0;
    let visitor = app.open(&store, &who.0, ttl, behind_tls(&headers)).await;
    tracing::info!(who = %who.0, action = "login", "console");
    let mut response = (StatusCode::SEE_OTHER, [(header::LOCATION, "/console")]).into_response();
    layout::set_cookie(&mut response, visitor.set_cookie.as_deref());
    let used =
        format!("{LOGIN_COOKIE}=; Path=/console/login; Max-Age=0; HttpOnly; SameSite=Strict");
    layout::set_cookie(&mut response, Some(&used));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: [u8; 32] = [7; 32];

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_token_is_valid_until_it_expires_and_only_with_this_key() {
        let t = mint(&KEY, 1_000);
        assert!(valid(&KEY, &t, 1_000));
        assert!(valid(&KEY, &t, 1_000 + FORM_TTL - 1));
        assert!(!valid(&KEY, &t, 1_000 + FORM_TTL));
        assert!(!valid(&[8; 32], &t, 1_000));
        let (signed, _) = t.rsplit_once('.').unwrap();
        let later = signed.replacen("1600", "9600", 1);
        assert!(!valid(
            &KEY,
            &format!("{later}.{}", t.rsplit_once('.').unwrap().1),
            1_000
        ));
        for junk in ["", "x", "1.2", "9999999999.n.zz"] {
            assert!(!valid(&KEY, junk, 1_000), "{junk}");
        }
    }

    #[test]
    fn a_login_from_elsewhere_or_without_its_forms_cookie_is_foreign() {
        let t = mint(&KEY, 1_000);
        let cookie = format!("{LOGIN_COOKIE}={t}");
        let own = |extra: &[(&'static str, &str)]| {
            let mut pairs = vec![("cookie", cookie.as_str()), ("host", "127.0.0.1:9464")];
            pairs.extend_from_slice(extra);
            headers(&pairs)
        };
        for ok in [
            own(&[]),
            own(&[("sec-fetch-site", "same-origin")]),
            own(&[("sec-fetch-site", "none")]),
            own(&[("origin", "http://127.0.0.1:9464")]),
            own(&[
                ("origin", "https://console.example"),
                ("x-forwarded-host", "console.example"),
            ]),
        ] {
            assert_eq!(foreign(&KEY, &ok, Some(&t), 1_001), None, "{ok:?}");
        }
        for bad in [
            own(&[("sec-fetch-site", "cross-site")]),
            own(&[("sec-fetch-site", "same-site")]),
            own(&[
                ("sec-fetch-site", "cross-site"),
                ("origin", "http://127.0.0.1:9464"),
            ]),
            own(&[("origin", "https://evil.example")]),
            own(&[("origin", "null")]),
        ] {
            assert!(
                foreign(&KEY, &bad, Some(&t), 1_001)
                    .unwrap()
                    .contains("another site"),
                "{bad:?}"
            );
        }
        let other = mint(&KEY, 1_000);
        let no_cookie = headers(&[("host", "127.0.0.1:9464")]);
        for (h, field, now) in [
            (&no_cookie, Some(t.as_str()), 1_001),
            (&own(&[]), None, 1_001),
            (&own(&[]), Some(other.as_str()), 1_001),
            (&own(&[]), Some(t.as_str()), 1_000 + FORM_TTL),
        ] {
            assert!(
                foreign(&KEY, h, field, now).unwrap().contains("expired"),
                "{h:?} {field:?}"
            );
        }
    }
}
