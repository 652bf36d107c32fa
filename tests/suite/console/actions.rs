//! A property of the console's replay and purge (`admin::dead_action`), through
//! the machine's RabbitMQ and Redis: random dead letters (tenants, reasons, with
//! and without a job id, made by the worker and by the broker), a random filter
//! and verb, and dead letters arriving between the confirmation and the action and
//! during it. What the action touched is exactly what the confirmation listed,
//! which is what the filter selects of the letters published; nothing else is
//! touched or lost; a repeated action does nothing; and the list afterwards
//! matches the queue. The broker's letters are published with the headers the
//! broker writes past a delivery limit (`x-death`, `x-first-death-*`): letters
//! the broker dead-lettered itself from a test's queue were seen to reach the
//! dead-letter queue but not always the log on RabbitMQ 3.10.

use std::collections::BTreeMap;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::{AMQPValue, FieldTable, LongString};
use lapin::{BasicProperties, Connection};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use quota_worker::admin::dead_action::{self, Carried, Verb};
use quota_worker::admin::dead_index::{self, Filter};
use quota_worker::admin::dead_select::print;
use quota_worker::admin::{dead_log, DeadLetters, WalkAction};
use quota_worker::amqp::Topology;
use quota_worker::config::Settings;
use quota_worker::store::QuotaStore;
use testkit::*;

/// Cases tried (each publishes, walks and checks; a few seconds).
const CASES: u32 = 10;

const TENANTS: [Option<&str>; 3] = [None, Some("acme"), Some("beta")];
const REASONS: [&str; 3] = ["capped", "unknown_channel", "malformed"];

/// One dead letter to make.
#[derive(Debug, Clone)]
struct Letter {
    tenant: Option<&'static str>,
    /// The worker's reason; `None`: the broker's (`delivery_limit`).
    reason: Option<&'static str>,
    /// A job id as `message_id`.
    with_id: bool,
    /// A body that is not a job.
    garbled: bool,
    n: u32,
}

impl Letter {
    fn body(&self) -> Vec<u8> {
        if self.garbled {
            return format!("not a job #{}", self.n).into_bytes();
        }
        let mut job = serde_json::json!({
            "recipient": format!("r{}", self.n % 3),
            "channel": "sms",
            "category": "default",
        });
        if let Some(t) = self.tenant {
            job["tenant"] = t.into();
        }
        if self.with_id {
            job["id"] = format!("j{}", self.n).into();
        }
        job.to_string().into_bytes()
    }

    fn reason(&self) -> &'static str {
        self.reason.unwrap_or("delivery_limit")
    }

    /// Whether `f` selects it, by what it was made of (the oracle).
    fn selected_by(&self, f: &Filter) -> bool {
        // (a job without an id does not decode: its tenant and channel are unknown)
        let decoded = !self.garbled && self.with_id;
        f.reason.as_deref().is_none_or(|r| r == self.reason())
            && f.tenant
                .as_deref()
                .is_none_or(|t| decoded && self.tenant == Some(t))
            && f.channel.as_deref().is_none_or(|c| decoded && c == "sms")
            && f.id
                .as_deref()
                .is_none_or(|id| self.with_id && id == format!("j{}", self.n))
    }
}

fn letter() -> impl Strategy<Value = Letter> {
    (
        0..3usize,
        prop_oneof![3 => (0..3usize).prop_map(|r| Some(REASONS[r])), 1 => Just(None)],
        any::<bool>(),
        prop::bool::weighted(0.2),
        0..1000u32,
    )
        .prop_map(|(t, reason, with_id, garbled, n)| Letter {
            tenant: TENANTS[t],
            reason,
            with_id,
            garbled,
            n,
        })
}

fn filter() -> impl Strategy<Value = Filter> {
    let reasons = prop::option::of(prop_oneof![
        Just("capped"),
        Just("unknown_channel"),
        Just("malformed"),
        Just("delivery_limit")
    ]);
    let tenants = prop::option::of(prop_oneof![Just("acme"), Just("beta"), Just("gamma")]);
    let channels = prop::option::weighted(0.2, Just("sms"));
    (reasons, tenants, channels).prop_map(|(reason, tenant, channel)| Filter {
        reason: reason.map(str::to_string),
        tenant: tenant.map(str::to_string),
        channel: channel.map(str::to_string),
        ..Filter::default()
    })
}

#[derive(Debug, Clone)]
struct Case {
    letters: Vec<Letter>,
    filter: Filter,
    replay: bool,
    before: Vec<Letter>,
    during: Vec<Letter>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(letter(), 0..14),
        filter(),
        any::<bool>(),
        prop::collection::vec(letter(), 0..3),
        prop::collection::vec(letter(), 0..4),
    )
        .prop_map(|(letters, filter, replay, before, during)| Case {
            letters,
            filter,
            replay,
            before,
            during,
        })
}

/// The prints counted.
type Bag = BTreeMap<String, usize>;

fn bag<'a>(prints: impl IntoIterator<Item = &'a String>) -> Bag {
    let mut b = Bag::new();
    for p in prints {
        *b.entry(p.clone()).or_default() += 1;
    }
    b
}

/// The world of one test: a worker's topology, a channel to publish on (on a
/// connection of its own, beside the walks').
struct World {
    s: Settings,
    store: QuotaStore,
    conn: Connection,
    ch: lapin::Channel,
}

impl World {
    /// Make `l` a dead letter, published to the dead-letter exchange as the
    /// worker publishes one, or as the broker dead-letters one past a delivery
    /// limit (its `x-death` and `x-first-death-*` headers); its print.
    async fn make(&self, l: &Letter) -> String {
        let mut props = BasicProperties::default();
        if l.with_id {
            props = props.with_message_id(format!("j{}", l.n).into());
        }
        let text = |s: &str| AMQPValue::LongString(LongString::from(s));
        let mut h = FieldTable::default();
        match l.reason {
            Some(reason) => {
                h.insert("x-notify-reason".into(), text(reason));
                h.insert("x-notify-detail".into(), text(&format!("case {}", l.n)));
                props = props.with_timestamp(1_800_000_000 + l.n as u64);
            }
            None => {
                let mut death = FieldTable::default();
                death.insert("reason".into(), text("delivery_limit"));
                death.insert("queue".into(), text(&self.s.amqp.jobs_queue));
                death.insert("count".into(), AMQPValue::LongLongInt(1));
                death.insert("time".into(), AMQPValue::Timestamp(1_800_000_000));
                let deaths = vec![AMQPValue::FieldTable(death)];
                h.insert("x-death".into(), AMQPValue::FieldArray(deaths.into()));
                h.insert("x-first-death-reason".into(), text("delivery_limit"));
                h.insert("x-first-death-queue".into(), text(&self.s.amqp.jobs_queue));
                h.insert("x-first-death-exchange".into(), text(""));
            }
        }
        let props = props.with_headers(h);
        self.ch
            .basic_publish(
                self.s.amqp.dead_exchange.as_str().into(),
                "".into(),
                BasicPublishOptions::default(),
                &l.body(),
                props.clone(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        print(&props, &l.body())
    }

    /// The prints of the dead-letter queue, walked.
    async fn queue(&self) -> Vec<String> {
        let topology = Topology::from_settings(&self.s);
        let mut prints = Vec::new();
        DeadLetters::new(&self.conn, &topology, Duration::from_secs(10))
            .walk(&Default::default(), |d| {
                prints.push(print(&d.properties, &d.data));
                WalkAction::Keep
            })
            .await
            .unwrap();
        prints
    }

    /// The prints the index lists, caught up.
    async fn listed(&self) -> Vec<String> {
        dead_log::catch_up(&self.conn, &self.store, &self.s)
            .await
            .unwrap();
        let (conn, keys) = (self.store.connection(), self.store.keys());
        let all = dead_index::select(&conn, keys, &Filter::default())
            .await
            .unwrap();
        let entries = dead_index::read(&conn, keys, &all).await.unwrap();
        entries.into_iter().map(|e| e.print).collect()
    }

    /// Empty the dead-letter queue, the jobs queue and the index.
    async fn clear(&self) {
        for q in [&self.s.amqp.dead_queue, &self.s.amqp.jobs_queue] {
            self.ch
                .queue_purge(q.as_str().into(), Default::default())
                .await
                .unwrap();
        }
        let all = self.listed().await;
        let (conn, keys) = (self.store.connection(), self.store.keys());
        let keys_all = dead_index::select(&conn, keys, &Filter::default())
            .await
            .unwrap();
        assert_eq!(keys_all.len(), all.len());
        dead_index::forget(&conn, keys, &keys_all).await.unwrap();
    }

    /// Wait until the dead-letter queue holds `n`.
    async fn holds(&self, n: usize) {
        let (conn, q) = (&self.conn, &self.s.amqp.dead_queue);
        wait_for(
            "the dead letters made",
            Duration::from_secs(10),
            || async move { depth(conn, q).await as usize == n },
        )
        .await;
    }
}

async fn world() -> (Cleanup, World) {
    let ns = unique("dead-actions");
    let s = settings(&ns);
    let (c, w, conn) = rig(&s).await;
    let store = QuotaStore::connect(&s).await.unwrap();
    drop(w);
    let ch = amqp().await.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let w = World { s, store, conn, ch };
    (c, w)
}

/// One case, as the module docs say.
async fn run(w: &World, case: Case) {
    w.clear().await;
    let mut made = Vec::new();
    for l in &case.letters {
        made.push(w.make(l).await);
    }
    w.holds(made.len()).await;
    let queue_before = w.queue().await;
    assert_eq!(
        queue_before, made,
        "the queue holds what was made, in order"
    );
    assert_eq!(bag(&w.listed().await), bag(&made), "the list is the queue");

    // the confirmation: what the filter selects, as the oracle says
    let (conn, keys) = (w.store.connection(), w.store.keys());
    let selected = dead_index::select(&conn, keys, &case.filter).await.unwrap();
    let entries = dead_index::read(&conn, keys, &selected).await.unwrap();
    let listed: Vec<String> = entries.iter().map(|e| e.print.clone()).collect();
    let oracle = case
        .letters
        .iter()
        .zip(&made)
        .filter(|(l, _)| l.selected_by(&case.filter))
        .map(|(_, p)| p);
    assert_eq!(
        bag(&listed),
        bag(oracle),
        "the filter selects {:?}",
        case.filter
    );
    let verb = if case.replay {
        Verb::Replay
    } else {
        Verb::Purge
    };
    let snapshot = dead_action::take(&conn, keys, verb, case.filter.describe(), selected)
        .await
        .unwrap();

    // arrivals after the confirmation, and during the action
    let mut arrived = Vec::new();
    for l in &case.before {
        arrived.push(w.make(l).await);
    }
    let during = async {
        let mut made = Vec::new();
        for l in &case.during {
            made.push(w.make(l).await);
        }
        made
    };
    let (carried, made_during) = tokio::join!(
        dead_action::carry_out(&w.conn, &w.store, &w.s, &snapshot.token),
        during
    );
    arrived.extend(made_during);
    let Carried::Done(outcome) = carried.unwrap() else {
        panic!("carried out");
    };
    assert_eq!(
        bag(&outcome.touched),
        bag(&listed),
        "touched what was listed"
    );
    assert_eq!(outcome.missing, 0);
    w.holds(made.len() + arrived.len() - listed.len()).await;

    // nothing else touched or lost: the queue is what was there less the listed,
    // and what arrived
    let after = w.queue().await;
    let mut want = bag(&made);
    for p in listed.iter().chain(&arrived) {
        *want.entry(p.clone()).or_default() += 0;
    }
    for p in &listed {
        *want.get_mut(p).unwrap() -= 1;
    }
    for p in &arrived {
        *want.get_mut(p).unwrap() += 1;
    }
    want.retain(|_, n| *n > 0);
    assert_eq!(bag(&after), want, "the rest kept, the arrivals too");
    if case.replay {
        assert_eq!(
            depth(&w.conn, &w.s.amqp.jobs_queue).await as usize,
            listed.len(),
            "replayed what was listed"
        );
    }
    // once only; and the list afterwards is the queue
    let again = dead_action::carry_out(&w.conn, &w.store, &w.s, &snapshot.token)
        .await
        .unwrap();
    assert!(matches!(again, Carried::Already(_)), "{again:?}");
    assert_eq!(bag(&w.listed().await), bag(&after), "the list is the queue");
}

#[test]
fn a_replay_or_purge_touches_exactly_what_its_confirmation_listed() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (_c, w) = rt.block_on(world());
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&case(), |case| {
            rt.block_on(run(&w, case));
            Ok(())
        })
        .unwrap();
}
