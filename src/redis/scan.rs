//! Every key that matches a pattern, by `SCAN` (never `KEYS`, which blocks the
//! server for the whole key space): on one node (or a Sentinel group's master) a
//! cursor walk; on a Redis Cluster the same walk on each primary, as the slot map
//! names them, since a `SCAN` cursor is one node's. `admin preferences export`
//! finds the stored sets this way.

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, FromRedisValue};

use super::conn::RedisConn;
use super::StoreError;

/// How many keys one `SCAN` step asks a node to look at.
pub(crate) const COUNT: u32 = 1000;

/// `pattern` with the glob characters of `literal` escaped (a key prefix may hold
/// `*`, `?`, `[` or `\`).
pub fn escape_glob(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn step(cursor: u64, pattern: &str) -> Cmd {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(pattern)
        .arg("COUNT")
        .arg(COUNT);
    cmd
}

/// Every key matching `pattern`, each once (a key written during the walk may be
/// missed, as `SCAN` guarantees only the keys present throughout it).
pub(crate) async fn scan_match(conn: &RedisConn, pattern: &str) -> Result<Vec<String>, StoreError> {
    Ok(scan_bounded(conn, pattern, usize::MAX).await?.0)
}

/// The keys matching `pattern` that at most `steps` `SCAN` steps on each node find
/// (each looks at [`COUNT`] keys), each once; and whether the walk was complete.
pub(crate) async fn scan_bounded(
    conn: &RedisConn,
    pattern: &str,
    steps: usize,
) -> Result<(Vec<String>, bool), StoreError> {
    let mut keys = Vec::new();
    let mut complete = true;
    match conn {
        RedisConn::Cluster(..) => {
            let map = conn
                .slot_map()
                .await
                .ok_or_else(|| StoreError::Batch("the cluster did not say its slots".into()))?;
            for node in map.nodes() {
                let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: node.host.clone(),
                    port: node.port,
                });
                let mut cursor = 0;
                for taken in 1.. {
                    let RedisConn::Cluster(c, ..) = &mut conn.clone() else {
                        unreachable!("a cluster connection")
                    };
                    let reply = c
                        .route_command(step(cursor, pattern), route.clone())
                        .await?;
                    let (next, batch): (u64, Vec<String>) = FromRedisValue::from_redis_value(reply)
                        .map_err(|e| StoreError::Batch(format!("SCAN answered: {e}")))?;
                    keys.extend(batch);
                    if next == 0 {
                        break;
                    }
                    if taken >= steps {
                        complete = false;
                        break;
                    }
                    cursor = next;
                }
            }
        }
        _ => {
            let mut c = conn.clone();
            let mut cursor = 0;
            for taken in 1.. {
                let (next, batch): (u64, Vec<String>) =
                    step(cursor, pattern).query_async(&mut c).await?;
                keys.extend(batch);
                if next == 0 {
                    break;
                }
                if taken >= steps {
                    complete = false;
                    break;
                }
                cursor = next;
            }
        }
    }
    keys.sort();
    keys.dedup();
    Ok((keys, complete))
}

#[cfg(test)]
mod tests {
    use super::escape_glob;

    #[test]
    fn glob_characters_are_escaped() {
        assert_eq!(escape_glob("qw"), "qw");
        assert_eq!(escape_glob("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
