//! A job's dispatch: published to the dispatch exchange under its (step's)
//! channel, then its send committed; a routed step's next one kept before it goes
//! and its escalation published after; a dispatch the broker refuses given back
//! and retried later, one it never confirmed kept reserved.

use chrono::{DateTime, Utc};
use lapin::types::ShortString;
use lapin::BasicProperties;
use tracing::{debug, warn};

use super::error::ProcessError;
use super::handling::{Handling, Route};
use super::link::BrokerLink;
use super::outcomes::Outcomes;
use super::routing::Routes;
use crate::admission::Ticket;
use crate::amqp::PublishError;
use crate::decide::{self, Decision, DelayCause};
use crate::fallback;
use crate::job::note::JobState;
use crate::job::{headers, Outcome};

/// How a dispatch ends: its outcome, or, at its final go after a wait for the
/// broker, a cancel or an erase come meanwhile (its send given back) to carry out
/// instead.
pub(super) enum Sent {
    Out(Outcome),
    Stopped(Decision),
}

impl Outcomes {
    /// Publish the job of `h` for its sender, admitted with `ticket`; commit the send
    /// once the broker confirms it. A routed step's next one is kept, and its
    /// escalation published, through `routes`.
    pub(super) async fn dispatch(
        &self,
        h: &Handling<'_, '_>,
        ticket: Ticket,
        route: Option<&Route<'_>>,
        routes: &Routes,
        now: DateTime<Utc>,
    ) -> Result<Sent, ProcessError> {
        let s = h.s;
        let channel = route.map_or(&h.job.channel, |(_, j)| &j.channel);
        let props = dispatch_props(h, route, channel, now);
        let exchange = &self.dispatch_exchange;
        let (props, sending) = crate::telemetry::send(exchange, channel, Some(&h.job.id), props);
        // a routed step's next one is kept before it goes, so that a failure
        // the sender reports at once finds it
        if let Some((routed, on_step)) = route {
            let cause = routed.from.as_deref().and_then(fallback::route::cause_of);
            sending.routed(routed.step + 1, cause.map(|c| c.as_str()));
            let keep =
                routes.keep_next_step(h.job, (on_step, routed), h.policy, h.delivery, &s.stop);
            if let Err(e) = Box::pin(keep).await {
                drop(sending);
                self.give_back(&ticket).await;
                return Err(e);
            }
        }
        // a broker that blocks or stopped answering would hold the dispatch
        // until it answers: hold it here instead, so that a shutdown meanwhile
        // hands the job back unsent rather than sent twice
        if !s.publisher.is_flowing() {
            s.publisher.flowing().await;
            // a final go after a wait: a cancel or an erase may have come
            if let Some(stop) = self.cancels.stopped_since(h, self.asks.store.keys()) {
                drop(sending);
                self.give_back(&ticket).await;
                return Ok(Sent::Stopped(stop));
            }
        }
        if !s.publisher.is_connected() {
            // the session is gone and nothing was sent: the send is given back
            // (kept if Redis cannot be told), and the broker delivers the job
            // again, to whichever worker, without a lease to wait
            drop(sending);
            self.give_back(&ticket).await;
            return Err(ProcessError::Interrupted);
        }
        let data = &h.delivery.data;
        let published = s.publisher.publish(exchange, channel, data, props).await;
        if let Err(e) = &published {
            sending.failed(e);
        }
        drop(sending);
        if let Err(e) = published {
            return Box::pin(self.undelivered(h, ticket, e, now))
                .await
                .map(Sent::Out);
        }
        s.commits.commit(ticket);
        if let Some((routed, on_step)) = route {
            let at = (h.seen.first_seen, false);
            let later = routes.escalate_later(s, h.delivery, (on_step, routed), h.policy, at);
            Box::pin(later).await?;
        }
        if h.seen.attempt > 0 {
            // it had waited: out of its recipient's waiting jobs
            self.note(s, h.job, h.seen, JobState::Dispatched, None);
        }
        debug!(channel = %channel, "dispatched");
        Ok(Sent::Out(Outcome::Dispatched))
    }

    /// A dispatch the broker did not confirm. Refused (returned, nacked): its send
    /// is given back and it waits to be tried again. No confirm in time, or the
    /// connection dropped: it may have been delivered, so its reservation is kept
    /// (the recipient's slot is not given to another job; the retry of this job
    /// takes it back, see `QuotaStore::keep_reservation`) and it is handed back.
    async fn undelivered(
        &self,
        h: &Handling<'_, '_>,
        ticket: Ticket,
        e: PublishError,
        now: DateTime<Utc>,
    ) -> Result<Outcome, ProcessError> {
        let s: &BrokerLink = h.s;
        if !matches!(e, PublishError::Returned | PublishError::Nacked) {
            warn!(error = %e, "dispatch unconfirmed; keeping its reservation and handing the job back");
            self.asks.store.keep_reservation(&ticket);
            return Err(e.into());
        }
        warn!(error = %e, "dispatch refused by the broker; giving the quota back");
        let release = || self.asks.store.release(&ticket);
        self.asks.retry_redis(release, &s.stop).await?;
        let until = decide::retry_refused_dispatch_at(h.seen.attempt, now);
        let cause = DelayCause::DispatchRefused;
        self.delay(h, until, &cause).await
    }

    /// Give an admission's send back, or keep it reserved if Redis cannot be told.
    async fn give_back(&self, ticket: &Ticket) {
        if self.asks.store.release(ticket).await.is_err() {
            self.asks.store.keep_reservation(ticket);
        }
    }
}

/// The dispatch's properties: JSON, the job's id, the headers a dispatch carries
/// (and a routed step's).
fn dispatch_props(
    h: &Handling<'_, '_>,
    route: Option<&Route<'_>>,
    channel: &str,
    now: DateTime<Utc>,
) -> BasicProperties {
    let props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_message_id(ShortString::from(h.job.id.as_ref()));
    let headers = h.delivery.properties.headers().as_ref();
    match (headers::dispatch_headers(headers, now), route) {
        (h, Some((routed, _))) => {
            props.with_headers(fallback::route::with_headers(h, routed, channel))
        }
        (Some(h), None) => props.with_headers(h),
        (None, None) => props,
    }
}
