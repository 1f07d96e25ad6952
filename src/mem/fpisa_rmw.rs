//! The FPISA shift-and-add in the read-modify-write engines.
//!
//! FPISA (NSDI 2022, §4.2) asks for a memory unit that shifts a stored mantissa and adds to it
//! in one atomic step: Tofino's stateful ALUs cannot, which is why it runs the approximate
//! FPISA-A. Trio's read-modify-write engines sit next to the memory already, so that is where
//! the operation goes here: each accumulator is one 8-byte word in [`crate::fpisa::Acc`]'s
//! layout (exponent, 32-bit two's-complement mantissa, sticky flags), and an add decomposes
//! the incoming value, aligns, adds and stores it as one atomic update of the word, in either
//! variant ([`Variant::Full`] or FPISA-A, [`Variant::Approx`]). The arithmetic is
//! [`Acc::add`]'s (the paper's dataflow bit for bit, rounding included: see
//! [`crate::fpisa`]), per word or in the vectorised kernel of `fpisa/lanes.rs`, which tests compare
//! with it and with a reference written from the paper.
//!
//! Atomicity is per word, as for the other vector operations: in SRAM and DRAM a word's
//! update is a compare-and-swap loop; in the accumulator region it is done under the word's
//! stripe lock (one lock for all the lanes of a request in a stripe). Concurrent adds never
//! lose or tear an update; they land in some order, and since an FPISA sum can depend on the
//! order of its additions (each alignment rounds), so can the result, unless every value is
//! exact at the accumulator's precision (integer-valued gradients of a narrow range, say).

use super::bank::update;
use super::{Addr, MemFault, SharedMemory, LINE_WORDS};
use crate::fpisa::lanes::{
    add_fp32_words, fpisa_fp32_values_be, fpisa_fp32_values_of_words, AddTo,
};
use crate::fpisa::{self, Acc, Decomposed, Events, Format, FpisaCounts, Variant};

/// Most lanes one [`SharedMemory::fpisa_add_lanes`] or [`SharedMemory::fpisa_add_be`] request
/// carries: 1024 (a 1024-gradient packet; 8 KB of accumulator words).
pub const MAX_FPISA_LANES: usize = 1024;

/// Bytes of one lane of `fmt` in a packet.
fn lane_bytes(fmt: Format) -> usize {
    (fmt.width() / 8) as usize
}

/// The `i`th lane of big-endian `data`.
#[inline]
fn be_lane(data: &[u8], i: usize, width: usize) -> u32 {
    let b = &data[i * width..(i + 1) * width];
    if width == 4 {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]])
    } else {
        u32::from(u16::from_be_bytes([b[0], b[1]]))
    }
}

impl SharedMemory {
    /// Adds one value (`bits`, an IEEE value of `fmt`; 16-bit formats in the low bits) to the
    /// FPISA accumulator word at `addr`, atomically: the shift-and-add the paper proposes for
    /// the memory unit. Returns what the addition did (overflow of the headroom; with
    /// [`Variant::Approx`], a left shift or an overwrite). A word never written reads as an
    /// empty accumulator.
    pub fn fpisa_add(
        &self,
        addr: Addr,
        bits: u32,
        fmt: Format,
        variant: Variant,
    ) -> Result<Events, MemFault> {
        let x = fpisa::decompose(bits, fmt);
        let mut c = FpisaCounts::default();
        self.fpisa_apply(addr, 1, |_| x, variant, AddTo::Sums, &mut c)?;
        Ok(Events {
            overwrite: c.overwrites > 0,
            left_shift: c.left_shifts > 0,
            overflow: c.overflows > 0,
        })
    }

    /// Adds `lanes[i]` (values of `fmt`) to the accumulator word `addr + i`, each word
    /// atomically, as [`SharedMemory::fpisa_add`] does; 1 to [`MAX_FPISA_LANES`] lanes (16
    /// lanes are one 64-byte chunk of FP32 gradients). The whole range is checked first: out
    /// of range, nothing is applied. Returns the events, counted.
    pub fn fpisa_add_lanes(
        &self,
        addr: Addr,
        lanes: &[u32],
        fmt: Format,
        variant: Variant,
    ) -> Result<FpisaCounts, MemFault> {
        check_lanes(lanes.len())?;
        let mut counts = FpisaCounts::default();
        self.fpisa_apply(
            addr,
            lanes.len(),
            |i| fpisa::decompose(lanes[i], fmt),
            variant,
            AddTo::Sums,
            &mut counts,
        )?;
        Ok(counts)
    }

    /// [`SharedMemory::fpisa_add_lanes`] with the lanes in network byte order, as they sit in
    /// a packet: `data` holds whole lanes of `fmt` (4 bytes for FP32, 2 for FP16 and BF16),
    /// 1 to [`MAX_FPISA_LANES`] of them, else [`MemFault::BadSize`].
    pub fn fpisa_add_be(
        &self,
        addr: Addr,
        data: &[u8],
        fmt: Format,
        variant: Variant,
    ) -> Result<FpisaCounts, MemFault> {
        self.fpisa_be(addr, data, fmt, variant, AddTo::Sums)
    }

    /// Writes the accumulator words that adding `data`'s lanes into empty accumulators
    /// leaves ([`SharedMemory::fpisa_add_be`] into words that were all zeroed, with the same
    /// events), whatever the words held: a buffer's first contents, in one pass instead of a
    /// zeroing and an add. Each word is written atomically; the same lanes and faults as
    /// [`SharedMemory::fpisa_add_be`]. In hardware this is a plain write: splitting a float
    /// into an empty accumulator's exponent and mantissa takes a few shifts and masks.
    pub fn fpisa_write_be(
        &self,
        addr: Addr,
        data: &[u8],
        fmt: Format,
        variant: Variant,
    ) -> Result<FpisaCounts, MemFault> {
        self.fpisa_be(addr, data, fmt, variant, AddTo::Empty)
    }

    /// [`SharedMemory::fpisa_add_be`] into the words as they are, or as if they were empty.
    fn fpisa_be(
        &self,
        addr: Addr,
        data: &[u8],
        fmt: Format,
        variant: Variant,
        into: AddTo,
    ) -> Result<FpisaCounts, MemFault> {
        let width = lane_bytes(fmt);
        if data.is_empty() || !data.len().is_multiple_of(width) {
            return Err(MemFault::BadSize { bytes: data.len() });
        }
        let n = data.len() / width;
        check_lanes(n).map_err(|_| MemFault::BadSize { bytes: data.len() })?;
        let mut counts = FpisaCounts::default();
        // FP32 lanes in the accumulator region: the vectorised kernel, one stripe at a time
        // under its lock.
        if fmt == Format::Fp32 {
            if let Some(off) = self.acc_offset(addr, n as u64) {
                // As `vadd32_be`'s: the cold lanes asked for before the stripe's lock.
                crate::isa::prefetch_range(data.as_ptr(), data.len());
                self.acc_locked(off, n as u64, |first, piece| {
                    let src = &data[first * 4..(first + piece.len()) * 4];
                    add_fp32_words(piece, src, variant, into, &mut counts);
                });
                return Ok(counts);
            }
        }
        // One instance per format, so decoding compiles down to that format's constants.
        match fmt {
            Format::Fp32 => self.fpisa_apply(
                addr,
                n,
                |i| fpisa::decompose(be_lane(data, i, 4), Format::Fp32),
                variant,
                into,
                &mut counts,
            )?,
            Format::Fp16 | Format::Bf16 => self.fpisa_apply(
                addr,
                n,
                |i| fpisa::decompose(be_lane(data, i, 2), fmt),
                variant,
                into,
                &mut counts,
            )?,
        }
        Ok(counts)
    }

    /// Adds lane `i`'s value to word `addr + i` for `i < n` (or to an empty accumulator,
    /// the result written over the word), each word atomically, counting the events in
    /// `counts`.
    fn fpisa_apply(
        &self,
        addr: Addr,
        n: usize,
        lane: impl Fn(usize) -> Decomposed,
        variant: Variant,
        into: AddTo,
        counts: &mut FpisaCounts,
    ) -> Result<(), MemFault> {
        let words = n as u64;
        let add = |w: u64, x: Decomposed| {
            let mut a = Acc::from_word(match into {
                AddTo::Sums => w,
                AddTo::Empty => 0,
            });
            let e = a.add(x, variant);
            (a.to_word(), e)
        };
        match self.span(addr, words) {
            Ok(span) => {
                for i in 0..n {
                    let x = lane(i);
                    let mut events = Events::NONE;
                    // The closure may run more than once (a lost compare-and-swap); the events
                    // kept are those of the attempt that was stored.
                    update(span.at(i), |old| {
                        let (new, e) = add(old, x);
                        events = e;
                        new
                    });
                    counts.record(events);
                }
            }
            Err(fault) => {
                let off = self.acc_offset(addr, words).ok_or(fault)?;
                self.acc_locked(off, words, |first, piece| {
                    for (j, w) in piece.iter_mut().enumerate() {
                        let (new, e) = add(*w, lane(first + j));
                        *w = new;
                        counts.record(e);
                    }
                });
            }
        }
        Ok(())
    }

    /// The FP32 values of the `out.len() / 4` accumulator words from `addr`, in network
    /// order, into `out` (4 bytes a word): what [`SharedMemory::read_lines`] of the words'
    /// whole lines and [`crate::fpisa::fp32_values_be`] of the words leave, in one pass, with
    /// the same faults (the lines are checked, as a line read checks them) and each word read
    /// atomically. 1 to [`MAX_FPISA_LANES`] words; on a fault `out` is left as it was.
    pub fn fpisa_read_fp32_be(&self, addr: Addr, out: &mut [u8]) -> Result<(), MemFault> {
        let n = out.len() / 4;
        if !out.len().is_multiple_of(4) || check_lanes(n).is_err() {
            return Err(MemFault::BadSize { bytes: out.len() });
        }
        let lines = (n as u64).next_multiple_of(LINE_WORDS);
        if let Some(off) = self.acc_offset(addr, lines) {
            self.acc_read(off, n as u64, |i, piece| {
                fpisa_fp32_values_of_words(&mut out[4 * i..4 * (i + piece.len())], piece);
            });
            return Ok(());
        }
        self.check(addr, lines)?;
        let mut line = [0u8; 64];
        for (k, values) in out.chunks_mut(4 * LINE_WORDS as usize).enumerate() {
            // A line at a time, read as a line read reads it (in network order).
            self.read(addr + k as u64 * LINE_WORDS, &mut line)?;
            fpisa_fp32_values_be(values, &line[..2 * values.len()]);
        }
        Ok(())
    }

    /// Reads the FPISA accumulator word at `addr` (renormalize it with [`Acc::value`]).
    pub fn fpisa_read(&self, addr: Addr) -> Result<Acc, MemFault> {
        Ok(Acc::from_word(self.read_u64(addr)?))
    }
}

fn check_lanes(n: usize) -> Result<(), MemFault> {
    if (1..=MAX_FPISA_LANES).contains(&n) {
        Ok(())
    } else {
        Err(MemFault::BadSize { bytes: n * 4 })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::mem::{MemConfig, Region, ACC_BASE, DRAM_BASE};

    fn mem() -> SharedMemory {
        SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 20,
            acc_bytes: 1 << 20,
            banks: 4,
        })
        .unwrap()
    }

    /// One word of each region, the accumulator one straddling two stripes for lane tests.
    fn bases(m: &SharedMemory) -> [Addr; 3] {
        let _ = m;
        [64, DRAM_BASE + 64, ACC_BASE + 512 - 8]
    }

    #[test]
    fn the_papers_figure_4_in_every_region() {
        let m = mem();
        for a in bases(&m) {
            for v in [Variant::Full, Variant::Approx] {
                m.write_u64(a, 0).unwrap();
                m.fpisa_add(a, 3.0f32.to_bits(), Format::Fp32, v).unwrap();
                let e = m.fpisa_add(a, 1.0f32.to_bits(), Format::Fp32, v).unwrap();
                assert_eq!(e, Events::NONE);
                let acc = m.fpisa_read(a).unwrap();
                assert_eq!((acc.exp, acc.man), (128, 0x0100_0000), "denormalized 4.0");
                assert_eq!(acc.value(Format::Fp32), 4.0f32.to_bits());
            }
        }
    }

    #[test]
    fn lanes_and_network_order_add_lane_by_lane() {
        let m = mem();
        for a in bases(&m) {
            let vals: Vec<f32> = (0..40).map(|i| i as f32 * 0.75 - 7.0).collect();
            let bits: Vec<u32> = vals.iter().map(|v| v.to_bits()).collect();
            let be: Vec<u8> = bits.iter().flat_map(|b| b.to_be_bytes()).collect();
            let c1 = m
                .fpisa_add_lanes(a, &bits, Format::Fp32, Variant::Full)
                .unwrap();
            let c2 = m.fpisa_add_be(a, &be, Format::Fp32, Variant::Full).unwrap();
            assert_eq!((c1.adds, c2.adds), (40, 40));
            for (i, v) in vals.iter().enumerate() {
                let got = f32::from_bits(m.fpisa_read(a + i as u64).unwrap().value(Format::Fp32));
                assert_eq!(got, 2.0 * v, "region {a:#x} lane {i}");
            }
        }
    }

    #[test]
    fn sixteen_bit_lanes_in_network_order() {
        let m = mem();
        let a = ACC_BASE;
        // 1.5 and -2.0 in FP16 and in BF16.
        m.fpisa_add_be(a, &[0x3E, 0x00, 0xC0, 0x00], Format::Fp16, Variant::Full)
            .unwrap();
        assert_eq!(m.fpisa_read(a).unwrap().value(Format::Fp16), 0x3E00);
        assert_eq!(m.fpisa_read(a + 1).unwrap().value(Format::Fp16), 0xC000);
        m.fpisa_add_be(a + 8, &[0x3F, 0xC0], Format::Bf16, Variant::Full)
            .unwrap();
        assert_eq!(m.fpisa_read(a + 8).unwrap().value(Format::Bf16), 0x3FC0);
    }

    /// A write leaves what zeroing the words and adding the lanes leaves, with the same
    /// counts, over words holding anything: every region (the accumulator's lanes straddle
    /// two stripes), every format, both variants, special lanes among them. A faulting
    /// write writes nothing.
    #[test]
    fn a_write_is_an_add_into_zeroed_words_in_every_region_and_format() {
        let m = mem();
        // FP32: normal values of both signs, zeros, a subnormal, an infinity, a NaN.
        let fp32: Vec<u32> = [
            1.5f32,
            -2.0,
            0.0,
            -0.0,
            3.0e-39,
            f32::INFINITY,
            f32::NAN,
            1e30,
        ]
        .iter()
        .cycle()
        .take(40)
        .enumerate()
        .map(|(i, v)| (v * (1.0 + i as f32 / 64.0)).to_bits())
        .collect();
        let half: Vec<u32> = (0..40u32).map(|i| (i * 0x1357 + 0x3C00) & 0xFFFF).collect();
        for a in bases(&m) {
            for (fmt, lanes) in [
                (Format::Fp32, &fp32),
                (Format::Fp16, &half),
                (Format::Bf16, &half),
            ] {
                let width = (fmt.width() / 8) as usize;
                let be: Vec<u8> = lanes
                    .iter()
                    .flat_map(|b| b.to_be_bytes()[4 - width..].to_vec())
                    .collect();
                for v in [Variant::Full, Variant::Approx] {
                    let old = |i: u64| 0x8123_4567_89AB_CDEFu64.rotate_left(i as u32);
                    for i in 0..lanes.len() as u64 {
                        m.write_u64(a + i, 0).unwrap();
                    }
                    let want = m.fpisa_add_be(a, &be, fmt, v).unwrap();
                    let sums: Vec<u64> = (0..lanes.len() as u64)
                        .map(|i| m.read_u64(a + i).unwrap())
                        .collect();
                    for i in 0..lanes.len() as u64 {
                        m.write_u64(a + i, old(i)).unwrap();
                    }
                    let got = m.fpisa_write_be(a, &be, fmt, v).unwrap();
                    assert_eq!(got, want, "counts, {fmt:?} {v:?} at {a:#x}");
                    for (i, &w) in sums.iter().enumerate() {
                        let at = a + i as u64;
                        assert_eq!(m.read_u64(at).unwrap(), w, "{fmt:?} {v:?} word {at:#x}");
                    }
                }
            }
        }
        let end = m.region(Region::Sram).end;
        m.write_u64(end - 2, 7).unwrap();
        let four = [0x3F, 0x80, 0, 0].repeat(4);
        assert!(matches!(
            m.fpisa_write_be(end - 2, &four, Format::Fp32, Variant::Full),
            Err(MemFault::OutOfRange { .. })
        ));
        assert_eq!(
            m.read_u64(end - 2).unwrap(),
            7,
            "nothing written on a fault"
        );
        assert_eq!(
            m.fpisa_write_be(0, &[1, 2, 3], Format::Fp32, Variant::Full),
            Err(MemFault::BadSize { bytes: 3 })
        );
    }

    #[test]
    fn approx_events_are_counted() {
        let m = mem();
        let a = DRAM_BASE;
        m.fpisa_add(a, 1.0f32.to_bits(), Format::Fp32, Variant::Approx)
            .unwrap();
        // 4.0 is 2 exponents up: a left shift; 1024.0 is 10 up from 1.0: an overwrite.
        let e = m
            .fpisa_add(a, 4.0f32.to_bits(), Format::Fp32, Variant::Approx)
            .unwrap();
        assert!(e.left_shift && !e.overwrite);
        let c = m
            .fpisa_add_lanes(a, &[1024.0f32.to_bits()], Format::Fp32, Variant::Approx)
            .unwrap();
        assert_eq!((c.adds, c.overwrites, c.left_shifts), (1, 1, 0));
        let full = m
            .fpisa_add_lanes(
                a + 1,
                &[1.0f32.to_bits(), 1024.0f32.to_bits()],
                Format::Fp32,
                Variant::Full,
            )
            .unwrap();
        assert_eq!((full.overwrites, full.left_shifts), (0, 0));
    }

    #[test]
    fn bad_sizes_and_ranges_apply_nothing() {
        let m = mem();
        assert_eq!(
            m.fpisa_add_be(0, &[1, 2, 3], Format::Fp32, Variant::Full),
            Err(MemFault::BadSize { bytes: 3 })
        );
        assert_eq!(
            m.fpisa_add_be(0, &[], Format::Fp16, Variant::Full),
            Err(MemFault::BadSize { bytes: 0 })
        );
        assert!(m
            .fpisa_add_lanes(0, &[0; MAX_FPISA_LANES + 1], Format::Fp32, Variant::Full)
            .is_err());
        let end = m.region(Region::Sram).end;
        m.write_u64(end - 2, 7).unwrap();
        assert!(matches!(
            m.fpisa_add_lanes(end - 2, &[1.0f32.to_bits(); 4], Format::Fp32, Variant::Full),
            Err(MemFault::OutOfRange { .. })
        ));
        assert_eq!(
            m.read_u64(end - 2).unwrap(),
            7,
            "nothing applied on a fault"
        );
    }

    /// Hundreds of threads adding integer-valued floats into shared lanes give exactly the
    /// sequential sums, in every region and both variants. The values are exact at the
    /// accumulator's precision and share one exponent (32 to 63), so the order of the
    /// additions cannot matter; each lane gets 64 of them, within the 7 bits of headroom.
    #[test]
    fn concurrent_adds_from_hundreds_of_threads_equal_the_sequential_sums() {
        const THREADS: u32 = 256;
        const LANES: u64 = 64;
        let m = Arc::new(mem());
        let value = |t: u32, lane: u64| ((t * 7 + lane as u32 * 3) % 32) as f32 + 32.0;
        // Thread t adds 16 lanes from lane 16 * (t % 4): every lane gets THREADS / 4 adds.
        let first = |t: u32| u64::from(t % 4) * 16;
        for a in bases(&m) {
            for v in [Variant::Full, Variant::Approx] {
                for l in 0..LANES {
                    m.write_u64(a + l, 0).unwrap();
                }
                let handles: Vec<_> = (0..THREADS)
                    .map(|t| {
                        let m = m.clone();
                        std::thread::spawn(move || {
                            let lanes: [u32; 16] =
                                std::array::from_fn(|l| value(t, first(t) + l as u64).to_bits());
                            m.fpisa_add_lanes(a + first(t), &lanes, Format::Fp32, v)
                                .unwrap()
                        })
                    })
                    .collect();
                let mut counts = FpisaCounts::default();
                for h in handles {
                    counts.merge(&h.join().unwrap());
                }
                assert_eq!(counts.adds, u64::from(THREADS) * 16);
                assert_eq!(
                    (counts.overwrites, counts.left_shifts, counts.overflows),
                    (0, 0, 0)
                );
                let seq = mem();
                for t in 0..THREADS {
                    let lanes: [u32; 16] =
                        std::array::from_fn(|l| value(t, first(t) + l as u64).to_bits());
                    seq.fpisa_add_lanes(64 + first(t), &lanes, Format::Fp32, v)
                        .unwrap();
                }
                for l in 0..LANES {
                    let got = m.fpisa_read(a + l).unwrap();
                    let want = seq.fpisa_read(64 + l).unwrap();
                    assert_eq!(got, want, "region {a:#x} lane {l}");
                    let exact: f64 = (0..THREADS)
                        .filter(|&t| (first(t)..first(t) + 16).contains(&l))
                        .map(|t| f64::from(value(t, l)))
                        .sum();
                    assert_eq!(f64::from(f32::from_bits(got.value(Format::Fp32))), exact);
                }
            }
        }
    }

    /// The renormalizing read gives, in every region (the accumulator one across a stripe's
    /// end) and for any count of words, the values a line read of the words and their
    /// renormalization give; a faulting or badly sized read leaves its buffer alone.
    #[test]
    fn the_renormalizing_read_is_a_line_read_and_its_renormalization() {
        let m = mem();
        for a in bases(&m) {
            // Sums of every kind: normal, cancelled, saturated, flagged.
            let lanes: Vec<u32> = (0..200u32)
                .map(|i| match i % 23 {
                    3 => f32::INFINITY.to_bits(),
                    7 => f32::NAN.to_bits(),
                    11 => 1e38f32.to_bits(),
                    _ => ((i as f32 - 90.0) * 1.37).to_bits(),
                })
                .collect();
            let be: Vec<u8> = lanes.iter().flat_map(|b| b.to_be_bytes()).collect();
            m.fpisa_write_be(a, &be, Format::Fp32, Variant::Full)
                .unwrap();
            m.fpisa_add_be(a, &be, Format::Fp32, Variant::Full).unwrap();
            for n in [1usize, 7, 16, 33, 200] {
                let mut words = vec![0u8; 8 * n];
                for (k, w) in words.chunks_exact_mut(8).enumerate() {
                    w.copy_from_slice(&m.read_u64(a + k as u64).unwrap().to_be_bytes());
                }
                let mut want = vec![0u8; 4 * n];
                crate::fpisa::fp32_values_be(&mut want, &words);
                let mut got = vec![0xA5u8; 4 * n];
                m.fpisa_read_fp32_be(a, &mut got).unwrap();
                assert_eq!(got, want, "region {a:#x}, {n} words");
            }
        }
        let end = m.region(Region::Sram).end;
        let mut out = vec![0xA5u8; 64];
        assert!(matches!(
            m.fpisa_read_fp32_be(end - 8, &mut out),
            Err(MemFault::OutOfRange { .. })
        ));
        assert!(out.iter().all(|&b| b == 0xA5), "nothing written on a fault");
        for bytes in [0usize, 3, 4 * MAX_FPISA_LANES + 4] {
            let mut out = vec![0u8; bytes];
            assert_eq!(
                m.fpisa_read_fp32_be(0, &mut out),
                Err(MemFault::BadSize { bytes })
            );
        }
    }
}
