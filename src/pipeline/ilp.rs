//! The dRMT scheduler's integer linear program (§3.3), solved with microlp, and the three
//! speed-ups that make it practical.
//!
//! The program, as the paper gives it, for a processor receiving a packet every P cycles:
//!
//! - a binary rq(v, q, r) for each node v and start time qP + r, with Σ_{q,r} rq(v, q, r) = 1;
//!   the start t(v) = Σ (qP + r) rq(v, q, r) is that sum itself, not a variable of its own;
//! - dependencies: t(v) − t(u) ≥ τ(u, v), ΔM after a match and ΔA after an action, 0 on
//!   an ordering edge ([`EdgeKind::Order`](super::EdgeKind::Order));
//! - per residue class r: Σ_{v ∈ VM, q} ceil(k(v) / b) rq(v, q, r) ≤ M̄ and
//!   Σ_{v ∈ VA, q} a(v) rq(v, q, r) ≤ Ā;
//! - IPC: a binary pm(q, r) with Σ_{v ∈ VM} rq(v, q, r) ≤ pm(q, r) · |VM| and
//!   Σ_q pm(q, r) ≤ IPC (and pa for the actions); pfemu's factor is the number of matches
//!   that have a variable at that time rather than all of |VM| (the same integer solutions:
//!   the sum cannot exceed it), and by default ([`IlpOptions::tight_ipc`]) the first is one
//!   constraint per node, rq(v, q, r) ≤ pm(q, r): the same integer solutions, but a
//!   relaxation tight enough to prove optima on the paper's random graphs;
//! - objective: minimise T, with t(v) ≤ T (the last start), written for the nodes without
//!   successors only (every other node's start is at most a successor's).
//!
//! The paper names three speed-ups but leaves their description to its extended version;
//! these are this module's reading of them, each of which [`IlpOptions`] can turn off:
//!
//! 1. **Seed** (`seed`): [`heuristic_schedule`] runs first (the list scheduler or the
//!    fine-grained stage plan laid out cyclically, as the paper's code seeds its ILP from
//!    fine-grained RMT, whichever ends sooner). Its last start H bounds the horizon,
//!    as no optimum starts anything later: the times are 0..Q_MAX·P with
//!    Q_MAX = ceil((H + 1) / P); without step 3's scan its schedule also warm-starts the
//!    solver. Without a seed the horizon is one that provably holds an optimal schedule if
//!    any exists: a schedule has at most d = min(n, 2·P·IPC) distinct start times, and moving
//!    everything after a gap P earlier keeps it valid while the gap is at least the largest
//!    latency plus P, so some optimum starts everything by P − 1 + (d − 1)(max latency +
//!    P − 1).
//! 2. **Windows** (`windows`): node v gets rq variables only for times in
//!    [ASAP(v), H − tail(v)], where ASAP is its earliest start from the dependencies and
//!    tail(v) the longest chain of latencies from v to a last node: no schedule within the
//!    horizon starts v outside them. IPC indicators exist only for times some variable can
//!    take, and a class's IPC (or capacity) constraint only where it could bind.
//! 3. **Bounds and early exit** (`bounds`): T ≥ the critical path's last start (the largest
//!    ASAP). When the seed meets that bound it is optimal and the ILP is not run
//!    ([`IlpStatus::OptimalByBound`]); a graph whose widest node, or whose total match units
//!    or action fields, exceeds what P classes hold is infeasible without a solve. Otherwise
//!    the horizon rises from the bound to one below the seed's (without a seed, to the proven
//!    horizon), a program per horizon, each with narrower windows than one wide program: the
//!    first with a schedule has the optimum, and if none has one the seed is optimal (or,
//!    without a seed, there is no schedule). Proving a narrow horizon infeasible is what the
//!    solver does fastest; one wide program, even warm-started, spends its time closing the
//!    gap to a weak bound.
//!
//! The solver's answer is read back by rounding (each node at the time whose rq rounds to
//! one) and checked by [`validate`]; an answer that fails it is never returned: the seed is,
//! with [`IlpStatus::SolverFailed`]. A program larger than [`MAX_ILP_TERMS`] (long latencies
//! without windows) is not built: the seed is returned, with [`IlpFailure::TooLarge`]. The
//! solver's work is bounded by a budget of branch-and-bound nodes per solve, which strikes
//! at the same point on any machine (by default [`DEFAULT_NODE_LIMIT`]); a wall-clock time
//! limit on the whole call, shared by its solves, is an optional guard. An outcome says
//! whether its schedule is optimal, the best found when a limit struck (which one), or that
//! none exists.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use microlp::{ComparisonOp, OptimizationDirection, Problem, SolveOptions, Variable};

use super::list::{earliest_starts, heuristic_schedule, lower_bound, MAX_PERIOD};
use super::odg::{Arch, ArchError, Odg, Op};
use super::schedule::{validate, Schedule, Violation};

/// How [`ilp_schedule`] solves: the solver's limits and the speed-ups on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IlpOptions {
    /// A wall-clock guard on one [`ilp_schedule`] call, shared by its solves (each
    /// [`ilp_fewest_processors`] period gets its own); [`Duration::MAX`], the default, is
    /// none. Where it strikes depends on the machine and its load, so an outcome it decides
    /// ([`IlpStatus::TimeLimit`]) may differ from run to run: bound the work with
    /// `node_limit`, and give a time limit only as a guard it should not reach.
    pub time_limit: Duration,
    /// The most branch-and-bound nodes each program solved may explore (`None`: no limit;
    /// speed-up 3 solves one program per horizon, so a call's work is bounded by the budget
    /// times its horizons). A budget counted in work, so an outcome is the same on any
    /// machine; where it strikes the outcome is [`IlpStatus::NodeLimit`].
    /// [`DEFAULT_NODE_LIMIT`] by default.
    pub node_limit: Option<u64>,
    /// Speed-up 1: the heuristic's schedule bounds the horizon (and warm-starts the
    /// solver when `bounds` is off).
    pub seed: bool,
    /// Speed-up 2: each node's variables only within its feasible window of start times.
    pub windows: bool,
    /// Speed-up 3: the last start bounded below by the critical path, no solve when the seed
    /// meets that bound or the resources cannot fit, and the horizons scanned up from the bound.
    pub bounds: bool,
    /// The IPC indicators bound each start variable on their own, rq(v, q, r) ≤ pm(q, r),
    /// rather than the paper's one sum per (q, r): the same integer solutions, a tighter
    /// relaxation, and on the paper's random graphs proofs of optimality where the sum's
    /// solves run out of time.
    pub tight_ipc: bool,
}

/// [`IlpOptions::node_limit`]'s default: branch-and-bound nodes per program solved.
/// `pfemu experiment pipelines` takes it as its `--ilp-node-limit` default: its default run
/// then takes a few minutes on two cores, and gives the processors and latencies the former
/// 2 s time limit per period gave on 44 of its 46 ILP rows (`BENCHMARKS.md`).
pub const DEFAULT_NODE_LIMIT: u64 = 200;

impl Default for IlpOptions {
    /// [`DEFAULT_NODE_LIMIT`] nodes, no time limit, every speed-up on, the IPC constraints
    /// tight: the same outcome on any machine.
    fn default() -> Self {
        IlpOptions {
            time_limit: Duration::MAX,
            node_limit: Some(DEFAULT_NODE_LIMIT),
            seed: true,
            windows: true,
            bounds: true,
            tight_ipc: true,
        }
    }
}

/// What an [`IlpOutcome`]'s schedule is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum IlpStatus {
    /// The solver proved it has the earliest last start.
    Optimal,
    /// The seed's last start equals the critical-path bound: optimal without a solve.
    OptimalByBound,
    /// The time limit struck: the best schedule found by then (the seed's, if the solver
    /// found none better), or none if neither found one.
    TimeLimit,
    /// The node limit ([`IlpOptions::node_limit`]) struck, with the same schedule as at
    /// [`IlpStatus::TimeLimit`].
    NodeLimit,
    /// No valid schedule exists at this period.
    Infeasible,
    /// The solver failed or answered with an invalid schedule, or the architecture or the
    /// period was refused ([`IlpOutcome::failure`] says which); the schedule is the seed's,
    /// if there is one.
    SolverFailed,
}

/// Why the solver's answer was not used.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum IlpFailure {
    /// The architecture fails [`Arch::check`]: nothing was solved.
    Arch(ArchError),
    /// The period is 0 or above [`MAX_PERIOD`], as [`list_schedule`](super::list_schedule)
    /// refuses it: nothing was solved.
    Period(u64),
    /// The solver returned an error (or called the seeded problem infeasible).
    Solver(microlp::Error),
    /// A node's start could not be read back: no start, or several, near 1.
    Unreadable(String),
    /// The rounded answer breaks the schedule's rules.
    Invalid(Vec<Violation>),
    /// The program within some horizon would exceed [`MAX_ILP_TERMS`] (the count it would
    /// have): not built. Long latencies make long horizons, and without windows every node
    /// gets a variable for every cycle of it.
    TooLarge(u64),
}

/// The most terms [`ilp_schedule`] builds into one program: its start variables, each counted
/// once more for every dependency it appears in. A program past it would take gigabytes
/// before the solver's time limit could strike; the outcome is then
/// [`IlpStatus::SolverFailed`] with [`IlpFailure::TooLarge`], and the seed's schedule.
pub const MAX_ILP_TERMS: u64 = 1 << 22;

impl fmt::Display for IlpFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IlpFailure::Arch(e) => write!(f, "{e}"),
            IlpFailure::Period(p) => write!(f, "a period of {p}: it must be 1 to {MAX_PERIOD}"),
            IlpFailure::Solver(e) => write!(f, "the ILP solver failed: {e}"),
            IlpFailure::Unreadable(node) => {
                write!(f, "the ILP's answer gives `{node}` no single start time")
            }
            IlpFailure::TooLarge(terms) => write!(
                f,
                "the ILP would have {terms} terms, more than the {MAX_ILP_TERMS} it builds \
                 (MAX_ILP_TERMS): the latencies make its horizon too long"
            ),
            IlpFailure::Invalid(bad) => {
                write!(f, "the ILP's answer is not a valid schedule")?;
                for v in bad {
                    write!(f, "; {v}")?;
                }
                Ok(())
            }
        }
    }
}

impl std::error::Error for IlpFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            IlpFailure::Solver(e) => Some(e),
            IlpFailure::Arch(e) => Some(e),
            IlpFailure::Period(_)
            | IlpFailure::Unreadable(_)
            | IlpFailure::Invalid(_)
            | IlpFailure::TooLarge(_) => None,
        }
    }
}

/// The result of [`ilp_schedule`] at one period.
#[derive(Clone, Debug, PartialEq)]
pub struct IlpOutcome {
    /// The schedule, always valid ([`validate`] passes), if one was found.
    pub schedule: Option<Schedule>,
    /// What the schedule is.
    pub status: IlpStatus,
    /// Wall-clock time of the whole call: seed, model and solve.
    pub elapsed: Duration,
    /// The largest model's variables (0 when no model was built).
    pub variables: usize,
    /// The largest model's constraints, bounds of single variables not counted.
    pub constraints: usize,
    /// The programs solved (speed-up 3 solves one per horizon it tries).
    pub solves: usize,
    /// The critical-path bound on the last start (0 with `bounds` off).
    pub bound: u64,
    /// The heuristic seed's last start, when it ran and found a schedule.
    pub seed_last_start: Option<u64>,
    /// Why the solver's answer was not used, with [`IlpStatus::SolverFailed`].
    pub failure: Option<IlpFailure>,
    /// Set by [`ilp_fewest_processors`]: the smaller periods whose solve neither found a
    /// schedule nor proved there is none (time limit or solver failure); empty when this
    /// period is proven the smallest.
    pub unresolved_periods: Vec<u64>,
    /// Which limit stopped a solve, if one did: [`IlpStatus::NodeLimit`] or
    /// [`IlpStatus::TimeLimit`] (the node limit's, if both struck). Set by [`ilp_schedule`]
    /// when a limit ended its search, and by [`ilp_fewest_processors`] also when one left a
    /// smaller period unresolved: so a caller can tell an outcome the machine's speed could
    /// change (time) from one any machine repeats (nodes).
    pub stopped_by: Option<IlpStatus>,
}

impl IlpOutcome {
    /// The schedule's last start, if there is one.
    pub fn last_start(&self) -> Option<u64> {
        self.schedule.as_ref().map(last_start)
    }
}

fn last_start(s: &Schedule) -> u64 {
    s.start.iter().copied().max().unwrap_or(0)
}

/// The schedule of `odg` on `arch` at period `period` with the earliest last start, found
/// by the ILP (the module doc gives the program and its speed-ups), within `options.time_limit`.
/// An architecture that fails [`Arch::check`], or a period of 0 or above [`MAX_PERIOD`], is
/// refused before any work: [`IlpStatus::SolverFailed`], the [`IlpFailure`] naming it.
pub fn ilp_schedule(odg: &Odg, arch: &Arch, period: u64, options: &IlpOptions) -> IlpOutcome {
    let began = Instant::now();
    let mut out = IlpOutcome {
        schedule: None,
        status: IlpStatus::Infeasible,
        elapsed: Duration::ZERO,
        variables: 0,
        constraints: 0,
        solves: 0,
        bound: 0,
        seed_last_start: None,
        failure: None,
        unresolved_periods: Vec::new(),
        stopped_by: None,
    };
    let refused = match arch.check() {
        Err(e) => Some(IlpFailure::Arch(e)),
        // Past MAX_PERIOD the capacity sums and the horizon could overflow, and the plain
        // model's variables (a node times the horizon) exhaust memory before any solve.
        Ok(()) if !(1..=MAX_PERIOD).contains(&period) => Some(IlpFailure::Period(period)),
        Ok(()) => None,
    };
    if refused.is_some() {
        out.status = IlpStatus::SolverFailed;
        out.failure = refused;
        out.elapsed = began.elapsed();
        return out;
    }
    let n = odg.nodes().len();
    let asap = earliest_starts(odg, arch);
    if options.bounds && !resources_fit(odg, arch, period) {
        out.elapsed = began.elapsed();
        return out;
    }
    // Speed-up 3: the last start is at least the critical path's.
    if options.bounds {
        out.bound = asap.iter().copied().max().unwrap_or(0);
    }
    // Speed-up 1, the seed, and 3's early exit when it meets the bound.
    let seed = options
        .seed
        .then(|| heuristic_schedule(odg, arch, period))
        .flatten();
    out.seed_last_start = seed.as_ref().map(last_start);
    if let Some(s) = &seed {
        debug_assert_eq!(validate(odg, arch, s), Ok(()));
        if n == 0 || (options.bounds && last_start(s) <= out.bound) {
            out.schedule = seed;
            out.status = IlpStatus::OptimalByBound;
            out.elapsed = began.elapsed();
            return out;
        }
    }
    let program = Program {
        odg,
        arch,
        period,
        asap: &asap,
        bound: out.bound,
        options,
        // A limit past what an Instant can hold is no limit.
        deadline: began.checked_add(options.time_limit),
    };
    let result = match &seed {
        _ if options.bounds => {
            // Speed-up 3's scan: horizons from the bound up, each a small program; the first
            // with a schedule holds an optimum. Past the last, the seed is optimal, or (past
            // the proven horizon) there is no schedule.
            let (end, mut result) = match &seed {
                Some(s) => (last_start(s), Solved::Optimal(s.clone())),
                None => (proven_horizon(odg, arch, period) + 1, Solved::Infeasible),
            };
            for horizon in out.bound..end {
                match program.solve(horizon, None, &mut out) {
                    Solved::Infeasible => {}
                    other => {
                        result = other;
                        break;
                    }
                }
            }
            result
        }
        Some(s) => program.solve(last_start(s), Some(s), &mut out),
        None => program.solve(proven_horizon(odg, arch, period), None, &mut out),
    };
    match result {
        Solved::Optimal(s) => {
            out.status = IlpStatus::Optimal;
            out.schedule = Some(s);
        }
        Solved::Feasible(s, limit) => {
            out.status = limit;
            out.schedule = Some(s);
        }
        Solved::Interrupted(limit) => {
            out.status = limit;
            out.schedule.clone_from(&seed);
        }
        // Without a seed the horizon and windows hold an optimum if there is one: proven.
        Solved::Infeasible if seed.is_none() => out.status = IlpStatus::Infeasible,
        // The seed is a schedule within the horizon: the solver is wrong.
        Solved::Infeasible => {
            out.status = IlpStatus::SolverFailed;
            out.failure = Some(IlpFailure::Solver(microlp::Error::Infeasible));
            out.schedule.clone_from(&seed);
        }
        Solved::Failed(failure) => {
            out.status = IlpStatus::SolverFailed;
            out.failure = Some(failure);
            out.schedule.clone_from(&seed);
        }
    }
    if let Some(s) = &out.schedule {
        debug_assert_eq!(validate(odg, arch, s), Ok(()));
    }
    if matches!(out.status, IlpStatus::NodeLimit | IlpStatus::TimeLimit) {
        out.stopped_by = Some(out.status);
    }
    out.elapsed = began.elapsed();
    out
}

/// Of two limits that stopped solves, the one to report: the node limit over the time
/// limit.
fn first_limit(a: Option<IlpStatus>, b: Option<IlpStatus>) -> Option<IlpStatus> {
    match (a, b) {
        (Some(IlpStatus::NodeLimit), _) | (_, Some(IlpStatus::NodeLimit)) => {
            Some(IlpStatus::NodeLimit)
        }
        (a, b) => a.or(b),
    }
}

/// What one solve within a horizon gave.
enum Solved {
    /// A valid schedule, proven the earliest within the horizon.
    Optimal(Schedule),
    /// A valid schedule, the best found when a limit (the status naming it) struck.
    Feasible(Schedule, IlpStatus),
    /// No schedule within the horizon.
    Infeasible,
    /// A limit (the status naming it) struck before a schedule was found.
    Interrupted(IlpStatus),
    /// The solver failed, or its answer was not a valid schedule.
    Failed(IlpFailure),
}

/// What the program is built from, and the time budget's end.
struct Program<'a> {
    odg: &'a Odg,
    arch: &'a Arch,
    period: u64,
    asap: &'a [u64],
    bound: u64,
    options: &'a IlpOptions,
    /// `None`: no limit.
    deadline: Option<Instant>,
}

impl Program<'_> {
    /// The program within `horizon` solved, with `warm` as the warm start; the model's size
    /// counted in `out` (the largest so far) and the solve in `out.solves`.
    fn solve(&self, horizon: u64, warm: Option<&Schedule>, out: &mut IlpOutcome) -> Solved {
        let (odg, arch, period) = (self.odg, self.arch, self.period);
        let left = self
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()));
        if left.is_some_and(|l| l.is_zero()) {
            return Solved::Interrupted(IlpStatus::TimeLimit);
        }
        let windows = windows(odg, arch, period, horizon, self.asap, self.options);
        let terms = model_terms(odg, &windows);
        if terms > MAX_ILP_TERMS {
            return Solved::Failed(IlpFailure::TooLarge(terms));
        }
        let model = Model::build(
            odg,
            arch,
            period,
            horizon,
            &windows,
            self.bound,
            self.options,
        );
        out.variables = out.variables.max(model.variables);
        out.constraints = out.constraints.max(model.constraints);
        let Some(problem) = &model.problem else {
            // A window is empty: nothing fits within the horizon.
            return Solved::Infeasible;
        };
        out.solves += 1;
        let mut solve = SolveOptions::default();
        // The solver adds its limit to an Instant of its own: keep that sum representable.
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        solve.time_limit = left.map(|l| l.min(CENTURY));
        solve.node_limit = self.options.node_limit;
        solve.warm_start = warm.map(|s| warm_start(odg, &model.x, &model.ipc, model.t, s));
        let solution = match problem.solve_with(solve) {
            Ok(microlp::SolveOutcome::Solution(solution)) => solution,
            Ok(microlp::SolveOutcome::Interrupted(stopped)) => {
                return Solved::Interrupted(limit_status(stopped.termination_reason()))
            }
            Err(microlp::Error::Infeasible) => return Solved::Infeasible,
            Err(e) => return Solved::Failed(IlpFailure::Solver(e)),
        };
        let schedule = match read_back(odg, period, &model.x, |v| solution.var_value_raw(v)) {
            Ok(s) => s,
            Err(node) => return Solved::Failed(IlpFailure::Unreadable(node)),
        };
        if let Err(bad) = validate(odg, arch, &schedule) {
            return Solved::Failed(IlpFailure::Invalid(bad));
        }
        if solution.status() == microlp::SolutionStatus::Optimal {
            Solved::Optimal(schedule)
        } else {
            Solved::Feasible(schedule, limit_status(solution.termination_reason()))
        }
    }
}

/// The status of a solve a limit stopped: the node limit's, else the time limit's.
fn limit_status(reason: microlp::TerminationReason) -> IlpStatus {
    match reason {
        microlp::TerminationReason::NodeLimit => IlpStatus::NodeLimit,
        _ => IlpStatus::TimeLimit,
    }
}

/// The smallest period in `lower_bound(odg, arch).processors..=max_period` with a valid
/// schedule, and [`ilp_schedule`]'s outcome there, found by an upward scan: at each period
/// the heuristic runs first (as the seed) and establishes feasibility at once when it
/// finds a schedule; only where it finds none does the ILP, unseeded, decide. A period whose
/// solve hits a limit without a schedule counts as not feasible and is listed in
/// [`IlpOutcome::unresolved_periods`]. `None` if no period up to `max_period` (at most
/// [`MAX_PERIOD`]) has one found.
pub fn ilp_fewest_processors(
    odg: &Odg,
    arch: &Arch,
    max_period: u64,
    options: &IlpOptions,
) -> Option<(u64, IlpOutcome)> {
    let mut unresolved = Vec::new();
    let mut stopped_by = None;
    // Past MAX_PERIOD every period is refused: the scan ends there, not at u64::MAX.
    for period in lower_bound(odg, arch).processors..=max_period.min(MAX_PERIOD) {
        let mut out = ilp_schedule(odg, arch, period, options);
        stopped_by = first_limit(stopped_by, out.stopped_by);
        if out.schedule.is_some() {
            out.unresolved_periods = unresolved;
            out.stopped_by = stopped_by;
            return Some((period, out));
        }
        if out.status != IlpStatus::Infeasible {
            unresolved.push(period);
        }
    }
    None
}

/// Whether the widest node fits a class and the total demand fits P classes.
fn resources_fit(odg: &Odg, arch: &Arch, period: u64) -> bool {
    let (mut units, mut fields) = (0u64, 0u64);
    for node in odg.nodes() {
        match node.op {
            Op::Match { key_bits, .. } => {
                let u = arch.match_units(key_bits);
                if u > arch.match_capacity {
                    return false;
                }
                units += u64::from(u);
            }
            Op::Action { fields: f } => {
                if f > arch.action_capacity {
                    return false;
                }
                fields += u64::from(f);
            }
        }
    }
    units <= period * u64::from(arch.match_capacity)
        && fields <= period * u64::from(arch.action_capacity)
}

/// A last start by which some optimal schedule starts everything, if any valid one exists
/// (the module doc, speed-up 1, says why).
fn proven_horizon(odg: &Odg, arch: &Arch, period: u64) -> u64 {
    let n = odg.nodes().len() as u64;
    let distinct = n.min(2 * period * u64::from(arch.ipc.max(1))).max(1);
    let max_latency = odg
        .edges()
        .iter()
        .map(|e| odg.edge_latency(arch, e))
        .max()
        .unwrap_or(0);
    period - 1 + (distinct - 1) * (max_latency + period - 1)
}

/// Each node's longest chain of latencies to a node without successors, start to start.
fn tails_to_last_start(odg: &Odg, arch: &Arch) -> Vec<u64> {
    let mut tail = vec![0u64; odg.nodes().len()];
    for &v in odg.topological_order().iter().rev() {
        for e in odg.edges().iter().filter(|e| e.from == v) {
            tail[v] = tail[v].max(odg.edge_latency(arch, e) + tail[e.to]);
        }
    }
    tail
}

/// Each node's start times within `horizon`, `(first, last)` (empty when first > last): with
/// speed-up 2 its window [ASAP(v), horizon − tail(v)], else every time of the horizon's
/// classes.
fn windows(
    odg: &Odg,
    arch: &Arch,
    period: u64,
    horizon: u64,
    asap: &[u64],
    options: &IlpOptions,
) -> Vec<(u64, u64)> {
    if options.windows {
        let tail = tails_to_last_start(odg, arch);
        (0..odg.nodes().len())
            .map(|v| (asap[v], horizon.saturating_sub(tail[v])))
            .collect()
    } else {
        let last = (horizon + 1).div_ceil(period) * period - 1;
        vec![(0, last); odg.nodes().len()]
    }
}

/// The program's size in terms: each node's start variables, once for the node and once
/// for each dependency it is an end of (saturating).
fn model_terms(odg: &Odg, windows: &[(u64, u64)]) -> u64 {
    let mut uses = vec![1u64; windows.len()];
    for e in odg.edges() {
        uses[e.from] += 1;
        uses[e.to] += 1;
    }
    windows
        .iter()
        .zip(uses)
        .map(|(&(lo, hi), uses)| {
            let starts = if lo > hi { 0 } else { hi - lo + 1 };
            starts.saturating_mul(uses)
        })
        .fold(0u64, u64::saturating_add)
}

/// A node's start-time variables: (time, rq).
type Starts = Vec<(u64, Variable)>;

/// The IPC indicators of one kind (matches or actions): (time, pm or pa).
type Indicators = Vec<(u64, Variable)>;

/// The built program.
struct Model {
    /// `None` when some node's window is empty.
    problem: Option<Problem>,
    /// Per node, its start-time variables.
    x: Vec<Starts>,
    /// The IPC indicators, matches then actions.
    ipc: [Indicators; 2],
    /// The last start T.
    t: Variable,
    variables: usize,
    constraints: usize,
}

impl Model {
    fn build(
        odg: &Odg,
        arch: &Arch,
        period: u64,
        horizon: u64,
        windows: &[(u64, u64)],
        bound: u64,
        options: &IlpOptions,
    ) -> Model {
        let n = odg.nodes().len();
        let latest = if options.windows {
            horizon
        } else {
            (horizon + 1).div_ceil(period) * period - 1
        };
        let mut p = Problem::new(OptimizationDirection::Minimize);
        let mut constraints = 0usize;
        let mut add = |p: &mut Problem, expr: Vec<(Variable, f64)>, op, rhs: f64| {
            p.add_constraint(expr, op, rhs);
            constraints += 1;
        };
        // Real: at the optimum it equals the latest start, an integer.
        let t = p.add_var(1.0, (bound as f64, latest as f64));
        let mut empty = false;
        let x: Vec<Starts> = (0..n)
            .map(|v| {
                let (lo, hi) = windows[v];
                empty |= lo > hi;
                (lo..=hi)
                    .map(|time| (time, p.add_binary_var(0.0)))
                    .collect()
            })
            .collect();
        let ts = |v: usize| x[v].iter().map(|&(time, var)| (var, time as f64));
        for xv in &x {
            add(
                &mut p,
                xv.iter().map(|&(_, var)| (var, 1.0)).collect(),
                ComparisonOp::Eq,
                1.0,
            );
        }
        for e in odg.edges() {
            let expr = ts(e.to)
                .chain(ts(e.from).map(|(var, c)| (var, -c)))
                .collect();
            add(
                &mut p,
                expr,
                ComparisonOp::Ge,
                odg.edge_latency(arch, e) as f64,
            );
        }
        // T at least every last node's start (the others' follows from the dependencies).
        for v in (0..n).filter(|&v| odg.edges().iter().all(|e| e.from != v)) {
            let expr = std::iter::once((t, 1.0))
                .chain(ts(v).map(|(var, c)| (var, -c)))
                .collect();
            add(&mut p, expr, ComparisonOp::Ge, 0.0);
        }
        // Per kind (matches, actions): each class's (demand, rq) and each time's rq.
        let mut ipc: [Indicators; 2] = [Vec::new(), Vec::new()];
        for (kind, capacity) in [(0, arch.match_capacity), (1, arch.action_capacity)] {
            let mut per_class: BTreeMap<u64, Vec<(f64, Variable)>> = BTreeMap::new();
            let mut per_time: BTreeMap<u64, Vec<Variable>> = BTreeMap::new();
            for (v, node) in odg.nodes().iter().enumerate() {
                let demand = match (kind, node.op) {
                    (0, Op::Match { key_bits, .. }) => arch.match_units(key_bits),
                    (1, Op::Action { fields }) => fields,
                    _ => continue,
                };
                for &(time, var) in &x[v] {
                    per_class
                        .entry(time % period)
                        .or_default()
                        .push((f64::from(demand), var));
                    per_time.entry(time).or_default().push(var);
                }
            }
            for demands in per_class.values() {
                // Only where the class could overflow.
                if demands.iter().map(|d| d.0).sum::<f64>() > f64::from(capacity) {
                    add(
                        &mut p,
                        demands.iter().map(|&(d, var)| (var, d)).collect(),
                        ComparisonOp::Le,
                        f64::from(capacity),
                    );
                }
            }
            // IPC only in classes with more candidate times than IPC.
            let mut times_of_class: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
            for &time in per_time.keys() {
                times_of_class.entry(time % period).or_default().push(time);
            }
            for times in times_of_class.values() {
                if times.len() <= arch.ipc as usize {
                    continue;
                }
                let mut in_class = Vec::with_capacity(times.len());
                for time in times {
                    let vars = &per_time[time];
                    let indicator = p.add_binary_var(0.0);
                    ipc[kind].push((*time, indicator));
                    in_class.push((indicator, 1.0));
                    if options.tight_ipc {
                        for &var in vars {
                            add(
                                &mut p,
                                vec![(var, 1.0), (indicator, -1.0)],
                                ComparisonOp::Le,
                                0.0,
                            );
                        }
                    } else {
                        let expr = vars
                            .iter()
                            .map(|&var| (var, 1.0))
                            .chain(std::iter::once((indicator, -(vars.len() as f64))))
                            .collect();
                        add(&mut p, expr, ComparisonOp::Le, 0.0);
                    }
                }
                add(&mut p, in_class, ComparisonOp::Le, f64::from(arch.ipc));
            }
        }
        let variables = 1 + x.iter().map(Vec::len).sum::<usize>() + ipc[0].len() + ipc[1].len();
        Model {
            problem: (!empty).then_some(p),
            x,
            ipc,
            t,
            variables,
            constraints,
        }
    }
}

/// The seed as a complete assignment of the model's variables, for the warm start (microlp
/// drops a hint whose completion is fractional, so every variable gets its value).
fn warm_start(
    odg: &Odg,
    x: &[Starts],
    ipc: &[Indicators; 2],
    t: Variable,
    seed: &Schedule,
) -> Vec<(Variable, f64)> {
    let mut hint = vec![(t, last_start(seed) as f64)];
    for (v, xv) in x.iter().enumerate() {
        hint.extend(
            xv.iter()
                .map(|&(time, var)| (var, f64::from(u8::from(time == seed.start[v])))),
        );
    }
    for (kind, indicators) in ipc.iter().enumerate() {
        for &(time, var) in indicators {
            let used = (0..odg.nodes().len()).any(|v| {
                seed.start[v] == time
                    && matches!(
                        (kind, odg.nodes()[v].op),
                        (0, Op::Match { .. }) | (1, Op::Action { .. })
                    )
            });
            hint.push((var, f64::from(u8::from(used))));
        }
    }
    hint
}

/// The schedule in the solver's answer: each node at the one time whose rq rounds to 1, or
/// the name of a node without exactly one.
fn read_back(
    odg: &Odg,
    period: u64,
    x: &[Starts],
    value: impl Fn(Variable) -> f64,
) -> Result<Schedule, String> {
    let start = x
        .iter()
        .enumerate()
        .map(|(v, xv)| {
            let mut on = xv.iter().filter(|&&(_, var)| value(var).round() == 1.0);
            match (on.next(), on.next()) {
                (Some(&(time, _)), None) => Ok(time),
                _ => Err(odg.nodes()[v].name.clone()),
            }
        })
        .collect::<Result<Vec<u64>, String>>()?;
    Ok(Schedule { period, start })
}

#[cfg(test)]
mod tests {
    use super::super::examples::figure_5;
    use super::*;
    use std::error::Error as _;

    #[test]
    fn the_proven_horizon_holds_the_papers_schedule() {
        let (odg, arch) = figure_5();
        // Seven nodes, but at most 2·P·IPC = 4 distinct starts: 1 + 3 · (2 + 1).
        assert_eq!(proven_horizon(&odg, &arch, 2), 10);
        assert_eq!(tails_to_last_start(&odg, &arch), vec![5, 5, 3, 3, 1, 1, 0]);
        assert!(resources_fit(&odg, &arch, 2));
        // Four one-unit matches need two classes of M̄ = 2.
        assert!(!resources_fit(&odg, &arch, 1));
    }

    #[test]
    fn an_answer_is_read_back_only_with_one_start_per_node() {
        let (odg, _) = figure_5();
        let mut p = Problem::new(OptimizationDirection::Minimize);
        let vars: Vec<Variable> = (0..3).map(|_| p.add_binary_var(0.0)).collect();
        let one = vec![(0, vars[0]), (1, vars[1])];
        let x = vec![one; 7];
        // Each node's first variable near 1: all start at 0.
        let at_zero = |v: Variable| if v == vars[0] { 0.999_999 } else { 1e-9 };
        assert_eq!(read_back(&odg, 2, &x, at_zero).unwrap().start, vec![0; 7]);
        // Both near 1, or neither: no single start.
        assert_eq!(read_back(&odg, 2, &x, |_| 1.0), Err("M0".into()));
        assert_eq!(read_back(&odg, 2, &x, |_| 0.4), Err("M0".into()));
    }

    #[test]
    fn failures_say_what_went_wrong() {
        let solver = IlpFailure::Solver(microlp::Error::InternalError("pivot".into()));
        assert_eq!(solver.to_string(), "the ILP solver failed: pivot");
        assert!(solver.source().is_some());
        let invalid = IlpFailure::Invalid(vec![Violation::Shape("no starts".into())]);
        assert_eq!(
            invalid.to_string(),
            "the ILP's answer is not a valid schedule; no starts"
        );
        assert!(invalid.source().is_none());
        assert!(IlpFailure::Unreadable("M0".into())
            .to_string()
            .contains("`M0`"));
    }

    #[test]
    fn no_period_and_no_graph_are_answered_without_a_solve() {
        let (odg, arch) = figure_5();
        let out = ilp_schedule(&odg, &arch, 0, &IlpOptions::default());
        assert_eq!((out.status, out.solves), (IlpStatus::SolverFailed, 0));
        assert_eq!(out.failure, Some(IlpFailure::Period(0)));
        let empty = Odg::new(vec![], vec![]).unwrap();
        let out = ilp_schedule(&empty, &arch, 1, &IlpOptions::default());
        assert_eq!(out.status, IlpStatus::OptimalByBound);
        assert_eq!(out.schedule.map(|s| s.start), Some(vec![]));
    }
}
