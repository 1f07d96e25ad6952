//! Figure 15: aggregation latency and rate against gradients per packet, window 1.

use std::path::Path;

use serde::Serialize;

use super::rate::{check_rate_common, rate_point, rate_rows, rate_table, RateRun, RATE_HEADER};
use super::{bad, check_grads, yes_no, ExperimentError, Figure, RatePoint};
use crate::lab::bench::plot::{self, DualChart, Series};
use crate::microcode::trio_ml::{DEFAULT_SCAN_PERIOD_NS, DEFAULT_TIMERS};
use crate::pfe::default_ppe_threads;

/// Figure 15: aggregation latency and rate against gradients per packet, window 1.
/// As command-line options, those of `pfemu experiment fig15` (defaults from
/// [`Fig15Config::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct Fig15Config {
    /// Gradients per packet to measure (`--sizes`; the paper: 64 to 1024).
    #[arg(long = "sizes", value_name = "N,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&Fig15Config::default().sizes), help = "Gradients per packet to measure")]
    pub sizes: Vec<u16>,
    /// Workers (`--workers`; the paper: 4).
    #[arg(long, default_value_t = Fig15Config::default().workers, help = "Workers in the job")]
    pub workers: u8,
    /// Packets each worker sends per size, one at a time (`--blocks`).
    #[arg(long, default_value_t = Fig15Config::default().blocks, help = "Packets each worker sends per point")]
    pub blocks: usize,
    /// Run the straggler-scan timer threads meanwhile (off with `--no-timers`).
    #[arg(long = "no-timers", action = clap::ArgAction::SetFalse,
          conflicts_with_all = ["scan_timers", "scan_period_ns"],
          help = "Do not run the straggler-scan timer threads")]
    pub timers: bool,
    /// Scan timer threads, N (`--timers`).
    #[arg(long = "timers", value_name = "N", default_value_t = Fig15Config::default().scan_timers,
          help = "Staggered scan timer threads, Trio-ML's N")]
    pub scan_timers: u32,
    /// Scan period (`--scan-period-ms`).
    #[arg(long = "scan-period-ms", value_name = "MS", value_parser = crate::lab::bench::settings::parse_millis_as_ns,
          default_value = crate::lab::bench::settings::ns_as_millis_text(Fig15Config::default().scan_period_ns),
          help = "Time between two visits of a block by the scan, in ms")]
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    #[arg(long, default_value_t = Fig15Config::default().ppe_threads, hide_default_value = true,
          help = "PPE threads [default: available cores]")]
    pub ppe_threads: usize,
    /// Seed of the gradients (`--seed`).
    #[arg(long, default_value_t = Fig15Config::default().seed, help = "Seed of the gradients")]
    pub seed: u64,
}

impl Default for Fig15Config {
    /// Sizes 64 to 1024, 4 workers, 5000 packets each per size, timers on (100 every
    /// 1 ms), PPE threads = cores.
    fn default() -> Self {
        Fig15Config {
            sizes: vec![64, 128, 256, 512, 1024],
            workers: 4,
            blocks: 5000,
            timers: true,
            scan_timers: DEFAULT_TIMERS,
            scan_period_ns: DEFAULT_SCAN_PERIOD_NS,
            ppe_threads: default_ppe_threads(),
            seed: 1,
        }
    }
}

/// Figure 15's report.
#[derive(Clone, Debug, Serialize)]
pub struct Fig15Report {
    /// What was run.
    pub config: Fig15Config,
    /// One point per size.
    pub rows: Vec<RatePoint>,
    /// Latency at the largest size over latency at the smallest (the paper: 200 µs /
    /// 30 µs = 6.6x for 16x the gradients).
    pub latency_ratio: f64,
    /// Every Result arrived with the right sums.
    pub verified: bool,
}

/// Runs Figure 15: per size, a fresh PFE; every worker streams `blocks` packets with a
/// window of 1 (each waits for its Result before sending the next).
pub fn fig15(cfg: &Fig15Config) -> Result<Fig15Report, ExperimentError> {
    if cfg.sizes.is_empty() {
        return bad("--sizes", "no sizes given");
    }
    for &g in &cfg.sizes {
        check_grads("--sizes", g)?;
    }
    if !(1..=1_000_000).contains(&cfg.blocks) {
        return bad("--blocks", format!("{}; accepted 1..=1000000", cfg.blocks));
    }
    check_rate_common(
        cfg.workers,
        cfg.timers,
        cfg.scan_timers,
        cfg.scan_period_ns,
        cfg.ppe_threads,
    )?;
    let mut rows = Vec::new();
    for (round, &g) in cfg.sizes.iter().enumerate() {
        rows.push(rate_point(RateRun {
            workers: cfg.workers,
            grads: g,
            window: 1,
            blocks: cfg.blocks,
            timers: cfg.timers.then_some((cfg.scan_timers, cfg.scan_period_ns)),
            ppe_threads: cfg.ppe_threads,
            seed: cfg.seed,
            round: round as u64,
        })?);
    }
    let latency_at = |p: Option<&RatePoint>| p.map_or(0.0, |p| p.latency_mean_us);
    let small = latency_at(rows.iter().min_by_key(|p| p.grads));
    let large = latency_at(rows.iter().max_by_key(|p| p.grads));
    Ok(Fig15Report {
        latency_ratio: if small > 0.0 { large / small } else { 0.0 },
        verified: rows.iter().all(|r| r.verified),
        config: cfg.clone(),
        rows,
    })
}

impl Figure for Fig15Report {
    fn name(&self) -> &'static str {
        "fig15"
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
            points: self
                .rows
                .iter()
                .map(|r| (f64::from(r.grads), f(r)))
                .collect(),
        };
        plot::svg_dual(
            path,
            &DualChart {
                title: "Fig. 15: aggregation latency and rate (window 1)",
                x_label: "gradients per packet",
                left_label: "aggregation latency (µs)",
                right_label: "aggregation rate (M gradients/s)",
                x_log2: false,
                left_log10: false,
                left: vec![
                    line("latency, mean (µs)", &|r| r.latency_mean_us),
                    line("latency, p99 (µs)", &|r| r.latency_p99_us),
                ],
                right: vec![line("rate (M gradients/s)", &|r| r.rate_mgps)],
            },
        )
    }

    fn table(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "fig15: aggregation latency and rate vs gradients per packet ({} workers, window \
             1, {} packets each per size, timers {})\n",
            c.workers,
            c.blocks,
            if c.timers { "on" } else { "off" }
        );
        s += &rate_table(&self.rows, "grads/pkt", &|p| p.grads.to_string());
        s += &format!(
            "key: latency at the largest size is {:.1}x the smallest (the paper: 6.6x from 64 \
             to 1024); sums verified: {}\n",
            self.latency_ratio,
            yes_no(self.verified)
        );
        s
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
