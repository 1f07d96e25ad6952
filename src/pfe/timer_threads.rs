//! The timer launcher: hands each due timer launch to dispatch, ahead of packet work, so it
//! runs as a microcode thread on whichever PPE thread is free next (paper §5: no PPE is
//! reserved for timer threads).
//!
//! Who launches: the PPE threads themselves look at the timers between batches (one clock
//! reading and one comparison), and launch what is due; a launcher thread sleeps on the
//! engine's clock until the next timer is due and launches it when no PPE thread has.
//! While every PPE thread is busy the launcher does not wake for each timer (on a machine
//! with as many PPE threads as cores, every such wake-up would take a core from one of
//! them): it waits until a PPE thread is about to park, which wakes it, and takes timers
//! back. A launch therefore never waits for the launcher while the PPE threads are busy
//! (it could not run before one of them finished its batch anyway), nor for a busy PPE
//! thread while another is idle: each launch wakes an idle PPE thread to run it, as long as
//! fewer PPE threads run than there are cores (dispatch's cap), except the first launch a
//! PPE thread makes between batches, which it runs itself.
//!
//! Stopping stops every launch, not only the launcher's: [`TimerState::stop`] sets the stop
//! flag under the lock every launch is made under, and whoever launches checks the flag
//! under that lock. So once `stop` returns no launch is made by anyone, and the launches
//! already made are the last that [`TimerState::wait_idle`] waits for (a PPE thread that
//! kept launching due timers between batches would otherwise keep it waiting for ever,
//! as soon as timers come due faster than one PPE thread runs them).
//!
//! A timer has at most one launch outstanding (queued or running). When a launch comes due
//! while the previous one has not finished, it is skipped and counted as an overrun, so a
//! slow timer thread never piles launches up behind it; periods nobody launched (the
//! launcher woke up more than a period late) are counted as missed, never caught up. The
//! periods before the engine started are not: they were nobody's to launch, and each timer
//! starts at its first period at or after the start ([`TimerState::start`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::dispatch::Dispatch;
use super::Shared;
use crate::sync::{Backoff, Parker, Unparker};
use crate::timer::{Launch, TimerError, TimerSet, TimerStatus};

/// The longest the launcher sleeps before looking at its stop flag again.
const MAX_SLEEP: Duration = Duration::from_millis(2);

/// What the launcher and the PPE threads share about timers.
pub(crate) struct TimerState {
    /// Per timer: its launches made plus those finished, odd while one is queued or
    /// running. Only the launcher (under the lock) makes it odd, only the thread that ran
    /// the launch makes it even: [`TimerState::wait_idle`] waits for each odd count it saw
    /// to move on, so it waits for the launches already made and for no later one.
    runs: Box<[AtomicU64]>,
    /// Every launch due before this clock reading has been handed to dispatch (0: the
    /// launcher has not looked yet).
    launched_before: AtomicU64,
    /// Launches handed to dispatch.
    launches: AtomicU64,
    /// Launches skipped because the timer's previous launch had not finished.
    overruns: AtomicU64,
    /// Periods skipped because the launcher woke up more than a period late.
    missed: AtomicU64,
    stop: AtomicBool,
    /// The timers, and room for the launches due; whoever launches holds the lock.
    set: Mutex<(TimerSet, Vec<Launch>)>,
    /// When the next launch is due (`u64::MAX`: never): the test a PPE thread makes between
    /// batches, without the lock.
    next_due: AtomicU64,
    /// Wakes the launcher thread (when a PPE thread is about to park, and at shutdown).
    launcher: Unparker,
}

/// Who calls [`TimerState::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum By {
    /// A PPE thread between batches: it pops next, so it runs the first launch itself.
    PpeThread,
    /// The launcher thread: every launch needs a PPE thread woken, if one is idle.
    Launcher,
}

/// The timer counters of a [`crate::pfe::Stats`] snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TimerCounts {
    pub launches: u64,
    pub overruns: u64,
    pub missed: u64,
}

impl TimerState {
    /// The state of `set`'s timers; `launcher` wakes the launcher thread.
    pub fn new(set: TimerSet, launcher: Unparker) -> Self {
        let timers = set.len();
        TimerState {
            next_due: AtomicU64::new(set.next_due_ns().unwrap_or(u64::MAX)),
            set: Mutex::new((set, Vec::with_capacity(timers))),
            launcher,
            runs: (0..timers).map(|_| AtomicU64::new(0)).collect(),
            launched_before: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// Called by the PPE thread that ran `launch`, after its output left.
    pub fn finished(&self, launch: &Launch) {
        self.runs[launch.timer].fetch_add(1, Ordering::Release);
    }

    /// The launches queued or running now, as (timer, its run count): what
    /// [`TimerState::all_finished`] checks.
    pub fn outstanding(&self) -> Vec<(usize, u64)> {
        (self.runs.iter().enumerate())
            .map(|(timer, runs)| (timer, runs.load(Ordering::Acquire)))
            .filter(|&(_, runs)| runs % 2 == 1)
            .collect()
    }

    /// Whether every launch in `launches` (from [`TimerState::outstanding`]) has finished,
    /// whatever was launched since.
    pub fn all_finished(&self, launches: &[(usize, u64)]) -> bool {
        (launches.iter()).all(|&(timer, runs)| self.runs[timer].load(Ordering::Acquire) != runs)
    }

    pub fn launched_before(&self) -> u64 {
        self.launched_before.load(Ordering::Acquire)
    }

    /// When the next launch is due (`u64::MAX`: never); every launch due before it has been
    /// handed to dispatch.
    pub fn next_due(&self) -> u64 {
        self.next_due.load(Ordering::Acquire)
    }

    /// Launches every timer due by `now` (a reading of the engine's clock), unless another
    /// thread is launching already. Cheap when nothing is due: PPE threads call it between
    /// batches.
    #[inline]
    pub fn poll(&self, dispatch: &Dispatch, now: u64, by: By) {
        if now >= self.next_due.load(Ordering::Acquire) {
            self.launch_due(dispatch, now, by);
        }
    }

    #[inline(never)]
    fn launch_due(&self, dispatch: &Dispatch, now: u64, by: By) {
        let Some(mut guard) = self.set.try_lock() else {
            return;
        };
        // Under the lock `stop` takes: once it has returned, nobody launches.
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        let (set, due) = &mut *guard;
        set.due(now, due);
        // A PPE thread pops right after polling: it runs the first launch itself, and only
        // the others need an idle thread woken.
        let mut wake = by == By::Launcher;
        for launch in due.drain(..) {
            self.missed.fetch_add(launch.missed, Ordering::Relaxed);
            let runs = &self.runs[launch.timer];
            // Even: the previous launch finished, and nobody else moves the count until
            // this one has (only `finished` does, once it has run).
            if runs.load(Ordering::Acquire) % 2 == 1 {
                self.overruns.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            runs.fetch_add(1, Ordering::AcqRel);
            self.launches.fetch_add(1, Ordering::Relaxed);
            dispatch.push_timer(launch, wake);
            wake = true;
        }
        // Saturating: at the clock's last reading, every launch due ever has been made.
        self.launched_before
            .fetch_max(now.saturating_add(1), Ordering::AcqRel);
        self.next_due
            .store(set.next_due_ns().unwrap_or(u64::MAX), Ordering::Release);
    }

    /// Called when the engine starts, before any launch: moves each timer on to its first
    /// period at or after `now` ([`TimerSet::rebase`]), so the periods before the start are
    /// not counted as missed.
    pub fn start(&self, now: u64) {
        let mut guard = self.set.lock();
        if self.stop.load(Ordering::Relaxed) {
            return;
        }
        guard.0.rebase(now);
        let next = guard.0.next_due_ns().unwrap_or(u64::MAX);
        self.next_due.store(next, Ordering::Release);
    }

    /// Every timer as it stands.
    pub fn status(&self) -> Vec<TimerStatus> {
        self.set.lock().0.status()
    }

    /// Applies `change` to the timers (under the lock launches are made under), then
    /// publishes when the next launch is due and unparks the launcher so that it sleeps
    /// until then, not until the old deadline (a launcher in the clock's own sleep, a
    /// plain sleep for the system clock, sees it when that ends: at most `MAX_SLEEP`).
    pub fn change(
        &self,
        change: impl FnOnce(&mut TimerSet) -> Result<TimerStatus, TimerError>,
    ) -> Result<TimerStatus, TimerError> {
        let status = {
            let mut guard = self.set.lock();
            let status = change(&mut guard.0)?;
            if !self.stop.load(Ordering::Relaxed) {
                let next = guard.0.next_due_ns().unwrap_or(u64::MAX);
                self.next_due.store(next, Ordering::Release);
            }
            status
        };
        self.launcher.unpark();
        Ok(status)
    }

    pub fn counts(&self) -> TimerCounts {
        TimerCounts {
            launches: self.launches.load(Ordering::Relaxed),
            overruns: self.overruns.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
        }
    }

    /// Stops every launch, by the launcher thread and by the PPE threads alike: when this
    /// returns, no launch is being made and none will be; those made before finish as
    /// usual ([`TimerState::wait_idle`]).
    pub fn stop(&self) {
        {
            // Taking the lock waits for a launch being made; the flag, set under it, is
            // seen by every later one.
            let _launching = self.set.lock();
            self.stop.store(true, Ordering::Relaxed);
            // Nothing is due any more: the PPE threads' test between batches stays cheap.
            self.next_due.store(u64::MAX, Ordering::Release);
        }
        self.launcher.unpark();
    }

    /// Waits until every launch queued or running when called has finished. Not for a
    /// moment with none in flight: while launches keep overlapping there may be none.
    pub fn wait_idle(&self, shared: &Shared) {
        let launches = self.outstanding();
        let backoff = Backoff::new();
        let mut watch = shared.dispatch.stall_watch();
        while !self.all_finished(&launches) {
            if backoff.is_completed() {
                shared.dispatch.check_stall(&mut watch);
                std::thread::sleep(Duration::from_micros(20));
            } else {
                backoff.snooze();
            }
        }
    }
}

/// The body of the launcher thread; `parker` is the one [`TimerState::new`] was given the
/// unparker of.
pub(crate) fn run(shared: Arc<Shared>, parker: Parker) {
    let st = shared
        .timers
        .as_ref()
        .expect("the launcher runs only when timers are configured");
    let clock = &*shared.clock;
    while !st.stop.load(Ordering::Relaxed) {
        st.poll(&shared.dispatch, clock.now_ns(), By::Launcher);
        let next = st.next_due();
        if next == u64::MAX {
            // Every timer is off (or the engine stops): a change or `stop` wakes us.
            parker.park_timeout(MAX_SLEEP);
        } else if shared.dispatch.all_active() {
            // The PPE threads launch between batches; the first to go idle wakes us.
            parker.park_timeout(MAX_SLEEP);
        } else {
            clock.sleep_until(next, MAX_SLEEP);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::pfe::dispatch::Popped;
    use crate::timer::TimerSpec;

    /// Two timers every 10 ns, due at 0 and 5, for an engine of one PPE thread (its
    /// dispatch and parker); the launcher's parker is returned to be kept.
    fn two_timers_one_ppe_thread() -> (TimerState, Dispatch, Vec<Parker>, Parker) {
        let set = TimerSet::new(TimerSpec::staggered(0, 2, 10, 0).unwrap()).unwrap();
        let launcher = Parker::new();
        let st = TimerState::new(set, launcher.unparker().clone());
        let (dispatch, parkers) = Dispatch::new(1, 1, 4, 2, None);
        (st, dispatch, parkers, launcher)
    }

    /// Pops the launch PPE thread 0 finds queued first.
    fn pop_launch(dispatch: &Dispatch, parker: &Parker) -> Launch {
        match dispatch.pop(0, parker) {
            Popped::Timer(l) => l,
            _ => panic!("a timer launch is queued"),
        }
    }

    #[test]
    fn a_poll_launches_what_is_due_once_and_counts_a_busy_timer_as_an_overrun() {
        let (st, dispatch, parkers, _launcher) = two_timers_one_ppe_thread();
        let pop = || pop_launch(&dispatch, &parkers[0]);

        st.poll(&dispatch, 4, By::Launcher);
        assert_eq!(st.counts().launches, 1);
        assert_eq!((st.next_due(), st.launched_before()), (5, 5));
        st.poll(&dispatch, 4, By::Launcher);
        assert_eq!(st.counts().launches, 1, "nothing new is due");

        // Timer 0's launch is still queued when its next period comes: an overrun.
        st.poll(&dispatch, 12, By::Launcher);
        let c = st.counts();
        assert_eq!((c.launches, c.overruns, st.next_due()), (2, 1, 15));
        let first = pop();
        assert_eq!((first.timer, first.scheduled_ns), (0, 0));
        let second = pop();
        assert_eq!((second.timer, second.scheduled_ns), (1, 5));
        st.finished(&first);
        st.finished(&second);
        assert_eq!(st.outstanding(), []);

        st.poll(&dispatch, 20, By::Launcher);
        assert_eq!(st.counts().launches, 4);
        assert_eq!(
            [pop().scheduled_ns, pop().scheduled_ns],
            [15, 20],
            "in order of schedule"
        );
    }

    /// How long a test waits for a thread before it fails: a deadline for a hang, never a
    /// measure of speed.
    const PATIENCE: Duration = Duration::from_secs(30);

    /// A due launch runs on an idle PPE thread while another is busy (paper §5: on whichever
    /// PPE thread is free); a PPE thread launching between batches runs its first launch
    /// itself and wakes nobody for it.
    #[test]
    fn a_due_launch_wakes_an_idle_ppe_thread_unless_the_launching_one_runs_it() {
        use std::sync::mpsc;
        // Two timers every 10 ns, due at 0 and 5.
        let set = TimerSet::new(TimerSpec::staggered(0, 2, 10, 0).unwrap()).unwrap();
        let launcher = Parker::new();
        let st = TimerState::new(set, launcher.unparker().clone());
        // PPE thread 0 is this test: busy, it pops only when told. Thread 1 is real.
        let (dispatch, mut parkers) = Dispatch::new(2, 2, 4, 2, None);
        let dispatch = Arc::new(dispatch);
        let parker1 = parkers.pop().unwrap();
        let (tx, rx) = mpsc::channel();
        let d = Arc::clone(&dispatch);
        let ppe1 = std::thread::spawn(move || loop {
            match d.pop(1, &parker1) {
                Popped::Timer(l) => tx.send(l).unwrap(),
                Popped::Batch(_) => unreachable!("no batch is pushed"),
                Popped::Closed => return,
            }
        });
        let idle = |what: &str| {
            let deadline = std::time::Instant::now() + PATIENCE;
            while dispatch.all_active() {
                assert!(std::time::Instant::now() < deadline, "{what}");
                std::thread::yield_now();
            }
        };
        idle("PPE thread 1 never went idle");

        // The launcher launches timer 0 while thread 0 is busy: thread 1 is woken for it.
        st.poll(&dispatch, 0, By::Launcher);
        let l = rx
            .recv_timeout(PATIENCE)
            .expect("the idle PPE thread runs the launch while the other is busy");
        assert_eq!(l.timer, 0);
        st.finished(&l);
        idle("PPE thread 1 never went idle again");

        // Thread 0 launches timer 1 between batches: it pops it itself, nobody is woken.
        st.poll(&dispatch, 5, By::PpeThread);
        assert!(!dispatch.all_active(), "thread 1 was woken for nothing");
        match dispatch.pop(0, &parkers[0]) {
            Popped::Timer(l) => st.finished(&l),
            _ => panic!("the launch is queued for thread 0"),
        }

        // Both due at once, launched by thread 0: thread 1 is woken for the second.
        st.poll(&dispatch, 15, By::PpeThread);
        let l = rx
            .recv_timeout(PATIENCE)
            .expect("the idle PPE thread runs the second launch");
        st.finished(&l);
        dispatch.close();
        ppe1.join().unwrap();
        assert_eq!(rx.try_iter().count() + 1, 2, "thread 1 ran both launches");
        assert_eq!(st.counts().launches, 4);
    }

    /// What `wait_idle` waits for: the launches made before it, not the later ones.
    #[test]
    fn the_launches_waited_for_are_those_already_made() {
        let (st, dispatch, parkers, _launcher) = two_timers_one_ppe_thread();
        let pop = || pop_launch(&dispatch, &parkers[0]);
        assert!(st.all_finished(&st.outstanding()), "nothing launched yet");
        st.poll(&dispatch, 0, By::Launcher);
        let first = pop();
        let made = st.outstanding();
        assert_eq!(made.len(), 1);
        assert!(!st.all_finished(&made));
        // Timer 1 is launched after the look; timer 0's launch finishes, and its next one
        // is made: neither later launch is waited for.
        st.poll(&dispatch, 5, By::Launcher);
        let second = pop();
        st.finished(&first);
        st.poll(&dispatch, 10, By::Launcher);
        assert_eq!(
            st.outstanding().len(),
            2,
            "both timers have a launch outstanding"
        );
        assert!(
            st.all_finished(&made),
            "the launch made before has finished"
        );
        st.finished(&second);
        st.finished(&pop());
        assert_eq!(st.outstanding(), []);
    }

    #[test]
    fn after_stop_nobody_launches_what_is_due() {
        let set = TimerSet::new(TimerSpec::staggered(0, 2, 10, 0).unwrap()).unwrap();
        let launcher = Parker::new();
        let st = TimerState::new(set, launcher.unparker().clone());
        let (dispatch, _parkers) = Dispatch::new(1, 1, 4, 2, None);
        st.poll(&dispatch, 0, By::Launcher);
        assert_eq!(st.counts().launches, 1);
        st.stop();
        assert_eq!(
            st.next_due(),
            u64::MAX,
            "nothing is due for a PPE thread's test"
        );
        // A PPE thread between batches, long after both timers came due.
        st.launch_due(&dispatch, 1_000, By::Launcher);
        assert_eq!(
            st.counts().launches,
            1,
            "a stopped timer state launches nothing"
        );
    }
}
