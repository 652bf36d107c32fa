//! The Grafana dashboard (`deploy/grafana/dashboards/quota-worker.json`) evaluated
//! for real: Debian's `prometheus` scrapes a running worker under load every second,
//! every panel's queries run against it (Grafana's variables filled in as Grafana
//! would), every panel must show data, and the panels are drawn at their grid
//! positions in headless Chromium: the picture the operating guide shows
//! (`QW_WRITE_PICTURES=1` writes it to `docs/dashboard.png`). Skipped, saying so,
//! where `prometheus` or `chromium` is missing (`.ci/run` installs both).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::procs::WorkerProc;
use testkit::*;

fn which(names: &[&str]) -> Option<PathBuf> {
    names.iter().map(PathBuf::from).find(|p| p.exists())
}

/// Percent-encode a query-string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A private Prometheus scraping `target` every second; killed when dropped.
struct Prometheus {
    child: std::process::Child,
    addr: String,
}

impl Prometheus {
    async fn start(bin: &Path, dir: &Path, target: &str) -> Prometheus {
        let port = testkit::free_port(None);
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: quota-worker\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .spawn()
            .expect("prometheus");
        let p = Prometheus { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(http_get(&p.addr, "/-/ready").await, Some((200, _))) {
            assert!(Instant::now() < deadline, "prometheus did not start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        p
    }

    /// `query_range` over [start, end] by `step` seconds: the result's series.
    async fn range(&self, query: &str, start: f64, end: f64, step: u32) -> Vec<Value> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={step}",
            encode(query)
        );
        let (code, body) = http_get(&self.addr, &path)
            .await
            .expect("prometheus answers");
        let v: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        assert_eq!(code, 200, "{query}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A panel's query as Grafana sends it: every worker (`$instance` = All) and a
/// rate interval of four scrapes.
fn as_grafana_sends(expr: &str) -> String {
    expr.replace("$__rate_interval", "4s")
        .replace("\"$instance\"", "\".*\"")
}

/// `{{label}}` in a legend filled from the series' labels.
fn legend(format: &str, metric: &Value) -> String {
    let mut out = format.to_string();
    if let Some(labels) = metric.as_object() {
        for (k, v) in labels {
            out = out.replace(&format!("{{{{{k}}}}}"), v.as_str().unwrap_or_default());
        }
    }
    // a label a series does not have reads as empty, as in Grafana
    while let Some(at) = out.find("{{") {
        let Some(len) = out[at..].find("}}") else {
            break;
        };
        out.replace_range(at..at + len + 2, "");
    }
    match out.trim() {
        "" => metric.to_string(),
        text => text.to_string(),
    }
}

/// No two panels (rows included) share a cell of Grafana's 24-column grid: the drawing
/// places panels where their `gridPos` says, so an overlap would hide one.
#[test]
fn no_two_panels_of_the_dashboard_overlap() {
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/grafana/dashboards/quota-worker.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut taken: std::collections::BTreeMap<(u64, u64), String> = Default::default();
    let mut overlaps = std::collections::BTreeSet::new();
    for p in dashboard["panels"].as_array().unwrap() {
        let g = &p["gridPos"];
        let [x, y, w, h] = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        let title = p["title"].as_str().unwrap_or("").to_string();
        for cx in x..x + w {
            for cy in y..y + h {
                if let Some(other) = taken.insert((cx, cy), title.clone()) {
                    overlaps.insert(format!("{other} and {title}"));
                }
            }
        }
    }
    assert!(overlaps.is_empty(), "overlapping panels: {overlaps:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_panel_of_the_dashboard_shows_data_from_a_live_worker() {
    let (Some(prom), Some(chrome)) = (
        which(&["/usr/bin/prometheus"]),
        testkit::browser::chromium(),
    ) else {
        eprintln!("SKIPPED: needs Debian's prometheus and chromium (.ci/run installs both)");
        return;
    };
    let ns = unique("dashboard");
    let mut s = settings(&ns);
    // paced, so that its rate in force is shown
    s.channels.get_mut("sms").unwrap().rate = Some(1000);
    s.channels.get_mut("sms").unwrap().burst = Some(100);
    // email paced below its traffic, so that its jobs wait in their lane (before the
    // cleanup is made, so that it deletes the lane queues too)
    s.channels.get_mut("email").unwrap().rate = Some(2);
    let _c = Cleanup::new(&s);
    let dir = testkit::temp_dir(&ns);
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", testkit::free_port(None));
    // a shadow policy, and one with a digest (a window of a second)
    let extra = "[policies.promo]\nrules = [{ limit = 1, window = \"1d\" }]\nmode = \"shadow\"\n\
                 [policies.social]\nrules = []\n[policies.social.digest]\nmode = \"window\"\nwindow = \"1s\"\n";
    let config = dir.join("worker.toml");
    std::fs::write(&config, format!("{}{extra}", testkit::env::worker_toml(&s))).unwrap();
    let mut w = WorkerProc::spawn_serving(crate::BIN, &s, &dir, "0");
    let addr = s.http.listen.clone();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(http_get(&addr, "/readyz").await, Some((200, _))) {
        assert!(
            Instant::now() < deadline,
            "the worker is not ready:\n{}",
            w.tail(20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let prometheus = Prometheus::start(&prom, &dir, &addr).await;

    // 30 s of traffic: every outcome, delays, a shadow policy, a reload, feedback,
    // preferences, digests, fallback
    let conn = amqp().await;
    let feedback = quota_worker_producer::FeedbackPublisher::open(
        &conn,
        &s.feedback.exchange,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    // a recipient's own preferences (the API, open on this loopback listener): its
    // promotions opted out, and quiet hours now (in UTC, until two hours later)
    let prefs =
        quota_worker_producer::preferences::PreferencesClient::new(&format!("http://{addr}"), None)
            .unwrap();
    let hour = chrono::Timelike::hour(&chrono::Utc::now());
    let set = json!({"categories": {"promo": false},
        "quiet_hours": {"timezone": "UTC", "windows": [{"days": "daily",
            "from": format!("{hour:02}:00"), "to": format!("{:02}:00", (hour + 2) % 24)}]}});
    prefs.put("own-say", None, &set).await.unwrap();
    let started = chrono::Utc::now();
    for round in 0..60u32 {
        // one opted out, one held by the quiet hours, and the set read, each round
        for (kind, category) in [("p", "promo"), ("q", "default")] {
            let body = format!(
                r#"{{"id":"{ns}-{kind}{round}","recipient":"own-say","channel":"sms","category":"{category}"}}"#
            );
            publish(&conn, &s, body.as_bytes()).await;
        }
        prefs.get("own-say", None).await.unwrap();
        // a promotion with a route: opted out on sms, moved on to email
        let body = format!(
            r#"{{"id":"{ns}-f{round}","recipient":"own-say","channel":"sms","category":"promo","fallback":["email"]}}"#
        );
        publish(&conn, &s, body.as_bytes()).await;
        // three jobs a round folded into the digests of two recipients (a digest
        // closes a second after its first item: two or three rounds each)
        for k in 0..3u32 {
            let body = format!(
                r#"{{"id":"{ns}-d{round}-{k}","recipient":"dg{}","channel":"sms","category":"social"}}"#,
                k % 2
            );
            publish(&conn, &s, body.as_bytes()).await;
        }
        for i in 0..10u32 {
            let n = round * 10 + i;
            let body = match i {
                0 => format!(r#"{{"id":"{ns}-{n}","recipient":"held","channel":"sms"}}"#),
                1 => format!(
                    r#"{{"id":"{ns}-{n}","recipient":"r{}","channel":"sms","category":"promo"}}"#,
                    n % 3
                ),
                2 => format!(r#"{{"id":"{ns}-{n}","recipient":42,"channel":"sms"}}"#),
                3 => format!(r#"{{"id":"{ns}-{n}","recipient":"r","channel":"fax"}}"#),
                4 | 5 => format!(r#"{{"id":"{ns}-{n}","recipient":"e{n}","channel":"email"}}"#),
                _ => format!(
                    r#"{{"id":"{ns}-{n}","recipient":"r{n}","channel":"sms","category":"transactional"}}"#
                ),
            };
            publish(&conn, &s, body.as_bytes()).await;
        }
        use quota_worker_producer::{Event, Feedback};
        let event = [
            Event::Delivered,
            Event::Failed,
            Event::Bounced,
            Event::Throttled,
        ][round as usize % 4];
        let mut f = Feedback::new(&format!("{ns}-{round}"), event, &format!("r{round}"), "sms");
        f.retry_after = (event == Event::Throttled).then_some(0.05);
        feedback.publish(&f).await.unwrap();
        if round == 30 {
            let out = crate::cli::qw(
                &s,
                &["--config", config.to_str().unwrap(), "admin", "reload"],
            )
            .output()
            .unwrap();
            assert!(out.status.success(), "{out:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let end = chrono::Utc::now();
    let (start, end) = (
        started.timestamp_millis() as f64 / 1000.0,
        end.timestamp_millis() as f64 / 1000.0,
    );

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/deploy/grafana/dashboards/quota-worker.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut panels = Vec::new();
    let mut empty = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let kind = panel["type"].as_str().unwrap_or_default();
        let title = panel["title"].as_str().unwrap_or_default().to_string();
        if kind == "row" {
            panels.push(json!({"type": "row", "title": title, "grid": panel["gridPos"]}));
            continue;
        }
        let mut series = Vec::new();
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap_or_default();
            let format = target["legendFormat"].as_str().unwrap_or_default();
            for result in prometheus
                .range(&as_grafana_sends(expr), start, end, 1)
                .await
            {
                let points: Vec<(f64, f64)> = result["values"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| {
                        let t = p[0].as_f64()?;
                        let v: f64 = p[1].as_str()?.parse().ok()?;
                        v.is_finite().then_some((t, v))
                    })
                    .collect();
                if !points.is_empty() {
                    series
                        .push(json!({"name": legend(format, &result["metric"]), "points": points}));
                }
            }
        }
        if series.is_empty() {
            empty.push(title.clone());
        }
        panels.push(json!({
            "type": kind,
            "title": title,
            "grid": panel["gridPos"],
            "unit": panel["fieldConfig"]["defaults"]["unit"],
            "series": series,
        }));
    }
    assert!(w.running(), "{}", w.tail(20));
    assert_eq!(w.stop().map(|s| s.success()), Some(true));
    assert!(empty.is_empty(), "panels without data: {empty:?}");

    // drawn at their grid positions, as Grafana lays them out
    let page = dir.join("dashboard.html");
    let data = json!({"title": dashboard["title"], "from": start, "to": end, "panels": panels});
    std::fs::write(&page, PAGE.replace("/*DATA*/null", &data.to_string())).unwrap();
    let png = crate::picture_path("dashboard.png", "QW_DASHBOARD_SCREENSHOT", &dir);
    let height = panels
        .iter()
        .filter_map(|p| Some(p["grid"]["y"].as_u64()? + p["grid"]["h"].as_u64()?))
        .max()
        .unwrap_or(40)
        * 30
        + 60;
    let window = format!("--window-size=1400,{height}");
    let screenshot = format!("--screenshot={}", png.display());
    let shot = testkit::browser::headless(
        &chrome,
        &dir.join("profile"),
        3000,
        &[&window, &screenshot],
        &format!("file://{}", page.display()),
    );
    let bytes = std::fs::read(&png).unwrap_or_default();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 50_000,
        "a picture of the dashboard: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
}

/// The page that draws the panels (stat, time series, state timeline) from the
/// data the test queried; no external assets.
const PAGE: &str = r##"<!doctype html>
<html><head><meta charset="utf-8"><style>
body { margin: 0; background: #111217; color: #ccccdc; font: 12px/1.3 system-ui, sans-serif; }
h1 { font-size: 16px; font-weight: 500; margin: 0; padding: 14px 16px; }
#grid { position: relative; margin: 0 8px; }
.panel { position: absolute; box-sizing: border-box; background: #181b1f; border: 1px solid #2a2d33; border-radius: 3px; padding: 6px 8px; overflow: hidden; }
.panel .t { font-weight: 500; color: #d8d9da; margin-bottom: 4px; white-space: nowrap; }
.row { position: absolute; font-size: 14px; font-weight: 500; color: #d8d9da; padding: 6px 4px; }
.stat { font-size: 34px; font-weight: 500; color: #73bf69; margin-top: 12px; }
.legend { display: flex; flex-wrap: wrap; gap: 2px 10px; font-size: 11px; margin-top: 2px; }
.legend i { display: inline-block; width: 10px; height: 3px; margin-right: 4px; vertical-align: middle; }
svg text { fill: #8e8e8e; font-size: 10px; }
</style></head><body><h1 id="title"></h1><div id="grid"></div>
<script>
"use strict";
const D = /*DATA*/null;
const COLORS = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#fade2a", "#96d98d", "#ffb357"];
const W = 1384 / 24, H = 30;
document.getElementById("title").textContent = D.title + " — live worker, last " + Math.round(D.to - D.from) + " s";
const grid = document.getElementById("grid");
function fmt(v, unit) {
  if (unit === "s") return v < 0.001 ? (v * 1e6).toFixed(0) + " µs" : v < 1 ? (v * 1000).toFixed(1) + " ms" : v.toFixed(1) + " s";
  if (unit === "bytes") return (v / 1048576).toFixed(1) + " MiB";
  if (unit === "percentunit") return (v * 100).toFixed(1) + "%";
  return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(2);
}
for (const p of D.panels) {
  const g = p.grid || {x: 0, y: 0, w: 24, h: 1};
  if (p.type === "row") {
    const r = document.createElement("div");
    r.className = "row"; r.textContent = p.title;
    Object.assign(r.style, {left: g.x * W + "px", top: g.y * H + "px"});
    grid.append(r); continue;
  }
  const el = document.createElement("div");
  el.className = "panel";
  Object.assign(el.style, {left: g.x * W + 2 + "px", top: g.y * H + 2 + "px", width: g.w * W - 4 + "px", height: g.h * H - 4 + "px"});
  const t = document.createElement("div"); t.className = "t"; t.textContent = p.title; el.append(t);
  if (p.type === "stat") {
    const s = document.createElement("div"); s.className = "stat";
    s.textContent = p.series.map(x => { const last = x.points[x.points.length - 1][1]; return (p.series.length > 1 || x.name.indexOf("{") < 0 ? (x.name.indexOf("{") < 0 && x.name ? x.name + " " : "") : "") + fmt(last, p.unit); }).join("  ");
    el.append(s); grid.append(el); continue;
  }
  const w = g.w * W - 22, h = g.h * H - 58;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", w); svg.setAttribute("height", h);
  let max = 0;
  for (const x of p.series) for (const [, v] of x.points) max = Math.max(max, v);
  if (p.type === "state-timeline") max = 1;
  max = max || 1;
  for (let i = 0; i <= 2; i++) {
    const y = 4 + (h - 18) * (1 - i / 2);
    const l = document.createElementNS(ns, "line");
    l.setAttribute("x1", 40); l.setAttribute("x2", w); l.setAttribute("y1", y); l.setAttribute("y2", y);
    l.setAttribute("stroke", "#2a2d33"); svg.append(l);
    const tx = document.createElementNS(ns, "text");
    tx.setAttribute("x", 0); tx.setAttribute("y", y + 3); tx.textContent = fmt(max * i / 2, p.unit); svg.append(tx);
  }
  p.series.forEach((x, k) => {
    const d = x.points.map(([t, v], i) => (i ? "L" : "M") + (40 + (t - D.from) / (D.to - D.from) * (w - 40)).toFixed(1) + "," + (4 + (h - 18) * (1 - v / max)).toFixed(1)).join(" ");
    const path = document.createElementNS(ns, "path");
    path.setAttribute("d", d); path.setAttribute("fill", "none");
    path.setAttribute("stroke", COLORS[k % COLORS.length]); path.setAttribute("stroke-width", 1.5);
    svg.append(path);
  });
  el.append(svg);
  const lg = document.createElement("div"); lg.className = "legend";
  p.series.forEach((x, k) => { const s = document.createElement("span"); const i = document.createElement("i"); i.style.background = COLORS[k % COLORS.length]; s.append(i, x.name); lg.append(s); });
  el.append(lg);
  grid.append(el);
}
grid.style.height = Math.max(...D.panels.map(p => ((p.grid || {}).y + (p.grid || {}).h) * H)) + "px";
</script></body></html>
"##;
