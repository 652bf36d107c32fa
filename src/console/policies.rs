//! The policies page (`/console/policies`): the policies, caps and channels in
//! force, the shadow policies' verdicts, the last reload, and a reload button (as
//! `POST /reload` and SIGHUP).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use maud::html;

use super::layout::{self, csrf, when};
use super::session::{act, enter};
use super::Console;

/// `GET /console/policies`.
pub(super) async fn show(State(app): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let ctx = match enter(&app, &headers) {
        Ok(c) => c,
        Err(response) => return response,
    };
    let r = ctx.app.status.report(&ctx.app.health);
    let caps = ctx.store.rules();
    let shadow = crate::metrics::shadow_counts();
    let body = html! {
        section aria-labelledby="h-policies" {
            h2 #h-policies { "Policies" }
            div.scroll { table {
                thead { tr { th { "Policy" } th { "Mode" } th { "Rules" } th { "Send windows" } th { "Action" } th { "Max wait" } } }
                tbody { @for p in &r.policies { tr {
                    td { (p.name) } td { (p.mode) } td { (p.rules.join(", ")) }
                    td { (p.send_windows.clone().unwrap_or_default()) } td { (p.action) }
                    td { (p.max_wait.clone().unwrap_or_default()) }
                } } }
            } }
        }
        section aria-labelledby="h-caps" {
            h2 #h-caps { "Caps" }
            div.scroll { table {
                thead { tr { th { "Cap" } th { "Mode" } th { "Rules" } } }
                tbody { @for c in caps.caps_of(None) { tr {
                    td { (c.name) } td { (c.mode.as_str()) }
                    td { @for (i, rule) in c.rules.iter().enumerate() { @if i > 0 { ", " } (rule.limit) " per " (rule.window) } }
                } } }
            } }
        }
        section aria-labelledby="h-channels" {
            h2 #h-channels { "Channels" }
            div.scroll { table {
                thead { tr { th { "Channel" } th { "Rate" } th { "Send windows" } } }
                tbody { @for c in &r.channels { tr {
                    td { (c.name) } td { (c.rate.clone().unwrap_or_else(|| "not paced".into())) }
                    td { (c.send_windows.clone().unwrap_or_default()) }
                } } }
            } }
        }
        section aria-labelledby="h-shadow" {
            h2 #h-shadow { "Shadow verdicts (since start)" }
            @if shadow.is_empty() { p.muted { "None counted." } }
            @else { div.scroll { table {
                thead { tr { th { "Policy" } th { "Verdict" } th { "Jobs" } } }
                tbody { @for (p, v, n) in &shadow { tr { td { (p) } td { (v) } td.n { (n) } } } }
            } } }
        }
        section aria-labelledby="h-reload" {
            h2 #h-reload { "Reload" }
            @match &r.last_reload {
                Some(l) => p { "Last: " (l.result) " at " (when(l.at)) @for d in &l.detail { br; (d) } },
                None => p.muted { "No reload since start." },
            }
            form method="post" action="/console/policies/reload" {
                (csrf(&ctx.visitor))
                button type="submit" { "Reload the configuration" }
            }
        }
    };
    layout::page(&ctx.visitor, "Policies", body)
}

/// `POST /console/policies/reload`.
pub(super) async fn reload(
    State(app): State<Arc<Console>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (ctx, _) = match act(&app, &headers, &body) {
        Ok(c) => c,
        Err(response) => return response,
    };
    let Some(reloader) = ctx.app.status.reloader().cloned() else {
        return layout::failed(
            &ctx.visitor,
            StatusCode::SERVICE_UNAVAILABLE,
            "Reload",
            "not connected yet",
        );
    };
    tracing::info!(who = %ctx.visitor.who, action = "reload", "console");
    // the configuration is read from its file: not on the server's threads
    match tokio::task::spawn_blocking(move || reloader.reload()).await {
        Ok(Ok(changes)) if changes.is_empty() => layout::done(
            &ctx.visitor,
            "Reload",
            "Reloaded: nothing changed.",
            "/console/policies",
        ),
        Ok(Ok(changes)) => layout::done(
            &ctx.visitor,
            "Reload",
            format!("Reloaded: {}", changes.join("; ")),
            "/console/policies",
        ),
        Ok(Err(e)) => layout::failed(&ctx.visitor, StatusCode::BAD_REQUEST, "Reload refused", e),
        Err(e) => layout::failed(&ctx.visitor, StatusCode::INTERNAL_SERVER_ERROR, "Reload", e),
    }
}
