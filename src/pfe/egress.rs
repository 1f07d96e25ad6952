//! Egress: per-port output queues and the sinks that receive what leaves the engine.
//!
//! Released packets are copied into their port's queue (multicast packets into every member
//! port's queue); at the end of each released batch every non-empty queue is handed to the
//! sink as one [`Frames`] burst, in order.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender};
use crossbeam_utils::CachePadded;

use super::batch::{Completion, PREFETCH_DATA};
use super::contain::PanicLog;
use crate::packet::{Dest, OutRec, Packet, Port};

/// Where one frame of a burst is: buffer `src` of the burst's sources, `len` bytes at `off`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span {
    pub src: u32,
    pub off: u32,
    pub len: u32,
    /// Whether the frame stands for an ingress packet (set by [`PortQueues::push`]), so a
    /// sink that panics on it drops that packet.
    pub own: Own,
}

impl Span {
    /// A span of no ingress packet's own (until [`PortQueues::push`] says otherwise).
    pub fn new(src: u32, off: u32, len: u32) -> Span {
        Span {
            src,
            off,
            len,
            own: Own::No,
        }
    }
}

/// Which ingress packet, if any, a queued frame stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Own {
    /// A created packet, or a multicast copy past the first.
    No,
    /// A forwarded packet.
    Forwarded,
    /// A multicast packet (its copy to the group's first port).
    Multicast,
}

/// A burst of frames leaving one port, in order. The frames are read where the engine
/// holds them (no copy is made for the sink).
#[derive(Clone, Copy)]
pub struct Frames<'a> {
    sources: &'a [&'a [u8]],
    spans: &'a [Span],
}

impl<'a> Frames<'a> {
    /// Number of frames.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there are no frames.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    #[inline]
    fn resolve(sources: &'a [&'a [u8]], s: &Span) -> &'a [u8] {
        &sources[s.src as usize][s.off as usize..(s.off + s.len) as usize]
    }

    /// Frame `i`.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        self.spans.get(i).map(|s| Self::resolve(self.sources, s))
    }

    /// The frames in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let sources = self.sources;
        self.spans.iter().map(move |s| Self::resolve(sources, s))
    }

    /// Total bytes of the frames.
    pub fn total_bytes(&self) -> u64 {
        self.spans.iter().map(|s| s.len as u64).sum()
    }
}

/// Receives the frames leaving the engine. Called from PPE threads; with reordering on,
/// calls are serialised and each port's frames arrive in flow order.
///
/// A panic in `deliver` is caught: the burst's frames are lost, the ingress packets among
/// them are counted as dropped (`sink_panic`), and the panic is reported in
/// [`crate::pfe::Stats::callback_panics`]; the engine goes on.
pub trait Sink: Send + Sync {
    /// Takes a burst of frames leaving `port`.
    fn deliver(&self, port: Port, frames: Frames<'_>);

    /// The ports `0..n` this sink has, if it has a fixed number: an engine built with it
    /// has no more ports (see [`crate::pfe::PfeBuilder::ports`]), so a packet sent to
    /// another port is dropped as `no_such_port`. `None` (the default): any port.
    fn ports(&self) -> Option<usize> {
        None
    }
}

/// Throws frames away (they are still counted in the engine's egress stats).
#[derive(Debug, Default, Clone, Copy)]
pub struct Discard;

impl Sink for Discard {
    fn deliver(&self, _port: Port, _frames: Frames<'_>) {}
}

/// Counts packets and bytes per port; the sink for benchmarks.
#[derive(Debug)]
pub struct CountingSink {
    ports: Box<[CachePadded<[AtomicU64; 2]>]>,
}

impl CountingSink {
    /// A counter for ports `0..ports` (at least one). An engine built with it has these
    /// ports only ([`Sink::ports`]): packets sent to others are dropped as `no_such_port`.
    pub fn new(ports: usize) -> Self {
        CountingSink {
            ports: (0..ports.max(1))
                .map(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)]))
                .collect(),
        }
    }

    fn slot(&self, port: Port) -> &[AtomicU64; 2] {
        &self.ports[(port as usize).min(self.ports.len() - 1)]
    }

    /// Packets seen on `port`.
    pub fn packets(&self, port: Port) -> u64 {
        self.slot(port)[0].load(Ordering::Relaxed)
    }

    /// Bytes seen on `port`.
    pub fn bytes(&self, port: Port) -> u64 {
        self.slot(port)[1].load(Ordering::Relaxed)
    }

    /// Packets over all ports.
    pub fn total_packets(&self) -> u64 {
        self.ports
            .iter()
            .map(|p| p[0].load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes over all ports.
    pub fn total_bytes(&self) -> u64 {
        self.ports
            .iter()
            .map(|p| p[1].load(Ordering::Relaxed))
            .sum()
    }
}

impl Sink for CountingSink {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        let slot = self.slot(port);
        slot[0].fetch_add(frames.len() as u64, Ordering::Relaxed);
        slot[1].fetch_add(frames.total_bytes(), Ordering::Relaxed);
    }

    fn ports(&self) -> Option<usize> {
        Some(self.ports.len())
    }
}

/// Sends every frame as an owned [`Packet`] down a channel (one allocation per frame: for
/// tests and applications, not for line-rate runs).
#[derive(Debug, Clone)]
pub struct ChannelSink {
    tx: Sender<Packet>,
}

impl ChannelSink {
    /// An unbounded channel sink and its receiving end.
    pub fn new() -> (ChannelSink, Receiver<Packet>) {
        let (tx, rx) = crossbeam_channel::unbounded();
        (ChannelSink { tx }, rx)
    }
}

impl Sink for ChannelSink {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        for f in frames.iter() {
            // A dropped receiver means nobody wants the frames any more; that is the
            // receiver's choice, not a loss inside the engine.
            let _ = self.tx.send(Packet {
                port,
                data: f.to_vec(),
            });
        }
    }
}

/// Calls a closure for every frame.
pub struct FnSink<F>(pub F);

impl<F: Fn(Port, &[u8]) + Send + Sync> Sink for FnSink<F> {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        for f in frames.iter() {
            (self.0)(port, f)
        }
    }
}

/// Per-port transmit counters (frames, bytes), published per burst, and what sinks that
/// panicked lost.
///
/// The counters are sharded by releasing PPE thread (modulo [`TX_SHARDS`]): each burst
/// adds to its releasing thread's own cache lines, so the lines do not move between cores
/// with every burst; a reader sums the shards.
pub(crate) struct TxCounters {
    ports: usize,
    shards: usize,
    /// Lines of 4 ports' (frames, bytes) each, `lines_per_shard` per shard.
    lines: Box<[CachePadded<[AtomicU64; 8]>]>,
    lines_per_shard: usize,
    /// Ingress packets lost in a panicking sink: forwarded, multicast.
    lost: [AtomicU64; 2],
    /// The sinks' panics.
    pub sink_panics: PanicLog,
}

/// Shards of [`TxCounters`] at most (releasing threads beyond share them).
pub(crate) const TX_SHARDS: usize = 16;

impl TxCounters {
    /// Counters for `ports` ports, written by up to `threads` releasing threads.
    pub fn new(ports: usize, threads: usize) -> Self {
        let shards = threads.clamp(1, TX_SHARDS);
        let lines_per_shard = ports.div_ceil(4).max(1);
        TxCounters {
            ports,
            shards,
            lines: (0..shards * lines_per_shard)
                .map(|_| CachePadded::new(Default::default()))
                .collect(),
            lines_per_shard,
            lost: [AtomicU64::new(0), AtomicU64::new(0)],
            sink_panics: PanicLog::default(),
        }
    }

    /// Port `port`'s (frames, bytes) counters in thread `thread`'s shard.
    #[inline]
    fn slot(&self, thread: usize, port: usize) -> (&AtomicU64, &AtomicU64) {
        let line = &self.lines[(thread % self.shards) * self.lines_per_shard + port / 4];
        let at = (port % 4) * 2;
        (&line[at], &line[at + 1])
    }

    /// Ingress packets a panicking sink lost: (forwarded, multicast).
    pub fn lost(&self) -> (u64, u64) {
        (
            self.lost[0].load(Ordering::Relaxed),
            self.lost[1].load(Ordering::Relaxed),
        )
    }

    /// (frames, bytes) per port, over every shard.
    pub fn per_port(&self) -> Vec<(u64, u64)> {
        (0..self.ports)
            .map(|port| {
                (0..self.shards).fold((0, 0), |(f, b), t| {
                    let (tf, tb) = self.slot(t, port);
                    (
                        f + tf.load(Ordering::Relaxed),
                        b + tb.load(Ordering::Relaxed),
                    )
                })
            })
            .collect()
    }
}

/// The output queues of every port, owned by whoever releases packets. A queue holds
/// spans into buffers that stay alive until [`PortQueues::flush`].
pub(crate) struct PortQueues {
    queues: Vec<Vec<Span>>,
    dirty: Vec<Port>,
}

impl PortQueues {
    pub fn new(ports: usize) -> Self {
        PortQueues {
            queues: (0..ports).map(|_| Vec::new()).collect(),
            dirty: Vec::new(),
        }
    }

    /// Queues a frame for its destination (already validated against the port and group
    /// tables by the PPE thread); `own` when it is an ingress packet's own frame (not a
    /// created one). Always inlined: it runs once per released frame, and as a call it
    /// cost as much again in register saves as its own work (callgrind).
    #[inline(always)]
    pub fn push(&mut self, dest: Dest, span: Span, own: bool, groups: &[Vec<Port>]) {
        match dest {
            Dest::Port(p) => {
                let own = if own { Own::Forwarded } else { Own::No };
                self.push_port(p, Span { own, ..span })
            }
            Dest::Group(g) => {
                for (i, &p) in groups[g as usize].iter().enumerate() {
                    let own = if own && i == 0 {
                        Own::Multicast
                    } else {
                        Own::No
                    };
                    self.push_port(p, Span { own, ..span });
                }
            }
        }
    }

    /// Queues one ingress packet's output records (its own frame first when `own`: see
    /// [`PortQueues::push`]), whose buffers are the flush's sources from `src_base` on;
    /// returns whether there was any.
    #[inline(always)]
    pub fn push_packet(
        &mut self,
        recs: &[OutRec],
        own: bool,
        src_base: u32,
        groups: &[Vec<Port>],
    ) -> bool {
        for (i, r) in recs.iter().enumerate() {
            let span = Span::new(src_base + r.src, r.off, r.len);
            self.push(r.dest, span, own && i == 0, groups);
        }
        !recs.is_empty()
    }

    /// Queues the output records of a batch when each is the own frame of a released
    /// packet (none created, none of a packet that waits): in order, each as its
    /// packet's own. Records all to one port (the common case) are queued in one copy.
    #[inline]
    pub fn push_whole(&mut self, recs: &[OutRec], groups: &[Vec<Port>]) {
        let Some(first) = recs.first() else {
            return;
        };
        match first.dest {
            Dest::Port(port) if recs.iter().all(|r| r.dest == first.dest) => {
                let q = &mut self.queues[port as usize];
                if q.is_empty() {
                    self.dirty.push(port);
                }
                q.extend(recs.iter().map(|r| Span {
                    src: r.src,
                    off: r.off,
                    len: r.len,
                    own: Own::Forwarded,
                }));
            }
            _ => {
                for r in recs {
                    self.push(r.dest, Span::new(r.src, r.off, r.len), true, groups);
                }
            }
        }
    }

    /// Queues the outputs of a batch's released packets (`done[i].released`), in batch
    /// order, from the batch's own buffers; returns how many of them had any.
    #[inline]
    pub fn push_released(
        &mut self,
        done: &[Completion],
        recs: &[OutRec],
        groups: &[Vec<Port>],
    ) -> u64 {
        let mut leaving = 0;
        for (i, c) in done.iter().enumerate() {
            // The output records were written by whichever thread ran the batch, often on
            // the other core: ask for them a few packets ahead.
            if let Some(ahead) = done.get(i + PREFETCH_DATA) {
                crate::isa::prefetch(recs.as_ptr().wrapping_add(ahead.outs_start as usize));
            }
            if c.released {
                let outputs = &recs[c.outs_start as usize..c.outs_end as usize];
                leaving += u64::from(self.push_packet(outputs, c.own, 0, groups));
            }
        }
        leaving
    }

    #[inline(always)]
    fn push_port(&mut self, port: Port, span: Span) {
        let q = &mut self.queues[port as usize];
        if q.is_empty() {
            self.dirty.push(port);
        }
        q.push(span);
    }

    /// Hands every non-empty queue to the sink, reading spans from `sources`, and empties it;
    /// counts what left in `thread`'s shard of `tx`.
    pub fn flush(&mut self, sources: &[&[u8]], sink: &dyn Sink, tx: &TxCounters, thread: usize) {
        for port in self.dirty.drain(..) {
            let q = &mut self.queues[port as usize];
            let frames = Frames { sources, spans: q };
            // A sink's panic must not kill this thread: that would strand everything in
            // flight (see `pfe::contain`).
            match catch_unwind(AssertUnwindSafe(|| sink.deliver(port, frames))) {
                Ok(()) => {
                    let (f, b) = tx.slot(thread, port as usize);
                    f.fetch_add(frames.len() as u64, Ordering::Relaxed);
                    b.fetch_add(frames.total_bytes(), Ordering::Relaxed);
                }
                Err(payload) => {
                    tx.sink_panics.record(payload.as_ref());
                    for (own, lost) in
                        [(Own::Forwarded, &tx.lost[0]), (Own::Multicast, &tx.lost[1])]
                    {
                        let n = q.iter().filter(|s| s.own == own).count() as u64;
                        lost.fetch_add(n, Ordering::Relaxed);
                    }
                }
            }
            q.clear();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Each releasing thread adds to its own shard (threads past the shards share them);
    /// a reader sees the sum per port, whichever threads released.
    #[test]
    fn transmit_counters_sum_every_shard_per_port() {
        let ports = 6;
        let threads = TX_SHARDS + 3;
        let tx = TxCounters::new(ports, threads);
        let frames: Vec<u8> = vec![0; 100];
        let mut q = PortQueues::new(ports);
        for t in 0..threads {
            for p in 0..ports as Port {
                // Thread t sends t + 1 frames of p + 1 bytes on every port.
                for _ in 0..=t {
                    q.push(Dest::Port(p), Span::new(0, 0, u32::from(p) + 1), false, &[]);
                }
            }
            q.flush(&[&frames], &Discard, &tx, t);
        }
        let sent: u64 = (1..=threads as u64).sum();
        let want: Vec<(u64, u64)> = (0..ports as u64).map(|p| (sent, sent * (p + 1))).collect();
        assert_eq!(tx.per_port(), want);
    }
}
