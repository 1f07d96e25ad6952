//! dRMT scheduling on random operation dependency graphs: every schedule the list scheduler
//! gives passes the validator, none beats the lower bound, and where the bound is tight
//! (resources unlimited) the scheduler meets it.

use pfemu::pipeline::{
    fewest_processors, list_schedule, lower_bound, validate, Arch, Edge, Node, Odg, Op, Schedule,
};
use pfemu::rng::SplitMix64;

/// A random ODG of the paper's shape: `tables` tables, each a match and its action, the
/// action after its match; each table depends on some earlier table's match or action, one
/// dependency in four only in order (a successor or reverse-match dependency, latency 0).
fn random_odg(seed: u64, tables: usize) -> Odg {
    let mut rng = SplitMix64::new(seed);
    let mut nodes = Vec::new();
    let mut edges = Vec::new();
    for t in 0..tables {
        let key_bits = 8 + rng.below(152) as u32;
        nodes.push(Node {
            name: format!("M{t}"),
            op: Op::Match {
                key_bits,
                entries: 1 << (4 + rng.below(12)),
            },
        });
        nodes.push(Node {
            name: format!("A{t}"),
            op: Op::Action {
                fields: 1 + rng.below(8) as u32,
            },
        });
        edges.push(Edge::result(2 * t, 2 * t + 1));
        // Dependencies on earlier tables: a match dependency (on its action's result) or
        // an action dependency (after its match).
        for _ in 0..rng.below(3) {
            if t == 0 {
                break;
            }
            let earlier = rng.below(t as u64) as usize;
            let from = 2 * earlier + rng.below(2) as usize;
            let to = 2 * t + rng.below(2) as usize;
            let edge = if rng.below(4) == 0 {
                Edge::order(from, to)
            } else {
                Edge::result(from, to)
            };
            if !edges.iter().any(|e| (e.from, e.to) == (from, to)) {
                edges.push(edge);
            }
        }
    }
    Odg::new(nodes, edges).expect("edges go from earlier tables to later ones")
}

#[test]
fn list_schedules_are_valid_and_never_beat_the_lower_bound() {
    let mut found = 0;
    for seed in 0..100 {
        let odg = random_odg(seed, 4 + (seed as usize % 20));
        for arch in [
            Arch::DRMT,
            Arch {
                ipc: 2,
                ..Arch::DRMT
            },
        ] {
            let lb = lower_bound(&odg, &arch);
            for period in 1..=lb.processors + 4 {
                let Some(s) = list_schedule(&odg, &arch, period).expect("every node fits") else {
                    continue;
                };
                found += 1;
                assert_eq!(
                    validate(&odg, &arch, &s),
                    Ok(()),
                    "seed {seed}, P = {period}"
                );
                assert!(
                    period >= lb.processors,
                    "seed {seed}: P = {period} below {lb:?}"
                );
                assert!(s.latency(&odg, &arch) >= lb.latency, "seed {seed}");
            }
            let s = fewest_processors(&odg, &arch, 64).expect("some number of processors works");
            assert!(s.period >= lb.processors);
        }
    }
    assert!(found > 300, "the scheduler found only {found} schedules");
}

#[test]
fn with_resources_to_spare_the_list_schedule_is_the_critical_path() {
    let roomy = Arch {
        match_capacity: 1_000,
        action_capacity: 1_000,
        ipc: 1_000,
        ..Arch::DRMT
    };
    for seed in 0..50 {
        let odg = random_odg(seed, 10);
        let lb = lower_bound(&odg, &roomy);
        assert_eq!(lb.processors, 1);
        let s = list_schedule(&odg, &roomy, 1)
            .expect("every node fits")
            .expect("everything fits one class");
        assert_eq!(validate(&odg, &roomy, &s), Ok(()));
        assert_eq!(s.latency(&odg, &roomy), lb.latency, "seed {seed}");
    }
}

#[test]
fn figure_5_gets_the_schedule_with_the_no_op() {
    let (odg, arch) = pfemu::pipeline::examples::figure_5();
    let s = list_schedule(&odg, &arch, 2)
        .expect("every node fits")
        .expect("P = 2 has a schedule");
    assert_eq!(validate(&odg, &arch, &s), Ok(()));
    // One cycle longer than the naive schedule's, for the no-op: the paper's Figure 5b.
    assert_eq!(
        s,
        Schedule {
            period: 2,
            start: vec![0, 0, 3, 3, 5, 5, 6]
        }
    );
    // Both processors are needed: the four matches need two classes of M = 2.
    assert_eq!(lower_bound(&odg, &arch).processors, 2);
}

#[test]
fn fewest_processors_never_needs_more_than_the_fine_stage_plan_and_validates() {
    use pfemu::pipeline::{assign_stages, examples, Granularity};
    let mut list_alone_worse = 0;
    for seed in 0..100 {
        let odg = examples::random(seed, 20);
        for arch in [
            Arch::DRMT,
            Arch {
                ipc: 2,
                ..Arch::DRMT
            },
        ] {
            let stages = assign_stages(&odg, &arch, Granularity::Fine)
                .expect("random graphs fit a stage")
                .stages;
            let s = fewest_processors(&odg, &arch, 64).expect("the stage layout always fits");
            assert!(validate(&odg, &arch, &s).is_ok(), "seed {seed}");
            assert!(
                s.period <= u64::from(stages),
                "seed {seed}: {} > {stages}",
                s.period
            );
            if (s.period..=u64::from(stages)).all(|p| list_schedule(&odg, &arch, p) == Ok(None)) {
                list_alone_worse += 1;
            }
        }
    }
    // The stage layout is what keeps IPC 1 from spreading matches over too many times.
    assert!(list_alone_worse > 0, "the stage layout never helped");
}

fn action(name: &str, fields: u32) -> Node {
    Node {
        name: name.into(),
        op: Op::Action { fields },
    }
}

#[test]
fn capacity_sums_do_not_wrap_and_a_node_wider_than_a_cycle_is_refused_by_name() {
    use pfemu::pipeline::{
        assign_stages, simulate_drmt, validate_stages, Granularity, Holder, ListError, SimConfig,
        StagePlan, StageViolation, TooWide, Violation, Width,
    };
    // 10 + 4294967290 fields wrap to 4 in u32, under dRMT's A = 32.
    let odg = Odg::new(
        vec![action("small", 10), action("huge", 4_294_967_290)],
        vec![],
    )
    .expect("a graph");
    let err = list_schedule(&odg, &Arch::DRMT, 2).expect_err("`huge` fits no class");
    assert_eq!(
        err,
        ListError::TooWide(TooWide {
            node: "huge".into(),
            width: Width::Fields(4_294_967_290),
            capacity: 32,
            holder: Holder::Processor,
        })
    );
    assert_eq!(
        err.to_string(),
        "`huge` modifies 4294967290 fields, more than a processor's A = 32"
    );
    let both_at_0 = Schedule {
        period: 2,
        start: vec![0, 0],
    };
    assert_eq!(
        validate(&odg, &Arch::DRMT, &both_at_0),
        Err(vec![Violation::ActionCapacity {
            class: 0,
            used: 4_294_967_300,
            capacity: 32
        }])
    );
    // A key wider than M̄ units of b bits, likewise.
    let wide_key = Odg::new(
        vec![Node {
            name: "wide".into(),
            op: Op::Match {
                key_bits: 8 * 80 + 1,
                entries: 1,
            },
        }],
        vec![],
    )
    .expect("a graph");
    assert_eq!(
        list_schedule(&wide_key, &Arch::DRMT, 4),
        Err(ListError::TooWide(TooWide {
            node: "wide".into(),
            width: Width::MatchUnits(9),
            capacity: 8,
            holder: Holder::Processor,
        }))
    );
    // Capacity u32::MAX: two actions of u32::MAX - 1 fields each fit one at a time, not
    // both; a sum that saturated at u32::MAX would pass them together.
    let roomy = Arch {
        action_capacity: u32::MAX,
        ..Arch::DRMT
    };
    let odg = Odg::new(
        vec![action("a", u32::MAX - 1), action("b", u32::MAX - 1)],
        vec![],
    )
    .expect("a graph");
    assert_eq!(
        list_schedule(&odg, &roomy, 1),
        Ok(None),
        "one class holds one"
    );
    let s = list_schedule(&odg, &roomy, 2)
        .expect("each fits")
        .expect("two classes hold both");
    assert_eq!(validate(&odg, &roomy, &s), Ok(()));
    assert_ne!(s.start[0] % 2, s.start[1] % 2);
    let together = Schedule {
        period: 1,
        start: vec![0, 0],
    };
    assert!(matches!(
        &validate(&odg, &roomy, &together).unwrap_err()[..],
        [Violation::ActionCapacity { used, .. }] if *used == 2 * u64::from(u32::MAX - 1)
    ));
    let sim = SimConfig {
        cycles: 20,
        warmup: 10,
    };
    let r = simulate_drmt(&odg, &roomy, &together, 1, &sim).expect("runs");
    assert!(r.resource_violations > 0, "{r:?}");
    let plan = assign_stages(&odg, &roomy, Granularity::Fine).expect("each fits a stage");
    assert_eq!(plan.stages, 2);
    let one_stage = StagePlan {
        stage: vec![0, 0],
        stages: 1,
        ..plan
    };
    assert!(matches!(
        &validate_stages(&odg, &roomy, &one_stage).unwrap_err()[..],
        [StageViolation::ActionCapacity { used, .. }] if *used == 2 * u64::from(u32::MAX - 1)
    ));
}

#[test]
fn out_of_range_architectures_and_periods_are_refused_by_name() {
    use pfemu::pipeline::{
        assign_stages, heuristic_schedule, simulate_drmt, simulate_rmt, ArchError, Granularity,
        ListError, RmtError, SimConfig, SimError, Violation, MAX_PERIOD,
    };
    let (odg, arch) = pfemu::pipeline::examples::figure_5();
    let schedule = Schedule {
        period: 2,
        start: vec![0, 0, 3, 3, 5, 5, 6],
    };
    let sim = SimConfig {
        cycles: 200,
        warmup: 100,
    };
    for (bad, field, value) in [
        (
            Arch {
                match_capacity: 0,
                ..arch
            },
            "match_capacity",
            0,
        ),
        (
            Arch {
                unit_bits: 0,
                ..arch
            },
            "unit_bits",
            0,
        ),
        (
            Arch {
                action_capacity: 0,
                ..arch
            },
            "action_capacity",
            0,
        ),
        (Arch { ipc: 0, ..arch }, "ipc", 0),
        (
            Arch {
                match_latency: Arch::MAX_LATENCY + 1,
                ..arch
            },
            "match_latency",
            Arch::MAX_LATENCY + 1,
        ),
        (
            Arch {
                action_latency: u64::MAX,
                ..arch
            },
            "action_latency",
            u64::MAX,
        ),
    ] {
        let e = bad.check().expect_err(field);
        assert_eq!((e.field, e.value), (field, value));
        assert!(
            e.to_string()
                .starts_with(&format!("Arch::{field} is {value}: ")),
            "{e}"
        );
        assert_eq!(list_schedule(&odg, &bad, 2), Err(ListError::Arch(e)));
        assert_eq!(
            assign_stages(&odg, &bad, Granularity::Fine),
            Err(RmtError::Arch(e))
        );
        assert_eq!(
            validate(&odg, &bad, &schedule),
            Err(vec![Violation::Arch(e)])
        );
        assert_eq!(
            simulate_drmt(&odg, &bad, &schedule, 2, &sim),
            Err(SimError::Arch(e))
        );
        assert_eq!(simulate_rmt(3, 3, &bad, &sim), Err(SimError::Arch(e)));
        assert_eq!(heuristic_schedule(&odg, &bad, 4), None);
        assert_eq!(fewest_processors(&odg, &bad, 64), None);
    }
    for ok in [Arch::DRMT, Arch::RMT, arch] {
        assert_eq!(ok.check(), Ok(()));
    }
    let slow = Arch {
        match_latency: Arch::MAX_LATENCY,
        ..arch
    };
    assert_eq!(slow.check(), Ok::<(), ArchError>(()));
    // Periods: 0 and past MAX_PERIOD are refused, not one class booked per cycle.
    assert_eq!(list_schedule(&odg, &arch, 0), Err(ListError::Period(0)));
    assert_eq!(
        list_schedule(&odg, &arch, 1 << 40),
        Err(ListError::Period(1 << 40))
    );
    assert!(ListError::Period(0).to_string().contains("1 to 65536"));
    let s = list_schedule(&odg, &arch, MAX_PERIOD)
        .expect("in range")
        .expect("room to spare");
    assert_eq!(validate(&odg, &arch, &s), Ok(()));
    // The stage layout still serves any period.
    let s = heuristic_schedule(&odg, &arch, 1 << 40).expect("the stage layout");
    assert_eq!(validate(&odg, &arch, &s), Ok(()));
    // A node wider than a cycle has no schedule at any period: the search ends at once,
    // whatever its limit.
    let fat = Odg::new(vec![action("fat", 33)], vec![]).expect("a graph");
    assert_eq!(fewest_processors(&fat, &Arch::DRMT, u64::MAX), None);
}

/// `n` nodes, matches and actions in turn, and the first `edges` of the edges from each
/// node to its next 17 (a DAG: every edge goes forward).
fn dense_chain(n: usize, edges: usize) -> (Vec<Node>, Vec<Edge>) {
    let nodes = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                Node {
                    name: format!("M{i}"),
                    op: Op::Match {
                        key_bits: 32,
                        entries: 1024,
                    },
                }
            } else {
                action(&format!("A{i}"), 1)
            }
        })
        .collect();
    let edges = (0..n)
        .flat_map(|from| (from + 1..n.min(from + 18)).map(move |to| Edge::result(from, to)))
        .take(edges)
        .collect();
    (nodes, edges)
}

#[test]
fn a_graph_beyond_the_limits_is_refused_by_its_constructor_naming_the_limit() {
    use pfemu::pipeline::OdgError;
    // At the limits: built, and the schedulers take it (one class per node holds any
    // chain at IPC 1).
    let (nodes, edges) = dense_chain(Odg::MAX_NODES, Odg::MAX_EDGES);
    assert_eq!(
        edges.len(),
        Odg::MAX_EDGES,
        "the generator reaches the limit"
    );
    let odg = Odg::new(nodes, edges).expect("within the limits");
    assert!(lower_bound(&odg, &Arch::DRMT).latency > 0);
    let s = list_schedule(&odg, &Arch::DRMT, Odg::MAX_NODES as u64)
        .expect("a valid input")
        .expect("a class per node");
    assert_eq!(validate(&odg, &Arch::DRMT, &s), Ok(()));
    // One node more, or one edge more, is refused, the limit named.
    let (nodes, edges) = dense_chain(Odg::MAX_NODES + 1, 0);
    let err = Odg::new(nodes, edges).unwrap_err();
    assert_eq!(err, OdgError::TooManyNodes(801));
    assert_eq!(
        err.to_string(),
        "801 nodes: a graph may have at most 800 (Odg::MAX_NODES)"
    );
    let (nodes, edges) = dense_chain(Odg::MAX_NODES, Odg::MAX_EDGES + 1);
    let err = Odg::new(nodes, edges).unwrap_err();
    assert_eq!(err, OdgError::TooManyEdges(12_801));
    assert_eq!(
        err.to_string(),
        "12801 edges: a graph may have at most 12800 (Odg::MAX_EDGES)"
    );
    // The sizes are checked before anything else: a million nodes, and edges to nowhere,
    // are refused for their count (checking each name against the others' first, as the
    // constructor once did, would compare 10^11 pairs).
    let million = (0..1_000_000)
        .map(|i| action(&format!("x{i}"), 1))
        .collect();
    assert_eq!(
        Odg::new(million, vec![]),
        Err(OdgError::TooManyNodes(1_000_000))
    );
    let nowhere = vec![Edge::result(7, 9); Odg::MAX_EDGES + 1];
    assert_eq!(
        Odg::new(vec![], nowhere),
        Err(OdgError::TooManyEdges(Odg::MAX_EDGES + 1))
    );
    assert_eq!(Odg::check_size(Odg::MAX_NODES, Odg::MAX_EDGES), Ok(()));
}

#[test]
fn the_empty_graph_and_a_single_node_go_through_every_scheduler() {
    use pfemu::pipeline::{
        assign_stages, drmt_from_stages, heuristic_schedule, simulate_drmt, stage_lower_bound,
        validate_stages, Granularity, SimConfig,
    };
    let empty = Odg::new(vec![], vec![]).unwrap();
    let one = Odg::new(vec![action("a", 1)], vec![]).unwrap();
    let arch = Arch::DRMT;
    // (graph, its latency: the node's own ΔA, stages)
    for (odg, latency, stages) in [(&empty, 0, 0), (&one, 2, 1)] {
        let lb = lower_bound(odg, &arch);
        assert_eq!((lb.processors, lb.latency), (1, latency));
        let s = list_schedule(odg, &arch, 1)
            .unwrap()
            .expect("one class holds it");
        assert_eq!(validate(odg, &arch, &s), Ok(()));
        assert_eq!(s.latency(odg, &arch), latency);
        assert_eq!(fewest_processors(odg, &arch, 4), Some(s.clone()));
        // No schedule has a period of 0, whatever the graph.
        assert_eq!(heuristic_schedule(odg, &arch, 0), None);
        for g in [Granularity::Coarse, Granularity::Fine] {
            let plan = assign_stages(odg, &Arch::RMT, g).unwrap();
            assert_eq!(validate_stages(odg, &Arch::RMT, &plan), Ok(()));
            assert_eq!(
                (plan.stages, stage_lower_bound(odg, &Arch::RMT, g)),
                (stages, stages)
            );
            let laid_out = drmt_from_stages(odg, &plan, &arch, 2);
            assert_eq!(validate(odg, &arch, &laid_out), Ok(()));
        }
        // Every packet in is one out, a cycle after cycle.
        let config = SimConfig {
            cycles: 100,
            warmup: 10,
        };
        let r = simulate_drmt(odg, &arch, &s, 1, &config).unwrap();
        assert_eq!((r.offered, r.admitted, r.completed), (90, 90, 90));
        assert_eq!((r.latency_max, r.threads_max), (latency, latency));
    }
}

#[test]
fn two_dependencies_between_a_pair_are_one_of_the_larger_latency() {
    use pfemu::pipeline::EdgeKind;
    let m = |name: &str| Node {
        name: name.into(),
        op: Op::Match {
            key_bits: 32,
            entries: 1,
        },
    };
    let nodes = || vec![m("fwd"), m("acl"), m("log")];
    // Either order of the two kinds: the result's ΔM holds, once, where the pair first stood.
    for edges in [
        vec![Edge::order(0, 1), Edge::result(1, 2), Edge::result(0, 1)],
        vec![Edge::result(0, 1), Edge::result(1, 2), Edge::order(0, 1)],
    ] {
        let odg = Odg::new(nodes(), edges).unwrap();
        assert_eq!(odg.edges(), &[Edge::result(0, 1), Edge::result(1, 2)]);
        assert_eq!(lower_bound(&odg, &Arch::DRMT).latency, 3 * 22);
        // `acl` in the same cycle as `fwd` meets the ordering but not the result.
        let same_cycle = Schedule {
            period: 1,
            start: vec![0, 0, 22],
        };
        assert!(validate(&odg, &Arch::DRMT, &same_cycle).is_err());
    }
    // A repeated edge is kept once, of its kind.
    let odg = Odg::new(nodes(), vec![Edge::order(0, 2), Edge::order(0, 2)]).unwrap();
    assert_eq!(odg.edges(), &[Edge::order(0, 2)]);
    assert_eq!(odg.edges()[0].kind, EdgeKind::Order);
    // Opposite directions are not a pair but a cycle, refused as before.
    assert!(Odg::new(nodes(), vec![Edge::order(0, 1), Edge::result(1, 0)]).is_err());
}

/// Every scheduler, on random graphs of the paper's shape with ordering edges (latency
/// dS = 0) added, gives what the independent validators accept, and some schedule starts an
/// ordered pair in one cycle: the zero latency is used, not just tolerated.
#[test]
fn random_graphs_with_orderings_get_valid_schedules_from_every_scheduler() {
    use pfemu::pipeline::{
        assign_stages, drmt_from_stages, examples, heuristic_schedule, simulate_drmt,
        validate_stages, EdgeKind, Granularity, SimConfig,
    };
    let (mut orderings, mut same_cycle) = (0, 0);
    for seed in 0..60 {
        let odg = examples::random_with_orderings(seed, 5 + (seed % 20) as usize);
        let ordered: Vec<&Edge> = odg
            .edges()
            .iter()
            .filter(|e| e.kind == EdgeKind::Order)
            .collect();
        orderings += ordered.len();
        for arch in [
            Arch::DRMT,
            Arch {
                ipc: 2,
                ..Arch::DRMT
            },
        ] {
            let bound = lower_bound(&odg, &arch);
            let s = fewest_processors(&odg, &arch, 64).expect("a schedule within 64");
            assert_eq!(validate(&odg, &arch, &s), Ok(()), "seed {seed}");
            assert!(s.period >= bound.processors, "seed {seed}");
            assert!(s.latency(&odg, &arch) >= bound.latency, "seed {seed}");
            same_cycle += ordered
                .iter()
                .filter(|e| s.start[e.from] == s.start[e.to])
                .count();
            for period in [s.period, s.period + 1] {
                if let Some(h) = heuristic_schedule(&odg, &arch, period) {
                    assert_eq!(validate(&odg, &arch, &h), Ok(()), "seed {seed} P {period}");
                }
            }
            let latency = s.latency(&odg, &arch);
            let window = SimConfig {
                cycles: latency + 50 * s.period,
                warmup: latency,
            };
            let run = simulate_drmt(&odg, &arch, &s, s.period, &window).unwrap();
            assert_eq!(
                (run.resource_violations, run.contentions),
                (0, 0),
                "seed {seed}"
            );
            assert_eq!(run.completed, 50 * s.period, "seed {seed}: one a cycle");
            for granularity in [Granularity::Coarse, Granularity::Fine] {
                let plan = assign_stages(&odg, &arch, granularity).expect("graphs fit a stage");
                assert_eq!(validate_stages(&odg, &arch, &plan), Ok(()), "seed {seed}");
                let cyclic = drmt_from_stages(&odg, &plan, &arch, 2);
                assert_eq!(validate(&odg, &arch, &cyclic), Ok(()), "seed {seed}");
            }
        }
    }
    assert!(orderings > 100, "{orderings} orderings in 60 graphs");
    assert!(
        same_cycle > 0,
        "no schedule started an ordered pair in one cycle"
    );
}
