//! Arithmetic by ternary lookup: the operations, the calculation tables of both populations
//! (the prior work's uniform one and ADA's), and a reference matcher.
//!
//! A table is a list of [`LookupEntry`] (value, mask, priority, result), the way the TCAM
//! block will hold it; [`lookup`] is the reference matcher (highest priority wins, longer
//! masks have higher priority). Results are integers: [`Op::Square`] and [`Op::Mul`] exact
//! integers, the others fixed point with [`FRAC_BITS`] fraction bits.
//!
//! Two-operand operations follow the paper's \[12\] (Sharma et al.): `a * b = 2^(log2 a +
//! log2 b)` and `a / b = 2^(log2 a - log2 b)`, with one log table per operand (both the same
//! table here) and one antilog table over the fixed-point sum, so the entries grow with the
//! sum of the operands' tables rather than their product (a concatenated key would need
//! one entry per pair of ranges). Zero operands are handled before the lookup (the program
//! branches on them): `0 * b = 0`, `0 / b = 0`, and `a / 0` and `log2 0` are undefined.
//!
//! Error bounds of the uniform population with `s` significant bits ([`Op::error_bound`]):
//! an entry covers `[lo, lo + w)` with `w = 2^r` and `lo >= 2^(s + r)` (or `w = 1`, exact),
//! and returns the result of its midpoint `m`, so `m / x` is within `1 +- e` with
//! `e = 2^-(s+1)`. Hence:
//!
//! - square: relative `(1 + e)^2 - 1 = 2^-s + 2^-(2s+2)`;
//! - sqrt: relative `sqrt(1 + e) - 1 <= 2^-(s+2)`, plus the fixed-point rounding `2^-17`;
//! - log2: *absolute* `log2(1 + e) <= e / ln 2`, plus `2^-17` (relative error of a log is
//!   unbounded near 1);
//! - mul and div: two log errors and the antilog key's, `E = 2 (e / ln 2 + 2^-17) +
//!   2^-(s+2)` in the exponent, so relative `2^E - 1` (about `1.7 * 2^-s`), plus half a unit
//!   of the result's last place. The antilog table uses `s + 6` significant bits, so that
//!   the six integer bits of a log sum do not eat the precision of its fraction.

use super::trie::{uniform_population, uniform_population_len, TernaryEntry};
use super::AdaError;
use crate::mem::tcam::TcamEntry;

/// Fraction bits of fixed-point results (sqrt, log2, div) and of the log tables' results.
pub const FRAC_BITS: u32 = 16;

/// The width of operands.
pub const OPERAND_BITS: u32 = 32;

/// The width of an antilog key: a log sum (or a log difference plus [`DIV_OFFSET`]) of two
/// 32-bit operands, below `64 * 2^FRAC_BITS = 2^22`.
pub const ANTILOG_BITS: u32 = 23;

/// Added to a log difference so that the antilog key of a quotient is never negative.
pub const DIV_OFFSET: u64 = 32 << FRAC_BITS;

/// The most entries an [`ArithTable`] holds in one table (operand or antilog): 2^24, 512 MiB
/// of [`LookupEntry`]. The tables are software (the reference matcher, the experiments), so
/// they may be larger than a ternary match block
/// ([`MAX_TCAM_ENTRIES`](crate::mem::tcam::MAX_TCAM_ENTRIES)); the bound turns a request
/// for a huge one (2^32 entries at 32 significant bits) into an error instead of an
/// allocation that can abort the process. The uniform operand table fits up to 20
/// significant bits (`2^20 * 13` entries), and every antilog table fits (at most
/// `2^ANTILOG_BITS`).
pub const MAX_TABLE_ENTRIES: u64 = 1 << 24;

const ONE: f64 = (1u64 << FRAC_BITS) as f64;

/// One entry of a calculation table: operands `k` with `k & mask == value` get `result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupEntry {
    /// The value (wildcard bits zero).
    pub value: u64,
    /// Ones on the bits that must match.
    pub mask: u64,
    /// Higher wins among matches: the number of ones in the mask (longer masks first).
    pub priority: u32,
    /// The result ([`Op`] says its format).
    pub result: u64,
}

impl LookupEntry {
    /// Whether `key` matches.
    pub fn matches(&self, key: u64) -> bool {
        key & self.mask == self.value
    }

    /// The entry as a 32-bit ternary match block holds it, for keys of `key_bits` bits
    /// (32 for operands, [`ANTILOG_BITS`] for antilog keys): the bits above the key's width
    /// must be zero, so a wider key matches nothing, and the mask stays a prefix.
    pub fn tcam_entry(&self, key_bits: u32) -> TcamEntry {
        let above = u32::MAX.checked_shl(key_bits).unwrap_or(0);
        TcamEntry {
            value: self.value as u32,
            mask: self.mask as u32 | above,
            priority: self.priority,
            result: self.result,
        }
    }
}

/// The reference ternary matcher: the matching entry of highest priority, the first in the
/// table among equals.
pub fn lookup(table: &[LookupEntry], key: u64) -> Option<&LookupEntry> {
    table
        .iter()
        .filter(|e| e.matches(key))
        .fold(None, |best: Option<&LookupEntry>, e| match best {
            Some(b) if b.priority >= e.priority => Some(b),
            _ => Some(e),
        })
}

/// The match in a table of disjoint entries sorted by value (as both populations build
/// them): a binary search, equal to [`lookup`] on such tables.
fn lookup_disjoint(table: &[LookupEntry], key: u64) -> Option<&LookupEntry> {
    let i = table.partition_point(|e| e.value <= key);
    table[..i].last().filter(|e| e.matches(key))
}

/// The calculation table of `entries`, each with `f` of its representative.
pub(crate) fn table_of(entries: &[TernaryEntry], f: impl Fn(u64) -> u64) -> Vec<LookupEntry> {
    let mut table: Vec<LookupEntry> = entries
        .iter()
        .map(|e| LookupEntry {
            value: e.value,
            mask: e.mask,
            priority: e.mask.count_ones(),
            result: f(e.representative),
        })
        .collect();
    table.sort_by_key(|e| e.value);
    table
}

/// The antilog table of a two-operand operation whose operand tables have `s` significant
/// bits: the uniform population over [`ANTILOG_BITS`]-bit keys with `s + 6` significant
/// bits (at most [`ANTILOG_BITS`]), so that the six integer bits of a log sum do not eat the
/// precision of its fraction. Empty for one-operand operations.
pub fn antilog_table(op: Op, s: u32) -> Vec<LookupEntry> {
    if !op.is_binary() {
        return Vec::new();
    }
    table_of(
        &uniform_population(ANTILOG_BITS, antilog_significant_bits(s)),
        |k| op.antilog_result(k),
    )
}

/// The significant bits of the antilog table for operand tables of `s` significant bits:
/// `s + 6`, at most [`ANTILOG_BITS`].
fn antilog_significant_bits(s: u32) -> u32 {
    s.saturating_add(6).min(ANTILOG_BITS)
}

/// The number of entries of [`antilog_table`]`(op, s)`, without building it (0 for
/// one-operand operations).
pub fn antilog_table_len(op: Op, s: u32) -> u64 {
    if op.is_binary() {
        uniform_population_len(ANTILOG_BITS, antilog_significant_bits(s))
    } else {
        0
    }
}

/// Refuses a table of `entries` above [`MAX_TABLE_ENTRIES`] with
/// [`AdaError::TableTooLarge`].
fn check_table_len(
    table: &'static str,
    entries: u64,
    significant_bits: Option<u32>,
) -> Result<(), AdaError> {
    if entries > MAX_TABLE_ENTRIES {
        return Err(AdaError::TableTooLarge {
            table,
            entries,
            max: MAX_TABLE_ENTRIES,
            significant_bits,
        });
    }
    Ok(())
}

/// Refuses the antilog table of `op` for operand tables of `s` significant bits when it
/// would exceed [`MAX_TABLE_ENTRIES`].
fn check_antilog_len(op: Op, s: u32) -> Result<(), AdaError> {
    check_table_len(
        "antilog",
        antilog_table_len(op, s),
        Some(antilog_significant_bits(s)),
    )
}

/// An operation computed by lookup on 32-bit operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `a^2`, an exact integer result.
    Square,
    /// `sqrt a`, fixed point.
    Sqrt,
    /// `log2 a`, fixed point.
    Log2,
    /// `a * b`, an integer result, by log and antilog tables.
    Mul,
    /// `a / b`, fixed point, by log and antilog tables.
    Div,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 5] = [Op::Square, Op::Sqrt, Op::Log2, Op::Mul, Op::Div];

    /// Whether the operation takes two operands.
    pub fn is_binary(self) -> bool {
        matches!(self, Op::Mul | Op::Div)
    }

    /// The exact result (`b` ignored by one-operand operations); `None` where undefined.
    pub fn exact(self, a: u32, b: u32) -> Option<f64> {
        let (a, b) = (f64::from(a), f64::from(b));
        match self {
            Op::Square => Some(a * a),
            Op::Sqrt => Some(a.sqrt()),
            Op::Log2 => (a > 0.0).then(|| a.log2()),
            Op::Mul => Some(a * b),
            Op::Div => (b > 0.0).then(|| a / b),
        }
    }

    /// The error bound of the uniform population with `s` significant bits (module doc):
    /// relative, except for [`Op::Log2`] (absolute). Mul and div add half a unit of the
    /// result's last place (see [`Op::within_bound`]).
    pub fn error_bound(self, s: u32) -> f64 {
        let e = 0.5f64.powi(s as i32 + 1);
        self.entry_error_bound(e, e, s)
    }

    /// The error bound of a lookup whose operand entries have relative half-widths `e_a`
    /// and `e_b` (`e = (w / 2) / lo` for an entry of `w` operands from `lo`, so the
    /// representative is within a factor `1 +- e` of every operand of the entry; 0 for an
    /// exact entry; `e_b` is ignored by one-operand operations), with an antilog table built
    /// for `antilog_s` significant bits ([`antilog_table`]). Any population's table, ADA's
    /// included, is within this bound entry by entry; [`Op::error_bound`] is the uniform
    /// population's, where every entry has `e <= 2^-(s+1)`.
    pub fn entry_error_bound(self, e_a: f64, e_b: f64, antilog_s: u32) -> f64 {
        let fixed = 0.5 / ONE;
        match self {
            Op::Square => (1.0 + e_a) * (1.0 + e_a) - 1.0,
            Op::Sqrt => (1.0 + e_a).sqrt() - 1.0 + fixed,
            Op::Log2 => (1.0 + e_a).log2() + fixed,
            Op::Mul | Op::Div => {
                // The antilog key's own half-width: 2^-(s + 2) of an octave.
                let key = 0.5f64.powi(antilog_s as i32 + 2);
                let exponent = (1.0 + e_a).log2() + (1.0 + e_b).log2() + 2.0 * fixed + key;
                exponent.exp2() - 1.0
            }
        }
    }

    /// Whether `approx` is within the bound of `s` significant bits of `exact`.
    pub fn within_bound(self, s: u32, exact: f64, approx: f64) -> bool {
        self.within(self.error_bound(s), exact, approx)
    }

    /// Whether `approx` is within `bound` ([`Op::error_bound`], [`Op::entry_error_bound`])
    /// of `exact`: relative, absolute for [`Op::Log2`], plus the rounding of the result's
    /// last place for mul and div.
    pub fn within(self, bound: f64, exact: f64, approx: f64) -> bool {
        let err = (approx - exact).abs();
        // A little slack for the float arithmetic of the check itself.
        let slack = 1e-9 * exact.abs().max(1.0);
        match self {
            Op::Log2 => err <= bound + slack,
            Op::Square | Op::Sqrt => err <= bound * exact + slack,
            Op::Mul => err <= bound * exact + 0.5 + slack,
            Op::Div => err <= bound * exact + 0.5 / ONE + slack,
        }
    }

    /// The result an operand table stores for a representative operand.
    pub(crate) fn operand_result(self, x: u64) -> u64 {
        // A 32-bit operand's square fits 64 bits exactly, beyond f64's 53.
        let square = x.saturating_mul(x);
        let x = x as f64;
        match self {
            Op::Square => square,
            Op::Sqrt => (x.sqrt() * ONE).round() as u64,
            // log2 0 is undefined: the program never looks 0 up (module doc).
            Op::Log2 | Op::Mul | Op::Div if x == 0.0 => 0,
            Op::Log2 | Op::Mul | Op::Div => (x.log2() * ONE).round() as u64,
        }
    }

    /// The result an antilog table stores for a representative key (`as` saturates).
    pub(crate) fn antilog_result(self, key: u64) -> u64 {
        match self {
            Op::Div => (((key as f64 - DIV_OFFSET as f64) / ONE).exp2() * ONE).round() as u64,
            _ => (key as f64 / ONE).exp2().round() as u64,
        }
    }
}

/// The lookup tables of one operation: the operand table and, for two-operand operations,
/// the antilog table.
#[derive(Debug, Clone)]
pub struct ArithTable {
    op: Op,
    operand: Vec<LookupEntry>,
    antilog: Vec<LookupEntry>,
}

impl ArithTable {
    /// The prior work's uniform population with `s` significant bits (both tables).
    ///
    /// # Errors
    ///
    /// [`AdaError::SignificantBits`] for `s` above 32, and [`AdaError::TableTooLarge`] when
    /// the operand table ([`uniform_population_len`]`(32, s)` entries: `s` above 20) or the
    /// antilog table ([`antilog_table_len`]) would exceed [`MAX_TABLE_ENTRIES`], before
    /// either is built.
    pub fn uniform(op: Op, significant_bits: u32) -> Result<Self, AdaError> {
        if significant_bits > OPERAND_BITS {
            return Err(AdaError::SignificantBits(significant_bits));
        }
        check_table_len(
            "operand",
            uniform_population_len(OPERAND_BITS, significant_bits),
            Some(significant_bits),
        )?;
        check_antilog_len(op, significant_bits)?;
        let entries = uniform_population(OPERAND_BITS, significant_bits);
        Self::from_entries(op, &entries, significant_bits)
    }

    /// A table on given operand entries (ADA's: [`super::trie::BinningTrie::populate`] over
    /// 32-bit operands, disjoint and covering); two-operand operations get a uniform antilog
    /// table with `antilog_significant_bits + 6` significant bits.
    ///
    /// # Errors
    ///
    /// [`AdaError::SignificantBits`] for `antilog_significant_bits` above 32, and
    /// [`AdaError::TableTooLarge`] for more than [`MAX_TABLE_ENTRIES`] operand entries or
    /// an antilog table ([`antilog_table_len`]) above it, before either table is built.
    pub fn from_entries(
        op: Op,
        entries: &[TernaryEntry],
        antilog_significant_bits: u32,
    ) -> Result<Self, AdaError> {
        if antilog_significant_bits > OPERAND_BITS {
            return Err(AdaError::SignificantBits(antilog_significant_bits));
        }
        check_table_len("operand", entries.len() as u64, None)?;
        check_antilog_len(op, antilog_significant_bits)?;
        let operand = table_of(entries, |x| op.operand_result(x));
        let antilog = if op.is_binary() {
            antilog_table(op, antilog_significant_bits)
        } else {
            Vec::new()
        };
        Ok(ArithTable {
            op,
            operand,
            antilog,
        })
    }

    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The operand table.
    pub fn operand_table(&self) -> &[LookupEntry] {
        &self.operand
    }

    /// The antilog table (empty for one-operand operations).
    pub fn antilog_table(&self) -> &[LookupEntry] {
        &self.antilog
    }

    /// The entries of the operand table (the one that ADA populates).
    pub fn operand_entries(&self) -> usize {
        self.operand.len()
    }

    /// The result by lookup, as a real number (`b` ignored by one-operand operations);
    /// `None` where undefined or where an operand matches no entry.
    pub fn eval(&self, a: u32, b: u32) -> Option<f64> {
        let find = |table: &[LookupEntry], key: u64| lookup_disjoint(table, key).map(|e| e.result);
        let log = |x: u32| find(&self.operand, u64::from(x));
        match self.op {
            Op::Square => log(a).map(|r| r as f64),
            Op::Sqrt => log(a).map(|r| r as f64 / ONE),
            Op::Log2 if a == 0 => None,
            Op::Log2 => log(a).map(|r| r as f64 / ONE),
            Op::Mul if a == 0 || b == 0 => Some(0.0),
            Op::Mul => find(&self.antilog, log(a)? + log(b)?).map(|r| r as f64),
            Op::Div if b == 0 => None,
            Op::Div if a == 0 => Some(0.0),
            Op::Div => {
                let key = (log(a)? + DIV_OFFSET).checked_sub(log(b)?)?;
                find(&self.antilog, key).map(|r| r as f64 / ONE)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// An operand of random magnitude: a random bit length, then random bits.
    fn log_uniform(rng: &mut SplitMix64) -> u32 {
        let len = rng.below(33) as u32;
        if len == 0 {
            return 0;
        }
        ((1u64 << (len - 1)) | rng.below(1u64 << (len - 1))) as u32
    }

    #[test]
    fn reference_matcher_prefers_longer_masks() {
        let table = [
            LookupEntry {
                value: 0,
                mask: 0,
                priority: 0,
                result: 1,
            },
            LookupEntry {
                value: 0b100,
                mask: 0b100,
                priority: 1,
                result: 2,
            },
            LookupEntry {
                value: 0b110,
                mask: 0b111,
                priority: 3,
                result: 3,
            },
        ];
        assert_eq!(lookup(&table, 0b110).map(|e| e.result), Some(3));
        assert_eq!(lookup(&table, 0b101).map(|e| e.result), Some(2));
        assert_eq!(lookup(&table, 0b001).map(|e| e.result), Some(1));
        assert_eq!(lookup(&table[1..], 0b001), None);
    }

    #[test]
    fn binary_search_agrees_with_the_reference_matcher() {
        let t = ArithTable::uniform(Op::Square, 4).expect("valid");
        let mut rng = SplitMix64::new(3);
        for _ in 0..2000 {
            let k = u64::from(log_uniform(&mut rng));
            assert_eq!(
                lookup(t.operand_table(), k),
                lookup_disjoint(t.operand_table(), k)
            );
        }
    }

    #[test]
    fn every_op_is_within_its_bound_for_the_uniform_population() {
        for s in [2, 4, 6, 8] {
            for op in Op::ALL {
                let t = ArithTable::uniform(op, s).expect("valid");
                let mut rng = SplitMix64::new(u64::from(s) * 31 + op as u64);
                for _ in 0..3000 {
                    let (a, b) = (log_uniform(&mut rng), log_uniform(&mut rng));
                    let Some(exact) = op.exact(a, b) else {
                        assert_eq!(t.eval(a, b), None, "{op:?} {a} {b}");
                        continue;
                    };
                    let approx = t.eval(a, b).expect("covering tables");
                    assert!(
                        op.within_bound(s, exact, approx),
                        "{op:?} s={s} a={a} b={b}: {approx} vs {exact}"
                    );
                }
            }
        }
    }

    /// The uniform population's bounds are tight, not merely safe: at the ends of its
    /// widest entries (the top octaves, where `e` is nearly `2^-(s+1)`) a one-operand
    /// result's error reaches 95% of its bound, so a bound loosened by a constant factor
    /// fails here (the within-bound tests alone would pass any larger bound).
    #[test]
    fn uniform_bounds_are_nearly_reached() {
        for s in [2, 4, 6] {
            for op in [Op::Square, Op::Sqrt, Op::Log2, Op::Mul, Op::Div] {
                let t = ArithTable::uniform(op, s).expect("valid");
                let bound = op.error_bound(s);
                let mut worst: f64 = 0.0;
                for e in t.operand_table().iter().filter(|e| e.value >= 1 << 24) {
                    let last = e.value | (!e.mask & 0xffff_ffff);
                    for a in [e.value, last] {
                        let a = a as u32;
                        // Mul and div pair the operand with an exact one (below 2^(s+1)).
                        let b = 3;
                        let (Some(exact), Some(approx)) = (op.exact(a, b), t.eval(a, b)) else {
                            continue;
                        };
                        assert!(op.within(bound, exact, approx), "{op:?} s={s} {a}");
                        let err = (approx - exact).abs();
                        let ratio = match op {
                            Op::Log2 => err / bound,
                            _ => err / (bound * exact),
                        };
                        worst = worst.max(ratio);
                    }
                }
                // One-operand results reach their bound; a product or quotient with one
                // exact operand carries one log error of the bound's two (about half).
                let floor = if op.is_binary() { 0.35 } else { 0.95 };
                assert!(
                    worst >= floor,
                    "{op:?} s={s}: the worst error is {worst:.3} of the bound {bound:e}"
                );
            }
        }
    }

    #[test]
    fn bounds_shrink_as_significant_bits_grow() {
        for op in Op::ALL {
            assert!(op.error_bound(8) < op.error_bound(4) / 8.0, "{op:?}");
        }
        // Square: 2^-s + 2^-(2s+2).
        assert_eq!(Op::Square.error_bound(4), 1.0 / 16.0 + 1.0 / 1024.0);
    }

    /// Tables above `MAX_TABLE_ENTRIES` are refused before they are built; the largest the
    /// CLI asks for (s = 15, its largest budget of 2^20 entries) are not.
    #[test]
    fn tables_too_large_are_refused_before_they_are_built() {
        assert!(uniform_population_len(OPERAND_BITS, 20) <= MAX_TABLE_ENTRIES);
        assert!(uniform_population_len(OPERAND_BITS, 21) > MAX_TABLE_ENTRIES);
        let err = ArithTable::uniform(Op::Mul, 21).err();
        assert_eq!(
            err,
            Some(AdaError::TableTooLarge {
                table: "operand",
                entries: 12 << 21,
                max: MAX_TABLE_ENTRIES,
                significant_bits: Some(21),
            })
        );
        let msg = err.map(|e| e.to_string()).unwrap_or_default();
        for part in [
            "operand table",
            "25165824",
            "21 significant bits",
            "16777216",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
        assert!(matches!(
            ArithTable::uniform(Op::Square, 32),
            Err(AdaError::TableTooLarge {
                entries: 0x1_0000_0000,
                ..
            })
        ));
        // Every antilog table fits: at most 2^ANTILOG_BITS entries.
        for s in 0..=OPERAND_BITS {
            assert!(antilog_table_len(Op::Div, s) <= MAX_TABLE_ENTRIES);
            assert_eq!(antilog_table_len(Op::Sqrt, s), 0);
        }
        for op in [Op::Sqrt, Op::Mul] {
            let t = ArithTable::uniform(op, 15).expect("the CLI's largest");
            assert_eq!(
                t.operand_entries() as u64,
                uniform_population_len(OPERAND_BITS, 15)
            );
            assert_eq!(t.antilog_table().len() as u64, antilog_table_len(op, 15));
        }
    }

    #[test]
    fn small_operands_are_exact() {
        let t = ArithTable::uniform(Op::Square, 4).expect("valid");
        for a in 0..32u32 {
            assert_eq!(t.eval(a, 0), Some(f64::from(a * a)));
        }
        assert!(ArithTable::uniform(Op::Square, 33).is_err());
        // The largest square is stored exactly, beyond f64's 53 bits.
        let max = u64::from(u32::MAX);
        assert_eq!(Op::Square.operand_result(max), max * max);
    }
}
