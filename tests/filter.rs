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
