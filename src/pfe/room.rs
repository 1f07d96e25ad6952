//! Backpressure: injectors that find the engine full wait for in-flight room, and the PPE
//! threads that release packets wake them.
//!
//! The protocol, in steps:
//! 1. An injector that finds too little room (`Pfe::reserve`) registers in `waiting`, then,
//!    after a `SeqCst` fence, reads the in-flight count. If the room it needs is there it
//!    leaves (and goes back to reserving it).
//! 2. Otherwise it takes `lock`, reads the count once more under it, and only if there is
//!    still no room waits on `cv` (which releases the lock).
//! 3. A PPE thread that retires packets subtracts them from the in-flight count. When at
//!    most `wake_at` remain (a quarter of the capacity is free), it reads `waiting` after a
//!    `SeqCst` fence, and if anyone waits, notifies them all under `lock`.
//! 4. A woken waiter goes back to step 1's look at the count (not to the registration).
//!
//! The fences of steps 1 and 3 separate each side's store from its load (a Dekker
//! pattern): either the waiter sees the room, or the releaser sees the waiter. The lock of
//! steps 2 and 3 keeps the notification from falling between the waiter's last look and its
//! wait. The wait has a timeout, only so that a waiter also looks at a stalled engine (see
//! `Dispatch::check_stall`) and at a stop: no wake-up depends on it, and the loom models of
//! this protocol (`src/pfe/loom_tests.rs`) wait without it.
//!
//! A waiter needs `resume_at` in flight or fewer, never above `wake_at`, so every release
//! that brings the count down to where a waiter could go on notifies it.

use std::time::Duration;

use super::dispatch::Dispatch;
use crate::sync::{fence, AtomicU64, Condvar, Mutex, Ordering};

/// Injectors waiting for in-flight room, and how the PPE threads wake them.
pub(crate) struct RoomWait {
    /// Injectors between their registration (step 1) and their leaving.
    waiting: AtomicU64,
    /// Orders a notification after a waiter's last look (steps 2 and 3).
    lock: Mutex<()>,
    cv: Condvar,
    /// Releases that leave this many packets in flight or fewer wake the waiters: a quarter
    /// of the capacity free.
    wake_at: u64,
}

impl RoomWait {
    /// Waiters wait at most this long between looks at a stalled engine.
    const STALL_LOOK: Duration = Duration::from_millis(1);

    pub(crate) fn new(capacity: u64) -> Self {
        RoomWait {
            waiting: AtomicU64::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
            wake_at: capacity - capacity / 4,
        }
    }

    /// Injectors waiting for room now.
    pub(crate) fn waiting(&self) -> u64 {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Sleeps until `in_flight` is at most `resume_at`, or `engine()` says the engine
    /// stopped (`None`); checks the engine for a stall (see `Dispatch::check_stall`)
    /// between waits.
    pub(crate) fn wait<'d>(
        &self,
        in_flight: &AtomicU64,
        resume_at: u64,
        engine: impl Fn() -> Option<&'d Dispatch>,
    ) {
        debug_assert!(
            resume_at <= self.wake_at,
            "no release would wake this waiter"
        );
        let Some(dispatch) = engine() else { return };
        let mut watch = dispatch.stall_watch();
        // Step 1: register, then look (the releaser's fence pairs with this one).
        self.waiting.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        while in_flight.load(Ordering::Relaxed) > resume_at {
            let Some(dispatch) = engine() else { break };
            {
                // Step 2: a release that saw us notifies under the lock, so it comes either
                // before this look (which then sees the room) or after the wait began.
                let mut guard = self.lock.lock();
                if in_flight.load(Ordering::Relaxed) > resume_at {
                    self.cv.wait_for(&mut guard, Self::STALL_LOOK);
                }
            }
            dispatch.check_stall(&mut watch);
        }
        self.waiting.fetch_sub(1, Ordering::Relaxed);
    }

    /// Releases `released` packets from `in_flight`, waking the waiters once enough room is
    /// free (step 3).
    #[inline]
    pub(crate) fn release(&self, in_flight: &AtomicU64, released: u64) {
        let now = in_flight.fetch_sub(released, Ordering::AcqRel) - released;
        if now <= self.wake_at {
            // Pairs with the waiter's fence between its registration and its look.
            fence(Ordering::SeqCst);
            if self.waiting.load(Ordering::Relaxed) > 0 {
                let _guard = self.lock.lock();
                self.cv.notify_all();
            }
        }
    }
}
