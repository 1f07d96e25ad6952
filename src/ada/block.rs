//! ADA as a block of the PFE: calculation tables and monitoring bins in ternary match
//! blocks ([`Tcam`]) that programs look up as XTXNs, and ADA's controller run by a timer
//! entry of the program, as Trio runs control work in its own threads, with no external
//! control plane.
//!
//! ```text
//! packet thread   operand --tcam_lookup--> monitoring bins      (the bin's hit counter +1)
//!                 operand --tcam_lookup--> calculation table --> f(operand)
//!                 (a * b, a / b: two log lookups, their sum --tcam_lookup--> antilog)
//!
//! timer thread    every period, Ada::epoch:
//!  (controller)   1. tcam_read the bins' hit counters                  (reads: one per bin)
//!                 2. Algorithm 3: entries in proportion to the hits; tcam_write the
//!                    calculation table if it changed              (writes: one per entry)
//!                 3. Algorithm 2: split, merge or grow the bins; tcam_write the bins,
//!                    which also zeroes their counters              (writes: one per bin)
//! ```
//!
//! The same [`Ada::epoch`] runs from the control side ([`ControlPlane`]) or from a timer
//! thread (a [`Thread`], whose XTXN counts then show the controller's reads and writes in
//! the engine's stats); [`add_controller`] adds the timer entry to a program. Either way
//! the [`AdaStats`] count epochs, re-populations, trie changes, reads and writes: the
//! paper's control-plane overhead (Table II).
//!
//! Tables are replaced whole ([`Tcam::replace`]): a lookup sees the old table or the new,
//! never a mix, and the emulation counts a replacement as one write per entry (a controller
//! that rewrote only the changed entries would write fewer).
//!
//! Choice: hits that land on the old monitoring table between the controller's read and its
//! replacement are lost to the statistics (a few per epoch at most), as register updates
//! racing a read-and-reset on a switch are.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::arith::{
    antilog_table, antilog_table_len, table_of, Op, ANTILOG_BITS, DIV_OFFSET, OPERAND_BITS,
};
use super::trie::{
    uniform_population, uniform_population_len, Bin, BinningTrie, TernaryEntry, Update,
};
use super::AdaError;
use crate::error::ConfigError;
use crate::mem::tcam::{MatchMode, Tcam, TcamEntry, TcamError, MAX_TCAM_ENTRIES};
use crate::program::{Done, Entry, Fault, FaultDetail, ProgramBuilder, Thread, Verdict};
use crate::timer::TimerSpec;

/// How a controller reads hit counters and writes tables: directly ([`ControlPlane`]) or as
/// the XTXNs of a thread ([`Thread::tcam_hits`], [`Thread::tcam_replace`]).
pub trait TableAccess {
    /// The current table's version and hit counters.
    fn read_hits(&mut self, tcam: &Tcam) -> (u64, Vec<u64>);
    /// Installs a whole table; its version.
    fn write_table(&mut self, tcam: &Tcam, entries: Vec<TcamEntry>) -> Result<u64, TcamError>;
}

/// The control side: reads and writes the blocks directly, counted only in [`AdaStats`].
#[derive(Clone, Copy, Debug, Default)]
pub struct ControlPlane;

impl TableAccess for ControlPlane {
    fn read_hits(&mut self, tcam: &Tcam) -> (u64, Vec<u64>) {
        tcam.hits()
    }

    fn write_table(&mut self, tcam: &Tcam, entries: Vec<TcamEntry>) -> Result<u64, TcamError> {
        tcam.replace(entries)
    }
}

impl TableAccess for Thread<'_> {
    fn read_hits(&mut self, tcam: &Tcam) -> (u64, Vec<u64>) {
        self.tcam_hits(tcam)
    }

    fn write_table(&mut self, tcam: &Tcam, entries: Vec<TcamEntry>) -> Result<u64, TcamError> {
        self.tcam_replace(tcam, entries)
    }
}

/// A one-operand calculation table in a ternary match block: a 32-bit operand to `op`'s
/// operand result ([`Op::Square`]: the square; [`Op::Sqrt`], [`Op::Log2`]: fixed point
/// with [`FRAC_BITS`](super::arith::FRAC_BITS) fraction bits; [`Op::Mul`], [`Op::Div`]: the
/// operand's log2 in the same fixed point, for an [`AntilogTable`]).
#[derive(Debug)]
pub struct LookupTable {
    op: Op,
    tcam: Tcam,
}

impl LookupTable {
    /// An empty table of `op` holding up to `capacity` entries.
    pub fn new(op: Op, capacity: usize) -> Result<LookupTable, TcamError> {
        Ok(LookupTable {
            op,
            tcam: Tcam::new(capacity, MatchMode::LongestPrefix)?,
        })
    }

    /// The prior work's uniform population with `s` significant bits, installed: exactly
    /// `2^s (33 - s)` entries (all 2^32 operands exact at `s = 32`, too many for a block).
    ///
    /// # Errors
    ///
    /// [`AdaError::SignificantBits`] for `s` above 32, and
    /// [`AdaError::Tcam`]`(`[`TcamError::BadCapacity`]`)` when the population
    /// ([`uniform_population_len`]`(32, s)` entries) would not fit a block, more than
    /// [`MAX_TCAM_ENTRIES`] (`s` above 11): counted, so refused before it is built.
    pub fn uniform(op: Op, s: u32) -> Result<LookupTable, AdaError> {
        if s > OPERAND_BITS {
            return Err(AdaError::SignificantBits(s));
        }
        // The block refuses a capacity above MAX_TCAM_ENTRIES: ask for it before building
        // the population (2^32 entries at s = 32).
        let len = uniform_population_len(OPERAND_BITS, s);
        let capacity = usize::try_from(len).unwrap_or(usize::MAX).max(1);
        let table = LookupTable::new(op, capacity).map_err(AdaError::Tcam)?;
        let entries = uniform_population(OPERAND_BITS, s);
        table.install(&mut ControlPlane, &entries)?;
        Ok(table)
    }

    /// Installs `entries` (disjoint, covering the operands, as the populations give them)
    /// with `op`'s result for each entry's representative; the new version.
    pub fn install(
        &self,
        io: &mut impl TableAccess,
        entries: &[TernaryEntry],
    ) -> Result<u64, AdaError> {
        let table = table_of(entries, |x| self.op.operand_result(x));
        io.write_table(
            &self.tcam,
            table.iter().map(|e| e.tcam_entry(OPERAND_BITS)).collect(),
        )
        .map_err(AdaError::Tcam)
    }

    /// The result for `x`, looked up as an XTXN of `t`; `None` if no entry covers `x`.
    #[inline]
    pub fn lookup(&self, t: &mut Thread<'_>, x: u32) -> Option<u64> {
        t.tcam_lookup(&self.tcam, x).map(|h| h.result)
    }

    /// The result for `x`, looked up from the control side (the hit is counted too).
    pub fn get(&self, x: u32) -> Option<u64> {
        self.tcam.lookup(x).map(|h| h.result)
    }

    /// The operation whose operand results the table holds.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The ternary match block.
    pub fn tcam(&self) -> &Tcam {
        &self.tcam
    }
}

/// The antilog table of a two-operand operation (the paper's \[12\]): a sum (for
/// [`Op::Mul`]) or difference (for [`Op::Div`]) of two operands' fixed-point logs to the
/// product, or to the quotient in fixed point. Uniformly populated, fixed: it does not
/// depend on the operands' distribution.
#[derive(Debug)]
pub struct AntilogTable {
    op: Op,
    tcam: Tcam,
}

impl AntilogTable {
    /// The antilog table of `op` for operand tables of `s` significant bits
    /// ([`antilog_table`]).
    ///
    /// # Errors
    ///
    /// [`AdaError::NotBinary`] for a one-operand `op`, [`AdaError::SignificantBits`] for
    /// `s` above 32, and [`AdaError::Tcam`]`(`[`TcamError::BadCapacity`]`)` when the table
    /// ([`antilog_table_len`] entries) would not fit a block, more than
    /// [`MAX_TCAM_ENTRIES`] (`s` above 6): counted, so refused before it is built.
    pub fn new(op: Op, s: u32) -> Result<AntilogTable, AdaError> {
        if !op.is_binary() {
            return Err(AdaError::NotBinary(op));
        }
        if s > OPERAND_BITS {
            return Err(AdaError::SignificantBits(s));
        }
        let len = usize::try_from(antilog_table_len(op, s)).unwrap_or(usize::MAX);
        let tcam = Tcam::new(len, MatchMode::LongestPrefix).map_err(AdaError::Tcam)?;
        let entries: Vec<TcamEntry> = antilog_table(op, s)
            .iter()
            .map(|e| e.tcam_entry(ANTILOG_BITS))
            .collect();
        tcam.replace(entries).map_err(AdaError::Tcam)?;
        Ok(AntilogTable { op, tcam })
    }

    /// `a * b` from `log_a` and `log_b` (each an [`Op::Mul`] [`LookupTable`]'s result) as an
    /// XTXN of `t`, rounded to an integer. Zero operands have no log: the program handles
    /// them before the lookups (`0 * b = 0`). `None` for a [`Op::Div`] table, or logs whose
    /// sum is beyond the table's keys (no table's logs are).
    #[inline]
    pub fn product(&self, t: &mut Thread<'_>, log_a: u64, log_b: u64) -> Option<u64> {
        if self.op != Op::Mul {
            return None;
        }
        t.tcam_lookup(&self.tcam, u32::try_from(log_a.checked_add(log_b)?).ok()?)
            .map(|h| h.result)
    }

    /// `a / b` in fixed point from `log_a` and `log_b` (each an [`Op::Div`]
    /// [`LookupTable`]'s result) as an XTXN of `t`. `None` for a [`Op::Mul`] table, a
    /// quotient below the table's smallest (`a / b < 2^-32`), or logs beyond the table's
    /// keys.
    #[inline]
    pub fn quotient(&self, t: &mut Thread<'_>, log_a: u64, log_b: u64) -> Option<u64> {
        if self.op != Op::Div {
            return None;
        }
        let key = log_a.checked_add(DIV_OFFSET)?.checked_sub(log_b)?;
        t.tcam_lookup(&self.tcam, u32::try_from(key).ok()?)
            .map(|h| h.result)
    }

    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }

    /// The ternary match block.
    pub fn tcam(&self) -> &Tcam {
        &self.tcam
    }
}

/// The settings of one [`Ada`] operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdaConfig {
    /// What the calculation table computes of the operand.
    pub op: Op,
    /// Algorithm 1's `M`: the monitoring entries to start with (`2^floor(log2 M)` bins), at
    /// least 2 (one bin never adapts, [`BinningTrie::update`]).
    pub monitor_entries: u64,
    /// The monitoring block's capacity: the trie grows to at most this many bins.
    pub max_monitor_entries: usize,
    /// The calculation table's entry budget (Algorithm 3's `M`).
    pub table_entries: usize,
    /// Algorithm 2's `th_balance`: rebalance when `(max - min) / max` reaches it (0 to 1).
    pub th_balance: f64,
    /// Algorithm 2's `th_expansion`: grow the monitoring when the trie deepened by this many
    /// levels since it last grew (0: never grow), at most 32 (the operands' width).
    pub th_expansion: u32,
}

impl AdaConfig {
    /// The paper's Nimble experiment (§V.B): 8 monitoring entries growing to 12, 128
    /// calculation entries, `th_balance` 20%, `th_expansion` 2.
    pub fn new(op: Op) -> AdaConfig {
        AdaConfig {
            op,
            monitor_entries: 8,
            max_monitor_entries: 12,
            table_entries: 128,
            th_balance: 0.2,
            th_expansion: 2,
        }
    }

    /// Checks the settings, naming the one at fault.
    pub fn check(&self) -> Result<(), ConfigError> {
        let max = self.max_monitor_entries as u64;
        if max < 2 {
            return Err(ConfigError::new(
                "max_monitor_entries",
                format!(
                    "{max}: must be at least 2 (the monitor starts with at least two bins: \
                     see monitor_entries)"
                ),
            ));
        }
        if self.monitor_entries < 2 || self.monitor_entries > max {
            return Err(ConfigError::new(
                "monitor_entries",
                format!(
                    "{}: must be from 2 to max_monitor_entries ({max}) (one entry is one bin \
                     over every operand, which Algorithm 2 never splits: it has no sibling \
                     to balance against)",
                    self.monitor_entries
                ),
            ));
        }
        if self.max_monitor_entries > MAX_TCAM_ENTRIES {
            return Err(ConfigError::new(
                "max_monitor_entries",
                format!(
                    "{}: at most {MAX_TCAM_ENTRIES} (a ternary match block's largest)",
                    self.max_monitor_entries
                ),
            ));
        }
        if self.table_entries < self.max_monitor_entries || self.table_entries > MAX_TCAM_ENTRIES {
            return Err(ConfigError::new(
                "table_entries",
                format!(
                    "{}: must be from max_monitor_entries ({}) to {MAX_TCAM_ENTRIES} (every bin \
                     needs an entry)",
                    self.table_entries, self.max_monitor_entries
                ),
            ));
        }
        if self.th_expansion > OPERAND_BITS {
            return Err(ConfigError::new(
                "th_expansion",
                format!(
                    "{}: at most {OPERAND_BITS} levels, the trie's deepest (0: never grow)",
                    self.th_expansion
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.th_balance) {
            return Err(ConfigError::new(
                "th_balance",
                format!("{}: must be from 0 to 1", self.th_balance),
            ));
        }
        Ok(())
    }
}

/// What an [`Ada`]'s controller has done since it was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct AdaStats {
    /// Epochs run ([`Ada::epoch`]).
    pub epochs: u64,
    /// Epochs that found no hits and changed nothing.
    pub idle_epochs: u64,
    /// Calculation tables installed (the first one included).
    pub repopulations: u64,
    /// Epochs in which Algorithm 2 split one bin and merged two.
    pub rebalances: u64,
    /// Epochs in which Algorithm 2 grew the monitoring by a bin.
    pub expansions: u64,
    /// Hit counters read.
    pub reads: u64,
    /// Entries written: calculation tables, and monitoring bins (each write also zeroes the
    /// bin's counter).
    pub writes: u64,
    /// Monitoring bins now.
    pub bins: u64,
    /// Calculation entries now.
    pub table_entries: u64,
    /// Epochs skipped because the controller is frozen ([`Ada::freeze`]).
    pub frozen_epochs: u64,
}

/// What one [`Ada::epoch`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// Operands counted by the monitoring since the last epoch (saturating at `u64::MAX`).
    pub hits: u64,
    /// Whether the calculation table was re-populated.
    pub repopulated: bool,
    /// What Algorithm 2 did to the bins.
    pub update: Update,
    /// Hit counters read.
    pub reads: u64,
    /// Entries written.
    pub writes: u64,
}

/// The controller's own state, changed by one epoch at a time.
#[derive(Debug)]
struct State {
    trie: BinningTrie,
    /// The monitoring table's version the trie's bins were last written as.
    monitor_version: u64,
    /// The calculation entries installed now.
    installed: Vec<TernaryEntry>,
}

#[derive(Debug, Default)]
struct Counters {
    epochs: AtomicU64,
    idle_epochs: AtomicU64,
    repopulations: AtomicU64,
    rebalances: AtomicU64,
    expansions: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    frozen_epochs: AtomicU64,
}

/// One operand under ADA: its monitoring bins and its calculation table, each in a ternary
/// match block, and the controller that keeps the table where the operand falls (module
/// doc). Share it with an `Arc` between the program's packet instructions
/// ([`Ada::lookup`]) and its timer entry ([`add_controller`]).
#[derive(Debug)]
pub struct Ada {
    cfg: AdaConfig,
    monitor: Tcam,
    table: LookupTable,
    state: Mutex<State>,
    counters: Counters,
    frozen: AtomicBool,
}

impl Ada {
    /// Algorithm 1's equal bins in the monitoring block, and a calculation table that gives
    /// every bin an equal share of the budget (Algorithm 3 with no hits yet).
    pub fn new(cfg: AdaConfig) -> Result<Ada, AdaError> {
        cfg.check().map_err(AdaError::Config)?;
        let trie = BinningTrie::new(cfg.monitor_entries, OPERAND_BITS)?
            .with_max_entries(cfg.max_monitor_entries)?;
        let ada = Ada {
            cfg,
            monitor: Tcam::new(cfg.max_monitor_entries, MatchMode::LongestPrefix)
                .map_err(AdaError::Tcam)?,
            table: LookupTable::new(cfg.op, cfg.table_entries).map_err(AdaError::Tcam)?,
            state: Mutex::new(State {
                trie,
                monitor_version: 0,
                installed: Vec::new(),
            }),
            counters: Counters::default(),
            frozen: AtomicBool::new(false),
        };
        {
            let mut st = ada.state.lock();
            let io = &mut ControlPlane;
            ada.write_bins(io, &mut st)?;
            ada.repopulate(io, &mut st)?;
        }
        Ok(ada)
    }

    /// `x` through the monitoring (its bin's counter) and the calculation table: two
    /// lookup XTXNs of `t`. The table's result, or `None` if no entry covers `x` (never, for
    /// the tables ADA installs).
    #[inline]
    pub fn lookup(&self, t: &mut Thread<'_>, x: u32) -> Option<u64> {
        t.tcam_lookup(&self.monitor, x);
        self.table.lookup(t, x)
    }

    /// Counts `x` in the monitoring only (one XTXN): for an operand that is monitored in a
    /// packet that does not compute with it.
    #[inline]
    pub fn observe(&self, t: &mut Thread<'_>, x: u32) {
        t.tcam_lookup(&self.monitor, x);
    }

    /// [`Ada::lookup`] from the control side.
    pub fn get(&self, x: u32) -> Option<u64> {
        self.monitor.lookup(x);
        self.table.get(x)
    }

    /// One epoch of the controller (module doc): read the bins' hits, re-populate the
    /// calculation table in proportion to them (Algorithm 3) if that changes it, then adapt
    /// the bins (Algorithm 2) and write them back with zeroed counters. An epoch with no
    /// hits changes nothing. Epochs are serialised: one that starts while another runs
    /// waits for it.
    pub fn epoch(&self, io: &mut impl TableAccess) -> Result<Epoch, AdaError> {
        let mut st = self.state.lock();
        self.counters.epochs.fetch_add(1, Ordering::Relaxed);
        let idle = Epoch {
            hits: 0,
            repopulated: false,
            update: Update::Unchanged,
            reads: 0,
            writes: 0,
        };
        if self.frozen.load(Ordering::Relaxed) {
            self.counters.frozen_epochs.fetch_add(1, Ordering::Relaxed);
            return Ok(idle);
        }
        let (version, hits) = io.read_hits(&self.monitor);
        let reads = hits.len() as u64;
        self.counters.reads.fetch_add(reads, Ordering::Relaxed);
        if version != st.monitor_version {
            // Someone else wrote the bins: their counters do not describe this trie's bins,
            // so this epoch only puts the trie's bins back.
            let writes = self.write_bins(io, &mut st)?;
            return Ok(Epoch {
                reads,
                writes,
                ..idle
            });
        }
        st.trie.set_hits(&hits)?;
        // Counters read from outside may be anything: saturate rather than overflow.
        let total = hits.iter().fold(0u64, |sum, &h| sum.saturating_add(h));
        if total == 0 {
            self.counters.idle_epochs.fetch_add(1, Ordering::Relaxed);
            return Ok(Epoch { reads, ..idle });
        }
        let mut writes = self.repopulate(io, &mut st)?;
        let repopulated = writes > 0;
        let update = st.trie.update(self.cfg.th_balance, self.cfg.th_expansion);
        match update {
            Update::Rebalanced { .. } => self.counters.rebalances.fetch_add(1, Ordering::Relaxed),
            Update::Expanded { .. } => self.counters.expansions.fetch_add(1, Ordering::Relaxed),
            Update::Unchanged => 0,
        };
        writes += self.write_bins(io, &mut st)?;
        Ok(Epoch {
            hits: total,
            repopulated,
            update,
            reads,
            writes,
        })
    }

    /// Runs the monitoring on `operands` from the control side and then an epoch, `epochs`
    /// times: the control plane populating the table for operands it knows (Nimble's
    /// controller, given the rate it set).
    pub fn prime(&self, operands: &[u32], epochs: u32) -> Result<(), AdaError> {
        for _ in 0..epochs {
            for &x in operands {
                self.monitor.lookup(x);
            }
            self.epoch(&mut ControlPlane)?;
        }
        Ok(())
    }

    /// Stops adapting: later epochs read and write nothing (counted as frozen), so the
    /// calculation table stays as it is, as a table the control plane never updates.
    pub fn freeze(&self) {
        self.frozen.store(true, Ordering::Relaxed);
    }

    /// Algorithm 3 on the trie's current hits: installs the table if it differs from the
    /// installed one; the entries written.
    fn repopulate(&self, io: &mut impl TableAccess, st: &mut State) -> Result<u64, AdaError> {
        let entries = st.trie.populate(self.cfg.table_entries as u64)?;
        if entries == st.installed {
            return Ok(0);
        }
        self.table.install(io, &entries)?;
        let n = entries.len() as u64;
        st.installed = entries;
        self.counters.repopulations.fetch_add(1, Ordering::Relaxed);
        self.counters.writes.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// Writes the trie's bins to the monitoring block (counters zeroed); the entries written.
    fn write_bins(&self, io: &mut impl TableAccess, st: &mut State) -> Result<u64, AdaError> {
        let bins: Vec<TcamEntry> = (st.trie.leaves().iter().enumerate())
            .map(|(i, b)| TcamEntry {
                value: b.value() as u32,
                mask: b.mask() as u32,
                priority: 0,
                result: i as u64,
            })
            .collect();
        let n = bins.len() as u64;
        st.monitor_version = io
            .write_table(&self.monitor, bins)
            .map_err(AdaError::Tcam)?;
        self.counters.writes.fetch_add(n, Ordering::Relaxed);
        Ok(n)
    }

    /// The counters (module doc).
    pub fn stats(&self) -> AdaStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let st = self.state.lock();
        AdaStats {
            epochs: get(&c.epochs),
            idle_epochs: get(&c.idle_epochs),
            repopulations: get(&c.repopulations),
            rebalances: get(&c.rebalances),
            expansions: get(&c.expansions),
            reads: get(&c.reads),
            writes: get(&c.writes),
            bins: st.trie.entries() as u64,
            table_entries: st.installed.len() as u64,
            frozen_epochs: get(&c.frozen_epochs),
        }
    }

    /// The monitoring bins now (their hits are those of the last epoch's end: zero).
    pub fn bins(&self) -> Vec<Bin> {
        self.state.lock().trie.leaves().to_vec()
    }

    /// The calculation entries installed now, in operand order.
    pub fn entries(&self) -> Vec<TernaryEntry> {
        self.state.lock().installed.clone()
    }

    /// The settings.
    pub fn config(&self) -> &AdaConfig {
        &self.cfg
    }

    /// The monitoring block (one entry per bin; a bin's result is its index).
    pub fn monitor(&self) -> &Tcam {
        &self.monitor
    }

    /// The calculation table.
    pub fn table(&self) -> &LookupTable {
        &self.table
    }
}

/// Adds ADA's controller to a program: at `Entry::Timer(entry)`, an instruction `ada_epoch`
/// runs one [`Ada::epoch`] of each of `adas` in turn as XTXNs of the timer thread, then
/// ends the thread. Launch it with [`controller_timer`]. An epoch that fails (a table the
/// block refuses) faults the timer thread with the block's error; the tables stay as they
/// were.
pub fn add_controller(p: &mut ProgramBuilder, entry: u16, adas: Vec<Arc<Ada>>) {
    let label = p.label("ada_epoch");
    p.instr(label, move |t| {
        for ada in &adas {
            ada.epoch(t).map_err(|e| match e {
                AdaError::Tcam(e) => Fault::from(e),
                // The configuration check rules the others out (every table fits its
                // block, every bin gets an entry); were one to happen, it ends the thread
                // as a panic would, counted and named.
                other => FaultDetail::Panic(format!("ADA's controller: {other}")).into(),
            })?;
        }
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Timer(entry), label);
}

/// The timer that launches [`add_controller`]'s entry every `period_ns`, first at
/// `period_ns`.
pub fn controller_timer(entry: u16, period_ns: u64) -> Result<TimerSpec, ConfigError> {
    let mut specs = TimerSpec::staggered(entry, 1, period_ns, period_ns)?;
    Ok(specs.remove(0))
}
