//! The dead letters (`/console/dead`): read from their index in Redis
//! ([`crate::admin::dead_index`]), filtered by reason, policy, channel and
//! recipient, tenant, job id and time range ([`Filter::matches`]'s fields), newest
//! first, 50 a page; one message with its headers and body; replay or purge one,
//! or what a filter selects, each after a confirmation that names the filter and
//! lists the set, which the action then touches exactly
//! ([`crate::admin::dead_action`]). Browsing never touches the queue: a page first
//! catches the index up with the dead-letter log ([`crate::admin::dead_log`],
//! waiting at most [`CATCH_UP_BUDGET`]).

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use maud::{html, Markup};

use super::fields::Fields;
use super::layout::Visitor;
use super::layout::{self, choice, csrf, inputs, query, section, stacked, when, Input};
use super::session::{Action, Ctx, Page};
use crate::admin::dead_action::{self, Carried, Verb};
use crate::admin::dead_index::{self, Entry, Filter};
use crate::admin::dead_log;
use crate::admin::AdminError;
use crate::config::AmqpSettings;

/// Dead letters a page shows.
const PAGE: usize = 50;

/// How long a page waits for the index to catch up with the dead-letter log
/// before it shows what the index holds (the catch-up goes on meanwhile).
pub(super) const CATCH_UP_BUDGET: Duration = Duration::from_secs(1);

/// Catch the index up with the dead-letter log ([`dead_log::catch_up`]), waiting
/// at most `budget` (`None`: until it is done); whether it was done in time.
pub(super) async fn catch_up(ctx: &Ctx, budget: Option<Duration>) -> Result<bool, AdminError> {
    // (the broker's connection too within the budget: a broker away must not hold
    // the page for its connect timeout)
    let (app, store, settings) = (ctx.app.clone(), ctx.store.clone(), ctx.settings.clone());
    let task = tokio::spawn(async move {
        let conn = app.broker.get(&settings.amqp).await?;
        dead_log::catch_up(&conn, &store, &settings).await
    });
    let joined = match budget {
        Some(b) => match tokio::time::timeout(b, task).await {
            Ok(joined) => joined,
            Err(_) => return Ok(false),
        },
        None => task.await,
    };
    match joined {
        Ok(caught) => caught.map(|_| true),
        Err(e) => Err(AdminError::Invalid(format!(
            "the dead-letter index's catch-up stopped: {e}"
        ))),
    }
}

/// What a page says when the index may not hold the newest dead letters.
pub(super) fn catching_up_note(caught: &Result<bool, AdminError>) -> Markup {
    match caught {
        Ok(true) => html! {},
        Ok(false) => html! {
            p.notice role="status" { "The index is still catching up with the dead-letter log: reload to see the newest." }
        },
        Err(e) => html! {
            p.notice role="alert" { "The index could not catch up with the dead-letter log (" (e.to_string()) "): the newest may be missing." }
        },
    }
}

/// The filter's fields, as the forms and the query name them.
const FILTER_FIELDS: [&str; 8] = [
    "reason",
    "policy",
    "channel",
    "recipient",
    "tenant",
    "id",
    "since",
    "until",
];

/// An instant a filter names: RFC 3339, or a date and time (`2026-12-01T10:00`,
/// a `datetime-local` field's) or a date alone, both in UTC.
fn instant(text: &str) -> Option<DateTime<Utc>> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Some(t.with_timezone(&Utc));
    }
    for format in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M"] {
        if let Ok(t) = NaiveDateTime::parse_from_str(text, format) {
            return Some(t.and_utc());
        }
    }
    let day = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    Some(day.and_hms_opt(0, 0, 0)?.and_utc())
}

/// The tenant `typed` names among the `known` ones: itself when known as typed,
/// else the one known that differs from it in case only, else as typed.
fn resolve_tenant(typed: &str, known: &[String]) -> String {
    if known.iter().any(|k| k == typed) {
        return typed.to_string();
    }
    let lower = typed.to_lowercase();
    known
        .iter()
        .find(|k| k.to_lowercase() == lower)
        .cloned()
        .unwrap_or_else(|| typed.to_string())
}

/// The tenants a filter can name: those of the index's entries and those with a
/// section of their own (`[tenants.NAME]`), sorted.
async fn known_tenants(ctx: &Ctx) -> Vec<String> {
    let conn = ctx.store.connection();
    let mut known = dead_index::tenants(&conn, ctx.store.keys())
        .await
        .unwrap_or_default();
    known.extend(ctx.settings.tenants.keys().cloned());
    known.sort();
    known.dedup();
    known
}

/// The reasons a dead letter carries: the worker's, and the broker's for a job
/// past its delivery limit.
fn reasons() -> Vec<String> {
    let mut all: Vec<String> = crate::job::Reason::ALL
        .iter()
        .map(|r| r.as_str().to_string())
        .collect();
    all.push("delivery_limit".into());
    all
}

/// The filter the fields name (the tenant as one of `tenants` whatever its case,
/// the recipient's tag of that tenant), or what is wrong with it.
fn filter(ctx: &Ctx, f: &Fields, tenants: &[String]) -> Result<Filter, String> {
    let tenant = f.get("tenant").map(|t| resolve_tenant(t, tenants));
    let own = |k: &str| f.get(k).map(str::to_string);
    let time = |k: &str| match f.get(k) {
        None => Ok(None),
        Some(t) => instant(t).map(Some).ok_or_else(|| {
            format!("{k}: `{t}` is not a time (2026-12-01T10:00 in UTC, or RFC 3339)")
        }),
    };
    Ok(Filter {
        reason: own("reason"),
        policy: own("policy"),
        channel: own("channel"),
        recipient_tag: f.get("recipient").map(|r| {
            ctx.store
                .keys()
                .for_tenant(tenant.as_deref())
                .recipient_tag(r)
        }),
        tenant,
        id: own("id"),
        since: time("since")?,
        until: time("until")?,
    })
}

fn pairs(f: &Fields) -> Vec<(&'static str, &str)> {
    FILTER_FIELDS
        .iter()
        .map(|k| (*k, f.get(k).unwrap_or("")))
        .collect()
}

/// The filter's form: reason, policy and channel as choices (the known reasons,
/// the configured policies and channels), the tenant as text with the known ones
/// offered, the rest as text.
fn filter_form(settings: &crate::config::Settings, tenants: &[String], f: &Fields) -> Markup {
    let policies: Vec<String> = settings.policies.keys().cloned().collect();
    let channels: Vec<String> = settings.channels.keys().cloned().collect();
    let text = [
        Input("recipient", "Recipient", false),
        Input("id", "Job id", false),
        Input("since", "Since (UTC)", false),
        Input("until", "Before (UTC)", false),
    ];
    html! {
        form.search method="get" action="/console/dead" role="search" {
            (choice("reason", "Reason", &reasons(), f.get("reason")))
            (choice("policy", "Policy", &policies, f.get("policy")))
            (choice("channel", "Channel", &channels, f.get("channel")))
            div { label for="tenant" { "Tenant (any case)" }
                input id="tenant" name="tenant" list="tenants" value=(f.get("tenant").unwrap_or(""));
                datalist id="tenants" { @for t in tenants { option value=(t) {} } } }
            (inputs(f, &text))
            button type="submit" { "Filter" }
        }
    }
}

fn hidden_filter(f: &Fields) -> Markup {
    html! { @for (k, v) in pairs(f) { @if !v.is_empty() { input type="hidden" name=(k) value=(v); } } }
}

/// The recipient of `e` as the recipient page names it (a link to that page),
/// else its tag, else nothing.
fn recipient(e: &Entry) -> Markup {
    let named = e.body.get("recipient").and_then(|r| r.as_str());
    html! {
        @if let Some(r) = named {
            a href={ "/console/recipient" (query(&[("recipient", r), ("tenant", e.tenant.as_deref().unwrap_or(""))])) } { (r) }
        } @else if let Some(tag) = &e.recipient_tag {
            span.muted { "tag " code { (tag) } }
        }
    }
}

fn rows(v: &Visitor, entries: &[Entry]) -> Markup {
    let head = [
        "When",
        "Job",
        "Reason",
        "Recipient",
        "Tenant",
        "Policy",
        "Channel",
        "Detail",
    ];
    let l = |n: usize| head[n];
    stacked(
        &head,
        &[],
        html! { @for e in entries { tr {
            td data-label=(l(0)) { a href={ "/console/dead/one" (query(&[("key", &e.key)])) } { (when(v, e.at)) } }
            td data-label=(l(1)) { @if let Some(id) = &e.id { a href={ "/console/job" (query(&[("id", id)])) } { code { (id) } } } }
            td data-label=(l(2)) { code { (e.reason) } } td data-label=(l(3)) { (recipient(e)) }
            td data-label=(l(4)) { (e.tenant.clone().unwrap_or_default()) }
            td data-label=(l(5)) { (e.policy.clone().unwrap_or_default()) }
            td data-label=(l(6)) { (e.channel.clone().unwrap_or_default()) } td data-label=(l(7)) { (e.detail) }
        } } },
    )
}

/// `GET /console/dead`.
pub(super) async fn list(Page(ctx, f): Page) -> Response {
    let page: usize = f
        .get("page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1)
        .max(1);
    let tenants = known_tenants(&ctx).await;
    let chosen = match filter(&ctx, &f, &tenants) {
        Ok(chosen) => chosen,
        Err(e) => return layout::failed(&ctx.visitor, StatusCode::BAD_REQUEST, "Dead letters", e),
    };
    let caught = catch_up(&ctx, Some(CATCH_UP_BUDGET)).await;
    let conn = ctx.store.connection();
    let (total, entries) =
        match dead_index::page(&conn, ctx.store.keys(), &chosen, (page - 1) * PAGE, PAGE).await {
            Ok(found) => found,
            Err(e) => {
                return layout::failed(
                    &ctx.visitor,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "Dead letters",
                    e,
                )
            }
        };
    let mut more = pairs(&f);
    let next = (page + 1).to_string();
    let prev = (page - 1).to_string();
    let body = html! {
        (filter_form(&ctx.settings, &tenants, &f))
        (catching_up_note(&caught))
        (section("found", html! { (total) " dead letter(s) selected" @if total > 0 { ", newest first, page " (page) } }, html! {
            p { "Filter: " (chosen.describe()) "." }
            p.muted { "Read from the index the console keeps of the dead-letter log (console.dead_index), not from the queue." }
            (rows(&ctx.visitor, &entries))
            p {
                @if page > 1 { a href={ "/console/dead" (query(&{ let mut p = more.clone(); p.push(("page", &prev)); p })) } rel="prev" { "Newer" } " " }
                @if page * PAGE < total { a href={ "/console/dead" (query(&{ more.push(("page", &next)); more })) } rel="next" { "Older" } }
            }
            @if total > 0 { (action_forms(&ctx.visitor, &f)) }
        }))
    };
    layout::page(&ctx.visitor, "Dead letters", body)
}

fn action_forms(v: &Visitor, f: &Fields) -> Markup {
    html! {
        form.inline method="post" action="/console/dead/confirm" {
            (csrf(v)) (hidden_filter(f)) input type="hidden" name="action" value="replay";
            button type="submit" { "Replay what this filter selects…" }
        }
        " "
        form.inline method="post" action="/console/dead/confirm" {
            (csrf(v)) (hidden_filter(f)) input type="hidden" name="action" value="purge";
            button.danger type="submit" { "Purge what this filter selects…" }
        }
    }
}

/// `GET /console/dead/one?key=K`: one dead letter, its headers and body.
pub(super) async fn one(Page(ctx, f): Page) -> Response {
    let key = f.get("key").unwrap_or("").to_string();
    let found = dead_index::read(
        &ctx.store.connection(),
        ctx.store.keys(),
        std::slice::from_ref(&key),
    )
    .await;
    let Ok(Some(e)) = found.map(|mut e| e.pop()) else {
        return layout::failed(
            &ctx.visitor,
            StatusCode::NOT_FOUND,
            "Dead letter",
            "not in the index (replayed, purged, or dropped as the oldest)",
        );
    };
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    let body = html! {
        (rows(&ctx.visitor, std::slice::from_ref(&e)))
        (section("headers", "Headers and properties", html! { pre { (pretty(&e.properties)) } }))
        (section("body", "Body, as received", body_as_received(&e)))
        form.inline method="post" action="/console/dead/confirm" {
            (csrf(&ctx.visitor)) input type="hidden" name="key" value=(key); input type="hidden" name="action" value="replay";
            button type="submit" { "Replay this one…" }
        }
        " "
        form.inline method="post" action="/console/dead/confirm" {
            (csrf(&ctx.visitor)) input type="hidden" name="key" value=(key); input type="hidden" name="action" value="purge";
            button.danger type="submit" { "Purge this one…" }
        }
    };
    layout::page(&ctx.visitor, "Dead letter", body)
}

/// `bytes` as text: UTF-8 as it is, every byte that is not UTF-8 as `\xNN`; and
/// whether there was such a byte.
fn escaped(bytes: &[u8]) -> (String, bool) {
    let mut text = String::with_capacity(bytes.len());
    let mut bad = false;
    for chunk in bytes.utf8_chunks() {
        text.push_str(chunk.valid());
        for b in chunk.invalid() {
            bad = true;
            text.push_str(&format!("\\x{b:02X}"));
        }
    }
    (text, bad)
}

/// The body of `e` as it was received: its bytes (escaped by the page), those not
/// UTF-8 as `\xNN` with a note saying so; the index's re-serialised JSON for an
/// entry written before the bytes were kept.
fn body_as_received(e: &Entry) -> Markup {
    let Some(bytes) = e.raw_body() else {
        let pretty = serde_json::to_string_pretty(&e.body).unwrap_or_default();
        return html! {
            p.muted { "Indexed before the console kept the bytes received: shown re-serialised." }
            pre { (pretty) }
        };
    };
    let (text, bad) = escaped(&bytes);
    html! {
        p.muted { (bytes.len()) " byte(s)"
            @if bytes.len() >= Entry::body_cut_at() { ", the first " (Entry::body_cut_at() / 1024) " KiB (the queue holds them all)" }
            @if bad { "; not UTF-8: each byte that is not is written \\xNN" }
            "." }
        pre.body { (text) }
    }
}

/// What an action selects, with the filter in words: one entry (`key`) or a
/// filter's (with the index caught up first, so that it lists every dead letter
/// published before).
async fn selected(ctx: &Ctx, f: &Fields) -> Result<(String, Vec<String>), String> {
    catch_up(ctx, None).await.map_err(|e| e.to_string())?;
    let conn = ctx.store.connection();
    if let Some(key) = f.get("key") {
        let found = dead_index::read(&conn, ctx.store.keys(), &[key.to_string()]).await;
        let keys = found.map_err(|e| e.to_string())?.into_iter().map(|e| e.key);
        return Ok(("this dead letter".into(), keys.collect()));
    }
    let tenants = known_tenants(ctx).await;
    let chosen = filter(ctx, f, &tenants)?;
    let keys = dead_index::select(&conn, ctx.store.keys(), &chosen).await;
    Ok((chosen.describe(), keys.map_err(|e| e.to_string())?))
}

/// Letters a confirmation lists one by one (the rest by reason).
const LISTED: usize = 20;

/// The reasons of `entries` with how many of each, most first.
fn by_reason(entries: &[Entry]) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for e in entries {
        match counts.iter_mut().find(|(r, _)| *r == e.reason) {
            Some((_, n)) => *n += 1,
            None => counts.push((e.reason.clone(), 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    counts
}

/// `POST /console/dead/confirm`: the set the action would touch, held under a
/// token the form carries ([`dead_action::take`]), and a button.
pub(super) async fn confirm(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let Some(verb) = f.get("action").and_then(Verb::parse) else {
        return layout::missing(v, "Dead letters", "action");
    };
    let word = verb.title();
    let (described, keys) = match selected(&ctx, &f).await {
        Ok(s) => s,
        Err(e) => return layout::failed(v, StatusCode::BAD_REQUEST, "Dead letters", e),
    };
    let (conn, k) = (ctx.store.connection(), ctx.store.keys());
    let taken = dead_action::take(&conn, k, verb, described.clone(), keys).await;
    let snapshot = match taken {
        Ok(s) => s,
        Err(e) => return layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Dead letters", e),
    };
    let first = &snapshot.keys[..snapshot.keys.len().min(LISTED)];
    let shown = dead_index::read(&conn, k, first).await.unwrap_or_default();
    let all = dead_index::read(&conn, k, &snapshot.keys)
        .await
        .unwrap_or_default();
    let n = snapshot.keys.len();
    let body = html! {
        section role="alert" {
            p { (word) " " strong.count { (n) } " dead letter(s) selected by " (described) "?" }
            @if n > 0 {
                p { "By reason: " @for (i, (r, c)) in by_reason(&all).iter().enumerate() { @if i > 0 { ", " } code { (r) } " " (c) } "." }
                p.muted { "Exactly these are " (if verb == Verb::Replay { "replayed" } else { "purged" })
                    ", whatever arrives meanwhile; if one of them is replayed or purged before, nothing is done. The others in the queue are put back at its tail, in their order." }
                (rows(v, &shown))
                @if n > shown.len() { p.muted { "and " (n - shown.len()) " more." } }
                form method="post" action="/console/dead/apply" {
                    (csrf(v))
                    input type="hidden" name="token" value=(snapshot.token);
                    button.danger type="submit" { (word) " these " (n) }
                }
            }
            p { a href="/console/dead" { "Cancel" } }
        }
    };
    layout::page(v, &format!("{word} dead letters"), body)
}

/// The broker connection of the console's walks (catch-ups, replays, purges),
/// opened on the first one, and again when lost.
#[derive(Default)]
pub(super) struct WalksBroker(tokio::sync::Mutex<Option<Arc<lapin::Connection>>>);

impl WalksBroker {
    /// The connection, opened (again) when needed, as `amqp` says.
    async fn get(&self, amqp: &AmqpSettings) -> Result<Arc<lapin::Connection>, AdminError> {
        let mut held = self.0.lock().await;
        if let Some(c) = held.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        let conn = crate::amqp::connect_any(
            &amqp.connect_urls(),
            &amqp.tls,
            "quota-worker console",
            amqp.publish_timeout.0,
        )
        .await?;
        let conn = Arc::new(conn);
        *held = Some(conn.clone());
        Ok(conn)
    }
}

/// `POST /console/dead/apply`: replay or purge the set a confirmation listed
/// ([`dead_action::carry_out`]).
pub(super) async fn apply(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let Some(token) = f.get("token") else {
        return layout::missing(v, "Dead letters", "confirmation token");
    };
    let title = "Dead letters";
    if let Err(e) = catch_up(&ctx, None).await {
        return layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, title, e);
    }
    let conn = match ctx.app.broker.get(&ctx.settings.amqp).await {
        Ok(c) => c,
        Err(e) => return layout::failed(v, StatusCode::SERVICE_UNAVAILABLE, title, e),
    };
    let carried = dead_action::carry_out(&conn, &ctx.store, &ctx.settings, token).await;
    tracing::info!(who = %v.who, action = "dead letters", token, outcome = ?carried, "console");
    let conflict = |why: String| layout::failed(v, StatusCode::CONFLICT, title, why);
    match carried {
        Ok(Carried::Done(o)) => layout::done(v, o.verb.title(), o.said, "/console/dead"),
        Ok(Carried::Already(said)) => conflict(format!(
            "This confirmation was already carried out; nothing done again. It did: {said}"
        )),
        Ok(Carried::Changed { gone, of }) => conflict(format!(
            "Nothing done: {gone} of the {of} dead letter(s) listed were replayed or purged since the confirmation. Confirm again to see the set as it is now."
        )),
        Ok(Carried::Unknown) => conflict(
            "Nothing done: this confirmation is unknown or expired (an hour). Confirm again.".into(),
        ),
        Ok(Carried::Busy) => conflict(
            "Nothing done: another replay or purge walks the dead-letter queue now. Try again when it is done.".into(),
        ),
        Err(e) => layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, title, e),
    }
}

#[cfg(test)]
mod tests {
    use super::{escaped, resolve_tenant};

    #[test]
    fn a_tenant_is_found_whatever_its_case_and_kept_as_typed_when_unknown() {
        let known = ["Acme".to_string(), "beta".to_string()];
        assert_eq!(resolve_tenant("acme", &known), "Acme");
        assert_eq!(resolve_tenant("BETA", &known), "beta");
        assert_eq!(resolve_tenant("beta", &known), "beta");
        assert_eq!(resolve_tenant("gamma", &known), "gamma");
    }

    #[test]
    fn bytes_that_are_not_utf8_are_written_as_escapes_and_the_rest_kept() {
        assert_eq!(
            escaped(br#"{"b":1,"a":2}"#),
            (r#"{"b":1,"a":2}"#.into(), false)
        );
        assert_eq!(escaped("é<".as_bytes()), ("é<".into(), false));
        assert_eq!(escaped(b"a\xff\xfeb"), ("a\\xFF\\xFEb".into(), true));
    }
}
