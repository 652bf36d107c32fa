//! Caps in layers and tenants, end to end through RabbitMQ and Redis: a total across
//! categories, a channel's cap across categories, a `count` policy, two tenants with
//! one phone number, a tenant's override, a reload adding a cap, bad configurations
//! named by key and line, and the exactness of one admission over every layer under
//! concurrency (also run on a Redis Cluster by `cluster`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use chrono_tz::Tz;
use quota_worker::admission::{Admission, Request};
use quota_worker::config::{CapSettings, MatchSettings, PolicySettings, RuleSettings, Settings};
use quota_worker::job::Outcome;
use quota_worker::quota::caps::CapsMode;
use quota_worker::quota::window::{self, Window};
use quota_worker::reload::Reloader;
use quota_worker::store::QuotaStore;
use quota_worker::worker::Worker;
use testkit::*;

fn rules(limit: u32, window: &str) -> Vec<RuleSettings> {
    vec![RuleSettings {
        limit,
        window: window.parse::<Window>().unwrap(),
    }]
}

fn cap(limit: u32, window: &str, matches: MatchSettings) -> CapSettings {
    CapSettings {
        rules: rules(limit, window),
        matches,
        ..CapSettings::default()
    }
}

fn channels(list: &[&str]) -> MatchSettings {
    MatchSettings {
        channels: Some(list.iter().map(|c| c.to_string()).collect()),
        ..MatchSettings::default()
    }
}

/// Test settings whose `default` policy has no rules of its own, and a `news`
/// policy without rules: only the caps hold anything.
fn layered(ns: &str) -> Settings {
    let mut s = settings(ns);
    s.policies.get_mut("default").unwrap().rules = vec![];
    s.policies.insert("news".into(), PolicySettings::default());
    s
}

fn job(id: &str, recipient: &str, channel: &str, extra: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"{recipient}","channel":"{channel}"{extra}}}"#)
        .into_bytes()
}

/// Publish each job and run it through the worker, in order: their outcomes.
async fn run(w: &Worker, conn: &lapin::Connection, s: &Settings, jobs: &[Vec<u8>]) -> Vec<Outcome> {
    let mut out = Vec::new();
    for body in jobs {
        publish(conn, s, body).await;
        out.push(step(w, conn, s).await);
    }
    out
}

fn delayed(o: &Outcome) -> bool {
    matches!(o, Outcome::Delayed { .. })
}

/// The `x-notify-held-by` of the one job waiting in the delay ladder.
async fn held_by(conn: &lapin::Connection, s: &Settings) -> String {
    let ladder = topology(s).ladder();
    for n in 0..ladder.levels {
        if let Some(m) = take(conn, &ladder.queue(n), Duration::ZERO).await {
            return header(&m.delivery.properties, "x-notify-held-by").unwrap_or_default();
        }
    }
    panic!("no job in the delay ladder")
}

#[tokio::test]
async fn a_total_counts_every_category_and_names_itself_when_it_holds() {
    let ns = unique("caps-total");
    let mut s = layered(&ns);
    s.caps
        .insert("daily_total".into(), cap(2, "1d", MatchSettings::default()));
    let (_c, w, conn) = rig(&s).await;
    let tz = r#","timezone":"Asia/Kolkata""#;
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("t1", "r", "sms", tz),
            job("t2", "r", "email", &format!(r#"{tz},"category":"news""#)),
            job("t3", "r", "push", &format!(r#"{tz},"category":"news""#)),
        ],
    )
    .await;
    assert_eq!(out[..2], [Outcome::Dispatched, Outcome::Dispatched]);
    let kolkata: Tz = "Asia/Kolkata".parse().unwrap();
    assert_eq!(
        out[2],
        Outcome::Delayed {
            until: window::next_day_start(kolkata, Utc::now())
        }
    );
    assert_eq!(held_by(&conn, &s).await, "cap daily_total: 2 per 1d");
    // another recipient is untouched
    let other = run(&w, &conn, &s, &[job("o1", "other", "sms", "")]).await;
    assert_eq!(other, [Outcome::Dispatched]);
}

#[tokio::test]
async fn an_sms_cap_holds_sms_of_every_category_and_leaves_email_alone() {
    let ns = unique("caps-sms");
    let mut s = layered(&ns);
    s.caps
        .insert("sms_weekly".into(), cap(2, "7d", channels(&["sms"])));
    let (_c, w, conn) = rig(&s).await;
    let news = r#","category":"news""#;
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("s1", "r", "sms", ""),
            job("s2", "r", "sms", news),
            job("e1", "r", "email", ""),
            job("e2", "r", "email", news),
            job("e3", "r", "email", ""),
            job("s3", "r", "sms", news),
        ],
    )
    .await;
    assert_eq!(out[..5], [const { Outcome::Dispatched }; 5]);
    assert!(delayed(&out[5]), "{:?}", out[5]);
    assert_eq!(held_by(&conn, &s).await, "cap sms_weekly: 2 per 7d");
}

#[tokio::test]
async fn a_count_policy_passes_the_cap_and_counts_toward_it() {
    let ns = unique("caps-count");
    let mut s = layered(&ns);
    s.caps
        .insert("daily_total".into(), cap(2, "1d", MatchSettings::default()));
    assert_eq!(
        s.policies["transactional"].caps,
        CapsMode::Count,
        "built in"
    );
    let (_c, w, conn) = rig(&s).await;
    let receipt = r#","category":"transactional""#;
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("r1", "r", "email", receipt),
            job("r2", "r", "email", receipt),
            job("r3", "r", "sms", receipt),
            job("p1", "r", "email", ""),
        ],
    )
    .await;
    // three receipts pass a total of two; the promotion after them waits
    assert_eq!(out[..3], [const { Outcome::Dispatched }; 3]);
    assert!(delayed(&out[3]), "{:?}", out[3]);
    assert_eq!(held_by(&conn, &s).await, "cap daily_total: 2 per 1d");

    // `ignore`: neither held nor counted
    let ns = unique("caps-ignore");
    let mut s = layered(&ns);
    s.caps
        .insert("daily_total".into(), cap(1, "1d", MatchSettings::default()));
    s.policies.get_mut("transactional").unwrap().caps = CapsMode::Ignore;
    let (_c, w, conn) = rig(&s).await;
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("r1", "r", "email", receipt),
            job("p1", "r", "email", ""),
        ],
    )
    .await;
    assert_eq!(out, [const { Outcome::Dispatched }; 2]);
}

#[tokio::test]
async fn two_tenants_with_one_phone_number_are_two_recipients() {
    let ns = unique("caps-tenants");
    let s = settings(&ns); // the built-in default: 1 a day
    let (_c, w, conn) = rig(&s).await;
    let phone = "+33612345678";
    let (a, b) = (r#","tenant":"a""#, r#","tenant":"b""#);
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("a1", phone, "sms", a),
            job("b1", phone, "sms", b),
            job("n1", phone, "sms", ""),
            job("a2", phone, "sms", a),
        ],
    )
    .await;
    assert_eq!(out[..3], [const { Outcome::Dispatched }; 3]);
    assert!(delayed(&out[3]), "{:?}", out[3]);
    // three recipients' keys, none with the phone number in clear
    let keys = s.redis.keys();
    let mut r = redis_sync();
    let names: Vec<String> = [None, Some("a"), Some("b")]
        .into_iter()
        .map(|t| keys.for_tenant(t).recipient(phone, "default", None))
        .collect();
    for name in &names {
        let n: u64 = redis::cmd("ZCARD").arg(name).query(&mut r).unwrap();
        assert_eq!(n, 1, "{name}");
        assert!(!name.contains("33612"));
    }
    assert_eq!(
        names
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );
    // a tenant too long is malformed
    let long = format!(r#","tenant":"{}""#, "x".repeat(65));
    let out = run(&w, &conn, &s, &[job("l1", phone, "sms", &long)]).await;
    assert_eq!(out[0], Outcome::Dead(quota_worker::job::Reason::Malformed));
}

#[tokio::test]
async fn a_tenant_overrides_a_policy_and_a_cap_for_its_jobs_only() {
    let ns = unique("caps-override");
    let mut s = layered(&ns);
    s.policies.insert(
        "promo".into(),
        PolicySettings {
            rules: rules(3, "1d"),
            ..PolicySettings::default()
        },
    );
    s.caps
        .insert("daily_total".into(), cap(5, "1d", MatchSettings::default()));
    let strict = quota_worker::config::TenantSettings {
        timezone: None,
        policies: BTreeMap::from([(
            "promo".to_string(),
            PolicySettings {
                rules: rules(1, "1d"),
                ..PolicySettings::default()
            },
        )]),
        caps: BTreeMap::from([(
            "daily_total".to_string(),
            cap(2, "1d", MatchSettings::default()),
        )]),
        ..Default::default()
    };
    s.tenants.insert("strict".into(), strict);
    let (_c, w, conn) = rig(&s).await;
    let promo = |t: &str| format!(r#","category":"promo","tenant":"{t}""#);
    // the strict tenant: one promotion a day...
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("s1", "r", "sms", &promo("strict")),
            job("s2", "r", "sms", &promo("strict")),
        ],
    )
    .await;
    assert_eq!(out[0], Outcome::Dispatched);
    assert!(delayed(&out[1]));
    assert_eq!(
        held_by(&conn, &s).await,
        "policy `promo` (at most 1 per 1d)"
    );
    // ...and a total of two
    let strict_news = r#","category":"news","tenant":"strict""#;
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("s3", "r", "sms", strict_news),
            job("s4", "r", "sms", strict_news),
        ],
    )
    .await;
    assert_eq!(out[0], Outcome::Dispatched);
    assert!(delayed(&out[1]));
    assert_eq!(held_by(&conn, &s).await, "cap daily_total: 2 per 1d");
    // another tenant meets the shared ones: three promotions
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("o1", "r", "sms", &promo("other")),
            job("o2", "r", "sms", &promo("other")),
            job("o3", "r", "sms", &promo("other")),
            job("o4", "r", "sms", &promo("other")),
        ],
    )
    .await;
    assert_eq!(out[..3], [const { Outcome::Dispatched }; 3]);
    assert!(delayed(&out[3]));
}

#[tokio::test]
async fn a_reload_adds_a_cap_and_the_sends_already_recorded_keep_counting() {
    let ns = unique("caps-reload");
    let mut s = layered(&ns);
    s.policies.get_mut("default").unwrap().rules = rules(2, "1d");
    let c = Cleanup::new(&s);
    let store = Arc::new(QuotaStore::connect(&s).await.expect("redis"));
    let w = Arc::new(Worker::new(s.clone(), store.clone()));
    let conn = amqp().await;
    w.topology().declare(&conn).await.unwrap();
    let out = run(&w, &conn, &s, &[job("d1", "r", "sms", "")]).await;
    assert_eq!(out, [Outcome::Dispatched]);

    let mut new = s.clone();
    new.caps
        .insert("daily_total".into(), cap(2, "1d", MatchSettings::default()));
    let changes = Reloader::new(None, s.clone(), store.clone())
        .apply(new.clone())
        .unwrap();
    assert_eq!(changes, ["cap `daily_total` added"]);
    let news = r#","category":"news""#;
    let out = run(
        &w,
        &conn,
        &s,
        &[job("d2", "r", "sms", ""), job("d3", "r", "sms", "")],
    )
    .await;
    // the send before the reload still counts for the policy: 2 of 2
    assert_eq!(out[0], Outcome::Dispatched);
    assert!(delayed(&out[1]));
    assert_eq!(
        held_by(&conn, &s).await,
        "policy `default` (at most 2 per 1d)"
    );
    // the cap counts from the reload on: d2, then one more
    let out = run(
        &w,
        &conn,
        &s,
        &[job("n1", "r", "sms", news), job("n2", "r", "sms", news)],
    )
    .await;
    assert_eq!(out[0], Outcome::Dispatched);
    assert!(delayed(&out[1]));
    assert_eq!(held_by(&conn, &s).await, "cap daily_total: 2 per 1d");
    drop(c);
}

/// `jobs` admissions of one recipient at once, over `engines` stores (as many
/// workers), each job of its own category (policies without rules) under a total of
/// 2 a day: exactly 2 are admitted, and the total's set holds exactly them.
pub async fn concurrent_jobs_under_a_total_dispatch_exactly_the_total(
    mut s: Settings,
    engines: usize,
    jobs: usize,
) {
    s.policies.get_mut("default").unwrap().rules = vec![];
    for c in ["a", "b", "c", "d", "e"] {
        s.policies.insert(c.into(), PolicySettings::default());
    }
    s.caps
        .insert("total".into(), cap(2, "1d", MatchSettings::default()));
    let mut stores = Vec::new();
    for _ in 0..engines {
        stores.push(Arc::new(QuotaStore::connect(&s).await.expect("redis")));
    }
    let mut tasks = Vec::new();
    for i in 0..jobs {
        let e = stores[i % engines].clone();
        tasks.push(tokio::spawn(async move {
            let id = format!("job-{i}");
            let category = ["a", "b", "c", "d", "e"][i % 5];
            let req = Request {
                id: &id,
                recipient: "hot",
                channel: ["sms", "email"][i % 2],
                category,
                tz: Tz::UTC,
                tenant: None,
                priority: Default::default(),
                counted: false,
                sender: None,
                cost: None,
            };
            match e.admit(&req).await.unwrap() {
                Admission::Admitted(_) => 1,
                Admission::Capped { cap, .. } => {
                    assert_eq!(cap, "total");
                    0
                }
                other => panic!("{other:?}"),
            }
        }));
    }
    let mut n = 0;
    for t in tasks {
        n += t.await.unwrap();
    }
    assert_eq!(n, 2, "a total of 2");
    let key = stores[0].keys().cap("hot", "total", None);
    let mut conn = stores[0].connection();
    let recorded: u64 = redis::cmd("ZCARD")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(recorded, 2);
}

#[tokio::test]
async fn fifty_concurrent_jobs_under_a_total_of_two_dispatch_exactly_two() {
    let ns = unique("caps-race");
    let _g = RedisGuard(ns.clone());
    concurrent_jobs_under_a_total_dispatch_exactly_the_total(settings(&ns), 5, 50).await;
}

#[tokio::test]
async fn a_released_admission_is_given_back_to_every_layer() {
    let ns = unique("caps-release");
    let _g = RedisGuard(ns.clone());
    let mut s = layered(&ns);
    s.caps
        .insert("total".into(), cap(1, "1d", MatchSettings::default()));
    let e = QuotaStore::connect(&s).await.unwrap();
    let req = |id| Request {
        id,
        recipient: "r",
        channel: "sms",
        category: "news",
        tz: Tz::UTC,
        tenant: None,
        priority: Default::default(),
        counted: false,
        sender: None,
        cost: None,
    };
    let Admission::Admitted(ticket) = e.admit(&req("a")).await.unwrap() else {
        panic!("admitted")
    };
    assert!(matches!(
        e.admit(&req("b")).await.unwrap(),
        Admission::Capped { .. }
    ));
    e.release(&ticket).await.unwrap();
    assert!(matches!(
        e.admit(&req("b")).await.unwrap(),
        Admission::Admitted(_)
    ));
}

/// A configuration file with `body` after the test's channels: the error, as text.
fn load_error(body: &str) -> String {
    let path = std::env::temp_dir().join(format!("{}.toml", unique("caps-config")));
    std::fs::write(&path, body).unwrap();
    let err = Settings::load(Some(&path)).unwrap_err().to_string();
    let _ = std::fs::remove_file(&path);
    err.replace(&path.display().to_string(), "FILE")
}

#[test]
fn a_bad_configuration_names_the_key_and_the_line() {
    let err = load_error("[caps.total]\nrules = [{ limit = 5, window = \"1d\" }]\nmatch = { channels = [\"fax\"] }\n");
    assert!(err.starts_with("FILE:3: "), "{err}");
    assert!(err.contains("`caps.total.match.channels`"), "{err}");
    assert!(err.contains("channel `fax` is not configured"), "{err}");

    let err = load_error("[policies.promo]\nrules = []\ncaps = \"sometimes\"\n");
    assert!(err.starts_with("FILE:3: "), "{err}");
    assert!(err.contains("`policies.promo.caps`"), "{err}");
    assert!(err.contains("enforce"), "{err}");

    let err = load_error("[tenants.acme.policies.promo]\nrules = []\n");
    assert!(err.starts_with("FILE:1: "), "{err}");
    assert!(err.contains("`tenants.acme.policies.promo`"), "{err}");

    let err = load_error("[tenants.acme.caps.total]\nrules = [{ limit = 1, window = \"1d\" }]\n");
    assert!(err.contains("`tenants.acme.caps.total`"), "{err}");
    assert!(err.contains("there is no cap `total`"), "{err}");

    // what the issue's contract writes is accepted as written
    let path = std::env::temp_dir().join(format!("{}.toml", unique("caps-ok")));
    std::fs::write(
        &path,
        "[caps.daily_total]\nrules = [{ limit = 5, window = \"1d\" }]\nmatch = {}\n\n\
         [caps.sms_weekly]\nrules = [{ limit = 2, window = \"7d\" }]\nmatch = { channels = [\"sms\"] }\nscope = \"channel\"\nmode = \"shadow\"\n\n\
         [tenants.acme.caps.daily_total]\nrules = [{ limit = 2, window = \"1d\" }]\n",
    )
    .unwrap();
    let s = Settings::load(Some(&path)).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(s.caps.len(), 2);
    assert_eq!(
        s.caps["sms_weekly"].matches.channels.as_deref(),
        Some(&["sms".to_string()][..])
    );
    assert_eq!(s.tenants["acme"].caps["daily_total"].rules[0].limit, 2);
}

#[tokio::test]
async fn admin_shows_every_layer_of_a_tenants_recipient_and_the_job_names_its_cap() {
    let ns = unique("caps-admin");
    let mut s = layered(&ns);
    s.caps
        .insert("daily_total".into(), cap(2, "1d", MatchSettings::default()));
    s.caps
        .insert("sms_weekly".into(), cap(3, "7d", channels(&["sms"])));
    let (_c, w, conn) = rig(&s).await;
    let acme = r#","tenant":"acme""#;
    let out = run(
        &w,
        &conn,
        &s,
        &[
            job("a1", "r", "sms", acme),
            job("a2", "r", "email", acme),
            job("a3", "r", "sms", acme),
        ],
    )
    .await;
    assert!(delayed(&out[2]));

    let store = QuotaStore::connect(&s).await.unwrap();
    let recipients = quota_worker::admin::recipients::Recipients::new(&store, &s);
    let query = |tenant| quota_worker::admin::recipients::RecipientQuery {
        recipient: "r",
        category: None,
        channel: None,
        tz: Tz::UTC,
        tenant,
    };
    let st = recipients.status(&query(Some("acme"))).await.unwrap();
    assert_eq!(st.tenant.as_deref(), Some("acme"));
    let json = serde_json::to_value(&st).unwrap();
    let caps = json["caps"].as_array().unwrap();
    assert_eq!(caps.len(), 2);
    assert_eq!(caps[0]["cap"], "daily_total");
    assert_eq!(caps[0]["rules"][0]["count"], 2);
    assert_eq!(caps[0]["rules"][0]["full"], true);
    let midnight = window::next_day_start(Tz::UTC, st.now);
    assert_eq!(
        caps[0]["next_allowed"]["utc"],
        serde_json::to_value(midnight).unwrap()
    );
    assert_eq!(caps[1]["cap"], "sms_weekly");
    assert_eq!(caps[1]["rules"][0]["count"], 1);
    assert_eq!(caps[1]["next_allowed"]["now"], true);
    // the same recipient without a tenant has sent nothing
    let plain = recipients.status(&query(None)).await.unwrap();
    assert!(plain.caps.iter().all(|c| c.sends.is_empty()));
    assert_ne!(plain.recipient_tag, st.recipient_tag);

    // `admin job` names the layer that held it
    let job = quota_worker::admin::Jobs::new(&store, &s)
        .explain("a3")
        .await
        .unwrap();
    let note = serde_json::to_value(&job.record).unwrap();
    assert_eq!(note["held_by"], "cap daily_total: 2 per 1d", "{note}");
}

#[tokio::test]
async fn the_cli_publishes_with_a_tenant_and_shows_every_layer_of_its_recipient() {
    let ns = unique("caps-cli");
    let mut s = settings(&ns);
    s.caps
        .insert("daily_total".into(), cap(5, "1d", MatchSettings::default()));
    let (_c, w, conn) = rig(&s).await;
    let config = std::env::temp_dir().join(format!("{ns}.toml"));
    std::fs::write(
        &config,
        "[caps.daily_total]\nrules = [{ limit = 5, window = \"1d\" }]\nmatch = {}\n",
    )
    .unwrap();
    let file = config.to_str().unwrap();
    let out = crate::cli::run_async(
        &s,
        &[
            "--config",
            file,
            "publish",
            "--recipient",
            "+1555",
            "--channel",
            "sms",
            "--tenant",
            "acme",
            "--id",
            "cli-1",
        ],
        None,
    )
    .await;
    assert!(out.status.success(), "{}", crate::cli::stderr(&out));
    assert_eq!(step(&w, &conn, &s).await, Outcome::Dispatched);
    let shown = crate::cli::json(
        &crate::cli::run_async(
            &s,
            &[
                "--config",
                file,
                "admin",
                "recipient",
                "+1555",
                "--tenant",
                "acme",
                "--json",
            ],
            None,
        )
        .await,
    );
    let _ = std::fs::remove_file(&config);
    assert_eq!(shown["tenant"], "acme");
    assert_eq!(shown["policies"][0]["policy"], "default");
    assert_eq!(shown["policies"][0]["rules"][0]["count"], 1);
    assert_eq!(shown["caps"][0]["cap"], "daily_total");
    assert_eq!(shown["caps"][0]["rules"][0]["count"], 1);
    assert_eq!(shown["caps"][0]["rules"][0]["limit"], 5);
    assert_eq!(shown["caps"][0]["next_allowed"]["now"], true);
}
