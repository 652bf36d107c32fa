//! What a policy's digest section (`[policies.NAME.digest]`) says, once read
//! ([`DigestSpec`]): a part of the policy, as its rules are. Pure: no I/O.
//! Everything a digest does (the fold, the closer, the message it becomes) is the
//! digests' room's ([`crate::digest`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The most items a digest may be configured to hold (`max_items`).
pub const MAX_ITEMS: u32 = 10_000;
/// The most items a digest may carry in full (`keep`).
pub const MAX_KEEP: u32 = 100;

/// How a digest collects (`policies.NAME.digest.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum DigestMode {
    /// Open from its first item for `window`, then dispatched.
    Window,
    /// Each item extends the window, up to `max_window` from the first.
    Sliding,
    /// Jobs go as usual while the caps allow; those the caps would delay are folded
    /// and the digest goes at the caps' next allowed instant.
    Held,
}

impl TryFrom<String> for DigestMode {
    type Error = String;

    fn try_from(word: String) -> Result<DigestMode, String> {
        match word.as_str() {
            "window" => Ok(DigestMode::Window),
            "sliding" => Ok(DigestMode::Sliding),
            "held" => Ok(DigestMode::Held),
            _ => Err(format!(
                "`{word}` is not one of \"window\" (open for `window` from its first item), \
                 \"sliding\" (each item extends it up to `max_window`) or \"held\" (what the \
                 caps would delay, sent at their next allowed instant)"
            )),
        }
    }
}

impl DigestMode {
    /// The word in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            DigestMode::Window => "window",
            DigestMode::Sliding => "sliding",
            DigestMode::Held => "held",
        }
    }
}

/// Which items a digest carries in full (`policies.NAME.digest.keep_from`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum KeepFrom {
    /// The first `keep` items (the default).
    #[default]
    First,
    /// The last `keep` items.
    Last,
}

impl TryFrom<String> for KeepFrom {
    type Error = String;

    fn try_from(word: String) -> Result<KeepFrom, String> {
        match word.as_str() {
            "first" => Ok(KeepFrom::First),
            "last" => Ok(KeepFrom::Last),
            _ => Err(format!("`{word}` is not one of \"first\" or \"last\"")),
        }
    }
}

impl KeepFrom {
    /// The word in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            KeepFrom::First => "first",
            KeepFrom::Last => "last",
        }
    }
}

/// A policy's digest section, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestSpec {
    /// How it collects.
    pub mode: DigestMode,
    /// How long a digest stays open from its first item (`window`, `sliding`).
    pub window: Duration,
    /// `sliding`: the longest a digest stays open from its first item.
    pub max_window: Option<Duration>,
    /// A digest closes at once when it holds this many items.
    pub max_items: u32,
    /// Items carried in full in the message.
    pub keep: u32,
    /// Which of them.
    pub keep_from: KeepFrom,
}

impl DigestSpec {
    /// The settings a digest opens with (and keeps, whatever a reload says), as the
    /// fold script stores them: `mode,window_ms,max_window_ms,max_items,keep,keep_from`.
    pub fn encoded(&self) -> String {
        format!(
            "{},{},{},{},{},{}",
            self.mode.as_str(),
            self.window.as_millis(),
            self.max_window.map_or(0, |d| d.as_millis()),
            self.max_items,
            self.keep,
            self.keep_from.as_str()
        )
    }

    /// The settings [`DigestSpec::encoded`] wrote; `None` if they are not that.
    pub fn decode(text: &str) -> Option<DigestSpec> {
        let mut parts = text.split(',');
        let mode = DigestMode::try_from(parts.next()?.to_string()).ok()?;
        let window = Duration::from_millis(parts.next()?.parse().ok()?);
        let max_window = match parts.next()?.parse::<u64>().ok()? {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        };
        let max_items = parts.next()?.parse().ok()?;
        let keep = parts.next()?.parse().ok()?;
        let keep_from = KeepFrom::try_from(parts.next()?.to_string()).ok()?;
        Some(DigestSpec {
            mode,
            window,
            max_window,
            max_items,
            keep,
            keep_from,
        })
    }
}

#[cfg(test)]
impl DigestSpec {
    /// A 15-minute `window` digest of at most 100 items keeping `keep` of them from
    /// `keep_from`, for tests.
    pub(crate) fn window_for_tests(keep: u32, keep_from: KeepFrom) -> DigestSpec {
        DigestSpec {
            mode: DigestMode::Window,
            window: Duration::from_secs(900),
            max_window: None,
            max_items: 100,
            keep,
            keep_from,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(keep: u32, keep_from: KeepFrom) -> DigestSpec {
        DigestSpec::window_for_tests(keep, keep_from)
    }

    #[test]
    fn the_settings_round_trip() {
        let s = DigestSpec {
            mode: DigestMode::Sliding,
            max_window: Some(Duration::from_secs(7200)),
            ..spec(3, KeepFrom::Last)
        };
        assert_eq!(DigestSpec::decode(&s.encoded()), Some(s));
        assert_eq!(DigestSpec::decode("window,1"), None);
    }
}
