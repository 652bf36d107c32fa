//! The overview (`/console`): readiness, queue depths by role, the jobs settled
//! by outcome over the last 15 minutes, dead letters by reason: the status page's
//! [`crate::status::Report`], drawn on the server.

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use maud::{html, Markup};

use super::layout::{self, when};
use super::session::enter;
use super::Console;
use crate::status::Report;

/// `GET /console`.
pub(super) async fn show(State(app): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let ctx = match enter(&app, &headers) {
        Ok(c) => c,
        Err(response) => return response,
    };
    let report = ctx.app.status.report(&ctx.app.health);
    layout::page(&ctx.visitor, "Overview", sections(&report))
}

fn up(ok: bool) -> Markup {
    html! { @if ok { span.ok { "up" } } @else { span.bad { "down" } } }
}

/// The overview's sections for `r`.
fn sections(r: &Report) -> Markup {
    let window = r.period_seconds * r.rates.first().map_or(0, |s| s.counts.len()) as u64;
    html! {
        section aria-labelledby="h-ready" {
            h2 #h-ready { "Readiness" }
            p {
                @if r.ready { strong.ok { "ready" } } @else { strong.bad { "not ready" } }
                " · broker " (up(r.broker)) " · Redis " (up(r.redis))
                " · version " (r.version) " · " (when(r.at))
            }
            @if r.redis_resets.paused {
                p.bad { "Jobs are held since Redis was found without its data: "
                    (r.redis_resets.paused_because.clone().unwrap_or_default()) " (quota-worker admin resume)" }
            }
        }
        section aria-labelledby="h-queues" {
            h2 #h-queues { "Queues" }
            p.muted { "Read " (r.queues_at.map(when).unwrap_or_else(|| "not yet".into())) }
            div.scroll { table {
                thead { tr { th { "Role" } th { "Queue" } th { "Ready" } th { "Consumers" } } }
                tbody { @for q in &r.queues { tr {
                    td { (q.role) @if let Some(d) = &q.detail { " " span.muted { (d) } } }
                    td.mono { (q.name) }
                    td.n { (q.ready.map_or("missing".into(), |n| n.to_string())) }
                    td.n { (q.consumers.map_or("–".into(), |n| n.to_string())) }
                } } }
            } }
        }
        section aria-labelledby="h-settled" {
            h2 #h-settled { "Settled, last " (window / 60) " min" }
            div.scroll { table {
                thead { tr { th { "Outcome" } th { "Last 15 min" } th { "Since start" } } }
                tbody { @for s in &r.rates { tr {
                    td { (s.outcome) }
                    td.n { (s.counts.iter().sum::<u64>()) }
                    td.n { (r.totals.iter().find(|(o, _)| o == s.outcome).map_or(0, |(_, n)| *n)) }
                } } }
            } }
        }
        section aria-labelledby="h-dead" {
            h2 #h-dead { "Dead letters by reason (since start)" }
            div.scroll { table {
                thead { tr { th { "Reason" } th { "Jobs" } } }
                tbody { @for (reason, n) in r.dead_by_reason.iter().filter(|(_, n)| *n > 0) { tr {
                    td { a href={ "/console/dead" (layout::query(&[("reason", reason)])) } { (reason) } }
                    td.n { (n) }
                } } }
            } }
        }
    }
}
