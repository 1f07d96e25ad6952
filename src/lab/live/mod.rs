//! A shipped program on live ports: what `pfemu run --iface ...` runs.
//!
//! [`Live::start`] installs a [`LiveProgram`] (the filter, l3fwd with a route file, the
//! Nimble rate limiter, or Trio-ML / FPISA aggregation set up as `pfemu serve` and
//! `pfemu replay` set it up), builds the engine around a [`PortSink`], binds the ports
//! ([`crate::lab::ports`]) and starts receiving. [`Live::report`] reads every counter
//! while it runs; [`Live::stop`] stops receiving, drains the engine (everything in flight
//! leaves through the ports) and returns the final [`LiveReport`], whose
//! [`LiveReport::accounted`] checks that every frame the ports took is accounted for by
//! the engine and every frame the engine sent by the ports. [`bench`](mod@bench) measures the filter
//! through a veth pair (`pfemu bench ports`).
//!
//! ```no_run
//! use pfemu::lab::live::{Live, LiveConfig, LiveProgram};
//! use pfemu::lab::ports::{PortSpec, PortsConfig};
//!
//! let cfg = LiveConfig::new(
//!     LiveProgram::Filter,
//!     PortsConfig::new(vec![PortSpec::interface("0=veth0")?, PortSpec::interface("1=veth2")?]),
//! );
//! let live = Live::start(&cfg)?;
//! // ... traffic flows between the hosts behind veth0 and veth2 ...
//! let report = live.stop()?;
//! println!("{} frames in, {} out", report.ports.rx_frames(), report.ports.tx_frames());
//! assert!(report.accounted());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod bench;

use std::fmt;
use std::sync::Arc;

use serde::Serialize;

use crate::error::ConfigError;
use crate::lab::aggregation::AggregationSetup;
use crate::lab::control::{
    AdaTarget, ControlServer, Controller, JobsTarget, NimbleTarget, RoutesTarget, Target,
};
use crate::lab::ports::{LivePorts, PortError, PortSink, PortsConfig, PortsReport, RunningPorts};
use crate::lab::replay::{l3fwd_memory, load_routes, Routes};
use crate::lab::trace::{TraceOutput, TraceSpec, TraceSummary};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::{Filter, FilterCounts};
use crate::microcode::l3fwd::live::LiveRoutes;
use crate::microcode::l3fwd::{Dir248, L3fwd, Room};
use crate::microcode::nimble::{Arithmetic, Nimble, NimbleConfig};
use crate::microcode::trio_ml::wire::{GRAD_BYTES, HEADERS_LEN, MAX_GRAD_CNT};
use crate::microcode::trio_ml::TrioMlConfig;
use crate::packet::Port;
use crate::pfe::{default_ppe_threads, Pfe, PfeBuilder, Stats};
use crate::timer::ManualClock;

/// The Nimble rate limiter's settings on live ports.
#[derive(Clone, Debug, PartialEq)]
pub struct NimbleSetup {
    /// The rate of class `i`, bits per second: frames arriving on port `i`. Frames of
    /// other ports are dropped (`no_class`).
    pub rates_bps: Vec<u64>,
    /// Each class's bucket depth, bytes.
    pub burst_bytes: u64,
    /// Where admitted frames leave.
    pub out_port: Port,
    /// How the refill is multiplied.
    pub arithmetic: Arithmetic,
}

impl Default for NimbleSetup {
    /// One class (port 0) at 1 Gbit/s, a 64 KB bucket, admitted frames out of port 1,
    /// [`NimbleConfig::default`]'s arithmetic (ADA).
    fn default() -> Self {
        NimbleSetup {
            rates_bps: vec![1_000_000_000],
            burst_bytes: 64 * 1024,
            out_port: 1,
            arithmetic: NimbleConfig::default().arithmetic,
        }
    }
}

/// The program the PPE threads run.
#[derive(Clone, Debug)]
pub enum LiveProgram {
    /// The paper's packet filter: plain IPv4 leaves on port 1, the rest is dropped and
    /// counted.
    Filter,
    /// IPv4 forwarding with these routes ([`crate::microcode::l3fwd`]; a route file holds
    /// `A.B.C.D/LEN PORT` lines). Forwarded frames get the port's next hop MACs:
    /// destination `02:00:00:01:pp:pp`, source `02:00:00:00:pp:pp` (`pppp` the egress
    /// port), so the host behind port `p` needs that MAC (see the README).
    L3fwd(Routes),
    /// The Nimble rate limiter, one class per ingress port.
    Nimble(NimbleSetup),
    /// Trio-ML or FPISA aggregation of these jobs (to 10.0.0.254, UDP port 12000); job
    /// `J`'s Results leave on port `J`.
    Aggregation(AggregationSetup),
}

impl LiveProgram {
    /// The program's name, as the CLI spells it.
    pub fn name(&self) -> &'static str {
        match self {
            LiveProgram::Filter => "filter",
            LiveProgram::L3fwd(_) => "l3fwd",
            LiveProgram::Nimble(_) => "nimble",
            LiveProgram::Aggregation(a) => {
                crate::lab::replay::ReplayProgram::Aggregation(a.clone()).name()
            }
        }
    }
}

/// A live run's settings.
#[derive(Clone, Debug)]
pub struct LiveConfig {
    /// The program.
    pub program: LiveProgram,
    /// The ports.
    pub ports: PortsConfig,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Per-flow reordering.
    pub reorder: bool,
    /// Serve the runtime control plane ([`crate::lab::control`]) on this address while the
    /// program runs: counters, memory, timers, and the program's own tables (l3fwd's
    /// routes, Nimble's classes and ADA tables, aggregation jobs).
    pub control: Option<String>,
    /// Trace these packets ([`crate::lab::trace`]).
    pub trace: Option<TraceSpec>,
    /// The engine's clock when it is not the system's: the programs' timers (the
    /// aggregation's straggler scan, Nimble's controller) follow it. A [`ManualClock`]
    /// nobody moves makes every aggregation block wait for all its sources, however late
    /// one comes, but stops every other timer too (kept Results never expire); for that
    /// alone, give the jobs no block timeout ([`AggregationSetup::block_exp_ms`] 0, `pfemu
    /// run --block-exp-ms off`). `None`: the system clock.
    pub clock: Option<Arc<ManualClock>>,
}

impl LiveConfig {
    /// `program` on `ports`, one PPE thread per available core, reordering on.
    pub fn new(program: LiveProgram, ports: PortsConfig) -> Self {
        LiveConfig {
            program,
            ports,
            ppe_threads: default_ppe_threads(),
            reorder: true,
            control: None,
            trace: None,
            clock: None,
        }
    }
}

/// Why a live run could not start or stop.
#[derive(Debug)]
#[non_exhaustive]
pub enum LiveError {
    /// A setting was refused.
    Config(ConfigError),
    /// A port could not be bound.
    Port(PortError),
    /// A worker on an interface ([`allreduce_on_interface`]) stopped: no Result came back
    /// in time, or the interface failed.
    Worker(String),
}

impl fmt::Display for LiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LiveError::Config(e) => e.fmt(f),
            LiveError::Port(e) => e.fmt(f),
            LiveError::Worker(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for LiveError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LiveError::Config(e) => Some(e),
            LiveError::Port(e) => Some(e),
            LiveError::Worker(_) => None,
        }
    }
}

impl From<ConfigError> for LiveError {
    fn from(e: ConfigError) -> Self {
        LiveError::Config(e)
    }
}

impl From<PortError> for LiveError {
    fn from(e: PortError) -> Self {
        match e {
            PortError::Config(c) => LiveError::Config(c),
            e => LiveError::Port(e),
        }
    }
}

/// What a Nimble class admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ClassReport {
    /// The class (its ingress port).
    pub class: usize,
    /// Its rate, bits per second.
    pub rate_bps: u64,
    /// Frames admitted.
    pub admitted_packets: u64,
    /// Bytes admitted.
    pub admitted_bytes: u64,
}

/// The program's own counters.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProgramCounters {
    /// The filter's shared-memory counters.
    Filter(FilterCounts),
    /// Nimble's per-class counters.
    Nimble(Vec<ClassReport>),
    /// Nothing beyond the engine's drop reasons (l3fwd, aggregation).
    None,
}

/// What a live run did, so far or in all.
#[derive(Clone, Debug, Serialize)]
pub struct LiveReport {
    /// The program's name.
    pub program: &'static str,
    /// Seconds since the ports started.
    pub elapsed_s: f64,
    /// The ports' counters.
    pub ports: PortsReport,
    /// The engine's counters.
    pub engine: Stats,
    /// The program's own counters.
    pub counters: ProgramCounters,
    /// Whether the run is over (the engine drained).
    pub finished: bool,
    /// The control plane's address, when one is served.
    pub control: Option<String>,
    /// What the trace wrote and lost so far.
    pub trace: Option<TraceSummary>,
    /// What the user should know about: ports the program sends to that no interface is
    /// bound to (the engine drops such frames: `no_such_port`, `created_invalid`), frames
    /// longer than the engine takes (`oversize`: a host's segmentation offload).
    pub warnings: Vec<String>,
}

impl LiveReport {
    /// Every frame accounted for (exact once the run is over): every frame the kernel
    /// handed a port was taken or counted as dropped ([`PortsReport::rx_accounted`]), the
    /// frames the ports injected are the engine's `packets_in`, each of which left, was
    /// consumed or dropped (`Stats::is_conserved`, nothing in flight), and every frame the
    /// engine handed the ports left or was counted as a transmit drop.
    pub fn accounted(&self) -> bool {
        let e = &self.engine;
        self.ports.rx_accounted()
            && self.ports.rx_frames() == e.packets_in
            && e.is_conserved()
            && e.in_flight == 0
            && self.ports.tx_frames() + self.ports.tx_dropped() == e.frames_tx
    }
}

/// The program installed, kept to read its counters.
enum Installed {
    Filter(Filter),
    Nimble(Nimble),
    Other,
}

/// A program running on live ports.
pub struct Live {
    program: &'static str,
    installed: Installed,
    ports: RunningPorts,
    warnings: Vec<String>,
    control: Option<ControlServer>,
    trace: Option<TraceOutput>,
}

impl fmt::Debug for Live {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Live")
            .field("program", &self.program)
            .field("ports", &self.ports)
            .finish()
    }
}

impl Live {
    /// Installs the program, binds the ports, starts the engine and the ports' receive
    /// threads.
    pub fn start(cfg: &LiveConfig) -> Result<Live, LiveError> {
        let ports = LivePorts::open(&cfg.ports)?;
        let mut builder = Pfe::builder()
            .ppe_threads(cfg.ppe_threads)
            .reorder(cfg.reorder);
        if let Some(clock) = &cfg.clock {
            builder = builder.clock(clock.clone());
        }
        let (builder, trace) = crate::lab::trace::attach(cfg.trace.as_ref(), builder)?;
        let (builder, installed, sends, targets) =
            install(&cfg.program, builder, ports.sink(), cfg.control.is_some())?;
        let warnings = sends
            .into_iter()
            .filter(|(port, _)| !cfg.ports.ports.iter().any(|p| p.port == *port))
            .map(|(port, what)| {
                format!(
                    "{what} leave port {port}, which no interface is bound to: the engine \
                     drops them (bind it with --iface {port}=NAME)"
                )
            })
            .collect();
        let mut pfe = builder.build()?;
        pfe.start()
            .map_err(|e| ConfigError::new("start", e.to_string()))?;
        let control = match &cfg.control {
            Some(addr) => Some(
                ControlServer::start(addr, Controller::new(pfe.control(), targets))
                    .map_err(|e| ConfigError::new("control", e.to_string()))?,
            ),
            None => None,
        };
        let ports = ports.start(Arc::new(pfe))?;
        Ok(Live {
            program: cfg.program.name(),
            installed,
            ports,
            warnings,
            control,
            trace,
        })
    }

    /// The counters now (the engine's are read while it runs, so they add up only
    /// approximately; see [`Live::stop`]). The engine's are read first, then the ports':
    /// a frame a port injects between the two reads is in the ports' `rx_frames` and not
    /// yet in the engine's `packets_in`, never the other way round.
    pub fn report(&self) -> LiveReport {
        let pfe = self.ports.pfe();
        let engine = pfe.stats();
        LiveReport {
            program: self.program,
            elapsed_s: self.ports.elapsed().as_secs_f64(),
            ports: self.ports.report(),
            warnings: warnings(&self.warnings, &engine, pfe.config().max_frame_bytes),
            engine,
            counters: counters_of(&self.installed, pfe.memory()),
            finished: false,
            control: self.control_addr().map(|a| a.to_string()),
            trace: self.trace.as_ref().map(TraceOutput::summary),
        }
    }

    /// The address the control plane listens on, when [`LiveConfig::control`] was given.
    pub fn control_addr(&self) -> Option<std::net::SocketAddr> {
        self.control.as_ref().map(ControlServer::addr)
    }

    /// The engine.
    pub fn pfe(&self) -> &Arc<Pfe> {
        self.ports.pfe()
    }

    /// Stops receiving, drains the engine through the ports, shuts it down and returns
    /// the final counters. Fails only if something else still holds the engine (a clone of
    /// [`Live::pfe`]'s `Arc`).
    pub fn stop(mut self) -> Result<LiveReport, LiveError> {
        let control = self.control_addr().map(|a| a.to_string());
        // The control plane goes first: nothing changes the engine while it drains.
        drop(self.control.take());
        let elapsed_s = self.ports.elapsed().as_secs_f64();
        let pfe = self.ports.pfe().clone();
        let ports = self.ports.stop();
        let counters = counters_of(&self.installed, pfe.memory());
        let max_frame_bytes = pfe.config().max_frame_bytes;
        let pfe = Arc::try_unwrap(pfe).map_err(|_| {
            ConfigError::new(
                "pfe",
                "the engine is still shared (a clone of Live::pfe is alive); drop it before stop",
            )
        })?;
        let engine = pfe.shutdown();
        let trace = match self.trace.take() {
            Some(t) => Some(t.finish().map_err(|e| {
                ConfigError::new("trace", format!("writing the trace failed: {e}"))
            })?),
            None => None,
        };
        Ok(LiveReport {
            program: self.program,
            elapsed_s,
            ports,
            warnings: warnings(&self.warnings, &engine, max_frame_bytes),
            engine,
            counters,
            finished: true,
            control,
            trace,
        })
    }
}

/// A report's warnings: the setup's, then what the engine's drops say about the hosts.
fn warnings(setup: &[String], engine: &Stats, max_frame_bytes: usize) -> Vec<String> {
    let mut out = setup.to_vec();
    if let Some(n) = engine.dropped_by_reason.get("oversize").filter(|&&n| n > 0) {
        out.push(format!(
            "{n} frames longer than the engine takes ({max_frame_bytes} bytes) were dropped as \
             they arrived (oversize); if a host sends TCP through a veth, turn its \
             segmentation offload off (`ip link set dev IFACE gso_max_segs 1`)"
        ));
    }
    out
}

/// The program's own counters in `mem`.
fn counters_of(installed: &Installed, mem: &SharedMemory) -> ProgramCounters {
    match installed {
        Installed::Filter(f) => f
            .counts(mem)
            .map_or(ProgramCounters::None, ProgramCounters::Filter),
        Installed::Nimble(n) => ProgramCounters::Nimble(
            (0..n.config().rates_bps.len())
                .filter_map(|class| {
                    let c = n.counts(mem, class).ok()?;
                    Some(ClassReport {
                        class,
                        rate_bps: n.config().rates_bps[class],
                        admitted_packets: c.packets,
                        admitted_bytes: c.bytes,
                    })
                })
                .collect(),
        ),
        Installed::Other => ProgramCounters::None,
    }
}

/// The ports a program sends to, each with what it sends there.
type Sends = Vec<(Port, String)>;

/// The control plane's targets of a program (beside the engine's own paths).
type Targets = Vec<Arc<dyn Target>>;

/// Room l3fwd leaves for routes added through the control plane.
const ROUTE_ROOM: Room = Room {
    tbl8_groups: 1024,
    next_hops: 256,
};

/// Installs `program` in a new shared memory and puts it, the memory, its timers and
/// `sink` in `builder`; also says which ports the program sends to, and what, and (with
/// `control`) what the control plane can change in it.
fn install(
    program: &LiveProgram,
    builder: PfeBuilder,
    sink: Arc<PortSink>,
    control: bool,
) -> Result<(PfeBuilder, Installed, Sends, Targets), ConfigError> {
    let builder = builder.sink(sink);
    let sends: Sends = match program {
        LiveProgram::Filter => vec![(
            crate::microcode::filter::DEFAULT_OUT_PORT,
            "the filter's plain IPv4 packets".into(),
        )],
        LiveProgram::L3fwd(_) => Vec::new(),
        LiveProgram::Nimble(n) => vec![(n.out_port, "Nimble's admitted packets".into())],
        LiveProgram::Aggregation(a) => a
            .jobs
            .iter()
            .map(|j| (Port::from(j.job_id), format!("job {}'s Results", j.job_id)))
            .collect(),
    };
    let mut targets: Targets = Vec::new();
    let (builder, installed, more) = match program {
        LiveProgram::Filter => {
            let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
            let filter = Filter::install(&mem)
                .map_err(|e| ConfigError::new("program", format!("installing filter: {e}")))?;
            (
                builder.program(filter.program()).memory(mem),
                Installed::Filter(filter),
                Vec::new(),
            )
        }
        LiveProgram::L3fwd(routes) => {
            let table = load_routes(routes)?;
            let mut ports: Vec<Port> = table.next_hops().iter().map(|nh| nh.port).collect();
            ports.sort_unstable();
            ports.dedup();
            let dir =
                Dir248::build(&table).map_err(|e| ConfigError::new("routes", e.to_string()))?;
            let room = if control { ROUTE_ROOM } else { Room::default() };
            let mut mem_cfg = l3fwd_memory(&dir);
            mem_cfg.dram_bytes += room.tbl8_groups as u64 * 512;
            mem_cfg.sram_bytes += room.next_hops as u64 * 16;
            let mem = Arc::new(SharedMemory::new(&mem_cfg)?);
            let l3fwd = L3fwd::install_table_with_room(&mem, &dir, room)
                .map_err(|e| ConfigError::new("memory", e.to_string()))?;
            if control {
                let live = LiveRoutes::new(&l3fwd, Arc::clone(&mem), table)
                    .map_err(|e| ConfigError::new("routes", e.to_string()))?;
                targets.push(Arc::new(RoutesTarget::new(Arc::new(live))));
            }
            (
                builder.program(l3fwd.program()).memory(mem),
                Installed::Other,
                ports
                    .into_iter()
                    .map(|p| (p, "packets of the routes".to_string()))
                    .collect(),
            )
        }
        LiveProgram::Nimble(n) => {
            let mem = Arc::new(SharedMemory::new(&MemConfig {
                dram_bytes: 0,
                ..MemConfig::default()
            })?);
            let nimble = Nimble::install(
                &mem,
                NimbleConfig {
                    rates_bps: n.rates_bps.clone(),
                    burst_bytes: n.burst_bytes,
                    arithmetic: n.arithmetic,
                    out_port: n.out_port,
                    ..NimbleConfig::default()
                },
            )
            .map_err(|e| match e {
                crate::microcode::nimble::NimbleError::Config(c) => c,
                e => ConfigError::new("nimble", e.to_string()),
            })?;
            let timers = nimble.timer_specs()?;
            if control {
                targets.push(Arc::new(NimbleTarget::new(
                    nimble.clone(),
                    Arc::clone(&mem),
                )));
                if let Some(ada) = nimble.ada() {
                    targets.push(Arc::new(AdaTarget::new("rate", Arc::clone(ada))));
                }
                if let Some(ada) = nimble.dt_ada() {
                    targets.push(Arc::new(AdaTarget::new("dt", Arc::clone(ada))));
                }
            }
            (
                builder.program(nimble.program()).memory(mem).timers(timers),
                Installed::Nimble(nimble),
                Vec::new(),
            )
        }
        LiveProgram::Aggregation(a) => {
            let mem = Arc::new(SharedMemory::new(&a.mem_config())?);
            let out_src_addr = TrioMlConfig::default().local_addr;
            let trio = a.install(&mem, out_src_addr)?;
            let timers = trio.timer_specs()?;
            if control {
                // A job added while it runs is set up as the jobs given at the start are.
                let setup = a.clone();
                targets
                    .push(Arc::new(JobsTarget::new(trio.clone()).template(
                        move |job_id| setup.job_config(job_id, out_src_addr),
                    )));
            }
            (
                builder
                    .program(trio.program())
                    .memory(mem)
                    .max_frame_bytes(HEADERS_LEN + usize::from(MAX_GRAD_CNT) * GRAD_BYTES)
                    .timers(timers),
                Installed::Other,
                Vec::new(),
            )
        }
    };
    Ok((
        builder,
        installed,
        sends.into_iter().chain(more).collect(),
        targets,
    ))
}

/// Bytes of an Ethernet header, which a frame has beyond the interface's MTU.
pub(crate) const ETHERNET_HEADER: usize = 14;

/// The MTU of `iface` (`None` when it cannot be read).
pub(crate) fn if_mtu(iface: &str) -> Option<usize> {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/mtu"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

/// A Trio-ML or FPISA worker on a Linux interface: what `pfemu worker --iface` runs, the
/// paper's worker whose packets are Ethernet frames on a wire (a veth, a NIC) to a PFE's
/// port, not datagrams through a UDP socket.
///
/// Sends the worker's packets as frames on `iface` (AF_PACKET), window by window, and
/// takes every frame that arrives there (promiscuous, so Results to a multicast group
/// arrive without joining it) until the worker has every Result; retransmits what is
/// overdue as [`Worker::poll`](crate::microcode::trio_ml::host::Worker::poll) says. Fails when nothing comes back for `give_up_after`
/// (naming how many chunks are missing) or the interface cannot be opened. Needs
/// `CAP_NET_RAW`.
pub fn allreduce_on_interface(
    iface: &str,
    worker: &mut crate::microcode::trio_ml::host::Worker,
    give_up_after: std::time::Duration,
) -> Result<crate::lab::serve::ClientReport, LiveError> {
    use std::time::{Duration, Instant};

    // A packet is its headers and the gradients; beyond the interface's MTU the kernel
    // refuses it.
    let ip_bytes = HEADERS_LEN - ETHERNET_HEADER + worker.config().grads_per_packet * GRAD_BYTES;
    if let Some(mtu) = if_mtu(iface).filter(|&m| m < ip_bytes) {
        return Err(ConfigError::new(
            "grads_per_packet",
            format!(
                "{} gradients make {ip_bytes}-byte IP packets, more than `{iface}`'s MTU of \
                 {mtu}: send fewer per packet or raise the MTU",
                worker.config().grads_per_packet
            ),
        )
        .into());
    }
    let sock = crate::lab::ports::RawSocket::open(iface, true)?;
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    let (mut sent, mut send_calls, mut recv_calls, mut frames_in, mut bad) = (0, 0, 0, 0, 0);
    let mut last_progress = Instant::now();
    while !worker.is_done() {
        out.clear();
        worker.poll(now(), &mut out);
        if !out.is_empty() {
            let (ok, err) = sock.send(out.iter().map(Vec::as_slice));
            send_calls += 1;
            sent += ok;
            if ok == 0 {
                if let Some(e) = err {
                    // Refused frames are resent when overdue; a link that is gone shows
                    // as no progress.
                    if e.kind() != std::io::ErrorKind::WouldBlock {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }
        }
        let ready = sock
            .wait(Duration::from_millis(1))
            .map_err(|e| LiveError::Worker(format!("waiting on `{iface}`: {e}")))?;
        if ready {
            recv_calls += 1;
            while let Some(n) = sock
                .try_recv(&mut buf)
                .map_err(|e| LiveError::Worker(format!("receiving on `{iface}`: {e}")))?
            {
                frames_in += 1;
                match worker.on_frame_at(&buf[..n], now()) {
                    Ok(
                        crate::microcode::trio_ml::host::Received::Result { .. }
                        | crate::microcode::trio_ml::host::Received::Lost { .. },
                    ) => {
                        last_progress = Instant::now();
                    }
                    Ok(_) => {}
                    // Frames of other traffic on the wire.
                    Err(_) => bad += 1,
                }
            }
        }
        if last_progress.elapsed() > give_up_after {
            return Err(LiveError::Worker(format!(
                "no Result on `{iface}` for {:.1} s: {} of the worker's chunks are missing \
                 ({sent} frames sent); is a PFE running the job's program on the other end?",
                give_up_after.as_secs_f64(),
                worker.missing()
            )));
        }
    }
    let elapsed_s = worker
        .finished_ns()
        .map_or(start.elapsed().as_secs_f64(), |ns| ns as f64 / 1e9);
    let gradients = worker.sums().len();
    Ok(crate::lab::serve::ClientReport {
        elapsed_s,
        gradients,
        goodput_gbps: (gradients * 32) as f64 / elapsed_s.max(1e-9) / 1e9,
        stats: worker.stats(),
        dropped_by_injector: 0,
        bad_datagrams: bad,
        run_id: worker.run_id(),
        // On an interface the worker joins no run.
        joins_sent: 0,
        rejoins: 0,
        datagrams_in: frames_in,
        recv_calls,
        send_calls,
        gro: false,
        gso: false,
    })
}
