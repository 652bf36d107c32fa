//! The console's page shell: the document, its style (inline: no assets), the
//! navigation, and the pieces the pages share (a titled section, a table, a search
//! form, the CSRF field, instants, notices, refusals). Pure: builds HTML and
//! responses.

use std::fmt::Display;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use maud::{html, Markup, PreEscaped, Render, DOCTYPE};

use super::fields::Fields;

/// The visitor of one request: who, the CSRF token their forms carry, and the
/// cookie to set when the session was just opened.
#[derive(Debug, Clone)]
pub(super) struct Visitor {
    pub who: String,
    pub csrf: String,
    pub set_cookie: Option<String>,
}

/// The style: readable from 390 pixels wide to 1280 and more.
const STYLE: &str = "
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,sans-serif;margin:0;color:#1b1f24;background:#f6f7f9}
header{background:#1f2937;color:#fff;padding:.5rem 1rem;display:flex;flex-wrap:wrap;gap:.25rem 1rem;align-items:center}
header a{color:#fff;text-decoration:none;padding:.25rem .1rem}
header a:focus,header a:hover{text-decoration:underline}
header form{margin-left:auto}
main{max-width:76rem;margin:0 auto;padding:1rem}
h1{font-size:1.4rem;margin:.5rem 0 1rem}
h2{font-size:1.1rem;margin:1.5rem 0 .5rem}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:.75rem 1rem;margin-bottom:1rem}
.scroll{overflow-x:auto}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eceef1;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre,.mono{font-family:ui-monospace,monospace;font-size:.9em;overflow-wrap:anywhere}
pre{white-space:pre-wrap;background:#f3f4f6;padding:.5rem;border-radius:4px}
form.inline{display:inline}
form.search{display:flex;flex-wrap:wrap;gap:.5rem;align-items:flex-end;margin-bottom:1rem}
form.search div{display:flex;flex-direction:column}
label{font-weight:600;font-size:.9em}
input,select,textarea,button{font:inherit;padding:.3rem .5rem}
textarea{width:100%;min-height:10rem;font-family:ui-monospace,monospace}
button{cursor:pointer;border:1px solid #1f2937;background:#fff;border-radius:4px}
button.danger{border-color:#b42318;color:#b42318}
.ok{color:#067647}.bad{color:#b42318}.muted{color:#5b6472}
.notice{background:#ecfdf3;border-color:#abefc6}.error{color:#b42318}
ol.timeline{padding-left:1.2rem}ol.timeline li{margin-bottom:.5rem}
@media (max-width:600px){main{padding:.5rem}th,td{padding:.25rem}}
";

/// Add `Set-Cookie: cookie` to `response`, when there is one.
pub(super) fn set_cookie(response: &mut Response, cookie: Option<&str>) {
    if let Some(value) = cookie.and_then(|c| HeaderValue::from_str(c).ok()) {
        response.headers_mut().append(header::SET_COOKIE, value);
    }
}

fn document(title: &str, nav: Markup, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · quota-worker console" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header { (nav) }
                main { h1 { (title) } (body) }
            }
        }
    }
}

fn finish(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, markup).into_response();
    let h = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; form-action 'self'; frame-ancestors 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A page of the console for `v`.
pub(super) fn page(v: &Visitor, title: &str, body: Markup) -> Response {
    page_with(v, StatusCode::OK, title, body)
}

/// [`page`] with another status.
pub(super) fn page_with(v: &Visitor, status: StatusCode, title: &str, body: Markup) -> Response {
    let nav = html! {
        strong { "quota-worker" }
        nav aria-label="Console" {
            a href="/console" { "Overview" } " "
            a href="/console/recipient" { "Recipient" } " "
            a href="/console/job" { "Job" } " "
            a href="/console/dead" { "Dead letters" } " "
            a href="/console/policies" { "Policies" }
        }
        form method="post" action="/console/logout" {
            (csrf(v))
            span.muted { (v.who) " " }
            button type="submit" { "Log out" }
        }
    };
    let mut response = finish(status, document(title, nav, body));
    set_cookie(&mut response, v.set_cookie.as_deref());
    response
}

/// A page outside a session (the login form, a refusal).
pub(super) fn bare(status: StatusCode, title: &str, body: Markup) -> Response {
    finish(
        status,
        document(title, html! { strong { "quota-worker" } }, body),
    )
}

/// What an action did, with a way back.
pub(super) fn done(v: &Visitor, title: &str, what: impl Display, back: &str) -> Response {
    page(
        v,
        title,
        html! {
            section.notice role="status" { p { (what.to_string()) } }
            p { a href=(back) { "Back" } }
        },
    )
}

/// What a page or an action could not do.
pub(super) fn failed(v: &Visitor, status: StatusCode, title: &str, why: impl Display) -> Response {
    page_with(
        v,
        status,
        title,
        html! { section { p.error role="alert" { (why.to_string()) } } },
    )
}

/// A request without a field it needs (`what`): 400.
pub(super) fn missing(v: &Visitor, title: &str, what: &str) -> Response {
    failed(v, StatusCode::BAD_REQUEST, title, format!("no {what}"))
}

/// A section titled `title`, labelled by its heading (`h-ID`).
pub(super) fn section(id: &str, title: impl Render, body: Markup) -> Markup {
    html! {
        section aria-labelledby={ "h-" (id) } {
            h2 id={ "h-" (id) } { (title) }
            (body)
        }
    }
}

/// A table with these column heads and `rows` (`tr`s), scrolling sideways on a
/// narrow screen.
pub(super) fn table(head: &[&str], rows: Markup) -> Markup {
    html! { div.scroll { table {
        thead { tr { @for h in head { th { (h) } } } }
        tbody { (rows) }
    } } }
}

/// [`table`], or "None." when there is no row.
pub(super) fn table_or_none(empty: bool, head: &[&str], rows: Markup) -> Markup {
    html! { @if empty { p.muted { "None." } } @else { (table(head, rows)) } }
}

/// One field of a [`search`] form: its name (also its id), its label, and whether
/// it is required.
pub(super) struct Input<'a>(pub &'a str, pub &'a str, pub bool);

/// A search form (`GET action`, `role="search"`): a labelled input per field,
/// filled from `q`, and a button.
pub(super) fn search(action: &str, q: &Fields, inputs: &[Input<'_>], button: &str) -> Markup {
    html! {
        form.search method="get" action=(action) role="search" {
            @for Input(name, label, required) in inputs {
                div { label for=(name) { (label) }
                    input id=(name) name=(name) value=(q.get(name).unwrap_or("")) required[*required]; }
            }
            button type="submit" { (button) }
        }
    }
}

/// The hidden CSRF field of every form.
pub(super) fn csrf(v: &Visitor) -> Markup {
    html! { input type="hidden" name="csrf" value=(v.csrf); }
}

/// An instant, to the second, in UTC.
pub(super) fn when(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// `?key=value&...`, percent-encoded.
pub(super) fn query(pairs: &[(&str, &str)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        q.append_pair(k, v);
    }
    format!("?{}", q.finish())
}
