//! The reorder engine: holds each finished packet until every earlier packet of its flow
//! has left, then hands it to egress.
//!
//! Ingress numbers the batches in dispatch order and stamps each packet with a reorder
//! context (its flow key folded to the number of contexts; flows that share a context are
//! ordered together, which is safe) and with that context's previous packet, its
//! *predecessor*, named by batch number and index ([`packet_id`]). A packet may leave once
//! its predecessor has left; by induction, every earlier packet of its context has.
//!
//! PPE threads finish whole batches, in any order. The engine keeps a window of batch
//! numbers from the oldest batch that still has a packet in it: every batch below has been
//! completed and all its packets have left, so a predecessor there has left, which is all
//! the engine needs to know of the packets it has forgotten. Completing a batch, it walks
//! its packets in order: a packet whose predecessor lies below the window, or was released
//! already, leaves now (into the egress queues); any other one waits in its batch, noted
//! in its predecessor's batch as a *waiter*. Releasing a packet wakes its waiter, which may
//! wake its own. A dropped or consumed packet leaves with no output. A batch goes back to
//! the pool once every packet in it has left; the window's front moves past it.
//!
//! So the engine has no table per context (ingress has one, which only ingress touches):
//! the common case costs a comparison per packet on the batch's own cache lines, and
//! nothing is copied to be held, since a waiting packet stays in its batch. Held packets
//! stay counted in flight, so the engine's in-flight capacity bounds them (and the batches
//! holding them). The design and what it replaced: `pfe/README.md`.
//!
//! No PPE thread ever waits for the engine: a finished batch is pushed on a lock-free
//! queue, and whichever thread holds the engine's lock completes every queued batch before
//! letting go (flat combining). A thread that finds the lock taken goes back to its
//! packets; the holder sees its batch, because the holder looks at the queue again after
//! unlocking. So a holder descheduled on a small machine delays releases, never the
//! processing of packets.

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::batch::{packet_id, split_packet_id, Batch, Completion, PREFETCH_RECORDS};
use super::egress::{PortQueues, Sink, TxCounters};
use super::latency::LatencyRecorder;
use super::trace::{emit, TraceConfig, TraceRecord};
use crate::packet::{OutRec, Port};
use crate::sync::{fence, ArrayQueue, AtomicU64, Mutex, Ordering};

/// Where a releasing thread records latency: the recorder, its shard, and the time now.
pub(crate) type LatencySink<'a> = Option<(&'a LatencyRecorder, usize, u64)>;

/// Where traced packets' records go and the clock's reading to time their wait by (`None`:
/// not tracing).
pub(crate) type TraceTo<'a> = Option<(&'a TraceConfig, u64)>;

/// Where released packets go: the port groups, the sink, the transmit counters (and the
/// releasing thread, whose shard of them to add to), and the optional latency and trace
/// records of the releasing thread.
#[derive(Clone, Copy)]
pub(crate) struct Outlet<'a> {
    pub groups: &'a [Vec<Port>],
    pub sink: &'a dyn Sink,
    pub tx: &'a TxCounters,
    pub thread: usize,
    pub latency: LatencySink<'a>,
    pub trace: TraceTo<'a>,
}

#[cfg(test)]
impl<'a> Outlet<'a> {
    /// Thread 0's outlet to `sink`, with no port groups, latency or trace (tests).
    pub fn plain(sink: &'a dyn Sink, tx: &'a TxCounters) -> Self {
        Outlet {
            groups: &[],
            sink,
            tx,
            thread: 0,
            latency: None,
            trace: None,
        }
    }
}

/// The reorder engine and the queue of finished batches waiting for it.
///
/// Only [`ReorderStage::finish`] may take the engine's lock: whoever holds it must complete
/// the queued batches, or a batch whose thread found the lock taken would be stranded.
/// Counters are therefore kept in atomics and read without the lock.
pub(crate) struct ReorderStage {
    engine: Mutex<ReorderEngine>,
    /// Finished batches not yet completed. Bounded, so it allocates nothing once built (an
    /// unbounded queue allocated a block every few dozen batches): every batch in it holds
    /// at least one packet still in flight, so the engine's capacity bounds them.
    finished: ArrayQueue<Box<Batch>>,
    /// Packets that had to wait for an earlier packet of their flow, ever.
    held_total: AtomicU64,
}

impl ReorderStage {
    /// Packets that waited for an earlier packet of their flow, so far.
    pub fn held_total(&self) -> u64 {
        self.held_total.load(Ordering::Relaxed)
    }

    /// The stage of an engine with at most `capacity` packets in flight.
    pub fn new(capacity: usize) -> Self {
        ReorderStage {
            engine: Mutex::new(ReorderEngine::new()),
            finished: ArrayQueue::new(capacity.max(1)),
            held_total: AtomicU64::new(0),
        }
    }

    /// Hands over a finished batch. If the engine is free, completes it and every other
    /// queued batch. `retire` gets each batch all of whose packets have left
    /// (`Some(batch)`, 0), and after each completion how many ingress packets left
    /// (`None`, n): batches first, so that a drain that sees nothing in flight finds every
    /// batch cleared.
    ///
    /// `queues` are the calling thread's egress queues, empty on entry and on return: the
    /// released frames pass through them to the sink under the engine's lock, so release
    /// order is delivery order, while their memory stays in the caller's cache rather than
    /// moving with the lock from thread to thread.
    pub fn finish(
        &self,
        batch: Box<Batch>,
        out: Outlet<'_>,
        queues: &mut PortQueues,
        mut retire: impl FnMut(Option<Box<Batch>>, u64),
    ) {
        // Ingress dispatches no empty batch, and a batch's packets stay in flight until it
        // is completed: so there are never more finished batches than packets in flight.
        if self.finished.push(batch).is_err() {
            unreachable!("more finished batches than the in-flight capacity");
        }
        loop {
            fence(Ordering::SeqCst);
            let Some(mut engine) = self.engine.try_lock() else {
                return;
            };
            while let Some(b) = self.finished.pop() {
                let (released, held) = engine.complete(b, out, queues);
                if held > 0 {
                    self.held_total.fetch_add(held, Ordering::Relaxed);
                }
                for b in engine.retired.drain(..) {
                    retire(Some(b), 0);
                }
                retire(None, released);
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

/// One batch of the window.
struct Pending {
    /// The completed batch, while some of its packets wait (`None` before it is completed,
    /// and once they have all left).
    batch: Option<Box<Batch>>,
    /// Completed, and every packet of it has left.
    done: bool,
    /// Packets of `batch` still waiting.
    waiting: u32,
    /// Packets of later batches waiting for one of this batch's: (the index here, the
    /// waiting packet's id). A packet has one waiter at most, the next of its context.
    waiters: Vec<(u32, u64)>,
    /// Its place in [`ReorderEngine::touched`] during a completion ([`UNTOUCHED`]: none).
    touched: u32,
}

impl Default for Pending {
    fn default() -> Self {
        Pending {
            batch: None,
            done: false,
            waiting: 0,
            waiters: Vec::new(),
            touched: UNTOUCHED,
        }
    }
}

/// [`Pending::touched`] of a batch the current completion has not released from.
const UNTOUCHED: u32 = u32::MAX;

/// A batch the current completion released packets from: its number, and how many of
/// them left with output (for latency).
struct Touched {
    seq: u64,
    leaving: u64,
}

pub(crate) struct ReorderEngine {
    /// The oldest batch not completed or with a packet still waiting: every batch below it
    /// has been completed and all its packets have left.
    base: u64,
    /// Batches `base..base + window.len()`.
    window: VecDeque<Pending>,
    /// Window entries to reuse (their `waiters` keep their capacity).
    spare: Vec<Pending>,
    /// The batches the current completion released from, in the order of their sources
    /// in the egress flush (the completed batch first).
    touched: Vec<Touched>,
    /// Packets whose waiter to wake, while a release walks its chain.
    wake: Vec<u64>,
    /// Batches all of whose packets left, for [`ReorderStage::finish`] to retire (boxed:
    /// they go back to the pool as they came).
    #[allow(clippy::vec_box)]
    retired: Vec<Box<Batch>>,
    /// The records of traced packets being held, by packet id.
    held_traces: HashMap<u64, TraceRecord>,
    /// Records of traced held packets the current completion released.
    traces_released: Vec<TraceRecord>,
}

impl ReorderEngine {
    pub fn new() -> Self {
        ReorderEngine {
            // Ingress numbers batches from 1.
            base: 1,
            window: VecDeque::new(),
            spare: Vec::new(),
            touched: Vec::new(),
            wake: Vec::new(),
            retired: Vec::new(),
            held_traces: HashMap::new(),
            traces_released: Vec::new(),
        }
    }

    /// Whether packet `index` of batch `seq` (not the batch being completed) has left.
    #[inline]
    fn has_left(&self, seq: u64, index: usize) -> bool {
        if seq < self.base {
            return true;
        }
        let p = &self.window[(seq - self.base) as usize];
        p.done || p.batch.as_ref().is_some_and(|b| b.done[index].released)
    }

    /// Releases what the finished batch allows; returns how many ingress packets left
    /// (its own and earlier ones' they freed) and how many of its packets had to wait.
    /// Batches all of whose packets have left go to `retired`.
    pub fn complete(
        &mut self,
        mut batch: Box<Batch>,
        out: Outlet<'_>,
        queues: &mut PortQueues,
    ) -> (u64, u64) {
        let seq = batch.seq;
        assert!(seq >= self.base, "batch {seq} completed twice");
        let at = (seq - self.base) as usize;
        while self.window.len() <= at {
            self.window.push_back(self.spare.pop().unwrap_or_default());
        }
        debug_assert!(self.window[at].batch.is_none() && !self.window[at].done);
        self.window[at].touched = 0;
        self.touched.push(Touched { seq, leaving: 0 });
        let mut own = 0u64;
        // Packets whose own frame left (forwarded or multicast), of those released.
        let mut own_frames = 0usize;
        // Later batches' packets waiting for this one's, woken once the walk is over.
        let waited_for = !self.window[at].waiters.is_empty();
        // The walk reads the batch through plain slices, whose lengths do not change.
        let done: &mut [Completion] = &mut batch.done;
        let recs: &[OutRec] = &batch.out.recs;
        let base = self.base;
        // A batch whose packets' predecessors have all left (or are among its own), whose
        // records are its packets' own frames and which no packet waits for leaves whole,
        // without the walk below (which would release every packet).
        let whole = batch.whole_after.is_some_and(|after| after < base)
            && !waited_for
            && out.trace.is_none();
        if whole {
            own = done.len() as u64;
            own_frames = recs.len();
            #[cfg(debug_assertions)]
            for (i, c) in done.iter().enumerate() {
                let (pseq, pi) = split_packet_id(c.pred);
                assert!(
                    pseq < base || (pseq == seq && pi < i),
                    "packet {i} of batch {seq} left whole, its predecessor {pseq}:{pi} \
                     not left (window from {base})"
                );
            }
        }
        for i in (0..done.len()).filter(|_| !whole) {
            // Completions were written by whichever thread ran the batch, often on the
            // other core: ask for them a few packets ahead.
            crate::isa::prefetch(done.as_ptr().wrapping_add(i + PREFETCH_RECORDS));
            let c = done[i];
            let (pseq, pi) = split_packet_id(c.pred);
            // Most predecessors are in batches that left whole (or there is none: 0).
            let left = pseq < base
                || if pseq == seq {
                    done[pi].released
                } else {
                    self.has_left(pseq, pi)
                };
            if !left {
                self.wait_for(pseq, pi, packet_id(seq, i));
                continue;
            }
            done[i].released = true;
            own += 1;
            own_frames += usize::from(c.own);
        }
        // Then the released packets' outputs, in batch order: when they are all of the
        // batch's records, each a released packet's own frame (none created, none of a
        // packet that waits: the common case), without a second walk of the packets.
        let leaving = if own_frames == recs.len() {
            queues.push_whole(recs, out.groups);
            recs.len() as u64
        } else {
            queues.push_released(done, recs, out.groups)
        };
        let woken = if waited_for {
            self.wake_released(at, done, out.groups, queues)
        } else {
            0
        };
        self.touched[0].leaving = leaving;
        let waiting = batch.done.len() as u64 - own;
        self.flush(&batch, out, queues);
        if let Some((cfg, now)) = out.trace {
            self.finish_traces(&mut batch, cfg, now);
        }
        // Retire what emptied, then move the window past the batches done with.
        for t in self.touched.drain(1..) {
            let p = &mut self.window[(t.seq - self.base) as usize];
            p.touched = UNTOUCHED;
            if p.waiting == 0 {
                p.done = true;
                self.retired.extend(p.batch.take());
            }
        }
        self.touched.clear();
        let p = &mut self.window[at];
        p.touched = UNTOUCHED;
        p.waiting = waiting as u32;
        if waiting == 0 {
            p.done = true;
            self.retired.push(batch);
        } else {
            p.batch = Some(batch);
        }
        while self.window.front().is_some_and(|p| p.done) {
            let mut p = self.window.pop_front().expect("the front was just seen");
            debug_assert!(p.waiters.is_empty() && p.batch.is_none());
            p.done = false;
            self.spare.push(p);
            self.base += 1;
        }
        (own + woken, waiting)
    }

    /// Notes packet `waiter` as waiting for packet `index` of batch `seq` (in the window).
    #[cold]
    #[inline(never)]
    fn wait_for(&mut self, seq: u64, index: usize, waiter: u64) {
        let p = &mut self.window[(seq - self.base) as usize];
        p.waiters.push((index as u32, waiter));
    }

    /// After the walk of the batch at window place `at`, whose completions are `done`:
    /// releases the packets of later batches that waited for one of its packets the walk
    /// released, and their waiters in turn; returns how many. The others keep waiting (for
    /// a packet of the batch that waits itself). Waking after the walk rather than after
    /// each release changes only the order of packets of different contexts.
    fn wake_released(
        &mut self,
        at: usize,
        done: &[Completion],
        groups: &[Vec<Port>],
        queues: &mut PortQueues,
    ) -> u64 {
        // Taken out while the chains are woken: a chain starts in a later batch and runs
        // through the waiters of later batches only (a waiter is never in an earlier batch
        // than the packet it waits for). The batch's own packets that wait for one of its
        // packets are among those kept: that packet waits too.
        let mut waiters = std::mem::take(&mut self.window[at].waiters);
        let mut woken = 0;
        waiters.retain(|&(index, next)| {
            if !done[index as usize].released {
                return true;
            }
            self.release_waiting(next, groups, queues);
            woken += 1 + self.wake_waiters(next, groups, queues);
            false
        });
        debug_assert!(self.window[at].waiters.is_empty());
        self.window[at].waiters = waiters;
        woken
    }

    /// Releases the packet waiting for packet `id`, the one waiting for that one, and so
    /// on; returns how many. `id` is in a later batch than the one being completed, and a
    /// waiter is never in an earlier batch than the packet it waits for, so the chain never
    /// reaches the batch being completed.
    fn wake_waiters(&mut self, id: u64, groups: &[Vec<Port>], queues: &mut PortQueues) -> u64 {
        let mut woken = 0;
        self.wake.push(id);
        while let Some(id) = self.wake.pop() {
            let (seq, index) = split_packet_id(id);
            let p = &mut self.window[(seq - self.base) as usize];
            let Some(pos) = p.waiters.iter().position(|&(i, _)| i as usize == index) else {
                continue;
            };
            let (_, next) = p.waiters.swap_remove(pos);
            self.release_waiting(next, groups, queues);
            woken += 1;
            self.wake.push(next);
        }
        woken
    }

    /// Releases waiting packet `id` of a completed batch in the window.
    fn release_waiting(&mut self, id: u64, groups: &[Vec<Port>], queues: &mut PortQueues) {
        let (seq, index) = split_packet_id(id);
        let p = &mut self.window[(seq - self.base) as usize];
        if p.touched == UNTOUCHED {
            p.touched = self.touched.len() as u32;
            self.touched.push(Touched { seq, leaving: 0 });
        }
        let src_base = 2 * p.touched;
        p.waiting -= 1;
        let b = p
            .batch
            .as_mut()
            .expect("a waiting packet's batch is completed");
        b.done[index].released = true;
        let c = &b.done[index];
        let left = queues.push_packet(b.outputs(c), c.own, src_base, groups);
        self.touched[p.touched as usize].leaving += u64::from(left);
        if !self.held_traces.is_empty() {
            if let Some(r) = self.held_traces.remove(&id) {
                self.traces_released.push(r);
            }
        }
    }

    /// Hands the queued frames to the sink (the completed batch's, then those of the
    /// earlier batches it released from) and records their latency.
    fn flush(&mut self, batch: &Batch, out: Outlet<'_>, queues: &mut PortQueues) {
        let ReorderEngine {
            base,
            window,
            touched,
            ..
        } = self;
        let earlier = |t: &Touched| {
            window[(t.seq - *base) as usize]
                .batch
                .as_deref()
                .expect("a batch released from is completed")
        };
        // Each batch released from is two sources (its packet buffer, its output arena).
        // Up to a few batches they are listed on the stack: a completion that wakes held
        // packets of earlier batches is common, and should not allocate.
        const ON_STACK: usize = 8;
        let mut stack: [&[u8]; 2 * ON_STACK] = [&[]; 2 * ON_STACK];
        let heap: Vec<&[u8]>;
        let batches = std::iter::once(batch).chain(touched[1..].iter().map(earlier));
        let sources: &[&[u8]] = if touched.len() <= ON_STACK {
            for (pair, b) in stack.chunks_exact_mut(2).zip(batches) {
                pair[0] = &b.frames;
                pair[1] = &b.out.bytes;
            }
            &stack[..2 * touched.len()]
        } else {
            heap = batches
                .flat_map(|b| [&b.frames[..], &b.out.bytes[..]])
                .collect();
            &heap
        };
        queues.flush(sources, out.sink, out.tx, out.thread);
        if let Some((l, shard, now)) = out.latency {
            l.record(
                shard,
                now.saturating_sub(batch.ingress_ns),
                touched[0].leaving,
            );
            for t in touched[1..].iter().filter(|t| t.leaving > 0) {
                l.record(shard, now.saturating_sub(earlier(t).ingress_ns), t.leaving);
            }
        }
    }

    /// Hands on the records of traced packets: the batch's waiting ones wait for their
    /// release, its others left with it, and the waiting ones it released go now.
    #[cold]
    #[inline(never)]
    fn finish_traces(&mut self, batch: &mut Batch, cfg: &TraceConfig, now: u64) {
        for (i, r) in batch.traced.drain(..) {
            if batch.done[i as usize].released {
                emit(cfg, r, now, false);
            } else {
                self.held_traces.insert(packet_id(batch.seq, i as usize), r);
            }
        }
        for r in self.traces_released.drain(..) {
            emit(cfg, r, now, true);
        }
    }
}
