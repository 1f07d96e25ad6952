//! The Trio paper's Trio-ML experiments (SIGCOMM 2022, §6.2-6.3), run in-process on the
//! real clock: end hosts from [`crate::microcode::trio_ml::host`] on their own threads
//! against a running [`Pfe`] with Trio-ML installed, Results multicast back to them.
//!
//! - [`fig14`]: time to a partial result against the straggler timeout. One worker of
//!   the job never sends; the others send a window of blocks back to back; each block's
//!   partial Result is timed from the last of its packets being sent. With
//!   [`Fig14Config::virtual_time`] it runs on a [`ManualClock`] the experiment moves
//!   itself, on one thread, the same on any machine.
//! - [`fig13`]: training iteration time against the straggling probability, straggler
//!   aware (Trio-ML with its timer threads) against wait-for-all (the same program with no
//!   timers, so a block finishes only when every source is in, as SwitchML behaves).
//! - [`fig15`]: aggregation latency and rate against gradients per packet, window 1.
//! - [`fig16`]: aggregation latency and throughput against the window, 1024 gradients per
//!   packet.
//!
//! Every experiment checks every Result it receives against sums it computes itself and
//! says so in its report's `verified`: a complete Result must hold exactly every worker's
//! sums, a partial one (`degraded`, given up on by the straggler scan) exactly the sums of
//! as many sources as its `src_cnt` says. The scan times blocks out on the system clock,
//! so on a busy machine a block of [`fig15`] or [`fig16`] may outlive its timeout (a worker
//! or PPE thread held up that long): those points count their partial Results and lost
//! chunks apart ([`RatePoint::degraded`], [`RatePoint::lost`]), a figure of the machine's
//! speed, and verify them like any other. Reports serialise to JSON, and [`write_files`] writes
//! a report's CSV (one row per point) and SVG chart.
//!
//! Gradients are pseudo-random integers below 2^19 in magnitude (so sums of up to 255
//! sources never overflow) derived from a seed, the source, the round and the index, so any
//! subset's sums can be recomputed to check a (partial) Result.

use std::error::Error;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use serde::Serialize;

use super::plot;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::trio_ml::host::{port_channels, HostError, Received, Worker, WorkerConfig};
use crate::microcode::trio_ml::{
    wire, JobConfig, TrioMl, TrioMlConfig, DEFAULT_SCAN_PERIOD_NS, DEFAULT_TIMERS,
};
use crate::packet::{Dest, Port};
use crate::pfe::Pfe;
use crate::rng::mix;
use crate::timer::{Clock, ManualClock};

/// The job id every experiment uses.
mod fig13;
mod fig14;
mod fig15;
mod fig16;
mod rate;

pub use fig13::{fig13, Fig13Config, Fig13Report, Fig13Row, TrainingRun};
pub use fig14::{fig14, Fig14Config, Fig14Report, Fig14Row, FIG14_SCAN_PERIOD_NS, FIG14_SLACK_NS};
pub use fig15::{fig15, Fig15Config, Fig15Report};
pub use fig16::{fig16, Fig16Config, Fig16Report};
pub use rate::{RateJob, RatePoint};

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
#[non_exhaustive]
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

impl Error for ExperimentError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        match self {
            ExperimentError::Host(e) => Some(e),
            _ => None,
        }
    }
}

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
    fn draw(&self, path: &Path) -> Result<(), crate::lab::bench::PlotError>;
    /// A readable table of the points, with the key figure.
    fn table(&self) -> String;
    /// Every Result arrived and had the right sums.
    fn verified(&self) -> bool;
}

/// A claim of a paper beside what a run of its experiment measured (the fabric and pipeline
/// experiments list theirs).
#[derive(Clone, Debug, Serialize)]
pub struct Claim {
    /// What is compared.
    pub what: String,
    /// The paper's figure.
    pub paper: String,
    /// This run's.
    pub measured: String,
}

/// The files [`write_files`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct Written {
    /// `DIR/<name>.csv`.
    pub csv: PathBuf,
    /// `DIR/<name>.svg`.
    pub svg: PathBuf,
    /// Where an earlier run's files at those paths were moved (`DIR/<name>.1.csv` ...).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<PathBuf>,
}

/// Writes `DIR/<name>.csv` and `DIR/<name>.svg` for `fig`, creating `dir` if needed; an
/// earlier run's files there are moved aside, not overwritten ([`plot::keep_earlier`];
/// [`Written::kept`] says where).
pub fn write_files<F: Figure>(fig: &F, dir: &Path) -> Result<Written, ExperimentError> {
    std::fs::create_dir_all(dir).map_err(|e| {
        ExperimentError::Output(format!("cannot create directory {}: {e}", dir.display()))
    })?;
    let kept = plot::keep_earlier(dir, fig.name(), &[".csv", ".svg"])
        .map_err(|e| ExperimentError::Output(format!("keeping the earlier run's files: {e}")))?;
    let csv = dir.join(format!("{}.csv", fig.name()));
    let svg = dir.join(format!("{}.svg", fig.name()));
    plot::csv(&csv, &fig.csv_header(), &fig.csv_rows())
        .map_err(|e| ExperimentError::Output(format!("{}: {e}", csv.display())))?;
    fig.draw(&svg)
        .map_err(|e| ExperimentError::Output(format!("{}: {e}", svg.display())))?;
    Ok(Written { csv, svg, kept })
}

// ----- shared machinery ----------------------------------------------------------------------

/// Gradient `i` of source `src` in round `round`: an integer in [-2^19, 2^19).
fn gradient(seed: u64, src: u8, round: u64, i: usize) -> i32 {
    let h = mix(seed ^ mix((u64::from(src) << 56) ^ (round << 32) ^ i as u64));
    (h >> 44) as i32 - (1 << 19)
}

/// Source `src`'s `n` gradients of round `round`.
pub(crate) fn gradients(seed: u64, src: u8, round: u64, n: usize) -> Vec<i32> {
    (0..n).map(|i| gradient(seed, src, round, i)).collect()
}

/// The sums over every source in `srcs`.
pub(crate) fn sums_of(seed: u64, srcs: &[u8], round: u64, n: usize) -> Vec<i32> {
    let mut s = vec![0i32; n];
    for &src in srcs {
        for (i, a) in s.iter_mut().enumerate() {
            *a = a.wrapping_add(gradient(seed, src, round, i));
        }
    }
    s
}

/// Checks one allreduce's Results against exactly what each says it holds: a chunk's sums
/// are those of `src_cnt` of the workers' gradients of round `round` (the others' left
/// out: some set of `workers - src_cnt` sources, which the Result does not name), and it
/// is degraded exactly when `src_cnt` is short of all workers; a complete chunk so has the
/// exact sums of every worker. Or the chunk is lost (the aggregator said its generation
/// was gone), with no sources and zero sums. A partial Result is consistent, not wrong:
/// the caller counts those apart ([`Worker::stats`]).
pub(crate) fn verify_allreduce(w: &Worker, seed: u64, workers: u8, round: u64) -> bool {
    let n = w.sums().len();
    let g = w.config().grads_per_packet;
    let all: Vec<Vec<i32>> = (0..workers).map(|s| gradients(seed, s, round, n)).collect();
    let full = sums_of(seed, &(0..workers).collect::<Vec<_>>(), round, n);
    let without = |missing: u64, i: usize| {
        (0..workers)
            .filter(|&s| missing & 1 << s != 0)
            .fold(full[i], |a, s| a.wrapping_sub(all[usize::from(s)][i]))
    };
    w.is_done()
        && w.src_counts().iter().enumerate().all(|(c, &cnt)| {
            let range = c * g..((c + 1) * g).min(n);
            let sums = &w.sums()[range.clone()];
            if w.lost()[c] {
                return cnt == 0 && w.degraded()[c] && sums.iter().all(|&v| v == 0);
            }
            (1..=workers).contains(&cnt)
                && w.degraded()[c] == (cnt < workers)
                && sets_of(workers, workers - cnt)
                    .any(|m| range.clone().zip(sums).all(|(i, &v)| without(m, i) == v))
        })
}

/// Every set of `k` of the sources `0..n` (n at most 63), as a bit mask, in increasing
/// order (Gosper's hack): one, the empty set, when `k` is 0.
pub(crate) fn sets_of(n: u8, k: u8) -> impl Iterator<Item = u64> {
    let end = 1u64 << n.min(63);
    let first = (1u64 << k.min(63)) - 1;
    std::iter::successors((first < end || k == 0).then_some(first), move |&m| {
        if m == 0 {
            return None;
        }
        let low = m & m.wrapping_neg();
        let r = m + low;
        let next = (((r ^ m) >> 2) / low) | r;
        (next < end).then_some(next)
    })
}

/// A running PFE with Trio-ML and one job of `workers` sources on ports `0..workers`,
/// Results multicast to all of them; and the channels the Results arrive on, by port.
struct Rig {
    pfe: Pfe,
    rxs: Vec<Receiver<Vec<u8>>>,
}

#[derive(Clone, Debug)]
struct RigConfig {
    workers: u8,
    window: usize,
    grads: u16,
    block_exp_ms: u8,
    /// `(timers, scan_period_ns)` to run the straggler scan; `None`: no timer threads.
    timers: Option<(u32, u64)>,
    ppe_threads: usize,
    /// The engine's clock when it is not the system's: a [`ManualClock`] the experiment
    /// moves itself ([`run_virtual`]).
    clock: Option<Arc<ManualClock>>,
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
    if let Some(clock) = c.clock {
        b = b.clock(clock);
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

impl Timed {
    fn new(worker: Worker) -> Timed {
        let chunks = worker.chunks();
        Timed {
            worker,
            sent_ns: vec![0; chunks],
            arrived_ns: vec![0; chunks],
        }
    }

    /// Records that `packet` (one of the worker's) was sent at `now`.
    fn sent(&mut self, packet: &[u8], now: u64) {
        let (window, first_gen) = (self.worker.config().window, self.worker.config().first_gen);
        if let Ok((h, _)) = wire::parse(packet) {
            let c = usize::from(h.gen_id.wrapping_sub(first_gen)) * window + h.block_id as usize;
            if let Some(s) = self.sent_ns.get_mut(c) {
                *s = now;
            }
        }
    }

    /// Hands `frame` to the worker at `now`; whether it settled a chunk (its Result, or
    /// the news that its generation is gone), whose arrival is then recorded.
    fn take(&mut self, frame: &[u8], now: u64) -> Result<bool, HostError> {
        if let Received::Result { chunk } | Received::Lost { chunk } =
            self.worker.on_frame_at(frame, now)?
        {
            self.arrived_ns[chunk] = now;
            return Ok(true);
        }
        Ok(false)
    }
}

fn ns_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// Like [`drive`], on a clock shared by all workers, recording per chunk when it was sent
/// (once the PFE took it) and when its Result arrived.
fn drive_timed(
    worker: Worker,
    port: Port,
    inject: &Injector<'_>,
    rx: &Receiver<Vec<u8>>,
    base: Instant,
) -> Result<Timed, HostError> {
    let mut t = Timed::new(worker);
    let mut out = Vec::new();
    let mut last_progress = Instant::now();
    while !t.worker.is_done() {
        t.worker.poll(ns_since(base), &mut out);
        for p in out.drain(..) {
            inject.inject(port, &p);
            t.sent(&p, ns_since(base));
        }
        match rx.recv_timeout(Duration::from_millis(5)) {
            Ok(frame) => {
                for f in std::iter::once(frame).chain(rx.try_iter()) {
                    if t.take(&f, ns_since(base))? {
                        last_progress = Instant::now();
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(HostError::TimedOut {
                    missing: t.worker.missing(),
                })
            }
        }
        if last_progress.elapsed() > GIVE_UP {
            return Err(HostError::TimedOut {
                missing: t.worker.missing(),
            });
        }
    }
    Ok(t)
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

/// Like [`run_timed`], on the rig's [`ManualClock`], moved by this function alone, all on
/// the calling thread: at each reading every worker sends what it may, the engine drains,
/// the Results that came out are taken at that reading, and the clock moves on by
/// `step_ns` with the timer launches due by then run to completion
/// ([`Pfe::settle_timers`]). The same run gives the same times on any machine: they are
/// the timer logic's alone (the engine's own latency reads as 0). Gives up when the clock
/// passes `limit_ns` with a worker not done.
fn run_virtual(
    rig: &Rig,
    clock: &ManualClock,
    workers: Vec<(Worker, Port)>,
    step_ns: u64,
    limit_ns: u64,
) -> Result<Vec<Timed>, ExperimentError> {
    let inject = Injector {
        pfe: &rig.pfe,
        failed: AtomicBool::new(false),
    };
    let mut runs: Vec<(Timed, Port)> = workers
        .into_iter()
        .map(|(w, port)| (Timed::new(w), port))
        .collect();
    let mut out = Vec::new();
    loop {
        let now = clock.now_ns();
        for (t, port) in &mut runs {
            t.worker.poll(now, &mut out);
            for p in out.drain(..) {
                inject.inject(*port, &p);
                t.sent(&p, now);
            }
        }
        inject.check()?;
        rig.pfe.drain();
        for (t, port) in &mut runs {
            for f in rig.rxs[usize::from(*port)].try_iter() {
                t.take(&f, now)?;
            }
        }
        if let Some((t, _)) = runs.iter().find(|(t, _)| !t.worker.is_done()) {
            if now >= limit_ns {
                return Err(HostError::TimedOut {
                    missing: t.worker.missing(),
                }
                .into());
            }
        } else {
            return Ok(runs.into_iter().map(|(t, _)| t).collect());
        }
        clock.advance(step_ns);
        rig.pfe.settle_timers();
    }
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

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
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
    fn sets_of_lists_every_set_of_k_sources_once() {
        assert_eq!(sets_of(4, 0).collect::<Vec<_>>(), [0]);
        assert_eq!(sets_of(3, 1).collect::<Vec<_>>(), [0b001, 0b010, 0b100]);
        assert_eq!(
            sets_of(4, 2).collect::<Vec<_>>(),
            [0b0011, 0b0101, 0b0110, 0b1001, 0b1010, 0b1100]
        );
        assert_eq!(sets_of(3, 3).collect::<Vec<_>>(), [0b111]);
        assert_eq!(sets_of(32, 1).count(), 32);
        assert_eq!(sets_of(2, 3).count(), 0);
    }

    /// Worker 0 of 3 (2 chunks of 4 gradients, both outstanding), given a Result per chunk:
    /// `(src_cnt, degraded, sums)`.
    fn worker_given(results: [(u8, bool, Vec<i32>); 2]) -> Worker {
        let (seed, round) = (5, 2);
        let mut w = Worker::new(worker_config(0, 4, 2, 0), gradients(seed, 0, round, 8)).unwrap();
        w.poll(0, &mut Vec::new());
        for (block, (src_cnt, degraded, sums)) in results.into_iter().enumerate() {
            let frame = wire::agg_packet(&wire::AggPacket {
                endpoints: wire::Endpoints {
                    src_mac: [2, 0, 0, 0, 0, 0xFE],
                    dst_mac: [1, 0, 0x5E, 0, 0, 1],
                    src_addr: TrioMlConfig::default().local_addr,
                    dst_addr: std::net::Ipv4Addr::new(239, 0, 0, 1),
                    src_port: wire::DEFAULT_UDP_PORT,
                    dst_port: wire::DEFAULT_UDP_PORT,
                },
                hdr: wire::TrioMlHdrFields {
                    job_id: JOB,
                    block_id: block as u32,
                    src_cnt,
                    degraded,
                    grad_cnt: 4,
                    ..Default::default()
                },
                gradients: &sums,
            });
            assert!(matches!(w.on_frame(&frame), Ok(Received::Result { .. })));
        }
        w
    }

    /// Chunk `c`'s sums over `srcs` (seed 5, round 2).
    fn chunk_sums(srcs: &[u8], c: usize) -> Vec<i32> {
        sums_of(5, srcs, 2, 8)[c * 4..(c + 1) * 4].to_vec()
    }

    #[test]
    fn an_allreduce_verifies_exact_complete_and_consistent_partial_results_only() {
        let check = |results| verify_allreduce(&worker_given(results), 5, 3, 2);
        let complete = |c| (3, false, chunk_sums(&[0, 1, 2], c));
        // Both complete, or the second partial without source 1 (any source may be the one
        // missing): verified.
        assert!(check([complete(0), complete(1)]));
        assert!(check([complete(0), (2, true, chunk_sums(&[0, 2], 1))]));
        assert!(check([complete(0), (1, true, chunk_sums(&[1], 1))]));
        // A lane off by one.
        let mut off = chunk_sums(&[0, 1, 2], 0);
        off[3] = off[3].wrapping_add(1);
        assert!(!check([(3, false, off), complete(1)]));
        // Partial sums presented as complete, with or without the degraded bit.
        assert!(!check([complete(0), (3, false, chunk_sums(&[0, 2], 1))]));
        assert!(!check([complete(0), (3, true, chunk_sums(&[0, 2], 1))]));
        // A partial Result whose sums are not those of as many sources as it says.
        assert!(!check([complete(0), (2, true, chunk_sums(&[0], 1))]));
        assert!(!check([complete(0), (2, true, chunk_sums(&[0, 1, 2], 1))]));
        // Short of sources but not marked degraded; no sources at all.
        assert!(!check([complete(0), (2, false, chunk_sums(&[0, 2], 1))]));
        assert!(!check([complete(0), (0, true, vec![0; 4])]));
    }

    #[test]
    fn gradients_are_small_and_reproducible() {
        let a = gradients(7, 1, 2, 1000);
        assert_eq!(a, gradients(7, 1, 2, 1000));
        assert_ne!(a, gradients(7, 2, 2, 1000));
        assert!(a.iter().all(|&v| (-(1 << 19)..(1 << 19)).contains(&v)));
    }
}
