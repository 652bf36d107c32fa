//! Policy changes without a restart: on `SIGHUP` or `POST /reload`
//! (`quota-worker admin reload`), read the configuration again from the same file
//! and environment, and put its policies and channel rates and windows in force
//! for the next decisions ([`crate::rules`]). Every recorded send stays in Redis,
//! so caps count across the change. A file that does not load is refused with the
//! same error as at start; a change only a restart can apply (connections, names,
//! the set of channels) is refused naming the keys. Either way the running rules
//! stay as they were.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::config::{ConfigError, Settings};
use crate::rules::Rules;
use crate::store::QuotaStore;

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The configuration does not load: the error `run` would stop with.
    #[error("the configuration is not valid; the running one stays: {0}")]
    Invalid(#[from] ConfigError),
    /// It changes what a running worker cannot change.
    #[error("a restart is needed to change {}; nothing was applied", .0.join(", "))]
    NeedsRestart(Vec<String>),
}

/// The last reload: when, and what it did.
#[derive(Debug, Clone, Serialize)]
pub struct ReloadReport {
    /// When it was asked for.
    pub at: DateTime<Utc>,
    /// `applied` or `refused`.
    pub result: &'static str,
    /// What changed (applied), or why it was refused.
    pub detail: Vec<String>,
}

/// Re-reads the configuration and swaps the rules in force.
#[derive(Debug)]
pub struct Reloader {
    path: Option<PathBuf>,
    store: Arc<QuotaStore>,
    /// The settings in force (those of the start, with the last applied rules).
    running: Mutex<Settings>,
    last: Mutex<Option<ReloadReport>>,
}

impl Reloader {
    /// A reloader for a worker started with `settings` read from `path` (and the
    /// environment).
    pub fn new(path: Option<PathBuf>, settings: Settings, store: Arc<QuotaStore>) -> Reloader {
        Reloader {
            path,
            store,
            running: Mutex::new(settings),
            last: Mutex::new(None),
        }
    }

    /// Read the configuration again and apply it; what changed (one line per
    /// policy, channel, cap or tenant; empty when nothing did).
    pub fn reload(&self) -> Result<Vec<String>, ReloadError> {
        let result = Settings::load(self.path.as_deref())
            .map_err(ReloadError::from)
            .and_then(|new| self.apply(new));
        let (word, detail) = match &result {
            Ok(changes) => ("applied", changes.clone()),
            Err(e) => ("refused", vec![e.to_string()]),
        };
        metrics::counter!(crate::metrics::RELOADS_TOTAL, "result" => word).increment(1);
        match &result {
            Ok(changes) if changes.is_empty() => {
                tracing::info!("configuration reloaded: no policy or channel changed")
            }
            Ok(changes) => tracing::info!(changes = %changes.join("; "), "configuration reloaded"),
            Err(e) => tracing::error!(error = %e, "configuration reload refused"),
        }
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(ReloadReport {
            at: Utc::now(),
            result: word,
            detail,
        });
        result
    }

    /// Apply `new` (already validated) if only what may change live differs.
    pub fn apply(&self, new: Settings) -> Result<Vec<String>, ReloadError> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        let fixed = crate::config::needs_restart(&running, &new);
        if !fixed.is_empty() {
            return Err(ReloadError::NeedsRestart(fixed));
        }
        let rules = Rules::from_settings(&new);
        let before = self.store.set_rules(rules);
        let changes = self.store.rules().changes_from(&before);
        running.policies = new.policies;
        running.channels = new.channels;
        running.caps = new.caps;
        running.tenants = new.tenants;
        Ok(changes)
    }

    /// The store it swaps the rules of (the preferences API edits through it).
    pub fn store(&self) -> &Arc<QuotaStore> {
        &self.store
    }

    /// The rules in force now.
    pub fn rules(&self) -> Arc<Rules> {
        self.store.rules()
    }

    /// The settings in force (those of the start, with the last applied rules).
    pub fn settings(&self) -> Settings {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The last reload, if any.
    pub fn last(&self) -> Option<ReloadReport> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
