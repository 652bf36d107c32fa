//! A private `redis-server`: a single node (with an AOF, TLS or an ACL user if asked)
//! or an empty cluster-enabled node.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{wait_child, watchdog};
use crate::{free_port, port_open, temp_dir};

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
    /// Variables its process is started with (a shifted clock).
    env: Vec<(String, String)>,
    child: Option<Child>,
}

/// A TLS listener of a private `redis-server`.
struct RedisTls {
    port: u16,
    args: Vec<String>,
}

impl RedisServer {
    /// A node not yet started, on `port`, in a temp dir of its own (`tag-port`).
    fn prepared(port: u16, tag: &str, cluster: bool, node_timeout_ms: u32) -> RedisServer {
        RedisServer {
            port,
            dir: temp_dir(&format!("{tag}-{port}")),
            cluster,
            node_timeout_ms,
            tls: None,
            aof: None,
            env: Vec::new(),
            child: None,
        }
    }

    /// The first node `make` prepares (each time on other free ports) that starts and
    /// listens on every port it was given, of five tries.
    fn first_started(what: &str, mut make: impl FnMut() -> RedisServer) -> RedisServer {
        for _ in 0..5 {
            let mut r = make();
            if r.start().is_ok() && r.tls.as_ref().is_none_or(|t| port_open(t.port)) {
                return r;
            }
        }
        panic!("could not start {what}");
    }

    /// Start a single node (`cluster = false`) or a cluster-enabled empty node.
    pub fn new(cluster: bool) -> RedisServer {
        Self::first_started("redis-server", || {
            Self::prepared(free_port(cluster.then_some(10_000)), "redis", cluster, 5000)
        })
    }

    /// A single node with the append-only file on (`appendonly yes`, `appendfsync`
    /// as given): a [`RedisServer::stop`] (SHUTDOWN, which writes and fsyncs the AOF)
    /// and [`RedisServer::start`] bring back every write it acknowledged.
    pub fn with_aof(appendfsync: &'static str) -> RedisServer {
        Self::first_started("redis-server with an AOF", || {
            let mut r = Self::prepared(free_port(None), "redis-aof", false, 5000);
            r.aof = Some(appendfsync);
            r
        })
    }

    /// A cluster-enabled empty node whose master fails over after `node_timeout_ms`.
    pub fn cluster_node(node_timeout_ms: u32) -> RedisServer {
        Self::first_started("redis-server", || {
            Self::prepared(free_port(Some(10_000)), "redis", true, node_timeout_ms)
        })
    }

    /// A single node whose wall clock is `clock` (Redis `TIME`, which the scripts
    /// read, included): see [`crate::clock`].
    pub fn with_clock(clock: &crate::clock::ShiftedClock) -> RedisServer {
        Self::first_started("redis-server with a shifted clock", || {
            let mut r = Self::prepared(free_port(None), "redis-clock", false, 5000);
            r.env = clock.env();
            r
        })
    }

    /// A single node on `port` (a test that points a worker at it before it runs).
    pub fn at_port(port: u16) -> RedisServer {
        let mut r = Self::prepared(port, "redis", false, 5000);
        r.start().expect("redis-server on the chosen port");
        r
    }

    /// A single node that also listens with TLS (`--tls-port`), with `pki`'s server
    /// certificate; `require_client_cert`: clients must present one signed by its CA.
    pub fn with_tls(pki: &crate::pki::Pki, require_client_cert: bool) -> RedisServer {
        let path = |p: &Path| p.to_str().unwrap().to_string();
        Self::first_started("redis-server with TLS", || {
            let tls_port = free_port(None);
            let auth = if require_client_cert { "yes" } else { "no" };
            let mut r = Self::prepared(free_port(None), "redis-tls", false, 5000);
            r.tls = Some(RedisTls {
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
            });
            r
        })
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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
