//! Trio-ML under interleavings replayed deterministically: a packet thread is held before a
//! chosen instruction ([`Harness::run_observed`]) while other threads run, as a PPE thread
//! the host OS deschedules between two instructions would be.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;

use pfemu::microcode::trio_ml::wire::{self, AggPacket, TrioMlHdrFields};
use pfemu::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use pfemu::prelude::*;
use pfemu::program::{Harness, HarnessOutcome};

use common::Held;

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const MS: u64 = 1_000_000;

fn packet(block: u32, gen: u16, src: u8) -> Vec<u8> {
    packet_with(block, gen, src, &[i32::from(src) + 1; 4])
}

/// Source `src`'s packet of job 1's block `block`, generation `gen`, with `gradients`.
fn packet_with(block: u32, gen: u16, src: u8, gradients: &[i32]) -> Vec<u8> {
    wire::agg_packet(&AggPacket {
        endpoints: common::worker_endpoints(src, LOCAL, wire::DEFAULT_UDP_PORT),
        hdr: TrioMlHdrFields {
            job_id: 1,
            block_id: block,
            gen_id: gen,
            src_id: src,
            grad_cnt: gradients.len() as u16,
            ..Default::default()
        },
        gradients,
    })
}

use common::{trio_ml_launch as launch, trio_ml_scan as scan};

/// `(block, gen, src_cnt)` of each Result sent to the job's group.
fn group_results(created: &[(Dest, Vec<u8>)]) -> Vec<(u32, u16, u8)> {
    created
        .iter()
        .filter(|(d, _)| *d == Dest::Group(1))
        .map(|(_, f)| {
            let (h, _) = wire::parse(f).unwrap();
            (h.block_id, h.gen_id, h.src_cnt)
        })
        .collect()
}

/// An aggregator of job 1 (sources 0 and 1, blocks aging out after 1 ms, Results to group
/// 1, 4 slots), one timer owning the whole table.
fn install() -> (Arc<SharedMemory>, TrioMl, Program) {
    install_with_slots(4)
}

/// [`install`] with `slots` block slots.
fn install_with_slots(slots: u16) -> (Arc<SharedMemory>, TrioMl, Program) {
    install_keeping(slots, TrioMlConfig::default().keep_result_ns)
}

/// [`install_with_slots`], kept Results dropped after `keep_result_ns` without a request.
fn install_keeping(slots: u16, keep_result_ns: u64) -> (Arc<SharedMemory>, TrioMl, Program) {
    install_job(slots, keep_result_ns, 1)
}

/// [`install_keeping`], blocks aging out after `block_exp_ms`.
fn install_job(
    slots: u16,
    keep_result_ns: u64,
    block_exp_ms: u8,
) -> (Arc<SharedMemory>, TrioMl, Program) {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            local_addr: LOCAL,
            scan_period_ns: MS,
            timers: 1,
            hash_shards: 16,
            keep_result_ns,
            ..TrioMlConfig::default()
        },
    )
    .unwrap();
    trio.add_job(&JobConfig {
        job_id: 1,
        sources: vec![0, 1],
        block_exp_ms,
        block_cnt_max: slots,
        out_dest: Dest::Group(1),
        ..JobConfig::default()
    })
    .unwrap();
    let program = trio.program();
    (mem, trio, program)
}

/// Runs `frame` (from port `port`) on a thread of its own, held before its first
/// `claim_slot` until it is released; returns once it is held there.
fn hold_before_claim(
    mem: &Arc<SharedMemory>,
    program: &Program,
    port: Port,
    frame: Vec<u8>,
) -> Held {
    common::hold_before(mem, program, "claim_slot", (port, 0), frame)
}

/// Three more scan periods, at 3, 4 and 5 ms (after the tests' own at 1 and 2 ms): time
/// for a block started again to age out and send its Result; the packets they created.
fn later_scans(h: &mut Harness, program: &Program) -> Vec<(Dest, Vec<u8>)> {
    [3 * MS, 4 * MS, 5 * MS]
        .into_iter()
        .flat_map(|now| scan(h, program, now))
        .collect()
}

/// The name of a verdict: a drop reason, or what else it was.
fn verdict_name(program: &Program, out: &HarnessOutcome) -> &'static str {
    match out.result {
        Ok(Verdict::Drop(r)) => program.drop_reason_name(r),
        Ok(Verdict::Consume) => "consumed (it created the block again)",
        ref other => panic!("{other:?}"),
    }
}

/// A packet that found no block and no kept Result, and is descheduled before it claims
/// the block's key, must not create the block after the block was created by another
/// packet, aged out, and replaced by its next generation: that would send the block's
/// Result to the group a second time.
///
/// The interleaving: source 1's generation-0 packet looks block 5 up (nothing yet), then
/// is held before `claim_slot`. Source 0 creates generation 0; it ages out (a partial
/// Result, source 1 missing); both sources, having that Result, finish generation 1,
/// which replaces generation 0's kept Result. Then the held packet goes on: it is a stale
/// generation.
#[test]
fn a_packet_held_before_it_creates_its_block_never_makes_a_second_result() {
    let (mem, trio, program) = install();
    let held = hold_before_claim(&mem, &program, 1, packet(5, 0, 1));

    let mut h = Harness::new(mem.clone());
    let mut sent = Vec::new();
    let out = h.run(&program, 0, &packet(5, 0, 0));
    assert_eq!(out.result, Ok(Verdict::Consume));
    // Referenced at the first scan, idle for 1 ms at the second: a partial Result.
    for now in [MS, 2 * MS] {
        sent.extend(scan(&mut h, &program, now));
    }
    assert_eq!(group_results(&sent), [(5, 0, 1)], "generation 0 aged out");
    for src in [0u8, 1] {
        sent.extend(h.run(&program, src.into(), &packet(5, 1, src)).created);
    }
    assert_eq!(group_results(&sent), [(5, 0, 1), (5, 1, 2)]);

    let out = held.release();
    assert_eq!(
        verdict_name(&program, &out),
        "stale_gen",
        "a packet of a replaced generation is stale"
    );
    sent.extend(out.created);
    sent.extend(later_scans(&mut h, &program));
    assert_eq!(
        group_results(&sent),
        [(5, 0, 1), (5, 1, 2)],
        "one Result per block and generation"
    );
    assert!(trio.active_blocks().unwrap().is_empty());
}

/// A finished block leaves no record in the active table, so a packet held before it
/// claims the key of a block that meanwhile was created and finished wins the key: once it
/// holds it, it must find the block's kept Result and be answered from it, not aggregate a
/// second block of the same generation and send the group a second Result.
///
/// Two interleavings, each on a fresh aggregator: source 1's packet is held before
/// `claim_slot` while source 0 creates generation 0 and
/// - the block ages out without source 1 (a partial Result): the held packet is late, and
///   is sent the partial Result;
/// - source 1's own packet (the held one is its retransmission) completes the block: the
///   held packet is answered with the whole Result.
#[test]
fn a_packet_held_before_it_creates_a_block_that_finished_is_answered_from_the_kept_result() {
    for completes in [false, true] {
        let (mem, trio, program) = install();
        let held = hold_before_claim(&mem, &program, 1, packet(5, 0, 1));
        let mut h = Harness::new(mem.clone());
        let mut sent = h.run(&program, 0, &packet(5, 0, 0)).created;
        if completes {
            sent.extend(h.run(&program, 1, &packet(5, 0, 1)).created);
        } else {
            // Referenced at the first scan, idle for 1 ms at the second: a partial Result.
            for now in [MS, 2 * MS] {
                sent.extend(scan(&mut h, &program, now));
            }
        }
        let src_cnt = if completes { 2 } else { 1 };
        assert_eq!(
            group_results(&sent),
            [(5, 0, src_cnt)],
            "completes: {completes}"
        );
        assert_eq!(
            trio.active_records(),
            0,
            "the finished block left the active table"
        );

        let out = held.release();
        let want = if completes {
            "retransmit_answered"
        } else {
            "late"
        };
        assert_eq!(verdict_name(&program, &out), want, "completes: {completes}");
        // Answered from the kept Result, to the port it came from.
        assert_eq!(out.created.len(), 1, "completes: {completes}");
        let (dest, result) = &out.created[0];
        assert_eq!(*dest, Dest::Port(1));
        let (hdr, _) = wire::parse(result).unwrap();
        assert_eq!(
            (hdr.block_id, hdr.gen_id, hdr.src_cnt),
            (5, 0, src_cnt),
            "completes: {completes}"
        );
        sent.extend(out.created);
        sent.extend(later_scans(&mut h, &program));
        assert_eq!(
            group_results(&sent),
            [(5, 0, src_cnt)],
            "one Result per block and generation (completes: {completes})"
        );
        assert_eq!(trio.active_records(), 0, "no block was started again");
        assert_eq!(
            trio.job_state(1).unwrap().slots_in_use,
            1,
            "only the kept Result's slot"
        );
    }
}

/// A timer thread lists the blocks that aged out, then closes them one by one. While it is
/// held between the two, the block it listed completes, a later generation's Result frees
/// its slot, and a new block takes the slot. The timer must not close and finish the new
/// block under the old one's key: that sent a stale Result of the old block, freed the new
/// block's slot and left its later packets nothing to join.
#[test]
fn a_timer_held_after_listing_an_aged_block_leaves_the_next_block_in_its_slot_alone() {
    // Two slots: once generation 1 holds one, block 6 can only take generation 0's.
    let (mem, trio, program) = install_with_slots(2);
    let mut h = Harness::new(mem.clone());
    let mut sent = h.run(&program, 0, &packet(5, 0, 0)).created;
    // Referenced at the first scan, idle for 1 ms at the second: listed as aged.
    sent.extend(scan(&mut h, &program, MS));
    let timer = common::hold_timer_before(&mem, &program, "close_aged", 2 * MS, launch(2 * MS));

    h.set_now(2 * MS);
    sent.extend(h.run(&program, 1, &packet(5, 0, 1)).created);
    for src in [0u8, 1] {
        sent.extend(h.run(&program, src.into(), &packet(5, 1, src)).created);
    }
    assert_eq!(group_results(&sent), [(5, 0, 2), (5, 1, 2)]);
    // Generation 1's kept Result replaced generation 0's and freed its slot: block 6 takes it.
    sent.extend(h.run(&program, 0, &packet(6, 0, 0)).created);
    let blocks = trio.active_blocks().unwrap();
    let new = blocks
        .iter()
        .find(|b| b.block_id == 6)
        .expect("block 6 is active");
    assert_eq!(new.sums, [1; 4], "block 6 holds source 0's gradients");
    assert_eq!(trio.job_state(1).unwrap().slots_in_use, 2, "both slots");

    let out = timer.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(
        group_results(&out.created),
        [],
        "the timer sent no Result: the block it listed had finished"
    );
    sent.extend(h.run(&program, 1, &packet(6, 0, 1)).created);
    assert_eq!(
        group_results(&sent),
        [(5, 0, 2), (5, 1, 2), (6, 0, 2)],
        "block 6 completes with both sources"
    );
}

/// Two generations of one block id finishing at once (sources that run ahead): each finds
/// the same older kept Result to replace. The one held between finding it and replacing it
/// must not then replace the newer generation's Result, nor free its slot: it keeps its
/// own Result out of the table and frees its own slot.
#[test]
fn a_generation_held_before_it_replaces_the_kept_result_leaves_a_newer_one_kept() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    let mut sent = Vec::new();
    sent.extend(from_both(&mut h, &program, |src| packet(5, 0, src)));
    // Generation 1 completes on a thread held as it replaces generation 0's kept Result ...
    sent.extend(h.run(&program, 0, &packet(5, 1, 0)).created);
    let held = common::hold_before(&mem, &program, "replace_kept", (1, 0), packet(5, 1, 1));
    // ... while generation 2 completes and replaces it first.
    sent.extend(from_both(&mut h, &program, |src| packet(5, 2, src)));
    let out = held.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    sent.extend(out.created);
    let mut results = group_results(&sent);
    results.sort_unstable();
    assert_eq!(results, [(5, 0, 2), (5, 1, 2), (5, 2, 2)]);
    let kept = trio.kept_result(1, 5).unwrap().expect("a kept Result");
    assert_eq!(kept.gen_id, 2, "the newest generation stays kept");
    let st = trio.job_state(1).unwrap();
    assert_eq!(
        (st.block_curr_cnt, st.slots_in_use),
        (1, 1),
        "only the kept Result's slot"
    );
    // Its slot still holds its sums: a retransmission is answered with them.
    let out = h.run(&program, 1, &packet(5, 2, 1));
    assert_eq!(verdict_name(&program, &out), "retransmit_answered");
    let (hdr, sums) = wire::parse(&out.created[0].1).unwrap();
    assert_eq!((hdr.gen_id, wire::gradients(sums)), (2, vec![3; 4]));
}

/// Source `src`'s Join of job 1 with `nonce`: the run the aggregator answers.
fn join(h: &mut Harness, program: &Program, src: u8, nonce: u32) -> u8 {
    let ep = common::worker_endpoints(src, LOCAL, wire::DEFAULT_UDP_PORT);
    let out = h.run(
        program,
        u16::from(src),
        &wire::join_packet(ep, 1, src, nonce),
    );
    assert_eq!(verdict_name(program, &out), "join_answered");
    let (hdr, _) = wire::parse(&out.created[0].1).unwrap();
    match wire::Control::of(&hdr) {
        Some(wire::Control::Joined { run_id, .. }) => run_id,
        other => panic!("{other:?}"),
    }
}

/// A block being created holds its run id from the moment it takes its slot: a restart's
/// Join that comes round to that id meanwhile takes another, or the held packet would
/// create a block of the earlier run under the new run's id, for the new run to join.
#[test]
fn a_run_id_whose_block_is_being_created_is_not_taken_again() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    assert_eq!(join(&mut h, &program, 0, 100), 1);
    let mut frame = packet(5, 0, 0);
    wire::TrioMlHdr::new_unchecked(&mut frame[wire::TRIO_ML_HDR_AT..]).set_run_id(1);
    let held = common::hold_before(&mem, &program, "aggregate_head", (0, 0), frame);
    // Source 0 restarts 14 times (runs 2 to 15, none of which holds a slot), then once more.
    for run in 2..=15u8 {
        assert_eq!(join(&mut h, &program, 0, 100 + u32::from(run)), run);
    }
    let run = join(&mut h, &program, 0, 200);
    assert_eq!(run, 2, "run 1 still has a block being created");
    let out = held.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(trio.job_state(1).unwrap().run_id, 2);
}

/// Runs source 0's and then source 1's packet (`frame(src)`, from port `src`); the packets
/// they created.
fn from_both(
    h: &mut Harness,
    program: &Program,
    frame: impl Fn(u8) -> Vec<u8>,
) -> Vec<(Dest, Vec<u8>)> {
    [0u8, 1]
        .into_iter()
        .flat_map(|src| h.run(program, u16::from(src), &frame(src)).created)
        .collect()
}

/// [`packet`] with gradients of its generation: `gen * 10 + src + 1`.
fn packet_of_gen(block: u32, gen: u16, src: u8) -> Vec<u8> {
    packet_with(
        block,
        gen,
        src,
        &[i32::from(gen) * 10 + i32::from(src) + 1; 4],
    )
}

/// The finisher of a generation builds its Result from its slot. With sources that run
/// ahead, the next generation may finish meanwhile and replace it: the slot of the
/// Result being built must not be freed (and taken by a later block, whose gradients
/// would go out in this Result) before the build has read it.
#[test]
fn a_result_held_while_it_is_built_is_not_overwritten_by_a_later_generation() {
    let (mem, _trio, program) = install();
    let mut h = Harness::new(mem.clone());
    let mut sent = Vec::new();
    sent.extend(from_both(&mut h, &program, |src| packet_of_gen(5, 0, src)));
    // Generation 1's finisher is held as it copies its sums out ...
    sent.extend(h.run(&program, 0, &packet_of_gen(5, 1, 0)).created);
    let held = common::hold_before(
        &mem,
        &program,
        "result_tail",
        (1, 0),
        packet_of_gen(5, 1, 1),
    );
    // ... while generation 2 finishes, and generation 3 starts.
    sent.extend(from_both(&mut h, &program, |src| packet_of_gen(5, 2, src)));
    sent.extend(h.run(&program, 0, &packet_of_gen(5, 3, 0)).created);
    let out = held.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    sent.extend(out.created);
    // Each generation's sums: (gen * 10 + 1) + (gen * 10 + 2).
    assert_eq!(
        sums_by_gen(&sent),
        [(0, vec![3; 4]), (1, vec![23; 4]), (2, vec![43; 4])]
    );
}

/// `(gen, sums)` of each Result sent to the job's group, by generation.
fn sums_by_gen(created: &[(Dest, Vec<u8>)]) -> Vec<(u16, Vec<i32>)> {
    let mut results: Vec<(u16, Vec<i32>)> = created
        .iter()
        .filter(|(d, _)| *d == Dest::Group(1))
        .map(|(_, f)| {
            let (h, sums) = wire::parse(f).unwrap();
            (h.gen_id, wire::gradients(sums))
        })
        .collect();
    results.sort();
    results
}

/// Block 5 with its slot taken again under a held packet ([`slot_taken_again_under`]).
struct SlotTakenAgain {
    h: Harness,
    program: Program,
    trio: TrioMl,
    /// The Results sent so far.
    sent: Vec<(Dest, Vec<u8>)>,
    /// Source 1's packet of generation 0.
    held: common::Held,
}

/// Generation 0 of block 5 ages out with source 0 alone while source 1's packet of it is
/// held at `labels` in turn (it found the block in the active table before), then
/// generation 1 replaces its kept Result and frees its slot, and source 0 starts generation
/// 2 in that slot (two slots: the only one free). With `in_gate`, the held packet goes on
/// to its second label before generation 1 runs.
fn slot_taken_again_under(in_gate: bool, labels: &[&'static str]) -> SlotTakenAgain {
    let (mem, trio, program) = install_with_slots(2);
    let mut h = Harness::new(mem.clone());
    let mut sent = h.run(&program, 0, &packet_of_gen(5, 0, 0)).created;
    let mut held = common::hold_before_each(&mem, &program, labels, (1, 0), packet_of_gen(5, 0, 1));
    sent.extend(scan(&mut h, &program, MS));
    sent.extend(scan(&mut h, &program, 2 * MS));
    assert_eq!(
        sums_by_gen(&sent),
        [(0, vec![1; 4])],
        "generation 0 aged out"
    );
    if in_gate {
        // Into generation 0's closed gate, while its slot still holds it.
        assert!(held.step(), "the held packet goes on to its next label");
    }
    sent.extend(from_both(&mut h, &program, |src| packet_of_gen(5, 1, src)));
    sent.extend(h.run(&program, 0, &packet_of_gen(5, 2, 0)).created);
    SlotTakenAgain {
        h,
        program,
        trio,
        sent,
        held,
    }
}

/// How [`stale_entry_under`] frees the slot of block 5's generation 0 under its held
/// finisher.
#[derive(Clone, Copy)]
enum Freed {
    /// Both sources' packets of generation 1: it finishes, and its Result replaces
    /// generation 0's kept one (sent to the group, in `sent`).
    ByGeneration1,
    /// Scans at 16 and 32 ms: generation 0's kept Result expires (a job that keeps Results
    /// 1 ns); nothing is sent.
    ByExpiry,
}

/// Block 5 with a stale active entry under its held finisher ([`stale_entry_under`]).
struct StaleEntry {
    h: Harness,
    program: Program,
    trio: TrioMl,
    /// The Results sent so far.
    sent: Vec<(Dest, Vec<u8>)>,
    /// Source 1's packet of generation 0, held before `release_block`.
    finisher: common::Held,
}

/// The stale-entry tests' opening, on `installed` (a job of two slots): source 0's packet of
/// block 5's generation 0, then source 1's, which finishes it and keeps its Result, held
/// before `release_block` (before it takes the block's key out of the active table). Then
/// generation 0's slot is freed as `freed` says, and source 0's packet of block 6 takes
/// it: block 5's home slot, free again.
///
/// The state it leaves: the finisher held (generation 0's Result not sent yet: it goes
/// once the finisher goes on); block 6 started in the slot with source 0 alone; generation
/// 0's entry still in the active table, stale (its slot's tag is block 6's now), beside
/// block 6's; `sent` holding generation 1's Result if [`Freed::ByGeneration1`], and
/// nothing else.
fn stale_entry_under(
    (mem, trio, program): (Arc<SharedMemory>, TrioMl, Program),
    freed: Freed,
) -> StaleEntry {
    let mut h = Harness::new(mem.clone());
    let mut sent = h.run(&program, 0, &packet_of_gen(5, 0, 0)).created;
    let finisher = common::hold_before(
        &mem,
        &program,
        "release_block",
        (1, 0),
        packet_of_gen(5, 0, 1),
    );
    match freed {
        Freed::ByGeneration1 => {
            sent.extend(from_both(&mut h, &program, |src| packet_of_gen(5, 1, src)));
        }
        Freed::ByExpiry => {
            for now in [16 * MS, 32 * MS] {
                sent.extend(scan(&mut h, &program, now));
            }
            assert_eq!(trio.kept_records(), 0, "the Result expired");
        }
    }
    sent.extend(h.run(&program, 0, &packet(6, 0, 0)).created);
    StaleEntry {
        h,
        program,
        trio,
        sent,
        finisher,
    }
}

/// Each generation's sums: (gen * 10 + 1) + (gen * 10 + 2), generation 0's from source 0
/// alone (it aged out).
fn three_generations() -> Vec<(u16, Vec<i32>)> {
    vec![(0, vec![1; 4]), (1, vec![23; 4]), (2, vec![43; 4])]
}

/// Once a test is over: no block left active, generation 2's Result kept and answering.
fn only_generation_2_kept(trio: &TrioMl, h: &mut Harness, program: &Program) {
    assert_eq!(trio.active_records(), 0, "no block is left active");
    let kept = trio.kept_result(1, 5).unwrap().expect("a kept Result");
    assert_eq!(kept.gen_id, 2);
    let again = h.run(program, 0, &packet_of_gen(5, 2, 0));
    assert_eq!(verdict_name(program, &again), "retransmit_answered");
}

/// A packet that found its block in the active table and is descheduled before it joins
/// the block's gate (before it reads the block's record, or after), while the block
/// finishes and a new block takes its slot, must not add to that new block: the slot's
/// tag tells it its block is gone, and it looks again. Before the tag, it added generation
/// 0's gradients to generation 2 and completed it for source 1, whose own packet of
/// generation 2 was then answered as a retransmission.
#[test]
fn a_packet_whose_block_left_its_slot_does_not_join_the_block_there_now() {
    for label in ["check_source", "join_block"] {
        let SlotTakenAgain {
            mut h,
            program,
            trio,
            mut sent,
            held,
        } = slot_taken_again_under(false, &[label]);
        let out = held.release();
        assert_eq!(
            verdict_name(&program, &out),
            "stale_gen",
            "held before {label}: generation 1's Result is kept"
        );
        // Told that generation 0 is gone (its source asks for it), never sent a Result.
        let answers: Vec<_> = out
            .created
            .iter()
            .map(|(d, f)| (*d, wire::Gone::of(&wire::parse(f).unwrap().0)))
            .collect();
        let gone = wire::Gone {
            block_id: 5,
            gen_id: 0,
            run_id: 0,
        };
        assert_eq!(
            answers,
            [(Dest::Port(1), Some(gone))],
            "held before {label}"
        );
        sent.extend(h.run(&program, 1, &packet_of_gen(5, 2, 1)).created);
        assert_eq!(
            sums_by_gen(&sent),
            three_generations(),
            "held before {label}"
        );
        only_generation_2_kept(&trio, &mut h, &program);
    }
}

/// A packet that entered a finished block's closed gate is still in it when the block's
/// slot goes to a new block: the new block counts it in flight, and the new block's last
/// source to leave is the last out once that packet has left. Before, the new record was
/// written over the count: the held packet's leave took the new block's gate below zero and
/// generation 2 never finished.
#[test]
fn a_packet_in_the_gate_of_a_slot_taken_again_is_counted_by_the_new_block() {
    let SlotTakenAgain {
        mut h,
        program,
        trio,
        mut sent,
        held,
    } = slot_taken_again_under(true, &["join_block", "leave_block"]);
    let out = held.release();
    assert_eq!(verdict_name(&program, &out), "stale_gen");
    sent.extend(h.run(&program, 1, &packet_of_gen(5, 2, 1)).created);
    assert_eq!(sums_by_gen(&sent), three_generations());
    only_generation_2_kept(&trio, &mut h, &program);
}

/// Generation 2's last source closes it and leaves while the held packet is still in its
/// gate (so no Result yet); then the held packet leaves, last, is dropped as stale, and
/// finishes nothing.
fn leave_after_the_last_source(h: &mut Harness, program: &Program, held: common::Held) {
    let last = h.run(program, 1, &packet_of_gen(5, 2, 1));
    assert_eq!(last.result, Ok(Verdict::Consume));
    assert_eq!(
        sums_by_gen(&last.created),
        [],
        "the held packet is in the gate"
    );
    let out = held.release();
    assert_eq!(verdict_name(program, &out), "stale_gen");
    assert_eq!(sums_by_gen(&out.created), [], "not its block to finish");
}

/// A packet still in the gate of a block that was being finished when it entered, when the
/// block's slot goes to a new block and that block's last source closes it and leaves,
/// leaves last; it must not finish the new block under its own block's key (which left
/// the new block's key active for ever, and freed its slot). The timer finishes it once it
/// ages.
#[test]
fn a_packet_in_a_finished_blocks_gate_does_not_finish_the_next_block_in_its_slot() {
    let SlotTakenAgain {
        mut h,
        program,
        trio,
        mut sent,
        held,
    } = slot_taken_again_under(true, &["join_block", "leave_block"]);
    leave_after_the_last_source(&mut h, &program, held);
    let scans = later_scans(&mut h, &program);
    sent.extend(scans);
    assert_eq!(sums_by_gen(&sent), three_generations());
    assert!(
        group_results(&sent).contains(&(5, 2, 2)),
        "generation 2's Result counts both sources"
    );
    only_generation_2_kept(&trio, &mut h, &program);
}

/// A packet that entered a new block's gate under its old block's tag, and is still there
/// when the new block's last source closes it and leaves, leaves last; it knows nothing of
/// the new block and does not finish it. The block's next packet through its gate does (a
/// retransmission, finding it closed): a whole Result to the group, and its answer.
#[test]
fn a_block_left_closed_by_a_packet_of_another_is_finished_by_its_next_packet() {
    let SlotTakenAgain {
        mut h,
        program,
        trio,
        mut sent,
        mut held,
    } = slot_taken_again_under(false, &["join_block", "leave_block"]);
    // Into generation 2's gate under generation 0's tag.
    assert!(held.step(), "the held packet goes on to its next label");
    leave_after_the_last_source(&mut h, &program, held);
    let again = h.run(&program, 0, &packet_of_gen(5, 2, 0));
    assert_eq!(verdict_name(&program, &again), "retransmit_answered");
    assert_eq!(
        group_results(&again.created),
        [(5, 2, 2)],
        "the retransmission finished generation 2, with both sources"
    );
    sent.extend(again.created);
    assert_eq!(sums_by_gen(&sent), three_generations());
    only_generation_2_kept(&trio, &mut h, &program);
}

/// The last one out of a closed block takes it (sets TAKEN, to finish it) after it left the
/// gate. Descheduled between the two, while another thread goes through the closed gate,
/// leaves last and finishes the block, its slot is freed (the next generation's Result
/// replaces this one) and a new block takes it: the late take finds the new block's tag and
/// must not finish that block. Before, it sent generation 2's partial sums (source 0's
/// alone) as a Result, and generation 2's own last source then finished nothing.
#[test]
fn a_last_leaver_held_before_its_take_does_not_finish_the_next_block_in_its_slot() {
    let (mem, trio, program) = install_with_slots(2);
    let mut h = Harness::new(mem.clone());
    let mut sent = h.run(&program, 0, &packet_of_gen(5, 0, 0)).created;
    let held = common::hold_before(&mem, &program, "take_block", (1, 0), packet_of_gen(5, 0, 1));
    // Source 0's retransmission finds the block closed and empty, leaves it last, and takes
    // and finishes it.
    let again = h.run(&program, 0, &packet_of_gen(5, 0, 0));
    assert_eq!(verdict_name(&program, &again), "retransmit_answered");
    sent.extend(again.created);
    sent.extend(from_both(&mut h, &program, |src| packet_of_gen(5, 1, src)));
    sent.extend(h.run(&program, 0, &packet_of_gen(5, 2, 0)).created);
    let out = held.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(sums_by_gen(&out.created), [], "not its block to finish");
    sent.extend(h.run(&program, 1, &packet_of_gen(5, 2, 1)).created);
    assert_eq!(
        sums_by_gen(&sent),
        [(0, vec![3; 4]), (1, vec![23; 4]), (2, vec![43; 4])]
    );
    assert!(
        group_results(&sent).contains(&(5, 2, 2)),
        "generation 2's Result counts both sources"
    );
    only_generation_2_kept(&trio, &mut h, &program);
}

/// A job without a block timeout (`NO_BLOCK_TIMEOUT`): its timers never give up on a block
/// a source is missing from, but they still finish a block every source made that nobody
/// finished (closed, idle a scan period), as they do a timed-out one. Here the last source
/// out is descheduled before its take: the scans leave the block alone while it is
/// referenced, then finish it, whole, and the late take finds it taken and sends nothing.
#[test]
fn without_a_block_timeout_the_timers_finish_a_closed_block_left_unfinished() {
    use pfemu::microcode::trio_ml::NO_BLOCK_TIMEOUT;

    let (mem, _trio, program) =
        install_job(2, TrioMlConfig::default().keep_result_ns, NO_BLOCK_TIMEOUT);
    let mut h = Harness::new(mem.clone());
    let mut sent = h.run(&program, 0, &packet_of_gen(5, 0, 0)).created;
    let held = common::hold_before(&mem, &program, "take_block", (1, 0), packet_of_gen(5, 0, 1));
    // Referenced by the packet at the first scan; idle (and closed) at the second.
    sent.extend(scan(&mut h, &program, MS));
    assert_eq!(sums_by_gen(&sent), [], "a referenced block is left alone");
    sent.extend(scan(&mut h, &program, 2 * MS));
    assert_eq!(
        group_results(&sent),
        [(5, 0, 2)],
        "the timer finished the closed block, with both sources"
    );
    assert_eq!(sums_by_gen(&sent), [(0, vec![3; 4])]);
    let out = held.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(sums_by_gen(&out.created), [], "the block was taken already");
    // A block a source is missing from stays open, scan after scan.
    sent.extend(h.run(&program, 0, &packet_of_gen(6, 0, 0)).created);
    for k in 3..40 {
        sent.extend(scan(&mut h, &program, k * MS));
    }
    assert_eq!(group_results(&sent), [(5, 0, 2)], "no partial Result");
    sent.extend(h.run(&program, 1, &packet_of_gen(6, 0, 1)).created);
    assert_eq!(group_results(&sent), [(5, 0, 2), (6, 0, 2)]);
}

/// [`a_last_leaver_held_before_its_take_does_not_finish_the_next_block_in_its_slot`] for
/// the timer: it closes an aged block and leaves it last, and is descheduled before its
/// take while a late packet goes through the closed gate and finishes the block.
#[test]
fn a_timer_held_before_its_take_does_not_finish_the_next_block_in_its_slot() {
    let (mem, trio, program) = install_with_slots(2);
    let mut h = Harness::new(mem.clone());
    let mut sent = h.run(&program, 0, &packet_of_gen(5, 0, 0)).created;
    sent.extend(scan(&mut h, &program, MS));
    let timer = common::hold_timer_before(&mem, &program, "take_aged", 2 * MS, launch(2 * MS));
    h.set_now(2 * MS);
    // Source 1's packet finds generation 0 closed, leaves it last, and finishes it without
    // its source (aged: a partial Result).
    sent.extend(h.run(&program, 1, &packet_of_gen(5, 0, 1)).created);
    assert_eq!(
        sums_by_gen(&sent),
        [(0, vec![1; 4])],
        "generation 0 aged out"
    );
    sent.extend(from_both(&mut h, &program, |src| packet_of_gen(5, 1, src)));
    sent.extend(h.run(&program, 0, &packet_of_gen(5, 2, 0)).created);
    let out = timer.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(sums_by_gen(&out.created), [], "not its block to finish");
    sent.extend(h.run(&program, 1, &packet_of_gen(5, 2, 1)).created);
    assert_eq!(sums_by_gen(&sent), three_generations());
    assert!(
        group_results(&sent).contains(&(5, 2, 2)),
        "generation 2's Result counts both sources"
    );
    only_generation_2_kept(&trio, &mut h, &program);
}

/// A kept Result sent again is copied out of its slot 256 bytes per instruction. If the
/// Result expires during the copy, its slot is taken again and the same block (a late
/// packet starts it anew) is finished and kept there again, the table's entry is the same
/// as before: the copy, half the old sums and half the new, must not be sent. Before the
/// slot's tag was checked, it was.
#[test]
fn a_kept_result_taken_again_while_it_is_copied_out_is_not_sent() {
    // Kept Results go at the second kept scan (every 16 ms) that finds them unasked.
    let (mem, trio, program) = install_keeping(2, 1);
    let mut h = Harness::new(mem.clone());
    let old = |src: u8| packet_with(5, 0, src, &[i32::from(src) + 1; 128]);
    let new = |src: u8| packet_with(5, 0, src, &[10 * (i32::from(src) + 1); 128]);
    let sent = from_both(&mut h, &program, old);
    assert_eq!(group_results(&sent), [(5, 0, 2)]);
    // Source 0 asks for the Result again; held after its first 64 sums are copied out.
    let mut held = common::hold_before_each(
        &mem,
        &program,
        &["result_tail", "result_tail"],
        (0, 0),
        old(0),
    );
    assert!(held.step(), "the held packet goes on to its next label");
    let expired = [16 * MS, 32 * MS]
        .into_iter()
        .flat_map(|now| scan(&mut h, &program, now))
        .count();
    assert_eq!((expired, trio.kept_records()), (0, 0), "the Result expired");
    // Block 5 again from late packets: the same key, the same slot (the other is free but
    // not its home), kept again.
    let again = from_both(&mut h, &program, new);
    assert_eq!(sums_by_gen(&again), [(0, vec![30; 128])]);
    let kept = trio.kept_result(1, 5).unwrap().expect("kept again");
    assert_eq!((kept.gen_id, kept.run_id), (0, 0));
    let out = held.release();
    assert_eq!(verdict_name(&program, &out), "result_expired");
    assert_eq!(out.created, [], "no Result of mixed sums");
}

/// A finisher held between keeping its Result and taking its block's key out of the active
/// table, while the next generation replaces the Result and a new block takes the slot,
/// leaves a stale entry behind for that time: a packet of the block that finds it drops
/// it (the slot's tag says it is stale) and is answered as for a finished block, rather
/// than looking it up again and again until its instruction budget runs out.
#[test]
fn a_stale_active_entry_is_dropped_by_the_packet_that_finds_it() {
    let StaleEntry {
        mut h,
        program,
        trio,
        mut sent,
        finisher,
    } = stale_entry_under(install_with_slots(2), Freed::ByGeneration1);
    assert_eq!(
        trio.active_records(),
        2,
        "block 6, and generation 0's stale entry"
    );
    let again = h.run(&program, 0, &packet_of_gen(5, 0, 0));
    assert_eq!(verdict_name(&program, &again), "stale_gen");
    assert_eq!(trio.active_records(), 1, "block 6 alone");
    let out = finisher.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    sent.extend(out.created);
    sent.extend(h.run(&program, 1, &packet(6, 0, 1)).created);
    let mut results = group_results(&sent);
    results.sort();
    assert_eq!(results, [(5, 0, 2), (5, 1, 2), (6, 0, 2)]);
    assert_eq!(trio.active_records(), 0);
}

/// A stale active entry (its finisher held before it removes it, while the slot is taken
/// again) names the record of the block now in the slot: the timer must age that block by
/// its own entry alone, and removes the stale one (which a finisher that faulted would
/// leave for ever). Before, each scan aged the block through both entries, and it aged
/// out early: a partial Result before its `block_exp`.
#[test]
fn a_stale_active_entry_does_not_age_the_block_in_its_slot() {
    let installed = install_job(2, TrioMlConfig::default().keep_result_ns, 3);
    let StaleEntry {
        mut h,
        program,
        trio,
        mut sent,
        finisher,
    } = stale_entry_under(installed, Freed::ByGeneration1);
    assert_eq!(
        trio.active_records(),
        2,
        "block 6, and generation 0's stale entry"
    );
    // Block 6 is referenced at the first scan, then idle for 1, 2 and 3 ms: it ages out at
    // the fourth. The first scan removes the stale entry.
    sent.extend(scan(&mut h, &program, MS));
    assert_eq!(trio.active_records(), 1, "the stale entry went");
    for now in [2 * MS, 3 * MS] {
        sent.extend(scan(&mut h, &program, now));
    }
    assert_eq!(
        group_results(&sent),
        [(5, 1, 2)],
        "block 6 has not aged out yet (generation 0's Result goes once its finisher goes on)"
    );
    sent.extend(scan(&mut h, &program, 4 * MS));
    assert_eq!(group_results(&sent), [(5, 1, 2), (6, 0, 1)]);
    let out = finisher.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(group_results(&out.created), [(5, 0, 2)]);
    assert_eq!(trio.active_records(), 0);
}

/// A retransmission found the kept Result, and was descheduled before its copy began; the
/// Result expired meanwhile, and a late packet started the block anew in the same slot. The
/// copy must not go out: the block there is not finished (it would send the new block's
/// partial sums, or a mix of them and its final ones, as the kept Result).
#[test]
fn a_kept_result_whose_slot_holds_a_block_being_filled_is_not_sent() {
    let (mem, trio, program) = install_keeping(2, 1);
    let mut h = Harness::new(mem.clone());
    let old = |src: u8| packet_with(5, 0, src, &[i32::from(src) + 1; 128]);
    let new = |src: u8| packet_with(5, 0, src, &[10 * (i32::from(src) + 1); 128]);
    from_both(&mut h, &program, old);
    let mut held = common::hold_before_each(
        &mem,
        &program,
        &["result_headers", "result_tail", "result_tail"],
        (0, 0),
        old(0),
    );
    for now in [16 * MS, 32 * MS] {
        scan(&mut h, &program, now);
    }
    assert_eq!(trio.kept_records(), 0, "the Result expired");
    let started = h.run(&program, 1, &new(1));
    assert_eq!(
        (started.result, started.created),
        (Ok(Verdict::Consume), vec![])
    );
    if held.step() {
        // Without the check, the copy goes on: its first chunk from the block started
        // anew, the rest once that block is finished and kept again.
        assert!(held.step(), "the held packet goes on to its next label");
        let finished = h.run(&program, 0, &new(0));
        assert_eq!(sums_by_gen(&finished.created), [(0, vec![30; 128])]);
    }
    let out = held.release();
    assert_eq!(verdict_name(&program, &out), "result_expired");
    assert_eq!(out.created, [], "no Result of a block being filled");
}

/// A finisher held between keeping its Result and taking its key out of the active table,
/// while the Result expires, another block takes its slot, and a late packet of its block
/// finds the entry stale, removes it and starts the block anew in another slot: the
/// finisher must then leave the new entry alone (it removed it, and the new block was lost
/// with its slot).
#[test]
fn a_finisher_leaves_the_entry_of_its_block_started_anew_alone() {
    // Block 6's generation 0 has block 5's home slot, free again once the Result expired.
    let StaleEntry {
        mut h,
        program,
        trio,
        mut sent,
        finisher,
    } = stale_entry_under(install_keeping(2, 1), Freed::ByExpiry);
    let late = h.run(&program, 0, &packet_of_gen(5, 0, 0));
    assert_eq!(late.result, Ok(Verdict::Consume), "block 5 started anew");
    assert_eq!(trio.active_records(), 2);
    let out = finisher.release();
    assert_eq!(out.result, Ok(Verdict::Consume));
    sent.extend(out.created);
    assert_eq!(trio.active_records(), 2, "block 5 anew, and block 6");
    sent.extend(h.run(&program, 1, &packet_of_gen(5, 0, 1)).created);
    sent.extend(h.run(&program, 1, &packet(6, 0, 1)).created);
    let mut results = group_results(&sent);
    results.sort();
    assert_eq!(results, [(5, 0, 2), (5, 0, 2), (6, 0, 2)]);
    assert_eq!(trio.active_records(), 0);
    assert_eq!(
        trio.job_state(1).unwrap().slots_in_use,
        2,
        "two Results kept"
    );
}

/// A packet that looked its job up before the job was removed, and is descheduled before
/// it claims its block, makes the block after the removal deleted the job's blocks. The
/// removal's sweep after a grace period (here: once the held packet has run to its end,
/// as no PPE thread still runs it) takes that block away, so the job added again does not
/// find it: source 0 alone must not finish block 5 with the removed job's source 1.
#[test]
fn a_block_made_after_its_jobs_removal_is_swept_before_the_job_comes_back() {
    let (mem, trio, program) = install();
    let held = hold_before_claim(&mem, &program, 1, packet(5, 0, 1));
    trio.remove_job(1).unwrap();
    let ticket = trio.grace_ticket();
    let out = held.release();
    assert_eq!(
        out.result,
        Ok(Verdict::Consume),
        "the late packet made its block"
    );
    assert_eq!(trio.active_records(), 1, "the late block is in the table");
    trio.release_retired(ticket).unwrap();
    assert_eq!(trio.active_records(), 0, "the sweep took the late block");

    trio.add_job(&JobConfig {
        job_id: 1,
        sources: vec![0, 1],
        block_exp_ms: 1,
        block_cnt_max: 4,
        out_dest: Dest::Group(1),
        ..JobConfig::default()
    })
    .unwrap();
    let mut h = Harness::new(mem.clone());
    let out = h.run(&program, 0, &packet(5, 0, 0));
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(
        group_results(&out.created),
        [],
        "source 0's packet joined the removed job's block"
    );
    assert_eq!(trio.job_state(1).unwrap().block_curr_cnt, 1);
}
