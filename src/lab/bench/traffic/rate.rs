//! Rates: packets per second and Gbit/s of line rate, and the offered [`Rate`].

use std::fmt;
use std::str::FromStr;

use super::L1_OVERHEAD_BYTES;
use crate::ConfigError;

/// Packets per second that fill a line of `gbps` Gbit/s with frames of `frame_size` bytes
/// ("L1": each frame costs `frame_size + `[`L1_OVERHEAD_BYTES`] bytes on the wire):
/// `gbps * 1e9 / ((frame_size + 20) * 8)`. 64 bytes at 10 Gbit/s: 14 880 952.38 pps;
/// 1518 bytes: 812 743.8 pps. `frame_size` may be a mean size (e.g. IMIX's 361.83).
pub fn line_rate_pps(gbps: f64, frame_size: f64) -> f64 {
    gbps * 1e9 / ((frame_size + L1_OVERHEAD_BYTES as f64) * 8.0)
}

/// The "L1" line rate in Gbit/s that `pps` frames of `frame_size` bytes take, counting
/// [`L1_OVERHEAD_BYTES`] per frame (the inverse of [`line_rate_pps`]).
pub fn gbps_of(pps: f64, frame_size: f64) -> f64 {
    pps * (frame_size + L1_OVERHEAD_BYTES as f64) * 8.0 / 1e9
}

/// The "L2" throughput in Gbit/s of `pps` frames of `frame_size` bytes: frame bytes only,
/// no preamble or inter-frame gap (what a byte counter on the frames measures).
pub fn gbps_l2_of(pps: f64, frame_size: f64) -> f64 {
    pps * frame_size * 8.0 / 1e9
}

/// An offered rate.
///
/// Text form ([`FromStr`] / [`Display`](fmt::Display)), case-insensitive, a positive
/// number (underscores allowed) and a unit: `pps`, `kpps`, `mpps` (packets per second) or
/// `gbps`, `g`, `gbit/s`, `mbps`, `mbit/s` (line rate). `100%` (a share of a line rate)
/// is accepted by [`Rate::parse_with_line`], which knows the line rate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Packets per second.
    Pps(f64),
    /// Gbit/s of "L1" line rate (frames plus [`L1_OVERHEAD_BYTES`] each); the packet rate
    /// depends on the frame size (see [`line_rate_pps`]).
    Gbps(f64),
}

impl Rate {
    /// Packets per second at frames of `frame_size` bytes (a mean size for mixed sizes,
    /// e.g. [`FrameSizes::mean`](super::FrameSizes::mean)).
    pub fn pps_for(&self, frame_size: f64) -> f64 {
        match *self {
            Rate::Pps(pps) => pps,
            Rate::Gbps(gbps) => line_rate_pps(gbps, frame_size),
        }
    }

    /// "L1" Gbit/s at frames of `frame_size` bytes (see [`gbps_of`]).
    pub fn gbps_for(&self, frame_size: f64) -> f64 {
        match *self {
            Rate::Pps(pps) => gbps_of(pps, frame_size),
            Rate::Gbps(gbps) => gbps,
        }
    }

    /// Checks the rate is finite and positive; the error names `rate`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let (value, unit) = match *self {
            Rate::Pps(v) => (v, "pps"),
            Rate::Gbps(v) => (v, "gbps"),
        };
        if value.is_finite() && value > 0.0 {
            Ok(())
        } else {
            Err(ConfigError::new(
                "rate",
                format!("must be a positive finite rate, got {value}{unit}"),
            ))
        }
    }

    /// Parses like [`FromStr`], and also `P%`: `P` percent (`0 < P <= 100`) of a line of
    /// `line_gbps` Gbit/s, giving [`Rate::Gbps`]. Without a line rate a percentage is
    /// refused.
    pub fn parse_with_line(s: &str, line_gbps: Option<f64>) -> Result<Rate, ConfigError> {
        let t = s.trim();
        let Some(percent) = t.strip_suffix('%') else {
            return t.parse();
        };
        let Some(line) = line_gbps else {
            return Err(ConfigError::new(
                "rate",
                format!("`{t}` is a share of the line rate, but no line rate is given"),
            ));
        };
        if !(line.is_finite() && line > 0.0) {
            return Err(ConfigError::new(
                "rate",
                format!("the line rate must be positive Gbit/s, got {line}"),
            ));
        }
        let p = parse_number(percent.trim(), "rate")?;
        if !(p > 0.0 && p <= 100.0) {
            return Err(ConfigError::new(
                "rate",
                format!("a share of the line rate must be in (0, 100]%, got {p}%"),
            ));
        }
        Ok(Rate::Gbps(line * p / 100.0))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rate::Pps(pps) => write!(f, "{pps}pps"),
            Rate::Gbps(gbps) => write!(f, "{gbps}gbps"),
        }
    }
}

impl FromStr for Rate {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Rate, ConfigError> {
        const EXPECTED: &str =
            "expected e.g. `10mpps`, `500kpps`, `14880952pps`, `10gbps`, `25g` or `400mbps`";
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let unit = unit.trim().to_ascii_lowercase();
        if number.is_empty() {
            return Err(ConfigError::new(
                "rate",
                format!("`{t}` does not start with a number; {EXPECTED}"),
            ));
        }
        if unit == "%" {
            return Err(ConfigError::new(
                "rate",
                format!("`{t}` is a share of the line rate, but no line rate is given"),
            ));
        }
        let value = parse_number(number, "rate")?;
        let rate = match unit.as_str() {
            "pps" => Rate::Pps(value),
            "kpps" => Rate::Pps(value * 1e3),
            "mpps" => Rate::Pps(value * 1e6),
            "gbps" | "g" | "gbit/s" | "gbit" => Rate::Gbps(value),
            "mbps" | "mbit/s" | "mbit" => Rate::Gbps(value / 1e3),
            "" => {
                return Err(ConfigError::new(
                    "rate",
                    format!("`{t}` has no unit; {EXPECTED}"),
                ))
            }
            other => {
                return Err(ConfigError::new(
                    "rate",
                    format!("unknown unit `{other}` in `{t}`; {EXPECTED}"),
                ))
            }
        };
        rate.validate()?;
        Ok(rate)
    }
}

/// A non-negative decimal number with optional `_` separators.
fn parse_number(text: &str, setting: &'static str) -> Result<f64, ConfigError> {
    let cleaned: String = text.chars().filter(|&c| c != '_').collect();
    match cleaned.parse::<f64>() {
        Ok(v) if v.is_finite() => Ok(v),
        _ => Err(ConfigError::new(
            setting,
            format!("`{text}` is not a number"),
        )),
    }
}
