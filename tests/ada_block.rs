//! ADA as a block of the PFE: lookups as XTXNs of packet threads, the controller as a timer
//! entry driven by a manual clock, its reads and writes counted, arithmetic on ternary match
//! blocks against exact results, and tables replaced while lookups run.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pfemu::ada::arith::{Op, DIV_OFFSET, FRAC_BITS};
use pfemu::ada::block::{
    add_controller, controller_timer, Ada, AdaConfig, AntilogTable, ControlPlane, LookupTable,
    TableAccess,
};
use pfemu::ada::AdaError;
use pfemu::mem::tcam::{MatchMode, Tcam, TcamEntry, TcamError};
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::rng::SplitMix64;
use pfemu::timer::ManualClock;

use common::small_memory;

const MS: u64 = 1_000_000;

/// A frame carrying a 32-bit operand at bytes 14..18 (after an Ethernet header).
fn operand_frame(x: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes());
    f[14..18].copy_from_slice(&x.to_be_bytes());
    f
}

/// A program that looks its packet's operand up through `ada` and writes the result into
/// the packet (bytes 18..26) before forwarding it; its timer entry 0 is ADA's controller.
fn squaring_program(ada: &Arc<Ada>) -> Program {
    let mut p = Program::builder("ada_square");
    let sq = p.label("square");
    let a = Arc::clone(ada);
    p.instr(sq, move |t| {
        let x = u32::from_be_bytes(t.head(14)?[..4].try_into().expect("four bytes"));
        let r = a.lookup(t, x).unwrap_or(u64::MAX);
        t.head_mut(18)?[..8].copy_from_slice(&r.to_be_bytes());
        Ok(Done(Verdict::Forward(1)))
    });
    p.entry(Entry::Packet, sq);
    add_controller(&mut p, 0, vec![Arc::clone(ada)]);
    p.build().expect("every label is defined")
}

/// A relative error of a square by lookup.
fn square_error(ada: &Ada, x: u32) -> f64 {
    let exact = f64::from(x) * f64::from(x);
    let got = ada.table().get(x).expect("a covering table") as f64;
    (got - exact).abs() / exact.max(1.0)
}

#[test]
fn the_controller_runs_as_a_timer_entry_and_follows_the_operands() {
    let ada = Arc::new(Ada::new(AdaConfig::new(Op::Square)).expect("the paper's settings"));
    let before = ada.stats();
    assert_eq!((before.bins, before.repopulations), (8, 1));
    assert_eq!(
        before.writes,
        8 + before.table_entries,
        "bins and the first table"
    );
    let clock = Arc::new(ManualClock::new());
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(squaring_program(&ada))
        .memory(small_memory())
        .ppe_threads(2)
        .clock(clock.clone())
        .timers([controller_timer(0, MS).expect("a valid period")])
        .sink(Arc::new(sink))
        .build()
        .expect("a valid engine");
    pfe.start().expect("the engine starts");

    // Operands in a narrow band near 3 * 10^9 (a rate in bytes per second, say): the equal
    // initial population is coarse there. A binary trie reaches a band below 2^(32 - d)
    // only through a chain of d bins, so with at most 12 bins ADA zooms into large
    // operands, not small ones.
    let mut rng = SplitMix64::new(7);
    let band = 3_000_000_000u32;
    let operand = |rng: &mut SplitMix64| band + rng.below(1 << 20) as u32;
    let probe = band + (1 << 19);
    let initial = square_error(&ada, probe);
    let mut packets = 0u64;
    for epoch in 1..=12u64 {
        for _ in 0..500 {
            pfe.inject(Packet::new(0, operand_frame(operand(&mut rng))))
                .expect("room in the engine");
            packets += 1;
        }
        pfe.drain();
        clock.advance(MS);
        pfe.settle_timers();
        assert_eq!(
            ada.stats().epochs,
            epoch,
            "one controller launch per period"
        );
    }
    let after = ada.stats();
    assert!(after.repopulations > 1, "{after:?}");
    assert!(after.rebalances + after.expansions > 0, "{after:?}");
    assert!(
        after.bins > 8,
        "a point-like operand grows the monitoring: {after:?}"
    );
    assert!(after.bins <= 12, "never beyond its capacity: {after:?}");
    let adapted = square_error(&ada, probe);
    assert!(
        adapted < initial / 8.0,
        "the table moved to the operands: error {initial} -> {adapted}"
    );

    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    // Every packet: one monitoring and one calculation lookup.
    assert_eq!(stats.xtxns["tcam_lookup"], 2 * packets);
    // The timer threads' reads and writes, as the controller counted them (the constructor's
    // writes came from the control side).
    assert_eq!(stats.xtxns["tcam_read"], after.reads);
    assert_eq!(stats.xtxns["tcam_write"], after.writes - before.writes);
    // The packets carry the squares of their operands, within the population's error.
    let frames: Vec<Packet> = rx.try_iter().collect();
    assert_eq!(frames.len() as u64, packets);
    for f in frames.iter().rev().take(500) {
        let x = u32::from_be_bytes(f.data[14..18].try_into().expect("four bytes"));
        let r = u64::from_be_bytes(f.data[18..26].try_into().expect("eight bytes"));
        let exact = f64::from(x) * f64::from(x);
        assert!(
            (r as f64 - exact).abs() / exact < 0.01,
            "{x}^2 = {exact}, got {r}"
        );
    }
}

#[test]
fn an_idle_epoch_changes_nothing_and_a_frozen_controller_stays_put() {
    let ada = Ada::new(AdaConfig::new(Op::Log2)).expect("valid");
    let entries = ada.entries();
    let e = ada.epoch(&mut ControlPlane).expect("an epoch");
    assert_eq!((e.hits, e.repopulated, e.writes), (0, false, 0));
    assert_eq!(e.reads, 8, "it read every bin");
    assert_eq!(ada.entries(), entries);
    assert_eq!(ada.stats().idle_epochs, 1);

    ada.prime(&[3_000_000; 100], 10).expect("primed");
    let primed = ada.entries();
    assert_ne!(primed, entries, "priming moves the table to the operand");
    ada.freeze();
    for _ in 0..5 {
        for _ in 0..100 {
            ada.get(7);
        }
        let e = ada.epoch(&mut ControlPlane).expect("an epoch");
        assert_eq!((e.reads, e.writes), (0, 0), "frozen: no reads, no writes");
    }
    assert_eq!(ada.entries(), primed);
    assert_eq!(ada.stats().frozen_epochs, 5);
}

#[test]
fn bad_settings_are_refused_by_name() {
    let good = AdaConfig::new(Op::Mul);
    let cases: [(&str, AdaConfig); 10] = [
        (
            "monitor_entries",
            AdaConfig {
                monitor_entries: 0,
                ..good
            },
        ),
        // No room for the two bins the monitor starts with: named as the bound at fault,
        // not as a monitor_entries "from 2 to 1".
        (
            "max_monitor_entries",
            AdaConfig {
                monitor_entries: 2,
                max_monitor_entries: 1,
                ..good
            },
        ),
        // One bin, which Algorithm 2 never changes.
        (
            "monitor_entries",
            AdaConfig {
                monitor_entries: 1,
                ..good
            },
        ),
        (
            "monitor_entries",
            AdaConfig {
                monitor_entries: 13,
                ..good
            },
        ),
        (
            "table_entries",
            AdaConfig {
                table_entries: 11,
                ..good
            },
        ),
        (
            "table_entries",
            AdaConfig {
                table_entries: 1 << 20,
                ..good
            },
        ),
        (
            "th_balance",
            AdaConfig {
                th_balance: f64::NAN,
                ..good
            },
        ),
        (
            "th_balance",
            AdaConfig {
                th_balance: -0.5,
                ..good
            },
        ),
        // Deeper than a 32-bit trie gets (u32::MAX overflowed the depth's sum).
        (
            "th_expansion",
            AdaConfig {
                th_expansion: 33,
                ..good
            },
        ),
        (
            "th_expansion",
            AdaConfig {
                th_expansion: u32::MAX,
                ..good
            },
        ),
    ];
    for (setting, cfg) in cases {
        match Ada::new(cfg) {
            Err(AdaError::Config(e)) => {
                assert_eq!(e.setting, setting, "{e}");
                assert!(e.to_string().contains(setting), "{e}");
            }
            other => panic!("{setting}: expected a refusal, got {other:?}"),
        }
    }
    Ada::new(AdaConfig {
        th_expansion: 32,
        ..good
    })
    .expect("32 levels: a trie's deepest");
    assert!(matches!(
        AntilogTable::new(Op::Square, 4),
        Err(AdaError::NotBinary(Op::Square))
    ));
    assert!(matches!(
        LookupTable::uniform(Op::Sqrt, 33),
        Err(AdaError::SignificantBits(33))
    ));
}

/// A uniform population too large for a block is refused with the block's own error, the
/// capacity it would need (counted, not built: `tests/ada_alloc.rs` checks that).
#[test]
fn uniform_tables_too_large_for_a_block_are_refused() {
    let too_large =
        |capacity_entries| Some(AdaError::Tcam(TcamError::BadCapacity { capacity_entries }));
    for op in [Op::Sqrt, Op::Mul] {
        // 2^s (33 - s) entries: 45 056 fit, 86 016 and 163 840 do not.
        let t = LookupTable::uniform(op, 11).expect("fits a block");
        assert_eq!(t.tcam().entries().1.len(), 45_056);
        assert_eq!(LookupTable::uniform(op, 12).err(), too_large(86_016));
        assert_eq!(LookupTable::uniform(op, 13).err(), too_large(163_840));
    }
    // Antilog tables have s + 6 significant bits over 23-bit keys: 90 112 entries at s = 7.
    assert_eq!(AntilogTable::new(Op::Mul, 7).err(), too_large(90_112));
}

/// The antilog tables are prefix tables of the 32-bit key (every mask ones from the top bit
/// down), so the block looks them up by binary search rather than scanning 49152 entries,
/// and a key beyond the 23-bit antilog range matches nothing instead of aliasing a small
/// one.
#[test]
fn antilog_tables_are_prefix_tables_of_the_whole_key() {
    for op in [Op::Mul, Op::Div] {
        let table = AntilogTable::new(op, 6).expect("valid");
        let (_, entries) = table.tcam().entries();
        assert_eq!(entries.len(), 49152);
        assert!(entries
            .iter()
            .all(|e| e.mask.leading_ones() + e.mask.trailing_zeros() == 32));
        let key = 20 << FRAC_BITS;
        assert!(table.tcam().lookup(key).is_some());
        assert_eq!(table.tcam().lookup(key | 1 << 23), None, "{op:?}");
    }
}

/// `a * b` and `a / b` by three lookups in a program, against the exact results and the
/// uniform population's documented bound.
#[test]
fn mul_and_div_on_the_blocks_are_within_their_bounds() {
    let s = 6;
    let log_mul = LookupTable::uniform(Op::Mul, s).expect("valid");
    let log_div = LookupTable::uniform(Op::Div, s).expect("valid");
    let (mul, div) = (
        Arc::new(AntilogTable::new(Op::Mul, s).expect("valid")),
        Arc::new(AntilogTable::new(Op::Div, s).expect("valid")),
    );
    let (log_mul, log_div) = (Arc::new(log_mul), Arc::new(log_div));
    let results = Arc::new(parking_lot::Mutex::new((0u64, 0u64)));
    let mut p = Program::builder("arith");
    let go = p.label("go");
    {
        let (log_mul, log_div, mul, div, results) = (
            log_mul.clone(),
            log_div.clone(),
            mul.clone(),
            div.clone(),
            results.clone(),
        );
        p.instr(go, move |t| {
            let a = u32::from_be_bytes(t.head(14)?[..4].try_into().expect("four bytes"));
            let b = u32::from_be_bytes(t.head(18)?[..4].try_into().expect("four bytes"));
            let (la, lb) = (log_mul.lookup(t, a), log_mul.lookup(t, b));
            let product = mul.product(t, la.unwrap_or(0), lb.unwrap_or(0));
            let (da, db) = (log_div.lookup(t, a), log_div.lookup(t, b));
            let quotient = div.quotient(t, da.unwrap_or(0), db.unwrap_or(0));
            *results.lock() = (product.unwrap_or(u64::MAX), quotient.unwrap_or(u64::MAX));
            Ok(Done(Verdict::Consume))
        });
    }
    p.entry(Entry::Packet, go);
    let program = p.build().expect("valid");
    let mut h = Harness::new(small_memory());
    let mut rng = SplitMix64::new(11);
    for _ in 0..3000 {
        let magnitude = |rng: &mut SplitMix64| {
            let bits = 1 + rng.below(31);
            1 + rng.below(1 << bits) as u32
        };
        let (a, b) = (magnitude(&mut rng), magnitude(&mut rng));
        let mut f = operand_frame(a);
        f[18..22].copy_from_slice(&b.to_be_bytes());
        assert_eq!(h.run(&program, 0, &f).result, Ok(Verdict::Consume));
        let (product, quotient) = *results.lock();
        let (ep, eq) = (f64::from(a) * f64::from(b), f64::from(a) / f64::from(b));
        assert!(
            Op::Mul.within_bound(s, ep, product as f64),
            "{a} * {b} = {ep}, got {product}"
        );
        let q = quotient as f64 / f64::from(1u32 << FRAC_BITS);
        assert!(Op::Div.within_bound(s, eq, q), "{a} / {b} = {eq}, got {q}");
    }
    // Every table is a prefix table, so lookups are binary searches; an antilog key wider
    // than the table's 23 bits matches nothing.
    assert!(log_mul.tcam().is_indexed() && mul.tcam().is_indexed() && div.tcam().is_indexed());
    assert_eq!(mul.tcam().lookup(1 << 23), None);
    assert!(mul.tcam().lookup((1 << 23) - 1).is_some());
    // The wrong table for the operation answers nothing.
    let mut p = Program::builder("wrong");
    let go = p.label("go");
    let (mul2, seen) = (mul.clone(), Arc::new(AtomicBool::new(false)));
    let seen2 = seen.clone();
    p.instr(go, move |t| {
        seen2.store(
            mul2.quotient(t, 5 << FRAC_BITS, 1 << FRAC_BITS).is_none(),
            Ordering::Relaxed,
        );
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, go);
    h.run(&p.build().expect("valid"), 0, &operand_frame(1));
    assert!(seen.load(Ordering::Relaxed));
}

/// Lookups from several threads while the controller re-populates the table again and
/// again: every lookup finds an entry (each table covers every operand), and each result
/// is the exact square of an entry's representative. (Every table's results are squares,
/// so this cannot tell one table from another: the next test checks that a lookup reads
/// one whole table.)
#[test]
fn lookups_during_re_population_always_find_an_entry() {
    let ada = Arc::new(Ada::new(AdaConfig::new(Op::Square)).expect("valid"));
    let deadline = Instant::now() + Duration::from_secs(120);
    let stop = AtomicBool::new(false);
    let lookups = AtomicU64::new(0);
    let epochs = if cfg!(miri) { 10 } else { 400 };
    std::thread::scope(|s| {
        for r in 0..3u64 {
            let (ada, stop, lookups) = (&ada, &stop, &lookups);
            s.spawn(move || {
                let mut rng = SplitMix64::new(r);
                let mut n = 0;
                while !stop.load(Ordering::Acquire) || n < 100 {
                    assert!(Instant::now() < deadline, "reader {r} ran out of time");
                    let x = rng.below(1 << 32) as u32;
                    let got = ada.get(x).expect("every table covers every operand");
                    let root = got.isqrt();
                    assert_eq!(root * root, got, "{x}: {got} is no square of an operand");
                    n += 1;
                }
                lookups.fetch_add(n, Ordering::Relaxed);
            });
        }
        // The controller, on shifting operands, so the table keeps changing.
        let mut rng = SplitMix64::new(99);
        for e in 0..epochs {
            assert!(Instant::now() < deadline, "the controller ran out of time");
            let centre = 1u64 << (8 + (e / 20) % 24);
            for _ in 0..50 {
                ada.monitor().lookup((centre + rng.below(centre)) as u32);
            }
            ada.epoch(&mut ControlPlane).expect("an epoch");
        }
        stop.store(true, Ordering::Release);
    });
    let st = ada.stats();
    assert!(
        st.repopulations > 20,
        "the table changed under the readers: {st:?}"
    );
    assert!(lookups.load(Ordering::Relaxed) >= 300);
}

/// Generations of a versioned table: generation `g` (installed as the block's version
/// `g`) has a catch-all entry and, for `i < VERSIONED_PREFIXES`, a /16 entry at
/// [`versioned_hi`]`(g, i)` with a /24 entry inside it; every result is `g << 32` and the
/// entry's number, so a result names its table, and the prefixes move with `g`, so a key
/// aimed at one generation's entries falls elsewhere in the next.
const VERSIONED_PREFIXES: u32 = 256;

/// The top 16 bits of generation `g`'s `i`-th /16 (distinct in `i`: 251 is odd).
fn versioned_hi(g: u64, i: u32) -> u32 {
    ((u64::from(i) * 251 + g * 97) % 65_536) as u32
}

/// Bits 8..16 of generation `g`'s /24s.
fn versioned_lo(g: u64) -> u32 {
    (g % 256) as u32
}

/// Generation `g` of the versioned table (see [`VERSIONED_PREFIXES`]).
fn versioned_table(g: u64) -> Vec<TcamEntry> {
    let entry = |value, mask, n: u32| TcamEntry {
        value,
        mask,
        priority: 0,
        result: (g << 32) | u64::from(n),
    };
    let mut t = vec![entry(0, 0, 0)];
    for i in 0..VERSIONED_PREFIXES {
        let hi = versioned_hi(g, i) << 16;
        t.push(entry(hi, 0xffff_0000, 1 + i));
        t.push(entry(
            hi | versioned_lo(g) << 8,
            0xffff_ff00,
            1 + VERSIONED_PREFIXES + i,
        ));
    }
    t
}

/// What generation `g`'s table answers for `key`: its longest matching prefix.
fn versioned_answer(g: u64, key: u32) -> u64 {
    let n = (0..VERSIONED_PREFIXES)
        .find(|&i| versioned_hi(g, i) == key >> 16)
        .map_or(0, |i| {
            if (key >> 8) & 0xff == versioned_lo(g) {
                1 + VERSIONED_PREFIXES + i
            } else {
                1 + i
            }
        });
    (g << 32) | u64::from(n)
}

/// Lookups through the per-thread table cache PPE threads use (each reader a [`Harness`],
/// whose thread keeps its cache from packet to packet) while the control side replaces a
/// table generation after generation. Each result names its generation, and must be that
/// generation's answer for the key: a lookup that read part of one table and part of
/// another (or a cached table mixed with a newer one) would answer with an entry that is
/// not the longest match of its own table. Each lookup also reads the generation current
/// when it started or a newer one, never older than one it read before. The writer waits
/// for every reader to finish a lookup started after each replacement, so every reader
/// reads every generation, whatever the machine's speed.
#[test]
fn lookups_through_thread_caches_read_one_whole_table() {
    const READERS: usize = 3;
    let generations: u64 = if cfg!(miri) { 10 } else { 300 };
    let tcam = Arc::new(
        Tcam::new(
            1 + 2 * VERSIONED_PREFIXES as usize,
            MatchMode::LongestPrefix,
        )
        .expect("valid"),
    );
    assert_eq!(tcam.replace(versioned_table(1)), Ok(1));
    let published = AtomicU64::new(1);
    let done: [AtomicU64; READERS] = Default::default();
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(120);
    std::thread::scope(|s| {
        let readers: Vec<_> = (0..READERS)
            .map(|r| {
                let (tcam, published, done, stop) = (&tcam, &published, &done[r], &stop);
                s.spawn(move || {
                    let mut p = Program::builder("versioned");
                    let go = p.label("go");
                    let table = Arc::clone(tcam);
                    p.instr(go, move |t| {
                        let key = u32::from_be_bytes(t.head(14)?[..4].try_into().expect("4"));
                        let r = t.tcam_lookup(&table, key).map_or(u64::MAX, |h| h.result);
                        t.head_mut(18)?[..8].copy_from_slice(&r.to_be_bytes());
                        Ok(Done(Verdict::Forward(1)))
                    });
                    p.entry(Entry::Packet, go);
                    let program = p.build().expect("valid");
                    let mut h = Harness::new(small_memory());
                    let mut rng = SplitMix64::new(r as u64);
                    let mut seen = std::collections::BTreeSet::new();
                    let mut last = 0;
                    while !stop.load(Ordering::Acquire) {
                        assert!(Instant::now() < deadline, "reader {r} ran out of time");
                        let current = published.load(Ordering::Acquire);
                        // A key aimed at the current generation's /24s, its /16s, or anywhere.
                        let i = rng.below(u64::from(VERSIONED_PREFIXES)) as u32;
                        let aimed = versioned_hi(current, i) << 16 | rng.below(256) as u32;
                        let key = match rng.below(3) {
                            0 => aimed & !0xff00 | versioned_lo(current) << 8,
                            1 => aimed,
                            _ => rng.below(1 << 32) as u32,
                        };
                        let out = h.run(&program, 0, &operand_frame(key)).output;
                        let out = out.expect("forwarded");
                        let got = u64::from_be_bytes(out[18..26].try_into().expect("8"));
                        let g = got >> 32;
                        assert_eq!(got, versioned_answer(g, key), "{key:#x}: not one table");
                        assert!(
                            g >= current && g >= last,
                            "{key:#x}: generation {g} read \
                                after {last}, with {current} current"
                        );
                        last = g;
                        seen.insert(g);
                        done.fetch_add(1, Ordering::AcqRel);
                    }
                    seen.len() as u64
                })
            })
            .collect();
        'generations: for g in 1..=generations {
            if g > 1 {
                assert_eq!(tcam.replace(versioned_table(g)), Ok(g));
                published.store(g, Ordering::Release);
            }
            // Two lookups more: the second started after the replacement.
            let marks: Vec<u64> = done.iter().map(|d| d.load(Ordering::Acquire)).collect();
            for (d, m) in done.iter().zip(marks) {
                while d.load(Ordering::Acquire) < m + 2 {
                    assert!(Instant::now() < deadline, "the writer ran out of time");
                    if readers.iter().any(|r| r.is_finished()) {
                        break 'generations; // A reader failed: its join says why.
                    }
                    std::thread::yield_now();
                }
            }
        }
        stop.store(true, Ordering::Release);
        for r in readers {
            let seen = r.join().expect("a reader");
            assert_eq!(seen, generations, "every reader read every generation");
        }
    });
}

/// A monitoring table replaced behind the controller's back (from the control side) has
/// counters for other bins: the next epoch does not read them into the trie, and puts the
/// trie's bins back.
#[test]
fn an_epoch_after_a_foreign_monitoring_table_restores_the_bins() {
    let ada = Ada::new(AdaConfig::new(Op::Square)).expect("valid");
    let (_, bins) = ada.monitor().entries();
    let table = ada.entries();
    ada.monitor()
        .replace(vec![pfemu::mem::tcam::TcamEntry {
            value: 0,
            mask: 0,
            priority: 0,
            result: 0,
        }])
        .expect("fits");
    for _ in 0..100 {
        ada.get(12_345);
    }
    let e = ada.epoch(&mut ControlPlane).expect("an epoch");
    assert_eq!((e.reads, e.hits, e.repopulated), (1, 0, false));
    assert_eq!(e.writes, bins.len() as u64, "the bins, rewritten");
    assert_eq!(ada.monitor().entries().1, bins);
    assert_eq!(ada.entries(), table, "the calculation table untouched");
    // The next epoch counts hits on the trie's own bins again.
    for _ in 0..100 {
        ada.get(12_345);
    }
    assert_eq!(ada.epoch(&mut ControlPlane).expect("an epoch").hits, 100);
}

/// Logs and counters far beyond any table's come back as no answer or a saturated count,
/// never an overflow: the antilog lookups on logs near `u64::MAX` (through a thread, as a
/// program runs them), and an epoch on hit counters near `u64::MAX` (read through a
/// [`TableAccess`] of the caller's).
#[test]
fn huge_logs_and_counters_do_not_overflow() {
    let mul = Arc::new(AntilogTable::new(Op::Mul, 6).expect("valid"));
    let div = Arc::new(AntilogTable::new(Op::Div, 6).expect("valid"));
    let answers = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut p = Program::builder("huge");
    let go = p.label("go");
    {
        let (mul, div, answers) = (mul.clone(), div.clone(), answers.clone());
        p.instr(go, move |t| {
            let got = vec![
                mul.product(t, u64::MAX, 1),
                mul.product(t, 1, u64::MAX),
                div.quotient(t, u64::MAX, 0),
                div.quotient(t, u64::MAX - DIV_OFFSET + 1, 1),
                // In range still answers.
                mul.product(t, 3 << FRAC_BITS, 4 << FRAC_BITS),
            ];
            *answers.lock() = got;
            Ok(Done(Verdict::Consume))
        });
    }
    p.entry(Entry::Packet, go);
    let mut h = Harness::new(small_memory());
    let program = p.build().expect("valid");
    assert_eq!(
        h.run(&program, 0, &operand_frame(1)).result,
        Ok(Verdict::Consume)
    );
    assert_eq!(*answers.lock(), [None, None, None, None, Some(128)]);

    /// Reads every counter as `u64::MAX / 2`.
    struct Huge;
    impl TableAccess for Huge {
        fn read_hits(&mut self, tcam: &Tcam) -> (u64, Vec<u64>) {
            let (version, hits) = tcam.hits();
            (version, vec![u64::MAX / 2; hits.len()])
        }
        fn write_table(&mut self, tcam: &Tcam, entries: Vec<TcamEntry>) -> Result<u64, TcamError> {
            tcam.replace(entries)
        }
    }
    let ada = Ada::new(AdaConfig::new(Op::Square)).expect("valid");
    let e = ada.epoch(&mut Huge).expect("an epoch");
    assert_eq!(e.hits, u64::MAX, "eight counters of 2^63 - 1, saturated");
    assert_eq!(e.reads, 8);
    // The table still covers every operand.
    assert!(ada.get(123_456_789).is_some());
}
