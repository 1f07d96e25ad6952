//! The lower bound (§4.1: the bottleneck resource fully used, the critical path) and a list
//! scheduler for dRMT's cyclic schedule, the fast heuristic that will seed the ILP.

use std::collections::BTreeSet;
use std::fmt;

use super::odg::{Arch, ArchError, Holder, Odg, Op, TooWide};
use super::rmt::{assign_stages, drmt_from_stages, Granularity};
use super::schedule::Schedule;

/// What no schedule can beat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct LowerBound {
    /// Processors for one packet per cycle, if the bottleneck resource is fully used:
    /// `max(ceil(match units / M̄), ceil(action fields / Ā))`, at least 1.
    pub processors: u64,
    /// The critical path: the longest chain of latencies, to the end of its last node.
    pub latency: u64,
}

/// The lower bound of `odg` on `arch`.
pub fn lower_bound(odg: &Odg, arch: &Arch) -> LowerBound {
    let (mut units, mut fields) = (0u64, 0u64);
    for n in odg.nodes() {
        match n.op {
            Op::Match { key_bits, .. } => units += u64::from(arch.match_units(key_bits)),
            Op::Action { fields: f } => fields += u64::from(f),
        }
    }
    let processors = units
        .div_ceil(u64::from(arch.match_capacity.max(1)))
        .max(fields.div_ceil(u64::from(arch.action_capacity.max(1))))
        .max(1);
    LowerBound {
        processors,
        latency: earliest_starts(odg, arch)
            .iter()
            .enumerate()
            .map(|(v, t)| t.saturating_add(odg.latency(arch, v)))
            .max()
            .unwrap_or(0),
    }
}

/// Each node's earliest start with unlimited resources (ASAP).
pub(super) fn earliest_starts(odg: &Odg, arch: &Arch) -> Vec<u64> {
    let mut t = vec![0u64; odg.nodes().len()];
    for &v in odg.topological_order() {
        for e in odg.edges().iter().filter(|e| e.from == v) {
            t[e.to] = t[e.to].max(t[v].saturating_add(odg.edge_latency(arch, e)));
        }
    }
    t
}

/// Each node's longest path to the end (its priority: the longest first).
fn tails(odg: &Odg, arch: &Arch) -> Vec<u64> {
    let mut tail = vec![0u64; odg.nodes().len()];
    for &v in odg.topological_order().iter().rev() {
        tail[v] = odg.latency(arch, v);
        for e in odg.edges().iter().filter(|e| e.from == v) {
            tail[v] = tail[v].max(odg.edge_latency(arch, e).saturating_add(tail[e.to]));
        }
    }
    tail
}

/// The largest period (processors) [`list_schedule`] takes: it books one residue class per
/// cycle of the period, and a switch has far fewer processors (the paper's need at most a few
/// dozen; `pfemu experiment pipelines` searches up to 1024).
pub const MAX_PERIOD: u64 = 1 << 16;

/// Why [`list_schedule`] refused its input (giving up on a valid input is `Ok(None)`).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ListError {
    /// The architecture fails [`Arch::check`].
    Arch(ArchError),
    /// The period is 0 or above [`MAX_PERIOD`].
    Period(u64),
    /// A node alone needs more than a processor's M̄ or Ā in one cycle: no class of any
    /// schedule can hold it.
    TooWide(TooWide),
}

impl fmt::Display for ListError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListError::Arch(e) => write!(f, "{e}"),
            ListError::Period(p) => write!(f, "a period of {p}: it must be 1 to {MAX_PERIOD}"),
            ListError::TooWide(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ListError {}

/// What one residue class holds so far (in u64: a u32 capacity plus a u32 demand does not
/// overflow).
#[derive(Clone, Default)]
struct Class {
    units: u64,
    fields: u64,
    match_times: BTreeSet<u64>,
    action_times: BTreeSet<u64>,
}

/// A cyclic schedule with period `period` found by list scheduling: nodes in order of their
/// longest path to the end (among those whose predecessors are placed), each at the earliest
/// start its dependencies allow whose residue class still has the match units or action
/// fields and the IPC it needs. `Ok(None)` when some node fits no class (the heuristic gives
/// up; a schedule may still exist). An error for an architecture that fails [`Arch::check`],
/// a period of 0 or above [`MAX_PERIOD`], or a node that alone exceeds a cycle's M̄ or Ā (no
/// schedule exists at any period), naming it.
pub fn list_schedule(odg: &Odg, arch: &Arch, period: u64) -> Result<Option<Schedule>, ListError> {
    arch.check().map_err(ListError::Arch)?;
    if !(1..=MAX_PERIOD).contains(&period) {
        return Err(ListError::Period(period));
    }
    if let Some(e) = arch.too_wide(odg, Holder::Processor) {
        return Err(ListError::TooWide(e));
    }
    Ok(list_schedule_checked(odg, arch, period))
}

/// [`list_schedule`] once its input is checked.
fn list_schedule_checked(odg: &Odg, arch: &Arch, period: u64) -> Option<Schedule> {
    let n = odg.nodes().len();
    let tail = tails(odg, arch);
    let mut preds_left = vec![0usize; n];
    for e in odg.edges() {
        preds_left[e.to] += 1;
    }
    let mut ready_at = vec![0u64; n];
    let mut start = vec![0u64; n];
    let mut classes = vec![Class::default(); period as usize];
    let mut ready: Vec<usize> = (0..n).filter(|&v| preds_left[v] == 0).collect();
    while !ready.is_empty() {
        // The ready node with the longest path to the end; ties by index, for determinism.
        let (i, &v) = ready
            .iter()
            .enumerate()
            .max_by_key(|(_, &v)| (tail[v], std::cmp::Reverse(v)))?;
        ready.swap_remove(i);
        let t = place(&mut classes, arch, odg.nodes()[v].op, ready_at[v], period)?;
        start[v] = t;
        for e in odg.edges().iter().filter(|e| e.from == v) {
            ready_at[e.to] = ready_at[e.to].max(t + odg.edge_latency(arch, e));
            preds_left[e.to] -= 1;
            if preds_left[e.to] == 0 {
                ready.push(e.to);
            }
        }
    }
    Some(Schedule { period, start })
}

/// The earliest start at or after `earliest` whose class can take `op`; books it.
fn place(classes: &mut [Class], arch: &Arch, op: Op, earliest: u64, period: u64) -> Option<u64> {
    let mut best: Option<u64> = None;
    for (r, c) in classes.iter().enumerate() {
        let (fits, times) = match op {
            Op::Match { key_bits, .. } => (
                c.units + u64::from(arch.match_units(key_bits)) <= u64::from(arch.match_capacity),
                &c.match_times,
            ),
            Op::Action { fields } => (
                c.fields + u64::from(fields) <= u64::from(arch.action_capacity),
                &c.action_times,
            ),
        };
        if !fits {
            continue;
        }
        // A start the class already has costs no IPC; a new one needs room under IPC.
        let shared = times.range(earliest..).next().copied();
        let fresh = (times.len() < arch.ipc as usize).then(|| {
            let r = r as u64;
            earliest + (r + period - earliest % period) % period
        });
        let t = match (shared, fresh) {
            (Some(a), Some(b)) => a.min(b),
            (Some(t), None) | (None, Some(t)) => t,
            // IPC is used up by starts before `earliest`: this class cannot take the node.
            (None, None) => continue,
        };
        best = Some(best.map_or(t, |b| b.min(t)));
    }
    let t = best?;
    let c = &mut classes[(t % period) as usize];
    match op {
        Op::Match { key_bits, .. } => {
            c.units += u64::from(arch.match_units(key_bits));
            c.match_times.insert(t);
        }
        Op::Action { fields } => {
            c.fields += u64::from(fields);
            c.action_times.insert(t);
        }
    }
    Some(t)
}

/// The better of the two heuristics at `period`: [`list_schedule`], and the fine-grained
/// stage plan on `arch`'s own capacities laid out as a cyclic schedule
/// ([`drmt_from_stages`]: stage k's matches at k·L, one class per stage), which exists for
/// every period of at least its stage count. The paper's code seeds its ILP the same way,
/// from the fine-grained RMT solution. List scheduling spreads matches over more start times
/// than IPC leaves classes for on deep graphs; the stage layout never does, so on the
/// random graphs of §4 it needs a third fewer processors at IPC 1. Of two schedules, the one
/// with the lower latency. `None` also for an architecture that fails [`Arch::check`], and
/// for a period of 0 (no processor).
pub fn heuristic_schedule(odg: &Odg, arch: &Arch, period: u64) -> Option<Schedule> {
    // At period 0 the stage layout would count the processors as 1 and answer with a
    // schedule of period 1, not the one asked for.
    if arch.check().is_err() || period == 0 {
        return None;
    }
    let list = list_schedule(odg, arch, period).ok().flatten();
    let stages = assign_stages(odg, arch, Granularity::Fine)
        .ok()
        .filter(|plan| u64::from(plan.stages) <= period)
        .map(|plan| drmt_from_stages(odg, &plan, arch, period));
    [list, stages]
        .into_iter()
        .flatten()
        .min_by_key(|s| s.latency(odg, arch))
}

/// The fewest processors, from the lower bound up to `max_processors`, for which
/// [`heuristic_schedule`] finds a schedule, with that schedule. `None` at once when none can
/// exist: an architecture that fails [`Arch::check`], or a node wider than a cycle's M̄ or Ā.
/// The search ends by the fine-grained stage plan's stage count, where the stage layout
/// always has a schedule.
pub fn fewest_processors(odg: &Odg, arch: &Arch, max_processors: u64) -> Option<Schedule> {
    if arch.check().is_err() || arch.too_wide(odg, Holder::Processor).is_some() {
        return None;
    }
    let from = lower_bound(odg, arch).processors;
    (from..=max_processors).find_map(|p| heuristic_schedule(odg, arch, p))
}
