//! One job by its id: where it is and why ([`Jobs::explain`], from what the worker
//! noted when it delayed or dead-lettered it, without reading any queue), and
//! [`Jobs::cancel`]: a mark that makes a waiting job end as a dead letter
//! `cancelled` the next time a worker handles it.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::AdminError;
use crate::amqp::ladder::Ladder;
use crate::config::Settings;
use crate::fallback::log::{self, RouteEntry};
use crate::job::note::{JobNote, JobState, Place};
use crate::redis::notes;
use crate::redis::notes::CANCEL_POLL;
use crate::store::QuotaStore;

/// What `admin job ID` shows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JobStatus {
    /// The job id.
    pub id: String,
    /// Redis time.
    pub now: DateTime<Utc>,
    /// Where it is.
    #[serde(rename = "where")]
    pub place: Place,
    /// The last step the worker noted.
    pub record: Option<JobNote>,
    /// When it was cancelled, if a cancel mark waits for it.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// What its sender said became of it (one per event and channel heard).
    pub feedback: Vec<crate::feedback::FeedbackNote>,
    /// A job with `fallback`: the steps of its route, in order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub route: Vec<RouteEntry>,
    /// A job with `fallback`: when its last step moves on if no answer comes
    /// (an escalation pending; `admin job ID cancel` cancels it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub escalates_at: Option<DateTime<Utc>>,
}

/// What `admin job ID cancel` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cancelled {
    /// The job id.
    pub id: String,
    /// When (Redis time).
    pub at: DateTime<Utc>,
    /// It was marked already (the mark was left as it was).
    pub already: bool,
    /// Where the job was, as far as its record tells.
    #[serde(rename = "where")]
    pub place: Place,
    /// Every worker knows of the mark within this many milliseconds.
    pub known_within_ms: u64,
}

/// Reads and cancels jobs.
#[derive(Debug)]
pub struct Jobs<'a> {
    store: &'a QuotaStore,
    ladder: Ladder,
}

impl<'a> Jobs<'a> {
    /// Over a connected store and its settings.
    pub fn new(store: &'a QuotaStore, settings: &'a Settings) -> Self {
        Jobs {
            store,
            ladder: crate::amqp::Topology::from_settings(settings).ladder(),
        }
    }

    /// Where job `id` is and why, from its record and cancel mark.
    pub async fn explain(&self, id: &str) -> Result<JobStatus, AdminError> {
        let now = self.store.sync_clock().await?;
        let conn = self.store.connection();
        let keys = self.store.keys();
        let record = notes::read(&conn, keys, id).await?;
        let cancelled_at = notes::cancel_marks(&conn, keys)
            .await?
            .into_iter()
            .find_map(|(m, at)| (m == id).then_some(at));
        let feedback = crate::feedback::apply::notes(&conn, keys, id).await?;
        let route = log::read(&conn, keys, id).await?;
        let answered: Vec<&str> = feedback
            .iter()
            .filter(|f| f.event == "delivered" || f.event == "read")
            .filter_map(|f| f.channel.as_deref())
            .collect();
        let escalates_at = log::pending_escalation(&route, &answered);
        Ok(JobStatus {
            id: id.to_string(),
            now,
            place: record
                .as_ref()
                .map_or(Place::Unknown, |r| r.place(&self.ladder, now)),
            record,
            cancelled_at,
            feedback,
            route,
            escalates_at,
        })
    }

    /// Mark job `id` cancelled. Refused for a job whose record says it was sent,
    /// superseded or dead-lettered already (nothing waits to be cancelled),
    /// unless an escalation of its route is pending (it ends as a dead letter
    /// `cancelled` when it comes back, instead of moving on).
    pub async fn cancel(&self, id: &str) -> Result<Cancelled, AdminError> {
        let status = self.explain(id).await?;
        if let (Some(r), None) = (&status.record, status.escalates_at) {
            let ended = match &r.step {
                JobState::Dispatched => Some("was dispatched".to_string()),
                JobState::Superseded { by } => Some(format!("was superseded by job `{by}`")),
                JobState::Dead { reason, .. } => {
                    Some(format!("went to the dead-letter queue (reason `{reason}`)"))
                }
                JobState::Delayed { .. } | JobState::Folded { .. } => None,
            };
            if let Some(ended) = ended {
                return Err(AdminError::Invalid(format!(
                    "job `{id}` {ended} at {}: nothing waits to be cancelled",
                    r.at.to_rfc3339()
                )));
            }
        }
        let ttl = self.store.record_ttl().as_millis() as u64;
        let conn = self.store.connection();
        let already = notes::cancel(&conn, self.store.keys(), id, status.now, ttl).await?;
        Ok(Cancelled {
            id: id.to_string(),
            at: status.cancelled_at.unwrap_or(status.now),
            already,
            place: status.place,
            known_within_ms: CANCEL_POLL.as_millis() as u64 * 2,
        })
    }
}
