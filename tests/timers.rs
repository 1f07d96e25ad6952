//! Timer threads through the engine, driven by a manual clock: launches per slice, created
//! packets, launches ahead of queued packets, overruns, faults, and configuration errors.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use pfemu::prelude::*;
use pfemu::program::Harness;
use pfemu::timer::{Launch, ManualClock, TimerSpec, MAX_TIMERS, MAX_TIMER_NS};

use common::{small_mem, udp_frame};

const MS: u64 = 1_000_000;

/// How long a test waits for something the engine must do before it fails: a deadline
/// for a hang, never a measure of speed (the waits normally end in microseconds).
const PATIENCE: Duration = Duration::from_secs(30);

/// Waits until `done()` holds, yielding in between; fails the test naming `what` if it
/// does not within [`PATIENCE`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "gave up after {PATIENCE:?} waiting until {what}"
        );
        std::thread::yield_now();
    }
}

/// Runs `f` on a thread of its own and returns its result, failing the test naming `what`
/// if it does not return within [`PATIENCE`] (a hang fails instead of hanging the run).
fn within_patience<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(PATIENCE) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not return within {PATIENCE:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} panicked"),
    }
}

/// One timer at entry 0, owning the whole work (slice 0 of 1).
fn one_timer(period_ns: u64, phase_ns: u64) -> TimerSpec {
    TimerSpec {
        entry: 0,
        period_ns,
        phase_ns,
        slice: 0,
        slices: 1,
    }
}

/// A program whose timer entry 0 counts each launch on the counter of its slice (at word
/// `2 * slice`) and emits a 64-byte packet to port 1 carrying its slice; packets are
/// forwarded to port 2.
fn counting_program() -> Program {
    let mut p = Program::builder("timer_count");
    let [fwd, tick] = p.labels(["forward", "tick"]);
    p.instr(fwd, |_| Ok(Done(Verdict::Forward(2))));
    p.instr(tick, |t| {
        let l = *t.timer().expect("a timer thread sees its launch");
        t.counter_inc(2 * l.slice as u64, 0)?;
        t.lm_mut()[0..4].copy_from_slice(&l.slice.to_be_bytes());
        t.emit(Dest::Port(1), 0, 64)?;
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, fwd);
    p.entry(Entry::Timer(0), tick);
    p.build().unwrap()
}

#[test]
fn staggered_timers_launch_once_per_period_each_with_its_slice() {
    let clock = Arc::new(ManualClock::new());
    let (sink, rx) = ChannelSink::new();
    let mut pfe = Pfe::builder()
        .program(counting_program())
        .ppe_threads(8)
        .mem_config(small_mem())
        .timers(TimerSpec::staggered(0, 4, MS, MS).unwrap())
        .clock(clock.clone())
        .sink(Arc::new(sink))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let mem = pfe.memory().clone();
    let count = |slice: u64| mem.counter_read(2 * slice).unwrap().0;

    // Nothing is due before the first phase (1 ms).
    clock.set(MS - 1);
    pfe.settle_timers();
    assert_eq!(pfe.stats().timer_launches, 0);

    // Timer k first fires at 1 ms + k * 250 us; step through two periods a quarter at a time.
    for step in 0..8u64 {
        clock.set(MS + step * MS / 4);
        pfe.settle_timers();
        for slice in 0..4 {
            let expected = if slice <= step % 4 {
                step / 4 + 1
            } else {
                step / 4
            };
            assert_eq!(count(slice), expected, "slice {slice} after step {step}");
        }
    }
    let stats = pfe.shutdown();
    assert_eq!(stats.timer_launches, 8);
    assert_eq!(stats.timer_runs, 8);
    assert_eq!(stats.timer_instructions, 8);
    assert_eq!((stats.timer_overruns, stats.timer_missed), (0, 0));
    assert_eq!(stats.created, 8);
    assert_eq!(stats.xtxns.get("counter_inc"), Some(&8));
    let slices: Vec<u32> = rx
        .try_iter()
        .map(|p| {
            assert_eq!(p.port, 1);
            u32::from_be_bytes(p.data[0..4].try_into().unwrap())
        })
        .collect();
    assert_eq!(slices, [0, 1, 2, 3, 0, 1, 2, 3]);
}

#[test]
fn a_late_launcher_skips_periods_instead_of_catching_up() {
    let clock = Arc::new(ManualClock::new());
    let mut pfe = Pfe::builder()
        .program(counting_program())
        .ppe_threads(2)
        .mem_config(small_mem())
        .timers([one_timer(MS, 0)])
        .clock(clock.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.settle_timers();
    clock.set(10 * MS + 1);
    pfe.settle_timers();
    let stats = pfe.shutdown();
    assert_eq!(
        stats.timer_launches, 2,
        "one at 0, one for the 10 ms period"
    );
    assert_eq!(stats.timer_missed, 9);
}

#[test]
fn a_timer_launch_runs_ahead_of_queued_packets() {
    let clock = Arc::new(ManualClock::new());
    let log: Arc<Mutex<Vec<String>>> = Arc::default();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (busy_tx, busy_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let busy_tx = Mutex::new(busy_tx);
    let mut p = Program::builder("ordered");
    let [pkt, tick] = p.labels(["packet", "tick"]);
    {
        let log = log.clone();
        p.instr(pkt, move |t| {
            let seq = common::flow_seq(t.head(0)?).1;
            if seq == 0 {
                // The first packet holds the only PPE thread until the test says go.
                busy_tx.lock().send(()).unwrap();
                go_rx
                    .lock()
                    .recv_timeout(PATIENCE)
                    .expect("the test lets packet 0 go on");
            }
            log.lock().push(format!("packet {seq}"));
            Ok(Done(Verdict::Forward(1)))
        });
    }
    {
        let log = log.clone();
        p.instr(tick, move |_| {
            log.lock().push("timer".into());
            Ok(Done(Verdict::Consume))
        });
    }
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(1)
        .batch_size(1)
        .mem_config(small_mem())
        .timers([one_timer(100 * MS, MS)])
        .clock(clock.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    for seq in 0..4 {
        pfe.inject_frame(0, &udp_frame(7, seq, 64)).unwrap();
    }
    // Packets 1..3 are queued behind packet 0, which holds the thread; now the timer
    // comes due.
    busy_rx
        .recv_timeout(PATIENCE)
        .expect("packet 0 holds the PPE thread");
    clock.set(MS);
    wait_until("the timer is launched", || pfe.stats().timer_launches > 0);
    go_tx.send(()).unwrap();
    pfe.settle_timers();
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert_eq!(
        *log.lock(),
        ["packet 0", "timer", "packet 1", "packet 2", "packet 3"]
    );
}

#[test]
fn a_busy_timer_is_not_launched_again_and_the_skip_is_counted() {
    let clock = Arc::new(ManualClock::new());
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_rx = Mutex::new(go_rx);
    let mut p = Program::builder("slow_timer");
    let [pkt, tick] = p.labels(["packet", "tick"]);
    p.instr(pkt, |_| Ok(Done(Verdict::Forward(1))));
    p.instr(tick, move |_| {
        go_rx
            .lock()
            .recv_timeout(PATIENCE)
            .expect("the test lets the timer thread finish");
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(4)
        .mem_config(small_mem())
        .timers([one_timer(MS, 0)])
        .clock(clock.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    wait_until("the timer is launched", || pfe.stats().timer_launches > 0);
    // The first thread is still running when the next three periods come due.
    for k in 1..=3 {
        clock.set(k * MS);
        wait_until(&format!("{k} overruns are counted"), || {
            pfe.stats().timer_overruns >= k
        });
    }
    go_tx.send(()).unwrap();
    wait_until("the first timer thread finishes", || {
        pfe.stats().timer_runs >= 1
    });
    clock.set(4 * MS);
    go_tx.send(()).unwrap();
    pfe.settle_timers();
    let stats = pfe.shutdown();
    assert_eq!(stats.timer_launches, 2);
    assert_eq!(stats.timer_runs, 2);
    assert_eq!(stats.timer_overruns, 3);
}

/// Runs a program whose packets go to port `packet_port` and whose timer 0 (every
/// millisecond) runs `tick`: six periods on a manual clock, then one packet; returns the
/// engine's final statistics and what the sink counted.
fn run_timer_program(
    name: &str,
    packet_port: u16,
    tick: impl Fn(&mut Thread<'_>) -> Result<Next, Fault> + Send + Sync + 'static,
) -> (Stats, Arc<CountingSink>) {
    let clock = Arc::new(ManualClock::new());
    let mut p = Program::builder(name);
    let [pkt, tick_l] = p.labels(["packet", "tick"]);
    p.instr(pkt, move |_| Ok(Done(Verdict::Forward(packet_port))));
    p.instr(tick_l, tick);
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick_l);
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(2)
        .mem_config(small_mem())
        .timers([one_timer(MS, 0)])
        .clock(clock.clone())
        .sink(sink.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    for k in 0..6 {
        clock.set(k * MS);
        pfe.settle_timers();
    }
    pfe.inject_frame(0, &udp_frame(1, 0, 64)).unwrap();
    pfe.drain();
    (pfe.shutdown(), sink)
}

#[test]
fn a_faulting_timer_thread_is_counted_and_the_timers_go_on() {
    let (stats, sink) = run_timer_program("faulty_timer", 1, |t| {
        let l = *t.timer().unwrap();
        // Every other launch emits a packet and then reads outside the shared memory.
        t.emit(Dest::Port(1), 0, 64)?;
        if l.scheduled_ns / MS % 2 == 1 {
            t.read_u64(1 << 40)?;
        }
        Ok(Done(Verdict::Consume))
    });
    assert_eq!(stats.timer_runs, 6);
    assert_eq!(stats.timer_faults, 3);
    assert_eq!(stats.faults_of(FaultKind::SharedMemory), 3);
    assert_eq!(stats.dropped, 0, "a timer fault drops no packet");
    // The faulting threads' packets were abandoned with them.
    assert_eq!(sink.packets(1), 3 + 1);
    assert!(stats.is_conserved());
}

/// A timer thread that keeps the packets it created ([`Thread::keep_created`]) and faults
/// later sends them all the same; those it created after the call are abandoned with it.
#[test]
fn a_faulting_timer_thread_sends_the_packets_it_kept() {
    let (stats, sink) = run_timer_program("keeping_timer", 3, |t| {
        let l = *t.timer().unwrap();
        // Every launch emits a packet to port 1 and keeps it, then one to port 2; every
        // other launch then reads outside the shared memory.
        t.emit(Dest::Port(1), 0, 64)?;
        t.keep_created();
        t.emit(Dest::Port(2), 0, 64)?;
        if l.scheduled_ns / MS % 2 == 1 {
            t.read_u64(1 << 40)?;
        }
        Ok(Done(Verdict::Consume))
    });
    assert_eq!((stats.timer_runs, stats.timer_faults), (6, 3));
    assert_eq!(sink.packets(1), 6, "every kept packet left");
    assert_eq!(
        sink.packets(2),
        3,
        "only the threads that did not fault sent theirs"
    );
    assert_eq!(sink.packets(3), 1);
    assert_eq!(stats.created, 6 + 3);
    assert_eq!(stats.frames_tx, 6 + 3 + 1);
    assert!(stats.is_conserved());
}

/// Shutdown stops every launch, including those the PPE threads make between batches.
/// Each timer thread moves the clock a period on, so after every run both timers are due
/// again; with one PPE thread and two timers there is always a launch queued while the
/// other runs, so a launch is in flight at every moment the PPE thread keeps launching.
/// Shutdown must still return.
#[test]
fn shutdown_returns_while_timer_threads_keep_the_timers_due() {
    let clock = Arc::new(ManualClock::new());
    let mut p = Program::builder("clock_mover");
    let [pkt, tick] = p.labels(["packet", "tick"]);
    p.instr(pkt, |_| Ok(Done(Verdict::Forward(1))));
    {
        let clock = clock.clone();
        p.instr(tick, move |_| {
            clock.advance(MS);
            Ok(Done(Verdict::Consume))
        });
    }
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick);
    let mut pfe = Pfe::builder()
        .program(p.build().unwrap())
        .ppe_threads(1)
        .mem_config(small_mem())
        .timers([one_timer(MS, 0), one_timer(MS, 0)])
        .clock(clock.clone())
        .build()
        .unwrap();
    pfe.start().unwrap();
    // The PPE thread is launching the timers itself by now (the clock moves only as they run).
    wait_until("the timers ran 100 times", || pfe.stats().timer_runs >= 100);
    let stats = within_patience("Pfe::shutdown", move || pfe.shutdown());
    assert_eq!(
        stats.timer_runs, stats.timer_launches,
        "every launch made ran"
    );
}

#[test]
fn build_refuses_a_timer_whose_entry_the_program_lacks() {
    let err = Pfe::builder()
        .program(counting_program())
        .mem_config(small_mem())
        .timers(TimerSpec::staggered(3, 2, MS, 0).unwrap())
        .build()
        .unwrap_err();
    assert_eq!(err.setting, "timers");
    assert!(err.to_string().contains("Entry::Timer(3)"), "{err}");

    let err = Pfe::builder()
        .program(counting_program())
        .mem_config(small_mem())
        .timers([TimerSpec {
            entry: 0,
            period_ns: MS,
            phase_ns: 0,
            slice: 2,
            slices: 2,
        }])
        .build()
        .unwrap_err();
    assert_eq!(err.setting, "timers");
}

#[test]
fn real_clock_timers_fire_and_shut_down_cleanly() {
    let mut pfe = Pfe::builder()
        .program(counting_program())
        .ppe_threads(4)
        .mem_config(small_mem())
        .timers(TimerSpec::staggered(0, 4, 200_000, 0).unwrap())
        .build()
        .unwrap();
    pfe.start().unwrap();
    let frames: Vec<Vec<u8>> = (0..2000).map(|i| udp_frame(i as u16, i, 64)).collect();
    pfe.inject_burst(frames.iter().map(|f| (0, &f[..])))
        .unwrap();
    wait_until("the timers ran 20 times on the real clock", || {
        pfe.stats().timer_runs >= 20
    });
    let mem = pfe.memory().clone();
    let stats = pfe.shutdown();
    assert!(stats.is_conserved());
    assert_eq!(stats.packets_out, 2000);
    assert_eq!(stats.timer_runs, stats.timer_launches, "every launch ran");
    let counted: u64 = (0..4).map(|s| mem.counter_read(2 * s).unwrap().0).sum();
    assert_eq!(counted, stats.timer_runs);
}

#[test]
fn the_harness_runs_a_timer_entry_with_its_launch_and_clock() {
    let mut h = Harness::new(Arc::new(SharedMemory::new(&small_mem()).unwrap()));
    h.set_now(5 * MS);
    let launch = Launch {
        timer: 3,
        entry: 0,
        slice: 3,
        slices: 4,
        scheduled_ns: 4 * MS,
        missed: 0,
    };
    let out = h.run_timer(&counting_program(), launch);
    assert_eq!(out.result, Ok(Verdict::Consume));
    assert_eq!(out.created.len(), 1);
    assert_eq!(out.created[0].0, Dest::Port(1));
    assert_eq!(&out.created[0].1[0..4], &3u32.to_be_bytes());
    assert_eq!(h.memory().counter_read(6).unwrap(), (1, 0));
    assert!(out.output.is_none());
}

/// The runtime control of timers: a new period takes effect from the next launch, a timer
/// switched off launches nothing until switched on, bad requests are refused by name, and
/// after shutdown changes are refused while the counters stay readable.
#[test]
fn timers_change_while_the_engine_runs() {
    let clock = Arc::new(ManualClock::new());
    let mut pfe = Pfe::builder()
        .program(counting_program())
        .ppe_threads(2)
        .mem_config(small_mem())
        .timers([one_timer(10 * MS, 10 * MS)])
        .clock(clock.clone())
        .sink(Arc::new(Discard))
        .build()
        .unwrap();
    pfe.start().unwrap();
    let ctl = pfe.control();
    let mem = pfe.memory().clone();
    let launches = || mem.counter_read(0).unwrap().0;
    let at = |ns: u64| {
        clock.set(ns);
        pfe.settle_timers();
    };
    at(10 * MS);
    assert_eq!(launches(), 1);
    // At 12 ms the period becomes 5 ms: the next launch is 5 ms after the last (15 ms).
    clock.set(12 * MS);
    let s = ctl.set_timer_period(0, 5 * MS).expect("timer 0");
    assert_eq!((s.spec.period_ns, s.next_due_ns), (5 * MS, Some(15 * MS)));
    at(14 * MS);
    assert_eq!(launches(), 1);
    at(15 * MS);
    at(20 * MS);
    assert_eq!(launches(), 3);
    // Off at 21 ms: nothing at 25 or 40 ms; on at 40 ms: the next one period later.
    clock.set(21 * MS);
    let s = ctl.set_timer_enabled(0, false).expect("timer 0");
    assert_eq!((s.enabled, s.next_due_ns), (false, None));
    at(25 * MS);
    at(40 * MS);
    assert_eq!(launches(), 3);
    let s = ctl.set_timer_enabled(0, true).expect("timer 0");
    assert_eq!(s.next_due_ns, Some(45 * MS));
    at(44 * MS);
    assert_eq!(launches(), 3);
    at(45 * MS);
    assert_eq!(launches(), 4);
    assert_eq!(ctl.timers(), vec![ctl.timers()[0]]);
    assert_eq!(ctl.stats().timer_launches, 4);
    // Refusals name what is wrong.
    let e = ctl.set_timer_period(3, MS).unwrap_err();
    assert!(e.to_string().contains("no timer 3"), "{e}");
    let e = ctl.set_timer_period(0, 0).unwrap_err();
    assert!(e.to_string().contains("period 0"), "{e}");
    let stats = pfe.shutdown();
    assert_eq!(stats.timer_launches, 4);
    assert_eq!(
        ctl.set_timer_enabled(0, false),
        Err(pfemu::pfe::ControlError::NotRunning)
    );
    assert_eq!(ctl.stats().timer_launches, 4, "the counters stay readable");
}

/// The cores this machine offers: dispatch wakes an idle PPE thread for a timer launch only
/// while fewer threads are active than that.
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// An engine of two PPE threads running `program`, with two timers every 10 ms (due at 0
/// and 5 ms) on `clock`; not started.
fn two_staggered_timers(program: Program, clock: &Arc<ManualClock>) -> Pfe {
    Pfe::builder()
        .program(program)
        .ppe_threads(2)
        .mem_config(small_mem())
        .timers(TimerSpec::staggered(0, 2, 10 * MS, 0).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// A program whose timer entry 0 records each launch's slice in `started`, and whose slice 0
/// then holds its PPE thread until `release` is set (or, should the test fail, well after
/// the test's own waits gave up).
fn holding_program(started: Arc<Mutex<Vec<u32>>>, release: Arc<AtomicBool>) -> Program {
    let mut p = Program::builder("holding_timer");
    let [pkt, tick] = p.labels(["packet", "tick"]);
    p.instr(pkt, |_| Ok(Done(Verdict::Forward(1))));
    p.instr(tick, move |t| {
        let slice = t.timer().expect("a timer thread sees its launch").slice;
        started.lock().push(slice);
        let deadline = Instant::now() + 3 * PATIENCE;
        while slice == 0 && !release.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick);
    p.build().unwrap()
}

/// Paper §5: a timer thread runs on whichever PPE thread is free. A launch that comes due
/// while one PPE thread runs a long timer thread runs at once on an idle one; it does not
/// wait for the busy one (which made staggered slow timers overrun one after another).
#[test]
fn a_due_launch_does_not_wait_for_a_busy_ppe_thread_while_another_is_idle() {
    if cores() < 2 {
        eprintln!("skipped: one core, so dispatch runs one PPE thread at a time");
        return;
    }
    let clock = Arc::new(ManualClock::new());
    let started: Arc<Mutex<Vec<u32>>> = Arc::default();
    let release = Arc::new(AtomicBool::new(false));
    let mut pfe = two_staggered_timers(holding_program(started.clone(), release.clone()), &clock);
    pfe.start().unwrap();
    wait_until("timer 0's thread runs", || !started.lock().is_empty());
    // The other PPE thread goes idle, as it would in a real engine between timer periods:
    // a grace period that cannot end (timer 0's thread holds its PPE thread) names one busy
    // thread once the other is on the idle stack. Before that, a thread still spinning
    // would take the launch by itself and hide the fault (the unit test in
    // `pfe::timer_threads` checks the wake-up on its own).
    let ctl = pfe.control();
    wait_until("the other PPE thread goes idle", || {
        matches!(
            ctl.wait_quiescent(Instant::now()),
            Err(pfemu::pfe::ControlError::GraceTimeout { busy: 1, .. })
        )
    });
    clock.set(5 * MS);
    wait_until(
        "timer 1's thread runs on the idle PPE thread while timer 0's holds the other",
        || started.lock().len() == 2,
    );
    release.store(true, Ordering::Release);
    pfe.settle_timers();
    let stats = pfe.shutdown();
    assert_eq!(*started.lock(), [0, 1]);
    assert_eq!((stats.timer_runs, stats.timer_overruns), (2, 0));
}

/// `Pfe::drain` waits for the timer threads launched before it was called, not for a moment
/// with none in flight. Here the timer threads overlap for ever: each one, once the previous
/// has finished, moves the clock so that the other timer comes due, and finishes only once
/// that launch has been made. A launch is in flight at every moment, yet drain returns.
#[test]
fn drain_returns_while_timer_threads_keep_overlapping() {
    let clock = Arc::new(ManualClock::new());
    let ctl: Arc<std::sync::OnceLock<pfemu::pfe::Control>> = Arc::default();
    let go_on = Arc::new(AtomicBool::new(true));
    let started = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut p = Program::builder("overlapping_timers");
    let [pkt, tick] = p.labels(["packet", "tick"]);
    p.instr(pkt, |_| Ok(Done(Verdict::Forward(1))));
    {
        let (clock, ctl, go_on) = (clock.clone(), ctl.clone(), go_on.clone());
        p.instr(tick, move |_| {
            let m = started.fetch_add(1, Ordering::AcqRel);
            let ctl = ctl
                .get()
                .expect("the test sets the control handle before start");
            if go_on.load(Ordering::Acquire) {
                // The previous launch (of the other timer) has finished, so its next one is
                // not an overrun.
                wait_until("the previous timer thread finishes", || {
                    ctl.stats().timer_runs >= m
                });
                clock.advance(5 * MS);
                // (Or the test is over: shutdown stops the launches.)
                wait_until("the other timer's next launch is made", || {
                    ctl.stats().timer_launches >= m + 2 || !go_on.load(Ordering::Acquire)
                });
            }
            Ok(Done(Verdict::Consume))
        });
    }
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick);
    let mut pfe = two_staggered_timers(p.build().unwrap(), &clock);
    let _ = ctl.set(pfe.control());
    pfe.start().unwrap();
    wait_until("the timer threads overlap", || pfe.stats().timer_runs >= 4);
    let pfe = Arc::new(pfe);
    let draining = Arc::clone(&pfe);
    within_patience("Pfe::drain while timer threads overlap", move || {
        draining.drain()
    });
    go_on.store(false, Ordering::Release);
    let pfe = Arc::into_inner(pfe).expect("the drain's handle is gone");
    let stats = within_patience("Pfe::shutdown", move || pfe.shutdown());
    assert_eq!(
        stats.timer_overruns, 0,
        "each launch came after the previous finished"
    );
    assert_eq!(
        stats.timer_runs, stats.timer_launches,
        "every launch made ran"
    );
}

/// The periods between building the engine and starting it (the default clock starts at
/// the build) were nobody's to launch: they are not counted as missed, and each timer
/// starts at its first period at or after the start, keeping the stagger.
#[test]
fn the_periods_before_start_are_not_counted_as_missed() {
    let clock = Arc::new(ManualClock::new());
    let seen: Arc<Mutex<Vec<(u32, u64, u64)>>> = Arc::default();
    let mut p = Program::builder("recording_timer");
    let [pkt, tick] = p.labels(["packet", "tick"]);
    p.instr(pkt, |_| Ok(Done(Verdict::Forward(1))));
    {
        let seen = seen.clone();
        p.instr(tick, move |t| {
            let l = *t.timer().expect("a timer thread sees its launch");
            seen.lock().push((l.slice, l.scheduled_ns, l.missed));
            Ok(Done(Verdict::Consume))
        });
    }
    p.entry(Entry::Packet, pkt);
    p.entry(Entry::Timer(0), tick);
    let mut pfe = two_staggered_timers(p.build().unwrap(), &clock);
    // Time passes before the start (building traffic, say).
    clock.set(52 * MS);
    pfe.start().unwrap();
    pfe.settle_timers();
    assert_eq!(pfe.stats().timer_launches, 0, "nothing is due at the start");
    for ms in [55, 60, 65] {
        clock.set(ms * MS);
        pfe.settle_timers();
    }
    let stats = pfe.shutdown();
    assert_eq!(stats.timer_missed, 0);
    assert_eq!(
        *seen.lock(),
        [(1, 55 * MS, 0), (0, 60 * MS, 0), (1, 65 * MS, 0)]
    );
}

/// A period past the bound is refused naming it and leaves the timer as it was (it used to
/// saturate the next launch into the mark of a switched-off timer); at the end of the
/// clock's range the timer launches once more, stays on, and the engine settles.
#[test]
fn an_out_of_range_period_is_refused_and_the_end_of_time_switches_nothing_off() {
    let clock = Arc::new(ManualClock::new());
    let mut pfe = Pfe::builder()
        .program(counting_program())
        .ppe_threads(2)
        .mem_config(small_mem())
        .timers([one_timer(MS, 0)])
        .clock(clock.clone())
        .sink(Arc::new(Discard))
        .build()
        .unwrap();
    pfe.start().unwrap();
    pfe.settle_timers();
    let ctl = pfe.control();
    let e = ctl
        .set_timer_period(0, u64::MAX)
        .expect_err("a period of u64::MAX ns is refused");
    assert!(
        e.to_string()
            .contains("timer period 18446744073709551615 ns: at most"),
        "{e}"
    );
    let st = ctl.timers()[0];
    assert_eq!(
        (st.enabled, st.spec.period_ns, st.next_due_ns),
        (true, MS, Some(MS))
    );
    // The longest period is taken.
    let st = ctl.set_timer_period(0, MAX_TIMER_NS).unwrap();
    assert_eq!((st.enabled, st.next_due_ns), (true, Some(MAX_TIMER_NS)));
    clock.set(u64::MAX);
    let pfe = within_patience("settle_timers at the clock's last reading", move || {
        pfe.settle_timers();
        pfe
    });
    let st = ctl.timers()[0];
    assert_eq!(
        (st.enabled, st.next_due_ns),
        (true, None),
        "on, with no period left to begin"
    );
    let stats = pfe.shutdown();
    assert_eq!((stats.timer_launches, stats.timer_runs), (2, 2));
}

/// Timer settings past their bounds are refused by name when the engine is built, before
/// anything is allocated for them.
#[test]
fn build_refuses_too_many_timers_and_out_of_range_phases() {
    let err = TimerSpec::staggered(0, 1_000_000_000, MS, 0).unwrap_err();
    assert_eq!(err.setting, "timers");
    assert!(err.to_string().contains("at most 4096"), "{err}");
    let Err(err) = Pfe::builder()
        .program(counting_program())
        .mem_config(small_mem())
        .timers(std::iter::repeat_n(one_timer(MS, 0), MAX_TIMERS + 1))
        .build()
    else {
        panic!("an engine with {} timers was built", MAX_TIMERS + 1);
    };
    assert_eq!(err.setting, "timers");
    let err = Pfe::builder()
        .program(counting_program())
        .mem_config(small_mem())
        .timers([one_timer(MS, u64::MAX)])
        .build()
        .unwrap_err();
    assert_eq!(err.setting, "timer_phase");
}
