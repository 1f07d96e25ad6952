//! The Trio paper's Trio-ML experiments (SIGCOMM 2022, §6.2-6.3), run in-process on the
//! real clock: end hosts from [`crate::microcode::trio_ml::host`] on their own threads
//! against a running [`Pfe`] with Trio-ML installed, Results multicast back to them.
//!
//! - [`fig14`]: time to a partial result against the straggler timeout. One worker of
//!   the job never sends; the others send a window of blocks back to back; each block's
//!   partial Result is timed from the last of its packets being sent.
//! - [`fig13`]: training iteration time against the straggling probability, straggler
//!   aware (Trio-ML with its timer threads) against wait-for-all (the same program with no
//!   timers, so a block finishes only when every source is in, as SwitchML behaves).
//! - [`fig15`]: aggregation latency and rate against gradients per packet, window 1.
//! - [`fig16`]: aggregation latency and throughput against the window, 1024 gradients per
//!   packet.
//!
//! Every experiment checks every Result it receives against sums it computes itself and
//! says so in its report's `verified`. Reports serialise to JSON, and [`write_files`] writes
//! a report's CSV (one row per point) and SVG chart.
//!
//! Gradients are pseudo-random integers below 2^19 in magnitude (so sums of up to 255
//! sources never overflow) derived from a seed, the source, the round and the index, so any
//! subset's sums can be recomputed to check a (partial) Result.

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde::Serialize;

use super::plot::{self, Chart, DualChart, Series};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::trio_ml::host::{
    drive, port_channels, DriveOptions, HostError, Received, Worker, WorkerConfig,
};
use crate::microcode::trio_ml::{
    wire, JobConfig, TrioMl, TrioMlConfig, DEFAULT_SCAN_PERIOD_NS, DEFAULT_TIMERS,
};
use crate::packet::{Dest, Port};
use crate::pfe::{default_ppe_threads, Pfe, Stats};
use crate::rng::{mix, SplitMix64};

/// The job id every experiment uses.
const JOB: u8 = 1;
/// Most workers an experiment runs (each is a thread and a port).
pub const MAX_WORKERS: u8 = 32;
/// Largest window: a job holds `2 x window` slots and `block_cnt_max` is at most 4095.
pub const MAX_WINDOW: usize = 2047;
/// A worker gives up when no Result arrived for this long.
const GIVE_UP: Duration = Duration::from_secs(20);

// ----- errors --------------------------------------------------------------------------------

/// Why an experiment could not run.
#[derive(Debug)]
pub enum ExperimentError {
    /// An option is out of range; names the option as the CLI spells it.
    Option {
        /// The option at fault (e.g. `--timeouts`).
        option: &'static str,
        /// What is wrong with it, with the accepted range.
        reason: String,
    },
    /// The PFE or Trio-ML could not be set up, or the engine stopped.
    Setup(String),
    /// A run of an experiment failed: what was running, and why (a worker's error with
    /// the PFE's drop counters, for instance).
    Run(String),
    /// A worker failed (for instance it gave up waiting for its Results).
    Host(HostError),
    /// The CSV or SVG could not be written.
    Output(String),
}

impl fmt::Display for ExperimentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExperimentError::Option { option, reason } => {
                write!(f, "invalid option `{option}`: {reason}")
            }
            ExperimentError::Setup(e) => write!(f, "setting up the PFE: {e}"),
            ExperimentError::Run(e) => write!(f, "{e}"),
            ExperimentError::Host(e) => write!(f, "a worker failed: {e}"),
            ExperimentError::Output(e) => write!(f, "writing the results: {e}"),
        }
    }
}

impl Error for ExperimentError {}

impl From<HostError> for ExperimentError {
    fn from(e: HostError) -> Self {
        ExperimentError::Host(e)
    }
}

fn bad<T>(option: &'static str, reason: impl Into<String>) -> Result<T, ExperimentError> {
    Err(ExperimentError::Option {
        option,
        reason: reason.into(),
    })
}

fn setup(e: impl fmt::Display) -> ExperimentError {
    ExperimentError::Setup(e.to_string())
}

// ----- reports and their files ---------------------------------------------------------------

/// What every experiment's report offers: its files, its table and its check.
pub trait Figure: Serialize {
    /// The experiment's name (`fig13` ...), also the stem of its files.
    fn name(&self) -> &'static str;
    /// The CSV header.
    fn csv_header(&self) -> Vec<&'static str>;
    /// One CSV row per measured point.
    fn csv_rows(&self) -> Vec<Vec<String>>;
    /// Draws the chart as SVG at `path`.
    fn draw(&self, path: &Path) -> Result<(), Box<dyn Error>>;
    /// A readable table of the points, with the key figure.
    fn table(&self) -> String;
    /// Every Result arrived and had the right sums.
    fn verified(&self) -> bool;
}

/// The files [`write_files`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Written {
    /// `DIR/<name>.csv`.
    pub csv: PathBuf,
    /// `DIR/<name>.svg`.
    pub svg: PathBuf,
}

/// Writes `DIR/<name>.csv` and `DIR/<name>.svg` for `fig`, creating `dir` if needed.
pub fn write_files<F: Figure>(fig: &F, dir: &Path) -> Result<Written, ExperimentError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        ExperimentError::Output(format!("cannot create directory {}: {e}", dir.display()))
    })?;
    let csv = dir.join(format!("{}.csv", fig.name()));
    let svg = dir.join(format!("{}.svg", fig.name()));
    plot::csv(&csv, &fig.csv_header(), &fig.csv_rows())
        .map_err(|e| ExperimentError::Output(format!("{}: {e}", csv.display())))?;
    fig.draw(&svg)
        .map_err(|e| ExperimentError::Output(format!("{}: {e}", svg.display())))?;
    Ok(Written { csv, svg })
}

// ----- shared machinery ----------------------------------------------------------------------

/// Gradient `i` of source `src` in round `round`: an integer in [-2^19, 2^19).
fn gradient(seed: u64, src: u8, round: u64, i: usize) -> i32 {
    let h = mix(seed ^ mix((u64::from(src) << 56) ^ (round << 32) ^ i as u64));
    (h >> 44) as i32 - (1 << 19)
}

fn gradients(seed: u64, src: u8, round: u64, n: usize) -> Vec<i32> {
    (0..n).map(|i| gradient(seed, src, round, i)).collect()
}

/// The sums over every source in `srcs`.
fn sums_of(seed: u64, srcs: &[u8], round: u64, n: usize) -> Vec<i32> {
    let mut s = vec![0i32; n];
    for &src in srcs {
        for (i, a) in s.iter_mut().enumerate() {
            *a = a.wrapping_add(gradient(seed, src, round, i));
        }
    }
    s
}

/// A running PFE with Trio-ML and one job of `workers` sources on ports `0..workers`,
/// Results multicast to all of them; and the channels the Results arrive on, by port.
struct Rig {
    pfe: Pfe,
    rxs: Vec<Receiver<Vec<u8>>>,
}

#[derive(Clone, Copy, Debug)]
struct RigConfig {
    workers: u8,
    window: usize,
    grads: u16,
    block_exp_ms: u8,
    /// `(timers, scan_period_ns)` to run the straggler scan; `None`: no timer threads.
    timers: Option<(u32, u64)>,
    ppe_threads: usize,
}

/// Slots a job gets for `window` block ids: `2 x window` (a kept Result and the next
/// generation per block id).
fn job_slots(window: usize) -> usize {
    2 * window
}

fn rig(c: RigConfig) -> Result<Rig, ExperimentError> {
    let slots = job_slots(c.window);
    let slot_bytes = 64 + (u64::from(c.grads) * 4).div_ceil(64) * 64;
    let dram = (slots as u64 * slot_bytes + (1 << 20)).next_power_of_two();
    let mem = Arc::new(
        SharedMemory::new(&MemConfig {
            dram_bytes: dram.max(64 << 20),
            ..MemConfig::default()
        })
        .map_err(setup)?,
    );
    let (timers, scan_period_ns) = c.timers.unwrap_or((DEFAULT_TIMERS, DEFAULT_SCAN_PERIOD_NS));
    let trio = TrioMl::install(
        &mem,
        TrioMlConfig {
            timers,
            scan_period_ns,
            ..TrioMlConfig::default()
        },
    )
    .map_err(setup)?;
    let sources: Vec<u8> = (0..c.workers).collect();
    trio.add_job(&JobConfig {
        job_id: JOB,
        sources: sources.clone(),
        block_cnt_max: slots as u16,
        block_grad_max: c.grads,
        block_exp_ms: c.block_exp_ms,
        out_dest: Dest::Group(0),
        ..JobConfig::default()
    })
    .map_err(setup)?;
    let (sink, rxs) = port_channels(usize::from(c.workers));
    let mut b = Pfe::builder()
        .program(trio.program())
        .ppe_threads(c.ppe_threads)
        .memory(mem)
        .multicast_group(
            0,
            sources.iter().map(|&s| Port::from(s)).collect::<Vec<_>>(),
        )
        .sink(Arc::new(sink));
    if c.timers.is_some() {
        b = b.timers(trio.timer_specs().map_err(setup)?);
    }
    let mut pfe = b.build().map_err(setup)?;
    pfe.start().map_err(setup)?;
    Ok(Rig { pfe, rxs })
}

fn worker_config(src: u8, grads: u16, window: usize, first_gen: u16) -> WorkerConfig {
    WorkerConfig {
        grads_per_packet: usize::from(grads),
        window,
        first_gen,
        ..WorkerConfig::new(JOB, src, TrioMlConfig::default().local_addr)
    }
}

/// An inject function for workers that remembers whether the engine refused a frame (it
/// has stopped), instead of panicking in a worker thread.
struct Injector<'a> {
    pfe: &'a Pfe,
    failed: AtomicBool,
}

impl Injector<'_> {
    fn inject(&self, port: Port, frame: &[u8]) {
        if self.pfe.inject_frame(port, frame).is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
    }

    fn check(&self) -> Result<(), ExperimentError> {
        if self.failed.load(Ordering::Relaxed) {
            return Err(setup("the PFE refused a frame (it is not running)"));
        }
        Ok(())
    }
}

/// One worker's run on the shared clock: when each chunk was first sent and when its
/// Result arrived (ns since the experiment's start).
struct Timed {
    worker: Worker,
    sent_ns: Vec<u64>,
    arrived_ns: Vec<u64>,
}

fn ns_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// Like [`drive`], on a clock shared by all workers, recording per chunk when it was sent
/// (once the PFE took it) and when its Result arrived.
fn drive_timed(
    mut worker: Worker,
    port: Port,
    inject: &Injector<'_>,
    rx: &Receiver<Vec<u8>>,
    base: Instant,
) -> Result<Timed, HostError> {
    let chunks = worker.chunks();
    let (window, first_gen) = (worker.config().window, worker.config().first_gen);
    let mut sent_ns = vec![0; chunks];
    let mut arrived_ns = vec![0; chunks];
    let mut out = Vec::new();
    let mut last_progress = Instant::now();
    while !worker.is_done() {
        worker.poll(ns_since(base), &mut out);
        for p in out.drain(..) {
            inject.inject(port, &p);
            if let Ok((h, _)) = wire::parse(&p) {
                let c =
                    usize::from(h.gen_id.wrapping_sub(first_gen)) * window + h.block_id as usize;
                if let Some(s) = sent_ns.get_mut(c) {
                    *s = ns_since(base);
                }
            }
        }
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(frame) => {
                for f in std::iter::once(frame).chain(rx.try_iter()) {
                    let now = ns_since(base);
                    if let Received::Result { chunk } = worker.on_frame_at(&f, now)? {
                        arrived_ns[chunk] = now;
                        last_progress = Instant::now();
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(HostError::TimedOut {
                    missing: worker.missing(),
                })
            }
        }
        if last_progress.elapsed() > GIVE_UP {
            return Err(HostError::TimedOut {
                missing: worker.missing(),
            });
        }
    }
    Ok(Timed {
        worker,
        sent_ns,
        arrived_ns,
    })
}

/// Runs `workers` (worker, its port) on their own threads against `rig`, on a clock
/// started here; returns them in order with their timings.
fn run_timed(rig: &Rig, workers: Vec<(Worker, Port)>) -> Result<Vec<Timed>, ExperimentError> {
    let inject = Injector {
        pfe: &rig.pfe,
        failed: AtomicBool::new(false),
    };
    let base = Instant::now();
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|(w, port)| {
                let rx = &rig.rxs[usize::from(port)];
                let inject = &inject;
                s.spawn(move || drive_timed(w, port, inject, rx, base))
            })
            .collect();
        handles.into_iter().map(join).collect::<Vec<_>>()
    });
    inject.check()?;
    let mut out = Vec::new();
    for r in results {
        out.push(r??);
    }
    Ok(out)
}

/// A worker thread's result; a panic becomes an error.
fn join<T>(h: std::thread::ScopedJoinHandle<'_, T>) -> Result<T, ExperimentError> {
    h.join()
        .map_err(|_| ExperimentError::Run("a worker thread panicked".into()))
}

/// Nearest-rank percentile `q` (0..=1) of sorted `v` (0 when empty).
fn percentile(v: &[u64], q: f64) -> u64 {
    if v.is_empty() {
        return 0;
    }
    let rank = (q * v.len() as f64).ceil().max(1.0) as usize;
    v[rank.min(v.len()) - 1]
}

fn mean(v: &[u64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64
    }
}

fn sleep_until(base: Instant, at_ns: u64) {
    let now = ns_since(base);
    if at_ns > now {
        std::thread::sleep(Duration::from_nanos(at_ns - now));
    }
}

fn check_workers(option: &'static str, workers: u8, min: u8) -> Result<(), ExperimentError> {
    if !(min..=MAX_WORKERS).contains(&workers) {
        return bad(
            option,
            format!("{workers} workers; accepted {min}..={MAX_WORKERS}"),
        );
    }
    Ok(())
}

fn check_grads(option: &'static str, grads: u16) -> Result<(), ExperimentError> {
    if !(1..=wire::MAX_GRAD_CNT).contains(&grads) {
        return bad(
            option,
            format!(
                "{grads} gradients per packet; accepted 1..={}",
                wire::MAX_GRAD_CNT
            ),
        );
    }
    Ok(())
}

fn check_ppe(ppe_threads: usize) -> Result<(), ExperimentError> {
    if !(1..=4096).contains(&ppe_threads) {
        return bad("--ppe-threads", format!("{ppe_threads}; accepted 1..=4096"));
    }
    Ok(())
}

fn check_timers(timers: u32, scan_period_ns: u64) -> Result<(), ExperimentError> {
    let shards = TrioMlConfig::default().hash_shards as u32;
    if !(1..=shards).contains(&timers) {
        return bad(
            "--timers",
            format!("{timers} timer threads; accepted 1..={shards} (each scans whole shards)"),
        );
    }
    if !(10_000..=1_000_000_000).contains(&scan_period_ns) {
        return bad(
            "--scan-period-ms",
            format!("{} ms; accepted 0.01..=1000", scan_period_ns as f64 / 1e6),
        );
    }
    Ok(())
}

/// A block timeout must fit `block_age` (8 bits) in scan periods.
fn check_timeout(option: &'static str, ms: u8, scan_period_ns: u64) -> Result<(), ExperimentError> {
    let periods = (u64::from(ms) * 1_000_000).div_ceil(scan_period_ns);
    if ms == 0 || periods > 255 {
        return bad(
            option,
            format!(
                "{ms} ms; accepted 1..=255 ms and at most 255 scan periods of {} ms \
                 (block_age is 8 bits)",
                scan_period_ns as f64 / 1e6
            ),
        );
    }
    Ok(())
}

fn ms(ns: f64) -> f64 {
    ns / 1e6
}

fn us(ns: f64) -> f64 {
    ns / 1e3
}

// ----- Figure 14 -----------------------------------------------------------------------------

/// Figure 14: how long non-straggling workers wait for a partial result, by timeout.
#[derive(Clone, Debug, Serialize)]
pub struct Fig14Config {
    /// Block timeouts to measure, in ms (`--timeouts`; the paper: 2 to 50 ms).
    pub timeouts_ms: Vec<u8>,
    /// Workers in the job; the last never sends (`--workers`, at least 2).
    pub workers: u8,
    /// Blocks each sending worker sends back to back, all outstanding at once (the window)
    /// (`--blocks`; the paper: 20).
    pub blocks: usize,
    /// Gradients per packet (`--grads`).
    pub grads: u16,
    /// Staggered scan timer threads, Trio-ML's N (`--timers`).
    pub timers: u32,
    /// Time between two visits of a block by the scan (`--scan-period-ms`).
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    pub ppe_threads: usize,
    /// Seed of the gradient values (`--seed`).
    pub seed: u64,
}

/// The slack Figure 14's bound allows past `(1 + 1/N) T`: 1 ms.
pub const FIG14_SLACK_NS: u64 = 1_000_000;

/// Figure 14's default scan period, 0.5 ms: a block ages out at most one scan period after
/// its timeout, which leaves the other half of [`FIG14_SLACK_NS`] to the scan's launch,
/// the partial Result's way back and the worker. (With Trio-ML's default of 1 ms the
/// detection alone can use all of the slack, and the worst case overshoots.)
pub const FIG14_SCAN_PERIOD_NS: u64 = 500_000;

impl Default for Fig14Config {
    /// Timeouts 2, 5, 10, 20 and 50 ms; 4 workers (3 send); 20 blocks of 256 gradients;
    /// 100 timers scanning every 0.5 ms ([`FIG14_SCAN_PERIOD_NS`]); PPE threads = cores.
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
        let r = rig(RigConfig {
            workers: cfg.workers,
            window: cfg.blocks,
            grads: cfg.grads,
            block_exp_ms: t,
            timers: Some((cfg.timers, cfg.scan_period_ns)),
            ppe_threads: cfg.ppe_threads,
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
        let timed = run_timed(&r, workers)?;
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

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
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

    fn draw(&self, path: &Path) -> Result<(), Box<dyn Error>> {
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
             sends; {} blocks of {} gradients each; N = {} timers, scan every {} ms)\n",
            c.workers,
            c.workers - 1,
            c.blocks,
            c.grads,
            c.timers,
            c.scan_period_ns as f64 / 1e6
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

// ----- Figure 13 -----------------------------------------------------------------------------

/// Figure 13: training iteration time against the straggling probability.
///
/// Emulated training: each of `workers` workers runs `iterations` iterations of compute
/// (sleeping `compute_ms`, split in three) and an allreduce of `model_gradients`
/// gradients through the PFE. The paper's "Slow Worker Pattern": at each of three delay
/// points per iteration (after each third of the compute), with probability `p` one
/// randomly chosen worker sleeps a time uniform in [0.5, 2] x the typical iteration time
/// (measured first, wait-for-all with p = 0). The straggle schedule is drawn from a seeded
/// generator per `p`, and both modes run the same schedule.
///
/// The window is the model's chunk count, so each block id is used once per iteration and
/// the generation is the iteration number. In the straggler-aware mode a straggler that
/// wakes to find the others have finished its iteration *resynchronises*: every worker
/// publishes the latest iteration it completed and when, and a straggler behind it skips
/// to the iteration in progress, drops its stale gradients, and joins that iteration's
/// allreduce when an on-time worker would (when the iteration began plus the compute
/// time). Without this it would send generations the aggregator has moved past
/// (`stale_gen` drops) and never receive a result. In the wait-for-all mode everyone waits
/// for the straggler, so no worker ever falls behind.
#[derive(Clone, Debug, Serialize)]
pub struct Fig13Config {
    /// Straggling probabilities, in percent (`--probabilities`; the paper: 0 to 16).
    pub probabilities_pct: Vec<f64>,
    /// Workers (`--workers`, 2 to 8).
    pub workers: u8,
    /// Iterations K each run trains (`--iterations`).
    pub iterations: u32,
    /// Compute time per iteration, ms (`--compute-ms`), split over the three delay points.
    pub compute_ms: f64,
    /// Block timeout of the straggler-aware mode, ms (`--block-exp-ms`).
    pub block_exp_ms: u8,
    /// Gradients in the model (`--model-gradients`).
    pub model_gradients: usize,
    /// Gradients per packet (`--grads`).
    pub grads: u16,
    /// Scan timer threads, N (`--timers`).
    pub timers: u32,
    /// Scan period (`--scan-period-ms`).
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    pub ppe_threads: usize,
    /// Seed of the straggle schedules and the gradients (`--seed`).
    pub seed: u64,
}

impl Default for Fig13Config {
    /// p in {0, 4, 8, 16}%, 4 workers, 40 iterations of 60 ms compute and an allreduce of
    /// 65536 gradients in packets of 256, a 5 ms block timeout, 100 timers scanning every
    /// 1 ms, PPE threads = cores.
    fn default() -> Self {
        Fig13Config {
            probabilities_pct: vec![0.0, 4.0, 8.0, 16.0],
            workers: 4,
            iterations: 40,
            compute_ms: 60.0,
            block_exp_ms: 5,
            model_gradients: 65_536,
            grads: 256,
            timers: DEFAULT_TIMERS,
            scan_period_ns: DEFAULT_SCAN_PERIOD_NS,
            ppe_threads: default_ppe_threads(),
            seed: 1,
        }
    }
}

/// One mode's run of Figure 13.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrainingRun {
    /// Mean over workers of (time to finish the iterations) / iterations, ms.
    pub iteration_ms: f64,
    /// Straggle sleeps the workers took.
    pub straggles: u64,
    /// Results received over all workers and iterations.
    pub results: u64,
    /// Of those, partial (degraded) ones.
    pub degraded: u64,
    /// Times a straggler resynchronised (skipped to the iteration in progress).
    pub resyncs: u64,
    /// Iterations skipped by resynchronising, over all workers.
    pub skipped_iterations: u64,
    /// Packets of a block that had already aged out, answered with its partial Result.
    pub late_answered: u64,
    /// Packets of a generation the aggregator had moved past (0 with resynchronising).
    pub stale_gen: u64,
    /// Every Result summed exactly `src_cnt` of the workers' gradients for its iteration,
    /// and was degraded exactly when partial.
    pub verified: bool,
}

/// One probability's measurements.
#[derive(Clone, Debug, Serialize)]
pub struct Fig13Row {
    /// Straggling probability, percent.
    pub p_pct: f64,
    /// Straggle events in the schedule (both modes run it).
    pub events: u64,
    /// Straggler aware: Trio-ML with its timer threads.
    pub straggler_aware: TrainingRun,
    /// Wait-for-all: the same program without timers (SwitchML-like). At p = 0 this is
    /// the run that measured the typical iteration time.
    pub wait_for_all: TrainingRun,
    /// `wait_for_all.iteration_ms / straggler_aware.iteration_ms`.
    pub speedup: f64,
}

/// Figure 13's report.
#[derive(Clone, Debug, Serialize)]
pub struct Fig13Report {
    /// What was run.
    pub config: Fig13Config,
    /// The typical iteration time: wait-for-all with p = 0, ms (the ideal; straggle
    /// sleeps are multiples of it).
    pub typical_iteration_ms: f64,
    /// One row per probability.
    pub rows: Vec<Fig13Row>,
    /// The largest probability measured, percent.
    pub max_p_pct: f64,
    /// The speedup at that probability (the key figure; the paper at 16%: 1.72-1.8x).
    pub speedup_at_max_p: f64,
    /// Every Result of every run was right.
    pub verified: bool,
}

/// Per iteration, per delay point: the worker that straggles and for how many typical
/// iteration times.
type Schedule = Vec<[Option<(u8, f64)>; 3]>;

fn schedule(iterations: u32, workers: u8, p: f64, seed: u64) -> Schedule {
    let mut rng = SplitMix64::new(mix(seed ^ mix(p.to_bits())));
    (0..iterations)
        .map(|_| {
            let mut points = [None; 3];
            for pt in &mut points {
                let hit = rng.uniform() < p;
                let who = (rng.next_u64() % u64::from(workers)) as u8;
                let factor = 0.5 + 1.5 * rng.uniform();
                if hit {
                    *pt = Some((who, factor));
                }
            }
            points
        })
        .collect()
}

/// What one worker of a training run saw.
#[derive(Default)]
struct WorkerRun {
    finish_ns: u64,
    straggles: u64,
    results: u64,
    degraded: u64,
    resyncs: u64,
    skipped: u64,
    verified: bool,
}

/// Checks one allreduce's Results: each chunk sums exactly `src_cnt` of the workers'
/// gradients of round `round` (some subset of that size), and is degraded exactly when
/// `src_cnt` is short of all workers.
fn verify_allreduce(w: &Worker, seed: u64, workers: u8, round: u64) -> bool {
    let n = w.sums().len();
    let g = w.config().grads_per_packet;
    let all: Vec<Vec<i32>> = (0..workers).map(|s| gradients(seed, s, round, n)).collect();
    let sum_of = |mask: u32, i: usize| {
        (0..workers)
            .filter(|&s| mask & 1 << s != 0)
            .fold(0i32, |a, s| a.wrapping_add(all[usize::from(s)][i]))
    };
    w.is_done()
        && w.src_counts().iter().enumerate().all(|(c, &cnt)| {
            let range = c * g..((c + 1) * g).min(n);
            let sums = &w.sums()[range.clone()];
            cnt >= 1
                && w.degraded()[c] == (cnt < workers)
                && (0u32..1 << workers)
                    .filter(|m| m.count_ones() == u32::from(cnt))
                    .any(|m| range.clone().zip(sums).all(|(i, &v)| sum_of(m, i) == v))
        })
}

/// Shared by a run's workers: the latest iteration completed and when each began.
struct Progress {
    /// Iterations completed by the fastest worker.
    completed: AtomicU32,
    /// Per iteration: when the first worker began it (ns since the run's start).
    began_ns: Vec<AtomicU64>,
}

fn train(
    cfg: &Fig13Config,
    p: f64,
    aware: bool,
    sched: &Schedule,
    typical_ns: u64,
) -> Result<TrainingRun, ExperimentError> {
    let chunks = cfg.model_gradients.div_ceil(usize::from(cfg.grads));
    let r = rig(RigConfig {
        workers: cfg.workers,
        window: chunks,
        grads: cfg.grads,
        block_exp_ms: if aware { cfg.block_exp_ms } else { 255 },
        timers: aware.then_some((cfg.timers, cfg.scan_period_ns)),
        ppe_threads: cfg.ppe_threads,
    })?;
    let k_max = cfg.iterations;
    let progress = Progress {
        completed: AtomicU32::new(0),
        began_ns: (0..=k_max)
            .map(|k| AtomicU64::new(if k == 0 { 0 } else { u64::MAX }))
            .collect(),
    };
    let compute_ns = (cfg.compute_ms * 1e6) as u64;
    let inject = Injector {
        pfe: &r.pfe,
        failed: AtomicBool::new(false),
    };
    let base = Instant::now();
    let runs = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.workers)
            .map(|me| {
                let rx = &r.rxs[usize::from(me)];
                let (inject, progress) = (&inject, &progress);
                s.spawn(move || {
                    train_worker(
                        cfg, aware, sched, typical_ns, compute_ns, me, rx, inject, progress, base,
                    )
                })
            })
            .collect();
        handles.into_iter().map(join).collect::<Vec<_>>()
    });
    inject.check()?;
    let stats: Stats = r.pfe.shutdown();
    let runs = runs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let runs = runs
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| {
            ExperimentError::Run(format!(
                "fig13, {} mode, p = {:.1}%: a worker failed: {e} (PFE drops: {:?})",
                if aware {
                    "straggler-aware"
                } else {
                    "wait-for-all"
                },
                p * 100.0,
                stats.dropped_by_reason
            ))
        })?;
    let k = f64::from(k_max.max(1));
    Ok(TrainingRun {
        iteration_ms: ms(
            runs.iter().map(|w| w.finish_ns as f64 / k).sum::<f64>() / runs.len() as f64
        ),
        straggles: runs.iter().map(|w| w.straggles).sum(),
        results: runs.iter().map(|w| w.results).sum(),
        degraded: runs.iter().map(|w| w.degraded).sum(),
        resyncs: runs.iter().map(|w| w.resyncs).sum(),
        skipped_iterations: runs.iter().map(|w| w.skipped).sum(),
        late_answered: stats.drops("late"),
        stale_gen: stats.drops("stale_gen"),
        verified: runs.iter().all(|w| w.verified),
    })
}

#[allow(clippy::too_many_arguments)]
fn train_worker(
    cfg: &Fig13Config,
    aware: bool,
    sched: &Schedule,
    typical_ns: u64,
    compute_ns: u64,
    me: u8,
    rx: &Receiver<Vec<u8>>,
    inject: &Injector<'_>,
    progress: &Progress,
    base: Instant,
) -> Result<WorkerRun, HostError> {
    let k_max = cfg.iterations;
    let n = cfg.model_gradients;
    let seg = compute_ns / 3;
    let mut out = WorkerRun {
        verified: true,
        ..WorkerRun::default()
    };
    let check = |w: &Worker, round: u32, out: &mut WorkerRun| {
        out.verified &= verify_allreduce(w, cfg.seed, cfg.workers, u64::from(round));
        out.results += w.stats().results;
        out.degraded += w.stats().degraded;
    };
    let mut prev: Option<(u32, Worker)> = None;
    let mut k = 0u32;
    'train: while k < k_max {
        // Compute: check the last allreduce and make this iteration's gradients (the
        // work is part of the compute time), then the three thirds and delay points.
        let start = ns_since(base);
        if let Some((round, w)) = prev.take() {
            check(&w, round, &mut out);
        }
        let mut values = gradients(cfg.seed, me, u64::from(k), n);
        let mut behind = false;
        // Each third of the compute runs to its own deadline; a straggle sleep pushes the
        // later deadlines back (the work after a delay point is still to do).
        let mut deadline = start;
        for point in &sched[k as usize] {
            deadline += seg;
            sleep_until(base, deadline);
            if let Some((who, factor)) = *point {
                if who == me {
                    out.straggles += 1;
                    let nap = (factor * typical_ns as f64) as u64;
                    std::thread::sleep(Duration::from_nanos(nap));
                    deadline = deadline.max(ns_since(base));
                }
            }
            if aware && progress.completed.load(Ordering::Acquire) > k {
                behind = true;
                break;
            }
        }
        if behind {
            // Resynchronise: skip to the iteration in progress and join its allreduce when
            // an on-time worker would.
            out.resyncs += 1;
            loop {
                let c = progress.completed.load(Ordering::Acquire);
                if c <= k {
                    break;
                }
                out.skipped += u64::from(c - k);
                k = c;
                if k >= k_max {
                    break 'train;
                }
                let began = progress.began_ns[k as usize].load(Ordering::Acquire);
                sleep_until(base, began.saturating_add(compute_ns));
            }
            values = gradients(cfg.seed, me, u64::from(k), n);
        }
        let mut w = Worker::new(
            worker_config(me, cfg.grads, n.div_ceil(usize::from(cfg.grads)), k as u16),
            values,
        )?;
        let port = Port::from(me);
        drive(
            &mut w,
            port,
            &|p, f| inject.inject(p, f),
            rx,
            &mut DriveOptions {
                give_up_after: GIVE_UP,
                ..DriveOptions::default()
            },
        )?;
        let now = ns_since(base);
        progress.began_ns[k as usize + 1].fetch_min(now, Ordering::AcqRel);
        progress.completed.fetch_max(k + 1, Ordering::AcqRel);
        prev = Some((k, w));
        k += 1;
    }
    out.finish_ns = ns_since(base);
    if let Some((round, w)) = prev.take() {
        check(&w, round, &mut out);
    }
    Ok(out)
}

/// Runs Figure 13: the typical iteration time first (wait-for-all, p = 0), then per
/// probability both modes on the same straggle schedule.
pub fn fig13(cfg: &Fig13Config) -> Result<Fig13Report, ExperimentError> {
    if cfg.probabilities_pct.is_empty() {
        return bad("--probabilities", "no probabilities given");
    }
    for &p in &cfg.probabilities_pct {
        if !(0.0..=100.0).contains(&p) {
            return bad("--probabilities", format!("{p}%; accepted 0..=100"));
        }
    }
    check_workers("--workers", cfg.workers, 2)?;
    if cfg.workers > 8 {
        return bad(
            "--workers",
            format!(
                "{} workers; fig13 accepts 2..=8 (partial results are checked against every \
                 subset of the workers)",
                cfg.workers
            ),
        );
    }
    if !(1..=10_000).contains(&cfg.iterations) {
        return bad(
            "--iterations",
            format!("{}; accepted 1..=10000", cfg.iterations),
        );
    }
    if !(cfg.compute_ms.is_finite() && (0.0..=10_000.0).contains(&cfg.compute_ms)) {
        return bad(
            "--compute-ms",
            format!("{}; accepted 0..=10000", cfg.compute_ms),
        );
    }
    check_grads("--grads", cfg.grads)?;
    let chunks = cfg.model_gradients.div_ceil(usize::from(cfg.grads).max(1));
    if cfg.model_gradients == 0 || chunks > MAX_WINDOW {
        return bad(
            "--model-gradients",
            format!(
                "{} gradients are {chunks} packets of {}; accepted 1..={MAX_WINDOW} packets \
                 (the window holds a whole model, so each block id is used once per \
                 iteration)",
                cfg.model_gradients, cfg.grads
            ),
        );
    }
    check_timers(cfg.timers, cfg.scan_period_ns)?;
    check_timeout("--block-exp-ms", cfg.block_exp_ms, cfg.scan_period_ns)?;
    check_ppe(cfg.ppe_threads)?;

    let none = schedule(cfg.iterations, cfg.workers, 0.0, cfg.seed);
    let ideal = train(cfg, 0.0, false, &none, 0)?;
    let typical_ns = (ideal.iteration_ms * 1e6) as u64;
    let mut rows = Vec::new();
    for &p in &cfg.probabilities_pct {
        let sched = schedule(cfg.iterations, cfg.workers, p / 100.0, cfg.seed);
        let events = sched.iter().flatten().flatten().count() as u64;
        let aware = train(cfg, p / 100.0, true, &sched, typical_ns)?;
        let wait = if events == 0 && p == 0.0 {
            ideal.clone()
        } else {
            train(cfg, p / 100.0, false, &sched, typical_ns)?
        };
        rows.push(Fig13Row {
            p_pct: p,
            events,
            speedup: wait.iteration_ms / aware.iteration_ms,
            straggler_aware: aware,
            wait_for_all: wait,
        });
    }
    let last = rows
        .iter()
        .max_by(|a, b| a.p_pct.total_cmp(&b.p_pct))
        .map_or((0.0, 0.0), |r| (r.p_pct, r.speedup));
    Ok(Fig13Report {
        typical_iteration_ms: ideal.iteration_ms,
        max_p_pct: last.0,
        speedup_at_max_p: last.1,
        verified: ideal.verified
            && rows
                .iter()
                .all(|r| r.straggler_aware.verified && r.wait_for_all.verified),
        config: cfg.clone(),
        rows,
    })
}

impl Figure for Fig13Report {
    fn name(&self) -> &'static str {
        "fig13"
    }

    fn csv_header(&self) -> Vec<&'static str> {
        vec![
            "p_pct",
            "events",
            "straggler_aware_ms",
            "wait_for_all_ms",
            "ideal_ms",
            "speedup",
            "aware_degraded",
            "aware_results",
            "aware_resyncs",
            "wait_degraded",
            "wait_results",
            "verified",
        ]
    }

    fn csv_rows(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                let (a, w) = (&r.straggler_aware, &r.wait_for_all);
                vec![
                    r.p_pct.to_string(),
                    r.events.to_string(),
                    format!("{:.3}", a.iteration_ms),
                    format!("{:.3}", w.iteration_ms),
                    format!("{:.3}", self.typical_iteration_ms),
                    format!("{:.3}", r.speedup),
                    a.degraded.to_string(),
                    a.results.to_string(),
                    a.resyncs.to_string(),
                    w.degraded.to_string(),
                    w.results.to_string(),
                    (a.verified && w.verified).to_string(),
                ]
            })
            .collect()
    }

    fn draw(&self, path: &Path) -> Result<(), Box<dyn Error>> {
        let line = |name: &str, f: &dyn Fn(&Fig13Row) -> f64| Series {
            name: name.into(),
            points: self.rows.iter().map(|r| (r.p_pct, f(r))).collect(),
        };
        plot::svg(
            path,
            &Chart {
                title: "Fig. 13: training iteration time vs straggling probability",
                x_label: "straggling probability p (%)",
                y_label: "iteration time (ms)",
                series: vec![
                    line("straggler aware (Trio-ML, timers)", &|r| {
                        r.straggler_aware.iteration_ms
                    }),
                    line("wait for all (no timers, SwitchML-like)", &|r| {
                        r.wait_for_all.iteration_ms
                    }),
                    line("ideal (p = 0)", &|_| self.typical_iteration_ms),
                ],
            },
        )
    }

    fn table(&self) -> String {
        let c = &self.config;
        let mut s = format!(
            "fig13: iteration time vs straggling probability ({} workers, {} iterations of \
             {} ms compute + allreduce of {} gradients; block timeout {} ms; typical \
             iteration {:.2} ms)\n",
            c.workers,
            c.iterations,
            c.compute_ms,
            c.model_gradients,
            c.block_exp_ms,
            self.typical_iteration_ms
        );
        s += &format!(
            "{:>6} {:>7} {:>12} {:>12} {:>8} {:>14} {:>8} {:>14}\n",
            "p %",
            "events",
            "aware ms",
            "wait-all ms",
            "speedup",
            "aware degraded",
            "resyncs",
            "wait degraded"
        );
        for r in &self.rows {
            let (a, w) = (&r.straggler_aware, &r.wait_for_all);
            s += &format!(
                "{:>6} {:>7} {:>12.2} {:>12.2} {:>7.2}x {:>8}/{:<5} {:>8} {:>8}/{:<5}\n",
                r.p_pct,
                r.events,
                a.iteration_ms,
                w.iteration_ms,
                r.speedup,
                a.degraded,
                a.results,
                a.resyncs,
                w.degraded,
                w.results
            );
        }
        s += &format!(
            "key: speedup at p = {}%: {:.2}x (the paper: 1.72-1.8x at 16%); sums verified: {}\n",
            self.max_p_pct,
            self.speedup_at_max_p,
            yes_no(self.verified)
        );
        s
    }

    fn verified(&self) -> bool {
        self.verified
    }
}

// ----- Figures 15 and 16 ---------------------------------------------------------------------

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
    /// Every Result arrived, complete, with the exact sums.
    pub verified: bool,
}

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
    let want = sums_of(c.seed, &srcs, c.round, n);
    let mut lat = Vec::new();
    let mut verified = true;
    let mut results = 0;
    for w in &timed {
        lat.extend_from_slice(w.worker.latencies_ns());
        results += w.worker.stats().results;
        verified &= w.worker.is_done()
            && w.worker.sums() == want
            && w.worker.src_counts().iter().all(|&k| k == c.workers)
            && w.worker.degraded().iter().all(|&d| !d);
    }
    verified &= results == (c.blocks * usize::from(c.workers)) as u64;
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
        latency_mean_us: us(mean(&lat)),
        latency_p50_us: us(percentile(&lat, 0.5) as f64),
        latency_p99_us: us(percentile(&lat, 0.99) as f64),
        rate_mgps: gradients / elapsed / 1e6,
        elapsed_s: elapsed,
        verified,
    })
}

const RATE_HEADER: [&str; 10] = [
    "grads",
    "window",
    "blocks",
    "results",
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
        "{:>10} {:>8} {:>12} {:>11} {:>11} {:>14} {:>9}\n",
        x_name, "results", "latency µs", "p50 µs", "p99 µs", "M gradients/s", "verified"
    );
    for p in points {
        s += &format!(
            "{:>10} {:>8} {:>12.1} {:>11.1} {:>11.1} {:>14.2} {:>9}\n",
            x(p),
            p.results,
            p.latency_mean_us,
            p.latency_p50_us,
            p.latency_p99_us,
            p.rate_mgps,
            yes_no(p.verified)
        );
    }
    s
}

fn check_rate_common(
    workers: u8,
    timers: bool,
    scan_timers: u32,
    scan_period_ns: u64,
    ppe_threads: usize,
) -> Result<(), ExperimentError> {
    check_workers("--workers", workers, 1)?;
    if timers {
        check_timers(scan_timers, scan_period_ns)?;
    }
    check_ppe(ppe_threads)
}

/// Figure 15: aggregation latency and rate against gradients per packet, window 1.
#[derive(Clone, Debug, Serialize)]
pub struct Fig15Config {
    /// Gradients per packet to measure (`--sizes`; the paper: 64 to 1024).
    pub sizes: Vec<u16>,
    /// Workers (`--workers`; the paper: 4).
    pub workers: u8,
    /// Packets each worker sends per size, one at a time (`--blocks`).
    pub blocks: usize,
    /// Run the straggler-scan timer threads meanwhile (off with `--no-timers`).
    pub timers: bool,
    /// Scan timer threads, N (`--timers`).
    pub scan_timers: u32,
    /// Scan period (`--scan-period-ms`).
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    pub ppe_threads: usize,
    /// Seed of the gradients (`--seed`).
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

    fn draw(&self, path: &Path) -> Result<(), Box<dyn Error>> {
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

/// Figure 16: aggregation latency and throughput against the window.
#[derive(Clone, Debug, Serialize)]
pub struct Fig16Config {
    /// Windows to measure (`--windows`; 1 to 2047).
    pub windows: Vec<usize>,
    /// Gradients per packet (`--grads`; the paper: 512 and 1024).
    pub grads: u16,
    /// Workers (`--workers`; the paper: 4).
    pub workers: u8,
    /// Packets each worker sends per window (`--blocks`; at least the largest window).
    pub blocks: usize,
    /// Run the straggler-scan timer threads meanwhile (off with `--no-timers`).
    pub timers: bool,
    /// Scan timer threads, N (`--timers`).
    pub scan_timers: u32,
    /// Scan period (`--scan-period-ms`).
    pub scan_period_ns: u64,
    /// PPE threads (`--ppe-threads`).
    pub ppe_threads: usize,
    /// Seed of the gradients (`--seed`).
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

    fn draw(&self, path: &Path) -> Result<(), Box<dyn Error>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_the_nearest_rank() {
        let v: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&v, 0.5), 5);
        assert_eq!(percentile(&v, 0.99), 10);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn gradients_are_small_and_reproducible() {
        let a = gradients(7, 1, 2, 1000);
        assert_eq!(a, gradients(7, 1, 2, 1000));
        assert_ne!(a, gradients(7, 2, 2, 1000));
        assert!(a.iter().all(|&v| (-(1 << 19)..(1 << 19)).contains(&v)));
    }

    #[test]
    fn schedules_are_seeded_and_near_their_rate() {
        let a = schedule(1000, 4, 0.16, 3);
        assert_eq!(a, schedule(1000, 4, 0.16, 3));
        let events: Vec<(u8, f64)> = a.iter().flatten().flatten().copied().collect();
        assert!((380..580).contains(&events.len()), "{}", events.len());
        assert!(events
            .iter()
            .all(|&(w, f)| w < 4 && (0.5..=2.0).contains(&f)));
        assert!(schedule(10, 4, 0.0, 3)
            .iter()
            .flatten()
            .all(Option::is_none));
    }
}
