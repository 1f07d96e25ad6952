//! The ternary match block (TCAM): a table of value/mask/priority/result entries, looked up
//! by 32-bit key, replaced whole by the control side while lookups run, with a hit counter
//! per entry.
//!
//! # Matching
//!
//! An entry ([`TcamEntry`]) matches key `k` iff `k & mask == value & mask`: a mask bit of 1
//! means "this key bit must equal the value's", a 0 means "don't care" (the `x` of a ternary
//! pattern). Value bits outside the mask never take part in a match, so
//! [`Tcam::replace`] *normalises* them (stores `value & mask`) rather than refusing the
//! entry: ADA's bins (`0^p 1 (0|1)^s x^r`) are naturally written as an operand with its low
//! bits masked off, and refusing those would only push the masking onto every caller.
//! [`Tcam::entries`] returns the normalised entries.
//!
//! When several entries match, the table's [`MatchMode`] picks one:
//!
//! * [`MatchMode::HighestPriority`]: the largest `priority` wins; among equal priorities,
//!   the entry that came first in the table (lowest index), as in a hardware TCAM, where the
//!   lowest address wins.
//! * [`MatchMode::LongestPrefix`]: the entry with the most mask bits set wins (the mask need
//!   not be a contiguous prefix: "longest" counts the cared-for bits); among equal counts, the
//!   largest `priority`, then the lowest index.
//!
//! Either way exactly one entry wins, so a lookup is deterministic for a given table and key.
//!
//! # Replacement and versions
//!
//! The control side never edits entries in place: [`Tcam::replace`] builds a whole new table
//! (with fresh, zeroed hit counters) and publishes it in one step. A lookup works on the one
//! table that was current when it started, from first entry to last, so it never sees part
//! of one table and part of another; a lookup that started just before a replacement may
//! still finish on the old table. Each published table has a version, counted from 1 (the
//! empty table a [`Tcam`] starts with is version 0); [`Tcam::replace`] returns the new one.
//!
//! # Hit counters
//!
//! Every lookup that finds a match adds one to the winning entry's counter (a relaxed
//! atomic add: the counters are statistics, ordered with nothing else). Counters belong to
//! the table version they were hit in: a replacement starts the new table at zero, and a hit
//! by a lookup that finishes on the old table after a replacement counts in the old table,
//! which nobody reads any more. [`Tcam::hits`] reads the current table's counters with the
//! version they belong to, so a controller (ADA's) can tell whether they describe the table
//! it last wrote.
//!
//! # Cost
//!
//! The current table is held as `RwLock<Arc<Table>>`: a lookup takes the read lock only to
//! clone the `Arc`, so a replacement never waits for a lookup and a lookup never blocks on a
//! writer for longer than the pointer swap. [`Tcam::replace`] precomputes how lookups find
//! their winner, on the control side:
//!
//! * when every mask is a prefix (ones from the top bit down, as in every arithmetic table
//!   and every LPM table), the winner of every key as at most `2n + 1` intervals, so a
//!   lookup is a binary search, `O(log n)`: a few nanoseconds for thousands of entries;
//! * otherwise, the entries sorted in match order, so a lookup is a linear scan that stops
//!   at the first match, `O(n)`.
//!
//! Either costs `O(n log n)` at replacement. A hardware TCAM compares every entry in
//! parallel; the emulation does not model that latency.

use std::fmt;
use std::sync::Arc;

use crate::sync::{AtomicU64, CachePadded, Ordering, RwLock};

/// The next [`Tcam`]'s id (a plain `std` atomic: ids order nothing, and loom's atomics
/// cannot be statics).
static NEXT_TCAM_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Largest capacity a [`Tcam`] accepts, in entries (the largest TCAMs on switch ASICs hold
/// tens of thousands of entries; a linear scan of more would not be a lookup any more).
pub const MAX_TCAM_ENTRIES: usize = 1 << 16;

/// One ternary entry: matches key `k` iff `k & mask == value & mask`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TcamEntry {
    /// The bits to match (only those under `mask` matter; [`Tcam::replace`] clears the rest).
    pub value: u32,
    /// Bit 1 = the key's bit must equal `value`'s; bit 0 = don't care.
    pub mask: u32,
    /// Larger wins among matching entries (see [`MatchMode`]).
    pub priority: u32,
    /// What a lookup that picks this entry returns.
    pub result: u64,
}

impl TcamEntry {
    /// Whether this entry matches `key`.
    #[inline]
    pub fn matches(&self, key: u32) -> bool {
        key & self.mask == self.value & self.mask
    }
}

/// How a [`Tcam`] chooses among several matching entries (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatchMode {
    /// Largest `priority`, then lowest index.
    HighestPriority,
    /// Most mask bits set, then largest `priority`, then lowest index.
    LongestPrefix,
}

impl MatchMode {
    /// The sort key of entry `index` in match order: the entry with the smallest key wins.
    fn rank(self, index: usize, entry: &TcamEntry) -> (u32, u32, usize) {
        let care = match self {
            MatchMode::HighestPriority => 0,
            MatchMode::LongestPrefix => entry.mask.count_ones(),
        };
        (u32::MAX - care, u32::MAX - entry.priority, index)
    }
}

/// A successful lookup: which entry matched and its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcamHit {
    /// The entry's position in the `Vec` given to [`Tcam::replace`].
    pub index: usize,
    /// The entry's result.
    pub result: u64,
}

/// Why a TCAM was not created or a table not installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TcamError {
    /// The `capacity_entries` setting of [`Tcam::new`] is 0 or above [`MAX_TCAM_ENTRIES`].
    BadCapacity {
        /// The capacity asked for.
        capacity_entries: usize,
    },
    /// [`Tcam::replace`] was given more entries than the TCAM holds; the current table is
    /// left as it was.
    TooManyEntries {
        /// Entries given.
        entries: usize,
        /// The TCAM's capacity.
        capacity: usize,
    },
}

impl fmt::Display for TcamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TcamError::BadCapacity { capacity_entries } => write!(
                f,
                "invalid TCAM setting `capacity_entries`: must be from 1 to {MAX_TCAM_ENTRIES}, got {capacity_entries}"
            ),
            TcamError::TooManyEntries { entries, capacity } => write!(
                f,
                "TCAM table of {entries} entries does not fit the TCAM's {capacity} entries"
            ),
        }
    }
}

impl std::error::Error for TcamError {}

/// One published table: immutable once built, apart from its hit counters.
struct Table {
    /// Counted from 1 per [`Tcam::replace`]; 0 is the initial empty table.
    version: u64,
    /// The entries in match order (winner first), each with its index in the caller's `Vec`.
    sorted: Box<[(TcamEntry, usize)]>,
    /// Hit counter per entry, indexed by the caller's index (not by `sorted` position).
    hits: Box<[AtomicU64]>,
    /// When every mask is a prefix: the winner of every key, as intervals (see
    /// [`Intervals`]); otherwise lookups scan `sorted`.
    intervals: Option<Intervals>,
}

impl Table {
    fn empty() -> Table {
        Table {
            version: 0,
            sorted: Box::new([]),
            hits: Box::new([]),
            intervals: Some(Intervals::of(&[])),
        }
    }

    /// `key`'s winner, its hit counted.
    #[inline]
    fn lookup(&self, key: u32) -> Option<TcamHit> {
        let (entry, index) = self.sorted[self.winner(key)?];
        self.hits[index].fetch_add(1, Ordering::Relaxed);
        Some(TcamHit {
            index,
            result: entry.result,
        })
    }

    /// The position in `sorted` of `key`'s winner.
    #[inline]
    fn winner(&self, key: u32) -> Option<usize> {
        match &self.intervals {
            Some(iv) => iv.winner(key),
            None => self.sorted.iter().position(|(e, _)| e.matches(key)),
        }
    }
}

/// The winners of a table whose masks are all prefixes (ones from the top bit down, then
/// zeros), precomputed as intervals of keys.
///
/// A prefix entry matches an interval of keys, `value ..= value | !mask`, and two such
/// intervals are either nested or disjoint. So the keys split into at most `2n + 1`
/// elementary intervals, in each of which the same entries match and one wins: the best
/// ranked among the intervals nested around it. [`Intervals::of`] finds them in one sweep
/// over the entries sorted by start (outer before inner), keeping the chain of open
/// intervals on a stack with the best rank so far on each level; a lookup is then a binary
/// search, `O(log n)`, with the same answer as the scan (the property test checks both
/// against a brute-force reference). Hardware compares every entry in parallel; a linear
/// scan of a 4096-entry antilog table would cost microseconds per lookup.
struct Intervals {
    /// Where each elementary interval starts, ascending, the first at 0.
    starts: Box<[u32]>,
    /// Its winner's position in `sorted`, or `u32::MAX` for none.
    winners: Box<[u32]>,
}

impl Intervals {
    const NONE: u32 = u32::MAX;

    /// The intervals of `sorted` (entries in match order), or `None` when some mask is not
    /// a prefix.
    fn build(sorted: &[(TcamEntry, usize)]) -> Option<Intervals> {
        sorted
            .iter()
            .all(|(e, _)| e.mask.leading_ones() + e.mask.trailing_zeros() == 32)
            .then(|| Intervals::of(sorted))
    }

    /// See the type's doc; every mask must be a prefix.
    fn of(sorted: &[(TcamEntry, usize)]) -> Intervals {
        // (first key, last key, position in `sorted`: smaller is better ranked).
        let mut spans: Vec<(u64, u64, u32)> = sorted
            .iter()
            .enumerate()
            .map(|(pos, (e, _))| {
                let first = u64::from(e.value & e.mask);
                (first, first | u64::from(!e.mask), pos as u32)
            })
            .collect();
        // Outer (longer) first at the same start; equal spans best first.
        spans.sort_unstable_by_key(|&(first, last, pos)| (first, std::cmp::Reverse(last), pos));
        let mut starts: Vec<u32> = Vec::with_capacity(2 * spans.len() + 1);
        let mut winners: Vec<u32> = Vec::with_capacity(2 * spans.len() + 1);
        let mut emit = |at: u64, winner: u32| {
            if at > u64::from(u32::MAX) {
                return;
            }
            if starts.last() == Some(&(at as u32)) {
                // A later event at the same key decides it.
                starts.pop();
                winners.pop();
            }
            if winners.last() != Some(&winner) {
                starts.push(at as u32);
                winners.push(winner);
            }
        };
        emit(0, Self::NONE);
        // Open intervals, outermost first: (last key, best position on this level).
        let mut open: Vec<(u64, u32)> = Vec::new();
        let close = |open: &mut Vec<(u64, u32)>, upto: u64, emit: &mut dyn FnMut(u64, u32)| {
            while let Some(&(last, _)) = open.last() {
                if last >= upto {
                    break;
                }
                open.pop();
                emit(last + 1, open.last().map_or(Self::NONE, |&(_, best)| best));
            }
        };
        for (first, last, pos) in spans {
            close(&mut open, first, &mut emit);
            let best = open.last().map_or(pos, |&(_, outer)| outer.min(pos));
            emit(first, best);
            open.push((last, best));
        }
        close(&mut open, u64::MAX, &mut emit);
        Intervals {
            starts: starts.into_boxed_slice(),
            winners: winners.into_boxed_slice(),
        }
    }

    #[inline]
    fn winner(&self, key: u32) -> Option<usize> {
        // `starts[0] == 0`, so some interval starts at or below every key.
        let i = self.starts.partition_point(|&s| s <= key) - 1;
        let w = self.winners[i];
        (w != Self::NONE).then_some(w as usize)
    }
}

/// A ternary match block: up to a fixed number of [`TcamEntry`]s, one [`MatchMode`], looked
/// up by any number of threads while the control side replaces the whole table (see the
/// module doc for the guarantees and the cost).
pub struct Tcam {
    /// The table lookups use; replaced whole, never edited. The lock is held only to clone
    /// or swap the `Arc`.
    current: RwLock<Arc<Table>>,
    /// The current table's version, published after the swap: a [`TcamCache`] compares it
    /// with the version it holds, a read of a line nobody writes between replacements.
    published: CachePadded<AtomicU64>,
    /// Names this block in [`TcamCache`]s (unlike its address, never reused).
    id: u64,
    /// Most entries a table may hold.
    capacity: usize,
    /// How a winner is chosen among matching entries.
    mode: MatchMode,
}

impl Tcam {
    /// An empty TCAM (version 0, no entries) holding up to `capacity_entries` entries.
    ///
    /// Refuses a capacity of 0 or above [`MAX_TCAM_ENTRIES`] with
    /// [`TcamError::BadCapacity`].
    pub fn new(capacity_entries: usize, mode: MatchMode) -> Result<Tcam, TcamError> {
        if capacity_entries == 0 || capacity_entries > MAX_TCAM_ENTRIES {
            return Err(TcamError::BadCapacity { capacity_entries });
        }
        Ok(Tcam {
            current: RwLock::new(Arc::new(Table::empty())),
            published: CachePadded::new(AtomicU64::new(0)),
            id: NEXT_TCAM_ID.fetch_add(1, Ordering::Relaxed),
            capacity: capacity_entries,
            mode,
        })
    }

    /// The table lookups use right now.
    fn table(&self) -> Arc<Table> {
        Arc::clone(&self.current.read())
    }

    /// The winning entry for `key` in the current table, if any entry matches; counts the hit
    /// on that entry.
    pub fn lookup(&self, key: u32) -> Option<TcamHit> {
        self.table().lookup(key)
    }

    /// Installs `entries` as the whole new table, with zeroed hit counters, and returns its
    /// version. Lookups already running finish on the old table; every lookup that starts
    /// after this returns uses the new one. Value bits outside each entry's mask are cleared.
    ///
    /// Refuses more entries than [`Tcam::capacity`] with [`TcamError::TooManyEntries`],
    /// leaving the current table in place.
    pub fn replace(&self, entries: Vec<TcamEntry>) -> Result<u64, TcamError> {
        if entries.len() > self.capacity {
            return Err(TcamError::TooManyEntries {
                entries: entries.len(),
                capacity: self.capacity,
            });
        }
        let mut sorted: Vec<(TcamEntry, usize)> = entries
            .into_iter()
            .map(|e| TcamEntry {
                value: e.value & e.mask,
                ..e
            })
            .zip(0..)
            .collect();
        // Indices are distinct, so the ranks are too and the order is total.
        sorted.sort_unstable_by_key(|(e, i)| self.mode.rank(*i, e));
        let hits = (0..sorted.len()).map(|_| AtomicU64::new(0)).collect();
        let intervals = Intervals::build(&sorted);
        let mut table = Table {
            version: 0,
            sorted: sorted.into_boxed_slice(),
            hits,
            intervals,
        };
        // The version is taken under the write lock, so concurrent replacements publish
        // versions in the order they are numbered.
        let mut current = self.current.write();
        table.version = current.version + 1;
        let version = table.version;
        *current = Arc::new(table);
        self.published.store(version, Ordering::Release);
        Ok(version)
    }

    /// The current table's version and its hit counters, indexed as the entries were given to
    /// [`Tcam::replace`] (empty for version 0).
    pub fn hits(&self) -> (u64, Vec<u64>) {
        let table = self.table();
        let hits = table
            .hits
            .iter()
            .map(|h| h.load(Ordering::Relaxed))
            .collect();
        (table.version, hits)
    }

    /// The current table's version and entries, in the order given to [`Tcam::replace`],
    /// with value bits outside the mask cleared.
    pub fn entries(&self) -> (u64, Vec<TcamEntry>) {
        let table = self.table();
        let mut entries = vec![
            TcamEntry {
                value: 0,
                mask: 0,
                priority: 0,
                result: 0
            };
            table.sorted.len()
        ];
        for &(entry, index) in table.sorted.iter() {
            entries[index] = entry;
        }
        (table.version, entries)
    }

    /// The current table's version (0 until the first [`Tcam::replace`]).
    pub fn version(&self) -> u64 {
        self.current.read().version
    }

    /// Entries in the current table.
    pub fn len(&self) -> usize {
        self.current.read().sorted.len()
    }

    /// Whether the current table has no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether lookups in the current table are a binary search (every mask a prefix) rather
    /// than a scan (module doc, *Cost*).
    pub fn is_indexed(&self) -> bool {
        self.table().intervals.is_some()
    }

    /// Most entries a table may hold.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// How a winner is chosen among matching entries.
    pub fn mode(&self) -> MatchMode {
        self.mode
    }
}

/// A PPE thread's handles on the tables it looked up last, so that its lookups read a
/// version number instead of taking the lock and cloning the `Arc` (four read-modify-writes
/// of lines every thread writes, which cost more than the lookup). Each slot holds a table
/// with the version it was published as; a lookup whose block has published nothing newer
/// uses the slot, any other takes the table from the block (and keeps it in the slot).
///
/// A lookup through the cache is a lookup of [`Tcam::lookup`]: on one whole table, the one
/// current when it started or a newer one, its hit counted on that table. A slot keeps its
/// table alive until the thread next looks that block up, or the slot is reused: a few old
/// tables per thread at most.
pub(crate) struct TcamCache {
    slots: [Option<CachedTable>; TCAM_CACHE_SLOTS],
    /// The slot the next new block takes, round robin.
    next: usize,
}

/// Blocks a [`TcamCache`] holds at once (a program rarely uses more: Nimble uses up to
/// five, the rate's monitoring and table, the time's table and, with `dt_ada`, its
/// monitoring, and the antilog).
const TCAM_CACHE_SLOTS: usize = 8;

struct CachedTable {
    id: u64,
    version: u64,
    table: Arc<Table>,
}

impl TcamCache {
    pub(crate) fn new() -> TcamCache {
        TcamCache {
            slots: Default::default(),
            next: 0,
        }
    }

    /// [`Tcam::lookup`], through the cache.
    #[inline]
    pub(crate) fn lookup(&mut self, tcam: &Tcam, key: u32) -> Option<TcamHit> {
        let version = tcam.published.load(Ordering::Acquire);
        let mut mine = None;
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(c) = slot {
                if c.id == tcam.id {
                    if c.version == version {
                        return c.table.lookup(key);
                    }
                    mine = Some(i);
                    break;
                }
            }
        }
        let i = mine.unwrap_or_else(|| {
            let i = self.next;
            self.next = (self.next + 1) % TCAM_CACHE_SLOTS;
            i
        });
        let table = tcam.table();
        let hit = table.lookup(key);
        self.slots[i] = Some(CachedTable {
            id: tcam.id,
            version: table.version,
            table,
        });
        hit
    }
}

impl fmt::Debug for Tcam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.table();
        f.debug_struct("Tcam")
            .field("mode", &self.mode)
            .field("capacity", &self.capacity)
            .field("version", &table.version)
            .field("len", &table.sorted.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicBool;
    use std::time::{Duration, Instant};

    use proptest::prelude::*;

    fn entry(value: u32, mask: u32, priority: u32, result: u64) -> TcamEntry {
        TcamEntry {
            value,
            mask,
            priority,
            result,
        }
    }

    /// The brute-force reference: every matching entry, the winner picked by comparing each
    /// pair directly from the module doc's rules (no sorting).
    fn reference(entries: &[TcamEntry], mode: MatchMode, key: u32) -> Option<TcamHit> {
        let mut best: Option<usize> = None;
        for (i, e) in entries.iter().enumerate() {
            if key & e.mask != e.value & e.mask {
                continue;
            }
            let better = match best {
                None => true,
                Some(b) => {
                    let cur = &entries[b];
                    let (ei, eb) = (e.mask.count_ones(), cur.mask.count_ones());
                    match mode {
                        MatchMode::LongestPrefix if ei != eb => ei > eb,
                        // Equal care counts (or priority mode): priority, then the earlier
                        // entry, which `b` already is.
                        _ => e.priority > cur.priority,
                    }
                }
            };
            if better {
                best = Some(i);
            }
        }
        best.map(|i| TcamHit {
            index: i,
            result: entries[i].result,
        })
    }

    #[test]
    fn capacity_is_checked_and_named() {
        for bad in [0, MAX_TCAM_ENTRIES + 1, usize::MAX] {
            let e = Tcam::new(bad, MatchMode::HighestPriority).unwrap_err();
            assert_eq!(
                e,
                TcamError::BadCapacity {
                    capacity_entries: bad
                }
            );
            let msg = e.to_string();
            assert!(msg.contains("`capacity_entries`"), "{msg}");
            assert!(msg.contains(&format!("got {bad}")), "{msg}");
            assert!(msg.contains(&MAX_TCAM_ENTRIES.to_string()), "{msg}");
        }
        let t = Tcam::new(MAX_TCAM_ENTRIES, MatchMode::LongestPrefix).unwrap();
        assert_eq!(t.capacity(), MAX_TCAM_ENTRIES);
        assert_eq!(t.mode(), MatchMode::LongestPrefix);
        let _: &dyn std::error::Error = &TcamError::BadCapacity {
            capacity_entries: 0,
        };
    }

    #[test]
    fn too_many_entries_is_refused_and_keeps_the_table() {
        let t = Tcam::new(2, MatchMode::HighestPriority).unwrap();
        assert_eq!(t.replace(vec![entry(1, !0, 0, 7)]), Ok(1));
        let e = t
            .replace(vec![entry(0, 0, 0, 0); 3])
            .expect_err("three entries in a TCAM of two");
        assert_eq!(
            e,
            TcamError::TooManyEntries {
                entries: 3,
                capacity: 2
            }
        );
        assert!(e.to_string().contains("3 entries"), "{e}");
        assert!(e.to_string().contains("2 entries"), "{e}");
        assert_eq!(t.version(), 1);
        assert_eq!(t.len(), 1);
        assert_eq!(t.lookup(1).map(|h| h.result), Some(7));
        // Exactly full is fine.
        assert_eq!(t.replace(vec![entry(0, 0, 0, 0); 2]), Ok(2));
    }

    #[test]
    fn starts_empty_at_version_zero() {
        let t = Tcam::new(4, MatchMode::HighestPriority).unwrap();
        assert!(t.is_empty());
        assert_eq!(t.version(), 0);
        assert_eq!(t.lookup(0), None);
        assert_eq!(t.hits(), (0, vec![]));
        assert_eq!(t.entries(), (0, vec![]));
        assert!(format!("{t:?}").contains("version: 0"));
    }

    #[test]
    fn value_bits_outside_the_mask_are_normalised() {
        let t = Tcam::new(4, MatchMode::HighestPriority).unwrap();
        t.replace(vec![entry(0xabcd_ef12, 0xffff_0000, 0, 9)])
            .unwrap();
        assert_eq!(t.entries().1, vec![entry(0xabcd_0000, 0xffff_0000, 0, 9)]);
        assert_eq!(t.lookup(0xabcd_0000).map(|h| h.result), Some(9));
        assert_eq!(t.lookup(0xabcd_ffff).map(|h| h.result), Some(9));
        assert_eq!(t.lookup(0xabce_0000), None);
    }

    #[test]
    fn priority_mode_picks_largest_priority_then_first() {
        let t = Tcam::new(8, MatchMode::HighestPriority).unwrap();
        t.replace(vec![
            entry(0, 0, 1, 10),             // wildcard, low priority
            entry(0x10, 0xf0, 5, 11),       // 0x1?
            entry(0x12, 0xff, 5, 12),       // exact 0x12, same priority, later
            entry(0x12, 0xff, 3, 13),       // exact, lower priority
            entry(0x20, 0xfffffff0, 5, 14), // 0x2?, first of two equal
            entry(0x20, 0xfffffff0, 5, 15),
        ])
        .unwrap();
        assert_eq!(
            t.lookup(0x12),
            Some(TcamHit {
                index: 1,
                result: 11
            })
        );
        assert_eq!(
            t.lookup(0x25),
            Some(TcamHit {
                index: 4,
                result: 14
            })
        );
        assert_eq!(
            t.lookup(0x99),
            Some(TcamHit {
                index: 0,
                result: 10
            })
        );
    }

    #[test]
    fn longest_mode_counts_mask_bits_then_priority_then_first() {
        let t = Tcam::new(8, MatchMode::LongestPrefix).unwrap();
        t.replace(vec![
            entry(0, 0, 9, 10),         // wildcard, high priority
            entry(0x10, 0xf0, 1, 11),   // 4 bits
            entry(0x12, 0xff, 0, 12),   // 8 bits, lowest priority
            entry(0x02, 0x0f, 2, 13),   // 4 bits, non-contiguous with 0x10/0xf0
            entry(0x02, 0x0f, 2, 14),   // same, later
            entry(0x100, 0x100, 7, 15), // 1 bit
        ])
        .unwrap();
        assert_eq!(t.lookup(0x12).map(|h| h.index), Some(2));
        // 0x32: 0x10/0xf0 misses, 0x02/0x0f matches with 4 bits at priority 2.
        assert_eq!(t.lookup(0x32).map(|h| h.index), Some(3));
        // 0x1f: only the 4-bit 0x1? entry and the wildcard.
        assert_eq!(t.lookup(0x1f).map(|h| h.index), Some(1));
        // 0x100: the 1-bit entry beats the priority-9 wildcard.
        assert_eq!(t.lookup(0x100).map(|h| h.index), Some(5));
        assert_eq!(t.lookup(0x40).map(|h| h.index), Some(0));
    }

    #[test]
    fn hits_count_the_winner_per_version() {
        let t = Tcam::new(4, MatchMode::HighestPriority).unwrap();
        let v1 = t
            .replace(vec![entry(1, !0, 1, 1), entry(0, 0, 0, 2)])
            .unwrap();
        for key in [1, 1, 5, 1, 7] {
            t.lookup(key);
        }
        assert_eq!(t.hits(), (v1, vec![3, 2]));
        let v2 = t.replace(vec![entry(5, !0, 0, 3)]).unwrap();
        assert_eq!(v2, v1 + 1);
        assert_eq!(t.hits(), (v2, vec![0]));
        assert_eq!(t.lookup(1), None);
        t.lookup(5);
        assert_eq!(t.hits(), (v2, vec![1]));
    }

    /// Random entries whose values are drawn from a few patterns, so that entries overlap
    /// and keys (drawn from the entries' values with random don't-care bits) hit several.
    fn table_and_keys() -> impl Strategy<Value = (Vec<TcamEntry>, Vec<u32>)> {
        let e = (any::<u32>(), any::<u32>(), 0u32..4, any::<u64>()).prop_map(
            |(value, mask, priority, result)| {
                // Keep masks sparse-ish in the high half so matches are common.
                let mask = mask & 0x0000_ffff | (mask & 0x00ff_0000 & (mask >> 8));
                entry(value & 0x00ff_00ff, mask, priority, result)
            },
        );
        prop::collection::vec(e, 0..40).prop_flat_map(|entries| {
            let n = entries.len().max(1);
            let key = (0..n, any::<u32>(), any::<bool>()).prop_map({
                let entries = entries.clone();
                move |(i, noise, random)| match entries.get(i) {
                    Some(e) if !random => (e.value & e.mask) | (noise & !e.mask),
                    _ => noise & 0x00ff_00ff,
                }
            });
            (Just(entries), prop::collection::vec(key, 1..64))
        })
    }

    /// Random prefix entries (masks of 0 to 32 leading ones) around a few values, so that
    /// entries nest, repeat and overlap as LPM and arithmetic tables do; keys near them.
    fn prefix_table_and_keys() -> impl Strategy<Value = (Vec<TcamEntry>, Vec<u32>)> {
        let e = (0usize..4, any::<u32>(), 0u32..=32, 0u32..3, any::<u64>()).prop_map(
            |(base, noise, len, priority, result)| {
                let bases = [0u32, 0x8000_0000, 0xffff_ff00, 0x1234_5678];
                let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
                entry(bases[base] ^ (noise & 0x0000_0f0f), mask, priority, result)
            },
        );
        prop::collection::vec(e, 0..40).prop_flat_map(|entries| {
            let key = (0usize..4, any::<u32>(), any::<bool>()).prop_map(|(base, noise, wide)| {
                let bases = [0u32, 0x8000_0000, 0xffff_ff00, 0x1234_5678];
                if wide {
                    noise
                } else {
                    bases[base] ^ (noise & 0x0000_0f0f)
                }
            });
            (Just(entries), prop::collection::vec(key, 1..64))
        })
    }

    /// Every key at an interval's edge and either side of it, for the prefix test below.
    fn edges(entries: &[TcamEntry]) -> Vec<u32> {
        let mut keys = vec![0, u32::MAX];
        for e in entries {
            let (first, last) = (e.value & e.mask, (e.value & e.mask) | !e.mask);
            for k in [first, last] {
                keys.extend([k.wrapping_sub(1), k, k.wrapping_add(1)]);
            }
        }
        keys
    }

    proptest! {
        #[test]
        fn prefix_tables_take_the_interval_index_and_equal_brute_force(
            (entries, keys) in prefix_table_and_keys()
        ) {
            for mode in [MatchMode::HighestPriority, MatchMode::LongestPrefix] {
                let t = Tcam::new(64, mode).unwrap();
                t.replace(entries.clone()).unwrap();
                prop_assert!(t.table().intervals.is_some(), "prefix masks are indexed");
                for key in keys.iter().copied().chain(edges(&entries)) {
                    let want = reference(&entries, mode, key);
                    prop_assert_eq!(t.lookup(key), want, "mode {:?} key {:#x}", mode, key);
                }
            }
        }

        #[test]
        fn lookup_equals_brute_force((entries, keys) in table_and_keys()) {
            for mode in [MatchMode::HighestPriority, MatchMode::LongestPrefix] {
                let t = Tcam::new(64, mode).unwrap();
                let version = t.replace(entries.clone()).unwrap();
                let mut expected_hits = vec![0u64; entries.len()];
                let mut matched = 0u64;
                for &key in &keys {
                    let want = reference(&entries, mode, key);
                    prop_assert_eq!(t.lookup(key), want, "mode {:?} key {:#x}", mode, key);
                    if let Some(hit) = want {
                        expected_hits[hit.index] += 1;
                        matched += 1;
                    }
                }
                let (v, hits) = t.hits();
                prop_assert_eq!(v, version);
                prop_assert_eq!(hits.iter().sum::<u64>(), matched);
                prop_assert_eq!(hits, expected_hits);
            }
        }
    }

    /// Probe key `k_j` (`flavour` 0) or `k'_j` (`flavour` 1) of [`mixable_tables`]: the keys
    /// form two chains (`k_0, k'_1, k_2, ..` and `k'_0, k_1, k'_2, ..`, told apart by bit 16),
    /// numbered along each chain in Gray code, so neighbours on a chain differ in one bit.
    fn probe(flavour: u32, j: u32) -> u32 {
        ((j + flavour) % 2) << 16 | (j ^ (j >> 1))
    }

    /// An entry matching exactly keys `x` and `y` (which differ in one bit, or are equal).
    fn pair(x: u32, y: u32, result: u64) -> TcamEntry {
        entry(x, !(x ^ y), 0, result)
    }

    /// Two tables of `n` entries whose results name their table (`table * 1000 + i`), built so
    /// that any table made of some entries of one and the rest of the other misses some probe
    /// key that both whole tables hit. Entry `i` of table A matches exactly `k_i` and
    /// `k'_{i-1}`, entry `i` of B exactly `k'_i` and `k_{i-1}` (entry 0 only `k_0`, resp.
    /// `k'_0`), so in each whole table every probe `k_j`, `k'_j` (`j < n - 1`) has exactly one
    /// match. Where positions `i` and `i + 1` come from different tables, either `k_i` (B's
    /// `i`, A's `i + 1`) or `k'_i` (A's `i`, B's `i + 1`) has none.
    fn mixable_tables(n: u32) -> (Vec<TcamEntry>, Vec<TcamEntry>) {
        let table = |t: u64, own: u32, other: u32| -> Vec<TcamEntry> {
            (0..n)
                .map(|i| {
                    let result = t * 1000 + u64::from(i);
                    let x = probe(own, i);
                    match i.checked_sub(1) {
                        Some(prev) => pair(x, probe(other, prev), result),
                        None => pair(x, x, result),
                    }
                })
                .collect()
        };
        (table(1, 0, 1), table(2, 1, 0))
    }

    /// Every probe key of [`mixable_tables`]`(n)` (and the two unused ends).
    fn mixable_probes(n: u32) -> Vec<u32> {
        (0..n).flat_map(|j| [probe(0, j), probe(1, j)]).collect()
    }

    #[test]
    fn mixable_tables_are_detectably_mixable() {
        // Guard on the concurrency test's premise: every mix of A and B (by position) answers
        // some probe key differently from both A and B.
        let n = 6;
        let (a, b) = mixable_tables(n);
        let probes = mixable_probes(n);
        for pick in 1..(1u32 << n) - 1 {
            let mixed: Vec<_> = (0..n as usize)
                .map(|i| if pick >> i & 1 == 1 { b[i] } else { a[i] })
                .collect();
            let detected = probes.iter().any(|&k| {
                let m = reference(&mixed, MatchMode::HighestPriority, k).map(|h| h.result);
                m != reference(&a, MatchMode::HighestPriority, k).map(|h| h.result)
                    && m != reference(&b, MatchMode::HighestPriority, k).map(|h| h.result)
            });
            assert!(detected, "mix {pick:#b} looks like a whole table");
        }
    }

    #[test]
    fn a_cached_lookup_sees_every_replacement_and_tells_blocks_apart() {
        let mut cache = TcamCache::new();
        let blocks: Vec<Tcam> = (0..TCAM_CACHE_SLOTS as u64 + 3)
            .map(|i| {
                let t = Tcam::new(2, MatchMode::HighestPriority).unwrap();
                t.replace(vec![entry(0, 0, 0, i)]).unwrap();
                t
            })
            .collect();
        // More blocks than slots, in turn: each answer is its own block's.
        for round in 0..3 {
            for (i, t) in blocks.iter().enumerate() {
                assert_eq!(
                    cache.lookup(t, 5).map(|h| h.result),
                    Some(i as u64),
                    "{round}"
                );
            }
        }
        // A replacement is seen by the next cached lookup, and the hit counts there.
        let t = &blocks[0];
        assert_eq!(cache.lookup(t, 5).map(|h| h.result), Some(0));
        let v = t.replace(vec![entry(5, !0, 0, 77)]).unwrap();
        assert_eq!(cache.lookup(t, 5).map(|h| h.result), Some(77));
        assert_eq!(cache.lookup(t, 6), None);
        assert_eq!(t.hits(), (v, vec![1]));
        // A block dropped and another made (perhaps at the same address) is not confused.
        drop(blocks);
        let fresh = Tcam::new(2, MatchMode::HighestPriority).unwrap();
        assert_eq!(cache.lookup(&fresh, 5), None);
    }

    #[test]
    fn replacement_under_concurrent_lookups_never_mixes_tables() {
        let replacements = if cfg!(miri) { 20 } else { 2_000 };
        let readers = 3;
        let n = 6;
        let deadline = Instant::now() + Duration::from_secs(120);
        let (a, b) = mixable_tables(n);
        let probes = mixable_probes(n);
        let answers: Vec<[Option<TcamHit>; 2]> = probes
            .iter()
            .map(|&k| {
                [
                    reference(&a, MatchMode::HighestPriority, k),
                    reference(&b, MatchMode::HighestPriority, k),
                ]
            })
            .collect();
        let t = Tcam::new(n as usize, MatchMode::HighestPriority).unwrap();
        t.replace(a.clone()).unwrap();
        let done = AtomicBool::new(false);

        std::thread::scope(|s| {
            let readers: Vec<_> = (0..readers)
                .map(|r| {
                    let (t, done, probes, answers) = (&t, &done, &probes, &answers);
                    s.spawn(move || {
                        let mut lookups = 0u64;
                        let mut i = r;
                        // Odd readers look up as a PPE thread does, through a cache.
                        let mut cache = (r % 2 == 1).then(TcamCache::new);
                        // Keep reading until the writer is done, and at least a few rounds.
                        while !done.load(Ordering::Acquire) || lookups < 64 {
                            assert!(Instant::now() < deadline, "reader {r} ran out of time");
                            let p = i % probes.len();
                            let got = match &mut cache {
                                Some(c) => c.lookup(t, probes[p]),
                                None => t.lookup(probes[p]),
                            };
                            let which = answers[p].iter().position(|w| *w == got);
                            assert!(
                                which.is_some(),
                                "key {} gave {got:?}, which neither table gives ({:?})",
                                probes[p],
                                answers[p]
                            );
                            lookups += 1;
                            i += 1;
                        }
                        lookups
                    })
                })
                .collect();
            for round in 0..replacements {
                assert!(Instant::now() < deadline, "writer ran out of time");
                let next = if round % 2 == 0 { &b } else { &a };
                assert_eq!(t.replace(next.clone()), Ok(round as u64 + 2));
            }
            done.store(true, Ordering::Release);
            for r in readers {
                let lookups = r.join().expect("reader panicked");
                assert!(lookups >= 64);
            }
        });
        assert_eq!(t.version(), replacements as u64 + 1);
    }
}

/// Loom models of the published version ([`TcamCache`]'s fast path), on the real code with
/// `crate::sync` backed by loom (see `src/pfe/loom_tests.rs` for how to run them):
///
/// ```text
/// RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom_tests
/// ```
///
/// They can fail: with [`Tcam::replace`] publishing its version after releasing the write
/// lock (not under it), two replacements can publish out of order, a cache keeps the older
/// table for good, and `racing_replacements_leave_the_cache_on_the_last_table` fails; a
/// cache that answers from its slot without comparing versions fails both. What the models
/// also show: the version's orderings are not what keeps a lookup current, since a cache
/// takes a table only through the lock (publishing before the swap, under the lock, or
/// reading the version `Relaxed` passes both models).
#[cfg(all(test, loom))]
mod loom_tests {
    use loom::sync::atomic::{AtomicBool, Ordering};
    use loom::sync::Arc;
    use loom::thread;

    use super::{MatchMode, Tcam, TcamCache, TcamEntry};

    /// A table whose one entry answers every key with `result`.
    fn all(result: u64) -> Vec<TcamEntry> {
        vec![TcamEntry {
            value: 0,
            mask: 0,
            priority: 0,
            result,
        }]
    }

    fn result(cache: &mut TcamCache, tcam: &Tcam) -> u64 {
        cache.lookup(tcam, 7).expect("every table matches").result
    }

    /// A lookup through a cache that holds the old table, made after the replacement is
    /// known to have returned (through a flag: the ordering a control plane's reply gives),
    /// answers from the new table; before that, from either, never going back.
    #[test]
    fn a_lookup_after_a_replacement_uses_the_new_table() {
        loom::model(|| {
            let tcam = Arc::new(Tcam::new(4, MatchMode::HighestPriority).unwrap());
            tcam.replace(all(1)).unwrap();
            let replaced = Arc::new(AtomicBool::new(false));
            let control = {
                let (tcam, replaced) = (Arc::clone(&tcam), Arc::clone(&replaced));
                thread::spawn(move || {
                    tcam.replace(all(2)).unwrap();
                    replaced.store(true, Ordering::Release);
                })
            };
            let mut cache = TcamCache::new();
            let first = result(&mut cache, &tcam);
            let known = replaced.load(Ordering::Acquire);
            let second = result(&mut cache, &tcam);
            assert!(second >= first, "a lookup went back to the old table");
            if known {
                assert_eq!(
                    second, 2,
                    "a lookup after the replacement used the old table"
                );
            }
            control.join().unwrap();
            assert_eq!(result(&mut cache, &tcam), 2);
        });
    }

    /// Two replacements race while a thread looks up through its cache: once both have
    /// returned, the cache answers from the table current then (the later version), as an
    /// uncached lookup does.
    #[test]
    fn racing_replacements_leave_the_cache_on_the_last_table() {
        loom::model(|| {
            let tcam = Arc::new(Tcam::new(4, MatchMode::HighestPriority).unwrap());
            let replacers: Vec<_> = [2, 3]
                .into_iter()
                .map(|r| {
                    let tcam = Arc::clone(&tcam);
                    thread::spawn(move || {
                        tcam.replace(all(r)).unwrap();
                    })
                })
                .collect();
            let mut cache = TcamCache::new();
            let _ = cache.lookup(&tcam, 7);
            for r in replacers {
                r.join().unwrap();
            }
            let current = tcam.lookup(7).expect("a table is in").result;
            assert_eq!(tcam.version(), 2);
            assert_eq!(
                result(&mut cache, &tcam),
                current,
                "the cache kept an older table"
            );
        });
    }
}
