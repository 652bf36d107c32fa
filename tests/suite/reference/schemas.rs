//! `schemas.md`: the JSON Schemas of what producers and senders publish, property
//! by property: the job's and the feedback's from the producer crate's types
//! (`quota_worker_producer::schema`, `feedback_schema`), and any other schema
//! checked in under `schema/`. `schema/feedback.schema.json` is written here too
//! (`schema/job.schema.json` by the producer crate's own test).

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

/// The schemas: (file under `schema/`, schema), the job's first.
pub fn schemas(root: &Path) -> Vec<(String, Value)> {
    let mut out = vec![
        (
            "job.schema.json".to_string(),
            quota_worker_producer::schema(),
        ),
        (
            "feedback.schema.json".to_string(),
            quota_worker_producer::feedback_schema(),
        ),
    ];
    let mut others: Vec<String> = std::fs::read_dir(root.join("schema"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".schema.json") && !out.iter().any(|(o, _)| o == n))
        .collect();
    others.sort();
    for name in others {
        let text = std::fs::read_to_string(root.join("schema").join(&name)).unwrap();
        let schema = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((name, schema));
    }
    out
}

/// The file `schema/feedback.schema.json` holds.
pub fn feedback_file() -> String {
    serde_json::to_string_pretty(&quota_worker_producer::feedback_schema()).unwrap() + "\n"
}

fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// What a property's value may be, in words.
fn kind(schema: &Value, root: &Value) -> String {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.rsplit('/').next().unwrap_or(r);
        let def = &root["$defs"][name];
        return match def["oneOf"].as_array().or(def["anyOf"].as_array()) {
            Some(parts) => one_of(parts),
            None => kind(def, root),
        };
    }
    if let Some(words) = schema["enum"].as_array() {
        if words.len() > 12 {
            return format!("one of {} names", words.len());
        }
        let words: Vec<String> = words.iter().map(|w| format!("`{w}`")).collect();
        return format!("one of {}", words.join(", "));
    }
    if let Some(c) = schema.get("const") {
        return format!("`{c}`");
    }
    if let Some(parts) = schema["anyOf"].as_array().or(schema["oneOf"].as_array()) {
        if parts.iter().all(|p| p.get("const").is_some()) {
            return one_of(parts);
        }
        let kinds: Vec<String> = parts.iter().map(|p| kind(p, root)).collect();
        return kinds.join(" or ");
    }
    let mut out = match &schema["type"] {
        Value::String(t) => t.clone(),
        Value::Array(ts) => ts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any JSON".into(),
    };
    if let Some(f) = schema["format"].as_str() {
        out.push_str(&format!(" ({f})"));
    }
    let (min, max) = (&schema["minLength"], &schema["maxLength"]);
    if let (Some(min), Some(max)) = (min.as_u64(), max.as_u64()) {
        out.push_str(&format!(", {min} to {max} characters"));
    }
    if let Some(min) = schema["minimum"].as_f64() {
        out.push_str(&format!(", at least {min}"));
    }
    out
}

fn one_of(parts: &[Value]) -> String {
    let words: Vec<String> = parts
        .iter()
        .map(|p| match p["description"].as_str() {
            Some(d) => format!("`{}` ({})", p["const"], d.trim_end_matches('.')),
            None => format!("`{}`", p["const"]),
        })
        .collect();
    format!("one of {}", words.join("; "))
}

/// The page.
pub fn page(root: &Path) -> String {
    let mut o = String::from(
        "# Schemas\n\n\
         <!-- Generated from the producer crate's types and schema/ by the suite's \
         `reference` tests; do not edit (see README.md here). -->\n\n\
         What is published to the worker, as JSON Schemas (draft 2020-12) in \
         [schema/](../../schema/), property by property. The worker's decoders check \
         a little more than a schema can say (a configured channel, for one); what a \
         decoder refuses is dead-lettered with the reason why.\n",
    );
    for (file, schema) in schemas(root) {
        let title = schema["title"].as_str().unwrap_or(&file).to_string();
        let _ = write!(
            o,
            "\n## {title}\n\n{}\n\n[schema/{file}](../../schema/{file})\n\n",
            schema["description"].as_str().unwrap_or("").trim()
        );
        let required: Vec<&str> = schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        o.push_str("| Property | Required | Value | Meaning |\n|---|---|---|---|\n");
        if let Some(props) = schema["properties"].as_object() {
            for (name, p) in props {
                let _ = writeln!(
                    o,
                    "| `{name}` | {} | {} | {} |",
                    if required.contains(&name.as_str()) {
                        "yes"
                    } else {
                        ""
                    },
                    cell(&kind(p, &schema)),
                    cell(p["description"].as_str().unwrap_or(""))
                );
            }
        }
        if schema["additionalProperties"] == Value::Bool(false) {
            o.push_str("\nNo other property is accepted.\n");
        }
    }
    o
}
