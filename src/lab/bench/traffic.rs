//! The traffic generator: synthetic frames, their sizes, flows and protocol mix, and the
//! arithmetic and pacing of an offered rate.
//!
//! # Frames
//!
//! [`Traffic::generate`] pre-builds every frame of a [`TrafficSpec`] into one contiguous
//! arena, so replaying it allocates nothing per packet. Generation is deterministic: the
//! same spec (seed included) always gives the same bytes, and the default spec gives the
//! same bytes it always has (the filter benchmark relies on it).
//!
//! Frames are Ethernet II from `02:00:00:00:00:02` to `02:00:00:00:00:01` of four
//! [`FrameClass`]es, picked per frame by the [`Mix`] (parts per hundred):
//!
//! - [`FrameClass::Ipv4`]: IPv4 (`ihl` 5) / UDP;
//! - [`FrameClass::Ipv4Options`]: IPv4 with one 4-byte option (`NOP NOP NOP EOL`, `ihl` 6)
//!   / UDP;
//! - [`FrameClass::Ipv6`]: IPv6 (EtherType `0x86DD`, no extension headers) / UDP;
//! - [`FrameClass::NonIp`]: EtherType ARP (`0x0806`) with an all-zero payload.
//!
//! IPv4 frames have TTL 64, DF set, a valid header checksum, `total_len = frame size - 14`,
//! a consistent UDP length and UDP checksum 0 (none). IPv6 frames have hop limit 64, the
//! flow's low 20 bits as flow label, `payload_len = frame size - 54`, a consistent UDP
//! length and a valid UDP checksum (IPv6 requires one). IP payloads carry a deterministic
//! byte pattern.
//!
//! # Sizes
//!
//! [`FrameSizes`] gives the length of frame `i` (Ethernet header included, FCS not
//! written): a fixed size, a list of sizes **cycled in order** (frame `i` has size
//! `list[i % len]`), or the simple IMIX (64, 594 and 1518 bytes in proportions 7:4:1,
//! cycled through [`IMIX_PATTERN`], so every 12 consecutive frames hold exactly seven
//! 64-byte, four 594-byte and one 1518-byte frame). Sizes never consume randomness, so
//! changing them leaves the flows and classes drawn unchanged. For rate arithmetic a frame
//! of `n` bytes counts as an `n`-byte Ethernet frame (64 is the minimum frame).
//!
//! # Flows
//!
//! Each packet belongs to a flow in `0..flows` drawn by the [`FlowDist`]: uniformly, or by
//! a Zipf law of exponent `s` where flow `k - 1` has probability proportional to `1 / k^s`
//! (flow 0 is the most popular). The Zipf sampler ([`Zipf`]) is rejection-inversion
//! (Hörmann & Derflinger, 1996): O(1) memory and expected O(1) time for any number of
//! flows up to [`MAX_FLOWS`]. Flow `i` is the UDP 5-tuple of [`FlowKey::of`]`(i)` (IPv6
//! frames use [`FlowKey::src_v6`] / [`FlowKey::dst_v6`]) and arrives on ingress port
//! `i % ports`. Non-IP frames have a flow too, which only picks their port.
//!
//! # Rates and pacing
//!
//! [`Rate`] is an offered rate in packets per second or in Gbit/s of line rate;
//! [`line_rate_pps`], [`gbps_of`] and [`gbps_l2_of`] convert between them (line rate
//! counts [`L1_OVERHEAD_BYTES`] of preamble and inter-frame gap per frame). [`Pacer`]
//! schedules bursts at a rate: a pure schedule for virtual clocks, and a real-time wait.
//!
//! # Aggregation traffic
//!
//! Trio-ML and FPISA frames from N simulated workers (every worker's packets of a window
//! of blocks, integer or FP32 gradients) come from [`crate::lab::bench::trio_ml::generate`], with
//! [`crate::lab::bench::trio_ml::TrioMlBenchConfig::lanes`] choosing the kind; the end hosts of
//! [`crate::microcode::trio_ml::host`] generate the same wire format live.
//!
//! # Parsing
//!
//! [`FrameSizes`], [`FlowDist`], [`Mix`] and [`Rate`] implement [`FromStr`] (and
//! [`Display`](fmt::Display), which parses back to the same value), with errors that name
//! the setting and say what is accepted:
//!
//! | type | accepted |
//! |------|----------|
//! | [`FrameSizes`] | `64`, `64,512,1518`, `imix` |
//! | [`FlowDist`] | `uniform`, `zipf` (s = 1), `zipf:1.1` |
//! | [`Mix`] | `ipv4=90,ipv4opt=5,ipv6=0,nonip=5` (omitted classes are 0; sum 100) |
//! | [`Rate`] | `10mpps`, `500kpps`, `14880952pps`, `10gbps`, `25g`, `400mbps`; `100%` via [`Rate::parse_with_line`] |

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::rng::SplitMix64;
use crate::wire::{
    checksum, Ether, Ipv4, Udp, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, IPPROTO_UDP,
};
use crate::ConfigError;

/// Smallest accepted frame size (the Ethernet minimum frame; it holds the 14 + 24 + 8 = 46
/// header bytes of an IPv4-with-options/UDP frame and the 14 + 40 + 8 = 62 of IPv6/UDP).
pub const MIN_FRAME_SIZE: usize = 64;
/// Largest accepted frame size (a jumbo frame).
pub const MAX_FRAME_SIZE: usize = 9216;
/// Largest accepted flow count: flow ids map onto source addresses in `10.0.0.0/8`.
pub const MAX_FLOWS: u32 = 1 << 24;
/// Largest accepted Zipf exponent (larger ones put essentially every packet on flow 0).
pub const MAX_ZIPF_EXPONENT: f64 = 20.0;

/// Destination MAC of every frame, `02:00:00:00:00:01`.
pub const DST_MAC: u64 = 0x0200_0000_0001;
/// Source MAC of every frame, `02:00:00:00:00:02`.
pub const SRC_MAC: u64 = 0x0200_0000_0002;

/// The simple IMIX as generated: 64, 594 and 1518 bytes in proportions 7:4:1, interleaved
/// in a fixed 12-frame cycle (mean 4342 / 12 = 361.83 bytes).
pub const IMIX_PATTERN: [usize; 12] = [64, 594, 64, 64, 594, 64, 1518, 64, 594, 64, 64, 594];

/// Bytes each frame costs on the wire beyond its own: 8 of preamble and start-of-frame
/// delimiter and a 12-byte inter-frame gap ("L1" rates count them, "L2" rates do not).
pub const L1_OVERHEAD_BYTES: usize = 20;

/// The IPv4 option bytes of an [`FrameClass::Ipv4Options`] frame: NOP NOP NOP EOL.
const OPTION_BYTES: [u8; 4] = [0x01, 0x01, 0x01, 0x00];
const ETH_LEN: usize = 14;
const IPV6_LEN: usize = 40;
const UDP_LEN: usize = 8;

/// What kind of frame a generated packet is.
///
/// The filter program forwards [`FrameClass::Ipv4`], counts [`FrameClass::Ipv4Options`] as
/// "IP options" and counts both [`FrameClass::Ipv6`] and [`FrameClass::NonIp`] as "non-IP"
/// (its IP test is EtherType `0x0800`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FrameClass {
    /// IPv4 without options, carrying UDP.
    Ipv4,
    /// IPv4 with a 4-byte option (`ihl` 6), carrying UDP.
    Ipv4Options,
    /// IPv6 without extension headers, carrying UDP.
    Ipv6,
    /// Not IP (ARP EtherType).
    NonIp,
}

impl FrameClass {
    /// Every class, in declaration order.
    pub const ALL: [FrameClass; 4] = [
        FrameClass::Ipv4,
        FrameClass::Ipv4Options,
        FrameClass::Ipv6,
        FrameClass::NonIp,
    ];

    /// Position in [`FrameClass::ALL`].
    fn index(self) -> usize {
        match self {
            FrameClass::Ipv4 => 0,
            FrameClass::Ipv4Options => 1,
            FrameClass::Ipv6 => 2,
            FrameClass::NonIp => 3,
        }
    }

    /// The class's key in [`Mix`]'s text form.
    pub fn key(self) -> &'static str {
        match self {
            FrameClass::Ipv4 => "ipv4",
            FrameClass::Ipv4Options => "ipv4opt",
            FrameClass::Ipv6 => "ipv6",
            FrameClass::NonIp => "nonip",
        }
    }
}

/// The protocol mix, in parts per hundred; must sum to 100.
///
/// Text form ([`FromStr`] / [`Display`](fmt::Display)): comma-separated `class=share`
/// with classes `ipv4`, `ipv4opt`, `ipv6` and `nonip` (also accepted: `ipv4_options`,
/// `ipv4-options`, `non_ip`, `non-ip`, `arp`), e.g. `ipv4=90,ipv4opt=5,ipv6=0,nonip=5`.
/// Omitted classes get 0; each class at most once; the shares must sum to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Share of [`FrameClass::Ipv4`] frames.
    pub ipv4: u32,
    /// Share of [`FrameClass::Ipv4Options`] frames.
    pub ipv4_options: u32,
    /// Share of [`FrameClass::Ipv6`] frames.
    pub ipv6: u32,
    /// Share of [`FrameClass::NonIp`] frames.
    pub non_ip: u32,
}

impl Mix {
    /// The filter benchmark's mix: 90% plain IPv4, 5% IPv4 with options, no IPv6, 5%
    /// non-IP.
    pub const FILTER_DEFAULT: Mix = Mix {
        ipv4: 90,
        ipv4_options: 5,
        ipv6: 0,
        non_ip: 5,
    };

    /// The share of `class`.
    pub fn share(&self, class: FrameClass) -> u32 {
        match class {
            FrameClass::Ipv4 => self.ipv4,
            FrameClass::Ipv4Options => self.ipv4_options,
            FrameClass::Ipv6 => self.ipv6,
            FrameClass::NonIp => self.non_ip,
        }
    }

    fn share_mut(&mut self, class: FrameClass) -> &mut u32 {
        match class {
            FrameClass::Ipv4 => &mut self.ipv4,
            FrameClass::Ipv4Options => &mut self.ipv4_options,
            FrameClass::Ipv6 => &mut self.ipv6,
            FrameClass::NonIp => &mut self.non_ip,
        }
    }

    /// Checks that the shares sum to 100; the error names `mix`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let sum: u64 = FrameClass::ALL
            .iter()
            .map(|&c| u64::from(self.share(c)))
            .sum();
        if sum != 100 {
            return Err(ConfigError::new(
                "mix",
                format!(
                    "shares must sum to 100, got {} + {} + {} + {} = {sum} \
                     (ipv4 + ipv4opt + ipv6 + nonip)",
                    self.ipv4, self.ipv4_options, self.ipv6, self.non_ip
                ),
            ));
        }
        Ok(())
    }

    /// The class of a draw `r` in `0..100` (classes in [`FrameClass::ALL`] order).
    fn pick(&self, r: u32) -> FrameClass {
        let mut r = r;
        for class in FrameClass::ALL {
            let share = self.share(class);
            if r < share {
                return class;
            }
            r -= share;
        }
        FrameClass::NonIp
    }
}

impl Default for Mix {
    fn default() -> Self {
        Mix::FILTER_DEFAULT
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for class in FrameClass::ALL {
            write!(f, "{sep}{}={}", class.key(), self.share(class))?;
            sep = ",";
        }
        Ok(())
    }
}

impl FromStr for Mix {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Mix, ConfigError> {
        const EXPECTED: &str = "expected comma-separated class=share with classes ipv4, \
                                ipv4opt, ipv6, nonip, e.g. `ipv4=90,ipv4opt=5,ipv6=0,nonip=5`";
        let mut mix = Mix {
            ipv4: 0,
            ipv4_options: 0,
            ipv6: 0,
            non_ip: 0,
        };
        let mut seen = [false; 4];
        if s.trim().is_empty() {
            return Err(ConfigError::new("mix", format!("empty; {EXPECTED}")));
        }
        for item in s.split(',') {
            let item = item.trim();
            let Some((key, value)) = item.split_once('=') else {
                return Err(ConfigError::new(
                    "mix",
                    format!("`{item}` is not class=share; {EXPECTED}"),
                ));
            };
            let class = match key.trim().to_ascii_lowercase().as_str() {
                "ipv4" => FrameClass::Ipv4,
                "ipv4opt" | "ipv4_options" | "ipv4-options" => FrameClass::Ipv4Options,
                "ipv6" => FrameClass::Ipv6,
                "nonip" | "non_ip" | "non-ip" | "arp" => FrameClass::NonIp,
                other => {
                    return Err(ConfigError::new(
                        "mix",
                        format!("unknown class `{other}`; {EXPECTED}"),
                    ))
                }
            };
            if std::mem::replace(&mut seen[class.index()], true) {
                return Err(ConfigError::new(
                    "mix",
                    format!("class `{}` given twice", class.key()),
                ));
            }
            let value = value.trim();
            *mix.share_mut(class) = value.parse::<u32>().map_err(|_| {
                ConfigError::new(
                    "mix",
                    format!(
                        "share `{value}` of `{}` is not a whole number of percent",
                        class.key()
                    ),
                )
            })?;
        }
        mix.validate()?;
        Ok(mix)
    }
}

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
enum FlowSampler {
    Uniform(u64),
    Zipf(Zipf),
}

impl FlowSampler {
    fn new(flows: u32, dist: FlowDist) -> Result<FlowSampler, ConfigError> {
        Ok(match dist {
            FlowDist::Uniform => FlowSampler::Uniform(u64::from(flows)),
            FlowDist::Zipf(s) => FlowSampler::Zipf(Zipf::new(u64::from(flows), s)?),
        })
    }

    fn sample(&self, rng: &mut SplitMix64) -> u32 {
        match self {
            FlowSampler::Uniform(n) => rng.below(*n) as u32,
            FlowSampler::Zipf(z) => (z.sample(rng) - 1) as u32,
        }
    }
}

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
    /// e.g. [`FrameSizes::mean`]).
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

/// Spin (rather than yield) when the next deadline is closer than this.
const SPIN_WITHIN: Duration = Duration::from_micros(20);
/// Sleep (rather than yield) when the next deadline is farther than this.
const SLEEP_BEYOND: Duration = Duration::from_micros(500);
/// How much earlier than the deadline a sleep is asked to end (the scheduler oversleeps).
const SLEEP_MARGIN: Duration = Duration::from_micros(200);

/// Schedules bursts of `burst` frames at `pps` packets per second.
///
/// Burst `k` (from 0) is due `deadline_ns(k) = k * burst / pps` seconds after the start,
/// rounded to the nanosecond; burst 0 is due at once. The schedule is pure
/// ([`Pacer::deadline_ns`], [`Pacer::bursts_due`], [`Pacer::poll`] take the time as
/// nanoseconds since the start, so tests drive it with a virtual clock);
/// [`Pacer::wait_for_next`] follows it in real time. A sender that falls behind is not
/// skipped ahead: late bursts are due at once, so the long-run rate is kept.
///
/// Example: 1 Mpps in bursts of 32 puts a burst every 32 µs; at 1 ms, 31.25 burst
/// intervals have passed and bursts 0..=31 (32 bursts, 1024 frames) are due.
#[derive(Clone, Debug)]
pub struct Pacer {
    pps: f64,
    burst: u32,
    next: u64,
    start: Option<Instant>,
}

impl Pacer {
    /// A pacer of `pps` packets per second (positive, finite) in bursts of `burst >= 1`
    /// frames; errors name `rate` or `burst`.
    pub fn new(pps: f64, burst: u32) -> Result<Pacer, ConfigError> {
        Rate::Pps(pps).validate()?;
        if burst == 0 {
            return Err(ConfigError::new("burst", "must be at least 1 frame"));
        }
        Ok(Pacer {
            pps,
            burst,
            next: 0,
            start: None,
        })
    }

    /// A pacer of `rate` at frames of `frame_size` bytes (a mean size for mixed sizes).
    pub fn for_rate(rate: Rate, frame_size: f64, burst: u32) -> Result<Pacer, ConfigError> {
        rate.validate()?;
        Pacer::new(rate.pps_for(frame_size), burst)
    }

    /// Packets per second.
    pub fn pps(&self) -> f64 {
        self.pps
    }

    /// Frames per burst.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Nanoseconds from the start until burst `k` is due: `k * burst * 1e9 / pps`, rounded
    /// (saturating at `u64::MAX`).
    pub fn deadline_ns(&self, k: u64) -> u64 {
        (k as f64 * f64::from(self.burst) * 1e9 / self.pps).round() as u64
    }

    /// How many bursts are due `now_ns` after the start: those with
    /// `deadline_ns(k) <= now_ns`, so at least 1 (burst 0 is due at once).
    pub fn bursts_due(&self, now_ns: u64) -> u64 {
        // Estimate, then settle against deadline_ns so both always agree.
        let mut k = (now_ns as f64 * self.pps / (f64::from(self.burst) * 1e9)).floor() as u64;
        for _ in 0..4 {
            if k < u64::MAX - 1 && self.deadline_ns(k + 1) <= now_ns {
                k += 1;
            } else if k > 0 && self.deadline_ns(k) > now_ns {
                k -= 1;
            } else {
                break;
            }
        }
        k.saturating_add(1)
    }

    /// How many frames are due `now_ns` after the start (`bursts_due * burst`).
    pub fn frames_due(&self, now_ns: u64) -> u64 {
        self.bursts_due(now_ns)
            .saturating_mul(u64::from(self.burst))
    }

    /// The index of the next burst [`Pacer::poll`] or [`Pacer::wait_for_next`] releases.
    pub fn next_burst(&self) -> u64 {
        self.next
    }

    /// Releases the bursts that became due by `now_ns` (virtual time since the start) and
    /// returns how many: `bursts_due(now_ns) - next_burst()`, or 0 if none.
    pub fn poll(&mut self, now_ns: u64) -> u64 {
        let due = self.bursts_due(now_ns);
        let released = due.saturating_sub(self.next);
        self.next = self.next.max(due);
        released
    }

    /// Starts (or restarts) the real-time clock now, with burst 0 due at once.
    pub fn start(&mut self) {
        self.start = Some(Instant::now());
        self.next = 0;
    }

    /// Nanoseconds since the real-time clock started (0 before it has).
    pub fn elapsed_ns(&self) -> u64 {
        self.start.map_or(0, |s| {
            s.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
        })
    }

    /// Waits in real time until the next burst is due and returns its index. The clock
    /// starts on the first call (or at [`Pacer::start`]). Sleeps while the deadline is
    /// far, yields when it is near, and spins for the last few microseconds; returns at
    /// once when the burst is already late.
    pub fn wait_for_next(&mut self) -> u64 {
        let start = *self.start.get_or_insert_with(Instant::now);
        let k = self.next;
        self.next += 1;
        let Some(deadline) = start.checked_add(Duration::from_nanos(self.deadline_ns(k))) else {
            // Beyond what the clock can represent: nothing sensible to wait for.
            return k;
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                return k;
            }
            let left = deadline - now;
            if left > SLEEP_BEYOND {
                std::thread::sleep(left - SLEEP_MARGIN);
            } else if left > SPIN_WITHIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

/// What traffic to generate.
#[derive(Clone, Debug)]
pub struct TrafficSpec {
    /// Number of packets (at least 1).
    pub packets: usize,
    /// Length of every frame in bytes, Ethernet header included, FCS excluded
    /// ([`MIN_FRAME_SIZE`]`..=`[`MAX_FRAME_SIZE`]); used when `sizes` is `None`.
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
    /// The 5-tuple of flow `flow` (distinct for every flow below [`MAX_FLOWS`]).
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

/// Pre-generated frames in one contiguous arena (no per-packet allocation when replaying).
#[derive(Clone, Debug)]
pub struct Traffic {
    bytes: Vec<u8>,
    frames: Vec<(u32, u32)>,
    classes: Vec<FrameClass>,
    ports: Vec<u16>,
    flows: Vec<u32>,
    counts: [(u64, u64); 4],
}

impl Traffic {
    /// Builds the frames of `spec` (after [`TrafficSpec::validate`]).
    ///
    /// Per frame `i`, the seeded generator draws the flow (one draw for uniform flows,
    /// one or more for Zipf), then the class; the size is `sizes.size_of(i)`.
    pub fn generate(spec: &TrafficSpec) -> Result<Traffic, ConfigError> {
        spec.validate()?;
        let n = spec.packets;
        let sizes = spec.frame_sizes();
        // validate() bounds the total by u32::MAX.
        let total = sizes.total_bytes(n) as usize;
        let sampler = FlowSampler::new(spec.flows, spec.flow_dist)?;
        let mut traffic = Traffic {
            bytes: vec![0; total],
            frames: Vec::with_capacity(n),
            classes: Vec::with_capacity(n),
            ports: Vec::with_capacity(n),
            flows: Vec::with_capacity(n),
            counts: [(0, 0); 4],
        };
        let mut rng = SplitMix64::new(spec.seed);
        let mut off = 0usize;
        for i in 0..n {
            let size = sizes.size_of(i);
            let flow = sampler.sample(&mut rng);
            let class = spec.mix.pick(rng.below(100) as u32);
            write_frame(&mut traffic.bytes[off..off + size], class, flow, i as u32);
            traffic.frames.push((off as u32, size as u32));
            traffic.classes.push(class);
            traffic.ports.push((flow % u32::from(spec.ports)) as u16);
            traffic.flows.push(flow);
            let count = &mut traffic.counts[class.index()];
            count.0 += 1;
            count.1 += size as u64;
            off += size;
        }
        Ok(traffic)
    }

    /// Number of frames.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether there are no frames (never true for generated traffic).
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Frame `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn frame(&self, i: usize) -> &[u8] {
        let (off, len) = self.frames[i];
        &self.bytes[off as usize..off as usize + len as usize]
    }

    /// The class of frame `i`.
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn class(&self, i: usize) -> FrameClass {
        self.classes[i]
    }

    /// The ingress port of frame `i` (its flow modulo `ports`).
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn port(&self, i: usize) -> u16 {
        self.ports[i]
    }

    /// The flow of frame `i` (see [`FlowKey::of`]; non-IP frames have a flow too, which
    /// picks their port).
    ///
    /// # Panics
    /// If `i >= self.len()`.
    pub fn flow(&self, i: usize) -> u32 {
        self.flows[i]
    }

    /// The frames in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        self.frames
            .iter()
            .map(move |&(off, len)| &self.bytes[off as usize..off as usize + len as usize])
    }

    /// Number of frames of `class` and their total bytes, for checking counters exactly.
    pub fn count(&self, class: FrameClass) -> (u64, u64) {
        self.counts[class.index()]
    }

    /// Total bytes of all frames.
    pub fn total_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Mean frame size in bytes.
    pub fn mean_frame_size(&self) -> f64 {
        self.total_bytes() as f64 / self.len().max(1) as f64
    }
}

/// Writes packet `seq` (of `class` and `flow`) into the zeroed `frame`.
fn write_frame(frame: &mut [u8], class: FrameClass, flow: u32, seq: u32) {
    let mut eth = Ether::new_unchecked(&mut *frame);
    eth.set_dmac(DST_MAC);
    eth.set_smac(SRC_MAC);
    let ihl = match class {
        FrameClass::NonIp => {
            eth.set_etype(ETHERTYPE_ARP);
            return;
        }
        FrameClass::Ipv6 => {
            eth.set_etype(ETHERTYPE_IPV6);
            write_ipv6(&mut frame[ETH_LEN..], flow, seq);
            return;
        }
        FrameClass::Ipv4 => 5,
        FrameClass::Ipv4Options => 6,
    };
    eth.set_etype(ETHERTYPE_IPV4);

    let key = FlowKey::of(flow);
    let ip_len = frame.len() - ETH_LEN;
    let ip_hdr_len = usize::from(ihl) * 4;
    let mut ip = Ipv4::new_unchecked(&mut frame[ETH_LEN..]);
    ip.set_ver(4);
    ip.set_ihl(ihl);
    ip.set_total_len(ip_len as u16);
    ip.set_ident(seq as u16);
    ip.set_df(true);
    ip.set_ttl(64);
    ip.set_proto(key.proto);
    ip.set_src_addr(key.src);
    ip.set_dst_addr(key.dst);
    if class == FrameClass::Ipv4Options {
        ip.options_mut().copy_from_slice(&OPTION_BYTES);
    }
    ip.fill_checksum();

    write_udp(&mut frame[ETH_LEN + ip_hdr_len..], &key, seq);
}

/// Writes the IPv6/UDP packet `seq` of `flow` into the zeroed `packet` (everything after
/// the Ethernet header), UDP checksum included.
fn write_ipv6(packet: &mut [u8], flow: u32, seq: u32) {
    let key = FlowKey::of(flow);
    let payload_len = packet.len() - IPV6_LEN;
    let (hdr, l4) = packet.split_at_mut(IPV6_LEN);
    let ver_tc_label = (6u32 << 28) | (flow & 0xF_FFFF);
    hdr[0..4].copy_from_slice(&ver_tc_label.to_be_bytes());
    hdr[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
    hdr[6] = key.proto;
    hdr[7] = 64;
    hdr[8..24].copy_from_slice(&key.src_v6().octets());
    hdr[24..40].copy_from_slice(&key.dst_v6().octets());
    write_udp(l4, &key, seq);

    // RFC 8200 8.1: the pseudo-header is source, destination, upper-layer length (32
    // bits), three zero bytes and the next header.
    let mut pseudo = [0u8; 40];
    pseudo[..32].copy_from_slice(&hdr[8..40]);
    pseudo[32..36].copy_from_slice(&(payload_len as u32).to_be_bytes());
    pseudo[39] = key.proto;
    let sum = ones_complement_add(!checksum(&pseudo), !checksum(l4));
    let mut udp = Udp::new_unchecked(&mut *l4);
    // A computed 0 is sent as 0xFFFF (0 means "no checksum", which IPv6 forbids).
    udp.set_checksum(match !sum {
        0 => 0xFFFF,
        c => c,
    });
}

/// The ones-complement sum of two folded ones-complement sums.
fn ones_complement_add(a: u16, b: u16) -> u16 {
    let s = u32::from(a) + u32::from(b);
    ((s & 0xFFFF) + (s >> 16)) as u16
}

/// Writes the UDP header (checksum 0) and payload pattern of packet `seq` into `seg`, the
/// zeroed rest of the frame.
fn write_udp(seg: &mut [u8], key: &FlowKey, seq: u32) {
    let len = seg.len();
    debug_assert!(len >= UDP_LEN);
    let mut udp = Udp::new_unchecked(seg);
    udp.set_src_port(key.src_port);
    udp.set_dst_port(key.dst_port);
    udp.set_len(len as u16);
    for (k, b) in udp.rest_mut().iter_mut().enumerate() {
        *b = seq.wrapping_mul(31).wrapping_add(k as u32) as u8;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn spec(packets: usize) -> TrafficSpec {
        TrafficSpec {
            packets,
            ..TrafficSpec::default()
        }
    }

    fn five_tuple(frame: &[u8]) -> Option<(u32, u32, u16, u16, u8)> {
        let eth = Ether::new_checked(frame).ok()?;
        if eth.etype() != ETHERTYPE_IPV4 {
            return None;
        }
        let ip = Ipv4::new_checked_full(eth.payload()).ok()?;
        let udp = Udp::new_checked(&eth.payload()[ip.header_len()..]).ok()?;
        Some((
            ip.src(),
            ip.dst(),
            udp.src_port(),
            udp.dst_port(),
            ip.proto(),
        ))
    }

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

    #[test]
    fn validate_names_the_setting() {
        let bad = |f: &dyn Fn(&mut TrafficSpec)| {
            let mut s = spec(10);
            f(&mut s);
            Traffic::generate(&s).unwrap_err().setting
        };
        assert_eq!(bad(&|s| s.packets = 0), "packets");
        assert_eq!(bad(&|s| s.frame_size = 63), "frame_size");
        assert_eq!(bad(&|s| s.frame_size = 9217), "frame_size");
        assert_eq!(bad(&|s| s.flows = 0), "flows");
        assert_eq!(bad(&|s| s.flows = MAX_FLOWS + 1), "flows");
        assert_eq!(
            bad(&|s| s.mix = Mix {
                ipv4: 90,
                ipv4_options: 5,
                ipv6: 0,
                non_ip: 4
            }),
            "mix"
        );
        assert_eq!(
            bad(&|s| s.mix = Mix {
                ipv4: u32::MAX,
                ipv4_options: 101,
                ipv6: 0,
                non_ip: 0
            }),
            "mix"
        );
        assert_eq!(bad(&|s| s.ports = 0), "ports");
        assert_eq!(bad(&|s| s.packets = 1 << 30), "packets");
        let mut s = spec(1);
        s.frame_size = 9216;
        s.validate().unwrap();
    }

    #[test]
    fn deterministic() {
        let s = TrafficSpec {
            packets: 5000,
            seed: 42,
            ports: 4,
            ..TrafficSpec::default()
        };
        let a = Traffic::generate(&s).unwrap();
        let b = Traffic::generate(&s).unwrap();
        assert_eq!(a.bytes, b.bytes);
        assert_eq!(a.classes, b.classes);
        assert_eq!(a.ports, b.ports);
        let c = Traffic::generate(&TrafficSpec { seed: 43, ..s }).unwrap();
        assert_ne!(a.bytes, c.bytes);
    }

    #[test]
    fn class_counts_follow_the_mix() {
        let n = 100_000;
        let t = Traffic::generate(&spec(n)).unwrap();
        assert_eq!(t.len(), n);
        let expect = [90_000i64, 5_000, 0, 5_000];
        let mut total = 0;
        for (class, want) in FrameClass::ALL.into_iter().zip(expect) {
            let (packets, bytes) = t.count(class);
            // Binomial sd is at most ~95 packets here; allow 1% of all packets.
            assert!(
                (packets as i64 - want).abs() < 1_000,
                "{class:?}: {packets} vs {want}"
            );
            assert_eq!(bytes, packets * 64);
            let seen = (0..t.len()).filter(|&i| t.class(i) == class).count() as u64;
            assert_eq!(seen, packets);
            total += packets;
        }
        assert_eq!(total, n as u64);
        assert_eq!(t.total_bytes(), 64 * n as u64);
    }

    #[test]
    fn other_mixes() {
        let all_ip = TrafficSpec {
            packets: 1000,
            mix: Mix {
                ipv4: 100,
                ipv4_options: 0,
                ipv6: 0,
                non_ip: 0,
            },
            ..TrafficSpec::default()
        };
        let t = Traffic::generate(&all_ip).unwrap();
        assert_eq!(t.count(FrameClass::Ipv4).0, 1000);
        let all_arp = TrafficSpec {
            mix: Mix {
                ipv4: 0,
                ipv4_options: 0,
                ipv6: 0,
                non_ip: 100,
            },
            ..all_ip
        };
        let t = Traffic::generate(&all_arp).unwrap();
        assert_eq!(t.count(FrameClass::NonIp).0, 1000);
    }

    #[test]
    fn frames_are_well_formed() {
        for frame_size in [64, 65, 1500, 9216] {
            let s = TrafficSpec {
                packets: 2000,
                frame_size,
                ..TrafficSpec::default()
            };
            let t = Traffic::generate(&s).unwrap();
            assert_eq!(t.iter().count(), t.len());
            for (i, frame) in t.iter().enumerate() {
                assert_eq!(frame.len(), frame_size);
                assert_eq!(frame, t.frame(i));
                let eth = Ether::new_checked(frame).unwrap();
                assert_eq!(eth.dmac(), DST_MAC);
                assert_eq!(eth.smac(), SRC_MAC);
                match t.class(i) {
                    FrameClass::NonIp => {
                        assert_eq!(eth.etype(), ETHERTYPE_ARP);
                        assert!(eth.payload().iter().all(|&b| b == 0));
                    }
                    FrameClass::Ipv6 => unreachable!("the default mix has no IPv6"),
                    class => {
                        assert_eq!(eth.etype(), ETHERTYPE_IPV4);
                        let ip = Ipv4::new_checked_full(eth.payload()).unwrap();
                        assert!(ip.verify_checksum(), "frame {i}");
                        assert_eq!(usize::from(ip.total_len()), frame_size - 14);
                        assert_eq!(ip.ttl(), 64);
                        assert_eq!(ip.proto(), IPPROTO_UDP);
                        let with_options = class == FrameClass::Ipv4Options;
                        assert_eq!(ip.ihl(), if with_options { 6 } else { 5 });
                        if with_options {
                            assert_eq!(ip.options(), &OPTION_BYTES);
                        }
                        let udp = Udp::new_checked(&eth.payload()[ip.header_len()..]).unwrap();
                        assert_eq!(usize::from(udp.len()), frame_size - 14 - ip.header_len());
                        let key = FlowKey::of(t.flow(i));
                        assert_eq!(ip.src_addr(), key.src);
                        assert_eq!(udp.src_port(), key.src_port);
                    }
                }
            }
        }
    }

    #[test]
    fn flows_give_distinct_five_tuples() {
        let t = Traffic::generate(&spec(100_000)).unwrap();
        let tuples: HashSet<_> = t.iter().filter_map(five_tuple).collect();
        // 100k draws over 1024 flows (~88 IPv4 frames per flow) miss none.
        assert_eq!(tuples.len(), 1024);
        let flows: HashSet<_> = (0..t.len()).map(|i| t.flow(i)).collect();
        assert_eq!(flows.len(), 1024);

        let one = Traffic::generate(&TrafficSpec {
            flows: 1,
            packets: 500,
            ..spec(0)
        })
        .unwrap();
        assert_eq!(
            one.iter()
                .filter_map(five_tuple)
                .collect::<HashSet<_>>()
                .len(),
            1
        );

        // The flow -> 5-tuple map is injective across the 50000-port and /16 wraps.
        let keys: HashSet<_> = (0..200_000).map(FlowKey::of).collect();
        assert_eq!(keys.len(), 200_000);
        assert_eq!(
            FlowKey::of(MAX_FLOWS - 1).src,
            Ipv4Addr::new(10, 255, 255, 255)
        );
        assert_eq!(FlowKey::of(258).src, Ipv4Addr::new(10, 0, 1, 2));
    }

    #[test]
    fn ports_follow_flows() {
        let s = TrafficSpec {
            packets: 10_000,
            ports: 3,
            ..TrafficSpec::default()
        };
        let t = Traffic::generate(&s).unwrap();
        let mut seen = [false; 3];
        for i in 0..t.len() {
            assert_eq!(u32::from(t.port(i)), t.flow(i) % 3);
            seen[usize::from(t.port(i))] = true;
        }
        assert_eq!(seen, [true; 3]);
    }

    #[test]
    fn mix_pick_covers_each_class_by_its_share() {
        let mix = Mix {
            ipv4: 10,
            ipv4_options: 20,
            ipv6: 30,
            non_ip: 40,
        };
        let mut counts = [0u32; 4];
        for r in 0..100 {
            counts[mix.pick(r).index()] += 1;
        }
        assert_eq!(counts, [10, 20, 30, 40]);
        assert_eq!(mix.pick(9), FrameClass::Ipv4);
        assert_eq!(mix.pick(10), FrameClass::Ipv4Options);
        assert_eq!(mix.pick(30), FrameClass::Ipv6);
        assert_eq!(mix.pick(60), FrameClass::NonIp);
        // The filter default has no IPv6: draws 95..100 stay non-IP.
        assert!((95..100).all(|r| Mix::FILTER_DEFAULT.pick(r) == FrameClass::NonIp));
    }

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

    #[test]
    fn ones_complement_add_carries_around() {
        assert_eq!(ones_complement_add(0xFFFF, 0x0001), 0x0001);
        assert_eq!(ones_complement_add(0x8000, 0x8000), 0x0001);
        assert_eq!(ones_complement_add(0x1234, 0x0000), 0x1234);
    }
}
