//! The connection to Redis: one node through a connection manager, the master of
//! a Sentinel-managed group, or a Redis Cluster; all reconnect by themselves.
//! `rediss://` URLs connect with TLS as `redis.tls` says (module [`crate::tls`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisError, RedisFuture, Value};

use super::slots::{SlotMap, Slots};
use crate::redis::StoreError;

/// A Redis connection: one node, a Sentinel group's master, or a cluster. All
/// reconnect by themselves.
#[derive(Clone)]
pub enum RedisConn {
    /// A single node, through a connection manager.
    Single(redis::aio::ConnectionManager),
    /// The master of a group that Redis Sentinel watches (see [`SentinelConn`]).
    Sentinel(Arc<SentinelConn>),
    /// A Redis Cluster, the owner of each slot as last read, and the client (which
    /// opens the admissions' own connections when they wait for replicas, see
    /// [`RedisConn::dedicated`]).
    Cluster(
        redis::cluster_async::ClusterConnection,
        Arc<Slots>,
        Arc<redis::cluster::ClusterClient>,
    ),
}

/// The master of a Sentinel group, found by asking the sentinels.
///
/// The redis crate finds the master (and checks with `ROLE` that it is one) but
/// keeps no connection up across a failover, so this does: one multiplexed
/// connection to the master, used until a command on it fails in a way that says
/// the node is gone or no longer the master (a dropped connection, a timeout,
/// `READONLY` from a demoted master). That command's error goes back to its caller,
/// which retries with its backoff as for any Redis error; the next command asks
/// the sentinels again. Until they have promoted a replica they name the old
/// master, whose connection fails, so a failover costs the time Sentinel takes to
/// decide (`down-after-milliseconds` plus the election), not a restart.
pub struct SentinelConn {
    client: tokio::sync::Mutex<SentinelClient>,
    config: redis::AsyncConnectionConfig,
    /// The connection in use and its generation (a failure seen on an older one
    /// does not drop a newer one).
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
}

impl SentinelConn {
    fn new(
        settings: &crate::config::RedisSettings,
        sentinel: &crate::config::SentinelSettings,
        timeout: Duration,
    ) -> Result<SentinelConn, StoreError> {
        // the master's user, password and database come from `redis.url`
        let node = settings.url.as_str().into_connection_info()?;
        let node = SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(node.redis_settings().clone());
        let client = SentinelClient::build(
            sentinel.urls.clone(),
            sentinel.master_name.as_str(),
            Some(node),
            SentinelServerType::Master,
        )?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        Ok(SentinelConn {
            client: tokio::sync::Mutex::new(client),
            config,
            current: Mutex::new(None),
            generation: AtomicU64::new(0),
        })
    }

    /// The connection in use, if there is one.
    fn in_use(&self) -> Option<(u64, MultiplexedConnection)> {
        self.current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connection to the master, asking the sentinels first if there is none.
    async fn get(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        if let Some(c) = self.in_use() {
            return Ok(c);
        }
        let mut client = self.client.lock().await;
        // another caller may have connected while this one waited
        if let Some(c) = self.in_use() {
            return Ok(c);
        }
        let conn = client
            .get_async_connection_with_config(&self.config)
            .await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
        let found = (generation, conn);
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(found.clone());
        metrics::counter!(crate::metrics::REDIS_MASTER_CHANGES_TOTAL).increment(1);
        tracing::info!(
            generation,
            "connected to the redis master named by the sentinels"
        );
        Ok(found)
    }

    /// After `e` on the connection of `generation`: forget that connection if the
    /// error says its node is gone or no longer the master.
    fn failed(&self, generation: u64, e: &RedisError) {
        let gone = e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_unrecoverable_error()
            || e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
        if !gone {
            return;
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.as_ref().map(|c| c.0) == Some(generation) {
            tracing::warn!(error = %e, "redis master lost; asking the sentinels again");
            *current = None;
        }
    }
}

impl RedisConn {
    /// Connect as the settings say: `rediss://` URLs with TLS as `redis.tls` says
    /// (the files were checked when the settings were loaded).
    pub async fn connect(settings: &crate::config::RedisSettings) -> Result<RedisConn, StoreError> {
        let timeout = Duration::from_secs(2);
        let certs = crate::tls::redis_certificates(&settings.tls)?;
        let insecure = settings.tls.insecure_skip_verify;
        if let Some(sentinel) = &settings.sentinel {
            let conn = SentinelConn::new(settings, sentinel, timeout)?;
            // fail here as a lone node would when it is not there at start
            conn.get().await?;
            return Ok(RedisConn::Sentinel(Arc::new(conn)));
        }
        if settings.cluster {
            let mut builder =
                redis::cluster::ClusterClientBuilder::new(settings.cluster_urls.clone())
                    .connection_timeout(timeout)
                    .response_timeout(timeout);
            if insecure {
                builder = builder.tls(redis::TlsMode::Insecure);
            }
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            let client = builder.build()?;
            Ok(RedisConn::Cluster(
                client.get_async_connection().await?,
                Arc::default(),
                Arc::new(client),
            ))
        } else {
            // verification is turned off only by its key (a `#insecure` in the URL
            // is refused when the settings are loaded)
            let url = match insecure && settings.url.starts_with("rediss://") {
                true => format!("{}#insecure", settings.url),
                false => settings.url.clone(),
            };
            let client = match certs {
                Some(certs) => redis::Client::build_with_tls(url.as_str(), certs)?,
                None => redis::Client::open(url.as_str())?,
            };
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_max_delay(Duration::from_secs(1));
            Ok(RedisConn::Single(
                client.get_connection_manager_with_config(config).await?,
            ))
        }
    }
}

impl RedisConn {
    /// On a cluster, `count` connections of their own (each with one connection
    /// per node, routed and repaired by the cluster client as the shared one is),
    /// sharing this one's slot map; empty on a single node or with Sentinel.
    ///
    /// For the admission calls that end with `WAIT`: Redis serves one command at a
    /// time on a connection, and `WAIT` holds its connection until the replicas
    /// answer or its timeout ends, so on the shared connection (one per node,
    /// multiplexed) every call behind it waited too. A master with no replica to
    /// acknowledge (its replicas cut off, or just promoted and none attached yet)
    /// held each `WAIT` for all of `redis.wait_timeout`; the waits queued one
    /// behind the other on that node's connection past the 2 s response timeout,
    /// and with them the batches' other calls, the commits, notes and rate takes:
    /// every call to that node timed out while it had no replica. Each batch in
    /// flight takes one of these connections for itself, so a node sees at most one
    /// `WAIT` a connection, and nothing else waits behind it.
    pub(crate) async fn dedicated(&self, count: usize) -> Result<Vec<RedisConn>, StoreError> {
        let RedisConn::Cluster(_, slots, client) = self else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(count);
        for _ in 0..count {
            out.push(RedisConn::Cluster(
                client.get_async_connection().await?,
                slots.clone(),
                client.clone(),
            ));
        }
        Ok(out)
    }

    /// Send `cmds`, replies ignored, and return the round trips it took: one
    /// pipeline on a single node; on a cluster one pipeline per node that owns the
    /// first key of some of them (the node each command names by its first
    /// argument), all at once. A node that refuses part of its pipeline (its slots
    /// moved) has that part sent again command by command, routed by the client.
    pub(crate) async fn send_all(
        &self,
        cmds: impl Iterator<Item = Cmd>,
    ) -> Result<u64, StoreError> {
        let mut conn = self.clone();
        match self {
            RedisConn::Single(_) | RedisConn::Sentinel(_) => {
                let mut pipe = redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd).ignore();
                }
                let _: () = pipe.query_async(&mut conn).await?;
                Ok(1)
            }
            RedisConn::Cluster(_, slots, _) => {
                let map = self.slot_map().await;
                let groups = group_by_node(cmds, map.as_deref(), |cmd, m| {
                    first_key(cmd).and_then(|k| m.owner(k))
                });
                let trips = groups.len() as u64;
                let sends = groups.into_iter().map(|(node, cmds)| {
                    let mut conn = conn.clone();
                    async move {
                        let node = match (node, cmds.len()) {
                            (Some(node), 2..) => node,
                            _ => return send_each(&conn, cmds).await.map(|_| 0),
                        };
                        let mut pipe = redis::pipe();
                        for cmd in &cmds {
                            pipe.add_command(cmd.clone());
                        }
                        let route = SingleNodeRoutingInfo::ByAddress {
                            host: node.host.clone(),
                            port: node.port,
                        };
                        let RedisConn::Cluster(c, ..) = &mut conn else {
                            unreachable!("a cluster connection")
                        };
                        let count = cmds.len();
                        let replies = match c.route_pipeline(pipe, 0, count, route).await {
                            Ok(replies) => replies,
                            // the node may have answered some and not others:
                            // every command here may be sent twice, none is lost
                            Err(_) => {
                                slots.mark_stale();
                                return send_each(&conn, cmds).await;
                            }
                        };
                        let refused: Vec<Cmd> = cmds
                            .into_iter()
                            .zip(replies)
                            .filter(|(_, reply)| matches!(reply, Value::ServerError(_)))
                            .map(|(cmd, _)| cmd)
                            .collect();
                        if refused.is_empty() {
                            return Ok(0);
                        }
                        slots.mark_stale();
                        send_each(&conn, refused).await
                    }
                });
                let mut extra = 0;
                for result in futures_util::future::join_all(sends).await {
                    extra += result?;
                }
                Ok(trips + extra)
            }
        }
    }

    /// The owner of each slot, read again if it is stale (`None` on a single node,
    /// or when the cluster could not say: every key is then sent on its own).
    pub(crate) async fn slot_map(&self) -> Option<Arc<SlotMap>> {
        let RedisConn::Cluster(_, slots, _) = self else {
            return None;
        };
        if slots.needs_refresh() {
            let mut conn = self.clone();
            let reply = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await;
            match reply.ok().as_ref().and_then(SlotMap::from_reply) {
                Some(map) => slots.set(map),
                None => return slots.current(),
            }
        }
        slots.current()
    }

    /// Mark the slot map stale (a node answered for a key it does not own).
    pub(crate) fn slots_moved(&self) {
        if let RedisConn::Cluster(_, slots, _) = self {
            slots.mark_stale();
        }
    }
}

/// `items` grouped by the node `owner` finds for them in `map` (`None`: unknown
/// owner, or no map; those go one by one), in order within each group.
pub(crate) fn group_by_node<T>(
    items: impl Iterator<Item = T>,
    map: Option<&SlotMap>,
    owner: impl Fn(&T, &SlotMap) -> Option<usize>,
) -> Vec<(Option<super::slots::Node>, Vec<T>)> {
    let mut by_node: Vec<Vec<T>> = Vec::new();
    let mut alone: Vec<(Option<super::slots::Node>, Vec<T>)> = Vec::new();
    for item in items {
        match map.and_then(|m| owner(&item, m)) {
            Some(i) => {
                if by_node.len() <= i {
                    by_node.resize_with(i + 1, Vec::new);
                }
                by_node[i].push(item);
            }
            None => alone.push((None, vec![item])),
        }
    }
    let nodes = map.map(|m| m.nodes()).unwrap_or_default();
    by_node
        .into_iter()
        .enumerate()
        .filter(|(_, items)| !items.is_empty())
        .map(|(i, items)| (nodes.get(i).cloned(), items))
        .chain(alone)
        .collect()
}

/// A command's first argument after its name (the key of every command the
/// worker writes with).
fn first_key(cmd: &Cmd) -> Option<&[u8]> {
    match cmd.args_iter().nth(1)? {
        redis::Arg::Simple(key) => Some(key),
        _ => None,
    }
}

/// Send each of `cmds` on its own, all at once (the cluster client routes each by
/// its key); returns the round trips.
async fn send_each(conn: &RedisConn, cmds: Vec<Cmd>) -> Result<u64, StoreError> {
    let trips = cmds.len() as u64;
    let calls = cmds.into_iter().map(|cmd| {
        let mut conn = conn.clone();
        async move { cmd.query_async::<Value>(&mut conn).await }
    });
    for result in futures_util::future::join_all(calls).await {
        result?;
    }
    Ok(trips)
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Sentinel(s) => Box::pin(async move {
                let (generation, mut c) = s.get().await?;
                let reply = c.req_packed_command(cmd).await;
                if let Err(e) = &reply {
                    s.failed(generation, e);
                }
                reply
            }),
            RedisConn::Cluster(c, ..) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Sentinel(s) => Box::pin(async move {
                let (generation, mut c) = s.get().await?;
                let reply = c.req_packed_commands(pipeline, offset, count).await;
                if let Err(e) = &reply {
                    s.failed(generation, e);
                }
                reply
            }),
            RedisConn::Cluster(c, ..) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Sentinel(s) => s
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .map_or(0, |c| c.1.get_db()),
            RedisConn::Cluster(c, ..) => c.get_db(),
        }
    }
}

/// Count one Redis command (script calls included) sent.
pub(crate) fn count_call(calls: &AtomicU64) {
    calls.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(crate::metrics::REDIS_CALLS_TOTAL).increment(1);
}
