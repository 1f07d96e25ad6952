//! Algorithms 1 and 2 run epoch by epoch until the trie is steady: Figure 5 (the bins
//! converge to the distribution) and Figure 6 (the monitoring table grows from two bins).
//!
//! An epoch records `--epoch-operands` operands in the trie, snapshots it with
//! its hits (Algorithm 3 and the densities need them; [`BinningTrie::update`] resets them),
//! then runs Algorithm 2. The trie is *steady* once `--steady-epochs` epochs in
//! a row leave it unchanged; the run stops there or at `--max-epochs`.

use serde::Serialize;

use super::dist::{Dist, HIST_BIN, RANGE};
use crate::ada::trie::{BinningTrie, Update};
use crate::lab::bench::experiments::ExperimentError;
use crate::rng::SplitMix64;

/// A bin as the densities see it: its first and last operands and its hits.
pub type Span = (u64, u64, u64);

/// Where a monitoring epoch's operands come from.
pub(super) trait Source {
    /// Appends `n` operands to `out`.
    fn fill(&self, rng: &mut SplitMix64, n: usize, out: &mut Vec<u32>);
}

/// Operands of a distribution over `0..range`.
pub(super) struct Operands<'a> {
    pub dist: &'a Dist,
    pub range: u32,
}

impl Source for Operands<'_> {
    fn fill(&self, rng: &mut SplitMix64, n: usize, out: &mut Vec<u32>) {
        out.extend((0..n).map(|_| self.dist.operand(rng, self.range)));
    }
}

/// The monitoring settings of a run.
#[derive(Clone, Copy, Debug)]
pub(super) struct Monitoring {
    /// Algorithm 1's M.
    pub entries: u64,
    /// The operand width.
    pub bits: u32,
    pub epoch_operands: usize,
    pub th_balance: f64,
    pub th_expansion: u32,
    pub max_epochs: u32,
    pub steady_epochs: u32,
}

/// One change Algorithm 2 made.
#[derive(Clone, Debug, Serialize)]
pub struct Change {
    /// The epoch (from 1) whose update made it.
    pub epoch: u32,
    /// `rebalanced` (split and merge) or `expanded` (split, one entry more).
    pub kind: &'static str,
    /// Bins after it.
    pub bins: usize,
    /// The trie's depth after it.
    pub depth: u32,
}

/// A run of Algorithms 1 and 2 to a steady trie.
#[derive(Clone, Debug)]
pub(super) struct Converged {
    /// Algorithm 1's trie with the first epoch's hits.
    pub initial: BinningTrie,
    /// The trie with the last epoch's hits (steady: that epoch changed nothing).
    pub last: BinningTrie,
    /// The last epoch's operands.
    pub last_operands: Vec<u32>,
    /// Every change, in order, with the leaves `(first, last, hits)` the trie had after it.
    pub changes: Vec<(Change, Vec<Span>)>,
    /// Epochs run.
    pub epochs: u32,
    /// Whether `steady_epochs` epochs in a row changed nothing.
    pub steady: bool,
}

/// Runs Algorithms 1 and 2 on `source`'s operands until the trie is steady.
pub(super) fn converge(
    m: &Monitoring,
    source: &dyn Source,
    rng: &mut SplitMix64,
) -> Result<Converged, ExperimentError> {
    let ada = |e: crate::ada::AdaError| ExperimentError::Run(format!("ADA: {e}"));
    let mut trie = BinningTrie::new(m.entries, m.bits).map_err(ada)?;
    let mut first: Option<BinningTrie> = None;
    let mut changes = Vec::new();
    let mut quiet = 0;
    let mut ops = Vec::with_capacity(m.epoch_operands);
    let mut last = trie.clone();
    let mut epochs = 0;
    while epochs < m.max_epochs {
        epochs += 1;
        ops.clear();
        source.fill(rng, m.epoch_operands, &mut ops);
        for &x in &ops {
            trie.record(u64::from(x)).map_err(ada)?;
        }
        last.clone_from(&trie);
        if first.is_none() {
            first = Some(trie.clone());
        }
        let kind = match trie.update(m.th_balance, m.th_expansion) {
            Update::Unchanged => None,
            Update::Rebalanced { .. } => Some("rebalanced"),
            Update::Expanded { .. } => Some("expanded"),
        };
        match kind {
            None => {
                quiet += 1;
                if quiet >= m.steady_epochs {
                    break;
                }
            }
            Some(kind) => {
                quiet = 0;
                let change = Change {
                    epoch: epochs,
                    kind,
                    bins: trie.entries(),
                    depth: trie.depth(),
                };
                changes.push((change, leaves(&trie)));
            }
        }
    }
    let initial = first.unwrap_or_else(|| trie.clone());
    Ok(Converged {
        initial,
        last,
        last_operands: ops,
        changes,
        epochs,
        steady: quiet >= m.steady_epochs,
    })
}

/// A trie's leaves as `(first, last, hits)`.
pub(super) fn leaves(t: &BinningTrie) -> Vec<Span> {
    t.leaves()
        .iter()
        .map(|b| (b.first(), b.last(), b.hits))
        .collect()
}

/// The total variation distance between `truth` (bins of [`HIST_BIN`] over `0..RANGE`,
/// summing to 1) and the piecewise-constant density of `pieces` `(first, last, hits)`: each
/// piece's hits spread evenly over its operands. A piece's share outside `0..RANGE`
/// counts in full (the truth has none there).
pub fn total_variation(truth: &[f64], pieces: &[Span]) -> f64 {
    let q = piece_masses(truth.len(), pieces);
    let Some((inside, outside)) = q else {
        return 1.0;
    };
    let diff: f64 = truth.iter().zip(&inside).map(|(p, q)| (p - q).abs()).sum();
    0.5 * (diff + outside)
}

/// The share of `pieces`' hits in each of `bins` bins of [`HIST_BIN`], and the share outside
/// `0..RANGE`; `None` without hits.
pub(super) fn piece_masses(bins: usize, pieces: &[Span]) -> Option<(Vec<f64>, f64)> {
    let total: u64 = pieces.iter().map(|p| p.2).sum();
    if total == 0 {
        return None;
    }
    let bin = u64::from(HIST_BIN);
    let range = u64::from(RANGE);
    let mut inside = vec![0.0; bins];
    let mut outside = 0.0;
    for &(first, last, hits) in pieces.iter().filter(|p| p.2 > 0) {
        let share = hits as f64 / total as f64;
        let width = (last - first + 1) as f64;
        let end = (last + 1).min(range);
        if end < last + 1 {
            outside += share * (last + 1 - end.max(first)) as f64 / width;
        }
        let mut lo = first;
        while lo < end {
            let i = (lo / bin) as usize;
            let hi = ((lo / bin + 1) * bin).min(end);
            if let Some(q) = inside.get_mut(i) {
                *q += share * (hi - lo) as f64 / width;
            }
            lo = hi;
        }
    }
    Some((inside, outside))
}

/// `k` equal-width bins over `0..RANGE` with the hits of `operands`.
pub(super) fn equal_width(operands: &[u32], k: usize) -> Vec<Span> {
    let k = k.max(1) as u64;
    let range = u64::from(RANGE);
    let edge = |j: u64| j * range / k;
    let mut hits = vec![0u64; k as usize];
    for &x in operands {
        // The bin j with edge(j) <= x < edge(j + 1).
        let mut j = (u64::from(x) * k / range).min(k - 1);
        while j > 0 && edge(j) > u64::from(x) {
            j -= 1;
        }
        while j + 1 < k && edge(j + 1) <= u64::from(x) {
            j += 1;
        }
        hits[j as usize] += 1;
    }
    (0..k)
        .map(|j| (edge(j), edge(j + 1) - 1, hits[j as usize]))
        .collect()
}

/// A steady trie's bin as Figure 5 draws it.
#[derive(Clone, Debug, Serialize)]
pub struct BinShare {
    /// The bin's first operand.
    pub first: u64,
    /// Its last operand.
    pub last: u64,
    /// Its share of the last epoch's hits.
    pub share: f64,
}

/// Figure 5 for one distribution.
#[derive(Clone, Debug, Serialize)]
pub struct BinningRow {
    /// The distribution's name.
    pub distribution: String,
    /// Algorithm 1's bins.
    pub bins_initial: usize,
    /// The steady trie's bins (monitoring entries in use).
    pub bins_steady: usize,
    /// Of them, bins without a hit in the last epoch (the chain that covers the empty
    /// operands above the distribution, mostly).
    pub empty_bins: usize,
    /// Its depth.
    pub depth: u32,
    /// Epochs run.
    pub epochs_run: u32,
    /// The epoch of the last change (0: none).
    pub last_change_epoch: u32,
    /// Changes made, rebalancing and expansions.
    pub changes: usize,
    /// Of which expansions.
    pub expansions: usize,
    /// Whether the trie became steady before `--max-epochs`.
    pub steady: bool,
    /// Total variation distance to the true distribution (bins of 2000): Algorithm 1's
    /// equal bins with the first epoch's hits.
    pub tv_initial: f64,
    /// The same for the steady trie with its last epoch's hits.
    pub tv_steady: f64,
    /// Of `tv_steady`, the steady trie's hits it spreads beyond 650000 (a bin that
    /// straddles the end of the domain spreads its hits over all of its operands).
    pub tv_steady_outside: f64,
    /// The same for as many equal-width bins as the steady trie has, over the known range
    /// `[0, 650000)`, with the last epoch's operands (a baseline that knows the range).
    pub tv_equal_width: f64,
    /// The steady trie's bins that meet `[0, 650000)`.
    pub bins: Vec<BinShare>,
    /// The true distribution in bins of 2000 (drawn, not serialised).
    #[serde(skip)]
    pub truth: Vec<f64>,
}

/// Figure 5's row for `name` from its converged run.
pub(super) fn binning_row(name: &str, dist: &Dist, run: &Converged) -> BinningRow {
    let truth = dist.histogram(RANGE, HIST_BIN);
    let steady = leaves(&run.last);
    let total: u64 = steady.iter().map(|p| p.2).sum::<u64>().max(1);
    let bins = steady
        .iter()
        .filter(|p| p.0 < u64::from(RANGE))
        .map(|&(first, last, hits)| BinShare {
            first,
            last,
            share: hits as f64 / total as f64,
        })
        .collect();
    BinningRow {
        distribution: name.to_string(),
        bins_initial: run.initial.entries(),
        bins_steady: run.last.entries(),
        empty_bins: steady.iter().filter(|p| p.2 == 0).count(),
        depth: run.last.depth(),
        epochs_run: run.epochs,
        last_change_epoch: run.changes.last().map_or(0, |c| c.0.epoch),
        changes: run.changes.len(),
        expansions: run
            .changes
            .iter()
            .filter(|c| c.0.kind == "expanded")
            .count(),
        steady: run.steady,
        tv_initial: total_variation(&truth, &leaves(&run.initial)),
        tv_steady: total_variation(&truth, &steady),
        tv_steady_outside: piece_masses(truth.len(), &steady).map_or(1.0, |q| q.1),
        tv_equal_width: total_variation(
            &truth,
            &equal_width(&run.last_operands, run.last.entries()),
        ),
        bins,
        truth,
    }
}

/// Figure 6's view: the bins that meet `0..GROWTH_VIEW` are listed after each change.
pub const GROWTH_VIEW: u64 = 8192;

/// One state of Figure 6's trie: the initial one, then after each change.
#[derive(Clone, Debug, Serialize)]
pub struct GrowthStep {
    /// 0 for Algorithm 1's trie, then the change's number.
    pub change: usize,
    /// The epoch whose update made the change (0 for the initial trie).
    pub epoch: u32,
    /// `initial`, `rebalanced` or `expanded`.
    pub kind: &'static str,
    /// Bins (monitoring entries) after it.
    pub bins: usize,
    /// The bins that meet `[0, 8192)`: `(first, last)`.
    pub in_view: Vec<(u64, u64)>,
}

/// Figure 6 at one operand width.
#[derive(Clone, Debug, Serialize)]
pub struct GrowthRun {
    /// The operand width.
    pub operand_bits: u32,
    /// The initial trie, then each change.
    pub steps: Vec<GrowthStep>,
    /// Epochs run.
    pub epochs_run: u32,
    /// Whether the trie became steady before `--max-epochs`.
    pub steady: bool,
}

/// Figure 6's run from its converged run.
pub(super) fn growth_run(bits: u32, run: &Converged) -> GrowthRun {
    let in_view = |l: &[Span]| {
        l.iter()
            .filter(|p| p.0 < GROWTH_VIEW)
            .map(|p| (p.0, p.1))
            .collect()
    };
    let mut steps = vec![GrowthStep {
        change: 0,
        epoch: 0,
        kind: "initial",
        bins: run.initial.entries(),
        in_view: in_view(&leaves(&run.initial)),
    }];
    for (i, (c, l)) in run.changes.iter().enumerate() {
        steps.push(GrowthStep {
            change: i + 1,
            epoch: c.epoch,
            kind: c.kind,
            bins: c.bins,
            in_view: in_view(l),
        });
    }
    GrowthRun {
        operand_bits: bits,
        steps,
        epochs_run: run.epochs,
        steady: run.steady,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn total_variation_of_the_truth_itself_is_zero() {
        let truth = Dist::Uniform {
            lo: 0.0,
            hi: f64::from(RANGE),
        }
        .histogram(RANGE, HIST_BIN);
        let exact: Vec<Span> = (0..325u64)
            .map(|i| (i * 2000, i * 2000 + 1999, 7))
            .collect();
        assert!(total_variation(&truth, &exact) < 1e-9);
        // One bin over the whole 32-bit space puts almost everything outside.
        let wide = [(0u64, u64::from(u32::MAX), 10)];
        assert!(total_variation(&truth, &wide) > 0.99);
        // Half the hits outside the range: distance one half.
        let half = [(0u64, 649_999, 5), (650_000, 1_299_999, 5)];
        assert!((total_variation(&truth, &half) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn equal_width_bins_cover_the_range() {
        let ops: Vec<u32> = (0..RANGE).step_by(997).collect();
        let bins = equal_width(&ops, 7);
        assert_eq!(bins.len(), 7);
        assert_eq!(bins[0].0, 0);
        assert_eq!(bins[6].1, u64::from(RANGE) - 1);
        assert_eq!(bins.iter().map(|b| b.2).sum::<u64>(), ops.len() as u64);
        for w in bins.windows(2) {
            assert_eq!(w[0].1 + 1, w[1].0);
        }
    }
}
