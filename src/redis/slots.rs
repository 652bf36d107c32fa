//! Which node of a Redis Cluster owns a key, so that the worker can send each node
//! one round trip for all the admissions and writes it owns, instead of one per key:
//! the slot of a key (CRC16 of its hash tag, as Redis computes it) and the owner of
//! each slot (`CLUSTER SLOTS`), read at start and again whenever a node answers for
//! a key it no longer owns. A stale map costs round trips, never a wrong decision:
//! a key sent to the wrong node is refused there and asked again on its own, routed
//! by the cluster client.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use redis::Value;

/// Hash slots of a Redis Cluster.
pub const SLOTS: usize = 16_384;

/// The slot of `key`: CRC16 (XMODEM) of its hash tag (the text between its first
/// `{` and the next `}`, when not empty) or of the whole key, modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// A primary node's address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// Host name or address, as the cluster announces it.
    pub host: String,
    /// TCP port, as the cluster announces it.
    pub port: u16,
}

/// The owner of every slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    /// Index into `nodes` for each slot; `u16::MAX`: no owner known.
    owners: Vec<u16>,
    nodes: Vec<Node>,
}

impl SlotMap {
    /// The map `CLUSTER SLOTS` answered with: an array of `[start, end, [host,
    /// port, id, ...], replicas...]`. `None` if the reply has another shape.
    pub fn from_reply(reply: &Value) -> Option<SlotMap> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = SlotMap {
            owners: vec![u16::MAX; SLOTS],
            nodes: Vec::new(),
        };
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let [Value::Int(start), Value::Int(end), Value::Array(primary), ..] = &fields[..]
            else {
                return None;
            };
            let node = match &primary[..] {
                [host, Value::Int(port), ..] => Node {
                    host: match host {
                        Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
                        Value::SimpleString(s) => s.clone(),
                        _ => return None,
                    },
                    port: u16::try_from(*port).ok()?,
                },
                _ => return None,
            };
            let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
            if start > end || end >= SLOTS {
                return None;
            }
            let index = match map.nodes.iter().position(|n| *n == node) {
                Some(i) => i,
                None => {
                    map.nodes.push(node);
                    map.nodes.len() - 1
                }
            };
            map.owners[start..=end].fill(index as u16);
        }
        Some(map)
    }

    /// The node that owns `key`'s slot (its index in [`SlotMap::nodes`]).
    pub fn owner(&self, key: &[u8]) -> Option<usize> {
        let i = self.owners[slot(key) as usize];
        (i != u16::MAX).then_some(i as usize)
    }

    /// The primaries, in the order [`SlotMap::owner`] numbers them.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }
}

/// The slot map a cluster connection shares, and whether it needs reading again.
#[derive(Debug, Default)]
pub struct Slots {
    map: ArcSwapOption<SlotMap>,
    stale: AtomicBool,
}

impl Slots {
    /// The map as last read (`None` before the first read).
    pub fn current(&self) -> Option<Arc<SlotMap>> {
        self.map.load_full()
    }

    /// Put a freshly read map in place.
    pub fn set(&self, map: SlotMap) {
        self.map.store(Some(Arc::new(map)));
        self.stale.store(false, Ordering::Relaxed);
    }

    /// A node answered for a key it does not own: read the map again before the
    /// next grouping.
    pub(crate) fn mark_stale(&self) {
        self.stale.store(true, Ordering::Relaxed);
    }

    /// Whether the map must be read (never read, or marked stale).
    pub fn needs_refresh(&self) -> bool {
        self.stale.load(Ordering::Relaxed) || self.map.load().is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_ones_redis_computes() {
        // from `CLUSTER KEYSLOT` on Redis 7.0
        assert_eq!(slot(b"a"), 15495);
        assert_eq!(slot(b"b"), 3300);
        assert_eq!(slot(b"123456789"), 12739);
        // the hash tag alone counts; an empty tag does not
        assert_eq!(slot(b"qw:{b}:default"), slot(b"b"));
        assert_eq!(slot(b"x{b}y{a}"), slot(b"b"));
        assert_ne!(slot(b"x{}b"), slot(b"b"));
        assert_ne!(slot(b"{b"), slot(b"b"));
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn the_map_names_each_slots_primary() {
        let range = |start, end, port| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(port), bulk("id")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(port + 100), bulk("r")]),
            ])
        };
        let reply = Value::Array(vec![
            range(0, 5460, 7001),
            range(5461, 10922, 7002),
            range(10923, 16383, 7003),
        ]);
        let map = SlotMap::from_reply(&reply).unwrap();
        assert_eq!(map.nodes().len(), 3);
        let port = |key: &[u8]| map.nodes()[map.owner(key).unwrap()].port;
        assert_eq!(port(b"b"), 7001); // slot 3300
        assert_eq!(port(b"a"), 7003); // slot 15495
        assert_eq!(port(b"{a}:anything"), 7003);
        // a slot nobody owns, and replies of another shape
        let partial = SlotMap::from_reply(&Value::Array(vec![range(0, 5460, 7001)])).unwrap();
        assert_eq!(partial.owner(b"a"), None);
        assert_eq!(SlotMap::from_reply(&Value::Int(1)), None);
        assert_eq!(
            SlotMap::from_reply(&Value::Array(vec![range(5, 4, 7001)])),
            None
        );
    }
}
