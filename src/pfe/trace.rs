//! The per-packet trace: for the packets an operator chooses, what the program did with
//! each, as bmv2's `--log-console` and event logger show P4 programs.
//!
//! [`PfeBuilder::trace`](super::PfeBuilder::trace) turns it on with a [`TraceConfig`]: which
//! packets (ingress ports, a predicate on the frame such as a flow's addresses, one in
//! every `n` of those, at most `limit` of them) and where the records go (a
//! [`TraceSink`]). For each traced packet a [`TraceRecord`] gives the instructions it ran,
//! by label; each XTXN with its address and the value that came back
//! ([`crate::program::XtxnEvent`]); the verdict; and how long the reorder engine held it
//! for the earlier packets of its flow. [`TraceRecord`]'s `Display` is the text form (one
//! packet per block of lines); with the `serde` feature it serialises to JSON.
//!
//! Off by default, and then free: a PPE thread tests one `Option` per packet and each XTXN
//! one more (a predictable branch: the filter benchmark runs as fast with the trace
//! compiled in and off). Traced packets cost what their records do: a `Vec` of labels and
//! one of XTXNs per packet, and a sink call.
//!
//! Records are handed to the sink when the packet leaves the reorder engine (with
//! reordering off, when its batch is released), on whatever PPE thread releases it: a sink
//! must be quick ([`ChannelTraceSink`] queues them for another thread).

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError};

use crate::packet::Port;
use crate::program::XtxnEvent;

/// Where trace records go: see the module doc.
pub trait TraceSink: Send + Sync {
    /// Takes one packet's record.
    fn record(&self, record: TraceRecord);
}

/// A predicate on a packet (its ingress port and frame): traced when it holds.
pub type TraceSelect = Arc<dyn Fn(Port, &[u8]) -> bool + Send + Sync>;

/// Which packets are traced, and where the records go.
pub struct TraceConfig {
    /// Only packets from these ingress ports (empty: every port).
    pub ports: Vec<Port>,
    /// Only packets this holds for (a flow, say); `None`: every packet. A predicate that
    /// panics traces nothing (and the packet goes on as usual).
    pub select: Option<TraceSelect>,
    /// One in every `one_in` of the packets that pass the filters (1: every one).
    pub one_in: u64,
    /// At most this many records (0: no limit).
    pub limit: u64,
    /// Where the records go.
    pub sink: Arc<dyn TraceSink>,
    /// Packets that passed the filters.
    matched: AtomicU64,
    /// Records made.
    traced: AtomicU64,
}

impl fmt::Debug for TraceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceConfig")
            .field("ports", &self.ports)
            .field("select", &self.select.is_some())
            .field("one_in", &self.one_in)
            .field("limit", &self.limit)
            .field("traced", &self.traced())
            .finish()
    }
}

impl TraceConfig {
    /// Every packet traced, to `sink`; narrow it with the fields.
    pub fn new(sink: Arc<dyn TraceSink>) -> TraceConfig {
        TraceConfig {
            ports: Vec::new(),
            select: None,
            one_in: 1,
            limit: 0,
            sink,
            matched: AtomicU64::new(0),
            traced: AtomicU64::new(0),
        }
    }

    /// Records made so far.
    pub fn traced(&self) -> u64 {
        self.traced.load(Ordering::Relaxed)
    }

    /// Whether the packet from `port` with `frame` is traced (counting it if it is).
    pub(crate) fn wants(&self, port: Port, frame: &[u8]) -> bool {
        if !self.ports.is_empty() && !self.ports.contains(&port) {
            return false;
        }
        if let Some(select) = &self.select {
            if !catch_unwind(AssertUnwindSafe(|| select(port, frame))).unwrap_or(false) {
                return false;
            }
        }
        let n = self.matched.fetch_add(1, Ordering::Relaxed);
        if !n.is_multiple_of(self.one_in.max(1)) {
            return false;
        }
        if self.limit > 0 {
            // Claim a record; give it back if the limit was reached.
            if self.traced.fetch_add(1, Ordering::Relaxed) >= self.limit {
                self.traced.fetch_sub(1, Ordering::Relaxed);
                return false;
            }
            return true;
        }
        self.traced.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// What one traced packet did (module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TraceRecord {
    /// The ingress port.
    pub port: Port,
    /// The frame's length.
    pub len: usize,
    /// The reorder context its flow was folded into, and its sequence number there.
    pub flow: (u32, u32),
    /// The engine's clock when its batch started, ns.
    pub start_ns: u64,
    /// The instructions it ran, by label, in order.
    pub instructions: Vec<String>,
    /// Its XTXNs, in order.
    pub xtxns: Vec<XtxnEvent>,
    /// What became of it: `forward P`, `multicast G`, `consume`, `drop REASON` or
    /// `fault: DETAIL`.
    pub verdict: String,
    /// Whether the reorder engine held it for earlier packets of its flow.
    pub held: bool,
    /// How long it was held, ns (0 when it left with its batch, or with reordering off).
    pub reorder_wait_ns: u64,
    /// Set when the record is complete (the reorder engine's release).
    #[cfg_attr(feature = "serde", serde(skip))]
    pub(crate) finished_ns: u64,
}

impl fmt::Display for TraceRecord {
    /// ```text
    /// packet port 0 len 64 flow 3:17 at 120044 ns
    ///   instr process_ether
    ///   xtxn  read 0x40 -> 0x5
    ///   verdict forward 1
    ///   reorder not held
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "packet port {} len {} flow {}:{} at {} ns",
            self.port, self.len, self.flow.0, self.flow.1, self.start_ns
        )?;
        for i in &self.instructions {
            writeln!(f, "  instr {i}")?;
        }
        for x in &self.xtxns {
            match x.value {
                Some(v) => writeln!(f, "  xtxn  {} {:#x} -> {v:#x}", x.kind, x.addr)?,
                None => writeln!(f, "  xtxn  {} {:#x}", x.kind, x.addr)?,
            }
        }
        writeln!(f, "  verdict {}", self.verdict)?;
        if self.held {
            write!(f, "  reorder held {} ns", self.reorder_wait_ns)
        } else {
            write!(f, "  reorder not held")
        }
    }
}

/// A [`TraceSink`] that queues records on a bounded channel for another thread; a full
/// channel drops the record and counts it ([`ChannelTraceSink::lost`]), so a slow reader
/// never slows the PPE threads.
#[derive(Debug)]
pub struct ChannelTraceSink {
    tx: Sender<TraceRecord>,
    lost: AtomicU64,
}

impl ChannelTraceSink {
    /// A sink holding up to `capacity` records, and its receiving end.
    pub fn new(capacity: usize) -> (ChannelTraceSink, Receiver<TraceRecord>) {
        let (tx, rx) = crossbeam_channel::bounded(capacity.max(1));
        (
            ChannelTraceSink {
                tx,
                lost: AtomicU64::new(0),
            },
            rx,
        )
    }

    /// Records dropped because the channel was full (or its receiver gone).
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

impl TraceSink for ChannelTraceSink {
    fn record(&self, record: TraceRecord) {
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = self.tx.try_send(record)
        {
            self.lost.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Hands a finished record to the sink, with its reorder wait as of `now_ns`.
pub(crate) fn emit(cfg: &TraceConfig, mut r: TraceRecord, now_ns: u64, waited: bool) {
    r.held = waited;
    r.reorder_wait_ns = if waited {
        now_ns.saturating_sub(r.finished_ns)
    } else {
        0
    };
    cfg.sink.record(r);
}
