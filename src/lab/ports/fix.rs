//! What a port does to a received frame so the engine sees it as a wire would carry it.
//!
//! A Linux interface may hand a packet socket a frame that is not finished yet, because
//! the sending host left work to "hardware" that a virtual link never does:
//!
//! - **Checksum offload** (`TP_STATUS_CSUMNOTREADY`): a TCP or UDP checksum field holds
//!   only the pseudo-header's sum; the NIC would have summed the segment.
//!   [`complete_checksum`] does it, for TCP and UDP over IPv4 and over IPv6 without
//!   extension headers (others are left as they are and counted).
//! - **VLAN offload** (`TP_STATUS_VLAN_VALID`): the kernel took the 802.1Q tag out of the
//!   frame. [`insert_vlan_tag`] puts it back.
//!
//! Both are pure functions over byte slices.

use super::ring::VlanTag;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86DD;
const ETHERTYPE_VLAN: [u16; 2] = [0x8100, 0x88A8];
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// Why [`complete_checksum`] left a frame as it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChecksumSkip {
    /// Not IPv4 or IPv6 (after at most two VLAN tags).
    NotIp,
    /// Not TCP or UDP (or IPv6 with extension headers, which are not walked).
    NotTcpUdp,
    /// The IP header or the segment is cut short of the lengths it claims.
    Truncated,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// The one's-complement sum of `data` (big-endian 16-bit words, an odd last byte padded
/// with zero), folded to 16 bits.
pub fn ones_sum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut chunks = data.chunks_exact(2);
    for c in chunks.by_ref() {
        sum += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

/// Finishes the TCP or UDP checksum of a frame whose sender left it to offload: the field
/// holds the pseudo-header's sum, so the checksum is the complement of the sum over the
/// segment, that field included (a UDP result of 0 is sent as `0xFFFF`). Returns the
/// protocol fixed (6 or 17).
pub fn complete_checksum(frame: &mut [u8]) -> Result<u8, ChecksumSkip> {
    let mut at = 12;
    let mut ethertype = be16(frame, at).ok_or(ChecksumSkip::Truncated)?;
    for _ in 0..2 {
        if ETHERTYPE_VLAN.contains(&ethertype) {
            at += 4;
            ethertype = be16(frame, at).ok_or(ChecksumSkip::Truncated)?;
        }
    }
    let ip = at + 2;
    let (proto, l4, l4_len) = match ethertype {
        ETHERTYPE_IPV4 => {
            let vihl = *frame.get(ip).ok_or(ChecksumSkip::Truncated)?;
            let ihl = usize::from(vihl & 0x0F) * 4;
            let total = usize::from(be16(frame, ip + 2).ok_or(ChecksumSkip::Truncated)?);
            let proto = *frame.get(ip + 9).ok_or(ChecksumSkip::Truncated)?;
            if vihl >> 4 != 4 || ihl < 20 || total < ihl {
                return Err(ChecksumSkip::NotIp);
            }
            (proto, ip + ihl, total - ihl)
        }
        ETHERTYPE_IPV6 => {
            let payload = usize::from(be16(frame, ip + 4).ok_or(ChecksumSkip::Truncated)?);
            let next = *frame.get(ip + 6).ok_or(ChecksumSkip::Truncated)?;
            (next, ip + 40, payload)
        }
        _ => return Err(ChecksumSkip::NotIp),
    };
    let field = match proto {
        PROTO_TCP => 16,
        PROTO_UDP => 6,
        _ => return Err(ChecksumSkip::NotTcpUdp),
    };
    let end = l4.checked_add(l4_len).ok_or(ChecksumSkip::Truncated)?;
    if end > frame.len() || l4_len < field + 2 {
        return Err(ChecksumSkip::Truncated);
    }
    let mut c = !ones_sum(&frame[l4..end]);
    if proto == PROTO_UDP && c == 0 {
        c = 0xFFFF;
    }
    frame[l4 + field..l4 + field + 2].copy_from_slice(&c.to_be_bytes());
    Ok(proto)
}

/// Appends to `out` the frame with `tag` put back after its MAC addresses.
pub fn insert_vlan_tag(frame: &[u8], tag: VlanTag, out: &mut Vec<u8>) {
    let split = frame.len().min(12);
    out.extend_from_slice(&frame[..split]);
    out.extend_from_slice(&tag.tpid.to_be_bytes());
    out.extend_from_slice(&tag.tci.to_be_bytes());
    out.extend_from_slice(&frame[split..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An Ethernet + IPv4 + `proto` frame with `payload` after an 8 (UDP) or 20 (TCP) byte
    /// L4 header, its checksum field holding the pseudo-header's sum as an offloading
    /// sender leaves it. Returns the frame and the correct checksum.
    fn offloaded_v4(proto: u8, payload: &[u8]) -> (Vec<u8>, u16) {
        let l4h = if proto == PROTO_TCP { 20 } else { 8 };
        let l4_len = l4h + payload.len();
        let mut f = vec![0u8; 14 + 20 + l4_len];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        f[14] = 0x45;
        f[16..18].copy_from_slice(&((20 + l4_len) as u16).to_be_bytes());
        f[22] = 64;
        f[23] = proto;
        f[26..30].copy_from_slice(&[10, 0, 1, 1]);
        f[30..34].copy_from_slice(&[10, 0, 2, 1]);
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        if proto == PROTO_UDP {
            f[38..40].copy_from_slice(&(l4_len as u16).to_be_bytes());
        } else {
            f[34 + 12] = 0x50;
        }
        f[34 + l4h..].copy_from_slice(payload);
        let mut pseudo = Vec::new();
        pseudo.extend_from_slice(&f[26..34]);
        pseudo.extend_from_slice(&[0, proto]);
        pseudo.extend_from_slice(&(l4_len as u16).to_be_bytes());
        let field = 34 + if proto == PROTO_TCP { 16 } else { 6 };
        // The correct checksum: over the pseudo header and the segment, field zero.
        let mut all = pseudo.clone();
        all.extend_from_slice(&f[34..]);
        let correct = !ones_sum(&all);
        // What the sender leaves: the pseudo header's sum, not complemented.
        f[field..field + 2].copy_from_slice(&ones_sum(&pseudo).to_be_bytes());
        (f, correct)
    }

    #[test]
    fn completes_tcp_and_udp_over_ipv4() {
        for proto in [PROTO_TCP, PROTO_UDP] {
            for len in [0, 1, 2, 33, 1000] {
                let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
                let (mut f, correct) = offloaded_v4(proto, &payload);
                assert_eq!(complete_checksum(&mut f), Ok(proto));
                let field = 34 + if proto == PROTO_TCP { 16 } else { 6 };
                let got = u16::from_be_bytes([f[field], f[field + 1]]);
                let want = if proto == PROTO_UDP && correct == 0 {
                    0xFFFF
                } else {
                    correct
                };
                assert_eq!(got, want, "proto {proto}, {len} bytes");
            }
        }
    }

    #[test]
    fn completes_behind_a_vlan_tag_and_over_ipv6() {
        let (f, correct) = offloaded_v4(PROTO_UDP, b"hello");
        let mut tagged = Vec::new();
        insert_vlan_tag(
            &f,
            VlanTag {
                tpid: 0x8100,
                tci: 5,
            },
            &mut tagged,
        );
        assert_eq!(complete_checksum(&mut tagged), Ok(PROTO_UDP));
        assert_eq!(u16::from_be_bytes([tagged[44], tagged[45]]), correct);

        // IPv6 + UDP: the sum over the segment with the field holding the pseudo sum.
        let payload = b"six";
        let l4_len = 8 + payload.len();
        let mut f = vec![0u8; 14 + 40 + l4_len];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f[14] = 0x60;
        f[18..20].copy_from_slice(&(l4_len as u16).to_be_bytes());
        f[20] = PROTO_UDP;
        f[22..38].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f[38..54].copy_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        f[58..60].copy_from_slice(&(l4_len as u16).to_be_bytes());
        f[62..].copy_from_slice(payload);
        let mut pseudo = f[22..54].to_vec();
        pseudo.extend_from_slice(&(l4_len as u32).to_be_bytes());
        pseudo.extend_from_slice(&[0, 0, 0, PROTO_UDP]);
        let mut all = pseudo.clone();
        all.extend_from_slice(&f[54..]);
        let correct = !ones_sum(&all);
        f[60..62].copy_from_slice(&ones_sum(&pseudo).to_be_bytes());
        assert_eq!(complete_checksum(&mut f), Ok(PROTO_UDP));
        assert_eq!(u16::from_be_bytes([f[60], f[61]]), correct);
    }

    #[test]
    fn leaves_other_frames_alone() {
        let mut arp = vec![0u8; 42];
        arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
        let before = arp.clone();
        assert_eq!(complete_checksum(&mut arp), Err(ChecksumSkip::NotIp));
        assert_eq!(arp, before);
        let (mut icmp, _) = offloaded_v4(PROTO_UDP, b"x");
        icmp[23] = 1;
        assert_eq!(complete_checksum(&mut icmp), Err(ChecksumSkip::NotTcpUdp));
        let (mut cut, _) = offloaded_v4(PROTO_TCP, &[1; 100]);
        cut.truncate(80);
        assert_eq!(complete_checksum(&mut cut), Err(ChecksumSkip::Truncated));
        assert_eq!(
            complete_checksum(&mut [0u8; 5]),
            Err(ChecksumSkip::Truncated)
        );
    }

    #[test]
    fn a_tag_goes_back_after_the_mac_addresses() {
        let frame: Vec<u8> = (0..20).collect();
        let mut out = vec![0xEE];
        insert_vlan_tag(
            &frame,
            VlanTag {
                tpid: 0x8100,
                tci: 0x0123,
            },
            &mut out,
        );
        assert_eq!(out.len(), 1 + 24);
        assert_eq!(&out[1..13], &frame[..12]);
        assert_eq!(&out[13..17], &[0x81, 0x00, 0x01, 0x23]);
        assert_eq!(&out[17..], &frame[12..]);
    }
}
