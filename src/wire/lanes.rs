//! 32-bit lanes in network byte order, in bulk: what an end host does to every gradient it
//! sends or receives (Trio-ML's and FPISA's payloads are arrays of big-endian 32-bit lanes).
//!
//! The loops are compiled for several instruction sets and one is picked at run time, as the
//! engine's own lane kernels are: the baseline `x86_64` build swaps bytes with a dozen SSE2
//! instructions per 16 bytes, where AVX2 and AVX-512 swap a whole register with one shuffle.

use crate::isa::with_avx2;

with_avx2! {
    /// Writes `src[i]` in network byte order to `dst[4i..4i + 4]`, for every `i`.
    ///
    /// # Panics
    /// If `dst.len() != 4 * src.len()`.
    pub fn write_be_i32s(dst: &mut [u8], src: &[i32]) {
        assert_eq!(dst.len(), src.len() * 4, "4 bytes per lane");
        for (b, v) in dst.chunks_exact_mut(4).zip(src) {
            b.copy_from_slice(&v.to_be_bytes());
        }
    }
}

with_avx2! {
    /// Reads `dst[i]` from `src[4i..4i + 4]` (network byte order), for every `i`.
    ///
    /// # Panics
    /// If `src.len() != 4 * dst.len()`.
    pub fn read_be_i32s(dst: &mut [i32], src: &[u8]) {
        assert_eq!(src.len(), dst.len() * 4, "4 bytes per lane");
        for (v, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *v = i32::from_be_bytes(b.try_into().expect("4 bytes"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::test_isa::{capped, ALL};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn every_build_matches_the_lane_by_lane_definition(
            lanes in proptest::collection::vec(any::<i32>(), 0..300),
        ) {
            let want: Vec<u8> = lanes.iter().flat_map(|v| v.to_be_bytes()).collect();
            for isa in ALL {
                let mut bytes = vec![0u8; lanes.len() * 4];
                capped(isa, || write_be_i32s(&mut bytes, &lanes));
                prop_assert_eq!(&bytes, &want, "{:?}", isa);
                let mut back = vec![0i32; lanes.len()];
                capped(isa, || read_be_i32s(&mut back, &bytes));
                prop_assert_eq!(&back, &lanes, "{:?}", isa);
            }
        }
    }

    #[test]
    fn network_order_is_most_significant_byte_first() {
        let mut b = [0u8; 8];
        write_be_i32s(&mut b, &[0x0102_0304, -2]);
        assert_eq!(b, [1, 2, 3, 4, 0xff, 0xff, 0xff, 0xfe]);
        let mut v = [0i32; 2];
        read_be_i32s(&mut v, &b);
        assert_eq!(v, [0x0102_0304, -2]);
    }

    #[test]
    #[should_panic(expected = "4 bytes per lane")]
    fn lengths_must_agree() {
        write_be_i32s(&mut [0u8; 7], &[1, 2]);
    }
}
