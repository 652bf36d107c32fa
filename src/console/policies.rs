//! The policies page (`/console/policies`): the policies, caps, limits, quotas and
//! channels in force, the tenants' overrides (`[tenants.NAME]`, in TOML, defaults included), the shadow policies' verdicts, the last reload, and a reload button (as
//! `POST /reload` and SIGHUP).

use axum::http::StatusCode;
use axum::response::Response;
use maud::{html, Markup};

use super::layout::{self, csrf, section, stacked, table, table_or_none, when};
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
        (section("caps", "Caps", table_or_none(
            caps.caps_of(None).is_empty(),
            &["Cap", "Mode", "Rules"],
            html! { @for c in caps.caps_of(None) { tr {
                td { (c.name) } td { (c.mode.as_str()) }
                td { @for (i, rule) in c.rules.iter().enumerate() { @if i > 0 { ", " } (rule.limit) " per " (rule.window) } }
            } } },
            &[],
        )))
        (limits(&ctx.settings))
        (quotas(&ctx.settings))
        (tenants(&ctx.settings))
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
            &[2],
        )))
        (section("reload", "Reload", html! {
            @match &r.last_reload {
                Some(l) => p { "Last: " (l.result) " at " (when(&ctx.visitor, l.at)) @for d in &l.detail { br; (d) } },
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

/// A period as the configuration writes it (`1s`, `24h`).
fn period_text(period: Option<crate::config::Dur>) -> String {
    let d = period.map_or(std::time::Duration::from_secs(1), |p| p.0);
    chrono::Duration::from_std(d)
        .map(|d| crate::quota::window::Window::Rolling(d).to_string())
        .unwrap_or_default()
}

/// What a limit or quota matches: its lists, or every job.
fn match_text(m: &crate::config::MatchSettings) -> String {
    let lists = [
        ("channels", &m.channels),
        ("categories", &m.categories),
        ("tenants", &m.tenants),
    ];
    let parts: Vec<String> = lists
        .iter()
        .filter_map(|(what, l)| l.as_ref().map(|l| format!("{what} {}", l.join(", "))))
        .collect();
    if parts.is_empty() {
        return "every job".into();
    }
    parts.join("; ")
}

/// The limits (`[limits.NAME]`): each one's rate, burst, what it matches, who
/// shares a bucket and its warm-up.
fn limits(settings: &crate::config::Settings) -> Markup {
    let head = ["Limit", "Rate", "Burst", "Match", "Per", "Warm-up"];
    let rows = html! { @for (name, l) in &settings.limits { tr {
        td data-label=(head[0]) { code { (name) } }
        td data-label=(head[1]) { (l.rate) " per " (period_text(l.period)) }
        td.n data-label=(head[2]) { (l.burst.unwrap_or(1)) }
        td data-label=(head[3]) { (match_text(&l.matches)) }
        td data-label=(head[4]) { (l.per.as_str()) }
        td data-label=(head[5]) { @match &l.warmup {
            Some(w) => { "from " (w.start) ": " (w.daily.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")) " a day" },
            None => span.muted { "none" },
        } }
    } } };
    section(
        "limits",
        "Limits",
        html! {
            p.muted { "A job goes out only when every limit that matches it admits its cost (units of the rate); " code { "quota-worker admin limits" } " shows their buckets." }
            @if settings.limits.is_empty() { p.muted { "None ([limits.NAME] sections)." } }
            @else { (stacked(&head, &[2], rows)) }
        },
    )
}

/// The quotas (caps with `scope = "tenant"` or `"sender"`): each one's count per
/// calendar day or month, who shares a counter and what it matches.
fn quotas(settings: &crate::config::Settings) -> Markup {
    let head = ["Quota", "Count", "Per", "Match"];
    let quotas: Vec<_> = settings
        .caps
        .iter()
        .filter_map(|(name, c)| Some((name, c, c.scope.quota()?)))
        .collect();
    let rows = html! { @for (name, c, per) in &quotas { tr {
        td data-label=(head[0]) { code { (name) } }
        td data-label=(head[1]) { @for (i, r) in c.rules.iter().enumerate() { @if i > 0 { ", " } (r.limit) " per " (r.window) } }
        td data-label=(head[2]) { (per.as_str()) }
        td data-label=(head[3]) { (match_text(&c.matches)) }
    } } };
    section(
        "quotas",
        "Quotas",
        html! {
            p.muted { "Counted per calendar day or month in the tenant's zone (else " code { "worker.default_timezone" } ", " (settings.worker.default_timezone.name()) ")." }
            @if quotas.is_empty() { p.muted { "None (caps with scope = \"tenant\" or \"sender\")." } }
            @else { (stacked(&head, &[], rows)) }
        },
    )
}

/// One override in TOML under its whole path (`[tenants.T.KIND.NAME]`, its
/// rules as `[[tenants.T.KIND.NAME.rules]]`), every key with its value, defaults
/// included.
fn written<T: serde::Serialize>(tenant: &str, kind: &str, name: &str, value: &T) -> String {
    use std::collections::BTreeMap;
    let nested = BTreeMap::from([(
        "tenants",
        BTreeMap::from([(
            tenant,
            BTreeMap::from([(kind, BTreeMap::from([(name, value)]))]),
        )]),
    )]);
    toml::to_string(&nested).unwrap_or_else(|e| format!("# not shown: {e}\n"))
}

/// The tenants' overrides (`[tenants.NAME]`): per tenant, each policy and cap it
/// replaces for its jobs, as written.
fn tenants(settings: &crate::config::Settings) -> Markup {
    let head = ["Tenant", "Replaces", "In full (defaults included)"];
    let rows = html! { @for (tenant, t) in &settings.tenants {
        @for (name, p) in &t.policies { tr {
            td data-label=(head[0]) { code { (tenant) } } td data-label=(head[1]) { "policy " (name) }
            td data-label=(head[2]) { pre { (written(tenant, "policies", name, p)) } }
        } }
        @for (name, c) in &t.caps { tr {
            td data-label=(head[0]) { code { (tenant) } } td data-label=(head[1]) { "cap " (name) }
            td data-label=(head[2]) { pre { (written(tenant, "caps", name, c)) } }
        } }
        @if t.policies.is_empty() && t.caps.is_empty() { tr {
            td data-label=(head[0]) { code { (tenant) } } td data-label=(head[1]) { span.muted { "nothing: the shared policies and caps" } } td {}
        } }
    } };
    section(
        "tenants",
        "Tenant overrides",
        html! {
            p.muted { "A tenant's job meets the shared policies and caps above, except those its tenant replaces here (a tenant without a section meets the shared ones)." }
            @if settings.tenants.is_empty() { p.muted { "None ([tenants.NAME] sections)." } }
            @else { (stacked(&head, &[], rows)) }
        },
    )
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
