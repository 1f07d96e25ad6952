//! What traffic to generate, and its validation.

use super::{FlowDist, FrameSizes, Mix, MAX_FLOWS};
use crate::ConfigError;

/// What traffic to generate.
#[derive(Clone, Debug)]
pub struct TrafficSpec {
    /// Number of packets (at least 1).
    pub packets: usize,
    /// Length of every frame in bytes, Ethernet header included, FCS excluded
    /// ([`MIN_FRAME_SIZE`](super::MIN_FRAME_SIZE)`..=`[`MAX_FRAME_SIZE`](super::MAX_FRAME_SIZE)); used when `sizes` is `None`.
    pub frame_size: usize,
    /// Frame sizes; `None` means [`FrameSizes::Fixed`]`(frame_size)`. When set, it takes
    /// precedence and `frame_size` is ignored.
    pub sizes: Option<FrameSizes>,
    /// Number of distinct flows (`1..=`[`MAX_FLOWS`]).
    pub flows: u32,
    /// How packets are spread over the flows.
    pub flow_dist: FlowDist,
    /// The protocol mix.
    pub mix: Mix,
    /// PRNG seed; the same spec always generates the same bytes.
    pub seed: u64,
    /// Number of ingress ports to spread the flows over (at least 1).
    pub ports: u16,
}

impl Default for TrafficSpec {
    /// 1 000 000 packets of 64 bytes over 1024 uniform flows, [`Mix::FILTER_DEFAULT`],
    /// seed 1, one port.
    fn default() -> Self {
        TrafficSpec {
            packets: 1_000_000,
            frame_size: 64,
            sizes: None,
            flows: 1024,
            flow_dist: FlowDist::Uniform,
            mix: Mix::FILTER_DEFAULT,
            seed: 1,
            ports: 1,
        }
    }
}

impl TrafficSpec {
    /// The frame sizes in effect: `sizes`, or [`FrameSizes::Fixed`]`(frame_size)`.
    pub fn frame_sizes(&self) -> FrameSizes {
        self.sizes
            .clone()
            .unwrap_or(FrameSizes::Fixed(self.frame_size))
    }

    /// The mean frame size in bytes (exact over any whole number of size cycles).
    pub fn mean_frame_size(&self) -> f64 {
        self.frame_sizes().mean()
    }

    /// Checks every setting; the error names the field at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.packets == 0 {
            return Err(ConfigError::new("packets", "must be at least 1"));
        }
        let sizes = self.frame_sizes();
        match self.sizes {
            Some(_) => sizes.validate_as("sizes")?,
            None => sizes.validate_as("frame_size")?,
        }
        if !(1..=MAX_FLOWS).contains(&self.flows) {
            return Err(ConfigError::new(
                "flows",
                format!("must be in 1..={MAX_FLOWS}, got {}", self.flows),
            ));
        }
        self.flow_dist.validate()?;
        self.mix.validate()?;
        if self.ports == 0 {
            return Err(ConfigError::new("ports", "must be at least 1"));
        }
        let total = sizes.total_bytes(self.packets);
        if total > u128::from(u32::MAX) {
            return Err(ConfigError::new(
                "packets",
                format!(
                    "the frames must total at most {} bytes (4 GiB), got {total} \
                     ({} packets of mean size {:.2})",
                    u32::MAX,
                    self.packets,
                    sizes.mean()
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_spec_is_valid() {
        let s = TrafficSpec::default();
        assert_eq!(s.packets, 1_000_000);
        assert_eq!(s.frame_size, 64);
        assert_eq!(s.flows, 1024);
        assert_eq!(s.mix, Mix::FILTER_DEFAULT);
        assert_eq!(s.seed, 1);
        assert_eq!(s.ports, 1);
        s.validate().unwrap();
    }
}
