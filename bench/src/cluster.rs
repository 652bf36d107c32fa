//! The Redis Cluster of `--redis-cluster`: its nodes' URLs, set once at the start of
//! the run. With them, CPU is summed over the nodes ([`crate::sample`]) and keys are
//! deleted node by node ([`crate::teardown`]).

use std::sync::OnceLock;

static NODES: OnceLock<Vec<String>> = OnceLock::new();

/// Runs the worker on these nodes from now on.
pub fn set(urls: Vec<String>) {
    NODES.set(urls).ok();
}

/// The nodes (empty: one Redis, `--redis`).
pub fn urls() -> &'static [String] {
    NODES.get().map(Vec::as_slice).unwrap_or_default()
}
