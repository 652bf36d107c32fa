//! A recipient's own say (docs/guide/preferences.md), from the decision to the Redis
//! call: opt-outs by category, channel or the pair, and quiet hours. The set is
//! edited over HTTP (`http/preferences.rs`, described by [`crate::http::openapi`])
//! and from the CLI (`cli/preferences.rs`); the admission reads it in the call it
//! already makes (`src/admission/lua/`'s preferences section).
//!
//! - [`set`]: what a set says, checked whole, the merge a PATCH applies, where
//!   quiet hours end (pure);
//! - [`edit`]: a set read, replaced, merged and removed (`lua/preferences.lua`,
//!   [`replace`]);
//! - [`checks`]: what the admission checks of them (whether any recipient has a
//!   set; what this worker knows of quiet hours), kept by the quota store;
//! - [`lines`] (pure) and [`files`]: every set out and back in as JSON lines
//!   (`admin preferences export` and `import`).

pub(crate) mod checks;
pub mod edit;
pub mod files;
pub mod lines;
pub(crate) mod replace;
pub mod set;

pub use edit::EditError;
pub use set::{OptOut, Preferences, QuietHours};
