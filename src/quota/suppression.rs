//! What suppresses a recipient on a channel, and how a suppression is written in
//! Redis. Pure: no I/O.
//!
//! A recipient's suppressions are one hash, `prefix:{tag}/suppressed` (the slot of
//! its other keys), field = channel, value = `kind:since_ms:until_ms` with
//! `until_ms` 0 for "until removed". `src/admission/lua/` reads the field of a job's
//! channel and compares the kind with the policy's `suppressed_by` mask.

use std::fmt;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A feedback event that suppresses its recipient on its channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The address bounced (suppressed for `suppression.bounced_ttl`).
    Bounced,
    /// The recipient complained (until removed).
    Complained,
    /// The recipient opted out (until removed).
    Unsubscribed,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 3] = [Kind::Bounced, Kind::Complained, Kind::Unsubscribed];

    /// Its word.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Bounced => "bounced",
            Kind::Complained => "complained",
            Kind::Unsubscribed => "unsubscribed",
        }
    }

    /// The kind a word names.
    pub fn parse(word: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == word)
    }

    /// Its bit in a [`Kinds`] mask (what `src/admission/lua/` compares).
    pub fn bit(self) -> u8 {
        match self {
            Kind::Bounced => 1,
            Kind::Complained => 2,
            Kind::Unsubscribed => 4,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The kinds of suppression that hold a policy's jobs, as a bit mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Kinds(pub u8);

impl Kinds {
    /// All three.
    pub const ALL: Kinds = Kinds(7);

    /// The set of `kinds`.
    pub fn of(kinds: &[Kind]) -> Kinds {
        Kinds(kinds.iter().fold(0, |m, k| m | k.bit()))
    }

    /// Whether `kind` is in the set.
    pub fn holds(self, kind: Kind) -> bool {
        self.0 & kind.bit() != 0
    }
}

/// One suppression of a recipient on a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suppression {
    /// What suppressed it.
    pub kind: Kind,
    /// Since when (Redis time).
    pub since: DateTime<Utc>,
    /// Until when; `None`: until removed.
    pub until: Option<DateTime<Utc>>,
}

impl Suppression {
    /// The hash value: `kind:since_ms:until_ms` (0: until removed).
    pub fn encode(&self) -> String {
        let until = self.until.map_or(0, |u| u.timestamp_millis());
        format!(
            "{}:{}:{until}",
            self.kind.bit(),
            self.since.timestamp_millis()
        )
    }

    /// A hash value read back; `None` if it has another shape.
    pub fn decode(value: &str) -> Option<Suppression> {
        let mut parts = value.split(':');
        let bit: u8 = parts.next()?.parse().ok()?;
        let since = parts.next()?.parse().ok()?;
        let until: i64 = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Suppression::from_parts(bit.into(), since, until)
    }

    /// One from the parts of its hash value: the kind's bit, since and until (ms;
    /// until 0: until removed); `None` for a bit of no kind or a time out of range.
    pub fn from_parts(bit: i64, since_ms: i64, until_ms: i64) -> Option<Suppression> {
        let kind = Kind::ALL.into_iter().find(|k| i64::from(k.bit()) == bit)?;
        Some(Suppression {
            kind,
            since: DateTime::from_timestamp_millis(since_ms)?,
            until: match until_ms {
                0 => None,
                ms => Some(DateTime::from_timestamp_millis(ms)?),
            },
        })
    }

    /// Whether it still holds at `now`.
    pub fn holds_at(&self, now: DateTime<Utc>) -> bool {
        self.until.is_none_or(|u| now < u)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_suppression_reads_back_as_written() {
        let since = DateTime::from_timestamp_millis(1_700_000_000_123).unwrap();
        for until in [None, Some(since + chrono::Duration::days(30))] {
            for kind in Kind::ALL {
                let s = Suppression { kind, since, until };
                assert_eq!(Suppression::decode(&s.encode()), Some(s));
            }
        }
        assert_eq!(Suppression::decode("9:1:0"), None);
        assert_eq!(Suppression::decode("1:1"), None);
        assert_eq!(Suppression::decode("1:1:0:4"), None);
    }

    #[test]
    fn masks_hold_their_kinds() {
        let m = Kinds::of(&[Kind::Bounced]);
        assert!(m.holds(Kind::Bounced));
        assert!(!m.holds(Kind::Unsubscribed));
        assert_eq!(Kinds::of(&Kind::ALL), Kinds::ALL);
        assert_eq!(Kind::parse("complained"), Some(Kind::Complained));
        assert_eq!(Kind::parse("delivered"), None);
    }

    #[test]
    fn a_bounce_lapses_and_an_opt_out_does_not() {
        let since = DateTime::from_timestamp_millis(1_000).unwrap();
        let until = since + chrono::Duration::seconds(10);
        let s = Suppression {
            kind: Kind::Bounced,
            since,
            until: Some(until),
        };
        assert!(s.holds_at(since));
        assert!(!s.holds_at(until));
        let forever = Suppression { until: None, ..s };
        assert!(forever.holds_at(since + chrono::Duration::days(9999)));
    }
}
