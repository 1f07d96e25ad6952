//! A cycle-level simulator of the two pipelines: packets run through dRMT processors fed
//! round-robin, with the memory crossbar, and through an RMT pipe, and are measured in packets
//! per cycle and cycles per packet. What the paper proves, the simulator checks by running:
//! a schedule [`validate`](super::validate) accepts never oversubscribes a processor (Theorem
//! 3.5), one fixed schedule on every processor never asks a table twice in a cycle
//! (Observation 1), and dRMT's throughput is at least RMT's (Theorem 3.3).
//!
//! Time is a cycle counter, never the wall clock: the same inputs give the same report.
//!
//! **dRMT** ([`simulate_drmt`], [`simulate_drmt_with`]): `p` processors, each running a
//! [`Schedule`] of period P. Each cycle `c`:
//!
//! 1. The line offers one packet (`burst` packets in a burst, [`DrmtOptions::burst`]). It goes
//!    to the processor the round-robin pointer names if that processor's previous packet
//!    arrived P or more cycles ago, and the pointer moves on; otherwise it is *not admitted*
//!    (counted) and the pointer waits. With P ≤ p this is line rate, processor `i` taking
//!    arrivals `i, i + p, ...`; with P > p each processor takes one packet every P cycles
//!    (`p / P` packets a cycle), which a pointer moved on every cycle (`c mod p`) would miss
//!    whenever p does not divide P.
//! 2. Every packet a processor holds issues the operations its schedule starts at
//!    `c - arrival`. The simulator checks each processor's cycle against the architecture —
//!    match units ≤ M̄, action fields ≤ Ā, packets issuing matches (and packets issuing
//!    actions) ≤ IPC — and counts each limit exceeded as a resource violation.
//! 3. Each match request crosses the crossbar to the memory cluster holding its table
//!    (clusters = processors; the k-th match's table in cluster k mod p unless
//!    [`DrmtOptions::clusters`] says otherwise). A cluster serves each of its tables once a
//!    cycle: a second request for a table in the same cycle is a contention.
//! 4. Packets whose schedule latency has passed complete and leave; the rest are the threads
//!    in flight.
//!
//! A schedule with P < p is run as given: each processor then sees a packet every p cycles,
//! which the schedule's residue classes mod P do not describe, and step 2 counts what breaks.
//!
//! **RMT** ([`simulate_rmt`]): a pipe of `s` stages, each ΔM + ΔA cycles deep; a packet enters
//! stage 0 in a cycle its entry slot is free, its matches issued at each stage's entry. A
//! program of S stages makes ceil(S / s) passes, recirculating from the last stage to the
//! first ahead of new packets, and leaves after its last pass: the pipe's throughput and
//! latency come from running it, not from the formula. The stage assignment itself is taken
//! as given (the stage count S); there are no resources to check and no crossbar.
//!
//! Throughput, latency and threads are measured over the cycles after the warm-up; resource
//! violations and contentions over the whole run.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;

use super::odg::{Arch, ArchError, Odg, Op};
use super::schedule::Schedule;

/// The most processors, the most slots of an RMT pipe, and the most packets a cycle
/// ([`DrmtOptions::burst`]) a simulation takes: far beyond any switch, small enough that the
/// state fits in memory.
pub const MAX_SIM_UNITS: u64 = 1 << 20;

/// The most cycles a simulation runs ([`SimConfig::cycles`]): 2^32, far beyond the 2·10^8
/// `pfemu experiment pipelines` runs at most, and bounded, so that no configuration (a
/// `cycles` of `u64::MAX`, say) runs for ever. The work is cycles × processors (or pipe
/// slots).
pub const MAX_SIM_CYCLES: u64 = 1 << 32;

/// How long to run and when to start measuring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SimConfig {
    /// Cycles to run, warm-up included: at most [`MAX_SIM_CYCLES`].
    pub cycles: u64,
    /// Cycles run before measuring starts. For a steady state from the first measured cycle,
    /// at least the latency (dRMT) or a whole recirculation cycle (RMT: passes × pipe depth);
    /// for exact counts, a measured window that is a multiple of the period (P, or passes ×
    /// pipe depth).
    pub warmup: u64,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct SimReport {
    /// Cycles measured: the run's cycles less the warm-up.
    pub cycles: u64,
    /// Packets the line offered in the measured cycles.
    pub offered: u64,
    /// Of those, the packets admitted; the rest found their processor (or the pipe's entry)
    /// busy. See [`SimReport::not_admitted`].
    pub admitted: u64,
    /// Packets that completed in the measured cycles.
    pub completed: u64,
    /// `completed / cycles`: packets a cycle.
    pub throughput: f64,
    /// Fewest cycles from arrival to completion, over the completed packets (0 if none).
    pub latency_min: u64,
    /// Mean cycles from arrival to completion (0 if none completed).
    pub latency_mean: f64,
    /// Most cycles from arrival to completion (0 if none completed).
    pub latency_max: u64,
    /// The most packets in flight at once, over the measured cycles.
    pub threads_max: u64,
    /// The mean packets in flight over the measured cycles (at one packet a cycle, the
    /// latency: Little's law).
    pub threads_mean: f64,
    /// The most packets one dRMT processor (one RMT stage) held at once, over the measured
    /// cycles: ceil(latency / P) for a dRMT processor in a steady state, at most ΔM + ΔA for
    /// an RMT stage.
    pub unit_threads_max: u64,
    /// Processor-cycles where a limit (M̄, Ā, IPC of matches, IPC of actions) was exceeded,
    /// one for each limit, over the whole run. Zero for a schedule that
    /// [`validate`](super::validate) accepts (Theorem 3.5). Always 0 for RMT.
    pub resource_violations: u64,
    /// Requests for a table that already had one in the same cycle, over the whole run. Zero
    /// when every processor runs the same schedule on packets arriving one a cycle
    /// (Observation 1). Always 0 for RMT, whose stages own their memories.
    pub contentions: u64,
    /// The most match requests one memory cluster received in one cycle, over the whole run
    /// (dRMT's crossbar; 0 for RMT).
    pub cluster_requests_max: u64,
}

impl SimReport {
    /// Packets offered in the measured cycles but not admitted.
    pub fn not_admitted(&self) -> u64 {
        self.offered - self.admitted
    }
}

/// Departures from the plain dRMT run: where tables live, and arrivals in bursts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct DrmtOptions {
    /// The memory cluster of each match's table, by match (the matches in node order);
    /// empty: the k-th match's table in cluster k mod p.
    pub clusters: Vec<usize>,
    /// Packets the line offers each cycle, 1 to [`MAX_SIM_UNITS`]. Observation 1 assumes one: two
    /// packets arriving in the same cycle at two processors ask for the same tables in the
    /// same cycles.
    pub burst: u64,
}

impl Default for DrmtOptions {
    fn default() -> Self {
        DrmtOptions {
            clusters: Vec::new(),
            burst: 1,
        }
    }
}

/// Why a simulation was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimError {
    /// The architecture fails [`Arch::check`].
    Arch(ArchError),
    /// `cycles` is above [`MAX_SIM_CYCLES`] (the value given).
    TooManyCycles(u64),
    /// `cycles` is not more than `warmup`: nothing would be measured.
    NoWindow {
        /// The cycles asked for.
        cycles: u64,
        /// The warm-up asked for.
        warmup: u64,
    },
    /// A count that must be at least 1 is 0: `processors`, `stages`, `needed_stages`, `burst`,
    /// or the RMT stage's depth ΔM + ΔA.
    Zero(&'static str),
    /// A count beyond [`MAX_SIM_UNITS`]: `processors`, or the RMT pipe's slots (stages × (ΔM +
    /// ΔA)).
    TooLarge {
        /// The setting.
        setting: &'static str,
        /// Its value.
        value: u64,
    },
    /// Schedules given neither one for all processors nor one per processor.
    ScheduleCount {
        /// Schedules given.
        given: usize,
        /// Processors.
        processors: u64,
    },
    /// Schedule `index` does not fit the graph: a start per node and a period of at least 1.
    ScheduleShape {
        /// Which schedule (0 when one is shared).
        index: usize,
        /// Its starts.
        starts: usize,
        /// The graph's nodes.
        nodes: usize,
        /// Its period.
        period: u64,
    },
    /// `DrmtOptions::clusters` does not give one cluster per match.
    ClusterCount {
        /// Clusters given.
        given: usize,
        /// Matches in the graph.
        matches: usize,
    },
    /// A table placed in a cluster that does not exist (clusters = processors).
    NoSuchCluster {
        /// The match node whose table it is.
        table: String,
        /// The cluster given.
        cluster: usize,
        /// Clusters there are.
        clusters: u64,
    },
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Arch(e) => write!(f, "{e}"),
            SimError::TooManyCycles(cycles) => write!(
                f,
                "cycles is {cycles}, more than the {MAX_SIM_CYCLES} (MAX_SIM_CYCLES) a run may take"
            ),
            SimError::NoWindow { cycles, warmup } => write!(
                f,
                "cycles ({cycles}) must exceed warmup ({warmup}): nothing would be measured"
            ),
            SimError::Zero(setting) => write!(f, "{setting} must be at least 1"),
            SimError::TooLarge { setting, value } => write!(
                f,
                "{setting} is {value}, more than the {MAX_SIM_UNITS} the simulator holds"
            ),
            SimError::ScheduleCount { given, processors } => write!(
                f,
                "schedules: {given} given, for {processors} processors (give one, or one each)"
            ),
            SimError::ScheduleShape {
                index,
                starts,
                nodes,
                period,
            } => write!(
                f,
                "schedule {index} gives {starts} starts with period {period}, for {nodes} \
                 nodes (a start per node and a period of at least 1)"
            ),
            SimError::ClusterCount { given, matches } => write!(
                f,
                "clusters: {given} given, for {matches} matches (give one per match, or none)"
            ),
            SimError::NoSuchCluster {
                table,
                cluster,
                clusters,
            } => write!(
                f,
                "clusters: `{table}`'s table in cluster {cluster}, of {clusters} \
                 (one per processor)"
            ),
        }
    }
}

impl std::error::Error for SimError {}

impl SimConfig {
    /// The warm-up and the end, checked.
    fn window(&self) -> Result<(u64, u64), SimError> {
        if self.cycles > MAX_SIM_CYCLES {
            return Err(SimError::TooManyCycles(self.cycles));
        }
        if self.cycles <= self.warmup {
            return Err(SimError::NoWindow {
                cycles: self.cycles,
                warmup: self.warmup,
            });
        }
        Ok((self.warmup, self.cycles))
    }
}

/// Everything measured over the window, and what the whole run counts.
struct Tally {
    warmup: u64,
    end: u64,
    offered: u64,
    admitted: u64,
    completed: u64,
    latency_min: u64,
    latency_sum: u128,
    latency_max: u64,
    threads_max: u64,
    threads_sum: u128,
    unit_threads_max: u64,
    resource_violations: u64,
    contentions: u64,
    cluster_requests_max: u64,
}

impl Tally {
    fn new(warmup: u64, end: u64) -> Tally {
        Tally {
            warmup,
            end,
            offered: 0,
            admitted: 0,
            completed: 0,
            latency_min: u64::MAX,
            latency_sum: 0,
            latency_max: 0,
            threads_max: 0,
            threads_sum: 0,
            unit_threads_max: 0,
            resource_violations: 0,
            contentions: 0,
            cluster_requests_max: 0,
        }
    }

    fn measuring(&self, cycle: u64) -> bool {
        (self.warmup..self.end).contains(&cycle)
    }

    /// A packet that arrived at `arrival` completed at `done`.
    fn complete(&mut self, arrival: u64, done: u64) {
        if self.measuring(done) {
            let latency = done - arrival;
            self.completed += 1;
            self.latency_min = self.latency_min.min(latency);
            self.latency_max = self.latency_max.max(latency);
            self.latency_sum += u128::from(latency);
        }
    }

    /// `threads` packets in flight at the end of `cycle`.
    fn threads(&mut self, cycle: u64, threads: u64) {
        if self.measuring(cycle) {
            self.threads_max = self.threads_max.max(threads);
            self.threads_sum += u128::from(threads);
        }
    }

    fn report(self) -> SimReport {
        let cycles = self.end - self.warmup;
        let done = self.completed.max(1) as f64;
        SimReport {
            cycles,
            offered: self.offered,
            admitted: self.admitted,
            completed: self.completed,
            throughput: self.completed as f64 / cycles as f64,
            latency_min: if self.completed == 0 {
                0
            } else {
                self.latency_min
            },
            latency_mean: self.latency_sum as f64 / done,
            latency_max: self.latency_max,
            threads_max: self.threads_max,
            threads_mean: self.threads_sum as f64 / cycles as f64,
            unit_threads_max: self.unit_threads_max,
            resource_violations: self.resource_violations,
            contentions: self.contentions,
            cluster_requests_max: self.cluster_requests_max,
        }
    }
}

/// The operations a schedule starts at one offset from a packet's arrival.
struct Step {
    offset: u64,
    /// Match units and action fields, summed in u64: exact for any graph.
    units: u64,
    fields: u64,
    matches: bool,
    actions: bool,
    /// The match nodes started, as a range of [`Plan::tables`].
    tables: Range<usize>,
}

/// A schedule compiled for running: its steps in order of offset.
struct Plan {
    period: u64,
    latency: u64,
    steps: Vec<Step>,
    tables: Vec<usize>,
}

impl Plan {
    fn new(odg: &Odg, arch: &Arch, schedule: &Schedule) -> Plan {
        let mut order: Vec<usize> = (0..odg.nodes().len()).collect();
        order.sort_by_key(|&v| (schedule.start[v], v));
        let mut steps: Vec<Step> = Vec::new();
        let mut tables = Vec::new();
        let mut latency = 0u64;
        for v in order {
            let offset = schedule.start[v];
            latency = latency.max(offset.saturating_add(odg.latency(arch, v)));
            if steps.last().is_none_or(|s| s.offset != offset) {
                steps.push(Step {
                    offset,
                    units: 0,
                    fields: 0,
                    matches: false,
                    actions: false,
                    tables: tables.len()..tables.len(),
                });
            }
            let Some(step) = steps.last_mut() else {
                continue;
            };
            match odg.nodes()[v].op {
                Op::Match { key_bits, .. } => {
                    step.units += u64::from(arch.match_units(key_bits));
                    step.matches = true;
                    tables.push(v);
                    step.tables.end = tables.len();
                }
                Op::Action { fields } => {
                    step.fields += u64::from(fields);
                    step.actions = true;
                }
            }
        }
        Plan {
            period: schedule.period,
            latency,
            steps,
            tables,
        }
    }
}

/// A packet on a dRMT processor.
struct Packet {
    arrival: u64,
    /// The next step of its plan to issue.
    next: usize,
}

/// A dRMT processor: the plan it runs and the packets it holds, oldest first.
struct Processor {
    plan: usize,
    last_arrival: Option<u64>,
    packets: VecDeque<Packet>,
}

/// Runs `odg` on `processors` dRMT processors that all run `schedule`, fed one packet a
/// cycle round-robin, for `config.cycles` cycles. See the module's doc for the steps of a
/// cycle and [`SimReport`] for what is measured.
///
/// Figure 5's schedule with its no-op, on two processors: one packet a cycle, 7 cycles each,
/// so 7 in flight.
///
/// ```
/// use pfemu::pipeline::{examples::figure_5, simulate_drmt, Schedule, SimConfig};
///
/// let (odg, arch) = figure_5();
/// let schedule = Schedule { period: 2, start: vec![0, 0, 3, 3, 5, 5, 6] };
/// let config = SimConfig { cycles: 1007, warmup: 7 };
/// let report = simulate_drmt(&odg, &arch, &schedule, 2, &config)?;
/// assert_eq!((report.completed, report.throughput), (1000, 1.0));
/// assert_eq!((report.latency_max, report.threads_max), (7, 7));
/// assert_eq!((report.resource_violations, report.contentions), (0, 0));
/// # Ok::<(), pfemu::pipeline::SimError>(())
/// ```
pub fn simulate_drmt(
    odg: &Odg,
    arch: &Arch,
    schedule: &Schedule,
    processors: u64,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    simulate_drmt_with(
        odg,
        arch,
        std::slice::from_ref(schedule),
        processors,
        &DrmtOptions::default(),
        config,
    )
}

/// [`simulate_drmt`] with one schedule for all processors or one per processor
/// (`schedules[i]` on processor `i`), and `options` placing the tables and offering packets
/// in bursts. Schedules that differ, even each valid on its own, void Observation 1: the
/// crossbar then counts contentions.
pub fn simulate_drmt_with(
    odg: &Odg,
    arch: &Arch,
    schedules: &[Schedule],
    processors: u64,
    options: &DrmtOptions,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    arch.check().map_err(SimError::Arch)?;
    let (warmup, end) = config.window()?;
    if processors == 0 {
        return Err(SimError::Zero("processors"));
    }
    if processors > MAX_SIM_UNITS {
        return Err(SimError::TooLarge {
            setting: "processors",
            value: processors,
        });
    }
    if options.burst == 0 {
        return Err(SimError::Zero("burst"));
    }
    if options.burst > MAX_SIM_UNITS {
        // More packets a cycle than processors could ever take; and the offered count
        // must not overflow.
        return Err(SimError::TooLarge {
            setting: "burst",
            value: options.burst,
        });
    }
    if schedules.len() != 1 && schedules.len() as u64 != processors {
        return Err(SimError::ScheduleCount {
            given: schedules.len(),
            processors,
        });
    }
    let nodes = odg.nodes().len();
    for (index, s) in schedules.iter().enumerate() {
        if s.period == 0 || s.start.len() != nodes {
            return Err(SimError::ScheduleShape {
                index,
                starts: s.start.len(),
                nodes,
                period: s.period,
            });
        }
    }
    let cluster_of = clusters(odg, processors, &options.clusters)?;
    let plans: Vec<Plan> = schedules.iter().map(|s| Plan::new(odg, arch, s)).collect();
    let mut cpus: Vec<Processor> = (0..processors as usize)
        .map(|i| Processor {
            plan: if plans.len() == 1 { 0 } else { i },
            last_arrival: None,
            packets: VecDeque::new(),
        })
        .collect();
    // The cycle each table was last asked for, and each cluster's requests this cycle.
    let mut table_asked = vec![u64::MAX; nodes];
    let mut cluster_cycle = vec![u64::MAX; processors as usize];
    let mut cluster_requests = vec![0u64; processors as usize];
    let mut next_cpu = 0usize;
    let mut tally = Tally::new(warmup, end);
    for cycle in 0..end {
        // 1. Arrivals, round-robin; the pointer waits on a busy processor.
        if tally.measuring(cycle) {
            tally.offered += options.burst;
        }
        for _ in 0..options.burst {
            let cpu = &mut cpus[next_cpu];
            let period = plans[cpu.plan].period;
            if cpu.last_arrival.is_some_and(|last| cycle - last < period) {
                break;
            }
            cpu.last_arrival = Some(cycle);
            cpu.packets.push_back(Packet {
                arrival: cycle,
                next: 0,
            });
            if tally.measuring(cycle) {
                tally.admitted += 1;
            }
            next_cpu = (next_cpu + 1) % cpus.len();
        }
        let mut threads = 0u64;
        for cpu in &mut cpus {
            let plan = &plans[cpu.plan];
            // 2. Issue what each packet's schedule starts now, and check the processor.
            let (mut units, mut fields, mut matching, mut acting) = (0u64, 0u64, 0u32, 0u32);
            for packet in &mut cpu.packets {
                let Some(step) = plan.steps.get(packet.next) else {
                    continue;
                };
                if packet.arrival.saturating_add(step.offset) != cycle {
                    continue;
                }
                packet.next += 1;
                units = units.saturating_add(step.units);
                fields = fields.saturating_add(step.fields);
                matching += u32::from(step.matches);
                acting += u32::from(step.actions);
                // 3. Through the crossbar to each table's cluster.
                for &table in &plan.tables[step.tables.clone()] {
                    if table_asked[table] == cycle {
                        tally.contentions += 1;
                    }
                    table_asked[table] = cycle;
                    let cluster = cluster_of[table];
                    if cluster_cycle[cluster] != cycle {
                        cluster_cycle[cluster] = cycle;
                        cluster_requests[cluster] = 0;
                    }
                    cluster_requests[cluster] += 1;
                    tally.cluster_requests_max =
                        tally.cluster_requests_max.max(cluster_requests[cluster]);
                }
            }
            tally.resource_violations += u64::from(units > u64::from(arch.match_capacity))
                + u64::from(fields > u64::from(arch.action_capacity))
                + u64::from(matching > arch.ipc)
                + u64::from(acting > arch.ipc);
            // 4. Completions: every packet on a processor has the same latency, so the
            // oldest leave first.
            while let Some(packet) = cpu.packets.front() {
                let done = packet.arrival.saturating_add(plan.latency);
                if done > cycle {
                    break;
                }
                tally.complete(packet.arrival, done);
                cpu.packets.pop_front();
            }
            let held = cpu.packets.len() as u64;
            if tally.measuring(cycle) {
                tally.unit_threads_max = tally.unit_threads_max.max(held);
            }
            threads += held;
        }
        tally.threads(cycle, threads);
    }
    Ok(tally.report())
}

/// Each node's memory cluster (matches only; actions get 0, never read).
fn clusters(odg: &Odg, processors: u64, given: &[usize]) -> Result<Vec<usize>, SimError> {
    let matches: Vec<usize> = (0..odg.nodes().len())
        .filter(|&v| matches!(odg.nodes()[v].op, Op::Match { .. }))
        .collect();
    if !given.is_empty() && given.len() != matches.len() {
        return Err(SimError::ClusterCount {
            given: given.len(),
            matches: matches.len(),
        });
    }
    let mut cluster_of = vec![0usize; odg.nodes().len()];
    for (k, &v) in matches.iter().enumerate() {
        let cluster = given.get(k).copied().unwrap_or(k % processors as usize);
        if cluster as u64 >= processors {
            return Err(SimError::NoSuchCluster {
                table: odg.nodes()[v].name.clone(),
                cluster,
                clusters: processors,
            });
        }
        cluster_of[v] = cluster;
    }
    Ok(cluster_of)
}

/// A packet in the RMT pipe.
#[derive(Clone, Copy)]
struct InPipe {
    arrival: u64,
    passes: u32,
}

/// Runs a program of `needed_stages` stages through an RMT pipe of `stages` stages, each
/// `arch.match_latency + arch.action_latency` cycles deep, offered one packet a cycle, for
/// `config.cycles` cycles. A packet makes ceil(needed_stages / stages) passes, recirculating
/// ahead of new packets; a new packet is admitted in a cycle the pipe's entry is free.
///
/// A program of 10 stages on a pipe of 4 makes 3 passes: one packet every 3 cycles.
///
/// ```
/// use pfemu::pipeline::{simulate_rmt, Arch, SimConfig};
///
/// let pass = 4 * (Arch::RMT.match_latency + Arch::RMT.action_latency);
/// let config = SimConfig { cycles: 3 * pass * 11, warmup: 3 * pass };
/// let report = simulate_rmt(10, 4, &Arch::RMT, &config)?;
/// assert_eq!(report.completed * 3, report.cycles);
/// assert_eq!(report.latency_max, 3 * pass);
/// # Ok::<(), pfemu::pipeline::SimError>(())
/// ```
pub fn simulate_rmt(
    needed_stages: u32,
    stages: u32,
    arch: &Arch,
    config: &SimConfig,
) -> Result<SimReport, SimError> {
    arch.check().map_err(SimError::Arch)?;
    let (warmup, end) = config.window()?;
    if needed_stages == 0 {
        return Err(SimError::Zero("needed_stages"));
    }
    if stages == 0 {
        return Err(SimError::Zero("stages"));
    }
    let depth = arch.match_latency.saturating_add(arch.action_latency);
    if depth == 0 {
        return Err(SimError::Zero("stage depth (match + action latency)"));
    }
    let slots = u64::from(stages).saturating_mul(depth);
    if slots > MAX_SIM_UNITS {
        return Err(SimError::TooLarge {
            setting: "pipe slots (stages x stage depth)",
            value: slots,
        });
    }
    let passes = needed_stages.div_ceil(stages);
    // The pipe as a ring: the packet in slot j at cycle c is (c - j) mod slots cycles past
    // stage 0's entry, so slot c mod slots is the entry, where a pass ends and the next begins.
    let mut ring: Vec<Option<InPipe>> = vec![None; slots as usize];
    let mut held = vec![0u64; stages as usize];
    let mut threads = 0u64;
    let mut tally = Tally::new(warmup, end);
    let s = stages as u64;
    for cycle in 0..end {
        // Every packet moves one cycle on: those reaching a stage's entry change stage (the
        // one at stage 0's entry came from the last stage).
        for k in 0..s {
            let slot = (cycle % slots + slots - k * depth) % slots;
            if ring[slot as usize].is_some() {
                held[k as usize] += 1;
                held[((k + s - 1) % s) as usize] -= 1;
            }
        }
        let entry = (cycle % slots) as usize;
        if let Some(packet) = &mut ring[entry] {
            packet.passes += 1;
            if packet.passes == passes {
                tally.complete(packet.arrival, cycle);
                ring[entry] = None;
                held[0] -= 1;
                threads -= 1;
            }
        }
        if tally.measuring(cycle) {
            tally.offered += 1;
        }
        if ring[entry].is_none() {
            ring[entry] = Some(InPipe {
                arrival: cycle,
                passes: 0,
            });
            held[0] += 1;
            threads += 1;
            if tally.measuring(cycle) {
                tally.admitted += 1;
            }
        }
        if tally.measuring(cycle) {
            let most = held.iter().copied().max().unwrap_or(0);
            tally.unit_threads_max = tally.unit_threads_max.max(most);
        }
        tally.threads(cycle, threads);
    }
    Ok(tally.report())
}

#[cfg(test)]
mod tests {
    use super::super::examples::figure_5;
    use super::super::{list_schedule, validate};
    use super::*;

    /// Figure 5 with the no-op: P = 2, latency 7.
    fn fixed() -> Schedule {
        Schedule {
            period: 2,
            start: vec![0, 0, 3, 3, 5, 5, 6],
        }
    }

    #[test]
    fn figure_5_runs_at_line_rate_on_two_processors() {
        let (odg, arch) = figure_5();
        let config = SimConfig {
            cycles: 1008,
            warmup: 8,
        };
        let r = simulate_drmt(&odg, &arch, &fixed(), 2, &config).unwrap();
        assert_eq!(r.cycles, 1000);
        assert_eq!((r.offered, r.admitted, r.completed), (1000, 1000, 1000));
        assert_eq!(r.throughput, 1.0);
        assert_eq!((r.latency_min, r.latency_max), (7, 7));
        assert_eq!(r.latency_mean, 7.0);
        // Little's law: one packet a cycle for 7 cycles each.
        assert_eq!((r.threads_max, r.threads_mean), (7, 7.0));
        assert_eq!(r.unit_threads_max, 4, "ceil(7 / 2) packets a processor");
        assert_eq!((r.resource_violations, r.contentions), (0, 0));
        // Each cycle one processor asks for M0 and M1 (clusters 0 and 1) for its newest packet
        // and the other for M2 and M3 (clusters 0 and 1 again) for one three cycles older:
        // the crossbar brings each cluster two requests, for two different tables.
        assert_eq!(r.cluster_requests_max, 2);
    }

    #[test]
    fn one_processor_takes_one_packet_a_period() {
        let (odg, arch) = figure_5();
        let config = SimConfig {
            cycles: 1008,
            warmup: 8,
        };
        let r = simulate_drmt(&odg, &arch, &fixed(), 1, &config).unwrap();
        assert_eq!((r.offered, r.admitted, r.completed), (1000, 500, 500));
        assert_eq!(r.not_admitted(), 500);
        assert_eq!(r.throughput, 0.5);
        assert_eq!((r.resource_violations, r.contentions), (0, 0));
    }

    #[test]
    fn the_naive_schedule_oversubscribes_the_processor() {
        let (odg, arch) = figure_5();
        let naive = Schedule {
            period: 2,
            start: vec![0, 0, 2, 2, 4, 4, 5],
        };
        assert!(validate(&odg, &arch, &naive).is_err());
        let config = SimConfig {
            cycles: 106,
            warmup: 6,
        };
        let r = simulate_drmt(&odg, &arch, &naive, 2, &config).unwrap();
        // From cycle 2 on, each processor's every other cycle starts M0, M1 for one packet and
        // M2, M3 for the one before: four units against M = 2, two packets against IPC 1.
        assert!(r.resource_violations > 0, "{r:?}");
        assert_eq!(
            r.contentions, 0,
            "the same schedule everywhere still never contends"
        );
    }

    #[test]
    fn shifted_schedules_contend_and_bursts_contend() {
        let (odg, arch) = figure_5();
        let config = SimConfig {
            cycles: 108,
            warmup: 8,
        };
        // Processor 1 starts everything a cycle late: valid on its own, but its packets, a
        // cycle behind processor 0's, now ask for the tables in the same cycles.
        let mut late = fixed();
        late.start.iter_mut().for_each(|t| *t += 1);
        assert_eq!(validate(&odg, &arch, &late), Ok(()));
        let r = simulate_drmt_with(
            &odg,
            &arch,
            &[fixed(), late],
            2,
            &DrmtOptions::default(),
            &config,
        )
        .unwrap();
        assert_eq!(r.resource_violations, 0);
        assert!(r.contentions > 0, "{r:?}");
        // Two packets a cycle: both processors take one in the same cycle.
        let burst = DrmtOptions {
            burst: 2,
            ..DrmtOptions::default()
        };
        let r = simulate_drmt_with(&odg, &arch, &[fixed()], 2, &burst, &config).unwrap();
        assert_eq!((r.offered, r.admitted), (200, 100));
        assert_eq!(r.resource_violations, 0);
        assert!(r.contentions > 0, "{r:?}");
    }

    #[test]
    fn a_period_below_the_processors_breaks_the_classes() {
        // P = 2 on three processors: packets come every 3 cycles, and mod 3 the four matches
        // at 0 and 3 share a class.
        let (odg, arch) = figure_5();
        let config = SimConfig {
            cycles: 100,
            warmup: 10,
        };
        let r = simulate_drmt(&odg, &arch, &fixed(), 3, &config).unwrap();
        assert!(r.resource_violations > 0);
    }

    #[test]
    fn the_list_schedule_runs_at_one_packet_a_period_per_processor() {
        let (odg, arch) = figure_5();
        for period in 2..6 {
            let s = list_schedule(&odg, &arch, period)
                .expect("every node fits a class")
                .expect("a schedule");
            let latency = s.latency(&odg, &arch);
            for processors in 1..=period {
                let config = SimConfig {
                    cycles: latency + 60 * period,
                    warmup: latency,
                };
                let r = simulate_drmt(&odg, &arch, &s, processors, &config).unwrap();
                assert_eq!(r.completed, 60 * processors, "P {period}, p {processors}");
                assert_eq!(r.admitted, 60 * processors);
                assert_eq!((r.resource_violations, r.contentions), (0, 0));
            }
        }
    }

    #[test]
    fn rmt_recirculates_past_its_stages() {
        let arch = Arch::RMT;
        // S = 10: 1 pass on 10 stages, 2 on 5, 3 on 4.
        for (stages, passes) in [(10u32, 1u64), (5, 2), (4, 3)] {
            let round = passes * u64::from(stages) * 20;
            let config = SimConfig {
                cycles: round * 11,
                warmup: round,
            };
            let r = simulate_rmt(10, stages, &arch, &config).unwrap();
            assert_eq!(r.completed * passes, r.cycles, "{stages} stages");
            assert_eq!((r.latency_min, r.latency_max), (round, round));
            // The pipe is full: one packet in every slot, ΔM + ΔA in every stage.
            assert_eq!(r.threads_max, u64::from(stages) * 20);
            assert_eq!(r.threads_mean, (u64::from(stages) * 20) as f64);
            assert_eq!(r.unit_threads_max, 20);
            assert_eq!(r.admitted, r.completed);
        }
    }

    #[test]
    fn bad_input_is_refused() {
        let (odg, arch) = figure_5();
        let ok = SimConfig {
            cycles: 10,
            warmup: 1,
        };
        let run = |s: &Schedule, p, config| simulate_drmt(&odg, &arch, s, p, config);
        assert_eq!(
            run(&fixed(), 0, &ok).unwrap_err(),
            SimError::Zero("processors")
        );
        assert!(matches!(
            run(
                &fixed(),
                2,
                &SimConfig {
                    cycles: 5,
                    warmup: 5
                }
            ),
            Err(SimError::NoWindow { .. })
        ));
        let short = Schedule {
            period: 2,
            start: vec![0; 3],
        };
        assert!(matches!(
            run(&short, 2, &ok),
            Err(SimError::ScheduleShape { starts: 3, .. })
        ));
        let zero = Schedule {
            period: 0,
            ..fixed()
        };
        assert!(matches!(
            run(&zero, 2, &ok),
            Err(SimError::ScheduleShape { period: 0, .. })
        ));
        assert!(matches!(
            run(&fixed(), u64::MAX, &ok),
            Err(SimError::TooLarge { .. })
        ));
        // A run that would not end: refused, naming the setting, before any cycle (one
        // cycle of it would be a report, not an error).
        for cycles in [MAX_SIM_CYCLES + 1, u64::MAX] {
            let forever = SimConfig { cycles, warmup: 0 };
            let err = simulate_drmt(&odg, &arch, &fixed(), 2, &forever).unwrap_err();
            assert_eq!(err, SimError::TooManyCycles(cycles));
            assert!(err.to_string().starts_with(&format!("cycles is {cycles}")));
            assert_eq!(
                simulate_rmt(3, 3, &arch, &forever),
                Err(SimError::TooManyCycles(cycles))
            );
        }
        let sim = |schedules: &[Schedule], options: &DrmtOptions| {
            simulate_drmt_with(&odg, &arch, schedules, 3, options, &ok)
        };
        assert!(matches!(
            sim(&[fixed(), fixed()], &DrmtOptions::default()),
            Err(SimError::ScheduleCount { given: 2, .. })
        ));
        let bad = |clusters: Vec<usize>| DrmtOptions {
            clusters,
            ..DrmtOptions::default()
        };
        assert!(matches!(
            sim(&[fixed()], &bad(vec![0])),
            Err(SimError::ClusterCount {
                given: 1,
                matches: 4
            })
        ));
        assert!(matches!(
            sim(&[fixed()], &bad(vec![0, 1, 2, 3])),
            Err(SimError::NoSuchCluster { cluster: 3, .. })
        ));
        assert_eq!(
            sim(
                &[fixed()],
                &DrmtOptions {
                    burst: 0,
                    ..DrmtOptions::default()
                }
            )
            .unwrap_err(),
            SimError::Zero("burst")
        );
        assert_eq!(
            sim(
                &[fixed()],
                &DrmtOptions {
                    burst: u64::MAX,
                    ..DrmtOptions::default()
                }
            )
            .unwrap_err(),
            SimError::TooLarge {
                setting: "burst",
                value: u64::MAX
            }
        );
        assert_eq!(
            simulate_rmt(0, 4, &Arch::RMT, &ok).unwrap_err(),
            SimError::Zero("needed_stages")
        );
        assert_eq!(
            simulate_rmt(4, 0, &Arch::RMT, &ok).unwrap_err(),
            SimError::Zero("stages")
        );
        let flat = Arch {
            match_latency: 0,
            action_latency: 0,
            ..Arch::RMT
        };
        assert!(matches!(
            simulate_rmt(4, 4, &flat, &ok),
            Err(SimError::Zero(_))
        ));
        assert!(matches!(
            simulate_rmt(4, u32::MAX, &Arch::RMT, &ok),
            Err(SimError::TooLarge { .. })
        ));
        // Every refusal says which setting.
        assert!(SimError::Zero("stages").to_string().contains("stages"));
    }
}
