//! Trio-ML threads that fault: a packet or timer thread whose program faults (its
//! instruction budget run out, say) has its packet dropped, and the program's fault handler
//! gives back what the thread held, so no block is left unfinished and no slot taken for
//! ever. Faults are injected with a small instruction budget, or (to fault at one chosen
//! instruction boundary) with a panic in the harness's `before` hook, which the engine
//! catches as a fault right before that instruction would run.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;

use pfemu::microcode::trio_ml::wire::{self, AggPacket, TrioMlHdrFields};
use pfemu::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use pfemu::prelude::*;
use pfemu::program::{FaultKind, Harness, HarnessOutcome, DEFAULT_INSTRUCTION_BUDGET};

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const MS: u64 = 1_000_000;
/// Gradients of the tests' big blocks: a packet adds them over several instructions.
const BIG: usize = 4095;

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

/// Source `src`'s gradients in a block of `n`.
fn grads(src: u8, n: usize) -> Vec<i32> {
    (0..n as i32)
        .map(|i| i * 3 + i32::from(src) * 1000)
        .collect()
}

use common::{trio_ml_scan as scan, trio_ml_scan_observed as scan_observed};

/// The Results sent to the job's group: header and sums.
fn group_results(created: &[(Dest, Vec<u8>)]) -> Vec<(TrioMlHdrFields, Vec<i32>)> {
    created
        .iter()
        .filter(|(d, _)| *d == Dest::Group(1))
        .map(|(_, f)| {
            let (h, g) = wire::parse(f).unwrap();
            (h, wire::gradients(g))
        })
        .collect()
}

/// An aggregator of job 1 (sources 0 and 1, blocks of up to [`BIG`] gradients aging out
/// after 1 ms, 4 slots, Results to group 1, kept Results dropped after 16 ms without a
/// request), one timer owning the whole table.
fn install() -> (Arc<SharedMemory>, TrioMl, Program) {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            local_addr: LOCAL,
            scan_period_ns: MS,
            timers: 1,
            hash_shards: 16,
            keep_result_ns: 16 * MS,
            ..TrioMlConfig::default()
        },
    )
    .unwrap();
    trio.add_job(&JobConfig {
        job_id: 1,
        sources: vec![0, 1],
        block_exp_ms: 1,
        block_cnt_max: 4,
        block_grad_max: BIG as u16,
        out_dest: Dest::Group(1),
        ..JobConfig::default()
    })
    .unwrap();
    let program = trio.program();
    (mem, trio, program)
}

/// Runs `frame` from `port`, recording the labels it runs (its fault handler's included).
fn run_labelled(
    h: &mut Harness,
    program: &Program,
    port: Port,
    frame: &[u8],
) -> (HarnessOutcome, Vec<String>) {
    let mut labels = Vec::new();
    let out = h.run_observed(program, port, frame, |l| labels.push(l.to_string()));
    (out, labels)
}

/// The message of the panics that inject faults; they are not printed.
const INJECTED: &str = "injected fault";

/// Keeps the panics that inject faults quiet (others are reported as usual).
fn quiet_injected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| info.payload().downcast_ref::<&str>().copied());
            if !msg.is_some_and(|m| m.starts_with(INJECTED)) {
                report(info);
            }
        }));
    });
}

/// A `before` hook that faults right before the first instruction labelled `at` would run
/// (a panic, which the engine takes as a fault of the program, as it takes a budget run
/// out at that instruction); `fired` says whether it did.
fn fault_before<'a>(at: &'a str, fired: &'a mut bool) -> impl FnMut(&str) + 'a {
    fault_before_nth(at, 1, fired)
}

/// [`fault_before`] the `nth` instruction labelled `at` (counting from 1).
fn fault_before_nth<'a>(at: &'a str, nth: usize, fired: &'a mut bool) -> impl FnMut(&str) + 'a {
    quiet_injected_panics();
    let mut seen = 0;
    move |l| {
        if !*fired && l == at {
            seen += 1;
            if seen == nth {
                *fired = true;
                panic!("{INJECTED} before {at} #{nth}");
            }
        }
    }
}

/// Runs `frame` from `port` and makes it fault right before the first instruction
/// labelled `at` would run ([`fault_before`]).
fn run_faulting_before(
    h: &mut Harness,
    program: &Program,
    port: Port,
    frame: &[u8],
    at: &str,
) -> HarnessOutcome {
    let mut fired = false;
    let out = h.run_observed(program, port, frame, fault_before(at, &mut fired));
    assert!(fired, "the packet never reached {at}");
    assert_fault(&out, FaultKind::Panic);
    out
}

/// Runs the scan period at `now` (one timer owning the whole table) and makes its thread
/// fault right before the `nth` instruction labelled `at` would run ([`fault_before_nth`]).
fn run_timer_faulting_before(
    h: &mut Harness,
    program: &Program,
    now: u64,
    at: &str,
    nth: usize,
) -> HarnessOutcome {
    let mut fired = false;
    let out = scan_observed(h, program, now, fault_before_nth(at, nth, &mut fired));
    assert!(fired, "the timer never reached {at} #{nth}");
    assert_fault(&out, FaultKind::Panic);
    out
}

/// The thread faulted with `kind`, and its fault handler ran to its end.
fn assert_fault(out: &HarnessOutcome, kind: FaultKind) {
    match &out.result {
        Err(f) => assert_eq!(f.kind(), kind, "{f}"),
        other => panic!("the thread did not fault: {other:?}"),
    }
    assert_eq!(out.fault_handler, Some(Ok(())), "the fault handler ran");
}

/// Scans every 16 ms (each a kept scan) from `from` until the job holds no slot; panics
/// if it still holds one after `scans` of them.
fn scans_until_slots_free(
    trio: &TrioMl,
    h: &mut Harness,
    program: &Program,
    from: u64,
    scans: u64,
) -> Vec<(Dest, Vec<u8>)> {
    let mut sent = Vec::new();
    for k in 0..scans {
        if trio.job_state(1).unwrap().block_curr_cnt == 0 {
            return sent;
        }
        sent.extend(scan(h, program, from + k * 16 * MS));
    }
    let state = trio.job_state(1).unwrap();
    assert_eq!(
        (state.block_curr_cnt, state.slots_in_use),
        (0, 0),
        "every slot freed after {scans} kept scans"
    );
    sent
}

/// A packet that runs out of instructions while it adds its gradients (in the block's
/// gate, its source marked received, not counted) leaves the gate in the fault handler:
/// the block ages out as any block missing a source does, with a partial Result, and its
/// slot is freed once the Result expires. Without the handler the gate's count stayed
/// above zero, so neither a last leaver nor the timer ever finished the block.
#[test]
fn a_packet_out_of_budget_in_the_gate_leaves_it_and_its_block_ages_out() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    let out = h.run(&program, 0, &packet_with(3, 0, 0, &grads(0, BIG)));
    assert_eq!(out.result, Ok(Verdict::Consume));

    // Source 1's packet: parse, lookup_block, check_source, join_block, aggregate_head and
    // one aggregate_tail of its four, then out of instructions.
    h.set_budget(6);
    let (out, labels) = run_labelled(&mut h, &program, 1, &packet_with(3, 0, 1, &grads(1, BIG)));
    assert_fault(&out, FaultKind::InstructionBudget);
    let before_fault: Vec<&str> = labels[..6].iter().map(String::as_str).collect();
    assert_eq!(
        before_fault,
        [
            "parse",
            "lookup_block",
            "check_source",
            "join_block",
            "aggregate_head",
            "aggregate_tail"
        ],
        "faulted in the gate, adding"
    );
    assert!(out.created.is_empty());
    h.set_budget(DEFAULT_INSTRUCTION_BUDGET);
    let block = &trio.active_blocks().unwrap()[0];
    assert_eq!(
        (block.rcvd_cnt, block.received.as_slice()),
        (1, &[0u8, 1][..])
    );

    // Referenced at the first scan, idle for 1 ms at the second: a partial Result of
    // source 0 alone.
    let mut sent = scan(&mut h, &program, MS);
    sent.extend(scan(&mut h, &program, 2 * MS));
    let results = group_results(&sent);
    assert_eq!(results.len(), 1, "the block aged out");
    let (hdr, _) = &results[0];
    assert_eq!(
        (
            hdr.block_id,
            hdr.gen_id,
            hdr.src_cnt,
            hdr.age_op,
            hdr.degraded
        ),
        (3, 0, 1, 1, true)
    );
    assert!(trio.active_blocks().unwrap().is_empty());
    assert_eq!(trio.active_records(), 0);
    assert_eq!(
        trio.job_state(1).unwrap().block_curr_cnt,
        1,
        "its Result kept"
    );

    // Nobody asks for it: the Result expires, and with it the slot.
    scans_until_slots_free(&trio, &mut h, &program, 16 * MS, 4);
    assert_eq!(trio.kept_records(), 0);
}

/// A packet that runs out of instructions while it creates its block (its key PENDING in
/// the active table, a slot claimed, its gradients half written, the record not
/// published) gives all of it back: nobody else could have joined the block. The block's
/// packets then create it anew, and its Result is whole and exact. Without the handler the
/// PENDING key stayed for ever, and every packet of the block waited on it until it ran out
/// of instructions in turn.
#[test]
fn a_packet_out_of_budget_while_it_creates_its_block_gives_the_block_back() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    // parse, lookup_block, lookup_result, create_block, claim_slot, aggregate_head, and
    // one aggregate_tail: out of instructions with its gradients half written.
    h.set_budget(7);
    let (out, labels) = run_labelled(&mut h, &program, 0, &packet_with(3, 0, 0, &grads(0, BIG)));
    assert_fault(&out, FaultKind::InstructionBudget);
    assert_eq!(labels[4], "claim_slot");
    assert_eq!(labels[6], "aggregate_tail");
    assert_eq!(trio.active_records(), 0, "the PENDING key went");
    let state = trio.job_state(1).unwrap();
    assert_eq!((state.block_curr_cnt, state.slots_in_use), (0, 0));
    assert_eq!(state.block_total_cnt, 0, "no block was made");

    // Enough instructions for a source to wait some time on a PENDING key, not forever.
    h.set_budget(500);
    let out = h.run(&program, 1, &packet_with(3, 0, 1, &grads(1, BIG)));
    assert_eq!(
        out.result,
        Ok(Verdict::Consume),
        "source 1 creates the block"
    );
    let out = h.run(&program, 0, &packet_with(3, 0, 0, &grads(0, BIG)));
    assert_eq!(out.result, Ok(Verdict::Consume));
    let results = group_results(&out.created);
    assert_eq!(results.len(), 1, "source 0's retransmission completes it");
    let (hdr, sums) = &results[0];
    assert_eq!((hdr.src_cnt, hdr.degraded), (2, false));
    let want: Vec<i32> = grads(0, BIG)
        .iter()
        .zip(grads(1, BIG))
        .map(|(a, b)| a + b)
        .collect();
    assert!(*sums == want, "the sums are exact");
    let state = trio.job_state(1).unwrap();
    assert_eq!((state.block_curr_cnt, state.block_total_cnt), (1, 1));
}

/// The last source out of a closed block owes it its take: one that faults before the
/// take takes and finishes the block in its handler, and the Result goes out at once
/// (whole: both sources are in). Without the handler the block waited closed, untaken,
/// until it aged out and a timer took it.
#[test]
fn a_last_leaver_that_faults_before_its_take_finishes_the_block_in_its_handler() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    h.run(&program, 0, &packet_with(2, 0, 0, &[1, 2, 3]));
    let out = run_faulting_before(
        &mut h,
        &program,
        1,
        &packet_with(2, 0, 1, &[10, 20, 30]),
        "take_block",
    );
    let results = group_results(&out.created);
    assert_eq!(results.len(), 1, "the handler sent the Result");
    let (hdr, sums) = &results[0];
    assert_eq!((hdr.src_cnt, hdr.degraded, hdr.age_op), (2, false, 0));
    assert_eq!(*sums, [11, 22, 33]);
    assert_eq!(trio.active_records(), 0);
    assert_eq!(trio.kept_records(), 1);
}

/// A finisher that faults while it builds the Result (nothing of the finish committed)
/// finishes the block again from the start in its handler; one that faults after its
/// Result was kept (and the slot of the Result it replaced freed) goes on from there,
/// freeing no slot twice. Either way one whole Result goes out, once. Without the handler
/// the block stayed TAKEN and unfinished for ever: no Result, its key and slot taken.
#[test]
fn a_finisher_that_faults_finishes_the_block_in_its_handler() {
    for at in [
        "finish_start",
        "result_tail",
        "keep_result",
        "release_block",
        "free_replaced",
        "emit_result",
    ] {
        let (mem, trio, program) = install();
        let mut h = Harness::new(mem.clone());
        // Generation 0 finishes and is kept; generation 1 replaces it.
        for src in [0u8, 1] {
            h.run(
                &program,
                src.into(),
                &packet_with(2, 0, src, &grads(src, 300)),
            );
        }
        assert_eq!(trio.job_state(1).unwrap().block_curr_cnt, 1, "{at}");
        h.run(&program, 0, &packet_with(2, 1, 0, &grads(0, 300)));
        let out = run_faulting_before(
            &mut h,
            &program,
            1,
            &packet_with(2, 1, 1, &grads(1, 300)),
            at,
        );
        let results = group_results(&out.created);
        assert_eq!(results.len(), 1, "fault before {at}: one Result");
        let (hdr, sums) = &results[0];
        assert_eq!(
            (hdr.gen_id, hdr.src_cnt, hdr.degraded),
            (1, 2, false),
            "{at}"
        );
        let want: Vec<i32> = (0..300).map(|i| 6 * i + 1000).collect();
        assert!(*sums == want, "fault before {at}: the sums are exact");
        let state = trio.job_state(1).unwrap();
        assert_eq!(
            (state.block_curr_cnt, state.slots_in_use),
            (1, 1),
            "fault before {at}: generation 1 kept, generation 0's slot freed once"
        );
        assert_eq!(trio.active_records(), 0, "{at}");
        let kept = trio.kept_result(1, 2).unwrap().expect("a kept Result");
        assert_eq!(kept.gen_id, 1, "{at}");
    }
}

/// A finisher that faults after it sent its Result (its instruction budget runs out right
/// after `emit_result`, on its way to `consume`) does not lose the Result: the program has
/// the engine keep it once sent (`Thread::keep_created`), so it leaves, once, though the
/// packet is dropped as a fault; the handler, which finds nothing held, sends no other.
/// Without the keep, the engine discarded it with the thread's work and the group never
/// had it (its sources could ask for this one again; one not kept would be gone).
#[test]
fn a_finisher_that_faults_after_its_send_still_sends_its_result() {
    // Where source 1's packet, which completes and finishes the block, runs: its budget
    // is to run out right after emit_result.
    let budget = {
        let (mem, _trio, program) = install();
        let mut h = Harness::new(mem);
        h.run(&program, 0, &packet_with(2, 0, 0, &[1, 2, 3]));
        let (out, labels) = run_labelled(&mut h, &program, 1, &packet_with(2, 0, 1, &[10, 20, 30]));
        assert_eq!(out.result, Ok(Verdict::Consume));
        let n = labels.len();
        assert_eq!(labels[n - 2..], ["emit_result", "consume"]);
        n - 1
    };

    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    h.run(&program, 0, &packet_with(2, 0, 0, &[1, 2, 3]));
    h.set_budget(budget as u32);
    let (out, labels) = run_labelled(&mut h, &program, 1, &packet_with(2, 0, 1, &[10, 20, 30]));
    assert_fault(&out, FaultKind::InstructionBudget);
    assert_eq!(
        labels[budget - 1..],
        ["emit_result", "on_fault", "fault_done"],
        "out of instructions after the send, nothing held"
    );
    assert_eq!(out.created.len(), 1, "the Result, and nothing else");
    let results = group_results(&out.created);
    assert_eq!(results.len(), 1, "the Result sent before the fault left");
    let (hdr, sums) = &results[0];
    assert_eq!((hdr.src_cnt, hdr.degraded, hdr.age_op), (2, false, 0));
    assert_eq!(*sums, [11, 22, 33]);
    assert_eq!(trio.active_records(), 0);
    assert_eq!(trio.kept_result(1, 2).unwrap().expect("kept").gen_id, 0);
}

/// A timer thread that finished an aged block and faults later (while it finishes the
/// next aged block, or after its last, before it scans the kept Results) sends every
/// partial Result all the same, each once: those it sent before the fault, which the
/// program had the engine keep (`Thread::keep_created`), and the one its handler
/// finishes. Without the keep, the Results sent before the fault were discarded with the
/// thread's work.
#[test]
fn a_timer_that_faults_after_finishing_aged_blocks_still_sends_their_results() {
    // Where the timer faults (before the nth instruction labelled so), and how many
    // Results it sent before.
    for (at, nth, sent_before) in [("result_headers", 2, 1), ("scan_kept", 1, 2)] {
        let (mem, trio, program) = install();
        let mut h = Harness::new(mem.clone());
        h.run(&program, 0, &packet_with(4, 0, 0, &[5, 6, 7]));
        h.run(&program, 0, &packet_with(5, 0, 0, &[8, 9]));
        assert!(scan(&mut h, &program, MS).is_empty());
        let mut labels = Vec::new();
        let mut fired = false;
        let out = {
            let mut fault = fault_before_nth(at, nth, &mut fired);
            scan_observed(&mut h, &program, 2 * MS, |l| {
                labels.push(l.to_string());
                fault(l);
            })
        };
        assert!(fired, "the timer never reached {at} #{nth}");
        assert_fault(&out, FaultKind::Panic);
        let fault_at = labels.iter().position(|l| l == "on_fault").unwrap();
        let sends = labels[..fault_at]
            .iter()
            .filter(|l| *l == "emit_result")
            .count();
        assert_eq!(sends, sent_before, "fault before {at} #{nth}");
        let mut results: Vec<_> = group_results(&out.created)
            .into_iter()
            .map(|(h, sums)| (h.block_id, h.src_cnt, h.degraded, h.age_op, sums))
            .collect();
        results.sort();
        assert_eq!(
            results,
            [(4, 1, true, 1, vec![5, 6, 7]), (5, 1, true, 1, vec![8, 9])],
            "fault before {at} #{nth}: both partial Results, once each"
        );
        assert_eq!(out.created.len(), 2, "fault before {at} #{nth}");
        assert_eq!(trio.active_records(), 0, "fault before {at} #{nth}");
        assert_eq!(trio.kept_records(), 2, "fault before {at} #{nth}");
    }
}

/// A timer thread that closed an aged block and left it last owes the block its take: one
/// that faults before the take (`take_aged`) takes and finishes the block in its handler,
/// and the partial Result goes out at once, from that thread. Without the handler's take
/// the block waited closed and untaken until the next scan's timer took it, a scan period
/// later.
#[test]
fn a_timer_that_faults_before_its_take_finishes_the_block_in_its_handler() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    h.run(&program, 0, &packet_with(4, 0, 0, &[5, 6, 7]));
    scan(&mut h, &program, MS);
    let out = run_timer_faulting_before(&mut h, &program, 2 * MS, "take_aged", 1);
    let results = group_results(&out.created);
    assert_eq!(
        results.len(),
        1,
        "the handler took the block and sent its Result"
    );
    let (hdr, sums) = &results[0];
    assert_eq!((hdr.src_cnt, hdr.degraded, hdr.age_op), (1, true, 1));
    assert_eq!(*sums, [5, 6, 7]);
    assert_eq!(trio.active_records(), 0);
    assert_eq!(trio.kept_records(), 1);
    assert!(
        group_results(&scan(&mut h, &program, 3 * MS)).is_empty(),
        "sent once"
    );
}

/// A timer thread that faults while it finishes an aged block finishes it in its handler:
/// the partial Result goes out. Without the handler the block stayed TAKEN, so later scans
/// left it alone for ever.
#[test]
fn a_timer_that_faults_while_it_finishes_an_aged_block_finishes_it_in_its_handler() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    h.run(&program, 0, &packet_with(4, 0, 0, &[5, 6, 7]));
    scan(&mut h, &program, MS);
    let out = run_timer_faulting_before(&mut h, &program, 2 * MS, "result_headers", 1);
    let results = group_results(&out.created);
    assert_eq!(results.len(), 1, "the handler sent the partial Result");
    let (hdr, sums) = &results[0];
    assert_eq!((hdr.src_cnt, hdr.degraded, hdr.age_op), (1, true, 1));
    assert_eq!(*sums, [5, 6, 7]);
    assert_eq!(trio.active_records(), 0);
    scans_until_slots_free(&trio, &mut h, &program, 16 * MS, 4);
}

/// In the engine, with an instruction budget too small for the job's big blocks: the
/// creator of a block runs out of instructions before it leaves the block's gate (its
/// handler leaves it), and the second source, which completes and takes the block, runs
/// out while it finishes (its handler finishes it). The Result goes out through the
/// engine, which counts the packets as faults and the handlers it ran. Without the
/// handlers the creator's place in the gate was never given back: no Result, ever.
#[test]
fn in_the_engine_threads_out_of_budget_finish_their_blocks_in_their_handlers() {
    // Where each packet's instructions go, on an aggregator of its own.
    let (budget, joiner_labels) = {
        let (mem, _trio, program) = install();
        let mut h = Harness::new(mem);
        let (_, creator) = run_labelled(&mut h, &program, 0, &packet_with(3, 0, 0, &grads(0, BIG)));
        let (_, joiner) = run_labelled(&mut h, &program, 1, &packet_with(3, 0, 1, &grads(1, BIG)));
        let leave = creator.iter().position(|l| l == "leave_block").unwrap();
        (leave as u32, joiner)
    };
    // The joiner leaves and takes within the budget, and runs out in the finish.
    let take = joiner_labels
        .iter()
        .position(|l| l == "take_block")
        .unwrap();
    assert!(take < budget as usize && joiner_labels.len() > budget as usize);

    let (mem, trio, program) = install();
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(program)
        .ppe_threads(1)
        .memory(mem)
        .instruction_budget(budget)
        .max_frame_bytes(u16::MAX.into())
        .multicast_group(1, vec![0, 1])
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.inject_frame(0, &packet_with(3, 0, 0, &grads(0, BIG)))
        .unwrap();
    pfe.drain();
    pfe.inject_frame(1, &packet_with(3, 0, 1, &grads(1, BIG)))
        .unwrap();
    pfe.drain();
    let out: Vec<Packet> = rx.try_iter().collect();
    assert_eq!(out.len(), 2, "the Result, to both ports of the group");
    let (hdr, g) = wire::parse(&out[0].data).unwrap();
    assert_eq!((hdr.src_cnt, hdr.degraded), (2, false));
    let want: Vec<i32> = grads(0, BIG)
        .iter()
        .zip(grads(1, BIG))
        .map(|(a, b)| a + b)
        .collect();
    assert!(wire::gradients(g) == want, "the sums are exact");
    assert_eq!(trio.active_records(), 0);
    assert_eq!(trio.job_state(1).unwrap().block_curr_cnt, 1, "kept");
    let stats = pfe.shutdown();
    assert_eq!(stats.faults_of(FaultKind::InstructionBudget), 2);
    assert_eq!(stats.drops("fault_instruction_budget"), 2);
    assert_eq!((stats.fault_handlers, stats.fault_handler_faults), (2, 0));
    assert!(stats.is_conserved());
}

/// A timer that deleted expired Results from the kept table and faults before it freed
/// their slots frees them in its handler (it listed them: nobody else would), from the
/// first slot it had not freed yet: before the first `free_expired` both, before the second
/// the one left, before the third (both freed, the thread about to end) none, so no slot is
/// freed twice. Without the handler the slots left stayed taken for ever, though no block
/// or Result held them.
#[test]
fn a_timer_that_faults_before_it_frees_expired_results_frees_them_in_its_handler() {
    for nth in 1..=3 {
        let (mem, trio, program) = install();
        let mut h = Harness::new(mem.clone());
        for block in [1u32, 2] {
            for src in [0u8, 1] {
                h.run(&program, src.into(), &packet_with(block, 0, src, &[1, 2]));
            }
        }
        assert_eq!(trio.kept_records(), 2);
        assert_eq!(trio.job_state(1).unwrap().block_curr_cnt, 2);
        // Kept scans every 16 ms: the first finds the Results asked for (kept just now),
        // the second finds them unasked and expires them.
        scan(&mut h, &program, 16 * MS);
        assert_eq!(trio.kept_records(), 2);
        let out = run_timer_faulting_before(&mut h, &program, 32 * MS, "free_expired", nth);
        assert!(out.created.is_empty());
        assert_eq!(trio.kept_records(), 0, "the Results expired");
        let state = trio.job_state(1).unwrap();
        assert_eq!(
            (state.block_curr_cnt, state.slots_in_use),
            (0, 0),
            "fault before free_expired #{nth}: both slots freed, once"
        );
        // The block ids start afresh, each in a slot of its own.
        for block in [1u32, 2] {
            h.run(&program, 0, &packet_with(block, 0, 0, &[1, 2]));
        }
        let state = trio.job_state(1).unwrap();
        assert_eq!(
            (state.block_curr_cnt, state.slots_in_use),
            (2, 2),
            "fault before free_expired #{nth}"
        );
    }
}

/// A block whose only packet faulted after publishing it, before it counted itself (its
/// handler left the gate), counts no source when it ages out: it is freed without a
/// Result (one counting nobody, its sums what the faulted adds left, would look like a
/// server's packet to an aggregator above), and the sources' packets then make it anew,
/// with an exact Result.
#[test]
fn a_block_every_packet_of_which_faulted_is_freed_without_a_result() {
    let (mem, trio, program) = install();
    let mut h = Harness::new(mem.clone());
    run_faulting_before(
        &mut h,
        &program,
        0,
        &packet_with(3, 0, 0, &[1, 2, 3]),
        "complete_check",
    );
    let block = &trio.active_blocks().unwrap()[0];
    assert_eq!(block.rcvd_cnt, 0, "published, nobody counted");

    // Referenced at the first scan, idle for 1 ms at the second: it ages out, silently.
    let mut sent = scan(&mut h, &program, MS);
    sent.extend(scan(&mut h, &program, 2 * MS));
    assert!(
        group_results(&sent).is_empty(),
        "a Result counting nobody was sent: {:?}",
        group_results(&sent)
    );
    assert!(trio.active_blocks().unwrap().is_empty());
    let state = trio.job_state(1).unwrap();
    assert_eq!((state.block_curr_cnt, state.slots_in_use), (0, 0));
    assert_eq!(trio.kept_records(), 0);

    // Both sources send again: a new block, whole and exact.
    h.run(&program, 0, &packet_with(3, 0, 0, &[1, 2, 3]));
    let out = h.run(&program, 1, &packet_with(3, 0, 1, &[10, 20, 30]));
    let results = group_results(&out.created);
    assert_eq!(results.len(), 1);
    let (hdr, sums) = &results[0];
    assert_eq!((hdr.src_cnt, hdr.degraded), (2, false));
    assert_eq!(*sums, [11, 22, 33]);
}
