//! The connection to Redis: one node through a connection manager, or a Redis
//! Cluster; both reconnect by themselves. `rediss://` URLs connect with TLS as
//! `redis.tls` says (module [`crate::tls`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};

use crate::engine::EngineError;

/// A Redis connection: one node, or a cluster. Both reconnect by themselves.
#[derive(Clone)]
pub enum RedisConn {
    /// A single node, through a connection manager.
    Single(redis::aio::ConnectionManager),
    /// A Redis Cluster.
    Cluster(redis::cluster_async::ClusterConnection),
}

impl RedisConn {
    /// Connect as the settings say: `rediss://` URLs with TLS as `redis.tls` says
    /// (the files were checked when the settings were loaded).
    pub async fn connect(
        settings: &crate::config::RedisSettings,
    ) -> Result<RedisConn, EngineError> {
        let timeout = Duration::from_secs(2);
        let certs = crate::tls::redis_certificates(&settings.tls)?;
        let insecure = settings.tls.insecure_skip_verify;
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
            Ok(RedisConn::Cluster(
                builder.build()?.get_async_connection().await?,
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
    /// Send `cmds`, replies ignored: in one pipeline on a single node (one round
    /// trip), each on its own and concurrently on a cluster (their keys may live in
    /// different slots).
    pub async fn send_all(&self, cmds: impl Iterator<Item = Cmd>) -> Result<(), EngineError> {
        let mut conn = self.clone();
        match self {
            RedisConn::Single(_) => {
                let mut pipe = redis::pipe();
                for cmd in cmds {
                    pipe.add_command(cmd).ignore();
                }
                let _: () = pipe.query_async(&mut conn).await?;
            }
            RedisConn::Cluster(_) => {
                let calls = cmds.map(|cmd| {
                    let mut conn = conn.clone();
                    async move { cmd.query_async::<redis::Value>(&mut conn).await }
                });
                for result in futures_util::future::join_all(calls).await {
                    result?;
                }
            }
        }
        Ok(())
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
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
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Count one Redis command (script calls included) sent.
pub(crate) fn count_call(calls: &AtomicU64) {
    calls.fetch_add(1, Ordering::Relaxed);
    metrics::counter!(crate::metrics::REDIS_CALLS_TOTAL).increment(1);
}
