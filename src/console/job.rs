//! A job (`/console/job?id=J`): what `admin job` tells, as a timeline: when a
//! worker first saw it, the last decision noted (its instant, cause and held-by
//! text, the digest that holds it), a cancel mark, its sender's feedback, its dead
//! letter in the index; its trace as a link when `console.trace_url` is set; and
//! cancel while it waits ([`crate::admin::Jobs::cancel`]).

use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};

use super::layout::{self, csrf, query, search, section, when, Input, Visitor};
use super::session::{Action, Ctx, Page};
use crate::admin::dead_index::{self, Entry};
use crate::admin::{JobStatus, Jobs};
use crate::fallback::log::StepOutcome;
use crate::job::note::{JobState, Place};

/// `GET /console/job`.
pub(super) async fn show(Page(ctx, q): Page) -> Response {
    let form = search("/console/job", &q, &[Input("id", "Job id", true)], "Find");
    let Some(id) = q.get("id") else {
        return layout::page(&ctx.visitor, "Job", form);
    };
    let status = match Jobs::new(&ctx.store, &ctx.settings).explain(id).await {
        Ok(s) => s,
        Err(e) => return layout::failed(&ctx.visitor, StatusCode::INTERNAL_SERVER_ERROR, "Job", e),
    };
    let caught = super::dead::catch_up(&ctx, Some(super::dead::CATCH_UP_BUDGET)).await;
    let dead = dead_index::entry_of(&ctx.store.connection(), ctx.store.keys(), id)
        .await
        .ok()
        .flatten();
    let note = super::dead::catching_up_note(&caught);
    let body = html! { (form) (note) (timeline(&ctx, &status, dead.as_ref())) (cancel_form(&ctx, &status, dead.as_ref())) };
    layout::page(&ctx.visitor, "Job", body)
}

/// Where the job is, in words; `in_index`: whether the dead-letter index still
/// holds its dead letter (a replayed or purged one is forgotten there).
fn place(v: &Visitor, p: &Place, in_index: bool) -> String {
    match p {
        Place::Dead if !in_index => "dead-lettered, then taken out of the dead-letter queue (replayed or purged; a replayed job sent at its first handling leaves no newer note)".into(),
        Place::DelayQueue { queue } => format!("waiting in the delay queue {queue}"),
        Place::JobsQueue { since } => format!("back in the jobs queue since {}", when(v, *since)),
        Place::Dead => "in the dead-letter queue".into(),
        Place::Dispatched => "dispatched".into(),
        Place::Superseded => "superseded by a newer job".into(),
        Place::Digest { digest, closes_at } => {
            format!("in digest {digest}, sent when it closes at {}", when(v, *closes_at))
        }
        Place::Unknown => "no note: sent at its first handling, still in the jobs queue for the first time, or its note expired".into(),
    }
}

fn step(v: &Visitor, s: &JobState) -> Markup {
    html! {
        @match s {
            JobState::Delayed { until, cause, held_by, sends_seen, .. } => {
                strong { "delayed" } " until " (when(v, *until)) " · cause " code { (cause) } br;
                "held by " (held_by)
                @if let Some(n) = sends_seen { " · " (n) " send(s) seen" }
            },
            JobState::Dead { reason, detail } => { strong { "dead-lettered" } " · " code { (reason) } " · " (detail) },
            JobState::Dispatched => strong { "dispatched" },
            JobState::Superseded { by } => { strong { "superseded" } " by " a href={ "/console/job" (query(&[("id", by)])) } { (by) } },
            JobState::Folded { closes_at, digest } => {
                strong { "folded" } " into digest " code { (digest) } ", closing " (when(v, *closes_at))
            },
        }
    }
}

fn timeline(ctx: &Ctx, s: &JobStatus, dead: Option<&Entry>) -> Markup {
    let v = &ctx.visitor;
    let trace = s.record.as_ref().and_then(|r| r.trace_id.clone());
    let title = html! { "Job " code { (s.id) } };
    section(
        "where",
        title,
        html! {
            @if let Some(at) = s.cancelled_at {
                p { strong { "Cancelled" } " at " (when(v, at)) ": it ends as a dead letter " code { "cancelled" } " at its next handling. Until then: " (place(v, &s.place, dead.is_some())) " (" (when(v, s.now)) ")." }
            } @else if !seen(s, dead) {
                p { "No job with this id was seen: no worker noted it, its sender gave no feedback, and no dead letter has it (a job sent at its first handling leaves no note either)." }
            } @else {
                p { "Now " (place(v, &s.place, dead.is_some())) " (" (when(v, s.now)) ")." }
            }
            @if let Some(r) = &s.record {
                p.muted { "Channel " (r.channel) @if let Some(p) = &r.policy { " · policy " (p) }
                    @if let Some(t) = &r.tenant { " · tenant " (t) }
                    @if let Some(z) = &r.zone { " · zone " (z) } " · attempt " (r.attempt) }
            }
            @if let Some(t) = &trace {
                p { "Trace " @match ctx.settings.console.trace_link(t) {
                    Some(link) => a href=(link) rel="noreferrer" { code { (t) } },
                    None => code { (t) },
                } }
            }
            h2 { "Timeline" }
            ol.timeline {
                @if let Some(r) = &s.record {
                    li { (when(v, r.first_seen)) " · first seen by a worker" }
                    li { (when(v, r.at)) " · " (step(v, &r.step)) }
                }
                @if let Some(at) = s.cancelled_at { li { (when(v, at)) " · " strong { "cancelled" } " (ends as a dead letter `cancelled` at its next handling)" } }
                @for f in &s.feedback {
                    li { (f.at.clone().unwrap_or_else(|| "?".into())) " · sender: " code { (f.event) }
                        @if let Some(d) = &f.detail { " · " (d) } }
                }
                @for e in &s.route {
                    li { (when(v, e.at)) " · step " (e.step) "/" (e.of) " on " code { (e.channel) } " · "
                        @match e.outcome {
                            StepOutcome::Dispatched => strong { "dispatched" },
                            StepOutcome::Answered => { strong { "answered" } " (its escalation sent nothing more)" },
                        }
                        @if let Some(l) = &e.left { " · left " (l) } }
                }
                @if let Some(at) = s.escalates_at {
                    li { (when(v, at)) " · " strong { "escalates" } " unless answered" }
                }
                @if let Some(d) = dead {
                    li { (when(v, d.at)) " · dead letter " code { (d.reason) } " · "
                        a href={ "/console/dead/one" (query(&[("key", &d.key)])) } { "the message" } }
                }
                @if s.record.is_none() && s.feedback.is_empty() && dead.is_none() { li.muted { "Nothing noted." } }
            }
        },
    )
}

/// Whether anything says a job with this id was seen.
fn seen(s: &JobStatus, dead: Option<&Entry>) -> bool {
    s.record.is_some()
        || !s.feedback.is_empty()
        || !s.route.is_empty()
        || s.escalates_at.is_some()
        || dead.is_some()
}

/// Whether the job may still be cancelled: it waits (delayed, folded into a
/// digest, or an escalation pending), or nothing was seen of it.
fn cancellable(s: &JobStatus, dead: Option<&Entry>) -> bool {
    if s.cancelled_at.is_some() {
        return false;
    }
    s.escalates_at.is_some()
        || match &s.record {
            None => dead.is_none(),
            Some(r) => matches!(r.step, JobState::Delayed { .. } | JobState::Folded { .. }),
        }
}

fn cancel_form(ctx: &Ctx, s: &JobStatus, dead: Option<&Entry>) -> Markup {
    html! {
        @if cancellable(s, dead) {
            (section("cancel", "Cancel", html! {
                form method="post" action="/console/job/cancel" {
                    (csrf(&ctx.visitor))
                    input type="hidden" name="id" value=(s.id);
                    button.danger type="submit" {
                        @if seen(s, dead) { "Cancel this job…" } @else { "Leave a cancel mark…" }
                    }
                }
            }))
        }
    }
}

/// `POST /console/job/cancel`: a confirmation saying what the job is (or that
/// none was seen), then, confirmed, the cancel mark.
pub(super) async fn cancel(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let Some(id) = f.get("id") else {
        return layout::missing(v, "Cancel", "job id");
    };
    let back = format!("/console/job{}", query(&[("id", id)]));
    let jobs = Jobs::new(&ctx.store, &ctx.settings);
    let status = match jobs.explain(id).await {
        Ok(s) => s,
        Err(e) => return layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Cancel", e),
    };
    let dead = dead_index::entry_of(&ctx.store.connection(), ctx.store.keys(), id)
        .await
        .ok()
        .flatten();
    if !cancellable(&status, dead.as_ref()) {
        let why = match (&status.cancelled_at, &dead) {
            (Some(at), _) => format!("job `{id}` was cancelled already, at {}", when(v, *at)),
            (None, Some(d)) => format!(
                "job `{id}` is a dead letter (`{}`): nothing waits to be cancelled",
                d.reason
            ),
            (None, None) => format!(
                "job `{id}` is {}: nothing waits to be cancelled",
                place(v, &status.place, false)
            ),
        };
        return layout::failed(v, StatusCode::CONFLICT, "Cancel", why);
    }
    let seen = seen(&status, dead.as_ref());
    if f.get("confirmed") != Some("yes") {
        return confirm_cancel(v, id, seen, &status, dead.as_ref(), &back);
    }
    tracing::info!(who = %v.who, action = "cancel", job_id = id, seen, "console");
    match jobs.cancel(id).await {
        Ok(c) if seen => layout::done(
            v,
            "Cancel",
            format!(
                "Job {} is marked cancelled{}: it ends as a dead letter `cancelled` at its next handling (every worker knows within {} ms).",
                c.id,
                if c.already { " (it was already)" } else { "" },
                c.known_within_ms
            ),
            &back,
        ),
        Ok(c) => layout::done(
            v,
            "Cancel",
            format!(
                "No job with id {} was seen; a cancel mark is left: a job published with this id while the mark lasts ends as a dead letter `cancelled`.",
                c.id
            ),
            &back,
        ),
        Err(e) => layout::failed(v, StatusCode::CONFLICT, "Cancel", e),
    }
}

fn confirm_cancel(
    v: &Visitor,
    id: &str,
    seen: bool,
    s: &JobStatus,
    dead: Option<&Entry>,
    back: &str,
) -> Response {
    let body = html! {
        section role="alert" {
            @if seen {
                p { "Cancel job " code { (id) } "? It is " (place(v, &s.place, dead.is_some())) "; cancelled, it ends as a dead letter " code { "cancelled" } " at its next handling." }
            } @else {
                p { "No job with id " code { (id) } " was seen: no worker noted it, its sender gave no feedback, and no dead letter has it. Leave a cancel mark anyway? A job published later with this id would end as a dead letter " code { "cancelled" } "." }
            }
            form method="post" action="/console/job/cancel" {
                (csrf(v))
                input type="hidden" name="id" value=(id);
                input type="hidden" name="confirmed" value="yes";
                button.danger type="submit" { @if seen { "Cancel job " (id) } @else { "Leave a cancel mark for " (id) } }
            }
            p { a href=(back) { "Keep it" } }
        }
    };
    layout::page(v, "Cancel", body)
}
