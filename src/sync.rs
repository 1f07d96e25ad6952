//! The synchronisation types of the hand-written protocols (dispatch's idle/wake protocol,
//! the reorder engine's flat combining, the injectors' wait for room, the TCAM's published
//! version), in one place so the loom model checker can stand in for them (the way tokio's
//! `loom` module does).
//!
//! - Normally these are plain re-exports: `std` atomics, `crossbeam` queues, parkers,
//!   backoff and padding, `parking_lot`'s mutex and condition variable, `std`'s clock.
//!   Nothing is wrapped.
//! - Under `--cfg loom` they are loom's atomics and loom-backed stand-ins with the same
//!   methods, so `src/pfe/loom_tests.rs` checks the real `Dispatch`, `ReorderStage` and
//!   `RoomWait` code
//!   under every interleaving loom explores:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test --release --lib loom_tests
//! ```

#[cfg(not(loom))]
pub(crate) use self::real::*;

#[cfg(loom)]
pub(crate) use self::model::*;

#[cfg(not(loom))]
mod real {
    pub(crate) use crossbeam_queue::ArrayQueue;
    pub(crate) use crossbeam_utils::sync::{Parker, Unparker};
    pub(crate) use crossbeam_utils::{Backoff, CachePadded};
    pub(crate) use parking_lot::{Condvar, Mutex, RwLock};
    pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};
    pub(crate) use std::time::Instant;
}

/// Loom-backed stand-ins with the methods the protocols use.
///
/// The queues keep their items under a loom mutex but mirror their length in a loom atomic
/// that `len` and `is_empty` read without the lock, as crossbeam's queues read their head
/// and tail indices. So loom may show a thread a stale length, and the protocols' `SeqCst`
/// fences are what must rule the stale reads out; loom models those fences exactly.
///
/// The mirror is written with `Release` and read with `Acquire`, weaker than crossbeam's
/// `SeqCst` index accesses, so the model can only allow more than the real queues do. With
/// `SeqCst` here it would allow less: loom lets a `SeqCst` load of a `SeqCst`-stored
/// atomic return only the latest store, which hides a missing fence (with `SeqCst` here,
/// the `finish` models pass with either of `ReorderStage::finish`'s fences removed).
#[cfg(loom)]
mod model {
    use std::cell::Cell;
    use std::collections::VecDeque;
    use std::ops::{Deref, DerefMut};
    use std::time::Duration;

    pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering};

    /// `parking_lot::Mutex`'s API (no poisoning) over `loom::sync::Mutex`.
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard {
                guard: Some(self.0.lock().unwrap_or_else(|e| e.into_inner())),
                mutex: &self.0,
            }
        }

        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            let guard = self.0.try_lock().ok()?;
            Some(MutexGuard {
                guard: Some(guard),
                mutex: &self.0,
            })
        }
    }

    pub(crate) struct MutexGuard<'a, T> {
        /// Always `Some`, but while [`Condvar::wait_for`] has handed it to loom.
        guard: Option<loom::sync::MutexGuard<'a, T>>,
        mutex: &'a loom::sync::Mutex<T>,
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            self.guard.as_ref().expect("the guard is held")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.guard.as_mut().expect("the guard is held")
        }
    }

    impl<T> Drop for MutexGuard<'_, T> {
        /// Gives the unlock a step of its own. Loom unlocks within the holder's last step
        /// (unlocking is no scheduling point), so no other thread could ever find the lock
        /// still taken after the holder's last look at what it guards. With parking_lot it
        /// can (the unlock is a store of its own), and `ReorderStage::finish` must handle
        /// exactly that; without this step the `finish` models pass with its fences
        /// removed. A `try_lock` by the holder is such a step: it fails, changes nothing,
        /// and is a scheduling point on this mutex.
        fn drop(&mut self) {
            let _ = self.mutex.try_lock();
        }
    }

    /// `parking_lot::RwLock`'s API (no poisoning) over `loom::sync::RwLock`.
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub fn new(value: T) -> Self {
            RwLock(loom::sync::RwLock::new(value))
        }

        pub fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(|e| e.into_inner())
        }

        pub fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(|e| e.into_inner())
        }
    }

    /// `parking_lot::Condvar`'s API over `loom::sync::Condvar`.
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub fn new() -> Self {
            Condvar(loom::sync::Condvar::new())
        }

        /// Waits for a notification; the timeout is not modelled. A protocol that waits
        /// with a timeout only to look at other things now and then (as `RoomWait` does)
        /// must never need it to learn what it waits for, and this makes the model check
        /// exactly that: a wake-up the protocol loses leaves the waiter blocked for ever,
        /// which loom reports as a deadlock (where a timeout would have hidden it).
        pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, _timeout: Duration) {
            let held = guard.guard.take().expect("the guard is held");
            guard.guard = Some(self.0.wait(held).unwrap_or_else(|e| e.into_inner()));
        }

        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }

    /// A FIFO queue holding at most `cap` items; see the module docs for `len`.
    struct Queue<T> {
        items: loom::sync::Mutex<VecDeque<T>>,
        cap: usize,
        len: AtomicUsize,
    }

    impl<T> Queue<T> {
        fn new(cap: usize) -> Self {
            Queue {
                items: loom::sync::Mutex::new(VecDeque::new()),
                cap,
                len: AtomicUsize::new(0),
            }
        }

        fn push(&self, value: T) -> Result<(), T> {
            let mut items = self.items.lock().unwrap();
            if items.len() == self.cap {
                return Err(value);
            }
            items.push_back(value);
            self.len.store(items.len(), Ordering::Release);
            Ok(())
        }

        fn pop(&self) -> Option<T> {
            let mut items = self.items.lock().unwrap();
            let value = items.pop_front()?;
            self.len.store(items.len(), Ordering::Release);
            Some(value)
        }

        fn len(&self) -> usize {
            self.len.load(Ordering::Acquire)
        }
    }

    /// `crossbeam_queue::ArrayQueue`: bounded, `push` hands the value back when full.
    pub(crate) struct ArrayQueue<T>(Queue<T>);

    impl<T> ArrayQueue<T> {
        pub fn new(cap: usize) -> Self {
            assert!(cap > 0, "capacity must be non-zero");
            ArrayQueue(Queue::new(cap))
        }

        pub fn push(&self, value: T) -> Result<(), T> {
            self.0.push(value)
        }

        pub fn pop(&self) -> Option<T> {
            self.0.pop()
        }

        pub fn len(&self) -> usize {
            self.0.len()
        }

        pub fn is_empty(&self) -> bool {
            self.0.len() == 0
        }
    }

    /// `crossbeam_utils::sync::Parker`: `park` blocks until a token is available and takes
    /// it; `unpark` makes the token available (at most one is kept).
    pub(crate) struct Parker {
        unparker: Unparker,
    }

    #[derive(Clone)]
    pub(crate) struct Unparker {
        token: loom::sync::Arc<(loom::sync::Mutex<bool>, loom::sync::Condvar)>,
    }

    impl Parker {
        pub fn new() -> Self {
            let token = (loom::sync::Mutex::new(false), loom::sync::Condvar::new());
            Parker {
                unparker: Unparker {
                    token: loom::sync::Arc::new(token),
                },
            }
        }

        pub fn park(&self) {
            let (token, cv) = &*self.unparker.token;
            let mut available = token.lock().unwrap();
            while !*available {
                available = cv.wait(available).unwrap();
            }
            *available = false;
        }

        pub fn unparker(&self) -> &Unparker {
            &self.unparker
        }

        /// A wait with a timeout may end at any time: the model ends it at once (whatever
        /// waits this way must cope with an early return, as it must with a spurious one).
        #[allow(dead_code)]
        pub fn park_timeout(&self, _timeout: Duration) {}
    }

    impl Unparker {
        pub fn unpark(&self) {
            let (token, cv) = &*self.token;
            *token.lock().unwrap() = true;
            cv.notify_one();
        }
    }

    /// `crossbeam_utils::Backoff` with a finite spin of [`Backoff::SNOOZES`] rounds.
    ///
    /// `snooze` does not yield to loom's scheduler: loom takes a yield for a spin-wait and
    /// from then on lets the thread read only stores newer than those it had seen, which
    /// would hide exactly the stale reads a thread that gives up spinning can make. The
    /// spin is finite anyway.
    pub(crate) struct Backoff {
        step: Cell<u32>,
    }

    impl Backoff {
        const SNOOZES: u32 = 1;

        pub fn new() -> Self {
            Backoff { step: Cell::new(0) }
        }

        pub fn snooze(&self) {
            self.step.set(self.step.get() + 1);
        }

        pub fn is_completed(&self) -> bool {
            self.step.get() >= Self::SNOOZES
        }
    }

    /// `crossbeam_utils::CachePadded` without the padding.
    pub(crate) struct CachePadded<T>(T);

    impl<T> CachePadded<T> {
        pub fn new(value: T) -> Self {
            CachePadded(value)
        }
    }

    impl<T> Deref for CachePadded<T> {
        type Target = T;

        fn deref(&self) -> &T {
            &self.0
        }
    }

    /// Time is not modelled: every clock reading finds any period already over, so a
    /// stall watch that saw no progress always fires (deterministically, as loom needs).
    #[derive(Clone, Copy)]
    pub(crate) struct Instant;

    impl Instant {
        pub fn now() -> Self {
            Instant
        }

        pub fn elapsed(&self) -> Duration {
            Duration::MAX
        }
    }
}
