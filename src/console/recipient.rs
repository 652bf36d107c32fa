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
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use maud::{html, Markup};

use super::fields::Fields;
use super::layout::Visitor;
use super::layout::{
    self, csrf, in_zone, query, search, section, stacked, table_or_none, utc, when, Input,
};
use super::session::{Action, Ctx, Page};
use crate::admin::preferences::EditError;
use crate::admin::recipients::{NextAllowed, RuleStatus, Send, ZoneFrom};
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
        Ok((zoned, waiting)) => {
            let v = &ctx.visitor;
            let status = &zoned[0].1;
            let body = html! {
                (form)
                (summary(v, status))
                @for (i, (jobs, s)) in zoned.iter().enumerate() { (layers(v, i, jobs, s)) }
                (waiting_jobs(v, &waiting, status.waiting))
                (digests(v, status, recipient))
                (suppressions(v, status, recipient))
                (preferences_form(v, status, recipient))
            };
            layout::page(v, "Recipient", body)
        }
        Err(e) => layout::failed(&ctx.visitor, StatusCode::BAD_REQUEST, "Recipient", e),
    }
}

/// One waiting job: its id, until when, when it was cancelled if it was, and the
/// zone its note says it was decided in.
struct WaitingJob {
    id: String,
    until: DateTime<Utc>,
    cancelled: Option<DateTime<Utc>>,
    zone: Option<Tz>,
}

/// The recipient's layers counted in each zone its waiting jobs were decided in
/// (at most [`ZONES_SHOWN`], soonest job first), with those jobs' ids; in the
/// zone given, or the worker's default, when none is. A day's window begins at a
/// zone's midnight: each job is waited for in its own.
type Zoned = Vec<(Vec<String>, RecipientStatus)>;

/// Zones the layers are counted in at most.
const ZONES_SHOWN: usize = 3;

async fn waiting_of(
    ctx: &Ctx,
    recipient: &str,
    tenant: Option<&str>,
) -> Result<Vec<WaitingJob>, crate::admin::AdminError> {
    let keys = ctx.store.keys().for_tenant(tenant);
    let conn = ctx.store.connection();
    let waiting = crate::redis::notes::waiting_jobs(&conn, &keys, recipient, WAITING_SHOWN).await?;
    let marks: std::collections::HashMap<String, _> =
        crate::redis::notes::cancel_marks(&conn, ctx.store.keys())
            .await?
            .into_iter()
            .collect();
    let mut jobs = Vec::with_capacity(waiting.len());
    for (id, until) in waiting {
        let note = crate::redis::notes::read(&conn, ctx.store.keys(), &id).await?;
        let zone = note.and_then(|n| n.zone).and_then(|z| z.parse::<Tz>().ok());
        let cancelled = marks.get(&id).copied();
        jobs.push(WaitingJob {
            id,
            until,
            cancelled,
            zone,
        });
    }
    Ok(jobs)
}

/// The zones to count in: `given`, else those of the waiting jobs (each with its
/// jobs), else none.
fn zones_of(given: Option<Tz>, waiting: &[WaitingJob]) -> Vec<(Tz, Vec<String>)> {
    if let Some(tz) = given {
        return vec![(tz, Vec::new())];
    }
    let mut zones: Vec<(Tz, Vec<String>)> = Vec::new();
    for j in waiting {
        let Some(tz) = j.zone else { continue };
        if let Some((_, ids)) = zones.iter_mut().find(|(z, _)| *z == tz) {
            ids.push(j.id.clone());
        } else if zones.len() < ZONES_SHOWN {
            zones.push((tz, vec![j.id.clone()]));
        }
    }
    zones
}

async fn read(
    ctx: &Ctx,
    recipient: &str,
    tenant: Option<&str>,
    given: Option<Tz>,
) -> Result<(Zoned, Vec<WaitingJob>), crate::admin::AdminError> {
    let recipients = Recipients::new(&ctx.store, &ctx.settings);
    let waiting = waiting_of(ctx, recipient, tenant).await?;
    let mut zones = zones_of(given, &waiting);
    let from_jobs = given.is_none() && !zones.is_empty();
    if zones.is_empty() {
        let (tz, _) = recipients.zone(recipient, None).await?;
        zones.push((tz, Vec::new()));
    }
    let mut zoned = Vec::new();
    for (tz, ids) in zones {
        let q = RecipientQuery {
            recipient,
            category: None,
            channel: None,
            tz,
            tenant,
        };
        let mut status = recipients.status(&q).await?;
        status.timezone_from = match (given, from_jobs) {
            (Some(_), _) => Some(ZoneFrom::Option),
            (None, true) => None,
            (None, false) => Some(ZoneFrom::Default),
        };
        zoned.push((ids, status));
    }
    Ok((zoned, waiting))
}

fn search_form(q: &Fields) -> Markup {
    let inputs = [
        Input("recipient", "Recipient", true),
        Input("tenant", "Tenant (optional)", false),
        Input(
            "timezone",
            "Their zone (optional: else each waiting job's own)",
            false,
        ),
    ];
    search("/console/recipient", q, &inputs, "Find")
}

fn summary(v: &Visitor, s: &RecipientStatus) -> Markup {
    section(
        "who",
        "Recipient",
        html! {
            p { "Tag " code { (s.recipient_tag) }
                @if let Some(t) = &s.tenant { " · tenant " (t) }
                " · now " (when(v, s.now)) }
        },
    )
}

/// The recipient's zone `s` counts in (its name; UTC when it is not one).
fn zone_of(s: &RecipientStatus) -> Tz {
    s.timezone.parse().unwrap_or(Tz::UTC)
}

fn next(tz: Tz, n: &Option<NextAllowed>) -> Markup {
    html! {
        @match n {
            None => span.bad { "never" },
            Some(n) if n.now => span.ok { "now" },
            Some(n) => span.next-allowed { strong.local { (in_zone(n.utc, tz)) } br; span.utc { (utc(n.utc)) } },
        }
    }
}

fn rules(rules: &[RuleStatus]) -> Markup {
    html! { @for r in rules { div { (r.count) " / " (r.limit) " per " (r.window)
    @if r.full { " " span.bad { "full" } } } } }
}

fn sends(v: &Visitor, tz: Tz, sends: &[Send]) -> Markup {
    html! { @if sends.is_empty() { span.muted { "none" } } @else { details {
        summary { (sends.iter().filter(|s| s.counting).count()) " counting, " (sends.len()) " remembered" }
        ul { @for s in sends { li { code { (s.member) } " " (when(v, s.at)) " (" (in_zone(s.at, tz)) ") " (s.state)
            @if !s.counting { " " span.muted { "not counting" } } } } }
    } } }
}

/// The layers counted in the zone of `s` (the `i`th zone shown), for the waiting
/// jobs `jobs` decided in it.
fn layers(v: &Visitor, i: usize, jobs: &[String], s: &RecipientStatus) -> Markup {
    let tz = zone_of(s);
    let head = [
        "Layer",
        "Channel",
        "Counted",
        "Sends",
        "Next allowed (this zone, then UTC)",
    ];
    let l = |n: usize| head[n];
    let rows = html! {
        @for p in &s.policies { tr {
            td data-label=(l(0)) { "policy " (p.policy) " (" (p.action) ")"
                @for w in &p.send_windows { br; span.muted { (w) } } }
            td data-label=(l(1)) { (p.channel.clone().unwrap_or_else(|| "all".into())) }
            td data-label=(l(2)) { (rules(&p.rules)) } td data-label=(l(3)) { (sends(v, tz, &p.sends)) }
            td data-label=(l(4)) { (next(tz, &p.next_allowed)) }
        } }
        @for c in &s.caps { tr {
            td data-label=(l(0)) { "cap " (c.cap) " (" (c.mode) ")" }
            td data-label=(l(1)) { (c.channel.clone().unwrap_or_else(|| "all".into())) }
            td data-label=(l(2)) { (rules(&c.rules)) } td data-label=(l(3)) { (sends(v, tz, &c.sends)) }
            td data-label=(l(4)) { (next(tz, &c.next_allowed)) }
        } }
    };
    let title = html! { "What holds them: policies and caps, in " (s.timezone) };
    section(
        &format!("layers-{i}"),
        title,
        html! {
            p.muted { "Counted in " strong.zone { (s.timezone) }
                @if !jobs.is_empty() { ", the zone of waiting job(s) " @for (k, id) in jobs.iter().enumerate() { @if k > 0 { ", " } code { (id) } } }
                @else if matches!(s.timezone_from, Some(ZoneFrom::Option)) { " (the zone asked for)" }
                @else { " (worker.default_timezone: no waiting job's note knows a zone)" }
                ": a day's window begins at its midnight." }
            (stacked(&head, &[], rows))
        },
    )
}

fn waiting_jobs(v: &Visitor, waiting: &[WaitingJob], count: Option<u64>) -> Markup {
    let head = ["Job", "Until", "Until, in its zone", "Cancelled"];
    let rows = html! { @for j in waiting { tr {
        td data-label=(head[0]) { a href={ "/console/job" (query(&[("id", &j.id)])) } { code { (j.id) } } }
        td data-label=(head[1]) { (when(v, j.until)) }
        td data-label=(head[2]) { @match j.zone { Some(tz) => (in_zone(j.until, tz)), None => span.muted { "no zone noted" } } }
        td data-label=(head[3]) { @if let Some(at) = j.cancelled { strong { "cancelled" } " " (when(v, at)) " (ends as a dead letter at its next handling)" } }
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
                    (stacked(&head, &[], rows))
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
    let closes = |t: Option<DateTime<Utc>>| t.map(|t| when(v, t)).unwrap_or_default();
    let rows = html! { @for d in &s.digests { tr {
        td { code { (d.id) } } td { (d.channel) " / " (d.key) } td.n { (d.count) }
        td { (closes(d.closes_at)) } td { (d.state) }
        td { form.inline method="post" action="/console/digest/flush" {
            (csrf(v)) (hidden(recipient, &s.tenant))
            input type="hidden" name="id" value=(d.id);
            button type="submit" aria-label={ "Flush digest " (d.id) } { "Flush" }
        } }
    } } };
    section(
        "digests",
        "Open digests",
        table_or_none(s.digests.is_empty(), &head, rows, &[2]),
    )
}

fn suppressions(v: &Visitor, s: &RecipientStatus, recipient: &str) -> Markup {
    let head = ["Channel", "Event", "Since", "Until", ""];
    let rows = html! { @for x in &s.suppressions { tr {
        td { (x.channel) } td { (x.event) } td { (when(v, x.since)) }
        td { (x.until.map(|t| when(v, t)).unwrap_or_else(|| "removed".into())) }
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
        table_or_none(empty, &head, rows, &[]),
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
