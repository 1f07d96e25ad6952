//! Durations that come from input as floating-point numbers (command-line options,
//! benchmark settings), checked once where they enter.
//!
//! `Duration::from_secs_f64` panics on negative, NaN, infinite and too large values, and a
//! float cast to integer nanoseconds saturates silently; so every such value from a user
//! goes through [`secs`] or [`millis`] first, which refuse them with a [`DurationError`]
//! saying why. Past that check, conversions cannot fail.
//!
//! ```
//! use std::time::Duration;
//! use pfemu::duration::{secs, MAX_SECS};
//!
//! assert_eq!(secs(1.5), Ok(Duration::from_millis(1500)));
//! assert!(secs(0.0).is_err() && secs(f64::NAN).is_err() && secs(-1.0).is_err());
//! let e = secs(1e300).unwrap_err();
//! assert_eq!(e.to_string(), format!("1e300 s is too large (at most {MAX_SECS} s, about 31 years)"));
//! ```

use std::fmt;
use std::time::Duration;

use crate::error::ConfigError;

/// The longest duration accepted from input, in seconds: 10^9 s, about 31 years (far
/// beyond any run, and far inside `Duration` and 64-bit nanosecond counts).
pub const MAX_SECS: f64 = 1e9;

/// The unit a duration was given in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Seconds.
    Secs,
    /// Milliseconds.
    Millis,
}

impl Unit {
    fn symbol(self) -> &'static str {
        match self {
            Unit::Secs => "s",
            Unit::Millis => "ms",
        }
    }

    /// Units per second.
    fn per_sec(self) -> f64 {
        match self {
            Unit::Secs => 1.0,
            Unit::Millis => 1e3,
        }
    }
}

/// Why a duration was refused.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a number (NaN).
    NotANumber(Unit),
    /// Zero or negative: the value, in its unit.
    NotPositive(f64, Unit),
    /// Infinite, or longer than [`MAX_SECS`]: the value, in its unit.
    TooLarge(f64, Unit),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DurationError::NotANumber(u) => {
                write!(f, "NaN is not a number of {}", u.symbol())
            }
            DurationError::NotPositive(v, u) => {
                write!(f, "{v} {} is not positive", u.symbol())
            }
            DurationError::TooLarge(v, u) => write!(
                f,
                "{v:e} {} is too large (at most {} {}, about 31 years)",
                u.symbol(),
                MAX_SECS * u.per_sec(),
                u.symbol()
            ),
        }
    }
}

impl std::error::Error for DurationError {}

fn checked(value: f64, unit: Unit) -> Result<Duration, DurationError> {
    if value.is_nan() {
        return Err(DurationError::NotANumber(unit));
    }
    if value <= 0.0 {
        return Err(DurationError::NotPositive(value, unit));
    }
    let s = value / unit.per_sec();
    if s > MAX_SECS {
        return Err(DurationError::TooLarge(value, unit));
    }
    // Positive, finite and at most MAX_SECS: the conversion cannot fail.
    Duration::try_from_secs_f64(s).map_err(|_| DurationError::TooLarge(value, unit))
}

/// A positive, finite number of seconds up to [`MAX_SECS`], as a `Duration`.
pub fn secs(value: f64) -> Result<Duration, DurationError> {
    checked(value, Unit::Secs)
}

/// A positive, finite number of milliseconds up to [`MAX_SECS`] seconds, as a `Duration`.
pub fn millis(value: f64) -> Result<Duration, DurationError> {
    checked(value, Unit::Millis)
}

/// [`secs`], with a refusal as the [`ConfigError`] of `setting`.
pub fn secs_setting(setting: &'static str, value: f64) -> Result<Duration, ConfigError> {
    secs(value).map_err(|e| ConfigError::new(setting, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bad_value_is_refused_with_its_reason() {
        assert_eq!(secs(2.0), Ok(Duration::from_secs(2)));
        assert_eq!(millis(0.5), Ok(Duration::from_micros(500)));
        assert_eq!(secs(MAX_SECS), Ok(Duration::from_secs(1_000_000_000)));
        assert_eq!(secs(f64::NAN), Err(DurationError::NotANumber(Unit::Secs)));
        assert_eq!(secs(0.0), Err(DurationError::NotPositive(0.0, Unit::Secs)));
        assert_eq!(
            millis(-1.0),
            Err(DurationError::NotPositive(-1.0, Unit::Millis))
        );
        assert_eq!(
            secs(f64::INFINITY),
            Err(DurationError::TooLarge(f64::INFINITY, Unit::Secs))
        );
        assert!(secs(MAX_SECS * 1.0001).is_err());
        assert!(millis(MAX_SECS * 1e3 * 1.0001).is_err());
        assert_eq!(
            millis(1e300).unwrap_err().to_string(),
            "1e300 ms is too large (at most 1000000000000 ms, about 31 years)"
        );
        let e = secs_setting("duration", -3.0).unwrap_err();
        assert_eq!(e.setting, "duration");
        assert_eq!(e.reason, "-3 s is not positive");
    }
}
