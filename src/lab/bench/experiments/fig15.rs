//! Figure 15: aggregation latency and rate against gradients per packet, window 1.

use serde::Serialize;

use super::rate::{partial_note, RateChart, RateFigure, RateJob};
use super::{bad, check_grads, yes_no, ExperimentError, RatePoint};

/// Figure 15: aggregation latency and rate against gradients per packet, window 1.
/// As command-line options, those of `pfemu experiment fig15` (defaults from
/// [`Fig15Config::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct Fig15Config {
    /// Gradients per packet to measure (`--sizes`; the paper: 64 to 1024).
    #[arg(long = "sizes", value_name = "N,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&Fig15Config::default().sizes), help = "Gradients per packet to measure")]
    pub sizes: Vec<u16>,
    /// The workers, the packets each sends per size (one at a time), the timers, the
    /// engine and the seed.
    #[serde(flatten)]
    #[command(flatten)]
    pub job: RateJob,
}

impl Default for Fig15Config {
    /// Sizes 64 to 1024, and [`RateJob::default`]: 4 workers, 5000 packets each per
    /// size, timers on (100 every 1 ms), PPE threads = cores.
    fn default() -> Self {
        Fig15Config {
            sizes: vec![64, 128, 256, 512, 1024],
            job: RateJob::default(),
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
    /// Every point verified ([`RatePoint::verified`]): every chunk settled, every Result
    /// with exactly the sums of the sources it says it holds.
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
    if !(1..=1_000_000).contains(&cfg.job.blocks) {
        return bad(
            "--blocks",
            format!("{}; accepted 1..=1000000", cfg.job.blocks),
        );
    }
    cfg.job.check()?;
    let rows = cfg.job.points(cfg.sizes.iter().map(|&g| (g, 1)))?;
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

impl RateFigure for Fig15Report {
    const CHART: RateChart = RateChart {
        name: "fig15",
        title: "Fig. 15: aggregation latency and rate (window 1)",
        x_label: "gradients per packet",
        x_column: "grads/pkt",
        x_log2: false,
        x: |p| f64::from(p.grads),
        rate_label: "aggregation rate (M gradients/s)",
        rate_series: "rate (M gradients/s)",
    };

    fn points(&self) -> &[RatePoint] {
        &self.rows
    }

    fn heading(&self) -> String {
        let c = &self.config;
        format!(
            "fig15: aggregation latency and rate vs gradients per packet ({} workers, window \
             1, {} packets each per size, timers {})\n",
            c.job.workers,
            c.job.blocks,
            c.job.timers_text()
        )
    }

    fn key(&self) -> String {
        format!(
            "key: latency at the largest size is {:.1}x the smallest (the paper: 6.6x from 64 \
             to 1024); sums verified: {}{}\n",
            self.latency_ratio,
            yes_no(self.verified),
            partial_note(&self.rows)
        )
    }
}
