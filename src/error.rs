//! Error types shared by every block.
//!
//! Every error enum of the crate (and of `pfemu-microcode`) is `#[non_exhaustive]`: a new
//! way to fail is a new variant, so a `match` on one outside the crate keeps a wildcard arm.

use std::fmt;

/// A configuration was refused. `setting` names the builder method or CLI option at fault,
/// `reason` says why, so a user can fix it without reading the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The setting at fault, spelled as the builder method (e.g. `ppe_threads`).
    pub setting: &'static str,
    /// Why the value was refused, including the accepted range where there is one.
    pub reason: String,
}

impl ConfigError {
    /// A refusal of `setting` for `reason`.
    pub fn new(setting: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            setting,
            reason: reason.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid configuration: `{}`: {}",
            self.setting, self.reason
        )
    }
}

impl std::error::Error for ConfigError {}
