//! The error of lookup-table arithmetic against the exact result: the entry budget sweep
//! (uniform against ADA), Figure 7a-b (the uniform population against its significant bits)
//! and Figure 7c (errors through iterated lookups).
//!
//! The error of one lookup is relative, `|approx - exact| / exact`, except for `log2`,
//! whose error is absolute (a relative error of a logarithm is unbounded near 1; the
//! uniform population's bound is absolute too, [`Op::error_bound`]). Operands are never 0:
//! a program branches on 0 before the lookup (`0 * b = 0`, `log2 0` and `a / 0` undefined;
//! see [`crate::ada::arith`]), so the samples redraw it. Every lookup is also checked:
//! it must find an entry, and a uniform population's result must lie within
//! [`Op::within_bound`] of the exact one ([`Checks`]).

use std::collections::HashMap;

use serde::Serialize;

use super::binning::{converge, Monitoring, Source};
use super::dist::Dist;
use crate::ada::arith::{ArithTable, Op, OPERAND_BITS};
use crate::ada::trie::{uniform_population_len, BinningTrie};
use crate::ada::AdaError;
use crate::lab::bench::experiments::ExperimentError;
use crate::rng::SplitMix64;

/// What the lookups of a run were checked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Checks {
    /// Lookups made (each operation's evaluation, log and antilog tables together).
    pub lookups: u64,
    /// Lookups that matched no entry (a table that does not cover its operands).
    pub misses: u64,
    /// Uniform-population results checked against [`Op::within_bound`].
    pub bound_checks: u64,
    /// Of those, results outside the bound.
    pub bound_violations: u64,
}

impl Checks {
    /// Adds `other`'s counts.
    pub fn add(&mut self, other: &Checks) {
        self.lookups += other.lookups;
        self.misses += other.misses;
        self.bound_checks += other.bound_checks;
        self.bound_violations += other.bound_violations;
    }

    /// No miss and no bound violation.
    pub fn passed(&self) -> bool {
        self.misses == 0 && self.bound_violations == 0
    }
}

/// Mean, 99th percentile (nearest rank) and maximum of a set of errors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct ErrorStats {
    /// Mean error.
    pub mean: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
    /// Lookups measured.
    pub samples: usize,
}

impl ErrorStats {
    /// The statistics of `errors` (reordered).
    pub fn of(errors: &mut [f64]) -> ErrorStats {
        if errors.is_empty() {
            return ErrorStats::default();
        }
        errors.sort_by(f64::total_cmp);
        let n = errors.len();
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        ErrorStats {
            mean: errors.iter().sum::<f64>() / n as f64,
            p99: errors[rank - 1],
            max: errors[n - 1],
            samples: n,
        }
    }
}

/// The operations, as the report names them.
pub fn op_name(op: Op) -> &'static str {
    match op {
        Op::Square => "square",
        Op::Sqrt => "sqrt",
        Op::Log2 => "log2",
        Op::Mul => "mul",
        Op::Div => "div",
    }
}

/// The error of one result (module doc).
pub fn error_of(op: Op, exact: f64, approx: f64) -> f64 {
    let diff = (approx - exact).abs();
    if op == Op::Log2 || exact == 0.0 {
        diff
    } else {
        diff / exact.abs()
    }
}

/// Operand table entries of the uniform population with `s` significant bits over 32-bit
/// operands: `2^s (33 - s)` ([`uniform_population_len`] over 32 bits).
pub fn uniform_entries(s: u32) -> u64 {
    uniform_population_len(OPERAND_BITS, s)
}

/// The most significant bits whose uniform population fits `budget` entries.
pub fn uniform_bits_for(budget: u64) -> Option<u32> {
    (0..32).rev().find(|&s| uniform_entries(s) <= budget)
}

/// The uniform tables built so far, by operation and significant bits.
#[derive(Default)]
pub(super) struct UniformTables(HashMap<(Op, u32), ArithTable>);

impl UniformTables {
    /// The uniform table of `op` with `s` significant bits.
    pub fn get(&mut self, op: Op, s: u32) -> Result<&ArithTable, ExperimentError> {
        if let std::collections::hash_map::Entry::Vacant(e) = self.0.entry((op, s)) {
            e.insert(ArithTable::uniform(op, s).map_err(ada)?);
        }
        self.0
            .get(&(op, s))
            .ok_or_else(|| ExperimentError::Run("a uniform table went missing".into()))
    }
}

pub(super) fn ada(e: AdaError) -> ExperimentError {
    ExperimentError::Run(format!("ADA: {e}"))
}

/// Looks `(a, b)` up in `table`, checks it (`bound`: the table is the uniform population
/// with that many significant bits) and returns its error; `None` where the operation is
/// undefined or the lookup missed.
pub(super) fn lookup_error(
    table: &ArithTable,
    a: u32,
    b: u32,
    bound: Option<u32>,
    checks: &mut Checks,
) -> Option<f64> {
    let op = table.op();
    let exact = op.exact(a, b)?;
    checks.lookups += 1;
    let Some(approx) = table.eval(a, b) else {
        checks.misses += 1;
        return None;
    };
    if let Some(s) = bound {
        checks.bound_checks += 1;
        if !op.within_bound(s, exact, approx) {
            checks.bound_violations += 1;
        }
    }
    Some(error_of(op, exact, approx))
}

/// The errors of `table` on `pairs` (one-operand operations use the first of each).
pub(super) fn errors(
    table: &ArithTable,
    pairs: &[(u32, u32)],
    bound: Option<u32>,
    checks: &mut Checks,
) -> Vec<f64> {
    pairs
        .iter()
        .filter_map(|&(a, b)| lookup_error(table, a, b, bound, checks))
        .collect()
}

/// `n` operand pairs, both non-zero, drawn independently from `dist` over `0..range`.
pub(super) fn pairs(dist: &Dist, range: u32, n: usize, rng: &mut SplitMix64) -> Vec<(u32, u32)> {
    (0..n)
        .map(|_| {
            let a = dist.nonzero_operand(rng, range);
            (a, dist.nonzero_operand(rng, range))
        })
        .collect()
}

/// Uniform against ADA at one entry budget, for one distribution and operation.
#[derive(Clone, Debug, Serialize)]
pub struct BudgetRow {
    /// The distribution.
    pub distribution: String,
    /// The operation.
    pub op: &'static str,
    /// Operand-table entries allowed.
    pub budget: u64,
    /// The uniform population's significant bits: the most that fit the budget.
    pub uniform_s: u32,
    /// Its operand-table entries.
    pub uniform_entries: u64,
    /// Its error.
    pub uniform: ErrorStats,
    /// ADA's operand-table entries (the whole budget, unless every operand has an exact
    /// entry with fewer).
    pub ada_entries: Option<usize>,
    /// ADA's error; `None` when its population could not be built (`note`).
    pub ada: Option<ErrorStats>,
    /// Why ADA has no figure, if it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl BudgetRow {
    /// Uniform's mean error over ADA's (above 1: ADA is better).
    pub fn gain(&self) -> Option<f64> {
        self.ada.map(|a| self.uniform.mean / a.mean)
    }
}

/// The budget sweep for one distribution: for each operation and budget, the uniform
/// population against ADA's (`trie.populate(budget)`, the trie holding its last epoch's
/// hits), on the same operand pairs.
pub(super) fn budget_rows(
    name: &str,
    trie: &BinningTrie,
    pairs: &[(u32, u32)],
    budgets: &[u64],
    uniform: &mut UniformTables,
    checks: &mut Checks,
) -> Result<Vec<BudgetRow>, ExperimentError> {
    let mut rows = Vec::new();
    for op in Op::ALL {
        for &budget in budgets {
            let s = uniform_bits_for(budget)
                .ok_or_else(|| ExperimentError::Run(format!("budget {budget} below 33")))?;
            let u = uniform.get(op, s)?;
            let uniform_stats = ErrorStats::of(&mut errors(u, pairs, Some(s), checks));
            let (ada_entries, ada_stats, note) = match trie.populate(budget) {
                Ok(entries) => {
                    let t = ArithTable::from_entries(op, &entries, s).map_err(ada)?;
                    let e = ErrorStats::of(&mut errors(&t, pairs, None, checks));
                    (Some(entries.len()), Some(e), None)
                }
                Err(e @ AdaError::BudgetBelowBins { .. }) => (None, None, Some(e.to_string())),
                Err(e) => return Err(ada(e)),
            };
            rows.push(BudgetRow {
                distribution: name.to_string(),
                op: op_name(op),
                budget,
                uniform_s: s,
                uniform_entries: uniform_entries(s),
                uniform: uniform_stats,
                ada_entries,
                ada: ada_stats,
                note,
            });
        }
    }
    Ok(rows)
}

// ----- Figure 7a-b --------------------------------------------------------------------------

/// The uniform population's error at `s` significant bits for one operation and operand
/// distributions (Figure 7a), and its size (Figure 7b).
#[derive(Clone, Debug, Serialize)]
pub struct SigBitsRow {
    /// The operation.
    pub op: &'static str,
    /// The operands: `G`, `U` (one operand), `GxG`, `UxU`, `UxG` (two).
    pub operands: &'static str,
    /// Significant bits.
    pub s: u32,
    /// Operand-table entries, `2^s (33 - s)`.
    pub entries: u64,
    /// Antilog-table entries (two-operand operations; 0 otherwise).
    pub antilog_entries: usize,
    /// The error.
    pub error: ErrorStats,
}

/// Figure 7's Gaussian: median 4000, variance 32500.
pub fn fig7_gaussian() -> Dist {
    Dist::Gaussian {
        mean: 4000.0,
        sd: 32_500f64.sqrt(),
    }
}

/// Figure 7a-b for `op`: each `s`, each operand case, `n` samples per case.
pub(super) fn sig_bits_rows(
    op: Op,
    bits: &[u32],
    n: usize,
    seed: u64,
    checks: &mut Checks,
) -> Result<Vec<SigBitsRow>, ExperimentError> {
    let g = fig7_gaussian();
    let u = Dist::Uniform {
        lo: 0.0,
        hi: f64::from(super::dist::RANGE),
    };
    let range = super::dist::RANGE;
    let mut rng = SplitMix64::new(seed);
    let cases: Vec<(&'static str, Vec<(u32, u32)>)> = if op.is_binary() {
        let gg = pairs(&g, range, n, &mut rng);
        let uu = pairs(&u, range, n, &mut rng);
        let ug = (0..n)
            .map(|_| {
                let a = u.nonzero_operand(&mut rng, range);
                (a, g.nonzero_operand(&mut rng, range))
            })
            .collect();
        vec![("GxG", gg), ("UxU", uu), ("UxG", ug)]
    } else {
        vec![
            ("G", pairs(&g, range, n, &mut rng)),
            ("U", pairs(&u, range, n, &mut rng)),
        ]
    };
    let mut rows = Vec::new();
    for &s in bits {
        let table = ArithTable::uniform(op, s).map_err(ada)?;
        for (name, ps) in &cases {
            rows.push(SigBitsRow {
                op: op_name(op),
                operands: name,
                s,
                entries: table.operand_entries() as u64,
                antilog_entries: table.antilog_table().len(),
                error: ErrorStats::of(&mut errors(&table, ps, Some(s), checks)),
            });
        }
    }
    Ok(rows)
}

// ----- Figure 7c ----------------------------------------------------------------------------

/// The functions Figure 7c iterates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Chain {
    /// `f(x) = 2x`, a multiplication by the constant 2.
    #[serde(rename = "2x")]
    Double,
    /// `f(x) = x^2`, by the square table.
    #[serde(rename = "x^2")]
    Square,
}

impl Chain {
    /// As the paper writes it.
    pub fn name(self) -> &'static str {
        match self {
            Chain::Double => "2x",
            Chain::Square => "x^2",
        }
    }

    fn op(self) -> Op {
        match self {
            Chain::Double => Op::Mul,
            Chain::Square => Op::Square,
        }
    }

    /// `log2` of the exact value after `n` iterations from `x0`.
    fn exact_log2(self, x0: u32, n: u32) -> f64 {
        let l = f64::from(x0).log2();
        match self {
            Chain::Double => f64::from(n) + l,
            Chain::Square => 2f64.powi(n as i32) * l,
        }
    }
}

/// Figure 7c's starting values: median 10, variance 100.
pub fn fig7c_start() -> Dist {
    Dist::Gaussian {
        mean: 10.0,
        sd: 10.0,
    }
}

/// Starting values lie in `1..START_RANGE` (a Gaussian of median 10 never reaches it).
const START_RANGE: u32 = 1 << 20;

const TWO_32: f64 = 4_294_967_296.0;

/// A value `m 2^e` whose mantissa `m` is the 32-bit operand the table sees: values beyond
/// 32 bits keep their top 32 bits (as the paper's [13], InREC, handles large reals).
fn from_log2(l: f64) -> (u32, i32) {
    let v = l.exp2();
    if v < TWO_32 - 0.5 {
        return (v.round() as u32, 0);
    }
    let e = l.floor() as i32 - 31;
    let m = (l - f64::from(e)).exp2().floor().min(f64::from(u32::MAX));
    (m as u32, e)
}

/// `r 2^e` renormalised to a 32-bit mantissa (truncating: at most `2^-31` relative).
fn renormalise(r: f64, e: i32) -> (u32, i32) {
    if r < TWO_32 - 0.5 {
        return (r.round() as u32, e);
    }
    let k = r.log2().floor() as i32 - 31;
    let m = (r / 2f64.powi(k)).floor().min(f64::from(u32::MAX));
    (m as u32, e + k)
}

/// The operands the table sees in exact iterations of a chain from Figure 7c's starting
/// values (the constant 2 included for `2x`): what ADA's monitoring learns from.
pub(super) struct ChainOperands {
    pub chain: Chain,
    pub iterations: u32,
}

impl Source for ChainOperands {
    fn fill(&self, rng: &mut SplitMix64, n: usize, out: &mut Vec<u32>) {
        let start = fig7c_start();
        let target = out.len() + n;
        while out.len() < target {
            let x0 = start.nonzero_operand(rng, START_RANGE);
            for i in 0..self.iterations {
                if out.len() == target {
                    break;
                }
                out.push(from_log2(self.chain.exact_log2(x0, i)).0);
                if self.chain == Chain::Double && out.len() < target {
                    out.push(2);
                }
            }
        }
    }
}

/// One point of Figure 7c.
#[derive(Clone, Debug, Serialize)]
pub struct PropagationRow {
    /// The function.
    pub function: Chain,
    /// `uniform` or `ADA`.
    pub method: &'static str,
    /// Iterations done.
    pub iteration: u32,
    /// Relative error of the value after them, against the exact value.
    pub error: ErrorStats,
}

/// Figure 7c for one function.
#[derive(Clone, Debug, Serialize)]
pub struct Propagation {
    /// The function.
    pub function: Chain,
    /// Operand-table budget of both populations.
    pub budget: u64,
    /// The uniform population's significant bits.
    pub uniform_s: u32,
    /// ADA's operand-table entries; `None` when the budget cannot cover its bins (`note`).
    pub ada_entries: Option<usize>,
    /// ADA's monitoring bins (learnt from the operands of exact chains).
    pub ada_bins: usize,
    /// Why ADA has no rows, if it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Per method and iteration.
    pub rows: Vec<PropagationRow>,
}

/// Runs Figure 7c for `chain`: ADA's trie learns the operands of exact chains, then both
/// tables iterate `chains` fresh starting values.
#[allow(clippy::too_many_arguments)]
pub(super) fn propagation(
    chain: Chain,
    monitoring: &Monitoring,
    budget: u64,
    iterations: u32,
    chains: usize,
    seed: u64,
    checks: &mut Checks,
) -> Result<Propagation, ExperimentError> {
    let op = chain.op();
    let s = uniform_bits_for(budget)
        .ok_or_else(|| ExperimentError::Run(format!("budget {budget} below 33")))?;
    let mut rng = SplitMix64::new(seed);
    let source = ChainOperands { chain, iterations };
    let learnt = converge(monitoring, &source, &mut rng)?;
    let (entries, note) = match learnt.last.populate(budget) {
        Ok(entries) => (Some(entries), None),
        Err(e @ AdaError::BudgetBelowBins { .. }) => (None, Some(e.to_string())),
        Err(e) => return Err(ada(e)),
    };
    let ada_table = match &entries {
        Some(e) => Some(ArithTable::from_entries(op, e, s).map_err(ada)?),
        None => None,
    };
    let uniform = ArithTable::uniform(op, s).map_err(ada)?;
    let start = fig7c_start();
    let x0s: Vec<u32> = (0..chains)
        .map(|_| start.nonzero_operand(&mut rng, START_RANGE))
        .collect();
    let mut rows = Vec::new();
    let tables = [
        ("uniform", Some(&uniform), Some(s)),
        ("ADA", ada_table.as_ref(), None),
    ];
    for (method, table, bound) in tables {
        let Some(table) = table else { continue };
        let mut per_iteration: Vec<Vec<f64>> =
            vec![Vec::with_capacity(chains); iterations as usize];
        for &x0 in &x0s {
            let (mut m, mut e) = (x0, 0i32);
            for (n, errs) in per_iteration.iter_mut().enumerate() {
                let b = if chain == Chain::Double { 2 } else { 0 };
                checks.lookups += 1;
                let Some(r) = table.eval(m, b) else {
                    checks.misses += 1;
                    break;
                };
                if let (Some(s), Some(exact)) = (bound, op.exact(m, b)) {
                    checks.bound_checks += 1;
                    if !op.within_bound(s, exact, r) {
                        checks.bound_violations += 1;
                    }
                }
                let scaled = if chain == Chain::Square { 2 * e } else { e };
                (m, e) = renormalise(r, scaled);
                let approx_log2 = f64::from(m).log2() + f64::from(e);
                let exact_log2 = chain.exact_log2(x0, n as u32 + 1);
                errs.push(((approx_log2 - exact_log2).exp2() - 1.0).abs());
            }
        }
        for (n, mut errs) in per_iteration.into_iter().enumerate() {
            rows.push(PropagationRow {
                function: chain,
                method,
                iteration: n as u32 + 1,
                error: ErrorStats::of(&mut errs),
            });
        }
    }
    Ok(Propagation {
        function: chain,
        budget,
        uniform_s: s,
        ada_entries: entries.map(|e| e.len()),
        ada_bins: learnt.last.entries(),
        note,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniform_budgets_follow_the_entry_count() {
        assert_eq!(uniform_entries(0), 33);
        assert_eq!(uniform_entries(5), 32 * 28);
        assert_eq!(uniform_bits_for(33), Some(0));
        assert_eq!(uniform_bits_for(63), Some(0));
        assert_eq!(uniform_bits_for(64), Some(1));
        assert_eq!(uniform_bits_for(896), Some(5));
        assert_eq!(uniform_bits_for(32), None);
        // The CLI's largest budget: s = 15, well within ArithTable's MAX_TABLE_ENTRIES.
        assert_eq!(uniform_bits_for(super::super::MAX_BUDGET), Some(15));
        for s in 0..16 {
            let t = ArithTable::uniform(Op::Sqrt, s).expect("valid");
            assert_eq!(t.operand_entries() as u64, uniform_entries(s));
        }
    }

    #[test]
    fn values_beyond_32_bits_keep_their_top_bits() {
        assert_eq!(from_log2(10f64.log2()), (10, 0));
        let (m, e) = from_log2(40.0);
        assert_eq!((m, e), (1 << 31, 9));
        assert_eq!(renormalise(1e3, 4), (1000, 4));
        let (m, e) = renormalise(2f64.powi(40) * 1.5, 2);
        assert_eq!((m, e), (3 << 30, 11));
    }

    #[test]
    fn stats_use_the_nearest_rank() {
        let mut v: Vec<f64> = (1..=200).map(f64::from).collect();
        let s = ErrorStats::of(&mut v);
        assert_eq!((s.p99, s.max, s.samples), (198.0, 200.0, 200));
        assert!((s.mean - 100.5).abs() < 1e-12);
        assert_eq!(ErrorStats::of(&mut []), ErrorStats::default());
    }
}
