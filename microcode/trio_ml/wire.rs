//! Trio-ML on the wire and in memory: the packet header (Figure 8), the job and block
//! records (Figures 17 and 18) as [`header!`](pfemu::header) views, and the packet builder
//! and parser the hosts use.
//!
//! An aggregation packet (Figure 7) is Ethernet (14 bytes) + IPv4 without options (20) +
//! UDP (8) + the Trio-ML header (12) + `grad_cnt` gradients, each a 32-bit two's-complement
//! integer in network byte order. The gradients therefore start at byte [`GRADS_AT`] (54).
//! A Result packet has the same format; its gradients are the sums.

use std::net::Ipv4Addr;

use pfemu::packet::Dest;
use pfemu::wire::lanes::{read_be_i32s, write_be_i32s};
use pfemu::wire::{Ether, Ipv4, Udp, WireError, ETHERTYPE_IPV4, IPPROTO_UDP};
pub use pfemu::wire::{ETHER_LEN, IPV4_LEN, UDP_LEN};

/// The UDP destination port of aggregation packets unless configured otherwise (the
/// paper's example).
pub const DEFAULT_UDP_PORT: u16 = 12000;
/// Where the IPv4 header starts in the frame.
pub const IPV4_AT: usize = ETHER_LEN;
/// Where the UDP header starts in the frame.
pub const UDP_AT: usize = IPV4_AT + IPV4_LEN;
/// Where the Trio-ML header starts in the frame.
pub const TRIO_ML_HDR_AT: usize = UDP_AT + UDP_LEN;
/// Where the gradients start in the frame (54).
pub const GRADS_AT: usize = TRIO_ML_HDR_AT + TRIO_ML_HDR_LEN;
/// Bytes per gradient.
pub const GRAD_BYTES: usize = 4;
/// Largest `grad_cnt` the 12-bit field holds.
pub const MAX_GRAD_CNT: u16 = 4095;
/// TTL of the Result packets the aggregator creates.
pub const RESULT_TTL: u8 = 64;

pfemu::header! {
    /// The Trio-ML header, `trio_ml_hdr_t` of Figure 8 (12 bytes).
    pub struct TrioMlHdr {
        /// Aggregation job id.
        job_id: 8,
        /// Aggregation block id.
        block_id: 32,
        /// Non-zero when the block aged out (a straggler was given up on).
        age_op: 4,
        /// The block is the final block.
        r#final: 1,
        /// The aggregation is partial (not every source contributed).
        degraded: 1,
        /// pfemu's extension, in the first padding bit: the packet is a control message
        /// (of the run protocol, [`Control`], or of loss recovery, [`Gone`]), not
        /// gradients; `age_op` holds its opcode.
        ctl: 1,
        _: 1,
        /// Source id of the packet.
        src_id: 8,
        /// Number of sources contributing (in a Result).
        src_cnt: 8,
        /// Generation id: which use of the block id this is.
        gen_id: 16,
        /// pfemu's extension, in the padding before `grad_cnt`: the run of the job this
        /// packet belongs to, as the aggregator assigned it ([`Control::Joined`]); 0 for a
        /// client that speaks the paper's header alone.
        run_id: 4,
        /// Number of gradients that follow.
        grad_cnt: 12,
    }
}

pfemu::header! {
    /// The job record, `trio_ml_job_ctx_t` of Figure 17 (58 bytes).
    pub struct JobCtx {
        /// Slots in use: active blocks plus kept results.
        block_curr_cnt: 16,
        /// Most slots in use at once.
        block_cnt_max: 12,
        /// Most gradients per block.
        block_grad_max: 12,
        /// Block timeout, in milliseconds.
        block_exp: 8,
        /// Blocks created so far (wraps).
        block_total_cnt: 32,
        /// Result packets' IPv4 source address.
        out_src_addr: 32,
        /// Result packets' IPv4 destination address.
        out_dst_addr: 32,
        /// Where Result packets go: see [`nh_addr`].
        out_nh_addr: 32,
        _: 16,
        /// Trio-ML's run state, in the padding (byte 24): the lock of the Join handler.
        run_lock: 1,
        _: 3,
        /// Trio-ML's run state: the job's current run id (0 until a worker joins).
        run_id: 4,
        /// Number of sources in the job.
        src_cnt: 8,
        /// The job's sources: source `s` is bit `s % 64` of element `s / 64` (four 64-bit
        /// masks, `src_mask_0` to `src_mask_3` in the paper).
        src_mask: [64; 4],
    }
}

pfemu::header! {
    /// The block record, `trio_ml_block_ctx_t` of Figure 18 (58 bytes).
    pub struct BlockCtx {
        /// Block timeout, in milliseconds (copied from the job).
        block_exp: 8,
        /// Timer scans since a packet last referenced the block.
        block_age: 8,
        /// When the block was created, in nanoseconds of the engine clock.
        block_start_time: 64,
        /// The job record, as a 32-bit line address (see the `trio_ml` module docs).
        job_ctx_paddr: 32,
        /// The aggregation buffer, as a 32-bit line address.
        aggr_paddr: 32,
        /// Trio-ML, in the padding (byte 18): the block's run id (0: a client of the
        /// paper's header alone).
        run_id: 8,
        /// Trio-ML, in the padding (byte 19): how many blocks the slot has held, mod 256.
        /// The active table names a block by its slot and this tag, and a thread entering
        /// the gate checks it: a slot reused since the thread found it is not its block.
        slot_tag: 8,
        /// Trio-ML's gate (see the `layout` module), in the padding: no adder may enter.
        closed: 1,
        /// The gate: a thread has claimed the finishing of the block.
        taken: 1,
        /// The gate: a source's packet was itself a partial Result, so this block's is too.
        degraded: 1,
        _: 1,
        /// Gradients in the block.
        grad_cnt: 12,
        /// The gate, in the padding (bytes 22-23): adders between entering and leaving.
        in_flight: 16,
        /// Trio-ML, in the padding (byte 24): what the sources count for in the Result's
        /// `src_cnt` (a server 1, a lower aggregator its own `src_cnt`).
        contributors: 8,
        /// Sources whose gradients were added.
        rcvd_cnt: 8,
        /// Sources received: source `s` is bit `s % 64` of element `s / 64`
        /// (`rcvd_mask_0` to `rcvd_mask_3` in the paper).
        rcvd_mask: [64; 4],
    }
}

pfemu::header! {
    /// What Trio-ML keeps in a block record's line after the record (at
    /// [`BLOCK_CTX_LEN`]): the block's key, so the control plane and the Result builder can
    /// tell which block a slot holds.
    pub struct BlockKey {
        /// The block id.
        block_id: 32,
        /// The generation.
        gen_id: 16,
    }
}

pfemu::header! {
    /// What Trio-ML keeps in a job record's line after the record (at [`JOB_CTX_LEN`]).
    pub struct JobBufs {
        /// The 32-bit address of the job's aggregation buffers in the accumulator region,
        /// buffer `k` at `k * JobLayout::buffer_words` words from it; 0 when the buffers are
        /// in the slots.
        bufs_paddr: 32,
    }
}

const _: () = assert!(BLOCK_CTX_LEN + BLOCK_KEY_LEN <= 64 && JOB_CTX_LEN + JOB_BUFS_LEN <= 64);

/// Bit offset of the first source mask (`src_mask[0]`, `rcvd_mask[0]`) in both records.
pub const SOURCE_MASKS_AT_BIT: usize = BlockCtxLayout::RCVD_MASK.first.bit;
const _: () = assert!(JobCtxLayout::SRC_MASK.first.bit == SOURCE_MASKS_AT_BIT);

/// Where source `src_id`'s bit lies in a job's `src_mask` or a block's `rcvd_mask` (both
/// start at bit [`SOURCE_MASKS_AT_BIT`]): `(word, bit)`, the index of the 8-byte word of
/// the record and the bit in that word (`1 << bit`), the word read as `u64::from_be_bytes`
/// (as shared memory maps bytes to words).
///
/// Source `s` is bit `s % 64` (value `1 << (s % 64)`) of mask `s / 64`. The masks are not
/// word aligned (they start at byte 26), but each bit lies in one word.
pub const fn source_bit(src_id: u8) -> (usize, u32) {
    let f = BlockCtxLayout::RCVD_MASK.bit(src_id as usize);
    (f.word() as usize, f.shift())
}

/// Bit 31 of `out_nh_addr`: the low 16 bits are a multicast group, not a port.
pub const NH_GROUP: u32 = 1 << 31;

/// `out_nh_addr` for a destination: a port is its number; a multicast group is its number
/// with bit 31 ([`NH_GROUP`]) set. (In Trio the field points at an egress forwarding
/// chain; here the chain is the engine's port or multicast group.)
pub const fn nh_addr(dest: Dest) -> u32 {
    match dest {
        Dest::Port(p) => p as u32,
        Dest::Group(g) => NH_GROUP | g as u32,
    }
}

/// The destination an `out_nh_addr` stands for (see [`nh_addr`]).
pub const fn nh_dest(nh_addr: u32) -> Dest {
    if nh_addr & NH_GROUP != 0 {
        Dest::Group(nh_addr as u16)
    } else {
        Dest::Port(nh_addr as u16)
    }
}

/// The Trio-ML header's fields as plain values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TrioMlHdrFields {
    /// Aggregation job id.
    pub job_id: u8,
    /// Aggregation block id.
    pub block_id: u32,
    /// Non-zero when the block aged out (4 bits).
    pub age_op: u8,
    /// The header's `final` bit.
    pub final_block: bool,
    /// The aggregation is partial.
    pub degraded: bool,
    /// Source id.
    pub src_id: u8,
    /// Number of contributing sources.
    pub src_cnt: u8,
    /// Generation id.
    pub gen_id: u16,
    /// Number of gradients (12 bits).
    pub grad_cnt: u16,
    /// A control message of the run protocol (pfemu's extension; see [`Control`]).
    pub ctl: bool,
    /// The run this packet belongs to (4 bits; 0: none, the paper's header alone).
    pub run_id: u8,
}

impl TrioMlHdrFields {
    /// The fields of a header view.
    pub fn read<T: AsRef<[u8]>>(h: &TrioMlHdr<T>) -> Self {
        TrioMlHdrFields {
            job_id: h.job_id(),
            block_id: h.block_id(),
            age_op: h.age_op(),
            final_block: h.r#final(),
            degraded: h.degraded(),
            src_id: h.src_id(),
            src_cnt: h.src_cnt(),
            gen_id: h.gen_id(),
            grad_cnt: h.grad_cnt(),
            ctl: h.ctl(),
            run_id: h.run_id(),
        }
    }

    /// Writes every field (padding bits are zeroed).
    pub fn write<T: AsRef<[u8]> + AsMut<[u8]>>(&self, h: &mut TrioMlHdr<T>) {
        h.as_bytes_mut().fill(0);
        h.set_job_id(self.job_id);
        h.set_block_id(self.block_id);
        h.set_age_op(self.age_op);
        h.set_final(self.final_block);
        h.set_degraded(self.degraded);
        h.set_src_id(self.src_id);
        h.set_src_cnt(self.src_cnt);
        h.set_gen_id(self.gen_id);
        h.set_grad_cnt(self.grad_cnt);
        h.set_ctl(self.ctl);
        h.set_run_id(self.run_id);
    }
}

/// Largest run id (`run_id` is 4 bits; 0 means no run).
pub const MAX_RUN_ID: u8 = 15;

/// Control opcode (in `age_op` of a `ctl` packet): a worker asks to join its job's run.
pub const CTL_JOIN: u8 = 1;
/// Control opcode: the aggregator's answer to [`CTL_JOIN`].
pub const CTL_JOINED: u8 = 2;
/// Control opcode: the aggregator's answer to gradients of a run that is no longer the
/// job's current run.
pub const CTL_SUPERSEDED: u8 = 3;
/// Control opcode: the aggregator's answer to gradients of a generation whose Result it
/// no longer keeps ([`Gone`]).
pub const CTL_GONE: u8 = 4;

/// A control message of pfemu's run protocol, carried in a Trio-ML header with `ctl` set
/// and no gradients.
///
/// The paper's header cannot tell a job's new run from a retransmission of the last one:
/// both send block ids from 0 and generations from `first_gen`, so an aggregator that keeps
/// finished Results for loss recovery would answer the new run's first blocks with the old
/// run's sums. So a worker *joins* before it sends gradients: it sends [`Control::Join`]
/// with a nonce of its own (random per process), and the aggregator answers
/// [`Control::Joined`] with the job's current run id, which the worker then puts in every
/// packet's `run_id`. The aggregator keys blocks and kept Results by run, and starts a new
/// run when a source that has joined the current run joins again with another nonce: that
/// source restarted, so a new run began. The new run takes the next id (1 to 15, round)
/// that no block or kept Result of an earlier run still holds; while every other id is
/// held the Join is not answered (`runs_busy`) and the worker sends it again. A repeated
/// Join with the same nonce (its answer was lost) is answered with the same run. Gradients
/// of a run that is no longer current are dropped (`stale_run`) and answered with
/// [`Control::Superseded`], so their worker stops with a clear error instead of waiting.
/// Packets with `run_id` 0 (clients that speak the paper's header alone) are aggregated as
/// before, in a run of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Control {
    /// Worker to aggregator: source `src_id` of job `job_id` joins the job's run. The
    /// header's `run_id` is 0, or, from a worker whose address changed while it ran, the run
    /// it joins again with the same nonce (a rejoin: `pfemu serve` takes it from the process
    /// that joined alone; the engine reads a Join's nonce, not its run).
    Join {
        /// This worker's nonce (carried in `block_id`).
        nonce: u32,
    },
    /// Aggregator to worker: put `run_id` in every packet.
    Joined {
        /// The job's current run.
        run_id: u8,
        /// The nonce of the Join answered.
        nonce: u32,
    },
    /// Aggregator to worker: the job has moved on to run `run_id`; with `run_id` 0, the
    /// aggregator has no run of the job for the sender (the job has none yet, or, from
    /// `pfemu serve`, the sender has not joined this server instance: it restarted since,
    /// or the sender's address changed, and it may rejoin; a refused rejoin's answer carries
    /// the rejoin's nonce in `block_id`).
    /// Either way the sender's run is over.
    Superseded {
        /// The job's current run (0: none for the sender).
        run_id: u8,
    },
}

impl Control {
    /// The control message a header carries, if it is one (`ctl` set, a known opcode).
    pub fn of(h: &TrioMlHdrFields) -> Option<Control> {
        if !h.ctl {
            return None;
        }
        match h.age_op {
            CTL_JOIN => Some(Control::Join { nonce: h.block_id }),
            CTL_JOINED => Some(Control::Joined {
                run_id: h.run_id,
                nonce: h.block_id,
            }),
            CTL_SUPERSEDED => Some(Control::Superseded { run_id: h.run_id }),
            _ => None,
        }
    }

    /// The header of this message from source `src_id` of job `job_id` (no gradients).
    pub fn header(self, job_id: u8, src_id: u8) -> TrioMlHdrFields {
        let (age_op, block_id, run_id) = match self {
            Control::Join { nonce } => (CTL_JOIN, nonce, 0),
            Control::Joined { run_id, nonce } => (CTL_JOINED, nonce, run_id),
            Control::Superseded { run_id } => (CTL_SUPERSEDED, 0, run_id),
        };
        TrioMlHdrFields {
            job_id,
            block_id,
            age_op,
            src_id,
            ctl: true,
            run_id,
            ..TrioMlHdrFields::default()
        }
    }
}

/// Aggregator to worker, in loss recovery: generation `gen_id` of block `block_id` is gone.
/// The aggregator keeps one Result per block id, the last generation's, so a worker asking
/// for an older generation (a retransmission of gradients whose Result it lost) can no
/// longer be answered with it: with straggler mitigation the next generation can finish
/// without that worker (its block aged out) and replace the Result. The aggregator drops
/// such a packet as `stale_gen` and answers it with `Gone`, so the worker settles the chunk
/// as lost at once ([`super::host::Worker::lost`]) instead of sending it again until it
/// gives up.
///
/// A control message like [`Control`]'s (`ctl` set, no gradients, the opcode
/// [`CTL_GONE`] in `age_op`), about loss recovery rather than runs: it carries the block
/// id, the generation and the run of the packet answered, and `src_id` is the worker's.
/// [`Control::of`] does not decode it (it is `None` there, as an unknown opcode is).
///
/// Only a server's packet is answered (header `src_cnt` 0): an aggregator below, whose
/// Result came too late, does not retransmit and would take the message for a packet to
/// forward or a bad control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Gone {
    /// The block id asked for.
    pub block_id: u32,
    /// The generation asked for, older than the one the aggregator keeps.
    pub gen_id: u16,
    /// The run of the packet answered.
    pub run_id: u8,
}

impl Gone {
    /// The `Gone` a header carries, if it is one (`ctl` set, opcode [`CTL_GONE`]).
    pub fn of(h: &TrioMlHdrFields) -> Option<Gone> {
        (h.ctl && h.age_op == CTL_GONE).then_some(Gone {
            block_id: h.block_id,
            gen_id: h.gen_id,
            run_id: h.run_id,
        })
    }

    /// The header of this message to source `src_id` of job `job_id` (no gradients).
    pub fn header(self, job_id: u8, src_id: u8) -> TrioMlHdrFields {
        TrioMlHdrFields {
            job_id,
            block_id: self.block_id,
            age_op: CTL_GONE,
            src_id,
            gen_id: self.gen_id,
            ctl: true,
            run_id: self.run_id,
            ..TrioMlHdrFields::default()
        }
    }
}

/// A Join frame ([`Control::Join`]) from source `src_id` of job `job_id`.
pub fn join_packet(endpoints: Endpoints, job_id: u8, src_id: u8, nonce: u32) -> Vec<u8> {
    agg_packet(&AggPacket {
        endpoints,
        hdr: Control::Join { nonce }.header(job_id, src_id),
        gradients: &[],
    })
}

/// The addresses and ports of an aggregation or Result packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoints {
    /// Ethernet source address.
    pub src_mac: [u8; 6],
    /// Ethernet destination address.
    pub dst_mac: [u8; 6],
    /// IPv4 source address.
    pub src_addr: Ipv4Addr,
    /// IPv4 destination address.
    pub dst_addr: Ipv4Addr,
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port.
    pub dst_port: u16,
}

/// What [`agg_packet`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AggPacket<'a> {
    /// Addresses and ports.
    pub endpoints: Endpoints,
    /// The Trio-ML header, written as given (`grad_cnt` is not derived from `gradients`, so
    /// a test can build an inconsistent packet).
    pub hdr: TrioMlHdrFields,
    /// The gradients.
    pub gradients: &'a [i32],
}

/// Bytes of all headers before the gradients (54).
pub const HEADERS_LEN: usize = GRADS_AT;

/// Writes the Ethernet, IPv4, UDP and Trio-ML headers of a packet carrying `grad_bytes`
/// bytes of gradients into the first [`HEADERS_LEN`] bytes of `buf`: IPv4 with a valid
/// header checksum, TTL [`RESULT_TTL`], no options; UDP length set, checksum 0 (none).
///
/// # Panics
/// If `buf` is shorter than [`HEADERS_LEN`].
pub fn write_headers(buf: &mut [u8], ep: &Endpoints, hdr: &TrioMlHdrFields, grad_bytes: usize) {
    let buf = &mut buf[..HEADERS_LEN];
    write_l2_to_l4(buf, ep, TRIO_ML_HDR_LEN + grad_bytes);
    let trio = &mut buf[TRIO_ML_HDR_AT..GRADS_AT];
    trio.fill(0);
    hdr.write(&mut TrioMlHdr::new_unchecked(trio));
}

/// Writes the Ethernet, IPv4 and UDP headers of [`write_headers`] alone, for a UDP payload
/// (Trio-ML header and gradients) of `udp_payload_len` bytes, into the first
/// [`TRIO_ML_HDR_AT`] bytes of `buf`: what goes before a datagram's payload.
///
/// # Panics
/// If `buf` is shorter than [`TRIO_ML_HDR_AT`].
pub fn write_l2_to_l4(buf: &mut [u8], ep: &Endpoints, udp_payload_len: usize) {
    let buf = &mut buf[..TRIO_ML_HDR_AT];
    buf.fill(0);
    let mut eth = Ether::new_unchecked(&mut buf[..ETHER_LEN]);
    eth.set_dmac(mac_u64(ep.dst_mac));
    eth.set_smac(mac_u64(ep.src_mac));
    eth.set_etype(ETHERTYPE_IPV4);
    let udp_len = UDP_LEN + udp_payload_len;
    let mut ip = Ipv4::new_unchecked(&mut buf[IPV4_AT..UDP_AT]);
    ip.set_ver(4);
    ip.set_ihl(5);
    ip.set_total_len((IPV4_LEN + udp_len) as u16);
    ip.set_ttl(RESULT_TTL);
    ip.set_proto(IPPROTO_UDP);
    ip.set_src_addr(ep.src_addr);
    ip.set_dst_addr(ep.dst_addr);
    ip.fill_checksum();
    let mut udp = Udp::new_unchecked(&mut buf[UDP_AT..TRIO_ML_HDR_AT]);
    udp.set_src_port(ep.src_port);
    udp.set_dst_port(ep.dst_port);
    udp.set_len(udp_len as u16);
}

/// Builds an aggregation (or Result) frame: headers as [`write_headers`], then the
/// gradients in network byte order.
pub fn agg_packet(p: &AggPacket<'_>) -> Vec<u8> {
    let grad_bytes = p.gradients.len() * GRAD_BYTES;
    let mut f = vec![0u8; HEADERS_LEN + grad_bytes];
    write_headers(&mut f, &p.endpoints, &p.hdr, grad_bytes);
    write_be_i32s(&mut f[GRADS_AT..], p.gradients);
    f
}

/// Parses a Trio-ML frame (an aggregation packet or a Result): its Trio-ML header and its
/// gradient bytes (network order; see [`gradients`]). Checks that it is Ethernet + IPv4
/// without options + UDP, that the IPv4 and UDP lengths agree with each other and fit the
/// frame (trailing Ethernet padding is ignored), and that the UDP payload is the header plus
/// exactly `grad_cnt` gradients.
pub fn parse(frame: &[u8]) -> Result<(TrioMlHdrFields, &[u8]), WireError> {
    let malformed = |reason| WireError::Malformed {
        header: "TrioMl",
        reason,
    };
    let eth = Ether::new_checked(frame)?;
    if eth.etype() != ETHERTYPE_IPV4 {
        return Err(malformed("not IPv4"));
    }
    let ip = Ipv4::new_checked_full(&frame[IPV4_AT..])?;
    if ip.ihl() != 5 {
        return Err(malformed("IPv4 options"));
    }
    if ip.proto() != IPPROTO_UDP {
        return Err(malformed("not UDP"));
    }
    let udp = Udp::new_checked(&frame[UDP_AT..])?;
    let udp_len = usize::from(udp.len());
    if udp_len < UDP_LEN {
        return Err(malformed("UDP length shorter than the UDP header"));
    }
    if usize::from(ip.total_len()) != IPV4_LEN + udp_len {
        return Err(malformed("IPv4 total length disagrees with the UDP length"));
    }
    if UDP_AT + udp_len > frame.len() {
        return Err(WireError::Truncated {
            header: "TrioMl",
            need: UDP_AT + udp_len,
            have: frame.len(),
        });
    }
    parse_payload(&frame[TRIO_ML_HDR_AT..UDP_AT + udp_len])
}

/// Parses the UDP payload of a Trio-ML packet (what a UDP socket receives: the Trio-ML
/// header and the gradients): its header and gradient bytes (network order). Checks that
/// the payload is the header plus exactly `grad_cnt` gradients.
pub fn parse_payload(payload: &[u8]) -> Result<(TrioMlHdrFields, &[u8]), WireError> {
    let fields = TrioMlHdrFields::read(&TrioMlHdr::new_checked(payload)?);
    let grads = &payload[TRIO_ML_HDR_LEN..];
    if grads.len() != usize::from(fields.grad_cnt) * GRAD_BYTES {
        return Err(WireError::Malformed {
            header: "TrioMl",
            reason: "payload length is not grad_cnt gradients",
        });
    }
    Ok((fields, grads))
}

/// Appends the UDP payload of an aggregation packet to `out`: the Trio-ML header `hdr`
/// (written as given), then `gradients` in network byte order. What [`agg_packet`] puts
/// after the Ethernet, IPv4 and UDP headers, for a sender that hands payloads to a UDP
/// socket.
pub fn append_payload(out: &mut Vec<u8>, hdr: &TrioMlHdrFields, gradients: &[i32]) {
    let at = out.len();
    out.resize(at + TRIO_ML_HDR_LEN + gradients.len() * GRAD_BYTES, 0);
    hdr.write(&mut TrioMlHdr::new_unchecked(
        &mut out[at..at + TRIO_ML_HDR_LEN],
    ));
    write_be_i32s(&mut out[at + TRIO_ML_HDR_LEN..], gradients);
}

/// Decodes gradient bytes (network order) into integers.
pub fn gradients(bytes: &[u8]) -> Vec<i32> {
    let whole = bytes.len() / GRAD_BYTES * GRAD_BYTES;
    let mut v = vec![0; whole / GRAD_BYTES];
    read_be_i32s(&mut v, &bytes[..whole]);
    v
}

/// The Ethernet address IPv4 multicast group `addr` maps to (RFC 1112: `01:00:5e` and
/// the low 23 bits of the group).
pub fn multicast_mac(addr: Ipv4Addr) -> [u8; 6] {
    let o = addr.octets();
    [0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]
}

/// A MAC address as the 48-bit integer [`Ether`] reads and writes.
pub fn mac_u64(mac: [u8; 6]) -> u64 {
    mac.iter().fold(0, |acc, &b| acc << 8 | u64::from(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trio_ml_hdr_layout_is_figure_8() {
        assert_eq!(TrioMlHdr::<&[u8]>::LEN, TRIO_ML_HDR_LEN);
        let f = TrioMlHdrFields {
            job_id: 0x12,
            block_id: 0x3456_789A,
            age_op: 0xB,
            final_block: true,
            degraded: true,
            src_id: 0xCD,
            src_cnt: 0x05,
            gen_id: 0xBEEF,
            grad_cnt: 0xABC,
            ctl: true,
            run_id: 0x5,
        };
        let mut buf = [0xFFu8; 12];
        f.write(&mut TrioMlHdr::new_checked(&mut buf[..]).unwrap());
        // byte 5: age_op 1011 | final 1 | degraded 1 | ctl 1 | pad 0 = 0xBE;
        // bytes 10-11: run_id 0101 | grad_cnt 1010 1011 1100.
        assert_eq!(
            buf,
            [0x12, 0x34, 0x56, 0x78, 0x9A, 0xBE, 0xCD, 0x05, 0xBE, 0xEF, 0x5A, 0xBC]
        );
        let back = TrioMlHdrFields::read(&TrioMlHdr::new_checked(&buf[..]).unwrap());
        assert_eq!(back, f);
        // The paper's header alone: both extensions read as zero.
        buf[5] &= !0x02;
        buf[10] &= 0x0F;
        let paper = TrioMlHdrFields::read(&TrioMlHdr::new_checked(&buf[..]).unwrap());
        assert_eq!((paper.ctl, paper.run_id), (false, 0));
    }

    #[test]
    fn control_messages_round_trip_through_the_header() {
        for c in [
            Control::Join { nonce: 0xDEAD_BEEF },
            Control::Joined {
                run_id: 7,
                nonce: 0x0102_0304,
            },
            Control::Superseded { run_id: 15 },
        ] {
            let h = c.header(3, 9);
            assert_eq!((h.job_id, h.src_id, h.grad_cnt), (3, 9, 0));
            assert_eq!(Control::of(&h), Some(c));
        }
        let data = TrioMlHdrFields::default();
        assert_eq!(Control::of(&data), None);
        let unknown = TrioMlHdrFields {
            ctl: true,
            age_op: 9,
            ..data
        };
        assert_eq!(Control::of(&unknown), None);
    }

    #[test]
    fn gone_round_trips_through_the_header_and_is_no_run_control() {
        let g = Gone {
            block_id: 0x0A0B_0C0D,
            gen_id: 0xFFFE,
            run_id: 6,
        };
        let h = g.header(3, 9);
        assert_eq!((h.job_id, h.src_id, h.grad_cnt, h.ctl), (3, 9, 0, true));
        let mut buf = [0u8; TRIO_ML_HDR_LEN];
        h.write(&mut TrioMlHdr::new_checked(&mut buf[..]).unwrap());
        let back = TrioMlHdrFields::read(&TrioMlHdr::new_checked(&buf[..]).unwrap());
        assert_eq!(Gone::of(&back), Some(g));
        assert_eq!(Control::of(&back), None);
        for c in [
            Control::Join { nonce: 4 },
            Control::Superseded { run_id: 6 },
        ] {
            assert_eq!(Gone::of(&c.header(3, 9)), None);
        }
        let data = TrioMlHdrFields {
            age_op: CTL_GONE,
            ..TrioMlHdrFields::default()
        };
        assert_eq!(Gone::of(&data), None, "a data packet that aged out");
    }

    /// Every field of the job record set to a distinct value; the bytes written by hand.
    #[test]
    fn job_ctx_layout_is_figure_17() {
        assert_eq!(JobCtx::<&[u8]>::LEN, 58);
        let mut buf = [0u8; 64];
        let mut j = JobCtx::new_checked(&mut buf[..]).unwrap();
        j.set_block_curr_cnt(0x1234);
        j.set_block_cnt_max(0xABC);
        j.set_block_grad_max(0xDEF);
        j.set_block_exp(0x5A);
        j.set_block_total_cnt(0x89AB_CDEF);
        j.set_out_src_addr(0x0A01_0203);
        j.set_out_dst_addr(0xEF01_0203);
        j.set_out_nh_addr(0x8000_0007);
        j.set_src_cnt(0x07);
        j.set_src_mask(0, 0x0102_0304_0506_0708);
        j.set_src_mask(1, 0x1112_1314_1516_1718);
        j.set_src_mask(2, 0x2122_2324_2526_2728);
        j.set_src_mask(3, 0x3132_3334_3536_3738);
        #[rustfmt::skip]
        let expect: [u8; 64] = [
            0x12, 0x34,                         // block_curr_cnt
            0xAB, 0xCD, 0xEF,                   // block_cnt_max, block_grad_max (12 + 12)
            0x5A,                               // block_exp
            0x89, 0xAB, 0xCD, 0xEF,             // block_total_cnt
            0x0A, 0x01, 0x02, 0x03,             // out_src_addr
            0xEF, 0x01, 0x02, 0x03,             // out_dst_addr
            0x80, 0x00, 0x00, 0x07,             // out_nh_addr
            0x00, 0x00, 0x00,                   // 24 unused bits
            0x07,                               // src_cnt
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
            0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
            0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,
            0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38,
            0, 0, 0, 0, 0, 0,                   // the rest of the 64-byte line
        ];
        assert_eq!(buf, expect);
        // Word view (as shared memory stores the line): block_curr_cnt is the top 16 bits
        // of word 0; block_total_cnt straddles words 0 (low 16 bits) and 1 (top 16 bits).
        let w = |i: usize| u64::from_be_bytes(buf[8 * i..8 * i + 8].try_into().unwrap());
        assert_eq!(w(0) >> 48, 0x1234);
        assert_eq!(w(0) & 0xFFFF, 0x89AB);
        assert_eq!(w(1) >> 48, 0xCDEF);
        assert_eq!((w(3) >> 48) & 0xFF, 0x07, "src_cnt is byte 25 = word 3");
    }

    /// Every field of the block record set to a distinct value; the bytes written by hand.
    #[test]
    fn block_ctx_layout_is_figure_18() {
        assert_eq!(BlockCtx::<&[u8]>::LEN, 58);
        let mut buf = [0u8; 64];
        let mut b = BlockCtx::new_checked(&mut buf[..]).unwrap();
        b.set_block_exp(0x0A);
        b.set_block_age(0x0B);
        b.set_block_start_time(0x1122_3344_5566_7788);
        b.set_job_ctx_paddr(0x99AA_BBCC);
        b.set_aggr_paddr(0xDDEE_FF01);
        b.set_grad_cnt(0x123);
        b.set_rcvd_cnt(0x42);
        b.set_rcvd_mask(0, 0x0102_0304_0506_0708);
        b.set_rcvd_mask(1, 0x1112_1314_1516_1718);
        b.set_rcvd_mask(2, 0x2122_2324_2526_2728);
        b.set_rcvd_mask(3, 0x3132_3334_3536_3738);
        #[rustfmt::skip]
        let expect: [u8; 64] = [
            0x0A,                                           // block_exp
            0x0B,                                           // block_age
            0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, // block_start_time
            0x99, 0xAA, 0xBB, 0xCC,                         // job_ctx_paddr
            0xDD, 0xEE, 0xFF, 0x01,                         // aggr_paddr
            0x00, 0x00, 0x01, 0x23,                         // 20 unused bits, grad_cnt
            0x00, 0x00, 0x00,                               // 24 unused bits
            0x42,                                           // rcvd_cnt
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
            0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
            0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28,
            0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37, 0x38,
            0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(buf, expect);
        let w = |i: usize| u64::from_be_bytes(buf[8 * i..8 * i + 8].try_into().unwrap());
        // block_start_time straddles words 0 and 1; aggr_paddr words 1 and 2.
        assert_eq!(w(0) & 0xFFFF_FFFF_FFFF, 0x1122_3344_5566);
        assert_eq!(w(1) >> 48, 0x7788);
        assert_eq!(w(1) & 0xFFFF, 0xDDEE);
        assert_eq!(w(2) >> 48, 0xFF01);
        // rcvd_cnt is byte 25: bits 16..24 of word 3's high 32-bit lane.
        assert_eq!((w(3) >> 32) as u32 >> 16 & 0xFF, 0x42);
        assert_eq!(
            (w(2) >> 16) & 0xFFF,
            0x123,
            "grad_cnt: bits 16..28 of word 2"
        );
    }

    #[test]
    fn source_bits_land_in_the_right_word() {
        let mut buf = [0u8; 64];
        for s in [
            0u8, 1, 15, 16, 47, 48, 62, 63, 64, 100, 127, 128, 191, 192, 254, 255,
        ] {
            buf.fill(0);
            let mut b = BlockCtx::new_checked(&mut buf[..]).unwrap();
            let v = 1u64 << (s % 64);
            b.set_rcvd_mask(usize::from(s / 64), v);
            let (word, bit) = source_bit(s);
            for i in 0..8 {
                let w = u64::from_be_bytes(buf[8 * i..8 * i + 8].try_into().unwrap());
                let want = if i == word { 1u64 << bit } else { 0 };
                assert_eq!(w, want, "source {s}, word {i}");
            }
        }
        assert_eq!(source_bit(0), (4, 48));
        assert_eq!(source_bit(63), (3, 47));
        assert_eq!(source_bit(255), (6, 47));
    }

    #[test]
    fn next_hop_encoding() {
        assert_eq!(nh_addr(Dest::Port(7)), 7);
        assert_eq!(nh_addr(Dest::Group(3)), 0x8000_0003);
        for d in [
            Dest::Port(0),
            Dest::Port(65535),
            Dest::Group(0),
            Dest::Group(9),
        ] {
            assert_eq!(nh_dest(nh_addr(d)), d);
        }
    }

    fn endpoints() -> Endpoints {
        Endpoints {
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_addr: Ipv4Addr::new(10, 0, 0, 1),
            dst_addr: Ipv4Addr::new(10, 0, 0, 254),
            src_port: 40000,
            dst_port: DEFAULT_UDP_PORT,
        }
    }

    #[test]
    fn build_and_parse_round_trip() {
        let grads = [1, -1, i32::MAX, i32::MIN, 0x0102_0304];
        let hdr = TrioMlHdrFields {
            job_id: 3,
            block_id: 77,
            src_id: 2,
            gen_id: 9,
            grad_cnt: grads.len() as u16,
            ..Default::default()
        };
        let f = agg_packet(&AggPacket {
            endpoints: endpoints(),
            hdr,
            gradients: &grads,
        });
        assert_eq!(f.len(), 54 + 20);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        let ip = Ipv4::new_checked_full(&f[14..]).unwrap();
        assert!(ip.verify_checksum());
        assert_eq!(ip.total_len(), 20 + 8 + 12 + 20);
        assert_eq!(ip.ttl(), RESULT_TTL);
        let udp = Udp::new_checked(&f[34..]).unwrap();
        assert_eq!((udp.src_port(), udp.dst_port()), (40000, 12000));
        assert_eq!(udp.len(), 8 + 12 + 20);
        assert_eq!(udp.checksum(), 0);
        assert_eq!(&f[54..58], &[0, 0, 0, 1]);
        assert_eq!(&f[58..62], &[0xFF, 0xFF, 0xFF, 0xFF]);
        let (h, g) = parse(&f).unwrap();
        assert_eq!(h, hdr);
        assert_eq!(gradients(g), grads);
        // Ethernet padding after the datagram is ignored.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 6]);
        assert_eq!(parse(&padded).unwrap().0, hdr);
    }

    #[test]
    fn parse_refuses_inconsistent_frames() {
        let grads = [5; 3];
        let mut hdr = TrioMlHdrFields {
            grad_cnt: 3,
            ..Default::default()
        };
        let ok = agg_packet(&AggPacket {
            endpoints: endpoints(),
            hdr,
            gradients: &grads,
        });
        assert!(parse(&ok).is_ok());
        hdr.grad_cnt = 4;
        let bad = agg_packet(&AggPacket {
            endpoints: endpoints(),
            hdr,
            gradients: &grads,
        });
        assert!(matches!(parse(&bad), Err(WireError::Malformed { .. })));
        assert!(matches!(
            parse(&ok[..ok.len() - 1]),
            Err(WireError::Truncated { .. })
        ));
        let mut not_udp = ok.clone();
        not_udp[23] = 6;
        assert!(parse(&not_udp).is_err());
        assert!(parse(&ok[..20]).is_err());
        // A UDP length under the UDP header's 8 bytes, with an IPv4 total length that
        // agrees with it (found by fuzzing: it panicked slicing the payload).
        for udp_len in 0..UDP_LEN as u16 {
            let mut short = ok.clone();
            Udp::new_unchecked(&mut short[UDP_AT..]).set_len(udp_len);
            Ipv4::new_unchecked(&mut short[IPV4_AT..]).set_total_len(IPV4_LEN as u16 + udp_len);
            assert!(
                matches!(parse(&short), Err(WireError::Malformed { .. })),
                "UDP length {udp_len}"
            );
        }
    }

    #[test]
    fn multicast_mac_mapping() {
        assert_eq!(
            multicast_mac(Ipv4Addr::new(239, 129, 2, 3)),
            [0x01, 0x00, 0x5e, 0x01, 0x02, 0x03]
        );
        assert_eq!(mac_u64([1, 2, 3, 4, 5, 6]), 0x0102_0304_0506);
    }
}
