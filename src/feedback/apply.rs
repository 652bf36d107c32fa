//! What a feedback does in Redis, once (`lua/feedback.lua` in the recipient's slot,
//! `lua/throttle.lua` in the channel's): give a failed send back, suppress the
//! recipient, pause the channel, or only mark it. Each script checks and writes
//! the feedback's mark with its effect, so a feedback redelivered (a worker killed
//! before its ack) changes nothing the second time. The note for `admin job` is a
//! hash field per event, written after, the same whatever the copy.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::Settings;
use crate::quota::keys::{self, Keys};
use crate::quota::limits::Per;
use crate::quota::policy::{Rate, Scope};
use crate::quota::suppression::{Kind, Suppression};
use crate::redis::{RedisConn, StoreError};
use crate::store::QuotaStore;
use quota_worker_producer::{Event, Feedback};

/// Whether `lua/feedback.lua` and `lua/throttle.lua` applied a feedback (`APPLIED`
/// in each; a test checks that the scripts and this name the same numbers).
struct Code;

impl Code {
    /// Applied before (its mark found): nothing done.
    #[cfg(test)]
    const AGAIN: i64 = 0;
    /// Applied by this call.
    const FIRST: i64 = 1;
    #[cfg(test)]
    const ALL: [(i64, &'static str); 2] = [(Code::AGAIN, "again"), (Code::FIRST, "first")];
}

/// The settings a feedback is applied with.
#[derive(Debug, Clone, Copy)]
pub struct Tuning {
    /// `feedback.dedupe_window`: how long a feedback's mark is kept.
    pub dedupe: Duration,
    /// `suppression.bounced_ttl`.
    pub bounced_ttl: Duration,
    /// `feedback.throttle_backoff`, `feedback.throttle_max_backoff`, `feedback.ramp`.
    pub backoff: Duration,
    /// See `backoff`.
    pub max_backoff: Duration,
    /// See `backoff`.
    pub ramp: Duration,
    /// `redis.record_ttl`: how long the note for `admin job` is kept.
    pub record_ttl: Duration,
}

impl Tuning {
    /// As `settings` say.
    pub fn from_settings(settings: &Settings) -> Tuning {
        let f = &settings.feedback;
        Tuning {
            dedupe: f.dedupe_window.0,
            bounced_ttl: settings.suppression.bounced_ttl.0,
            backoff: f.throttle_backoff.0,
            max_backoff: f.throttle_max_backoff.0,
            ramp: f.ramp.0,
            record_ttl: settings.redis.record_ttl.0,
        }
    }
}

/// What applying one feedback did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Its effect is in Redis now (Redis time, ms).
    First {
        /// Redis time of the effect.
        now_ms: i64,
        /// `delivered`, `failed`: when the job's send was recorded (ms; 0: no
        /// send of it is recorded). `throttled`: when the channel resumes.
        /// Suppressions: until when (0: until removed).
        at_ms: i64,
    },
    /// The same feedback was applied before: nothing changed.
    Again,
    /// A `throttled` on a channel without a send rate: nothing to pause.
    NotPaced,
}

/// What `admin job ID` shows of one feedback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FeedbackNote {
    /// The event.
    pub event: String,
    /// When the worker applied it (RFC 3339), if it knows.
    pub at: Option<String>,
    /// The channel it was heard about (a job with `fallback` is sent on several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The job's tenant, as the sender gave it (carried; no effect yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The sender's detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// For `throttled`: the provider's retry_after, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// Apply `f` (decoded, its channel configured) once.
pub async fn apply(store: &QuotaStore, t: &Tuning, f: &Feedback) -> Result<Applied, StoreError> {
    let keys = store.keys();
    let conn = store.connection();
    let applied = match f.event {
        Event::Throttled => throttle(store, t, f).await?,
        Event::Delivered | Event::Failed | Event::Read => {
            let what = if f.event == Event::Failed {
                "give_back"
            } else {
                "note"
            };
            let member = keys::member(&f.id);
            let event = f.event.as_str().as_bytes();
            recipient_script(store, t, f, &[what.as_bytes(), &member, event]).await?
        }
        Event::Bounced | Event::Complained | Event::Unsubscribed => {
            let kind = Kind::parse(f.event.as_str()).expect("a suppressing event");
            raise_flag(store).await?;
            let ttl = match kind {
                Kind::Bounced => ms(t.bounced_ttl),
                _ => 0,
            };
            let (bit, ttl) = (kind.bit().to_string(), ttl.to_string());
            let args: [&[u8]; 4] = [
                b"suppress",
                f.channel.as_bytes(),
                bit.as_bytes(),
                ttl.as_bytes(),
            ];
            let a = recipient_script(store, t, f, &args).await?;
            if matches!(a, Applied::First { .. }) {
                crate::metrics::suppression_added(kind.as_str());
            }
            a
        }
    };
    // the note, whichever copy this is (a field per event: the same write again)
    let note = FeedbackNote {
        event: f.event.as_str().to_string(),
        at: match applied {
            Applied::First { now_ms, .. } => {
                chrono::DateTime::from_timestamp_millis(now_ms).map(|d| d.to_rfc3339())
            }
            _ => None,
        },
        channel: Some(f.channel.clone()),
        tenant: f.tenant.clone(),
        detail: f.detail.clone(),
        retry_after_ms: f.retry_after.map(|s| (s * 1000.0).round() as u64),
    };
    let key = keys.job_feedback(&f.id);
    let json = serde_json::to_string(&note).unwrap_or_default();
    let mut pipe = redis::pipe();
    let field = format!("{}@{}", f.event.as_str(), f.channel);
    pipe.cmd("HSETNX").arg(&key).arg(field).arg(json);
    pipe.cmd("PEXPIRE").arg(&key).arg(ms(t.record_ttl));
    let mut c = conn.clone();
    let _: () = pipe.query_async(&mut c).await?;
    Ok(applied)
}

/// `lua/feedback.lua` for `f`'s recipient with `args` after the mark's TTL.
async fn recipient_script(
    store: &QuotaStore,
    t: &Tuning,
    f: &Feedback,
    args: &[&[u8]],
) -> Result<Applied, StoreError> {
    let keys = store.keys();
    let mut inv = store.scripts().feedback.prepare_invoke();
    inv.key(keys.feedback_mark(&f.recipient, &f.id, f.event.as_str(), &f.channel))
        .key(keys.suppressed(&f.recipient))
        .key(keys.route(&f.recipient, &f.id, &f.channel));
    for k in policy_keys(store, &f.recipient, &f.channel) {
        inv.key(k);
    }
    inv.arg(ms(t.dedupe).max(1));
    for a in args {
        inv.arg(*a);
    }
    let mut conn = store.connection();
    let (applied, now_ms, at_ms): (i64, i64, i64) = inv.invoke_async(&mut conn).await?;
    Ok(match applied {
        Code::FIRST => Applied::First { now_ms, at_ms },
        _ => Applied::Again,
    })
}

/// The recipient's keys of every configured policy (a job's send is in one of
/// them: the key of its policy, with its channel when the policy counts per
/// channel).
fn policy_keys(store: &QuotaStore, recipient: &str, channel: &str) -> Vec<String> {
    let rules = store.rules();
    rules
        .policies()
        .map(|p| {
            let c = (p.scope == Scope::Channel).then_some(channel);
            store.keys().recipient(recipient, &p.name, c)
        })
        .collect()
}

/// `lua/throttle.lua` for `f`: the buckets of the limits it names (its `limit`,
/// or with its `sender` alone every limit counted per sender on its channel)
/// when it names one and they hold the job; else its channel's rate.
async fn throttle(store: &QuotaStore, t: &Tuning, f: &Feedback) -> Result<Applied, StoreError> {
    let buckets = throttled_buckets(store, f);
    if !buckets.is_empty() {
        let keys = store.keys();
        let mut applied = Applied::Again;
        for (key, rate) in buckets {
            let state = (
                keys.limit_throttle(&key),
                keys.limit_throttle_mark(&key, &f.id),
            );
            if let Some(resume) = pause(
                store,
                t,
                f,
                ThrottleKeys {
                    key,
                    state: state.0,
                    mark: state.1,
                },
                rate,
            )
            .await?
            {
                applied = Applied::First {
                    now_ms: store.redis_now().timestamp_millis(),
                    at_ms: resume,
                };
            }
        }
        return Ok(applied);
    }
    let Some(rate) = store.rules().channel(&f.channel).and_then(|c| c.rate) else {
        return Ok(Applied::NotPaced);
    };
    let keys = store.keys();
    let channel_keys = ThrottleKeys {
        key: keys.rate(&f.channel),
        state: keys.throttle(&f.channel),
        mark: keys.throttle_mark(&f.channel, &f.id),
    };
    match pause(store, t, f, channel_keys, rate).await? {
        Some(resume) => {
            crate::metrics::channel_rate(&f.channel, rate, None);
            Ok(Applied::First {
                now_ms: store.redis_now().timestamp_millis(),
                at_ms: resume,
            })
        }
        None => Ok(Applied::Again),
    }
}

/// The limits' buckets a `throttled` feedback names, each with its limit's GCRA:
/// the bucket of its `limit` (of its sender or tenant when the limit counts per
/// sender or tenant), or with a `sender` alone, that sender's bucket of every
/// limit counted per sender that holds jobs of its channel (and tenant). Empty
/// when it names neither, or names a bucket no job of it would meet.
fn throttled_buckets(store: &QuotaStore, f: &Feedback) -> Vec<(String, Rate)> {
    if f.limit.is_none() && f.sender.is_none() {
        return Vec::new();
    }
    let rules = store.rules();
    rules
        .limits()
        .filter(|l| l.quota.is_none())
        .filter(|l| match &f.limit {
            Some(name) => l.name == *name,
            None => l.per == Per::Sender,
        })
        .filter(|l| l.channels.as_ref().is_none_or(|c| c.contains(&f.channel)))
        .filter(|l| match (&l.tenants, &f.tenant) {
            (None, _) => true,
            (Some(set), Some(t)) => set.contains(t),
            (Some(_), None) => false,
        })
        .filter_map(|l| {
            let bucket = match l.per {
                Per::All => ("", ""),
                Per::Tenant => ("t", f.tenant.as_deref()?),
                Per::Sender => ("s", f.sender.as_deref()?),
            };
            Some((store.keys().limit(&l.name, bucket), l.rate))
        })
        .collect()
}

/// The keys `lua/throttle.lua` takes: a GCRA key (a channel's rate or a limit's
/// bucket), its throttle state, and the feedback's mark.
struct ThrottleKeys {
    key: String,
    state: String,
    mark: String,
}

/// `lua/throttle.lua` on one GCRA key (a channel's rate or a limit's bucket), with
/// its throttle state and the feedback's mark: when it resumes (ms), or `None`
/// when this feedback was applied to it before.
async fn pause(
    store: &QuotaStore,
    t: &Tuning,
    f: &Feedback,
    keys: ThrottleKeys,
    rate: Rate,
) -> Result<Option<i64>, StoreError> {
    let ThrottleKeys { key, state, mark } = keys;
    let retry_ms: i64 = match f.retry_after {
        Some(s) => (s * 1000.0).round() as i64,
        None => -1,
    };
    let mut conn = store.connection();
    let (applied, _pause, resume): (i64, i64, i64) = store
        .scripts()
        .throttle
        .key(key)
        .key(state)
        .key(mark)
        .arg(ms(t.dedupe).max(1))
        .arg(rate.interval_us)
        .arg(rate.burst)
        .arg(retry_ms)
        .arg(ms(t.backoff))
        .arg(ms(t.max_backoff))
        .arg(ms(t.ramp))
        .invoke_async(&mut conn)
        .await?;
    Ok((applied == Code::FIRST).then_some(resume))
}

/// Write the key that turns the suppression check on, and turn it on here at once
/// (the other workers see the key within [`super::watch::POLL`]).
async fn raise_flag(store: &QuotaStore) -> Result<(), StoreError> {
    let mut conn = store.connection();
    let _: () = redis::cmd("SET")
        .arg(store.keys().suppressions_flag())
        .arg(1)
        .query_async(&mut conn)
        .await?;
    store.check_suppressions(true);
    Ok(())
}

/// Suppress `recipient` on `channel` by `kind` (the admin's edit: no mark), for
/// `ttl` (`None`: until removed); the suppression kept.
pub async fn suppress(
    store: &QuotaStore,
    recipient: &str,
    channel: &str,
    kind: Kind,
    ttl: Option<Duration>,
) -> Result<(), StoreError> {
    raise_flag(store).await?;
    let keys = store.keys();
    let mut conn = store.connection();
    let _: (i64, i64, i64) = store
        .scripts()
        .feedback
        .key(keys.feedback_mark(recipient, "", "admin", channel))
        .key(keys.suppressed(recipient))
        .arg(0)
        .arg("suppress")
        .arg(channel)
        .arg(kind.bit())
        .arg(ttl.map_or(0, ms))
        .invoke_async(&mut conn)
        .await?;
    crate::metrics::suppression_added(kind.as_str());
    Ok(())
}

/// Lift `recipient`'s suppression on `channel`; whether there was one.
pub async fn unsuppress(
    store: &QuotaStore,
    recipient: &str,
    channel: &str,
) -> Result<bool, StoreError> {
    let had = suppressions(&store.connection(), store.keys(), recipient)
        .await?
        .into_iter()
        .any(|(c, _)| c == channel);
    let keys = store.keys();
    let mut conn = store.connection();
    let _: (i64, i64, i64) = store
        .scripts()
        .feedback
        .key(keys.feedback_mark(recipient, "", "admin", channel))
        .key(keys.suppressed(recipient))
        .arg(0)
        .arg("unsuppress")
        .arg(channel)
        .invoke_async(&mut conn)
        .await?;
    Ok(had)
}

/// `recipient`'s suppressions in force, by channel.
pub async fn suppressions(
    conn: &RedisConn,
    keys: &Keys,
    recipient: &str,
) -> Result<Vec<(String, Suppression)>, StoreError> {
    let mut c = conn.clone();
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.suppressed(recipient))
        .query_async(&mut c)
        .await?;
    let now = chrono::Utc::now();
    Ok(fields
        .into_iter()
        .filter_map(|(channel, v)| Some((channel, Suppression::decode(&v)?)))
        .filter(|(_, s)| s.holds_at(now))
        .collect())
}

/// The feedback heard about job `id`, by event.
pub async fn notes(
    conn: &RedisConn,
    keys: &Keys,
    id: &str,
) -> Result<Vec<FeedbackNote>, StoreError> {
    let mut c = conn.clone();
    let fields: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(keys.job_feedback(id))
        .query_async(&mut c)
        .await?;
    Ok(fields
        .into_iter()
        .filter_map(|(_, v)| serde_json::from_str(&v).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::Code;
    use crate::redis::lua_tables::{lua_table, positional_returns};

    /// Both scripts and [`Code`] name the same answers by the same numbers, and
    /// the scripts answer by name.
    #[test]
    fn the_scripts_and_the_reader_name_the_same_answers() {
        let ours: Vec<(String, i64)> = Code::ALL
            .iter()
            .map(|(c, name)| (name.to_string(), *c))
            .collect();
        for (script, lua) in [
            ("feedback.lua", include_str!("../../lua/feedback.lua")),
            ("throttle.lua", include_str!("../../lua/throttle.lua")),
        ] {
            assert_eq!(lua_table(lua, "APPLIED"), ours, "{script}");
            let found = positional_returns(script, lua);
            assert!(found.is_empty(), "{found:#?}");
        }
    }
}
