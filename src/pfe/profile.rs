//! The per-stage profile: where the engine's time goes, stage by stage, when
//! [`PfeBuilder::profile`](super::PfeBuilder::profile) is on.
//!
//! Who measures what, in the order a batch meets the stages:
//!
//! 1. An injecting thread times each call of `Pfe::submit` (the batches it fills:
//!    validation, classification, copy, sequence stamps, the push into dispatch) and adds
//!    it to the engine's [`IngressTime`]; the time it sleeps waiting for in-flight room is
//!    added there too, separately. Per call rather than per batch, so that ingress's batch
//!    loop is the same code with profiling on or off.
//! 2. A PPE thread reads the clock at the boundaries of its stages, a few times per batch
//!    (a [`Lap`]): after taking work from dispatch (the time parked inside `Dispatch::pop`
//!    is timed there and kept apart), after running the program, and after the release,
//!    which is split into the sink's time (a [`TimedSink`] around the engine's sink), the
//!    retiring of batches (`ppe::retire`, timed around each call) and the rest (the reorder
//!    engine, or the release in completion order). Timer launches and timer threads are a
//!    stage of their own.
//! 3. The PPE thread adds the nanoseconds to its local counters ([`StageTimes`] in
//!    `WorkerStats`), published with the next batch as the others are (and at exit); a
//!    [`super::Stats`] snapshot sums them with the ingress times into a [`StageProfile`].
//! 4. When it stops, the PPE thread adds what the kernel counted for it since it started
//!    ([`CoreTime`]): its time on a core and its time runnable but waiting for one. They
//!    are not stages; they say how much of the stages' wall-clock time was the thread's.
//!
//! The clock is `std::time::Instant` (the monotonic clock, read through the vDSO on Linux),
//! never the engine's [`Clock`](crate::timer::Clock), which a test may move by hand. The
//! times are wall-clock time a thread spent in a stage, summed over threads: a thread
//! descheduled inside a stage (more busy threads than cores) counts the wait there; step 4's
//! counts say how much of it there was.
//!
//! Off (the default), profiling costs nothing: the PPE thread's loop is compiled twice,
//! with a `const PROFILE: bool`, and in the copy without it every type here reads no clock
//! and its methods compile to nothing; ingress tests the setting once per call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

use super::egress::{Frames, Sink};
use crate::packet::Port;

/// Nanoseconds of a duration, saturated (584 years fit).
#[inline]
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// A PPE thread's stages, as [`StageTimes`] indexes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Taking work from dispatch, parked time excluded.
    Dispatch,
    /// Parked in dispatch for lack of work.
    Parked,
    /// Running the program on a batch.
    Program,
    /// Releasing finished batches (reorder engine or completion order), sink and retire
    /// excluded.
    Reorder,
    /// Inside [`Sink::deliver`].
    Sink,
    /// Retiring released batches.
    Egress,
    /// Launching timers and running timer threads.
    Timers,
    /// Not a stage: the thread's time on a core, by the kernel's count ([`CoreTime`]).
    OnCore,
    /// Not a stage: the thread's time runnable but waiting for a core ([`CoreTime`]).
    Runnable,
}

impl Stage {
    const COUNT: usize = 9;
}

/// One PPE thread's nanoseconds per [`Stage`], kept with its other counters.
#[derive(Clone, Debug, Default)]
pub(crate) struct StageTimes {
    ns: [u64; Stage::COUNT],
}

impl StageTimes {
    /// Adds `ns` to `stage`.
    #[inline]
    pub fn add(&mut self, stage: Stage, ns: u64) {
        self.ns[stage as usize] += ns;
    }

    /// Nanoseconds of `stage`.
    pub fn get(&self, stage: Stage) -> u64 {
        self.ns[stage as usize]
    }

    /// A pop from dispatch that took `total` nanoseconds, `parked` of them parked.
    #[inline]
    pub fn popped(&mut self, total: u64, parked: u64) {
        self.add(Stage::Dispatch, total.saturating_sub(parked));
        self.add(Stage::Parked, parked);
    }

    /// A release that took `total` nanoseconds, `sink` of them inside the sink and `retire`
    /// of them retiring batches.
    #[inline]
    pub fn released(&mut self, total: u64, sink: u64, retire: u64) {
        self.add(Stage::Reorder, total.saturating_sub(sink + retire));
        self.add(Stage::Sink, sink);
        self.add(Stage::Egress, retire);
    }

    /// Adds another thread's (or batch's) times.
    pub fn merge(&mut self, o: &StageTimes) {
        for (a, b) in self.ns.iter_mut().zip(&o.ns) {
            *a += b;
        }
    }

    /// Zeroes every stage.
    pub fn reset(&mut self) {
        self.ns = [0; Stage::COUNT];
    }
}

/// A lap timer for the boundaries of a PPE thread's stages: each [`Lap::split`] gives the
/// nanoseconds since the previous one. With `ON` false it reads no clock and gives 0.
pub(crate) struct Lap<const ON: bool> {
    last: Option<Instant>,
}

impl<const ON: bool> Lap<ON> {
    /// A lap starting now.
    #[inline(always)]
    pub fn start() -> Self {
        Lap {
            last: if ON { Some(Instant::now()) } else { None },
        }
    }

    /// Nanoseconds since the start or the previous split; the next lap starts now.
    #[inline(always)]
    pub fn split(&mut self) -> u64 {
        if !ON {
            return 0;
        }
        let now = Instant::now();
        let ns = self
            .last
            .map_or(0, |t| nanos(now.saturating_duration_since(t)));
        self.last = Some(now);
        ns
    }
}

/// A thread's time on a core and runnable but off one, by the kernel's scheduler
/// statistics (`/proc/thread-self/schedstat` on Linux: nanoseconds run, nanoseconds waited
/// on a run queue), from [`CoreTime::start`] to [`CoreTime::finish`]. Read twice per PPE
/// thread, when it starts and when it stops: a read is a few system calls, too dear for
/// every batch. Where the kernel does not report them, both are 0.
pub(crate) struct CoreTime {
    /// At the start: (run, waited) nanoseconds; `None` when not profiling or not reported.
    start: Option<(u64, u64)>,
}

impl CoreTime {
    /// The calling thread's counts now, when `ON`.
    pub fn start<const ON: bool>() -> Self {
        CoreTime {
            start: if ON { sched_ns() } else { None },
        }
    }

    /// Adds the calling thread's time on a core and runnable since [`CoreTime::start`] to
    /// `times` ([`Stage::OnCore`], [`Stage::Runnable`]). Call it on the thread that started.
    pub fn finish(&self, times: &mut StageTimes) {
        // Not profiling (or no count at the start): nothing to read.
        let Some((run0, wait0)) = self.start else {
            return;
        };
        if let Some((run, wait)) = sched_ns() {
            times.add(Stage::OnCore, run.saturating_sub(run0));
            times.add(Stage::Runnable, wait.saturating_sub(wait0));
        }
    }
}

/// The calling thread's (run, run-queue wait) nanoseconds from
/// `/proc/thread-self/schedstat`, or `None` where there is no such file (not Linux, no
/// procfs, a kernel without scheduler statistics).
fn sched_ns() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let mut fields = text.split_ascii_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??))
}

/// Runs `f`, adding the nanoseconds it took to `ns` when `ON` (with `ON` false, only runs
/// it).
#[inline(always)]
pub(crate) fn timed<const ON: bool, R>(ns: &mut u64, f: impl FnOnce() -> R) -> R {
    if !ON {
        return f();
    }
    let start = Instant::now();
    let r = f();
    *ns += nanos(start.elapsed());
    r
}

/// A sink that times the engine's sink: the nanoseconds spent inside its
/// [`Sink::deliver`] calls, for the PPE thread that owns it (taken with
/// [`TimedSink::take`]). With `ON` false, [`TimedSink::sink`] is the engine's sink itself.
pub(crate) struct TimedSink<'a, const ON: bool> {
    inner: &'a dyn Sink,
    /// Written by the owning thread only (an atomic because a [`Sink`] is `Sync`).
    ns: AtomicU64,
}

impl<'a, const ON: bool> TimedSink<'a, ON> {
    /// A timer of `inner`.
    pub fn new(inner: &'a dyn Sink) -> Self {
        TimedSink {
            inner,
            ns: AtomicU64::new(0),
        }
    }

    /// The sink to deliver to: this one (timed) when `ON`, else the engine's own.
    #[inline(always)]
    pub fn sink(&self) -> &dyn Sink {
        if ON {
            self
        } else {
            self.inner
        }
    }

    /// Nanoseconds spent in the sink since the last take (0 with `ON` false).
    #[inline(always)]
    pub fn take(&self) -> u64 {
        if !ON {
            return 0;
        }
        let ns = self.ns.load(Ordering::Relaxed);
        self.ns.store(0, Ordering::Relaxed);
        ns
    }
}

impl<const ON: bool> Sink for TimedSink<'_, ON> {
    fn deliver(&self, port: Port, frames: Frames<'_>) {
        let start = Instant::now();
        self.inner.deliver(port, frames);
        // Only the owning thread writes: no read-modify-write needed.
        let ns = self.ns.load(Ordering::Relaxed) + nanos(start.elapsed());
        self.ns.store(ns, Ordering::Relaxed);
    }

    fn ports(&self) -> Option<usize> {
        self.inner.ports()
    }
}

/// The injecting threads' time, summed over them: filling and dispatching batches
/// (waiting included), and waiting for in-flight room alone.
#[derive(Debug, Default)]
pub(crate) struct IngressTime {
    /// Nanoseconds in `Pfe::submit` (index 0), of which asleep waiting for room (index 1).
    ns: CachePadded<[AtomicU64; 2]>,
}

impl IngressTime {
    /// Times one call of ingress, from now until the guard is dropped (when `on`).
    #[inline]
    pub fn call(&self, on: bool) -> IngressCall<'_> {
        IngressCall {
            time: self,
            start: on.then(Instant::now),
        }
    }

    /// Runs `wait` (an injector's sleep until there is room), timing it when `on`. On the
    /// slow path only, so a plain test of `on` costs nothing.
    pub fn waiting<R>(&self, on: bool, wait: impl FnOnce() -> R) -> R {
        if !on {
            return wait();
        }
        let start = Instant::now();
        let r = wait();
        self.ns[1].fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
        r
    }

    /// (Nanoseconds filling batches, waiting excluded; nanoseconds waiting for room).
    pub fn totals(&self) -> (u64, u64) {
        let all = self.ns[0].load(Ordering::Relaxed);
        let waiting = self.ns[1].load(Ordering::Relaxed);
        // A wait is inside its call's time, unless the call has not returned yet.
        (all.saturating_sub(waiting), waiting)
    }
}

/// The guard of [`IngressTime::call`]: adds the call's time when dropped, whichever way
/// the call ends (its frames taken, refused, or the engine stopped).
pub(crate) struct IngressCall<'a> {
    time: &'a IngressTime,
    /// `None`: not profiling.
    start: Option<Instant>,
}

impl Drop for IngressCall<'_> {
    #[inline]
    fn drop(&mut self) {
        if let Some(start) = self.start {
            self.time.ns[0].fetch_add(nanos(start.elapsed()), Ordering::Relaxed);
        }
    }
}

/// Where an engine's time went, per stage, summed over its threads: the injecting threads
/// (ingress) and the PPE threads (the rest). Measured when the engine profiles
/// ([`PfeBuilder::profile`](super::PfeBuilder::profile)); see
/// [`Stats::profile`](super::Stats::profile).
///
/// Each figure is wall-clock nanoseconds the threads spent in the stage: a thread that was
/// descheduled inside a stage (more busy threads than cores) counts the wait there. The
/// busy stages ([`StageProfile::STAGES`]) cover every nanosecond of a PPE thread's loop but
/// the time it was parked; `parked_ns` and `ingress_waiting_ns` are time spent waiting,
/// not working, and are left out of [`StageProfile::busy_ns`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StageProfile {
    /// Packets the PPE threads processed: what the per-packet figures divide by.
    pub packets: u64,
    /// Injecting threads filling batches (`Pfe::inject` and its kin): validating and
    /// classifying frames, copying them (or taking references), stamping sequence numbers
    /// and pushing batches into dispatch. Waiting for room excluded.
    pub ingress_ns: u64,
    /// Injecting threads asleep waiting for in-flight room (the engine was full).
    pub ingress_waiting_ns: u64,
    /// PPE threads taking work from dispatch: popping, spinning on an empty queue, going
    /// idle and waking up (parked time excluded).
    pub dispatch_ns: u64,
    /// PPE threads parked for lack of work.
    pub parked_ns: u64,
    /// PPE threads running the program: loading heads, the instructions and their XTXNs,
    /// the verdicts, the batch's posted XTXNs, and publishing the counters.
    pub program_ns: u64,
    /// PPE threads releasing finished batches: handing them to the reorder engine and,
    /// for the thread that holds its lock, releasing every queued batch in flow order (its
    /// own and other threads'), or with reordering off queueing them per port in
    /// completion order; latency and trace records included, the sink's time and retiring
    /// excluded.
    pub reorder_ns: u64,
    /// PPE threads inside the sink's [`Sink::deliver`](super::Sink::deliver).
    pub sink_ns: u64,
    /// PPE threads retiring released batches: giving back in-flight room (waking waiting
    /// injectors) and returning the batch to the pool.
    pub egress_ns: u64,
    /// PPE threads launching due timers and running timer threads (their packets'
    /// delivery included).
    pub timers_ns: u64,
    /// PPE threads on a core, by the kernel's count (Linux's per-thread scheduler
    /// statistics), over each thread's whole loop: every stage and the parked time. Counted
    /// when a thread stops, so a snapshot of a running engine has 0; 0 too where the kernel
    /// does not report it. Against the stages' wall-clock time it says how much of that
    /// time was the threads' own.
    pub on_core_ns: u64,
    /// PPE threads runnable but waiting for a core (more busy threads than cores), by the
    /// same count: wall-clock time the stages hold that the threads did not run. Counted as
    /// [`StageProfile::on_core_ns`] is.
    pub runnable_ns: u64,
}

/// One busy stage's share of a [`StageProfile`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct StageCost {
    /// The stage, one of [`StageProfile::STAGES`].
    pub stage: &'static str,
    /// Nanoseconds, summed over threads.
    pub ns: u64,
    /// Nanoseconds per packet processed.
    pub ns_per_packet: f64,
    /// Share of the busy time ([`StageProfile::busy_ns`]), 0 to 1.
    pub share: f64,
}

impl StageProfile {
    /// The busy stages, in the order a packet meets them.
    pub const STAGES: [&'static str; 7] = [
        "ingress", "dispatch", "program", "reorder", "sink", "egress", "timers",
    ];

    /// The profile of `threads`' stage times, with `packets` processed and the injectors'
    /// `ingress`.
    pub(crate) fn of(packets: u64, threads: &StageTimes, ingress: &IngressTime) -> Self {
        let (ingress_ns, ingress_waiting_ns) = ingress.totals();
        StageProfile {
            packets,
            ingress_ns,
            ingress_waiting_ns,
            dispatch_ns: threads.get(Stage::Dispatch),
            parked_ns: threads.get(Stage::Parked),
            program_ns: threads.get(Stage::Program),
            reorder_ns: threads.get(Stage::Reorder),
            sink_ns: threads.get(Stage::Sink),
            egress_ns: threads.get(Stage::Egress),
            timers_ns: threads.get(Stage::Timers),
            on_core_ns: threads.get(Stage::OnCore),
            runnable_ns: threads.get(Stage::Runnable),
        }
    }

    /// Nanoseconds of each busy stage, in [`StageProfile::STAGES`] order.
    fn busy(&self) -> [u64; 7] {
        [
            self.ingress_ns,
            self.dispatch_ns,
            self.program_ns,
            self.reorder_ns,
            self.sink_ns,
            self.egress_ns,
            self.timers_ns,
        ]
    }

    /// Nanoseconds the threads spent working (every stage but waiting: parked PPE threads,
    /// injectors waiting for room).
    pub fn busy_ns(&self) -> u64 {
        self.busy().iter().sum()
    }

    /// `ns` per packet processed (0 when none was).
    pub fn per_packet(&self, ns: u64) -> f64 {
        if self.packets == 0 {
            0.0
        } else {
            ns as f64 / self.packets as f64
        }
    }

    /// Each busy stage's nanoseconds, per packet, and share of the busy time, in
    /// [`StageProfile::STAGES`] order.
    pub fn costs(&self) -> [StageCost; 7] {
        let busy = self.busy_ns();
        let ns = self.busy();
        std::array::from_fn(|i| StageCost {
            stage: Self::STAGES[i],
            ns: ns[i],
            ns_per_packet: self.per_packet(ns[i]),
            share: if busy == 0 {
                0.0
            } else {
                ns[i] as f64 / busy as f64
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn off_reads_no_clock_and_measures_nothing() {
        let mut lap = Lap::<false>::start();
        assert!(lap.last.is_none());
        assert_eq!(lap.split(), 0);
        let mut ns = 0;
        assert_eq!(timed::<false, _>(&mut ns, || 7), 7);
        assert_eq!(ns, 0);
        let ingress = IngressTime::default();
        drop(ingress.call(false));
        ingress.waiting(false, || ());
        assert_eq!(ingress.totals(), (0, 0));
        let sink = super::super::Discard;
        let timed_sink = TimedSink::<false>::new(&sink);
        assert_eq!(timed_sink.take(), 0);
    }

    #[test]
    fn on_measures_each_stage_and_keeps_waits_apart() {
        // A sleep lasts at least as long as asked: the lower bounds below hold on any
        // machine, however slow.
        let pause = || std::thread::sleep(Duration::from_millis(2));
        let mut lap = Lap::<true>::start();
        pause();
        assert!(lap.split() >= 2_000_000);
        let mut ns = 0;
        timed::<true, _>(&mut ns, pause);
        assert!(ns >= 2_000_000);

        let ingress = IngressTime::default();
        {
            let _call = ingress.call(true);
            ingress.waiting(true, pause);
        }
        let (busy, waiting) = ingress.totals();
        assert!(waiting >= 2_000_000);
        // The call's time holds its wait; the busy time is the rest of it.
        let call = ingress.ns[0].load(Ordering::Relaxed);
        assert!(call >= waiting, "{call} {waiting}");
        assert_eq!(busy + waiting, call);

        let mut t = StageTimes::default();
        t.popped(10, 4);
        t.released(20, 5, 3);
        t.add(Stage::Program, 30);
        let mut sum = StageTimes::default();
        sum.merge(&t);
        sum.merge(&t);
        assert_eq!(sum.get(Stage::Dispatch), 12);
        assert_eq!(sum.get(Stage::Parked), 8);
        assert_eq!(sum.get(Stage::Reorder), 24);
        assert_eq!(sum.get(Stage::Sink), 10);
        assert_eq!(sum.get(Stage::Egress), 6);
        assert_eq!(sum.get(Stage::Program), 60);
        sum.reset();
        assert_eq!(sum.get(Stage::Program), 0);

        // The kernel's count: off, nothing is read or added; on, what it adds is the
        // thread's own since the start, so a thread that has run for 2 ms of sleep has not
        // been on a core for 2 ms.
        let mut times = StageTimes::default();
        let off = CoreTime::start::<false>();
        assert!(off.start.is_none());
        off.finish(&mut times);
        assert_eq!(
            (times.get(Stage::OnCore), times.get(Stage::Runnable)),
            (0, 0)
        );
        if let Some((run, _)) = sched_ns() {
            assert!(run > 0);
            let on = CoreTime::start::<true>();
            pause();
            on.finish(&mut times);
            let wall = 2_000_000;
            assert!(times.get(Stage::OnCore) < wall, "{times:?}");
        }
    }

    #[test]
    fn costs_divide_by_packets_and_share_the_busy_time() {
        let p = StageProfile {
            packets: 10,
            ingress_ns: 100,
            ingress_waiting_ns: 1000,
            dispatch_ns: 50,
            parked_ns: 5000,
            program_ns: 250,
            reorder_ns: 50,
            sink_ns: 25,
            egress_ns: 25,
            timers_ns: 0,
            // Not stages: not in the busy time.
            on_core_ns: 300,
            runnable_ns: 200,
        };
        assert_eq!(p.busy_ns(), 500);
        let c = p.costs();
        assert_eq!(c.map(|c| c.stage), StageProfile::STAGES);
        assert_eq!(c[0].ns_per_packet, 10.0);
        assert_eq!(c[2].share, 0.5);
        assert!((c.iter().map(|c| c.share).sum::<f64>() - 1.0).abs() < 1e-12);
        assert_eq!(StageProfile::default().costs()[0].ns_per_packet, 0.0);
    }
}
