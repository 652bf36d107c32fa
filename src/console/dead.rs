//! The dead letters (`/console/dead`): read from their index in Redis
//! ([`crate::admin::dead_index`]), filtered by reason, policy, channel and
//! recipient, newest first, 50 a page; one message with its headers and body;
//! replay one, and replay or purge what a filter selects, each after a confirmation
//! that says how many. Browsing never touches the queue: a page first catches the
//! index up with the dead-letter log ([`crate::admin::dead_log`], waiting at most
//! [`CATCH_UP_BUDGET`]); a replay or a purge walks the queue once
//! ([`crate::admin::DeadLetters::walk`], as `admin dead` does), selecting the ids
//! the index found, then forgets them in the index.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};
use tokio_util::sync::CancellationToken;

use super::fields::Fields;
use super::layout::Visitor;
use super::layout::{self, csrf, query, search, section, table, when, Input};
use super::session::{Action, Ctx, Page};
use super::Console;
use crate::admin::dead_index::{self, Entry, Filter};
use crate::admin::dead_log;
use crate::admin::{AdminError, DeadLetterInfo, DeadLetters, Selection, WalkAction, WalkReport};
use crate::amqp::Topology;

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
        let conn = app.broker(&settings).await?;
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
const FILTER_FIELDS: [&str; 5] = ["reason", "policy", "channel", "recipient", "tenant"];

fn filter(ctx: &Ctx, f: &Fields) -> Filter {
    let own = |k: &str| f.get(k).map(str::to_string);
    Filter {
        reason: own("reason"),
        policy: own("policy"),
        channel: own("channel"),
        recipient_tag: f.get("recipient").map(|r| {
            ctx.store
                .keys()
                .for_tenant(f.get("tenant"))
                .recipient_tag(r)
        }),
        id: None,
    }
}

fn pairs(f: &Fields) -> Vec<(&'static str, &str)> {
    FILTER_FIELDS
        .iter()
        .map(|k| (*k, f.get(k).unwrap_or("")))
        .collect()
}

fn filter_form(f: &Fields) -> Markup {
    let inputs = [
        Input("reason", "Reason", false),
        Input("policy", "Policy", false),
        Input("channel", "Channel", false),
        Input("recipient", "Recipient", false),
        Input("tenant", "Tenant", false),
    ];
    search("/console/dead", f, &inputs, "Filter")
}

fn hidden_filter(f: &Fields) -> Markup {
    html! { @for (k, v) in pairs(f) { @if !v.is_empty() { input type="hidden" name=(k) value=(v); } } }
}

fn rows(entries: &[Entry]) -> Markup {
    let head = ["When", "Job", "Reason", "Policy", "Channel", "Detail"];
    table(
        &head,
        html! { @for e in entries { tr {
            td { a href={ "/console/dead/one" (query(&[("key", &e.key)])) } { (when(e.at)) } }
            td { @if let Some(id) = &e.id { a href={ "/console/job" (query(&[("id", id)])) } { code { (id) } } } }
            td { code { (e.reason) } } td { (e.policy.clone().unwrap_or_default()) }
            td { (e.channel.clone().unwrap_or_default()) } td { (e.detail) }
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
    let caught = catch_up(&ctx, Some(CATCH_UP_BUDGET)).await;
    let conn = ctx.store.connection();
    let (total, entries) = match dead_index::page(
        &conn,
        ctx.store.keys(),
        &filter(&ctx, &f),
        (page - 1) * PAGE,
        PAGE,
    )
    .await
    {
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
        (filter_form(&f))
        (catching_up_note(&caught))
        (section("found", html! { (total) " dead letter(s) selected" @if total > 0 { ", newest first, page " (page) } }, html! {
            p.muted { "Read from the index the console keeps of the dead-letter log (console.dead_index), not from the queue." }
            (rows(&entries))
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
    let found = dead_index::read(&ctx.store.connection(), ctx.store.keys(), &[key.clone()]).await;
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
        (rows(std::slice::from_ref(&e)))
        (section("headers", "Headers and properties", html! { pre { (pretty(&e.properties)) } }))
        (section("body", "Body", html! { pre { (pretty(&e.body)) } }))
        form method="post" action="/console/dead/confirm" {
            (csrf(&ctx.visitor)) input type="hidden" name="key" value=(key); input type="hidden" name="action" value="replay";
            button type="submit" { "Replay this one…" }
        }
    };
    layout::page(&ctx.visitor, "Dead letter", body)
}

/// What an action selects: one entry (`key`) or a filter's (with the index caught
/// up first, so that a dead letter it selects in the queue is also forgotten).
async fn selected(ctx: &Ctx, f: &Fields) -> Result<Vec<String>, AdminError> {
    catch_up(ctx, None).await?;
    let conn = ctx.store.connection();
    match f.get("key") {
        Some(key) => Ok(
            dead_index::read(&conn, ctx.store.keys(), &[key.to_string()])
                .await?
                .into_iter()
                .map(|e| e.key)
                .collect(),
        ),
        None => Ok(dead_index::select(&conn, ctx.store.keys(), &filter(ctx, f)).await?),
    }
}

fn verb(f: &Fields) -> Option<(&'static str, WalkAction)> {
    match f.get("action") {
        Some("replay") => Some(("Replay", WalkAction::Replay)),
        Some("purge") => Some(("Purge", WalkAction::Drop)),
        _ => None,
    }
}

/// `POST /console/dead/confirm`: how many the action would take, and a button.
pub(super) async fn confirm(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let Some((word, _)) = verb(&f) else {
        return layout::missing(v, "Dead letters", "action");
    };
    let n = match selected(&ctx, &f).await {
        Ok(s) => s.len(),
        Err(e) => return layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Dead letters", e),
    };
    let body = html! {
        section role="alert" {
            p { (word) " " strong.count { (n) } " dead letter(s)?" }
            form method="post" action="/console/dead/apply" {
                (csrf(v)) (hidden_filter(&f))
                @if let Some(k) = f.get("key") { input type="hidden" name="key" value=(k); }
                input type="hidden" name="action" value=(f.get("action").unwrap_or(""));
                input type="hidden" name="expected" value=(n);
                button.danger type="submit" { (word) " " (n) }
            }
            p { a href="/console/dead" { "Cancel" } }
        }
    };
    layout::page(v, &format!("{word} dead letters"), body)
}

impl Console {
    /// The broker connection of the console's walks, opened (again) when needed.
    async fn broker(
        &self,
        settings: &crate::config::Settings,
    ) -> Result<Arc<lapin::Connection>, AdminError> {
        let mut held = self.broker.lock().await;
        if let Some(c) = held.as_ref().filter(|c| c.status().connected()) {
            return Ok(c.clone());
        }
        let conn = crate::amqp::connect_any(
            &settings.amqp_urls(),
            &settings.amqp.tls,
            "quota-worker console",
            settings.amqp.publish_timeout.0,
        )
        .await?;
        let conn = Arc::new(conn);
        *held = Some(conn.clone());
        Ok(conn)
    }
}

/// Walk the queue once, doing `action` to the dead letters with `ids`.
async fn walk(ctx: &Ctx, ids: Vec<String>, action: WalkAction) -> Result<WalkReport, AdminError> {
    let conn = ctx.app.broker(&ctx.settings).await?;
    let topology = Topology::from_settings(&ctx.settings);
    let selection = Selection {
        reasons: Vec::new(),
        ids,
    };
    let now = chrono::Utc::now();
    DeadLetters::new(&conn, &topology, ctx.settings.amqp.publish_timeout.0)
        .walk(&CancellationToken::new(), |d| {
            let info = DeadLetterInfo::read(&d.properties, &d.data, now, false);
            if selection.matches(&info) {
                action
            } else {
                WalkAction::Keep
            }
        })
        .await
}

/// `POST /console/dead/apply`: replay or purge what was confirmed.
pub(super) async fn apply(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let Some((word, action)) = verb(&f) else {
        return layout::missing(v, "Dead letters", "action");
    };
    let chosen = match selected(&ctx, &f).await {
        Ok(s) => s,
        Err(e) => return layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Dead letters", e),
    };
    let ids = dead_index::ids(&chosen);
    tracing::info!(who = %v.who, action = word, dead_letters = chosen.len(), "console");
    if ids.is_empty() {
        return layout::done(
            v,
            word,
            "Nothing selected (a dead letter without a job id cannot be selected).",
            "/console/dead",
        );
    }
    let report = match walk(&ctx, ids, action).await {
        Ok(r) => r,
        Err(e) => return layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, word, e),
    };
    if let Err(e) = dead_index::forget(&ctx.store.connection(), ctx.store.keys(), &chosen).await {
        tracing::warn!(error = %e, "console: the index keeps entries that were walked");
    }
    let what = format!(
        "{word}: {} replayed, {} purged, {} kept, of the {} in the queue.",
        report.replayed, report.dropped, report.kept, report.found
    );
    layout::done(v, word, what, "/console/dead")
}
