//! The Nimble-style rate limiter: its lookup multiplication against exact arithmetic, its
//! buckets on a deterministic clock (the ADA paper's Figure 8: a rate change from 24 to 12
//! Gbit/s that ADA's controller follows and a static table does not), and through a PFE
//! with the controller as a timer entry.

mod common;

use std::sync::Arc;

use pfemu::ada::arith::Op;
use pfemu::ada::block::AdaConfig;
use pfemu::microcode::nimble::{exact_credit, Arithmetic, Nimble, NimbleConfig};
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::timer::{Launch, ManualClock};

use common::small_memory;

const US: u64 = 1_000;
const MS: u64 = 1_000_000;

fn arithmetics() -> [Arithmetic; 4] {
    [
        Arithmetic::Exact,
        Arithmetic::Uniform {
            significant_bits: 2,
        },
        Arithmetic::Static,
        Arithmetic::Ada(AdaConfig::new(Op::Mul)),
    ]
}

/// The admitted rate, Gbit/s, in windows of `window_ns`, of one class offered
/// The limiter with `arith` and the default settings, in a memory of its own.
fn installed(arith: Arithmetic) -> Nimble {
    let cfg = NimbleConfig {
        arithmetic: arith,
        ..NimbleConfig::default()
    };
    Nimble::install(&small_memory(), cfg).expect("installs")
}

/// `offered_bps` of `frame`-byte frames for `duration_ns`, the rate set to `after_bps` at
/// `change_ns`; ADA's controller every 100 µs, run as the timer entry.
fn run(arith: Arithmetic, change_ns: u64, after_bps: u64, duration_ns: u64) -> Vec<f64> {
    let cfg = NimbleConfig {
        arithmetic: arith,
        ..NimbleConfig::default()
    };
    run_with(cfg, change_ns, after_bps, duration_ns).0
}

/// [`run`] with any settings; also the limiter, for its counters.
fn run_with(
    cfg: NimbleConfig,
    change_ns: u64,
    after_bps: u64,
    duration_ns: u64,
) -> (Vec<f64>, Nimble) {
    let mem = small_memory();
    let nimble = Nimble::install(&mem, cfg).expect("installs");
    let adaptive = !nimble.adas().is_empty();
    let program = nimble.program();
    let mut h = Harness::new(mem.clone());
    let (frame, offered_bps) = (1500usize, 40_000_000_000u64);
    let gap = frame as u64 * 8 * 1_000_000_000 / offered_bps;
    let window = 100 * US;
    let mut windows = vec![0u64; (duration_ns / window) as usize];
    let mut changed = false;
    let mut next_epoch = window;
    let bytes = vec![0u8; frame];
    let mut now = 0;
    while now < duration_ns {
        if !changed && now >= change_ns {
            nimble.set_rate(&mem, 0, after_bps).expect("class 0");
            changed = true;
        }
        if now >= next_epoch {
            h.set_now(next_epoch);
            let launch = Launch {
                timer: 0,
                entry: 0,
                slice: 0,
                slices: 1,
                scheduled_ns: next_epoch,
                missed: 0,
            };
            if adaptive {
                assert_eq!(h.run_timer(&program, launch).result, Ok(Verdict::Consume));
            }
            next_epoch += window;
        }
        h.set_now(now);
        if let Ok(Verdict::Forward(_)) = h.run(&program, 0, &bytes).result {
            windows[(now / window) as usize] += frame as u64;
        }
        now += gap;
    }
    let gbps = windows
        .iter()
        .map(|&b| b as f64 * 8.0 / window as f64)
        .collect();
    (gbps, nimble)
}

/// Mean of the windows `from..to`.
fn mean(w: &[f64], from: usize, to: usize) -> f64 {
    w[from..to].iter().sum::<f64>() / (to - from) as f64
}

#[test]
fn figure_8_ada_follows_a_rate_change_that_a_static_table_mis_drops() {
    let (change, end) = (30, 60); // windows of 100 µs
    let [exact, uniform, fixed, ada] =
        arithmetics().map(|a| run(a, 3 * MS, 12_000_000_000, 6 * MS));
    for (name, w) in [
        ("exact", &exact),
        ("uniform", &uniform),
        ("static", &fixed),
        ("ada", &ada),
    ] {
        eprintln!(
            "{name:8} before {:.2} after {:.2} Gbit/s",
            mean(w, 1, change),
            mean(w, change + 1, end)
        );
    }
    // The ideal: the rates exactly, after the first window's full bucket.
    assert!((mean(&exact, 1, change) - 24.0).abs() < 0.05);
    assert!((mean(&exact, change + 1, end) - 12.0).abs() < 0.05);
    // Before the change, ADA's table (fitted to 24 Gbit/s) and the static arithmetic (the
    // rate baked in) are within a percent.
    for w in [&fixed, &ada] {
        assert!((mean(w, 1, change) / 24.0 - 1.0).abs() < 0.01);
    }
    // After the change, the static arithmetic still admits 24 Gbit/s, twice the rate:
    // the data plane changed the rate, and nobody re-populated its table. ADA's monitoring
    // sees the new rate and the controller re-populates within an epoch or two.
    assert!((mean(&fixed, change + 1, end) / 24.0 - 1.0).abs() < 0.01);
    assert!((mean(&ada, change + 2, end) / 12.0 - 1.0).abs() < 0.01);
    // The uniform population errs by what its entry for the rate is off, within its bound.
    for (w, rate) in [
        (mean(&uniform, 1, change), 24.0),
        (mean(&uniform, change + 1, end), 12.0),
    ] {
        assert!(Op::Mul.within_bound(2, rate, w), "uniform: {w} for {rate}");
    }
}

/// ADA's tables in the limiter hold logs: an `op` other than `Mul` in its settings is
/// taken as `Mul` (as documented), and the refill is still a product.
#[test]
fn ada_settings_of_another_op_still_multiply() {
    let n = Nimble::install(
        &small_memory(),
        NimbleConfig {
            arithmetic: Arithmetic::Ada(pfemu::ada::block::AdaConfig::new(Op::Square)),
            dt_ada: Some(pfemu::ada::block::AdaConfig::new(Op::Sqrt)),
            ..NimbleConfig::default()
        },
    )
    .expect("installs");
    assert_eq!(n.ada().map(|a| a.config().op), Some(Op::Mul));
    assert_eq!(n.dt_ada().map(|a| a.config().op), Some(Op::Mul));
    let rate = 3_000_000_000;
    let (exact, got) = (exact_credit(rate, 1000) as f64, n.credit(rate, 1000) as f64);
    // The time's table is unprimed (equal bins, one entry per octave near 1000 ns): a
    // product within a factor of two, where a square or root would be off by far more.
    assert!(got <= 2.0 * exact && exact <= 2.0 * got, "{exact} vs {got}");
}

/// The slowest rates, 1 to 7 bytes per second, are refilled too: their key `R >> 2` was 0
/// below 4 B/s, which the lookups took for a zero rate, so a class at 8 to 31 bit/s
/// never earned a token after its first burst.
#[test]
fn the_slowest_rates_still_refill() {
    for arith in arithmetics() {
        let n = installed(arith);
        for rate in 1..=7u64 {
            for dt in [1_000_000_000u64, 3_700_000_000, 10_000_000_000] {
                let (exact, got) = (exact_credit(rate, dt) as f64, n.credit(rate, dt) as f64);
                let ok = match arith {
                    Arithmetic::Exact => exact == got,
                    Arithmetic::Uniform { .. } => Op::Mul.within_bound(2, exact, got),
                    Arithmetic::Static => Op::Mul.within_bound(6, exact, got),
                    _ => got <= 2.0 * exact && exact <= 2.0 * got,
                };
                assert!(
                    ok,
                    "{}: {rate} B/s x {dt} ns = {exact}, got {got}",
                    arith.name()
                );
            }
        }
        assert_eq!(n.credit(0, 1_000_000_000), 0, "a zero rate earns nothing");
    }
}

/// The refill as the limiter computes it, against exact arithmetic, over rates from 1 to
/// 100 Gbit/s and times from 10 ns to 1 ms.
#[test]
fn credits_are_within_the_populations_bounds() {
    let rates = (0..40).map(|i| 125_000_000u64 + i * 300_000_000);
    let dts = [10u64, 37, 120, 300, 1000, 4321, 65_536, 1_000_000];
    for arith in arithmetics() {
        let n = installed(arith);
        for rate in rates.clone() {
            for dt in dts {
                let (exact, got) = (exact_credit(rate, dt) as f64, n.credit(rate, dt) as f64);
                let ok = match arith {
                    Arithmetic::Exact => exact == got,
                    // The rate's table has 2 significant bits, the others more.
                    Arithmetic::Uniform { .. } => Op::Mul.within_bound(2, exact, got),
                    // The rate's log is exact: the time's and antilog tables' 6 bits.
                    Arithmetic::Static => Op::Mul.within_bound(6, exact, got),
                    // ADA's table is fitted to 3 GB/s, and elsewhere within a factor of two
                    // (every bin has an entry): the 6 bits' bound near the fitted rate.
                    _ if rate.abs_diff(3_000_000_000) < 10_000_000 => {
                        Op::Mul.within_bound(6, exact, got)
                    }
                    _ => got <= 2.0 * exact + 2.0 && exact <= 2.0 * got + 2.0,
                };
                assert!(
                    ok,
                    "{}: {rate} B/s x {dt} ns = {exact}, got {got}",
                    arith.name()
                );
            }
        }
    }
}

#[test]
fn through_a_pfe_with_the_controller_as_a_timer_entry() {
    let mem = small_memory();
    let nimble = Nimble::install(&mem, NimbleConfig::default()).expect("installs");
    let clock = Arc::new(ManualClock::new());
    let sink = Arc::new(CountingSink::new(2));
    let mut pfe = Pfe::builder()
        .program(nimble.program())
        .memory(mem.clone())
        .ppe_threads(2)
        .clock(clock.clone())
        .timers(nimble.timer_specs().expect("a valid period"))
        .sink(sink.clone())
        .build()
        .expect("a valid engine");
    pfe.start().expect("starts");
    // 40 Gbit/s of 1500-byte frames for 2 ms, one at a time so each has its own time; the
    // rate halves at 1 ms.
    let (frame, gap) = (vec![0u8; 1500], 300u64);
    let mut sent = 0u64;
    for i in 1..=(2 * MS / gap) {
        if i * gap >= MS && (i - 1) * gap < MS {
            nimble.set_rate(&mem, 0, 12_000_000_000).expect("class 0");
        }
        clock.set(i * gap);
        pfe.settle_timers();
        pfe.inject(Packet::new(0, frame.clone())).expect("room");
        pfe.drain();
        sent += 1;
    }
    pfe.inject(Packet::new(7, frame.clone())).expect("room");
    pfe.drain();
    let ada = nimble.ada_stats().expect("ADA");
    let counts = nimble.counts(&mem, 0).expect("class 0");
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert_eq!(stats.drops("no_class"), 1);
    assert_eq!(counts.packets + stats.drops("rate_exceeded"), sent);
    assert_eq!(sink.total_packets(), counts.packets);
    assert_eq!(counts.bytes, counts.packets * 1500);
    // 24 Gbit/s for 1 ms, 12 for the next, plus the full bucket at the start: 4.5 MB.
    let expected = 3_000_000.0 + 1_500_000.0 + 65_536.0;
    let admitted = counts.bytes as f64;
    assert!(
        (admitted / expected - 1.0).abs() < 0.02,
        "{admitted} bytes, not {expected}"
    );
    // The controller ran every 100 µs, on timer threads whose reads and writes the engine
    // counted (the priming's came from the control side).
    let periods = sent * gap / (100 * US);
    assert_eq!(
        ada.epochs,
        30 + periods,
        "30 priming epochs and one per period"
    );
    assert!(stats.xtxns["tcam_read"] >= periods * 8);
    assert!(ada.repopulations > 1);
    // Each refill: the rate's monitoring and table, the time's table and the antilog.
    assert_eq!(stats.xtxns["tcam_lookup"], 4 * sent);
}

/// ADA on the inter-arrival time as well (the paper's ADA(ΔT, R)): the controller runs
/// both operands, each reading its bins and writing what changed, and the limiter still
/// follows the rate change. The times (300 ns) sit 24 octaves below the top of a 32-bit
/// key, and a binary trie reaches them only through a chain of one bin per octave: with
/// the paper's 12 bins the time's bins stop at [0, 2^21) and the rate comes out 4.5% low,
/// so the time's monitoring here may grow to 32 bins.
#[test]
fn ada_on_both_operands_follows_the_change_and_counts_both_controllers() {
    let cfg = NimbleConfig {
        dt_ada: Some(AdaConfig {
            max_monitor_entries: 32,
            ..AdaConfig::new(Op::Mul)
        }),
        ..NimbleConfig::default()
    };
    let (w, nimble) = run_with(cfg, 3 * MS, 12_000_000_000, 6 * MS);
    assert!((mean(&w, 2, 30) / 24.0 - 1.0).abs() < 0.02, "{w:?}");
    assert!((mean(&w, 32, 60) / 12.0 - 1.0).abs() < 0.02, "{w:?}");
    let (rate, dt) = (
        nimble.ada().expect("ADA on the rate").stats(),
        nimble.dt_ada().expect("ADA on the time").stats(),
    );
    assert_eq!(nimble.adas().len(), 2);
    // 60 controller periods each; the rate's also its 30 priming epochs.
    assert_eq!((rate.epochs, dt.epochs), (30 + 59, 59));
    // Every epoch with hits reads each bin; the time's bins grew from 8.
    assert!(dt.reads >= 59 * 8 && dt.bins > 8, "{dt:?}");
    assert!(dt.repopulations > 1, "{dt:?}");
}

#[test]
fn bad_settings_are_refused_by_name() {
    let good = NimbleConfig::default();
    let cases = [
        (
            "rates_bps",
            NimbleConfig {
                rates_bps: vec![],
                ..good.clone()
            },
        ),
        (
            "rates_bps",
            NimbleConfig {
                rates_bps: vec![u64::MAX],
                ..good.clone()
            },
        ),
        (
            "burst_bytes",
            NimbleConfig {
                burst_bytes: 0,
                ..good.clone()
            },
        ),
        (
            "dt_significant_bits",
            NimbleConfig {
                dt_significant_bits: 11,
                ..good.clone()
            },
        ),
        (
            "controller_period_ns",
            NimbleConfig {
                controller_period_ns: 0,
                ..good.clone()
            },
        ),
        (
            "dt_ada",
            NimbleConfig {
                arithmetic: Arithmetic::Exact,
                dt_ada: Some(AdaConfig::new(Op::Mul)),
                ..good.clone()
            },
        ),
        (
            "th_balance",
            NimbleConfig {
                arithmetic: Arithmetic::Ada(AdaConfig {
                    th_balance: f64::NAN,
                    ..AdaConfig::new(Op::Mul)
                }),
                ..good.clone()
            },
        ),
    ];
    for (setting, cfg) in cases {
        let e = Nimble::install(&small_memory(), cfg).expect_err(setting);
        assert!(e.to_string().contains(setting), "{setting}: {e}");
    }
    let n = Nimble::install(&small_memory(), good.clone()).expect("installs");
    let m = small_memory();
    assert!(n.set_rate(&m, 1, 1).is_err(), "one class only");
}

/// The antilog table must fit a ternary match block: 49,152 entries at 6 significant
/// bits, 90,112 at 7, which the block refuses. The check refuses 7 by name, before any
/// table is built; 6 installs.
#[test]
fn the_antilog_table_is_bounded_by_a_block() {
    use pfemu::ada::arith::antilog_table_len;
    use pfemu::mem::tcam::MAX_TCAM_ENTRIES;
    use pfemu::microcode::nimble::MAX_ANTILOG_SIGNIFICANT_BITS;
    let fits = |s| antilog_table_len(Op::Mul, s) <= MAX_TCAM_ENTRIES as u64;
    assert!(fits(MAX_ANTILOG_SIGNIFICANT_BITS) && !fits(MAX_ANTILOG_SIGNIFICANT_BITS + 1));
    assert_eq!(MAX_ANTILOG_SIGNIFICANT_BITS, 6);
    let cfg = |s| NimbleConfig {
        antilog_significant_bits: s,
        ..NimbleConfig::default()
    };
    let e = cfg(7).check().expect_err("90,112 entries");
    assert_eq!(e.setting, "antilog_significant_bits");
    assert!(e.to_string().contains("at most 6"), "{e}");
    assert!(Nimble::install(&small_memory(), cfg(7)).is_err());
    Nimble::install(&small_memory(), cfg(6)).expect("49,152 entries fit");
}

/// A clock far from 0 (or a class idle for years): the refill is capped at a full bucket,
/// so the tokens never overflow and the next packets still see a bucket of the right depth.
#[test]
fn a_huge_refill_fills_the_bucket_and_no_more() {
    for arith in arithmetics() {
        let mem = small_memory();
        let nimble = Nimble::install(
            &mem,
            NimbleConfig {
                arithmetic: arith,
                ..NimbleConfig::default()
            },
        )
        .expect("installs");
        let program = nimble.program();
        let mut h = Harness::new(mem.clone());
        let frame = vec![0u8; 1500];
        for now in [u64::MAX / 2, u64::MAX - 1] {
            h.set_now(now);
            assert_eq!(h.run(&program, 0, &frame).result, Ok(Verdict::Forward(1)));
            let tokens = nimble.tokens(&mem, 0).expect("class 0");
            assert_eq!(tokens, 64.0 * 1024.0 - 1500.0, "{}", arith.name());
        }
    }
}

/// Two packets refilling a full bucket at once must not empty it. The first packet of a
/// class after an idle second earns a full bucket of credit; it adds it and is held (a PPE
/// thread the host OS deschedules) before it gives the excess back, while a second packet
/// a microsecond later adds its own credit, finds the bucket over its depth and gives back
/// what it saw over it. When the first goes on, the bucket must hold what the two refills
/// one after the other leave: a full bucket less the two packets. (Giving back all the
/// excess each saw, the two emptied it: every later packet of the first one's batch, which
/// shares its time and so earns nothing, was dropped.)
#[test]
fn two_packets_refilling_at_once_leave_the_bucket_full() {
    let mem = small_memory();
    let nimble = Nimble::install(
        &mem,
        NimbleConfig {
            rates_bps: vec![1_000_000_000],
            arithmetic: Arithmetic::Exact,
            ..NimbleConfig::default()
        },
    )
    .expect("installs");
    let program = nimble.program();
    let frame = vec![0u8; 1500];
    let depth = 64.0 * 1024.0;

    let held = common::hold_before(&mem, &program, "take", (0, 1_000 * MS), frame.clone());
    assert_eq!(
        nimble.tokens(&mem, 0).expect("class 0"),
        2.0 * depth,
        "the first packet's credit is in, its excess not yet given back"
    );

    let mut h = Harness::new(mem.clone());
    h.set_now(1_000 * MS + US);
    assert_eq!(h.run(&program, 0, &frame).result, Ok(Verdict::Forward(1)));
    let first = held.release();
    assert_eq!(first.result, Ok(Verdict::Forward(1)));
    assert_eq!(
        nimble.tokens(&mem, 0).expect("class 0"),
        depth - 2.0 * 1500.0,
        "a full bucket less the two packets"
    );
    // Later packets at the second one's time earn nothing and find the bucket as it should
    // be: 41 more full-size frames fit.
    for i in 0..41 {
        assert_eq!(
            h.run(&program, 0, &frame).result,
            Ok(Verdict::Forward(1)),
            "packet {i} after the two"
        );
    }
    assert_ne!(
        h.run(&program, 0, &frame).result,
        Ok(Verdict::Forward(1)),
        "the 44th packet finds too few tokens"
    );
    assert_eq!(nimble.counts(&mem, 0).expect("class 0").packets, 43);
}

/// 256 PPE threads on one class, in bursts after idle times: each burst's batches in
/// flight at four times at once, so their refills run concurrently, the first of each burst
/// taking the bucket over its depth. Whatever the interleaving, a burst admits what its
/// bucket and rate allow: a full bucket (it filled while idle) and the rate times the
/// burst's time, less what is left at its end (under a frame) and what an overdraw before
/// it took from the bucket, more by no more than the overdraw, a frame per thread.
/// Offered 64 times the rate, the bucket is over its depth only at a burst's first
/// refill, so a refill that loses tokens shows as too few admitted.
#[test]
fn hundreds_of_threads_admit_what_the_bucket_allows() {
    const THREADS: u64 = 256;
    const FRAME: u64 = 64;
    const BURSTS: u64 = 16;
    const STEPS: u64 = 100;
    // 1 Gbit/s is 125 bytes a microsecond; a step offers 4 batches of 32 frames (8 KB).
    let (rate_bps, depth) = (1_000_000_000u64, 64 * 1024u64);
    let (step, quarter, idle) = (US, US / 4, MS);
    let mem = small_memory();
    let nimble = Nimble::install(
        &mem,
        NimbleConfig {
            rates_bps: vec![rate_bps],
            burst_bytes: depth,
            arithmetic: Arithmetic::Exact,
            ..NimbleConfig::default()
        },
    )
    .expect("installs");
    let clock = Arc::new(ManualClock::new());
    let sink = Arc::new(CountingSink::new(2));
    let mut pfe = Pfe::builder()
        .program(nimble.program())
        .memory(mem.clone())
        .ppe_threads(THREADS as usize)
        .clock(clock.clone())
        .sink(sink.clone())
        .build()
        .expect("a valid engine");
    pfe.start().expect("starts");
    let frame = vec![0u8; FRAME as usize];
    let batch = || (0..32).map(|_| (0u16, frame.as_slice()));
    let (mut now, mut admitted_before, mut offered) = (idle, 0, 0u64);
    for burst in 0..BURSTS {
        let first = now;
        for _ in 0..STEPS {
            // The engine reads its clock when a thread starts a batch: each batch runs
            // at the time it went in or at a later one of the step.
            for i in 0..4 {
                clock.set(now + i * quarter);
                offered += pfe.inject_burst(batch()).expect("running");
            }
            pfe.drain();
            now += step;
        }
        // The burst refilled from its first time (or up to 3 quarters of a step later)
        // to its last.
        let last = now - step + 3 * quarter;
        let counts = nimble.counts(&mem, 0).expect("class 0");
        let admitted = counts.bytes - admitted_before;
        admitted_before = counts.bytes;
        let earned = depth + exact_credit(rate_bps / 8, last - first) / 1024;
        let late = exact_credit(rate_bps / 8, 3 * quarter) / 1024;
        let low = earned - FRAME - THREADS * FRAME - late;
        let high = earned + THREADS * FRAME;
        assert!(
            (low..=high).contains(&admitted),
            "burst {burst} admitted {admitted} bytes; its bucket and rate allow {earned} \
             (from {low} to {high})"
        );
        now += idle;
    }
    let counts = nimble.counts(&mem, 0).expect("class 0");
    let stats = pfe.shutdown();
    assert_eq!(offered, BURSTS * STEPS * 128);
    assert!(stats.is_conserved());
    assert_eq!(counts.packets + stats.drops("rate_exceeded"), offered);
    assert_eq!(sink.total_packets(), counts.packets);
}

/// An idle time longer than the time's 32-bit key (2^32 ns, 4.3 s) is refilled in full:
/// the bucket emptied at 1 ns, 10 s at 100 KB/s earn 1 MB, under the 1 MiB bucket, and
/// exactly 666 frames of 1500 bytes pass before one drops. (Looked up as 2^32 - 1 ns, the
/// lookup arithmetics refilled 4.3 s: 286 frames.) Each arithmetic admits what its error
/// bound allows around the exact refill (capped at the bucket's depth), through the
/// program, and computes the refill within that bound from the control side.
#[test]
fn an_idle_time_beyond_the_times_key_is_refilled_in_full() {
    const S: u64 = 1_000_000_000;
    let (rate_bps, burst, frame_len) = (800_000u64, 1u64 << 20, 1500u64);
    let frame = vec![0u8; frame_len as usize];
    let exact = exact_credit(rate_bps / 8, 10 * S) as f64 / 1024.0;
    assert_eq!(exact, 1_000_000.0);
    for arith in arithmetics() {
        let name = arith.name();
        let mem = small_memory();
        let nimble = Nimble::install(
            &mem,
            NimbleConfig {
                rates_bps: vec![rate_bps],
                burst_bytes: burst,
                arithmetic: arith,
                ..NimbleConfig::default()
            },
        )
        .expect("installs");
        let bound = match arith {
            Arithmetic::Exact => 0.0,
            Arithmetic::Uniform { significant_bits } => Op::Mul.error_bound(significant_bits),
            // The rate's log exact: the 6 bits of the time's and antilog tables.
            Arithmetic::Static => Op::Mul.error_bound(6),
            // The bound of the entry ADA's table answers the rate with (its key, the rate
            // over 4), with the time's and antilog tables' 6 bits.
            Arithmetic::Ada(_) => {
                let key = rate_bps / 8 / 4;
                let ada = nimble.ada().expect("ADA");
                let e = ada.entries().into_iter().find(|e| e.matches(key));
                let e = e.expect("ADA's table covers every key");
                let half_width = ((!e.mask & 0xffff_ffff) + 1) as f64 / 2.0;
                Op::Mul.entry_error_bound(half_width / e.value as f64, 0.5f64.powi(7), 6)
            }
        };
        let program = nimble.program();
        let mut h = Harness::new(mem.clone());
        let mut admit_until_drop = |now: u64| {
            h.set_now(now);
            let mut n = 0u64;
            while h.run(&program, 0, &frame).result == Ok(Verdict::Forward(1)) {
                n += 1;
            }
            n
        };
        assert_eq!(
            admit_until_drop(1),
            burst / frame_len,
            "{name}: the full bucket"
        );
        let left = nimble.tokens(&mem, 0).expect("class 0");
        let n = admit_until_drop(1 + 10 * S);
        // The frames the bucket holds after a refill within the bound (a byte of rounding).
        let frames = |refill: f64| ((left + refill).min(burst as f64) / frame_len as f64) as u64;
        let (low, high) = (
            frames(exact * (1.0 - bound) - 1.0),
            frames(exact * (1.0 + bound) + 1.0),
        );
        assert!(
            (low..=high).contains(&n),
            "{name}: {n} frames after 10 s idle; within {bound} of the exact refill, {low} \
             to {high}"
        );
        if arith == Arithmetic::Exact {
            assert_eq!(n, 666);
        }
        let credit = nimble.credit(rate_bps / 8, 10 * S) as f64 / 1024.0;
        assert!(
            Op::Mul.within(bound, exact, credit),
            "{name}: credit() gives {credit} bytes for 10 s, exact {exact}"
        );
    }
}
