//! Lanes, the worker's side: a job whose channel's rate would make it wait is not
//! held here; it is parked in its lane's queue (`<lanes.queue_prefix><channel>.<lane>`),
//! and the lane queues are consumed as the rate allows, urgent first
//! (`lua/lanes.lua` decides, for every worker at once). Which lane a job is in, how
//! its rate is taken ([`RateStep`]), the park itself, and the lane consumers of a
//! broker session.
//!
//! A job read from the jobs queue asks the rate as before, in its lane; a wait of
//! at most `lanes.park_after` (a burst above the rate for a moment) it waits out
//! here, counted in the rate's answers, not in the time Redis takes to give them;
//! only a longer one parks it (one extra publish), after its recipient's
//! reservation is given back: nothing is held or counted while it waits. Once a
//! job was parked so, and while this worker's jobs read from the lanes wait for the
//! rate without getting a slot at their first ask (the lanes hold a backlog), a
//! new one is parked behind them without asking Redis. A job read from a lane queue first waits in
//! the worker for a send slot in its lane (as many per lane as the rate needs, at
//! most `lanes.prefetch`: [`super::lane_qos`]), then is decided as any other with
//! that slot taken.

use chrono::Utc;
use futures_util::stream;
use lapin::message::Delivery;
use lapin::types::ShortString;
use lapin::{BasicProperties, Channel, Connection};
use tracing::debug;

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::error::ProcessError;
use super::lane_qos::{consume, LaneStream, Tuner};
use super::link::BrokerLink;
use super::Worker;
use crate::admission::RateStep;
use crate::amqp::BrokerError;
use crate::job::decode::Job;
use crate::job::{headers, Outcome};
use crate::quota::lanes::{LaneRate, Priority};
use crate::quota::policy::Policy;
use crate::quota::policy::Rate;
use crate::redis::rate::LaneAsk;

/// Where a job's rate step leads.
pub(crate) enum Step {
    /// Ask the store with this step.
    Admit(RateStep),
    /// Park it now (this worker's jobs of the channel already wait for the rate).
    Park(Priority),
}

/// The lane of a job: the lane queue it was read from, else its `priority`, else
/// its policy's.
pub(crate) fn lane_of(job: &Job<'_>, policy: &Policy, from: Option<Priority>) -> Priority {
    from.or(job.priority).unwrap_or(policy.priority)
}

impl Worker {
    /// How to take the rate of `job`'s paced channel (its rate and how its lanes
    /// share it); for a job read from a lane queue, this waits for its send slot
    /// (and gives up at `s.stop`).
    pub(crate) async fn rate_step(
        &self,
        s: &BrokerLink,
        job: &Job<'_>,
        lane: Priority,
        from: Option<Priority>,
        (rate, lanes): (Rate, LaneRate),
    ) -> Result<Step, ProcessError> {
        let ask = LaneAsk { lane, lanes };
        if !self.topology.has_lanes(&job.channel) {
            // paced since a reload: no lane queue to park in; it waits here, in its lane
            return Ok(Step::Admit(RateStep::Wait(Some(ask))));
        }
        if from.is_none() {
            return Ok(if self.store.is_pacing(&job.channel) {
                Step::Park(lane)
            } else {
                Step::Admit(RateStep::Park(Some(ask)))
            });
        }
        let slot = || self.store.pace_in_lane(&job.channel, rate, ask);
        let asked = Instant::now();
        let tat = tokio::select! {
            _ = s.stop.cancelled() => return Err(ProcessError::Interrupted),
            tat = self.retry_redis(slot, &s.stop) => tat?,
        };
        if let Some(index) = self.topology.laned.iter().position(|c| *c == job.channel) {
            self.lane_clocks.waited(index, asked.elapsed());
        }
        Ok(Step::Admit(RateStep::Taken(tat)))
    }

    /// Count a job of a lane queue given its send slot, and how long it waited.
    pub(crate) fn lane_taken(&self, delivery: &Delivery, channel: &str, lane: Priority) {
        let labels = [
            ("channel", channel.to_string()),
            ("lane", lane.as_str().to_string()),
        ];
        let now = self.store.redis_now().timestamp_millis();
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
                .record((now - since).max(0) as f64 / 1000.0);
        }
        let mut labels = labels.to_vec();
        labels.push(("step", "taken".to_string()));
        metrics::counter!(crate::metrics::LANE_JOBS_TOTAL, &labels).increment(1);
    }

    /// Publish the delivery to its lane's queue (confirmed); the caller acks it.
    /// `asked`: whether the job asked the rate first (else it was parked behind this
    /// worker's lane jobs without asking).
    pub(crate) async fn park(
        &self,
        s: &BrokerLink,
        delivery: &Delivery,
        job: &Job<'_>,
        (lane, asked): (Priority, bool),
    ) -> Result<Outcome, ProcessError> {
        let queue = self.topology.lane_queue(&job.channel, lane);
        let now = self.store.redis_now();
        let props = BasicProperties::default()
            .with_content_type("application/json".into())
            .with_message_id(ShortString::from(job.id.as_ref()))
            .with_timestamp(Utc::now().timestamp().max(0) as u64)
            .with_headers(headers::parked_headers(
                delivery.properties.headers().as_ref(),
                now,
            ));
        crate::telemetry::parked(lane.as_str());
        let (props, sending) = crate::telemetry::send("", &queue, Some(&job.id), props);
        let published = s.publisher.publish("", &queue, &delivery.data, props).await;
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
}

/// A broker session's lane consumers: one channel, a consumer per lane queue, each
/// under the prefetch its channel's rate needs ([`lane_qos`](super::lane_qos)), every
/// delivery with its channel's index and its lane.
pub(crate) struct LaneConsumers {
    /// The channel they consume on (acks go back on it).
    pub channel: Channel,
    /// Every lane's deliveries, merged.
    pub deliveries: stream::SelectAll<LaneStream>,
    /// The current consumer tags, to cancel them at shutdown.
    pub tags: Arc<Mutex<Vec<String>>>,
    /// What moves them to another prefetch as the worker runs.
    pub tuner: Tuner,
}

impl LaneConsumers {
    /// Consume every lane queue of `worker`'s topology (none: `None`).
    pub(crate) async fn start(
        worker: &Worker,
        conn: &Connection,
        tag: &str,
    ) -> Result<Option<LaneConsumers>, BrokerError> {
        let topology = &worker.topology;
        if topology.laned.is_empty() {
            return Ok(None);
        }
        let channel = conn.create_channel().await?;
        let held: Vec<u16> = (0..topology.laned.len())
            .map(|i| worker.lane_start(i))
            .collect();
        let mut deliveries = stream::SelectAll::new();
        let mut lanes = Vec::new();
        for (queue, name, lane) in topology.lane_queues() {
            let index = topology.laned.iter().position(|c| c == name).unwrap_or(0);
            let lane_tag = format!("{tag}-{queue}");
            let stream = consume(&channel, &queue, &lane_tag, held[index], (index, lane)).await?;
            deliveries.push(stream);
            lanes.push((queue, index, lane, lane_tag));
        }
        let tags = Arc::new(Mutex::new(lanes.iter().map(|l| l.3.clone()).collect()));
        let tuner = Tuner {
            channel: channel.clone(),
            lanes,
            tags: tags.clone(),
            held,
            tag: tag.to_string(),
        };
        Ok(Some(LaneConsumers {
            channel,
            deliveries,
            tags,
            tuner,
        }))
    }
}
