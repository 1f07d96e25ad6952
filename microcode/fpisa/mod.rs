//! FPISA: in-network aggregation of native floating-point gradients (FPISA, NSDI 2022),
//! run by Trio-ML's program.
//!
//! Workers send FP32 gradients as they are, in network byte order, after the Trio-ML header
//! (SwitchML's 256 per packet by default here, up to 1024 as in the Trio-ML runs): no scaling
//! to integers and back at the hosts. For each gradient the PFE keeps an FPISA accumulator, an
//! 8-bit exponent and a 32-bit two's-complement mantissa in one word of accumulator memory
//! ([`pfemu::fpisa::Acc`]). The packet's floats are added into the block's accumulators by the
//! RMW engines' shift-and-add ([`pfemu::mem::SharedMemory::fpisa_add_be`]: the memory unit the
//! paper proposes, which may shift the stored mantissa), 16 lanes per XTXN, posted and merged
//! per packet like Trio-ML's vector adds; a block's first packet writes its floats as the
//! accumulators they make in empty ones instead ([`write_chunk`]), as Trio-ML's first packet
//! writes its lanes, so a new block's buffer is never zeroed. When a block completes (or its
//! stragglers are given up on), the Result builder reads the sums and renormalizes each into
//! FP32 (the paper's egress step, MAU5 to MAU8), so the Result carries floats again. A sum
//! whose mantissa overflowed the headroom is carried as its saturated, finite value (see
//! [`pfemu::fpisa`], "Overflow of the mantissa"); the overflow shows only in the program's
//! counter ([`TrioMl::fpisa_events`]).
//!
//! Everything else is Trio-ML's, unchanged: jobs and their source masks, blocks and windows,
//! generations and loss recovery, the timer threads' straggler scan and partial Results. So
//! this module is the FPISA-specific part only:
//! - the program steps Trio-ML's program runs for FPISA lanes ([`add_chunk`],
//!   [`write_chunk`] for a block's first packet, [`count_events`], [`pull_fp32_sums`]);
//! - a front door: [`config`] and [`install`] set Trio-ML up with
//!   [`Lanes::Fpisa`], [`worker_config`] and
//!   [`worker`] make an end host that sends and receives floats.
//!
//! FPISA-A ([`Variant::Approx`], the variant a Tofino can run) is selected by the variant; its
//! overwrite and left-shift events are counted ([`TrioMl::fpisa_events`]).
//!
//! ```
//! use std::net::Ipv4Addr;
//! use std::sync::Arc;
//! use pfemu::prelude::*;
//! use pfemu::fpisa::Variant;
//! use pfemu::microcode::{fpisa, trio_ml::JobConfig};
//! use pfemu::program::Harness;
//!
//! let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
//! let agg = fpisa::install(&mem, Variant::Full)?;
//! agg.add_job(&JobConfig { job_id: 1, sources: vec![0, 1], ..JobConfig::default() })?;
//! let program = agg.program();
//! let mut h = Harness::new(mem.clone());
//!
//! // Two workers allreduce three floats each.
//! let local = agg.config().local_addr;
//! let mut workers = [
//!     fpisa::worker(fpisa::worker_config(1, 0, local), &[1.5, -2.0, 0.25])?,
//!     fpisa::worker(fpisa::worker_config(1, 1, local), &[0.5, 8.0, -0.125])?,
//! ];
//! let mut sent = Vec::new();
//! for w in &mut workers {
//!     w.poll(0, &mut sent);
//! }
//! let mut results = Vec::new();
//! for (i, frame) in sent.iter().enumerate() {
//!     results.extend(h.run(&program, i as u16, frame).created.into_iter().map(|(_, f)| f));
//! }
//! for w in &mut workers {
//!     for r in &results {
//!         w.on_frame(r)?;
//!     }
//!     assert_eq!(w.float_sums(), [2.0, 6.0, 0.125]);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::Ipv4Addr;
use std::sync::Arc;

use crate::microcode::trio_ml::host::{HostError, Worker, WorkerConfig};
use crate::microcode::trio_ml::{Lanes, TrioMl, TrioMlConfig, TrioMlError};
use pfemu::fpisa::{Format, Variant};
use pfemu::mem::{Addr, Op, SharedMemory};
use pfemu::program::{Fault, Thread};

/// Gradients per packet of [`worker_config`]: SwitchML's 256 (1 KB of FP32).
pub const DEFAULT_GRADS_PER_PACKET: usize = 256;

/// Trio-ML's default configuration with FPISA lanes of `variant`.
pub fn config(variant: Variant) -> TrioMlConfig {
    TrioMlConfig {
        lanes: Lanes::Fpisa(variant),
        ..TrioMlConfig::default()
    }
}

/// Installs the aggregation program with FPISA lanes of `variant` (and Trio-ML's defaults
/// otherwise) in `mem`; add jobs with [`TrioMl::add_job`].
pub fn install(mem: &Arc<SharedMemory>, variant: Variant) -> Result<TrioMl, TrioMlError> {
    TrioMl::install(mem, config(variant))
}

/// A worker's settings for an FPISA job: [`WorkerConfig::new`] with
/// [`DEFAULT_GRADS_PER_PACKET`] gradients per packet.
pub fn worker_config(job_id: u8, src_id: u8, aggregator: Ipv4Addr) -> WorkerConfig {
    WorkerConfig {
        grads_per_packet: DEFAULT_GRADS_PER_PACKET,
        ..WorkerConfig::new(job_id, src_id, aggregator)
    }
}

/// An end host that allreduces FP32 `gradients` ([`Worker::from_f32`]): it sends the floats as
/// they are; read the sums back with [`Worker::float_sums`] or [`Worker::float_mean`].
pub fn worker(cfg: WorkerConfig, gradients: &[f32]) -> Result<Worker, HostError> {
    Worker::from_f32(cfg, gradients)
}

/// Adds the `bytes / 4` FP32 gradients at `lm_offset` in local memory to the accumulators
/// from word `addr` with the RMW engine's shift-and-add: one posted XTXN per 16 lanes
/// (`fpisa_add16`), which the engine merges per packet. The events are collected by
/// [`count_events`] once the adds have landed.
#[inline]
pub fn add_chunk(
    t: &mut Thread<'_>,
    variant: Variant,
    addr: Addr,
    lm_offset: usize,
    bytes: usize,
) -> Result<(), Fault> {
    t.post_fpisa_add_be(addr, lm_offset, bytes, Format::Fp32, variant)
}

/// [`add_chunk`] for `bytes` of whole 64-byte chunks read from the tail at `tail_offset`,
/// through local memory at `lm_offset`, in one call
/// ([`Thread::read_tail_post_fpisa_add_be`]: the same XTXNs as a tail read and an
/// [`add_chunk`] per chunk).
pub fn add_tail_chunks(
    t: &mut Thread<'_>,
    variant: Variant,
    addr: Addr,
    tail_offset: usize,
    lm_offset: usize,
    bytes: usize,
) -> Result<(), Fault> {
    t.read_tail_post_fpisa_add_be(addr, tail_offset, lm_offset, bytes, Format::Fp32, variant)
}

/// The first contents of a block's buffer: the accumulators that adding the `bytes / 4` FP32
/// gradients at `lm_offset` into empty ones leaves, written over the words from `addr`
/// whatever they held ([`Thread::fpisa_write_be`]). For the packet that creates its block,
/// instead of zeroing the buffer and adding into it.
#[inline]
pub fn write_chunk(
    t: &mut Thread<'_>,
    variant: Variant,
    addr: Addr,
    lm_offset: usize,
    bytes: usize,
) -> Result<(), Fault> {
    t.fpisa_write_be(addr, lm_offset, bytes, Format::Fp32, variant)
}

/// [`write_chunk`] for `bytes` of whole 64-byte chunks read from the tail at `tail_offset`,
/// through local memory at `lm_offset`, in one call
/// ([`Thread::read_tail_post_fpisa_write_be`], posted).
pub fn write_tail_chunks(
    t: &mut Thread<'_>,
    variant: Variant,
    addr: Addr,
    tail_offset: usize,
    lm_offset: usize,
    bytes: usize,
) -> Result<(), Fault> {
    t.read_tail_post_fpisa_write_be(addr, tail_offset, lm_offset, bytes, Format::Fp32, variant)
}

/// Once a packet's adds have landed ([`Thread::wait_posted`]): adds their events (FPISA-A's
/// overwrites and left shifts, headroom overflows) to the three counters from `counters`
/// (two words each; the count is the packet count), one posted counter add per nonzero count.
pub fn count_events(t: &mut Thread<'_>, counters: Addr) -> Result<(), Fault> {
    let c = t.take_fpisa_counts();
    for (i, n) in [c.overwrites, c.left_shifts, c.overflows]
        .into_iter()
        .enumerate()
    {
        if n > 0 {
            t.post(Op::CounterAdd {
                addr: counters + 2 * i as u64,
                packets: n,
                bytes: 0,
            })?;
        }
    }
    Ok(())
}

/// Reads the `sums` accumulators from word `first_word` and leaves their values in FP32, in
/// network order, at `lm_at` in local memory (`4 * sums` bytes, at most
/// [`pfemu::mem::MAX_FPISA_LANES`] sums): the Result's gradients. The words' lines are read
/// and renormalized into FP32 (FPISA's egress step) in one call
/// ([`Thread::fpisa_read_fp32_be`]: the same reads as a pull of the lines into local memory,
/// without the words' copy there).
pub fn pull_fp32_sums(
    t: &mut Thread<'_>,
    first_word: Addr,
    lm_at: usize,
    sums: usize,
) -> Result<(), Fault> {
    t.fpisa_read_fp32_be(first_word, lm_at, sums)
}
