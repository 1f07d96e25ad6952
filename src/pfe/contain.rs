//! Containment of the callbacks the engine runs on its own threads: sinks
//! ([`super::Sink::deliver`]), clocks ([`crate::timer::Clock`]) and custom flow classifiers.
//! A program closure's panic is a fault ([`crate::program`]); a panic in one of these is
//! caught where the engine calls it, counted and remembered here ([`PanicLog`]), and the
//! engine goes on: no PPE thread dies and nothing in flight is stranded.
//!
//! - Sink: the burst's frames are lost; its ingress packets are dropped as `sink_panic`
//!   (see `egress::PortQueues::flush`).
//! - Classifier: the frame is dropped at ingress as `classifier_panic`.
//! - Clock: the reading falls back to the last one this thread got ([`GuardedClock`]); no
//!   packet is at fault, so none is dropped.

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::program::panic_message;
use crate::timer::Clock;

/// Panics caught in one kind of callback: how many, and the first one's message.
#[derive(Default)]
pub(crate) struct PanicLog {
    count: AtomicU64,
    first: Mutex<Option<String>>,
}

impl PanicLog {
    /// Counts a caught panic, keeping the first message.
    pub fn record(&self, payload: &(dyn Any + Send)) {
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first.lock();
        if first.is_none() {
            *first = Some(panic_message(payload));
        }
    }

    /// Panics so far.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// `(count, first message)`, once anything panicked.
    pub fn snapshot(&self) -> Option<(u64, String)> {
        let n = self.count();
        (n > 0).then(|| (n, self.first.lock().clone().unwrap_or_default()))
    }
}

thread_local! {
    /// The last reading a guarded clock gave this thread.
    static LAST_READING: Cell<u64> = const { Cell::new(0) };
}

/// The engine's view of a user's clock: a reading that panics is counted and replaced by
/// the last good reading of the calling thread (time does not go backwards for it); a
/// `sleep_until` that panics sleeps `limit` instead, so the timer launcher does not spin.
pub(crate) struct GuardedClock {
    inner: Arc<dyn Clock>,
    panics: Arc<PanicLog>,
}

impl GuardedClock {
    pub fn new(inner: Arc<dyn Clock>, panics: Arc<PanicLog>) -> Self {
        GuardedClock { inner, panics }
    }
}

impl Clock for GuardedClock {
    fn now_ns(&self) -> u64 {
        match catch_unwind(AssertUnwindSafe(|| self.inner.now_ns())) {
            Ok(t) => {
                LAST_READING.with(|l| l.set(t));
                t
            }
            Err(payload) => {
                self.panics.record(payload.as_ref());
                LAST_READING.with(Cell::get)
            }
        }
    }

    fn sleep_until(&self, deadline_ns: u64, limit: Duration) {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(|| {
            self.inner.sleep_until(deadline_ns, limit)
        })) {
            self.panics.record(payload.as_ref());
            std::thread::sleep(limit);
        }
    }
}
