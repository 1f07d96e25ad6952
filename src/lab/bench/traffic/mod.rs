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
//! [`FrameSizes`], [`FlowDist`], [`Mix`] and [`Rate`] implement [`FromStr`](std::str::FromStr) (and
//! [`Display`](std::fmt::Display), which parses back to the same value), with errors that name
//! the setting and say what is accepted:
//!
//! | type | accepted |
//! |------|----------|
//! | [`FrameSizes`] | `64`, `64,512,1518`, `imix` |
//! | [`FlowDist`] | `uniform`, `zipf` (s = 1), `zipf:1.1` |
//! | [`Mix`] | `ipv4=90,ipv4opt=5,ipv6=0,nonip=5` (omitted classes are 0; sum 100) |
//! | [`Rate`] | `10mpps`, `500kpps`, `14880952pps`, `10gbps`, `25g`, `400mbps`; `100%` via [`Rate::parse_with_line`] |

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

mod flows;
mod frames;
mod mix;
mod pacing;
mod rate;
mod sizes;
mod spec;

pub use flows::{FlowDist, FlowKey, Zipf};
pub use frames::Traffic;
pub use mix::{FrameClass, Mix};
pub use pacing::Pacer;
pub use rate::{gbps_l2_of, gbps_of, line_rate_pps, Rate};
pub use sizes::FrameSizes;
pub use spec::TrafficSpec;
