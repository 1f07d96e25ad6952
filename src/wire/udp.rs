//! UDP.

crate::header! {
    /// UDP header, 8 bytes.
    pub struct Udp {
        /// Source port.
        src_port: 16,
        /// Destination port.
        dst_port: 16,
        /// Length of header plus payload, in bytes.
        len: 16,
        /// Checksum over the pseudo-header, header and payload (0: none).
        checksum: 16,
    }
}

impl<T: AsRef<[u8]>> Udp<T> {
    /// The datagram's payload: the bytes after the 8-byte header, up to `len` when `len`
    /// is consistent with the buffer (otherwise everything after the header).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let rest = self.rest();
        let want = usize::from(self.len()).saturating_sub(Self::LEN);
        &rest[..want.min(rest.len())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WireError;

    // sport 1024, dport 5000, len 10, checksum 0x1234, payload "hi", one trailing byte.
    static DGRAM: [u8; 11] = [
        0x04, 0x00, 0x13, 0x88, 0x00, 0x0A, 0x12, 0x34, b'h', b'i', 0xEE,
    ];

    #[test]
    fn deconstruct() {
        let udp = Udp::new_checked(&DGRAM[..]).unwrap();
        assert_eq!(udp.src_port(), 1024);
        assert_eq!(udp.dst_port(), 5000);
        assert_eq!(udp.len(), 10);
        assert_eq!(udp.checksum(), 0x1234);
        assert_eq!(udp.payload(), b"hi");
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 11];
        let mut udp = Udp::new_checked(&mut buf[..]).unwrap();
        udp.set_src_port(1024);
        udp.set_dst_port(5000);
        udp.set_len(10);
        udp.set_checksum(0x1234);
        udp.rest_mut().copy_from_slice(&[b'h', b'i', 0xEE]);
        assert_eq!(buf, DGRAM);
    }

    #[test]
    fn too_short() {
        assert_eq!(Udp::<&[u8]>::LEN, 8);
        assert_eq!(
            Udp::new_checked(&DGRAM[..7]).unwrap_err(),
            WireError::Truncated {
                header: "Udp",
                need: 8,
                have: 7
            }
        );
        // A length field larger than the buffer does not panic.
        let mut bad = DGRAM;
        bad[5] = 0xFF;
        assert_eq!(Udp::new_checked(&bad[..]).unwrap().payload().len(), 3);
    }
}
