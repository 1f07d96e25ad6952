//! [`SharedMemory`]: the type, its construction and its regions. Its operations are
//! implemented by topic, each next to its own notes: reads, writes and the single-word
//! read-modify-writes with the storage and address decoding in `bank.rs`, the policer in
//! `policer.rs`, FPISA adds in `fpisa_rmw.rs`, the named-region allocator in `alloc.rs`.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::AtomicU64;
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::alloc::AllocState;
use super::bank::{zeroed_words, AccChunk, Bank, CHUNK_WORDS};
use super::{Addr, MemConfig, Region, ACC_BASE, DRAM_BASE};
use crate::error::ConfigError;

/// The Shared Memory System: SRAM + DRAM words, banks with their RMW engines, and the
/// control plane's named-region allocator. `Send + Sync`; share it between PPE threads with
/// an `Arc`. Every access method takes `&self` and is thread-safe.
pub struct SharedMemory {
    /// The validated sizes.
    pub(super) cfg: MemConfig,
    /// SRAM, allocated up front: word `a` of the region is `sram[a]`.
    pub(super) sram: Box<[AtomicU64]>,
    /// `sram.len()`.
    pub(super) sram_words: u64,
    /// DRAM in chunks of `CHUNK_WORDS`, each materialised on its first write; an unset
    /// chunk reads as zeros.
    pub(super) dram: Box<[OnceLock<Box<[AtomicU64]>>]>,
    /// Words of DRAM (the last chunk may be shorter than `CHUNK_WORDS`).
    pub(super) dram_words: u64,
    /// The accumulator region in chunks of `CHUNK_WORDS`, each a table of lazily
    /// materialised, locked stripes.
    pub(super) acc: Box<[OnceLock<AccChunk>]>,
    /// Words of the accumulator region.
    pub(super) acc_words: u64,
    /// One RMW engine per bank; `banks.len()` is a power of two.
    pub(super) banks: Box<[Bank]>,
    /// `banks.len() - 1`.
    pub(super) bank_mask: u64,
    /// The control plane's named regions.
    pub(super) allocs: Mutex<AllocState>,
}

impl fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let materialised = self.dram.iter().filter(|c| c.get().is_some()).count();
        let acc = self.acc.iter().filter(|c| c.get().is_some()).count();
        f.debug_struct("SharedMemory")
            .field("config", &self.cfg)
            .field("dram_chunks_materialised", &materialised)
            .field("acc_chunks_materialised", &acc)
            .finish_non_exhaustive()
    }
}

impl SharedMemory {
    /// Builds a zeroed memory of the given size; refuses an invalid [`MemConfig`].
    pub fn new(cfg: &MemConfig) -> Result<SharedMemory, ConfigError> {
        cfg.validate()?;
        let sram_words = cfg.sram_words();
        let dram_words = cfg.dram_words();
        let chunks = dram_words.div_ceil(CHUNK_WORDS);
        let acc_words = cfg.acc_words();
        let banks = (0..cfg.banks)
            .map(|_| Bank {
                sequencer: CachePadded::new(Mutex::new(())),
            })
            .collect();
        Ok(SharedMemory {
            cfg: cfg.clone(),
            sram: zeroed_words(sram_words),
            sram_words,
            dram: (0..chunks).map(|_| OnceLock::new()).collect(),
            dram_words,
            acc: (0..acc_words.div_ceil(CHUNK_WORDS))
                .map(|_| OnceLock::new())
                .collect(),
            acc_words,
            banks,
            bank_mask: cfg.banks as u64 - 1,
            allocs: Mutex::new(AllocState::new(
                0..sram_words,
                DRAM_BASE..DRAM_BASE + dram_words,
                ACC_BASE..ACC_BASE + acc_words,
            )),
        })
    }

    /// The configuration the memory was built with.
    pub fn config(&self) -> &MemConfig {
        &self.cfg
    }

    /// The word addresses of a region (empty for a DRAM or accumulator region of 0 bytes).
    pub fn region(&self, r: Region) -> Range<Addr> {
        match r {
            Region::Sram => 0..self.sram_words,
            Region::Dram => DRAM_BASE..DRAM_BASE + self.dram_words,
            Region::Acc => ACC_BASE..ACC_BASE + self.acc_words,
        }
    }
}
