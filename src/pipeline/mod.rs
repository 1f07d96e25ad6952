//! Pipelines beside run-to-completion: programs as operation dependency graphs, and the RMT
//! and dRMT architectures that schedule them (Chole et al., "dRMT: Disaggregated
//! Programmable Switching", SIGCOMM 2017, §3).
//!
//! A program is an [`Odg`]: match nodes (a key of some bits looked up in a table) and action
//! nodes (fields modified), joined by dependency edges ([`Edge`]): one on a result (a match
//! or action dependency) waits the match latency ΔM after a match, the action latency ΔA
//! after an action; an ordering edge (a successor or reverse-match dependency) waits 0, its
//! dependent starting no earlier than its source. An [`Arch`] gives a processor's
//! (or an RMT stage's) match capacity M̄ in units of b-bit keys, its action capacity Ā in
//! fields, the two latencies, and its inter-packet concurrency IPC; [`Arch::DRMT`] and
//! [`Arch::RMT`] are Table 1's. The schedulers, validators and simulators refuse an `Arch`
//! that fails [`Arch::check`] (a capacity, unit size or IPC of 0, a latency over 2^20
//! cycles), naming the field. The list scheduler and the stage assignment refuse a graph
//! with a node that alone needs more than one cycle's M̄ or Ā (no schedule can hold it),
//! naming it: a [`TooWide`] in [`ListError`] and [`RmtError`] alike.
//!
//! A dRMT schedule is one packet's start times, repeated for every packet: packets reach a
//! processor every P cycles (P processors fed round-robin), so at any cycle the processor runs,
//! for different packets, the operations of one packet whose start times are equal modulo P
//! (Observation 2). A [`Schedule`] is valid iff the dependencies hold and, in each of the P
//! classes of start times, the matches fit M̄, the actions fit Ā, and the matches (and the
//! actions) start at no more than IPC distinct times, each a different packet (Observation 3,
//! Theorem 3.5). [`validate`] checks exactly that, and names every violation; every scheduler
//! is tested against it.
//!
//! The schedulers: [`lower_bound`] (the bottleneck resource, the critical path);
//! [`heuristic_schedule`] and [`fewest_processors`], the better of list scheduling and the
//! fine-grained stage plan laid out cyclically; with the `ilp` feature (on with `lab`), `ilp`,
//! the paper's integer linear program with its speed-ups, seeded by the heuristics. For RMT,
//! [`assign_stages`] places whole tables (RMT) or matches and actions apart (fine-grained
//! RMT) in stages, checked by [`validate_stages`]; [`drmt_from_stages`] turns a stage plan
//! into a dRMT schedule of the same throughput (Theorem 3.3 by construction).
//!
//! The simulator ([`simulate_drmt`], [`simulate_rmt`]) runs packets through both pipelines,
//! cycle by cycle, and measures throughput, latency and threads in flight, counting what a
//! bad schedule breaks: processor resources, and tables asked twice in a cycle.
//!
//! A graph is built in code ([`Odg::new`]), read from a file a user writes (a
//! `Description`, JSON with the `serde` feature), or taken from [`programs`]: the shipped
//! programs' graphs, with what the same programs cost on the run-to-completion PFE. Every
//! graph is within [`Odg::MAX_NODES`] nodes and [`Odg::MAX_EDGES`] edges: the constructor
//! refuses a larger one ([`OdgError::TooManyNodes`], [`OdgError::TooManyEdges`]) before
//! any work on it, so no scheduler is handed a graph it would take hours on.
//!
//! ## Where pfemu differs from the paper, and why
//!
//! - **Ordering edges.** The paper's text gives τ(u, v) as ΔM or ΔA (§3.3); its published
//!   scheduler also has successor and reverse-match dependencies of latency dS = 0. pfemu has
//!   both kinds ([`EdgeKind`]), with dS fixed at 0 as that code has it (a constant beside
//!   ΔM and ΔA there; the text's Table 1 has no dS). Two edges between one pair are kept as
//!   one, of the larger latency ([`Odg::new`]): with dS = 0 a result's is never smaller.
//!   The random graphs follow the paper's generator, which draws no ordering;
//!   [`examples::random_with_orderings`] adds some, for tests.
//! - **Coarse tables.** The paper's code pairs each `X_MATCH` with its `X_ACTION` by name; an
//!   [`Odg`] has no table nodes, so [`coarse_tables`] pairs a match with an action on its
//!   result by the graph's structure (the rules in `rmt`'s documentation). A table ordered
//!   after another shares its stage where the fine rule allows it, so that every coarse plan
//!   stays a fine one.
//! - **RMT's latency** is counted as stages × (ΔM + ΔA): every packet crosses every stage.
//! - **The ILP** runs on microlp (pure Rust, so it builds wherever `cargo` does), not Gurobi;
//!   its IPC constraints are by default one per start variable (rq ≤ pm) rather than the
//!   paper's one sum per (q, r), the same integer solutions with a tighter relaxation
//!   (`IlpOptions::tight_ipc` gives the paper's); the paper leaves its three speed-ups to its
//!   extended version, and `ilp`'s documentation gives pfemu's reading of them. Its budget is
//!   a count of branch-and-bound nodes per solve (`DEFAULT_NODE_LIMIT` by default), which
//!   gives the same answer on any machine, where Gurobi's is a wall-clock time; a time limit
//!   is an optional guard, and an outcome says which one struck.
//! - **Programs.** The paper's real programs (from switch.p4) are not available; the shipped
//!   programs ([`programs`]) stand in for them, and the random graphs ([`examples::random`])
//!   follow the paper's generator.

#[cfg(feature = "serde")]
mod describe;
pub mod examples;
#[cfg(feature = "ilp")]
pub mod ilp;
mod list;
mod odg;
pub mod programs;
mod rmt;
mod schedule;
mod sim;

#[cfg(feature = "serde")]
pub use describe::{
    ActionDescription, DescribeError, Description, MatchDescription, NodeDescription,
};

#[cfg(feature = "ilp")]
pub use ilp::{
    ilp_fewest_processors, ilp_schedule, IlpFailure, IlpOptions, IlpOutcome, IlpStatus,
    DEFAULT_NODE_LIMIT, MAX_ILP_TERMS,
};
pub use list::{
    fewest_processors, heuristic_schedule, list_schedule, lower_bound, ListError, LowerBound,
    MAX_PERIOD,
};
pub use odg::{Arch, ArchError, Edge, EdgeKind, Holder, Node, Odg, OdgError, Op, TooWide, Width};
pub use programs::PfeProfile;
pub use rmt::{
    assign_stages, coarse_tables, drmt_from_stages, rmt_throughput, stage_lower_bound,
    validate_stages, Granularity, RmtError, StagePlan, StageViolation,
};
pub use schedule::{validate, validate_processors, Schedule, Violation};
pub use sim::{
    simulate_drmt, simulate_drmt_with, simulate_rmt, DrmtOptions, SimConfig, SimError, SimReport,
    MAX_SIM_CYCLES, MAX_SIM_UNITS,
};
