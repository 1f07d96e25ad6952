//! Criterion benches of the engine's blocks: header parsing, flow classification, and the
//! filter through the full PFE (dispatch + PPE threads, with and without reordering).
//!
//! Traffic and engines are built outside the timed regions.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pfemu::lab::bench::traffic::{Traffic, TrafficSpec};
use pfemu::microcode::filter::Filter;
use pfemu::pfe::FlowClassifier;
use pfemu::prelude::*;
use pfemu::wire::{Ether, Ipv4};

fn traffic(packets: usize) -> Traffic {
    Traffic::generate(&TrafficSpec {
        packets,
        frame_size: 64,
        flows: 1024,
        ..Default::default()
    })
    .unwrap()
}

fn wire(c: &mut Criterion) {
    let t = traffic(4096);
    let mut g = c.benchmark_group("wire");
    g.throughput(Throughput::Elements(t.len() as u64));
    g.bench_function("ether_ipv4_parse", |b| {
        b.iter(|| {
            let mut acc = 0u64;
            for f in t.iter() {
                let e = Ether::new_checked(f).unwrap();
                if let Ok(ip) = Ipv4::new_checked(&f[14..]) {
                    acc += (ip.ihl() as u64) ^ ip.dst() as u64 ^ e.etype() as u64;
                }
            }
            black_box(acc)
        })
    });
    g.bench_function("flow_key_five_tuple", |b| {
        let c = FlowClassifier::FiveTuple;
        b.iter(|| t.iter().fold(0u64, |a, f| a ^ c.flow_key(0, f)))
    });
    g.finish();
}

/// Shared memory (SRAM only) with the filter's counters installed.
fn filter_setup() -> (Arc<SharedMemory>, Filter) {
    let mem = Arc::new(
        SharedMemory::new(&MemConfig {
            dram_bytes: 0,
            ..MemConfig::default()
        })
        .unwrap(),
    );
    let filter = Filter::install(&mem).unwrap();
    (mem, filter)
}

fn program(c: &mut Criterion) {
    let t = traffic(4096);
    let (mem, filter) = filter_setup();
    let prog = filter.program();
    let mut h = pfemu::program::Harness::new(mem);
    let mut g = c.benchmark_group("program");
    g.throughput(Throughput::Elements(t.len() as u64));
    g.bench_function("filter_one_thread", |b| {
        b.iter(|| h.run_all(&prog, t.iter()))
    });
    g.finish();
}

fn hash(c: &mut Criterion) {
    use pfemu::mem::hash::HashTable;
    let keys: Vec<[u8; 5]> = (0..4096u32)
        .map(|b| {
            let k = b.to_be_bytes();
            [1, k[0], k[1], k[2], k[3]]
        })
        .collect();
    let table = HashTable::new(1 << 16, 1024).unwrap();
    for (i, k) in keys.iter().enumerate() {
        table.insert(k, i as u64).unwrap();
    }
    let mut g = c.benchmark_group("hash");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function("lookup_hit", |b| {
        b.iter(|| {
            keys.iter()
                .map(|k| table.lookup(k).unwrap().unwrap())
                .sum::<u64>()
        })
    });
    let scratch = HashTable::new(1 << 16, 1024).unwrap();
    g.bench_function("insert_then_delete", |b| {
        b.iter(|| {
            for k in &keys {
                scratch.insert(k, 1).unwrap();
            }
            for k in &keys {
                scratch.delete(k).unwrap();
            }
        })
    });
    g.finish();
}

/// Runs `packets` frames of the filter through an engine; returns the time to drain.
fn filter_run(threads: usize, reorder: bool, t: &Traffic, rounds: u64) -> Duration {
    let (mem, filter) = filter_setup();
    let mut pfe = Pfe::builder()
        .program(filter.program())
        .memory(mem)
        .ppe_threads(threads)
        .reorder(reorder)
        .sink(Arc::new(CountingSink::new(4)))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let start = Instant::now();
    for _ in 0..rounds {
        pfe.inject_burst(t.iter().map(|f| (0, f))).unwrap();
    }
    pfe.drain();
    start.elapsed()
}

fn engine(c: &mut Criterion) {
    let t = traffic(1 << 16);
    let mut g = c.benchmark_group("filter_pfe");
    g.sample_size(10).measurement_time(Duration::from_secs(3));
    g.throughput(Throughput::Elements(t.len() as u64));
    let default_threads = pfemu::pfe::default_ppe_threads();
    for (threads, reorder) in [
        (default_threads, true),
        (default_threads, false),
        (256, true),
    ] {
        let id = format!(
            "{threads}_threads_reorder_{}",
            if reorder { "on" } else { "off" }
        );
        g.bench_function(BenchmarkId::from_parameter(id), |b| {
            b.iter_custom(|iters| filter_run(threads, reorder, &t, iters))
        });
    }
    g.finish();
}

criterion_group!(benches, wire, program, hash, engine);
criterion_main!(benches);
