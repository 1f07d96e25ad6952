//! Frame sizes: fixed, a list cycled in order, or the simple IMIX.

use std::fmt;
use std::str::FromStr;

use super::{IMIX_PATTERN, MAX_FRAME_SIZE, MIN_FRAME_SIZE};
use crate::ConfigError;

/// The length of each generated frame, Ethernet header included, FCS not written.
///
/// Text form ([`FromStr`] / [`Display`](fmt::Display)): `64` (fixed), `64,512,1518` (a
/// list, cycled in order), `imix` (case-insensitive). Every size must be in
/// [`MIN_FRAME_SIZE`]`..=`[`MAX_FRAME_SIZE`]. A one-element [`FrameSizes::List`] prints as
/// a fixed size and so parses back as the equivalent [`FrameSizes::Fixed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameSizes {
    /// Every frame has this size.
    Fixed(usize),
    /// Frame `i` has size `list[i % list.len()]` (deterministic, no randomness).
    List(Vec<usize>),
    /// The simple IMIX: 64, 594 and 1518 bytes in proportions 7:4:1, cycled through
    /// [`IMIX_PATTERN`] (exactly 7:4:1 in every 12 consecutive frames).
    Imix,
}

impl FrameSizes {
    /// The sizes of one cycle: frame `i` has size `pattern()[i % pattern().len()]`.
    pub fn pattern(&self) -> &[usize] {
        match self {
            FrameSizes::Fixed(size) => std::slice::from_ref(size),
            FrameSizes::List(list) => list,
            FrameSizes::Imix => &IMIX_PATTERN,
        }
    }

    /// The size of frame `i`.
    ///
    /// # Panics
    /// If the list is empty (refused by [`FrameSizes::validate`]).
    pub fn size_of(&self, i: usize) -> usize {
        let pattern = self.pattern();
        pattern[i % pattern.len()]
    }

    /// The mean frame size in bytes (of one cycle, hence of any whole number of cycles);
    /// 0 for an empty list. IMIX: 361.83.
    pub fn mean(&self) -> f64 {
        let pattern = self.pattern();
        if pattern.is_empty() {
            return 0.0;
        }
        pattern.iter().map(|&s| s as f64).sum::<f64>() / pattern.len() as f64
    }

    /// The smallest size (0 for an empty list).
    pub fn min(&self) -> usize {
        self.pattern().iter().copied().min().unwrap_or(0)
    }

    /// The largest size (0 for an empty list).
    pub fn max(&self) -> usize {
        self.pattern().iter().copied().max().unwrap_or(0)
    }

    /// Total bytes of the first `packets` frames.
    pub fn total_bytes(&self, packets: usize) -> u128 {
        let pattern = self.pattern();
        if pattern.is_empty() {
            return 0;
        }
        let cycle: u128 = pattern.iter().map(|&s| s as u128).sum();
        let full = (packets / pattern.len()) as u128;
        let rest: u128 = pattern[..packets % pattern.len()]
            .iter()
            .map(|&s| s as u128)
            .sum();
        full * cycle + rest
    }

    /// Checks every size is in [`MIN_FRAME_SIZE`]`..=`[`MAX_FRAME_SIZE`] and a list is not
    /// empty; the error names `setting` (the field or option holding the sizes).
    pub fn validate_as(&self, setting: &'static str) -> Result<(), ConfigError> {
        let pattern = self.pattern();
        if pattern.is_empty() {
            return Err(ConfigError::new(setting, "the list of sizes is empty"));
        }
        if let Some(bad) = pattern
            .iter()
            .find(|s| !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(*s))
        {
            return Err(ConfigError::new(
                setting,
                format!(
                    "frame sizes must be in {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE} bytes, got {bad}"
                ),
            ));
        }
        Ok(())
    }

    /// [`FrameSizes::validate_as`] naming `sizes`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_as("sizes")
    }
}

impl Default for FrameSizes {
    /// 64-byte frames.
    fn default() -> Self {
        FrameSizes::Fixed(64)
    }
}

impl fmt::Display for FrameSizes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameSizes::Fixed(size) => write!(f, "{size}"),
            FrameSizes::List(list) => {
                let mut sep = "";
                for size in list {
                    write!(f, "{sep}{size}")?;
                    sep = ",";
                }
                Ok(())
            }
            FrameSizes::Imix => f.write_str("imix"),
        }
    }
}

impl FromStr for FrameSizes {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<FrameSizes, ConfigError> {
        let s = s.trim();
        if s.eq_ignore_ascii_case("imix") {
            return Ok(FrameSizes::Imix);
        }
        let parse = |item: &str| -> Result<usize, ConfigError> {
            let item = item.trim();
            item.parse::<usize>().map_err(|_| {
                ConfigError::new(
                    "sizes",
                    format!(
                        "`{item}` is not a frame size in bytes; expected e.g. `64`, \
                         `64,512,1518` or `imix`"
                    ),
                )
            })
        };
        let sizes = if s.contains(',') {
            FrameSizes::List(s.split(',').map(parse).collect::<Result<_, _>>()?)
        } else {
            FrameSizes::Fixed(parse(s)?)
        };
        sizes.validate()?;
        Ok(sizes)
    }
}
