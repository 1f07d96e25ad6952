//! The paper's §V.B on [`crate::microcode::nimble`]'s rate limiter: Figure 8 (a rate
//! change that ADA follows and Nimble's static arithmetic does not), Table II (the
//! controller's reads and writes per epoch, and the data plane's cost), and Figure 9 (the
//! control plane's delay against the calculation table's entries).
//!
//! Every run drives the limiter's program through a [`Harness`] on an emulated clock: no
//! engine threads, no wall clock, so a run is deterministic and takes milliseconds.
//!
//! 1. One class is offered `--nimble-offered-gbps` of `--nimble-frame-bytes` frames with
//!    exponential inter-arrival times (a Poisson stream from [`SplitMix64`], the same
//!    stream for every run), each frame run at its arrival time (rounded down to the
//!    nanosecond) with [`Harness::set_now`].
//! 2. Before each frame, every controller period (`--nimble-controller-us`) that has come
//!    runs the program's timer entry ([`CONTROLLER_ENTRY`]): ADA's epoch on each of its
//!    operands. Only runs with an ADA operand have a controller.
//! 3. At `--nimble-change-us` the rate goes from `--nimble-rate-gbps` to
//!    `--nimble-rate-after-gbps` by [`Nimble::set_rate`], a data-plane change: Nimble's
//!    static arithmetic, whose control plane bakes the rate in, does not see it.
//! 4. Admitted bytes are summed per `--nimble-window-us` window, to Gbit/s; every frame's
//!    verdict is counted (admitted or `rate_exceeded`, nothing else) and the limiter's own
//!    admitted counter must agree.
//!
//! The runs ([`Variant`]): Figure 8's four arithmetics for the rate's table (exact,
//! uniform at 2 significant bits, static, ADA with the paper's 128 calculation and 8 to
//! 12 monitoring entries), the inter-arrival time through a 6-bit uniform table; Table
//! II's ADA(ΔT) (uniform rate table, ADA on the time) and ADA(ΔT, R) (ADA on both); and
//! Figure 9's ADA(R) at each of `--nimble-table-entries` calculation entries.
//!
//! # Readings of the paper
//!
//! - "Offered at line rate" (Table II, Figure 9: 95 Gbit/s halved): the same run as
//!   Figure 8, the link offering `--nimble-offered-gbps`, the rate halved from 24 to 12.
//!   The paper's flows are DCTCP over iperf3; ours is an open-loop Poisson stream, so the
//!   admitted rate shows the limiter alone.
//! - Recovered ([`recovery`]): the first window after the change from which every stretch
//!   of windows, to the end of the run, admitted the new rate within `--nimble-tolerance`,
//!   give or take one frame. A window of 100 µs holds 100 frames at 12 Gbit/s, and a token
//!   bucket, even an exact one, admits a frame more or less in any stretch depending on
//!   where its boundaries cut: without the frame, a window alone could not be "within 1%".
//!   The recovery is looked for in the first half of the windows after the change (a
//!   stretch shorter than that says little): a run that is off by more than the tolerance
//!   on average (uniform, static) never recovers.
//! - Figure 9's delay: counted in controller epochs after the change, and in emulated time
//!   as epochs times the controller period. The paper's 3.15 ms includes its controller's
//!   own compute and switch I/O; ours has none, so only the epochs mean anything.
//! - Table II's "No. of stages" has no meaning on a PFE, which runs the lookups as XTXNs of
//!   one thread: the data plane's cost is reported as TCAM lookups per packet instead
//!   (monitoring and calculation, measured on ADA's blocks by their hit counters; the fixed
//!   tables, one lookup each per refill, counted).
//! - The inter-arrival times (about 300 ns) sit some 24 octaves below the top of a 32-bit
//!   key, and a binary trie reaches them only through a chain of bins, about one per
//!   octave: with the paper's 12 monitoring entries ADA on ΔT cannot zoom in, so its
//!   monitoring may grow to `--nimble-dt-monitor-entries` (32); the time's ADA also starts
//!   from 8 entries, from equal bins (the times are not known before traffic).

use std::sync::Arc;

use serde::Serialize;

use crate::ada::arith::Op;
use crate::ada::block::{Ada, AdaConfig as BlockConfig, AdaStats};
use crate::lab::bench::experiments::ExperimentError;
use crate::lab::bench::nimble::UNIFORM_SIGNIFICANT_BITS;
use crate::mem::tcam::Tcam;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::nimble::{Arithmetic, Nimble, NimbleConfig, NimbleDrop, CONTROLLER_ENTRY};
use crate::program::{DropReason, Harness, Verdict};
use crate::rng::SplitMix64;
use crate::timer::Launch;

/// The paper's Table II: reads and writes per controller update, ADA(R), ADA(ΔT),
/// ADA(ΔT, R).
pub const PAPER_TABLE_II: [(Variant, f64, f64); 3] = [
    (Variant::AdaR, 12.32, 73.31),
    (Variant::AdaDt, 9.27, 32.63),
    (Variant::AdaDtR, 24.54, 98.43),
];

/// The paper's Table II: RMT stages of ADA(R), ADA(ΔT), ADA(ΔT, R).
pub const PAPER_STAGES: [(Variant, u32); 3] = [
    (Variant::AdaR, 2),
    (Variant::AdaDt, 2),
    (Variant::AdaDtR, 3),
];

/// How the limiter multiplies the rate by the time in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    /// A native multiplication.
    Exact,
    /// The rate's log table by the prior work's uniform population (2 significant bits,
    /// 124 entries).
    Uniform,
    /// Nimble's own: the rate baked in by the control plane.
    Static,
    /// ADA on the rate (Figure 8's "Nimble with ADA", Table II's ADA(R)).
    AdaR,
    /// ADA on the time, the rate's table uniform (Table II's ADA(ΔT)).
    AdaDt,
    /// ADA on both (Table II's ADA(ΔT, R)).
    AdaDtR,
}

impl Variant {
    /// Figure 8's four, in the order they are reported.
    pub const FIGURE_8: [Variant; 4] = [
        Variant::Exact,
        Variant::Uniform,
        Variant::Static,
        Variant::AdaR,
    ];

    /// The name the CSV uses: `exact`, `uniform`, `static`, `ada-r`, `ada-dt`, `ada-dt-r`.
    pub fn slug(self) -> &'static str {
        match self {
            Variant::Exact => "exact",
            Variant::Uniform => "uniform",
            Variant::Static => "static",
            Variant::AdaR => "ada-r",
            Variant::AdaDt => "ada-dt",
            Variant::AdaDtR => "ada-dt-r",
        }
    }

    /// The paper's name: `exact`, `uniform`, `static`, `ADA(R)`, `ADA(dT)`, `ADA(dT, R)`.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Exact => "exact",
            Variant::Uniform => "uniform",
            Variant::Static => "static",
            Variant::AdaR => "ADA(R)",
            Variant::AdaDt => "ADA(dT)",
            Variant::AdaDtR => "ADA(dT, R)",
        }
    }

    fn ada_on_rate(self) -> bool {
        matches!(self, Variant::AdaR | Variant::AdaDtR)
    }

    fn ada_on_dt(self) -> bool {
        matches!(self, Variant::AdaDt | Variant::AdaDtR)
    }
}

/// The settings of §V.B's runs, in the limiter's units (from the `--nimble-*` options).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scenario {
    /// The rate until the change, bit/s.
    pub rate_bps: u64,
    /// The rate from the change, bit/s.
    pub rate_after_bps: u64,
    /// When the rate changes, ns.
    pub change_ns: u64,
    /// How long traffic is offered, ns.
    pub duration_ns: u64,
    /// Frame size, bytes.
    pub frame_bytes: usize,
    /// Offered load, bit/s.
    pub offered_bps: f64,
    /// Width of a measurement window, ns.
    pub window_ns: u64,
    /// ADA's controller period, ns.
    pub controller_ns: u64,
    /// Most monitoring entries of ADA on the time.
    pub dt_monitor_entries: usize,
    /// Recovered: the admitted rate within this share of the new rate.
    pub tolerance: f64,
}

impl Scenario {
    /// Windows of the run (the last may be partial).
    pub fn windows(&self) -> usize {
        self.duration_ns.div_ceil(self.window_ns) as usize
    }

    /// Windows `1..before_end` lie wholly before the change (window 0 holds the full
    /// bucket's burst).
    pub fn before_end(&self) -> usize {
        (self.change_ns / self.window_ns) as usize
    }

    /// The first window wholly after the change.
    pub fn after_start(&self) -> usize {
        self.change_ns.div_ceil(self.window_ns) as usize
    }

    /// Full windows (the partial last one, if any, is left out of the means).
    pub fn full_windows(&self) -> usize {
        (self.duration_ns / self.window_ns) as usize
    }

    /// Mean nanoseconds between frames.
    fn mean_gap_ns(&self) -> f64 {
        self.frame_bytes as f64 * 8.0 * 1e9 / self.offered_bps
    }
}

/// When a run's admitted rate came within the tolerance of the new rate ([`recovery`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Recovery {
    /// The first window of the recovered stretch.
    pub window: usize,
    /// Controller epochs run after the change up to that window's start (0 without a
    /// controller).
    pub epochs: u64,
    /// `epochs` times the controller period, µs: the emulated control-plane delay.
    pub epochs_us: f64,
    /// From the change to the window's start, µs.
    pub since_change_us: f64,
}

/// One ADA operand's controller over a run (priming left out).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OperandCost {
    /// `rate` or `dt`.
    pub operand: &'static str,
    /// Monitoring bins when traffic started (after priming).
    pub bins_start: u64,
    /// Monitoring bins at the end.
    pub bins_end: u64,
    /// Epochs run during traffic.
    pub epochs: u64,
    /// Hit counters read during traffic.
    pub reads: u64,
    /// Entries written during traffic (calculation tables and bins).
    pub writes: u64,
    /// Calculation tables installed during traffic.
    pub repopulations: u64,
    /// Lookups of its monitoring block, from the block's hit counters.
    pub monitoring_lookups: u64,
    /// Lookups of its calculation table, from the table's hit counters.
    pub calculation_lookups: u64,
}

/// The controller's and the data plane's cost of a run with ADA (Table II).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ControlCost {
    /// Controller updates (timer launches; each runs an epoch of every ADA operand).
    pub updates: u64,
    /// Hit counters read, over the operands.
    pub reads: u64,
    /// Entries written, over the operands.
    pub writes: u64,
    /// `reads / updates`.
    pub reads_per_update: f64,
    /// `writes / updates`.
    pub writes_per_update: f64,
    /// Monitoring lookups per offered packet (measured).
    pub monitoring_lookups_per_packet: f64,
    /// Calculation lookups per offered packet: the rate's, the time's and the antilog
    /// table's (ADA's measured, the fixed ones counted: one per refill by lookups).
    pub calculation_lookups_per_packet: f64,
    /// Both.
    pub tcam_lookups_per_packet: f64,
    /// Per operand.
    pub operands: Vec<OperandCost>,
}

/// One run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NimbleRun {
    /// How the refill is multiplied.
    pub variant: Variant,
    /// Entries of the rate's calculation table under ADA (`None` otherwise).
    pub rate_table_entries: Option<usize>,
    /// Epochs the control plane primed the rate's ADA with on the configured rate, before
    /// traffic (0: it starts from Algorithm 1's equal bins).
    pub prime_epochs: u32,
    /// Admitted Gbit/s per window.
    pub admitted_gbps: Vec<f64>,
    /// Frames offered.
    pub offered: u64,
    /// Frames admitted (verdicts).
    pub admitted: u64,
    /// Frames dropped as `rate_exceeded`.
    pub dropped: u64,
    /// Frames the limiter's own counter admitted.
    pub counted: u64,
    /// Frames that refilled by lookups (those with a time since the class's last frame).
    pub refills: u64,
    /// Mean admitted Gbit/s of the full windows before the change, window 0 left out.
    pub mean_before_gbps: f64,
    /// Mean admitted Gbit/s of the full windows after the change.
    pub mean_after_gbps: f64,
    /// When the admitted rate came within the tolerance of the new rate, if it did.
    pub recovery: Option<Recovery>,
    /// The controller's and the data plane's cost (with an ADA operand only).
    pub cost: Option<ControlCost>,
    /// Every frame admitted or dropped, the limiter's counter agreeing, and (with ADA)
    /// every refill looked up in each ADA operand's monitoring and table once.
    pub accounted: bool,
}

impl NimbleRun {
    /// The mean's relative error against the rate set: before and after the change.
    pub fn errors(&self, s: &Scenario) -> (f64, f64) {
        (
            self.mean_before_gbps / (s.rate_bps as f64 / 1e9) - 1.0,
            self.mean_after_gbps / (s.rate_after_bps as f64 / 1e9) - 1.0,
        )
    }
}

/// What §V.B's runs found.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NimbleReport {
    /// Window width, µs (the x of `admitted_gbps`).
    pub window_us: f64,
    /// The first window wholly after the change.
    pub after_start: usize,
    /// Every frame of every run accounted for (admitted or dropped, the limiter's counter
    /// agreeing, ADA's blocks looked up once per refill), and the exact arithmetic's mean
    /// admitted rate within [`EXACT_TOLERANCE`] of the rate set, before and after the
    /// change (window 0, which holds the full bucket's burst, left out), where the offered
    /// load is at least one and a half times the rate (below that, Poisson gaps leave the
    /// bucket full at times and it rightly admits less).
    pub verified: bool,
    /// Figure 8: exact, uniform, static, ADA(R).
    pub fig8: Vec<NimbleRun>,
    /// Table II: ADA(R), ADA(ΔT), ADA(ΔT, R), each unprimed.
    pub table2: Vec<NimbleRun>,
    /// Figure 9: ADA(R) at each calculation table size.
    pub fig9: Vec<NimbleRun>,
}

/// One run to do: a variant, and the rate's ADA table size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Spec {
    pub variant: Variant,
    pub rate_table_entries: usize,
    /// The control plane primes the rate's ADA on the configured rate at install (its 30
    /// epochs grow the monitoring from 8 bins to 12); Table II's runs start unprimed.
    pub primed: bool,
}

/// The paper's calculation table: 128 entries.
pub const PAPER_TABLE_ENTRIES: usize = 128;

fn setup(what: &str, e: impl std::fmt::Display) -> ExperimentError {
    ExperimentError::Setup(format!("{what}: {e}"))
}

fn limiter_config(s: &Scenario, spec: Spec) -> NimbleConfig {
    let paper = BlockConfig::new(Op::Mul);
    let rate_ada = BlockConfig {
        table_entries: spec.rate_table_entries,
        ..paper
    };
    let dt_ada = BlockConfig {
        max_monitor_entries: s.dt_monitor_entries,
        ..paper
    };
    let uniform = Arithmetic::Uniform {
        significant_bits: UNIFORM_SIGNIFICANT_BITS,
    };
    let arithmetic = match spec.variant {
        Variant::Exact => Arithmetic::Exact,
        Variant::Uniform | Variant::AdaDt => uniform,
        Variant::Static => Arithmetic::Static,
        Variant::AdaR | Variant::AdaDtR => Arithmetic::Ada(rate_ada),
    };
    NimbleConfig {
        rates_bps: vec![s.rate_bps],
        arithmetic,
        dt_ada: spec.variant.ada_on_dt().then_some(dt_ada),
        controller_period_ns: s.controller_ns,
        prime_epochs: if spec.primed {
            NimbleConfig::default().prime_epochs
        } else {
            0
        },
        ..NimbleConfig::default()
    }
}

/// Counts the lookups of ADA's blocks by their hit counters: read before each controller
/// update (which may replace a block, zeroing its counters) and at the end, re-based
/// after each update. One frame at a time, so no hit is lost.
struct HitMeter {
    /// Per operand: its monitoring block and calculation table.
    blocks: Vec<[(u64, u64); 2]>,
    /// Per operand: monitoring and calculation lookups counted.
    counted: Vec<[u64; 2]>,
}

fn tcams(ada: &Ada) -> [&Tcam; 2] {
    [ada.monitor(), ada.table().tcam()]
}

fn snapshot(t: &Tcam) -> (u64, u64) {
    let (version, hits) = t.hits();
    (version, hits.iter().sum())
}

impl HitMeter {
    fn new(adas: &[(&'static str, Arc<Ada>)]) -> HitMeter {
        HitMeter {
            blocks: adas.iter().map(|(_, a)| tcams(a).map(snapshot)).collect(),
            counted: vec![[0; 2]; adas.len()],
        }
    }

    /// Adds the hits since the last snapshot.
    fn count(&mut self, adas: &[(&'static str, Arc<Ada>)]) -> Result<(), ExperimentError> {
        for (i, (_, a)) in adas.iter().enumerate() {
            for (k, t) in tcams(a).into_iter().enumerate() {
                let (version, sum) = snapshot(t);
                let (was_version, was) = self.blocks[i][k];
                if version != was_version || sum < was {
                    return Err(ExperimentError::Run(
                        "an ADA block changed between controller updates".into(),
                    ));
                }
                self.counted[i][k] += sum - was;
                self.blocks[i][k] = (version, sum);
            }
        }
        Ok(())
    }

    /// Takes the blocks as they are after an update.
    fn rebase(&mut self, adas: &[(&'static str, Arc<Ada>)]) {
        for (i, (_, a)) in adas.iter().enumerate() {
            self.blocks[i] = tcams(a).map(snapshot);
        }
    }
}

/// Runs one limiter on the scenario's stream (module doc); `seed` seeds the arrivals.
pub(super) fn run(s: &Scenario, spec: Spec, seed: u64) -> Result<NimbleRun, ExperimentError> {
    let mem = Arc::new(
        SharedMemory::new(&MemConfig {
            sram_bytes: 1 << 16,
            dram_bytes: 1 << 16,
            acc_bytes: 0,
            banks: 4,
        })
        .map_err(|e| setup("the limiter's memory", e))?,
    );
    let nimble = Nimble::install(&mem, limiter_config(s, spec))
        .map_err(|e| setup(spec.variant.label(), e))?;
    let program = nimble.program();
    let adas: Vec<(&'static str, Arc<Ada>)> = (nimble.ada().map(|a| ("rate", Arc::clone(a))))
        .into_iter()
        .chain(nimble.dt_ada().map(|a| ("dt", Arc::clone(a))))
        .collect();
    let start: Vec<AdaStats> = adas.iter().map(|(_, a)| a.stats()).collect();
    let mut meter = HitMeter::new(&adas);
    let rate_exceeded: DropReason = NimbleDrop::RateExceeded.into();

    let mut h = Harness::new(Arc::clone(&mem));
    let frame = vec![0u8; s.frame_bytes];
    let mut rng = SplitMix64::new(seed);
    let gap = s.mean_gap_ns();
    let mut windows = vec![0u64; s.windows()];
    let (mut offered, mut admitted, mut dropped, mut refills) = (0u64, 0u64, 0u64, 0u64);
    let mut epochs_at: Vec<u64> = Vec::new();
    let mut next_epoch = s.controller_ns;
    let mut changed = false;
    let mut last_ns = 0u64;
    let mut t = 0.0f64;
    loop {
        t += -(1.0 - rng.uniform()).ln() * gap;
        let now = t as u64;
        if now >= s.duration_ns {
            break;
        }
        while !adas.is_empty() && next_epoch <= now {
            meter.count(&adas)?;
            h.set_now(next_epoch);
            let launch = Launch {
                timer: 0,
                entry: CONTROLLER_ENTRY,
                slice: 0,
                slices: 1,
                scheduled_ns: next_epoch,
                missed: 0,
            };
            let out = h.run_timer(&program, launch);
            if out.result != Ok(Verdict::Consume) {
                return Err(ExperimentError::Run(format!(
                    "{}: ADA's controller at {} ns: {:?}",
                    spec.variant.label(),
                    next_epoch,
                    out.result
                )));
            }
            meter.rebase(&adas);
            epochs_at.push(next_epoch);
            next_epoch += s.controller_ns;
        }
        if !changed && now >= s.change_ns {
            nimble
                .set_rate(&mem, 0, s.rate_after_bps)
                .map_err(|e| setup("the new rate", e))?;
            changed = true;
        }
        h.set_now(now);
        offered += 1;
        // The class's clock starts at 0: a frame refills by lookups when time has passed.
        if now > last_ns {
            refills += 1;
        }
        last_ns = now;
        match h.run(&program, 0, &frame).result {
            Ok(Verdict::Forward(_)) => {
                admitted += 1;
                windows[(now / s.window_ns) as usize] += s.frame_bytes as u64;
            }
            Ok(Verdict::Drop(r)) if r == rate_exceeded => dropped += 1,
            other => {
                return Err(ExperimentError::Run(format!(
                    "{}: a frame at {now} ns ended {other:?}",
                    spec.variant.label()
                )))
            }
        }
    }
    meter.count(&adas)?;
    let counted = nimble
        .counts(&mem, 0)
        .map_err(|e| setup("the class's counters", e))?
        .packets;

    let admitted_gbps: Vec<f64> = (windows.iter().enumerate())
        .map(|(i, &b)| {
            let start = i as u64 * s.window_ns;
            let width = s.window_ns.min(s.duration_ns - start);
            b as f64 * 8.0 / width as f64
        })
        .collect();
    let mean = |from: usize, to: usize| {
        let w = &admitted_gbps[from..to.max(from)];
        w.iter().sum::<f64>() / w.len().max(1) as f64
    };
    let end = s.full_windows();
    let mut cost = None;
    let mut lookups_ok = true;
    if !adas.is_empty() {
        let updates = epochs_at.len() as u64;
        let operands: Vec<OperandCost> = (adas.iter().zip(&start).zip(&meter.counted))
            .map(|(((name, a), before), c)| {
                let now = a.stats();
                OperandCost {
                    operand: name,
                    bins_start: before.bins,
                    bins_end: now.bins,
                    epochs: now.epochs - before.epochs,
                    reads: now.reads - before.reads,
                    writes: now.writes - before.writes,
                    repopulations: now.repopulations - before.repopulations,
                    monitoring_lookups: c[0],
                    calculation_lookups: c[1],
                }
            })
            .collect();
        lookups_ok = operands.iter().all(|o| {
            o.epochs == updates
                && o.monitoring_lookups == refills
                && o.calculation_lookups == refills
        });
        let (reads, writes) = operands
            .iter()
            .fold((0, 0), |(r, w), o| (r + o.reads, w + o.writes));
        let per = |n: u64, d: u64| n as f64 / d.max(1) as f64;
        let monitoring: u64 = operands.iter().map(|o| o.monitoring_lookups).sum();
        let ada_calc: u64 = operands.iter().map(|o| o.calculation_lookups).sum();
        // The rate's table, the time's and the antilog: the fixed ones once per refill.
        let fixed = (3 - operands.len() as u64) * refills;
        cost = Some(ControlCost {
            updates,
            reads,
            writes,
            reads_per_update: per(reads, updates),
            writes_per_update: per(writes, updates),
            monitoring_lookups_per_packet: per(monitoring, offered),
            calculation_lookups_per_packet: per(ada_calc + fixed, offered),
            tcam_lookups_per_packet: per(monitoring + ada_calc + fixed, offered),
            operands,
        });
    }
    let mut r = NimbleRun {
        variant: spec.variant,
        rate_table_entries: spec
            .variant
            .ada_on_rate()
            .then_some(spec.rate_table_entries),
        prime_epochs: if spec.variant.ada_on_rate() {
            nimble.config().prime_epochs
        } else {
            0
        },
        mean_before_gbps: mean(1, s.before_end()),
        mean_after_gbps: mean(s.after_start(), end),
        admitted_gbps,
        offered,
        admitted,
        dropped,
        counted,
        refills,
        recovery: None,
        cost,
        accounted: admitted + dropped == offered && counted == admitted && lookups_ok,
    };
    r.recovery = recovery(s, &windows, &epochs_at);
    Ok(r)
}

/// The first window `k` after the change, in the first half of the windows after it,
/// from which every stretch of windows `k..j` admitted the new rate within the tolerance,
/// give or take one frame (module doc); `bytes` per window, `epochs_at` the controller's
/// launch times.
pub fn recovery(s: &Scenario, bytes: &[u64], epochs_at: &[u64]) -> Option<Recovery> {
    let per_window = s.rate_after_bps as f64 * s.window_ns as f64 / 8e9;
    let end = s.full_windows().min(bytes.len());
    let start = s.after_start();
    let frame = s.frame_bytes as f64;
    let within = |k: usize| {
        let mut sum = 0.0;
        (k..end).all(|j| {
            sum += bytes[j] as f64;
            let want = per_window * (j + 1 - k) as f64;
            (sum - want).abs() <= s.tolerance * want + frame
        })
    };
    let k = (start..start + (end - start).div_ceil(2)).find(|&k| within(k))?;
    let start_ns = k as u64 * s.window_ns;
    let epochs = epochs_at
        .iter()
        .filter(|&&e| e > s.change_ns && e <= start_ns)
        .count() as u64;
    Some(Recovery {
        window: k,
        epochs,
        epochs_us: epochs as f64 * s.controller_ns as f64 / 1e3,
        since_change_us: start_ns.saturating_sub(s.change_ns) as f64 / 1e3,
    })
}

/// Splits the runs, done in [`specs`]'s order, into Figure 8's, Table II's and Figure 9's,
/// and checks them ([`NimbleReport::verified`]).
pub(super) fn report(
    s: &Scenario,
    mut runs: Vec<NimbleRun>,
) -> Result<NimbleReport, ExperimentError> {
    let fixed = Variant::FIGURE_8.len() + TABLE_II.len();
    if runs.len() < fixed {
        return Err(ExperimentError::Run("a Nimble run is missing".into()));
    }
    let fig9 = runs.split_off(fixed);
    let table2 = runs.split_off(Variant::FIGURE_8.len());
    let fig8 = runs;
    // A rate the offered load does not exceed by half again is not what the bucket admits:
    // Poisson gaps leave it full at times, and it admits less.
    let limits = |rate: u64| rate as f64 * 1.5 <= s.offered_bps;
    let exact_ok = fig8
        .iter()
        .filter(|r| r.variant == Variant::Exact)
        .all(|r| {
            let (before, after) = r.errors(s);
            (!limits(s.rate_bps) || before.abs() <= EXACT_TOLERANCE)
                && (!limits(s.rate_after_bps) || after.abs() <= EXACT_TOLERANCE)
        });
    let accounted = fig8.iter().chain(&table2).chain(&fig9).all(|r| r.accounted);
    Ok(NimbleReport {
        window_us: s.window_ns as f64 / 1e3,
        after_start: s.after_start(),
        verified: exact_ok && accounted,
        fig8,
        table2,
        fig9,
    })
}

/// The exact arithmetic's mean admitted rate, before and after the change, must be
/// within this share of the rate set.
pub const EXACT_TOLERANCE: f64 = 0.005;

/// Table II's variants, in the paper's order.
pub const TABLE_II: [Variant; 3] = [Variant::AdaR, Variant::AdaDt, Variant::AdaDtR];

/// The runs to do, in order: Figure 8's four (ADA primed on the first rate, as Nimble's
/// control plane would), Table II's three (unprimed: each operand's monitoring starts
/// from 8 entries during traffic), Figure 9's sizes (primed, as Figure 8).
pub(super) fn specs(table_entries: &[usize]) -> Vec<Spec> {
    let spec = |variant, rate_table_entries, primed| Spec {
        variant,
        rate_table_entries,
        primed,
    };
    let paper = PAPER_TABLE_ENTRIES;
    let mut out: Vec<Spec> = (Variant::FIGURE_8.iter())
        .map(|&v| spec(v, paper, true))
        .collect();
    out.extend(TABLE_II.iter().map(|&v| spec(v, paper, false)));
    out.extend(table_entries.iter().map(|&n| spec(Variant::AdaR, n, true)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 10 windows of 100 µs, the rate halved at 400 µs: 100 frames of 1500 bytes a window
    /// from then.
    fn scenario() -> Scenario {
        Scenario {
            rate_bps: 24_000_000_000,
            rate_after_bps: 12_000_000_000,
            change_ns: 400_000,
            duration_ns: 1_000_000,
            frame_bytes: 1500,
            offered_bps: 40e9,
            window_ns: 100_000,
            controller_ns: 100_000,
            dt_monitor_entries: 32,
            tolerance: 0.01,
        }
    }

    const FRAME: u64 = 1500;

    fn epochs() -> Vec<u64> {
        (1..10).map(|i| i * 100_000).collect()
    }

    #[test]
    fn recovery_allows_a_frame_either_way_and_counts_the_epochs_after_the_change() {
        let s = scenario();
        let mut bytes = vec![200 * FRAME; 4];
        // Two windows off by 7% and 3%, then the rate with a frame's jitter.
        bytes.extend([107, 103, 101, 99, 100, 100].map(|f| f * FRAME));
        let r = recovery(&s, &bytes, &epochs()).expect("recovers");
        assert_eq!(r.window, 6);
        // The epochs at 500 and 600 µs, not the one at the change.
        assert_eq!(
            (r.epochs, r.epochs_us, r.since_change_us),
            (2, 200.0, 200.0)
        );
        // From the change on: no epoch needed.
        let exact: Vec<u64> = (0..10)
            .map(|i| if i < 4 { 200 } else { 100 } * FRAME)
            .collect();
        let r = recovery(&s, &exact, &epochs()).expect("recovers");
        assert_eq!((r.window, r.epochs), (4, 0));
    }

    #[test]
    fn a_steady_bias_beyond_the_tolerance_never_recovers() {
        let s = scenario();
        // 2% low every window: within a frame and a percent of one window, not of two.
        let low: Vec<u64> = (0..10)
            .map(|i| if i < 4 { 200 } else { 98 } * FRAME)
            .collect();
        assert_eq!(recovery(&s, &low, &epochs()), None);
        // Right only in the last windows, past the first half after the change: too late to
        // say.
        let late: Vec<u64> = (0..10)
            .map(|i| match i {
                0..=3 => 200,
                4..=7 => 150,
                _ => 100,
            } * FRAME)
            .collect();
        assert_eq!(recovery(&s, &late, &epochs()), None);
    }

    #[test]
    fn runs_come_in_the_reports_order() {
        let specs = specs(&[16, 128]);
        let variants: Vec<Variant> = specs.iter().map(|s| s.variant).collect();
        assert_eq!(
            variants,
            [
                Variant::Exact,
                Variant::Uniform,
                Variant::Static,
                Variant::AdaR,
                Variant::AdaR,
                Variant::AdaDt,
                Variant::AdaDtR,
                Variant::AdaR,
                Variant::AdaR,
            ]
        );
        // Table II's runs start unprimed, the figures' primed on the first rate.
        let primed: Vec<bool> = specs.iter().map(|s| s.primed).collect();
        assert_eq!(
            primed,
            [true, true, true, true, false, false, false, true, true]
        );
        assert_eq!(specs[7].rate_table_entries, 16);
    }

    #[test]
    fn every_frame_is_admitted_or_dropped_and_the_exact_bucket_keeps_its_rate() {
        let s = scenario();
        let spec = |variant| Spec {
            variant,
            rate_table_entries: PAPER_TABLE_ENTRIES,
            primed: true,
        };
        let exact = run(&s, spec(Variant::Exact), 1).expect("runs");
        assert!(exact.accounted && exact.cost.is_none());
        assert_eq!(exact.admitted + exact.dropped, exact.offered);
        let (before, after) = exact.errors(&s);
        assert!(
            before.abs() < 0.01 && after.abs() < 0.01,
            "{before} {after}"
        );
        let ada = run(&s, spec(Variant::AdaDtR), 1).expect("runs");
        assert!(ada.accounted, "{ada:?}");
        let cost = ada.cost.expect("a controller");
        // One update per 100 µs while frames came; every refill through both operands'
        // monitoring and tables, and the fixed antilog.
        assert_eq!(cost.updates, 9);
        assert_eq!(cost.operands.len(), 2);
        let per_refill = cost.tcam_lookups_per_packet * ada.offered as f64 / ada.refills as f64;
        assert!((per_refill - 5.0).abs() < 1e-9, "{per_refill}");
        // The same arrivals whatever the limiter.
        assert_eq!(ada.offered, exact.offered);
    }
}
