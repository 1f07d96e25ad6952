//! The blocks of a `TPACKET_V3` receive ring, read as plain bytes.
//!
//! [`parse_block`] is a safe, pure function over a block's bytes: it checks every offset
//! and length the kernel wrote against the block's size and lists the frames, so a bad
//! block is an error, never an out-of-bounds read. The ring itself (mapping, handing
//! blocks back and forth) is in `ports/sys.rs`; this module only reads what a block holds.
//! [`BlockBuilder`] writes synthetic blocks in the kernel's layout, for the tests here (which
//! run under Miri) and the ports' own tests.
//!
//! A block, as Linux's `<linux/if_packet.h>` lays it out (native byte order, all fields
//! 32-bit unless said):
//!
//! ```text
//! tpacket_block_desc   0 version  4 offset_to_priv  8 block_status  12 num_pkts
//!                     16 offset_to_first_pkt  20 blk_len  24 seq_num (64)  32 ts_first  40 ts_last
//! tpacket3_hdr         0 tp_next_offset  4 tp_sec  8 tp_nsec  12 tp_snaplen  16 tp_len
//!                     20 tp_status  24 tp_mac (16)  26 tp_net (16)  28 tp_rxhash
//!                     32 tp_vlan_tci  36 tp_vlan_tpid (16)   (48 bytes)
//! sockaddr_ll          48 after the frame header: 0 family (16) 2 protocol (16)
//!                      4 ifindex 8 hatype (16) 10 pkttype (8) 11 halen (8) 12 addr[8]
//! ```
//!
//! Each frame's bytes are at `tp_mac` from its header, `tp_snaplen` of them (`tp_len` on
//! the wire); `tp_next_offset` leads from one header to the next (0 after the last).

use std::fmt;
use std::ops::Range;

/// Size of a block's header (`tpacket_block_desc` with its `tpacket_hdr_v1`).
pub const BLOCK_HEADER_BYTES: usize = 48;
/// Size of a frame's header (`tpacket3_hdr`).
pub const FRAME_HEADER_BYTES: usize = 48;
/// Where the `sockaddr_ll` of a frame starts, from its header.
pub const SOCKADDR_AT: usize = FRAME_HEADER_BYTES;
/// Size of the `sockaddr_ll` after a frame's header.
pub const SOCKADDR_BYTES: usize = 20;
/// The block layout's version field: `TPACKET_V3` blocks hold the version itself (2).
pub const BLOCK_VERSION: u32 = 2;

/// `tp_status`: the frame was cut to the ring's space (also `tp_snaplen < tp_len`).
pub const TP_STATUS_COPY: u32 = 1 << 1;
/// `tp_status`: the kernel dropped frames before this one (the ring was full).
pub const TP_STATUS_LOSING: u32 = 1 << 2;
/// `tp_status`: the frame's TCP/UDP checksum is not computed yet (an offload of the
/// sending host; see [`super::fix::complete_checksum`]).
pub const TP_STATUS_CSUMNOTREADY: u32 = 1 << 3;
/// `tp_status`: `tp_vlan_tci` holds a VLAN tag the kernel took out of the frame.
pub const TP_STATUS_VLAN_VALID: u32 = 1 << 4;
/// `tp_status`: `tp_vlan_tpid` holds the tag's TPID.
pub const TP_STATUS_VLAN_TPID_VALID: u32 = 1 << 6;

/// `sll_pkttype` of a frame this host sent.
pub const PACKET_OUTGOING: u8 = 4;

/// A VLAN tag the kernel took out of a frame (hardware VLAN offload).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VlanTag {
    /// The TPID (0x8100 when the kernel did not say).
    pub tpid: u16,
    /// The tag control information (priority, DEI, VLAN id).
    pub tci: u16,
}

/// One frame of a block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RxFrame {
    /// Where the frame's captured bytes are in the block.
    pub data: Range<usize>,
    /// Its length on the wire (`tp_len`); more than `data`'s length when it was cut.
    pub wire_len: u32,
    /// `tp_status`.
    pub status: u32,
    /// `sll_pkttype`: `PACKET_HOST`, `PACKET_BROADCAST`, ..., [`PACKET_OUTGOING`].
    pub pkttype: u8,
    /// The VLAN tag the kernel took out, if any.
    pub vlan: Option<VlanTag>,
}

impl RxFrame {
    /// Whether the frame was cut short of its length on the wire.
    pub fn is_truncated(&self) -> bool {
        (self.data.len() as u64) < u64::from(self.wire_len)
    }

    /// Whether its TCP/UDP checksum still has to be computed.
    pub fn checksum_not_ready(&self) -> bool {
        self.status & TP_STATUS_CSUMNOTREADY != 0
    }
}

/// A block's header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockHeader {
    /// `block_status`.
    pub status: u32,
    /// Frames in the block.
    pub num_pkts: u32,
    /// The block's sequence number.
    pub seq: u64,
}

/// What is wrong with a block.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingError {
    /// The block is shorter than its header.
    Short {
        /// Its length.
        len: usize,
    },
    /// The version field is not [`BLOCK_VERSION`].
    Version(u32),
    /// Frame `index`'s header or bytes lie outside the block.
    OutOfBlock {
        /// The frame's index in the block.
        index: u32,
        /// Where its header starts.
        at: usize,
    },
    /// The frame list ends (a zero `tp_next_offset`) before `num_pkts` frames.
    ShortList {
        /// Frames found.
        found: u32,
        /// Frames the header announced.
        announced: u32,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Short { len } => write!(
                f,
                "ring block of {len} bytes is shorter than its {BLOCK_HEADER_BYTES}-byte header"
            ),
            RingError::Version(v) => write!(f, "ring block version {v}, expected {BLOCK_VERSION}"),
            RingError::OutOfBlock { index, at } => write!(
                f,
                "frame {index} of a ring block (header at byte {at}) lies outside the block"
            ),
            RingError::ShortList { found, announced } => write!(
                f,
                "ring block announces {announced} frames but lists {found}"
            ),
        }
    }
}

impl std::error::Error for RingError {}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a block: its header, and its frames appended to `frames` (cleared first). Every
/// offset is checked against `block`'s length; on an error `frames` holds the frames read
/// before it.
pub fn parse_block(block: &[u8], frames: &mut Vec<RxFrame>) -> Result<BlockHeader, RingError> {
    frames.clear();
    let short = RingError::Short { len: block.len() };
    if block.len() < BLOCK_HEADER_BYTES {
        return Err(short);
    }
    let field = |at| u32_at(block, at).ok_or(RingError::Short { len: block.len() });
    let version = field(0)?;
    if version != BLOCK_VERSION {
        return Err(RingError::Version(version));
    }
    let header = BlockHeader {
        status: field(8)?,
        num_pkts: field(12)?,
        seq: u64_at(block, 24).ok_or(short)?,
    };
    let mut at = field(16)? as usize;
    for index in 0..header.num_pkts {
        let out = RingError::OutOfBlock { index, at };
        let hdr = at
            .checked_add(SOCKADDR_AT + SOCKADDR_BYTES)
            .and_then(|end| block.get(at..end))
            .ok_or(out.clone())?;
        let (Some(next), Some(snaplen), Some(wire_len), Some(status), Some(mac)) = (
            u32_at(hdr, 0),
            u32_at(hdr, 12),
            u32_at(hdr, 16),
            u32_at(hdr, 20),
            u16_at(hdr, 24),
        ) else {
            return Err(out);
        };
        let start = at + usize::from(mac);
        let end = start.checked_add(snaplen as usize).ok_or(out.clone())?;
        if usize::from(mac) < SOCKADDR_AT + SOCKADDR_BYTES || end > block.len() {
            return Err(out);
        }
        let vlan = (status & TP_STATUS_VLAN_VALID != 0).then(|| VlanTag {
            tpid: if status & TP_STATUS_VLAN_TPID_VALID != 0 {
                u16_at(hdr, 36).unwrap_or(0x8100)
            } else {
                0x8100
            },
            tci: u32_at(hdr, 32).unwrap_or(0) as u16,
        });
        frames.push(RxFrame {
            data: start..end,
            wire_len,
            status,
            pkttype: hdr[SOCKADDR_AT + 10],
            vlan,
        });
        if index + 1 < header.num_pkts {
            if next == 0 {
                return Err(RingError::ShortList {
                    found: index + 1,
                    announced: header.num_pkts,
                });
            }
            at = at.checked_add(next as usize).ok_or(RingError::OutOfBlock {
                index: index + 1,
                at: usize::MAX,
            })?;
        }
    }
    Ok(header)
}

/// One frame of a synthetic block ([`BlockBuilder`]).
#[derive(Clone, Debug, Default)]
pub struct SyntheticFrame {
    /// The captured bytes.
    pub data: Vec<u8>,
    /// The length on the wire (`None`: the captured length).
    pub wire_len: Option<u32>,
    /// `tp_status`.
    pub status: u32,
    /// `sll_pkttype`.
    pub pkttype: u8,
    /// `tp_vlan_tci` and `tp_vlan_tpid`.
    pub vlan: Option<VlanTag>,
}

/// Writes blocks in the kernel's `TPACKET_V3` layout: frames packed after the block
/// header, each header 16-byte aligned as the kernel aligns them (`TPACKET_ALIGN`), its
/// `sockaddr_ll` after it, the frame's bytes after that.
#[derive(Debug, Default)]
pub struct BlockBuilder {
    frames: Vec<SyntheticFrame>,
}

/// `TPACKET_ALIGN`.
const fn align16(n: usize) -> usize {
    (n + 15) & !15
}

impl BlockBuilder {
    /// An empty block.
    pub fn new() -> Self {
        BlockBuilder::default()
    }

    /// Adds a frame.
    pub fn frame(mut self, f: SyntheticFrame) -> Self {
        self.frames.push(f);
        self
    }

    /// The block, `block_bytes` long (it must hold the frames), owned by user space
    /// (`block_status` = `TP_STATUS_USER`).
    pub fn build(&self, block_bytes: usize) -> Vec<u8> {
        let mut b = vec![0u8; block_bytes];
        let put32 =
            |b: &mut [u8], at: usize, v: u32| b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        put32(&mut b, 0, BLOCK_VERSION);
        put32(&mut b, 8, 1);
        put32(&mut b, 12, self.frames.len() as u32);
        put32(&mut b, 16, BLOCK_HEADER_BYTES as u32);
        let mac = align16(SOCKADDR_AT + SOCKADDR_BYTES) + 2;
        let mut at = BLOCK_HEADER_BYTES;
        for (i, f) in self.frames.iter().enumerate() {
            let SyntheticFrame {
                data,
                wire_len,
                status,
                pkttype,
                vlan,
            } = f;
            let len = align16(mac + data.len());
            let next = if i + 1 == self.frames.len() { 0 } else { len };
            put32(&mut b, at, next as u32);
            put32(&mut b, at + 12, data.len() as u32);
            put32(&mut b, at + 16, wire_len.unwrap_or(data.len() as u32));
            let mut st = *status;
            if let Some(v) = vlan {
                st |= TP_STATUS_VLAN_VALID | TP_STATUS_VLAN_TPID_VALID;
                put32(&mut b, at + 32, u32::from(v.tci));
                b[at + 36..at + 38].copy_from_slice(&v.tpid.to_ne_bytes());
            }
            put32(&mut b, at + 20, st);
            b[at + 24..at + 26].copy_from_slice(&(mac as u16).to_ne_bytes());
            b[at + SOCKADDR_AT + 10] = *pkttype;
            b[at + mac..at + mac + data.len()].copy_from_slice(data);
            at += len;
        }
        put32(&mut b, 20, at as u32);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(n: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| n.wrapping_add(i as u8)).collect()
    }

    #[test]
    fn reads_every_frame_of_a_block_in_order() {
        let (a, b, c) = (frame(1, 60), frame(2, 1514), frame(3, 14));
        let block = BlockBuilder::new()
            .frame(SyntheticFrame {
                data: a.clone(),
                ..Default::default()
            })
            .frame(SyntheticFrame {
                data: b.clone(),
                pkttype: 3,
                status: TP_STATUS_CSUMNOTREADY,
                ..Default::default()
            })
            .frame(SyntheticFrame {
                data: c.clone(),
                vlan: Some(VlanTag {
                    tpid: 0x88a8,
                    tci: 0x2064,
                }),
                ..Default::default()
            })
            .build(4096);
        let mut frames = Vec::new();
        let h = parse_block(&block, &mut frames).expect("a valid block");
        assert_eq!(h.num_pkts, 3);
        assert_eq!(frames.len(), 3);
        assert_eq!(&block[frames[0].data.clone()], &a[..]);
        assert_eq!(&block[frames[1].data.clone()], &b[..]);
        assert_eq!(&block[frames[2].data.clone()], &c[..]);
        assert!(frames[1].checksum_not_ready() && !frames[0].checksum_not_ready());
        assert_eq!(frames[1].pkttype, 3);
        assert_eq!(
            frames[2].vlan,
            Some(VlanTag {
                tpid: 0x88a8,
                tci: 0x2064
            })
        );
        assert!(frames.iter().all(|f| !f.is_truncated()));
    }

    #[test]
    fn an_empty_block_has_no_frames() {
        let block = BlockBuilder::new().build(256);
        let mut frames = vec![RxFrame {
            data: 0..1,
            wire_len: 1,
            status: 0,
            pkttype: 0,
            vlan: None,
        }];
        assert_eq!(parse_block(&block, &mut frames).map(|h| h.num_pkts), Ok(0));
        assert!(frames.is_empty());
    }

    #[test]
    fn a_cut_frame_is_reported_with_its_wire_length() {
        let a = frame(7, 100);
        let block = BlockBuilder::new()
            .frame(SyntheticFrame {
                data: a.clone(),
                wire_len: Some(9000),
                status: TP_STATUS_COPY,
                ..Default::default()
            })
            .build(512);
        let mut frames = Vec::new();
        parse_block(&block, &mut frames).expect("valid");
        assert!(frames[0].is_truncated());
        assert_eq!(frames[0].wire_len, 9000);
    }

    #[test]
    fn bad_blocks_are_errors_not_panics() {
        let a = frame(1, 64);
        let good = BlockBuilder::new()
            .frame(SyntheticFrame {
                data: a.clone(),
                ..Default::default()
            })
            .frame(SyntheticFrame {
                data: a.clone(),
                ..Default::default()
            })
            .build(1024);
        let mut frames = Vec::new();
        assert_eq!(
            parse_block(&good[..20], &mut frames),
            Err(RingError::Short { len: 20 })
        );
        let mut v = good.clone();
        v[0..4].copy_from_slice(&1u32.to_ne_bytes());
        assert_eq!(parse_block(&v, &mut frames), Err(RingError::Version(1)));
        // The first frame's bytes run past the block.
        let mut v = good.clone();
        v[48 + 12..48 + 16].copy_from_slice(&5000u32.to_ne_bytes());
        assert!(matches!(
            parse_block(&v, &mut frames),
            Err(RingError::OutOfBlock { index: 0, .. })
        ));
        // The second header is past the block.
        let mut v = good.clone();
        v[48..52].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(matches!(
            parse_block(&v, &mut frames),
            Err(RingError::OutOfBlock { index: 1, .. })
        ));
        // More frames announced than listed.
        let mut v = good.clone();
        v[12..16].copy_from_slice(&3u32.to_ne_bytes());
        assert_eq!(
            parse_block(&v, &mut frames),
            Err(RingError::ShortList {
                found: 2,
                announced: 3
            })
        );
        // A first frame offset past the end.
        let mut v = good;
        v[16..20].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse_block(&v, &mut frames).is_err());
    }

    #[test]
    fn any_bytes_parse_without_panicking() {
        // A cheap fuzz: every one-byte corruption of a valid block is read or refused.
        let a = frame(9, 80);
        let good = BlockBuilder::new()
            .frame(SyntheticFrame {
                data: a.clone(),
                ..Default::default()
            })
            .frame(SyntheticFrame {
                data: a.clone(),
                ..Default::default()
            })
            .build(512);
        let step = if cfg!(miri) { 7 } else { 1 };
        let mut frames = Vec::new();
        for at in (0..200).step_by(step) {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut b = good.clone();
                b[at] = v;
                if let Ok(h) = parse_block(&b, &mut frames) {
                    assert_eq!(frames.len(), h.num_pkts as usize);
                    assert!(frames.iter().all(|f| f.data.end <= b.len()));
                }
            }
        }
    }
}
