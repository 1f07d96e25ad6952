//! placeholder
pub mod error;
pub mod mem;
pub mod wire;
pub use error::ConfigError;
