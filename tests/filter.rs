//! The paper's filter on a mixed trace: exact counter values for each class.

#![cfg(feature = "lab")]

mod common;

use std::sync::Arc;

use pfemu::lab::bench::traffic::{FrameClass, Mix, Traffic, TrafficSpec};
use pfemu::prelude::*;

fn run_filter(traffic: &Traffic, threads: usize, reorder: bool) {
    let (builder, filter) = common::filter_engine();
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = builder
        .ppe_threads(threads)
        .reorder(reorder)
        .sink(sink.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.inject_burst(traffic.iter().map(|f| (0, f))).unwrap();
    pfe.drain();

    let counts = filter.counts(pfe.memory()).unwrap();
    assert_eq!(counts.non_ip, traffic.count(FrameClass::NonIp));
    assert_eq!(counts.ip_options, traffic.count(FrameClass::Ipv4Options));
    let (ipv4, ipv4_bytes) = traffic.count(FrameClass::Ipv4);
    assert_eq!(sink.packets(1), ipv4);
    assert_eq!(sink.bytes(1), ipv4_bytes);
    assert_eq!(
        sink.total_packets(),
        ipv4,
        "the filter forwards to port 1 only"
    );

    let stats = pfe.shutdown();
    assert_eq!(stats.packets_in, traffic.len() as u64);
    assert_eq!(stats.packets_out, ipv4);
    assert_eq!(stats.drops("non_ip"), counts.non_ip.0);
    assert_eq!(stats.drops("ip_options"), counts.ip_options.0);
    assert!(stats.is_conserved());
    assert_eq!(stats.in_flight, 0);
    // process_ether, process_ip, forward_packet for IPv4; three or four for the others.
    let expected_instr = 3 * ipv4 + 4 * counts.ip_options.0 + 3 * counts.non_ip.0;
    assert_eq!(stats.instructions, expected_instr);
    assert_eq!(
        stats.xtxns.get("counter_inc").copied().unwrap_or(0),
        counts.ip_options.0 + counts.non_ip.0
    );
}

#[test]
fn filter_counts_each_class_exactly() {
    let traffic = Traffic::generate(&TrafficSpec {
        packets: 50_000,
        frame_size: 64,
        flows: 1024,
        ..Default::default()
    })
    .unwrap();
    assert!(traffic.count(FrameClass::NonIp).0 > 0 && traffic.count(FrameClass::Ipv4Options).0 > 0);
    run_filter(&traffic, 2, true);
}

#[test]
fn filter_counts_exactly_with_many_threads_large_frames_and_no_reorder() {
    let spec = TrafficSpec {
        packets: 20_000,
        frame_size: 1500,
        flows: 64,
        mix: Mix {
            ipv4: 40,
            ipv4_options: 30,
            ipv6: 0,
            non_ip: 30,
        },
        seed: 9,
        ..Default::default()
    };
    let traffic = Traffic::generate(&spec).unwrap();
    run_filter(&traffic, 256, true);
    run_filter(&traffic, 16, false);
}

/// An IPv4 EtherType on a frame too short for the 20-byte IPv4 header (14 to 33 bytes, all
/// past ingress's runt check) is malformed, not an engine fault: the filter drops it as
/// `truncated` and counts it on its own counter, after the paper's two.
#[test]
fn truncated_ipv4_frames_are_dropped_and_counted_not_faulted() {
    use pfemu::microcode::filter::{Filter, FilterCounts};
    use pfemu::program::Harness;

    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let filter = Filter::install(&mem).unwrap();
    let program = filter.program();
    let mut h = Harness::new(Arc::clone(&mem));
    let mut bytes = 0;
    for len in 14..34usize {
        let frame = common::udp_frame(1, 0, 64)[..len].to_vec();
        let out = h.run(&program, 0, &frame);
        match out.result {
            Ok(Verdict::Drop(r)) => assert_eq!(program.drop_reason_name(r), "truncated"),
            other => panic!("{len}-byte IPv4 frame: {other:?}"),
        }
        bytes += len as u64;
    }
    // The 34-byte frame holds the whole header: forwarded.
    let whole = common::udp_frame(1, 0, 64)[..34].to_vec();
    assert_eq!(h.run(&program, 0, &whole).result, Ok(Verdict::Forward(1)));
    assert_eq!(
        filter.counts(&mem).unwrap(),
        FilterCounts {
            non_ip: (0, 0),
            ip_options: (0, 0),
            truncated: (20, bytes),
        }
    );
}
