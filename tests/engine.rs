//! The engine's lifecycle and data path: backpressure, conservation under stress, head/tail
//! split and rejoin, created packets, multicast, posted XTXNs, ingress checks, and refused
//! configurations.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pfemu::pfe::TryInjectError;
use pfemu::prelude::*;
use pfemu::PfeBuilder;

use common::{ether_frame, flow_seq, udp_frame, Rng};

fn forward_all(port: Port) -> Program {
    let mut p = Program::builder("forward");
    let a = p.label("a");
    p.instr(a, move |_t| Ok(Done(Verdict::Forward(port))));
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

/// Forwards every packet to port 0, but only once `gate` is open: until then each PPE
/// thread waits inside its first packet, so the engine fills up.
fn gated_forward(gate: Arc<AtomicBool>) -> Program {
    let mut p = Program::builder("gated");
    let a = p.label("a");
    p.instr(a, move |_t| {
        while !gate.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        Ok(Done(Verdict::Forward(0)))
    });
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

/// Ingress closes a batch at `batch_size` while the PPE threads keep up, and fills it up
/// to `max_batch_size` while a backlog waits in dispatch; every packet leaves either way.
#[test]
fn batches_grow_to_max_batch_size_under_a_backlog_and_only_then() {
    for max in [4, 16] {
        let gate = Arc::new(AtomicBool::new(true));
        let sink = Arc::new(CountingSink::new(1));
        let mut pfe = Pfe::builder()
            .program(gated_forward(gate.clone()))
            .ppe_threads(1)
            .batch_size(4)
            .max_batch_size(max)
            .capacity(1000)
            .sink(sink.clone())
            .build()
            .unwrap();
        assert_eq!(pfe.config().max_batch_size, max);
        pfe.start().unwrap();
        let frames: Vec<Vec<u8>> = (0..400u16)
            .map(|i| udp_frame(i % 7, i.into(), 64))
            .collect();
        let burst = |pfe: &Pfe, n: usize| {
            pfe.inject_burst(frames[..n].iter().map(|f| (0, &f[..])))
                .unwrap();
        };
        // Keeping up: a burst of 8 into an idle engine is two batches of 4, whatever the
        // maximum (the second is filled while at most one waits).
        for _ in 0..10 {
            burst(&pfe, 8);
            pfe.drain();
        }
        assert_eq!(pfe.stats().batches, 20, "max {max}");
        // A backlog: the thread is held inside its first batch, so batches queue behind it.
        // The first two or three are filled before two wait; every later one is full size.
        gate.store(false, Ordering::Release);
        burst(&pfe, 400);
        gate.store(true, Ordering::Release);
        pfe.drain();
        let s = pfe.stats();
        let backlog_batches = s.batches - 20;
        if max == 4 {
            assert_eq!(backlog_batches, 100);
        } else {
            // 2 or 3 batches of 4, then (400 - 8 or 12) / 16 rounded up = 25.
            assert!((27..=28).contains(&backlog_batches), "{backlog_batches}");
        }
        assert_eq!(s.packets_out, 480, "max {max}: {s:?}");
        assert!(s.is_conserved(), "{s:?}");
        drop(pfe.shutdown());
    }
}

#[test]
fn a_full_engine_hands_packets_back_and_inject_waits() {
    let gate = Arc::new(AtomicBool::new(false));
    let program = gated_forward(gate.clone());
    let sink = Arc::new(CountingSink::new(1));
    let mut pfe = Pfe::builder()
        .program(program)
        .ppe_threads(2)
        .capacity(16)
        .batch_size(4)
        .sink(sink.clone())
        .build()
        .unwrap();
    // Not started yet: refused, and the packet comes back.
    let pkt = Packet::new(0, udp_frame(1, 0, 64));
    match pfe.try_inject(pkt.clone()) {
        Err(TryInjectError::NotRunning(back)) => assert_eq!(back, pkt),
        other => panic!("expected NotRunning, got {other:?}"),
    }
    pfe.start().unwrap();
    for i in 0..16 {
        pfe.try_inject(Packet::new(0, udp_frame(1, i, 64))).unwrap();
    }
    let extra = Packet::new(0, udp_frame(1, 99, 64));
    match pfe.try_inject(extra.clone()) {
        Err(TryInjectError::Full(back)) => assert_eq!(back, extra),
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!(pfe.in_flight(), 16);
    let pfe = Arc::new(pfe);
    let p2 = pfe.clone();
    let blocked = std::thread::spawn(move || p2.inject(Packet::new(0, udp_frame(1, 100, 64))));
    // The injector found no room and waits for it: nothing can leave while the gate is
    // shut, so it is still waiting, and took nothing.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while pfe.injectors_waiting() == 0 {
        if blocked.is_finished() {
            panic!("inject returned on a full engine: {:?}", blocked.join());
        }
        assert!(
            std::time::Instant::now() < deadline,
            "inject neither returned nor waited for room within 30 s"
        );
        std::thread::yield_now();
    }
    assert_eq!(pfe.in_flight(), 16, "the waiting injector took no room");
    assert!(
        !blocked.is_finished(),
        "inject must wait while the engine is full"
    );
    gate.store(true, Ordering::Release);
    blocked.join().unwrap().unwrap();
    pfe.drain();
    assert_eq!(pfe.injectors_waiting(), 0);
    assert_eq!(sink.total_packets(), 17);
    let stats = pfe.stats();
    assert_eq!(stats.packets_in, 17);
    assert!(stats.is_conserved());
}

#[test]
fn conservation_under_stress_from_four_injectors_with_mixed_verdicts() {
    // Verdict by a hash of the frame: forward, drop, consume, fault, or multicast.
    let mut p = Program::builder("mixed");
    let a = p.label("a");
    let r = p.drop_reason("chosen");
    p.instr(a, move |t| {
        let (flow, seq) = {
            let h = t.head(42)?;
            (
                u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
                u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
            )
        };
        match (flow.wrapping_mul(31) ^ seq) % 5 {
            0 => Ok(Done(Verdict::Forward((seq % 4) as u16))),
            1 => Ok(Done(Verdict::Drop(r))),
            2 => Ok(Done(Verdict::Consume)),
            3 => Err(FaultDetail::LocalMemory {
                offset: 9_999,
                len: 1,
            }
            .into()),
            _ => Ok(Done(Verdict::Multicast(7))),
        }
    });
    p.entry(Entry::Packet, a);
    let sink = Arc::new(CountingSink::new(4));
    let pfe = Arc::new({
        let mut pfe = Pfe::builder()
            .program(p.build().unwrap())
            .ppe_threads(300)
            .ports(4)
            .multicast_group(7, vec![1, 2, 3])
            .capacity(1024)
            .sink(sink.clone())
            .build()
            .unwrap();
        pfe.start().unwrap();
        pfe
    });
    let per_injector = 25_000u32;
    let watcher_stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let pfe = pfe.clone();
        let stop = watcher_stop.clone();
        std::thread::spawn(move || {
            // While running, nothing is ever counted out that did not come in.
            while !stop.load(Ordering::Relaxed) {
                let s = pfe.stats();
                let done = s.packets_out + s.consumed + s.dropped;
                assert!(done <= s.packets_in, "{s:?}");
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let injectors: Vec<_> = (0..4u16)
        .map(|k| {
            let pfe = pfe.clone();
            std::thread::spawn(move || {
                let mut rng = Rng(k as u64 + 1);
                let frames: Vec<Vec<u8>> = (0..per_injector)
                    .map(|i| udp_frame(k * 1000 + (i % 97) as u16, i, 64))
                    .collect();
                let mut at = 0;
                while at < frames.len() {
                    let n = (1 + rng.below(100) as usize).min(frames.len() - at);
                    pfe.inject_burst(frames[at..at + n].iter().map(|f| (k, &f[..])))
                        .unwrap();
                    at += n;
                }
            })
        })
        .collect();
    for j in injectors {
        j.join().unwrap();
    }
    pfe.drain();
    watcher_stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let s = pfe.stats();
    let total = 4 * per_injector as u64;
    assert_eq!(s.packets_in, total);
    assert_eq!(s.in_flight, 0);
    assert!(s.is_conserved(), "{s:?}");
    assert_eq!(s.packets_out + s.consumed + s.dropped, total);
    // Multicast copies: three per multicast packet.
    let forwarded = s.packets_out - s.multicast;
    assert_eq!(sink.total_packets(), forwarded + 3 * s.multicast);
    assert_eq!(s.frames_tx, sink.total_packets());
    assert_eq!(
        s.faults_of(FaultKind::LocalMemory),
        s.drops("fault_local_memory")
    );
    assert_eq!(s.per_ppe_packets.len(), 300);
    assert_eq!(s.processed(), total);
}

#[test]
fn head_and_tail_are_split_and_rejoined_and_a_new_tail_replaces_the_old() {
    // Frames of 500 bytes: the program sees a 192-byte head and a 308-byte tail. It copies
    // tail bytes 100..164 into local memory, writes them into the head at offset 50, and
    // for odd flows writes a new 64-byte tail made of those bytes.
    let mut p = Program::builder("tail");
    let a = p.label("a");
    p.instr(a, move |t| {
        assert_eq!(t.head_len(), 192);
        assert_eq!(t.tail_len(), t.pkt_len() - 192);
        t.read_tail(100, 1100, 64)?;
        let chunk: Vec<u8> = t.lm_bytes(1100, 64)?.to_vec();
        t.head_mut(50)?[..64].copy_from_slice(&chunk);
        let flow = t.head(34)?[1];
        if flow % 2 == 1 {
            t.write_tail(1100, 64)?;
        }
        Ok(Done(Verdict::Forward(0)))
    });
    p.entry(Entry::Packet, a);
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(2)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let mut inputs = Vec::new();
    for flow in 0..8u16 {
        let mut f = udp_frame(flow, 0, 500);
        for (i, b) in f.iter_mut().enumerate().skip(50) {
            *b = (i * 7 + flow as usize) as u8;
        }
        inputs.push(f);
    }
    pfe.inject_burst(inputs.iter().map(|f| (0, &f[..])))
        .unwrap();
    pfe.drain();
    let out: Vec<Packet> = rx.try_iter().collect();
    assert_eq!(out.len(), 8);
    for (flow, input) in inputs.iter().enumerate() {
        let o = out.iter().find(|p| p.data[35] as usize == flow).unwrap();
        let chunk = &input[192 + 100..192 + 164];
        let mut expect = input[..192].to_vec();
        expect[50..114].copy_from_slice(chunk);
        if flow % 2 == 1 {
            expect.extend_from_slice(chunk);
        } else {
            expect.extend_from_slice(&input[192..]);
        }
        assert_eq!(o.data, expect, "flow {flow}");
    }
    let s = pfe.shutdown();
    assert_eq!(s.xtxns["tail_read"], 8);
    assert_eq!(s.xtxns["tail_write"], 4);
}

#[test]
fn created_packets_leave_right_after_their_creator_in_creation_order() {
    // Every packet forwards itself and creates two packets: markers 0xA1 and 0xA2 at byte
    // 0 followed by the creator's flow/seq payload.
    let mut p = Program::builder("create");
    let a = p.label("a");
    p.instr(a, move |t| {
        let id: [u8; 8] = t.head(42)?[..8].try_into().unwrap();
        for marker in [0xA1u8, 0xA2] {
            let lm = t.lm_bytes_mut(1000, 60)?;
            lm.fill(0);
            lm[0] = marker;
            lm[42..50].copy_from_slice(&id);
            t.emit(Dest::Port(0), 1000, 60)?;
        }
        Ok(Done(Verdict::Forward(0)))
    });
    p.entry(Entry::Packet, a);
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(64)
        .classifier(FlowClassifier::IngressPort)
        .batch_size(4)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..2_000)
        .map(|i| udp_frame(i as u16 % 13, i, 64))
        .collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    pfe.drain();
    let out: Vec<Packet> = rx.try_iter().collect();
    assert_eq!(out.len(), 6_000);
    // One ingress port = one flow: the output is the input order, each packet followed
    // by its two creations.
    for (i, chunk) in out.chunks(3).enumerate() {
        assert_eq!(flow_seq(&chunk[0].data).1, i as u32);
        assert_eq!(chunk[0].data, frames[i]);
        assert_eq!(
            (chunk[1].data[0], flow_seq(&chunk[1].data).1),
            (0xA1, i as u32)
        );
        assert_eq!(
            (chunk[2].data[0], flow_seq(&chunk[2].data).1),
            (0xA2, i as u32)
        );
    }
    let s = pfe.shutdown();
    assert_eq!(s.created, 4_000);
    assert_eq!(s.frames_tx, 6_000);
}

/// Creates a packet of 60 bytes to port 0 from local memory: `marker` at byte 0, then the
/// creator's flow and sequence number where [`flow_seq`] reads them.
fn emit_marked(t: &mut Thread<'_>, marker: u8, id: [u8; 8]) -> Result<(), Fault> {
    let lm = t.lm_bytes_mut(1000, 60)?;
    lm.fill(0);
    lm[0] = marker;
    lm[42..50].copy_from_slice(&id);
    t.emit(Dest::Port(0), 1000, 60)
}

/// A thread that keeps the packets it created ([`Thread::keep_created`]) and faults later
/// loses only those it created after the call; so does its fault handler if it faults in
/// turn. Kept packets leave right after their creator's place, in creation order, once,
/// ahead of the handler's; the engine counts them as created packets and the creator as a
/// fault.
#[test]
fn packets_a_thread_kept_leave_although_it_faults_later_and_the_others_do_not() {
    // Packet `seq` creates 0xA1 and 0xA2, keeps them, creates 0xA3, then by `seq % 4`:
    // 0 forwards itself; 1 reads past local memory; 2 runs out of instructions; 3 read
    // past local memory before it kept anything. The fault handler creates 0xB1, keeps
    // it, creates 0xB2, and faults in turn for `seq % 4 == 2`.
    let class = |t: &Thread<'_>| -> Result<(u32, [u8; 8]), Fault> {
        // The payload's flow and sequence number (`udp_frame`).
        let id: [u8; 8] = t.head(42)?[..8].try_into().unwrap();
        Ok((u32::from_be_bytes(id[4..].try_into().unwrap()) % 4, id))
    };
    let mut p = Program::builder("keep");
    pfemu::labels!(p => create, spin, on_fault);
    p.instr(create, move |t| {
        let (class, id) = class(t)?;
        emit_marked(t, 0xA1, id)?;
        emit_marked(t, 0xA2, id)?;
        if class == 3 {
            t.lm_bytes(1270, 64)?;
        }
        t.keep_created();
        emit_marked(t, 0xA3, id)?;
        match class {
            0 => Ok(Done(Verdict::Forward(0))),
            1 => {
                t.lm_bytes(1270, 64)?;
                unreachable!("local memory has 1280 bytes")
            }
            _ => Ok(Goto(spin)),
        }
    });
    p.instr(spin, move |_t| Ok(Goto(spin)));
    p.instr(on_fault, move |t| {
        let (class, id) = class(t)?;
        emit_marked(t, 0xB1, id)?;
        t.keep_created();
        emit_marked(t, 0xB2, id)?;
        if class == 2 {
            t.lm_bytes(1270, 64)?;
        }
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, create);
    p.on_fault(on_fault);
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(4)
        .classifier(FlowClassifier::IngressPort)
        .batch_size(4)
        .instruction_budget(50)
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    const N: u32 = 400;
    let frames: Vec<Vec<u8>> = (0..N).map(|i| udp_frame(1, i, 64)).collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    pfe.drain();

    // One ingress port, one flow: the output keeps the input order.
    let out: Vec<(Option<u8>, u32)> = rx
        .try_iter()
        .map(|p| {
            let marker = (p.data.len() == 60).then_some(p.data[0]);
            (marker, flow_seq(&p.data).1)
        })
        .collect();
    let want: Vec<(Option<u8>, u32)> = (0..N)
        .flat_map(|i| {
            let markers: &[Option<u8>] = match i % 4 {
                0 => &[None, Some(0xA1), Some(0xA2), Some(0xA3)],
                1 => &[Some(0xA1), Some(0xA2), Some(0xB1), Some(0xB2)],
                2 => &[Some(0xA1), Some(0xA2), Some(0xB1)],
                _ => &[Some(0xB1), Some(0xB2)],
            };
            markers.iter().map(move |m| (*m, i))
        })
        .collect();
    assert_eq!(out, want);

    let s = pfe.shutdown();
    let k = u64::from(N / 4);
    assert_eq!(s.packets_out, k);
    assert_eq!(s.faults_of(FaultKind::LocalMemory), 2 * k);
    assert_eq!(s.faults_of(FaultKind::InstructionBudget), k);
    assert_eq!(s.dropped, 3 * k, "every faulting packet dropped");
    assert_eq!((s.fault_handlers, s.fault_handler_faults), (3 * k, k));
    assert_eq!(
        s.created,
        (3 + 4 + 3 + 2) * k,
        "the packets that left, no more"
    );
    assert_eq!(s.created_invalid, 0);
    assert_eq!(s.frames_tx, k + s.created);
    assert!(s.is_conserved());
}

#[test]
fn posted_xtxns_are_applied_exactly_once_and_visible_after_drain() {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let base = mem.alloc("test.counters", Region::Sram, 16).unwrap();
    let mut p = Program::builder("post");
    let a = p.label("a");
    p.instr(a, move |t| {
        let flow = t.head(35)?[0] as u64 % 8;
        t.post(Op::CounterInc {
            addr: base + flow * 2,
            bytes: t.pkt_len() as u64,
        })?;
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, a);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .memory(mem.clone())
        .ppe_threads(32)
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..40_000u32)
        .map(|i| udp_frame((i % 8) as u16, i, 64 + (i % 8) as usize))
        .collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    pfe.drain();
    for flow in 0..8u64 {
        assert_eq!(
            mem.counter_read(base + flow * 2).unwrap(),
            (5_000, 5_000 * (64 + flow))
        );
    }
    assert_eq!(pfe.stats().consumed, 40_000);
}

#[test]
fn shared_frames_leave_as_copied_ones_do_and_the_engine_lets_go_of_them_by_drain() {
    // Per flow: forward untouched, rewrite the head from the tail, or replace the tail. A
    // shared frame is never written: the rewritten ones are rebuilt in the output arena.
    let mut p = Program::builder("rewrite");
    let a = p.label("a");
    p.instr(a, move |t| {
        let flow = t.head(34)?[1];
        if flow % 3 > 0 {
            t.read_tail(100, 1100, 64)?;
            let chunk: Vec<u8> = t.lm_bytes(1100, 64)?.to_vec();
            t.head_mut(50)?[..64].copy_from_slice(&chunk);
            if flow % 3 == 2 {
                t.write_tail(1100, 64)?;
            }
        }
        Ok(Done(Verdict::Forward(0)))
    });
    p.entry(Entry::Packet, a);
    let program = p.build().unwrap();
    let inputs: Vec<Vec<u8>> = (0..12u16)
        .map(|flow| {
            let mut f = udp_frame(flow, 0, 500);
            for (i, b) in f.iter_mut().enumerate().skip(50) {
                *b = (i * 7 + flow as usize) as u8;
            }
            f
        })
        .collect();
    let shared: Vec<Arc<[u8]>> = inputs.iter().map(|f| Arc::from(&f[..])).collect();
    let mut outputs = Vec::new();
    for by_reference in [false, true] {
        let (sink, rx) = ChannelSink::new();
        let mut pfe = Pfe::builder()
            .program(program.clone())
            .ppe_threads(2)
            .batch_size(4)
            .sink(Arc::new(sink))
            .build()
            .unwrap();
        pfe.start().unwrap();
        if by_reference {
            let bad: [Arc<[u8]>; 2] = [Arc::from(&[0u8; 10][..]), Arc::from(vec![0u8; 9217])];
            pfe.inject_shared(shared.iter().chain(&bad).map(|f| (0, Arc::clone(f))))
                .unwrap();
        } else {
            pfe.inject_burst(inputs.iter().map(|f| (0, &f[..])))
                .unwrap();
        }
        pfe.drain();
        let mut out: Vec<Vec<u8>> = rx.try_iter().map(|p| p.data).collect();
        out.sort();
        outputs.push(out);
        let s = pfe.shutdown();
        assert!(s.is_conserved());
        if by_reference {
            assert_eq!(s.packets_in, 14);
            assert_eq!((s.drops("runt"), s.drops("oversize")), (1, 1));
        }
    }
    assert_eq!(outputs[0].len(), 12);
    assert_eq!(
        outputs[0], outputs[1],
        "shared frames leave as copied ones do"
    );
    for (f, input) in shared.iter().zip(&inputs) {
        assert_eq!(Arc::strong_count(f), 1, "the engine keeps no reference");
        assert_eq!(&f[..], &input[..], "a shared frame is never written");
    }
}

/// A frame given as a header and the rest ([`pfemu::pfe::FrameBytes`]) is the frame the two
/// make: it leaves whole, the classifier reads it whole, a frame the classifier refuses is
/// dropped while the frames around it leave intact, and runts and oversize frames are
/// what their total length makes them.
#[test]
fn frames_given_in_two_pieces_are_joined_by_ingress() {
    let inputs: Vec<Vec<u8>> = (0..40u32)
        .map(|i| {
            let mut f = udp_frame((i % 5) as u16, i, 200);
            for (k, b) in f.iter_mut().enumerate().skip(50) {
                *b = (k as u32 * 13 + i) as u8;
            }
            // Every seventh frame ends in the byte the classifier refuses.
            f[199] = if i % 7 == 3 { 0xEE } else { i as u8 };
            f
        })
        .collect();
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(forward_all(0))
        .ppe_threads(2)
        .batch_size(4)
        .classifier(pfemu::pfe::FlowClassifier::Custom(Arc::new(
            |_port, frame: &[u8]| {
                assert_eq!(frame.len(), 200, "the classifier sees the whole frame");
                if frame[199] == 0xEE {
                    panic!("refused");
                }
                u64::from(frame[199])
            },
        )))
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    // Cut anywhere: before the first byte, inside the headers, in the payload, at the end.
    let pieces = inputs.iter().enumerate().map(|(i, f)| {
        let cut = [0, 14, 42, 123, 200][i % 5];
        (0, (&f[..cut], &f[cut..]))
    });
    assert_eq!(pfe.inject_burst(pieces).unwrap(), 40);
    // A runt and an oversize frame in two pieces are what their total length makes them.
    let (short, long) = (vec![0u8; 8], vec![0u8; 9000]);
    pfe.inject_burst([(0, (&short[..], &short[..5])), (0, (&long[..], &long[..]))])
        .unwrap();
    assert_eq!(
        pfe.offer_burst([(0, (&inputs[0][..100], &inputs[0][100..]))])
            .unwrap(),
        1
    );
    pfe.drain();
    let mut out: Vec<Vec<u8>> = rx.try_iter().map(|p| p.data).collect();
    out.sort();
    let mut want: Vec<Vec<u8>> = inputs
        .iter()
        .filter(|f| f[199] != 0xEE)
        .chain([&inputs[0]])
        .cloned()
        .collect();
    want.sort();
    assert_eq!(out, want);
    let s = pfe.shutdown();
    assert_eq!(s.drops("classifier_panic"), 6, "{s:?}");
    assert_eq!((s.drops("runt"), s.drops("oversize")), (1, 1), "{s:?}");
    assert!(s.is_conserved(), "{s:?}");
}

#[test]
fn ingress_drops_runts_and_oversize_frames_with_reasons() {
    let sink = Arc::new(CountingSink::new(1));
    let mut pfe = Pfe::builder()
        .program(forward_all(0))
        .max_frame_bytes(1518)
        .sink(sink.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames = [
        vec![0u8; 10],
        vec![0u8; 1519],
        ether_frame(0x0800, 64),
        vec![],
        ether_frame(0x0806, 1518),
    ];
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    pfe.drain();
    let s = pfe.shutdown();
    assert_eq!(s.packets_in, 5);
    assert_eq!(s.drops("runt"), 2);
    assert_eq!(s.drops("oversize"), 1);
    assert_eq!(sink.total_packets(), 2);
    assert!(s.is_conserved());
}

#[test]
fn unknown_ports_and_groups_are_counted_drops() {
    let mut p = Program::builder("dest");
    let a = p.label("a");
    p.instr(a, |t| {
        let seq = t.head(46)?[3];
        Ok(Done(match seq % 3 {
            0 => Verdict::Forward(7),
            1 => Verdict::Forward(100),
            _ => Verdict::Multicast(3),
        }))
    });
    p.entry(Entry::Packet, a);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ports(8)
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..30).map(|i| udp_frame(0, i, 64)).collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    let s = pfe.shutdown();
    assert_eq!(s.packets_out, 10);
    assert_eq!(s.drops("no_such_port"), 10);
    assert_eq!(s.drops("no_such_group"), 10);
    assert!(s.is_conserved());
}

#[test]
fn bad_configurations_are_refused_naming_the_setting() {
    let cases: Vec<(PfeBuilder, &str)> = vec![
        (Pfe::builder(), "program"),
        (
            Pfe::builder().program(forward_all(0)).ppe_threads(0),
            "ppe_threads",
        ),
        (
            Pfe::builder().program(forward_all(0)).ppe_threads(5000),
            "ppe_threads",
        ),
        (
            Pfe::builder().program(forward_all(0)).head_bytes(4000),
            "head_bytes",
        ),
        (
            Pfe::builder().program(forward_all(0)).batch_size(0),
            "batch_size",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .capacity(8)
                .batch_size(32),
            "capacity",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .batch_size(32)
                .max_batch_size(16),
            "max_batch_size",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .capacity(100)
                .max_batch_size(101),
            "max_batch_size",
        ),
        (
            Pfe::builder().program(forward_all(0)).max_batch_size(1025),
            "max_batch_size",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .reorder_contexts(1000),
            "reorder_contexts",
        ),
        (Pfe::builder().program(forward_all(0)).ports(0), "ports"),
        (
            Pfe::builder().program(forward_all(0)).instruction_budget(0),
            "instruction_budget",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .ports(4)
                .multicast_group(1, vec![2, 9]),
            "multicast_group",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .multicast_group(1, vec![]),
            "multicast_group",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .multicast_group(1, vec![1])
                .multicast_group(1, vec![2]),
            "multicast_group",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .mem_config(MemConfig {
                    sram_bytes: 100,
                    ..MemConfig::default()
                }),
            "sram_bytes",
        ),
        (
            Pfe::builder()
                .program(forward_all(0))
                .mem_config(MemConfig {
                    banks: 3,
                    ..MemConfig::default()
                }),
            "banks",
        ),
    ];
    for (builder, setting) in cases {
        let err = builder.build().expect_err(setting);
        assert_eq!(err.setting, setting, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains(setting) && msg.len() > setting.len() + 30,
            "unclear message: {msg}"
        );
    }
}

#[test]
fn shutdown_and_drop_lose_nothing_in_flight() {
    // A slow program behind a gate: while the gate is shut every packet stays in flight,
    // however fast or busy the machine; once it opens, the 2000 packets take at least
    // 2000 x 20 us / 8 threads, so shutdown (or drop), called right after, meets them in
    // flight. (Before, the test only hoped they were still in flight when it looked.)
    let gate = Arc::new(AtomicBool::new(false));
    let mut p = Program::builder("slow");
    let a = p.label("a");
    let shut = gate.clone();
    p.instr(a, move |_t| {
        while !shut.load(Ordering::Acquire) {
            std::thread::yield_now();
        }
        std::thread::sleep(Duration::from_micros(20));
        Ok(Done(Verdict::Forward(0)))
    });
    p.entry(Entry::Packet, a);
    let program = p.build().unwrap();
    let frames: Vec<Vec<u8>> = (0..2_000).map(|i| udp_frame(i as u16, i, 64)).collect();

    // An engine with the slow program, started, with every frame injected and held.
    let loaded = |sink: &Arc<CountingSink>| {
        gate.store(false, Ordering::Release);
        let mut pfe = Pfe::builder()
            .program(program.clone())
            .ppe_threads(8)
            .sink(sink.clone())
            .build()
            .unwrap();
        pfe.start().unwrap();
        pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
            .unwrap();
        assert_eq!(pfe.in_flight(), 2_000, "the shut gate holds every packet");
        assert_eq!(sink.total_packets(), 0);
        pfe
    };

    let sink = Arc::new(CountingSink::new(1));
    let pfe = loaded(&sink);
    gate.store(true, Ordering::Release);
    let s = pfe.shutdown();
    assert_eq!(sink.total_packets(), 2_000);
    assert_eq!(s.packets_out, 2_000);
    assert_eq!(s.in_flight, 0);

    let sink = Arc::new(CountingSink::new(1));
    let pfe = loaded(&sink);
    gate.store(true, Ordering::Release);
    drop(pfe); // dropped with packets in flight
    assert_eq!(sink.total_packets(), 2_000);
}

#[test]
fn a_started_engine_reports_its_configuration_and_starting_twice_is_harmless() {
    let mut pfe = Pfe::builder()
        .program(forward_all(0))
        .ppe_threads(3)
        .head_bytes(128)
        .build()
        .unwrap();
    assert_eq!(pfe.config().ppe_threads, 3);
    assert_eq!(pfe.config().head_bytes, 128);
    assert_eq!(pfe.program().name(), "forward");
    pfe.start().unwrap();
    pfe.start().unwrap();
    pfe.inject(Packet::new(0, udp_frame(1, 1, 64))).unwrap();
    let s = pfe.shutdown();
    assert_eq!(s.packets_out, 1);
    assert_eq!(s.per_ppe_packets.len(), 3);
}

/// `offer_burst` takes what fits and drops the rest as `rx_full`, at once: a receive ring
/// overflowing. Every frame is accounted for: accepted, runt, or no room.
#[test]
fn offered_frames_that_find_the_engine_full_are_dropped_and_counted() {
    let gate = Arc::new(AtomicBool::new(false));
    let program = gated_forward(gate.clone());
    let sink = Arc::new(CountingSink::new(1));
    let mut pfe = Pfe::builder()
        .program(program)
        .ppe_threads(2)
        .capacity(50)
        .batch_size(8)
        .sink(sink.clone())
        .build()
        .unwrap();
    assert!(pfe.offer_burst([(0, &udp_frame(1, 0, 64)[..])]).is_err());
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..1000).map(|i| udp_frame(1, i, 64)).collect();
    let runt = [0u8; pfemu::packet::MIN_FRAME_BYTES - 1];
    let offered = frames
        .iter()
        .map(|f| (0, &f[..]))
        .chain(std::iter::once((0, &runt[..])));
    // Nothing is processed while the gate is shut: exactly the capacity is taken.
    assert_eq!(pfe.offer_burst(offered).unwrap(), 50);
    assert_eq!(pfe.in_flight(), 50);
    gate.store(true, Ordering::Release);
    pfe.drain();
    // Room again: a later burst is taken whole.
    let more = frames[..30].iter().map(|f| (0, Arc::<[u8]>::from(&f[..])));
    assert_eq!(pfe.offer_shared(more).unwrap(), 30);
    pfe.drain();
    let stats = pfe.stats();
    assert_eq!(stats.packets_in, 1031);
    assert_eq!(
        stats.dropped_by_reason.get("rx_full"),
        Some(&950),
        "{stats:?}"
    );
    assert_eq!(stats.dropped_by_reason.get("runt"), Some(&1));
    assert_eq!(stats.packets_out, 80);
    assert_eq!(sink.total_packets(), 80);
    assert!(stats.is_conserved(), "{stats:?}");
}

/// With latency on, every packet that leaves is timed from ingress to egress on the
/// engine's clock, drops are not; without it there is no summary. A manual clock the
/// program advances makes each packet take exactly 1 us; a burst queues, and the packets
/// behind wait for those ahead.
#[test]
fn latency_is_measured_from_ingress_to_egress_for_packets_that_leave() {
    for reorder in [true, false] {
        let clock = Arc::new(pfemu::timer::ManualClock::new());
        let c = clock.clone();
        let gate = Arc::new(AtomicBool::new(true));
        let g = gate.clone();
        let mut p = Program::builder("timed");
        let a = p.label("a");
        let odd = p.drop_reason("odd");
        p.instr(a, move |t| {
            while !g.load(Ordering::Acquire) {
                std::thread::yield_now();
            }
            c.advance(1_000);
            let seq = t.lm_bytes(pfemu::program::DEFAULT_HEAD_OFFSET + 46, 4)?[3];
            Ok(Done(if seq % 2 == 0 {
                Verdict::Forward(0)
            } else {
                Verdict::Drop(odd)
            }))
        });
        p.entry(Entry::Packet, a);
        let mut pfe = Pfe::builder()
            .program(p.build().unwrap())
            .ppe_threads(1)
            .batch_size(1)
            .max_batch_size(1)
            .reorder(reorder)
            .clock(clock)
            .latency(true)
            .build()
            .unwrap();
        pfe.start().unwrap();
        // One at a time, so that no packet queues behind another.
        for i in 0..200 {
            pfe.inject_frame(0, &udp_frame(1, i, 64)).unwrap();
            pfe.drain();
        }
        let l = pfe.stats().latency.expect("measured");
        assert_eq!(l.count, 100, "reorder {reorder}: {l:?}");
        assert!((990..=1010).contains(&l.p50_ns), "{l:?}");
        assert!((990..=1010).contains(&l.max_ns), "{l:?}");
        pfe.reset_latency();
        assert_eq!(pfe.stats().latency.unwrap().count, 0);
        // A burst of 200 all stamped before the first is processed (the gate is shut):
        // packet k leaves k + 1 us after the burst came in, and the even ones leave.
        gate.store(false, Ordering::Release);
        let frames: Vec<Vec<u8>> = (0..200).map(|i| udp_frame(1, i, 64)).collect();
        pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
            .unwrap();
        gate.store(true, Ordering::Release);
        pfe.drain();
        let l = pfe.stats().latency.unwrap();
        assert_eq!(l.count, 100);
        let near = |v: u64, want: u64| v.abs_diff(want) * 100 <= want;
        assert!(near(l.min_ns, 1_000) && near(l.max_ns, 199_000), "{l:?}");
        assert!(near(l.p50_ns, 99_000), "{l:?}");
    }
    let mut pfe = Pfe::builder().program(forward_all(0)).build().unwrap();
    pfe.start().unwrap();
    pfe.inject_frame(0, &udp_frame(1, 0, 64)).unwrap();
    pfe.drain();
    assert_eq!(pfe.stats().latency, None);
}

/// `Thread::fetch_add` is a 64-bit fetch-and-add on shared memory, counted as a `fetch_add`
/// XTXN: every packet adds its length to one word, whose high half takes the carries.
#[test]
fn programs_fetch_add_64_bit_words_counted_as_xtxns() {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let word = mem.alloc("sum", Region::Sram, 1).unwrap();
    mem.write_u64(word, u64::from(u32::MAX)).unwrap();
    let mut p = Program::builder("sum");
    let a = p.label("a");
    p.instr(a, move |t| {
        let len = t.pkt_len() as u64;
        t.fetch_add(word, len)?;
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, a);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .memory(mem.clone())
        .ppe_threads(4)
        .build()
        .unwrap();
    pfe.start().unwrap();
    for _ in 0..1000 {
        pfe.inject(Packet::new(0, vec![0; 100])).unwrap();
    }
    pfe.drain();
    assert_eq!(mem.read_u64(word), Ok(u64::from(u32::MAX) + 100_000));
    let stats = pfe.shutdown();
    assert_eq!(stats.xtxns.get("fetch_add"), Some(&1000));
    assert!(stats.is_conserved());
}
