//! ADA's binning trie and its three algorithms (§III of the paper).
//!
//! The trie is binary over `s`-bit operands: a node at depth `d` is a `d`-bit prefix, and
//! the leaves, the *bins*, are ternary patterns (the prefix, then wildcards) that together
//! cover every operand exactly once. Since a full binary trie is determined by its leaves,
//! the trie is kept as its leaves in operand order ([`BinningTrie::leaves`]); inner nodes
//! (parents, aggregated hits) are derived from them where an algorithm needs them.
//!
//! - Algorithm 1 ([`BinningTrie::new`]): `M` monitoring entries give `b = floor(log2 M)`
//!   significant bits and `2^b` equal bins.
//! - Monitoring ([`BinningTrie::record`]): one hit counter per bin (in the PFE, the TCAM's
//!   per-entry hit counter).
//! - Algorithm 2 ([`BinningTrie::update`]): once per epoch, split the hottest bin, merge the
//!   coldest pair of sibling bins (the entry count stays fixed), or grow the table when the
//!   trie keeps deepening. Counters are then reset.
//! - Algorithm 3 ([`BinningTrie::allocate`], [`BinningTrie::populate`]): entries to bins in
//!   proportion to their hits, top-down, then the prior work's significant-bit population
//!   inside each bin ([`bin_population`]).
//!
//! The paper's pseudocode is partly garbled; each place where this module had to choose says
//! so in a `Choice:` comment, and the tests pin the choices down.

use super::arith::MAX_TABLE_ENTRIES;
use super::AdaError;
use crate::mem::tcam::MAX_TCAM_ENTRIES;

/// A bin (a leaf of the trie): the operands whose top `len` bits (of `bits`) are `prefix`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bin {
    /// The prefix, right-aligned (`prefix < 2^len`).
    pub prefix: u64,
    /// The prefix length: the bin's depth in the trie.
    pub len: u32,
    /// The operand width.
    pub bits: u32,
    /// Hits counted in the current epoch.
    pub hits: u64,
}

impl Bin {
    /// The number of wildcard bits (0 for a prefix as long as the width or longer).
    pub fn wildcards(&self) -> u32 {
        self.bits.saturating_sub(self.len)
    }

    /// The smallest operand in the bin.
    pub fn first(&self) -> u64 {
        self.prefix.checked_shl(self.wildcards()).unwrap_or(0)
    }

    /// The largest operand in the bin.
    pub fn last(&self) -> u64 {
        self.first() | low_bits(self.wildcards())
    }

    /// The ternary value: the prefix, wildcard bits zero.
    pub fn value(&self) -> u64 {
        self.first()
    }

    /// The ternary mask: ones on the prefix's bits.
    pub fn mask(&self) -> u64 {
        low_bits(self.bits) & !low_bits(self.wildcards())
    }

    /// Whether `operand` falls in the bin.
    pub fn contains(&self, operand: u64) -> bool {
        (self.first()..=self.last()).contains(&operand)
    }

    /// The pattern as the paper writes it, most significant bit first: `01x`.
    pub fn pattern(&self) -> String {
        let mut s = String::with_capacity(self.bits as usize);
        for i in (0..self.len).rev() {
            s.push(if self.prefix.checked_shr(i).unwrap_or(0) & 1 == 1 {
                '1'
            } else {
                '0'
            });
        }
        s.extend(std::iter::repeat_n('x', self.wildcards() as usize));
        s
    }

    /// Whether `self` and `next` (the leaf after it) are the two children of one node.
    fn is_sibling_pair(&self, next: &Bin) -> bool {
        self.len == next.len
            && self.len > 0
            && self.prefix & 1 == 0
            && next.prefix == self.prefix + 1
    }

    fn children(&self) -> (Bin, Bin) {
        let child = |bit| Bin {
            prefix: (self.prefix << 1) | bit,
            len: self.len + 1,
            bits: self.bits,
            hits: 0,
        };
        (child(0), child(1))
    }
}

/// What one [`BinningTrie::update`] did to the trie.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The trie is unchanged (no hits, or balanced within `th_balance`).
    Unchanged,
    /// `split` became its two children and the sibling pair under `merged` became `merged`.
    Rebalanced {
        /// The pattern of the bin split.
        split: String,
        /// The pattern of the parent the coldest pair merged into.
        merged: String,
    },
    /// The trie kept deepening: `split` became its two children, one entry more.
    Expanded {
        /// The pattern of the bin split.
        split: String,
    },
}

/// ADA's monitoring trie over `operand_bits`-bit operands. See the module doc.
#[derive(Debug, Clone)]
pub struct BinningTrie {
    /// The leaves in operand order; they cover `0..2^bits` exactly once.
    leaves: Vec<Bin>,
    bits: u32,
    /// The depth when the table last grew (Algorithm 1's `b` at first): expansion compares
    /// the current depth against it.
    depth_at_expansion: u32,
    /// Most bins the monitoring table holds: expansion stops there.
    max_entries: usize,
}

impl BinningTrie {
    /// Algorithm 1: `entries` (M) monitoring entries over `operand_bits` (s) bits give
    /// `b = floor(log2 M)` significant bits and the `2^b` equal bins `i x^(s-b)`.
    ///
    /// Choice: when `M` is not a power of two, the `M - 2^b` entries left over stay unused
    /// (the paper's `b = log(M)` assumes a power of two).
    ///
    /// Choice: the bins start with 0 hits, not the 1 of the paper's line 20 (`n.value =
    /// 1`). Counters here count one epoch's operands ([`update`](Self::update) resets them),
    /// so a 1 would be a hit nobody saw. Where the paper's 1 matters, a trie nothing has hit
    /// yet, the two agree: Algorithm 3 splits all-ones hits in proportion to the bins under
    /// each node, which is what [`allocate`](Self::allocate) gives a trie without hits, and
    /// Algorithm 2 with equal hits everywhere changes nothing, as with none.
    ///
    /// # Errors
    ///
    /// [`AdaError::OperandBits`] for a width outside 1 to 32, and
    /// [`AdaError::MonitoringEntries`] for `entries` of 0 or above
    /// [`max_monitoring_entries`]`(operand_bits)`: one entry per operand at most, and no more
    /// than a ternary match block holds ([`MAX_TCAM_ENTRIES`], as the monitoring table is
    /// one). Both are refused before any bin is built.
    pub fn new(entries: u64, operand_bits: u32) -> Result<Self, AdaError> {
        if !(1..=32).contains(&operand_bits) {
            return Err(AdaError::OperandBits(operand_bits));
        }
        if entries == 0 || entries > max_monitoring_entries(operand_bits) {
            return Err(AdaError::MonitoringEntries {
                entries,
                operand_bits,
            });
        }
        let b = entries.ilog2();
        let leaves = (0..1u64 << b)
            .map(|prefix| Bin {
                prefix,
                len: b,
                bits: operand_bits,
                hits: 0,
            })
            .collect();
        Ok(BinningTrie {
            leaves,
            bits: operand_bits,
            depth_at_expansion: b,
            max_entries: usize::MAX,
        })
    }

    /// Caps the bins at `entries` (the monitoring TCAM's capacity): Algorithm 2 grows the
    /// trie only while it has fewer, and rebalances within them after that. The paper's
    /// Nimble experiment starts from 8 monitoring entries and may grow to 12. Refuses a cap
    /// below the bins the trie already has ([`AdaError::MaxEntriesBelowBins`]).
    pub fn with_max_entries(mut self, entries: usize) -> Result<Self, AdaError> {
        if entries < self.leaves.len() {
            return Err(AdaError::MaxEntriesBelowBins {
                max_entries: entries,
                bins: self.leaves.len(),
            });
        }
        self.max_entries = entries;
        Ok(self)
    }

    /// The most bins Algorithm 2 may grow to ([`with_max_entries`](Self::with_max_entries);
    /// unbounded by default).
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// Sets every bin's hits for this epoch, in leaf order: what a controller does with the
    /// monitoring TCAM's per-entry hit counters (in the PFE, the counters replace
    /// [`record`](Self::record)). `hits` must have one count per bin; a different length is
    /// refused and changes nothing (the counters belong to another table).
    pub fn set_hits(&mut self, hits: &[u64]) -> Result<(), AdaError> {
        if hits.len() != self.leaves.len() {
            return Err(AdaError::HitsMismatch {
                counters: hits.len(),
                bins: self.leaves.len(),
            });
        }
        for (b, &h) in self.leaves.iter_mut().zip(hits) {
            b.hits = h;
        }
        Ok(())
    }

    /// The bins, in operand order.
    pub fn leaves(&self) -> &[Bin] {
        &self.leaves
    }

    /// The operand width.
    pub fn operand_bits(&self) -> u32 {
        self.bits
    }

    /// The monitoring entries in use: one per bin.
    pub fn entries(&self) -> usize {
        self.leaves.len()
    }

    /// The depth of the deepest bin.
    pub fn depth(&self) -> u32 {
        self.leaves.iter().map(|b| b.len).max().unwrap_or(0)
    }

    /// The index of the bin `operand` falls in.
    pub fn bin_of(&self, operand: u64) -> Result<usize, AdaError> {
        if operand >> self.bits != 0 {
            return Err(AdaError::OperandTooWide {
                value: operand,
                operand_bits: self.bits,
            });
        }
        // The leaves cover the space in order, so the bin is the last one starting at or
        // below the operand; the first starts at 0.
        Ok(self.leaves.partition_point(|b| b.first() <= operand) - 1)
    }

    /// Monitoring: count one hit in the bin `operand` falls in.
    pub fn record(&mut self, operand: u64) -> Result<(), AdaError> {
        let i = self.bin_of(operand)?;
        self.leaves[i].hits = self.leaves[i].hits.saturating_add(1);
        Ok(())
    }

    /// Algorithm 2, run once per epoch: it ends the epoch and resets every counter.
    ///
    /// 1. Expansion (line 13): if the trie is `th_expansion` or more levels deeper than when
    ///    the table last grew, split the hottest bin without merging (one entry more).
    ///    Choice: "change in depth" is measured from the last expansion (the text's "if the
    ///    depth keeps increasing"), `>=` as the pseudocode (the text says "more than");
    ///    `th_expansion == 0` disables expansion (so does one above the operand width,
    ///    which no trie deepens by); an epoch that expands does not also
    ///    rebalance, since the new children have no hits of their own yet.
    /// 2. Balance (line 16): with `max` the hits of the hottest splittable bin and `min`
    ///    the summed hits of the coldest sibling pair not containing it, rebalance when
    ///    `(max - min) / max >= th_balance` and `min < max`. Choice: this is the formula of
    ///    line 16 (the text's "ratio of the minimum and the maximum" disagrees with it);
    ///    `min` is over sibling pairs because that is what a merge removes (line 29's
    ///    `getMin(P)` over parents), and `min < max` keeps a merge from creating a bin hotter
    ///    than the one split. The loop of `removeLowHitNode` (line 25, `Γ.size() < i`) is
    ///    read as a scan of adjacent leaves. Ties go to the lowest operands. When no such
    ///    pair exists (the trie is a chain toward the hottest bin), an unbalanced trie
    ///    expands instead, as in step 1.
    /// 3. Growth stops at [`max_entries`](Self::max_entries) bins (the monitoring TCAM's
    ///    capacity); the trie then only rebalances.
    ///
    /// A trie of one bin (`M = 1`: `b = 0`, the root) never changes: it has no sibling pair
    /// to merge and no other bin to be unbalanced against, and its depth, 0, never grows.
    /// [`AdaConfig`](super::block::AdaConfig) asks for at least 2 entries.
    ///
    /// Choice: counters reset each epoch, so every decision is taken on the hits since the
    /// last update and the trie follows a shifting distribution rather than its history.
    /// Populate (Algorithm 3) before calling this, while the epoch's hits are there.
    pub fn update(&mut self, th_balance: f64, th_expansion: u32) -> Update {
        let outcome = self.adapt(th_balance, th_expansion);
        for b in &mut self.leaves {
            b.hits = 0;
        }
        outcome
    }

    fn adapt(&mut self, th_balance: f64, th_expansion: u32) -> Update {
        // The hottest bin that can still be split (a bin of depth `bits` is one operand).
        let Some(hot) = self
            .leaves
            .iter()
            .enumerate()
            .filter(|(_, b)| b.len < self.bits)
            .max_by_key(|&(i, b)| (b.hits, std::cmp::Reverse(i)))
            .map(|(i, _)| i)
        else {
            return Update::Unchanged;
        };
        let max = self.leaves[hot].hits;
        if max == 0 {
            return Update::Unchanged;
        }
        let can_grow = th_expansion > 0 && self.leaves.len() < self.max_entries;
        // Saturating: a threshold deeper than any trie (up to u32::MAX) never grows here.
        if can_grow && self.depth() >= self.depth_at_expansion.saturating_add(th_expansion) {
            let split = self.split(hot);
            self.depth_at_expansion = self.depth();
            return Update::Expanded { split };
        }
        let cold = (0..self.leaves.len().saturating_sub(1))
            .filter(|&i| i != hot && i + 1 != hot)
            .filter(|&i| self.leaves[i].is_sibling_pair(&self.leaves[i + 1]))
            .min_by_key(|&i| (self.pair_hits(i), i));
        let Some(cold) = cold else {
            // Choice: the only sibling pair holds the hottest bin, so the trie is a chain
            // toward it and can deepen there only by growing. When the hits are unbalanced
            // that is the depth pressure of line 13, and expansion (if enabled) grows it.
            let min = (self.leaves.iter().enumerate())
                .filter(|&(i, _)| i != hot)
                .map(|(_, b)| b.hits)
                .min();
            return match min {
                Some(min) if can_grow && unbalanced(max, min, th_balance) => {
                    let split = self.split(hot);
                    self.depth_at_expansion = self.depth();
                    Update::Expanded { split }
                }
                _ => Update::Unchanged,
            };
        };
        let min = self.pair_hits(cold);
        if !unbalanced(max, min, th_balance) {
            return Update::Unchanged;
        }
        // Split first: the pair lies wholly before or after the hot bin, so its index
        // moves by one if it is after.
        let split = self.split(hot);
        let cold = if cold > hot { cold + 1 } else { cold };
        let left = self.leaves[cold];
        let parent = Bin {
            prefix: left.prefix >> 1,
            len: left.len - 1,
            bits: self.bits,
            hits: min,
        };
        self.leaves[cold] = parent;
        self.leaves.remove(cold + 1);
        Update::Rebalanced {
            split,
            merged: parent.pattern(),
        }
    }

    /// The hits of leaves `i` and `i + 1`, saturating (counters set from outside,
    /// [`set_hits`](Self::set_hits), may be anything).
    fn pair_hits(&self, i: usize) -> u64 {
        self.leaves[i].hits.saturating_add(self.leaves[i + 1].hits)
    }

    /// Replace leaf `i` by its two children (each with half its hits); its pattern.
    fn split(&mut self, i: usize) -> String {
        let bin = self.leaves[i];
        let (mut l, mut r) = bin.children();
        l.hits = bin.hits / 2;
        r.hits = bin.hits - l.hits;
        self.leaves[i] = l;
        self.leaves.insert(i + 1, r);
        bin.pattern()
    }

    /// Algorithm 3's allocation: how many of `budget` entries each bin gets (in leaf order).
    ///
    /// Top-down from the root, each node's entries go to its two subtrees in proportion to
    /// their aggregated hits (rounded to nearest, the rest to the right), a subtree with no
    /// hits at all sharing equally per bin.
    ///
    /// Choice: that equal split is pfemu's reading of the paper. Its text says a sub-tree
    /// without frequency data gets "an equal share of the entries for the entire
    /// sub-tree"; its pseudocode initialises `w(b) = 0.5` for every node, which stays where
    /// the hits are 0 (the ratio `f(child) / f(b)` is 0/0), an equal share per *child*.
    /// The two differ when the children hold different numbers of bins, and only for a
    /// trie with no hits at all (the first table, [`Ada::new`](super::block::Ada::new)):
    /// a subtree without hits under a node with hits gets none of the proportional split.
    /// Per bin, every bin of such a trie gets the same share, as the text reads; per child,
    /// a shallow bin would get as many entries as the whole of a deep sibling subtree.
    ///
    /// Choice: before the proportional split, every bin gets one entry, so that every
    /// operand still matches an entry of its bin, and the bin reaching down to 0 (`0^d
    /// x^r`) one more per octave it spans (`r + 1` in all, as many as the prior work's
    /// coarsest population gives those operands): one entry over a bin `[p 2^r, (p + 1)
    /// 2^r)` with `p >= 1` answers every operand within a factor of two, but over `[0,
    /// 2^r)` the relative error of small operands is unbounded, and a square or product of
    /// them is off by orders of magnitude. A budget too small for that gives the bin what
    /// is left after one entry per bin. A bin without hits thus keeps its entries, whose
    /// error stays bounded (a catch-all entry shared by all of them would save entries but
    /// answer a rare operand with an unbounded error: tried, it multiplied the mean error
    /// on heavy-tailed operands by 10^3 to 10^8).
    pub fn allocate(&self, budget: u64) -> Result<Vec<u64>, AdaError> {
        let bins = self.leaves.len();
        if budget < bins as u64 {
            return Err(AdaError::BudgetBelowBins { budget, bins });
        }
        let octaves = u64::from(self.leaves[0].wildcards()).min(budget - bins as u64);
        let mut out = Vec::with_capacity(bins);
        split_budget(&self.leaves, 0, budget - bins as u64 - octaves, &mut out);
        out[0] += octaves;
        Ok(out.into_iter().map(|n| n + 1).collect())
    }

    /// Algorithm 3: the calculation table's ternary entries for `budget` entries, in operand
    /// order: [`allocate`](Self::allocate), then [`bin_population`] in each bin.
    /// Choice: a bin with more entries than operands (a narrow bin that drew a large share)
    /// uses one per operand, and the entries it cannot use go to the bins that can, the
    /// hottest first (ties to the lowest operands). The result is shorter than `budget` only
    /// when every operand has an exact entry.
    ///
    /// # Errors
    ///
    /// [`AdaError::BudgetBelowBins`] for a budget below one entry per bin, and
    /// [`AdaError::TableTooLarge`] when the table would hold more than
    /// [`MAX_TABLE_ENTRIES`] entries (`budget`, or one per operand if that is fewer: a
    /// budget of `u64::MAX` over 32-bit operands asks for 2^32), refused before it is built.
    pub fn populate(&self, budget: u64) -> Result<Vec<TernaryEntry>, AdaError> {
        let operands = 1u64.checked_shl(self.bits).unwrap_or(u64::MAX);
        let entries = budget.min(operands);
        if entries > MAX_TABLE_ENTRIES {
            return Err(AdaError::TableTooLarge {
                table: "operand",
                entries,
                max: MAX_TABLE_ENTRIES,
                significant_bits: None,
            });
        }
        let mut shares = self.allocate(budget)?;
        let size = |b: &Bin| 1u64.checked_shl(b.wildcards()).unwrap_or(u64::MAX);
        let mut spare: u64 = (self.leaves.iter().zip(&mut shares))
            .map(|(b, k)| {
                let over = k.saturating_sub(size(b));
                *k -= over;
                over
            })
            .sum();
        let mut by_heat: Vec<usize> = (0..self.leaves.len()).collect();
        by_heat.sort_by_key(|&i| (std::cmp::Reverse(self.leaves[i].hits), i));
        for i in by_heat {
            if spare == 0 {
                break;
            }
            let more = (size(&self.leaves[i]) - shares[i]).min(spare);
            shares[i] += more;
            spare -= more;
        }
        let mut out = Vec::new();
        for (bin, &k) in self.leaves.iter().zip(&shares) {
            out.extend(bin_population(bin, k));
        }
        Ok(out)
    }
}

/// Ones in the low `n` bits (all 64 for `n >= 64`): the operands of an `n`-bit width, or
/// the wildcard bits of an entry with `n` of them, without a shift that overflows at 64.
fn low_bits(n: u32) -> u64 {
    u64::MAX.checked_shr(64u32.saturating_sub(n)).unwrap_or(0)
}

/// The most monitoring entries [`BinningTrie::new`] accepts for `operand_bits`-bit operands:
/// one per operand (`2^operand_bits`), and at most [`MAX_TCAM_ENTRIES`], since the monitoring
/// table is a ternary match block.
pub fn max_monitoring_entries(operand_bits: u32) -> u64 {
    1u64.checked_shl(operand_bits)
        .unwrap_or(u64::MAX)
        .min(MAX_TCAM_ENTRIES as u64)
}

/// Line 16's test: `(max - min) / max >= th_balance`, and `min < max` (module doc of
/// [`BinningTrie::update`]).
fn unbalanced(max: u64, min: u64, th_balance: f64) -> bool {
    min < max && (max - min) as f64 / max as f64 >= th_balance
}

/// Split `n` entries over `leaves`, the leaves under a node of depth `depth`: in
/// proportion to each child's hits, or, under a node without hits, to each child's bins
/// (pfemu's reading of the paper's equal share, [`BinningTrie::allocate`]).
fn split_budget(leaves: &[Bin], depth: u32, n: u64, out: &mut Vec<u64>) {
    if leaves.len() <= 1 {
        out.extend(leaves.iter().map(|_| n));
        return;
    }
    // More than one leaf under the node: all are deeper than it, so each has the bit that
    // picks the child.
    let mid = leaves.partition_point(|b| (b.prefix >> (b.len - depth - 1)) & 1 == 0);
    let (left, right) = leaves.split_at(mid);
    let hits = |bins: &[Bin]| bins.iter().map(|b| u128::from(b.hits)).sum::<u128>();
    let (hl, h) = (hits(left), hits(leaves));
    let (num, den) = if h == 0 {
        (left.len() as u128, leaves.len() as u128)
    } else {
        (hl, h)
    };
    // Hits summed over a node reach 2^80 (2^16 bins of 2^64), and `2 n num` would pass a
    // u128: keep the ratio's top 63 bits, which rounds the same share to within one entry.
    let shift = (128 - den.leading_zeros()).saturating_sub(63);
    let (num, den) = (num >> shift, den >> shift);
    let nl = ((2 * u128::from(n) * num + den) / (2 * den)) as u64;
    split_budget(left, depth + 1, nl, out);
    split_budget(right, depth + 1, n - nl, out);
}

/// A ternary entry of a calculation table, before its result is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TernaryEntry {
    /// The value (wildcard bits zero).
    pub value: u64,
    /// The mask: ones on the bits that must match.
    pub mask: u64,
    /// The operand whose result the entry returns for its whole range.
    /// Choice: the midpoint of the range (rounded down), which halves the worst-case
    /// distance to any operand of the range.
    pub representative: u64,
}

impl TernaryEntry {
    /// The entry for the operands with the top `len` bits (of `bits`) equal to `prefix`.
    /// Widths are 1 to 64 bits (a larger `bits` is taken as 64), a `len` above `bits` as
    /// `bits`, and only the low `len` bits of `prefix` count.
    pub fn for_prefix(prefix: u64, len: u32, bits: u32) -> Self {
        let bits = bits.min(64);
        let len = len.min(bits);
        let r = bits - len;
        let first = (prefix & low_bits(len)).checked_shl(r).unwrap_or(0);
        TernaryEntry {
            value: first,
            mask: low_bits(bits) & !low_bits(r),
            representative: first + low_bits(r) / 2,
        }
    }

    /// Whether `key` matches.
    pub fn matches(&self, key: u64) -> bool {
        key & self.mask == self.value
    }
}

/// The prior work's uniform population (Sharma et al., the paper's \[10\]): entries of the
/// form `0^p 1 (0|1)^s x^r` over `operand_bits`-bit operands: the leading one and `s`
/// significant bits after it match, the rest are wildcards; operands below `2^(s+1)` get
/// exact entries. That is [`uniform_population_len`] entries: `2^s (operand_bits + 1 - s)`
/// for `s < operand_bits`, one per operand for `s >= operand_bits` (2^32 at 32 bits: count
/// them before building them). Widths are up to 64 bits; a larger one is taken as 64.
pub fn uniform_population(operand_bits: u32, significant_bits: u32) -> Vec<TernaryEntry> {
    let mut out = Vec::new();
    // Widths above 64 are taken as 64 (a u64 operand), as in `TernaryEntry::for_prefix`.
    refine(
        0,
        0,
        operand_bits.min(64),
        significant_bits,
        &mut out,
        usize::MAX,
    );
    out
}

/// The number of entries of [`uniform_population`]`(operand_bits, significant_bits)`,
/// without building it: the `2^(s+1)` operands below `2^(s+1)` exact, then `2^s` entries
/// for each of the `operand_bits - s - 1` higher positions of the leading one, so
/// `2^s (operand_bits + 1 - s)` for `s < operand_bits`; every operand exact,
/// `2^operand_bits`, for `s >= operand_bits`. Saturates at `u64::MAX` (a width of 64 bits,
/// which no table has; a larger one is taken as 64, as [`uniform_population`] does).
pub fn uniform_population_len(operand_bits: u32, significant_bits: u32) -> u64 {
    // As `uniform_population` builds it: a width above 64 is 64.
    let operand_bits = operand_bits.min(64);
    let pow = |e: u32| 1u64.checked_shl(e).unwrap_or(u64::MAX);
    if significant_bits >= operand_bits {
        pow(operand_bits)
    } else {
        pow(significant_bits).saturating_mul(u64::from(operand_bits + 1 - significant_bits))
    }
}

/// The uniform population restricted to the node `prefix`/`len`, appended to `out`:
/// a node is an entry once its prefix holds the leading one and `t` bits after it (or it is
/// a single operand), else it is split. Stops (false) once `out` would exceed `cap`.
fn refine(
    prefix: u64,
    len: u32,
    bits: u32,
    t: u32,
    out: &mut Vec<TernaryEntry>,
    cap: usize,
) -> bool {
    let fine = len == bits || (prefix != 0 && prefix.ilog2() >= t);
    if fine {
        if out.len() >= cap {
            return false;
        }
        out.push(TernaryEntry::for_prefix(prefix, len, bits));
        return true;
    }
    refine(prefix << 1, len + 1, bits, t, out, cap)
        && refine((prefix << 1) | 1, len + 1, bits, t, out, cap)
}

/// The population of one bin with at most `k` entries (`k >= 1`), "similar to \[12\]" as the
/// paper's experiments use: the uniform population restricted to the bin with the most
/// significant bits that fit in `k` entries (line 32's `min(b | ...)`, read as that).
///
/// Choice (beyond the paper, whose population leaves them unused): the entries left over
/// below `k` split entries in two, the one with the largest `w^2 / lo` first (`w` its
/// width, `lo` its smallest operand; an entry reaching down to 0 first of all, lowest
/// first among equals), until `k` entries are used or every entry is exact. As far as the
/// monitoring knows, operands are spread evenly within a bin, so an entry holds a share
/// `w` of them with a relative error near `w / lo`: splitting the largest product halves
/// the most error. When not even 0 significant bits fit (a bin reaching down to 0 needs an
/// entry per octave), the same splitting starts from the bin as one entry, which builds
/// the octaves from the top.
pub fn bin_population(bin: &Bin, k: u64) -> Vec<TernaryEntry> {
    // A bin built by hand may be wider than 64 bits or deeper than its width: take it as
    // `TernaryEntry::for_prefix` does (refining a prefix past its width never ends).
    let bits = bin.bits.min(64);
    let len = bin.len.min(bits);
    let bin = &Bin {
        prefix: bin.prefix & low_bits(len),
        len,
        bits,
        hits: bin.hits,
    };
    let cap = usize::try_from(k).unwrap_or(usize::MAX);
    let mut best = vec![TernaryEntry::for_prefix(bin.prefix, bin.len, bin.bits)];
    // More significant bits never need fewer entries, so stop at the first that overflows.
    for t in 0..=bin.bits {
        let mut out = Vec::new();
        if !refine(bin.prefix, bin.len, bin.bits, t, &mut out, cap) {
            break;
        }
        let exact = out.len() as u128 == 1u128 << bin.wildcards();
        best = out;
        if exact {
            break;
        }
    }
    split_greedy(best, cap, bin.bits)
}

/// An entry waiting to be split, ordered by how much splitting it helps (see
/// [`bin_population`]): the largest `w^2 / lo` first, `lo = 0` before everything, exact
/// entries last; then the lowest `lo`.
#[derive(PartialEq, Eq)]
struct Split {
    /// Wildcard bits: the entry covers `2^r` operands.
    r: u32,
    /// Its smallest operand.
    lo: u64,
}

impl Split {
    /// `w^2 / lo = 2^(2r) / lo` against `other`'s: zero when exact (`r = 0`), infinite for
    /// `lo = 0`; compared exactly, without overflow, for widths up to 64 bits.
    fn cmp_gain(&self, other: &Split) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        // (is it finite and non-zero, ...): exact < finite < infinite.
        let class = |s: &Split| match (s.r, s.lo) {
            (0, _) => 0,
            (_, 0) => 2,
            _ => 1,
        };
        match class(self).cmp(&class(other)) {
            Ordering::Equal if class(self) == 1 => {}
            unequal_or_alike => return unequal_or_alike,
        }
        // 2^ka / a against 2^kb / b is 2^ka * b against 2^kb * a.
        let (ka, kb) = (2 * self.r, 2 * other.r);
        // x * 2^k against y, for x >= 1 and y < 2^64.
        let shifted = |x: u64, k: u32, y: u64| {
            if k >= 64 {
                Ordering::Greater
            } else {
                (u128::from(x) << k).cmp(&u128::from(y))
            }
        };
        if ka >= kb {
            shifted(other.lo, ka - kb, self.lo)
        } else {
            shifted(self.lo, kb - ka, other.lo).reverse()
        }
    }
}

impl Ord for Split {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.cmp_gain(other).then_with(|| other.lo.cmp(&self.lo))
    }
}

impl PartialOrd for Split {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// Splits entries of `entries` (disjoint, in operand order) as [`bin_population`] says,
/// until there are `cap` of them or all are exact; the result is in operand order.
fn split_greedy(entries: Vec<TernaryEntry>, cap: usize, bits: u32) -> Vec<TernaryEntry> {
    let all = low_bits(bits);
    let mut n = entries.len();
    let mut heap: std::collections::BinaryHeap<Split> = entries
        .iter()
        .map(|e| Split {
            r: (!e.mask & all).count_ones(),
            lo: e.value,
        })
        .collect();
    while n < cap {
        match heap.pop() {
            Some(Split { r, lo }) if r > 0 => {
                heap.push(Split { r: r - 1, lo });
                heap.push(Split {
                    r: r - 1,
                    lo: lo + (1 << (r - 1)),
                });
                n += 1;
            }
            Some(exact) => {
                heap.push(exact);
                break;
            }
            None => break,
        }
    }
    let mut out: Vec<TernaryEntry> = heap
        .into_iter()
        .map(|Split { r, lo }| {
            TernaryEntry::for_prefix(lo.checked_shr(r).unwrap_or(0), bits - r, bits)
        })
        .collect();
    out.sort_unstable_by_key(|e| e.value);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn patterns(t: &BinningTrie) -> Vec<String> {
        t.leaves().iter().map(Bin::pattern).collect()
    }

    fn record_n(t: &mut BinningTrie, operand: u64, n: usize) {
        for _ in 0..n {
            t.record(operand).expect("a 3-bit operand");
        }
    }

    #[test]
    fn algorithm_1_four_entries_three_bits() {
        let t = BinningTrie::new(4, 3).expect("valid");
        assert_eq!(patterns(&t), ["00x", "01x", "10x", "11x"]);
        // Five entries: b = floor(log2 5) = 2, the fifth unused.
        assert_eq!(
            patterns(&BinningTrie::new(5, 3).expect("valid")),
            patterns(&t)
        );
        assert_eq!(patterns(&BinningTrie::new(1, 3).expect("valid")), ["xxx"]);
        assert!(BinningTrie::new(0, 3).is_err());
        assert!(BinningTrie::new(9, 3).is_err());
        assert!(BinningTrie::new(4, 33).is_err());
    }

    #[test]
    fn bins_match_their_ternary_patterns() {
        let t = BinningTrie::new(4, 3).expect("valid");
        let b = t.leaves()[1];
        assert_eq!(
            (b.value(), b.mask(), b.first(), b.last()),
            (0b010, 0b110, 2, 3)
        );
        for v in 0..8 {
            let i = t.bin_of(v).expect("in range");
            assert!(t.leaves()[i].contains(v));
            assert_eq!(v & t.leaves()[i].mask(), t.leaves()[i].value());
        }
        assert_eq!(
            t.bin_of(8),
            Err(AdaError::OperandTooWide {
                value: 8,
                operand_bits: 3
            })
        );
    }

    /// Figure 4a -> 4b, then Algorithm 3's worked example on 4b's hits 5, 7, 7, 3.
    #[test]
    fn figure_4_and_the_14_percent_example() {
        let mut t = BinningTrie::new(4, 3).expect("valid");
        record_n(&mut t, 0b000, 5);
        record_n(&mut t, 0b010, 7);
        record_n(&mut t, 0b011, 7);
        record_n(&mut t, 0b101, 2);
        record_n(&mut t, 0b110, 1);
        let u = t.update(0.2, 2);
        assert_eq!(
            u,
            Update::Rebalanced {
                split: "01x".into(),
                merged: "1xx".into()
            }
        );
        assert_eq!(patterns(&t), ["00x", "010", "011", "1xx"]);
        assert!(
            t.leaves().iter().all(|b| b.hits == 0),
            "counters reset per epoch"
        );

        record_n(&mut t, 0b001, 5);
        record_n(&mut t, 0b010, 7);
        record_n(&mut t, 0b011, 7);
        record_n(&mut t, 0b111, 3);
        let shares = t.allocate(100).expect("budget covers the bins");
        assert_eq!(shares.iter().sum::<u64>(), 100);
        // 3 / (5 + 7 + 7 + 3) = 13.6%: 14 of 100.
        assert_eq!(shares[3], 14);
        // 00x spans two octaves (0, and 1) and gets one more entry before the split.
        assert_eq!(shares, [24, 31, 31, 14]);
    }

    #[test]
    fn balanced_hits_leave_the_trie_alone() {
        let mut t = BinningTrie::new(4, 3).expect("valid");
        assert_eq!(t.update(0.2, 2), Update::Unchanged, "no hits");
        for v in 0..8 {
            record_n(&mut t, v, 5);
        }
        // Every pair holds twice a bin's hits: merging would make a hotter bin.
        assert_eq!(t.update(0.2, 2), Update::Unchanged);
        assert_eq!(patterns(&t), ["00x", "01x", "10x", "11x"]);
    }

    #[test]
    fn a_trie_that_keeps_deepening_expands() {
        let mut t = BinningTrie::new(4, 8).expect("valid");
        let mut expanded = 0;
        for _ in 0..40 {
            record_n(&mut t, 200, 50);
            record_n(&mut t, 3, 1);
            if let Update::Expanded { .. } = t.update(0.2, 2) {
                expanded += 1;
            }
        }
        assert!(expanded >= 1, "a point mass deepens the trie");
        assert!(t.entries() > 4);
        assert_eq!(t.entries(), 4 + expanded);
        // The operand ends up in a bin of its own.
        let i = t.bin_of(200).expect("in range");
        assert_eq!(t.leaves()[i].len, 8);
    }

    #[test]
    fn zero_hit_subtrees_share_equally() {
        let t = BinningTrie::new(4, 3).expect("valid");
        // One entry each, one more for 00x's second octave, then the 3 left by count:
        // 2 to the left half (1.5 rounded), 1 to the right.
        assert_eq!(t.allocate(8).expect("enough"), [3, 2, 2, 1]);
        assert_eq!(
            BinningTrie::new(4, 8)
                .expect("valid")
                .allocate(44)
                .expect("enough"),
            [16, 9, 10, 9]
        );
        // Too small a budget for the octaves: the bin reaching 0 gets what is left.
        assert_eq!(
            BinningTrie::new(4, 8)
                .expect("valid")
                .allocate(6)
                .expect("enough"),
            [3, 1, 1, 1]
        );
        assert_eq!(
            t.allocate(3),
            Err(AdaError::BudgetBelowBins { budget: 3, bins: 4 })
        );
    }

    /// Algorithm 1's line 20 starts every bin at 1 hit; pfemu starts at 0 (the Choice in
    /// `BinningTrie::new`). A trie without hits is allocated and updated as one with a hit
    /// in every bin, on uneven tries too.
    #[test]
    fn no_hits_behave_as_the_papers_initial_ones() {
        let mut t = BinningTrie::new(4, 8).expect("valid");
        record_n(&mut t, 100, 40);
        record_n(&mut t, 3, 1);
        t.update(0.2, 2);
        assert!(
            t.leaves().iter().any(|b| b.len != t.leaves()[0].len),
            "uneven bins"
        );
        let fresh = BinningTrie::new(4, 8).expect("valid");
        for t in [fresh, t] {
            assert!(t.leaves().iter().all(|b| b.hits == 0));
            let mut ones = t.clone();
            ones.set_hits(&vec![1; t.entries()]).expect("one per bin");
            for budget in [t.entries() as u64, 20, 64, 200] {
                assert_eq!(t.allocate(budget), ones.allocate(budget), "budget {budget}");
                assert_eq!(t.populate(budget), ones.populate(budget));
            }
            let (mut none, mut one) = (t.clone(), ones);
            assert_eq!(none.update(0.2, 2), Update::Unchanged);
            assert_eq!(one.update(0.2, 2), Update::Unchanged);
        }
    }

    #[test]
    fn uniform_population_has_the_prior_works_form() {
        // s = 1 over 4 bits: exact below 4, then 1 1 x x.. forms.
        let e = uniform_population(4, 1);
        assert_eq!(e.len(), 2 * (4 + 1 - 1));
        let masks: Vec<u64> = e.iter().map(|e| e.mask).collect();
        assert_eq!(masks, [0xf, 0xf, 0xf, 0xf, 0xe, 0xe, 0xc, 0xc]);
        for bits in [4, 8, 12] {
            for s in 0..bits {
                let e = uniform_population(bits, s);
                assert_eq!(e.len() as u64, (1u64 << s) * u64::from(bits + 1 - s));
                // The entries cover every operand exactly once.
                let mut next = 0;
                for en in &e {
                    assert_eq!(en.value, next);
                    next = en.value + ((!en.mask) & ((1 << bits) - 1)) + 1;
                }
                assert_eq!(next, 1 << bits);
            }
        }
    }

    #[test]
    fn uniform_population_len_counts_without_building() {
        for bits in 1..=12 {
            for s in 0..=bits {
                assert_eq!(
                    uniform_population_len(bits, s),
                    uniform_population(bits, s).len() as u64,
                    "bits={bits} s={s}"
                );
            }
        }
        assert_eq!(uniform_population_len(32, 0), 33);
        assert_eq!(uniform_population_len(32, 13), 163_840);
        assert_eq!(uniform_population_len(32, 31), 1 << 32);
        assert_eq!(uniform_population_len(32, 32), 1 << 32);
        assert_eq!(uniform_population_len(32, 40), 1 << 32);
        assert_eq!(uniform_population_len(64, 64), u64::MAX, "saturates");
    }

    /// The monitoring table is a ternary match block: at most `MAX_TCAM_ENTRIES` entries
    /// (and one per operand), refused before any bin is built.
    #[test]
    fn monitoring_entries_are_bounded_by_a_block() {
        let refused = |entries, operand_bits| {
            Some(AdaError::MonitoringEntries {
                entries,
                operand_bits,
            })
        };
        assert_eq!(max_monitoring_entries(3), 8);
        assert_eq!(max_monitoring_entries(16), 1 << 16);
        assert_eq!(max_monitoring_entries(32), MAX_TCAM_ENTRIES as u64);
        // Just above a block: 65 536 bins if accepted.
        assert_eq!(BinningTrie::new(65_537, 32).err(), refused(65_537, 32));
        let t = BinningTrie::new(65_536, 32).expect("a block's worth");
        assert_eq!(t.entries(), 65_536);
        // 2^32 bins (96 GiB) if it were built.
        assert_eq!(BinningTrie::new(1 << 32, 32).err(), refused(1 << 32, 32));
        assert!(BinningTrie::new(1 << 16, 16).is_ok());
        assert_eq!(
            BinningTrie::new((1 << 16) + 1, 16).err(),
            refused((1 << 16) + 1, 16)
        );
        // The message states the real bound.
        let msg = refused(65_537, 32)
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            msg.contains("must be 1 to 65536 (a ternary match block's largest)"),
            "{msg}"
        );
        let msg = refused(9, 3).map(|e| e.to_string()).unwrap_or_default();
        assert!(msg.contains("must be 1 to 8 (one per operand)"), "{msg}");
    }

    /// Algorithm 3's entries cover every operand exactly once, in operand order, whatever
    /// the hits and the budget (the calculation table relies on it).
    #[test]
    fn populations_cover_the_operands_exactly_once() {
        let mut rng = crate::rng::SplitMix64::new(5);
        let mut t = BinningTrie::new(8, 12).expect("valid");
        for epoch in 0..30 {
            for _ in 0..500 {
                // Skewed: small operands far more often, and nothing in 3/8 of the space
                // (bins without hits) from epoch 10 on.
                let magnitude = 1 + rng.below(12);
                let v = rng.below(1 << magnitude);
                let v = if epoch >= 10 && (0x400..0xa00).contains(&v) {
                    v / 4
                } else {
                    v
                };
                t.record(v).expect("12-bit operand");
            }
            let budget = t.entries() as u64 + epoch * 7;
            let entries = t.populate(budget).expect("budget covers the bins");
            assert!(entries.len() as u64 <= budget);
            check_population(&t, &entries, budget);
            t.update(0.2, 2);
        }
    }

    /// Checks `entries`, `t`'s population for `budget`: every operand covered exactly once,
    /// in operand order, each representative inside its entry.
    fn check_population(t: &BinningTrie, entries: &[TernaryEntry], budget: u64) {
        let all = (1u64 << t.operand_bits()) - 1;
        assert!(entries.len() as u64 <= budget);
        let mut next = 0;
        for e in entries {
            assert_eq!(e.value, next, "contiguous, in order");
            let last = e.value | (!e.mask & all);
            assert!((e.value..=last).contains(&e.representative));
            next = last + 1;
        }
        assert_eq!(next, all + 1);
    }

    #[test]
    fn bin_population_fits_its_share() {
        let t = BinningTrie::new(4, 16).expect("valid");
        for bin in t.leaves() {
            for k in 1..200 {
                let e = bin_population(bin, k);
                assert!(!e.is_empty() && e.len() as u64 <= k);
                assert!(e.iter().all(|e| bin.contains(e.value)));
            }
        }
        // A share as large as the bin gives exact entries.
        let small = BinningTrie::new(4, 4).expect("valid");
        assert_eq!(bin_population(&small.leaves()[0], 4).len(), 4);
    }

    #[test]
    fn bin_population_uses_its_whole_share_on_the_widest_entries() {
        let t = BinningTrie::new(4, 16).expect("valid");
        let bin = t.leaves()[1]; // 01xx..: 2^14 operands
        for k in 1..300 {
            let e = bin_population(&bin, k);
            assert_eq!(e.len() as u64, k, "every entry of the share is used");
            // Disjoint, in order, covering the bin.
            let mut next = bin.first();
            for en in &e {
                assert_eq!(en.value, next);
                next = en.value + (!en.mask & 0xffff) + 1;
            }
            assert_eq!(next, bin.last() + 1);
            // No entry is more than twice as wide as another (the widest split first), so
            // every entry is within one level of the others.
            let widths: Vec<u32> = e
                .iter()
                .map(|en| (!en.mask & 0xffff).count_ones())
                .collect();
            let (lo, hi) = (widths.iter().min(), widths.iter().max());
            assert!(
                hi.zip(lo).is_some_and(|(h, l)| h - l <= 1),
                "k={k}: {widths:?}"
            );
        }
        // Past one entry per operand nothing more is added.
        let tiny = BinningTrie::new(8, 3).expect("valid").leaves()[0];
        assert_eq!(bin_population(&tiny, 5).len(), 1);
    }

    #[test]
    fn populate_gives_entries_a_narrow_bin_cannot_use_to_the_others() {
        let mut t = BinningTrie::new(4, 8).expect("valid");
        // Drive the trie down to a one-operand bin at 200.
        for _ in 0..40 {
            record_n(&mut t, 200, 50);
            record_n(&mut t, 3, 1);
            t.update(0.2, 2);
        }
        record_n(&mut t, 200, 50);
        record_n(&mut t, 3, 1);
        let i = t.bin_of(200).expect("in range");
        assert_eq!(t.leaves()[i].len, 8, "a bin of its own");
        let shares = t.allocate(64).expect("enough");
        assert!(shares[i] > 1, "the hot bin draws more than it can use");
        let entries = t.populate(64).expect("enough");
        assert_eq!(entries.len(), 64, "the spare entries went elsewhere");
        check_population(&t, &entries, 64);
        // A budget of one entry per operand makes every entry exact, and no more are used.
        let all = t.populate(1000).expect("enough");
        assert_eq!(all.len(), 256);
        assert!(all.iter().all(|e| e.mask == 0xff));
    }

    #[test]
    fn growth_stops_at_the_monitoring_capacity() {
        let mut t = BinningTrie::new(8, 16)
            .and_then(|t| t.with_max_entries(12))
            .expect("valid");
        let below = BinningTrie::new(8, 16)
            .expect("valid")
            .with_max_entries(7)
            .expect_err("a cap below the bins");
        assert_eq!(
            below,
            AdaError::MaxEntriesBelowBins {
                max_entries: 7,
                bins: 8
            }
        );
        assert_eq!(
            below.to_string(),
            "a cap of 7 monitoring entries is below the trie's 8 bins: it must be at least 8"
        );
        for _ in 0..60 {
            record_n(&mut t, 40_000, 100);
            record_n(&mut t, 3, 1);
            t.update(0.2, 2);
            assert!(t.entries() <= 12);
        }
        assert_eq!(t.entries(), 12, "grown to the cap");
        assert_eq!(t.max_entries(), 12);
    }

    #[test]
    fn hits_from_counters_replace_recorded_ones() {
        let mut t = BinningTrie::new(4, 3).expect("valid");
        t.set_hits(&[5, 14, 2, 1]).expect("one count per bin");
        assert_eq!(
            t.leaves().iter().map(|b| b.hits).collect::<Vec<_>>(),
            [5, 14, 2, 1]
        );
        assert_eq!(
            t.set_hits(&[1, 2, 3]),
            Err(AdaError::HitsMismatch {
                counters: 3,
                bins: 4
            })
        );
        assert_eq!(t.leaves()[1].hits, 14, "a refused read changes nothing");
        // Figure 4a -> 4b from counters alone.
        assert!(matches!(t.update(0.2, 2), Update::Rebalanced { .. }));
    }
}

#[cfg(test)]
mod width_tests {
    use super::*;

    /// Every width a `u64` holds, 1 to 64: entries, bins and populations are total there
    /// (no shift overflows at 64), and cover the operands exactly once.
    #[test]
    fn every_width_up_to_64_bits() {
        for bits in 1..=64u32 {
            let all = u64::MAX >> (64 - bits);
            let whole = TernaryEntry::for_prefix(0, 0, bits);
            assert_eq!((whole.value, whole.mask), (0, 0), "bits={bits}");
            assert_eq!(whole.representative, all / 2, "bits={bits}");
            assert!(whole.matches(all) && whole.matches(0));
            let top = TernaryEntry::for_prefix(all, bits, bits);
            assert_eq!((top.value, top.mask, top.representative), (all, all, all));
            let bin = Bin {
                prefix: 1,
                len: 1,
                bits,
                hits: 0,
            };
            assert_eq!(bin.last(), all, "bits={bits}");
            assert_eq!(bin.mask(), 1u64 << (bits - 1));
            assert!(bin.contains(all) && !bin.contains(all >> 1));
            for s in 0..bits.min(4) {
                let e = uniform_population(bits, s);
                assert_eq!(e.len() as u64, uniform_population_len(bits, s));
                let mut next = 0u64;
                for en in &e {
                    assert_eq!(en.value, next, "bits={bits} s={s}");
                    next = en.value.wrapping_add(!en.mask & all).wrapping_add(1);
                }
                assert_eq!(next, all.wrapping_add(1), "bits={bits} s={s}");
            }
            let e = bin_population(&bin, 5);
            assert_eq!(e.len(), if bits <= 3 { 1 << (bits - 1) } else { 5 });
            assert_eq!(e.first().map(|e| e.value), Some(bin.first()));
        }
    }

    /// The split order compares `2^(2r) / lo` exactly: on 32-bit entries, where the
    /// products fit a `u128`, it agrees with cross-multiplying.
    #[test]
    fn split_order_agrees_with_cross_multiplication() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let gain = |s: &Split| match (s.r, s.lo) {
            (0, _) => (0u128, 1u128),
            (_, 0) => (1, 0),
            (r, lo) => (1u128 << (2 * r), u128::from(lo)),
        };
        for _ in 0..20_000 {
            let mut draw = || {
                let r = rng.below(33) as u32;
                let lo = match rng.below(4) {
                    0 => 0,
                    1 => 1 << rng.below(32),
                    _ => rng.below(1 << 32),
                };
                Split { r, lo }
            };
            let (a, b) = (draw(), draw());
            let ((an, ad), (bn, bd)) = (gain(&a), gain(&b));
            assert_eq!(
                a.cmp_gain(&b),
                (an * bd).cmp(&(bn * ad)),
                "r={} lo={} against r={} lo={}",
                a.r,
                a.lo,
                b.r,
                b.lo
            );
        }
        // At 64 bits, where cross-multiplying would overflow.
        let wide = Split { r: 63, lo: 1 << 63 };
        let narrow = Split { r: 1, lo: u64::MAX };
        assert_eq!(wide.cmp_gain(&narrow), std::cmp::Ordering::Greater);
        assert_eq!(narrow.cmp_gain(&wide), std::cmp::Ordering::Less);
    }

    /// A prefix longer than its width, or a width above 64, is taken at its largest
    /// meaningful value rather than overflowing a shift (or, refining a bin past its
    /// width, recursing until the stack overflows).
    #[test]
    fn out_of_range_prefixes_do_not_panic() {
        let deep = Bin {
            prefix: 0,
            len: 9,
            bits: 8,
            hits: 0,
        };
        assert_eq!(
            bin_population(&deep, 4),
            [TernaryEntry::for_prefix(0, 8, 8)]
        );
        let wide = Bin {
            prefix: 1,
            len: 70,
            bits: 80,
            hits: 0,
        };
        assert_eq!(wide.pattern().len(), 80);
        assert_eq!(
            bin_population(&wide, 3),
            [TernaryEntry::for_prefix(1, 64, 64)]
        );
        assert_eq!(
            uniform_population(80, 2).len() as u64,
            uniform_population_len(64, 2)
        );
        let e = TernaryEntry::for_prefix(5, 9, 8);
        assert_eq!((e.mask, e.value), (0xff, 5));
        let e = TernaryEntry::for_prefix(0, 0, 80);
        assert_eq!((e.value, e.mask, e.representative), (0, 0, u64::MAX / 2));
    }
}

#[cfg(test)]
mod huge_tests {
    use super::*;

    /// The proportional split of Algorithm 3 with the largest budget and counters: hits
    /// summed over a node reach `2^16 * 2^64`, times a budget near `2^64`, past a `u128`.
    #[test]
    fn the_largest_budget_over_the_hottest_counters() {
        let mut t = BinningTrie::new(4, 8).expect("valid");
        t.set_hits(&[u64::MAX, u64::MAX, 1, u64::MAX])
            .expect("one per bin");
        let shares = t.allocate(u64::MAX).expect("a budget above the bins");
        assert_eq!(
            shares.iter().fold(0u64, |s, &n| s.saturating_add(n)),
            u64::MAX
        );
        assert!(shares[2] < shares[0] / 1000, "{shares:?}");
        assert_eq!(t.populate(u64::MAX).expect("256 at most").len(), 256);
        let mut wide = BinningTrie::new(1 << 16, 32).expect("a block's worth");
        wide.set_hits(&vec![u64::MAX; 1 << 16])
            .expect("one per bin");
        let shares = wide.allocate(u64::MAX).expect("a budget above the bins");
        assert_eq!(shares.len(), 1 << 16);
        assert_eq!(
            shares.iter().fold(0u64, |s, &n| s.saturating_add(n)),
            u64::MAX
        );
    }
}
