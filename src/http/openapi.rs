//! `GET /v1/openapi.json`: the OpenAPI 3.1 description of the recipients' API
//! (their preferences, and their erasure: [`ERASE_PATH`], `erase.rs`), built
//! here from [`OPERATIONS`] (each method of the preferences route in
//! `preferences.rs`, its statuses and whether it takes a body), [`ERASE`] and the set's JSON
//! Schema (`schema/preferences.schema.json`, the one checked against the parser),
//! embedded as `components.schemas.Preferences` (what `GET` answers). The bodies
//! `PUT` and `PATCH` take are that schema narrowed to exactly what this worker's
//! parser accepts (`PreferencesSet`: its configured channels, the zones of its tz
//! database, a window whose `from` and `to` differ) and, for `PATCH`, widened by
//! RFC 7386's `null` (`PreferencesPatch`); `tests/schemathesis.sh` checks the
//! server against them. Public: it describes the API and holds no data, so it
//! answers without `http.api_token` (a preference page's build can fetch it).
//! `suite::preferences::the_openapi_document_matches_the_routes` checks it against
//! the routes.

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use serde_json::{json, Map, Value};

use super::App;

mod body;

/// The path of the preferences API.
pub const PREFERENCES_PATH: &str = "/v1/recipients/{recipient}/preferences";
/// Where this document is served.
pub const OPENAPI_PATH: &str = "/v1/openapi.json";
/// The path of a recipient's erasure (`DELETE`, `erase.rs`).
pub const ERASE_PATH: &str = "/v1/recipients/{recipient}";

/// One method of the preferences route.
#[derive(Debug, Clone, Copy)]
pub struct Operation {
    /// The HTTP method, lower case.
    pub method: &'static str,
    /// Its operationId.
    pub id: &'static str,
    /// What it does.
    pub summary: &'static str,
    /// The request body's media type, if it takes one.
    pub body: Option<&'static str>,
    /// Its answers: status and what it means.
    pub responses: &'static [(u16, &'static str)],
}

const AUTH: [(u16, &str); 3] = [
    (
        401,
        "No or a wrong `Authorization: Bearer <http.api_token>`",
    ),
    (
        403,
        "`http.api_token` is not set and the listener is not loopback",
    ),
    (
        503,
        "The worker is not connected to Redis yet, or Redis did not answer",
    ),
];

/// Every method of [`PREFERENCES_PATH`], as `preferences.rs` routes it.
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "get",
        id: "getPreferences",
        summary: "The recipient's set, with `updated_at`",
        body: None,
        responses: &[
            (200, "The set"),
            (404, "The recipient has no set"),
            AUTH[0],
            AUTH[1],
            AUTH[2],
        ],
    },
    Operation {
        method: "put",
        id: "putPreferences",
        summary: "Replace the recipient's set (checked whole: nothing is stored if it is refused)",
        body: Some("application/json"),
        responses: &[
            (200, "The set stored, with `updated_at`"),
            (400, "Refused, nothing stored: `error` says why, `field` where"),
            (413, "The body is over 64 KiB"),
            AUTH[0],
            AUTH[1],
            AUTH[2],
        ],
    },
    Operation {
        method: "patch",
        id: "patchPreferences",
        summary: "Merge into the recipient's set (RFC 7386: `null` removes a key); the result is checked whole",
        body: Some("application/merge-patch+json"),
        responses: &[
            (200, "The set stored, with `updated_at`"),
            (400, "Refused, nothing stored: `error` says why, `field` where"),
            (409, "Nothing stored: the patch gives `quiet_hours` without `windows` and the stored set has none to keep"),
            (413, "The body is over 64 KiB"),
            AUTH[0],
            AUTH[1],
            AUTH[2],
        ],
    },
    Operation {
        method: "delete",
        id: "deletePreferences",
        summary: "Remove the recipient's set",
        body: None,
        responses: &[(204, "Removed (or there was none)"), AUTH[0], AUTH[1], AUTH[2]],
    },
];

/// The one method of [`ERASE_PATH`], as `erase.rs` routes it.
pub const ERASE: Operation = Operation {
    method: "delete",
    id: "eraseRecipient",
    summary: "Erase the recipient everywhere, in one pass: its recorded sends, preferences, suppressions (unless `keep_suppression`), notes, collapse keys and waiting set, its open digests' items unsent, its dead letters; every job of it waiting anywhere is dropped unsent. Idempotent: a second erase finds nothing and says so",
    body: None,
    responses: &[
        (200, "What was erased, by store, naming the recipient by its keyed hash only (`nothing`: a second erase)"),
        (400, "Refused, nothing erased: `keep_suppression` is neither `true` nor `false`"),
        AUTH[0],
        AUTH[1],
        (503, "Redis or the broker did not answer, or the erase did not complete: run it again (an erase is idempotent)"),
    ],
};

fn answer(status: u16, description: &str) -> (String, Value) {
    answer_with(status, description, "#/components/schemas/Preferences")
}

/// An answer whose 200 carries `ok` (a schema's reference).
fn answer_with(status: u16, description: &str, ok: &str) -> (String, Value) {
    let schema = match status {
        200 => Some(ok),
        204 => None,
        _ => Some("#/components/schemas/Error"),
    };
    let mut r = json!({ "description": description });
    if let Some(s) = schema {
        r["content"] = json!({ "application/json": { "schema": { "$ref": s } } });
    }
    (status.to_string(), r)
}

/// The set's schema as a component: the schema file without its own `$schema`
/// and `$id` (the document's dialect is JSON Schema 2020-12 already).
fn preferences_schema() -> Value {
    let mut schema: Value =
        serde_json::from_str(include_str!("../../schema/preferences.schema.json"))
            .expect("schema/preferences.schema.json is JSON");
    if let Some(m) = schema.as_object_mut() {
        m.remove("$schema");
        m.remove("$id");
    }
    schema
}

/// The OpenAPI 3.1 document of a worker whose configured channels are `channels`
/// (`None`: not known, before the worker has connected to Redis and read its rules;
/// the API answers 503 then).
pub fn document(channels: Option<&[String]>) -> Value {
    let set = body::set(preferences_schema(), channels);
    let patch = body::patch(set.clone());
    let mut item = Map::new();
    item.insert(
        "parameters".into(),
        json!([
            { "name": "recipient", "in": "path", "required": true,
              "description": "The recipient, as producers write it, percent-encoded",
              "schema": { "type": "string" } },
            { "name": "tenant", "in": "query", "required": false,
              "description": "Scope the set to this tenant, as a job's `tenant`",
              "schema": { "type": "string" } }
        ]),
    );
    for op in OPERATIONS {
        let mut o = json!({
            "operationId": op.id,
            "summary": op.summary,
            "responses": op.responses.iter().map(|(s, d)| answer(*s, d)).collect::<Map<_, _>>(),
        });
        if let Some(media) = op.body {
            let body = match op.method {
                "patch" => "#/components/schemas/PreferencesPatch",
                _ => "#/components/schemas/PreferencesSet",
            };
            o["requestBody"] = json!({
                "required": true,
                "content": { media: { "schema": { "$ref": body } } }
            });
        }
        item.insert(op.method.into(), o);
    }
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "quota-worker: the recipients' API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A recipient's own opt-outs (by category, channel or the pair) and quiet hours, checked in the worker's admission (docs/guide/preferences.md); a recipient's erasure on request (docs/guide/operating.md#erasing-a-recipient)."
        },
        "security": [ { "bearer": [] } ],
        "paths": {
            PREFERENCES_PATH: Value::Object(item),
            ERASE_PATH: erase_item(),
            OPENAPI_PATH: {
                "get": {
                    "operationId": "getOpenApi",
                    "summary": "This document (public: no token)",
                    "security": [],
                    "responses": { "200": { "description": "The OpenAPI document",
                        "content": { "application/json": { "schema": { "type": "object" } } } } }
                }
            }
        },
        "components": {
            "securitySchemes": {
                "bearer": { "type": "http", "scheme": "bearer",
                    "description": "`http.api_token` (or the file named by `QUOTA_WORKER__HTTP__API_TOKEN_FILE`), not the admin token" }
            },
            "schemas": {
                "Preferences": preferences_schema(),
                "PreferencesSet": set,
                "PreferencesPatch": patch,
                "Erased": erased_schema(),
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {
                        "error": { "type": "string", "description": "What is wrong" },
                        "field": { "type": "string", "description": "The field refused, e.g. `quiet_hours.windows[0].from` (\"\": the body as a whole)" }
                    }
                }
            }
        }
    });
    for (name, schema) in body::components() {
        doc["components"]["schemas"][name] = schema;
    }
    doc
}

/// [`ERASE_PATH`]'s item: its parameters and [`ERASE`].
fn erase_item() -> Value {
    let responses: Map<_, _> = ERASE
        .responses
        .iter()
        .map(|(s, d)| answer_with(*s, d, "#/components/schemas/Erased"))
        .collect();
    json!({
        "parameters": [
            { "name": "recipient", "in": "path", "required": true,
              "description": "The recipient, as producers write it, percent-encoded",
              "schema": { "type": "string" } },
            { "name": "tenant", "in": "query", "required": false,
              "description": "The recipient of this tenant, as a job's `tenant`",
              "schema": { "type": "string" } },
            { "name": "keep_suppression", "in": "query", "required": false,
              "description": "`true`: keep its suppressions, a tombstone named by its keyed hash only, so that a bounced or complained address stays suppressed",
              "schema": { "type": "boolean", "default": false } }
        ],
        ERASE.method: {
            "operationId": ERASE.id,
            "summary": ERASE.summary,
            "responses": responses,
        }
    })
}

/// What an erase answers (`crate::erase::Erased`).
fn erased_schema() -> Value {
    let count = json!({ "type": "integer", "minimum": 0 });
    json!({
        "type": "object",
        "required": ["recipient_tag", "tenant", "at", "keys", "waiting_jobs", "open_digests",
            "digest_items", "dead_letters", "dead_index_entries", "kept", "nothing", "interrupted"],
        "properties": {
            "recipient_tag": { "type": "string", "description": "The recipient's keyed hash (of its tenant): the only name the answer gives it" },
            "tenant": { "type": ["string", "null"] },
            "at": { "type": "string", "format": "date-time", "description": "When (Redis time)" },
            "keys": { "type": "object", "additionalProperties": count,
                "description": "Redis keys deleted, by store (`sends`, `preferences`, `suppressions`, `collapse_keys`, `waiting`, `feedback_marks`, `routes`, `digests`, `other`)" },
            "waiting_jobs": count, "open_digests": count, "digest_items": count,
            "dead_letters": count, "dead_index_entries": count,
            "kept": { "type": "array", "items": { "type": "string" }, "description": "Stores kept as asked (`suppressions`)" },
            "nothing": { "type": "boolean", "description": "Nothing was found to erase (a second erase)" },
            "interrupted": { "type": "boolean", "description": "Stopped during the dead-letter walk: run it again" }
        }
    })
}

/// The handler of [`OPENAPI_PATH`]: the document of the channels configured now.
pub(super) async fn serve(State(app): State<App>) -> impl IntoResponse {
    let channels: Option<Vec<String>> = app
        .status
        .reloader()
        .map(|r| r.rules().channels().map(|(name, _)| name.clone()).collect());
    (
        [(header::CONTENT_TYPE, "application/json")],
        document(channels.as_deref()).to_string(),
    )
}
