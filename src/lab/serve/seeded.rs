//! Seeded test vectors and their exact sums: every worker draws every other worker's vector
//! ([`seeded_ints`], [`seeded_floats`]), so each checks its allreduce's sums
//! ([`ExpectedSums`], [`check_seeded_sums`]) and tells a server of the other lane type from
//! gradients lost or miscounted ([`SeededCheck::server_lanes`]).

use std::fmt;
use std::ops::Range;

use serde::Serialize;

use crate::microcode::trio_ml::host::Worker;
use crate::rng::{mix, SplitMix64};

fn rng_of(seed: u64, src: u8) -> SplitMix64 {
    SplitMix64::new(mix(
        seed ^ (u64::from(src) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    ))
}

/// Source `src`'s vector of `n` integers for `seed`, each in `-2^20..2^20` (so sums of up to
/// 255 sources fit an `i32`).
pub fn seeded_ints(seed: u64, src: u8, n: usize) -> Vec<i32> {
    let mut r = rng_of(seed, src);
    (0..n)
        .map(|_| r.below(1 << 21) as i32 - (1 << 20))
        .collect()
}

/// Source `src`'s vector of `n` integer-valued floats for `seed`, each in `-1024..=1024`
/// (so FP32 sums of up to 255 sources are exact).
pub fn seeded_floats(seed: u64, src: u8, n: usize) -> Vec<f32> {
    let mut r = rng_of(seed, src);
    (0..n).map(|_| r.below(2049) as f32 - 1024.0).collect()
}

/// The exact sums of [`seeded_ints`] over `sources`.
pub fn expected_int_sums(seed: u64, sources: &[u8], n: usize) -> Vec<i32> {
    let mut sum = vec![0i32; n];
    for &s in sources {
        for (a, v) in sum.iter_mut().zip(seeded_ints(seed, s, n)) {
            *a = a.wrapping_add(v);
        }
    }
    sum
}

/// The exact sums of [`seeded_floats`] over `sources`.
pub fn expected_float_sums(seed: u64, sources: &[u8], n: usize) -> Vec<f32> {
    let mut sum = vec![0f32; n];
    for &s in sources {
        for (a, v) in sum.iter_mut().zip(seeded_floats(seed, s, n)) {
            *a += v;
        }
    }
    sum
}

/// The lane type a server aggregates, which its workers must send: `pfemu serve --program
/// trio-ml` takes 32-bit integers, `--program fpisa` (or `fpisa-approx`) FP32 values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum LaneType {
    /// Trio-ML: 32-bit two's-complement integers.
    Int32,
    /// FPISA: FP32 values.
    Fp32,
}

impl fmt::Display for LaneType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LaneType::Int32 => "32-bit integers (Trio-ML)",
            LaneType::Fp32 => "FP32 values (FPISA)",
        })
    }
}

/// How a worker's sums compare with the exact sums of the seeded vectors
/// ([`check_seeded_sums`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SeededCheck {
    /// Gradients compared: those of the chunks every source contributed to (neither
    /// degraded nor with fewer sources).
    pub compared: usize,
    /// Of those, sums that differ from the expected ones.
    pub mismatches: usize,
    /// Set when sums differ and every compared one is what a server aggregating this other
    /// lane type returns for the same packets: the worker and the server run different
    /// programs, and nothing was lost or miscounted.
    pub server_lanes: Option<LaneType>,
}

/// The exact sums of the seeded vectors ([`seeded_ints`] or [`seeded_floats`]) of a set of
/// sources: what a worker's allreduce must return. Made before the allreduce (it draws every
/// source's vector), so that a worker that finishes first does not take the CPU from the
/// others still in theirs; [`ExpectedSums::check`] afterwards only compares.
#[derive(Clone, Debug)]
pub struct ExpectedSums {
    seed: u64,
    sources: Vec<u8>,
    sums: Sums,
}

#[derive(Clone, Debug)]
enum Sums {
    Int32(Vec<i32>),
    Fp32(Vec<f32>),
}

impl ExpectedSums {
    /// The sums of the `n`-gradient vectors `sources` draw for `seed`, of lane type `sent`.
    pub fn new(seed: u64, sources: &[u8], n: usize, sent: LaneType) -> Self {
        let sums = match sent {
            LaneType::Int32 => Sums::Int32(expected_int_sums(seed, sources, n)),
            LaneType::Fp32 => Sums::Fp32(expected_float_sums(seed, sources, n)),
        };
        ExpectedSums {
            seed,
            sources: sources.to_vec(),
            sums,
        }
    }

    /// The lane type the vectors were sent as.
    pub fn lanes(&self) -> LaneType {
        match self.sums {
            Sums::Int32(_) => LaneType::Int32,
            Sums::Fp32(_) => LaneType::Fp32,
        }
    }

    /// Compares `worker`'s sums (after its allreduce) with these, on the chunks every
    /// source contributed to (neither degraded nor with fewer sources). When sums differ, it
    /// also tells a server of the other lane type apart ([`SeededCheck::server_lanes`]):
    /// integers sent to FPISA come back as FPISA's sums of their bits read as FP32 (the
    /// seeded integers are all subnormal, flushed to zero, or NaN there, so both FPISA
    /// variants agree), and floats sent to Trio-ML as the integer sums of their bits.
    ///
    /// # Panics
    /// If the worker's vector is not as long as the one these sums are of.
    pub fn check(&self, worker: &Worker) -> SeededCheck {
        let got = worker.sums();
        let n = got.len();
        let want_n = match &self.sums {
            Sums::Int32(v) => v.len(),
            Sums::Fp32(v) => v.len(),
        };
        assert_eq!(
            n, want_n,
            "the worker's vector and the expected sums differ in length"
        );
        let g = worker.config().grads_per_packet;
        // The gradient ranges of the chunks every source contributed to.
        let sources = self.sources.len();
        let full: Vec<Range<usize>> = (0..n.div_ceil(g.max(1)))
            .filter(|&c| !worker.degraded()[c] && usize::from(worker.src_counts()[c]) == sources)
            .map(|c| c * g..((c + 1) * g).min(n))
            .collect();
        let compared = full.iter().map(|r| r.len()).sum();
        // Lanes of the full chunks where `got` and `want` differ.
        fn differing<A, B>(full: &[Range<usize>], got: &[A], want: &[B]) -> usize
        where
            A: PartialEq<B>,
        {
            let differ = |r: &Range<usize>| {
                let pairs = got[r.clone()].iter().zip(&want[r.clone()]);
                pairs.filter(|(g, w)| *g != *w).count()
            };
            full.iter().map(differ).sum()
        }
        let mismatches = match &self.sums {
            Sums::Int32(want) => differing(&full, got, want),
            // As floats: 0.0 and -0.0 are the same sum.
            Sums::Fp32(want) => differing(&full, &worker.float_sums(), want),
        };
        let server_lanes = (mismatches > 0)
            .then(|| {
                let (seed, src) = (self.seed, &self.sources[..]);
                let (other, lanes) = match self.lanes() {
                    LaneType::Int32 => (fpisa_sums_of_int_bits(seed, src, n), LaneType::Fp32),
                    LaneType::Fp32 => (int_sums_of_float_bits(seed, src, n), LaneType::Int32),
                };
                let bits: Vec<u32> = got.iter().map(|&v| v as u32).collect();
                (differing(&full, &bits, &other) == 0).then_some(lanes)
            })
            .flatten();
        SeededCheck {
            compared,
            mismatches,
            server_lanes,
        }
    }
}

/// Compares `worker`'s sums (after its allreduce) with the exact sums of the vectors
/// [`seeded_ints`] (`sent` [`LaneType::Int32`]) or [`seeded_floats`] ([`LaneType::Fp32`])
/// give `sources` for `seed`: [`ExpectedSums::new`] then [`ExpectedSums::check`]. A
/// worker that measures its allreduce alongside others makes the [`ExpectedSums`] before.
pub fn check_seeded_sums(
    worker: &Worker,
    seed: u64,
    sources: &[u8],
    sent: LaneType,
) -> SeededCheck {
    ExpectedSums::new(seed, sources, worker.sums().len(), sent).check(worker)
}

/// What an FPISA server returns for the [`seeded_ints`] of `sources`: their bits summed as
/// FP32 values (the full variant).
fn fpisa_sums_of_int_bits(seed: u64, sources: &[u8], n: usize) -> Vec<u32> {
    use crate::fpisa::{Acc, Format, Variant};
    let mut acc = vec![Acc::default(); n];
    for &s in sources {
        for (a, v) in acc.iter_mut().zip(seeded_ints(seed, s, n)) {
            a.add_bits(v as u32, Format::Fp32, Variant::Full);
        }
    }
    acc.iter().map(|a| a.value(Format::Fp32)).collect()
}

/// What a Trio-ML server returns for the [`seeded_floats`] of `sources`: the wrapping
/// integer sums of their bits.
fn int_sums_of_float_bits(seed: u64, sources: &[u8], n: usize) -> Vec<u32> {
    let mut sum = vec![0u32; n];
    for &s in sources {
        for (a, v) in sum.iter_mut().zip(seeded_floats(seed, s, n)) {
            *a = a.wrapping_add(v.to_bits());
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::serve::worker_config;
    use crate::microcode::trio_ml::host::{Payloads, Received};
    use crate::microcode::trio_ml::wire;

    /// Source 0's worker of `sources`, after an allreduce of its seeded integers whose
    /// Results `result` makes: chunk `c` (its range of gradients) comes back with the
    /// returned sums, source count and degraded flag.
    fn allreduced(
        sources: &[u8],
        n: usize,
        g: usize,
        result: impl Fn(usize, Range<usize>) -> (Vec<i32>, u8, bool),
    ) -> Worker {
        let cfg = worker_config(1, sources[0], g, n.div_ceil(g), None);
        let mut w = Worker::new(cfg, seeded_ints(SEED, sources[0], n)).unwrap();
        let mut out = Payloads::new();
        w.poll_payloads(0, &mut out);
        for (c, p) in out.iter().enumerate() {
            let (mut hdr, _) = wire::parse_payload(p).unwrap();
            let (sums, src_cnt, degraded) = result(c, c * g..((c + 1) * g).min(n));
            (hdr.src_cnt, hdr.degraded) = (src_cnt, degraded);
            let mut back = Vec::new();
            wire::append_payload(&mut back, &hdr, &sums);
            assert_eq!(
                w.on_payload_at(&back, 1).unwrap(),
                Received::Result { chunk: c }
            );
        }
        assert!(w.is_done());
        w
    }
    const SEED: u64 = 11;

    #[test]
    fn expected_sums_count_the_full_chunks_and_their_mismatches() {
        let (sources, n, g) = ([0, 1, 2], 10, 4);
        let want = expected_int_sums(SEED, &sources, n);
        let expected = ExpectedSums::new(SEED, &sources, n, LaneType::Int32);
        let exact = allreduced(&sources, n, g, |_, r| (want[r].to_vec(), 3, false));
        let check = |w: &Worker| expected.check(w);
        assert_eq!(
            check(&exact),
            SeededCheck {
                compared: 10,
                mismatches: 0,
                server_lanes: None
            }
        );
        // Chunk 1 wrong in two lanes; chunk 2 (2 gradients) degraded, chunk 0 short of a
        // source: only chunk 1 is compared.
        let w = allreduced(&sources, n, g, |c, r| {
            let mut sums = want[r].to_vec();
            if c == 1 {
                sums[0] += 1;
                sums[3] -= 7;
            }
            (sums, if c == 0 { 2 } else { 3 }, c == 2)
        });
        assert_eq!(
            check(&w),
            SeededCheck {
                compared: 4,
                mismatches: 2,
                server_lanes: None
            }
        );
        // What an FPISA server returns for these integers: told apart.
        let fpisa = fpisa_sums_of_int_bits(SEED, &sources, n);
        let w = allreduced(&sources, n, g, |_, r| {
            (fpisa[r].iter().map(|&b| b as i32).collect(), 3, false)
        });
        let c = check(&w);
        assert_eq!((c.compared, c.server_lanes), (10, Some(LaneType::Fp32)));
        assert!(c.mismatches > 0);
        // And the free function agrees with the precomputed sums.
        assert_eq!(check_seeded_sums(&w, SEED, &sources, LaneType::Int32), c);
    }

    #[test]
    fn expected_float_sums_compare_as_floats() {
        let (sources, n, g) = ([0, 1], 6, 4);
        let want = expected_float_sums(SEED, &sources, n);
        let expected = ExpectedSums::new(SEED, &sources, n, LaneType::Fp32);
        assert_eq!(expected.lanes(), LaneType::Fp32);
        let bits =
            |r: Range<usize>| -> Vec<i32> { want[r].iter().map(|v| v.to_bits() as i32).collect() };
        let w = allreduced(&sources, n, g, |_, r| (bits(r), 2, false));
        let c = expected.check(&w);
        assert_eq!((c.compared, c.mismatches, c.server_lanes), (6, 0, None));
        // Trio-ML's integer sums of the floats' bits: told apart.
        let ints = int_sums_of_float_bits(SEED, &sources, n);
        let w = allreduced(&sources, n, g, |_, r| {
            (ints[r].iter().map(|&b| b as i32).collect(), 2, false)
        });
        assert_eq!(expected.check(&w).server_lanes, Some(LaneType::Int32));
    }
}
