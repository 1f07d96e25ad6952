//! The timer launcher: one OS thread that sleeps on the engine's clock until the next timer
//! is due, then hands each due launch to dispatch, ahead of packet work, so it runs as a
//! microcode thread on whichever PPE thread is free next (paper §5: no PPE is reserved for
//! timer threads).
//!
//! A timer has at most one launch outstanding (queued or running). When a launch comes due
//! while the previous one has not finished, it is skipped and counted as an overrun, so a
//! slow timer thread never piles launches up behind it; periods the launcher itself missed
//! (it woke up late by more than a period) are counted as missed, never caught up.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use crate::sync::Backoff;
use crate::timer::{Launch, TimerSet};

/// The longest the launcher sleeps before looking at its stop flag again.
const MAX_SLEEP: Duration = Duration::from_millis(2);

/// What the launcher and the PPE threads share about timers.
pub(crate) struct TimerState {
    /// Per timer: a launch is queued or running.
    busy: Box<[AtomicBool]>,
    /// Launches handed to dispatch and not finished yet.
    in_flight: AtomicU64,
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
}

/// The timer counters of a [`crate::pfe::Stats`] snapshot.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TimerCounts {
    pub launches: u64,
    pub overruns: u64,
    pub missed: u64,
}

impl TimerState {
    pub fn new(timers: usize) -> Self {
        TimerState {
            busy: (0..timers).map(|_| AtomicBool::new(false)).collect(),
            in_flight: AtomicU64::new(0),
            launched_before: AtomicU64::new(0),
            launches: AtomicU64::new(0),
            overruns: AtomicU64::new(0),
            missed: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        }
    }

    /// Called by the PPE thread that ran `launch`, after its output left.
    pub fn finished(&self, launch: &Launch) {
        self.busy[launch.timer].store(false, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::Release);
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }

    pub fn launched_before(&self) -> u64 {
        self.launched_before.load(Ordering::Acquire)
    }

    pub fn counts(&self) -> TimerCounts {
        TimerCounts {
            launches: self.launches.load(Ordering::Relaxed),
            overruns: self.overruns.load(Ordering::Relaxed),
            missed: self.missed.load(Ordering::Relaxed),
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Waits until no launch is queued or running.
    pub fn wait_idle(&self, shared: &Shared) {
        let backoff = Backoff::new();
        let mut watch = shared.dispatch.stall_watch();
        while self.in_flight() > 0 {
            if backoff.is_completed() {
                shared.dispatch.check_stall(&mut watch);
                std::thread::sleep(Duration::from_micros(20));
            } else {
                backoff.snooze();
            }
        }
    }
}

/// The body of the launcher thread.
pub(crate) fn run(shared: Arc<Shared>, mut set: TimerSet) {
    let st = shared
        .timers
        .as_ref()
        .expect("the launcher runs only when timers are configured");
    let clock = &*shared.clock;
    let mut due: Vec<Launch> = Vec::with_capacity(set.len());
    while !st.stop.load(Ordering::Acquire) {
        let now = clock.now_ns();
        set.due(now, &mut due);
        for launch in due.drain(..) {
            st.missed.fetch_add(launch.missed, Ordering::Relaxed);
            if st.busy[launch.timer].swap(true, Ordering::AcqRel) {
                st.overruns.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            st.in_flight.fetch_add(1, Ordering::AcqRel);
            st.launches.fetch_add(1, Ordering::Relaxed);
            shared.dispatch.push_timer(launch);
        }
        st.launched_before.fetch_max(now + 1, Ordering::AcqRel);
        match set.next_due_ns() {
            Some(next) => clock.sleep_until(next, MAX_SLEEP),
            None => return,
        }
    }
}
