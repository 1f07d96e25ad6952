//! FPISA's lane kernels: the shift-and-add of FP32 lanes into accumulator words
//! ([`fpisa_fp32_be`], [`Acc::add`] bit for bit) and the renormalization of sums into FP32
//! ([`fpisa_fp32_values_be`], the paper's MAU5 to MAU8, [`Acc::value`] bit for bit). They work
//! on blocks of 16 lanes in 32-bit arithmetic without branches, so that a block is a few dozen
//! vector instructions, compiled for several instruction sets and picked at run time
//! ([`crate::isa`]). `cargo bench --bench rmw -- fpisa` measures them.

use super::{Acc, Format, FpisaCounts, Variant, HEADROOM, MAN_LIMIT, POINT};
use crate::isa::with_avx2;

/// Whether FP32 bits are a normal number or zero: what [`fpisa_fp32_be`] adds itself.
#[inline(always)]
pub(crate) fn fp32_plain(bits: u32) -> bool {
    fp32_normal(bits) || bits & 0x7FFF_FFFF == 0
}

/// Whether FP32 bits are a normal number (exponent 1 to 254): the lanes an add changes a
/// word for.
#[inline(always)]
fn fp32_normal(bits: u32) -> bool {
    ((bits >> 23) & 0xFF).wrapping_sub(1) < 0xFE
}

with_avx2! {
    /// FPISA's shift-and-add ([`Acc::add`], bit for bit: a test compares them)
    /// of FP32 lanes in network order into accumulator words (`words[i]` gets lane `i`;
    /// `src.len() == 4 * words.len()`). `approx` selects FPISA-A. Adds the events to
    /// `events`: overwrites, left shifts, overflows.
    ///
    /// Lanes that are neither normal nor zero (subnormals, infinities, NaNs: see
    /// [`fp32_plain`]) are left alone, uncounted; the return value says whether there were
    /// any, for the caller to add them the slow way.
    pub(crate) fn fpisa_fp32_be(words: &mut [u64], src: &[u8], approx: bool, events: &mut [u64; 3]) -> bool {
        // Fresh accumulators (every word 0, as a block's buffer is for its first packet):
        // the sums are the lanes themselves. Any other add stops the test at its first
        // word, almost always; a first add tests the rest in vector registers.
        if words.first().is_none_or(|&w| w == 0) && words.iter().fold(0, |a, &w| a | w) == 0 {
            fpisa_fp32_into_empty(words, src)
        } else if approx {
            fpisa_fp32_lanes::<true>(words, src, events)
        } else {
            fpisa_fp32_lanes::<false>(words, src, events)
        }
    }
}

with_avx2! {
    /// The accumulator words the FP32 lanes of `src` (network order) leave when added into
    /// empty accumulators, written over `words` whatever they hold: [`fpisa_fp32_be`]'s fast
    /// path without its test of the words, for a buffer's first contents. Special lanes
    /// leave their word 0; the return value says whether there were any.
    pub(crate) fn fpisa_fp32_fresh_be(words: &mut [u64], src: &[u8]) -> bool {
        fpisa_fp32_into_empty(words, src)
    }
}

/// Lanes per block of the FPISA kernels: a fixed count, so the compiler vectorises each
/// block whole (16 lanes of 32 bits are one AVX-512 register) instead of splitting the
/// loop into a vector part and a scalar tail at a length it does not know.
const BLOCK: usize = 16;

/// The loop both FPISA add kernels run: each word of `words` with its FP32 lane of `src`
/// (network order, `src.len() == 4 * words.len()`), `lane(i, lo, hi, bits)` giving the
/// word's new low half (the mantissa) and high half (exponent, flags) from its old ones,
/// `i` being the lane's position in its block (0 for the lanes past the last whole block).
/// Whole blocks are split into 32-bit halves first and joined at the end, so that the
/// arithmetic runs on 32-bit lanes only, 16 to an AVX-512 register; a fixed block length
/// lets the compiler vectorise a block whole.
#[inline(always)]
fn for_each_lane(
    words: &mut [u64],
    src: &[u8],
    mut lane: impl FnMut(usize, u32, u32, u32) -> (u32, u32),
) {
    assert_eq!(src.len(), words.len() * 4, "4 bytes per lane");
    let mut blocks = words.chunks_exact_mut(BLOCK);
    let mut lanes = src.chunks_exact(4 * BLOCK);
    for (w, s) in (&mut blocks).zip(&mut lanes) {
        let (mut lo, mut hi, mut x) = ([0u32; BLOCK], [0u32; BLOCK], [0u32; BLOCK]);
        for i in 0..BLOCK {
            lo[i] = w[i] as u32;
            hi[i] = (w[i] >> 32) as u32;
            x[i] = u32::from_be_bytes(s[4 * i..4 * i + 4].try_into().expect("4 bytes"));
        }
        for i in 0..BLOCK {
            (lo[i], hi[i]) = lane(i, lo[i], hi[i], x[i]);
        }
        for i in 0..BLOCK {
            w[i] = (u64::from(hi[i]) << 32) | u64::from(lo[i]);
        }
    }
    for (w, s) in blocks
        .into_remainder()
        .iter_mut()
        .zip(lanes.remainder().chunks_exact(4))
    {
        let bits = u32::from_be_bytes(s.try_into().expect("4 bytes"));
        let (lo, hi) = lane(0, *w as u32, (*w >> 32) as u32, bits);
        *w = (u64::from(hi) << 32) | u64::from(lo);
    }
}

/// [`fpisa_fp32_be`] into accumulators that are all empty (every word 0), for either
/// variant: each normal lane's sum is the lane itself (its exponent, and its magnitude with
/// the leading one at bit 23, signed), with nothing to align; zeros and special lanes leave
/// the word 0. Nothing is counted: an add into an empty accumulator overwrites, shifts and
/// overflows nothing. The same words as the full loop (a test compares them) at a fraction
/// of its work: a block's first packet no longer pays for the alignment it does not need.
/// Returns whether there were special lanes, which are left for the caller.
#[inline(always)]
fn fpisa_fp32_into_empty(words: &mut [u64], src: &[u8]) -> bool {
    // Special lanes per lane position, folded once at the end: a fold per block would chain
    // the blocks one after the other.
    let mut specials = [0u32; BLOCK];
    // The words' halves go unread (they are 0), so the compiler drops their loads.
    for_each_lane(words, src, |i, _, _, bits| {
        let (lo, hi, special) = fp32_into_empty_lane(bits);
        specials[i] |= special;
        (lo, hi)
    });
    specials.iter().any(|&s| s != 0)
}

/// One lane of [`fpisa_fp32_into_empty`]: the accumulator's halves (mantissa, exponent) of
/// FP32 `bits` added into an empty one, and 1 for a special lane (left 0 for the caller).
#[inline(always)]
fn fp32_into_empty_lane(bits: u32) -> (u32, u32, u32) {
    let plain = fp32_plain(bits);
    let magnitude = ((bits & 0x7F_FFFF) | 0x80_0000) as i32;
    let man = if bits >> 31 != 0 {
        -magnitude
    } else {
        magnitude
    };
    let added = plain && bits & 0x7FFF_FFFF != 0;
    if added {
        (man as u32, (bits >> 23) & 0xFF, 0)
    } else {
        (0, 0, u32::from(!plain))
    }
}

/// [`fpisa_fp32_be`]'s add into live sums, for one variant: [`fpisa_fp32_lane`] on every
/// lane, counting the events per lane position.
#[inline(always)]
fn fpisa_fp32_lanes<const APPROX: bool>(
    words: &mut [u64],
    src: &[u8],
    events: &mut [u64; 3],
) -> bool {
    // Event counts per lane position, summed once at the end.
    let mut counts = [[0u32; BLOCK]; 4];
    for_each_lane(words, src, |i, lo, hi, bits| {
        let (lo, hi, e) = fpisa_fp32_lane::<APPROX>(lo, hi, bits);
        for (c, happened) in counts.iter_mut().zip(e) {
            c[i] += u32::from(happened);
        }
        (lo, hi)
    });
    for (e, c) in events.iter_mut().zip(&counts) {
        *e += c.iter().map(|&n| u64::from(n)).sum::<u64>();
    }
    counts[3].iter().any(|&n| n != 0)
}

/// One lane of [`fpisa_fp32_be`]: FP32 `bits` added to the accumulator word whose low half
/// (the mantissa) is `lo` and high half (exponent, flags above it) is `hi`. Returns the new
/// halves and the events: overwrite, left shift, overflow, special lane (not added). Written
/// without branches so that a block of lanes vectorises: the alignment shifts are computed
/// for every case and the right ones selected, and the sum's overflow is found from the signs
/// (both operands are at most `MAN_LIMIT` in magnitude, so a sum that wrapped has the wrong
/// sign). The events are flags, not bits of one word: counted, each is a vector compare's
/// mask added in, where bits cost a shift and a mask per event. Only a normal lane is added,
/// so a zero's magnitude is not masked to 0. Together 68 to 59 instructions per 16 lanes
/// (FPISA-A 79 to 72), 1.17x (`cargo bench --bench rmw -- fpisa/add_full`, 6 rounds
/// interleaved).
#[inline(always)]
fn fpisa_fp32_lane<const APPROX: bool>(lo: u32, hi: u32, bits: u32) -> (u32, u32, [bool; 4]) {
    const FLAG_OVERFLOW: u32 = (Acc::OVERFLOW as u32) << 8;
    // The incoming value as MAU0/MAU1 leave it: exponent (FP32's bias is the
    // accumulator's), the sign bit, and the unsigned magnitude with the leading one at bit
    // 23. Only a normal lane is added (a zero leaves the word alone, as a special lane
    // does), so a zero's magnitude need not be 0: it is never used.
    let e_x = ((bits >> 23) & 0xFF) as i32;
    let normal = fp32_normal(bits);
    let plain = fp32_plain(bits);
    let magnitude = ((bits & 0x7F_FFFF) | 0x80_0000) as i32;
    let m_a = lo as i32;
    let empty = m_a == 0;
    // An empty accumulator holds zero at no exponent in particular: aligned at the
    // incoming exponent, nothing is shifted and the sum is the incoming value.
    let e_a = if empty { e_x } else { (hi & 0xFF) as i32 };
    let d = e_x - e_a;
    // MAU2/MAU3: the smaller side is shifted right: the incoming one in both variants, as a
    // magnitude (so it truncates), the stored one only by Full (the shift-and-add unit, MAU4:
    // two's complement, so it floors), which then takes the incoming exponent. FPISA-A
    // instead shifts a larger incoming magnitude left within the headroom (exact), or
    // overwrites past it.
    let ahead = d > 0;
    let headroom = d <= HEADROOM as i32;
    let right = magnitude >> (-d).clamp(0, 31);
    let (a, x_mag, exp) = if !APPROX {
        (m_a >> d.clamp(0, 31), right, e_a.max(e_x))
    } else if !ahead {
        (m_a, right, e_a)
    } else if headroom {
        (m_a, magnitude << d.min(HEADROOM as i32), e_a)
    } else {
        (0, magnitude, e_x)
    };
    // MAU4 adds or subtracts by the sign bit.
    let x = if bits >> 31 != 0 { -x_mag } else { x_mag };
    let sum = a.wrapping_add(x);
    let wrapped = (a ^ sum) & (x ^ sum) < 0;
    let man = if wrapped {
        if a < 0 {
            -MAN_LIMIT
        } else {
            MAN_LIMIT
        }
    } else {
        sum.max(-MAN_LIMIT)
    };
    let added = normal;
    let counted = !empty && added;
    let overflow = counted && (wrapped || sum == i32::MIN);
    let events = [
        APPROX && counted && ahead && !headroom,
        APPROX && counted && ahead && headroom,
        overflow,
        !plain,
    ];
    // The flags are kept (the overflow flag added); the bits above them are cleared.
    let new_hi = (hi & 0xFF00) | exp as u32 | if overflow { FLAG_OVERFLOW } else { 0 };
    if added {
        (man as u32, new_hi, events)
    } else {
        (lo, hi, events)
    }
}

with_avx2! {
    /// [`Acc::value`] in FP32 of accumulator words held in network order
    /// (`src`, 8 bytes each), into FP32 lanes in network order (`dst`, 4 bytes each;
    /// `src.len() == 2 * dst.len()`): FPISA's renormalization (the paper's MAU5 to MAU8),
    /// bit for bit (a test compares them), written without branches so it vectorises.
    pub(crate) fn fpisa_fp32_values_be(dst: &mut [u8], src: &[u8]) {
        assert_eq!(src.len(), dst.len() * 2, "8 bytes per accumulator, 4 per FP32 lane");
        assert_eq!(dst.len() % 4, 0, "4 bytes per FP32 lane");
        let lane = |o: &mut [u8], b: &[u8]| {
            let hi = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            let lo = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            o.copy_from_slice(&fp32_value(lo, hi).to_be_bytes());
        };
        let mut out = dst.chunks_exact_mut(4 * BLOCK);
        let mut words = src.chunks_exact(8 * BLOCK);
        for (o, w) in (&mut out).zip(&mut words) {
            let mut v = [0u32; BLOCK];
            for (i, v) in v.iter_mut().enumerate() {
                let hi = u32::from_be_bytes(w[8 * i..8 * i + 4].try_into().expect("4 bytes"));
                let lo = u32::from_be_bytes(w[8 * i + 4..8 * i + 8].try_into().expect("4 bytes"));
                *v = fp32_value(lo, hi);
            }
            for (o, v) in o.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&v.to_be_bytes());
            }
        }
        let rest = out.into_remainder().chunks_exact_mut(4);
        for (o, w) in rest.zip(words.remainder().chunks_exact(8)) {
            lane(o, w);
        }
    }
}

with_avx2! {
    /// [`fpisa_fp32_values_be`] where the words lie: `buf` holds accumulator words in network
    /// order (8 bytes each), and their FP32 values (network order, 4 bytes each) are left in
    /// its first half, bit for bit those of [`fpisa_fp32_values_be`] (a test compares them).
    /// A Result builder renormalizes the words it pulled into local memory so, without a
    /// copy of them first: each block's values go below its words, over words already read.
    pub(crate) fn fpisa_fp32_values_be_in_place(buf: &mut [u8]) {
        assert_eq!(buf.len() % 8, 0, "8 bytes per accumulator");
        let n = buf.len() / 8;
        let blocks = n / BLOCK;
        for b in 0..blocks {
            // The block's words are read whole before its values are written; a block's
            // values end where its words begin, or (the first block) inside them.
            let w: [u8; 8 * BLOCK] = buf[8 * BLOCK * b..8 * BLOCK * (b + 1)]
                .try_into()
                .expect("a block of words");
            let mut v = [0u8; 4 * BLOCK];
            for (i, v) in v.chunks_exact_mut(4).enumerate() {
                let hi = u32::from_be_bytes(w[8 * i..8 * i + 4].try_into().expect("4 bytes"));
                let lo = u32::from_be_bytes(w[8 * i + 4..8 * i + 8].try_into().expect("4 bytes"));
                v.copy_from_slice(&fp32_value(lo, hi).to_be_bytes());
            }
            buf[4 * BLOCK * b..4 * BLOCK * (b + 1)].copy_from_slice(&v);
        }
        for i in blocks * BLOCK..n {
            let hi = u32::from_be_bytes(buf[8 * i..8 * i + 4].try_into().expect("4 bytes"));
            let lo = u32::from_be_bytes(buf[8 * i + 4..8 * i + 8].try_into().expect("4 bytes"));
            buf[4 * i..4 * i + 4].copy_from_slice(&fp32_value(lo, hi).to_be_bytes());
        }
    }
}

with_avx2! {
    /// [`fpisa_fp32_values_be`] of accumulator words as memory holds them (`words`, native
    /// `u64`s, [`Acc::to_word`]'s layout) into FP32 lanes in network order (`dst`, 4 bytes
    /// each; `dst.len() == 4 * words.len()`), bit for bit (a test compares them): a read of
    /// sums and their renormalization in one pass, without their copy into network order.
    pub(crate) fn fpisa_fp32_values_of_words(dst: &mut [u8], words: &[u64]) {
        assert_eq!(dst.len(), 4 * words.len(), "4 bytes per FP32 lane");
        let mut out = dst.chunks_exact_mut(4 * BLOCK);
        let mut ws = words.chunks_exact(BLOCK);
        for (o, w) in (&mut out).zip(&mut ws) {
            // The block's words as bytes, split into halves as the kernel of network order
            // splits them (its loads vectorise on every build; shifts of `u64`s did not on
            // AVX2).
            let mut b = [0u8; 8 * BLOCK];
            for (b, w) in b.chunks_exact_mut(8).zip(w) {
                b.copy_from_slice(&w.to_le_bytes());
            }
            let mut v = [0u32; BLOCK];
            for (i, v) in v.iter_mut().enumerate() {
                let lo = u32::from_le_bytes(b[8 * i..8 * i + 4].try_into().expect("4 bytes"));
                let hi = u32::from_le_bytes(b[8 * i + 4..8 * i + 8].try_into().expect("4 bytes"));
                *v = fp32_value(lo, hi);
            }
            for (o, v) in o.chunks_exact_mut(4).zip(v) {
                o.copy_from_slice(&v.to_be_bytes());
            }
        }
        for (o, &w) in out.into_remainder().chunks_exact_mut(4).zip(ws.remainder()) {
            o.copy_from_slice(&fp32_value(w as u32, (w >> 32) as u32).to_be_bytes());
        }
    }
}

/// One lane of [`fpisa_fp32_values_be`]: `Acc::from_word(word).value(Format::Fp32)` of the
/// word with low half `lo` (the mantissa) and high half `hi` (exponent, flags), without
/// branches and in 32-bit arithmetic only.
#[inline(always)]
fn fp32_value(lo: u32, hi: u32) -> u32 {
    const NAN: u32 = 0x7FC0_0000;
    const INF: u32 = 0x7F80_0000;
    const SIGN: u32 = 0x8000_0000;
    let flags = (hi >> 8) as u8;
    // The finite part. i32::MIN reads as -(2^31 - 1), as in `Acc::value`.
    let man = (lo as i32).max(-MAN_LIMIT);
    // MAU5: sign and magnitude.
    let negative = man < 0;
    let magnitude = man.unsigned_abs();
    // MAU6: the leading one's distance from bit POINT, as the LPM table gives it
    // (`leading_one_shift`); FP32's 23 fraction bits are the accumulator's POINT, so that
    // shift of the magnitude (truncating it) is all the renormalization takes.
    let shift = 31 - magnitude.leading_zeros() as i32 - POINT as i32;
    let significand = if shift >= 0 {
        magnitude >> shift.min(31)
    } else {
        magnitude << (-shift).min(31)
    };
    // MAU7: FP32's bias is the accumulator's.
    let exp = (hi & 0xFF) as i32 + shift;
    // MAU8: assemble, with exponent overflow to infinity and underflow to zero.
    let sign = if negative { SIGN } else { 0 };
    let finite = if exp >= 0xFF {
        sign | INF
    } else if exp <= 0 {
        sign
    } else {
        sign | ((exp as u32) << POINT) | (significand & ((1 << POINT) - 1))
    };
    let both_inf = Acc::POS_INF | Acc::NEG_INF;
    if flags & Acc::NAN != 0 || flags & both_inf == both_inf {
        NAN
    } else if flags & Acc::POS_INF != 0 {
        INF
    } else if flags & Acc::NEG_INF != 0 {
        SIGN | INF
    } else if magnitude == 0 {
        0
    } else {
        finite
    }
}

/// What an FPISA request adds its lanes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AddTo {
    /// The accumulators the words hold.
    Sums,
    /// Empty accumulators: each word is set to what adding its lane into an empty one
    /// leaves (what zeroing the words and then adding would leave, with the same counts),
    /// whatever it held, in one pass that reads none of them.
    Empty,
}

/// FPISA's shift-and-add of the FP32 lanes of `src` (network order) into the accumulator
/// words `words` (`src.len() == 4 * words.len()`) or into empty ones (`into`), counting
/// into `counts`: the vectorised kernel, then the rare special lanes (subnormals,
/// infinities, NaNs) it leaves alone, one by one. Exactly [`Acc::add_bits`] per lane.
pub(crate) fn add_fp32_words(
    words: &mut [u64],
    src: &[u8],
    variant: Variant,
    into: AddTo,
    counts: &mut FpisaCounts,
) {
    let mut events = [0u64; 3];
    let specials = match into {
        AddTo::Sums => fpisa_fp32_be(words, src, variant == Variant::Approx, &mut events),
        AddTo::Empty => fpisa_fp32_fresh_be(words, src),
    };
    if specials {
        add_special_lanes(words, src, variant, &mut events);
    }
    counts.adds += words.len() as u64;
    counts.overwrites += events[0];
    counts.left_shifts += events[1];
    counts.overflows += events[2];
}

/// The lanes the kernels leave alone (neither normal nor zero), added one by one with
/// [`Acc::add_bits`], their events into `events`.
#[cold]
fn add_special_lanes(words: &mut [u64], src: &[u8], variant: Variant, events: &mut [u64; 3]) {
    for (w, lane) in words.iter_mut().zip(src.chunks_exact(4)) {
        let bits = u32::from_be_bytes([lane[0], lane[1], lane[2], lane[3]]);
        if !fp32_plain(bits) {
            let mut acc = Acc::from_word(*w);
            let e = acc.add_bits(bits, Format::Fp32, variant);
            *w = acc.to_word();
            events[0] += u64::from(e.overwrite);
            events[1] += u64::from(e.left_shift);
            events[2] += u64::from(e.overflow);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fpisa::paper;
    use crate::isa::test_isa::{capped, ALL};
    use proptest::prelude::*;

    /// `fpisa_fp32_be` of `src` into a copy of `words` with every build (see
    /// [`test_isa`]): each build's words and events, which must all agree.
    fn fpisa_every_build(
        words: &[u64],
        src: &[u8],
        approx: bool,
    ) -> Result<(Vec<u64>, [u64; 3], bool), TestCaseError> {
        let runs: Vec<_> = ALL
            .iter()
            .map(|&isa| {
                capped(isa, || {
                    let mut w = words.to_vec();
                    let mut events = [0u64; 3];
                    let specials = fpisa_fp32_be(&mut w, src, approx, &mut events);
                    (w, events, specials)
                })
            })
            .collect();
        for (isa, run) in ALL.iter().zip(&runs) {
            prop_assert_eq!(run, &runs[0], "{:?} and {:?} differ", isa, ALL[0]);
        }
        Ok(runs[0].clone())
    }

    /// `fpisa_fp32_values_be` with every build, checked to agree.
    fn values_every_build(src: &[u8]) -> Result<Vec<u8>, TestCaseError> {
        let runs: Vec<Vec<u8>> = ALL
            .iter()
            .map(|&isa| {
                capped(isa, || {
                    let mut got = vec![0u8; src.len() / 2];
                    fpisa_fp32_values_be(&mut got, src);
                    got
                })
            })
            .collect();
        for (isa, run) in ALL.iter().zip(&runs) {
            prop_assert_eq!(run, &runs[0], "{:?} and {:?} differ", isa, ALL[0]);
        }
        Ok(runs[0].clone())
    }

    /// `fpisa_fp32_values_be_in_place` with every build, checked to agree: the values it
    /// leaves in the first half of a copy of `src`.
    fn values_in_place_every_build(src: &[u8]) -> Result<Vec<u8>, TestCaseError> {
        let runs: Vec<Vec<u8>> = ALL
            .iter()
            .map(|&isa| {
                capped(isa, || {
                    let mut buf = src.to_vec();
                    fpisa_fp32_values_be_in_place(&mut buf);
                    buf.truncate(src.len() / 2);
                    buf
                })
            })
            .collect();
        for (isa, run) in ALL.iter().zip(&runs) {
            prop_assert_eq!(run, &runs[0], "{:?} and {:?} differ", isa, ALL[0]);
        }
        Ok(runs[0].clone())
    }

    proptest! {
        /// The branch-free kernel is `Acc::add`, bit for bit and event for event, on every
        /// accumulator the engine can hold and every normal or zero FP32 lane; it leaves
        /// the words of special lanes alone and says that there were some. Accumulators and
        /// lanes take either sign and lanes come within 9 binades of the accumulator, so
        /// negative lanes are shifted right (MAU3), and shift negative stored values
        /// (Full) or are shifted left (FPISA-A), in most cases. Every build.
        #[test]
        fn the_fp32_kernel_is_acc_add(
            cases in proptest::collection::vec(
                (any::<i32>(), 0u8..=255, any::<u8>(), any::<u32>(), 0u32..9), 1..80),
            approx in any::<bool>(),
        ) {
            use crate::fpisa::{Acc, Format, Variant};
            let variant = if approx { Variant::Approx } else { Variant::Full };
            let mut words = Vec::new();
            let mut src = Vec::new();
            let mut want = Vec::new();
            let mut want_events = [0u64; 3];
            let mut any_special = false;
            for &(man, exp, flags, bits, kind) in &cases {
                // Valid accumulators never hold i32::MIN, and one in eight is empty (its sums
                // cancelled: no mantissa, an exponent left over) among live ones; inputs are
                // normal or zero, often near the accumulator's exponent so every alignment
                // case comes up, and now and then special.
                let man = if flags >> 5 == 7 { 0 } else { man.max(-i32::MAX) };
                let acc = Acc { exp, man, flags: flags & 0x1F };
                let bits = match kind {
                    0 => bits & 0x8000_0000,
                    1..=3 => {
                        let e = (i32::from(exp) + ((bits >> 28) % 20) as i32 - 9).clamp(1, 254);
                        (bits & 0x807F_FFFF) | ((e as u32) << 23)
                    }
                    4 => (bits & 0x807F_FFFF).max(1), // subnormal
                    5 => (bits & 0x8000_0000) | 0x7F80_0000 | (bits & 0x7F_FFFF), // Inf, NaN
                    _ => (bits & 0x807F_FFFF) | (((bits >> 23) & 0xFF).clamp(1, 254) << 23),
                };
                if fp32_plain(bits) {
                    let mut a = acc;
                    let e = a.add_bits(bits, Format::Fp32, variant);
                    want_events[0] += u64::from(e.overwrite);
                    want_events[1] += u64::from(e.left_shift);
                    want_events[2] += u64::from(e.overflow);
                    want.push(a.to_word());
                } else {
                    any_special = true;
                    want.push(acc.to_word());
                }
                words.push(acc.to_word());
                src.extend_from_slice(&bits.to_be_bytes());
            }
            let (words, events, specials) = fpisa_every_build(&words, &src, approx)?;
            prop_assert_eq!(words, want);
            prop_assert_eq!(events, want_events);
            prop_assert_eq!(specials, any_special);
        }

        /// Into empty accumulators (the fast path every build takes when all the words are
        /// 0), the kernel is the full loop and `Acc::add`: the same words, no events, the
        /// same answer about special lanes, for lanes of every kind, both variants.
        #[test]
        fn the_fp32_kernel_into_empty_accumulators_is_the_full_loop(
            lanes in proptest::collection::vec((any::<u32>(), 0u32..6), 1..80),
            approx in any::<bool>(),
        ) {
            use crate::fpisa::{Acc, Format, Variant};
            let variant = if approx { Variant::Approx } else { Variant::Full };
            let src: Vec<u8> = lanes
                .iter()
                .map(|&(bits, kind)| match kind {
                    0 => bits & 0x8000_0000,                          // either zero
                    1 => (bits & 0x807F_FFFF).max(1),                 // subnormal
                    2 => bits | 0x7F80_0000,                          // Inf, NaN
                    _ => (bits & 0x807F_FFFF) | (((bits >> 23) & 0xFF).clamp(1, 254) << 23),
                })
                .flat_map(u32::to_be_bytes)
                .collect();
            let zeros = vec![0u64; lanes.len()];
            let (words, events, specials) = fpisa_every_build(&zeros, &src, approx)?;
            // The full loop on the same words, which the dispatch no longer picks for them.
            let mut full = zeros.clone();
            let mut full_events = [0u64; 3];
            let full_specials = if approx {
                fpisa_fp32_lanes::<true>(&mut full, &src, &mut full_events)
            } else {
                fpisa_fp32_lanes::<false>(&mut full, &src, &mut full_events)
            };
            prop_assert_eq!(&words, &full);
            prop_assert_eq!(events, full_events);
            prop_assert_eq!(events, [0; 3]);
            prop_assert_eq!(specials, full_specials);
            for (w, lane) in words.iter().zip(src.chunks_exact(4)) {
                let bits = u32::from_be_bytes([lane[0], lane[1], lane[2], lane[3]]);
                let want = if fp32_plain(bits) {
                    let mut a = Acc::from_word(0);
                    a.add_bits(bits, Format::Fp32, variant);
                    a.to_word()
                } else {
                    0
                };
                prop_assert_eq!(*w, want, "lane {:#010x}", bits);
            }
        }

        /// Writing lanes over any words leaves what zeroing the words and adding the lanes
        /// leaves, with the same counts: lanes of every kind (specials included), both
        /// variants, every build.
        #[test]
        fn writing_fp32_lanes_is_adding_them_into_zeros(
            lanes in proptest::collection::vec((any::<u32>(), 0u32..6, any::<u64>()), 1..80),
            approx in any::<bool>(),
        ) {
            use crate::fpisa::{FpisaCounts, Variant};
            let variant = if approx { Variant::Approx } else { Variant::Full };
            let src: Vec<u8> = lanes
                .iter()
                .map(|&(bits, kind, _)| match kind {
                    0 => bits & 0x8000_0000,
                    1 => (bits & 0x807F_FFFF).max(1),
                    2 => bits | 0x7F80_0000,
                    _ => (bits & 0x807F_FFFF) | (((bits >> 23) & 0xFF).clamp(1, 254) << 23),
                })
                .flat_map(u32::to_be_bytes)
                .collect();
            let old: Vec<u64> = lanes.iter().map(|&(_, _, w)| w).collect();
            let mut want = vec![0u64; lanes.len()];
            let mut want_counts = FpisaCounts::default();
            add_fp32_words(&mut want, &src, variant, AddTo::Sums, &mut want_counts);
            for isa in ALL {
                let (words, counts) = capped(isa, || {
                    let mut w = old.clone();
                    let mut c = FpisaCounts::default();
                    add_fp32_words(&mut w, &src, variant, AddTo::Empty, &mut c);
                    (w, c)
                });
                prop_assert_eq!(&words, &want, "{:?}", isa);
                prop_assert_eq!(counts, want_counts, "{:?}", isa);
            }
        }

        /// The bulk renormalization is `Acc::value` in FP32, bit for bit, on any word: every
        /// flag combination, exponents that overflow or underflow FP32, i32::MIN; both
        /// signs. Every build.
        #[test]
        fn the_fp32_values_kernel_is_acc_value(
            cases in proptest::collection::vec((any::<i32>(), any::<u8>(), any::<u8>(), 0u32..6), 1..80),
        ) {
            use crate::fpisa::{Acc, Format};
            let mut src = Vec::new();
            let mut want = Vec::new();
            for &(man, exp, flags, kind) in &cases {
                let flags = if kind == 0 { flags & 0x1F } else { flags & Acc::OVERFLOW };
                let man = match kind {
                    1 => man >> (man as u32 % 31),
                    2 => 0,
                    3 => i32::MIN,
                    _ => man,
                };
                let word = Acc { exp, man, flags }.to_word();
                src.extend_from_slice(&word.to_be_bytes());
                want.extend_from_slice(&Acc::from_word(word).value(Format::Fp32).to_be_bytes());
            }
            prop_assert_eq!(values_every_build(&src)?, want);
        }

        /// The renormalization in place leaves the values the one into another buffer
        /// makes, for any count of words (whole blocks of 16 and a remainder), every build.
        #[test]
        fn the_fp32_values_kernel_in_place_is_the_one_into_a_buffer(
            words in proptest::collection::vec(any::<u64>(), 0..100),
        ) {
            let src: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            prop_assert_eq!(values_in_place_every_build(&src)?, values_every_build(&src)?);
        }

        /// Renormalizing words as memory holds them gives the values of the same words in
        /// network order, bit for bit, every build.
        #[test]
        fn the_fp32_values_kernel_of_words_is_the_one_of_network_order(
            words in proptest::collection::vec(any::<u64>(), 0..100),
        ) {
            let src: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            let want = values_every_build(&src)?;
            for isa in ALL {
                let got = capped(isa, || {
                    let mut got = vec![0u8; 4 * words.len()];
                    fpisa_fp32_values_of_words(&mut got, &words);
                    got
                });
                prop_assert_eq!(&got, &want, "{:?}", isa);
            }
        }

        /// The kernels against the paper's dataflow directly (`crate::fpisa::paper`, written
        /// from the paper alone), every build: rounds of gradient-like FP32 lanes (either
        /// sign, 31 binades, some zeros) added into words that start empty or hold any
        /// valid register, then read as FP32. After each round every word is the paper's
        /// register (the overflow flag set once the paper's MAU4 overflowed) and the events
        /// are the paper's.
        #[test]
        fn the_fp32_kernels_are_the_papers_dataflow(
            starts in proptest::collection::vec(
                prop_oneof![Just((0u8, 0i32)), (100u8..=160, -i32::MAX..=i32::MAX)], 1..40),
            rounds in proptest::collection::vec(
                proptest::collection::vec((any::<bool>(), 115u32..=145, 0..1u32 << 23, 0..16u8), 40),
                1..12),
            approx in any::<bool>(),
        ) {
            use crate::fpisa::Acc;
            let variant = if approx { paper::Variant::Approx } else { paper::Variant::Full };
            let mut regs: Vec<paper::Register> =
                starts.iter().map(|&(exp, man)| paper::Register { exp, man }).collect();
            let mut flagged = vec![false; regs.len()];
            let mut words: Vec<u64> = starts
                .iter()
                .map(|&(exp, man)| Acc { exp, man, flags: 0 }.to_word())
                .collect();
            for round in &rounds {
                let bits: Vec<u32> = round[..regs.len()]
                    .iter()
                    .map(|&(neg, e, f, z)| {
                        let sign = u32::from(neg) << 31;
                        if z == 0 { sign } else { sign | (e << 23) | f }
                    })
                    .collect();
                let src: Vec<u8> = bits.iter().flat_map(|b| b.to_be_bytes()).collect();
                let mut want_events = [0u64; 3];
                for ((reg, flag), &b) in regs.iter_mut().zip(&mut flagged).zip(&bits) {
                    let o = paper::add(reg, b, variant);
                    want_events[0] += u64::from(o.overwrite);
                    want_events[1] += u64::from(o.left_shift);
                    want_events[2] += u64::from(o.overflow);
                    *flag |= o.overflow;
                }
                let (after, events, specials) = fpisa_every_build(&words, &src, approx)?;
                prop_assert!(!specials);
                prop_assert_eq!(events, want_events);
                for (i, (&w, reg)) in after.iter().zip(&regs).enumerate() {
                    let acc = Acc::from_word(w);
                    prop_assert_eq!((acc.exp, acc.man), (reg.exp, reg.man), "lane {}", i);
                    let flags = if flagged[i] { Acc::OVERFLOW } else { 0 };
                    prop_assert_eq!(acc.flags, flags, "lane {}", i);
                }
                words = after;
            }
            let be: Vec<u8> = words.iter().flat_map(|w| w.to_be_bytes()).collect();
            let want: Vec<u8> = regs.iter().flat_map(|&r| paper::read(r).to_be_bytes()).collect();
            prop_assert_eq!(values_every_build(&be)?, want);
        }
    }

    /// Negative lanes that need a shift, in both directions, in every build, against
    /// `Acc::add` and the paper: a grid of accumulators (both signs, odd low bits) and lanes
    /// (both signs, odd low bits) 1 to 30 binades below or above them, both variants.
    #[test]
    fn negative_lanes_needing_shifts_in_both_directions() {
        use crate::fpisa::{Acc, Format, Variant};
        let (mut words, mut src) = (Vec::new(), Vec::new());
        let mut cases = Vec::new();
        for acc_man in [
            0x00C0_0001,
            -0x00C0_0001,
            0x0123_4567,
            -0x0123_4567,
            -0x0080_0000,
        ] {
            for gap in (-30..=30i32).filter(|&g| g != 0) {
                for lane_sign in [0u32, 0x8000_0000] {
                    let acc = Acc {
                        exp: 130,
                        man: acc_man,
                        flags: 0,
                    };
                    let bits = lane_sign | ((130 + gap) as u32) << 23 | 0x0055_5555;
                    words.push(acc.to_word());
                    src.extend_from_slice(&bits.to_be_bytes());
                    cases.push((acc, bits));
                }
            }
        }
        let mut lost = [0, 0];
        for (approx, variant, pv) in [
            (false, Variant::Full, paper::Variant::Full),
            (true, Variant::Approx, paper::Variant::Approx),
        ] {
            let (got, _, _) = fpisa_every_build(&words, &src, approx).unwrap();
            for (&(acc, bits), &w) in cases.iter().zip(&got) {
                let mut a = acc;
                a.add_bits(bits, Format::Fp32, variant);
                let mut reg = paper::Register {
                    exp: acc.exp,
                    man: acc.man,
                };
                paper::add(&mut reg, bits, pv);
                assert_eq!(w, a.to_word(), "{variant:?} {acc:?} + {bits:#010x}");
                assert_eq!(
                    (a.exp, a.man),
                    (reg.exp, reg.man),
                    "{variant:?} {bits:#010x}"
                );
                // Lanes that lose bits to the shift, by sign: the case this test is for.
                let below = (bits >> 23) & 0xFF < 130;
                if below && bits >> 31 != 0 {
                    lost[0] += 1;
                } else if !below && acc.man < 0 && !approx {
                    lost[1] += 1;
                }
            }
        }
        assert!(lost[0] > 100 && lost[1] > 100, "{lost:?}");
    }

    /// Sums landing on and around the saturation limits (too rare for random inputs): the
    /// kernel saturates and flags exactly as `Acc::add` does.
    #[test]
    fn the_fp32_kernel_saturates_like_acc_add() {
        use crate::fpisa::{Acc, Format, Variant};
        let (mut words, mut src, mut want) = (Vec::new(), Vec::new(), Vec::new());
        for target in [
            -(1i64 << 31) - 1,
            -(1 << 31),
            -(1 << 31) + 1,
            (1 << 31) - 2,
            (1 << 31) - 1,
            1 << 31,
        ] {
            for sig in [0x80_0000i64, 0x80_0001, 0xFF_FFFF] {
                for negative in [false, true] {
                    let x = if negative { -sig } else { sig };
                    let Ok(man) = i32::try_from(target - x) else {
                        continue;
                    };
                    if man == i32::MIN {
                        continue;
                    }
                    let acc = Acc {
                        exp: 150,
                        man,
                        flags: 0,
                    };
                    let bits = (u32::from(negative) << 31) | (150 << 23) | (sig as u32 & 0x7F_FFFF);
                    let mut a = acc;
                    a.add_bits(bits, Format::Fp32, Variant::Full);
                    words.push(acc.to_word());
                    src.extend_from_slice(&bits.to_be_bytes());
                    want.push(a.to_word());
                }
            }
        }
        assert!(want
            .iter()
            .any(|&w| Acc::from_word(w).flags & Acc::OVERFLOW != 0));
        assert!(want
            .iter()
            .any(|&w| Acc::from_word(w).flags & Acc::OVERFLOW == 0));
        let mut events = [0u64; 3];
        fpisa_fp32_be(&mut words, &src, false, &mut events);
        assert_eq!(words, want);
        let flagged = want
            .iter()
            .filter(|&&w| Acc::from_word(w).flags & Acc::OVERFLOW != 0);
        assert_eq!(events[2], flagged.count() as u64);
    }

    #[test]
    fn special_fp32_lanes_are_not_plain() {
        for bits in [
            0x0000_0001u32,
            0x807F_FFFF,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
        ] {
            assert!(!fp32_plain(bits), "{bits:#x}");
        }
        for bits in [0, 0x8000_0000, 0x3F80_0000, 0x0080_0000, 0xFF7F_FFFF] {
            assert!(fp32_plain(bits), "{bits:#x}");
        }
    }
}
