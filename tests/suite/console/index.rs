//! The dead-letter index (`admin::dead_index`) against the machine's Redis and a
//! Redis Cluster: a filtered page finds what a scan of the entries kept would find,
//! in the same order and count, for every field alone and together; the oldest
//! entries dropped beyond the bound and the entries forgotten leave no trace in
//! the field sets, nor in the set of the tenants the index holds.

use chrono::{DateTime, Duration, Utc};
use lapin::types::{AMQPValue, FieldTable};
use quota_worker::admin::dead_index::{self, Filter, Known};
use quota_worker::quota::keys::Keys;
use quota_worker::redis::RedisConn;
use quota_worker::store::QuotaStore;
use testkit::*;

/// Entries recorded, of which the index keeps the newest `BOUND`.
const RECORDED: usize = 240;
const BOUND: u32 = 150;

/// What entry `i` is: (job id, reason, policy, channel, recipient tag), some
/// fields unknown as for a job that was not decoded.
fn fields(
    i: usize,
) -> (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
) {
    let pick = |words: &[&str], n: usize| Some(words[n % words.len()].to_string());
    let decoded = !i.is_multiple_of(7);
    (
        format!("job-{:03}", i % 200),
        ["capped", "expired", "malformed"][i % 3].to_string(),
        pick(&["default", "marketing"], i / 2).filter(|_| decoded),
        pick(&["sms", "email", "push", "fax"], i).filter(|_| decoded),
        pick(&["t1", "t2", "t3", "t4", "t5"], i / 3).filter(|_| decoded),
    )
}

/// Entry `i` of those recorded from `start`.
fn entry_at(i: usize, start: DateTime<Utc>) -> dead_index::Entry {
    let (id, reason, policy, channel, recipient_tag) = fields(i);
    let mut headers = FieldTable::default();
    headers.insert(
        "x-notify-reason".into(),
        AMQPValue::LongString(reason.into()),
    );
    let props = lapin::BasicProperties::default()
        .with_message_id(id.into())
        .with_headers(headers);
    let tenant = ["acme", "beta"][i / 5 % 2].to_string();
    let known = Known {
        tenant: channel.as_ref().map(|_| tenant),
        policy,
        channel,
        recipient_tag,
    };
    // one entry a millisecond, and two in one now and then (the index orders
    // those by their summaries, which begin with the job id: here as recorded)
    let at = start + Duration::milliseconds((i - (i + 5) / 10) as i64);
    dead_index::entry(&props, b"{}", known, at)
}

async fn record_all(conn: &RedisConn, keys: &Keys, start: DateTime<Utc>) {
    for i in 0..RECORDED {
        let entry = entry_at(i, start);
        dead_index::record(conn, keys, &entry, BOUND).await.unwrap();
    }
}

/// The filters tried: none, each field alone, and several together.
fn filters() -> Vec<Filter> {
    let f = |reason: Option<&str>,
             policy: Option<&str>,
             channel: Option<&str>,
             tag: Option<&str>,
             id: Option<&str>| Filter {
        reason: reason.map(str::to_string),
        policy: policy.map(str::to_string),
        channel: channel.map(str::to_string),
        recipient_tag: tag.map(str::to_string),
        id: id.map(str::to_string),
        ..Filter::default()
    };
    vec![
        Filter::default(),
        f(Some("capped"), None, None, None, None),
        f(None, Some("marketing"), None, None, None),
        f(None, None, Some("sms"), None, None),
        f(None, None, None, Some("t2"), None),
        f(None, None, None, None, Some("job-100")),
        f(Some("expired"), None, Some("email"), None, None),
        f(
            Some("capped"),
            Some("default"),
            Some("sms"),
            Some("t1"),
            None,
        ),
        f(Some("malformed"), None, None, None, Some("job-030")),
        f(None, None, Some("nowhere"), None, None),
    ]
}

/// Filters with a tenant or a time range (from `start`, as recorded), alone and
/// with the others.
fn more_filters(start: DateTime<Utc>) -> Vec<Filter> {
    let at = |ms: i64| Some(start + Duration::milliseconds(ms));
    let acme = Filter {
        tenant: Some("acme".into()),
        ..Filter::default()
    };
    vec![
        acme.clone(),
        Filter {
            tenant: Some("no-such-tenant".into()),
            ..Filter::default()
        },
        Filter {
            channel: Some("sms".into()),
            ..acme.clone()
        },
        Filter {
            since: at(150),
            ..Filter::default()
        },
        Filter {
            until: at(190),
            ..Filter::default()
        },
        Filter {
            since: at(150),
            until: at(190),
            reason: Some("capped".into()),
            ..acme
        },
    ]
}

/// What a scan of the entries kept would select with the predicate every action
/// uses ([`Filter::matches`]), newest first: their job ids.
fn scanned(filter: &Filter, start: DateTime<Utc>) -> Vec<String> {
    let kept = RECORDED - BOUND as usize..RECORDED;
    kept.rev()
        .map(|i| entry_at(i, start))
        .filter(|e| filter.matches(e))
        .filter_map(|e| e.id)
        .collect()
}

/// Every page of `filter`, 7 a page, against the scan.
async fn pages_match_the_scan(
    conn: &RedisConn,
    keys: &Keys,
    filter: &Filter,
    start: DateTime<Utc>,
) {
    let want = scanned(filter, start);
    let mut got = Vec::new();
    for offset in (0..want.len().max(1)).step_by(7) {
        let (count, entries) = dead_index::page(conn, keys, filter, offset, 7)
            .await
            .unwrap();
        assert_eq!(count, want.len(), "{filter:?}");
        got.extend(entries.into_iter().filter_map(|e| e.id));
    }
    assert_eq!(got, want, "{filter:?}");
    let selected = dead_index::select(conn, keys, filter).await.unwrap();
    assert_eq!(selected.len(), want.len(), "{filter:?}");
}

/// The members of every field set, each of which the index must hold.
async fn field_set_members(conn: &RedisConn, keys: &Keys, index: &[String]) -> usize {
    let mut c = conn.clone();
    let mut total = 0;
    for field in ["id", "reason", "policy", "channel", "recipient"] {
        let values: Vec<String> = match field {
            "id" => (0..200).map(|i| format!("job-{i:03}")).collect(),
            "reason" => ["capped", "expired", "malformed"].map(String::from).into(),
            "policy" => ["default", "marketing"].map(String::from).into(),
            "channel" => ["sms", "email", "push", "fax"].map(String::from).into(),
            _ => ["t1", "t2", "t3", "t4", "t5"].map(String::from).into(),
        };
        for v in values {
            let set = format!("{}:{{dead}}:v2:by:{field}:{v}", keys.prefix());
            let members: Vec<String> = redis::cmd("ZRANGE")
                .arg(&set)
                .arg(0)
                .arg(-1)
                .query_async(&mut c)
                .await
                .unwrap();
            for m in &members {
                assert!(
                    index.contains(m),
                    "{set} holds {m}, which the index does not"
                );
            }
            total += members.len();
        }
    }
    total
}

/// Record, page with every filter, forget a filter's selection, then everything.
async fn the_index_keeps_its_field_sets(store: &QuotaStore) {
    let (conn, keys) = (store.connection(), store.keys());
    let start = Utc::now();
    record_all(&conn, keys, start).await;
    for filter in filters().into_iter().chain(more_filters(start)) {
        pages_match_the_scan(&conn, keys, &filter, start).await;
    }
    let index = dead_index::select(&conn, keys, &Filter::default())
        .await
        .unwrap();
    assert_eq!(index.len(), BOUND as usize);
    let fields_known: usize = (RECORDED - BOUND as usize..RECORDED)
        .map(fields)
        .map(|(_, _, p, c, t)| 2 + [p, c, t].iter().flatten().count())
        .sum();
    assert_eq!(field_set_members(&conn, keys, &index).await, fields_known);

    let sms = &filters()[3];
    let chosen = dead_index::select(&conn, keys, sms).await.unwrap();
    assert!(!chosen.is_empty());
    dead_index::forget(&conn, keys, &chosen).await.unwrap();
    let (count, _) = dead_index::page(&conn, keys, sms, 0, 10).await.unwrap();
    assert_eq!(count, 0);
    let (left, _) = dead_index::page(&conn, keys, &Filter::default(), 0, 1)
        .await
        .unwrap();
    assert_eq!(left, BOUND as usize - chosen.len());

    // the tenants the index holds: a tenant forgotten with its last entry
    let tenants = dead_index::tenants(&conn, keys).await.unwrap();
    assert_eq!(tenants, ["acme", "beta"]);
    let acme = Filter {
        tenant: Some("acme".into()),
        ..Filter::default()
    };
    let of_acme = dead_index::select(&conn, keys, &acme).await.unwrap();
    dead_index::forget(&conn, keys, &of_acme).await.unwrap();
    assert_eq!(dead_index::tenants(&conn, keys).await.unwrap(), ["beta"]);

    let all = dead_index::select(&conn, keys, &Filter::default())
        .await
        .unwrap();
    dead_index::forget(&conn, keys, &all).await.unwrap();
    assert_eq!(field_set_members(&conn, keys, &[]).await, 0);
    assert!(dead_index::tenants(&conn, keys).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_filtered_page_reads_the_field_sets_as_a_scan_would_and_they_follow_the_index() {
    let ns = unique("console-index");
    let s = settings(&ns);
    let _g = RedisGuard(ns.clone());
    let store = QuotaStore::connect(&s).await.unwrap();
    the_index_keeps_its_field_sets(&store).await;
    let mut c = store.connection();
    let left: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{ns}:{{dead}}:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(left.is_empty(), "{left:?}");
}

#[tokio::test]
async fn the_index_and_its_field_sets_work_on_a_cluster() {
    let ns = unique("c-console-index");
    let s = crate::cluster::cluster_settings(&ns);
    let _k = crate::cluster::ClusterKeys(ns.clone());
    let store = QuotaStore::connect(&s).await.unwrap();
    assert!(matches!(store.connection(), RedisConn::Cluster(..)));
    the_index_keeps_its_field_sets(&store).await;
}

/// The catch-up's lease (`lua/lease.lua`): only its taker renews or ends it.
#[tokio::test]
async fn the_catch_ups_lease_is_renewed_and_ended_by_its_taker_only() {
    let ns = unique("lease");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let store = QuotaStore::connect(&s).await.unwrap();
    let mut conn = store.connection();
    let lease = format!("{}:{{dead}}:catching", s.redis.key_prefix);
    let script = redis::Script::new(include_str!("../../../lua/lease.lua"));
    let _: () = redis::cmd("SET")
        .arg(&lease)
        .arg("mine")
        .arg("PX")
        .arg(1000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let ttl = |conn: &RedisConn| {
        let mut c = conn.clone();
        let lease = lease.clone();
        async move {
            redis::cmd("PTTL")
                .arg(&lease)
                .query_async::<i64>(&mut c)
                .await
                .unwrap()
        }
    };
    let run = |token: &'static str, renew: Option<u64>| {
        let mut invocation = script.key(&lease);
        invocation.arg(token);
        if let Some(ms) = renew {
            invocation.arg(ms);
        }
        let mut c = store.connection();
        async move { invocation.invoke_async::<i64>(&mut c).await.unwrap() }
    };
    assert_eq!(run("other", Some(600_000)).await, 0, "renewed by another");
    assert!(ttl(&conn).await <= 1000);
    assert_eq!(run("mine", Some(600_000)).await, 1, "renewed by its taker");
    assert!(ttl(&conn).await > 1000);
    assert_eq!(run("other", None).await, 0, "ended by another");
    assert!(ttl(&conn).await > 0);
    assert_eq!(run("mine", None).await, 1, "ended by its taker");
    assert_eq!(ttl(&conn).await, -2, "gone");
}
