//! What goes wrong reading a configuration: [`ConfigError`], and the mapping of the
//! deserializer's errors onto the key they are about.

use std::path::PathBuf;

use super::locate::Origin;

/// A configuration that could not be read or is not valid.
///
/// Errors about one key name it (dotted, e.g. `channels.sms.rate`) and, wrapped in
/// [`ConfigError::At`], where its value was set: the line of the `--config` file,
/// the environment variable, or the line of the built-in defaults.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file given with `--config` could not be read.
    #[error("cannot read configuration file {}: {cause}", path.display())]
    Unreadable {
        /// The file as given.
        path: PathBuf,
        /// Why (missing, a directory, not UTF-8, permissions).
        cause: std::io::Error,
    },
    /// The file given with `--config` is not valid TOML.
    #[error("{}:{line}:{column}: not valid TOML: {message}", path.display())]
    Syntax {
        /// The file as given.
        path: PathBuf,
        /// Line of the error (1-based).
        line: usize,
        /// Column of the error (1-based, in characters).
        column: usize,
        /// What the TOML parser expected.
        message: String,
    },
    /// An environment variable could not be read, or the sources not merged.
    #[error(transparent)]
    Read(#[from] config::ConfigError),
    /// A key that is not part of the configuration.
    #[error("unknown key `{key}`: {reason}")]
    Unknown {
        /// Dotted path of the key.
        key: String,
        /// The keys allowed there.
        reason: String,
    },
    /// A value was read but is not acceptable.
    #[error("invalid value for `{key}`: {reason}")]
    Invalid {
        /// Dotted path of the key, e.g. `channels.sms.rate`.
        key: String,
        /// Why it is refused.
        reason: String,
    },
    /// An error about one key, with where that key was set.
    #[error("{origin}: {error}")]
    At {
        /// The file line, environment variable or default that set the key.
        origin: Origin,
        /// The error.
        error: Box<ConfigError>,
    },
}

impl ConfigError {
    /// The dotted key the error is about, if it is about one.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Unknown { key, .. } | ConfigError::Invalid { key, .. } => Some(key),
            ConfigError::At { error, .. } => error.key(),
            _ => None,
        }
    }

    /// Where the key the error is about was set, when known.
    #[cfg(test)]
    pub(crate) fn origin(&self) -> Option<&Origin> {
        match self {
            ConfigError::At { origin, .. } => Some(origin),
            _ => None,
        }
    }
}

/// The value of `key` is refused, for `reason`.
pub(super) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// A deserialization error, named by the path serde was at.
pub(super) fn from_serde(e: serde_path_to_error::Error<config::ConfigError>) -> ConfigError {
    let key = e.path().to_string();
    if key == "." {
        return ConfigError::Read(e.into_inner());
    }
    // A missing field: the `config` crate names it by its whole path, glued to
    // the path of its table (`policies.x.rules[0]window`).
    if let config::ConfigError::NotFound(full) = e.inner() {
        let field = full.strip_prefix(key.as_str()).unwrap_or(full);
        let field = field.trim_start_matches('.');
        return ConfigError::Invalid {
            key: format!("{key}.{field}"),
            reason: "required, and not set (it has no default)".into(),
        };
    }
    let reason = core_message(e.inner());
    if reason.starts_with("unknown field") {
        ConfigError::Unknown { key, reason }
    } else {
        ConfigError::Invalid { key, reason }
    }
}

/// The `config` crate's message without the key and origin it appends (the path
/// from serde names the key; [`Origin`] says where it was set).
fn core_message(e: &config::ConfigError) -> String {
    match e {
        config::ConfigError::Type {
            unexpected,
            expected,
            ..
        } => format!("invalid type: {unexpected}, expected {expected}"),
        config::ConfigError::At { error, .. } => core_message(error),
        other => other.to_string(),
    }
}
