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

mod batch;
pub mod chassis;
mod contain;
mod dispatch;
pub mod egress;
mod ingress;
mod latency;
#[cfg(all(test, loom))]
mod loom_tests;
mod ppe;
mod reorder;
mod room;
#[cfg(test)]
mod start_tests;
mod stats;
mod timers;

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::{Backoff, CachePadded};
use parking_lot::Mutex;

pub use chassis::{Chassis, ChassisBuilder, ChassisSink};
pub use egress::{ChannelSink, CountingSink, Discard, FnSink, Frames, Sink};
pub use ingress::FlowClassifier;
pub use latency::LatencyStats;
pub use stats::Stats;

use self::batch::{Batch, Slot};
use self::contain::{GuardedClock, PanicLog};
use self::dispatch::Dispatch;
use self::egress::TxCounters;
use self::ingress::IngressState;
use self::latency::LatencyRecorder;
use self::reorder::ReorderStage;
use self::room::RoomWait;
use self::stats::{
    WorkerStats, DROP_CLASSIFIER_PANIC, DROP_OVERSIZE, DROP_RUNT, DROP_RX_FULL, DROP_SINK_PANIC,
    ENGINE_DROP_REASONS,
};
use self::timers::TimerState;
use crate::error::ConfigError;
use crate::mem::{MemConfig, SharedMemory};
use crate::packet::{GroupId, Packet, Port, DEFAULT_HEAD_BYTES, MIN_FRAME_BYTES};
use crate::program::{
    FaultKind, Program, DEFAULT_HEAD_OFFSET, DEFAULT_INSTRUCTION_BUDGET, LOCAL_MEMORY_BYTES,
};
use crate::sync::{self, Parker};
use crate::timer::{Clock, SystemClock, TimerSet, TimerSpec};

/// Most PPE threads an engine may have.
pub const MAX_PPE_THREADS: usize = 4096;
/// Default packets per dispatch batch.
pub const DEFAULT_BATCH_SIZE: usize = 32;
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

/// The settings of an engine, as validated by [`PfeBuilder::build`].
#[derive(Clone, Debug)]
pub struct Config {
    /// PPE worker threads.
    pub ppe_threads: usize,
    /// Pin PPE threads to cores (round robin over the cores this process may use).
    pub pin_threads: bool,
    /// Bytes of each packet handed to a PPE thread as its head.
    pub head_bytes: usize,
    /// Packets per dispatch batch.
    pub batch_size: usize,
    /// Packets in flight at most (queued, being processed, or held for reordering).
    pub capacity: usize,
    /// Per-flow reordering on (true) or release in completion order (false).
    pub reorder: bool,
    /// Reorder contexts flows are folded into (a power of two).
    pub reorder_contexts: usize,
    /// How ingress groups packets into flows.
    pub classifier: FlowClassifier,
    /// Egress ports `0..ports`.
    pub ports: usize,
    /// Instructions a packet may execute before it faults.
    pub instruction_budget: u32,
    /// Largest frame accepted at ingress; longer ones are dropped as `oversize`.
    pub max_frame_bytes: usize,
    /// Periodic timers, each launching a thread at one of the program's timer entries.
    pub timers: Vec<TimerSpec>,
    /// Measure each packet's ingress-to-egress latency ([`Stats::latency`]).
    pub latency: bool,
}

/// Configures a [`Pfe`]. Every setting has a sensible default except the program.
pub struct PfeBuilder {
    program: Option<Program>,
    cfg: Config,
    ppe_threads: Option<usize>,
    /// Ports asked for with [`PfeBuilder::ports`] (else the default, or the sink's).
    ports: Option<usize>,
    groups: Vec<(GroupId, Vec<Port>)>,
    mem_config: MemConfig,
    memory: Option<Arc<SharedMemory>>,
    sink: Arc<dyn Sink>,
    clock: Option<Arc<dyn Clock>>,
}

impl fmt::Debug for PfeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PfeBuilder")
            .field("program", &self.program)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// PPE threads by default: the cores available to this process.
pub fn default_ppe_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl PfeBuilder {
    fn new() -> Self {
        PfeBuilder {
            program: None,
            cfg: Config {
                ppe_threads: 0,
                pin_threads: false,
                head_bytes: DEFAULT_HEAD_BYTES,
                batch_size: DEFAULT_BATCH_SIZE,
                capacity: DEFAULT_CAPACITY,
                reorder: true,
                reorder_contexts: DEFAULT_REORDER_CONTEXTS,
                classifier: FlowClassifier::default(),
                ports: DEFAULT_PORTS,
                instruction_budget: DEFAULT_INSTRUCTION_BUDGET,
                max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
                timers: Vec::new(),
                latency: false,
            },
            ppe_threads: None,
            ports: None,
            groups: Vec::new(),
            mem_config: MemConfig::default(),
            memory: None,
            clock: None,
            sink: Arc::new(Discard),
        }
    }

    /// The program every PPE thread runs (required).
    pub fn program(mut self, program: Program) -> Self {
        self.program = Some(program);
        self
    }

    /// PPE worker threads, 1 to [`MAX_PPE_THREADS`] (default: available cores).
    pub fn ppe_threads(mut self, n: usize) -> Self {
        self.ppe_threads = Some(n);
        self
    }

    /// Pin PPE threads to cores (default off).
    pub fn pin_threads(mut self, on: bool) -> Self {
        self.cfg.pin_threads = on;
        self
    }

    /// Bytes of each packet loaded into local memory as its head (default 192).
    pub fn head_bytes(mut self, n: usize) -> Self {
        self.cfg.head_bytes = n;
        self
    }

    /// Packets per dispatch batch, 1 to 1024 (default 32).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.cfg.batch_size = n;
        self
    }

    /// Packets in flight at most, `batch_size` to [`MAX_CAPACITY`]; a full engine blocks
    /// [`Pfe::inject`] and hands packets back from [`Pfe::try_inject`] (default 16384).
    pub fn capacity(mut self, n: usize) -> Self {
        self.cfg.capacity = n;
        self
    }

    /// Per-flow reordering (default on); off releases packets as threads finish them.
    pub fn reorder(mut self, on: bool) -> Self {
        self.cfg.reorder = on;
        self
    }

    /// Reorder contexts flows are folded into, a power of two (default 4096).
    pub fn reorder_contexts(mut self, n: usize) -> Self {
        self.cfg.reorder_contexts = n;
        self
    }

    /// How ingress groups packets into flows (default: IPv4 5-tuple).
    pub fn classifier(mut self, c: FlowClassifier) -> Self {
        self.cfg.classifier = c;
        self
    }

    /// Egress ports `0..n`, 1 to 4096 (default 64, or fewer when the sink has fewer:
    /// [`Sink::ports`]; more than the sink has is refused).
    pub fn ports(mut self, n: usize) -> Self {
        self.ports = Some(n);
        self
    }

    /// Defines multicast group `id` as the given ports.
    pub fn multicast_group(mut self, id: GroupId, ports: impl Into<Vec<Port>>) -> Self {
        self.groups.push((id, ports.into()));
        self
    }

    /// Instructions a packet may execute before it faults (default 10000).
    pub fn instruction_budget(mut self, n: u32) -> Self {
        self.cfg.instruction_budget = n;
        self
    }

    /// Largest frame accepted at ingress (default 9216).
    pub fn max_frame_bytes(mut self, n: usize) -> Self {
        self.cfg.max_frame_bytes = n;
        self
    }

    /// Sizes of the shared memory the engine creates (ignored with [`PfeBuilder::memory`]).
    pub fn mem_config(mut self, cfg: MemConfig) -> Self {
        self.mem_config = cfg;
        self
    }

    /// Uses an existing shared memory (so a program can be built with addresses allocated
    /// in it before the engine exists).
    pub fn memory(mut self, mem: Arc<SharedMemory>) -> Self {
        self.memory = Some(mem);
        self
    }

    /// Where frames leaving the engine go (default: [`Discard`], still counted).
    pub fn sink(mut self, sink: Arc<dyn Sink>) -> Self {
        self.sink = sink;
        self
    }

    /// Validates the configuration and builds a stopped engine.
    /// Adds periodic timers (e.g. [`TimerSpec::staggered`]). Each launches a microcode
    /// thread at the program's `Entry::Timer(spec.entry)` every period, on whichever PPE
    /// thread is free next, ahead of queued packets.
    pub fn timers(mut self, specs: impl IntoIterator<Item = TimerSpec>) -> Self {
        self.cfg.timers.extend(specs);
        self
    }

    /// Measure every packet's latency from ingress to egress (off by default): the engine
    /// then reads the clock once per batch at each end, and [`Stats::latency`] summarises
    /// the samples (HdrHistograms, one per PPE thread; see [`Pfe::reset_latency`]).
    pub fn latency(mut self, on: bool) -> Self {
        self.cfg.latency = on;
        self
    }

    /// The clock timers, [`crate::program::Thread::now_ns`] and latency stamps read
    /// (default: a [`SystemClock`] started when the engine is built). A
    /// [`crate::timer::ManualClock`] makes timer tests deterministic; see
    /// [`Pfe::settle_timers`].
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Validates the settings and builds the engine (not started yet).
    pub fn build(self) -> Result<Pfe, ConfigError> {
        let PfeBuilder {
            program,
            mut cfg,
            ppe_threads,
            ports,
            groups,
            mem_config,
            memory,
            sink,
            clock,
        } = self;
        let program = program.ok_or_else(|| {
            ConfigError::new("program", "no program installed; call .program(...)")
        })?;
        cfg.ppe_threads = ppe_threads.unwrap_or_else(default_ppe_threads);
        if !(1..=MAX_PPE_THREADS).contains(&cfg.ppe_threads) {
            return Err(ConfigError::new(
                "ppe_threads",
                format!(
                    "{} is out of range; accepted 1..={MAX_PPE_THREADS}",
                    cfg.ppe_threads
                ),
            ));
        }
        let max_head = LOCAL_MEMORY_BYTES - DEFAULT_HEAD_OFFSET;
        if !(MIN_FRAME_BYTES..=max_head).contains(&cfg.head_bytes) {
            return Err(ConfigError::new(
                "head_bytes",
                format!(
                    "{} is out of range; accepted {MIN_FRAME_BYTES}..={max_head} (the head and {DEFAULT_HEAD_OFFSET} \
                     bytes of headroom must fit the {LOCAL_MEMORY_BYTES}-byte local memory)",
                    cfg.head_bytes
                ),
            ));
        }
        if !(1..=1024).contains(&cfg.batch_size) {
            return Err(ConfigError::new(
                "batch_size",
                format!("{} is out of range; accepted 1..=1024", cfg.batch_size),
            ));
        }
        if cfg.capacity < cfg.batch_size || cfg.capacity > MAX_CAPACITY {
            return Err(ConfigError::new(
                "capacity",
                format!(
                    "{} is out of range; accepted batch_size ({})..={MAX_CAPACITY}",
                    cfg.capacity, cfg.batch_size,
                ),
            ));
        }
        if !cfg.reorder_contexts.is_power_of_two() || cfg.reorder_contexts > 1 << 20 {
            return Err(ConfigError::new(
                "reorder_contexts",
                format!(
                    "{} must be a power of two from 1 to {}",
                    cfg.reorder_contexts,
                    1 << 20
                ),
            ));
        }
        cfg.ports = match (ports, sink.ports()) {
            (Some(n), Some(has)) if n > has => {
                return Err(ConfigError::new(
                    "ports",
                    format!("{n} ports asked for, but the sink has only {has} (ports 0..{has})"),
                ))
            }
            (Some(n), _) => n,
            (None, Some(has)) => DEFAULT_PORTS.min(has),
            (None, None) => DEFAULT_PORTS,
        };
        if !(1..=4096).contains(&cfg.ports) {
            return Err(ConfigError::new(
                "ports",
                format!("{} is out of range; accepted 1..=4096", cfg.ports),
            ));
        }
        if cfg.instruction_budget == 0 {
            return Err(ConfigError::new("instruction_budget", "must be at least 1"));
        }
        if !(64..=65_535).contains(&cfg.max_frame_bytes) {
            return Err(ConfigError::new(
                "max_frame_bytes",
                format!(
                    "{} is out of range; accepted 64..=65535",
                    cfg.max_frame_bytes
                ),
            ));
        }
        let mut group_table: Vec<Vec<Port>> = Vec::new();
        for (id, members) in groups {
            if members.is_empty() {
                return Err(ConfigError::new(
                    "multicast_group",
                    format!("group {id} has no ports"),
                ));
            }
            if let Some(p) = members.iter().find(|p| **p as usize >= cfg.ports) {
                return Err(ConfigError::new(
                    "multicast_group",
                    format!(
                        "group {id} names port {p}, but the engine has ports 0..{}",
                        cfg.ports
                    ),
                ));
            }
            let i = id as usize;
            if group_table.len() <= i {
                group_table.resize(i + 1, Vec::new());
            }
            if !group_table[i].is_empty() {
                return Err(ConfigError::new(
                    "multicast_group",
                    format!("group {id} is defined twice"),
                ));
            }
            group_table[i] = members;
        }
        for spec in &cfg.timers {
            if !program.timer_entries().any(|(n, _)| n == spec.entry) {
                return Err(ConfigError::new(
                    "timers",
                    format!(
                        "a timer starts Entry::Timer({}), which program `{}` does not define",
                        spec.entry,
                        program.name()
                    ),
                ));
            }
        }
        let timer_set = TimerSet::new(cfg.timers.iter().copied())?;
        let mem = match memory {
            Some(m) => m,
            None => Arc::new(SharedMemory::new(&mem_config)?),
        };

        let mut drop_reason_names: Vec<String> =
            ENGINE_DROP_REASONS.iter().map(|s| s.to_string()).collect();
        drop_reason_names.extend(FaultKind::ALL.iter().map(|k| k.drop_reason().to_string()));
        drop_reason_names.extend(program.drop_reasons().iter().map(|s| s.to_string()));

        // The launcher thread parks on this while the PPE threads launch timers themselves.
        let launcher_parker = (!timer_set.is_empty()).then(Parker::new);
        let launcher_unparker = launcher_parker.as_ref().map(|p| p.unparker().clone());
        let (dispatch, parkers) = Dispatch::new(
            cfg.ppe_threads,
            default_ppe_threads(),
            cfg.capacity,
            cfg.timers.len(),
            launcher_unparker.clone(),
        );
        let clock_panics = Arc::new(PanicLog::default());
        let max_batches = cfg.capacity.div_ceil(cfg.batch_size) + cfg.ppe_threads + 4;
        let shared = Shared {
            dispatch,
            pool: ArrayQueue::new(max_batches.min(cfg.capacity + 4)),
            in_flight: sync::CachePadded::new(sync::AtomicU64::new(0)),
            room: RoomWait::new(cfg.capacity as u64),
            ingress: Mutex::new(IngressState {
                next_seq: vec![0; cfg.reorder_contexts],
            }),
            ingress_counts: CachePadded::new([
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ]),
            latency: cfg.latency.then(|| LatencyRecorder::new(cfg.ppe_threads)),
            reorder: ReorderStage::new(cfg.reorder_contexts, cfg.ports),
            groups: group_table,
            sink,
            tx: TxCounters::new(cfg.ports),
            worker_stats: (0..cfg.ppe_threads)
                .map(|_| CachePadded::new(Mutex::new(WorkerStats::new(drop_reason_names.len()))))
                .collect(),
            drop_reason_names,
            clock: match clock {
                // A user's clock may panic: contain it (see `contain`).
                Some(c) => Arc::new(GuardedClock::new(c, Arc::clone(&clock_panics))),
                None => Arc::new(SystemClock::new()),
            },
            clock_panics,
            classifier_panics: PanicLog::default(),
            timers: launcher_unparker.map(|u| TimerState::new(timer_set, u)),
            state: AtomicU8::new(STATE_BUILT),
            program,
            mem,
            cfg,
        };
        Ok(Pfe {
            shared: Arc::new(shared),
            parkers: Mutex::new(parkers),
            workers: Mutex::new(Vec::new()),
            launcher_parker: Mutex::new(launcher_parker),
            launcher: Mutex::new(None),
        })
    }
}

const STATE_BUILT: u8 = 0;
const STATE_RUNNING: u8 = 1;
const STATE_STOPPED: u8 = 2;

/// What every PPE thread and the injecting threads share.
pub(crate) struct Shared {
    pub cfg: Config,
    pub program: Program,
    pub mem: Arc<SharedMemory>,
    pub dispatch: Dispatch,
    /// Empty batches for ingress to fill.
    pub pool: ArrayQueue<Box<Batch>>,
    /// Ingress packets accepted and not yet released.
    pub in_flight: sync::CachePadded<sync::AtomicU64>,
    /// Injectors waiting for in-flight room.
    pub room: RoomWait,
    pub ingress: Mutex<IngressState>,
    /// Frames injected, then the ingress drops: runts, oversize frames, receive ring full.
    pub ingress_counts: CachePadded<[AtomicU64; 4]>,
    /// Latency histograms, when measured.
    pub latency: Option<LatencyRecorder>,
    pub reorder: ReorderStage,
    pub groups: Vec<Vec<Port>>,
    pub sink: Arc<dyn Sink>,
    pub tx: TxCounters,
    pub worker_stats: Box<[CachePadded<Mutex<WorkerStats>>]>,
    pub drop_reason_names: Vec<String>,
    /// Where time comes from, for timers and programs.
    pub clock: Arc<dyn Clock>,
    /// Panics of a user's clock, caught by its `GuardedClock`.
    pub clock_panics: Arc<PanicLog>,
    /// Panics of a custom flow classifier, caught at ingress (each drops its frame).
    pub classifier_panics: PanicLog,
    /// Timer bookkeeping (`None` without timers).
    pub timers: Option<TimerState>,
    pub state: AtomicU8,
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

/// Makes one of the engine's threads: [`std::thread::Builder::spawn`], or a test's stand-in.
type SpawnFn<'a> = dyn FnMut(std::thread::Builder, Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>>
    + 'a;

/// Why [`Pfe::start`] failed.
#[derive(Debug)]
pub enum StartError {
    /// The engine was shut down; an engine cannot be restarted.
    Stopped,
    /// The operating system refused a thread (memory for its stack, a limit on threads or
    /// processes). The threads already started were stopped and joined, and the engine is
    /// shut down.
    Spawn {
        /// The thread that could not be spawned (`pfemu-ppe-N` or `pfemu-timers`).
        thread: String,
        /// PPE threads that had started.
        started: usize,
        /// PPE threads the engine is configured with.
        ppe_threads: usize,
        /// The operating system's error.
        reason: std::io::Error,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Stopped => f.write_str("the engine was shut down and cannot be restarted"),
            StartError::Spawn {
                thread,
                started,
                ppe_threads,
                reason,
            } => write!(
                f,
                "cannot spawn thread {thread}: {reason}; {started} of {ppe_threads} PPE threads \
                 had started (stopped again; fewer `ppe_threads`, or more memory or a higher \
                 thread limit, would let it start)"
            ),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Spawn { reason, .. } => Some(reason),
            StartError::Stopped => None,
        }
    }
}

/// A Packet Forwarding Engine. Share it between injecting threads with an `Arc`: every
/// method but [`Pfe::start`] and [`Pfe::shutdown`] takes `&self`.
pub struct Pfe {
    shared: Arc<Shared>,
    parkers: Mutex<Vec<Parker>>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// The timer launcher's parker, until `start` hands it to the launcher thread.
    launcher_parker: Mutex<Option<Parker>>,
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

/// A frame as ingress takes it: copied into the batch's packet buffer, or kept by reference.
trait IngressFrame {
    /// The frame's bytes.
    fn bytes(&self) -> &[u8];
    /// Puts the frame into `batch`: its offset in the packet buffer and its index among the
    /// shared frames ([`Slot::COPIED`] when copied).
    fn store(self, batch: &mut Batch) -> (u32, u32);
}

impl IngressFrame for &[u8] {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn store(self, batch: &mut Batch) -> (u32, u32) {
        let off = batch.frames.len() as u32;
        batch.frames.extend_from_slice(self);
        (off, Slot::COPIED)
    }
}

impl IngressFrame for Arc<[u8]> {
    fn bytes(&self) -> &[u8] {
        self
    }

    fn store(self, batch: &mut Batch) -> (u32, u32) {
        batch.shared.push(self);
        (0, (batch.shared.len() - 1) as u32)
    }
}

impl Pfe {
    /// Starts configuring an engine.
    pub fn builder() -> PfeBuilder {
        PfeBuilder::new()
    }

    /// Spawns the PPE threads. Starting a running engine does nothing; a shut-down engine
    /// cannot be restarted.
    pub fn start(&mut self) -> Result<(), StartError> {
        self.start_with(&mut |builder, body| builder.spawn(body))
    }

    /// [`Pfe::start`] with the threads made by `spawn` (tests inject failures here).
    fn start_with(&mut self, spawn: &mut SpawnFn<'_>) -> Result<(), StartError> {
        match self.shared.state.load(Ordering::Acquire) {
            STATE_RUNNING => return Ok(()),
            STATE_STOPPED => return Err(StartError::Stopped),
            _ => {}
        }
        let cores = if self.shared.cfg.pin_threads {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        let parkers = std::mem::take(&mut *self.parkers.lock());
        let mut workers = self.workers.lock();
        for (me, parker) in parkers.into_iter().enumerate() {
            let shared = Arc::clone(&self.shared);
            let pin = if cores.is_empty() {
                None
            } else {
                Some(cores[me % cores.len()])
            };
            let builder = std::thread::Builder::new()
                .name(format!("pfemu-ppe-{me}"))
                .stack_size(512 * 1024);
            match spawn(builder, Box::new(move || ppe::run(shared, me, parker, pin))) {
                Ok(handle) => workers.push(handle),
                Err(reason) => {
                    drop(workers);
                    return Err(self.abort_start(format!("pfemu-ppe-{me}"), me, reason));
                }
            }
        }
        drop(workers);
        let launcher_parker = self.launcher_parker.lock().take();
        if let Some(parker) = launcher_parker {
            let shared = Arc::clone(&self.shared);
            let builder = std::thread::Builder::new().name("pfemu-timers".into());
            match spawn(builder, Box::new(move || timers::run(shared, parker))) {
                Ok(handle) => *self.launcher.lock() = Some(handle),
                Err(reason) => {
                    let started = self.shared.cfg.ppe_threads;
                    return Err(self.abort_start("pfemu-timers".into(), started, reason));
                }
            }
        }
        self.shared.state.store(STATE_RUNNING, Ordering::Release);
        Ok(())
    }

    /// Stops the threads a failed [`Pfe::start_with`] started (nothing was injected, so
    /// they only wait for work) and shuts the engine down; returns the error to report.
    fn abort_start(
        &mut self,
        thread: String,
        started: usize,
        reason: std::io::Error,
    ) -> StartError {
        self.stop();
        StartError::Spawn {
            thread,
            started,
            ppe_threads: self.shared.cfg.ppe_threads,
            reason,
        }
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
            std::iter::once((packet.port, &packet.data[..])),
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
    pub fn inject_burst<'f, I>(&self, frames: I) -> Result<u64, InjectError>
    where
        I: IntoIterator<Item = (Port, &'f [u8])>,
    {
        if !self.running() {
            return Err(InjectError::NotRunning);
        }
        self.submit(frames.into_iter(), Admit::Wait)
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
    /// [`Stats::dropped_by_reason`]), as a receive ring overflows. Never waits. Returns how
    /// many frames were accepted (the others were dropped at ingress: runts, oversize
    /// frames, or no room). This is how a paced traffic generator measures loss
    /// (`pfemu linerate`).
    pub fn offer_burst<'f, I>(&self, frames: I) -> Result<u64, InjectError>
    where
        I: IntoIterator<Item = (Port, &'f [u8])>,
    {
        if !self.running() {
            return Err(InjectError::NotRunning);
        }
        self.submit(frames.into_iter(), Admit::Offer)
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

    /// Forgets the latency samples taken so far (after a warm-up, between trials), so that
    /// [`Stats::latency`] covers what follows. Does nothing when latency is not measured.
    pub fn reset_latency(&self) {
        if let Some(l) = &self.shared.latency {
            l.reset();
        }
    }

    /// Ingress: validates, classifies and stamps frames, fills batches and dispatches them.
    /// `admit` says what happens when the engine is full; see [`Admit`]. Returns the frames
    /// seen (with [`Admit::Offer`], those accepted).
    fn submit<F: IngressFrame>(
        &self,
        mut frames: impl Iterator<Item = (Port, F)>,
        admit: Admit,
    ) -> Result<u64, ()> {
        let sh = &*self.shared;
        let bs = sh.cfg.batch_size;
        let mask = (sh.cfg.reorder_contexts - 1) as u64;
        let mut taken = 0u64;
        loop {
            let mut batch = sh
                .pool
                .pop()
                .unwrap_or_else(|| Box::new(Batch::with_capacity(bs)));
            let (mut seen, mut runts, mut oversize, mut unclassified) = (0u64, 0u64, 0u64, 0u64);
            for (port, frame) in frames.by_ref() {
                seen += 1;
                let bytes = frame.bytes();
                if bytes.len() < MIN_FRAME_BYTES {
                    runts += 1;
                    continue;
                }
                if bytes.len() > sh.cfg.max_frame_bytes {
                    oversize += 1;
                    continue;
                }
                let key = match &sh.cfg.classifier {
                    // A user's function may panic: drop the frame (see `contain`).
                    FlowClassifier::Custom(f) => {
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            f(port, bytes)
                        })) {
                            Ok(k) => k,
                            Err(payload) => {
                                sh.classifier_panics.record(payload.as_ref());
                                unclassified += 1;
                                continue;
                            }
                        }
                    }
                    c => c.flow_key(port, bytes),
                };
                let ctx = (key & mask) as u32;
                let len = bytes.len() as u32;
                let (off, shared) = frame.store(&mut batch);
                batch.slots.push(Slot {
                    off,
                    shared,
                    len,
                    port,
                    ctx,
                    seq: 0,
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
            c[DROP_RUNT + 1].fetch_add(runts, Ordering::Relaxed);
            c[DROP_OVERSIZE + 1].fetch_add(oversize, Ordering::Relaxed);
            if no_room > 0 {
                c[DROP_RX_FULL + 1].fetch_add(no_room, Ordering::Relaxed);
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
                for s in batch.slots.iter_mut() {
                    let seq = &mut ing.next_seq[s.ctx as usize];
                    s.seq = *seq;
                    *seq = seq.wrapping_add(1);
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
            self.shared.room.wait(in_flight, resume_at, || {
                self.running().then_some(&self.shared.dispatch)
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

    /// Packets accepted and not yet released.
    pub fn in_flight(&self) -> u64 {
        self.shared.in_flight.load(Ordering::Acquire)
    }

    /// Injecting threads waiting for in-flight room right now ([`Pfe::inject`] and the
    /// other waiting calls, on a full engine).
    pub fn injectors_waiting(&self) -> u64 {
        self.shared.room.waiting()
    }

    /// Waits until nothing is in flight: every accepted packet has been released or
    /// dropped, every timer thread already launched has finished, and every posted XTXN
    /// has been applied. (Timers keep firing: a drained engine with timers is quiet only
    /// until the next launch.)
    pub fn drain(&self) {
        let backoff = Backoff::new();
        let mut watch = self.shared.dispatch.stall_watch();
        while self.in_flight() > 0 {
            if backoff.is_completed() {
                self.shared.dispatch.check_stall(&mut watch);
                std::thread::sleep(Duration::from_micros(50));
            } else {
                backoff.snooze();
            }
        }
        if let Some(t) = &self.shared.timers {
            t.wait_idle(&self.shared);
        }
    }

    /// Waits until every timer launch due at the clock's current reading has been made and
    /// has finished, along with the packets already accepted. With a
    /// [`crate::timer::ManualClock`] this makes timers deterministic:
    ///
    /// ```text
    /// clock.advance(period_ns);   // the launcher wakes up
    /// pfe.settle_timers();        // the launches due by now ran to completion
    /// ```
    ///
    /// Returns at once on an engine without timers or not running.
    pub fn settle_timers(&self) {
        let Some(t) = &self.shared.timers else {
            return;
        };
        let target = self.shared.clock.now_ns();
        while t.launched_before() <= target
            && t.next_due() <= target
            && self.running()
            && self.launcher_alive()
        {
            std::thread::sleep(Duration::from_micros(20));
        }
        self.drain();
    }

    fn launcher_alive(&self) -> bool {
        self.launcher
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> Stats {
        let sh = &*self.shared;
        let mut total = WorkerStats::new(sh.drop_reason_names.len());
        let mut per_ppe = Vec::with_capacity(sh.worker_stats.len());
        for w in sh.worker_stats.iter() {
            let w = w.lock();
            per_ppe.push(w.packets);
            total.add(&w);
        }
        let c = &sh.ingress_counts;
        total.drops[DROP_RUNT] += c[DROP_RUNT + 1].load(Ordering::Relaxed);
        total.drops[DROP_OVERSIZE] += c[DROP_OVERSIZE + 1].load(Ordering::Relaxed);
        total.drops[DROP_RX_FULL] += c[DROP_RX_FULL + 1].load(Ordering::Relaxed);
        total.drops[DROP_CLASSIFIER_PANIC] += sh.classifier_panics.count();
        // Packets a panicking sink lost left the PPE threads as forwarded or multicast.
        let (lost_fwd, lost_mc) = sh.tx.lost();
        total.forwarded -= lost_fwd.min(total.forwarded);
        total.multicast -= lost_mc.min(total.multicast);
        total.drops[DROP_SINK_PANIC] += lost_fwd + lost_mc;
        let mut s = Stats {
            packets_in: c[0].load(Ordering::Relaxed),
            packets_out: total.forwarded + total.multicast,
            multicast: total.multicast,
            consumed: total.consumed,
            dropped: total.drops.iter().sum(),
            in_flight: sh.in_flight.load(Ordering::Acquire),
            created: total.created,
            created_invalid: total.created_invalid,
            instructions: total.instructions,
            reorder_held: if sh.cfg.reorder {
                sh.reorder.held_total()
            } else {
                0
            },
            per_ppe_packets: per_ppe,
            timer_runs: total.timer_runs,
            timer_instructions: total.timer_instructions,
            timer_faults: total.timer_faults,
            latency: sh.latency.as_ref().map(|l| LatencyStats::of(&l.snapshot())),
            ..Stats::default()
        };
        for (name, log) in [
            ("sink", &sh.tx.sink_panics),
            ("clock", &*sh.clock_panics),
            ("classifier", &sh.classifier_panics),
        ] {
            if let Some(p) = log.snapshot() {
                s.callback_panics.insert(name.to_string(), p);
            }
        }
        if let Some(t) = &sh.timers {
            let c = t.counts();
            s.timer_launches = c.launches;
            s.timer_overruns = c.overruns;
            s.timer_missed = c.missed;
        }
        for (name, &n) in sh.drop_reason_names.iter().zip(&total.drops) {
            if n > 0 {
                *s.dropped_by_reason.entry(name.clone()).or_default() += n;
            }
        }
        for k in FaultKind::ALL {
            let n = total.faults[k.index()];
            if n > 0 {
                s.faults.insert(k.name().to_string(), n);
            }
        }
        for k in crate::mem::XtxnKind::ALL {
            let n = total.xtxns[k.index()];
            if n > 0 {
                s.xtxns.insert(k.name().to_string(), n);
            }
        }
        for (port, (frames, bytes)) in sh.tx.per_port().into_iter().enumerate() {
            if frames > 0 {
                s.tx_by_port.insert(port as u16, (frames, bytes));
                s.frames_tx += frames;
                s.bytes_tx += bytes;
            }
        }
        s
    }

    /// Drains, stops and joins the PPE threads, and returns the final counters. Nothing
    /// accepted is lost.
    pub fn shutdown(mut self) -> Stats {
        self.stop();
        self.stats()
    }

    fn stop(&mut self) {
        // Timers stop first, so the drain below finishes every launch already made.
        if let Some(t) = &self.shared.timers {
            t.stop();
        }
        if let Some(h) = self.launcher.lock().take() {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
        if self.shared.state.load(Ordering::Acquire) == STATE_RUNNING {
            self.drain();
        }
        self.shared.state.store(STATE_STOPPED, Ordering::Release);
        self.shared.dispatch.close();
        for h in self.workers.lock().drain(..) {
            // A PPE thread catches panics from programs; a panic escaping it is a bug in
            // the engine, and surfacing it beats hiding it.
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    }
}

impl Drop for Pfe {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.stop();
        }
    }
}
