//! The timer benchmark: launch jitter of N staggered timers on the real clock, with the
//! PPE threads idle or busy with filter traffic.
//!
//! Each timer thread records how late it started: the engine clock when its thread began
//! minus the time its launch was scheduled for. That covers the launcher's sleep overshoot,
//! the hand-off through dispatch and, when all PPE threads are busy, the wait for one to
//! finish its batch (a timer thread never preempts a packet).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use serde::Serialize;

use super::traffic::{Traffic, TrafficSpec};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::Filter;
use crate::pfe::{Discard, Pfe};
use crate::program::{Done, Entry, Program, Verdict};
use crate::timer::TimerSpec;
use crate::ConfigError;

/// One timer benchmark configuration; as command-line options, those of `pfemu bench
/// timers` (defaults from [`TimerBenchConfig::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct TimerBenchConfig {
    /// Staggered timers (the paper's N; it uses 100), at most 1024.
    #[arg(long, default_value_t = TimerBenchConfig::default().timers)]
    pub timers: u32,
    /// Each timer's period, in nanoseconds (launches come every `period_ns / timers`);
    /// given in milliseconds as `--period-ms`.
    #[arg(long = "period-ms", value_name = "MS", value_parser = super::settings::parse_millis_as_ns,
          default_value = super::settings::ns_as_millis_text(TimerBenchConfig::default().period_ns),
          help = "Each timer's period in milliseconds (launches come every period / timers)")]
    pub period_ns: u64,
    /// How long to run, in milliseconds; given in seconds as `--seconds`.
    #[arg(long = "seconds", value_name = "SECONDS", value_parser = super::settings::parse_secs_as_ms,
          default_value = super::settings::ms_as_secs_text(TimerBenchConfig::default().duration_ms),
          help = "Seconds to run")]
    pub duration_ms: u64,
    /// PPE threads [default: available cores].
    #[arg(long, default_value_t = TimerBenchConfig::default().ppe_threads, hide_default_value = true)]
    pub ppe_threads: usize,
    /// Offer filter traffic (64-byte frames, as fast as the engine takes them) meanwhile.
    #[arg(long)]
    pub load: bool,
}

impl Default for TimerBenchConfig {
    /// 100 timers of period 10 ms for 2 s, PPE threads = cores, no load.
    fn default() -> Self {
        TimerBenchConfig {
            timers: 100,
            period_ns: 10_000_000,
            duration_ms: 2_000,
            ppe_threads: crate::pfe::default_ppe_threads(),
            load: false,
        }
    }
}

/// What one run measured.
#[derive(Clone, Debug, Serialize)]
pub struct TimerBenchReport {
    /// The configuration measured.
    pub config: TimerBenchConfig,
    /// Launches handed to dispatch.
    pub launches: u64,
    /// Launches skipped because the timer's previous thread had not finished.
    pub overruns: u64,
    /// Periods skipped because the launcher woke up more than a period late.
    pub missed: u64,
    /// Launch lateness percentiles, in microseconds.
    pub jitter_p50_us: f64,
    /// 99th percentile.
    pub jitter_p99_us: f64,
    /// Largest.
    pub jitter_max_us: f64,
    /// Packets forwarded meanwhile (0 without load).
    pub packets_out: u64,
    /// Packet rate meanwhile, in Mpps.
    pub mpps: f64,
}

/// The most timers the benchmark staggers (`--timers`): ten times the paper's 100.
pub const MAX_TIMERS: u32 = 1024;

/// Runs one configuration.
pub fn run(cfg: &TimerBenchConfig) -> Result<TimerBenchReport, ConfigError> {
    if !(1..=MAX_TIMERS).contains(&cfg.timers) {
        return Err(ConfigError::new(
            "timers",
            format!("{} is out of range; accepted 1..={MAX_TIMERS}", cfg.timers),
        ));
    }
    let lateness: Arc<Mutex<Vec<u64>>> = Arc::new(Mutex::new(Vec::with_capacity(1 << 16)));
    let mem = Arc::new(SharedMemory::new(&MemConfig::default())?);
    let filter = Filter::install(&mem).map_err(|e| ConfigError::new("memory", e.to_string()))?;
    let program = with_timer_entry(&filter, lateness.clone());
    let mut pfe = Pfe::builder()
        .program(program)
        .ppe_threads(cfg.ppe_threads)
        .memory(mem)
        .sink(Arc::new(Discard))
        .timers(TimerSpec::staggered(0, cfg.timers, cfg.period_ns, 0)?)
        .build()?;
    let traffic = if cfg.load {
        Some(Traffic::generate(&TrafficSpec {
            packets: 1 << 16,
            ..TrafficSpec::default()
        })?)
    } else {
        None
    };
    pfe.start()
        .map_err(|e| ConfigError::new("engine", e.to_string()))?;
    let start = Instant::now();
    let run_for = Duration::from_millis(cfg.duration_ms);
    while start.elapsed() < run_for {
        match &traffic {
            Some(t) => {
                let _ = pfe.inject_burst((0..t.len()).map(|i| (t.port(i), t.frame(i))));
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let stats = pfe.shutdown();
    let mut late = std::mem::take(&mut *lateness.lock());
    late.sort_unstable();
    let pct = |p: f64| -> f64 {
        if late.is_empty() {
            0.0
        } else {
            let i = ((late.len() - 1) as f64 * p).round() as usize;
            late[i] as f64 / 1e3
        }
    };
    Ok(TimerBenchReport {
        config: cfg.clone(),
        launches: stats.timer_launches,
        overruns: stats.timer_overruns,
        missed: stats.timer_missed,
        jitter_p50_us: pct(0.5),
        jitter_p99_us: pct(0.99),
        jitter_max_us: pct(1.0),
        packets_out: stats.packets_out,
        mpps: stats.packets_out as f64 / elapsed / 1e6,
    })
}

/// The filter program plus a timer entry that records its launch's lateness.
fn with_timer_entry(filter: &Filter, lateness: Arc<Mutex<Vec<u64>>>) -> Program {
    let mut p = filter.builder();
    let tick = p.label("record_lateness");
    p.instr(tick, move |t| {
        let l = t.timer().expect("a timer thread");
        lateness
            .lock()
            .push(t.now_ns().saturating_sub(l.scheduled_ns));
        Ok(Done(Verdict::Consume))
    });
    p.entry(Entry::Timer(0), tick);
    p.build().expect("the filter with a timer entry builds")
}
