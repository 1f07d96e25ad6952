//! FPISA aggregation through a running PFE: Trio-ML's program with FPISA lanes, end hosts
//! sending native floats. Exact sums for values FPISA adds exactly, the documented error
//! bound otherwise, partial results dividing by the senders, and FPISA-A's events counted.
//! And every public form of the arithmetic against a reference written from the paper alone.

#![cfg(feature = "lab")]

mod common;

use std::sync::Arc;

use proptest::prelude::*;

use pfemu::fpisa::{Acc, Format, Variant};
use pfemu::microcode::trio_ml::host::{
    port_channels, run_workers, Attached, DriveOptions, Worker, WorkerConfig,
};
use pfemu::microcode::trio_ml::{JobConfig, Lanes, TrioMl, TrioMlConfig};
use pfemu::prelude::*;
use pfemu::timer::ManualClock;

const JOB: u8 = 1;
const GRADS: usize = 256;

struct Rig {
    pfe: Pfe,
    rxs: Vec<crossbeam_channel::Receiver<Vec<u8>>>,
    trio: TrioMl,
    /// Gradients a block (and a packet) carries.
    grads: usize,
    /// The clock the scan timers run on, when there are timers: moved by [`allreduce`]
    /// alone, so blocks age the same on any machine.
    clock: Option<Arc<ManualClock>>,
}

/// One PFE with FPISA lanes in `variant`, job `JOB` of `sources` on ports `0..sources`;
/// with `timers`, blocks age out after that many ms of a manual clock (without, never).
fn rig(sources: u8, window: usize, variant: Variant, timers: Option<u8>) -> Rig {
    rig_sized(
        sources,
        window,
        variant,
        timers,
        GRADS,
        &MemConfig::default(),
    )
}

/// [`rig`] with blocks of `grads` gradients, in memories of `mem`.
fn rig_sized(
    sources: u8,
    window: usize,
    variant: Variant,
    timers: Option<u8>,
    grads: usize,
    mem: &MemConfig,
) -> Rig {
    let mem = Arc::new(SharedMemory::new(mem).unwrap());
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            timers: 10,
            lanes: Lanes::Fpisa(variant),
            ..TrioMlConfig::default()
        },
    )
    .unwrap();
    let srcs: Vec<u8> = (0..sources).collect();
    trio.add_job(&JobConfig {
        job_id: JOB,
        sources: srcs.clone(),
        block_cnt_max: (2 * window) as u16,
        block_grad_max: grads as u16,
        block_exp_ms: timers.unwrap_or(200),
        out_dest: Dest::Group(0),
        ..JobConfig::default()
    })
    .unwrap();
    let (sink, rxs) = port_channels(usize::from(sources));
    let mut b = Pfe::builder()
        .program(trio.program())
        .ppe_threads(8)
        .memory(mem)
        .multicast_group(0, srcs.iter().map(|&s| u16::from(s)).collect::<Vec<_>>())
        .sink(Arc::new(sink));
    let clock = timers.map(|_| Arc::new(ManualClock::new()));
    if let Some(clock) = &clock {
        b = b.timers(trio.timer_specs().unwrap()).clock(clock.clone());
    }
    let mut pfe = b.build().unwrap();
    pfe.start().unwrap();
    Rig {
        pfe,
        rxs,
        trio,
        grads,
        clock,
    }
}

fn worker_cfg(src: u8, window: usize, grads: usize) -> WorkerConfig {
    WorkerConfig {
        grads_per_packet: grads,
        window,
        ..WorkerConfig::new(JOB, src, TrioMlConfig::default().local_addr)
    }
}

/// Runs `floats[s]` from worker `s` for every `s` in `senders`; returns the workers. On a
/// rig with timers, on its manual clock ([`common::trio_ml_on_manual_clock`]).
fn allreduce(r: &Rig, senders: &[u8], floats: &[Vec<f32>], window: usize) -> Vec<Worker> {
    if let Some(clock) = &r.clock {
        let workers = senders
            .iter()
            .map(|&s| {
                Worker::from_f32(worker_cfg(s, window, r.grads), &floats[usize::from(s)]).unwrap()
            })
            .collect();
        let step = TrioMlConfig::default().scan_period_ns / 10;
        return common::trio_ml_on_manual_clock(
            &r.pfe,
            &r.rxs,
            clock,
            workers,
            step,
            1_000_000_000,
        );
    }
    let attached: Vec<Attached> = senders
        .iter()
        .map(|&s| Attached {
            worker: Worker::from_f32(worker_cfg(s, window, r.grads), &floats[usize::from(s)])
                .unwrap(),
            port: u16::from(s),
            rx: r.rxs[usize::from(s)].clone(),
            opts: DriveOptions::default(),
        })
        .collect();
    let pfe = &r.pfe;
    run_workers(attached, &|p, fr| pfe.inject_frame(p, fr).unwrap()).unwrap()
}

/// Integer-valued floats of one binade (±64 to ±127): FPISA adds them exactly, in any
/// order, in both variants (every exponent is the same).
fn exact_values(src: u8, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let v = 64.0 + ((i * 37 + usize::from(src) * 11) % 64) as f32;
            if (i + usize::from(src)) % 3 == 0 {
                -v
            } else {
                v
            }
        })
        .collect()
}

#[test]
fn four_workers_allreduce_floats_exactly_with_no_scaling_step() {
    let n = GRADS * 24 + 5;
    for variant in [Variant::Full, Variant::Approx] {
        let r = rig(4, 8, variant, None);
        let floats: Vec<Vec<f32>> = (0..4u8).map(|s| exact_values(s, n)).collect();
        let done = allreduce(&r, &[0, 1, 2, 3], &floats, 8);
        let want: Vec<f32> = (0..n).map(|i| floats.iter().map(|v| v[i]).sum()).collect();
        for w in &done {
            assert!(w.is_done());
            assert!(w.src_counts().iter().all(|&c| c == 4));
            assert_eq!(w.float_sums(), want, "{variant:?}");
        }
        let events = r.trio.fpisa_events().unwrap();
        assert_eq!(
            (events.overwrites, events.overflows),
            (0, 0),
            "one binade: nothing to overwrite"
        );
        r.pfe.drain();
        let stats = r.pfe.stats();
        assert!(stats.is_conserved());
        assert_eq!(stats.dropped, 0);
        // Every block's first packet writes its floats; the three others add theirs.
        assert_eq!(
            stats.xtxns["fpisa_add16"],
            3 * (n as u64).div_ceil(16),
            "one shift-and-add XTXN per 16 floats (the last chunk padded)"
        );
    }
}

/// A block of 24 gradients ends its last chunk of 16 after one line of accumulator words
/// (8 gradients), and its buffer ends there: the short chunk's adds stay in its lines. Here
/// the buffers fill the accumulator region, so the last slot's buffer ends the region, where
/// a 16-word add faulted the packet and left its block unfinished.
#[test]
fn a_short_last_chunk_adds_nothing_past_its_block_buffer() {
    const GRADS_24: usize = 24;
    let slots = 2 * 2; // `rig`: twice the window
    let mem = MemConfig {
        acc_bytes: slots * (GRADS_24 as u64 * 8),
        ..MemConfig::default()
    };
    for variant in [Variant::Full, Variant::Approx] {
        let r = rig_sized(2, 2, variant, None, GRADS_24, &mem);
        let n = GRADS_24 * 8;
        let floats: Vec<Vec<f32>> = (0..2u8).map(|s| exact_values(s, n)).collect();
        let done = allreduce(&r, &[0, 1], &floats, 2);
        let want: Vec<f32> = (0..n).map(|i| floats[0][i] + floats[1][i]).collect();
        for w in &done {
            assert_eq!(w.float_sums(), want, "{variant:?}");
        }
        r.pfe.drain();
        let stats = r.pfe.stats();
        assert!(stats.is_conserved());
        assert_eq!(stats.dropped_by_reason, Default::default(), "{variant:?}");
        assert_eq!(
            stats.xtxns["fpisa_add16"],
            (n as u64).div_ceil(GRADS_24 as u64) * 2,
            "each block's second packet: one XTXN for its 16 floats, one for its short 8"
        );
    }
}

#[test]
fn sums_of_arbitrary_floats_are_within_fpisas_bound() {
    let n = GRADS * 8;
    let r = rig(3, 4, Variant::Full, None);
    // Three workers whose magnitudes differ by up to 2^6.
    let floats: Vec<Vec<f32>> = (0..3u8)
        .map(|s| {
            (0..n)
                .map(|i| {
                    let x = ((i * 7919 + usize::from(s) * 104_729) % 20_011) as f32 / 20_011.0;
                    (x - 0.5) * (1 << (2 * s)) as f32
                })
                .collect()
        })
        .collect();
    let done = allreduce(&r, &[0, 1, 2], &floats, 4);
    for w in &done {
        for (i, &got) in w.float_sums().iter().enumerate() {
            let exact: f64 = floats.iter().map(|v| f64::from(v[i])).sum();
            // src/fpisa.rs: |S - acc| < (N - 1) u(E_max), and the FP32 narrowing loses less
            // than one ulp of the result; u(E_max) is at most the ulp of the largest input.
            let largest = floats.iter().map(|v| v[i].abs()).fold(0.0f32, f32::max);
            let ulp = |x: f32| f64::from(f32::from_bits(x.abs().to_bits() + 1) - x.abs());
            let bound = 2.0 * ulp(largest) + ulp(got);
            let err = exact - f64::from(got);
            assert!(
                err.abs() <= bound,
                "gradient {i}: {got} vs {exact} (error {err}, bound {bound})"
            );
        }
    }
}

#[test]
fn a_straggler_is_left_out_and_the_float_mean_divides_by_three() {
    let n = GRADS * 4;
    // Blocks age out after 5 ms of the rig's manual clock: the three senders are all in
    // before any of it passes, however busy the machine (on the system clock a sender
    // held up past the timeout would miss its block, and the counts would be 2).
    let r = rig(4, 4, Variant::Full, Some(5));
    let floats: Vec<Vec<f32>> = (0..4u8).map(|s| exact_values(s, n)).collect();
    let done = allreduce(&r, &[0, 1, 2], &floats, 4);
    let scan = TrioMlConfig::default().scan_period_ns;
    for w in &done {
        assert!(w.src_counts().iter().all(|&c| c == 3));
        assert!(w.degraded().iter().all(|&d| d));
        // Each block aged out between its timeout and one scan period later.
        assert!(
            w.latencies_ns()
                .iter()
                .all(|&l| (5_000_000..=5_000_000 + scan).contains(&l)),
            "{:?}",
            w.latencies_ns()
        );
        let mean = w.float_mean();
        for i in [0, 5, n - 1] {
            let want: f32 = floats[..3].iter().map(|v| v[i]).sum::<f32>() / 3.0;
            assert_eq!(mean[i], want, "gradient {i}");
        }
    }
}

#[test]
fn fpisa_a_counts_its_overwrites_and_left_shifts() {
    let n = GRADS * 2;
    let r = rig(2, 2, Variant::Approx, None);
    // Worker 0 sends 1.0, worker 1 sends 4.0 (2 binades up: a left shift) on even
    // gradients and 1024.0 (10 up: an overwrite) on odd ones, whatever arrives first.
    let floats = vec![
        vec![1.0f32; n],
        (0..n)
            .map(|i| if i % 2 == 0 { 4.0 } else { 1024.0 })
            .collect(),
    ];
    let done = allreduce(&r, &[0, 1], &floats, 2);
    let events = r.trio.fpisa_events().unwrap();
    // Either order of arrival makes one event per gradient: the larger value arriving
    // second is a left shift or an overwrite; arriving first, the smaller is right-shifted
    // (exactly, for 4.0 + 1.0) or lost below the mantissa (1024.0 + 1.0 keeps 1025.0).
    assert!(events.left_shifts + events.overwrites <= n as u64);
    for w in &done {
        for (i, &s) in w.float_sums().iter().enumerate() {
            if i % 2 == 0 {
                assert_eq!(s, 5.0, "gradient {i}");
            } else {
                // FPISA-A's overwrite error: 1024.0 when it overwrote 1.0, else exact.
                assert!(s == 1025.0 || s == 1024.0, "gradient {i}: {s}");
            }
        }
    }
    let overwritten = done[0]
        .float_sums()
        .iter()
        .skip(1)
        .step_by(2)
        .filter(|&&s| s == 1024.0)
        .count() as u64;
    assert_eq!(
        events.overwrites, overwritten,
        "every overwrite counted once"
    );
}

/// `pfemu bench fpisa`'s library: a small run verifies every Result bit for bit in both
/// kinds, and its JSON has every field `pfemu bench trio-ml --json` has, plus the
/// comparison.
#[test]
fn the_fpisa_bench_checks_its_results_and_reports_trio_mls_fields() {
    use pfemu::lab::bench::fpisa::{run, FpisaBenchConfig};
    use pfemu::lab::bench::trio_ml::TrioMlBenchConfig;
    let base = TrioMlBenchConfig {
        workers: 3,
        grads: 300,
        window: 16,
        generations: 3,
        ppe_threads: 2,
        scan_timers: 10,
        ..TrioMlBenchConfig::default()
    };
    for variant in [Variant::Full, Variant::Approx] {
        let mut kinds = Vec::new();
        let r = run(
            &FpisaBenchConfig {
                base: base.clone(),
                variant,
                runs: 1,
            },
            |_, kind, r| {
                assert!(r.verified, "{kind}: {r:?}");
                kinds.push(kind.to_string());
            },
        )
        .unwrap();
        assert_eq!(kinds, ["trio-ml", "fpisa"]);
        assert!(r.fpisa.verified && r.fpisa.stats.dropped == 0);
        assert_eq!(r.fpisa.stats.created, 16 * 3);
        assert!(r.ratio_to_trio_ml > 0.0);
        // One round: its own ratio is the medians'.
        let rounds = r.ratio_to_trio_ml_of_rounds.expect("finite rates");
        assert_eq!(
            (rounds.median, rounds.min, rounds.max),
            (r.ratio_to_trio_ml, r.ratio_to_trio_ml, r.ratio_to_trio_ml)
        );
        let fpisa = serde_json::to_value(&r).unwrap();
        let trio = serde_json::to_value(&r.fpisa).unwrap();
        for key in trio.as_object().unwrap().keys() {
            assert!(fpisa.get(key).is_some(), "missing `{key}`");
        }
        for key in [
            "variant",
            "trio_ml_gradients_per_s",
            "ratio_to_trio_ml",
            "ratio_to_trio_ml_of_rounds",
            "host",
        ] {
            assert!(fpisa.get(key).is_some(), "missing `{key}`");
        }
    }
}

/// The largest block, 4095 floats (16 KB, past the default jumbo frame size): the bench sizes
/// its ports for the frames, and the engine's shift-and-add takes the packet in pieces.
#[test]
fn the_fpisa_bench_runs_the_largest_block() {
    use pfemu::lab::bench::fpisa::{run, FpisaBenchConfig};
    use pfemu::lab::bench::trio_ml::TrioMlBenchConfig;
    let r = run(
        &FpisaBenchConfig {
            base: TrioMlBenchConfig {
                workers: 2,
                grads: 4095,
                window: 4,
                generations: 2,
                ppe_threads: 2,
                timers: false,
                ..TrioMlBenchConfig::default()
            },
            variant: Variant::Full,
            runs: 1,
        },
        |_, kind, r| assert!(r.verified && r.stats.dropped == 0, "{kind}: {r:?}"),
    )
    .unwrap();
    assert_eq!(r.fpisa.stats.created, 4 * 2);
}

/// The reference: FPISA's FP32 dataflow written from the paper alone, MAU by MAU. The
/// library's unit tests compile the same file.
#[allow(dead_code)]
#[path = "../src/fpisa/paper.rs"]
mod paper;

/// A gradient-like FP32 lane: either sign, exponents 115..=145, now and then zero.
fn gradient_lane() -> impl Strategy<Value = u32> {
    (any::<bool>(), 115u32..=145, 0..1u32 << 23, 0..16u8).prop_map(|(neg, e, f, z)| {
        let sign = u32::from(neg) << 31;
        if z == 0 {
            sign
        } else {
            sign | (e << 23) | f
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Every public form of FPISA's addition and read against the paper's dataflow, word by
    /// word: `fpisa::add_fp32_be` on plain memory; `SharedMemory::fpisa_add_be` in the
    /// accumulator region (the vectorised kernel under stripe locks) and in SRAM (`Acc::add`
    /// under compare-and-swap); `fpisa_add_lanes`; then `fp32_values_be` and `Acc::value`.
    /// Up to 64 rounds (workers) of up to 40 lanes; negative lanes are right-shifted, and
    /// shift negative sums, in most rounds.
    #[test]
    fn every_public_form_is_the_papers_dataflow(
        rounds in proptest::collection::vec(
            proptest::collection::vec(gradient_lane(), 40), 1..=64),
        lanes in 1usize..=40,
        approx in any::<bool>(),
    ) {
        let (variant, pv) = if approx {
            (Variant::Approx, paper::Variant::Approx)
        } else {
            (Variant::Full, paper::Variant::Full)
        };
        let mem = SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 12,
            dram_bytes: 1 << 12,
            acc_bytes: 1 << 12,
            banks: 2,
        }).unwrap();
        let (acc_at, sram_at, lanes_at) = (pfemu::mem::ACC_BASE + 3, 0, 200);
        let mut plain = vec![0u64; lanes];
        let mut regs = vec![paper::Register::default(); lanes];
        for round in &rounds {
            let bits = &round[..lanes];
            let be: Vec<u8> = bits.iter().flat_map(|b| b.to_be_bytes()).collect();
            for (reg, &b) in regs.iter_mut().zip(bits) {
                paper::add(reg, b, pv);
            }
            pfemu::fpisa::add_fp32_be(&mut plain, &be, variant);
            mem.fpisa_add_be(acc_at, &be, Format::Fp32, variant).unwrap();
            mem.fpisa_add_be(sram_at, &be, Format::Fp32, variant).unwrap();
            mem.fpisa_add_lanes(lanes_at, bits, Format::Fp32, variant).unwrap();
        }
        let mut words_be = Vec::new();
        for (i, reg) in regs.iter().enumerate() {
            let want = (reg.exp, reg.man);
            let plain_acc = Acc::from_word(plain[i]);
            prop_assert_eq!((plain_acc.exp, plain_acc.man), want, "add_fp32_be lane {}", i);
            for at in [acc_at, sram_at, lanes_at] {
                let acc = mem.fpisa_read(at + i as u64).unwrap();
                prop_assert_eq!(acc, plain_acc, "memory at {:#x} lane {}", at, i);
                prop_assert_eq!(acc.value(Format::Fp32), paper::read(*reg));
            }
            words_be.extend_from_slice(&plain[i].to_be_bytes());
        }
        let mut values = vec![0u8; 4 * lanes];
        pfemu::fpisa::fp32_values_be(&mut values, &words_be);
        let want: Vec<u8> = regs.iter().flat_map(|&r| paper::read(r).to_be_bytes()).collect();
        prop_assert_eq!(values, want);
    }
}

/// Two workers' floats through the program in a known order (worker 0's packet first), on
/// one PPE: the result of `lanes[i].0 + lanes[i].1` per lane, and the program's event
/// counters.
fn through_the_program(
    variant: Variant,
    lanes: &[(f32, f32)],
) -> (Vec<f32>, pfemu::fpisa::FpisaCounts) {
    use pfemu::microcode::fpisa;
    use pfemu::program::Harness;

    let mem = Arc::new(SharedMemory::new(&MemConfig::default()).unwrap());
    let agg = fpisa::install(&mem, variant).unwrap();
    agg.add_job(&JobConfig {
        job_id: JOB,
        sources: vec![0, 1],
        ..JobConfig::default()
    })
    .unwrap();
    let program = agg.program();
    let mut h = Harness::new(Arc::clone(&mem));
    let local = agg.config().local_addr;
    let firsts: Vec<f32> = lanes.iter().map(|l| l.0).collect();
    let seconds: Vec<f32> = lanes.iter().map(|l| l.1).collect();
    let mut workers = [
        fpisa::worker(fpisa::worker_config(JOB, 0, local), &firsts).unwrap(),
        fpisa::worker(fpisa::worker_config(JOB, 1, local), &seconds).unwrap(),
    ];
    let mut sent = Vec::new();
    for w in &mut workers {
        w.poll(0, &mut sent);
    }
    assert_eq!(sent.len(), 2, "one packet per worker");
    let mut results = Vec::new();
    for (i, frame) in sent.iter().enumerate() {
        let out = h.run(&program, i as u16, frame);
        assert!(out.result.is_ok(), "packet {i}: {:?}", out.result);
        results.extend(out.created.into_iter().map(|(_, f)| f));
    }
    assert!(!results.is_empty(), "the block completed");
    for w in &mut workers {
        for r in &results {
            w.on_frame(r).unwrap();
        }
    }
    let sums = workers[0].float_sums();
    assert_eq!(
        sums.iter().map(|s| s.to_bits()).collect::<Vec<_>>(),
        workers[1]
            .float_sums()
            .iter()
            .map(|s| s.to_bits())
            .collect::<Vec<_>>(),
        "both workers get the same Result"
    );
    (sums, agg.fpisa_events().unwrap())
}

/// The special values of the arithmetic's table, end to end: through the program's
/// shift-and-add and the Result builder's renormalization, as the workers read them.
#[test]
fn special_values_survive_the_program_as_the_arithmetic_documents() {
    let sub = f32::from_bits(0x0000_1234); // subnormal
    let lanes = [
        (f32::INFINITY, 1.0),
        (-1.0, f32::NEG_INFINITY),
        (f32::NAN, 1.0),
        (f32::INFINITY, f32::NEG_INFINITY),
        (sub, 2.0),
        (sub, -sub),
        (-0.0, -0.0),
        (-1.5, -2.25),
        (3.0, -3.0),
        (f32::MAX, f32::MAX),
        (-f32::MAX, -f32::MAX),
        (3.0, 1.0), // FPISA's Figure 4
    ];
    let (sums, events) = through_the_program(Variant::Full, &lanes);
    assert_eq!(sums[0], f32::INFINITY);
    assert_eq!(sums[1], f32::NEG_INFINITY);
    assert_eq!(sums[2].to_bits(), 0x7FC0_0000, "canonical quiet NaN");
    assert_eq!(sums[3].to_bits(), 0x7FC0_0000, "+Inf and -Inf: NaN");
    assert_eq!(sums[4], 2.0, "a subnormal is flushed to zero");
    assert_eq!(sums[5].to_bits(), 0, "two subnormals: +0");
    assert_eq!(sums[6].to_bits(), 0, "the sign of zero is not kept");
    assert_eq!(sums[7], -3.75);
    assert_eq!(sums[8].to_bits(), 0, "an exact cancellation is +0");
    assert_eq!(sums[9], f32::INFINITY, "exponent overflow on output");
    assert_eq!(sums[10], f32::NEG_INFINITY);
    assert_eq!(sums[11], 4.0);
    assert_eq!(
        (events.overwrites, events.left_shifts, events.overflows),
        (0, 0, 0)
    );
}

/// FPISA-A's events, one of each kind in known lanes, each counted exactly once: 4.0 onto
/// 1.0 is a left shift (exact), 1024.0 onto 1.0 an overwrite (the 1.0 is lost), and the
/// largest mantissa 7 binades up onto 1.0 a left shift that overflows the headroom
/// (saturated, finite).
#[test]
fn fpisa_a_events_are_counted_exactly_through_the_program() {
    let top = f32::from_bits(0x437F_FFFF); // 255.99998: mantissa all ones, 2^7
    let lanes = [(1.0, 4.0), (1.0, 1024.0), (1.0, top), (1.0, 0.5)];
    let (sums, events) = through_the_program(Variant::Approx, &lanes);
    assert_eq!(sums[0], 5.0);
    assert_eq!(sums[1], 1024.0, "the overwrite discards the 1.0");
    assert_eq!(
        sums[2].to_bits(),
        0x437F_FFFF,
        "saturated at the limit, finite"
    );
    assert_eq!(sums[3], 1.5);
    assert_eq!(events.overwrites, 1);
    assert_eq!(events.left_shifts, 2, "lanes 0 and 2");
    assert_eq!(events.overflows, 1, "lane 2");
}
