//! Property test: random packets through every shipped program on a running PFE (several
//! PPE threads, Trio-ML's timer threads on). Whatever the bytes, every packet in is
//! accounted for out (forwarded, consumed or dropped with a reason), no program faults,
//! and the engine keeps running.

use std::net::Ipv4Addr;
use std::sync::Arc;

use proptest::prelude::*;

use pfemu::fpisa::Variant;
use pfemu::microcode::filter::Filter;
use pfemu::microcode::fpisa;
use pfemu::microcode::l3fwd::{write_udp_frame, L3fwd, RouteTable};
use pfemu::microcode::trio_ml::wire::{self, AggPacket, Endpoints, TrioMlHdrFields};
use pfemu::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use pfemu::prelude::*;

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, Debug)]
enum Shipped {
    Filter,
    L3fwd,
    TrioMl,
    Fpisa,
}

/// A started engine running `which` (and Trio-ML's control plane, kept alive with it).
fn engine(which: Shipped) -> (Pfe, Option<TrioMl>) {
    let small = MemConfig {
        sram_bytes: MIB,
        dram_bytes: MIB,
        acc_bytes: 0,
        banks: 16,
    };
    let (program, mem, trio) = match which {
        Shipped::Filter => {
            let mem = Arc::new(SharedMemory::new(&small).unwrap());
            (Filter::install(&mem).unwrap().program(), mem, None)
        }
        Shipped::L3fwd => {
            // tbl24 is 32 MiB of DRAM, plus room for the tbl8 groups.
            let mem = Arc::new(
                SharedMemory::new(&MemConfig {
                    dram_bytes: 40 * MIB,
                    ..small
                })
                .unwrap(),
            );
            let routes = RouteTable::generate(256, 4, 1).unwrap();
            (L3fwd::install(&mem, &routes).unwrap().program(), mem, None)
        }
        Shipped::TrioMl | Shipped::Fpisa => {
            let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
            let trio = match which {
                Shipped::TrioMl => TrioMl::install(
                    &mem,
                    TrioMlConfig {
                        timers: 4,
                        ..TrioMlConfig::default()
                    },
                ),
                _ => fpisa::install(&mem, Variant::Full),
            }
            .unwrap();
            trio.add_job(&JobConfig {
                job_id: 1,
                sources: vec![0, 1, 2, 3],
                block_cnt_max: 16,
                block_grad_max: 64,
                block_exp_ms: 2,
                out_dest: Dest::Port(1),
                ..JobConfig::default()
            })
            .unwrap();
            (trio.program(), mem, Some(trio))
        }
    };
    let mut b = Pfe::builder()
        .program(program)
        .memory(mem)
        .ppe_threads(3)
        .ports(8);
    if let Some(t) = &trio {
        b = b.timers(t.timer_specs().unwrap());
    }
    let mut pfe = b.build().unwrap();
    pfe.start().unwrap();
    (pfe, trio)
}

/// A frame the programs' parsers get into: random bytes, an IPv4/UDP frame with random
/// addresses and payload, one cut short inside its headers, or a Trio-ML packet with random (mostly plausible) fields.
fn frame_strategy() -> impl Strategy<Value = (u16, Vec<u8>)> {
    let raw = proptest::collection::vec(any::<u8>(), 0..200);
    let ipv4 = (any::<u32>(), any::<u8>(), 42usize..300, any::<u64>()).prop_map(
        |(dst, ttl, size, seed)| {
            let mut f = vec![0u8; size];
            for (i, b) in f.iter_mut().enumerate() {
                *b = (seed.rotate_left(i as u32 % 64) >> (i % 8)) as u8;
            }
            write_udp_frame(&mut f, dst, 0x0A00_0001, 1024, ttl);
            f
        },
    );
    let agg = (
        prop_oneof![Just(1u8), Just(2u8), any::<u8>()],
        0u8..6,
        0u32..8,
        0u16..3,
        proptest::collection::vec(any::<i32>(), 0..70),
        any::<bool>(),
        prop_oneof![4 => Just(0usize), 1 => 1usize..4],
    )
        .prop_map(
            |(job_id, src_id, block_id, gen_id, grads, degraded, chop)| {
                let cfg = TrioMlConfig::default();
                let mut f = wire::agg_packet(&AggPacket {
                    endpoints: Endpoints {
                        src_mac: [2, 0, 0, 0, 0, src_id],
                        dst_mac: cfg.local_mac,
                        src_addr: Ipv4Addr::new(10, 1, 0, src_id),
                        dst_addr: cfg.local_addr,
                        src_port: 40_000,
                        dst_port: cfg.udp_port,
                    },
                    hdr: TrioMlHdrFields {
                        job_id,
                        block_id,
                        age_op: 0,
                        final_block: false,
                        degraded,
                        src_id,
                        src_cnt: 0,
                        gen_id,
                        grad_cnt: grads.len() as u16,
                        ..Default::default()
                    },
                    gradients: &grads,
                });
                // One in five truncated.
                let keep = f.len().saturating_sub(chop * 3);
                f.truncate(keep);
                f
            },
        );
    // IPv4 frames cut inside their IPv4 or UDP header (random bytes almost never carry the
    // IPv4 EtherType at these lengths).
    let short_ipv4 = (14usize..42, any::<u32>()).prop_map(|(len, dst)| {
        let mut f = vec![0u8; 64];
        write_udp_frame(&mut f, dst, 0x0A00_0001, 1024, 64);
        f.truncate(len);
        f
    });
    (
        0u16..8,
        prop_oneof![1 => raw, 1 => ipv4, 1 => short_ipv4, 3 => agg],
    )
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_packet_through_every_shipped_program_is_accounted_for(
        frames in proptest::collection::vec(frame_strategy(), 1..300),
    ) {
        for which in [Shipped::Filter, Shipped::L3fwd, Shipped::TrioMl, Shipped::Fpisa] {
            let (pfe, trio) = engine(which);
            pfe.inject_burst(frames.iter().map(|(p, f)| (*p, f.as_slice())))
                .unwrap();
            pfe.drain();
            let s = pfe.shutdown();
            drop(trio);
            prop_assert_eq!(s.packets_in, frames.len() as u64, "{:?}", which);
            prop_assert!(s.is_conserved(), "{:?}: {:?}", which, s);
            prop_assert_eq!(s.in_flight, 0);
            prop_assert!(s.faults.is_empty(), "{:?}: {:?}", which, s.faults);
            prop_assert_eq!(
                s.dropped,
                s.dropped_by_reason.values().sum::<u64>(),
                "{:?}", which
            );
        }
    }
}
