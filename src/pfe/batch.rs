//! Batches: the unit that crosses threads.
//!
//! Ingress copies frames back to back into a batch's packet buffer (or, for frames injected
//! with [`crate::pfe::Pfe::inject_shared`], keeps a reference to them), dispatch hands the
//! whole batch to one PPE thread, the thread writes its output packets into the batch's
//! output arena, and the reorder engine releases them. Batches are recycled through a pool,
//! so the steady state allocates nothing per packet.

use std::sync::Arc;

use crate::packet::{OutArena, OutRec, Port};

/// One ingress packet in a batch: 16 bytes, four to a cache line. The PPE threads read
/// the slots from the injecting core's cache, so what they do not need (the packet's
/// reorder context and trace sequence number) is kept beside them, in [`Batch::flows`],
/// and only when tracing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Slot {
    /// The packet of the same reorder context just before this one, as a [`packet_id`]
    /// (0: none), stamped at ingress: the reorder engine releases this packet once that
    /// one has left. Until ingress stamps the batch, the packet's reorder context (the
    /// flow hash folded to the number of contexts).
    pub pred: u64,
    /// Where the frame is: in the batch's packet buffer or among its shared frames.
    pub at: FrameAt,
    /// Frame length (at most 65 535 bytes: `PfeBuilder::max_frame_bytes`).
    pub len: u16,
    /// Ingress port.
    pub port: Port,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 16);

/// Where ingress stored a frame: its offset in the batch's packet buffer, or its index in
/// the batch's shared frames (the top bit set). A batch's packet buffer holds at most
/// 1024 frames of at most 65 535 bytes, so offsets stay far below the flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameAt(u32);

impl FrameAt {
    const SHARED: u32 = 1 << 31;

    /// A frame copied into the packet buffer at `off`.
    #[inline]
    pub fn copied(off: usize) -> Self {
        debug_assert!(off < Self::SHARED as usize);
        FrameAt(off as u32)
    }

    /// Shared frame number `index`.
    #[inline]
    pub fn shared(index: usize) -> Self {
        debug_assert!(index < Self::SHARED as usize);
        FrameAt(Self::SHARED | index as u32)
    }

    /// The frame's offset in the packet buffer, or `None` for a shared frame.
    #[inline]
    pub fn offset(self) -> Option<u32> {
        (self.0 & Self::SHARED == 0).then_some(self.0)
    }

    /// The frame's index among the shared frames (meaningful when [`FrameAt::offset`] is
    /// `None`).
    #[inline]
    fn shared_index(self) -> usize {
        (self.0 & !Self::SHARED) as usize
    }
}

/// Bits of a [`packet_id`] that hold the packet's index in its batch (batches hold at most
/// 1024 packets).
pub(crate) const PACKET_INDEX_BITS: u32 = 16;

/// The id of packet `index` of the batch with sequence number `batch` (batch numbers start
/// at 1, so 0 is no packet).
#[inline]
pub(crate) fn packet_id(batch: u64, index: usize) -> u64 {
    batch << PACKET_INDEX_BITS | index as u64
}

/// A [`packet_id`]'s batch number and index.
#[inline]
pub(crate) fn split_packet_id(id: u64) -> (u64, usize) {
    (
        id >> PACKET_INDEX_BITS,
        (id & ((1 << PACKET_INDEX_BITS) - 1)) as usize,
    )
}

/// The result of one ingress packet: the output records it produced (its own, then any it
/// created), released together in flow order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Completion {
    /// The packet its release waits for ([`Slot::pred`]).
    pub pred: u64,
    pub outs_start: u32,
    pub outs_end: u32,
    /// The packet left (forwarded or multicast): `outs_start` is its own frame.
    pub own: bool,
    /// The reorder engine has released it (set by the engine).
    pub released: bool,
}

/// How many packets ahead of the one at hand the reorder engine's loops over a batch's
/// completions ask for them, and for the output records they point to: the lines were
/// written on another core (see `src/pfe/README.md`).
pub(crate) const PREFETCH_RECORDS: usize = 4;
/// See [`PREFETCH_RECORDS`].
pub(crate) const PREFETCH_DATA: usize = 2;
/// How many packets ahead of the one it runs a PPE thread asks for a batch's slots (four
/// to a line), and for the frames they point to. Farther than the reorder engine's: a
/// frame's line takes a transfer from the injecting core (85-90 ns), about two packets
/// of the filter's work, and batches are up to 256 packets under load (by default).
pub(crate) const PREFETCH_SLOTS: usize = 16;
/// See [`PREFETCH_SLOTS`].
pub(crate) const PREFETCH_FRAMES: usize = 8;

#[derive(Default, Debug)]
pub(crate) struct Batch {
    /// The packet buffer: ingress frames back to back (heads and tails).
    pub frames: Vec<u8>,
    /// Frames injected by reference, read in place; released with the batch.
    pub shared: Vec<Arc<[u8]>>,
    pub slots: Vec<Slot>,
    pub out: OutArena,
    pub done: Vec<Completion>,
    /// When ingress handed the batch to dispatch (the clock's ns), for latency.
    pub ingress_ns: u64,
    /// The batch's number in dispatch order, from 1 (stamped by ingress with its packets'
    /// [`Slot::pred`]).
    pub seq: u64,
    /// Set by the PPE thread that ran the batch, when every output record is a packet's
    /// own frame: [`Batch::latest_pred_batch`]. Once every batch up to that one has left,
    /// the reorder engine releases this batch whole, without looking at each packet.
    pub whole_after: Option<u64>,
    /// The records of the batch's traced packets, by index in the batch (empty unless
    /// tracing).
    pub traced: Vec<(u32, super::TraceRecord)>,
    /// Each packet's reorder context and its sequence number within it, by index in the
    /// batch, which name it in trace records (stamped by ingress only when tracing; empty
    /// otherwise).
    pub flows: Vec<(u32, u32)>,
}

impl Batch {
    pub fn with_capacity(packets: usize) -> Self {
        Batch {
            frames: Vec::with_capacity(packets * 128),
            shared: Vec::new(),
            slots: Vec::with_capacity(packets),
            out: OutArena::default(),
            done: Vec::with_capacity(packets),
            ingress_ns: 0,
            seq: 0,
            whole_after: None,
            traced: Vec::new(),
            flows: Vec::new(),
        }
    }

    /// The bytes of the frame in `slot`: in the packet buffer `frames`, or one of `shared`
    /// (a batch's two fields, passed apart so the packet buffer can be borrowed mutably
    /// elsewhere).
    #[inline]
    pub fn frame<'b>(frames: &'b [u8], shared: &'b [Arc<[u8]>], slot: &Slot) -> &'b [u8] {
        Batch::stored(frames, shared, slot.at, slot.len.into())
    }

    /// The `len` bytes of the frame ingress stored `at` (what `IngressFrame::store`
    /// returned).
    #[inline]
    pub fn stored<'b>(
        frames: &'b [u8],
        shared: &'b [Arc<[u8]>],
        at: FrameAt,
        len: u32,
    ) -> &'b [u8] {
        match at.offset() {
            Some(off) => &frames[off as usize..(off + len) as usize],
            None => &shared[at.shared_index()],
        }
    }

    /// The latest batch before this one that holds a predecessor of one of its packets (0:
    /// none). Once every batch up to it has left, every packet of this one may leave: its
    /// predecessor is in one of them, or earlier in this batch.
    pub fn latest_pred_batch(&self) -> u64 {
        let seq = self.seq;
        self.slots
            .iter()
            .map(|s| {
                let pseq = s.pred >> PACKET_INDEX_BITS;
                if pseq == seq {
                    0
                } else {
                    pseq
                }
            })
            .max()
            .unwrap_or(0)
    }

    /// The output records of the packet whose completion is `c`.
    #[inline]
    pub fn outputs(&self, c: &Completion) -> &[OutRec] {
        &self.out.recs[c.outs_start as usize..c.outs_end as usize]
    }

    #[inline]
    pub fn clear(&mut self) {
        self.frames.clear();
        self.shared.clear();
        self.slots.clear();
        self.out.clear();
        self.done.clear();
        self.traced.clear();
        self.flows.clear();
        self.whole_after = None;
    }
}
