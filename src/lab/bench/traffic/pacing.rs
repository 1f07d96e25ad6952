//! Pacing: a burst schedule at an offered rate, on a virtual or the real clock.

use std::time::{Duration, Instant};

use super::Rate;
use crate::ConfigError;

/// Spin (rather than yield) when the next deadline is closer than this.
const SPIN_WITHIN: Duration = Duration::from_micros(20);
/// Sleep (rather than yield) when the next deadline is farther than this.
const SLEEP_BEYOND: Duration = Duration::from_micros(500);
/// How much earlier than the deadline a sleep is asked to end (the scheduler oversleeps).
const SLEEP_MARGIN: Duration = Duration::from_micros(200);

/// Schedules bursts of `burst` frames at `pps` packets per second.
///
/// Burst `k` (from 0) is due `deadline_ns(k) = k * burst / pps` seconds after the start,
/// rounded to the nanosecond; burst 0 is due at once. The schedule is pure
/// ([`Pacer::deadline_ns`], [`Pacer::bursts_due`], [`Pacer::poll`] take the time as
/// nanoseconds since the start, so tests drive it with a virtual clock);
/// [`Pacer::wait_for_next`] follows it in real time. A sender that falls behind is not
/// skipped ahead: late bursts are due at once, so the long-run rate is kept.
///
/// Example: 1 Mpps in bursts of 32 puts a burst every 32 µs; at 1 ms, 31.25 burst
/// intervals have passed and bursts 0..=31 (32 bursts, 1024 frames) are due.
#[derive(Clone, Debug)]
pub struct Pacer {
    pps: f64,
    burst: u32,
    next: u64,
    start: Option<Instant>,
}

impl Pacer {
    /// A pacer of `pps` packets per second (positive, finite) in bursts of `burst >= 1`
    /// frames; errors name `rate` or `burst`.
    pub fn new(pps: f64, burst: u32) -> Result<Pacer, ConfigError> {
        Rate::Pps(pps).validate()?;
        if burst == 0 {
            return Err(ConfigError::new("burst", "must be at least 1 frame"));
        }
        Ok(Pacer {
            pps,
            burst,
            next: 0,
            start: None,
        })
    }

    /// A pacer of `rate` at frames of `frame_size` bytes (a mean size for mixed sizes).
    pub fn for_rate(rate: Rate, frame_size: f64, burst: u32) -> Result<Pacer, ConfigError> {
        rate.validate()?;
        Pacer::new(rate.pps_for(frame_size), burst)
    }

    /// Packets per second.
    pub fn pps(&self) -> f64 {
        self.pps
    }

    /// Frames per burst.
    pub fn burst(&self) -> u32 {
        self.burst
    }

    /// Nanoseconds from the start until burst `k` is due: `k * burst * 1e9 / pps`, rounded
    /// (saturating at `u64::MAX`).
    pub fn deadline_ns(&self, k: u64) -> u64 {
        (k as f64 * f64::from(self.burst) * 1e9 / self.pps).round() as u64
    }

    /// How many bursts are due `now_ns` after the start: those with
    /// `deadline_ns(k) <= now_ns`, so at least 1 (burst 0 is due at once).
    pub fn bursts_due(&self, now_ns: u64) -> u64 {
        // Estimate, then settle against deadline_ns so both always agree.
        let mut k = (now_ns as f64 * self.pps / (f64::from(self.burst) * 1e9)).floor() as u64;
        for _ in 0..4 {
            if k < u64::MAX - 1 && self.deadline_ns(k + 1) <= now_ns {
                k += 1;
            } else if k > 0 && self.deadline_ns(k) > now_ns {
                k -= 1;
            } else {
                break;
            }
        }
        k.saturating_add(1)
    }

    /// How many frames are due `now_ns` after the start (`bursts_due * burst`).
    pub fn frames_due(&self, now_ns: u64) -> u64 {
        self.bursts_due(now_ns)
            .saturating_mul(u64::from(self.burst))
    }

    /// The index of the next burst [`Pacer::poll`] or [`Pacer::wait_for_next`] releases.
    pub fn next_burst(&self) -> u64 {
        self.next
    }

    /// Releases the bursts that became due by `now_ns` (virtual time since the start) and
    /// returns how many: `bursts_due(now_ns) - next_burst()`, or 0 if none.
    pub fn poll(&mut self, now_ns: u64) -> u64 {
        let due = self.bursts_due(now_ns);
        let released = due.saturating_sub(self.next);
        self.next = self.next.max(due);
        released
    }

    /// Starts (or restarts) the real-time clock now, with burst 0 due at once.
    pub fn start(&mut self) {
        self.start = Some(Instant::now());
        self.next = 0;
    }

    /// Nanoseconds since the real-time clock started (0 before it has).
    pub fn elapsed_ns(&self) -> u64 {
        self.start.map_or(0, |s| {
            s.elapsed().as_nanos().min(u128::from(u64::MAX)) as u64
        })
    }

    /// Waits in real time until the next burst is due and returns its index. The clock
    /// starts on the first call (or at [`Pacer::start`]). Sleeps while the deadline is
    /// far, yields when it is near, and spins for the last few microseconds; returns at
    /// once when the burst is already late.
    pub fn wait_for_next(&mut self) -> u64 {
        let start = *self.start.get_or_insert_with(Instant::now);
        let k = self.next;
        self.next += 1;
        let Some(deadline) = start.checked_add(Duration::from_nanos(self.deadline_ns(k))) else {
            // Beyond what the clock can represent: nothing sensible to wait for.
            return k;
        };
        loop {
            let now = Instant::now();
            if now >= deadline {
                return k;
            }
            let left = deadline - now;
            if left > SLEEP_BEYOND {
                std::thread::sleep(left - SLEEP_MARGIN);
            } else if left > SPIN_WITHIN {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    }
}
