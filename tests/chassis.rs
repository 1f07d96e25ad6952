//! A chassis of PFEs joined by links: frames cross links both ways, nothing is lost, and
//! bad link configurations are refused.

mod common;

use std::sync::Arc;

use parking_lot::Mutex;
use pfemu::fabric::{Architecture, Iterations, OutputArbiter, Scheduler};
use pfemu::pfe::{Chassis, ChassisFabric, FabricStats, Frames};
use pfemu::prelude::*;

use common::{flow_seq, small_mem, udp_frame};

/// Forwards a packet arriving on `from` to `to`, and anything else to `other`.
fn relay(from: u16, to: u16, other: u16) -> Program {
    let mut p = Program::builder("relay");
    let a = p.label("relay");
    p.instr(a, move |t| {
        Ok(Done(Verdict::Forward(if t.port() == from {
            to
        } else {
            other
        })))
    });
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

/// A frame that left the chassis: PFE index, port, bytes.
type Left = (usize, u16, Vec<u8>);

fn engine(program: Program) -> pfemu::pfe::PfeBuilder {
    Pfe::builder()
        .program(program)
        .ppe_threads(16)
        .mem_config(small_mem())
}

#[test]
fn frames_cross_links_both_ways_and_none_is_lost() {
    cross_both_ways(None);
}

#[test]
fn frames_cross_a_fabric_of_each_architecture_and_none_is_lost() {
    for architecture in [
        Architecture::Cprr(OutputArbiter::Simple),
        Architecture::OqXbar,
        Architecture::Voq(Scheduler::Islip, Iterations::One),
        Architecture::Voq(Scheduler::Edrrm, Iterations::Log2),
    ] {
        let fabric = ChassisFabric {
            architecture,
            cell_bytes: 16,
            ..ChassisFabric::default()
        };
        let s = cross_both_ways(Some(fabric)).expect("fabric counters");
        // Up and down: 2 n frames of 64 bytes, 4 cells each.
        assert_eq!(
            (s.frames_in, s.frames_out, s.dropped()),
            (10_000, 10_000, 0)
        );
        assert_eq!(s.cells_in, 40_000, "{architecture}");
        assert!(
            s.accounted() && s.frames_in_flight == 0,
            "{architecture}: {s:?}"
        );
        // An input sends one cell a cycle: a frame takes at least its 4 cycles.
        assert!(
            s.mean_frame_cycles.is_some_and(|m| m >= 4.0)
                && s.max_frame_cycles.is_some_and(|m| m >= 4),
            "{architecture}: {s:?}"
        );
    }
}

/// A fabric no frame crossed has no mean or largest time for its frames and no first or
/// last frame cycle (`None`, not 0 cycles or cycle 0): the
/// leaf sends everything out of a port of its own, never up its link.
#[test]
fn a_fabric_that_delivered_nothing_has_no_mean_frame_time() {
    let out: Arc<Mutex<Vec<Left>>> = Arc::default();
    let mut c = Chassis::builder();
    let leaf = c.pfe("leaf", engine(relay(0, 1, 1)));
    let top = c.pfe("top", engine(relay(1, 1, 1)));
    c.link((leaf, 60), (top, 1));
    c.fabric(ChassisFabric {
        cell_bytes: 16,
        ..ChassisFabric::default()
    });
    {
        let out = out.clone();
        c.sink(Arc::new(
            move |pfe: usize, port: u16, frames: Frames<'_>| {
                out.lock()
                    .extend(frames.iter().map(|f| (pfe, port, f.to_vec())));
            },
        ));
    }
    let chassis = c.start().unwrap();
    for seq in 0..100 {
        chassis
            .pfe(leaf)
            .inject_frame(0, &udp_frame(seq as u16, seq, 64))
            .unwrap();
    }
    chassis.drain();
    let s = chassis.fabric_stats().expect("fabric counters");
    chassis.shutdown();
    assert_eq!(out.lock().len(), 100, "every frame left the leaf");
    assert_eq!((s.frames_in, s.frames_out, s.dropped()), (0, 0, 0));
    assert_eq!(s.mean_frame_cycles, None, "{s:?}");
    // Nor a largest time, a first or last frame cycle or a span: not 0, which is a cycle.
    assert_eq!(
        (s.max_frame_cycles, s.first_frame_cycle, s.last_frame_cycle),
        (None, None, None),
        "{s:?}"
    );
    assert_eq!(s.span_cycles(), None);
}

/// Sends 5000 frames up a leaf to a top that reflects them, over an ideal link or
/// `fabric`; checks every frame came back; returns the fabric's counters.
fn cross_both_ways(fabric: Option<ChassisFabric>) -> Option<FabricStats> {
    // Leaf A: from port 0 up to the top over port 60; what comes down on 60 goes out on 1.
    // Top: what comes up on 1 goes back down on 1 (a reflector).
    let out: Arc<Mutex<Vec<Left>>> = Arc::default();
    let mut c = Chassis::builder();
    let leaf = c.pfe("leaf", engine(relay(0, 60, 1)));
    let top = c.pfe("top", engine(relay(1, 1, 1)));
    c.link((leaf, 60), (top, 1));
    if let Some(f) = fabric {
        c.fabric(f);
    }
    {
        let out = out.clone();
        c.sink(Arc::new(
            move |pfe: usize, port: u16, frames: Frames<'_>| {
                let mut out = out.lock();
                for f in frames.iter() {
                    out.push((pfe, port, f.to_vec()));
                }
            },
        ));
    }
    let chassis = c.start().unwrap();
    let n = 5000u32;
    for seq in 0..n {
        chassis
            .pfe(leaf)
            .inject_frame(0, &udp_frame((seq % 64) as u16, seq, 64))
            .unwrap();
    }
    chassis.drain();
    let fabric = chassis.fabric_stats();
    let stats = chassis.shutdown();
    let out = out.lock();
    assert_eq!(out.len(), n as usize);
    assert!(out.iter().all(|(pfe, port, _)| (*pfe, *port) == (leaf, 1)));
    let mut seqs: Vec<u32> = out.iter().map(|(_, _, f)| flow_seq(f).1).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..n).collect::<Vec<_>>());
    // The leaf saw every frame twice (up, then down), the top once.
    assert_eq!(stats[leaf].packets_in, 2 * n as u64);
    assert_eq!(stats[top].packets_in, n as u64);
    assert!(stats.iter().all(|s| s.is_conserved()));
    fabric
}

#[test]
fn bad_links_are_refused_with_the_setting_named() {
    let mut c = Chassis::builder();
    let a = c.pfe("a", engine(relay(0, 1, 1)));
    c.link((a, 1), (7, 1));
    assert_eq!(c.start().unwrap_err().setting(), Some("link"));

    let mut c = Chassis::builder();
    let a = c.pfe("a", engine(relay(0, 1, 1)));
    let b = c.pfe("b", engine(relay(0, 1, 1)));
    c.link((a, 1), (b, 1)).link((a, 1), (b, 2));
    let err = c.start().unwrap_err();
    assert_eq!(err.setting(), Some("link"));
    assert!(err.to_string().contains("linked twice"), "{err}");

    let mut c = Chassis::builder();
    let a = c.pfe("a", engine(relay(0, 1, 1)));
    let b = c.pfe("b", engine(relay(0, 1, 1)));
    c.link((a, 1), (b, 4000));
    assert!(c.start().unwrap_err().to_string().contains("port 4000"));

    assert_eq!(
        Chassis::builder().start().unwrap_err().setting(),
        Some("chassis")
    );

    let mut c = Chassis::builder();
    let a = c.pfe("a", engine(relay(0, 1, 1)));
    let b = c.pfe("b", engine(relay(0, 1, 1)));
    c.link((a, 1), (b, 1)).fabric(ChassisFabric {
        cell_bytes: 0,
        ..ChassisFabric::default()
    });
    let err = c.start().unwrap_err();
    assert_eq!(err.setting(), Some("fabric"));
    assert!(err.to_string().contains("cell_bytes"), "{err}");
}
