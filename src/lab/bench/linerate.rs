//! RFC 2544 throughput search and latency under load, independent of the device under test.
//!
//! A [`Device`] runs one *trial*: it offers frames of one size at one rate for a fixed time
//! and says how many it offered and how many came out (and, if it measures them, their
//! latencies). Everything here is plain arithmetic on those counts, so it is tested against
//! simulated devices and later driven by the real engine.
//!
//! # Throughput (RFC 2544 §26.1), as implemented by [`search`]
//!
//! For each frame size in [`LinerateConfig::sizes`], independently:
//!
//! 1. The first trial offers frames at the line rate, [`line_rate_pps`] of
//!    [`LinerateConfig::line_rate_gbps`] (the most the medium can carry). If the trial
//!    *passes* (see below), the line rate is the throughput and the size is done after one
//!    trial.
//! 2. Otherwise the throughput lies in a bracket `[lo, hi)`: `lo` the highest rate that
//!    passed (0 until one has), `hi` the lowest that failed (the line rate at first). Each
//!    further trial offers a rate strictly inside the bracket and moves `lo` up (pass) or
//!    `hi` down (fail). Which rate is chosen is [`LinerateConfig::initial_rate`]:
//!    [`InitialRate::Bisect`] halves the bracket every time (RFC 2544's binary search);
//!    [`InitialRate::Measured`] (the default) tries next the rate the device *delivered*
//!    in the failed line-rate trial (its receive rate, over `1 - loss_tolerance`) — for a
//!    device that drops what it cannot carry, that is its capacity — then steps away from
//!    the last rate tried by the resolution, doubling the step while the outcome repeats,
//!    never past the bracket's midpoint (so it is never much worse than bisection, and
//!    usually finishes in 3 trials) — except that after a failure it never offers more
//!    than the device just carried, so a device whose capacity dropped meanwhile (a shared
//!    machine's slow phase) is found at once.
//! 3. The search stops when `hi - lo <= resolution x line rate` (*resolved*) or after
//!    [`LinerateConfig::max_trials_per_size`] trials. The throughput reported is `lo`, the
//!    highest rate that passed: **0 when no trial passed**, down to the lowest rate tried
//!    (the row says so with `resolved == false` or a zero rate, and `lowest_failed_pps`).
//!
//! A trial passes when its loss `(offered - received) / offered` is at most
//! [`LinerateConfig::loss_tolerance`] (RFC 2544 asks for zero loss, the default), **and**
//! the device offered at least `1 - offered_tolerance` of the frames the rate called for
//! (less one for rounding): a rate the generator or the device's input could not sustain
//! was not carried. A trial that offered nothing fails.
//!
//! The search assumes what RFC 2544 assumes: loss does not decrease as the rate grows. A
//! noisy device still gets an answer that *passed*, just not necessarily the best one.
//!
//! Frame sizes are counted as RFC 2544 counts them (64 B is the minimum Ethernet frame,
//! FCS included). Each frame also occupies 20 B more on the wire (preamble, start of frame
//! and the inter-frame gap), hence the line rate `gbps x 1e9 / ((frame_size + 20) x 8)`
//! and the two bit rates of a [`Row`]: `gbps_l1` with those 20 B, `gbps_l2` without.
//!
//! # Latency under load, as implemented by [`latency_sweep`]
//!
//! One trial per load, each offering `load x reference_pps` (the reference usually the
//! throughput just found, or the line rate), recording the achieved rate, the loss and the
//! latency percentiles the device measured.
//!
//! # Output
//!
//! [`LinerateReport`] and [`LatencyReport`] serialise to JSON, print as a table
//! ([`LinerateReport::table`], like MoonGen's and TRex's summaries), and write CSV and SVG
//! files (the SVG through [`super::plot`]).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use pfemu::lab::bench::linerate::*;
//!
//! /// Carries up to 2 Mpps of any size and drops the rest (a real device runs the trial).
//! struct TwoMpps;
//!
//! impl Device for TwoMpps {
//!     fn trial(&mut self, _size: usize, pps: f64, d: Duration) -> Result<Trial, DeviceError> {
//!         let offered = (pps * d.as_secs_f64()).round() as u64;
//!         let received = offered.min((2e6 * d.as_secs_f64()) as u64);
//!         Ok(Trial { offered, received, latency: None })
//!     }
//! }
//!
//! let cfg = LinerateConfig { sizes: vec![64, 1518], ..LinerateConfig::default() };
//! let report = search(&mut TwoMpps, &cfg, |p| {
//!     if let Progress::SizeDone(row) = p {
//!         eprintln!("{} B: {:.3} Mpps", row.frame_size, row.mpps);
//!     }
//! })?;
//! assert!((report.rows[0].mpps - 2.0).abs() <= 0.005 * 14.88); // within the resolution
//! assert_eq!(report.rows[1].percent_of_line_rate, 100.0); // 1518 B: 0.81 Mpps line rate
//! print!("{}", report.table());
//!
//! let sweep = latency_sweep(&mut TwoMpps, 64, &default_loads(), report.rows[0].throughput_pps,
//!                           Duration::from_millis(250))?;
//! assert_eq!(sweep.rows.len(), 10);
//! # Ok::<(), LinerateError>(())
//! ```

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Serialize, Serializer};

use super::plot::{self, Chart, DualChart, Series};
use super::traffic::{MAX_FRAME_SIZE, MIN_FRAME_SIZE};
use crate::ConfigError;

/// Bytes each frame occupies on the wire besides itself: preamble and start-of-frame
/// delimiter (8 B) and the minimum inter-frame gap (12 B) (the generator's constant).
pub const WIRE_OVERHEAD_BYTES: usize = super::traffic::L1_OVERHEAD_BYTES;

/// The Ethernet line rates usually tested, in Gbit/s (1, 10, 25, 40 and 100 GbE). Any
/// positive rate up to [`MAX_LINE_RATE_GBPS`] is accepted by
/// [`LinerateConfig::line_rate_gbps`].
pub const STANDARD_LINE_RATES_GBPS: [f64; 5] = [1.0, 10.0, 25.0, 40.0, 100.0];

/// RFC 2544's frame sizes for Ethernet, the default of [`LinerateConfig::sizes`].
pub const RFC2544_SIZES: [usize; 7] = [64, 128, 256, 512, 1024, 1280, 1518];

/// The fastest line rate accepted, in Gbit/s (1 Tbit/s: 1.49 G frames/s at 64 bytes).
pub const MAX_LINE_RATE_GBPS: f64 = 1000.0;

/// The highest offered load of a latency sweep ([`latency_sweep`]), as a fraction of its
/// reference rate: ten times it.
pub const MAX_LOAD: f64 = 10.0;

/// Most trials [`LinerateConfig::max_trials_per_size`] accepts.
pub const MAX_TRIALS_PER_SIZE: u32 = 64;

/// Longest [`LinerateConfig::trial_duration`] accepted.
pub const MAX_TRIAL_DURATION: Duration = Duration::from_secs(600);

/// Frames per second a link of `gbps` Gbit/s carries at most with frames of `frame_size`
/// bytes: `gbps x 1e9 / ((frame_size + 20) x 8)`. 64 B frames at 10 GbE: 14,880,952.4.
pub fn line_rate_pps(gbps: f64, frame_size: usize) -> f64 {
    super::traffic::line_rate_pps(gbps, frame_size as f64)
}

/// Bits per second on the wire (layer 1: frame plus 20 B of preamble and gap) of `pps`
/// frames of `frame_size` bytes, in Gbit/s.
pub fn gbps_l1(pps: f64, frame_size: usize) -> f64 {
    super::traffic::gbps_of(pps, frame_size as f64)
}

/// Bits per second of frame bytes alone (layer 2) of `pps` frames of `frame_size` bytes,
/// in Gbit/s.
pub fn gbps_l2(pps: f64, frame_size: usize) -> f64 {
    super::traffic::gbps_l2_of(pps, frame_size as f64)
}

// ----- the device ----------------------------------------------------------------------------

/// The error a [`Device`] returns when it cannot run a trial.
pub type DeviceError = Box<dyn Error + Send + Sync>;

/// Latency percentiles of the frames of one trial, in nanoseconds, filled in by the device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Frames whose latency was measured.
    pub count: u64,
    /// Median.
    pub p50_ns: u64,
    /// 99th percentile.
    pub p99_ns: u64,
    /// 99.9th percentile.
    pub p999_ns: u64,
    /// Largest.
    pub max_ns: u64,
    /// Mean.
    pub mean_ns: f64,
}

impl LatencySummary {
    /// The summary of `samples` (ns; sorted here, in place), with nearest-rank percentiles;
    /// `None` when there are none.
    pub fn from_samples(samples: &mut [u64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        samples.sort_unstable();
        let rank = |q: f64| {
            let r = (q * samples.len() as f64).ceil().max(1.0) as usize;
            samples[r.min(samples.len()) - 1]
        };
        let sum: u128 = samples.iter().map(|&x| u128::from(x)).sum();
        Some(LatencySummary {
            count: samples.len() as u64,
            p50_ns: rank(0.50),
            p99_ns: rank(0.99),
            p999_ns: rank(0.999),
            max_ns: samples[samples.len() - 1],
            mean_ns: sum as f64 / samples.len() as f64,
        })
    }
}

/// What one trial measured.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Trial {
    /// Frames actually offered to the device under test (fewer than the rate called for if
    /// the generator fell behind or the device refused them at its input).
    pub offered: u64,
    /// Frames that came out.
    pub received: u64,
    /// Their latencies, if the device measures them.
    pub latency: Option<LatencySummary>,
}

/// A device under test: something that can run trials at a given frame size and rate.
pub trait Device {
    /// Offers frames of `frame_size` bytes at `offered_pps` frames per second for
    /// `duration` (about `offered_pps x duration` frames, rounded), lets what is in flight
    /// come out, and reports the counts. Called once per trial; each trial should start
    /// from an idle device (RFC 2544 lets the device settle between trials).
    fn trial(
        &mut self,
        frame_size: usize,
        offered_pps: f64,
        duration: Duration,
    ) -> Result<Trial, DeviceError>;
}

// ----- errors --------------------------------------------------------------------------------

/// Why a search or a sweep stopped.
#[derive(Debug)]
#[non_exhaustive]
pub enum LinerateError {
    /// A setting was refused (named in the [`ConfigError`]).
    Config(ConfigError),
    /// The device failed a trial.
    Device {
        /// The frame size of the trial.
        frame_size: usize,
        /// The rate it was offered, frames per second.
        rate_pps: f64,
        /// The device's error.
        source: DeviceError,
    },
    /// A CSV or SVG file could not be written: which, and why.
    Output(String),
}

impl fmt::Display for LinerateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinerateError::Config(e) => write!(f, "{e}"),
            LinerateError::Device {
                frame_size,
                rate_pps,
                source,
            } => write!(
                f,
                "the device failed a trial of {frame_size} B frames at {:.0} pps: {source}",
                rate_pps
            ),
            LinerateError::Output(e) => write!(f, "writing the results: {e}"),
        }
    }
}

impl Error for LinerateError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            LinerateError::Config(e) => Some(e),
            LinerateError::Device { source, .. } => Some(source.as_ref()),
            LinerateError::Output(_) => None,
        }
    }
}

impl From<ConfigError> for LinerateError {
    fn from(e: ConfigError) -> Self {
        LinerateError::Config(e)
    }
}

// ----- configuration -------------------------------------------------------------------------

/// Where the search goes after the line-rate trial failed (see the [module
/// docs](self)). The first trial is always at the line rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InitialRate {
    /// RFC 2544's binary search: every trial at the middle of the bracket, starting from
    /// `[0, line rate)`. About `1 + log2(1 / resolution)` trials (9 at 0.5%).
    Bisect,
    /// Next, the rate the device delivered at line rate over `1 - loss_tolerance`; then
    /// steps of the resolution away from the last rate, doubling while the outcome
    /// repeats, never past the bracket's midpoint. About 3 trials for a device that drops
    /// what it cannot carry.
    Measured,
}

impl FromStr for InitialRate {
    type Err = ConfigError;

    /// `bisect` or `measured`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "bisect" => Ok(InitialRate::Bisect),
            "measured" => Ok(InitialRate::Measured),
            _ => Err(ConfigError::new(
                "initial_rate",
                format!("`{s}` is not one of `bisect`, `measured`"),
            )),
        }
    }
}

fn secs<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The throughput search's settings. The defaults run the 7 RFC 2544 sizes at 10 GbE with
/// zero loss, resolution 0.5% of line rate, trials of 0.5 s and at most 8 trials per size:
/// at most 56 trials, 30.8 s with 50 ms of setup per trial, about 12 s for a device that
/// drops what it cannot carry ([`LinerateConfig::max_run_time`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinerateConfig {
    /// Frame sizes to search, bytes (RFC 2544's 64 to 1518 by default), each in
    /// `64..=9216`.
    pub sizes: Vec<usize>,
    /// Largest fraction of offered frames a trial may lose and still pass, in `[0, 1)`.
    /// RFC 2544's throughput is at zero loss, the default.
    pub loss_tolerance: f64,
    /// Smallest fraction of the frames its rate called for that a trial must have offered to
    /// pass, in `[0, 1)` (default 0.001): a rate the device could not take was not carried.
    pub offered_tolerance: f64,
    /// How long each trial offers frames (default 0.5 s; RFC 2544 asks for 60 s, which is
    /// for hardware with stable queues; an emulator's loss shows within a fraction of a
    /// second). Serialised as seconds, `trial_duration_s`.
    #[serde(serialize_with = "secs", rename = "trial_duration_s")]
    pub trial_duration: Duration,
    /// The search stops when the bracket is at most this fraction of the line rate wide,
    /// in `(0, 1]` (default 0.005, 0.5%).
    pub resolution: f64,
    /// The line rate, Gbit/s (default 10; any positive rate, see
    /// [`STANDARD_LINE_RATES_GBPS`]).
    pub line_rate_gbps: f64,
    /// Most trials per frame size, `1..=64` (default 8: enough for [`InitialRate::Measured`]
    /// with room for a noisy device, and [`InitialRate::Bisect`] to 0.8%).
    pub max_trials_per_size: u32,
    /// Where the search goes after the line-rate trial failed (default
    /// [`InitialRate::Measured`]).
    pub initial_rate: InitialRate,
}

impl Default for LinerateConfig {
    fn default() -> Self {
        LinerateConfig {
            sizes: RFC2544_SIZES.to_vec(),
            loss_tolerance: 0.0,
            offered_tolerance: 0.001,
            trial_duration: Duration::from_millis(500),
            resolution: 0.005,
            line_rate_gbps: 10.0,
            max_trials_per_size: 8,
            initial_rate: InitialRate::Measured,
        }
    }
}

/// Refuses `setting` for `reason` unless `ok`.
fn ensure(
    ok: bool,
    setting: &'static str,
    reason: impl FnOnce() -> String,
) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(setting, reason()))
    }
}

fn check_frame_size(setting: &'static str, size: usize) -> Result<(), ConfigError> {
    ensure(
        (MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&size),
        setting,
        || format!("frame size {size} B is outside {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE} B"),
    )
}

/// Checks a line rate (`line_rate_gbps`): positive, finite, at most [`MAX_LINE_RATE_GBPS`].
pub fn check_line_rate(gbps: f64) -> Result<(), ConfigError> {
    ensure(
        gbps.is_finite() && gbps > 0.0 && gbps <= MAX_LINE_RATE_GBPS,
        "line_rate_gbps",
        || {
            format!(
                "{gbps} is not a number of Gbit/s from above 0 to {MAX_LINE_RATE_GBPS} (e.g. 1, \
                 10, 25, 40, 100)"
            )
        },
    )
}

/// Checks a latency sweep's loads (`loads`): at least one, each a fraction of the reference
/// rate above 0 and at most [`MAX_LOAD`].
pub fn check_loads(loads: &[f64]) -> Result<(), ConfigError> {
    ensure(!loads.is_empty(), "loads", || "no load to run".into())?;
    match loads
        .iter()
        .find(|l| !(l.is_finite() && **l > 0.0 && **l <= MAX_LOAD))
    {
        Some(l) => Err(ConfigError::new(
            "loads",
            format!(
                "{l} is not a fraction of the reference rate from above 0 to {MAX_LOAD} (1.3 \
                 is 130%)"
            ),
        )),
        None => Ok(()),
    }
}

/// Checks a latency sweep's reference rate (`reference_pps`, frames per second) for its
/// `loads` and trials of `duration`: a trial of the lowest load offers at least one frame,
/// and the rate is at most what [`MAX_LINE_RATE_GBPS`] carries of the smallest frames.
pub fn check_reference(
    reference_pps: f64,
    loads: &[f64],
    duration: Duration,
) -> Result<(), ConfigError> {
    let max = line_rate_pps(MAX_LINE_RATE_GBPS, MIN_FRAME_SIZE);
    ensure(
        reference_pps.is_finite() && reference_pps > 0.0 && reference_pps <= max,
        "reference_pps",
        || {
            format!(
                "{} Mpps is not a rate from above 0 to {:.1} Mpps (a {MAX_LINE_RATE_GBPS} Gbit/s \
                 link of {MIN_FRAME_SIZE} B frames)",
                reference_pps / 1e6,
                max / 1e6
            )
        },
    )?;
    let lowest = loads.iter().copied().fold(f64::INFINITY, f64::min);
    let frames = reference_pps * lowest * duration.as_secs_f64();
    ensure(frames >= 1.0, "reference_pps", || {
        format!(
            "{} Mpps is too slow: at load {lowest}, a trial of {duration:?} offers \
             {frames:.3} frames (at least 1)",
            reference_pps / 1e6
        )
    })
}

fn check_fraction(setting: &'static str, v: f64) -> Result<(), ConfigError> {
    ensure((0.0..1.0).contains(&v), setting, || {
        format!("{v} is not a fraction in [0, 1) (0.001 is 0.1%)")
    })
}

fn check_duration(setting: &'static str, d: Duration) -> Result<(), ConfigError> {
    ensure(!d.is_zero() && d <= MAX_TRIAL_DURATION, setting, || {
        format!("{:?} is outside (0, {} s]", d, MAX_TRIAL_DURATION.as_secs())
    })
}

impl LinerateConfig {
    /// Checks every setting; the error names the first one at fault and why.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.sizes.is_empty() {
            return Err(ConfigError::new("sizes", "no frame size to search"));
        }
        for &s in &self.sizes {
            check_frame_size("sizes", s)?;
        }
        check_fraction("loss_tolerance", self.loss_tolerance)?;
        check_fraction("offered_tolerance", self.offered_tolerance)?;
        check_line_rate(self.line_rate_gbps)?;
        let gbps = self.line_rate_gbps;
        let resolution = self.resolution;
        ensure(resolution > 0.0 && resolution <= 1.0, "resolution", || {
            format!("{resolution} is not a fraction of the line rate in (0, 1] (0.005 is 0.5%)")
        })?;
        let trials = self.max_trials_per_size;
        ensure(
            (1..=MAX_TRIALS_PER_SIZE).contains(&trials),
            "max_trials_per_size",
            || format!("{trials} is outside 1..={MAX_TRIALS_PER_SIZE}"),
        )?;
        check_duration("trial_duration", self.trial_duration)?;
        // The resolution must be worth at least one frame per trial at the largest size
        // (the slowest line rate in frames), or trials a resolution apart offer the same.
        let largest = self.sizes.iter().copied().max().unwrap_or(MIN_FRAME_SIZE);
        let step_frames = self.resolution
            * line_rate_pps(self.line_rate_gbps, largest)
            * self.trial_duration.as_secs_f64();
        ensure(step_frames >= 1.0, "trial_duration", || {
            format!(
                "{:?} is too short: at {gbps} Gbit/s with {largest} B frames, a resolution \
                 step of {resolution} of line rate is {step_frames:.2} frames per trial (at \
                 least 1)",
                self.trial_duration
            )
        })
    }

    /// The longest a search with these settings can take when each trial costs
    /// `trial_duration + setup_per_trial`: every size running out of trials.
    pub fn max_run_time(&self, setup_per_trial: Duration) -> Duration {
        (self.trial_duration + setup_per_trial)
            .saturating_mul(self.max_trials_per_size)
            .saturating_mul(self.sizes.len() as u32)
    }
}

// ----- the search ----------------------------------------------------------------------------

/// One trial of a search, as recorded in its [`Row`].
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TrialRecord {
    /// The rate asked of the device, frames per second.
    pub rate_pps: f64,
    /// Frames that rate calls for in one trial (`rate_pps x trial_duration`, rounded).
    pub expected: u64,
    /// Frames the device offered.
    pub offered: u64,
    /// Frames that came out.
    pub received: u64,
    /// `(offered - received) / offered`, 0 if more came out than went in, 1 if nothing was
    /// offered.
    pub loss: f64,
    /// The device's receive rate, `received / trial_duration`, frames per second.
    pub achieved_pps: f64,
    /// Whether the trial passed: `loss <= loss_tolerance` and enough frames offered.
    pub pass: bool,
    /// The latencies the device measured, if any.
    pub latency: Option<LatencySummary>,
}

/// The throughput search's result for one frame size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// Frame size, bytes.
    pub frame_size: usize,
    /// The line rate for this size, frames per second.
    pub line_rate_pps: f64,
    /// The throughput: the highest rate that passed, frames per second (0 if none did).
    pub throughput_pps: f64,
    /// The throughput in millions of frames per second.
    pub mpps: f64,
    /// The throughput in Gbit/s on the wire (frames plus 20 B each of preamble and gap).
    pub gbps_l1: f64,
    /// The throughput in Gbit/s of frame bytes.
    pub gbps_l2: f64,
    /// The throughput as a percentage of the line rate.
    pub percent_of_line_rate: f64,
    /// The search stopped because its bracket reached the resolution (or the line rate
    /// passed), not because it ran out of trials.
    pub resolved: bool,
    /// The lowest rate that failed, frames per second (`None` if the line rate passed): the
    /// throughput is below it.
    pub lowest_failed_pps: Option<f64>,
    /// The loss of the trial at the throughput (`None` if no trial passed).
    pub loss_at_result: Option<f64>,
    /// The latencies of the trial at the throughput (`None` if no trial passed or the
    /// device does not measure them).
    pub latency: Option<LatencySummary>,
    /// Every trial, in the order run.
    pub trials: Vec<TrialRecord>,
}

/// What [`search`] tells its progress callback.
#[derive(Clone, Copy, Debug)]
pub enum Progress<'a> {
    /// A trial finished.
    Trial {
        /// Its frame size.
        frame_size: usize,
        /// Its number within the size, from 1.
        index: u32,
        /// What it measured.
        record: &'a TrialRecord,
    },
    /// A frame size is done.
    SizeDone(&'a Row),
}

/// The throughput search's result: one [`Row`] per frame size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinerateReport {
    /// The settings searched with.
    pub config: LinerateConfig,
    /// One row per frame size, in the order of `config.sizes`.
    pub rows: Vec<Row>,
    /// The program under test, for the chart's title and the JSON (set by the caller, who
    /// knows the device; `None` from [`search`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
}

/// Runs one trial and judges it.
fn run_trial<D: Device + ?Sized>(
    device: &mut D,
    cfg_loss: f64,
    cfg_offered: f64,
    frame_size: usize,
    rate_pps: f64,
    duration: Duration,
) -> Result<TrialRecord, LinerateError> {
    let t = device
        .trial(frame_size, rate_pps, duration)
        .map_err(|source| LinerateError::Device {
            frame_size,
            rate_pps,
            source,
        })?;
    let secs = duration.as_secs_f64();
    let expected = (rate_pps * secs).round() as u64;
    let loss = if t.offered == 0 {
        1.0
    } else {
        t.offered.saturating_sub(t.received) as f64 / t.offered as f64
    };
    let enough = t.offered as f64 >= expected as f64 * (1.0 - cfg_offered) - 1.0;
    Ok(TrialRecord {
        rate_pps,
        expected,
        offered: t.offered,
        received: t.received,
        loss,
        achieved_pps: t.received as f64 / secs,
        pass: t.offered > 0 && enough && loss <= cfg_loss,
        latency: t.latency,
    })
}

/// The next rate to try inside the bracket `(lo, hi)`, `hi - lo > step`.
fn next_rate(
    policy: InitialRate,
    trials: &[TrialRecord],
    lo: f64,
    hi: f64,
    step: f64,
    loss_tolerance: f64,
) -> f64 {
    let mid = (lo + hi) / 2.0;
    if policy == InitialRate::Bisect {
        return mid;
    }
    let last = trials[trials.len() - 1];
    if trials.len() == 1 {
        // The line rate failed: try what the device carried.
        let guess = last.achieved_pps / (1.0 - loss_tolerance);
        return if guess.is_finite() && guess > lo {
            guess.min(hi - step / 2.0)
        } else {
            mid
        };
    }
    // Step away from the last rate, doubling while the outcome repeats.
    let streak = trials[1..]
        .iter()
        .rev()
        .take_while(|t| t.pass == last.pass)
        .count();
    let s = step * 2f64.powi(streak.saturating_sub(1).min(60) as i32);
    if last.pass {
        (lo + s).min(mid)
    } else {
        // Never above what the device just carried: a device whose capacity dropped (a
        // shared machine's slow phase) is found in one trial, not after a long walk down.
        let stepped = (hi - s).max(mid);
        let carried = last.achieved_pps / (1.0 - loss_tolerance);
        if carried.is_finite() && carried > lo && carried < stepped {
            carried
        } else {
            stepped
        }
    }
}

/// Searches the throughput of one frame size (see the [module docs](self)); `cfg` is
/// validated first.
pub fn search_size<D: Device + ?Sized>(
    device: &mut D,
    cfg: &LinerateConfig,
    frame_size: usize,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Row, LinerateError> {
    cfg.validate()?;
    check_frame_size("sizes", frame_size)?;
    let line = line_rate_pps(cfg.line_rate_gbps, frame_size);
    let step = cfg.resolution * line;
    let mut trials: Vec<TrialRecord> = Vec::new();
    let mut best: Option<usize> = None; // index of the highest passing trial
    let mut hi: Option<f64> = None;
    let mut rate = line;
    let resolved = loop {
        let rec = run_trial(
            device,
            cfg.loss_tolerance,
            cfg.offered_tolerance,
            frame_size,
            rate,
            cfg.trial_duration,
        )?;
        trials.push(rec);
        progress(Progress::Trial {
            frame_size,
            index: trials.len() as u32,
            record: &rec,
        });
        if rec.pass {
            best = Some(trials.len() - 1);
        } else {
            hi = Some(rate);
        }
        let lo = best.map_or(0.0, |i| trials[i].rate_pps);
        let Some(hi) = hi else {
            break true; // the line rate passed
        };
        // (With a little slack, so a probe one step above `lo` that fails resolves.)
        if hi - lo <= step * (1.0 + 1e-9) {
            break true;
        }
        if trials.len() >= cfg.max_trials_per_size as usize {
            break false;
        }
        rate = next_rate(cfg.initial_rate, &trials, lo, hi, step, cfg.loss_tolerance);
    };
    let at = best.map(|i| trials[i]);
    let pps = at.map_or(0.0, |t| t.rate_pps);
    let row = Row {
        frame_size,
        line_rate_pps: line,
        throughput_pps: pps,
        mpps: pps / 1e6,
        gbps_l1: gbps_l1(pps, frame_size),
        gbps_l2: gbps_l2(pps, frame_size),
        percent_of_line_rate: 100.0 * pps / line,
        resolved,
        lowest_failed_pps: hi,
        loss_at_result: at.map(|t| t.loss),
        latency: at.and_then(|t| t.latency),
        trials,
    };
    progress(Progress::SizeDone(&row));
    Ok(row)
}

/// Searches the throughput of every size of `cfg` in turn (see the [module docs](self)),
/// telling `progress` of every trial and every finished size. `cfg` is validated first.
pub fn search<D: Device + ?Sized>(
    device: &mut D,
    cfg: &LinerateConfig,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<LinerateReport, LinerateError> {
    cfg.validate()?;
    let rows = cfg
        .sizes
        .iter()
        .map(|&size| search_size(device, cfg, size, &mut progress))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(LinerateReport {
        config: cfg.clone(),
        rows,
        program: None,
    })
}

// ----- the search's output -------------------------------------------------------------------

fn opt<T>(v: Option<T>, f: impl Fn(T) -> String) -> String {
    v.map_or_else(String::new, f)
}

/// The CSV cells of a latency summary: p50, p99, p99.9, max and mean, in ns (empty when
/// none was measured).
fn latency_cells(l: Option<LatencySummary>) -> [String; 5] {
    [
        opt(l, |l| l.p50_ns.to_string()),
        opt(l, |l| l.p99_ns.to_string()),
        opt(l, |l| l.p999_ns.to_string()),
        opt(l, |l| l.max_ns.to_string()),
        opt(l, |l| format!("{:.1}", l.mean_ns)),
    ]
}

fn us_or_dash(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".into(), |v| format!("{:.2}", v as f64 / 1e3))
}

/// The files a report's `write_files` wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Written {
    /// The CSV, one row per frame size (or per load).
    pub csv: PathBuf,
    /// The CSV of every trial, when there is one.
    pub trials_csv: Option<PathBuf>,
    /// The SVG chart.
    pub svg: PathBuf,
    /// Where an earlier run's files at those paths were moved (`DIR/linerate.1.csv` ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<PathBuf>,
}

fn create_dir(dir: &Path) -> Result<(), LinerateError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        LinerateError::Output(format!("cannot create directory {}: {e}", dir.display()))
    })
}

fn out_err(path: &Path, e: impl fmt::Display) -> LinerateError {
    LinerateError::Output(format!("{}: {e}", path.display()))
}

impl LinerateReport {
    /// The stem of the report's files.
    pub const NAME: &'static str = "linerate";

    /// The per-size CSV's header.
    pub fn csv_header() -> Vec<&'static str> {
        vec![
            "frame_size",
            "line_rate_mpps",
            "mpps",
            "gbps_l1",
            "gbps_l2",
            "percent_of_line_rate",
            "trials",
            "resolved",
            "lowest_failed_mpps",
            "loss_at_result",
            "latency_p50_ns",
            "latency_p99_ns",
            "latency_p999_ns",
            "latency_max_ns",
            "latency_mean_ns",
        ]
    }

    /// One CSV row per frame size (empty cells where a value is absent).
    pub fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let mut row = vec![
                    r.frame_size.to_string(),
                    format!("{:.6}", r.line_rate_pps / 1e6),
                    format!("{:.6}", r.mpps),
                    format!("{:.4}", r.gbps_l1),
                    format!("{:.4}", r.gbps_l2),
                    format!("{:.3}", r.percent_of_line_rate),
                    r.trials.len().to_string(),
                    r.resolved.to_string(),
                    opt(r.lowest_failed_pps, |v| format!("{:.6}", v / 1e6)),
                    opt(r.loss_at_result, |v| format!("{v:.6}")),
                ];
                row.extend(latency_cells(r.latency));
                row
            })
            .collect()
    }

    /// The per-trial CSV's header.
    pub fn trials_csv_header() -> Vec<&'static str> {
        vec![
            "frame_size",
            "trial",
            "rate_pps",
            "expected",
            "offered",
            "received",
            "loss",
            "achieved_pps",
            "pass",
            "latency_p50_ns",
            "latency_p99_ns",
        ]
    }

    /// One CSV row per trial, sizes in order, trials in the order run.
    pub fn trials_csv_rows(&self) -> Vec<Vec<String>> {
        let mut rows = Vec::new();
        for r in &self.rows {
            for (i, t) in r.trials.iter().enumerate() {
                rows.push(vec![
                    r.frame_size.to_string(),
                    (i + 1).to_string(),
                    format!("{:.1}", t.rate_pps),
                    t.expected.to_string(),
                    t.offered.to_string(),
                    t.received.to_string(),
                    format!("{:.6}", t.loss),
                    format!("{:.1}", t.achieved_pps),
                    t.pass.to_string(),
                    opt(t.latency, |l| l.p50_ns.to_string()),
                    opt(t.latency, |l| l.p99_ns.to_string()),
                ]);
            }
        }
        rows
    }

    /// Draws throughput (Mpps) against frame size, with the line rate for reference, as
    /// SVG at `path`.
    pub fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError> {
        let line = |name: String, f: &dyn Fn(&Row) -> f64| Series {
            name,
            points: self
                .rows
                .iter()
                .map(|r| (r.frame_size as f64, f(r)))
                .collect(),
        };
        let title = format!(
            "RFC 2544 throughput{} at {} Gbit/s, {}% loss tolerance",
            self.program
                .as_deref()
                .map_or_else(String::new, |p| format!(" of {p}")),
            self.config.line_rate_gbps,
            self.config.loss_tolerance * 100.0
        );
        plot::svg(
            path,
            &Chart {
                title: &title,
                x_label: "frame size (B)",
                y_label: "throughput (Mpps)",
                series: vec![
                    line("measured".into(), &|r| r.mpps),
                    line(
                        format!("line rate ({} Gbit/s)", self.config.line_rate_gbps),
                        &|r| r.line_rate_pps / 1e6,
                    ),
                ],
            },
        )
    }

    /// The results as a table: frame size, Mpps, Gbit/s (wire and frame bytes), percentage
    /// of line rate, trials, and latency at the throughput when measured.
    pub fn table(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "RFC 2544 throughput: {} Gbit/s line rate, loss tolerance {}%, {} s trials, \
             resolution {}% of line rate, at most {} trials per size\n",
            c.line_rate_gbps,
            c.loss_tolerance * 100.0,
            c.trial_duration.as_secs_f64(),
            c.resolution * 100.0,
            c.max_trials_per_size
        );
        s += &format!(
            "{:>7} {:>10} {:>10} {:>9} {:>9} {:>8} {:>6} {:>9} {:>9}\n",
            "size B",
            "Mpps",
            "line Mpps",
            "Gb/s L1",
            "Gb/s L2",
            "% line",
            "trials",
            "p50 us",
            "p99 us"
        );
        for r in &self.rows {
            s += &format!(
                "{:>7} {:>10.3} {:>10.3} {:>9.3} {:>9.3} {:>7.2}% {:>5}{} {:>9} {:>9}\n",
                r.frame_size,
                r.mpps,
                r.line_rate_pps / 1e6,
                r.gbps_l1,
                r.gbps_l2,
                r.percent_of_line_rate,
                r.trials.len(),
                if r.resolved { ' ' } else { '*' },
                us_or_dash(r.latency.map(|l| l.p50_ns)),
                us_or_dash(r.latency.map(|l| l.p99_ns)),
            );
        }
        if self.rows.iter().any(|r| !r.resolved) {
            s += "* ran out of trials before reaching the resolution: the throughput is the \
                  highest rate that passed\n";
        }
        s
    }

    /// Writes `DIR/linerate.csv` (one row per size), `DIR/linerate_trials.csv` (one row per
    /// trial) and `DIR/linerate.svg`, creating `dir` if needed; an earlier run's files there
    /// are moved aside, not overwritten ([`plot::keep_earlier`]).
    pub fn write_files(&self, dir: &Path) -> Result<Written, LinerateError> {
        create_dir(dir)?;
        let kept = plot::keep_earlier(dir, Self::NAME, &[".csv", "_trials.csv", ".svg"])
            .map_err(|e| out_err(dir, e))?;
        let csv = dir.join(format!("{}.csv", Self::NAME));
        let trials_csv = dir.join(format!("{}_trials.csv", Self::NAME));
        let svg = dir.join(format!("{}.svg", Self::NAME));
        plot::csv(&csv, &Self::csv_header(), &self.csv_rows()).map_err(|e| out_err(&csv, e))?;
        plot::csv(
            &trials_csv,
            &Self::trials_csv_header(),
            &self.trials_csv_rows(),
        )
        .map_err(|e| out_err(&trials_csv, e))?;
        self.draw(&svg).map_err(|e| out_err(&svg, e))?;
        Ok(Written {
            csv,
            trials_csv: Some(trials_csv),
            svg,
            kept,
        })
    }
}

// ----- latency under load --------------------------------------------------------------------

/// Loads from 10% to 100% of the reference rate in steps of 10%.
pub fn default_loads() -> Vec<f64> {
    (1..=10).map(|i| f64::from(i) / 10.0).collect()
}

/// One load of a latency sweep.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct LatencyRow {
    /// The load, a fraction of the reference rate.
    pub load: f64,
    /// The rate offered, frames per second (`load x reference_pps`).
    pub offered_pps: f64,
    /// The rate that came out, `received / duration`, frames per second.
    pub achieved_pps: f64,
    /// Frames offered.
    pub offered: u64,
    /// Frames that came out.
    pub received: u64,
    /// `(offered - received) / offered` (1 if nothing was offered).
    pub loss: f64,
    /// The latencies the device measured, if any.
    pub latency: Option<LatencySummary>,
}

/// Latency against offered load for one frame size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyReport {
    /// Frame size, bytes.
    pub frame_size: usize,
    /// The rate the loads are fractions of, frames per second.
    pub reference_pps: f64,
    /// How long each trial offered frames, seconds.
    pub duration_s: f64,
    /// One row per load, in the order given.
    pub rows: Vec<LatencyRow>,
    /// The program under test, for the chart's title and the JSON (set by the caller, who
    /// knows the device; `None` from [`latency_sweep`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
}

/// Runs one trial per load at `load x reference_pps` frames of `frame_size` bytes per
/// second for `duration` each, in the order given. Loads are positive fractions (above 1
/// overloads the reference).
pub fn latency_sweep<D: Device + ?Sized>(
    device: &mut D,
    frame_size: usize,
    loads: &[f64],
    reference_pps: f64,
    duration: Duration,
) -> Result<LatencyReport, LinerateError> {
    check_frame_size("frame_size", frame_size)?;
    check_loads(loads)?;
    check_duration("duration", duration)?;
    check_reference(reference_pps, loads, duration)?;
    let mut rows = Vec::with_capacity(loads.len());
    for &load in loads {
        let rate = load * reference_pps;
        let t = run_trial(device, 0.0, 0.0, frame_size, rate, duration)?;
        rows.push(LatencyRow {
            load,
            offered_pps: rate,
            achieved_pps: t.achieved_pps,
            offered: t.offered,
            received: t.received,
            loss: t.loss,
            latency: t.latency,
        });
    }
    Ok(LatencyReport {
        frame_size,
        reference_pps,
        duration_s: duration.as_secs_f64(),
        rows,
        program: None,
    })
}

impl LatencyReport {
    /// The stem of the report's files: `latency_<frame_size>`.
    pub fn name(&self) -> String {
        format!("latency_{}", self.frame_size)
    }

    /// The CSV's header.
    pub fn csv_header() -> Vec<&'static str> {
        vec![
            "load",
            "offered_pps",
            "achieved_pps",
            "offered",
            "received",
            "loss",
            "samples",
            "p50_ns",
            "p99_ns",
            "p999_ns",
            "max_ns",
            "mean_ns",
        ]
    }

    /// One CSV row per load (latency cells empty if the device measured none).
    pub fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let mut row = vec![
                    format!("{:.4}", r.load),
                    format!("{:.1}", r.offered_pps),
                    format!("{:.1}", r.achieved_pps),
                    r.offered.to_string(),
                    r.received.to_string(),
                    format!("{:.6}", r.loss),
                    opt(r.latency, |l| l.count.to_string()),
                ];
                row.extend(latency_cells(r.latency));
                row
            })
            .collect()
    }

    /// Draws latency (µs: p50, p99, p99.9, on a log axis) and the loss (% of the frames
    /// offered, on the right axis) against offered load (% of the reference) as SVG at
    /// `path`; loads without latencies are left out of the latency lines.
    pub fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError> {
        let line = |name: &str, f: &dyn Fn(&LatencySummary) -> u64| Series {
            name: name.into(),
            points: self
                .rows
                .iter()
                .filter_map(|r| r.latency.map(|l| (r.load * 100.0, f(&l) as f64 / 1e3)))
                .collect(),
        };
        let loss = Series {
            name: "loss (%)".into(),
            points: self
                .rows
                .iter()
                .map(|r| (r.load * 100.0, r.loss * 100.0))
                .collect(),
        };
        let title = format!(
            "Latency under load{}, {} B frames (100% = {:.3} Mpps)",
            self.program
                .as_deref()
                .map_or_else(String::new, |p| format!(": {p}")),
            self.frame_size,
            self.reference_pps / 1e6
        );
        plot::svg_dual(
            path,
            &DualChart {
                title: &title,
                x_label: "offered load (% of reference rate)",
                left_label: "latency (us, log scale)",
                right_label: "loss (% of frames offered)",
                x_log2: false,
                left_log10: true,
                left: vec![
                    line("p50", &|l| l.p50_ns),
                    line("p99", &|l| l.p99_ns),
                    line("p99.9", &|l| l.p999_ns),
                ],
                right: vec![loss],
            },
        )
    }

    /// The rows as a table.
    pub fn table(&self) -> String {
        let mut s = format!(
            "latency under load: {} B frames, 100% = {:.3} Mpps, {} s per load\n",
            self.frame_size,
            self.reference_pps / 1e6,
            self.duration_s
        );
        s += &format!(
            "{:>6} {:>10} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9}\n",
            "load", "offer Mpps", "got Mpps", "loss %", "p50 us", "p99 us", "p99.9 us", "max us"
        );
        for r in &self.rows {
            s += &format!(
                "{:>5.0}% {:>10.3} {:>10.3} {:>9.4} {:>9} {:>9} {:>9} {:>9}\n",
                r.load * 100.0,
                r.offered_pps / 1e6,
                r.achieved_pps / 1e6,
                r.loss * 100.0,
                us_or_dash(r.latency.map(|l| l.p50_ns)),
                us_or_dash(r.latency.map(|l| l.p99_ns)),
                us_or_dash(r.latency.map(|l| l.p999_ns)),
                us_or_dash(r.latency.map(|l| l.max_ns)),
            );
        }
        s
    }

    /// Writes `DIR/latency_<size>.csv` and `DIR/latency_<size>.svg`, creating `dir` if
    /// needed; an earlier run's files there are moved aside, not overwritten
    /// ([`plot::keep_earlier`]).
    pub fn write_files(&self, dir: &Path) -> Result<Written, LinerateError> {
        create_dir(dir)?;
        let kept = plot::keep_earlier(dir, &self.name(), &[".csv", ".svg"])
            .map_err(|e| out_err(dir, e))?;
        let csv = dir.join(format!("{}.csv", self.name()));
        let svg = dir.join(format!("{}.svg", self.name()));
        plot::csv(&csv, &Self::csv_header(), &self.csv_rows()).map_err(|e| out_err(&csv, e))?;
        self.draw(&svg).map_err(|e| out_err(&svg, e))?;
        Ok(Written {
            csv,
            trials_csv: None,
            svg,
            kept,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Drops what exceeds `capacity_pps`.
    struct Ideal {
        capacity_pps: f64,
    }

    impl Device for Ideal {
        fn trial(&mut self, _: usize, pps: f64, d: Duration) -> Result<Trial, DeviceError> {
            let offered = (pps * d.as_secs_f64()).round() as u64;
            let cap = (self.capacity_pps * d.as_secs_f64()).floor() as u64;
            Ok(Trial {
                offered,
                received: offered.min(cap),
                latency: None,
            })
        }
    }

    #[test]
    fn line_rates_match_the_usual_figures() {
        assert_eq!(line_rate_pps(10.0, 64).round(), 14_880_952.0);
        assert_eq!(line_rate_pps(1.0, 64).round(), 1_488_095.0);
        assert_eq!(line_rate_pps(100.0, 64).round(), 148_809_524.0);
        assert_eq!(line_rate_pps(10.0, 1518).round(), 812_744.0);
        let pps = line_rate_pps(25.0, 512);
        assert!((gbps_l1(pps, 512) - 25.0).abs() < 1e-9);
        assert!((gbps_l2(pps, 512) - 25.0 * 512.0 / 532.0).abs() < 1e-9);
    }

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let mut v: Vec<u64> = (1..=1000).rev().collect();
        let l = LatencySummary::from_samples(&mut v).unwrap();
        assert_eq!(
            (l.count, l.p50_ns, l.p99_ns, l.p999_ns, l.max_ns),
            (1000, 500, 990, 999, 1000)
        );
        assert_eq!(l.mean_ns, 500.5);
        assert_eq!(LatencySummary::from_samples(&mut []), None);
    }

    #[test]
    fn the_defaults_are_valid_and_fit_in_two_minutes() {
        let cfg = LinerateConfig::default();
        cfg.validate().unwrap();
        assert!(cfg.max_run_time(Duration::from_millis(50)) < Duration::from_secs(60));
    }

    #[test]
    fn the_measured_policy_needs_few_trials_and_bisection_a_logarithmic_number() {
        for (policy, most) in [(InitialRate::Measured, 3), (InitialRate::Bisect, 8)] {
            let cfg = LinerateConfig {
                initial_rate: policy,
                ..LinerateConfig::default()
            };
            let line = line_rate_pps(10.0, 64);
            let mut dev = Ideal {
                capacity_pps: 0.37 * line,
            };
            let row = search_size(&mut dev, &cfg, 64, &mut |_| {}).unwrap();
            assert!(row.trials.len() <= most, "{policy:?}: {row:?}");
            assert!(row.throughput_pps <= 0.37 * line);
            if row.resolved {
                assert!(row.throughput_pps >= 0.37 * line - cfg.resolution * line);
            }
        }
    }

    #[test]
    fn initial_rate_parses() {
        assert_eq!("bisect".parse::<InitialRate>(), Ok(InitialRate::Bisect));
        assert_eq!("measured".parse::<InitialRate>(), Ok(InitialRate::Measured));
        assert_eq!(
            "fast".parse::<InitialRate>().unwrap_err().setting,
            "initial_rate"
        );
    }
}
