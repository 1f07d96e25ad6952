//! ADA: lookup-table arithmetic whose ternary (TCAM) entries are placed where the operands
//! actually fall (Malekpourshahraki, Stephens and Vamanan, "ADA: Arithmetic Operations with
//! Adaptive TCAM Population in Programmable Switches", §III).
//!
//! Switches without multipliers compute `x^2`, `sqrt x`, `log2 x`, `a * b` and `a / b` by
//! matching the operand against ternary entries, each covering a range of operands and
//! holding the result for one representative of that range. Prior work (Sharma et al., the
//! paper's \[10\]/\[12\]) populates the table uniformly: entries `0^p 1 (0|1)^s x^r`, the same
//! relative precision over the whole 32-bit domain. ADA learns the operands' distribution
//! with a small monitoring table and spends the entry budget where the hits are:
//!
//! ```text
//! operand --> monitoring bins (a binary trie's leaves, one hit counter each)  [trie, Alg. 1]
//!         --> every epoch: split the hottest bin, merge the coldest sibling
//!             pair, grow the trie when it keeps deepening                  [trie, Alg. 2]
//!         --> entries to bins in proportion to their hits, then uniform
//!             population inside each bin                                   [trie, Alg. 3]
//!         --> a calculation table of (value, mask, priority, result)        [arith]
//! ```
//!
//! [`trie`] holds the binning trie and Algorithms 1-3 and [`arith`] the operations, both
//! populations and a reference matcher: pure, deterministic functions over plain data (no
//! clocks, no global randomness). [`block`] puts them in the PFE: calculation tables and
//! monitoring bins in ternary match blocks ([`crate::mem::tcam`]) that programs look up as
//! XTXNs, and ADA's controller ([`block::Ada`]) run by a timer entry of the program or from
//! the control side, counting its re-populations, reads and writes.

pub mod arith;
pub mod block;
pub mod trie;

use std::fmt;

use crate::error::ConfigError;
use crate::mem::tcam::TcamError;

/// A request the ADA algorithms refuse.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdaError {
    /// Operand widths are 1 to 32 bits.
    OperandBits(u32),
    /// The monitoring table needs at least one entry and at most
    /// [`trie::max_monitoring_entries`]: one per operand (`2^operand_bits`) and no more than a
    /// ternary match block holds ([`MAX_TCAM_ENTRIES`](crate::mem::tcam::MAX_TCAM_ENTRIES)).
    MonitoringEntries {
        /// The entries asked for.
        entries: u64,
        /// The operand width.
        operand_bits: u32,
    },
    /// A cap on the bins ([`trie::BinningTrie::with_max_entries`]) below the bins the trie
    /// already has.
    MaxEntriesBelowBins {
        /// The cap asked for.
        max_entries: usize,
        /// The bins the trie has.
        bins: usize,
    },
    /// An operand does not fit the trie's operand width.
    OperandTooWide {
        /// The operand.
        value: u64,
        /// The operand width.
        operand_bits: u32,
    },
    /// A population budget must give every bin at least one entry, or some operands would
    /// match nothing.
    BudgetBelowBins {
        /// The budget.
        budget: u64,
        /// The number of bins.
        bins: usize,
    },
    /// Significant bits are 0 to 32.
    SignificantBits(u32),
    /// Hit counters read for a different number of bins than the trie has.
    HitsMismatch {
        /// Counters given.
        counters: usize,
        /// Bins in the trie.
        bins: usize,
    },
    /// An antilog table is for a two-operand operation only.
    NotBinary(arith::Op),
    /// A software calculation table ([`arith::ArithTable`]) would hold more than
    /// [`arith::MAX_TABLE_ENTRIES`] entries; it is refused before it is built.
    TableTooLarge {
        /// Which table: `"operand"` or `"antilog"`.
        table: &'static str,
        /// The entries it would hold.
        entries: u64,
        /// The bound, [`arith::MAX_TABLE_ENTRIES`].
        max: u64,
        /// The significant bits of its uniform population (the antilog table's own, `s + 6`
        /// capped at [`arith::ANTILOG_BITS`]); `None` for operand entries given by the
        /// caller.
        significant_bits: Option<u32>,
    },
    /// A ternary match block refused a table.
    Tcam(TcamError),
    /// An [`block::AdaConfig`] setting is out of range.
    Config(ConfigError),
}

impl fmt::Display for AdaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdaError::OperandBits(b) => write!(f, "operand width {b} bits: must be 1 to 32"),
            AdaError::MaxEntriesBelowBins { max_entries, bins } => write!(
                f,
                "a cap of {max_entries} monitoring entries is below the trie's {bins} bins: \
                 it must be at least {bins}"
            ),
            AdaError::MonitoringEntries {
                entries,
                operand_bits,
            } => {
                let max = trie::max_monitoring_entries(*operand_bits);
                let why = if max < 1u64.checked_shl(*operand_bits).unwrap_or(u64::MAX) {
                    "a ternary match block's largest"
                } else {
                    "one per operand"
                };
                write!(
                    f,
                    "{entries} monitoring entries for {operand_bits}-bit operands: must be 1 to \
                     {max} ({why})"
                )
            }
            AdaError::OperandTooWide {
                value,
                operand_bits,
            } => write!(f, "operand {value} does not fit {operand_bits} bits"),
            AdaError::BudgetBelowBins { budget, bins } => write!(
                f,
                "a budget of {budget} entries cannot cover {bins} bins (one entry each at least)"
            ),
            AdaError::SignificantBits(s) => write!(f, "{s} significant bits: must be 0 to 32"),
            AdaError::HitsMismatch { counters, bins } => write!(
                f,
                "{counters} hit counters for a trie of {bins} bins: they belong to another table"
            ),
            AdaError::NotBinary(op) => {
                write!(f, "{op:?} takes one operand: it has no antilog table")
            }
            AdaError::TableTooLarge {
                table,
                entries,
                max,
                significant_bits,
            } => {
                write!(f, "the {table} table would hold {entries} entries")?;
                if let Some(s) = significant_bits {
                    write!(f, " (uniform population, {s} significant bits)")?;
                }
                write!(f, ": at most {max} (MAX_TABLE_ENTRIES)")
            }
            AdaError::Tcam(e) => e.fmt(f),
            AdaError::Config(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for AdaError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            AdaError::Tcam(e) => e.source(),
            AdaError::Config(e) => e.source(),
            _ => None,
        }
    }
}
