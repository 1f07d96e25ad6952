//! A program's graph as a file a user writes by hand: [`Description`], read from JSON (or
//! any serde format), nodes named rather than numbered.
//!
//! ```json
//! { "name": "l3fwd",
//!   "nodes": [ {"name": "lpm", "match": {"key_bits": 32, "entries": 100000}},
//!              {"name": "set_nexthop", "action": {"fields": 3}} ],
//!   "edges": [ ["lpm", "set_nexthop"] ] }
//! ```
//!
//! Each node is a match (a key of `key_bits` bits into a table of `entries`) or an action
//! (modifying `fields` fields); each edge `[from, to]` says `to` waits for `from`'s result
//! (ΔM after a match, ΔA after an action), and each entry `[from, to]` of the optional
//! `orderings` that `to` only may not start before `from` (a successor or reverse-match
//! dependency, latency 0: [`EdgeKind::Order`]). Unknown fields are refused, so a misspelt one
//! is an error rather than a default. [`Description::to_odg`] checks the graph;
//! [`Odg::describe`] writes a built graph back out.

use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::odg::{Edge, EdgeKind, Node, Odg, OdgError, Op};

/// A program's operation dependency graph, as a file describes it.
///
/// ```
/// use pfemu::pipeline::{lower_bound, Arch, Description};
///
/// let text = r#"{ "name": "acl",
///     "nodes": [ {"name": "acl", "match": {"key_bits": 104, "entries": 4096}},
///                {"name": "deny", "action": {"fields": 1}} ],
///     "edges": [ ["acl", "deny"] ] }"#;
/// let description: Description = serde_json::from_str(text)?;
/// let odg = description.to_odg()?;
/// // A 104-bit key takes two 80-bit match units; the action waits ΔM for the match.
/// assert_eq!(Arch::DRMT.match_units(104), 2);
/// assert_eq!(lower_bound(&odg, &Arch::DRMT).latency, 22 + 2);
/// assert_eq!(odg.describe("acl"), description);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Description {
    /// The program's name.
    pub name: String,
    /// Its operations; names are unique.
    pub nodes: Vec<NodeDescription>,
    /// Its dependencies on results, `[from, to]` by node name ([`EdgeKind::Result`]).
    #[serde(default)]
    pub edges: Vec<(String, String)>,
    /// Its ordering-only dependencies, `[from, to]` by node name: `to` may start in the same
    /// cycle as `from`, not before ([`EdgeKind::Order`]). Optional.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orderings: Vec<(String, String)>,
}

/// One operation: exactly one of `match` and `action`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeDescription {
    /// Its name.
    pub name: String,
    /// A table lookup.
    #[serde(rename = "match", default, skip_serializing_if = "Option::is_none")]
    pub lookup: Option<MatchDescription>,
    /// An action.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<ActionDescription>,
}

/// A table lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchDescription {
    /// The key's width in bits.
    pub key_bits: u32,
    /// The table's entries.
    pub entries: u64,
}

/// An action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionDescription {
    /// The fields it modifies.
    pub fields: u32,
}

/// Why a description is not a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DescribeError {
    /// An edge names a node the description does not have.
    UnknownNode {
        /// The edge's position in `edges` (0-based).
        edge: usize,
        /// The name no node has.
        name: String,
    },
    /// An ordering names a node the description does not have.
    UnknownOrderingNode {
        /// The ordering's position in `orderings` (0-based).
        ordering: usize,
        /// The name no node has.
        name: String,
    },
    /// A node is both a match and an action.
    BothOps(String),
    /// A node is neither a match nor an action.
    NoOp(String),
    /// The graph itself is refused (too many nodes or edges, duplicate names, a cycle, an
    /// empty operation).
    Graph(OdgError),
}

impl fmt::Display for DescribeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DescribeError::UnknownNode { edge, name } => {
                write!(f, "edge {edge} names `{name}`, which no node is called")
            }
            DescribeError::UnknownOrderingNode { ordering, name } => {
                write!(
                    f,
                    "ordering {ordering} names `{name}`, which no node is called"
                )
            }
            DescribeError::BothOps(n) => write!(
                f,
                "node `{n}` has both `match` and `action`; give it exactly one"
            ),
            DescribeError::NoOp(n) => write!(
                f,
                "node `{n}` has neither `match` nor `action`; give it exactly one"
            ),
            DescribeError::Graph(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for DescribeError {
    /// The graph's refusal, for [`DescribeError::Graph`].
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            DescribeError::Graph(e) => Some(e),
            _ => None,
        }
    }
}

impl From<OdgError> for DescribeError {
    fn from(e: OdgError) -> Self {
        DescribeError::Graph(e)
    }
}

impl Description {
    /// The graph described, checked as [`Odg::new`] checks it: within [`Odg::MAX_NODES`]
    /// and [`Odg::MAX_EDGES`] (checked first, before any node is read), every node exactly
    /// one operation, every edge between named nodes, names unique, no cycle, no empty
    /// operation.
    pub fn to_odg(&self) -> Result<Odg, DescribeError> {
        let edges = self.edges.len().saturating_add(self.orderings.len());
        Odg::check_size(self.nodes.len(), edges)?;
        let nodes = self
            .nodes
            .iter()
            .map(|n| {
                let op = match (n.lookup, n.action) {
                    (Some(m), None) => Op::Match {
                        key_bits: m.key_bits,
                        entries: m.entries,
                    },
                    (None, Some(a)) => Op::Action { fields: a.fields },
                    (Some(_), Some(_)) => return Err(DescribeError::BothOps(n.name.clone())),
                    (None, None) => return Err(DescribeError::NoOp(n.name.clone())),
                };
                Ok(Node {
                    name: n.name.clone(),
                    op,
                })
            })
            .collect::<Result<Vec<Node>, DescribeError>>()?;
        // The first node of each name (a second one is refused by `Odg::new`).
        let mut by_name = HashMap::with_capacity(nodes.len());
        for (i, n) in nodes.iter().enumerate() {
            by_name.entry(n.name.as_str()).or_insert(i);
        }
        let index = |kind: EdgeKind, i: usize, name: &str| {
            by_name.get(name).copied().ok_or_else(|| match kind {
                EdgeKind::Result => DescribeError::UnknownNode {
                    edge: i,
                    name: name.to_string(),
                },
                EdgeKind::Order => DescribeError::UnknownOrderingNode {
                    ordering: i,
                    name: name.to_string(),
                },
            })
        };
        let edges = [
            (EdgeKind::Result, &self.edges),
            (EdgeKind::Order, &self.orderings),
        ]
        .into_iter()
        .flat_map(|(kind, list)| {
            list.iter().enumerate().map(move |(i, (from, to))| {
                Ok(Edge {
                    from: index(kind, i, from)?,
                    to: index(kind, i, to)?,
                    kind,
                })
            })
        })
        .collect::<Result<Vec<Edge>, DescribeError>>()?;
        Ok(Odg::new(nodes, edges)?)
    }
}

impl Odg {
    /// The graph as a [`Description`] named `name`: nodes and edges in the graph's order, the
    /// edges on results in `edges` and the ordering-only ones in `orderings`.
    pub fn describe(&self, name: &str) -> Description {
        let nodes = self
            .nodes()
            .iter()
            .map(|n| match n.op {
                Op::Match { key_bits, entries } => NodeDescription {
                    name: n.name.clone(),
                    lookup: Some(MatchDescription { key_bits, entries }),
                    action: None,
                },
                Op::Action { fields } => NodeDescription {
                    name: n.name.clone(),
                    lookup: None,
                    action: Some(ActionDescription { fields }),
                },
            })
            .collect();
        let name_of = |i: usize| self.nodes()[i].name.clone();
        let of_kind = |kind: EdgeKind| {
            self.edges()
                .iter()
                .filter(|e| e.kind == kind)
                .map(|e| (name_of(e.from), name_of(e.to)))
                .collect()
        };
        Description {
            name: name.to_string(),
            nodes,
            edges: of_kind(EdgeKind::Result),
            orderings: of_kind(EdgeKind::Order),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::examples::figure_5;

    const L3FWD: &str = r#"
        { "name": "l3fwd",
          "nodes": [ {"name": "lpm", "match": {"key_bits": 32, "entries": 100000}},
                     {"name": "set_nexthop", "action": {"fields": 3}} ],
          "edges": [ ["lpm", "set_nexthop"] ] }"#;

    fn read(text: &str) -> Result<Odg, String> {
        let d: Description = serde_json::from_str(text).map_err(|e| e.to_string())?;
        d.to_odg().map_err(|e| e.to_string())
    }

    #[test]
    fn the_documented_example_reads_as_its_graph() {
        let odg = read(L3FWD).expect("the example is valid");
        assert_eq!(
            odg.nodes()[0].op,
            Op::Match {
                key_bits: 32,
                entries: 100_000
            }
        );
        assert_eq!(odg.nodes()[1].op, Op::Action { fields: 3 });
        assert_eq!(odg.edges(), &[Edge::result(0, 1)]);
    }

    #[test]
    fn orderings_read_as_zero_latency_edges_and_round_trip() {
        let text = r#"
            { "name": "reverse-match",
              "nodes": [ {"name": "acl", "match": {"key_bits": 32, "entries": 16}},
                         {"name": "rewrite", "action": {"fields": 1}},
                         {"name": "count", "action": {"fields": 1}} ],
              "edges": [ ["acl", "count"] ],
              "orderings": [ ["acl", "rewrite"] ] }"#;
        let d: Description = serde_json::from_str(text).expect("valid");
        let odg = d.to_odg().expect("a graph");
        assert_eq!(odg.edges(), &[Edge::result(0, 2), Edge::order(0, 1)]);
        assert_eq!(
            odg.edge_latency(&crate::pipeline::Arch::DRMT, &odg.edges()[1]),
            0
        );
        assert_eq!(odg.describe("reverse-match"), d);
        // Without orderings none is written, and an unknown name in one is named as such.
        let plain = read(L3FWD).unwrap().describe("l3fwd");
        let written = serde_json::to_string(&plain).unwrap();
        assert!(!written.contains("orderings"), "{written}");
        let bad = text.replace(r#"["acl", "rewrite"]"#, r#"["acl", "rewrit"]"#);
        assert_eq!(
            read(&bad).unwrap_err(),
            "ordering 0 names `rewrit`, which no node is called"
        );
        // An ordering closes a cycle like any edge.
        let cycle = text.replace(r#"["acl", "rewrite"]"#, r#"["count", "acl"]"#);
        assert!(read(&cycle).unwrap_err().contains("cycle"), "{cycle}");
    }

    #[test]
    fn a_built_graph_round_trips_through_json() {
        let (odg, _) = figure_5();
        let d = odg.describe("figure-5");
        let text = serde_json::to_string_pretty(&d).expect("serializable");
        let back: Description = serde_json::from_str(&text).expect("reads back");
        assert_eq!(back, d);
        assert_eq!(back.to_odg(), Ok(odg));
        // Only the node's own kind is written.
        assert!(!text.contains("null"), "{text}");
    }

    #[test]
    fn every_mistake_is_named() {
        let node = r#"{"name": "a", "match": {"key_bits": 8, "entries": 1}}"#;
        let cases = [
            (
                r#"{"name": "p", "nodes": [NODE], "edges": [["a", "b"]]}"#,
                "edge 0 names `b`, which no node is called",
            ),
            (
                r#"{"name": "p", "nodes": [{"name": "x", "match": {"key_bits": 8, "entries": 1},
                     "action": {"fields": 1}}]}"#,
                "node `x` has both `match` and `action`",
            ),
            (
                r#"{"name": "p", "nodes": [{"name": "x"}]}"#,
                "node `x` has neither `match` nor `action`",
            ),
            (
                r#"{"name": "p", "nodes": [NODE, NODE]}"#,
                "two nodes are named `a`",
            ),
            (
                r#"{"name": "p", "nodes": [NODE], "edges": [["a", "a"]]}"#,
                "cycle through `a`",
            ),
            (
                r#"{"name": "p", "nodes": [{"name": "x", "action": {"fields": 0}}]}"#,
                "`x` does nothing",
            ),
            (
                r#"{"name": "p", "nodes": [{"name": "x", "action": {"fields": 1, "width": 2}}]}"#,
                "unknown field `width`",
            ),
            (
                r#"{"name": "p", "nodes": [], "links": []}"#,
                "unknown field `links`",
            ),
        ];
        for (text, want) in cases {
            let text = text.replace("NODE", node);
            let err = read(&text).expect_err(&text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn a_description_beyond_the_limits_is_refused_before_it_is_read() {
        // Nodes with no operation: were they read first, the error would name one.
        let nothing = |i: usize| NodeDescription {
            name: format!("n{i}"),
            lookup: None,
            action: None,
        };
        let big = Description {
            name: "big".into(),
            nodes: (0..=Odg::MAX_NODES).map(nothing).collect(),
            edges: vec![],
            orderings: vec![],
        };
        let err = big.to_odg().unwrap_err();
        assert_eq!(err, DescribeError::Graph(OdgError::TooManyNodes(801)));
        assert_eq!(
            err.to_string(),
            "801 nodes: a graph may have at most 800 (Odg::MAX_NODES)"
        );
        // Edges naming no node, likewise.
        let dense = Description {
            name: "dense".into(),
            nodes: vec![],
            edges: vec![("a".into(), "b".into()); Odg::MAX_EDGES + 1],
            orderings: vec![],
        };
        let err = dense.to_odg().unwrap_err();
        assert_eq!(err, DescribeError::Graph(OdgError::TooManyEdges(12_801)));
        assert_eq!(
            err.to_string(),
            "12801 edges: a graph may have at most 12800 (Odg::MAX_EDGES)"
        );
        // At the limits, a description reads, its edges looked up by name.
        let chain = Description {
            name: "chain".into(),
            nodes: (0..Odg::MAX_NODES)
                .map(|i| NodeDescription {
                    action: Some(ActionDescription { fields: 1 }),
                    ..nothing(i)
                })
                .collect(),
            edges: (1..Odg::MAX_NODES)
                .map(|i| (format!("n{}", i - 1), format!("n{i}")))
                .collect(),
            orderings: vec![],
        };
        let odg = chain.to_odg().expect("within the limits");
        assert_eq!(odg.edges()[798], Edge::result(798, 799));
        assert_eq!(odg.describe("chain"), chain);
    }

    #[test]
    fn a_graph_error_is_the_source() {
        use std::error::Error;
        let e = DescribeError::from(OdgError::Cycle("a".into()));
        assert!(e.source().is_some());
        assert!(DescribeError::NoOp("a".into()).source().is_none());
    }
}
