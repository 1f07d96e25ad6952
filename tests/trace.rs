//! The per-packet trace: which packets are traced (ports, a predicate, sampling, a limit),
//! what a record says (instructions by label, XTXNs with addresses and values, the verdict,
//! the reorder engine's hold), and a panicking predicate traces nothing and harms nothing.

mod common;

use std::sync::Arc;

use pfemu::pfe::{ChannelTraceSink, TraceConfig, TraceRecord};
use pfemu::prelude::*;
use pfemu::program::LOCAL_MEMORY_BYTES;

use common::{ether_frame, udp_frame};

/// The filter on a PFE tracing what `configure` selects; `frames` (port, frame) injected;
/// the records, the stats and the filter's counter base.
fn run(
    frames: &[(u16, Vec<u8>)],
    configure: impl FnOnce(TraceConfig) -> TraceConfig,
    reorder: bool,
) -> (Vec<TraceRecord>, Stats, u64) {
    let (builder, filter) = common::filter_engine();
    let (sink, rx) = ChannelTraceSink::new(1 << 16);
    let sink = Arc::new(sink);
    let mut pfe = builder
        .ppe_threads(2)
        .reorder(reorder)
        .trace(configure(TraceConfig::new(sink.clone())))
        .build()
        .expect("a valid engine");
    pfe.start().expect("starts");
    pfe.inject_burst(frames.iter().map(|(p, f)| (*p, f.as_slice())))
        .expect("running");
    let stats = pfe.shutdown();
    assert_eq!(sink.lost(), 0);
    (rx.try_iter().collect(), stats, filter.drop_cnt_base())
}

fn mix(n: u32) -> Vec<(u16, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let port = (i % 2) as u16;
            let frame = if i % 5 == 0 {
                ether_frame(0x0806, 64) // ARP: non-IP, dropped and counted
            } else {
                udp_frame((i % 7) as u16, i, 64)
            };
            (port, frame)
        })
        .collect()
}

#[test]
fn a_record_says_what_the_program_did() {
    let frames = mix(40);
    let (records, stats, base) = run(
        &frames,
        |mut c| {
            c.ports = vec![1];
            c
        },
        true,
    );
    assert!(stats.is_conserved());
    // Every packet of port 1, and no other.
    assert_eq!(records.len(), 20);
    assert!(records.iter().all(|r| r.port == 1 && r.len == 64));
    for r in &records {
        match r.verdict.as_str() {
            "forward 1" => {
                assert_eq!(
                    r.instructions,
                    ["process_ether", "process_ip", "forward_packet"]
                );
                assert!(r.xtxns.is_empty());
            }
            "drop non_ip" => {
                assert_eq!(
                    r.instructions,
                    ["process_ether", "count_dropped", "drop_packet"]
                );
                // The posted counter increment, at the non-IP counter.
                assert_eq!(r.xtxns.len(), 1);
                assert_eq!((r.xtxns[0].kind, r.xtxns[0].addr), ("counter_inc", base));
            }
            other => panic!("unexpected verdict {other}"),
        }
        let text = r.to_string();
        assert!(text.starts_with("packet port 1 len 64"), "{text}");
        assert!(
            text.contains("  instr process_ether\n") && text.contains("  verdict "),
            "{text}"
        );
    }
    // Port 1 gets i = 1, 3, 5, ...: the ARP frames are i = 5, 15, 25, 35.
    assert_eq!(
        records
            .iter()
            .filter(|r| r.verdict == "drop non_ip")
            .count(),
        4
    );
}

#[test]
fn a_predicate_sampling_and_a_limit_choose_the_packets() {
    let frames = mix(300);
    // Only the flow with UDP source port 3 (the predicate reads the frame), one in 2.
    let (records, _, _) = run(
        &frames,
        |mut c| {
            c.select = Some(Arc::new(|_port, f: &[u8]| {
                f.len() >= 36 && f[34..36] == [0, 3]
            }));
            c.one_in = 2;
            c
        },
        true,
    );
    let flow3 = frames
        .iter()
        .filter(|(_, f)| f.len() >= 36 && f[12..14] == [8, 0] && f[34..36] == [0, 3])
        .count();
    assert_eq!(records.len(), flow3.div_ceil(2));
    // A limit stops the records, not the packets.
    let (records, stats, _) = run(
        &frames,
        |mut c| {
            c.limit = 7;
            c
        },
        false,
    );
    assert_eq!(records.len(), 7);
    assert_eq!(stats.packets_in, 300);
    assert!(stats.is_conserved());
    // A predicate that panics traces nothing, and every packet still goes its way.
    let (records, stats, _) = run(
        &frames,
        |mut c| {
            c.select = Some(Arc::new(|_, _: &[u8]| panic!("a bad predicate")));
            c
        },
        true,
    );
    assert!(records.is_empty());
    assert_eq!(stats.dropped_by_reason.get("non_ip"), Some(&60));
    assert!(stats.is_conserved());
}

/// With every packet traced, the records the reorder engine held are exactly the packets
/// it held (however the threads happened to run), each with the time it waited.
#[test]
fn held_packets_are_the_records_marked_held() {
    let frames: Vec<(u16, Vec<u8>)> = (0..20_000u32)
        .map(|i| (0, udp_frame((i % 4) as u16, i, 64)))
        .collect();
    let (records, stats, _) = run(&frames, |c| c, true);
    assert_eq!(records.len(), 20_000);
    let held = records.iter().filter(|r| r.held).count() as u64;
    assert_eq!(held, stats.reorder_held);
    assert!(records
        .iter()
        .filter(|r| !r.held)
        .all(|r| r.reorder_wait_ns == 0));
    // Per flow, the records' sequence numbers are every packet's, once.
    let mut seqs: Vec<(u32, u32)> = records.iter().map(|r| r.flow).collect();
    seqs.sort_unstable();
    seqs.dedup();
    assert_eq!(seqs.len(), 20_000);
}

/// Ingress gives a frame the same reorder context however the frame is handed to it: in
/// one slice, in two pieces cut anywhere (the 5-tuple's bytes included), or by reference.
/// The trace names each packet's context, and each frame here has a length of its own.
#[test]
fn a_frame_has_its_flow_context_however_it_is_given() {
    let frames: Vec<Vec<u8>> = (0..24u16)
        .map(|i| {
            let mut f = match i % 4 {
                3 => ether_frame(0x0806, 64), // non-IP: the port's context
                _ => udp_frame(i, u32::from(i), 64),
            };
            f.resize(64 + usize::from(i), 0);
            if i % 4 == 1 {
                f[23] = 6; // TCP: still ports at the same place
            }
            if i % 4 == 2 {
                f[26..30].copy_from_slice(&[192, 168, 0, i as u8]); // another source
            }
            f
        })
        .collect();
    let contexts = |inject: &dyn Fn(&Pfe)| -> Vec<(usize, u32)> {
        let (builder, _) = common::filter_engine();
        let (sink, rx) = ChannelTraceSink::new(1 << 10);
        let mut pfe = builder
            .ppe_threads(2)
            .trace(TraceConfig::new(Arc::new(sink)))
            .build()
            .expect("a valid engine");
        pfe.start().expect("starts");
        inject(&pfe);
        pfe.drain();
        let mut by_len: Vec<(usize, u32)> = rx.try_iter().map(|r| (r.len, r.flow.0)).collect();
        by_len.sort();
        pfe.shutdown();
        by_len
    };
    let whole = contexts(&|pfe| {
        pfe.inject_burst(frames.iter().map(|f| (1, f.as_slice())))
            .expect("running");
    });
    assert_eq!(whole.len(), frames.len(), "every frame traced once");
    let distinct: std::collections::HashSet<u32> = whole.iter().map(|&(_, c)| c).collect();
    assert!(
        distinct.len() > 10,
        "the flows spread over contexts: {whole:?}"
    );
    for cut in [0, 13, 14, 23, 26, 30, 34, 36, 38, 64] {
        let cut_in_two = contexts(&|pfe| {
            pfe.inject_burst(frames.iter().map(|f| (1, (&f[..cut], &f[cut..]))))
                .expect("running");
        });
        assert_eq!(cut_in_two, whole, "frames cut at byte {cut}");
    }
    let shared = contexts(&|pfe| {
        pfe.inject_shared(frames.iter().map(|f| (1, Arc::from(f.as_slice()))))
            .expect("running");
    });
    assert_eq!(shared, whole, "frames given by reference");
}

/// Forwards to port 1 every packet but those whose UDP sequence number is a multiple of
/// 3, which read past local memory and fault.
fn faulting_every_third() -> Program {
    let mut p = Program::builder("faulty");
    let check = p.label("check");
    let forward = p.label("forward");
    p.instr(check, move |t| {
        let seq = u32::from_be_bytes(t.head(46)?[..4].try_into().expect("4 bytes"));
        if seq % 3 == 0 {
            t.lm_bytes(LOCAL_MEMORY_BYTES, 1)?;
        }
        Ok(Goto(forward))
    });
    p.instr(forward, |_t| Ok(Done(Verdict::Forward(1))));
    p.entry(Entry::Packet, check);
    p.build().expect("a valid program")
}

/// A traced packet whose thread faulted says which fault, and the packet after it in the
/// same batch says its own verdict, not the fault before it.
#[test]
fn a_record_of_a_faulting_thread_names_the_fault() {
    let (sink, rx) = ChannelTraceSink::new(1 << 16);
    let sink = Arc::new(sink);
    let mut pfe = Pfe::builder()
        .program(faulting_every_third())
        .ppe_threads(2)
        .trace(TraceConfig::new(sink.clone()))
        .build()
        .expect("a valid engine");
    pfe.start().expect("starts");
    let frames: Vec<Vec<u8>> = (0..60u32).map(|i| udp_frame(0, i, 64)).collect();
    pfe.inject_burst(frames.iter().map(|f| (0, f.as_slice())))
        .expect("running");
    let stats = pfe.shutdown();
    assert_eq!(sink.lost(), 0);
    assert!(stats.is_conserved());
    assert_eq!(stats.faults_of(FaultKind::LocalMemory), 20);
    assert_eq!(stats.packets_out, 40);
    let records: Vec<TraceRecord> = rx.try_iter().collect();
    assert_eq!(records.len(), 60);
    // One flow, so the records come in sequence order: a fault, then two forwards.
    for (i, r) in records.iter().enumerate() {
        if i % 3 == 0 {
            assert!(
                r.verdict
                    .starts_with("fault: local-memory access of 1 bytes"),
                "packet {i}: {}",
                r.verdict
            );
        } else {
            assert_eq!(r.verdict, "forward 1", "packet {i}");
        }
        assert_eq!(r.instructions.len(), if i % 3 == 0 { 1 } else { 2 });
    }
}
