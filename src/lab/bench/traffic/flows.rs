//! Flows: how packets pick their flow (uniform or Zipf) and the 5-tuple of each flow.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use super::MAX_ZIPF_EXPONENT;
use crate::rng::SplitMix64;
use crate::wire::IPPROTO_UDP;
use crate::ConfigError;

/// How packets are spread over the flows.
///
/// Text form ([`FromStr`] / [`Display`](fmt::Display)): `uniform`, `zipf` (exponent 1) or
/// `zipf:S` with `0 < S <= `[`MAX_ZIPF_EXPONENT`] (case-insensitive).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum FlowDist {
    /// Every flow equally likely.
    #[default]
    Uniform,
    /// Flow `k - 1` with probability proportional to `1 / k^s` (flow 0 the most popular).
    Zipf(f64),
}

impl FlowDist {
    /// Checks a Zipf exponent is finite and in `(0, MAX_ZIPF_EXPONENT]`; the error names
    /// `flow_dist`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match *self {
            FlowDist::Uniform => Ok(()),
            FlowDist::Zipf(s) => check_zipf_exponent(s),
        }
    }
}

fn check_zipf_exponent(s: f64) -> Result<(), ConfigError> {
    if s.is_finite() && s > 0.0 && s <= MAX_ZIPF_EXPONENT {
        Ok(())
    } else {
        Err(ConfigError::new(
            "flow_dist",
            format!(
                "the Zipf exponent must be in (0, {MAX_ZIPF_EXPONENT}], got {s} \
                 (use `uniform` for exponent 0)"
            ),
        ))
    }
}

impl fmt::Display for FlowDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowDist::Uniform => f.write_str("uniform"),
            FlowDist::Zipf(s) => write!(f, "zipf:{s}"),
        }
    }
}

impl FromStr for FlowDist {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<FlowDist, ConfigError> {
        let lower = s.trim().to_ascii_lowercase();
        let dist = match lower.split_once(':') {
            None if lower == "uniform" => FlowDist::Uniform,
            None if lower == "zipf" => FlowDist::Zipf(1.0),
            Some(("zipf", exponent)) => {
                let exponent = exponent.trim();
                let s = exponent.parse::<f64>().map_err(|_| {
                    ConfigError::new(
                        "flow_dist",
                        format!("Zipf exponent `{exponent}` is not a number, e.g. `zipf:1.1`"),
                    )
                })?;
                FlowDist::Zipf(s)
            }
            _ => {
                return Err(ConfigError::new(
                    "flow_dist",
                    format!(
                        "`{}` is not a flow distribution; expected `uniform`, `zipf` or \
                         `zipf:S` (e.g. `zipf:1.1`)",
                        s.trim()
                    ),
                ))
            }
        };
        dist.validate()?;
        Ok(dist)
    }
}

/// A Zipf sampler over ranks `1..=n` with exponent `s`: `P(k) = k^-s / H(n, s)`.
///
/// Rejection-inversion (W. Hörmann and G. Derflinger, "Rejection-inversion to generate
/// variates from monotone discrete distributions", ACM TOMACS 6(3), 1996), as in Apache
/// Commons RNG: O(1) memory, expected O(1) uniform draws per sample, for any `n`.
#[derive(Clone, Debug)]
pub struct Zipf {
    n: u64,
    s: f64,
    h_integral_x1: f64,
    h_integral_n: f64,
    threshold: f64,
}

impl Zipf {
    /// The sampler of `n >= 1` ranks with exponent `s` in `(0, `[`MAX_ZIPF_EXPONENT`]`]`.
    pub fn new(n: u64, s: f64) -> Result<Zipf, ConfigError> {
        if n == 0 {
            return Err(ConfigError::new("flows", "must be at least 1"));
        }
        check_zipf_exponent(s)?;
        let mut z = Zipf {
            n,
            s,
            h_integral_x1: 0.0,
            h_integral_n: 0.0,
            threshold: 0.0,
        };
        z.h_integral_x1 = z.h_integral(1.5) - 1.0;
        z.h_integral_n = z.h_integral(n as f64 + 0.5);
        z.threshold = 2.0 - z.h_integral_inverse(z.h_integral(2.5) - z.h(2.0));
        Ok(z)
    }

    /// Number of ranks.
    pub fn n(&self) -> u64 {
        self.n
    }

    /// The exponent.
    pub fn exponent(&self) -> f64 {
        self.s
    }

    /// A rank in `1..=n` (1 the most likely).
    pub fn sample(&self, rng: &mut SplitMix64) -> u64 {
        loop {
            let u = self.h_integral_n + rng.uniform() * (self.h_integral_x1 - self.h_integral_n);
            let x = self.h_integral_inverse(u);
            // x >= 0.5 here; the float-to-int cast saturates.
            let k = ((x + 0.5) as u64).clamp(1, self.n);
            let kf = k as f64;
            if kf - x <= self.threshold || u >= self.h_integral(kf + 0.5) - self.h(kf) {
                return k;
            }
        }
    }

    /// `x^-s`.
    fn h(&self, x: f64) -> f64 {
        (-self.s * x.ln()).exp()
    }

    /// An antiderivative of `h`: `(x^(1-s) - 1) / (1 - s)`, or `ln x` for `s = 1`.
    fn h_integral(&self, x: f64) -> f64 {
        let log_x = x.ln();
        expm1_over_x((1.0 - self.s) * log_x) * log_x
    }

    /// The inverse of [`Zipf::h_integral`].
    fn h_integral_inverse(&self, x: f64) -> f64 {
        let t = (x * (1.0 - self.s)).max(-1.0);
        (log1p_over_x(t) * x).exp()
    }
}

/// `ln(1 + x) / x`, continuous at 0.
fn log1p_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.ln_1p() / x
    } else {
        1.0 - x * (0.5 - x * (1.0 / 3.0 - 0.25 * x))
    }
}

/// `(e^x - 1) / x`, continuous at 0.
fn expm1_over_x(x: f64) -> f64 {
    if x.abs() > 1e-8 {
        x.exp_m1() / x
    } else {
        1.0 + x * 0.5 * (1.0 + x * (1.0 / 3.0) * (1.0 + 0.25 * x))
    }
}

/// Draws flows for [`Traffic::generate`].
pub(super) enum FlowSampler {
    Uniform(u64),
    Zipf(Zipf),
}

impl FlowSampler {
    pub(super) fn new(flows: u32, dist: FlowDist) -> Result<FlowSampler, ConfigError> {
        Ok(match dist {
            FlowDist::Uniform => FlowSampler::Uniform(u64::from(flows)),
            FlowDist::Zipf(s) => FlowSampler::Zipf(Zipf::new(u64::from(flows), s)?),
        })
    }

    pub(super) fn sample(&self, rng: &mut SplitMix64) -> u32 {
        match self {
            FlowSampler::Uniform(n) => rng.below(*n) as u32,
            FlowSampler::Zipf(z) => (z.sample(rng) - 1) as u32,
        }
    }
}

/// The UDP 5-tuple of a generated flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Source address: `10.(i >> 16).(i >> 8).i` (the low 24 bits of flow `i`).
    pub src: Ipv4Addr,
    /// Destination address: always `192.168.0.1`.
    pub dst: Ipv4Addr,
    /// Source port: `1024 + i % 50000`.
    pub src_port: u16,
    /// Destination port: always 5000.
    pub dst_port: u16,
    /// IP protocol: always UDP.
    pub proto: u8,
}

impl FlowKey {
    /// The 5-tuple of flow `flow` (distinct for every flow below [`MAX_FLOWS`](super::MAX_FLOWS)).
    pub fn of(flow: u32) -> FlowKey {
        let [_, a, b, c] = flow.to_be_bytes();
        FlowKey {
            src: Ipv4Addr::new(10, a, b, c),
            dst: Ipv4Addr::new(192, 168, 0, 1),
            src_port: 1024 + (flow % 50_000) as u16,
            dst_port: 5000,
            proto: IPPROTO_UDP,
        }
    }

    /// The IPv6 source address of the flow: `fd00::` with the IPv4 source in the low 32
    /// bits (flow 258: `fd00::a00:102`).
    pub fn src_v6(&self) -> Ipv6Addr {
        ula_of(self.src)
    }

    /// The IPv6 destination address: `fd00::c0a8:1` (the IPv4 destination in the low 32
    /// bits).
    pub fn dst_v6(&self) -> Ipv6Addr {
        ula_of(self.dst)
    }
}

/// `fd00::` with `v4` in the low 32 bits.
fn ula_of(v4: Ipv4Addr) -> Ipv6Addr {
    Ipv6Addr::from((0xfd00u128 << 112) | u128::from(u32::from(v4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_helpers_are_smooth_and_inverse() {
        for x in [-1e-7, -1e-9, 0.0, 1e-9, 1e-7] {
            assert!((log1p_over_x(x) - 1.0).abs() < 1e-6, "{x}");
            assert!((expm1_over_x(x) - 1.0).abs() < 1e-6, "{x}");
        }
        for s in [0.3, 1.0 - 1e-12, 1.0, 1.0 + 1e-12, 1.5, 5.0] {
            let z = Zipf::new(1 << 24, s).unwrap();
            for x in [1.5, 2.0, 2.5, 10.0, 1e4, 1.6e7] {
                // Inverse up to the conditioning of h_integral, which flattens out for
                // large s and x (where the sampler puts almost no mass: for s = 5 and
                // x = 1.6e7 it is 0.25 to the last bit).
                if s > 1.5 && x > 1e3 {
                    continue;
                }
                let back = z.h_integral_inverse(z.h_integral(x));
                assert!((back / x - 1.0).abs() < 1e-6, "s {s} x {x}: {back}");
            }
            // s = 1 is ln x.
            if s == 1.0 {
                assert!((z.h_integral(10.0) - 10f64.ln()).abs() < 1e-12);
            }
        }
    }
}
