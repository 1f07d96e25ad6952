//! Storage, address decoding, banks and the read-modify-write engines' single-word operations
//! of [`SharedMemory`] (the type itself is in `shared_memory.rs`).
//!
//! See the [module documentation](super) for the semantics. Implementation notes:
//!
//! * SRAM is one flat `Box<[AtomicU64]>` allocated up front (at most 1 GiB).
//! * DRAM (up to 64 GiB) is a table of 1 MiB chunks, each materialised on its first write
//!   (`OnceLock`). Loads from a chunk nobody wrote yet return zero without allocating it.
//! * Each bank owns a cache-padded sequencer lock, taken only by multi-word operations that
//!   must be atomic as a whole (the policer); single-word operations are one atomic
//!   instruction or a compare-and-swap loop on the word.
//! * The accumulator region is a table of 1 MiB chunks too, each holding 256 cache-padded
//!   stripes of 4 KB, each materialised on its first write (or by `materialise`): a
//!   `Mutex` around the stripe's plain `u64` words, so only the lock holder can reach
//!   them. The SRAM/DRAM decoders (`word`, `span`, `pair`) never hand out an accumulator
//!   word: each public operation falls back to its `acc_*` counterpart only when the fast
//!   decoder refused the address, which keeps the SRAM and DRAM paths as they were.
//! * The bulk lane loops (vector adds, conversions to and from network order) live in
//!   `lanes`, compiled for AVX2 as well when the CPU has it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};

use super::lanes::{add_be_slice, add_packed, add_packed_slice, be_to_packed, packed_to_be};
use super::{
    Addr, MemFault, Op, SharedMemory, ACC_BASE, ACC_STRIPE_WORDS, DRAM_BASE, LINE_WORDS,
    MAX_ACCESS_BYTES, MAX_VADD_BYTES, WORD_BYTES,
};

/// log2 of the words in one lazily materialised DRAM chunk (2^17 words = 1 MiB).
const CHUNK_SHIFT: u32 = 17;
pub(super) const CHUNK_WORDS: u64 = 1 << CHUNK_SHIFT;
const CHUNK_MASK: u64 = CHUNK_WORDS - 1;

/// Stand-in for the words of a DRAM chunk that was never written. Only ever loaded from: the
/// read-only decoder hands it out, the writing decoder materialises the chunk instead.
static ZEROS: [AtomicU64; LINE_WORDS as usize] = [const { AtomicU64::new(0) }; LINE_WORDS as usize];

const LOAD: Ordering = Ordering::Acquire;
const STORE: Ordering = Ordering::Release;
const RMW: Ordering = Ordering::AcqRel;

pub(super) fn zeroed_words(n: u64) -> Box<[AtomicU64]> {
    (0..n).map(|_| AtomicU64::new(0)).collect()
}

/// Number of words of a read/write of `bytes` bytes, or `BadSize`.
#[inline]
fn access_words(bytes: usize) -> Result<u64, MemFault> {
    if (WORD_BYTES..=MAX_ACCESS_BYTES).contains(&bytes) && bytes.is_multiple_of(WORD_BYTES) {
        Ok((bytes / WORD_BYTES) as u64)
    } else {
        Err(MemFault::BadSize { bytes })
    }
}

/// Number of words of a request of `bytes` bytes of whole 64-byte lines (64 to
/// [`MAX_VADD_BYTES`]: a vector add, a bulk read, write or zeroing), or `BadSize`.
#[inline]
pub(super) fn line_request_words(bytes: usize) -> Result<u64, MemFault> {
    if bytes == 0 || bytes > MAX_VADD_BYTES || !bytes.is_multiple_of(MAX_ACCESS_BYTES) {
        return Err(MemFault::BadSize { bytes });
    }
    Ok((bytes / WORD_BYTES) as u64)
}

/// Wrapping add of `hi` to the high 32-bit lane and `lo` to the low lane, without carry between.
#[inline]
fn add_lanes(old: u64, hi: u32, lo: u32) -> u64 {
    let h = ((old >> 32) as u32).wrapping_add(hi);
    let l = (old as u32).wrapping_add(lo);
    (u64::from(h) << 32) | u64::from(l)
}

/// The packed lane pairs of big-endian lanes, 8 bytes per word.
#[inline]
fn be_words(data: &[u8]) -> impl DoubleEndedIterator<Item = u64> + ExactSizeIterator + '_ {
    data.chunks_exact(WORD_BYTES).map(|c| {
        let mut b = [0u8; WORD_BYTES];
        b.copy_from_slice(c);
        u64::from_be_bytes(b)
    })
}

/// Adds packed lane pairs (high lane in the high half) to `words`, lane-wise, each word in one
/// atomic step, from the last word down. Design (`benches/rmw.rs`, group `vadd32_be`, measures
/// the alternatives):
///
/// * A zero pair is skipped: adding zero changes nothing, so it linearizes anywhere.
/// * A pair whose low delta is zero is a plain 64-bit fetch-add: the high lane's carry out of
///   bit 63 is discarded, so the low lane cannot be disturbed.
/// * Any other pair is a compare-and-swap of `add_packed(old, delta)` from a fresh load; a
///   failed compare-and-swap (another thread changed the word) returns the current value and is
///   retried with it.
///
/// That is one locked instruction per non-zero word, the floor for a per-word atomic update (a
/// bare 64-bit fetch-add per word, which is wrong since the low lane carries, measures the
/// same). The words go from the last down: on the development host (AMD Zen 4) that measured
/// about 10% faster than going up when the buffer is not in cache, the same in cache, and 2.3
/// to 2.8 times faster when 2 or 4 threads add into the same buffers at the same time (going
/// up, each thread's next-line prefetches seem to pull the lines the other is about to
/// update). The order is not part of the contract: each word is atomic, the vector is not.
/// Rejected alternatives (all measured; the bench keeps the main ones):
///
/// * A fetch-add of the packed pair, then `fetch_sub(1 << 32)` when the low lane carried. The
///   final value is exact among adds, but between the two instructions the word holds a value
///   no sequential order produces (the high lane one too big): a reader or `fetch_add32` can
///   return it, and a `write`/`fetch_swap`/`masked_write`/`fetch_and`/`fetch_xor` landing in
///   between is corrupted by the fix-up (a swap to 0 ends as `0xFFFF_FFFF_0000_0000`). That
///   breaks per-word linearizability (`src/mem/stress_tests.rs`,
///   `vadd32_be_shows_no_carry_to_other_ops`, catches it), and it is slower: a second locked
///   instruction on about half the words of random data (30% slower uncontended, 2x in cache,
///   4x contended).
/// * The same with the carry guessed from a prior load and subtracted in the one fetch-add, a
///   fix-up only when the guess was wrong: slower too, and the same broken guarantee whenever
///   a guess is wrong.
/// * Loading the expected values of a batch of words before their compare-and-swaps (or
///   touching every line first, to overlap the cache misses): no faster.
/// * Starting each thread on a different line, against threads chasing each other through one
///   buffer: 10% slower uncontended, no better contended once going down.
/// * Per-line or per-vector striped locks with relaxed loads and stores: 2-3 times faster, but
///   only sound if every other read-modify-write and write of those words (counters,
///   fetch-ops, masked writes, writes) took the same lock, which would slow all of them.
#[inline]
fn vadd_words<I>(words: &[AtomicU64], deltas: I)
where
    I: DoubleEndedIterator<Item = u64> + ExactSizeIterator,
{
    debug_assert_eq!(words.len(), deltas.len());
    for (w, d) in words.iter().zip(deltas).rev() {
        if d as u32 == 0 {
            if d != 0 {
                w.fetch_add(d, RMW);
            }
            continue;
        }
        let mut old = w.load(LOAD);
        while let Err(now) = w.compare_exchange_weak(old, add_packed(old, d), RMW, LOAD) {
            old = now;
        }
    }
}

/// Applies `f` to the word atomically (compare-and-swap loop); returns the old value.
#[inline]
pub(super) fn update(w: &AtomicU64, mut f: impl FnMut(u64) -> u64) -> u64 {
    match w.fetch_update(RMW, LOAD, |old| Some(f(old))) {
        Ok(old) | Err(old) => old,
    }
}

/// A run of consecutive words, possibly split over two DRAM chunks.
pub(super) struct Span<'a> {
    head: &'a [AtomicU64],
    tail: &'a [AtomicU64],
}

impl<'a> Span<'a> {
    /// The words in address order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &'a AtomicU64> {
        self.head.iter().chain(self.tail.iter())
    }

    /// Word `i` of the span (`i` must be below the decoded length).
    pub(super) fn at(&self, i: usize) -> &'a AtomicU64 {
        match self.head.get(i) {
            Some(w) => w,
            None => &self.tail[i - self.head.len()],
        }
    }
}

/// One 4 KB stripe of the accumulator region: its words, owned by the stripe's RMW engine.
/// Every access, read or write, holds the lock, so inside it the words are plain `u64`s
/// (a vector add is an ordinary loop the compiler vectorises).
type Stripe = CachePadded<Mutex<[u64; ACC_STRIPE_WORDS as usize]>>;

/// One lazily materialised 1 MiB chunk of the accumulator region: its stripes, each
/// materialised on its first write too. Building a whole megabyte of stripes at once took
/// about half a millisecond of page faults, in the middle of the first packet that touched
/// the chunk; a stripe at a time, the cost is a page's worth and spread out.
pub(super) struct AccChunk {
    stripes: Box<[OnceLock<Box<Stripe>>]>,
}

impl AccChunk {
    /// Stripe `si`, materialised if needed.
    #[inline]
    fn stripe(&self, si: usize) -> &Stripe {
        self.stripes[si]
            .get_or_init(|| Box::new(CachePadded::new(Mutex::new([0; ACC_STRIPE_WORDS as usize]))))
    }
}

/// Asks for the lines of `n` words from `within` of `stripe` before its lock is taken, so
/// that their misses (a block's sums, often last written on another core) overlap the
/// lock's own miss instead of following it: a locked instruction lets no later load pass.
#[inline(always)]
fn prefetch_piece(stripe: &Stripe, within: usize, n: usize) {
    crate::isa::prefetch_range(stripe.data_ptr().cast::<u64>().wrapping_add(within), n);
}

/// What a stripe nobody wrote yet reads as.
static ZERO_STRIPE: [u64; ACC_STRIPE_WORDS as usize] = [0; ACC_STRIPE_WORDS as usize];

const _: () = assert!(CHUNK_WORDS.is_multiple_of(ACC_STRIPE_WORDS));

/// One bank's read-modify-write engine: its sequencer for multi-word atomic operations.
pub(super) struct Bank {
    pub(super) sequencer: CachePadded<Mutex<()>>,
}

impl SharedMemory {
    /// The bank (RMW engine) serving `addr`: 64-byte lines are interleaved across banks,
    /// `(addr / 8) % banks`. Defined for any address, mapped or not.
    #[inline]
    pub fn bank_of(&self, addr: Addr) -> usize {
        ((addr / LINE_WORDS) & self.bank_mask) as usize
    }

    /// `Ok` when the `words` words from `addr` all lie inside one region (`words == 0` is
    /// checked like 1: `addr` itself must be mapped).
    #[inline]
    pub fn check(&self, addr: Addr, words: u64) -> Result<(), MemFault> {
        let n = words.max(1);
        let fits = |base: Addr, len: u64| {
            let off = addr.wrapping_sub(base);
            off < len && n <= len - off
        };
        if fits(0, self.sram_words)
            || fits(DRAM_BASE, self.dram_words)
            || fits(ACC_BASE, self.acc_words)
        {
            Ok(())
        } else {
            Err(MemFault::OutOfRange { addr, words })
        }
    }

    /// Checks an operation as [`SharedMemory::apply`] would, without applying it.
    pub fn check_op(&self, op: &Op) -> Result<(), MemFault> {
        if let Op::FetchAdd32 { lane, .. } = *op {
            if lane > 1 {
                return Err(MemFault::BadLane { lane });
            }
        }
        self.check(op.addr(), op.words())
    }

    // ----- decoding ------------------------------------------------------------------------

    /// The sequencer lock of the bank serving `addr`.
    pub(super) fn bank_lock(&self, addr: Addr) -> MutexGuard<'_, ()> {
        self.banks[self.bank_of(addr)].sequencer.lock()
    }

    fn chunk_len(&self, ci: u64) -> u64 {
        CHUNK_WORDS.min(self.dram_words - ci * CHUNK_WORDS)
    }

    /// DRAM chunk `ci`, materialised if needed.
    fn chunk(&self, ci: u64) -> &[AtomicU64] {
        self.dram[ci as usize].get_or_init(|| zeroed_words(self.chunk_len(ci)))
    }

    /// Words `start .. start + len` of chunk `ci`; a never-written chunk yields zeros
    /// (`len` at most [`LINE_WORDS`]) without being materialised.
    fn chunk_part_ro(&self, ci: u64, start: u64, len: u64) -> &[AtomicU64] {
        match self.dram[ci as usize].get() {
            Some(c) => &c[start as usize..(start + len) as usize],
            None => {
                debug_assert!(len <= LINE_WORDS);
                &ZEROS[..len as usize]
            }
        }
    }

    // ----- the accumulator region ------------------------------------------------------------

    /// Offset of `addr` in the accumulator region when the `words` words from it (at least
    /// one) all lie inside the region.
    #[inline]
    pub(super) fn acc_offset(&self, addr: Addr, words: u64) -> Option<u64> {
        let off = addr.wrapping_sub(ACC_BASE);
        (off < self.acc_words && words.max(1) <= self.acc_words - off).then_some(off)
    }

    /// Accumulator chunk `ci`, materialised if needed.
    fn acc_chunk(&self, ci: u64) -> &AccChunk {
        self.acc[ci as usize].get_or_init(|| {
            let len = CHUNK_WORDS.min(self.acc_words - ci * CHUNK_WORDS);
            AccChunk {
                stripes: (0..len.div_ceil(ACC_STRIPE_WORDS))
                    .map(|_| OnceLock::new())
                    .collect(),
            }
        })
    }

    /// Calls `f(first, piece)` for each stripe-sized piece of the `words` accumulator words
    /// from offset `off` (all in the region): `first` is the offset of the piece's first
    /// word, `within` its index in the stripe. Shared by the locked readers and writers.
    #[inline]
    fn acc_pieces(off: u64, words: u64, mut f: impl FnMut(u64, usize, usize, usize)) {
        let mut done = 0;
        while done < words {
            let o = off + done;
            let within = (o % ACC_STRIPE_WORDS) as usize;
            let n = (ACC_STRIPE_WORDS - o % ACC_STRIPE_WORDS).min(words - done);
            f(o, within, n as usize, done as usize);
            done += n;
        }
    }

    /// Applies `f` to the `words` accumulator words from offset `off` (all in the region),
    /// one stripe at a time, each under its stripe's lock: `f(i, piece)` gets the words of one
    /// stripe and the index, within the operation, of the piece's first word. Materialises
    /// the chunks it touches.
    #[inline]
    pub(super) fn acc_locked(&self, off: u64, words: u64, mut f: impl FnMut(usize, &mut [u64])) {
        Self::acc_pieces(off, words, |o, within, n, i| {
            let chunk = self.acc_chunk(o >> CHUNK_SHIFT);
            let stripe = chunk.stripe(((o & CHUNK_MASK) / ACC_STRIPE_WORDS) as usize);
            prefetch_piece(stripe, within, n);
            let mut stripe = stripe.lock();
            f(i, &mut stripe[within..within + n]);
        });
    }

    /// [`SharedMemory::acc_locked`] for reading: a stripe nobody wrote reads as zeros and
    /// is not materialised.
    #[inline]
    pub(super) fn acc_read(&self, off: u64, words: u64, mut f: impl FnMut(usize, &[u64])) {
        Self::acc_pieces(off, words, |o, within, n, i| {
            let si = ((o & CHUNK_MASK) / ACC_STRIPE_WORDS) as usize;
            match self.acc[(o >> CHUNK_SHIFT) as usize]
                .get()
                .and_then(|chunk| chunk.stripes[si].get())
            {
                Some(stripe) => {
                    prefetch_piece(stripe, within, n);
                    f(i, &stripe.lock()[within..within + n])
                }
                None => f(i, &ZERO_STRIPE[within..within + n]),
            }
        });
    }

    /// Reads the `words` accumulator words from offset `off` into `out`, big-endian.
    #[inline]
    fn acc_read_be(&self, off: u64, words: u64, out: &mut [u8]) {
        self.acc_read(off, words, |i, piece| {
            packed_to_be(
                &mut out[i * WORD_BYTES..(i + piece.len()) * WORD_BYTES],
                piece,
            );
        });
    }

    /// The value of the accumulator word at offset `off`.
    #[inline]
    fn acc_load(&self, off: u64) -> u64 {
        let mut v = 0;
        self.acc_read(off, 1, |_, w| v = w[0]);
        v
    }

    /// A single-word read-modify-write `new = f(old)` of an accumulator word, under its
    /// stripe's lock; returns the old value. `fault` is returned when `addr` is not in the
    /// region (the fast decoder's refusal).
    #[inline(never)]
    fn acc_update(
        &self,
        addr: Addr,
        fault: MemFault,
        f: impl Fn(u64) -> u64,
    ) -> Result<u64, MemFault> {
        let off = self.acc_offset(addr, 1).ok_or(fault)?;
        let mut old = 0;
        self.acc_locked(off, 1, |_, w| {
            old = w[0];
            w[0] = f(old);
        });
        Ok(old)
    }

    /// Adds the packed lane pairs `deltas[i]` to accumulator words `off + i` (plain SWAR adds
    /// under each stripe's lock).
    #[inline(never)]
    fn acc_vadd(&self, off: u64, deltas: &[u64]) {
        self.acc_locked(off, deltas.len() as u64, |i, piece| {
            add_packed_slice(piece, &deltas[i..i + piece.len()]);
        });
    }

    /// [`SharedMemory::vadd32_be`] on the accumulator region.
    #[inline(never)]
    fn acc_vadd_be(&self, addr: Addr, fault: MemFault, data: &[u8]) -> Result<(), MemFault> {
        let words = (data.len() / WORD_BYTES) as u64;
        let off = self.acc_offset(addr, words).ok_or(fault)?;
        // The lanes usually come from a packet's tail, cold: ask for them before the stripe's
        // lock, whose line is often cold too, so that their misses overlap its miss rather
        // than follow it (a locked instruction lets no later load pass).
        crate::isa::prefetch_range(data.as_ptr(), data.len());
        self.acc_locked(off, words, |i, piece| {
            let d = &data[i * WORD_BYTES..(i + piece.len()) * WORD_BYTES];
            add_be_slice(piece, d);
        });
        Ok(())
    }

    /// The word at `addr`, for an operation that may write it.
    #[inline]
    fn word(&self, addr: Addr) -> Result<&AtomicU64, MemFault> {
        if addr < self.sram_words {
            Ok(&self.sram[addr as usize])
        } else {
            let off = addr.wrapping_sub(DRAM_BASE);
            if off < self.dram_words {
                Ok(&self.chunk(off >> CHUNK_SHIFT)[(off & CHUNK_MASK) as usize])
            } else {
                Err(MemFault::OutOfRange { addr, words: 1 })
            }
        }
    }

    /// The value of the word at `addr`.
    #[inline]
    fn load(&self, addr: Addr) -> Result<u64, MemFault> {
        if addr < self.sram_words {
            Ok(self.sram[addr as usize].load(LOAD))
        } else {
            let off = addr.wrapping_sub(DRAM_BASE);
            if off < self.dram_words {
                Ok(match self.dram[(off >> CHUNK_SHIFT) as usize].get() {
                    Some(c) => c[(off & CHUNK_MASK) as usize].load(LOAD),
                    None => 0,
                })
            } else {
                match self.acc_offset(addr, 1) {
                    Some(off) => Ok(self.acc_load(off)),
                    None => Err(MemFault::OutOfRange { addr, words: 1 }),
                }
            }
        }
    }

    /// Decodes `words` consecutive words from `addr` (at most [`LINE_WORDS`] when
    /// `!writable`). Writable spans materialise the DRAM chunks they touch.
    #[inline]
    fn decode(&self, addr: Addr, words: u64, writable: bool) -> Result<Span<'_>, MemFault> {
        let sw = self.sram_words;
        if addr < sw && words <= sw - addr {
            let a = addr as usize;
            return Ok(Span {
                head: &self.sram[a..a + words as usize],
                tail: &[],
            });
        }
        let off = addr.wrapping_sub(DRAM_BASE);
        if off < self.dram_words && words <= self.dram_words - off {
            let ci = off >> CHUNK_SHIFT;
            let within = off & CHUNK_MASK;
            let first = words.min(self.chunk_len(ci) - within);
            let rest = words - first;
            let part = |ci: u64, start: u64, len: u64| -> &[AtomicU64] {
                if len == 0 {
                    &[]
                } else if writable {
                    &self.chunk(ci)[start as usize..(start + len) as usize]
                } else {
                    self.chunk_part_ro(ci, start, len)
                }
            };
            return Ok(Span {
                head: part(ci, within, first),
                tail: part(ci + 1, 0, rest),
            });
        }
        Err(MemFault::OutOfRange { addr, words })
    }

    /// A span that will be written (materialises DRAM chunks).
    #[inline]
    pub(super) fn span(&self, addr: Addr, words: u64) -> Result<Span<'_>, MemFault> {
        self.decode(addr, words, true)
    }

    /// A span that will only be loaded from (`words <= LINE_WORDS`).
    #[inline]
    pub(super) fn span_ro(&self, addr: Addr, words: u64) -> Result<Span<'_>, MemFault> {
        debug_assert!(words <= LINE_WORDS);
        self.decode(addr, words, false)
    }

    /// The two words of a packet/byte counter.
    #[inline]
    fn pair(&self, addr: Addr) -> Result<(&AtomicU64, &AtomicU64), MemFault> {
        if addr < self.sram_words && addr + 1 < self.sram_words {
            let a = addr as usize;
            return Ok((&self.sram[a], &self.sram[a + 1]));
        }
        let s = self.span(addr, 2)?;
        Ok((s.at(0), s.at(1)))
    }

    // ----- synchronous XTXNs ------------------------------------------------------------------

    /// Reads `out.len()` bytes (8 to 64, a multiple of 8) from the words at `addr`, each word
    /// big-endian. Atomic per 8-byte word.
    pub fn read(&self, addr: Addr, out: &mut [u8]) -> Result<(), MemFault> {
        let words = access_words(out.len())?;
        let span = match self.span_ro(addr, words) {
            Ok(span) => span,
            Err(fault) => {
                let off = self.acc_offset(addr, words).ok_or(fault)?;
                self.acc_read_be(off, words, out);
                return Ok(());
            }
        };
        for (bytes, w) in out.chunks_exact_mut(WORD_BYTES).zip(span.iter()) {
            bytes.copy_from_slice(&w.load(LOAD).to_be_bytes());
        }
        Ok(())
    }

    /// Writes `data` (8 to 64 bytes, a multiple of 8) to the words at `addr`, each 8 bytes
    /// taken big-endian. Atomic per 8-byte word (never torn at the word level); whole-line
    /// atomicity is not promised.
    pub fn write(&self, addr: Addr, data: &[u8]) -> Result<(), MemFault> {
        let words = access_words(data.len())?;
        let span = match self.span(addr, words) {
            Ok(span) => span,
            Err(fault) => {
                let off = self.acc_offset(addr, words).ok_or(fault)?;
                self.acc_locked(off, words, |i, piece| {
                    for (w, v) in piece.iter_mut().zip(be_words(&data[i * WORD_BYTES..])) {
                        *w = v;
                    }
                });
                return Ok(());
            }
        };
        for (bytes, w) in data.chunks_exact(WORD_BYTES).zip(span.iter()) {
            let mut b = [0u8; WORD_BYTES];
            b.copy_from_slice(bytes);
            w.store(u64::from_be_bytes(b), STORE);
        }
        Ok(())
    }

    /// Reads one word.
    #[inline]
    pub fn read_u64(&self, addr: Addr) -> Result<u64, MemFault> {
        self.load(addr)
    }

    /// Writes one word.
    #[inline]
    pub fn write_u64(&self, addr: Addr, value: u64) -> Result<(), MemFault> {
        match self.word(addr) {
            Ok(w) => w.store(value, STORE),
            Err(fault) => drop(self.acc_update(addr, fault, |_| value)?),
        }
        Ok(())
    }

    /// The paper's `CounterIncPhys`: on the 16-byte counter at `addr`, adds 1 to the packet
    /// word `addr` and `bytes` to the byte word `addr + 1` (each wrapping, each atomic).
    #[inline]
    pub fn counter_inc(&self, addr: Addr, bytes: u64) -> Result<(), MemFault> {
        let (packets, byte_count) = match self.pair(addr) {
            Ok(pair) => pair,
            Err(fault) => return self.acc_counter_add(addr, fault, 1, bytes),
        };
        packets.fetch_add(1, RMW);
        byte_count.fetch_add(bytes, RMW);
        Ok(())
    }

    /// [`SharedMemory::counter_add`] on the accumulator region.
    #[inline(never)]
    fn acc_counter_add(
        &self,
        addr: Addr,
        fault: MemFault,
        packets: u64,
        bytes: u64,
    ) -> Result<(), MemFault> {
        let off = self.acc_offset(addr, 2).ok_or(fault)?;
        self.acc_locked(off, 2, |i, piece| {
            for (j, w) in piece.iter_mut().enumerate() {
                let d = if i + j == 0 { packets } else { bytes };
                *w = w.wrapping_add(d);
            }
        });
        Ok(())
    }

    /// Adds `packets` to the packet word `addr` and `bytes` to the byte word `addr + 1`
    /// (each wrapping, each atomic): `n` increments at once.
    #[inline]
    pub fn counter_add(&self, addr: Addr, packets: u64, bytes: u64) -> Result<(), MemFault> {
        let (p, b) = match self.pair(addr) {
            Ok(pair) => pair,
            Err(fault) => return self.acc_counter_add(addr, fault, packets, bytes),
        };
        p.fetch_add(packets, RMW);
        b.fetch_add(bytes, RMW);
        Ok(())
    }

    /// Reads a packet/byte counter: `(packets, bytes)`. The two words are read one after the
    /// other, so a concurrent increment may be seen in one and not yet in the other.
    pub fn counter_read(&self, addr: Addr) -> Result<(u64, u64), MemFault> {
        let s = match self.span_ro(addr, 2) {
            Ok(s) => s,
            Err(fault) => {
                let off = self.acc_offset(addr, 2).ok_or(fault)?;
                let mut pair = [0; 2];
                self.acc_read(off, 2, |i, piece| {
                    pair[i..i + piece.len()].copy_from_slice(piece)
                });
                return Ok((pair[0], pair[1]));
            }
        };
        Ok((s.at(0).load(LOAD), s.at(1).load(LOAD)))
    }

    /// `word &= mask`; returns the old value.
    #[inline]
    pub fn fetch_and(&self, addr: Addr, mask: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.fetch_and(mask, RMW)),
            Err(fault) => self.acc_update(addr, fault, |old| old & mask),
        }
    }

    /// `word |= mask`; returns the old value.
    #[inline]
    pub fn fetch_or(&self, addr: Addr, mask: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.fetch_or(mask, RMW)),
            Err(fault) => self.acc_update(addr, fault, |old| old | mask),
        }
    }

    /// `word ^= mask`; returns the old value.
    #[inline]
    pub fn fetch_xor(&self, addr: Addr, mask: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.fetch_xor(mask, RMW)),
            Err(fault) => self.acc_update(addr, fault, |old| old ^ mask),
        }
    }

    /// Clears the bits of `mask` (`word &= !mask`); returns the old value.
    #[inline]
    pub fn fetch_clear(&self, addr: Addr, mask: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.fetch_and(!mask, RMW)),
            Err(fault) => self.acc_update(addr, fault, |old| old & !mask),
        }
    }

    /// Stores `value`; returns the old value.
    #[inline]
    pub fn fetch_swap(&self, addr: Addr, value: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.swap(value, RMW)),
            Err(fault) => self.acc_update(addr, fault, |_| value),
        }
    }

    /// `new = (old & !mask) | (value & mask)`; returns the old value.
    #[inline]
    pub fn masked_write(&self, addr: Addr, value: u64, mask: u64) -> Result<u64, MemFault> {
        let w = match self.word(addr) {
            Ok(w) => w,
            Err(fault) => {
                return self.acc_update(addr, fault, |old| (old & !mask) | (value & mask))
            }
        };
        Ok(match mask {
            0 => w.load(LOAD),
            u64::MAX => w.swap(value, RMW),
            _ => update(w, |old| (old & !mask) | (value & mask)),
        })
    }

    /// 64-bit wrapping `word += delta`; returns the old value. One atomic instruction in
    /// SRAM and DRAM, as the other fetch-ops (a packet/byte counter is two words: use
    /// [`SharedMemory::counter_inc`] for it).
    #[inline]
    pub fn fetch_add(&self, addr: Addr, delta: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.fetch_add(delta, RMW)),
            Err(fault) => self.acc_update(addr, fault, |old| old.wrapping_add(delta)),
        }
    }

    /// `word = max(word, value)`, unsigned; returns the old value. One atomic instruction in
    /// SRAM and DRAM. A word that only ever rises (a clock's latest reading kept by many
    /// threads) never goes back, whatever order the requests arrive in.
    #[inline]
    pub fn fetch_max(&self, addr: Addr, value: u64) -> Result<u64, MemFault> {
        match self.word(addr) {
            Ok(w) => Ok(w.fetch_max(value, RMW)),
            Err(fault) => self.acc_update(addr, fault, |old| old.max(value)),
        }
    }

    /// 32-bit wrapping add of `delta` to one half of the word. Lanes follow the byte order
    /// of [`SharedMemory::read`] (network order): lane 0 is the word's first 4 bytes, the
    /// high half of the `u64` (`word >> 32`); lane 1 its last 4 bytes, the low half
    /// (`word as u32`). So after `write_u64(a, 0x0000_0001_0000_0002)`, lane 0 holds 1 and
    /// lane 1 holds 2. The other half never changes (no carry across). Returns the lane's old
    /// value; a lane above 1 is [`MemFault::BadLane`].
    #[inline]
    pub fn fetch_add32(&self, addr: Addr, lane: u8, delta: u32) -> Result<u32, MemFault> {
        match lane {
            // A carry out of bit 63 is discarded, so a plain 64-bit add never disturbs the
            // low half: the high lane needs no compare-and-swap.
            0 => {
                let old = match self.word(addr) {
                    Ok(w) => w.fetch_add(u64::from(delta) << 32, RMW),
                    Err(fault) => self.acc_update(addr, fault, |old| add_lanes(old, delta, 0))?,
                };
                Ok((old >> 32) as u32)
            }
            1 => {
                let old = match self.word(addr) {
                    Ok(w) => update(w, |old| add_lanes(old, 0, delta)),
                    Err(fault) => self.acc_update(addr, fault, |old| add_lanes(old, 0, delta))?,
                };
                Ok(old as u32)
            }
            _ => Err(MemFault::BadLane { lane }),
        }
    }

    /// Sixteen 32-bit wrapping adds over the 8 words (64 bytes) at `addr`: lane `2i` is the
    /// high half of word `addr + i`, lane `2i + 1` its low half; each lane wraps on its own.
    /// Atomic per 8-byte word: concurrent vector adds never lose a lane update, but a reader
    /// may see some words updated and others not yet. Same code as [`SharedMemory::vadd32_be`].
    pub fn vadd32x16(&self, addr: Addr, deltas: &[u32; 16]) -> Result<(), MemFault> {
        let packed: [u64; LINE_WORDS as usize] = std::array::from_fn(|i| {
            (u64::from(deltas[2 * i]) << 32) | u64::from(deltas[2 * i + 1])
        });
        self.vadd_packed(addr, &packed)
    }

    /// Lane-wise 32-bit wrapping adds of packed lane pairs: `deltas[i]` (lane 0 in its high
    /// half, as words hold lanes) is added to word `addr + i`, each lane wrapping on its own.
    /// What [`SharedMemory::vadd32x16`] and a posted [`SharedMemory::vadd32_be`] apply once
    /// their lanes are packed; the same guarantees. At most [`MAX_VADD_BYTES`] / 8 words.
    #[inline]
    pub(super) fn vadd_packed(&self, addr: Addr, deltas: &[u64]) -> Result<(), MemFault> {
        debug_assert!(deltas.len() * WORD_BYTES <= MAX_VADD_BYTES);
        let words = deltas.len() as u64;
        let span = match self.span(addr, words) {
            Ok(span) => span,
            Err(fault) => {
                let off = self.acc_offset(addr, words).ok_or(fault)?;
                self.acc_vadd(off, deltas);
                return Ok(());
            }
        };
        let (head, tail) = deltas.split_at(span.head.len());
        vadd_words(span.tail, tail.iter().copied());
        vadd_words(span.head, head.iter().copied());
        Ok(())
    }

    /// Reads `out.len()` bytes (64 to [`MAX_VADD_BYTES`], whole 64-byte lines, else
    /// [`MemFault::BadSize`]) from the words at `addr`, each word big-endian: the same as one
    /// [`SharedMemory::read`] per line, in order (the range is checked first), with the same
    /// per-word guarantees. In the accumulator region a stripe's lock is taken once for all
    /// the lines in it, instead of once per line: that is what a bulk pull (a Result's 256
    /// bytes of sums) is for.
    pub fn read_lines(&self, addr: Addr, out: &mut [u8]) -> Result<(), MemFault> {
        let words = line_request_words(out.len())?;
        if let Some(off) = self.acc_offset(addr, words) {
            self.acc_read_be(off, words, out);
            return Ok(());
        }
        self.check(addr, words)?;
        for (i, line) in out.chunks_exact_mut(MAX_ACCESS_BYTES).enumerate() {
            self.read(addr + (i as u64) * LINE_WORDS, line)?;
        }
        Ok(())
    }

    /// Lane-wise 32-bit wrapping adds of a vector of big-endian lanes, as gradients sit in a
    /// packet, into the words from `addr`: `data` is 1 to 64 whole lines (64 to
    /// [`MAX_VADD_BYTES`] bytes, a multiple of 64, else [`MemFault::BadSize`]); its 4-byte lane
    /// `l` is added to lane `l % 2` of word `addr + l / 2` (lane 0 = high half = the word's
    /// first 4 bytes in network order), each lane wrapping on its own. The whole range is
    /// checked first: out of range, nothing is applied. Same per-word guarantees as
    /// [`SharedMemory::vadd32x16`] (each word's update is one atomic step, so concurrent adds
    /// never lose an update; the vector as a whole is not atomic).
    ///
    /// There is deliberately no posted [`Op`] form: an `Op` is `Copy`, owned and small (at most
    /// a 64-byte payload, buffered by value in every PPE thread's posted-XTXN buffer). A 4 KB
    /// array inside it would make every buffered op of every kind 4 KB, and borrowing the
    /// packet's bytes would put a lifetime on `Op` and keep the packet alive until the flush.
    /// To post a vector add, use [`crate::program::Thread::post_vadd32_be`], which keeps the
    /// pending lanes in a buffer of its own (and merges adds that continue one another).
    pub fn vadd32_be(&self, addr: Addr, data: &[u8]) -> Result<(), MemFault> {
        let words = line_request_words(data.len())?;
        let span = match self.span(addr, words) {
            Ok(span) => span,
            Err(fault) => return self.acc_vadd_be(addr, fault, data),
        };
        let (head, tail) = data.split_at(span.head.len() * WORD_BYTES);
        vadd_words(span.tail, be_words(tail));
        vadd_words(span.head, be_words(head));
        Ok(())
    }

    /// Writes `data` (64 to 4096 bytes, whole 64-byte lines) to the words from `addr` in one
    /// request, each 8 bytes taken big-endian as [`SharedMemory::write`] takes them: the
    /// mirror of [`SharedMemory::read_lines`], e.g. to fill a fresh aggregation buffer with
    /// a packet's big-endian lanes (the words a vector add of them into zeros would leave).
    /// Atomic per word; the range is checked before anything is written.
    pub fn write_lines(&self, addr: Addr, data: &[u8]) -> Result<(), MemFault> {
        let words = line_request_words(data.len())?;
        match self.span(addr, words) {
            Ok(span) => span
                .iter()
                .zip(be_words(data))
                .for_each(|(w, v)| w.store(v, STORE)),
            Err(fault) => {
                let off = self.acc_offset(addr, words).ok_or(fault)?;
                // As for a vector add: the data's lines asked for before the stripe's lock.
                crate::isa::prefetch_range(data.as_ptr(), data.len());
                self.acc_locked(off, words, |i, piece| {
                    be_to_packed(piece, &data[i * WORD_BYTES..(i + piece.len()) * WORD_BYTES]);
                });
            }
        }
        Ok(())
    }

    /// Zeroes `bytes` bytes from `addr` (64 to 4096, whole 64-byte lines) in one request,
    /// e.g. to clear an aggregation buffer. Atomic per word; the range is checked before
    /// anything is written.
    pub fn zero(&self, addr: Addr, bytes: usize) -> Result<(), MemFault> {
        let words = line_request_words(bytes)?;
        match self.span(addr, words) {
            Ok(span) => span.iter().for_each(|w| w.store(0, STORE)),
            Err(fault) => {
                let off = self.acc_offset(addr, words).ok_or(fault)?;
                self.acc_locked(off, words, |_, piece| piece.fill(0));
            }
        }
        Ok(())
    }

    /// Backs the `words` words from `addr` with storage now, as a first write would (DRAM
    /// chunks, accumulator stripes; SRAM always is), without changing any word. For the
    /// control plane, when it sets up a region the data path will write: the packets that
    /// then use it do not pay for the allocation and its page faults. Checked like any
    /// access: out of range, nothing is materialised.
    pub fn materialise(&self, addr: Addr, words: u64) -> Result<(), MemFault> {
        self.check(addr, words)?;
        // As for `check`, a range of no words stands for its first word.
        let last = words.max(1) - 1;
        if let Some(off) = self.acc_offset(addr, words) {
            for s in off / ACC_STRIPE_WORDS..=(off + last) / ACC_STRIPE_WORDS {
                let o = s * ACC_STRIPE_WORDS;
                self.acc_chunk(o >> CHUNK_SHIFT)
                    .stripe(((o & CHUNK_MASK) / ACC_STRIPE_WORDS) as usize);
            }
        } else {
            // In range and not the accumulator: SRAM (an offset past DRAM here) or DRAM.
            let off = addr.wrapping_sub(DRAM_BASE);
            if off < self.dram_words {
                for ci in off >> CHUNK_SHIFT..=(off + last) >> CHUNK_SHIFT {
                    self.chunk(ci);
                }
            }
        }
        Ok(())
    }

    /// Applies a posted operation (old values are discarded).
    pub fn apply(&self, op: &Op) -> Result<(), MemFault> {
        match *op {
            Op::WriteU64 { addr, value } => self.write_u64(addr, value),
            Op::CounterInc { addr, bytes } => self.counter_inc(addr, bytes),
            Op::CounterAdd {
                addr,
                packets,
                bytes,
            } => self.counter_add(addr, packets, bytes),
            Op::FetchAnd { addr, mask } => self.fetch_and(addr, mask).map(drop),
            Op::FetchOr { addr, mask } => self.fetch_or(addr, mask).map(drop),
            Op::FetchXor { addr, mask } => self.fetch_xor(addr, mask).map(drop),
            Op::FetchClear { addr, mask } => self.fetch_clear(addr, mask).map(drop),
            Op::FetchSwap { addr, value } => self.fetch_swap(addr, value).map(drop),
            Op::MaskedWrite { addr, value, mask } => self.masked_write(addr, value, mask).map(drop),
            Op::FetchAdd { addr, delta } => self.fetch_add(addr, delta).map(drop),
            Op::FetchMax { addr, value } => self.fetch_max(addr, value).map(drop),
            Op::FetchAdd32 { addr, lane, delta } => self.fetch_add32(addr, lane, delta).map(drop),
            Op::Vadd32x16 { addr, ref deltas } => self.vadd32x16(addr, deltas),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{MemConfig, Region, DRAM_BASE};
    use super::*;

    const SRAM_WORDS: u64 = 1024;
    const DRAM_WORDS: u64 = 2 * CHUNK_WORDS + 64;

    fn mem() -> SharedMemory {
        SharedMemory::new(&MemConfig {
            sram_bytes: SRAM_WORDS * 8,
            dram_bytes: DRAM_WORDS * 8,
            acc_bytes: DRAM_WORDS * 8,
            banks: 16,
        })
        .unwrap()
    }

    fn oor(addr: Addr, words: u64) -> MemFault {
        MemFault::OutOfRange { addr, words }
    }

    #[test]
    fn is_send_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SharedMemory>();
    }

    #[test]
    fn new_refuses_bad_config() {
        let e = SharedMemory::new(&MemConfig {
            banks: 5,
            ..MemConfig::default()
        })
        .unwrap_err();
        assert_eq!(e.setting, "banks");
    }

    #[test]
    fn default_config_builds_without_touching_dram() {
        let m = SharedMemory::new(&MemConfig::default()).unwrap();
        let dram = m.region(Region::Dram);
        assert_eq!(dram.end - dram.start, 8 << 20);
        assert_eq!(m.read_u64(dram.end - 1), Ok(0));
        let mut buf = [0xAAu8; 64];
        m.read(dram.start + 100, &mut buf).unwrap();
        assert_eq!(buf, [0u8; 64]);
        assert!(format!("{m:?}").contains("dram_chunks_materialised: 0"));
        m.write_u64(dram.end - 1, 7).unwrap();
        assert_eq!(m.read_u64(dram.end - 1), Ok(7));
        assert!(format!("{m:?}").contains("dram_chunks_materialised: 1"));
    }

    #[test]
    fn regions_and_banks() {
        let m = mem();
        assert_eq!(m.region(Region::Sram), 0..SRAM_WORDS);
        assert_eq!(m.region(Region::Dram), DRAM_BASE..DRAM_BASE + DRAM_WORDS);
        assert_eq!(m.bank_of(0), 0);
        assert_eq!(m.bank_of(7), 0);
        assert_eq!(m.bank_of(8), 1);
        assert_eq!(m.bank_of(15 * 8 + 7), 15);
        assert_eq!(m.bank_of(16 * 8), 0);
        assert_eq!(m.bank_of(DRAM_BASE + 8 * 3 + 5), 3);
        // an 8-word aligned line is in one bank
        for line in 0..64u64 {
            let b = m.bank_of(line * 8);
            assert!((0..8).all(|i| m.bank_of(line * 8 + i) == b));
        }
        let no_dram = SharedMemory::new(&MemConfig {
            sram_bytes: 64,
            dram_bytes: 0,
            acc_bytes: 0,
            banks: 1,
        })
        .unwrap();
        assert!(no_dram.region(Region::Dram).is_empty());
        assert_eq!(no_dram.read_u64(DRAM_BASE), Err(oor(DRAM_BASE, 1)));
        assert_eq!(no_dram.bank_of(12345), 0);
    }

    #[test]
    fn check_ranges() {
        let m = mem();
        let dend = DRAM_BASE + DRAM_WORDS;
        assert_eq!(m.check(0, 1), Ok(()));
        assert_eq!(m.check(0, SRAM_WORDS), Ok(()));
        assert_eq!(m.check(SRAM_WORDS - 1, 1), Ok(()));
        assert_eq!(m.check(SRAM_WORDS - 1, 0), Ok(()));
        assert_eq!(m.check(SRAM_WORDS - 1, 2), Err(oor(SRAM_WORDS - 1, 2)));
        assert_eq!(m.check(SRAM_WORDS, 1), Err(oor(SRAM_WORDS, 1)));
        assert_eq!(m.check(SRAM_WORDS, 0), Err(oor(SRAM_WORDS, 0)));
        assert_eq!(m.check(DRAM_BASE - 1, 1), Err(oor(DRAM_BASE - 1, 1)));
        assert_eq!(m.check(DRAM_BASE - 1, 2), Err(oor(DRAM_BASE - 1, 2)));
        assert_eq!(m.check(DRAM_BASE, 8), Ok(()));
        assert_eq!(m.check(dend - 1, 1), Ok(()));
        assert_eq!(m.check(dend - 8, 8), Ok(()));
        assert_eq!(m.check(dend - 7, 8), Err(oor(dend - 7, 8)));
        assert_eq!(m.check(dend, 1), Err(oor(dend, 1)));
        assert_eq!(m.check(u64::MAX, 1), Err(oor(u64::MAX, 1)));
        assert_eq!(m.check(0, u64::MAX), Err(oor(0, u64::MAX)));
        assert_eq!(m.check(DRAM_BASE, u64::MAX), Err(oor(DRAM_BASE, u64::MAX)));
    }

    /// Every operation refuses, without side effects, an access that is out of range at
    /// `addr` (with `words` words), and `Op`-based `apply`/`check_op` agree.
    fn all_ops_fault_at(m: &SharedMemory, addr: Addr) {
        let f1 = oor(addr, 1);
        let mut b8 = [0u8; 8];
        assert_eq!(m.read(addr, &mut b8).map(drop), Err(f1));
        assert_eq!(m.write(addr, &b8).map(drop), Err(f1));
        assert_eq!(m.read_u64(addr).map(drop), Err(f1));
        assert_eq!(m.write_u64(addr, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_and(addr, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_or(addr, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_xor(addr, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_clear(addr, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_swap(addr, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_add(addr, 1).map(drop), Err(f1));
        assert_eq!(m.masked_write(addr, 1, 1).map(drop), Err(f1));
        assert_eq!(m.masked_write(addr, 1, 0).map(drop), Err(f1));
        assert_eq!(m.masked_write(addr, 1, u64::MAX).map(drop), Err(f1));
        assert_eq!(m.fetch_add32(addr, 0, 1).map(drop), Err(f1));
        assert_eq!(m.fetch_add32(addr, 1, 1).map(drop), Err(f1));
        assert_eq!(m.counter_inc(addr, 1), Err(oor(addr, 2)));
        assert_eq!(m.counter_read(addr), Err(oor(addr, 2)));
        assert_eq!(m.vadd32x16(addr, &[1; 16]), Err(oor(addr, 8)));
        assert_eq!(m.vadd32_be(addr, &[1; 64]), Err(oor(addr, 8)));
        assert_eq!(m.vadd32_be(addr, &[1; 4096]), Err(oor(addr, 512)));
        let mut b64 = [0u8; 64];
        assert_eq!(m.read(addr, &mut b64), Err(oor(addr, 8)));
        assert_eq!(m.write(addr, &b64), Err(oor(addr, 8)));
        let ops = [
            Op::WriteU64 { addr, value: 1 },
            Op::CounterInc { addr, bytes: 1 },
            Op::FetchAnd { addr, mask: 1 },
            Op::FetchOr { addr, mask: 1 },
            Op::FetchXor { addr, mask: 1 },
            Op::FetchClear { addr, mask: 1 },
            Op::FetchSwap { addr, value: 1 },
            Op::FetchAdd { addr, delta: 1 },
            Op::FetchMax { addr, value: 1 },
            Op::MaskedWrite {
                addr,
                value: 1,
                mask: 1,
            },
            Op::FetchAdd32 {
                addr,
                lane: 1,
                delta: 1,
            },
            Op::Vadd32x16 {
                addr,
                deltas: [1; 16],
            },
        ];
        for op in ops {
            let e = Err(oor(addr, op.words()));
            assert_eq!(m.apply(&op), e, "{op:?}");
            assert_eq!(m.check_op(&op), e, "{op:?}");
        }
    }

    #[test]
    fn every_op_faults_out_of_range() {
        let m = mem();
        let dend = DRAM_BASE + DRAM_WORDS;
        for addr in [
            SRAM_WORDS,
            SRAM_WORDS + 1,
            DRAM_BASE / 2,
            DRAM_BASE - 1,
            dend,
            dend + 100,
            u64::MAX,
            u64::MAX - 1,
        ] {
            all_ops_fault_at(&m, addr);
        }
        // nothing was written anywhere by the refused operations
        for a in m.region(Region::Sram) {
            assert_eq!(m.read_u64(a), Ok(0));
        }
        assert!(format!("{m:?}").contains("dram_chunks_materialised: 0"));
    }

    #[test]
    fn multi_word_ops_fault_when_running_off_a_region_end() {
        let m = mem();
        let dend = DRAM_BASE + DRAM_WORDS;
        for end in [SRAM_WORDS, dend] {
            // the last word is fine for single-word ops
            assert_eq!(m.fetch_or(end - 1, 1), Ok(0));
            assert_eq!(m.read_u64(end - 1), Ok(1));
            assert_eq!(m.fetch_add32(end - 1, 1, 1), Ok(1));
            // two-word and eight-word ops that would cross the end are refused
            assert_eq!(m.counter_inc(end - 1, 5), Err(oor(end - 1, 2)));
            assert_eq!(m.counter_read(end - 1), Err(oor(end - 1, 2)));
            assert_eq!(m.counter_inc(end - 2, 5), Ok(()));
            assert_eq!(m.counter_read(end - 2), Ok((1, 7)));
            assert_eq!(m.vadd32x16(end - 7, &[1; 16]), Err(oor(end - 7, 8)));
            assert_eq!(m.vadd32x16(end - 8, &[0; 16]), Ok(()));
            // a 64-line vector add running one word off the end: nothing applied
            assert_eq!(m.vadd32_be(end - 511, &[1; 4096]), Err(oor(end - 511, 512)));
            assert_eq!(m.vadd32_be(end - 9, &[1; 128]), Err(oor(end - 9, 16)));
            let mut b16 = [0u8; 16];
            assert_eq!(m.read(end - 1, &mut b16), Err(oor(end - 1, 2)));
            assert_eq!(m.write(end - 1, &b16), Err(oor(end - 1, 2)));
            assert_eq!(m.read(end - 2, &mut b16), Ok(()));
            // the refused ops left the last word as it was: 1, +1 in the low lane, +5 bytes
            assert_eq!(m.read_u64(end - 1), Ok(7));
            assert!((end - 511..end - 2).all(|a| m.read_u64(a) == Ok(0)));
        }
    }

    #[test]
    fn bad_sizes() {
        let m = mem();
        for n in [0usize, 1, 7, 9, 12, 63, 65, 72, 128] {
            let mut buf = vec![0u8; n];
            assert_eq!(m.read(0, &mut buf), Err(MemFault::BadSize { bytes: n }));
            assert_eq!(m.write(0, &buf), Err(MemFault::BadSize { bytes: n }));
        }
        // size is checked before the address
        assert_eq!(
            m.read(u64::MAX, &mut [0u8; 3]),
            Err(MemFault::BadSize { bytes: 3 })
        );
        for n in (8..=64).step_by(8) {
            let data: Vec<u8> = (0..n as u8).collect();
            m.write(16, &data).unwrap();
            let mut back = vec![0u8; n];
            m.read(16, &mut back).unwrap();
            assert_eq!(back, data);
        }
    }

    #[test]
    fn bad_lane() {
        let m = mem();
        for lane in [2u8, 3, 255] {
            assert_eq!(m.fetch_add32(0, lane, 1), Err(MemFault::BadLane { lane }));
            let op = Op::FetchAdd32 {
                addr: 0,
                lane,
                delta: 1,
            };
            assert_eq!(m.apply(&op), Err(MemFault::BadLane { lane }));
            assert_eq!(m.check_op(&op), Err(MemFault::BadLane { lane }));
        }
        assert_eq!(m.read_u64(0), Ok(0));
    }

    #[test]
    fn big_endian_round_trip() {
        let m = mem();
        for base in [40, DRAM_BASE + 40] {
            m.write_u64(base, 0x0102_0304_0506_0708).unwrap();
            let mut b = [0u8; 8];
            m.read(base, &mut b).unwrap();
            assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
            m.write(
                base + 1,
                &[
                    0xA0, 0xA1, 0xA2, 0xA3, 0xA4, 0xA5, 0xA6, 0xA7, 9, 0, 0, 0, 0, 0, 0, 1,
                ],
            )
            .unwrap();
            assert_eq!(m.read_u64(base + 1), Ok(0xA0A1_A2A3_A4A5_A6A7));
            assert_eq!(m.read_u64(base + 2), Ok(0x0900_0000_0000_0001));
            let mut b24 = [0u8; 24];
            m.read(base, &mut b24).unwrap();
            assert_eq!(&b24[..8], &[1, 2, 3, 4, 5, 6, 7, 8]);
            assert_eq!(b24[8], 0xA0);
            assert_eq!(b24[23], 1);
        }
    }

    #[test]
    fn dram_access_spanning_two_chunks() {
        let m = mem();
        let boundary = DRAM_BASE + CHUNK_WORDS;
        // read-only over untouched chunks: zeros
        let mut b = [0xFFu8; 64];
        m.read(boundary - 3, &mut b).unwrap();
        assert_eq!(b, [0u8; 64]);
        let data: Vec<u8> = (1..=64).collect();
        m.write(boundary - 3, &data).unwrap();
        m.read(boundary - 3, &mut b).unwrap();
        assert_eq!(&b[..], &data[..]);
        assert_eq!(
            m.read_u64(boundary),
            Ok(u64::from_be_bytes([25, 26, 27, 28, 29, 30, 31, 32]))
        );
        m.counter_inc(boundary - 1, 9).unwrap();
        assert_eq!(
            m.read_u64(boundary - 1).unwrap(),
            u64::from_be_bytes([17, 18, 19, 20, 21, 22, 23, 24]) + 1
        );
        m.vadd32x16(boundary - 4, &[1; 16]).unwrap();
        assert_eq!(
            m.read_u64(boundary + 3),
            Ok(u64::from_be_bytes([49, 50, 51, 52, 53, 54, 55, 56]) + 0x0000_0001_0000_0001)
        );
        // reading across into a chunk nobody touched
        let last = DRAM_BASE + 2 * CHUNK_WORDS;
        m.write_u64(last - 1, 5).unwrap();
        let mut b16 = [0u8; 16];
        m.read(last - 1, &mut b16).unwrap();
        assert_eq!(b16[7], 5);
        assert_eq!(&b16[8..], &[0u8; 8]);
        assert_eq!(m.counter_read(last - 1), Ok((5, 0)));
    }

    #[test]
    fn masked_write_semantics() {
        let m = mem();
        m.write_u64(3, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(
            m.masked_write(3, 0xAAAA_AAAA_AAAA_AAAA, 0x0000_FFFF_0000_00F0),
            Ok(0x1122_3344_5566_7788)
        );
        assert_eq!(m.read_u64(3), Ok(0x1122_AAAA_5566_77A8));
        assert_eq!(m.masked_write(3, 0xDEAD, 0), Ok(0x1122_AAAA_5566_77A8));
        assert_eq!(m.read_u64(3), Ok(0x1122_AAAA_5566_77A8));
        assert_eq!(
            m.masked_write(3, 0xDEAD, u64::MAX),
            Ok(0x1122_AAAA_5566_77A8)
        );
        assert_eq!(m.read_u64(3), Ok(0xDEAD));
    }

    #[test]
    fn fetch_ops_return_old_values() {
        let m = mem();
        let a = DRAM_BASE + 9;
        m.write_u64(a, 0b1100).unwrap();
        assert_eq!(m.fetch_and(a, 0b1010), Ok(0b1100));
        assert_eq!(m.read_u64(a), Ok(0b1000));
        assert_eq!(m.fetch_or(a, 0b0011), Ok(0b1000));
        assert_eq!(m.read_u64(a), Ok(0b1011));
        assert_eq!(m.fetch_xor(a, 0b0110), Ok(0b1011));
        assert_eq!(m.read_u64(a), Ok(0b1101));
        assert_eq!(m.fetch_clear(a, 0b0101), Ok(0b1101));
        assert_eq!(m.read_u64(a), Ok(0b1000));
        assert_eq!(m.fetch_swap(a, u64::MAX), Ok(0b1000));
        assert_eq!(m.fetch_swap(a, 1), Ok(u64::MAX));
        assert_eq!(m.read_u64(a), Ok(1));
    }

    #[test]
    fn fetch_max_only_raises_the_word_in_every_region() {
        let m = mem();
        for a in [5, DRAM_BASE + 5, ACC_BASE + 5] {
            assert_eq!(m.fetch_max(a, 10), Ok(0));
            assert_eq!(m.fetch_max(a, 7), Ok(10), "a lower value leaves it");
            assert_eq!(m.fetch_max(a, u64::MAX), Ok(10));
            assert_eq!(m.read_u64(a), Ok(u64::MAX));
        }
    }

    #[test]
    fn fetch_add_is_a_wrapping_64_bit_add_in_every_region() {
        let m = mem();
        for a in [5, DRAM_BASE + 9, ACC_BASE + 3] {
            m.write_u64(a, 0xFFFF_FFFF).unwrap();
            // A carry out of the low half reaches the high half: one 64-bit lane.
            assert_eq!(m.fetch_add(a, 1), Ok(0xFFFF_FFFF));
            assert_eq!(m.read_u64(a), Ok(1 << 32));
            m.write_u64(a, u64::MAX).unwrap();
            assert_eq!(m.fetch_add(a, 3), Ok(u64::MAX));
            assert_eq!(m.read_u64(a), Ok(2), "wraps");
            assert_eq!(m.fetch_add(a, 0), Ok(2));
        }
    }

    #[test]
    fn fetch_add32_lane_0_is_the_first_four_bytes() {
        let m = mem();
        m.write_u64(7, 0x0000_0001_0000_0002).unwrap();
        assert_eq!(m.fetch_add32(7, 0, 0), Ok(1));
        assert_eq!(m.fetch_add32(7, 1, 0), Ok(2));
        m.fetch_add32(7, 0, 0x0A0B_0C0C).unwrap();
        let mut b = [0u8; 8];
        m.read(7, &mut b).unwrap();
        assert_eq!(b, [0x0A, 0x0B, 0x0C, 0x0D, 0, 0, 0, 2]);
    }

    #[test]
    fn add32_lanes_do_not_carry() {
        let m = mem();
        m.write_u64(5, 0x1234_5678_FFFF_FFFF).unwrap();
        assert_eq!(m.fetch_add32(5, 1, 1), Ok(0xFFFF_FFFF));
        assert_eq!(m.read_u64(5), Ok(0x1234_5678_0000_0000));
        m.write_u64(5, 0xFFFF_FFFF_0000_0007).unwrap();
        assert_eq!(m.fetch_add32(5, 0, 2), Ok(0xFFFF_FFFF));
        assert_eq!(m.read_u64(5), Ok(0x0000_0001_0000_0007));
        assert_eq!(m.fetch_add32(5, 0, 0xFFFF_FFFF), Ok(1)); // i.e. -1
        assert_eq!(m.read_u64(5), Ok(0x0000_0000_0000_0007));
        assert_eq!(m.fetch_add32(5, 1, 0xFFFF_FFF9), Ok(7));
        assert_eq!(m.read_u64(5), Ok(0));
        // lane 0 is the first 4 bytes in network order
        m.fetch_add32(6, 0, 0x0102_0304).unwrap();
        m.fetch_add32(6, 1, 0x0506_0708).unwrap();
        let mut b = [0u8; 8];
        m.read(6, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8]);
    }

    #[test]
    fn add_packed_is_two_independent_wrapping_lanes() {
        let edge = [
            0u32,
            1,
            2,
            0x7FFF_FFFF,
            0x8000_0000,
            0x8000_0001,
            0xFFFF_FFFE,
            u32::MAX,
        ];
        let mut x = 0x0123_4567_89AB_CDEFu64;
        let mut vals: Vec<u32> = edge.to_vec();
        for _ in 0..24 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            vals.push((x >> 32) as u32);
        }
        let pack = |h: u32, l: u32| (u64::from(h) << 32) | u64::from(l);
        for &oh in &vals {
            for &ol in &vals {
                for (&dh, &dl) in vals.iter().zip(vals.iter().rev()) {
                    assert_eq!(
                        add_packed(pack(oh, ol), pack(dh, dl)),
                        pack(oh.wrapping_add(dh), ol.wrapping_add(dl)),
                        "{oh:#x}:{ol:#x} + {dh:#x}:{dl:#x}"
                    );
                    assert_eq!(
                        add_packed(pack(oh, ol), pack(dh, dl)),
                        add_lanes(pack(oh, ol), dh, dl)
                    );
                }
            }
        }
    }

    /// The `u32` lanes of `n` words from `addr`, in lane order.
    fn lanes(m: &SharedMemory, addr: Addr, n: u64) -> Vec<u32> {
        (0..n)
            .flat_map(|i| {
                let w = m.read_u64(addr + i).unwrap();
                [(w >> 32) as u32, w as u32]
            })
            .collect()
    }

    fn be_lanes(v: &[u32]) -> Vec<u8> {
        v.iter().flat_map(|l| l.to_be_bytes()).collect()
    }

    #[test]
    fn vadd32_be_adds_big_endian_lanes() {
        let m = mem();
        for base in [72, DRAM_BASE + CHUNK_WORDS - 100] {
            for lines in [1usize, 2, 7, 64] {
                let n = 8 * lines as u64;
                let init: Vec<u32> = (0..2 * n as u32)
                    .map(|l| l.wrapping_mul(0x9E37_79B9))
                    .collect();
                for (i, pair) in init.chunks_exact(2).enumerate() {
                    m.write_u64(
                        base + i as u64,
                        (u64::from(pair[0]) << 32) | u64::from(pair[1]),
                    )
                    .unwrap();
                }
                let deltas: Vec<u32> = (0..2 * n as u32)
                    .map(|l| match l % 5 {
                        0 => 0,
                        1 => u32::MAX,
                        _ => l.wrapping_mul(0x0101_0101) ^ 0x8000_0000,
                    })
                    .collect();
                m.vadd32_be(base, &be_lanes(&deltas)).unwrap();
                let want: Vec<u32> = init
                    .iter()
                    .zip(&deltas)
                    .map(|(a, d)| a.wrapping_add(*d))
                    .collect();
                assert_eq!(lanes(&m, base, n), want, "{lines} lines at {base:#x}");
                // the words around are untouched
                assert_eq!(m.read_u64(base - 1), Ok(0));
                assert_eq!(m.read_u64(base + n), Ok(0));
                for i in 0..n {
                    m.write_u64(base + i, 0).unwrap();
                }
            }
        }
        // the lanes sit as `read` shows them: lane l is bytes 4l..4l+4
        let data: Vec<u8> = (1..=64).collect();
        m.vadd32_be(8, &data).unwrap();
        let mut back = [0u8; 64];
        m.read(8, &mut back).unwrap();
        assert_eq!(&back[..], &data[..]);
    }

    /// Vector adds from 70 threads, one after the other, over DRAM chunk boundaries.
    #[test]
    fn vadd32_be_from_many_threads_across_chunks() {
        let m = mem();
        let boundary = DRAM_BASE + CHUNK_WORDS;
        let second = boundary + CHUNK_WORDS;
        for (base, lines) in [(boundary - 100, 64usize), (second - 20, 7), (100, 3)] {
            let words = 8 * lines as u64;
            let deltas: Vec<u32> = (0..2 * words as u32).map(|l| l * 0x0001_0003 + 1).collect();
            let data = be_lanes(&deltas);
            std::thread::scope(|s| {
                for _ in 0..70 {
                    s.spawn(|| m.vadd32_be(base, &data).unwrap())
                        .join()
                        .unwrap();
                }
            });
            let want: Vec<u32> = deltas.iter().map(|d| d.wrapping_mul(70)).collect();
            assert_eq!(lanes(&m, base, words), want, "{lines} lines at {base:#x}");
            assert_eq!(m.read_u64(base - 1), Ok(0));
            assert_eq!(m.read_u64(base + words), Ok(0));
        }
    }

    #[test]
    fn vadd32_be_lanes_wrap_without_carry() {
        let m = mem();
        let a = DRAM_BASE + 16;
        // low lane: 0xFFFF_FFFF + 1 wraps to 0 and leaves the high lane alone (and vice versa)
        m.write_u64(a, 0x1234_5678_FFFF_FFFF).unwrap();
        m.write_u64(a + 1, 0xFFFF_FFFF_8765_4321).unwrap();
        m.write_u64(a + 2, u64::MAX).unwrap();
        m.write_u64(a + 3, 0x0000_0000_0000_0005).unwrap();
        let mut d = [0u32; 16];
        d[1] = 1; // word 0, low lane
        d[2] = 1; // word 1, high lane
        d[4] = 1; // word 2, both lanes
        d[5] = 1;
        d[7] = u32::MAX; // word 3, low lane: 5 - 1 (no borrow from the high lane)
        m.vadd32_be(a, &be_lanes(&d)).unwrap();
        assert_eq!(m.read_u64(a), Ok(0x1234_5678_0000_0000));
        assert_eq!(m.read_u64(a + 1), Ok(0x0000_0000_8765_4321));
        assert_eq!(m.read_u64(a + 2), Ok(0));
        assert_eq!(m.read_u64(a + 3), Ok(4));
        // and the same through vadd32x16
        m.vadd32x16(a, &[u32::MAX; 16]).unwrap();
        assert_eq!(m.read_u64(a), Ok(0x1234_5677_FFFF_FFFF));
        assert_eq!(m.read_u64(a + 2), Ok(u64::MAX));
        assert_eq!(m.read_u64(a + 3), Ok(0xFFFF_FFFF_0000_0003));
    }

    #[test]
    fn vadd32_be_bad_sizes() {
        let m = mem();
        for n in [
            0usize,
            1,
            4,
            8,
            32,
            63,
            65,
            100,
            4095,
            4097,
            4096 + 64,
            8192,
        ] {
            let data = vec![1u8; n];
            assert_eq!(m.vadd32_be(0, &data), Err(MemFault::BadSize { bytes: n }));
            // size is checked before the address
            assert_eq!(
                m.vadd32_be(u64::MAX, &data),
                Err(MemFault::BadSize { bytes: n })
            );
        }
        for lines in 1..=64 {
            assert_eq!(m.vadd32_be(0, &vec![0u8; 64 * lines]), Ok(()));
        }
        assert!(m.region(Region::Sram).all(|a| m.read_u64(a) == Ok(0)));
        assert!(MemFault::BadSize { bytes: 65 }
            .to_string()
            .contains("65 bytes"));
    }

    /// Stripes of the accumulator region materialised so far.
    fn acc_stripes(m: &SharedMemory) -> usize {
        m.acc
            .iter()
            .filter_map(|c| c.get())
            .map(|c| c.stripes.iter().filter(|s| s.get().is_some()).count())
            .sum()
    }

    fn dram_chunks(m: &SharedMemory) -> usize {
        m.dram.iter().filter(|c| c.get().is_some()).count()
    }

    #[test]
    fn materialise_backs_exactly_the_range_and_keeps_every_word() {
        let m = SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 4 << 20,
            acc_bytes: 4 << 20,
            banks: 4,
        })
        .unwrap();
        m.write_u64(ACC_BASE + ACC_STRIPE_WORDS + 5, 9).unwrap();
        m.write_u64(DRAM_BASE + CHUNK_WORDS + 5, 8).unwrap();
        assert_eq!((acc_stripes(&m), dram_chunks(&m)), (1, 1));
        // Three stripes from the middle of the first: the first, the written one, the third.
        let words = 2 * ACC_STRIPE_WORDS + 1;
        m.materialise(ACC_BASE + ACC_STRIPE_WORDS - 1, words)
            .unwrap();
        assert_eq!(acc_stripes(&m), 3);
        // Across a DRAM chunk boundary: the chunk before the written one joins it.
        m.materialise(DRAM_BASE + CHUNK_WORDS - 1, 2).unwrap();
        assert_eq!(dram_chunks(&m), 2);
        m.materialise(0, 8).unwrap();
        m.materialise(DRAM_BASE + 3 * CHUNK_WORDS, 0).unwrap();
        assert_eq!((acc_stripes(&m), dram_chunks(&m)), (3, 3));
        assert_eq!(m.read_u64(ACC_BASE + ACC_STRIPE_WORDS + 5), Ok(9));
        assert_eq!(m.read_u64(DRAM_BASE + CHUNK_WORDS + 5), Ok(8));
        assert_eq!(m.read_u64(ACC_BASE + ACC_STRIPE_WORDS - 1), Ok(0));
        // Out of range (a region's end crossed, or no region): refused, nothing backed.
        let end = m.region(Region::Acc).end;
        assert_eq!(m.materialise(end - 1, 2), Err(oor(end - 1, 2)));
        let dram_end = m.region(Region::Dram).end;
        assert_eq!(m.materialise(dram_end, 1), Err(oor(dram_end, 1)));
        assert_eq!((acc_stripes(&m), dram_chunks(&m)), (3, 3));
    }

    #[test]
    fn zero_clears_exactly_its_range_in_every_region() {
        let m = SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 21,
            banks: 4,
            ..MemConfig::default()
        })
        .unwrap();
        for base in [0, DRAM_BASE + CHUNK_WORDS - 8, ACC_BASE] {
            for i in 0..80 {
                m.write_u64(base + i, !0).unwrap();
            }
            m.zero(base + 8, 512).unwrap();
            for i in 0..80 {
                let want = if (8..72).contains(&i) { 0 } else { !0 };
                assert_eq!(
                    m.read_u64(base + i).unwrap(),
                    want,
                    "base {base:#x} word {i}"
                );
            }
        }
        assert_eq!(m.zero(0, 0), Err(MemFault::BadSize { bytes: 0 }));
        assert_eq!(m.zero(0, 72), Err(MemFault::BadSize { bytes: 72 }));
        assert_eq!(m.zero(0, 4160), Err(MemFault::BadSize { bytes: 4160 }));
        let end = (1 << 16) / 8;
        m.write_u64(end - 4, 7).unwrap();
        assert_eq!(
            m.zero(end - 4, 64),
            Err(MemFault::OutOfRange {
                addr: end - 4,
                words: 8
            })
        );
        assert_eq!(
            m.read_u64(end - 4).unwrap(),
            7,
            "nothing written on a fault"
        );
    }

    #[test]
    fn read_lines_equals_one_read_per_line_in_every_region() {
        let m = SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 21,
            acc_bytes: 4 << 20,
            banks: 4,
        })
        .unwrap();
        // The DRAM range crosses a chunk, the accumulator one a stripe.
        let acc = ACC_BASE + ACC_STRIPE_WORDS - 24;
        for base in [8, DRAM_BASE + CHUNK_WORDS - 40, acc] {
            for i in 0..64 {
                m.write_u64(base + i, (base + i).wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .unwrap();
            }
            let mut bulk = [0u8; 512];
            m.read_lines(base, &mut bulk).unwrap();
            for (l, line) in bulk.chunks_exact(64).enumerate() {
                let mut one = [0u8; 64];
                m.read(base + 8 * l as u64, &mut one).unwrap();
                assert_eq!(line, one, "base {base:#x} line {l}");
            }
        }
        // A chunk of the accumulator region nobody wrote reads as zeros, and stays
        // unmaterialised.
        let mut bulk = [1u8; 4096];
        m.read_lines(ACC_BASE + (3 << 17), &mut bulk).unwrap();
        assert!(bulk.iter().all(|&b| b == 0));
        assert_eq!(m.acc.iter().filter(|c| c.get().is_some()).count(), 1);
        for bytes in [0, 8, 72, 4160] {
            let mut out = vec![0u8; bytes];
            assert_eq!(m.read_lines(0, &mut out), Err(MemFault::BadSize { bytes }));
        }
        let end = m.region(Region::Acc).end;
        assert_eq!(
            m.read_lines(end - 8, &mut [0u8; 128]),
            Err(MemFault::OutOfRange {
                addr: end - 8,
                words: 16
            })
        );
    }

    #[test]
    fn write_lines_writes_big_endian_words_in_every_region() {
        let m = SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 21,
            acc_bytes: 4 << 20,
            banks: 4,
        })
        .unwrap();
        let data: Vec<u8> = (0..512u32).map(|i| (i * 37 + 11) as u8).collect();
        // The DRAM range crosses a chunk, the accumulator one a stripe.
        let acc = ACC_BASE + ACC_STRIPE_WORDS - 24;
        for base in [8, DRAM_BASE + CHUNK_WORDS - 40, acc] {
            for i in 0..80 {
                m.write_u64(base + i, !0).unwrap();
            }
            m.write_lines(base + 8, &data).unwrap();
            // Each word as `write` takes it: 8 bytes, big-endian.
            for (i, b) in data.chunks_exact(8).enumerate() {
                let want = u64::from_be_bytes(b.try_into().unwrap());
                assert_eq!(m.read_u64(base + 8 + i as u64), Ok(want), "base {base:#x}");
            }
            let mut back = [0u8; 512];
            m.read_lines(base + 8, &mut back).unwrap();
            assert_eq!(&back[..], &data[..], "base {base:#x}");
            // Only its range is written.
            for i in (0..8).chain(72..80) {
                assert_eq!(m.read_u64(base + i), Ok(!0), "base {base:#x} word {i}");
            }
        }
        for bytes in [0, 8, 72, 4160] {
            let data = vec![0u8; bytes];
            assert_eq!(m.write_lines(0, &data), Err(MemFault::BadSize { bytes }));
        }
        let end = m.region(Region::Acc).end;
        m.write_u64(end - 8, 7).unwrap();
        assert_eq!(
            m.write_lines(end - 8, &[1u8; 128]),
            Err(MemFault::OutOfRange {
                addr: end - 8,
                words: 16
            })
        );
        assert_eq!(m.read_u64(end - 8), Ok(7), "nothing written on a fault");
    }

    #[test]
    fn vadd_lane_layout() {
        let m = mem();
        let a = 64;
        let deltas: [u32; 16] = std::array::from_fn(|i| (i as u32 + 1) * 0x0101);
        m.vadd32x16(a, &deltas).unwrap();
        for i in 0..8u64 {
            let hi = u64::from(deltas[2 * i as usize]);
            let lo = u64::from(deltas[2 * i as usize + 1]);
            assert_eq!(m.read_u64(a + i), Ok(hi << 32 | lo));
        }
        let mut line = [0u8; 64];
        m.read(a, &mut line).unwrap();
        for (lane, bytes) in line.chunks_exact(4).enumerate() {
            assert_eq!(u32::from_be_bytes(bytes.try_into().unwrap()), deltas[lane]);
        }
        // each lane wraps on its own
        m.write(a, &[0xFF; 64]).unwrap();
        let mut ones = [0u32; 16];
        ones[3] = 1;
        ones[4] = 2;
        m.vadd32x16(a, &ones).unwrap();
        assert_eq!(m.read_u64(a), Ok(u64::MAX));
        assert_eq!(m.read_u64(a + 1), Ok(0xFFFF_FFFF_0000_0000));
        assert_eq!(m.read_u64(a + 2), Ok(0x0000_0001_FFFF_FFFF));
        assert_eq!(m.read_u64(a + 3), Ok(u64::MAX));
        // unaligned vadd is allowed and touches exactly 8 words
        m.write(a, &[0; 64]).unwrap();
        m.vadd32x16(a + 1, &[1; 16]).unwrap();
        assert_eq!(m.read_u64(a), Ok(0));
        assert_eq!(m.read_u64(a + 8), Ok(0x0000_0001_0000_0001));
        assert_eq!(m.read_u64(a + 9), Ok(0));
    }

    #[test]
    fn counters() {
        let m = mem();
        for a in [2, DRAM_BASE + 2] {
            m.counter_inc(a, 100).unwrap();
            m.counter_inc(a, 1500).unwrap();
            assert_eq!(m.counter_read(a), Ok((2, 1600)));
            assert_eq!(m.read_u64(a), Ok(2));
            assert_eq!(m.read_u64(a + 1), Ok(1600));
            // the paper's layout: counter k at BASE + 2k, neighbours untouched
            assert_eq!(m.counter_read(a + 2), Ok((0, 0)));
            assert_eq!(m.read_u64(a - 1), Ok(0));
        }
    }

    #[test]
    fn apply_matches_sync_calls() {
        let a = mem();
        let b = mem();
        let deltas: [u32; 16] = std::array::from_fn(|i| i as u32 * 3 + 1);
        let ops = [
            Op::WriteU64 {
                addr: 1,
                value: 0xF0F0,
            },
            Op::CounterInc { addr: 2, bytes: 64 },
            Op::FetchAnd {
                addr: 1,
                mask: 0xFF00,
            },
            Op::FetchOr {
                addr: 1,
                mask: 0x000F,
            },
            Op::FetchXor {
                addr: 1,
                mask: 0x0101,
            },
            Op::FetchClear {
                addr: 1,
                mask: 0x1000,
            },
            Op::FetchSwap { addr: 4, value: 9 },
            Op::FetchAdd {
                addr: 6,
                delta: u64::MAX - 1,
            },
            Op::MaskedWrite {
                addr: 4,
                value: 0x77,
                mask: 0xF0,
            },
            Op::FetchAdd32 {
                addr: 5,
                lane: 0,
                delta: 3,
            },
            Op::Vadd32x16 { addr: 8, deltas },
        ];
        for op in &ops {
            a.apply(op).unwrap();
        }
        b.write_u64(1, 0xF0F0).unwrap();
        b.counter_inc(2, 64).unwrap();
        b.fetch_and(1, 0xFF00).unwrap();
        b.fetch_or(1, 0x000F).unwrap();
        b.fetch_xor(1, 0x0101).unwrap();
        b.fetch_clear(1, 0x1000).unwrap();
        b.fetch_swap(4, 9).unwrap();
        b.fetch_add(6, u64::MAX - 1).unwrap();
        b.masked_write(4, 0x77, 0xF0).unwrap();
        b.fetch_add32(5, 0, 3).unwrap();
        b.vadd32x16(8, &deltas).unwrap();
        for w in 0..16 {
            assert_eq!(a.read_u64(w), b.read_u64(w), "word {w}");
        }
        assert_eq!(a.read_u64(1), Ok(0xE10E));
        assert_eq!(a.read_u64(4), Ok(0x79));
    }
}
