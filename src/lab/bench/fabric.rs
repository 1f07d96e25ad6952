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
//!
//! A point is one [`simulate`] run: a warm-up, a window of `--cycles` cycles whose arrivals
//! are measured, and a drain. Points run on `--threads` threads. Each point's seed comes from
//! the run's seed, its traffic model and its input rate only, so every architecture sees the
//! same arrivals and the results do not depend on the number of threads.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use serde::Serialize;

use super::experiments::{ExperimentError, Figure};
use super::plot::{self, Line, Panel, Panels, Series};
use super::PlotError;
use crate::error::ConfigError;
use crate::fabric::latency::{md1_wait, oq_bernoulli_wait};
use crate::fabric::{
    simulate, Architecture, Depth, FabricConfig, OutputArbiter, Report, Scheduler, Traffic,
    TrafficGen,
};
use crate::rng::mix;

// ----- settings --------------------------------------------------------------------------------

/// The switch and traffic settings both experiments share. As command-line options, those of
/// `pfemu experiment fabric-latency` and `fabric-loss`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct SwitchSettings {
    /// Ports P of the switch (the paper: 16).
    #[arg(long, default_value_t = SwitchSettings::default().ports, help = "Ports of the switch, P (2 to 64)")]
    pub ports: usize,
    /// Measured cycles per point.
    #[arg(long, default_value_t = SwitchSettings::default().cycles, help = "Cycles measured per point, after the warm-up")]
    pub cycles: u64,
    /// Warm-up cycles per point, not measured.
    #[arg(long, default_value_t = SwitchSettings::default().warmup, help = "Warm-up cycles per point, not measured")]
    pub warmup: u64,
    /// Mean burst of the bursty traffic, s (the paper: 32).
    #[arg(long, default_value_t = SwitchSettings::default().burst, help = "Mean burst of the bursty traffic, s, in cells")]
    pub burst: f64,
    /// Nonuniform traffic: the chance a cell goes to the output of its input's index, p.
    #[arg(long, default_value_t = SwitchSettings::default().same, help = "Nonuniform traffic: chance a cell goes to its own port's output, p")]
    pub same: f64,
    /// Seed of the traffic and of PIM's random choices.
    #[arg(long, default_value_t = SwitchSettings::default().seed, help = "Seed of the traffic and of PIM's random choices")]
    pub seed: u64,
    /// Threads the points run on.
    #[arg(long, default_value_t = SwitchSettings::default().threads, hide_default_value = true,
          help = "Threads the points run on [default: available cores]")]
    pub threads: usize,
}

impl Default for SwitchSettings {
    /// 16 ports, 10^6 measured cycles after 10^5 of warm-up, s = 32, p = 0.5, seed 1,
    /// threads = cores.
    fn default() -> Self {
        SwitchSettings {
            ports: 16,
            cycles: 1_000_000,
            warmup: 100_000,
            burst: 32.0,
            same: 0.5,
            seed: 1,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// Most threads a sweep takes.
const MAX_THREADS: usize = 1024;
/// Most cycles a point may measure or warm up (a point of 10^10 cycles takes hours).
const MAX_CYCLES: u64 = 10_000_000_000;

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
        if self.threads == 0 || self.threads > MAX_THREADS {
            return bad("--threads", format!("{}: 1 to {MAX_THREADS}", self.threads));
        }
        Ok(())
    }
}

fn bad<T>(option: &'static str, reason: String) -> Result<T, ExperimentError> {
    Err(ExperimentError::Option { option, reason })
}

/// Checks a list of input rates: each in (0, 1], at least one.
fn check_loads(option: &'static str, loads: &[f64]) -> Result<(), ExperimentError> {
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
struct Point {
    architecture: Architecture,
    traffic: Traffic,
    load: f64,
    depth: Depth,
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
fn run_points(
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
                let r = simulate(&config, p.traffic, p.load, s.warmup, s.cycles, seed);
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

// ----- Figures 9, 11 and 12 ----------------------------------------------------------------

/// Figures 9, 11 and 12 and the throughput of §5.5. As command-line options, those of
/// `pfemu experiment fabric-latency`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricLatencyConfig {
    /// The switch and the traffic.
    #[command(flatten)]
    pub switch: SwitchSettings,
    /// Input rates r to measure.
    #[arg(long, value_name = "R,...", value_delimiter = ',',
          default_value = super::settings::list_text(&FabricLatencyConfig::default().loads),
          help = "Input rates r to measure, in (0, 1]")]
    pub loads: Vec<f64>,
}

impl Default for FabricLatencyConfig {
    /// r = 0.1 to 0.9 by 0.1, then 0.95 and 0.99 (the paper's "near 1").
    fn default() -> Self {
        FabricLatencyConfig {
            switch: SwitchSettings::default(),
            loads: vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99],
        }
    }
}

/// One architecture under one traffic model at one input rate.
#[derive(Clone, Debug, Serialize)]
pub struct LatencyRow {
    /// `uniform`, `bursty` or `nonuniform`.
    pub traffic: &'static str,
    /// As the paper names it (`CPRR`, `OQ-xbar`, `PIM`, `PIM-1`, ...).
    pub architecture: String,
    /// The run.
    #[serde(flatten)]
    pub report: Report,
}

/// A claim of the paper beside what this run measured.
#[derive(Clone, Debug, Serialize)]
pub struct Claim {
    /// What is compared.
    pub what: String,
    /// The paper's figure.
    pub paper: String,
    /// This run's.
    pub measured: String,
}

/// The report of [`fabric_latency`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricLatencyReport {
    /// What was run.
    pub config: FabricLatencyConfig,
    /// One row per architecture, traffic model and input rate.
    pub rows: Vec<LatencyRow>,
    /// Figure 9: CPRR's largest distance from the exact output-queue wait under uniform
    /// traffic, `(P - 1) / P` of equation 7, over the rates up to 0.9, as a fraction.
    pub md1_deviation: f64,
    /// Near rate 1, per traffic model: CPRR's mean latency and the best alternative's.
    pub key: Vec<Claim>,
    /// Every point conserved its cells and dropped none (the FIFOs are infinite).
    pub verified: bool,
    /// Wall-clock seconds of the sweep.
    pub seconds: f64,
}

/// Runs Figures 9, 11 and 12; `progress` gets (points done, points).
pub fn fabric_latency(
    cfg: &FabricLatencyConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<FabricLatencyReport, ExperimentError> {
    let s = &cfg.switch;
    s.check()?;
    check_loads("--loads", &cfg.loads)?;
    let mut points = Vec::new();
    for traffic in s.traffic() {
        for &load in &cfg.loads {
            for architecture in Architecture::FIGURE_11 {
                points.push(Point {
                    architecture,
                    traffic,
                    load,
                    depth: Depth::Infinite,
                });
            }
        }
    }
    let start = Instant::now();
    let reports = run_points(s, &points, progress)?;
    let seconds = start.elapsed().as_secs_f64();
    let rows: Vec<LatencyRow> = points
        .iter()
        .zip(reports)
        .map(|(p, report)| LatencyRow {
            traffic: p.traffic.name(),
            architecture: p.architecture.name(),
            report,
        })
        .collect();
    let verified = rows
        .iter()
        .all(|r| r.report.counters.conserved() && r.report.dropped == 0 && r.report.stranded == 0);
    let md1_deviation = rows
        .iter()
        .filter(|r| r.traffic == "uniform" && r.architecture == "CPRR" && r.report.load <= 0.9)
        .map(|r| {
            let exact = oq_bernoulli_wait(s.ports, r.report.load);
            (r.report.mean_latency - exact).abs() / exact.max(1e-9)
        })
        .fold(0.0, f64::max);
    let key = latency_claims(&rows, &cfg.loads);
    Ok(FabricLatencyReport {
        config: cfg.clone(),
        rows,
        md1_deviation,
        key,
        verified,
        seconds,
    })
}

/// The paper's best alternative per traffic model (§6.1) and its claims near rate 1:
/// (traffic, alternative, mean-latency ratio, CPRR's worst case, the alternative's).
const PAPER_NEAR_ONE: [(&str, &str, f64, u64, u64); 3] = [
    ("uniform", "PIM", 2.0, 375, 1_535),
    ("bursty", "PIM", 1.4, 2_807, 7_992),
    ("nonuniform", "EDRRM", 6.0, 310, 7_212),
];

fn latency_claims(rows: &[LatencyRow], loads: &[f64]) -> Vec<Claim> {
    let top = loads.iter().copied().fold(0.0, f64::max);
    let at = |traffic: &str, arch: &str| {
        rows.iter()
            .find(|r| r.traffic == traffic && r.architecture == arch && r.report.load == top)
    };
    let mut claims = Vec::new();
    for (traffic, paper_best, ratio, cprr_worst, best_worst) in PAPER_NEAR_ONE {
        let Some(cprr) = at(traffic, "CPRR") else {
            continue;
        };
        // The best alternative: the crossbar scheduler with the lowest mean latency.
        let best = rows
            .iter()
            .filter(|r| r.traffic == traffic && r.report.load == top)
            .filter(|r| r.architecture != "CPRR" && r.architecture != "OQ-xbar")
            .min_by(|a, b| a.report.mean_latency.total_cmp(&b.report.mean_latency));
        let Some(best) = best else { continue };
        let c = &cprr.report;
        let b = &best.report;
        claims.push(Claim {
            what: format!("{traffic}, r = {top}: mean latency, best alternative over CPRR"),
            paper: format!("{paper_best}: {ratio}x"),
            measured: format!(
                "{}: {:.1} / {:.1} = {:.1}x",
                best.architecture,
                b.mean_latency,
                c.mean_latency,
                b.mean_latency / c.mean_latency.max(1e-9)
            ),
        });
        claims.push(Claim {
            what: format!("{traffic}, r = {top}: average worst-case latency, cycles"),
            paper: format!("CPRR {cprr_worst}, {paper_best} {best_worst}"),
            measured: format!(
                "CPRR {:.0}, {} {:.0}",
                c.avg_worst_latency, best.architecture, b.avg_worst_latency
            ),
        });
    }
    claims
}

impl FabricLatencyReport {
    /// The rows of one traffic model and architecture, in rate order.
    fn series(&self, traffic: &str, arch: &str, y: impl Fn(&Report) -> f64) -> Series {
        Series {
            name: arch.to_string(),
            points: self
                .rows
                .iter()
                .filter(|r| r.traffic == traffic && r.architecture == arch)
                .map(|r| (r.report.load, y(&r.report)))
                .collect(),
        }
    }

    /// One panel per traffic model of `y` against the input rate, every architecture.
    fn panels(&self, y_label: &str, y_log: bool, y: impl Fn(&Report) -> f64 + Copy) -> Vec<Panel> {
        ["uniform", "bursty", "nonuniform"]
            .iter()
            .zip([
                "(a) uniform Bernoulli",
                "(b) uniform bursty",
                "(c) nonuniform",
            ])
            .map(|(traffic, title)| Panel {
                title: title.to_string(),
                x_label: "input rate r".into(),
                y_label: y_label.into(),
                y_log,
                x_log2: false,
                lines: Architecture::FIGURE_11
                    .iter()
                    .map(|a| architecture_line(*a, self.series(traffic, &a.name(), y)))
                    .collect(),
            })
            .collect()
    }
}

/// A series drawn in its architecture's colour: each scheduler one colour, its
/// one-iteration variant dashed.
fn architecture_line(a: Architecture, series: Series) -> Line {
    let (color, dashed) = match a {
        Architecture::Cprr(OutputArbiter::Simple) => (0, false),
        Architecture::Cprr(OutputArbiter::RoundRobin) => (0, true),
        Architecture::OqXbar => (1, false),
        Architecture::Voq(s, it) => {
            let i = Scheduler::ALL.iter().position(|x| *x == s).unwrap_or(0);
            (2 + i, it == crate::fabric::Iterations::One)
        }
    };
    Line {
        series,
        color,
        dashed,
    }
}

impl Figure for FabricLatencyReport {
    fn name(&self) -> &'static str {
        "fabric-latency"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "traffic",
            "architecture",
            "load",
            "mean_latency",
            "avg_worst_latency",
            "max_latency",
            "throughput",
            "measured",
            "delivered",
            "dropped",
            "md1_eq7",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let p = &r.report;
                vec![
                    r.traffic.to_string(),
                    r.architecture.clone(),
                    p.load.to_string(),
                    format!("{:.4}", p.mean_latency),
                    format!("{:.2}", p.avg_worst_latency),
                    p.max_latency.to_string(),
                    format!("{:.5}", p.throughput),
                    p.measured.to_string(),
                    p.delivered.to_string(),
                    p.dropped.to_string(),
                    format!("{:.4}", md1_wait(p.load)),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), PlotError> {
        let mut panels = self.panels("mean latency (cycles)", true, |r| r.mean_latency);
        panels.extend(
            self.panels("average worst-case latency (cycles)", true, |r| {
                r.avg_worst_latency
            }),
        );
        panels.extend(
            self.panels("carried load (cells / output / cycle)", false, |r| {
                r.throughput
            }),
        );
        // Figure 9: CPRR against equation 7 and the exact output-queue wait.
        let cprr = self.series("uniform", "CPRR", |r| r.mean_latency);
        let ports = self.config.switch.ports;
        let curve = |name: &str, f: &dyn Fn(f64) -> f64| Series {
            name: name.into(),
            points: cprr.points.iter().map(|&(x, _)| (x, f(x))).collect(),
        };
        panels.push(Panel {
            title: "Figure 9: CPRR (uniform) against M/D/1".into(),
            x_label: "input rate r".into(),
            y_label: "mean latency (cycles)".into(),
            y_log: true,
            x_log2: false,
            lines: vec![
                Line {
                    series: cprr.clone(),
                    color: 0,
                    dashed: false,
                },
                Line {
                    series: curve("M/D/1, equation 7", &md1_wait),
                    color: 7,
                    dashed: true,
                },
                Line {
                    series: curve("output queue, (P-1)/P of eq. 7", &|r| {
                        oq_bernoulli_wait(ports, r)
                    }),
                    color: 8,
                    dashed: true,
                },
            ],
        });
        plot::svg_panels(
            path,
            &Panels {
                title: &format!(
                    "Figures 11, 12 and 9: {ports} x {ports} switch, infinite FIFOs (rows: mean \
                     latency, average worst-case latency, carried load)"
                ),
                columns: 3,
                panels,
            },
        )
    }

    fn table(&self) -> String {
        let mut t = String::new();
        for traffic in ["uniform", "bursty", "nonuniform"] {
            t += &format!("{traffic}: mean latency (cycles) by input rate\n");
            t += &format!("{:<10}", "r");
            for a in Architecture::FIGURE_11 {
                t += &format!("{:>10}", a.name());
            }
            t += "\n";
            for &load in &self.config.loads {
                t += &format!("{load:<10}");
                for a in Architecture::FIGURE_11 {
                    let name = a.name();
                    let v = self.rows.iter().find(|r| {
                        r.traffic == traffic && r.architecture == name && r.report.load == load
                    });
                    t += &format!("{:>10.2}", v.map_or(f64::NAN, |r| r.report.mean_latency));
                }
                t += "\n";
            }
            t += "\n";
        }
        t += &format!(
            "Figure 9: CPRR's mean latency is within {:.1}% of the exact output-queue wait, \
             (P - 1)/P of M/D/1's equation 7, up to r = 0.9\n",
            self.md1_deviation * 100.0
        );
        for c in &self.key {
            t += &format!("{}: paper {}; measured {}\n", c.what, c.paper, c.measured);
        }
        t += &format!("{} points in {:.1} s", self.rows.len(), self.seconds);
        t
    }

    fn verified(&self) -> bool {
        self.verified
    }
}

// ----- Figure 13 ---------------------------------------------------------------------------

/// Figure 13: loss against FIFO depth. As command-line options, those of
/// `pfemu experiment fabric-loss`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricLossConfig {
    /// The switch and the traffic.
    #[command(flatten)]
    pub switch: SwitchSettings,
    /// Input rates r to measure.
    #[arg(long, value_name = "R,...", value_delimiter = ',',
          default_value = super::settings::list_text(&FabricLossConfig::default().loads),
          help = "Input rates r to measure, in (0, 1]")]
    pub loads: Vec<f64>,
    /// FIFO depths D to measure.
    #[arg(long, value_name = "D,...", value_delimiter = ',',
          default_value = super::settings::list_text(&FabricLossConfig::default().depths),
          help = "FIFO depths D to measure (each of the P x P FIFOs)")]
    pub depths: Vec<usize>,
    /// The rate "near 1" at which the smallest depth without loss is searched.
    #[arg(long, default_value_t = FabricLossConfig::default().near_one,
          help = "The input rate near 1 at which the smallest depth without loss is searched")]
    pub near_one: f64,
    /// The deepest FIFO the search tries.
    #[arg(long, default_value_t = FabricLossConfig::default().max_depth,
          help = "The deepest FIFO the zero-loss search tries")]
    pub max_depth: usize,
}

impl Default for FabricLossConfig {
    /// r = 0.6 to 0.9 by 0.1, 0.95 and 0.99; D = 1, 2, 4, ..., 256; the search at 0.99 up
    /// to D = 1024; the shared settings' defaults.
    fn default() -> Self {
        FabricLossConfig {
            switch: SwitchSettings::default(),
            loads: vec![0.6, 0.7, 0.8, 0.9, 0.95, 0.99],
            depths: vec![1, 2, 4, 8, 16, 32, 64, 128, 256],
            near_one: 0.99,
            max_depth: 1024,
        }
    }
}

/// The architectures of Figure 13: CPRR and the best alternative per traffic model.
fn loss_architectures(traffic: Traffic) -> [Architecture; 2] {
    let alternative = match traffic {
        Traffic::Nonuniform { .. } => Scheduler::Edrrm,
        _ => Scheduler::Pim,
    };
    [
        Architecture::Cprr(OutputArbiter::Simple),
        Architecture::Voq(alternative, crate::fabric::Iterations::Log2),
    ]
}

/// One architecture under one traffic model at one rate and depth.
#[derive(Clone, Debug, Serialize)]
pub struct LossRow {
    /// `uniform`, `bursty` or `nonuniform`.
    pub traffic: &'static str,
    /// As the paper names it.
    pub architecture: String,
    /// The depth D of each FIFO.
    pub depth: usize,
    /// The run.
    #[serde(flatten)]
    pub report: Report,
}

/// The smallest FIFO depth without loss at the rate near 1.
#[derive(Clone, Debug, Serialize)]
pub struct ZeroLossDepth {
    /// `uniform`, `bursty` or `nonuniform`.
    pub traffic: &'static str,
    /// As the paper names it.
    pub architecture: String,
    /// The rate.
    pub load: f64,
    /// The depth, or `None` when even `max_depth` lost cells.
    pub depth: Option<usize>,
    /// The loss ratio at depth 1.
    pub loss_at_depth_1: f64,
}

/// The report of [`fabric_loss`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricLossReport {
    /// What was run.
    pub config: FabricLossConfig,
    /// One row per traffic model, architecture, rate and depth.
    pub rows: Vec<LossRow>,
    /// Per traffic model and architecture, the smallest depth without loss near rate 1.
    pub zero_loss: Vec<ZeroLossDepth>,
    /// The paper's figures beside these.
    pub key: Vec<Claim>,
    /// Every point conserved its cells.
    pub verified: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Runs Figure 13; `progress` gets (points done, points) of the grid, then of each step of
/// the zero-loss search.
pub fn fabric_loss(
    cfg: &FabricLossConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<FabricLossReport, ExperimentError> {
    let s = &cfg.switch;
    s.check()?;
    check_loads("--loads", &cfg.loads)?;
    check_loads("--near-one", &[cfg.near_one])?;
    if cfg.depths.is_empty() || cfg.depths.contains(&0) {
        return bad("--depths", "give depths of at least 1".into());
    }
    if cfg.max_depth == 0 || cfg.max_depth > 1 << 20 {
        return bad(
            "--max-depth",
            format!("{}: 1 to {}", cfg.max_depth, 1 << 20),
        );
    }
    let start = Instant::now();
    let mut points = Vec::new();
    for traffic in s.traffic() {
        for architecture in loss_architectures(traffic) {
            for &load in &cfg.loads {
                for &d in &cfg.depths {
                    points.push(Point {
                        architecture,
                        traffic,
                        load,
                        depth: Depth::Finite(d),
                    });
                }
            }
        }
    }
    let reports = run_points(s, &points, progress)?;
    let rows: Vec<LossRow> = points
        .iter()
        .zip(reports)
        .map(|(p, report)| LossRow {
            traffic: p.traffic.name(),
            architecture: p.architecture.name(),
            depth: match p.depth {
                Depth::Finite(d) => d,
                Depth::Infinite => usize::MAX,
            },
            report,
        })
        .collect();
    let zero_loss = zero_loss_depths(cfg, progress)?;
    let verified = rows.iter().all(|r| r.report.counters.conserved());
    let key = loss_claims(&zero_loss);
    Ok(FabricLossReport {
        config: cfg.clone(),
        rows,
        zero_loss,
        key,
        verified,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// For each traffic model and architecture of Figure 13, the smallest depth that loses
/// nothing at `near_one`, by bisection (loss falls as the depth grows), all searches
/// stepping together so that each step's points run in parallel.
fn zero_loss_depths(
    cfg: &FabricLossConfig,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<ZeroLossDepth>, ExperimentError> {
    struct Search {
        traffic: Traffic,
        architecture: Architecture,
        /// Deepest depth known to lose, and shallowest known not to (if any).
        lossy: usize,
        clean: Option<usize>,
        loss_at_1: f64,
    }
    let s = &cfg.switch;
    let mut searches: Vec<Search> = Vec::new();
    for traffic in s.traffic() {
        for architecture in loss_architectures(traffic) {
            searches.push(Search {
                traffic,
                architecture,
                lossy: 0,
                clean: None,
                loss_at_1: 0.0,
            });
        }
    }
    let point = |x: &Search, d: usize| Point {
        architecture: x.architecture,
        traffic: x.traffic,
        load: cfg.near_one,
        depth: Depth::Finite(d),
    };
    // Depth 1, then the maximum: a search whose maximum loses has no answer.
    for d in [1, cfg.max_depth] {
        let pts: Vec<Point> = searches.iter().map(|x| point(x, d)).collect();
        for (x, r) in searches.iter_mut().zip(run_points(s, &pts, progress)?) {
            if d == 1 {
                x.loss_at_1 = r.loss_ratio;
            }
            if r.dropped == 0 {
                x.clean = Some(x.clean.map_or(d, |c| c.min(d)));
            } else {
                x.lossy = x.lossy.max(d);
            }
        }
    }
    loop {
        let open: Vec<usize> = (0..searches.len())
            .filter(|&i| matches!(searches[i].clean, Some(c) if c > searches[i].lossy + 1))
            .collect();
        if open.is_empty() {
            break;
        }
        let mid = |x: &Search| (x.lossy + x.clean.unwrap_or(x.lossy)).div_ceil(2);
        let pts: Vec<Point> = open
            .iter()
            .map(|&i| point(&searches[i], mid(&searches[i])))
            .collect();
        for (&i, r) in open.iter().zip(run_points(s, &pts, progress)?) {
            let x = &mut searches[i];
            let d = mid(x);
            if r.dropped == 0 {
                x.clean = Some(d);
            } else {
                x.lossy = d;
            }
        }
    }
    Ok(searches
        .into_iter()
        .map(|x| ZeroLossDepth {
            traffic: x.traffic.name(),
            architecture: x.architecture.name(),
            load: cfg.near_one,
            depth: x.clean,
            loss_at_depth_1: x.loss_at_1,
        })
        .collect())
}

fn loss_claims(zero: &[ZeroLossDepth]) -> Vec<Claim> {
    let find = |traffic: &str, arch: &str| {
        zero.iter()
            .find(|z| z.traffic == traffic && z.architecture == arch)
    };
    let depth = |z: &ZeroLossDepth| {
        z.depth
            .map_or("beyond the search".into(), |d| d.to_string())
    };
    let mut claims = Vec::new();
    if let (Some(c), Some(p)) = (find("uniform", "CPRR"), find("uniform", "PIM")) {
        claims.push(Claim {
            what: format!("uniform, r = {}: smallest FIFO depth without loss", c.load),
            paper: "CPRR 33, PIM 153".into(),
            measured: format!("CPRR {}, PIM {}", depth(c), depth(p)),
        });
        claims.push(Claim {
            what: format!("uniform, r = {}: loss at depth 1", c.load),
            paper: "CPRR 5.2%, PIM 16.1%".into(),
            measured: format!(
                "CPRR {:.1}%, PIM {:.1}%",
                c.loss_at_depth_1 * 100.0,
                p.loss_at_depth_1 * 100.0
            ),
        });
    }
    for (traffic, alt) in [("bursty", "PIM"), ("nonuniform", "EDRRM")] {
        if let (Some(c), Some(a)) = (find(traffic, "CPRR"), find(traffic, alt)) {
            claims.push(Claim {
                what: format!(
                    "{traffic}, r = {}: smallest FIFO depth without loss",
                    c.load
                ),
                paper: format!("CPRR small; {alt} beyond the paper's design space"),
                measured: format!("CPRR {}, {alt} {}", depth(c), depth(a)),
            });
        }
    }
    claims
}

impl Figure for FabricLossReport {
    fn name(&self) -> &'static str {
        "fabric-loss"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "traffic",
            "architecture",
            "load",
            "depth",
            "loss_ratio",
            "measured",
            "dropped",
            "stranded",
            "throughput",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let p = &r.report;
                vec![
                    r.traffic.to_string(),
                    r.architecture.clone(),
                    p.load.to_string(),
                    r.depth.to_string(),
                    format!("{:.6}", p.loss_ratio),
                    p.measured.to_string(),
                    p.dropped.to_string(),
                    p.stranded.to_string(),
                    format!("{:.5}", p.throughput),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), PlotError> {
        let mut panels = Vec::new();
        for traffic in self.config.switch.traffic() {
            for arch in loss_architectures(traffic) {
                let name = arch.name();
                let lines = self
                    .config
                    .loads
                    .iter()
                    .enumerate()
                    .map(|(i, &load)| Line {
                        series: Series {
                            name: format!("r = {load}"),
                            points: self
                                .rows
                                .iter()
                                .filter(|r| {
                                    r.traffic == traffic.name()
                                        && r.architecture == name
                                        && r.report.load == load
                                })
                                .map(|r| (r.depth as f64, r.report.loss_ratio))
                                .collect(),
                        },
                        color: i,
                        dashed: false,
                    })
                    .collect();
                panels.push(Panel {
                    title: format!("{}: {name}", traffic.name()),
                    x_label: "FIFO depth D".into(),
                    y_label: "loss ratio".into(),
                    y_log: true,
                    x_log2: true,
                    lines,
                });
            }
        }
        let p = self.config.switch.ports;
        plot::svg_panels(
            path,
            &Panels {
                title: &format!("Figure 13: loss against FIFO depth, {p} x {p} switch"),
                columns: 2,
                panels,
            },
        )
    }

    fn table(&self) -> String {
        let mut t = String::from("smallest FIFO depth without loss, and loss at depth 1\n");
        for z in &self.zero_loss {
            t += &format!(
                "{:<11} {:<6} r = {}: {:>18}  loss at D = 1: {:.2}%\n",
                z.traffic,
                z.architecture,
                z.load,
                z.depth
                    .map_or(format!("> {}", self.config.max_depth), |d| d.to_string()),
                z.loss_at_depth_1 * 100.0
            );
        }
        for c in &self.key {
            t += &format!("{}: paper {}; measured {}\n", c.what, c.paper, c.measured);
        }
        t += &format!("{} points in {:.1} s", self.rows.len(), self.seconds);
        t
    }

    fn verified(&self) -> bool {
        self.verified
    }
}

// ----- the benchmark -----------------------------------------------------------------------

/// `pfemu bench fabric`: how fast each architecture simulates. As command-line options,
/// those of `pfemu bench fabric`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricBenchConfig {
    /// Ports P.
    #[arg(long, default_value_t = FabricBenchConfig::default().ports, help = "Ports of the switch, P")]
    pub ports: usize,
    /// Input rate r (uniform Bernoulli).
    #[arg(long, default_value_t = FabricBenchConfig::default().load, help = "Input rate r, uniform Bernoulli traffic")]
    pub load: f64,
    /// Measured cycles per architecture.
    #[arg(long, default_value_t = FabricBenchConfig::default().cycles, help = "Cycles per architecture")]
    pub cycles: u64,
}

impl Default for FabricBenchConfig {
    /// 16 ports at r = 0.9, 10^6 cycles.
    fn default() -> Self {
        FabricBenchConfig {
            ports: 16,
            load: 0.9,
            cycles: 1_000_000,
        }
    }
}

/// One architecture's speed.
#[derive(Clone, Debug, Serialize)]
pub struct SpeedRow {
    /// As the paper names it.
    pub architecture: String,
    /// Cycles simulated (window and drain) times ports, per second, on one core.
    pub port_cycles_per_s: f64,
    /// Its speed over the traffic-only loop's.
    pub ratio_to_traffic_only: f64,
}

/// The report of [`fabric_bench`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricBenchReport {
    /// What was run.
    pub config: FabricBenchConfig,
    /// One row per architecture of Figure 11.
    pub rows: Vec<SpeedRow>,
    /// All architectures together: port-cycles per second on one core.
    pub port_cycles_per_s: f64,
    /// A loop that only draws the traffic, the same cycles: port-cycles per second.
    pub traffic_only_port_cycles_per_s: f64,
    /// The time Figure 11's default sweep would take on this machine at these speeds, on
    /// every core (the target: under 2 minutes).
    pub figure_11_estimate_s: f64,
}

/// Runs each architecture for `cycles` cycles on one thread, timing it, and the traffic
/// generator alone, interleaved (traffic, architecture, traffic, ...) so that a slow phase
/// of the machine affects both.
pub fn fabric_bench(cfg: &FabricBenchConfig) -> Result<FabricBenchReport, ExperimentError> {
    FabricConfig::new(Architecture::OqXbar, cfg.ports, Depth::Infinite)
        .validate()
        .map_err(|e| ExperimentError::Option {
            option: "--ports",
            reason: e.reason,
        })?;
    if !(cfg.load > 0.0 && cfg.load <= 1.0) {
        return bad(
            "--load",
            format!("{}: an input rate is in (0, 1]", cfg.load),
        );
    }
    if cfg.cycles == 0 || cfg.cycles > MAX_CYCLES {
        return bad("--cycles", format!("{}: 1 to {MAX_CYCLES}", cfg.cycles));
    }
    let ports = cfg.ports as f64;
    let mut traffic_s = 0.0;
    let mut traffic_cycles = 0u64;
    let mut total_s = 0.0;
    let mut total_cycles = 0u64;
    let mut timed = Vec::new();
    for (i, a) in Architecture::FIGURE_11.iter().enumerate() {
        let t = Instant::now();
        let mut gen = TrafficGen::new(Traffic::Bernoulli, cfg.ports, cfg.load, i as u64)
            .map_err(|e| ExperimentError::Setup(e.to_string()))?;
        let mut cells = Vec::with_capacity(cfg.ports);
        let mut sink = 0u64;
        for _ in 0..cfg.cycles {
            gen.generate(&mut cells);
            sink = sink.wrapping_add(cells.len() as u64);
        }
        std::hint::black_box(sink);
        traffic_s += t.elapsed().as_secs_f64();
        traffic_cycles += cfg.cycles;

        let config = FabricConfig::new(*a, cfg.ports, Depth::Infinite);
        let t = Instant::now();
        let r = simulate(
            &config,
            Traffic::Bernoulli,
            cfg.load,
            0,
            cfg.cycles,
            i as u64,
        )
        .map_err(|e| ExperimentError::Setup(e.to_string()))?;
        let s = t.elapsed().as_secs_f64();
        let cycles = cfg.cycles + r.drain_cycles;
        total_s += s;
        total_cycles += cycles;
        timed.push((a.name(), cycles as f64 * ports / s.max(1e-9)));
    }
    let traffic_only = traffic_cycles as f64 * ports / traffic_s.max(1e-9);
    let rows = timed
        .into_iter()
        .map(|(architecture, speed)| SpeedRow {
            architecture,
            port_cycles_per_s: speed,
            ratio_to_traffic_only: speed / traffic_only,
        })
        .collect();
    let per_core = total_cycles as f64 * ports / total_s.max(1e-9);
    // Figure 11's default: 3 traffic models x 11 rates x 12 architectures, each 1.1 x 10^6
    // cycles of 16 ports (and a drain, not counted here).
    let d = FabricLatencyConfig::default();
    let port_cycles = 3.0
        * d.loads.len() as f64
        * 12.0
        * (d.switch.cycles + d.switch.warmup) as f64
        * d.switch.ports as f64;
    Ok(FabricBenchReport {
        config: cfg.clone(),
        rows,
        port_cycles_per_s: per_core,
        traffic_only_port_cycles_per_s: traffic_only,
        figure_11_estimate_s: port_cycles / per_core / d.switch.threads.max(1) as f64,
    })
}

impl FabricBenchReport {
    /// A readable table.
    pub fn table(&self) -> String {
        let mut t = format!(
            "pfemu bench fabric: {p} x {p}, uniform Bernoulli r = {}, {} cycles each, one core\n",
            self.config.load,
            self.config.cycles,
            p = self.config.ports
        );
        t += &format!("{:<10} {:>18} {:>12}\n", "", "port-cycles/s", "vs traffic");
        for r in &self.rows {
            t += &format!(
                "{:<10} {:>18.3e} {:>11.2}x\n",
                r.architecture, r.port_cycles_per_s, r.ratio_to_traffic_only
            );
        }
        t += &format!(
            "{:<10} {:>18.3e}\nall        {:>18.3e}\n",
            "traffic", self.traffic_only_port_cycles_per_s, self.port_cycles_per_s
        );
        t += &format!(
            "Figure 11's default sweep would take about {:.0} s on this machine's cores",
            self.figure_11_estimate_s
        );
        t
    }
}
