//! RMT's stage assignment, coarse (whole tables) and fine-grained (matches and actions apart),
//! its validator and lower bound, and Theorem 3.3 by construction: any valid stage plan
//! becomes a valid dRMT schedule of the same throughput (dRMT paper, §2.1, §3.1, §4.1).
//!
//! An RMT pipe gives every packet one pass through `S` stages, each with a match unit of M̄
//! b-bit units and an action unit of Ā fields; a program that needs more stages than the chip
//! has recirculates. Two granularities, as the paper's evaluation compares them:
//!
//! - [`Granularity::Fine`]: each stage is a match slot followed by an action slot (slots
//!   alternate: slot `2k` holds stage k's matches, slot `2k + 1` its actions). A dependency
//!   whose latency is positive puts the dependent in a strictly later slot, so a match and an
//!   action that depends on it may share a stage, while an action -> match dependency moves
//!   the match to the next stage (action -> action too). An ordering edge
//!   ([`EdgeKind::Order`], latency 0) needs only the same slot or a later one: its two ends
//!   share a stage unless it runs from an action to a match. Per stage, matches use at most
//!   M̄ units and actions at most Ā fields.
//! - [`Granularity::Coarse`]: a P4 table (a match and its action) sits whole in one stage; a
//!   table that depends on another table's result goes to a strictly later stage, one only
//!   ordered after another the stage the fine rule allows (the same, unless the ordering
//!   runs from an action to a match); per stage the tables' matches use at most M̄ units and
//!   their actions at most Ā fields.
//!
//! ## Which nodes form a coarse table
//!
//! An [`Odg`] has no table nodes, so the coarse model contracts it ([`coarse_tables`]), as the
//! paper's code pairs each `X_MATCH` with its `X_ACTION`, but from the graph's structure:
//!
//! 1. a table is a match and one action that depends on its result directly (a
//!    `match -> action` edge of [`EdgeKind::Result`]); a match or an action left unpaired is a table of its own (a match without action,
//!    an action without match units, as a condition's or a default action's);
//! 2. the candidate pairs are taken best first: the longest common name prefix (`ipv4_MATCH`
//!    with `ipv4_ACTION`, not with `ipv4_acl_ACTION`), then the closest in the listing (a
//!    table is usually written match first, action right after), then the first listed;
//! 3. a pair is skipped when its match or action is already paired, or when joining it would
//!    close a cycle among tables (the action also waits, through other tables, for something
//!    that waits for the match: no stage could hold both).
//!
//! Rule 3 keeps the tables acyclic (single nodes are, as the graph is), so every program has a
//! coarse placement unless one node alone overflows a stage; and the only edge inside a table
//! is its match -> action edge.
//!
//! Every valid coarse plan is a valid fine one (a table's match and action share a stage,
//! match first; between tables the stage grows, or for an ordering obeys the fine rule), so fine-grained RMT never needs more stages
//! than coarse RMT at the optimum; [`assign_stages`] keeps that true of its own results too.
//!
//! A pipe's latency is its stages times (ΔM + ΔA): every packet crosses every stage.

use std::collections::BTreeMap;
use std::fmt;

use super::odg::{Arch, ArchError, Edge, EdgeKind, Holder, Odg, Op, TooWide};
use super::schedule::Schedule;

/// How finely RMT may split a table across stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Granularity {
    /// Whole tables: a match and its action in one stage.
    Coarse,
    /// Matches and actions placed apart (fine-grained RMT).
    Fine,
}

impl fmt::Display for Granularity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Granularity::Coarse => "RMT",
            Granularity::Fine => "fine-grained RMT",
        })
    }
}

/// A placement: the stage of every node (by index) and the stages used.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StagePlan {
    /// The rules the plan follows.
    pub granularity: Granularity,
    /// The stage of each node, by index, from 0.
    pub stage: Vec<u32>,
    /// Stages used: one more than the last node's stage (0 for an empty program).
    pub stages: u32,
}

impl StagePlan {
    /// A packet's latency through the pipe: every stage's match and action, `stages` ×
    /// (ΔM + ΔA).
    pub fn latency(&self, arch: &Arch) -> u64 {
        u64::from(self.stages)
            .saturating_mul(arch.match_latency.saturating_add(arch.action_latency))
    }
}

/// What makes a stage plan invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StageViolation {
    /// The architecture fails [`Arch::check`]: nothing is checked against it.
    Arch(ArchError),
    /// The plan does not give every node a stage, or its stage count is not one more than
    /// its last stage.
    Shape(String),
    /// `to` sits in stage `stage`, before `earliest`, the first its dependency on `from`
    /// allows.
    Dependency {
        /// The node depended on.
        from: String,
        /// The dependent node.
        to: String,
        /// Its stage.
        stage: u32,
        /// The earliest stage the dependency allows.
        earliest: u32,
    },
    /// The matches of stage `stage` need `used` match units, more than M̄.
    MatchCapacity {
        /// The stage.
        stage: u32,
        /// Match units used.
        used: u64,
        /// M̄.
        capacity: u32,
    },
    /// The actions of stage `stage` modify `used` fields, more than Ā.
    ActionCapacity {
        /// The stage.
        stage: u32,
        /// Fields modified.
        used: u64,
        /// Ā.
        capacity: u32,
    },
    /// Coarse RMT: `node` of the table of `table` sits in stage `stage`, the table's match
    /// in `table_stage`.
    TableSplit {
        /// The table's match.
        table: String,
        /// The action placed apart.
        node: String,
        /// Its stage.
        stage: u32,
        /// The match's stage.
        table_stage: u32,
    },
}

impl fmt::Display for StageViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StageViolation::Arch(e) => write!(f, "{e}"),
            StageViolation::Shape(why) => f.write_str(why),
            StageViolation::Dependency {
                from,
                to,
                stage,
                earliest,
            } => write!(
                f,
                "`{to}` sits in stage {stage}, but its dependency on `{from}` needs stage {earliest} or later"
            ),
            StageViolation::MatchCapacity {
                stage,
                used,
                capacity,
            } => write!(
                f,
                "stage {stage}: matches need {used} match units, more than M = {capacity}"
            ),
            StageViolation::ActionCapacity {
                stage,
                used,
                capacity,
            } => write!(
                f,
                "stage {stage}: actions modify {used} fields, more than A = {capacity}"
            ),
            StageViolation::TableSplit {
                table,
                node,
                stage,
                table_stage,
            } => write!(
                f,
                "`{node}` of table `{table}` sits in stage {stage}, the table's match in stage {table_stage}"
            ),
        }
    }
}

/// Why no stage plan was made.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RmtError {
    /// The architecture fails [`Arch::check`].
    Arch(ArchError),
    /// A node alone needs more than a stage's M̄ or Ā.
    TooWide(TooWide),
}

impl fmt::Display for RmtError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RmtError::Arch(e) => write!(f, "{e}"),
            RmtError::TooWide(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for RmtError {}

/// The coarse tables: for each node, by index, the node its table is named after (its
/// match, or itself for a match or an unpaired action), by the rule of the module
/// documentation.
pub fn coarse_tables(odg: &Odg) -> Vec<usize> {
    let nodes = odg.nodes();
    let common_prefix =
        |a: &str, b: &str| a.chars().zip(b.chars()).take_while(|(x, y)| x == y).count();
    let mut pairs: Vec<(usize, usize)> = odg
        .edges()
        .iter()
        .filter(|e| {
            e.kind == EdgeKind::Result
                && matches!(nodes[e.from].op, Op::Match { .. })
                && matches!(nodes[e.to].op, Op::Action { .. })
        })
        .map(|e| (e.from, e.to))
        .collect();
    pairs.sort_by_key(|&(m, a)| {
        (
            std::cmp::Reverse(common_prefix(&nodes[m].name, &nodes[a].name)),
            m.abs_diff(a),
            m,
            a,
        )
    });
    let mut table: Vec<usize> = (0..nodes.len()).collect();
    let mut paired = vec![false; nodes.len()];
    for (m, a) in pairs {
        if paired[m] || paired[a] {
            continue;
        }
        table[a] = m;
        if tables_acyclic(odg, &table) {
            paired[m] = true;
            paired[a] = true;
        } else {
            table[a] = a;
        }
    }
    table
}

/// Whether the graph of tables (`table[v]`: the table of node v) has no cycle (Kahn's
/// algorithm on the edges between different tables), in time linear in the graph.
fn tables_acyclic(odg: &Odg, table: &[usize]) -> bool {
    let n = table.len();
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut preds = vec![0usize; n];
    for e in odg.edges() {
        let (a, b) = (table[e.from], table[e.to]);
        if a != b {
            succs[a].push(b);
            preds[b] += 1;
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&t| table[t] == t && preds[t] == 0).collect();
    let mut seen = 0;
    while let Some(t) = ready.pop() {
        seen += 1;
        for &b in &succs[t] {
            preds[b] -= 1;
            if preds[b] == 0 {
                ready.push(b);
            }
        }
    }
    seen == (0..n).filter(|&t| table[t] == t).count()
}

/// Whether node `v` is an action: its slot in a stage (a stage's matches come first).
fn is_action(odg: &Odg, v: usize) -> u64 {
    u64::from(matches!(odg.nodes()[v].op, Op::Action { .. }))
}

/// Fine-grained RMT: the first stage `e.to` may sit in when `e.from` sits in `stage` and the
/// edge waits `latency` cycles. Slots alternate (stage k's matches in slot 2k, its actions
/// in 2k + 1); a positive latency needs a strictly later slot, none the same slot or later.
/// `u32::MAX` past any stage.
fn fine_earliest(odg: &Odg, e: &Edge, stage: u32, latency: u64) -> u32 {
    let slot = 2 * u64::from(stage) + is_action(odg, e.from) + u64::from(latency > 0);
    // The first stage whose slot of the dependent's kind is `slot` or later.
    let earliest = slot.saturating_sub(is_action(odg, e.to)).div_ceil(2);
    u32::try_from(earliest).unwrap_or(u32::MAX)
}

/// Coarse RMT: the first stage the table of `e.to` may sit in when the table of `e.from`
/// (another table) sits in `stage`. A table that waits for another's result goes to a later
/// stage; an ordering edge ([`EdgeKind::Order`]) needs only what the fine rule needs, so
/// every coarse plan stays a fine one: the same stage unless it runs from an action to a
/// match (a stage's matches come before its actions).
fn coarse_earliest(odg: &Odg, e: &Edge, stage: u32) -> u32 {
    match e.kind {
        EdgeKind::Result => stage.saturating_add(1),
        EdgeKind::Order => fine_earliest(odg, e, stage, 0),
    }
}

/// The units a granularity places: nodes (fine) or tables (coarse), with their demands and
/// the dependencies between them. A unit at stage s sits at position `2s + offset`; an edge
/// `(u, v, gap)` needs `position(v) >= position(u) + gap`.
struct Units {
    /// For each unit: match units, action fields, offset.
    units: Vec<(u32, u32, u64)>,
    /// For each node, its unit.
    unit_of: Vec<usize>,
    /// Dependencies between distinct units.
    edges: Vec<(usize, usize, u64)>,
}

impl Units {
    fn new(odg: &Odg, arch: &Arch, granularity: Granularity) -> Units {
        let nodes = odg.nodes();
        let demand = |v: usize| match nodes[v].op {
            Op::Match { key_bits, .. } => (arch.match_units(key_bits), 0),
            Op::Action { fields } => (0, fields),
        };
        match granularity {
            Granularity::Fine => Units {
                units: (0..nodes.len())
                    .map(|v| {
                        let (u, f) = demand(v);
                        let offset = u64::from(matches!(nodes[v].op, Op::Action { .. }));
                        (u, f, offset)
                    })
                    .collect(),
                unit_of: (0..nodes.len()).collect(),
                edges: odg
                    .edges()
                    .iter()
                    .map(|e| (e.from, e.to, u64::from(odg.edge_latency(arch, e) > 0)))
                    .collect(),
            },
            Granularity::Coarse => {
                let table = coarse_tables(odg);
                let mut units: Vec<(u32, u32, u64)> = Vec::new();
                let mut unit_of = vec![usize::MAX; nodes.len()];
                for v in 0..nodes.len() {
                    if table[v] == v {
                        unit_of[v] = units.len();
                        let (u, f) = demand(v);
                        units.push((u, f, 0));
                    }
                }
                for v in 0..nodes.len() {
                    if table[v] != v {
                        unit_of[v] = unit_of[table[v]];
                        units[unit_of[v]].1 += demand(v).1;
                    }
                }
                // One edge per pair of tables, however many of their nodes' edges join them,
                // with the largest gap any of them needs.
                let mut pairs: BTreeMap<(usize, usize), u64> = BTreeMap::new();
                for e in odg.edges() {
                    let (u, v) = (unit_of[e.from], unit_of[e.to]);
                    if u != v {
                        let gap = pairs.entry((u, v)).or_default();
                        *gap = (*gap).max(2 * u64::from(coarse_earliest(odg, e, 0) > 0));
                    }
                }
                let edges = pairs.into_iter().map(|((u, v), gap)| (u, v, gap)).collect();
                Units {
                    units,
                    unit_of,
                    edges,
                }
            }
        }
    }
}

/// Checks `plan` for `odg` on stages of `arch`: its shape, (coarse) that no table is split,
/// every dependency under the plan's granularity, and per stage the match units (M̄) and
/// action fields (Ā). Returns every violation found, in that order.
pub fn validate_stages(
    odg: &Odg,
    arch: &Arch,
    plan: &StagePlan,
) -> Result<(), Vec<StageViolation>> {
    arch.check().map_err(|e| vec![StageViolation::Arch(e)])?;
    let nodes = odg.nodes();
    let n = nodes.len();
    // One more than the last stage; `None` past u32, which no stage count can say.
    let used = plan
        .stage
        .iter()
        .max()
        .map_or(Some(0), |&s| s.checked_add(1));
    if plan.stage.len() != n || used != Some(plan.stages) {
        return Err(vec![StageViolation::Shape(format!(
            "a stage plan gives each of the {n} nodes a stage and counts one more stage than \
             its last (this one: {} stages given, {} counted, last stage {:?})",
            plan.stage.len(),
            plan.stages,
            plan.stage.iter().max()
        ))]);
    }
    let s = &plan.stage;
    let mut bad = Vec::new();
    let table = match plan.granularity {
        Granularity::Coarse => coarse_tables(odg),
        Granularity::Fine => (0..n).collect(),
    };
    for v in (0..n).filter(|&v| table[v] != v && s[v] != s[table[v]]) {
        bad.push(StageViolation::TableSplit {
            table: nodes[table[v]].name.clone(),
            node: nodes[v].name.clone(),
            stage: s[v],
            table_stage: s[table[v]],
        });
    }
    for e in odg.edges() {
        let earliest = match plan.granularity {
            // Inside a table (a match -> action edge) the table's own stage.
            Granularity::Coarse if table[e.from] == table[e.to] => s[e.from],
            // Between tables a later one, or for an ordering edge the fine rule's.
            Granularity::Coarse => coarse_earliest(odg, e, s[e.from]),
            Granularity::Fine => fine_earliest(odg, e, s[e.from], odg.edge_latency(arch, e)),
        };
        if s[e.to] < earliest {
            bad.push(StageViolation::Dependency {
                from: nodes[e.from].name.clone(),
                to: nodes[e.to].name.clone(),
                stage: s[e.to],
                earliest,
            });
        }
    }
    // Match units and action fields per stage; stages may be many and sparse. Sums of u32
    // demands in u64 cannot overflow (fewer than 2^32 nodes) and are compared exactly.
    let mut usage: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for v in 0..n {
        let (u, f) = usage.entry(s[v]).or_default();
        match nodes[v].op {
            Op::Match { key_bits, .. } => *u += u64::from(arch.match_units(key_bits)),
            Op::Action { fields } => *f += u64::from(fields),
        }
    }
    for (&stage, &(u, f)) in &usage {
        if u > u64::from(arch.match_capacity) {
            bad.push(StageViolation::MatchCapacity {
                stage,
                used: u,
                capacity: arch.match_capacity,
            });
        }
        if f > u64::from(arch.action_capacity) {
            bad.push(StageViolation::ActionCapacity {
                stage,
                used: f,
                capacity: arch.action_capacity,
            });
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}

/// A list assignment: units (nodes for [`Granularity::Fine`], tables for
/// [`Granularity::Coarse`]) taken in dependency order, the one with the longest chain still
/// after it first, each put in the earliest stage its dependencies allow that still has the
/// match units and action fields it needs.
///
/// The fine result is never worse than the coarse one: when the coarse plan (a valid fine
/// plan too) uses fewer stages, it is returned, relabelled fine. A node that alone exceeds a
/// stage's M̄ or Ā is refused, naming it, and so is an architecture that fails
/// [`Arch::check`].
///
/// ```
/// use pfemu::pipeline::{assign_stages, validate_stages, Arch, Edge, Granularity, Node, Odg, Op};
///
/// // Two tables; the second matches on what the first's action wrote.
/// let node = |name: &str, op| Node { name: name.into(), op };
/// let m = Op::Match { key_bits: 32, entries: 1024 };
/// let a = Op::Action { fields: 2 };
/// let odg = Odg::new(
///     vec![node("acl_MATCH", m), node("acl_ACTION", a), node("fwd_MATCH", m), node("fwd_ACTION", a)],
///     vec![Edge::result(0, 1), Edge::result(1, 2), Edge::result(2, 3)],
/// )?;
/// let plan = assign_stages(&odg, &Arch::RMT, Granularity::Coarse)?;
/// assert_eq!(plan.stage, [0, 0, 1, 1]);
/// assert_eq!(validate_stages(&odg, &Arch::RMT, &plan), Ok(()));
/// assert_eq!(plan.latency(&Arch::RMT), 2 * (18 + 2));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn assign_stages(
    odg: &Odg,
    arch: &Arch,
    granularity: Granularity,
) -> Result<StagePlan, RmtError> {
    arch.check().map_err(RmtError::Arch)?;
    let plan = list_assign(odg, arch, granularity)?;
    if granularity == Granularity::Fine {
        // A greedy order can miss what the coarser rules found; the coarse plan obeys the
        // fine rules too.
        if let Ok(coarse) = list_assign(odg, arch, Granularity::Coarse) {
            if coarse.stages < plan.stages {
                return Ok(StagePlan {
                    granularity: Granularity::Fine,
                    ..coarse
                });
            }
        }
    }
    Ok(plan)
}

fn list_assign(odg: &Odg, arch: &Arch, granularity: Granularity) -> Result<StagePlan, RmtError> {
    // A coarse table's demand is its match's and its one action's, so checking nodes suffices.
    if let Some(e) = arch.too_wide(odg, Holder::Stage) {
        return Err(RmtError::TooWide(e));
    }
    let u = Units::new(odg, arch, granularity);
    let k = u.units.len();
    let mut preds_left = vec![0usize; k];
    for &(_, b, _) in &u.edges {
        preds_left[b] += 1;
    }
    let tail = unit_tails(&u);
    // Earliest position (2·stage + offset) each unit's placed predecessors allow.
    let mut ready_at = vec![0u64; k];
    let mut stage_of = vec![0u32; k];
    let mut room: Vec<(u32, u32)> = Vec::new();
    let mut ready: Vec<usize> = (0..k).filter(|&x| preds_left[x] == 0).collect();
    let mut placed = 0;
    while !ready.is_empty() {
        let (i, &x) = ready
            .iter()
            .enumerate()
            .max_by_key(|(_, &x)| (tail[x], std::cmp::Reverse(x)))
            .expect("the ready list is not empty");
        ready.swap_remove(i);
        let (units, fields, offset) = u.units[x];
        let mut s = ready_at[x].saturating_sub(offset).div_ceil(2) as usize;
        // Every unit fits an empty stage (its nodes were checked above), so this ends.
        // A stage's use never exceeds its capacity, so the subtractions do not underflow.
        while room.get(s).is_some_and(|&(mu, af)| {
            units > arch.match_capacity - mu || fields > arch.action_capacity - af
        }) {
            s += 1;
        }
        if room.len() <= s {
            room.resize(s + 1, (0, 0));
        }
        room[s].0 += units;
        room[s].1 += fields;
        stage_of[x] = s as u32;
        placed += 1;
        let pos = 2 * s as u64 + offset;
        for &(_, b, gap) in u.edges.iter().filter(|&&(a, _, _)| a == x) {
            ready_at[b] = ready_at[b].max(pos + gap);
            preds_left[b] -= 1;
            if preds_left[b] == 0 {
                ready.push(b);
            }
        }
    }
    // The tables are acyclic by construction (`coarse_tables`), the nodes by `Odg::new`.
    debug_assert_eq!(placed, k, "a unit was left unplaced");
    let stage: Vec<u32> = u.unit_of.iter().map(|&x| stage_of[x]).collect();
    let stages = stage.iter().max().map_or(0, |&s| s + 1);
    Ok(StagePlan {
        granularity,
        stage,
        stages,
    })
}

/// Each unit's longest chain of positions to the end of the program (its priority).
fn unit_tails(u: &Units) -> Vec<u64> {
    let k = u.units.len();
    let mut tail = vec![0u64; k];
    // Relax in rounds: the longest chain has fewer than k edges when the units are acyclic.
    for _ in 0..k {
        let mut changed = false;
        for &(a, b, gap) in &u.edges {
            let via = gap + tail[b];
            if via > tail[a] {
                tail[a] = via;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    tail
}

/// Stages no plan of `granularity` can do with: the bottleneck resource fully used
/// (`ceil(match units / M̄)`, `ceil(action fields / Ā)`) and the dependency chain (fine: in
/// slots, two a stage; coarse: a stage per table of the longest chain of tables). 0 for an
/// empty program.
pub fn stage_lower_bound(odg: &Odg, arch: &Arch, granularity: Granularity) -> u32 {
    let nodes = odg.nodes();
    if nodes.is_empty() {
        return 0;
    }
    let (mut units, mut fields) = (0u64, 0u64);
    for node in nodes {
        match node.op {
            Op::Match { key_bits, .. } => units += u64::from(arch.match_units(key_bits)),
            Op::Action { fields: f } => fields += u64::from(f),
        }
    }
    let resources = units
        .div_ceil(u64::from(arch.match_capacity.max(1)))
        .max(fields.div_ceil(u64::from(arch.action_capacity.max(1))));
    let chain = match granularity {
        Granularity::Fine => {
            // The earliest slot of each node with unlimited resources.
            let mut slot: Vec<u64> = (0..nodes.len()).map(|v| is_action(odg, v)).collect();
            for &v in odg.topological_order() {
                for e in odg.edges().iter().filter(|e| e.from == v) {
                    let next = slot[v] + u64::from(odg.edge_latency(arch, e) > 0);
                    // The first slot of the dependent's kind from `next` on.
                    let needed = next + (next + is_action(odg, e.to)) % 2;
                    slot[e.to] = slot[e.to].max(needed);
                }
            }
            slot.iter().max().map_or(0, |&t| t / 2 + 1)
        }
        // The longest chain of tables, two positions (a stage) per table waited for.
        Granularity::Coarse => {
            let tables = Units::new(odg, arch, Granularity::Coarse);
            unit_tails(&tables).iter().max().map_or(0, |&t| t / 2 + 1)
        }
    };
    u32::try_from(resources.max(chain)).unwrap_or(u32::MAX)
}

/// Packets per cycle through `stages` physical stages for a program needing `plan_stages`:
/// one pass per packet if they suffice, else each packet recirculates `ceil(S / stages)`
/// times, `min(1, 1 / ceil(S / stages))`. A program of no stages runs at 1; no stages at
/// all carry nothing (0).
pub fn rmt_throughput(plan_stages: u32, stages: u32) -> f64 {
    if plan_stages == 0 {
        1.0
    } else if stages == 0 {
        0.0
    } else {
        1.0 / f64::from(plan_stages.div_ceil(stages))
    }
}

/// Theorem 3.3 by construction: the dRMT schedule that runs `plan`'s operations in the same
/// order on `processors` processors, at the throughput RMT gets from that many stages.
///
/// Stage k's matches start at `k·L`, its actions at `k·L + ΔM`, with `L >= ΔM + ΔA` the time
/// one stage takes on the processor; the period is `P = processors · ceil(S / processors)`
/// (just `processors` when the `S` stages fit, so one packet a cycle), which is at least `S`
/// and gives `processors / P` packets a cycle, exactly [`rmt_throughput`]`(S, processors)`.
/// `L` is the smallest such time whose multiples `0, L, .., (S-1)·L` fall in distinct
/// classes mod P (`P / gcd(L, P) >= S`; one exists, as any `L ≡ 1 mod P` qualifies).
///
/// The schedule passes [`validate`](super::validate) on `arch` whenever the plan passes
/// [`validate_stages`] on `arch` (the dRMT processor has an RMT stage's M̄ and Ā) and
/// `arch.ipc >= 1`:
///
/// - dependencies: a valid plan (coarse plans obey the fine rules) has a match -> action edge
///   within or across stages, which waits at least ΔM; every other edge goes to a later
///   stage, which waits at least `L - ΔM >= ΔA` (from an action) or `L >= ΔM` (from a
///   match), or, at zero latency (an ordering, or ΔM or ΔA of 0), to a node of the same
///   stage whose slot is not earlier, which starts no earlier;
/// - resources: the matches of one class mod P are those of one stage (the classes of `k·L`
///   differ for k < S), which start together (one start time, IPC 1) and fit M̄ because the
///   stage does; the same holds of the actions (`k·L + ΔM`) and Ā.
///
/// When `L = ΔM + ΔA` itself qualifies (P coprime to it, for one), a packet's latency is that
/// of an RMT pipe with the processor's latencies, `S · (ΔM + ΔA)`, if the last stage has an
/// action; otherwise a stage idles `L - ΔM - ΔA` cycles more. The plan is not checked here (validate it first); one shorter than the graph
/// gives a schedule the validator rejects for its shape. `processors` of 0 count as 1.
pub fn drmt_from_stages(odg: &Odg, plan: &StagePlan, arch: &Arch, processors: u64) -> Schedule {
    let n = processors.max(1);
    let stages = u64::from(plan.stages);
    let period = n * stages.div_ceil(n).max(1);
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut stage_time = arch
        .match_latency
        .saturating_add(arch.action_latency)
        .max(1);
    while period / gcd(stage_time, period) < stages {
        stage_time += 1;
    }
    let start = odg
        .nodes()
        .iter()
        .zip(&plan.stage)
        .map(|(node, &k)| {
            let at = u64::from(k).saturating_mul(stage_time);
            match node.op {
                Op::Match { .. } => at,
                Op::Action { .. } => at.saturating_add(arch.match_latency),
            }
        })
        .collect();
    Schedule { period, start }
}

#[cfg(test)]
mod tests {
    use super::super::odg::{Edge, Node, Width};
    use super::super::schedule::validate;
    use super::*;

    fn m(name: &str, key_bits: u32) -> Node {
        Node {
            name: name.into(),
            op: Op::Match {
                key_bits,
                entries: 1024,
            },
        }
    }

    fn a(name: &str, fields: u32) -> Node {
        Node {
            name: name.into(),
            op: Op::Action { fields },
        }
    }

    fn e(from: usize, to: usize) -> Edge {
        Edge::result(from, to)
    }

    /// `tables` tables `t{i}_match -> t{i}_action` (nodes 2i, 2i + 1) plus `extra` edges.
    fn tables(tables: usize, key_bits: u32, fields: u32, extra: &[(usize, usize)]) -> Odg {
        let mut nodes = Vec::new();
        let mut edges = Vec::new();
        for t in 0..tables {
            nodes.push(m(&format!("t{t}_match"), key_bits));
            nodes.push(a(&format!("t{t}_action"), fields));
            edges.push(e(2 * t, 2 * t + 1));
        }
        edges.extend(extra.iter().map(|&(f, t)| e(f, t)));
        Odg::new(nodes, edges).unwrap()
    }

    /// Both granularities' plans, each checked by the validator and against the bound.
    fn plans(odg: &Odg, arch: &Arch) -> (StagePlan, StagePlan) {
        let coarse = assign_stages(odg, arch, Granularity::Coarse).unwrap();
        let fine = assign_stages(odg, arch, Granularity::Fine).unwrap();
        for plan in [&coarse, &fine] {
            assert_eq!(validate_stages(odg, arch, plan), Ok(()), "{plan:?}");
            assert!(plan.stages >= stage_lower_bound(odg, arch, plan.granularity));
        }
        assert!(fine.stages <= coarse.stages);
        (coarse, fine)
    }

    #[test]
    fn a_chain_of_tables_needs_a_stage_per_table() {
        // Each table matches on what the previous one's action wrote.
        let odg = tables(3, 32, 1, &[(1, 2), (3, 4)]);
        let (coarse, fine) = plans(&odg, &Arch::RMT);
        assert_eq!(coarse.stage, vec![0, 0, 1, 1, 2, 2]);
        assert_eq!(fine.stage, coarse.stage);
        assert_eq!(coarse.stages, 3);
        assert_eq!(coarse.latency(&Arch::RMT), 3 * (18 + 2));
        assert_eq!(stage_lower_bound(&odg, &Arch::RMT, Granularity::Coarse), 3);
        assert_eq!(stage_lower_bound(&odg, &Arch::RMT, Granularity::Fine), 3);
    }

    #[test]
    fn fine_grained_rmt_shares_a_stage_between_a_match_and_a_later_tables_action() {
        // t0's match feeds t1's action (and t1's own match): coarse RMT puts table t1 after
        // table t0, fine-grained RMT runs both matches, then both actions, in one stage.
        let odg = tables(2, 32, 1, &[(0, 3)]);
        let (coarse, fine) = plans(&odg, &Arch::RMT);
        assert_eq!(coarse_tables(&odg), vec![0, 0, 2, 2]);
        assert_eq!(coarse.stage, vec![0, 0, 1, 1]);
        assert_eq!(fine.stage, vec![0, 0, 0, 0]);
        assert_eq!(stage_lower_bound(&odg, &Arch::RMT, Granularity::Coarse), 2);
        assert_eq!(stage_lower_bound(&odg, &Arch::RMT, Granularity::Fine), 1);
        // An action -> match dependency moves the match to the next stage, fine or not; so
        // does an action -> action dependency, and a match -> match one.
        for extra in [(1, 2), (1, 3), (0, 2)] {
            let odg = tables(2, 32, 1, &[extra]);
            let (coarse, fine) = plans(&odg, &Arch::RMT);
            assert_eq!(fine.stages, 2, "{extra:?}: {fine:?}");
            assert_eq!(coarse.stages, 2, "{extra:?}: {coarse:?}");
        }
    }

    #[test]
    fn an_ordering_edge_shares_a_stage_unless_it_runs_from_an_action_to_a_match() {
        // Two tables (t0: nodes 0, 1; t1: nodes 2, 3) and one edge between them, on the result
        // or only in order: (edge, stages on the result, stages in order), fine and coarse.
        let cases = [
            // Match -> match: a successor dependency, resolved by predication.
            ((0, 2), 2, 1),
            // Action -> action.
            ((1, 3), 2, 1),
            // Match -> action: a reverse-match dependency (read before overwritten).
            ((0, 3), 2, 1),
            // Action -> match: the stage's matches come before its actions.
            ((1, 2), 2, 2),
        ];
        for ((from, to), on_result, in_order) in cases {
            let base = tables(2, 32, 1, &[]);
            let with = |edge: Edge| {
                let mut edges = base.edges().to_vec();
                edges.push(edge);
                Odg::new(base.nodes().to_vec(), edges).unwrap()
            };
            let (coarse, _) = plans(&with(e(from, to)), &Arch::RMT);
            assert_eq!(coarse.stages, on_result, "{from} -> {to} on the result");
            let odg = with(Edge::order(from, to));
            let (coarse, fine) = plans(&odg, &Arch::RMT);
            assert_eq!(
                (coarse.stages, fine.stages),
                (in_order, in_order),
                "{from} -> {to} in order: {coarse:?} {fine:?}"
            );
            for granularity in [Granularity::Coarse, Granularity::Fine] {
                assert_eq!(stage_lower_bound(&odg, &Arch::RMT, granularity), in_order);
            }
            // Placed in one stage anyway, an action -> match ordering is named.
            let one = StagePlan {
                granularity: Granularity::Coarse,
                stage: vec![0; 4],
                stages: 1,
            };
            let verdict = validate_stages(&odg, &Arch::RMT, &one);
            assert_eq!(
                verdict.is_ok(),
                in_order == 1,
                "{from} -> {to}: {verdict:?}"
            );
            // Theorem 3.3's construction keeps the ordering.
            for plan in [&coarse, &fine] {
                let s = drmt_from_stages(&odg, plan, &Arch::RMT, 4);
                assert_eq!(validate(&odg, &Arch::RMT, &s), Ok(()), "{plan:?}");
            }
        }
        // An ordering from a match to an action does not make them a table.
        let odg = Odg::new(vec![m("x", 32), a("x_action", 1)], vec![Edge::order(0, 1)]).unwrap();
        assert_eq!(coarse_tables(&odg), vec![0, 1]);
    }

    #[test]
    fn a_full_stage_spills_into_the_next() {
        // Three independent tables of three match units each: two fill M = 8 to 6.
        let odg = tables(3, 240, 1, &[]);
        let (coarse, fine) = plans(&odg, &Arch::RMT);
        assert_eq!(coarse.stages, 2);
        assert_eq!(fine.stages, 2);
        assert_eq!(stage_lower_bound(&odg, &Arch::RMT, Granularity::Fine), 2);
        // Actions spill likewise: three of 100 fields against A = 224.
        let odg = tables(3, 32, 100, &[]);
        let (coarse, fine) = plans(&odg, &Arch::RMT);
        assert_eq!((coarse.stages, fine.stages), (2, 2));
        assert_eq!(coarse.stage.iter().filter(|&&s| s == 1).count(), 2);
    }

    #[test]
    fn an_oversize_node_is_refused_by_name() {
        let wide_key = Odg::new(vec![m("wide", 8 * 80 + 1)], vec![]).unwrap();
        for granularity in [Granularity::Coarse, Granularity::Fine] {
            let err = assign_stages(&wide_key, &Arch::RMT, granularity).unwrap_err();
            assert_eq!(
                err,
                RmtError::TooWide(TooWide {
                    node: "wide".into(),
                    width: Width::MatchUnits(9),
                    capacity: 8,
                    holder: Holder::Stage,
                })
            );
            assert_eq!(
                err.to_string(),
                "`wide` needs 9 match units, more than a stage's M = 8"
            );
        }
        let fat = Odg::new(vec![a("fat", 225)], vec![]).unwrap();
        let err = assign_stages(&fat, &Arch::RMT, Granularity::Fine).unwrap_err();
        assert_eq!(
            err,
            RmtError::TooWide(TooWide {
                node: "fat".into(),
                width: Width::Fields(225),
                capacity: 224,
                holder: Holder::Stage,
            })
        );
        assert_eq!(
            err.to_string(),
            "`fat` modifies 225 fields, more than a stage's A = 224"
        );
        // A match's second action is a table of its own, after the match's table.
        let odg = Odg::new(
            vec![m("t", 32), a("t_a", 150), a("t_b", 150)],
            vec![e(0, 1), e(0, 2)],
        )
        .unwrap();
        assert_eq!(coarse_tables(&odg), vec![0, 0, 2]);
        let (coarse, fine) = plans(&odg, &Arch::RMT);
        assert_eq!(coarse.stage, vec![0, 0, 1]);
        // Fine-grained, the two actions could share stage 0 but for A = 224.
        assert_eq!(fine.stages, 2);
    }

    #[test]
    fn tables_are_contracted_by_the_documented_rule() {
        // An action reached from its match also through another action is not the match's.
        let odg = Odg::new(
            vec![m("t", 32), a("t_a", 1), a("after", 1)],
            vec![e(0, 1), e(1, 2), e(0, 2)],
        )
        .unwrap();
        assert_eq!(coarse_tables(&odg), vec![0, 0, 2]);
        // An action fed by two matches joins the one named like it, whatever the order.
        let odg = Odg::new(
            vec![m("ipv4_match", 32), a("acl_action", 1), m("acl_match", 32)],
            vec![e(0, 1), e(2, 1)],
        )
        .unwrap();
        assert_eq!(coarse_tables(&odg), vec![0, 2, 2]);
        // Between equally named matches, the one listed last.
        let odg = Odg::new(
            vec![m("x", 32), m("y", 32), a("z", 1)],
            vec![e(0, 2), e(1, 2)],
        )
        .unwrap();
        assert_eq!(coarse_tables(&odg), vec![0, 1, 1]);
        // A match -> match dependency joins nothing; a bare action is a table of its own.
        let odg = Odg::new(vec![m("p", 32), m("q", 32), a("r", 1)], vec![e(0, 1)]).unwrap();
        assert_eq!(coarse_tables(&odg), vec![0, 1, 2]);
        let (coarse, _) = plans(&odg, &Arch::RMT);
        assert_eq!(coarse.stage, vec![0, 1, 0]);
    }

    #[test]
    fn a_pair_that_would_close_a_cycle_of_tables_stays_apart() {
        // t0's match feeds t1's action and t1's match t0's action: as two whole tables each
        // would wait for the other, so t1's action stays a table of its own.
        let odg = tables(2, 32, 1, &[(0, 3), (2, 1)]);
        assert_eq!(coarse_tables(&odg), vec![0, 0, 2, 3]);
        let (coarse, fine) = plans(&odg, &Arch::RMT);
        assert_eq!(coarse.stage, vec![1, 1, 0, 2]);
        assert_eq!(fine.stage, vec![0, 0, 0, 0]);
    }

    #[test]
    fn each_kind_of_violation_is_named() {
        let odg = tables(2, 32, 1, &[(1, 2)]);
        let ok = StagePlan {
            granularity: Granularity::Coarse,
            stage: vec![0, 0, 1, 1],
            stages: 2,
        };
        assert_eq!(validate_stages(&odg, &Arch::RMT, &ok), Ok(()));
        let with = |stage: Vec<u32>, granularity| {
            let stages = stage.iter().max().map_or(0, |s| s + 1);
            validate_stages(
                &odg,
                &Arch::RMT,
                &StagePlan {
                    granularity,
                    stage,
                    stages,
                },
            )
        };
        // The match reads the first action's result in the same stage.
        assert_eq!(
            with(vec![0, 0, 0, 0], Granularity::Fine),
            Err(vec![StageViolation::Dependency {
                from: "t0_action".into(),
                to: "t1_match".into(),
                stage: 0,
                earliest: 1
            }])
        );
        // The same plan, coarse, adds no split; moving an action off its match does.
        assert_eq!(
            with(vec![0, 0, 1, 2], Granularity::Coarse),
            Err(vec![StageViolation::TableSplit {
                table: "t1_match".into(),
                node: "t1_action".into(),
                stage: 2,
                table_stage: 1
            }])
        );
        assert_eq!(with(vec![0, 0, 1, 2], Granularity::Fine), Ok(()));
        // An action before its match.
        assert!(matches!(
            &with(vec![1, 0, 2, 2], Granularity::Fine).unwrap_err()[..],
            [StageViolation::Dependency {
                earliest: 1,
                stage: 0,
                ..
            }]
        ));
        // Capacities.
        let small = Arch {
            match_capacity: 1,
            action_capacity: 1,
            ..Arch::RMT
        };
        let wide = tables(2, 32, 2, &[]);
        let bad = validate_stages(
            &wide,
            &small,
            &StagePlan {
                granularity: Granularity::Coarse,
                stage: vec![0, 0, 0, 0],
                stages: 1,
            },
        )
        .unwrap_err();
        assert_eq!(
            bad,
            vec![
                StageViolation::MatchCapacity {
                    stage: 0,
                    used: 2,
                    capacity: 1
                },
                StageViolation::ActionCapacity {
                    stage: 0,
                    used: 4,
                    capacity: 1
                },
            ]
        );
        // Shapes: a missing node, a stage count that is not the stages used.
        for plan in [
            StagePlan {
                stage: vec![0, 0, 1],
                ..ok.clone()
            },
            StagePlan {
                stages: 3,
                ..ok.clone()
            },
            // A last stage whose count would not fit the plan's u32.
            StagePlan {
                stage: vec![0, 0, 1, u32::MAX],
                stages: u32::MAX,
                ..ok.clone()
            },
        ] {
            assert!(matches!(
                &validate_stages(&odg, &Arch::RMT, &plan).unwrap_err()[..],
                [StageViolation::Shape(_)]
            ));
        }
        // Far-apart stages are only wasteful.
        let far = StagePlan {
            granularity: Granularity::Fine,
            stage: vec![0, 0, u32::MAX - 1, u32::MAX - 1],
            stages: u32::MAX,
        };
        assert_eq!(validate_stages(&odg, &Arch::RMT, &far), Ok(()));
        // Each violation's text names what is wrong and where.
        for (v, text) in [
            (StageViolation::Shape("x".into()), "x"),
            (
                StageViolation::TableSplit {
                    table: "t".into(),
                    node: "n".into(),
                    stage: 1,
                    table_stage: 0,
                },
                "`n` of table `t` sits in stage 1, the table's match in stage 0",
            ),
            (
                StageViolation::Dependency {
                    from: "a".into(),
                    to: "b".into(),
                    stage: 0,
                    earliest: 1,
                },
                "`b` sits in stage 0, but its dependency on `a` needs stage 1 or later",
            ),
            (
                StageViolation::MatchCapacity {
                    stage: 2,
                    used: 9,
                    capacity: 8,
                },
                "stage 2: matches need 9 match units, more than M = 8",
            ),
            (
                StageViolation::ActionCapacity {
                    stage: 3,
                    used: 225,
                    capacity: 224,
                },
                "stage 3: actions modify 225 fields, more than A = 224",
            ),
        ] {
            assert_eq!(v.to_string(), text);
        }
    }

    #[test]
    fn throughput_falls_off_a_cliff_by_passes() {
        assert_eq!(rmt_throughput(12, 12), 1.0);
        assert_eq!(rmt_throughput(12, 32), 1.0);
        assert_eq!(rmt_throughput(12, 11), 0.5);
        assert_eq!(rmt_throughput(12, 6), 0.5);
        assert_eq!(rmt_throughput(12, 5), 1.0 / 3.0);
        assert_eq!(rmt_throughput(0, 0), 1.0);
        assert_eq!(rmt_throughput(3, 0), 0.0);
    }

    #[test]
    fn a_stage_plan_becomes_a_valid_drmt_schedule_of_rmt_throughput() {
        // dRMT's latencies, an RMT stage's capacities (Theorem 3.3's assumption).
        let arch = Arch {
            action_capacity: Arch::RMT.action_capacity,
            ..Arch::DRMT
        };
        let odg = tables(4, 240, 100, &[(1, 2), (0, 5), (3, 6)]);
        for granularity in [Granularity::Coarse, Granularity::Fine] {
            let plan = assign_stages(&odg, &arch, granularity).unwrap();
            for processors in 1..=plan.stages as u64 + 2 {
                let schedule = drmt_from_stages(&odg, &plan, &arch, processors);
                assert_eq!(
                    validate(&odg, &arch, &schedule),
                    Ok(()),
                    "{granularity:?}, {processors} processors: {plan:?} -> {schedule:?}"
                );
                assert_eq!(
                    processors as f64 / schedule.period as f64,
                    rmt_throughput(plan.stages, processors as u32)
                );
            }
        }
        // With enough processors, line rate at the plan's own pace: a stage is ΔM + ΔA.
        let plan = assign_stages(&odg, &arch, Granularity::Coarse).unwrap();
        let schedule = drmt_from_stages(&odg, &plan, &arch, 5);
        assert_eq!(schedule.period, 5);
        assert_eq!(schedule.start[2], 24);
        assert_eq!(schedule.latency(&odg, &arch), u64::from(plan.stages) * 24);
        // A plan for another graph is rejected, not a panic.
        let other = tables(5, 32, 1, &[]);
        assert!(validate(&other, &arch, &drmt_from_stages(&other, &plan, &arch, 0)).is_err());
    }
}
