//! Groups of `redis-server` processes: a Redis Cluster (three masters, with or without
//! replicas) and a Sentinel group (a master, its replicas, three sentinels).

use std::fs;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_node::RedisServer;
use super::watchdog;
use crate::{free_port, temp_dir};

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
