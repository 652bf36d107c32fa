//! Figures for RELIABILITY.md. Each scenario records what it measured in
//! `target/reliability/<scenario>.json`; with `QW_WRITE_RELIABILITY=1` every record
//! also re-renders `RELIABILITY.md` at the workspace root from all the records present,
//! so the document's figures are written by the suite, never typed by hand.
//!
//! Here the records; `render` writes the document from them, around the prose of
//! `text` (what the worker promises, what each fault does, how to run the suite).

use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{json, Value};

mod cell;
mod details;
mod render;
mod soak;
mod text;

pub use render::render;

static WRITING: Mutex<()> = Mutex::new(());

/// The workspace root (this crate's parent): where RELIABILITY.md and `target/` are.
fn root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().expect("the workspace root").to_path_buf()
}

fn results_dir() -> PathBuf {
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("target"));
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
    if figures["mode"].is_null() {
        figures["mode"] = json!(if long() { "long" } else { "quick" });
    }
    let mode = figures["mode"].as_str().unwrap().to_string();
    figures["at"] = json!(chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string());
    // the code measured: the commit, `-dirty` with uncommitted changes
    let commit = std::process::Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    figures["commit"] = json!(commit);
    let dir = results_dir();
    let _ = std::fs::create_dir_all(&dir);
    let _ = std::fs::write(
        dir.join(format!("{name}.{mode}.json")),
        serde_json::to_string_pretty(&figures).unwrap(),
    );
    eprintln!("figures: {figures}");
    if std::env::var("QW_WRITE_RELIABILITY")
        .map(|v| v == "1")
        .unwrap_or(false)
    {
        let doc = render(&load());
        let _ = std::fs::write(root().join("RELIABILITY.md"), doc);
    }
}

/// Every record present, by `scenario.mode`.
pub fn load() -> std::collections::BTreeMap<String, Value> {
    let mut out = std::collections::BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(results_dir()) {
        for e in entries.flatten() {
            if let Ok(text) = std::fs::read_to_string(e.path()) {
                if let Ok(v) = serde_json::from_str::<Value>(&text) {
                    if let (Some(name), Some(mode)) = (v["scenario"].as_str(), v["mode"].as_str()) {
                        out.insert(format!("{name}.{mode}"), v);
                    }
                }
            }
        }
    }
    out
}
