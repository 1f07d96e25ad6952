//! Figure 14: time to a partial result against the straggler timeout.

use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::{
    bad, check_grads, check_ppe, check_timeout, check_timers, check_workers, gradients, mean, ms,
    percentile, rig, run_timed, run_virtual, sums_of, worker_config, yes_no, ExperimentError,
    Figure, RigConfig, MAX_WINDOW,
};
use crate::lab::bench::plot::{self, Chart, Series};
use crate::microcode::trio_ml::host::{HostError, Worker};
use crate::microcode::trio_ml::DEFAULT_TIMERS;
use crate::packet::Port;
use crate::pfe::default_ppe_threads;
use crate::timer::ManualClock;

/// Figure 14: how long non-straggling workers wait for a partial result, by timeout.
/// As command-line options, those of `pfemu experiment fig14` (defaults from
/// [`Fig14Config::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct Fig14Config {
    /// Block timeouts to measure, in ms (`--timeouts`; the paper: 2 to 50 ms).
    #[arg(long = "timeouts", value_name = "MS,...", value_delimiter = ',',
          default_value = crate::lab::bench::settings::list_text(&Fig14Config::default().timeouts_ms), help = "Block timeouts T in ms")]
    pub timeouts_ms: Vec<u8>,
    /// Workers in the job; the last never sends (`--workers`, at least 2).
    #[arg(long, default_value_t = Fig14Config::default().workers, help = "Workers in the job; the last never sends (at least 2)")]
    pub workers: u8,
    /// Blocks each sending worker sends back to back, all outstanding at once (the window)
    /// (`--blocks`; the paper: 20).
    #[arg(long, default_value_t = Fig14Config::default().blocks, help = "Blocks each sending worker sends back to back")]
    pub blocks: usize,
    /// Gradients per packet (`--grads`).
    #[arg(long, default_value_t = Fig14Config::default().grads, help = "Gradients per packet")]
    pub grads: u16,
    /// Staggered scan timer threads, Trio-ML's N (`--timers`).
    #[arg(long, default_value_t = Fig14Config::default().timers, help = "Staggered scan timer threads, Trio-ML's N")]
    pub timers: u32,
    /// Time between two visits of a block by the scan (`--scan-period-ms`).
    #[arg(long = "scan-period-ms", value_name = "MS", value_parser = crate::lab::bench::settings::parse_millis_as_ns,
          default_value = crate::lab::bench::settings::ns_as_millis_text(Fig14Config::default().scan_period_ns),
          help = "Time between two visits of a block by the scan, in ms")]
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    #[arg(long, default_value_t = Fig14Config::default().ppe_threads, hide_default_value = true,
          help = "PPE threads [default: available cores]")]
    pub ppe_threads: usize,
    /// Seed of the gradient values (`--seed`).
    #[arg(long, default_value_t = Fig14Config::default().seed, help = "Seed of the gradients")]
    pub seed: u64,
    /// Run on a virtual clock the experiment moves itself, in steps of one timer's
    /// stagger (`scan period / N`), instead of the system's (`--virtual-time`): the
    /// senders' packets all go in at time 0 and the times measured are the timer logic's
    /// alone, the same on any machine however loaded (the engine's own latency reads as
    /// 0). On the system clock a sender held up past the timeout by a busy machine misses
    /// its block, and the row does not verify.
    #[arg(
        long = "virtual-time",
        help = "Run on a virtual clock moved by the experiment: the same times on any machine \
                (the timer logic's alone, without the engine's own latency)"
    )]
    pub virtual_time: bool,
}

/// With `--virtual-time`, a round gives up when the virtual clock passes this many times
/// the timeout plus one scan period (when every partial Result is due) with a Result
/// missing.
const VIRTUAL_LIMIT_FACTOR: u64 = 4;

/// The slack Figure 14's bound allows past `(1 + 1/N) T`: 1 ms.
pub const FIG14_SLACK_NS: u64 = 1_000_000;

/// Figure 14's default scan period, 0.5 ms: a block ages out at most one scan period after
/// its timeout, which leaves the other half of [`FIG14_SLACK_NS`] to the scan's launch,
/// the partial Result's way back and the worker. (With Trio-ML's default of 1 ms the
/// detection alone can use all of the slack, and the worst case overshoots.)
pub const FIG14_SCAN_PERIOD_NS: u64 = 500_000;

impl Default for Fig14Config {
    /// Timeouts 2, 5, 10, 20 and 50 ms; 4 workers (3 send); 20 blocks of 256 gradients;
    /// 100 timers scanning every 0.5 ms ([`FIG14_SCAN_PERIOD_NS`]); PPE threads = cores; the
    /// system clock.
    fn default() -> Self {
        Fig14Config {
            timeouts_ms: vec![2, 5, 10, 20, 50],
            workers: 4,
            blocks: 20,
            grads: 256,
            timers: DEFAULT_TIMERS,
            scan_period_ns: FIG14_SCAN_PERIOD_NS,
            ppe_threads: default_ppe_threads(),
            seed: 1,
            virtual_time: false,
        }
    }
}

/// One timeout's measurements.
#[derive(Clone, Debug, Serialize)]
pub struct Fig14Row {
    /// The block timeout (`block_exp`), ms.
    pub timeout_ms: u8,
    /// Samples: one per block and sending worker (the time from the last of the block's
    /// packets being sent to the partial Result arriving at that worker).
    pub samples: usize,
    /// Median, ms.
    pub p50_ms: f64,
    /// Mean, ms.
    pub mean_ms: f64,
    /// Smallest, ms.
    pub min_ms: f64,
    /// Largest, ms.
    pub max_ms: f64,
    /// The bound `(1 + 1/N) * T + 1 ms` ([`FIG14_SLACK_NS`]), ms. A block ages between T and
    /// T + one scan period after its last packet; the rest is the way back.
    pub bound_ms: f64,
    /// The paper's result: workers recover within 2x the timeout, ms.
    pub paper_2x_ms: f64,
    /// The median is within the bound.
    pub p50_within: bool,
    /// The largest is within the bound.
    pub max_within: bool,
    /// Results the sending workers received.
    pub results: u64,
    /// Of those, partial ones (`degraded`) summing the senders only (`src_cnt = workers - 1`).
    pub partial_results: u64,
    /// Scan launches skipped because the timer's previous thread had not finished (no
    /// PPE thread was free for it within a scan period): each delays aging in its slice.
    pub timer_overruns: u64,
    /// Scan periods skipped because the launcher woke up a period or more late (a busy
    /// machine): each delays aging everywhere.
    pub timer_missed: u64,
    /// Every Result arrived, partial, with the senders' exact sums.
    pub verified: bool,
}

/// Figure 14's report.
#[derive(Clone, Debug, Serialize)]
pub struct Fig14Report {
    /// What was run.
    pub config: Fig14Config,
    /// One row per timeout.
    pub rows: Vec<Fig14Row>,
    /// Every row's median is within its bound (the key figure).
    pub all_p50_within: bool,
    /// Every row's largest sample is within its bound.
    pub all_max_within: bool,
    /// Every Result arrived with the right sums.
    pub verified: bool,
}

/// Runs Figure 14: for each timeout, a fresh PFE with Trio-ML's timer threads; all workers
/// but the last send `blocks` blocks back to back, the last never sends, and every block
/// ends in a partial Result.
pub fn fig14(cfg: &Fig14Config) -> Result<Fig14Report, ExperimentError> {
    if cfg.timeouts_ms.is_empty() {
        return bad("--timeouts", "no timeouts given");
    }
    check_workers("--workers", cfg.workers, 2)?;
    if !(1..=MAX_WINDOW).contains(&cfg.blocks) {
        return bad(
            "--blocks",
            format!(
                "{} blocks (all outstanding: the window); accepted 1..={MAX_WINDOW}",
                cfg.blocks
            ),
        );
    }
    check_grads("--grads", cfg.grads)?;
    check_timers(cfg.timers, cfg.scan_period_ns)?;
    check_ppe(cfg.ppe_threads)?;
    for &t in &cfg.timeouts_ms {
        check_timeout("--timeouts", t, cfg.scan_period_ns)?;
    }
    let senders: Vec<u8> = (0..cfg.workers - 1).collect();
    let n = cfg.blocks * usize::from(cfg.grads);
    let mut rows = Vec::new();
    for (round, &t) in cfg.timeouts_ms.iter().enumerate() {
        let clock = cfg.virtual_time.then(|| Arc::new(ManualClock::new()));
        let r = rig(RigConfig {
            workers: cfg.workers,
            window: cfg.blocks,
            grads: cfg.grads,
            block_exp_ms: t,
            timers: Some((cfg.timers, cfg.scan_period_ns)),
            ppe_threads: cfg.ppe_threads,
            clock: clock.clone(),
        })?;
        let round = round as u64;
        let workers = senders
            .iter()
            .map(|&s| {
                Ok((
                    Worker::new(
                        worker_config(s, cfg.grads, cfg.blocks, 0),
                        gradients(cfg.seed, s, round, n),
                    )?,
                    Port::from(s),
                ))
            })
            .collect::<Result<Vec<_>, HostError>>()?;
        let timed = match &clock {
            Some(clock) => {
                let step = (cfg.scan_period_ns / u64::from(cfg.timers)).max(1);
                // Every block is due out one scan period after its timeout at the latest.
                let limit = VIRTUAL_LIMIT_FACTOR * (u64::from(t) * 1_000_000 + cfg.scan_period_ns);
                run_virtual(&r, clock, workers, step, limit)?
            }
            None => run_timed(&r, workers)?,
        };
        let stats = r.pfe.shutdown();
        let want = sums_of(cfg.seed, &senders, round, n);
        let partial_cnt = cfg.workers - 1;
        let mut samples = Vec::new();
        for b in 0..cfg.blocks {
            let last_sent = timed.iter().map(|w| w.sent_ns[b]).max().unwrap_or(0);
            samples.extend(
                timed
                    .iter()
                    .map(|w| w.arrived_ns[b].saturating_sub(last_sent)),
            );
        }
        samples.sort_unstable();
        let mut results = 0;
        let mut partial = 0;
        let mut verified = true;
        for w in &timed {
            let st = w.worker.stats();
            results += st.results;
            partial += w
                .worker
                .src_counts()
                .iter()
                .zip(w.worker.degraded())
                .filter(|&(&c, &d)| d && c == partial_cnt)
                .count() as u64;
            verified &= w.worker.is_done() && w.worker.sums() == want;
        }
        verified &= partial == results && results == (senders.len() * cfg.blocks) as u64;
        let t_ns = u64::from(t) * 1_000_000;
        let bound = t_ns as f64 * (1.0 + 1.0 / f64::from(cfg.timers)) + FIG14_SLACK_NS as f64;
        let (p50, max) = (percentile(&samples, 0.5), percentile(&samples, 1.0));
        rows.push(Fig14Row {
            timeout_ms: t,
            samples: samples.len(),
            p50_ms: ms(p50 as f64),
            mean_ms: ms(mean(&samples)),
            min_ms: ms(percentile(&samples, 0.0) as f64),
            max_ms: ms(max as f64),
            bound_ms: ms(bound),
            paper_2x_ms: ms(2.0 * t_ns as f64),
            p50_within: p50 as f64 <= bound,
            max_within: max as f64 <= bound,
            results,
            partial_results: partial,
            timer_overruns: stats.timer_overruns,
            timer_missed: stats.timer_missed,
            verified,
        });
    }
    Ok(Fig14Report {
        all_p50_within: rows.iter().all(|r| r.p50_within),
        all_max_within: rows.iter().all(|r| r.max_within),
        verified: rows.iter().all(|r| r.verified),
        config: cfg.clone(),
        rows,
    })
}

impl Figure for Fig14Report {
    fn name(&self) -> &'static str {
        "fig14"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "timeout_ms",
            "samples",
            "p50_ms",
            "mean_ms",
            "min_ms",
            "max_ms",
            "bound_ms",
            "paper_2x_ms",
            "p50_within",
            "max_within",
            "results",
            "partial_results",
            "timer_overruns",
            "timer_missed",
            "verified",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                vec![
                    r.timeout_ms.to_string(),
                    r.samples.to_string(),
                    format!("{:.3}", r.p50_ms),
                    format!("{:.3}", r.mean_ms),
                    format!("{:.3}", r.min_ms),
                    format!("{:.3}", r.max_ms),
                    format!("{:.3}", r.bound_ms),
                    format!("{:.3}", r.paper_2x_ms),
                    r.p50_within.to_string(),
                    r.max_within.to_string(),
                    r.results.to_string(),
                    r.partial_results.to_string(),
                    r.timer_overruns.to_string(),
                    r.timer_missed.to_string(),
                    r.verified.to_string(),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError> {
        let line = |name: &str, f: &dyn Fn(&Fig14Row) -> f64| Series {
            name: name.into(),
            points: self
                .rows
                .iter()
                .map(|r| (f64::from(r.timeout_ms), f(r)))
                .collect(),
        };
        plot::svg(
            path,
            &Chart {
                title: "Fig. 14: time to a partial result vs the timeout",
                x_label: "timeout (ms)",
                y_label: "time to partial result (ms)",
                series: vec![
                    line("measured p50", &|r| r.p50_ms),
                    line("measured max", &|r| r.max_ms),
                    line("bound (1 + 1/N) T + 1 ms", &|r| r.bound_ms),
                    line("paper: 2x timeout", &|r| r.paper_2x_ms),
                ],
            },
        )
    }

    fn table(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "fig14: time to a partial result vs the timeout ({} workers, worker {} never \
             sends; {} blocks of {} gradients each; N = {} timers, scan every {} ms; {})\n",
            c.workers,
            c.workers - 1,
            c.blocks,
            c.grads,
            c.timers,
            c.scan_period_ns as f64 / 1e6,
            if c.virtual_time {
                "virtual time"
            } else {
                "system clock"
            }
        );
        s += &format!(
            "{:>10} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>6} {:>9} {:>14}\n",
            "timeout",
            "samples",
            "p50 ms",
            "mean ms",
            "max ms",
            "bound ms",
            "2T ms",
            "p50 ok",
            "max ok",
            "partial",
            "scans skipped"
        );
        for r in &self.rows {
            s += &format!(
                "{:>7} ms {:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.1} {:>6} {:>6} {:>4}/{:<4} \
                 {:>14}\n",
                r.timeout_ms,
                r.samples,
                r.p50_ms,
                r.mean_ms,
                r.max_ms,
                r.bound_ms,
                r.paper_2x_ms,
                yes_no(r.p50_within),
                yes_no(r.max_within),
                r.partial_results,
                r.results,
                r.timer_overruns + r.timer_missed
            );
        }
        s += &format!(
            "key: p50 within (1 + 1/N) T + 1 ms for every timeout: {}; max within it: \
             {}; sums verified: {}\n",
            yes_no(self.all_p50_within),
            yes_no(self.all_max_within),
            yes_no(self.verified)
        );
        s
    }

    fn verified(&self) -> bool {
        self.verified
    }
}
