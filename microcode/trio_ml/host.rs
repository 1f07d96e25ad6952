//! The end-host side of Trio-ML: a worker that streams its gradients to the aggregator and
//! collects the results.
//!
//! - [`Scaling`] turns `f32` gradients into the 32-bit integers Trio-ML adds, with one
//!   scaling factor for the whole job, as ATP does, and back.
//! - [`Worker`] is a sans-IO state machine: [`Worker::poll`] says which packets to send
//!   now, [`Worker::on_frame`] takes what the aggregator sent back. It streams the model in
//!   blocks of `grads_per_packet` gradients with at most `window` packets outstanding.
//! - Loss recovery (the paper leaves it to future work; this follows SwitchML): block ids
//!   are the `window` slots of a pool, reused generation after generation. Chunk `c` of the
//!   model goes out as block `c % window` with generation `first_gen + c / window`, and the
//!   next chunk for a slot leaves only when the slot's result came back, so every worker of
//!   a job uses the same (block, generation) for the same chunk. A worker that sees no
//!   result in time sends the chunk again; the aggregator never adds a source twice, and
//!   keeps a finished block's result until the slot's next generation so a retransmission
//!   is answered again. Once the next generation finished without this worker (straggler
//!   mitigation: its block aged out) the result is gone, and the aggregator says so
//!   ([`wire::Gone`]): the worker settles that chunk as lost ([`Worker::lost`]) at once.
//! - [`drive`] runs one worker against an engine in the calling thread (inject, receive,
//!   retransmit), with an optional [`Lossy`] fault injector on both directions.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};

use super::wire::{self, AggPacket, Control, Endpoints, Gone, TrioMlHdrFields, MAX_GRAD_CNT};
use pfemu::packet::Port;
use pfemu::rng::SplitMix64;
use pfemu::wire::lanes::{read_be_i32s, read_be_i32s_streaming};
use pfemu::wire::WireError;

/// Converts between `f32` gradients and the integers the aggregator adds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scaling {
    /// Integers per unit: `i = round(g * factor)`.
    pub factor: f32,
}

impl Scaling {
    /// The largest factor with which `workers` gradients of magnitude up to `max_abs` sum
    /// without overflowing an `i32` (ATP picks its factor the same way, from the largest
    /// gradient seen).
    pub fn for_range(max_abs: f32, workers: usize) -> Scaling {
        let max_abs = if max_abs.is_finite() && max_abs > 0.0 {
            max_abs
        } else {
            1.0
        };
        // Keep a little headroom under i32::MAX for rounding.
        Scaling {
            factor: (i32::MAX as f32 * 0.99) / (max_abs * workers.max(1) as f32),
        }
    }

    /// `g` as an integer (rounded to nearest, saturating; NaN is 0).
    pub fn to_int(&self, g: f32) -> i32 {
        // `as` saturates and maps NaN to 0.
        (g * self.factor).round() as i32
    }

    /// An aggregated integer back as a float.
    pub fn to_float(&self, v: i32) -> f32 {
        (f64::from(v) / f64::from(self.factor)) as f32
    }
}

/// Why a worker could not be set up or did not finish.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostError {
    /// A setting is out of range; names the setting.
    Config {
        /// The setting at fault.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A received frame is not a Trio-ML packet.
    Wire(WireError),
    /// The worker gave up waiting (see [`DriveOptions::give_up_after`]).
    TimedOut {
        /// Chunks still without a result.
        missing: usize,
    },
    /// The aggregator answered this worker's gradients with [`Control::Superseded`]: the
    /// job has moved on to another run (a member joined again, e.g. after a restart), or
    /// (`current` 0) the aggregator has no run of the job for this worker (it restarted
    /// since the worker joined), so this run's sums can no longer be completed.
    Superseded {
        /// The job.
        job_id: u8,
        /// The run this worker joined.
        run_id: u8,
        /// The job's run now (0: none for this worker).
        current: u8,
        /// Chunks still without a result.
        missing: usize,
    },
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Config { setting, reason } => write!(f, "invalid `{setting}`: {reason}"),
            HostError::Wire(e) => write!(f, "received frame: {e}"),
            HostError::TimedOut { missing } => {
                write!(f, "gave up waiting: {missing} chunks without a result")
            }
            HostError::Superseded {
                job_id,
                run_id,
                current: 0,
                missing,
            } => write!(
                f,
                "the aggregator has no run of job {job_id} for this worker, which joined run \
                 {run_id} (the aggregator restarted since, or the job was added again, or \
                 another process joined as this source): this run stops with {missing} \
                 chunks without a result"
            ),
            HostError::Superseded {
                job_id,
                run_id,
                current,
                missing,
            } => write!(
                f,
                "job {job_id} moved on from run {run_id} to run {current} (a member of the job \
                 joined again, e.g. after a restart): this run stops with {missing} chunks \
                 without a result"
            ),
        }
    }
}

impl std::error::Error for HostError {}

impl From<WireError> for HostError {
    fn from(e: WireError) -> Self {
        HostError::Wire(e)
    }
}

/// One worker's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The job (must be configured on the aggregator).
    pub job_id: u8,
    /// This worker's source id (in the job's source mask).
    pub src_id: u8,
    /// Gradients per packet (1..=[`MAX_GRAD_CNT`]; 1024 in the paper's runs).
    pub grads_per_packet: usize,
    /// Packets outstanding at most, and the number of block ids used (the paper's
    /// `window`; at most the job's `block_cnt_max`).
    pub window: usize,
    /// Resend a chunk when its result has not come back this long after it was sent
    /// (`None`: never; the paper's setup, which has no loss).
    pub retransmit_after_ns: Option<u64>,
    /// Generation of the first chunk; use [`Worker::next_gen`] of the previous allreduce
    /// for the next one, so every worker of the job stays in step.
    pub first_gen: u16,
    /// Addresses: this worker's, and the aggregator's (destination).
    pub endpoints: Endpoints,
}

impl WorkerConfig {
    /// A worker of `job_id` with source id `src_id`, sending to `aggregator` on
    /// [`wire::DEFAULT_UDP_PORT`] from `10.0.0.<src_id + 1>`; 1024 gradients per packet, a
    /// window of 256, no retransmission.
    pub fn new(job_id: u8, src_id: u8, aggregator: Ipv4Addr) -> Self {
        WorkerConfig {
            job_id,
            src_id,
            grads_per_packet: 1024,
            window: 256,
            retransmit_after_ns: None,
            first_gen: 0,
            endpoints: Endpoints {
                src_mac: [0x02, 0, 0, 0, job_id, src_id],
                dst_mac: [0x02, 0, 0, 0, 0, 0xfe],
                src_addr: Ipv4Addr::new(10, 0, 0, src_id.wrapping_add(1)),
                dst_addr: aggregator,
                src_port: wire::DEFAULT_UDP_PORT,
                dst_port: wire::DEFAULT_UDP_PORT,
            },
        }
    }
}

/// What a worker counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct WorkerStats {
    /// Packets sent, retransmissions included.
    pub sent: u64,
    /// Of those, retransmissions.
    pub retransmitted: u64,
    /// Results taken.
    pub results: u64,
    /// Of those, partial (degraded) ones.
    pub degraded: u64,
    /// Results for chunks already complete or not outstanding (duplicates), ignored.
    pub ignored: u64,
    /// Chunks settled as lost: the aggregator answered that their generation's result is
    /// gone ([`wire::Gone`]; see [`Worker::lost`]).
    pub lost: u64,
}

/// What [`Worker::on_frame`] did with a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// Chunk `chunk`'s result arrived: it needs nothing more, and its slot of the window
    /// is free.
    Result {
        /// The chunk's index in the model.
        chunk: usize,
    },
    /// The aggregator answered that chunk `chunk`'s result is gone ([`wire::Gone`]): the
    /// chunk is settled as lost ([`Worker::lost`]: zero sums, `src_cnt` 0, degraded). It
    /// needs nothing more either, and its slot of the window is free.
    Lost {
        /// The chunk's index in the model.
        chunk: usize,
    },
    /// A result this worker does not need (a duplicate, or another job's).
    Ignored,
}

/// UDP payloads end to end, as [`Worker::poll_payloads`] gives them: one buffer kept from
/// one poll to the next, so a sender on a socket allocates nothing per packet.
#[derive(Clone, Debug, Default)]
pub struct Payloads {
    bytes: Vec<u8>,
    /// Where each payload ends in `bytes` (it starts where the one before ended).
    ends: Vec<usize>,
}

impl Payloads {
    /// No payloads.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes the payloads, keeping the buffers.
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }

    /// Number of payloads.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// No payloads.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The payloads in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(&self.ends).map(|(a, &b)| &self.bytes[a..b])
    }
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    chunk: usize,
    /// Last (re)transmission.
    sent_ns: u64,
    /// First transmission, for the result's latency.
    first_ns: u64,
}

/// Sums vectors of at least this many bytes take their Results with streaming stores
/// ([`read_be_i32s_streaming`]): larger than the caches keep, so a cached store would only
/// fetch each line from memory before writing it, and push another out. Measured with
/// `pfemu serve` and four 80 MB workers on one machine: 1.13x the goodput. Smaller vectors
/// stay in the caches for whoever reads the sums next.
pub const STREAM_SUMS_BYTES: usize = 8 << 20;

/// One worker's allreduce of one gradient vector.
#[derive(Debug)]
pub struct Worker {
    cfg: WorkerConfig,
    values: Vec<i32>,
    sums: Vec<i32>,
    /// Per chunk: sources in its result (0 until it arrives, and for a lost chunk).
    src_cnt: Vec<u8>,
    degraded: Vec<bool>,
    /// Per chunk: its result is gone ([`wire::Gone`]).
    lost: Vec<bool>,
    /// Per block id (slot): the chunk it carries now, if its result is still missing.
    slots: Vec<Option<Slot>>,
    next_chunk: usize,
    done: usize,
    stats: WorkerStats,
    /// Per result taken with [`Worker::on_frame_at`]: time from the chunk's first send.
    latencies: Vec<u64>,
    /// When the last result arrived (with [`Worker::on_frame_at`]).
    finished_ns: Option<u64>,
    /// The run this worker joined ([`Worker::take_joined`]); 0: none, the paper's header
    /// alone.
    run_id: u8,
    /// Once joined, also take Results that carry no run ([`Worker::take_results_without_run`]).
    results_without_run: bool,
}

impl Worker {
    /// A worker that will allreduce `values` (already integers).
    pub fn new(cfg: WorkerConfig, values: Vec<i32>) -> Result<Worker, HostError> {
        let bad = |setting, reason: String| Err(HostError::Config { setting, reason });
        if !(1..=usize::from(MAX_GRAD_CNT)).contains(&cfg.grads_per_packet) {
            return bad(
                "grads_per_packet",
                format!("{} is not in 1..={MAX_GRAD_CNT}", cfg.grads_per_packet),
            );
        }
        if !(1..=4095).contains(&cfg.window) {
            return bad(
                "window",
                format!("{} is not in 1..=4095 (block ids in flight)", cfg.window),
            );
        }
        if values.is_empty() {
            return bad("values", "nothing to aggregate".into());
        }
        let chunks = values.len().div_ceil(cfg.grads_per_packet);
        // Written here, not left to the allocator's zeroed pages: a zeroed allocation is
        // mapped on first write, which would put a page fault per 1024 sums into the
        // allreduce (a training loop reuses this buffer every step, faulted in once).
        let mut sums = vec![0; values.len()];
        // (Through black_box, so that the compiler cannot drop the fill as writing zeros
        // over zeros.)
        std::hint::black_box(sums.as_mut_slice()).fill(0);
        Ok(Worker {
            sums,
            src_cnt: vec![0; chunks],
            degraded: vec![false; chunks],
            lost: vec![false; chunks],
            slots: vec![None; cfg.window],
            next_chunk: 0,
            done: 0,
            stats: WorkerStats::default(),
            latencies: Vec::new(),
            finished_ns: None,
            run_id: 0,
            results_without_run: false,
            cfg,
            values,
        })
    }

    /// A worker that will allreduce `gradients`, scaled to integers.
    pub fn from_floats(
        cfg: WorkerConfig,
        gradients: &[f32],
        scaling: Scaling,
    ) -> Result<Worker, HostError> {
        Worker::new(cfg, gradients.iter().map(|&g| scaling.to_int(g)).collect())
    }

    /// A worker that will allreduce FP32 `gradients` through FPISA lanes
    /// ([`crate::microcode::trio_ml::Lanes::Fpisa`]): the floats go out as they are, in network
    /// byte order (no scaling step), and [`Worker::float_sums`] reads the Results back.
    pub fn from_f32(cfg: WorkerConfig, gradients: &[f32]) -> Result<Worker, HostError> {
        Worker::new(cfg, gradients.iter().map(|g| g.to_bits() as i32).collect())
    }

    /// The settings.
    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// Chunks (packets) the vector is split into.
    pub fn chunks(&self) -> usize {
        self.src_cnt.len()
    }

    /// The (block id, generation) chunk `c` travels as.
    pub fn block_of(&self, c: usize) -> (u32, u16) {
        let w = self.cfg.window;
        (
            (c % w) as u32,
            self.cfg.first_gen.wrapping_add((c / w) as u16),
        )
    }

    /// The generation the next allreduce of the job starts at.
    pub fn next_gen(&self) -> u16 {
        // Every slot moves on by the generations this allreduce used in it.
        self.cfg
            .first_gen
            .wrapping_add(self.chunks().div_ceil(self.cfg.window) as u16)
    }

    /// The Join frame of this worker ([`Control::Join`]): send it before any gradients,
    /// and again while no answer comes. `nonce` must differ from the one any earlier
    /// process of this source joined with (take it at random), else the aggregator takes
    /// the Join for a repeat and answers with the old run.
    pub fn join_frame(&self, nonce: u32) -> Vec<u8> {
        wire::join_packet(self.cfg.endpoints, self.cfg.job_id, self.cfg.src_id, nonce)
    }

    /// Takes the aggregator's answer to [`Worker::join_frame`]: when `frame` is the
    /// [`Control::Joined`] of this worker's Join with `nonce`, this worker joins that run
    /// (its packets carry the run id, Results of other runs are ignored) and the run id
    /// comes back. Anything else gives `None`. Call it before the first [`Worker::poll`].
    pub fn take_joined(&mut self, frame: &[u8], nonce: u32) -> Option<u8> {
        let (hdr, _) = wire::parse(frame).ok()?;
        let mine = hdr.job_id == self.cfg.job_id && hdr.src_id == self.cfg.src_id;
        match Control::of(&hdr) {
            Some(Control::Joined { run_id, nonce: n }) if mine && n == nonce && run_id != 0 => {
                self.run_id = run_id;
                Some(run_id)
            }
            _ => None,
        }
    }

    /// The run this worker joined (0: none; its packets carry the paper's header alone).
    pub fn run_id(&self) -> u8 {
        self.run_id
    }

    /// Once joined, also take Results that carry no run (run 0), as well as those of the run
    /// joined. Off by default: a joined worker takes only its run's Results, never the
    /// run-0 Results of clients of the same job that speak the paper's header alone (the
    /// same block and generation ids, other gradients; the job's Results go to every
    /// member).
    ///
    /// Turn it on for a worker that joins its aggregator below an in-engine hierarchy (a
    /// first-level PFE whose job's Results go to a top-level PFE, whose Results come back
    /// down through the first-level PFE's routes unchanged): a Result going up a hierarchy
    /// carries no run, so the top's blocks are of run 0, and so are its Results. Under
    /// `pfemu serve --upstream` it is not needed: a first-level server takes part in the
    /// run protocol upstream and puts its own job's run in the Results it fans out.
    pub fn take_results_without_run(&mut self, on: bool) {
        self.results_without_run = on;
    }

    /// Chunk `c`'s Trio-ML header and gradients.
    fn chunk(&self, c: usize) -> (TrioMlHdrFields, &[i32]) {
        let g = self.cfg.grads_per_packet;
        let (block_id, gen_id) = self.block_of(c);
        let values = &self.values[c * g..((c + 1) * g).min(self.values.len())];
        let hdr = TrioMlHdrFields {
            job_id: self.cfg.job_id,
            block_id,
            src_id: self.cfg.src_id,
            gen_id,
            grad_cnt: values.len() as u16,
            final_block: c + 1 == self.chunks(),
            run_id: self.run_id,
            ..TrioMlHdrFields::default()
        };
        (hdr, values)
    }

    fn packet(&self, c: usize) -> Vec<u8> {
        let (hdr, gradients) = self.chunk(c);
        wire::agg_packet(&AggPacket {
            endpoints: self.cfg.endpoints,
            hdr,
            gradients,
        })
    }

    /// Appends to `out` the packets to send at `now_ns`: chunks whose slot is free (the
    /// window has room), then chunks whose result is overdue (retransmissions).
    pub fn poll(&mut self, now_ns: u64, out: &mut Vec<Vec<u8>>) {
        let mut due = Vec::new();
        self.due(now_ns, &mut due);
        out.extend(due.into_iter().map(|c| self.packet(c)));
    }

    /// [`Worker::poll`] for a sender on a UDP socket: appends to `out` the UDP payloads
    /// (Trio-ML header and gradients, no Ethernet, IPv4 or UDP header) of the packets to
    /// send at `now_ns`, into buffers `out` keeps from one poll to the next.
    pub fn poll_payloads(&mut self, now_ns: u64, out: &mut Payloads) {
        let mut due = Vec::new();
        self.due(now_ns, &mut due);
        for c in due {
            let (hdr, gradients) = self.chunk(c);
            wire::append_payload(&mut out.bytes, &hdr, gradients);
            out.ends.push(out.bytes.len());
        }
    }

    /// The chunks to send at `now_ns`, in order (see [`Worker::poll`]), their slots marked
    /// as sent.
    fn due(&mut self, now_ns: u64, out: &mut Vec<usize>) {
        while self.next_chunk < self.chunks() {
            let s = self.next_chunk % self.cfg.window;
            if self.slots[s].is_some() {
                break;
            }
            let c = self.next_chunk;
            out.push(c);
            self.slots[s] = Some(Slot {
                chunk: c,
                sent_ns: now_ns,
                first_ns: now_ns,
            });
            self.stats.sent += 1;
            self.next_chunk += 1;
        }
        if let Some(after) = self.cfg.retransmit_after_ns {
            for s in 0..self.slots.len() {
                let Some(slot) = self.slots[s] else { continue };
                if now_ns.saturating_sub(slot.sent_ns) >= after {
                    out.push(slot.chunk);
                    self.slots[s] = Some(Slot {
                        sent_ns: now_ns,
                        ..slot
                    });
                    self.stats.sent += 1;
                    self.stats.retransmitted += 1;
                }
            }
        }
    }

    /// Takes a frame from the aggregator. A Result for an outstanding chunk is stored and
    /// frees its slot; so does a [`wire::Gone`] for it, which settles the chunk as lost
    /// ([`Worker::lost`]); anything else this worker does not need is ignored (Results of
    /// another run than the one it joined among them). A [`Control::Superseded`] for this
    /// worker's job, once it joined a run, is [`HostError::Superseded`].
    pub fn on_frame(&mut self, frame: &[u8]) -> Result<Received, HostError> {
        self.take(frame, None)
    }

    /// [`Worker::on_frame`] at time `now_ns` (the clock [`Worker::poll`] is given): also
    /// records the result's latency, from the chunk's first transmission.
    pub fn on_frame_at(&mut self, frame: &[u8], now_ns: u64) -> Result<Received, HostError> {
        self.take(frame, Some(now_ns))
    }

    /// [`Worker::on_frame_at`] for a receiver on a UDP socket: takes the UDP payload of a
    /// frame from the aggregator (Trio-ML header and gradients).
    pub fn on_payload_at(&mut self, payload: &[u8], now_ns: u64) -> Result<Received, HostError> {
        let (hdr, grads) = wire::parse_payload(payload)?;
        self.take_parsed(&hdr, grads, Some(now_ns))
    }

    /// When the last result arrived, on the clock given to [`Worker::on_frame_at`] (with
    /// [`drive`]: nanoseconds since `drive` was called).
    pub fn finished_ns(&self) -> Option<u64> {
        self.finished_ns
    }

    /// Latencies of the results taken by [`Worker::on_frame_at`], in arrival order (ns).
    pub fn latencies_ns(&self) -> &[u64] {
        &self.latencies
    }

    fn take(&mut self, frame: &[u8], now_ns: Option<u64>) -> Result<Received, HostError> {
        let (hdr, grads) = wire::parse(frame)?;
        // A packet to the aggregator (another worker's, seen on a shared wire, or this
        // one's own looped back) is not a Result, whatever its header says.
        let dst = &frame[wire::IPV4_AT + 16..wire::IPV4_AT + 20];
        if dst == self.cfg.endpoints.dst_addr.octets() {
            self.stats.ignored += 1;
            return Ok(Received::Ignored);
        }
        self.take_parsed(&hdr, grads, now_ns)
    }

    fn take_parsed(
        &mut self,
        hdr: &TrioMlHdrFields,
        grads: &[u8],
        now_ns: Option<u64>,
    ) -> Result<Received, HostError> {
        if Gone::of(hdr).is_some() {
            return Ok(self.take_gone(hdr, now_ns));
        }
        if hdr.ctl {
            let joined = hdr.job_id == self.cfg.job_id && self.run_id != 0;
            if let (Some(Control::Superseded { run_id }), true) = (Control::of(hdr), joined) {
                return Err(HostError::Superseded {
                    job_id: hdr.job_id,
                    run_id: self.run_id,
                    current: run_id,
                    missing: self.missing(),
                });
            }
            self.stats.ignored += 1;
            return Ok(Received::Ignored);
        }
        let Some((s, slot)) = self.outstanding(hdr) else {
            self.stats.ignored += 1;
            return Ok(Received::Ignored);
        };
        let c = slot.chunk;
        let range = self.range_of(c);
        if range.len() != usize::from(hdr.grad_cnt) {
            self.stats.ignored += 1;
            return Ok(Received::Ignored);
        }
        // `grads` holds `grad_cnt` lanes (the payload's parse checked it), as many as
        // `range`.
        let streamed = self.sums.len() * 4 >= STREAM_SUMS_BYTES;
        let sums = &mut self.sums[range];
        if streamed {
            read_be_i32s_streaming(sums, grads);
        } else {
            read_be_i32s(sums, grads);
        }
        self.src_cnt[c] = hdr.src_cnt;
        self.degraded[c] = hdr.degraded;
        if let Some(now) = now_ns {
            self.latencies.push(now.saturating_sub(slot.first_ns));
        }
        self.settle(s, now_ns);
        self.stats.results += 1;
        self.stats.degraded += u64::from(hdr.degraded);
        Ok(Received::Result { chunk: c })
    }

    /// The slot of the window and the outstanding chunk a frame from the aggregator names:
    /// this worker's job and run (see [`Worker::take_results_without_run`]), a block id of
    /// the window whose chunk is still without a result, and that chunk's generation.
    fn outstanding(&self, hdr: &TrioMlHdrFields) -> Option<(usize, Slot)> {
        // A Result of another run than this worker's (run 0 when it joined none), except
        // the run-0 Results of an in-engine hierarchy's top when told to take them (see
        // `take_results_without_run`).
        let without_run = hdr.run_id == 0 && self.results_without_run;
        let other_run = hdr.run_id != self.run_id && !without_run;
        if other_run || hdr.job_id != self.cfg.job_id || hdr.block_id as usize >= self.cfg.window {
            return None;
        }
        let s = hdr.block_id as usize;
        let slot = self.slots[s]?;
        (self.block_of(slot.chunk).1 == hdr.gen_id).then_some((s, slot))
    }

    /// The values of chunk `c`.
    fn range_of(&self, c: usize) -> std::ops::Range<usize> {
        let g = self.cfg.grads_per_packet;
        c * g..((c + 1) * g).min(self.values.len())
    }

    /// Slot `s`'s chunk needs nothing more: the slot is free for the next chunk.
    fn settle(&mut self, s: usize, now_ns: Option<u64>) {
        if self.done + 1 == self.chunks() {
            self.finished_ns = now_ns;
        }
        self.slots[s] = None;
        self.done += 1;
    }

    /// A [`Gone`]: the outstanding chunk it names is lost (no sums, `src_cnt` 0, degraded);
    /// one this worker is not waiting for is ignored.
    fn take_gone(&mut self, hdr: &TrioMlHdrFields, now_ns: Option<u64>) -> Received {
        let Some((s, slot)) = self.outstanding(hdr) else {
            self.stats.ignored += 1;
            return Received::Ignored;
        };
        let c = slot.chunk;
        let range = self.range_of(c);
        self.sums[range].fill(0);
        self.src_cnt[c] = 0;
        self.degraded[c] = true;
        self.lost[c] = true;
        self.settle(s, now_ns);
        self.stats.lost += 1;
        Received::Lost { chunk: c }
    }

    /// Every chunk's result has arrived.
    pub fn is_done(&self) -> bool {
        self.done == self.chunks()
    }

    /// Chunks still without a result.
    pub fn missing(&self) -> usize {
        self.chunks() - self.done
    }

    /// The aggregated integers (sums over the contributing sources), as received.
    pub fn sums(&self) -> &[i32] {
        &self.sums
    }

    /// Per chunk: how many sources its result sums.
    pub fn src_counts(&self) -> &[u8] {
        &self.src_cnt
    }

    /// Per chunk: the result is partial (a straggler was left out), or lost.
    pub fn degraded(&self) -> &[bool] {
        &self.degraded
    }

    /// Per chunk: lost, its result gone: this worker lost the result of the chunk's
    /// generation (and every answer to its retransmissions) while the job's next generation
    /// of the block id finished without it and replaced the result at the aggregator, which
    /// answered [`wire::Gone`]. A lost chunk's sums are zeros and its `src_cnt` 0 (so
    /// [`Worker::mean`] gives zeros: the chunk's gradients are skipped this step), and
    /// [`WorkerStats::lost`] counts it.
    pub fn lost(&self) -> &[bool] {
        &self.lost
    }

    /// The averaged gradients: each sum rescaled and divided by its chunk's `src_cnt`
    /// (the paper's servers divide partial results by the number of sources in them).
    pub fn mean(&self, scaling: Scaling) -> Vec<f32> {
        let g = self.cfg.grads_per_packet;
        self.sums
            .iter()
            .enumerate()
            .map(|(i, &v)| scaling.to_float(v) / f32::from(self.src_cnt[i / g].max(1)))
            .collect()
    }

    /// The FP32 sums of an FPISA job ([`Worker::from_f32`]), as received.
    pub fn float_sums(&self) -> Vec<f32> {
        self.sums
            .iter()
            .map(|&v| f32::from_bits(v as u32))
            .collect()
    }

    /// The averaged FP32 gradients of an FPISA job: each sum divided by its chunk's
    /// `src_cnt` (partial Results sum fewer sources).
    pub fn float_mean(&self) -> Vec<f32> {
        let g = self.cfg.grads_per_packet;
        self.float_sums()
            .iter()
            .enumerate()
            .map(|(i, &v)| v / f32::from(self.src_cnt[i / g].max(1)))
            .collect()
    }

    /// What this worker counted.
    pub fn stats(&self) -> WorkerStats {
        self.stats
    }

    /// When the oldest outstanding chunk was sent, if any is outstanding.
    fn oldest_sent(&self) -> Option<u64> {
        self.slots.iter().flatten().map(|s| s.sent_ns).min()
    }
}

/// A fault injector for one direction of a link: drops and duplicates packets at random
/// (deterministically for a seed).
#[derive(Clone, Debug)]
pub struct Lossy {
    /// Probability of dropping a packet.
    pub drop: f64,
    /// Probability of sending a packet twice.
    pub duplicate: f64,
    rng: SplitMix64,
    /// Packets dropped so far.
    pub dropped: u64,
    /// Packets duplicated so far.
    pub duplicated: u64,
}

impl Lossy {
    /// Drops with probability `drop`, duplicates with probability `duplicate`.
    pub fn new(drop: f64, duplicate: f64, seed: u64) -> Self {
        Lossy {
            drop,
            duplicate,
            rng: SplitMix64::new(seed),
            dropped: 0,
            duplicated: 0,
        }
    }

    /// How many copies of a packet go through: 0, 1 or 2.
    pub fn copies(&mut self) -> usize {
        if self.rng.uniform() < self.drop {
            self.dropped += 1;
            0
        } else if self.rng.uniform() < self.duplicate {
            self.duplicated += 1;
            2
        } else {
            1
        }
    }
}

/// How [`drive`] runs a worker.
#[derive(Debug)]
pub struct DriveOptions {
    /// Faults on packets the worker sends.
    pub uplink: Option<Lossy>,
    /// Faults on packets the worker receives.
    pub downlink: Option<Lossy>,
    /// Give up when no result arrived for this long.
    pub give_up_after: Duration,
}

impl Default for DriveOptions {
    /// No faults; give up after 10 s without progress.
    fn default() -> Self {
        DriveOptions {
            uplink: None,
            downlink: None,
            give_up_after: Duration::from_secs(10),
        }
    }
}

/// Runs `worker` in the calling thread until it has every result: sends what
/// [`Worker::poll`] gives through `inject` (as arriving on `port`), feeds frames from
/// `rx` (what the aggregator sends to this worker) to [`Worker::on_frame`], and sleeps
/// on `rx` in between. Time is the real clock from the call.
pub fn drive(
    worker: &mut Worker,
    port: Port,
    inject: &(dyn Fn(Port, &[u8]) + Sync),
    rx: &Receiver<Vec<u8>>,
    opts: &mut DriveOptions,
) -> Result<(), HostError> {
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut out = Vec::new();
    let mut last_progress = Instant::now();
    while !worker.is_done() {
        worker.poll(now(), &mut out);
        for p in out.drain(..) {
            let copies = opts.uplink.as_mut().map_or(1, Lossy::copies);
            for _ in 0..copies {
                inject(port, &p);
            }
        }
        // Wait for a frame until the oldest outstanding chunk may need resending.
        let wait = match (worker.config().retransmit_after_ns, worker.oldest_sent()) {
            (Some(after), Some(sent)) => {
                Duration::from_nanos((sent + after).saturating_sub(now()).max(1_000))
            }
            _ => Duration::from_millis(5),
        };
        match rx.recv_timeout(wait) {
            Ok(frame) => {
                let mut frames = vec![frame];
                frames.extend(rx.try_iter());
                for f in frames {
                    let copies = opts.downlink.as_mut().map_or(1, Lossy::copies);
                    for _ in 0..copies {
                        if let Received::Result { .. } | Received::Lost { .. } =
                            worker.on_frame_at(&f, now())?
                        {
                            last_progress = Instant::now();
                        }
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(HostError::TimedOut {
                    missing: worker.missing(),
                })
            }
        }
        if last_progress.elapsed() > opts.give_up_after {
            return Err(HostError::TimedOut {
                missing: worker.missing(),
            });
        }
    }
    Ok(())
}

/// One worker of [`run_workers`]: the worker, the port it is attached to, the channel the
/// frames for it arrive on, and how to drive it.
pub struct Attached {
    /// The worker.
    pub worker: Worker,
    /// Its port (what `inject` is called with).
    pub port: Port,
    /// Frames the aggregator sends it.
    pub rx: Receiver<Vec<u8>>,
    /// Faults and patience.
    pub opts: DriveOptions,
}

/// Runs every worker on its own thread with [`drive`] until all are done; returns them
/// (with their results) in order, or the first error.
pub fn run_workers(
    workers: Vec<Attached>,
    inject: &(dyn Fn(Port, &[u8]) + Sync),
) -> Result<Vec<Worker>, HostError> {
    std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|mut a| {
                s.spawn(move || {
                    drive(&mut a.worker, a.port, inject, &a.rx, &mut a.opts).map(|()| a.worker)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker thread panicked"))
            .collect()
    })
}

/// A sink that hands each frame leaving port `p` to channel `p` (`0..ports`); frames on
/// other ports are dropped. Made by [`port_channels`].
#[derive(Debug)]
pub struct PortChannels {
    txs: Vec<crossbeam_channel::Sender<Vec<u8>>>,
}

impl pfemu::pfe::Sink for PortChannels {
    fn deliver(&self, port: Port, frames: pfemu::pfe::Frames<'_>) {
        if let Some(tx) = self.txs.get(usize::from(port)) {
            for f in frames.iter() {
                let _ = tx.send(f.to_vec());
            }
        }
    }
}

/// A [`PortChannels`] sink for ports `0..ports` and its receivers, by port.
pub fn port_channels(ports: usize) -> (PortChannels, Vec<Receiver<Vec<u8>>>) {
    let (txs, rxs) = (0..ports).map(|_| crossbeam_channel::unbounded()).unzip();
    (PortChannels { txs }, rxs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(window: usize, g: usize) -> WorkerConfig {
        WorkerConfig {
            grads_per_packet: g,
            window,
            ..WorkerConfig::new(1, 2, Ipv4Addr::new(10, 0, 0, 100))
        }
    }

    /// The Result the aggregator would send for `packet` with every value times `k`.
    fn result_of(packet: &[u8], k: i32, src_cnt: u8, degraded: bool) -> Vec<u8> {
        let (mut hdr, grads) = wire::parse(packet).unwrap();
        let sums: Vec<i32> = wire::gradients(grads).iter().map(|v| v * k).collect();
        hdr.src_cnt = src_cnt;
        hdr.degraded = degraded;
        hdr.age_op = u8::from(degraded);
        // From the aggregator to the job's group, as the program sends it.
        let e = WorkerConfig::new(1, 0, Ipv4Addr::new(10, 0, 0, 100)).endpoints;
        wire::agg_packet(&AggPacket {
            endpoints: wire::Endpoints {
                src_addr: e.dst_addr,
                dst_addr: Ipv4Addr::new(239, 0, 0, 1),
                ..e
            },
            hdr,
            gradients: &sums,
        })
    }

    #[test]
    fn scaling_round_trips_and_never_overflows_the_sum() {
        let s = Scaling::for_range(2.0, 8);
        for g in [0.0f32, 1.0, -1.5, 2.0, -2.0, 1e-3] {
            assert!((s.to_float(s.to_int(g)) - g).abs() <= 1.0 / s.factor);
        }
        let total: i64 = (0..8).map(|_| i64::from(s.to_int(2.0))).sum();
        assert!(total <= i64::from(i32::MAX));
        assert_eq!(s.to_int(f32::NAN), 0);
        assert_eq!(s.to_int(f32::INFINITY), i32::MAX);
    }

    #[test]
    fn chunks_use_window_slots_and_advance_generations() {
        let w = Worker::new(
            WorkerConfig {
                first_gen: 65_534,
                ..cfg(3, 4)
            },
            (0..30).collect(),
        )
        .unwrap();
        assert_eq!(w.chunks(), 8);
        assert_eq!(w.block_of(0), (0, 65_534));
        assert_eq!(w.block_of(2), (2, 65_534));
        assert_eq!(w.block_of(3), (0, 65_535));
        assert_eq!(w.block_of(7), (1, 0), "generations wrap");
        assert_eq!(w.next_gen(), 1);
    }

    #[test]
    fn the_window_bounds_outstanding_packets_and_results_free_slots() {
        let mut w = Worker::new(cfg(2, 4), (1..=20).collect()).unwrap();
        let mut out = Vec::new();
        w.poll(0, &mut out);
        assert_eq!(out.len(), 2, "window of 2");
        let (h, g) = wire::parse(&out[1]).unwrap();
        assert_eq!((h.block_id, h.gen_id, h.grad_cnt, h.src_id), (1, 0, 4, 2));
        assert_eq!(wire::gradients(g), [5, 6, 7, 8]);
        // The result of chunk 1 frees slot 1 for chunk 3 (chunk 2 needs slot 0).
        assert_eq!(
            w.on_frame(&result_of(&out[1], 3, 3, false)).unwrap(),
            Received::Result { chunk: 1 }
        );
        let mut more = Vec::new();
        w.poll(1, &mut more);
        assert!(more.is_empty(), "chunk 2 waits for slot 0");
        w.on_frame(&result_of(&out[0], 3, 3, false)).unwrap();
        w.poll(2, &mut more);
        assert_eq!(more.len(), 2);
        let blocks: Vec<(u32, u16)> = more
            .iter()
            .map(|p| {
                let h = wire::parse(p).unwrap().0;
                (h.block_id, h.gen_id)
            })
            .collect();
        assert_eq!(blocks, [(0, 1), (1, 1)]);
        // A duplicate of an old result is ignored.
        assert_eq!(
            w.on_frame(&result_of(&out[0], 3, 3, false)).unwrap(),
            Received::Ignored
        );
        for p in &more {
            w.on_frame(&result_of(p, 3, 3, false)).unwrap();
        }
        let mut last = Vec::new();
        w.poll(3, &mut last);
        assert_eq!(last.len(), 1, "20 values in chunks of 4: five chunks");
        assert_eq!(wire::parse(&last[0]).unwrap().0.grad_cnt, 4);
        assert!(wire::parse(&last[0]).unwrap().0.final_block);
        w.on_frame(&result_of(&last[0], 3, 3, true)).unwrap();
        assert!(w.is_done());
        assert_eq!(w.sums(), (1..=20).map(|v| 3 * v).collect::<Vec<_>>());
        assert_eq!(w.src_counts(), [3, 3, 3, 3, 3]);
        assert_eq!(w.degraded(), [false, false, false, false, true]);
        let s = w.stats();
        assert_eq!((s.sent, s.results, s.degraded, s.ignored), (5, 5, 1, 1));
    }

    #[test]
    fn a_vector_past_the_streaming_size_gets_its_sums_exact() {
        // Above STREAM_SUMS_BYTES, Results are stored with streaming stores; the last
        // chunk is short, so the stores end mid-chunk too.
        let n = STREAM_SUMS_BYTES / 4 + 1000;
        let values: Vec<i32> = (0..n as i32).map(|v| v - 1000).collect();
        let mut w = Worker::new(cfg(4095, 1024), values.clone()).unwrap();
        let mut out = Vec::new();
        w.poll(0, &mut out);
        assert_eq!(out.len(), n.div_ceil(1024), "one window holds every chunk");
        for p in out.iter().rev() {
            w.on_frame(&result_of(p, 3, 3, false)).unwrap();
        }
        assert!(w.is_done());
        let want: Vec<i32> = values.iter().map(|v| 3 * v).collect();
        assert!(w.sums() == want, "the streamed sums differ");
    }

    /// A joined worker takes its run's Results only: not another run's, nor the run-0
    /// Results of clients of its job that joined none (same block and generation, other
    /// sums), unless told to (below an in-engine hierarchy, whose top's Results carry no
    /// run). A worker that joined none takes run-0 Results only.
    #[test]
    fn a_joined_worker_takes_only_its_runs_results() {
        let joined = |run: u8| {
            let mut w = Worker::new(cfg(1, 4), vec![1, 2, 3, 4]).unwrap();
            let c = w.config();
            let mut hdr = Control::Joined {
                run_id: run,
                nonce: 9,
            }
            .header(c.job_id, c.src_id);
            hdr.grad_cnt = 0;
            let e = c.endpoints;
            let frame = wire::agg_packet(&AggPacket {
                endpoints: wire::Endpoints {
                    src_addr: e.dst_addr,
                    dst_addr: e.src_addr,
                    ..e
                },
                hdr,
                gradients: &[],
            });
            if run != 0 {
                assert_eq!(w.take_joined(&frame, 9), Some(run));
            }
            let mut out = Vec::new();
            w.poll(0, &mut out);
            (w, out.remove(0))
        };
        // The Result of the worker's chunk, in run `run`.
        let result_in = |packet: &[u8], run: u8| {
            let mut r = result_of(packet, 2, 2, false);
            wire::TrioMlHdr::new_unchecked(&mut r[wire::TRIO_ML_HDR_AT..wire::GRADS_AT])
                .set_run_id(run);
            r
        };
        let (mut w, packet) = joined(3);
        assert_eq!(w.run_id(), 3);
        for other in [0, 2] {
            assert_eq!(
                w.on_frame(&result_in(&packet, other)).unwrap(),
                Received::Ignored,
                "run {other}"
            );
        }
        assert_eq!(
            w.on_frame(&result_in(&packet, 3)).unwrap(),
            Received::Result { chunk: 0 }
        );
        // Below an in-engine hierarchy.
        let (mut w, packet) = joined(3);
        w.take_results_without_run(true);
        assert_eq!(
            w.on_frame(&result_in(&packet, 0)).unwrap(),
            Received::Result { chunk: 0 }
        );
        // Joined none.
        let (mut w, packet) = joined(0);
        assert_eq!(
            w.on_frame(&result_in(&packet, 3)).unwrap(),
            Received::Ignored
        );
        assert_eq!(
            w.on_frame(&result_in(&packet, 0)).unwrap(),
            Received::Result { chunk: 0 }
        );
        assert_eq!(w.sums(), [2, 4, 6, 8]);
    }

    /// The aggregator's [`Gone`] for a frame of this worker: block `block`, generation
    /// `gen`, run `run`.
    fn gone_frame(block: u32, gen: u16, run: u8) -> Vec<u8> {
        let c = cfg(2, 4);
        let e = c.endpoints;
        wire::agg_packet(&AggPacket {
            endpoints: wire::Endpoints {
                src_addr: e.dst_addr,
                dst_addr: e.src_addr,
                ..e
            },
            hdr: Gone {
                block_id: block,
                gen_id: gen,
                run_id: run,
            }
            .header(c.job_id, c.src_id),
            gradients: &[],
        })
    }

    /// A Gone for an outstanding chunk settles it as lost at once: zero sums, `src_cnt` 0,
    /// degraded, counted, its slot free for the next chunk. One for another generation,
    /// run or block id, or for a chunk already settled, is ignored.
    #[test]
    fn a_gone_generation_settles_its_chunk_as_lost() {
        let mut w = Worker::new(
            WorkerConfig {
                retransmit_after_ns: Some(1_000),
                ..cfg(2, 4)
            },
            (1..=16).collect(),
        )
        .unwrap();
        let mut out = Vec::new();
        w.poll(0, &mut out);
        assert_eq!(
            out.len(),
            2,
            "chunks 0 and 1, blocks 0 and 1 of generation 0"
        );
        for (frame, why) in [
            (gone_frame(0, 1, 0), "another generation"),
            (gone_frame(0, 0, 3), "another run"),
            (gone_frame(5, 0, 0), "a block id out of the window"),
        ] {
            assert_eq!(w.on_frame(&frame).unwrap(), Received::Ignored, "{why}");
        }
        assert_eq!(w.stats().lost, 0);
        assert_eq!(
            w.on_frame_at(&gone_frame(0, 0, 0), 500).unwrap(),
            Received::Lost { chunk: 0 }
        );
        assert_eq!(w.lost(), [true, false, false, false]);
        assert_eq!(w.src_counts()[0], 0);
        assert!(w.degraded()[0]);
        assert_eq!(&w.sums()[..4], [0, 0, 0, 0]);
        assert_eq!(w.stats().lost, 1);
        assert_eq!(w.stats().results, 0, "a lost chunk is no result");
        assert_eq!(
            w.on_frame(&gone_frame(0, 0, 0)).unwrap(),
            Received::Ignored,
            "settled already"
        );
        // Slot 0 is free: chunk 2 goes (generation 1), and only chunk 1 is overdue later.
        out.clear();
        w.poll(600, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(wire::parse(&out[0]).unwrap().0.gen_id, 1);
        out.clear();
        w.poll(1_000, &mut out);
        let again: Vec<u32> = out
            .iter()
            .map(|p| wire::parse(p).unwrap().0.block_id)
            .collect();
        assert_eq!(again, [1], "the lost chunk is not sent again");
        // The rest arrive: the worker is done, chunk 0 lost.
        w.on_frame(&result_of(&out[0], 2, 2, false)).unwrap();
        let mut last = Vec::new();
        w.poll(1_100, &mut last);
        let gen1 = wire::parse(&last[0]).unwrap();
        assert_eq!((gen1.0.block_id, gen1.0.gen_id), (1, 1));
        w.on_frame(&result_of(&last[0], 2, 2, false)).unwrap();
        let mut third = Vec::new();
        w.poll(1_200, &mut third);
        assert!(third.is_empty());
        // Chunk 2 (sent at 600) is still out: its Result settles the allreduce.
        w.on_frame(&result_of(&w.packet(2), 2, 2, false)).unwrap();
        assert!(w.is_done());
        assert_eq!(w.lost(), [true, false, false, false]);
        assert_eq!(w.sums()[4..], (5..=16).map(|v| 2 * v).collect::<Vec<_>>());
        let m = w.mean(Scaling { factor: 1.0 });
        assert_eq!(m[..4], [0.0; 4], "a lost chunk's mean is zeros");
    }

    #[test]
    fn overdue_chunks_are_sent_again() {
        let mut w = Worker::new(
            WorkerConfig {
                retransmit_after_ns: Some(1_000),
                ..cfg(4, 4)
            },
            (0..8).collect(),
        )
        .unwrap();
        let mut out = Vec::new();
        w.poll(0, &mut out);
        assert_eq!(out.len(), 2);
        out.clear();
        w.poll(999, &mut out);
        assert!(out.is_empty());
        w.poll(1_000, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(w.stats().retransmitted, 2);
        w.on_frame_at(&result_of(&out[0], 2, 2, false), 1_500)
            .unwrap();
        assert_eq!(w.latencies_ns(), [1_500], "from the first send");
        out.clear();
        w.poll(2_000, &mut out);
        assert_eq!(out.len(), 1, "only the chunk still missing");
    }

    #[test]
    fn mean_divides_by_each_chunks_source_count() {
        let mut w = Worker::new(cfg(2, 2), vec![10, 20, 30, 40]).unwrap();
        let mut out = Vec::new();
        w.poll(0, &mut out);
        w.on_frame(&result_of(&out[0], 4, 4, false)).unwrap();
        w.on_frame(&result_of(&out[1], 2, 2, true)).unwrap();
        let m = w.mean(Scaling { factor: 10.0 });
        assert_eq!(m, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let e = Worker::new(cfg(0, 4), vec![1]).unwrap_err();
        assert!(matches!(
            e,
            HostError::Config {
                setting: "window",
                ..
            }
        ));
        let e = Worker::new(cfg(4, 5000), vec![1]).unwrap_err();
        assert!(matches!(
            e,
            HostError::Config {
                setting: "grads_per_packet",
                ..
            }
        ));
        let e = Worker::new(cfg(4, 4), vec![]).unwrap_err();
        assert!(matches!(
            e,
            HostError::Config {
                setting: "values",
                ..
            }
        ));
    }

    #[test]
    fn lossy_is_reproducible_and_near_its_rates() {
        let mut a = Lossy::new(0.1, 0.05, 7);
        let mut b = Lossy::new(0.1, 0.05, 7);
        let xs: Vec<usize> = (0..10_000).map(|_| a.copies()).collect();
        let ys: Vec<usize> = (0..10_000).map(|_| b.copies()).collect();
        assert_eq!(xs, ys);
        assert!((800..1200).contains(&a.dropped), "{}", a.dropped);
        assert!((300..600).contains(&a.duplicated), "{}", a.duplicated);
    }
}
