//! The job's JSON Schema: generated from the Rust type, checked in as
//! `schema/job.schema.json`, and in agreement with the worker's decoder on a corpus
//! of valid and invalid jobs (the two limits a schema cannot state are listed and
//! checked as such).

use quota_worker_producer::{decode, schema};
use serde_json::Value;

const MAX_BODY: usize = 262_144;

fn checked_in() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../schema/job.schema.json");
    let text = std::fs::read_to_string(path).expect("schema/job.schema.json");
    serde_json::from_str(&text).expect("the checked-in schema is JSON")
}

#[test]
fn the_checked_in_schema_is_the_generated_one() {
    assert!(
        checked_in() == schema(),
        "schema/job.schema.json is stale: regenerate it with\n  cargo run -p quota-worker-producer --example schema > schema/job.schema.json"
    );
}

fn validator() -> jsonschema::Validator {
    jsonschema::options()
        .should_validate_formats(true)
        .build(&schema())
        .expect("the schema is a valid JSON Schema")
}

/// Jobs the worker accepts.
const VALID: &[&str] = &[
    r#"{"id":"j1","recipient":"r","channel":"sms"}"#,
    r#"{"id":"j1","recipient":"+8613800000000","channel":"sms","category":"promo","timezone":"Asia/Shanghai","expires_at":"2026-12-01T00:00:00+08:00","not_before":"2026-11-30T09:00:00Z","collapse_key":"cart","payload":{"a":[1,2]},"extra":true}"#,
    r#"{"id":"a\"b","recipient":"{x}:\n\u0000","channel":"sms"}"#,
    r#"{"id":"ß","recipient":"日本語の受信者","channel":"push"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","sender":"+15550100","cost":100}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","sender":null,"cost":null}"#,
    r#"{"id":"j","recipient":"r","channel":"email","category":null,"timezone":null,"expires_at":null,"not_before":null,"collapse_key":null,"payload":null}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","timezone":"UTC"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","timezone":"America/Argentina/Buenos_Aires"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"2026-12-01T00:00:00.123456Z"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"2026-12-01T00:00:00-05:30"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"2026-12-01t00:00:00z"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","not_before":"2016-12-31T23:59:60Z"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","payload":"just text"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","payload":[1,{"deep":{"er":null}}]}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","trace_id":"abc","tier":5}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","priority":"urgent"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","priority":"bulk","category":"promo"}"#,
    r#"{"id":"j","recipient":"r","channel":"sms","priority":null}"#,
];

/// Jobs the worker dead-letters as `malformed`, with what is wrong.
const INVALID: &[(&str, &str)] = &[
    (r#"[1,2]"#, "not an object"),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","priority":"high"}"#,
        "a priority that is not a lane",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","priority":5}"#,
        "a numeric priority",
    ),
    (r#""a job""#, "a string"),
    (r#"{"recipient":"r","channel":"sms"}"#, "no id"),
    (
        r#"{"id":null,"recipient":"r","channel":"sms"}"#,
        "a null id",
    ),
    (
        r#"{"id":"","recipient":"r","channel":"sms"}"#,
        "an empty id",
    ),
    (
        r#"{"id":7,"recipient":"r","channel":"sms"}"#,
        "a numeric id",
    ),
    (r#"{"id":"j","channel":"sms"}"#, "no recipient"),
    (
        r#"{"id":"j","recipient":"","channel":"sms"}"#,
        "an empty recipient",
    ),
    (
        r#"{"id":"j","recipient":["r"],"channel":"sms"}"#,
        "a list for a recipient",
    ),
    (r#"{"id":"j","recipient":"r"}"#, "no channel"),
    (
        r#"{"id":"j","recipient":"r","channel":""}"#,
        "an empty channel",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","category":""}"#,
        "an empty category",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","category":3}"#,
        "a numeric category",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","timezone":"Mars/Olympus"}"#,
        "an unknown zone",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","timezone":"asia/shanghai"}"#,
        "a zone in the wrong case",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","timezone":""}"#,
        "an empty zone",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"tomorrow"}"#,
        "an instant in words",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"2026-12-01"}"#,
        "a date without a time",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"2026-12-01T00:00:00"}"#,
        "an instant without an offset",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","not_before":"2026-13-01T00:00:00Z"}"#,
        "a 13th month",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","not_before":1764547200}"#,
        "an epoch number",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","collapse_key":""}"#,
        "an empty collapse key",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","expires_at":"2026-12-01 00:00:00Z"}"#,
        "a space for the T",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","cost":0}"#,
        "a cost of 0",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","cost":101}"#,
        "a cost of 101",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","cost":"2"}"#,
        "a cost as text",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","cost":-1}"#,
        "a negative cost",
    ),
    (
        r#"{"id":"j","recipient":"r","channel":"sms","sender":""}"#,
        "an empty sender",
    ),
];

/// Over-long fields, each one character past its limit (and at the limit: valid).
fn lengths() -> Vec<(String, bool)> {
    let mut out = Vec::new();
    for (field, max) in [
        ("id", 128),
        ("recipient", 256),
        ("channel", 64),
        ("category", 64),
        ("collapse_key", 128),
        ("digest_key", 128),
        ("sender", 128),
    ] {
        for (n, ok) in [(max, true), (max + 1, false)] {
            let mut job = serde_json::json!({"id": "j", "recipient": "r", "channel": "sms"});
            job[field] = Value::from("é".repeat(n.min(60)) + &"x".repeat(n.saturating_sub(60)));
            out.push((job.to_string(), ok));
        }
    }
    out
}

#[test]
fn the_schema_and_the_decoder_agree_on_every_job_of_the_corpus() {
    let v = validator();
    let mut cases: Vec<(String, bool, String)> = Vec::new();
    cases.extend(VALID.iter().map(|b| (b.to_string(), true, "valid".into())));
    cases.extend(
        INVALID
            .iter()
            .map(|(b, why)| (b.to_string(), false, why.to_string())),
    );
    cases.extend(
        lengths()
            .into_iter()
            .map(|(b, ok)| (b, ok, "a length at or past its limit".into())),
    );
    let mut disagree = Vec::new();
    for (body, expected, why) in &cases {
        let decoder = decode(body.as_bytes(), MAX_BODY, chrono_tz::UTC);
        let instance: Value = serde_json::from_str(body).expect("the corpus is JSON");
        let schema = v.is_valid(&instance);
        if decoder.is_ok() != *expected || schema != *expected {
            disagree.push(format!(
                "{why}: expected {}, decoder {:?}, schema {}\n  {body}",
                if *expected { "valid" } else { "invalid" },
                decoder.map(|_| "valid"),
                if schema { "valid" } else { "invalid" }
            ));
        }
    }
    assert!(
        disagree.is_empty(),
        "{} of {} cases:\n{}",
        disagree.len(),
        cases.len(),
        disagree.join("\n")
    );
}

/// What a JSON Schema cannot state, and the decoder refuses: an id over 255 bytes of
/// UTF-8 (the AMQP message id's limit) that is within 128 characters, and a body over
/// `worker.max_body_bytes`. Producers that use the schema alone should know these two.
#[test]
fn the_two_limits_a_schema_cannot_state_are_the_only_differences() {
    let v = validator();
    let wide_id = serde_json::json!({"id": "日".repeat(100), "recipient": "r", "channel": "sms"});
    let big = serde_json::json!({"id": "j", "recipient": "r", "channel": "sms", "payload": "x".repeat(MAX_BODY)});
    for (job, says) in [(wide_id, "255"), (big, "bytes")] {
        assert!(v.is_valid(&job), "the schema cannot refuse it");
        let body = job.to_string();
        let err = decode(body.as_bytes(), MAX_BODY, chrono_tz::UTC).unwrap_err();
        assert!(err.0.contains(says), "{err}");
    }
    // and the schema says so in the id's description
    let id = &schema()["properties"]["id"]["description"];
    assert!(id.as_str().unwrap().contains("255 bytes"), "{id}");
}

#[test]
fn every_zone_the_worker_accepts_is_in_the_schema() {
    let zones = &schema()["properties"]["timezone"]["anyOf"][0]["enum"];
    let zones: Vec<&str> = zones
        .as_array()
        .unwrap()
        .iter()
        .map(|z| z.as_str().unwrap())
        .collect();
    assert!(zones.len() > 400, "{}", zones.len());
    for name in ["UTC", "Asia/Kolkata", "Europe/Paris", "America/St_Johns"] {
        assert!(zones.contains(&name), "{name}");
        assert!(name.parse::<chrono_tz::Tz>().is_ok());
    }
}
