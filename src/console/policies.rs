//! The policies page (`/console/policies`): the policies, caps and channels in
//! force, the shadow policies' verdicts, the last reload, and a reload button (as
//! `POST /reload` and SIGHUP).

use axum::http::StatusCode;
use axum::response::Response;
use maud::html;

use super::layout::{self, csrf, section, table, table_or_none, when};
use super::session::{Action, Page};

/// `GET /console/policies`.
pub(super) async fn show(Page(ctx, _): Page) -> Response {
    let r = ctx.app.status.report(&ctx.app.health);
    let caps = ctx.store.rules();
    let shadow = crate::metrics::shadow_counts();
    let body = html! {
        (section("policies", "Policies", table(
            &["Policy", "Mode", "Rules", "Send windows", "Action", "Max wait"],
            html! { @for p in &r.policies { tr {
                td { (p.name) } td { (p.mode) } td { (p.rules.join(", ")) }
                td { (p.send_windows.clone().unwrap_or_default()) } td { (p.action) }
                td { (p.max_wait.clone().unwrap_or_default()) }
            } } },
        )))
        (section("caps", "Caps", table(
            &["Cap", "Mode", "Rules"],
            html! { @for c in caps.caps_of(None) { tr {
                td { (c.name) } td { (c.mode.as_str()) }
                td { @for (i, rule) in c.rules.iter().enumerate() { @if i > 0 { ", " } (rule.limit) " per " (rule.window) } }
            } } },
        )))
        (section("channels", "Channels", table(
            &["Channel", "Rate", "Send windows"],
            html! { @for c in &r.channels { tr {
                td { (c.name) } td { (c.rate.clone().unwrap_or_else(|| "not paced".into())) }
                td { (c.send_windows.clone().unwrap_or_default()) }
            } } },
        )))
        (section("shadow", "Shadow verdicts (since start)", table_or_none(
            shadow.is_empty(),
            &["Policy", "Verdict", "Jobs"],
            html! { @for s in &shadow { tr { td { (s.policy) } td { (s.verdict) } td.n { (s.jobs) } } } },
        )))
        (section("reload", "Reload", html! {
            @match &r.last_reload {
                Some(l) => p { "Last: " (l.result) " at " (when(l.at)) @for d in &l.detail { br; (d) } },
                None => p.muted { "No reload since start." },
            }
            form method="post" action="/console/policies/reload" {
                (csrf(&ctx.visitor))
                button type="submit" { "Reload the configuration" }
            }
        }))
    };
    layout::page(&ctx.visitor, "Policies", body)
}

/// `POST /console/policies/reload`.
pub(super) async fn reload(Action(ctx, _): Action) -> Response {
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
