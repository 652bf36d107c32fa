//! What the digest scenarios (`digest_close_kill`, `digest_broker_restart`) share:
//! settings with a digest policy, the jobs they publish, the state of the digests in
//! Redis, and the closing checks on what reached the dispatch queue: every digest
//! once (by `message_id`), every job in exactly one digest, none lost.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use quota_worker::config::{DigestSettings, Dur, PolicySettings, Settings};
use quota_worker::quota::digest::{DigestMode, KeepFrom};
use testkit::audit::{self, depth, Published};
use testkit::*;

use super::{fault_settings, Progress};

/// [`fault_settings`] with policy `social`: a `window` digest of `window`, every
/// item carried in full (`keep` 100), so each can be counted; with `cap`, at most
/// that many sends per rolling window (e.g. `(1, "8s")`).
pub(crate) fn digest_settings(ns: &str, window: Duration, cap: Option<(u32, &str)>) -> Settings {
    let mut s = fault_settings(ns, 2000);
    s.policies.insert(
        "social".into(),
        PolicySettings {
            rules: cap.map(|c| super::policy(&[c]).rules).unwrap_or_default(),
            digest: Some(DigestSettings {
                mode: DigestMode::Window,
                window: Some(Dur(window)),
                max_window: None,
                max_items: 100,
                keep: 100,
                keep_from: KeepFrom::First,
            }),
            ..PolicySettings::default()
        },
    );
    s.validate().expect("valid settings");
    s
}

/// One send of policy `social` recorded now for each of `recipients` recipients
/// (as [`digest_jobs`] names them), through the store as a worker records one.
pub(crate) async fn send_one_each(s: &Settings, recipients: usize) {
    use quota_worker::admission::{Admission, Request};
    let store = quota_worker::store::QuotaStore::connect(s).await.unwrap();
    for r in 0..recipients {
        let (id, recipient) = (format!("before-{r}"), format!("dr-{r}"));
        let req = Request {
            id: &id,
            recipient: &recipient,
            channel: "sms",
            category: "social",
            tz: chrono_tz::Tz::UTC,
            tenant: None,
            priority: Default::default(),
            counted: false,
            sender: None,
            cost: None,
        };
        let Admission::Admitted(ticket) = store.admit(&req).await.unwrap() else {
            panic!("{recipient}'s first send admitted")
        };
        store.commit(&ticket).await.unwrap();
    }
}

/// `per` jobs of policy `social` for each of `recipients` recipients, interleaved.
pub(crate) fn digest_jobs(ns: &str, recipients: usize, per: usize) -> Vec<Published> {
    let mut jobs = Vec::with_capacity(recipients * per);
    for k in 0..per {
        for r in 0..recipients {
            let id = format!("{ns}-{r}-{k}");
            let recipient = format!("dr-{r}");
            let body = audit::job_body(&id, &recipient, "sms", "social", "UTC");
            jobs.push(Published {
                id,
                recipient,
                body,
            });
        }
    }
    jobs
}

/// The digests in `s`'s index of close instants, and those a closer is closing
/// now (state `closing`).
pub(crate) fn digest_state(s: &Settings) -> (usize, BTreeSet<String>) {
    let mut c = redis_sync();
    let index = s.redis.keys().digests();
    let keys: Vec<String> = redis::cmd("ZRANGE")
        .arg(&index)
        .arg(0)
        .arg(-1)
        .query(&mut c)
        .unwrap_or_default();
    if keys.is_empty() {
        return (0, BTreeSet::new());
    }
    let mut pipe = redis::pipe();
    for k in &keys {
        pipe.cmd("HGET").arg(k).arg("state");
    }
    let states: Vec<Option<String>> = pipe.query(&mut c).unwrap_or_default();
    let closing = keys
        .iter()
        .zip(&states)
        .filter(|(_, s)| s.as_deref() == Some("closing"))
        .map(|(k, _)| k.clone())
        .collect();
    (keys.len(), closing)
}

/// Wait (polling Redis every 5 ms, at most `limit`) until a closer is closing a
/// digest other than those of `before` (left closing by a worker killed earlier);
/// the digests in the index then, and those closing. `None` if none was seen.
pub(crate) async fn until_closing(
    s: &Settings,
    before: &BTreeSet<String>,
    limit: Duration,
) -> Option<(usize, BTreeSet<String>)> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let (open, closing) = digest_state(s);
        if closing.iter().any(|k| !before.contains(k)) {
            return Some((open, closing));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

/// Wait until every digest is done with (the index empty), the jobs queue is
/// empty and the dispatch queue holds at least `digests` messages, three polls in
/// a row; false once `timeout` went by with no digest more sent and none fewer
/// left.
pub(crate) async fn until_digests_sent(
    conn: &lapin::Connection,
    s: &Settings,
    digests: usize,
    timeout: Duration,
) -> bool {
    let dispatch = topology(s).dispatch_queue("sms");
    let mut progress = Progress::new(timeout);
    let mut calm = 0;
    while !progress.stalled() {
        let (open, _) = digest_state(s);
        let jobs = depth(conn, &s.amqp.jobs_queue).await.unwrap_or(1);
        let sent = depth(conn, &dispatch).await.unwrap_or(0) as usize;
        progress.see(sent as u64, (open as u64) + u64::from(jobs));
        if open == 0 && jobs == 0 && sent >= digests {
            calm += 1;
            if calm >= 3 {
                return true;
            }
        } else {
            calm = 0;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    false
}

/// One message of the dispatch queue.
pub(crate) struct Sent {
    pub(crate) id: String,
    /// The `x-notify-digest` header.
    pub(crate) count: Option<u64>,
    /// The ids of its items.
    pub(crate) items: Vec<String>,
}

/// Everything on the `sms` dispatch queue, in order.
pub(crate) async fn drain_dispatch(conn: &lapin::Connection, s: &Settings) -> Vec<Sent> {
    let queue = topology(s).dispatch_queue("sms");
    let mut out = Vec::new();
    while let Some(m) = take(conn, &queue, Duration::from_millis(500)).await {
        let body: serde_json::Value = serde_json::from_slice(&m.delivery.data).unwrap();
        let items = body["digest"]["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        out.push(Sent {
            id: message_id(&m).to_string(),
            count: header(&m.delivery.properties, "x-notify-digest").and_then(|c| c.parse().ok()),
            items,
        });
    }
    out
}

/// What the dispatch queue held, judged: the digests sent (distinct ids), the ids
/// sent more than once with their positions, the jobs in no digest, the jobs in
/// two, and the messages whose count does not match their items or that are no
/// digest.
#[derive(Debug)]
pub(crate) struct DigestAudit {
    pub(crate) digests: usize,
    pub(crate) twice: BTreeMap<String, Vec<usize>>,
    pub(crate) lost: Vec<String>,
    pub(crate) in_two: Vec<String>,
    pub(crate) wrong: Vec<String>,
}

impl DigestAudit {
    pub(crate) fn of(sent: &[Sent], jobs: &[Published]) -> DigestAudit {
        let mut positions: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        let mut holder: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        let mut wrong = Vec::new();
        for (i, m) in sent.iter().enumerate() {
            positions.entry(&m.id).or_default().push(i);
            if !m.id.starts_with("dg-") || m.count != Some(m.items.len() as u64) {
                wrong.push(format!(
                    "{}: count {:?}, {} items",
                    m.id,
                    m.count,
                    m.items.len()
                ));
            }
            for item in &m.items {
                holder.entry(item).or_default().insert(&m.id);
            }
        }
        let lost = jobs
            .iter()
            .filter(|j| !holder.contains_key(j.id.as_str()))
            .map(|j| j.id.clone())
            .collect();
        let in_two = holder
            .iter()
            .filter(|(_, d)| d.len() > 1)
            .map(|(j, d)| format!("{j} in {d:?}"))
            .collect();
        DigestAudit {
            digests: positions.len(),
            twice: positions
                .into_iter()
                .filter(|(_, p)| p.len() > 1)
                .map(|(id, p)| (id.to_string(), p))
                .collect(),
            lost,
            in_two,
            wrong,
        }
    }

    /// Every job in exactly one digest, every message a digest whose count is its
    /// items.
    pub(crate) fn assert_items_once(&self) {
        assert!(
            self.lost.is_empty(),
            "{} jobs in no digest: {:?}",
            self.lost.len(),
            &self.lost[..self.lost.len().min(20)]
        );
        assert!(
            self.in_two.is_empty(),
            "jobs in two digests: {:?}",
            self.in_two
        );
        assert!(
            self.wrong.is_empty(),
            "not digests as built: {:?}",
            self.wrong
        );
    }

    /// The closing checks both digest scenarios end with, once their run is
    /// recorded: no worker panic (its logs in `dir`), every digest sent (`settled`),
    /// the worker's clean exit (`status`), every job once in one of `digests`
    /// digests, no digest twice, no dead letter.
    pub(crate) async fn assert_end(
        &self,
        run: (&std::path::Path, &testkit::procs::WorkerProc),
        settled: bool,
        status: Option<std::process::ExitStatus>,
        (conn, s): (&lapin::Connection, &Settings),
        digests: usize,
    ) {
        let (dir, w) = run;
        let panics = super::worker_panics(dir);
        assert!(panics.is_empty(), "worker panics: {panics:#?}");
        assert!(settled, "the digests were not all sent:\n{}", w.tail(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "worker exit:\n{}",
            w.tail(30)
        );
        self.assert_items_once();
        assert_eq!(self.digests, digests, "one digest a recipient");
        assert!(
            self.twice.is_empty(),
            "digests dispatched twice: {:?}",
            self.twice
        );
        assert_eq!(
            depth(conn, &s.amqp.dead_queue).await,
            Some(0),
            "dead letters"
        );
    }
}
