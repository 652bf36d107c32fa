//! The one private RabbitMQ node of the broker scenarios (`broker_restart`,
//! `broker_hang`, `memory_alarm`, the soak): the node, the scenario's settings on it,
//! and the set-up they share.

use quota_worker::config::Settings;
use serde_json::json;
use testkit::procs;

use super::{fault_settings, publish_and_start, Loaded};

/// The private node, held for one scenario.
pub(crate) type NodeGuard = tokio::sync::MutexGuard<'static, (procs::RabbitNode, f64)>;

/// One private RabbitMQ node for the broker scenarios of this binary (its boot takes
/// 10 to 15 s here), and how long that boot took.
pub(crate) static NODE: tokio::sync::OnceCell<tokio::sync::Mutex<(procs::RabbitNode, f64)>> =
    tokio::sync::OnceCell::const_new();

/// The private node (started at the first call), or None where this machine has no
/// RabbitMQ to start one.
pub(crate) async fn private_node() -> Option<NodeGuard> {
    if !procs::RabbitNode::available() {
        eprintln!("SKIPPED: no /usr/lib/rabbitmq/bin/rabbitmq-server to start a private node");
        return None;
    }
    let cell = NODE
        .get_or_init(|| async {
            let mut node = procs::RabbitNode::new();
            let boot = node.start().await;
            eprintln!("private rabbitmq node {} up in {boot:?}", node.name);
            tokio::sync::Mutex::new((node, boot.as_secs_f64()))
        })
        .await;
    Some(cell.lock().await)
}

/// Thaws a frozen node when dropped, also when the test panics.
pub(crate) struct Thaw<'a>(pub(crate) &'a procs::RabbitNode);

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

/// A connection to a broker node a scenario started for itself (panics if it
/// cannot: the scenario has nothing to test without it).
pub(crate) async fn connect_node(url: &str) -> lapin::Connection {
    lapin::Connection::connect(url, lapin::ConnectionProperties::default())
        .await
        .expect("private node")
}

/// The private node for `scenario`, or None where there is none to start, with the
/// scenario recorded as skipped.
pub(crate) async fn private_node_or_skip(scenario: &str) -> Option<NodeGuard> {
    let guard = private_node().await;
    if guard.is_none() {
        testkit::reliability::record(
            json!({"scenario": scenario, "skipped": "no rabbitmq-server on this machine"}),
        );
    }
    guard
}

/// [`fault_settings`] for a scenario on the private node (`amqp.url` its URL).
pub(crate) fn node_settings(node: &procs::RabbitNode, ns: &str, rate: u64) -> Settings {
    let mut s = fault_settings(ns, rate);
    s.amqp.url = node.url();
    s
}

/// A broker scenario under way on the private node: `s`'s topology declared there,
/// a mix of `n` jobs published, a worker process started (its log in a temp dir
/// named `tag`).
pub(crate) async fn start_on_node(
    node: &procs::RabbitNode,
    s: &Settings,
    ns: &str,
    n: usize,
    tag: &str,
) -> Loaded {
    publish_and_start(connect_node(&node.url()).await, s, ns, n, tag).await
}
