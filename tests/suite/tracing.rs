//! Traces, end to end: `quota-worker run` exports its spans over OTLP/HTTP to a
//! receiver here, which decodes them with the `opentelemetry-proto` types (not the
//! worker's code). One job's trace from a publish with a `traceparent` through a
//! lane, a delay by its caps, the dispatch and `delivered` feedback; a collector that
//! is down changes nothing in what is dispatched (and the drops are counted);
//! `telemetry.parent = "link"`; a job without `traceparent` gets a trace of its own,
//! named in its note.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::types::{AMQPValue, FieldTable};
use lapin::BasicProperties;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;
use quota_worker::config::{PolicySettings, RuleSettings, Settings};
use quota_worker_producer::{Event, Feedback};
use testkit::procs::WorkerProc;
use testkit::*;

/// A span as received: ids in hex, attributes as strings.
#[derive(Debug, Clone)]
struct Got {
    trace: String,
    id: String,
    parent: String,
    name: String,
    kind: i32,
    attrs: HashMap<String, String>,
    links: Vec<String>,
    service: String,
    instance: String,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attrs.get(key).map(|s| s.as_str())
    }
}

/// A small OTLP/HTTP receiver: every span posted to `/v1/traces`.
struct Receiver {
    addr: SocketAddr,
    spans: Arc<Mutex<Vec<Got>>>,
    _server: tokio::task::JoinHandle<()>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

impl Receiver {
    async fn start() -> Receiver {
        let spans: Arc<Mutex<Vec<Got>>> = Arc::default();
        let sink = spans.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                let sink = sink.clone();
                async move {
                    let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    let mut out = sink.lock().unwrap();
                    for rs in req.resource_spans {
                        let service = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.name")
                            .map(|a| text(&a.value))
                            .unwrap_or_default();
                        let instance = rs
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|a| a.key == "service.instance.id")
                            .map(|a| text(&a.value))
                            .unwrap_or_default();
                        for ss in rs.scope_spans {
                            for s in ss.spans {
                                out.push(Got {
                                    trace: hex(&s.trace_id),
                                    id: hex(&s.span_id),
                                    parent: hex(&s.parent_span_id),
                                    name: s.name.clone(),
                                    kind: s.kind,
                                    attrs: s
                                        .attributes
                                        .iter()
                                        .map(|a| (a.key.clone(), text(&a.value)))
                                        .collect(),
                                    links: s.links.iter().map(|l| hex(&l.trace_id)).collect(),
                                    service: service.clone(),
                                    instance: instance.clone(),
                                });
                            }
                        }
                    }
                    axum::http::StatusCode::OK
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Receiver {
            addr,
            spans,
            _server: server,
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    /// Wait until `enough` holds for the spans received.
    async fn wait(&self, what: &str, enough: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let spans = self.spans();
            if enough(&spans) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: got {spans:#?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

fn traceparent() -> FieldTable {
    let mut h = FieldTable::default();
    let tp = format!("00-{TRACE}-{PRODUCER_SPAN}-01");
    h.insert("traceparent".into(), AMQPValue::LongString(tp.into()));
    h
}

fn job(id: &str, recipient: &str) -> Vec<u8> {
    format!(r#"{{"id":"{id}","recipient":"{recipient}","channel":"sms","category":"cart"}}"#)
        .into_bytes()
}

/// `sms` paced at 1/s (burst 1), and a `cart` policy of one send per 10 s.
/// Jobs published ahead of the traced one, each taking a second of the channel's rate.
const AHEAD: usize = 3;

fn paced(ns: &str) -> Settings {
    let mut s = settings(ns);
    let sms = s.channels.get_mut("sms").unwrap();
    sms.rate = Some(1);
    sms.burst = Some(1);
    s.policies.insert(
        "cart".into(),
        PolicySettings {
            rules: vec![RuleSettings {
                limit: 1,
                window: "10s".parse().unwrap(),
            }],
            ..Default::default()
        },
    );
    s
}

/// `quota-worker run` for `s`, exporting to `endpoint`, with `extra` variables.
fn run(s: &Settings, dir: &std::path::Path, endpoint: &str, extra: &[(&str, &str)]) -> WorkerProc {
    run_tagged(s, dir, endpoint, extra, "0")
}

/// [`run`], the worker's log named by `tag`.
fn run_tagged(
    s: &Settings,
    dir: &std::path::Path,
    endpoint: &str,
    extra: &[(&str, &str)],
    tag: &str,
) -> WorkerProc {
    let mut env = testkit::env::worker_env(s);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.into()));
    env.push((
        "QUOTA_WORKER__TELEMETRY__EXPORT_INTERVAL".into(),
        "100ms".into(),
    ));
    for (k, v) in extra {
        env.push((k.to_string(), v.to_string()));
    }
    WorkerProc::spawn_env(crate::BIN, s, dir, tag, env)
}

/// Wait until the worker consumes its jobs queue (its topology is declared).
pub(crate) async fn consuming(conn: &lapin::Connection, s: &Settings, w: &WorkerProc) {
    let queue = s.amqp.jobs_queue.clone();
    for _ in 0..300 {
        if testkit::audit::consumers(conn, &queue).await.unwrap_or(0) > 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the worker does not consume:\n{}", w.tail(30));
}

fn with_parent<'a>(spans: &'a [Got], parent: &str) -> Vec<&'a Got> {
    spans.iter().filter(|g| g.parent == parent).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_from_the_publish_through_a_lane_a_delay_the_dispatch_and_the_feedback() {
    one_trace(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_trace_across_three_workers() {
    one_trace(3).await;
}

/// A traced job parked in its lane, delayed by its cap, dispatched and answered
/// `delivered`, with `workers` workers exporting to one receiver: one trace, its
/// spans chained parent to child in that order.
async fn one_trace(workers: usize) {
    let ns = unique("trace");
    let s = paced(&ns);
    let _c = Cleanup::new(&s);
    let dir = temp_dir(&ns);
    let receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let mut procs: Vec<WorkerProc> = (0..workers)
        .map(|i| run_tagged(&s, &dir, &endpoint, &[], &i.to_string()))
        .collect();
    let conn = amqp().await;
    for w in &procs {
        consuming(&conn, &s, w).await;
    }
    let w = &procs[0];
    // three jobs ahead take the channel's tokens (one a second), so the traced one
    // waits about three seconds in its lane; once it is parked, an email to its
    // recipient fills its cap (one in 10 s), so from the lane it is delayed by the cap
    for i in 0..AHEAD {
        publish(&conn, &s, &job(&format!("{ns}-first{i}"), &format!("x{i}"))).await;
    }
    let id = format!("{ns}-traced");
    let props = BasicProperties::default().with_headers(traceparent());
    publish_with(&conn, &s, &job(&id, "r"), props).await;
    // once it is parked (its span exported), the email fills the recipient's cap
    receiver
        .wait("the traced job parked", |spans| {
            spans
                .iter()
                .any(|g| g.trace == TRACE && g.attr("quota.outcome") == Some("parked"))
        })
        .await;
    let email =
        format!(r#"{{"id":"{ns}-email","recipient":"r","channel":"email","category":"cart"}}"#);
    publish(&conn, &s, email.as_bytes()).await;
    let emails = format!("{}email", s.amqp.dispatch_queue_prefix);
    take(&conn, &emails, Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("the email dispatched:\n{}", w.tail(30)));
    let q = format!("{}sms", s.amqp.dispatch_queue_prefix);
    let mut sent = None;
    for _ in 0..AHEAD + 1 {
        let m = take(&conn, &q, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("a dispatch:\n{}", w.tail(30)));
        if message_id(&m) == id {
            sent = Some(m);
        }
    }
    let sent = sent.expect("the traced job dispatched");
    let carried =
        header(&sent.properties, "traceparent").expect("the dispatch carries a traceparent");
    assert!(carried.starts_with(&format!("00-{TRACE}-")), "{carried}");
    // the sender answers `delivered`, continuing the trace
    let f = Feedback::new(&id, Event::Delivered, "r", "sms");
    let mut h = FieldTable::default();
    h.insert(
        "traceparent".into(),
        AMQPValue::LongString(carried.clone().into()),
    );
    let body = serde_json::to_vec(&f).unwrap();
    let p = quota_worker::amqp::Publisher::open(&conn, Duration::from_secs(10))
        .await
        .unwrap();
    p.publish(
        &s.feedback.exchange,
        "",
        &body,
        BasicProperties::default().with_headers(h),
    )
    .await
    .unwrap();
    let spans = receiver
        .wait("the feedback's span", |spans| {
            spans
                .iter()
                .any(|g| g.attr("quota.feedback") == Some("delivered"))
        })
        .await;
    let ours: Vec<Got> = spans.iter().filter(|g| g.trace == TRACE).cloned().collect();
    // walk the chain: each process span's parent is the send span before it
    let mut parent = PRODUCER_SPAN.to_string();
    let mut outcomes = Vec::new();
    loop {
        let process = with_parent(&ours, &parent);
        let Some(p) = process.iter().find(|g| g.name.starts_with("process ")) else {
            break;
        };
        assert_eq!(p.kind, SpanKind::Consumer as i32, "{p:?}");
        assert_eq!(p.attr("messaging.system"), Some("rabbitmq"));
        assert_eq!(p.attr("messaging.operation.name"), Some("process"));
        assert_eq!(p.attr("messaging.message.id"), Some(id.as_str()), "{p:?}");
        assert_eq!(p.service, "quota-worker");
        assert!(p.attrs.keys().all(|k| !k.contains("recipient")), "{p:?}");
        assert!(
            p.attrs.values().all(|v| v != "r"),
            "no recipient on a span: {p:?}"
        );
        let outcome = p
            .attr("quota.outcome")
            .or(p.attr("quota.feedback"))
            .unwrap_or("?")
            .to_string();
        match outcome.as_str() {
            "parked" => assert_eq!(p.attr("quota.lane"), Some("normal"), "{p:?}"),
            "delayed" => {
                assert_eq!(p.attr("quota.reason"), Some("cap"), "{p:?}");
                assert!(
                    p.attr("quota.held_by").is_some_and(|h| h.contains("cart")),
                    "{p:?}"
                );
                assert!(p.attr("quota.next_allowed_at").is_some(), "{p:?}");
                assert_eq!(p.attr("quota.policy"), Some("cart"));
            }
            _ => {}
        }
        outcomes.push(outcome.clone());
        let sends = with_parent(&ours, &p.id);
        let Some(send) = sends.iter().find(|g| g.name.starts_with("send ")) else {
            break;
        };
        assert_eq!(send.kind, SpanKind::Producer as i32, "{send:?}");
        assert_eq!(send.attr("messaging.operation.name"), Some("send"));
        assert_eq!(send.attr("messaging.message.id"), Some(id.as_str()));
        assert!(send
            .attr("messaging.rabbitmq.destination.routing_key")
            .is_some());
        if outcome == "dispatched" {
            assert_eq!(send.name, format!("send {}", s.amqp.dispatch_exchange));
            assert_eq!(carried, format!("00-{TRACE}-{}-01", send.id));
        }
        parent = send.id.clone();
    }
    assert_eq!(
        outcomes,
        ["parked", "delayed", "dispatched", "delivered"],
        "the chain of spans: {ours:#?}"
    );
    assert_eq!(
        ours.iter()
            .find(|g| g.attr("quota.outcome") == Some("parked"))
            .unwrap()
            .name,
        format!("process {}", s.amqp.jobs_queue)
    );
    // the untraced first job has a trace of its own
    assert!(spans.iter().any(
        |g| g.trace != TRACE && g.attr("messaging.message.id") == Some(&format!("{ns}-first0"))
    ));
    if workers > 1 {
        // the handlings were spread over the workers: each exported its own spans
        let instances: std::collections::BTreeSet<&str> =
            ours.iter().map(|g| g.instance.as_str()).collect();
        println!(
            "{workers} workers: {} spans in the trace, from {} of them",
            ours.len(),
            instances.len()
        );
        assert!(instances.iter().all(|i| !i.is_empty()));
    }
    for w in &mut procs {
        w.stop();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_changes_nothing_in_what_is_dispatched() {
    collector_trouble(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_never_answers_changes_nothing_in_what_is_dispatched() {
    collector_trouble(true).await;
}

/// 50 traced jobs, every one dispatched at once, while the collector is down
/// (`hangs`: accepts connections and never answers); the spans lost are counted.
async fn collector_trouble(hangs: bool) {
    let ns = unique("trace-down");
    let mut s = settings(&ns);
    s.http.enabled = true;
    s.http.listen = format!("127.0.0.1:{}", free_port(None));
    let _c = Cleanup::new(&s);
    let dir = temp_dir(&ns);
    let down = if hangs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        format!("http://{addr}")
    } else {
        // nothing listens there
        format!("http://127.0.0.1:{}", free_port(None))
    };
    let mut env = testkit::env::env_for(&s);
    env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), down));
    env.push((
        "QUOTA_WORKER__TELEMETRY__EXPORT_INTERVAL".into(),
        "100ms".into(),
    ));
    env.push(("QUOTA_WORKER__TELEMETRY__MAX_QUEUE_SIZE".into(), "8".into()));
    let mut w = WorkerProc::spawn_env(crate::BIN, &s, &dir, "0", env);
    let conn = amqp().await;
    consuming(&conn, &s, &w).await;
    let n = 50;
    for i in 0..n {
        let body = format!(r#"{{"id":"{ns}-{i}","recipient":"r{i}","channel":"sms"}}"#);
        let props = BasicProperties::default().with_headers(traceparent());
        publish_with(&conn, &s, body.as_bytes(), props).await;
    }
    let q = format!("{}sms", s.amqp.dispatch_queue_prefix);
    let started = std::time::Instant::now();
    for _ in 0..n {
        take(&conn, &q, Duration::from_secs(20))
            .await
            .unwrap_or_else(|| panic!("every job dispatched:\n{}", w.tail(30)));
    }
    // a hanging export holds nothing: the exporter's timeout is 10 s
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let addr = s.http.listen.clone();
    let mut dropped = 0.0;
    for _ in 0..50 {
        if let Some((200, text)) = http_get(&addr, "/metrics").await {
            dropped = text
                .lines()
                .find(|l| l.starts_with("quota_worker_trace_spans_dropped_total"))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            if dropped >= n as f64 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        dropped >= n as f64,
        "dropped spans counted: {dropped}\n{}",
        w.tail(20)
    );
    w.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_link_mode_a_handling_starts_its_own_trace_linked_to_the_carried_one() {
    let ns = unique("trace-link");
    let s = settings(&ns);
    let _c = Cleanup::new(&s);
    let dir = temp_dir(&ns);
    let receiver = Receiver::start().await;
    let endpoint = format!("http://{}", receiver.addr);
    let mut w = run(
        &s,
        &dir,
        &endpoint,
        &[
            ("QUOTA_WORKER__TELEMETRY__PARENT", "link"),
            ("OTEL_SERVICE_NAME", "qw-link"),
        ],
    );
    let conn = amqp().await;
    consuming(&conn, &s, &w).await;
    let id = format!("{ns}-linked");
    let body = format!(r#"{{"id":"{id}","recipient":"r","channel":"sms"}}"#);
    publish_with(
        &conn,
        &s,
        body.as_bytes(),
        BasicProperties::default().with_headers(traceparent()),
    )
    .await;
    let spans = receiver
        .wait("the process span", |spans| {
            spans
                .iter()
                .any(|g| g.name.starts_with("process ") && g.attr("quota.outcome").is_some())
        })
        .await;
    let p = spans
        .iter()
        .find(|g| g.name.starts_with("process "))
        .unwrap();
    assert_ne!(p.trace, TRACE);
    assert_eq!(p.parent, "");
    assert_eq!(p.links, [TRACE]);
    assert_eq!(p.service, "qw-link");
    assert_eq!(p.attr("quota.outcome"), Some("dispatched"));
    // log lines inside a handling name its trace and span (a dead letter logs one)
    let dead = format!(r#"{{"id":"{ns}-dead","recipient":"r","channel":"fax"}}"#);
    publish(&conn, &s, dead.as_bytes()).await;
    let spans = receiver
        .wait("the dead letter's span", |spans| {
            spans
                .iter()
                .any(|g| g.attr("quota.outcome") == Some("dead"))
        })
        .await;
    let d = spans
        .iter()
        .find(|g| g.attr("quota.outcome") == Some("dead"))
        .unwrap();
    assert_eq!(d.attr("quota.reason"), Some("unknown_channel"));
    let send = spans
        .iter()
        .find(|g| g.parent == d.id)
        .expect("the dead letter's send span");
    assert_eq!(send.name, format!("send {}", s.amqp.dead_exchange));
    let log = std::fs::read_to_string(&w.log).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("dead-lettered"))
        .unwrap_or_else(|| panic!("{}", w.tail(20)));
    assert!(
        line.contains(&format!(r#""trace_id":"{}""#, d.trace)),
        "{line}"
    );
    assert!(line.contains(&format!(r#""span_id":"{}""#, d.id)), "{line}");
    w.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_without_traceparent_gets_a_trace_of_its_own_named_in_its_note() {
    let ns = unique("trace-own");
    let s = paced(&ns);
    let _c = Cleanup::new(&s);
    let dir = temp_dir(&ns);
    let receiver = Receiver::start().await;
    let mut w = run(&s, &dir, &format!("http://{}", receiver.addr), &[]);
    let conn = amqp().await;
    consuming(&conn, &s, &w).await;
    // the second job of the recipient is delayed by the cap: noted
    publish(&conn, &s, &job(&format!("{ns}-a"), "own")).await;
    let id = format!("{ns}-b");
    publish(&conn, &s, &job(&id, "own")).await;
    let spans = receiver
        .wait("the delayed job's span", |spans| {
            spans.iter().any(|g| {
                g.attr("messaging.message.id") == Some(id.as_str())
                    && g.attr("quota.outcome") == Some("delayed")
            })
        })
        .await;
    let p = spans
        .iter()
        .find(|g| {
            g.attr("messaging.message.id") == Some(id.as_str())
                && g.attr("quota.outcome") == Some("delayed")
        })
        .unwrap();
    assert_eq!(p.parent, "");
    let out = crate::cli::qw(&s, &["admin", "job", &id]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("trace:       {}", p.trace)),
        "{text}"
    );
    w.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_step_of_a_route_has_its_send_span_with_its_step_and_cause() {
    let ns = unique("trace-route");
    let mut s = settings(&ns);
    s.policies.get_mut("default").unwrap().rules.clear();
    s.policies.get_mut("default").unwrap().fallback =
        Some(quota_worker::config::FallbackSettings {
            on: Some(vec!["unanswered".into()]),
            wait_at_most: None,
            answer_within: Some(quota_worker::config::Dur(Duration::from_secs(1))),
            answered_by: None,
        });
    let _c = Cleanup::new(&s);
    let dir = temp_dir(&ns);
    let receiver = Receiver::start().await;
    let mut w = run(&s, &dir, &format!("http://{}", receiver.addr), &[]);
    let conn = amqp().await;
    consuming(&conn, &s, &w).await;
    let id = format!("{ns}-routed");
    let body = format!(r#"{{"id":"{id}","recipient":"r","channel":"push","fallback":["email"]}}"#);
    publish_with(
        &conn,
        &s,
        body.as_bytes(),
        BasicProperties::default().with_headers(traceparent()),
    )
    .await;
    let dispatch = format!("send {}", s.amqp.dispatch_exchange);
    let spans = receiver
        .wait("both steps' send spans", |spans| {
            spans
                .iter()
                .filter(|g| g.name == dispatch && g.attr("quota.route.step").is_some())
                .count()
                >= 2
        })
        .await;
    let mut steps: Vec<(String, Option<String>, String)> = spans
        .iter()
        .filter(|g| g.name == dispatch)
        .map(|g| {
            let key = g.attr("messaging.rabbitmq.destination.routing_key");
            (
                g.attr("quota.route.step").unwrap_or_default().to_string(),
                g.attr("quota.fallback.cause").map(str::to_string),
                key.unwrap_or_default().to_string(),
            )
        })
        .collect();
    steps.sort();
    assert_eq!(
        steps,
        [
            ("1".into(), None, "push".into()),
            ("2".into(), Some("unanswered".into()), "email".into())
        ]
    );
    assert!(spans.iter().all(|g| g.trace == TRACE || g.name != dispatch));
    let _ = w.stop();
}
