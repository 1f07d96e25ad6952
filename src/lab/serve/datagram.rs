//! Datagrams and frames (see the module docs): whether a datagram is an aggregation packet
//! ([`datagram_header`]), the Ethernet, IPv4 and UDP headers that make its payload a frame
//! for the engine ([`frame_of`], [`frame_header`]), a member's synthetic source address
//! ([`peer_ip`]), and the run id in a payload's header ([`set_run_id`]).

use std::net::Ipv4Addr;

use crate::microcode::trio_ml::wire::{
    self, Endpoints, TrioMlHdr, TrioMlHdrFields, GRAD_BYTES, TRIO_ML_HDR_AT, TRIO_ML_HDR_LEN,
};

/// The synthetic IPv4 source address of peer `index` (see the module docs).
pub fn peer_ip(index: u32) -> Ipv4Addr {
    Ipv4Addr::new(
        10,
        1u8.wrapping_add((index >> 16) as u8),
        (index >> 8) as u8,
        index as u8,
    )
}

/// Why a datagram is not an aggregation packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatagramError {
    /// Shorter than the Trio-ML header.
    Short,
    /// The length is not the header plus `grad_cnt` gradients.
    BadLength,
}

/// Reads the Trio-ML header of a datagram and checks its length.
pub fn datagram_header(payload: &[u8]) -> Result<TrioMlHdrFields, DatagramError> {
    let hdr = TrioMlHdr::new_checked(payload).map_err(|_| DatagramError::Short)?;
    let fields = TrioMlHdrFields::read(&hdr);
    if payload.len() != TRIO_ML_HDR_LEN + usize::from(fields.grad_cnt) * GRAD_BYTES {
        return Err(DatagramError::BadLength);
    }
    Ok(fields)
}

/// Wraps a datagram's payload (Trio-ML header and gradients) into an Ethernet/IPv4/UDP frame
/// with addresses `ep`, replacing the contents of `frame`; returns the header.
pub fn frame_of(
    payload: &[u8],
    ep: &Endpoints,
    frame: &mut Vec<u8>,
) -> Result<TrioMlHdrFields, DatagramError> {
    let hdr = datagram_header(payload)?;
    frame.clear();
    frame.extend_from_slice(&frame_header(payload.len(), ep));
    frame.extend_from_slice(payload);
    Ok(hdr)
}

/// The Ethernet, IPv4 and UDP headers that go before a datagram's payload of `payload_len`
/// bytes (Trio-ML header and gradients) in a frame with addresses `ep`.
pub(super) fn frame_header(payload_len: usize, ep: &Endpoints) -> [u8; TRIO_ML_HDR_AT] {
    let mut headers = [0u8; TRIO_ML_HDR_AT];
    wire::write_l2_to_l4(&mut headers, ep, payload_len);
    headers
}

/// Sets the run id in the Trio-ML header at the start of `payload`.
pub(super) fn set_run_id(payload: &mut [u8], run_id: u8) {
    TrioMlHdr::new_unchecked(&mut payload[..TRIO_ML_HDR_LEN]).set_run_id(run_id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::microcode::trio_ml::host::WorkerConfig;

    #[test]
    fn datagram_frame_round_trip() {
        let mut payload = vec![0u8; TRIO_ML_HDR_LEN + 8];
        TrioMlHdrFields {
            job_id: 3,
            src_id: 1,
            grad_cnt: 2,
            ..Default::default()
        }
        .write(&mut TrioMlHdr::new_unchecked(
            &mut payload[..TRIO_ML_HDR_LEN],
        ));
        payload[TRIO_ML_HDR_LEN..].copy_from_slice(&[0, 0, 0, 5, 0xFF, 0xFF, 0xFF, 0xFE]);
        let ep = WorkerConfig::new(3, 1, Ipv4Addr::LOCALHOST).endpoints;
        let mut f = Vec::new();
        frame_of(&payload, &ep, &mut f).unwrap();
        let (h, g) = wire::parse(&f).unwrap();
        assert_eq!((h.job_id, h.src_id), (3, 1));
        assert_eq!(wire::gradients(g), [5, -2]);
        assert_eq!(&f[TRIO_ML_HDR_AT..], &payload[..]);
        assert_eq!(
            frame_of(&payload[..5], &ep, &mut f),
            Err(DatagramError::Short)
        );
        assert_eq!(
            frame_of(&payload[..14], &ep, &mut f),
            Err(DatagramError::BadLength)
        );
    }

    #[test]
    fn peer_addresses_are_distinct() {
        assert_eq!(peer_ip(0), Ipv4Addr::new(10, 1, 0, 0));
        assert_eq!(peer_ip(0x1_0203), Ipv4Addr::new(10, 2, 2, 3));
    }
}
