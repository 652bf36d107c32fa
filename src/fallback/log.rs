//! What `admin job ID` shows of a job's route: one entry per step that went out
//! (its channel, when, why it left the channel before, and when it escalates if
//! unanswered) and per escalation that came back to an answered step. A Redis list
//! by job id, `redis.record_ttl` long, written after the fact by a spawned task:
//! the route does not wait for its own history.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::quota::keys::Keys;
use crate::redis::{RedisConn, StoreError};
use crate::store::QuotaStore;

/// What became of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    /// It went out on its channel.
    Dispatched,
    /// Its escalation came back to find it answered (or moved on already):
    /// nothing more was sent.
    Answered,
}

/// One step of a job's route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    /// The step, 1 for the job's own channel.
    pub step: usize,
    /// How many channels its route has.
    pub of: usize,
    /// The step's channel.
    pub channel: String,
    /// When (Redis time).
    pub at: DateTime<Utc>,
    /// What became of it.
    pub outcome: StepOutcome,
    /// Why it left the channel before (`x-notify-fallback-from`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<String>,
    /// When it moves on if no answer comes (its policy escalates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalates_at: Option<DateTime<Utc>>,
}

/// Append `entry` to job `id`'s route, in a task of its own (a failure is logged:
/// the route is history, never a decision).
pub fn append(store: &QuotaStore, id: &str, entry: RouteEntry) {
    let key = store.keys().job_route(id);
    let ttl = store.record_ttl().as_millis().max(1) as u64;
    let mut conn = store.connection();
    let Ok(json) = serde_json::to_string(&entry) else {
        return;
    };
    tokio::spawn(async move {
        let mut pipe = redis::pipe();
        pipe.cmd("RPUSH").arg(&key).arg(json).ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(ttl).ignore();
        if let Err(e) = pipe.query_async::<()>(&mut conn).await {
            tracing::debug!(error = %e, "the route's entry was not written");
        }
    });
}

/// Job `id`'s route, in the order its steps happened.
pub async fn read(conn: &RedisConn, keys: &Keys, id: &str) -> Result<Vec<RouteEntry>, StoreError> {
    let mut c = conn.clone();
    let items: Vec<String> = redis::cmd("LRANGE")
        .arg(keys.job_route(id))
        .arg(0)
        .arg(-1)
        .query_async(&mut c)
        .await?;
    let mut out: Vec<RouteEntry> = items
        .iter()
        .filter_map(|s| serde_json::from_str(s).ok())
        .collect();
    out.sort_by_key(|e| (e.at, e.step));
    Ok(out)
}

/// The deadline of the escalation a route still waits for, if any: its last step
/// went out with one, and no answer for that step is known (`answered` lists the
/// channels a delivery or read was heard on).
pub fn pending_escalation(route: &[RouteEntry], answered: &[&str]) -> Option<DateTime<Utc>> {
    let last = route.last()?;
    match (last.outcome, last.escalates_at) {
        (StepOutcome::Dispatched, Some(at)) if !answered.contains(&last.channel.as_str()) => {
            Some(at)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{pending_escalation, RouteEntry, StepOutcome};
    use chrono::{TimeZone, Utc};

    #[test]
    fn an_escalation_is_pending_until_its_step_is_answered_or_moves_on() {
        let at = Utc.with_ymd_and_hms(2026, 12, 1, 9, 0, 0).unwrap();
        let sent = |step: usize, channel: &str, escalates: bool| RouteEntry {
            step,
            of: 2,
            channel: channel.into(),
            at,
            outcome: StepOutcome::Dispatched,
            left: None,
            escalates_at: escalates.then_some(at + chrono::Duration::minutes(2)),
        };
        let first = [sent(1, "push", true)];
        assert_eq!(pending_escalation(&first, &[]), first[0].escalates_at);
        assert_eq!(pending_escalation(&first, &["push"]), None);
        assert_eq!(pending_escalation(&first, &["sms"]), first[0].escalates_at);
        let both = [sent(1, "push", true), sent(2, "sms", false)];
        assert_eq!(pending_escalation(&both, &[]), None);
        let answered = [
            sent(1, "push", true),
            RouteEntry {
                outcome: StepOutcome::Answered,
                escalates_at: None,
                ..sent(1, "push", false)
            },
        ];
        assert_eq!(pending_escalation(&answered, &[]), None);
        assert_eq!(pending_escalation(&[], &[]), None);
    }
}
