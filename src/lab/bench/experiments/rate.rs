//! What Figures 15 and 16 share: their common options ([`RateJob`]), one point of
//! aggregation latency and rate and its run, and the report's CSV, table and chart
//! ([`RateFigure`], each figure giving only its chart's labels and its table's heading
//! and key line).

use std::path::Path;

use serde::Serialize;

use super::{
    check_ppe, check_timers, check_workers, gradients, mean, percentile, rig, run_timed, us,
    verify_allreduce, worker_config, yes_no, ExperimentError, Figure, RigConfig,
};
use crate::lab::bench::plot::{self, DualChart, Series};
use crate::lab::bench::settings::{ns_as_millis_text, parse_millis_as_ns};
use crate::microcode::trio_ml::host::{HostError, Worker};
use crate::microcode::trio_ml::{DEFAULT_SCAN_PERIOD_NS, DEFAULT_TIMERS};
use crate::packet::Port;
use crate::pfe::default_ppe_threads;

/// The options Figures 15 and 16 share: the job, the straggler scan, the engine and the
/// seed. Flattened into [`super::Fig15Config`] and [`super::Fig16Config`] (and so into
/// `pfemu experiment fig15` and `fig16`), which add the points to measure.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct RateJob {
    /// Workers (`--workers`; the paper: 4).
    #[arg(long, default_value_t = RateJob::default().workers, help = "Workers in the job")]
    pub workers: u8,
    /// Packets each worker sends per point (`--blocks`). Figure 16 has its own default,
    /// and needs at least its largest window.
    #[arg(long, default_value_t = RateJob::default().blocks, help = "Packets each worker sends per point")]
    pub blocks: usize,
    /// Run the straggler-scan timer threads meanwhile (off with `--no-timers`).
    #[arg(long = "no-timers", action = clap::ArgAction::SetFalse,
          conflicts_with_all = ["scan_timers", "scan_period_ns"],
          help = "Do not run the straggler-scan timer threads")]
    pub timers: bool,
    /// Scan timer threads, N (`--timers`).
    #[arg(long = "timers", value_name = "N", default_value_t = RateJob::default().scan_timers,
          help = "Staggered scan timer threads, Trio-ML's N")]
    pub scan_timers: u32,
    /// Scan period (`--scan-period-ms`).
    #[arg(long = "scan-period-ms", value_name = "MS", value_parser = parse_millis_as_ns,
          default_value = ns_as_millis_text(RateJob::default().scan_period_ns),
          help = "Time between two visits of a block by the scan, in ms")]
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    #[arg(long, default_value_t = RateJob::default().ppe_threads, hide_default_value = true,
          help = "PPE threads [default: available cores]")]
    pub ppe_threads: usize,
    /// Seed of the gradients (`--seed`).
    #[arg(long, default_value_t = RateJob::default().seed, help = "Seed of the gradients")]
    pub seed: u64,
}

impl Default for RateJob {
    /// Figure 15's: 4 workers, 5000 packets each per point, timers on (100 every 1 ms),
    /// PPE threads = cores, seed 1.
    fn default() -> Self {
        RateJob {
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

impl RateJob {
    /// Checks the workers, the timers and the PPE threads (the figure checks `blocks`
    /// against its points).
    pub(super) fn check(&self) -> Result<(), ExperimentError> {
        check_workers("--workers", self.workers, 1)?;
        if self.timers {
            check_timers(self.scan_timers, self.scan_period_ns)?;
        }
        check_ppe(self.ppe_threads)
    }

    /// Measures one point per `(grads, window)`, each on a fresh PFE, the i-th with the
    /// gradients of round i. Refuses, before any runs, a point whose workers' vectors
    /// (`--blocks` packets of `grads` gradients each) would not fit in memory.
    pub(super) fn points(
        &self,
        points: impl IntoIterator<Item = (u16, usize)>,
    ) -> Result<Vec<RatePoint>, ExperimentError> {
        let points: Vec<(u16, usize)> = points.into_iter().collect();
        for &(grads, _) in &points {
            let gradients = (self.blocks as u64)
                .saturating_mul(u64::from(grads))
                .saturating_mul(u64::from(self.workers));
            crate::limits::check_fits(
                "--blocks",
                gradients,
                "gradients (over all workers)",
                crate::lab::bench::demo::BYTES_PER_GRADIENT,
            )
            .map_err(|e| ExperimentError::Option {
                option: "--blocks",
                reason: e.reason,
            })?;
        }
        points
            .into_iter()
            .enumerate()
            .map(|(round, (grads, window))| {
                rate_point(RateRun {
                    workers: self.workers,
                    grads,
                    window,
                    blocks: self.blocks,
                    timers: self
                        .timers
                        .then_some((self.scan_timers, self.scan_period_ns)),
                    ppe_threads: self.ppe_threads,
                    seed: self.seed,
                    round: round as u64,
                })
            })
            .collect()
    }

    /// `on` or `off`, for the tables' headings.
    pub(super) fn timers_text(&self) -> &'static str {
        if self.timers {
            "on"
        } else {
            "off"
        }
    }
}

/// One point of Figure 15 or 16: `workers` workers allreduce `blocks` packets of `grads`
/// gradients each with `window` outstanding.
#[derive(Clone, Debug, Serialize)]
pub struct RatePoint {
    /// Gradients per packet.
    pub grads: u16,
    /// Packets outstanding per worker.
    pub window: usize,
    /// Packets each worker sent.
    pub blocks: usize,
    /// Results received over all workers.
    pub results: u64,
    /// Of those, partial ones (`degraded`): a block the straggler scan gave up on because
    /// one of its packets came later than the block timeout (the system clock's: a worker
    /// thread or PPE thread held up that long on a busy machine). Their sums are checked
    /// all the same, against the sources they say they hold; a figure of the machine's
    /// speed, not of the sums.
    pub degraded: u64,
    /// Chunks settled without a Result over all workers: the aggregator answered that
    /// their generation was gone (a retransmission after a later generation of the block
    /// timed out without this worker). Slow-machine figures too; 0 expected.
    pub lost: u64,
    /// Mean time from a packet's first send to its Result, µs.
    pub latency_mean_us: f64,
    /// Median of the same, µs.
    pub latency_p50_us: f64,
    /// 99th percentile of the same, µs.
    pub latency_p99_us: f64,
    /// Gradients aggregated per second, every worker's counted, in millions: all the
    /// workers' gradients over the time from the first send to the last Result.
    pub rate_mgps: f64,
    /// Seconds from the first send to the last Result.
    pub elapsed_s: f64,
    /// Every chunk of every worker was settled (`results + lost` is `workers x blocks`),
    /// and every Result holds exactly the sums of the sources it says it holds: a complete
    /// one every worker's, exactly; a partial one `src_cnt` of them (and `degraded` set
    /// exactly when `src_cnt` is short of all workers). Partial Results and lost chunks
    /// do not fail it; they are counted in [`RatePoint::degraded`] and [`RatePoint::lost`].
    pub verified: bool,
}

/// One run of [`rate_point`]: the job, the window and the engine.
#[derive(Clone, Copy)]
struct RateRun {
    workers: u8,
    grads: u16,
    window: usize,
    blocks: usize,
    timers: Option<(u32, u64)>,
    ppe_threads: usize,
    seed: u64,
    round: u64,
}

fn rate_point(c: RateRun) -> Result<RatePoint, ExperimentError> {
    let r = rig(RigConfig {
        workers: c.workers,
        window: c.window,
        grads: c.grads,
        // Long enough that no block of a queue of full windows ages out.
        // (block_age is 8 bits: at most 255 scan periods).
        block_exp_ms: c.timers.map_or(250, |(_, scan)| {
            (255 * scan / 1_000_000).clamp(1, 250) as u8
        }),
        timers: c.timers,
        ppe_threads: c.ppe_threads,
        clock: None,
    })?;
    let n = c.blocks * usize::from(c.grads);
    let srcs: Vec<u8> = (0..c.workers).collect();
    let workers = srcs
        .iter()
        .map(|&s| {
            Ok((
                Worker::new(
                    worker_config(s, c.grads, c.window, 0),
                    gradients(c.seed, s, c.round, n),
                )?,
                Port::from(s),
            ))
        })
        .collect::<Result<Vec<_>, HostError>>()?;
    let timed = run_timed(&r, workers)?;
    r.pfe.shutdown();
    let mut lat = Vec::new();
    let mut verified = true;
    let (mut results, mut degraded, mut lost) = (0, 0, 0);
    for w in &timed {
        lat.extend_from_slice(w.worker.latencies_ns());
        let stats = w.worker.stats();
        results += stats.results;
        degraded += stats.degraded;
        lost += stats.lost;
        verified &= verify_allreduce(&w.worker, c.seed, c.workers, c.round);
    }
    verified &= results + lost == (c.blocks * usize::from(c.workers)) as u64;
    lat.sort_unstable();
    let first = timed
        .iter()
        .flat_map(|w| w.sent_ns.iter())
        .copied()
        .min()
        .unwrap_or(0);
    let last = timed
        .iter()
        .flat_map(|w| w.arrived_ns.iter())
        .copied()
        .max()
        .unwrap_or(0);
    let elapsed = (last.saturating_sub(first)).max(1) as f64 / 1e9;
    let gradients = (n * usize::from(c.workers)) as f64;
    Ok(RatePoint {
        grads: c.grads,
        window: c.window,
        blocks: c.blocks,
        results,
        degraded,
        lost,
        latency_mean_us: us(mean(&lat)),
        latency_p50_us: us(percentile(&lat, 0.5) as f64),
        latency_p99_us: us(percentile(&lat, 0.99) as f64),
        rate_mgps: gradients / elapsed / 1e6,
        elapsed_s: elapsed,
        verified,
    })
}

const RATE_HEADER: [&str; 12] = [
    "grads",
    "window",
    "blocks",
    "results",
    "degraded",
    "lost",
    "latency_mean_us",
    "latency_p50_us",
    "latency_p99_us",
    "rate_mgps",
    "elapsed_s",
    "verified",
];

fn rate_rows(points: &[RatePoint]) -> Vec<Vec<String>> {
    points
        .iter()
        .map(|p| {
            vec![
                p.grads.to_string(),
                p.window.to_string(),
                p.blocks.to_string(),
                p.results.to_string(),
                p.degraded.to_string(),
                p.lost.to_string(),
                format!("{:.2}", p.latency_mean_us),
                format!("{:.2}", p.latency_p50_us),
                format!("{:.2}", p.latency_p99_us),
                format!("{:.3}", p.rate_mgps),
                format!("{:.4}", p.elapsed_s),
                p.verified.to_string(),
            ]
        })
        .collect()
}

fn rate_table(points: &[RatePoint], x_name: &str, x: &dyn Fn(&RatePoint) -> String) -> String {
    let mut s = format!(
        "{:>10} {:>8} {:>9} {:>12} {:>11} {:>11} {:>14} {:>9}\n",
        x_name,
        "results",
        "degraded",
        "latency µs",
        "p50 µs",
        "p99 µs",
        "M gradients/s",
        "verified"
    );
    for p in points {
        s += &format!(
            "{:>10} {:>8} {:>9} {:>12.1} {:>11.1} {:>11.1} {:>14.2} {:>9}\n",
            x(p),
            p.results,
            p.degraded,
            p.latency_mean_us,
            p.latency_p50_us,
            p.latency_p99_us,
            p.rate_mgps,
            yes_no(p.verified)
        );
    }
    s
}

/// The key line's note on Results the straggler scan gave up on: empty when there were
/// none, else how many were partial or lost, and why that does not fail the check.
pub(super) fn partial_note(points: &[RatePoint]) -> String {
    let (degraded, lost) = points
        .iter()
        .fold((0, 0), |(d, l), p| (d + p.degraded, l + p.lost));
    if degraded + lost == 0 {
        return String::new();
    }
    format!(
        " ({degraded} partial Results and {lost} lost chunks: blocks that outlived the \
         block timeout on this machine's clock; their sums were checked against the sources \
         they hold)"
    )
}

/// What Figure 15 or 16 measures its points against, and how it names it.
pub(super) struct RateChart {
    /// The experiment's name, also the stem of its files.
    pub(super) name: &'static str,
    /// Title above the plot.
    pub(super) title: &'static str,
    /// X axis label.
    pub(super) x_label: &'static str,
    /// The x column's heading in the table.
    pub(super) x_column: &'static str,
    /// Space the x axis by powers of two.
    pub(super) x_log2: bool,
    /// A point's x (a whole number, so the table prints it without decimals).
    pub(super) x: fn(&RatePoint) -> f64,
    /// Right (rate) axis label.
    pub(super) rate_label: &'static str,
    /// The rate's name in the legend.
    pub(super) rate_series: &'static str,
}

/// Figure 15 or 16's report: what it adds to the [`Figure`] the two share, whose CSV has a
/// row per point, whose chart draws latency and rate against the points' x, and whose
/// table has a line per point between the report's heading and its key line.
pub(super) trait RateFigure: Serialize {
    /// The figure's name and chart.
    const CHART: RateChart;
    /// The points measured.
    fn points(&self) -> &[RatePoint];
    /// The table's first line: what was run.
    fn heading(&self) -> String;
    /// The table's last line: the key figure and the check.
    fn key(&self) -> String;
}

impl<T: RateFigure> Figure for T {
    fn name(&self) -> &'static str {
        T::CHART.name
    }

    fn csv_header(&self) -> Vec<&'static str> {
        RATE_HEADER.to_vec()
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        rate_rows(self.points())
    }

    fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError> {
        draw_rate(path, self.points(), &T::CHART)
    }

    fn table(&self) -> String {
        let chart = T::CHART;
        let mut s = self.heading();
        s += &rate_table(self.points(), chart.x_column, &|p| (chart.x)(p).to_string());
        s += &self.key();
        s
    }

    fn verified(&self) -> bool {
        self.points().iter().all(|p| p.verified)
    }
}

/// Draws `points` at `path` as `chart` says: mean and p99 latency on the left axis, the
/// rate on the right.
fn draw_rate(
    path: &Path,
    points: &[RatePoint],
    chart: &RateChart,
) -> Result<(), crate::lab::bench::PlotError> {
    let line = |name: &str, f: fn(&RatePoint) -> f64| Series {
        name: name.into(),
        points: points.iter().map(|r| ((chart.x)(r), f(r))).collect(),
    };
    plot::svg_dual(
        path,
        &DualChart {
            title: chart.title,
            x_label: chart.x_label,
            left_label: "aggregation latency (µs)",
            right_label: chart.rate_label,
            x_log2: chart.x_log2,
            left_log10: false,
            left: vec![
                line("latency, mean (µs)", |r| r.latency_mean_us),
                line("latency, p99 (µs)", |r| r.latency_p99_us),
            ],
            right: vec![line(chart.rate_series, |r| r.rate_mgps)],
        },
    )
}
