//! Throughput of the Shared Memory System's XTXNs under contention.
//!
//! For each operation kind: uncontended (1 thread), then 2, 16 and 256 threads either all on
//! ONE location (`one/N`) or each on its own 64-byte line, spread over the banks (`spread/N`).
//! One criterion iteration is one operation (by whichever thread), so the reported
//! elements/s is total operations per second. Threads are spawned and the memory is built
//! outside the timed region: the clock runs from the first thread's start (all are released by
//! one barrier) to the moment the last thread finishes its share. A baseline group runs a raw `AtomicU64::fetch_add` on one
//! shared location with the same thread counts, so results read as a ratio to the hardware.
//!
//! The `vadd32_be` group measures the vector add of packet-borne gradients
//! (`SharedMemory::vadd32_be`, 4 KB = 1024 lanes per iteration, throughput in lanes) against
//! the candidate designs it was chosen from and a plain non-atomic loop; set `RMW_VADD_ROUNDS`
//! for an interleaved comparison of all of them (see `vadd_interleaved`).
//!
//! The `fpisa` group measures FPISA's shift-and-add of 1024 FP32 lanes into accumulator words
//! (`SharedMemory::fpisa_add_be`, both variants), the write of a block's first packet
//! (`SharedMemory::fpisa_write_be`), next to the integer vector add of as many lanes into
//! the same region, and the renormalization of 1024 sums into FP32
//! (`pfemu::fpisa::fp32_values_be`); one thread, buffers that stay in cache.
//!
//! Run: `cargo bench --bench rmw` (add `-- --quick` for a shorter run, or a filter such as
//! `-- counter_inc`).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::cell::{Cell, RefCell};
use std::sync::{Arc, OnceLock};

use pfemu::mem::{Addr, MemConfig, Op, PolicerConfig, SharedMemory};
use pfemu::program::{Done, Entry, Harness, Program, Verdict};

const THREAD_COUNTS: [usize; 3] = [2, 16, 256];
/// The contended location (line-aligned, so 64-byte ops stay in one bank).
const ONE: Addr = 4096;
/// First line of the per-thread lines: thread t uses line `SPREAD_BASE / 8 + t`, which is in
/// bank `t % banks`.
const SPREAD_BASE: Addr = 1 << 16;

fn spread_addr(t: usize) -> Addr {
    SPREAD_BASE + 8 * t as Addr
}

/// Minimum operations per thread in one timed run with several threads: releasing hundreds of
/// threads from a barrier on a 2-core machine takes a while, and that start-up skew must be
/// small next to the work, whatever iteration count criterion asks for.
const MIN_OPS_PER_THREAD: u64 = 10_000;

/// Time for `iters` operations `op(thread, i)` shared out over `threads` threads: runs at least
/// `MIN_OPS_PER_THREAD` per thread (scaling the measured time back to `iters`), timed from the
/// first thread's start to the last thread's finish.
fn timed<F>(threads: usize, iters: u64, op: &F) -> Duration
where
    F: Fn(usize, u64) + Sync,
{
    timed_mut(&mut vec![(); threads], iters, &|_, t, i| op(t, i))
}

/// [`timed`] with per-thread state: thread `t` runs `op(&mut states[t], t, i)`.
fn timed_mut<S, F>(states: &mut [S], iters: u64, op: &F) -> Duration
where
    S: Send,
    F: Fn(&mut S, usize, u64) + Sync,
{
    let threads = states.len();
    if threads == 1 {
        let s = &mut states[0];
        let start = Instant::now();
        for i in 0..iters {
            op(s, 0, i);
        }
        return start.elapsed();
    }
    // Each thread stamps its own start (right after the barrier releases it) and finish; the
    // measured span runs from the earliest start to the latest finish.
    let total = iters.max(MIN_OPS_PER_THREAD * threads as u64);
    let barrier = Barrier::new(threads);
    let elapsed = thread::scope(|s| {
        let handles: Vec<_> = states
            .iter_mut()
            .enumerate()
            .map(|(t, state)| {
                let n = total / threads as u64 + u64::from((t as u64) < total % threads as u64);
                let barrier = &barrier;
                thread::Builder::new()
                    .stack_size(128 << 10)
                    .spawn_scoped(s, move || {
                        barrier.wait();
                        let start = Instant::now();
                        for i in 0..n {
                            op(state, t, i);
                        }
                        (start, Instant::now())
                    })
                    .expect("spawn")
            })
            .collect();
        let spans: Vec<(Instant, Instant)> = handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect();
        let start = spans.iter().map(|s| s.0).min().expect("threads > 0");
        let end = spans.iter().map(|s| s.1).max().expect("threads > 0");
        end.saturating_duration_since(start)
    });
    elapsed.mul_f64(iters as f64 / total as f64)
}

fn memory() -> SharedMemory {
    SharedMemory::new(&MemConfig::default()).expect("default config")
}

/// One benchmark group: `op(mem, addr, thread, i)` at 1 thread, then ONE / spread at every
/// thread count.
fn group<F>(c: &mut Criterion, name: &str, mem: &SharedMemory, op: F)
where
    F: Fn(&SharedMemory, Addr, usize, u64) + Sync,
{
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(1));
    g.bench_function(BenchmarkId::new("uncontended", 1), |b| {
        b.iter_custom(|iters| timed(1, iters, &|t, i| op(mem, ONE, t, i)))
    });
    for &n in &THREAD_COUNTS {
        g.bench_function(BenchmarkId::new("one", n), |b| {
            b.iter_custom(|iters| timed(n, iters, &|t, i| op(mem, ONE, t, i)))
        });
        g.bench_function(BenchmarkId::new("spread", n), |b| {
            b.iter_custom(|iters| timed(n, iters, &|t, i| op(mem, spread_addr(t), t, i)))
        });
    }
    g.finish();
}

fn baseline(c: &mut Criterion) {
    let word = AtomicU64::new(0);
    let mut g = c.benchmark_group("raw_atomic_fetch_add");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .throughput(Throughput::Elements(1));
    for n in [1].into_iter().chain(THREAD_COUNTS) {
        g.bench_function(BenchmarkId::new("one", n), |b| {
            b.iter_custom(|iters| {
                timed(n, iters, &|_, _| {
                    word.fetch_add(1, Ordering::AcqRel);
                })
            })
        });
    }
    g.finish();
}

/// Posted counter increments flushed every `FLUSH_EVERY` posts, as a PPE thread flushes
/// once per batch of 32 packets.
const FLUSH_EVERY: u64 = 32;

/// The memory every group runs on (the posted group reaches it through a [`Harness`], which
/// holds an `Arc`).
fn shared_memory() -> &'static Arc<SharedMemory> {
    static MEM: OnceLock<Arc<SharedMemory>> = OnceLock::new();
    MEM.get_or_init(|| Arc::new(memory()))
}

thread_local! {
    /// The counter and the iteration the posting program works on next.
    static POST_AT: Cell<(Addr, u64)> = const { Cell::new((0, 0)) };
    /// Each bench thread's PPE-thread stand-in: a [`Harness`] running [`posting_program`],
    /// whose posted XTXNs are applied when the run ends, as a PPE thread's are at the end of
    /// a batch.
    static POSTER: RefCell<(Harness, Program)> =
        RefCell::new((Harness::new(Arc::clone(shared_memory())), posting_program()));
}

/// One instruction that posts `FLUSH_EVERY` increments of the counter at `POST_AT` (the
/// posted buffer is the engine's own: programs reach it through `Thread::post`).
fn posting_program() -> Program {
    let mut p = Program::builder("post-counters");
    let a = p.label("post");
    p.instr(a, |t| {
        let (addr, last) = POST_AT.with(Cell::get);
        for i in last + 1 - FLUSH_EVERY..=last {
            t.post(Op::CounterInc {
                addr,
                bytes: 64 + (i & 63),
            })?;
        }
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, a);
    p.build().expect("a valid program")
}

fn rmw(c: &mut Criterion) {
    baseline(c);
    let m = shared_memory();
    group(c, "counter_inc", m, |m, a, _, i| {
        m.counter_inc(a, 64 + (i & 1023)).unwrap();
    });
    // Every `FLUSH_EVERY`th iteration runs the program once: its posts, its flush and the
    // harness's per-packet work (loading a 64-byte head) are spread over the iterations.
    group(c, "counter_inc_posted", m, |_, a, _, i| {
        if i % FLUSH_EVERY == FLUSH_EVERY - 1 {
            POST_AT.with(|p| p.set((a, i)));
            POSTER.with(|p| {
                let (h, program) = &mut *p.borrow_mut();
                let out = h.run(program, 0, &[0u8; 64]);
                assert_eq!(out.result, Ok(Verdict::Consume));
            })
        }
    });
    group(c, "fetch_or", m, |m, a, t, _| {
        black_box(m.fetch_or(a, 1 << (t % 64)).unwrap());
    });
    group(c, "fetch_swap", m, |m, a, _, i| {
        black_box(m.fetch_swap(a, i).unwrap());
    });
    group(c, "masked_write", m, |m, a, t, i| {
        let shift = 8 * (t % 8);
        black_box(m.masked_write(a, i << shift, 0xFF << shift).unwrap());
    });
    group(c, "fetch_add32_low_lane", m, |m, a, _, _| {
        black_box(m.fetch_add32(a, 1, 3).unwrap());
    });
    let deltas: [u32; 16] = std::array::from_fn(|i| i as u32 + 1);
    group(c, "vadd32x16", m, |m, a, _, _| {
        m.vadd32x16(a, &deltas).unwrap();
    });
    group(c, "read_8B", m, |m, a, _, _| {
        let mut b = [0u8; 8];
        m.read(a, &mut b).unwrap();
        black_box(b);
    });
    group(c, "read_64B", m, |m, a, _, _| {
        let mut b = [0u8; 64];
        m.read(a, &mut b).unwrap();
        black_box(b);
    });
    group(c, "write_64B", m, |m, a, _, i| {
        m.write(a, &[i as u8; 64]).unwrap();
    });

    let cfg = PolicerConfig {
        cir_bytes_per_sec: 1_000_000_000,
        cbs_bytes: 1 << 20,
        ebs_bytes: 1 << 20,
    };
    m.policer_init(ONE, cfg, 0).unwrap();
    for t in 0..256 {
        m.policer_init(spread_addr(t), cfg, 0).unwrap();
    }
    group(c, "police", m, |m, a, _, i| {
        black_box(m.police(a, 100, i * 100).unwrap());
    });
}

// ----- vector add of packet-borne gradients (`SharedMemory::vadd32_be`) -------------------------

/// Candidate implementations of the lane-wise 32-bit vector add, each over a plain slice of
/// `AtomicU64` words with the shared memory's layout (lane `2i` = high half of word `i`), so
/// they can be compared with each other, with the library's own `vadd32_be`, and with a plain
/// non-atomic loop. `data` holds the big-endian lanes as they sit in a packet, 8 bytes per word:
/// `u64::from_be_bytes` of a word's 8 bytes is exactly its packed pair of lane deltas.
mod vadd {
    use std::sync::atomic::{AtomicU64, Ordering};

    const LOAD: Ordering = Ordering::Acquire;
    const RMW: Ordering = Ordering::AcqRel;

    #[inline]
    fn be(c: &[u8]) -> u64 {
        u64::from_be_bytes(c.try_into().expect("8 bytes"))
    }

    /// Lane-wise wrapping add of two packed pairs (no carry between the lanes).
    #[inline]
    pub fn add_packed(old: u64, d: u64) -> u64 {
        const MSB: u64 = 0x8000_0000_8000_0000;
        (old & !MSB).wrapping_add(d & !MSB) ^ ((old ^ d) & MSB)
    }

    /// (a) The original code: per 64-byte line, decode 16 lanes, then per word a fetch-add when
    /// the low delta is zero, else a compare-and-swap loop (`fetch_update`).
    pub fn cas_loop(words: &[AtomicU64], data: &[u8]) {
        for (line, bytes) in words.chunks_exact(8).zip(data.chunks_exact(64)) {
            let deltas: [u32; 16] = std::array::from_fn(|i| {
                u32::from_be_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
            });
            for (w, d) in line.iter().zip(deltas.chunks_exact(2)) {
                let (hi, lo) = (d[0], d[1]);
                if lo == 0 {
                    if hi != 0 {
                        w.fetch_add(u64::from(hi) << 32, RMW);
                    }
                } else {
                    let _ = w.fetch_update(RMW, LOAD, |old| {
                        let h = ((old >> 32) as u32).wrapping_add(hi);
                        let l = (old as u32).wrapping_add(lo);
                        Some((u64::from(h) << 32) | u64::from(l))
                    });
                }
            }
        }
    }

    /// (b) One 64-bit fetch-add of the packed pair, then `fetch_sub(1 << 32)` when the low lane
    /// carried into the high one. Final values exact among adds, but the carried state is
    /// visible in between (not linearizable; see `vadd_words` in `src/mem/bank.rs`).
    pub fn xadd_fixup(words: &[AtomicU64], data: &[u8]) {
        for (w, c) in words.iter().zip(data.chunks_exact(8)) {
            let d = be(c);
            if d == 0 {
                continue;
            }
            let old = w.fetch_add(d, RMW);
            if (old as u32).checked_add(d as u32).is_none() {
                w.fetch_sub(1 << 32, RMW);
            }
        }
    }

    /// One word of (c): skip a zero pair, fetch-add a pair with a zero low delta, else
    /// compare-and-swap from `seen`, retried with the value a failure returns.
    #[inline]
    fn cas_word(w: &AtomicU64, d: u64, seen: u64) {
        if d as u32 == 0 {
            if d != 0 {
                w.fetch_add(d, RMW);
            }
            return;
        }
        let mut cur = seen;
        while let Err(now) = w.compare_exchange_weak(cur, add_packed(cur, d), RMW, LOAD) {
            cur = now;
        }
    }

    /// (c) Per word a fresh load and [`cas_word`], first word to last.
    pub fn cas_up(words: &[AtomicU64], data: &[u8]) {
        for (w, c) in words.iter().zip(data.chunks_exact(8)) {
            cas_word(w, be(c), w.load(LOAD));
        }
    }

    /// (c) As `cas_up`, last word to first: the library's design.
    pub fn cas_down(words: &[AtomicU64], data: &[u8]) {
        for (w, c) in words.iter().zip(data.chunks_exact(8)).rev() {
            cas_word(w, be(c), w.load(LOAD));
        }
    }

    /// (c) As `cas_down` but from line `rot % lines` down, wrapping around to the last line, so
    /// threads adding into one buffer at the same time start on different lines.
    pub fn cas_down_rot(words: &[AtomicU64], data: &[u8], rot: usize) {
        let k = 8 * (rot % (words.len() / 8) + 1);
        cas_down(&words[..k], &data[..8 * k]);
        cas_down(&words[k..], &data[8 * k..]);
    }

    /// (c) As `cas_up` with the expected values of `B` words loaded in one pass first (those
    /// loads overlap each other instead of each waiting behind the locked instruction before).
    pub fn cas_batched<const B: usize>(words: &[AtomicU64], data: &[u8]) {
        for (ws, cs) in words.chunks(B).zip(data.chunks(8 * B)) {
            let mut seen = [0u64; B];
            for (s, w) in seen.iter_mut().zip(ws) {
                *s = w.load(LOAD);
            }
            for ((w, c), s) in ws.iter().zip(cs.chunks_exact(8)).zip(seen) {
                cas_word(w, be(c), s);
            }
        }
    }

    /// (d) Speculative fetch-add: guess the low lane's carry from a batched load and subtract
    /// it in the same fetch-add; fix up only when the word changed under the guess. One locked
    /// instruction per word when uncontended, but a mis-guess is visible until fixed up.
    pub fn spec_xadd<const B: usize>(words: &[AtomicU64], data: &[u8]) {
        for (ws, cs) in words.chunks(B).zip(data.chunks(8 * B)) {
            let mut seen = [0u64; B];
            for (s, w) in seen.iter_mut().zip(ws) {
                *s = w.load(LOAD);
            }
            for ((w, c), s) in ws.iter().zip(cs.chunks_exact(8)).zip(seen) {
                let d = be(c);
                if d == 0 {
                    continue;
                }
                let guess = (s as u32).checked_add(d as u32).is_none();
                let old = w.fetch_add(d.wrapping_sub(u64::from(guess) << 32), RMW);
                let carry = (old as u32).checked_add(d as u32).is_none();
                if carry != guess {
                    if carry {
                        w.fetch_sub(1 << 32, RMW);
                    } else {
                        w.fetch_add(1 << 32, RMW);
                    }
                }
            }
        }
    }

    /// NOT a correct vector add (the low lane carries into the high one): one plain 64-bit
    /// fetch-add per word, the floor for any design that needs one locked instruction per word.
    pub fn xadd_only(words: &[AtomicU64], data: &[u8]) {
        for (w, c) in words.iter().zip(data.chunks_exact(8)) {
            w.fetch_add(be(c), RMW);
        }
    }

    /// REFERENCE ONLY, not adoptable (sound only if every other operation on these words took
    /// the same lock): one striped lock per `lock_words` words, then relaxed loads and stores.
    pub fn locked(
        words: &[AtomicU64],
        data: &[u8],
        stripes: &[parking_lot::Mutex<()>],
        lock_words: usize,
    ) {
        for (ws, cs) in words.chunks(lock_words).zip(data.chunks(8 * lock_words)) {
            let stripe = (ws.as_ptr() as usize / 64) % stripes.len();
            let _g = stripes[stripe].lock();
            for (w, c) in ws.iter().zip(cs.chunks_exact(8)) {
                w.store(
                    add_packed(w.load(Ordering::Relaxed), be(c)),
                    Ordering::Relaxed,
                );
            }
        }
    }

    /// REFERENCE ONLY, WRONG under concurrency (loses updates): relaxed load and store per word.
    pub fn racy(words: &[AtomicU64], data: &[u8]) {
        for (w, c) in words.iter().zip(data.chunks_exact(8)) {
            w.store(
                add_packed(w.load(Ordering::Relaxed), be(c)),
                Ordering::Relaxed,
            );
        }
    }

    /// Baseline: plain non-atomic loop over `u64` words of the same layout.
    pub fn plain_u64(words: &mut [u64], data: &[u8]) {
        for (w, c) in words.iter_mut().zip(data.chunks_exact(8)) {
            *w = add_packed(*w, be(c));
        }
    }

    /// Baseline: plain non-atomic loop over the `u32` lanes of the same layout (on a
    /// little-endian host lane `2i` is the `u32` at index `2i + 1`).
    pub fn plain_u32(lanes: &mut [u32], data: &[u8]) {
        for (pair, c) in lanes.chunks_exact_mut(2).zip(data.chunks_exact(8)) {
            let hi = u32::from_be_bytes(c[..4].try_into().expect("4 bytes"));
            let lo = u32::from_be_bytes(c[4..].try_into().expect("4 bytes"));
            pair[1] = pair[1].wrapping_add(hi);
            pair[0] = pair[0].wrapping_add(lo);
        }
    }
}

/// Bytes of one gradient vector (a 4 KB packet's payload): 1024 lanes, 64 lines.
const VEC_BYTES: usize = 4096;
const VEC_WORDS: usize = VEC_BYTES / 8;
const VEC_LANES: u64 = (VEC_BYTES / 4) as u64;
/// The uncontended cases rotate over this many 4 KB buffers (16 MB: past L2, inside L3).
const VEC_BUFS: usize = 4096;
/// Buffers per 1 MiB box of the candidates' memory (as `SharedMemory` allocates DRAM).
const BUFS_PER_CHUNK: usize = 256;
/// The in-cache and contended cases rotate, in step, over this many buffers.
const HOT_BUFS: usize = 4;
/// Distinct packets (random vectors) cycled through.
const PKTS: usize = 8;
/// First word of the buffers in the real `SharedMemory` (DRAM, line-aligned).
const VEC_BASE: Addr = pfemu::mem::DRAM_BASE;

/// The `i`-th buffer of a rotation in scattered order (an odd multiplier permutes any
/// power-of-two set), so that consecutive packets do not hit consecutive buffers, which the
/// hardware prefetcher would follow from one buffer into the next.
fn scatter(i: u64) -> usize {
    (i as usize).wrapping_mul(0x9E37_79B1)
}

/// Who adds into which buffers.
#[derive(Clone, Copy, Debug)]
enum Case {
    /// 1 thread over all `VEC_BUFS` buffers, in scattered order (mostly not in cache).
    One,
    /// 1 thread rotating over `HOT_BUFS` buffers (all in its caches).
    OneHot,
    /// 2 threads, each over its own half of the buffers, scattered.
    TwoPrivate,
    /// 2 threads in step over the same `HOT_BUFS` buffers.
    TwoShared,
    /// 4 threads (on however many cores there are) in step over the same `HOT_BUFS` buffers.
    FourShared,
}

impl Case {
    const ALL: [Case; 5] = [
        Case::One,
        Case::OneHot,
        Case::TwoPrivate,
        Case::TwoShared,
        Case::FourShared,
    ];

    fn threads(self) -> usize {
        match self {
            Case::One | Case::OneHot => 1,
            Case::TwoPrivate | Case::TwoShared => 2,
            Case::FourShared => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Case::One => "uncontended_1t",
            Case::OneHot => "in_cache_1t",
            Case::TwoPrivate => "uncontended_2t",
            Case::TwoShared => "contended_2t",
            Case::FourShared => "contended_4t",
        }
    }

    /// Buffer used by op `i` of thread `t`.
    fn buf(self, t: usize, i: u64) -> usize {
        match self {
            Case::One => scatter(i) % VEC_BUFS,
            Case::TwoPrivate => t * (VEC_BUFS / 2) + scatter(i) % (VEC_BUFS / 2),
            Case::OneHot | Case::TwoShared | Case::FourShared => i as usize % HOT_BUFS,
        }
    }
}

/// A candidate: `(words, data, thread)`.
type Kernel = fn(&[AtomicU64], &[u8], usize);

static STRIPES: [parking_lot::Mutex<()>; 1024] = [const { parking_lot::Mutex::new(()) }; 1024];

const KERNELS: [(&str, Kernel); 12] = [
    ("a_cas_loop", |w, d, _| vadd::cas_loop(w, d)),
    ("b_xadd_fixup", |w, d, _| vadd::xadd_fixup(w, d)),
    ("c_cas_up", |w, d, _| vadd::cas_up(w, d)),
    ("c_cas_down", |w, d, _| vadd::cas_down(w, d)),
    ("c_cas_down_rot", |w, d, t| {
        vadd::cas_down_rot(w, d, 13 + 39 * t)
    }),
    ("c_cas_batched64", |w, d, _| vadd::cas_batched::<64>(w, d)),
    ("d_spec_xadd64", |w, d, _| vadd::spec_xadd::<64>(w, d)),
    ("floor_xadd_only_WRONG", |w, d, _| vadd::xadd_only(w, d)),
    ("ref_lock_per_line", |w, d, _| {
        vadd::locked(w, d, &STRIPES, 8)
    }),
    ("ref_lock_per_4k", |w, d, _| {
        vadd::locked(w, d, &STRIPES, 512)
    }),
    ("ref_relaxed_RACY", |w, d, _| vadd::racy(w, d)),
    // the library's kernel run on the candidates' memory (compare with `api`)
    ("c_cas_down_again", |w, d, _| vadd::cas_down(w, d)),
];

fn packets() -> Vec<Vec<u8>> {
    let mut x = 0x1234_5678_9ABC_DEF0u64;
    (0..PKTS)
        .map(|_| {
            (0..VEC_BYTES)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

/// Everything the vector-add benches run on.
struct VaddBench {
    pkts: Vec<Vec<u8>>,
    /// The candidates' memory: `VEC_BUFS` buffers of `VEC_WORDS` words, in 1 MiB boxes
    /// allocated as `SharedMemory` allocates its DRAM chunks.
    words: Vec<Box<[AtomicU64]>>,
    mem: SharedMemory,
    /// The plain loops' buffers, one set per thread (non-atomic, so never shared).
    plain64: parking_lot::Mutex<Vec<Vec<u64>>>,
    plain32: parking_lot::Mutex<Vec<Vec<u32>>>,
}

impl VaddBench {
    fn new() -> Self {
        let mem = memory();
        // materialise the buffers (DRAM chunks are allocated on first write)
        for b in 0..VEC_BUFS {
            mem.write_u64(VEC_BASE + (b * VEC_WORDS) as Addr, 1)
                .expect("in range");
        }
        VaddBench {
            pkts: packets(),
            words: (0..VEC_BUFS / BUFS_PER_CHUNK)
                .map(|_| {
                    (0..BUFS_PER_CHUNK * VEC_WORDS)
                        .map(|_| AtomicU64::new(0))
                        .collect()
                })
                .collect(),
            mem,
            // filled with 1s, not 0s, so the pages are touched now rather than while timed
            plain64: parking_lot::Mutex::new(vec![vec![1; VEC_BUFS * VEC_WORDS]; 4]),
            plain32: parking_lot::Mutex::new(vec![vec![1; 2 * VEC_BUFS * VEC_WORDS]; 4]),
        }
    }

    fn buf(&self, b: usize) -> &[AtomicU64] {
        let k = b % BUFS_PER_CHUNK;
        &self.words[b / BUFS_PER_CHUNK][k * VEC_WORDS..(k + 1) * VEC_WORDS]
    }

    fn pkt(&self, t: usize, i: u64) -> &[u8] {
        &self.pkts[(i as usize + 3 * t) % PKTS]
    }

    fn time_kernel(&self, k: Kernel, case: Case, iters: u64) -> Duration {
        timed(case.threads(), iters, &|t, i| {
            k(self.buf(case.buf(t, i)), self.pkt(t, i), t)
        })
    }

    fn time_api(&self, case: Case, iters: u64) -> Duration {
        timed(case.threads(), iters, &|t, i| {
            let a = VEC_BASE + (case.buf(t, i) * VEC_WORDS) as Addr;
            self.mem.vadd32_be(a, self.pkt(t, i)).expect("in range");
        })
    }

    /// The original usage: one `vadd32x16` per line, the lanes decoded from the packet first.
    fn time_api_x16(&self, case: Case, iters: u64) -> Duration {
        timed(case.threads(), iters, &|t, i| {
            let a = VEC_BASE + (case.buf(t, i) * VEC_WORDS) as Addr;
            for (l, line) in self.pkt(t, i).chunks_exact(64).enumerate() {
                let deltas: [u32; 16] = std::array::from_fn(|k| {
                    u32::from_be_bytes(line[4 * k..4 * k + 4].try_into().expect("4 bytes"))
                });
                self.mem
                    .vadd32x16(a + 8 * l as Addr, &deltas)
                    .expect("in range");
            }
        })
    }

    /// The plain non-atomic loops, each thread on its own buffers (they cannot be shared), in
    /// the case's order.
    fn time_plain(&self, wide: bool, case: Case, iters: u64) -> Duration {
        let nbufs = match case {
            Case::One => VEC_BUFS,
            Case::TwoPrivate => VEC_BUFS / 2,
            Case::OneHot | Case::TwoShared | Case::FourShared => HOT_BUFS,
        };
        let threads = case.threads();
        if wide {
            let mut bufs = self.plain64.lock();
            timed_mut(&mut bufs[..threads], iters, &|buf, t, i| {
                let b = case.buf(t, i) % nbufs;
                vadd::plain_u64(&mut buf[b * VEC_WORDS..(b + 1) * VEC_WORDS], self.pkt(t, i));
            })
        } else {
            let mut bufs = self.plain32.lock();
            timed_mut(&mut bufs[..threads], iters, &|buf, t, i| {
                let b = case.buf(t, i) % nbufs;
                let lanes = 2 * VEC_WORDS;
                vadd::plain_u32(&mut buf[b * lanes..(b + 1) * lanes], self.pkt(t, i));
            })
        }
    }
}

/// How to time `iters` vector adds in a case.
type Timer<'a> = Box<dyn Fn(Case, u64) -> Duration + 'a>;

/// Every variant of the vector-add bench: name and timer.
fn vadd_variants(vb: &VaddBench) -> Vec<(&'static str, Timer<'_>)> {
    let mut v: Vec<(&'static str, Timer<'_>)> = vec![
        ("api", Box::new(|c, n| vb.time_api(c, n))),
        ("api_x16", Box::new(|c, n| vb.time_api_x16(c, n))),
    ];
    for (name, k) in KERNELS {
        v.push((name, Box::new(move |c, n| vb.time_kernel(k, c, n))));
    }
    v.push(("plain_u64", Box::new(|c, n| vb.time_plain(true, c, n))));
    v.push(("plain_u32", Box::new(|c, n| vb.time_plain(false, c, n))));
    v
}

/// Keeps `name` unless the environment variable `var` lists names (comma-separated) of which
/// none is a part of `name`.
fn wanted(var: &str, name: &str) -> bool {
    std::env::var(var).map_or(true, |only| only.split(',').any(|o| name.contains(o)))
}

/// The vector adds: `api` is `SharedMemory::vadd32_be` on one 4 KB vector (1024 lanes) per
/// criterion iteration, `api_x16` the same through 64 `vadd32x16`, the others are candidate
/// kernels on a plain slice of atomics and non-atomic baselines; throughput in lanes. See
/// `vadd_interleaved` for the interleaved comparison.
fn vadd32_be(c: &mut Criterion) {
    let vb = VaddBench::new();
    if let Ok(rounds) = std::env::var("RMW_VADD_ROUNDS") {
        vadd_interleaved(&vb, rounds.parse().expect("RMW_VADD_ROUNDS: a number"));
    }
    let mut g = c.benchmark_group("vadd32_be");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800))
        .throughput(Throughput::Elements(VEC_LANES));
    for case in Case::ALL {
        for (name, time) in vadd_variants(&vb) {
            g.bench_function(BenchmarkId::new(name, case.name()), |b| {
                b.iter_custom(|iters| time(case, iters))
            });
        }
    }
    g.finish();
}

/// `RMW_VADD_ROUNDS=n`: before the criterion runs, every variant in turn for a short slice,
/// `n` rounds, interleaved so drifting machine load hits them all alike; prints the median,
/// min and max M lanes/s of each. `RMW_VADD_ONLY=a,b` keeps the variants whose name contains
/// `a` or `b`, `RMW_VADD_CASES=...` likewise for the cases. For example
/// `RMW_VADD_ROUNDS=15 cargo bench --bench rmw -- vadd32_be/api/` (the filter after `--`
/// selects what criterion runs afterwards; one matching nothing skips it).
fn vadd_interleaved(vb: &VaddBench, rounds: usize) {
    const ITERS: u64 = 20_000;
    let variants: Vec<_> = vadd_variants(vb)
        .into_iter()
        .filter(|(n, _)| wanted("RMW_VADD_ONLY", n))
        .collect();
    for case in Case::ALL
        .into_iter()
        .filter(|c| wanted("RMW_VADD_CASES", c.name()))
    {
        let mut res: Vec<Vec<f64>> = vec![Vec::new(); variants.len()];
        for r in 0..rounds {
            for j in 0..variants.len() {
                let v = (j + r) % variants.len();
                let d = (variants[v].1)(case, ITERS);
                res[v].push((ITERS * VEC_LANES) as f64 / d.as_secs_f64() / 1e6);
            }
        }
        println!(
            "vadd32_be interleaved, {}, {rounds} rounds, M lanes/s (median [min, max]):",
            case.name()
        );
        for ((n, _), mut v) in variants.iter().zip(res) {
            v.sort_by(f64::total_cmp);
            println!(
                "  {n:24} {:8.0}  [{:.0}, {:.0}]",
                v[v.len() / 2],
                v[0],
                v[v.len() - 1]
            );
        }
    }
}

criterion_group!(benches, rmw, vadd32_be, fpisa);

/// Lanes per request of the `fpisa` group (a 1024-gradient packet).
const FPISA_LANES: usize = 1024;

fn fpisa(c: &mut Criterion) {
    use pfemu::fpisa::{fp32_values_be, Format, Variant};
    use pfemu::mem::ACC_BASE;
    let mem = SharedMemory::new(&MemConfig {
        acc_bytes: 1 << 20,
        ..MemConfig::default()
    })
    .expect("config");
    // Gradient-like floats: one sign and binade mixed with a few others, as packets carry.
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let floats: Vec<u8> = (0..FPISA_LANES * PKTS)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let exp = 120 + (x >> 40) as u32 % 8;
            let bits = ((x >> 32) as u32 & 0x8000_0000) | (exp << 23) | (x as u32 & 0x7F_FFFF);
            bits.to_be_bytes()
        })
        .collect();
    let pkt = |i: u64| &floats[(i as usize % PKTS) * 4 * FPISA_LANES..][..4 * FPISA_LANES];
    let ints: Vec<u8> = floats.iter().map(|b| b & 0x0F).collect();
    let int_pkt = |i: u64| &ints[(i as usize % PKTS) * 4 * FPISA_LANES..][..4 * FPISA_LANES];
    // HOT_BUFS blocks of accumulators, 8 KB each.
    let block = |i: u64| ACC_BASE + (i % HOT_BUFS as u64) * FPISA_LANES as Addr;

    let mut g = c.benchmark_group("fpisa");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800))
        .throughput(Throughput::Elements(FPISA_LANES as u64));
    for (name, variant) in [("add_full", Variant::Full), ("add_approx", Variant::Approx)] {
        g.bench_function(name, |b| {
            let mut i = 0u64;
            b.iter(|| {
                i += 1;
                mem.fpisa_add_be(block(i), pkt(i), Format::Fp32, variant)
                    .expect("in range")
            })
        });
    }
    // A block's first packet: the accumulators its floats make, written over the words.
    g.bench_function("write", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            mem.fpisa_write_be(block(i), pkt(i), Format::Fp32, Variant::Full)
                .expect("in range")
        })
    });
    g.bench_function("vadd32_be", |b| {
        let mut i = 0u64;
        b.iter(|| {
            i += 1;
            mem.vadd32_be(block(i), int_pkt(i)).expect("in range")
        })
    });
    let words: Vec<u8> = (0..FPISA_LANES as u64)
        .flat_map(|i| (((120 + i % 8) << 32) | ((i * 0x01F3_5D21) & 0x7FFF_FFFF)).to_be_bytes())
        .collect();
    g.bench_function("values_fp32", |b| {
        let mut out = vec![0u8; 4 * FPISA_LANES];
        b.iter(|| fp32_values_be(black_box(&mut out), black_box(&words)))
    });
    g.finish();
}

criterion_main!(benches);
