//! `pfemu experiment pipelines`: the dRMT paper's evaluation (Chole et al., SIGCOMM 2017,
//! §4) on pfemu's own programs and on 100 seeded random operation dependency graphs, with
//! pfemu's run-to-completion PFE beside the two pipelines.
//!
//! For each graph: the RMT stages a program needs (whole tables per stage, and fine-grained
//! with a table's match and action split), the dRMT processors for one packet per cycle with
//! IPC 1 and 2 (the list scheduler, then the paper's ILP seeded by it), and dRMT's lower bound;
//! each architecture's latency and the threads it holds at one packet per cycle (equal to the
//! latency, by Little's law). For the shipped programs, also pfemu's instructions and XTXNs
//! per packet and the threads a PFE needs at that rate, and throughput as processors shrink,
//! measured by the cycle-level simulator: RMT's cliff against dRMT's graceful decline.
//!
//! Every schedule is checked by the validator before it counts, and every simulated
//! throughput against the one the schedule promises.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use super::experiments::{Claim, ExperimentError, Figure};
use super::plot::{self, Line, Panel, Panels, Series};
use super::PlotError;
use crate::pipeline::{
    self, assign_stages, examples, fewest_processors, heuristic_schedule, ilp_fewest_processors,
    list_schedule, lower_bound, rmt_throughput, simulate_drmt, simulate_rmt, validate,
    validate_stages, Arch, Granularity, IlpOptions, IlpStatus, Odg, Op, Schedule, SimConfig,
};

mod pfe;

pub use pfe::{pfe_profile, PfeProfile};

/// The experiment's settings. As command-line options, those of `pfemu experiment pipelines`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct PipelinesConfig {
    /// Random graphs to evaluate (the paper: 100).
    #[arg(long, default_value_t = PipelinesConfig::default().graphs, help = "Random ODGs to evaluate (0 to 10000)")]
    pub graphs: u32,
    /// Table slots per random graph, before conditions are contracted.
    #[arg(long, default_value_t = PipelinesConfig::default().slots, help = "Table slots per random ODG (2 to 200)")]
    pub slots: usize,
    /// Seed of the random graphs: graph i is `examples::random(seed + i, slots)`.
    #[arg(long, default_value_t = PipelinesConfig::default().seed, help = "Seed of the random ODGs")]
    pub seed: u64,
    /// Largest processor count (and dRMT period) searched.
    #[arg(long, default_value_t = PipelinesConfig::default().max_processors, help = "Most processors (dRMT period) searched, 1 to 1024")]
    pub max_processors: u64,
    /// An optional wall-clock guard on the ILP per period tried, seconds (`None`: none, the
    /// default). Where it strikes depends on the machine and its load: the output names the
    /// solves it stopped ("time limit"), whose results another run may not repeat.
    #[arg(
        long = "ilp-time-limit",
        value_name = "SECONDS",
        help = "Optional wall-clock guard on the ILP per period tried, in seconds, above 0 and at most 3600 (default: none); where it strikes depends on the machine, so the output may differ from run to run"
    )]
    pub ilp_time_limit: Option<f64>,
    /// Branch-and-bound nodes each ILP solve may explore: the ILP's budget, counted in work,
    /// so the run gives the same output on any machine. 0 runs the heuristics only.
    #[arg(long = "ilp-node-limit", value_name = "NODES", default_value_t = PipelinesConfig::default().ilp_node_limit,
          help = "Branch-and-bound nodes each ILP solve may explore, 0 to 10^9 (0: the heuristics only); the same output on any machine")]
    pub ilp_node_limit: u64,
    /// Random graphs (the first ones) the ILP also runs on; the rest get the heuristics only.
    #[arg(long = "ilp-graphs", default_value_t = PipelinesConfig::default().ilp_graphs,
          help = "Random ODGs the ILP also runs on (the first ones; the programs always get it)")]
    pub ilp_graphs: u32,
    /// More programs, each an ODG described in a JSON file (see the README).
    #[arg(
        long = "odg",
        value_name = "FILE",
        help = "Also evaluate the program described in FILE (JSON; repeatable)"
    )]
    pub odg: Vec<PathBuf>,
    /// Cycles an XTXN keeps a PFE thread waiting, for the PFE's threads at line rate.
    #[arg(long, default_value_t = PipelinesConfig::default().xtxn_latency, help = "Cycles a PFE thread waits on one XTXN (the PFE's latency model)")]
    pub xtxn_latency: u64,
    /// Cycles each throughput point is simulated.
    #[arg(long, default_value_t = PipelinesConfig::default().sim_cycles, help = "Cycles each throughput point is simulated, after a warm-up of as many")]
    pub sim_cycles: u64,
    /// Threads the graphs are evaluated on.
    #[arg(long, default_value_t = PipelinesConfig::default().threads, hide_default_value = true,
          help = "Threads the graphs are evaluated on [default: available cores]")]
    pub threads: usize,
}

impl Default for PipelinesConfig {
    /// 100 graphs of 20 slots from seed 1, up to 64 processors, the ILP on the first 20 with
    /// [`DEFAULT_NODE_LIMIT`](crate::pipeline::DEFAULT_NODE_LIMIT) branch-and-bound nodes per
    /// solve and no time limit, XTXNs of 22 cycles (dRMT's ΔM: a trip through a crossbar to
    /// memory), 20000 simulated cycles.
    fn default() -> Self {
        PipelinesConfig {
            graphs: 100,
            slots: 20,
            seed: 1,
            max_processors: 64,
            ilp_time_limit: None,
            ilp_node_limit: pipeline::DEFAULT_NODE_LIMIT,
            ilp_graphs: 20,
            odg: Vec::new(),
            xtxn_latency: 22,
            sim_cycles: 20_000,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

fn bad<T>(option: &'static str, reason: String) -> Result<T, ExperimentError> {
    Err(ExperimentError::Option { option, reason })
}

impl PipelinesConfig {
    /// Checks the settings, naming the option at fault.
    pub fn check(&self) -> Result<(), ExperimentError> {
        if self.graphs > 10_000 {
            return bad("--graphs", format!("{}: at most 10000", self.graphs));
        }
        if !(2..=200).contains(&self.slots) {
            return bad("--slots", format!("{}: 2 to 200", self.slots));
        }
        if !(1..=1024).contains(&self.max_processors) {
            return bad(
                "--max-processors",
                format!("{}: 1 to 1024", self.max_processors),
            );
        }
        if let Some(t) = self.ilp_time_limit.filter(|t| !(*t > 0.0 && *t <= 3600.0)) {
            return bad(
                "--ilp-time-limit",
                format!(
                    "{t}: above 0, at most 3600 seconds (--ilp-node-limit 0 runs the \
                     heuristics only)"
                ),
            );
        }
        if self.ilp_node_limit > 1_000_000_000 {
            return bad(
                "--ilp-node-limit",
                format!("{}: 0 to 10^9 nodes", self.ilp_node_limit),
            );
        }
        if self.xtxn_latency > 1_000_000 {
            return bad(
                "--xtxn-latency",
                format!("{}: at most 1000000", self.xtxn_latency),
            );
        }
        if !(1..=100_000_000).contains(&self.sim_cycles) {
            return bad("--sim-cycles", format!("{}: 1 to 10^8", self.sim_cycles));
        }
        if !(1..=1024).contains(&self.threads) {
            return bad("--threads", format!("{}: 1 to 1024", self.threads));
        }
        Ok(())
    }
}

/// The five columns of the paper's comparison: four architectures and dRMT's lower bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Architecture {
    /// RMT: a table's match and action in one stage.
    #[serde(rename = "RMT")]
    Rmt,
    /// Fine-grained RMT: a table's match and action may sit in different stages.
    #[serde(rename = "RMT fine")]
    RmtFine,
    /// dRMT with inter-packet concurrency 1.
    #[serde(rename = "dRMT IPC 1")]
    Drmt1,
    /// dRMT with inter-packet concurrency 2.
    #[serde(rename = "dRMT IPC 2")]
    Drmt2,
    /// dRMT's lower bound on Table 1's dRMT processor (Ā = 32, ΔM = 22): the bottleneck
    /// resource fully used, the critical path. It bounds the dRMT columns only: an RMT stage
    /// has other parameters (Ā = 224, ΔM = 18), so RMT may need fewer stages than this
    /// bound's processors (an action of 40 fields) or less latency (l3fwd: 60 against 68).
    #[serde(rename = "dRMT bound")]
    DrmtBound,
}

impl Architecture {
    /// All five, in the paper's order.
    pub const ALL: [Architecture; 5] = [
        Architecture::Rmt,
        Architecture::RmtFine,
        Architecture::Drmt1,
        Architecture::Drmt2,
        Architecture::DrmtBound,
    ];

    /// As the paper names it.
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Rmt => "RMT",
            Architecture::RmtFine => "RMT fine",
            Architecture::Drmt1 => "dRMT IPC 1",
            Architecture::Drmt2 => "dRMT IPC 2",
            Architecture::DrmtBound => "dRMT bound",
        }
    }
}

/// One graph on one architecture.
#[derive(Clone, Debug, Serialize)]
pub struct Placement {
    /// Which.
    pub architecture: Architecture,
    /// Stages (RMT) or processors (dRMT, the period P) for one packet per cycle; `None`
    /// when none up to `--max-processors` suffice.
    pub processors: Option<u64>,
    /// Cycles from a packet's arrival to the end of its last operation.
    pub latency: Option<u64>,
    /// Packets in flight at one packet per cycle (Little's law: the latency).
    pub threads: Option<u64>,
    /// dRMT: processors the list scheduler alone found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub list_processors: Option<u64>,
    /// dRMT: how the ILP ended (`optimal`, `optimal by bound`, `time limit`, `node limit`,
    /// `infeasible`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ilp: Option<&'static str>,
    /// dRMT: seconds the ILP took, over every period it tried.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ilp_seconds: Option<f64>,
    /// dRMT: the ILP proved no smaller period has a schedule (no solve below it ran out of
    /// nodes or time).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ilp_proven_fewest: Option<bool>,
    /// dRMT: which bound stopped an ILP solve at any period tried (`node limit`, the same
    /// on any machine, or `time limit`, which another run may not repeat); absent when none
    /// did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ilp_stopped_by: Option<&'static str>,
}

/// What the PFE does with a shipped program, per packet.
#[derive(Clone, Debug, Serialize)]
pub struct PfeColumn {
    /// Microcode instructions per packet.
    pub instructions: f64,
    /// XTXNs per packet.
    pub xtxns: f64,
    /// PPE threads in flight at one packet per cycle: the per-packet latency in cycles,
    /// one per instruction and `--xtxn-latency` per XTXN.
    pub threads: u64,
}

/// One graph: a shipped program, one from `--odg`, or a random one.
#[derive(Clone, Debug, Serialize)]
pub struct GraphRow {
    /// The program's name, or `random-<seed>`.
    pub graph: String,
    /// `program` or `random`.
    pub kind: &'static str,
    /// Match nodes.
    pub matches: usize,
    /// Action nodes.
    pub actions: usize,
    /// Dependency edges.
    pub edges: usize,
    /// The five columns.
    pub placements: Vec<Placement>,
    /// The PFE beside them (shipped programs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pfe: Option<PfeColumn>,
    /// Every schedule and stage plan passed its validator.
    pub valid: bool,
}

impl GraphRow {
    fn at(&self, a: Architecture) -> &Placement {
        &self.placements[Architecture::ALL
            .iter()
            .position(|x| *x == a)
            .unwrap_or_default()]
    }
}

/// Throughput against processors for one program on one architecture.
#[derive(Clone, Debug, Serialize)]
pub struct ThroughputPoint {
    /// The program.
    pub graph: String,
    /// RMT (coarse) or dRMT IPC 1.
    pub architecture: Architecture,
    /// Physical stages or processors.
    pub processors: u64,
    /// What the placement promises: RMT min(1, 1 / ceil(S / n)), dRMT min(1, n / P).
    pub expected: f64,
    /// What the simulator measured, packets per cycle.
    pub measured: f64,
    /// Memory contentions (dRMT: Observation 1 says none) and resource violations seen.
    pub conflicts: u64,
}

/// The report of [`pipelines`].
#[derive(Clone, Debug, Serialize)]
pub struct PipelinesReport {
    /// What was run.
    pub config: PipelinesConfig,
    /// The shipped programs, `--odg` files, then the random graphs.
    pub rows: Vec<GraphRow>,
    /// Throughput as processors shrink, per program.
    pub throughput: Vec<ThroughputPoint>,
    /// The paper's results beside this run's.
    pub claims: Vec<Claim>,
    /// What the run left out, and why: throughput points not simulated, or without a dRMT
    /// schedule.
    pub notes: Vec<String>,
    /// Every schedule valid, every simulated throughput as promised, no contention.
    pub verified: bool,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
}

/// A named graph to evaluate.
struct Input {
    name: String,
    kind: &'static str,
    odg: Odg,
    pfe: Option<&'static str>,
    /// Run the ILP on it.
    ilp: bool,
}

/// Runs the evaluation; `progress` gets (graphs done, graphs).
pub fn pipelines(
    cfg: &PipelinesConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PipelinesReport, ExperimentError> {
    cfg.check()?;
    let start = Instant::now();
    let mut inputs = vec![
        program("filter", pipeline::programs::filter(), "filter"),
        program("l3fwd", pipeline::programs::l3fwd(100_000), "l3fwd"),
        program(
            "trio-ml",
            pipeline::programs::trio_ml_aggregation(),
            "trio-ml",
        ),
    ];
    for path in &cfg.odg {
        inputs.push(Input {
            name: path.display().to_string(),
            kind: "program",
            odg: read_odg(path)?,
            pfe: None,
            ilp: true,
        });
    }
    for i in 0..u64::from(cfg.graphs) {
        let seed = cfg.seed.wrapping_add(i);
        inputs.push(Input {
            name: format!("random-{seed}"),
            kind: "random",
            odg: examples::random(seed, cfg.slots),
            pfe: None,
            ilp: i < u64::from(cfg.ilp_graphs),
        });
    }
    let rows = run_graphs(cfg, &inputs, progress)?;
    let programs = inputs
        .iter()
        .zip(&rows)
        .filter(|(i, _)| i.kind == "program");
    let (mut throughput, mut notes) = (Vec::new(), Vec::new());
    for (input, row) in programs {
        let (points, note) = throughput_curve(cfg, &input.odg, row)?;
        throughput.extend(points);
        notes.extend(note);
    }
    let verified = rows.iter().all(|r| r.valid)
        && throughput
            .iter()
            .all(|p| p.conflicts == 0 && (p.measured - p.expected).abs() < 1e-9);
    let claims = claims(&rows, &throughput);
    Ok(PipelinesReport {
        config: cfg.clone(),
        rows,
        throughput,
        claims,
        notes,
        verified,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn program(name: &str, odg: Odg, pfe: &'static str) -> Input {
    Input {
        name: name.into(),
        kind: "program",
        odg,
        pfe: Some(pfe),
        ilp: true,
    }
}

/// The most nodes an `--odg` graph may have: the library's [`Odg::MAX_NODES`], which
/// [`Odg::new`] enforces for every caller.
pub const MAX_ODG_NODES: usize = Odg::MAX_NODES;
/// The most edges an `--odg` graph may have: the library's [`Odg::MAX_EDGES`].
pub const MAX_ODG_EDGES: usize = Odg::MAX_EDGES;
/// The largest `--odg` file read, in bytes.
pub const MAX_ODG_BYTES: u64 = 16 << 20;
/// The most processors (and RMT stages) the throughput curve simulates: past them a point
/// costs a schedule and two simulations of a pipe that long, and the curve's shape (RMT's
/// cliff, dRMT's decline) shows well before. A program that needs more is cut, with a note.
pub const MAX_CURVE_PROCESSORS: u64 = 64;

/// Reads a program's ODG from a JSON description, within [`MAX_ODG_BYTES`],
/// [`MAX_ODG_NODES`] and [`MAX_ODG_EDGES`].
fn read_odg(path: &Path) -> Result<Odg, ExperimentError> {
    use std::io::Read;
    let option = |reason: String| ExperimentError::Option {
        option: "--odg",
        reason,
    };
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_ODG_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| option(format!("cannot read {}: {e}", path.display())))?;
    if text.len() as u64 > MAX_ODG_BYTES {
        return Err(option(format!(
            "{}: larger than {MAX_ODG_BYTES} bytes",
            path.display()
        )));
    }
    let description: pipeline::Description =
        serde_json::from_str(&text).map_err(|e| option(format!("{}: {e}", path.display())))?;
    // `to_odg` refuses a graph over the limits before it reads a node.
    let odg = description
        .to_odg()
        .map_err(|e| option(format!("{}: {e}", path.display())))?;
    // A program of no operation has no stage, processor or throughput curve to compare.
    if odg.nodes().is_empty() {
        return Err(option(format!(
            "{}: the graph has no nodes: nothing to place",
            path.display()
        )));
    }
    // A node wider than a stage or a processor fits no placement: say which, rather than
    // leaving its columns empty.
    assign_stages(&odg, &Arch::RMT, Granularity::Coarse)
        .map_err(|e| option(format!("{}: {e} (Table 1's RMT)", path.display())))?;
    list_schedule(&odg, &Arch::DRMT, 1)
        .map_err(|e| option(format!("{}: {e} (Table 1's dRMT)", path.display())))?;
    Ok(odg)
}

/// Evaluates `inputs` on `cfg.threads` threads; rows in the inputs' order.
fn run_graphs(
    cfg: &PipelinesConfig,
    inputs: &[Input],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<GraphRow>, ExperimentError> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<GraphRow, ExperimentError>>>> =
        Mutex::new((0..inputs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..cfg.threads.min(inputs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(input) = inputs.get(i) else { break };
                let row = evaluate(cfg, input);
                results.lock()[i] = Some(row);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, inputs.len());
            });
        }
    });
    results
        .into_inner()
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(ExperimentError::Run("a graph was not run".into()))))
        .collect()
}

/// One graph on every architecture.
fn evaluate(cfg: &PipelinesConfig, input: &Input) -> Result<GraphRow, ExperimentError> {
    let odg = &input.odg;
    let mut valid = true;
    let mut placements = Vec::new();
    for (a, granularity) in [
        (Architecture::Rmt, Granularity::Coarse),
        (Architecture::RmtFine, Granularity::Fine),
    ] {
        // `--odg` graphs are checked as they are read; the others fit by construction.
        let plan = assign_stages(odg, &Arch::RMT, granularity)
            .map_err(|e| ExperimentError::Run(format!("{}: {e}", input.name)))?;
        valid &= validate_stages(odg, &Arch::RMT, &plan).is_ok();
        let latency = Some(plan.latency(&Arch::RMT));
        placements.push(Placement {
            architecture: a,
            processors: Some(u64::from(plan.stages)),
            latency,
            threads: latency,
            list_processors: None,
            ilp: None,
            ilp_seconds: None,
            ilp_proven_fewest: None,
            ilp_stopped_by: None,
        });
    }
    for (a, ipc) in [(Architecture::Drmt1, 1), (Architecture::Drmt2, 2)] {
        let arch = Arch { ipc, ..Arch::DRMT };
        let (placement, ok) = drmt(cfg, odg, &arch, a, input.ilp);
        valid &= ok;
        placements.push(placement);
    }
    let bound = lower_bound(odg, &Arch::DRMT);
    placements.push(Placement {
        architecture: Architecture::DrmtBound,
        processors: Some(bound.processors),
        latency: Some(bound.latency),
        threads: Some(bound.latency),
        list_processors: None,
        ilp: None,
        ilp_seconds: None,
        ilp_proven_fewest: None,
        ilp_stopped_by: None,
    });
    let pfe = match input.pfe {
        Some(name) => {
            let p = pfe_profile(name)?;
            Some(PfeColumn {
                instructions: p.instructions,
                xtxns: p.xtxns,
                threads: p.threads_at_line_rate(cfg.xtxn_latency),
            })
        }
        None => None,
    };
    let count = |m: bool| {
        odg.nodes()
            .iter()
            .filter(|n| matches!(n.op, Op::Match { .. }) == m)
            .count()
    };
    Ok(GraphRow {
        graph: input.name.clone(),
        kind: input.kind,
        matches: count(true),
        actions: count(false),
        edges: odg.edges().len(),
        placements,
        pfe,
        valid,
    })
}

/// dRMT on `arch`: the list scheduler's fewest processors, then the ILP's; the better,
/// validated. Returns the placement and whether every schedule passed the validator.
fn drmt(
    cfg: &PipelinesConfig,
    odg: &Odg,
    arch: &Arch,
    a: Architecture,
    run_ilp: bool,
) -> (Placement, bool) {
    let list = fewest_processors(odg, arch, cfg.max_processors);
    let mut valid = list.as_ref().is_none_or(|s| validate(odg, arch, s).is_ok());
    let mut best: Option<Schedule> = list.clone();
    let (mut ilp, mut ilp_seconds, mut ilp_proven_fewest) = (None, None, None);
    let mut ilp_stopped_by = None;
    if run_ilp && cfg.ilp_node_limit > 0 {
        let options = IlpOptions {
            time_limit: cfg
                .ilp_time_limit
                .map_or(Duration::MAX, Duration::from_secs_f64),
            node_limit: Some(cfg.ilp_node_limit),
            ..IlpOptions::default()
        };
        let t = Instant::now();
        let found = ilp_fewest_processors(odg, arch, cfg.max_processors, &options);
        ilp_seconds = Some(t.elapsed().as_secs_f64());
        if let Some((_, outcome)) = found {
            ilp = Some(status_name(outcome.status));
            ilp_proven_fewest = Some(outcome.unresolved_periods.is_empty());
            ilp_stopped_by = outcome.stopped_by.map(status_name);
            if let Some(s) = outcome.schedule {
                valid &= validate(odg, arch, &s).is_ok();
                let better = best.as_ref().is_none_or(|b| {
                    (s.period, s.latency(odg, arch)) < (b.period, b.latency(odg, arch))
                });
                if better {
                    best = Some(s);
                }
            }
        }
    }
    let latency = best.as_ref().map(|s| s.latency(odg, arch));
    let placement = Placement {
        architecture: a,
        processors: best.as_ref().map(|s| s.period),
        latency,
        threads: latency,
        list_processors: list.map(|s| s.period),
        ilp,
        ilp_seconds,
        ilp_proven_fewest,
        ilp_stopped_by,
    };
    (placement, valid)
}

fn status_name(s: IlpStatus) -> &'static str {
    match s {
        IlpStatus::Optimal => "optimal",
        IlpStatus::OptimalByBound => "optimal by bound",
        IlpStatus::TimeLimit => "time limit",
        IlpStatus::NodeLimit => "node limit",
        IlpStatus::Infeasible => "infeasible",
        IlpStatus::SolverFailed => "solver failed",
    }
}

/// Throughput as processors shrink from what line rate needs to 1, simulated: RMT with its
/// coarse stage count, dRMT (IPC 1) with the heuristics' schedule of the fewest processors
/// (below that count) or of a period equal to the processors (from it up). At most
/// [`MAX_CURVE_PROCESSORS`] processors; the notes say what was left out.
fn throughput_curve(
    cfg: &PipelinesConfig,
    odg: &Odg,
    row: &GraphRow,
) -> Result<(Vec<ThroughputPoint>, Vec<String>), ExperimentError> {
    let run = |e: pipeline::SimError| ExperimentError::Run(format!("{}: {e}", row.graph));
    let (mut points, mut notes) = (Vec::new(), Vec::new());
    let arch = Arch::DRMT;
    let rmt = row.at(Architecture::Rmt).processors;
    let fewest = fewest_processors(odg, &arch, cfg.max_processors);
    let (Some(stages), Some(fewest)) = (rmt, fewest) else {
        notes.push(format!(
            "{}: no throughput curve: {}",
            row.graph,
            if rmt.is_none() {
                "no RMT stage plan".to_string()
            } else {
                format!(
                    "no dRMT schedule within --max-processors {}",
                    cfg.max_processors
                )
            }
        ));
        return Ok((points, notes));
    };
    let stage_time = Arch::RMT.match_latency + Arch::RMT.action_latency;
    let last = stages.max(fewest.period);
    if last > MAX_CURVE_PROCESSORS {
        notes.push(format!(
            "{}: throughput simulated up to {MAX_CURVE_PROCESSORS} processors only, of the \
             {last} that line rate needs on RMT or dRMT",
            row.graph
        ));
    }
    // Processor counts at which the heuristics found no dRMT schedule: RMT's point only.
    let mut no_schedule = Vec::new();
    for n in 1..=last.min(MAX_CURVE_PROCESSORS) {
        // RMT repeats every n stages' time per pass; a packet makes ceil(S / n) passes.
        let pattern = n * stage_time * stages.div_ceil(n);
        let sim = window(cfg.sim_cycles, pattern, pattern);
        let r = simulate_rmt(stages as u32, n as u32, &Arch::RMT, &sim).map_err(run)?;
        points.push(ThroughputPoint {
            graph: row.graph.clone(),
            architecture: Architecture::Rmt,
            processors: n,
            expected: rmt_throughput(stages as u32, n as u32),
            measured: r.throughput,
            conflicts: r.contentions + r.resource_violations,
        });
        let schedule = if n < fewest.period {
            Some(fewest.clone())
        } else {
            heuristic_schedule(odg, &arch, n)
        };
        let Some(schedule) = schedule else {
            no_schedule.push(n);
            continue;
        };
        let sim = window(
            cfg.sim_cycles,
            schedule.period,
            schedule.latency(odg, &arch),
        );
        let d = simulate_drmt(odg, &arch, &schedule, n, &sim).map_err(run)?;
        points.push(ThroughputPoint {
            graph: row.graph.clone(),
            architecture: Architecture::Drmt1,
            processors: n,
            expected: (n as f64 / schedule.period as f64).min(1.0),
            measured: d.throughput,
            conflicts: d.contentions + d.resource_violations,
        });
    }
    if !no_schedule.is_empty() {
        notes.push(format!(
            "{}: no dRMT (IPC 1) point at {:?} processors: the heuristics found no schedule \
             with a period of that many (the ILP is not run for the curve)",
            row.graph, no_schedule
        ));
    }
    Ok((points, notes))
}

/// A warm-up past the first packet's latency, then a measured window of as many cycles, both
/// whole multiples of the arrivals' `pattern` (so the measured throughput is exact) and at
/// least `base`.
fn window(base: u64, pattern: u64, latency: u64) -> SimConfig {
    let pattern = pattern.max(1);
    let warmup = base.max(latency + pattern).div_ceil(pattern) * pattern;
    SimConfig {
        cycles: 2 * warmup,
        warmup,
    }
}

/// Quantile `q` of `v` (sorted here), nearest rank.
fn quantile(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1]
}

fn claims(rows: &[GraphRow], throughput: &[ThroughputPoint]) -> Vec<Claim> {
    let random: Vec<&GraphRow> = rows.iter().filter(|r| r.kind == "random").collect();
    let mut claims = cliff_claims(rows, throughput);
    if !random.is_empty() {
        let n = random.len();
        let both: Vec<(u64, u64)> = random
            .iter()
            .filter_map(|r| {
                Some((
                    r.at(Architecture::Drmt1).processors?,
                    r.at(Architecture::Rmt).processors?,
                ))
            })
            .collect();
        let no_more = both.iter().filter(|(d, r)| d <= r).count();
        let fewer = both.iter().filter(|(d, r)| d < r).count();
        claims.push(Claim {
            what: format!("{n} random ODGs: dRMT (IPC 1) processors against RMT stages"),
            paper: "dRMT needs no more processors than RMT stages, often fewer (§4)".into(),
            measured: format!("no more on {no_more} of {}, fewer on {fewer}", both.len()),
        });
        let mean = |a: Architecture| {
            let v: Vec<u64> = random.iter().filter_map(|r| r.at(a).processors).collect();
            v.iter().sum::<u64>() as f64 / v.len().max(1) as f64
        };
        claims.push(Claim {
            what: "mean processors (stages) for one packet per cycle".into(),
            paper: "fine-grained RMT and IPC 2 each help; dRMT is closer to the bound (§4)".into(),
            measured: Architecture::ALL
                .iter()
                .map(|&a| format!("{} {:.2}", a.name(), mean(a)))
                .collect::<Vec<_>>()
                .join(", "),
        });
        let times: Vec<f64> = random
            .iter()
            .flat_map(|r| r.placements.iter().filter_map(|p| p.ilp_seconds))
            .collect();
        if !times.is_empty() {
            let limited = random
                .iter()
                .flat_map(|r| &r.placements)
                .filter(|p| p.ilp_stopped_by == Some("time limit"))
                .count();
            let node_limited = random
                .iter()
                .flat_map(|r| &r.placements)
                .filter(|p| p.ilp_stopped_by == Some("node limit"))
                .count();
            let proven = random
                .iter()
                .flat_map(|r| &r.placements)
                .filter(|p| p.ilp_proven_fewest == Some(true))
                .count();
            let improved = random
                .iter()
                .flat_map(|r| &r.placements)
                .filter(
                    |p| matches!((p.processors, p.list_processors), (Some(a), Some(b)) if a < b),
                )
                .count();
            claims.push(Claim {
                what: "ILP run time per graph and IPC (all periods tried)".into(),
                paper: "reported in §4 (Gurobi; the run times are not in the text at hand)".into(),
                measured: format!(
                    "median {:.2} s, p90 {:.2} s, max {:.2} s; the fewest processors proven on \
                     {proven} of {}, a solve stopped by the node limit on {node_limited} and \
                     by the time limit on {limited}; fewer processors than the heuristics on \
                     {improved}",
                    quantile(times.clone(), 0.5),
                    quantile(times.clone(), 0.9),
                    quantile(times.clone(), 1.0),
                    times.len()
                ),
            });
        }
    }
    claims
}

/// Per program: throughput one stage short of what RMT needs, RMT against dRMT.
fn cliff_claims(rows: &[GraphRow], throughput: &[ThroughputPoint]) -> Vec<Claim> {
    let mut claims = Vec::new();
    for row in rows.iter().filter(|r| r.kind == "program") {
        let Some(stages) = row.at(Architecture::Rmt).processors.filter(|&s| s > 1) else {
            continue;
        };
        let at = |a: Architecture| {
            throughput
                .iter()
                .find(|p| p.graph == row.graph && p.architecture == a && p.processors == stages - 1)
                .map(|p| p.measured)
        };
        if let (Some(rmt), Some(drmt)) = (at(Architecture::Rmt), at(Architecture::Drmt1)) {
            claims.push(Claim {
                what: format!(
                    "{}: throughput on {} processors, one fewer than RMT's stages",
                    row.graph,
                    stages - 1
                ),
                paper: "RMT falls off a cliff (recirculation halves it); dRMT declines \
                        gracefully (§4)"
                    .into(),
                measured: format!("RMT {rmt:.3}, dRMT (IPC 1) {drmt:.3} packets per cycle"),
            });
        }
    }
    claims
}

const CSV_HEADER: [&str; 18] = [
    "graph",
    "kind",
    "matches",
    "actions",
    "edges",
    "architecture",
    "processors",
    "latency",
    "threads",
    "list_processors",
    "ilp",
    "ilp_seconds",
    "ilp_proven_fewest",
    "ilp_stopped_by",
    "pfe_instructions",
    "pfe_xtxns",
    "pfe_threads",
    "valid",
];

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

impl Figure for PipelinesReport {
    fn name(&self) -> &'static str {
        "pipelines"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        CSV_HEADER.to_vec()
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for r in &self.rows {
            for p in &r.placements {
                let pfe = r.pfe.as_ref();
                out.push(vec![
                    r.graph.clone(),
                    r.kind.into(),
                    r.matches.to_string(),
                    r.actions.to_string(),
                    r.edges.to_string(),
                    p.architecture.name().into(),
                    opt(p.processors),
                    opt(p.latency),
                    opt(p.threads),
                    opt(p.list_processors),
                    opt(p.ilp),
                    opt(p.ilp_seconds.map(|s| format!("{s:.4}"))),
                    opt(p.ilp_proven_fewest),
                    opt(p.ilp_stopped_by),
                    opt(pfe.map(|p| format!("{:.2}", p.instructions))),
                    opt(pfe.map(|p| format!("{:.2}", p.xtxns))),
                    opt(pfe.map(|p| p.threads)),
                    r.valid.to_string(),
                ]);
            }
        }
        out
    }

    fn draw(&self, path: &Path) -> Result<(), PlotError> {
        let random: Vec<&GraphRow> = self.rows.iter().filter(|r| r.kind == "random").collect();
        let color = |a: Architecture| Architecture::ALL.iter().position(|x| *x == a).unwrap_or(0);
        // (a) Processors per random graph, graphs sorted by RMT's stages.
        let mut order: Vec<&GraphRow> = random.clone();
        order.sort_by_key(|r| r.at(Architecture::Rmt).processors);
        let processors = Architecture::ALL
            .iter()
            .map(|&a| Line {
                series: Series {
                    name: a.name().into(),
                    points: order
                        .iter()
                        .enumerate()
                        .filter_map(|(i, r)| Some((i as f64, r.at(a).processors? as f64)))
                        .collect(),
                },
                color: color(a),
                dashed: a == Architecture::DrmtBound,
            })
            .collect();
        let mut panels = vec![Panel {
            title: "(a) processors for line rate, random ODGs".into(),
            x_label: "graph (by RMT stages)".into(),
            y_label: "processors / stages".into(),
            y_log: false,
            x_log2: false,
            lines: processors,
        }];
        // (b) Throughput as processors shrink, one panel per program.
        let mut programs: Vec<&str> = Vec::new();
        // A program that fits one stage has no curve to draw.
        for p in self.throughput.iter().filter(|p| p.processors > 1) {
            if !programs.contains(&p.graph.as_str()) {
                programs.push(&p.graph);
            }
        }
        for g in programs {
            let lines = [Architecture::Rmt, Architecture::Drmt1]
                .iter()
                .map(|&a| Line {
                    series: Series {
                        name: a.name().into(),
                        points: self
                            .throughput
                            .iter()
                            .filter(|p| p.graph == g && p.architecture == a)
                            .map(|p| (p.processors as f64, p.measured))
                            .collect(),
                    },
                    color: color(a),
                    dashed: false,
                })
                .collect();
            panels.push(Panel {
                title: format!("(b) {g}: throughput as processors shrink"),
                x_label: "processors / stages".into(),
                y_label: "packets per cycle".into(),
                y_log: false,
                x_log2: false,
                lines,
            });
        }
        // (c) ILP run times, sorted.
        let ilp = [Architecture::Drmt1, Architecture::Drmt2]
            .iter()
            .map(|&a| {
                let mut t: Vec<f64> = random.iter().filter_map(|r| r.at(a).ilp_seconds).collect();
                t.sort_by(f64::total_cmp);
                Line {
                    series: Series {
                        name: a.name().into(),
                        points: t
                            .into_iter()
                            .enumerate()
                            .map(|(i, s)| (i as f64, s.max(1e-4)))
                            .collect(),
                    },
                    color: color(a),
                    dashed: false,
                }
            })
            .collect();
        panels.push(Panel {
            title: "(c) ILP run time per random ODG, sorted".into(),
            x_label: "graph (by run time)".into(),
            y_label: "seconds".into(),
            y_log: true,
            x_log2: false,
            lines: ilp,
        });
        plot::svg_panels(
            path,
            &Panels {
                title: "RMT, fine-grained RMT, dRMT (IPC 1, 2) and dRMT's lower bound (§4)",
                columns: 3,
                panels,
            },
        )
    }

    fn table(&self) -> String {
        let mut t = String::from(
            "Programs: processors (stages) for one packet per cycle / latency in cycles (= threads)\n",
        );
        t += "(dRMT bound: Table 1's dRMT processor, A = 32 and dM = 22; it bounds the dRMT \
              columns, not RMT's stages of A = 224 and dM = 18)\n";
        t += &format!("{:<14}", "program");
        for a in Architecture::ALL {
            t += &format!("{:>14}", a.name());
        }
        t += &format!("{:>28}\n", "PFE instr / XTXN / threads");
        for r in self.rows.iter().filter(|r| r.kind == "program") {
            t += &format!("{:<14}", r.graph);
            for p in &r.placements {
                let cell = match (p.processors, p.latency) {
                    (Some(n), Some(l)) => format!("{n} / {l}"),
                    _ => "none".into(),
                };
                t += &format!("{cell:>14}");
            }
            if let Some(p) = &r.pfe {
                t += &format!(
                    "{:>28}",
                    format!("{:.1} / {:.1} / {}", p.instructions, p.xtxns, p.threads)
                );
            }
            t += "\n";
        }
        t += "\nThroughput (packets per cycle, simulated) as processors shrink\n";
        let mut last = String::new();
        for p in &self.throughput {
            if p.graph != last {
                t += &format!("{}:\n", p.graph);
                last.clone_from(&p.graph);
            }
            if p.architecture == Architecture::Rmt {
                let d = self.throughput.iter().find(|q| {
                    q.graph == p.graph
                        && q.processors == p.processors
                        && q.architecture == Architecture::Drmt1
                });
                t += &format!(
                    "  n = {:>3}: RMT {:.3}, dRMT {:.3}\n",
                    p.processors,
                    p.measured,
                    d.map_or(f64::NAN, |d| d.measured)
                );
            }
        }
        for c in &self.claims {
            t += &format!("{}: paper: {}; measured: {}\n", c.what, c.paper, c.measured);
        }
        for note in &self.notes {
            t += &format!("note: {note}\n");
        }
        t += &format!("{} graphs in {:.1} s", self.rows.len(), self.seconds);
        t
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
