//! The reorder engine: holds each finished packet until every earlier packet of its flow
//! has been released, then hands it to egress.
//!
//! Ingress stamps each packet with a reorder context (its flow key folded to the number of
//! contexts; flows that share a context are ordered together, which is safe) and the next
//! sequence number of that context. PPE threads finish whole batches; the thread that
//! finishes one takes the engine's lock once for the batch and, for each packet in batch
//! order, releases it if it is next in its context (then any held successors), or holds a
//! copy otherwise. A dropped or consumed packet releases its slot with no output. Held
//! packets stay counted in flight, so the engine's in-flight capacity bounds them.
//!
//! No PPE thread ever waits for the engine: a finished batch is pushed on a lock-free
//! queue, and whichever thread holds the engine's lock completes every queued batch before
//! letting go (flat combining). A thread that finds the lock taken goes back to its
//! packets; the holder sees its batch, because the holder looks at the queue again after
//! unlocking. So a holder descheduled on a small machine delays releases, never the
//! processing of packets.

use hashbrown::HashMap;

use super::batch::Batch;
use super::egress::{PortQueues, Sink, Span, TxCounters};
use super::latency::LatencyRecorder;
use super::trace::{emit, TraceConfig, TraceRecord};
use crate::packet::{Dest, Port, SRC_FRAMES};
use crate::sync::{fence, AtomicU64, Mutex, Ordering, SegQueue};

/// A finished packet waiting for an earlier one of its flow: copies of its outputs, and its
/// batch's ingress stamp (for latency).
#[derive(Default)]
struct Held {
    bytes: Vec<u8>,
    recs: Vec<(Dest, u32, u32)>,
    /// The packet left: `recs[0]` is its own frame.
    own: bool,
    ingress_ns: u64,
}

/// Where a releasing thread records latency: the recorder, its shard, and the time now.
pub(crate) type LatencySink<'a> = Option<(&'a LatencyRecorder, usize, u64)>;

/// Where traced packets' records go and the clock's reading to time their wait by (`None`:
/// not tracing).
pub(crate) type TraceTo<'a> = Option<(&'a TraceConfig, u64)>;

/// Where released packets go: the port groups, the sink, the transmit counters, and the
/// optional latency and trace records of the releasing thread.
#[derive(Clone, Copy)]
pub(crate) struct Outlet<'a> {
    pub groups: &'a [Vec<Port>],
    pub sink: &'a dyn Sink,
    pub tx: &'a TxCounters,
    pub latency: LatencySink<'a>,
    pub trace: TraceTo<'a>,
}

/// The reorder engine and the queue of finished batches waiting for it.
///
/// Only [`ReorderStage::finish`] may take the engine's lock: whoever holds it must complete
/// the queued batches, or a batch whose thread found the lock taken would be stranded.
/// Counters are therefore kept in atomics and read without the lock.
pub(crate) struct ReorderStage {
    engine: Mutex<ReorderEngine>,
    finished: SegQueue<Box<Batch>>,
    /// Packets that had to wait for an earlier packet of their flow, ever.
    held_total: AtomicU64,
}

impl ReorderStage {
    /// Packets that waited for an earlier packet of their flow, so far.
    pub fn held_total(&self) -> u64 {
        self.held_total.load(Ordering::Relaxed)
    }

    pub fn new(contexts: usize, ports: usize) -> Self {
        ReorderStage {
            engine: Mutex::new(ReorderEngine::new(contexts, ports)),
            finished: SegQueue::new(),
            held_total: AtomicU64::new(0),
        }
    }

    /// Hands over a finished batch. If the engine is free, completes it and every other
    /// queued batch; `retire` gets each completed batch and how many ingress packets left.
    pub fn finish(
        &self,
        batch: Box<Batch>,
        out: Outlet<'_>,
        mut retire: impl FnMut(Box<Batch>, u64),
    ) {
        self.finished.push(batch);
        loop {
            fence(Ordering::SeqCst);
            let Some(mut engine) = self.engine.try_lock() else {
                return;
            };
            while let Some(mut b) = self.finished.pop() {
                let (released, held) = engine.complete(&mut b, out);
                if held > 0 {
                    self.held_total.fetch_add(held, Ordering::Relaxed);
                }
                retire(b, released);
            }
            drop(engine);
            // A batch pushed while we held the lock, by a thread whose try_lock failed,
            // is ours to complete.
            fence(Ordering::SeqCst);
            if self.finished.is_empty() {
                return;
            }
        }
    }
}

pub(crate) struct ReorderEngine {
    /// Next sequence number to release, per context.
    next: Vec<u32>,
    held: HashMap<(u32, u32), Held>,
    /// Egress queues live under the same lock so release order is delivery order.
    queues: PortQueues,
    /// Held packets released by the current batch; their bytes stay here until the
    /// queues are flushed, then the buffers are reused.
    releasing: Vec<Held>,
    /// Spare buffers for held packets, reused instead of allocated.
    spare: Vec<Held>,
    /// The records of traced packets being held, by (context, sequence number).
    held_traces: HashMap<(u32, u32), TraceRecord>,
    /// Records of traced held packets the current batch released.
    traces_released: Vec<TraceRecord>,
}

/// Source index of the first released held packet in a flush (after the batch's packet
/// buffer and output arena).
const SRC_HELD_BASE: u32 = 2;

impl ReorderEngine {
    pub fn new(contexts: usize, ports: usize) -> Self {
        ReorderEngine {
            next: vec![0; contexts],
            held: HashMap::new(),
            queues: PortQueues::new(ports),
            releasing: Vec::new(),
            spare: Vec::new(),
            held_traces: HashMap::new(),
            traces_released: Vec::new(),
        }
    }

    /// Releases what the finished batch allows; returns how many ingress packets left and
    /// how many of the batch's packets had to be held.
    pub fn complete(&mut self, batch: &mut Batch, out: Outlet<'_>) -> (u64, u64) {
        let Outlet {
            groups,
            sink,
            tx,
            latency,
            trace,
        } = out;
        let mut released = 0u64;
        let mut held = 0u64;
        // The batch's own packets that leave now (held ones are timed when released).
        let mut leaving = 0u64;
        for c in &batch.done {
            let recs = &batch.out.recs[c.outs_start as usize..c.outs_end as usize];
            let next = &mut self.next[c.ctx as usize];
            if *next != c.seq {
                let mut h = self.spare.pop().unwrap_or_default();
                for r in recs {
                    let src = if r.src == SRC_FRAMES {
                        &batch.frames
                    } else {
                        &batch.out.bytes
                    };
                    let off = h.bytes.len() as u32;
                    h.bytes
                        .extend_from_slice(&src[r.off as usize..(r.off + r.len) as usize]);
                    h.recs.push((r.dest, off, r.len));
                }
                h.own = c.own;
                h.ingress_ns = batch.ingress_ns;
                self.held.insert((c.ctx, c.seq), h);
                held += 1;
                continue;
            }
            *next = next.wrapping_add(1);
            released += 1;
            leaving += u64::from(!recs.is_empty());
            for (i, r) in recs.iter().enumerate() {
                let span = Span::new(r.src, r.off, r.len);
                self.queues.push(r.dest, span, c.own && i == 0, groups);
            }
            if !self.held.is_empty() {
                released += self.release_held(c.ctx, groups);
            }
        }
        let mut sources: Vec<&[u8]> =
            Vec::with_capacity(SRC_HELD_BASE as usize + self.releasing.len());
        sources.push(&batch.frames);
        sources.push(&batch.out.bytes);
        sources.extend(self.releasing.iter().map(|h| &h.bytes[..]));
        self.queues.flush(&sources, sink, tx);
        if let Some((l, shard, now)) = latency {
            l.record(shard, now.saturating_sub(batch.ingress_ns), leaving);
            for h in self.releasing.iter().filter(|h| !h.recs.is_empty()) {
                l.record(shard, now.saturating_sub(h.ingress_ns), 1);
            }
        }
        for mut h in self.releasing.drain(..) {
            if self.spare.len() < 1024 {
                h.bytes.clear();
                h.recs.clear();
                self.spare.push(h);
            }
        }
        if let Some((cfg, now)) = trace {
            self.finish_traces(batch, cfg, now);
        }
        (released, held)
    }

    /// Hands on the records of traced packets: the batch's held ones wait for their
    /// release, its others left with it, and the held ones it released go now.
    #[cold]
    #[inline(never)]
    fn finish_traces(&mut self, batch: &mut Batch, cfg: &TraceConfig, now: u64) {
        for r in batch.traced.drain(..) {
            if self.held.contains_key(&r.flow) {
                self.held_traces.insert(r.flow, r);
            } else {
                emit(cfg, r, now, false);
            }
        }
        for r in self.traces_released.drain(..) {
            emit(cfg, r, now, true);
        }
    }

    /// Releases the held successors of context `ctx` that are now next in line.
    fn release_held(&mut self, ctx: u32, groups: &[Vec<Port>]) -> u64 {
        let mut released = 0;
        loop {
            let seq = self.next[ctx as usize];
            let Some(h) = self.held.remove(&(ctx, seq)) else {
                return released;
            };
            let src = SRC_HELD_BASE + self.releasing.len() as u32;
            for (i, &(dest, off, len)) in h.recs.iter().enumerate() {
                self.queues
                    .push(dest, Span::new(src, off, len), h.own && i == 0, groups);
            }
            self.releasing.push(h);
            if !self.held_traces.is_empty() {
                if let Some(r) = self.held_traces.remove(&(ctx, seq)) {
                    self.traces_released.push(r);
                }
            }
            self.next[ctx as usize] = seq.wrapping_add(1);
            released += 1;
        }
    }
}
