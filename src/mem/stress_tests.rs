//! Concurrency stress tests of the Shared Memory System through its public API, and of the
//! PPE threads' posted-XTXN buffer (`PostedOps`, crate-private, which is why these tests live
//! inside the crate).
//!
//! For every operation kind, 256 threads hammer (a) ONE location and (b) many locations spread
//! over all banks and both regions, and the final state must be exactly what the sequential
//! semantics imply. Besides the per-kind checks, every read-modify-write that returns an old
//! value is checked with the *telescoping* identity: if the operations on a word were applied
//! one at a time, each op's new value is the next op's old value, so the XOR over all ops of
//! `old ^ new` equals `initial ^ final`. A lost or duplicated update breaks it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;

use crate::mem::*;

const THREADS: usize = if cfg!(miri) { 4 } else { 256 };
const OPS: usize = if cfg!(miri) { 16 } else { 2_000 };
const BANKS: usize = 64;
/// Number of spread locations: one line in each bank, alternating SRAM and DRAM.
const SPREAD: usize = 64;

fn mem() -> SharedMemory {
    SharedMemory::new(&MemConfig {
        sram_bytes: 1 << 20,
        dram_bytes: 1 << 20,
        acc_bytes: 1 << 20,
        banks: BANKS,
    })
    .unwrap()
}

/// The single contended word / line.
const ONE: Addr = 4096;

/// The `i`-th spread location: line-aligned, in bank `i % BANKS`, even `i` in SRAM and odd
/// `i` in DRAM.
fn spread(i: usize) -> Addr {
    let base = if i.is_multiple_of(2) { 0 } else { DRAM_BASE };
    base + 1024 + 8 * i as Addr
}

/// Location index used by thread `t` for its op `j` in the spread tests: every thread sweeps
/// every location, starting at a different one, so each location sees all threads.
fn spread_idx(t: usize, j: usize) -> usize {
    (t + j) % SPREAD
}

/// Deterministic pseudo-random numbers (splitmix64).
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn rnd(t: usize, j: usize, salt: u64) -> u64 {
    mix(((t as u64) << 32) ^ j as u64 ^ salt.wrapping_mul(0x1000_0000_01B3))
}

/// Runs `f(t)` on `THREADS` threads released together; results in thread order.
fn run<T: Send>(f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    run_n(THREADS, f)
}

/// Runs `f(t)` on `threads` threads released together; results in thread order.
fn run_n<T: Send>(threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let barrier = Barrier::new(threads);
    thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (f, barrier) = (&f, &barrier);
                thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(s, move || {
                        barrier.wait();
                        f(t)
                    })
                    .expect("spawn")
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// One applied read-modify-write: which location, the old value it returned and the new value
/// the sequential semantics give for that old value.
#[derive(Clone, Copy, Debug)]
struct Rec {
    loc: usize,
    old: u64,
    new: u64,
}

/// `THREADS x OPS` read-modify-writes, `f(t, j)` performing op `j` of thread `t`. Returns the
/// records per thread, after checking the telescoping identity on every location (`addr(loc)`
/// is read back; all locations start at `init`).
fn rmw_stress(
    m: &SharedMemory,
    init: u64,
    locs: usize,
    addr: impl Fn(usize) -> Addr,
    f: impl Fn(usize, usize) -> Rec + Sync,
) -> Vec<Vec<Rec>> {
    for l in 0..locs {
        m.write_u64(addr(l), init).unwrap();
    }
    let recs = run(|t| (0..OPS).map(|j| f(t, j)).collect::<Vec<_>>());
    let mut acc = vec![0u64; locs];
    let mut count = vec![0usize; locs];
    for r in recs.iter().flatten() {
        acc[r.loc] ^= r.old ^ r.new;
        count[r.loc] += 1;
    }
    for l in 0..locs {
        let fin = m.read_u64(addr(l)).unwrap();
        assert_eq!(
            acc[l],
            init ^ fin,
            "telescoping identity broken at location {l} ({} ops)",
            count[l]
        );
    }
    assert_eq!(count.iter().sum::<usize>(), THREADS * OPS);
    recs
}

fn one(_: usize) -> Addr {
    ONE
}

// ----- packet/byte counters -------------------------------------------------------------------

fn pkt_bytes(t: usize, j: usize) -> u64 {
    64 + rnd(t, j, 1) % 1437
}

#[test]
fn counter_inc_one_location() {
    let m = mem();
    let expected_bytes: Vec<u64> = run(|t| {
        let mut sum = 0;
        for j in 0..OPS {
            let b = pkt_bytes(t, j);
            m.counter_inc(ONE, b).unwrap();
            sum += b;
        }
        sum
    });
    let total: u64 = expected_bytes.iter().sum();
    assert_eq!(m.counter_read(ONE), Ok(((THREADS * OPS) as u64, total)));
    // neighbours untouched
    assert_eq!(m.read_u64(ONE - 1), Ok(0));
    assert_eq!(m.read_u64(ONE + 2), Ok(0));
}

#[test]
fn counter_inc_spread() {
    let m = mem();
    let per_thread = run(|t| {
        let mut exp = vec![(0u64, 0u64); SPREAD];
        for j in 0..OPS {
            let l = spread_idx(t, j);
            let b = pkt_bytes(t, j);
            m.counter_inc(spread(l), b).unwrap();
            exp[l].0 += 1;
            exp[l].1 += b;
        }
        exp
    });
    for l in 0..SPREAD {
        let want = per_thread
            .iter()
            .fold((0, 0), |(p, b), e| (p + e[l].0, b + e[l].1));
        assert_eq!(m.counter_read(spread(l)), Ok(want), "location {l}");
    }
}

// ----- logical fetch-and-ops --------------------------------------------------------------------

fn own_bit(t: usize) -> u64 {
    1 << (t % 64)
}

/// For each (location, bit), how many ops saw the bit in state `set` while their mask
/// covered it.
fn saw_bit(recs: &[Vec<Rec>], locs: usize, set: bool) -> Vec<[usize; 64]> {
    let mut n = vec![[0usize; 64]; locs];
    for (t, rs) in recs.iter().enumerate() {
        for r in rs {
            let b = t % 64;
            if ((r.old >> b) & 1 == 1) == set {
                n[r.loc][b] += 1;
            }
        }
    }
    n
}

#[test]
fn fetch_or_own_bits() {
    let m = mem();
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        let recs = rmw_stress(&m, 0, locs, addr, |t, j| {
            let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
            let old = m.fetch_or(addr(loc), own_bit(t)).unwrap();
            Rec {
                loc,
                old,
                new: old | own_bit(t),
            }
        });
        for l in 0..locs {
            assert_eq!(m.read_u64(addr(l)), Ok(u64::MAX));
        }
        // every bit of every location was found clear by exactly one op: the first setter
        for (l, bits) in saw_bit(&recs, locs, false).iter().enumerate() {
            assert_eq!(bits, &[1usize; 64], "location {l}");
        }
    }
}

#[test]
fn fetch_and_and_fetch_clear_own_bits() {
    let m = mem();
    for use_clear in [false, true] {
        for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
            let recs = rmw_stress(&m, u64::MAX, locs, addr, |t, j| {
                let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
                let a = addr(loc);
                let old = if use_clear {
                    m.fetch_clear(a, own_bit(t)).unwrap()
                } else {
                    m.fetch_and(a, !own_bit(t)).unwrap()
                };
                Rec {
                    loc,
                    old,
                    new: old & !own_bit(t),
                }
            });
            for l in 0..locs {
                assert_eq!(m.read_u64(addr(l)), Ok(0));
            }
            for (l, bits) in saw_bit(&recs, locs, true).iter().enumerate() {
                assert_eq!(bits, &[1usize; 64], "clear={use_clear} location {l}");
            }
        }
    }
}

/// Threads alternately set (fetch_or) and clear (fetch_and / fetch_clear / masked_write) their
/// bit, shared with 3 other threads: per bit, the ops that changed it must alternate, so
/// (#sets that found it clear) - (#clears that found it set) is the final bit, 0 or 1.
#[test]
fn set_clear_transitions() {
    let m = mem();
    for clear_kind in 0..3 {
        for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
            let recs = rmw_stress(&m, 0, locs, addr, |t, j| {
                let loc = if locs == 1 { 0 } else { spread_idx(t, j / 2) };
                let a = addr(loc);
                let bit = own_bit(t);
                if (j + t) % 2 == 0 {
                    let old = m.fetch_or(a, bit).unwrap();
                    Rec {
                        loc,
                        old,
                        new: old | bit,
                    }
                } else {
                    let old = match clear_kind {
                        0 => m.fetch_and(a, !bit).unwrap(),
                        1 => m.fetch_clear(a, bit).unwrap(),
                        _ => m.masked_write(a, 0, bit).unwrap(),
                    };
                    Rec {
                        loc,
                        old,
                        new: old & !bit,
                    }
                }
            });
            let mut net = vec![[0i64; 64]; locs];
            for (t, rs) in recs.iter().enumerate() {
                let b = t % 64;
                for r in rs {
                    let before = (r.old >> b) & 1;
                    let after = (r.new >> b) & 1;
                    net[r.loc][b] += after as i64 - before as i64;
                }
            }
            for (l, bits) in net.iter().enumerate() {
                let fin = m.read_u64(addr(l)).unwrap();
                for (b, &n) in bits.iter().enumerate() {
                    assert_eq!(
                        n,
                        ((fin >> b) & 1) as i64,
                        "kind {clear_kind} loc {l} bit {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn fetch_xor_toggle_parity() {
    let m = mem();
    // thread t toggles a fixed random mask, OPS + (t % 2) times
    let mask = |t: usize| rnd(t, 0, 7);
    let n_ops = |t: usize| OPS - 1 + (t % 2);
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        for l in 0..locs {
            m.write_u64(addr(l), 0).unwrap();
        }
        let recs: Vec<Vec<(usize, u64)>> = run(|t| {
            (0..n_ops(t))
                .map(|j| {
                    let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
                    (loc, m.fetch_xor(addr(loc), mask(t)).unwrap())
                })
                .collect()
        });
        // per (location, bit): number of toggles k; from 0 the toggling ops saw the bit set
        // exactly floor(k / 2) times and the final bit is k mod 2
        let mut toggles = vec![[0u64; 64]; locs];
        let mut saw_set = vec![[0u64; 64]; locs];
        for (t, rs) in recs.iter().enumerate() {
            let mk = mask(t);
            for &(loc, old) in rs {
                for b in 0..64 {
                    if (mk >> b) & 1 == 1 {
                        toggles[loc][b] += 1;
                        saw_set[loc][b] += (old >> b) & 1;
                    }
                }
            }
        }
        let mut parity = 0u64;
        for t in 0..THREADS {
            if n_ops(t) % 2 == 1 {
                parity ^= mask(t);
            }
        }
        for l in 0..locs {
            let fin = m.read_u64(addr(l)).unwrap();
            if locs == 1 {
                assert_eq!(fin, parity);
            }
            for b in 0..64 {
                assert_eq!((fin >> b) & 1, toggles[l][b] % 2, "loc {l} bit {b}");
                assert_eq!(saw_set[l][b], toggles[l][b] / 2, "loc {l} bit {b}");
            }
        }
    }
}

// ----- 64-bit fetch-and-add --------------------------------------------------------------------

/// Every location ends at its initial value plus the wrapping sum of the deltas added to it,
/// and each add's old value telescopes into the next (checked by `rmw_stress`). The deltas
/// are large, so the adds wrap and carry across the 32-bit halves all the time.
#[test]
fn fetch_add_loses_and_duplicates_nothing() {
    let m = mem();
    let delta = |t: usize, j: usize| rnd(t, j, 21) | 1 << 63;
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        let init = 0xFFFF_FFFF_u64;
        let recs = rmw_stress(&m, init, locs, addr, |t, j| {
            let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
            let d = delta(t, j);
            let old = m.fetch_add(addr(loc), d).unwrap();
            Rec {
                loc,
                old,
                new: old.wrapping_add(d),
            }
        });
        let mut want = vec![init; locs];
        for r in recs.iter().flatten() {
            want[r.loc] = want[r.loc].wrapping_add(r.new.wrapping_sub(r.old));
        }
        for (l, w) in want.iter().enumerate() {
            assert_eq!(m.read_u64(addr(l)), Ok(*w), "location {l}");
        }
    }
}

// ----- fetch-and-swap ---------------------------------------------------------------------------

#[test]
fn fetch_swap_loses_and_duplicates_nothing() {
    let m = mem();
    let value = |t: usize, j: usize| ((t as u64 + 1) << 32) | (j as u64 + 1);
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        let init = 0xDEAD_BEEF_u64;
        let recs = rmw_stress(&m, init, locs, addr, |t, j| {
            let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
            let v = value(t, j);
            Rec {
                loc,
                old: m.fetch_swap(addr(loc), v).unwrap(),
                new: v,
            }
        });
        // per location: multiset(old values) + {final} == {initial} + multiset(written)
        let mut seen: Vec<Vec<u64>> = vec![Vec::new(); locs];
        let mut written: Vec<Vec<u64>> = vec![vec![init]; locs];
        for r in recs.iter().flatten() {
            seen[r.loc].push(r.old);
            written[r.loc].push(r.new);
        }
        for l in 0..locs {
            seen[l].push(m.read_u64(addr(l)).unwrap());
            seen[l].sort_unstable();
            written[l].sort_unstable();
            assert_eq!(seen[l], written[l], "location {l}");
        }
        let total: usize = seen.iter().map(Vec::len).sum();
        assert_eq!(total, THREADS * OPS + locs);
    }
}

// ----- masked write -----------------------------------------------------------------------------

#[test]
fn masked_write_random_masks_one_location() {
    let m = mem();
    rmw_stress(&m, 0x0123_4567_89AB_CDEF, 1, one, |t, j| {
        let (value, mask) = (rnd(t, j, 2), rnd(t, j, 3) & rnd(t, j, 4));
        let old = m.masked_write(ONE, value, mask).unwrap();
        Rec {
            loc: 0,
            old,
            new: (old & !mask) | (value & mask),
        }
    });
}

/// THREADS / 8 words (spread over banks and regions), each shared by 8 threads owning one
/// byte lane each: every op must find its own lane holding the value it wrote last (no other
/// thread's masked write clobbered it), and each final word holds every lane's last value.
#[test]
fn masked_write_byte_lane_owners() {
    let m = mem();
    let word = |t: usize| spread(t / 8) + (t / 8 % 8) as Addr;
    let lane_val = |t: usize, j: usize| (rnd(t, j, 5) & 0xFF) | 1;
    let clobbered = run(|t| {
        let shift = 8 * (t % 8) as u64;
        let mask = 0xFFu64 << shift;
        let a = word(t);
        let mut prev = 0u64;
        let mut bad = 0usize;
        for j in 0..OPS {
            let v = lane_val(t, j);
            // set bits outside the mask too: they must be ignored
            let old = m.masked_write(a, (v << shift) | !mask, mask).unwrap();
            if (old >> shift) & 0xFF != prev {
                bad += 1;
            }
            prev = v;
        }
        bad
    });
    assert_eq!(
        clobbered.iter().sum::<usize>(),
        0,
        "lanes clobbered: {clobbered:?}"
    );
    let mut expect: HashMap<Addr, u64> = HashMap::new();
    for t in 0..THREADS {
        *expect.entry(word(t)).or_default() |= lane_val(t, OPS - 1) << (8 * (t % 8));
    }
    assert_eq!(expect.len(), THREADS.div_ceil(8));
    for (a, v) in expect {
        assert_eq!(m.read_u64(a), Ok(v), "word {a:#x}");
    }
}

// ----- 32-bit adds ------------------------------------------------------------------------------

#[test]
fn fetch_add32_exact_and_lanes_independent() {
    let m = mem();
    let delta = |t: usize| (t as u32).wrapping_mul(2_654_435_761) | 1;
    // start near the top so both lanes wrap many times
    let init = 0xFFFF_FFF0_FFFF_FFF0u64;
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        for l in 0..locs {
            m.write_u64(addr(l), init).unwrap();
        }
        // per thread, per location: (sum of lane-0 deltas, sum of lane-1 deltas, telescoping
        // accumulators of the two lanes)
        let per_thread: Vec<Vec<[u32; 4]>> = run(|t| {
            let lane = (t % 2) as u8;
            let mut acc = vec![[0u32; 4]; locs];
            for j in 0..OPS {
                let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
                let d = delta(t);
                let old = m.fetch_add32(addr(loc), lane, d).unwrap();
                let e = &mut acc[loc];
                e[lane as usize] = e[lane as usize].wrapping_add(d);
                e[2 + lane as usize] ^= old ^ old.wrapping_add(d);
            }
            acc
        });
        for l in 0..locs {
            let mut sum = [0u32; 4];
            for p in &per_thread {
                sum[0] = sum[0].wrapping_add(p[l][0]);
                sum[1] = sum[1].wrapping_add(p[l][1]);
                sum[2] ^= p[l][2];
                sum[3] ^= p[l][3];
            }
            let fin = m.read_u64(addr(l)).unwrap();
            let (hi, lo) = ((fin >> 32) as u32, fin as u32);
            let (ihi, ilo) = ((init >> 32) as u32, init as u32);
            assert_eq!(hi, ihi.wrapping_add(sum[0]), "loc {l} lane 0");
            assert_eq!(lo, ilo.wrapping_add(sum[1]), "loc {l} lane 1");
            assert_eq!(sum[2], ihi ^ hi, "loc {l} lane 0 telescoping");
            assert_eq!(sum[3], ilo ^ lo, "loc {l} lane 1 telescoping");
        }
    }
}

#[test]
fn vadd32x16_exact() {
    let m = mem();
    let deltas = |t: usize, j: usize| -> [u32; 16] {
        std::array::from_fn(|i| {
            // some lanes zero, some huge, so the fetch-add and CAS paths both run
            if (t + i + j).is_multiple_of(5) {
                0
            } else {
                rnd(t, j, i as u64) as u32
            }
        })
    };
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        for l in 0..locs {
            m.write(addr(l), &[0xFF; 64]).unwrap();
        }
        let per_thread: Vec<Vec<[u32; 16]>> = run(|t| {
            let mut sum = vec![[0u32; 16]; locs];
            for j in 0..OPS {
                let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
                let d = deltas(t, j);
                m.vadd32x16(addr(loc), &d).unwrap();
                for (s, x) in sum[loc].iter_mut().zip(d) {
                    *s = s.wrapping_add(x);
                }
            }
            sum
        });
        for l in 0..locs {
            let mut want = [u32::MAX; 16];
            for p in &per_thread {
                for (w, x) in want.iter_mut().zip(p[l]) {
                    *w = w.wrapping_add(x);
                }
            }
            let mut line = [0u8; 64];
            m.read(addr(l), &mut line).unwrap();
            let got: Vec<u32> = line
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
                .collect();
            assert_eq!(got, want, "location {l}");
        }
    }
}

/// Words of the gradient buffer the `vadd32_be` tests add into: 64 lines, one 4 KB packet.
const GRAD_WORDS: u64 = 512;

/// A random vector of `words` words of big-endian lanes, mixing every path of the vector add:
/// zero pairs, zero low lanes, lanes that wrap, random lanes.
fn grad_vector(t: usize, j: usize, words: u64) -> Vec<u8> {
    (0..words as usize)
        .flat_map(|i| {
            let r = rnd(t, j, 100 + i as u64);
            let w = match r % 8 {
                0 => 0,
                1 => r & 0xFFFF_FFFF_0000_0000,
                2 => u64::MAX,
                3 => 0x0000_0001_0000_0001,
                _ => mix(r),
            };
            w.to_be_bytes()
        })
        .collect()
}

/// 2 to 64 threads add random vectors (1 to 64 lines, any word offset, via `vadd32_be` and
/// `vadd32x16`) into the same 4 KB buffer: every lane ends at its initial value plus the
/// wrapping sum of all deltas added to it.
#[test]
fn vadd32_be_exact_from_2_to_64_threads() {
    let m = mem();
    let max_threads = if cfg!(miri) { 3 } else { 64 };
    for threads in 2..=max_threads {
        // SRAM, DRAM, and the accumulator region across a stripe boundary in turn
        let base = match threads % 3 {
            0 => 1 << 16,
            1 => DRAM_BASE + 4096,
            _ => ACC_BASE + ACC_STRIPE_WORDS - 200,
        };
        let init = 0xFFFF_FFF0_7FFF_FFFFu64;
        for i in 0..GRAD_WORDS {
            m.write_u64(base + i, init).unwrap();
        }
        let ops = if cfg!(miri) {
            2
        } else {
            (768 / threads).max(8)
        };
        let sums: Vec<Vec<u32>> = run_n(threads, |t| {
            let mut sum = vec![0u32; 2 * GRAD_WORDS as usize];
            for j in 0..ops {
                let r = rnd(t, j, 99);
                let words = if r.is_multiple_of(8) {
                    8
                } else {
                    8 * (1 + (r >> 8) % 64)
                };
                let off = (r >> 20) % (GRAD_WORDS - words + 1);
                let data = grad_vector(t, j, words);
                if words == 8 && r.is_multiple_of(16) {
                    let lanes: [u32; 16] = std::array::from_fn(|l| {
                        u32::from_be_bytes(data[4 * l..4 * l + 4].try_into().unwrap())
                    });
                    m.vadd32x16(base + off, &lanes).unwrap();
                } else {
                    m.vadd32_be(base + off, &data).unwrap();
                }
                for (l, c) in data.chunks_exact(4).enumerate() {
                    let lane = &mut sum[2 * off as usize + l];
                    *lane = lane.wrapping_add(u32::from_be_bytes(c.try_into().unwrap()));
                }
            }
            sum
        });
        for i in 0..GRAD_WORDS as usize {
            let hi = sums
                .iter()
                .fold((init >> 32) as u32, |a, s| a.wrapping_add(s[2 * i]));
            let lo = sums
                .iter()
                .fold(init as u32, |a, s| a.wrapping_add(s[2 * i + 1]));
            assert_eq!(
                m.read_u64(base + i as u64),
                Ok((u64::from(hi) << 32) | u64::from(lo)),
                "{threads} threads, word {i}"
            );
        }
    }
}

/// The vector add is one atomic step per word, so every other operation on the same words,
/// and every reader, sees only values some sequential order produces. Here every operation
/// keeps bit 32 (the high lane's lowest bit) clear: vector adds add even high lanes (and random
/// low lanes, which carry often), the other ops (`fetch_and`, `fetch_xor`, `masked_write`,
/// `fetch_swap`, `write`, `fetch_add32`) use values and masks with bit 32 clear. A design whose
/// low-lane carry is visible for a moment (a 64-bit fetch-add then a fix-up) shows an odd high
/// lane to a reader, or keeps one after a swap or AND lands between add and fix-up.
#[test]
fn vadd32_be_shows_no_carry_to_other_ops() {
    no_carry_to_other_ops((1 << 16) + 4096);
}

/// The same in the accumulator region, over a stripe boundary: every write there is applied
/// under the stripe's lock with a plain load and store, so an operation that bypassed the
/// lock would be overwritten by (or overwrite) a vector add's store.
#[test]
fn acc_vadd32_be_shows_no_carry_to_other_ops() {
    no_carry_to_other_ops(ACC_BASE + 3 * ACC_STRIPE_WORDS - 100);
}

/// Threads mix every additive operation on the same accumulator words (vector adds, 32-bit
/// adds to both lanes, counter additions, posted vector adds and posted 32-bit adds through
/// their own `PostedOps`), over a stripe boundary: each lane must end at the exact wrapping
/// sum. A path that updated an accumulator word without its stripe's lock (a plain load and
/// store racing the locked ones) loses updates and fails this.
#[test]
fn acc_mixed_adds_exact() {
    let m = mem();
    let base = ACC_BASE + 5 * ACC_STRIPE_WORDS - GRAD_WORDS / 2;
    let words = GRAD_WORDS as usize;
    let ops = if cfg!(miri) { 4 } else { 4000 };
    let sums: Vec<Vec<u32>> = run_n(if cfg!(miri) { 3 } else { 16 }, |t| {
        let mut sum = vec![0u32; 2 * words];
        let mut posted = PostedOps::new(4);
        let mut add = |w: usize, lane: usize, d: u32| {
            sum[2 * w + lane] = sum[2 * w + lane].wrapping_add(d);
        };
        for j in 0..ops {
            let r = rnd(t, j, 400);
            let w = ((r >> 8) % GRAD_WORDS) as usize;
            let d = rnd(t, j, 401) as u32;
            match r % 6 {
                0 | 1 => {
                    let n = 8 * (1 + (r >> 20) % 64);
                    let off = (r >> 32) % (GRAD_WORDS - n + 1);
                    let data = grad_vector(t, j, n);
                    if r.is_multiple_of(6) {
                        m.vadd32_be(base + off, &data).unwrap();
                    } else {
                        // two posted halves that continue each other: one span at the engine
                        let half = data.len() / 2 / 64 * 64;
                        if half > 0 {
                            posted
                                .post_vadd32_be(&m, base + off, &data[..half])
                                .unwrap();
                        }
                        posted
                            .post_vadd32_be(&m, base + off + half as u64 / 8, &data[half..])
                            .unwrap();
                    }
                    for (l, c) in data.chunks_exact(4).enumerate() {
                        add(
                            off as usize + l / 2,
                            l % 2,
                            u32::from_be_bytes(c.try_into().unwrap()),
                        );
                    }
                }
                2 => {
                    let lane = (r >> 40) as usize % 2;
                    m.fetch_add32(base + w as u64, lane as u8, d).unwrap();
                    add(w, lane, d);
                }
                3 if w + 1 < words => {
                    // 64-bit additions with a zero low half: lane-0 adds of both words
                    let (p, b) = (u64::from(d) << 32, rnd(t, j, 402) << 32);
                    m.counter_add(base + w as u64, p >> 32 << 32, b).unwrap();
                    add(w, 0, (p >> 32) as u32);
                    add(w + 1, 0, (b >> 32) as u32);
                }
                4 => {
                    let lane = (r >> 40) as u8 % 2;
                    posted
                        .post(
                            &m,
                            Op::FetchAdd32 {
                                addr: base + w as u64,
                                lane,
                                delta: d,
                            },
                        )
                        .unwrap();
                    add(w, usize::from(lane), d);
                }
                _ => {
                    let mut line = [0u8; 64];
                    m.read(base + (r >> 40) % (GRAD_WORDS - 7), &mut line)
                        .unwrap();
                }
            }
        }
        posted.flush(&m);
        sum
    });
    for i in 0..words {
        let hi = sums.iter().fold(0u32, |a, s| a.wrapping_add(s[2 * i]));
        let lo = sums.iter().fold(0u32, |a, s| a.wrapping_add(s[2 * i + 1]));
        assert_eq!(
            m.read_u64(base + i as u64),
            Ok((u64::from(hi) << 32) | u64::from(lo)),
            "word {i}"
        );
    }
    assert_eq!(m.read_u64(base - 1), Ok(0));
    assert_eq!(m.read_u64(base + GRAD_WORDS), Ok(0));
}

fn no_carry_to_other_ops(base: Addr) {
    let m = mem();
    const BIT: u64 = 1 << 32;
    let odd = |v: u64| v & BIT != 0;
    let seen_odd = run(|t| {
        let mut bad = 0usize;
        for j in 0..OPS {
            let r = rnd(t, j, 200);
            let a = base + (r >> 8) % GRAD_WORDS;
            let v = rnd(t, j, 201) & !BIT;
            match t % 8 {
                0..=3 => {
                    let words = 8 * (1 + (r >> 20) % 8);
                    let off = (r >> 32) % (GRAD_WORDS - words + 1);
                    let data: Vec<u8> = (0..words)
                        .flat_map(|i| (rnd(t, j, 300 + i) & !BIT).to_be_bytes())
                        .collect();
                    m.vadd32_be(base + off, &data).unwrap();
                }
                4 => bad += odd(m.fetch_and(a, v | 0xFFFF_FFFF).unwrap()) as usize,
                5 => {
                    let old = match r % 3 {
                        0 => m.fetch_xor(a, v).unwrap(),
                        1 => m.masked_write(a, v, rnd(t, j, 202)).unwrap(),
                        _ => m.fetch_swap(a, v).unwrap(),
                    };
                    bad += odd(old) as usize;
                }
                6 => {
                    let old = m.fetch_add32(a, (r % 2) as u8, v as u32 & !1).unwrap();
                    bad += (r.is_multiple_of(2) && old & 1 != 0) as usize;
                    if r.is_multiple_of(7) {
                        m.write(a - a % 8, &[0x5A; 64]).unwrap(); // 0x5A: bit 32 clear
                    }
                }
                _ => {
                    bad += odd(m.read_u64(a).unwrap()) as usize;
                    let mut line = [0u8; 64];
                    m.read(base + (r >> 40) % (GRAD_WORDS - 7), &mut line)
                        .unwrap();
                    bad += line.chunks_exact(8).filter(|w| w[3] & 1 != 0).count();
                }
            }
        }
        bad
    });
    assert_eq!(
        seen_odd.iter().sum::<usize>(),
        0,
        "per thread: {seen_odd:?}"
    );
    for a in base..base + GRAD_WORDS {
        assert!(!odd(m.read_u64(a).unwrap()), "word {a:#x}");
    }
}

// ----- reads and writes -------------------------------------------------------------------------

/// A self-checking word: thread, sequence number, word position and a check field.
fn pattern(t: usize, j: usize, pos: usize) -> u64 {
    let body = ((t as u64) << 24) | ((j as u64) << 4) | pos as u64;
    (mix(body) << 40) | body
}

/// `Some((t, j))` when `w` is a valid pattern for position `pos`; initial zeros are valid too.
fn decode(w: u64, pos: usize) -> Option<Option<(usize, usize)>> {
    if w == 0 {
        return Some(None);
    }
    let body = w & ((1 << 40) - 1);
    let ok = (mix(body) << 40) | body == w && (body & 0xF) as usize == pos;
    ok.then_some(Some((
        (body >> 24) as usize,
        ((body >> 4) & 0xF_FFFF) as usize,
    )))
}

#[test]
fn write_read_64_bytes_one_line() {
    let m = mem();
    // even ops write a whole line, odd ops read it: every word read is a complete, valid
    // pattern for its position (never torn)
    let last_writes = run(|t| {
        let mut buf = [0u8; 64];
        let mut last = None;
        for j in 0..OPS {
            if (j + t) % 2 == 0 {
                for (pos, c) in buf.chunks_exact_mut(8).enumerate() {
                    c.copy_from_slice(&pattern(t, j, pos).to_be_bytes());
                }
                m.write(ONE, &buf).unwrap();
                last = Some(j);
            } else {
                m.read(ONE, &mut buf).unwrap();
                for (pos, c) in buf.chunks_exact(8).enumerate() {
                    let w = u64::from_be_bytes(c.try_into().unwrap());
                    assert!(decode(w, pos).is_some(), "torn word {w:#x} at {pos}");
                }
            }
        }
        last
    });
    // per word, the final value is the last write of some thread
    let mut line = [0u8; 64];
    m.read(ONE, &mut line).unwrap();
    for (pos, c) in line.chunks_exact(8).enumerate() {
        let w = u64::from_be_bytes(c.try_into().unwrap());
        let (t, j) = decode(w, pos).unwrap().expect("written");
        assert_eq!(
            last_writes[t],
            Some(j),
            "word {pos} is not thread {t}'s last write"
        );
    }
}

#[test]
fn write_read_8_bytes_one_word() {
    let m = mem();
    let last_writes = run(|t| {
        let mut last = 0;
        for j in 0..OPS {
            if j % 3 == 0 {
                let mut b = [0u8; 8];
                m.read(ONE + 3, &mut b).unwrap();
                assert!(decode(u64::from_be_bytes(b), 3).is_some());
            } else if j % 3 == 1 {
                assert!(decode(m.read_u64(ONE + 3).unwrap(), 3).is_some());
            } else {
                if t % 2 == 0 {
                    m.write_u64(ONE + 3, pattern(t, j, 3)).unwrap();
                } else {
                    m.write(ONE + 3, &pattern(t, j, 3).to_be_bytes()).unwrap();
                }
                last = j;
            }
        }
        last
    });
    let (t, j) = decode(m.read_u64(ONE + 3).unwrap(), 3).unwrap().unwrap();
    assert_eq!(last_writes[t], j);
}

#[test]
fn write_read_spread_own_lines() {
    let m = mem();
    // each thread owns line t (2 per bank and region pair); sizes 8..64 bytes; every read
    // returns exactly what the thread wrote last
    let line = |t: usize| spread(t % SPREAD) + 8 * 64 * (t / SPREAD) as Addr;
    run(|t| {
        let a = line(t);
        let mut mine = [0u64; 8];
        for j in 0..OPS {
            let words = 1 + (rnd(t, j, 9) % 8) as usize;
            let off = (rnd(t, j, 10) % (9 - words as u64)) as usize;
            if j % 2 == 0 {
                let data: Vec<u8> = (0..words)
                    .flat_map(|i| pattern(t, j, off + i).to_be_bytes())
                    .collect();
                m.write(a + off as Addr, &data).unwrap();
                for i in 0..words {
                    mine[off + i] = pattern(t, j, off + i);
                }
            } else {
                let mut buf = vec![0u8; 8 * words];
                m.read(a + off as Addr, &mut buf).unwrap();
                for (i, c) in buf.chunks_exact(8).enumerate() {
                    assert_eq!(u64::from_be_bytes(c.try_into().unwrap()), mine[off + i]);
                }
            }
        }
        let mut buf = [0u8; 64];
        m.read(a, &mut buf).unwrap();
        for (i, c) in buf.chunks_exact(8).enumerate() {
            assert_eq!(u64::from_be_bytes(c.try_into().unwrap()), mine[i]);
        }
    });
}

// ----- policers ---------------------------------------------------------------------------------

const T0: u64 = 1_000_000_000;

fn pcfg() -> PolicerConfig {
    PolicerConfig {
        cir_bytes_per_sec: 1_000_000,
        cbs_bytes: 64_000,
        ebs_bytes: 32_000,
    }
}

fn tally(c: Color, n: &mut [u64; 3]) {
    n[match c {
        Color::Green => 0,
        Color::Yellow => 1,
        Color::Red => 2,
    }] += 1;
}

/// Frozen clock, 100-byte packets: exactly CBS/100 green and EBS/100 yellow per policer.
#[test]
fn police_frozen_clock_admits_exactly_the_buckets() {
    let m = mem();
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        for l in 0..locs {
            m.policer_init(addr(l), pcfg(), T0).unwrap();
        }
        let per_thread: Vec<Vec<[u64; 3]>> = run(|t| {
            let mut n = vec![[0u64; 3]; locs];
            for j in 0..OPS {
                let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
                tally(m.police(addr(loc), 100, T0).unwrap(), &mut n[loc]);
            }
            n
        });
        for l in 0..locs {
            let mut n = [0u64; 3];
            for p in &per_thread {
                for k in 0..3 {
                    n[k] += p[l][k];
                }
            }
            let total = (THREADS * OPS / locs) as u64;
            let green = total.min(640);
            let yellow = (total - green).min(320);
            assert_eq!(n, [green, yellow, total - green - yellow], "policer {l}");
            let s = m.policer_state(addr(l)).unwrap();
            assert_eq!((s.committed_tokens, s.excess_tokens), (0, 0));
        }
    }
}

/// Frozen clock, varied sizes: green bytes + Tc left = CBS, yellow bytes + Te left = EBS.
#[test]
fn police_varied_sizes_conserve_tokens() {
    let m = mem();
    m.policer_init(ONE, pcfg(), T0).unwrap();
    let per_thread = run(|t| {
        let mut bytes = [0u64; 3];
        for j in 0..OPS / 4 {
            let b = 40 + rnd(t, j, 11) % 1461;
            let c = m.police(ONE, b, T0).unwrap();
            let mut n = [0u64; 3];
            tally(c, &mut n);
            for k in 0..3 {
                bytes[k] += n[k] * b;
            }
        }
        bytes
    });
    let green: u64 = per_thread.iter().map(|b| b[0]).sum();
    let yellow: u64 = per_thread.iter().map(|b| b[1]).sum();
    let s = m.policer_state(ONE).unwrap();
    assert_eq!(green + s.committed_tokens, pcfg().cbs_bytes);
    assert_eq!(yellow + s.excess_tokens, pcfg().ebs_bytes);
    assert!(green > 0 && yellow > 0);
}

/// Moving clock shared by all threads (each op takes the next tick, so calls arrive out of
/// order): admitted bytes never exceed CBS + EBS + CIR * elapsed.
#[test]
fn police_moving_clock_bounded() {
    let m = mem();
    let cfg = PolicerConfig {
        cir_bytes_per_sec: 100_000_000, // 1 byte per 10 ns
        cbs_bytes: 10_000,
        ebs_bytes: 5_000,
    };
    m.policer_init(ONE, cfg, T0).unwrap();
    let clock = AtomicU64::new(T0);
    let per_thread = run(|t| {
        let mut admitted = 0u64;
        for j in 0..OPS {
            let now = clock.fetch_add(7, Ordering::Relaxed);
            let b = 64 + rnd(t, j, 12) % 200;
            if m.police(ONE, b, now).unwrap() != Color::Red {
                admitted += b;
            }
        }
        admitted
    });
    let admitted: u64 = per_thread.iter().sum();
    let s = m.policer_state(ONE).unwrap();
    let elapsed = s.last_ns - T0;
    assert!(elapsed <= clock.load(Ordering::Relaxed) - T0);
    let refill = cfg.cir_bytes_per_sec as u128 * elapsed as u128 / 1_000_000_000;
    let budget = (cfg.cbs_bytes + cfg.ebs_bytes) as u128 + refill;
    assert!(
        admitted as u128 + (s.committed_tokens + s.excess_tokens) as u128 <= budget,
        "admitted {admitted} + left > budget {budget}"
    );
    // the offered load (~164 B per 7 ns) far exceeds the rate, so the policer must have
    // admitted at least the refill minus what a full bucket could discard
    assert!(
        admitted as u128 >= refill / 2,
        "admitted {admitted}, refill {refill}"
    );
}

// ----- posted (asynchronous) operations ---------------------------------------------------------

#[test]
fn posted_ops_applied_exactly_once() {
    let m = mem();
    for (locs, addr) in [(1, one as fn(usize) -> Addr), (SPREAD, spread)] {
        for l in 0..locs {
            m.write(addr(l), &[0; 64]).unwrap();
        }
        let per_thread: Vec<Vec<(u64, u64, u32, u64)>> = run(|t| {
            let mut p = PostedOps::new(1 + t % 32);
            // (packets, bytes, lane-1 sum of word +2, xor of word +3) per location
            let mut exp = vec![(0u64, 0u64, 0u32, 0u64); locs];
            for j in 0..OPS {
                let loc = if locs == 1 { 0 } else { spread_idx(t, j) };
                let a = addr(loc);
                let b = pkt_bytes(t, j);
                let x = rnd(t, j, 13);
                let d = rnd(t, j, 14) as u32;
                p.post(&m, Op::CounterInc { addr: a, bytes: b }).unwrap();
                p.post(
                    &m,
                    Op::FetchAdd32 {
                        addr: a + 2,
                        lane: 1,
                        delta: d,
                    },
                )
                .unwrap();
                p.post(
                    &m,
                    Op::FetchXor {
                        addr: a + 3,
                        mask: x,
                    },
                )
                .unwrap();
                let e = &mut exp[loc];
                e.0 += 1;
                e.1 += b;
                e.2 = e.2.wrapping_add(d);
                e.3 ^= x;
                assert!(p.len() <= p.capacity());
                if j % 97 == 0 {
                    p.flush(&m);
                    assert!(p.is_empty());
                }
            }
            p.flush(&m);
            exp
        });
        for l in 0..locs {
            let want = per_thread.iter().fold((0, 0, 0u32, 0), |acc, p| {
                let e = p[l];
                (
                    acc.0 + e.0,
                    acc.1 + e.1,
                    acc.2.wrapping_add(e.2),
                    acc.3 ^ e.3,
                )
            });
            let a = addr(l);
            assert_eq!(m.counter_read(a), Ok((want.0, want.1)), "location {l}");
            assert_eq!(m.read_u64(a + 2), Ok(u64::from(want.2)), "location {l}");
            assert_eq!(m.read_u64(a + 3), Ok(want.3), "location {l}");
        }
    }
}

/// Posted and synchronous operations on the same counter mix without losing updates.
#[test]
fn posted_and_sync_mix() {
    let m = mem();
    run(|t| {
        let mut p = PostedOps::new(8);
        for j in 0..OPS {
            if (t + j) % 2 == 0 {
                p.post(
                    &m,
                    Op::CounterInc {
                        addr: ONE,
                        bytes: 3,
                    },
                )
                .unwrap();
            } else {
                m.counter_inc(ONE, 3).unwrap();
            }
        }
        p.flush(&m);
    });
    let n = (THREADS * OPS) as u64;
    assert_eq!(m.counter_read(ONE), Ok((n, 3 * n)));
}

// ----- faults under concurrency ------------------------------------------------------------------

#[test]
fn faults_are_reported_not_panics_under_load() {
    let m = mem();
    let sram_end = m.region(Region::Sram).end;
    let bad = [sram_end, sram_end - 1, DRAM_BASE - 1, u64::MAX];
    let faults = run(|t| {
        let mut n = 0usize;
        for j in 0..OPS / 8 {
            let a = bad[(t + j) % bad.len()];
            n += m.counter_inc(a, 1).is_err() as usize;
            m.fetch_or(ONE, 1).unwrap();
        }
        n
    });
    // sram_end - 1 is a valid word but not a valid 2-word counter: every call faults
    assert_eq!(faults.iter().sum::<usize>(), THREADS * (OPS / 8));
    assert_eq!(m.read_u64(sram_end - 1), Ok(0));
}
