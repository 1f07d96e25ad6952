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

// ----- the records' fields, for RMW XTXNs --------------------------------------------------
// Every word, shift, mask and lane below comes from the records' `header!` descriptions
// (`JobCtx`, `BlockCtx` in `wire`), so the view and the XTXNs cannot disagree; the names
// only say what the program does with them.

use super::wire::{BlockCtxLayout as Block, JobCtxLayout as Job, BLOCK_CTX_LEN, JOB_CTX_LEN};
use pfemu::wire::Field;

/// Word 0 of the job record: `block_cnt_max`, `block_grad_max`, `block_exp` (and, at their
/// Figure 17 places, the bits of `block_curr_cnt` and of the high half of
/// `block_total_cnt`, which stay zero there: see [`JOB_COUNTERS`]).
pub(super) const JOB_W0: u64 = Job::BLOCK_CURR_CNT.word();
/// The low half of `block_total_cnt` (the counter straddles words 0 and 1).
const TOTAL_LO: Field = Field::new(Job::BLOCK_TOTAL_CNT.bit + 16, 16);
/// The high half of `block_total_cnt`.
const TOTAL_HI: Field = Field::new(Job::BLOCK_TOTAL_CNT.bit, 16);
/// Where a job's counters are, in words after its record: the job's *counter line*, the
/// line after the record line. It holds Figure 17's `block_curr_cnt` and
/// `block_total_cnt` at their places in the record (words 0 and 1, so the lanes below
/// serve both); its other bits, and those two fields' bits in the record, stay zero.
///
/// This is where pfemu's job record differs from the paper's, and why: every packet reads
/// the record (its source masks, `src_cnt` and run) and every new block reads its limits,
/// while the counters change twice per block. On Trio the read-modify-write engines apply
/// the counters' updates near the memory; on the host a PPE thread's update takes the
/// whole line from the other cores, and their next reads of the record wait for it to come
/// back. With the counters on a line of their own the record line is only ever read by the
/// data path: `bench trio-ml` ran 1.04x faster (10 rounds, paired, interleaved).
pub(super) const JOB_COUNTERS: u64 = LINE_WORDS;
/// The word holding `block_curr_cnt`, in words after the job record (in its counter line).
pub(super) const JOB_W_CURR_CNT: u64 = JOB_COUNTERS + Job::BLOCK_CURR_CNT.word();
/// The word holding the high half of `block_total_cnt`, after the record (counter line).
pub(super) const JOB_W_TOTAL_HI: u64 = JOB_COUNTERS + TOTAL_HI.word();
/// The word holding the low half of `block_total_cnt` (its top 16 bits), after the record
/// (counter line).
pub(super) const JOB_W_TOTAL_LO: u64 = JOB_COUNTERS + TOTAL_LO.word();
/// Byte of the job line after the record: the job's buffers (`wire::JobBufs`).
pub(super) const JOB_BUFS_AT: usize = JOB_CTX_LEN;
/// The word of the job record holding `src_cnt`.
pub(super) const JOB_W_SRC_CNT: u64 = Job::SRC_CNT.word();

/// The word of the job record holding its run state (`run_lock`, `run_id`, in the padding
/// before `src_cnt`).
pub(super) const JOB_W_RUN: u64 = Job::RUN_ID.word();
/// Shift of the current run id in [`JOB_W_RUN`].
pub(super) const JOB_RUN_SHIFT: u32 = Job::RUN_ID.shift();
/// Mask of the current run id in [`JOB_W_RUN`].
pub(super) const JOB_RUN_MASK: u64 = Job::RUN_ID.mask();
/// The Join handler's lock in [`JOB_W_RUN`].
pub(super) const JOB_RUN_LOCK: u64 = Job::RUN_LOCK.mask();
const _: () = assert!(Job::RUN_LOCK.word() == JOB_W_RUN);

/// The job's current run id from word [`JOB_W_RUN`] (0: nobody joined yet).
pub(super) fn job_run(w3: u64) -> u8 {
    // A 4-bit field: the cast keeps all of it.
    Job::RUN_ID.get_u8(w3)
}

/// The job's `src_cnt` from word [`JOB_W_SRC_CNT`].
pub(super) fn job_src_cnt(w3: u64) -> u8 {
    // An 8-bit field: the cast keeps all of it.
    Job::SRC_CNT.get_u8(w3)
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

/// The 32-bit lane of [`JOB_W_CURR_CNT`] holding `block_curr_cnt`.
pub(super) const CURR_CNT_LANE: u8 = Job::BLOCK_CURR_CNT.lane();
/// Shift of `block_curr_cnt` in its lane.
pub(super) const CURR_CNT_LANE_SHIFT: u32 = Job::BLOCK_CURR_CNT.lane_shift();
/// 32-bit lane delta adding 1 to `block_curr_cnt`.
pub(super) const CURR_CNT_INC: u32 = 1 << Job::BLOCK_CURR_CNT.lane_shift();
/// 32-bit lane delta subtracting 1 from `block_curr_cnt` (`-(1 << 16)` modulo 2^32; the
/// low 16 bits of the lane are unchanged).
pub(super) const CURR_CNT_DEC: u32 = CURR_CNT_INC.wrapping_neg();
/// The lane of [`JOB_W_TOTAL_LO`] holding the low half of `block_total_cnt`.
pub(super) const TOTAL_LO_LANE: u8 = TOTAL_LO.lane();
/// 32-bit lane delta adding 1 to the low half of `block_total_cnt`.
pub(super) const TOTAL_LO_INC: u32 = 1 << TOTAL_LO.lane_shift();
/// Shift of the low half of `block_total_cnt` in its lane.
pub(super) const TOTAL_LO_LANE_SHIFT: u32 = TOTAL_LO.lane_shift();
/// The lane of [`JOB_W_TOTAL_HI`] holding the high half of `block_total_cnt`.
pub(super) const TOTAL_HI_LANE: u8 = TOTAL_HI.lane();
/// 32-bit lane delta adding 1 to the high half of `block_total_cnt`.
pub(super) const TOTAL_HI_INC: u32 = 1 << TOTAL_HI.lane_shift();
/// The lane bits of the high half of `block_total_cnt`.
pub(super) const TOTAL_HI_LANE_MASK: u32 = 0xFFFF << TOTAL_HI.lane_shift();
/// 32-bit lane delta taking back a carry the high half of `block_total_cnt` pushed into
/// the field above it (`block_exp`).
pub(super) const TOTAL_HI_CARRY_BACK: u32 = (1u32 << (TOTAL_HI.lane_shift() + 16)).wrapping_neg();
const _: () = assert!(TOTAL_HI.word() == JOB_W0 && TOTAL_HI.lane_shift() == 0);

/// `(block_cnt_max, block_grad_max, block_exp)` from the record's word 0.
pub(super) fn job_w0_fields(w0: u64) -> (u32, u32, u8) {
    (
        Job::BLOCK_CNT_MAX.get_u32(w0),
        Job::BLOCK_GRAD_MAX.get_u32(w0),
        Job::BLOCK_EXP.get_u8(w0),
    )
}

/// The word of the block record holding `block_exp` and `block_age`.
pub(super) const BLOCK_W_AGE: u64 = Block::BLOCK_AGE.word();
/// `block_exp`, in [`BLOCK_W_AGE`].
pub(super) const BLOCK_EXP: Field = Block::BLOCK_EXP;
/// `block_age`, in [`BLOCK_W_AGE`].
pub(super) const BLOCK_AGE: Field = Block::BLOCK_AGE;
const _: () = assert!(BLOCK_EXP.word() == BLOCK_W_AGE);
/// The word of the block record holding `job_ctx_paddr`.
pub(super) const BLOCK_W_JOB: u64 = Block::JOB_CTX_PADDR.word();
/// `job_ctx_paddr` in [`BLOCK_W_JOB`].
pub(super) const BLOCK_JOB: Field = Block::JOB_CTX_PADDR;
/// The word of the block record holding `grad_cnt` and the gate's flags.
pub(super) const BLOCK_W_GATE: u64 = Block::GRAD_CNT.word();
/// `aggr_paddr`, which straddles [`BLOCK_W_JOB`] and [`BLOCK_W_GATE`] (read both, then
/// [`Field::get_across`]).
pub(super) const BLOCK_BUF: Field = Block::AGGR_PADDR;
const _: () = assert!(
    BLOCK_BUF.first_word() == BLOCK_W_JOB && BLOCK_W_GATE == BLOCK_W_JOB + 1,
    "aggr_paddr lies in the two words check_source reads"
);
/// `grad_cnt`, in [`BLOCK_W_GATE`].
pub(super) const BLOCK_GRAD_CNT: Field = Block::GRAD_CNT;
/// The word of the block record holding `rcvd_cnt` and the contributors.
pub(super) const BLOCK_W_RCVD_CNT: u64 = Block::RCVD_CNT.word();
/// The lane of [`BLOCK_W_RCVD_CNT`] holding `rcvd_cnt` and the contributors.
pub(super) const RCVD_CNT_LANE: u8 = Block::RCVD_CNT.lane();
/// 32-bit lane delta adding 1 to `rcvd_cnt`.
pub(super) const RCVD_CNT_INC: u32 = 1 << Block::RCVD_CNT.lane_shift();
/// Shift of `rcvd_cnt` in its lane.
pub(super) const RCVD_CNT_LANE_SHIFT: u32 = Block::RCVD_CNT.lane_shift();
/// Shift of the block's *contributors* in the lane of `rcvd_cnt`. Each source adds its
/// own count: a server's packet (`src_cnt` 0 in its header) counts 1, a lower
/// aggregator's Result counts its `src_cnt`. So a top-level Result's `src_cnt` is the
/// number of servers in the sum, and hosts divide by it, whatever the depth of the
/// hierarchy (mod 256).
pub(super) const CONTRIB_LANE_SHIFT: u32 = Block::CONTRIBUTORS.lane_shift();
const _: () = assert!(
    Block::CONTRIBUTORS.word() == BLOCK_W_RCVD_CNT && Block::CONTRIBUTORS.lane() == RCVD_CNT_LANE
);

/// Byte of the block's line where its key is kept, after the record (`wire::BlockKey`).
pub(super) const BLOCK_KEY_AT: usize = BLOCK_CTX_LEN;
/// The word holding the key (the key is its low 48 bits).
pub(super) const BLOCK_KEY_WORD: u64 = 7;
const _: () = assert!(BLOCK_KEY_AT == 8 * BLOCK_KEY_WORD as usize + 2);

/// The run of the block whose record's gate word ([`GATE_W`]) is `gate`.
pub(super) fn block_run(gate: u64) -> u8 {
    Block::RUN_ID.get_u8(gate) & super::wire::MAX_RUN_ID
}

/// The run a Join that starts a new one takes after `current`: the first id from
/// [`next_run`]`(current)` on, other than `current`, that is not in `in_use` (bit `r` set:
/// some slot of the job holds a block or a kept Result of run `r`); `None` while every
/// other id is. Run ids have 4 bits, so a job that restarts often comes back to an id
/// while its last run may still have Results kept: taking only a free id, nothing of that
/// run can answer the new one, or be joined by it.
pub(super) fn free_run_after(current: u8, in_use: u16) -> Option<u8> {
    let mut run = next_run(current);
    for _ in 0..super::wire::MAX_RUN_ID {
        if run != current && in_use & 1 << run == 0 {
            return Some(run);
        }
        run = next_run(run);
    }
    None
}

// The gate: who may still add to a block, and who finishes it. The record's `closed`,
// `taken`, `degraded` and `in_flight` fields, all in the low 32-bit lane of one word, which
// also holds the block's run and its slot's tag:
//
// - A thread enters with a 64-bit add of 1 to IN_FLIGHT, which returns the old word. If
//   its tag is not the one under which the thread found the block in the active table
//   (`active_value`), the slot holds another block now: the thread adds nothing, leaves
//   (subtracts 1 again) and looks its block up anew. If the gate was CLOSED, it adds
//   nothing and leaves.
// - The thread whose `rcvd_cnt` increment completes the block CLOSEs it (fetch-or); a timer
//   thread that finds it aged enters, closes it and leaves. A closed block admits no new
//   adder.
// - Whoever leaves a CLOSED gate as the last one IN_FLIGHT (the last adder, a packet that
//   found the block closed, or the timer) then sets TAKEN (fetch-or); the one that finds
//   TAKEN clear finishes the block: its sums and counts are final. The take follows the
//   leave: by then another thread may have gone through the closed gate, left last, taken
//   and finished the block, and a new block taken the slot. A take that finds another tag
//   in the word its fetch-or returns clears the TAKEN it set and finishes nothing (if the
//   new block's own last leaver found TAKEN set in that window, the new block is left
//   closed and empty: see below).
// - A thread in the gate keeps the block in its slot only if it entered the gate open:
//   once a block is closed, its last leaver may take and finish it, its finisher free the
//   slot, and a new block take it, while a thread that entered the closed gate is still in
//   it. So a thread finishes only a block whose tag it still finds when it leaves, and the
//   timer closes only a gate it entered open. One that finds another tag on leaving may
//   have been the last out of the new block: that block, closed and empty, is finished by
//   the next thread through its gate (a packet of the block, or the timer once the block
//   ages; a timer that finds it TAKEN by a stale take leaves it, and the next scan lists
//   it again).
// - A thread claiming a slot for a new block enters first, then writes the gate word
//   under a mask that keeps IN_FLIGHT (threads that entered under the old tag are still
//   counted, and subtract themselves when they leave), the new tag (the old one plus 1)
//   first, then the rest of the record: a thread that reads the record and then finds the
//   tag it expects (`check_source`) read the record of its own block.

/// The gate's word (see above).
pub(super) const GATE_W: u64 = Block::CLOSED.word();
/// CLOSED: no adder may enter any more.
pub(super) const GATE_CLOSED: u64 = Block::CLOSED.mask();
/// TAKEN: a thread has claimed the finishing of the block.
pub(super) const GATE_TAKEN: u64 = Block::TAKEN.mask();
/// DEGRADED: a source's packet was itself a partial Result (a lower aggregator gave up on
/// a straggler), so this block's Result is partial too. Sticky; set before the source is
/// counted.
pub(super) const GATE_DEGRADED: u64 = Block::DEGRADED.mask();
/// IN_FLIGHT: adders between entering and leaving.
pub(super) const GATE_IN_FLIGHT: u64 = Block::IN_FLIGHT.mask();
/// Word delta: one thread enters (a 64-bit add, so that it returns the tag too).
pub(super) const GATE_ENTER: u64 = 1 << Block::IN_FLIGHT.shift();
/// Word delta: one thread leaves (`-1` modulo 2^64: IN_FLIGHT is the word's low bits, and
/// never below 1 before a leave, so nothing borrows from the fields above it).
pub(super) const GATE_LEAVE: u64 = GATE_ENTER.wrapping_neg();
/// The slot's tag ([`BlockCtx`]'s `slot_tag`), in [`GATE_W`].
pub(super) const GATE_TAG: Field = Block::SLOT_TAG;
const _: () = assert!(
    Block::TAKEN.word() == GATE_W
        && Block::DEGRADED.word() == GATE_W
        && Block::IN_FLIGHT.word() == GATE_W
        && Block::IN_FLIGHT.shift() == 0
        && Block::SLOT_TAG.word() == GATE_W
);

/// The slot tag in a gate word.
pub(super) fn gate_tag(gate: u64) -> u8 {
    GATE_TAG.get_u8(gate)
}

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

/// A job's region: its record (one line), its counter line ([`JOB_COUNTERS`]), its
/// sources' join words (one word per source id,
/// [`JOIN_WORDS`]), its slot bitmap (`ceil(block_cnt_max / 64)` words, rounded up to whole
/// lines), then `block_cnt_max` slots, one block record line each, back to back; then, only
/// when the job's aggregation buffers are not in the accumulator region (it had no room
/// for them), `block_cnt_max` buffers of `block_grad_max` gradients rounded up to 64 bytes.
///
/// The records are packed so that they share pages and lines' neighbourhoods: with a
/// buffer after each record (4 KB for 1024 gradients), every record sat on a page of its
/// own, and a run over a window of blocks touched a page (and a TLB entry) per block.
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
    /// The first slot.
    pub slot0: Addr,
    /// Words of one aggregation buffer (whole lines).
    pub buffer_words: u64,
}

/// Words of the join words: one per source id (whole lines).
pub(super) const JOIN_WORDS: u64 = 256;

impl JobLayout {
    /// The join word of source `src` of the job whose record is at `record`.
    pub fn join_word_of(record: Addr, src: u8) -> Addr {
        record + JOB_COUNTERS + LINE_WORDS + u64::from(src)
    }

    /// The counter line of the job whose record is at `record` ([`JOB_COUNTERS`]), for the
    /// control plane (the program adds [`JOB_W_CURR_CNT`] and its kin to the record).
    pub fn counters_of(record: Addr) -> Addr {
        record + JOB_COUNTERS
    }

    /// The layout of a job region starting at `record`.
    pub fn new(record: Addr, block_cnt_max: u32, block_grad_max: u32, lanes: Lanes) -> JobLayout {
        let runs = Self::join_word_of(record, 0);
        let bitmap = runs + JOIN_WORDS;
        JobLayout {
            record,
            runs,
            bitmap,
            slots: block_cnt_max,
            slot0: bitmap + Self::bitmap_words(block_cnt_max).next_multiple_of(LINE_WORDS),
            buffer_words: Self::buffer_words(block_grad_max, lanes),
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

    /// Words of the whole region: with the aggregation buffers in it (`buffers_inside`), or
    /// without them (they are in the accumulator region).
    pub fn words(
        block_cnt_max: u32,
        block_grad_max: u32,
        lanes: Lanes,
        buffers_inside: bool,
    ) -> u64 {
        let l = JobLayout::new(0, block_cnt_max, block_grad_max, lanes);
        let buffers = if buffers_inside { l.buffer_words } else { 0 };
        l.slot0 + u64::from(block_cnt_max) * (LINE_WORDS + buffers)
    }

    /// Slot `k`'s block record line.
    pub fn slot(&self, k: u32) -> Addr {
        self.slot0 + u64::from(k) * LINE_WORDS
    }

    /// Slot `k`'s aggregation buffer: in the job's accumulator buffers when `bufs` (the
    /// job line's [`JOB_BUFS_AT`] field) is not 0, else in the region, after every slot.
    pub fn buffer(&self, bufs: u32, k: u32) -> Addr {
        let first = if bufs == 0 {
            self.slot(self.slots)
        } else {
            addr_of(bufs)
        };
        first + u64::from(k) * self.buffer_words
    }

    /// The slot whose record is at `record`, if it is one of this job's.
    pub fn slot_of(&self, record: Addr) -> Option<u32> {
        let off = record.checked_sub(self.slot0)?;
        (off % LINE_WORDS == 0 && off / LINE_WORDS < u64::from(self.slots))
            .then_some((off / LINE_WORDS) as u32)
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

/// An active-table value that is no record yet: a thread is creating the block. Creating
/// starts by inserting the key with this value, so of several packets racing to create a
/// block exactly one does (and only it counts a slot against `block_cnt_max`); the others
/// wait for it to publish the record, then join. A creator that fails (job full, no
/// slot) deletes the key, and the waiters try again.
pub(super) const PENDING: u64 = 1 << 62;

/// Value of an active block: its record's 32-bit address (bits 0..32) and its slot's tag
/// (32..40; see [`gate_tag`]). Never [`PENDING`].
pub(super) fn active_value(record: Addr, tag: u8) -> u64 {
    u64::from(tag) << 32 | u64::from(paddr(record))
}

/// `(record, tag)` of an [`active_value`].
pub(super) fn parse_active_value(v: u64) -> (Addr, u8) {
    (addr_of(v as u32), (v >> 32) as u8)
}

/// Key of a kept result: `job_id`, `block_id` (big-endian).
pub(super) fn kept_key(job: u8, block: u32) -> [u8; 5] {
    let b = block.to_be_bytes();
    [job, b[0], b[1], b[2], b[3]]
}

/// Value of a kept result: its block record's 32-bit address (bits 0..32), its generation
/// (32..48), its age (48..60: kept scans since a packet last asked for it, 0 here; the
/// timer threads count it, see [`kept_age`], and mark a Result of a left run with
/// [`LEFT_RUN_MARK`]) and its run (60..64). The run is the record's
/// own, kept here too so that a packet weighing the Result does not read the record's
/// line: nobody has touched it for a generation by then.
pub(super) fn kept_value(gen: u16, record: Addr, run: u8) -> u64 {
    debug_assert!(run <= super::wire::MAX_RUN_ID, "a run id is 4 bits");
    u64::from(run) << KEPT_RUN_SHIFT | u64::from(gen) << 32 | u64::from(paddr(record))
}

/// `(gen, record)` of a [`kept_value`], whatever its age.
pub(super) fn parse_kept_value(v: u64) -> (u16, Addr) {
    ((v >> 32) as u16, addr_of(v as u32))
}

/// The run of a [`kept_value`].
pub(super) fn kept_run(v: u64) -> u8 {
    (v >> KEPT_RUN_SHIFT) as u8
}

/// Shift of the age in a [`kept_value`].
const KEPT_AGE_SHIFT: u32 = 48;
/// Shift of the run in a [`kept_value`].
const KEPT_RUN_SHIFT: u32 = 60;
/// The oldest age a [`kept_value`] holds: its 12 bits.
pub(super) const MAX_KEPT_AGE: u16 = (1 << (KEPT_RUN_SHIFT - KEPT_AGE_SHIFT)) - 1;
/// The most kept scans a Result may go unasked before it expires: ages up to this count
/// scans; [`LEFT_RUN_MARK`], the largest age, marks a Result of a run its job has left.
pub(super) const MAX_KEPT_SCANS: u16 = MAX_KEPT_AGE - 1;
/// The age that marks a kept Result whose run its job had left at the last kept scan: the
/// next kept scan deletes it if its run is still left and nobody asked for it.
pub(super) const LEFT_RUN_MARK: u16 = MAX_KEPT_AGE;
/// The age's bits in a [`kept_value`].
const KEPT_AGE_MASK: u64 = (MAX_KEPT_AGE as u64) << KEPT_AGE_SHIFT;

/// The age of a kept result: kept scans since a packet last asked for it.
pub(super) fn kept_age(v: u64) -> u16 {
    ((v & KEPT_AGE_MASK) >> KEPT_AGE_SHIFT) as u16
}

/// `v` with age `age` (at most [`MAX_KEPT_AGE`]).
pub(super) fn with_kept_age(v: u64, age: u16) -> u64 {
    debug_assert!(age <= MAX_KEPT_AGE, "a kept age is 12 bits");
    v & !KEPT_AGE_MASK | u64::from(age) << KEPT_AGE_SHIFT
}

/// Whether two kept values name the same Result (generation, record and run), whatever
/// their ages.
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
        // The record line, the counter line, then the join words.
        assert_eq!(JobLayout::counters_of(DRAM_BASE), DRAM_BASE + 8);
        assert_eq!(l.runs, DRAM_BASE + 16);
        assert_eq!(
            JobLayout::join_word_of(DRAM_BASE, 255),
            DRAM_BASE + 16 + 255
        );
        let bitmap = DRAM_BASE + 16 + 256;
        assert_eq!(l.bitmap, bitmap);
        assert_eq!(JobLayout::bitmap_words(100), 2);
        assert_eq!(l.slot0, bitmap + 8);
        // 17 gradients = 68 bytes -> 2 lines.
        assert_eq!(l.buffer_words, 16);
        // The records are back to back; buffers in the region follow the last one.
        assert_eq!(l.slot(1), bitmap + 8 + 8);
        assert_eq!(l.buffer(0, 0), bitmap + 8 + 100 * 8);
        assert_eq!(l.buffer(0, 1), bitmap + 8 + 100 * 8 + 16);
        assert_eq!(l.buffer(paddr(ACC_BASE + 64), 2), ACC_BASE + 64 + 2 * 16);
        // The region holds the records, and the buffers only when they are in it.
        assert_eq!(
            JobLayout::words(100, 17, Lanes::Int32, false),
            l.slot0 - DRAM_BASE + 100 * 8
        );
        assert_eq!(
            JobLayout::words(100, 17, Lanes::Int32, true),
            l.slot0 - DRAM_BASE + 100 * (8 + 16)
        );
        assert_eq!(
            l.buffer(0, 99) + 16 - DRAM_BASE,
            JobLayout::words(100, 17, Lanes::Int32, true)
        );
        assert_eq!(l.slot_of(l.slot(99)), Some(99));
        assert_eq!(l.slot_of(l.slot(100)), None);
        assert_eq!(l.slot_of(l.slot(3) + 1), None);
        assert_eq!(l.slot_of(l.slot(3) + 8), Some(4));
        // A buffer kept in the region is no record.
        assert_eq!(l.slot_of(l.buffer(0, 0)), None);
        assert_eq!(l.slot_bit(70), (bitmap + 1, 1 << 6));
        assert_eq!(l.valid_bits(0), u64::MAX);
        assert_eq!(l.valid_bits(1), (1 << 36) - 1);
        assert_eq!(
            JobLayout::words(100, 17, Lanes::Int32, true),
            24 + 256 + 100 * 24
        );
        assert_eq!(
            JobLayout::words(64, 16, Lanes::Int32, true),
            16 + 256 + 8 + 64 * 16
        );
        assert_eq!(
            JobLayout::words(64, 16, Lanes::Int32, false),
            16 + 256 + 8 + 64 * 8
        );
        // FPISA: one 8-byte accumulator word per gradient.
        let fp = Lanes::Fpisa(pfemu::fpisa::Variant::Full);
        assert_eq!(
            JobLayout::words(100, 17, fp, true),
            24 + 256 + 100 * (8 + 24)
        );
        assert_eq!(JobLayout::new(0, 100, 17, fp).buffer_words, 24);
        assert_eq!((Lanes::Int32.chunk_words(), fp.chunk_words()), (8, 16));
    }

    /// Reads word `w` of a record line as shared memory maps it.
    fn word(line: &[u8; 64], w: u64) -> u64 {
        let at = usize::try_from(w).unwrap() * 8;
        u64::from_be_bytes(line[at..at + 8].try_into().unwrap())
    }

    /// The view writes each field the program updates by XTXN; the constants find it.
    #[test]
    fn record_views_and_xtxn_constants_agree() {
        use super::super::wire::{BlockCtx, BlockKey, JobBufs, JobCtx};
        let mut line = [0u8; 64];
        let mut j = JobCtx::new_checked(&mut line[..]).unwrap();
        j.set_block_curr_cnt(0x1234);
        j.set_block_cnt_max(0xABC);
        j.set_block_grad_max(0xDEF);
        j.set_block_exp(0x5A);
        j.set_block_total_cnt(0x89AB_CDEF);
        j.set_run_lock(true);
        j.set_run_id(0x9);
        j.set_src_cnt(0x77);
        JobBufs::new_checked(&mut line[JOB_BUFS_AT..])
            .unwrap()
            .set_bufs_paddr(0xC0DE_0001);
        let w0 = word(&line, JOB_W0);
        assert_eq!(job_w0_fields(w0), (0xABC, 0xDEF, 0x5A));
        assert_eq!((w0 >> 32) as u32 >> CURR_CNT_LANE_SHIFT, 0x1234);
        assert_eq!(CURR_CNT_LANE, 0);
        // block_total_cnt: high half in word 0's low lane, low half in word 1's high lane.
        assert_eq!(w0 as u32 & TOTAL_HI_LANE_MASK, 0x89AB);
        assert_eq!((TOTAL_HI_LANE, TOTAL_LO_LANE), (1, 0));
        assert_eq!(
            (JOB_W_CURR_CNT, JOB_W_TOTAL_HI, JOB_W_TOTAL_LO),
            (JOB_COUNTERS, JOB_COUNTERS, JOB_COUNTERS + 1)
        );
        let w1 = word(&line, TOTAL_LO.word());
        assert_eq!((w1 >> 32) as u32 >> TOTAL_LO_LANE_SHIFT, 0xCDEF);
        let w3 = word(&line, JOB_W_RUN);
        assert_eq!(JOB_W_SRC_CNT, JOB_W_RUN);
        assert_eq!((job_run(w3), job_src_cnt(w3)), (0x9, 0x77));
        assert_eq!(w3 & JOB_RUN_LOCK, JOB_RUN_LOCK);
        assert_eq!((w3 & JOB_RUN_MASK) >> JOB_RUN_SHIFT, 0x9);
        assert_eq!(&line[JOB_BUFS_AT..JOB_BUFS_AT + 4], &[0xC0, 0xDE, 0, 1]);

        let mut line = [0u8; 64];
        let mut b = BlockCtx::new_checked(&mut line[..]).unwrap();
        b.set_block_exp(0x0A);
        b.set_block_age(0x0B);
        b.set_job_ctx_paddr(0x99AA_BBCC);
        b.set_run_id(0x5);
        b.set_degraded(true);
        b.set_grad_cnt(0x123);
        b.set_in_flight(0x0102);
        b.set_contributors(0x33);
        b.set_rcvd_cnt(0x42);
        let mut key = BlockKey::new_checked(&mut line[BLOCK_KEY_AT..]).unwrap();
        key.set_block_id(0x0102_0304);
        key.set_gen_id(0x0506);
        let age = word(&line, BLOCK_W_AGE);
        assert_eq!((BLOCK_EXP.get(age), BLOCK_AGE.get(age)), (0x0A, 0x0B));
        let w1 = word(&line, BLOCK_W_JOB);
        assert_eq!(BLOCK_JOB.get_u32(w1), 0x99AA_BBCC);
        let gate = word(&line, GATE_W);
        assert_eq!((BLOCK_W_GATE, Block::RUN_ID.word()), (GATE_W, GATE_W));
        assert_eq!(BLOCK_GRAD_CNT.get(gate), 0x123);
        assert_eq!(Block::RUN_ID.get_u8(gate), 0x5);
        assert_eq!(gate & GATE_DEGRADED, GATE_DEGRADED);
        assert_eq!(gate & (GATE_CLOSED | GATE_TAKEN), 0);
        assert_eq!(gate & GATE_IN_FLIGHT, 0x0102);
        assert_eq!(gate_tag(gate), 0);
        let lane = (word(&line, BLOCK_W_RCVD_CNT) >> 32) as u32;
        assert_eq!(RCVD_CNT_LANE, 0);
        assert_eq!(lane >> RCVD_CNT_LANE_SHIFT & 0xFF, 0x42);
        assert_eq!(lane >> CONTRIB_LANE_SHIFT & 0xFF, 0x33);
        assert_eq!(
            word(&line, BLOCK_KEY_WORD) & 0xFFFF_FFFF_FFFF,
            0x0102_0304_0506
        );
    }

    #[test]
    fn lane_deltas() {
        assert_eq!(CURR_CNT_DEC, 0xFFFF_0000);
        let w0: u64 = 0x0003_0FA0_0A89_1234; // curr 3, max 0x0FA, grad_max 0x00A, exp 0x89
        assert_eq!(job_w0_fields(w0), (0x0FA, 0x00A, 0x89));
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
        assert_eq!(free_run_after(0, 0), Some(1));
        assert_eq!(free_run_after(15, 0), Some(1));
        assert_eq!(free_run_after(15, 1 << 1 | 1 << 15), Some(2));
        assert_eq!(free_run_after(3, 0xFFFE & !(1 << 9)), Some(9));
        assert_eq!(free_run_after(14, 0xFFFE & !(1 << 2)), Some(2));
        // Only the current run's own id free, or none: no run to move to.
        assert_eq!(free_run_after(15, 0b0111_1111_1111_1110), None);
        assert_eq!(free_run_after(3, 0xFFFE), None);
        assert_eq!(parse_join_word(join_word(7, 0xDEAD_BEEF)), (7, 0xDEAD_BEEF));
        assert_eq!(job_run(0x8500_0000_0000_0000), 5);
        assert_eq!(parse_block_key(&[1]), None);
        assert_eq!(kept_key(9, 1), [9, 0, 0, 0, 1]);
        let v = kept_value(0xBEEF, DRAM_BASE + 64, 15);
        assert_eq!(parse_kept_value(v), (0xBEEF, DRAM_BASE + 64));
        assert_eq!((kept_run(v), kept_age(v)), (15, 0));
        // The age has its own bits: the oldest leaves the Result and its run as they were.
        let old = with_kept_age(v, MAX_KEPT_AGE);
        assert_eq!((kept_age(old), kept_run(old)), (MAX_KEPT_AGE, 15));
        assert_eq!(parse_kept_value(old), (0xBEEF, DRAM_BASE + 64));
        assert!(same_kept(v, old));
        assert_eq!(with_kept_age(old, 0), v);
        assert!(!same_kept(v, kept_value(0xBEEF, DRAM_BASE + 64, 14)));
        assert!(!same_kept(v, kept_value(0xBEEE, DRAM_BASE + 64, 15)));
        assert!(gen_newer(1, 0));
        assert!(gen_newer(0, 0xFFFF));
        assert!(!gen_newer(0, 0));
        assert!(!gen_newer(0xFFFF, 0));
    }
}
