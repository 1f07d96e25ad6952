//! Trio-ML: in-network gradient aggregation with straggler mitigation (paper §4-5).
//!
//! Servers training one model (a *job*) each send their gradients in UDP packets to the
//! PFE, a *block* of up to 4095 32-bit gradients per packet. The PFE sums each block over
//! the job's sources in shared memory with the RMW engines' vector adds and, once every
//! source is in, sends one *Result* packet carrying the sums to the job (a multicast group,
//! or the next aggregator up a hierarchy). Timer threads scan the block records: a block
//! that no packet referenced for the job's `block_exp` is given up on, and a partial Result
//! (`degraded`, `age_op = 1`, `src_cnt` = the sources that made it) goes out instead. A job
//! may have no timeout ([`NO_BLOCK_TIMEOUT`]): its blocks wait for every source.
//!
//! With [`TrioMlConfig::lanes`] set to [`Lanes::Fpisa`], the same program aggregates FP32
//! gradients instead (FPISA, NSDI 2022): the packets carry native floats in network byte
//! order (no scaling step at the hosts), each gradient's sum is an FPISA accumulator word
//! that the RMW engine's shift-and-add updates ([`pfemu::mem::SharedMemory::fpisa_add_be`]),
//! and the Result builder renormalizes every sum into FP32. Jobs, blocks, windows, loss
//! recovery and straggler mitigation are unchanged; FPISA-A's overwrites and left shifts are
//! counted ([`TrioMl::fpisa_events`]). [`crate::microcode::fpisa`] holds the FPISA-specific
//! steps and sets such an aggregator up.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::sync::Arc;
//! use pfemu::prelude::*;
//! use pfemu::program::Harness;
//! use pfemu::microcode::trio_ml::{wire, JobConfig, TrioMl, TrioMlConfig};
//!
//! let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
//! let trio = TrioMl::install(&mem, TrioMlConfig::default())?;
//! trio.add_job(&JobConfig {
//!     job_id: 1,
//!     sources: vec![0, 1],
//!     out_dest: Dest::Group(1),
//!     ..JobConfig::default()
//! })?;
//! let program = trio.program();
//! let mut h = Harness::new(mem.clone());
//!
//! // Two sources send block 0 of job 1; the second completes it.
//! let packet = |src: u8, grads: &[i32]| {
//!     wire::agg_packet(&wire::AggPacket {
//!         endpoints: wire::Endpoints {
//!             src_mac: [2, 0, 0, 0, 0, src],
//!             dst_mac: [2, 0, 0, 0, 0, 0xFE],
//!             src_addr: Ipv4Addr::new(10, 0, 0, src + 1),
//!             dst_addr: TrioMlConfig::default().local_addr,
//!             src_port: 40000,
//!             dst_port: wire::DEFAULT_UDP_PORT,
//!         },
//!         hdr: wire::TrioMlHdrFields {
//!             job_id: 1,
//!             src_id: src,
//!             grad_cnt: grads.len() as u16,
//!             ..Default::default()
//!         },
//!         gradients: grads,
//!     })
//! };
//! assert!(h.run(&program, 0, &packet(0, &[1, 2, 3])).created.is_empty());
//! let out = h.run(&program, 1, &packet(1, &[10, 20, 30]));
//! assert_eq!(out.result, Ok(Verdict::Consume));
//! let (dest, result) = &out.created[0];
//! assert_eq!(*dest, Dest::Group(1));
//! let (hdr, sums) = wire::parse(result)?;
//! assert_eq!((hdr.src_cnt, hdr.degraded), (2, false));
//! assert_eq!(wire::gradients(sums), [11, 22, 33]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # State
//!
//! - **Job records** (Figure 17), one 64-byte line each, found through the `jobs` hash
//!   table (key: the job id). [`TrioMl::add_job`] allocates one DRAM region per job: the
//!   record, a slot bitmap, and `block_cnt_max` *slots*, a block record line each, back
//!   to back (64 records to a 4 KB page). Each slot has an aggregation buffer of
//!   `block_grad_max` gradients rounded up to 64 bytes; the buffers go to the accumulator
//!   region ([`Region::Acc`]), one after the other in an allocation of their own, whose
//!   32-bit address the job line keeps in bytes 58-61 (after the 58-byte record): that
//!   region's engine applies a packet's 4 KB vector add under one stripe lock with plain
//!   stores, instead of a compare-and-swap per word. When the accumulator region has no
//!   room (or is configured to 0 bytes), those bytes are 0 and the buffers follow the
//!   records in the job's DRAM region. (Slots once held their buffers' room after each
//!   record even when the buffers were elsewhere, which put every record on a page of its
//!   own: `bench trio-ml` runs 1.04x with them packed, 1.09x over its first 16
//!   generations.)
//! - **Gradient adds** are posted (fire-and-forget) XTXNs, one per 64-byte chunk; a
//!   packet's chunks go to consecutive buffer lines, so they reach the engine as one vector
//!   add. The thread waits for them (`Thread::wait_posted`) before it counts its source, so
//!   a block is never counted complete before every counted source's gradients landed.
//!   The packet that creates a block *writes* its gradients instead (64-byte write XTXNs,
//!   posted the same way), before it publishes the block's record: a slot's buffer holds
//!   whatever its last block left, and the first packet's lanes, with the last chunk's
//!   zero padding, are exactly what zeroing the buffer and adding them would leave. The
//!   paper does not say how a new block's buffer is cleared; writing saves a pass over
//!   4 KB of lines nobody has touched for a generation. With FPISA lanes the creator
//!   writes the accumulators its floats make in empty ones (`Thread::fpisa_write_be`).
//!   A chunk's 16 accumulator words are two lines, and a buffer ends at the line after
//!   its last gradient's, so an FPISA chunk is written or added over the lines of its
//!   gradients only: a short last chunk's second line may lie in the next slot's buffer
//!   or past the region's end.
//! - **Block records** (Figure 18) live in slots and are found through the `active` hash
//!   table, keyed `[job_id, run_id, block_id, gen_id]` (8 bytes): the paper keys by job and
//!   block id; the generation is added so consecutive uses of a block id are separate
//!   records, and the run (below) so a job's new run never joins an earlier run's block.
//!   The value is the record's 32-bit address and its slot's tag (see *Limits*). The
//!   timer threads scan this table. A block
//!   is created by whichever of its packets first inserts its key (with a *pending*
//!   value): only that thread counts a slot against `block_cnt_max`; packets racing it
//!   wait for the record and join, so a job at its slot limit never refuses a packet of
//!   a block that is being created.
//! - **Kept results**: a finished block's record and buffer stay in their slot, found
//!   through the `kept` hash table keyed `[job_id, block_id]` with value
//!   `run_id << 60 | gen_id << 32 | record` (the record as a 32-bit address, below; the
//!   run is the record's, kept here so that nobody reads the record's line to learn it:
//!   that line is cold by the time the next generation comes), so a source that
//!   lost the Result can ask again (a server that asks for an older generation than the kept
//!   one, of the same run, is told the generation is gone, [`wire::Gone`]; an aggregator
//!   below, which does not retransmit, is not). A kept Result is replaced (and its slot freed) when
//!   the next generation of the block id finishes, or when nobody asked for it during
//!   [`TrioMlConfig::keep_result_ns`] (so block ids a host stopped using, or a flood of
//!   new ones, do not hold the job's slots for ever). Timers scan this table every
//!   [`KEPT_SCAN_EVERY`] periods and count each Result's age (kept scans without a lookup)
//!   in bits 48..60 of its value (its largest value marks a Result of a run its job has
//!   left: see *Runs*); the one that deletes an expired Result under the shard's lock
//!   frees its slot. A Result being sent again to a
//!   source is checked to be still kept once it is built, and dropped (`result_expired`)
//!   if its slot was freed meanwhile.
//! - A finished block's key leaves the active table once its Result is kept (in that
//!   order), so the table holds only blocks being created or aggregated. A packet of a
//!   finished block finds no record there and looks for the kept Result. One that missed
//!   the block just before it was created may insert the key again just after it
//!   finished: once the key is its own it looks at the kept Result again (`claim_slot`),
//!   finds its generation (or a newer one) and is answered (or dropped as `stale_gen`)
//!   instead of starting a second block with a second Result. That check, not a record
//!   left behind, is what keeps a finished block finished, so finishing costs no XTXN on
//!   the shard of the generation before (`bench trio-ml`: 1.05x against keeping a
//!   *finished marker* there until the next generation's Result replaced the kept one).
//! - **Runs** ([`wire::Control`]): a job's current run id is byte 24 of its record (bits
//!   56..60 of word 3, beside `src_cnt`; bit 63 is the Join handler's lock), and after the
//!   record each source id has a *join word*: the run it last joined and its nonce. A Join
//!   from a source that joined the current run with another nonce starts the next run. Run
//!   ids have 4 bits, so a job that restarts often comes back to an id: a new run takes the
//!   first id after the current one that no slot holds (the Join reads the slot bitmap and
//!   the run of each slot in use), so nothing of the id's last run can answer the new one
//!   (or be joined by it). Whatever `keep_result_ns`, the kept scans drop a Result of a run
//!   its job has left at the second of them that finds it so and not asked for since
//!   (its run's workers are superseded, so it is asked for only by their retransmissions
//!   in flight), and the run's open blocks age out; while every other id still holds
//!   slots (15 restarts within that time, each leaving Results) the Join is refused as
//!   `runs_busy` and the worker sends it again. A block's run is byte 18 of its record. A
//!   kept Result of another run than a packet's is no answer to it (the block id is free for that run), and is replaced when that run's
//!   block finishes; a block of a run its job has left is freed without a Result when it
//!   finishes (it ages out). Gradients of such a run are dropped as `stale_run` and
//!   answered with [`wire::Control::Superseded`]. Run 0 is the paper's header alone.
//! - **Routes** for standard forwarding: the `routes` table, key the IPv4 destination.
//!
//! `block_curr_cnt` counts the job's slots in use (active blocks and kept Results) and
//! `block_cnt_max` caps it. A host that reuses `window` block ids (chunk `c` goes to block
//! `c % window`, generation `c / window`) needs up to two slots per block id (the kept
//! Result of one generation while the next aggregates), so `block_cnt_max >= 2 * window`.
//!
//! The records' 32-bit `job_ctx_paddr` and `aggr_paddr` hold *line addresses*: bit 31 set
//! for DRAM, the low 31 bits the index of the 64-byte line in its region (DRAM word
//! addresses start at 2^32 and do not fit 32 bits; lines of 64 GiB do).
//!
//! # Bits Trio-ML adds to the records
//!
//! All in the records' unused bits or in the 6 bytes after the 58-byte record:
//! - a block's *gate* (record bytes 20-23): CLOSED, TAKEN, and the number of threads
//!   adding to the block. A thread enters the gate before adding and leaves after counting
//!   its source; the thread that completes a block, or a timer thread that finds it aged,
//!   closes it; whoever then sees it closed and empty takes it and finishes it. So a
//!   partial Result is never read while a late source is still adding, and exactly one
//!   thread finishes each block, without spinning. A thread that faults in the gate leaves
//!   it in the program's fault handler (see *Limits*). Threads enter and leave with 64-bit adds
//!   over the whole word, which also hold the block's run (byte 18) and its slot's tag:
//! - a block's *slot tag* (byte 19): how many blocks its slot has held, mod 256, advanced by
//!   each new block there, and kept with the record's address in the active table. A
//!   thread that finds another tag in the gate than the table gave it has found another
//!   block (see *Limits*).
//! - bytes 58-63 of a block's line: its block id and generation, for the control plane.
//!
//! # Where the job record differs from the paper's
//!
//! The record is Figure 17's, bit for bit, but for two fields: `block_curr_cnt` and
//! `block_total_cnt` are kept in the line after it (the job's *counter line*), at the same
//! places, and their bits in the record stay zero. Every packet reads the record (the
//! source masks, `src_cnt`, the run) and every new block its limits, while the counters
//! change twice per block. On Trio the read-modify-write engines apply those updates near
//! the memory; on the host an update takes the record's whole cache line from the other
//! PPE threads' cores, and each of their next reads waits for it to come back. Apart, the
//! record's line is only ever read by the data path (`bench trio-ml`: 1.04x the rate).
//! [`TrioMl::job_state`] reads both lines; [`TrioMl::job_counters_addr`] says where the
//! counters are.
//!
//! # Result packets
//!
//! IPv4 from the job's `out_src_addr` to its `out_dst_addr`, UDP from and to the configured
//! port, Ethernet from [`TrioMlConfig::local_mac`] to the group's multicast MAC (or the
//! broadcast MAC for a unicast `out_dst_addr`). The Trio-ML header carries the block's
//! job, block and generation ids, `grad_cnt`, `src_cnt` and `src_id` = the low byte of
//! `out_src_addr`, so a first-level aggregator is one source of the next level.
//! `src_cnt` counts the *servers* in the sum: a server's packet (header `src_cnt` 0)
//! counts 1 and a lower aggregator's Result counts its own `src_cnt` (record byte 24
//! keeps the total, mod 256), so hosts divide by it at any depth of a hierarchy. `age_op`
//! is 1 when fewer than the job's sources are in the sum (this aggregator gave up on a
//! straggler); `degraded` is 1 then, and also when a source's packet was itself degraded
//! (a lower level gave up on one). `final` is 0. The Result goes to the job's `out_nh_addr`: a port, or with bit
//! 31 set a multicast group ([`wire::nh_addr`]). A kept Result sent again to a source
//! goes out of the port the request came from, with the same bytes.
//!
//! # Drop reasons
//!
//! `not_ipv4`, `no_route` (standard forwarding); `bad_length` (lengths disagree, or no
//! gradients); `unknown_job`, `unknown_source`, `block_grad_max`, `block_cnt_max`,
//! `table_full` (no block created); `grad_cnt_mismatch`, `duplicate` (a source already in
//! the block); `late` (a source that missed an aged-out block; answered with the kept
//! partial Result when there is one), `retransmit_answered` (a source asks again for a
//! finished block: answered with the kept Result), `stale_gen` (a generation older than the
//! kept one: its Result is gone for good, and a server's packet is answered with
//! [`wire::Gone`]), `result_expired` (a kept Result expired while it was being sent again),
//! `stale_run` (gradients of a run the job has left; answered Superseded), `join_answered`
//! (a Join, answered with the run), `runs_busy` (a Join that would start a new run while
//! every other run id still holds slots of its last run), `bad_control` (a control message that is not a Join
//! with no gradients).
//! Aggregated packets are consumed.
//!
//! # Timer threads
//!
//! Launch `timers` timer threads at [`TIMER_ENTRY`] every `scan_period_ns`, staggered, each
//! owning one slice of the active table ([`TrioMl::timer_specs`]). Each visit resets a
//! referenced block's `block_age` and increments an idle one's; a block ages out when
//! `block_age * scan_period_ns >= block_exp` ms, so between `block_exp` and `block_exp +
//! scan_period` after its last packet. A job without a timeout ([`NO_BLOCK_TIMEOUT`]) has
//! its blocks aged but never given up on: the timers take one only once every source is
//! in and nobody finished it (a closed block idle for a scan period; see *Limits*). Every [`KEPT_SCAN_EVERY`]th launch of a timer (or a
//! multiple of that, see [`TrioMlConfig::keep_result_ns`]) also ages its slice of the
//! kept-results table and frees the expired Results (see *Kept results* above).
//!
//! # Limits
//!
//! Slots are reused while a thread that found a block long before (a packet descheduled between its
//! lookup and the block's gate, a timer thread closing the aged blocks it listed) may still
//! hold the block's address. The active table names a block by its slot and the slot's
//! 8-bit tag, which each new block in the slot advances, and a thread entering the gate
//! checks it: one that finds another tag adds nothing and looks its block up again (a
//! timer leaves the block alone). Only a thread held while its slot took 256 new blocks
//! would be fooled. A thread that entered a closed block does not keep its slot from
//! being taken again, so no thread finishes a block whose tag it does not find when it
//! leaves, nor one whose tag it does not find when it takes it (after its leave: such a
//! take sets TAKEN and clears it again). If it was the last out of the new block, or its
//! take kept the new block's last one out from taking it, it leaves that block closed and
//! unfinished, and the next packet of that block through its gate (a retransmission) or
//! the timer, once the block ages (for a job without a timeout: once it is idle a scan
//! period, which it is closed for), finishes it (a whole Result if every source was in,
//! `block_exp` and a scan period late at most, a period more if the timer found the block
//! TAKEN by such a take).
//!
//! A thread that faults (its instruction budget run out, say: the engine drops its packet
//! and goes on) gives back what it holds in the program's fault handler
//! ([`pfemu::program::ProgramBuilder::on_fault`]), which the engine runs with the thread's
//! registers and local memory before it drops the packet. After each XTXN that takes or
//! gives back a share of a block, a register notes what the thread holds: a block it is
//! creating, a place in a gate, the take a last leaver owes, a TAKEN a stale take set, a
//! finish it began, the slots of the expired Results a timer listed. So a creator gives its block back (the PENDING key and the slot:
//! nobody could have joined a block not published), an adder leaves the gate (and takes and
//! finishes the block if it was the last one out of a closed block), a last leaver takes
//! its block, a stale take clears its TAKEN, and a finisher finishes its block (again from
//! the start, or from `release_block` on once its Result is kept: the Result built is still
//! in local memory and the new tail), and a timer frees the rest of the expired Results'
//! slots it listed (it deleted their kept records: nobody else would). The other way, the timer taking a block that has
//! stayed closed and aged with adders in its gate for some more scans, would be wrong: an
//! adder that the host merely descheduled (more PPE threads than cores) cannot be told
//! from one that faulted, and one overtaken while it adds would add into a Result being
//! copied out, or into the next block of a slot freed meanwhile. Only the engine knows that
//! a thread faulted.
//!
//! What faults still cost: a source whose packet faults while it adds was marked received
//! and is never counted, so its retransmissions are dropped as duplicates and the block
//! completes only when it ages out; that partial Result (`age_op` 1, degraded) may hold the
//! part of the packet's gradients added before the fault. A Result a thread sent is not lost
//! to its later fault: the engine discards the packets a faulting thread created, but
//! `emit_result`, right after sending a Result, has the engine keep it from a later fault
//! ([`pfemu::program::Thread::keep_created`]), so a finisher that faults after its send (a
//! packet thread running out of budget on its way to `consume`, a timer thread finishing its
//! next aged block) still sends it, once; its handler sends only the Result of a block it was
//! finishing when it faulted. (Nothing else would send it: a kept Result answers its sources'
//! retransmissions, but one that was not kept, of a left run's block, a generation older than
//! the one kept, or a full kept table, answers nobody.) A block whose every adder faulted (a
//! creator out of budget before it counted itself) ages out and is freed without a Result
//! (its sums would be what the faulted adds left, counting nobody); the sources'
//! retransmissions make it anew. A fault inside one instruction, between two of its XTXNs (a
//! budget runs out between instructions: only a program bug, a memory fault or a panic
//! faults there), is given back only where the register is noted between them: the stale
//! take's TAKEN is; a `claim_slot` between its key and its gate, or a finisher between
//! keeping its Result in the kept table and noting it, is not; a fault between
//! `free_slot`'s two XTXNs leaks that slot rather than freeing it twice (the register is
//! cleared first). A handler that faults in turn (its budget is the engine's, and at least
//! [`pfemu::program::DEFAULT_INSTRUCTION_BUDGET`]) is not handled again, and leaves what it
//! held as a thread without a handler would.
//!
//! A finisher removes its block's key from the active table after its Result is kept; if
//! the slot is freed and taken again in between, the entry is stale, and whoever finds it
//! so (a packet of the block, or the timer's scan) removes it. Windows remain inside one
//! instruction, between reading a slot's tag and acting on the slot: the timer writes a
//! block's age right after checking its tag, so a block taking the slot in that moment
//! gets the old block's age (and may age out early); and a retransmission that checks a
//! kept Result's slot is TAKEN, then copies it, can be fooled by a stale take's TAKEN if,
//! while it was held, the Result expired and its block was started anew in the slot and
//! kept again under the same generation (like the tag's wrap, a thread held for the
//! lifetime of several blocks).

pub mod host;
mod layout;
mod program;
pub mod wire;

use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use pfemu::error::ConfigError;
use pfemu::mem::hash::{HashError, HashTable, Inserted, DEFAULT_HASH_SHARDS};
use pfemu::mem::{Addr, AllocError, MemFault, Region, SharedMemory, LINE_WORDS};
use pfemu::packet::Dest;
use pfemu::pfe::{Control, ControlError, Pfe, Release, Retired};
use pfemu::program::Program;
use pfemu::timer::TimerSpec;

pub use layout::Lanes;
use layout::{
    block_key, job_key, kept_key, kept_value, parse_kept_value, route_key, same_kept, JobLayout,
};
use wire::MAX_RUN_ID;
use wire::{BlockCtx, JobCtx};

/// The timer entry point of the straggler scan (`Entry::Timer(TIMER_ENTRY)`).
pub const TIMER_ENTRY: u16 = 0;
/// Default time between two scans of the whole table (1 ms).
pub const DEFAULT_SCAN_PERIOD_NS: u64 = 1_000_000;
/// Default number of staggered timer threads sharing a scan.
pub const DEFAULT_TIMERS: u32 = 100;
/// Default capacity of the active-block and kept-result tables.
pub const DEFAULT_HASH_CAPACITY: usize = 1 << 16;
/// Default capacity of the route table.
pub const DEFAULT_ROUTE_CAPACITY: usize = 1024;
/// Jobs one Trio-ML holds (`job_id` is 8 bits).
pub const MAX_JOBS: usize = 256;

/// The most slots a job may have ([`JobConfig::block_cnt_max`]).
pub const MAX_BLOCK_CNT: u16 = 4095;

/// [`JobConfig::block_exp_ms`] of a job without a block timeout: its blocks wait for every
/// source, however late one comes, and no partial Result is ever sent (SwitchML's
/// wait-for-all). The timers still free expired kept Results, and still finish a block
/// that every source made but nobody finished (see *Limits*). For exact sums when a worker
/// may be slow (debugging, a machine under load); a source that never sends holds its
/// job's blocks open (their slots taken) until the job is removed.
pub const NO_BLOCK_TIMEOUT: u8 = 0;

/// How Trio-ML is installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrioMlConfig {
    /// The PFE's own address: aggregation packets are sent to it.
    pub local_addr: Ipv4Addr,
    /// The PFE's MAC address, the source of Result packets.
    pub local_mac: [u8; 6],
    /// UDP destination port of aggregation packets; also both ports of Result packets.
    pub udp_port: u16,
    /// Time between two visits of a block by the timer threads, in nanoseconds.
    pub scan_period_ns: u64,
    /// Timer threads per scan period; each owns `1 / timers` of the active table. At most
    /// `hash_shards`.
    pub timers: u32,
    /// Records the active-block table holds, and the kept-result table. Every slot may
    /// hold an active block or a kept Result, so make it at least the sum of the jobs'
    /// `block_cnt_max` (else blocks are refused as `table_full`).
    pub hash_capacity: usize,
    /// Shards of those tables (a power of two).
    pub hash_shards: usize,
    /// Routes the forwarding table holds.
    pub route_capacity: usize,
    /// What the gradients are: Trio-ML's 32-bit integers (the default) or FPISA's floats.
    pub lanes: Lanes,
    /// A kept Result nobody asked for during this long is dropped and its slot freed, in
    /// nanoseconds (0: kept until the next generation of its block id replaces it). The
    /// timer threads check kept Results every [`KEPT_SCAN_EVERY`] scan periods (a multiple
    /// of that for a time longer than 4094 such intervals), so a Result goes between
    /// `keep_result_ns` and one such interval later. It must outlast the hosts'
    /// retransmission timeout, or a source that lost the Result cannot get it again.
    /// Whatever this time, a Result of a run its job has left goes within two such
    /// intervals (see *Runs* in the module documentation).
    pub keep_result_ns: u64,
}

/// Kept Results are aged once per this many scan periods ([`TrioMlConfig::keep_result_ns`]),
/// or a multiple of it for a `keep_result_ns` longer than 4094 such intervals (a kept
/// Result's age has 12 bits, and its largest value marks a Result of a left run).
pub const KEPT_SCAN_EVERY: u64 = 16;

/// Default [`TrioMlConfig::keep_result_ns`]: 1 s.
pub const DEFAULT_KEEP_RESULT_NS: u64 = 1_000_000_000;

/// When kept Results are aged and when one expires: every `every` scan periods
/// ([`KEPT_SCAN_EVERY`], or the smallest multiple of it that keeps the count within a kept
/// Result's age, [`layout::MAX_KEPT_SCANS`]), and after `scans` kept scans nobody asked for it
/// (0: never).
pub(super) fn kept_schedule(keep_result_ns: u64, scan_period_ns: u64) -> (u64, u16) {
    let scans = |every: u64| keep_result_ns.div_ceil(scan_period_ns.max(1).saturating_mul(every));
    let stretch = scans(KEPT_SCAN_EVERY).div_ceil(u64::from(layout::MAX_KEPT_SCANS));
    let every = KEPT_SCAN_EVERY.saturating_mul(stretch.max(1));
    (
        every,
        scans(every).min(u64::from(layout::MAX_KEPT_SCANS)) as u16,
    )
}

impl Default for TrioMlConfig {
    /// Address 10.0.0.254, MAC 02:00:00:00:00:fe, port 12000, 100 timers scanning every
    /// 1 ms, 65536 records in 1024 shards, 1024 routes, kept Results dropped after 1 s
    /// without a request.
    fn default() -> Self {
        TrioMlConfig {
            local_addr: Ipv4Addr::new(10, 0, 0, 254),
            local_mac: [0x02, 0, 0, 0, 0, 0xFE],
            udp_port: wire::DEFAULT_UDP_PORT,
            scan_period_ns: DEFAULT_SCAN_PERIOD_NS,
            timers: DEFAULT_TIMERS,
            hash_capacity: DEFAULT_HASH_CAPACITY,
            hash_shards: DEFAULT_HASH_SHARDS,
            route_capacity: DEFAULT_ROUTE_CAPACITY,
            lanes: Lanes::Int32,
            keep_result_ns: DEFAULT_KEEP_RESULT_NS,
        }
    }
}

/// One aggregation job, as configured by the control plane (Figure 17's fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobConfig {
    /// The job id.
    pub job_id: u8,
    /// The source ids taking part: 1 to 255 distinct ids (their number is `src_cnt`).
    pub sources: Vec<u8>,
    /// Most slots (active blocks plus kept Results) at once: 1 to 4095.
    pub block_cnt_max: u16,
    /// Most gradients per block: 1 to 4095.
    pub block_grad_max: u16,
    /// Block timeout in milliseconds: 1 to 255, and at most 255 scan periods; or
    /// [`NO_BLOCK_TIMEOUT`] (0): blocks wait for every source.
    pub block_exp_ms: u8,
    /// Result packets' IPv4 source (its low byte is the Results' `src_id`).
    pub out_src_addr: Ipv4Addr,
    /// Result packets' IPv4 destination: the job's multicast group address, or the next
    /// aggregator.
    pub out_dst_addr: Ipv4Addr,
    /// Where Result packets go.
    pub out_dest: Dest,
}

impl Default for JobConfig {
    /// Job 0 with no sources (fill them in), 256 slots of 1024 gradients, a 10 ms
    /// timeout, Results from 10.0.0.254 to 239.0.0.1 on multicast group 0.
    fn default() -> Self {
        JobConfig {
            job_id: 0,
            sources: Vec::new(),
            block_cnt_max: 256,
            block_grad_max: 1024,
            block_exp_ms: 10,
            out_src_addr: Ipv4Addr::new(10, 0, 0, 254),
            out_dst_addr: Ipv4Addr::new(239, 0, 0, 1),
            out_dest: Dest::Group(0),
        }
    }
}

/// A job record as the control plane reads it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobState {
    /// Slots in use: active blocks plus kept Results.
    pub block_curr_cnt: u16,
    /// Most slots in use at once.
    pub block_cnt_max: u16,
    /// Most gradients per block.
    pub block_grad_max: u16,
    /// Block timeout, in milliseconds ([`NO_BLOCK_TIMEOUT`]: none).
    pub block_exp_ms: u8,
    /// Blocks created so far (wraps).
    pub block_total_cnt: u32,
    /// Result packets' IPv4 source.
    pub out_src_addr: Ipv4Addr,
    /// Result packets' IPv4 destination.
    pub out_dst_addr: Ipv4Addr,
    /// Where Result packets go.
    pub out_dest: Dest,
    /// Sources in the job.
    pub src_cnt: u8,
    /// The source ids, ascending.
    pub sources: Vec<u8>,
    /// Slots set in the job's bitmap (equals `block_curr_cnt` when no packet is in flight).
    pub slots_in_use: u32,
    /// The job's current run ([`wire::Control`]): 0 until a worker joins, then 1 to 15.
    pub run_id: u8,
}

/// A block in a job's slot, as the control plane reads it back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockState {
    /// The job id.
    pub job_id: u8,
    /// The block id.
    pub block_id: u32,
    /// The generation.
    pub gen_id: u16,
    /// The run the block belongs to (0: sent with the paper's header alone).
    pub run_id: u8,
    /// Gradients in the block.
    pub grad_cnt: u16,
    /// Sources summed so far.
    pub rcvd_cnt: u8,
    /// Those sources' ids, ascending.
    pub received: Vec<u8>,
    /// Timer scans since a packet last referenced the block.
    pub block_age: u8,
    /// When the block was created (engine clock, ns).
    pub block_start_time: u64,
    /// No adder may join any more (finished, or being finished).
    pub closed: bool,
    /// The block finished and its Result is kept for retransmission requests.
    pub kept: bool,
    /// The sums so far (the Result's gradients once finished).
    pub sums: Vec<i32>,
}

/// Why a Trio-ML control-plane operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrioMlError {
    /// A setting of [`TrioMlConfig`] or [`JobConfig`] is out of range.
    Config(ConfigError),
    /// A job with this id exists already.
    JobExists(u8),
    /// No job with this id exists.
    NoSuchJob(u8),
    /// Shared memory has no room for the job's region.
    Alloc(AllocError),
    /// A shared-memory access failed.
    Memory(MemFault),
    /// A hash-table operation failed.
    Hash(HashError),
    /// A grace period ([`TrioMl::reclaim_retired`]) did not end by its deadline: the
    /// retired memory stays retired, for a later grace period.
    Grace(ControlError),
}

impl fmt::Display for TrioMlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TrioMlError::Config(e) => e.fmt(f),
            TrioMlError::JobExists(j) => write!(f, "Trio-ML job {j} exists already"),
            TrioMlError::NoSuchJob(j) => write!(f, "no Trio-ML job {j}"),
            TrioMlError::Alloc(e) => write!(f, "no room for a Trio-ML job: {e}"),
            TrioMlError::Memory(e) => e.fmt(f),
            TrioMlError::Hash(e) => e.fmt(f),
            TrioMlError::Grace(e) => write!(
                f,
                "a removed Trio-ML job's memory stays retired (not yet reusable): {e}"
            ),
        }
    }
}

impl std::error::Error for TrioMlError {
    /// The allocation error behind [`TrioMlError::Alloc`]; the configuration, memory and
    /// hash errors are shown as themselves, so their own source (if any) comes through.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TrioMlError::Alloc(e) => Some(e),
            TrioMlError::Config(e) => e.source(),
            TrioMlError::Memory(e) => e.source(),
            TrioMlError::Hash(e) => e.source(),
            TrioMlError::Grace(e) => Some(e),
            TrioMlError::JobExists(_) | TrioMlError::NoSuchJob(_) => None,
        }
    }
}

impl From<ConfigError> for TrioMlError {
    fn from(e: ConfigError) -> Self {
        TrioMlError::Config(e)
    }
}

impl From<AllocError> for TrioMlError {
    fn from(e: AllocError) -> Self {
        TrioMlError::Alloc(e)
    }
}

impl From<MemFault> for TrioMlError {
    fn from(e: MemFault) -> Self {
        TrioMlError::Memory(e)
    }
}

impl From<HashError> for TrioMlError {
    fn from(e: HashError) -> Self {
        TrioMlError::Hash(e)
    }
}

/// The hash tables the program and the control plane share.
#[derive(Clone, Debug)]
struct Tables {
    active: Arc<HashTable>,
    kept: Arc<HashTable>,
    jobs: Arc<HashTable>,
    routes: Arc<HashTable>,
    /// FPISA lanes: the overwrite, left-shift and overflow counters (three packet/byte
    /// counters; none with integer lanes).
    fpisa_events: Option<Addr>,
}

/// What the control plane remembers of a job.
#[derive(Clone, Debug)]
struct JobEntry {
    layout: JobLayout,
    mem: JobMem,
}

/// A job's memory: its region (record, bitmap, slots, and the buffers when `bufs` is 0)
/// and its aggregation buffers in the accumulator region (`bufs`, a [`layout::paddr`], when
/// not 0). Its shape is `(cnt_max, grad_max)`: a job of the same shape fits it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct JobMem {
    record: Addr,
    record_words: u64,
    bufs: u32,
    buf_words: u64,
    cnt_max: u32,
    grad_max: u32,
}

/// Sweeps of a removed job's blocks before its memory is free (see [`TrioMl::remove_job`]):
/// one for the blocks packets that saw the job made, one for the kept Results timer
/// threads that saw those blocks made of them. Nothing makes a block from a kept Result.
const SWEEPS: u8 = 2;

/// A removed job's memory, not yet reusable.
#[derive(Clone, Copy, Debug)]
struct RetiredJob {
    job_id: u8,
    mem: JobMem,
    /// Sweeps made, each after a grace period (the last followed by one more).
    sweeps: u8,
}

/// Removed jobs' memory: retired until `SWEEPS + 1` grace periods passed, then free for a
/// job of the same shape.
#[derive(Debug, Default)]
struct Reuse {
    retired: Retired<RetiredJob>,
    free: Vec<JobMem>,
}

// What a grace period covers: the retirements made before it was taken
// ([`TrioMl::grace_ticket`], then [`TrioMl::release_retired`]).
pub use pfemu::pfe::GraceTicket;

/// Zeroes `words` words from `at`: whole 4 KB requests, then lines, then words.
fn zero_words(mem: &SharedMemory, at: Addr, words: u64) -> Result<(), MemFault> {
    const CHUNK: u64 = (pfemu::mem::MAX_VADD_BYTES / 8) as u64;
    let (mut at, end) = (at, at + words);
    while at < end && (at % LINE_WORDS != 0 || end - at < LINE_WORDS) {
        mem.write_u64(at, 0)?;
        at += 1;
    }
    while end - at >= LINE_WORDS {
        let n = (end - at).min(CHUNK) / LINE_WORDS * LINE_WORDS;
        mem.zero(at, (n * 8) as usize)?;
        at += n;
    }
    while at < end {
        mem.write_u64(at, 0)?;
        at += 1;
    }
    Ok(())
}

#[derive(Debug)]
struct Inner {
    mem: Arc<SharedMemory>,
    cfg: TrioMlConfig,
    tables: Tables,
    jobs: Mutex<BTreeMap<u8, JobEntry>>,
    regions: Mutex<u64>,
    /// Taken after `jobs` when both are.
    reuse: Mutex<Reuse>,
}

/// An installed Trio-ML: its hash tables, its jobs and routes, and the program. Cheap to
/// clone (shared).
#[derive(Clone, Debug)]
pub struct TrioMl {
    inner: Arc<Inner>,
}

impl TrioMl {
    /// Creates Trio-ML's hash tables for use with `mem` (jobs' memory is allocated by
    /// [`TrioMl::add_job`]).
    pub fn install(mem: &Arc<SharedMemory>, cfg: TrioMlConfig) -> Result<TrioMl, TrioMlError> {
        if cfg.scan_period_ns == 0 {
            return Err(ConfigError::new("scan_period_ns", "must be at least 1 ns").into());
        }
        let active = HashTable::new(cfg.hash_capacity, cfg.hash_shards)?;
        if cfg.timers == 0 || cfg.timers as usize > active.shards() {
            return Err(ConfigError::new(
                "timers",
                format!(
                    "{} is out of range; accepted 1..={} (hash_shards: each timer scans \
                     whole shards)",
                    cfg.timers,
                    active.shards()
                ),
            )
            .into());
        }
        let fpisa_events = match cfg.lanes {
            Lanes::Int32 => None,
            Lanes::Fpisa(_) => Some(mem.alloc(
                &format!("trio_ml.{}.fpisa_events", cfg.local_addr),
                Region::Sram,
                6,
            )?),
        };
        let tables = Tables {
            fpisa_events,
            active: Arc::new(active),
            kept: Arc::new(HashTable::new(cfg.hash_capacity, cfg.hash_shards)?),
            jobs: Arc::new(HashTable::new(MAX_JOBS, 16)?),
            routes: Arc::new(
                HashTable::new(cfg.route_capacity, 64)
                    .map_err(|e| ConfigError::new("route_capacity", e.reason))?,
            ),
        };
        Ok(TrioMl {
            inner: Arc::new(Inner {
                mem: mem.clone(),
                cfg,
                tables,
                jobs: Mutex::new(BTreeMap::new()),
                regions: Mutex::new(0),
                reuse: Mutex::new(Reuse::default()),
            }),
        })
    }

    /// The configuration it was installed with.
    pub fn config(&self) -> &TrioMlConfig {
        &self.inner.cfg
    }

    /// The shared memory it uses.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.inner.mem
    }

    /// FPISA lanes: the additions' events so far (FPISA-A overwrites and left shifts,
    /// headroom overflows), from the program's counters (`adds` is not counted: 0); all
    /// zero with integer lanes.
    pub fn fpisa_events(&self) -> Result<pfemu::fpisa::FpisaCounts, MemFault> {
        let Some(at) = self.inner.tables.fpisa_events else {
            return Ok(pfemu::fpisa::FpisaCounts::default());
        };
        let mem = &self.inner.mem;
        Ok(pfemu::fpisa::FpisaCounts {
            adds: 0,
            overwrites: mem.counter_read(at)?.0,
            left_shifts: mem.counter_read(at + 2)?.0,
            overflows: mem.counter_read(at + 4)?.0,
        })
    }

    /// Builds the Microcode program (packet entry and the timer entry [`TIMER_ENTRY`]).
    pub fn program(&self) -> Program {
        program::build(&self.inner.cfg, &self.inner.tables)
    }

    /// The staggered timers that run the straggler scan: `timers` launches of
    /// [`TIMER_ENTRY`] per `scan_period_ns`, timer `k` owning slice `k`.
    pub fn timer_specs(&self) -> Result<Vec<TimerSpec>, ConfigError> {
        TimerSpec::staggered(
            TIMER_ENTRY,
            self.inner.cfg.timers,
            self.inner.cfg.scan_period_ns,
            0,
        )
    }

    /// Aged blocks one timer launch finishes at most; more stay aged until the slice's
    /// next scan.
    pub fn max_aged_per_scan(&self) -> usize {
        program::MAX_AGED_PER_SCAN
    }

    fn validate(&self, job: &JobConfig) -> Result<(), ConfigError> {
        let mut ids = job.sources.clone();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != job.sources.len() {
            return Err(ConfigError::new("sources", "a source id is listed twice"));
        }
        if !(1..=255).contains(&ids.len()) {
            return Err(ConfigError::new(
                "sources",
                format!("{} sources; accepted 1..=255", ids.len()),
            ));
        }
        if !(1..=MAX_BLOCK_CNT).contains(&job.block_cnt_max) {
            return Err(ConfigError::new(
                "block_cnt_max",
                format!(
                    "{} is out of range; accepted 1..={MAX_BLOCK_CNT}",
                    job.block_cnt_max
                ),
            ));
        }
        if !(1..=wire::MAX_GRAD_CNT).contains(&job.block_grad_max) {
            return Err(ConfigError::new(
                "block_grad_max",
                format!("{} is out of range; accepted 1..=4095", job.block_grad_max),
            ));
        }
        let period = self.inner.cfg.scan_period_ns;
        let periods = (u64::from(job.block_exp_ms) * 1_000_000).div_ceil(period);
        if periods > u64::from(u8::MAX) {
            return Err(ConfigError::new(
                "block_exp_ms",
                format!(
                    "{} ms is out of range; accepted 1..=255 and at most 255 scan periods \
                     of {period} ns (block_age is 8 bits), or {NO_BLOCK_TIMEOUT} for no \
                     block timeout",
                    job.block_exp_ms
                ),
            ));
        }
        Ok(())
    }

    /// Validates `job`, allocates its region (record, slot bitmap, slots) in DRAM and its
    /// aggregation buffers in the accumulator region (in the DRAM region when it is full), backs
    /// both with host memory now (`block_cnt_max` x 4 KB of buffers for 1024 gradients, so
    /// that no packet pays for it), writes its record and makes it known to the program.
    ///
    /// A removed job's memory of the same shape (`block_cnt_max` and `block_grad_max`), once
    /// released ([`TrioMl::remove_job`]), is taken before anything is allocated: zeroed
    /// whole (slots, bitmap, join words, counters, buffers, as a fresh allocation reads),
    /// then written as a fresh one is, and its regions renamed for the job.
    pub fn add_job(&self, job: &JobConfig) -> Result<(), TrioMlError> {
        self.validate(job)?;
        let mem = &self.inner.mem;
        let mut jobs = self.inner.jobs.lock();
        if jobs.contains_key(&job.job_id) {
            return Err(TrioMlError::JobExists(job.job_id));
        }
        let (cnt_max, grad_max) = (u32::from(job.block_cnt_max), u32::from(job.block_grad_max));
        let lanes = self.inner.cfg.lanes;
        let reused = {
            let mut reuse = self.inner.reuse.lock();
            // Buffers apart (in the accumulator region) first, as a fresh job would have them.
            let pick = (0..reuse.free.len())
                .filter(|&i| (reuse.free[i].cnt_max, reuse.free[i].grad_max) == (cnt_max, grad_max))
                .max_by_key(|&i| reuse.free[i].bufs != 0);
            pick.map(|i| reuse.free.swap_remove(i))
        };
        let job_mem = match reused {
            Some(m) => match Self::wipe(mem, &m)
                .map_err(TrioMlError::from)
                .and_then(|()| self.rename(job.job_id, &m))
            {
                Ok(()) => m,
                Err(e) => {
                    // Still unused and whole: free for the next try.
                    self.inner.reuse.lock().free.push(m);
                    return Err(e);
                }
            },
            None => self.alloc_job(job.job_id, cnt_max, grad_max)?,
        };
        if let Err(e) = self.write_job(job, job_mem) {
            // Nothing points at it yet (the job table entry is the last write): free again.
            self.inner.reuse.lock().free.push(job_mem);
            return Err(e);
        }
        jobs.insert(
            job.job_id,
            JobEntry {
                layout: JobLayout::new(job_mem.record, cnt_max, grad_max, lanes),
                mem: job_mem,
            },
        );
        Ok(())
    }

    /// Zeroes a reused job's memory whole: what a fresh allocation reads as zero.
    fn wipe(mem: &SharedMemory, m: &JobMem) -> Result<(), MemFault> {
        zero_words(mem, m.record, m.record_words)?;
        if m.bufs != 0 {
            zero_words(mem, layout::addr_of(m.bufs), m.buf_words)?;
        }
        Ok(())
    }

    /// A name for job `job_id`'s memory not given before: `trio_ml.<local_addr>.job<id>.<n>`
    /// (its buffers' `<that>.buffers`).
    fn region_name(&self, job_id: u8) -> String {
        let mut n = self.inner.regions.lock();
        *n += 1;
        format!("trio_ml.{}.job{}.{}", self.inner.cfg.local_addr, job_id, *n)
    }

    /// Names a reused job's memory for the job that takes it, so that the memory map
    /// (`SharedMemory::allocations`, the control plane's `memory`) names its user.
    /// Refused only if a region of that name was allocated by someone else.
    fn rename(&self, job_id: u8, m: &JobMem) -> Result<(), TrioMlError> {
        let mem = &self.inner.mem;
        let name = self.region_name(job_id);
        mem.rename(m.record, &name)?;
        if m.bufs != 0 {
            mem.rename(layout::addr_of(m.bufs), &format!("{name}.buffers"))?;
        }
        Ok(())
    }

    /// Allocates (and backs) a fresh job's memory.
    fn alloc_job(&self, job_id: u8, cnt_max: u32, grad_max: u32) -> Result<JobMem, TrioMlError> {
        let mem = &self.inner.mem;
        let name = self.region_name(job_id);
        let lanes = self.inner.cfg.lanes;
        // The aggregation buffers go to the accumulator region, whose engine applies a 4 KB
        // vector add under one stripe lock, and the region then holds the records alone;
        // when the accumulator region has no room, the buffers stay in the region. Both
        // allocations are made or neither, so a refused job takes no space.
        let buf_words = u64::from(cnt_max) * JobLayout::buffer_words(grad_max, lanes);
        let records_alone = JobLayout::words(cnt_max, grad_max, lanes, false);
        let apart = mem.alloc_all(&[
            (&name, Region::Dram, records_alone),
            (&format!("{name}.buffers"), Region::Acc, buf_words),
        ]);
        let (record, record_words, bufs, buf_words) = match apart {
            Ok(addrs) => {
                // Backed now (as the records below), not by the first packet of each
                // block: the data path never allocates or takes the page faults of a 4 KB
                // stripe.
                mem.materialise(addrs[1], buf_words)?;
                (addrs[0], records_alone, layout::paddr(addrs[1]), buf_words)
            }
            Err(AllocError::Exhausted {
                region: Region::Acc,
                ..
            }) => {
                let words = JobLayout::words(cnt_max, grad_max, lanes, true);
                (mem.alloc(&name, Region::Dram, words)?, words, 0, 0)
            }
            Err(e) => return Err(e.into()),
        };
        mem.materialise(record, record_words)?;
        Ok(JobMem {
            record,
            record_words,
            bufs,
            buf_words,
            cnt_max,
            grad_max,
        })
    }

    /// Writes job `job`'s record, counters, join words and bitmap into `m`, then makes the
    /// job known to the program (its job table entry, last).
    fn write_job(&self, job: &JobConfig, m: JobMem) -> Result<(), TrioMlError> {
        let mem = &self.inner.mem;
        let (record, bufs, cnt_max, grad_max) = (m.record, m.bufs, m.cnt_max, m.grad_max);
        let lanes = self.inner.cfg.lanes;
        let layout = JobLayout::new(record, cnt_max, grad_max, lanes);

        let mut line = [0u8; 64];
        let mut j = JobCtx::new_checked(&mut line[..]).expect("a line holds a job record");
        j.set_block_cnt_max(job.block_cnt_max);
        j.set_block_grad_max(job.block_grad_max);
        j.set_block_exp(job.block_exp_ms);
        j.set_out_src_addr(job.out_src_addr.into());
        j.set_out_dst_addr(job.out_dst_addr.into());
        j.set_out_nh_addr(wire::nh_addr(job.out_dest));
        j.set_src_cnt(job.sources.len() as u8);
        let mut masks = [0u64; 4];
        for &s in &job.sources {
            masks[usize::from(s / 64)] |= 1 << (s % 64);
        }
        for (i, m) in masks.iter().enumerate() {
            j.set_src_mask(i, *m);
        }
        wire::JobBufs::new_unchecked(&mut line[wire::JOB_CTX_LEN..]).set_bufs_paddr(bufs);
        mem.write(record, &line)?;
        // Both counters start at zero, in their own line (`layout::JOB_COUNTERS`).
        mem.write(JobLayout::counters_of(record), &[0u8; 64])?;
        for w in 0..layout::JOIN_WORDS {
            mem.write_u64(layout.runs + w, 0)?;
        }
        for w in 0..JobLayout::bitmap_words(cnt_max) {
            mem.write_u64(layout.bitmap + w, 0)?;
        }
        if let Inserted::Existing(_) = self
            .inner
            .tables
            .jobs
            .insert(&job_key(job.job_id), record)?
        {
            return Err(TrioMlError::JobExists(job.job_id));
        }
        Ok(())
    }

    /// Removes a job: packets of it are dropped as `unknown_job` from now on, and its
    /// active blocks and kept Results are discarded (no Results are sent for them).
    ///
    /// Its memory is retired, not forgotten: packets (and timer threads) that looked the
    /// job up before the removal may still run and touch it, even make blocks in the
    /// tables after this returns. It becomes reusable by a later [`TrioMl::add_job`] of the
    /// same shape only after three grace periods: the first lets every such packet finish,
    /// after which the blocks they made are swept; the second lets every timer thread that
    /// saw those blocks finish (it may have kept a Result of one), after which the tables
    /// are swept again; the third lets every thread that saw anything swept finish. On an
    /// engine, [`TrioMl::reclaim_retired`] does it all (the control plane's `jobs/remove`
    /// calls it); without one, three times: take a [`TrioMl::grace_ticket`], wait until no
    /// thread runs anything that started before (e.g. [`Control::wait_quiescent`]), call
    /// [`TrioMl::release_retired`].
    /// Memory never released stays retired: it is never reused, and never reused wrongly
    /// (adding the job again meanwhile is allowed, with a fresh region, though a block a
    /// late packet of the old job made may then still be matched by it).
    pub fn remove_job(&self, job_id: u8) -> Result<(), TrioMlError> {
        let mut jobs = self.inner.jobs.lock();
        let entry = jobs.get(&job_id).ok_or(TrioMlError::NoSuchJob(job_id))?;
        let t = &self.inner.tables;
        t.jobs.delete(&job_key(job_id))?;
        for block in self.slots(job_id, entry)? {
            let (rec, b) = block;
            t.active
                .delete(&block_key(job_id, b.run_id, b.block_id, b.gen_id))?;
            let key = kept_key(job_id, b.block_id);
            if t.kept
                .peek(&key)?
                .is_some_and(|v| same_kept(v, kept_value(b.gen_id, rec, b.run_id)))
            {
                t.kept.delete(&key)?;
            }
        }
        let mem = &self.inner.mem;
        for w in 0..JobLayout::bitmap_words(entry.layout.slots) {
            mem.write_u64(entry.layout.bitmap + w, 0)?;
        }
        let job_mem = entry.mem;
        jobs.remove(&job_id);
        self.inner.reuse.lock().retired.retire(RetiredJob {
            job_id,
            mem: job_mem,
            sweeps: 0,
        });
        Ok(())
    }

    /// What a grace period begun after this call covers: every job removed so far (and
    /// every sweep made so far). See [`TrioMl::remove_job`].
    pub fn grace_ticket(&self) -> GraceTicket {
        self.inner.reuse.lock().retired.ticket()
    }

    /// Moves the retired memory `ticket` covers one step on, once a grace period begun
    /// after the ticket was taken has ended (the caller's promise: no packet or timer
    /// thread that started before the ticket still runs). A job removed by
    /// [`TrioMl::remove_job`] gets its blocks swept from the active and kept tables again
    /// (those late packets, then timer threads, made), twice, each after its own grace
    /// period; after a third, its memory becomes free for [`TrioMl::add_job`]. A job whose id
    /// was added again meanwhile is not swept (its keys are the new job's now) and stays
    /// retired. Returns how many jobs' memory became free.
    pub fn release_retired(&self, ticket: GraceTicket) -> Result<usize, TrioMlError> {
        // `jobs` first (as `add_job`), so that no job id is added back during the sweep.
        let jobs = self.inner.jobs.lock();
        let mut reuse = self.inner.reuse.lock();
        let Reuse { retired, free } = &mut *reuse;
        retired.release_with(
            ticket,
            |r| {
                Ok(if jobs.contains_key(&r.job_id) {
                    Release::Keep
                } else if r.sweeps < SWEEPS {
                    self.sweep(r.job_id)?;
                    r.sweeps += 1;
                    Release::Again
                } else {
                    Release::Free
                })
            },
            |r| free.push(r.mem),
        )
    }

    /// Deletes every block of job `job_id` from the active and kept tables: for a job no
    /// longer installed, whose late packets may have made some after its removal.
    fn sweep(&self, job_id: u8) -> Result<(), TrioMlError> {
        let t = &self.inner.tables;
        let kept_len = kept_key(job_id, 0).len();
        for (table, key_len) in [(&t.active, layout::BLOCK_KEY_BYTES), (&t.kept, kept_len)] {
            for r in table.records() {
                if r.key.len() == key_len && r.key[0] == job_id {
                    table.delete(&r.key)?;
                }
            }
        }
        Ok(())
    }

    /// Brings every job removed so far back to use on a running engine: three grace
    /// periods ([`Control::wait_quiescent`], each by `deadline`), each followed by
    /// [`TrioMl::release_retired`]. Returns how many jobs' memory became free. Past the
    /// deadline, [`TrioMlError::Grace`]: the memory stays retired (safe), for a later call.
    pub fn reclaim_retired(
        &self,
        engine: &Control,
        deadline: Instant,
    ) -> Result<usize, TrioMlError> {
        let mut freed = 0;
        for _ in 0..=SWEEPS {
            let ticket = self.grace_ticket();
            engine
                .wait_quiescent(deadline)
                .map_err(TrioMlError::Grace)?;
            freed += self.release_retired(ticket)?;
        }
        Ok(freed)
    }

    /// Removed jobs' memory by state: (retired, free for a job of the same shape).
    pub fn retired_jobs(&self) -> (usize, usize) {
        let reuse = self.inner.reuse.lock();
        (reuse.retired.len(), reuse.free.len())
    }

    /// Makes `run` (1 to [`wire::MAX_RUN_ID`]) job `job_id`'s run before anybody joined it:
    /// its first Join joins `run`, not run 1. An aggregator that restarts forgets its runs;
    /// starting its jobs at another run than the last instance's means the last instance's
    /// workers, still sending their run's gradients, are answered Superseded (`stale_run`)
    /// instead of having them added to the new run's blocks. Packets without a run (the
    /// paper's header alone) are taken as before. Call it before the job's traffic starts;
    /// refused once a source joined the job.
    pub fn start_runs_at(&self, job_id: u8, run: u8) -> Result<(), TrioMlError> {
        if !(1..=MAX_RUN_ID).contains(&run) {
            return Err(TrioMlError::Config(ConfigError::new(
                "run",
                format!("{run} is not in 1..={MAX_RUN_ID}"),
            )));
        }
        let jobs = self.inner.jobs.lock();
        let layout = jobs
            .get(&job_id)
            .ok_or(TrioMlError::NoSuchJob(job_id))?
            .layout;
        let mem = &self.inner.mem;
        let at = layout.record + layout::JOB_W_RUN;
        let w = mem.read_u64(at)?;
        if layout::job_run(w) != 0 {
            return Err(TrioMlError::Config(ConfigError::new(
                "run",
                format!("job {job_id} has a run already: a source joined it"),
            )));
        }
        let w = w & !layout::JOB_RUN_MASK | u64::from(run) << layout::JOB_RUN_SHIFT;
        mem.write_u64(at, w)?;
        Ok(())
    }

    /// Adds (or replaces) the route of IPv4 destination `dst` for standard forwarding.
    pub fn add_route(&self, dst: Ipv4Addr, dest: Dest) -> Result<(), TrioMlError> {
        let key = route_key(dst.into());
        let nh = u64::from(wire::nh_addr(dest));
        if let Inserted::Existing(_) = self.inner.tables.routes.insert(&key, nh)? {
            self.inner.tables.routes.update(&key, nh)?;
        }
        Ok(())
    }

    /// Removes the route of `dst`; true if there was one.
    pub fn remove_route(&self, dst: Ipv4Addr) -> Result<bool, TrioMlError> {
        Ok(self
            .inner
            .tables
            .routes
            .delete(&route_key(dst.into()))?
            .is_some())
    }

    /// The job ids configured, ascending.
    pub fn jobs(&self) -> Vec<u8> {
        self.inner.jobs.lock().keys().copied().collect()
    }

    /// Where a job's record is (its region starts there), for inspection.
    pub fn job_record_addr(&self, job_id: u8) -> Option<Addr> {
        self.inner.jobs.lock().get(&job_id).map(|e| e.layout.record)
    }

    /// Where a job's counters are, for inspection: the line after its record, which holds
    /// `block_curr_cnt` and `block_total_cnt` at their places in the record (see *Where
    /// the job record differs from the paper's* in the module documentation).
    pub fn job_counters_addr(&self, job_id: u8) -> Option<Addr> {
        self.job_record_addr(job_id).map(JobLayout::counters_of)
    }

    /// Reads a job's record back.
    pub fn job_state(&self, job_id: u8) -> Result<JobState, TrioMlError> {
        let layout = self
            .inner
            .jobs
            .lock()
            .get(&job_id)
            .ok_or(TrioMlError::NoSuchJob(job_id))?
            .layout;
        let mem = &self.inner.mem;
        let mut line = [0u8; 64];
        mem.read(layout.record, &mut line)?;
        let j = JobCtx::new_checked(&line[..]).expect("a line holds a job record");
        // The counters, at their record places in the counter line.
        let mut counters = [0u8; 64];
        mem.read(JobLayout::counters_of(layout.record), &mut counters)?;
        let c = JobCtx::new_checked(&counters[..]).expect("a line holds a job record");
        let masks = [0, 1, 2, 3].map(|i| j.src_mask(i));
        let mut slots_in_use = 0;
        for w in 0..JobLayout::bitmap_words(layout.slots) {
            slots_in_use += mem.read_u64(layout.bitmap + w)?.count_ones();
        }
        Ok(JobState {
            block_curr_cnt: c.block_curr_cnt(),
            block_cnt_max: j.block_cnt_max(),
            block_grad_max: j.block_grad_max(),
            block_exp_ms: j.block_exp(),
            block_total_cnt: c.block_total_cnt(),
            out_src_addr: j.out_src_addr().into(),
            out_dst_addr: j.out_dst_addr().into(),
            out_dest: wire::nh_dest(j.out_nh_addr()),
            src_cnt: j.src_cnt(),
            sources: sources_of(masks),
            slots_in_use,
            run_id: j.run_id(),
        })
    }

    /// Every block in a slot of a job: `(record address, state)`, in slot order. Reads the
    /// slots, not the active table, so REF flags (and so aging) are not disturbed.
    fn slots(&self, job_id: u8, entry: &JobEntry) -> Result<Vec<(Addr, BlockState)>, TrioMlError> {
        let mem = &self.inner.mem;
        let l = entry.layout;
        let mut out = Vec::new();
        for w in 0..JobLayout::bitmap_words(l.slots) {
            let mut bits = mem.read_u64(l.bitmap + w)?;
            while bits != 0 {
                let k = (w * 64) as u32 + bits.trailing_zeros();
                bits &= bits - 1;
                let rec = l.slot(k);
                out.push((rec, self.block_state(job_id, rec)?));
            }
        }
        Ok(out)
    }

    fn block_state(&self, job_id: u8, rec: Addr) -> Result<BlockState, TrioMlError> {
        let mem = &self.inner.mem;
        let mut line = [0u8; 64];
        mem.read(rec, &mut line)?;
        let b = BlockCtx::new_checked(&line[..]).expect("a line holds a block record");
        let key = wire::BlockKey::new_unchecked(&line[wire::BLOCK_CTX_LEN..]);
        let (block_id, gen_id) = (key.block_id(), key.gen_id());
        let grad_cnt = b.grad_cnt();
        let mut sums = Vec::with_capacity(usize::from(grad_cnt));
        let buf = layout::addr_of(b.aggr_paddr());
        let mut chunk = [0u8; 64];
        for line_no in 0..(usize::from(grad_cnt) * 4).div_ceil(64) {
            mem.read(buf + line_no as u64 * LINE_WORDS, &mut chunk)?;
            sums.extend(wire::gradients(&chunk));
        }
        sums.truncate(usize::from(grad_cnt));
        let run_id = b.run_id() & MAX_RUN_ID;
        let kept = self
            .inner
            .tables
            .kept
            .peek(&kept_key(job_id, block_id))?
            .is_some_and(|v| same_kept(v, kept_value(gen_id, rec, run_id)));
        Ok(BlockState {
            job_id,
            block_id,
            gen_id,
            run_id,
            grad_cnt,
            rcvd_cnt: b.rcvd_cnt(),
            received: sources_of([0, 1, 2, 3].map(|i| b.rcvd_mask(i))),
            block_age: b.block_age(),
            block_start_time: b.block_start_time(),
            closed: b.closed(),
            kept,
            sums,
        })
    }

    fn all_blocks(&self) -> Result<Vec<BlockState>, TrioMlError> {
        let jobs = self.inner.jobs.lock().clone();
        let mut out = Vec::new();
        for (id, entry) in &jobs {
            out.extend(self.slots(*id, entry)?.into_iter().map(|(_, b)| b));
        }
        Ok(out)
    }

    /// Lets the engine running this program (`pfe`, its timers started) finish every open
    /// block: each times out `block_exp` after its last packet and sends its partial
    /// Result. Waits until no block is open, or until their number has not gone down for
    /// `patience` (a block is left open for ever only by a thread that faulted inside one
    /// instruction: see *Limits* in the module documentation); returns the blocks still open. For a graceful stop: stop injecting, call this, then shut down.
    ///
    /// `patience` is counted in the timers' scans that ran (`patience / scan_period_ns` whole
    /// scans), not in wall time: blocks age by scans, and a loaded machine that starves the
    /// timer threads runs fewer scans than the clock allows, so it is waited for rather than
    /// given up on. Only if no timer runs at all for `10 * patience + 10 s` of wall time (the
    /// engine's timers are not running) does the wait end early.
    pub fn finish_open_blocks(&self, pfe: &Pfe, patience: Duration) -> Result<u64, TrioMlError> {
        let scan = Duration::from_nanos(self.inner.cfg.scan_period_ns);
        let runs_per_scan = u64::from(self.inner.cfg.timers.max(1));
        let patience_runs = (patience.as_nanos() / scan.as_nanos().max(1))
            .saturating_mul(u128::from(runs_per_scan))
            .min(u128::from(u64::MAX)) as u64;
        let stalled = patience
            .saturating_mul(10)
            .saturating_add(Duration::from_secs(10));
        let mut fewest = u64::MAX;
        let mut runs_at_progress = 0;
        let (mut last_runs, mut last_run_seen) = (0, Instant::now());
        loop {
            pfe.drain();
            let open = self.active_blocks()?.len() as u64;
            if open == 0 {
                return Ok(0);
            }
            let runs = pfe.stats().timer_runs;
            if runs != last_runs {
                (last_runs, last_run_seen) = (runs, Instant::now());
            }
            if open < fewest {
                (fewest, runs_at_progress) = (open, runs);
            } else if runs.saturating_sub(runs_at_progress) > patience_runs
                || last_run_seen.elapsed() > stalled
            {
                return Ok(open);
            }
            std::thread::sleep(scan);
        }
    }

    /// Blocks being aggregated (in a slot, not a kept Result), by job and slot.
    pub fn active_blocks(&self) -> Result<Vec<BlockState>, TrioMlError> {
        Ok(self.all_blocks()?.into_iter().filter(|b| !b.kept).collect())
    }

    /// Finished blocks whose Result is kept for retransmission requests.
    pub fn kept_results(&self) -> Result<Vec<BlockState>, TrioMlError> {
        Ok(self.all_blocks()?.into_iter().filter(|b| b.kept).collect())
    }

    /// Records in the active-block table (the hash engine's count): the blocks being
    /// created or aggregated.
    pub fn active_records(&self) -> usize {
        self.inner.tables.active.len()
    }

    /// Records in the kept-result table.
    pub fn kept_records(&self) -> usize {
        self.inner.tables.kept.len()
    }

    /// The kept Result of a block id: its generation and state.
    pub fn kept_result(
        &self,
        job_id: u8,
        block_id: u32,
    ) -> Result<Option<BlockState>, TrioMlError> {
        let Some(v) = self.inner.tables.kept.peek(&kept_key(job_id, block_id))? else {
            return Ok(None);
        };
        let (_, rec) = parse_kept_value(v);
        Ok(Some(self.block_state(job_id, rec)?))
    }
}

/// The source ids set in four 64-bit masks.
fn sources_of(masks: [u64; 4]) -> Vec<u8> {
    (0..=255u8)
        .filter(|&s| masks[usize::from(s / 64)] & 1 << (s % 64) != 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kept scans every 16 scan periods while the count fits a kept Result's 12-bit age;
    /// past that, as few more periods between kept scans as bring it back, so that a
    /// Result still goes between `keep_result_ns` and one kept interval later.
    #[test]
    fn the_kept_schedule_fits_the_age_and_keeps_the_time() {
        const MS: u64 = 1_000_000;
        assert_eq!(kept_schedule(DEFAULT_KEEP_RESULT_NS, MS), (16, 63));
        assert_eq!(kept_schedule(40 * MS, MS), (16, 3));
        assert_eq!(kept_schedule(0, MS), (16, 0));
        assert_eq!(kept_schedule(1, MS), (16, 1));
        let max = u64::from(layout::MAX_KEPT_SCANS);
        assert_eq!(
            kept_schedule(max * 16 * MS, MS),
            (16, layout::MAX_KEPT_SCANS)
        );
        for (keep, period) in [
            (max * 16 * MS + 1, MS),
            (DEFAULT_KEEP_RESULT_NS, 10_000),
            (DEFAULT_KEEP_RESULT_NS, 1),
            (u64::MAX, 1),
            (u64::MAX, u64::MAX),
            (3, u64::MAX / 8),
        ] {
            let (every, scans) = kept_schedule(keep, period);
            assert!(every >= KEPT_SCAN_EVERY && every % KEPT_SCAN_EVERY == 0);
            assert!(
                (1..=layout::MAX_KEPT_SCANS).contains(&scans),
                "{keep} ns, {period} ns"
            );
            // Long enough, by less than one kept interval.
            let interval = u128::from(every) * u128::from(period);
            let kept = u128::from(scans) * interval;
            assert!(kept >= u128::from(keep), "{keep} ns, {period} ns");
            assert!(kept < u128::from(keep) + interval, "{keep} ns, {period} ns");
        }
        // Stretched by the least multiple that fits: 1 s of 10 us periods is 6250 kept
        // scans of 16 periods, so 3125 of 32.
        assert_eq!(kept_schedule(DEFAULT_KEEP_RESULT_NS, 10_000), (32, 3125));
    }
}
