//! The engine's runtime control: what an operator reads and changes while traffic flows.
//!
//! [`Pfe::control`] hands out a [`Control`]: a cheap, cloneable, `Send + Sync` handle on the
//! running engine that another thread (a control server, a dashboard, a test) keeps while
//! the embedder injects and, at the end, shuts the engine down. Through it:
//!
//! - the counters ([`Control::stats`], the same snapshot as [`Pfe::stats`]);
//! - the shared memory ([`Control::memory`]): read and write words, and the named regions
//!   the programs allocated ([`crate::mem::SharedMemory::allocations`]), with the memory's own
//!   atomicity (a word at a time);
//! - the timers ([`Control::timers`], [`Control::set_timer_period`],
//!   [`Control::set_timer_enabled`]): a change takes effect from the timer's next launch.
//!   The launcher is unparked so that it sleeps until the new deadline; one sleeping on
//!   the system clock (a plain sleep, which nothing interrupts) sees the change at the end
//!   of that sleep, at most 2 ms later.
//!
//! - grace periods ([`Control::wait_quiescent`]): waits until no PPE thread still runs work
//!   it took before the call, so that memory a control-side API unlinked (a removed job's
//!   region) can be reused without a packet that looked it up earlier still touching it
//!   ([`Retired`](super::Retired) keeps such memory, with the tickets that say when).
//!
//! Tables a program keeps (routes, jobs, ternary match blocks) are the program's to change,
//! through its own control-side API, on the same shared memory; the lab's control server
//! (`pfemu::lab::control`) puts them beside these behind one endpoint.
//!
//! A handle outlives the engine's threads harmlessly: after [`Pfe::shutdown`] the counters
//! are final, the memory stays readable, and timer changes are refused
//! ([`ControlError::NotRunning`]).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::{Pfe, Shared, Stats, STATE_RUNNING};
use crate::mem::SharedMemory;
use crate::timer::{TimerError, TimerStatus};

/// A handle on a running engine for control: see the module doc.
#[derive(Clone)]
pub struct Control {
    shared: Arc<Shared>,
}

/// A control request the engine refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlError {
    /// The engine has no timers.
    NoTimers,
    /// The timer change was refused.
    Timer(TimerError),
    /// The engine is not running (not started, or shut down).
    NotRunning,
    /// A grace period ([`Control::wait_quiescent`]) did not end by its deadline.
    GraceTimeout {
        /// PPE threads still running work taken before the grace period began.
        busy: usize,
        /// PPE threads the engine has.
        threads: usize,
    },
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlError::NoTimers => write!(f, "the engine has no timers"),
            ControlError::Timer(e) => e.fmt(f),
            ControlError::NotRunning => write!(f, "the engine is not running"),
            ControlError::GraceTimeout { busy, threads } => write!(
                f,
                "grace period not over by its deadline: {busy} of {threads} PPE threads still \
                 run work taken before it (a program blocked, or the deadline too short)"
            ),
        }
    }
}

impl std::error::Error for ControlError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ControlError::Timer(e) => Some(e),
            _ => None,
        }
    }
}

impl fmt::Debug for Control {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Control")
            .field("program", &self.shared.program.name())
            .field("running", &self.running())
            .finish()
    }
}

impl Pfe {
    /// A handle for reading and changing the engine while it runs (module doc).
    pub fn control(&self) -> Control {
        Control {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Control {
    /// A snapshot of the counters ([`Pfe::stats`]).
    pub fn stats(&self) -> Stats {
        super::stats::snapshot(&self.shared)
    }

    /// The shared memory system.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.shared.mem
    }

    /// The name of the program the PPE threads run.
    pub fn program_name(&self) -> &str {
        self.shared.program.name()
    }

    /// Whether the engine is running (started, not shut down).
    pub fn running(&self) -> bool {
        self.shared.state.load(Ordering::Acquire) == STATE_RUNNING
    }

    /// Every timer as it stands (empty without timers).
    pub fn timers(&self) -> Vec<TimerStatus> {
        self.shared
            .timers
            .as_ref()
            .map_or_else(Vec::new, |t| t.status())
    }

    /// Gives timer `timer` a new period from its next launch
    /// ([`crate::timer::TimerSet::set_period`]).
    pub fn set_timer_period(
        &self,
        timer: usize,
        period_ns: u64,
    ) -> Result<TimerStatus, ControlError> {
        let now = self.shared.clock.now_ns();
        self.change_timers(|set| set.set_period(timer, period_ns, now))
    }

    /// Switches timer `timer` off or on ([`crate::timer::TimerSet::set_enabled`]).
    pub fn set_timer_enabled(
        &self,
        timer: usize,
        enabled: bool,
    ) -> Result<TimerStatus, ControlError> {
        let now = self.shared.clock.now_ns();
        self.change_timers(|set| set.set_enabled(timer, enabled, now))
    }

    /// Waits for a grace period: returns once every PPE thread has, since the call, taken
    /// new work (a batch or a timer launch), gone idle, or exited. A thread runs what it
    /// takes to completion, so no thread then still runs a packet or timer thread that
    /// could have read shared memory before the call: memory the caller unlinked before
    /// calling can be reused. A stopped or not yet started engine is quiescent at once.
    ///
    /// Cheap for the packet path (one load per batch, see `pfe::dispatch`); the waiter
    /// polls. A thread blocked inside a program holds the grace period up: past
    /// `deadline` this returns [`ControlError::GraceTimeout`] (never hangs), and the caller
    /// must then keep the unlinked memory unused.
    pub fn wait_quiescent(&self, deadline: std::time::Instant) -> Result<(), ControlError> {
        let d = &self.shared.dispatch;
        let target = d.begin_grace();
        let mut pending: Vec<usize> = (0..d.threads()).collect();
        let backoff = crossbeam_utils::Backoff::new();
        loop {
            pending.retain(|&t| !d.quiescent_since(target, t));
            if pending.is_empty() {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(ControlError::GraceTimeout {
                    busy: pending.len(),
                    threads: d.threads(),
                });
            }
            if backoff.is_completed() {
                // A busy thread takes its next batch within a batch's time; polling more
                // often would only take a core from it.
                std::thread::sleep(std::time::Duration::from_micros(20));
            } else {
                backoff.snooze();
            }
        }
    }

    fn change_timers(
        &self,
        change: impl FnOnce(&mut crate::timer::TimerSet) -> Result<TimerStatus, TimerError>,
    ) -> Result<TimerStatus, ControlError> {
        if !self.running() {
            return Err(ControlError::NotRunning);
        }
        let timers = self.shared.timers.as_ref().ok_or(ControlError::NoTimers)?;
        timers.change(change).map_err(ControlError::Timer)
    }
}
