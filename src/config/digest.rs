//! A policy's digest section (`[policies.NAME.digest]`): as written, checked, and
//! built into the [`DigestSpec`] the worker folds with.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{invalid, ConfigError};
use super::text::Dur;
use crate::quota::digest::{DigestMode, DigestSpec, KeepFrom, MAX_ITEMS, MAX_KEEP};

fn default_max_items() -> u32 {
    100
}

fn default_keep() -> u32 {
    10
}

/// `[policies.NAME.digest]` as written in the file.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DigestSettings {
    /// How a digest collects (required): `window` (open for `window` from its first
    /// item), `sliding` (each item keeps it open `window` longer, up to `max_window`
    /// from the first) or `held` (jobs go as usual while the caps allow them; those
    /// the caps would delay are folded, and the digest goes at the caps' next
    /// allowed instant).
    pub mode: DigestMode,
    /// `window` and `sliding`: how long a digest stays open from its first item
    /// (required for both, refused for `held`; 1s to 7d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Dur>,
    /// `sliding`: each item extends the window, up to this from the first item
    /// (required for `sliding`; at least `window`, at most 7d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_window: Option<Dur>,
    /// A digest closes at once when it holds this many items (default 100; 1 to
    /// 10,000).
    #[serde(default = "default_max_items")]
    pub max_items: u32,
    /// Items carried in full in the message (default 10; 0 to 100).
    #[serde(default = "default_keep")]
    pub keep: u32,
    /// Which items are carried in full: `first` (the default) or `last`.
    #[serde(default)]
    pub keep_from: KeepFrom,
}

/// Check the digest section of policy `name`, naming its keys under `at`
/// (`policies.NAME.digest`, or a tenant's `tenants.T.policies.NAME.digest`).
pub(super) fn validate(d: &DigestSettings, at: &str) -> Result<(), ConfigError> {
    let key = |k: &str| format!("{at}.{k}");
    if d.mode == DigestMode::Held {
        // a held digest closes at the caps' next allowed instant: no window
        for (name, set) in [
            ("window", d.window.is_some()),
            ("max_window", d.max_window.is_some()),
        ] {
            if set {
                return Err(invalid(
                    key(name),
                    "applies to modes \"window\" and \"sliding\" only (a held digest closes at the caps' next allowed instant)",
                ));
            }
        }
        return validate_sizes(d, at);
    }
    let Some(window) = d.window else {
        return Err(invalid(
            key("window"),
            format!(
                "is required for mode \"{}\" (e.g. \"15m\")",
                d.mode.as_str()
            ),
        ));
    };
    if window.0 < Duration::from_secs(1) {
        return Err(invalid(key("window"), "must be at least 1s"));
    }
    if window.0 > Duration::from_secs(7 * 86_400) {
        return Err(invalid(key("window"), "must be at most 7d (168h)"));
    }
    match (d.mode, d.max_window) {
        (DigestMode::Sliding, None) => {
            return Err(invalid(
                key("max_window"),
                "is required for mode \"sliding\" (the longest a digest stays open)",
            ))
        }
        (DigestMode::Sliding, Some(max)) if max.0 < window.0 => {
            return Err(invalid(key("max_window"), "must be at least `window`"))
        }
        (DigestMode::Sliding, Some(max)) if max.0 > Duration::from_secs(7 * 86_400) => {
            return Err(invalid(key("max_window"), "must be at most 7d (168h)"))
        }
        (DigestMode::Sliding, Some(_)) => {}
        (_, Some(_)) => {
            return Err(invalid(
                key("max_window"),
                "applies to mode \"sliding\" only",
            ))
        }
        (_, None) => {}
    }
    validate_sizes(d, at)
}

/// Check `max_items` and `keep`.
fn validate_sizes(d: &DigestSettings, at: &str) -> Result<(), ConfigError> {
    let key = |k: &str| format!("{at}.{k}");
    if !(1..=MAX_ITEMS).contains(&d.max_items) {
        return Err(invalid(
            key("max_items"),
            format!("must be 1 to {MAX_ITEMS}, not {}", d.max_items),
        ));
    }
    if d.keep > MAX_KEEP {
        return Err(invalid(
            key("keep"),
            format!("must be 0 to {MAX_KEEP}, not {}", d.keep),
        ));
    }
    Ok(())
}

/// The digest section as the worker folds with it.
pub(super) fn build(d: &DigestSettings) -> DigestSpec {
    DigestSpec {
        mode: d.mode,
        window: d.window.map_or(Duration::ZERO, |w| w.0),
        max_window: d.max_window.map(|w| w.0),
        max_items: d.max_items,
        keep: d.keep,
        keep_from: d.keep_from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml: &str) -> Result<DigestSettings, String> {
        let v: toml::Value = toml::from_str(toml).map_err(|e| e.to_string())?;
        v.try_into().map_err(|e: toml::de::Error| e.to_string())
    }

    fn key_of(toml: &str) -> String {
        let d = parse(toml).unwrap();
        validate(&d, "policies.social.digest")
            .unwrap_err()
            .key()
            .unwrap()
            .to_string()
    }

    #[test]
    fn defaults_and_a_window() {
        let d = parse(
            r#"mode = "window"
window = "15m""#,
        )
        .unwrap();
        assert!(validate(&d, "policies.social.digest").is_ok());
        let spec = build(&d);
        assert_eq!(spec.window, Duration::from_secs(900));
        assert_eq!((spec.max_items, spec.keep), (100, 10));
        assert_eq!(spec.keep_from, KeepFrom::First);
    }

    #[test]
    fn each_bad_value_names_its_key() {
        let at = "policies.social.digest";
        assert_eq!(key_of(r#"mode = "window""#), format!("{at}.window"));
        assert_eq!(
            key_of(
                r#"mode = "window"
window = "10ms""#
            ),
            format!("{at}.window")
        );
        assert_eq!(
            key_of(
                r#"mode = "sliding"
window = "1m""#
            ),
            format!("{at}.max_window")
        );
        assert_eq!(
            key_of(
                r#"mode = "window"
window = "1m"
max_window = "2h""#
            ),
            format!("{at}.max_window")
        );
        assert_eq!(
            key_of(
                r#"mode = "window"
window = "1m"
max_items = 0"#
            ),
            format!("{at}.max_items")
        );
        assert_eq!(
            key_of(
                r#"mode = "window"
window = "1m"
keep = 1000"#
            ),
            format!("{at}.keep")
        );
        assert_eq!(
            key_of("mode = \"held\"\nwindow = \"1h\""),
            format!("{at}.window")
        );
        let held = parse("mode = \"held\"\nkeep = 3").unwrap();
        assert!(validate(&held, at).is_ok());
        assert_eq!(
            key_of("mode = \"sliding\"\nwindow = \"1h\"\nmax_window = \"30m\""),
            format!("{at}.max_window")
        );
        let sliding = parse("mode = \"sliding\"\nwindow = \"15m\"\nmax_window = \"2h\"").unwrap();
        assert!(validate(&sliding, at).is_ok());
        assert_eq!(build(&sliding).max_window, Some(Duration::from_secs(7200)));
    }

    #[test]
    fn words_outside_the_contract_are_refused_naming_them() {
        let e = parse(r#"mode = "batch""#).unwrap_err();
        assert!(e.contains("\"window\""), "{e}");
        let e = parse(
            r#"mode = "window"
keep_from = "middle""#,
        )
        .unwrap_err();
        assert!(e.contains("\"first\" or \"last\""), "{e}");
        let e = parse(
            r#"mode = "window"
windows = "1m""#,
        )
        .unwrap_err();
        assert!(e.contains("windows"), "{e}");
    }
}
