//! The switch fabric between PFEs, as a cycle-level model of one P x P switch.
//!
//! A Trio router joins its PFEs through a fabric; this module models that fabric with the
//! architecture of Hipernetch (Papaphilippou, Meng, Gebara & Luk, "Hipernetch: High-Performance
//! FPGA Network Switch", ACM TRETS 15(1), 2021) and the switches that paper compares it with.
//! It owns the switch architectures, the paper's traffic models, its latency equations and a
//! seeded runner; the experiments, plots and the chassis integration sit above it.
//!
//! # The model
//!
//! Time is a cycle counter ([`Fabric::now`]), advanced by one per [`Fabric::step`]; nothing
//! here reads a clock or starts a thread, and every random choice comes from a
//! [`SplitMix64`](crate::rng::SplitMix64) seeded by the caller. One cycle:
//!
//! ```text
//! arrivals (at most one cell per input)      step(arrivals, out)
//!   1. validate: source and destination < P, one cell per input        -> StepError
//!   2. stamp each cell's `arrival` with now
//!   3. enqueue by the architecture's rules; a full queue drops the cell -> out.drops
//!   4. schedule: at most one cell per output leaves                     -> out.departures
//!   5. now += 1
//! ```
//!
//! As in the paper's simulations (§6: "0 processing latency"), a cell that finds its way clear
//! leaves in the cycle it arrives, so its latency, `departure cycle - arrival`, is 0: latency
//! here is the time spent in queues, the quantity M/D/1's equation 7 gives. The pipeline's
//! own latency in hardware is [`latency::pipeline`] (equations 1-4), to add on top.
//!
//! ```
//! use pfemu::fabric::{simulate, Architecture, Cell, Depth, Fabric, FabricConfig};
//! use pfemu::fabric::{Outputs, Traffic};
//!
//! // Step a fabric by hand, as the chassis does: cells in, departures and drops out.
//! let config = FabricConfig::new(Architecture::FIGURE_11[0], 4, Depth::Finite(8));
//! let mut fabric = config.build(1)?;
//! let mut out = Outputs::with_ports(4);
//! fabric.step(&[Cell::new(0, 3, 7), Cell::new(1, 3, 8)], &mut out)?;
//! assert_eq!(out.departures.len(), 1); // one cell per output per cycle
//! fabric.step(&[], &mut out)?;
//! assert_eq!(out.departures[0].dst, 3);
//! assert!(fabric.counters().conserved());
//!
//! // Or run a point of Figure 11: CPRR on 16 ports, uniform traffic at r = 0.8.
//! let config = FabricConfig::new(Architecture::FIGURE_11[0], 16, Depth::Infinite);
//! let report = simulate(&config, Traffic::Bernoulli, 0.8, 1_000, 10_000, 42)?;
//! assert!(report.mean_latency.is_some_and(|l| l < 2.0) && report.loss_ratio == Some(0.0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The architectures ([`Architecture`])
//!
//! - [`Cprr`]: Hipernetch's combined parallel round-robin arbiter, P groups of P FIFOs
//!   (§4), written round-robin by the offset counters, read by output arbiters (§5.4).
//! - [`OqXbar`]: the output-queued crossbar with speedup P, the ideal (§5.5).
//! - [`Voq`]: the input-queued crossbar with virtual output queues and a [`Scheduler`]:
//!   PIM, RRM, iSLIP, DRRM or EDRRM, with one iteration or log2(P) (§6.1).
//!
//! All keep the same counters ([`Counters`]), so conservation (cells offered = delivered
//! plus dropped plus queued) holds after every step. Buffers are comparable through one
//! [`Depth`], the depth D of each of the P x P FIFOs (the paper's "FIFO depth" of Figure 13);
//! the OQ-xbar's output queue holds P x D, the same buffer per output.
//!
//! Ports are at most 64 ([`MAX_PORTS`]): the schedulers keep request sets as one `u64` each
//! and pick round-robin by rotate and `trailing_zeros`, which is what makes a sweep fast.
//!
//! # Against the paper's numbers
//!
//! On 16 ports (`tests/fabric.rs`): with FIFOs of depth 1 at r = 1 under uniform traffic
//! the model loses 5.2% with CPRR and 16.1% with PIM, the paper's Figure 13 numbers; at
//! r = 0.99 CPRR loses nothing at depth 33, the paper's smallest depth without loss, where
//! PIM still drops (how much shallower this model's CPRR may go depends on the run's length
//! and seed: `pfemu experiment fabric-loss` searches it). Near
//! r = 1 CPRR has the lowest mean and worst-case latency of the twelve, and the best VOQ
//! scheduler is the paper's for each traffic model (PIM, PIM, EDRRM). The ratios of
//! Figures 11 and 12 depend on how near to 1 "near 1" is and on the run's length; the
//! experiments above this module report them.
//!
//! # Where this model differs from the paper
//!
//! - Latency is counted in queues only (the paper's simulations, §6), not the pipeline.
//! - A run ([`simulate`]) warms up before it measures: the cells of its first
//!   `warmup_cycles` are not counted, so that the queues reach their steady state. The
//!   paper does not say whether its simulations had a warm-up.
//! - The drain (§5.5's "convention to wait to empty the queues") stops at the first cycle
//!   with no departure: after a drop CPRR's simple arbiter can hold cells for good (§5.4),
//!   and those are reported apart ([`Report::stranded`]), neither delivered nor dropped.
//! - Above an architecture's saturation (RRM-1 and PIM-1 near r = 1) a run stops once its
//!   backlog passes a bound and is reported saturated, with no latency or loss
//!   ([`Report::saturated_at`]): the latency it would give grows with the run's length and
//!   says nothing of the switch. The paper does not say how its simulations treated such
//!   points.
//! - The "average worst-case latency" of Figure 12 is read as the maximum latency seen at each
//!   output port, averaged over the ports ([`Report::avg_worst_latency`]); the paper does not
//!   say over what it averages. The run's overall maximum is reported beside it.
//! - The bursty chain's transition probabilities are derived here ([`traffic`]); Figure 10
//!   only draws them.
//! - The OQ-xbar writes the cells of one cycle in input order starting from a rotating input
//!   (a round-robin arbitration, which §5.5 allows); CPRR's order is its sorting network's.
//! - Figure 9 sets the simulation beside equation 7, M/D/1. A cycle brings an output a
//!   binomial number of cells, not a Poisson one, and the exact mean wait is (P - 1)/P of
//!   equation 7 ([`latency::oq_bernoulli_wait`]): this model's 16-port OQ-xbar and CPRR sit
//!   6.25% below the M/D/1 curve, on the exact one.
//! - §5.5's "P free places in a group suffice" holds only until the group's first drop; the
//!   loss bound it supports held in every run (see [`Cprr`]'s doc).
//! - §5.5 says two cells of different cycles leave CPRR in the order they came; so they do,
//!   for one output, until its group's first drop. After it the output arbiter reads a FIFO
//!   one row early and a later cell of a flow can overtake an earlier one (see [`Cprr`]'s
//!   doc, "Order"); the OQ-xbar and the VOQ crossbars keep every flow's order always.
//! - The VOQ schedulers follow their original papers (see [`Voq`]'s doc); where a paper
//!   leaves the iterations open (RRM's pointers after the first iteration; DRRM's and
//!   EDRRM's extra iterations), the choice is stated there.
//! - EDRRM is not confirmed against its own paper, whose text this project does not hold;
//!   its abstract says EDRRM's throughput is below 100% for small switches, conjectured
//!   to reach 100% as they grow under uniform traffic, high under nonuniform traffic, and
//!   its delay insensitive to the switch's size. Measured here (uniform Bernoulli, FIFOs
//!   unbounded, 1-2 M cycles), the highest load at which EDRRM-1's queues stay bounded
//!   is about 0.99 on 2 to 4 ports, 0.91 on 5, 0.94 on 8, 0.955 on 12, and between 0.95
//!   and 0.97 from 16 to 64 ports: rising with the size from 5 ports, as the abstract
//!   says, but highest on 2 to 4 ports, and not seen to reach 1. At r = 1
//!   with FIFOs of 256 (100 000 cycles after 10 000 of warm-up) it carries 0.986 of the
//!   traffic on 2 ports and 0.906 on 64 (an exhaustive service loses a few cycles each
//!   time its VOQ empties, fewer the longer the queues, so this figure moves with the
//!   depth and the run's length), and its mean latency at r = 0.8 grows with the ports
//!   (4 cycles on 2, 201 on 16, 1 046 on 64). Under the nonuniform model (p = 0.5) it
//!   keeps 0.84-0.98 where DRRM-1 and iSLIP-1 fall to 0.61-0.77 from 16 ports: the "high
//!   throughput under nonuniform traffic" holds.

/// The [`Fabric`] accessors every architecture implements alike, from its `ports`, `now`
/// and `counters` fields.
macro_rules! common_accessors {
    () => {
        fn ports(&self) -> usize {
            self.ports
        }

        fn now(&self) -> u64 {
            self.now
        }

        fn counters(&self) -> &Counters {
            &self.counters
        }
    };
}

mod cprr;
pub mod latency;
mod oq;
mod queue;
mod sim;
pub mod traffic;
mod voq;

use std::fmt;

use crate::error::ConfigError;

pub use cprr::{Cprr, OutputArbiter};
pub use oq::OqXbar;
pub use sim::{simulate, simulate_bounded, Report, DEFAULT_MAX_BACKLOG, MAX_CYCLES};
pub use traffic::{Traffic, TrafficGen};
pub use voq::{Iterations, Scheduler, Voq};

/// The largest switch the simulation takes: request sets are one `u64` per port.
pub const MAX_PORTS: usize = 64;

/// One cell, the unit the fabric switches: one slot of one port for one cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cell {
    /// The input port it enters by.
    pub src: u16,
    /// The output port it leaves by.
    pub dst: u16,
    /// The cycle it entered the fabric: stamped by [`Fabric::step`], whatever it held before.
    pub arrival: u64,
    /// The caller's: a packet id and fragment index, say. The fabric never reads it.
    pub tag: u64,
}

impl Cell {
    /// A cell from `src` to `dst` carrying `tag`, not yet stamped.
    pub fn new(src: u16, dst: u16, tag: u64) -> Self {
        Cell {
            src,
            dst,
            arrival: 0,
            tag,
        }
    }
}

/// Why the fabric dropped a cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub enum DropReason {
    /// The queue the architecture chose for the cell was full: a CPRR FIFO, a VOQ or an
    /// output queue. The only place any of these architectures drops (§4.1: the pipeline
    /// is non-blocking, "dropped packets can only occur at the queue level").
    QueueFull,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 1] = [DropReason::QueueFull];

    /// The reason's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::QueueFull => "queue_full",
        }
    }

    fn index(self) -> usize {
        match self {
            DropReason::QueueFull => 0,
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A fabric's counters since it was built. After every step,
/// `offered == delivered + dropped_total() + queued` ([`Counters::conserved`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Counters {
    /// Cells that entered.
    pub offered: u64,
    /// Cells that left by their output.
    pub delivered: u64,
    /// Cells dropped, by [`DropReason`] (index: its position in [`DropReason::ALL`]).
    pub dropped: [u64; DropReason::ALL.len()],
    /// Cells in the fabric's queues now.
    pub queued: u64,
}

impl Counters {
    /// Cells dropped for `reason`.
    pub fn dropped(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()]
    }

    /// Cells dropped for any reason.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// Whether every cell that entered is accounted for: delivered, dropped or queued.
    pub fn conserved(&self) -> bool {
        self.offered == self.delivered + self.dropped_total() + self.queued
    }

    fn enter(&mut self) {
        self.offered += 1;
        self.queued += 1;
    }

    fn leave(&mut self) {
        self.delivered += 1;
        self.queued -= 1;
    }

    fn drop_cell(&mut self, reason: DropReason) {
        self.dropped[reason.index()] += 1;
        self.queued -= 1;
    }
}

/// A dropped cell and why: handed back so that the caller (a reassembler) can give up on
/// its packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dropped {
    /// The cell, stamped.
    pub cell: Cell,
    /// Why.
    pub reason: DropReason,
}

/// What one [`Fabric::step`] gives out. Cleared by each step and reused across cycles, so a
/// simulation does not allocate per cycle.
#[derive(Clone, Debug, Default)]
pub struct Outputs {
    /// The cells that left this cycle, at most one per output port, in no promised order.
    pub departures: Vec<Cell>,
    /// The cells dropped this cycle.
    pub drops: Vec<Dropped>,
}

impl Outputs {
    /// Empty outputs, with room for a `ports`-port switch's cycle (at most [`MAX_PORTS`]:
    /// no switch has more, and a larger count reserves no more).
    pub fn with_ports(ports: usize) -> Self {
        let ports = ports.min(MAX_PORTS);
        Outputs {
            departures: Vec::with_capacity(ports),
            drops: Vec::with_capacity(ports),
        }
    }

    fn clear(&mut self) {
        self.departures.clear();
        self.drops.clear();
    }
}

/// A cycle's arrivals were refused; nothing of that cycle was taken and the clock did not move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepError {
    /// A cell names a port the switch does not have.
    NoSuchPort {
        /// The offending cell.
        cell: Cell,
        /// The switch's ports.
        ports: usize,
    },
    /// Two cells enter by the same input in one cycle; an input carries one cell per cycle.
    InputBusy {
        /// The input.
        input: u16,
    },
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::NoSuchPort { cell, ports } => write!(
                f,
                "cell from input {} to output {} on a {ports}-port fabric",
                cell.src, cell.dst
            ),
            StepError::InputBusy { input } => {
                write!(f, "two cells enter by input {input} in one cycle")
            }
        }
    }
}

impl std::error::Error for StepError {}

/// Checks a cycle's arrivals: ports in range, one cell per input.
fn validate(ports: usize, arrivals: &[Cell]) -> Result<(), StepError> {
    let mut busy = 0u64;
    for cell in arrivals {
        if usize::from(cell.src) >= ports || usize::from(cell.dst) >= ports {
            return Err(StepError::NoSuchPort { cell: *cell, ports });
        }
        let bit = 1u64 << cell.src;
        if busy & bit != 0 {
            return Err(StepError::InputBusy { input: cell.src });
        }
        busy |= bit;
    }
    Ok(())
}

/// A P x P switch fabric, stepped one cycle at a time.
pub trait Fabric {
    /// P, its ports.
    fn ports(&self) -> usize;

    /// The cycle the next [`Fabric::step`] runs.
    fn now(&self) -> u64;

    /// Its counters since it was built.
    fn counters(&self) -> &Counters;

    /// Runs one cycle: takes `arrivals` (at most one per input; each stamped with
    /// [`Fabric::now`]), puts the cycle's departures and drops in `out` (cleared first), and
    /// advances the clock. Refused arrivals leave the fabric untouched.
    fn step(&mut self, arrivals: &[Cell], out: &mut Outputs) -> Result<(), StepError>;
}

/// The depth of each FIFO (the paper's D).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Depth {
    /// No limit: nothing is ever dropped (Figures 9, 11 and 12).
    Infinite,
    /// At most this many cells per FIFO (Figure 13), at least 1.
    Finite(usize),
}

impl Depth {
    /// The limit as a count, `usize::MAX` when infinite.
    fn cells(self) -> usize {
        match self {
            Depth::Infinite => usize::MAX,
            Depth::Finite(d) => d,
        }
    }

    /// The depth times `n` (an output queue that holds `n` FIFOs' worth).
    fn times(self, n: usize) -> Depth {
        match self {
            Depth::Infinite => Depth::Infinite,
            Depth::Finite(d) => Depth::Finite(d.saturating_mul(n)),
        }
    }
}

/// A switch architecture, with its own parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Architecture {
    /// Hipernetch's combined parallel round-robin arbiter ([`Cprr`]).
    Cprr(OutputArbiter),
    /// The output-queued crossbar with speedup P ([`OqXbar`]).
    OqXbar,
    /// A VOQ input-queued crossbar under a scheduler ([`Voq`]).
    Voq(Scheduler, Iterations),
}

impl Architecture {
    /// The twelve of Figure 11: CPRR (the paper's simple output arbiter), OQ-xbar, and each
    /// scheduler with log2(P) iterations and with one ("-1").
    pub const FIGURE_11: [Architecture; 12] = [
        Architecture::Cprr(OutputArbiter::Simple),
        Architecture::OqXbar,
        Architecture::Voq(Scheduler::Pim, Iterations::Log2),
        Architecture::Voq(Scheduler::Pim, Iterations::One),
        Architecture::Voq(Scheduler::Rrm, Iterations::Log2),
        Architecture::Voq(Scheduler::Rrm, Iterations::One),
        Architecture::Voq(Scheduler::Islip, Iterations::Log2),
        Architecture::Voq(Scheduler::Islip, Iterations::One),
        Architecture::Voq(Scheduler::Drrm, Iterations::Log2),
        Architecture::Voq(Scheduler::Drrm, Iterations::One),
        Architecture::Voq(Scheduler::Edrrm, Iterations::Log2),
        Architecture::Voq(Scheduler::Edrrm, Iterations::One),
    ];

    /// Its name as the paper's figures spell it: `CPRR`, `OQ-xbar`, `iSLIP`, `iSLIP-1`, ...
    pub fn name(self) -> String {
        match self {
            Architecture::Cprr(OutputArbiter::Simple) => "CPRR".into(),
            Architecture::Cprr(OutputArbiter::RoundRobin) => "CPRR-rr".into(),
            Architecture::OqXbar => "OQ-xbar".into(),
            Architecture::Voq(s, Iterations::Log2) => s.name().into(),
            Architecture::Voq(s, Iterations::One) => format!("{}-1", s.name()),
        }
    }
}

impl fmt::Display for Architecture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// A fabric's configuration: build it with [`FabricConfig::build`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FabricConfig {
    /// P, the ports: 2..=[`MAX_PORTS`].
    pub ports: usize,
    /// D, the depth of each FIFO.
    pub depth: Depth,
    /// The architecture.
    pub architecture: Architecture,
}

impl FabricConfig {
    /// A `ports` x `ports` switch of `architecture` with FIFOs of `depth`.
    pub fn new(architecture: Architecture, ports: usize, depth: Depth) -> Self {
        FabricConfig {
            ports,
            depth,
            architecture,
        }
    }

    /// Checks the settings, naming the one at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(2..=MAX_PORTS).contains(&self.ports) {
            return Err(ConfigError::new(
                "ports",
                format!(
                    "{} ports: the fabric simulates 2..={MAX_PORTS} (request sets are one u64)",
                    self.ports
                ),
            ));
        }
        if self.depth == Depth::Finite(0) {
            return Err(ConfigError::new(
                "depth",
                "a FIFO depth of 0 holds nothing: give at least 1, or Depth::Infinite",
            ));
        }
        Ok(())
    }

    /// The fabric, its random choices (PIM's) drawn from `seed`.
    pub fn build(&self, seed: u64) -> Result<AnyFabric, ConfigError> {
        self.validate()?;
        Ok(match self.architecture {
            Architecture::Cprr(arbiter) => {
                AnyFabric::Cprr(Cprr::new(self.ports, self.depth, arbiter))
            }
            Architecture::OqXbar => AnyFabric::OqXbar(OqXbar::new(self.ports, self.depth)),
            Architecture::Voq(scheduler, iterations) => AnyFabric::Voq(Voq::new(
                self.ports, self.depth, scheduler, iterations, seed,
            )),
        })
    }
}

/// Any architecture behind one type, for callers that choose at run time (the chassis).
/// A sweep that wants the per-cycle loop monomorphised matches on it once and runs the
/// concrete type (as [`simulate`] does).
#[derive(Clone, Debug)]
pub enum AnyFabric {
    /// A [`Cprr`].
    Cprr(Cprr),
    /// An [`OqXbar`].
    OqXbar(OqXbar),
    /// A [`Voq`].
    Voq(Voq),
}

impl Fabric for AnyFabric {
    fn ports(&self) -> usize {
        match self {
            AnyFabric::Cprr(f) => f.ports(),
            AnyFabric::OqXbar(f) => f.ports(),
            AnyFabric::Voq(f) => f.ports(),
        }
    }

    fn now(&self) -> u64 {
        match self {
            AnyFabric::Cprr(f) => f.now(),
            AnyFabric::OqXbar(f) => f.now(),
            AnyFabric::Voq(f) => f.now(),
        }
    }

    fn counters(&self) -> &Counters {
        match self {
            AnyFabric::Cprr(f) => f.counters(),
            AnyFabric::OqXbar(f) => f.counters(),
            AnyFabric::Voq(f) => f.counters(),
        }
    }

    fn step(&mut self, arrivals: &[Cell], out: &mut Outputs) -> Result<(), StepError> {
        match self {
            AnyFabric::Cprr(f) => f.step(arrivals, out),
            AnyFabric::OqXbar(f) => f.step(arrivals, out),
            AnyFabric::Voq(f) => f.step(arrivals, out),
        }
    }
}

/// The next member of `set` (bits below `n`) at or after `from`, round-robin, if any.
#[inline]
fn next_at_or_after(set: u64, from: usize) -> Option<usize> {
    if set == 0 {
        return None;
    }
    // Bits at or above `from` first, then wrap to the lowest.
    let high = set & (u64::MAX << from);
    let pick = if high != 0 { high } else { set };
    Some(pick.trailing_zeros() as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_robin_pick_wraps() {
        assert_eq!(next_at_or_after(0, 3), None);
        assert_eq!(next_at_or_after(0b1001, 0), Some(0));
        assert_eq!(next_at_or_after(0b1001, 1), Some(3));
        assert_eq!(next_at_or_after(0b1001, 4), Some(0));
        assert_eq!(next_at_or_after(1 << 63, 63), Some(63));
    }

    #[test]
    fn configuration_errors_name_the_setting() {
        let arch = Architecture::OqXbar;
        for (ports, depth, setting) in [
            (0, Depth::Infinite, "ports"),
            (1, Depth::Infinite, "ports"),
            (65, Depth::Infinite, "ports"),
            (usize::MAX, Depth::Finite(usize::MAX), "ports"),
            (16, Depth::Finite(0), "depth"),
        ] {
            let err = FabricConfig::new(arch, ports, depth).build(1).unwrap_err();
            assert_eq!(err.setting, setting, "{err}");
        }
        assert!(FabricConfig::new(arch, 64, Depth::Finite(1))
            .build(1)
            .is_ok());
        // The deepest FIFO there is reserves nothing up front, and P x D saturates.
        for arch in Architecture::FIGURE_11 {
            let mut f = FabricConfig::new(arch, 4, Depth::Finite(usize::MAX))
                .build(1)
                .unwrap();
            let mut out = Outputs::default();
            f.step(&[Cell::new(0, 1, 0), Cell::new(2, 1, 1)], &mut out)
                .unwrap();
            assert!(out.drops.is_empty() && f.counters().conserved(), "{arch}");
        }
    }

    /// Any port count gives outputs (capacity for at most 64), no capacity overflow.
    #[test]
    fn outputs_for_any_port_count() {
        for ports in [0, 16, usize::MAX] {
            let out = Outputs::with_ports(ports);
            assert!(out.departures.is_empty() && out.drops.is_empty());
        }
    }

    #[test]
    fn bad_arrivals_are_refused_whole() {
        let mut f = FabricConfig::new(Architecture::OqXbar, 4, Depth::Infinite)
            .build(1)
            .unwrap();
        let mut out = Outputs::default();
        let err = f
            .step(&[Cell::new(0, 1, 0), Cell::new(0, 2, 0)], &mut out)
            .unwrap_err();
        assert_eq!(err, StepError::InputBusy { input: 0 });
        assert!(matches!(
            f.step(&[Cell::new(1, 4, 0)], &mut out),
            Err(StepError::NoSuchPort { .. })
        ));
        assert_eq!(f.now(), 0);
        assert_eq!(f.counters(), &Counters::default());
    }

    #[test]
    fn figure_11_names() {
        let names: Vec<String> = Architecture::FIGURE_11.iter().map(|a| a.name()).collect();
        assert_eq!(
            names,
            [
                "CPRR", "OQ-xbar", "PIM", "PIM-1", "RRM", "RRM-1", "iSLIP", "iSLIP-1", "DRRM",
                "DRRM-1", "EDRRM", "EDRRM-1"
            ]
        );
    }
}
