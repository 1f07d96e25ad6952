//! Trio-ML (paper §4-5) end to end, asserting exact sums, headers, bytes and counts: through
//! the single-thread harness (aggregation, refusals, loss recovery, the timer scan), through
//! concurrent harnesses racing the timer scan against adders, and through a PFE with 256
//! PPE threads.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::Rng;
use pfemu::microcode::trio_ml::wire::{
    self, AggPacket, Control, Endpoints, JobCtx, TrioMlHdrFields,
};
use pfemu::microcode::trio_ml::{
    JobConfig, TrioMl, TrioMlConfig, TrioMlError, NO_BLOCK_TIMEOUT, TIMER_ENTRY,
};
use pfemu::prelude::*;
use pfemu::program::{Harness, HarnessOutcome};
use pfemu::timer::Launch;
use pfemu::wire::Ipv4;

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const OUT_SRC: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 77);
const GROUP_ADDR: Ipv4Addr = Ipv4Addr::new(239, 1, 2, 3);
const MS: u64 = 1_000_000;
/// How long a test waits for progress before it fails: a deadline for a hang, never a
/// measure of speed.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

fn config() -> TrioMlConfig {
    TrioMlConfig {
        local_addr: LOCAL,
        ..TrioMlConfig::default()
    }
}

fn job(id: u8, sources: &[u8]) -> JobConfig {
    JobConfig {
        job_id: id,
        sources: sources.to_vec(),
        out_src_addr: OUT_SRC,
        out_dst_addr: GROUP_ADDR,
        out_dest: Dest::Group(u16::from(id)),
        ..JobConfig::default()
    }
}

/// Source `src`'s aggregation packet for a block.
fn packet(job: u8, block: u32, gen: u16, src: u8, grads: &[i32]) -> Vec<u8> {
    packet_to(
        LOCAL,
        12000,
        job,
        block,
        gen,
        src,
        grads.len() as u16,
        grads,
    )
}

#[allow(clippy::too_many_arguments)]
fn packet_to(
    dst: Ipv4Addr,
    port: u16,
    job: u8,
    block: u32,
    gen: u16,
    src: u8,
    grad_cnt: u16,
    grads: &[i32],
) -> Vec<u8> {
    wire::agg_packet(&AggPacket {
        endpoints: common::worker_endpoints(src, dst, port),
        hdr: TrioMlHdrFields {
            job_id: job,
            block_id: block,
            gen_id: gen,
            src_id: src,
            grad_cnt,
            ..Default::default()
        },
        gradients: grads,
    })
}

/// The Result the aggregator must send for a block: every byte.
fn expected_result(
    job: u8,
    block: u32,
    gen: u16,
    src_cnt: u8,
    degraded: bool,
    sums: &[i32],
) -> Vec<u8> {
    wire::agg_packet(&AggPacket {
        endpoints: Endpoints {
            src_mac: config().local_mac,
            dst_mac: wire::multicast_mac(GROUP_ADDR),
            src_addr: OUT_SRC,
            dst_addr: GROUP_ADDR,
            src_port: 12000,
            dst_port: 12000,
        },
        hdr: TrioMlHdrFields {
            job_id: job,
            block_id: block,
            age_op: u8::from(degraded),
            final_block: false,
            degraded,
            src_id: 77,
            src_cnt,
            gen_id: gen,
            grad_cnt: sums.len() as u16,
            ..Default::default()
        },
        gradients: sums,
    })
}

fn sum(vectors: &[&[i32]]) -> Vec<i32> {
    let mut s = vec![0i32; vectors[0].len()];
    for v in vectors {
        for (a, b) in s.iter_mut().zip(v.iter()) {
            *a = a.wrapping_add(*b);
        }
    }
    s
}

fn random_grads(rng: &mut Rng, n: usize) -> Vec<i32> {
    (0..n).map(|_| rng.next() as i32).collect()
}

struct Setup {
    trio: TrioMl,
    program: Program,
    h: Harness,
}

impl Setup {
    fn new(cfg: TrioMlConfig, jobs: &[JobConfig]) -> Setup {
        let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
        let trio = TrioMl::install(&mem, cfg).unwrap();
        for j in jobs {
            trio.add_job(j).unwrap();
        }
        Setup {
            program: trio.program(),
            h: Harness::new(mem),
            trio,
        }
    }

    fn run(&mut self, port: Port, frame: &[u8]) -> HarnessOutcome {
        self.h.run(&self.program, port, frame)
    }

    /// How many regions shared memory has allocated.
    fn trio_allocations(&self) -> usize {
        self.h.memory().allocations().len()
    }

    /// Runs a packet that must be dropped, and returns the reason's name.
    fn dropped(&mut self, port: Port, frame: &[u8]) -> (&'static str, Vec<(Dest, Vec<u8>)>) {
        let out = self.run(port, frame);
        match out.result {
            Ok(Verdict::Drop(r)) => (self.program.drop_reason_name(r), out.created),
            other => panic!("expected a drop, got {other:?}"),
        }
    }

    /// Runs a packet that must be aggregated, and returns the packets it created.
    fn consumed(&mut self, port: Port, frame: &[u8]) -> Vec<(Dest, Vec<u8>)> {
        let out = self.run(port, frame);
        assert_eq!(out.result, Ok(Verdict::Consume));
        out.created
    }

    /// One full scan period at time `now`: every slice's timer thread.
    fn scan(&mut self, now: u64) -> Vec<(Dest, Vec<u8>)> {
        self.h.set_now(now);
        let slices = self.trio.config().timers;
        let mut created = Vec::new();
        for slice in 0..slices {
            let out = self.h.run_timer(
                &self.program,
                Launch {
                    timer: slice as usize,
                    entry: TIMER_ENTRY,
                    slice,
                    slices,
                    scheduled_ns: now,
                    missed: 0,
                },
            );
            assert_eq!(out.result, Ok(Verdict::Consume));
            created.extend(out.created);
        }
        created
    }
}

#[test]
fn three_sources_one_block_result_after_the_third() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1, 2])]);
    let mut rng = Rng(7);
    let g: Vec<Vec<i32>> = (0..3).map(|_| random_grads(&mut rng, 100)).collect();

    assert!(s.consumed(0, &packet(1, 7, 3, 0, &g[0])).is_empty());
    assert!(s.consumed(1, &packet(1, 7, 3, 1, &g[1])).is_empty());
    let active = s.trio.active_blocks().unwrap();
    assert_eq!(active.len(), 1);
    assert_eq!(
        (active[0].block_id, active[0].gen_id, active[0].rcvd_cnt),
        (7, 3, 2)
    );
    assert_eq!(active[0].received, [0, 1]);
    assert_eq!(active[0].sums, sum(&[&g[0], &g[1]]));
    assert!(!active[0].closed);

    let created = s.consumed(2, &packet(1, 7, 3, 2, &g[2]));
    let sums = sum(&[&g[0], &g[1], &g[2]]);
    assert_eq!(created.len(), 1);
    let (dest, result) = &created[0];
    assert_eq!(*dest, Dest::Group(1));
    assert_eq!(*result, expected_result(1, 7, 3, 3, false, &sums));
    // The fields a host reads, spelled out.
    let (hdr, grads) = wire::parse(result).unwrap();
    assert_eq!(
        (hdr.src_cnt, hdr.degraded, hdr.age_op, hdr.src_id),
        (3, false, 0, 77)
    );
    assert_eq!(wire::gradients(grads), sums);
    let ip = Ipv4::new_checked_full(&result[14..]).unwrap();
    assert!(ip.verify_checksum());
    assert_eq!((ip.src_addr(), ip.dst_addr()), (OUT_SRC, GROUP_ADDR));
    assert_eq!(
        &result[34..38],
        &[0x2E, 0xE0, 0x2E, 0xE0],
        "UDP 12000 -> 12000"
    );

    // The block is no longer active (its key left the active table); its Result is kept.
    assert!(s.trio.active_blocks().unwrap().is_empty());
    assert_eq!((s.trio.active_records(), s.trio.kept_records()), (0, 1));
    let kept = s.trio.kept_results().unwrap();
    assert_eq!(kept.len(), 1);
    assert!(kept[0].kept && kept[0].closed);
    assert_eq!(kept[0].received, [0, 1, 2]);
    assert_eq!(kept[0].sums, sums);
    let st = s.trio.job_state(1).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.block_total_cnt, st.slots_in_use),
        (1, 1, 1)
    );
    assert_eq!(st.sources, [0, 1, 2]);
}

#[test]
fn gradients_in_the_head_the_tail_and_across_them_sum_exactly() {
    let mut j = job(2, &[0, 1, 2]);
    j.block_grad_max = 4095;
    j.block_cnt_max = 64;
    let mut s = Setup::new(config(), &[j]);
    let mut rng = Rng(11);
    // 34 gradients fit the 192-byte head whole; the 35th straddles head and tail.
    let counts = [
        1, 2, 15, 16, 17, 31, 32, 33, 34, 35, 36, 47, 48, 49, 100, 1024, 4095,
    ];
    for (block, &n) in counts.iter().enumerate() {
        let mut g: Vec<Vec<i32>> = (0..3).map(|_| random_grads(&mut rng, n)).collect();
        // Extremes, so wrapping is exercised too.
        g[0][n - 1] = i32::MAX;
        g[1][n - 1] = 1;
        g[2][0] = i32::MIN;
        let mut created = Vec::new();
        for src in 0..3u8 {
            created = s.consumed(
                src.into(),
                &packet(2, block as u32, 0, src, &g[usize::from(src)]),
            );
        }
        assert_eq!(created.len(), 1, "{n} gradients");
        let sums = sum(&[&g[0], &g[1], &g[2]]);
        assert_eq!(
            created[0].1,
            expected_result(2, block as u32, 0, 3, false, &sums),
            "{n} gradients"
        );
    }
    assert_eq!(
        s.trio.job_state(2).unwrap().block_total_cnt,
        counts.len() as u32
    );
}

/// A new block's first packet writes its gradients over whatever its slot's buffer held
/// (another block's sums, of more or fewer gradients) instead of zeroing and adding: two
/// slots serve one block id's generations in turn, of sizes that end in the head, across
/// it, in a short last chunk, and fill 4 KB, and every Result is exact. Fails if the
/// creator adds into the old sums.
#[test]
fn a_new_blocks_first_packet_writes_over_its_slots_old_sums() {
    let mut j = job(3, &[0, 1, 2]);
    j.block_grad_max = 4095;
    j.block_cnt_max = 2;
    let mut s = Setup::new(config(), &[j]);
    let mut rng = Rng(23);
    let counts = [4095, 35, 1024, 17, 4095, 34, 100, 1, 4095, 49];
    for (gen, &n) in counts.iter().enumerate() {
        let g: Vec<Vec<i32>> = (0..3).map(|_| random_grads(&mut rng, n)).collect();
        let mut created = Vec::new();
        // The creator is a different source each time.
        for k in 0..3u8 {
            let src = (k + gen as u8) % 3;
            created = s.consumed(
                src.into(),
                &packet(3, 7, gen as u16, src, &g[usize::from(src)]),
            );
        }
        assert_eq!(created.len(), 1, "generation {gen}: {n} gradients");
        let sums = sum(&[&g[0], &g[1], &g[2]]);
        assert_eq!(
            created[0].1,
            expected_result(3, 7, gen as u16, 3, false, &sums),
            "generation {gen}: {n} gradients"
        );
    }
    // Each generation took the slot its last-but-one left: two slots, both reused.
    assert_eq!(s.trio.job_state(3).unwrap().block_curr_cnt, 1);
}

/// With FPISA lanes the packet that creates a block writes its floats as accumulators over
/// whatever its slot held, and a short last chunk writes the lines of its gradients only:
/// blocks of 40 gradients (a buffer of five lines, so a last chunk's second line would lie
/// in the next slot's buffer) are created next to live blocks in both orders, four at a
/// time, with a different creator each round, and every Result is exact. Fails if the
/// creator adds into the old sums, or writes its last chunk's two lines whole.
#[test]
fn an_fpisa_blocks_first_packet_writes_accumulators_over_its_slots_old_sums() {
    use pfemu::fpisa::Variant;
    use pfemu::microcode::trio_ml::Lanes;
    // Integer-valued floats of one binade: FPISA adds them exactly, in any order.
    let exact = |rng: &mut Rng| {
        let v = 64.0 + (rng.next() % 64) as f32;
        if rng.next().is_multiple_of(3) {
            -v
        } else {
            v
        }
    };
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits() as i32).collect::<Vec<i32>>();
    for variant in [Variant::Full, Variant::Approx] {
        let mut j = job(3, &[0, 1, 2]);
        j.block_grad_max = 40;
        // Four live blocks and the four Results of the generation before, kept.
        j.block_cnt_max = 8;
        let cfg = TrioMlConfig {
            lanes: Lanes::Fpisa(variant),
            ..config()
        };
        let mut s = Setup::new(cfg, &[j]);
        let mut rng = Rng(29);
        for (gen, n) in [40, 33, 40, 1, 40, 17, 8, 40].into_iter().enumerate() {
            let gen = gen as u16;
            let mut blocks: Vec<u32> = (0..4).collect();
            if gen % 2 == 1 {
                blocks.reverse();
            }
            let g: Vec<Vec<Vec<f32>>> = (0..4)
                .map(|_| {
                    (0..3)
                        .map(|_| (0..n).map(|_| exact(&mut rng)).collect())
                        .collect()
                })
                .collect();
            let srcs: Vec<u8> = (0..3).map(|k| (k + gen as u8) % 3).collect();
            // Every block's first packet, then the others'.
            for &b in &blocks {
                let src = srcs[0];
                let f = packet(3, b, gen, src, &bits(&g[b as usize][usize::from(src)]));
                assert!(s.consumed(src.into(), &f).is_empty());
            }
            for &b in &blocks {
                let mut created = Vec::new();
                for &src in &srcs[1..] {
                    let f = packet(3, b, gen, src, &bits(&g[b as usize][usize::from(src)]));
                    created = s.consumed(src.into(), &f);
                }
                let v = &g[b as usize];
                let sums: Vec<f32> = (0..n).map(|i| v[0][i] + v[1][i] + v[2][i]).collect();
                assert_eq!(created.len(), 1, "{variant:?} generation {gen} block {b}");
                assert_eq!(
                    created[0].1,
                    expected_result(3, b, gen, 3, false, &bits(&sums)),
                    "{variant:?} generation {gen} block {b}: {n} gradients"
                );
            }
        }
        assert_eq!(s.trio.job_state(3).unwrap().block_curr_cnt, 4);
    }
}

#[test]
fn a_repeated_source_is_never_added_twice_and_gets_the_kept_result() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1, 2])]);
    let g = [vec![1, 2, 3], vec![10, 20, 30], vec![100, 200, 300]];
    assert!(s.consumed(0, &packet(1, 4, 0, 0, &g[0])).is_empty());
    assert_eq!(
        s.dropped(0, &packet(1, 4, 0, 0, &g[0])),
        ("duplicate", vec![])
    );
    assert!(s.consumed(1, &packet(1, 4, 0, 1, &g[1])).is_empty());
    assert_eq!(
        s.dropped(1, &packet(1, 4, 0, 1, &g[1])),
        ("duplicate", vec![])
    );
    let created = s.consumed(2, &packet(1, 4, 0, 2, &g[2]));
    let result = expected_result(1, 4, 0, 3, false, &[111, 222, 333]);
    assert_eq!(created, [(Dest::Group(1), result.clone())]);

    // A source that lost the Result asks again: it gets the same bytes on its own port.
    assert_eq!(
        s.dropped(5, &packet(1, 4, 0, 1, &g[1])),
        ("retransmit_answered", vec![(Dest::Port(5), result)])
    );
    // Not a member of the job: no answer.
    assert_eq!(
        s.dropped(6, &packet(1, 4, 0, 9, &g[1])),
        ("unknown_source", vec![])
    );
    assert_eq!(s.trio.kept_results().unwrap()[0].sums, [111, 222, 333]);
}

#[test]
fn each_refusal_is_counted_under_its_reason() {
    let mut j = job(1, &[0, 1, 2]);
    j.block_grad_max = 64;
    j.block_cnt_max = 2;
    let mut s = Setup::new(config(), &[j]);
    let g10 = vec![1; 10];

    assert_eq!(s.dropped(0, &packet(9, 0, 0, 0, &g10)).0, "unknown_job");
    assert_eq!(s.dropped(0, &packet(1, 0, 0, 7, &g10)).0, "unknown_source");
    assert_eq!(
        s.dropped(0, &packet(1, 0, 0, 0, &[1; 65])).0,
        "block_grad_max"
    );
    assert_eq!(s.trio.job_state(1).unwrap().block_curr_cnt, 0);

    // Two blocks take the job's two slots; a third is refused.
    assert!(s.consumed(0, &packet(1, 0, 0, 0, &g10)).is_empty());
    assert!(s.consumed(0, &packet(1, 1, 0, 0, &g10)).is_empty());
    assert_eq!(s.dropped(0, &packet(1, 2, 0, 0, &g10)).0, "block_cnt_max");
    let st = s.trio.job_state(1).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.slots_in_use, st.block_total_cnt),
        (2, 2, 2)
    );

    // Hits are checked too.
    assert_eq!(s.dropped(0, &packet(1, 0, 0, 7, &g10)).0, "unknown_source");
    assert_eq!(
        s.dropped(1, &packet(1, 0, 0, 1, &[1; 11])).0,
        "grad_cnt_mismatch"
    );

    // Lengths: grad_cnt disagreeing with the payload, no gradients, a cut frame.
    let bad = packet_to(LOCAL, 12000, 1, 0, 0, 1, 11, &g10);
    assert_eq!(s.dropped(1, &bad).0, "bad_length");
    assert_eq!(s.dropped(1, &packet(1, 0, 0, 1, &[])).0, "bad_length");
    let good = packet(1, 0, 0, 1, &g10);
    assert_eq!(s.dropped(1, &good[..good.len() - 2]).0, "bad_length");
    assert_eq!(s.dropped(1, &good[..50]).0, "bad_length");

    // None of it touched block 0: one source in, sums of it alone.
    let active = s.trio.active_blocks().unwrap();
    assert_eq!(active.len(), 2);
    assert_eq!((active[0].rcvd_cnt, active[1].rcvd_cnt), (1, 1));
    assert_eq!(active[0].sums, g10);
}

#[test]
fn other_traffic_is_forwarded_by_route_or_dropped() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1])]);
    let other = Ipv4Addr::new(10, 9, 9, 9);
    let group_host = Ipv4Addr::new(10, 9, 9, 10);
    let to_other = packet_to(other, 12000, 1, 0, 0, 0, 3, &[1, 2, 3]);
    let wrong_port = packet_to(LOCAL, 12001, 1, 0, 0, 0, 3, &[1, 2, 3]);
    assert_eq!(s.dropped(0, &to_other).0, "no_route");
    assert_eq!(s.dropped(0, &wrong_port).0, "no_route");
    let mut arp = vec![0u8; 60];
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(s.dropped(0, &arp).0, "not_ipv4");

    s.trio.add_route(other, Dest::Port(3)).unwrap();
    s.trio.add_route(group_host, Dest::Group(4)).unwrap();
    let out = s.run(0, &to_other);
    assert_eq!(out.result, Ok(Verdict::Forward(3)));
    assert_eq!(out.output.as_deref(), Some(&to_other[..]));
    let to_group_host = packet_to(group_host, 5, 0, 0, 0, 0, 1, &[1]);
    assert_eq!(s.run(0, &to_group_host).result, Ok(Verdict::Multicast(4)));
    // A route replaced, then removed.
    s.trio.add_route(other, Dest::Port(8)).unwrap();
    assert_eq!(s.run(0, &to_other).result, Ok(Verdict::Forward(8)));
    assert!(s.trio.remove_route(other).unwrap());
    assert_eq!(s.dropped(0, &to_other).0, "no_route");
    assert!(s.trio.active_blocks().unwrap().is_empty());
}

#[test]
fn adding_a_job_backs_its_buffers_before_any_packet() {
    // The data path never pays for the storage of a block's buffer: the job's buffers (4 KB
    // each, 1 MiB for 256 slots) are backed when the job is added.
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, config()).unwrap();
    let acc_chunks = || -> usize {
        let debug = format!("{mem:?}");
        let (_, count) = debug
            .split_once("acc_chunks_materialised: ")
            .expect("the memory's Debug shows the count");
        let digits = count
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(count.len());
        count[..digits].parse().unwrap()
    };
    assert_eq!(acc_chunks(), 0);
    trio.add_job(&job(1, &[0, 1])).unwrap();
    assert_eq!(acc_chunks(), 1);
    let mut big = job(2, &[0, 1]);
    big.block_cnt_max = 512;
    trio.add_job(&big).unwrap();
    assert_eq!(acc_chunks(), 3);
}

/// Where a job's aggregation buffers go: to the accumulator region when it has room (the
/// job's DRAM region then holds its records alone, packed), else into the DRAM region,
/// after the records. Either way every Result of several blocks over several generations
/// is exact, so no buffer overlaps a record or another buffer; and a job refused for lack
/// of DRAM takes no accumulator space.
#[test]
fn a_jobs_buffers_follow_its_records_when_the_accumulator_has_no_room() {
    let mut rng = Rng(0x5107);
    for acc_bytes in [MemConfig::default().acc_bytes, 0] {
        let mem = Arc::new(
            SharedMemory::new(&MemConfig {
                acc_bytes,
                ..MemConfig::default()
            })
            .unwrap(),
        );
        let trio = TrioMl::install(&mem, config()).unwrap();
        let mut j = job(4, &[0, 1]);
        j.block_cnt_max = 8;
        trio.add_job(&j).unwrap();
        let job_regions: Vec<_> = mem
            .allocations()
            .into_iter()
            .filter(|a| a.name.contains(".job4."))
            .collect();
        // The record, the counter line, join words and bitmap (4 lines here), then 8
        // record lines; the buffers (1024 gradients: 4 KB each) apart or after them.
        let head_words = 16 + 256 + 8;
        let (records, buffers) = (8 * 8, 8 * 512);
        if acc_bytes > 0 {
            assert_eq!(job_regions.len(), 2, "{job_regions:?}");
            assert_eq!(job_regions[0].words, head_words + records);
            assert_eq!(
                (job_regions[1].region, job_regions[1].words),
                (Region::Acc, buffers)
            );
        } else {
            assert_eq!(job_regions.len(), 1, "{job_regions:?}");
            assert_eq!(job_regions[0].words, head_words + records + buffers);
        }
        let mut s = Setup {
            program: trio.program(),
            h: Harness::new(mem.clone()),
            trio,
        };
        // Every block open at once (source 0 for all, then source 1), so each block's adds
        // fall between the others' record writes; then each kept Result asked for again.
        for gen in 0..3u16 {
            let grads: Vec<[Vec<i32>; 2]> = (0..4)
                .map(|_| [random_grads(&mut rng, 1024), random_grads(&mut rng, 1024)])
                .collect();
            for (block, [a, _]) in (0u32..).zip(&grads) {
                assert!(s.consumed(0, &packet(4, block, gen, 0, a)).is_empty());
            }
            for (block, [a, b]) in (0u32..).zip(&grads) {
                assert_eq!(
                    s.consumed(1, &packet(4, block, gen, 1, b)),
                    [(
                        Dest::Group(4),
                        expected_result(4, block, gen, 2, false, &sum(&[a, b]))
                    )],
                    "acc_bytes {acc_bytes}, block {block}, generation {gen}"
                );
            }
            for (block, [a, b]) in (0u32..).zip(&grads) {
                let want = expected_result(4, block, gen, 2, false, &sum(&[a, b]));
                assert_eq!(
                    s.dropped(0, &packet(4, block, gen, 0, a)),
                    ("retransmit_answered", vec![(Dest::Port(0), want)]),
                    "acc_bytes {acc_bytes}, kept block {block}, generation {gen}"
                );
            }
        }
    }

    // DRAM without room for the records: refused, and the accumulator region untouched.
    let mem = Arc::new(
        SharedMemory::new(&MemConfig {
            dram_bytes: 1 << 16,
            ..MemConfig::default()
        })
        .unwrap(),
    );
    let trio = TrioMl::install(&mem, config()).unwrap();
    let before = mem.allocations();
    let mut big = job(5, &[0, 1]);
    big.block_cnt_max = 4096;
    assert!(trio.add_job(&big).is_err());
    assert_eq!(mem.allocations(), before, "a refused job takes no space");
}

#[test]
fn a_full_block_table_refuses_new_blocks() {
    let cfg = TrioMlConfig {
        hash_capacity: 2,
        hash_shards: 2,
        timers: 2,
        ..config()
    };
    let mut s = Setup::new(cfg, &[job(1, &[0, 1])]);
    assert!(s.consumed(0, &packet(1, 0, 0, 0, &[1])).is_empty());
    assert!(s.consumed(0, &packet(1, 1, 0, 0, &[1])).is_empty());
    assert_eq!(s.dropped(0, &packet(1, 2, 0, 0, &[1])).0, "table_full");
    let st = s.trio.job_state(1).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.slots_in_use, st.block_total_cnt),
        (2, 2, 2)
    );
    // A finished block leaves the active table (its Result is kept in the other one), so
    // finishing block 0 makes room for block 2; block 3 then finds the table full again,
    // until the job is removed.
    assert_eq!(s.consumed(1, &packet(1, 0, 0, 1, &[2])).len(), 1);
    assert_eq!((s.trio.active_records(), s.trio.kept_records()), (1, 1));
    assert!(s.consumed(0, &packet(1, 2, 0, 0, &[1])).is_empty());
    assert_eq!(s.dropped(0, &packet(1, 3, 0, 0, &[1])).0, "table_full");
    s.trio.remove_job(1).unwrap();
    s.trio.add_job(&job(1, &[0, 1])).unwrap();
    assert!(s.consumed(0, &packet(1, 3, 0, 0, &[1])).is_empty());
}

#[test]
fn generations_keep_the_last_result_until_the_next_one_finishes() {
    // Two block ids: two slots each (a kept Result while the next generation aggregates).
    let mut j = job(3, &[0, 1]);
    j.block_cnt_max = 4;
    let mut s = Setup::new(config(), &[j]);
    let gen0 = expected_result(3, 5, 0, 2, false, &[3, 30]);
    let gen1 = expected_result(3, 5, 1, 2, false, &[5, 50]);

    s.consumed(0, &packet(3, 5, 0, 0, &[1, 10]));
    assert_eq!(
        s.consumed(1, &packet(3, 5, 0, 1, &[2, 20])),
        [(Dest::Group(3), gen0.clone())]
    );
    // Generation 1 starts in a second slot; generation 0's Result stays kept.
    s.consumed(0, &packet(3, 5, 1, 0, &[2, 20]));
    assert_eq!(s.trio.job_state(3).unwrap().block_curr_cnt, 2);
    assert_eq!(s.trio.kept_result(3, 5).unwrap().unwrap().gen_id, 0);
    // Source 1 lost generation 0's Result and asks again.
    assert_eq!(
        s.dropped(1, &packet(3, 5, 0, 1, &[2, 20])),
        ("retransmit_answered", vec![(Dest::Port(1), gen0)])
    );
    assert_eq!(
        s.consumed(1, &packet(3, 5, 1, 1, &[3, 30])),
        [(Dest::Group(3), gen1.clone())]
    );
    // Generation 1 replaced generation 0, whose slot is free again.
    let st = s.trio.job_state(3).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.slots_in_use, st.block_total_cnt),
        (1, 1, 2)
    );
    assert_eq!(s.trio.kept_result(3, 5).unwrap().unwrap().gen_id, 1);
    assert_eq!(s.trio.kept_records(), 1);
    assert_eq!(s.dropped(0, &packet(3, 5, 0, 0, &[1, 10])).0, "stale_gen");
    assert_eq!(
        s.dropped(0, &packet(3, 5, 1, 0, &[2, 20])),
        ("retransmit_answered", vec![(Dest::Port(0), gen1)])
    );
    // Generations wrap: 0 follows 0xFFFF.
    s.consumed(0, &packet(3, 6, 0xFFFF, 0, &[1, 1]));
    s.consumed(1, &packet(3, 6, 0xFFFF, 1, &[1, 1]));
    s.consumed(0, &packet(3, 6, 0, 0, &[1, 1]));
    assert_eq!(s.consumed(1, &packet(3, 6, 0, 1, &[1, 1])).len(), 1);
    assert_eq!(s.trio.kept_result(3, 6).unwrap().unwrap().gen_id, 0);
    assert_eq!(
        s.dropped(0, &packet(3, 6, 0xFFFF, 0, &[1, 1])).0,
        "stale_gen"
    );
}

/// A packet of a generation older than the kept one is dropped as `stale_gen`. A server's
/// (header `src_cnt` 0) is told the generation is gone ([`wire::Gone`], out of the port it
/// came from), so that it settles the chunk as lost instead of asking again until it gives
/// up. A lower aggregator's Result (`src_cnt` not 0), from a source of the job all the
/// same, is told nothing: an aggregator does not retransmit, and takes no `Gone`.
#[test]
fn a_stale_generation_from_a_lower_aggregator_is_not_answered_gone() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1])]);
    for gen in 0..2u16 {
        s.consumed(0, &packet(1, 7, gen, 0, &[1]));
        assert_eq!(s.consumed(1, &packet(1, 7, gen, 1, &[2])).len(), 1);
    }
    assert_eq!(s.trio.kept_result(1, 7).unwrap().unwrap().gen_id, 1);

    // Source 1, a lower aggregator's Result standing for 3 servers, of generation 0.
    let mut from_below = packet(1, 7, 0, 1, &[2]);
    wire::TrioMlHdr::new_unchecked(&mut from_below[wire::TRIO_ML_HDR_AT..]).set_src_cnt(3);
    let (reason, created) = s.dropped(1, &from_below);
    assert_eq!(reason, "stale_gen");
    assert!(
        created.is_empty(),
        "a lower aggregator was answered: {:?}",
        created
            .iter()
            .map(|(d, f)| (*d, wire::Gone::of(&wire::parse(f).unwrap().0)))
            .collect::<Vec<_>>()
    );

    // The same packet from a server (`src_cnt` 0) is told generation 0 is gone.
    let (reason, created) = s.dropped(1, &packet(1, 7, 0, 1, &[2]));
    assert_eq!(reason, "stale_gen");
    let answers: Vec<_> = created
        .iter()
        .map(|(d, f)| (*d, wire::Gone::of(&wire::parse(f).unwrap().0)))
        .collect();
    let gone = wire::Gone {
        block_id: 7,
        gen_id: 0,
        run_id: 0,
    };
    assert_eq!(answers, [(Dest::Port(1), Some(gone))]);
}

/// Kept Results nobody asks for expire after `keep_result_ns` and free their slots, so
/// block ids a host stopped using (or a flood of new ones) do not hold a job's slots for
/// ever; a Result that is asked for stays.
#[test]
fn kept_results_nobody_asks_for_expire_and_free_their_slots() {
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 4,
        hash_shards: 16,
        // Kept scans every 16 ms: 40 ms is 3 of them without a request.
        keep_result_ns: 40 * MS,
        ..config()
    };
    let mut j = job(1, &[0]);
    j.block_cnt_max = 4;
    let mut s = Setup::new(cfg, &[j]);
    // Four block ids fill the job's four slots with kept Results.
    let results: Vec<Vec<u8>> = (0..4u32)
        .map(|b| {
            let out = s.consumed(0, &packet(1, 100 + b, 0, 0, &[b as i32 + 1]));
            assert_eq!(out.len(), 1);
            out[0].1.clone()
        })
        .collect();
    assert_eq!(s.dropped(0, &packet(1, 200, 0, 0, &[7])).0, "block_cnt_max");
    // Kept scans at 16, 32, 48 and 64 ms (other scans do not age kept Results); block 101's
    // Result is asked for after each.
    for k in 1..=4u64 {
        assert!(s.scan(k * 16 * MS - MS).is_empty());
        assert!(s.scan(k * 16 * MS).is_empty());
        assert_eq!(
            s.dropped(3, &packet(1, 101, 0, 0, &[2])),
            (
                "retransmit_answered",
                vec![(Dest::Port(3), results[1].clone())]
            )
        );
        let kept: Vec<u32> = s
            .trio
            .kept_results()
            .unwrap()
            .iter()
            .map(|b| b.block_id)
            .collect();
        if k < 4 {
            // Ages 0 (created since the last scan), 1, 2: still kept.
            assert_eq!(kept, [100, 101, 102, 103], "after kept scan {k}");
        } else {
            assert_eq!(kept, [101], "after kept scan {k}");
        }
    }
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_curr_cnt, st.slots_in_use), (1, 1));
    // Finished blocks left the active table; block 101's Result is still kept.
    assert_eq!(s.trio.active_records(), 0);
    assert_eq!(s.trio.kept_records(), 1);
    // The freed slots take new blocks again.
    assert_eq!(s.consumed(0, &packet(1, 200, 0, 0, &[7])).len(), 1);
    assert_eq!(s.trio.job_state(1).unwrap().block_curr_cnt, 2);
}

/// Sources keep asking for kept Results of many block ids while the timers expire them
/// and new blocks take their slots: every Result sent carries its own block's sums, never
/// those of a block that took the slot meanwhile.
///
/// The engine runs on a manual clock that moves one scan period per burst of packets, so
/// the timers run while the bursts are processed, and as many kept scans happen however
/// fast the machine is. Before each kept scan the test settles the timers (so no launch is
/// still running and none is skipped as an overrun), sets the clock to the kept scan, and
/// settles again: each kept scan runs, and frees the Results nobody asked for since the
/// last one.
#[test]
fn results_sent_again_while_kept_results_expire_are_never_another_blocks() {
    const PERIOD: u64 = MS / 4;
    const KEPT_SCANS: u64 = 16;
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let cfg = TrioMlConfig {
        scan_period_ns: PERIOD,
        timers: 4,
        hash_shards: 16,
        // One kept scan (every 16 periods, 4 ms) without a request.
        keep_result_ns: 1,
        ..config()
    };
    let trio = TrioMl::install(&mem, cfg).unwrap();
    let mut j = job(1, &[0]);
    j.block_cnt_max = 16;
    j.block_grad_max = 64;
    j.out_dest = Dest::Port(1);
    trio.add_job(&j).unwrap();
    let clock = Arc::new(pfemu::timer::ManualClock::new());
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(trio.program())
        .memory(mem)
        .ppe_threads(16)
        .timers(trio.timer_specs().unwrap())
        .clock(clock.clone())
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let mut rng = Rng(9);
    // 1024 block ids over 16 slots, each block's 64 sums all equal to its id.
    let frames: Vec<Vec<u8>> = (0..1024u32)
        .map(|b| packet(1, b, 0, 0, &[b as i32; 64]))
        .collect();
    let mut results = 0u64;
    for period in 0..KEPT_SCANS * pfemu::microcode::trio_ml::KEPT_SCAN_EVERY {
        // The 4 staggered timers' launches of this period are due from here on.
        let at = period * PERIOD + 3 * PERIOD / 4;
        if period % pfemu::microcode::trio_ml::KEPT_SCAN_EVERY == 0 {
            pfe.settle_timers();
            clock.set(at);
            pfe.settle_timers();
        } else {
            clock.set(at);
        }
        let burst: Vec<&[u8]> = (0..64)
            .map(|_| frames[rng.below(1024) as usize].as_slice())
            .collect();
        pfe.inject_burst(burst.into_iter().map(|f| (0, f))).unwrap();
        for p in rx.try_iter() {
            let (hdr, g) = wire::parse(&p.data).unwrap();
            assert_eq!(
                wire::gradients(g),
                vec![hdr.block_id as i32; 64],
                "block {}",
                hdr.block_id
            );
            results += 1;
        }
    }
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert!(results > 0);
    // Slots were freed by expiry and taken again: more blocks than slots were created.
    let created = trio.job_state(1).unwrap().block_total_cnt;
    assert!(created > 16, "{created} blocks created in 16 slots");
    // Packets waiting for a block another one is creating (and that its PPE thread,
    // preempted by the OS, is slow to publish) wait without running out of instructions.
    assert!(stats.faults.is_empty(), "{:?}", stats.faults);
    assert!(stats.drops("retransmit_answered") > 0);
}

#[test]
fn block_total_cnt_carries_across_its_two_words() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1])]);
    let mem = s.trio.memory().clone();
    let counters = s.trio.job_counters_addr(1).unwrap();
    let record = s.trio.job_record_addr(1).unwrap();
    let line_at = |at| {
        let mut line = [0u8; 64];
        mem.read(at, &mut line).unwrap();
        line
    };
    let set_total = |total: u32| {
        let mut line = line_at(counters);
        JobCtx::new_checked(&mut line[..])
            .unwrap()
            .set_block_total_cnt(total);
        mem.write(counters, &line).unwrap();
    };
    let record_line = line_at(record);
    set_total(0xFFFF);
    s.consumed(0, &packet(1, 0, 0, 0, &[1]));
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_total_cnt, st.block_exp_ms), (0x1_0000, 10));
    set_total(0xFFFF_FFFF);
    s.consumed(0, &packet(1, 1, 0, 0, &[1]));
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_total_cnt, st.block_exp_ms), (0, 10));
    assert_eq!((st.block_curr_cnt, st.block_grad_max), (2, 1024));
    // The wrap's carry into the bits where the record has block_exp was taken back: the
    // counter line holds the two counters and nothing else.
    let mut want = [0u8; 64];
    JobCtx::new_checked(&mut want[..])
        .unwrap()
        .set_block_curr_cnt(2);
    assert_eq!(line_at(counters), want);
    // And the packets never wrote the record: its line is as the job was added.
    assert_eq!(line_at(record), record_line);
}

#[test]
fn an_aged_block_sends_one_partial_result_after_block_exp_not_before() {
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 4,
        hash_shards: 16,
        ..config()
    };
    // block_exp 10 ms, scans every 1 ms.
    let mut s = Setup::new(cfg, &[job(1, &[0, 1, 2])]);
    let g = [
        vec![1, 2, 3, 4],
        vec![10, 20, 30, 40],
        vec![100, 200, 300, 400],
    ];
    s.consumed(0, &packet(1, 3, 0, 0, &g[0]));
    s.consumed(1, &packet(1, 3, 0, 1, &g[1]));

    // The first scan finds the block referenced (age 0); each later one ages it by one.
    for k in 1..=10u64 {
        assert!(s.scan(k * MS).is_empty(), "scan {k}");
        assert_eq!(s.trio.active_blocks().unwrap()[0].block_age, (k - 1) as u8);
    }
    let partial = expected_result(1, 3, 0, 2, true, &[11, 22, 33, 44]);
    assert_eq!(s.scan(11 * MS), [(Dest::Group(1), partial.clone())]);
    let (hdr, _) = wire::parse(&partial).unwrap();
    assert_eq!((hdr.degraded, hdr.age_op, hdr.src_cnt), (true, 1, 2));

    assert!(s.trio.active_blocks().unwrap().is_empty());
    let kept = s.trio.kept_results().unwrap();
    assert_eq!((kept.len(), kept[0].rcvd_cnt), (1, 2));
    // Kept Results stay (for keep_result_ns, 1 s by default).
    for k in 12..=30u64 {
        assert!(s.scan(k * MS).is_empty());
    }
    // The straggler comes late: dropped, and answered with the partial Result.
    assert_eq!(
        s.dropped(2, &packet(1, 3, 0, 2, &g[2])),
        ("late", vec![(Dest::Port(2), partial.clone())])
    );
    assert_eq!(
        s.dropped(0, &packet(1, 3, 0, 0, &g[0])),
        ("retransmit_answered", vec![(Dest::Port(0), partial)])
    );
    assert_eq!(s.trio.kept_results().unwrap()[0].sums, [11, 22, 33, 44]);
}

/// A job without a timeout: a block missing a source is never given up on, however long
/// the timers scan (the scans are counted, not timed), and the straggler's packet, however
/// late, completes it exactly. The timers still finish a block every source made.
#[test]
fn a_job_without_a_block_timeout_waits_for_its_last_source() {
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 4,
        hash_shards: 16,
        ..config()
    };
    let mut j = job(1, &[0, 1, 2]);
    j.block_exp_ms = NO_BLOCK_TIMEOUT;
    let mut s = Setup::new(cfg, &[j]);
    let g = [vec![1, 2], vec![10, 20], vec![100, 200]];
    s.consumed(0, &packet(1, 3, 0, 0, &g[0]));
    s.consumed(1, &packet(1, 3, 0, 1, &g[1]));
    // Far past the longest timeout a job may have (255 ms): the block ages (to 255 at
    // most) but stays open, and no partial Result goes out.
    for k in 1..=1000u64 {
        assert!(s.scan(k * MS).is_empty(), "scan {k}");
    }
    let open = s.trio.active_blocks().unwrap();
    assert_eq!(
        (open.len(), open[0].rcvd_cnt, open[0].block_age),
        (1, 2, 255)
    );
    assert!(s.trio.kept_results().unwrap().is_empty());
    // The straggler completes it: a whole Result, exact.
    let whole = expected_result(1, 3, 0, 3, false, &[111, 222]);
    assert_eq!(
        s.consumed(2, &packet(1, 3, 0, 2, &g[2])),
        [(Dest::Group(1), whole)]
    );
    assert!(s.trio.active_blocks().unwrap().is_empty());
    let kept = s.trio.kept_results().unwrap();
    assert_eq!((kept.len(), kept[0].rcvd_cnt), (1, 3));
}

#[test]
fn a_referenced_block_starts_ageing_again() {
    let cfg = TrioMlConfig {
        timers: 2,
        ..config()
    };
    let mut j = job(1, &[0, 1]);
    j.block_exp_ms = 3;
    let mut s = Setup::new(cfg, &[j]);
    s.h.set_now(5);
    s.consumed(0, &packet(1, 9, 0, 0, &[4]));
    assert_eq!(s.trio.active_blocks().unwrap()[0].block_start_time, 5);
    for k in 1..=3 {
        assert!(s.scan(k * MS).is_empty());
    }
    // A repeat of source 0 is dropped but references the block.
    assert_eq!(s.dropped(0, &packet(1, 9, 0, 0, &[4])).0, "duplicate");
    // Without it the block would have aged at scan 4 (age 3, 3 ms).
    for k in 4..=6 {
        assert!(s.scan(k * MS).is_empty(), "scan {k}");
    }
    let out = s.scan(7 * MS);
    assert_eq!(
        out,
        [(Dest::Group(1), expected_result(1, 9, 0, 1, true, &[4]))]
    );
}

#[test]
fn removing_a_job_discards_its_blocks() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1]), job(2, &[0, 1])]);
    s.consumed(0, &packet(1, 0, 0, 0, &[1]));
    s.consumed(0, &packet(1, 1, 0, 0, &[1]));
    s.consumed(1, &packet(1, 1, 0, 1, &[1]));
    s.consumed(0, &packet(2, 0, 0, 0, &[1]));
    // Job 1: block 0 active, block 1 finished (kept); job 2: block 0.
    assert_eq!((s.trio.active_records(), s.trio.kept_records()), (2, 1));
    s.trio.remove_job(1).unwrap();
    assert_eq!((s.trio.active_records(), s.trio.kept_records()), (1, 0));
    assert_eq!(s.trio.jobs(), [2]);
    assert_eq!(s.trio.job_state(1), Err(TrioMlError::NoSuchJob(1)));
    assert_eq!(s.dropped(0, &packet(1, 0, 0, 0, &[1])).0, "unknown_job");
    assert_eq!(s.trio.remove_job(1), Err(TrioMlError::NoSuchJob(1)));
    // The id can be used again, with a fresh record.
    s.trio.add_job(&job(1, &[0, 1])).unwrap();
    assert_eq!(s.trio.job_state(1).unwrap().block_curr_cnt, 0);
    s.consumed(0, &packet(1, 0, 0, 0, &[1]));
    assert_eq!(s.consumed(1, &packet(1, 0, 0, 1, &[2])).len(), 1);
    // Job 2 was not disturbed.
    assert_eq!(s.consumed(1, &packet(2, 0, 0, 1, &[2])).len(), 1);
}

#[test]
fn configuration_is_validated() {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let bad_timers = TrioMlConfig {
        timers: 2048,
        ..config()
    };
    match TrioMl::install(&mem, bad_timers) {
        Err(TrioMlError::Config(e)) => assert_eq!(e.setting, "timers"),
        other => panic!("{other:?}"),
    }
    let trio = TrioMl::install(&mem, config()).unwrap();
    let refused = |j: JobConfig| match trio.add_job(&j) {
        Err(TrioMlError::Config(e)) => e.setting,
        other => panic!("{other:?}"),
    };
    assert_eq!(refused(job(1, &[])), "sources");
    assert_eq!(refused(job(1, &[3, 3])), "sources");
    let all: Vec<u8> = (0..=255).collect();
    assert_eq!(refused(job(1, &all)), "sources");
    let mut j = job(1, &[0]);
    j.block_cnt_max = 0;
    assert_eq!(refused(j.clone()), "block_cnt_max");
    j.block_cnt_max = 4096;
    assert_eq!(refused(j), "block_cnt_max");
    let mut j = job(1, &[0]);
    j.block_grad_max = 4096;
    assert_eq!(refused(j), "block_grad_max");
    // 0 is no timeout (NO_BLOCK_TIMEOUT), not a refused setting.
    let mut j = job(7, &[0]);
    j.block_exp_ms = NO_BLOCK_TIMEOUT;
    trio.add_job(&j).unwrap();
    assert_eq!(trio.job_state(7).unwrap().block_exp_ms, NO_BLOCK_TIMEOUT);
    trio.remove_job(7).unwrap();
    trio.add_job(&job(1, &(0..255).collect::<Vec<u8>>()))
        .unwrap();
    assert_eq!(trio.add_job(&job(1, &[0])), Err(TrioMlError::JobExists(1)));
    assert_eq!(trio.job_state(1).unwrap().src_cnt, 255);
    // A timeout the 8-bit block_age cannot count to at this scan period.
    let fast = TrioMl::install(
        &mem,
        TrioMlConfig {
            scan_period_ns: 100_000,
            ..config()
        },
    )
    .unwrap();
    let mut j = job(2, &[0]);
    j.block_exp_ms = 26;
    assert!(matches!(fast.add_job(&j), Err(TrioMlError::Config(e)) if e.setting == "block_exp_ms"));
    j.block_exp_ms = 25;
    fast.add_job(&j).unwrap();
    assert_eq!(trio.timer_specs().unwrap().len(), 100);
}

/// Packet threads and a timer thread race on the same blocks (harnesses on OS threads).
/// Source `s` sends `1 << s` in every gradient, so a Result's sums name exactly the
/// sources in it: every Result must have equal lanes (never read while a source was still
/// adding), name `src_cnt` distinct sources that sent the block, and each aggregated
/// packet must be in exactly one Result.
/// Timer threads age blocks out while four threads add to them: every Result is exact,
/// each block has one Result, and each aggregated packet is in exactly one.
///
/// The scan's clock advances with the adders' work, one scan period per
/// [`PACKETS_PER_SCAN`] packets they have run, never with the machine's speed: however the
/// threads are scheduled, the run spans at most `total / PACKETS_PER_SCAN` periods and 16
/// more, far less than `keep_result_ns`. So kept Results never expire here (one that
/// expired would no longer answer a late packet of its block, which would start the block
/// again: a second Result).
#[test]
fn partial_results_race_with_adders_and_stay_exact() {
    const SOURCES: u8 = 8;
    const BLOCKS: u32 = 300;
    const GRADS: usize = 40;
    /// Adder packets per scan period (1 ms): blocks age out while late adders still add.
    const PACKETS_PER_SCAN: u64 = 8;
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 8,
        hash_shards: 64,
        ..config()
    };
    let keep_result_ns = cfg.keep_result_ns;
    let mut j = job(1, &(0..SOURCES).collect::<Vec<u8>>());
    j.block_exp_ms = 1;
    j.block_cnt_max = 512;
    let s = Setup::new(cfg, &[j]);
    let (trio, program) = (s.trio.clone(), s.program.clone());
    let mem = trio.memory().clone();

    // Each source sends every block except a few it straggles on, some twice.
    let mut rng = Rng(99);
    let mut sent = vec![0u32; BLOCKS as usize];
    let mut work: Vec<Vec<(u8, Vec<u8>)>> = vec![Vec::new(); 4];
    let mut total = 0u64;
    for block in 0..BLOCKS {
        for src in 0..SOURCES {
            if rng.below(10) == 0 {
                continue;
            }
            sent[block as usize] |= 1 << src;
            let f = packet(1, block, 0, src, &[1 << src; GRADS]);
            let copies = if rng.below(10) == 0 { 2 } else { 1 };
            for _ in 0..copies {
                work[usize::from(src) % 4].push((src, f.clone()));
                total += 1;
            }
        }
    }

    let outputs = Mutex::new(Vec::new());
    let reasons = Mutex::new(BTreeMap::<String, u64>::new());
    let consumed = std::sync::atomic::AtomicU64::new(0);
    // Packets the adders have run: what the scan's clock follows.
    let processed = std::sync::atomic::AtomicU64::new(0);
    let adders_done = AtomicBool::new(false);
    let end_ns = std::thread::scope(|sc| {
        let adders: Vec<_> = work
            .iter()
            .map(|frames| {
                let (mem, program) = (mem.clone(), program.clone());
                let (outputs, reasons, consumed) = (&outputs, &reasons, &consumed);
                let processed = &processed;
                sc.spawn(move || {
                    let mut h = Harness::new(mem);
                    for (src, f) in frames {
                        let out = h.run(&program, u16::from(*src), f);
                        match out.result {
                            Ok(Verdict::Consume) => {
                                consumed.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Verdict::Drop(r)) => {
                                *reasons
                                    .lock()
                                    .unwrap()
                                    .entry(program.drop_reason_name(r).to_owned())
                                    .or_default() += 1;
                            }
                            other => panic!("{other:?}"),
                        }
                        outputs.lock().unwrap().extend(out.created);
                        processed.fetch_add(1, Ordering::Release);
                    }
                })
            })
            .collect();
        let timer = {
            let (mem, program, trio) = (mem.clone(), program.clone(), trio.clone());
            let (outputs, adders_done, processed) = (&outputs, &adders_done, &processed);
            sc.spawn(move || {
                let mut h = Harness::new(mem);
                let mut now = 0;
                let mut after_adders = 0;
                let deadline = std::time::Instant::now() + PATIENCE;
                loop {
                    let finished = adders_done.load(Ordering::Acquire);
                    if !finished && now / MS >= processed.load(Ordering::Acquire) / PACKETS_PER_SCAN
                    {
                        // The next period begins when the adders have done its work.
                        assert!(
                            std::time::Instant::now() < deadline,
                            "the adders made no progress for {PATIENCE:?}"
                        );
                        std::thread::yield_now();
                        continue;
                    }
                    if finished {
                        // Every open block ages out within a few periods once nobody adds.
                        after_adders += 1;
                        assert!(
                            after_adders <= 16,
                            "blocks still open 16 scan periods after the adders finished: {:?}",
                            trio.active_blocks().unwrap()
                        );
                    }
                    now += MS;
                    h.set_now(now);
                    for slice in 0..8 {
                        let out = h.run_timer(
                            &program,
                            Launch {
                                timer: slice as usize,
                                entry: TIMER_ENTRY,
                                slice,
                                slices: 8,
                                scheduled_ns: now,
                                missed: 0,
                            },
                        );
                        assert_eq!(out.result, Ok(Verdict::Consume));
                        outputs.lock().unwrap().extend(out.created);
                    }
                    if finished && trio.active_blocks().unwrap().is_empty() {
                        break now;
                    }
                }
            })
        };
        for a in adders {
            a.join().unwrap();
        }
        adders_done.store(true, Ordering::Release);
        timer.join().unwrap()
    });
    assert!(
        end_ns < keep_result_ns,
        "the run spanned {end_ns} ns of scans: kept Results may have expired"
    );

    let outputs = outputs.into_inner().unwrap();
    let reasons = reasons.into_inner().unwrap();
    let consumed = consumed.into_inner();
    let mut results: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut in_results = 0u64;
    let mut answers = 0u64;
    for (dest, frame) in &outputs {
        let (hdr, grads) = wire::parse(frame).unwrap();
        let lanes = wire::gradients(grads);
        assert_eq!(lanes.len(), GRADS);
        assert!(lanes.iter().all(|&l| l == lanes[0]), "a torn Result");
        let set = lanes[0] as u32;
        assert_eq!(set.count_ones(), u32::from(hdr.src_cnt));
        assert_eq!(
            set & !sent[hdr.block_id as usize],
            0,
            "a source that never sent"
        );
        assert_eq!(hdr.degraded, hdr.src_cnt < SOURCES);
        match dest {
            Dest::Group(1) => {
                assert!(
                    results.insert(hdr.block_id, frame.clone()).is_none(),
                    "two Results for block {}",
                    hdr.block_id
                );
                in_results += u64::from(hdr.src_cnt);
            }
            Dest::Port(_) => answers += 1,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(results.len(), BLOCKS as usize, "one Result per block");
    // Blocks some source never sent can only have finished by ageing out.
    for (block, frame) in &results {
        if sent[*block as usize] != 0xFF {
            assert!(wire::parse(frame).unwrap().0.degraded);
        }
    }
    // Answers repeat their block's Result byte for byte.
    for (dest, frame) in &outputs {
        if let Dest::Port(_) = dest {
            let (hdr, _) = wire::parse(frame).unwrap();
            assert_eq!(frame, &results[&hdr.block_id]);
        }
    }
    assert_eq!(
        consumed, in_results,
        "each aggregated packet in exactly one Result"
    );
    let dropped: u64 = reasons.values().sum();
    assert_eq!(consumed + dropped, total);
    for r in reasons.keys() {
        assert!(
            ["duplicate", "late", "retransmit_answered"].contains(&r.as_str()),
            "{reasons:?}"
        );
    }
    assert!(
        answers
            <= reasons.get("late").unwrap_or(&0) + reasons.get("retransmit_answered").unwrap_or(&0)
    );
    let st = trio.job_state(1).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.slots_in_use, st.block_total_cnt),
        (BLOCKS as u16, BLOCKS, BLOCKS)
    );
    assert_eq!(trio.kept_records(), BLOCKS as usize);
}

/// The whole engine: 4 jobs x 8 sources x 200 blocks of random vectors on 256 PPE threads,
/// with repeated packets mixed in.
#[test]
fn a_pfe_with_256_threads_aggregates_every_block_exactly() {
    const JOBS: u8 = 4;
    const SOURCES: u8 = 8;
    const BLOCKS: u32 = 200;
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, config()).unwrap();
    let mut builder = Pfe::builder();
    for j in 0..JOBS {
        let mut cfg = job(j, &(0..SOURCES).collect::<Vec<u8>>());
        cfg.block_grad_max = 300;
        cfg.out_dest = if j < 2 {
            // Jobs 0 and 1 multicast to two ports each; 2 and 3 go to one port.
            let ports = [16 + 2 * u16::from(j), 17 + 2 * u16::from(j)];
            builder = builder.multicast_group(u16::from(j), ports);
            Dest::Group(u16::from(j))
        } else {
            Dest::Port(24 + u16::from(j))
        };
        trio.add_job(&cfg).unwrap();
    }
    let (sink, rx) = ChannelSink::new();
    let mut pfe = builder
        .program(trio.program())
        .memory(mem)
        .ppe_threads(256)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();

    let mut rng = Rng(2024);
    let mut expected: BTreeMap<(u8, u32), Vec<u8>> = BTreeMap::new();
    let mut frames: Vec<(Port, Vec<u8>)> = Vec::new();
    let mut repeats = 0u64;
    for j in 0..JOBS {
        for b in 0..BLOCKS {
            let n = 1 + rng.below(300) as usize;
            let g: Vec<Vec<i32>> = (0..SOURCES).map(|_| random_grads(&mut rng, n)).collect();
            let refs: Vec<&[i32]> = g.iter().map(|v| v.as_slice()).collect();
            expected.insert(
                (j, b),
                expected_result(j, b, 0, SOURCES, false, &sum(&refs)),
            );
            for src in 0..SOURCES {
                let f = packet(j, b, 0, src, &g[usize::from(src)]);
                if rng.below(20) == 0 {
                    frames.push((u16::from(src), f.clone()));
                    repeats += 1;
                }
                frames.push((u16::from(src), f));
            }
        }
    }
    // Interleave jobs, blocks and sources.
    for i in (1..frames.len()).rev() {
        frames.swap(i, rng.below(i as u64 + 1) as usize);
    }
    pfe.inject_burst(frames.iter().map(|(p, f)| (*p, f.as_slice())))
        .unwrap();
    pfe.drain();
    let stats = pfe.shutdown();

    let aggregated = u64::from(JOBS) * u64::from(SOURCES) * u64::from(BLOCKS);
    assert!(stats.is_conserved());
    assert_eq!(stats.packets_in, aggregated + repeats);
    assert_eq!(stats.consumed, aggregated);
    assert_eq!(
        stats.drops("duplicate") + stats.drops("retransmit_answered"),
        repeats
    );
    assert_eq!(stats.dropped, repeats, "{:?}", stats.dropped_by_reason);
    assert_eq!(
        stats.created,
        u64::from(JOBS) * u64::from(BLOCKS) + stats.drops("retransmit_answered")
    );

    let mut seen: BTreeMap<(u16, u8, u32), u32> = BTreeMap::new();
    let mut answers = 0;
    for p in rx.try_iter() {
        let (hdr, _) = wire::parse(&p.data).unwrap();
        assert_eq!(p.data, expected[&(hdr.job_id, hdr.block_id)]);
        if p.port < 16 {
            // An answer to a repeat: back to the source's port.
            answers += 1;
        } else {
            *seen.entry((p.port, hdr.job_id, hdr.block_id)).or_default() += 1;
        }
    }
    assert_eq!(answers, stats.drops("retransmit_answered"));
    // Every block's Result reached every port of its job exactly once.
    let mut want = BTreeMap::new();
    for j in 0..JOBS {
        let ports: Vec<u16> = if j < 2 {
            vec![16 + 2 * u16::from(j), 17 + 2 * u16::from(j)]
        } else {
            vec![24 + u16::from(j)]
        };
        for b in 0..BLOCKS {
            for &p in &ports {
                want.insert((p, j, b), 1);
            }
        }
    }
    assert_eq!(seen, want);
    for j in 0..JOBS {
        let st = trio.job_state(j).unwrap();
        assert_eq!(
            (st.block_curr_cnt, st.block_total_cnt, st.slots_in_use),
            (BLOCKS as u16, BLOCKS, BLOCKS)
        );
    }
    assert!(trio.active_blocks().unwrap().is_empty());
    assert_eq!(trio.kept_records(), usize::from(JOBS) * BLOCKS as usize);
    assert_eq!(
        trio.active_records(),
        0,
        "finished blocks leave the active table"
    );
}

/// Hosts stream a model through a window of block ids, generation after generation; each
/// generation is drained before the next (as hosts wait for Results). Slots are reused and
/// the job holds exactly one kept Result per block id.
#[test]
fn a_pfe_streams_generations_through_a_window_of_block_ids() {
    const WINDOW: u32 = 32;
    const SOURCES: u8 = 4;
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, config()).unwrap();
    let mut cfg = job(5, &(0..SOURCES).collect::<Vec<u8>>());
    cfg.block_cnt_max = 2 * WINDOW as u16;
    cfg.block_grad_max = 64;
    cfg.out_dest = Dest::Port(40);
    trio.add_job(&cfg).unwrap();
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(trio.program())
        .memory(mem)
        .ppe_threads(16)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let mut rng = Rng(5);
    for gen in 0..6u16 {
        let mut want = BTreeMap::new();
        let mut frames = Vec::new();
        for b in 0..WINDOW {
            let chunk = u32::from(gen) * WINDOW + b;
            let g: Vec<Vec<i32>> = (0..SOURCES)
                .map(|s| vec![(chunk * 10 + u32::from(s)) as i32; 1 + (chunk % 64) as usize])
                .collect();
            let refs: Vec<&[i32]> = g.iter().map(|v| v.as_slice()).collect();
            want.insert(b, expected_result(5, b, gen, SOURCES, false, &sum(&refs)));
            for src in 0..SOURCES {
                frames.push((u16::from(src), packet(5, b, gen, src, &g[usize::from(src)])));
            }
        }
        for i in (1..frames.len()).rev() {
            frames.swap(i, rng.below(i as u64 + 1) as usize);
        }
        pfe.inject_burst(frames.iter().map(|(p, f)| (*p, f.as_slice())))
            .unwrap();
        pfe.drain();
        let mut got = BTreeMap::new();
        for p in rx.try_iter() {
            assert_eq!(p.port, 40);
            let (hdr, _) = wire::parse(&p.data).unwrap();
            assert_eq!(hdr.gen_id, gen);
            assert!(got.insert(hdr.block_id, p.data).is_none());
        }
        assert_eq!(got, want, "generation {gen}");
        let st = trio.job_state(5).unwrap();
        assert_eq!(
            (st.block_curr_cnt, st.slots_in_use, st.block_total_cnt),
            (WINDOW as u16, WINDOW, WINDOW * (u32::from(gen) + 1))
        );
        assert_eq!(trio.kept_records(), WINDOW as usize);
    }
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert_eq!(stats.dropped, 0, "{:?}", stats.dropped_by_reason);
}

/// A timer launch finishes at most `max_aged_per_scan` aged blocks (its list lives in local
/// memory); the rest stay aged and go out at the next scans.
#[test]
fn aged_blocks_beyond_one_scans_list_go_out_at_the_next_scans() {
    let cfg = TrioMlConfig {
        timers: 1,
        ..config()
    };
    let mut j = job(1, &[0, 1]);
    j.block_exp_ms = 1;
    let mut s = Setup::new(cfg, &[j]);
    let per_scan = s.trio.max_aged_per_scan();
    assert_eq!(per_scan, 48);
    for b in 0..100 {
        s.consumed(0, &packet(1, b, 0, 0, &[b as i32]));
    }
    assert!(s.scan(MS).is_empty());
    let mut blocks = Vec::new();
    for (k, want) in [
        (2, per_scan),
        (3, per_scan),
        (4, 100 - 2 * per_scan),
        (5, 0),
    ] {
        let out = s.scan(k * MS);
        assert_eq!(out.len(), want, "scan {k}");
        for (dest, f) in out {
            assert_eq!(dest, Dest::Group(1));
            let (h, g) = wire::parse(&f).unwrap();
            assert_eq!((h.src_cnt, h.degraded), (1, true));
            assert_eq!(wire::gradients(g), [h.block_id as i32]);
            blocks.push(h.block_id);
        }
    }
    blocks.sort_unstable();
    assert_eq!(blocks, (0..100).collect::<Vec<u32>>());
}

/// Hierarchical aggregation: two first-level PFEs each sum their own servers and send their
/// Result to the top-level PFE, which sees each as one source (`src_id` = the low byte of
/// its `out_src_addr`) and multicasts the total, which the first-level PFEs forward to their
/// servers by standard forwarding.
#[test]
fn first_level_results_aggregate_again_at_the_top_level() {
    let top_addr = Ipv4Addr::new(10, 0, 9, 1);
    let level1 = |own: Ipv4Addr, out_src: Ipv4Addr| {
        let s = Setup::new(
            TrioMlConfig {
                local_addr: own,
                ..config()
            },
            &[JobConfig {
                out_src_addr: out_src,
                out_dst_addr: top_addr,
                out_dest: Dest::Port(60),
                ..job(1, &[0, 1])
            }],
        );
        s.trio.add_route(GROUP_ADDR, Dest::Group(1)).unwrap();
        s
    };
    let (a_addr, b_addr) = (Ipv4Addr::new(10, 0, 7, 1), Ipv4Addr::new(10, 0, 8, 1));
    let mut a = level1(a_addr, Ipv4Addr::new(10, 0, 7, 11));
    let mut b = level1(b_addr, Ipv4Addr::new(10, 0, 8, 12));
    let mut top = Setup::new(
        TrioMlConfig {
            local_addr: top_addr,
            ..config()
        },
        &[job(1, &[11, 12])],
    );
    let to = |addr, src: u8, g: &[i32]| packet_to(addr, 12000, 1, 4, 2, src, g.len() as u16, g);
    a.consumed(0, &to(a_addr, 0, &[1, 2]));
    let ra = a.consumed(1, &to(a_addr, 1, &[10, 20]));
    b.consumed(0, &to(b_addr, 0, &[100, 200]));
    let rb = b.consumed(1, &to(b_addr, 1, &[1000, 2000]));
    assert_eq!(ra[0].0, Dest::Port(60));
    let (ha, _) = wire::parse(&ra[0].1).unwrap();
    assert_eq!(
        (ha.src_id, ha.src_cnt, ha.block_id, ha.gen_id),
        (11, 2, 4, 2)
    );

    assert!(top.consumed(60, &ra[0].1).is_empty());
    let total = top.consumed(61, &rb[0].1);
    // src_cnt counts the servers in the sum (2 + 2), not the first-level aggregators.
    let want = expected_result(1, 4, 2, 4, false, &[1111, 2222]);
    assert_eq!(total, [(Dest::Group(1), want.clone())]);
    // Down again: the first level forwards the total to its servers' group.
    let down = a.run(60, &want);
    assert_eq!(down.result, Ok(Verdict::Multicast(1)));
    assert_eq!(down.output.as_deref(), Some(&want[..]));
}

/// Every source of a block races to create it, generation after generation, in a job with
/// exactly the two slots a block id needs (its kept Result and its next generation): one
/// packet creates the block and counts the slot, the others wait for its record and join,
/// so none is refused as `block_cnt_max` and every generation sums all sources.
#[test]
fn sources_racing_to_create_a_block_at_the_slot_limit_all_join_it() {
    const SOURCES: u8 = 8;
    const GENS: u16 = 150;
    let mut j = job(1, &(0..SOURCES).collect::<Vec<u8>>());
    j.block_cnt_max = 2;
    let s = Setup::new(config(), &[j]);
    let (trio, program) = (s.trio.clone(), s.program.clone());
    let mem = trio.memory().clone();
    let barrier = std::sync::Barrier::new(usize::from(SOURCES));
    let results = Mutex::new(Vec::new());
    let reasons = Mutex::new(BTreeMap::<String, u64>::new());
    std::thread::scope(|sc| {
        for src in 0..SOURCES {
            let (mem, program) = (mem.clone(), program.clone());
            let (barrier, results, reasons) = (&barrier, &results, &reasons);
            sc.spawn(move || {
                let mut h = Harness::new(mem);
                for gen in 0..GENS {
                    let f = packet(1, 0, gen, src, &[1 << src; 20]);
                    barrier.wait();
                    let out = h.run(&program, u16::from(src), &f);
                    if let Ok(Verdict::Drop(r)) = out.result {
                        *reasons
                            .lock()
                            .unwrap()
                            .entry(program.drop_reason_name(r).to_owned())
                            .or_default() += 1;
                    }
                    assert!(out.result.is_ok(), "{:?}", out.result);
                    results.lock().unwrap().extend(out.created);
                    // The next generation starts only when this one is done everywhere.
                    barrier.wait();
                }
            });
        }
    });
    assert_eq!(*reasons.lock().unwrap(), BTreeMap::new());
    let results = results.into_inner().unwrap();
    assert_eq!(
        results.len(),
        usize::from(GENS),
        "one Result per generation"
    );
    let mut gens: Vec<u16> = results
        .iter()
        .map(|(_, r)| {
            let (h, g) = wire::parse(r).unwrap();
            assert_eq!((h.src_cnt, h.degraded), (SOURCES, false));
            assert_eq!(wire::gradients(g), vec![(1 << SOURCES) - 1; 20]);
            h.gen_id
        })
        .collect();
    gens.sort_unstable();
    assert_eq!(gens, (0..GENS).collect::<Vec<_>>());
    let state = trio.job_state(1).unwrap();
    assert_eq!(
        state.block_curr_cnt, 1,
        "only the last kept Result holds a slot"
    );
    assert_eq!(state.block_total_cnt, u32::from(GENS));
}

/// The engine's own timer threads on a manual clock: a block missing one source gets its
/// partial Result exactly when the clock passes its timeout (plus at most a scan period),
/// never before, and the late source is answered with it.
#[test]
fn engine_timers_on_a_manual_clock_send_the_partial_result_after_the_timeout() {
    let clock = Arc::new(pfemu::timer::ManualClock::new());
    let cfg = TrioMlConfig {
        timers: 10,
        scan_period_ns: MS,
        ..config()
    };
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, cfg).unwrap();
    let mut j = job(1, &[0, 1, 2]);
    j.block_exp_ms = 5;
    trio.add_job(&j).unwrap();
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(trio.program())
        .ppe_threads(8)
        .memory(mem)
        .multicast_group(1, vec![0, 1, 2])
        .timers(trio.timer_specs().unwrap())
        .clock(clock.clone())
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.inject_frame(0, &packet(1, 7, 0, 0, &[1, 2, 3]))
        .unwrap();
    pfe.inject_frame(1, &packet(1, 7, 0, 1, &[10, 20, 30]))
        .unwrap();
    pfe.drain();
    // Step the clock a tenth of a scan period at a time; the timers fire as it passes.
    let mut aged_at = None;
    for step in 1..=100u64 {
        clock.set(step * MS / 10);
        pfe.settle_timers();
        if rx.try_iter().count() > 0 {
            aged_at = Some(step * MS / 10);
            // Multicast to the three ports: the other two copies are here too.
            break;
        }
    }
    let at = aged_at.expect("a partial Result");
    assert!(
        (5 * MS..=6 * MS).contains(&at),
        "aged at {at} ns, expected between block_exp (5 ms) and block_exp + one scan period"
    );
    // The late source is answered with the kept partial Result on its own port.
    pfe.inject_frame(2, &packet(1, 7, 0, 2, &[100, 200, 300]))
        .unwrap();
    pfe.drain();
    let answer: Vec<Packet> = rx.try_iter().collect();
    assert_eq!(answer.len(), 1);
    assert_eq!(answer[0].port, 2);
    let (h, g) = wire::parse(&answer[0].data).unwrap();
    assert_eq!((h.src_cnt, h.degraded, h.age_op), (2, true, 1));
    assert_eq!(wire::gradients(g), [11, 22, 33]);
    let stats = pfe.shutdown();
    assert_eq!(stats.drops("late"), 1);
    assert!(stats.timer_runs > 0 && stats.timer_faults == 0);
    assert!(stats.is_conserved());
}

/// A lower aggregator's partial Result makes the upper level's Result partial too, and
/// `src_cnt` adds up the servers each source stands for.
#[test]
fn a_partial_result_from_below_stays_partial_above_and_src_cnt_counts_servers() {
    let mut top = Setup::new(config(), &[job(1, &[11, 12])]);
    let from = |src: u8, src_cnt: u8, degraded: bool, g: &[i32]| {
        let mut f = packet(1, 3, 0, src, g);
        let mut h = wire::TrioMlHdr::new_checked(&mut f[wire::TRIO_ML_HDR_AT..]).unwrap();
        h.set_src_cnt(src_cnt);
        h.set_degraded(degraded);
        h.set_age_op(u8::from(degraded));
        f
    };
    // First-level 11 lost one of its 3 servers; first-level 12 had both of its 2.
    assert!(top.consumed(60, &from(11, 2, true, &[5, 6])).is_empty());
    let out = top.consumed(61, &from(12, 2, false, &[50, 60]));
    let (h, g) = wire::parse(&out[0].1).unwrap();
    assert_eq!((h.src_cnt, h.degraded, h.age_op), (4, true, 0));
    assert_eq!(wire::gradients(g), [55, 66]);
}

// ----- runs (wire::Control): a job's new run is never answered with an earlier run's Results

/// Source `src` joins job `job`'s run with `nonce`; the run id the aggregator answers.
fn join(s: &mut Setup, job: u8, src: u8, nonce: u32) -> u8 {
    let ep = common::worker_endpoints(src, LOCAL, 12000);
    let (reason, created) = s.dropped(u16::from(src), &wire::join_packet(ep, job, src, nonce));
    assert_eq!(reason, "join_answered");
    assert_eq!(created.len(), 1, "one answer, to the sender");
    assert_eq!(created[0].0, Dest::Port(u16::from(src)));
    let (h, grads) = wire::parse(&created[0].1).unwrap();
    assert!(grads.is_empty());
    let ip = Ipv4::new_checked(&created[0].1[14..]).unwrap();
    assert_eq!((ip.src_addr(), ip.dst_addr()), (LOCAL, ep.src_addr));
    assert_eq!((h.job_id, h.src_id), (job, src));
    match Control::of(&h) {
        Some(Control::Joined { run_id, nonce: n }) if n == nonce => run_id,
        other => panic!("expected Joined for nonce {nonce:#x}, got {other:?}"),
    }
}

/// [`packet`] of run `run`.
fn packet_in(run: u8, job: u8, block: u32, gen: u16, src: u8, grads: &[i32]) -> Vec<u8> {
    let mut f = packet(job, block, gen, src, grads);
    wire::TrioMlHdr::new_unchecked(&mut f[wire::TRIO_ML_HDR_AT..]).set_run_id(run);
    f
}

/// The one Result among `created`: its header and sums.
fn result_of(created: &[(Dest, Vec<u8>)]) -> (TrioMlHdrFields, Vec<i32>) {
    assert_eq!(created.len(), 1, "one Result");
    let (h, g) = wire::parse(&created[0].1).unwrap();
    (h, wire::gradients(g))
}

#[test]
fn a_new_run_of_a_job_is_never_answered_with_the_last_runs_results() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1])]);
    assert_eq!(s.trio.job_state(1).unwrap().run_id, 0);
    assert_eq!(join(&mut s, 1, 0, 0xA0), 1);
    assert_eq!(join(&mut s, 1, 1, 0xB0), 1);
    // A Join repeated with its nonce (the answer was lost) stays in the run.
    assert_eq!(join(&mut s, 1, 0, 0xA0), 1);
    assert!(s.consumed(0, &packet_in(1, 1, 0, 0, 0, &[1, 2])).is_empty());
    let (h, sums) = result_of(&s.consumed(1, &packet_in(1, 1, 0, 0, 1, &[10, 20])));
    assert_eq!((sums, h.run_id, h.src_cnt), (vec![11, 22], 1, 2));

    // Both workers restart (new processes, new nonces) and send block 0, generation 0
    // again with other gradients: a new run, aggregated afresh.
    assert_eq!(join(&mut s, 1, 1, 0xB1), 2);
    assert_eq!(join(&mut s, 1, 0, 0xA1), 2);
    assert_eq!(s.trio.job_state(1).unwrap().run_id, 2);
    assert!(s.consumed(0, &packet_in(2, 1, 0, 0, 0, &[5, 5])).is_empty());
    let (h, sums) = result_of(&s.consumed(1, &packet_in(2, 1, 0, 0, 1, &[1, 1])));
    assert_eq!(
        (sums, h.run_id, h.src_cnt, h.degraded),
        (vec![6, 6], 2, 2, false)
    );
    // A retransmission of the new run gets the new run's Result.
    let (reason, created) = s.dropped(0, &packet_in(2, 1, 0, 0, 0, &[5, 5]));
    assert_eq!(reason, "retransmit_answered");
    assert_eq!(result_of(&created).1, [6, 6]);
}

#[test]
fn a_restarted_run_starts_at_once_even_behind_the_last_runs_generations() {
    let mut j = job(1, &[0]);
    j.block_cnt_max = 2;
    let mut s = Setup::new(config(), &[j]);
    assert_eq!(join(&mut s, 1, 0, 1), 1);
    for gen in 0..4u16 {
        let (h, _) = result_of(&s.consumed(0, &packet_in(1, 1, 0, gen, 0, &[7])));
        assert_eq!((h.gen_id, h.run_id), (gen, 1));
    }
    // The restart begins at generation 0 again: not stale, and the kept Result of run 1
    // gives its slot up as run 2's block 0 finishes.
    assert_eq!(join(&mut s, 1, 0, 2), 2);
    for gen in 0..4u16 {
        let (h, sums) = result_of(&s.consumed(0, &packet_in(2, 1, 0, gen, 0, &[i32::from(gen)])));
        assert_eq!((h.gen_id, h.run_id, sums), (gen, 2, vec![i32::from(gen)]));
    }
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_curr_cnt, st.slots_in_use), (1, 1));
}

/// A job restarted again and again comes back to its run ids (4 bits): an id is taken
/// again only once nothing of its last run holds a slot, so a kept Result of that run never
/// answers the new one.
#[test]
fn a_run_id_comes_back_only_once_its_last_runs_results_are_gone() {
    let mut s = Setup::new(config(), &[job(1, &[0])]);
    assert_eq!(join(&mut s, 1, 0, 100), 1);
    let (h, sums) = result_of(&s.consumed(0, &packet_in(1, 1, 7, 0, 0, &[7])));
    assert_eq!((h.run_id, sums), (1, vec![7]));
    // Fourteen restarts that finish nothing: runs 2 to 15.
    for run in 2..=15u8 {
        assert_eq!(join(&mut s, 1, 0, 100 + u32::from(run)), run);
    }
    // The next restart wraps past run 1, whose Result of block 7 is still kept ...
    let run = join(&mut s, 1, 0, 200);
    assert_ne!(run, 15, "a restart starts a new run");
    // ... and the new run aggregates block 7, generation 0, afresh.
    let (h, sums) = result_of(&s.consumed(0, &packet_in(run, 1, 7, 0, 0, &[100])));
    assert_eq!((h.run_id, sums), (run, vec![100]));
    // Its Result replaced run 1's, whose slot is free again ...
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_curr_cnt, st.slots_in_use), (1, 1));
    // ... so once the ids after it are used, run 1 comes back.
    for next in run + 1..=15 {
        assert_eq!(join(&mut s, 1, 0, 300 + u32::from(next)), next);
    }
    assert_eq!(join(&mut s, 1, 0, 400), 1);
    let (h, sums) = result_of(&s.consumed(0, &packet_in(1, 1, 7, 0, 0, &[5])));
    assert_eq!((h.run_id, sums), (1, vec![5]));
}

/// Job 1 (source 0, 32 slots, scans every ms by 4 timers, kept Results dropped after
/// `keep_result_ns`) after runs 1 to 15, each joined by a restart of source 0 (nonce
/// `100 + run`), finished a block of their own id (block `run`, gradients `[1]`).
fn fifteen_runs_each_keeping_a_result(keep_result_ns: u64) -> Setup {
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 4,
        hash_shards: 16,
        keep_result_ns,
        ..config()
    };
    let mut j = job(1, &[0]);
    j.block_cnt_max = 32;
    let mut s = Setup::new(cfg, &[j]);
    for run in 1..=15u8 {
        assert_eq!(join(&mut s, 1, 0, 100 + u32::from(run)), run);
        let block = u32::from(run);
        let (h, _) = result_of(&s.consumed(0, &packet_in(run, 1, block, 0, 0, &[1])));
        assert_eq!(h.run_id, run);
    }
    s
}

/// When every other run id still has Results kept, a restart's Join is refused (counted,
/// not answered: the worker sends it again) until the old Results expire.
#[test]
fn a_join_waits_while_every_other_run_id_holds_results() {
    // Kept scans every 16 ms: a Result nobody asks for goes at the first one.
    let mut s = fifteen_runs_each_keeping_a_result(16 * MS);
    let ep = common::worker_endpoints(0, LOCAL, 12000);
    let restart = wire::join_packet(ep, 1, 0, 300);
    let (reason, created) = s.dropped(0, &restart);
    assert_eq!((reason, created.len()), ("runs_busy", 0));
    // The job stays in run 15: its packets are still aggregated.
    assert_eq!(s.trio.job_state(1).unwrap().run_id, 15);
    let (h, sums) = result_of(&s.consumed(0, &packet_in(15, 1, 40, 0, 0, &[3])));
    assert_eq!((h.run_id, sums), (15, vec![3]));
    // Kept scans at 16 and 32 ms (a Result kept since the last one is young at the first)
    // drop every Result nobody asked for: the Join sent again joins run 1 afresh.
    for now in 1..=32 {
        assert!(s.scan(now * MS).is_empty());
    }
    assert_eq!(s.trio.kept_records(), 0);
    assert_eq!(join(&mut s, 1, 0, 300), 1);
    let (h, sums) = result_of(&s.consumed(0, &packet_in(1, 1, 1, 0, 0, &[9])));
    assert_eq!((h.run_id, sums), (1, vec![9]));
}

/// Results kept "until replaced" (`keep_result_ns` 0) still go once their run is left: the
/// kept scans drop them at the second that finds the run left, so a job that restarted 15
/// times, every run leaving a Result, is not refused a run for ever; the current run's
/// Results stay.
#[test]
fn results_of_left_runs_go_even_when_results_are_kept_until_replaced() {
    let mut s = fifteen_runs_each_keeping_a_result(0);
    let ep = common::worker_endpoints(0, LOCAL, 12000);
    assert_eq!(
        s.dropped(0, &wire::join_packet(ep, 1, 0, 300)).0,
        "runs_busy"
    );
    // The kept scan at 16 ms marks runs 1 to 14's Results, the one at 32 ms drops them.
    for now in 1..=31 {
        assert!(s.scan(now * MS).is_empty());
    }
    assert_eq!(s.trio.kept_records(), 15, "marked, not yet dropped");
    assert!(s.scan(32 * MS).is_empty());
    let kept: Vec<(u32, u8)> = s
        .trio
        .kept_results()
        .unwrap()
        .iter()
        .map(|b| (b.block_id, b.run_id))
        .collect();
    assert_eq!(kept, [(15, 15)], "only the current run's Result stays");
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_curr_cnt, st.slots_in_use), (1, 1));
    // Run 15's Result is still answered, and the restart now joins run 1.
    let (reason, created) = s.dropped(0, &packet_in(15, 1, 15, 0, 0, &[1]));
    assert_eq!(
        (reason, result_of(&created).1),
        ("retransmit_answered", vec![1])
    );
    assert_eq!(join(&mut s, 1, 0, 300), 1);
    // Later kept scans leave the Result of run 15 (now left) no longer than two scans.
    for now in 33..=64 {
        assert!(s.scan(now * MS).is_empty());
    }
    assert_eq!(s.trio.kept_records(), 0);
}

#[test]
fn gradients_of_a_superseded_run_are_refused_and_told_the_current_run() {
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 4,
        hash_shards: 16,
        ..config()
    };
    let mut j = job(1, &[0, 1]);
    j.block_exp_ms = 3;
    let mut s = Setup::new(cfg, &[j]);
    assert_eq!(join(&mut s, 1, 0, 0xA0), 1);
    assert_eq!(join(&mut s, 1, 1, 0xB0), 1);
    // Run 1 leaves block 5 open (source 1 never sends it) ...
    assert!(s.consumed(0, &packet_in(1, 1, 5, 0, 0, &[1])).is_empty());
    // ... when source 0 restarts: run 2.
    assert_eq!(join(&mut s, 1, 0, 0xA1), 2);
    let superseded = |(reason, created): (&str, Vec<(Dest, Vec<u8>)>)| {
        assert_eq!(reason, "stale_run");
        assert_eq!(created.len(), 1);
        assert_eq!(created[0].0, Dest::Port(1));
        Control::of(&wire::parse(&created[0].1).unwrap().0)
    };
    // Source 1, still in run 1: refused for an open block of run 1 and for a new block.
    assert_eq!(
        superseded(s.dropped(1, &packet_in(1, 1, 5, 0, 1, &[2]))),
        Some(Control::Superseded { run_id: 2 })
    );
    assert_eq!(
        superseded(s.dropped(1, &packet_in(1, 1, 6, 0, 1, &[2]))),
        Some(Control::Superseded { run_id: 2 })
    );
    // Run 1's open block ages out without a Result (nobody of run 1 is left to want it)
    // and frees its slot.
    assert_eq!(s.trio.job_state(1).unwrap().block_curr_cnt, 1);
    for now in 1..=6 {
        assert!(s.scan(now * MS).is_empty(), "no Result of the old run");
    }
    let st = s.trio.job_state(1).unwrap();
    assert_eq!((st.block_curr_cnt, st.slots_in_use), (0, 0));
    assert_eq!(s.trio.active_records(), 0);
    // A source that joins the current run afresh (not a restart within it) joins run 2.
    assert_eq!(join(&mut s, 1, 1, 0xB0), 2);
    assert!(s.consumed(1, &packet_in(2, 1, 5, 0, 1, &[2])).is_empty());
    let (h, sums) = result_of(&s.consumed(0, &packet_in(2, 1, 5, 0, 0, &[1])));
    assert_eq!((h.run_id, sums), (2, vec![3]));
}

#[test]
fn joins_are_checked_and_bad_control_messages_counted() {
    let mut s = Setup::new(config(), &[job(1, &[0, 1])]);
    let ep = Endpoints {
        src_mac: [2, 0, 0, 0, 1, 9],
        dst_mac: config().local_mac,
        src_addr: Ipv4Addr::new(10, 0, 1, 9),
        dst_addr: LOCAL,
        src_port: 40009,
        dst_port: 12000,
    };
    assert_eq!(
        s.dropped(0, &wire::join_packet(ep, 2, 0, 1)).0,
        "unknown_job"
    );
    assert_eq!(
        s.dropped(0, &wire::join_packet(ep, 1, 9, 1)).0,
        "unknown_source"
    );
    // A Joined sent to the aggregator, and a Join with gradients after it.
    let joined = wire::agg_packet(&AggPacket {
        endpoints: ep,
        hdr: Control::Joined {
            run_id: 3,
            nonce: 1,
        }
        .header(1, 0),
        gradients: &[],
    });
    assert_eq!(s.dropped(0, &joined).0, "bad_control");
    let with_grads = wire::agg_packet(&AggPacket {
        endpoints: ep,
        hdr: TrioMlHdrFields {
            grad_cnt: 1,
            ..Control::Join { nonce: 1 }.header(1, 0)
        },
        gradients: &[1],
    });
    assert_eq!(s.dropped(0, &with_grads).0, "bad_control");
    assert_eq!(s.trio.job_state(1).unwrap().run_id, 0);
}

/// A client of the paper's header alone asking again and again for an old generation (a
/// restarted run of such clients) must not keep the old kept Result alive: it expires
/// like one nobody asks for, and the block id is free again.
#[test]
fn a_kept_result_only_stale_generations_ask_for_still_expires() {
    let cfg = TrioMlConfig {
        scan_period_ns: MS,
        timers: 4,
        hash_shards: 16,
        // Kept scans every 16 ms: 40 ms is 3 of them without a request.
        keep_result_ns: 40 * MS,
        ..config()
    };
    let mut s = Setup::new(cfg, &[job(1, &[0])]);
    for gen in 0..3u16 {
        assert_eq!(s.consumed(0, &packet(1, 7, gen, 0, &[1])).len(), 1);
    }
    for k in 1..=4u64 {
        assert!(s.scan(k * 16 * MS).is_empty());
        let kept = s.trio.kept_results().unwrap().len();
        if k < 4 {
            assert_eq!(kept, 1, "after kept scan {k}");
            assert_eq!(s.dropped(0, &packet(1, 7, 0, 0, &[1])).0, "stale_gen");
        } else {
            assert_eq!(kept, 0, "after kept scan {k}: expired");
        }
    }
    // Generation 0 starts afresh.
    let (h, sums) = result_of(&s.consumed(0, &packet(1, 7, 0, 0, &[4])));
    assert_eq!((h.gen_id, sums), (0, vec![4]));
}

/// A removed job's memory is reused only after three grace periods (on the harness, whose
/// threads are done once each packet returns, each grace period is over at once), by a job
/// of the same shape, and the job that takes it starts as fresh: no blocks, counters at
/// zero, and Results of its own gradients alone, whatever the last job left there.
#[test]
fn a_removed_jobs_memory_is_reused_after_its_grace_periods_and_starts_fresh() {
    let mut one = job(1, &[0, 1]);
    one.block_cnt_max = 4;
    let mut s = Setup::new(config(), &[one.clone()]);
    let first = s.trio.job_record_addr(1).unwrap();
    let named = |s: &Setup, job: &str| -> usize {
        let map = s.h.memory().allocations();
        map.iter().filter(|a| a.name.contains(job)).count()
    };
    // Its record region, and its buffers' if the accumulator region holds them.
    let regions_per_job = named(&s, ".job1.");
    // Job 1 leaves a block half aggregated and a kept Result behind.
    s.consumed(0, &packet(1, 3, 0, 0, &[100, 200]));
    s.consumed(0, &packet(1, 4, 0, 0, &[1, 2]));
    assert_eq!(s.consumed(1, &packet(1, 4, 0, 1, &[3, 4])).len(), 1);
    s.trio.remove_job(1).unwrap();
    assert_eq!(s.trio.retired_jobs(), (1, 0));

    // Without its grace periods, a job of the same shape gets fresh memory.
    let mut two = job(2, &[0, 1]);
    two.block_cnt_max = 4;
    s.trio.add_job(&two).unwrap();
    assert_ne!(s.trio.job_record_addr(2), Some(first));
    s.trio.remove_job(2).unwrap();
    let second = s.trio.job_record_addr(2);
    assert_eq!(second, None);
    // Two grace periods are not enough: job 1's memory is swept, not free.
    for _ in 0..2 {
        let ticket = s.trio.grace_ticket();
        assert_eq!(s.trio.release_retired(ticket), Ok(0));
    }
    let mut three = job(3, &[0, 1]);
    three.block_cnt_max = 4;
    s.trio.add_job(&three).unwrap();
    assert_ne!(s.trio.job_record_addr(3), Some(first));
    s.trio.remove_job(3).unwrap();
    // The third frees job 1's (and, released as far, job 2's) memory.
    let ticket = s.trio.grace_ticket();
    assert_eq!(s.trio.release_retired(ticket), Ok(2));
    assert_eq!(s.trio.retired_jobs(), (1, 2));

    // A job of another shape does not take it.
    let mut big = job(4, &[0, 1]);
    big.block_cnt_max = 8;
    s.trio.add_job(&big).unwrap();
    assert_eq!(s.trio.retired_jobs(), (1, 2));

    // Job 5, same shape: it takes a freed region, named for it now.
    let allocations = s.trio_allocations();
    let mut five = job(5, &[0, 1]);
    five.block_cnt_max = 4;
    s.trio.add_job(&five).unwrap();
    assert_eq!(s.trio.retired_jobs(), (1, 1));
    assert_eq!(
        s.trio_allocations(),
        allocations,
        "memory reused, none allocated"
    );
    let names_of = |s: &Setup, at: u64| -> Vec<String> {
        let map = s.h.memory().allocations();
        map.iter()
            .filter(|a| a.addr == at)
            .map(|a| a.name.clone())
            .collect()
    };
    let at = s.trio.job_record_addr(5).unwrap();
    let names = names_of(&s, at);
    assert!(
        names.len() == 1 && names[0].contains(".job5."),
        "job 5's record region is named for it: {names:?}"
    );
    assert_eq!(named(&s, ".job5."), regions_per_job, "and its buffers'");

    // Job 1 again, same shape: it takes the other freed region, and starts afresh.
    s.trio.remove_job(5).unwrap();
    s.trio.add_job(&one).unwrap();
    assert_eq!(s.trio.retired_jobs(), (2, 0));
    assert_eq!(
        s.trio_allocations(),
        allocations,
        "memory reused, none allocated"
    );
    let names = names_of(&s, s.trio.job_record_addr(1).unwrap());
    assert!(
        names.len() == 1 && names[0].contains(".job1."),
        "job 1's record region is named for it: {names:?}"
    );
    let st = s.trio.job_state(1).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.slots_in_use, st.block_total_cnt),
        (0, 0, 0)
    );
    assert_eq!(s.trio.kept_result(1, 4).unwrap(), None);
    assert!(s.trio.active_blocks().unwrap().is_empty());
    s.consumed(0, &packet(1, 3, 0, 0, &[1, 10]));
    assert_eq!(
        s.consumed(1, &packet(1, 3, 0, 1, &[2, 20])),
        [(Dest::Group(1), expected_result(1, 3, 0, 2, false, &[3, 30]))]
    );
    assert_eq!(s.trio.job_state(1).unwrap().block_total_cnt, 1);
}
