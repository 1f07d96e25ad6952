//! Lane kernels of the vector operations: the loops that move 32-bit gradient lanes between
//! network order and the words that hold them, and add them, in bulk (a 4 KB vector add, a
//! Result's pull of sums).
//!
//! A word holds two lanes, lane 0 in its high half, so 8 bytes of big-endian lanes are one
//! big-endian `u64` ([`packed_to_be`]), and a lane-wise add of two words is [`add_packed`].
//! The loops are plain Rust the compiler vectorises, each compiled for several instruction
//! sets and picked at run time ([`crate::isa`]). FPISA's kernels are in `fpisa/lanes.rs`.

use crate::isa::with_avx2;

/// Lane-wise wrapping add of two packed lane pairs (SWAR: each 32-bit half wraps on its own,
/// no carry between them): the low 31 bits of each lane are added, so their carries stay
/// inside the lane, then the lanes' top bits are fixed up with an XOR.
#[inline]
pub(super) fn add_packed(old: u64, delta: u64) -> u64 {
    const TOP: u64 = 0x8000_0000_8000_0000;
    (old & !TOP).wrapping_add(delta & !TOP) ^ ((old ^ delta) & TOP)
}

/// The packed lane pair of 8 bytes of big-endian lanes.
#[inline]
fn be_word(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}

with_avx2! {
    /// `dst[8i..8i + 8]` = word `src[i]` in network order (`dst.len() == 8 * src.len()`).
    pub(super) fn packed_to_be(dst: &mut [u8], src: &[u64]) {
        assert_eq!(dst.len(), src.len() * 8, "8 bytes per word");
        for (b, w) in dst.chunks_exact_mut(8).zip(src) {
            b.copy_from_slice(&w.to_be_bytes());
        }
    }
}

with_avx2! {
    /// `words[i]` = lane pair `i` of `src`, big-endian lanes written as the words that hold
    /// them (`src.len() == 8 * words.len()`): the inverse of [`packed_to_be`].
    pub(super) fn be_to_packed(words: &mut [u64], src: &[u8]) {
        assert_eq!(src.len(), words.len() * 8, "8 bytes per word");
        for (w, b) in words.iter_mut().zip(src.chunks_exact(8)) {
            *w = be_word(b);
        }
    }
}

with_avx2! {
    /// `words[i] = add_packed(words[i], deltas[i])` (equal lengths).
    pub(super) fn add_packed_slice(words: &mut [u64], deltas: &[u64]) {
        assert_eq!(words.len(), deltas.len(), "one delta per word");
        for (w, &d) in words.iter_mut().zip(deltas) {
            *w = add_packed(*w, d);
        }
    }
}

with_avx2! {
    /// `words[i] = add_packed(words[i], lane pair i of src)`: a vector add straight from
    /// big-endian lanes (`src.len() == 8 * words.len()`).
    pub(super) fn add_be_slice(words: &mut [u64], src: &[u8]) {
        assert_eq!(src.len(), words.len() * 8, "8 bytes per word");
        for (w, b) in words.iter_mut().zip(src.chunks_exact(8)) {
            *w = add_packed(*w, be_word(b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isa::test_isa::{capped, ALL};
    use proptest::prelude::*;

    /// The lanes of a word, lane 0 first, added one by one: the definition the kernels must
    /// match.
    fn lanes_added(w: u64, d: u64) -> u64 {
        let hi = ((w >> 32) as u32).wrapping_add((d >> 32) as u32);
        let lo = (w as u32).wrapping_add(d as u32);
        (u64::from(hi) << 32) | u64::from(lo)
    }

    proptest! {
        #[test]
        fn kernels_match_lane_by_lane(words in proptest::collection::vec(any::<u64>(), 0..600),
                                      seed in any::<u64>()) {
            let deltas: Vec<u64> = words.iter().enumerate()
                .map(|(i, w)| w.rotate_left(i as u32 % 64) ^ seed)
                .collect();
            let be: Vec<u8> = deltas.iter().flat_map(|d| d.to_be_bytes()).collect();
            let expect: Vec<u64> = words.iter().zip(&deltas).map(|(&w, &d)| lanes_added(w, d)).collect();

            for isa in ALL {
                capped(isa, || {
                    let mut back = vec![0; be.len()];
                    packed_to_be(&mut back, &deltas);
                    prop_assert_eq!(&back, &be, "{:?}", isa);
                    let mut w = words.clone();
                    be_to_packed(&mut w, &be);
                    prop_assert_eq!(&w, &deltas, "{:?}", isa);

                    let mut a = words.clone();
                    add_packed_slice(&mut a, &deltas);
                    prop_assert_eq!(&a, &expect, "{:?}", isa);
                    let mut b = words.clone();
                    add_be_slice(&mut b, &be);
                    prop_assert_eq!(&b, &expect, "{:?}", isa);
                    Ok(())
                })?;
            }
        }
    }

    #[test]
    fn lanes_wrap_without_carry_between_them() {
        let mut w = [0xFFFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_8000_0000];
        add_packed_slice(&mut w, &[0x0000_0001_0000_0001, 0x0000_0001_8000_0000]);
        assert_eq!(w, [0, 0x8000_0000_0000_0000]);
    }
}
