//! A dRMT processor's cyclic schedule and its validator (§3.2, Observations 2-3, Theorem
//! 3.5).

use std::collections::BTreeSet;
use std::fmt;

use super::odg::{Arch, ArchError, Odg, Op};

/// One packet's schedule on a processor that receives a packet every `period` cycles (P
/// processors fed round-robin): the cycle each node starts, counted from the packet's
/// arrival.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Schedule {
    /// P: cycles between two packets at a processor.
    pub period: u64,
    /// Start cycle of each node, by index.
    pub start: Vec<u64>,
}

impl Schedule {
    /// The schedule's latency: the last node's start plus its own latency (saturating at
    /// `u64::MAX`; nodes without a start, in a schedule of the wrong shape, count nothing).
    pub fn latency(&self, odg: &Odg, arch: &Arch) -> u64 {
        self.start
            .iter()
            .take(odg.nodes().len())
            .enumerate()
            .map(|(v, &t)| t.saturating_add(odg.latency(arch, v)))
            .max()
            .unwrap_or(0)
    }
}

/// What makes a schedule invalid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// The architecture fails [`Arch::check`]: nothing is checked against it.
    Arch(ArchError),
    /// The schedule does not give every node of the graph a start, or its period is 0.
    Shape(String),
    /// `to` starts `got` cycles after `from`, which needs `needed`.
    Dependency {
        /// The node depended on.
        from: String,
        /// The dependent node.
        to: String,
        /// Cycles it must wait (ΔM or ΔA, 0 for an ordering edge).
        needed: u64,
        /// Cycles it waits (negative: it starts first); exact for any two u64 starts.
        got: i128,
    },
    /// The matches of class `class` (start times ≡ class mod P) need `used` match units,
    /// more than M̄.
    MatchCapacity {
        /// The residue class.
        class: u64,
        /// Match units used.
        used: u64,
        /// M̄.
        capacity: u32,
    },
    /// The actions of class `class` modify `used` fields, more than Ā.
    ActionCapacity {
        /// The residue class.
        class: u64,
        /// Fields modified.
        used: u64,
        /// Ā.
        capacity: u32,
    },
    /// Matches of class `class` start at `packets` distinct times, each a different packet
    /// in the same cycle of the processor, more than IPC.
    MatchIpc {
        /// The residue class.
        class: u64,
        /// Distinct start times in the class.
        packets: u32,
        /// IPC.
        ipc: u32,
    },
    /// Likewise for actions.
    ActionIpc {
        /// The residue class.
        class: u64,
        /// Distinct start times in the class.
        packets: u32,
        /// IPC.
        ipc: u32,
    },
    /// Processors `first` and `second` ask for the table of match `table` in the same cycles
    /// (those ≡ `class` mod P): the crossbar's contention, which one schedule shared by
    /// every processor never has (Observation 1) and different ones can.
    MemoryContention {
        /// The match whose table both ask for.
        table: String,
        /// The processors, by index (processor i takes the packets arriving at i mod P).
        first: u64,
        /// The other.
        second: u64,
        /// The cycles of both requests, mod P.
        class: u64,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Arch(e) => write!(f, "{e}"),
            Violation::Shape(why) => f.write_str(why),
            Violation::Dependency {
                from,
                to,
                needed,
                got,
            } => write!(f, "`{to}` starts {got} cycles after `{from}`, which needs {needed}"),
            Violation::MatchCapacity {
                class,
                used,
                capacity,
            } => write!(
                f,
                "class {class}: matches need {used} match units, more than M = {capacity}"
            ),
            Violation::ActionCapacity {
                class,
                used,
                capacity,
            } => write!(f, "class {class}: actions modify {used} fields, more than A = {capacity}"),
            Violation::MatchIpc {
                class,
                packets,
                ipc,
            } => write!(
                f,
                "class {class}: matches of {packets} packets start in one cycle, more than IPC = {ipc}"
            ),
            Violation::ActionIpc {
                class,
                packets,
                ipc,
            } => write!(
                f,
                "class {class}: actions of {packets} packets start in one cycle, more than IPC = {ipc}"
            ),
            Violation::MemoryContention {
                table,
                first,
                second,
                class,
            } => write!(
                f,
                "processors {first} and {second} both ask for `{table}`'s table in the cycles \
                 ≡ {class} mod P"
            ),
        }
    }
}

/// Checks `schedule` for `odg` on `arch`: every dependency's latency, and per residue class
/// mod P the match units (M̄), the action fields (Ā) and the distinct start times of matches
/// and of actions (IPC). Returns every violation found, in that order; an architecture that
/// fails [`Arch::check`] is the only violation named.
pub fn validate(odg: &Odg, arch: &Arch, schedule: &Schedule) -> Result<(), Vec<Violation>> {
    arch.check().map_err(|e| vec![Violation::Arch(e)])?;
    let n = odg.nodes().len();
    if schedule.period == 0 || schedule.start.len() != n {
        return Err(vec![Violation::Shape(format!(
            "a schedule gives each of the {n} nodes a start and has a period of at least 1 \
             (this one: {} starts, period {})",
            schedule.start.len(),
            schedule.period
        ))]);
    }
    let mut bad = Vec::new();
    let t = &schedule.start;
    for e in odg.edges() {
        let needed = odg.edge_latency(arch, e);
        // In i128 the difference of two u64 starts is exact: no start is taken as negative.
        let got = i128::from(t[e.to]) - i128::from(t[e.from]);
        if got < i128::from(needed) {
            bad.push(Violation::Dependency {
                from: odg.nodes()[e.from].name.clone(),
                to: odg.nodes()[e.to].name.clone(),
                needed,
                got,
            });
        }
    }
    let p = schedule.period;
    let classes: BTreeSet<u64> = t.iter().map(|s| s % p).collect();
    for class in classes {
        let in_class = (0..n).filter(|&v| t[v] % p == class);
        // Sums of u32 demands in u64: exact, as fewer than 2^32 nodes cannot overflow them.
        let (mut units, mut fields) = (0u64, 0u64);
        let (mut match_times, mut action_times) = (BTreeSet::new(), BTreeSet::new());
        for v in in_class {
            match odg.nodes()[v].op {
                Op::Match { key_bits, .. } => {
                    units += u64::from(arch.match_units(key_bits));
                    match_times.insert(t[v]);
                }
                Op::Action { fields: f } => {
                    fields += u64::from(f);
                    action_times.insert(t[v]);
                }
            }
        }
        if units > u64::from(arch.match_capacity) {
            bad.push(Violation::MatchCapacity {
                class,
                used: units,
                capacity: arch.match_capacity,
            });
        }
        if fields > u64::from(arch.action_capacity) {
            bad.push(Violation::ActionCapacity {
                class,
                used: fields,
                capacity: arch.action_capacity,
            });
        }
        if match_times.len() as u32 > arch.ipc {
            bad.push(Violation::MatchIpc {
                class,
                packets: match_times.len() as u32,
                ipc: arch.ipc,
            });
        }
        if action_times.len() as u32 > arch.ipc {
            bad.push(Violation::ActionIpc {
                class,
                packets: action_times.len() as u32,
                ipc: arch.ipc,
            });
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}

/// Checks the schedules of a switch's processors, processor i taking the packets that arrive
/// at cycles ≡ i mod P (one schedule each, as many as the period): each one by [`validate`]
/// (its violations as it names them), then the memory crossbar. Processor i asks for match
/// v's table at the cycles ≡ i + start(v) mod P, so two processors contend for it when those
/// agree. One schedule given to every processor never contends (Observation 1); the
/// simulator ([`simulate_drmt_with`](super::simulate_drmt_with)) shows the same by running.
pub fn validate_processors(
    odg: &Odg,
    arch: &Arch,
    schedules: &[Schedule],
) -> Result<(), Vec<Violation>> {
    let p = schedules.first().map_or(0, |s| s.period);
    if p == 0 || schedules.len() as u64 != p || schedules.iter().any(|s| s.period != p) {
        return Err(vec![Violation::Shape(format!(
            "processors fed round-robin at line rate: as many schedules as their period, one \
             period for all (this: {} schedules, periods {:?})",
            schedules.len(),
            schedules.iter().map(|s| s.period).collect::<BTreeSet<_>>()
        ))]);
    }
    let mut bad: Vec<Violation> = schedules
        .iter()
        .filter_map(|s| validate(odg, arch, s).err())
        .flatten()
        .collect();
    if !bad.is_empty() {
        return Err(bad);
    }
    for (v, node) in odg.nodes().iter().enumerate() {
        if !matches!(node.op, Op::Match { .. }) {
            continue;
        }
        let mut seen: Vec<Option<u64>> = vec![None; p as usize];
        for (i, s) in schedules.iter().enumerate() {
            let class = (i as u64 + s.start[v]) % p;
            match seen[class as usize] {
                Some(first) => bad.push(Violation::MemoryContention {
                    table: node.name.clone(),
                    first,
                    second: i as u64,
                    class,
                }),
                None => seen[class as usize] = Some(i as u64),
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::super::odg::{Edge, Node};
    use super::*;

    fn m(name: &str) -> Node {
        Node {
            name: name.into(),
            op: Op::Match {
                key_bits: 32,
                entries: 1024,
            },
        }
    }

    fn a(name: &str) -> Node {
        Node {
            name: name.into(),
            op: Op::Action { fields: 1 },
        }
    }

    use super::super::examples::figure_5;

    #[test]
    fn figure_5_rejects_the_naive_schedule_and_accepts_the_one_with_a_no_op() {
        let (odg, arch) = figure_5();
        // (a) M0, M1 at 0; M2, M3 at 2; A1, A2 at 4; A3 at 5.
        let naive = Schedule {
            period: 2,
            start: vec![0, 0, 2, 2, 4, 4, 5],
        };
        let bad = validate(&odg, &arch, &naive).unwrap_err();
        // Class 0 holds four matches against M = 2, started at two times against IPC 1;
        // the dependencies hold and the actions fit.
        assert_eq!(
            bad,
            vec![
                Violation::MatchCapacity {
                    class: 0,
                    used: 4,
                    capacity: 2
                },
                Violation::MatchIpc {
                    class: 0,
                    packets: 2,
                    ipc: 1
                },
            ]
        );
        // (b) the no-op at 2: M2, M3 at 3; A1, A2 at 5; A3 at 6.
        let fixed = Schedule {
            period: 2,
            start: vec![0, 0, 3, 3, 5, 5, 6],
        };
        assert_eq!(validate(&odg, &arch, &fixed), Ok(()));
        assert_eq!(fixed.latency(&odg, &arch), 7);
    }

    #[test]
    fn each_kind_of_violation_is_named() {
        let (odg, arch) = figure_5();
        let ok = Schedule {
            period: 2,
            start: vec![0, 0, 3, 3, 5, 5, 6],
        };
        let with = |f: &dyn Fn(&mut Schedule)| {
            let mut s = ok.clone();
            f(&mut s);
            validate(&odg, &arch, &s).unwrap_err()
        };
        // A dependency: A3 starts with A1 and A2.
        let bad = with(&|s| s.start[6] = 5);
        assert!(
            bad.iter().any(|v| matches!(
                v,
                Violation::Dependency { to, needed: 1, got: 0, .. } if to == "A3"
            )),
            "{bad:?}"
        );
        // Action capacity: a wider action.
        let mut wide = odg.nodes().to_vec();
        wide[4].op = Op::Action { fields: 3 };
        let wide = Odg::new(wide, odg.edges().to_vec()).unwrap();
        let bad = validate(&wide, &arch, &ok).unwrap_err();
        assert_eq!(
            bad,
            vec![Violation::ActionCapacity {
                class: 1,
                used: 4,
                capacity: 2
            }]
        );
        // Action IPC: A2 a period later than A1, in the same class.
        let bad = with(&|s| {
            s.start[5] = 7;
            s.start[6] = 8;
        });
        assert!(
            bad.contains(&Violation::ActionIpc {
                class: 1,
                packets: 2,
                ipc: 1
            }),
            "{bad:?}"
        );
        // Match capacity through key width: an 81-bit key takes two units of 80.
        let mut wide_key = odg.nodes().to_vec();
        wide_key[0].op = Op::Match {
            key_bits: 81,
            entries: 1,
        };
        let wide_key = Odg::new(wide_key, odg.edges().to_vec()).unwrap();
        assert_eq!(
            validate(&wide_key, &arch, &ok).unwrap_err(),
            vec![Violation::MatchCapacity {
                class: 0,
                used: 3,
                capacity: 2
            }]
        );
        // A schedule of the wrong shape.
        assert!(matches!(
            validate(
                &odg,
                &arch,
                &Schedule {
                    period: 0,
                    start: ok.start.clone()
                }
            )
            .unwrap_err()[..],
            [Violation::Shape(_)]
        ));
        // IPC 2 takes the naive schedule's two match times, not its four matches.
        let ipc2 = Arch { ipc: 2, ..arch };
        let naive = Schedule {
            period: 2,
            start: vec![0, 0, 2, 2, 4, 4, 5],
        };
        let bad = validate(&odg, &ipc2, &naive).unwrap_err();
        assert!(
            bad.iter().all(|v| !matches!(v, Violation::MatchIpc { .. })),
            "{bad:?}"
        );
        assert!(bad
            .iter()
            .any(|v| matches!(v, Violation::MatchCapacity { .. })));
    }

    #[test]
    fn a_dependency_is_checked_on_starts_of_any_size() {
        // M -> A: the action waits ΔM = 22. A match at u64::MAX read as an i64 would be -1,
        // and the action at 30 would seem 31 cycles after it.
        let odg = Odg::new(vec![m("M"), a("A")], vec![Edge::result(0, 1)]).unwrap();
        let s = Schedule {
            period: 1,
            start: vec![u64::MAX, 30],
        };
        assert_eq!(
            validate(&odg, &Arch::DRMT, &s),
            Err(vec![Violation::Dependency {
                from: "M".into(),
                to: "A".into(),
                needed: 22,
                got: 30 - i128::from(u64::MAX),
            }])
        );
        assert_eq!(s.latency(&odg, &Arch::DRMT), u64::MAX, "saturates");
        // The far end the other way round is a long wait, not a violation.
        let far = Schedule {
            period: 1,
            start: vec![0, u64::MAX],
        };
        assert_eq!(validate(&odg, &Arch::DRMT, &far), Ok(()));
        assert_eq!(far.latency(&odg, &Arch::DRMT), u64::MAX);
        // A schedule short of starts has the latency of those it has.
        let short = Schedule {
            period: 1,
            start: vec![5],
        };
        assert_eq!(short.latency(&odg, &Arch::DRMT), 5 + 22);
    }

    #[test]
    fn an_ordering_edge_lets_its_dependent_start_in_the_same_cycle_and_no_earlier() {
        // A match that must read a field before an action overwrites it (reverse-match), and
        // the same pair with the action on the match's result.
        let order = Odg::new(vec![m("M"), a("A")], vec![Edge::order(0, 1)]).unwrap();
        let result = Odg::new(vec![m("M"), a("A")], vec![Edge::result(0, 1)]).unwrap();
        let at = |t: u64| Schedule {
            period: 1,
            start: vec![5, t],
        };
        assert_eq!(validate(&order, &Arch::DRMT, &at(5)), Ok(()));
        assert_eq!(
            validate(&order, &Arch::DRMT, &at(4)),
            Err(vec![Violation::Dependency {
                from: "M".into(),
                to: "A".into(),
                needed: 0,
                got: -1,
            }])
        );
        assert!(validate(&result, &Arch::DRMT, &at(5 + 21)).is_err());
        assert_eq!(validate(&result, &Arch::DRMT, &at(5 + 22)), Ok(()));
        // The list scheduler and the bound use the ordering's latency, not ΔM.
        let s = crate::pipeline::list_schedule(&order, &Arch::DRMT, 1)
            .unwrap()
            .unwrap();
        assert_eq!(s.start, vec![0, 0]);
        assert_eq!(
            crate::pipeline::lower_bound(&order, &Arch::DRMT).latency,
            22
        );
        assert_eq!(
            crate::pipeline::lower_bound(&result, &Arch::DRMT).latency,
            22 + 2
        );
    }

    #[test]
    fn bad_graphs_are_refused() {
        let e = |from, to| Edge::result(from, to);
        assert!(matches!(
            Odg::new(vec![m("x"), m("x")], vec![]),
            Err(super::super::OdgError::DuplicateName(_))
        ));
        assert!(matches!(
            Odg::new(vec![m("x"), a("y")], vec![e(0, 1), e(1, 0)]),
            Err(super::super::OdgError::Cycle(_))
        ));
        assert!(matches!(
            Odg::new(vec![m("x")], vec![e(0, 3)]),
            Err(super::super::OdgError::NoSuchNode(3))
        ));
        let empty = Node {
            name: "e".into(),
            op: Op::Action { fields: 0 },
        };
        assert!(matches!(
            Odg::new(vec![empty], vec![]),
            Err(super::super::OdgError::Empty(_))
        ));
        let (odg, _) = figure_5();
        let order = odg.topological_order();
        for e in odg.edges() {
            let pos = |v| order.iter().position(|&x| x == v).unwrap();
            assert!(pos(e.from) < pos(e.to));
        }
    }

    #[test]
    fn processors_with_different_schedules_contend_for_a_table_and_one_shared_never_does() {
        let (odg, arch) = figure_5();
        let good = Schedule {
            period: 2,
            start: vec![0, 0, 3, 3, 5, 5, 6],
        };
        assert_eq!(
            validate_processors(&odg, &arch, &[good.clone(), good.clone()]),
            Ok(())
        );
        // Processor 1 one cycle late: its requests land on processor 0's cycles.
        let late = Schedule {
            period: 2,
            start: good.start.iter().map(|t| t + 1).collect(),
        };
        assert_eq!(validate(&odg, &arch, &late), Ok(()), "valid on its own");
        let bad = validate_processors(&odg, &arch, &[good.clone(), late]).unwrap_err();
        assert_eq!(bad.len(), 4, "each of the four matches' tables: {bad:?}");
        assert_eq!(
            bad[0],
            Violation::MemoryContention {
                table: "M0".into(),
                first: 0,
                second: 1,
                class: 0,
            }
        );
        assert!(bad[0].to_string().contains("processors 0 and 1"));
        // Two schedules for a period of 2, or one of them invalid: named as such.
        assert!(matches!(
            validate_processors(&odg, &arch, std::slice::from_ref(&good)).unwrap_err()[0],
            Violation::Shape(_)
        ));
        let naive = Schedule {
            period: 2,
            start: vec![0, 0, 2, 2, 4, 4, 5],
        };
        assert!(validate_processors(&odg, &arch, &[good, naive])
            .unwrap_err()
            .iter()
            .all(|v| matches!(
                v,
                Violation::MatchCapacity { .. }
                    | Violation::MatchIpc { .. }
                    | Violation::ActionCapacity { .. }
                    | Violation::ActionIpc { .. }
            )));
    }
}
