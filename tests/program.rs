//! The program model through the engine: goto, call/return, the depth limit, the
//! instruction budget, and every fault kind dropping its packet while the engine goes on.

mod common;

use std::sync::Arc;

use pfemu::mem::DRAM_BASE;
use pfemu::prelude::*;
use pfemu::program::ProgramError;

use common::udp_frame;

/// Runs `program` on `frames` with `threads` PPE threads; returns the final stats and the
/// frames that left.
fn run(program: Program, frames: &[Vec<u8>], threads: usize) -> (Stats, Vec<Packet>) {
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(program)
        .ppe_threads(threads)
        .mem_config(MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 16,
            acc_bytes: 0,
            banks: 4,
        })
        .instruction_budget(1_000)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.inject_burst(frames.iter().map(|f| (3, &f[..])))
        .unwrap();
    pfe.drain();
    let stats = pfe.shutdown();
    assert!(stats.is_conserved(), "{stats:?}");
    (stats, rx.try_iter().collect())
}

fn frames(n: u32) -> Vec<Vec<u8>> {
    (0..n).map(|i| udp_frame(i as u16, i, 64)).collect()
}

#[test]
fn goto_chain_counts_every_instruction() {
    let mut p = Program::builder("chain");
    let [a, b, c] = p.labels(["a", "b", "c"]);
    p.instr(a, move |t| {
        t.r[IR0] = 1;
        Ok(Goto(b))
    });
    p.instr(b, move |t| {
        t.r[IR0] += 1;
        Ok(Goto(c))
    });
    p.instr(c, move |t| Ok(Done(Verdict::Forward(t.r[IR0] as u16))));
    p.entry(Entry::Packet, a);
    let (stats, out) = run(p.build().unwrap(), &frames(10), 2);
    assert_eq!(out.len(), 10);
    assert!(out.iter().all(|p| p.port == 2));
    assert_eq!(stats.instructions, 30);
    assert_eq!(stats.instructions_per_packet(), 3.0);
}

#[test]
fn call_and_return_nest_and_unwind_in_order() {
    // main calls sub1, which calls sub2; each appends a digit to ir0 on the way.
    let mut p = Program::builder("calls");
    let [main, sub1, sub2, after1, after2, fin] =
        p.labels(["main", "sub1", "sub2", "after1", "after2", "fin"]);
    p.instr(main, move |t| {
        t.r[IR0] = 1;
        Ok(Call(sub1, fin))
    });
    p.instr(sub1, move |t| {
        t.r[IR0] = t.r[IR0] * 10 + 2;
        Ok(Call(sub2, after1))
    });
    p.instr(sub2, move |t| {
        t.r[IR0] = t.r[IR0] * 10 + 3;
        Ok(Goto(after2))
    });
    p.instr(after2, move |_t| Ok(Return));
    p.instr(after1, move |t| {
        t.r[IR0] = t.r[IR0] * 10 + 4;
        Ok(Return)
    });
    p.instr(fin, move |t| {
        // 1 -> 12 -> 123 -> 1234: the calls returned in order.
        Ok(Done(if t.r[IR0] == 1234 {
            Verdict::Forward(0)
        } else {
            Verdict::Forward(1)
        }))
    });
    p.entry(Entry::Packet, main);
    let (stats, out) = run(p.build().unwrap(), &frames(5), 2);
    assert_eq!(out.iter().filter(|p| p.port == 0).count(), 5);
    assert_eq!(stats.instructions, 5 * 6);
}

/// A program that recurses `depth` levels and then finishes.
fn recursion(depth: u64) -> Program {
    let mut p = Program::builder("recurse");
    let [start, rec, fin] = p.labels(["start", "rec", "fin"]);
    p.instr(start, move |t| {
        t.r[IR1] = depth;
        Ok(Goto(rec))
    });
    p.instr(rec, move |t| {
        if t.r[IR1] == 0 {
            return Ok(Done(Verdict::Forward(0)));
        }
        t.r[IR1] -= 1;
        Ok(Call(rec, fin))
    });
    p.instr(fin, |_t| Ok(Return));
    p.entry(Entry::Packet, start);
    p.build().unwrap()
}

#[test]
fn call_depth_of_eight_is_allowed_and_nine_faults() {
    let (stats, out) = run(recursion(8), &frames(4), 2);
    assert_eq!(out.len(), 4);
    assert_eq!(stats.faults_of(FaultKind::CallDepth), 0);

    let (stats, out) = run(recursion(9), &frames(4), 2);
    assert!(out.is_empty());
    assert_eq!(stats.faults_of(FaultKind::CallDepth), 4);
    assert_eq!(stats.drops("fault_call_depth"), 4);
}

#[test]
fn return_without_call_faults() {
    let mut p = Program::builder("ret");
    let a = p.label("a");
    p.instr(a, |_t| Ok(Return));
    p.entry(Entry::Packet, a);
    let (stats, out) = run(p.build().unwrap(), &frames(3), 1);
    assert!(out.is_empty());
    assert_eq!(stats.faults_of(FaultKind::ReturnWithoutCall), 3);
}

#[test]
fn runaway_loop_is_stopped_by_the_budget_and_the_next_packet_runs() {
    // Packets with an even flow loop forever; odd ones forward.
    let mut p = Program::builder("loop");
    let [a, spin] = p.labels(["a", "spin"]);
    p.instr(a, move |t| {
        let flow = t.head(34)?[1];
        Ok(if flow % 2 == 0 {
            Goto(spin)
        } else {
            Done(Verdict::Forward(0))
        })
    });
    p.instr(spin, move |_t| Ok(Goto(spin)));
    p.entry(Entry::Packet, a);
    let (stats, out) = run(p.build().unwrap(), &frames(10), 2);
    assert_eq!(out.len(), 5);
    assert_eq!(stats.faults_of(FaultKind::InstructionBudget), 5);
    // The budget (1000) bounds each looping packet exactly.
    assert_eq!(stats.instructions, 5 * 1_000 + 5);
}

#[test]
fn every_fault_kind_drops_only_its_packet() {
    // The packet's flow number selects a fault; flow 0 forwards.
    let mut p = Program::builder("faults");
    let a = p.label("a");
    p.instr(a, move |t| {
        let which = t.head(34)?[1] % 6;
        match which {
            0 => Ok(Done(Verdict::Forward(0))),
            1 => {
                t.lm_bytes(1270, 64)?;
                unreachable!()
            }
            2 => {
                t.read_u64(DRAM_BASE + (1 << 20))?;
                unreachable!()
            }
            3 => panic!("a bug in an instruction"),
            4 => {
                t.read_tail(0, 0, 8)?; // a 64-byte frame has no tail
                unreachable!()
            }
            _ => {
                t.head(1_000)?;
                unreachable!()
            }
        }
    });
    p.entry(Entry::Packet, a);
    let (stats, out) = run(p.build().unwrap(), &frames(60), 4);
    assert_eq!(out.len(), 10);
    assert_eq!(stats.faults_of(FaultKind::LocalMemory), 20);
    assert_eq!(stats.faults_of(FaultKind::SharedMemory), 10);
    assert_eq!(stats.faults_of(FaultKind::Panic), 10);
    assert_eq!(stats.faults_of(FaultKind::Tail), 10);
    assert_eq!(stats.drops("fault_panic"), 10);
    assert_eq!(stats.dropped, 50);
}

#[test]
fn truncated_header_is_a_counted_fault() {
    use pfemu::wire::Ipv4;
    let mut p = Program::builder("parse");
    let a = p.label("a");
    p.instr(a, |t| {
        let ip = Ipv4::new_checked(t.head(14)?)?;
        Ok(Done(Verdict::Forward(ip.ttl() as u16 % 4)))
    });
    p.entry(Entry::Packet, a);
    // 20 bytes: an Ethernet header and 6 bytes of IPv4.
    let short = vec![vec![0u8; 20]];
    let (stats, out) = run(p.build().unwrap(), &short, 1);
    assert!(out.is_empty());
    assert_eq!(stats.faults_of(FaultKind::Header), 1);
}

#[test]
fn building_refuses_undefined_and_duplicate_labels_and_missing_entry() {
    let mut p = Program::builder("bad");
    let [a, b] = p.labels(["a", "b"]);
    p.instr(a, move |_t| Ok(Goto(b)));
    p.entry(Entry::Packet, a);
    assert_eq!(
        p.build().unwrap_err().to_string(),
        "label `b` is used but no instruction defines it"
    );

    let mut p = Program::builder("dup");
    let a = p.label("a");
    p.instr(a, |_t| Ok(Return));
    p.instr(a, |_t| Ok(Return));
    p.entry(Entry::Packet, a);
    assert!(matches!(p.build(), Err(ProgramError::DuplicateLabel(l)) if l == "a"));

    let mut p = Program::builder("noentry");
    let a = p.label("a");
    p.instr(a, |_t| Ok(Return));
    assert!(matches!(p.build(), Err(ProgramError::NoPacketEntry)));
}

#[test]
fn registers_start_zeroed_for_every_packet() {
    let mut p = Program::builder("regs");
    let a = p.label("a");
    p.instr(a, |t| {
        let seen = t.r.iter().any(|r| *r != 0);
        t.r.fill(7);
        Ok(Done(Verdict::Forward(if seen { 1 } else { 0 })))
    });
    p.entry(Entry::Packet, a);
    let (_stats, out) = run(p.build().unwrap(), &frames(50), 1);
    assert!(out.iter().all(|p| p.port == 0));
}

/// The FPISA shift-and-add XTXN: every packet adds the 16 FP32 lanes at its bytes 64..128
/// (network order) into 16 accumulator words; the sums are exact (integer values of one
/// exponent), one `fpisa_add16` XTXN is counted per packet, and a bad address faults.
#[test]
fn fpisa_add_xtxn_sums_lanes_into_accumulator_words() {
    use pfemu::fpisa::{Acc, Format, Variant};
    let mut p = Program::builder("fpisa");
    let a = p.label("a");
    p.instr(a, |t| {
        let head = t.head_offset();
        let bad = t.head(42)?[0] == 0xFF;
        let addr = if bad {
            DRAM_BASE + (1 << 16)
        } else {
            DRAM_BASE
        };
        t.fpisa_add_be(addr, head + 64, 64, Format::Fp32, Variant::Full)?;
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, a);
    let lanes = |k: u32| -> Vec<u8> {
        (0..16u32)
            .flat_map(|l| (((k + l) % 16) as f32 + 16.0).to_bits().to_be_bytes())
            .collect()
    };
    let mut inputs: Vec<Vec<u8>> = (0..20u32)
        .map(|k| {
            let mut f = udp_frame(k as u16, k, 200);
            f[64..128].copy_from_slice(&lanes(k));
            f[42] = 0;
            f
        })
        .collect();
    let mut bad = udp_frame(99, 0, 200);
    bad[42] = 0xFF;
    inputs.push(bad);
    let (sink, _rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(4)
        .mem_config(MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 16,
            acc_bytes: 0,
            banks: 4,
        })
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.inject_burst(inputs.iter().map(|f| (0, &f[..])))
        .unwrap();
    pfe.drain();
    for l in 0..16u32 {
        let acc = Acc::from_word(pfe.memory().read_u64(DRAM_BASE + u64::from(l)).unwrap());
        let want: f32 = (0..20u32).map(|k| ((k + l) % 16) as f32 + 16.0).sum();
        assert_eq!(f32::from_bits(acc.value(Format::Fp32)), want, "lane {l}");
    }
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert_eq!(stats.xtxns["fpisa_add16"], 20);
    assert_eq!(
        stats.drops("fault_shared_memory"),
        1,
        "{:?}",
        stats.dropped_by_reason
    );
}

// ----- the authoring layer --------------------------------------------------------------

pfemu::registers! {
    FLAG: bool,
    SMALL: u8,
    WORD: u32,
    ADDR: Addr,
    WHY: DropReason,
}

pfemu::drop_reasons! {
    /// Reasons of the authoring tests.
    enum TestDrop {
        Short = "short",
        Odd = "odd",
    }
}

#[test]
fn named_registers_take_slots_in_order_and_round_trip_their_type() {
    assert_eq!(
        [
            FLAG.slot(),
            SMALL.slot(),
            WORD.slot(),
            ADDR.slot(),
            WHY.slot()
        ],
        [0, 1, 2, 3, 4]
    );
    let mut p = Program::builder("regs");
    p.drop_reasons::<TestDrop>();
    pfemu::labels!(p => write, check);
    p.instr(write, move |t| {
        t.set(FLAG, true);
        t.set(SMALL, 0xAB);
        t.set(WORD, u32::MAX);
        t.set(ADDR, DRAM_BASE + 7);
        t.set(WHY, TestDrop::Odd.into());
        Ok(Goto(check))
    });
    p.instr(check, move |t| {
        assert!(t.get(FLAG));
        assert_eq!(t.get(SMALL), 0xAB);
        assert_eq!(t.get(WORD), u32::MAX);
        assert_eq!(t.get(ADDR), DRAM_BASE + 7);
        assert_eq!(t.r[WORD.slot()], u64::from(u32::MAX));
        Ok(Done(Verdict::Drop(t.get(WHY))))
    });
    p.entry(Entry::Packet, write);
    let program = p.build().unwrap();
    assert_eq!(program.instruction_names(), ["write", "check"]);
    let mut h =
        pfemu::program::Harness::new(Arc::new(SharedMemory::new(&MemConfig::default()).unwrap()));
    let out = h.run(&program, 0, &udp_frame(0, 0, 64));
    assert_eq!(out.result, Ok(Verdict::Drop(TestDrop::Odd.into())));
    assert_eq!(
        program.drop_reason_name(TestDrop::Odd.into()),
        "odd",
        "a variant is counted under its name"
    );
}

#[test]
fn drop_reason_enum_registered_after_another_reason_is_refused() {
    let mut p = Program::builder("late");
    p.drop_reason("first");
    p.drop_reasons::<TestDrop>();
    let a = p.label("a");
    p.instr(a, |_t| Ok(Done(Verdict::Forward(0))));
    p.entry(Entry::Packet, a);
    assert_eq!(
        p.build().unwrap_err(),
        ProgramError::DropReasonOrder("short")
    );

    // Registering the same enum twice, or its names by hand in order, is harmless.
    let mut p = Program::builder("twice");
    p.drop_reasons::<TestDrop>();
    p.drop_reasons::<TestDrop>();
    p.drop_reason("odd");
    let a = p.label("a");
    p.instr(a, |_t| Ok(Done(Verdict::Forward(0))));
    p.entry(Entry::Packet, a);
    assert_eq!(p.build().unwrap().drop_reasons(), ["short", "odd"]);
}

#[test]
fn dropping_under_an_unregistered_reason_faults_instead_of_miscounting() {
    let mut p = Program::builder("unregistered");
    let a = p.label("a");
    p.instr(a, |_t| Ok(Done(Verdict::Drop(TestDrop::Odd.into()))));
    p.entry(Entry::Packet, a);
    let (stats, out) = run(p.build().unwrap(), &frames(3), 2);
    assert!(out.is_empty());
    assert_eq!(stats.faults.get(FaultKind::Panic.name()), Some(&3));
}

#[test]
fn view_reads_a_header_in_the_head_and_faults_when_it_is_short() {
    use pfemu::wire::{Ipv4, Udp, ETHER_LEN, IPV4_LEN, UDP_LEN};
    assert_eq!((ETHER_LEN, IPV4_LEN, UDP_LEN), (14, 20, 8));
    let mut p = Program::builder("view");
    pfemu::labels!(p => read);
    p.instr(read, |t| {
        let ip = t.view::<Ipv4>(ETHER_LEN)?;
        let ttl = ip.ttl();
        let mut udp = t.view_mut::<Udp>(ETHER_LEN + IPV4_LEN)?;
        udp.set_checksum(0xBEEF);
        // Past the head's end: a header fault, not a panic.
        t.view::<Udp>(t.head_len() - 1)?;
        Ok(Done(Verdict::Forward(u16::from(ttl))))
    });
    p.entry(Entry::Packet, read);
    let program = p.build().unwrap();
    let mut h =
        pfemu::program::Harness::new(Arc::new(SharedMemory::new(&MemConfig::default()).unwrap()));
    let out = h.run(&program, 0, &udp_frame(0, 0, 64));
    assert_eq!(out.result.unwrap_err().kind(), FaultKind::Header);
}

#[test]
fn yield_reruns_its_label_counts_waits_and_is_bounded_by_the_budget() {
    pfemu::registers! {
        LOOKS: u8,
    }
    let mut p = Program::builder("waiter");
    pfemu::labels!(p => look);
    p.instr(look, move |t| {
        // Another thread would publish what this one waits for; here the third look finds it.
        let looks = t.get(LOOKS) + 1;
        t.set(LOOKS, looks);
        Ok(if looks < 3 {
            Yield(look)
        } else {
            Done(Verdict::Forward(1))
        })
    });
    p.entry(Entry::Packet, look);
    let program = p.build().unwrap();
    assert_eq!(Yield(look).step(), Step::Yield(look));
    let mut h =
        pfemu::program::Harness::new(Arc::new(SharedMemory::new(&MemConfig::default()).unwrap()));
    let out = h.run(&program, 0, &udp_frame(0, 0, 64));
    assert_eq!(out.result, Ok(Verdict::Forward(1)));
    assert_eq!((out.instructions, out.waits), (3, 2));

    // In the engine, every packet's waits are counted in the stats.
    let (stats, out) = run(program.clone(), &frames(10), 2);
    assert_eq!(out.len(), 10);
    assert_eq!((stats.instructions, stats.yields), (30, 20), "{stats:?}");

    // A wait that never ends is stopped by the budget, like any runaway loop.
    let mut p = Program::builder("forever");
    pfemu::labels!(p => look);
    p.instr(look, move |_t| Ok(Yield(look)));
    p.entry(Entry::Packet, look);
    let program = p.build().unwrap();
    h.set_budget(100);
    let out = h.run(&program, 0, &udp_frame(0, 0, 64));
    assert_eq!(out.result.unwrap_err().kind(), FaultKind::InstructionBudget);
    assert_eq!(out.waits, 100);
}

mod fused_tail_add {
    //! `Thread::read_tail_post_vadd32_be` (and its FPISA and write twins) against the
    //! chunk-by-chunk tail reads and posted adds (or writes) it stands for: the same memory,
    //! local memory, verdict or fault, and XTXNs; in one call or two that continue each
    //! other, and whether the program then waits for its posted XTXNs, posts another after
    //! them, or just ends.

    use super::*;
    use pfemu::fpisa::{Format, Variant};
    use pfemu::mem::WORD_BYTES;
    use pfemu::packet::DEFAULT_HEAD_BYTES;
    use pfemu::program::{Harness, HarnessOutcome};
    use proptest::prelude::*;

    /// Where the chunks go through local memory: the head's start, so a forwarded
    /// packet's first 64 bytes show what the sequence left there.
    const LM_AT: usize = pfemu::program::DEFAULT_HEAD_OFFSET;

    /// The add: 32-bit integer lanes, or FPISA on FP32 lanes (one word each); or no add,
    /// the chunks written over the words (as they are, or as FPISA accumulators).
    #[derive(Clone, Copy, Debug)]
    enum Add {
        Int,
        Fpisa(Variant),
        Write,
        FpisaWrite(Variant),
    }

    impl Add {
        /// Shared-memory words a 64-byte chunk adds into.
        fn chunk_words(self) -> u64 {
            match self {
                Add::Int | Add::Write => 8,
                Add::Fpisa(_) | Add::FpisaWrite(_) => 16,
            }
        }
    }

    /// What the program does after its adds.
    #[derive(Clone, Copy, Debug)]
    enum Then {
        /// Waits for its posted XTXNs, then writes the FPISA events it was told of.
        Wait,
        /// Ends without waiting: the adds are applied when the thread ends, or later. (Not
        /// the FPISA events told so far: an add may be applied at any time up to then.)
        End,
        /// Posts a write of the adds' first word (it must land after them), and ends.
        PostWrite,
    }

    fn program(
        add: Add,
        fused: bool,
        addr: u64,
        tail_off: usize,
        len: usize,
        split: usize,
        then: Then,
    ) -> Program {
        let mut p = Program::builder("tail_add");
        let a = p.label("a");
        p.instr(a, move |t| {
            let fused_add = |t: &mut Thread<'_>, addr, tail_off, len| match add {
                Add::Int => t.read_tail_post_vadd32_be(addr, tail_off, LM_AT, len),
                Add::Write => t.read_tail_post_write(addr, tail_off, LM_AT, len),
                Add::Fpisa(v) => {
                    t.read_tail_post_fpisa_add_be(addr, tail_off, LM_AT, len, Format::Fp32, v)
                }
                Add::FpisaWrite(v) => {
                    t.read_tail_post_fpisa_write_be(addr, tail_off, LM_AT, len, Format::Fp32, v)
                }
            };
            match fused {
                true => {
                    // In two calls, the second starting where the first ends.
                    let first = (64 * split).min(len);
                    fused_add(t, addr, tail_off, first)?;
                    let at = addr + (first / 64) as u64 * add.chunk_words();
                    fused_add(t, at, tail_off + first, len - first)?;
                }
                false => {
                    for k in 0..len.div_ceil(64) {
                        let bytes = 64.min(len - 64 * k);
                        t.read_tail(tail_off + 64 * k, LM_AT, bytes)?;
                        match add {
                            Add::Int => {
                                let at = addr + (64 * k / WORD_BYTES) as u64;
                                t.post_vadd32_be(at, LM_AT, bytes)?
                            }
                            Add::Write => {
                                let at = addr + (64 * k / WORD_BYTES) as u64;
                                t.mem_write(at, LM_AT, bytes)?
                            }
                            Add::Fpisa(v) => {
                                let at = addr + 16 * k as u64;
                                t.post_fpisa_add_be(at, LM_AT, bytes, Format::Fp32, v)?
                            }
                            Add::FpisaWrite(v) => {
                                let at = addr + 16 * k as u64;
                                t.fpisa_write_be(at, LM_AT, bytes, Format::Fp32, v)?
                            }
                        }
                    }
                }
            }
            match then {
                Then::Wait => t.wait_posted(),
                Then::End => return Ok(Done(Verdict::Forward(0))),
                Then::PostWrite => {
                    t.post(Op::WriteU64 {
                        addr,
                        value: 0x0123_4567_89AB_CDEF,
                    })?;
                    return Ok(Done(Verdict::Forward(0)));
                }
            }
            // The FPISA events of the adds, as a program would count them.
            let c = t.take_fpisa_counts();
            let events = c.overwrites + (c.left_shifts << 20) + (c.overflows << 40);
            t.write_u64(0, events)?;
            Ok(Done(Verdict::Forward(0)))
        });
        p.entry(Entry::Packet, a);
        p.build().unwrap()
    }

    /// Runs one of the two on a fresh memory whose SRAM holds `fill`; returns what the
    /// harness saw and the whole SRAM afterwards.
    #[allow(clippy::too_many_arguments)]
    fn outcome(
        add: Add,
        fused: bool,
        addr: u64,
        tail_off: usize,
        len: usize,
        (split, then): (usize, Then),
        frame: &[u8],
        fill: u8,
    ) -> (HarnessOutcome, Vec<u8>) {
        let mem = Arc::new(SharedMemory::new(&common::small_mem()).unwrap());
        let sram = mem.region(pfemu::mem::Region::Sram);
        let words = (sram.end - sram.start) as usize;
        let mut bytes = vec![fill; words * WORD_BYTES];
        for line in bytes.chunks(64).enumerate() {
            mem.write(sram.start + (line.0 * 8) as u64, line.1).unwrap();
        }
        let mut h = Harness::new(mem.clone());
        let out = h.run(
            &program(add, fused, addr, tail_off, len, split, then),
            0,
            frame,
        );
        for (k, line) in bytes.chunks_mut(64).enumerate() {
            mem.read(sram.start + (k * 8) as u64, line).unwrap();
        }
        (out, bytes)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn matches_the_chunk_by_chunk_sequence(
            frame_len in DEFAULT_HEAD_BYTES + 1..DEFAULT_HEAD_BYTES + 5000,
            seed in any::<u8>(),
            tail_off in 0usize..5100,
            chunks in 0usize..70,
            odd in prop::sample::select(vec![0usize, 0, 0, 8, 24]),
            from_end in 0u64..700,
            fill in any::<u8>(),
            add in prop::sample::select(vec![Add::Int, Add::Fpisa(Variant::Full), Add::Fpisa(Variant::Approx), Add::Write, Add::FpisaWrite(Variant::Full), Add::FpisaWrite(Variant::Approx)]),
            split in 0usize..72,
            then in prop::sample::select(vec![Then::Wait, Then::End, Then::PostWrite]),
        ) {
            let frame: Vec<u8> = (0..frame_len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            let len = 64 * chunks + odd;
            // Near SRAM's end (8192 words), so some adds run past it and fault.
            let addr = 8192u64.saturating_sub(from_end);
            let how = (split, then);
            let (chunked, mem_a) = outcome(add, false, addr, tail_off, len, how, &frame, fill);
            let (fused, mem_b) = outcome(add, true, addr, tail_off, len, how, &frame, fill);
            prop_assert_eq!(&fused.result, &chunked.result);
            prop_assert_eq!(&fused.output, &chunked.output);
            prop_assert_eq!(&fused.xtxns, &chunked.xtxns);
            prop_assert_eq!(&fused.instructions, &chunked.instructions);
            prop_assert!(mem_a == mem_b, "memory differs");
        }
    }
}

mod fused_fpisa_read {
    //! `Thread::fpisa_read_fp32_be` against the pull it stands for: line reads of the words
    //! into local memory, then their renormalization there; the same values in local memory
    //! (a forwarded head shows them), verdict or fault, and XTXNs.

    use super::*;
    use pfemu::program::{Harness, HarnessOutcome};
    use proptest::prelude::*;

    const LM_AT: usize = pfemu::program::DEFAULT_HEAD_OFFSET;

    fn program(fused: bool, addr: u64, lanes: usize) -> Program {
        let mut p = Program::builder("fpisa_read");
        let a = p.label("a");
        p.instr(a, move |t| {
            if fused {
                t.fpisa_read_fp32_be(addr, LM_AT, lanes)?;
            } else {
                let lines = (8 * lanes).next_multiple_of(64);
                t.mem_read_lines(addr, LM_AT, lines)?;
                let lm = t.lm_bytes_mut(LM_AT, lines)?;
                pfemu::fpisa::fp32_values_be_in_place(&mut lm[..8 * lanes]);
            }
            Ok(Done(Verdict::Forward(0)))
        });
        p.entry(Entry::Packet, a);
        p.build().unwrap()
    }

    fn outcome(fused: bool, addr: u64, lanes: usize, seed: u64) -> HarnessOutcome {
        let mem = Arc::new(SharedMemory::new(&common::small_mem()).unwrap());
        let sram = mem.region(pfemu::mem::Region::Sram);
        for w in sram.start..sram.end {
            // Accumulators of every kind, flags and saturated mantissas among them.
            let v = (w ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            mem.write_u64(w, v & 0x0000_FFFF_FFFF_FFFF).unwrap();
        }
        let mut h = Harness::new(mem);
        // A frame long enough that the head (local memory from LM_AT) shows what was left.
        h.run(&program(fused, addr, lanes), 0, &udp_frame(0, 0, 256))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn matches_a_line_pull_and_its_renormalization(
            lanes in 1usize..33,
            from_end in 0u64..300,
            seed in any::<u64>(),
        ) {
            // Near SRAM's end (8192 words), so some reads run past it and fault.
            let addr = 8192u64.saturating_sub(from_end);
            let (pull, fused) = (outcome(false, addr, lanes, seed), outcome(true, addr, lanes, seed));
            prop_assert_eq!(&fused.result, &pull.result);
            prop_assert_eq!(&fused.xtxns, &pull.xtxns);
            // The values; past them the pull leaves the rest of its words, the fused read
            // nothing.
            let values = |o: &HarnessOutcome| o.output.as_ref().map(|f| f[..4 * lanes].to_vec());
            prop_assert_eq!(values(&fused), values(&pull));
            prop_assert_eq!(fused.output.is_some(), fused.result.is_ok());
        }
    }
}
