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

    /// The key names for the recipients of `tenant`: the same phone number under two
    /// tenants is two recipients, so the tenant keys the hash (a recipient with no
    /// tenant keeps the names it always had).
    pub fn for_tenant(&self, tenant: Option<&str>) -> std::borrow::Cow<'_, Keys> {
        match tenant {
            None => std::borrow::Cow::Borrowed(self),
            Some(t) => {
                let mut hasher = blake3::Hasher::new_keyed(&self.recipient_key);
                hasher.update(b"tenant\0").update(t.as_bytes());
                std::borrow::Cow::Owned(Keys {
                    prefix: self.prefix.clone(),
                    recipient_key: *hasher.finalize().as_bytes(),
                })
            }
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The hash tag that stands for `recipient`: 96 bits of a keyed hash, base64url.
    pub fn recipient_tag(&self, recipient: &str) -> String {
        tag96(&blake3::keyed_hash(
            &self.recipient_key,
            recipient.as_bytes(),
        ))
    }

    /// What the erase mark holds for `recipient` (`crate::erase::marks`): 96 bits
    /// of a keyed hash of its own, base64url, so that the mark left after an erase
    /// is not the recipient's tag (no other key can be found from it).
    pub fn erase_mark(&self, recipient: &str) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.recipient_key);
        h.update(b"erased\0").update(recipient.as_bytes());
        tag96(&h.finalize())
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

    /// The sorted set of a recipient's sends under cap `cap` (and `channel`, when the
    /// cap counts per channel): `prefix:{tag}/cap/NAME[:channel]`, in the slot of the
    /// recipient's other keys and apart from every policy's (`}:`).
    pub fn cap(&self, recipient: &str, cap: &str, channel: Option<&str>) -> String {
        let tag = self.recipient_tag(recipient);
        let extra = channel.map_or(0, |c| c.len() + 1);
        let mut key = String::with_capacity(self.prefix.len() + tag.len() + cap.len() + 8 + extra);
        key.push_str(&self.prefix);
        key.push_str(":{");
        key.push_str(&tag);
        key.push_str("}/cap/");
        key.push_str(cap);
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

    /// The keys of a digest group (docs/guide/digests.md): the group's hash
    /// (`prefix:{tag}/dg/GROUP`), the base of its digests' keys (`prefix:{tag}/`:
    /// `dgm/ID` the digest, `dgi/ID` its items, `dgo/ID` their order) and GROUP, a
    /// keyed hash of the recipient, channel and key (the tenant keys it too, through
    /// [`Keys::for_tenant`]). All in the recipient's hash slot.
    pub fn digest_group(&self, recipient: &str, channel: &str, key: &str) -> DigestGroup {
        let tag = self.recipient_tag(recipient);
        let mut h = blake3::Hasher::new_keyed(&self.recipient_key);
        h.update(b"digest\0").update(recipient.as_bytes());
        h.update(b"\0").update(channel.as_bytes());
        h.update(b"\0").update(key.as_bytes());
        let group =
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&h.finalize().as_bytes()[..9]);
        let base = format!("{}:{{{tag}}}/", self.prefix);
        DigestGroup {
            key: format!("{base}dg/{group}"),
            mark_base: format!("{base}dgj/"),
            base,
            group,
        }
    }

    /// The sorted set of the digests to close, by the instant they close (ms):
    /// member = the digest's key.
    pub fn digests(&self) -> String {
        format!("{}:digests", self.prefix)
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

    /// The erase marks (`crate::erase::marks`): a sorted set of erased
    /// recipients' marks ([`Keys::erase_mark`]), scored by when each was erased (ms).
    pub fn erased(&self) -> String {
        format!("{}:erased", self.prefix)
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

    /// A limit's GCRA bucket (`src/admission/lua/limits.lua`): `prefix:limit:NAME` for
    /// `per = "all"`, else `prefix:limit:NAME:t:HASH` (a tenant) or
    /// `prefix:limit:NAME:s:HASH` (a sender), the tenant or sender hashed as
    /// recipients are (keys of one length whatever it writes, never in clear).
    pub fn limit(&self, name: &str, (kind, value): (&str, &str)) -> String {
        if kind.is_empty() {
            return format!("{}:limit:{name}", self.prefix);
        }
        // the keyed hash of `kind \0 value`, fed in parts (no buffer made for it)
        let mut h = blake3::Hasher::new_keyed(&self.recipient_key);
        h.update(kind.as_bytes())
            .update(b"\0")
            .update(value.as_bytes());
        let tag = tag96(&h.finalize());
        format!("{}:limit:{name}:{kind}:{tag}", self.prefix)
    }

    /// The fair-share schedule of a channel's lane (`lua/lanes.lua`), in its rate
    /// key's slot: `prefix:fair:{channel}:<lane>`.
    pub fn fair_schedule(&self, channel: &str, lane: &str) -> String {
        format!("{}:fair:{{{channel}}}:{lane}", self.prefix)
    }

    /// A channel's set of tenant queues (`lanes::tenants`), with its version
    /// counter beside it: `prefix:fair:{channel}:queues`.
    pub fn fair_queues(&self, channel: &str) -> String {
        format!("{}:fair:{{{channel}}}:queues", self.prefix)
    }

    /// A channel's lane state (`lua/lanes.lua`), in its rate key's slot.
    pub fn lanes(&self, channel: &str) -> String {
        format!("{}:lanes:{{{channel}}}", self.prefix)
    }
    /// The hash of a recipient's suppressions: field = channel, value as
    /// [`crate::quota::suppression::Suppression::encode`] writes it. `src/admission/lua/`
    /// derives it from a recipient key: its first `prefix.len() + 19` bytes
    /// (`prefix:{tag}`, the tag 16 bytes), then `/suppressed`.
    pub fn suppressed(&self, recipient: &str) -> String {
        format!(
            "{}:{{{}}}/suppressed",
            self.prefix,
            self.recipient_tag(recipient)
        )
    }

    /// The hash of a recipient's preferences: `set` (the JSON), `updated_at` (ms) and
    /// the opt-out fields of [`crate::preferences::set::fields`]. `src/admission/lua/`
    /// derives it from a recipient key as it does [`Keys::suppressed`].
    pub fn preferences(&self, recipient: &str) -> String {
        format!(
            "{}:{{{}}}/prefs",
            self.prefix,
            self.recipient_tag(recipient)
        )
    }

    /// Set once any recipient has preferences: while it is absent, admissions skip
    /// the preferences check.
    pub fn preferences_flag(&self) -> String {
        format!("{}:preferences", self.prefix)
    }

    /// Set once any recipient is suppressed: while it is absent, admissions skip
    /// the suppression check.
    pub fn suppressions_flag(&self) -> String {
        format!("{}:suppressions", self.prefix)
    }

    /// The mark of one feedback (job id, event, channel) already applied to
    /// `recipient`, in the recipient's slot (applied atomically with what it
    /// marks). The channel counts: a job with `fallback` is sent on several, and
    /// each step's failure gives its own send back.
    pub fn feedback_mark(&self, recipient: &str, id: &str, event: &str, channel: &str) -> String {
        format!(
            "{}:{{{}}}/feedback:{}",
            self.prefix,
            self.recipient_tag(recipient),
            mark_hash(id, &format!("{event}@{channel}"))
        )
    }

    /// The next step of job `id`'s route after its step on `channel`, kept while
    /// that send may still fail (module `crate::fallback::state`), in the
    /// recipient's slot.
    pub fn route(&self, recipient: &str, id: &str, channel: &str) -> String {
        format!(
            "{}:{{{}}}/route:{}",
            self.prefix,
            self.recipient_tag(recipient),
            mark_hash(id, channel)
        )
    }

    /// A channel's throttle state (`strikes`, `last`), in the slot of its rate key.
    pub fn throttle(&self, channel: &str) -> String {
        format!("{}:rate:{{{channel}}}:throttle", self.prefix)
    }

    /// A quota's counter for one period: `prefix:quota:NAME:WINDOW[:KIND:HASH]:START`
    /// (the tenant or sender hashed as for [`Keys::limit`], START the period's
    /// first instant in ms).
    pub fn quota(&self, name: &str, window: &str, bucket: (&str, &str), start_ms: i64) -> String {
        let limit = self.limit(name, bucket);
        let rest = &limit[self.prefix.len() + ":limit:".len() + name.len()..];
        format!("{}:quota:{name}:{window}{rest}:{start_ms}", self.prefix)
    }

    /// A limit's warm-up count of one day: `prefix:warmup:NAME[:KIND:HASH]:START`.
    pub fn warmup(&self, name: &str, bucket: (&str, &str), start_ms: i64) -> String {
        let limit = self.limit(name, bucket);
        let rest = &limit[self.prefix.len() + ":limit:".len() + name.len()..];
        format!("{}:warmup:{name}{rest}:{start_ms}", self.prefix)
    }

    /// The throttle state (strikes) of a limit's bucket `bucket` (its key).
    pub fn limit_throttle(&self, bucket: &str) -> String {
        format!("{bucket}:throttle")
    }

    /// The mark of one `throttled` feedback already applied to the limit's bucket
    /// `bucket` (its key).
    pub fn limit_throttle_mark(&self, bucket: &str, id: &str) -> String {
        format!("{bucket}:feedback:{}", mark_hash(id, "throttled"))
    }

    /// The mark of one `throttled` feedback already applied to `channel`.
    pub fn throttle_mark(&self, channel: &str, id: &str) -> String {
        format!(
            "{}:rate:{{{channel}}}:feedback:{}",
            self.prefix,
            mark_hash(id, "throttled")
        )
    }

    /// The feedback heard about job `id` (`admin job ID` reads it): a hash, field
    /// = event, value = JSON.
    pub fn job_feedback(&self, id: &str) -> String {
        format!("{}:feedback:{id}", self.prefix)
    }

    /// The steps of job `id`'s route (`admin job ID` reads it): a list of JSON
    /// entries (module `crate::fallback::log`).
    pub fn job_route(&self, id: &str) -> String {
        format!("{}:route:{id}", self.prefix)
    }
}

/// 128 bits of the hash of a feedback's job id and event, hex.
fn mark_hash(id: &str, event: &str) -> String {
    let mut h = blake3::Hasher::new();
    h.update(id.as_bytes())
        .update(&[0])
        .update(event.as_bytes());
    h.finalize().to_hex()[..32].to_string()
}

/// The keys of one digest group ([`Keys::digest_group`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestGroup {
    /// The group's hash: its open digest's id, a counter.
    pub key: String,
    /// The base of its digests' keys (`prefix:{tag}/`).
    pub base: String,
    /// The base of its jobs' marks (`prefix:{tag}/dgj/`, then the job id).
    pub mark_base: String,
    /// The group's keyed hash (in its digests' ids).
    pub group: String,
}

/// A digest's keys, all in its recipient's hash slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DigestKeys {
    /// The digest's hash (`prefix:{tag}/dgm/ID`: the key the index holds).
    pub meta: String,
    /// Its items (`dgi/ID`).
    pub items: String,
    /// Their order (`dgo/ID`).
    pub order: String,
}

/// A digest's keys from the key the index holds (`prefix:{tag}/dgm/ID`); `None` if
/// it is not such a key.
pub fn digest_keys(meta: &str) -> Option<DigestKeys> {
    let at = meta.rfind("}/dgm/")? + 2;
    let (base, id) = (&meta[..at], &meta[at + 4..]);
    Some(DigestKeys {
        meta: meta.to_string(),
        items: format!("{base}dgi/{id}"),
        order: format!("{base}dgo/{id}"),
    })
}

/// The set of a recipient's open digests, from a digest's key (`prefix:{tag}/dgs`),
/// and the digest's id.
pub fn digest_set(meta: &str) -> Option<(String, &str)> {
    let at = meta.rfind("}/dgm/")? + 2;
    Some((format!("{}dgs", &meta[..at]), &meta[at + 4..]))
}

/// Bytes of the job-id hash kept as the sorted-set member. Seven bytes (56 bits)
/// keep a recipient with three sends in Redis's 136-byte allocation class (eight
/// would take 152); two ids of one recipient collide with odds of about 1 in 7e16.
pub(crate) const MEMBER_BYTES: usize = 7;

/// The sorted-set member that stands for a job id: the first [`MEMBER_BYTES`] bytes
/// of its BLAKE3 hash, whatever the id's length.
pub fn member(job_id: &str) -> Vec<u8> {
    blake3::hash(job_id.as_bytes()).as_bytes()[..MEMBER_BYTES].to_vec()
}

/// A hash's first 96 bits, base64url (16 characters): the tags keys hide a
/// recipient, tenant or sender behind.
fn tag96(hash: &blake3::Hash) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hash.as_bytes()[..12])
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
        let g = keys.digest_group("+33 6 12 34 56 78", "sms", "social");
        assert_eq!(tag(&g.key), tag(&a));
        assert!(g.key.starts_with(&g.base) && g.mark_base.starts_with(&g.base));
        assert_ne!(g, keys.digest_group("+33 6 12 34 56 78", "sms", "other"));
        let meta = format!("{}dgm/dg-x-1", g.base);
        let DigestKeys {
            meta: m,
            items,
            order,
        } = digest_keys(&meta).unwrap();
        assert_eq!((m, items), (meta.clone(), format!("{}dgi/dg-x-1", g.base)));
        assert_eq!(order, format!("{}dgo/dg-x-1", g.base));
        let (set, id) = digest_set(&meta).unwrap();
        assert_eq!((set, id), (format!("{}dgs", g.base), "dg-x-1"));
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
        // the suppressions share the slot and src/admission/lua/ finds them from a policy key
        let s = keys.suppressed("+33 6 12 34 56 78");
        assert_eq!(s, format!("{}/suppressed", &a[.."qw".len() + 19]));
        let m = keys.feedback_mark("+33 6 12 34 56 78", "job-1", "failed", "sms");
        assert_eq!(tag(&m), tag(&a));
        assert_ne!(
            m,
            keys.feedback_mark("+33 6 12 34 56 78", "job-1", "bounced", "sms")
        );
        assert_eq!(tag(&keys.throttle_mark("sms", "j")), tag(&keys.rate("sms")));
    }

    #[test]
    fn a_tenant_makes_other_recipients_in_slots_of_their_own() {
        let keys = Keys::new("qw", "secret");
        let plain = keys.for_tenant(None);
        assert_eq!(plain.recipient_tag("+1"), keys.recipient_tag("+1"));
        let (a, b) = (keys.for_tenant(Some("a")), keys.for_tenant(Some("b")));
        assert_ne!(a.recipient_tag("+1"), keys.recipient_tag("+1"));
        assert_ne!(a.recipient_tag("+1"), b.recipient_tag("+1"));
        assert_eq!(
            a.recipient_tag("+1"),
            keys.for_tenant(Some("a")).recipient_tag("+1")
        );
        let t = a.recipient_tag("+1");
        assert_eq!(a.cap("+1", "daily", None), format!("qw:{{{t}}}/cap/daily"));
        assert_eq!(
            a.cap("+1", "daily", Some("sms")),
            format!("qw:{{{t}}}/cap/daily:sms")
        );
    }

    #[test]
    fn a_limits_bucket_key_is_the_keyed_hash_of_its_kind_and_value() {
        let keys = Keys::new("qw", "secret");
        assert_eq!(keys.limit("all", ("", "")), "qw:limit:all");
        // the key deployed buckets already have: the hash of `kind \0 value` whole
        let hash = blake3::keyed_hash(&keys.recipient_key, b"s\0+15550100");
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hash.as_bytes()[..12]);
        let key = keys.limit("per_sender", ("s", "+15550100"));
        assert_eq!(key, format!("qw:limit:per_sender:s:{tag}"));
        assert!(!key.contains("5550100"));
        assert_ne!(key, keys.limit("per_sender", ("t", "+15550100")));
    }

    #[test]
    fn members_are_short() {
        let m = member("a-very-long-job-id-0123456789-0123456789-0123456789");
        assert_eq!(m.len(), MEMBER_BYTES);
        assert_ne!(member("a"), member("b"));
        assert_eq!(member("a"), member("a"));
    }
}
