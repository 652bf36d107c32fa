//! A recipient (`/console/recipient?recipient=R&tenant=T`): why their
//! notifications wait and until when. Every layer that counts them (each policy and
//! cap, per channel where it counts per channel) with the sends it counts and the
//! next allowed instant in their zone and in UTC; their preferences (edited
//! through the REST API's validation, [`crate::admin::preferences::put`]); their
//! suppressions (removed one by one); their waiting jobs; their open digests
//! (flushed one by one). Reads through [`crate::admin::Recipients`], as `admin
//! recipient` does.

use axum::http::StatusCode;
use axum::response::Response;
use chrono_tz::Tz;
use maud::{html, Markup};

use super::fields::Fields;
use super::layout::Visitor;
use super::layout::{self, csrf, query, search, section, table, table_or_none, when, Input};
use super::session::{Action, Ctx, Page};
use crate::admin::preferences::EditError;
use crate::admin::recipients::{NextAllowed, RuleStatus, Send};
use crate::admin::{RecipientQuery, RecipientStatus, Recipients};

/// Waiting jobs listed at most.
const WAITING_SHOWN: usize = 100;

/// `GET /console/recipient`.
pub(super) async fn show(Page(ctx, q): Page) -> Response {
    let form = search_form(&q);
    let Some(recipient) = q.get("recipient") else {
        return layout::page(&ctx.visitor, "Recipient", form);
    };
    let tz = match q.get("timezone").map(str::parse::<Tz>) {
        Some(Err(e)) => {
            return layout::failed(&ctx.visitor, StatusCode::BAD_REQUEST, "Recipient", e)
        }
        Some(Ok(tz)) => Some(tz),
        None => None,
    };
    match read(&ctx, recipient, q.get("tenant"), tz).await {
        Ok((status, waiting)) => {
            let body = html! {
                (form)
                (summary(&status))
                (layers(&status))
                (waiting_jobs(&waiting, status.waiting))
                (digests(&ctx.visitor, &status, recipient))
                (suppressions(&ctx.visitor, &status, recipient))
                (preferences_form(&ctx.visitor, &status, recipient))
            };
            layout::page(&ctx.visitor, "Recipient", body)
        }
        Err(e) => layout::failed(&ctx.visitor, StatusCode::BAD_REQUEST, "Recipient", e),
    }
}

/// Waiting jobs: id, until when, and when it was cancelled if it was.
type Waiting = Vec<(
    String,
    chrono::DateTime<chrono::Utc>,
    Option<chrono::DateTime<chrono::Utc>>,
)>;

async fn read(
    ctx: &Ctx,
    recipient: &str,
    tenant: Option<&str>,
    tz: Option<Tz>,
) -> Result<(RecipientStatus, Waiting), crate::admin::AdminError> {
    let recipients = Recipients::new(&ctx.store, &ctx.settings);
    let (tz, from) = recipients.zone(recipient, tz).await?;
    let q = RecipientQuery {
        recipient,
        category: None,
        channel: None,
        tz,
        tenant,
    };
    let mut status = recipients.status(&q).await?;
    status.timezone_from = Some(from);
    let keys = ctx.store.keys().for_tenant(tenant);
    let conn = ctx.store.connection();
    let waiting = crate::redis::notes::waiting_jobs(&conn, &keys, recipient, WAITING_SHOWN).await?;
    let marks: std::collections::HashMap<String, _> =
        crate::redis::notes::cancel_marks(&conn, ctx.store.keys())
            .await?
            .into_iter()
            .collect();
    let waiting = waiting
        .into_iter()
        .map(|(id, until)| {
            let cancelled = marks.get(&id).copied();
            (id, until, cancelled)
        })
        .collect();
    Ok((status, waiting))
}

fn search_form(q: &Fields) -> Markup {
    let inputs = [
        Input("recipient", "Recipient", true),
        Input("tenant", "Tenant (optional)", false),
        Input("timezone", "Zone (optional, e.g. Europe/Paris)", false),
    ];
    search("/console/recipient", q, &inputs, "Find")
}

fn summary(s: &RecipientStatus) -> Markup {
    section(
        "who",
        "Recipient",
        html! {
            p { "Tag " code { (s.recipient_tag) }
                @if let Some(t) = &s.tenant { " · tenant " (t) }
                " · zone " strong { (s.timezone) }
                @if let Some(f) = &s.timezone_from { " " span.muted { "(" (f.to_string()) ")" } }
                " · now " (when(s.now)) }
        },
    )
}

fn next(n: &Option<NextAllowed>) -> Markup {
    html! {
        @match n {
            None => span.bad { "never" },
            Some(n) if n.now => span.ok { "now" },
            Some(n) => span.next-allowed { strong.local { (n.local) } br; span.utc { (when(n.utc)) } },
        }
    }
}

fn rules(rules: &[RuleStatus]) -> Markup {
    html! { @for r in rules { div { (r.count) " / " (r.limit) " per " (r.window)
    @if r.full { " " span.bad { "full" } } } } }
}

fn sends(sends: &[Send]) -> Markup {
    html! { @if sends.is_empty() { span.muted { "none" } } @else { details {
        summary { (sends.iter().filter(|s| s.counting).count()) " counting, " (sends.len()) " remembered" }
        ul { @for s in sends { li { code { (s.member) } " " (when(s.at)) " (" (s.at_local) ") " (s.state)
            @if !s.counting { " " span.muted { "not counting" } } } } }
    } } }
}

fn layers(s: &RecipientStatus) -> Markup {
    let head = [
        "Layer",
        "Channel",
        "Counted",
        "Sends",
        "Next allowed (their zone, then UTC)",
    ];
    let rows = html! {
        @for p in &s.policies { tr {
            td { "policy " (p.policy) " (" (p.action) ")"
                @for w in &p.send_windows { br; span.muted { (w) } } }
            td { (p.channel.clone().unwrap_or_else(|| "all".into())) }
            td { (rules(&p.rules)) } td { (sends(&p.sends)) } td { (next(&p.next_allowed)) }
        } }
        @for c in &s.caps { tr {
            td { "cap " (c.cap) " (" (c.mode) ")" }
            td { (c.channel.clone().unwrap_or_else(|| "all".into())) }
            td { (rules(&c.rules)) } td { (sends(&c.sends)) } td { (next(&c.next_allowed)) }
        } }
    };
    section(
        "layers",
        "What holds them: policies and caps",
        table(&head, rows),
    )
}

fn waiting_jobs(waiting: &Waiting, count: Option<u64>) -> Markup {
    let rows = html! { @for (id, until, cancelled) in waiting { tr {
        td { a href={ "/console/job" (query(&[("id", id)])) } { code { (id) } } }
        td { (when(*until)) }
        td { @if let Some(at) = cancelled { strong { "cancelled" } " " (when(*at)) " (ends as a dead letter at its next handling)" } }
    } } };
    section(
        "waiting",
        "Waiting jobs",
        html! {
            @match count {
                None => p.muted { "Not noted (redis.notes = false)." },
                Some(0) => p.muted { "None." },
                Some(n) => {
                    p { (n) " waiting" @if n as usize > waiting.len() { " (the first " (waiting.len()) " shown)" } }
                    (table(&["Job", "Until", "Cancel"], rows))
                },
            }
        },
    )
}

fn hidden(recipient: &str, tenant: &Option<String>) -> Markup {
    html! {
        input type="hidden" name="recipient" value=(recipient);
        @if let Some(t) = tenant { input type="hidden" name="tenant" value=(t); }
    }
}

fn digests(v: &Visitor, s: &RecipientStatus, recipient: &str) -> Markup {
    let head = ["Digest", "Group", "Items", "Closes", "State", ""];
    let rows = html! { @for d in &s.digests { tr {
        td { code { (d.id) } } td { (d.channel) " / " (d.key) } td.n { (d.count) }
        td { (d.closes_at.map(when).unwrap_or_default()) } td { (d.state) }
        td { form.inline method="post" action="/console/digest/flush" {
            (csrf(v)) (hidden(recipient, &s.tenant))
            input type="hidden" name="id" value=(d.id);
            button type="submit" aria-label={ "Flush digest " (d.id) } { "Flush" }
        } }
    } } };
    section(
        "digests",
        "Open digests",
        table_or_none(s.digests.is_empty(), &head, rows),
    )
}

fn suppressions(v: &Visitor, s: &RecipientStatus, recipient: &str) -> Markup {
    let head = ["Channel", "Event", "Since", "Until", ""];
    let rows = html! { @for x in &s.suppressions { tr {
        td { (x.channel) } td { (x.event) } td { (when(x.since)) }
        td { (x.until.map(when).unwrap_or_else(|| "removed".into())) }
        td { form.inline method="post" action="/console/recipient/unsuppress" {
            (csrf(v)) (hidden(recipient, &s.tenant))
            input type="hidden" name="channel" value=(x.channel);
            button.danger type="submit" aria-label={ "Remove the suppression on " (x.channel) } { "Remove" }
        } }
    } } };
    let empty = s.suppressions.is_empty();
    section(
        "suppressions",
        "Suppressions",
        table_or_none(empty, &head, rows),
    )
}

fn preferences_form(v: &Visitor, s: &RecipientStatus, recipient: &str) -> Markup {
    let shown = s.preferences.as_ref().map(|p| {
        let mut p = p.clone();
        if let Some(m) = p.as_object_mut() {
            m.remove("updated_at");
        }
        serde_json::to_string_pretty(&p).unwrap_or_default()
    });
    section(
        "prefs",
        "Preferences and quiet hours",
        html! {
            @if let Some(at) = s.preferences.as_ref().and_then(|p| p.get("updated_at")).and_then(|a| a.as_str()) {
                p.muted { "Updated " (at) }
            }
            form method="post" action="/console/recipient/preferences" {
                (csrf(v)) (hidden(recipient, &s.tenant))
                label for="preferences" { "The set, as the preferences API takes it (JSON; empty removes it)" }
                textarea #preferences name="preferences" { (shown.unwrap_or_default()) }
                button type="submit" { "Save" }
            }
        },
    )
}

fn back(f: &Fields) -> String {
    format!(
        "/console/recipient{}",
        query(&[
            ("recipient", f.get("recipient").unwrap_or("")),
            ("tenant", f.get("tenant").unwrap_or(""))
        ])
    )
}

/// Replace the set (as `PUT`), or remove it.
async fn preferences_save(ctx: Ctx, f: Fields) -> Response {
    let v = &ctx.visitor;
    let Some(recipient) = f.get("recipient") else {
        return layout::missing(v, "Preferences", "recipient");
    };
    let tenant = f.get("tenant");
    let tag = ctx.store.keys().for_tenant(tenant).recipient_tag(recipient);
    tracing::info!(who = %v.who, action = "preferences", recipient_tag = %tag, "console");
    let Some(text) = f.get("preferences") else {
        return match crate::admin::preferences::delete(&ctx.store, tenant, recipient).await {
            Ok(_) => layout::done(v, "Preferences", "Preferences removed.", &back(&f)),
            Err(e) => layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Preferences", e),
        };
    };
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(e) => {
            return layout::failed(
                v,
                StatusCode::BAD_REQUEST,
                "Preferences",
                format!("not JSON: {e}"),
            )
        }
    };
    match crate::admin::preferences::put(&ctx.store, tenant, recipient, &value).await {
        Ok(_) => layout::done(v, "Preferences", "Preferences saved.", &back(&f)),
        Err(e @ (EditError::Invalid(_) | EditError::Conflict(_))) => {
            layout::failed(v, StatusCode::BAD_REQUEST, "Preferences refused", e)
        }
        Err(e) => layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Preferences", e),
    }
}

/// `POST /console/recipient/preferences`.
pub(super) async fn preferences(Action(ctx, f): Action) -> Response {
    preferences_save(ctx, f).await
}

/// `POST /console/recipient/unsuppress`: lift one suppression.
pub(super) async fn unsuppress(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let (Some(recipient), Some(channel)) = (f.get("recipient"), f.get("channel")) else {
        return layout::missing(v, "Suppression", "recipient or channel");
    };
    let tag = ctx
        .store
        .keys()
        .for_tenant(f.get("tenant"))
        .recipient_tag(recipient);
    tracing::info!(who = %v.who, action = "unsuppress", recipient_tag = %tag, channel, "console");
    match crate::admin::suppressions::unsuppress(&ctx.store, recipient, channel).await {
        Ok(true) => layout::done(
            v,
            "Suppression",
            format!("The suppression on {channel} is removed."),
            &back(&f),
        ),
        Ok(false) => layout::done(
            v,
            "Suppression",
            format!("There was no suppression on {channel}."),
            &back(&f),
        ),
        Err(e) => layout::failed(v, StatusCode::INTERNAL_SERVER_ERROR, "Suppression", e),
    }
}

/// `POST /console/digest/flush`: close one digest now.
pub(super) async fn flush(Action(ctx, f): Action) -> Response {
    let v = &ctx.visitor;
    let Some(id) = f.get("id") else {
        return layout::missing(v, "Digest", "digest id");
    };
    tracing::info!(who = %v.who, action = "flush", digest = id, "console");
    match crate::admin::Digests::new(&ctx.store).flush(id).await {
        Ok(d) => layout::done(
            v,
            "Digest",
            format!("Digest {} flushed with {} item(s).", d.id, d.count),
            &back(&f),
        ),
        Err(e) => layout::failed(v, StatusCode::BAD_REQUEST, "Digest", e),
    }
}
