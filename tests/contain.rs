//! Callbacks the engine runs on its own threads (sinks, clocks, flow classifiers) are
//! contained as program closures are: a panic in one is counted and reported, its packets
//! are dropped with a reason, and the engine neither hangs nor loses a PPE thread. Frames
//! to ports the sink does not have are dropped as `no_such_port`. (issue 13)

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pfemu::pfe::FlowClassifier;
use pfemu::prelude::*;
use pfemu::timer::Clock;

use common::udp_frame;

/// Forwards each packet to the port its UDP source port's low byte names.
fn forward_by_flow() -> Program {
    let mut p = Program::builder("by-flow");
    let a = p.label("a");
    p.instr(a, |t| Ok(Done(Verdict::Forward(u16::from(t.head(0)?[35])))));
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

/// Runs `f` on its own thread and waits for it until a deadline; an engine that hangs fails
/// the test, naming `what`.
fn within<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|e| panic!("{what} did not finish within 120 s ({e}): it hangs"))
}

/// Delivers port 0, panics on port 1.
struct PanicsOnPort1 {
    delivered: AtomicU64,
}

impl Sink for PanicsOnPort1 {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        if port == 1 {
            panic!("port 1 is down");
        }
        self.delivered
            .fetch_add(frames.len() as u64, Ordering::Relaxed);
    }
}

/// Runs `program` on 2 PPE threads into a [`PanicsOnPort1`] sink, `reorder` on or off:
/// 1000 packets of two flows (ports 0 and 1), drained, then `more` on the running engine.
/// Returns the frames the sink delivered and the engine's final counters.
fn through_a_sink_panicking_on_port_1(
    program: Program,
    reorder: bool,
    more: impl FnOnce(&Pfe) + Send + 'static,
) -> (u64, Stats) {
    let sink = Arc::new(PanicsOnPort1 {
        delivered: AtomicU64::new(0),
    });
    let s = sink.clone();
    let stats = within("an engine whose sink panics", move || {
        let mut pfe = Pfe::builder()
            .program(program)
            .ppe_threads(2)
            .reorder(reorder)
            .sink(s)
            .build()
            .unwrap();
        pfe.start().unwrap();
        inject_two_flows(&pfe, 1000);
        pfe.drain();
        more(&pfe);
        pfe.shutdown()
    });
    (sink.delivered.load(Ordering::Relaxed), stats)
}

#[test]
fn a_panicking_sink_drops_its_packets_with_a_reason_and_never_hangs() {
    for reorder in [true, false] {
        let (delivered, stats) =
            through_a_sink_panicking_on_port_1(forward_by_flow(), reorder, |pfe| {
                // The PPE threads are alive: more packets go through.
                for i in 0..100u32 {
                    pfe.inject(Packet::new(0, udp_frame(0, i, 64))).unwrap();
                }
            });
        assert_eq!(delivered, 600, "reorder {reorder}");
        assert_eq!(stats.packets_out, 600, "{stats:?}");
        assert_eq!(stats.drops("sink_panic"), 500, "{stats:?}");
        assert_eq!(stats.frames_tx, 600, "{stats:?}");
        assert!(stats.is_conserved(), "{stats:?}");
        let (n, msg) = &stats.callback_panics["sink"];
        assert!(*n >= 1, "{stats:?}");
        assert!(msg.contains("port 1 is down"), "{msg}");
    }
}

/// Forwards each packet as [`forward_by_flow`] does, after creating a copy of its head for
/// the same port.
fn forward_by_flow_with_a_copy() -> Program {
    let mut p = Program::builder("by-flow-with-a-copy");
    let a = p.label("a");
    p.instr(a, |t| {
        let port = u16::from(t.head(0)?[35]);
        t.emit(Dest::Port(port), t.head_offset(), t.head_len())?;
        Ok(Done(Verdict::Forward(port)))
    });
    p.entry(Entry::Packet, a);
    p.build().unwrap()
}

/// The frames a panicking sink loses are counted as dropped ingress packets only where
/// they were ingress packets: the copies the packets created are not packets in.
#[test]
fn a_panicking_sink_drops_the_packets_it_lost_not_the_copies_they_created() {
    for reorder in [true, false] {
        let (delivered, stats) =
            through_a_sink_panicking_on_port_1(forward_by_flow_with_a_copy(), reorder, |_| {});
        // Port 0: 500 packets and their 500 copies.
        assert_eq!(delivered, 1000, "reorder {reorder}");
        assert_eq!(stats.packets_out, 500, "reorder {reorder}: {stats:?}");
        assert_eq!(
            stats.drops("sink_panic"),
            500,
            "reorder {reorder}: {stats:?}"
        );
        assert_eq!(stats.created, 1000, "reorder {reorder}: {stats:?}");
        assert!(stats.is_conserved(), "reorder {reorder}: {stats:?}");
    }
}

/// Panics on every reading.
struct BrokenClock;

impl Clock for BrokenClock {
    fn now_ns(&self) -> u64 {
        panic!("the clock is broken")
    }
}

#[test]
fn a_panicking_clock_is_counted_and_the_engine_goes_on() {
    let sink = Arc::new(CountingSink::new(2));
    let s = sink.clone();
    let stats = within("an engine whose clock panics", move || {
        let mut pfe = Pfe::builder()
            .program(forward_by_flow())
            .ppe_threads(2)
            .latency(true)
            .clock(Arc::new(BrokenClock))
            .sink(s)
            .build()
            .unwrap();
        pfe.start().unwrap();
        for i in 0..500u32 {
            pfe.inject(Packet::new(0, udp_frame(1, i, 64))).unwrap();
        }
        pfe.drain();
        pfe.shutdown()
    });
    assert_eq!(sink.packets(1), 500);
    assert!(stats.is_conserved(), "{stats:?}");
    let (n, msg) = &stats.callback_panics["clock"];
    assert!(*n >= 1, "{stats:?}");
    assert!(msg.contains("the clock is broken"), "{msg}");
}

#[test]
fn a_panicking_classifier_drops_the_packet_with_a_reason() {
    let sink = Arc::new(CountingSink::new(2));
    let s = sink.clone();
    let stats = within("an engine whose classifier panics", move || {
        let mut pfe = Pfe::builder()
            .program(forward_by_flow())
            .ppe_threads(2)
            .classifier(FlowClassifier::Custom(Arc::new(|_port, frame: &[u8]| {
                if frame[35] == 1 {
                    panic!("cannot classify flow 1");
                }
                u64::from(frame[35])
            })))
            .sink(s)
            .build()
            .unwrap();
        pfe.start().unwrap();
        inject_two_flows(&pfe, 1000);
        pfe.drain();
        pfe.shutdown()
    });
    assert_eq!(sink.packets(0), 500);
    assert_eq!(stats.drops("classifier_panic"), 500, "{stats:?}");
    assert!(stats.is_conserved(), "{stats:?}");
    let (n, msg) = &stats.callback_panics["classifier"];
    assert_eq!(*n, 500, "{stats:?}");
    assert!(msg.contains("cannot classify flow 1"), "{msg}");
}

/// A sink with ports `0..2` makes the engine's ports `0..2`: a packet forwarded to port 7
/// is dropped as `no_such_port` (it used to be counted on the sink's last port), and asking
/// for more ports than the sink has is refused.
#[test]
fn a_port_the_sink_does_not_have_is_a_counted_drop() {
    let sink = Arc::new(CountingSink::new(2));
    let mut pfe = Pfe::builder()
        .program(forward_by_flow())
        .ppe_threads(1)
        .sink(sink.clone())
        .build()
        .unwrap();
    assert_eq!(pfe.config().ports, 2);
    pfe.start().unwrap();
    for i in 0..10u32 {
        pfe.inject(Packet::new(0, udp_frame(7, i, 64))).unwrap();
        pfe.inject(Packet::new(0, udp_frame(1, i, 64))).unwrap();
    }
    let stats = pfe.shutdown();
    assert_eq!(stats.drops("no_such_port"), 10, "{stats:?}");
    assert_eq!(sink.packets(1), 10);
    assert_eq!(sink.total_packets(), 10);
    assert!(stats.is_conserved(), "{stats:?}");

    let e = Pfe::builder()
        .program(forward_by_flow())
        .ports(8)
        .sink(Arc::new(CountingSink::new(2)))
        .build()
        .unwrap_err();
    assert_eq!(e.setting, "ports", "{e}");
    assert!(e.reason.contains("sink"), "{e}");
}

/// The capacity's accepted range is stated as it is checked (`1 << 20`, not `1 << 24`).
#[test]
fn the_capacity_error_states_the_limit_it_checks() {
    let builder = || Pfe::builder().program(forward_by_flow());
    let e = builder().capacity((1 << 20) + 1).build().unwrap_err();
    assert_eq!(e.setting, "capacity");
    assert!(e.reason.contains(&(1usize << 20).to_string()), "{e}");
    assert!(!e.reason.contains(&(1usize << 24).to_string()), "{e}");
    assert!(builder().capacity(1 << 20).build().is_ok());
}

/// Injects `n` UDP frames alternating between flows 0 and 1.
fn inject_two_flows(pfe: &Pfe, n: u32) {
    for i in 0..n {
        pfe.inject(Packet::new(0, udp_frame((i % 2) as u16, i, 64)))
            .unwrap();
    }
}
