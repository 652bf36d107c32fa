//! The admin tools of the recipients' preferences (issue #38), against the machine's
//! Redis: `admin recipient R preferences set|clear` (the binary) and `admin
//! preferences export|import` (a round trip from one prefix into another, byte for
//! byte, a bad line reported and the rest imported).

use std::sync::Arc;

use crate::cli::{json, run_async, stderr, stdout};
use quota_worker::config::Settings;
use quota_worker::preferences::edit as stored;
use quota_worker::store::QuotaStore;
use serde_json::{json, Value};
use testkit::*;

/// A store of `s`'s own, connected.
pub(crate) async fn connected(s: &Settings) -> Arc<QuotaStore> {
    Arc::new(QuotaStore::connect(s).await.expect("redis"))
}

fn temp_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[tokio::test]
async fn the_cli_sets_and_clears_a_recipients_set_checked_as_the_api_checks_it() {
    let s = settings(&unique("prefs-cli"));
    let _c = Cleanup::new(&s);
    let store = connected(&s).await;
    let dir = temp_dir("prefs-cli");
    let set = json!({"categories": {"marketing": false}, "channels": {"sms": false}});
    let file = temp_file(&dir, "set.json", &set.to_string());
    let out = run_async(
        &s,
        &[
            "admin",
            "recipient",
            "r+1",
            "--tenant",
            "acme",
            "preferences",
            "set",
            &file,
            "--json",
        ],
        None,
    )
    .await;
    let shown = json(&out);
    assert_eq!(shown["categories"], set["categories"], "{shown}");
    assert!(shown["updated_at"].is_string(), "{shown}");
    let got = stored::get(&store, Some("acme"), "r+1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, shown);
    assert!(
        stored::get(&store, None, "r+1").await.unwrap().is_none(),
        "the tenant's own"
    );
    let mut r = redis_sync();
    let flag: i64 = redis::cmd("EXISTS")
        .arg(store.keys().preferences_flag())
        .query(&mut r)
        .unwrap();
    assert_eq!(flag, 1, "the admissions' check is on");

    // from stdin, without a tenant
    let quiet = json!({"quiet_hours": {"timezone": "Europe/Berlin",
        "windows": [{"days": "daily", "from": "22:00", "to": "07:00"}]}});
    let out = run_async(
        &s,
        &["admin", "recipient", "r2", "preferences", "set", "-"],
        Some(&quiet.to_string()),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("stored the preferences of `r2`"),
        "{}",
        stdout(&out)
    );
    let got = stored::get(&store, None, "r2").await.unwrap().unwrap();
    assert_eq!(got["quiet_hours"]["allow"], json!(["urgent"]), "{got}");

    // refused whole, naming the field, nothing stored
    let bad = json!({"channels": {"sms": false},
        "quiet_hours": {"windows": [{"days": "daily", "from": "25:00", "to": "07:00"}]}});
    let out = run_async(
        &s,
        &["admin", "recipient", "r3", "preferences", "set", "-"],
        Some(&bad.to_string()),
    )
    .await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("field `quiet_hours.windows[0].from`"),
        "{}",
        stderr(&out)
    );
    let out = run_async(
        &s,
        &["admin", "recipient", "r3", "preferences", "set", "-"],
        Some("{\"channels\": "),
    )
    .await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not JSON"), "{}", stderr(&out));
    assert!(stored::get(&store, None, "r3").await.unwrap().is_none());

    // clear
    let clear = [
        "admin",
        "recipient",
        "r+1",
        "--tenant",
        "acme",
        "preferences",
        "clear",
    ];
    let out = run_async(&s, &clear, None).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("removed the preferences"),
        "{}",
        stdout(&out)
    );
    assert!(stored::get(&store, Some("acme"), "r+1")
        .await
        .unwrap()
        .is_none());
    let out = run_async(&s, &clear, None).await;
    assert!(
        stdout(&out).contains("had no preferences"),
        "{}",
        stdout(&out)
    );
}

#[tokio::test]
async fn export_and_import_round_trip_between_prefixes_reporting_bad_lines() {
    let from = settings(&unique("prefs-export"));
    let into = settings(&unique("prefs-import"));
    let (_c1, _c2) = (Cleanup::new(&from), Cleanup::new(&into));
    let store = connected(&from).await;
    let sets = [
        (
            None,
            "+8613800000000",
            json!({"categories": {"marketing": false}}),
        ),
        (
            Some("acme"),
            "+8613800000000",
            json!({"channels": {"sms": false}}),
        ),
        (
            Some("acme"),
            "anna@example.com",
            json!({"categories": {"reminders": {"sms": false}},
                   "quiet_hours": {"timezone": "Europe/Berlin",
                       "windows": [{"days": "mon-fri", "from": "22:00", "to": "07:00"}],
                       "allow": ["urgent", "normal"]}}),
        ),
    ];
    for (tenant, r, set) in &sets {
        stored::put(&store, *tenant, r, set).await.unwrap();
    }
    let dir = temp_dir("prefs-export");
    let file = dir.join("prefs.jsonl");
    let file = file.to_str().unwrap();
    let out = run_async(&from, &["admin", "preferences", "export", file], None).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("exported 3 set(s)"),
        "{}",
        stderr(&out)
    );
    let exported = std::fs::read_to_string(file).unwrap();
    let lines: Vec<&str> = exported.lines().collect();
    assert_eq!(lines.len(), 3, "{exported}");
    for line in &lines {
        let v: Value = serde_json::from_str(line).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 4, "{line}");
        let (tenant, r) = (v["tenant"].as_str(), v["recipient"].as_str().unwrap());
        let (_, _, set) = sets
            .iter()
            .find(|(t, rr, _)| *t == tenant && *rr == r)
            .unwrap_or_else(|| panic!("{line}"));
        let got = stored::get(&store, tenant, r).await.unwrap().unwrap();
        assert_eq!(v["updated_at"], got["updated_at"], "{line}");
        for key in set.as_object().unwrap().keys() {
            assert_eq!(v["preferences"][key], got[key], "{line}");
        }
    }
    let out = run_async(&from, &["admin", "preferences", "export", "-"], None).await;
    assert_eq!(stdout(&out), exported, "stdout as the file");

    // into the other prefix, with a bad line in the middle and a blank one
    let bad = r#"{"recipient":"bob","preferences":{"channels":{"fax":false}}}"#;
    let input = format!("{}\n{bad}\n\n{}\n{}\n", lines[0], lines[1], lines[2]);
    let out = run_async(
        &into,
        &["admin", "preferences", "import", "-"],
        Some(&input),
    )
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("line 2: field `preferences.channels.fax`:"),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("imported 3 set(s); 1 bad line(s) skipped"),
        "{}",
        stdout(&out)
    );
    let out = run_async(&into, &["admin", "preferences", "export", "-"], None).await;
    assert_eq!(stdout(&out), exported, "byte for byte");
    let other = connected(&into).await;
    for (tenant, r, _) in &sets {
        assert_eq!(
            stored::get(&other, *tenant, r).await.unwrap(),
            stored::get(&store, *tenant, r).await.unwrap(),
        );
    }
    assert!(stored::get(&other, None, "bob").await.unwrap().is_none());

    // the report as JSON, from a file
    let again = temp_file(&dir, "again.jsonl", &input);
    let out = run_async(
        &into,
        &["admin", "preferences", "import", &again, "--json"],
        None,
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["stored"], 3);
    assert_eq!(report["bad"][0]["line"], 2);
    assert_eq!(report["bad"][0]["field"], "preferences.channels.fax");

    // many lines, stored many at once; of two for one recipient, the later stands
    // (the second line for m7 follows the first, in the same batch)
    let mut many: Vec<String> = (0..2000)
        .map(|i| {
            format!(r#"{{"recipient":"m{i}","preferences":{{"categories":{{"c{i}":false}}}}}}"#)
        })
        .collect();
    many.insert(
        8,
        r#"{"recipient":"m7","preferences":{"channels":{"email":false}}}"#.into(),
    );
    let many = many.join("\n");
    let started = std::time::Instant::now();
    let out = run_async(&into, &["admin", "preferences", "import", "-"], Some(&many)).await;
    assert!(out.status.success(), "{}", stderr(&out));
    eprintln!("imported 2001 lines in {:?}", started.elapsed());
    assert!(
        stdout(&out).contains("imported 2001 set(s); 0 bad"),
        "{}",
        stdout(&out)
    );
    let m7 = stored::get(&other, None, "m7").await.unwrap().unwrap();
    assert_eq!(m7["channels"], json!({"email": false}), "{m7}");
    assert_eq!(m7.get("categories"), None, "{m7}");
    let out = run_async(&into, &["admin", "preferences", "export", "-"], None).await;
    assert_eq!(stdout(&out).lines().count(), 3 + 2000);
}

/// An import keeps a set's `updated_at`, which may be the one of the set it replaces
/// (or older): the worker still takes the new set's quiet hours, not the ones it
/// computed for the old (the version stored moves on).
#[tokio::test]
async fn a_set_imported_with_the_same_updated_at_is_not_taken_for_the_old_one() {
    use chrono::Timelike;
    use quota_worker::job::Outcome;
    use quota_worker::preferences::set::Preferences;
    let s = settings(&unique("prefs-version"));
    let (_c, w, conn) = rig(&s).await;
    let hour = chrono::Utc::now().hour();
    let quiet = |from: u32| {
        json!({"quiet_hours": {"timezone": "UTC", "windows": [{"days": "daily",
            "from": format!("{:02}:00", from % 24), "to": format!("{:02}:00", (from + 2) % 24)}]}})
    };
    let known = |c: &str| ["sms", "email", "push"].contains(&c);
    let at = chrono::Utc::now().timestamp_millis() - 60_000;
    let now_quiet = Preferences::parse(&quiet(hour), &known).unwrap();
    stored::write(w.store(), None, "rv", &now_quiet, at)
        .await
        .unwrap();
    let job = |id: &str| format!(r#"{{"id":"{id}","recipient":"rv","channel":"sms"}}"#);
    publish(&conn, &s, job("v1").as_bytes()).await;
    assert!(matches!(step(&w, &conn, &s).await, Outcome::Delayed { .. }));
    // the same updated_at, quiet hours that are not now
    let later = Preferences::parse(&quiet(hour + 6), &known).unwrap();
    stored::write(w.store(), None, "rv", &later, at)
        .await
        .unwrap();
    publish(&conn, &s, job("v2").as_bytes()).await;
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    let got = stored::get(w.store(), None, "rv").await.unwrap().unwrap();
    assert_eq!(
        got["updated_at"],
        json!(quota_worker::quota::window::from_millis(at)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
    );
}

/// Redis memory per stored set (`MEMORY USAGE` of the recipient's hash): one opt-out,
/// and the issue's example (a category, a pair, a channel, quiet hours).
#[tokio::test]
async fn memory_per_stored_set() {
    let s = settings(&unique("prefs-mem"));
    let _c = Cleanup::new(&s);
    let store = connected(&s).await;
    let sets = [
        json!({"categories": {"marketing": false}}),
        json!({
            "categories": {"marketing": false, "reminders": {"sms": false}},
            "channels": {"sms": false},
            "quiet_hours": {"timezone": "Europe/Berlin",
                            "windows": [{"days": "daily", "from": "22:00", "to": "07:00"}],
                            "allow": ["urgent"]}
        }),
    ];
    let mut r = redis_sync();
    let mut sizes = Vec::new();
    for (i, set) in sets.iter().enumerate() {
        let recipient = format!("+4915100000{i:03}");
        stored::put(&store, None, &recipient, set).await.unwrap();
        let bytes: i64 = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(store.keys().preferences(&recipient))
            .query(&mut r)
            .unwrap();
        sizes.push(bytes);
    }
    println!(
        "MEMORY USAGE of a recipient's preferences: {} bytes with one opt-out, {} with \
         the example set (three opt-outs and quiet hours)",
        sizes[0], sizes[1]
    );
    assert!(sizes[0] > 0 && sizes[0] < sizes[1], "{sizes:?}");
    assert!(sizes[1] < 2048, "{sizes:?}");
}

/// Twenty `PATCH`es of one recipient at once, each turning off a category of its
/// own: every one applies (a PATCH writes only the set it read, else reads again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_patches_of_one_recipient_all_apply() {
    let s = settings(&unique("prefs-patch"));
    let _c = Cleanup::new(&s);
    let store = connected(&s).await;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let patch = json!({"categories": {format!("c{i}"): false}});
                stored::patch(&store, None, "r-race", &patch).await.unwrap();
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let set = stored::get(&store, None, "r-race").await.unwrap().unwrap();
    let categories = set["categories"].as_object().unwrap();
    assert_eq!(categories.len(), 20, "{set}");
}
