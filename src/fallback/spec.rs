//! What a policy says of fallback (`[policies.NAME.fallback]`), as the worker
//! works with it. Pure: no I/O.

use std::fmt;
use std::time::Duration;

/// Why a job moves on to its next channel (the words of `on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Its channel refuses it by a rule or cap of that channel alone, until later
    /// than `wait_at_most`.
    Capped,
    /// The recipient's preferences turn the channel (or the category on it) off.
    OptedOut,
    /// A bounce or complaint suppresses the recipient on the channel.
    Suppressed,
    /// The sender reports `failed` for the step.
    Failed,
    /// No answer came within `answer_within` of the step's dispatch.
    Unanswered,
}

impl Cause {
    /// Every cause, with its word.
    pub const ALL: [(Cause, &'static str); 5] = [
        (Cause::Capped, "capped"),
        (Cause::OptedOut, "opted_out"),
        (Cause::Suppressed, "suppressed"),
        (Cause::Failed, "failed"),
        (Cause::Unanswered, "unanswered"),
    ];

    /// Its word, as `on` and the `cause` label write it.
    pub fn as_str(self) -> &'static str {
        Cause::ALL
            .iter()
            .find(|(c, _)| *c == self)
            .map_or("", |(_, w)| w)
    }

    /// The cause a word names.
    pub fn parse(word: &str) -> Option<Cause> {
        Cause::ALL.iter().find(|(_, w)| *w == word).map(|(c, _)| *c)
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which feedback answers a step (`answered_by`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AnsweredBy {
    /// The sender reported it delivered (or read).
    #[default]
    Delivered,
    /// The recipient opened or saw it.
    Read,
}

/// A policy's fallback, as the worker works with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FallbackSpec {
    /// The causes that move a job on.
    pub on: Vec<Cause>,
    /// A capped job moves on only when its channel's next allowed instant is
    /// further away than this.
    pub wait_at_most: chrono::Duration,
    /// With `unanswered`: how long after a dispatch an answer may come.
    pub answer_within: Option<Duration>,
    /// With `unanswered`: which feedback answers a step.
    pub answered_by: AnsweredBy,
}

impl Default for FallbackSpec {
    /// `on = ["capped", "opted_out", "suppressed", "failed"]`, at once.
    fn default() -> Self {
        FallbackSpec {
            on: vec![
                Cause::Capped,
                Cause::OptedOut,
                Cause::Suppressed,
                Cause::Failed,
            ],
            wait_at_most: chrono::Duration::zero(),
            answer_within: None,
            answered_by: AnsweredBy::Delivered,
        }
    }
}

impl FallbackSpec {
    /// Whether `cause` moves a job on.
    pub fn moves_on(&self, cause: Cause) -> bool {
        self.on.contains(&cause)
    }
}
