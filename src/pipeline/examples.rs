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
    let e = |from, to| Edge { from, to };
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
