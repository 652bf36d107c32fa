//! The recipients' preferences API seen from outside (issue #38), against the
//! machine's Redis: the OpenAPI document (`/v1/openapi.json`) checked against the
//! routes, and the producer crate's client (the Python example is run by
//! `examples`).

use std::sync::Arc;
use std::time::Duration;

use crate::preference_tools::connected;
use quota_worker::config::Settings;
use quota_worker::health::Health;
use quota_worker::http::openapi::{ERASE_PATH, OPENAPI_PATH, PREFERENCES_PATH};
use quota_worker::http::{App, Guard};
use quota_worker::preferences::edit as stored;
use quota_worker::reload::Reloader;
use quota_worker::status::Status;
use quota_worker::store::QuotaStore;
use quota_worker_producer::preferences::{ClientError, PreferencesClient};
use serde_json::{json, Value};
use testkit::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

/// The worker's HTTP app on a loopback port, over `store`, the API behind `guard`.
pub(crate) async fn serve(
    s: &Settings,
    store: &Arc<QuotaStore>,
    guard: Guard,
) -> (String, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let status = Arc::new(Status::default());
    status.attach(Arc::new(Reloader::new(None, s.clone(), store.clone())));
    let app = App {
        metrics: None,
        health: Arc::new(Health::default()),
        status,
        guard: Guard::Open,
        api_guard: guard,
    };
    let stop = CancellationToken::new();
    tokio::spawn(quota_worker::http::serve(
        listener,
        quota_worker::http::app(app),
        stop.clone(),
    ));
    (addr, stop)
}

/// `method path` with `body` and an optional bearer token: status and body.
pub(crate) async fn call(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let _ = stream.write_all(body.as_bytes()).await;
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    (status, body.to_string())
}

/// `text` is a valid OpenAPI 3.1 document, as Python's `openapi-spec-validator`
/// judges it (the OpenAPI Initiative's schema and more); skipped, saying so, where
/// it is not installed.
fn valid_openapi(text: &str) {
    let check = "import sys, json\nfrom openapi_spec_validator import validate\nvalidate(json.load(sys.stdin))\n";
    let probe = std::process::Command::new("python3")
        .args(["-c", "import openapi_spec_validator"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("SKIPPED the OpenAPI validation: python3 cannot import openapi_spec_validator (`python3 -m pip install openapi-spec-validator`)");
        return;
    }
    let mut child = std::process::Command::new("python3")
        .args(["-c", check])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "not a valid OpenAPI document:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_openapi_document_matches_the_routes() {
    let s = settings(&unique("prefs-openapi"));
    let _c = Cleanup::new(&s);
    let store = connected(&s).await;
    let token = "api-s3cret";
    let (addr, stop) = serve(&s, &store, Guard::token(&token.into())).await;
    // public: no token
    let (code, text) = call(&addr, "GET", OPENAPI_PATH, "", None).await;
    assert_eq!(code, 200, "{text}");
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    valid_openapi(&text);
    let paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    assert_eq!(paths, [OPENAPI_PATH, ERASE_PATH, PREFERENCES_PATH]);
    let mut schema: Value =
        serde_json::from_str(include_str!("../../schema/preferences.schema.json")).unwrap();
    schema.as_object_mut().unwrap().remove("$schema");
    schema.as_object_mut().unwrap().remove("$id");
    assert_eq!(doc["components"]["schemas"]["Preferences"], schema);

    let item = &doc["paths"][PREFERENCES_PATH];
    let documented = |method: &str| -> Vec<u16> {
        item[method]["responses"]
            .as_object()
            .unwrap_or_else(|| panic!("{method} is documented"))
            .keys()
            .map(|k| k.parse().unwrap())
            .collect()
    };
    let methods = ["get", "put", "patch", "delete"];
    for m in item
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| *k != "parameters")
    {
        assert!(methods.contains(&m.as_str()), "{m} is not routed");
    }
    let p = |r: &str| format!("/v1/recipients/{r}/preferences");
    let good = json!({"channels": {"sms": false}}).to_string();
    let bad = json!({"channels": {"fax": false}}).to_string();
    let big = json!({"pad": "a".repeat(70 * 1024)}).to_string();
    let no_windows = json!({"quiet_hours": {"allow": []}}).to_string();
    // (method, path, body, token, status)
    let t = Some(token);
    let cases: Vec<(&str, String, &str, Option<&str>, u16)> = vec![
        ("GET", p("ro"), "", t, 404),
        ("PUT", p("ro"), &good, t, 200),
        ("PUT", p("ro"), &bad, t, 400),
        ("PUT", p("ro"), &big, t, 413),
        ("PATCH", p("ro"), &good, t, 200),
        ("PATCH", p("ro"), &bad, t, 400),
        ("PATCH", p("ro"), &big, t, 413),
        ("PATCH", p("r-none"), &no_windows, t, 409),
        ("GET", p("ro"), "", t, 200),
        ("DELETE", p("ro"), "", t, 204),
        ("GET", p("ro"), "", None, 401),
        ("PUT", p("ro"), &good, Some("wrong"), 401),
        ("PATCH", p("ro"), &good, None, 401),
        ("DELETE", p("ro"), "", None, 401),
    ];
    let mut seen: std::collections::BTreeMap<String, Vec<u16>> = Default::default();
    for (method, path, body, token, want) in &cases {
        let (code, text) = call(&addr, method, path, body, *token).await;
        assert_eq!(code, *want, "{method} {path}: {text}");
        let m = method.to_lowercase();
        assert!(
            documented(&m).contains(&code),
            "{method} answers {code}, undocumented"
        );
        seen.entry(m).or_default().push(code);
    }
    // the erasure: its answers documented, the 200's body as its schema says
    let erase = &doc["paths"][ERASE_PATH];
    let erase_codes: Vec<u16> = erase["delete"]["responses"]
        .as_object()
        .expect("DELETE of a recipient is documented")
        .keys()
        .map(|k| k.parse().unwrap())
        .collect();
    assert_eq!(erase_codes, [200, 400, 401, 403, 503]);
    topology(&s).declare(&amqp().await).await.unwrap();
    let one = "/v1/recipients/ro";
    assert_eq!(call(&addr, "DELETE", one, "", None).await.0, 401);
    for odd in ["yes", "", "TRUE"] {
        let odd = format!("/v1/recipients/ro?keep_suppression={odd}&tenant=");
        assert_eq!(call(&addr, "DELETE", &odd, "", t).await.0, 400, "{odd}");
    }
    let (code, text) = call(&addr, "DELETE", one, "", t).await;
    assert_eq!(code, 200, "{text}");
    let erased: Value = serde_json::from_str(text.trim()).unwrap_or_else(|_| {
        // a chunked body: its one chunk
        serde_json::from_str(text.lines().nth(1).unwrap_or_default()).unwrap()
    });
    let schema = &doc["components"]["schemas"]["Erased"];
    let properties = schema["properties"].as_object().unwrap();
    for field in schema["required"].as_array().unwrap() {
        assert!(
            erased.get(field.as_str().unwrap()).is_some(),
            "{field}: {erased}"
        );
    }
    for field in erased.as_object().unwrap().keys() {
        assert!(properties.contains_key(field), "{field} undocumented");
    }
    stop.cancel();
    // 403: the API beyond loopback without a token
    let (addr, stop) = serve(&s, &store, Guard::Refused).await;
    assert_eq!(
        call(&addr, "DELETE", "/v1/recipients/ro", "", None).await.0,
        403
    );
    for m in methods {
        let (code, _) = call(&addr, &m.to_uppercase(), &p("ro"), &good, None).await;
        assert_eq!(code, 403);
        assert!(documented(m).contains(&code));
        seen.entry(m.into()).or_default().push(code);
    }
    // every documented status but 503 (Redis away) is seen
    for m in methods {
        for code in documented(m).into_iter().filter(|c| *c != 503) {
            assert!(
                seen[m].contains(&code),
                "{m} {code} documented, never answered"
            );
        }
    }
    // what is not documented is not routed
    assert_eq!(call(&addr, "POST", &p("ro"), &good, None).await.0, 405);
    assert_eq!(call(&addr, "PUT", OPENAPI_PATH, "", None).await.0, 405);
    stop.cancel();
}

#[tokio::test]
async fn the_producer_client_edits_a_set_with_its_token() {
    let s = settings(&unique("prefs-client"));
    let _c = Cleanup::new(&s);
    let store = connected(&s).await;
    let (addr, stop) = serve(&s, &store, Guard::token(&"api-s3cret".into())).await;
    let client =
        PreferencesClient::new(&format!("http://{addr}"), Some("api-s3cret".into())).unwrap();
    let r = "+86 138/0";
    assert_eq!(client.get(r, None).await.unwrap(), None);
    let set = client
        .put(r, None, &json!({"categories": {"marketing": false}}))
        .await
        .unwrap();
    assert_eq!(set["categories"], json!({"marketing": false}));
    let set = client
        .patch(
            r,
            None,
            &json!({"categories": {"marketing": null}, "channels": {"sms": false}}),
        )
        .await
        .unwrap();
    assert_eq!(set.get("categories"), None, "{set}");
    assert_eq!(client.get(r, None).await.unwrap(), Some(set.clone()));
    assert_eq!(stored::get(&store, None, r).await.unwrap(), Some(set));
    // a tenant's own
    client.put(r, Some("acme & co"), &json!({})).await.unwrap();
    assert!(stored::get(&store, Some("acme & co"), r)
        .await
        .unwrap()
        .is_some());
    match client
        .put(r, None, &json!({"channels": {"fax": false}}))
        .await
    {
        Err(ClientError::Refused {
            status: 400, field, ..
        }) => {
            assert_eq!(field.as_deref(), Some("channels.fax"))
        }
        other => panic!("{other:?}"),
    }
    let wrong = PreferencesClient::new(&format!("http://{addr}"), Some("nope".into())).unwrap();
    assert!(matches!(
        wrong.get(r, None).await,
        Err(ClientError::Refused { status: 401, .. })
    ));
    client.delete(r, None).await.unwrap();
    assert_eq!(client.get(r, None).await.unwrap(), None);
    stop.cancel();
}

/// The bodies `/v1/openapi.json` gives `PUT` and `PATCH` take exactly what the
/// worker's parser takes, on the cases Schemathesis found apart (an empty zone,
/// free-text days, a `null` in a merge patch) and their neighbours: a set the parser
/// refuses, `PreferencesSet` refuses, and a patch whose merge into no set the parser
/// refuses, `PreferencesPatch` refuses.
#[test]
fn the_openapi_bodies_take_exactly_what_the_parser_takes() {
    use quota_worker::preferences::set::{merge_patch, Preferences};
    let channels = ["sms".to_string(), "email".to_string()];
    let doc = quota_worker::http::openapi::document(Some(&channels));
    let schemas = &doc["components"]["schemas"];
    let validator = |name: &str| {
        jsonschema::options()
            .should_validate_formats(true)
            .build(&json!({ "$ref": format!("#/components/schemas/{name}"),
                            "components": { "schemas": schemas } }))
            .unwrap_or_else(|e| panic!("{name} is a valid JSON Schema: {e}"))
    };
    let (set, patch) = (validator("PreferencesSet"), validator("PreferencesPatch"));
    let known = |c: &str| channels.iter().any(|k| k == c);
    let window = |days: &str, from: &str, to: &str| json!({ "quiet_hours": { "windows": [ { "days": days, "from": from, "to": to } ] } });
    let zone = |tz: &str| {
        json!({ "quiet_hours": { "timezone": tz,
                "windows": [ { "days": "daily", "from": "22:00", "to": "07:00" } ] } })
    };
    let sets = [
        zone(""),
        zone("Europe/Berlin"),
        zone("europe/berlin"),
        zone("Mars/Base"),
        zone("Etc/GMT+5"),
        window("weekdays", "08:00", "09:00"),
        window("Mon-Fri", "08:00", "09:00"),
        window(" sat , SUN ", "08:00", "09:00"),
        window("fri-mon", "22:00", "24:00"),
        window("mon-tue-wed", "08:00", "09:00"),
        window("daily,mon", "08:00", "09:00"),
        window("", "08:00", "09:00"),
        window("daily", "08:00", "08:00"),
        window("daily", "00:00", "24:00"),
        json!({ "quiet_hours": {} }),
        json!({ "quiet_hours": { "windows": [] } }),
        json!({ "channels": { "fax": false } }),
        json!({ "channels": { "sms": false }, "categories": { "promo": { "email": false } } }),
        json!({ "categories": { "promo": { "fax": false } } }),
        json!({ "updated_at": 5 }),
        json!({ "quiet_hours": null }),
    ];
    for v in &sets {
        let parsed = Preferences::parse(v, &known);
        assert_eq!(
            set.is_valid(v),
            parsed.is_ok(),
            "PreferencesSet and the parser differ on {v}: {parsed:?}"
        );
    }
    // (patch, valid): a valid one the parser takes merged into no set, or it leaves
    // `quiet_hours.windows` to a stored set (409 where there is none)
    let patches = [
        (json!({ "quiet_hours": null }), true),
        (
            json!({ "quiet_hours": null, "channels": null, "categories": null, "updated_at": null }),
            true,
        ),
        (
            json!({ "categories": { "promo": null, "news": { "sms": null } } }),
            true,
        ),
        (
            json!({ "quiet_hours": { "timezone": null, "allow": null,
                "windows": [ { "days": "daily", "from": "22:00", "to": "07:00" } ] } }),
            true,
        ),
        (
            json!({ "quiet_hours": { "timezone": "Europe/Berlin" } }),
            true,
        ),
        (json!({ "quiet_hours": {} }), true),
        (json!({ "channels": { "fax": null, "a:b": null } }), true),
        (json!({ "categories": { "a:b": null } }), true),
        (json!({ "quiet_hours": { "windows": null } }), false),
        (json!({ "quiet_hours": { "windows": [ null ] } }), false),
        (json!({ "quiet_hours": { "timezone": "" } }), false),
        (json!({ "channels": { "fax": false } }), false),
        (json!({ "categories": { "a:b": false } }), false),
        (zone(""), false),
        (window("weekdays", "08:00", "09:00"), false),
        (window("daily", "08:00", "08:00"), false),
    ];
    for (p, valid) in &patches {
        assert_eq!(patch.is_valid(p), *valid, "PreferencesPatch on {p}");
        let mut merged = json!({});
        merge_patch(&mut merged, p);
        let parsed = Preferences::parse(&merged, &known);
        let leaves_windows =
            p["quiet_hours"].is_object() && p["quiet_hours"].get("windows").is_none();
        let agrees = match &parsed {
            Ok(_) => *valid,
            Err(bad) => !*valid || leaves_windows && bad.field == "quiet_hours.windows",
        };
        assert!(
            agrees,
            "PreferencesPatch and the parser (of {p} merged into no set) differ: {parsed:?}"
        );
    }
}

/// A merge patch that gives `quiet_hours` without `windows` keeps the stored set's
/// windows; where there are none to keep it answers 409 (it would apply to a set
/// that has them), stores nothing, and the document says so.
#[tokio::test]
async fn a_patch_that_leaves_windows_to_no_stored_set_answers_409() {
    let s = settings(&unique("prefs-409"));
    let _c = Cleanup::new(&s);
    let store = connected(&s).await;
    let (addr, stop) = serve(&s, &store, Guard::Open).await;
    let p = "/v1/recipients/r409/preferences";
    let zone = json!({ "quiet_hours": { "timezone": "Europe/Berlin" } }).to_string();
    let (code, text) = call(&addr, "PATCH", p, &zone, None).await;
    assert_eq!(code, 409, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["field"], "quiet_hours.windows", "{text}");
    assert_eq!(
        call(&addr, "GET", p, "", None).await.0,
        404,
        "nothing stored"
    );
    let set = json!({ "quiet_hours": { "windows": [ { "days": "daily", "from": "22:00", "to": "07:00" } ] } });
    assert_eq!(call(&addr, "PUT", p, &set.to_string(), None).await.0, 200);
    let (code, text) = call(&addr, "PATCH", p, &zone, None).await;
    assert_eq!(code, 200, "{text}");
    let merged: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(merged["quiet_hours"]["timezone"], "Europe/Berlin", "{text}");
    assert_eq!(
        merged["quiet_hours"]["windows"][0]["from"], "22:00",
        "{text}"
    );
    let (_, doc) = call(&addr, "GET", OPENAPI_PATH, "", None).await;
    let doc: Value = serde_json::from_str(&doc).unwrap();
    assert!(doc["paths"][PREFERENCES_PATH]["patch"]["responses"]["409"].is_object());
    stop.cancel();
}
