//! The paper's worked examples, as graphs to schedule.

use super::odg::{Arch, Edge, Node, Odg, Op};

/// The unicast-multicast example of the dRMT paper's Figures 4 and 5: M0 -> M2 -> A1 and
/// M1 -> M3 -> A2, both actions -> A3, on a processor with M̄ = 2 matches and Ā = 2 fields a
/// cycle, match latency 2, action latency 1 and IPC 1. With two processors (P = 2), the naive
/// schedule (matches at 0 and 2, actions at 4 and 5) breaks M̄ and IPC in class 0; one no-op
/// at cycle 2 fixes it (matches at 0 and 3, actions at 5 and 6).
pub fn figure_5() -> (Odg, Arch) {
    let m = |name: &str| Node {
        name: name.into(),
        op: Op::Match {
            key_bits: 32,
            entries: 1024,
        },
    };
    let a = |name: &str| Node {
        name: name.into(),
        op: Op::Action { fields: 1 },
    };
    let e = |from, to| Edge::result(from, to);
    let odg = Odg::new(
        vec![
            m("M0"),
            m("M1"),
            m("M2"),
            m("M3"),
            a("A1"),
            a("A2"),
            a("A3"),
        ],
        vec![e(0, 2), e(1, 3), e(2, 4), e(3, 5), e(4, 6), e(5, 6)],
    )
    .expect("the example is a valid graph");
    let arch = Arch {
        match_capacity: 2,
        unit_bits: 80,
        action_capacity: 2,
        match_latency: 2,
        action_latency: 1,
        ipc: 1,
    };
    (odg, arch)
}

/// A random ODG of the shape the dRMT paper's evaluation draws its 100 graphs from (§4),
/// following the generator published with the paper:
///
/// - a DAG over `n` table slots, each edge i -> j (i < j) present with probability
///   1 / (1 + ceil((n - 1) / 10)), about five edges per slot;
/// - each slot with successors is a table (a match and its action, probability 0.6), a
///   match-less action (0.15) or a condition (0.25); a slot without successors a table (0.85)
///   or an action (0.15);
/// - a match's key is 80 bits times a geometric draw (p = 0.75) capped at 8; an action
///   modifies a geometric number (p = 0.25) of fields, capped at 32;
/// - a table's action depends on its match; an edge between two slots joins an end of one
///   (its match or its action, drawn evenly, as the published generator's pick of either is
///   arbitrary) to an end of the other.
///
/// Conditions take no match or action resources and their successors wait 0 cycles on
/// them, so they are contracted: each condition's predecessors become its successors'
/// predecessors. The same `seed` and `n` always give the same graph.
///
/// The generator draws no ordering edge ([`EdgeKind::Order`](super::EdgeKind::Order)):
/// its conditions' are contracted away; [`random_with_orderings`] adds some.
///
/// A slot makes at most two nodes, so `n` may be at most half [`Odg::MAX_NODES`] (400
/// slots, with about 10 edges a slot, far under [`Odg::MAX_EDGES`]); a larger `n` panics.
pub fn random(seed: u64, n: usize) -> Odg {
    generate(seed, n, false)
}

/// [`random`]'s graph with ordering edges ([`EdgeKind::Order`](super::EdgeKind::Order),
/// latency dS = 0) added, for tests of what schedules do with them: the graphs real
/// programs give, with successor dependencies resolved by predication and reverse-match
/// ones (a match reads a field a later action overwrites), that the paper's random
/// generator does not draw.
///
/// Between an operation of slot i and one of a later slot j not already joined, an
/// ordering is added with probability about half a dependency's (1 / (2 + 2 ceil((n - 1) /
/// 10))), from an end of i to an end of j drawn evenly: about two or three a slot. The
/// orderings come from a generator of their own, seeded from `seed`, so the nodes and the
/// other edges are exactly [`random`]'s; the same `seed` and `n` always give the same
/// graph. `n` is bounded as for [`random`] (the orderings stay under [`Odg::MAX_EDGES`]).
///
/// ```
/// use pfemu::pipeline::{examples, EdgeKind};
///
/// let plain = examples::random(7, 20);
/// let ordered = examples::random_with_orderings(7, 20);
/// assert_eq!(ordered.nodes(), plain.nodes());
/// assert!(ordered.edges().iter().any(|e| e.kind == EdgeKind::Order));
/// assert!(plain.edges().iter().all(|e| ordered.edges().contains(e)));
/// ```
pub fn random_with_orderings(seed: u64, n: usize) -> Odg {
    generate(seed, n, true)
}

fn generate(seed: u64, n: usize, orderings: bool) -> Odg {
    assert!(
        n <= Odg::MAX_NODES / 2,
        "{n} slots: at most Odg::MAX_NODES / 2 = {}",
        Odg::MAX_NODES / 2
    );
    use crate::rng::SplitMix64;
    let mut rng = SplitMix64::new(seed);
    let p = 1 + (n.saturating_sub(1)).div_ceil(10) as u64;
    let mut succs: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in succs.iter_mut().enumerate() {
        for j in i + 1..n {
            if rng.below(p) == 0 {
                s.push(j);
            }
        }
    }
    // Trials up to the first success (probability `p`), at most `cap`.
    fn geometric(rng: &mut SplitMix64, p: f64, cap: u32) -> u32 {
        let mut k = 1;
        while k < cap && rng.uniform() >= p {
            k += 1;
        }
        k
    }
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    let mut slots = Vec::with_capacity(n);
    for (i, s) in succs.iter().enumerate() {
        let draw = rng.uniform();
        let (table, action) = if s.is_empty() {
            (draw < 0.85, true)
        } else {
            (draw < 0.6, draw < 0.75)
        };
        let fields = |rng: &mut SplitMix64| Op::Action {
            fields: geometric(rng, 0.25, 32),
        };
        if table {
            let key_bits = 80 * geometric(&mut rng, 0.75, 8);
            nodes.push(Node {
                name: format!("{i}_MATCH"),
                op: Op::Match {
                    key_bits,
                    entries: 1024,
                },
            });
            nodes.push(Node {
                name: format!("{i}_ACTION"),
                op: fields(&mut rng),
            });
            let m = nodes.len() - 2;
            edges.push(Edge::result(m, m + 1));
            slots.push(Slot::Ops(m, m + 1));
        } else if action {
            nodes.push(Node {
                name: format!("{i}_ACTION"),
                op: fields(&mut rng),
            });
            slots.push(Slot::Ops(nodes.len() - 1, nodes.len() - 1));
        } else {
            slots.push(Slot::Condition);
        }
    }
    // The nodes each slot's successors depend on: its own exit, or (a condition) the exits
    // its own predecessors handed it.
    let mut feeds: Vec<Vec<usize>> = vec![Vec::new(); n];
    for i in 0..n {
        let ends = match slots[i] {
            Slot::Ops(m, a) => vec![if rng.below(2) == 0 { m } else { a }],
            Slot::Condition => std::mem::take(&mut feeds[i]),
        };
        for &j in &succs[i] {
            for &from in &ends {
                if let Slot::Ops(m, a) = slots[j] {
                    let to = if rng.below(2) == 0 { m } else { a };
                    if from != to && !edges.contains(&Edge::result(from, to)) {
                        edges.push(Edge::result(from, to));
                    }
                } else if !feeds[j].contains(&from) {
                    feeds[j].push(from);
                }
            }
        }
    }
    if orderings {
        add_orderings(seed, &slots, p, &mut edges);
    }
    Odg::new(nodes, edges).expect("edges go from earlier slots to later ones, within the limits")
}

/// Orderings between the operations of slots in slot order (so no cycle), each pair of
/// slots with probability 1 / (2p), where no edge joins the two ends drawn.
fn add_orderings(seed: u64, slots: &[Slot], p: u64, edges: &mut Vec<Edge>) {
    use crate::rng::{mix, SplitMix64};
    // A stream of its own: `random`'s draws, and so its graph, are untouched.
    let mut rng = SplitMix64::new(mix(seed ^ 0x6f72_6465_7269_6e67));
    let joined: std::collections::HashSet<(usize, usize)> =
        edges.iter().map(|e| (e.from, e.to)).collect();
    let ops: Vec<(usize, usize)> = slots
        .iter()
        .filter_map(|s| match *s {
            Slot::Ops(m, a) => Some((m, a)),
            Slot::Condition => None,
        })
        .collect();
    for (i, &(mi, ai)) in ops.iter().enumerate() {
        for &(mj, aj) in &ops[i + 1..] {
            if rng.below(2 * p) != 0 {
                continue;
            }
            let from = if rng.below(2) == 0 { mi } else { ai };
            let to = if rng.below(2) == 0 { mj } else { aj };
            if !joined.contains(&(from, to)) {
                edges.push(Edge::order(from, to));
            }
        }
    }
}

/// What a slot of [`random`]'s generator became: its entry and exit node (equal for an
/// action), or a condition.
#[derive(Clone, Copy)]
enum Slot {
    Ops(usize, usize),
    Condition,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_graphs_have_the_papers_shape_and_repeat_per_seed() {
        let mut matches = 0;
        let mut actions = 0;
        let mut edges = 0;
        for seed in 0..100 {
            let odg = random(seed, 20);
            assert_eq!(odg, random(seed, 20), "seed {seed} gives one graph");
            for node in odg.nodes() {
                match node.op {
                    Op::Match { key_bits, .. } => {
                        assert!(key_bits % 80 == 0 && (80..=640).contains(&key_bits));
                        matches += 1;
                    }
                    Op::Action { fields } => {
                        assert!((1..=32).contains(&fields));
                        actions += 1;
                    }
                }
            }
            edges += odg.edges().len();
        }
        // Of 20 slots, about 0.6-0.85 are tables and 0.15 bare actions; conditions vanish.
        assert!(
            (900..=1500).contains(&matches),
            "{matches} matches in 100 graphs"
        );
        assert!(
            actions > matches,
            "every table has an action, and bare actions add more"
        );
        assert!(
            edges > 2 * matches,
            "{edges} edges: dependencies beyond match -> action"
        );
        assert_ne!(random(1, 20), random(2, 20));
    }

    #[test]
    fn the_largest_random_graphs_are_within_the_limits() {
        for seed in 0..3 {
            let odg = random(seed, Odg::MAX_NODES / 2);
            assert!(odg.nodes().len() <= Odg::MAX_NODES);
            assert!(
                odg.edges().len() <= Odg::MAX_EDGES / 2,
                "{} edges: well within the limit",
                odg.edges().len()
            );
        }
    }

    #[test]
    fn orderings_are_added_seeded_and_leave_the_rest_of_the_graph_alone() {
        use crate::pipeline::EdgeKind;
        let mut orderings = 0;
        for seed in 0..100 {
            let plain = random(seed, 20);
            let ordered = random_with_orderings(seed, 20);
            assert_eq!(ordered, random_with_orderings(seed, 20), "seed {seed}");
            assert_eq!(ordered.nodes(), plain.nodes());
            let (order, result): (Vec<_>, Vec<_>) = ordered
                .edges()
                .iter()
                .partition(|e| e.kind == EdgeKind::Order);
            assert_eq!(result.len(), plain.edges().len(), "seed {seed}");
            assert!(result.iter().all(|e| plain.edges().contains(e)));
            // Forward in slot order, between operations not otherwise joined.
            for e in &order {
                assert!(e.from < e.to, "seed {seed}: {e:?}");
                assert!(!plain
                    .edges()
                    .iter()
                    .any(|r| (r.from, r.to) == (e.from, e.to)));
            }
            orderings += order.len();
        }
        // About half a dependency per pair of slots: two to three a slot.
        assert!(
            (1000..=8000).contains(&orderings),
            "{orderings} orderings in 100 graphs of 20 slots"
        );
        let largest = random_with_orderings(1, Odg::MAX_NODES / 2);
        assert!(largest.edges().len() <= Odg::MAX_EDGES / 2);
    }

    #[test]
    #[should_panic(expected = "401 slots: at most Odg::MAX_NODES / 2 = 400")]
    fn a_random_graph_beyond_the_limits_is_refused() {
        random(1, Odg::MAX_NODES / 2 + 1);
    }
}
