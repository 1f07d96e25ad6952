//! The engine's lifecycle: [`Pfe::start`] spawns the PPE threads and the timer launcher,
//! [`Pfe::drain`] and [`Pfe::settle_timers`] wait for the work already accepted, and
//! [`Pfe::shutdown`] (or dropping the engine) stops the timers, drains, closes dispatch and
//! joins every thread. The state only moves forward: built, running, stopped.

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_utils::Backoff;

use super::{ppe, timer_threads, Pfe, Stats, STATE_RUNNING, STATE_STOPPED};

/// Makes one of the engine's threads: [`std::thread::Builder::spawn`], or a test's stand-in.
pub(crate) type SpawnFn<'a> = dyn FnMut(std::thread::Builder, Box<dyn FnOnce() + Send>) -> std::io::Result<JoinHandle<()>>
    + 'a;

/// Why [`Pfe::start`] failed: the engine was stopped, or a thread could not be spawned.
/// Nothing else can fail a start (pinning threads to cores, [`Config::pin_threads`], is best
/// effort: a thread that cannot be pinned runs unpinned).
///
/// [`Config::pin_threads`]: super::Config::pin_threads
#[derive(Debug)]
#[non_exhaustive]
pub enum StartError {
    /// The engine was shut down; an engine cannot be restarted.
    Stopped,
    /// The operating system refused a thread (memory for its stack, a limit on threads or
    /// processes). The threads already started were stopped and joined, and the engine is
    /// shut down.
    Spawn {
        /// The thread that could not be spawned (`pfemu-ppe-N` or `pfemu-timers`).
        thread: String,
        /// PPE threads that had started.
        started: usize,
        /// PPE threads the engine is configured with.
        ppe_threads: usize,
        /// The operating system's error.
        reason: std::io::Error,
    },
}

impl fmt::Display for StartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartError::Stopped => f.write_str("the engine was shut down and cannot be restarted"),
            StartError::Spawn {
                thread,
                started,
                ppe_threads,
                reason,
            } => write!(
                f,
                "cannot spawn thread {thread}: {reason}; {started} of {ppe_threads} PPE threads \
                 had started (stopped again; fewer `ppe_threads`, or more memory or a higher \
                 thread limit, would let it start)"
            ),
        }
    }
}

impl std::error::Error for StartError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StartError::Spawn { reason, .. } => Some(reason),
            StartError::Stopped => None,
        }
    }
}

impl Pfe {
    /// Spawns the PPE threads. Starting a running engine does nothing; a shut-down engine
    /// cannot be restarted.
    pub fn start(&mut self) -> Result<(), StartError> {
        self.start_with(&mut |builder, body| builder.spawn(body))
    }

    /// [`Pfe::start`] with the threads made by `spawn` (tests inject failures here: the
    /// engine's own, and the lab's that start an engine, e.g. `replay`).
    pub(crate) fn start_with(&mut self, spawn: &mut SpawnFn<'_>) -> Result<(), StartError> {
        match self.shared.state.load(Ordering::Acquire) {
            STATE_RUNNING => return Ok(()),
            STATE_STOPPED => return Err(StartError::Stopped),
            _ => {}
        }
        let cores = if self.shared.cfg.pin_threads {
            core_affinity::get_core_ids().unwrap_or_default()
        } else {
            Vec::new()
        };
        if let Some(t) = &self.shared.timers {
            // The periods since the clock's epoch (the build, with the default clock) were
            // nobody's to launch: not missed.
            t.start(self.shared.clock.now_ns());
        }
        let parkers = std::mem::take(&mut *self.parkers.lock());
        let mut workers = self.workers.lock();
        for (me, parker) in parkers.into_iter().enumerate() {
            let shared = Arc::clone(&self.shared);
            let pin = if cores.is_empty() {
                None
            } else {
                Some(cores[me % cores.len()])
            };
            let builder = std::thread::Builder::new()
                .name(format!("pfemu-ppe-{me}"))
                .stack_size(512 * 1024);
            // Two copies of the PPE loop: without profiling, no clock reads nor tests for it.
            let body: Box<dyn FnOnce() + Send> = if shared.cfg.profile {
                Box::new(move || ppe::run::<true>(shared, me, parker, pin))
            } else {
                Box::new(move || ppe::run::<false>(shared, me, parker, pin))
            };
            match spawn(builder, body) {
                Ok(handle) => workers.push(handle),
                Err(reason) => {
                    drop(workers);
                    return Err(self.abort_start(format!("pfemu-ppe-{me}"), me, reason));
                }
            }
        }
        drop(workers);
        let launcher_parker = self.launcher_parker.lock().take();
        if let Some(parker) = launcher_parker {
            let shared = Arc::clone(&self.shared);
            let builder = std::thread::Builder::new().name("pfemu-timers".into());
            match spawn(
                builder,
                Box::new(move || timer_threads::run(shared, parker)),
            ) {
                Ok(handle) => *self.launcher.lock() = Some(handle),
                Err(reason) => {
                    let started = self.shared.cfg.ppe_threads;
                    return Err(self.abort_start("pfemu-timers".into(), started, reason));
                }
            }
        }
        self.shared.state.store(STATE_RUNNING, Ordering::Release);
        Ok(())
    }

    /// Stops the threads a failed [`Pfe::start_with`] started (nothing was injected, so
    /// they only wait for work) and shuts the engine down; returns the error to report.
    fn abort_start(
        &mut self,
        thread: String,
        started: usize,
        reason: std::io::Error,
    ) -> StartError {
        self.stop();
        StartError::Spawn {
            thread,
            started,
            ppe_threads: self.shared.cfg.ppe_threads,
            reason,
        }
    }

    /// Waits until nothing is in flight: every accepted packet has been released or
    /// dropped, every timer thread already launched has finished, and every posted XTXN
    /// has been applied. (Timers keep firing: a drained engine with timers is quiet only
    /// until the next launch.)
    pub fn drain(&self) {
        let backoff = Backoff::new();
        let mut watch = self.shared.dispatch.stall_watch();
        while self.in_flight() > 0 {
            if backoff.is_completed() {
                self.shared.dispatch.check_stall(&mut watch);
                std::thread::sleep(Duration::from_micros(50));
            } else {
                backoff.snooze();
            }
        }
        if let Some(t) = &self.shared.timers {
            t.wait_idle(&self.shared);
        }
    }

    /// Waits until every timer launch due at the clock's current reading has been made and
    /// has finished, along with the packets already accepted. With a
    /// [`crate::timer::ManualClock`] this makes timers deterministic:
    ///
    /// ```text
    /// clock.advance(period_ns);   // the launcher wakes up
    /// pfe.settle_timers();        // the launches due by now ran to completion
    /// ```
    ///
    /// Returns at once on an engine without timers or not running.
    pub fn settle_timers(&self) {
        let Some(t) = &self.shared.timers else {
            return;
        };
        let target = self.shared.clock.now_ns();
        // `launched_before` saturates at u64::MAX (the end of the clock's range: nothing is
        // due after it), and `next_due` reads u64::MAX when nothing is due.
        while t.launched_before() <= target
            && t.launched_before() != u64::MAX
            && t.next_due() <= target
            && t.next_due() != u64::MAX
            && self.running()
            && self.launcher_alive()
        {
            std::thread::sleep(Duration::from_micros(20));
        }
        self.drain();
    }

    fn launcher_alive(&self) -> bool {
        self.launcher
            .lock()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// accepted is lost.
    pub fn shutdown(mut self) -> Stats {
        self.stop();
        self.stats()
    }

    fn stop(&mut self) {
        // Timers stop first, so the drain below finishes every launch already made.
        if let Some(t) = &self.shared.timers {
            t.stop();
        }
        if let Some(h) = self.launcher.lock().take() {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
        if self.shared.state.load(Ordering::Acquire) == STATE_RUNNING {
            self.drain();
        }
        self.shared.state.store(STATE_STOPPED, Ordering::Release);
        self.shared.dispatch.close();
        for h in self.workers.lock().drain(..) {
            // A PPE thread catches panics from programs; a panic escaping it is a bug in
            // the engine, and surfacing it beats hiding it.
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    }
}

impl Drop for Pfe {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.stop();
        }
    }
}
