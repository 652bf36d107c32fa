//! Every Lua script, registered in one place: its source (`lua/*.lua`, each opening
//! with its KEYS, ARGV and reply; the admission's script lives in its room,
//! `src/admission/lua/`, and `lua/gcra.lua` is shared by the rate's and the lanes'
//! scripts) and its `redis::Script` (which knows its SHA).
//! [`Scripts::load`] sends them all at start; a node that lost them since (a
//! restart, a failover) answers NOSCRIPT and the call loads its script again.

use redis::Script;

use super::conn::RedisConn;

/// `src/admission/lua/` (the admission's room): a recipient's caps, checked and
/// recorded (many jobs a call), its parts in the order they are joined (each uses
/// only what the ones before define).
pub const ADMIT_PARTS: [(&str, &str); 8] = [
    (
        "protocol.lua",
        include_str!("../admission/lua/protocol.lua"),
    ),
    ("plans.lua", include_str!("../admission/lua/plans.lua")),
    ("limits.lua", include_str!("../admission/lua/limits.lua")),
    ("layers.lua", include_str!("../admission/lua/layers.lua")),
    (
        "recipient.lua",
        include_str!("../admission/lua/recipient.lua"),
    ),
    (
        "suppression.lua",
        include_str!("../admission/lua/suppression.lua"),
    ),
    (
        "preferences.lua",
        include_str!("../admission/lua/preferences.lua"),
    ),
    ("answer.lua", include_str!("../admission/lua/answer.lua")),
];
/// `src/admission/lua/`, joined (the parts of [`ADMIT_PARTS`], in order).
pub const ADMIT_LUA: &str = concat!(
    include_str!("../admission/lua/protocol.lua"),
    include_str!("../admission/lua/plans.lua"),
    include_str!("../admission/lua/limits.lua"),
    include_str!("../admission/lua/layers.lua"),
    include_str!("../admission/lua/recipient.lua"),
    include_str!("../admission/lua/suppression.lua"),
    include_str!("../admission/lua/preferences.lua"),
    include_str!("../admission/lua/answer.lua"),
);
/// `lua/rate.lua`: a channel's GCRA send rate (after `lua/gcra.lua`, what it shares
/// with `lua/lanes.lua`: the reply's names, the read and the write of the rate key).
pub const RATE_LUA: &str = concat!(
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/rate.lua")
);
/// `lua/lanes.lua`: a channel's GCRA send rate, taken by a job in a lane (after
/// `lua/gcra.lua`).
pub const LANES_LUA: &str = concat!(
    include_str!("../../lua/gcra.lua"),
    include_str!("../../lua/lanes.lua")
);
/// `lua/refund.lua`: what a take of the rate added and is still unspent, back.
pub const REFUND_LUA: &str = include_str!("../../lua/refund.lua");
/// `lua/release.lua`: an admission's own reservation, given back.
pub(crate) const RELEASE_LUA: &str = include_str!("../../lua/release.lua");
/// `lua/import.lua`: a past send imported by the admin.
pub(crate) const IMPORT_LUA: &str = include_str!("../../lua/import.lua");
/// `lua/feedback.lua`: one feedback about a recipient, applied once.
pub const FEEDBACK_LUA: &str = include_str!("../../lua/feedback.lua");
/// `lua/route_claim.lua`: a routed step's move to its next channel, claimed once.
pub(crate) const ROUTE_CLAIM_LUA: &str = include_str!("../../lua/route_claim.lua");
/// `lua/preferences.lua`: one recipient's preferences replaced whole, or removed.
pub(crate) const PREFERENCES_LUA: &str = include_str!("../../lua/preferences.lua");
/// `lua/throttle.lua`: a channel's rate paused after a 429, once per feedback.
pub const THROTTLE_LUA: &str = include_str!("../../lua/throttle.lua");
/// `lua/collapse.lua`: the newest job of a recipient's collapse key.
pub(crate) const COLLAPSE_LUA: &str = include_str!("../../lua/collapse.lua");
/// `lua/digest_fold.lua`: a job folded into its group's open digest.
pub(crate) const DIGEST_FOLD_LUA: &str = include_str!("../../lua/digest_fold.lua");
/// `lua/digest_claim.lua`: the digests due to close, each claimed for a lease.
pub(crate) const DIGEST_CLAIM_LUA: &str = include_str!("../../lua/digest_claim.lua");
/// `lua/digest_close.lua`: a digest closed, its items read.
pub(crate) const DIGEST_CLOSE_LUA: &str = include_str!("../../lua/digest_close.lua");
/// `lua/digest_reopen.lua`: a held digest refused when it went, open again.
pub(crate) const DIGEST_REOPEN_LUA: &str = include_str!("../../lua/digest_reopen.lua");

/// `lua/lease.lua`: a lease renewed or ended, if still its taker's.
pub(crate) const LEASE_LUA: &str = include_str!("../../lua/lease.lua");
/// `lua/dead_index.lua`: the console's index of dead letters, written or forgotten.
pub(crate) const DEAD_INDEX_LUA: &str = include_str!("../../lua/dead_index.lua");
/// `lua/dead_page.lua`: a page of the console's index of dead letters.
pub(crate) const DEAD_PAGE_LUA: &str = include_str!("../../lua/dead_page.lua");

/// The scripts, ready to invoke by SHA; those of one room grouped
/// ([`ChannelScripts`], [`DigestScripts`], [`DeadLetterScripts`]).
#[derive(Debug, Clone)]
pub struct Scripts {
    /// `src/admission/lua/`.
    pub admit: Script,
    /// `src/admission/lua/` flagged `allow-cross-slot-keys` (Redis 7.0 and later), for
    /// a cluster's per-node calls, which carry keys they do not declare.
    pub admit_cross_slot: Script,
    /// A channel's send rate and lanes.
    pub channel: ChannelScripts,
    /// `lua/release.lua`.
    pub release: Script,
    /// `lua/import.lua`.
    pub import: Script,
    /// `lua/collapse.lua`.
    pub collapse: Script,
    /// `lua/feedback.lua`.
    pub feedback: Script,
    /// `lua/throttle.lua`.
    pub throttle: Script,
    /// `lua/preferences.lua`.
    pub preferences: Script,
    /// `lua/route_claim.lua`.
    pub route_claim: Script,
    /// The digests'.
    pub digest: DigestScripts,
    /// The dead letters' (the console's index and the walks' lease).
    pub dead: DeadLetterScripts,
}

/// A channel's send rate: taken, taken by a job in a lane, given back.
#[derive(Debug, Clone)]
pub struct ChannelScripts {
    /// `lua/rate.lua`.
    pub rate: Script,
    /// `lua/lanes.lua`.
    pub lanes: Script,
    /// `lua/refund.lua`.
    pub refund: Script,
}

/// The digests' scripts.
#[derive(Debug, Clone)]
pub struct DigestScripts {
    /// `lua/digest_fold.lua`.
    pub fold: Script,
    /// `lua/digest_claim.lua`.
    pub claim: Script,
    /// `lua/digest_close.lua`.
    pub close: Script,
    /// `lua/digest_reopen.lua`.
    pub reopen: Script,
}

/// The dead letters' scripts.
#[derive(Debug, Clone)]
pub struct DeadLetterScripts {
    /// `lua/lease.lua`.
    pub lease: Script,
    /// `lua/dead_index.lua`.
    pub index: Script,
    /// `lua/dead_page.lua`.
    pub page: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Scripts {
            admit: Script::new(ADMIT_LUA),
            admit_cross_slot: Script::new(&format!(
                "#!lua flags=allow-cross-slot-keys\n{ADMIT_LUA}"
            )),
            channel: ChannelScripts {
                rate: Script::new(RATE_LUA),
                lanes: Script::new(LANES_LUA),
                refund: Script::new(REFUND_LUA),
            },
            release: Script::new(RELEASE_LUA),
            import: Script::new(IMPORT_LUA),
            collapse: Script::new(COLLAPSE_LUA),
            feedback: Script::new(FEEDBACK_LUA),
            throttle: Script::new(THROTTLE_LUA),
            preferences: Script::new(PREFERENCES_LUA),
            route_claim: Script::new(ROUTE_CLAIM_LUA),
            digest: DigestScripts {
                fold: Script::new(DIGEST_FOLD_LUA),
                claim: Script::new(DIGEST_CLAIM_LUA),
                close: Script::new(DIGEST_CLOSE_LUA),
                reopen: Script::new(DIGEST_REOPEN_LUA),
            },
            dead: DeadLetterScripts {
                lease: Script::new(LEASE_LUA),
                index: Script::new(DEAD_INDEX_LUA),
                page: Script::new(DEAD_PAGE_LUA),
            },
        }
    }
}

impl Scripts {
    /// `SCRIPT LOAD` every script (on a cluster, on every node, with the flagged
    /// admission script).
    pub async fn load(&self, conn: &RedisConn) -> redis::RedisResult<()> {
        let mut conn = conn.clone();
        if matches!(conn, RedisConn::Cluster(..)) {
            self.admit_cross_slot.load_async(&mut conn).await?;
        }
        for script in [
            &self.admit,
            &self.channel.rate,
            &self.channel.lanes,
            &self.channel.refund,
            &self.release,
            &self.import,
            &self.collapse,
            &self.feedback,
            &self.throttle,
            &self.preferences,
            &self.route_claim,
            &self.digest.fold,
            &self.digest.claim,
            &self.digest.close,
            &self.digest.reopen,
            &self.dead.lease,
            &self.dead.index,
            &self.dead.page,
        ] {
            script.load_async(&mut conn).await?;
        }
        Ok(())
    }
}
