//! Lane kernels: the loops that move 32-bit gradient lanes between network order and the
//! words that hold them, and add them, in bulk (a 4 KB vector add, a Result's pull of sums).
//!
//! A word holds two lanes, lane 0 in its high half, so 8 bytes of big-endian lanes are one
//! big-endian `u64` ([`packed_to_be`]), and a lane-wise add of two words is [`add_packed`].
//! FPISA's shift-and-add of FP32 lanes ([`fpisa_fp32_be`]) lives here too. The loops are
//! plain Rust the compiler vectorises. Each bulk kernel is compiled three times: for the
//! baseline `x86_64` instruction set, with AVX2 (one byte shuffle swaps 32 bytes, where SSE2
//! needs a dozen instructions per 16) and with AVX-512 (64-bit variable arithmetic shifts,
//! which FPISA's kernel needs to vectorise: about +10% on `pfemu bench fpisa`, nothing
//! measurable on Trio-ML). One is picked at run time from the CPU's features; other
//! architectures get the baseline build.
//!
//! The one `unsafe` here is the call of the AVX2 or AVX-512 build, made only after the
//! run-time check that the CPU has those features (the standard library's
//! `is_x86_feature_detected!`).
#![allow(unsafe_code)]

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

/// Defines `$name` as a safe function running `$body` compiled with AVX2 when the CPU has it
/// (checked at run time, the answer cached by the standard library), and without otherwise.
macro_rules! with_avx2 {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn kernel($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq")]
                fn avx512($($arg: $ty),*) {
                    kernel($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    kernel($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                {
                    // SAFETY: `avx512` only needs those AVX-512 subsets, checked just above.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2") {
                    // SAFETY: `avx2` only needs the CPU to support AVX2, checked just above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            kernel($($arg),*)
        }
    };
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

/// True when every FP32 lane of `src` (big-endian, 4 bytes each) is normal or zero: no
/// subnormal, infinity or NaN, so [`fpisa_fp32_be`] may add them.
pub(super) fn fp32_all_plain(src: &[u8]) -> bool {
    src.chunks_exact(4).all(|b| {
        let bits = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let exp = (bits >> 23) & 0xFF;
        (exp != 0 && exp != 0xFF) || bits & 0x7FFF_FFFF == 0
    })
}

with_avx2! {
    /// FPISA's shift-and-add ([`crate::fpisa::Acc::add`], bit for bit: a test compares them)
    /// of FP32 lanes in network order into accumulator words (`words[i]` gets lane `i`;
    /// `src.len() == 4 * words.len()`), for lanes that are normal or zero only (see
    /// [`fp32_all_plain`]). Written without branches, so it vectorises: per lane, both
    /// alignments are computed and the right one selected. `approx` selects FPISA-A.
    /// Adds the events to `events`: overwrites, left shifts, overflows.
    pub(super) fn fpisa_fp32_be(words: &mut [u64], src: &[u8], approx: bool, events: &mut [u64; 3]) {
        assert_eq!(src.len(), words.len() * 4, "4 bytes per lane");
        const LIMIT: i64 = i32::MAX as i64;
        const FLAG_OVERFLOW: u64 = (crate::fpisa::Acc::OVERFLOW as u64) << 40;
        let (mut overwrites, mut left_shifts, mut overflows) = (0u64, 0u64, 0u64);
        for (w, b) in words.iter_mut().zip(src.chunks_exact(4)) {
            let bits = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            let word = *w;
            // The incoming value: exponent (FP32's bias is the accumulator's) and signed
            // significand with the leading one at bit 23; 0 for a zero.
            let e_x = ((bits >> 23) & 0xFF) as i32;
            let sig = ((bits & 0x7F_FFFF) | 0x80_0000) as i32;
            let nonzero = bits & 0x7FFF_FFFF != 0;
            let m_x = if !nonzero { 0 } else if bits >> 31 != 0 { -sig } else { sig };
            let m_a = word as u32 as i32;
            let e_a = ((word >> 32) & 0xFF) as i32;
            let d = e_x - e_a;
            // Incoming smaller (or equal): it is shifted right, in both variants.
            let right_x = i64::from(m_a) + i64::from(m_x >> (-d).clamp(0, 31));
            // Incoming larger: Full shifts the stored mantissa right and takes the incoming
            // exponent; FPISA-A shifts the incoming one left within the headroom, or
            // overwrites past it.
            let right_a = i64::from(m_a >> d.clamp(0, 31)) + i64::from(m_x);
            let left_x = i64::from(m_a) + (i64::from(m_x) << d.clamp(0, 31));
            let headroom = d <= crate::fpisa::HEADROOM as i32;
            let (sum, exp) = if d <= 0 {
                (right_x, e_a)
            } else if !approx {
                (right_a, e_x)
            } else if headroom {
                (left_x, e_a)
            } else {
                (i64::from(m_x), e_x)
            };
            let sat = sum.clamp(-LIMIT, LIMIT);
            let empty = m_a == 0;
            let counted = !empty && nonzero;
            let overflow = counted && sat != sum;
            overwrites += u64::from(counted && approx && d > 0 && !headroom);
            left_shifts += u64::from(counted && approx && d > 0 && headroom);
            overflows += u64::from(overflow);
            let (man, exp) = if empty { (m_x, e_x) } else { (sat as i32, exp) };
            let new = (word & (0xFF << 40))
                | (man as u32 as u64)
                | ((exp as u64 & 0xFF) << 32)
                | if overflow { FLAG_OVERFLOW } else { 0 };
            *w = if nonzero { new } else { word };
        }
        events[0] += overwrites;
        events[1] += left_shifts;
        events[2] += overflows;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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

            let mut back = vec![0; be.len()];
            packed_to_be(&mut back, &deltas);
            prop_assert_eq!(&back, &be);

            let mut a = words.clone();
            add_packed_slice(&mut a, &deltas);
            prop_assert_eq!(&a, &expect);
            let mut b = words.clone();
            add_be_slice(&mut b, &be);
            prop_assert_eq!(&b, &expect);
        }
    }

    #[test]
    fn lanes_wrap_without_carry_between_them() {
        let mut w = [0xFFFF_FFFF_FFFF_FFFF, 0x7FFF_FFFF_8000_0000];
        add_packed_slice(&mut w, &[0x0000_0001_0000_0001, 0x0000_0001_8000_0000]);
        assert_eq!(w, [0, 0x8000_0000_0000_0000]);
    }

    proptest! {
        /// The branch-free kernel is `Acc::add`, bit for bit and event for event, on every
        /// accumulator the engine can hold and every normal or zero FP32 lane.
        #[test]
        fn the_fp32_kernel_is_acc_add(
            cases in proptest::collection::vec(
                (any::<i32>(), 0u8..=255, any::<u8>(), any::<u32>(), 0u32..4), 1..64),
            approx in any::<bool>(),
        ) {
            use crate::fpisa::{Acc, Format, Variant};
            let variant = if approx { Variant::Approx } else { Variant::Full };
            let mut words = Vec::new();
            let mut src = Vec::new();
            let mut want = Vec::new();
            let mut want_events = [0u64; 3];
            for &(man, exp, flags, bits, kind) in &cases {
                // Valid accumulators never hold i32::MIN; inputs are normal or zero, often
                // near the accumulator's exponent so every alignment case comes up.
                let acc = Acc { exp, man: man.max(-i32::MAX), flags: flags & 0x1F };
                let bits = match kind {
                    0 => bits & 0x8000_0000,
                    1 => {
                        let e = (i32::from(exp) + ((bits >> 28) % 20) as i32 - 9).clamp(1, 254);
                        (bits & 0x807F_FFFF) | ((e as u32) << 23)
                    }
                    _ => (bits & 0x807F_FFFF) | (((bits >> 23) & 0xFF).clamp(1, 254) << 23),
                };
                let mut a = acc;
                let e = a.add_bits(bits, Format::Fp32, variant);
                want_events[0] += u64::from(e.overwrite);
                want_events[1] += u64::from(e.left_shift);
                want_events[2] += u64::from(e.overflow);
                want.push(a.to_word());
                words.push(acc.to_word());
                src.extend_from_slice(&bits.to_be_bytes());
            }
            prop_assert!(fp32_all_plain(&src));
            let mut events = [0u64; 3];
            fpisa_fp32_be(&mut words, &src, approx, &mut events);
            prop_assert_eq!(words, want);
            prop_assert_eq!(events, want_events);
        }
    }

    #[test]
    fn special_fp32_lanes_are_not_plain() {
        for bits in [0x0000_0001u32, 0x7F80_0000, 0xFF80_0000, 0x7FC0_0000] {
            assert!(!fp32_all_plain(&bits.to_be_bytes()), "{bits:#x}");
        }
        assert!(fp32_all_plain(&[0x80, 0, 0, 0, 0x3F, 0x80, 0, 0]));
    }
}
