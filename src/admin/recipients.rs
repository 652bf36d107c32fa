//! A recipient's recorded sends, layer by layer (its policies, then the caps): each
//! rule's count and limit, the next allowed instant, and the admin's import of past
//! sends (`record`) and reset.

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use super::AdminError;
use crate::config::Settings;
use crate::quota::caps::Cap;
use crate::quota::keys::{self, Keys};
use crate::quota::policy::{Policy, Scope};
use crate::quota::{send_windows, window};
use crate::redis::{import, notes, RedisConn};
use crate::store::QuotaStore;

/// One recorded send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Send {
    /// The member: first bytes of the job id's hash, hex.
    pub member: String,
    /// When it was admitted (UTC).
    pub at: DateTime<Utc>,
    /// The same instant in the recipient's zone.
    pub at_local: String,
    /// `committed` (dispatch confirmed) or `reserved` (dispatch in progress).
    pub state: &'static str,
    /// Whether it counts toward at least one rule now (otherwise it is only
    /// remembered to recognise a duplicate).
    pub counting: bool,
}

/// One rule of a policy, now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RuleStatus {
    /// The window as written (`1d`, `7d`, `30s`).
    pub window: String,
    /// The limit.
    pub limit: u32,
    /// Sends counting now.
    pub count: u32,
    /// Where the window starts now (UTC).
    pub window_start: DateTime<Utc>,
    /// Whether one more send would be refused by this rule.
    pub full: bool,
}

/// The next instant a send is allowed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NextAllowed {
    /// In UTC.
    pub utc: DateTime<Utc>,
    /// In the recipient's zone.
    pub local: String,
    /// Whether that is now.
    pub now: bool,
}

impl NextAllowed {
    /// `t`, also in `tz`; now if it is not after `now`.
    fn at(t: DateTime<Utc>, tz: Tz, now: DateTime<Utc>) -> NextAllowed {
        NextAllowed {
            utc: t,
            local: t.with_timezone(&tz).to_rfc3339(),
            now: t <= now,
        }
    }
}

/// A recipient's sends under one policy (and channel, for per-channel policies).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PolicyStatus {
    /// Policy name.
    pub policy: String,
    /// The channel, for a policy that counts per channel.
    pub channel: Option<String>,
    /// `delay` or `drop`.
    pub action: String,
    /// The Redis key.
    pub key: String,
    /// When the key expires (UTC), if it exists and has an expiry.
    pub key_expires_at: Option<DateTime<Utc>>,
    /// Every send remembered, oldest first.
    pub sends: Vec<Send>,
    /// Each rule.
    pub rules: Vec<RuleStatus>,
    /// The send windows that apply, as `policy: ...` and `channel <name>: ...` (a
    /// channel's only when the query or the policy's scope names the channel).
    pub send_windows: Vec<String>,
    /// The next allowed instant, caps and send windows together; `None`: never (a
    /// limit of 0, or windows that are never open together).
    pub next_allowed: Option<NextAllowed>,
}

/// A recipient's sends under one cap (and channel, for a per-channel cap).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CapStatus {
    /// The cap's name.
    pub cap: String,
    /// The channel, for a cap that counts per channel.
    pub channel: Option<String>,
    /// `enforce` or `shadow`.
    pub mode: &'static str,
    /// The Redis key.
    pub key: String,
    /// When the key expires (UTC), if it exists and has an expiry.
    pub key_expires_at: Option<DateTime<Utc>>,
    /// Every send remembered, oldest first.
    pub sends: Vec<Send>,
    /// Each rule.
    pub rules: Vec<RuleStatus>,
    /// The next instant this cap allows a send (its own rules alone; a job waits
    /// for the latest of its layers'); `None`: never.
    pub next_allowed: Option<NextAllowed>,
}

/// Where the zone `admin recipient` counts calendar windows in came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum ZoneFrom {
    /// `--timezone`.
    Option,
    /// The note of one of the recipient's waiting jobs (the latest noted).
    WaitingJob {
        /// That job's id.
        job: String,
        /// When its note was written.
        noted_at: DateTime<Utc>,
    },
    /// `worker.default_timezone`: no zone given, and no waiting job's note knows one.
    Default,
}

impl std::fmt::Display for ZoneFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZoneFrom::Option => f.write_str("from --timezone"),
            ZoneFrom::WaitingJob { job, noted_at } => write!(
                f,
                "from the note of waiting job `{job}` ({})",
                noted_at.to_rfc3339()
            ),
            ZoneFrom::Default => {
                f.write_str("worker.default_timezone: no waiting job's note knows one")
            }
        }
    }
}

/// What `admin recipient` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RecipientStatus {
    /// The recipient's hash tag (the recipient itself is never stored).
    pub recipient_tag: String,
    /// The tenant asked about (`None`: the recipient with no tenant).
    pub tenant: Option<String>,
    /// The zone used for calendar windows.
    pub timezone: String,
    /// Where that zone came from, when the caller says ([`Recipients::zone`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timezone_from: Option<ZoneFrom>,
    /// Redis time.
    pub now: DateTime<Utc>,
    /// How many of the recipient's jobs wait in the delay ladder (as the workers
    /// noted them; not read from the queues); `None` with `redis.notes = false`.
    pub waiting: Option<u64>,
    /// One entry per policy (and channel).
    pub policies: Vec<PolicyStatus>,
    /// Its suppressions in force (on the query's channel, when it names one).
    pub suppressions: Vec<super::SuppressionInfo>,
    /// The recipient's own preferences (the set, with `updated_at`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preferences: Option<serde_json::Value>,
    /// One entry per cap (and channel) configured for the tenant: every layer
    /// above the policies.
    pub caps: Vec<CapStatus>,
    /// Its open digests (docs/guide/digests.md): group, items, when each closes.
    pub digests: Vec<super::OpenDigest>,
}

/// Which keys of a recipient a command looks at.
#[derive(Debug, Clone)]
pub struct RecipientQuery<'a> {
    /// The recipient, as producers write it.
    pub recipient: &'a str,
    /// Only the policy this category selects (unknown ones select `default`).
    pub category: Option<&'a str>,
    /// Only this channel, for per-channel policies.
    pub channel: Option<&'a str>,
    /// The recipient's zone.
    pub tz: Tz,
    /// The recipient's tenant (`None`: no tenant).
    pub tenant: Option<&'a str>,
}

/// Reads and edits a recipient's recorded sends.
#[derive(Debug)]
pub struct Recipients<'a> {
    store: &'a QuotaStore,
    settings: &'a Settings,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl<'a> Recipients<'a> {
    /// Over a connected store and its settings.
    pub fn new(store: &'a QuotaStore, settings: &'a Settings) -> Self {
        Recipients { store, settings }
    }

    fn check_channel(&self, channel: Option<&str>) -> Result<(), AdminError> {
        match channel {
            Some(c) if !self.settings.channels.contains_key(c) => Err(AdminError::Invalid(
                format!("channel `{c}` is not configured"),
            )),
            _ => Ok(()),
        }
    }

    /// The (policy, channel) pairs a query covers.
    fn targets(&self, q: &RecipientQuery<'_>) -> Result<Vec<(Policy, Option<String>)>, AdminError> {
        self.check_channel(q.channel)?;
        let rules = self.store.rules();
        let policies: Vec<Policy> = match q.category {
            Some(c) => vec![(**rules.policy_of(c, q.tenant)).clone()],
            None => rules
                .policies()
                .map(|p| (**rules.policy_of(&p.name, q.tenant)).clone())
                .collect(),
        };
        let mut out = Vec::new();
        for p in policies {
            match (p.scope, q.channel) {
                (Scope::Recipient, _) => out.push((p, None)),
                (Scope::Channel, Some(c)) => out.push((p, Some(c.to_string()))),
                (Scope::Channel, None) => {
                    for c in self.settings.channels.keys() {
                        out.push((p.clone(), Some(c.clone())));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The zone to count `recipient`'s calendar windows in: `given` (`--timezone`);
    /// else the zone the latest-noted of its waiting jobs was decided in (a job
    /// carries its recipient's zone); else `worker.default_timezone`. With where it
    /// came from.
    pub async fn zone(
        &self,
        recipient: &str,
        given: Option<Tz>,
    ) -> Result<(Tz, ZoneFrom), AdminError> {
        if let Some(tz) = given {
            return Ok((tz, ZoneFrom::Option));
        }
        let default = (self.settings.worker.default_timezone, ZoneFrom::Default);
        if !self.settings.redis.notes {
            return Ok(default);
        }
        let noted =
            notes::waiting_zone(&self.store.connection(), self.store.keys(), recipient).await?;
        Ok(noted
            .and_then(|(job, note)| {
                let tz = note.zone?.parse::<Tz>().ok()?;
                Some((
                    tz,
                    ZoneFrom::WaitingJob {
                        job,
                        noted_at: note.at,
                    },
                ))
            })
            .unwrap_or(default))
    }

    /// The recorded sends, each rule's count and limit, and the next allowed instant,
    /// per policy, at Redis time.
    pub async fn status(&self, q: &RecipientQuery<'_>) -> Result<RecipientStatus, AdminError> {
        let targets = self.targets(q)?;
        let rules = self.store.rules();
        let now = self.store.sync_clock().await?;
        let keys = self.store.keys().for_tenant(q.tenant);
        let mut conn = self.store.connection();
        let mut policies = Vec::new();
        for (policy, channel) in targets {
            policies.push(
                self.policy_status(&mut conn, &keys, q, now, policy, channel)
                    .await?,
            );
        }
        let mut caps = Vec::new();
        for cap in rules.caps_of(q.tenant) {
            for channel in self.cap_channels(cap, q.channel) {
                caps.push(cap_status(&mut conn, &keys, q, now, cap, channel).await?);
            }
        }
        let waiting = if self.settings.redis.notes {
            Some(notes::waiting(&self.store.connection(), &keys, q.recipient, now).await?)
        } else {
            None
        };
        Ok(RecipientStatus {
            recipient_tag: keys.recipient_tag(q.recipient),
            tenant: q.tenant.map(str::to_string),
            timezone: q.tz.name().to_string(),
            timezone_from: None,
            now,
            waiting,
            policies,
            suppressions: super::suppressions::list(self.store, q.recipient, q.channel).await?,
            preferences: crate::preferences::edit::get(self.store, q.tenant, q.recipient).await?,
            caps,
            digests: super::Digests::new(self.store)
                .of(q.recipient, q.tenant)
                .await?,
        })
    }

    /// One policy's layer for the recipient (on `channel`, for a policy that counts
    /// per channel): its sends, rules, send windows and next allowed instant.
    async fn policy_status(
        &self,
        conn: &mut RedisConn,
        keys: &Keys,
        q: &RecipientQuery<'_>,
        now: DateTime<Utc>,
        policy: Policy,
        channel: Option<String>,
    ) -> Result<PolicyStatus, AdminError> {
        let key = keys.recipient(q.recipient, &policy.name, channel.as_deref());
        let read = read_layer(conn, &key, &policy.rules, q.tz, now).await?;
        let channel_windows = channel
            .as_deref()
            .or(q.channel)
            .filter(|_| !policy.ignore_channel_windows)
            .and_then(|c| Some((c, self.settings.channel_windows(c)?)));
        let mut sets = Vec::new();
        let mut send_windows = Vec::new();
        if let Some(w) = &policy.send_windows {
            sets.push(w);
            send_windows.push(format!("policy: {w}"));
        }
        if let Some((c, w)) = channel_windows {
            sets.push(w);
            send_windows.push(format!("channel {c}: {w}"));
        }
        let next_allowed = window::earliest_allowed(&policy.rules, q.tz, now, &read.instants)
            .and_then(|t| send_windows::next_open(&sets, q.tz, t))
            .map(|(t, _)| NextAllowed::at(t, q.tz, now));
        Ok(PolicyStatus {
            policy: policy.name.clone(),
            channel,
            action: format!("{:?}", policy.action).to_lowercase(),
            key,
            key_expires_at: read.key_expires_at,
            sends: read.sends,
            rules: read.rules,
            send_windows,
            next_allowed,
        })
    }

    /// The channels a cap counts on that the query shows: none apart for a cap per
    /// recipient; each configured channel the cap names (all without a list), only
    /// the asked one with `--channel`, for a cap per channel.
    fn cap_channels(&self, cap: &Cap, asked: Option<&str>) -> Vec<Option<String>> {
        let shown = |c: &str| {
            cap.channels
                .as_ref()
                .is_none_or(|l| l.iter().any(|x| x == c))
                && asked.is_none_or(|x| x == c)
        };
        match cap.scope {
            Scope::Recipient => vec![None],
            Scope::Channel => self
                .settings
                .channels
                .keys()
                .filter(|c| shown(c))
                .map(|c| Some(c.clone()))
                .collect(),
        }
    }

    /// Import a past send at `at` (committed, under job id `id`), so the caps hold
    /// from day one; the key's expiry is raised to cover it. A job with the same id
    /// arriving later is a duplicate.
    pub async fn import_send(
        &self,
        q: &RecipientQuery<'_>,
        at: DateTime<Utc>,
        id: &str,
    ) -> Result<Recorded, AdminError> {
        self.check_channel(q.channel)?;
        let rules = self.store.rules();
        let policy = rules
            .policy_of(q.category.unwrap_or("default"), q.tenant)
            .clone();
        let channel = match (policy.scope, q.channel) {
            (Scope::Recipient, _) => None,
            (Scope::Channel, Some(c)) => Some(c),
            (Scope::Channel, None) => {
                return Err(AdminError::Invalid(format!(
                    "policy `{}` counts per channel: pass --channel",
                    policy.name
                )))
            }
        };
        let now = self.store.sync_clock().await?;
        if at > now {
            return Err(AdminError::Invalid(format!(
                "{} is in the future (Redis time is {}): only past sends can be recorded",
                at.to_rfc3339(),
                now.to_rfc3339()
            )));
        }
        let at = window::from_millis(at.timestamp_millis());
        let dedupe = chrono::Duration::from_std(self.settings.redis.dedupe_window.0)
            .unwrap_or(chrono::Duration::days(1));
        let mut until = at + dedupe;
        for rule in &policy.rules {
            until = until.max(window::expires(rule.window, q.tz, at));
        }
        if until <= now {
            return Err(AdminError::Invalid(format!(
                "a send at {} no longer counts for any rule of policy `{}` and is older than the dedupe window: nothing to record",
                at.to_rfc3339(),
                policy.name
            )));
        }
        let key =
            self.store
                .keys()
                .for_tenant(q.tenant)
                .recipient(q.recipient, &policy.name, channel);
        let script = &self.store.scripts().import;
        let conn = self.store.connection();
        let reply = import::import_send(&conn, script, &key, &keys::member(id), at, until).await?;
        Ok(Recorded {
            policy: policy.name.clone(),
            channel: channel.map(str::to_string),
            id: id.to_string(),
            at,
            key,
            added: reply.added,
            key_expires_at: reply.key_expires_at,
        })
    }

    /// Delete every key of the recipient (of `tenant`): all policies and caps, and
    /// every channel of the per-channel ones. Returns how many keys existed.
    pub async fn reset(&self, recipient: &str, tenant: Option<&str>) -> Result<u32, AdminError> {
        let keys = self.store.keys().for_tenant(tenant);
        let mut names = Vec::new();
        for p in self.settings.policies() {
            names.push(keys.recipient(recipient, &p.name, None));
            for c in self.settings.channels.keys() {
                names.push(keys.recipient(recipient, &p.name, Some(c)));
            }
        }
        for c in self.settings.caps.keys() {
            names.push(keys.cap(recipient, c, None));
            for ch in self.settings.channels.keys() {
                names.push(keys.cap(recipient, c, Some(ch)));
            }
        }
        let mut conn = self.store.connection();
        let deleted: u32 = redis::cmd("DEL").arg(&names).query_async(&mut conn).await?;
        Ok(deleted)
    }
}

/// One cap's layer for the recipient on `channel`: its sends, rules and next
/// allowed instant.
async fn cap_status(
    conn: &mut RedisConn,
    keys: &Keys,
    q: &RecipientQuery<'_>,
    now: DateTime<Utc>,
    cap: &Cap,
    channel: Option<String>,
) -> Result<CapStatus, AdminError> {
    let key = keys.cap(q.recipient, &cap.name, channel.as_deref());
    let read = read_layer(conn, &key, &cap.rules, q.tz, now).await?;
    let next = window::earliest_allowed(&cap.rules, q.tz, now, &read.instants);
    Ok(CapStatus {
        cap: cap.name.clone(),
        channel,
        mode: cap.mode.as_str(),
        key,
        key_expires_at: read.key_expires_at,
        sends: read.sends,
        rules: read.rules,
        next_allowed: next.map(|t| NextAllowed::at(t, q.tz, now)),
    })
}

/// One layer's sorted set, read at `now`: its sends, each rule's count, and when
/// the key expires.
struct LayerRead {
    sends: Vec<Send>,
    instants: Vec<DateTime<Utc>>,
    rules: Vec<RuleStatus>,
    key_expires_at: Option<DateTime<Utc>>,
}

async fn read_layer(
    conn: &mut crate::redis::RedisConn,
    key: &str,
    rules: &[window::Rule],
    tz: Tz,
    now: DateTime<Utc>,
) -> Result<LayerRead, AdminError> {
    let (members, pttl): (Vec<(Vec<u8>, f64)>, i64) = redis::pipe()
        .cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("PTTL")
        .arg(key)
        .query_async(conn)
        .await?;
    let mut sends: Vec<(Vec<u8>, i64)> = members
        .into_iter()
        .map(|(m, score)| (m, score.round() as i64))
        .collect();
    sends.sort_by_key(|(_, score)| *score);
    let instants: Vec<DateTime<Utc>> = sends
        .iter()
        .map(|(_, s)| window::from_millis(s.div_euclid(2)))
        .collect();
    let statuses = rules
        .iter()
        .map(|rule| {
            let count = instants
                .iter()
                .filter(|&&t| window::counts(rule.window, tz, now, t))
                .count() as u32;
            RuleStatus {
                window: rule.window.to_string(),
                limit: rule.limit,
                count,
                window_start: window::window_start(rule.window, tz, now).0,
                full: count >= rule.limit,
            }
        })
        .collect();
    let sends = sends
        .iter()
        .zip(&instants)
        .map(|((member, score), &at)| Send {
            member: hex(member),
            at,
            at_local: at.with_timezone(&tz).to_rfc3339(),
            state: if score.rem_euclid(2) == 1 {
                "committed"
            } else {
                "reserved"
            },
            counting: rules.iter().any(|r| window::counts(r.window, tz, now, at)),
        })
        .collect();
    Ok(LayerRead {
        sends,
        instants,
        rules: statuses,
        key_expires_at: (pttl >= 0).then(|| now + chrono::Duration::milliseconds(pttl)),
    })
}

/// What `record` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Recorded {
    /// The policy it counts under.
    pub policy: String,
    /// The channel, for a per-channel policy.
    pub channel: Option<String>,
    /// The job id it was recorded under.
    pub id: String,
    /// When the send happened.
    pub at: DateTime<Utc>,
    /// The Redis key.
    pub key: String,
    /// False when this id was already recorded (nothing changed).
    pub added: bool,
    /// The key's expiry afterwards.
    pub key_expires_at: Option<DateTime<Utc>>,
}
