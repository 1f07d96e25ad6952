//! Figure 16: aggregation latency and throughput against the window.

use serde::Serialize;

use super::rate::{partial_note, RateChart, RateFigure, RateJob};
use super::{bad, check_grads, yes_no, ExperimentError, RatePoint, MAX_WINDOW};
use crate::lab::bench::settings::list_text;

/// Figure 16: aggregation latency and throughput against the window.
/// As command-line options, those of `pfemu experiment fig16` (defaults from
/// [`Fig16Config::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
// `--blocks` shows this figure's default, not the shared one of `RateJob`.
#[command(mut_arg("blocks", |a| a.default_value(list_text(&[Fig16Config::default().job.blocks]))))]
pub struct Fig16Config {
    /// Windows to measure (`--windows`; 1 to 2047).
    #[arg(long = "windows", value_name = "N,...", value_delimiter = ',',
          default_value = list_text(&Fig16Config::default().windows), help = "Windows to measure (1..=2047)")]
    pub windows: Vec<usize>,
    /// Gradients per packet (`--grads`; the paper: 512 and 1024).
    #[arg(long, default_value_t = Fig16Config::default().grads, help = "Gradients per packet")]
    pub grads: u16,
    /// The workers, the packets each sends per window (at least the largest window), the
    /// timers, the engine and the seed.
    #[serde(flatten)]
    #[command(flatten)]
    pub job: RateJob,
}

impl Default for Fig16Config {
    /// Windows 1, 4, 16, 64, 256 and 1024; 1024 gradients per packet; and
    /// [`RateJob::default`] but 2048 packets each per window: 4 workers, timers on (100
    /// every 1 ms), PPE threads = cores.
    fn default() -> Self {
        Fig16Config {
            windows: vec![1, 4, 16, 64, 256, 1024],
            grads: 1024,
            job: RateJob {
                blocks: 2048,
                ..RateJob::default()
            },
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
    /// Every point verified ([`RatePoint::verified`]): every chunk settled, every Result
    /// with exactly the sums of the sources it says it holds.
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
    if cfg.job.blocks < max_window || cfg.job.blocks > 1_000_000 {
        return bad(
            "--blocks",
            format!(
                "{}; accepted {max_window}..=1000000 (at least the largest window)",
                cfg.job.blocks
            ),
        );
    }
    cfg.job.check()?;
    let rows = cfg
        .job
        .points(cfg.windows.iter().map(|&w| (cfg.grads, w)))?;
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

impl RateFigure for Fig16Report {
    const CHART: RateChart = RateChart {
        name: "fig16",
        title: "Fig. 16: latency and throughput vs window",
        x_label: "window (packets outstanding per worker)",
        x_column: "window",
        x_log2: true,
        x: |p| p.window as f64,
        rate_label: "throughput (M gradients/s)",
        rate_series: "throughput (M gradients/s)",
    };

    fn points(&self) -> &[RatePoint] {
        &self.rows
    }

    fn heading(&self) -> String {
        let c = &self.config;
        format!(
            "fig16: latency and throughput vs window ({} workers, {} gradients per packet, \
             {} packets each per window, timers {})\n",
            c.job.workers,
            c.grads,
            c.job.blocks,
            c.job.timers_text()
        )
    }

    fn key(&self) -> String {
        format!(
            "key: best throughput {:.1} M gradients/s at window {}; sums verified: {}{}\n",
            self.best_rate_mgps,
            self.best_window,
            yes_no(self.verified),
            partial_note(&self.rows)
        )
    }
}
