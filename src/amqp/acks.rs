//! Settling deliveries in batches. Jobs finish out of order; acking each one costs
//! the broker a write (a Raft command on a quorum queue). The batcher acks the
//! longest run of finished deliveries with one `multiple` ack, and settles a finished
//! delivery on its own only when an unfinished one ahead of it (a job waiting for its
//! channel's rate, say) has held it back for a while.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lapin::options::{BasicAckOptions, BasicNackOptions};
use lapin::Channel;
use tokio::sync::mpsc;

/// How a delivery is settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its outcome is confirmed: ack.
    Ack,
    /// It could not be settled: hand it back to the queue.
    Requeue,
}

/// How long a finished delivery may wait behind an unfinished one before it is
/// acked on its own.
pub(crate) const HOLD: Duration = Duration::from_millis(50);

/// What to send to the broker, decided from the finished deliveries (pure).
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    next: u64,
    done: BTreeMap<u64, (Settle, Instant, bool)>,
}

/// One frame to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Frame {
    /// `basic.ack` with `multiple`.
    AckUpTo(u64),
    /// `basic.ack` of one delivery.
    AckOne(u64),
    /// `basic.nack` of one delivery, requeued.
    Requeue(u64),
}

impl Ledger {
    /// A ledger for a fresh channel (delivery tags start at 1).
    pub fn new() -> Ledger {
        Ledger {
            next: 1,
            done: BTreeMap::new(),
        }
    }

    /// Record a finished delivery.
    pub fn finish(&mut self, tag: u64, settle: Settle, at: Instant) {
        self.done.insert(tag, (settle, at, false));
    }

    /// The frames that settle what can be settled now.
    pub fn frames(&mut self, now: Instant) -> Vec<Frame> {
        let mut out = Vec::new();
        let mut run_end = None;
        while let Some((settle, _, sent)) = self.done.remove(&self.next) {
            match (settle, sent) {
                (_, true) => {}
                (Settle::Ack, false) => run_end = Some(self.next),
                (Settle::Requeue, false) => {
                    if let Some(end) = run_end.take() {
                        out.push(Frame::AckUpTo(end));
                    }
                    out.push(Frame::Requeue(self.next));
                }
            }
            self.next += 1;
        }
        if let Some(end) = run_end {
            out.push(Frame::AckUpTo(end));
        }
        // deliveries held back too long behind an unfinished one: settle singly
        for (tag, (settle, at, sent)) in self.done.iter_mut() {
            if !*sent && now.duration_since(*at) >= HOLD {
                *sent = true;
                out.push(match settle {
                    Settle::Ack => Frame::AckOne(*tag),
                    Settle::Requeue => Frame::Requeue(*tag),
                });
            }
        }
        out
    }

    /// Whether finished deliveries wait behind an unfinished one.
    pub fn holding(&self) -> bool {
        self.done.values().any(|(_, _, sent)| !sent)
    }
}

/// Handle to the batcher task of one consuming channel.
#[derive(Debug, Clone)]
pub(crate) struct Acks {
    tx: mpsc::UnboundedSender<(u64, Settle)>,
}

impl Acks {
    /// Start the batcher for `channel`; it ends when every handle is dropped, after
    /// settling everything it was told.
    pub fn start(channel: Channel) -> (Acks, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Acks { tx }, tokio::spawn(run(channel, rx)))
    }

    /// Settle delivery `tag`.
    pub fn settle(&self, tag: u64, settle: Settle) {
        let _ = self.tx.send((tag, settle));
    }
}

async fn run(channel: Channel, mut rx: mpsc::UnboundedReceiver<(u64, Settle)>) {
    let mut ledger = Ledger::new();
    loop {
        let next = if ledger.holding() {
            match tokio::time::timeout(HOLD / 2, rx.recv()).await {
                Ok(m) => m,
                Err(_) => Some((0, Settle::Ack)), // a tick: no message
            }
        } else {
            rx.recv().await
        };
        let Some(first) = next else { break };
        let now = Instant::now();
        if first.0 != 0 {
            ledger.finish(first.0, first.1, now);
        }
        while let Ok((tag, settle)) = rx.try_recv() {
            ledger.finish(tag, settle, now);
        }
        for frame in ledger.frames(now) {
            send(&channel, frame).await;
        }
    }
    for frame in ledger.frames(Instant::now() + HOLD) {
        send(&channel, frame).await;
    }
}

async fn send(channel: &Channel, frame: Frame) {
    let result = match frame {
        Frame::AckUpTo(tag) => {
            channel
                .basic_ack(tag, BasicAckOptions { multiple: true })
                .await
        }
        Frame::AckOne(tag) => {
            channel
                .basic_ack(tag, BasicAckOptions { multiple: false })
                .await
        }
        Frame::Requeue(tag) => {
            let options = BasicNackOptions {
                multiple: false,
                requeue: true,
            };
            channel.basic_nack(tag, options).await
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, ?frame, "settling failed; the broker will deliver those jobs again and they will be recognised");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_finished_deliveries_is_one_multiple_ack() {
        let t0 = Instant::now();
        let mut l = Ledger::new();
        for tag in [3, 1, 2] {
            l.finish(tag, Settle::Ack, t0);
        }
        assert_eq!(l.frames(t0), vec![Frame::AckUpTo(3)]);
        assert!(!l.holding());
    }

    #[test]
    fn a_requeue_splits_the_run() {
        let t0 = Instant::now();
        let mut l = Ledger::new();
        l.finish(1, Settle::Ack, t0);
        l.finish(2, Settle::Requeue, t0);
        l.finish(3, Settle::Ack, t0);
        assert_eq!(
            l.frames(t0),
            vec![Frame::AckUpTo(1), Frame::Requeue(2), Frame::AckUpTo(3)]
        );
    }

    #[test]
    fn held_back_deliveries_are_settled_singly_and_never_twice() {
        let t0 = Instant::now();
        let mut l = Ledger::new();
        l.finish(2, Settle::Ack, t0);
        l.finish(3, Settle::Requeue, t0);
        assert_eq!(l.frames(t0), vec![]);
        assert!(l.holding());
        let later = t0 + HOLD;
        assert_eq!(l.frames(later), vec![Frame::AckOne(2), Frame::Requeue(3)]);
        assert!(!l.holding());
        // 1 and 4 finish: one multiple ack covers both (2 and 3 are settled already)
        l.finish(1, Settle::Ack, later);
        l.finish(4, Settle::Ack, later);
        assert_eq!(l.frames(later), vec![Frame::AckUpTo(4)]);
    }
}
