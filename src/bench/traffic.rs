//! Synthetic traffic for the filter benchmark.
//!
//! [`Traffic::generate`] pre-builds every frame of a [`TrafficSpec`] into one contiguous
//! arena, so replaying it allocates nothing per packet. Generation is deterministic: the
//! same spec (seed included) always gives the same bytes.
//!
//! Frames are Ethernet II from `02:00:00:00:00:02` to `02:00:00:00:00:01` of three
//! [`FrameClass`]es:
//!
//! - [`FrameClass::Ipv4`]: IPv4 (`ihl` 5) / UDP;
//! - [`FrameClass::Ipv4Options`]: IPv4 with one 4-byte option (`NOP NOP NOP EOL`, `ihl` 6)
//!   / UDP;
//! - [`FrameClass::NonIp`]: EtherType ARP (`0x0806`) with an all-zero payload.
//!
//! Each packet belongs to a flow drawn uniformly from `0..flows`; flow `i` is the UDP
//! 5-tuple of [`FlowKey::of`]`(i)` and arrives on ingress port `i % ports`. IP frames have
//! TTL 64, DF set, a valid header checksum, `total_len = frame_size - 14`, a consistent
//! UDP length, UDP checksum 0 (none) and a deterministic payload pattern.

use std::net::Ipv4Addr;

use super::rng::SplitMix64;
use crate::wire::{Ether, Ipv4, Udp, ETHERTYPE_ARP, ETHERTYPE_IPV4, IPPROTO_UDP};
use crate::ConfigError;

/// Smallest accepted `frame_size` (Ethernet minimum without FCS rounding; it holds the
/// 14 + 24 + 8 = 46 header bytes of an IPv4-with-options/UDP frame).
pub const MIN_FRAME_SIZE: usize = 64;
/// Largest accepted `frame_size` (a jumbo frame).
pub const MAX_FRAME_SIZE: usize = 9216;
/// Largest accepted flow count: flow ids map onto source addresses in `10.0.0.0/8`.
pub const MAX_FLOWS: u32 = 1 << 24;

/// Destination MAC of every frame, `02:00:00:00:00:01`.
pub const DST_MAC: u64 = 0x0200_0000_0001;
/// Source MAC of every frame, `02:00:00:00:00:02`.
pub const SRC_MAC: u64 = 0x0200_0000_0002;

/// The IPv4 option bytes of an [`FrameClass::Ipv4Options`] frame: NOP NOP NOP EOL.
const OPTION_BYTES: [u8; 4] = [0x01, 0x01, 0x01, 0x00];
const ETH_LEN: usize = 14;

/// What kind of frame a generated packet is (the filter program's three classes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum FrameClass {
    /// IPv4 without options, carrying UDP.
    Ipv4,
    /// IPv4 with a 4-byte option (`ihl` 6), carrying UDP.
    Ipv4Options,
    /// Not IP (ARP EtherType).
    NonIp,
}

impl FrameClass {
    /// Every class, in declaration order.
    pub const ALL: [FrameClass; 3] = [FrameClass::Ipv4, FrameClass::Ipv4Options, FrameClass::NonIp];

    /// Position in [`FrameClass::ALL`].
    fn index(self) -> usize {
        match self {
            FrameClass::Ipv4 => 0,
            FrameClass::Ipv4Options => 1,
            FrameClass::NonIp => 2,
        }
    }
}

/// The protocol mix, in parts per hundred; must sum to 100.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Share of [`FrameClass::Ipv4`] frames.
    pub ipv4: u32,
    /// Share of [`FrameClass::Ipv4Options`] frames.
    pub ipv4_options: u32,
    /// Share of [`FrameClass::NonIp`] frames.
    pub non_ip: u32,
}

impl Mix {
    /// The filter benchmark's mix: 90% plain IPv4, 5% IPv4 with options, 5% non-IP.
    pub const FILTER_DEFAULT: Mix = Mix {
        ipv4: 90,
        ipv4_options: 5,
        non_ip: 5,
    };

    /// The class of a draw `r` in `0..100`.
    fn pick(&self, r: u32) -> FrameClass {
        if r < self.ipv4 {
            FrameClass::Ipv4
        } else if r - self.ipv4 < self.ipv4_options {
            FrameClass::Ipv4Options
        } else {
            FrameClass::NonIp
        }
    }
}

impl Default for Mix {
    fn default() -> Self {
        Mix::FILTER_DEFAULT
    }
}

/// What traffic to generate.
#[derive(Clone, Debug)]
pub struct TrafficSpec {
    /// Number of packets (at least 1).
    pub packets: usize,
    /// Length of every frame in bytes, Ethernet header included, FCS excluded
    /// ([`MIN_FRAME_SIZE`]`..=`[`MAX_FRAME_SIZE`]).
    pub frame_size: usize,
    /// Number of distinct flows (`1..=`[`MAX_FLOWS`]).
    pub flows: u32,
    /// The protocol mix.
    pub mix: Mix,
    /// PRNG seed; the same spec always generates the same bytes.
    pub seed: u64,
    /// Number of ingress ports to spread the flows over (at least 1).
    pub ports: u16,
}

impl Default for TrafficSpec {
    /// 1 000 000 packets of 64 bytes over 1024 flows, [`Mix::FILTER_DEFAULT`], seed 1,
    /// one port.
    fn default() -> Self {
        TrafficSpec {
            packets: 1_000_000,
            frame_size: 64,
            flows: 1024,
            mix: Mix::FILTER_DEFAULT,
            seed: 1,
            ports: 1,
        }
    }
}

impl TrafficSpec {
    /// Checks every setting; the error names the field at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.packets == 0 {
            return Err(ConfigError::new("packets", "must be at least 1"));
        }
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&self.frame_size) {
            return Err(ConfigError::new(
                "frame_size",
                format!(
                    "must be in {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE} bytes, got {}",
                    self.frame_size
                ),
            ));
        }
        if !(1..=MAX_FLOWS).contains(&self.flows) {
            return Err(ConfigError::new(
                "flows",
                format!("must be in 1..={MAX_FLOWS}, got {}", self.flows),
            ));
        }
        let Mix {
            ipv4,
            ipv4_options,
            non_ip,
        } = self.mix;
        let sum = u64::from(ipv4) + u64::from(ipv4_options) + u64::from(non_ip);
        if sum != 100 {
            return Err(ConfigError::new(
                "mix",
                format!("shares must sum to 100, got {ipv4} + {ipv4_options} + {non_ip} = {sum}"),
            ));
        }
        if self.ports == 0 {
            return Err(ConfigError::new("ports", "must be at least 1"));
        }
        let fits = self
            .packets
            .checked_mul(self.frame_size)
            .is_some_and(|total| total <= u32::MAX as usize);
        if !fits {
            return Err(ConfigError::new(
                "packets",
                format!(
                    "packets * frame_size must be at most {} bytes (4 GiB), got {} * {}",
                    u32::MAX,
                    self.packets,
                    self.frame_size
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
}

/// Pre-generated frames in one contiguous arena (no per-packet allocation when replaying).
#[derive(Clone, Debug)]
pub struct Traffic {
    bytes: Vec<u8>,
    frames: Vec<(u32, u32)>,
    classes: Vec<FrameClass>,
    ports: Vec<u16>,
    flows: Vec<u32>,
    counts: [(u64, u64); 3],
}

impl Traffic {
    /// Builds the frames of `spec` (after [`TrafficSpec::validate`]).
    pub fn generate(spec: &TrafficSpec) -> Result<Traffic, ConfigError> {
        spec.validate()?;
        let n = spec.packets;
        let size = spec.frame_size;
        let mut traffic = Traffic {
            bytes: vec![0; n * size],
            frames: Vec::with_capacity(n),
            classes: Vec::with_capacity(n),
            ports: Vec::with_capacity(n),
            flows: Vec::with_capacity(n),
            counts: [(0, 0); 3],
        };
        let mut rng = SplitMix64::new(spec.seed);
        for (i, frame) in traffic.bytes.chunks_exact_mut(size).enumerate() {
            let flow = rng.below(u64::from(spec.flows)) as u32;
            let class = spec.mix.pick(rng.below(100) as u32);
            write_frame(frame, class, flow, i as u32);
            // validate() bounds packets * frame_size by u32::MAX.
            traffic.frames.push(((i * size) as u32, size as u32));
            traffic.classes.push(class);
            traffic.ports.push((flow % u32::from(spec.ports)) as u16);
            traffic.flows.push(flow);
            let count = &mut traffic.counts[class.index()];
            count.0 += 1;
            count.1 += size as u64;
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

    let udp_at = ETH_LEN + ip_hdr_len;
    let mut udp = Udp::new_unchecked(&mut frame[udp_at..]);
    udp.set_src_port(key.src_port);
    udp.set_dst_port(key.dst_port);
    udp.set_len((ip_len - ip_hdr_len) as u16);
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
                non_ip: 4
            }),
            "mix"
        );
        assert_eq!(
            bad(&|s| s.mix = Mix {
                ipv4: u32::MAX,
                ipv4_options: 101,
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
        let expect = [90_000i64, 5_000, 5_000];
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
}
