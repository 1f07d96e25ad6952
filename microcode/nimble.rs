//! A Nimble-style rate limiter (Thapeta et al., SOSR 2021; the ADA paper's \[10\] and its
//! §V.B.1): a token bucket per traffic class whose refill, the class's rate times the time
//! since its last packet, is a multiplication the data plane cannot do natively, so it is
//! computed by ternary lookups, with the rate's table populated by ADA.
//!
//! ```text
//! classify --class ok--> refill: dt = now - fetch_max(last, now)         (1 fetch_max)
//!    |                           credit = R * dt by lookup:
//!    |                             log2 R   rate table   (ADA: + monitoring)  (1-2 lookups)
//!    |                             log2 dt  uniform table                       (1 lookup)
//!    |                             2^(sum - C)  antilog table                   (1 lookup)
//!    |                      --> bucket: tokens += credit                      (1 fetch_add)
//!    |                      --> take: over the depth? give back the excess,    (1-2 fetch_add)
//!    |                             at most this packet's credit
//!    |                             enough for the packet? --> admit --> Forward(out_port)
//!    |                                                   \--> Drop(rate_exceeded)
//!    \--> Drop(no_class)
//! timer entry 0 (ADA only): the controller's epoch (ada::block::add_controller)
//! ```
//!
//! # Classes and their records
//!
//! A packet's class is the port it arrived on (`0..classes`; any other port is dropped as
//! `no_class`). Each class has a [`ClassRecord`] of [`CLASS_WORDS`] words in SRAM
//! ([`STATE_REGION`]): its rate ([`Nimble::set_rate`] writes it while traffic flows), its
//! bucket's depth, the rate's log as the control plane last set it (static only), the last
//! packet's arrival, the tokens, and a packet/byte counter of what it admitted.
//!
//! # The multiplication
//!
//! The refill in tokens is `R * dt * 2^10 / 10^9` (R in bytes per second, dt in ns). By
//! logarithms, as the paper's \[12\]: `log2 R + log2 dt - C` with `C = log2 10^9 - 10`, then
//! an antilog lookup. The rate's table is keyed by the rate itself below 2^32 bytes per
//! second (34 Gbit/s), and above by `R >> k` for the least `k` up to [`RATE_SHIFT`] that
//! fits a 32-bit key (rates up to 2^34 bytes per second, 137 Gbit/s), its log put back by
//! adding `k`. [`Arithmetic`] says how the rate's table is populated:
//!
//! - [`Arithmetic::Exact`]: no table; a native multiplication (the ideal).
//! - [`Arithmetic::Uniform`]: the prior work's uniform population.
//! - [`Arithmetic::Static`]: Nimble's own design, which the paper's Figure 8 runs "without
//!   a TCAM update from the control plane": the control plane bakes the rate into the
//!   multiplication when it sets it ([`Nimble::configure_rate`], and at install; here as
//!   the rate's log in the class record), so a rate changed any other way (from the data
//!   plane, or by [`Nimble::set_rate`]) is not seen, and the bucket keeps the old rate.
//! - [`Arithmetic::Ada`]: ADA's population, primed by the control plane on the configured
//!   rates, then kept where the rates are: every packet counts its rate in the monitoring
//!   bins, and the controller (a timer entry of the program, every `controller_period_ns`)
//!   re-populates the table.
//!
//! The time since the last packet is looked up in a uniform table with
//! `dt_significant_bits` significant bits, or, with `dt_ada`, in a table ADA keeps where
//! the times fall (the paper's ADA(ΔT); both: ADA(ΔT, R)), monitored and re-populated by
//! the same controller. The time's key is 32 bits too: a time of 2^32 ns (4.3 s) or more is
//! looked up shifted right until it fits and its log put back by adding the shift, as the
//! rate's, so an idle time of any length is refilled in full (up to the bucket's depth).
//! The antilog table is uniform and fixed.
//!
//! # Concurrency
//!
//! Every step is one read-modify-write XTXN on the class record, so no update is lost, but
//! the steps of two packets of a class may interleave: two packets may both find enough
//! tokens for themselves when there was enough for one, so the bucket overdraws by at most
//! a packet per thread in flight. The refill is clamped to the bucket's depth without
//! losing tokens: a packet whose credit took the bucket over its depth gives back the
//! excess it saw, but never more than its own credit, since the excess it saw may include
//! another packet's credit that packet gives back itself (giving back all of it, two
//! packets refilling at once after an idle time emptied a full bucket). Whatever the
//! interleaving, the refills leave the bucket where they leave it one after the other.
//! The class's clock is kept with a fetch-and-max: the engine reads its clock once per
//! batch, so packets of a class from two batches carry different times, and one from the
//! older batch must neither refill nor take the clock back (with a swap, the next packet
//! of the newer batch would refill the time between the two batches again: measured, up
//! to 77% past the rate on two cores). So every nanosecond is refilled once. Under the
//! [`Harness`](pfemu::program::Harness), one packet at a time, the bucket is exact up to
//! the multiplication.

use std::fmt;
use std::sync::Arc;

use pfemu::ada::arith::{antilog_table_len, Op};
use pfemu::ada::block::{
    add_controller, controller_timer, Ada, AdaConfig, AdaStats, AntilogTable, LookupTable,
};
use pfemu::ada::AdaError;
use pfemu::mem::tcam::MAX_TCAM_ENTRIES;
use pfemu::mem::{Addr, AllocError, MemFault, Op as MemOp, Region, SharedMemory};
use pfemu::packet::Port;
use pfemu::prelude::*;
use pfemu::timer::TimerSpec;

/// Name of the class records' region in the shared-memory allocator.
pub const STATE_REGION: &str = "nimble.classes";
pfemu::header! {
    /// A class's record in shared memory (all words are read and written as XTXNs).
    pub struct ClassRecord {
        /// The rate, bytes per second.
        rate: 64,
        /// The bucket's depth, bytes.
        burst: 64,
        /// log2 of the rate as the control plane last set it, `2^16` fixed point (read by
        /// the static arithmetic only).
        rate_log: 64,
        /// The last packet's arrival, engine nanoseconds (only ever raised).
        last: 64,
        /// The tokens, in 1/1024 byte ([`TOKEN_FRAC_BITS`]), a two's-complement `i64`.
        tokens: 64,
        /// Admitted packets, then bytes: a packet/byte counter.
        admitted: [64; 2],
    }
}

/// Words of one class's record.
pub const CLASS_WORDS: u64 = CLASS_RECORD_LEN as u64 / 8;
/// Fraction bits of the tokens: a token is 1/1024 byte.
pub const TOKEN_FRAC_BITS: u32 = 10;
/// The most the rate is shifted right to fit its 32-bit lookup key (R in bytes per
/// second): rates up to `2^(32 + RATE_SHIFT)` B/s fit.
pub const RATE_SHIFT: u32 = 2;
/// The fastest rate a class may have: the largest that fits the rate's key, in bits per
/// second (about 137 Gbit/s).
pub const MAX_RATE_BPS: u64 = ((u32::MAX as u64) << RATE_SHIFT) * 8;
/// The most significant bits an antilog table fits a ternary match block with
/// ([`antilog_table_len`] at most [`MAX_TCAM_ENTRIES`]: 49,152 entries at 6, 90,112 at 7).
pub const MAX_ANTILOG_SIGNIFICANT_BITS: u32 = 6;
/// Most classes.
pub const MAX_CLASSES: usize = 4096;
/// The timer entry the controller runs at.
pub const CONTROLLER_ENTRY: u16 = 0;

const W_RATE: u64 = ClassRecordLayout::RATE.word();
const W_RATE_LOG: u64 = ClassRecordLayout::RATE_LOG.word();
const W_BURST: u64 = ClassRecordLayout::BURST.word();
const W_LAST: u64 = ClassRecordLayout::LAST.word();
const W_TOKENS: u64 = ClassRecordLayout::TOKENS.word();
const W_ADMITTED: u64 = ClassRecordLayout::ADMITTED.first.word();

/// `C` of the module doc, `(log2 10^9 - 10) * 2^16`, rounded: subtracted from a log sum
/// to turn bytes per second times nanoseconds into tokens.
const LOG_SCALE: u64 = 1_303_993;

/// Local memory the class's record is read into (below the packet head).
const SCRATCH_LM: usize = 0;

/// How the limiter multiplies a rate by a time (module doc).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arithmetic {
    /// A native multiplication.
    Exact,
    /// The rate's log table by the prior work's uniform population with this many
    /// significant bits (`2^s (33 - s)` entries: 124 for `s = 2`).
    Uniform {
        /// Significant bits.
        significant_bits: u32,
    },
    /// The rate baked in by the control plane (Nimble's design, module doc).
    Static,
    /// ADA's population, kept where the rates are by the controller. The table holds the
    /// rates' logs, so its `op` is taken as [`Op::Mul`] whatever it says.
    Ada(AdaConfig),
}

impl Arithmetic {
    /// The name the CLI and reports use: `exact`, `uniform`, `static`, `ada`.
    pub fn name(&self) -> &'static str {
        match self {
            Arithmetic::Exact => "exact",
            Arithmetic::Uniform { .. } => "uniform",
            Arithmetic::Static => "static",
            Arithmetic::Ada(_) => "ada",
        }
    }
}

/// The limiter's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct NimbleConfig {
    /// Each class's rate in bits per second; class `i` is port `i`.
    pub rates_bps: Vec<u64>,
    /// The bucket's depth, bytes (the burst a class may send at once).
    pub burst_bytes: u64,
    /// How the refill is multiplied.
    pub arithmetic: Arithmetic,
    /// Significant bits of the uniform log table of the time since the last packet.
    pub dt_significant_bits: u32,
    /// ADA on the time since the last packet too (not with [`Arithmetic::Exact`], which
    /// multiplies natively; its `op` is taken as [`Op::Mul`], as the rate's); `None`: the
    /// uniform table of `dt_significant_bits`.
    pub dt_ada: Option<AdaConfig>,
    /// Significant bits the antilog table is built for ([`AntilogTable::new`]), at most
    /// [`MAX_ANTILOG_SIGNIFICANT_BITS`] (the table must fit a ternary match block).
    pub antilog_significant_bits: u32,
    /// Where admitted packets go.
    pub out_port: Port,
    /// How often ADA's controller runs (ADA only), nanoseconds.
    pub controller_period_ns: u64,
    /// Epochs of control-plane priming of ADA's table on the configured rates.
    pub prime_epochs: u32,
}

impl Default for NimbleConfig {
    /// One class at 24 Gbit/s (the paper's Figure 8), a 64 KB bucket, ADA with the paper's
    /// 128 calculation and 8 to 12 monitoring entries, 6-bit time and antilog tables, the
    /// controller every 100 µs, 30 priming epochs, admitted packets out of port 1.
    fn default() -> Self {
        NimbleConfig {
            rates_bps: vec![24_000_000_000],
            burst_bytes: 64 * 1024,
            arithmetic: Arithmetic::Ada(AdaConfig::new(Op::Mul)),
            dt_significant_bits: 6,
            dt_ada: None,
            antilog_significant_bits: 6,
            out_port: 1,
            controller_period_ns: 100_000,
            prime_epochs: 30,
        }
    }
}

impl NimbleConfig {
    /// Checks the settings, naming the one at fault.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.rates_bps.is_empty() || self.rates_bps.len() > MAX_CLASSES {
            return Err(ConfigError::new(
                "rates_bps",
                format!(
                    "{} classes: must be 1 to {MAX_CLASSES}",
                    self.rates_bps.len()
                ),
            ));
        }
        if let Some(r) = self.rates_bps.iter().find(|&&r| r > MAX_RATE_BPS) {
            return Err(ConfigError::new(
                "rates_bps",
                format!("{r} bit/s: at most {MAX_RATE_BPS} (the rate's 32-bit key)"),
            ));
        }
        if self.burst_bytes == 0 || self.burst_bytes > 1 << 40 {
            return Err(ConfigError::new(
                "burst_bytes",
                format!("{}: must be from 1 to 2^40", self.burst_bytes),
            ));
        }
        if self.dt_significant_bits > 10 {
            return Err(ConfigError::new(
                "dt_significant_bits",
                format!(
                    "{}: at most 10 (the table must fit a ternary match block)",
                    self.dt_significant_bits
                ),
            ));
        }
        let s = self.antilog_significant_bits;
        if s > MAX_ANTILOG_SIGNIFICANT_BITS {
            return Err(ConfigError::new(
                "antilog_significant_bits",
                format!(
                    "{s}: at most {MAX_ANTILOG_SIGNIFICANT_BITS} (the antilog table would hold \
                     {} entries, a ternary match block at most {MAX_TCAM_ENTRIES})",
                    antilog_table_len(Op::Mul, s)
                ),
            ));
        }
        if self.controller_period_ns == 0 {
            return Err(ConfigError::new(
                "controller_period_ns",
                "must be at least 1 ns",
            ));
        }
        match (self.arithmetic, self.dt_ada) {
            (Arithmetic::Exact, Some(_)) => {
                return Err(ConfigError::new(
                    "dt_ada",
                    "the exact arithmetic multiplies natively: it has no time table",
                ))
            }
            (_, Some(c)) => c.check()?,
            _ => {}
        }
        match self.arithmetic {
            Arithmetic::Uniform { significant_bits } if significant_bits > 10 => {
                Err(ConfigError::new(
                    "significant_bits",
                    format!("{significant_bits}: at most 10 (the table must fit a block)"),
                ))
            }
            Arithmetic::Ada(c) => c.check(),
            _ => Ok(()),
        }
    }
}

/// Why the limiter could not be installed or reached.
#[derive(Debug)]
#[non_exhaustive]
pub enum NimbleError {
    /// A setting is out of range.
    Config(ConfigError),
    /// The class records do not fit the memory.
    Memory(AllocError),
    /// A class record could not be read or written.
    Access(MemFault),
    /// A lookup table could not be built.
    Table(AdaError),
    /// No such class.
    NoClass {
        /// The class asked for.
        class: usize,
        /// Classes there are.
        classes: usize,
    },
}

impl fmt::Display for NimbleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NimbleError::Config(e) => write!(f, "nimble: {e}"),
            NimbleError::Memory(e) => write!(f, "nimble's class records: {e}"),
            NimbleError::Access(e) => write!(f, "nimble's class record: {e}"),
            NimbleError::Table(e) => write!(f, "nimble's lookup tables: {e}"),
            NimbleError::NoClass { class, classes } => {
                write!(f, "no class {class}: there are {classes}")
            }
        }
    }
}

impl std::error::Error for NimbleError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NimbleError::Config(e) => Some(e),
            NimbleError::Memory(e) => Some(e),
            NimbleError::Access(e) => Some(e),
            NimbleError::Table(e) => Some(e),
            NimbleError::NoClass { .. } => None,
        }
    }
}

impl From<MemFault> for NimbleError {
    fn from(e: MemFault) -> Self {
        NimbleError::Access(e)
    }
}

/// The rate's log table.
#[derive(Debug)]
enum RateTable {
    Exact,
    Fixed(Arc<LookupTable>),
    /// The class record's log of the rate, as the control plane last set it.
    Static,
    Ada(Arc<Ada>),
}

/// The time's log table.
#[derive(Debug)]
enum DtTable {
    Fixed(Arc<LookupTable>),
    Ada(Arc<Ada>),
}

impl DtTable {
    #[inline]
    fn lookup(&self, t: &mut Thread<'_>, dt: u32) -> Option<u64> {
        match self {
            DtTable::Fixed(f) => f.lookup(t, dt),
            DtTable::Ada(a) => a.lookup(t, dt),
        }
    }

    fn get(&self, dt: u32) -> Option<u64> {
        match self {
            DtTable::Fixed(f) => f.get(dt),
            DtTable::Ada(a) => a.table().get(dt),
        }
    }
}

/// The tables of the lookup multiplication: the rate's, the time's, the antilog.
#[derive(Debug)]
struct Tables {
    rate: RateTable,
    dt: DtTable,
    antilog: Arc<AntilogTable>,
}

/// The limiter installed in a shared memory: its class records and lookup tables.
#[derive(Debug, Clone)]
pub struct Nimble {
    cfg: NimbleConfig,
    base: Addr,
    tables: Arc<Tables>,
}

/// One class's counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ClassCounts {
    /// Packets admitted.
    pub packets: u64,
    /// Bytes admitted.
    pub bytes: u64,
}

/// The rate's lookup key for a rate in bytes per second, and what to add to the key's
/// log to make it the rate's (in the logs' `2^16` fixed point): the rate itself and 0 when
/// it fits the 32-bit key (under 2^32 B/s, 34 Gbit/s), else `R >> k` and `k` for the least
/// `k` (at most [`RATE_SHIFT`]) that makes it fit, as the time's key does. The key is 0
/// only for a zero rate, which earns nothing.
// A fixed `R >> RATE_SHIFT` made every rate below 4 B/s a key of 0, no rate at all, and
// rounded a rate of 4 to 7 B/s down to 4.
pub fn rate_key(bytes_per_s: u64) -> (u32, u64) {
    let k = (u64::BITS - bytes_per_s.leading_zeros()).saturating_sub(32);
    (
        u32::try_from(bytes_per_s >> k).unwrap_or(u32::MAX),
        u64::from(k) << 16,
    )
}

/// The time's lookup key for `dt_ns` and what to add to the key's log to make it the
/// time's: `dt_ns` itself and 0 when it fits the 32-bit key (under 2^32 ns, 4.3 s), else
/// `dt_ns >> k` and `k` in the logs' fixed point for the least `k` that makes it fit, as
/// [`RATE_SHIFT`] does for the rate (dropping the low `k` bits errs low by under 2^-31).
/// The log sum stays inside the antilog's key: at most `(34 + 64) * 2^16 - C`, about
/// `78.1 * 2^16`, below `2^23`.
fn dt_key(dt_ns: u64) -> (u32, u64) {
    let k = (u64::BITS - dt_ns.leading_zeros()).saturating_sub(32);
    ((dt_ns >> k) as u32, u64::from(k) << 16)
}

/// log2 of `bytes_per_s` in `2^16` fixed point, as the control plane computes it (0 for 0).
fn exact_log(bytes_per_s: u64) -> u64 {
    if bytes_per_s == 0 {
        return 0;
    }
    ((bytes_per_s as f64).log2() * 65536.0).round() as u64
}

/// `bits_per_s`, or the error naming it when it is above [`MAX_RATE_BPS`].
fn checked_rate(bits_per_s: u64) -> Result<u64, NimbleError> {
    if bits_per_s > MAX_RATE_BPS {
        return Err(NimbleError::Config(ConfigError::new(
            "rate",
            format!("{bits_per_s} bit/s: at most {MAX_RATE_BPS}"),
        )));
    }
    Ok(bits_per_s)
}

/// Tokens (1/1024 byte) that `bytes_per_s` earns in `dt_ns`, exactly (rounded down).
pub fn exact_credit(bytes_per_s: u64, dt_ns: u64) -> u64 {
    let t = u128::from(bytes_per_s) * u128::from(dt_ns) * (1 << TOKEN_FRAC_BITS) / 1_000_000_000;
    u64::try_from(t).unwrap_or(u64::MAX)
}

impl Nimble {
    /// Allocates the class records in `mem`'s SRAM (each bucket full), builds the lookup
    /// tables and, for ADA, primes the rate's table on the configured rates.
    pub fn install(mem: &SharedMemory, cfg: NimbleConfig) -> Result<Nimble, NimbleError> {
        cfg.check().map_err(NimbleError::Config)?;
        let classes = cfg.rates_bps.len() as u64;
        let base = mem
            .alloc(STATE_REGION, Region::Sram, classes * CLASS_WORDS)
            .map_err(NimbleError::Memory)?;
        let table = NimbleError::Table;
        let keys: Vec<u32> = cfg.rates_bps.iter().map(|&r| rate_key(r / 8).0).collect();
        let ada = |c: AdaConfig, prime: &[u32]| -> Result<Arc<Ada>, NimbleError> {
            let ada = Ada::new(AdaConfig { op: Op::Mul, ..c }).map_err(table)?;
            if !prime.is_empty() {
                ada.prime(prime, cfg.prime_epochs).map_err(table)?;
            }
            Ok(Arc::new(ada))
        };
        let rate = match cfg.arithmetic {
            Arithmetic::Exact => RateTable::Exact,
            Arithmetic::Uniform { significant_bits } => RateTable::Fixed(Arc::new(
                LookupTable::uniform(Op::Mul, significant_bits).map_err(table)?,
            )),
            Arithmetic::Static => RateTable::Static,
            Arithmetic::Ada(c) => RateTable::Ada(ada(c, &keys)?),
        };
        // The times are not known before traffic: ADA on them starts from equal bins.
        let dt = match cfg.dt_ada {
            Some(c) => DtTable::Ada(ada(c, &[])?),
            None => DtTable::Fixed(Arc::new(
                LookupTable::uniform(Op::Mul, cfg.dt_significant_bits).map_err(table)?,
            )),
        };
        let tables = Tables {
            rate,
            dt,
            antilog: Arc::new(
                AntilogTable::new(Op::Mul, cfg.antilog_significant_bits).map_err(table)?,
            ),
        };
        let nimble = Nimble {
            cfg,
            base,
            tables: Arc::new(tables),
        };
        for (class, &r) in nimble.cfg.rates_bps.iter().enumerate() {
            let rec = nimble.record(class)?;
            nimble.configure_rate(mem, class, r)?;
            mem.write_u64(rec + W_BURST, nimble.cfg.burst_bytes)?;
            mem.write_u64(rec + W_TOKENS, nimble.cfg.burst_bytes << TOKEN_FRAC_BITS)?;
        }
        Ok(nimble)
    }

    /// The first word of class `class`'s record.
    fn record(&self, class: usize) -> Result<Addr, NimbleError> {
        let classes = self.cfg.rates_bps.len();
        if class >= classes {
            return Err(NimbleError::NoClass { class, classes });
        }
        Ok(self.base + class as u64 * CLASS_WORDS)
    }

    /// Sets class `class`'s rate while traffic flows, as a data-plane update would (a
    /// work-conserving limiter changing its own rate): the record's rate word only. The
    /// control plane is not told, so the static arithmetic keeps the old rate; ADA's
    /// controller finds the new one in its monitoring. Refuses a rate above
    /// [`MAX_RATE_BPS`].
    pub fn set_rate(
        &self,
        mem: &SharedMemory,
        class: usize,
        bits_per_s: u64,
    ) -> Result<(), NimbleError> {
        let rec = self.record(class)?;
        mem.write_u64(rec + W_RATE, checked_rate(bits_per_s)? / 8)?;
        Ok(())
    }

    /// Sets class `class`'s rate from the control plane, as Nimble's controller does: the
    /// rate word, and the rate baked into the static arithmetic (its log). The other
    /// arithmetics read the rate word only. Refuses a rate above [`MAX_RATE_BPS`].
    pub fn configure_rate(
        &self,
        mem: &SharedMemory,
        class: usize,
        bits_per_s: u64,
    ) -> Result<(), NimbleError> {
        let rec = self.record(class)?;
        let bytes = checked_rate(bits_per_s)? / 8;
        mem.write_u64(rec + W_RATE_LOG, exact_log(bytes))?;
        mem.write_u64(rec + W_RATE, bytes)?;
        Ok(())
    }

    /// Class `class`'s rate now, in bits per second.
    pub fn rate(&self, mem: &SharedMemory, class: usize) -> Result<u64, NimbleError> {
        Ok(mem.read_u64(self.record(class)? + W_RATE)? * 8)
    }

    /// Class `class`'s admitted packets and bytes.
    pub fn counts(&self, mem: &SharedMemory, class: usize) -> Result<ClassCounts, NimbleError> {
        let (packets, bytes) = mem.counter_read(self.record(class)? + W_ADMITTED)?;
        Ok(ClassCounts { packets, bytes })
    }

    /// The tokens class `class` holds now, in bytes.
    pub fn tokens(&self, mem: &SharedMemory, class: usize) -> Result<f64, NimbleError> {
        let t = mem.read_u64(self.record(class)? + W_TOKENS)? as i64;
        Ok(t as f64 / f64::from(1u32 << TOKEN_FRAC_BITS))
    }

    /// The rate's ADA operand (ADA only): its stats, bins and table.
    pub fn ada(&self) -> Option<&Arc<Ada>> {
        match &self.tables.rate {
            RateTable::Ada(a) => Some(a),
            _ => None,
        }
    }

    /// ADA's controller counters for the rate (ADA only).
    pub fn ada_stats(&self) -> Option<AdaStats> {
        self.ada().map(|a| a.stats())
    }

    /// The time's ADA operand (with `dt_ada` only).
    pub fn dt_ada(&self) -> Option<&Arc<Ada>> {
        match &self.tables.dt {
            DtTable::Ada(a) => Some(a),
            DtTable::Fixed(_) => None,
        }
    }

    /// Every ADA operand the controller runs: the rate's, then the time's.
    pub fn adas(&self) -> Vec<Arc<Ada>> {
        self.ada()
            .into_iter()
            .chain(self.dt_ada())
            .cloned()
            .collect()
    }

    /// The timers the program needs: ADA's controller every `controller_period_ns` (none
    /// without an ADA operand).
    pub fn timer_specs(&self) -> Result<Vec<TimerSpec>, ConfigError> {
        if self.adas().is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![controller_timer(
            CONTROLLER_ENTRY,
            self.cfg.controller_period_ns,
        )?])
    }

    /// The settings.
    pub fn config(&self) -> &NimbleConfig {
        &self.cfg
    }

    /// The refill `bytes_per_s` earns in `dt_ns` as the limiter computes it, in tokens,
    /// from the control side (the lookups count hits, the monitoring none; the static
    /// arithmetic as if the control plane had set this rate): for checking the arithmetic
    /// against [`exact_credit`].
    pub fn credit(&self, bytes_per_s: u64, dt_ns: u64) -> u64 {
        let t = &self.tables;
        let (key, shift) = rate_key(bytes_per_s);
        let log_rate = match &t.rate {
            RateTable::Exact => return exact_credit(bytes_per_s, dt_ns),
            _ if key == 0 || dt_ns == 0 => return 0,
            RateTable::Static => Some(exact_log(bytes_per_s)),
            RateTable::Fixed(table) => table.get(key).map(|l| l + shift),
            RateTable::Ada(a) => a.table().get(key).map(|l| l + shift),
        };
        let (dt, dt_log_shift) = dt_key(dt_ns);
        (log_rate.zip(t.dt.get(dt).map(|l| l + dt_log_shift)))
            .and_then(|(lr, lt)| (lr + lt).checked_sub(LOG_SCALE))
            .and_then(|k| t.antilog.tcam().lookup(u32::try_from(k).ok()?))
            .map_or(0, |h| h.result)
    }

    /// Builds the Microcode program (see the module doc).
    pub fn program(&self) -> Program {
        let base = self.base;
        let classes = self.cfg.rates_bps.len() as u64;
        let out_port = self.cfg.out_port;
        let mut p = Program::builder("nimble");
        p.drop_reasons::<NimbleDrop>();
        pfemu::labels!(p => classify, refill, bucket, take, admit);

        p.instr(classify, move |t| {
            let class = u64::from(t.port());
            if class >= classes {
                return Ok(Done(Verdict::Drop(NimbleDrop::NoClass.into())));
            }
            let rec = base + class * CLASS_WORDS;
            t.set(RECORD, rec);
            // The whole record in one read; the rate, depth and log are used from it.
            t.mem_read(rec, SCRATCH_LM, CLASS_RECORD_LEN)?;
            let view = ClassRecord::new_checked(t.lm_bytes(SCRATCH_LM, CLASS_RECORD_LEN)?)?;
            let (rate, burst, log) = (view.rate(), view.burst(), view.rate_log());
            t.set(RATE, rate);
            t.set(BURST, burst << TOKEN_FRAC_BITS);
            t.set(RATE_LOG, log);
            let now = t.now_ns();
            // The class's clock only moves forward: a packet whose batch started before the
            // latest one's refills nothing.
            let last = t.fetch_max(rec + W_LAST, now)?;
            t.set(DT, now.saturating_sub(last));
            Ok(Goto(refill))
        });

        let tables = Arc::clone(&self.tables);
        p.instr(refill, move |t| {
            let (rate, dt) = (t.get(RATE), t.get(DT));
            let (key, shift) = rate_key(rate);
            let log_rate = match &tables.rate {
                RateTable::Exact => {
                    t.set(CREDIT, exact_credit(rate, dt).min(t.get(BURST)));
                    return Ok(Goto(bucket));
                }
                _ if key == 0 || dt == 0 => None,
                RateTable::Static => Some(t.get(RATE_LOG)),
                RateTable::Fixed(f) => f.lookup(t, key).map(|l| l + shift),
                RateTable::Ada(a) => a.lookup(t, key).map(|l| l + shift),
            };
            // The tables cover every key, so a missing log is a zero operand: no refill.
            let credit = match log_rate {
                Some(lr) => {
                    let (key, shift) = dt_key(dt);
                    let lt = tables.dt.lookup(t, key).map(|l| l + shift);
                    // A log sum below `C` is less than a token.
                    lt.and_then(|lt| (lr + lt).checked_sub(LOG_SCALE))
                        .and_then(|k| tables.antilog.product(t, k, 0))
                        .unwrap_or(0)
                }
                None => 0,
            };
            // More than a full bucket is a full bucket; a refill over a long idle time (or
            // from a clock far from 0) would otherwise overflow the tokens' word.
            t.set(CREDIT, credit.min(t.get(BURST)));
            Ok(Goto(bucket))
        });

        p.instr(bucket, move |t| {
            let credit = t.get(CREDIT);
            let before = t.fetch_add(t.get(RECORD) + W_TOKENS, credit)?;
            // The tokens as this packet's credit left them (a bucket overdrawn below zero
            // holds a negative count).
            t.set(TOKENS, before.wrapping_add(credit));
            Ok(Goto(take))
        });

        p.instr(take, move |t| {
            let rec = t.get(RECORD);
            let (credit, burst) = (t.get(CREDIT) as i64, t.get(BURST) as i64);
            let mut tokens = t.get(TOKENS) as i64;
            if tokens > burst {
                // Back to the bucket's depth, giving back no more than this packet's own
                // credit: the rest of the excess it saw is other packets' credit, which
                // they give back themselves (see "Concurrency" above).
                let excess = (tokens - burst).min(credit);
                t.fetch_add(rec + W_TOKENS, (-excess) as u64)?;
                tokens = burst;
            }
            let need = (t.pkt_len() as i64) << TOKEN_FRAC_BITS;
            if tokens < need {
                return Ok(Done(Verdict::Drop(NimbleDrop::RateExceeded.into())));
            }
            t.fetch_add(rec + W_TOKENS, (-need) as u64)?;
            Ok(Goto(admit))
        });

        p.instr(admit, move |t| {
            t.post(MemOp::CounterInc {
                addr: t.get(RECORD) + W_ADMITTED,
                bytes: t.pkt_len() as u64,
            })?;
            Ok(Done(Verdict::Forward(out_port)))
        });

        p.entry(Entry::Packet, classify);
        let adas = self.adas();
        if !adas.is_empty() {
            add_controller(&mut p, CONTROLLER_ENTRY, adas);
        }
        p.build().expect("nimble defines every label it declares")
    }
}

pfemu::drop_reasons! {
    /// Why the limiter drops a packet.
    pub enum NimbleDrop {
        /// The class had too few tokens for the packet.
        RateExceeded = "rate_exceeded",
        /// The packet arrived on a port that is no class.
        NoClass = "no_class",
    }
}

pfemu::registers! {
    /// The class's record.
    RECORD: Addr,
    /// The class's rate, bytes per second.
    RATE: u64,
    /// log2 of the rate the control plane set, `2^16` fixed point (static).
    RATE_LOG: u64,
    /// The bucket's depth, tokens.
    BURST: u64,
    /// Nanoseconds since the class's last packet.
    DT: u64,
    /// The refill, tokens.
    CREDIT: u64,
    /// The class's tokens just after this packet's refill, two's complement.
    TOKENS: u64,
}
