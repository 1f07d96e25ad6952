//! ADA's algorithms end to end on seeded operand streams: the distribution-aware population
//! is no worse than the prior work's uniform one at the same entry budget on skewed
//! operands, and the monitoring trie re-adapts after the distribution shifts.

use pfemu::ada::arith::{ArithTable, Op};
use pfemu::ada::trie::{uniform_population, BinningTrie, Update};
use pfemu::rng::SplitMix64;

/// ADA's thresholds from the paper's evaluation: balance at 20%, expansion after the trie
/// deepened by two levels.
const TH_BALANCE: f64 = 0.2;
const TH_EXPANSION: u32 = 2;

/// Operands drawn per monitoring epoch.
const EPOCH: usize = 5000;

/// An exponential operand of mean `mean` (a queue length, say), clamped to 32 bits.
fn exponential(rng: &mut SplitMix64, mean: f64) -> u32 {
    let x = -mean * (1.0 - rng.uniform()).ln();
    x.min(f64::from(u32::MAX)) as u32
}

/// A uniform operand in `lo..lo + width`.
fn uniform_in(rng: &mut SplitMix64, lo: u32, width: u32) -> u32 {
    lo + rng.below(u64::from(width)) as u32
}

/// Run one epoch of monitoring on `draw`'s operands.
fn monitor(trie: &mut BinningTrie, rng: &mut SplitMix64, draw: &impl Fn(&mut SplitMix64) -> u32) {
    for _ in 0..EPOCH {
        trie.record(u64::from(draw(rng)))
            .expect("32-bit operands fit");
    }
}

/// The mean relative error of `table` over `samples` (an exact 0 counts absolute error);
/// a one-operand operation ignores the second operand.
fn mean_error(table: &ArithTable, samples: &[(u32, u32)]) -> f64 {
    let total: f64 = samples
        .iter()
        .map(|&(a, b)| {
            let exact = table.op().exact(a, b).expect("defined on these operands");
            let approx = table.eval(a, b).expect("covering table");
            (approx - exact).abs() / exact.max(1.0)
        })
        .sum();
    total / samples.len() as f64
}

#[test]
fn ada_is_no_worse_than_uniform_population_on_skewed_operands() {
    let draw = |rng: &mut SplitMix64| exponential(rng, 5000.0);
    let mut rng = SplitMix64::new(17);
    let mut trie = BinningTrie::new(16, 32).expect("valid");
    for _ in 0..30 {
        monitor(&mut trie, &mut rng, &draw);
        trie.update(TH_BALANCE, TH_EXPANSION);
    }
    monitor(&mut trie, &mut rng, &draw);
    let samples: Vec<(u32, u32)> = (0..4000)
        .map(|_| (draw(&mut rng), draw(&mut rng)))
        .collect();
    for op in [Op::Square, Op::Sqrt, Op::Mul] {
        for s in 2..=6 {
            let budget = uniform_population(32, s).len() as u64;
            let entries = trie.populate(budget).expect("the budget covers the bins");
            assert!(entries.len() as u64 <= budget);
            let uniform = ArithTable::uniform(op, s).expect("valid");
            let ada = ArithTable::from_entries(op, &entries, s).expect("valid");
            let (eu, ea) = (mean_error(&uniform, &samples), mean_error(&ada, &samples));
            eprintln!(
                "{op:?} s={s} budget={budget} used={} uniform={eu:.5} ada={ea:.5}",
                entries.len()
            );
            assert!(ea <= eu, "{op:?} s={s}: ADA {ea} vs uniform {eu}");
        }
    }
}

#[test]
fn the_trie_re_adapts_after_the_distribution_shifts() {
    let before = |rng: &mut SplitMix64| exponential(rng, 5000.0);
    let (lo, width) = (3_000_000u32, 100_000u32);
    let after = move |rng: &mut SplitMix64| uniform_in(rng, lo, width);
    let mut rng = SplitMix64::new(29);
    let mut trie = BinningTrie::new(16, 32).expect("valid");
    for _ in 0..30 {
        monitor(&mut trie, &mut rng, &before);
        trie.update(TH_BALANCE, TH_EXPANSION);
    }
    let inside = |t: &BinningTrie| {
        t.leaves()
            .iter()
            .filter(|b| b.first() >= u64::from(lo) && b.last() < u64::from(lo + width))
            .count()
    };
    assert_eq!(inside(&trie), 0, "phase 1 has no bins in phase 2's range");
    // The bins have moved once phase 1's fine bins near 0 merged back into one, several
    // bins lie inside phase 2's range, and the trie settled (an epoch left it unchanged).
    // The cold bins left are the chain that covers the rest of the space: a binary trie
    // needs one leaf per level down to the hot range. Seen settling after 12 epochs.
    let settled = (1..=40).find(|epoch| {
        monitor(&mut trie, &mut rng, &after);
        let update = trie.update(TH_BALANCE, TH_EXPANSION);
        let merged_near_zero = trie.bin_of(0).ok() == trie.bin_of(50_000).ok();
        let done = update == Update::Unchanged && merged_near_zero && inside(&trie) >= 4;
        if done {
            eprintln!("re-adapted after {epoch} epochs");
        }
        done
    });
    assert!(
        settled.is_some(),
        "not re-adapted in 40 epochs: {:?}",
        trie.leaves()
    );
    // The deepest bins, where the population is finest, are all in the new range.
    let depth = trie.depth();
    assert!(trie
        .leaves()
        .iter()
        .filter(|b| b.len == depth)
        .all(|b| b.first() >= u64::from(lo) && b.last() < u64::from(lo + width)));
}

/// The relative half-width of the entry of `table` that `x` falls in (0 for an exact one).
fn half_width(table: &ArithTable, x: u32) -> f64 {
    let entries = table.operand_table();
    let x = u64::from(x);
    let i = entries.partition_point(|e| e.value <= x) - 1;
    let e = entries[i];
    assert!(e.matches(x), "{x} is covered");
    let width = (!e.mask & 0xffff_ffff) + 1;
    match (width, e.value) {
        (1, _) => 0.0,
        (_, 0) => panic!("{x}: an entry over [0, {width}) has no relative bound"),
        (w, lo) => (w as f64 / 2.0) / lo as f64,
    }
}

/// Each operation on ADA's population is within the bound of the entries its operands fall
/// in (`Op::entry_error_bound`), on skewed operands and at several budgets: the population
/// never leaves an operand in an entry reaching down to 0, where no relative bound holds.
#[test]
fn ada_populations_are_within_their_entries_bounds() {
    let draw = |rng: &mut SplitMix64| 1 + exponential(rng, 20_000.0);
    let mut rng = SplitMix64::new(41);
    let mut trie = BinningTrie::new(16, 32).expect("valid");
    for _ in 0..30 {
        monitor(&mut trie, &mut rng, &draw);
        trie.update(TH_BALANCE, TH_EXPANSION);
    }
    monitor(&mut trie, &mut rng, &draw);
    let samples: Vec<(u32, u32)> = (0..3000)
        .map(|_| (draw(&mut rng), draw(&mut rng)))
        .chain([(1, 1), (2, 3), (u32::MAX, 1), (1 << 31, 5)])
        .collect();
    let s = 4;
    for budget in [64, 240, 896] {
        let entries = trie.populate(budget).expect("the budget covers the bins");
        for op in Op::ALL {
            let table = ArithTable::from_entries(op, &entries, s).expect("valid");
            for &(a, b) in &samples {
                let exact = op.exact(a, b).expect("positive operands");
                let approx = table.eval(a, b).expect("covering table");
                let bound = op.entry_error_bound(half_width(&table, a), half_width(&table, b), s);
                assert!(
                    op.within(bound, exact, approx),
                    "{op:?} at {budget}: {a}, {b}: {approx} vs {exact} (bound {bound})"
                );
            }
        }
    }
}

/// A `th_expansion` deeper than any trie never triggers step 1's expansion, up to
/// `u32::MAX`, whose sum with the depth overflowed (a panic; in release a wrap that
/// expanded every epoch with hits): balanced hits leave the trie alone, and a point mass
/// already in a one-operand bin changes nothing.
#[test]
fn an_expansion_threshold_beyond_any_depth_never_grows() {
    let record = |t: &mut BinningTrie, v: u64| {
        for _ in 0..50 {
            t.record(v).expect("8-bit operand");
        }
    };
    let mut t = BinningTrie::new(4, 8).expect("valid");
    for v in [10, 80, 150, 220] {
        record(&mut t, v);
    }
    assert_eq!(t.update(TH_BALANCE, u32::MAX), Update::Unchanged);
    assert_eq!(t.entries(), 4);
    // A point mass at 200, driven into a bin of its own by the paper's threshold.
    for _ in 0..40 {
        record(&mut t, 200);
        t.update(TH_BALANCE, TH_EXPANSION);
    }
    let i = t.bin_of(200).expect("in range");
    assert_eq!(t.leaves()[i].len, 8, "a bin of its own");
    let bins = t.leaves().to_vec();
    record(&mut t, 200);
    assert_eq!(t.update(TH_BALANCE, u32::MAX), Update::Unchanged);
    assert_eq!(t.leaves(), &bins[..]);
}

/// A trie of one bin (Algorithm 1 with `M = 1`) never adapts, however skewed its hits:
/// so the controller's settings ask for at least two monitoring entries.
#[test]
fn a_one_bin_trie_never_adapts_so_the_settings_refuse_it() {
    let mut t = BinningTrie::new(1, 8).expect("valid");
    for _ in 0..10 {
        for _ in 0..100 {
            t.record(200).expect("8-bit operand");
        }
        assert_eq!(t.update(TH_BALANCE, TH_EXPANSION), Update::Unchanged);
    }
    assert_eq!(t.entries(), 1);
    // Two bins do: the hot one splits.
    let mut two = BinningTrie::new(2, 8).expect("valid");
    for _ in 0..100 {
        two.record(200).expect("8-bit operand");
    }
    assert_ne!(two.update(TH_BALANCE, TH_EXPANSION), Update::Unchanged);
    let cfg = |monitor_entries| pfemu::ada::block::AdaConfig {
        monitor_entries,
        ..pfemu::ada::block::AdaConfig::new(Op::Square)
    };
    let e = cfg(1).check().expect_err("one bin");
    assert_eq!(e.setting, "monitor_entries");
    assert!(e.reason.contains("from 2"), "{e}");
    cfg(2).check().expect("two bins adapt");
}

/// Hit counters near `u64::MAX` (set from outside, as a controller reads them) do not
/// overflow Algorithm 2's pair sums: the coldest pair not holding the hottest bin sums
/// `1 + u64::MAX`, which saturates, is no colder than the hottest bin, and nothing merges;
/// Algorithm 3 still covers every operand.
#[test]
fn counters_near_the_top_do_not_overflow_the_trie() {
    let mut t = BinningTrie::new(4, 8).expect("valid");
    t.set_hits(&[u64::MAX, 0, 1, u64::MAX])
        .expect("one count per bin");
    assert_eq!(t.populate(64).expect("enough").len(), 64);
    assert_eq!(t.update(TH_BALANCE, TH_EXPANSION), Update::Unchanged);
    t.set_hits(&[u64::MAX; 4]).expect("one count per bin");
    assert_eq!(t.update(TH_BALANCE, TH_EXPANSION), Update::Unchanged);
}

/// A population budget is capped by what a table may hold, `MAX_TABLE_ENTRIES`: over
/// 32-bit operands, one entry more is refused before anything is built, and so is
/// `u64::MAX` (2^32 entries, 96 GiB: the process aborted building them). A narrow trie
/// takes any budget, since it never needs more than one entry per operand.
#[test]
fn populations_larger_than_a_table_are_refused() {
    use pfemu::ada::arith::MAX_TABLE_ENTRIES;
    use pfemu::ada::AdaError;
    let t = BinningTrie::new(4, 32).expect("valid");
    let too_large = |entries| {
        Err(AdaError::TableTooLarge {
            table: "operand",
            entries,
            max: MAX_TABLE_ENTRIES,
            significant_bits: None,
        })
    };
    assert_eq!(
        t.populate(MAX_TABLE_ENTRIES + 1),
        too_large(MAX_TABLE_ENTRIES + 1)
    );
    assert_eq!(t.populate(u64::MAX), too_large(1 << 32));
    let msg = t.populate(u64::MAX).map(|_| ()).unwrap_err().to_string();
    assert!(
        msg.contains("4294967296 entries") && msg.contains("16777216"),
        "{msg}"
    );
    let narrow = BinningTrie::new(4, 8).expect("valid");
    assert_eq!(narrow.populate(u64::MAX).expect("256 at most").len(), 256);
    assert_eq!(t.populate(1 << 12).expect("fits").len(), 1 << 12);
}
