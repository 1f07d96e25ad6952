//! The Trio-ML Microcode program: the aggregation workflow of Figure 10, the Result
//! generation, standard forwarding, and the straggler scan of the timer threads (§5).
//!
//! ```text
//! parse --not for us--> forward (route by IPv4 destination)
//!   |
//! lookup_block --miss--> lookup_result --same gen--> answer_result
//!   | hit                                    |  \--older gen--> control_reply (Gone, to
//!   |                                        |                  a server; stale_gen)
//!   |                                        | miss or newer gen        (the kept Result,
//!   |                                        v                          to the source)
//!   |    create_block -> claim_slot ----------------------------------------------+ new
//!   |    (another thread created it:      |                                      |
//!   v     lookup_block again, a hit)      |                                      |
//! check_source <--------------------------+                                      |
//!   v                                                                            |
//! join_block --closed--> leave_block --> lookup_result (answer, or drop)         |
//!   v                                                                            |
//! aggregate_head <---------------------------------------------------------------+
//!   v
//! aggregate_tail (the loop over 64-byte chunks, up to 4 KB per instruction)
//!   v
//! complete_check (rcvd_cnt += 1; the last source closes the block)
//!   v
//! leave_block --last one out of a closed block--> take_block --taken--> finish_block
//!   --> consume
//!
//! new block: claim_slot (writing the record) -> aggregate_head -> aggregate_tail (writing
//!   the packet's gradients over the buffer's lines) -> insert_block (publishing the
//!   record) -> complete_check
//!
//! finish_block (subroutine): finish_start -> result_headers -> result_tail (the Result
//!                             built from the slot while nobody else can free it)
//!                             -> keep_result [-> replace_kept, over an older kept Result]
//!                             -> release_block -> free_replaced (the replaced Result's
//!                             slot, or this block's when its Result is not kept)
//!                             -> emit_result (the send, safe from a later fault)
//! build_result (subroutine): result_headers -> result_tail (256 B per instruction)
//!                            -> emit_result
//!
//! runs: parse --a Join (ctl)--> join_run (under the job's Join lock) --> control_reply
//!       (Joined, to the sender); create_block / check_source --gradients of a run the job
//!       has left--> superseded --> control_reply (Superseded)
//!
//! timer: scan_blocks (age every block of the slice) -> close_aged (one aged block per
//!        instruction; the last one out goes to take_aged, and calls finish_block if it
//!        takes the block)
//!        -> scan_kept (every KEPT_SCAN_EVERY periods, or a multiple: age the slice's kept
//!        Results, take the expired ones)
//!        -> free_expired (one slot per instruction)
//!
//! fault handler (a packet or timer thread that faulted, before the engine drops its
//!                packet): on_fault (gives back what R_HELD says the thread holds: a block
//!                being created, a place in a gate, a take it owes, a finish it began,
//!                expired Results' slots to free)
//!                [-> fault_take] [-> finish_block, whole or from release_block]
//!                [-> free_expired] -> fault_done
//! ```
//!
//! Each phase is one function that defines its instructions: `parse_phase` (steps 1 and
//! 8), `lookup_phase` (2, and loss recovery), `create_phase` and `publish_phase` (3),
//! `join_phase` (4), `aggregate_phase` (5 and 6), `finish_phase` and `result_phase` (7),
//! `timer_phase` (the straggler scan), `run_phase` (the run protocol) and `fault_phase`
//! (the fault handler). They share the
//! labels (`Labels`, declared once), the typed registers (`R_*`, from `registers!`) and
//! the drop reasons ([`TrioMlDrop`]).
//!
//! Phase one adds the 16-gradient chunks that lie wholly in the head, straight from local
//! memory. Gradients start at byte 54, so with a 192-byte head 34 are in it and the 35th
//! straddles head and tail: phase two takes every remaining chunk (16 gradients, or fewer
//! for the last, padded with zero lanes), staging the part still in the head and reading
//! the rest from the tail. Chunk `c` always goes to buffer line `c`, gradient `i` to lane
//! `i`. The packet that creates its block writes its chunks over the buffer's lines instead
//! of adding them (integer lanes; see the crate's *State*), then publishes the record.

use std::net::Ipv4Addr;

use super::layout::*;
use super::wire::*;
use super::{Tables, TrioMlConfig, NO_BLOCK_TIMEOUT};
use crate::microcode::fpisa;
use pfemu::mem::hash::{HashError, HashTable, Inserted, ScanAction};
use pfemu::mem::{Addr, MAX_VADD_BYTES};
use pfemu::prelude::*;
use pfemu::program::{ProgramBuilder, RegValue, DEFAULT_HEAD_OFFSET, LOCAL_MEMORY_BYTES};
use pfemu::wire::{Ether, Field, Ipv4, Udp, ETHERTYPE_IPV4, IPPROTO_UDP};

// ----- registers ----------------------------------------------------------------------------

pfemu::registers! {
    /// Set when a finishing block belongs to a run that is no longer its job's: it is freed
    /// without a Result (nobody of that run is left to want it).
    R_SILENT: bool,
    /// The run id a control reply carries.
    R_REPLY_RUN: u8,
    /// The opcode of the control reply being built ([`CTL_JOINED`], [`CTL_SUPERSEDED`] or
    /// [`CTL_GONE`]).
    R_CTL_OP: u8,
    /// The packet's `run_id` (the block's, while a block is finished).
    R_RUN: u8,
    /// The packet's `job_id`.
    R_JOB_ID: u8,
    /// The packet's `block_id`.
    R_BLOCK_ID: u32,
    /// The packet's `gen_id`.
    R_GEN_ID: u16,
    /// The packet's `src_id`.
    R_SRC_ID: u8,
    /// The packet's `grad_cnt` (the block's, while a Result is built).
    R_GRAD_CNT: u16,
    /// The block record's address.
    R_BLK: Addr,
    /// The tag of the block's slot ([`gate_tag`]) when the packet found the block (or
    /// claimed the slot); while a Result is built, its slot's tag when the build began.
    R_TAG: u8,
    /// The job record's address.
    R_JOB: Addr,
    /// The job's `src_cnt`.
    R_SRC_CNT: u8,
    /// The aggregation buffer's address.
    R_BUF: Addr,
    /// Loop counter: the chunk being added or copied out.
    R_CHUNK: usize,
    /// Where the Result goes: an `out_nh_addr` value, or [`ResultDest::Job`].
    R_DEST: ResultDest,
    /// A slot to free once the Result is out (0: none).
    R_FREE: Addr,
    /// The kept Result `keep_result` found for the block id, which `replace_kept` replaces.
    R_SEEN: u64,
    /// Where `leave_block` continues: an [`After`].
    R_AFTER: After,
    /// Set when the block was closed before this packet could join it.
    R_CLOSING: bool,
    /// Set when the closed block had this packet's source received already.
    R_RECEIVED: bool,
    /// Set while this packet creates its block: its gradients are written into the block's
    /// buffer, not added, before the record is published.
    R_CREATOR: bool,
    /// The job's `block_cnt_max` and `block_grad_max` (while creating a block).
    R_CNT_MAX: u32,
    /// See [`R_CNT_MAX`].
    R_GRAD_MAX: u32,
    /// The job's `block_exp` (while creating a block).
    R_EXP: u8,
    /// Timer: aged blocks listed in local memory, and the next one to close.
    R_AGED_N: usize,
    /// See [`R_AGED_N`].
    R_AGED_I: usize,
    /// The job's accumulator buffers (its line's `JOB_BUFS_AT` field), while creating a block.
    R_BUFS: u32,
    /// What the packet's source counts for in the Result's `src_cnt`: 1 for a server (header
    /// `src_cnt` 0), a lower aggregator's `src_cnt` for its Result.
    R_CONTRIB: u8,
    /// The packet's own `degraded` bit (a lower aggregator's partial Result).
    R_PKT_DEGRADED: bool,
    /// Set while a kept Result is sent again to one source ([`Answer::Sending`]); emit_result
    /// sets [`Answer::Expired`] instead of sending when the Result stopped being kept.
    R_ANSWER: Answer,
    /// What the thread holds that other threads wait for ([`Held`]): what the fault
    /// handler (`on_fault`) gives back if the thread faults.
    R_HELD: Held,
}

/// What a thread holds that other threads wait for ([`R_HELD`]), noted after each XTXN
/// that takes or gives back a share of a block, so that a thread that faults (its
/// instruction budget run out, say) gives it back in the program's fault handler instead
/// of leaving the block unfinished for ever. The block is [`R_BLK`], its slot's tag
/// [`R_TAG`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// Nothing.
    Nothing,
    /// A block being created: its key (PENDING) in the active table, its slot, and a place
    /// in its gate; the record is not published yet, so nobody else joined it.
    Creating,
    /// A place in the block's gate (under whatever tag the slot had: one that finds
    /// another than [`R_TAG`] leaves it all the same).
    Gate,
    /// The thread left the closed block last: it owes the block its take.
    Take,
    /// TAKEN, set by a stale take on a block of another tag, not cleared yet.
    StaleTaken,
    /// The block, taken: its finish has committed nothing yet (it starts again).
    Finishing,
    /// The block, taken, its Result kept (or its slot's fate decided): its finish goes on
    /// at release_block.
    Releasing,
    /// A timer's expired Results, deleted from the kept table and listed in local memory
    /// ([`R_AGED_N`]), their slots freed up to [`R_AGED_I`]: nobody else frees them.
    FreeingExpired,
}

impl RegValue for Held {
    fn to_reg(self) -> u64 {
        self as u64
    }
    fn from_reg(bits: u64) -> Self {
        match bits {
            1 => Held::Creating,
            2 => Held::Gate,
            3 => Held::Take,
            4 => Held::StaleTaken,
            5 => Held::Finishing,
            6 => Held::Releasing,
            7 => Held::FreeingExpired,
            _ => Held::Nothing,
        }
    }
}

/// Where a Result goes ([`R_DEST`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ResultDest {
    /// Where the job says (`out_nh_addr`).
    Job,
    /// This `out_nh_addr` value (a port or a multicast group).
    NextHop(u32),
}

impl RegValue for ResultDest {
    fn to_reg(self) -> u64 {
        match self {
            ResultDest::Job => u64::MAX,
            ResultDest::NextHop(nh) => u64::from(nh),
        }
    }
    fn from_reg(bits: u64) -> Self {
        u32::try_from(bits).map_or(ResultDest::Job, ResultDest::NextHop)
    }
}

/// Where `leave_block` continues ([`R_AFTER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum After {
    /// The packet was added; consume it.
    Consume,
    /// The packet repeated a source already added; drop it.
    Duplicate,
    /// The block was closed before the packet could join; look at kept results.
    Closing,
    /// The slot holds another block than the one the packet found (its tag changed): look
    /// the block up again.
    Gone,
}

impl RegValue for After {
    fn to_reg(self) -> u64 {
        match self {
            After::Consume => 0,
            After::Duplicate => 1,
            After::Closing => 2,
            After::Gone => 3,
        }
    }
    fn from_reg(bits: u64) -> Self {
        match bits {
            0 => After::Consume,
            1 => After::Duplicate,
            2 => After::Closing,
            _ => After::Gone,
        }
    }
}

/// A kept Result being sent again ([`R_ANSWER`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Not an answer: the Result of a block just finished.
    No,
    /// Sending a kept Result again.
    Sending,
    /// The kept Result expired (or was replaced) while it was being built.
    Expired,
}

impl RegValue for Answer {
    fn to_reg(self) -> u64 {
        match self {
            Answer::No => 0,
            Answer::Sending => 1,
            Answer::Expired => 2,
        }
    }
    fn from_reg(bits: u64) -> Self {
        match bits {
            1 => Answer::Sending,
            2 => Answer::Expired,
            _ => Answer::No,
        }
    }
}

// ----- local memory -------------------------------------------------------------------------
// The head is loaded at offset 64 (DEFAULT_HEAD_OFFSET); the 64 bytes before it are the
// scratch line used while the head is still needed. Once a packet is aggregated its head is
// dead and a Result is built over it.

/// Scratch line before the head: a staged chunk of gradients, a copy of the job record, a
/// new block record, zeroes.
const LM_SCRATCH: usize = 0;
/// The Result's headers.
const LM_RESULT_HDR: usize = 0;
/// One 256-byte chunk of the Result's gradients.
const LM_RESULT_DATA: usize = 64;
/// A copy of the block record (Result generation).
const LM_BLOCK_REC: usize = LM_RESULT_DATA + RESULT_CHUNK_BYTES;
/// A copy of the job record (Result generation).
const LM_JOB_REC: usize = LM_BLOCK_REC + LINE_BYTES;
/// Timer threads: the aged blocks found by the scan, [`AGED_ENTRY_BYTES`] each.
const LM_AGED: usize = 512;
/// An aged-block entry: the 8-byte block key and the record's address; an expired Result's
/// entry: its kept value in the last 8 bytes.
const AGED_ENTRY_BYTES: usize = 16;
/// Aged blocks one timer launch finishes at most; the others stay aged and are finished by
/// the slice's next scan.
pub(super) const MAX_AGED_PER_SCAN: usize = (LOCAL_MEMORY_BYTES - LM_AGED) / AGED_ENTRY_BYTES;

const _: () = assert!(LM_SCRATCH + LINE_BYTES <= DEFAULT_HEAD_OFFSET);
const _: () = assert!(LM_RESULT_HDR + HEADERS_LEN <= LM_RESULT_DATA);
const _: () = assert!(LM_JOB_REC + LINE_BYTES <= LM_AGED);

/// Bytes of a 64-byte line (one record; one RMW vector add of 16 gradients).
const LINE_BYTES: usize = 64;
/// Gradients per line.
const CHUNK_GRADS: usize = LINE_BYTES / GRAD_BYTES;
/// Bytes of a Result tail chunk (Figure 10: 256 bytes per iteration).
const RESULT_CHUNK_BYTES: usize = 256;
// A chunk of the Result's sums (FPISA's already renormalized into FP32) stays below LM_AGED.
const _: () = assert!(LM_RESULT_DATA + RESULT_CHUNK_BYTES <= LM_AGED);
/// Phase two's 64-byte chunks per instruction: up to 4 KB of tail, the largest vector add
/// the engine takes in one request ([`MAX_VADD_BYTES`]), so a packet of 1024 gradients runs
/// phase two in one instruction. Every chunk is still its own 64-byte tail read and 16-lane
/// vector add, the paper's loop iteration (the XTXNs counted are the loop's); what an
/// instruction per 256 bytes added was the sequencer's dispatch and a first read of a cold
/// tail line in each, which cost Trio-ML about a sixth of its rate (`src/pfe/README.md`).
const TAIL_CHUNKS_PER_INSTR: usize = MAX_VADD_BYTES / LINE_BYTES;
/// Nanoseconds per millisecond (`block_exp` is in ms).
const NS_PER_MS: u64 = 1_000_000;

pfemu::drop_reasons! {
    /// Why Trio-ML drops (or, for the answered ones, uses up) a packet, counted by name.
    pub enum TrioMlDrop {
        /// Not an IPv4 frame.
        NotIpv4 = "not_ipv4",
        /// Forwarding: no route to the IPv4 destination.
        NoRoute = "no_route",
        /// The packet's lengths disagree with its `grad_cnt`.
        BadLength = "bad_length",
        /// No such job.
        UnknownJob = "unknown_job",
        /// The source is not a member of the job.
        UnknownSource = "unknown_source",
        /// More gradients than the job's blocks hold.
        BlockGradMax = "block_grad_max",
        /// The job has no free slot for a new block.
        BlockCntMax = "block_cnt_max",
        /// The active-block table is full.
        TableFull = "table_full",
        /// The packet's `grad_cnt` is not its block's.
        GradCntMismatch = "grad_cnt_mismatch",
        /// A source the block already added.
        Duplicate = "duplicate",
        /// A straggler: the block finished without it.
        Late = "late",
        /// A retransmission, answered with the kept Result.
        RetransmitAnswered = "retransmit_answered",
        /// A generation older than the kept Result's (a server's is answered with
        /// [`Gone`]).
        StaleGen = "stale_gen",
        /// The kept Result expired while it was sent again.
        ResultExpired = "result_expired",
        /// Gradients of a run the job has left (answered with Superseded).
        StaleRun = "stale_run",
        /// A Join, answered with Joined.
        JoinAnswered = "join_answered",
        /// A Join that would start a new run while every other run id still holds slots
        /// (kept Results of earlier runs): not answered, so the worker sends it again.
        RunsBusy = "runs_busy",
        /// A malformed or unexpected control message.
        BadControl = "bad_control",
    }
}

fn drop_as(r: TrioMlDrop) -> InstrResult {
    Ok(Done(Verdict::Drop(r.into())))
}

// ----- helpers: one XTXN pattern each ------------------------------------------------------

/// Adds one 64-byte chunk of big-endian gradients in local memory to the buffer line at
/// `addr` with the RMW engine's 16-lane vector add (one XTXN, lanes straight from the
/// packet's bytes). The one place the vector add is issued. Posted, as the paper's
/// gradient adds are fire-and-forget: the thread waits for them ([`Thread::wait_posted`])
/// in `complete_check`, before it counts its source. A packet's adds go to consecutive
/// lines, so the engine applies them as one vector add over the whole packet.
///
/// With FPISA lanes ([`Lanes::Fpisa`]) the chunk's 16 floats go to 16 accumulator words from
/// `addr` with the engine's shift-and-add instead ([`fpisa::add_chunk`]), posted and merged
/// the same way.
///
/// The packet that creates its block ([`R_CREATOR`]) writes the chunk over the buffer
/// instead: its buffer holds whatever its slot held last, and the first packet's lanes are
/// what adding them into zeros would leave. With integer lanes that is one 64-byte write
/// XTXN; with FPISA lanes the accumulators the floats make ([`fpisa::write_chunk`]).
///
/// FPISA's 16 accumulator words are two lines, and a buffer ends at the line after its
/// last gradient's ([`JobLayout::buffer_words`]):
/// a short last chunk's second line may lie past it, in the next slot's buffer or past the
/// region's end. So with FPISA lanes a chunk writes or adds the lines of its `grads`
/// gradients only (still one `fpisa_add16` XTXN).
#[inline(always)]
fn add_chunk(
    t: &mut Thread<'_>,
    lanes: Lanes,
    addr: Addr,
    lm_offset: usize,
    grads: usize,
) -> Result<(), Fault> {
    // Whole lines of accumulator words: 8 gradients each.
    let fpisa_bytes = || grads.next_multiple_of(LINE_BYTES / 8) * GRAD_BYTES;
    match lanes {
        Lanes::Int32 if t.get(R_CREATOR) => t.mem_write(addr, lm_offset, LINE_BYTES),
        Lanes::Int32 => t.post_vadd32_be(addr, lm_offset, LINE_BYTES),
        Lanes::Fpisa(variant) if t.get(R_CREATOR) => {
            fpisa::write_chunk(t, variant, addr, lm_offset, fpisa_bytes())
        }
        Lanes::Fpisa(variant) => fpisa::add_chunk(t, variant, addr, lm_offset, fpisa_bytes()),
    }
}

/// Adds `bytes` of whole chunks read from the tail at `tail_offset` (through local memory at
/// `lm_offset`) to the buffer at `addr`: a tail read and an [`add_chunk`] per chunk (a
/// write, for a creator), in one call.
fn add_tail_chunks(
    t: &mut Thread<'_>,
    lanes: Lanes,
    addr: Addr,
    tail_offset: usize,
    lm_offset: usize,
    bytes: usize,
) -> Result<(), Fault> {
    match lanes {
        Lanes::Int32 if t.get(R_CREATOR) => {
            t.read_tail_post_write(addr, tail_offset, lm_offset, bytes)
        }
        Lanes::Int32 => t.read_tail_post_vadd32_be(addr, tail_offset, lm_offset, bytes),
        Lanes::Fpisa(variant) if t.get(R_CREATOR) => {
            fpisa::write_tail_chunks(t, variant, addr, tail_offset, lm_offset, bytes)
        }
        Lanes::Fpisa(variant) => {
            fpisa::add_tail_chunks(t, variant, addr, tail_offset, lm_offset, bytes)
        }
    }
}

/// Whether source `s` is set in the four masks starting at `words` (the words of a record).
fn mask_has(words: u64, s: u8) -> bool {
    source(s).get(words) != 0
}

/// Source `s`'s bit in a job's `src_mask` or a block's `rcvd_mask` (they lie at the same
/// bits of both records).
fn source(s: u8) -> Field {
    BlockCtxLayout::RCVD_MASK.bit(usize::from(s))
}
const _: () = assert!(BlockCtxLayout::RCVD_MASK.first.bit == JobCtxLayout::SRC_MASK.first.bit);

/// The job record's address, from the block record's `job_ctx_paddr`.
fn job_of(t: &mut Thread<'_>, rec: Addr) -> Result<Addr, Fault> {
    let w = t.read_u64(rec + BLOCK_W_JOB)?;
    Ok(addr_of(BLOCK_JOB.get_u32(w)))
}

/// The active-blocks key of the packet's block: (job, run, block, generation).
fn packet_block_key(t: &Thread<'_>) -> [u8; BLOCK_KEY_BYTES] {
    block_key(
        t.get(R_JOB_ID),
        t.get(R_RUN),
        t.get(R_BLOCK_ID),
        t.get(R_GEN_ID),
    )
}

/// Sets the gate's TAKEN bit; true if this thread set it on the block of slot tag `tag`
/// (and so finishes the block). The take follows the thread's leave, outside the gate: the
/// block may have been finished by another thread meanwhile and a new block have taken the
/// slot. A TAKEN set on that block is cleared again and the take fails: the new block, if
/// its own last leaver failed its take meanwhile, is left closed and empty, and the next
/// thread through its gate (or the timer) finishes it.
///
/// The thread owes the block this take ([`Held::Take`]) until it returns; then it holds the
/// block to finish ([`Held::Finishing`]) or nothing.
fn take(t: &mut Thread<'_>, rec: Addr, tag: u8) -> Result<bool, Fault> {
    let old = t.fetch_or(rec + GATE_W, GATE_TAKEN)?;
    if gate_tag(old) != tag {
        if old & GATE_TAKEN == 0 {
            t.set(R_HELD, Held::StaleTaken);
            t.fetch_clear(rec + GATE_W, GATE_TAKEN)?;
        }
        t.set(R_HELD, Held::Nothing);
        return Ok(false);
    }
    let won = old & GATE_TAKEN == 0;
    t.set(R_HELD, if won { Held::Finishing } else { Held::Nothing });
    Ok(won)
}

/// The job's slot layout, from word 0 of its record.
fn job_layout(t: &mut Thread<'_>, job: Addr, lanes: Lanes) -> Result<JobLayout, Fault> {
    let (cnt_max, grad_max, _) = job_w0_fields(t.read_u64(job + JOB_W0)?);
    Ok(JobLayout::new(job, cnt_max, grad_max, lanes))
}

/// Returns the slot holding block record `rec` to the job's pool: clears its bitmap bit
/// and decrements `block_curr_cnt`.
fn free_slot(t: &mut Thread<'_>, job: Addr, rec: Addr, lanes: Lanes) -> Result<(), Fault> {
    let layout = job_layout(t, job, lanes)?;
    if let Some(k) = layout.slot_of(rec) {
        let (word, bit) = layout.slot_bit(k);
        t.fetch_clear(word, bit)?;
        t.fetch_add32(job + JOB_W_CURR_CNT, CURR_CNT_LANE, CURR_CNT_DEC)?;
    }
    Ok(())
}

/// Where block `block` of generation `gen` starts looking for a free slot among `cnt_max`.
/// A host that reuses its block ids needs two slots per id: the kept Result of one
/// generation while the next one aggregates (see *State* in the module's documentation).
/// So even generations start in the first half of the slots and odd ones in the second:
/// with `cnt_max` at least twice the ids in use, each block finds its slot free at the
/// first probe. Starting both at `block % cnt_max` made an odd generation's blocks walk the
/// bitmap past the slots the even one still keeps (`bench trio-ml`: 21.63 reads per packet
/// then, 21.19 with the home slots).
fn home_slot(block: u32, gen: u16, cnt_max: u32) -> u32 {
    let half = cnt_max / 2;
    if half == 0 {
        return 0;
    }
    block % half + u32::from(gen & 1) * half
}

/// Claims a free slot in the job's bitmap, probing linearly from slot `home`: reads a
/// bitmap word, sets its first free bit at or after the probe position with fetch-or, and
/// re-reads the word if another thread set that bit first.
fn claim_free_slot(t: &mut Thread<'_>, l: &JobLayout, home: u32) -> Result<Option<u32>, Fault> {
    let words = JobLayout::bitmap_words(l.slots);
    // Every word once from the home bit on, then the home word's bits before it, plus
    // room for lost races.
    let mut budget = 2 * words + 64;
    let (mut w, mut from) = (u64::from(home / 64), home % 64);
    let mut wrapped = false;
    while budget > 0 {
        budget -= 1;
        let word = t.read_u64(l.bitmap + w)?;
        let free = !word & l.valid_bits(w) & (u64::MAX << from);
        if free != 0 {
            let bit = free.trailing_zeros();
            if t.fetch_or(l.bitmap + w, 1 << bit)? & (1 << bit) == 0 {
                return Ok(Some((w * 64) as u32 + bit));
            }
            continue;
        }
        w += 1;
        from = 0;
        if w == words {
            if wrapped {
                break;
            }
            w = 0;
            wrapped = true;
        }
    }
    Ok(None)
}

/// The Join decision, under the job's Join lock: the run source `src` of the job at `job`
/// joins with `nonce`, given the job's run word `w3` before the lock. A source that joined
/// the current run before with another nonce restarted: the job moves on to a new run, the
/// first id after the current one that no slot holds ([`runs_in_use`], [`free_run_after`]).
/// `None` while every other id is held: the Join is refused, and the worker, which sends it
/// again until it is answered, joins once the old Results expire.
fn decide_join(
    t: &mut Thread<'_>,
    job: Addr,
    w3: u64,
    src: u8,
    nonce: u32,
    lanes: Lanes,
) -> Result<Option<u8>, Fault> {
    let at = JobLayout::join_word_of(job, src);
    let current = job_run(w3);
    let (joined, their_nonce) = parse_join_word(t.read_u64(at)?);
    let run = if current == 0 || (joined == current && their_nonce != nonce) {
        let layout = job_layout(t, job, lanes)?;
        match free_run_after(current, runs_in_use(t, &layout)?) {
            Some(run) => run,
            None => return Ok(None),
        }
    } else {
        current
    };
    t.write_u64(at, join_word(run, nonce))?;
    Ok(Some(run))
}

/// The runs whose blocks or kept Results hold slots of the job: bit `r` for run `r`. Reads
/// the slot bitmap and the gate word of each slot in use (a restart's Join, not the data
/// path: nothing is counted per block). `claim_slot` writes the new block's record as it
/// takes the slot, and a kept Result's record keeps its run until its slot is freed.
/// (A packet that passed its run's check and is held before it claims a slot can still
/// create a block of an id that came back meanwhile, as any packet of a run left 15 runs
/// ago could: 4 bits cannot tell them apart.)
fn runs_in_use(t: &mut Thread<'_>, l: &JobLayout) -> Result<u16, Fault> {
    let mut in_use = 0u16;
    for w in 0..JobLayout::bitmap_words(l.slots) {
        let mut bits = t.read_u64(l.bitmap + w)? & l.valid_bits(w);
        while bits != 0 {
            let k = (w * 64) as u32 + bits.trailing_zeros();
            bits &= bits - 1;
            in_use |= 1 << block_run(t.read_u64(l.slot(k) + GATE_W)?);
        }
    }
    Ok(in_use)
}

/// Counts a created block in `block_total_cnt`, in the job's counter line
/// ([`JOB_COUNTERS`]), where it straddles words 0 and 1 as in the record: a 32-bit add of 1
/// to its low half (the top 16 bits of word 1); when that half wraps, the carry is added to
/// the high half (the low 16 bits of word 0) with a second add; and when the whole counter
/// wraps (every 2^32 blocks) the carry that second add pushed into `block_exp`'s bits (zero
/// in the counter line) is taken back with a third. Between two of these adds a reader may
/// see the counter 65536 low.
fn count_block(t: &mut Thread<'_>, job: Addr) -> Result<(), Fault> {
    let old_lo =
        t.fetch_add32(job + JOB_W_TOTAL_LO, TOTAL_LO_LANE, TOTAL_LO_INC)? >> TOTAL_LO_LANE_SHIFT;
    if old_lo == 0xFFFF {
        let old_hi =
            t.fetch_add32(job + JOB_W_TOTAL_HI, TOTAL_HI_LANE, TOTAL_HI_INC)? & TOTAL_HI_LANE_MASK;
        if old_hi == TOTAL_HI_LANE_MASK {
            t.fetch_add32(job + JOB_W_TOTAL_HI, TOTAL_HI_LANE, TOTAL_HI_CARRY_BACK)?;
        }
    }
    Ok(())
}

pfemu::labels!(
    /// Every label of the program, declared once (see the diagram in the module doc).
    struct Labels {
        parse,
        forward,
        lookup_block,
        lookup_result,
        answer_result,
        answered,
        answered_late,
        create_block,
        claim_slot,
        insert_block,
        check_source,
        join_block,
        aggregate_head,
        aggregate_tail,
        complete_check,
        leave_block,
        take_block,
        consume,
        drop_duplicate,
        closing_drop,
        finish_start,
        keep_result,
        replace_kept,
        release_block,
        free_replaced,
        result_headers,
        result_tail,
        emit_result,
        scan_blocks,
        close_aged,
        take_aged,
        scan_kept,
        free_expired,
        join_run,
        superseded,
        control_reply,
        on_fault,
        fault_take,
        fault_done,
    }
);

/// What the instructions need of the configuration, computed once.
#[derive(Clone, Copy)]
struct Ctx {
    local_addr: u32,
    udp_port: u16,
    local_mac: [u8; 6],
    scan_period_ns: u64,
    /// Scan periods from one kept scan to the next ([`super::kept_schedule`]).
    kept_every: u64,
    /// Kept scans a Result may go unasked before it is dropped (0: never).
    keep_scans: u16,
    lanes: Lanes,
    /// The FPISA event counters (only FPISA lanes count events; integer lanes never read it).
    events: Addr,
}

/// Builds the program for an installed Trio-ML: the phases of the workflow, in order.
pub(super) fn build(cfg: &TrioMlConfig, tables: &Tables) -> Program {
    let mut p = Program::builder("trio_ml");
    p.drop_reasons::<TrioMlDrop>();
    let l = Labels::declare(&mut p);
    let local_addr = u32::from(cfg.local_addr);
    let udp_port = cfg.udp_port;
    let local_mac = cfg.local_mac;
    let scan_period_ns = cfg.scan_period_ns;
    let (kept_every, keep_scans) = super::kept_schedule(cfg.keep_result_ns, scan_period_ns);
    let lanes = cfg.lanes;
    let events = tables.fpisa_events.unwrap_or(0);

    let c = Ctx {
        local_addr,
        udp_port,
        local_mac,
        scan_period_ns,
        kept_every,
        keep_scans,
        lanes,
        events,
    };
    parse_phase(&mut p, l, &c, tables);
    lookup_phase(&mut p, l, &c, tables);
    create_phase(&mut p, l, &c, tables);
    publish_phase(&mut p, l, tables);
    join_phase(&mut p, l, &c, tables);
    aggregate_phase(&mut p, l, &c, tables);
    finish_phase(&mut p, l, &c, tables);
    result_phase(&mut p, l, &c, tables);
    timer_phase(&mut p, l, &c, tables);
    run_phase(&mut p, l, &c, tables);
    fault_phase(&mut p, l, &c, tables);
    p.entry(Entry::Packet, l.parse);
    p.on_fault(l.on_fault);
    p.entry(Entry::Timer(super::TIMER_ENTRY), l.scan_blocks);
    p.build()
        .expect("the Trio-ML program defines every label it declares")
}

/// Step 1 of Figure 10: is the packet an aggregation packet for us (or a Join)? Otherwise, step 8: standard forwarding.
fn parse_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let Ctx {
        local_addr,
        udp_port,
        ..
    } = *c;

    // 1. parse: is this an aggregation packet for us? Validate its lengths.
    p.instr(l.parse, move |t| {
        let Ok(eth) = t.view::<Ether>(0) else {
            return drop_as(TrioMlDrop::NotIpv4);
        };
        if eth.etype() != ETHERTYPE_IPV4 {
            return drop_as(TrioMlDrop::NotIpv4);
        }
        let Ok(ip) = t.view::<Ipv4>(IPV4_AT) else {
            return drop_as(TrioMlDrop::NotIpv4);
        };
        if ip.ver() != 4 {
            return drop_as(TrioMlDrop::NotIpv4);
        }
        if ip.ihl() != 5 || ip.proto() != IPPROTO_UDP || ip.dst() != local_addr {
            return Ok(Goto(l.forward));
        }
        let ip_total = usize::from(ip.total_len());
        let Ok(udp) = t.view::<Udp>(UDP_AT) else {
            return drop_as(TrioMlDrop::BadLength);
        };
        if udp.dst_port() != udp_port {
            return Ok(Goto(l.forward));
        }
        let udp_len = usize::from(udp.len());
        let Ok(hdr) = t.view::<TrioMlHdr>(TRIO_ML_HDR_AT) else {
            return drop_as(TrioMlDrop::BadLength);
        };
        let h = TrioMlHdrFields::read(&hdr);
        let n = usize::from(h.grad_cnt);
        if h.ctl {
            // A control message: the header alone. Workers send only Joins.
            let whole = n == 0
                && udp_len == UDP_LEN + TRIO_ML_HDR_LEN
                && ip_total == IPV4_LEN + udp_len
                && UDP_AT + udp_len <= t.pkt_len();
            if !whole || h.age_op != CTL_JOIN {
                return drop_as(TrioMlDrop::BadControl);
            }
            t.set(R_JOB_ID, h.job_id);
            t.set(R_BLOCK_ID, h.block_id);
            t.set(R_SRC_ID, h.src_id);
            return Ok(Goto(l.join_run));
        }
        let consistent = n >= 1
            && udp_len == UDP_LEN + TRIO_ML_HDR_LEN + n * GRAD_BYTES
            && ip_total == IPV4_LEN + udp_len
            && UDP_AT + udp_len <= t.pkt_len();
        if !consistent {
            return drop_as(TrioMlDrop::BadLength);
        }
        t.set(R_JOB_ID, h.job_id);
        t.set(R_BLOCK_ID, h.block_id);
        t.set(R_GEN_ID, h.gen_id);
        t.set(R_SRC_ID, h.src_id);
        t.set(R_GRAD_CNT, h.grad_cnt);
        t.set(R_CONTRIB, h.src_cnt.max(1));
        t.set(R_PKT_DEGRADED, h.degraded);
        t.set(R_RUN, h.run_id);
        Ok(Goto(l.lookup_block))
    });

    // 8. forward: standard forwarding by an exact-match route on the IPv4 destination.
    let routes = tables.routes.clone();
    p.instr(l.forward, move |t| {
        let dst = t.view::<Ipv4>(IPV4_AT)?.dst();
        Ok(match t.hash_lookup(&routes, &route_key(dst))? {
            Some(nh) => match nh_dest(nh as u32) {
                Dest::Port(port) => Done(Verdict::Forward(port)),
                Dest::Group(g) => Done(Verdict::Multicast(g)),
            },
            None => Done(Verdict::Drop(TrioMlDrop::NoRoute.into())),
        })
    });
}

/// Step 2: the active block of the packet, or, for a block that finished, its kept Result (loss recovery: a retransmission is answered with it).
fn lookup_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let build_result = l.result_headers;
    let _ = c;

    // 2. lookup_block: the active block record of (job, block, generation).
    let active = tables.active.clone();
    p.instr(l.lookup_block, move |t| {
        let key = packet_block_key(t);
        Ok(match t.hash_lookup(&active, &key)? {
            Some(PENDING) => {
                // Another packet of the block is creating it: let the creator run, then
                // look again and join the record it publishes.
                Yield(l.lookup_block)
            }
            Some(v) => {
                let (rec, tag) = parse_active_value(v);
                t.set(R_BLK, rec);
                t.set(R_TAG, tag);
                Goto(l.check_source)
            }
            None => Goto(l.lookup_result),
        })
    });

    // Loss recovery: a block that is not active may have finished; its Result is kept.
    let kept = tables.kept.clone();
    p.instr(l.lookup_result, move |t| {
        let (job, block, gen) = (t.get(R_JOB_ID), t.get(R_BLOCK_ID), t.get(R_GEN_ID));
        let closing = t.get(R_CLOSING);
        // A peek: only a Result sent again counts as asked for (emit_result's check looks
        // it up), so one that only stale packets look at still expires.
        let kept_gen = match t.hash_peek(&kept, &kept_key(job, block))? {
            // A kept Result of another run is no answer to this one (and no newer
            // generation of it): for this run the block id is free.
            Some(v) => {
                let (kgen, rec) = parse_kept_value(v);
                (kept_run(v) == t.get(R_RUN)).then_some((kgen, rec))
            }
            None => None,
        };
        Ok(match kept_gen {
            Some((kgen, rec)) if kgen == gen => {
                t.set(R_BLK, rec);
                Goto(l.answer_result)
            }
            Some((kgen, rec)) if gen_newer(kgen, gen) => {
                // The generation's Result is gone for good (replaced by a newer one): tell
                // a server of the job, which would otherwise ask again until it gives up
                // (a stranger is dropped as answer_result drops it).
                if t.view::<TrioMlHdr>(TRIO_ML_HDR_AT)?.src_cnt() != 0 {
                    return Ok(Done(Verdict::Drop(TrioMlDrop::StaleGen.into())));
                }
                let (job, src) = (job_of(t, rec)?, t.get(R_SRC_ID));
                if !mask_has(t.read_u64(job + source(src).word())?, src) {
                    return drop_as(TrioMlDrop::UnknownSource);
                }
                t.set(R_CTL_OP, CTL_GONE);
                Goto(l.control_reply)
            }
            // The block closed under us and its Result is not kept yet: it is on its way
            // to the whole job.
            _ if closing => Goto(l.closing_drop),
            _ => Goto(l.create_block),
        })
    });

    // A retransmission (or a straggler) of a finished block: send it the kept Result.
    p.instr(l.answer_result, move |t| {
        let rec = t.get(R_BLK);
        let job = job_of(t, rec)?;
        let src = t.get(R_SRC_ID);
        let word = source(src).word();
        if !mask_has(t.read_u64(job + word)?, src) {
            return drop_as(TrioMlDrop::UnknownSource);
        }
        let received = mask_has(t.read_u64(rec + word)?, src);
        t.set(R_DEST, ResultDest::NextHop(nh_addr(Dest::Port(t.port()))));
        t.set(R_ANSWER, Answer::Sending);
        Ok(Call(
            build_result,
            if received {
                l.answered
            } else {
                l.answered_late
            },
        ))
    });
    p.instr(l.answered, move |t| {
        drop_as(if t.get(R_ANSWER) == Answer::Expired {
            TrioMlDrop::ResultExpired
        } else {
            TrioMlDrop::RetransmitAnswered
        })
    });
    p.instr(l.answered_late, move |t| {
        drop_as(if t.get(R_ANSWER) == Answer::Expired {
            TrioMlDrop::ResultExpired
        } else {
            TrioMlDrop::Late
        })
    });
}

/// Step 3: a new block: check the job, claim the block's key and a slot from the job's pool.
fn create_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let Ctx { lanes, .. } = *c;

    // 3. create_block: the job must exist, know the source and allow the gradients.
    let jobs = tables.jobs.clone();
    p.instr(l.create_block, move |t| {
        let Some(job) = t.hash_lookup(&jobs, &job_key(t.get(R_JOB_ID)))? else {
            return drop_as(TrioMlDrop::UnknownJob);
        };
        t.mem_read(job, LM_SCRATCH, LINE_BYTES)?;
        let j = JobCtx::new_checked(t.lm_bytes(LM_SCRATCH, LINE_BYTES)?)?;
        let src = t.get(R_SRC_ID);
        let member = j.src_mask(usize::from(src / 64)) & 1 << (src % 64) != 0;
        let (cnt_max, grad_max, exp, src_cnt) = (
            j.block_cnt_max(),
            j.block_grad_max(),
            j.block_exp(),
            j.src_cnt(),
        );
        if !member {
            return drop_as(TrioMlDrop::UnknownSource);
        }
        let current = j.run_id();
        let run = t.get(R_RUN);
        if run != 0 && run != current {
            t.set(R_REPLY_RUN, current);
            return Ok(Goto(l.superseded));
        }
        if t.get(R_GRAD_CNT) > grad_max {
            return drop_as(TrioMlDrop::BlockGradMax);
        }
        t.set(R_JOB, job);
        t.set(R_CNT_MAX, u32::from(cnt_max));
        t.set(R_GRAD_MAX, u32::from(grad_max));
        t.set(R_EXP, exp);
        t.set(R_SRC_CNT, src_cnt);
        let bufs = t.lm_bytes(LM_SCRATCH + JOB_BUFS_AT, 4)?;
        t.set(
            R_BUFS,
            u32::from_be_bytes([bufs[0], bufs[1], bufs[2], bufs[3]]),
        );
        Ok(Goto(l.claim_slot))
    });

    // Claim the block's key (PENDING), so exactly one of the packets racing to create the
    // block goes on; then count the slot in block_curr_cnt (refused at block_cnt_max) and
    // take one from the job's pool, probing from the block id's home slot.
    // The key being free is not enough: this packet found neither the block nor its kept
    // Result some instructions ago, and meanwhile the block may have been created and
    // finished (a finished block's key goes once its Result is kept), or even replaced by
    // its next generation. So the kept Result is looked at again once the key is ours: a
    // generation kept already (or a newer one) means the block is done, and the packet is
    // answered or dropped as stale instead of starting it again. This check is what keeps
    // a block from being started twice: a finished block leaves no record in the active
    // table.
    let active = tables.active.clone();
    let kept = tables.kept.clone();
    p.instr(l.claim_slot, move |t| {
        let (job_id, run, block, gen) = (
            t.get(R_JOB_ID),
            t.get(R_RUN),
            t.get(R_BLOCK_ID),
            t.get(R_GEN_ID),
        );
        let key = block_key(job_id, run, block, gen);
        match t.hash_insert(&active, &key, PENDING) {
            Ok(Inserted::New) => {
                // A peek, as in l.lookup_result; a kept Result of another run is not this
                // block's.
                let done = match t.hash_peek(&kept, &kept_key(job_id, block))? {
                    Some(v) => {
                        let (kgen, _) = parse_kept_value(v);
                        (kgen == gen || gen_newer(kgen, gen)) && kept_run(v) == run
                    }
                    None => false,
                };
                if done {
                    // Nobody can have joined a PENDING key: giving it back is safe.
                    t.hash_delete(&active, &key)?;
                    return Ok(Goto(l.lookup_result));
                }
            }
            // Another packet created the block first (or is creating it): join it.
            Ok(Inserted::Existing(_)) => return Ok(Goto(l.lookup_block)),
            Err(HashError::Full { .. }) => return drop_as(TrioMlDrop::TableFull),
            Err(e) => return Err(e.into()),
        }
        let job = t.get(R_JOB);
        let cnt_max = t.get(R_CNT_MAX);
        let in_use = t.fetch_add32(job + JOB_W_CURR_CNT, CURR_CNT_LANE, CURR_CNT_INC)?
            >> CURR_CNT_LANE_SHIFT;
        let layout = JobLayout::new(job, cnt_max, t.get(R_GRAD_MAX), lanes);
        let slot = if in_use < cnt_max {
            claim_free_slot(
                t,
                &layout,
                home_slot(t.get(R_BLOCK_ID), t.get(R_GEN_ID), cnt_max),
            )?
        } else {
            None
        };
        let Some(k) = slot else {
            t.fetch_add32(job + JOB_W_CURR_CNT, CURR_CNT_LANE, CURR_CNT_DEC)?;
            // Nobody can have joined a PENDING key: giving it back is safe.
            t.hash_delete(&active, &key)?;
            return drop_as(TrioMlDrop::BlockCntMax);
        };
        t.set(R_BLK, layout.slot(k));
        t.set(R_BUF, layout.buffer(t.get(R_BUFS), k));
        // The block's record goes into the slot at once (nobody finds it before
        // insert_block publishes it): a Join reading the slots for a free run id
        // (runs_in_use) must not see the run of the block the slot held before.
        write_record(t)?;
        // The packet's own gradients become the buffer's first contents: written over
        // whatever the slot held (as accumulators, with FPISA lanes), the lines past them
        // zeroed with the last chunk's padding, before the record is published (no other
        // packet can add meanwhile).
        t.set(R_CREATOR, true);
        Ok(Goto(l.aggregate_head))
    });
}

/// Writes a new block's record line into its slot ([`R_BLK`]): its limits, buffer, run, the
/// creator's source received and in flight, the slot's next tag ([`R_TAG`]), and (after the
/// record) its block id and generation.
///
/// Threads that found the slot's previous block may still enter and leave its gate (see the
/// layout's *gate*): the creator enters first, the gate word is written under a mask that
/// keeps their count in flight, with the new tag, and only then the rest of the line.
fn write_record(t: &mut Thread<'_>) -> Result<(), Fault> {
    let (rec, job, buf) = (t.get(R_BLK), t.get(R_JOB), t.get(R_BUF));
    let (block, gen, src) = (t.get(R_BLOCK_ID), t.get(R_GEN_ID), t.get(R_SRC_ID));
    let (exp, grad_cnt, now) = (t.get(R_EXP), t.get(R_GRAD_CNT), t.now_ns());
    let run = t.get(R_RUN);
    // The creator is in flight.
    let tag = gate_tag(t.fetch_add(rec + GATE_W, GATE_ENTER)?).wrapping_add(1);
    t.set(R_TAG, tag);
    t.set(R_HELD, Held::Creating);
    let line = t.lm_bytes_mut(LM_SCRATCH, LINE_BYTES)?;
    line.fill(0);
    let mut b = BlockCtx::new_checked(&mut *line)?;
    b.set_block_exp(exp);
    b.set_block_age(0);
    b.set_block_start_time(now);
    b.set_job_ctx_paddr(paddr(job));
    b.set_aggr_paddr(paddr(buf));
    b.set_grad_cnt(grad_cnt);
    b.set_rcvd_cnt(0);
    b.set_rcvd_mask(usize::from(src / 64), 1 << (src % 64));
    // The record names its run and its slot's tag ...
    b.set_run_id(run);
    b.set_slot_tag(tag);
    // ... and the line its block, after the record.
    let mut key = BlockKey::new_checked(&mut line[BLOCK_KEY_AT..])?;
    key.set_block_id(block);
    key.set_gen_id(gen);
    let gate_at = LM_SCRATCH + 8 * GATE_W as usize;
    let gate = u64::from_be_bytes(t.lm_bytes(gate_at, 8)?.try_into().expect("8 bytes"));
    t.masked_write(rec + GATE_W, gate, !GATE_IN_FLIGHT)?;
    t.mem_write(rec, LM_SCRATCH, gate_at - LM_SCRATCH)?;
    t.mem_write(
        rec + GATE_W + 1,
        gate_at + 8,
        LINE_BYTES - (gate_at + 8 - LM_SCRATCH),
    )
}

/// Step 3, continued: publish the new block's record, its creator's gradients written.
fn publish_phase(p: &mut ProgramBuilder, l: Labels, tables: &Tables) {
    // Publish the block record (written by claim_slot, this packet's source already
    // received and in flight) in the hash table.
    let active = tables.active.clone();
    p.instr(l.insert_block, move |t| {
        // The creator's gradients are in the buffer before anyone can find the block.
        t.wait_posted();
        let (rec, job) = (t.get(R_BLK), t.get(R_JOB));
        let (run, block, gen) = (t.get(R_RUN), t.get(R_BLOCK_ID), t.get(R_GEN_ID));
        let key = block_key(t.get(R_JOB_ID), run, block, gen);
        // Publish the record under the key this thread claimed.
        t.hash_update(&active, &key, active_value(rec, t.get(R_TAG)))?;
        // Published: others may join it now, and this thread is one adder in its gate.
        t.set(R_HELD, Held::Gate);
        count_block(t, job)?;
        Ok(Goto(l.complete_check))
    });
}

/// Step 4: check the source against the job and the block, and join the block's gate.
fn join_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let _ = c;

    // 4. check_source: a member of the job, with the block's gradient count.
    let active = tables.active.clone();
    p.instr(l.check_source, move |t| {
        let rec = t.get(R_BLK);
        let w1 = t.read_u64(rec + BLOCK_W_JOB)?;
        let w2 = t.read_u64(rec + BLOCK_W_GATE)?;
        if gate_tag(w2) != t.get(R_TAG) {
            // The block finished and its slot holds another since the lookup (a new block
            // writes its tag before the word read first here): look again.
            return forget_stale_block(t, &active, l);
        }
        let job = addr_of(BLOCK_JOB.get_u32(w1));
        t.set(R_BUF, addr_of(BLOCK_BUF.get_across(w1, w2) as u32));
        t.set(R_JOB, job);
        let src = t.get(R_SRC_ID);
        let word = source(src).word();
        if !mask_has(t.read_u64(job + word)?, src) {
            return drop_as(TrioMlDrop::UnknownSource);
        }
        if BLOCK_GRAD_CNT.get(w2) != u64::from(t.get(R_GRAD_CNT)) {
            return drop_as(TrioMlDrop::GradCntMismatch);
        }
        // The run state shares the word with src_cnt.
        let w3 = t.read_u64(job + JOB_W_SRC_CNT)?;
        t.set(R_SRC_CNT, job_src_cnt(w3));
        let run = t.get(R_RUN);
        if run != 0 && run != job_run(w3) {
            t.set(R_REPLY_RUN, job_run(w3));
            return Ok(Goto(l.superseded));
        }
        Ok(Goto(l.join_block))
    });

    // Enter the block's gate, then mark the source received (once).
    p.instr(l.join_block, move |t| {
        let rec = t.get(R_BLK);
        let gate = t.fetch_add(rec + GATE_W, GATE_ENTER)?;
        t.set(R_HELD, Held::Gate);
        if gate_tag(gate) != t.get(R_TAG) {
            // The slot holds another block since check_source.
            t.set(R_AFTER, After::Gone);
            return Ok(Goto(l.leave_block));
        }
        let src = t.get(R_SRC_ID);
        let bit = source(src);
        if gate & GATE_CLOSED != 0 {
            // Read while in the gate, and trusted if the slot's tag is still ours when we
            // leave (a new block writes its tag before its sources).
            let received = t.read_u64(rec + bit.word())? & bit.mask() != 0;
            t.set(R_RECEIVED, received);
            t.set(R_AFTER, After::Closing);
            return Ok(Goto(l.leave_block));
        }
        if t.fetch_or(rec + bit.word(), bit.mask())? & bit.mask() != 0 {
            // A retransmission: never added twice.
            t.set(R_AFTER, After::Duplicate);
            return Ok(Goto(l.leave_block));
        }
        Ok(Goto(l.aggregate_head))
    });
}

/// The slot of the block the packet found in the active table holds another block now (its
/// tag changed): the block finished, and its finisher has yet to take the key out of the
/// table (or faulted before it could). The entry is stale: it goes, unless it changed
/// meanwhile, and the packet looks its block up again.
fn forget_stale_block(t: &mut Thread<'_>, active: &HashTable, l: Labels) -> Result<Next, Fault> {
    let stale = active_value(t.get(R_BLK), t.get(R_TAG));
    t.hash_compare_delete(active, &packet_block_key(t), stale)?;
    Ok(Goto(l.lookup_block))
}

/// Where a packet goes once it left its block's gate ([`R_AFTER`]; never [`After::Gone`],
/// which looks the block up again at once).
fn after_leave(t: &Thread<'_>, l: Labels) -> Label {
    match t.get(R_AFTER) {
        After::Consume => l.consume,
        After::Duplicate => l.drop_duplicate,
        After::Closing | After::Gone => l.lookup_result,
    }
}

/// Where a packet goes once its gradients are in: a creator publishes its block, the others
/// count their source.
fn aggregated(t: &Thread<'_>, l: Labels) -> Label {
    if t.get(R_CREATOR) {
        l.insert_block
    } else {
        l.complete_check
    }
}

/// Steps 5 and 6: add the gradients (the head's, then the tail's), count the source; the last one out of a closed block finishes it.
fn aggregate_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let finish_block = l.finish_start;
    let Ctx { lanes, events, .. } = *c;

    // 5. l.aggregate_head (phase one): the 16-gradient chunks that lie wholly in the head,
    // straight from local memory.
    p.instr(l.aggregate_head, move |t| {
        let n = usize::from(t.get(R_GRAD_CNT));
        let in_head = (t.head_len().saturating_sub(GRADS_AT) / GRAD_BYTES).min(n);
        let chunks = in_head / CHUNK_GRADS;
        let (buf, grads) = (t.get(R_BUF), t.head_offset() + GRADS_AT);
        for c in 0..chunks {
            add_chunk(
                t,
                lanes,
                buf + (c as u64) * lanes.chunk_words(),
                grads + c * LINE_BYTES,
                CHUNK_GRADS,
            )?;
        }
        t.set(R_CHUNK, chunks);
        Ok(Goto(if chunks * CHUNK_GRADS < n {
            l.aggregate_tail
        } else {
            aggregated(t, l)
        }))
    });

    // l.aggregate_tail (phase two): the loop over the remaining 64-byte chunks, up to
    // TAIL_CHUNKS_PER_INSTR of them per instruction. Each chunk is one tail read and one
    // 16-lane vector add. The chunk across the head's end is staged in the scratch line
    // from the part left in the head and the rest read from the tail, and a short last
    // chunk is padded there with zero lanes; the chunks wholly in the tail go in one call.
    p.instr(l.aggregate_tail, move |t| {
        let n = usize::from(t.get(R_GRAD_CNT));
        let mut left = TAIL_CHUNKS_PER_INSTR;
        while left > 0 {
            let c = t.get(R_CHUNK);
            let first = c * CHUNK_GRADS;
            let at = GRADS_AT + first * GRAD_BYTES;
            let head_len = t.head_len();
            let addr = t.get(R_BUF) + (c as u64) * lanes.chunk_words();
            let full = ((n - first) / CHUNK_GRADS).min(left);
            let staged = if full > 0 && at >= head_len {
                // Whole chunks wholly in the tail (the usual case): their tail reads and
                // adds in one call, as the chunk-by-chunk path below would make them.
                add_tail_chunks(t, lanes, addr, at - head_len, LM_SCRATCH, full * LINE_BYTES)?;
                full
            } else {
                // One chunk staged in the scratch line: the one across the head's end, or
                // a short last one.
                let bytes = (n - first).min(CHUNK_GRADS) * GRAD_BYTES;
                let from_head = head_len.saturating_sub(at).min(bytes);
                let head = t.head_offset();
                let lm = t.lm_mut();
                if bytes < LINE_BYTES {
                    lm[LM_SCRATCH + bytes..LM_SCRATCH + LINE_BYTES].fill(0);
                }
                if from_head > 0 {
                    lm.copy_within(head + at..head + at + from_head, LM_SCRATCH);
                }
                if from_head < bytes {
                    t.read_tail(
                        at + from_head - head_len,
                        LM_SCRATCH + from_head,
                        bytes - from_head,
                    )?;
                }
                add_chunk(t, lanes, addr, LM_SCRATCH, bytes / GRAD_BYTES)?;
                1
            };
            t.set(R_CHUNK, c + staged);
            if (c + staged) * CHUNK_GRADS >= n {
                return Ok(Goto(aggregated(t, l)));
            }
            left -= staged;
        }
        Ok(Goto(l.aggregate_tail))
    });

    // 6. complete_check: count the source; the one that completes the block closes it.
    p.instr(l.complete_check, move |t| {
        // The adds must have landed before the source is counted: the last source to count
        // closes the block, and its Result is read as soon as every adder left.
        t.wait_posted();
        if let Lanes::Fpisa(_) = lanes {
            fpisa::count_events(t, events)?;
        }
        let rec = t.get(R_BLK);
        if t.get(R_PKT_DEGRADED) {
            t.fetch_or(rec + GATE_W, GATE_DEGRADED)?;
        }
        // rcvd_cnt and the contributors in one XTXN (rcvd_cnt never carries: at most 255).
        let contrib = (u32::from(t.get(R_CONTRIB))) << CONTRIB_LANE_SHIFT;
        let old = t.fetch_add32(
            rec + BLOCK_W_RCVD_CNT,
            RCVD_CNT_LANE,
            RCVD_CNT_INC | contrib,
        )?;
        let rcvd = u64::from(old >> RCVD_CNT_LANE_SHIFT & 0xFF) + 1;
        if rcvd == u64::from(t.get(R_SRC_CNT)) {
            t.fetch_or(rec + GATE_W, GATE_CLOSED)?;
        }
        t.set(R_AFTER, After::Consume);
        Ok(Goto(l.leave_block))
    });

    let active = tables.active.clone();
    // Leave the gate; the last one out of a closed block takes it (next instruction). Not if
    // the slot's tag changed: a thread that entered a block being finished (or under an old
    // tag) knows nothing of the block the slot holds now, which the next thread through its
    // gate finishes (see the layout's gate).
    p.instr(l.leave_block, move |t| {
        let rec = t.get(R_BLK);
        let old = t.fetch_add(rec + GATE_W, GATE_LEAVE)?;
        let ours = gate_tag(old) == t.get(R_TAG);
        let last_out = ours && old & GATE_CLOSED != 0 && old & GATE_IN_FLIGHT == 1;
        t.set(R_HELD, if last_out { Held::Take } else { Held::Nothing });
        match t.get(R_AFTER) {
            After::Gone => return forget_stale_block(t, &active, l),
            After::Closing => {
                t.set(R_CLOSING, true);
                if !ours {
                    // The block's slot was taken again while we were in its gate: what
                    // join_block read of it may be the new block's.
                    t.set(R_RECEIVED, false);
                }
            }
            After::Consume | After::Duplicate => {}
        }
        Ok(Goto(if last_out {
            l.take_block
        } else {
            after_leave(t, l)
        }))
    });
    // The last one out takes the block, outside the gate (it left): the one that sets
    // TAKEN on the block it left finishes it.
    p.instr(l.take_block, move |t| {
        let next = after_leave(t, l);
        let (rec, tag) = (t.get(R_BLK), t.get(R_TAG));
        if take(t, rec, tag)? {
            return Ok(Call(finish_block, next));
        }
        Ok(Goto(next))
    });
    p.instr(l.consume, |_t| Ok(Done(Verdict::Consume)));
    p.instr(l.drop_duplicate, move |_t| drop_as(TrioMlDrop::Duplicate));
    // Closed before we could join, and no Result kept yet: a repeat of a source the block
    // has, or a straggler the block's Result (on its way to the job) leaves out.
    p.instr(l.closing_drop, move |t| {
        drop_as(if t.get(R_RECEIVED) {
            TrioMlDrop::Duplicate
        } else {
            TrioMlDrop::Late
        })
    });
}

/// The `finish_block` subroutine: build the Result, keep it, retire the block, free the replaced Result's slot, then send the Result.
fn finish_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let build_result = l.result_headers;
    let Ctx { lanes, .. } = *c;

    // finish_block, step 1: build the Result (result_headers and result_tail copy the sums
    // out of the slot, then continue at keep_result). Before the Result is kept nobody else
    // can free the slot; once it is kept, a newer generation finishing (with sources that
    // run ahead) may replace it and free the slot at once, and a block taking the slot would
    // write its gradients into a Result being copied out.
    // A block of a run its job has left is found so at keep_result, after the build:
    // rare, and one read of the job's run the fewer per finished block.
    p.instr(l.finish_start, move |t| {
        let job = job_of(t, t.get(R_BLK))?;
        t.set(R_JOB, job);
        t.set(R_DEST, ResultDest::Job);
        t.set(R_ANSWER, Answer::No);
        Ok(Goto(build_result))
    });

    // finish_block, step 2: keep the Result (record and buffer stay in their slot) in the
    // kept-results table, replacing an older generation of the block id, whose slot is
    // freed next.
    let kept = tables.kept.clone();
    p.instr(l.keep_result, move |t| {
        let rec = t.get(R_BLK);
        let gen = t.get(R_GEN_ID);
        let job = t.get(R_JOB);
        t.set(R_FREE, 0);
        t.set(R_SILENT, false);
        let run = t.get(R_RUN);
        // The Result built counts no source: every packet that entered the block faulted
        // before it counted itself (their fault handlers left the gate, and the block aged
        // out). Its sums are what the faulted adds left, and an aggregator above would take
        // a Result counting nobody for a server's packet: freed without a Result, so the
        // sources' retransmissions make the block anew.
        let nobody =
            TrioMlHdr::new_unchecked(t.lm_bytes(LM_RESULT_HDR + TRIO_ML_HDR_AT, TRIO_ML_HDR_LEN)?)
                .src_cnt()
                == 0;
        if nobody || run != 0 && run != job_run(t.read_u64(job + JOB_W_RUN)?) {
            // A block of a run the job has left (it aged out after a source started a new
            // run): nobody of its run is left to want it. Freed without a Result, the one
            // built dropped.
            t.clear_tail();
            t.set(R_FREE, rec);
            t.set(R_SILENT, true);
            t.set(R_HELD, Held::Releasing);
            return Ok(Goto(l.release_block));
        }
        let key = kept_key(t.get(R_JOB_ID), t.get(R_BLOCK_ID));
        let value = kept_value(gen, rec, run);
        match t.hash_insert(&kept, &key, value) {
            Ok(Inserted::New) => {}
            Ok(Inserted::Existing(old))
                if gen_newer(parse_kept_value(old).0, gen) && kept_run(old) == run =>
            {
                // A newer generation finished first (hosts ran ahead): send, do not keep.
                t.set(R_FREE, rec);
            }
            Ok(Inserted::Existing(old)) => {
                t.set(R_SEEN, old);
                return Ok(Goto(l.replace_kept));
            }
            Err(HashError::Full { .. }) => t.set(R_FREE, rec),
            Err(e) => return Err(e.into()),
        }
        t.set(R_HELD, Held::Releasing);
        Ok(Goto(l.release_block))
    });

    // finish_block, step 2 continued: replace the older (or other run's) kept Result that
    // keep_result found, if it is still the one kept, and free its slot next. If another
    // thread replaced it meanwhile (a newer generation finishing at the same time, with
    // sources that run ahead), or a timer aged or expired it, decide again.
    let kept = tables.kept.clone();
    p.instr(l.replace_kept, move |t| {
        let key = kept_key(t.get(R_JOB_ID), t.get(R_BLOCK_ID));
        let value = kept_value(t.get(R_GEN_ID), t.get(R_BLK), t.get(R_RUN));
        let seen = t.get(R_SEEN);
        if t.hash_compare_update(&kept, &key, seen, value)? != Some(seen) {
            return Ok(Goto(l.keep_result));
        }
        t.set(R_FREE, parse_kept_value(seen).1);
        t.set(R_HELD, Held::Releasing);
        Ok(Goto(l.release_block))
    });

    // finish_block, step 3: the block is no longer active: its key goes (its kept Result,
    // kept first in step 2, now answers its packets: claim_slot looks there before it starts
    // a block).
    // Only the entry of this block (its slot and tag): if the slot was freed and taken again
    // since keep_result (a newer generation replaced the Result, or it expired), a packet
    // that found the entry stale may have removed it already, and a packet of the block
    // may have started it anew (its Result expired): that entry stays.
    let active = tables.active.clone();
    p.instr(l.release_block, move |t| {
        let ours = active_value(t.get(R_BLK), t.get(R_TAG));
        t.hash_compare_delete(&active, &packet_block_key(t), ours)?;
        Ok(Goto(l.free_replaced))
    });

    // finish_block, step 4: free the slot of the Result this one replaced before sending
    // this Result. No source needs the old Result any more (each
    // sent this generation only after receiving it), and a source answered from the kept
    // Result (a retransmission, on another PPE thread) may start the block id's next
    // generation at once: the slot must not still count against block_cnt_max by then.
    // This block's own slot, when its Result is not kept, is freed here too, for the same
    // reason: the Result was copied out of it already (result_tail), and a slot taken
    // again meanwhile changes none of it. A block of a left run sends nothing.
    // R_FREE is cleared before the slot is freed: a fault handler that finishes the block
    // from release_block (Held::Releasing) frees no slot twice, even after a fault between
    // free_slot's two XTXNs (which leaks the slot instead, as free_expired does).
    let emit_result = l.emit_result;
    p.instr(l.free_replaced, move |t| {
        let old = t.get(R_FREE);
        if old != 0 {
            t.set(R_FREE, 0);
            free_slot(t, t.get(R_JOB), old, lanes)?;
        }
        if t.get(R_SILENT) {
            t.set(R_HELD, Held::Nothing);
            return Ok(Return);
        }
        // emit_result returns to finish_block's caller.
        Ok(Goto(emit_result))
    });
}

/// Step 7, the `build_result` subroutine: the Result's headers, its sums 256 bytes per instruction, and the send (a block's finisher keeps its Result between the two).
fn result_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let Ctx {
        udp_port,
        local_mac,
        lanes,
        ..
    } = *c;

    // 7. build_result: the Result's headers, from the block and job records.
    p.instr(l.result_headers, move |t| {
        let rec = t.get(R_BLK);
        t.mem_read(rec, LM_BLOCK_REC, LINE_BYTES)?;
        let b = BlockCtx::new_checked(t.lm_bytes(LM_BLOCK_REC, LINE_BYTES)?)?;
        let (job, buf, grad_cnt, rcvd_cnt) = (
            addr_of(b.job_ctx_paddr()),
            addr_of(b.aggr_paddr()),
            b.grad_cnt(),
            b.rcvd_cnt(),
        );
        let (contributors, lower_partial, run) =
            (b.contributors(), b.degraded(), b.run_id() & MAX_RUN_ID);
        let (tag, taken) = (b.slot_tag(), b.taken());
        // The slot's tag: a finisher's block's entry in the active table (release_block);
        // for a kept Result sent again, what emit_result looks for once the copy is done (the
        // slot may be taken again meanwhile).
        t.set(R_TAG, tag);
        if t.get(R_ANSWER) == Answer::Sending && !taken {
            // Not a finished block's: the kept Result expired, and a block took its slot
            // (the same block started anew, perhaps) since lookup_result found it.
            t.set(R_ANSWER, Answer::Expired);
            return Ok(Return);
        }
        let key = BlockKey::new_checked(t.lm_bytes(LM_BLOCK_REC + BLOCK_KEY_AT, BLOCK_KEY_LEN)?)?;
        let (block, gen) = (key.block_id(), key.gen_id());
        t.mem_read(job, LM_JOB_REC, LINE_BYTES)?;
        let j = JobCtx::new_checked(t.lm_bytes(LM_JOB_REC, LINE_BYTES)?)?;
        let (out_src, out_dst, out_nh, src_cnt) = (
            j.out_src_addr(),
            j.out_dst_addr(),
            j.out_nh_addr(),
            j.src_cnt(),
        );
        let partial = rcvd_cnt < src_cnt;
        let out_dst = Ipv4Addr::from(out_dst);
        let hdr = TrioMlHdrFields {
            job_id: t.get(R_JOB_ID),
            block_id: block,
            age_op: u8::from(partial),
            final_block: false,
            degraded: partial || lower_partial,
            src_id: out_src as u8,
            src_cnt: contributors,
            gen_id: gen,
            grad_cnt,
            ctl: false,
            // The run is this aggregator's and its members': a Result going up a
            // hierarchy (to a unicast address, the next aggregator) carries none.
            run_id: if out_dst.is_multicast() { run } else { 0 },
        };
        let ep = Endpoints {
            src_mac: local_mac,
            dst_mac: if out_dst.is_multicast() {
                multicast_mac(out_dst)
            } else {
                [0xFF; 6]
            },
            src_addr: Ipv4Addr::from(out_src),
            dst_addr: out_dst,
            src_port: udp_port,
            dst_port: udp_port,
        };
        let grad_bytes = usize::from(grad_cnt) * GRAD_BYTES;
        write_headers(
            t.lm_bytes_mut(LM_RESULT_HDR, HEADERS_LEN)?,
            &ep,
            &hdr,
            grad_bytes,
        );
        if t.get(R_DEST) == ResultDest::Job {
            t.set(R_DEST, ResultDest::NextHop(out_nh));
        }
        t.set(R_GRAD_CNT, grad_cnt);
        t.set(R_BUF, buf);
        t.set(R_CHUNK, 0);
        t.clear_tail();
        Ok(Goto(l.result_tail))
    });

    // result_tail: one 256-byte chunk of sums per instruction: read from the buffer into
    // local memory (64 bytes per read), append to the Result's tail. FPISA accumulators
    // take 8 bytes per sum: their lines are read and renormalized into FP32 in one call
    // (FPISA's egress step, `fpisa::pull_fp32_sums`), so the chunk's 256 bytes of values
    // land in local memory without its 512 bytes of words.
    p.instr(l.result_tail, move |t| {
        let total = usize::from(t.get(R_GRAD_CNT)) * GRAD_BYTES;
        let start = t.get(R_CHUNK) * RESULT_CHUNK_BYTES;
        let len = (total - start).min(RESULT_CHUNK_BYTES);
        match lanes {
            Lanes::Int32 => {
                // The buffer holds whole lines (zeroed past the gradients), so the pull
                // is too.
                let lines = len.next_multiple_of(LINE_BYTES);
                t.mem_read_lines(t.get(R_BUF) + (start / 8) as u64, LM_RESULT_DATA, lines)?;
            }
            Lanes::Fpisa(_) => {
                let first_word = t.get(R_BUF) + (start / GRAD_BYTES) as u64;
                fpisa::pull_fp32_sums(t, first_word, LM_RESULT_DATA, len / GRAD_BYTES)?;
            }
        }
        t.write_tail(LM_RESULT_DATA, len)?;
        t.set(R_CHUNK, t.get(R_CHUNK) + 1);
        Ok(Goto(if start + len < total {
            l.result_tail
        } else if t.get(R_ANSWER) == Answer::No {
            // A block's finisher keeps its Result before it sends it (finish_block).
            l.keep_result
        } else {
            l.emit_result
        }))
    });

    // Send the Result: to the job's next hop (a port or a multicast group), or back to the
    // port a retransmission came from.
    // A kept Result sent again is checked to be kept still: the timer threads delete an
    // expired one from the table before they free its slot (and a replaced one is updated
    // in the table before its slot is freed), so a Result still kept after it was read is
    // whole; otherwise it may hold another block's sums and is not sent. Nor is one whose
    // slot's tag changed since result_headers: the slot was freed and taken again during
    // the copy (and the block kept again there, under the same key: the table alone
    // cannot tell).
    let kept = tables.kept.clone();
    p.instr(l.emit_result, move |t| {
        if t.get(R_ANSWER) == Answer::Sending {
            let key = kept_key(t.get(R_JOB_ID), t.get(R_BLOCK_ID));
            let want = kept_value(t.get(R_GEN_ID), t.get(R_BLK), t.get(R_RUN));
            if !t
                .hash_lookup(&kept, &key)?
                .is_some_and(|v| same_kept(v, want))
                || gate_tag(t.read_u64(t.get(R_BLK) + GATE_W)?) != t.get(R_TAG)
            {
                t.set(R_ANSWER, Answer::Expired);
                return Ok(Return);
            }
        }
        // l.result_headers resolved the job's next hop.
        let ResultDest::NextHop(nh) = t.get(R_DEST) else {
            return Err(FaultDetail::Panic("a Result sent before its headers".into()).into());
        };
        t.emit(nh_dest(nh), LM_RESULT_HDR, HEADERS_LEN)?;
        // Sent, the Result stands on its own: the engine is to send it even if the thread
        // faults later (a packet out of budget on its way to consume, a timer finishing its
        // next aged block), which would otherwise discard it with the thread's work, and
        // nothing would send it again.
        t.keep_created();
        // A finisher's block is finished.
        t.set(R_HELD, Held::Nothing);
        Ok(Return)
    });
}

/// The timer threads (§5): age the blocks of the launch's slice and finish the aged ones; age the kept Results and free the expired ones.
fn timer_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let finish_block = l.finish_start;
    let Ctx {
        scan_period_ns,
        kept_every,
        keep_scans,
        lanes,
        ..
    } = *c;

    // Timer threads (§5): age every block record of this launch's slice of the table by
    // its REF flag, and list the blocks that aged out.
    let active = tables.active.clone();
    p.instr(l.scan_blocks, move |t| {
        let Some(launch) = t.timer().copied() else {
            return Ok(Done(Verdict::Consume));
        };
        let mut visited: Vec<([u8; BLOCK_KEY_BYTES], Addr, bool)> = Vec::new();
        t.hash_scan(
            &active,
            launch.slice as usize,
            launch.slices as usize,
            |key, value, referenced| {
                // A key being created has no record to age yet.
                if let (Ok(key), false) = (key.try_into(), value == PENDING) {
                    visited.push((key, value, referenced));
                }
                ScanAction::Keep
            },
        );
        let mut aged = 0;
        for (key, value, referenced) in visited {
            let (rec, tag) = parse_active_value(value);
            let gate = t.read_u64(rec + GATE_W)?;
            if gate_tag(gate) != tag {
                // A stale entry: its block finished and the slot holds another, which is
                // aged by its own entry alone. The finisher has yet to remove the entry (or
                // faulted before it could, and no packet of the block came since to find it
                // stale): it goes, unless it changed meanwhile (as in forget_stale_block).
                t.hash_compare_delete(&active, &key, value)?;
                continue;
            }
            let w0 = t.read_u64(rec + BLOCK_W_AGE)?;
            // 8-bit fields: the casts keep all of them.
            let (exp, age) = (BLOCK_EXP.get_u8(w0), BLOCK_AGE.get_u8(w0));
            let new_age = if referenced { 0 } else { age.saturating_add(1) };
            if new_age != age {
                t.masked_write(
                    rec + BLOCK_W_AGE,
                    BLOCK_AGE.place(u64::from(new_age)),
                    BLOCK_AGE.mask(),
                )?;
            }
            let idle_ns = u64::from(new_age) * scan_period_ns;
            let timed_out = if exp == NO_BLOCK_TIMEOUT {
                // No timeout: only a block every source made (closed by the last one) and
                // left unfinished, idle for a whole period, is the timer's to finish.
                gate & GATE_CLOSED != 0 && new_age > 0
            } else {
                idle_ns >= u64::from(exp) * NS_PER_MS
            };
            if !referenced && timed_out && aged < MAX_AGED_PER_SCAN {
                let entry = LM_AGED + aged * AGED_ENTRY_BYTES;
                let e = t.lm_bytes_mut(entry, AGED_ENTRY_BYTES)?;
                e[..BLOCK_KEY_BYTES].copy_from_slice(&key);
                e[BLOCK_KEY_BYTES..].copy_from_slice(&value.to_be_bytes());
                aged += 1;
            }
        }
        t.set(R_AGED_N, aged);
        t.set(R_AGED_I, 0);
        Ok(Goto(l.close_aged))
    });

    // Close one aged block: no adder may join it any more. The thread enters the block's
    // gate under the tag it listed the block with, closes it if it is open, and leaves: if
    // nobody else is in the gate, it finishes the block (a partial Result, age_op = 1 and
    // degraded, unless every source was in), else the last adder to leave does. The block
    // listed may have finished since scan_blocks, while this thread closed the entries
    // before it, and a new block may hold its slot now: its tag tells, and that block is
    // left alone. A gate found closed is only left: the block may be between its last
    // leaver's leave and its take, then finished and its slot taken again before this
    // thread's close, which would close the new block.
    p.instr(l.close_aged, move |t| {
        let i = t.get(R_AGED_I);
        if i == t.get(R_AGED_N) {
            return Ok(Goto(l.scan_kept));
        }
        t.set(R_AGED_I, t.get(R_AGED_I) + 1);
        let e = t.lm_bytes(LM_AGED + i * AGED_ENTRY_BYTES, AGED_ENTRY_BYTES)?;
        let (job, run, block, gen) =
            parse_block_key(&e[..BLOCK_KEY_BYTES]).expect("a whole block key");
        let (rec, tag) = parse_active_value(u64::from_be_bytes(
            e[BLOCK_KEY_BYTES..].try_into().expect("8 bytes"),
        ));
        // The block, for a fault handler as for take_aged and finish_block.
        t.set(R_JOB_ID, job);
        t.set(R_RUN, run);
        t.set(R_BLOCK_ID, block);
        t.set(R_GEN_ID, gen);
        t.set(R_BLK, rec);
        t.set(R_TAG, tag);
        let gate = t.fetch_add(rec + GATE_W, GATE_ENTER)?;
        t.set(R_HELD, Held::Gate);
        if gate_tag(gate) != tag || gate & GATE_TAKEN != 0 {
            // Another block now, or this one being finished: in its gate, this thread does
            // not keep it in its slot. Leave it alone.
            t.fetch_add(rec + GATE_W, GATE_LEAVE)?;
            t.set(R_HELD, Held::Nothing);
            return Ok(Goto(l.close_aged));
        }
        if gate & GATE_CLOSED == 0 {
            // Open when we entered: the block stays in its slot while we are in its gate.
            t.fetch_or(rec + GATE_W, GATE_CLOSED)?;
        }
        let old = t.fetch_add(rec + GATE_W, GATE_LEAVE)?;
        if gate_tag(old) == tag && old & GATE_IN_FLIGHT == 1 {
            // The last one out: the block is this thread's to take.
            t.set(R_HELD, Held::Take);
            return Ok(Goto(l.take_aged));
        }
        t.set(R_HELD, Held::Nothing);
        Ok(Goto(l.close_aged))
    });
    // As take_block, for the timer: it finishes the block it takes, then closes the next.
    p.instr(l.take_aged, move |t| {
        let (rec, tag) = (t.get(R_BLK), t.get(R_TAG));
        if take(t, rec, tag)? {
            return Ok(Call(finish_block, l.close_aged));
        }
        Ok(Goto(l.close_aged))
    });

    // Every kept_every periods (KEPT_SCAN_EVERY, or a multiple: see kept_schedule), age the
    // kept Results of this launch's slice by their REF flags; delete (under the shard's
    // lock) those unasked for keep_scans kept scans, and list them: this thread owns them
    // now. Results of a run their job has left go at the second kept scan that finds them
    // so (whatever keep_result_ns, even 0): that run's workers are superseded (only their
    // retransmissions in flight still ask), and the Results hold run ids a restart's Join
    // needs. The first scan marks them (their age at LEFT_RUN_MARK), a later one deletes
    // those still marked, of a left run and not asked for since. The jobs' runs are read
    // before the scan, so a Result of a run a Join started during it looks left once, but
    // is its job's run at the next scan and is unmarked.
    let kept = tables.kept.clone();
    let jobs = tables.jobs.clone();
    p.instr(l.scan_kept, move |t| {
        let Some(launch) = t.timer().copied() else {
            return Ok(Done(Verdict::Consume));
        };
        if (launch.scheduled_ns / scan_period_ns) % kept_every != 0 {
            return Ok(Done(Verdict::Consume));
        }
        let mut records: Vec<(u8, Addr)> = Vec::new();
        t.hash_scan(&jobs, 0, 1, |key, rec, _| {
            records.push((key[0], rec));
            ScanAction::Keep
        });
        // The job's current run, by job id (None: no such job, or no run yet).
        let mut current = [None::<u8>; super::MAX_JOBS];
        for (job, rec) in records {
            let run = job_run(t.read_u64(rec + JOB_W_RUN)?);
            current[usize::from(job)] = (run != 0).then_some(run);
        }
        let mut expired: Vec<u64> = Vec::new();
        t.hash_scan(
            &kept,
            launch.slice as usize,
            launch.slices as usize,
            |key, v, referenced| {
                let run = kept_run(v);
                let left = run != 0 && current[usize::from(key[0])].is_some_and(|c| c != run);
                let marked = kept_age(v) == LEFT_RUN_MARK;
                if left {
                    if marked && !referenced && expired.len() < MAX_AGED_PER_SCAN {
                        expired.push(v);
                        return ScanAction::Delete;
                    }
                    return if marked {
                        ScanAction::Keep
                    } else {
                        ScanAction::Set(with_kept_age(v, LEFT_RUN_MARK))
                    };
                }
                if marked {
                    // Marked while its run looked left, and its job's run now: it ages
                    // afresh.
                    return ScanAction::Set(with_kept_age(v, 0));
                }
                if keep_scans == 0 {
                    return ScanAction::Keep;
                }
                if referenced {
                    return if kept_age(v) == 0 {
                        ScanAction::Keep
                    } else {
                        ScanAction::Set(with_kept_age(v, 0))
                    };
                }
                let age = kept_age(v).saturating_add(1);
                if age >= keep_scans && expired.len() < MAX_AGED_PER_SCAN {
                    expired.push(v);
                    return ScanAction::Delete;
                }
                // Past its time but over this launch's budget: the next kept scan takes it.
                ScanAction::Set(with_kept_age(v, age.min(keep_scans)))
            },
        );
        for (i, v) in expired.iter().enumerate() {
            let e = t.lm_bytes_mut(LM_AGED + i * AGED_ENTRY_BYTES, AGED_ENTRY_BYTES)?;
            e[BLOCK_KEY_BYTES..].copy_from_slice(&v.to_be_bytes());
        }
        t.set(R_AGED_N, expired.len());
        t.set(R_AGED_I, 0);
        t.set(R_HELD, Held::FreeingExpired);
        Ok(Goto(l.free_expired))
    });

    // Free one expired Result's slot (its kept record went under the kept shard's lock, so
    // this thread alone frees it; a late packet of its generation may start the block
    // again, in another slot).
    p.instr(l.free_expired, move |t| {
        let i = t.get(R_AGED_I);
        if i == t.get(R_AGED_N) {
            t.set(R_HELD, Held::Nothing);
            return Ok(Done(Verdict::Consume));
        }
        t.set(R_AGED_I, t.get(R_AGED_I) + 1);
        let e = t.lm_bytes(LM_AGED + i * AGED_ENTRY_BYTES, AGED_ENTRY_BYTES)?;
        let v = u64::from_be_bytes(e[BLOCK_KEY_BYTES..].try_into().expect("8 bytes"));
        let (_, rec) = parse_kept_value(v);
        let job = job_of(t, rec)?;
        free_slot(t, job, rec, lanes)?;
        Ok(Goto(l.free_expired))
    });
}

/// The run protocol ([`Control`]): a Join under the job's Join lock, and the replies.
fn run_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let Ctx {
        local_addr,
        udp_port,
        local_mac,
        lanes,
        ..
    } = *c;

    // The run protocol (wire::Control). join_run: a source of the job joins its run, under
    // the job's Join lock (one bit of the run word, held for two XTXNs, or for a read of
    // the slots when a new run starts): see decide_join.
    let jobs = tables.jobs.clone();
    p.instr(l.join_run, move |t| {
        let Some(job) = t.hash_lookup(&jobs, &job_key(t.get(R_JOB_ID)))? else {
            return drop_as(TrioMlDrop::UnknownJob);
        };
        let src = t.get(R_SRC_ID);
        let word = source(src).word();
        if !mask_has(t.read_u64(job + word)?, src) {
            return drop_as(TrioMlDrop::UnknownSource);
        }
        let w3 = t.fetch_or(job + JOB_W_RUN, JOB_RUN_LOCK)?;
        if w3 & JOB_RUN_LOCK != 0 {
            // Another Join of the job holds the lock.
            return Ok(Yield(l.join_run));
        }
        let run = match decide_join(t, job, w3, src, t.get(R_BLOCK_ID), lanes) {
            Ok(Some(run)) => run,
            Ok(None) => {
                t.fetch_clear(job + JOB_W_RUN, JOB_RUN_LOCK)?;
                return drop_as(TrioMlDrop::RunsBusy);
            }
            Err(fault) => {
                t.fetch_clear(job + JOB_W_RUN, JOB_RUN_LOCK)?;
                return Err(fault);
            }
        };
        // Publish the run and release the lock in one XTXN.
        t.masked_write(
            job + JOB_W_RUN,
            u64::from(run) << JOB_RUN_SHIFT,
            JOB_RUN_MASK | JOB_RUN_LOCK,
        )?;
        t.set(R_REPLY_RUN, run);
        t.set(R_CTL_OP, CTL_JOINED);
        Ok(Goto(l.control_reply))
    });
    // Gradients of a run the job has left: tell their worker which run is current.
    p.instr(l.superseded, move |t| {
        t.set(R_CTL_OP, CTL_SUPERSEDED);
        Ok(Goto(l.control_reply))
    });
    // A control reply to the packet's sender, out of the port it came from: Joined,
    // Superseded, or (loss recovery, from lookup_result) Gone.
    p.instr(l.control_reply, move |t| {
        let from_mac = t.view::<Ether>(0)?.smac().to_be_bytes();
        let from_addr = t.view::<Ipv4>(IPV4_AT)?.src_addr();
        let from_port = t.view::<Udp>(UDP_AT)?.src_port();
        let op = t.get(R_CTL_OP);
        let run_id = t.get(R_REPLY_RUN);
        let (job_id, src_id) = (t.get(R_JOB_ID), t.get(R_SRC_ID));
        let hdr = match op {
            CTL_JOINED => Control::Joined {
                run_id,
                nonce: t.get(R_BLOCK_ID),
            }
            .header(job_id, src_id),
            CTL_GONE => Gone {
                block_id: t.get(R_BLOCK_ID),
                gen_id: t.get(R_GEN_ID),
                run_id: t.get(R_RUN),
            }
            .header(job_id, src_id),
            _ => Control::Superseded { run_id }.header(job_id, src_id),
        };
        let ep = Endpoints {
            src_mac: local_mac,
            dst_mac: [
                from_mac[2],
                from_mac[3],
                from_mac[4],
                from_mac[5],
                from_mac[6],
                from_mac[7],
            ],
            src_addr: Ipv4Addr::from(local_addr),
            dst_addr: from_addr,
            src_port: udp_port,
            dst_port: from_port,
        };
        write_headers(t.lm_bytes_mut(LM_RESULT_HDR, HEADERS_LEN)?, &ep, &hdr, 0);
        t.emit(Dest::Port(t.port()), LM_RESULT_HDR, HEADERS_LEN)?;
        drop_as(match op {
            CTL_JOINED => TrioMlDrop::JoinAnswered,
            CTL_GONE => TrioMlDrop::StaleGen,
            _ => TrioMlDrop::StaleRun,
        })
    });
}

/// The fault handler (`on_fault`): a thread that faults (its instruction budget run out,
/// say; the engine then drops its packet) gives back what it holds ([`R_HELD`]), so that
/// no block is left unfinished for ever. The engine runs it with the thread's registers
/// and local memory as the fault left them.
///
/// - Creating: the block was never published, so nobody else can have joined it: the
///   thread leaves the gate it entered, deletes the PENDING key and frees the slot. The
///   block never existed; its sources' retransmissions start it again.
/// - Gate: it leaves the gate, as leave_block does, and if it is the last one out of a
///   closed block, takes and finishes it. A source whose packet faulted while adding was
///   marked received and never counted: the block completes only when it ages out, with a
///   partial Result (`age_op` 1, degraded) whose sums may hold the part of that packet's
///   gradients added before the fault.
/// - Take: it takes the block it left last (and finishes it if the take is its own).
/// - StaleTaken: it clears the TAKEN it set on a block of another tag.
/// - Finishing: it finishes the block from the start (nothing of it was committed).
/// - Releasing: it finishes the block from release_block on (its Result kept): the
///   Result, built before keep_result, is still in local memory and the new tail, and not
///   sent yet (emitting is the finish's last step). Results the thread sent before its
///   fault leave all the same: emit_result has the engine keep each one it sends from a
///   later fault (`Thread::keep_created`).
/// - FreeingExpired: a timer frees the rest of the expired Results' slots it listed (it
///   deleted their kept records, so nobody else would).
///
/// Posted XTXNs of the thread are applied first, so none lands after its gate is left.
fn fault_phase(p: &mut ProgramBuilder, l: Labels, c: &Ctx, tables: &Tables) {
    let finish_block = l.finish_start;
    let Ctx { lanes, .. } = *c;
    let active = tables.active.clone();
    p.instr(l.on_fault, move |t| {
        t.wait_posted();
        let (rec, tag) = (t.get(R_BLK), t.get(R_TAG));
        match t.get(R_HELD) {
            Held::Nothing => {}
            Held::Creating => {
                t.fetch_add(rec + GATE_W, GATE_LEAVE)?;
                t.hash_compare_delete(&active, &packet_block_key(t), PENDING)?;
                free_slot(t, t.get(R_JOB), rec, lanes)?;
                t.set(R_HELD, Held::Nothing);
            }
            Held::Gate => {
                let old = t.fetch_add(rec + GATE_W, GATE_LEAVE)?;
                let last_out =
                    gate_tag(old) == tag && old & GATE_CLOSED != 0 && old & GATE_IN_FLIGHT == 1;
                if last_out {
                    t.set(R_HELD, Held::Take);
                    return Ok(Goto(l.fault_take));
                }
                t.set(R_HELD, Held::Nothing);
            }
            Held::Take => return Ok(Goto(l.fault_take)),
            Held::StaleTaken => {
                t.fetch_clear(rec + GATE_W, GATE_TAKEN)?;
                t.set(R_HELD, Held::Nothing);
            }
            Held::Finishing => return Ok(Call(finish_block, l.fault_done)),
            Held::Releasing => return Ok(Call(l.release_block, l.fault_done)),
            // free_expired ends the thread once every listed slot is freed.
            Held::FreeingExpired => return Ok(Goto(l.free_expired)),
        }
        Ok(Goto(l.fault_done))
    });
    p.instr(l.fault_take, move |t| {
        let (rec, tag) = (t.get(R_BLK), t.get(R_TAG));
        if take(t, rec, tag)? {
            return Ok(Call(finish_block, l.fault_done));
        }
        Ok(Goto(l.fault_done))
    });
    // The handler's verdict is ignored: the packet is dropped under its fault's reason.
    p.instr(l.fault_done, |_t| Ok(Done(Verdict::Consume)));
}

#[cfg(test)]
mod tests {
    use super::home_slot;

    /// With two slots per block id, two consecutive generations of every id start at
    /// different slots, so neither walks past the other's: each is found at the first probe.
    #[test]
    fn consecutive_generations_start_at_different_slots() {
        for window in [1u32, 2, 7, 64, 2047] {
            let cnt_max = 2 * window;
            for gen in [0u16, 1, 2, 0xFFFE, 0xFFFF] {
                let mut homes: Vec<u32> = (0..window)
                    .flat_map(|b| {
                        [
                            home_slot(b, gen, cnt_max),
                            home_slot(b, gen.wrapping_add(1), cnt_max),
                        ]
                    })
                    .collect();
                assert!(
                    homes.iter().all(|&h| h < cnt_max),
                    "window {window}, gen {gen}"
                );
                homes.sort_unstable();
                homes.dedup();
                assert_eq!(homes.len(), cnt_max as usize, "window {window}, gen {gen}");
            }
        }
    }

    /// Any slot count, even one too small for two per id, gives a home among the slots.
    #[test]
    fn a_home_is_always_a_slot() {
        for cnt_max in 1..=70u32 {
            for block in [0u32, 1, 5, 69, 4094, u32::MAX] {
                for gen in [0u16, 1, 7, u16::MAX] {
                    assert!(
                        home_slot(block, gen, cnt_max) < cnt_max,
                        "{block} {gen} {cnt_max}"
                    );
                }
            }
        }
    }
}
