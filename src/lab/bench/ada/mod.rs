//! `pfemu experiment ada`: the ADA paper's accuracy evaluation (Malekpourshahraki, Stephens
//! and Vamanan, §V.A, Figures 5, 6 and 7) on [`crate::ada`]'s algorithms, and the two
//! things the paper argues but does not plot: error against the entry budget, and a
//! distribution that shifts; then its testbed evaluation (§V.B: Figures 8 and 9, Table II)
//! on the Nimble rate limiter ([`nimble`]).
//!
//! §V.A is pure arithmetic on the host, §V.B the limiter's program run frame by frame on an
//! emulated clock: no engine threads, no wall clock in the results; every stream comes from
//! [`SplitMix64`] seeded by `--seed` and the part it feeds, so a run is reproducible bit for
//! bit whatever `--threads`. Operands are 32-bit; the paper's values lie in
//! `0..`[`RANGE`]. The parts:
//!
//! 1. Figure 5 ([`binning`]): for each distribution of [`distributions`], Algorithms 1 and
//!    2 epoch by epoch (`--epoch-operands` per epoch, `--monitor-entries` bins at first,
//!    `--th-balance`, `--th-expansion`) until `--steady-epochs` epochs in a row change
//!    nothing (or `--max-epochs`); the total variation distance between the true
//!    distribution in bins of 2000 and the trie's piecewise-constant density (each bin's
//!    hits spread evenly over it), for Algorithm 1's equal bins and for the steady trie.
//! 2. Figure 6 ([`binning`]): a Gaussian of median 4000 and variance 32500 from `b = 1`
//!    (two bins), expansion unlimited: the bins after each change, over 32-bit operands and
//!    over each other width of `--fig6-bits`.
//! 3. Error against the entry budget ([`lookup`]): for each distribution, the shifting one
//!    (5.) and each operation, at each of `--budgets` operand-table entries, the prior
//!    work's uniform population at the most significant bits that fit (`2^s (33 - s)`
//!    entries) against ADA's (`populate(budget)` on the steady trie), on the same
//!    `--samples` operand pairs: mean and p99 error, entries used.
//! 4. Figure 7a-b ([`lookup`]): the uniform population's error and size against its
//!    significant bits (`--significant-bits`) on Figure 7's Gaussian and on uniform
//!    operands. Figure 7c: `f(x) = 2x` and `f(x) = x^2` iterated `--iterations` times from
//!    a Gaussian of median 10 and variance 100 (`--chains` starting values), through the
//!    uniform and ADA tables of `--propagation-budget` entries.
//! 5. The shift ([`shift`]): exponential operands for `--shift-after` epochs, then a
//!    Gaussian far away for `--shift-epochs`; per epoch the error of ADA (re-populated every
//!    epoch), of ADA's table frozen at the shift, and of the uniform table (`--shift-op`,
//!    `--shift-budget`); epochs until ADA's error is back within `--recovery-factor` of its
//!    level before the shift, and the tables rewritten meanwhile.
//! 6. Nimble ([`nimble`], the `--nimble-*` options): Figure 8's admitted rate per window
//!    when the rate halves, for exact, uniform, static and ADA arithmetic; Table II's
//!    controller reads and writes per update, ADA on the rate, the time or both, with TCAM
//!    lookups per packet in place of RMT stages; Figure 9's controller epochs until the
//!    admitted rate is back within `--nimble-tolerance`, by calculation table size.
//!
//! The report is [`Figure::verified`] when every lookup found an entry, every result of a
//! uniform population was within [`crate::ada::arith::Op::within_bound`] of the exact one,
//! and §V.B's runs check out ([`NimbleReport::verified`]: every frame accounted for, exact
//! arithmetic within 0.5% of its rates).
//!
//! # Readings of the paper
//!
//! Where §V.A is unclear, this experiment reads it so (the report's claims repeat it):
//!
//! - The domain `[0, 650000]` is read half-open, operands `0..650000`, so that Figure 5's
//!   true distribution has 325 bins of 2000. Draws outside are redrawn (the distributions
//!   are truncated to the domain), and an operand is the draw rounded down.
//! - "Exponential with λ = 10 with the same bin size": a mean of 10 bins, 20000.
//! - Fisher's F(100, 20) is scaled by 100000 (mode 89000, mean 111000), so that it spans
//!   the domain with its heavy tail inside it.
//! - "The sum of two independent Gaussian distributions (G1+G2) ... has two peaks": an
//!   equal mixture of G1(16000, 10000) and G2(48000, 10000), the second parameter the
//!   standard deviation (the text's σ = 10000). "Exp + G" likewise: an equal mixture of the
//!   exponential and G(16000, 10000).
//! - Figure 6's and 7's Gaussian: median 4000, variance 32500 (σ ≈ 180). Figure 7c's:
//!   median 10, variance 100 (σ = 10), rounded to integers, values below 1 redrawn.
//! - "Steady state (until the condition at line 13 is not satisfied)": no change at all,
//!   `--steady-epochs` epochs in a row.
//! - Operand 0 is left to the program's branch (as [`crate::ada::arith`] does for mul, div
//!   and log2), so the error samples redraw it; errors are relative, log2's absolute.
//! - Two-operand operations take both operands from the same distribution, through one log
//!   table (the one ADA populates and the budget counts) and a uniform antilog table that
//!   ADA and uniform share (`s + 6` significant bits, `s` the uniform's at that budget).
//! - Figure 7c: `2x` is a multiplication by the constant 2 (which goes through the log
//!   table too), `x^2` the square table. `x^2` leaves 32 bits after three iterations, so a
//!   value is carried as a 32-bit mantissa and an exponent, `m 2^e`, and only `m` is looked
//!   up (as InREC, the paper's \[13\], handles reals); the error is that of `m 2^e` against
//!   the exact value, computed in log2. ADA's trie learns the operands of exact chains.
//! - Figure 7a's sums need no table (addition is native); the two-operand cases are the
//!   products and quotients of G and U operands.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

use super::experiments::{Claim, ExperimentError, Figure};
use crate::ada::arith::Op;
use crate::lab::bench::traffic::{MAX_FRAME_SIZE, MIN_FRAME_SIZE};
use crate::mem::tcam::MAX_TCAM_ENTRIES;
use crate::microcode::nimble::MAX_RATE_BPS;
use crate::rng::{mix, SplitMix64};

pub mod binning;
pub mod dist;
mod figure;
pub mod lookup;
pub mod nimble;
pub mod shift;

pub use binning::{BinningRow, GrowthRun, GrowthStep};
pub use dist::{Dist, HIST_BIN, RANGE};
pub use lookup::{BudgetRow, Chain, Checks, ErrorStats, Propagation, PropagationRow, SigBitsRow};
pub use nimble::{ControlCost, NimbleReport, NimbleRun, OperandCost, Recovery, Variant};
pub use shift::{ShiftEpoch, ShiftReport, SHIFTING};

use binning::{converge, Monitoring, Operands};
use lookup::UniformTables;

/// An operation, as the command line names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum OpChoice {
    /// `a^2`.
    Square,
    /// `sqrt a`.
    Sqrt,
    /// `log2 a`.
    Log2,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
}

impl From<OpChoice> for Op {
    fn from(o: OpChoice) -> Op {
        match o {
            OpChoice::Square => Op::Square,
            OpChoice::Sqrt => Op::Sqrt,
            OpChoice::Log2 => Op::Log2,
            OpChoice::Mul => Op::Mul,
            OpChoice::Div => Op::Div,
        }
    }
}

/// The experiment's settings. As command-line options, those of `pfemu experiment ada`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct AdaConfig {
    /// Seed of every operand stream.
    #[arg(long, default_value_t = AdaConfig::default().seed, help = "Seed of every operand stream")]
    pub seed: u64,
    /// Operands recorded per monitoring epoch (Algorithm 2 runs once per epoch).
    #[arg(long, default_value_t = AdaConfig::default().epoch_operands,
          help = "Operands per monitoring epoch (1 to 10^7)")]
    pub epoch_operands: usize,
    /// Algorithm 1's M: monitoring entries at first (`floor(log2 M)` significant bits).
    #[arg(long, default_value_t = AdaConfig::default().monitor_entries,
          help = "Monitoring entries at first, Algorithm 1's M (2 to 65536; one bin never adapts)")]
    pub monitor_entries: u64,
    /// Algorithm 2's balance threshold (the paper: 20%).
    #[arg(long, default_value_t = AdaConfig::default().th_balance,
          help = "Algorithm 2's th_balance, in (0, 1]")]
    pub th_balance: f64,
    /// Algorithm 2's expansion threshold in levels (the paper: 2); 0 disables expansion.
    #[arg(long, default_value_t = AdaConfig::default().th_expansion,
          help = "Algorithm 2's th_expansion in levels, 0 to 32 (0: never expand)")]
    pub th_expansion: u32,
    /// Epochs a monitoring run may take to become steady.
    #[arg(long, default_value_t = AdaConfig::default().max_epochs,
          help = "Most epochs a monitoring run takes to become steady (1 to 100000)")]
    pub max_epochs: u32,
    /// Epochs in a row without a change that make a trie steady.
    #[arg(long, default_value_t = AdaConfig::default().steady_epochs,
          help = "Epochs in a row without a change that make a trie steady (1 to 1000)")]
    pub steady_epochs: u32,
    /// Operand-table entry budgets to compare uniform and ADA at.
    #[arg(long, value_name = "N,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&AdaConfig::default().budgets),
          help = "Operand-table entry budgets (33 to 1048576 each)")]
    pub budgets: Vec<u64>,
    /// Operand pairs each error is measured on.
    #[arg(long, default_value_t = AdaConfig::default().samples,
          help = "Operand pairs per error measurement (1 to 10^7)")]
    pub samples: usize,
    /// Significant bits of Figure 7a-b's uniform populations.
    #[arg(long = "significant-bits", value_name = "S,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&AdaConfig::default().significant_bits),
          help = "Significant bits for Figure 7a-b (0 to 12 each)")]
    pub significant_bits: Vec<u32>,
    /// Operand-table budget of Figure 7c's tables.
    #[arg(long, default_value_t = AdaConfig::default().propagation_budget,
          help = "Operand-table entries of Figure 7c's tables (33 to 1048576)")]
    pub propagation_budget: u64,
    /// Iterations of Figure 7c's functions.
    #[arg(long, default_value_t = AdaConfig::default().iterations,
          help = "Iterations of Figure 7c's functions (1 to 64)")]
    pub iterations: u32,
    /// Starting values of Figure 7c.
    #[arg(long, default_value_t = AdaConfig::default().chains,
          help = "Starting values iterated for Figure 7c (1 to 10^6)")]
    pub chains: usize,
    /// Epochs of exponential operands before the shift.
    #[arg(long, default_value_t = AdaConfig::default().shift_after,
          help = "Epochs before the shift (1 to 10000)")]
    pub shift_after: u32,
    /// Epochs of Gaussian operands after it.
    #[arg(long, default_value_t = AdaConfig::default().shift_epochs,
          help = "Epochs after the shift (1 to 10000)")]
    pub shift_epochs: u32,
    /// Operand-table budget of the shift's per-epoch report.
    #[arg(long, default_value_t = AdaConfig::default().shift_budget,
          help = "Operand-table entries of the shift's tables (33 to 1048576)")]
    pub shift_budget: u64,
    /// Operation of the shift's per-epoch report.
    #[arg(long, value_enum, default_value_t = AdaConfig::default().shift_op,
          help = "Operation of the shift's per-epoch report")]
    pub shift_op: OpChoice,
    /// Operand pairs per epoch on which the shift's tables are measured.
    #[arg(long, default_value_t = AdaConfig::default().shift_samples,
          help = "Operand pairs per epoch for the shift's errors (1 to 10^6)")]
    pub shift_samples: usize,
    /// ADA counts as recovered when its error is within this factor of its level before
    /// the shift.
    #[arg(long, default_value_t = AdaConfig::default().recovery_factor,
          help = "Recovered: ADA's error within this factor of its pre-shift level (1 to 10^6)")]
    pub recovery_factor: f64,
    /// Operand widths of Figure 6's runs.
    #[arg(long = "fig6-bits", value_name = "BITS,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&AdaConfig::default().fig6_bits),
          help = "Operand widths of Figure 6's runs (13 to 32 each)")]
    pub fig6_bits: Vec<u32>,
    /// §V.B: the class's rate until the change, Gbit/s.
    #[arg(long, default_value_t = AdaConfig::default().nimble_rate_gbps,
          help = "§V.B: the rate until the change, Gbit/s (0.01 to 137)")]
    pub nimble_rate_gbps: f64,
    /// §V.B: the class's rate from the change, Gbit/s.
    #[arg(long, default_value_t = AdaConfig::default().nimble_rate_after_gbps,
          help = "§V.B: the rate from the change, Gbit/s (0.01 to 137)")]
    pub nimble_rate_after_gbps: f64,
    /// §V.B: when the rate changes, µs from the start.
    #[arg(long, default_value_t = AdaConfig::default().nimble_change_us,
          help = "§V.B: when the rate changes, µs (two windows from either end at least)")]
    pub nimble_change_us: u64,
    /// §V.B: how long traffic is offered, µs.
    #[arg(long, default_value_t = AdaConfig::default().nimble_duration_us,
          help = "§V.B: how long traffic is offered, µs (1 to 10^6)")]
    pub nimble_duration_us: u64,
    /// §V.B: frame size, bytes.
    #[arg(long, default_value_t = AdaConfig::default().nimble_frame_bytes,
          help = "§V.B: frame size, bytes (64 to 9216)")]
    pub nimble_frame_bytes: usize,
    /// §V.B: the load offered, Gbit/s, in Poisson arrivals.
    #[arg(long, default_value_t = AdaConfig::default().nimble_offered_gbps,
          help = "§V.B: offered load, Gbit/s, Poisson arrivals (0.01 to 1000)")]
    pub nimble_offered_gbps: f64,
    /// §V.B: the measurement window, µs.
    #[arg(long, default_value_t = AdaConfig::default().nimble_window_us,
          help = "§V.B: measurement window, µs (at most 10^5 windows)")]
    pub nimble_window_us: u64,
    /// §V.B: ADA's controller period, µs.
    #[arg(long, default_value_t = AdaConfig::default().nimble_controller_us,
          help = "§V.B: ADA's controller period, µs (at most 10^5 periods)")]
    pub nimble_controller_us: u64,
    /// §V.B: most monitoring entries of ADA on the inter-arrival time (Table II).
    #[arg(long, default_value_t = AdaConfig::default().nimble_dt_monitor_entries,
          help = "§V.B: most monitoring entries of ADA on the inter-arrival time (8 to 128)")]
    pub nimble_dt_monitor_entries: usize,
    /// §V.B: Figure 9's calculation table sizes.
    #[arg(long, value_name = "N,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&AdaConfig::default().nimble_table_entries),
          help = "§V.B: Figure 9's calculation table sizes (12 to 65536 each)")]
    pub nimble_table_entries: Vec<usize>,
    /// §V.B: recovered when the admitted rate is within this share of the new rate.
    #[arg(long, default_value_t = AdaConfig::default().nimble_tolerance,
          help = "§V.B: recovered within this share of the new rate, in (0, 1)")]
    pub nimble_tolerance: f64,
    /// Threads the parts run on.
    #[arg(long, default_value_t = AdaConfig::default().threads, hide_default_value = true,
          help = "Threads the parts run on [default: available cores]")]
    pub threads: usize,
}

impl Default for AdaConfig {
    /// Seed 1; epochs of 20000 operands; 16 monitoring entries; the paper's thresholds (20%,
    /// 2 levels); at most 300 epochs, steady after 3 without a change; budgets 33, 64, 124,
    /// 240, 464, 896 (the uniform population's sizes at s = 0 to 5); 50000 samples;
    /// s = 0 to 8; Figure 7c at 896 entries, 10 iterations of 2000 chains; the shift after
    /// 30 epochs, 30 more, mul at 240 entries, 2000 pairs per epoch, recovered within 2x;
    /// Figure 6 over 32 and 13 bits; §V.B as the paper's Figures 8 and 9 (24 then 12
    /// Gbit/s from 3 ms of 6, 40 Gbit/s of 1500-byte frames offered, windows and controller
    /// every 100 µs, ADA on the time up to 32 monitoring entries, tables of 16 to 128
    /// entries, within 1%); threads = cores.
    fn default() -> Self {
        AdaConfig {
            seed: 1,
            epoch_operands: 20_000,
            monitor_entries: 16,
            th_balance: 0.2,
            th_expansion: 2,
            max_epochs: 300,
            steady_epochs: 3,
            budgets: vec![33, 64, 124, 240, 464, 896],
            samples: 50_000,
            significant_bits: (0..=8).collect(),
            propagation_budget: 896,
            iterations: 10,
            chains: 2000,
            shift_after: 30,
            shift_epochs: 30,
            shift_budget: 240,
            shift_op: OpChoice::Mul,
            shift_samples: 2000,
            recovery_factor: 2.0,
            fig6_bits: vec![32, 13],
            nimble_rate_gbps: 24.0,
            nimble_rate_after_gbps: 12.0,
            nimble_change_us: 3000,
            nimble_duration_us: 6000,
            nimble_frame_bytes: 1500,
            nimble_offered_gbps: 40.0,
            nimble_window_us: 100,
            nimble_controller_us: 100,
            nimble_dt_monitor_entries: 32,
            nimble_table_entries: (1..=8).map(|i| 16 * i).collect(),
            nimble_tolerance: 0.01,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// The largest budget accepted (the uniform population at s = 15 has 589824 entries).
pub const MAX_BUDGET: u64 = 1 << 20;

fn bad<T>(option: &'static str, reason: String) -> Result<T, ExperimentError> {
    Err(ExperimentError::Option { option, reason })
}

fn in_range<T: PartialOrd + std::fmt::Display>(
    option: &'static str,
    v: T,
    lo: T,
    hi: T,
) -> Result<(), ExperimentError> {
    if v < lo || v > hi {
        return bad(option, format!("{v}: accepted {lo} to {hi}"));
    }
    Ok(())
}

fn budget(option: &'static str, b: u64) -> Result<(), ExperimentError> {
    if !(33..=MAX_BUDGET).contains(&b) {
        return bad(
            option,
            format!("{b} entries: accepted 33 (the uniform population at s = 0) to {MAX_BUDGET}"),
        );
    }
    Ok(())
}

impl AdaConfig {
    /// Checks the settings, naming the option at fault.
    pub fn check(&self) -> Result<(), ExperimentError> {
        in_range("--epoch-operands", self.epoch_operands, 1, 10_000_000)?;
        // One entry is one bin over every operand, which Algorithm 2 never changes.
        in_range("--monitor-entries", self.monitor_entries, 2, 65_536)?;
        if !(self.th_balance > 0.0 && self.th_balance <= 1.0) {
            return bad(
                "--th-balance",
                format!("{}: accepted in (0, 1]", self.th_balance),
            );
        }
        in_range("--th-expansion", self.th_expansion, 0, 32)?;
        in_range("--max-epochs", self.max_epochs, 1, 100_000)?;
        in_range("--steady-epochs", self.steady_epochs, 1, 1000)?;
        if self.budgets.is_empty() {
            return bad("--budgets", "give at least one budget".into());
        }
        for &b in &self.budgets {
            budget("--budgets", b)?;
        }
        in_range("--samples", self.samples, 1, 10_000_000)?;
        if self.significant_bits.is_empty() {
            return bad("--significant-bits", "give at least one".into());
        }
        for &s in &self.significant_bits {
            in_range("--significant-bits", s, 0, 12)?;
        }
        budget("--propagation-budget", self.propagation_budget)?;
        in_range("--iterations", self.iterations, 1, 64)?;
        in_range("--chains", self.chains, 1, 1_000_000)?;
        in_range("--shift-after", self.shift_after, 1, 10_000)?;
        in_range("--shift-epochs", self.shift_epochs, 1, 10_000)?;
        budget("--shift-budget", self.shift_budget)?;
        in_range("--shift-samples", self.shift_samples, 1, 1_000_000)?;
        if !(self.recovery_factor >= 1.0 && self.recovery_factor <= 1e6) {
            return bad(
                "--recovery-factor",
                format!("{}: accepted 1 to 10^6", self.recovery_factor),
            );
        }
        if self.fig6_bits.is_empty() {
            return bad("--fig6-bits", "give at least one width".into());
        }
        for &b in &self.fig6_bits {
            if !(13..=32).contains(&b) {
                return bad(
                    "--fig6-bits",
                    format!(
                        "{b}: accepted 13 to 32 (the Gaussian's operands, up to about 4900, \
                         need 13 bits)"
                    ),
                );
            }
        }
        self.check_nimble()?;
        in_range("--threads", self.threads, 1, 1024)?;
        Ok(())
    }

    /// Checks the `--nimble-*` options (§V.B).
    fn check_nimble(&self) -> Result<(), ExperimentError> {
        let max_gbps = MAX_RATE_BPS as f64 / 1e9;
        for (option, r) in [
            ("--nimble-rate-gbps", self.nimble_rate_gbps),
            ("--nimble-rate-after-gbps", self.nimble_rate_after_gbps),
        ] {
            if !(0.01..=max_gbps).contains(&r) {
                return bad(
                    option,
                    format!("{r}: accepted 0.01 to {max_gbps:.2} (the rate's 32-bit key)"),
                );
            }
        }
        in_range(
            "--nimble-duration-us",
            self.nimble_duration_us,
            1,
            1_000_000,
        )?;
        in_range(
            "--nimble-frame-bytes",
            self.nimble_frame_bytes,
            MIN_FRAME_SIZE,
            MAX_FRAME_SIZE,
        )?;
        let offered = self.nimble_offered_gbps;
        if !(0.01..=1000.0).contains(&offered) {
            return bad(
                "--nimble-offered-gbps",
                format!("{offered}: accepted 0.01 to 1000"),
            );
        }
        let frames =
            self.nimble_duration_us as f64 * 1e3 * offered / (8.0 * self.nimble_frame_bytes as f64);
        if frames > 1e7 {
            return bad(
                "--nimble-duration-us",
                format!(
                    "{} µs at {offered} Gbit/s of {}-byte frames is {frames:.0} frames: at most \
                     10^7",
                    self.nimble_duration_us, self.nimble_frame_bytes
                ),
            );
        }
        let duration = self.nimble_duration_us;
        in_range(
            "--nimble-window-us",
            self.nimble_window_us,
            duration.div_ceil(100_000).max(1),
            duration,
        )?;
        in_range(
            "--nimble-controller-us",
            self.nimble_controller_us,
            duration.div_ceil(100_000).max(1),
            duration,
        )?;
        let two = 2 * self.nimble_window_us;
        if self.nimble_change_us < two || self.nimble_change_us.saturating_add(two) > duration {
            return bad(
                "--nimble-change-us",
                format!(
                    "{}: accepted {two} to {} (two windows of --nimble-window-us from either \
                     end, so that each rate has a full window besides the first)",
                    self.nimble_change_us,
                    duration.saturating_sub(two)
                ),
            );
        }
        in_range(
            "--nimble-dt-monitor-entries",
            self.nimble_dt_monitor_entries,
            8,
            nimble::PAPER_TABLE_ENTRIES,
        )?;
        if self.nimble_table_entries.is_empty() {
            return bad("--nimble-table-entries", "give at least one size".into());
        }
        let paper = crate::ada::block::AdaConfig::new(Op::Mul).max_monitor_entries;
        for &n in &self.nimble_table_entries {
            if !(paper..=MAX_TCAM_ENTRIES).contains(&n) {
                return bad(
                    "--nimble-table-entries",
                    format!(
                        "{n}: accepted {paper} (every one of the paper's {paper} monitoring \
                         bins needs an entry) to {MAX_TCAM_ENTRIES} (a ternary match block)"
                    ),
                );
            }
        }
        let t = self.nimble_tolerance;
        if !(t > 0.0 && t < 1.0) {
            return bad("--nimble-tolerance", format!("{t}: accepted in (0, 1)"));
        }
        Ok(())
    }

    /// §V.B's runs in the limiter's units.
    pub fn nimble_scenario(&self) -> nimble::Scenario {
        let bps = |g: f64| (g * 1e9).round() as u64;
        nimble::Scenario {
            rate_bps: bps(self.nimble_rate_gbps),
            rate_after_bps: bps(self.nimble_rate_after_gbps),
            change_ns: self.nimble_change_us * 1000,
            duration_ns: self.nimble_duration_us * 1000,
            frame_bytes: self.nimble_frame_bytes,
            offered_bps: self.nimble_offered_gbps * 1e9,
            window_ns: self.nimble_window_us * 1000,
            controller_ns: self.nimble_controller_us * 1000,
            dt_monitor_entries: self.nimble_dt_monitor_entries,
            tolerance: self.nimble_tolerance,
        }
    }

    fn monitoring(&self, entries: u64, bits: u32) -> Monitoring {
        Monitoring {
            entries,
            bits,
            epoch_operands: self.epoch_operands,
            th_balance: self.th_balance,
            th_expansion: self.th_expansion,
            max_epochs: self.max_epochs,
            steady_epochs: self.steady_epochs,
        }
    }

    fn sorted_budgets(&self) -> Vec<u64> {
        let mut b = self.budgets.clone();
        b.sort_unstable();
        b.dedup();
        b
    }
}

/// Figure 5's distributions, by name: uniform, exponential, Fisher's F, the two-Gaussian
/// mixture and the exponential-Gaussian mixture (module doc: the readings).
pub fn distributions() -> Vec<(&'static str, Dist)> {
    let g = |mean: f64| Dist::Gaussian { mean, sd: 10_000.0 };
    let exp = Dist::Exponential { mean: 20_000.0 };
    vec![
        (
            "uniform",
            Dist::Uniform {
                lo: 0.0,
                hi: f64::from(RANGE),
            },
        ),
        ("exponential", exp.clone()),
        (
            "fisher-f",
            Dist::FisherF {
                d1: 100.0,
                d2: 20.0,
                scale: 100_000.0,
            },
        ),
        (
            "g1+g2",
            Dist::Mixture {
                parts: vec![g(16_000.0), g(48_000.0)],
            },
        ),
        (
            "exp+g",
            Dist::Mixture {
                parts: vec![exp, g(16_000.0)],
            },
        ),
    ]
}

/// The report of [`ada`].
#[derive(Clone, Debug, Serialize)]
pub struct AdaReport {
    /// What was run.
    pub config: AdaConfig,
    /// Figure 5, one row per distribution.
    pub binning: Vec<BinningRow>,
    /// Figure 6, one run per operand width.
    pub growth: Vec<GrowthRun>,
    /// Uniform against ADA per distribution (the shifting one last), operation and budget.
    pub budgets: Vec<BudgetRow>,
    /// Figure 7a-b.
    pub significant_bits: Vec<SigBitsRow>,
    /// Figure 7c, per function.
    pub propagation: Vec<Propagation>,
    /// The shifting distribution, epoch by epoch.
    pub shift: ShiftReport,
    /// §V.B: Figure 8, Table II and Figure 9 on the Nimble rate limiter.
    pub nimble: NimbleReport,
    /// The paper's words beside this run's figures.
    pub claims: Vec<Claim>,
    /// The lookups' checks, over every part.
    pub checks: Checks,
    /// Every lookup found an entry; every uniform result within its bound; every frame of
    /// §V.B's runs accounted for and the exact arithmetic within 0.5% of its rates
    /// ([`NimbleReport::verified`]).
    pub verified: bool,
    /// Wall-clock seconds of the run: information only, not serialised.
    #[serde(skip)]
    pub seconds: f64,
}

/// One independent part of the run.
#[derive(Clone, Copy, Debug)]
enum Job {
    /// Figure 5 and the budget sweep for distribution `i`.
    Binning(usize),
    /// Figure 6 at an operand width.
    Growth(u32),
    /// Figure 7a-b for an operation.
    SigBits(Op),
    /// Figure 7c for a function.
    Propagation(Chain),
    /// The shifting stream's budget rows for an operation (and the per-epoch report if it
    /// is `--shift-op`).
    Shift(Op),
    /// §V.B: the run of [`nimble::specs`] at this index.
    Nimble(usize),
}

enum Piece {
    Binning(Box<BinningRow>, Vec<BudgetRow>),
    Growth(GrowthRun),
    SigBits(Vec<SigBitsRow>),
    Propagation(Propagation),
    Shift(Vec<BudgetRow>, Option<Box<ShiftReport>>),
    Nimble(usize, Box<NimbleRun>),
}

/// The seed of one stream: the run's seed and the stream's tag.
fn seed_of(seed: u64, tag: u64) -> u64 {
    mix(seed ^ mix(tag))
}

/// Tags of the streams (the shift's monitoring is shared by every operation's job).
const TAG_BINNING: u64 = 0x100;
const TAG_EVAL: u64 = 0x200;
const TAG_GROWTH: u64 = 0x300;
const TAG_SIGBITS: u64 = 0x400;
const TAG_PROPAGATION: u64 = 0x500;
const TAG_SHIFT: u64 = 0x600;
/// One arrival stream for every §V.B run, so that they differ only in the limiter.
const TAG_NIMBLE: u64 = 0x700;

fn run_job(cfg: &AdaConfig, job: Job) -> Result<(Piece, Checks), ExperimentError> {
    let mut checks = Checks::default();
    let piece = match job {
        Job::Binning(i) => {
            let dists = distributions();
            let (name, dist) = &dists[i];
            let m = cfg.monitoring(cfg.monitor_entries, 32);
            let mut rng = SplitMix64::new(seed_of(cfg.seed, TAG_BINNING + i as u64));
            let source = Operands { dist, range: RANGE };
            let run = converge(&m, &source, &mut rng)?;
            let row = binning::binning_row(name, dist, &run);
            let mut eval = SplitMix64::new(seed_of(cfg.seed, TAG_EVAL + i as u64));
            let pairs = lookup::pairs(dist, RANGE, cfg.samples, &mut eval);
            let rows = lookup::budget_rows(
                name,
                &run.last,
                &pairs,
                &cfg.sorted_budgets(),
                &mut UniformTables::default(),
                &mut checks,
            )?;
            Piece::Binning(Box::new(row), rows)
        }
        Job::Growth(bits) => {
            let m = cfg.monitoring(2, bits);
            let mut rng = SplitMix64::new(seed_of(cfg.seed, TAG_GROWTH + u64::from(bits)));
            let dist = lookup::fig7_gaussian();
            let run = converge(
                &m,
                &Operands {
                    dist: &dist,
                    range: RANGE,
                },
                &mut rng,
            )?;
            Piece::Growth(binning::growth_run(bits, &run))
        }
        Job::SigBits(op) => Piece::SigBits(lookup::sig_bits_rows(
            op,
            &cfg.significant_bits,
            cfg.samples,
            seed_of(cfg.seed, TAG_SIGBITS + op as u64),
            &mut checks,
        )?),
        Job::Propagation(chain) => Piece::Propagation(lookup::propagation(
            chain,
            &cfg.monitoring(cfg.monitor_entries, 32),
            cfg.propagation_budget,
            cfg.iterations,
            cfg.chains,
            seed_of(cfg.seed, TAG_PROPAGATION + chain as u64),
            &mut checks,
        )?),
        Job::Shift(op) => {
            let run = shift::monitor(
                &cfg.monitoring(cfg.monitor_entries, 32),
                cfg.shift_after,
                cfg.shift_epochs,
                cfg.shift_samples,
                seed_of(cfg.seed, TAG_SHIFT),
            )?;
            let rows = shift::budget_rows(
                &run,
                op,
                &cfg.sorted_budgets(),
                &mut UniformTables::default(),
                &mut checks,
            )?;
            let report = if op == Op::from(cfg.shift_op) {
                Some(Box::new(shift::shift_report(
                    &run,
                    op,
                    cfg.shift_budget,
                    cfg.shift_after,
                    cfg.recovery_factor,
                    &mut checks,
                )?))
            } else {
                None
            };
            Piece::Shift(rows, report)
        }
        Job::Nimble(i) => {
            let spec = nimble::specs(&cfg.nimble_table_entries)[i];
            let run = nimble::run(&cfg.nimble_scenario(), spec, seed_of(cfg.seed, TAG_NIMBLE))?;
            Piece::Nimble(i, Box::new(run))
        }
    };
    Ok((piece, checks))
}

/// Runs the evaluation; `progress` gets (parts done, parts).
pub fn ada(
    cfg: &AdaConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<AdaReport, ExperimentError> {
    cfg.check()?;
    let start = Instant::now();
    // The longest parts first, so that two threads finish together.
    let mut jobs: Vec<Job> = Op::ALL.iter().map(|&op| Job::Shift(op)).collect();
    jobs.extend((0..distributions().len()).map(Job::Binning));
    jobs.extend([Chain::Square, Chain::Double].map(Job::Propagation));
    jobs.extend(Op::ALL.iter().map(|&op| Job::SigBits(op)));
    jobs.extend(cfg.fig6_bits.iter().map(|&b| Job::Growth(b)));
    jobs.extend((0..nimble::specs(&cfg.nimble_table_entries).len()).map(Job::Nimble));
    let results = run_jobs(cfg, &jobs, progress);

    let mut binning = Vec::new();
    let mut budgets = Vec::new();
    let mut shift_rows = Vec::new();
    let mut growth = Vec::new();
    let mut significant_bits = Vec::new();
    let mut propagation = Vec::new();
    let mut shift = None;
    let mut nimble_runs = Vec::new();
    let mut checks = Checks::default();
    for r in results {
        let (piece, c) = r?;
        checks.add(&c);
        match piece {
            Piece::Binning(row, rows) => {
                binning.push(*row);
                budgets.extend(rows);
            }
            Piece::Growth(g) => growth.push(g),
            Piece::SigBits(rows) => significant_bits.extend(rows),
            Piece::Propagation(p) => propagation.push(p),
            Piece::Shift(rows, report) => {
                shift_rows.extend(rows);
                if let Some(r) = report {
                    shift = Some(*r);
                }
            }
            Piece::Nimble(i, run) => nimble_runs.push((i, *run)),
        }
    }
    // The shifting rows after the others, by operation then budget like them.
    let rank = |op: &str| Op::ALL.iter().position(|&o| lookup::op_name(o) == op);
    shift_rows.sort_by_key(|r| (rank(r.op), r.budget));
    budgets.extend(shift_rows);
    propagation.sort_by_key(|p| p.function == Chain::Square);
    let shift =
        shift.ok_or_else(|| ExperimentError::Run("the shift's report is missing".into()))?;
    nimble_runs.sort_by_key(|(i, _)| *i);
    let nimble = nimble::report(
        &cfg.nimble_scenario(),
        nimble_runs.into_iter().map(|(_, r)| r).collect(),
    )?;
    let mut report = AdaReport {
        config: cfg.clone(),
        binning,
        growth,
        budgets,
        significant_bits,
        propagation,
        shift,
        claims: Vec::new(),
        verified: checks.passed() && nimble.verified,
        nimble,
        checks,
        seconds: 0.0,
    };
    report.claims = figure::claims(&report);
    report.seconds = start.elapsed().as_secs_f64();
    Ok(report)
}

type JobResult = Result<(Piece, Checks), ExperimentError>;

/// Runs `jobs` on `cfg.threads` threads; results in the jobs' order.
fn run_jobs(
    cfg: &AdaConfig,
    jobs: &[Job],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Vec<JobResult> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<JobResult>>> =
        Mutex::new((0..jobs.len()).map(|_| None).collect());
    std::thread::scope(|scope| {
        for _ in 0..cfg.threads.min(jobs.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&job) = jobs.get(i) else { break };
                let r = run_job(cfg, job);
                results.lock()[i] = Some(r);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, jobs.len());
            });
        }
    });
    results
        .into_inner()
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(ExperimentError::Run("a part was not run".into()))))
        .collect()
}

impl Figure for AdaReport {
    fn name(&self) -> &'static str {
        "ada"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        figure::CSV_HEADER.to_vec()
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        figure::csv_rows(self)
    }

    fn draw(&self, path: &std::path::Path) -> Result<(), crate::lab::bench::PlotError> {
        figure::draw(self, path)
    }

    fn table(&self) -> String {
        figure::table(self)
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
