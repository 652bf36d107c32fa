//! The console's page shell: the document, its style (inline: no assets), the
//! navigation, and the pieces the pages share (a titled section, a table, a search
//! form, the CSRF field, instants, notices, refusals). Pure: builds HTML and
//! responses.

use std::fmt::Display;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use maud::{html, Markup, PreEscaped, Render, DOCTYPE};

use super::fields::Fields;

/// The visitor of one request: who, the CSRF token their forms carry, and the
/// cookie to set when the session was just opened.
#[derive(Debug, Clone)]
pub(super) struct Visitor {
    pub who: String,
    pub csrf: String,
    pub set_cookie: Option<String>,
    /// The viewer's zone ([`ZONE_COOKIE`]), shown beside UTC; `None`: UTC only.
    pub tz: Option<Tz>,
    /// The page asked for (path and query), where the zone form comes back to.
    pub here: String,
}

/// The cookie that holds the viewer's zone (an IANA name), set by `GET
/// /console/zone?tz=NAME` (the zone form of every page).
pub(super) const ZONE_COOKIE: &str = "qw_tz";

impl Visitor {
    /// A visitor without a zone, on the overview.
    pub fn new(who: String, csrf: String, set_cookie: Option<String>) -> Visitor {
        Visitor {
            who,
            csrf,
            set_cookie,
            tz: None,
            here: "/console".into(),
        }
    }
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
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3rem .5rem;border-bottom:1px solid #eceef1;vertical-align:top}
th.n,td.n{text-align:right;font-variant-numeric:tabular-nums}
form.zone{display:flex;gap:.25rem;align-items:center}
form.zone input{width:11rem}
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
@media (max-width:600px){main{padding:.5rem}section{padding:.5rem}th,td{padding:.25rem}
table.stack thead{display:none}
table.stack,table.stack tbody,table.stack tr,table.stack td{display:block;width:100%}
table.stack tr{border-bottom:2px solid #dde1e6;padding:.25rem 0}
table.stack td{border:0;padding:.1rem .25rem;text-align:left}
table.stack td[data-label]::before{content:attr(data-label) ': ';font-weight:600;color:#5b6472}
header form{margin-left:0}form.search div{flex:1 1 10rem;min-width:0}form.search input,form.search select{width:100%}}
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
            a href="/console/policies" { "Policies" } " "
            a href="/console/waiting" { "Waiting" }
        }
        form.zone method="get" action="/console/zone" {
            input type="hidden" name="back" value=(v.here);
            label for="viewer-tz" { "Your zone" }
            input id="viewer-tz" name="tz" placeholder="e.g. Europe/Paris" value=(v.tz.map(|z| z.name()).unwrap_or(""));
            button type="submit" { "Set" }
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
    table_with(head, &[], rows)
}

/// [`table`] whose columns `numeric` (from 0) are numbers: their heads are
/// right-aligned as their cells (`td.n`) are.
pub(super) fn table_with(head: &[&str], numeric: &[usize], rows: Markup) -> Markup {
    html! { div.scroll { table {
        thead { tr { @for (i, h) in head.iter().enumerate() {
            @if numeric.contains(&i) { th.n scope="col" { (h) } } @else { th scope="col" { (h) } }
        } } }
        tbody { (rows) }
    } } }
}

/// A table that, under 600 pixels wide, stacks each row's cells, each cell
/// labelled by its column's head (`td data-label=…`, which `rows` give).
pub(super) fn stacked(head: &[&str], numeric: &[usize], rows: Markup) -> Markup {
    html! { div.scroll { table.stack {
        thead { tr { @for (i, h) in head.iter().enumerate() {
            @if numeric.contains(&i) { th.n scope="col" { (h) } } @else { th scope="col" { (h) } }
        } } }
        tbody { (rows) }
    } } }
}

/// [`table_with`], or "None." when there is no row.
pub(super) fn table_or_none(empty: bool, head: &[&str], rows: Markup, numeric: &[usize]) -> Markup {
    html! { @if empty { p.muted { "None." } } @else { (table_with(head, numeric, rows)) } }
}

/// One field of a [`search`] form: its name (also its id), its label, and whether
/// it is required.
pub(super) struct Input<'a>(pub &'a str, pub &'a str, pub bool);

/// A search form (`GET action`, `role="search"`): a labelled input per field,
/// filled from `q`, and a button.
pub(super) fn search(action: &str, q: &Fields, fields: &[Input<'_>], button: &str) -> Markup {
    html! {
        form.search method="get" action=(action) role="search" {
            (inputs(q, fields))
            button type="submit" { (button) }
        }
    }
}

/// A labelled input per field, filled from `q`.
pub(super) fn inputs(q: &Fields, fields: &[Input<'_>]) -> Markup {
    html! {
        @for Input(name, label, required) in fields {
            div { label for=(name) { (label) }
                input id=(name) name=(name) value=(q.get(name).unwrap_or("")) required[*required]; }
        }
    }
}

/// A labelled choice among `options`, "any" (empty) first, `current` chosen (kept
/// as a choice of its own when it is not among them).
pub(super) fn choice(name: &str, label: &str, options: &[String], current: Option<&str>) -> Markup {
    let other = current.filter(|c| !options.iter().any(|o| o == c));
    html! {
        div { label for=(name) { (label) }
            select id=(name) name=(name) {
                option value="" { "any" }
                @if let Some(c) = other { option value=(c) selected { (c) } }
                @for o in options { option value=(o) selected[current == Some(o.as_str())] { (o) } }
            }
        }
    }
}

/// The hidden CSRF field of every form.
pub(super) fn csrf(v: &Visitor) -> Markup {
    html! { input type="hidden" name="csrf" value=(v.csrf); }
}

/// An instant in UTC, to the second: `2026-12-01 10:00:00 UTC`.
pub(super) fn utc(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// An instant in `tz`, in the same format: `2026-12-01 18:00:00 Asia/Shanghai`.
pub(super) fn in_zone(t: DateTime<Utc>, tz: Tz) -> String {
    format!(
        "{} {}",
        t.with_timezone(&tz).format("%Y-%m-%d %H:%M:%S"),
        tz.name()
    )
}

/// The console's one format of an instant: [`utc`], and beside it the viewer's
/// zone when they chose one other than UTC: `2026-12-01 10:00:00 UTC (11:00:00
/// Europe/Paris)` (the date too when it differs).
pub(super) fn when(v: &Visitor, t: DateTime<Utc>) -> String {
    zoned(t, v.tz)
}

/// [`when`] for a viewer in `tz`.
pub(super) fn zoned(t: DateTime<Utc>, tz: Option<Tz>) -> String {
    let Some(tz) = tz.filter(|z| *z != Tz::UTC) else {
        return utc(t);
    };
    let local = t.with_timezone(&tz);
    let format = if local.date_naive() == t.date_naive() {
        "%H:%M:%S"
    } else {
        "%Y-%m-%d %H:%M:%S"
    };
    format!("{} ({} {})", utc(t), local.format(format), tz.name())
}

/// The viewer's zone: `?tz=` of this request (for this page only), else the zone
/// cookie's.
pub(super) fn viewer_zone(query: &Fields, cookie: Option<&str>) -> Option<Tz> {
    query
        .get("tz")
        .or(cookie)
        .and_then(|z| z.parse::<Tz>().ok())
}

/// The `Set-Cookie` value that remembers the viewer's zone `tz` (`None`: forgets it).
pub(super) fn zone_cookie(tz: Option<Tz>) -> String {
    match tz {
        Some(tz) => format!(
            "{ZONE_COOKIE}={}; Path=/console; Max-Age=31536000; SameSite=Strict",
            tz.name()
        ),
        None => format!("{ZONE_COOKIE}=; Path=/console; Max-Age=0; SameSite=Strict"),
    }
}

/// `?key=value&...`, percent-encoded.
pub(super) fn query(pairs: &[(&str, &str)]) -> String {
    let mut q = form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs.iter().filter(|(_, v)| !v.is_empty()) {
        q.append_pair(k, v);
    }
    format!("?{}", q.finish())
}

#[cfg(test)]
mod tests {
    use super::{in_zone, zoned};
    use chrono::{TimeZone, Utc};
    use chrono_tz::Tz;

    #[test]
    fn an_instant_is_written_in_utc_with_the_viewers_zone_beside_it() {
        let t = Utc.with_ymd_and_hms(2026, 12, 1, 20, 30, 0).unwrap();
        assert_eq!(zoned(t, None), "2026-12-01 20:30:00 UTC");
        assert_eq!(zoned(t, Some(Tz::UTC)), "2026-12-01 20:30:00 UTC");
        assert_eq!(
            zoned(t, Some(Tz::Europe__Paris)),
            "2026-12-01 20:30:00 UTC (21:30:00 Europe/Paris)"
        );
        assert_eq!(
            zoned(t, Some(Tz::Asia__Shanghai)),
            "2026-12-01 20:30:00 UTC (2026-12-02 04:30:00 Asia/Shanghai)"
        );
        assert_eq!(
            in_zone(t, Tz::Asia__Shanghai),
            "2026-12-02 04:30:00 Asia/Shanghai"
        );
    }
}
