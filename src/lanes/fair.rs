//! Fair shares inside a lane, the pure part: which queue holds a tenant's parked
//! jobs, how a tenant is named in the lane's schedule (`lua/lanes.lua`), and the
//! stride a weight gives. Pure: no I/O.
//!
//! A job without a tenant is parked in its lane's queue as before
//! (`<lanes.queue_prefix><channel>.<lane>`); a job of tenant `T` in the lane's
//! queue of that tenant, `<lanes.queue_prefix><channel>.<lane>.t.<T>` (a name of
//! letters, digits, `-`, `_`, `.` and `@` of at most 64 bytes, else `.h.` and a
//! hash of it). The lane's slots go to the tenants whose jobs wait in a worker's
//! line by stride scheduling: each tenant's pass grows by [`stride`] per slot it
//! takes, and each slot goes to the waiting tenant of lowest pass.

use super::share::Priority;

/// The stride of a tenant of weight 1: a tenant of weight `w` moves `UNIT / w` a
/// slot.
pub const UNIT: u64 = 1_000_000;

/// Most tenants one ask of a line presents to the schedule; more tenants waiting in
/// one worker's line take their turn to be presented, this many at a time.
pub const MAX_CANDIDATES: usize = 64;

/// The member that names a tenant in a lane's schedule: `-` for the jobs without a
/// tenant, `t:` and the name otherwise (`~vt`, the schedule's virtual time, is
/// neither).
pub fn member(tenant: Option<&str>) -> String {
    match tenant {
        None => "-".to_string(),
        Some(t) => format!("t:{t}"),
    }
}

/// How far the pass of a tenant of `weight` moves a slot.
pub fn stride(weight: u32) -> u64 {
    UNIT / u64::from(weight.max(1))
}

/// The suffix of a tenant's queue after its lane's queue: `.t.NAME`, or `.h.HASH`
/// for a name a queue should not carry as it is.
pub fn queue_suffix(tenant: &str) -> String {
    let plain = tenant.len() <= 64
        && !tenant.is_empty()
        && tenant
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'@'));
    if plain {
        format!(".t.{tenant}")
    } else {
        let hash = blake3::hash(tenant.as_bytes());
        format!(".h.{}", &hash.to_hex()[..32])
    }
}

/// The entry of a tenant's queue in its channel's set of tenant queues:
/// `<lane>|<tenant>`.
pub fn entry(lane: Priority, tenant: &str) -> String {
    format!("{}|{tenant}", lane.as_str())
}

/// An entry read back: its lane and tenant (`None`: not an entry).
pub fn parse_entry(entry: &str) -> Option<(Priority, &str)> {
    let (lane, tenant) = entry.split_once('|')?;
    let lane = Priority::ALL.into_iter().find(|p| p.as_str() == lane)?;
    (!tenant.is_empty()).then_some((lane, tenant))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_strides_and_entries() {
        assert_eq!(member(None), "-");
        assert_eq!(member(Some("acme")), "t:acme");
        assert_eq!(stride(1), 1_000_000);
        assert_eq!(stride(2), 500_000);
        assert_eq!(stride(0), 1_000_000, "never a stride of nothing");
        assert_eq!(queue_suffix("acme-1.eu@x"), ".t.acme-1.eu@x");
        let odd = queue_suffix("a b/ü");
        assert!(odd.starts_with(".h.") && odd.len() == 35, "{odd}");
        assert_eq!(odd, queue_suffix("a b/ü"), "the same name, the same queue");
        let e = entry(Priority::Bulk, "a|b");
        assert_eq!(parse_entry(&e), Some((Priority::Bulk, "a|b")));
        assert_eq!(parse_entry("bulk|"), None);
        assert_eq!(parse_entry("loud|x"), None);
    }
}
