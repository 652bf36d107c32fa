//! Who is held and what waits (`/console/waiting`), without knowing the recipient
//! first: the recipients with waiting jobs (their tag, how many wait, the soonest
//! instant, what holds the soonest) and the waiting jobs, soonest first, each with
//! its policy, tenant, channel, cause and its instant in its own zone; chosen by
//! policy, tenant (any case; from the job's note, which names it) and cause.
//!
//! What a page costs, bounded: the recipients' sets of waiting jobs
//! (`prefix:{tag}/waiting`) are found by `SCAN` of at most [`SCAN_STEPS`] steps on
//! each node (each looks at `COUNT` 1000 keys: 20 000 keys at most); of those found,
//! [`SETS_READ`] are read (a `ZCARD` and the first [`PER_SET`] of each), then the
//! notes of at most [`NOTES_READ`] jobs, soonest first (one `GET` each). A key
//! space larger than the walk is said so. The sets are keyed by a keyed hash of
//! the recipient (and of its tenant): the page names a recipient by its tag, which
//! the recipient page shows beside the recipient.

use axum::http::StatusCode;
use axum::response::Response;
use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use futures_util::stream::{self, StreamExt};
use maud::{html, Markup};

use super::fields::Fields;
use super::layout::{self, choice, in_zone, query, section, stacked, utc, when};
use super::session::{Ctx, Page};
use crate::job::note::{JobNote, JobState};
use crate::redis::scan::{escape_glob, scan_bounded};
use crate::redis::StoreError;

/// `SCAN` steps a page takes on each node at most.
const SCAN_STEPS: usize = 20;
/// Sets of waiting jobs a page reads at most.
const SETS_READ: usize = 200;
/// Jobs read of each set, soonest first.
const PER_SET: isize = 5;
/// Notes of jobs a page reads at most (the soonest).
const NOTES_READ: usize = 100;
/// Rows a table shows at most.
const SHOWN: usize = 50;

/// One recipient's set of waiting jobs.
struct Held {
    tag: String,
    waiting: u64,
    jobs: Vec<(String, DateTime<Utc>)>,
}

/// One waiting job, with its note when there is one.
struct Job {
    id: String,
    tag: String,
    until: DateTime<Utc>,
    note: Option<JobNote>,
}

/// The tag in a waiting set's key (`prefix:{tag}/waiting`).
fn tag_of(key: &str) -> String {
    key.rsplit_once(":{")
        .and_then(|(_, rest)| rest.strip_suffix("}/waiting"))
        .unwrap_or(key)
        .to_string()
}

async fn read_set(ctx: &Ctx, key: String) -> Result<Held, StoreError> {
    let mut conn = ctx.store.connection();
    let waiting: u64 = redis::cmd("ZCARD").arg(&key).query_async(&mut conn).await?;
    let jobs: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg(&key)
        .arg(0)
        .arg(PER_SET - 1)
        .arg("WITHSCORES")
        .query_async(&mut conn)
        .await?;
    let jobs = jobs
        .into_iter()
        .map(|(id, ms)| (id, crate::quota::window::from_millis(ms as i64)))
        .collect();
    Ok(Held {
        tag: tag_of(&key),
        waiting,
        jobs,
    })
}

/// What one bounded walk finds: the sets read, soonest first; whether the walk saw
/// every key; how many keys it found.
struct Found {
    sets: Vec<Held>,
    complete: bool,
    keys_found: usize,
}

/// The sets one bounded walk finds from `cursor` on, read, soonest first; and
/// whether the walk saw every key.
async fn held(ctx: &Ctx) -> Result<Found, StoreError> {
    let pattern = format!("{}:{{*}}/waiting", escape_glob(ctx.store.keys().prefix()));
    let conn = ctx.store.connection();
    let (keys, complete) = scan_bounded(&conn, &pattern, SCAN_STEPS).await?;
    let found = keys.len();
    let read: Vec<Result<Held, StoreError>> = stream::iter(keys.into_iter().take(SETS_READ))
        .map(|key| read_set(ctx, key))
        .buffered(16)
        .collect()
        .await;
    let mut sets: Vec<Held> = read
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .filter(|h| !h.jobs.is_empty())
        .collect();
    sets.sort_by_key(|h| h.jobs.first().map(|j| j.1));
    Ok(Found {
        sets,
        complete,
        keys_found: found,
    })
}

/// The soonest jobs of `sets` with their notes (at most [`NOTES_READ`]).
async fn jobs(ctx: &Ctx, sets: &[Held]) -> Result<Vec<Job>, StoreError> {
    let mut all: Vec<(String, String, DateTime<Utc>)> = sets
        .iter()
        .flat_map(|h| h.jobs.iter().map(|(id, t)| (id.clone(), h.tag.clone(), *t)))
        .collect();
    all.sort_by_key(|j| j.2);
    all.truncate(NOTES_READ);
    let conn = ctx.store.connection();
    let keys = ctx.store.keys();
    let read: Vec<Result<Job, StoreError>> = stream::iter(all)
        .map(|(id, tag, until)| {
            let conn = conn.clone();
            async move {
                let note = crate::redis::notes::read(&conn, keys, &id).await?;
                Ok(Job {
                    id,
                    tag,
                    until,
                    note,
                })
            }
        })
        .buffered(16)
        .collect()
        .await;
    read.into_iter().collect()
}

fn cause(note: &Option<JobNote>) -> (String, String) {
    match note.as_ref().map(|n| &n.step) {
        Some(JobState::Delayed { cause, held_by, .. }) => (cause.clone(), held_by.clone()),
        Some(_) => ("ended".into(), String::new()),
        None => (String::new(), String::new()),
    }
}

/// Whether `job` is chosen by the form's policy, tenant (in any case) and cause.
fn chosen(job: &Job, q: &Fields) -> bool {
    let policy = job.note.as_ref().and_then(|n| n.policy.as_deref());
    let tenant = job.note.as_ref().and_then(|n| n.tenant.as_deref());
    q.get("policy").is_none_or(|p| policy == Some(p))
        && q.get("tenant")
            .is_none_or(|t| tenant.is_some_and(|have| have.to_lowercase() == t.to_lowercase()))
        && q.get("cause").is_none_or(|c| cause(&job.note).0 == c)
}

/// The instant of `job` in its own zone (its note's), else in UTC.
fn its_zone(job: &Job) -> String {
    match job
        .note
        .as_ref()
        .and_then(|n| n.zone.as_deref())
        .and_then(|z| z.parse::<Tz>().ok())
    {
        Some(tz) => in_zone(job.until, tz),
        None => utc(job.until),
    }
}

fn form(ctx: &Ctx, q: &Fields) -> Markup {
    let policies: Vec<String> = ctx.settings.policies.keys().cloned().collect();
    let causes: Vec<String> = [
        "cap",
        "window",
        "schedule",
        "in_flight",
        "dispatch_refused",
        "limit",
    ]
    .map(String::from)
    .to_vec();
    html! {
        form.search method="get" action="/console/waiting" role="search" {
            (choice("policy", "Policy", &policies, q.get("policy")))
            div { label for="tenant" { "Tenant (any case)" }
                input id="tenant" name="tenant" value=(q.get("tenant").unwrap_or("")); }
            (choice("cause", "Held by", &causes, q.get("cause")))
            button type="submit" { "Show" }
        }
    }
}

fn recipients_table(ctx: &Ctx, sets: &[Held]) -> Markup {
    let v = &ctx.visitor;
    let head = ["Recipient tag", "Waiting", "Soonest"];
    let rows = html! { @for h in sets.iter().take(SHOWN) { tr {
        td data-label=(head[0]) { code { (h.tag) } }
        td.n data-label=(head[1]) { (h.waiting) }
        td data-label=(head[2]) { @if let Some((id, t)) = h.jobs.first() {
            (when(v, *t)) " · " a href={ "/console/job" (query(&[("id", id)])) } { code { (id) } } } }
    } } };
    html! {
        @if sets.is_empty() { p.muted { "None found." } }
        @else { (stacked(&head, &[1], rows)) }
    }
}

fn jobs_table(ctx: &Ctx, jobs: &[&Job]) -> Markup {
    let v = &ctx.visitor;
    let head = [
        "Job",
        "Until (UTC)",
        "Until, in its zone",
        "Policy",
        "Tenant",
        "Channel",
        "Held by",
        "Recipient tag",
    ];
    let rows = html! { @for j in jobs.iter().take(SHOWN) { tr {
        td data-label=(head[0]) { a href={ "/console/job" (query(&[("id", &j.id)])) } { code { (j.id) } } }
        td data-label=(head[1]) { (when(v, j.until)) }
        td data-label=(head[2]) { (its_zone(j)) }
        td data-label=(head[3]) { (j.note.as_ref().and_then(|n| n.policy.clone()).unwrap_or_default()) }
        td data-label=(head[4]) { (j.note.as_ref().and_then(|n| n.tenant.clone()).unwrap_or_default()) }
        td data-label=(head[5]) { (j.note.as_ref().map(|n| n.channel.clone()).unwrap_or_default()) }
        td data-label=(head[6]) { @let (c, by) = cause(&j.note); code { (c) } @if !by.is_empty() { " " span.muted { (by) } } }
        td data-label=(head[7]) { code { (j.tag) } }
    } } };
    html! {
        @if jobs.is_empty() { p.muted { "None found." } }
        @else { (stacked(&head, &[], rows)) }
    }
}

/// `GET /console/waiting?policy=P&tenant=T&cause=C`.
pub(super) async fn show(Page(ctx, q): Page) -> Response {
    let found = match held(&ctx).await {
        Ok(found) => found,
        Err(e) => {
            return layout::failed(
                &ctx.visitor,
                StatusCode::INTERNAL_SERVER_ERROR,
                "Waiting",
                e,
            )
        }
    };
    let Found {
        sets,
        complete,
        keys_found,
    } = found;
    let read = match jobs(&ctx, &sets).await {
        Ok(read) => read,
        Err(e) => {
            return layout::failed(
                &ctx.visitor,
                StatusCode::INTERNAL_SERVER_ERROR,
                "Waiting",
                e,
            )
        }
    };
    let picked: Vec<&Job> = read.iter().filter(|j| chosen(j, &q)).collect();
    // with a choice made, the recipients of the jobs chosen only
    let tags: std::collections::HashSet<&str> = picked.iter().map(|j| j.tag.as_str()).collect();
    let any = ["policy", "tenant", "cause"]
        .iter()
        .all(|k| q.get(k).is_none());
    let sets: Vec<Held> = sets
        .into_iter()
        .filter(|h| any || tags.contains(h.tag.as_str()))
        .collect();
    let body = html! {
        (form(&ctx, &q))
        p.muted { "Found by a bounded walk of the key space: " (keys_found) " recipient(s) with waiting jobs"
            @if !complete { " in the first " (SCAN_STEPS * crate::redis::scan::COUNT as usize) " keys of each node (there are more)" }
            @if keys_found > SETS_READ { "; the first " (SETS_READ) " read" }
            ". The jobs below are the soonest " (NOTES_READ) " of those read at most." }
        (section("held", "Recipients with waiting jobs, soonest first", recipients_table(&ctx, &sets)))
        (section("jobs", html! { "Waiting jobs, soonest first (" (picked.len()) ")" }, jobs_table(&ctx, &picked)))
    };
    layout::page(&ctx.visitor, "Waiting", body)
}

#[cfg(test)]
mod tests {
    use super::tag_of;

    #[test]
    fn the_tag_is_read_from_the_waiting_sets_key() {
        assert_eq!(tag_of("qw:{AbC-12_x}/waiting"), "AbC-12_x");
        assert_eq!(tag_of("q:w:{t}/waiting"), "t");
    }
}
