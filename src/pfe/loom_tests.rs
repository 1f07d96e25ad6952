//! Loom models of the hand-written protocols, run on the real [`Dispatch`],
//! [`ReorderStage::finish`] and [`RoomWait`] code with `crate::sync` backed by loom:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom_tests
//! ```
//!
//! Each model sets the preemption bound that keeps it to seconds (`None`: every
//! interleaving); `LOOM_MAX_PREEMPTIONS` overrides it for all of them, and
//! `LOOM_LOG=1 LOOM_LOCATION=1` explain a failure.
//!
//! The models can fail. Each of these edits, made one at a time and reverted, was caught
//! (the close-only model has no batches, so it cannot see the dispatch ones):
//! - `Dispatch::push` without its `SeqCst` fence, `Dispatch::pop` without the fence
//!   between leaving `active` and its last look, or without the last look at all: a lost
//!   wake-up (the pusher saw the consumer still active, the consumer's last look missed
//!   the batch, it parked); every model with batches deadlocks.
//! - `ReorderStage::finish` without the fence after unlocking, without the fence before
//!   `try_lock`, or returning right after unlocking (no second look): a batch pushed by a
//!   thread that found the lock taken is stranded; both `finish` models fail on it.
//!
//! - `Dispatch::pop`'s last look before parking without the timer queue (only batches):
//!   the timer model deadlocks on a stranded launch.
//! - `RoomWait::wait` without its fence between registering in `waiting` and looking at
//!   the in-flight count, `RoomWait::release` without its fence between the decrement and
//!   reading `waiting`, or `RoomWait::wait` waiting without its second look under the
//!   lock: a lost wake-up (the releaser saw nobody waiting, or notified before the wait
//!   began, while the waiter saw no room and waited); every `room_` model deadlocks on it.
//!   (The real wait has a 1 ms timeout that turns this into a stall; the model's condition
//!   variable has none, see `crate::sync`.)
//!
//! - `Dispatch::observe` loading the epoch `Relaxed` (not `Acquire`), or
//!   `Dispatch::quiescent_since` answering true without looking: a packet that saw the
//!   removed job writes after the grace period; `grace_period_waits_for_a_batch_in_flight`
//!   fails on it. (The idle model's batch comes after the removal, ordered by the queue
//!   itself: it checks that a grace period ends with the consumer idle, parked or not yet
//!   started, and cannot see these two.)
//!
//! Most dispatch models close after a drain, as `Pfe::stop` does; one closes right after
//! pushing. That model found a real bug: a consumer that gave up spinning just before the
//! push saw `closed` and returned `Popped::Closed` without another look at the queue,
//! stranding the batch. `pop` now takes a last look when it sees the close.

use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

use super::batch::Batch;
use super::dispatch::{Dispatch, Popped};
use super::egress::{Discard, PortQueues, TxCounters};
use super::reorder::{Outlet, ReorderStage};
use super::room::RoomWait;
use crate::timer::Launch;

/// Runs `f` under every interleaving with at most `preemptions` preemptions (`None`: any
/// number), unless `LOOM_MAX_PREEMPTIONS` is set.
fn check(preemptions: Option<usize>, f: impl Fn() + Send + Sync + 'static) {
    let mut builder = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        builder.preemption_bound = preemptions;
    }
    builder.check(f);
}

/// A count threads add to and another blocks on until it reaches a target. Blocking (not
/// spinning) matters: a thread waiting for a batch a lost wake-up stranded then leaves
/// every thread blocked, which loom reports as a deadlock.
#[derive(Default)]
struct Tally {
    n: Mutex<usize>,
    cv: Condvar,
}

impl Tally {
    fn add(&self) {
        *self.n.lock().unwrap() += 1;
        self.cv.notify_all();
    }

    fn wait_for(&self, target: usize) {
        let mut n = self.n.lock().unwrap();
        while *n < target {
            n = self.cv.wait(n).unwrap();
        }
    }
}

/// `consumers` PPE threads pop until closed; the model's main thread pushes `batches`,
/// waits until all of them were popped (a lost wake-up deadlocks here), then closes
/// dispatch the way `Pfe::stop` does, after the drain (a consumer that parks and misses
/// the close deadlocks the joins). Every batch is popped once.
fn dispatch_model(consumers: usize, max_active: usize, batches: usize, preemptions: Option<usize>) {
    dispatch_model_closing(consumers, max_active, batches, 0, true, preemptions)
}

/// [`dispatch_model`] with `timers` timer launches pushed after the batches, optionally
/// closing right after the pushes instead of after the drain: `close` promises that queued
/// work is still done.
fn dispatch_model_closing(
    consumers: usize,
    max_active: usize,
    batches: usize,
    timers: usize,
    drain_first: bool,
    preemptions: Option<usize>,
) {
    check(preemptions, move || {
        let (dispatch, parkers) = Dispatch::new(consumers, max_active, batches, timers, None);
        let dispatch = Arc::new(dispatch);
        let popped = Arc::new(Tally::default());
        let threads: Vec<_> = parkers
            .into_iter()
            .enumerate()
            .map(|(me, parker)| {
                let dispatch = dispatch.clone();
                let popped = popped.clone();
                thread::spawn(move || {
                    let mut mine = 0;
                    loop {
                        match dispatch.pop(me, &parker) {
                            Popped::Batch(_) | Popped::Timer(_) => {
                                mine += 1;
                                popped.add();
                            }
                            Popped::Closed => return mine,
                        }
                    }
                })
            })
            .collect();
        for _ in 0..batches {
            dispatch.push(Box::default());
        }
        for timer in 0..timers {
            dispatch.push_timer(
                Launch {
                    timer,
                    entry: 0,
                    slice: 0,
                    slices: 1,
                    scheduled_ns: 0,
                    missed: 0,
                },
                true,
            );
        }
        if drain_first {
            popped.wait_for(batches + timers);
        }
        dispatch.close();
        let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(total, batches + timers);
    });
}

// Run times: release build, one model at a time, on two cores.

/// About 28,000 executions, 1 s.
#[test]
fn dispatch_one_consumer_two_batches() {
    dispatch_model(1, 1, 2, Some(5));
}

/// About 390,000 executions, 20-25 s.
#[test]
fn dispatch_two_consumers_two_batches() {
    dispatch_model(2, 2, 2, Some(3));
}

/// More PPE threads than may run at once (the usual configuration): only an engine with
/// no active thread wakes one. About 14,000 executions, 1 s.
#[test]
fn dispatch_two_consumers_capped() {
    dispatch_model(2, 1, 2, Some(2));
}

/// Three batches with a backlog threshold of two: the pusher may also wake the second
/// consumer for the backlog. About 23,000 executions, 1 s.
#[test]
fn dispatch_two_consumers_backlog() {
    dispatch_model(2, 2, 3, Some(2));
}

/// `close` right after a push, with no drain: the batch is still popped before every
/// consumer exits.
#[test]
fn dispatch_close_right_after_push() {
    dispatch_model_closing(1, 1, 1, 0, false, Some(4));
    dispatch_model_closing(2, 2, 1, 0, false, Some(3));
}

/// A timer launch pushed while the consumers go idle is taken (it has a queue of its own,
/// which the last look before parking must cover), alone and behind a batch.
#[test]
fn dispatch_timer_launch_is_never_stranded() {
    dispatch_model_closing(2, 1, 0, 1, true, Some(3));
    dispatch_model_closing(1, 1, 1, 1, true, Some(3));
    dispatch_model_closing(1, 1, 0, 1, false, Some(4));
}

/// No work at all: `close` races the consumers going idle and parking, and must still
/// get every one of them out with `Popped::Closed`. About 130,000 executions, 7 s.
#[test]
fn dispatch_close_wakes_parked_consumers() {
    dispatch_model(2, 2, 0, Some(4));
}

/// A grace period (dispatch step 6) against a PPE thread running packets of a "job" the
/// model's main thread removes: a packet that saw the job writes a "block". The main thread
/// queues a batch, removes the job, waits for a grace period, sweeps the block and queues
/// another batch. No block may survive the sweep: a packet that saw the job must be done
/// when the grace period ends, and a packet taken afterwards must not see the job. With
/// `park_first`, the consumer may park before the first push (the idle stack's path).
fn grace_model(park_first: bool, preemptions: Option<usize>) {
    check(preemptions, move || {
        let (dispatch, mut parkers) = Dispatch::new(1, 1, 2, 0, None);
        let dispatch = Arc::new(dispatch);
        let job = Arc::new(AtomicU64::new(1));
        let block = Arc::new(AtomicU64::new(0));
        let parker = parkers.pop().unwrap();
        let consumer = {
            let (dispatch, job, block) = (dispatch.clone(), job.clone(), block.clone());
            thread::spawn(move || {
                dispatch.enter(0);
                loop {
                    match dispatch.pop(0, &parker) {
                        Popped::Batch(_) | Popped::Timer(_) => {
                            if job.load(Ordering::Relaxed) == 1 {
                                block.store(1, Ordering::Relaxed);
                            }
                        }
                        Popped::Closed => return,
                    }
                }
            })
        };
        if !park_first {
            dispatch.push(Box::default());
        }
        job.store(0, Ordering::Relaxed);
        let target = dispatch.begin_grace();
        while !dispatch.quiescent_since(target, 0) {
            thread::yield_now();
        }
        block.store(0, Ordering::Relaxed);
        dispatch.push(Box::default());
        dispatch.close();
        consumer.join().unwrap();
        assert_eq!(
            block.load(Ordering::Relaxed),
            0,
            "a packet that saw the removed job wrote after the grace period"
        );
    });
}

/// A batch in flight across the removal: the grace period waits for it.
#[test]
fn grace_period_waits_for_a_batch_in_flight() {
    grace_model(false, Some(3));
}

/// No batch before the removal: the consumer may be idle, parked or about to park when
/// the grace period looks, and the batch after it must not see the job.
#[test]
fn grace_period_with_an_idle_consumer() {
    grace_model(true, Some(3));
}

/// `threads` threads (the model's main thread one of them) each finish one batch at the
/// same time. Every batch is completed and retired exactly once: none is stranded in the
/// queue when the last `finish` returns, and none is completed twice.
fn finish_model(threads: usize, preemptions: Option<usize>) {
    assert!(threads < usize::BITS as usize);
    check(preemptions, move || {
        let stage = Arc::new(ReorderStage::new(64));
        // Bit `id` is set when batch `id` is retired.
        let retired = Arc::new(AtomicUsize::new(0));
        let finish = {
            let stage = stage.clone();
            let retired = retired.clone();
            move |id: u8| {
                let mut batch = Box::<Batch>::default();
                // The batch's mark; it holds no packets, so completing it releases nothing.
                batch.frames.push(id);
                batch.seq = u64::from(id) + 1;
                let tx = TxCounters::new(1, 1);
                let out = Outlet::plain(&Discard, &tx);
                stage.finish(batch, out, &mut PortQueues::new(1), |b, released| {
                    assert_eq!(released, 0);
                    let Some(b) = b else { return };
                    let bit = 1 << b.frames[0];
                    let before = retired.fetch_or(bit, Ordering::Relaxed);
                    assert_eq!(before & bit, 0, "batch {} completed twice", b.frames[0]);
                });
            }
        };
        let others: Vec<_> = (1..threads as u8)
            .map(|id| {
                let finish = finish.clone();
                thread::spawn(move || finish(id))
            })
            .collect();
        finish(0);
        for t in others {
            t.join().unwrap();
        }
        let all = (1usize << threads) - 1;
        let retired = retired.load(Ordering::Relaxed);
        assert_eq!(retired, all, "stranded batches: {:#b}", all & !retired);
    });
}

/// Every interleaving (about 600 executions).
#[test]
fn finish_two_threads() {
    finish_model(2, None);
}

/// About 90,000 executions, 5 s.
#[test]
fn finish_three_threads() {
    finish_model(3, Some(4));
}

/// An engine of capacity 4 is full; `waiters` injectors wait for room for one packet (to
/// 3 in flight, where a release wakes them: a quarter free), while the model's main thread
/// releases `releases` packets one at a time, as PPE threads retiring batches do. Every
/// waiter must wake: a lost wake-up leaves one blocked for ever, a deadlock (the model's
/// wait has no timeout).
fn room_model(waiters: usize, releases: u64, preemptions: Option<usize>) {
    check(preemptions, move || {
        const CAPACITY: u64 = 4;
        let room = Arc::new(RoomWait::new(CAPACITY));
        let in_flight = Arc::new(AtomicU64::new(CAPACITY));
        let resume_at = CAPACITY - (CAPACITY / 4).max(1);
        // No work is ever queued: the stall checks between waits wake nobody.
        let (dispatch, _parkers) = Dispatch::new(1, 1, 1, 0, None);
        let dispatch = Arc::new(dispatch);
        let threads: Vec<_> = (0..waiters)
            .map(|_| {
                let (room, in_flight) = (room.clone(), in_flight.clone());
                let dispatch = dispatch.clone();
                thread::spawn(move || {
                    room.wait(&in_flight, resume_at, || Some(&*dispatch));
                    assert!(in_flight.load(Ordering::Relaxed) <= resume_at);
                })
            })
            .collect();
        for _ in 0..releases {
            room.release(&in_flight, 1);
        }
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(room.waiting(), 0);
    });
}

/// One waiter, one release: every interleaving.
#[test]
fn room_one_waiter_one_release() {
    room_model(1, 1, None);
}

/// Two waiters woken by one notification.
#[test]
fn room_two_waiters_one_release() {
    room_model(2, 1, Some(3));
}

/// Two releases, the first of which already frees the room: the second finds the waiter
/// gone or still waking.
#[test]
fn room_one_waiter_two_releases() {
    room_model(1, 2, Some(3));
}
