//! The engine's settings: [`Config`] and its [`Config::validate`], and the [`PfeBuilder`]
//! that gathers them with the program, memory, sink and clock, checks what depends on
//! those, and builds a stopped [`Pfe`] with its [`Shared`] state.

use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicU8};
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;

use super::contain::{GuardedClock, PanicLog};
use super::dispatch::Dispatch;
use super::egress::{Discard, Sink, TxCounters};
use super::ingress::{FlowClassifier, IngressState};
use super::latency::LatencyRecorder;
use super::profile::IngressTime;
use super::reorder::ReorderStage;
use super::room::RoomWait;
use super::stats::{WorkerStats, ENGINE_DROP_REASONS};
use super::timer_threads::TimerState;
use super::{
    Pfe, Shared, DEFAULT_BATCH_GROWTH, DEFAULT_BATCH_SIZE, DEFAULT_CAPACITY,
    DEFAULT_MAX_FRAME_BYTES, DEFAULT_PORTS, DEFAULT_REORDER_CONTEXTS, MAX_BATCH_SIZE, MAX_CAPACITY,
    MAX_PPE_THREADS, STATE_BUILT,
};
use crate::error::ConfigError;
use crate::mem::{MemConfig, SharedMemory};
use crate::packet::{GroupId, Port, DEFAULT_HEAD_BYTES, MIN_FRAME_BYTES};
use crate::program::{
    FaultKind, Program, DEFAULT_HEAD_OFFSET, DEFAULT_INSTRUCTION_BUDGET, LOCAL_MEMORY_BYTES,
};
use crate::sync::{self, Parker};
use crate::timer::{Clock, SystemClock, TimerSet, TimerSpec};

/// The settings of an engine, as validated by [`PfeBuilder::build`].
#[derive(Clone, Debug)]
pub struct Config {
    /// PPE worker threads.
    pub ppe_threads: usize,
    /// Pin PPE threads to cores (round robin over the cores this process may use).
    pub pin_threads: bool,
    /// Bytes of each packet handed to a PPE thread as its head.
    pub head_bytes: usize,
    /// Packets per dispatch batch while the PPE threads keep up.
    pub batch_size: usize,
    /// Packets per dispatch batch at most while a backlog waits for the PPE threads
    /// ([`PfeBuilder::max_batch_size`]).
    pub max_batch_size: usize,
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
    /// Measure each packet's ingress-to-egress latency
    /// ([`Stats::latency`](super::Stats::latency)).
    pub latency: bool,
    /// Measure where the time goes per stage
    /// ([`Stats::profile`](super::Stats::profile)).
    pub profile: bool,
}

impl Config {
    /// Checks every setting that stands on its own, as [`MemConfig::validate`] does; what
    /// depends on the program, the sink or the multicast groups is checked by
    /// [`PfeBuilder::build`], which calls this.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(1..=MAX_PPE_THREADS).contains(&self.ppe_threads) {
            return Err(ConfigError::new(
                "ppe_threads",
                format!(
                    "{} is out of range; accepted 1..={MAX_PPE_THREADS}",
                    self.ppe_threads
                ),
            ));
        }
        let max_head = LOCAL_MEMORY_BYTES - DEFAULT_HEAD_OFFSET;
        if !(MIN_FRAME_BYTES..=max_head).contains(&self.head_bytes) {
            return Err(ConfigError::new(
                "head_bytes",
                format!(
                    "{} is out of range; accepted {MIN_FRAME_BYTES}..={max_head} (the head and \
                     {DEFAULT_HEAD_OFFSET} bytes of headroom must fit the \
                     {LOCAL_MEMORY_BYTES}-byte local memory)",
                    self.head_bytes
                ),
            ));
        }
        if !(1..=MAX_BATCH_SIZE).contains(&self.batch_size) {
            return Err(ConfigError::new(
                "batch_size",
                format!(
                    "{} is out of range; accepted 1..={MAX_BATCH_SIZE}",
                    self.batch_size
                ),
            ));
        }
        if self.capacity < self.batch_size || self.capacity > MAX_CAPACITY {
            return Err(ConfigError::new(
                "capacity",
                format!(
                    "{} is out of range; accepted batch_size ({})..={MAX_CAPACITY}",
                    self.capacity, self.batch_size,
                ),
            ));
        }
        let most = MAX_BATCH_SIZE.min(self.capacity);
        if !(self.batch_size..=most).contains(&self.max_batch_size) {
            return Err(ConfigError::new(
                "max_batch_size",
                format!(
                    "{} is out of range; accepted batch_size ({})..={most} (at most \
                     {MAX_BATCH_SIZE}, and at most the capacity)",
                    self.max_batch_size, self.batch_size,
                ),
            ));
        }
        if !self.reorder_contexts.is_power_of_two() || self.reorder_contexts > 1 << 20 {
            return Err(ConfigError::new(
                "reorder_contexts",
                format!(
                    "{} must be a power of two from 1 to {}",
                    self.reorder_contexts,
                    1 << 20
                ),
            ));
        }
        if !(1..=4096).contains(&self.ports) {
            return Err(ConfigError::new(
                "ports",
                format!("{} is out of range; accepted 1..=4096", self.ports),
            ));
        }
        if self.instruction_budget == 0 {
            return Err(ConfigError::new("instruction_budget", "must be at least 1"));
        }
        // A batch's slot keeps a frame's length in 16 bits.
        if !(64..=usize::from(u16::MAX)).contains(&self.max_frame_bytes) {
            return Err(ConfigError::new(
                "max_frame_bytes",
                format!(
                    "{} is out of range; accepted 64..=65535",
                    self.max_frame_bytes
                ),
            ));
        }
        Ok(())
    }
}

/// Configures a [`Pfe`]. Every setting has a sensible default except the program.
pub struct PfeBuilder {
    program: Option<Program>,
    cfg: Config,
    ppe_threads: Option<usize>,
    /// Asked for with [`PfeBuilder::max_batch_size`] (else derived from the batch size).
    max_batch_size: Option<usize>,
    /// Ports asked for with [`PfeBuilder::ports`] (else the default, or the sink's).
    ports: Option<usize>,
    groups: Vec<(GroupId, Vec<Port>)>,
    mem_config: MemConfig,
    memory: Option<Arc<SharedMemory>>,
    sink: Arc<dyn Sink>,
    clock: Option<Arc<dyn Clock>>,
    trace: Option<super::TraceConfig>,
}

impl fmt::Debug for PfeBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PfeBuilder")
            .field("program", &self.program)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

/// [`PfeBuilder::max_batch_size`] when it is not set: [`DEFAULT_BATCH_GROWTH`] batches,
/// within the capacity and [`MAX_BATCH_SIZE`], never below the batch itself.
fn default_max_batch_size(batch_size: usize, capacity: usize) -> usize {
    (batch_size.saturating_mul(DEFAULT_BATCH_GROWTH))
        .min(MAX_BATCH_SIZE)
        .min(capacity)
        .max(batch_size)
}

/// PPE threads by default: the cores available to this process.
pub fn default_ppe_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

impl PfeBuilder {
    pub(super) fn new() -> Self {
        PfeBuilder {
            program: None,
            // `ppe_threads`, `max_batch_size` and `ports` are settled by `build()`, from the
            // builder's own fields of the same names.
            cfg: Config {
                ppe_threads: 0,
                pin_threads: false,
                head_bytes: DEFAULT_HEAD_BYTES,
                batch_size: DEFAULT_BATCH_SIZE,
                max_batch_size: 0,
                capacity: DEFAULT_CAPACITY,
                reorder: true,
                reorder_contexts: DEFAULT_REORDER_CONTEXTS,
                classifier: FlowClassifier::default(),
                ports: DEFAULT_PORTS,
                instruction_budget: DEFAULT_INSTRUCTION_BUDGET,
                max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
                timers: Vec::new(),
                latency: false,
                profile: false,
            },
            ppe_threads: None,
            max_batch_size: None,
            ports: None,
            groups: Vec::new(),
            mem_config: MemConfig::default(),
            memory: None,
            clock: None,
            trace: None,
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

    /// Packets per dispatch batch while the PPE threads keep up, 1 to [`MAX_BATCH_SIZE`]
    /// (default 32). See [`PfeBuilder::max_batch_size`] for batches under a backlog.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.cfg.batch_size = n;
        self
    }

    /// Packets per dispatch batch at most while a backlog waits for the PPE threads,
    /// `batch_size` to [`MAX_BATCH_SIZE`] and at most the capacity (default:
    /// [`DEFAULT_BATCH_GROWTH`] times `batch_size`, within those bounds).
    ///
    /// Ingress closes a batch at `batch_size` packets while at most one batch waits in
    /// dispatch: the PPE threads keep up, and a packet should not wait for others to fill
    /// its batch. While two or more wait, every running PPE thread has work queued behind
    /// its own, and ingress fills batches up to this size instead: each batch's hand-offs
    /// (dispatch, reorder, retiring) are then shared by more packets, when a bigger batch
    /// delays no packet that would not have waited in the queue anyway. Set it to
    /// `batch_size` for batches of one size.
    pub fn max_batch_size(mut self, n: usize) -> Self {
        self.max_batch_size = Some(n);
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

    /// Adds periodic timers (e.g. [`TimerSpec::staggered`]). Each launches a microcode
    /// thread at the program's `Entry::Timer(spec.entry)` every period, on whichever PPE
    /// thread is free next, ahead of queued packets.
    pub fn timers(mut self, specs: impl IntoIterator<Item = TimerSpec>) -> Self {
        self.cfg.timers.extend(specs);
        self
    }

    /// Measure every packet's latency from ingress to egress (off by default): the engine
    /// then reads the clock once per batch at each end, and [`Stats::latency`](super::Stats::latency) summarises
    /// the samples (HdrHistograms, one per PPE thread; see [`Pfe::reset_latency`]).
    pub fn latency(mut self, on: bool) -> Self {
        self.cfg.latency = on;
        self
    }

    /// Measure where the engine's time goes, stage by stage (off by default): ingress,
    /// dispatch, the program, the reorder engine, the sink, egress and timers, summed over
    /// the threads in [`Stats::profile`](super::Stats::profile). The PPE threads then read
    /// the monotonic clock a few times per batch, and the injecting threads twice per call;
    /// off, the PPE threads run a copy of their loop that reads no clock and tests nothing
    /// for it, and ingress tests the setting once per call. See [`super::StageProfile`].
    pub fn profile(mut self, on: bool) -> Self {
        self.cfg.profile = on;
        self
    }

    /// Traces the packets `trace` selects (off by default): see [`super::TraceConfig`].
    pub fn trace(mut self, trace: super::TraceConfig) -> Self {
        self.trace = Some(trace);
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
            max_batch_size,
            ports,
            groups,
            mem_config,
            memory,
            sink,
            clock,
            trace,
        } = self;
        let program = program.ok_or_else(|| {
            ConfigError::new("program", "no program installed; call .program(...)")
        })?;
        cfg.ppe_threads = ppe_threads.unwrap_or_else(default_ppe_threads);
        cfg.max_batch_size =
            max_batch_size.unwrap_or_else(|| default_max_batch_size(cfg.batch_size, cfg.capacity));
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
        cfg.validate()?;
        let group_table = group_table(groups, cfg.ports)?;
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
            ingress: Mutex::new(IngressState::new(cfg.reorder_contexts)),
            ingress_counts: CachePadded::new([
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            ]),
            ingress_time: IngressTime::default(),
            latency: cfg.latency.then(|| LatencyRecorder::new(cfg.ppe_threads)),
            reorder: ReorderStage::new(cfg.capacity),
            groups: group_table,
            sink,
            tx: TxCounters::new(cfg.ports, cfg.ppe_threads),
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
            trace: trace.map(Arc::new),
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

/// The multicast group table, indexed by group id: every group has ports, all of them below
/// `ports`, and no group is defined twice.
fn group_table(
    groups: Vec<(GroupId, Vec<Port>)>,
    ports: usize,
) -> Result<Vec<Vec<Port>>, ConfigError> {
    let mut group_table: Vec<Vec<Port>> = Vec::new();
    for (id, members) in groups {
        if members.is_empty() {
            return Err(ConfigError::new(
                "multicast_group",
                format!("group {id} has no ports"),
            ));
        }
        if let Some(p) = members.iter().find(|p| **p as usize >= ports) {
            return Err(ConfigError::new(
                "multicast_group",
                format!(
                    "group {id} names port {p}, but the engine has ports 0..{}",
                    ports
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
    Ok(group_table)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{Done, Entry, Verdict};

    fn config() -> Config {
        let mut p = Program::builder("forward");
        let a = p.label("a");
        p.instr(a, |_t| Ok(Done(Verdict::Forward(0))));
        p.entry(Entry::Packet, a);
        let pfe = Pfe::builder()
            .program(p.build().expect("a valid program"))
            .ppe_threads(2)
            .build()
            .expect("build");
        pfe.config().clone()
    }

    #[test]
    fn the_largest_batch_defaults_to_eight_batches_within_the_capacity_and_the_limit() {
        let built = |b: PfeBuilder| {
            let mut p = Program::builder("forward");
            let a = p.label("a");
            p.instr(a, |_t| Ok(Done(Verdict::Forward(0))));
            p.entry(Entry::Packet, a);
            let pfe = b
                .program(p.build().unwrap())
                .ppe_threads(1)
                .build()
                .unwrap();
            (pfe.config().batch_size, pfe.config().max_batch_size)
        };
        assert_eq!(built(Pfe::builder()), (32, 256));
        assert_eq!(built(Pfe::builder().batch_size(8).capacity(50)), (8, 50));
        assert_eq!(built(Pfe::builder().batch_size(4)), (4, 32));
        assert_eq!(built(Pfe::builder().batch_size(500)), (500, MAX_BATCH_SIZE));
        assert_eq!(
            built(Pfe::builder().batch_size(8).max_batch_size(8)),
            (8, 8)
        );
    }

    #[test]
    fn validate_accepts_what_build_made_and_names_each_bad_setting() {
        let good = config();
        assert_eq!(good.validate(), Ok(()));
        type Spoil = fn(&mut Config);
        let cases: [(&str, Spoil); 11] = [
            ("ppe_threads", |c| c.ppe_threads = 0),
            ("head_bytes", |c| c.head_bytes = 10),
            ("batch_size", |c| c.batch_size = 1025),
            ("capacity", |c| c.capacity = c.batch_size - 1),
            ("max_batch_size", |c| c.max_batch_size = c.batch_size - 1),
            ("max_batch_size", |c| c.max_batch_size = MAX_BATCH_SIZE + 1),
            ("max_batch_size", |c| {
                c.capacity = 100;
                c.max_batch_size = 101
            }),
            ("reorder_contexts", |c| c.reorder_contexts = 3),
            ("ports", |c| c.ports = 0),
            ("instruction_budget", |c| c.instruction_budget = 0),
            ("max_frame_bytes", |c| c.max_frame_bytes = 63),
        ];
        for (setting, spoil) in cases {
            let mut c = good.clone();
            spoil(&mut c);
            assert_eq!(c.validate().map_err(|e| e.setting), Err(setting));
        }
    }
}
