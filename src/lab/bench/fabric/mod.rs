//! Hipernetch's single-switch evaluation (Papaphilippou et al., TRETS 2021, §5.5 and §6.1)
//! on pfemu's fabric models ([`crate::fabric`]), and their speed (`pfemu bench fabric`).
//!
//! - [`fabric_latency`] (`pfemu experiment fabric-latency`): Figures 9, 11 and 12. Every
//!   architecture of Figure 11 under each traffic model of §6.1, at each input rate, with
//!   FIFOs of infinite depth: mean latency (Figure 11), the average worst-case latency
//!   (Figure 12), CPRR's mean against M/D/1's equation 7 (Figure 9), and the carried load
//!   against the offered one, which §5.5 only asserts.
//! - [`fabric_loss`] (`pfemu experiment fabric-loss`): Figure 13. The loss ratio against the
//!   FIFO depth at several input rates, for CPRR and the best alternative of each traffic
//!   model (the paper's PIM, PIM and EDRRM), and the smallest depth that loses nothing at an
//!   input rate near 1.
//! - [`fabric_chassis`] (`pfemu experiment fabric-chassis`): the fabric inside a chassis,
//!   Trio-ML's hierarchical aggregation through it under background load.
//! - [`fabric_bench`] (`pfemu bench fabric`): how fast each architecture simulates.
//!
//! A point is one [`simulate_bounded`] run: a warm-up, a window of `--cycles` cycles whose
//! arrivals are measured, and a drain. A point whose backlog passes `--max-backlog` cells
//! (4 x 10^6 by default, about 100 MB of cells, up to twice that with the queues' spare
//! room) stops there and is reported saturated, without latencies: above an architecture's
//! saturation its queues grow every cycle, and a long run would otherwise take all the
//! memory there is. Points run on `--threads` threads, each holding its own backlog; a
//! sweep whose threads' backlogs together could pass [`MAX_BACKLOG_BYTES`] (64 GiB) is
//! refused before it starts, naming both options and the total. Each point's seed comes from
//! the run's seed, its traffic model and its input rate only, so every architecture sees the
//! same arrivals and the results do not depend on the number of threads.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;
use serde::Serialize;

use super::experiments::ExperimentError;
use crate::error::ConfigError;
use crate::fabric::DEFAULT_MAX_BACKLOG;
use crate::fabric::{simulate_bounded, Architecture, Depth, FabricConfig, Report, Traffic};
use crate::rng::mix;

mod bench;
mod chassis;
mod latency;
mod loss;

pub use super::experiments::Claim;
pub use bench::{fabric_bench, FabricBenchConfig, FabricBenchReport, SpeedRow};
pub use chassis::{
    fabric_chassis, ChassisRow, FabricChassisConfig, FabricChassisReport, CHASSIS_ARCHITECTURES,
};
pub use latency::{fabric_latency, FabricLatencyConfig, FabricLatencyReport, LatencyRow};
pub use loss::{fabric_loss, FabricLossConfig, FabricLossReport, LossRow, ZeroLossDepth};

// ----- settings --------------------------------------------------------------------------------

/// The switch and traffic settings both experiments share. As command-line options, those of
/// `pfemu experiment fabric-latency` and `fabric-loss`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct SwitchSettings {
    /// Ports P of the switch (the paper: 16).
    #[arg(long, default_value_t = SwitchSettings::default().ports, help = "Ports of the switch, P (2 to 64)")]
    pub ports: usize,
    /// Measured cycles per point.
    #[arg(long, default_value_t = SwitchSettings::default().cycles, help = "Cycles measured per point, after the warm-up (1 to 1e10)")]
    pub cycles: u64,
    /// Warm-up cycles per point, not measured.
    #[arg(long, default_value_t = SwitchSettings::default().warmup, help = "Warm-up cycles per point, not measured (at most 1e10)")]
    pub warmup: u64,
    /// Mean burst of the bursty traffic, s (the paper: 32).
    #[arg(long, default_value_t = SwitchSettings::default().burst, help = "Mean burst of the bursty traffic, s, in cells (1 to 1e9)")]
    pub burst: f64,
    /// Nonuniform traffic: the chance a cell goes to the output of its input's index, p.
    #[arg(long, default_value_t = SwitchSettings::default().same, help = "Nonuniform traffic: chance a cell goes to its own port's output, p, in [0, 1]")]
    pub same: f64,
    /// Cells a point may hold queued before it stops, reported saturated.
    #[arg(long, default_value_t = SwitchSettings::default().max_backlog,
          help = "Cells a point may hold queued before it stops, reported saturated, 1 to 1e9 (memory: about 24 bytes a cell, up to twice that; with --threads, at most 64 GiB in all)")]
    pub max_backlog: u64,
    /// Seed of the traffic and of PIM's random choices.
    #[arg(long, default_value_t = SwitchSettings::default().seed, help = "Seed of the traffic and of PIM's random choices")]
    pub seed: u64,
    /// Threads the points run on.
    #[arg(long, default_value_t = SwitchSettings::default().threads, hide_default_value = true,
          help = "Threads the points run on, 1 to 1024 [default: available cores]")]
    pub threads: usize,
}

impl Default for SwitchSettings {
    /// 16 ports, 10^6 measured cycles after 10^5 of warm-up, s = 32, p = 0.5, a backlog of
    /// at most [`DEFAULT_MAX_BACKLOG`] cells, seed 1, threads = cores.
    fn default() -> Self {
        SwitchSettings {
            ports: 16,
            cycles: 1_000_000,
            warmup: 100_000,
            burst: 32.0,
            same: 0.5,
            max_backlog: DEFAULT_MAX_BACKLOG,
            seed: 1,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Most threads a sweep takes.
const MAX_THREADS: usize = 1024;
/// Most cycles a point may measure or warm up: the fabric's own bound (a point of 10^10
/// cycles takes hours).
pub(super) use crate::fabric::MAX_CYCLES;
/// The largest `--max-backlog`: 10^9 cells, some 24 to 48 GB per point.
const MAX_BACKLOG: u64 = 1_000_000_000;
/// Bytes a queued cell may take at most: about 24, up to twice that with the queues' spare
/// room.
pub const BACKLOG_CELL_BYTES: u64 = 48;
/// The most memory the backlogs of a sweep's points running at once may take together,
/// `--threads` × `--max-backlog` × [`BACKLOG_CELL_BYTES`]: 64 GiB. Each option is capped
/// alone, but 1024 threads of the default backlog would ask for some 200 GB; a sweep over
/// this budget is refused before any point runs.
pub const MAX_BACKLOG_BYTES: u64 = 64 << 30;

impl SwitchSettings {
    /// The paper's three traffic models with these settings' s and p.
    pub fn traffic(&self) -> [Traffic; 3] {
        [
            Traffic::Bernoulli,
            Traffic::Bursty { burst: self.burst },
            Traffic::Nonuniform { same: self.same },
        ]
    }

    /// Checks the settings, naming the option at fault.
    pub fn check(&self) -> Result<(), ExperimentError> {
        let option = |e: ConfigError| ExperimentError::Option {
            option: match e.setting {
                "burst" => "--burst",
                "same" => "--same",
                _ => "--ports",
            },
            reason: e.reason,
        };
        FabricConfig::new(Architecture::OqXbar, self.ports, Depth::Infinite)
            .validate()
            .map_err(option)?;
        for t in self.traffic() {
            t.validate().map_err(option)?;
        }
        if self.cycles == 0 || self.cycles > MAX_CYCLES {
            return bad("--cycles", format!("{}: 1 to {MAX_CYCLES}", self.cycles));
        }
        if self.warmup > MAX_CYCLES {
            return bad("--warmup", format!("{}: at most {MAX_CYCLES}", self.warmup));
        }
        if self.max_backlog == 0 || self.max_backlog > MAX_BACKLOG {
            return bad(
                "--max-backlog",
                format!("{} cells: 1 to {MAX_BACKLOG}", self.max_backlog),
            );
        }
        if self.threads == 0 || self.threads > MAX_THREADS {
            return bad("--threads", format!("{}: 1 to {MAX_THREADS}", self.threads));
        }
        // Both within their caps: the product fits u64 (2^10 x 2^30 x 2^6).
        let bytes = self.threads as u64 * self.max_backlog * BACKLOG_CELL_BYTES;
        if bytes > MAX_BACKLOG_BYTES {
            return bad(
                "--threads x --max-backlog",
                format!(
                    "{} threads x {} cells x {BACKLOG_CELL_BYTES} bytes a cell = {:.1} GiB of \
                     backlog at once, over the budget of {} GiB: give fewer --threads or a \
                     smaller --max-backlog",
                    self.threads,
                    self.max_backlog,
                    bytes as f64 / (1u64 << 30) as f64,
                    MAX_BACKLOG_BYTES >> 30
                ),
            );
        }
        Ok(())
    }
}

pub(super) fn bad<T>(option: &'static str, reason: String) -> Result<T, ExperimentError> {
    Err(ExperimentError::Option { option, reason })
}

/// Checks a list of input rates: each in (0, 1], at least one.
pub(super) fn check_loads(option: &'static str, loads: &[f64]) -> Result<(), ExperimentError> {
    if loads.is_empty() {
        return bad(option, "give at least one input rate".into());
    }
    match loads.iter().find(|r| !(**r > 0.0 && **r <= 1.0)) {
        Some(r) => bad(option, format!("{r}: an input rate is in (0, 1]")),
        None => Ok(()),
    }
}

// ----- running points ----------------------------------------------------------------------

/// One run to make.
#[derive(Clone, Copy, Debug)]
pub(super) struct Point {
    pub architecture: Architecture,
    pub traffic: Traffic,
    pub load: f64,
    pub depth: Depth,
}

/// The seed of every point of one traffic model at one rate, whatever its architecture.
fn point_seed(seed: u64, traffic: Traffic, load: f64) -> u64 {
    mix(seed ^ mix(traffic_index(traffic) + 1) ^ mix(load.to_bits()))
}

fn traffic_index(t: Traffic) -> u64 {
    match t {
        Traffic::Bernoulli => 0,
        Traffic::Bursty { .. } => 1,
        Traffic::Nonuniform { .. } => 2,
    }
}

/// Runs `points` on `s.threads` threads; the reports in the points' order. `progress` is
/// called with (done, total) after each point.
pub(super) fn run_points(
    s: &SwitchSettings,
    points: &[Point],
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<Report>, ExperimentError> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<Report, ConfigError>>>> =
        Mutex::new(vec![None; points.len()]);
    std::thread::scope(|scope| {
        for _ in 0..s.threads.min(points.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(p) = points.get(i) else { break };
                let config = FabricConfig::new(p.architecture, s.ports, p.depth);
                let seed = point_seed(s.seed, p.traffic, p.load);
                let r = simulate_bounded(
                    &config,
                    p.traffic,
                    p.load,
                    s.warmup,
                    s.cycles,
                    seed,
                    s.max_backlog,
                );
                results.lock()[i] = Some(r);
                progress(done.fetch_add(1, Ordering::Relaxed) + 1, points.len());
            });
        }
    });
    results
        .into_inner()
        .into_iter()
        .map(|r| match r {
            Some(Ok(report)) => Ok(report),
            Some(Err(e)) => Err(ExperimentError::Setup(e.to_string())),
            None => Err(ExperimentError::Run("a point was not run".into())),
        })
        .collect()
}
