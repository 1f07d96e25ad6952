//! End hosts against a running PFE: allreduce of real vectors, loss recovery under drop and
//! duplicate faults, partial results when a worker straggles, generations across
//! allreduces, and hierarchical aggregation over a chassis giving the flat sums.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Duration;

use pfemu::microcode::trio_ml::host::{
    port_channels, run_workers, Attached, DriveOptions, Lossy, Payloads, Received, Scaling, Worker,
    WorkerConfig,
};
use pfemu::microcode::trio_ml::{wire, JobConfig, TrioMl, TrioMlConfig};
use pfemu::pfe::{Chassis, ChassisFabric, FabricStats, Frames};
use pfemu::prelude::*;
use pfemu::timer::ManualClock;

const JOB: u8 = 1;

fn values(src: u8, n: usize) -> Vec<i32> {
    (0..n)
        .map(|i| ((i as i32 * 7919 + i32::from(src) * 104_729) % 20_001) - 10_000)
        .collect()
}

fn flat_sums(srcs: &[u8], n: usize) -> Vec<i32> {
    let mut s = vec![0i32; n];
    for &src in srcs {
        for (a, v) in s.iter_mut().zip(values(src, n)) {
            *a = a.wrapping_add(v);
        }
    }
    s
}

struct Flat {
    pfe: Pfe,
    rxs: Vec<crossbeam_channel::Receiver<Vec<u8>>>,
    trio: TrioMl,
}

/// One PFE running Trio-ML with job `JOB` of `sources` on ports `0..sources`, Results
/// multicast to all of them. With `timers`, its scan timers run on that manual clock (which
/// only the test moves, so blocks age the same on any machine); without, blocks never age.
fn flat(sources: u8, window: usize, block_exp_ms: u8, timers: Option<Arc<ManualClock>>) -> Flat {
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            timers: 10,
            ..TrioMlConfig::default()
        },
    )
    .unwrap();
    let srcs: Vec<u8> = (0..sources).collect();
    trio.add_job(&JobConfig {
        job_id: JOB,
        sources: srcs.clone(),
        block_cnt_max: (2 * window) as u16,
        block_grad_max: 256,
        block_exp_ms,
        out_dest: Dest::Group(0),
        ..JobConfig::default()
    })
    .unwrap();
    let (sink, rxs) = port_channels(usize::from(sources));
    let mut b = Pfe::builder()
        .program(trio.program())
        .ppe_threads(64)
        .memory(mem)
        .multicast_group(0, srcs.iter().map(|&s| u16::from(s)).collect::<Vec<_>>())
        .sink(Arc::new(sink));
    if let Some(clock) = timers {
        b = b.timers(trio.timer_specs().unwrap()).clock(clock);
    }
    let mut pfe = b.build().unwrap();
    pfe.start().unwrap();
    Flat { pfe, rxs, trio }
}

fn worker_cfg(src: u8, window: usize, retransmit_ms: Option<u64>) -> WorkerConfig {
    WorkerConfig {
        grads_per_packet: 256,
        window,
        retransmit_after_ns: retransmit_ms.map(|ms| ms * 1_000_000),
        ..WorkerConfig::new(JOB, src, TrioMlConfig::default().local_addr)
    }
}

/// A sender on a UDP socket sees the same packets through `poll_payloads` and
/// `on_payload_at` as one that builds frames, only without the Ethernet, IPv4 and UDP
/// headers.
#[test]
fn payloads_are_the_packets_without_their_headers() {
    let n = 256 * 5 + 17;
    let (mut framed, mut bare) = (
        Worker::new(worker_cfg(2, 4, Some(10)), values(2, n)).unwrap(),
        Worker::new(worker_cfg(2, 4, Some(10)), values(2, n)).unwrap(),
    );
    let mut frames = Vec::new();
    let mut payloads = Payloads::new();
    // First the window, then (20 ms later, retransmission at 10 ms) the same again.
    for now in [0, 20_000_000] {
        frames.clear();
        payloads.clear();
        framed.poll(now, &mut frames);
        bare.poll_payloads(now, &mut payloads);
        assert_eq!(payloads.len(), 4);
        let unframed: Vec<&[u8]> = frames.iter().map(|f| &f[wire::TRIO_ML_HDR_AT..]).collect();
        assert_eq!(payloads.iter().collect::<Vec<_>>(), unframed);
    }
    assert_eq!(framed.stats(), bare.stats());
    // The Result of chunk 1 (block 1): both take it, one as a frame, one as a payload.
    let sums: Vec<i32> = (0..256).map(|i| i * 3 - 100).collect();
    let (block_id, gen_id) = framed.block_of(1);
    // From the aggregator back to the worker (a frame to the aggregator is never a Result).
    let e = framed.config().endpoints;
    let back = wire::Endpoints {
        src_mac: e.dst_mac,
        dst_mac: e.src_mac,
        src_addr: e.dst_addr,
        dst_addr: e.src_addr,
        src_port: e.dst_port,
        dst_port: e.src_port,
    };
    let result = wire::agg_packet(&wire::AggPacket {
        endpoints: back,
        hdr: wire::TrioMlHdrFields {
            job_id: JOB,
            block_id,
            gen_id,
            src_cnt: 4,
            grad_cnt: 256,
            ..Default::default()
        },
        gradients: &sums,
    });
    assert_eq!(
        framed.on_frame_at(&result, 30_000_000),
        Ok(Received::Result { chunk: 1 })
    );
    let payload = &result[wire::TRIO_ML_HDR_AT..];
    assert_eq!(
        bare.on_payload_at(payload, 30_000_000),
        Ok(Received::Result { chunk: 1 })
    );
    assert_eq!(bare.sums()[256..512], sums[..]);
    assert_eq!(bare.sums(), framed.sums());
    assert_eq!(bare.src_counts(), framed.src_counts());
    // A payload cut short is not an aggregation packet.
    assert!(bare
        .on_payload_at(&payload[..payload.len() - 1], 0)
        .is_err());
    assert!(bare.on_payload_at(&payload[..5], 0).is_err());
}

#[test]
fn four_workers_allreduce_real_vectors_exactly() {
    let n = 256 * 40 + 17;
    let mut f = flat(4, 8, 200, None);
    let scaling = Scaling::for_range(10.0, 4);
    let floats: Vec<Vec<f32>> = (0..4u8)
        .map(|s| values(s, n).iter().map(|&v| v as f32 / 1000.0).collect())
        .collect();
    let attached: Vec<Attached> = (0..4u8)
        .map(|s| Attached {
            worker: Worker::from_floats(worker_cfg(s, 8, None), &floats[usize::from(s)], scaling)
                .unwrap(),
            port: u16::from(s),
            rx: f.rxs[usize::from(s)].clone(),
            opts: DriveOptions::default(),
        })
        .collect();
    let pfe = &f.pfe;
    let done = run_workers(attached, &|p, fr| pfe.inject_frame(p, fr).unwrap()).unwrap();
    for w in &done {
        assert!(w.is_done());
        assert!(w.src_counts().iter().all(|&c| c == 4));
        assert!(w.degraded().iter().all(|&d| !d));
        let mean = w.mean(scaling);
        for (i, m) in mean.iter().enumerate() {
            let want: f32 = floats.iter().map(|v| v[i]).sum::<f32>() / 4.0;
            assert!((m - want).abs() < 1e-4, "gradient {i}: {m} vs {want}");
        }
    }
    // The integer sums are exact, and every worker got the same ones.
    let ints: Vec<Vec<i32>> = floats
        .iter()
        .map(|v| v.iter().map(|&g| scaling.to_int(g)).collect())
        .collect();
    let want: Vec<i32> = (0..n).map(|i| ints.iter().map(|v| v[i]).sum()).collect();
    assert!(done.iter().all(|w| w.sums() == want));
    f.pfe.drain();
    let stats = std::mem::replace(&mut f.pfe, dummy()).shutdown();
    assert!(stats.is_conserved());
    assert_eq!(stats.dropped, 0);
    assert!(
        f.trio.active_blocks().unwrap().is_empty(),
        "every block finished"
    );
    assert_eq!(
        f.trio.kept_records(),
        8,
        "the last Result of each block id is kept"
    );
}

/// A stopped stand-in, to take the real engine out of a struct.
fn dummy() -> Pfe {
    let mut p = Program::builder("none");
    let a = p.label("a");
    p.instr(a, |_| Ok(Done(Verdict::Consume)));
    p.entry(Entry::Packet, a);
    Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(1)
        .mem_config(MemConfig {
            sram_bytes: 1 << 12,
            dram_bytes: 1 << 12,
            acc_bytes: 0,
            banks: 1,
        })
        .build()
        .unwrap()
}

#[test]
fn loss_and_duplicates_both_ways_still_give_exact_sums() {
    let n = 256 * 60;
    let f = flat(4, 8, 250, None);
    let attached: Vec<Attached> = (0..4u8)
        .map(|s| Attached {
            worker: Worker::new(worker_cfg(s, 8, Some(3)), values(s, n)).unwrap(),
            port: u16::from(s),
            rx: f.rxs[usize::from(s)].clone(),
            opts: DriveOptions {
                uplink: Some(Lossy::new(0.05, 0.05, 11 + u64::from(s))),
                downlink: Some(Lossy::new(0.05, 0.05, 101 + u64::from(s))),
                give_up_after: Duration::from_secs(20),
            },
        })
        .collect();
    let pfe = &f.pfe;
    let done = run_workers(attached, &|p, fr| pfe.inject_frame(p, fr).unwrap()).unwrap();
    let want = flat_sums(&[0, 1, 2, 3], n);
    let mut retransmitted = 0;
    for w in &done {
        assert_eq!(w.sums(), want, "worker {}", w.config().src_id);
        assert!(w.src_counts().iter().all(|&c| c == 4));
        retransmitted += w.stats().retransmitted;
    }
    assert!(retransmitted > 0, "the faults forced retransmissions");
    pfe.drain();
    let stats = pfe.stats();
    assert!(stats.is_conserved());
    // Duplicates and retransmissions were recognised, never added twice. A copy that
    // reaches a PPE thread only after its block id's next generation finished is
    // `stale_gen` (packets of one worker are processed in parallel, so a resent chunk can
    // be overtaken by the worker's next one), or `result_expired` when it arrives while
    // that next generation finishes and replaces the kept Result it was being answered
    // with; nothing else is dropped.
    assert!(stats.drops("duplicate") + stats.drops("retransmit_answered") > 0);
    assert_eq!(
        stats.dropped,
        stats.drops("duplicate")
            + stats.drops("retransmit_answered")
            + stats.drops("stale_gen")
            + stats.drops("result_expired"),
        "{:?}",
        stats.dropped_by_reason
    );
}

#[test]
fn a_straggler_is_left_out_of_a_partial_result_and_the_mean_divides_by_three() {
    let n = 256 * 4;
    // The engine's timers run on a clock the test moves itself: the three senders are all
    // in before any time passes, however busy the machine (on the system clock a sender
    // held up past the timeout would miss its block, and the counts below would be 2).
    const MS: u64 = 1_000_000;
    let clock = Arc::new(ManualClock::new());
    let f = flat(4, 4, 5, Some(clock.clone()));
    // Worker 3 never sends: every block ages out with the three others in.
    let workers: Vec<Worker> = (0..3u8)
        .map(|s| Worker::new(worker_cfg(s, 4, None), values(s, n)).unwrap())
        .collect();
    // Ten staggered scan timers: one launches every tenth of the 1 ms scan period.
    let scan = TrioMlConfig::default().scan_period_ns;
    let done =
        common::trio_ml_on_manual_clock(&f.pfe, &f.rxs, &clock, workers, scan / 10, 100 * MS);
    let want = flat_sums(&[0, 1, 2], n);
    for w in &done {
        assert_eq!(w.sums(), want);
        assert!(w.src_counts().iter().all(|&c| c == 3));
        assert!(w.degraded().iter().all(|&d| d));
        // Every block aged out between its timeout (5 ms after it was sent) and one scan
        // period later, and nothing else took time.
        assert_eq!(w.latencies_ns().len(), 4);
        assert!(
            w.latencies_ns()
                .iter()
                .all(|&l| (5 * MS..=5 * MS + scan).contains(&l)),
            "{:?}",
            w.latencies_ns()
        );
        let mean = w.mean(Scaling { factor: 1.0 });
        assert_eq!(mean[5], want[5] as f32 / 3.0);
    }
    // The straggler's port got the partial Results too (multicast to the whole job). The
    // senders may have their copies before the last copy to port 3 is sent: drain first.
    f.pfe.drain();
    let to_straggler: Vec<Vec<u8>> = f.rxs[3].try_iter().collect();
    assert_eq!(to_straggler.len(), 4);
    let (h, _) = wire::parse(&to_straggler[0]).unwrap();
    assert_eq!((h.degraded, h.age_op, h.src_cnt), (true, 1, 3));
}

#[test]
fn consecutive_allreduces_continue_the_generations() {
    let n = 256 * 12;
    let f = flat(2, 4, 200, None);
    let mut gens = [0u16; 2];
    for round in 0..3 {
        let attached: Vec<Attached> = (0..2u8)
            .map(|s| Attached {
                worker: Worker::new(
                    WorkerConfig {
                        first_gen: gens[usize::from(s)],
                        ..worker_cfg(s, 4, None)
                    },
                    values(s + round, n),
                )
                .unwrap(),
                port: u16::from(s),
                rx: f.rxs[usize::from(s)].clone(),
                opts: DriveOptions::default(),
            })
            .collect();
        let pfe = &f.pfe;
        let done = run_workers(attached, &|p, fr| pfe.inject_frame(p, fr).unwrap()).unwrap();
        let want = flat_sums(&[round, round + 1], n);
        for (i, w) in done.iter().enumerate() {
            assert_eq!(w.sums(), want, "round {round}");
            gens[i] = w.next_gen();
        }
    }
    assert_eq!(gens, [9, 9], "3 rounds of 12 chunks over 4 block ids");
}

#[test]
fn hierarchical_aggregation_over_a_chassis_equals_the_flat_sums() {
    hierarchical_aggregation(None);
}

/// The same aggregation with the links through a fabric of every architecture, loaded by
/// background traffic or not: the sums stay exact.
#[test]
fn hierarchical_aggregation_through_a_loaded_fabric_equals_the_flat_sums() {
    use pfemu::fabric::Architecture;
    for (i, architecture) in Architecture::FIGURE_11.into_iter().enumerate() {
        let background = if i % 2 == 0 { 0.5 } else { 0.0 };
        let s = hierarchical_aggregation(Some(ChassisFabric {
            architecture,
            background,
            cycles_per_us: 10.0,
            ..ChassisFabric::default()
        }))
        .expect("fabric counters");
        assert_eq!(s.dropped(), 0, "{architecture}: {s:?}");
        assert_eq!(s.frames_in, s.frames_out, "{architecture}: {s:?}");
        assert!(s.frames_in > 0 && (background == 0.0) == (s.background_cells == 0));
    }
}

/// Two first-level PFEs and a top-level one in a chassis (over ideal links or `fabric`),
/// four workers; checks every worker's sums; returns the fabric's counters.
fn hierarchical_aggregation(fabric: Option<ChassisFabric>) -> Option<FabricStats> {
    // Two first-level PFEs with two servers each, and a top-level PFE; servers 0,1 on
    // leaf A ports 0,1; servers 2,3 on leaf B ports 0,1. Leaves reach the top on port 60
    // (top ports 1 and 2). Configuration only: the same program everywhere.
    let n = 256 * 30 + 5;
    let top_addr = Ipv4Addr::new(10, 0, 9, 1);
    let group = Ipv4Addr::new(239, 0, 0, 1);
    let leaf_addr = [Ipv4Addr::new(10, 0, 7, 1), Ipv4Addr::new(10, 0, 8, 1)];
    let leaf_src = [11u8, 12u8];
    let window = 8;
    let mut c = Chassis::builder();
    let mut tries = Vec::new();
    let mut idx = Vec::new();
    for (l, &addr) in leaf_addr.iter().enumerate() {
        let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
        let trio = TrioMl::install(
            &mem,
            TrioMlConfig {
                local_addr: addr,
                ..TrioMlConfig::default()
            },
        )
        .unwrap();
        trio.add_job(&JobConfig {
            job_id: JOB,
            sources: vec![2 * l as u8, 2 * l as u8 + 1],
            block_cnt_max: 2 * window as u16,
            block_grad_max: 256,
            block_exp_ms: 200,
            out_src_addr: Ipv4Addr::new(10, 0, 7 + l as u8, leaf_src[l]),
            out_dst_addr: top_addr,
            out_dest: Dest::Port(60),
        })
        .unwrap();
        // The top's Result comes back down addressed to the group: forward it to the
        // servers of this leaf.
        trio.add_route(group, Dest::Group(0)).unwrap();
        let b = Pfe::builder()
            .program(trio.program())
            .ppe_threads(32)
            .memory(mem)
            .multicast_group(0, vec![0, 1]);
        idx.push(c.pfe(&format!("leaf{l}"), b));
        tries.push(trio);
    }
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let top = TrioMl::install(
        &mem,
        TrioMlConfig {
            local_addr: top_addr,
            ..TrioMlConfig::default()
        },
    )
    .unwrap();
    top.add_job(&JobConfig {
        job_id: JOB,
        sources: leaf_src.to_vec(),
        block_cnt_max: 2 * window as u16,
        block_grad_max: 256,
        block_exp_ms: 200,
        out_src_addr: top_addr,
        out_dst_addr: group,
        out_dest: Dest::Group(0),
    })
    .unwrap();
    let t = c.pfe(
        "top",
        Pfe::builder()
            .program(top.program())
            .ppe_threads(32)
            .memory(mem)
            .multicast_group(0, vec![1, 2]),
    );
    c.link((idx[0], 60), (t, 1)).link((idx[1], 60), (t, 2));
    if let Some(f) = fabric {
        c.fabric(f);
    }
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..4).map(|_| crossbeam_channel::unbounded()).unzip();
    c.sink(Arc::new(
        move |pfe: usize, port: u16, frames: Frames<'_>| {
            if pfe < 2 && port < 2 {
                for f in frames.iter() {
                    let _ = txs[2 * pfe + usize::from(port)].send(f.to_vec());
                }
            }
        },
    ));
    let chassis = c.start().unwrap();
    let attached: Vec<Attached> = (0..4u8)
        .map(|s| Attached {
            worker: Worker::new(
                WorkerConfig {
                    endpoints: wire::Endpoints {
                        dst_addr: leaf_addr[usize::from(s / 2)],
                        ..worker_cfg(s, window, None).endpoints
                    },
                    ..worker_cfg(s, window, None)
                },
                values(s, n),
            )
            .unwrap(),
            port: u16::from(s),
            rx: rxs[usize::from(s)].clone(),
            opts: DriveOptions::default(),
        })
        .collect();
    let inject = |p: u16, fr: &[u8]| {
        chassis
            .pfe(idx[usize::from(p / 2)])
            .inject_frame(p % 2, fr)
            .unwrap()
    };
    let done = run_workers(attached, &inject).unwrap();
    let want = flat_sums(&[0, 1, 2, 3], n);
    for w in &done {
        assert_eq!(w.sums(), want, "worker {}", w.config().src_id);
        // src_cnt counts the servers in the sum, through both levels.
        assert!(w.src_counts().iter().all(|&c| c == 4));
        assert!(w.degraded().iter().all(|&d| !d));
    }
    // Frames may still cross the fabric (a retransmission the workers no longer wait for,
    // under load): its counters are final once the chassis is drained.
    chassis.drain();
    let fabric = chassis.fabric_stats();
    let stats = chassis.shutdown();
    assert!(stats.iter().all(|s| s.is_conserved() && s.dropped == 0));
    let chunks = n.div_ceil(256) as u64;
    assert_eq!(stats[t].created, chunks, "one top-level Result per block");
    fabric
}

/// A worker that lost a generation's Result (its own packet and the Result's copy to it
/// were dropped) while the job went on without it (straggler mitigation: the block aged
/// out, and so did the block id's next generation, which replaced the kept Result) is told
/// the generation is gone when it sends the chunk again: it settles the chunk as lost at
/// once, counted, and takes the next chunk's Result from the kept one. Without the answer
/// its retransmissions were dropped as `stale_gen` in silence, and it waited until it gave
/// up. The engine runs on a manual clock; the workers are driven by hand (sans-IO).
#[test]
fn a_worker_asking_for_a_gone_generation_is_told_and_loses_only_that_chunk() {
    const MS: u64 = 1_000_000;
    let clock = Arc::new(pfemu::timer::ManualClock::new());
    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            timers: 1,
            scan_period_ns: MS,
            ..TrioMlConfig::default()
        },
    )
    .unwrap();
    trio.add_job(&JobConfig {
        job_id: JOB,
        sources: vec![0, 1],
        block_cnt_max: 2,
        block_grad_max: 256,
        block_exp_ms: 1,
        out_dest: Dest::Group(0),
        ..JobConfig::default()
    })
    .unwrap();
    let (sink, rxs) = port_channels(2);
    let mut pfe = Pfe::builder()
        .program(trio.program())
        .ppe_threads(2)
        .memory(mem)
        .multicast_group(0, vec![0, 1])
        .timers(trio.timer_specs().unwrap())
        .clock(clock.clone())
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    // Two chunks of 4 values, one block id: chunk 1 is block 0's generation 1.
    let cfg = |src| WorkerConfig {
        grads_per_packet: 4,
        ..worker_cfg(src, 1, Some(10))
    };
    let mut a = Worker::new(cfg(0), values(0, 8)).unwrap();
    let mut b = Worker::new(cfg(1), values(1, 8)).unwrap();
    let mut out = Vec::new();
    // The clock to `until` ms, a tenth of a scan period at a time, from `from` ms; what
    // each worker got meanwhile.
    let scans_to = |from: u64, until: u64| {
        for tenth in from * 10 - 9..=until * 10 {
            clock.set(tenth * MS / 10);
            pfe.settle_timers();
        }
        pfe.drain();
        (
            rxs[0].try_iter().collect::<Vec<_>>(),
            rxs[1].try_iter().collect::<Vec<_>>(),
        )
    };

    // Generation 0: B's packet is lost, the block ages out with A's alone, and B's copy of
    // the partial Result is lost too.
    a.poll(0, &mut out);
    for p in out.drain(..) {
        pfe.inject_frame(0, &p).unwrap();
    }
    b.poll(0, &mut out);
    assert_eq!(out.drain(..).count(), 1, "B's chunk 0, lost");
    let (to_a, to_b) = scans_to(1, 2);
    assert_eq!(
        (to_a.len(), to_b.len()),
        (1, 1),
        "the partial Result of generation 0"
    );
    assert_eq!(a.on_frame(&to_a[0]).unwrap(), Received::Result { chunk: 0 });
    // Generation 1: A alone again; it ages out and replaces generation 0's kept Result.
    a.poll(2 * MS, &mut out);
    for p in out.drain(..) {
        pfe.inject_frame(0, &p).unwrap();
    }
    let (to_a, _) = scans_to(3, 4);
    assert_eq!(a.on_frame(&to_a[0]).unwrap(), Received::Result { chunk: 1 });
    assert!(a.is_done());
    let kept = trio
        .kept_result(JOB, 0)
        .unwrap()
        .expect("generation 1 kept");
    assert_eq!(kept.gen_id, 1);

    // B sends chunk 0 again: generation 0 is gone, and B is told so.
    b.poll(10 * MS, &mut out);
    assert_eq!(b.stats().retransmitted, 1);
    // First a stranger (source 5, not in the job) asks for it: dropped as
    // `unknown_source`, as a stranger asking for a kept Result is, and told nothing.
    let mut stranger = out[0].clone();
    wire::TrioMlHdr::new_unchecked(&mut stranger[wire::TRIO_ML_HDR_AT..]).set_src_id(5);
    pfe.inject_frame(1, &stranger).unwrap();
    pfe.drain();
    assert_eq!(rxs[1].try_iter().count(), 0, "a stranger is told nothing");
    for p in out.drain(..) {
        pfe.inject_frame(1, &p).unwrap();
    }
    pfe.drain();
    let answers: Vec<Vec<u8>> = rxs[1].try_iter().collect();
    assert_eq!(answers.len(), 1, "the retransmission is answered");
    let (hdr, _) = wire::parse(&answers[0]).unwrap();
    assert_eq!(
        wire::Gone::of(&hdr),
        Some(wire::Gone {
            block_id: 0,
            gen_id: 0,
            run_id: 0
        })
    );
    assert_eq!(
        b.on_frame(&answers[0]).unwrap(),
        Received::Lost { chunk: 0 }
    );
    assert_eq!(b.lost(), [true, false]);
    assert_eq!(b.stats().lost, 1);
    // Its window free, B sends chunk 1 at once and is answered with the kept Result.
    b.poll(10 * MS, &mut out);
    assert_eq!(out.len(), 1);
    for p in out.drain(..) {
        pfe.inject_frame(1, &p).unwrap();
    }
    pfe.drain();
    let answers: Vec<Vec<u8>> = rxs[1].try_iter().collect();
    assert_eq!(answers.len(), 1);
    assert_eq!(
        b.on_frame(&answers[0]).unwrap(),
        Received::Result { chunk: 1 }
    );
    assert!(b.is_done());
    assert_eq!(&b.sums()[4..], &values(0, 8)[4..], "chunk 1: A's alone");
    assert_eq!(&b.sums()[..4], [0; 4], "chunk 0: lost");
    assert_eq!(b.src_counts(), [0, 1]);
    let stats = pfe.shutdown();
    assert_eq!(stats.drops("stale_gen"), 1);
    assert_eq!(stats.drops("unknown_source"), 1);
    assert_eq!(stats.drops("late"), 1);
    assert!(stats.is_conserved());
}
