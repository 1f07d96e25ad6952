//! The dRMT ILP scheduler (`pipeline::ilp_schedule`): optimal on the paper's example, never
//! worse than the heuristic nor better than the lower bound, strictly better than the list
//! scheduler where greedy placement goes wrong, and a proof of infeasibility where no schedule
//! exists.
//!
//! Every limit is generous and every graph small, so the solves finish well within it; the
//! assertions on values are made only on outcomes proven optimal.

#![cfg(feature = "ilp")]

use std::time::Duration;

use pfemu::pipeline::examples::{figure_5, random};
use pfemu::pipeline::*;

/// A limit no test's solve comes near: no node limit, a time limit as a guard only.
fn generous() -> IlpOptions {
    IlpOptions {
        time_limit: Duration::from_secs(120),
        node_limit: None,
        ..IlpOptions::default()
    }
}

/// The same, with every speed-up off: the paper's plain formulation.
fn plain() -> IlpOptions {
    IlpOptions {
        seed: false,
        windows: false,
        bounds: false,
        tight_ipc: false,
        ..generous()
    }
}

fn last_start(s: &Schedule) -> u64 {
    s.start.iter().copied().max().unwrap_or(0)
}

/// The outcome's schedule, checked by the validator.
fn valid(odg: &Odg, arch: &Arch, out: &IlpOutcome) -> Schedule {
    let s = out.schedule.clone().expect("a schedule");
    assert_eq!(validate(odg, arch, &s), Ok(()), "{out:?}");
    s
}

fn proven(out: &IlpOutcome) -> bool {
    matches!(out.status, IlpStatus::Optimal | IlpStatus::OptimalByBound)
}

#[test]
fn figure_5_at_two_processors_is_optimal_at_the_papers_schedule() {
    let (odg, arch) = figure_5();
    for options in [generous(), plain()] {
        let out = ilp_schedule(&odg, &arch, 2, &options);
        assert_eq!(out.status, IlpStatus::Optimal, "{out:?}");
        let s = valid(&odg, &arch, &out);
        // The paper's schedule (Figure 5b) ends with A3 at 6; A3 at 5 would need the naive
        // schedule, which breaks M̄ and IPC: 6 is the optimum.
        assert_eq!(s.start[odg.index_of("A3").unwrap()], 6);
        assert_eq!(last_start(&s), 6);
        assert!(out.variables > 0 && out.constraints > 0);
        assert!(out.failure.is_none());
    }
    // The speed-ups shrink the program.
    let fast = ilp_schedule(&odg, &arch, 2, &generous());
    let slow = ilp_schedule(&odg, &arch, 2, &plain());
    assert!(fast.variables < slow.variables, "{fast:?} {slow:?}");
    assert_eq!(fast.bound, 5, "the critical path: M0 -> M2 -> A1 -> A3");
    assert_eq!(fast.seed_last_start, Some(6));
}

#[test]
fn on_random_graphs_the_ilp_lies_between_the_bound_and_the_heuristic() {
    let arch = Arch::DRMT;
    let mut solved = 0;
    for seed in [0, 1, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 16, 18] {
        let odg = random(seed, 6);
        let list = fewest_processors(&odg, &arch, 64).expect("a period for the heuristic");
        let out = ilp_schedule(&odg, &arch, list.period, &generous());
        let s = valid(&odg, &arch, &out);
        assert!(last_start(&s) <= last_start(&list), "seed {seed}: {out:?}");
        assert_eq!(out.seed_last_start, Some(last_start(&list)));
        if proven(&out) {
            solved += 1;
            let bound = odg
                .nodes()
                .iter()
                .enumerate()
                .map(|(v, _)| critical_start(&odg, &arch, v))
                .max()
                .unwrap_or(0);
            assert_eq!(out.bound, bound, "seed {seed}");
            assert!(last_start(&s) >= bound, "seed {seed}: {out:?}");
        }
    }
    assert!(solved > 10, "{solved} of 15 proven optimal");
}

/// Node `v`'s earliest start with unlimited resources.
fn critical_start(odg: &Odg, arch: &Arch, v: usize) -> u64 {
    odg.edges()
        .iter()
        .filter(|e| e.to == v)
        .map(|e| critical_start(odg, arch, e.from) + odg.latency(arch, e.from))
        .max()
        .unwrap_or(0)
}

#[test]
fn the_speed_ups_keep_the_optimum() {
    let arch = Arch::DRMT;
    for seed in [3, 4] {
        let odg = random(seed, 6);
        let period = fewest_processors(&odg, &arch, 64).unwrap().period;
        let fast = ilp_schedule(&odg, &arch, period, &generous());
        let slow = ilp_schedule(&odg, &arch, period, &plain());
        valid(&odg, &arch, &fast);
        valid(&odg, &arch, &slow);
        if proven(&fast) && proven(&slow) {
            assert_eq!(fast.last_start(), slow.last_start(), "seed {seed}");
        }
        assert!(fast.variables <= slow.variables);
    }
    let (odg, arch) = greedy_trap();
    let slow = ilp_schedule(&odg, &arch, 2, &plain());
    assert_eq!(slow.status, IlpStatus::Optimal);
    assert_eq!(slow.last_start(), Some(2));
}

/// A graph where the list scheduler's earliest-start placement is a trap: M0 -> Abig (two
/// fields) and Asmall (one field) -> Mx, on 2 processors with Ā = 2 and IPC 2.
fn greedy_trap() -> (Odg, Arch) {
    let m = |name: &str| Node {
        name: name.into(),
        op: Op::Match {
            key_bits: 32,
            entries: 16,
        },
    };
    let a = |name: &str, fields| Node {
        name: name.into(),
        op: Op::Action { fields },
    };
    let odg = Odg::new(
        vec![m("M0"), a("Abig", 2), a("Asmall", 1), m("Mx")],
        vec![Edge::result(0, 1), Edge::result(2, 3)],
    )
    .unwrap();
    let arch = Arch {
        match_capacity: 8,
        unit_bits: 80,
        action_capacity: 2,
        match_latency: 2,
        action_latency: 1,
        ipc: 2,
    };
    (odg, arch)
}

#[test]
fn the_ilp_beats_greedy_placement_where_earliest_is_wrong() {
    let (odg, arch) = greedy_trap();
    // Greedy starts M0 and Asmall at 0 (class 0, one field used); Abig is ready at 2, class 0
    // has one field left, so it waits for class 1 at 3.
    let list = list_schedule(&odg, &arch, 2)
        .expect("every node fits")
        .expect("a schedule");
    assert_eq!(list.start, vec![0, 3, 0, 1]);
    // Holding Asmall back to 1 (class 1) leaves class 0 whole for Abig at 2, and Mx shares
    // class 0 with M0 at a second time, which IPC 2 allows. Unseeded, so that the solver
    // finds it rather than the heuristic's other half, the stage plan.
    let unseeded = IlpOptions {
        seed: false,
        ..generous()
    };
    for options in [unseeded, generous()] {
        let out = ilp_schedule(&odg, &arch, 2, &options);
        assert!(proven(&out), "{out:?}");
        let s = valid(&odg, &arch, &out);
        assert_eq!(last_start(&s), 2);
        assert!(last_start(&s) < last_start(&list));
        assert_eq!(out.bound, 2, "the ILP meets the critical path");
    }
    let out = ilp_schedule(&odg, &arch, 2, &unseeded);
    assert_eq!((out.status, out.solves), (IlpStatus::Optimal, 1));
}

/// M0 -> M1 -> M2 with M̄ = 2 one-unit matches a cycle and IPC 1.
fn chain_of_three() -> (Odg, Arch) {
    let m = |name: &str| Node {
        name: name.into(),
        op: Op::Match {
            key_bits: 32,
            entries: 16,
        },
    };
    let odg = Odg::new(
        vec![m("M0"), m("M1"), m("M2")],
        vec![Edge::result(0, 1), Edge::result(1, 2)],
    )
    .unwrap();
    let (_, arch) = figure_5();
    (odg, arch)
}

#[test]
fn a_period_with_no_schedule_is_proven_infeasible() {
    let (odg, arch) = chain_of_three();
    // The units fit two classes (3 <= 2 * 2), but two of the three matches share a class,
    // where IPC 1 makes them start together, which their dependency forbids.
    assert_eq!(lower_bound(&odg, &arch).processors, 2);
    assert_eq!(list_schedule(&odg, &arch, 2), Ok(None));
    for options in [generous(), plain()] {
        let out = ilp_schedule(&odg, &arch, 2, &options);
        assert_eq!(out.status, IlpStatus::Infeasible, "{out:?}");
        assert_eq!(out.schedule, None);
    }
    // Three processors give each match a class of its own.
    let (period, out) = ilp_fewest_processors(&odg, &arch, 8, &generous()).unwrap();
    assert_eq!(period, 3);
    assert!(proven(&out), "{out:?}");
    assert_eq!(out.unresolved_periods, Vec::<u64>::new());
    assert_eq!(valid(&odg, &arch, &out).start, vec![0, 2, 4]);
    // Too few periods allowed: none.
    assert!(ilp_fewest_processors(&odg, &arch, 2, &generous()).is_none());
    // A node wider than a class is refused without a solve.
    let wide = Odg::new(
        vec![Node {
            name: "wide".into(),
            op: Op::Match {
                key_bits: 3 * 80,
                entries: 1,
            },
        }],
        vec![],
    )
    .unwrap();
    let out = ilp_schedule(&wide, &arch, 4, &generous());
    assert_eq!((out.status, out.variables), (IlpStatus::Infeasible, 0));
}

#[test]
fn fewest_processors_by_ilp_is_never_more_than_by_the_heuristic() {
    let arch = Arch::DRMT;
    for seed in [0, 3, 4, 8] {
        let odg = random(seed, 6);
        let list = fewest_processors(&odg, &arch, 64).unwrap();
        let (period, out) = ilp_fewest_processors(&odg, &arch, 64, &generous()).unwrap();
        assert!(period <= list.period, "seed {seed}");
        assert!(period >= lower_bound(&odg, &arch).processors);
        valid(&odg, &arch, &out);
    }
}

#[test]
fn with_resources_to_spare_the_ilp_meets_the_critical_path() {
    let roomy = Arch {
        match_capacity: 1_000,
        action_capacity: 1_000,
        ipc: 1_000,
        ..Arch::DRMT
    };
    for seed in 0..20 {
        let odg = random(seed, 10);
        let bound = lower_bound(&odg, &roomy);
        // The plain formulation's horizon is long at P = 1: a few graphs suffice for it.
        let forms = if seed < 3 {
            vec![generous(), plain()]
        } else {
            vec![generous()]
        };
        for options in forms {
            let out = ilp_schedule(&odg, &roomy, 1, &options);
            assert!(proven(&out), "seed {seed}: {out:?}");
            let s = valid(&odg, &roomy, &out);
            assert_eq!(s.latency(&odg, &roomy), bound.latency, "seed {seed}");
        }
    }
}

#[test]
fn a_time_limit_past_any_instant_is_no_limit_and_a_bad_architecture_is_named() {
    let (odg, arch) = figure_5();
    // Duration::MAX added to an Instant overflows: it means no limit, seeded or plain.
    for options in [generous(), plain()] {
        let out = ilp_schedule(
            &odg,
            &arch,
            2,
            &IlpOptions {
                time_limit: Duration::MAX,
                ..options
            },
        );
        assert!(proven(&out), "{out:?}");
        assert_eq!(last_start(&valid(&odg, &arch, &out)), 6);
    }
    let bad = Arch { ipc: 0, ..arch };
    let out = ilp_schedule(&odg, &bad, 2, &generous());
    assert_eq!(out.status, IlpStatus::SolverFailed);
    assert_eq!(out.schedule, None);
    let failure = out.failure.expect("a reason");
    assert_eq!(failure.to_string(), "Arch::ipc is 0: it must be at least 1");
}

#[test]
fn orderings_cost_the_ilp_no_latency() {
    // Figure 5 (P = 2) with every edge turned into an ordering: the four one-unit matches
    // still need two classes of M = 2 and the three one-field actions two classes of A = 2,
    // each class one start time (IPC 1), but an ordered pair may share a start: M1, M3, A2
    // at 0 and M0, M2, A1, A3 at 1 is a last start of 1, against the dependencies' 6, and
    // what the classes alone allow (no edge at all).
    let (odg, arch) = figure_5();
    let ordered: Vec<Edge> = odg
        .edges()
        .iter()
        .map(|e| Edge::order(e.from, e.to))
        .collect();
    let ordered = Odg::new(odg.nodes().to_vec(), ordered).unwrap();
    let free = Odg::new(odg.nodes().to_vec(), vec![]).unwrap();
    for options in [generous(), plain()] {
        for (graph, want) in [(&odg, 6), (&ordered, 1), (&free, 1)] {
            let out = ilp_schedule(graph, &arch, 2, &options);
            assert!(proven(&out), "{out:?}");
            assert_eq!(last_start(&valid(graph, &arch, &out)), want, "{out:?}");
        }
    }
}

#[test]
fn a_node_limit_stops_the_solver_at_the_same_point_on_any_machine() {
    // The plain formulation, unseeded, on a random graph: the root relaxation is fractional,
    // so the solver must branch, and a budget of no node stops it before any schedule.
    let odg = random(3, 6);
    let arch = Arch::DRMT;
    let period = lower_bound(&odg, &arch).processors + 1;
    let unlimited = ilp_schedule(&odg, &arch, period, &plain());
    assert!(proven(&unlimited), "{unlimited:?}");
    let none = IlpOptions {
        node_limit: Some(0),
        ..plain()
    };
    let stopped = ilp_schedule(&odg, &arch, period, &none);
    assert_eq!(stopped.status, IlpStatus::NodeLimit, "{stopped:?}");
    assert_eq!(stopped.solves, 1);
    // Counted in work, not time: the same outcome again.
    let again = ilp_schedule(&odg, &arch, period, &none);
    assert_eq!(
        (again.status, &again.schedule),
        (stopped.status, &stopped.schedule)
    );
    if let Some(s) = &stopped.schedule {
        assert_eq!(validate(&odg, &arch, s), Ok(()));
    }
    // A budget the solve never reaches changes nothing.
    let roomy = IlpOptions {
        node_limit: Some(1_000_000),
        ..plain()
    };
    let out = ilp_schedule(&odg, &arch, period, &roomy);
    assert_eq!(
        (out.status, out.last_start()),
        (unlimited.status, unlimited.last_start())
    );
}

#[test]
fn the_longest_latencies_are_solved_with_windows_and_refused_without_them() {
    // A chain of three matches beside a lone action, at ΔM = 2^20 (the most Arch::check
    // takes). Without windows every node gets a variable for each of the horizon's ~3·2^20
    // cycles: gigabytes before the time limit could strike. Refused, named, at once.
    let node = |name: &str, op| Node {
        name: name.into(),
        op,
    };
    let m = Op::Match {
        key_bits: 32,
        entries: 1,
    };
    let odg = Odg::new(
        vec![
            node("m0", m),
            node("m1", m),
            node("m2", m),
            node("a", Op::Action { fields: 1 }),
        ],
        vec![Edge::result(0, 1), Edge::result(1, 2)],
    )
    .unwrap();
    let arch = Arch {
        match_latency: Arch::MAX_LATENCY,
        ..Arch::DRMT
    };
    // Three processors: each match a class of its own (IPC 1).
    let out = ilp_schedule(&odg, &arch, 3, &plain());
    assert_eq!(
        (out.status, out.solves),
        (IlpStatus::SolverFailed, 0),
        "{out:?}"
    );
    let failure = out.failure.expect("a reason");
    assert!(
        matches!(failure, IlpFailure::TooLarge(terms) if terms > MAX_ILP_TERMS),
        "{failure:?}"
    );
    assert!(failure.to_string().contains("MAX_ILP_TERMS"), "{failure}");
    // With the speed-ups the windows are narrow: the optimum, the chain's critical path.
    let out = ilp_schedule(&odg, &arch, 3, &generous());
    assert!(proven(&out), "{out:?}");
    assert_eq!(last_start(&valid(&odg, &arch, &out)), 2 * Arch::MAX_LATENCY);
}

#[test]
fn a_period_of_zero_or_past_any_switch_is_refused_by_name_without_a_solve() {
    let (odg, arch) = figure_5();
    for period in [0, MAX_PERIOD + 1, u64::MAX] {
        for options in [generous(), plain()] {
            let out = ilp_schedule(&odg, &arch, period, &options);
            assert_eq!(
                (out.status, out.solves, &out.schedule),
                (IlpStatus::SolverFailed, 0, &None),
                "P = {period}: {out:?}"
            );
            let failure = out.failure.expect("a reason").to_string();
            assert!(
                failure.contains(&format!("a period of {period}")),
                "{failure}"
            );
        }
    }
}

#[test]
fn by_default_the_ilp_is_bounded_by_work_and_says_which_bound_stopped_it() {
    // No wall clock by default: the budget is a count of nodes, the same on any machine.
    let default = IlpOptions::default();
    assert_eq!(default.time_limit, Duration::MAX);
    assert_eq!(default.node_limit, Some(DEFAULT_NODE_LIMIT));
    let odg = random(3, 6);
    let arch = Arch::DRMT;
    let none = IlpOptions {
        node_limit: Some(0),
        ..IlpOptions::default()
    };
    let period = lower_bound(&odg, &arch).processors + 1;
    let plain_none = IlpOptions {
        node_limit: Some(0),
        ..plain()
    };
    let stopped = ilp_schedule(&odg, &arch, period, &plain_none);
    assert_eq!(
        stopped.stopped_by,
        Some(IlpStatus::NodeLimit),
        "{stopped:?}"
    );
    // A proof is stopped by nothing.
    let proven_out = ilp_schedule(&odg, &arch, period, &plain());
    assert!(proven(&proven_out), "{proven_out:?}");
    assert_eq!(proven_out.stopped_by, None);
    // Over the periods tried, a smaller period a limit left unresolved is named too, and
    // the default run repeats itself exactly.
    let scan = |options: &IlpOptions| {
        ilp_fewest_processors(&odg, &arch, 64, options).map(|(p, out)| {
            (
                p,
                out.status,
                out.schedule,
                out.unresolved_periods,
                out.stopped_by,
            )
        })
    };
    let first = scan(&none);
    if let Some((_, _, _, unresolved, stopped_by)) = &first {
        if !unresolved.is_empty() {
            assert_eq!(*stopped_by, Some(IlpStatus::NodeLimit), "{first:?}");
        }
    }
    assert_eq!(scan(&none), first);
    let default_scan = scan(&IlpOptions::default());
    assert_eq!(scan(&IlpOptions::default()), default_scan);
    assert_ne!(
        default_scan.as_ref().and_then(|s| s.4),
        Some(IlpStatus::TimeLimit)
    );
}

#[test]
fn the_ilp_keeps_orderings_and_its_schedules_pass_the_validator() {
    use pfemu::pipeline::examples::random_with_orderings;
    let arch = Arch::DRMT;
    for seed in 0..12 {
        let odg = random_with_orderings(seed, 6);
        let Some((period, out)) = ilp_fewest_processors(&odg, &arch, 64, &IlpOptions::default())
        else {
            panic!("seed {seed}: no period")
        };
        let s = valid(&odg, &arch, &out);
        assert_eq!(s.period, period);
        let list = fewest_processors(&odg, &arch, 64).expect("a heuristic schedule");
        assert!(period <= list.period, "seed {seed}");
    }
}
