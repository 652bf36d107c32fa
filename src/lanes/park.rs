//! A job parked in its lane's queue (`<lanes.queue_prefix><channel>.<lane>`) rather
//! than held in the worker while its channel's rate would make it wait ([`to_lane`]),
//! and a job read back from a lane counted once its slot is taken ([`taken`]).

use chrono::{DateTime, Utc};
use lapin::message::Delivery;
use lapin::types::ShortString;
use lapin::BasicProperties;
use tracing::debug;

use super::share::Priority;
use crate::amqp::{PublishError, Publisher};
use crate::job::decode::Job;
use crate::job::{headers, Outcome};

/// Publish the delivery to `queue`, its lane's queue or its tenant's queue of its
/// lane (confirmed); the caller acks it. `asked`: whether the job asked the rate
/// first (else it was parked behind this worker's lane jobs without asking).
/// `now`: Redis time, noted in its headers, with `first_seen`, when a worker first
/// saw it.
pub(crate) async fn to_lane(
    publisher: &Publisher,
    queue: &str,
    (now, first_seen): (DateTime<Utc>, DateTime<Utc>),
    (delivery, job): (&Delivery, &Job<'_>),
    (lane, asked): (Priority, bool),
) -> Result<Outcome, PublishError> {
    let queue = queue.to_string();
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(ShortString::from(job.id.as_ref()))
        .with_timestamp(Utc::now().timestamp().max(0) as u64)
        .with_headers(headers::parked_headers(
            delivery.properties.headers().as_ref(),
            now,
            first_seen,
        ));
    crate::telemetry::parked(lane.as_str());
    let (props, sending) = crate::telemetry::send("", &queue, Some(&job.id), props);
    let published = publisher.publish("", &queue, &delivery.data, props).await;
    if let Err(e) = &published {
        sending.failed(e);
    }
    drop(sending);
    published?;
    metrics::counter!(
        crate::metrics::LANE_JOBS_TOTAL,
        "channel" => job.channel.to_string(),
        "lane" => lane.as_str(),
        "step" => "parked"
    )
    .increment(1);
    if !asked {
        metrics::counter!(
            crate::metrics::LANE_PARKED_UNASKED_TOTAL,
            "channel" => job.channel.to_string(),
            "lane" => lane.as_str()
        )
        .increment(1);
    }
    debug!(%queue, asked, "parked in its lane until its channel's rate allows");
    Ok(Outcome::Parked)
}

/// Count a job of a lane queue given its send slot, and how long it waited since
/// it was parked (or published to the lane), as of `now_ms` (Redis time).
pub(crate) fn taken(delivery: &Delivery, channel: &str, lane: Priority, now_ms: i64) {
    let labels = [
        ("channel", channel.to_string()),
        ("lane", lane.as_str().to_string()),
    ];
    let since = delivery
        .properties
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(headers::PARKED_AT).and_then(headers::as_i64))
        .or_else(|| {
            // published to the lane by a producer: its timestamp (seconds)
            let t = (*delivery.properties.timestamp())?;
            i64::try_from(t).ok().map(|t| t * 1000)
        });
    if let Some(since) = since {
        metrics::histogram!(crate::metrics::LANE_WAIT_SECONDS, &labels)
            .record((now_ms - since).max(0) as f64 / 1000.0);
    }
    let mut labels = labels.to_vec();
    labels.push(("step", "taken".to_string()));
    metrics::counter!(crate::metrics::LANE_JOBS_TOTAL, &labels).increment(1);
}
