//! The Redis side of an erase. Every key of a recipient carries its tag
//! (`prefix:{tag}…`, one hash slot), so a `SCAN` for `prefix:{tag}*` finds them
//! all, whatever policy, cap, channel, digest group, feedback or route made them
//! (a `SCAN` of each primary on a cluster). [`store_of`] names the store of each
//! (pure); [`erase_keys`] deletes them (the suppressions kept, as a tombstone,
//! when asked) and takes the recipient's open digests out of the index of
//! digests to close, so that none is closed and sent.

use std::collections::BTreeMap;

use crate::quota::keys::Keys;
use crate::redis::scan::{escape_glob, scan_match};
use crate::redis::{RedisConn, StoreError};

/// Keys deleted in one `DEL` at most.
const CHUNK: usize = 500;

/// The store a key of the recipient belongs to, from what follows its
/// `prefix:{tag}`: `sends` (a policy's or a cap's), `waiting`, `collapse_keys`,
/// `suppressions`, `preferences`, `feedback_marks`, `routes` (the next step of a
/// route, pending escalations), `digests`; `other` for a name this build does not
/// know (deleted all the same: it is the recipient's).
pub fn store_of(rest: &str) -> &'static str {
    if rest.starts_with(':') || rest.starts_with("/cap/") {
        return "sends";
    }
    let Some(name) = rest.strip_prefix('/') else {
        return "other";
    };
    match name {
        "waiting" => "waiting",
        "collapse" => "collapse_keys",
        "suppressed" => "suppressions",
        "prefs" => "preferences",
        "dgs" => "digests",
        n if n.starts_with("feedback:") => "feedback_marks",
        n if n.starts_with("route:") => "routes",
        n if ["dg/", "dgm/", "dgi/", "dgo/", "dgj/"]
            .iter()
            .any(|p| n.starts_with(p)) =>
        {
            "digests"
        }
        _ => "other",
    }
}

/// What [`erase_keys`] did.
#[derive(Debug, Default)]
pub struct KeysErased {
    /// Keys deleted, by store.
    pub by_store: BTreeMap<String, u64>,
    /// Waiting jobs the recipient's waiting set held.
    pub waiting_jobs: u64,
    /// Items of its open digests, dropped unsent.
    pub digest_items: u64,
    /// Open digests taken out of the index of digests to close.
    pub open_digests: u64,
    /// Stores kept (`suppressions`, with `--keep-suppression`).
    pub kept: Vec<String>,
}

/// Delete every key of the recipient whose tag is `tag` (under `keys`, the
/// tenant's), but its suppressions when `keep_suppression`.
pub async fn erase_keys(
    conn: &RedisConn,
    keys: &Keys,
    tag: &str,
    keep_suppression: bool,
) -> Result<KeysErased, StoreError> {
    let base = format!("{}:{{{tag}}}", keys.prefix());
    let found = scan_match(conn, &format!("{}*", escape_glob(&base))).await?;
    let mut out = KeysErased::default();
    let mut doomed = Vec::new();
    for key in found {
        let store = store_of(&key[base.len()..]);
        if store == "suppressions" && keep_suppression {
            out.kept.push(store.to_string());
            continue;
        }
        doomed.push((store, key));
    }
    let mut c = conn.clone();
    for (store, key) in &doomed {
        if key.contains("}/dgm/") {
            let gone: u64 = redis::cmd("ZREM")
                .arg(keys.digests())
                .arg(key)
                .query_async(&mut c)
                .await?;
            out.open_digests += gone;
        }
        if key.contains("}/dgi/") {
            out.digest_items += redis::cmd("HLEN")
                .arg(key)
                .query_async::<u64>(&mut c)
                .await?;
        }
        if *store == "waiting" {
            out.waiting_jobs += redis::cmd("ZCARD")
                .arg(key)
                .query_async::<u64>(&mut c)
                .await?;
        }
    }
    // the index entries go first: a closer that finds a digest's key gone does
    // nothing, one that claimed it already finds its items gone
    for chunk in doomed.chunks(CHUNK) {
        let names: Vec<&str> = chunk.iter().map(|(_, k)| k.as_str()).collect();
        let _: u64 = redis::cmd("DEL").arg(&names).query_async(&mut c).await?;
        for (store, _) in chunk {
            *out.by_store.entry(store.to_string()).or_default() += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_a_recipient_is_named_by_its_store() {
        let keys = Keys::new("qw", "s");
        let tag = keys.recipient_tag("+1");
        let base = format!("qw:{{{tag}}}");
        let rest = |k: String| store_of(&k[base.len()..]);
        assert_eq!(rest(keys.recipient("+1", "default", None)), "sends");
        assert_eq!(rest(keys.recipient("+1", "default", Some("sms"))), "sends");
        assert_eq!(rest(keys.cap("+1", "daily", Some("sms"))), "sends");
        assert_eq!(rest(keys.waiting("+1")), "waiting");
        assert_eq!(rest(keys.collapse("+1")), "collapse_keys");
        assert_eq!(rest(keys.suppressed("+1")), "suppressions");
        assert_eq!(rest(keys.preferences("+1")), "preferences");
        assert_eq!(
            rest(keys.feedback_mark("+1", "j", "failed", "sms")),
            "feedback_marks"
        );
        assert_eq!(rest(keys.route("+1", "j", "sms")), "routes");
        let g = keys.digest_group("+1", "sms", "k");
        assert_eq!(rest(g.key.clone()), "digests");
        assert_eq!(rest(format!("{}dgm/x", g.base)), "digests");
        assert_eq!(rest(format!("{}dgs", g.base)), "digests");
        assert_eq!(rest(format!("{}j1", g.mark_base)), "digests");
        assert_eq!(rest(format!("{base}/what")), "other");
    }
}
