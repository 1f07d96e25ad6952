//! The per-stage profile (`PfeBuilder::profile`): with it on, an engine reports time in
//! every stage that did work, and the packets it divides by are those processed; off, it
//! reports none. Structure and counts only: nothing here asserts a speed.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{ether_frame, udp_frame};
use pfemu::pfe::{ChannelTraceSink, StageProfile, TraceConfig};
use pfemu::prelude::*;
use pfemu::timer::{ManualClock, TimerSpec};

/// 90% plain IPv4 over 64 flows, the rest non-IP (dropped by the filter).
fn frames(n: u32) -> Vec<Vec<u8>> {
    (0..n)
        .map(|i| {
            if i % 10 == 9 {
                ether_frame(0x86dd, 64)
            } else {
                udp_frame((i % 64) as u16, i, 64)
            }
        })
        .collect()
}

/// The filter on `frames` with 2 PPE threads; the final stats, the frames the sink saw and
/// the engine's wall-clock time from its start to its shutdown.
fn run_filter(frames: &[Vec<u8>], profile: bool, reorder: bool) -> (Stats, u64, Duration) {
    let (builder, _filter) = common::filter_engine();
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = builder
        .ppe_threads(2)
        .reorder(reorder)
        .profile(profile)
        .sink(sink.clone())
        .build()
        .unwrap();
    let started = Instant::now();
    pfe.start().unwrap();
    // Several calls, so that injectors and PPE threads meet more than once.
    for chunk in frames.chunks(5_000) {
        pfe.inject_burst(chunk.iter().map(|f| (0, &f[..]))).unwrap();
    }
    pfe.drain();
    let stats = pfe.shutdown();
    (stats, sink.total_packets(), started.elapsed())
}

/// Every stage's nanoseconds add up to the busy time, and the costs are per processed packet.
fn check_sums(p: &StageProfile) {
    let costs = p.costs();
    assert_eq!(costs.map(|c| c.stage), StageProfile::STAGES);
    assert_eq!(costs.iter().map(|c| c.ns).sum::<u64>(), p.busy_ns());
    for c in &costs {
        assert_eq!(c.ns_per_packet, c.ns as f64 / p.packets as f64, "{c:?}");
    }
    let shares: f64 = costs.iter().map(|c| c.share).sum();
    assert!((shares - 1.0).abs() < 1e-9, "shares sum to {shares}");
}

#[test]
fn a_profiled_engine_times_every_stage_that_worked_and_counts_its_packets() {
    let frames = frames(40_000);
    for reorder in [true, false] {
        let (stats, delivered, lifetime) = run_filter(&frames, true, reorder);
        assert!(stats.is_conserved());
        assert_eq!(stats.packets_out, 36_000);
        assert_eq!(delivered, 36_000);
        let p = stats
            .profile
            .expect("a profiled engine reports its profile");
        assert_eq!(p.packets, stats.processed(), "reorder {reorder}");
        assert_eq!(p.packets, 40_000);
        for (stage, ns) in [
            ("ingress", p.ingress_ns),
            ("dispatch", p.dispatch_ns),
            ("program", p.program_ns),
            ("reorder", p.reorder_ns),
            ("sink", p.sink_ns),
            ("egress", p.egress_ns),
        ] {
            assert!(ns > 0, "reorder {reorder}: no time in {stage}: {p:?}");
        }
        assert_eq!(p.timers_ns, 0, "no timers, no time in them: {p:?}");
        check_sums(&p);
        check_core_time(&p, lifetime);
    }
}

/// The kernel's count of the 2 PPE threads' time (where it gives one: Linux): they ran,
/// and each one's time on a core plus its time runnable fits in the engine's `lifetime`
/// (from before its start to after its shutdown). A count added whole (since the thread
/// was created, or since boot) instead of since the thread started its loop, or added per
/// batch, would not fit. (Not against the stages' own time: a thread preempted between
/// two stages' clock reads is runnable in time no stage counts, so on a loaded machine the
/// kernel's count exceeds the stages' by more than any fixed slack.)
fn check_core_time(p: &StageProfile, lifetime: Duration) {
    if !std::path::Path::new("/proc/thread-self/schedstat").exists() {
        assert_eq!((p.on_core_ns, p.runnable_ns), (0, 0), "{p:?}");
        return;
    }
    assert!(p.on_core_ns > 0, "the threads ran: {p:?}");
    let bound = 2 * u64::try_from(lifetime.as_nanos()).expect("a test's lifetime");
    assert!(
        p.on_core_ns + p.runnable_ns <= bound,
        "on a core {} + runnable {} > 2 threads x the engine's {lifetime:?}: {p:?}",
        p.on_core_ns,
        p.runnable_ns
    );
}

#[test]
fn an_engine_not_profiled_reports_no_profile() {
    let (stats, delivered, _) = run_filter(&frames(5_000), false, true);
    assert_eq!(delivered, 4_500);
    assert_eq!(stats.profile, None);
    // Off is the default.
    let mut p = Program::builder("forward");
    let a = p.label("a");
    p.instr(a, |_| Ok(Done(Verdict::Forward(0))));
    p.entry(Entry::Packet, a);
    let pfe = Pfe::builder().program(p.build().unwrap()).build().unwrap();
    assert!(!pfe.config().profile);
    assert_eq!(pfe.stats().profile, None);
}

/// Timer threads are a stage of their own, and a traced engine (which runs the other copy
/// of the program loop) is profiled as well.
#[test]
fn timers_and_traced_packets_are_profiled_too() {
    let mut p = Program::builder("timers");
    let [fwd, tick] = p.labels(["forward", "tick"]);
    p.instr(fwd, |_| Ok(Done(Verdict::Forward(1))));
    p.instr(tick, |t| {
        t.emit(Dest::Port(2), 0, 64)?;
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, fwd);
    p.entry(Entry::Timer(0), tick);
    let (trace_sink, _records) = ChannelTraceSink::new(100);
    let mut trace = TraceConfig::new(Arc::new(trace_sink));
    trace.limit = 100;
    // The engine's clock moves by hand, a period per step.
    let clock = Arc::new(ManualClock::new());
    let period = 200_000;
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(2)
        .mem_config(MemConfig {
            dram_bytes: 0,
            ..MemConfig::default()
        })
        .timers(TimerSpec::staggered(0, 2, period, 0).unwrap())
        .clock(clock.clone())
        .trace(trace)
        .profile(true)
        .build()
        .unwrap();
    let started = Instant::now();
    pfe.start().unwrap();
    let frames = frames(2_000);
    for step in 1..=5 {
        clock.set(step * period);
        pfe.settle_timers();
        pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
            .unwrap();
        pfe.drain();
    }
    let stats = pfe.shutdown();
    let lifetime = started.elapsed();
    // At least one launch per step (how many a step catches up is `tests/timers.rs`'s
    // business, not the profile's).
    assert!(stats.timer_runs >= 5, "{} timer runs", stats.timer_runs);
    let p = stats.profile.expect("profiled");
    assert_eq!(p.packets, stats.processed());
    assert!(p.timers_ns > 0, "{p:?}");
    assert!(
        p.program_ns > 0 && p.sink_ns > 0 && p.ingress_ns > 0,
        "{p:?}"
    );
    check_sums(&p);
    check_core_time(&p, lifetime);
}
