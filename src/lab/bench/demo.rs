//! The default job of `pfemu`: a Trio-ML demo. Four workers allreduce real `f32` vectors
//! through one PFE twice: once all together, once with a straggler that the PFE's timer
//! threads give up on, so the others get a partial result (`degraded`, `src_cnt` 3) after
//! the block timeout instead of waiting. Every sum is checked.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::error::ConfigError;
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::trio_ml::host::{
    port_channels, run_workers, Attached, DriveOptions, Scaling, Worker, WorkerConfig,
};
use crate::microcode::trio_ml::{JobConfig, TrioMl, TrioMlConfig};
use crate::packet::Dest;
use crate::pfe::{Pfe, Stats};
use crate::rng::SplitMix64;
use crate::timer::ManualClock;

/// The longest a demo's straggler may be late (`--straggle-ms`): a minute. The demo runs
/// on the real clock, so it waits that long.
pub const MAX_STRAGGLE_MS: u64 = 60_000;

/// The demo's settings; as command-line options, those of `pfemu demo` (defaults from
/// [`DemoConfig::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct DemoConfig {
    /// Workers (sources) of the job.
    #[arg(long, default_value_t = DemoConfig::default().workers)]
    pub workers: u8,
    /// Gradients in each worker's vector.
    #[arg(long, default_value_t = DemoConfig::default().gradients)]
    pub gradients: usize,
    /// Gradients per packet.
    #[arg(skip = DemoConfig::default().grads_per_packet)]
    pub grads_per_packet: usize,
    /// Packets each worker keeps outstanding.
    #[arg(skip = DemoConfig::default().window)]
    pub window: usize,
    /// Block timeout (the job's `block_exp`), in milliseconds.
    #[arg(long, default_value_t = DemoConfig::default().block_exp_ms)]
    pub block_exp_ms: u8,
    /// How late the straggler is in round 2, in milliseconds (at most 60000: a minute).
    #[arg(long, default_value_t = DemoConfig::default().straggle_ms)]
    pub straggle_ms: u64,
    /// PPE threads.
    #[arg(long, default_value_t = DemoConfig::default().ppe_threads)]
    pub ppe_threads: usize,
    /// Move the engine's clock with the demo's progress instead of running on the real
    /// clock, so that nothing depends on how fast the machine is (for tests): in round 1
    /// the clock stands still (no block can time out), and in round 2 the block timeout
    /// passes once every on-time worker has sent all its packets, and the straggler sends
    /// once the others have their partial results (`straggle_ms` is not used). Needs a
    /// `window` of at least the packets per worker.
    #[arg(skip)]
    pub manual_clock: bool,
}

impl Default for DemoConfig {
    /// 4 workers, 100 000 gradients each in packets of 1024, window 64, a 20 ms timeout,
    /// a straggler 200 ms late, 64 PPE threads.
    fn default() -> Self {
        DemoConfig {
            workers: 4,
            gradients: 100_000,
            grads_per_packet: 1024,
            window: 64,
            block_exp_ms: 20,
            straggle_ms: 200,
            ppe_threads: 64,
            manual_clock: false,
        }
    }
}

impl DemoConfig {
    /// Refuses settings the demo cannot run, naming the setting: fewer than 2 workers, no
    /// gradients or more than memory holds, a zero block timeout, a straggler later than
    /// [`MAX_STRAGGLE_MS`] or too early to be left out (less than 3 block timeouts; not
    /// checked with the manual clock, which does not use it), a window or packet size the
    /// job cannot hold (two slots per block of the window, at most
    /// [`MAX_BLOCK_CNT`](crate::microcode::trio_ml::MAX_BLOCK_CNT) in all; at most
    /// [`MAX_GRAD_CNT`](crate::microcode::trio_ml::wire::MAX_GRAD_CNT) gradients a packet),
    /// or, with the manual clock, a window shorter than a worker's packets. [`run`] checks
    /// first; `pfemu demo` checks before it prints anything.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.workers < 2 {
            return Err(ConfigError::new("workers", "the demo needs at least 2"));
        }
        if self.gradients == 0 {
            return Err(ConfigError::new("gradients", "must be at least 1"));
        }
        crate::limits::check_fits(
            "gradients",
            (self.gradients as u64).saturating_mul(u64::from(self.workers)),
            "gradients (over all workers)",
            BYTES_PER_GRADIENT,
        )?;
        if self.block_exp_ms == 0 {
            return Err(ConfigError::new("block_exp_ms", "must be 1..=255"));
        }
        if self.straggle_ms > MAX_STRAGGLE_MS {
            return Err(ConfigError::new(
                "straggle_ms",
                format!(
                    "{} ms is more than the demo waits for its straggler ({MAX_STRAGGLE_MS} ms)",
                    self.straggle_ms
                ),
            ));
        }
        let shortest = 3 * u64::from(self.block_exp_ms);
        if !self.manual_clock && self.straggle_ms < shortest {
            return Err(ConfigError::new(
                "straggle_ms",
                format!(
                    "{} ms is too short to be left out; the straggler must be late by at \
                     least 3 x the block timeout ({shortest} ms)",
                    self.straggle_ms
                ),
            ));
        }
        let (_, block_grad_max) = self.job_limits()?;
        let chunks = self.gradients.div_ceil(usize::from(block_grad_max));
        if self.manual_clock && self.window < chunks {
            return Err(ConfigError::new(
                "window",
                format!(
                    "{} is less than the {chunks} packets per worker, which the manual clock \
                     needs in flight at once",
                    self.window
                ),
            ));
        }
        Ok(())
    }

    /// The job's `block_cnt_max` (two slots per block of the window) and `block_grad_max`.
    fn job_limits(&self) -> Result<(u16, u16), ConfigError> {
        use crate::microcode::trio_ml::{wire::MAX_GRAD_CNT, MAX_BLOCK_CNT};
        let max_window = usize::from(MAX_BLOCK_CNT / 2);
        let block_cnt_max = match self.window {
            w @ 1.. if w <= max_window => 2 * w as u16,
            w => {
                return Err(ConfigError::new(
                    "window",
                    format!("{w} is out of range; accepted 1..={max_window} (two slots a block)"),
                ))
            }
        };
        let block_grad_max = match self.grads_per_packet {
            g @ 1.. if g <= usize::from(MAX_GRAD_CNT) => g as u16,
            g => {
                return Err(ConfigError::new(
                    "grads_per_packet",
                    format!("{g} is out of range; accepted 1..={MAX_GRAD_CNT}"),
                ))
            }
        };
        Ok((block_cnt_max, block_grad_max))
    }
}

/// What one allreduce round did.
#[derive(Clone, Debug, Serialize)]
pub struct RoundReport {
    /// Time until the last on-time worker had every result.
    pub elapsed_ms: f64,
    /// Results each on-time worker took.
    pub results: u64,
    /// Of those, partial (degraded) ones.
    pub degraded: u64,
    /// Sources in the results (the same for every block of the round).
    pub src_cnt: Vec<u8>,
    /// The largest difference between a worker's averaged gradient and the exact mean of
    /// the contributing workers' `f32` gradients.
    pub max_abs_error: f64,
    /// Every on-time worker got exactly the integer sums of the contributing workers.
    pub sums_exact: bool,
}

/// What the demo did.
#[derive(Clone, Debug, Serialize)]
pub struct DemoReport {
    /// The settings.
    pub config: DemoConfig,
    /// Round 1: every worker on time.
    pub all_in: RoundReport,
    /// Round 2: the last worker straggles.
    pub with_straggler: RoundReport,
    /// The straggler's own round 2: it got the partial result when it woke.
    pub straggler_answered: bool,
    /// The engine's counters at the end.
    pub stats: Stats,
    /// Instructions per aggregated gradient.
    pub instructions_per_gradient: f64,
}

impl DemoReport {
    /// Every check passed.
    pub fn ok(&self) -> bool {
        self.all_in.sums_exact
            && self.with_straggler.sums_exact
            && self.all_in.degraded == 0
            && self.with_straggler.degraded == self.with_straggler.results
            && self.straggler_answered
            && self.stats.is_conserved()
    }
}

/// Deterministic gradient-like values: worker `w`'s vector, roughly normal around 0 with a
/// per-worker scale.
fn gradients(w: u8, n: usize) -> Vec<f32> {
    let mut rng = SplitMix64::new(u64::from(w) + 1);
    let mut u = move || rng.uniform();
    let scale = 0.01 * f64::from(w + 1);
    (0..n)
        .map(|_| ((u() + u() + u() + u() - 2.0) * scale) as f32)
        .collect()
}

/// Memory the demo takes per gradient of one worker's vector, about: the FP32 vector, its
/// scaled integers, the copy each round hands the worker, the worker's sums and the checks.
pub const BYTES_PER_GRADIENT: u64 = 32;

/// With a manual clock: once `all_sent()` (every on-time packet is in; given up on after
/// the workers' own patience), lets the engine finish them, then moves the clock on one
/// scan period at a time, each run to completion, until a block left since then has timed
/// out (`block_exp_ms`, and two periods for the scan to see it idle).
fn time_out_blocks(
    pfe: &Pfe,
    clock: &ManualClock,
    scan_period_ns: u64,
    block_exp_ms: u8,
    all_sent: impl Fn() -> bool,
) {
    let give_up = Instant::now() + DriveOptions::default().give_up_after;
    while !all_sent() && Instant::now() < give_up {
        std::thread::sleep(Duration::from_micros(100));
    }
    pfe.drain();
    let periods = (u64::from(block_exp_ms) * 1_000_000).div_ceil(scan_period_ns) + 2;
    for _ in 0..periods {
        clock.advance(scan_period_ns);
        pfe.settle_timers();
    }
}

/// Runs the demo.
pub fn run(cfg: &DemoConfig) -> Result<DemoReport, super::BenchError> {
    cfg.check()?;
    let n = cfg.workers;
    let (block_cnt_max, block_grad_max) = cfg.job_limits()?;
    let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
    let trio = TrioMl::install(&mem, TrioMlConfig::default())?;
    let sources: Vec<u8> = (0..n).collect();
    trio.add_job(&JobConfig {
        job_id: 1,
        sources: sources.clone(),
        block_cnt_max,
        block_grad_max,
        block_exp_ms: cfg.block_exp_ms,
        out_dest: Dest::Group(0),
        ..JobConfig::default()
    })?;
    let chunks = cfg.gradients.div_ceil(cfg.grads_per_packet) as u64;
    let clock = cfg.manual_clock.then(|| Arc::new(ManualClock::new()));
    let (sink, rxs) = port_channels(usize::from(n));
    let mut builder = Pfe::builder()
        .program(trio.program())
        .ppe_threads(cfg.ppe_threads)
        .memory(mem)
        .multicast_group(0, sources.iter().map(|&s| u16::from(s)).collect::<Vec<_>>())
        .timers(trio.timer_specs()?)
        .sink(Arc::new(sink));
    if let Some(c) = &clock {
        builder = builder.clock(c.clone());
    }
    let mut pfe = builder.build()?;
    pfe.start()?;
    let scan_period_ns = trio.config().scan_period_ns;

    let vectors: Vec<Vec<f32>> = (0..n).map(|w| gradients(w, cfg.gradients)).collect();
    let max_abs = vectors.iter().flatten().fold(0f32, |m, g| m.max(g.abs()));
    let scaling = Scaling::for_range(max_abs, usize::from(n));
    let ints: Vec<Vec<i32>> = vectors
        .iter()
        .map(|v| v.iter().map(|&g| scaling.to_int(g)).collect())
        .collect();
    let mut gens = vec![0u16; usize::from(n)];

    let mut round = |straggler: Option<u8>| -> Result<(RoundReport, bool), super::BenchError> {
        let attached: Vec<Attached> = (0..n)
            .map(|w| {
                let cfg = WorkerConfig {
                    grads_per_packet: cfg.grads_per_packet,
                    window: cfg.window,
                    first_gen: gens[usize::from(w)],
                    ..WorkerConfig::new(1, w, TrioMlConfig::default().local_addr)
                };
                Ok(Attached {
                    worker: Worker::new(cfg, ints[usize::from(w)].clone())?,
                    port: u16::from(w),
                    rx: rxs[usize::from(w)].clone(),
                    opts: DriveOptions::default(),
                })
            })
            .collect::<Result<_, crate::microcode::trio_ml::host::HostError>>()?;
        let start = Instant::now();
        let pfe = &pfe;
        let on_time_sent = AtomicU64::new(0);
        let timed_out = Once::new();
        let inject = |p: u16, f: &[u8]| {
            if Some(p as u8) != straggler {
                on_time_sent.fetch_add(1, Ordering::Relaxed);
            } else if let Some(clock) = &clock {
                // The straggler's first packet waits until the others' blocks timed out.
                timed_out.call_once(|| {
                    let on_time = u64::from(n - 1) * chunks;
                    time_out_blocks(pfe, clock, scan_period_ns, cfg.block_exp_ms, || {
                        on_time_sent.load(Ordering::Relaxed) >= on_time
                    })
                });
            } else if start.elapsed() < Duration::from_millis(cfg.straggle_ms) {
                // The straggler is still computing: its packets wait until it is done.
                std::thread::sleep(Duration::from_millis(cfg.straggle_ms) - start.elapsed());
            }
            let _ = pfe.inject_frame(p, f);
        };
        let done = run_workers(attached, &inject)?;
        Ok(tally(&done, straggler, &ints, &vectors, scaling, &mut gens))
    };
    let (all_in, _) = round(None)?;
    let (with_straggler, straggler_answered) = round(Some(n - 1))?;
    let stats = pfe.shutdown();
    let gradients = 2 * cfg.gradients as u64 * u64::from(n);
    Ok(DemoReport {
        config: cfg.clone(),
        instructions_per_gradient: stats.instructions as f64 / gradients as f64,
        all_in,
        with_straggler,
        straggler_answered,
        stats,
    })
}

/// Checks a round's workers against the sums of the sources that were on time (all but
/// `straggler`), records each worker's next generation in `gens`, and reports the round and
/// whether the straggler got the others' partial sum.
fn tally(
    done: &[Worker],
    straggler: Option<u8>,
    ints: &[Vec<i32>],
    vectors: &[Vec<f32>],
    scaling: Scaling,
    gens: &mut [u16],
) -> (RoundReport, bool) {
    // Every worker sends the same number of gradients.
    let gradients = ints.first().map_or(0, Vec::len);
    let contributors: Vec<usize> = (0..ints.len())
        .filter(|&w| Some(w as u8) != straggler)
        .collect();
    let want: Vec<i32> = (0..gradients)
        .map(|i| contributors.iter().map(|&w| ints[w][i]).sum())
        .collect();
    let mut max_err = 0f64;
    let mut exact = true;
    let mut results = 0;
    let mut degraded = 0;
    let mut src_cnt: Vec<u8> = Vec::new();
    let mut straggler_answered = true;
    let mut elapsed_ns = 0u64;
    for (w, worker) in done.iter().enumerate() {
        gens[w] = worker.next_gen();
        if Some(w as u8) == straggler {
            // It woke after the timeout: its result is the others' partial sum.
            straggler_answered = worker.sums() == want && worker.degraded().iter().all(|&d| d);
            continue;
        }
        exact &= worker.sums() == want;
        elapsed_ns = elapsed_ns.max(worker.finished_ns().unwrap_or(0));
        results += worker.stats().results;
        degraded += worker.stats().degraded;
        for c in worker.src_counts() {
            if !src_cnt.contains(c) {
                src_cnt.push(*c);
            }
        }
        let mean = worker.mean(scaling);
        for (i, m) in mean.iter().enumerate() {
            let exact_mean: f64 = contributors
                .iter()
                .map(|&c| f64::from(vectors[c][i]))
                .sum::<f64>()
                / contributors.len() as f64;
            max_err = max_err.max((f64::from(*m) - exact_mean).abs());
        }
    }
    (
        RoundReport {
            elapsed_ms: elapsed_ns as f64 / 1e6,
            results,
            degraded,
            src_cnt,
            max_abs_error: max_err,
            sums_exact: exact,
        },
        straggler_answered,
    )
}
