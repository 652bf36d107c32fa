//! What became of one job: its [`Outcome`] once the broker confirmed it, and the
//! [`Reason`] of a dead letter. Pure. The outcome's kind indexes its counter in
//! `quota_worker_jobs_total`.

use chrono::{DateTime, Utc};

/// Why a job went to the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// Not a valid job.
    Malformed,
    /// Its channel is not configured.
    UnknownChannel,
    /// Refused by a cap whose policy drops refused jobs (or can never pass).
    Capped,
    /// It could not be sent before its `expires_at`.
    Expired,
    /// An operator cancelled it while it waited (`admin job ID cancel`).
    Cancelled,
    /// Its recipient is suppressed on its channel (a bounce, complaint or opt-out).
    Suppressed,
    /// Its recipient opted out of its category, its channel or the pair.
    OptedOut,
    /// Feedback from a sender that is not valid (not a job's outcome).
    MalformedFeedback,
    /// Refused by its tenant's or sender's quota (a cap with `scope = "tenant"`
    /// or `"sender"`) while its policy drops refused jobs.
    QuotaExceeded,
}

impl Reason {
    /// Every reason, in declaration order.
    pub(crate) const ALL: [Reason; 9] = [
        Reason::Malformed,
        Reason::UnknownChannel,
        Reason::Capped,
        Reason::Expired,
        Reason::Cancelled,
        Reason::Suppressed,
        Reason::OptedOut,
        Reason::MalformedFeedback,
        Reason::QuotaExceeded,
    ];

    /// The `x-notify-reason` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Malformed => "malformed",
            Reason::UnknownChannel => "unknown_channel",
            Reason::Capped => "capped",
            Reason::Expired => "expired",
            Reason::Cancelled => "cancelled",
            Reason::Suppressed => "suppressed",
            Reason::OptedOut => "opted_out",
            Reason::MalformedFeedback => "malformed_feedback",
            Reason::QuotaExceeded => "quota_exceeded",
        }
    }
}

/// What became of one delivery (its outcome is confirmed by the broker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Published to the dispatch exchange.
    Dispatched,
    /// Sent round the delay ladder, back at `until`.
    Delayed {
        /// When it comes back to the jobs queue.
        until: DateTime<Utc>,
    },
    /// Already dispatched; acked and counted.
    Duplicate,
    /// A newer job of its recipient with the same collapse key replaced it; acked,
    /// not sent.
    Superseded,
    /// Published to the dead-letter queue.
    Dead(Reason),
    /// Its channel's rate would have made it wait: published to its lane's queue,
    /// where it waits for the rate (and is decided again).
    Parked,
    /// Folded into its group's open digest (its policy has one): acked once stored,
    /// sent as an item of the digest.
    Folded,
    /// An escalation whose step was answered (or had moved on already) before it
    /// came back: acked, nothing more sent.
    Answered,
    /// Its recipient was erased after a worker first saw it (`crate::erase`):
    /// acked, not sent, no dead letter.
    Erased,
}

impl Outcome {
    /// How many distinct `(outcome, reason)` label pairs there are.
    pub(crate) const KINDS: usize = 8 + Reason::ALL.len();

    /// Its kind, in `0..KINDS`: the index of its counter.
    pub(crate) fn kind(&self) -> usize {
        match self {
            Outcome::Dispatched => 0,
            Outcome::Delayed { .. } => 1,
            Outcome::Duplicate => 2,
            Outcome::Superseded => 3,
            Outcome::Dead(r) => 4 + *r as usize,
            Outcome::Parked => 4 + Reason::ALL.len(),
            Outcome::Folded => 5 + Reason::ALL.len(),
            Outcome::Answered => 6 + Reason::ALL.len(),
            Outcome::Erased => 7 + Reason::ALL.len(),
        }
    }

    /// The `outcome` and `reason` labels of `quota_worker_jobs_total` for kind `k`.
    pub(crate) fn labels(k: usize) -> (&'static str, &'static str) {
        match k {
            0 => ("dispatched", ""),
            1 => ("delayed", ""),
            2 => ("duplicate", ""),
            3 => ("superseded", ""),
            k if k == 4 + Reason::ALL.len() => ("parked", ""),
            k if k == 5 + Reason::ALL.len() => ("folded", ""),
            k if k == 6 + Reason::ALL.len() => ("answered", ""),
            k if k == 7 + Reason::ALL.len() => ("erased", ""),
            k => ("dead", Reason::ALL[k - 4].as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_outcome_kind_has_its_own_labels() {
        let outcomes = [
            Outcome::Dispatched,
            Outcome::Delayed {
                until: DateTime::<Utc>::UNIX_EPOCH,
            },
            Outcome::Duplicate,
            Outcome::Superseded,
        ]
        .into_iter()
        .chain(Reason::ALL.map(Outcome::Dead))
        .chain([
            Outcome::Parked,
            Outcome::Folded,
            Outcome::Answered,
            Outcome::Erased,
        ]);
        let kinds: Vec<usize> = outcomes.map(|o| o.kind()).collect();
        assert_eq!(kinds, (0..Outcome::KINDS).collect::<Vec<_>>());
        for r in Reason::ALL {
            assert_eq!(
                Outcome::labels(Outcome::Dead(r).kind()),
                ("dead", r.as_str())
            );
        }
        assert_eq!(Outcome::labels(0).0, "dispatched");
        assert_eq!(Outcome::labels(Outcome::Duplicate.kind()).0, "duplicate");
        let mut labels: Vec<_> = (0..Outcome::KINDS).map(Outcome::labels).collect();
        labels.sort();
        labels.dedup();
        assert_eq!(labels.len(), Outcome::KINDS);
    }
}
