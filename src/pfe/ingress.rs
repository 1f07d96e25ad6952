//! Ingress: validates frames, classifies them into flows and stamps per-flow sequence
//! numbers, which the reorder engine uses to restore each flow's arrival order.
//!
//! Every injecting call ([`Pfe::inject`], [`Pfe::try_inject`], [`Pfe::inject_burst`],
//! [`Pfe::inject_shared`], [`Pfe::offer_burst`], [`Pfe::offer_shared`]) goes through one
//! loop, `Pfe::submit`, which:
//!
//! 1. takes an empty batch from the pool and fills it with up to `batch_size` frames, or
//!    up to `max_batch_size` while a backlog waits in dispatch (`Dispatch::backlogged`),
//!    counting runts, oversize frames and frames a custom classifier panicked on as drops;
//! 2. reserves in-flight room for the batch, as its [`Admit`] says: waiting for it (asleep,
//!    see `room`), all or nothing, or as much as fits (the rest dropped as `rx_full`);
//! 3. under the ingress lock, numbers the batch, stamps each packet with its reorder
//!    context's previous packet (the one the reorder engine releases it after; and, when
//!    tracing, with the context's next sequence number, which names it in the records), and
//!    pushes the batch into dispatch, so that stamping order is dispatch order.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::batch::{packet_id, Batch, FrameAt, Slot};
use super::stats::{DROP_OVERSIZE, DROP_RUNT, DROP_RX_FULL};
use super::Pfe;
use crate::packet::{Packet, Port, MIN_FRAME_BYTES};
use crate::wire::{Ether, Ipv4, ETHERTYPE_IPV4, ETHER_LEN, IPPROTO_TCP, IPPROTO_UDP};

/// A user-supplied flow key function: ingress port and frame in, flow key out.
pub type FlowKeyFn = dyn Fn(Port, &[u8]) -> u64 + Send + Sync;

/// How ingress decides which packets belong to one flow (and so must leave in order).
#[derive(Clone, Default)]
pub enum FlowClassifier {
    /// IPv4 5-tuple (addresses, protocol, and TCP/UDP ports of unfragmented packets);
    /// other IPv4 packets by addresses and protocol; non-IPv4 frames by ingress port.
    #[default]
    FiveTuple,
    /// All packets of one ingress port are one flow.
    IngressPort,
    /// A function of the ingress port and frame returning a flow key.
    Custom(Arc<FlowKeyFn>),
}

impl fmt::Debug for FlowClassifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FlowClassifier::FiveTuple => f.write_str("FiveTuple"),
            FlowClassifier::IngressPort => f.write_str("IngressPort"),
            FlowClassifier::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

#[inline]
fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser: cheap and spreads every input bit over the result.
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl FlowClassifier {
    /// The flow key of a frame.
    pub fn flow_key(&self, port: Port, frame: &[u8]) -> u64 {
        match self {
            FlowClassifier::FiveTuple => five_tuple_key(port, frame),
            FlowClassifier::IngressPort => mix(port as u64 | 1 << 63),
            FlowClassifier::Custom(f) => f(port, frame),
        }
    }
}

fn five_tuple_key(port: Port, frame: &[u8]) -> u64 {
    let port_key = || mix(port as u64 | 1 << 63);
    let Ok(eth) = Ether::new_checked(frame) else {
        return port_key();
    };
    if eth.etype() != ETHERTYPE_IPV4 {
        return port_key();
    }
    let l3 = &frame[ETHER_LEN..];
    let Ok(ip) = Ipv4::new_checked(l3) else {
        return port_key();
    };
    let addrs = (ip.src() as u64) << 32 | ip.dst() as u64;
    let proto = ip.proto();
    let ihl = ip.ihl() as usize * 4;
    let mut ports = 0u64;
    if (proto == IPPROTO_TCP || proto == IPPROTO_UDP)
        && ip.frag_off() == 0
        && !ip.mf()
        && l3.len() >= ihl + 4
    {
        ports = u32::from_be_bytes([l3[ihl], l3[ihl + 1], l3[ihl + 2], l3[ihl + 3]]) as u64;
    }
    // One finaliser, not one per half: the ports and protocol are spread over the word by a
    // multiply by an odd constant (a bijection, run beside the addresses' loads) and
    // folded into the addresses, so two 5-tuples that differ in only the addresses or only
    // the ports and protocol still get different keys; the finaliser then spreads every
    // bit over the low ones that pick the reorder context.
    mix(addrs ^ (ports << 8 | proto as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// What ingress stamps packets from: per reorder context, its last packet and next
/// sequence number, and the batches' numbering; owned by whoever holds the ingress lock.
pub(crate) struct IngressState {
    /// The [`packet_id`] of each reorder context's last packet (0: none yet), the next
    /// packet's [`Slot::pred`].
    pub last: Vec<u64>,
    /// Each reorder context's next sequence number (`Batch::flows`, stamped only when
    /// tracing).
    pub next_seq: Vec<u32>,
    /// The number of the last batch pushed into dispatch (0: none yet).
    pub last_batch: u64,
}

impl IngressState {
    pub fn new(contexts: usize) -> Self {
        IngressState {
            last: vec![0; contexts],
            next_seq: vec![0; contexts],
            last_batch: 0,
        }
    }
}

/// What ingress does with a batch when the engine has no room for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Admit {
    /// Wait for room ([`Pfe::inject_burst`]).
    Wait,
    /// Take nothing of the batch and fail ([`Pfe::try_inject`]).
    AllOrNone,
    /// Take what fits and drop the rest as `rx_full` ([`Pfe::offer_burst`]).
    Offer,
}

/// Why a packet was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum InjectError {
    /// The engine is not running (not started yet, or shut down).
    NotRunning,
}

impl fmt::Display for InjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InjectError::NotRunning => f.write_str("the engine is not running (call start first)"),
        }
    }
}

impl std::error::Error for InjectError {}

/// Why [`Pfe::try_inject`] handed a packet back.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TryInjectError {
    /// The engine is at capacity; try again later.
    Full(Packet),
    /// The engine is not running.
    NotRunning(Packet),
}

impl TryInjectError {
    /// The packet that was not accepted.
    pub fn into_inner(self) -> Packet {
        match self {
            TryInjectError::Full(p) | TryInjectError::NotRunning(p) => p,
        }
    }
}

impl fmt::Display for TryInjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TryInjectError::Full(_) => f.write_str("the engine is at capacity"),
            TryInjectError::NotRunning(_) => f.write_str("the engine is not running"),
        }
    }
}

impl std::error::Error for TryInjectError {}

/// A frame as [`Pfe::inject_burst`] and [`Pfe::offer_burst`] take it, to copy into the
/// engine: its bytes in one slice (`&[u8]`), or in two (`(&[u8], &[u8])`: a header, then
/// the rest), which ingress stores one after the other. The second spares a front end that
/// puts headers before the payloads it received (`pfemu serve` frames UDP datagrams) the
/// copy that would join each into a buffer of its own first: the engine's copy joins them.
///
/// Implemented for those two forms only (the trait is sealed).
pub trait FrameBytes<'f>: sealed::Sealed {
    /// The frame's pieces, in order (the second empty for a single slice).
    #[doc(hidden)]
    fn pieces(self) -> [&'f [u8]; 2];
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for &[u8] {}
    impl Sealed for (&[u8], &[u8]) {}
}

impl<'f> FrameBytes<'f> for &'f [u8] {
    #[inline]
    fn pieces(self) -> [&'f [u8]; 2] {
        [self, &[]]
    }
}

impl<'f> FrameBytes<'f> for (&'f [u8], &'f [u8]) {
    #[inline]
    fn pieces(self) -> [&'f [u8]; 2] {
        [self.0, self.1]
    }
}

/// A frame as ingress takes it: copied into the batch's packet buffer (from one piece or
/// two), or kept by reference.
trait IngressFrame {
    /// The frame's length in bytes.
    fn len(&self) -> usize;
    /// Puts the frame into `batch` (its packet buffer or its shared frames): where it is.
    fn store(self, batch: &mut Batch) -> FrameAt;
    /// The frame's bytes, when they are one slice already.
    fn whole(&self) -> Option<&[u8]>;
}

impl IngressFrame for [&[u8]; 2] {
    #[inline]
    fn len(&self) -> usize {
        self[0].len() + self[1].len()
    }

    #[inline]
    fn store(self, batch: &mut Batch) -> FrameAt {
        let off = batch.frames.len();
        batch.frames.extend_from_slice(self[0]);
        batch.frames.extend_from_slice(self[1]);
        FrameAt::copied(off)
    }

    #[inline]
    fn whole(&self) -> Option<&[u8]> {
        self[1].is_empty().then_some(self[0])
    }
}

impl IngressFrame for Arc<[u8]> {
    #[inline]
    fn len(&self) -> usize {
        (**self).len()
    }

    #[inline]
    fn store(self, batch: &mut Batch) -> FrameAt {
        batch.shared.push(self);
        FrameAt::shared(batch.shared.len() - 1)
    }

    #[inline]
    fn whole(&self) -> Option<&[u8]> {
        Some(self)
    }
}

/// The flow key of `frame`, or `None` when the user's classifier panicked on it: the
/// panic is recorded and the frame is to be dropped (see `contain`).
fn classify(sh: &super::Shared, port: Port, frame: &[u8]) -> Option<u64> {
    match &sh.cfg.classifier {
        FlowClassifier::Custom(f) => {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(port, frame)))
                .map_err(|payload| sh.classifier_panics.record(payload.as_ref()))
                .ok()
        }
        c => Some(c.flow_key(port, frame)),
    }
}

/// Takes back the frame [`IngressFrame::store`] just put into `batch`.
fn unstore(batch: &mut Batch, at: FrameAt) {
    match at.offset() {
        Some(off) => batch.frames.truncate(off as usize),
        None => drop(batch.shared.pop()),
    }
}

impl Pfe {
    /// Injects one frame, waiting while the engine is full.
    pub fn inject(&self, packet: Packet) -> Result<(), InjectError> {
        self.inject_frame(packet.port, &packet.data)
    }

    /// Injects one frame, or hands it back at once if the engine is full or not running.
    pub fn try_inject(&self, packet: Packet) -> Result<(), TryInjectError> {
        if !self.running() {
            return Err(TryInjectError::NotRunning(packet));
        }
        match self.submit(
            std::iter::once((packet.port, (&packet.data[..]).pieces())),
            Admit::AllOrNone,
        ) {
            Ok(_) => Ok(()),
            Err(_) => Err(TryInjectError::Full(packet)),
        }
    }

    /// Injects one frame given as bytes, waiting while the engine is full.
    pub fn inject_frame(&self, port: Port, frame: &[u8]) -> Result<(), InjectError> {
        self.inject_burst(std::iter::once((port, frame)))
            .map(|_| ())
    }

    /// Injects many frames in dispatch batches (the fast path), waiting whenever the engine
    /// is full. Returns how many frames were taken (all of them).
    ///
    /// A frame is a slice, or a header and the rest in two slices ([`FrameBytes`]).
    pub fn inject_burst<'f, I, F>(&self, frames: I) -> Result<u64, InjectError>
    where
        I: IntoIterator<Item = (Port, F)>,
        F: FrameBytes<'f>,
    {
        if !self.running() {
            return Err(InjectError::NotRunning);
        }
        let frames = frames.into_iter().map(|(port, f)| (port, f.pieces()));
        self.submit(frames, Admit::Wait)
            .map_err(|_| InjectError::NotRunning)
    }

    /// [`Pfe::inject_burst`] without the copy: the engine keeps a reference to each frame
    /// and its PPE threads read it in place, as a NIC hands a router buffers it already
    /// filled. For large frames sent many times (a traffic generator's templates, a
    /// benchmark's pre-built traffic) this saves ingress a copy of every byte. The engine
    /// never writes a shared frame: a program that forwards one with a rewritten head gets
    /// it rebuilt in the output arena. Every reference is released by the time the packet
    /// has left, so once [`Pfe::drain`] returns the caller holds the only ones again (and
    /// may change the frames, e.g. with [`Arc::get_mut`]).
    pub fn inject_shared<I>(&self, frames: I) -> Result<u64, InjectError>
    where
        I: IntoIterator<Item = (Port, Arc<[u8]>)>,
    {
        if !self.running() {
            return Err(InjectError::NotRunning);
        }
        self.submit(frames.into_iter(), Admit::Wait)
            .map_err(|_| InjectError::NotRunning)
    }

    /// Offers frames as a link delivers them to a NIC: what the engine has room for is taken,
    /// and the frames that find it full are dropped at once and counted (`rx_full` in
    /// [`Stats::dropped_by_reason`](super::Stats::dropped_by_reason)), as a receive ring overflows. Never waits. Returns how
    /// many frames were accepted (the others were dropped at ingress: runts, oversize
    /// frames, or no room). This is how a paced traffic generator measures loss
    /// (`pfemu linerate`).
    pub fn offer_burst<'f, I, F>(&self, frames: I) -> Result<u64, InjectError>
    where
        I: IntoIterator<Item = (Port, F)>,
        F: FrameBytes<'f>,
    {
        if !self.running() {
            return Err(InjectError::NotRunning);
        }
        let frames = frames.into_iter().map(|(port, f)| (port, f.pieces()));
        self.submit(frames, Admit::Offer)
            .map_err(|_| InjectError::NotRunning)
    }

    /// [`Pfe::offer_burst`] of frames kept by reference, as [`Pfe::inject_shared`] does.
    pub fn offer_shared<I>(&self, frames: I) -> Result<u64, InjectError>
    where
        I: IntoIterator<Item = (Port, Arc<[u8]>)>,
    {
        if !self.running() {
            return Err(InjectError::NotRunning);
        }
        self.submit(frames.into_iter(), Admit::Offer)
            .map_err(|_| InjectError::NotRunning)
    }

    /// Ingress: validates, classifies and stamps frames, fills batches and dispatches them.
    /// `admit` says what happens when the engine is full; see [`Admit`]. Returns the frames
    /// seen (with [`Admit::Offer`], those accepted).
    fn submit<F: IngressFrame>(
        &self,
        frames: impl Iterator<Item = (Port, F)>,
        admit: Admit,
    ) -> Result<u64, ()> {
        // Timed per call, so the batch loop is the same with profiling on or off.
        let _timed = self.shared.ingress_time.call(self.shared.cfg.profile);
        self.submit_batches(frames, admit)
    }

    /// [`Pfe::submit`]'s loop over batches.
    fn submit_batches<F: IngressFrame>(
        &self,
        mut frames: impl Iterator<Item = (Port, F)>,
        admit: Admit,
    ) -> Result<u64, ()> {
        let sh = &*self.shared;
        let mask = (sh.cfg.reorder_contexts - 1) as u64;
        let mut taken = 0u64;
        loop {
            let mut batch = sh
                .pool
                .pop()
                .unwrap_or_else(|| Box::new(Batch::with_capacity(sh.cfg.batch_size)));
            // Bigger batches while a backlog waits (see `PfeBuilder::max_batch_size`).
            let bs = if sh.dispatch.backlogged() {
                sh.cfg.max_batch_size
            } else {
                sh.cfg.batch_size
            };
            let (mut seen, mut runts, mut oversize, mut unclassified) = (0u64, 0u64, 0u64, 0u64);
            for (port, frame) in frames.by_ref() {
                seen += 1;
                let len = frame.len();
                if len < MIN_FRAME_BYTES {
                    runts += 1;
                    continue;
                }
                if len > sh.cfg.max_frame_bytes {
                    oversize += 1;
                    continue;
                }
                let len = len as u32;
                // A frame given in one piece is classified where it is, before the copy:
                // reading the copy, the classifier's first loads would wait for the copy's
                // stores (measured: most of ingress's time in the flow key). One in two
                // pieces is stored first, so that the classifier reads it as one.
                let classified = match frame.whole() {
                    Some(bytes) => {
                        classify(sh, port, bytes).map(|key| (key, frame.store(&mut batch)))
                    }
                    None => {
                        let stored = frame.store(&mut batch);
                        let bytes = Batch::stored(&batch.frames, &batch.shared, stored, len);
                        let key = classify(sh, port, bytes);
                        if key.is_none() {
                            unstore(&mut batch, stored);
                        }
                        key.map(|key| (key, stored))
                    }
                };
                let Some((key, stored)) = classified else {
                    unclassified += 1;
                    continue;
                };
                batch.slots.push(Slot {
                    // The reorder context, until the batch is stamped below.
                    pred: key & mask,
                    at: stored,
                    // Within `max_frame_bytes`, which validation keeps to 16 bits.
                    len: len as u16,
                    port,
                });
                if batch.slots.len() == bs {
                    break;
                }
            }
            let n = batch.slots.len() as u64;
            // A batch left short means the frames ran out.
            let last = (n as usize) < bs;
            let mut no_room = 0u64;
            if n > 0 {
                let granted = match admit {
                    Admit::Wait => self.reserve(n, true).then_some(n),
                    Admit::AllOrNone => self.reserve(n, false).then_some(n),
                    Admit::Offer => Some(self.reserve_up_to(n)),
                };
                let Some(granted) = granted else {
                    batch.clear();
                    let _ = sh.pool.push(batch);
                    return Err(());
                };
                no_room = n - granted;
                batch.slots.truncate(granted as usize);
            }
            let c = &sh.ingress_counts;
            c[0].fetch_add(seen, Ordering::Relaxed);
            for (reason, n) in [
                (DROP_RUNT, runts),
                (DROP_OVERSIZE, oversize),
                (DROP_RX_FULL, no_room),
            ] {
                if n > 0 {
                    c[reason + 1].fetch_add(n, Ordering::Relaxed);
                }
            }
            taken += match admit {
                Admit::Offer => seen - runts - oversize - unclassified - no_room,
                Admit::Wait | Admit::AllOrNone => seen,
            };
            if n == no_room {
                batch.clear();
                let _ = sh.pool.push(batch);
                if last {
                    return Ok(taken);
                }
                continue;
            }
            {
                // Stamp and dispatch under one lock so that, with several injecting
                // threads, sequence order is the order batches enter dispatch.
                let mut ing = sh.ingress.lock();
                if sh.latency.is_some() {
                    batch.ingress_ns = sh.clock.now_ns();
                }
                ing.last_batch += 1;
                batch.seq = ing.last_batch;
                let IngressState { last, next_seq, .. } = &mut *ing;
                // Sequence numbers only name packets in trace records.
                let tracing = sh.trace.is_some();
                for (i, s) in batch.slots.iter_mut().enumerate() {
                    // `pred` held the packet's reorder context until now.
                    let ctx = s.pred as usize;
                    let last = &mut last[ctx];
                    s.pred = *last;
                    *last = packet_id(batch.seq, i);
                    if tracing {
                        let seq = &mut next_seq[ctx];
                        batch.flows.push((ctx as u32, *seq));
                        *seq = seq.wrapping_add(1);
                    }
                }
                sh.dispatch.push(batch);
            }
            if last {
                return Ok(taken);
            }
        }
    }

    /// Reserves in-flight room for `n` packets, waiting for it when `block`.
    ///
    /// A full engine means the PPE threads are the bottleneck, so the waiting injector
    /// sleeps rather than spins or polls (on a small machine either would take the very
    /// cores the PPE threads need), and the PPE threads wake it once a quarter of the
    /// capacity is free ([`RoomWait`]), which keeps dispatch fed while it sleeps.
    fn reserve(&self, n: u64, block: bool) -> bool {
        let cap = self.shared.cfg.capacity as u64;
        let in_flight = &self.shared.in_flight;
        loop {
            let cur = in_flight.load(Ordering::Relaxed);
            if cur + n <= cap {
                if in_flight
                    .compare_exchange_weak(cur, cur + n, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return true;
                }
                continue;
            }
            if !block || !self.running() {
                return false;
            }
            let resume_at = cap - n.max(cap / 4);
            let profile = self.shared.cfg.profile;
            self.shared.ingress_time.waiting(profile, || {
                self.shared.room.wait(in_flight, resume_at, || {
                    self.running().then_some(&self.shared.dispatch)
                })
            });
        }
    }

    /// Takes in-flight room for as many of `n` packets as fit now; returns how many.
    fn reserve_up_to(&self, n: u64) -> u64 {
        let cap = self.shared.cfg.capacity as u64;
        let in_flight = &self.shared.in_flight;
        let mut cur = in_flight.load(Ordering::Relaxed);
        loop {
            let granted = n.min(cap.saturating_sub(cur));
            if granted == 0 {
                return 0;
            }
            match in_flight.compare_exchange_weak(
                cur,
                cur + granted,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return granted,
                Err(now) => cur = now,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// A 64-byte Ethernet/IPv4 frame of the 5-tuple (20-byte header, unfragmented).
    fn frame(src: u32, dst: u32, proto: u8, sport: u16, dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 64];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let ip = &mut f[ETHER_LEN..];
        ip[0] = 0x45;
        ip[2..4].copy_from_slice(&50u16.to_be_bytes());
        ip[8] = 64;
        ip[9] = proto;
        ip[12..16].copy_from_slice(&src.to_be_bytes());
        ip[16..20].copy_from_slice(&dst.to_be_bytes());
        ip[20..22].copy_from_slice(&sport.to_be_bytes());
        ip[22..24].copy_from_slice(&dport.to_be_bytes());
        f
    }

    fn key(f: &[u8]) -> u64 {
        FlowClassifier::FiveTuple.flow_key(0, f)
    }

    #[test]
    fn every_field_of_the_five_tuple_changes_the_key() {
        let base = key(&frame(0x0a00_0001, 0x0a00_0002, IPPROTO_UDP, 1000, 2000));
        for other in [
            frame(0x0a00_0003, 0x0a00_0002, IPPROTO_UDP, 1000, 2000),
            frame(0x0a00_0001, 0x0a00_0003, IPPROTO_UDP, 1000, 2000),
            frame(0x0a00_0001, 0x0a00_0002, IPPROTO_TCP, 1000, 2000),
            frame(0x0a00_0001, 0x0a00_0002, IPPROTO_UDP, 1001, 2000),
            frame(0x0a00_0001, 0x0a00_0002, IPPROTO_UDP, 1000, 2001),
        ] {
            assert_ne!(key(&other), base);
        }
        // The key is the 5-tuple's alone: not the ingress port's, nor the payload's.
        let mut f = frame(0x0a00_0001, 0x0a00_0002, IPPROTO_UDP, 1000, 2000);
        f[40] = 0xff;
        assert_eq!(FlowClassifier::FiveTuple.flow_key(3, &f), base);
        // A fragment's ports are not read: its flow is its addresses and protocol.
        let fragment = |sport| {
            let mut f = frame(0x0a00_0001, 0x0a00_0002, IPPROTO_UDP, sport, 2000);
            f[ETHER_LEN + 6] = 0x20; // more fragments
            key(&f)
        };
        assert_eq!(fragment(1000), fragment(1001));
        // Frames that are not IPv4 are their ingress port's flow.
        let arp = {
            let mut f = frame(0, 0, 0, 0, 0);
            f[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
            f
        };
        let ports = FlowClassifier::IngressPort;
        assert_eq!(
            FlowClassifier::FiveTuple.flow_key(5, &arp),
            ports.flow_key(5, &arp)
        );
        assert_ne!(
            FlowClassifier::FiveTuple.flow_key(5, &arp),
            ports.flow_key(6, &arp)
        );
    }

    /// 1024 flows that differ in one field only, counted up as traffic generators count
    /// them, spread over 4096 reorder contexts (the key's low bits) as random keys would:
    /// about 906 contexts, a few sigma's margin below. A key that left any field's bits
    /// unmixed would put such flows into a handful of contexts.
    #[test]
    fn flows_differing_in_one_field_spread_over_the_reorder_contexts() {
        let mask = 4096 - 1;
        type Flow = fn(u32) -> Vec<u8>;
        let fields: [(&str, Flow); 5] = [
            ("source address", |i| {
                frame(0x0a00_0000 + i, 0x0b00_0001, 17, 1, 2)
            }),
            ("destination address", |i| {
                frame(0x0a00_0001, 0x0b00_0000 + i, 17, 1, 2)
            }),
            ("source port", |i| {
                frame(0x0a00_0001, 0x0b00_0001, 17, i as u16, 2)
            }),
            ("destination port", |i| {
                frame(0x0a00_0001, 0x0b00_0001, 17, 1, i as u16)
            }),
            ("high address bits", |i| {
                frame(i << 20, 0x0b00_0001, 6, 1, 2)
            }),
        ];
        for (field, make) in fields {
            let contexts: HashSet<u64> = (0..1024).map(|i| key(&make(i)) & mask).collect();
            assert!(
                contexts.len() >= 850,
                "1024 flows by {field}: {} contexts of 4096",
                contexts.len()
            );
        }
    }
}
