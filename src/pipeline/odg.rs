//! Operation dependency graphs and the architectures' parameters.

use std::fmt;

/// What a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Op {
    /// A table lookup: a key of `key_bits` bits into a table of `entries` entries.
    Match {
        /// The key's width.
        key_bits: u32,
        /// The table's entries.
        entries: u64,
    },
    /// An action modifying `fields` fields of the packet header vector.
    Action {
        /// Fields it modifies.
        fields: u32,
    },
}

/// One operation of a program.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Node {
    /// Its name (unique in the graph).
    pub name: String,
    /// What it does.
    pub op: Op,
}

/// A dependency: `to` may start only `τ(from, to)` cycles after `from` starts (the dRMT
/// paper's τ(u, v), §3.3), where the edge's [`EdgeKind`] gives τ:
///
/// - [`EdgeKind::Result`]: `to` reads, or is predicated on, `from`'s result (a match
///   dependency, an action dependency, a table's match feeding its action): ΔM after a
///   match, ΔA after an action;
/// - [`EdgeKind::Order`]: `to` must only not start before `from` (a successor dependency
///   resolved by predication, or a reverse-match dependency: a match reads a field before a
///   later action overwrites it): the latency dS = 0 of the paper's published scheduler
///   (`schedule_dag.py` in its code), so both may start in the same cycle.
///
/// ```
/// use pfemu::pipeline::{lower_bound, Arch, Edge, Node, Odg, Op};
///
/// let m = |name: &str| Node { name: name.into(), op: Op::Match { key_bits: 32, entries: 1 } };
/// // `acl` must not start after `fwd`, but uses none of its result.
/// let ordered = Odg::new(vec![m("fwd"), m("acl")], vec![Edge::order(0, 1)])?;
/// assert_eq!(lower_bound(&ordered, &Arch::DRMT).latency, 22);
/// // Reading its result waits ΔM.
/// let dependent = Odg::new(vec![m("fwd"), m("acl")], vec![Edge::result(0, 1)])?;
/// assert_eq!(lower_bound(&dependent, &Arch::DRMT).latency, 2 * 22);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Edge {
    /// The node depended on (an index into [`Odg::nodes`]).
    pub from: usize,
    /// The dependent node.
    pub to: usize,
    /// What `to` waits for.
    pub kind: EdgeKind,
}

impl Edge {
    /// `to` uses `from`'s result: it waits ΔM after a match, ΔA after an action.
    pub const fn result(from: usize, to: usize) -> Edge {
        Edge {
            from,
            to,
            kind: EdgeKind::Result,
        }
    }

    /// `to` only may not start before `from`: it waits dS = 0 cycles.
    pub const fn order(from: usize, to: usize) -> Edge {
        Edge {
            from,
            to,
            kind: EdgeKind::Order,
        }
    }
}

/// What an [`Edge`]'s dependent waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum EdgeKind {
    /// The result: ΔM after a match, ΔA after an action (match and action dependencies).
    Result,
    /// Only the order, at latency dS = 0 (successor and reverse-match dependencies).
    Order,
}

/// Why a graph was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum OdgError {
    /// Two nodes share a name.
    DuplicateName(String),
    /// An edge names a node that does not exist.
    NoSuchNode(usize),
    /// The edges close a cycle (through this node).
    Cycle(String),
    /// A match with a key of 0 bits, or an action modifying no field.
    Empty(String),
    /// More nodes than [`Odg::MAX_NODES`] (the count given).
    TooManyNodes(usize),
    /// More edges than [`Odg::MAX_EDGES`] (the count given).
    TooManyEdges(usize),
}

impl fmt::Display for OdgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OdgError::DuplicateName(n) => write!(f, "two nodes are named `{n}`"),
            OdgError::NoSuchNode(i) => write!(f, "an edge names node {i}, which does not exist"),
            OdgError::Cycle(n) => write!(f, "the dependencies close a cycle through `{n}`"),
            OdgError::TooManyNodes(n) => write!(
                f,
                "{n} nodes: a graph may have at most {} (Odg::MAX_NODES)",
                Odg::MAX_NODES
            ),
            OdgError::TooManyEdges(n) => write!(
                f,
                "{n} edges: a graph may have at most {} (Odg::MAX_EDGES)",
                Odg::MAX_EDGES
            ),
            OdgError::Empty(n) => {
                write!(
                    f,
                    "`{n}` does nothing: a match needs key bits, an action fields"
                )
            }
        }
    }
}

impl std::error::Error for OdgError {}

/// A program as an operation dependency graph: acyclic, names unique.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Odg {
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    /// The nodes in an order where every edge goes forward.
    order: Vec<usize>,
}

impl Odg {
    /// The most nodes a graph may have: twice the largest random graph `pfemu experiment
    /// pipelines` draws (200 slots, at most 400 nodes), far above a real program's (the
    /// shipped ones have a dozen or two). Every scheduler's work grows faster than the graph
    /// (the list scheduler's with nodes × edges, the ILP's variables with nodes × its
    /// horizon), and a caller typically schedules at each period up to some bound and
    /// simulates: past this, one graph could take hours or exhaust memory. [`Odg::new`]
    /// refuses a larger graph, so every graph the schedulers, validators and simulators take
    /// is within it; `pfemu experiment pipelines --odg` checks the same limits.
    pub const MAX_NODES: usize = 800;
    /// The most edges a graph may have: 16 per node of the largest (the random graphs have
    /// about 7 per node).
    pub const MAX_EDGES: usize = 16 * Odg::MAX_NODES;

    /// The graph of `nodes` and `edges`, checked: at most [`Odg::MAX_NODES`] nodes and
    /// [`Odg::MAX_EDGES`] edges (checked first, before any work on them), names unique,
    /// edges between existing nodes, no cycle, no empty operation.
    ///
    /// A pair of nodes has at most one dependency: the paper's program has one constraint
    /// t(v) − t(u) ≥ τ(u, v) per edge (u, v) of the graph (§3.3, equation 2), so two edges
    /// between the same pair are two such constraints, and a schedule meets both exactly
    /// when it meets the larger τ. The graph keeps one edge per (`from`, `to`), where the
    /// first of them stood, of the strongest kind given: [`EdgeKind::Result`] (ΔM or ΔA)
    /// over [`EdgeKind::Order`] (dS = 0). An edge repeated is kept once.
    ///
    /// ```
    /// use pfemu::pipeline::{Edge, Node, Odg, Op};
    ///
    /// let m = |name: &str| Node { name: name.into(), op: Op::Match { key_bits: 32, entries: 1 } };
    /// let both = vec![Edge::order(0, 1), Edge::result(0, 1), Edge::order(0, 1)];
    /// let odg = Odg::new(vec![m("fwd"), m("acl")], both)?;
    /// assert_eq!(odg.edges(), &[Edge::result(0, 1)]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(nodes: Vec<Node>, edges: Vec<Edge>) -> Result<Odg, OdgError> {
        Odg::check_size(nodes.len(), edges.len())?;
        let mut names = std::collections::HashSet::with_capacity(nodes.len());
        for n in &nodes {
            if !names.insert(n.name.as_str()) {
                return Err(OdgError::DuplicateName(n.name.clone()));
            }
            if matches!(
                n.op,
                Op::Match { key_bits: 0, .. } | Op::Action { fields: 0 }
            ) {
                return Err(OdgError::Empty(n.name.clone()));
            }
        }
        if let Some(e) = edges
            .iter()
            .find(|e| e.from >= nodes.len() || e.to >= nodes.len())
        {
            return Err(OdgError::NoSuchNode(e.from.max(e.to)));
        }
        let edges = strongest_per_pair(edges);
        // Kahn's algorithm: what is left with predecessors at the end lies on a cycle.
        let mut preds = vec![0usize; nodes.len()];
        for e in &edges {
            preds[e.to] += 1;
        }
        let mut ready: Vec<usize> = (0..nodes.len()).filter(|&i| preds[i] == 0).collect();
        let mut order = Vec::with_capacity(nodes.len());
        while let Some(i) = ready.pop() {
            order.push(i);
            for e in edges.iter().filter(|e| e.from == i) {
                preds[e.to] -= 1;
                if preds[e.to] == 0 {
                    ready.push(e.to);
                }
            }
        }
        if let Some(i) = (0..nodes.len()).find(|&i| preds[i] > 0) {
            return Err(OdgError::Cycle(nodes[i].name.clone()));
        }
        Ok(Odg {
            nodes,
            edges,
            order,
        })
    }

    /// Whether a graph of `nodes` nodes and `edges` edges is within [`Odg::MAX_NODES`] and
    /// [`Odg::MAX_EDGES`], as [`Odg::new`] checks it first: for a caller that builds a graph
    /// from something larger (a file, a generator), to refuse it before building it.
    pub fn check_size(nodes: usize, edges: usize) -> Result<(), OdgError> {
        if nodes > Odg::MAX_NODES {
            return Err(OdgError::TooManyNodes(nodes));
        }
        if edges > Odg::MAX_EDGES {
            return Err(OdgError::TooManyEdges(edges));
        }
        Ok(())
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The edges.
    pub fn edges(&self) -> &[Edge] {
        &self.edges
    }

    /// The nodes in an order where every edge goes forward.
    pub fn topological_order(&self) -> &[usize] {
        &self.order
    }

    /// The node named `name`.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The cycles node `v`'s result takes on `arch` from its start: ΔM for a match, ΔA for
    /// an action (what a [`EdgeKind::Result`] edge from it waits, and what its packet waits
    /// for it before leaving).
    pub fn latency(&self, arch: &Arch, v: usize) -> u64 {
        match self.nodes[v].op {
            Op::Match { .. } => arch.match_latency,
            Op::Action { .. } => arch.action_latency,
        }
    }

    /// The cycles `edge.to` must wait after `edge.from` starts on `arch`, τ(from, to):
    /// `from`'s [latency](Odg::latency) for a [`EdgeKind::Result`] edge, 0 for an
    /// [`EdgeKind::Order`] one.
    pub fn edge_latency(&self, arch: &Arch, edge: &Edge) -> u64 {
        match edge.kind {
            EdgeKind::Result => self.latency(arch, edge.from),
            EdgeKind::Order => 0,
        }
    }
}

/// `edges` with one edge per (`from`, `to`): the first's place, the strongest kind
/// ([`Odg::new`] says why).
fn strongest_per_pair(edges: Vec<Edge>) -> Vec<Edge> {
    let mut at = std::collections::HashMap::with_capacity(edges.len());
    let mut kept: Vec<Edge> = Vec::with_capacity(edges.len());
    for e in edges {
        match at.entry((e.from, e.to)) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(kept.len());
                kept.push(e);
            }
            std::collections::hash_map::Entry::Occupied(slot) => {
                // A result waits ΔM or ΔA, never less than an ordering's dS = 0.
                if e.kind == EdgeKind::Result {
                    kept[*slot.get()].kind = EdgeKind::Result;
                }
            }
        }
    }
    kept
}

/// A processor's (dRMT) or a stage's (RMT) resources and latencies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Arch {
    /// Match capacity M̄: match units per cycle, each a key of up to `unit_bits` bits.
    pub match_capacity: u32,
    /// Match unit size b, in bits: a key of k bits takes ceil(k / b) units.
    pub unit_bits: u32,
    /// Action capacity Ā: fields an action unit modifies per cycle.
    pub action_capacity: u32,
    /// Match latency ΔM, cycles.
    pub match_latency: u64,
    /// Action latency ΔA, cycles.
    pub action_latency: u64,
    /// Inter-packet concurrency: distinct packets whose matches (or actions) may start in
    /// one cycle.
    pub ipc: u32,
}

impl Arch {
    /// dRMT as Table 1 gives it, with IPC 1 (use `Arch { ipc: 2, ..Arch::DRMT }` for 2).
    pub const DRMT: Arch = Arch {
        match_capacity: 8,
        unit_bits: 80,
        action_capacity: 32,
        match_latency: 22,
        action_latency: 2,
        ipc: 1,
    };

    /// An RMT stage as Table 1 gives it.
    pub const RMT: Arch = Arch {
        match_capacity: 8,
        unit_bits: 80,
        action_capacity: 224,
        match_latency: 18,
        action_latency: 2,
        ipc: 1,
    };

    /// The largest match or action latency [`Arch::check`] accepts, in cycles: far above any
    /// real pipeline's (Table 1's are 2 to 22), and small enough that a start plus a chain of
    /// such latencies cannot overflow.
    pub const MAX_LATENCY: u64 = 1 << 20;

    /// Checks the parameters, naming the first out of range: the capacities, the match unit
    /// size and IPC at least 1 (a processor with no match units, or one that starts no
    /// packet's operations, runs nothing), the latencies at most [`Arch::MAX_LATENCY`]. The
    /// schedulers, validators and simulators refuse an architecture that fails it.
    pub fn check(&self) -> Result<(), ArchError> {
        let at_least_1 = [
            ("match_capacity", self.match_capacity),
            ("unit_bits", self.unit_bits),
            ("action_capacity", self.action_capacity),
            ("ipc", self.ipc),
        ];
        if let Some(&(field, _)) = at_least_1.iter().find(|(_, v)| *v == 0) {
            return Err(ArchError {
                field,
                value: 0,
                allowed: "at least 1",
            });
        }
        for (field, value) in [
            ("match_latency", self.match_latency),
            ("action_latency", self.action_latency),
        ] {
            if value > Arch::MAX_LATENCY {
                return Err(ArchError {
                    field,
                    value,
                    allowed: "at most 2^20 cycles",
                });
            }
        }
        Ok(())
    }

    /// Match units a key of `key_bits` takes.
    pub fn match_units(&self, key_bits: u32) -> u32 {
        key_bits.div_ceil(self.unit_bits.max(1))
    }

    /// The first node of `odg` that alone needs more than one cycle's match units (M̄) or
    /// action fields (Ā), named as `holder`'s: no class of a dRMT schedule, and no RMT stage,
    /// can hold it.
    pub(super) fn too_wide(&self, odg: &Odg, holder: Holder) -> Option<TooWide> {
        odg.nodes().iter().find_map(|node| {
            let (width, capacity) = match node.op {
                Op::Match { key_bits, .. } => (
                    Width::MatchUnits(self.match_units(key_bits)),
                    self.match_capacity,
                ),
                Op::Action { fields } => (Width::Fields(fields), self.action_capacity),
            };
            (width.get() > capacity).then(|| TooWide {
                node: node.name.clone(),
                width,
                capacity,
                holder,
            })
        })
    }
}

/// An [`Arch`] parameter out of range ([`Arch::check`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArchError {
    /// The field, as [`Arch`] names it.
    pub field: &'static str,
    /// Its value.
    pub value: u64,
    /// What it may be.
    pub allowed: &'static str,
}

impl fmt::Display for ArchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Arch::{} is {}: it must be {}",
            self.field, self.value, self.allowed
        )
    }
}

impl std::error::Error for ArchError {}

/// A node that alone needs more than one cycle of a processor (dRMT) or a stage (RMT) has:
/// a key of more match units than M̄, or an action of more fields than Ā. No class of any
/// dRMT schedule, and no RMT stage, can hold it, at any number of processors or stages.
/// [`list_schedule`](super::list_schedule) and [`assign_stages`](super::assign_stages)
/// refuse such a graph with it ([`ListError::TooWide`](super::ListError::TooWide),
/// [`RmtError::TooWide`](super::RmtError::TooWide)), naming the first such node.
///
/// ```
/// use pfemu::pipeline::{list_schedule, Arch, Holder, ListError, Node, Odg, Op, TooWide, Width};
///
/// let fat = Node {
///     name: "fat".into(),
///     op: Op::Action { fields: 40 },
/// };
/// let odg = Odg::new(vec![fat], vec![])?;
/// let err = list_schedule(&odg, &Arch::DRMT, 1).unwrap_err();
/// let want = TooWide {
///     node: "fat".into(),
///     width: Width::Fields(40),
///     capacity: 32,
///     holder: Holder::Processor,
/// };
/// assert_eq!(err, ListError::TooWide(want));
/// assert_eq!(err.to_string(), "`fat` modifies 40 fields, more than a processor's A = 32");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TooWide {
    /// The node.
    pub node: String,
    /// What it needs in one cycle.
    pub width: Width,
    /// What one cycle has of that: M̄ (match units) for a match, Ā (fields) for an action.
    pub capacity: u32,
    /// Whose cycle: the capacity is a dRMT processor's or an RMT stage's.
    pub holder: Holder,
}

/// What a node needs in one cycle ([`TooWide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// A match: the match units its key takes ([`Arch::match_units`]).
    MatchUnits(u32),
    /// An action: the fields it modifies.
    Fields(u32),
}

impl Width {
    /// The units or fields.
    pub fn get(self) -> u32 {
        match self {
            Width::MatchUnits(n) | Width::Fields(n) => n,
        }
    }
}

/// Whose capacity an [`Arch`] gives, as an error names it ([`TooWide`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Holder {
    /// A dRMT processor ([`list_schedule`](super::list_schedule)).
    Processor,
    /// An RMT stage ([`assign_stages`](super::assign_stages)).
    Stage,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Holder::Processor => "processor",
            Holder::Stage => "stage",
        })
    }
}

impl fmt::Display for TooWide {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let TooWide {
            node,
            width,
            capacity,
            holder,
        } = self;
        match width {
            Width::MatchUnits(units) => write!(
                f,
                "`{node}` needs {units} match units, more than a {holder}'s M = {capacity}"
            ),
            Width::Fields(fields) => write!(
                f,
                "`{node}` modifies {fields} fields, more than a {holder}'s A = {capacity}"
            ),
        }
    }
}

impl std::error::Error for TooWide {}
