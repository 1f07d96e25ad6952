//! Timers: periodic launches of microcode threads at a program's timer entry points.
//!
//! Trio has tens of high-resolution timers, each able to start a microcode thread
//! periodically on whichever PPE is free (paper §5). Trio-ML runs N of them with the same
//! period, started `period / N` apart, and each scans `1/N` of the aggregation hash table,
//! so together they visit the whole table once per period.
//!
//! This module holds the logic, kept apart from threads and from the wall clock:
//! - [`Clock`]: where time comes from. [`SystemClock`] reads the monotonic clock;
//!   [`ManualClock`] is moved by hand, so tests drive time deterministically.
//! - [`TimerSpec`]: one timer (entry, period, phase, and the scan slice it owns);
//!   [`TimerSpec::staggered`] builds the N-timer arrangement above.
//! - [`TimerSet::due`]: the launches that are due at a given time, in order, each with the
//!   time it was scheduled for (so jitter can be measured) and how many earlier periods it
//!   had to skip because the launcher fell behind (a timer never launches twice to catch up).
//!
//! Bounds: at most [`MAX_TIMERS`] timers, and periods and phases of at most
//! [`MAX_TIMER_NS`] (a year); more is refused naming the setting. Due times saturate: a
//! timer whose next period would begin past the end of the clock's range (`u64::MAX` ns,
//! 584 years) stays on but is never due again, rather than wrapping or reading as
//! switched off.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::ConfigError;

/// A source of time in nanoseconds. Time never goes backwards.
pub trait Clock: Send + Sync {
    /// Nanoseconds since the clock's own epoch.
    fn now_ns(&self) -> u64;

    /// Blocks until the clock reads at least `deadline_ns`, or for at most `limit`
    /// (whichever comes first): the timer launcher sleeps here between launches. The
    /// default sleeps the calling OS thread, which suits any clock that follows real time.
    fn sleep_until(&self, deadline_ns: u64, limit: Duration) {
        let now = self.now_ns();
        if deadline_ns > now {
            std::thread::sleep(Duration::from_nanos(deadline_ns - now).min(limit));
        }
    }
}

/// The monotonic system clock, counted from when this value was created.
#[derive(Debug, Clone, Copy)]
pub struct SystemClock {
    epoch: Instant,
}

impl SystemClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        SystemClock {
            epoch: Instant::now(),
        }
    }
}

impl Default for SystemClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for SystemClock {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
}

/// A clock that only moves when told to: for deterministic tests of timer logic. Moving
/// it wakes whoever sleeps on it (an engine's timer launcher), so
/// `clock.advance(ms); pfe.settle_timers();` runs exactly the launches due by then.
#[derive(Debug, Default)]
pub struct ManualClock {
    now: AtomicU64,
    lock: Mutex<()>,
    moved: Condvar,
}

impl ManualClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves the clock forward by `ns`, stopping at `u64::MAX` (time never wraps back).
    pub fn advance(&self, ns: u64) {
        let _ = (self.now).fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            Some(now.saturating_add(ns))
        });
        self.wake();
    }

    /// Moves the clock to `ns`, which must not be earlier than now (time never goes back;
    /// an earlier value is ignored).
    pub fn set(&self, ns: u64) {
        self.now.fetch_max(ns, Ordering::AcqRel);
        self.wake();
    }

    fn wake(&self) {
        // Taking the lock orders this wake-up after a sleeper's check of the time.
        let _guard = self.lock.lock();
        self.moved.notify_all();
    }
}

impl Clock for ManualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::Acquire)
    }

    /// Waits until the clock is moved to `deadline_ns` or later, or `limit` passes in real
    /// time.
    fn sleep_until(&self, deadline_ns: u64, limit: Duration) {
        let give_up = Instant::now() + limit;
        let mut guard = self.lock.lock();
        while self.now_ns() < deadline_ns {
            if self.moved.wait_until(&mut guard, give_up).timed_out() {
                return;
            }
        }
    }
}

/// One periodic timer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TimerSpec {
    /// The program's timer entry point it starts (`Entry::Timer(entry)`).
    pub entry: u16,
    /// Time between launches, in nanoseconds (1 to [`MAX_TIMER_NS`]).
    pub period_ns: u64,
    /// Time of the first launch, in nanoseconds from the clock's epoch (with an engine's
    /// default clock, its build), at most [`MAX_TIMER_NS`]. A phase already past when the
    /// engine starts moves on to the timer's first period at or after the start
    /// ([`TimerSet::rebase`]).
    pub phase_ns: u64,
    /// Which slice of the work this timer owns (`slice` of `slices`), e.g. of a hash scan.
    pub slice: u32,
    /// How many slices the work is split into.
    pub slices: u32,
}

impl TimerSpec {
    /// `n` timers starting `entry` every `period_ns`, the k-th first launched at
    /// `start_ns + k * period_ns / n` and owning slice k of n: together they start one
    /// thread every `period_ns / n` and cover all slices once per period. Refuses more than
    /// [`MAX_TIMERS`] timers, and a period or a last phase beyond [`MAX_TIMER_NS`].
    pub fn staggered(
        entry: u16,
        n: u32,
        period_ns: u64,
        start_ns: u64,
    ) -> Result<Vec<TimerSpec>, ConfigError> {
        if n == 0 {
            return Err(ConfigError::new("timers", "at least one timer is needed"));
        }
        check_count(n as usize)?;
        check_period(period_ns)?;
        let offset = |k: u32| (period_ns as u128 * k as u128 / n as u128) as u64;
        // The last timer's phase is the latest; the bound keeps it far from overflowing.
        check_phase(start_ns.saturating_add(offset(n - 1)))?;
        Ok((0..n)
            .map(|k| TimerSpec {
                entry,
                period_ns,
                phase_ns: start_ns + offset(k),
                slice: k,
                slices: n,
            })
            .collect())
    }
}

/// A timer launch that is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// The timer's index in its [`TimerSet`].
    pub timer: usize,
    /// The entry point to start.
    pub entry: u16,
    /// The slice of the work this launch owns.
    pub slice: u32,
    /// How many slices the work is split into.
    pub slices: u32,
    /// When the launch was scheduled for; the launch happens at some `now >= scheduled_ns`,
    /// and the difference is the launch jitter.
    pub scheduled_ns: u64,
    /// Earlier periods of this timer that were skipped because the launcher fell more
    /// than a period behind.
    pub missed: u64,
}

/// The timers of one engine and when each is next due ([`DISABLED`] for a timer switched
/// off with [`TimerSet::set_enabled`]).
#[derive(Clone)]
pub struct TimerSet {
    timers: Vec<(TimerSpec, u64)>,
}

/// The due time of a timer that is switched off: never.
pub const DISABLED: u64 = u64::MAX;

/// The due time of a timer that is on but whose next period would begin past the end of
/// the clock's range: never due again. Due times saturate here, never at [`DISABLED`].
const NEVER_AGAIN: u64 = DISABLED - 1;

/// The most timers an engine takes ([`TimerSet::new`], [`TimerSpec::staggered`]); Trio has
/// tens (paper §5), and Trio-ML's scan uses 100.
pub const MAX_TIMERS: usize = 4096;

/// The longest period, and the latest phase, a timer takes: one year, in nanoseconds. A
/// bound far beyond any use that keeps due times far from overflowing.
pub const MAX_TIMER_NS: u64 = 365 * 24 * 3600 * 1_000_000_000;

/// Refuses more than [`MAX_TIMERS`] timers, naming the setting `timers`.
fn check_count(n: usize) -> Result<(), ConfigError> {
    if n > MAX_TIMERS {
        return Err(ConfigError::new(
            "timers",
            format!("{n} timers asked for; at most {MAX_TIMERS}"),
        ));
    }
    Ok(())
}

/// Refuses a period of 0 or beyond [`MAX_TIMER_NS`], naming the setting `timer_period`.
fn check_period(period_ns: u64) -> Result<(), ConfigError> {
    match TimerError::check_period(period_ns) {
        Ok(()) => Ok(()),
        Err(e) => Err(ConfigError::new("timer_period", e.to_string())),
    }
}

/// Refuses a phase beyond [`MAX_TIMER_NS`], naming the setting `timer_phase`.
fn check_phase(phase_ns: u64) -> Result<(), ConfigError> {
    if phase_ns > MAX_TIMER_NS {
        return Err(ConfigError::new(
            "timer_phase",
            format!(
                "a first launch at {phase_ns} ns is past the latest a timer takes, \
                 {MAX_TIMER_NS} ns (a year)"
            ),
        ));
    }
    Ok(())
}

/// One timer of a [`TimerSet`] as it stands: what [`TimerSet::status`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TimerStatus {
    /// Its index in the set (what [`Launch::timer`] says).
    pub timer: usize,
    /// Its entry, period, phase and slice.
    pub spec: TimerSpec,
    /// Whether it launches ([`TimerSet::set_enabled`]).
    pub enabled: bool,
    /// When it is next due, engine nanoseconds (`None` when switched off, or when its next
    /// period would begin past the end of the clock's range).
    pub next_due_ns: Option<u64>,
}

/// A change to a [`TimerSet`] it refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimerError {
    /// No such timer.
    NoTimer {
        /// The timer asked for.
        timer: usize,
        /// Timers there are.
        timers: usize,
    },
    /// A period of 0 ns.
    ZeroPeriod,
    /// A period beyond [`MAX_TIMER_NS`].
    PeriodTooLong {
        /// The period asked for.
        period_ns: u64,
    },
}

impl TimerError {
    /// Refuses a period of 0 or beyond [`MAX_TIMER_NS`].
    fn check_period(period_ns: u64) -> Result<(), TimerError> {
        match period_ns {
            0 => Err(TimerError::ZeroPeriod),
            p if p > MAX_TIMER_NS => Err(TimerError::PeriodTooLong { period_ns }),
            _ => Ok(()),
        }
    }
}

impl fmt::Display for TimerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimerError::NoTimer { timer, timers } => {
                write!(
                    f,
                    "no timer {timer}: the engine has {timers} (0 to {})",
                    timers.saturating_sub(1)
                )
            }
            TimerError::ZeroPeriod => {
                write!(f, "invalid timer period 0 ns: it must be at least 1 ns")
            }
            TimerError::PeriodTooLong { period_ns } => write!(
                f,
                "invalid timer period {period_ns} ns: at most {MAX_TIMER_NS} ns (a year)"
            ),
        }
    }
}

impl std::error::Error for TimerError {}

impl fmt::Debug for TimerSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TimerSet")
            .field("timers", &self.timers.len())
            .field("next_due_ns", &self.next_due_ns())
            .finish()
    }
}

impl TimerSet {
    /// A set of timers; refuses more than [`MAX_TIMERS`], a period of 0 or past
    /// [`MAX_TIMER_NS`], a phase past it, or a slice outside its slices, naming the setting.
    pub fn new(specs: impl IntoIterator<Item = TimerSpec>) -> Result<TimerSet, ConfigError> {
        let mut timers = Vec::new();
        for s in specs {
            // Counted as they come: an endless iterator is refused, not collected.
            check_count(timers.len() + 1)?;
            check_period(s.period_ns)?;
            check_phase(s.phase_ns)?;
            if s.slices == 0 || s.slice >= s.slices {
                return Err(ConfigError::new(
                    "timers",
                    format!(
                        "slice {} of {} is not a slice (need slice < slices)",
                        s.slice, s.slices
                    ),
                ));
            }
            timers.push((s, s.phase_ns));
        }
        Ok(TimerSet { timers })
    }

    /// Number of timers.
    pub fn len(&self) -> usize {
        self.timers.len()
    }

    /// True when there are no timers.
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// When the next launch is due (`None` without timers, or none due ever again): a
    /// launcher sleeps until then.
    pub fn next_due_ns(&self) -> Option<u64> {
        (self.timers.iter())
            .map(|(_, due)| *due)
            .filter(|&due| due < NEVER_AGAIN)
            .min()
    }

    /// Every timer as it stands.
    pub fn status(&self) -> Vec<TimerStatus> {
        (self.timers.iter().enumerate())
            .map(|(i, &(spec, due))| TimerStatus {
                timer: i,
                spec,
                enabled: due != DISABLED,
                next_due_ns: (due < NEVER_AGAIN).then_some(due),
            })
            .collect()
    }

    fn slot(&mut self, timer: usize) -> Result<&mut (TimerSpec, u64), TimerError> {
        let timers = self.timers.len();
        self.timers
            .get_mut(timer)
            .ok_or(TimerError::NoTimer { timer, timers })
    }

    /// Gives timer `timer` a new period from its next launch: that launch comes one new
    /// period after the last one was scheduled (at once if that is past `now_ns`), the rest
    /// follow every new period. A switched-off timer keeps the period for when it is
    /// switched on. The spec's phase becomes the next launch. Refuses a period of 0 or
    /// past [`MAX_TIMER_NS`].
    pub fn set_period(
        &mut self,
        timer: usize,
        period_ns: u64,
        now_ns: u64,
    ) -> Result<TimerStatus, TimerError> {
        TimerError::check_period(period_ns)?;
        let (spec, due) = self.slot(timer)?;
        if *due != DISABLED {
            let last = due.saturating_sub(spec.period_ns);
            *due = saturate(last.saturating_add(period_ns).max(now_ns));
            spec.phase_ns = *due;
        }
        spec.period_ns = period_ns;
        Ok(self.status()[timer])
    }

    /// Switches timer `timer` off (it launches nothing until switched on) or on (its next
    /// launch one period after `now_ns`); switching a timer to the state it is in changes
    /// nothing.
    pub fn set_enabled(
        &mut self,
        timer: usize,
        enabled: bool,
        now_ns: u64,
    ) -> Result<TimerStatus, TimerError> {
        let (spec, due) = self.slot(timer)?;
        match (enabled, *due == DISABLED) {
            (false, false) => *due = DISABLED,
            (true, true) => {
                *due = saturate(now_ns.saturating_add(spec.period_ns));
                spec.phase_ns = *due;
            }
            _ => {}
        }
        Ok(self.status()[timer])
    }

    /// Moves every timer whose next launch is before `now_ns` on to its first period at or
    /// after `now_ns`, without counting the periods passed over as missed: an engine calls
    /// it when it starts, since the periods between the clock's epoch (with the default
    /// clock, when the engine was built) and the start were nobody's to launch. Each timer
    /// keeps its place in the period, so staggered timers stay staggered.
    pub fn rebase(&mut self, now_ns: u64) {
        for (spec, due) in &mut self.timers {
            if *due < now_ns && *due < NEVER_AGAIN {
                let periods = (now_ns - *due).div_ceil(spec.period_ns);
                *due = saturate(due.saturating_add(periods.saturating_mul(spec.period_ns)));
                spec.phase_ns = *due;
            }
        }
    }

    /// Appends to `out` every launch due at `now_ns`, in order of scheduled time, and moves
    /// each launched timer to its next period after `now_ns`.
    pub fn due(&mut self, now_ns: u64, out: &mut Vec<Launch>) {
        let start = out.len();
        for (i, (spec, due)) in self.timers.iter_mut().enumerate() {
            if *due > now_ns || *due >= NEVER_AGAIN {
                continue;
            }
            // Launch once for the latest period that has begun; skip the others.
            let behind = (now_ns - *due) / spec.period_ns;
            let scheduled = *due + behind * spec.period_ns;
            out.push(Launch {
                timer: i,
                entry: spec.entry,
                slice: spec.slice,
                slices: spec.slices,
                scheduled_ns: scheduled,
                missed: behind,
            });
            *due = saturate(scheduled.saturating_add(spec.period_ns));
        }
        out[start..].sort_by_key(|l| (l.scheduled_ns, l.timer));
    }
}

/// A due time computed with saturating arithmetic, kept off [`DISABLED`]: a timer that is
/// on never reads as switched off.
fn saturate(due: u64) -> u64 {
    due.min(NEVER_AGAIN)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn staggered_timers_start_period_over_n_apart_and_own_one_slice_each() {
        let specs = TimerSpec::staggered(3, 4, 100 * MS, 5 * MS).unwrap();
        let phases: Vec<u64> = specs.iter().map(|s| s.phase_ns).collect();
        assert_eq!(phases, vec![5 * MS, 30 * MS, 55 * MS, 80 * MS]);
        assert!(specs
            .iter()
            .enumerate()
            .all(|(k, s)| s.slice == k as u32 && s.slices == 4 && s.entry == 3));
    }

    #[test]
    fn a_manual_clock_drives_launches_deterministically() {
        let clock = ManualClock::new();
        let mut set = TimerSet::new(TimerSpec::staggered(0, 4, 100 * MS, 0).unwrap()).unwrap();
        let mut out = Vec::new();
        let mut seen = Vec::new();
        // Step through 300 ms, 1 ms at a time: one launch every 25 ms, slices in turn.
        for _ in 0..=300 {
            set.due(clock.now_ns(), &mut out);
            for l in out.drain(..) {
                assert_eq!(l.scheduled_ns, clock.now_ns(), "launched exactly on time");
                assert_eq!(l.missed, 0);
                seen.push((l.scheduled_ns / MS, l.slice));
            }
            clock.advance(MS);
        }
        let expect: Vec<(u64, u32)> = (0..=12).map(|i| (i * 25, (i % 4) as u32)).collect();
        assert_eq!(seen, expect);
    }

    #[test]
    fn a_late_launcher_launches_once_and_counts_the_missed_periods() {
        let mut set = TimerSet::new([TimerSpec {
            entry: 1,
            period_ns: 10,
            phase_ns: 5,
            slice: 0,
            slices: 1,
        }])
        .unwrap();
        let mut out = Vec::new();
        set.due(4, &mut out);
        assert!(out.is_empty());
        assert_eq!(set.next_due_ns(), Some(5));
        set.due(38, &mut out);
        // Due at 5, 15, 25, 35: one launch, for 35, with three periods skipped.
        assert_eq!(
            out,
            vec![Launch {
                timer: 0,
                entry: 1,
                slice: 0,
                slices: 1,
                scheduled_ns: 35,
                missed: 3
            }]
        );
        assert_eq!(set.next_due_ns(), Some(45));
    }

    #[test]
    fn a_rebase_skips_the_periods_before_it_uncounted_and_keeps_the_stagger() {
        // Due at 0, 25, 50 and 75 ms; the engine starts at 130 ms.
        let mut set = TimerSet::new(TimerSpec::staggered(0, 4, 100 * MS, 0).unwrap()).unwrap();
        set.rebase(130 * MS);
        let due: Vec<u64> = set
            .status()
            .iter()
            .map(|s| s.next_due_ns.unwrap())
            .collect();
        assert_eq!(due, [200 * MS, 225 * MS, 150 * MS, 175 * MS]);
        let mut out = Vec::new();
        set.due(150 * MS, &mut out);
        assert_eq!((out.len(), out[0].slice, out[0].missed), (1, 2, 0));
        // A timer due at the start, or later, stays.
        let mut set = TimerSet::new(TimerSpec::staggered(0, 2, 10, 20).unwrap()).unwrap();
        set.rebase(20);
        assert_eq!(set.next_due_ns(), Some(20));
        let due: Vec<u64> = set
            .status()
            .iter()
            .map(|s| s.next_due_ns.unwrap())
            .collect();
        assert_eq!(due, [20, 25]);
    }

    #[test]
    fn out_of_range_periods_phases_and_counts_are_refused_naming_the_setting() {
        let setting = |r: Result<Vec<TimerSpec>, ConfigError>| r.unwrap_err().setting;
        assert_eq!(
            setting(TimerSpec::staggered(0, 1, u64::MAX, 0)),
            "timer_period"
        );
        assert_eq!(
            setting(TimerSpec::staggered(0, 1, 10, u64::MAX)),
            "timer_phase"
        );
        // The last timer's phase, a period later than the first's, is past the bound.
        let late = TimerSpec::staggered(0, 2, MAX_TIMER_NS, MAX_TIMER_NS / 2 + 1);
        assert_eq!(setting(late), "timer_phase");
        // Refused before a billion specs are made.
        assert_eq!(
            setting(TimerSpec::staggered(0, 1_000_000_000, MS, 0)),
            "timers"
        );
        let most = TimerSpec::staggered(0, MAX_TIMERS as u32, MAX_TIMER_NS, 0);
        assert_eq!(TimerSet::new(most.unwrap()).unwrap().len(), MAX_TIMERS);

        let spec = TimerSpec {
            entry: 0,
            period_ns: MS,
            phase_ns: 0,
            slice: 0,
            slices: 1,
        };
        let refused = |s: TimerSpec| TimerSet::new([s]).unwrap_err();
        let e = refused(TimerSpec {
            period_ns: MAX_TIMER_NS + 1,
            ..spec
        });
        assert_eq!(e.setting, "timer_period");
        assert!(e.to_string().contains("at most"), "{e}");
        let e = refused(TimerSpec {
            phase_ns: u64::MAX,
            ..spec
        });
        assert_eq!(e.setting, "timer_phase");
        let e = TimerSet::new(std::iter::repeat(spec)).unwrap_err();
        assert_eq!(
            e.setting, "timers",
            "an endless list is refused, not collected"
        );
        assert!(e.to_string().contains("4096"), "{e}");

        let mut set = TimerSet::new([spec]).unwrap();
        assert_eq!(
            set.set_period(0, u64::MAX, 0),
            Err(TimerError::PeriodTooLong {
                period_ns: u64::MAX
            })
        );
        let e = TimerError::PeriodTooLong {
            period_ns: u64::MAX,
        }
        .to_string();
        assert!(
            e.contains("timer period 18446744073709551615 ns: at most"),
            "{e}"
        );
        let st = set.set_period(0, MAX_TIMER_NS, 0).unwrap();
        assert!(st.enabled);
        assert_eq!(st.next_due_ns, Some(MAX_TIMER_NS));
    }

    #[test]
    fn due_times_saturate_at_the_end_of_the_clock_without_switching_the_timer_off() {
        let mut set = TimerSet::new([TimerSpec {
            entry: 0,
            period_ns: MAX_TIMER_NS,
            phase_ns: 0,
            slice: 0,
            slices: 1,
        }])
        .unwrap();
        let mut out = Vec::new();
        let end = u64::MAX - 10;
        set.due(end, &mut out);
        assert_eq!(out.len(), 1, "the latest period begun is launched");
        assert_eq!(out[0].missed, end / MAX_TIMER_NS);
        // The next period would begin past u64::MAX: on, but never due again.
        let st = set.status()[0];
        assert_eq!((st.enabled, st.next_due_ns), (true, None));
        assert_eq!(set.next_due_ns(), None);
        set.due(u64::MAX, &mut out);
        assert_eq!(out.len(), 1, "nothing launches at the clock's last reading");
        // A new period or a rebase at the end of time does not switch it off either.
        let st = set.set_period(0, MS, u64::MAX).unwrap();
        assert_eq!((st.enabled, st.next_due_ns), (true, None));
        set.rebase(u64::MAX);
        assert!(set.status()[0].enabled);
        // Off and on again at the end of time: on.
        set.set_enabled(0, false, u64::MAX).unwrap();
        assert!(set.set_enabled(0, true, u64::MAX).unwrap().enabled);
    }

    #[test]
    fn the_manual_clock_stops_at_its_last_reading() {
        let c = ManualClock::new();
        c.set(u64::MAX - 5);
        c.advance(10);
        assert_eq!(c.now_ns(), u64::MAX, "time does not wrap back");
    }

    #[test]
    fn launches_come_out_in_scheduled_order() {
        let specs = [
            TimerSpec {
                entry: 0,
                period_ns: 100,
                phase_ns: 30,
                slice: 0,
                slices: 1,
            },
            TimerSpec {
                entry: 1,
                period_ns: 100,
                phase_ns: 10,
                slice: 0,
                slices: 1,
            },
            TimerSpec {
                entry: 2,
                period_ns: 100,
                phase_ns: 20,
                slice: 0,
                slices: 1,
            },
        ];
        let mut set = TimerSet::new(specs).unwrap();
        let mut out = Vec::new();
        set.due(50, &mut out);
        assert_eq!(
            out.iter().map(|l| l.entry).collect::<Vec<_>>(),
            vec![1, 2, 0]
        );
    }

    #[test]
    fn the_manual_clock_never_goes_back_and_the_system_clock_moves_forward() {
        let c = ManualClock::new();
        c.set(50);
        c.set(20);
        assert_eq!(c.now_ns(), 50);
        let s = SystemClock::new();
        let a = s.now_ns();
        let b = s.now_ns();
        assert!(b >= a);
    }

    #[test]
    fn bad_timer_settings_are_refused_naming_the_setting() {
        assert_eq!(
            TimerSpec::staggered(0, 0, 10, 0).unwrap_err().setting,
            "timers"
        );
        assert_eq!(
            TimerSpec::staggered(0, 2, 0, 0).unwrap_err().setting,
            "timer_period"
        );
        let bad = TimerSpec {
            entry: 0,
            period_ns: 10,
            phase_ns: 0,
            slice: 2,
            slices: 2,
        };
        assert_eq!(TimerSet::new([bad]).unwrap_err().setting, "timers");
    }
}
