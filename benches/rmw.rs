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
//! Run: `cargo bench --bench rmw` (add `-- --quick` for a shorter run, or a filter such as
//! `-- counter_inc`).

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pfemu::mem::{Addr, MemConfig, Op, PolicerConfig, PostedOps, SharedMemory};

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
    if threads == 1 {
        let start = Instant::now();
        for i in 0..iters {
            op(0, i);
        }
        return start.elapsed();
    }
    // Each thread stamps its own start (right after the barrier releases it) and finish; the
    // measured span runs from the earliest start to the latest finish.
    let total = iters.max(MIN_OPS_PER_THREAD * threads as u64);
    let barrier = Barrier::new(threads);
    let elapsed = thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let n = total / threads as u64 + u64::from((t as u64) < total % threads as u64);
                let barrier = &barrier;
                thread::Builder::new()
                    .stack_size(128 << 10)
                    .spawn_scoped(s, move || {
                        barrier.wait();
                        let start = Instant::now();
                        for i in 0..n {
                            op(t, i);
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

thread_local! {
    /// Each bench thread's posted-XTXN buffer, like a PPE thread's.
    static POSTED: std::cell::RefCell<PostedOps> = std::cell::RefCell::new(PostedOps::new(64));
}

/// Posted counter increments flushed every `FLUSH_EVERY` posts, as a PPE thread flushes
/// once per batch of 32 packets.
const FLUSH_EVERY: u64 = 32;

fn rmw(c: &mut Criterion) {
    baseline(c);
    let m = memory();
    group(c, "counter_inc", &m, |m, a, _, i| {
        m.counter_inc(a, 64 + (i & 1023)).unwrap();
    });
    group(c, "counter_inc_posted", &m, |m, a, _, i| {
        POSTED.with(|p| {
            let mut p = p.borrow_mut();
            p.post(
                m,
                Op::CounterInc {
                    addr: a,
                    bytes: 64 + (i & 63),
                },
            )
            .expect("in range");
            if i % FLUSH_EVERY == FLUSH_EVERY - 1 {
                p.flush(m);
            }
        })
    });
    group(c, "fetch_or", &m, |m, a, t, _| {
        black_box(m.fetch_or(a, 1 << (t % 64)).unwrap());
    });
    group(c, "fetch_swap", &m, |m, a, _, i| {
        black_box(m.fetch_swap(a, i).unwrap());
    });
    group(c, "masked_write", &m, |m, a, t, i| {
        let shift = 8 * (t % 8);
        black_box(m.masked_write(a, i << shift, 0xFF << shift).unwrap());
    });
    group(c, "fetch_add32_low_lane", &m, |m, a, _, _| {
        black_box(m.fetch_add32(a, 1, 3).unwrap());
    });
    let deltas: [u32; 16] = std::array::from_fn(|i| i as u32 + 1);
    group(c, "vadd32x16", &m, |m, a, _, _| {
        m.vadd32x16(a, &deltas).unwrap();
    });
    group(c, "read_8B", &m, |m, a, _, _| {
        let mut b = [0u8; 8];
        m.read(a, &mut b).unwrap();
        black_box(b);
    });
    group(c, "read_64B", &m, |m, a, _, _| {
        let mut b = [0u8; 64];
        m.read(a, &mut b).unwrap();
        black_box(b);
    });
    group(c, "write_64B", &m, |m, a, _, i| {
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
    group(c, "police", &m, |m, a, _, i| {
        black_box(m.police(a, 100, i * 100).unwrap());
    });
}

criterion_group!(benches, rmw);
criterion_main!(benches);
