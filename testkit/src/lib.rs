//! What the integration tests (`tests/suite`, `tests/faults`) and the benchmark share,
//! compiled once: the tests' RabbitMQ and Redis (`QW_TEST_AMQP_URL`,
//! `QW_TEST_REDIS_URL`), names no other test uses, free loopback ports, and a guard
//! that deletes everything a test created. Then, by module:
//!
//! - [`env`]: a [`Settings`] as the environment (and the file) of a `quota-worker`
//!   process;
//! - [`procs`]: processes a test starts and must not leave behind (`redis-server`
//!   nodes, clusters and Sentinel groups, private RabbitMQ nodes, the worker binary);
//! - [`proxy`]: a TCP proxy that can cut every connection through it at once;
//! - [`pki`]: certificates for the TLS tests;
//! - [`audit`]: the audit that finds every published job exactly once;
//! - [`limit_log`]: the limits checked over every window against what was sent;
//! - [`catch_up`]: how long the queues take to be back at their depth after a fault;
//! - [`reliability`]: the figures the fault scenarios write into RELIABILITY.md;
//! - [`timeline`]: series over time drawn as an SVG (the soak's plot);
//! - [`browser`]: headless Chromium, for the pages the worker serves.
//!
//! Nothing here knows where the `quota-worker` binary is (only a test target does, by
//! `env!("CARGO_BIN_EXE_quota-worker")`): what runs it takes its path.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lapin::options::BasicGetOptions;
use lapin::types::FieldTable;
use lapin::{BasicProperties, Connection, ConnectionProperties};
use quota_worker::amqp::{Publisher, Topology};
use quota_worker::config::Settings;
use quota_worker::lanes::fair;
use quota_worker::quota::keys::Keys;
use quota_worker::store::QuotaStore;
use quota_worker::worker::Worker;
use tokio_util::sync::CancellationToken;

pub mod audit;
pub mod browser;
pub mod catch_up;
pub mod clock;
pub mod env;
pub mod limit_log;
pub mod pki;
pub mod procs;
pub mod proxy;
pub mod reliability;
pub mod timeline;

/// Redis for tests (override with QW_TEST_REDIS_URL).
pub fn redis_url() -> String {
    std::env::var("QW_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// A plain connection to the tests' Redis, for looking at keys.
pub fn redis_sync() -> redis::Connection {
    redis::Client::open(redis_url())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// RabbitMQ for tests (override with QW_TEST_AMQP_URL).
pub fn amqp_url() -> String {
    std::env::var("QW_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

/// The host and port of a `redis://` URL (6379 when it names none).
pub fn redis_host_port(url: &str) -> (String, String) {
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
    let mut s = Settings::defaults().in_namespace(ns);
    s.redis.url = redis_url();
    s.amqp.url = amqp_url();
    s.http.enabled = false;
    s
}

/// A loopback port nobody listens on (and, with `plus`, `port + plus` as well).
pub fn free_port(plus: Option<u16>) -> u16 {
    for _ in 0..200 {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().unwrap().port();
        let Some(off) = plus else { return port };
        if port.checked_add(off).is_none() {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port + off)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair");
}

/// Whether something accepts TCP connections on `port`.
pub fn port_open(port: u16) -> bool {
    std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// Deletes the test's Redis keys when dropped (also when the test panics).
pub struct RedisGuard(pub String);

impl Drop for RedisGuard {
    fn drop(&mut self) {
        let Ok(client) = redis::Client::open(redis_url()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.0))
            .query(&mut conn)
            .unwrap_or_default();
        for k in keys {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(k).query(&mut conn);
        }
    }
}

/// Connect to the test broker.
pub async fn amqp() -> Connection {
    Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("rabbitmq at 127.0.0.1:5672")
}

/// Every queue and exchange name of a test's topology.
pub fn topology(s: &Settings) -> Topology {
    Topology::from_settings(s)
}

/// Deletes a test's queues and exchanges (and Redis keys) when dropped.
pub struct Cleanup {
    settings: Settings,
    _redis: RedisGuard,
}

impl Cleanup {
    /// Guard everything `settings` names.
    pub fn new(settings: &Settings) -> Cleanup {
        Cleanup {
            settings: settings.clone(),
            _redis: RedisGuard(settings.redis.key_prefix.clone()),
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let s = self.settings.clone();
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let Ok(conn) =
                    Connection::connect(&amqp_url(), ConnectionProperties::default()).await
                else {
                    return;
                };
                let _ = topology(&s).delete(&conn).await;
                for queue in tenant_queues(&s) {
                    if let Ok(ch) = conn.create_channel().await {
                        let _ = ch
                            .queue_delete(queue.as_str().into(), Default::default())
                            .await;
                    }
                }
                let _ = conn.close(200, "cleanup".into()).await;
            });
        })
        .join();
    }
}

/// The tenants' queues the workers of `s` registered in their channels' sets
/// (`lanes::tenants`; the topology knows only the queues it declares), read
/// before the guard deletes the keys.
fn tenant_queues(s: &Settings) -> Vec<String> {
    let Ok(mut redis) = redis::Client::open(redis_url()).and_then(|c| c.get_connection()) else {
        return Vec::new();
    };
    let t = topology(s);
    let keys = Keys::new(&s.redis.key_prefix, "");
    let mut queues = Vec::new();
    for channel in &t.laned {
        let entries: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.fair_queues(channel))
            .arg(0)
            .arg(-1)
            .query(&mut redis)
            .unwrap_or_default();
        for entry in entries {
            if let Some((lane, tenant)) = fair::parse_entry(&entry) {
                queues.push(t.tenant_queue(channel, lane, tenant));
            }
        }
    }
    queues
}

/// A worker for `settings`, its engine connected, its topology declared.
pub async fn worker(s: &Settings) -> Arc<Worker> {
    let engine = Arc::new(QuotaStore::connect(s).await.expect("redis"));
    let w = Arc::new(Worker::new(s.clone(), engine));
    let conn = amqp().await;
    w.topology().declare(&conn).await.expect("topology");
    let _ = conn.close(200, "".into()).await;
    w
}

/// What most pipeline tests start with: the clean-up guard for `s`, a worker with
/// its topology declared, and a broker connection.
pub async fn rig(s: &Settings) -> (Cleanup, Arc<Worker>, Connection) {
    let c = Cleanup::new(s);
    (c, worker(s).await, amqp().await)
}

/// Run `worker` in the background until the returned token is cancelled.
pub async fn spawn_worker(worker: Arc<Worker>) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let token = CancellationToken::new();
    let t = token.clone();
    let w = worker.clone();
    let handle = tokio::spawn(async move {
        w.run(t).await.expect("worker run");
    });
    for _ in 0..100 {
        if worker
            .health
            .broker
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (token, handle)
}

/// Publish a job body (confirmed) to the jobs exchange.
pub async fn publish(conn: &Connection, s: &Settings, body: &[u8]) {
    publish_with(
        conn,
        s,
        body,
        BasicProperties::default().with_content_type("application/json".into()),
    )
    .await
}

/// Publish with the given properties.
pub async fn publish_with(conn: &Connection, s: &Settings, body: &[u8], props: BasicProperties) {
    let p = Publisher::open(conn, Duration::from_secs(10))
        .await
        .unwrap();
    p.publish(&s.amqp.jobs_exchange, "", body, props)
        .await
        .expect("publish job");
}

/// Take one message from `queue`, waiting up to `wait` for it (acked).
pub async fn take(
    conn: &Connection,
    queue: &str,
    wait: Duration,
) -> Option<lapin::message::BasicGetMessage> {
    let ch = conn.create_channel().await.unwrap();
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions { no_ack: true })
            .await
            .unwrap()
        {
            return Some(m);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `queue` as the broker sees it now (a passive declare on a channel of its own), or
/// None when the queue or the connection is not there.
pub async fn inspect(conn: &Connection, queue: &str) -> Option<lapin::Queue> {
    let ch = conn.create_channel().await.ok()?;
    let q = ch
        .queue_declare(
            queue.into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .ok()?;
    let _ = ch.close(200, "".into()).await;
    Some(q)
}

/// Number of ready messages in `queue`.
pub async fn depth(conn: &Connection, queue: &str) -> u32 {
    inspect(conn, queue)
        .await
        .unwrap_or_else(|| panic!("queue {queue} is not there"))
        .message_count()
}

/// A header of a message as text.
/// The `message_id` of a message taken from a queue ("" when it has none).
pub fn message_id(m: &lapin::message::BasicGetMessage) -> &str {
    m.delivery
        .properties
        .message_id()
        .as_ref()
        .map_or("", |s| s.as_str())
}

pub fn header(props: &BasicProperties, name: &str) -> Option<String> {
    let h = props.headers().as_ref()?;
    let v = h.inner().get(name)?;
    quota_worker::job::headers::as_string(v)
        .or_else(|| quota_worker::job::headers::as_i64(v).map(|i| i.to_string()))
}

/// Take the next job from the jobs queue and run it through the worker once
/// (`Worker::process`, the one-step entry point).
pub async fn step(w: &Worker, conn: &Connection, s: &Settings) -> quota_worker::job::Outcome {
    let m = take(conn, &s.amqp.jobs_queue, Duration::from_secs(10))
        .await
        .expect("a job in the jobs queue");
    let p = Publisher::open(conn, Duration::from_secs(10))
        .await
        .unwrap();
    let (session, committer) = w.session_context(p, CancellationToken::new());
    let outcome = w
        .process(&session, &m.delivery)
        .await
        .expect("outcome confirmed");
    drop(session);
    committer.await.unwrap();
    outcome
}

/// GET `path` on `addr` (HTTP/1.1, no client library): (status, body), or `None`
/// when nothing listens or nothing answers within 5 s.
pub async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut raw))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let chunked = head.lines().any(|l| {
        l.to_ascii_lowercase()
            .starts_with("transfer-encoding: chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Some((status, body))
}

/// A chunked HTTP/1.1 body, joined (a large answer, e.g. Prometheus's, comes so).
fn dechunk(mut rest: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, tail) = rest.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(tail.get(..size)?);
        rest = tail.get(size + 2..)?;
    }
}

/// Poll `check` every 100 ms until it holds; panic naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + timeout;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A fresh directory under the system temp dir, removed once the test process exits
/// (kept with `QW_KEEP_TMP=1`, e.g. to read the worker logs of a failed scenario).
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    use std::os::unix::process::CommandExt;
    let dir = std::env::temp_dir().join(unique(name));
    std::fs::create_dir_all(&dir).expect("temp dir");
    if std::env::var("QW_KEEP_TMP").is_ok_and(|v| v == "1") {
        eprintln!("keeping {}", dir.display());
        return dir;
    }
    let script = r#"while kill -0 "$1" 2>/dev/null; do sleep 1; done; case "$2" in */qwt-*) rm -rf -- "$2";; esac"#;
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("qw-dir-watchdog")
        .arg(std::process::id().to_string())
        .arg(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
    dir
}
