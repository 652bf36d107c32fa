//! Bad input. A proptest-driven generator for the job decoder (`decode::decode`) and
//! the header handling (`headers::next_headers`, `headers::attempt_info`,
//! `headers::dead_headers`): random bytes, random JSON-ish structures, mutated valid
//! jobs, nasty field values, random AMQP header tables. No input may panic, and each
//! body is either a job that meets the contract or a `Malformed` with a reason.
//!
//! `QW_FUZZ_CASES` sets the cases per property (CI: 2,000). A long run:
//! `QW_FUZZ_CASES=1000000 cargo test --release --test suite fuzz::` (about two million
//! decoder inputs per million cases, as some properties try several bodies per case).
//!
//! Then hand-written cases go end to end through the running worker, each
//! dispatched or dead-lettered exactly once; and "negative or huge cost" is covered
//! where cost lives: the configuration and the GCRA script.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use chrono::{TimeZone, Utc};
use chrono_tz::Tz;
use lapin::types::{
    AMQPValue, ByteArray, DecimalValue, FieldArray, FieldTable, LongString, ShortString,
};
use lapin::BasicProperties;
use proptest::prelude::*;
use quota_worker::amqp::ladder::BIT_PREFIX;
use quota_worker::config::Settings;
use quota_worker::job::decode::{self, Malformed, MAX_ID_CHARS, MAX_RECIPIENT_CHARS};
use quota_worker::job::headers::{self, ATTEMPT, DETAIL, FIRST_SEEN, NOT_BEFORE, REASON};
use serde_json::json;
use testkit::audit::{self, Audit};
use testkit::reliability::record;
use testkit::*;

const MAX: usize = 4096;

fn cases() -> u32 {
    std::env::var("QW_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    }
}

/// Counters per property: inputs, jobs, malformed.
struct Tally {
    inputs: AtomicU64,
    jobs: AtomicU64,
    malformed: AtomicU64,
}

impl Tally {
    const fn new() -> Tally {
        Tally {
            inputs: AtomicU64::new(0),
            jobs: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
        }
    }

    fn record(&self, name: &str) {
        record(json!({
            "scenario": format!("fuzz_{name}"),
            "test": format!("tests/suite/fuzz.rs: {name}"),
            "inputs": self.inputs.load(Ordering::Relaxed),
            "jobs": self.jobs.load(Ordering::Relaxed),
            "malformed": self.malformed.load(Ordering::Relaxed),
            "panics": 0,
            "cases_per_property": cases(),
            "mode": if cases() > 10_000 { "long" } else { "quick" },
        }));
    }
}

/// The verdict on one body must be a job that meets the contract, or a reason.
fn check(tally: &Tally, body: &[u8]) -> Result<(), TestCaseError> {
    tally.inputs.fetch_add(1, Ordering::Relaxed);
    match decode::decode(body, MAX, Tz::UTC) {
        Ok(job) => {
            tally.jobs.fetch_add(1, Ordering::Relaxed);
            let chars = |s: &str| s.chars().count();
            prop_assert!(body.len() <= MAX);
            prop_assert!((1..=MAX_ID_CHARS).contains(&chars(&job.id)));
            prop_assert!(job.id.len() <= 255, "an AMQP message id holds 255 bytes");
            prop_assert!((1..=MAX_RECIPIENT_CHARS).contains(&chars(&job.recipient)));
            prop_assert!((1..=64).contains(&chars(&job.channel)));
            prop_assert!((1..=64).contains(&chars(&job.category)));
            // the id fits in a message_id (this would panic otherwise)
            let _ = ShortString::from(job.id.as_ref());
        }
        Err(Malformed(reason)) => {
            tally.malformed.fetch_add(1, Ordering::Relaxed);
            prop_assert!(
                !reason.trim().is_empty(),
                "a malformed verdict needs a reason"
            );
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Generators

/// Strings that stress JSON and the field checks: escapes, control characters,
/// astral planes, lengths around every limit.
fn nasty_string() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,8}",
        "[\\PC]{0,40}",
        "[{}:\"\\\\\\n\\r\\t\\u{0}\\u{7f}\\u{2028}\\u{feff}\\u{10ffff}]{0,20}",
        Just(String::new()),
        (1usize..300).prop_map(|n| "i".repeat(n)),
        (60usize..140).prop_map(|n| "é".repeat(n)),
        (120usize..135).prop_map(|n| "𝄞".repeat(n)),
        Just("../../etc/passwd".to_string()),
        Just("Asia/Shanghai".to_string()),
        Just("UTC".to_string()),
        Just("9999-12-31T23:59:59Z".to_string()),
        Just("1970-01-01T00:00:00Z".to_string()),
        Just("2026-02-30T00:00:00Z".to_string()),
        Just("+275760-09-13T00:00:00Z".to_string()),
        Just("2026-01-01T00:00:00+99:99".to_string()),
    ]
}

/// A JSON value of any shape, biased toward the job's field names.
fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        any::<u64>().prop_map(|n| json!(n)),
        nasty_string().prop_map(Value::String),
    ];
    let key = prop_oneof![
        Just("id".to_string()),
        Just("recipient".to_string()),
        Just("channel".to_string()),
        Just("category".to_string()),
        Just("timezone".to_string()),
        Just("expires_at".to_string()),
        Just("payload".to_string()),
        "[a-z_]{1,8}",
    ];
    leaf.prop_recursive(6, 64, 8, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
            prop::collection::vec((key.clone(), inner), 0..8)
                .prop_map(|kv| serde_json::Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// A string field's value: mostly plausible (lengths around the limits, any
/// characters), sometimes nasty, sometimes another JSON type, sometimes absent.
fn text_field(name: &'static str, limit: usize) -> impl Strategy<Value = Option<String>> {
    let plausible = prop_oneof![
        (1..=limit + 2).prop_map(|n| "a".repeat(n)),
        (1..=limit / 2 + 1).prop_map(|n| "é".repeat(n)),
        "[\\PC]{1,12}",
        "[{}:\\n\\u{0}a-z]{1,12}",
    ];
    prop_oneof![
        6 => plausible.prop_map(move |v: String| Some(format!("{:?}:{}", name, serde_json::to_string(&v).unwrap()))),
        2 => nasty_string().prop_map(move |v| Some(format!("{:?}:{}", name, serde_json::to_string(&v).unwrap()))),
        1 => json_value().prop_map(move |v| Some(format!("{name:?}:{v}"))),
        1 => Just(None),
    ]
}

/// A job with each field present or not, of the right type or not.
fn job_like() -> impl Strategy<Value = String> {
    let zone = prop_oneof![
        4 => prop::sample::select(chrono_tz::TZ_VARIANTS.to_vec())
            .prop_map(|tz| Some(format!(r#""timezone":"{}""#, tz.name()))),
        1 => text_field("timezone", 40),
        4 => Just(None),
    ];
    let instant = prop_oneof![
        4 => (-62_135_596_800i64..253_402_300_799, -86_399i32..86_399).prop_map(|(secs, off)| {
            let t = Utc.timestamp_opt(secs, 0).unwrap();
            let o = chrono::FixedOffset::east_opt(off).unwrap();
            Some(format!(r#""expires_at":"{}""#, t.with_timezone(&o).to_rfc3339()))
        }),
        1 => text_field("expires_at", 40),
        4 => Just(None),
    ];
    (
        text_field("id", MAX_ID_CHARS),
        text_field("recipient", MAX_RECIPIENT_CHARS),
        prop_oneof![3 => Just(Some(r#""channel":"sms""#.to_string())), 1 => text_field("channel", 64)],
        prop_oneof![3 => Just(None), 1 => text_field("category", 64)],
        zone,
        instant,
        prop::option::of(json_value().prop_map(|v| format!(r#""payload":{v}"#))),
        prop::option::of(json_value().prop_map(|v| format!(r#""unknown_field":{v}"#))),
    )
        .prop_map(|(a, b, c, d, e, f, g, h)| {
            let parts: Vec<String> = [a, b, c, d, e, f, g, h].into_iter().flatten().collect();
            format!("{{{}}}", parts.join(","))
        })
}

const VALID: &str = r#"{"id":"job-1","recipient":"+15550001","channel":"sms","category":"promo","timezone":"Europe/Paris","expires_at":"2030-01-01T00:00:00Z","payload":{"text":"hi","n":[1,2,3]}}"#;

#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, Vec<u8>),
    Delete(usize, usize),
    Truncate(usize),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let special = prop_oneof![
        Just(b"\\".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"\\u0000".to_vec()),
        Just(b"\\ud800".to_vec()),
        Just(vec![0xff]),
        Just(vec![0xc3]),
        Just(vec![0xed, 0xa0, 0x80]),
        Just(b"{".to_vec()),
        Just(b"[".to_vec()),
        Just(b",".to_vec()),
        Just(b":".to_vec()),
        Just(b"1e999".to_vec()),
        prop::collection::vec(any::<u8>(), 1..8),
    ];
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<usize>(), special).prop_map(|(i, s)| Mutation::Insert(i, s)),
        (any::<usize>(), 1usize..10).prop_map(|(i, n)| Mutation::Delete(i, n)),
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 1usize..40).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
    ]
}

fn mutate(mut body: Vec<u8>, ms: &[Mutation]) -> Vec<u8> {
    for m in ms {
        let len = body.len().max(1);
        match m {
            Mutation::Flip(i, b) => {
                if !body.is_empty() {
                    let i = i % body.len();
                    body[i] ^= b | 1;
                }
            }
            Mutation::Insert(i, s) => {
                let i = i % (body.len() + 1);
                body.splice(i..i, s.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let i = i % len;
                let end = (i + n).min(body.len());
                if i < end {
                    body.drain(i..end);
                }
            }
            Mutation::Truncate(i) => body.truncate(i % len),
            Mutation::Duplicate(i, n) => {
                let i = i % len;
                let end = (i + n).min(body.len());
                if i < end {
                    let piece: Vec<u8> = body[i..end].to_vec();
                    body.splice(i..i, piece);
                }
            }
        }
    }
    body
}

/// An AMQP header value of any type, nested a little.
fn amqp_value() -> impl Strategy<Value = AMQPValue> {
    let leaf = prop_oneof![
        any::<bool>().prop_map(AMQPValue::Boolean),
        any::<i8>().prop_map(AMQPValue::ShortShortInt),
        any::<u8>().prop_map(AMQPValue::ShortShortUInt),
        any::<i16>().prop_map(AMQPValue::ShortInt),
        any::<u16>().prop_map(AMQPValue::ShortUInt),
        any::<i32>().prop_map(AMQPValue::LongInt),
        any::<u32>().prop_map(AMQPValue::LongUInt),
        any::<i64>().prop_map(AMQPValue::LongLongInt),
        prop_oneof![Just(i64::MAX), Just(i64::MIN), Just(-1i64), Just(0)]
            .prop_map(AMQPValue::LongLongInt),
        any::<f32>().prop_map(AMQPValue::Float),
        any::<f64>().prop_map(AMQPValue::Double),
        (any::<u8>(), any::<u32>())
            .prop_map(|(scale, value)| AMQPValue::DecimalValue(DecimalValue { scale, value })),
        "[\\PC]{0,20}".prop_map(|s| AMQPValue::ShortString(ShortString::from(s))),
        nasty_string().prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        prop_oneof![
            Just("9223372036854775807"),
            Just("-5"),
            Just("99999999999999999999"),
            Just("12")
        ]
        .prop_map(|s| AMQPValue::LongString(LongString::from(s))),
        prop::collection::vec(any::<u8>(), 0..16)
            .prop_map(|b| AMQPValue::LongString(LongString::from(b))),
        any::<u64>().prop_map(AMQPValue::Timestamp),
        prop::collection::vec(any::<u8>(), 0..16)
            .prop_map(|b| AMQPValue::ByteArray(ByteArray::from(b))),
        Just(AMQPValue::Void),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4)
                .prop_map(|v| AMQPValue::FieldArray(FieldArray::from(v))),
            prop::collection::vec((header_key(), inner), 0..4)
                .prop_map(|kv| AMQPValue::FieldTable(table(kv))),
        ]
    })
}

fn header_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("x-death".to_string()),
        Just("x-first-death-queue".to_string()),
        Just("x-first-death-reason".to_string()),
        Just("x-last-death-exchange".to_string()),
        Just(ATTEMPT.to_string()),
        Just(FIRST_SEEN.to_string()),
        Just(NOT_BEFORE.to_string()),
        Just(REASON.to_string()),
        Just(DETAIL.to_string()),
        (0u32..24).prop_map(|n| format!("{}{n}", BIT_PREFIX)),
        "[a-zA-Z0-9_-]{1,16}",
        "[\\PC]{0,10}",
    ]
}

fn table(kv: Vec<(String, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in kv {
        t.insert(ShortString::from(k), v);
    }
    t
}

fn headers() -> impl Strategy<Value = Option<FieldTable>> {
    prop::option::weighted(
        0.95,
        prop::collection::vec((header_key(), amqp_value()), 0..10).prop_map(table),
    )
}

/// Headers that must never travel on: the broker's `x-death` family and the delay
/// ladder's routing bits.
fn is_internal(k: &str) -> bool {
    k == "x-death"
        || k.starts_with("x-first-death")
        || k.starts_with("x-last-death")
        || k.starts_with(BIT_PREFIX)
}

// ---------------------------------------------------------------------------------
// Properties

static BYTES: Tally = Tally::new();
static JSONISH: Tally = Tally::new();
static MUTATED: Tally = Tally::new();
static FIELDS: Tally = Tally::new();
static HEADERS: Tally = Tally::new();

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        check(&BYTES, &body)?;
        // the same bytes wrapped as a JSON string and as an object
        let text = String::from_utf8_lossy(&body);
        check(&BYTES, serde_json::to_string(&text).unwrap().as_bytes())?;
        check(&BYTES, format!("{{{text}}}").as_bytes())?;
    }

    #[test]
    fn random_json_structures(v in json_value()) {
        check(&JSONISH, v.to_string().as_bytes())?;
        check(&JSONISH, serde_json::to_string_pretty(&v).unwrap().as_bytes())?;
    }

    #[test]
    fn mutated_valid_jobs(ms in prop::collection::vec(mutation(), 1..6)) {
        check(&MUTATED, &mutate(VALID.as_bytes().to_vec(), &ms))?;
    }

    #[test]
    fn job_shaped_bodies_with_nasty_fields(body in job_like()) {
        check(&FIELDS, body.as_bytes())?;
    }

    #[test]
    fn header_handling(
        h in headers(),
        now_ms in 0i64..253_402_300_799_000,
        not_before in prop::option::of(0i64..253_402_300_799_000),
        reason in prop_oneof![Just("malformed"), Just("expired"), Just("capped"), Just("unknown_channel")],
        detail in nasty_string(),
    ) {
        HEADERS.inputs.fetch_add(1, Ordering::Relaxed);
        let now = Utc.timestamp_millis_opt(now_ms).unwrap();
        let nb = not_before.map(|t| Utc.timestamp_millis_opt(t).unwrap());
        let (attempt, first) = headers::attempt_info(h.as_ref());
        let next = headers::next_headers(h.as_ref(), now, nb);
        // the broker's x-death family and stale ladder bits never travel on
        prop_assert!(next.inner().keys().all(|k| !is_internal(k.as_str())));
        // the attempt count goes up by one (and does not overflow)
        let (attempt2, first2) = headers::attempt_info(Some(&next));
        prop_assert_eq!(attempt2, (attempt as i64).saturating_add(1).max(0) as u64);
        prop_assert_eq!(first2, Some(first.unwrap_or(now_ms)));
        prop_assert_eq!(
            next.inner().get(NOT_BEFORE).and_then(headers::as_i64),
            not_before
        );
        // every other header is kept as it was
        if let Some(h) = &h {
            for (k, v) in h.inner() {
                let k = k.as_str();
                if !is_internal(k) && k != ATTEMPT && k != FIRST_SEEN && k != NOT_BEFORE {
                    prop_assert_eq!(next.inner().get(k), Some(v));
                }
            }
        }
        let dead = headers::dead_headers(h.as_ref(), reason, &detail);
        prop_assert!(dead.inner().keys().all(|k| !is_internal(k.as_str())));
        prop_assert_eq!(dead.inner().get(REASON).and_then(headers::as_string), Some(reason.to_string()));
        prop_assert_eq!(dead.inner().get(DETAIL).and_then(headers::as_string), Some(detail.clone()));
        HEADERS.jobs.fetch_add(1, Ordering::Relaxed);
    }
}

/// Record the tallies once every property of this module has run (the harness runs
/// tests in parallel; this one waits for the others' counters to stop moving). Under
/// cargo-nextest every test is a process of its own, so no other test's counters are
/// in this one: it records nothing there (`cargo test --test suite fuzz::` records).
#[test]
fn zz_record_fuzz_figures() {
    if std::env::var_os("NEXTEST").is_some() {
        eprintln!("a process of its own under nextest: no tallies to record");
        return;
    }
    let total = || {
        [&BYTES, &JSONISH, &MUTATED, &FIELDS, &HEADERS]
            .iter()
            .map(|t| t.inputs.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let mut last = u64::MAX;
    let mut still = 0;
    for _ in 0..1200 {
        std::thread::sleep(Duration::from_millis(250));
        let now = total();
        if now == last && now > 0 {
            still += 1;
            if still >= 8 {
                break;
            }
        } else {
            still = 0;
        }
        last = now;
    }
    for (tally, name) in [
        (&BYTES, "random_bytes"),
        (&JSONISH, "random_json_structures"),
        (&MUTATED, "mutated_valid_jobs"),
        (&FIELDS, "job_shaped_bodies_with_nasty_fields"),
        (&HEADERS, "header_handling"),
    ] {
        if tally.inputs.load(Ordering::Relaxed) > 0 {
            tally.record(name);
        }
    }
}

/// Attempt headers at the edges of i64: the count saturates instead of overflowing
/// (an overflow panicked the job's task in debug builds, leaving its delivery
/// unacknowledged for the rest of the connection).
#[test]
fn attempt_counts_at_the_edge_of_i64_do_not_overflow() {
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    for v in [
        AMQPValue::LongLongInt(i64::MAX),
        AMQPValue::Timestamp(u64::MAX),
        AMQPValue::LongString(LongString::from("9223372036854775807")),
        AMQPValue::LongLongInt(i64::MIN),
    ] {
        let mut h = FieldTable::default();
        h.insert(ATTEMPT.into(), v.clone());
        let next = headers::next_headers(Some(&h), now, None);
        let (attempt, _) = headers::attempt_info(Some(&next));
        assert!(attempt >= 1, "{v:?} -> {attempt}");
    }
}

// ---------------------------------------------------------------------------------
// Hand-written cases, end to end through the running worker

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_written_bad_inputs_are_each_dispatched_or_dead_lettered_once() {
    let ns = unique("badinput");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let deep = 10_000;
    let long_id = "i".repeat(10_000);
    let cases: Vec<(&str, Vec<u8>, &str, FieldTable)> = vec![
        ("invalid-utf8", b"{\"id\":\"a\xff\xfe\",\"recipient\":\"r\",\"channel\":\"sms\"}".to_vec(), "malformed", FieldTable::default()),
        ("empty", Vec::new(), "malformed", FieldTable::default()),
        ("null", b"null".to_vec(), "malformed", FieldTable::default()),
        ("nesting-10000-body", format!("{}{}", "[".repeat(deep), "]".repeat(deep)).into_bytes(), "malformed", FieldTable::default()),
        ("nesting-10000-id", format!(r#"{{"id":{}{},"recipient":"r","channel":"sms"}}"#, "{\"a\":".repeat(deep), "}".repeat(deep)).into_bytes(), "malformed", FieldTable::default()),
        ("nesting-10000-payload", format!(r#"{{"id":"{ns}-deep","recipient":"deep","channel":"sms","payload":{}{}}}"#, "[".repeat(deep), "]".repeat(deep)).into_bytes(), "dispatched", FieldTable::default()),
        ("body-10MiB", {
            let mut b = format!(r#"{{"id":"{ns}-big","recipient":"big","channel":"sms","payload":""#).into_bytes();
            b.resize(10 << 20, b'x');
            b.extend_from_slice(b"\"}");
            b
        }, "malformed", FieldTable::default()),
        ("id-10000-chars", format!(r#"{{"id":"{long_id}","recipient":"r","channel":"sms"}}"#).into_bytes(), "malformed", FieldTable::default()),
        ("id-multibyte-over-255-bytes", format!(r#"{{"id":"{}","recipient":"r","channel":"sms"}}"#, "é".repeat(128)).into_bytes(), "malformed", FieldTable::default()),
        ("recipient-specials", format!(r#"{{"id":"{ns}-specials","recipient":"{{x}}:{{}}::\n\r\u0000\u0000}}{{","channel":"sms"}}"#).into_bytes(), "dispatched", FieldTable::default()),
        ("zone-path", br#"{"id":"z","recipient":"r","channel":"sms","timezone":"../../etc/passwd"}"#.to_vec(), "malformed", FieldTable::default()),
        ("expires-9999", format!(r#"{{"id":"{ns}-9999","recipient":"far","channel":"sms","expires_at":"9999-12-31T23:59:59Z"}}"#).into_bytes(), "dispatched", FieldTable::default()),
        ("expires-1970", format!(r#"{{"id":"{ns}-1970","recipient":"old","channel":"sms","expires_at":"1970-01-01T00:00:00Z"}}"#).into_bytes(), "expired", FieldTable::default()),
        ("duplicate-keys", br#"{"id":"a","id":"b","recipient":"r","channel":"sms"}"#.to_vec(), "malformed", FieldTable::default()),
        ("unknown-channel", format!(r#"{{"id":"{ns}-pigeon","recipient":"r","channel":"pigeon"}}"#).into_bytes(), "unknown_channel", FieldTable::default()),
        ("attempt-i64-max", format!(r#"{{"id":"{ns}-attempt","recipient":"att","channel":"sms"}}"#).into_bytes(), "dispatched", {
            let mut h = FieldTable::default();
            h.insert(ATTEMPT.into(), AMQPValue::LongLongInt(i64::MAX));
            h.insert(FIRST_SEEN.into(), AMQPValue::FieldTable(FieldTable::default()));
            h
        }),
    ];
    let w = worker(&s).await;
    let (stop, handle) = spawn_worker(w.clone()).await;
    let conn = amqp().await;
    let mut published = Vec::new();
    for (name, body, _, h) in &cases {
        let id = format!("{ns}-case-{name}");
        publish_with(
            &conn,
            &s,
            body,
            BasicProperties::default()
                .with_content_type("application/json".into())
                .with_message_id(id.as_str().into())
                .with_headers(h.clone()),
        )
        .await;
        published.push(id);
    }
    let dispatch = topology(&s).dispatch_queue("sms");
    let want_dispatched = cases.iter().filter(|c| c.2 == "dispatched").count() as u32;
    let want_dead = cases.len() as u32 - want_dispatched;
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(60) {
        let d = audit::depth(&conn, &dispatch).await.unwrap_or(0);
        let x = audit::depth(&conn, &s.amqp.dead_queue).await.unwrap_or(0);
        let j = audit::depth(&conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        if d >= want_dispatched && x >= want_dead && j == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.cancel();
    handle.await.unwrap();
    assert!(
        w.health.redis.load(Ordering::Relaxed),
        "the worker is healthy"
    );

    // dispatched messages carry the job id as message_id; dead letters carry the job
    // id when one could be read, else the message_id the producer gave
    let mut by_body: HashMap<Vec<u8>, (String, &str)> = HashMap::new();
    for ((_, body, outcome, _), id) in cases.iter().zip(&published) {
        by_body.insert(body.clone(), (id.clone(), outcome));
    }
    let dispatched = audit::drain(&conn, &dispatch).await;
    let dead = audit::drain(&conn, &s.amqp.dead_queue).await;
    let left = Audit::collect(&conn, &s, &[]).await;
    let mut seen: HashMap<String, Vec<String>> = HashMap::new();
    for m in &dispatched {
        let (id, _) = by_body
            .get(&m.body)
            .expect("a dispatched body is one of the cases, byte for byte");
        seen.entry(id.clone())
            .or_default()
            .push("dispatched".into());
    }
    for m in &dead {
        let (id, _) = by_body
            .get(&m.body)
            .expect("a dead letter keeps the body untouched");
        assert!(
            !header(&m.props, "x-notify-detail")
                .unwrap_or_default()
                .is_empty(),
            "{id}: a dead letter says why"
        );
        seen.entry(id.clone())
            .or_default()
            .push(m.reason.clone().unwrap_or_default());
    }
    let mut rows = Vec::new();
    for ((name, _, outcome, _), id) in cases.iter().zip(&published) {
        let got = seen.get(id).cloned().unwrap_or_default();
        rows.push(json!({"case": name, "expected": outcome, "got": got}));
        assert_eq!(got, vec![outcome.to_string()], "case {name}");
    }
    assert!(
        left.waiting.is_empty(),
        "nothing left waiting: {:?}",
        left.waiting
    );
    record(json!({
        "scenario": "bad_input_end_to_end",
        "test": "tests/suite/fuzz.rs: hand_written_bad_inputs_are_each_dispatched_or_dead_lettered_once",
        "jobs": cases.len(),
        "lost": 0,
        "duplicates": 0,
        "violations": 0,
        "cases": rows,
    }));
}

// ---------------------------------------------------------------------------------
// "Negative or huge cost": the job has no cost; a channel's cost is configuration.

fn load(vars: &[(&str, &str)]) -> Result<Settings, String> {
    let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    Settings::load_from_vars(None, vars).map_err(|e| e.to_string())
}

#[test]
fn negative_and_huge_costs_are_refused_by_the_configuration() {
    let base = [
        ("QUOTA_WORKER__CHANNELS__SMS__RATE", "10"),
        ("QUOTA_WORKER__CHANNELS__SMS__BURST", "5"),
    ];
    for (cost, says) in [
        ("-1", "cost"),
        ("6", "channels.sms.cost"),
        ("18446744073709551615", "channels.sms.cost"),
        ("99999999999999999999999", "cost"),
    ] {
        let mut vars = base.to_vec();
        vars.push(("QUOTA_WORKER__CHANNELS__SMS__COST", cost));
        let err = load(&vars).expect_err(cost);
        assert!(err.contains(says), "cost {cost}: {err}");
    }
    // a burst whose bucket Redis's Lua numbers (doubles) cannot hold exactly
    let err = load(&[
        ("QUOTA_WORKER__CHANNELS__SMS__RATE", "1"),
        ("QUOTA_WORKER__CHANNELS__SMS__PERIOD", "24h"),
        ("QUOTA_WORKER__CHANNELS__SMS__BURST", "1000000"),
        ("QUOTA_WORKER__CHANNELS__SMS__COST", "1000000"),
    ])
    .expect_err("a bucket of 2,700 years");
    assert!(err.contains("channels.sms.burst"), "{err}");
    // the largest sensible ones load
    load(&[
        ("QUOTA_WORKER__CHANNELS__SMS__RATE", "1"),
        ("QUOTA_WORKER__CHANNELS__SMS__PERIOD", "24h"),
        ("QUOTA_WORKER__CHANNELS__SMS__BURST", "3650"),
        ("QUOTA_WORKER__CHANNELS__SMS__COST", "3650"),
    ])
    .unwrap();
}

/// The GCRA script itself, below the configuration: a cost above the burst is
/// "never" and writes nothing; a negative cost (which no configuration can give)
/// writes nothing either, so it can never credit the bucket.
#[tokio::test]
async fn the_gcra_script_with_negative_or_huge_costs() {
    let ns = unique("cost");
    let _g = RedisGuard(ns.clone());
    let s = settings(&ns);
    let e = quota_worker::store::QuotaStore::connect(&s).await.unwrap();
    let rate = quota_worker::quota::policy::Rate {
        interval_us: 10_000_000,
        burst: 3,
        cost: 1,
    };
    assert_eq!(e.call_rate("sms", rate, 1).await.unwrap().allowed, 1);
    let key = e.keys().rate("sms");
    let mut c = redis_sync();
    let tat: String = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
    for huge in [4, u32::MAX as u64, 1 << 53, u64::MAX] {
        assert_eq!(
            e.call_rate("sms", rate, huge).await.unwrap().allowed,
            -1,
            "{huge}"
        );
    }
    let script = redis::Script::new(quota_worker::redis::scripts::RATE_LUA);
    for negative in [-1i64, -1_000_000, i64::MIN] {
        let reply: Vec<i64> = script
            .key(&key)
            .arg(10_000_000)
            .arg(3)
            .arg(negative)
            .invoke(&mut c)
            .unwrap();
        assert!(reply[0] == 1 || reply[0] == 0, "{negative}: {reply:?}");
    }
    let after: String = redis::cmd("GET").arg(&key).query(&mut c).unwrap();
    assert_eq!(tat, after, "the bucket is untouched");
}

/// A dispatch queue name is the prefix plus the channel: a prefix that would make
/// it longer than AMQP's 255 bytes is refused at start (lapin panics on such names).
#[test]
fn a_dispatch_prefix_too_long_for_amqp_is_refused() {
    let long = "p".repeat(192);
    let err = load(&[("QUOTA_WORKER__AMQP__DISPATCH_QUEUE_PREFIX", long.as_str())]).unwrap_err();
    assert!(err.contains("amqp.dispatch_queue_prefix"), "{err}");
    load(&[("QUOTA_WORKER__AMQP__DISPATCH_QUEUE_PREFIX", &long[..191])]).unwrap();
}
