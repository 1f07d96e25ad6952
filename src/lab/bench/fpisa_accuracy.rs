//! The FPISA accuracy report (FPISA paper, NSDI 2022, §4.3 and §5.3.1, Figure 8): how far
//! FPISA and FPISA-A sums of gradient-like FP32 values are from the exact sum, next to plain
//! sequential `f32` addition, and how often FPISA-A overwrites or left-shifts.
//!
//! Pure arithmetic on the host: no PFE, no threads, no clock. The data flows so:
//!
//! ```text
//! gradients(cfg, W)   W workers x lanes FP32 values, worker w ~ N(0, sigma_w)
//!   --sum_lanes-->    per lane, over the workers in worker order:
//!                       f64 sum (the reference), f32 sum, Acc::add_bits Full and Approx
//!                       read with value(Fp32); FPISA-A's events counted (FpisaCounts)
//!   --measure-->      one AccuracyRow per method: absolute error vs the f64 sum (median,
//!                     p99, max, Figure 8's decade bins), relative error, distance to the
//!                     f32 sum, event shares
//! ```
//!
//! [`fpisa_accuracy`] does this for each worker count of the configuration and returns an
//! [`AccuracyReport`], which is an experiments [`Figure`]: a CSV row per (workers, method),
//! an SVG of the median and maximum errors against the worker count, and a table.
//!
//! # The data
//!
//! For `W` workers, the scales `sigma_w` are log-spaced over `sigma_decades` decades around
//! `sigma_mid` (geometric middle), and dealt to the workers in an order drawn from the seed,
//! so the sum order is neither the ascending worst case for FPISA-A (small sums overwritten
//! by large arrivals) nor the descending best case. Worker `w`'s `lanes` values are
//! `N(0, sigma_w)` samples (Box-Muller on [`SplitMix64`]) rounded to FP32. Everything is a
//! function of the seed, `W` and the configuration, so a report is reproducible bit for bit.
//!
//! The default spread, one decade, is chosen to match the one statistic the paper gives of
//! its gradients' element-wise spread (§5.2, Figure 7): about 83% of elements have a
//! max/min ratio among eight workers below `2^7`; one decade gives 81% at 8 workers (two
//! decades give 33%, the same scale for all 92%). Each row reports this share for its data
//! ([`AccuracyRow::share_ratio_below_128`]).
//!
//! The errors are absolute, so their decades follow the data's scale: scaling the data by
//! `2^k` scales every error by `2^k`. With the default scales (`10^-3.5` to `10^-2.5`; a
//! lane's sum is typically `1e-3` to `1e-2`, where FP32's ulp is `1e-10` to `1e-9`) rounding
//! errors land in and just below the paper's `[1e-10, 1e-8)`. Two statistics do not depend
//! on the scale: the share of lanes whose error reaches FPISA's documented rounding bound
//! for the lane ([`AccuracyRow::share_beyond_bound`]: for FPISA-A, the lanes an overwrite or
//! an overflow damaged) and the event shares.
//!
//! # What is counted
//!
//! An *addition* is one [`Acc::add_bits`] call, so a lane of `W` workers makes `W` additions,
//! the first into an empty accumulator (never an event). The reference is the `f64` sum in
//! worker order; it is not exact, but its error (below `W * 2^-53` of the sum of the
//! magnitudes) is far below anything measured here. The bound check of FPISA (Full) against
//! `src/fpisa.rs`'s documented bound, `|S - value| < (N - 1) u(E_max) + ulp(value)`,
//! allows for exactly that slack; the report is [`Figure::verified`] when every lane of
//! every worker count is within it and Full never overflowed (it cannot with at most 128
//! workers: the aligned mantissas are each below `2^24`).
//!
//! FPISA-A can overflow although `W <= 128`: it never raises the stored exponent (only an
//! overwrite replaces it), so when a lane's first values are small, later ones are
//! left-shifted by up to 7 bits into the same headroom the sum grows in. Such a lane
//! saturates and is flagged ([`Acc::OVERFLOW`]); its value is far off, which the maxima show.

use std::fmt;
use std::path::Path;

use serde::Serialize;

use super::experiments::{ExperimentError, Figure};
use super::plot::{self, LogChart, Series};
use crate::fpisa::{decompose, Acc, Class, Format, FpisaCounts, Variant};
use crate::rng::{mix, SplitMix64};

/// Most workers a sum may have: the headroom's 7 bits hold 128 aligned mantissas, so Full
/// cannot overflow up to here.
pub const MAX_WORKERS: usize = 128;
/// Most lanes per worker count (a run holds `workers x lanes` values).
pub const MAX_LANES: usize = 1 << 20;

/// The decade bins of the paper's Figure 8, as upper edges: `[0, 1e-12)`, `[1e-12, 1e-10)`,
/// `[1e-10, 1e-8)`, `[1e-8, 1e-6)`, and `>= 1e-6`.
pub const BIN_EDGES: [f64; 4] = [1e-12, 1e-10, 1e-8, 1e-6];

// ----- configuration and data ----------------------------------------------------------------

/// What to measure; as command-line options, those of `pfemu experiment fpisa-accuracy`
/// (defaults from [`AccuracyConfig::default`]).
#[derive(Clone, Debug, PartialEq, Serialize, clap::Args)]
pub struct AccuracyConfig {
    /// Worker counts, one measurement each (`--workers-list`; 1 to [`MAX_WORKERS`]).
    #[arg(long = "workers-list", value_name = "N,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&AccuracyConfig::default().workers),
          help = "Worker counts (1..=128)")]
    pub workers: Vec<usize>,
    /// Values per worker, i.e. sums per worker count (`--lanes`; 1 to [`MAX_LANES`]).
    #[arg(long, default_value_t = AccuracyConfig::default().lanes, help = "Values per worker, i.e. sums per worker count (1..=1048576)")]
    pub lanes: usize,
    /// Geometric middle of the worker scales (standard deviations); positive.
    #[arg(skip = AccuracyConfig::default().sigma_mid)]
    pub sigma_mid: f64,
    /// Decades the worker scales span (`--sigma-decades`; 0 gives every worker the same
    /// scale; at most 10).
    #[arg(long, default_value_t = AccuracyConfig::default().sigma_decades,
          help = "Decades the workers' scales span, around 1e-3 (0..=10; 0 gives every worker the same scale)")]
    pub sigma_decades: f64,
    /// Seed of the values and of the order the scales are dealt in (`--seed`).
    #[arg(long, default_value_t = AccuracyConfig::default().seed, help = "Seed of the values and of the order the scales are dealt in")]
    pub seed: u64,
}

impl Default for AccuracyConfig {
    /// 2, 4, 8, 16, 32 and 64 workers; 65536 lanes; scales over one decade around `1e-3`
    /// (`10^-3.5` to `10^-2.5`); seed 1.
    fn default() -> Self {
        AccuracyConfig {
            workers: vec![2, 4, 8, 16, 32, 64],
            lanes: 65536,
            sigma_mid: 1e-3,
            sigma_decades: 1.0,
            seed: 1,
        }
    }
}

fn bad<T>(option: &'static str, reason: impl Into<String>) -> Result<T, ExperimentError> {
    Err(ExperimentError::Option {
        option,
        reason: reason.into(),
    })
}

impl AccuracyConfig {
    /// Checks every setting; the error names the first one out of range.
    pub fn validate(&self) -> Result<(), ExperimentError> {
        if self.workers.is_empty() {
            return bad("--workers-list", "no worker counts given");
        }
        if let Some(&w) = self
            .workers
            .iter()
            .find(|&&w| !(1..=MAX_WORKERS).contains(&w))
        {
            return bad(
                "--workers-list",
                format!(
                    "{w}; accepted 1..={MAX_WORKERS} (the 7 headroom bits hold 128 aligned \
                     mantissas)"
                ),
            );
        }
        if !(1..=MAX_LANES).contains(&self.lanes) {
            return bad(
                "--lanes",
                format!("{}; accepted 1..={MAX_LANES}", self.lanes),
            );
        }
        if !(0.0..=10.0).contains(&self.sigma_decades) {
            return bad(
                "--sigma-decades",
                format!("{}; accepted 0..=10", self.sigma_decades),
            );
        }
        // Keeps the values normal and finite in FP32, with room for the sums, but for
        // samples a 1e-18 chance from zero.
        let half = 10f64.powf(self.sigma_decades / 2.0);
        if !(self.sigma_mid / half >= 1e-20 && self.sigma_mid * half <= 1e20) {
            return bad(
                "sigma_mid",
                format!(
                    "{}; the scales, {} decade(s) around it, must lie within 1e-20..=1e20",
                    self.sigma_mid, self.sigma_decades
                ),
            );
        }
        Ok(())
    }
}

/// The scale (standard deviation) of each of `workers` workers, in worker order: log-spaced
/// over `cfg.sigma_decades` decades centred (geometrically) on `cfg.sigma_mid`, dealt in a
/// seeded random order.
pub fn worker_scales(cfg: &AccuracyConfig, workers: usize) -> Vec<f64> {
    let step = if workers > 1 {
        cfg.sigma_decades / (workers - 1) as f64
    } else {
        0.0
    };
    let lowest = -cfg.sigma_decades / 2.0;
    let mut scales: Vec<f64> = (0..workers)
        .map(|i| cfg.sigma_mid * 10f64.powf(lowest + step * i as f64))
        .collect();
    if workers == 1 {
        scales[0] = cfg.sigma_mid;
    }
    // Fisher-Yates with a generator of its own, so the values do not depend on the order.
    let mut rng = SplitMix64::new(mix(cfg.seed ^ 0x005C_A1E5 ^ ((workers as u64) << 40)));
    for i in (1..workers).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        scales.swap(i, j);
    }
    scales
}

/// Worker `w`'s values for a run of `workers` workers: `cfg.lanes` samples of
/// `N(0, scales[w])` rounded to FP32, outer index the worker.
pub fn gradients(cfg: &AccuracyConfig, workers: usize) -> Vec<Vec<f32>> {
    worker_scales(cfg, workers)
        .into_iter()
        .enumerate()
        .map(|(w, sigma)| {
            let stream = ((workers as u64) << 32) | w as u64;
            let mut rng = SplitMix64::new(mix(cfg.seed ^ mix(stream)));
            let mut out = Vec::with_capacity(cfg.lanes + 1);
            while out.len() < cfg.lanes {
                // Box-Muller: two uniforms, two independent standard normals.
                let r = (-2.0 * (1.0 - rng.uniform()).ln()).sqrt();
                let theta = std::f64::consts::TAU * rng.uniform();
                out.push((sigma * r * theta.cos()) as f32);
                out.push((sigma * r * theta.sin()) as f32);
            }
            out.truncate(cfg.lanes);
            out
        })
        .collect()
}

// ----- summing -------------------------------------------------------------------------------

/// Every lane summed every way, in worker order.
#[derive(Clone, Debug)]
pub struct LaneSums {
    /// Workers summed per lane.
    pub workers: usize,
    /// The `f64` sum of each lane (the reference).
    pub reference: Vec<f64>,
    /// The sequential `f32` sum (round to nearest even after every addition).
    pub f32_sequential: Vec<f32>,
    /// FPISA ([`Variant::Full`]), read with `value(Format::Fp32)`.
    pub fpisa: Vec<f32>,
    /// FPISA-A ([`Variant::Approx`]), read with `value(Format::Fp32)`.
    pub fpisa_a: Vec<f32>,
    /// FPISA's additions and events (overflows only: Full neither overwrites nor
    /// left-shifts).
    pub fpisa_counts: FpisaCounts,
    /// FPISA-A's additions, overwrites, left shifts and overflows.
    pub fpisa_a_counts: FpisaCounts,
    /// Lanes where FPISA overflowed at least once.
    pub fpisa_overflowed_lanes: u64,
    /// Lanes where FPISA-A overflowed at least once (its sum saturated).
    pub fpisa_a_overflowed_lanes: u64,
    /// Lanes where FPISA-A overwrote at least once (it dropped part of the sum).
    pub fpisa_a_overwritten_lanes: u64,
    /// Each lane's FPISA error bound, `(N - 1) u(E_max) + ulp(FPISA sum)` as `src/fpisa.rs`
    /// documents it, plus the slack allowed for the `f64` reference (see the module docs):
    /// an error this large is more than FPISA's rounding can make.
    pub bound: Vec<f64>,
    /// Lanes whose FPISA sum is outside its bound: `|f64 sum - FPISA sum| < bound`.
    pub bound_violations: u64,
    /// Lanes whose largest nonzero input magnitude is less than `2^7` times the smallest
    /// (the paper's Figure 7 statistic: about 83% of its eight workers' gradient elements).
    pub narrow_lanes: u64,
}

/// One unit in the last place of a nonzero normal FP32 value (`0` for zero).
fn ulp32(v: f32) -> f64 {
    let e = (v.to_bits() >> 23) & 0xFF;
    if e == 0 {
        0.0
    } else {
        2f64.powi(e as i32 - 150)
    }
}

/// Sums each lane of `values` (outer index the worker, every worker the same number of
/// lanes) in worker order, four ways.
///
/// # Panics
///
/// If the workers' vectors differ in length.
pub fn sum_lanes(values: &[Vec<f32>]) -> LaneSums {
    let workers = values.len();
    let lanes = values.first().map_or(0, Vec::len);
    assert!(
        values.iter().all(|v| v.len() == lanes),
        "every worker needs the same number of lanes"
    );
    let mut s = LaneSums {
        workers,
        reference: Vec::with_capacity(lanes),
        f32_sequential: Vec::with_capacity(lanes),
        bound: Vec::with_capacity(lanes),
        fpisa: Vec::with_capacity(lanes),
        fpisa_a: Vec::with_capacity(lanes),
        fpisa_counts: FpisaCounts::default(),
        fpisa_a_counts: FpisaCounts::default(),
        fpisa_overflowed_lanes: 0,
        fpisa_a_overflowed_lanes: 0,
        fpisa_a_overwritten_lanes: 0,
        bound_violations: 0,
        narrow_lanes: 0,
    };
    for lane in 0..lanes {
        let (mut r64, mut r32, mut magnitudes) = (0f64, 0f32, 0f64);
        let (mut full, mut approx) = (Acc::ZERO, Acc::ZERO);
        let mut overwritten = false;
        let mut e_max = 0u8;
        let (mut lo, mut hi) = (f64::INFINITY, 0f64);
        for v in values {
            let x = v[lane];
            if x != 0.0 {
                lo = lo.min(f64::from(x).abs());
                hi = hi.max(f64::from(x).abs());
            }
            r64 += f64::from(x);
            r32 += x;
            magnitudes += f64::from(x).abs();
            let d = decompose(x.to_bits(), Format::Fp32);
            if d.class == Class::Normal {
                e_max = e_max.max(d.exp);
            }
            s.fpisa_counts.record(full.add(d, Variant::Full));
            let events = approx.add(d, Variant::Approx);
            overwritten |= events.overwrite;
            s.fpisa_a_counts.record(events);
        }
        s.fpisa_overflowed_lanes += u64::from(full.flags & Acc::OVERFLOW != 0);
        s.fpisa_a_overflowed_lanes += u64::from(approx.flags & Acc::OVERFLOW != 0);
        s.fpisa_a_overwritten_lanes += u64::from(overwritten);
        let f = f32::from_bits(full.value(Format::Fp32));
        let a = f32::from_bits(approx.value(Format::Fp32));
        // |S - value| < (N - 1) u(E_max) + ulp(value), S the exact sum; the f64 sum is
        // within (N - 1) 2^-53 sum|x| of S.
        let slack = workers as f64 * magnitudes * 2f64.powi(-52);
        let bound =
            workers.saturating_sub(1) as f64 * 2f64.powi(i32::from(e_max) - 150) + ulp32(f) + slack;
        let below = r64 - f64::from(f);
        if below.is_nan() || below.abs() >= bound {
            s.bound_violations += 1;
        }
        s.bound.push(bound);
        if hi < 128.0 * lo {
            s.narrow_lanes += 1;
        }
        s.reference.push(r64);
        s.f32_sequential.push(r32);
        s.fpisa.push(f);
        s.fpisa_a.push(a);
    }
    s
}

// ----- statistics ----------------------------------------------------------------------------

/// How a lane was summed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Method {
    /// FPISA with the shift-and-add memory unit ([`Variant::Full`]).
    Fpisa,
    /// FPISA-A, as on Tofino ([`Variant::Approx`]).
    FpisaA,
    /// Plain `f32` addition in worker order.
    F32Sequential,
}

impl Method {
    /// Every method, in report order.
    pub const ALL: [Method; 3] = [Method::Fpisa, Method::FpisaA, Method::F32Sequential];

    /// The name in the CSV and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            Method::Fpisa => "fpisa",
            Method::FpisaA => "fpisa_a",
            Method::F32Sequential => "f32_sequential",
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The errors and events of one method at one worker count.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AccuracyRow {
    /// Workers summed per lane.
    pub workers: usize,
    /// How.
    pub method: Method,
    /// Lanes (sums) measured.
    pub lanes: usize,
    /// Share of lanes whose largest input magnitude is less than `2^7` times the smallest
    /// (a property of the data, the same for every method; the paper's Figure 7: about 83%).
    pub share_ratio_below_128: f64,
    /// Median absolute error against the `f64` sum.
    pub abs_median: f64,
    /// 99th percentile of the absolute error (nearest rank).
    pub abs_p99: f64,
    /// Largest absolute error.
    pub abs_max: f64,
    /// Share of lanes with absolute error in `[0, 1e-12)`.
    pub share_below_1e12: f64,
    /// Share in `[1e-12, 1e-10)`.
    pub share_1e12_1e10: f64,
    /// Share in `[1e-10, 1e-8)` (the paper: over 95% of FPISA-A's VGG19 errors).
    pub share_1e10_1e8: f64,
    /// Share in `[1e-8, 1e-6)`.
    pub share_1e8_1e6: f64,
    /// Share at `1e-6` or above.
    pub share_from_1e6: f64,
    /// Share below `1e-8` (the first three bins; the paper: over 95% of FPISA-A's errors in
    /// `[1e-10, 1e-8]`, i.e. below `1e-8`).
    pub share_below_1e8: f64,
    /// Share of lanes whose error reaches FPISA's documented bound for the lane
    /// ([`LaneSums::bound`]): more than FPISA's rounding explains, so for FPISA-A the lanes
    /// an overwrite or an overflow damaged. Independent of the data's scale.
    pub share_beyond_bound: f64,
    /// Median relative error, `|error| / |f64 sum|`, over the lanes whose sum is not 0.
    pub rel_median: f64,
    /// Largest relative error (near-cancelling lanes make it large).
    pub rel_max: f64,
    /// Median of `|sum - f32 sequential sum|`: the paper's comparison, against standard
    /// floating-point addition (0 for the `f32` row itself).
    pub vs_f32_median: f64,
    /// Largest `|sum - f32 sequential sum|`.
    pub vs_f32_max: f64,
    /// Additions made (`workers x lanes` for FPISA and FPISA-A, 0 for `f32`).
    pub additions: u64,
    /// FPISA-A overwrite events.
    pub overwrites: u64,
    /// FPISA-A left-shift events.
    pub left_shifts: u64,
    /// Additions that overflowed the headroom.
    pub overflows: u64,
    /// Lanes with at least one overwrite.
    pub overwritten_lanes: u64,
    /// Lanes with at least one overflow (the sum saturated at the headroom's limit).
    pub overflowed_lanes: u64,
    /// `overwrites / additions` (0 when there are none).
    pub overwrite_share: f64,
    /// `left_shifts / additions`.
    pub left_shift_share: f64,
    /// FPISA only: lanes outside the bound `src/fpisa.rs` documents (expected 0).
    pub bound_violations: Option<u64>,
}

/// The value at nearest rank `q` of sorted `v` (0 if empty).
fn percentile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_unstable_by(f64::total_cmp);
    v
}

fn share(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        n as f64 / of as f64
    }
}

/// The rows of one worker count: one per [`Method`], in [`Method::ALL`] order.
pub fn measure(s: &LaneSums) -> Vec<AccuracyRow> {
    Method::ALL
        .iter()
        .map(|&method| {
            let (sums, counts, overwritten, overflowed) = match method {
                Method::Fpisa => (&s.fpisa, s.fpisa_counts, 0, s.fpisa_overflowed_lanes),
                Method::FpisaA => (
                    &s.fpisa_a,
                    s.fpisa_a_counts,
                    s.fpisa_a_overwritten_lanes,
                    s.fpisa_a_overflowed_lanes,
                ),
                Method::F32Sequential => (&s.f32_sequential, FpisaCounts::default(), 0, 0),
            };
            let lanes = sums.len();
            let abs: Vec<f64> = sums
                .iter()
                .zip(&s.reference)
                .map(|(&x, &r)| (f64::from(x) - r).abs())
                .collect();
            let beyond = abs.iter().zip(&s.bound).filter(|(e, b)| e >= b).count() as u64;
            let abs = sorted(abs);
            let rel = sorted(
                sums.iter()
                    .zip(&s.reference)
                    .filter(|(_, &r)| r != 0.0)
                    .map(|(&x, &r)| ((f64::from(x) - r) / r).abs())
                    .collect(),
            );
            let vs_f32 = sorted(
                sums.iter()
                    .zip(&s.f32_sequential)
                    .map(|(&x, &y)| (f64::from(x) - f64::from(y)).abs())
                    .collect(),
            );
            let mut bins = [0u64; 5];
            for &e in &abs {
                bins[BIN_EDGES.iter().take_while(|&&edge| e >= edge).count()] += 1;
            }
            let n = lanes as u64;
            AccuracyRow {
                workers: s.workers,
                method,
                lanes,
                share_ratio_below_128: share(s.narrow_lanes, n),
                abs_median: percentile(&abs, 0.5),
                abs_p99: percentile(&abs, 0.99),
                abs_max: abs.last().copied().unwrap_or(0.0),
                share_below_1e12: share(bins[0], n),
                share_1e12_1e10: share(bins[1], n),
                share_1e10_1e8: share(bins[2], n),
                share_1e8_1e6: share(bins[3], n),
                share_from_1e6: share(bins[4], n),
                share_below_1e8: share(bins[0] + bins[1] + bins[2], n),
                share_beyond_bound: share(beyond, n),
                rel_median: percentile(&rel, 0.5),
                rel_max: rel.last().copied().unwrap_or(0.0),
                vs_f32_median: percentile(&vs_f32, 0.5),
                vs_f32_max: vs_f32.last().copied().unwrap_or(0.0),
                additions: counts.adds,
                overwrites: counts.overwrites,
                left_shifts: counts.left_shifts,
                overflows: counts.overflows,
                overwritten_lanes: overwritten,
                overflowed_lanes: overflowed,
                overwrite_share: share(counts.overwrites, counts.adds),
                left_shift_share: share(counts.left_shifts, counts.adds),
                bound_violations: (method == Method::Fpisa).then_some(s.bound_violations),
            }
        })
        .collect()
}

// ----- the report ----------------------------------------------------------------------------

/// The accuracy report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AccuracyReport {
    /// What was run.
    pub config: AccuracyConfig,
    /// One row per (worker count, method), worker counts in configuration order.
    pub rows: Vec<AccuracyRow>,
    /// The worker count of the key figure: 8 (the paper's Figure 8 aggregates eight
    /// workers) if measured, else the first.
    pub key_workers: usize,
    /// FPISA-A's share of lanes with error in `[1e-10, 1e-8)` at `key_workers`.
    pub key_fpisa_a_share_1e10_1e8: f64,
    /// FPISA-A's share of lanes with error below `1e-8` at `key_workers`.
    pub key_fpisa_a_share_below_1e8: f64,
    /// FPISA-A's share of lanes with error beyond FPISA's rounding bound at `key_workers`.
    pub key_fpisa_a_share_beyond_bound: f64,
    /// FPISA-A's share of lanes that overflowed at `key_workers`.
    pub key_fpisa_a_overflowed_share: f64,
    /// FPISA-A's overwrite share at `key_workers`.
    pub key_overwrite_share: f64,
    /// FPISA-A's left-shift share at `key_workers`.
    pub key_left_shift_share: f64,
    /// Lanes, over all worker counts, where FPISA left its documented bound.
    pub bound_violations: u64,
    /// Every FPISA sum within its documented bound, and FPISA never overflowed.
    pub verified: bool,
}

impl AccuracyReport {
    /// The row of `method` at `workers` workers, if measured.
    pub fn row(&self, workers: usize, method: Method) -> Option<&AccuracyRow> {
        self.rows
            .iter()
            .find(|r| r.workers == workers && r.method == method)
    }

    /// A table of the rows: workers and method, then one column per `(heading, width)`
    /// with `cells` of each row, right-aligned.
    fn method_table(
        &self,
        columns: &[(&str, usize)],
        cells: impl Fn(&AccuracyRow) -> Vec<String>,
    ) -> String {
        let line = |workers: &str, method: &str, cells: &[&str]| {
            let mut s = format!("{workers:>7} {method:<14}");
            for (cell, (_, width)) in cells.iter().zip(columns) {
                s += &format!(" {cell:>width$}");
            }
            s + "\n"
        };
        let headings: Vec<&str> = columns.iter().map(|c| c.0).collect();
        let mut s = line("workers", "method", &headings);
        for r in &self.rows {
            let row = cells(r);
            let row: Vec<&str> = row.iter().map(String::as_str).collect();
            s += &line(&r.workers.to_string(), r.method.name(), &row);
        }
        s
    }
}

/// Runs the report: for each worker count, generates the data, sums it every way and
/// measures the errors.
pub fn fpisa_accuracy(cfg: &AccuracyConfig) -> Result<AccuracyReport, ExperimentError> {
    cfg.validate()?;
    let mut rows = Vec::with_capacity(cfg.workers.len() * Method::ALL.len());
    for &w in &cfg.workers {
        rows.extend(measure(&sum_lanes(&gradients(cfg, w))));
    }
    let key_workers = if cfg.workers.contains(&8) {
        8
    } else {
        cfg.workers[0]
    };
    let key = rows
        .iter()
        .find(|r| r.workers == key_workers && r.method == Method::FpisaA);
    let full = || rows.iter().filter(|r| r.method == Method::Fpisa);
    let bound_violations: u64 = full().filter_map(|r| r.bound_violations).sum();
    let verified = bound_violations == 0 && full().all(|r| r.overflows == 0);
    Ok(AccuracyReport {
        key_workers,
        key_fpisa_a_share_1e10_1e8: key.map_or(0.0, |r| r.share_1e10_1e8),
        key_fpisa_a_share_below_1e8: key.map_or(0.0, |r| r.share_below_1e8),
        key_fpisa_a_share_beyond_bound: key.map_or(0.0, |r| r.share_beyond_bound),
        key_fpisa_a_overflowed_share: key
            .map_or(0.0, |r| share(r.overflowed_lanes, r.lanes as u64)),
        key_overwrite_share: key.map_or(0.0, |r| r.overwrite_share),
        key_left_shift_share: key.map_or(0.0, |r| r.left_shift_share),
        bound_violations,
        verified,
        config: cfg.clone(),
        rows,
    })
}

/// The CSV header of the report.
pub const CSV_HEADER: [&str; 28] = [
    "workers",
    "method",
    "lanes",
    "share_ratio_below_128",
    "abs_median",
    "abs_p99",
    "abs_max",
    "share_below_1e12",
    "share_1e12_1e10",
    "share_1e10_1e8",
    "share_1e8_1e6",
    "share_from_1e6",
    "share_below_1e8",
    "share_beyond_bound",
    "rel_median",
    "rel_max",
    "vs_f32_median",
    "vs_f32_max",
    "additions",
    "overwrites",
    "left_shifts",
    "overflows",
    "overwritten_lanes",
    "overflowed_lanes",
    "overwrite_share",
    "left_shift_share",
    "bound_violations",
    "verified",
];

fn pct(x: f64) -> String {
    format!("{:.2}%", 100.0 * x)
}

impl Figure for AccuracyReport {
    fn name(&self) -> &'static str {
        "fpisa-accuracy"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        CSV_HEADER.to_vec()
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let e = |x: f64| format!("{x:.6e}");
                let f = |x: f64| format!("{x:.6}");
                vec![
                    r.workers.to_string(),
                    r.method.to_string(),
                    r.lanes.to_string(),
                    f(r.share_ratio_below_128),
                    e(r.abs_median),
                    e(r.abs_p99),
                    e(r.abs_max),
                    f(r.share_below_1e12),
                    f(r.share_1e12_1e10),
                    f(r.share_1e10_1e8),
                    f(r.share_1e8_1e6),
                    f(r.share_from_1e6),
                    f(r.share_below_1e8),
                    f(r.share_beyond_bound),
                    e(r.rel_median),
                    e(r.rel_max),
                    e(r.vs_f32_median),
                    e(r.vs_f32_max),
                    r.additions.to_string(),
                    r.overwrites.to_string(),
                    r.left_shifts.to_string(),
                    r.overflows.to_string(),
                    r.overwritten_lanes.to_string(),
                    r.overflowed_lanes.to_string(),
                    f(r.overwrite_share),
                    f(r.left_shift_share),
                    r.bound_violations.map_or(String::new(), |v| v.to_string()),
                    match r.bound_violations {
                        Some(v) => (v == 0 && r.overflows == 0).to_string(),
                        None => String::new(),
                    },
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError> {
        let line = |method: Method, what: &str, f: &dyn Fn(&AccuracyRow) -> f64| Series {
            name: format!("{method}, {what}"),
            points: self
                .rows
                .iter()
                .filter(|r| r.method == method)
                .map(|r| (r.workers as f64, f(r)))
                .collect(),
        };
        plot::svg_log(
            path,
            &LogChart {
                title: "FPISA accuracy: absolute error of FP32 sums vs f64",
                x_label: "workers",
                y_label: "absolute error (zeros drawn at 1e-14)",
                y_floor: 1e-14,
                solid: Method::ALL
                    .iter()
                    .map(|&m| line(m, "median", &|r| r.abs_median))
                    .collect(),
                dashed: Method::ALL
                    .iter()
                    .map(|&m| line(m, "max", &|r| r.abs_max))
                    .collect(),
            },
        )
    }

    fn table(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "fpisa-accuracy: FP32 sums of gradient-like values, {} lanes per worker count; \
             worker w ~ N(0, sigma_w), sigma_w over {} decade(s) around {:.0e} ({:.2e} to \
             {:.2e}); seed {}\n\nabsolute error against the f64 sum (% of lanes per decade, \
             as the paper's Figure 8)\n",
            c.lanes,
            c.sigma_decades,
            c.sigma_mid,
            c.sigma_mid * 10f64.powf(-c.sigma_decades / 2.0),
            c.sigma_mid * 10f64.powf(c.sigma_decades / 2.0),
            c.seed
        );
        let p = |x: f64| format!("{:.2}", 100.0 * x);
        let e = |x: f64| format!("{x:.2e}");
        s += &self.method_table(
            &[
                ("median", 9),
                ("p99", 9),
                ("max", 9),
                ("<1e-12", 7),
                ("<1e-10", 7),
                ("<1e-8", 7),
                ("<1e-6", 7),
                (">=1e-6", 7),
                (">bound", 7),
            ],
            |r| {
                vec![
                    e(r.abs_median),
                    e(r.abs_p99),
                    e(r.abs_max),
                    p(r.share_below_1e12),
                    p(r.share_1e12_1e10),
                    p(r.share_1e10_1e8),
                    p(r.share_1e8_1e6),
                    p(r.share_from_1e6),
                    p(r.share_beyond_bound),
                ]
            },
        );
        s += "(>bound: % of lanes whose error reaches FPISA's documented rounding bound)\n\n\
              relative error, distance to the sequential f32 sum, FPISA-A events (% of \
              additions), overflows (% of lanes), and the data's Figure 7 statistic (<2^7: % of \
              lanes whose largest input is under 2^7 times the smallest)\n";
        s += &self.method_table(
            &[
                ("rel med", 9),
                ("rel max", 9),
                ("f32 med", 9),
                ("f32 max", 9),
                ("overwrite", 9),
                ("left sh.", 9),
                ("overflow", 9),
                ("<2^7", 6),
            ],
            |r| {
                let (ow, ls) = if r.method == Method::FpisaA {
                    (p(r.overwrite_share), p(r.left_shift_share))
                } else {
                    ("-".into(), "-".into())
                };
                let of = if r.method == Method::F32Sequential {
                    "-".into()
                } else {
                    p(share(r.overflowed_lanes, r.lanes as u64))
                };
                vec![
                    e(r.rel_median),
                    e(r.rel_max),
                    e(r.vs_f32_median),
                    e(r.vs_f32_max),
                    ow,
                    ls,
                    of,
                    p(r.share_ratio_below_128),
                ]
            },
        );
        let narrow = self
            .row(self.key_workers, Method::FpisaA)
            .map_or(0.0, |r| r.share_ratio_below_128);
        s += &format!(
            "\nkey: {} workers ({} of lanes under 2^7, the paper's Figure 7: about 83%): \
             FPISA-A errors below 1e-8 in {} of lanes, {} in [1e-10, 1e-8) (the paper's Figure \
             8: over 95% in [1e-10, 1e-8] on VGG19 gradients); {} of lanes beyond FPISA's \
             rounding bound; overwrites {} of additions (the paper: under 0.9%); overflow in {} \
             of lanes (the paper: none); FPISA within its documented bound on every lane: {}\n",
            self.key_workers,
            pct(narrow),
            pct(self.key_fpisa_a_share_below_1e8),
            pct(self.key_fpisa_a_share_1e10_1e8),
            pct(self.key_fpisa_a_share_beyond_bound),
            pct(self.key_overwrite_share),
            pct(self.key_fpisa_a_overflowed_share),
            if self.verified { "yes" } else { "NO" }
        );
        s
    }

    fn verified(&self) -> bool {
        self.verified
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 5.0);
        assert_eq!(percentile(&v, 0.99), 10.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn scales_span_the_decades_in_a_seeded_order() {
        let cfg = AccuracyConfig::default();
        let s = worker_scales(&cfg, 8);
        assert_eq!(s, worker_scales(&cfg, 8));
        let sorted = super::sorted(s.clone());
        let (lo, hi) = (10f64.powf(-3.5), 10f64.powf(-2.5));
        assert!((sorted[0] / lo - 1.0).abs() < 1e-12 && (sorted[7] / hi - 1.0).abs() < 1e-12);
        assert_ne!(s, sorted, "not dealt in ascending order");
        assert_eq!(worker_scales(&cfg, 1), vec![1e-3]);
    }

    #[test]
    fn ulps_of_fp32() {
        assert_eq!(ulp32(1.0), 2f64.powi(-23));
        assert_eq!(ulp32(-3.0), 2f64.powi(-22));
        assert_eq!(ulp32(0.0), 0.0);
    }
}
