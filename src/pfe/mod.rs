//! The Packet Forwarding Engine: builder, lifecycle and the path a packet takes.
//!
//! ```text
//! inject ──> ingress ──> dispatch ──> PPE threads ──> reorder ──> egress queues ──> sink
//!           (split,      (batches,    (program to     (per-flow    (per port)
//!            classify,    idle park)   completion)     release)
//!            stamp seq)
//! ```
//!
//! [`Pfe::builder`] configures and validates; [`Pfe::start`] spawns the PPE threads;
//! [`Pfe::inject`] and friends feed frames (blocking, or handing them back when the engine is
//! full); [`Pfe::drain`] waits until nothing is in flight; [`Pfe::shutdown`] drains, stops
//! and joins the threads and returns the final [`Stats`].
//!
//! Where each part lives: `config` (the builder and [`Config::validate`]), `lifecycle`
//! (start, drain, stop), `ingress` (validation, classification, sequence stamps, and the
//! in-flight room), `dispatch` (batches to PPE threads, idle parking), `ppe` (the PPE
//! thread's loop), `reorder`, `egress` (port queues and [`Sink`]s), `stats`, `room` (the
//! injectors' wait for room), `timer_threads` (timer launches), `control` (the handle an
//! operator reads and changes the running engine through), `grace` (what a program's
//! control side unlinked, kept until grace periods end), `latency`, `profile` (where
//! the time goes per stage), `contain` (callbacks that panic) and `chassis` (PFEs joined
//! by links). This file holds what they share: [`Pfe`] itself and `Shared`.

mod batch;
mod chassis;
mod config;
mod contain;
mod control;
mod dispatch;
mod egress;
mod grace;
mod ingress;
mod interconnect;
mod latency;
mod lifecycle;
#[cfg(all(test, loom))]
mod loom_tests;
mod ppe;
mod profile;
mod reorder;
#[cfg(all(test, not(loom)))]
mod reorder_tests;
mod room;
#[cfg(test)]
mod start_tests;
mod stats;
mod timer_threads;
mod trace;

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

pub use chassis::{Chassis, ChassisBuilder, ChassisError, ChassisSink};
pub use config::{default_ppe_threads, Config, PfeBuilder};
pub use control::{Control, ControlError};
pub use egress::{ChannelSink, CountingSink, Discard, FnSink, Frames, Sink};
pub use grace::{GraceTicket, Release, Retired};
pub use ingress::{FlowClassifier, FlowKeyFn, FrameBytes, InjectError, TryInjectError};
pub use interconnect::{ChassisFabric, FabricStats};
pub use latency::LatencyStats;
pub use lifecycle::StartError;
pub use profile::{StageCost, StageProfile};
pub use stats::Stats;
pub use trace::{ChannelTraceSink, TraceConfig, TraceRecord, TraceSelect, TraceSink};

use self::batch::Batch;
use self::contain::PanicLog;
use self::dispatch::Dispatch;
use self::egress::TxCounters;
use self::ingress::IngressState;
use self::latency::LatencyRecorder;
use self::profile::IngressTime;
use self::reorder::ReorderStage;
use self::room::RoomWait;
use self::stats::WorkerStats;
use self::timer_threads::TimerState;
use crate::mem::SharedMemory;
use crate::packet::Port;
use crate::program::Program;
use crate::sync::{self, Parker};
use crate::timer::Clock;

/// Most PPE threads an engine may have.
pub const MAX_PPE_THREADS: usize = 4096;
/// Default packets per dispatch batch.
pub const DEFAULT_BATCH_SIZE: usize = 32;
/// Largest batch, in packets ([`PfeBuilder::batch_size`], [`PfeBuilder::max_batch_size`]).
pub const MAX_BATCH_SIZE: usize = 1024;
/// By default a batch grows under a backlog to this many times
/// [`PfeBuilder::batch_size`] (see [`PfeBuilder::max_batch_size`]).
pub const DEFAULT_BATCH_GROWTH: usize = 8;
/// Largest in-flight capacity, in packets.
pub const MAX_CAPACITY: usize = 1 << 20;
/// Default in-flight capacity, in packets.
pub const DEFAULT_CAPACITY: usize = 16_384;
/// Default number of reorder contexts.
pub const DEFAULT_REORDER_CONTEXTS: usize = 4096;
/// Default number of ports.
pub const DEFAULT_PORTS: usize = 64;
/// Default largest frame accepted at ingress (a jumbo frame).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 9216;

/// [`Shared::state`]: built, not started yet.
const STATE_BUILT: u8 = 0;
/// [`Shared::state`]: the PPE threads run and ingress accepts frames.
const STATE_RUNNING: u8 = 1;
/// [`Shared::state`]: shut down (or a start failed); never leaves this state.
const STATE_STOPPED: u8 = 2;

/// What the PPE threads, the timer launcher and the injecting threads share, behind one
/// `Arc`. Built once by [`PfeBuilder::build`]; every field but the counters and queues is
/// read-only after that. In tokio's terms this is the `Shared` part: what one PPE thread
/// owns alone (local memory, posted XTXNs, its egress queues) lives on that thread's stack
/// (`ppe::run`), and what the embedder holds to reach the threads (parkers, join handles)
/// is in [`Pfe`].
///
/// The packet path reads the fields in this order: ingress (`pool`, `in_flight`, `room`,
/// `ingress`, `ingress_counts`), `dispatch`, the PPE threads (`program`, `mem`, `clock`,
/// `worker_stats`), then `reorder`, `groups`, `sink` and `tx`.
pub(crate) struct Shared {
    /// The validated settings ([`Config::validate`]). Never changes after build.
    pub cfg: Config,
    /// The program every PPE thread runs. Never changes after build.
    pub program: Program,
    /// The shared memory every XTXN goes to; the embedder may hold the same `Arc`.
    pub mem: Arc<SharedMemory>,
    /// Batches of heads and timer launches on their way to the PPE threads, and the parked
    /// threads' wake-ups (the protocol is in `dispatch`). Closed by `stop`, after which no
    /// batch is pushed.
    pub dispatch: Dispatch,
    /// Empty batches for ingress to fill, returned by the PPE threads once released. Only a
    /// cache of allocations: ingress makes a new batch when it is empty, and a batch that
    /// finds it full is dropped.
    pub pool: ArrayQueue<Box<Batch>>,
    /// Ingress packets accepted and not yet released (forwarded, consumed or dropped by a
    /// PPE thread). Never above `cfg.capacity`: ingress reserves room with a
    /// compare-and-swap before a batch enters dispatch, and the PPE threads release it
    /// through `room` once the batch's packets have left.
    pub in_flight: sync::CachePadded<sync::AtomicU64>,
    /// Injectors waiting for in-flight room, and their wake-up by the releasing PPE threads
    /// (the protocol is in `room`).
    pub room: RoomWait,
    /// The next sequence number and the last packet of each reorder context, and the last
    /// batch's number. Whoever holds the lock also pushes the batch it stamped into
    /// `dispatch`, so that sequence order is dispatch order.
    pub ingress: Mutex<IngressState>,
    /// Frames injected (index 0), then the ingress drops by engine drop reason, at index
    /// reason + 1: `runt`, `oversize`, `rx_full`. Only ingress adds to them.
    pub ingress_counts: CachePadded<[AtomicU64; 4]>,
    /// The injecting threads' time per batch and waiting for room (only with
    /// `cfg.profile`; see `profile`).
    pub ingress_time: IngressTime,
    /// Latency histograms, one per PPE thread (`None` unless `cfg.latency`).
    pub latency: Option<LatencyRecorder>,
    /// Holds packets until the earlier packets of their reorder context have left; releases
    /// them in sequence order (bypassed with `cfg.reorder` off).
    pub reorder: ReorderStage,
    /// Multicast groups by id: each defined group has at least one port, every port below
    /// `cfg.ports`; an undefined id is an empty entry (or past the end).
    pub groups: Vec<Vec<Port>>,
    /// Where frames leave the engine. A panic in it is caught and counted (`tx`).
    pub sink: Arc<dyn Sink>,
    /// Frames and bytes handed to the sink per port, and those a panicking sink lost.
    pub tx: TxCounters,
    /// Each PPE thread's counters, published once per batch into its own cache line; only
    /// thread `i` writes slot `i`, a [`Stats`] snapshot reads them all.
    pub worker_stats: Box<[CachePadded<Mutex<WorkerStats>>]>,
    /// Every drop reason, indexed as `WorkerStats::drops`: the engine's
    /// (`stats::ENGINE_DROP_REASONS`), then one per fault kind, then the program's.
    pub drop_reason_names: Vec<String>,
    /// Where time comes from, for timers, programs and latency stamps (a user's clock is
    /// wrapped in a `GuardedClock`, so a panic in it never reaches a PPE thread).
    pub clock: Arc<dyn Clock>,
    /// Panics of a user's clock, caught by its `GuardedClock`.
    pub clock_panics: Arc<PanicLog>,
    /// Panics of a custom flow classifier, caught at ingress (each drops its frame).
    pub classifier_panics: PanicLog,
    /// Timer bookkeeping (`None` without timers).
    pub timers: Option<TimerState>,
    /// The per-packet trace (`None`: off, the default).
    pub trace: Option<Arc<TraceConfig>>,
    /// `STATE_BUILT`, then `STATE_RUNNING`, then `STATE_STOPPED`; it never goes back.
    /// Ingress accepts frames only while running.
    pub state: AtomicU8,
}

/// A Packet Forwarding Engine. Share it between injecting threads with an `Arc`: every
/// method but [`Pfe::start`] and [`Pfe::shutdown`] takes `&self`.
pub struct Pfe {
    /// What the engine's threads share with the embedder's calls.
    shared: Arc<Shared>,
    /// One parker per PPE thread, made by `build` so that dispatch holds their unparkers;
    /// `start` hands each to its thread (empty once started).
    parkers: Mutex<Vec<Parker>>,
    /// The running PPE threads, joined by `stop`.
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// The timer launcher's parker, until `start` hands it to the launcher thread.
    launcher_parker: Mutex<Option<Parker>>,
    /// The timer launcher thread, while it runs (`None` without timers).
    launcher: Mutex<Option<JoinHandle<()>>>,
}

impl fmt::Debug for Pfe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pfe")
            .field("program", &self.shared.program.name())
            .field("config", &self.shared.cfg)
            .finish()
    }
}

impl Pfe {
    /// Starts configuring an engine.
    pub fn builder() -> PfeBuilder {
        PfeBuilder::new()
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// The program the PPE threads run.
    pub fn program(&self) -> &Program {
        &self.shared.program
    }

    /// The shared memory system (read counters, allocate regions, load tables).
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.shared.mem
    }

    fn running(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) == STATE_RUNNING
    }

    /// Packets accepted and not yet released.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Injecting threads waiting for in-flight room right now ([`Pfe::inject`] and the
    /// other waiting calls, on a full engine).
    pub fn injectors_waiting(&self) -> u64 {
        self.shared.room.waiting()
    }

    /// [`Stats::latency`] covers what follows. Does nothing when latency is not measured.
    pub fn reset_latency(&self) {
        if let Some(l) = &self.shared.latency {
            l.reset();
        }
    }
}
