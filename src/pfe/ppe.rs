//! PPE threads: each is an OS thread that takes batches from dispatch, runs the program to
//! completion on every packet head in its local memory, and hands the results to the
//! reorder engine (or straight to egress when reordering is off).
//!
//! What a thread owns (its local memory, posted XTXNs, counters, and, without reordering,
//! its own egress queues) is never shared; it publishes its counters once per batch.

use std::sync::Arc;

use super::batch::{Batch, Completion, Slot, PREFETCH_FRAMES, PREFETCH_SLOTS};
use super::dispatch::Popped;
use super::egress::{PortQueues, Sink, Span};
use super::profile::{timed, CoreTime, Lap, Stage, TimedSink};
use super::reorder::Outlet;
use super::stats::{
    WorkerStats, DROP_FAULT_BASE, DROP_NO_SUCH_GROUP, DROP_NO_SUCH_PORT, DROP_PROGRAM_BASE,
};
use super::timer_threads::By;
use super::Shared;
use super::{trace, TraceRecord};
use crate::packet::{Dest, OutArena};
use crate::program::{
    Entry, PacketMeta, PacketRun, RunOutcome, Thread, ThreadCore, Verdict, DEFAULT_HEAD_OFFSET,
};
use crate::sync::Parker;
use crate::timer::Launch;

/// The body of PPE thread `me`; `PROFILE`: time the stages (see `pfe::profile`).
pub(crate) fn run<const PROFILE: bool>(
    shared: Arc<Shared>,
    me: usize,
    parker: Parker,
    pin: Option<core_affinity::CoreId>,
) {
    if let Some(core_id) = pin {
        // Pinning is a performance hint: a refusal (e.g. a restricted cpuset) leaves the
        // thread unpinned rather than stopping it.
        let _ = core_affinity::set_for_current(core_id);
    }
    let mut core = ThreadCore::new();
    let mut local = WorkerStats::new(shared.drop_reason_names.len());
    let mut queues = PortQueues::new(shared.cfg.ports);
    let mut timer_out = OutArena::default();
    let core_time = CoreTime::start::<PROFILE>();
    let mut lap = Lap::<PROFILE>::start();
    let sink = TimedSink::<PROFILE>::new(&*shared.sink);
    // From here on, grace periods wait for this thread (see `pfe::dispatch`, step 6).
    shared.dispatch.enter(me);
    loop {
        if let Some(timers) = &shared.timers {
            // Between batches: launch the timers due (see `pfe::timer_threads`).
            timers.poll(&shared.dispatch, shared.clock.now_ns(), By::PpeThread);
            if PROFILE {
                local.profile.add(Stage::Timers, lap.split());
            }
        }
        let mut parked = 0;
        let popped = shared
            .dispatch
            .pop_timed::<PROFILE>(me, &parker, &mut parked);
        if PROFILE {
            local.profile.popped(lap.split(), parked);
        }
        let mut batch = match popped {
            Popped::Batch(b) => b,
            Popped::Timer(launch) => {
                run_timer(
                    &shared,
                    me,
                    &mut core,
                    launch,
                    &mut timer_out,
                    &mut queues,
                    &mut local,
                );
                if PROFILE {
                    local.profile.add(Stage::Timers, lap.split());
                }
                shared.worker_stats[me].lock().add(&local);
                local.reset();
                continue;
            }
            Popped::Closed => {
                // The last release's times (profiling), not published with a batch, and
                // the kernel's count of the thread's time on a core.
                core_time.finish(&mut local.profile);
                shared.worker_stats[me].lock().add(&local);
                return;
            }
        };
        process(&shared, &mut core, &mut batch, &mut local);
        // Posted XTXNs land before the batch counts as done, so they are visible after drain.
        core.posted.flush(&shared.mem);
        if PROFILE {
            local.profile.add(Stage::Program, lap.split());
        }
        shared.worker_stats[me].lock().add(&local);
        local.reset();
        let latency = shared
            .latency
            .as_ref()
            .map(|l| (l, me, shared.clock.now_ns()));
        let trace = shared.trace.as_ref().map(|t| (&**t, shared.clock.now_ns()));
        let mut retire_ns = 0;
        if shared.cfg.reorder {
            shared.reorder.finish(
                batch,
                Outlet {
                    groups: &shared.groups,
                    sink: sink.sink(),
                    tx: &shared.tx,
                    thread: me,
                    latency,
                    trace,
                },
                &mut queues,
                |b, released| timed::<PROFILE, _>(&mut retire_ns, || retire(&shared, b, released)),
            );
        } else {
            let released = release_unordered(&shared, me, &batch, &mut queues, sink.sink());
            if let Some((cfg, now)) = trace {
                for (_, r) in batch.traced.drain(..) {
                    trace::emit(cfg, r, now, false);
                }
            }
            if let Some((l, me, now)) = latency {
                let leaving = batch.done.iter().filter(|c| c.outs_end > c.outs_start);
                l.record(
                    me,
                    now.saturating_sub(batch.ingress_ns),
                    leaving.count() as u64,
                );
            }
            timed::<PROFILE, _>(&mut retire_ns, || retire(&shared, Some(batch), released));
        }
        if PROFILE {
            local.profile.released(lap.split(), sink.take(), retire_ns);
        }
    }
}

/// Runs the thread of one timer launch. It has no packet; the packets it creates go
/// straight to egress (they belong to no flow, so there is nothing to order them after).
/// Its verdict means nothing without a packet and is ignored; a fault is counted.
fn run_timer(
    shared: &Shared,
    me: usize,
    core: &mut ThreadCore,
    launch: Launch,
    out: &mut OutArena,
    queues: &mut PortQueues,
    st: &mut WorkerStats,
) {
    out.clear();
    let meta = PacketMeta::timer(launch, shared.clock.now_ns());
    let mut t = Thread::new(core, &shared.mem, out, meta);
    let outcome = shared.program.run(
        Entry::Timer(launch.entry),
        &mut t,
        shared.cfg.instruction_budget,
    );
    t.end();
    core.posted.flush(&shared.mem);
    st.timer_runs += 1;
    st.timer_instructions += outcome.instructions as u64;
    if let Err(fault) = outcome.result {
        st.faults[fault.kind().index()] += 1;
        st.timer_faults += 1;
        // The packets it created were discarded with its work (those it kept,
        // `Thread::keep_created`, and its program's fault handler's remain).
        st.count_fault_handler(&outcome.fault_handler);
    }
    for r in &out.recs {
        st.created += 1;
        if dest_exists(shared, r.dest) {
            queues.push(
                r.dest,
                Span::new(r.src, r.off, r.len),
                false,
                &shared.groups,
            );
        } else {
            st.created_invalid += 1;
        }
    }
    queues.flush(&[&[], &out.bytes], &*shared.sink, &shared.tx, me);
    for (a, b) in st.xtxns.iter_mut().zip(core.xtxns.iter_mut()) {
        *a += *b;
        *b = 0;
    }
    st.yields += std::mem::take(&mut core.yields);
    if let Some(timers) = &shared.timers {
        timers.finished(&launch);
    }
}

/// Returns a batch whose packets have all left to the pool, and counts `released`
/// packets out of flight.
fn retire(shared: &Shared, batch: Option<Box<Batch>>, released: u64) {
    if let Some(mut batch) = batch {
        // Clear first: once drain sees nothing in flight, the engine holds no shared frame.
        batch.clear();
        // A full pool means more batches exist than the capacity needs; let this one go.
        let _ = shared.pool.push(batch);
    }
    if released > 0 {
        shared.room.release(&shared.in_flight, released);
    }
}

fn release_unordered(
    shared: &Shared,
    me: usize,
    batch: &Batch,
    queues: &mut PortQueues,
    sink: &dyn Sink,
) -> u64 {
    for c in &batch.done {
        queues.push_packet(batch.outputs(c), c.own, 0, &shared.groups);
    }
    queues.flush(&[&batch.frames, &batch.out.bytes], sink, &shared.tx, me);
    batch.done.len() as u64
}

/// Counts the fault of a packet thread's run, from the outcome it left.
#[cold]
fn count_fault(st: &mut WorkerStats, outcome: Option<&RunOutcome>) {
    debug_assert!(
        outcome.is_some(),
        "a run without a verdict leaves its outcome"
    );
    let Some(outcome) = outcome else { return };
    if let Err(fault) = &outcome.result {
        let k = fault.kind().index();
        st.faults[k] += 1;
        st.drops[DROP_FAULT_BASE + k] += 1;
        // The packets it created were discarded with its work (those it kept,
        // `Thread::keep_created`, and its program's fault handler's remain).
        st.count_fault_handler(&outcome.fault_handler);
    }
}

fn dest_exists(shared: &Shared, dest: Dest) -> bool {
    match dest {
        Dest::Port(p) => (p as usize) < shared.cfg.ports,
        Dest::Group(g) => shared.groups.get(g as usize).is_some_and(|m| !m.is_empty()),
    }
}

/// The record of a traced packet, once its program has run (its XTXNs taken from `core`).
#[cold]
#[allow(clippy::too_many_arguments)]
fn trace_record(
    shared: &Shared,
    core: &mut ThreadCore,
    s: &Slot,
    flow: (u32, u32),
    labels: Vec<crate::program::Label>,
    verdict: Option<Verdict>,
    fault: Option<&crate::program::Fault>,
    left: bool,
    start_ns: u64,
) -> TraceRecord {
    let names = shared.program.instruction_names();
    let verdict = match verdict {
        Some(Verdict::Forward(p)) if left => format!("forward {p}"),
        Some(Verdict::Multicast(g)) if left => format!("multicast {g}"),
        Some(Verdict::Forward(p)) => format!("drop no_such_port (forward {p})"),
        Some(Verdict::Multicast(g)) => format!("drop no_such_group (multicast {g})"),
        Some(Verdict::Consume) => "consume".to_string(),
        Some(Verdict::Drop(r)) => format!("drop {}", shared.program.drop_reason_name(r)),
        None => match fault {
            Some(fault) => format!("fault: {fault}"),
            None => "fault".to_string(),
        },
    };
    TraceRecord {
        port: s.port,
        len: s.len as usize,
        flow,
        start_ns,
        instructions: labels
            .into_iter()
            .map(|l| names[l.0 as usize].clone())
            .collect(),
        xtxns: core.trace.take().unwrap_or_default(),
        verdict,
        held: false,
        reorder_wait_ns: 0,
        finished_ns: shared.clock.now_ns(),
    }
}

crate::isa::with_avx2! {
    /// Runs the program on every packet of the batch.
    fn process(shared: &Shared, core: &mut ThreadCore, batch: &mut Batch, st: &mut WorkerStats) {
        // Two copies of the loop: without a trace configured, not a test of it per packet.
        let created = if shared.trace.is_some() {
            process_packets::<true>(shared, core, batch, st)
        } else {
            process_packets::<false>(shared, core, batch, st)
        };
        batch.whole_after = (!created).then(|| batch.latest_pred_batch());
    }
}

/// [`process`]'s loop; `TRACE`: the engine traces some packets. Returns whether a packet
/// created one.
#[inline(always)]
fn process_packets<const TRACE: bool>(
    shared: &Shared,
    core: &mut ThreadCore,
    batch: &mut Batch,
    st: &mut WorkerStats,
) -> bool {
    let now_ns = shared.clock.now_ns();
    // Whether some packet created one: its records are not all packets' own frames.
    let mut created_any = false;
    let head_bytes = shared.cfg.head_bytes;
    let budget = shared.cfg.instruction_budget;
    let Batch {
        frames,
        shared: by_ref,
        slots,
        out,
        done,
        traced,
        flows,
        ..
    } = batch;
    let trace = shared.trace.as_deref();
    for (index, s) in slots.iter().enumerate() {
        // The batch's lines were written on the injecting core: ask for the slots and
        // frames a few packets ahead, so their misses overlap this packet's work.
        crate::isa::prefetch(slots.as_ptr().wrapping_add(index + PREFETCH_SLOTS));
        if let Some(ahead) = slots.get(index + PREFETCH_FRAMES) {
            if let Some(off) = ahead.at.offset() {
                crate::isa::prefetch(frames.as_ptr().wrapping_add(off as usize));
            }
        }
        let frame = Batch::frame(frames, by_ref, s);
        let tracing = TRACE && trace.is_some_and(|tr| tr.wants(s.port, frame));
        let mut labels = Vec::new();
        if tracing {
            core.trace = Some(Vec::new());
        }
        // Load the head into local memory before the first instruction.
        let meta = core.load(s.port, frame, head_bytes, now_ns);
        let head_len = meta.head_len;
        let outs_start = out.recs.len();
        let mut t = Thread::new(core, &shared.mem, out, meta);
        let PacketRun {
            verdict,
            instructions,
        } = if tracing {
            let outcome = shared
                .program
                .run_observed(Entry::Packet, &mut t, budget, |l| labels.push(l));
            let run = PacketRun {
                verdict: outcome.result.as_ref().ok().copied(),
                instructions: outcome.instructions,
            };
            if run.verdict.is_none() {
                t.keep_fault(outcome);
            }
            run
        } else {
            shared.program.run_packet(&mut t, budget)
        };
        let (hs, hl, lm_written) = t.end();
        st.packets += 1;
        st.instructions += instructions as u64;

        // Created packets first: drop those whose destination does not exist.
        let created = out.recs.len() - outs_start;
        if created > 0 {
            created_any = true;
            st.created += created as u64;
            let before = out.recs.len();
            let mut i = outs_start;
            while i < out.recs.len() {
                if dest_exists(shared, out.recs[i].dest) {
                    i += 1;
                } else {
                    out.recs.remove(i);
                }
            }
            st.created_invalid += (before - out.recs.len()) as u64;
        }

        let own_dest = match verdict {
            Some(Verdict::Forward(p)) => Some(Dest::Port(p)),
            Some(Verdict::Multicast(g)) => Some(Dest::Group(g)),
            Some(Verdict::Drop(r)) => {
                st.drops[DROP_PROGRAM_BASE + r.0 as usize] += 1;
                None
            }
            Some(Verdict::Consume) => {
                st.consumed += 1;
                None
            }
            None => {
                count_fault(st, core.faulted.as_ref());
                None
            }
        };
        let mut left = false;
        if let Some(dest) = own_dest {
            if dest_exists(shared, dest) {
                left = true;
                // Unload the (possibly rewritten) head and rejoin it with the tail: in place
                // in the packet buffer when the head kept its place and size, the tail was
                // not replaced and the frame was copied in (a shared frame is never written),
                // otherwise into the output arena.
                let in_place = hs == DEFAULT_HEAD_OFFSET && hl == head_len && !core.new_tail_set;
                if let Some(off) = s.at.offset().filter(|_| in_place) {
                    if lm_written {
                        let at = off as usize;
                        crate::mem::copy_lines(&mut frames[at..at + hl], &core.lm[hs..hs + hl]);
                    }
                    out.push_in_place(dest, off, s.len.into());
                } else {
                    let tail = if core.new_tail_set {
                        &core.new_tail[..]
                    } else {
                        &Batch::frame(frames, by_ref, s)[head_len..]
                    };
                    out.push(dest, &[&core.lm[hs..hs + hl], tail]);
                }
                // The packet leaves ahead of the packets it created.
                if created > 0 {
                    out.recs[outs_start..].rotate_right(1);
                }
                match dest {
                    Dest::Port(_) => st.forwarded += 1,
                    Dest::Group(_) => st.multicast += 1,
                }
            } else {
                st.drops[match dest {
                    Dest::Port(_) => DROP_NO_SUCH_PORT,
                    Dest::Group(_) => DROP_NO_SUCH_GROUP,
                }] += 1;
            }
        }
        if tracing {
            // Ingress stamps every packet's flow while the engine traces.
            let flow = flows.get(index).copied().unwrap_or_default();
            let faulted = core.faulted.take().filter(|_| verdict.is_none());
            let fault = faulted.as_ref().and_then(|o| o.result.as_ref().err());
            let r = trace_record(shared, core, s, flow, labels, verdict, fault, left, now_ns);
            traced.push((index as u32, r));
        }
        done.push(Completion {
            pred: s.pred,
            outs_start: outs_start as u32,
            outs_end: out.recs.len() as u32,
            own: left,
            released: false,
        });
    }
    for (a, b) in st.xtxns.iter_mut().zip(core.xtxns.iter_mut()) {
        *a += *b;
        *b = 0;
    }
    st.yields += std::mem::take(&mut core.yields);
    created_any
}
