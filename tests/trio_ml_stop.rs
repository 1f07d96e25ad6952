//! A graceful stop (`TrioMl::finish_open_blocks`) waits for the open blocks as long as the
//! timers are scanning, however slowly: blocks age by scans, so the patience counts scans.

mod common;

use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pfemu::microcode::trio_ml::wire::{self, AggPacket, TrioMlHdrFields};
use pfemu::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use pfemu::prelude::*;
use pfemu::timer::ManualClock;

const LOCAL: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
const MS: u64 = 1_000_000;

fn packet(job: u8, block: u32, src: u8, grads: &[i32]) -> Vec<u8> {
    wire::agg_packet(&AggPacket {
        endpoints: common::worker_endpoints(src, LOCAL, TrioMlConfig::default().udp_port),
        hdr: TrioMlHdrFields {
            job_id: job,
            block_id: block,
            src_id: src,
            grad_cnt: grads.len() as u16,
            ..Default::default()
        },
        gradients: grads,
    })
}

/// The engine's timers run one scan per 10 ms of wall time (a starved machine's pace), so
/// the block's 5 ms timeout takes about 60 ms of wall time to pass; a patience of 20 ms read
/// as wall time gave up first. Read as 20 scans, it waits, and the partial Result goes out.
#[test]
fn a_stop_waits_for_open_blocks_while_slow_timers_still_scan() {
    let clock = Arc::new(ManualClock::new());
    let cfg = TrioMlConfig {
        local_addr: LOCAL,
        timers: 2,
        scan_period_ns: MS,
        ..TrioMlConfig::default()
    };
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(&mem, cfg).unwrap();
    trio.add_job(&JobConfig {
        job_id: 1,
        sources: vec![0, 1, 2],
        block_exp_ms: 5,
        out_dest: Dest::Port(3),
        ..JobConfig::default()
    })
    .unwrap();
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(trio.program())
        .ppe_threads(4)
        .memory(mem)
        .timers(trio.timer_specs().unwrap())
        .clock(clock.clone())
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.inject_frame(0, &packet(1, 7, 0, &[1, 2, 3])).unwrap();
    pfe.drain();
    assert_eq!(trio.active_blocks().unwrap().len(), 1);

    let done = AtomicBool::new(false);
    let left = std::thread::scope(|s| {
        s.spawn(|| {
            // One scan period per 10 ms, each scan finished before the next: slow, but every
            // step is a scan the block ages by. Bounded, so a broken wait cannot hang here.
            for step in 1..=10_000u64 {
                if done.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
                clock.set(step * MS);
                pfe.settle_timers();
            }
        });
        let left = trio
            .finish_open_blocks(&pfe, Duration::from_millis(20))
            .unwrap();
        done.store(true, Ordering::Release);
        left
    });
    assert_eq!(left, 0, "the open block was given up on");
    let out: Vec<Packet> = rx.try_iter().collect();
    assert_eq!(out.len(), 1, "one partial Result");
    let (h, g) = wire::parse(&out[0].data).unwrap();
    assert_eq!(
        (h.job_id, h.block_id, h.src_cnt, h.degraded),
        (1, 7, 1, true)
    );
    assert_eq!(wire::gradients(g), [1, 2, 3]);
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
}
