//! The observability files in `deploy/` and the compose `observability` profile:
//! the Prometheus alert rules (`promtool check rules`, and the cases of
//! `deploy/prometheus/alerts_test.yml` under `promtool test rules`), the scrape
//! configuration (`promtool check config`), the Grafana dashboard and its
//! provisioning, the compose services that mount them; and every metric and label
//! they name, checked against the `/metrics` of a live worker.
//!
//! Without `promtool` (Debian's `prometheus` package) the promtool steps say so on
//! stderr and are skipped; everything else runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quota_worker::health::Health;
use quota_worker::quota::policy::Mode;
use quota_worker::status::Status;
use quota_worker::store::QuotaStore;
use quota_worker::worker::Worker;
use serde_json::Value as Json;
use serde_norway::Value as Yaml;
use testkit::*;
use tokio_util::sync::CancellationToken;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const ALERTS: &str = "deploy/prometheus/alerts.yml";
const ALERT_TESTS: &str = "deploy/prometheus/alerts_test.yml";
const PROMETHEUS: &str = "deploy/prometheus/prometheus.yml";
const DASHBOARD: &str = "deploy/grafana/dashboards/quota-worker.json";
const DATASOURCES: &str = "deploy/grafana/provisioning/datasources/prometheus.yml";
const PROVIDERS: &str = "deploy/grafana/provisioning/dashboards/quota-worker.yml";
/// The uid the dashboard's panels name and the provisioned data source has.
const DATASOURCE_UID: &str = "prometheus";

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Yaml {
    serde_norway::from_str(&read(path)).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"))
}

fn dashboard() -> Json {
    serde_json::from_str(&read(DASHBOARD)).unwrap_or_else(|e| panic!("{DASHBOARD}: {e}"))
}

fn text(v: &Yaml) -> String {
    match v {
        Yaml::String(s) => s.clone(),
        Yaml::Number(n) => n.to_string(),
        Yaml::Bool(b) => b.to_string(),
        other => panic!("expected a scalar, got {other:?}"),
    }
}

fn seq(v: Option<&Yaml>) -> Vec<Yaml> {
    v.and_then(Yaml::as_sequence).cloned().unwrap_or_default()
}

// ---------------------------------------------------------------------------
// promtool

/// `promtool`, or `None` (said on stderr) when it is not installed.
fn promtool() -> Option<&'static str> {
    match Command::new("promtool").arg("--version").output() {
        Ok(out) if out.status.success() => Some("promtool"),
        _ => {
            eprintln!(
                "promtool not found: install Debian's prometheus package \
                 (apt-get install prometheus); skipping the promtool checks"
            );
            None
        }
    }
}

/// Run promtool with `args`; panic with what it said unless it succeeds.
fn promtool_ok(promtool: &str, args: &[&str], dir: &Path) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {}:\n{said}", args.join(" "));
    said
}

/// A directory of its own under the system's temp dir, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique(name));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn promtool_accepts_the_rules_and_the_scrape_configuration_and_the_alert_cases_pass() {
    let Some(promtool) = promtool() else {
        return;
    };
    let prometheus_dir = Path::new(ROOT).join("deploy/prometheus");
    let said = promtool_ok(promtool, &["check", "rules", "alerts.yml"], &prometheus_dir);
    assert!(said.contains("SUCCESS"), "{said}");
    // rule_files are relative to the configuration: alerts.yml is checked again,
    // as Prometheus will load it
    let said = promtool_ok(
        promtool,
        &["check", "config", "prometheus.yml"],
        &prometheus_dir,
    );
    assert!(said.contains("1 rule files found"), "{said}");

    // promtool test rules compares annotations too: run the cases against a copy of
    // the rules without them (labels, expressions and `for` as written)
    let mut rules = yaml(ALERTS);
    for group in rules["groups"].as_sequence_mut().unwrap() {
        for rule in group["rules"].as_sequence_mut().unwrap() {
            rule.as_mapping_mut().unwrap().remove("annotations");
        }
    }
    let dir = TempDir::new("obs-rules");
    std::fs::write(
        dir.0.join("alerts.yml"),
        serde_norway::to_string(&rules).unwrap(),
    )
    .unwrap();
    std::fs::write(dir.0.join("alerts_test.yml"), read(ALERT_TESTS)).unwrap();
    let said = promtool_ok(promtool, &["test", "rules", "alerts_test.yml"], &dir.0);
    assert!(said.contains("SUCCESS"), "{said}");

    // every alert has at least one case that expects it to fire
    let cases = yaml(ALERT_TESTS);
    let fired: BTreeSet<String> = seq(cases.get("tests"))
        .iter()
        .flat_map(|t| seq(t.get("alert_rule_test")))
        .filter(|c| !seq(c.get("exp_alerts")).is_empty())
        .map(|c| text(&c["alertname"]))
        .collect();
    let untested: Vec<String> = alerts()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !fired.contains(name))
        .collect();
    assert!(
        untested.is_empty(),
        "no case in {ALERT_TESTS} fires {untested:?}"
    );
}

#[test]
fn the_dashboard_queries_are_promql() {
    // promtool parses every dashboard query as a recording rule's expression (Grafana's
    // variables replaced by what they stand for)
    let Some(promtool) = promtool() else {
        return;
    };
    // (a variable's label_values(...) is Grafana's, not PromQL)
    let queries: Vec<(String, String)> = dashboard_exprs()
        .into_iter()
        .filter(|(at, _)| at.starts_with("dashboard panel"))
        .collect();
    let rules: Vec<Json> = queries
        .iter()
        .enumerate()
        .map(|(i, (_, expr))| {
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$instance", ".*");
            serde_json::json!({ "record": format!("dashboard_query_{i}"), "expr": expr })
        })
        .collect();
    let file = serde_json::json!({ "groups": [{ "name": "dashboard", "rules": rules }] });
    let dir = TempDir::new("obs-dash");
    std::fs::write(dir.0.join("dashboard-rules.yml"), file.to_string()).unwrap();
    let out = Command::new(promtool)
        .args(["check", "rules", "dashboard-rules.yml"])
        .current_dir(&dir.0)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let queries: Vec<String> = queries
        .iter()
        .enumerate()
        .map(|(i, (at, expr))| format!("dashboard_query_{i}: {at}: {expr}"))
        .collect();
    assert!(
        out.status.success(),
        "{said}\nthe queries:\n{}",
        queries.join("\n")
    );
}

// ---------------------------------------------------------------------------
// the rules and the dashboard as data

/// `(alert name, rule)` of every alert in the `quota-worker` group.
fn alerts() -> Vec<(String, Yaml)> {
    let rules = yaml(ALERTS);
    let groups = seq(rules.get("groups"));
    let group = groups
        .iter()
        .find(|g| g.get("name").map(text).as_deref() == Some("quota-worker"))
        .expect("a rule group named quota-worker");
    seq(group.get("rules"))
        .into_iter()
        .map(|r| (text(&r["alert"]), r))
        .collect()
}

#[test]
fn every_alert_waits_has_a_severity_and_says_what_to_do() {
    let alerts = alerts();
    assert!(alerts.len() >= 8, "{} alerts", alerts.len());
    let documented = read("deploy/README.md");
    let mut problems = Vec::new();
    for (name, rule) in &alerts {
        if !name.starts_with("QuotaWorker") {
            problems.push(format!("{name}: alert names start with QuotaWorker"));
        }
        if rule.get("for").is_none() {
            problems.push(format!("{name}: no `for`"));
        }
        let severity = rule.get("labels").and_then(|l| l.get("severity")).map(text);
        if !matches!(severity.as_deref(), Some("critical" | "warning")) {
            problems.push(format!("{name}: severity {severity:?}"));
        }
        for annotation in ["summary", "description"] {
            let said = rule
                .get("annotations")
                .and_then(|a| a.get(annotation))
                .map(text)
                .unwrap_or_default();
            if said.trim().len() < 20 {
                problems.push(format!("{name}: annotation {annotation} is {said:?}"));
            }
        }
        if !documented.contains(name.as_str()) {
            problems.push(format!("{name}: not in deploy/README.md"));
        }
    }
    let names: BTreeSet<&String> = alerts.iter().map(|(n, _)| n).collect();
    if names.len() != alerts.len() {
        problems.push("two alerts share a name".into());
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Every panel, those inside rows included.
fn panels(dashboard: &Json) -> Vec<Json> {
    fn walk(panels: &Json, out: &mut Vec<Json>) {
        for p in panels.as_array().into_iter().flatten() {
            out.push(p.clone());
            if let Some(inner) = p.get("panels") {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// `(where, query)` of every query of the dashboard: its panels' targets and its
/// query variables.
fn dashboard_exprs() -> Vec<(String, String)> {
    let d = dashboard();
    let mut out = Vec::new();
    for p in panels(&d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = t["expr"].as_str() {
                out.push((
                    format!(
                        "dashboard panel {:?} ({})",
                        p["title"].as_str().unwrap_or(""),
                        t["refId"].as_str().unwrap_or("?")
                    ),
                    expr.to_string(),
                ));
            }
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        let query = match &v["query"] {
            Json::String(q) => Some(q.clone()),
            Json::Object(o) => o.get("query").and_then(Json::as_str).map(String::from),
            _ => None,
        };
        if let Some(q) = query {
            out.push((
                format!("dashboard variable ${}", v["name"].as_str().unwrap_or("?")),
                q,
            ));
        }
    }
    out
}

fn is_datasource(v: &Json) -> bool {
    v["uid"].as_str() == Some(DATASOURCE_UID)
}

#[test]
fn the_dashboard_is_json_and_every_panel_queries_the_provisioned_prometheus() {
    let d = dashboard();
    assert_eq!(d["uid"], "quota-worker");
    assert!(
        d["id"].is_null(),
        "a provisioned dashboard carries no database id"
    );
    let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");

    let mut problems = Vec::new();
    let mut ids = BTreeSet::new();
    let all = panels(&d);
    for p in &all {
        let title = p["title"].as_str().unwrap_or("").to_string();
        if !ids.insert(p["id"].as_u64()) || p["id"].is_null() {
            problems.push(format!("panel {title:?}: missing or repeated id"));
        }
        let pos = &p["gridPos"];
        let (x, w) = (pos["x"].as_u64(), pos["w"].as_u64());
        match (x, w, pos["y"].as_u64(), pos["h"].as_u64()) {
            (Some(x), Some(w), Some(_), Some(h)) if x + w <= 24 && w > 0 && h > 0 => {}
            _ => problems.push(format!("panel {title:?}: gridPos {pos}")),
        }
        if p["type"] == "row" {
            continue;
        }
        if title.is_empty() {
            problems.push(format!("panel {}: no title", p["id"]));
        }
        if !is_datasource(&p["datasource"]) {
            problems.push(format!(
                "panel {title:?}: datasource {} is not uid {DATASOURCE_UID}",
                p["datasource"]
            ));
        }
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        if !targets
            .iter()
            .any(|t| t["expr"].as_str().is_some_and(|e| !e.trim().is_empty()))
        {
            problems.push(format!("panel {title:?}: no target with an expr"));
        }
        for t in &targets {
            if !t["datasource"].is_null() && !is_datasource(&t["datasource"]) {
                problems.push(format!(
                    "panel {title:?} target {}: datasource {}",
                    t["refId"], t["datasource"]
                ));
            }
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"] == "query" && !is_datasource(&v["datasource"]) {
            problems.push(format!(
                "variable {}: datasource {}",
                v["name"], v["datasource"]
            ));
        }
    }
    assert!(all.len() > 20, "{} panels", all.len());
    // what the dashboard is for: each of these answered by some panel
    let exprs: Vec<String> = dashboard_exprs().into_iter().map(|(_, e)| e).collect();
    for wanted in [
        "sum by (outcome) (rate(quota_worker_jobs_total",
        "sum by (channel)",
        "sum by (policy, outcome)",
        "histogram_quantile(0.5, sum by (le) (rate(quota_worker_admission_seconds_bucket",
        "histogram_quantile(0.99, sum by (le) (rate(quota_worker_admission_seconds_bucket",
        "sum by (cause) (rate(quota_worker_delays_total",
        "quota_worker_delay_seconds_bucket",
        "sum by (role) (max by (role, queue) (quota_worker_queue_messages",
        "sum by (reason) (rate(quota_worker_jobs_total{outcome=\"dead\"",
        "quota_worker_redis_errors_total",
        "quota_worker_broker_errors_total",
        "quota_worker_reconnects_total",
        "quota_worker_ready",
        "min by (dependency) (quota_worker_up",
        "quota_worker_shadow_total",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "sum by (policy) (rate(quota_worker_digest_items_total",
        "sum by (policy, result) (rate(quota_worker_digests_total",
        "histogram_quantile(0.99, sum by (le, policy) (rate(quota_worker_digest_items_bucket",
    ] {
        if !exprs.iter().any(|e| e.contains(wanted)) {
            problems.push(format!("no panel queries `{wanted}`"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------
// compose, provisioning and scrape configuration agree

/// `(host path, container path, read-only)` of a service's bind mounts.
fn mounts(service: &Yaml) -> Vec<(String, String, bool)> {
    seq(service.get("volumes"))
        .iter()
        .map(|v| {
            let v = text(v);
            let parts: Vec<&str> = v.split(':').collect();
            match parts.as_slice() {
                [host, container] => (host.to_string(), container.to_string(), false),
                [host, container, mode] => (
                    host.to_string(),
                    container.to_string(),
                    mode.split(',').any(|m| m == "ro"),
                ),
                _ => panic!("volume `{v}`"),
            }
        })
        .collect()
}

/// Where `container_path` comes from in the repository, through `mounts` (a file
/// mounted itself, or one inside a mounted directory).
fn source_of(mounts: &[(String, String, bool)], container_path: &str) -> Option<PathBuf> {
    mounts.iter().find_map(|(host, container, _)| {
        let rest = container_path.strip_prefix(container.as_str())?;
        if !(rest.is_empty() || rest.starts_with('/')) {
            return None;
        }
        Some(
            Path::new(ROOT)
                .join(host)
                .join(rest.trim_start_matches('/')),
        )
    })
}

#[test]
fn the_observability_services_mount_the_repository_files_and_agree_on_addresses() {
    let compose: Yaml = yaml("docker-compose.yml");
    let services = &compose["services"];
    let mut problems = Vec::new();
    // plain `docker compose up` still starts the worker and its dependencies
    for name in ["rabbitmq", "redis", "worker"] {
        if services[name].get("profiles").is_some() {
            problems.push(format!("{name} is in a profile"));
        }
    }
    for name in ["prometheus", "grafana"] {
        let s = &services[name];
        assert!(s.is_mapping(), "no service `{name}`");
        let profiles: Vec<String> = seq(s.get("profiles")).iter().map(text).collect();
        if profiles != ["observability"] {
            problems.push(format!("{name}: profiles {profiles:?}"));
        }
        let image = s.get("image").map(text).unwrap_or_default();
        let tag = image.rsplit_once(':').map(|(_, t)| t).unwrap_or("");
        if tag.is_empty() || tag == "latest" || !tag.chars().any(|c| c == '.') {
            problems.push(format!(
                "{name}: image `{image}` is not pinned to a release"
            ));
        }
        let m = mounts(s);
        if m.is_empty() {
            problems.push(format!("{name}: mounts nothing"));
        }
        for (host, container, ro) in &m {
            if !host.starts_with("./") {
                problems.push(format!("{name}: `{host}` is not a repository path"));
            }
            if !Path::new(ROOT).join(host).exists() {
                problems.push(format!("{name}: mounts {host}, which does not exist"));
            }
            if !ro {
                problems.push(format!("{name}: {host}:{container} is not read-only"));
            }
        }
    }
    // the trace backend: Jaeger, pinned, in the profile, taking OTLP/HTTP on 4318,
    // where the worker's endpoint points when QW_OTLP_ENDPOINT says so
    let jaeger = &services["jaeger"];
    let image = jaeger.get("image").map(text).unwrap_or_default();
    if !image.starts_with("jaegertracing/all-in-one:1.") {
        problems.push(format!("jaeger: image `{image}`"));
    }
    if seq(jaeger.get("profiles"))
        .iter()
        .map(text)
        .collect::<Vec<_>>()
        != ["observability"]
    {
        problems.push("jaeger is not in the observability profile".into());
    }
    if !seq(jaeger.get("ports"))
        .iter()
        .map(text)
        .any(|p| p == "4318:4318")
    {
        problems.push("jaeger does not publish OTLP/HTTP (4318)".into());
    }
    let worker_env = text(&services["worker"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]);
    if worker_env != "${QW_OTLP_ENDPOINT:-}" {
        problems.push(format!("the worker's OTLP endpoint: `{worker_env}`"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // Prometheus reads the configuration the command names, and its rule files
    // beside it
    let prom = &services["prometheus"];
    let prom_mounts = mounts(prom);
    let command: Vec<String> = seq(prom.get("command")).iter().map(text).collect();
    let config_path = command
        .iter()
        .find_map(|c| c.strip_prefix("--config.file="))
        .expect("prometheus command names --config.file");
    let config_file = source_of(&prom_mounts, config_path)
        .unwrap_or_else(|| panic!("{config_path} is not mounted"));
    assert_eq!(config_file, Path::new(ROOT).join(PROMETHEUS));
    let config = yaml(PROMETHEUS);
    let config_dir = Path::new(config_path).parent().unwrap();
    let rule_files: Vec<String> = seq(config.get("rule_files")).iter().map(text).collect();
    assert!(!rule_files.is_empty(), "prometheus.yml loads no rules");
    for rules in &rule_files {
        let in_container = config_dir.join(rules);
        let source = source_of(&prom_mounts, in_container.to_str().unwrap())
            .unwrap_or_else(|| panic!("rule file {} is not mounted", in_container.display()));
        assert_eq!(source, Path::new(ROOT).join(ALERTS), "{rules}");
    }
    // ... and scrapes the worker service on the port it listens on
    let jobs = seq(config.get("scrape_configs"));
    let job = jobs
        .iter()
        .find(|j| j.get("job_name").map(text).as_deref() == Some("quota-worker"))
        .expect("scrape job quota-worker");
    assert_eq!(
        job.get("scrape_interval")
            .or(config["global"].get("scrape_interval"))
            .map(text)
            .as_deref(),
        Some("15s")
    );
    let targets: Vec<String> = seq(job.get("static_configs"))
        .iter()
        .flat_map(|c| seq(c.get("targets")))
        .map(|t| text(&t))
        .collect();
    let worker = &services["worker"];
    let listen = worker["environment"]["QUOTA_WORKER__HTTP__LISTEN"]
        .as_str()
        .expect("the worker's http.listen");
    let port = listen.rsplit_once(':').unwrap().1;
    assert_eq!(targets, [format!("worker:{port}")]);
    // the alerts select that job
    for (name, rule) in alerts() {
        let expr = text(&rule["expr"]);
        if expr.contains("job=") {
            assert!(expr.contains("job=\"quota-worker\""), "{name}: {expr}");
        }
    }

    // Grafana: the provisioned data source is that Prometheus, under the dashboard's
    // uid; the dashboard provider reads the mounted dashboards
    let grafana = &services["grafana"];
    let graf_mounts = mounts(grafana);
    let provisioning = "/etc/grafana/provisioning";
    assert_eq!(
        source_of(
            &graf_mounts,
            &format!("{provisioning}/datasources/prometheus.yml")
        ),
        Some(Path::new(ROOT).join(DATASOURCES))
    );
    assert_eq!(
        source_of(
            &graf_mounts,
            &format!("{provisioning}/dashboards/quota-worker.yml")
        ),
        Some(Path::new(ROOT).join(PROVIDERS))
    );
    let datasources = seq(yaml(DATASOURCES).get("datasources"));
    assert_eq!(datasources.len(), 1);
    let ds = &datasources[0];
    assert_eq!(text(&ds["uid"]), DATASOURCE_UID);
    assert_eq!(text(&ds["type"]), "prometheus");
    let prom_port = seq(prom.get("ports"))
        .iter()
        .map(text)
        .find_map(|p| p.rsplit_once(':').map(|(_, c)| c.to_string()))
        .expect("prometheus publishes its port");
    assert_eq!(text(&ds["url"]), format!("http://prometheus:{prom_port}"));
    let providers = seq(yaml(PROVIDERS).get("providers"));
    assert_eq!(providers.len(), 1);
    assert_eq!(text(&providers[0]["type"]), "file");
    let path = text(&providers[0]["options"]["path"]);
    let dashboards = source_of(&graf_mounts, &path)
        .unwrap_or_else(|| panic!("the provider's path {path} is not mounted"));
    assert_eq!(
        dashboards,
        Path::new(ROOT).join("deploy/grafana/dashboards")
    );
    // the home dashboard, when one is set, is that file
    if let Some(home) = grafana
        .get("environment")
        .and_then(|e| e.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"))
    {
        assert_eq!(
            source_of(&graf_mounts, &text(home)),
            Some(Path::new(ROOT).join(DASHBOARD))
        );
    }
    // Grafana starts once Prometheus is healthy
    assert_eq!(
        grafana["depends_on"]["prometheus"]["condition"].as_str(),
        Some("service_healthy")
    );
    // the header says how to start the profile
    assert!(
        read("docker-compose.yml").contains("docker compose --profile observability up --build")
    );
}

// ---------------------------------------------------------------------------
// every metric and label the files use, against a live worker

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Op(String),
    Punct(char),
}

/// PromQL's tokens, as far as finding selectors and groupings needs: identifiers,
/// strings, the matcher and comparison operators, and single characters.
fn lex(expr: &str) -> Vec<Tok> {
    let chars: Vec<char> = expr.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
            {
                i += 1;
            }
            out.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() || c == '.' {
            // numbers and durations (5m, 0.99, 1e3), of no interest here
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
        } else if c == '"' || c == '\'' || c == '`' {
            let mut s = String::new();
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' && i + 1 < chars.len() {
                    i += 1;
                }
                s.push(chars[i]);
                i += 1;
            }
            i += 1;
            out.push(Tok::Str(s));
        } else {
            let two: String = chars[i..(i + 2).min(chars.len())].iter().collect();
            if ["=~", "!~", "!=", "==", ">=", "<="].contains(&two.as_str()) {
                out.push(Tok::Op(two));
                i += 2;
            } else if c == '=' {
                out.push(Tok::Op("=".into()));
                i += 1;
            } else {
                out.push(Tok::Punct(c));
                i += 1;
            }
        }
    }
    out
}

/// A metric selector: the name and its `(label, op, value)` matchers.
#[derive(Debug)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

/// The worker's metric names, as the brief for these files has it.
fn is_ours(name: &str) -> bool {
    name.starts_with("quota_worker_") || name.starts_with("process_")
}

/// The selectors of our metrics in `expr`, and the labels it groups or matches on
/// (`by`, `without`, `on`, `ignoring`).
fn parse(expr: &str) -> (Vec<Selector>, Vec<String>) {
    let toks = lex(expr);
    let mut selectors = Vec::new();
    let mut grouping = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Ident(word)
                if ["by", "without", "on", "ignoring"].contains(&word.as_str())
                    && toks.get(i + 1) == Some(&Tok::Punct('(')) =>
            {
                i += 2;
                while i < toks.len() && toks[i] != Tok::Punct(')') {
                    if let Tok::Ident(label) = &toks[i] {
                        grouping.push(label.clone());
                    }
                    i += 1;
                }
            }
            Tok::Ident(name) if is_ours(name) => {
                let mut matchers = Vec::new();
                if toks.get(i + 1) == Some(&Tok::Punct('{')) {
                    i += 2;
                    while i < toks.len() && toks[i] != Tok::Punct('}') {
                        if let (Some(Tok::Ident(l)), Some(Tok::Op(op)), Some(Tok::Str(v))) =
                            (toks.get(i), toks.get(i + 1), toks.get(i + 2))
                        {
                            matchers.push((l.clone(), op.clone(), v.clone()));
                            i += 3;
                        } else {
                            i += 1;
                        }
                    }
                }
                selectors.push(Selector {
                    name: name.clone(),
                    matchers,
                });
            }
            _ => {}
        }
        i += 1;
    }
    (selectors, grouping)
}

/// Our metric names anywhere in a text (an annotation naming a metric, or a
/// template's query): prose, so no strings are lexed.
fn names_in(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| is_ours(w))
        .map(String::from)
        .collect()
}

#[test]
fn the_expression_scanner_finds_selectors_and_groupings() {
    let (s, g) = parse(
        r#"sum by (role) (max by (role, queue) (quota_worker_queue_messages{role="dead", instance=~"$instance"}))
           / on () group_left process_open_fds{job="quota-worker"} > 0.8 unless up == 0"#,
    );
    assert_eq!(g, ["role", "role", "queue"]);
    assert_eq!(s.len(), 2);
    assert_eq!(s[0].name, "quota_worker_queue_messages");
    assert_eq!(
        s[0].matchers,
        [
            ("role".into(), "=".into(), "dead".into()),
            ("instance".into(), "=~".into(), "$instance".into())
        ]
    );
    assert_eq!(s[1].name, "process_open_fds");
    let (s, _) = parse("rate(quota_worker_delay_seconds_bucket[$__rate_interval])");
    assert_eq!(s[0].name, "quota_worker_delay_seconds_bucket");
    assert!(s[0].matchers.is_empty());
    assert_eq!(
        names_in("see quota_worker_jobs_total{outcome=\"dead\"} and `admin dead`"),
        ["quota_worker_jobs_total"]
    );
}

/// `/metrics` as families: each `# TYPE`'s kind, and every sample with its labels.
#[derive(Debug, Default)]
struct Exposition {
    kinds: BTreeMap<String, String>,
    samples: Vec<(String, BTreeMap<String, String>, f64)>,
}

impl Exposition {
    fn parse(body: &str) -> Exposition {
        let mut e = Exposition::default();
        for line in body.lines() {
            if let Some(t) = line.strip_prefix("# TYPE ") {
                let (name, kind) = t.split_once(' ').unwrap();
                e.kinds.insert(name.to_string(), kind.to_string());
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            let mut set = BTreeMap::new();
            for w in lex(labels).windows(3) {
                if let [Tok::Ident(l), Tok::Op(op), Tok::Str(v)] = w {
                    if op == "=" {
                        set.insert(l.clone(), v.clone());
                    }
                }
            }
            let value = match value {
                "+Inf" => f64::INFINITY,
                "-Inf" => f64::NEG_INFINITY,
                v => v.parse().unwrap_or(f64::NAN),
            };
            e.samples.push((name.to_string(), set, value));
        }
        e
    }

    /// The family a series name belongs to (`x_bucket` of histogram `x`).
    fn family<'a>(&self, name: &'a str) -> Option<&'a str> {
        if self.kinds.contains_key(name) {
            return Some(name);
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = name.strip_suffix(suffix)?;
            (self.kinds.get(base).map(String::as_str) == Some("histogram")).then_some(base)
        })
    }

    /// The sum of the samples named `name` whose labels include `labels` (None:
    /// there is none). Every series the worker registers is served from the
    /// start, at 0, in no set order: the first of them that matches may be one of
    /// those zeros.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples
            .iter()
            .filter(|(n, set, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| set.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
            .reduce(|a, b| a + b)
    }

    /// The label sets of a family's samples.
    fn series_of<'a>(
        &'a self,
        family: &'a str,
    ) -> impl Iterator<Item = &'a BTreeMap<String, String>> + 'a {
        self.samples
            .iter()
            .filter(move |(n, _, _)| self.family(n) == Some(family))
            .map(|(_, set, _)| set)
    }

    fn labels_of<'a>(&'a self, family: &'a str) -> BTreeSet<&'a str> {
        self.series_of(family)
            .flat_map(|s| s.keys().map(String::as_str))
            .collect()
    }

    fn has_value(&self, family: &str, label: &str, value: &str) -> bool {
        self.series_of(family)
            .any(|s| s.get(label).map(String::as_str) == Some(value))
    }
}

/// Labels Prometheus adds when it scrapes (never in `/metrics`).
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

/// What in `expr` (used at `at`) the exposition does not have: unknown metric
/// names, a histogram used without its `_bucket`/`_sum`/`_count`, labels no series of
/// the metric has, matched values none has, groupings on labels none of the
/// expression's metrics has.
fn problems_in(at: &str, expr: &str, e: &Exposition) -> Vec<String> {
    let mut out = Vec::new();
    let (selectors, grouping) = parse(expr);
    let mut known_labels: BTreeSet<&str> = TARGET_LABELS.into_iter().collect();
    for s in &selectors {
        let Some(family) = e.family(&s.name) else {
            out.push(format!("{}: no such metric (used in {at})", s.name));
            continue;
        };
        if family == s.name && e.kinds[family] == "histogram" {
            out.push(format!(
                "{}: a histogram, used without _bucket, _sum or _count (in {at})",
                s.name
            ));
        }
        let mut labels = e.labels_of(family);
        if s.name.ends_with("_bucket") {
            labels.insert("le");
        } else {
            labels.remove("le");
        }
        known_labels.extend(labels.iter().copied());
        for (label, op, value) in &s.matchers {
            if TARGET_LABELS.contains(&label.as_str()) {
                continue;
            }
            if !labels.contains(label.as_str()) {
                out.push(format!(
                    "{}: no label `{label}` (it has {labels:?}; used in {at})",
                    s.name
                ));
                continue;
            }
            // equality, or a regex that is a list of literal alternatives
            let literal = |v: &str| v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            let wanted: Vec<&str> = match op.as_str() {
                "=" if !value.contains('$') => vec![value.as_str()],
                "=~" if value.split('|').all(literal) => value.split('|').collect(),
                _ => vec![],
            };
            for v in wanted {
                if !e.has_value(family, label, v) {
                    out.push(format!(
                        "{}: no series with {label}=\"{v}\" (used in {at})",
                        s.name
                    ));
                }
            }
        }
    }
    // (an unknown metric's labels are unknown: its grouping is not judged)
    let all_known = selectors.iter().all(|s| e.family(&s.name).is_some());
    for label in grouping {
        if all_known && label != "le" && !known_labels.contains(label.as_str()) {
            out.push(format!(
                "grouping on `{label}`, a label none of its metrics has (in {at})"
            ));
        }
    }
    out
}

fn job(id: &str, recipient: &str, category: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"{recipient}","channel":"sms","category":"{category}"}}"#)
        .into_bytes()
}

/// A sample the test waits for: name, some of its labels, value.
type Expected<'a> = (&'a str, Vec<(&'a str, &'a str)>, f64);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_and_label_the_dashboard_and_the_alerts_use_is_served() {
    // it installs the process-wide recorder, which would count other tests' jobs too
    if crate::in_own_process(
        "observability::every_metric_and_label_the_dashboard_and_the_alerts_use_is_served",
    ) {
        return;
    }
    let ns = unique("obs");
    let mut s = settings(&ns);
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", testkit::free_port(None));
    // a shadow policy, so that its verdicts are counted
    let mut promo = s.policies["default"].clone();
    promo.mode = Mode::Shadow;
    s.policies.insert("promo".into(), promo);
    // a policy with a digest (a window of a second), so that folds, digests sent
    // and items per digest are counted
    let social = quota_worker::config::PolicySettings {
        digest: Some(quota_worker::config::DigestSettings {
            mode: quota_worker::quota::digest::DigestMode::Window,
            window: Some(quota_worker::config::Dur(Duration::from_secs(1))),
            max_window: None,
            max_items: 100,
            keep: 10,
            keep_from: Default::default(),
        }),
        ..Default::default()
    };
    s.policies.insert("social".into(), social);
    // a cap of email alone, so that a job with a route moves on from it
    let mut email_daily = quota_worker::config::CapSettings {
        rules: vec![quota_worker::config::RuleSettings {
            limit: 1,
            window: "1d".parse().unwrap(),
        }],
        ..Default::default()
    };
    email_daily.matches.channels = Some(vec!["email".into()]);
    s.caps.insert("email_daily".into(), email_daily);
    s.policies.insert("routed".into(), Default::default());
    // a paced channel, so that a job waits in its lane
    let push = s.channels.get_mut("push").unwrap();
    push.rate = Some(1);
    // a paced channel, so that its rate in force is shown
    s.channels.get_mut("sms").unwrap().rate = Some(1000);
    s.channels.get_mut("sms").unwrap().burst = Some(100);
    let _c = Cleanup::new(&s);

    // as `quota-worker run` starts (main.rs): HTTP and the process-wide recorder
    // first, then the engine and the worker reporting into the served health and
    // status (`rig` would build the worker before the recorder exists)
    let health = Arc::new(Health::default());
    let status = Arc::new(Status::default());
    let stop_http = CancellationToken::new();
    let http = quota_worker::http::start(&s, health.clone(), status.clone(), stop_http.clone())
        .await
        .unwrap()
        .expect("HTTP is on");
    let engine = Arc::new(QuotaStore::connect(&s).await.expect("redis"));
    // as main.rs does: the reloader (and its store) for `POST /reload` and the
    // preferences API
    status.attach(Arc::new(quota_worker::reload::Reloader::new(
        None,
        s.clone(),
        engine.clone(),
    )));
    let worker = Arc::new(
        Worker::new(s.clone(), engine)
            .sharing_health(health)
            .sharing_status(status),
    );
    let (stop_worker, running) = spawn_worker(worker).await;
    let addr = s.http.listen.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(&addr, "/readyz").await, Some((200, _))) {
        assert!(Instant::now() < deadline, "the worker never got ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // one dispatched, one delayed by the default policy's cap, three dead letters
    // (malformed, and opted_out and an expired digest below), two of the shadow policy (one allowed, one it would have held)
    let conn = amqp().await;
    publish(&conn, &s, &job("obs-1", "r1", "default")).await;
    publish(&conn, &s, &job("obs-2", "r1", "default")).await;
    publish(&conn, &s, b"not json").await;
    publish(&conn, &s, &job("obs-3", "r2", "promo")).await;
    publish(&conn, &s, &job("obs-4", "r2", "promo")).await;
    // two urgent jobs on `push` at 1/s: the second waits in the urgent lane
    for (id, who) in [("obs-5", "r5"), ("obs-6", "r6")] {
        let body = format!(
            r#"{{"id":"{id}","recipient":"{who}","channel":"push","category":"transactional"}}"#
        );
        publish(&conn, &s, body.as_bytes()).await;
    }
    // once the second is parked (after asking: its wait was past lanes.park_after),
    // and while it waits in its lane for its slot, a third is parked behind it
    // without asking
    let parked = [("channel", "push"), ("lane", "urgent"), ("step", "parked")];
    wait_for("obs-6 parked", Duration::from_secs(10), || async {
        let body = http_get(&addr, "/metrics").await.expect("/metrics").1;
        Exposition::parse(&body).value("quota_worker_lane_jobs_total", &parked) == Some(1.0)
    })
    .await;
    let behind = r#"{"id":"obs-12","recipient":"r12","channel":"push","category":"transactional"}"#;
    publish(&conn, &s, behind.as_bytes()).await;
    // and a feedback that suppresses another recipient
    let bounce = quota_worker_producer::Feedback::new(
        "obs-0",
        quota_worker_producer::Event::Bounced,
        "r9",
        "sms",
    );
    crate::feedback::send(&conn, &s, &bounce).await;
    // a recipient's own preferences (the API on the worker's listener): one job
    // opted out, one held by quiet hours (now, in UTC, until two hours later)
    let hour = chrono::Timelike::hour(&chrono::Utc::now());
    let set = serde_json::json!({"categories": {"promo": false},
        "quiet_hours": {"timezone": "UTC", "windows": [{"days": "daily",
            "from": format!("{hour:02}:00"), "to": format!("{:02}:00", (hour + 2) % 24)}]}});
    let client =
        quota_worker_producer::preferences::PreferencesClient::new(&format!("http://{addr}"), None)
            .unwrap();
    client
        .put("r7", None, &set)
        .await
        .expect("the API stores the set");
    publish(&conn, &s, &job("obs-7", "r7", "promo")).await;
    // two jobs folded into one digest, sent when its window ends
    publish(&conn, &s, &job("obs-9", "r8", "social")).await;
    publish(&conn, &s, &job("obs-10", "r8", "social")).await;
    // and a digest's job (its header) past its expires_at: dead-lettered, a dead digest
    let mut headers = lapin::types::FieldTable::default();
    headers.insert(
        quota_worker::digest::DIGEST_HEADER.into(),
        lapin::types::AMQPValue::LongLongInt(1),
    );
    let expired = br#"{"id":"dg-obs-11","recipient":"r8","channel":"sms","category":"social","expires_at":"2020-01-01T00:00:00Z"}"#;
    let props = lapin::BasicProperties::default().with_headers(headers);
    publish_with(&conn, &s, expired, props).await;
    let quiet = br#"{"id":"obs-8","recipient":"r7","channel":"email"}"#;
    publish(&conn, &s, quiet).await;
    // email's own cap full for r20, then a job with a route: it moves on to sms
    let first = br#"{"id":"obs-20","recipient":"r20","channel":"email","category":"routed"}"#;
    publish(&conn, &s, first).await;
    let email = topology(&s).dispatch_queue("email");
    wait_for("obs-20 dispatched", Duration::from_secs(10), || {
        let (conn, email) = (&conn, &email);
        async move { depth(conn, email).await >= 1 }
    })
    .await;
    let routed = br#"{"id":"obs-21","recipient":"r20","channel":"email","category":"routed","fallback":["sms"]}"#;
    publish(&conn, &s, routed).await;

    // settled, and the queues read since (every 5 s)
    let jobs_queue = s.amqp.jobs_queue.clone();
    let dead_queue = s.amqp.dead_queue.clone();
    let expected: Vec<Expected> = vec![
        (
            "quota_worker_feedback_total",
            vec![("event", "bounced")],
            1.0,
        ),
        (
            "quota_worker_jobs_total",
            vec![
                ("outcome", "dispatched"),
                ("policy", "default"),
                ("channel", "sms"),
            ],
            1.0,
        ),
        (
            "quota_worker_jobs_total",
            vec![
                ("outcome", "dispatched"),
                ("policy", "promo"),
                ("channel", "sms"),
            ],
            2.0,
        ),
        (
            "quota_worker_jobs_total",
            vec![
                ("outcome", "delayed"),
                ("policy", "default"),
                ("channel", "sms"),
            ],
            1.0,
        ),
        (
            "quota_worker_jobs_total",
            vec![("outcome", "dead"), ("reason", "malformed")],
            1.0,
        ),
        ("quota_worker_delays_total", vec![("cause", "cap")], 1.0),
        (
            "quota_worker_delay_seconds_count",
            vec![("cause", "cap")],
            1.0,
        ),
        (
            "quota_worker_shadow_total",
            vec![("policy", "promo"), ("verdict", "allowed")],
            1.0,
        ),
        (
            "quota_worker_shadow_total",
            vec![("policy", "promo"), ("verdict", "held_cap")],
            1.0,
        ),
        (
            "quota_worker_queue_messages",
            vec![("role", "jobs"), ("queue", &jobs_queue)],
            0.0,
        ),
        (
            "quota_worker_queue_messages",
            vec![("role", "dead"), ("queue", &dead_queue)],
            3.0,
        ),
        (
            "quota_worker_preference_total",
            vec![("outcome", "opted_out")],
            1.0,
        ),
        (
            "quota_worker_preference_total",
            vec![("outcome", "quiet_hours")],
            1.0,
        ),
        (
            "quota_worker_preference_requests_total",
            vec![("status", "200")],
            1.0,
        ),
        (
            "quota_worker_digest_items_total",
            vec![("policy", "social")],
            2.0,
        ),
        (
            "quota_worker_digests_total",
            vec![("policy", "social"), ("result", "sent")],
            1.0,
        ),
        (
            "quota_worker_digests_total",
            vec![("policy", "social"), ("result", "dead")],
            1.0,
        ),
        (
            "quota_worker_digest_items_count",
            vec![("policy", "social")],
            1.0,
        ),
        (
            "quota_worker_digest_items_sum",
            vec![("policy", "social")],
            2.0,
        ),
        (
            "quota_worker_fallback_total",
            vec![
                ("policy", "routed"),
                ("from", "email"),
                ("to", "sms"),
                ("cause", "capped"),
            ],
            1.0,
        ),
        ("quota_worker_in_flight", vec![], 0.0),
        (
            "quota_worker_lane_jobs_total",
            vec![("channel", "push"), ("lane", "urgent"), ("step", "parked")],
            2.0,
        ),
        (
            "quota_worker_lane_parked_unasked_total",
            vec![("channel", "push"), ("lane", "urgent")],
            1.0,
        ),
        (
            "quota_worker_lane_jobs_total",
            vec![("channel", "push"), ("lane", "urgent"), ("step", "taken")],
            2.0,
        ),
        (
            "quota_worker_lane_wait_seconds_count",
            vec![("channel", "push"), ("lane", "urgent")],
            2.0,
        ),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = http_get(&addr, "/metrics").await.expect("/metrics").1;
        let e = Exposition::parse(&body);
        let waiting: Vec<String> = expected
            .iter()
            .filter(|(name, labels, want)| e.value(name, labels) != Some(*want))
            .map(|(name, labels, want)| format!("{name}{labels:?} {want}"))
            .collect();
        if waiting.is_empty() {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "never settled; still waiting for {waiting:#?} in\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    stop_worker.cancel();
    running.await.unwrap();
    stop_http.cancel();
    http.await.unwrap();

    let e = Exposition::parse(&body);
    let mut problems = Vec::new();
    let mut used = 0;
    for (at, expr) in dashboard_exprs() {
        used += parse(&expr).0.len();
        problems.extend(problems_in(&at, &expr, &e));
    }
    for (name, rule) in alerts() {
        let at = format!("alert {name}");
        let expr = text(&rule["expr"]);
        used += parse(&expr).0.len();
        problems.extend(problems_in(&at, &expr, &e));
        // metrics the annotations name (advice, or a template's query) exist too
        if let Some(Yaml::Mapping(annotations)) = rule.get("annotations") {
            for said in annotations.values().map(text) {
                for n in names_in(&said) {
                    if e.family(&n).is_none() {
                        problems.push(format!("{n}: no such metric (named in {at}'s annotations)"));
                    }
                }
            }
        }
    }
    assert!(used > 40, "only {used} selectors found");
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "the worker's /metrics lacks what the dashboard or the alerts use:\n{}\n\n/metrics \
         families: {:?}",
        problems.join("\n"),
        e.kinds.keys().collect::<Vec<_>>()
    );
}
