//! A shifting distribution: operands exponential for `--shift-after` epochs, then Gaussian
//! far from zero for `--shift-epochs`, and how each table follows.
//!
//! The monitoring trie first runs Algorithms 1 and 2 on exponential operands until it is
//! steady (as in Figure 5; these warm-up epochs are not measured, so that a cold start does
//! not swamp the figures), then every epoch of the measured stream. The table *in use*
//! during epoch `t` is the one the control plane populated at the end of epoch `t - 1`
//! (Algorithm 3 on that epoch's hits; in epoch 1, on the warm-up's last epoch), so a shift
//! is first met by a table learnt before it. Three tables are compared on each epoch's
//! operands:
//!
//! - ADA, re-populated every epoch (the control plane rewrites it when the population
//!   changed; [`ShiftEpoch::repopulated`]);
//! - static: ADA's population frozen at the shift (the one in use in the first epoch after
//!   it; before the shift it is ADA's);
//! - the prior work's uniform population at the most significant bits the budget allows.
//!
//! When a budget cannot cover the trie's bins, the previous table stays in use.

use serde::Serialize;

use super::binning::{converge, Monitoring, Operands, Source};
use super::dist::{Dist, RANGE};
use super::lookup::{
    ada, errors, op_name, pairs, uniform_bits_for, uniform_entries, BudgetRow, Checks, ErrorStats,
    UniformTables,
};
use crate::ada::arith::{ArithTable, Op};
use crate::ada::trie::{BinningTrie, TernaryEntry};
use crate::ada::AdaError;
use crate::lab::bench::experiments::ExperimentError;
use crate::rng::SplitMix64;

/// The distribution before the shift: exponential of mean 20000 (Figure 5b's).
pub fn before_shift() -> Dist {
    Dist::Exponential { mean: 20_000.0 }
}

/// The distribution after it: Gaussian of mean 300000 and standard deviation 10000.
pub fn after_shift() -> Dist {
    Dist::Gaussian {
        mean: 300_000.0,
        sd: 10_000.0,
    }
}

/// The shifting stream's monitoring: the trie (with its hits) at the end of each epoch.
pub(super) struct ShiftRun {
    /// `tries[t]`: the trie at the end of epoch `t` with that epoch's hits; `tries[0]` is
    /// Algorithm 1's, without hits.
    pub tries: Vec<BinningTrie>,
    /// `samples[t - 1]`: epoch `t`'s evaluation operands.
    pub samples: Vec<Vec<(u32, u32)>>,
    /// Bins at the end of each epoch, `bins[t - 1]`.
    pub bins: Vec<usize>,
    /// Epochs the warm-up took (to a steady trie, or `--max-epochs`).
    pub warmup_epochs: u32,
}

/// Runs the monitoring to a steady trie on [`before_shift`], then over `before` epochs of
/// it and `after` of [`after_shift`], drawing `per_epoch` evaluation pairs per epoch.
pub(super) fn monitor(
    m: &Monitoring,
    before: u32,
    after: u32,
    per_epoch: usize,
    seed: u64,
) -> Result<ShiftRun, ExperimentError> {
    let (d0, d1) = (before_shift(), after_shift());
    let mut rng = SplitMix64::new(seed);
    let warm = converge(
        m,
        &Operands {
            dist: &d0,
            range: RANGE,
        },
        &mut rng,
    )?;
    // The warm-up's last update left the trie as `warm.last` is, without its hits.
    let mut trie = warm.last.clone();
    trie.update(m.th_balance, m.th_expansion);
    if trie.leaves().len() != warm.last.leaves().len() && warm.steady {
        return Err(ExperimentError::Run(
            "a steady trie changed when its last epoch was replayed".into(),
        ));
    }
    let mut run = ShiftRun {
        tries: vec![warm.last],
        samples: Vec::new(),
        bins: Vec::new(),
        warmup_epochs: warm.epochs,
    };
    let mut ops = Vec::with_capacity(m.epoch_operands);
    for t in 1..=before + after {
        let dist = if t <= before { &d0 } else { &d1 };
        ops.clear();
        Operands { dist, range: RANGE }.fill(&mut rng, m.epoch_operands, &mut ops);
        for &x in &ops {
            trie.record(u64::from(x)).map_err(ada)?;
        }
        run.tries.push(trie.clone());
        trie.update(m.th_balance, m.th_expansion);
        run.bins.push(trie.entries());
        run.samples.push(pairs(dist, RANGE, per_epoch, &mut rng));
    }
    Ok(run)
}

/// ADA's population in use in each epoch `t` (index `t - 1`): from `tries[t - 1]`, or the
/// previous one when the budget cannot cover the bins; `None` before any fits.
fn populations(
    run: &ShiftRun,
    budget: u64,
) -> Result<Vec<Option<Vec<TernaryEntry>>>, ExperimentError> {
    let mut out = Vec::with_capacity(run.samples.len());
    let mut current: Option<Vec<TernaryEntry>> = None;
    for trie in &run.tries[..run.samples.len()] {
        match trie.populate(budget) {
            Ok(e) => current = Some(e),
            Err(AdaError::BudgetBelowBins { .. }) => {}
            Err(e) => return Err(ada(e)),
        }
        out.push(current.clone());
    }
    Ok(out)
}

/// The shifting distribution's budget rows: for each operation and budget, the errors
/// over every epoch (each with the table in use then), uniform against ADA.
pub(super) fn budget_rows(
    run: &ShiftRun,
    op: Op,
    budgets: &[u64],
    uniform: &mut UniformTables,
    checks: &mut Checks,
) -> Result<Vec<BudgetRow>, ExperimentError> {
    let mut rows = Vec::new();
    for &budget in budgets {
        let s = uniform_bits_for(budget)
            .ok_or_else(|| ExperimentError::Run(format!("budget {budget} below 33")))?;
        let u = uniform.get(op, s)?;
        let mut ue = Vec::new();
        for samples in &run.samples {
            ue.extend(errors(u, samples, Some(s), checks));
        }
        let pops = populations(run, budget)?;
        let mut ae = Vec::new();
        let mut most = 0;
        let mut complete = true;
        for (pop, samples) in pops.iter().zip(&run.samples) {
            let Some(entries) = pop else {
                complete = false;
                continue;
            };
            most = most.max(entries.len());
            let t = ArithTable::from_entries(op, entries, s).map_err(ada)?;
            ae.extend(errors(&t, samples, None, checks));
        }
        let (ada_entries, ada_stats, note) = if complete {
            (Some(most), Some(ErrorStats::of(&mut ae)), None)
        } else {
            let note = "in some epochs the budget covered no population of the trie's bins";
            (None, None, Some(note.to_string()))
        };
        rows.push(BudgetRow {
            distribution: SHIFTING.to_string(),
            op: op_name(op),
            budget,
            uniform_s: s,
            uniform_entries: uniform_entries(s),
            uniform: ErrorStats::of(&mut ue),
            ada_entries,
            ada: ada_stats,
            note,
        });
    }
    Ok(rows)
}

/// The shifting distribution's name in the budget rows.
pub const SHIFTING: &str = "shifting";

/// One epoch of the shifting stream.
#[derive(Clone, Debug, Serialize)]
pub struct ShiftEpoch {
    /// The epoch, from 1.
    pub epoch: u32,
    /// `before` or `after` the shift.
    pub phase: &'static str,
    /// ADA re-populated every epoch (`None` while no population fits the budget).
    pub ada: Option<ErrorStats>,
    /// ADA's population frozen at the shift.
    #[serde(rename = "static")]
    pub frozen: Option<ErrorStats>,
    /// The uniform population.
    pub uniform: ErrorStats,
    /// Whether the table in use differs from the previous epoch's (a rewrite).
    pub repopulated: bool,
    /// Entries of the table in use that the previous one did not have.
    pub entries_rewritten: usize,
    /// ADA's entries in use.
    pub ada_entries: usize,
    /// Monitoring bins at the end of the epoch.
    pub bins: usize,
}

/// The shifting stream at one operation and budget.
#[derive(Clone, Debug, Serialize)]
pub struct ShiftReport {
    /// The operation.
    pub op: &'static str,
    /// Operand-table budget.
    pub budget: u64,
    /// The uniform population's significant bits.
    pub uniform_s: u32,
    /// Epochs before the shift.
    pub shift_after: u32,
    /// Unmeasured epochs that first made the trie steady on the exponential operands.
    pub warmup_epochs: u32,
    /// The distributions before and after.
    pub before: Dist,
    /// After.
    pub after: Dist,
    /// Per epoch.
    pub epochs: Vec<ShiftEpoch>,
    /// ADA's mean error over the last (up to) five epochs before the shift.
    pub pre_shift_error: f64,
    /// ADA's mean error over the last (up to) five epochs of the run.
    pub final_error: f64,
    /// The factor of `pre_shift_error` that counts as recovered.
    pub recovery_factor: f64,
    /// Epochs after the shift until ADA's mean error is back within `recovery_factor` of
    /// `pre_shift_error` (1: the first epoch after it); `None`: not within the run.
    pub recovered_after: Option<u32>,
    /// Tables rewritten over the whole run.
    pub repopulations: usize,
    /// Tables rewritten from the shift to the recovery (inclusive).
    pub repopulations_to_recover: Option<usize>,
    /// Entries rewritten from the shift to the recovery.
    pub entries_rewritten_to_recover: Option<usize>,
    /// The static table's mean error after the shift against ADA's and uniform's (means
    /// over the epochs after it).
    pub after_shift_mean: AfterShift,
}

/// Mean errors over the epochs after the shift.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct AfterShift {
    /// ADA.
    pub ada: f64,
    /// Static.
    #[serde(rename = "static")]
    pub frozen: f64,
    /// Uniform.
    pub uniform: f64,
}

/// The per-epoch report at `op` and `budget`.
pub(super) fn shift_report(
    run: &ShiftRun,
    op: Op,
    budget: u64,
    shift_after: u32,
    recovery_factor: f64,
    checks: &mut Checks,
) -> Result<ShiftReport, ExperimentError> {
    let s = uniform_bits_for(budget)
        .ok_or_else(|| ExperimentError::Run(format!("budget {budget} below 33")))?;
    let uniform = ArithTable::uniform(op, s).map_err(ada)?;
    let pops = populations(run, budget)?;
    let frozen_pop = pops.get(shift_after as usize).cloned().flatten();
    let frozen = match &frozen_pop {
        Some(e) => Some(ArithTable::from_entries(op, e, s).map_err(ada)?),
        None => None,
    };
    let mut epochs = Vec::new();
    let mut previous: Option<&Vec<TernaryEntry>> = None;
    for (i, (pop, samples)) in pops.iter().zip(&run.samples).enumerate() {
        let t = i as u32 + 1;
        let ada_stats = match pop {
            Some(e) => {
                let table = ArithTable::from_entries(op, e, s).map_err(ada)?;
                Some(ErrorStats::of(&mut errors(&table, samples, None, checks)))
            }
            None => None,
        };
        let frozen_stats = if t <= shift_after {
            ada_stats
        } else {
            frozen
                .as_ref()
                .map(|f| ErrorStats::of(&mut errors(f, samples, None, checks)))
        };
        let (repopulated, written) = match (previous, pop) {
            (Some(old), Some(new)) if old != new => (true, rewritten(old, new)),
            _ => (false, 0),
        };
        if pop.is_some() {
            previous = pop.as_ref();
        }
        epochs.push(ShiftEpoch {
            epoch: t,
            phase: if t <= shift_after { "before" } else { "after" },
            ada: ada_stats,
            frozen: frozen_stats,
            uniform: ErrorStats::of(&mut errors(&uniform, samples, Some(s), checks)),
            repopulated,
            entries_rewritten: written,
            ada_entries: pop.as_ref().map_or(0, Vec::len),
            bins: run.bins[i],
        });
    }
    let ada_mean = |e: &ShiftEpoch| e.ada.map_or(f64::NAN, |a| a.mean);
    let mean_of = |v: &[ShiftEpoch], f: &dyn Fn(&ShiftEpoch) -> f64| {
        v.iter().map(f).sum::<f64>() / v.len().max(1) as f64
    };
    let k = shift_after as usize;
    let pre = &epochs[k.saturating_sub(5)..k];
    let pre_shift_error = mean_of(pre, &ada_mean);
    let last = &epochs[epochs.len().saturating_sub(5)..];
    let final_error = mean_of(last, &ada_mean);
    let after = &epochs[k..];
    let recovered = after
        .iter()
        .position(|e| ada_mean(e) <= recovery_factor * pre_shift_error);
    let window = recovered.map(|r| &after[..=r]);
    Ok(ShiftReport {
        op: op_name(op),
        budget,
        uniform_s: s,
        shift_after,
        warmup_epochs: run.warmup_epochs,
        before: before_shift(),
        after: after_shift(),
        pre_shift_error,
        final_error,
        recovery_factor,
        recovered_after: recovered.map(|r| r as u32 + 1),
        repopulations: epochs.iter().filter(|e| e.repopulated).count(),
        repopulations_to_recover: window.map(|w| w.iter().filter(|e| e.repopulated).count()),
        entries_rewritten_to_recover: window.map(|w| w.iter().map(|e| e.entries_rewritten).sum()),
        after_shift_mean: AfterShift {
            ada: mean_of(after, &ada_mean),
            frozen: mean_of(after, &|e| e.frozen.map_or(f64::NAN, |a| a.mean)),
            uniform: mean_of(after, &|e| e.uniform.mean),
        },
        epochs,
    })
}

/// Entries of `new` that `old` does not have (same range).
fn rewritten(old: &[TernaryEntry], new: &[TernaryEntry]) -> usize {
    let key = |e: &TernaryEntry| (e.value, e.mask);
    let mut have: Vec<(u64, u64)> = old.iter().map(key).collect();
    have.sort_unstable();
    new.iter()
        .filter(|e| have.binary_search(&key(e)).is_err())
        .count()
}
