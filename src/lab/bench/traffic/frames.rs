//! Frame building: every frame of a spec, pre-built into one arena.

use super::flows::FlowSampler;
use super::{
    FlowKey, FrameClass, TrafficSpec, DST_MAC, ETH_LEN, IPV6_LEN, OPTION_BYTES, SRC_MAC, UDP_LEN,
};
use crate::rng::SplitMix64;
use crate::wire::{checksum, Ether, Ipv4, Udp, ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use crate::ConfigError;

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
    use crate::lab::bench::traffic::{Mix, MAX_FLOWS};
    use crate::wire::IPPROTO_UDP;
    use std::collections::HashSet;
    use std::net::Ipv4Addr;

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
    fn ones_complement_add_carries_around() {
        assert_eq!(ones_complement_add(0xFFFF, 0x0001), 0x0001);
        assert_eq!(ones_complement_add(0x8000, 0x8000), 0x0001);
        assert_eq!(ones_complement_add(0x1234, 0x0000), 0x1234);
    }
}
