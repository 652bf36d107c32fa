//! Processes a test starts and must not leave behind: a private `redis-server`, a
//! three-master Redis Cluster (with or without a replica per master), a Sentinel
//! group (master, replica, three sentinels), a private RabbitMQ node, and the
//! worker binary.
//!
//! Every process is killed when its handle drops. Because a handle kept in a static
//! (the shared cluster) never drops, and a test process can itself be killed, each
//! process also gets a watchdog: a tiny `sh` loop that kills it (by pid or process
//! group, nothing broader) once the test process is gone. Temp dirs get one too.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use quota_worker::config::Settings;

use crate::env::{env_for, worker_env, worker_toml};
use crate::{free_port, port_open, temp_dir};

/// Kill `pid` (or its process group) once this test process has exited, unless it
/// has exited first. `comm` guards against a recycled pid. (`sh` may be dash, whose
/// `kill` takes a negative pid for a group but no `--`.)
fn watchdog(pid: u32, group: bool, comm: &str) {
    let script = r#"
t=$1; c=$2; g=$3; comm=$4
while kill -0 "$t" 2>/dev/null; do
  if [ "$g" = 1 ]; then kill -0 "-$c" 2>/dev/null || exit 0
  else kill -0 "$c" 2>/dev/null || exit 0; fi
  sleep 0.5
done
if [ "$g" = 1 ]; then kill -9 "-$c" 2>/dev/null
elif [ "$(cat /proc/$c/comm 2>/dev/null)" = "$comm" ]; then kill -9 "$c" 2>/dev/null; fi
"#;
    let _ = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("qw-watchdog")
        .arg(std::process::id().to_string())
        .arg(pid.to_string())
        .arg(if group { "1" } else { "0" })
        .arg(comm)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
}

/// Send `signal` (e.g. "TERM", "KILL", "STOP", "CONT") to one pid, or to a process
/// group when `pid` is given negative as text.
pub fn signal(target: &str, signal: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg("--")
        .arg(target)
        .stderr(Stdio::null())
        .status();
}

fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------
// Redis

/// A private `redis-server` on a loopback port, in its own temp dir. Its data
/// survives [`RedisServer::stop`] + [`RedisServer::start`] (it saves on shutdown and
/// loads `dump.rdb` at start), as a Redis with persistence would.
pub struct RedisServer {
    /// Its port (plaintext; with TLS also on, the tests' own probe uses it).
    pub port: u16,
    dir: PathBuf,
    cluster: bool,
    /// `cluster-node-timeout` (ms) of a cluster node: how long a master may be
    /// unreachable before its replica takes over.
    node_timeout_ms: u32,
    tls: Option<RedisTls>,
    /// `appendfsync` when the append-only file is on (see [`RedisServer::with_aof`]).
    aof: Option<&'static str>,
    child: Option<Child>,
}

/// A TLS listener of a private `redis-server`.
struct RedisTls {
    port: u16,
    args: Vec<String>,
}

impl RedisServer {
    /// Start a single node (`cluster = false`) or a cluster-enabled empty node.
    pub fn new(cluster: bool) -> RedisServer {
        for _ in 0..5 {
            let port = free_port(cluster.then_some(10_000));
            let mut r = RedisServer {
                port,
                dir: temp_dir(&format!("redis-{port}")),
                cluster,
                node_timeout_ms: 5000,
                tls: None,
                aof: None,
                child: None,
            };
            if r.start().is_ok() {
                return r;
            }
        }
        panic!("could not start redis-server");
    }

    /// A single node with the append-only file on (`appendonly yes`, `appendfsync`
    /// as given): a [`RedisServer::stop`] (SHUTDOWN, which writes and fsyncs the AOF)
    /// and [`RedisServer::start`] bring back every write it acknowledged.
    pub fn with_aof(appendfsync: &'static str) -> RedisServer {
        for _ in 0..5 {
            let port = free_port(None);
            let mut r = RedisServer {
                port,
                dir: temp_dir(&format!("redis-aof-{port}")),
                cluster: false,
                node_timeout_ms: 5000,
                tls: None,
                aof: Some(appendfsync),
                child: None,
            };
            if r.start().is_ok() {
                return r;
            }
        }
        panic!("could not start redis-server with an AOF");
    }

    /// A cluster-enabled empty node whose master fails over after `node_timeout_ms`.
    pub fn cluster_node(node_timeout_ms: u32) -> RedisServer {
        for _ in 0..5 {
            let port = free_port(Some(10_000));
            let mut r = RedisServer {
                port,
                dir: temp_dir(&format!("redis-{port}")),
                cluster: true,
                node_timeout_ms,
                tls: None,
                aof: None,
                child: None,
            };
            if r.start().is_ok() {
                return r;
            }
        }
        panic!("could not start redis-server");
    }

    /// A single node on `port` (a test that points a worker at it before it runs).
    pub fn at_port(port: u16) -> RedisServer {
        let mut r = RedisServer {
            port,
            dir: temp_dir(&format!("redis-{port}")),
            cluster: false,
            node_timeout_ms: 5000,
            tls: None,
            aof: None,
            child: None,
        };
        r.start().expect("redis-server on the chosen port");
        r
    }

    /// A single node that also listens with TLS (`--tls-port`), with `pki`'s server
    /// certificate; `require_client_cert`: clients must present one signed by its CA.
    pub fn with_tls(pki: &crate::pki::Pki, require_client_cert: bool) -> RedisServer {
        let path = |p: &Path| p.to_str().unwrap().to_string();
        for _ in 0..5 {
            let port = free_port(None);
            let tls_port = free_port(None);
            let auth = if require_client_cert { "yes" } else { "no" };
            let mut r = RedisServer {
                port,
                dir: temp_dir(&format!("redis-tls-{port}")),
                cluster: false,
                node_timeout_ms: 5000,
                tls: Some(RedisTls {
                    port: tls_port,
                    args: vec![
                        "--tls-port".into(),
                        tls_port.to_string(),
                        "--tls-cert-file".into(),
                        path(&pki.server_cert),
                        "--tls-key-file".into(),
                        path(&pki.server_key),
                        "--tls-ca-cert-file".into(),
                        path(&pki.ca),
                        "--tls-auth-clients".into(),
                        auth.into(),
                    ],
                }),
                aof: None,
                child: None,
            };
            if r.start().is_ok() && port_open(tls_port) {
                return r;
            }
        }
        panic!("could not start redis-server with TLS");
    }

    /// A single node with an ACL user `user` (password `password`) that may run
    /// every command on every key; the default user stays for the tests' probe.
    pub fn with_acl(user: &str, password: &str) -> RedisServer {
        let r = RedisServer::new(false);
        let _: () = redis::cmd("ACL")
            .arg("SETUSER")
            .arg(user)
            .arg("on")
            .arg(format!(">{password}"))
            .arg("~*")
            .arg("&*")
            .arg("+@all")
            .query(&mut r.connection())
            .expect("ACL SETUSER");
        r
    }

    /// Its TLS URL (`rediss://localhost:<tls port>`), when it listens with TLS.
    pub fn tls_url(&self) -> String {
        let tls = self.tls.as_ref().expect("a TLS listener");
        format!("rediss://localhost:{}", tls.port)
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Start (again) on the same port and dir; Ok once it answers PING.
    pub fn start(&mut self) -> Result<(), String> {
        let d = self.dir.to_str().unwrap();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--dir", d]);
        match self.aof {
            Some(fsync) => cmd.args(["--appendonly", "yes", "--appendfsync", fsync]),
            None => cmd.args(["--appendonly", "no"]),
        };
        cmd.args(["--dbfilename", "dump.rdb", "--daemonize", "no"])
            .args(["--logfile", &format!("{d}/redis.log")]);
        if let Some(tls) = &self.tls {
            cmd.args(&tls.args);
        }
        if self.cluster {
            cmd.args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("{d}/nodes.conf")])
                .args(["--cluster-node-timeout", &self.node_timeout_ms.to_string()]);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        watchdog(child.id(), false, "redis-server");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return Err("redis-server exited".into());
            }
            if self.ping() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(30));
        }
        Err("redis-server did not answer".into())
    }

    /// Whether it answers PING.
    pub fn ping(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(300)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut c).is_ok()
    }

    /// A plain connection to this node.
    pub fn connection(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// Stop it, saving its data (SHUTDOWN SAVE), and wait for the process to exit.
    pub fn stop(&mut self) {
        if let Ok(client) = redis::Client::open(self.url()) {
            if let Ok(mut c) = client.get_connection_with_timeout(Duration::from_secs(2)) {
                let _: redis::RedisResult<()> = redis::cmd("SHUTDOWN").arg("SAVE").query(&mut c);
            }
        }
        if let Some(mut child) = self.child.take() {
            if wait_child(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// `kill -9`: whatever it had not yet sent to its replicas is gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `INFO replication`, empty when it does not answer.
    pub fn replication(&self) -> String {
        let Ok(client) = redis::Client::open(self.url()) else {
            return String::new();
        };
        let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(300)) else {
            return String::new();
        };
        redis::cmd("INFO")
            .arg("replication")
            .query(&mut c)
            .unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A local Redis Cluster: three masters, no persistence, and no replicas
/// ([`RedisCluster::start`]) or one per master ([`RedisCluster::with_replicas`]).
pub struct RedisCluster {
    /// Its nodes (with replicas: `redis-cli` makes the first three the masters).
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start three cluster-enabled nodes, create the cluster and wait until every
    /// node reports `cluster_state:ok` and knows all 16384 slots.
    pub fn start() -> RedisCluster {
        Self::create((0..3).map(|_| RedisServer::new(true)).collect(), 0)
    }

    /// Three masters and `replicas` replicas for each, a master failing over after
    /// `node_timeout_ms` unreachable; returns once every replica is in sync.
    pub fn with_replicas(replicas: usize, node_timeout_ms: u32) -> RedisCluster {
        let nodes = (0..3 * (1 + replicas))
            .map(|_| RedisServer::cluster_node(node_timeout_ms))
            .collect();
        let cluster = Self::create(nodes, replicas);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !cluster.nodes.iter().all(|n| {
            let info = n.replication();
            info.contains("role:master") || info.contains("master_link_status:up")
        }) {
            assert!(Instant::now() < deadline, "replicas never in sync");
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    fn create(nodes: Vec<RedisServer>, replicas: usize) -> RedisCluster {
        let started = Instant::now();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if cluster.ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "cluster never reached cluster_state:ok"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "redis cluster {:?} ready in {:.1}s",
            addrs,
            started.elapsed().as_secs_f64()
        );
        cluster
    }

    /// Whether every running node reports `cluster_state:ok`, all 16384 slots
    /// served, and knows every node.
    pub fn ok(&self) -> bool {
        let known = format!("cluster_known_nodes:{}", self.nodes.len());
        self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
            let Ok(client) = redis::Client::open(n.url()) else {
                return false;
            };
            let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(300)) else {
                return false;
            };
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(&mut c)
                .unwrap_or_default();
            info.contains("cluster_state:ok")
                && info.contains("cluster_slots_ok:16384")
                && info.contains(&known)
        })
    }

    /// The indexes of the nodes that are masters now (read from each running node).
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].pid().is_some())
            .filter(|&i| self.nodes[i].replication().contains("role:master"))
            .collect()
    }

    /// Seed URLs for `redis.cluster_urls` (the running nodes).
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.pid().is_some())
            .map(|n| n.url())
            .collect()
    }

    /// Run `cmd` on every node (e.g. `SCRIPT FLUSH`, or `KEYS` for cleanup).
    pub fn each<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Vec<T> {
        self.nodes
            .iter()
            .map(|n| cmd.query(&mut n.connection()).expect("cluster node"))
            .collect()
    }

    /// Delete every key starting with `prefix:` on every node.
    pub fn delete_prefix(&self, prefix: &str) {
        for n in &self.nodes {
            let mut c = n.connection();
            let keys: Vec<String> = redis::cmd("KEYS")
                .arg(format!("{prefix}:*"))
                .query(&mut c)
                .unwrap_or_default();
            for k in keys {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(k).query(&mut c);
            }
        }
    }
}

/// A Redis Sentinel group on loopback: a master, its replicas, and three sentinels
/// (quorum 2) that fail the master over after `down_after_ms` without an answer.
pub struct RedisSentinel {
    /// The name the sentinels monitor the group under.
    pub master_name: String,
    /// The master the group started with, then its replicas.
    pub nodes: Vec<RedisServer>,
    /// The sentinels' ports.
    pub sentinel_ports: Vec<u16>,
    sentinels: Vec<Child>,
}

impl RedisSentinel {
    /// Start the group with `replicas` replicas; returns once they are in sync and
    /// every sentinel knows them and the two other sentinels (a failover needs both).
    pub fn start(replicas: usize, down_after_ms: u32) -> RedisSentinel {
        let started = Instant::now();
        let master = RedisServer::new(false);
        let master_name = format!("qw{}m{}", std::process::id(), master.port);
        let mut nodes = vec![master];
        for _ in 0..replicas {
            let replica = RedisServer::new(false);
            let _: () = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(nodes[0].port)
                .query(&mut replica.connection())
                .expect("REPLICAOF");
            nodes.push(replica);
        }
        let mut group = RedisSentinel {
            master_name,
            nodes,
            sentinel_ports: Vec::new(),
            sentinels: Vec::new(),
        };
        for _ in 0..3 {
            let port = free_port(None);
            let dir = temp_dir(&format!("sentinel-{port}"));
            let conf = dir.join("sentinel.conf");
            fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {d}\nlogfile {d}/sentinel.log\n\
                     sentinel monitor {name} 127.0.0.1 {mport} 2\n\
                     sentinel down-after-milliseconds {name} {down_after_ms}\n\
                     sentinel failover-timeout {name} 10000\n\
                     sentinel parallel-syncs {name} 1\n",
                    d = dir.display(),
                    name = group.master_name,
                    mport = group.nodes[0].port,
                ),
            )
            .unwrap();
            let child = Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .expect("redis-server --sentinel");
            watchdog(child.id(), false, "redis-server");
            group.sentinels.push(child);
            group.sentinel_ports.push(port);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !group.formed() {
            assert!(
                Instant::now() < deadline,
                "the sentinel group never formed: {:?}",
                group.master_state(0)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!(
            "sentinel group {} (master {}, replicas {:?}, sentinels {:?}) ready in {:.1}s",
            group.master_name,
            group.nodes[0].port,
            group.nodes[1..].iter().map(|n| n.port).collect::<Vec<_>>(),
            group.sentinel_ports,
            started.elapsed().as_secs_f64()
        );
        group
    }

    fn formed(&self) -> bool {
        let replicas = (self.nodes.len() - 1).to_string();
        self.nodes[1..]
            .iter()
            .all(|n| n.replication().contains("master_link_status:up"))
            && (0..self.sentinel_ports.len()).all(|i| {
                let state = self.master_state(i);
                state.get("num-slaves") == Some(&replicas)
                    && state.get("num-other-sentinels").map(String::as_str) == Some("2")
            })
    }

    /// `SENTINEL MASTER <name>` as asked of sentinel `i`, field by field.
    pub fn master_state(&self, i: usize) -> std::collections::BTreeMap<String, String> {
        let url = format!("redis://127.0.0.1:{}", self.sentinel_ports[i]);
        let Ok(client) = redis::Client::open(url) else {
            return Default::default();
        };
        let Ok(mut c) = client.get_connection_with_timeout(Duration::from_millis(300)) else {
            return Default::default();
        };
        let flat: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.master_name)
            .query(&mut c)
            .unwrap_or_default();
        flat.chunks(2)
            .filter(|kv| kv.len() == 2)
            .map(|kv| (kv[0].clone(), kv[1].clone()))
            .collect()
    }

    /// The port of the master as sentinel `i` names it now.
    pub fn master_port(&self, i: usize) -> Option<u16> {
        self.master_state(i).get("port")?.parse().ok()
    }

    /// The sentinels' URLs, for `redis.sentinel.urls`.
    pub fn urls(&self) -> Vec<String> {
        self.sentinel_ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------
// RabbitMQ

const RABBITMQ_SERVER: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
const RABBITMQCTL: &str = "/usr/lib/rabbitmq/bin/rabbitmqctl";

/// A private RabbitMQ node (its own name, ports, data and log dirs, no plugins), so a
/// test can stop and restart a broker without touching the shared one.
pub struct RabbitNode {
    /// AMQP port.
    pub port: u16,
    /// AMQP-over-TLS port, when the node has a TLS listener.
    pub tls_port: Option<u16>,
    dist_port: u16,
    /// Erlang node name.
    pub name: String,
    dir: PathBuf,
    child: Option<Child>,
}

impl RabbitNode {
    /// Whether this machine has the RabbitMQ scripts to start a node.
    pub fn available() -> bool {
        Path::new(RABBITMQ_SERVER).exists() && Path::new(RABBITMQCTL).exists()
    }

    /// Prepare (not start) a node.
    #[allow(clippy::new_without_default)] // it takes ports and writes files
    pub fn new() -> RabbitNode {
        let port = free_port(None);
        let dist_port = free_port(None);
        let dir = temp_dir("rabbit");
        let name = format!("qwfault{}x{port}@localhost", std::process::id());
        fs::write(
            dir.join("rabbitmq.conf"),
            format!("listeners.tcp.local = 127.0.0.1:{port}\nloopback_users = none\n"),
        )
        .unwrap();
        fs::write(dir.join("rabbitmq-env.conf"), "").unwrap();
        fs::write(dir.join("enabled_plugins"), "[].\n").unwrap();
        RabbitNode {
            port,
            tls_port: None,
            dist_port,
            name,
            dir,
            child: None,
        }
    }

    /// Prepare a node that also listens with TLS, with `pki`'s server certificate;
    /// `mutual`: clients must present a certificate signed by its CA.
    pub fn with_tls(pki: &crate::pki::Pki, mutual: bool) -> RabbitNode {
        let mut node = RabbitNode::new();
        let tls_port = free_port(None);
        let conf = node.dir.join("rabbitmq.conf");
        let mut text = fs::read_to_string(&conf).unwrap();
        text.push_str(&format!(
            "listeners.ssl.local = 127.0.0.1:{tls_port}\n\
             ssl_options.cacertfile = {}\n\
             ssl_options.certfile = {}\n\
             ssl_options.keyfile = {}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = {mutual}\n",
            pki.ca.display(),
            pki.server_cert.display(),
            pki.server_key.display(),
        ));
        fs::write(&conf, text).unwrap();
        node.tls_port = Some(tls_port);
        node
    }

    /// Its TLS URL (`amqps://guest:guest@localhost:<tls port>/%2f`).
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("a TLS listener");
        format!("amqps://guest:guest@localhost:{port}/%2f")
    }

    /// `rabbitmqctl -n <node> ARGS` against this node.
    pub fn ctl(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = Command::new(RABBITMQCTL);
        self.env(&mut cmd);
        cmd.args(["-n", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("rabbitmqctl")
    }

    fn env(&self, cmd: &mut Command) {
        let d = &self.dir;
        cmd.env("HOME", d)
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", d.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", d.join("log"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", d.join("enabled_plugins"))
            .env("RABBITMQ_CONFIG_FILE", d.join("rabbitmq.conf"))
            .env("RABBITMQ_CONF_ENV_FILE", d.join("rabbitmq-env.conf"))
            .env("RABBITMQ_PID_FILE", d.join("pid"))
            .env("ERL_EPMD_ADDRESS", "127.0.0.1");
    }

    /// Its AMQP URL.
    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    /// Start it (again); returns once an AMQP connection succeeds.
    pub async fn start(&mut self) -> Duration {
        let started = Instant::now();
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.out"))
            .unwrap();
        let mut cmd = Command::new(RABBITMQ_SERVER);
        self.env(&mut cmd);
        let child = cmd
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .process_group(0)
            .spawn()
            .expect("rabbitmq-server");
        watchdog(child.id(), true, "");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "rabbitmq node exited with {status}; see {}",
                    self.dir.join("server.out").display()
                );
            }
            if port_open(self.port) {
                let url = self.url();
                let connect =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
                if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), connect).await {
                    let _ = c.close(200, "probe".into()).await;
                    return started.elapsed();
                }
            }
            assert!(Instant::now() < deadline, "rabbitmq node did not start");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stop it cleanly (`rabbitmqctl stop`), killing it if that fails.
    pub fn stop(&mut self) {
        let mut cmd = Command::new(RABBITMQCTL);
        self.env(&mut cmd);
        let _ = cmd
            .args(["-n", &self.name, "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        if let Some(mut child) = self.child.take() {
            if wait_child(&mut child, Duration::from_secs(30)).is_none() {
                signal(&format!("-{}", child.id()), "KILL");
                let _ = child.wait();
            }
            // the group may outlive its leader for a moment
            let pgid = format!("-{}", child.id());
            for _ in 0..100 {
                let alive = Command::new("kill")
                    .args(["-0", "--", &pgid])
                    .stderr(Stdio::null())
                    .status()
                    .map(|s| s.success())
                    .unwrap_or(false);
                if !alive {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            signal(&pgid, "KILL");
        }
    }

    /// Freeze it (SIGSTOP to its process group): connections stay open, nothing
    /// answers, as with a hung broker or a network partition.
    pub fn freeze(&self) {
        if let Some(c) = &self.child {
            signal(&format!("-{}", c.id()), "STOP");
        }
    }

    /// Undo [`RabbitNode::freeze`].
    pub fn thaw(&self) {
        if let Some(c) = &self.child {
            signal(&format!("-{}", c.id()), "CONT");
        }
    }

    /// Kill it with SIGKILL (the whole process group).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(&format!("-{}", child.id()), "KILL");
            let _ = child.wait();
        }
    }
}

impl Drop for RabbitNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A RabbitMQ cluster of private nodes on loopback (each a [`RabbitNode`] sharing one
/// Erlang cookie), joined to the first: quorum queues declared afterwards have a
/// replica on every node.
pub struct RabbitCluster {
    /// Its nodes; the first is the one the others joined.
    pub nodes: Vec<RabbitNode>,
}

impl RabbitCluster {
    /// Start `n` nodes and cluster them; returns once every node runs its app in
    /// one cluster.
    pub async fn start(n: usize) -> RabbitCluster {
        let cookie = format!("QWCLUSTER{}{}", std::process::id(), free_port(None));
        let mut nodes: Vec<RabbitNode> = (0..n).map(|_| RabbitNode::new()).collect();
        for node in &nodes {
            let path = node.dir.join(".erlang.cookie");
            fs::write(&path, &cookie).unwrap();
            fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o400))
                .unwrap();
        }
        // booting is mostly waiting on the Erlang VM: all at once
        futures_util::future::join_all(nodes.iter_mut().map(|n| n.start())).await;
        let first = nodes[0].name.clone();
        for node in &nodes[1..] {
            for args in [&["stop_app"][..], &["join_cluster", &first], &["start_app"]] {
                let out = node.ctl(args);
                assert!(
                    out.status.success(),
                    "rabbitmqctl {args:?} on {}: {}",
                    node.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let cluster = RabbitCluster { nodes };
        let status = cluster.nodes[0].ctl(&["cluster_status", "--formatter", "json"]);
        let text = String::from_utf8_lossy(&status.stdout);
        for node in &cluster.nodes {
            assert!(
                text.contains(&node.name),
                "{} not in the cluster: {text}",
                node.name
            );
        }
        cluster
    }

    /// Every node's AMQP URL.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RabbitNode::url).collect()
    }

    /// The index of the node process `pid` has an AMQP connection to, read from
    /// the machine's sockets (`ss`).
    pub fn connected_node(&self, pid: u32) -> Option<usize> {
        let out = Command::new("ss")
            .args(["-tnpH", "state", "established"])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        let owner = format!("pid={pid},");
        text.lines().filter(|l| l.contains(&owner)).find_map(|l| {
            self.nodes.iter().position(|n| {
                l.split_whitespace()
                    .any(|field| field.ends_with(&format!("127.0.0.1:{}", n.port)))
            })
        })
    }
}

// ---------------------------------------------------------------------------------
// The worker binary

/// `quota-worker run` as a child process, configured for one test's names.
pub struct WorkerProc {
    child: Option<Child>,
    /// Its log (JSON lines on stderr).
    pub log: PathBuf,
    /// When it was started.
    pub started: Instant,
}

impl WorkerProc {
    /// Start `bin run` (the `quota-worker` binary) for `s`; `dir` holds its config
    /// file and log.
    pub fn spawn(bin: impl AsRef<Path>, s: &Settings, dir: &Path, tag: &str) -> WorkerProc {
        Self::spawn_with(bin.as_ref(), s, dir, tag, worker_env(s))
    }

    /// [`WorkerProc::spawn`], serving HTTP as `s.http` says.
    pub fn spawn_serving(bin: impl AsRef<Path>, s: &Settings, dir: &Path, tag: &str) -> WorkerProc {
        Self::spawn_with(bin.as_ref(), s, dir, tag, env_for(s))
    }

    fn spawn_with(
        bin: &Path,
        s: &Settings,
        dir: &Path,
        tag: &str,
        env: Vec<(String, String)>,
    ) -> WorkerProc {
        let config = dir.join("worker.toml");
        if !config.exists() {
            fs::write(&config, worker_toml(s)).unwrap();
        }
        let log = dir.join(format!("worker-{tag}.log"));
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let child = Command::new(bin)
            .args(["--log-format", "json", "--config"])
            .arg(&config)
            .arg("run")
            .envs(env)
            .env(
                "RUST_LOG",
                std::env::var("QW_WORKER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .process_group(0)
            .spawn()
            .expect("quota-worker binary");
        watchdog(child.id(), false, "quota-worker");
        WorkerProc {
            child: Some(child),
            log,
            started: Instant::now(),
        }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// `kill -9`.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGHUP: reload the configuration.
    pub fn hup(&self) {
        if let Some(c) = &self.child {
            signal(&c.id().to_string(), "HUP");
        }
    }

    /// SIGTERM (graceful shutdown).
    pub fn term(&self) {
        if let Some(c) = &self.child {
            signal(&c.id().to_string(), "TERM");
        }
    }

    /// SIGTERM, then wait (30 s at most) for it to exit.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.term();
        self.wait(Duration::from_secs(30))
    }

    /// Wait for it to exit.
    pub fn wait(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_child(self.child.as_mut()?, timeout)?;
        self.child = None;
        Some(status)
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The last `n` lines of its log, for failure messages.
    pub fn tail(&self, n: usize) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill9();
    }
}
