//! A routed job's step that the sender reports `failed`: its send is given back as
//! any failed send is (`crate::feedback`), and, while the step is pending (not
//! answered, not moved on), the job is published again to the jobs exchange, to
//! resume its route at the next step (the kept [`NextStep`], claimed for the
//! failure: an escalation racing it finds the step moved on). The worker that takes it decides it as any job, on the next
//! channel.

use chrono::Utc;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use quota_worker_producer::Feedback;

use super::route::{FALLBACK_FROM, RESUME_AT};
use super::spec::Cause;
use super::state::{self, NextStep, Way};
use crate::amqp::{PublishError, Publisher};
use crate::redis::StoreError;
use crate::store::QuotaStore;

/// Why a failed step could not be moved on (the feedback goes back to the queue).
#[derive(Debug, thiserror::Error)]
pub enum MoveOnError {
    /// Redis could not be read or written.
    #[error("{0}")]
    Redis(#[from] StoreError),
    /// Publishing the job again failed.
    #[error("publishing the job's next step: {0}")]
    Publish(#[from] PublishError),
}

/// Publish again the job of `f` (a `failed` feedback) to resume its route at its
/// next step, when one is kept for the channel that failed; whether it was.
pub async fn move_on(
    store: &QuotaStore,
    publisher: &Publisher,
    jobs_exchange: &str,
    f: &Feedback,
) -> Result<bool, MoveOnError> {
    let step = state::StepOf {
        tenant: f.tenant.as_deref(),
        recipient: f.recipient.as_str(),
        id: f.id.as_str(),
        channel: f.channel.as_str(),
    };
    let Ok(next) = state::claim(store, step, Way::Failure).await? else {
        // not routed, answered, or moved on already: nothing to move on
        return Ok(false);
    };
    publisher
        .publish(jobs_exchange, "", &next.body, properties(f, &next))
        .await?;
    metrics::counter!(
        crate::metrics::FALLBACK_TOTAL,
        "policy" => next.policy.clone(),
        "from" => next.from.clone(),
        "to" => next.to.clone(),
        "cause" => Cause::Failed.as_str(),
    )
    .increment(1);
    Ok(true)
}

/// The properties of the job published again: its id, and the step it resumes at
/// with why it left the one before.
fn properties(f: &Feedback, next: &NextStep) -> BasicProperties {
    let mut headers = FieldTable::default();
    let text = |s: String| AMQPValue::LongString(s.into());
    headers.insert(ShortString::from(RESUME_AT), text(next.step.to_string()));
    headers.insert(
        ShortString::from(FALLBACK_FROM),
        text(format!("{}: failed", next.from)),
    );
    BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(ShortString::from(f.id.as_str()))
        .with_timestamp(Utc::now().timestamp().max(0) as u64)
        .with_headers(headers)
}
