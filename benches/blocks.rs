//! Criterion benches of the blocks `engine.rs` and `rmw.rs` do not measure on their own.
//! Every group reports elements/s; inputs, tables, traffic and engines are built outside the
//! timed regions.
//!
//! - `program_chain/N` (N = 1, 8, 64): the sequencer alone. A program of N trivial
//!   instructions (each `Goto` the next, the last `Done(Forward(0))`) run by
//!   [`Harness::run_all`] on one 64-byte frame, [`HARNESS_REPEAT`] times per iteration;
//!   elements = instructions executed, so the per-instruction cost is the slope between the
//!   sizes and the per-packet fixed cost (loading the head, entering and leaving the
//!   program) shows at N = 1.
//! - `xtxn/none` vs `xtxn/read_u64`: one instruction that does nothing against one that
//!   issues one `read_u64` XTXN to SRAM; elements = packets (one instruction each), so the
//!   difference is the cost of an XTXN through the thread context.
//! - `dispatch/T_ppe` (T = 1, 2): the full PFE with a program that consumes every packet in
//!   one instruction, reordering off: ingress + dispatch + retire per packet. One
//!   iteration injects one burst of [`BURST`] 64-byte IPv4/UDP frames (the dispatch batch
//!   size); the clock runs from the first burst until the engine has drained.
//! - `reorder/T_ppe_{off,on}` (T = 1, 2): the same with a program that forwards every packet
//!   in one instruction, reordering off then on: the reorder engine's cost per packet is
//!   the difference within a pair.
//! - `l3fwd`: DIR-24-8 lookups ([`Dir248::lookup`], `dir248_lookup`) and the reference
//!   longest-prefix match ([`RouteTable::lookup`], `reference_lookup`) of random
//!   destinations inside 100k generated routes (elements = lookups), and the l3fwd program
//!   on one thread through [`Harness`] on 64-byte frames to those destinations
//!   (`program_one_thread`, elements = packets, all forwarded).
//! - `nimble`: the ternary match block's lookup ([`Tcam::lookup`]) on the prefix tables of
//!   the Nimble rate limiter's multiplication: the uniform log table with 2 significant bits
//!   (`LookupTable::uniform(Op::Mul, 2)`, 124 entries, `tcam_lookup/124`), ADA's
//!   calculation table as [`Ada::new`] installs it (128 entries, `tcam_lookup/128`), and
//!   the antilog table (`AntilogTable::new(Op::Mul, 6)`, 49152 entries,
//!   `tcam_lookup/49152`), keys spread over each table's entries (elements = lookups);
//!   and the Nimble rate limiter's program with ADA on one thread through [`Harness`]
//!   (`program_one_thread`, elements = packets): 64-byte frames over 4 classes, the
//!   harness clock advanced 50 ns per frame, so most packets refill (four lookups) and both
//!   verdicts run. Each frame goes through [`Harness::run`], which also copies an admitted
//!   frame out (`run_all` would run every packet at time 0, where nothing refills).
//! - `traffic`: [`Traffic::generate`] of 64-byte frames over 1024 flows, uniform and Zipf
//!   (s = 1) flows (elements = frames), and the [`Zipf`] sampler alone (elements = samples).
//! - `latency`: the filter (default traffic mix) through the full PFE with the default
//!   thread count and reordering on, latency recording off then on
//!   ([`pfemu::PfeBuilder::latency`]), so its cost per packet is the difference.
//!
//! Short runs (10 samples, 200 ms warm-up, 800 ms measurement each): the whole file takes
//! well under two minutes on two cores. The engine groups (`dispatch`, `reorder`,
//! `latency`) run the injecting thread next to the PPE threads, so on a small or busy
//! machine they move with other load. On a 2-core machine an engine has also been seen to
//! settle, for a whole bench, either at about 1.4 µs per burst or at 7 to 9 µs (samples
//! consistent within the bench, the mode changing from run to run): compare an off/on
//! pair over several runs (`-- reorder` takes about 10 s), not from one.
//!
//! Run: `cargo bench --bench blocks`; one group or bench with a filter, e.g.
//! `cargo bench --bench blocks -- program_chain` or `-- reorder/2_ppe`; add `--quick` for
//! an even shorter run.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{criterion_group, criterion_main, BenchmarkGroup, Criterion, Throughput};
use pfemu::ada::arith::Op as ArithOp;
use pfemu::ada::block::{Ada, AdaConfig, AntilogTable, LookupTable};
use pfemu::lab::bench::traffic::{FlowDist, Mix, Traffic, TrafficSpec, Zipf};
use pfemu::mem::tcam::Tcam;
use pfemu::microcode::filter::Filter;
use pfemu::microcode::l3fwd::{mask, write_udp_frame, Dir248, L3fwd, RouteTable};
use pfemu::microcode::nimble::{Arithmetic, Nimble, NimbleConfig};
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::rng::SplitMix64;

/// Times one frame is run through a [`Harness`] per iteration.
const HARNESS_REPEAT: usize = 256;
/// Frames per injected burst (one criterion iteration of the engine benches): the default
/// dispatch batch size.
const BURST: usize = 32;
/// Distinct frames the engine benches cycle through (a multiple of [`BURST`]).
const POOL: usize = 4096;
/// Routes of the l3fwd table.
const ROUTES: usize = 100_000;
/// Destinations looked up per l3fwd iteration.
const LOOKUPS: usize = 1 << 16;
/// Keys looked up per TCAM iteration.
const TCAM_KEYS: usize = 1 << 12;

fn configure(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(800));
}

/// Shared memory with SRAM only (no DRAM to materialise).
fn sram_only() -> Arc<SharedMemory> {
    Arc::new(
        SharedMemory::new(&MemConfig {
            dram_bytes: 0,
            acc_bytes: 0,
            ..MemConfig::default()
        })
        .unwrap(),
    )
}

/// `packets` 64-byte frames over 1024 uniform flows in `mix`.
fn traffic(packets: usize, mix: Mix) -> Traffic {
    Traffic::generate(&TrafficSpec {
        packets,
        frame_size: 64,
        flows: 1024,
        mix,
        ..Default::default()
    })
    .unwrap()
}

const IPV4_ONLY: Mix = Mix {
    ipv4: 100,
    ipv4_options: 0,
    ipv6: 0,
    non_ip: 0,
};

/// A program of one instruction ending every packet with `verdict`.
fn one_instruction(name: &str, verdict: Verdict) -> Program {
    let mut p = Program::builder(name);
    let a = p.label("a");
    p.instr(a, move |_t| Ok(Done(verdict)));
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

/// A chain of `n` instructions, each `Goto` the next; the last forwards to port 0.
fn chain(n: usize) -> Program {
    let mut p = Program::builder("chain");
    let labels: Vec<Label> = (0..n).map(|i| p.label(&format!("i{i}"))).collect();
    for i in 0..n {
        match labels.get(i + 1) {
            Some(&next) => p.instr(labels[i], move |_t| Ok(Goto(next))),
            None => p.instr(labels[i], |_t| Ok(Done(Verdict::Forward(0)))),
        };
    }
    p.entry(Entry::Packet, labels[0]);
    p.build().unwrap()
}

fn program_chain(c: &mut Criterion) {
    let t = traffic(1, IPV4_ONLY);
    let frame = t.frame(0);
    let mut h = Harness::new(sram_only());
    let mut g = c.benchmark_group("program_chain");
    configure(&mut g);
    for n in [1usize, 8, 64] {
        let prog = chain(n);
        let out = h.run(&prog, 0, frame);
        assert_eq!(out.result, Ok(Verdict::Forward(0)));
        assert_eq!(out.instructions as usize, n);
        g.throughput(Throughput::Elements((n * HARNESS_REPEAT) as u64));
        g.bench_function(n.to_string(), |b| {
            b.iter(|| h.run_all(&prog, std::iter::repeat_n(frame, HARNESS_REPEAT)))
        });
    }
    g.finish();
}

fn xtxn(c: &mut Criterion) {
    let t = traffic(1, IPV4_ONLY);
    let frame = t.frame(0);
    let mem = sram_only();
    let addr = mem.alloc("bench.word", Region::Sram, 1).unwrap();
    mem.write_u64(addr, 7).unwrap();
    let none = one_instruction("none", Verdict::Forward(0));
    let read = {
        let mut p = Program::builder("read_u64");
        let a = p.label("a");
        p.instr(a, move |t| {
            let word = t.read_u64(addr)?;
            t.set(WORD, word);
            Ok(Done(Verdict::Forward(if t.get(WORD) & 1 == 1 {
                1
            } else {
                0
            })))
        });
        p.entry(Entry::Packet, a);
        p.build().unwrap()
    };
    let mut h = Harness::new(mem);
    assert_eq!(h.run(&read, 0, frame).result, Ok(Verdict::Forward(1)));
    let mut g = c.benchmark_group("xtxn");
    configure(&mut g);
    g.throughput(Throughput::Elements(HARNESS_REPEAT as u64));
    for (name, prog) in [("none", &none), ("read_u64", &read)] {
        g.bench_function(name, |b| {
            b.iter(|| h.run_all(prog, std::iter::repeat_n(frame, HARNESS_REPEAT)))
        });
    }
    g.finish();
}

pfemu::registers! {
    /// The word `xtxn`'s read_u64 program reads.
    WORD: u64,
    /// A counter of the `registers` benches.
    COUNT: u32,
    /// A flag of the `registers` benches.
    FLAG: bool,
}

/// A loop of `n` instructions each updating two registers, written with raw slots (`t.r`)
/// or with typed registers (`t.get`/`t.set`): what the authoring layer costs per
/// instruction, if anything.
fn register_loop(n: u32, typed: bool) -> Program {
    let mut p = Program::builder(if typed { "typed" } else { "raw" });
    pfemu::labels!(p => step);
    if typed {
        p.instr(step, move |t| {
            let count = t.get(COUNT) + 1;
            t.set(COUNT, count);
            t.set(FLAG, count & 1 == 1);
            Ok(if count < n {
                Goto(step)
            } else {
                Done(Verdict::Forward(0))
            })
        });
    } else {
        p.instr(step, move |t| {
            t.r[IR1] += 1;
            t.r[IR2] = t.r[IR1] & 1;
            Ok(if t.r[IR1] < u64::from(n) {
                Goto(step)
            } else {
                Done(Verdict::Forward(0))
            })
        });
    }
    p.entry(Entry::Packet, step);
    p.build().unwrap()
}

fn registers(c: &mut Criterion) {
    const N: u32 = 16;
    let t = traffic(1, IPV4_ONLY);
    let frame = t.frame(0);
    let mut h = Harness::new(sram_only());
    let mut g = c.benchmark_group("registers");
    configure(&mut g);
    g.throughput(Throughput::Elements(u64::from(N) * HARNESS_REPEAT as u64));
    for typed in [false, true] {
        let prog = register_loop(N, typed);
        let out = h.run(&prog, 0, frame);
        assert_eq!((out.result, out.instructions), (Ok(Verdict::Forward(0)), N));
        g.bench_function(if typed { "typed" } else { "raw" }, |b| {
            b.iter(|| h.run_all(&prog, std::iter::repeat_n(frame, HARNESS_REPEAT)))
        });
    }
    g.finish();
}

/// A started engine on its own SRAM-only memory (or `mem`), frames going to a [`Discard`]
/// sink.
fn start_engine(
    program: Program,
    threads: usize,
    reorder: bool,
    latency: bool,
    mem: Option<Arc<SharedMemory>>,
) -> Pfe {
    let mut pfe = Pfe::builder()
        .program(program)
        .memory(mem.unwrap_or_else(sram_only))
        .ppe_threads(threads)
        .batch_size(BURST)
        .reorder(reorder)
        .latency(latency)
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe
}

/// Injects `iters` bursts of [`BURST`] frames, cycling through `pool` from `*next`, and
/// waits for the engine to drain; returns the time from the first burst to the drain.
fn inject_bursts(pfe: &Pfe, pool: &[&[u8]], next: &mut usize, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let burst = &pool[*next..*next + BURST];
        *next = (*next + BURST) % pool.len();
        pfe.inject_burst(burst.iter().map(|f| (0, *f))).unwrap();
    }
    pfe.drain();
    start.elapsed()
}

/// Benches `pfe` under `name` in `g`, one iteration = one burst, then shuts it down and
/// checks every packet was accounted for without a drop.
fn bench_engine(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    pfe: Pfe,
    pool: &[&[u8]],
    expect_drops: bool,
) {
    let mut next = 0;
    g.bench_function(name, |b| {
        b.iter_custom(|iters| inject_bursts(&pfe, pool, &mut next, iters))
    });
    let s = pfe.shutdown();
    assert_eq!(s.in_flight, 0);
    assert!(expect_drops || s.dropped == 0, "{name}: {s:?}");
}

fn dispatch(c: &mut Criterion) {
    let t = traffic(POOL, IPV4_ONLY);
    let pool: Vec<&[u8]> = t.iter().collect();
    let consume = one_instruction("consume", Verdict::Consume);
    let mut g = c.benchmark_group("dispatch");
    configure(&mut g);
    g.throughput(Throughput::Elements(BURST as u64));
    for threads in [1, 2] {
        let pfe = start_engine(consume.clone(), threads, false, false, None);
        bench_engine(&mut g, &format!("{threads}_ppe"), pfe, &pool, false);
    }
    g.finish();
}

fn reorder(c: &mut Criterion) {
    let t = traffic(POOL, IPV4_ONLY);
    let pool: Vec<&[u8]> = t.iter().collect();
    let forward = one_instruction("forward", Verdict::Forward(0));
    let mut g = c.benchmark_group("reorder");
    configure(&mut g);
    g.throughput(Throughput::Elements(BURST as u64));
    for threads in [1, 2] {
        for on in [false, true] {
            let pfe = start_engine(forward.clone(), threads, on, false, None);
            let name = format!("{threads}_ppe_{}", if on { "on" } else { "off" });
            bench_engine(&mut g, &name, pfe, &pool, false);
        }
    }
    g.finish();
}

fn l3fwd(c: &mut Criterion) {
    let routes = RouteTable::generate(ROUTES, 8, 1).unwrap();
    let table = Dir248::build(&routes).unwrap();
    // Destinations: a random address inside a random route (as the l3fwd benchmark draws
    // its flows), so every lookup hits and the whole table is used.
    let all = routes.routes();
    let mut rng = SplitMix64::new(0xB10C);
    let dests: Vec<u32> = (0..LOOKUPS)
        .map(|_| {
            let r = all[rng.below(all.len() as u64) as usize];
            r.prefix | (rng.next_u64() as u32 & !mask(r.len))
        })
        .collect();
    assert!(dests
        .iter()
        .all(|&d| table.lookup(d).is_some() && table.lookup(d) == routes.lookup(d)));

    let mut g = c.benchmark_group("l3fwd");
    configure(&mut g);
    g.throughput(Throughput::Elements(LOOKUPS as u64));
    g.bench_function("dir248_lookup", |b| {
        b.iter(|| {
            dests
                .iter()
                .map(|&d| u64::from(table.lookup(d).unwrap_or(0)))
                .sum::<u64>()
        })
    });
    g.bench_function("reference_lookup", |b| {
        b.iter(|| {
            dests
                .iter()
                .map(|&d| u64::from(routes.lookup(d).unwrap_or(0)))
                .sum::<u64>()
        })
    });

    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let prog = L3fwd::install_table(&mem, &table).unwrap().program();
    let mut bytes = vec![0u8; LOOKUPS * 64];
    for (i, (frame, &dst)) in bytes.chunks_exact_mut(64).zip(&dests).enumerate() {
        write_udp_frame(frame, dst, 0x0A00_0001 + i as u32, 1024, 64);
    }
    let mut h = Harness::new(mem);
    assert_eq!(
        h.run_all(&prog, bytes.chunks_exact(64)),
        LOOKUPS as u64,
        "every l3fwd frame is forwarded"
    );
    g.bench_function("program_one_thread", |b| {
        b.iter(|| h.run_all(&prog, bytes.chunks_exact(64)))
    });
    g.finish();
}

/// [`TCAM_KEYS`] keys spread over `tcam`'s entries: each inside a random entry (the entry's
/// value with its don't-care bits drawn at random).
fn keys_of(tcam: &Tcam, rng: &mut SplitMix64) -> Vec<u32> {
    let (_, entries) = tcam.entries();
    (0..TCAM_KEYS)
        .map(|_| {
            let e = entries[rng.below(entries.len() as u64) as usize];
            e.value | (rng.next_u64() as u32 & !e.mask)
        })
        .collect()
}

/// A program whose one instruction looks every key up in `owner`'s block as XTXNs (through
/// the PPE thread's cache of the current table, as programs do).
fn tcam_lookups<T: Send + Sync + 'static>(
    owner: Arc<T>,
    block: fn(&T) -> &Tcam,
    keys: Vec<u32>,
) -> Program {
    let mut p = Program::builder("tcam_lookups");
    let go = p.label("go");
    p.instr(go, move |t| {
        let tcam = block(&owner);
        let sum: u64 = (keys.iter())
            .map(|&k| t.tcam_lookup(tcam, k).map_or(0, |h| h.result))
            .sum();
        std::hint::black_box(sum);
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, go);
    p.build().unwrap()
}

fn nimble(c: &mut Criterion) {
    let rate_table = Arc::new(LookupTable::uniform(ArithOp::Mul, 2).unwrap());
    let ada = Arc::new(Ada::new(AdaConfig::new(ArithOp::Mul)).unwrap());
    let antilog = Arc::new(AntilogTable::new(ArithOp::Mul, 6).unwrap());
    let mut rng = SplitMix64::new(0x41DA);
    let mut g = c.benchmark_group("nimble");
    configure(&mut g);
    g.throughput(Throughput::Elements(TCAM_KEYS as u64));
    let keys: [Vec<u32>; 3] =
        [rate_table.tcam(), ada.table().tcam(), antilog.tcam()].map(|tcam| keys_of(tcam, &mut rng));
    let programs = [
        tcam_lookups(rate_table.clone(), |t| t.tcam(), keys[0].clone()),
        tcam_lookups(ada.clone(), |a| a.table().tcam(), keys[1].clone()),
        tcam_lookups(antilog.clone(), |t| t.tcam(), keys[2].clone()),
    ];
    let tcams = [rate_table.tcam(), ada.table().tcam(), antilog.tcam()];
    let mut h = Harness::new(sram_only());
    for ((tcam, keys), program) in tcams.iter().zip(&keys).zip(&programs) {
        assert!(keys.iter().all(|&k| tcam.lookup(k).is_some()));
        // From the control side: the block's lock and an Arc clone per lookup.
        g.bench_function(format!("tcam_lookup/{}", tcam.len()), |b| {
            b.iter(|| {
                keys.iter()
                    .map(|&k| tcam.lookup(k).map_or(0, |h| h.result))
                    .sum::<u64>()
            })
        });
        // As a program's XTXNs, one packet doing them all.
        g.bench_function(format!("tcam_lookup_xtxn/{}", tcam.len()), |b| {
            b.iter(|| h.run(program, 0, &[0u8; 64]).instructions)
        });
    }

    // The limiter with ADA, 4 classes at 1 Gbit/s with 4 KiB buckets: 64-byte frames every
    // 50 ns are 2.56 Gbit/s offered per class, so after the first buckets some 40% are
    // admitted and the rest dropped as rate_exceeded.
    const CLASSES: usize = 4;
    const FRAMES: usize = 4096;
    const GAP_NS: u64 = 50;
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let limiter = Nimble::install(
        &mem,
        NimbleConfig {
            rates_bps: vec![1_000_000_000; CLASSES],
            burst_bytes: 4096,
            arithmetic: Arithmetic::Ada(AdaConfig::new(ArithOp::Mul)),
            ..NimbleConfig::default()
        },
    )
    .unwrap();
    let prog = limiter.program();
    let t = traffic(FRAMES, IPV4_ONLY);
    let mut h = Harness::new(mem);
    let mut now = 0u64;
    let mut run_frames = |h: &mut Harness| {
        let mut admitted = 0u64;
        for (i, frame) in t.iter().enumerate() {
            now += GAP_NS;
            h.set_now(now);
            let out = h.run(&prog, (i % CLASSES) as u16, frame);
            admitted += u64::from(matches!(out.result, Ok(Verdict::Forward(_))));
        }
        admitted
    };
    let admitted = run_frames(&mut h);
    assert!(
        admitted > 0 && admitted < FRAMES as u64,
        "{admitted} admitted"
    );
    g.throughput(Throughput::Elements(FRAMES as u64));
    g.bench_function("program_one_thread", |b| b.iter(|| run_frames(&mut h)));
    g.finish();
}

fn traffic_gen(c: &mut Criterion) {
    const FRAMES: usize = 1 << 14;
    let mut g = c.benchmark_group("traffic");
    configure(&mut g);
    g.throughput(Throughput::Elements(FRAMES as u64));
    for (name, dist) in [
        ("uniform", FlowDist::Uniform),
        ("zipf", FlowDist::Zipf(1.0)),
    ] {
        let spec = TrafficSpec {
            packets: FRAMES,
            frame_size: 64,
            flows: 1024,
            flow_dist: dist,
            ..Default::default()
        };
        g.bench_function(format!("generate_{name}"), |b| {
            b.iter(|| Traffic::generate(black_box(&spec)).unwrap())
        });
    }
    let zipf = Zipf::new(1024, 1.0).unwrap();
    let mut rng = SplitMix64::new(1);
    g.bench_function("zipf_sample", |b| {
        b.iter(|| (0..FRAMES).map(|_| zipf.sample(&mut rng)).sum::<u64>())
    });
    g.finish();
}

fn latency(c: &mut Criterion) {
    let t = traffic(POOL, Mix::FILTER_DEFAULT);
    let pool: Vec<&[u8]> = t.iter().collect();
    let threads = pfemu::pfe::default_ppe_threads();
    let mut g = c.benchmark_group("latency");
    configure(&mut g);
    g.throughput(Throughput::Elements(BURST as u64));
    for on in [false, true] {
        let mem = sram_only();
        let filter = Filter::install(&mem).unwrap();
        let pfe = start_engine(filter.program(), threads, true, on, Some(mem));
        let name = format!("filter_{threads}_ppe_{}", if on { "on" } else { "off" });
        // The filter drops the non-IP and IP-options frames of the default mix.
        bench_engine(&mut g, &name, pfe, &pool, true);
    }
    g.finish();
}

criterion_group!(
    benches,
    program_chain,
    xtxn,
    registers,
    dispatch,
    reorder,
    l3fwd,
    nimble,
    traffic_gen,
    latency
);
criterion_main!(benches);
