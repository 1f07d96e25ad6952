//! 32-bit lanes in network byte order, in bulk: what an end host does to every gradient it
//! sends or receives (Trio-ML's and FPISA's payloads are arrays of big-endian 32-bit lanes).
//!
//! The loops are compiled for several instruction sets and one is picked at run time, as the
//! engine's own lane kernels are: the baseline `x86_64` build swaps bytes with a dozen SSE2
//! instructions per 16 bytes, where AVX2 and AVX-512 swap a whole register with one shuffle.
//!
//! [`read_be_i32s_streaming`] is [`read_be_i32s`] for a destination far larger than the
//! caches: its AVX2 build writes with streaming (non-temporal) stores. It is the crate's
//! one use of explicit SIMD intrinsics; its `unsafe` is the loads and aligned stores, and
//! the call after the run-time feature check.

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

/// [`read_be_i32s`] with streaming stores, for a destination that is not read again soon:
/// a worker's sums, written a packet at a time over a vector far larger than the caches and
/// read when the allreduce is over.
///
/// A cached store first reads the line it writes from memory (to own it), and the line
/// then pushes another out of the cache. A streaming (non-temporal) store writes whole
/// lines past the caches: each line crosses the memory bus once, not twice. For a
/// destination the caches hold, or that is read right after, it is slower than
/// [`read_be_i32s`]: the lines have to come back from memory.
///
/// The AVX2 build streams (picked at run time as for the other kernels, on AVX-512 CPUs
/// too: the stores, not the register width, are what it saves); other CPUs get
/// [`read_be_i32s`], and so does Miri, which cannot run the streaming store (the standard
/// library writes it as inline assembly). The stores are fenced before it returns, so
/// whatever hands `dst` to another thread afterwards (a lock, a channel, a join) hands
/// them over too.
///
/// # Panics
/// If `src.len() != 4 * dst.len()`.
#[allow(unsafe_code)]
pub fn read_be_i32s_streaming(dst: &mut [i32], src: &[u8]) {
    assert_eq!(src.len(), dst.len() * 4, "4 bytes per lane");
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use crate::isa::{allowed, Isa};
        use std::arch::is_x86_feature_detected as has;
        if allowed(Isa::Avx2) && has!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above; the lengths agree (asserted).
            return unsafe { streaming::avx2(dst, src) };
        }
    }
    read_be_i32s(dst, src)
}

/// The streaming build of [`read_be_i32s_streaming`]: [`read_be_i32s`] (cached) up to the
/// first 32-byte aligned lane of `dst`, then a register at a time (load, swap the bytes of
/// each lane with one shuffle, stream), then [`read_be_i32s`] for the lanes left, then a
/// store fence.
/// Callers pass `src.len() == 4 * dst.len()`.
#[cfg(all(target_arch = "x86_64", not(miri)))]
#[allow(unsafe_code)]
mod streaming {
    use super::read_be_i32s;
    use std::arch::x86_64::*;

    /// Lanes before the first one of `dst` aligned to `align` bytes (all of them, if none is).
    fn head(dst: &[i32], align: usize) -> usize {
        dst.as_ptr().align_offset(align).min(dst.len())
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2(dst: &mut [i32], src: &[u8]) {
        const L: usize = 8;
        let swap = _mm256_set_epi8(
            12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3, //
            12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3,
        );
        let h = head(dst, 4 * L);
        read_be_i32s(&mut dst[..h], &src[..4 * h]);
        let mut i = h;
        while i + L <= dst.len() {
            // SAFETY: lanes `i..i + L` are in `dst` and bytes `4i..4(i + L)` in `src`
            // (`src.len() == 4 * dst.len()`); `dst[i]` is 32-byte aligned (`head`, then
            // whole registers).
            unsafe {
                let v = _mm256_loadu_si256(src.as_ptr().add(4 * i).cast());
                _mm256_stream_si256(dst.as_mut_ptr().add(i).cast(), _mm256_shuffle_epi8(v, swap));
            }
            i += L;
        }
        read_be_i32s(&mut dst[i..], &src[4 * i..]);
        _mm_sfence();
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

    proptest! {
        /// Every build, from every alignment of the destination (the streaming build goes
        /// lane by lane up to an aligned lane), writes exactly the destination's lanes.
        #[test]
        fn the_streaming_read_matches_the_definition_at_every_alignment(
            lanes in proptest::collection::vec(any::<i32>(), 0..200),
            skip in 0usize..16,
        ) {
            let bytes: Vec<u8> = lanes.iter().flat_map(|v| v.to_be_bytes()).collect();
            for isa in ALL {
                let mut out = vec![7i32; skip + lanes.len() + 1];
                let n = lanes.len();
                capped(isa, || read_be_i32s_streaming(&mut out[skip..skip + n], &bytes));
                prop_assert_eq!(&out[skip..skip + n], &lanes[..], "{:?}", isa);
                prop_assert!(out[..skip].iter().all(|&v| v == 7), "{:?}: wrote before", isa);
                prop_assert_eq!(out[skip + n], 7, "{:?}: wrote after", isa);
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

    #[test]
    #[should_panic(expected = "4 bytes per lane")]
    fn the_streaming_read_checks_lengths_too() {
        read_be_i32s_streaming(&mut [0i32; 2], &[0u8; 9]);
    }
}
