//! Figure 16: aggregation latency and throughput against the window.

use std::path::Path;

use serde::Serialize;

use super::rate::{check_rate_common, rate_point, rate_rows, rate_table, RateRun, RATE_HEADER};
use super::{bad, check_grads, yes_no, ExperimentError, Figure, RatePoint, MAX_WINDOW};
use crate::lab::bench::plot::{self, DualChart, Series};
use crate::microcode::trio_ml::{DEFAULT_SCAN_PERIOD_NS, DEFAULT_TIMERS};
use crate::pfe::default_ppe_threads;

/// Figure 16: aggregation latency and throughput against the window.
/// As command-line options, those of `pfemu experiment fig16` (defaults from
/// [`Fig16Config::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct Fig16Config {
    /// Windows to measure (`--windows`; 1 to 2047).
    #[arg(long = "windows", value_name = "N,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&Fig16Config::default().windows), help = "Windows to measure (1..=2047)")]
    pub windows: Vec<usize>,
    /// Gradients per packet (`--grads`; the paper: 512 and 1024).
    #[arg(long, default_value_t = Fig16Config::default().grads, help = "Gradients per packet")]
    pub grads: u16,
    /// Workers (`--workers`; the paper: 4).
    #[arg(long, default_value_t = Fig16Config::default().workers, help = "Workers in the job")]
    pub workers: u8,
    /// Packets each worker sends per window (`--blocks`; at least the largest window).
    #[arg(long, default_value_t = Fig16Config::default().blocks, help = "Packets each worker sends per point")]
    pub blocks: usize,
    /// Run the straggler-scan timer threads meanwhile (off with `--no-timers`).
    #[arg(long = "no-timers", action = clap::ArgAction::SetFalse,
          conflicts_with_all = ["scan_timers", "scan_period_ns"],
          help = "Do not run the straggler-scan timer threads")]
    pub timers: bool,
    /// Scan timer threads, N (`--timers`).
    #[arg(long = "timers", value_name = "N", default_value_t = Fig16Config::default().scan_timers,
          help = "Staggered scan timer threads, Trio-ML's N")]
    pub scan_timers: u32,
    /// Scan period (`--scan-period-ms`).
    #[arg(long = "scan-period-ms", value_name = "MS", value_parser = crate::lab::bench::settings::parse_millis_as_ns,
          default_value = crate::lab::bench::settings::ns_as_millis_text(Fig16Config::default().scan_period_ns),
          help = "Time between two visits of a block by the scan, in ms")]
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    #[arg(long, default_value_t = Fig16Config::default().ppe_threads, hide_default_value = true,
          help = "PPE threads [default: available cores]")]
    pub ppe_threads: usize,
    /// Seed of the gradients (`--seed`).
    #[arg(long, default_value_t = Fig16Config::default().seed, help = "Seed of the gradients")]
    pub seed: u64,
}

impl Default for Fig16Config {
    /// Windows 1, 4, 16, 64, 256 and 1024; 1024 gradients per packet; 4 workers sending
    /// 2048 packets each per window; timers on (100 every 1 ms); PPE threads = cores.
    fn default() -> Self {
        Fig16Config {
            windows: vec![1, 4, 16, 64, 256, 1024],
            grads: 1024,
            workers: 4,
            blocks: 2048,
            timers: true,
            scan_timers: DEFAULT_TIMERS,
            scan_period_ns: DEFAULT_SCAN_PERIOD_NS,
            ppe_threads: default_ppe_threads(),
            seed: 1,
        }
    }
}

/// Figure 16's report.
#[derive(Clone, Debug, Serialize)]
pub struct Fig16Report {
    /// What was run.
    pub config: Fig16Config,
    /// One point per window.
    pub rows: Vec<RatePoint>,
    /// The window with the highest throughput.
    pub best_window: usize,
    /// Its throughput, M gradients/s.
    pub best_rate_mgps: f64,
    /// Every Result arrived with the right sums.
    pub verified: bool,
}

/// Runs Figure 16: per window, a fresh PFE; every worker streams `blocks` packets of
/// `grads` gradients with `window` outstanding.
pub fn fig16(cfg: &Fig16Config) -> Result<Fig16Report, ExperimentError> {
    if cfg.windows.is_empty() {
        return bad("--windows", "no windows given");
    }
    for &w in &cfg.windows {
        if !(1..=MAX_WINDOW).contains(&w) {
            return bad(
                "--windows",
                format!(
                    "{w}; accepted 1..={MAX_WINDOW} (a job holds 2 x window slots, at most \
                     4095)"
                ),
            );
        }
    }
    check_grads("--grads", cfg.grads)?;
    let max_window = cfg.windows.iter().copied().max().unwrap_or(1);
    if cfg.blocks < max_window || cfg.blocks > 1_000_000 {
        return bad(
            "--blocks",
            format!(
                "{}; accepted {max_window}..=1000000 (at least the largest window)",
                cfg.blocks
            ),
        );
    }
    check_rate_common(
        cfg.workers,
        cfg.timers,
        cfg.scan_timers,
        cfg.scan_period_ns,
        cfg.ppe_threads,
    )?;
    let mut rows = Vec::new();
    for (round, &w) in cfg.windows.iter().enumerate() {
        rows.push(rate_point(RateRun {
            workers: cfg.workers,
            grads: cfg.grads,
            window: w,
            blocks: cfg.blocks,
            timers: cfg.timers.then_some((cfg.scan_timers, cfg.scan_period_ns)),
            ppe_threads: cfg.ppe_threads,
            seed: cfg.seed,
            round: round as u64,
        })?);
    }
    let best = rows
        .iter()
        .max_by(|a, b| a.rate_mgps.total_cmp(&b.rate_mgps))
        .map_or((0, 0.0), |p| (p.window, p.rate_mgps));
    Ok(Fig16Report {
        best_window: best.0,
        best_rate_mgps: best.1,
        verified: rows.iter().all(|r| r.verified),
        config: cfg.clone(),
        rows,
    })
}

impl Figure for Fig16Report {
    fn name(&self) -> &'static str {
        "fig16"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        RATE_HEADER.to_vec()
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        rate_rows(&self.rows)
    }

    fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError> {
        let line = |name: &str, f: &dyn Fn(&RatePoint) -> f64| Series {
            name: name.into(),
            points: self.rows.iter().map(|r| (r.window as f64, f(r))).collect(),
        };
        plot::svg_dual(
            path,
            &DualChart {
                title: "Fig. 16: latency and throughput vs window",
                x_label: "window (packets outstanding per worker)",
                left_label: "aggregation latency (µs)",
                right_label: "throughput (M gradients/s)",
                x_log2: true,
                left_log10: false,
                left: vec![
                    line("latency, mean (µs)", &|r| r.latency_mean_us),
                    line("latency, p99 (µs)", &|r| r.latency_p99_us),
                ],
                right: vec![line("throughput (M gradients/s)", &|r| r.rate_mgps)],
            },
        )
    }

    fn table(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "fig16: latency and throughput vs window ({} workers, {} gradients per packet, \
             {} packets each per window, timers {})\n",
            c.workers,
            c.grads,
            c.blocks,
            if c.timers { "on" } else { "off" }
        );
        s += &rate_table(&self.rows, "window", &|p| p.window.to_string());
        s += &format!(
            "key: best throughput {:.1} M gradients/s at window {}; sums verified: {}\n",
            self.best_rate_mgps,
            self.best_window,
            yes_no(self.verified)
        );
        s
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
