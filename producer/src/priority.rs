//! A job's lane: `urgent`, `normal` or `bulk`. Pure: the words, and the routing key
//! a producer that knows its lane publishes under.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which lane a job waits in when its channel's rate makes it wait: urgent jobs take
/// the channel's next send slots, then normal ones, then bulk.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    Serialize,
    Deserialize,
    JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Codes, receipts, password resets: never wait behind lower lanes.
    Urgent,
    /// Everything else (the default).
    #[default]
    Normal,
    /// Campaigns: take what the higher lanes leave.
    Bulk,
}

impl Priority {
    /// Every lane, highest first.
    pub const ALL: [Priority; 3] = [Priority::Urgent, Priority::Normal, Priority::Bulk];

    /// `urgent`, `normal` or `bulk`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Urgent => "urgent",
            Priority::Normal => "normal",
            Priority::Bulk => "bulk",
        }
    }

    /// 0 for urgent, 1 for normal, 2 for bulk.
    pub fn rank(self) -> usize {
        self as usize
    }

    /// The routing key of this lane of `channel` on the lanes exchange.
    pub fn routing_key(self, channel: &str) -> String {
        format!("{channel}.{}", self.as_str())
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Not one of `urgent`, `normal`, `bulk`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a priority (urgent, normal or bulk): {0:?}")]
pub struct UnknownPriority(pub String);

impl FromStr for Priority {
    type Err = UnknownPriority;
    fn from_str(s: &str) -> Result<Priority, UnknownPriority> {
        Priority::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownPriority(s.chars().take(64).collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_read_and_print() {
        for p in Priority::ALL {
            assert_eq!(p.as_str().parse::<Priority>(), Ok(p));
        }
        assert!("Urgent".parse::<Priority>().is_err());
        assert_eq!(Priority::default(), Priority::Normal);
        assert_eq!(Priority::Bulk.routing_key("sms"), "sms.bulk");
        assert!(Priority::Urgent < Priority::Bulk);
    }
}
