//! `metrics.md`: every metric the worker exports, from its definitions: the name
//! constants of `src/metrics.rs` (and their doc comments), the type, unit and help
//! text `quota_worker::metrics::describe` gives the recorder (captured here by a
//! recorder of this test's own), and the labels the code records them with (read
//! from every `counter!`, `gauge!` and `histogram!` call in `src/`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

use super::source::{one_line, str_consts};

/// What `describe` said of a metric: its type, unit and help.
type Said = (&'static str, Option<Unit>, String);

/// What `describe` said of each metric, and the labels of what it registered.
#[derive(Default)]
struct Described {
    said: Mutex<BTreeMap<String, Said>>,
    labels: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

impl Described {
    fn say(&self, kind: &'static str, key: KeyName, unit: Option<Unit>, help: SharedString) {
        let mut said = self.said.lock().unwrap();
        said.insert(key.as_str().to_string(), (kind, unit, help.to_string()));
    }

    fn register(&self, key: &Key) {
        let mut labels = self.labels.lock().unwrap();
        let set = labels.entry(key.name().to_string()).or_default();
        set.extend(key.labels().map(|l| l.key().to_string()));
    }
}

impl Recorder for Described {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.say("counter", key, unit, help);
    }
    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.say("gauge", key, unit, help);
    }
    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, help: SharedString) {
        self.say("histogram", key, unit, help);
    }
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.register(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.register(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.register(key);
        Histogram::noop()
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The label keys each metric constant is recorded with in `src/`: the `"key" =>`
/// pairs of each `counter!`/`gauge!`/`histogram!` call naming it, and for a call
/// given `&labels`, the `("key", …)` pairs of that variable's `let` and pushes.
fn recorded_labels(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    files.sort();
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in files {
        let code = std::fs::read_to_string(&file).unwrap();
        for mac in ["counter!(", "gauge!(", "histogram!("] {
            let mut from = 0;
            while let Some(at) = code[from..].find(mac) {
                let start = from + at + mac.len();
                from = start;
                let mut depth = 1;
                let end = code[start..]
                    .char_indices()
                    .find(|(_, c)| {
                        match c {
                            '(' => depth += 1,
                            ')' => depth -= 1,
                            _ => {}
                        }
                        depth == 0
                    })
                    .map(|(i, _)| start + i)
                    .unwrap_or(code.len());
                let call = &code[start..end];
                let mut args = call.split(',');
                let name = args.next().unwrap_or("").trim();
                let name = name.rsplit("::").next().unwrap_or(name).to_string();
                if !name.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                    continue;
                }
                let set = out.entry(name).or_default();
                set.extend(label_keys(call, "\" =>"));
                // `&labels`: the variable's own pairs, written above the call
                if let Some(var) = call
                    .split(',')
                    .nth(1)
                    .map(str::trim)
                    .and_then(|a| a.strip_prefix('&'))
                    .filter(|v| v.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
                {
                    let before = &code[..from];
                    if let Some(at) = before.rfind(&format!("let {var} = ")) {
                        let stmt = &before[at..];
                        set.extend(label_keys(&stmt[..stmt.find(';').unwrap_or(0)], "\","));
                    }
                    let mut at = 0;
                    let push = format!("{var}.push((");
                    while let Some(p) = before[at..].find(&push) {
                        let stmt = &before[at + p..];
                        set.extend(label_keys(&stmt[..stmt.find(';').unwrap_or(0)], "\","));
                        at += p + push.len();
                    }
                }
            }
        }
    }
    out
}

/// The words in double quotes of `text` that `after` follows (`"result" =>`).
fn label_keys(text: &str, after: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(after) {
        let end = from + at;
        if let Some(open) = text[..end].rfind('"') {
            let word = &text[open + 1..end];
            if !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                out.push(word.to_string());
            }
        }
        from = end + after.len();
    }
    out
}

/// The page.
pub fn page(root: &Path) -> String {
    let described = Described::default();
    metrics::with_local_recorder(&described, quota_worker::metrics::describe);
    let said = described.said.into_inner().unwrap();
    let registered = described.labels.into_inner().unwrap();
    let recorded = recorded_labels(root);
    let source = std::fs::read_to_string(root.join("src/metrics.rs")).unwrap();
    let mut o = String::from(
        "# Metrics\n\n\
         <!-- Generated from src/metrics.rs (the names, and the help `describe` gives \
         the recorder) and the calls that record them, by the suite's `reference` tests; \
         do not edit (see README.md here). -->\n\n\
         Every metric `quota-worker run` serves on `/metrics` (Prometheus text; \
         `http.listen`), with its labels. Besides these, the process metrics Prometheus's \
         own clients name (`process_cpu_seconds_total`, `process_resident_memory_bytes`, \
         `process_open_fds`, …), read from `/proc` at each scrape.\n\n\
         | Metric | Type | Labels | Description |\n|---|---|---|---|\n",
    );
    for (constant, name, docs) in str_consts(&source) {
        if !name.starts_with("quota_worker_") {
            continue;
        }
        let (kind, unit, help) = match said.get(&name) {
            Some((kind, unit, help)) => (kind.to_string(), *unit, help.clone()),
            None => {
                let kind = ["Counter", "Gauge", "Histogram"]
                    .iter()
                    .find(|k| docs.starts_with(&format!("{k}:")))
                    .map(|k| k.to_lowercase())
                    .unwrap_or_else(|| "–".into());
                (kind, None, String::new())
            }
        };
        let docs = docs
            .split_once(": ")
            .filter(|(k, _)| ["Counter", "Gauge", "Histogram"].contains(k))
            .map(|(_, rest)| rest.to_string())
            .unwrap_or(docs.clone());
        let mut labels: BTreeSet<String> = recorded.get(&constant).cloned().unwrap_or_default();
        labels.extend(registered.get(&name).cloned().unwrap_or_default());
        let labels: Vec<String> = labels.iter().map(|l| format!("`{l}`")).collect();
        let kind = match unit {
            Some(u) => format!("{kind} ({})", u.as_canonical_label()),
            None => kind,
        };
        let text = if help.is_empty() {
            one_line(&docs)
        } else {
            one_line(&help)
        };
        let _ = writeln!(o, "| `{name}` | {kind} | {} | {text} |", labels.join(", "));
    }
    o
}
