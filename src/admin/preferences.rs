//! A recipient's preferences as the operators' pages edit them: the preferences
//! room's own reads and writes ([`crate::preferences::edit`]), named here for the
//! console (`console/recipient.rs`).

pub use crate::preferences::edit::{delete, get, patch, put, write, EditError, Stored};
