//! IPv4.

use std::net::Ipv4Addr;

use super::checksum::{fold, ones_sum};
use super::WireError;

/// IP protocol number of ICMP.
pub const IPPROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// Byte offset of the header checksum.
const CHECKSUM_AT: usize = 10;

crate::header! {
    /// IPv4 header, the fixed 20 bytes (options, if `ihl > 5`, follow; see
    /// [`Ipv4::options`]).
    pub struct Ipv4 {
        /// Version (4).
        ver: 4,
        /// Header length in 32-bit words (5 without options).
        ihl: 4,
        /// Differentiated services code point.
        dscp: 6,
        /// Explicit congestion notification.
        ecn: 2,
        /// Length of header plus payload, in bytes.
        total_len: 16,
        /// Identification.
        ident: 16,
        /// Reserved flag (must be zero).
        _: 1,
        /// Don't fragment.
        df: 1,
        /// More fragments.
        mf: 1,
        /// Fragment offset, in 8-byte units.
        frag_off: 13,
        /// Time to live.
        ttl: 8,
        /// Protocol of the payload (e.g. [`IPPROTO_UDP`]).
        proto: 8,
        /// Header checksum.
        checksum: 16,
        /// Source address.
        src: 32,
        /// Destination address.
        dst: 32,
    }
}

impl<T: AsRef<[u8]>> Ipv4<T> {
    /// Like `new_checked`, and also checks that the version is 4 and `ihl >= 5`
    /// ([`WireError::Malformed`] otherwise) and that the buffer holds the whole
    /// `ihl * 4`-byte header ([`WireError::Truncated`] otherwise).
    pub fn new_checked_full(buffer: T) -> Result<Self, WireError> {
        let ip = Self::new_checked(buffer)?;
        if ip.ver() != 4 {
            return Err(WireError::Malformed {
                header: "Ipv4",
                reason: "version is not 4",
            });
        }
        if ip.ihl() < 5 {
            return Err(WireError::Malformed {
                header: "Ipv4",
                reason: "ihl is below 5 (20 bytes)",
            });
        }
        let have = ip.buffer.as_ref().len();
        let need = ip.header_len();
        if have < need {
            return Err(WireError::Truncated {
                header: "Ipv4",
                need,
                have,
            });
        }
        Ok(ip)
    }

    /// Header length in bytes, options included (`ihl * 4`).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.ihl()) * 4
    }

    /// The options: bytes 20 to `ihl * 4`, cut short at the end of the buffer (empty when
    /// `ihl <= 5`).
    pub fn options(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let end = self.header_len().min(buf.len());
        buf.get(Self::LEN..end).unwrap_or(&[])
    }

    /// The payload: bytes from `ihl * 4` to `total_len`, both cut to the buffer (and the
    /// start to at least the fixed 20 bytes), so it never panics after `new_checked`.
    pub fn payload(&self) -> &[u8] {
        let buf = self.buffer.as_ref();
        let start = self.header_len().max(Self::LEN).min(buf.len());
        let end = usize::from(self.total_len()).clamp(start, buf.len());
        &buf[start..end]
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.src())
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.dst())
    }

    /// The header checksum the header should carry: RFC 1071 over the `ihl * 4`-byte header
    /// (cut short at the end of the buffer) with the checksum field taken as zero.
    pub fn compute_checksum(&self) -> u16 {
        let buf = self.buffer.as_ref();
        let hl = self.header_len().min(buf.len());
        let head = &buf[..hl];
        let mut sum = ones_sum(&head[..hl.min(CHECKSUM_AT)]);
        if hl > CHECKSUM_AT + 2 {
            sum += ones_sum(&head[CHECKSUM_AT + 2..]);
        }
        !fold(sum)
    }

    /// Whether the header checksum is correct. False when `ihl < 5` or the buffer does not
    /// hold the whole `ihl * 4`-byte header.
    pub fn verify_checksum(&self) -> bool {
        let buf = self.buffer.as_ref();
        let hl = self.header_len();
        if hl < Self::LEN || buf.len() < hl {
            return false;
        }
        super::checksum(&buf[..hl]) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4<T> {
    /// Stores [`compute_checksum`](Ipv4::compute_checksum) in the checksum field.
    pub fn fill_checksum(&mut self) {
        let sum = self.compute_checksum();
        self.set_checksum(sum);
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        self.set_src(u32::from(addr));
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        self.set_dst(u32::from(addr));
    }

    /// The options, mutably (see [`options`](Ipv4::options)).
    pub fn options_mut(&mut self) -> &mut [u8] {
        let end = self.header_len();
        let buf = self.buffer.as_mut();
        let end = end.min(buf.len());
        buf.get_mut(Self::LEN..end).unwrap_or(&mut [])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{checksum, checksum_update16};
    use proptest::prelude::*;

    // The classic example: 192.168.0.1 -> 192.168.0.199, UDP, ttl 64, DF, total_len 115.
    static HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    // ihl 6 with options NOP NOP NOP EOL, total_len 26, ident 0x1234, MF, frag_off 0x1ABC,
    // dscp 46 (EF), ecn 1, ttl 1, TCP, 10.0.0.1 -> 10.0.0.2, then 2 payload bytes.
    static WITH_OPTIONS: [u8; 26] = [
        0x46, 0xB9, 0x00, 0x1A, 0x12, 0x34, 0x3A, 0xBC, 0x01, 0x06, 0x00, 0x00, 0x0A, 0x00, 0x00,
        0x01, 0x0A, 0x00, 0x00, 0x02, 0x01, 0x01, 0x01, 0x00, 0xDE, 0xAD,
    ];

    #[test]
    fn deconstruct() {
        let ip = Ipv4::new_checked_full(&HEADER[..]).unwrap();
        assert_eq!(ip.ver(), 4);
        assert_eq!(ip.ihl(), 5);
        assert_eq!(ip.header_len(), 20);
        assert_eq!(ip.dscp(), 0);
        assert_eq!(ip.ecn(), 0);
        assert_eq!(ip.total_len(), 0x73);
        assert_eq!(ip.ident(), 0);
        assert!(ip.df());
        assert!(!ip.mf());
        assert_eq!(ip.frag_off(), 0);
        assert_eq!(ip.ttl(), 64);
        assert_eq!(ip.proto(), IPPROTO_UDP);
        assert_eq!(ip.checksum(), 0xb861);
        assert_eq!(ip.src_addr(), Ipv4Addr::new(192, 168, 0, 1));
        assert_eq!(ip.dst_addr(), Ipv4Addr::new(192, 168, 0, 199));
        assert!(ip.options().is_empty());
        assert!(ip.payload().is_empty());
    }

    #[test]
    fn known_checksum_vector() {
        let ip = Ipv4::new_checked(&HEADER[..]).unwrap();
        assert_eq!(ip.compute_checksum(), 0xb861);
        assert!(ip.verify_checksum());
        assert_eq!(checksum(&HEADER), 0);
        let mut zeroed = HEADER;
        zeroed[10] = 0;
        zeroed[11] = 0;
        assert_eq!(checksum(&zeroed), 0xb861);
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 20];
        let mut ip = Ipv4::new_checked(&mut buf[..]).unwrap();
        ip.set_ver(4);
        ip.set_ihl(5);
        ip.set_total_len(0x73);
        ip.set_df(true);
        ip.set_ttl(64);
        ip.set_proto(IPPROTO_UDP);
        ip.set_src_addr(Ipv4Addr::new(192, 168, 0, 1));
        ip.set_dst_addr(Ipv4Addr::new(192, 168, 0, 199));
        ip.fill_checksum();
        assert_eq!(buf, HEADER);
    }

    #[test]
    fn deconstruct_with_options() {
        let ip = Ipv4::new_checked_full(&WITH_OPTIONS[..]).unwrap();
        assert_eq!(ip.header_len(), 24);
        assert_eq!(ip.dscp(), 46);
        assert_eq!(ip.ecn(), 1);
        assert_eq!(ip.total_len(), 26);
        assert_eq!(ip.ident(), 0x1234);
        assert!(!ip.df());
        assert!(ip.mf());
        assert_eq!(ip.frag_off(), 0x1ABC);
        assert_eq!(ip.ttl(), 1);
        assert_eq!(ip.proto(), IPPROTO_TCP);
        assert_eq!(ip.options(), &[0x01, 0x01, 0x01, 0x00]);
        assert_eq!(ip.payload(), &[0xDE, 0xAD]);
        assert!(!ip.verify_checksum());
    }

    #[test]
    fn construct_with_options() {
        let mut buf = [0u8; 26];
        let mut ip = Ipv4::new_checked(&mut buf[..]).unwrap();
        ip.set_ver(4);
        ip.set_ihl(6);
        ip.set_dscp(46);
        ip.set_ecn(1);
        ip.set_total_len(26);
        ip.set_ident(0x1234);
        ip.set_mf(true);
        ip.set_frag_off(0x1ABC);
        ip.set_ttl(1);
        ip.set_proto(IPPROTO_TCP);
        ip.set_src_addr(Ipv4Addr::new(10, 0, 0, 1));
        ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 2));
        ip.options_mut().copy_from_slice(&[0x01, 0x01, 0x01, 0x00]);
        ip.rest_mut()[4..].copy_from_slice(&[0xDE, 0xAD]);
        assert_eq!(buf, WITH_OPTIONS);
        let mut ip = Ipv4::new_checked(&mut buf[..]).unwrap();
        ip.fill_checksum();
        assert!(ip.verify_checksum());
        // The options are covered by the checksum.
        buf[21] = 0x07;
        assert!(!Ipv4::new_checked(&buf[..]).unwrap().verify_checksum());
    }

    #[test]
    fn checked_full_errors() {
        assert_eq!(
            Ipv4::new_checked_full(&HEADER[..19]).unwrap_err(),
            WireError::Truncated {
                header: "Ipv4",
                need: 20,
                have: 19
            }
        );
        let mut v6 = HEADER;
        v6[0] = 0x65;
        assert!(matches!(
            Ipv4::new_checked_full(&v6[..]),
            Err(WireError::Malformed { header: "Ipv4", .. })
        ));
        let mut short_ihl = HEADER;
        short_ihl[0] = 0x44;
        assert!(matches!(
            Ipv4::new_checked_full(&short_ihl[..]),
            Err(WireError::Malformed { header: "Ipv4", .. })
        ));
        // ihl 6 needs 24 bytes.
        assert_eq!(
            Ipv4::new_checked_full(&WITH_OPTIONS[..22]).unwrap_err(),
            WireError::Truncated {
                header: "Ipv4",
                need: 24,
                have: 22
            }
        );
    }

    #[test]
    fn inconsistent_headers_do_not_panic() {
        // ihl 15 (60 bytes) over a 20-byte buffer, ihl 0, ihl 2.
        for first in [0x4F, 0x40, 0x42] {
            let mut buf = HEADER;
            buf[0] = first;
            let mut ip = Ipv4::new_checked(&mut buf[..]).unwrap();
            assert!(!ip.verify_checksum());
            let _ = ip.compute_checksum();
            let _ = ip.options();
            let _ = ip.payload();
            let _ = ip.options_mut();
            ip.fill_checksum();
        }
    }

    proptest! {
        #[test]
        fn ttl_decrement_incremental_update(
            bytes in proptest::collection::vec(any::<u8>(), 60),
            ihl in 5u8..=15,
            ttl in 1u8..=255,
        ) {
            let mut buf = bytes;
            let mut ip = Ipv4::new_checked(&mut buf[..]).unwrap();
            ip.set_ver(4);
            ip.set_ihl(ihl);
            ip.set_ttl(ttl);
            ip.fill_checksum();
            prop_assert!(ip.verify_checksum());
            let old_word = u16::from_be_bytes([ip.ttl(), ip.proto()]);
            let old_sum = ip.checksum();
            ip.set_ttl(ttl - 1);
            let new_word = u16::from_be_bytes([ip.ttl(), ip.proto()]);
            let updated = checksum_update16(old_sum, old_word, new_word);
            prop_assert_eq!(updated, ip.compute_checksum());
            ip.set_checksum(updated);
            prop_assert!(ip.verify_checksum());
        }
    }
}
