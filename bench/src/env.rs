//! What ties the benchmark to its surroundings: a free loopback port, the host and
//! port of a Redis URL, and [`Settings`] as the `QUOTA_WORKER__*` variables the
//! worker reads. Shared test support offers the same helpers; they stay together
//! here so that they can be swapped for it in one place.

use anyhow::Result;
use quota_worker::config::Settings;

/// A loopback TCP port nobody listens on right now.
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The host and port of a `redis://` URL (6379 when it names none).
pub fn url_host_port(url: &str) -> (String, String) {
    let rest = url.trim_start_matches("redis://");
    let hostport = rest
        .rsplit('@')
        .next()
        .unwrap_or(rest)
        .split('/')
        .next()
        .unwrap_or(rest);
    match hostport.rsplit_once(':') {
        Some((h, p)) => (h.to_string(), p.to_string()),
        None => (hostport.to_string(), "6379".into()),
    }
}

/// `s` as the worker's environment, its HTTP endpoint on `port`.
pub fn worker_env(s: &Settings, port: u16) -> Vec<(String, String)> {
    let a = &s.amqp;
    [
        ("AMQP__URL", a.url.clone()),
        ("AMQP__JOBS_EXCHANGE", a.jobs_exchange.clone()),
        ("AMQP__JOBS_QUEUE", a.jobs_queue.clone()),
        ("AMQP__DISPATCH_EXCHANGE", a.dispatch_exchange.clone()),
        (
            "AMQP__DISPATCH_QUEUE_PREFIX",
            a.dispatch_queue_prefix.clone(),
        ),
        ("AMQP__DEAD_EXCHANGE", a.dead_exchange.clone()),
        ("AMQP__DEAD_QUEUE", a.dead_queue.clone()),
        ("AMQP__DELAY_PREFIX", a.delay_prefix.clone()),
        ("AMQP__PREFETCH", a.prefetch.to_string()),
        ("REDIS__URL", s.redis.url.clone()),
        ("REDIS__KEY_PREFIX", s.redis.key_prefix.clone()),
        ("REDIS__CLUSTER", s.redis.cluster.to_string()),
        ("REDIS__CLUSTER_URLS", s.redis.cluster_urls.join(",")),
        ("WORKER__THREADS", s.worker.threads.to_string()),
        ("HTTP__ENABLED", "true".into()),
        ("HTTP__LISTEN", format!("127.0.0.1:{port}")),
    ]
    .into_iter()
    .map(|(k, v)| (format!("QUOTA_WORKER__{k}"), v))
    .collect()
}
