//! Dispatch: hands batches of packet heads to whichever PPE thread is available.
//!
//! The protocol, in steps (see also `DESIGN` notes in the crate docs):
//! 1. Ingress pushes a batch on one shared lock-free queue.
//! 2. A PPE thread pops batches until the queue is empty, then spins briefly (a few
//!    rounds of [`Backoff::snooze`]), then goes idle: it leaves the `active` count, pushes
//!    itself on the idle stack, checks the queue once more (so a batch pushed meanwhile is
//!    never stranded) and parks.
//! 3. After each push, the pusher wakes one idle thread only when no thread is active, or
//!    when a backlog builds and fewer threads are active than the machine has cores. A
//!    thread that pops a batch while a backlog remains wakes a peer under the same rule.
//!    So work spreads without waking a thread per packet, hundreds of PPE threads cost
//!    nothing while idle, and a busy engine runs about as many as there are cores to run
//!    them (more would only take turns on the same cores and hold each other's flows in
//!    the reorder engine while descheduled).
//! 4. Timer launches have a queue of their own that every pop looks at first, so a timer
//!    thread runs on the next PPE thread that becomes free, ahead of queued packets (it
//!    never preempts a running one). Pushing a launch wakes an idle thread whenever fewer
//!    threads are active than step 3's cap (the cores): a due launch does not wait for a
//!    busy thread while another could run it at once. A PPE thread that launches between
//!    batches runs its first launch itself (it pops next) and wakes no one for it, so a busy
//!    engine's own launches wake nobody; each launch wakes at most one thread, so timers
//!    cannot cause a wake-up storm. A thread's last look before parking covers both queues.
//!    While every PPE thread is active, they also launch due timers themselves between
//!    batches, so the launcher thread need not wake (and take a core from them) for each
//!    one: a thread about to park wakes the launcher, which takes timers back (see
//!    `pfe::timer_threads`).
//! 5. A waiter (for room, or for a drain) that sees work queued but no batch taken for a
//!    millisecond wakes one more thread regardless of the cap: the active threads may be
//!    blocked inside a program (a sleeping or waiting closure), and queued work must not
//!    wait for them. Progress resets the watch, so a merely busy engine wakes nobody.
//!
//! The store/load pairs of steps 2, 3 and 4 are separated by `SeqCst` fences (a Dekker
//! pattern): either the pusher sees the thread leave `active` and wakes it, or the thread
//! sees the batch in its last check.
//!
//! 6. Grace periods (RCU-style, for memory the control plane retires while packets run;
//!    [`crate::pfe::Control::wait_quiescent`]). A waiter bumps the shared `epoch`
//!    (`SeqCst`, after its own retiring writes) and then watches each PPE thread until the
//!    thread has either taken work since (its `seen` slot, which it stores only when the
//!    epoch it loads at a pop differs from its last, reaches the waiter's epoch) or sits on
//!    the idle stack (it pushed itself there after finishing everything it had). A thread
//!    loads the epoch with `Acquire` after each pop, before running anything: if it loads
//!    the waiter's epoch, it sees every write the waiter made before bumping it; if it
//!    loads an older one, its batch counts as old and the waiter waits for the next pop's
//!    `Release` store (or the idle stack's lock), which follows that batch's last access.
//!    The packet path pays one load of a line written once per grace period and, only then,
//!    one store into a line of its own. A thread not started or exited holds `u64::MAX`
//!    (nothing in hand); a starting thread publishes 0 and fences (`SeqCst`) before its
//!    first pop, against the waiter's fence after its bump (Dekker again: the waiter sees
//!    the thread, or the thread's first load sees the new epoch).

use std::time::Duration;

use super::batch::Batch;
use super::profile::timed;
use crate::sync::{
    fence, ArrayQueue, AtomicBool, AtomicU64, AtomicUsize, Backoff, CachePadded, Instant, Mutex,
    Ordering, Parker, Unparker,
};
use crate::timer::Launch;

pub(crate) struct Dispatch {
    queue: ArrayQueue<Box<Batch>>,
    /// Timer launches, taken before batches. Each timer has at most one launch queued or
    /// running (the launcher skips a timer that is still busy), so this never fills.
    timers: ArrayQueue<Launch>,
    /// PPE threads not parked (running or about to run).
    active: CachePadded<AtomicUsize>,
    /// Parked PPE threads, most recently parked on top (it has the warmest cache).
    idle: Mutex<Vec<usize>>,
    unparkers: Vec<Unparker>,
    /// Set once at shutdown; threads exit when it is set and the queue is empty.
    closed: AtomicBool,
    /// Threads woken for a backlog at most (the cores available).
    max_active: usize,
    /// Batches taken so far, by PPE thread (modulo the shards, each on its own cache line
    /// so that pops on different cores do not pass one line between them): the progress a
    /// stalled waiter watches, summed.
    taken: Box<[CachePadded<AtomicU64>]>,
    /// Woken whenever a thread is about to park (the timer launcher's parker).
    on_idle: Option<Unparker>,
    /// Grace periods begun (step 6); each waiter bumps it.
    epoch: CachePadded<AtomicU64>,
    /// By PPE thread, each on its own line: the epoch it loaded at its last pop when that
    /// changed (step 6); `u64::MAX` while it has not started or has exited.
    seen: Box<[CachePadded<AtomicU64>]>,
}

/// A backlog: this many batches queued. From it on, ingress fills bigger batches
/// ([`Dispatch::backlogged`]); above it, a push or a pop wakes one more thread (step 3).
const BACKLOG: usize = 2;

/// Shards of the taken count at most (threads beyond share them).
const TAKEN_SHARDS: usize = 16;

/// How long queued work may sit with no batch taken before a waiter wakes another thread.
const STALL: Duration = Duration::from_millis(1);

/// What a waiter remembers between looks at the engine (step 5).
pub(crate) struct StallWatch {
    taken: u64,
    since: Instant,
}

pub(crate) enum Popped {
    Batch(Box<Batch>),
    Timer(Launch),
    Closed,
}

impl Dispatch {
    /// A dispatcher for `threads` PPE threads and `timers` timers; returns the parkers each
    /// thread parks on. `on_idle` is unparked whenever a thread is about to park.
    pub fn new(
        threads: usize,
        max_active: usize,
        queue_capacity: usize,
        timers: usize,
        on_idle: Option<Unparker>,
    ) -> (Dispatch, Vec<Parker>) {
        let parkers: Vec<Parker> = (0..threads).map(|_| Parker::new()).collect();
        let unparkers = parkers.iter().map(|p| p.unparker().clone()).collect();
        let d = Dispatch {
            queue: ArrayQueue::new(queue_capacity.max(1)),
            timers: ArrayQueue::new(timers.max(1)),
            active: CachePadded::new(AtomicUsize::new(threads)),
            idle: Mutex::new(Vec::with_capacity(threads)),
            unparkers,
            closed: AtomicBool::new(false),
            max_active: max_active.max(1),
            taken: (0..threads.clamp(1, TAKEN_SHARDS))
                .map(|_| CachePadded::new(AtomicU64::new(0)))
                .collect(),
            on_idle,
            epoch: CachePadded::new(AtomicU64::new(0)),
            seen: (0..threads)
                .map(|_| CachePadded::new(AtomicU64::new(u64::MAX)))
                .collect(),
        };
        (d, parkers)
    }

    /// Whether a backlog waits: at least [`BACKLOG`] batches queued (a snapshot), so every
    /// running PPE thread has work behind its own. Ingress then fills bigger batches.
    #[inline]
    pub fn backlogged(&self) -> bool {
        self.queue.len() >= BACKLOG
    }

    /// Queues a batch. The caller has reserved in-flight capacity, and the queue holds at
    /// least as many batches as the capacity allows packets, so this cannot fail.
    pub fn push(&self, batch: Box<Batch>) {
        if self.queue.push(batch).is_err() {
            unreachable!("dispatch queue sized to the in-flight capacity");
        }
        fence(Ordering::SeqCst);
        self.maybe_wake();
    }

    /// Queues a timer launch ahead of the batches (step 4) and, if `wake`, wakes an idle
    /// thread to run it while fewer threads are active than may run at once. A PPE thread
    /// pushing between batches passes `wake: false` for the launch it will pop itself.
    /// The caller (the launcher) keeps at most one launch per timer outstanding, so this
    /// cannot fail.
    pub fn push_timer(&self, launch: Launch, wake: bool) {
        if self.timers.push(launch).is_err() {
            unreachable!("timer queue sized to the number of timers");
        }
        fence(Ordering::SeqCst);
        // `max_active` may exceed the threads there are (it is the cores).
        let limit = self.max_active.min(self.unparkers.len());
        if wake && self.active.load(Ordering::Relaxed) < limit {
            self.wake_one();
        }
    }

    /// Work is queued: a timer launch or a batch.
    fn has_work(&self) -> bool {
        !self.timers.is_empty() || !self.queue.is_empty()
    }

    fn maybe_wake(&self) {
        let active = self.active.load(Ordering::Relaxed);
        if active == 0 || (active < self.max_active && self.queue.len() > BACKLOG) {
            self.wake_one();
        }
    }

    /// Every PPE thread is active (none parked or about to park).
    pub fn all_active(&self) -> bool {
        self.active.load(Ordering::Acquire) >= self.unparkers.len()
    }

    /// Batches and launches taken so far.
    fn taken(&self) -> u64 {
        self.taken.iter().map(|t| t.load(Ordering::Relaxed)).sum()
    }

    /// Counts one taken by PPE thread `me`.
    #[inline]
    fn took(&self, me: usize) {
        self.taken[me % self.taken.len()].fetch_add(1, Ordering::Relaxed);
    }

    /// Starts watching for a stall.
    pub fn stall_watch(&self) -> StallWatch {
        StallWatch {
            taken: self.taken(),
            since: Instant::now(),
        }
    }

    /// Called by a thread waiting on the engine: if work has been queued with no batch
    /// taken for [`STALL`], wake one more PPE thread even past the cap (step 4).
    pub fn check_stall(&self, w: &mut StallWatch) {
        let taken = self.taken();
        if taken != w.taken {
            *w = StallWatch {
                taken,
                since: Instant::now(),
            };
        } else if w.since.elapsed() >= STALL {
            if self.has_work() {
                self.wake_one();
            }
            w.since = Instant::now();
        }
    }

    fn wake_one(&self) -> bool {
        let me = {
            let mut idle = self.idle.lock();
            let Some(me) = idle.pop() else { return false };
            // Counted active before it runs, so another pusher does not wake a second one.
            self.active.fetch_add(1, Ordering::SeqCst);
            me
        };
        self.unparkers[me].unpark();
        true
    }

    /// Next timer launch or batch for PPE thread `me`, parking while there is none.
    /// `Closed` once the engine shuts down and both queues are empty.
    #[cfg_attr(not(test), allow(dead_code))] // the tests pop; the PPE threads pop_timed
    pub fn pop(&self, me: usize, parker: &Parker) -> Popped {
        self.pop_timed::<false>(me, parker, &mut 0)
    }

    /// [`Dispatch::pop`], adding the nanoseconds spent parked to `parked_ns` when
    /// `PROFILE` (see `pfe::profile`).
    pub fn pop_timed<const PROFILE: bool>(
        &self,
        me: usize,
        parker: &Parker,
        parked_ns: &mut u64,
    ) -> Popped {
        let park = |parked_ns: &mut u64| timed::<PROFILE, _>(parked_ns, || parker.park());
        loop {
            if let Some(job) = self.pop_spinning() {
                self.took(me);
                self.observe(me);
                if let Popped::Batch(_) = job {
                    self.maybe_wake();
                }
                return job;
            }
            if self.closed.load(Ordering::Acquire) {
                // Work pushed before the close is visible now (the close's store is ordered
                // after the push), and queued work is done before anyone exits.
                if let Some(job) = self.pop_any() {
                    self.took(me);
                    self.observe(me);
                    return job;
                }
                // Exited: it holds nothing a grace period waits for (step 6).
                self.seen[me].store(u64::MAX, Ordering::Release);
                return Popped::Closed;
            }
            // Go idle: leave `active`, then take a last look before parking.
            self.idle.lock().push(me);
            self.active.fetch_sub(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.has_work() || self.closed.load(Ordering::Acquire) {
                if self.unidle(me) {
                    continue;
                }
                // Someone already popped us from the idle stack and will unpark us: take
                // that token now so it does not cut a later park short.
                park(parked_ns);
                continue;
            }
            if let Some(hook) = &self.on_idle {
                hook.unpark();
            }
            loop {
                park(parked_ns);
                // A waker removes us from the idle stack before unparking; if we are still
                // on it, this was a spurious wake-up.
                if !self.idle.lock().contains(&me) {
                    break;
                }
                if self.closed.load(Ordering::Acquire) {
                    self.unidle(me);
                    break;
                }
            }
        }
    }

    /// PPE thread `me` starts: from now on a grace period waits for it (step 6). Called
    /// once, before its first pop.
    pub fn enter(&self, me: usize) {
        self.seen[me].store(0, Ordering::Relaxed);
        // Against `begin_grace`'s fence: the waiter sees 0, or our first epoch load sees
        // its bump.
        fence(Ordering::SeqCst);
    }

    /// PPE thread `me` took work: publish the epoch it runs it under (step 6). One load of
    /// a line written once per grace period; a store only when the epoch moved.
    #[inline]
    fn observe(&self, me: usize) {
        let epoch = self.epoch.load(Ordering::Acquire);
        let seen = &self.seen[me];
        if seen.load(Ordering::Relaxed) != epoch {
            // Release: the work taken before (under an older epoch) is done.
            seen.store(epoch, Ordering::Release);
        }
    }

    /// Begins a grace period (step 6) after the caller's retiring writes; returns the
    /// epoch [`Dispatch::quiescent_since`] waits for.
    pub fn begin_grace(&self) -> u64 {
        let target = self.epoch.fetch_add(1, Ordering::SeqCst) + 1;
        fence(Ordering::SeqCst);
        target
    }

    /// Whether PPE thread `thread` has, since [`Dispatch::begin_grace`] returned `target`,
    /// taken work under that epoch or later, or is idle (holding nothing), or never
    /// started, or exited. Once true it stays true for that grace period.
    pub fn quiescent_since(&self, target: u64, thread: usize) -> bool {
        // `u64::MAX` (not started, exited) is above every target.
        if self.seen[thread].load(Ordering::Acquire) >= target {
            return true;
        }
        // On the idle stack: it pushed itself there (under this lock) after everything it
        // ran, and it loads the epoch again after the lock hands it back.
        self.idle.lock().contains(&thread)
    }

    /// PPE threads (for a grace period's waiter).
    pub fn threads(&self) -> usize {
        self.seen.len()
    }

    /// Removes `me` from the idle stack; true if it was there (we are active again).
    fn unidle(&self, me: usize) -> bool {
        let mut idle = self.idle.lock();
        if let Some(pos) = idle.iter().position(|&i| i == me) {
            idle.swap_remove(pos);
            self.active.fetch_add(1, Ordering::SeqCst);
            true
        } else {
            false
        }
    }

    /// A timer launch if one is queued, else a batch.
    fn pop_any(&self) -> Option<Popped> {
        if let Some(l) = self.timers.pop() {
            return Some(Popped::Timer(l));
        }
        self.queue.pop().map(Popped::Batch)
    }

    fn pop_spinning(&self) -> Option<Popped> {
        let backoff = Backoff::new();
        loop {
            if let Some(job) = self.pop_any() {
                return Some(job);
            }
            if backoff.is_completed() || self.closed.load(Ordering::Relaxed) {
                return None;
            }
            backoff.snooze();
        }
    }

    /// Lets every thread finish the queued work and exit.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let idle: Vec<usize> = std::mem::take(&mut *self.idle.lock());
        self.active.fetch_add(idle.len(), Ordering::SeqCst);
        for i in idle {
            self.unparkers[i].unpark();
        }
    }
}
