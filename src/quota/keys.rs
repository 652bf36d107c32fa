//! Redis key names. Recipients never appear in clear: they are replaced by a keyed
//! BLAKE3 hash. Every key of one recipient carries the same `{hash tag}`, so the
//! admission script touches a single hash slot and runs unchanged on Redis Cluster.

use base64::Engine as _;

/// Builds every key name the worker uses.
#[derive(Clone)]
pub struct Keys {
    prefix: String,
    recipient_key: [u8; 32],
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl Keys {
    /// `prefix` starts every key; `secret` keys the recipient hash.
    pub fn new(prefix: &str, secret: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
            recipient_key: blake3::derive_key(
                "quota-worker 2026 recipient key names",
                secret.as_bytes(),
            ),
        }
    }

    /// The keys `redis.key_prefix` and `redis.hash_key` give.
    pub fn from_settings(redis: &crate::config::RedisSettings) -> Keys {
        use secrecy::ExposeSecret;
        Keys::new(&redis.key_prefix, redis.hash_key.expose_secret())
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The hash tag that stands for `recipient`: 96 bits of a keyed hash, base64url.
    pub fn recipient_tag(&self, recipient: &str) -> String {
        let hash = blake3::keyed_hash(&self.recipient_key, recipient.as_bytes());
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hash.as_bytes()[..12])
    }

    /// The sorted set of a recipient's sends under `policy` (and `channel`, when the
    /// policy counts per channel).
    pub fn recipient(&self, recipient: &str, policy: &str, channel: Option<&str>) -> String {
        // `prefix:{tag}:policy[:channel]`, built without `format!` (one per job)
        let tag = self.recipient_tag(recipient);
        let extra = channel.map_or(0, |c| c.len() + 1);
        let mut key =
            String::with_capacity(self.prefix.len() + tag.len() + policy.len() + 4 + extra);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(&tag);
        key.push_str("}:");
        key.push_str(policy);
        if let Some(c) = channel {
            key.push(':');
            key.push_str(c);
        }
        key
    }

    /// The sorted set of a recipient's waiting jobs: member = job id, score = the
    /// instant (ms) it waits for. `prefix:{tag}/waiting`: the `/` keeps it apart
    /// from every policy's set (`prefix:{tag}:policy`), in the same hash slot.
    pub fn waiting(&self, recipient: &str) -> String {
        // built without `format!`: one per delayed job
        let tag = self.recipient_tag(recipient);
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + 11);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(&tag);
        key.push_str("}/waiting");
        key
    }

    /// The hash of a recipient's collapse keys: field = collapse key, value =
    /// `first_seen_ms:job id` of the newest job with that key.
    pub fn collapse(&self, recipient: &str) -> String {
        format!(
            "{}:{{{}}}/collapse",
            self.prefix,
            self.recipient_tag(recipient)
        )
    }

    /// What the worker last did with job `id` (`admin job ID` reads it).
    pub fn job(&self, id: &str) -> String {
        let mut key = String::with_capacity(self.prefix.len() + id.len() + 5);
        key.push_str(&self.prefix);
        key.push_str(":job:");
        key.push_str(id);
        key
    }

    /// The sorted set of cancelled job ids (score: when, ms), and the counter
    /// raised at each change of it (workers reread the set when it moves).
    pub fn cancelled(&self) -> (String, String) {
        (
            format!("{}:cancelled", self.prefix),
            format!("{}:cancelled:version", self.prefix),
        )
    }

    /// The reset marker (a value written once, whose loss says Redis lost its
    /// data) and the pause mark (`redis.on_reset = "pause"`), in one hash slot:
    /// `prefix:{reset}/marker`, `prefix:{reset}/paused`.
    pub fn reset(&self) -> (String, String) {
        (
            format!("{}:{{reset}}/marker", self.prefix),
            format!("{}:{{reset}}/paused", self.prefix),
        )
    }

    /// A channel's GCRA key.
    pub fn rate(&self, channel: &str) -> String {
        format!("{}:rate:{{{channel}}}", self.prefix)
    }
}

/// Bytes of the job-id hash kept as the sorted-set member. Seven bytes (56 bits)
/// keep a recipient with three sends in Redis's 136-byte allocation class (eight
/// would take 152); two ids of one recipient collide with odds of about 1 in 7e16.
pub const MEMBER_BYTES: usize = 7;

/// The sorted-set member that stands for a job id: the first [`MEMBER_BYTES`] bytes
/// of its BLAKE3 hash, whatever the id's length.
pub fn member(job_id: &str) -> Vec<u8> {
    blake3::hash(job_id.as_bytes()).as_bytes()[..MEMBER_BYTES].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recipient_keys_hide_the_recipient_and_share_one_slot() {
        let keys = Keys::new("qw", "secret");
        let a = keys.recipient("+33 6 12 34 56 78", "default", None);
        let b = keys.recipient("+33 6 12 34 56 78", "default", Some("sms"));
        assert!(!a.contains("33 6"));
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_string();
        assert_eq!(tag(&a), tag(&b));
        assert_ne!(a, keys.recipient("+33 6 12 34 56 79", "default", None));
        assert_ne!(
            a,
            Keys::new("qw", "other").recipient("+33 6 12 34 56 78", "default", None)
        );
        assert_eq!(keys.recipient_tag("x").len(), 16);
        let t = keys.recipient_tag("+33 6 12 34 56 78");
        assert_eq!(a, format!("qw:{{{t}}}:default"));
        assert_eq!(b, format!("qw:{{{t}}}:default:sms"));
        // the waiting jobs and collapse keys share the slot, and no policy's name
        // can give their names (a policy key has `}:` where they have `}/`)
        let (w, c) = (
            keys.waiting("+33 6 12 34 56 78"),
            keys.collapse("+33 6 12 34 56 78"),
        );
        assert_eq!((tag(&w), tag(&c)), (tag(&a), tag(&a)));
        assert_ne!(w, keys.recipient("+33 6 12 34 56 78", "waiting", None));
        assert_eq!(c, format!("qw:{{{t}}}/collapse"));
    }

    #[test]
    fn members_are_short() {
        let m = member("a-very-long-job-id-0123456789-0123456789-0123456789");
        assert_eq!(m.len(), MEMBER_BYTES);
        assert_ne!(member("a"), member("b"));
        assert_eq!(member("a"), member("a"));
    }
}
