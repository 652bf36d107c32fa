//! A private RabbitMQ node (its own name, ports and dirs), and a cluster of them.

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{signal, tail_of, wait_child, watchdog};
use crate::{free_port, port_open, temp_dir};

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
    /// Whether it ever served (its ports are then known to its users).
    ran: bool,
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
            ran: false,
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

    /// Start it (again); returns once an AMQP connection succeeds. A node that
    /// exits while booting is started again (three tries in all), with ports of
    /// its own picked afresh if it never ran: a port picked free may be taken
    /// before the node binds it (by an outgoing connection of a loaded machine:
    /// they come from the same range), and its boot then fails. What it printed is
    /// shown each time.
    pub async fn start(&mut self) -> Duration {
        let started = Instant::now();
        for attempt in 1..=3 {
            match self.boot().await {
                Ok(()) => {
                    self.ran = true;
                    return started.elapsed();
                }
                Err(status) => {
                    eprintln!(
                        "rabbitmq node {} (port {}) exited with {status} while booting (try {attempt} of 3); the end of its output:\n{}",
                        self.name,
                        self.port,
                        tail_of(&self.dir.join("server.out"), 30)
                    );
                    if !self.ran {
                        self.new_ports();
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
        panic!(
            "rabbitmq node exited three times while booting; see {}",
            self.dir.join("server.out").display()
        );
    }

    /// Other free ports for a node that never ran (its listeners rewritten).
    fn new_ports(&mut self) {
        let conf = self.dir.join("rabbitmq.conf");
        let mut text = fs::read_to_string(&conf).unwrap();
        let port = free_port(None);
        text = text.replace(
            &format!("listeners.tcp.local = 127.0.0.1:{}\n", self.port),
            &format!("listeners.tcp.local = 127.0.0.1:{port}\n"),
        );
        self.port = port;
        if let Some(old) = self.tls_port {
            let tls_port = free_port(None);
            text = text.replace(
                &format!("listeners.ssl.local = 127.0.0.1:{old}\n"),
                &format!("listeners.ssl.local = 127.0.0.1:{tls_port}\n"),
            );
            self.tls_port = Some(tls_port);
        }
        fs::write(&conf, text).unwrap();
        self.dist_port = free_port(None);
    }

    /// One boot: `Err` with its exit status if the node exits before it serves.
    async fn boot(&mut self) -> Result<(), std::process::ExitStatus> {
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
                self.child = None;
                return Err(status);
            }
            if port_open(self.port) {
                let url = self.url();
                let connect =
                    lapin::Connection::connect(&url, lapin::ConnectionProperties::default());
                if let Ok(Ok(c)) = tokio::time::timeout(Duration::from_secs(5), connect).await {
                    let _ = c.close(200, "probe".into()).await;
                    return Ok(());
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
