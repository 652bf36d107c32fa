//! How a figure of a record reads in RELIABILITY.md: one cell, and the run it came
//! from.

use serde_json::Value;

/// A record's value as the document prints it: `–` for nothing, floats to two
/// places, whole numbers from 10,000 with thousands separators, lists joined.
pub(super) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "–".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => {
            if let Some(f) = n.as_f64().filter(|_| n.is_f64()) {
                format!("{f:.2}")
            } else if let Some(i) = n.as_u64().filter(|i| *i >= 10_000) {
                thousands(i)
            } else {
                n.to_string()
            }
        }
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(", "),
        other => other.to_string(),
    }
}

/// 1000000 as 1,000,000.
fn thousands(i: u64) -> String {
    let digits = i.to_string();
    let mut out = String::new();
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Seconds given as a float, printed rounded to whole seconds.
pub(super) fn whole_seconds(v: &Value) -> String {
    cell(&serde_json::json!(v.as_f64().unwrap_or(0.0).round() as u64))
}

/// When a record was made, and on which commit.
pub(super) fn run(v: &Value) -> String {
    match v["commit"].as_str() {
        Some(c) => format!("{} (`{c}`)", cell(&v["at"])),
        None => cell(&v["at"]),
    }
}

/// Each element of the list `v` as `item` prints it (none when `v` is no list).
pub(super) fn each(v: &Value, item: impl Fn(&Value) -> String) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(item).collect())
        .unwrap_or_default()
}
