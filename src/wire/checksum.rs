//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).

/// The ones-complement sum of `data` as big-endian 16-bit words (an odd trailing byte is
/// padded with a zero byte), not yet folded to 16 bits.
#[inline]
pub(crate) fn ones_sum(data: &[u8]) -> u64 {
    let mut chunks = data.chunks_exact(2);
    let mut sum: u64 = chunks
        .by_ref()
        .map(|w| u64::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    if let [last] = chunks.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a ones-complement sum to 16 bits (end-around carry).
#[inline]
pub(crate) fn fold(mut sum: u64) -> u16 {
    while sum > 0xFFFF {
        sum = (sum & 0xFFFF) + (sum >> 16);
    }
    sum as u16
}

/// The Internet checksum of `data` (RFC 1071): the ones complement of the ones-complement
/// sum of its big-endian 16-bit words, an odd trailing byte being padded with zero.
///
/// Computed over a header whose checksum field is zero, this is the value to store in the
/// field; computed over a header with a correct checksum it is 0.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(ones_sum(data))
}

/// Incrementally updates the checksum `old_sum` after one 16-bit word of the covered data
/// changed from `old` to `new` (RFC 1624 eqn. 3: `HC' = ~(~HC + ~m + m')`).
///
/// For data that is not all zero (e.g. any IPv4 header) the result equals a full
/// recomputation.
pub fn checksum_update16(old_sum: u16, old: u16, new: u16) -> u16 {
    let sum = u64::from(!old_sum) + u64::from(!old) + u64::from(new);
    !fold(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: words 0001 f203 f4f5 f6f7 sum to 0xddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(ones_sum(&data)), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn odd_length_pads_with_zero() {
        assert_eq!(
            checksum(&[0x12, 0x34, 0x56]),
            checksum(&[0x12, 0x34, 0x56, 0x00])
        );
        assert_eq!(checksum(&[]), 0xFFFF);
    }

    #[test]
    fn update_matches_recompute() {
        let mut data = [0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11];
        let before = checksum(&data);
        let old = u16::from_be_bytes([data[8], data[9]]);
        data[8] -= 1;
        let new = u16::from_be_bytes([data[8], data[9]]);
        assert_eq!(checksum_update16(before, old, new), checksum(&data));
    }
}
