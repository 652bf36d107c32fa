//! The overview (`/console`): readiness, queue depths by role (and by lane of a
//! paced channel, the tenants waiting and the ones with most jobs), the jobs settled
//! by outcome over the minutes sampled (15 at most, fewer since start; the column
//! says which), dead letters by reason: the status page's
//! [`crate::status::Report`], drawn on the server.

use axum::response::Response;
use maud::{html, Markup};

use super::layout::{self, section, table_with, when, Visitor};
use super::session::Page;
use crate::status::Report;

/// `GET /console`.
pub(super) async fn show(Page(ctx, _): Page) -> Response {
    let report = ctx.app.status.report(&ctx.app.health);
    layout::page(&ctx.visitor, "Overview", sections(&ctx.visitor, &report))
}

fn up(ok: bool) -> Markup {
    html! { @if ok { span.ok { "up" } } @else { span.bad { "down" } } }
}

/// The head of the column of the jobs settled in the last `seconds` sampled (the
/// worker keeps 15 minutes of samples; fewer since it started).
fn recent(seconds: u64) -> String {
    match seconds {
        0 => "Last minutes (none sampled yet)".into(),
        s if s < 120 => format!("Last {s} s"),
        s => format!("Last {} min", s / 60),
    }
}

/// The lanes of paced channels with tenants waiting in their own queues (fair
/// shares): how many, and the ones with the most jobs waiting. Nothing when no
/// tenant waits.
fn tenants(r: &Report) -> Markup {
    let lanes: Vec<_> = r
        .queues
        .iter()
        .filter_map(|q| q.tenants.as_ref().map(|t| (q, t)))
        .filter(|(_, t)| t.waiting > 0)
        .collect();
    if lanes.is_empty() {
        return html! {};
    }
    html! {
        h3 { "Tenants waiting by lane" }
        (table_with(&["Lane", "Tenants waiting", "Most jobs waiting"], &[1], html! { @for (q, t) in &lanes { tr {
            td.mono { (q.detail.clone().unwrap_or_else(|| q.name.clone())) }
            td.n { (t.waiting) }
            td { @for (i, (tenant, n)) in t.top.iter().enumerate() {
                @if i > 0 { ", " }
                span.mono { (tenant) } " " span.muted { (n) }
            } }
        } } }))
    }
}

/// The overview's sections for `r`.
fn sections(v: &Visitor, r: &Report) -> Markup {
    let window = r.period_seconds * r.rates.first().map_or(0, |s| s.counts.len()) as u64;
    html! {
        (section("ready", "Readiness", html! {
            p {
                @if r.ready { strong.ok { "ready" } } @else { strong.bad { "not ready" } }
                " · broker " (up(r.broker)) " · Redis " (up(r.redis))
                " · version " (r.version) " · " (when(v, r.at))
            }
            @if r.redis_resets.paused {
                p.bad { "Jobs are held since Redis was found without its data: "
                    (r.redis_resets.paused_because.clone().unwrap_or_default()) " (quota-worker admin resume)" }
            }
        }))
        (section("queues", "Queues", html! {
            p.muted { "Read " (r.queues_at.map(|t| when(v, t)).unwrap_or_else(|| "not yet".into())) }
            (table_with(&["Role", "Queue", "Ready", "Consumers"], &[2, 3], html! { @for q in &r.queues { tr {
                td { (q.role) @if let Some(d) = &q.detail { " " span.muted { (d) } } }
                td.mono { (q.name) }
                td.n { (q.ready.map_or("missing".into(), |n| n.to_string())) }
                td.n { (q.consumers.map_or("–".into(), |n| n.to_string())) }
            } } }))
            (tenants(r))
        }))
        (section("settled", "Settled by outcome", table_with(
            &["Outcome", &recent(window), "Since start"],
            &[1, 2],
            html! { @for s in &r.rates { tr {
                td { (s.outcome) }
                td.n { (s.counts.iter().sum::<u64>()) }
                td.n { (r.totals.iter().find(|(o, _)| o == s.outcome).map_or(0, |(_, n)| *n)) }
            } } },
        )))
        (section("dead", "Dead letters by reason (since start)", table_with(
            &["Reason", "Jobs"],
            &[1],
            html! { @for (reason, n) in r.dead_by_reason.iter().filter(|(_, n)| *n > 0) { tr {
                td { a href={ "/console/dead" (layout::query(&[("reason", reason)])) } { (reason) } }
                td.n { (n) }
            } } },
        )))
    }
}
