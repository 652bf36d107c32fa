//! Publishing with publisher confirms: a publish is done only once the broker
//! confirmed it and did not return it as unroutable. While the connection lives a
//! late confirm is still coming (a broker in flow control, `connection.blocked` by a
//! memory or disk alarm, holds publishes until the alarm clears; a broker that
//! hangs answers when it wakes), so the publish waits for it; the deadline applies
//! once the connection is gone without saying so.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionStatus};

/// Why a publish did not land.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// The message could not be routed (mandatory) and came back.
    #[error("returned by the broker as unroutable")]
    Returned,
    /// The broker refused it.
    #[error("nacked by the broker")]
    Nacked,
    /// The broker did not confirm in time, and the connection is no longer up.
    #[error("no confirm within {0:?}, and the connection is down")]
    Timeout(Duration),
    /// The channel or connection failed.
    #[error("amqp: {0}")]
    Amqp(#[from] lapin::Error),
}

/// Publishes on one confirm-mode channel; every publish waits for its confirm as
/// long as the connection is up (lapin's heartbeat says when it is not: after twice
/// the negotiated heartbeat without a word from the broker), checking every
/// `timeout`; a returned (unroutable) message counts as a failure.
#[derive(Clone, Debug)]
pub struct Publisher {
    channel: Channel,
    timeout: Duration,
    connection: ConnectionStatus,
    progress: Arc<Progress>,
}

/// Publishes waiting for their confirm, and how many have ended; a watchdog task
/// ([`watch`]) tells from them whether the broker has stopped answering, so that a
/// publish itself reads no clock.
#[derive(Debug, Default)]
struct Progress {
    waiting: AtomicU64,
    ended: AtomicU64,
    stalled: AtomicBool,
}

/// A publish unconfirmed this long, with no other confirm meanwhile, says the broker
/// stopped answering ([`Publisher::flowing`]). A healthy broker confirms in
/// milliseconds, and under load confirms keep arriving; a quorum queue electing a
/// leader pauses them for a second or two, which only delays dispatches. What is sent
/// before it is noticed (at 200 dispatches/s, about 60 in the broker-hang scenario)
/// is sent twice only if the worker stops or the connection dies before the broker
/// answers again. (Judged by a watchdog every [`STALLED_AFTER`] / 6: a stall is
/// seen 300 to 350 ms after the last confirm.)
pub const STALLED_AFTER: Duration = Duration::from_millis(300);

impl Publisher {
    /// Open a confirm-mode channel on `conn`.
    pub async fn open(conn: &Connection, timeout: Duration) -> Result<Publisher, lapin::Error> {
        let channel = conn.create_channel().await?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await?;
        let progress = Arc::new(Progress::default());
        // ends with the last clone of this publisher
        tokio::spawn(watch(Arc::downgrade(&progress)));
        Ok(Publisher {
            channel,
            timeout,
            connection: conn.status().clone(),
            progress,
        })
    }

    /// Publish persistently and mandatorily; Ok only once the broker confirmed it and
    /// did not return it.
    pub async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        properties: BasicProperties,
    ) -> Result<(), PublishError> {
        let options = BasicPublishOptions {
            mandatory: true,
            ..Default::default()
        };
        let properties = properties.with_delivery_mode(2);
        let work = async {
            let confirm = self
                .channel
                .basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    options,
                    body,
                    properties,
                )
                .await?;
            confirmed(confirm.await?)
        };
        let mut work = std::pin::pin!(work);
        self.progress.waiting.fetch_add(1, Ordering::Relaxed);
        let _done = Done(&self.progress);
        loop {
            match tokio::time::timeout(self.timeout, &mut work).await {
                Ok(result) => return result,
                // blocked by an alarm, or a broker slow to answer: the confirm will
                // come while the connection lives; a second copy sent now would be
                // a duplicate when it does
                Err(_) if self.connection.connected() => continue,
                Err(_) => return Err(PublishError::Timeout(self.timeout)),
            }
        }
    }

    /// The confirm-mode channel this publishes on (a consumer may share it: a
    /// channel fewer on the connection).
    pub fn channel(&self) -> &Channel {
        &self.channel
    }

    /// Whether the broker holds this connection's publishes (`connection.blocked`:
    /// a memory or disk alarm) until it says `connection.unblocked`.
    pub fn blocked(&self) -> bool {
        self.connection.blocked()
    }

    /// Whether a publish now would be confirmed soon: the connection is not blocked,
    /// and no publish has waited [`STALLED_AFTER`] with none confirmed meanwhile (a
    /// broker that hangs).
    pub fn is_flowing(&self) -> bool {
        !self.progress.stalled.load(Ordering::Relaxed) && !self.connection.blocked()
    }

    /// Whether a publish now may reach the broker: its channel and connection are up.
    /// Not up, a publish fails before anything is sent.
    pub fn is_connected(&self) -> bool {
        self.connection.connected() && self.channel.status().connected()
    }

    /// Wait until [`Publisher::is_flowing`], or the connection is gone (a publish
    /// then fails at once). A message sent into a broker that holds or ignores it
    /// is confirmed only when it answers again: one that must not be sent twice is
    /// better held back meanwhile, so that a shutdown or a lost connection hands
    /// its job back unsent.
    pub async fn flowing(&self) {
        while !self.is_flowing() && self.connection.connected() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A publisher confirm as a result: a returned (unroutable) message is a failure.
pub fn confirmed(confirmation: Confirmation) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(None) | Confirmation::NotRequested => Ok(()),
        Confirmation::Ack(Some(_)) => Err(PublishError::Returned),
        Confirmation::Nack(_) => Err(PublishError::Nacked),
    }
}

/// Counts a publish as ended (confirmed or failed) when dropped.
struct Done<'a>(&'a Progress);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.ended.fetch_add(1, Ordering::Relaxed);
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Every sixth of [`STALLED_AFTER`], whether publishes waited at this look and at
/// the one before with none ended between: stalled once that has held for
/// [`STALLED_AFTER`] (so 300 to 350 ms after the last confirm, or after the first of
/// the waiting publishes began). Ends when the publisher is gone.
async fn watch(progress: Weak<Progress>) {
    let tick = STALLED_AFTER / 6;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut last_ended, mut last_waiting, mut quiet) = (0, 0, Duration::ZERO);
    loop {
        interval.tick().await;
        let Some(p) = progress.upgrade() else { return };
        let (ended, waiting) = (
            p.ended.load(Ordering::Relaxed),
            p.waiting.load(Ordering::Relaxed),
        );
        quiet = match waiting > 0 && last_waiting > 0 && ended == last_ended {
            true => quiet + tick,
            false => Duration::ZERO,
        };
        (last_ended, last_waiting) = (ended, waiting);
        p.stalled.store(quiet >= STALLED_AFTER, Ordering::Relaxed);
    }
}
