//! The Shared Memory System: banked memory with read-modify-write engines (paper §2.3).
//!
//! # Address space
//!
//! Every PPE thread sees one unified, word-addressed space. An [`Addr`] is the index of an
//! 8-byte word ([`WORD_BYTES`]), so the paper's packet/byte counters, [`COUNTER_WORDS`]
//! words each, sit at `DROP_CNT_BASE + ir0 * COUNTER_WORDS`. Two regions live in that space:
//!
//! * **SRAM** (the on-chip memory): words `0 .. sram_bytes / 8`.
//! * **DRAM** (the off-chip memory and its cache): words
//!   `DRAM_BASE .. DRAM_BASE + dram_bytes / 8`, with [`DRAM_BASE`] `= 1 << 32`.
//!
//! * **ACC** (the accumulator memory, DRAM set aside for read-modify-write-heavy data such as
//!   aggregation buffers): words `ACC_BASE .. ACC_BASE + acc_bytes / 8`, with [`ACC_BASE`]
//!   `= 1 << 34`. See *The accumulator region* below.
//!
//! SRAM and DRAM are architecturally equivalent; only their size differs (the emulator does
//! not model the latency difference). Addresses between the regions, and past the end of
//! either, are unmapped: every access to them, and every access whose word range would run
//! off the end of a region, is refused with [`MemFault::OutOfRange`] (never a panic). The
//! engine turns a [`MemFault`] into a program fault. DRAM storage is materialised lazily in
//! 1 MiB chunks on first write, so a large configured DRAM costs nothing until touched; an
//! untouched word reads as zero. The accumulator region is materialised the same way.
//! [`SharedMemory::materialise`] backs a range ahead of time, for the control plane to call
//! when it sets up what the data path will write.
//!
//! # Banks and read-modify-write engines
//!
//! Memory is interleaved across [`MemConfig::banks`] banks at 64-byte-line granularity:
//! [`SharedMemory::bank_of`]`(addr) = (addr / 8) % banks`, so a 64-byte access aligned to 8 words
//! never spans two banks. Each bank has its own read-modify-write (RMW) engine, which is where
//! every access (read, write and RMW) is applied: requesting threads never take ownership of the
//! data, they send the operation to the engine, which applies requests to the same location in
//! sequence. The emulator maps that design onto the host as follows:
//!
//! * **Single-word operations** (8-byte read/write, the logical fetch-and-ops, fetch-and-swap,
//!   masked write, 64-bit fetch-and-add, 32-bit add, and each of the two words of a
//!   packet/byte counter) are applied with one atomic instruction (or a compare-and-swap loop)
//!   on that word: the host's
//!   per-location atomic ordering *is* the engine's per-location sequencing, so no update is ever
//!   lost and no lock is taken. This is what makes a hot counter hit by hundreds of threads run at
//!   about the rate of a raw atomic.
//! * **Multi-word operations that must be atomic as a whole** (a policer's config + state
//!   update) take the bank's sequencer lock, so they are serialised with every other policer
//!   operation in that bank.
//! * **Multi-word reads and writes** (16 to 64 bytes) and the vector adds (64 bytes,
//!   [`SharedMemory::vadd32x16`], or up to 4 KB of packet-borne lanes,
//!   [`SharedMemory::vadd32_be`]) are applied one 8-byte word at a time, each word atomically
//!   (a vector add's word is one compare-and-swap, or one fetch-add when its low lane adds 0).
//!   A concurrent reader therefore never sees a torn word, or a word half-way through a lane
//!   add, and concurrent vector adds never lose a lane update, but whole-line atomicity of a
//!   16-64 byte access is *not* promised: a reader racing a 64-byte writer may see some words
//!   old and some new, and a reader racing a vector add some words added and some not yet (in
//!   no promised order). Likewise [`SharedMemory::counter_read`] reads the packet and byte
//!   words one after the other.
//!
//! # The accumulator region
//!
//! The accumulator region ([`Region::Acc`]) accepts every operation the other regions do
//! except the policer (refused with [`MemFault::OutOfRange`]), with the same results, but its
//! engine serialises differently: the region is cut into stripes of [`ACC_STRIPE_WORDS`] words
//! (4 KB, aligned to the region's start), each owned by its own sequencer, and **every
//! operation on an accumulator word, read or write**, is applied under the lock of the word's
//! stripe, as Trio's RMW engines serialise the requests to one bank. Inside the lock the
//! words are plain memory, so a 4 KB vector add ([`SharedMemory::vadd32_be`]) costs one lock
//! and a vectorised loop instead of one locked instruction per word, and a bulk read
//! ([`SharedMemory::read_lines`]) one lock per stripe: that is what the region is for
//! (Trio-ML's aggregation buffers). No update is lost and no word is seen torn or half-added.
//! A multi-word operation spanning two stripes takes their locks one after the other (the
//! guarantees are per word, as everywhere). Single-word operations on a hot word are slower
//! than in SRAM or DRAM (a lock round trip instead of one atomic instruction), so keep
//! counters and records out of it.
//!
//! Loads use acquire ordering, stores release, and RMWs acquire-release, so data written before a
//! write/RMW is visible to a thread that observes that write (no explicit coherence commands are
//! needed, as in the paper).
//!
//! # Byte order
//!
//! Words are stored as `u64`. The byte-oriented accesses ([`SharedMemory::read`],
//! [`SharedMemory::write`]) expose each word big-endian (network order): after
//! `write_u64(a, 0x0102030405060708)`, reading 8 bytes at `a` yields `[1, 2, 3, 4, 5, 6, 7, 8]`.
//! The 32-bit lanes of [`SharedMemory::fetch_add32`], [`SharedMemory::vadd32x16`] and
//! [`SharedMemory::vadd32_be`] follow the same order: lane 0 of a word is its first 4 bytes, i.e.
//! the high half of the `u64`, so the big-endian lanes of a packet add straight into the words
//! whose bytes `read` would return in the same order.
//!
//! # Synchronous and posted (asynchronous) XTXNs
//!
//! A PPE thread reaches shared memory through external transactions (XTXNs). A *synchronous*
//! XTXN is a method call on [`SharedMemory`]: the thread waits until the engine applied it and
//! gets the reply (a read's data, a fetch-op's old value, a policer's colour). An *asynchronous*
//! (posted) XTXN needs no reply: the thread describes it as an [`Op`] and hands it to its own
//! posted-XTXN buffer ([`crate::program::Thread::post`]), which validates the address at post
//! time (so a bad address still faults the posting program) and applies the buffered
//! operations, in order and exactly once, when it fills up or when the thread waits for them
//! ([`crate::program::Thread::wait_posted`]). Posted operations become visible to other threads
//! only once applied (the engine flushes each PPE thread's buffer at the end of every batch of
//! packets, before the batch counts as done, so posted operations are visible after
//! `Pfe::drain`). Posted increments of one counter coalesce in the buffer, and posted vector
//! adds that continue one another merge into one add of up to 4 KB. The buffer is the
//! engine's own (crate-private): a program posts through its [`crate::program::Thread`].
//!
//! # Names
//!
//! Every operation has one name, the synchronous method's, and its other forms are spelled
//! from it: the method on [`SharedMemory`] (and on `Thread`) is `name`, the posted form is
//! `post_name` (`Thread::post_vadd32_be`, `Thread::post_fpisa_add_be`), the [`Op`] variant is
//! `Name` in camel case (`fetch_swap`, `Op::FetchSwap`), and the XTXN counter is
//! [`XtxnKind`]. A suffix says how lanes are given: `_be`, big-endian bytes as they sit in a
//! packet; `_lanes`, host integers; `x16`, a 64-byte line of 16 lanes.
//!
//! # Lookup blocks
//!
//! Beside the word-addressed space sit two lookup blocks with their own storage: the hash
//! engine ([`hash`], keyed records with REF flags) and the ternary match block ([`tcam`],
//! value/mask/priority entries with per-entry hit counters, replaced whole by the control side
//! while lookups run).
//!
//! # Data flow
//!
//! The control plane sizes the memory ([`MemConfig`], [`SharedMemory::new`]), carves named
//! regions out of it with [`SharedMemory::alloc`] (counters, policers, tables) and initialises
//! them (e.g. [`SharedMemory::policer_init`]). The memory is then shared through an `Arc` by all
//! PPE threads, which issue synchronous XTXNs directly and posted XTXNs through their own
//! buffers; the control plane reads results back (e.g. [`SharedMemory::counter_read`]) with
//! the same thread-safe calls.

mod alloc;
mod bank;
mod fpisa_rmw;
pub mod hash;
mod lanes;
mod policer;
mod posted;
mod shared_memory;
pub mod tcam;

#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod stress_tests;

use std::fmt;

use crate::error::ConfigError;

pub use alloc::{AllocError, Allocation};
pub use fpisa_rmw::MAX_FPISA_LANES;
pub use policer::{Color, PolicerConfig, PolicerState, POLICER_WORDS};
pub(crate) use posted::PostedOps;
pub use shared_memory::SharedMemory;

/// `to.copy_from_slice(from)` (equal lengths), with the common case, one 64-byte line (a
/// tail chunk, a posted vector add's chunk), copied inline: a phase-two loop does two such
/// copies per chunk, and a library call each would cost more than the copy.
#[inline(always)]
pub(crate) fn copy_bytes(to: &mut [u8], from: &[u8]) {
    /// Any other length. Kept out of line, so the compiler cannot fold the two cases into
    /// one call with a variable length.
    #[inline(never)]
    fn other(to: &mut [u8], from: &[u8]) {
        to.copy_from_slice(from);
    }
    match (
        <&mut [u8; MAX_ACCESS_BYTES]>::try_from(&mut *to),
        <&[u8; MAX_ACCESS_BYTES]>::try_from(from),
    ) {
        (Ok(to), Ok(line)) => *to = *line,
        _ => other(to, from),
    }
}

/// `to.copy_from_slice(from)` (equal lengths) for a copy of a few lines, such as a packet
/// head loaded into local memory, inline: whole 64-byte lines from the start, then the last
/// 64 bytes, which overlap the line before when the length is not a multiple of 64. A copy
/// shorter than a line takes a library call. A 64-byte head (a minimum-size frame's) is
/// one line's load and store; copied as lines and then a remainder, it took 14
/// instructions more (callgrind), and a library call for every other length.
#[inline(always)]
pub(crate) fn copy_lines(to: &mut [u8], from: &[u8]) {
    /// Shorter than a line. Kept out of line, so the compiler cannot fold the cases into
    /// one call with a variable length.
    #[inline(never)]
    fn short(to: &mut [u8], from: &[u8]) {
        to.copy_from_slice(from);
    }
    let n = from.len();
    assert_eq!(to.len(), n, "copy_lines of unequal lengths");
    if n < MAX_ACCESS_BYTES {
        return short(to, from);
    }
    let line = |to: &mut [u8], from: &[u8], at: usize| {
        copy_bytes(
            &mut to[at..at + MAX_ACCESS_BYTES],
            &from[at..at + MAX_ACCESS_BYTES],
        )
    };
    let last = n - MAX_ACCESS_BYTES;
    let mut at = 0;
    while at < last {
        line(to, from, at);
        at += MAX_ACCESS_BYTES;
    }
    line(to, from, last);
}

/// A shared-memory address: the index of an 8-byte word (the paper's counters sit at
/// `DROP_CNT_BASE + ir0*2`).
pub type Addr = u64;

/// Bytes per memory word.
pub const WORD_BYTES: usize = 8;

/// First word of the DRAM region; SRAM starts at word 0. Addresses between the regions are
/// unmapped.
pub const DRAM_BASE: Addr = 1 << 32;

/// First word of the accumulator region ([`Region::Acc`]), past the largest DRAM.
pub const ACC_BASE: Addr = 1 << 34;

/// Words per stripe of the accumulator region (4 KB): each stripe has its own sequencer lock,
/// taken by every operation on one of its words. Stripes are aligned to
/// [`ACC_BASE`].
pub const ACC_STRIPE_WORDS: u64 = 512;

/// Largest single read or write, in bytes (one 64-byte line).
pub const MAX_ACCESS_BYTES: usize = 64;

/// Largest vector add ([`SharedMemory::vadd32_be`]), in bytes: 64 lines, 1024 32-bit lanes
/// (the gradients of one 4 KB packet).
pub const MAX_VADD_BYTES: usize = 4096;

/// Words in one 64-byte line, the unit of bank interleaving.
pub const LINE_WORDS: u64 = (MAX_ACCESS_BYTES / WORD_BYTES) as u64;

/// Words one packet/byte counter occupies: the packet count at its address, the byte count
/// in the next word ([`SharedMemory::counter_inc`]). Counter `i` of an array allocated at
/// `base` is at `base + i * COUNTER_WORDS`.
pub const COUNTER_WORDS: u64 = 2;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Largest accepted SRAM size in bytes (1 GiB).
pub const MAX_SRAM_BYTES: u64 = GIB;
/// Largest accepted DRAM size in bytes (64 GiB).
pub const MAX_DRAM_BYTES: u64 = 64 * GIB;
/// Largest accepted accumulator region size in bytes (16 GiB).
pub const MAX_ACC_BYTES: u64 = 16 * GIB;
/// Largest accepted bank count.
pub const MAX_BANKS: usize = 4096;

/// Sizing of the Shared Memory System.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemConfig {
    /// On-chip SRAM size in bytes: a multiple of 64, from 64 B to 1 GiB.
    pub sram_bytes: u64,
    /// Off-chip DRAM size in bytes: a multiple of 64, up to 64 GiB (0 = no DRAM region).
    pub dram_bytes: u64,
    /// Accumulator region size in bytes ([`Region::Acc`]): a multiple of 64, up to 16 GiB
    /// (0 = no accumulator region). Materialised lazily, like DRAM.
    pub acc_bytes: u64,
    /// Number of banks (each with its own RMW engine): a power of two from 1 to 4096.
    pub banks: usize,
}

impl Default for MemConfig {
    /// 8 MiB of SRAM, 64 MiB of DRAM, 64 MiB of accumulator memory, 64 banks.
    fn default() -> Self {
        MemConfig {
            sram_bytes: 8 * MIB,
            dram_bytes: 64 * MIB,
            acc_bytes: 64 * MIB,
            banks: 64,
        }
    }
}

impl MemConfig {
    /// Checks every setting; the error names the setting (`sram_bytes`, `dram_bytes`,
    /// `acc_bytes` or `banks`) and states the accepted range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let line = MAX_ACCESS_BYTES as u64;
        if self.sram_bytes < line
            || self.sram_bytes > MAX_SRAM_BYTES
            || !self.sram_bytes.is_multiple_of(line)
        {
            return Err(ConfigError::new(
                "sram_bytes",
                format!(
                    "must be a multiple of 64 bytes from 64 B to 1 GiB ({MAX_SRAM_BYTES} bytes), got {}",
                    self.sram_bytes
                ),
            ));
        }
        if self.dram_bytes > MAX_DRAM_BYTES || !self.dram_bytes.is_multiple_of(line) {
            return Err(ConfigError::new(
                "dram_bytes",
                format!(
                    "must be a multiple of 64 bytes from 0 (no DRAM) to 64 GiB ({MAX_DRAM_BYTES} bytes), got {}",
                    self.dram_bytes
                ),
            ));
        }
        if self.acc_bytes > MAX_ACC_BYTES || !self.acc_bytes.is_multiple_of(line) {
            return Err(ConfigError::new(
                "acc_bytes",
                format!(
                    "must be a multiple of 64 bytes from 0 (no accumulator region) to 16 GiB ({MAX_ACC_BYTES} bytes), got {}",
                    self.acc_bytes
                ),
            ));
        }
        if !(1..=MAX_BANKS).contains(&self.banks) || !self.banks.is_power_of_two() {
            return Err(ConfigError::new(
                "banks",
                format!(
                    "must be a power of two from 1 to {MAX_BANKS}, got {}",
                    self.banks
                ),
            ));
        }
        Ok(())
    }

    /// Words in the SRAM region.
    pub fn sram_words(&self) -> u64 {
        self.sram_bytes / WORD_BYTES as u64
    }

    /// Words in the DRAM region.
    pub fn dram_words(&self) -> u64 {
        self.dram_bytes / WORD_BYTES as u64
    }

    /// Words in the accumulator region.
    pub fn acc_words(&self) -> u64 {
        self.acc_bytes / WORD_BYTES as u64
    }
}

/// One of the three regions of the unified address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Region {
    /// On-chip SRAM, starting at word 0.
    Sram,
    /// Off-chip DRAM, starting at word [`DRAM_BASE`].
    Dram,
    /// The accumulator region, starting at word [`ACC_BASE`]: every write to it is
    /// serialised by a per-stripe lock (see the module documentation).
    Acc,
}

impl Region {
    /// Lower-case name (`"sram"` / `"dram"` / `"acc"`).
    pub fn name(self) -> &'static str {
        match self {
            Region::Sram => "sram",
            Region::Dram => "dram",
            Region::Acc => "acc",
        }
    }
}

impl fmt::Display for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a memory access was refused (the engine turns this into a program fault).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemFault {
    /// The `words` words starting at `addr` are not all inside one mapped region.
    OutOfRange {
        /// First word of the refused access.
        addr: Addr,
        /// Length of the refused access in words.
        words: u64,
    },
    /// A read or write of `bytes` bytes (sizes must be 8 to 64 in steps of 8), or a vector
    /// add of `bytes` bytes (64 to [`MAX_VADD_BYTES`] in steps of 64).
    BadSize {
        /// The refused size in bytes.
        bytes: usize,
    },
    /// A 32-bit add to lane `lane` of a word: only lanes 0 (high half) and 1 (low half) exist.
    BadLane {
        /// The refused lane number.
        lane: u8,
    },
}

impl fmt::Display for MemFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MemFault::OutOfRange { addr, words } => write!(
                f,
                "memory access out of range: {words} word(s) at word address {addr:#x} are not inside one mapped region"
            ),
            MemFault::BadSize { bytes } => write!(
                f,
                "bad memory access size: {bytes} bytes (reads and writes take 8 to 64 in multiples of 8, vector adds 64 to {MAX_VADD_BYTES} in multiples of 64)"
            ),
            MemFault::BadLane { lane } => {
                write!(f, "bad 32-bit lane {lane} (a word has lanes 0 and 1)")
            }
        }
    }
}

impl std::error::Error for MemFault {}

/// Kinds of external transactions, counted per kind in the engine's stats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum XtxnKind {
    /// Read of 8-64 bytes.
    Read,
    /// Write of 8-64 bytes.
    Write,
    /// Packet/byte counter increment (`CounterIncPhys`).
    CounterInc,
    /// Policer (srTCM) update.
    Police,
    /// Fetch-and-AND.
    FetchAnd,
    /// Fetch-and-OR.
    FetchOr,
    /// Fetch-and-XOR.
    FetchXor,
    /// Fetch-and-clear (AND NOT).
    FetchClear,
    /// Fetch-and-swap.
    FetchSwap,
    /// Masked write.
    MaskedWrite,
    /// 64-bit fetch-and-add.
    FetchAdd,
    /// Fetch-and-max (unsigned).
    FetchMax,
    /// 32-bit add to one half of a word.
    Add32,
    /// Sixteen 32-bit adds over a 64-byte line.
    VAdd32x16,
    /// Fetch of a packet tail section into local memory.
    TailRead,
    /// Write-back of a packet tail section.
    TailWrite,
    /// Hash-engine lookup.
    HashLookup,
    /// Hash-engine insert (create unless present).
    HashInsert,
    /// Hash-engine update of an existing record's value.
    HashUpdate,
    /// Hash-engine delete.
    HashDelete,
    /// Hash-engine scan of one slice of a table (tests and clears REF flags).
    HashScan,
    /// FPISA shift-and-add of up to 16 lanes (a 64-byte chunk of FP32 values), one
    /// accumulator word per lane.
    FpisaAdd16,
    /// Ternary match block lookup (the winning entry's hit counter counts it).
    TcamLookup,
    /// Read of one ternary entry's hit counter (a controller reading its monitoring bins).
    TcamRead,
    /// Write of one ternary entry (a controller installing a table, counted per entry).
    TcamWrite,
}

impl XtxnKind {
    /// Number of kinds.
    pub const COUNT: usize = 25;

    /// Every kind, in [`XtxnKind::index`] order.
    pub const ALL: [XtxnKind; XtxnKind::COUNT] = [
        XtxnKind::Read,
        XtxnKind::Write,
        XtxnKind::CounterInc,
        XtxnKind::Police,
        XtxnKind::FetchAnd,
        XtxnKind::FetchOr,
        XtxnKind::FetchXor,
        XtxnKind::FetchClear,
        XtxnKind::FetchSwap,
        XtxnKind::MaskedWrite,
        XtxnKind::FetchAdd,
        XtxnKind::FetchMax,
        XtxnKind::Add32,
        XtxnKind::VAdd32x16,
        XtxnKind::TailRead,
        XtxnKind::TailWrite,
        XtxnKind::HashLookup,
        XtxnKind::HashInsert,
        XtxnKind::HashUpdate,
        XtxnKind::HashDelete,
        XtxnKind::HashScan,
        XtxnKind::FpisaAdd16,
        XtxnKind::TcamLookup,
        XtxnKind::TcamRead,
        XtxnKind::TcamWrite,
    ];

    /// The snake_case name, e.g. `"counter_inc"`.
    pub fn name(self) -> &'static str {
        match self {
            XtxnKind::Read => "read",
            XtxnKind::Write => "write",
            XtxnKind::CounterInc => "counter_inc",
            XtxnKind::Police => "police",
            XtxnKind::FetchAnd => "fetch_and",
            XtxnKind::FetchOr => "fetch_or",
            XtxnKind::FetchXor => "fetch_xor",
            XtxnKind::FetchClear => "fetch_clear",
            XtxnKind::FetchSwap => "fetch_swap",
            XtxnKind::MaskedWrite => "masked_write",
            XtxnKind::FetchAdd => "fetch_add",
            XtxnKind::FetchMax => "fetch_max",
            XtxnKind::Add32 => "add32",
            XtxnKind::VAdd32x16 => "vadd32x16",
            XtxnKind::TailRead => "tail_read",
            XtxnKind::TailWrite => "tail_write",
            XtxnKind::HashLookup => "hash_lookup",
            XtxnKind::HashInsert => "hash_insert",
            XtxnKind::HashUpdate => "hash_update",
            XtxnKind::HashDelete => "hash_delete",
            XtxnKind::HashScan => "hash_scan",
            XtxnKind::FpisaAdd16 => "fpisa_add16",
            XtxnKind::TcamLookup => "tcam_lookup",
            XtxnKind::TcamRead => "tcam_read",
            XtxnKind::TcamWrite => "tcam_write",
        }
    }

    /// Position in [`XtxnKind::ALL`] (0..[`XtxnKind::COUNT`]), for per-kind stat arrays.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The nonzero counts of a per-kind array, by kind name, in [`XtxnKind::ALL`]'s order.
    pub fn named(
        counts: &[u64; XtxnKind::COUNT],
    ) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        (XtxnKind::ALL.iter())
            .map(|k| (k.name(), counts[k.index()]))
            .filter(|&(_, n)| n > 0)
    }
}

impl fmt::Display for XtxnKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An operation applied near the memory (used for posted/async XTXNs; the synchronous calls
/// share the code). Field meanings match the [`SharedMemory`] method of the same name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Store `value` into the word at `addr` ([`SharedMemory::write_u64`]).
    WriteU64 {
        /// Target word.
        addr: Addr,
        /// Value stored.
        value: u64,
    },
    /// Packet/byte counter increment ([`SharedMemory::counter_inc`]).
    CounterInc {
        /// Packet word; the byte word is `addr + 1`.
        addr: Addr,
        /// Bytes added to the byte word.
        bytes: u64,
    },
    /// Packet/byte counter addition of `packets` and `bytes` ([`SharedMemory::counter_add`]);
    /// what posted increments of one counter coalesce into.
    CounterAdd {
        /// Packet word; the byte word is `addr + 1`.
        addr: Addr,
        /// Packets added to the packet word.
        packets: u64,
        /// Bytes added to the byte word.
        bytes: u64,
    },
    /// `word &= mask` ([`SharedMemory::fetch_and`]).
    FetchAnd {
        /// Target word.
        addr: Addr,
        /// Mask ANDed in.
        mask: u64,
    },
    /// `word |= mask` ([`SharedMemory::fetch_or`]).
    FetchOr {
        /// Target word.
        addr: Addr,
        /// Mask ORed in.
        mask: u64,
    },
    /// `word ^= mask` ([`SharedMemory::fetch_xor`]).
    FetchXor {
        /// Target word.
        addr: Addr,
        /// Mask XORed in.
        mask: u64,
    },
    /// `word &= !mask` ([`SharedMemory::fetch_clear`]).
    FetchClear {
        /// Target word.
        addr: Addr,
        /// Bits cleared.
        mask: u64,
    },
    /// `word = value` ([`SharedMemory::fetch_swap`]; the posted form discards the old value).
    FetchSwap {
        /// Target word.
        addr: Addr,
        /// Value stored.
        value: u64,
    },
    /// `word = (word & !mask) | (value & mask)` ([`SharedMemory::masked_write`]).
    MaskedWrite {
        /// Target word.
        addr: Addr,
        /// New bits (only those under `mask` are used).
        value: u64,
        /// Bits replaced.
        mask: u64,
    },
    /// `word += delta`, wrapping ([`SharedMemory::fetch_add`]).
    FetchAdd {
        /// Target word.
        addr: Addr,
        /// Value added.
        delta: u64,
    },
    /// `word = max(word, value)`, unsigned ([`SharedMemory::fetch_max`]).
    FetchMax {
        /// Target word.
        addr: Addr,
        /// Value the word is raised to, if it is below.
        value: u64,
    },
    /// Wrapping add of `delta` to 32-bit lane `lane` ([`SharedMemory::fetch_add32`]).
    FetchAdd32 {
        /// Target word.
        addr: Addr,
        /// 0 = high half (first 4 bytes), 1 = low half.
        lane: u8,
        /// Value added (wrapping, no carry into the other lane).
        delta: u32,
    },
    /// Sixteen lane-wise wrapping 32-bit adds over 8 words ([`SharedMemory::vadd32x16`]).
    Vadd32x16 {
        /// First of the 8 target words.
        addr: Addr,
        /// Lane `2i` is the high half of word `addr + i`, lane `2i + 1` its low half.
        deltas: [u32; 16],
    },
}

impl Op {
    /// The XTXN kind this operation is counted as.
    pub fn kind(&self) -> XtxnKind {
        match self {
            Op::WriteU64 { .. } => XtxnKind::Write,
            Op::CounterInc { .. } | Op::CounterAdd { .. } => XtxnKind::CounterInc,
            Op::FetchAnd { .. } => XtxnKind::FetchAnd,
            Op::FetchOr { .. } => XtxnKind::FetchOr,
            Op::FetchXor { .. } => XtxnKind::FetchXor,
            Op::FetchClear { .. } => XtxnKind::FetchClear,
            Op::FetchSwap { .. } => XtxnKind::FetchSwap,
            Op::MaskedWrite { .. } => XtxnKind::MaskedWrite,
            Op::FetchAdd { .. } => XtxnKind::FetchAdd,
            Op::FetchMax { .. } => XtxnKind::FetchMax,
            Op::FetchAdd32 { .. } => XtxnKind::Add32,
            Op::Vadd32x16 { .. } => XtxnKind::VAdd32x16,
        }
    }

    /// The first word the operation touches.
    pub fn addr(&self) -> Addr {
        match *self {
            Op::WriteU64 { addr, .. }
            | Op::CounterInc { addr, .. }
            | Op::CounterAdd { addr, .. }
            | Op::FetchAnd { addr, .. }
            | Op::FetchOr { addr, .. }
            | Op::FetchXor { addr, .. }
            | Op::FetchClear { addr, .. }
            | Op::FetchSwap { addr, .. }
            | Op::MaskedWrite { addr, .. }
            | Op::FetchAdd { addr, .. }
            | Op::FetchMax { addr, .. }
            | Op::FetchAdd32 { addr, .. }
            | Op::Vadd32x16 { addr, .. } => addr,
        }
    }

    /// How many consecutive words (from [`Op::addr`]) the operation touches.
    pub fn words(&self) -> u64 {
        match self {
            Op::CounterInc { .. } | Op::CounterAdd { .. } => 2,
            Op::Vadd32x16 { .. } => LINE_WORDS,
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid_and_sized_as_documented() {
        let c = MemConfig::default();
        assert_eq!(c.sram_bytes, 8 * MIB);
        assert_eq!(c.dram_bytes, 64 * MIB);
        assert_eq!(c.acc_bytes, 64 * MIB);
        assert_eq!(c.banks, 64);
        c.validate().unwrap();
        assert_eq!(c.sram_words(), MIB);
        assert_eq!(c.dram_words(), 8 * MIB);
    }

    /// Every length a head can have, at every alignment within a line: the copy is the
    /// source's bytes, and nothing past the destination's end is written.
    #[test]
    fn copy_lines_copies_every_length_exactly() {
        let from: Vec<u8> = (0..400u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..=300 {
            for skew in [0, 1, 17, 63] {
                let mut to = vec![0xAAu8; 400];
                copy_lines(&mut to[skew..skew + n], &from[skew..skew + n]);
                assert_eq!(to[skew..skew + n], from[skew..skew + n], "length {n}");
                assert!(to[..skew].iter().all(|&b| b == 0xAA), "length {n}");
                assert!(to[skew + n..].iter().all(|&b| b == 0xAA), "length {n}");
            }
        }
    }

    fn refused(c: MemConfig) -> ConfigError {
        c.validate().expect_err("config should be refused")
    }

    #[test]
    fn validation_names_the_setting_and_range() {
        let ok = MemConfig {
            sram_bytes: 64,
            dram_bytes: 0,
            acc_bytes: 0,
            banks: 1,
        };
        ok.validate().unwrap();
        MemConfig {
            sram_bytes: MAX_SRAM_BYTES,
            dram_bytes: MAX_DRAM_BYTES,
            acc_bytes: MAX_ACC_BYTES,
            banks: MAX_BANKS,
        }
        .validate()
        .unwrap();

        for sram in [0, 32, 100, MAX_SRAM_BYTES + 64] {
            let e = refused(MemConfig {
                sram_bytes: sram,
                ..ok.clone()
            });
            assert_eq!(e.setting, "sram_bytes");
            assert!(e.reason.contains("multiple of 64"), "{e}");
            assert!(e.reason.contains("1 GiB"), "{e}");
            assert!(e.reason.contains(&sram.to_string()), "{e}");
            assert!(e
                .to_string()
                .starts_with("invalid configuration: `sram_bytes`: "));
        }
        for dram in [8, 65, MAX_DRAM_BYTES + 64] {
            let e = refused(MemConfig {
                dram_bytes: dram,
                ..ok.clone()
            });
            assert_eq!(e.setting, "dram_bytes");
            assert!(e.reason.contains("64 GiB"), "{e}");
        }
        for acc in [8, 65, MAX_ACC_BYTES + 64] {
            let e = refused(MemConfig {
                acc_bytes: acc,
                ..ok.clone()
            });
            assert_eq!(e.setting, "acc_bytes");
            assert!(e.reason.contains("16 GiB"), "{e}");
        }
        for banks in [0, 3, 6, 8192] {
            let e = refused(MemConfig {
                banks,
                ..ok.clone()
            });
            assert_eq!(e.setting, "banks");
            assert!(e.reason.contains("power of two from 1 to 4096"), "{e}");
            assert!(e.reason.contains(&format!("got {banks}")), "{e}");
        }
    }

    #[test]
    fn xtxn_kinds_index_and_names() {
        assert_eq!(XtxnKind::ALL.len(), XtxnKind::COUNT);
        for (i, k) in XtxnKind::ALL.iter().enumerate() {
            assert_eq!(k.index(), i);
        }
        assert_eq!(XtxnKind::CounterInc.name(), "counter_inc");
        assert_eq!(XtxnKind::VAdd32x16.name(), "vadd32x16");
        assert_eq!(XtxnKind::TailWrite.to_string(), "tail_write");
        let mut names: Vec<_> = XtxnKind::ALL.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), XtxnKind::COUNT);
        for n in names {
            assert!(n
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'));
        }
    }

    #[test]
    fn op_kind_addr_words() {
        let cases = [
            (Op::WriteU64 { addr: 1, value: 0 }, XtxnKind::Write, 1),
            (
                Op::CounterInc { addr: 2, bytes: 0 },
                XtxnKind::CounterInc,
                2,
            ),
            (Op::FetchAnd { addr: 3, mask: 0 }, XtxnKind::FetchAnd, 1),
            (Op::FetchOr { addr: 4, mask: 0 }, XtxnKind::FetchOr, 1),
            (Op::FetchXor { addr: 5, mask: 0 }, XtxnKind::FetchXor, 1),
            (Op::FetchClear { addr: 6, mask: 0 }, XtxnKind::FetchClear, 1),
            (Op::FetchSwap { addr: 7, value: 0 }, XtxnKind::FetchSwap, 1),
            (
                Op::MaskedWrite {
                    addr: 8,
                    value: 0,
                    mask: 0,
                },
                XtxnKind::MaskedWrite,
                1,
            ),
            (
                Op::FetchAdd32 {
                    addr: 9,
                    lane: 0,
                    delta: 0,
                },
                XtxnKind::Add32,
                1,
            ),
            (
                Op::Vadd32x16 {
                    addr: 10,
                    deltas: [0; 16],
                },
                XtxnKind::VAdd32x16,
                8,
            ),
            (Op::FetchAdd { addr: 11, delta: 0 }, XtxnKind::FetchAdd, 1),
            (Op::FetchMax { addr: 12, value: 0 }, XtxnKind::FetchMax, 1),
        ];
        for (i, (op, kind, words)) in cases.iter().enumerate() {
            assert_eq!(op.kind(), *kind);
            assert_eq!(op.addr(), i as u64 + 1);
            assert_eq!(op.words(), *words);
        }
    }

    #[test]
    fn fault_messages() {
        let f = MemFault::OutOfRange {
            addr: 0x10,
            words: 2,
        };
        assert!(f.to_string().contains("0x10"));
        assert!(MemFault::BadSize { bytes: 12 }
            .to_string()
            .contains("12 bytes"));
        assert!(MemFault::BadLane { lane: 2 }.to_string().contains("lane 2"));
        let _: &dyn std::error::Error = &f;
    }

    #[test]
    fn unit_constants() {
        assert_eq!(LINE_WORDS, 8);
        assert_eq!(DRAM_BASE % (LINE_WORDS * MAX_BANKS as u64), 0);
        assert!(DRAM_BASE + MAX_DRAM_BYTES / WORD_BYTES as u64 <= ACC_BASE);
        assert_eq!(ACC_BASE % ACC_STRIPE_WORDS, 0);
    }
}
