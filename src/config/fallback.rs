//! A policy's fallback section (`[policies.NAME.fallback]`): as written, checked,
//! and built into the [`FallbackSpec`] the worker routes with.

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::text::Dur;
use crate::fallback::spec::{AnsweredBy, Cause, FallbackSpec};

/// `[policies.NAME.fallback]` as written in the file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FallbackSettings {
    /// What moves a job on to its next channel: any of `capped`, `opted_out`,
    /// `suppressed`, `failed`, `unanswered` (default: the first four).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<String>>,
    /// `capped`: a job moves on only when its channel's next allowed instant is
    /// further away than this (default `"0s"`: at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_at_most: Option<Dur>,
    /// `unanswered`: a job moves on when no answer came this long after its
    /// dispatch (required when `on` holds `unanswered`; 1s to 7d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_within: Option<Dur>,
    /// `unanswered`: which feedback answers a step, `delivered` (the default) or
    /// `read`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_by: Option<String>,
}

/// Check a fallback section whose keys start with `key`.
pub(super) fn validate(f: &FallbackSettings, key: &str) -> Result<(), ConfigError> {
    let mut causes = Vec::new();
    for word in f.on.iter().flatten() {
        let cause = Cause::parse(word).ok_or_else(|| {
            invalid(
                format!("{key}.on"),
                format!("`{word}` is not one of capped, opted_out, suppressed, failed, unanswered"),
            )
        })?;
        if causes.contains(&cause) {
            return Err(invalid(
                format!("{key}.on"),
                format!("`{word}` is named twice"),
            ));
        }
        causes.push(cause);
    }
    let week = std::time::Duration::from_secs(7 * 86_400);
    match (causes.contains(&Cause::Unanswered), f.answer_within) {
        (true, None) => Err(invalid(
            format!("{key}.answer_within"),
            "is required when `on` holds `unanswered`",
        )),
        (_, Some(d)) if d.0 < std::time::Duration::from_secs(1) || d.0 > week => Err(invalid(
            format!("{key}.answer_within"),
            "must be from 1s to 7d",
        )),
        _ => Ok(()),
    }?;
    if f.wait_at_most.is_some_and(|d| d.0 > week) {
        return Err(invalid(format!("{key}.wait_at_most"), "must be at most 7d"));
    }
    match f.answered_by.as_deref() {
        None | Some("delivered") | Some("read") => Ok(()),
        Some(other) => Err(invalid(
            format!("{key}.answered_by"),
            format!("`{other}` is not one of delivered, read"),
        )),
    }
}

/// The spec a checked section says.
pub(super) fn build(f: &FallbackSettings) -> FallbackSpec {
    let default = FallbackSpec::default();
    FallbackSpec {
        on: match &f.on {
            Some(words) => words.iter().filter_map(|w| Cause::parse(w)).collect(),
            None => default.on,
        },
        wait_at_most: f
            .wait_at_most
            .and_then(|d| chrono::Duration::from_std(d.0).ok())
            .unwrap_or(default.wait_at_most),
        answer_within: f.answer_within.map(|d| d.0),
        answered_by: match f.answered_by.as_deref() {
            Some("read") => AnsweredBy::Read,
            _ => AnsweredBy::Delivered,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{validate, FallbackSettings};
    use crate::config::text::Dur;

    fn on(words: &[&str]) -> FallbackSettings {
        FallbackSettings {
            on: Some(words.iter().map(|w| w.to_string()).collect()),
            wait_at_most: None,
            answer_within: None,
            answered_by: None,
        }
    }

    #[test]
    fn a_bad_fallback_section_names_its_key() {
        let key = |f: &FallbackSettings| {
            validate(f, "policies.p.fallback")
                .err()
                .and_then(|e| e.key().map(str::to_string))
        };
        assert_eq!(key(&on(&["capped", "opted_out"])), None);
        assert_eq!(
            key(&on(&["sometimes"])).as_deref(),
            Some("policies.p.fallback.on")
        );
        assert_eq!(
            key(&on(&["capped", "capped"])).as_deref(),
            Some("policies.p.fallback.on")
        );
        assert_eq!(
            key(&on(&["unanswered"])).as_deref(),
            Some("policies.p.fallback.answer_within")
        );
        let soon = FallbackSettings {
            answer_within: Some(Dur(std::time::Duration::from_millis(500))),
            ..on(&["unanswered"])
        };
        assert_eq!(
            key(&soon).as_deref(),
            Some("policies.p.fallback.answer_within")
        );
        let fine = FallbackSettings {
            answer_within: Some(Dur(std::time::Duration::from_secs(120))),
            ..on(&["unanswered"])
        };
        assert_eq!(key(&fine), None);
        let far = FallbackSettings {
            wait_at_most: Some(Dur(std::time::Duration::from_secs(8 * 86_400))),
            ..on(&["capped"])
        };
        assert_eq!(
            key(&far).as_deref(),
            Some("policies.p.fallback.wait_at_most")
        );
        let read = FallbackSettings {
            answered_by: Some("seen".into()),
            ..on(&["capped"])
        };
        assert_eq!(
            key(&read).as_deref(),
            Some("policies.p.fallback.answered_by")
        );
    }
}
