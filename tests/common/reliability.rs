//! Figures for RELIABILITY.md. Each scenario records what it measured in
//! `target/reliability/<scenario>.json`; with `QW_WRITE_RELIABILITY=1` every record
//! also re-renders `RELIABILITY.md` at the crate root from all the records present,
//! so the document's figures are written by the suite, never typed by hand.
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{json, Value};

static WRITING: Mutex<()> = Mutex::new(());

fn results_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("reliability")
}

/// Whether the long forms run (`QW_FAULTS_LONG=1`).
pub fn long() -> bool {
    std::env::var("QW_FAULTS_LONG")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// Record one scenario's figures (a JSON object with at least `scenario`).
pub fn record(mut figures: Value) {
    let _g = WRITING.lock().unwrap_or_else(|e| e.into_inner());
    let name = figures["scenario"].as_str().expect("scenario").to_string();
    figures["mode"] = json!(if long() { "long" } else { "quick" });
    figures["at"] = json!(chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string());
    let dir = results_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(
        dir.join(format!("{name}.json")),
        serde_json::to_string_pretty(&figures).unwrap(),
    );
    eprintln!("figures: {figures}");
    if std::env::var("QW_WRITE_RELIABILITY")
        .map(|v| v == "1")
        .unwrap_or(false)
    {
        let doc = render(&load());
        let _ = std::fs::write(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("RELIABILITY.md"),
            doc,
        );
    }
}

/// Every record present, by scenario name.
pub fn load() -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(results_dir()) {
        for e in entries.flatten() {
            if let Ok(text) = std::fs::read_to_string(e.path()) {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    if let Some(name) = v["scenario"].as_str() {
                        out.insert(name.to_string(), v);
                    }
                }
            }
        }
    }
    out
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                format!("{f:.2}")
            } else {
                n.to_string()
            }
        }
        other => other.to_string(),
    }
}

/// Render the whole document from the records.
pub fn render(records: &std::collections::BTreeMap<String, Value>) -> String {
    let mut out = String::from("# Reliability\n\n");
    for (name, v) in records {
        out.push_str(&format!("- {name}: {}\n", cell(v)));
    }
    out
}
