//! Shared test support: unique names per test, settings pointing at the machine's
//! RabbitMQ and Redis, and a guard that deletes everything a test created.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use quota_worker::config::Settings;

/// Redis for tests (override with QW_TEST_REDIS_URL).
pub fn redis_url() -> String {
    std::env::var("QW_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// RabbitMQ for tests (override with QW_TEST_AMQP_URL).
pub fn amqp_url() -> String {
    std::env::var("QW_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// A name no other test (or test run) uses.
pub fn unique(name: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "qwt-{name}-{}-{}-{}",
        std::process::id(),
        nanos % 100_000,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Default settings with every name (keys and queues) made unique for one test.
pub fn settings(ns: &str) -> Settings {
    let env = config::Environment::default().source(Some(HashMap::new()));
    let mut s = Settings::load_with_env(None, env).expect("defaults load");
    s.redis.url = redis_url();
    s.redis.key_prefix = ns.to_string();
    s.amqp.url = amqp_url();
    s.amqp.jobs_exchange = format!("{ns}.jobs");
    s.amqp.jobs_queue = format!("{ns}.jobs");
    s.amqp.dispatch_exchange = format!("{ns}.dispatch");
    s.amqp.dispatch_queue_prefix = format!("{ns}.dispatch.");
    s.amqp.dead_exchange = format!("{ns}.dead");
    s.amqp.dead_queue = format!("{ns}.dead");
    s.amqp.delay_prefix = format!("{ns}.delay");
    s.http.enabled = false;
    s
}

/// Deletes the test's Redis keys when dropped (also when the test panics).
pub struct RedisGuard(pub String);

impl Drop for RedisGuard {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(redis_url()) else { return };
        let Ok(mut conn) = client.get_connection() else { return };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.0))
            .query(&mut conn)
            .unwrap_or_default();
        for k in keys {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(k).query(&mut conn);
        }
    }
}
