//! Where Trio-ML keeps its state in shared memory, the words and bits of the records that
//! the program updates with read-modify-write XTXNs, and the hash keys.
//!
//! Shared by the control plane (`TrioMl`) and the program, so both agree by construction.

use pfemu::mem::{Addr, ACC_BASE, DRAM_BASE, LINE_WORDS};

// ----- 32-bit record addresses --------------------------------------------------------------

/// Bit 31 of a 32-bit record address: the line is in DRAM or the accumulator region (else
/// SRAM).
const PADDR_DRAM: u32 = 1 << 31;
/// Bits 31 and 30 of a 32-bit record address: the line is in the accumulator region.
const PADDR_ACC: u32 = 3 << 30;

/// The 32-bit form of a line-aligned word address, as the records' `*_paddr` fields hold
/// it: bit 31 clear is SRAM (the low 31 bits are the line's index); bits 31-30 = `10` is
/// DRAM and `11` the accumulator region, the low 30 bits the 64-byte line's index in it.
/// That covers every mapped address (64 GiB of DRAM is 2^30 lines, the accumulator region
/// at most 2^28).
pub(super) fn paddr(addr: Addr) -> u32 {
    debug_assert_eq!(addr % LINE_WORDS, 0, "records and buffers are line aligned");
    if addr >= ACC_BASE {
        PADDR_ACC | ((addr - ACC_BASE) / LINE_WORDS) as u32
    } else if addr >= DRAM_BASE {
        PADDR_DRAM | ((addr - DRAM_BASE) / LINE_WORDS) as u32
    } else {
        (addr / LINE_WORDS) as u32
    }
}

/// The word address a 32-bit record address stands for (see [`paddr`]).
pub(super) fn addr_of(paddr: u32) -> Addr {
    if paddr & PADDR_ACC == PADDR_ACC {
        ACC_BASE + u64::from(paddr & !PADDR_ACC) * LINE_WORDS
    } else if paddr & PADDR_DRAM != 0 {
        DRAM_BASE + u64::from(paddr & !PADDR_DRAM) * LINE_WORDS
    } else {
        u64::from(paddr) * LINE_WORDS
    }
}

// ----- the job record (Figure 17) -----------------------------------------------------------

/// Word 0 of the job record: `block_curr_cnt` is its top 16 bits (bits 16..32 of its
/// high 32-bit lane), `block_cnt_max` and `block_grad_max` follow, and its low 16 bits
/// are the high half of `block_total_cnt`.
pub(super) const JOB_W0: u64 = 0;
/// Word 1 of the job record: its top 16 bits are the low half of `block_total_cnt`.
pub(super) const JOB_W1: u64 = 1;
/// Bytes 58-61 of the job line (after the 58-byte record): the 32-bit address ([`paddr`]) of
/// the job's aggregation buffers in the accumulator region, buffer `k` at `k *
/// JobLayout::buffer_words` words from it; 0 when the buffers are in the slots.
pub(super) const JOB_BUFS_AT: usize = 58;
/// Word 3 of the job record: `src_cnt` is byte 25, bits 48..56.
pub(super) const JOB_W_SRC_CNT: u64 = 3;
/// Shift of `src_cnt` in [`JOB_W_SRC_CNT`].
pub(super) const JOB_SRC_CNT_SHIFT: u32 = 48;

/// Word 3 of the job record: byte 24 (bits 56..64, in the padding before `src_cnt`) is the
/// job's run state: the current run id in bits 56..60 (0 until a worker joins) and the
/// lock of the Join handler in bit 63.
pub(super) const JOB_W_RUN: u64 = 3;
/// Shift of the current run id in [`JOB_W_RUN`].
pub(super) const JOB_RUN_SHIFT: u32 = 56;
/// Mask of the current run id in [`JOB_W_RUN`].
pub(super) const JOB_RUN_MASK: u64 = 0xF << JOB_RUN_SHIFT;
/// The Join handler's lock in [`JOB_W_RUN`].
pub(super) const JOB_RUN_LOCK: u64 = 1 << 63;
/// Byte of the job line holding the run state.
pub(super) const JOB_RUN_AT: usize = 24;

/// The job's current run id from word [`JOB_W_RUN`] (0: nobody joined yet).
pub(super) fn job_run(w3: u64) -> u8 {
    ((w3 & JOB_RUN_MASK) >> JOB_RUN_SHIFT) as u8
}

/// The run after `run`: 1 to 15, round (0, no run yet, is followed by 1).
pub(super) fn next_run(run: u8) -> u8 {
    run % super::wire::MAX_RUN_ID + 1
}

/// A source's join word (see [`JobLayout::runs`]): the run it joined and its nonce.
pub(super) fn join_word(run: u8, nonce: u32) -> u64 {
    u64::from(run) << 32 | u64::from(nonce)
}

/// `(run, nonce)` of a [`join_word`].
pub(super) fn parse_join_word(w: u64) -> (u8, u32) {
    ((w >> 32) as u8, w as u32)
}

/// 32-bit lane delta adding 1 to `block_curr_cnt` (lane 0 of word 0, bits 16..32).
pub(super) const CURR_CNT_INC: u32 = 1 << 16;
/// 32-bit lane delta subtracting 1 from `block_curr_cnt` (`-(1 << 16)` modulo 2^32; the
/// low 16 bits of the lane are unchanged).
pub(super) const CURR_CNT_DEC: u32 = CURR_CNT_INC.wrapping_neg();
/// 32-bit lane delta adding 1 to the low half of `block_total_cnt` (lane 0 of word 1).
pub(super) const TOTAL_LO_INC: u32 = 1 << 16;

/// `(block_curr_cnt, block_cnt_max, block_grad_max, block_exp)` from word 0.
pub(super) fn job_w0_fields(w0: u64) -> (u32, u32, u32, u8) {
    (
        (w0 >> 48) as u32,
        (w0 >> 36) as u32 & 0xFFF,
        (w0 >> 24) as u32 & 0xFFF,
        (w0 >> 16) as u8,
    )
}

// ----- the block record (Figure 18) and the bits Trio-ML adds in its padding ----------------

/// Word 0 of the block record: `block_exp` (bits 56..64), `block_age` (48..56), then the
/// top 48 bits of `block_start_time`.
pub(super) const BLOCK_W_AGE: u64 = 0;
/// Shift of `block_exp` in [`BLOCK_W_AGE`].
pub(super) const BLOCK_EXP_SHIFT: u32 = 56;
/// Shift of `block_age` in [`BLOCK_W_AGE`].
pub(super) const BLOCK_AGE_SHIFT: u32 = 48;
/// Word 1 of the block record: `job_ctx_paddr` is bits 16..48.
pub(super) const BLOCK_W_JOB: u64 = 1;
/// Shift of `job_ctx_paddr` in [`BLOCK_W_JOB`].
pub(super) const BLOCK_JOB_SHIFT: u32 = 16;
/// Word 2 of the block record: `grad_cnt` is bits 16..28; the gate (below) lives in the
/// padding around it.
pub(super) const BLOCK_W_GATE: u64 = 2;
/// Shift of `grad_cnt` in [`BLOCK_W_GATE`].
pub(super) const BLOCK_GRAD_CNT_SHIFT: u32 = 16;
/// Word 3 of the block record: `rcvd_cnt` is byte 25, bits 48..56 (bits 16..24 of the
/// word's high 32-bit lane).
pub(super) const BLOCK_W_RCVD_CNT: u64 = 3;
/// 32-bit lane delta adding 1 to `rcvd_cnt` (lane 0 of word 3).
pub(super) const RCVD_CNT_INC: u32 = 1 << 16;
/// Shift of `rcvd_cnt` in lane 0 of [`BLOCK_W_RCVD_CNT`].
pub(super) const RCVD_CNT_LANE_SHIFT: u32 = 16;
/// Shift, in lane 0 of [`BLOCK_W_RCVD_CNT`], of the block's *contributors*: record byte 24
/// (the last unused byte before `rcvd_cnt`). Each source adds its own count: a server's
/// packet (`src_cnt` 0 in its header) counts 1, a lower aggregator's Result counts its
/// `src_cnt`. So a top-level Result's `src_cnt` is the number of servers in the sum, and
/// hosts divide by it, whatever the depth of the hierarchy (mod 256).
pub(super) const CONTRIB_LANE_SHIFT: u32 = 24;
/// Byte of the block record holding the contributors.
pub(super) const CONTRIB_AT: usize = 24;
/// Word 2 of the block record: byte 18 (bits 40..48, in the padding before `grad_cnt`)
/// holds the block's run id (0: a client of the paper's header alone).
pub(super) const BLOCK_W_RUN: u64 = 2;
/// Shift of the run id in [`BLOCK_W_RUN`].
pub(super) const BLOCK_RUN_SHIFT: u32 = 40;
/// Byte of the block record holding the run id.
pub(super) const BLOCK_RUN_AT: usize = 18;

/// Byte of the block's line where its key is kept, after the 58-byte record: bytes 58..62
/// hold the block id and bytes 62..64 the generation (word 7, bits 16..48 and 0..16), so
/// the control plane and the Result builder can tell which block a slot holds.
pub(super) const BLOCK_KEY_AT: usize = 58;
/// The word holding the key (bytes 56..64 of the line; the key is its low 48 bits).
pub(super) const BLOCK_KEY_WORD: u64 = 7;

// The gate: who may still add to a block, and who finishes it. Word 2, low 32-bit lane
// (record bytes 20..24): bit 31 CLOSED, bit 30 TAKEN and bit 29 DEGRADED lie in the 20
// unused bits before `grad_cnt`, IN_FLIGHT is bytes 22..23 (16 of the 24 unused bits before `rcvd_cnt`).
//
// - An adder enters with a 32-bit add of 1 to IN_FLIGHT, which returns the old gate: if it
//   was CLOSED, the adder adds nothing and leaves (subtracts 1 again).
// - The thread whose `rcvd_cnt` increment completes the block, and a timer thread that
//   finds it aged, CLOSE it (fetch-or); a closed block admits no new adder.
// - Whoever sees the gate CLOSED with nobody IN_FLIGHT right after its own XTXN (the closer
//   if nobody was in flight, else the last adder to leave) then sets TAKEN (fetch-or); the
//   one that finds TAKEN clear finishes the block: its sums and counts are final.

/// The gate's word (see above).
pub(super) const GATE_W: u64 = BLOCK_W_GATE;
/// The gate's 32-bit lane in [`GATE_W`] (the low one).
pub(super) const GATE_LANE: u8 = 1;
/// CLOSED: no adder may enter any more.
pub(super) const GATE_CLOSED: u64 = 1 << 31;
/// TAKEN: a thread has claimed the finishing of the block.
pub(super) const GATE_TAKEN: u64 = 1 << 30;
/// DEGRADED: a source's packet was itself a partial Result (a lower aggregator gave up on
/// a straggler), so this block's Result is partial too. Sticky; set before the source is
/// counted.
pub(super) const GATE_DEGRADED: u64 = 1 << 29;
/// IN_FLIGHT: adders between entering and leaving.
pub(super) const GATE_IN_FLIGHT: u64 = 0xFFFF;
/// Lane delta: one adder enters.
pub(super) const GATE_ENTER: u32 = 1;
/// Lane delta: one adder leaves (`-1` modulo 2^32).
pub(super) const GATE_LEAVE: u32 = u32::MAX;

// ----- per-job memory -----------------------------------------------------------------------

/// What a job's gradients are and how the aggregation adds them: Trio-ML's 32-bit integers
/// (the RMW engine's lane-wise vector add, two lanes per buffer word), or FPISA's IEEE FP32
/// values (each lane its own accumulator word, added with the engine's shift-and-add; the
/// Result is renormalized as it is built). Packets carry 4 bytes per gradient either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Lanes {
    /// Trio-ML's 32-bit integer gradients.
    #[default]
    Int32,
    /// FPISA: FP32 gradients, added with the shift-and-add in the given variant.
    Fpisa(pfemu::fpisa::Variant),
}

impl Lanes {
    /// Bytes of aggregation buffer per gradient: 4 (two lanes per word) or 8 (one FPISA
    /// accumulator word).
    pub const fn buffer_bytes(self) -> u64 {
        match self {
            Lanes::Int32 => 4,
            Lanes::Fpisa(_) => 8,
        }
    }

    /// Buffer words a 64-byte chunk of a packet (16 gradients) adds into.
    pub const fn chunk_words(self) -> u64 {
        16 * self.buffer_bytes() / 8
    }
}

/// A job's region: its record (one line), its sources' join words (one word per source id,
/// [`JOIN_WORDS`]), its slot bitmap (`ceil(block_cnt_max / 64)`
/// words, rounded up to whole lines), then `block_cnt_max` slots, each a block record line
/// followed by an aggregation buffer of `block_grad_max` gradients rounded up to 64 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct JobLayout {
    /// The job record.
    pub record: Addr,
    /// The join words: word `s` is source `s`'s [`join_word`], the run it last joined and
    /// the nonce it joined with.
    pub runs: Addr,
    /// The first word of the slot bitmap (bit `k % 64` of word `k / 64` = slot `k` in use).
    pub bitmap: Addr,
    /// Slots in the pool.
    pub slots: u32,
    /// Words of one slot (record line + buffer).
    pub slot_words: u64,
    /// The first slot.
    pub slot0: Addr,
}

/// Words of the join words: one per source id (whole lines).
pub(super) const JOIN_WORDS: u64 = 256;

impl JobLayout {
    /// The join word of source `src` of the job whose record is at `record`.
    pub fn join_word_of(record: Addr, src: u8) -> Addr {
        record + LINE_WORDS + u64::from(src)
    }

    /// The layout of a job region starting at `record`.
    pub fn new(record: Addr, block_cnt_max: u32, block_grad_max: u32, lanes: Lanes) -> JobLayout {
        let runs = record + LINE_WORDS;
        let bitmap = runs + JOIN_WORDS;
        JobLayout {
            record,
            runs,
            bitmap,
            slots: block_cnt_max,
            slot_words: LINE_WORDS + Self::buffer_words(block_grad_max, lanes),
            slot0: bitmap + Self::bitmap_words(block_cnt_max).next_multiple_of(LINE_WORDS),
        }
    }

    /// Words of an aggregation buffer for `block_grad_max` gradients (whole lines).
    pub fn buffer_words(block_grad_max: u32, lanes: Lanes) -> u64 {
        (u64::from(block_grad_max) * lanes.buffer_bytes()).div_ceil(64) * LINE_WORDS
    }

    /// Words of the slot bitmap.
    pub fn bitmap_words(block_cnt_max: u32) -> u64 {
        u64::from(block_cnt_max).div_ceil(64)
    }

    /// Words of the whole region.
    pub fn words(block_cnt_max: u32, block_grad_max: u32, lanes: Lanes) -> u64 {
        let l = JobLayout::new(0, block_cnt_max, block_grad_max, lanes);
        l.slot0 + u64::from(block_cnt_max) * l.slot_words
    }

    /// Slot `k`'s block record line.
    pub fn slot(&self, k: u32) -> Addr {
        self.slot0 + u64::from(k) * self.slot_words
    }

    /// Slot `k`'s aggregation buffer: in the job's accumulator buffers when `bufs` (the
    /// job line's [`JOB_BUFS_AT`] field) is not 0, else after the slot's record line.
    pub fn buffer(&self, bufs: u32, k: u32) -> Addr {
        if bufs == 0 {
            self.slot(k) + LINE_WORDS
        } else {
            addr_of(bufs) + u64::from(k) * (self.slot_words - LINE_WORDS)
        }
    }

    /// The slot whose record is at `record`, if it is one of this job's.
    pub fn slot_of(&self, record: Addr) -> Option<u32> {
        let off = record.checked_sub(self.slot0)?;
        (off % self.slot_words == 0 && off / self.slot_words < u64::from(self.slots))
            .then(|| (off / self.slot_words) as u32)
    }

    /// The bitmap word and bit of slot `k`.
    pub fn slot_bit(&self, k: u32) -> (Addr, u64) {
        (self.bitmap + u64::from(k / 64), 1 << (k % 64))
    }

    /// The valid slot bits of bitmap word `w` (the last word may be partial).
    pub fn valid_bits(&self, w: u64) -> u64 {
        let end = u64::from(self.slots) - w * 64;
        if end >= 64 {
            u64::MAX
        } else {
            (1 << end) - 1
        }
    }
}

// ----- hash keys and values -----------------------------------------------------------------

/// Bytes of a [`block_key`].
pub(super) const BLOCK_KEY_BYTES: usize = 8;

/// Key of an active block record: `job_id`, `run_id`, `block_id` (big-endian), `gen_id`
/// (big-endian). The paper keys blocks by job and block id; the generation is added so
/// that consecutive uses of a block id are separate records, and the run so that a job's
/// new run never joins a block of an earlier one.
pub(super) fn block_key(job: u8, run: u8, block: u32, gen: u16) -> [u8; BLOCK_KEY_BYTES] {
    let b = block.to_be_bytes();
    let g = gen.to_be_bytes();
    [job, run, b[0], b[1], b[2], b[3], g[0], g[1]]
}

/// `(job, run, block, gen)` of a [`block_key`].
pub(super) fn parse_block_key(key: &[u8]) -> Option<(u8, u8, u32, u16)> {
    let k: &[u8; BLOCK_KEY_BYTES] = key.try_into().ok()?;
    Some((
        k[0],
        k[1],
        u32::from_be_bytes([k[2], k[3], k[4], k[5]]),
        u16::from_be_bytes([k[6], k[7]]),
    ))
}

/// Bit 63 of an active-table value: the block finished and its Result is kept. The record
/// stays in the table as this *finished marker* until the next generation's Result
/// replaces the kept one, so a packet of a finished block always finds either the live
/// record or the marker, never nothing (and never starts the block again).
pub(super) const FINISHED: u64 = 1 << 63;

/// An active-table value that is no record yet: a thread is creating the block. Creating
/// starts by inserting the key with this value, so of several packets racing to create a
/// block exactly one does (and only it counts a slot against `block_cnt_max`); the others
/// wait for it to publish the record, then join. A creator that fails (job full, no
/// slot) deletes the key, and the waiters try again.
pub(super) const PENDING: u64 = 1 << 62;

/// Key of a kept result: `job_id`, `block_id` (big-endian).
pub(super) fn kept_key(job: u8, block: u32) -> [u8; 5] {
    let b = block.to_be_bytes();
    [job, b[0], b[1], b[2], b[3]]
}

/// `(job_id, block_id)` of a [`kept_key`].
pub(super) fn parse_kept_key(key: &[u8; 5]) -> (u8, u32) {
    (key[0], u32::from_be_bytes([key[1], key[2], key[3], key[4]]))
}

/// Value of a kept result: its generation (bits 32..48) and its block record's 32-bit
/// address (0..32), with age 0 (bits 48..64: kept scans since a packet last asked for it;
/// the timer threads count it, see [`kept_age`]).
pub(super) fn kept_value(gen: u16, record: Addr) -> u64 {
    u64::from(gen) << 32 | u64::from(paddr(record))
}

/// `(gen, record)` of a [`kept_value`], whatever its age.
pub(super) fn parse_kept_value(v: u64) -> (u16, Addr) {
    ((v >> 32) as u16, addr_of(v as u32))
}

/// Shift of the age in a [`kept_value`].
const KEPT_AGE_SHIFT: u32 = 48;

/// The age of a kept result: kept scans since a packet last asked for it.
pub(super) fn kept_age(v: u64) -> u16 {
    (v >> KEPT_AGE_SHIFT) as u16
}

/// `v` with age `age`.
pub(super) fn with_kept_age(v: u64, age: u16) -> u64 {
    v & ((1 << KEPT_AGE_SHIFT) - 1) | u64::from(age) << KEPT_AGE_SHIFT
}

/// Whether two kept values name the same Result (generation and record), whatever their
/// ages.
pub(super) fn same_kept(a: u64, b: u64) -> bool {
    with_kept_age(a, 0) == with_kept_age(b, 0)
}

/// Key of a job record: the job id.
pub(super) fn job_key(job: u8) -> [u8; 1] {
    [job]
}

/// Key of a route: the IPv4 destination, big-endian.
pub(super) fn route_key(dst: u32) -> [u8; 4] {
    dst.to_be_bytes()
}

/// Whether generation `a` is newer than `b`, in 16-bit serial-number arithmetic (so the
/// generation may wrap).
pub(super) fn gen_newer(a: u16, b: u16) -> bool {
    (a.wrapping_sub(b) as i16) > 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paddr_round_trips_in_both_regions() {
        for a in [
            0,
            8,
            1 << 20,
            DRAM_BASE,
            DRAM_BASE + 8,
            DRAM_BASE + (1 << 33) - 8,
            ACC_BASE,
            ACC_BASE + 8,
            ACC_BASE + (1 << 31) - 8,
        ] {
            assert_eq!(addr_of(paddr(a)), a, "{a:#x}");
        }
        assert_eq!(paddr(DRAM_BASE + 64), PADDR_DRAM | 8);
        assert_eq!(paddr(ACC_BASE + 64), PADDR_ACC | 8);
    }

    #[test]
    fn job_layout() {
        let l = JobLayout::new(DRAM_BASE, 100, 17, Lanes::Int32);
        assert_eq!(l.runs, DRAM_BASE + 8);
        assert_eq!(JobLayout::join_word_of(DRAM_BASE, 255), DRAM_BASE + 8 + 255);
        let bitmap = DRAM_BASE + 8 + 256;
        assert_eq!(l.bitmap, bitmap);
        assert_eq!(JobLayout::bitmap_words(100), 2);
        assert_eq!(l.slot0, bitmap + 8);
        // 17 gradients = 68 bytes -> 2 lines.
        assert_eq!(l.slot_words, 8 + 16);
        assert_eq!(l.slot(1), bitmap + 8 + 24);
        assert_eq!(l.buffer(0, 1), bitmap + 8 + 24 + 8);
        assert_eq!(l.buffer(paddr(ACC_BASE + 64), 2), ACC_BASE + 64 + 2 * 16);
        assert_eq!(l.slot_of(l.slot(99)), Some(99));
        assert_eq!(l.slot_of(l.slot(100)), None);
        assert_eq!(l.slot_of(l.slot(3) + 8), None);
        assert_eq!(l.slot_bit(70), (bitmap + 1, 1 << 6));
        assert_eq!(l.valid_bits(0), u64::MAX);
        assert_eq!(l.valid_bits(1), (1 << 36) - 1);
        assert_eq!(JobLayout::words(100, 17, Lanes::Int32), 16 + 256 + 100 * 24);
        assert_eq!(
            JobLayout::words(64, 16, Lanes::Int32),
            8 + 256 + 8 + 64 * 16
        );
        // FPISA: one 8-byte accumulator word per gradient.
        let fp = Lanes::Fpisa(pfemu::fpisa::Variant::Full);
        assert_eq!(JobLayout::words(100, 17, fp), 16 + 256 + 100 * (8 + 24));
        assert_eq!((Lanes::Int32.chunk_words(), fp.chunk_words()), (8, 16));
    }

    #[test]
    fn lane_deltas() {
        assert_eq!(CURR_CNT_DEC, 0xFFFF_0000);
        let w0: u64 = 0x0003_0FA0_0A89_1234; // curr 3, max 0x0FA, grad_max 0x00A, exp 0x89
        assert_eq!(job_w0_fields(w0), (3, 0x0FA, 0x00A, 0x89));
    }

    #[test]
    fn keys_and_generations() {
        assert_eq!(
            block_key(1, 9, 0x0203_0405, 0x0607),
            [1, 9, 2, 3, 4, 5, 6, 7]
        );
        assert_eq!(
            parse_block_key(&[1, 9, 2, 3, 4, 5, 6, 7]),
            Some((1, 9, 0x0203_0405, 0x0607))
        );
        assert_eq!((next_run(0), next_run(1), next_run(15)), (1, 2, 1));
        assert_eq!(parse_join_word(join_word(7, 0xDEAD_BEEF)), (7, 0xDEAD_BEEF));
        assert_eq!(job_run(0x8500_0000_0000_0000), 5);
        assert_eq!(parse_block_key(&[1]), None);
        assert_eq!(kept_key(9, 1), [9, 0, 0, 0, 1]);
        let v = kept_value(0xBEEF, DRAM_BASE + 64);
        assert_eq!(parse_kept_value(v), (0xBEEF, DRAM_BASE + 64));
        assert!(gen_newer(1, 0));
        assert!(gen_newer(0, 0xFFFF));
        assert!(!gen_newer(0, 0));
        assert!(!gen_newer(0xFFFF, 0));
    }
}
