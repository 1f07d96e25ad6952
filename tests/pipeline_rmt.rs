//! RMT stage assignment on the dRMT paper's random operation dependency graphs: every plan,
//! coarse and fine, passes the validator and is no better than the lower bound, fine-grained
//! RMT never needs more stages than RMT, and every plan turns into a valid dRMT schedule of
//! RMT's throughput (Theorem 3.3); likewise on DAGs of any shape and on small stages.

use pfemu::pipeline::examples::{figure_5, random};
use pfemu::pipeline::{
    assign_stages, drmt_from_stages, rmt_throughput, stage_lower_bound, validate, validate_stages,
    Arch, Edge, Granularity, Node, Odg, Op, StagePlan,
};
use pfemu::rng::SplitMix64;

fn plan(odg: &Odg, arch: &Arch, granularity: Granularity) -> StagePlan {
    let plan =
        assign_stages(odg, arch, granularity).unwrap_or_else(|e| panic!("{granularity}: {e}"));
    assert_eq!(
        validate_stages(odg, arch, &plan),
        Ok(()),
        "{granularity}: {plan:?}"
    );
    // Every coarse plan is a fine one (what Theorem 3.3's construction relies on).
    let as_fine = StagePlan {
        granularity: Granularity::Fine,
        ..plan.clone()
    };
    assert_eq!(validate_stages(odg, arch, &as_fine), Ok(()), "{plan:?}");
    let bound = stage_lower_bound(odg, arch, granularity);
    assert!(
        plan.stages >= bound,
        "{granularity}: {} stages beat the bound {bound}",
        plan.stages
    );
    plan
}

#[test]
fn random_graphs_get_valid_plans_within_the_bounds() {
    let arch = Arch::RMT;
    let (mut coarse_total, mut fine_total, mut coarse_tight, mut fine_tight) = (0, 0, 0, 0);
    for seed in 0..100 {
        let odg = random(seed, 20);
        let coarse = plan(&odg, &arch, Granularity::Coarse);
        let fine = plan(&odg, &arch, Granularity::Fine);
        assert!(
            fine.stages <= coarse.stages,
            "seed {seed}: fine {} > coarse {}",
            fine.stages,
            coarse.stages
        );
        assert!(
            stage_lower_bound(&odg, &arch, Granularity::Fine)
                <= stage_lower_bound(&odg, &arch, Granularity::Coarse)
        );
        for p in [&coarse, &fine] {
            assert_eq!(p.latency(&arch), u64::from(p.stages) * 20);
        }
        coarse_total += coarse.stages;
        fine_total += fine.stages;
        coarse_tight +=
            u32::from(coarse.stages == stage_lower_bound(&odg, &arch, Granularity::Coarse));
        fine_tight += u32::from(fine.stages == stage_lower_bound(&odg, &arch, Granularity::Fine));
    }
    // Splitting tables pays on these graphs, whose tables feed each other's actions.
    assert!(
        fine_total < coarse_total,
        "fine {fine_total} stages, coarse {coarse_total}"
    );
    // The dependency chain, not M or A, bounds these graphs on RMT, and the greedy meets the
    // bound on almost all of them (100 coarse and 98 fine when written).
    assert!(
        coarse_tight >= 80,
        "{coarse_tight} of 100 at the coarse bound"
    );
    assert!(fine_tight >= 80, "{fine_tight} of 100 at the fine bound");
}

#[test]
fn every_plan_is_a_drmt_schedule_of_rmt_throughput() {
    // Theorem 3.3 assumes a dRMT processor with an RMT stage's capacities.
    let arch = Arch {
        action_capacity: Arch::RMT.action_capacity,
        ..Arch::DRMT
    };
    for seed in 0..100 {
        let odg = random(seed, 20);
        for granularity in [Granularity::Coarse, Granularity::Fine] {
            let plan = plan(&odg, &arch, granularity);
            let stages = u64::from(plan.stages);
            for processors in [
                1,
                2,
                stages / 2,
                stages.saturating_sub(1),
                stages,
                stages + 3,
            ] {
                let schedule = drmt_from_stages(&odg, &plan, &arch, processors);
                assert_eq!(
                    validate(&odg, &arch, &schedule),
                    Ok(()),
                    "seed {seed}, {granularity}, {processors} processors"
                );
                let processors = processors.max(1);
                assert_eq!(
                    processors as f64 / schedule.period as f64,
                    rmt_throughput(plan.stages, processors as u32)
                );
            }
        }
    }
}

#[test]
fn figure_5_needs_three_stages_of_its_own_processor() {
    // M = 2 per stage: two matches, then two more, then the actions (A = 2) and A3.
    let (odg, arch) = figure_5();
    let coarse = plan(&odg, &arch, Granularity::Coarse);
    let fine = plan(&odg, &arch, Granularity::Fine);
    assert_eq!(fine.stages, 3);
    assert_eq!(coarse.stages, 3);
    assert_eq!(stage_lower_bound(&odg, &arch, Granularity::Fine), 3);
}

/// A DAG of any shape: `n` nodes, each a match or an action of random size, each pair i < j
/// joined with probability 1/4 — tables feed each other's actions, actions chain, matches
/// wait for matches — one edge in three only in order (latency 0).
fn any_dag(seed: u64, n: usize) -> Odg {
    let mut rng = SplitMix64::new(seed);
    let nodes = (0..n)
        .map(|i| Node {
            name: format!("n{i}"),
            op: if rng.below(2) == 0 {
                Op::Match {
                    key_bits: 1 + rng.below(320) as u32,
                    entries: 1024,
                }
            } else {
                Op::Action {
                    fields: 1 + rng.below(8) as u32,
                }
            },
        })
        .collect();
    let mut edges = Vec::new();
    for from in 0..n {
        for to in from + 1..n {
            if rng.below(4) == 0 {
                edges.push(if rng.below(3) == 0 {
                    Edge::order(from, to)
                } else {
                    Edge::result(from, to)
                });
            }
        }
    }
    Odg::new(nodes, edges).expect("edges go forward")
}

#[test]
fn any_dag_on_small_stages_gets_valid_plans_and_drmt_schedules() {
    // Small stages, so capacity spills as well as dependencies decide; one architecture with
    // zero latencies, where same-kind dependents may share a slot.
    let small = Arch {
        match_capacity: 4,
        unit_bits: 80,
        action_capacity: 8,
        match_latency: 3,
        action_latency: 1,
        ipc: 1,
    };
    let instant = Arch {
        match_latency: 0,
        action_latency: 0,
        ..small
    };
    for seed in 0..200 {
        let odg = any_dag(seed, 4 + (seed % 13) as usize);
        for arch in [small, instant] {
            let coarse = plan(&odg, &arch, Granularity::Coarse);
            let fine = plan(&odg, &arch, Granularity::Fine);
            assert!(fine.stages <= coarse.stages, "seed {seed}");
            for p in [&coarse, &fine] {
                for processors in [1, 2, 3, u64::from(p.stages)] {
                    let schedule = drmt_from_stages(&odg, p, &arch, processors);
                    assert_eq!(
                        validate(&odg, &arch, &schedule),
                        Ok(()),
                        "seed {seed}, {}, {processors} processors",
                        p.granularity
                    );
                }
            }
        }
    }
}
