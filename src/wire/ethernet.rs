//! Ethernet II.

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of an IEEE 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;

crate::header! {
    /// Ethernet II header (the paper's `ether_t`), 14 bytes. MAC addresses read as the
    /// 48-bit big-endian integer of their six bytes (`02:00:00:00:00:01` is
    /// `0x0200_0000_0001`).
    pub struct Ether {
        /// Destination MAC address.
        dmac: 48,
        /// Source MAC address.
        smac: 48,
        /// EtherType of the payload (e.g. [`ETHERTYPE_IPV4`]).
        etype: 16,
    }
}

impl<T: AsRef<[u8]>> Ether<T> {
    /// The frame's payload (everything after the 14-byte header).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        self.rest()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ether<T> {
    /// The frame's payload, mutably.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        self.rest_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WireError;

    // dst 02:00:00:00:00:01, src 02:00:00:00:00:02, IPv4, then two payload bytes.
    static FRAME: [u8; 16] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x08, 0x00, 0xAA,
        0xBB,
    ];

    #[test]
    fn deconstruct() {
        let eth = Ether::new_checked(&FRAME[..]).unwrap();
        assert_eq!(eth.dmac(), 0x0200_0000_0001);
        assert_eq!(eth.smac(), 0x0200_0000_0002);
        assert_eq!(eth.etype(), ETHERTYPE_IPV4);
        assert_eq!(eth.payload(), &[0xAA, 0xBB]);
        assert_eq!(eth.as_bytes(), &FRAME[..14]);
    }

    #[test]
    fn construct() {
        let mut buf = [0u8; 16];
        let mut eth = Ether::new_checked(&mut buf[..]).unwrap();
        eth.set_dmac(0x0200_0000_0001);
        eth.set_smac(0x0200_0000_0002);
        eth.set_etype(ETHERTYPE_IPV4);
        eth.payload_mut().copy_from_slice(&[0xAA, 0xBB]);
        assert_eq!(buf, FRAME);
    }

    #[test]
    fn layout_and_masking() {
        assert_eq!(Ether::<&[u8]>::LEN, 14);
        let mut buf = [0u8; 14];
        let mut eth = Ether::new_unchecked(&mut buf[..]);
        // A MAC is 48 bits: the top 16 bits of the u64 are dropped.
        eth.set_smac(0xFFFF_0200_0000_0002);
        assert_eq!(eth.smac(), 0x0200_0000_0002);
        assert_eq!(&buf[..6], &[0; 6]);
    }

    #[test]
    fn too_short() {
        assert_eq!(
            Ether::new_checked(&FRAME[..13]).unwrap_err(),
            WireError::Truncated {
                header: "Ether",
                need: 14,
                have: 13
            }
        );
    }
}
