//! TCP.

/// TCP flag FIN (bit 0 of the 9-bit `flags` field).
pub const TCP_FIN: u16 = 0x001;
/// TCP flag SYN.
pub const TCP_SYN: u16 = 0x002;
/// TCP flag RST.
pub const TCP_RST: u16 = 0x004;
/// TCP flag PSH.
pub const TCP_PSH: u16 = 0x008;
/// TCP flag ACK.
pub const TCP_ACK: u16 = 0x010;
/// TCP flag URG.
pub const TCP_URG: u16 = 0x020;
/// TCP flag ECE.
pub const TCP_ECE: u16 = 0x040;
/// TCP flag CWR.
pub const TCP_CWR: u16 = 0x080;
/// TCP flag NS (ECN nonce, RFC 3540).
pub const TCP_NS: u16 = 0x100;

crate::header! {
    /// TCP header without options, 20 bytes.
    pub struct Tcp {
        /// Source port.
        src_port: 16,
        /// Destination port.
        dst_port: 16,
        /// Sequence number.
        seq: 32,
        /// Acknowledgment number.
        ack: 32,
        /// Header length in 32-bit words (5 without options).
        data_off: 4,
        /// Reserved.
        _: 3,
        /// Flags (`TCP_NS` .. `TCP_FIN`).
        flags: 9,
        /// Receive window.
        window: 16,
        /// Checksum over the pseudo-header, header and payload.
        checksum: 16,
        /// Urgent pointer.
        urgent: 16,
    }
}

impl<T: AsRef<[u8]>> Tcp<T> {
    /// Header length in bytes, options included (`data_off * 4`).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.data_off()) * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WireError;

    // sport 443, dport 51000, seq 0x01020304, ack 0xA0B0C0D0, data_off 5, flags SYN|ACK,
    // window 65535, checksum 0xBEEF, urgent 0.
    static SEGMENT: [u8; 20] = [
        0x01, 0xBB, 0xC7, 0x38, 0x01, 0x02, 0x03, 0x04, 0xA0, 0xB0, 0xC0, 0xD0, 0x50, 0x12, 0xFF,
        0xFF, 0xBE, 0xEF, 0x00, 0x00,
    ];

    #[test]
    fn deconstruct() {
        let tcp = Tcp::new_checked(&SEGMENT[..]).unwrap();
        assert_eq!(tcp.src_port(), 443);
        assert_eq!(tcp.dst_port(), 51000);
        assert_eq!(tcp.seq(), 0x0102_0304);
        assert_eq!(tcp.ack(), 0xA0B0_C0D0);
        assert_eq!(tcp.data_off(), 5);
        assert_eq!(tcp.header_len(), 20);
        assert_eq!(tcp.flags(), TCP_SYN | TCP_ACK);
        assert_eq!(tcp.window(), 0xFFFF);
        assert_eq!(tcp.checksum(), 0xBEEF);
        assert_eq!(tcp.urgent(), 0);
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 20];
        let mut tcp = Tcp::new_checked(&mut buf[..]).unwrap();
        tcp.set_src_port(443);
        tcp.set_dst_port(51000);
        tcp.set_seq(0x0102_0304);
        tcp.set_ack(0xA0B0_C0D0);
        tcp.set_data_off(5);
        tcp.set_flags(TCP_SYN | TCP_ACK);
        tcp.set_window(0xFFFF);
        tcp.set_checksum(0xBEEF);
        tcp.set_urgent(0);
        assert_eq!(buf, SEGMENT);
    }

    #[test]
    fn ns_flag_and_reserved_bits() {
        let mut buf = SEGMENT;
        // Reserved bits set must not show up in flags or data_off.
        buf[12] |= 0x0E;
        let mut tcp = Tcp::new_checked(&mut buf[..]).unwrap();
        assert_eq!(tcp.flags(), TCP_SYN | TCP_ACK);
        assert_eq!(tcp.data_off(), 5);
        // Flags are 9 bits: bit 9 and up are dropped.
        tcp.set_flags(0xFE00 | TCP_NS | TCP_FIN);
        assert_eq!(tcp.flags(), TCP_NS | TCP_FIN);
        assert_eq!(buf[12], 0x5F);
        assert_eq!(buf[13], 0x01);
    }

    #[test]
    fn too_short() {
        assert_eq!(
            Tcp::new_checked(&SEGMENT[..19]).unwrap_err(),
            WireError::Truncated {
                header: "Tcp",
                need: 20,
                have: 19
            }
        );
    }
}
