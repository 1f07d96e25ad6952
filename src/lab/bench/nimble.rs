//! The Nimble benchmark: [`crate::microcode::nimble`]'s rate limiter on pre-generated
//! traffic through the full PFE on the real clock, against a plain single-threaded loop
//! doing the limiter's work on the same frames.
//!
//! [`prepare`] generates the traffic before any clock starts: a pool of up to [`POOL_MAX`]
//! plain IPv4/UDP frames of one size over `flows` flows, flow `i` arriving on port
//! `i % classes`, so the frames spread evenly over the classes' ports (class `c` is port
//! `c`). [`run_on`] installs the limiter with every class at `rate_gbps` and the chosen
//! [`Arithmetic`], builds the engine on the real clock ([`crate::timer::SystemClock`], the
//! engine's default, so each refill follows real time) with ADA's controller as the
//! program's timer entry (ADA only: every [`NimbleConfig::controller_period_ns`]), and
//! times two things on the same frames:
//!
//! - the emulator: the clock runs from the first injected frame until the engine has
//!   drained, so every packet counted has left (`mpps`);
//! - the plain loop ([`plain_loop`]): one thread, no engine, the program's four steps over
//!   local class records (`baseline_mpps`).
//!
//! # What the default rate admits
//!
//! The default `rate_gbps` ([`DEFAULT_RATE_GBPS`] per class, 1.4 Gbit/s over the default 4
//! classes) admits about half of what the emulator pushes with ADA on a two-core machine
//! (64-byte frames, 2 PPE threads: 48-50% of 6.7-7.2 Mpps offered), so both verdicts,
//! admit and `rate_exceeded`, run. The share moves with the machine: a faster engine
//! pushes more and the limiter admits less of it, and the other arithmetics, which push
//! more, admit less; the report's `admitted_share` says what it was.
//!
//! # Verified
//!
//! `verified` holds when every packet is accounted for (the engine's counters conserve
//! packets, none in flight, no timer thread faulted), the limiter's admitted packets plus
//! its `rate_exceeded` and `no_class` drops are exactly the frames offered and are all the
//! engine dropped, the sink saw exactly the admitted packets, the plain loop verified too,
//! and every class admitted no more bytes than its bucket allows
//! ([`ClassReport::allowed_bytes`]):
//!
//! ```text
//! allowed = R T (1 + e) + B + n / 1024 + P s
//! ```
//!
//! - `R T`: the class's rate, bytes per second, times the seconds measured (the first
//!   refill only tops up a full bucket, and the class's clock only moves forward, so every
//!   nanosecond is refilled once);
//! - `e`: the refill arithmetic's largest relative excess at the class's rate
//!   ([`refill_excess`]: 0 for `exact`; for the lookup tables, measured over a fine sweep
//!   of times), so a table that rounds the rate up is not taken for a limiter that leaks;
//! - `B`: the bucket's depth (it starts full);
//! - `n / 1024`: a token (1/1024 byte) per packet of the class, the antilog's rounding;
//! - `P s`: the concurrency overdraw of the program's module doc, with `P` PPE threads
//!   and `s`-byte frames: two packets that test the bucket at once may both pass where
//!   there was room for one, at most a frame per thread. The report's `overshoot_share`
//!   (per class, and `max_overshoot_share`) shows how far past `R T (1 + e) + B` a run went.
//!
//! The plain loop's admitted bytes are checked against the same bound without `P s`: it
//! runs on one thread.
//!
//! ```no_run
//! use pfemu::lab::bench::nimble::{run, NimbleBenchConfig};
//!
//! let report = run(&NimbleBenchConfig { packets: 1_000_000, ..Default::default() })?;
//! println!(
//!     "{:.2} Mpps, {:.0}% admitted, {:.2} TCAM lookups per packet",
//!     report.mpps,
//!     report.admitted_share * 100.0,
//!     report.tcam_lookups_per_packet
//! );
//! assert!(report.verified);
//! # Ok::<(), pfemu::ConfigError>(())
//! ```

use std::collections::BTreeMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::report::{RunLength, Summary};
use super::traffic::{Mix, Traffic, TrafficSpec, MAX_FLOWS, MAX_FRAME_SIZE, MIN_FRAME_SIZE};
use super::EngineSettings;
use crate::ada::arith::Op;
use crate::ada::block::{AdaConfig, AdaStats};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::nimble::{
    exact_credit, rate_key, Arithmetic, Nimble, NimbleConfig, NimbleError, MAX_CLASSES,
    MAX_RATE_BPS, TOKEN_FRAC_BITS,
};
use crate::pfe::{CountingSink, Pfe, Stats};
use crate::ConfigError;

/// Most distinct frames generated for one run; longer runs replay them.
pub const POOL_MAX: usize = 1 << 20;
/// Most frames the plain loop runs over (at least a million, for a stable figure).
pub const PLAIN_LOOP_MAX: u64 = 1 << 24;
/// Each class's default rate, Gbit/s (module doc).
pub const DEFAULT_RATE_GBPS: f64 = 0.35;
/// Significant bits of the rate's table under `--arithmetic uniform`: 124 entries, the
/// budget of ADA's 128.
pub const UNIFORM_SIGNIFICANT_BITS: u32 = 2;
/// The port admitted packets leave on (the sink's only port).
pub const OUT_PORT: u16 = 0;

/// Plain IPv4/UDP: the limiter looks at the ingress port and the length only.
const IPV4_ONLY: Mix = Mix {
    ipv4: 100,
    ipv4_options: 0,
    ipv6: 0,
    non_ip: 0,
};

/// How the limiter multiplies rate by time: `--arithmetic` (see [`Arithmetic`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ArithmeticChoice {
    /// A native multiplication (the ideal).
    Exact,
    /// The prior work's uniform log table of the rate (124 entries).
    Uniform,
    /// Nimble's own design: the rate baked in by the control plane at install.
    Static,
    /// ADA's table, kept where the rates are by the controller (a timer entry).
    Ada,
}

impl ArithmeticChoice {
    /// The limiter's [`Arithmetic`]: ADA's settings are the paper's ([`AdaConfig::new`]).
    pub fn arithmetic(self) -> Arithmetic {
        match self {
            ArithmeticChoice::Exact => Arithmetic::Exact,
            ArithmeticChoice::Uniform => Arithmetic::Uniform {
                significant_bits: UNIFORM_SIGNIFICANT_BITS,
            },
            ArithmeticChoice::Static => Arithmetic::Static,
            ArithmeticChoice::Ada => Arithmetic::Ada(AdaConfig::new(Op::Mul)),
        }
    }
}

/// One benchmark configuration; as command-line options, those of `pfemu bench nimble`
/// (defaults from [`NimbleBenchConfig::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct NimbleBenchConfig {
    /// How the refill (rate x time) is multiplied.
    #[arg(long, value_enum, default_value_t = NimbleBenchConfig::default().arithmetic)]
    pub arithmetic: ArithmeticChoice,
    /// Traffic classes: ingress ports 0..classes, each its own token bucket.
    #[arg(long, default_value_t = NimbleBenchConfig::default().classes)]
    pub classes: usize,
    /// Each class's rate, Gbit/s (the default admits about half of what two cores push
    /// with ADA).
    #[arg(long, default_value_t = NimbleBenchConfig::default().rate_gbps)]
    pub rate_gbps: f64,
    /// Each bucket's depth, bytes (the burst a class may send at once).
    #[arg(long, default_value_t = NimbleBenchConfig::default().burst_bytes)]
    pub burst_bytes: u64,
    /// Frames to offer (replayed from a pool of at most a million).
    #[arg(long, default_value_t = NimbleBenchConfig::default().packets)]
    pub packets: u64,
    /// Frame size in bytes, Ethernet header included, FCS excluded (64..=9216).
    #[arg(long, default_value_t = NimbleBenchConfig::default().size)]
    pub size: usize,
    /// Distinct flows (IPv4 5-tuples); flow i arrives on port i % classes.
    #[arg(long, default_value_t = NimbleBenchConfig::default().flows)]
    pub flows: u32,
    /// Seed of the traffic generator.
    #[arg(long, default_value_t = NimbleBenchConfig::default().seed)]
    pub seed: u64,
    /// Offer frames for this many seconds instead of `packets` frames (`--duration`).
    #[arg(long = "duration", value_name = "SECONDS", value_parser = super::settings::parse_secs,
          help = "Offer frames for this many seconds instead of --packets frames")]
    pub duration_s: Option<f64>,
    /// The engine.
    #[serde(flatten)]
    #[command(flatten)]
    pub engine: EngineSettings,
}

impl Default for NimbleBenchConfig {
    /// ADA, 4 classes at [`DEFAULT_RATE_GBPS`] each with a 64 KiB bucket, 5 000 000 frames
    /// of 64 bytes over 1024 flows, seed 1, the default [`EngineSettings`] (PPE threads =
    /// cores, reordering on, latency measured).
    fn default() -> Self {
        NimbleBenchConfig {
            arithmetic: ArithmeticChoice::Ada,
            classes: 4,
            rate_gbps: DEFAULT_RATE_GBPS,
            burst_bytes: NimbleConfig::default().burst_bytes,
            packets: 5_000_000,
            size: 64,
            flows: 1024,
            seed: 1,
            duration_s: None,
            engine: EngineSettings::default(),
        }
    }
}

impl NimbleBenchConfig {
    /// Checks every setting; the error names the setting at fault.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.packets == 0 {
            return Err(ConfigError::new("packets", "must be at least 1"));
        }
        if !(1..=MAX_CLASSES).contains(&self.classes) {
            return Err(ConfigError::new(
                "classes",
                format!("must be in 1..={MAX_CLASSES}, got {}", self.classes),
            ));
        }
        self.rate_bps()?;
        if !(MIN_FRAME_SIZE..=MAX_FRAME_SIZE).contains(&self.size) {
            return Err(ConfigError::new(
                "size",
                format!(
                    "must be in {MIN_FRAME_SIZE}..={MAX_FRAME_SIZE} bytes, got {}",
                    self.size
                ),
            ));
        }
        // Flow i arrives on port i % classes: fewer flows leave classes without traffic.
        if !(self.classes as u64..=u64::from(MAX_FLOWS)).contains(&u64::from(self.flows)) {
            return Err(ConfigError::new(
                "flows",
                format!(
                    "must be in {}..={MAX_FLOWS} (at least one flow per class), got {}",
                    self.classes, self.flows
                ),
            ));
        }
        self.length()?;
        self.nimble_config()?.check()
    }

    /// How long a run goes on; refuses a `duration_s` that is not a positive number of
    /// seconds up to [`crate::duration::MAX_SECS`].
    pub fn length(&self) -> Result<RunLength, ConfigError> {
        Ok(match self.duration_s {
            Some(s) => RunLength::Duration(crate::duration::secs_setting("duration", s)?),
            None => RunLength::Packets(self.packets),
        })
    }

    /// Each class's rate in bits per second; refuses a rate that is not positive or above
    /// [`MAX_RATE_BPS`] (the rate's 32-bit lookup key).
    pub fn rate_bps(&self) -> Result<u64, ConfigError> {
        let max_gbps = MAX_RATE_BPS as f64 / 1e9;
        let bps = self.rate_gbps * 1e9;
        if !(bps.is_finite() && bps >= 8.0 && self.rate_gbps <= max_gbps) {
            return Err(ConfigError::new(
                "rate_gbps",
                format!(
                    "must be from 8e-9 (a byte per second) to {max_gbps:.1} Gbit/s (the rate's \
                     32-bit lookup key), got {}",
                    self.rate_gbps
                ),
            ));
        }
        Ok(bps as u64)
    }

    /// The limiter's settings: every class at `rate_gbps`, admitted packets out of
    /// [`OUT_PORT`], the rest [`NimbleConfig::default`].
    pub fn nimble_config(&self) -> Result<NimbleConfig, ConfigError> {
        Ok(NimbleConfig {
            rates_bps: vec![self.rate_bps()?; self.classes],
            burst_bytes: self.burst_bytes,
            arithmetic: self.arithmetic.arithmetic(),
            out_port: OUT_PORT,
            ..NimbleConfig::default()
        })
    }
}

/// One class's share of a run.
#[derive(Clone, Debug, Serialize)]
pub struct ClassReport {
    /// The class (its ingress port).
    pub class: usize,
    /// Frames offered on its port.
    pub offered_packets: u64,
    /// Their bytes.
    pub offered_bytes: u64,
    /// Frames the limiter admitted (its shared-memory counter).
    pub admitted_packets: u64,
    /// Their bytes.
    pub admitted_bytes: u64,
    /// Admitted Gbit/s over the run.
    pub admitted_gbps: f64,
    /// The refill arithmetic's largest relative excess at the class's rate
    /// ([`refill_excess`]).
    pub refill_excess: f64,
    /// The most bytes the class may admit (module doc:
    /// `R T (1 + e) + B + n/1024 + P s`).
    pub allowed_bytes: f64,
    /// Bytes admitted beyond `R T (1 + e) + B` (negative: below it): what the class leaked
    /// past its rate, the concurrency overdraw.
    pub overshoot_bytes: f64,
    /// `overshoot_bytes / (R T (1 + e))`: the leak as a share of the rate.
    pub overshoot_share: f64,
    /// `admitted_bytes <= allowed_bytes`.
    pub within: bool,
}

/// What the plain loop did.
#[derive(Clone, Debug, Serialize)]
pub struct PlainLoopReport {
    /// Frames run through it.
    pub packets: u64,
    /// Seconds it took.
    pub elapsed_s: f64,
    /// Million frames per second.
    pub mpps: f64,
    /// Frames admitted.
    pub admitted: u64,
    /// Frames dropped as `rate_exceeded`.
    pub rate_exceeded: u64,
    /// Frames dropped as `no_class`.
    pub no_class: u64,
    /// Every frame counted once, and every class within its bucket's bound (no
    /// concurrency allowance: one thread).
    pub verified: bool,
}

/// The result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct NimbleBenchReport {
    /// The configuration measured.
    pub config: NimbleBenchConfig,
    /// The arithmetic's name (`exact`, `uniform`, `static`, `ada`).
    pub arithmetic: &'static str,
    /// PPE threads (repeated at top level for scripts).
    pub ppe_threads: usize,
    /// The engine's counters of the run (frames offered `packets_in`, forwarded
    /// `packets_out`, `dropped` and `dropped_by_reason`, `xtxns`, `timer_runs`, ...), at
    /// the report's top level in JSON.
    #[serde(flatten)]
    pub stats: Stats,
    /// Seconds from the first frame in to the last frame out.
    pub elapsed_s: f64,
    /// Million packets per second offered and fully processed by the emulator.
    pub mpps: f64,
    /// Gbit/s of frames processed (frame bytes only).
    pub gbps: f64,
    /// Frames the limiter admitted (forwarded).
    pub admitted: u64,
    /// Frames dropped as `rate_exceeded`.
    pub rate_exceeded: u64,
    /// Frames dropped as `no_class`.
    pub no_class: u64,
    /// `admitted / packets_in`.
    pub admitted_share: f64,
    /// Gbit/s admitted over all classes.
    pub admitted_gbps: f64,
    /// Per class: offered, admitted, and the bound checked.
    pub classes: Vec<ClassReport>,
    /// The largest [`ClassReport::overshoot_share`]: how far past its rate the leakiest
    /// class went.
    pub max_overshoot_share: f64,
    /// Mean instructions per packet.
    pub instructions_per_packet: f64,
    /// Mean XTXNs per packet, all kinds (the controller's TCAM reads and writes on timer
    /// threads included).
    pub xtxns_per_packet: f64,
    /// Mean XTXNs per packet, by kind.
    pub xtxns_per_packet_by_kind: BTreeMap<String, f64>,
    /// Mean TCAM lookups per packet: 4 per refill under ADA (the rate's monitoring and
    /// table, the time's table, the antilog), 3 under uniform, 2 under static (the rate's
    /// log is in the class record), 0 under exact;
    /// fewer where a packet refills nothing (the same clock reading as the class's last).
    pub tcam_lookups_per_packet: f64,
    /// ADA's controller counters at the end (ADA only; cumulative since install, the
    /// priming epochs included).
    pub ada: Option<AdaStats>,
    /// ADA's controller counters when the clock started (after the priming), so the run's
    /// own epochs, re-populations, reads and writes are the difference.
    pub ada_at_start: Option<AdaStats>,
    /// The plain loop, on the same frames.
    pub plain_loop: PlainLoopReport,
    /// Million packets per second of the plain loop.
    pub baseline_mpps: f64,
    /// `mpps / baseline_mpps`.
    pub ratio_to_baseline: f64,
    /// Every packet accounted for, the limiter's verdicts add up to the frames offered,
    /// the sink saw the admitted packets, every class within its bound, and the plain loop
    /// verified too (module doc).
    pub verified: bool,
    /// The common report: rates in and out, drops, latency, PPE load, the plain loop.
    pub summary: Summary,
}

/// Generates the frame pool of `cfg` (deterministic from the seed).
pub fn prepare(cfg: &NimbleBenchConfig) -> Result<Traffic, ConfigError> {
    cfg.validate()?;
    Traffic::generate(&TrafficSpec {
        packets: usize::try_from(cfg.packets)
            .unwrap_or(usize::MAX)
            .min(POOL_MAX),
        frame_size: cfg.size,
        flows: cfg.flows,
        mix: IPV4_ONLY,
        seed: cfg.seed,
        // Classes are at most MAX_CLASSES, which fits a port.
        ports: u16::try_from(cfg.classes).unwrap_or(u16::MAX),
        ..Default::default()
    })
}

/// Prepares the traffic of `cfg` and runs it once.
pub fn run(cfg: &NimbleBenchConfig) -> Result<NimbleBenchReport, ConfigError> {
    let traffic = prepare(cfg)?;
    run_on(cfg, &traffic)
}

/// Runs prepared traffic (from [`prepare`] with the same classes, size and flows) through
/// the emulator and the plain loop, replayed to `cfg.packets` frames.
pub fn run_on(
    cfg: &NimbleBenchConfig,
    traffic: &Traffic,
) -> Result<NimbleBenchReport, ConfigError> {
    run_with_progress(cfg, traffic, |_, _| {})
}

fn nimble_error(e: NimbleError) -> ConfigError {
    match e {
        NimbleError::Config(c) => c,
        other => ConfigError::new("memory", other.to_string()),
    }
}

/// [`run_on`], calling `progress(fraction done, frames offered)` as the run goes on.
pub fn run_with_progress(
    cfg: &NimbleBenchConfig,
    traffic: &Traffic,
    mut progress: impl FnMut(f64, u64),
) -> Result<NimbleBenchReport, ConfigError> {
    cfg.validate()?;
    let length = cfg.length()?;
    if traffic.is_empty() {
        return Err(ConfigError::new("traffic", "no frames to replay"));
    }
    let mem = Arc::new(SharedMemory::new(&MemConfig {
        dram_bytes: 0,
        ..MemConfig::default()
    })?);
    let nimble = Nimble::install(&mem, cfg.nimble_config()?).map_err(nimble_error)?;
    // Measured before the engine exists: the control side's lookups count table hits,
    // which nothing reads, and no monitoring.
    let excess = refill_excess(&nimble, cfg.rate_bps()? / 8);
    let sink = Arc::new(CountingSink::new(usize::from(OUT_PORT) + 1));
    let mut pfe = cfg
        .engine
        .apply(Pfe::builder())
        .program(nimble.program())
        .memory(mem.clone())
        .timers(nimble.timer_specs()?)
        .sink(sink.clone())
        .build()?;
    pfe.start()
        .map_err(|e| ConfigError::new("start", e.to_string()))?;

    let ada_at_start = nimble.ada_stats();
    let start = Instant::now();
    let frame = |i| (traffic.port(i), traffic.frame(i));
    let offered = length.offer(&pfe, start, traffic.len(), frame, &mut progress)?;
    pfe.drain();
    let elapsed_d = start.elapsed();
    let elapsed = elapsed_d.as_secs_f64();
    let ada = nimble.ada_stats();
    let counts = (0..cfg.classes)
        .map(|c| nimble.counts(&mem, c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(nimble_error)?;
    let stats = pfe.shutdown();

    // What was offered, per class, from the pool replayed.
    let (offered_by_class, bytes) = offered_per_class(traffic, cfg.classes, offered);
    let no_class_offered = offered - offered_by_class.iter().map(|o| o.0).sum::<u64>();
    let rate_bytes = (cfg.rate_bps()? / 8) as f64;
    let threads = cfg.engine.ppe_threads;
    let overdraw = (threads * cfg.size) as f64;
    let classes: Vec<ClassReport> = counts
        .iter()
        .zip(&offered_by_class)
        .enumerate()
        .map(|(class, (c, &(op, ob)))| {
            let bound = Bound {
                rate_bytes,
                secs: elapsed,
                excess,
                burst: cfg.burst_bytes,
                packets: op,
            };
            let allowed = bound.allowed() + overdraw;
            ClassReport {
                class,
                offered_packets: op,
                offered_bytes: ob,
                admitted_packets: c.packets,
                admitted_bytes: c.bytes,
                admitted_gbps: c.bytes as f64 * 8.0 / elapsed.max(1e-9) / 1e9,
                refill_excess: excess,
                allowed_bytes: allowed,
                overshoot_bytes: c.bytes as f64 - bound.limit(),
                overshoot_share: (c.bytes as f64 - bound.limit()) / bound.rate_time().max(1.0),
                within: c.bytes as f64 <= allowed,
            }
        })
        .collect();
    let admitted: u64 = counts.iter().map(|c| c.packets).sum();
    let admitted_bytes: u64 = counts.iter().map(|c| c.bytes).sum();
    let (rate_exceeded, no_class) = (stats.drops("rate_exceeded"), stats.drops("no_class"));

    let plain = plain_loop(
        &nimble,
        traffic,
        cfg,
        offered.clamp(1 << 20, PLAIN_LOOP_MAX),
        excess,
    );

    let verified = stats.is_conserved()
        && stats.in_flight == 0
        && stats.timer_faults == 0
        && stats.packets_in == offered
        && admitted + rate_exceeded + no_class == offered
        && stats.dropped == rate_exceeded + no_class
        && no_class == no_class_offered
        && stats.packets_out == admitted
        && sink.total_packets() == admitted
        && counts
            .iter()
            .all(|c| c.bytes == c.packets * cfg.size as u64)
        && classes.iter().all(|c| c.within)
        && plain.verified;

    let processed = stats.processed().max(1) as f64;
    let mpps = stats.packets_in as f64 / elapsed / 1e6;
    let summary =
        Summary::from_stats("nimble", &stats, elapsed_d, bytes).with_plain_loop(plain.mpps);
    Ok(NimbleBenchReport {
        config: cfg.clone(),
        arithmetic: cfg.arithmetic.arithmetic().name(),
        ppe_threads: cfg.engine.ppe_threads,
        elapsed_s: elapsed,
        mpps,
        gbps: bytes as f64 * 8.0 / elapsed / 1e9,
        admitted,
        rate_exceeded,
        no_class,
        admitted_share: admitted as f64 / offered.max(1) as f64,
        max_overshoot_share: classes
            .iter()
            .map(|c| c.overshoot_share)
            .fold(f64::NEG_INFINITY, f64::max),
        admitted_gbps: admitted_bytes as f64 * 8.0 / elapsed / 1e9,
        classes,
        instructions_per_packet: stats.instructions_per_packet(),
        xtxns_per_packet: stats.xtxns.values().sum::<u64>() as f64 / processed,
        xtxns_per_packet_by_kind: stats
            .xtxns
            .iter()
            .map(|(k, v)| (k.clone(), *v as f64 / processed))
            .collect(),
        tcam_lookups_per_packet: stats.xtxns.get("tcam_lookup").copied().unwrap_or(0) as f64
            / processed,
        ada,
        ada_at_start,
        baseline_mpps: plain.mpps,
        ratio_to_baseline: if plain.mpps > 0.0 {
            mpps / plain.mpps
        } else {
            0.0
        },
        plain_loop: plain,
        verified,
        summary,
        stats,
    })
}

/// Frames and bytes offered per class (`0..classes`) when `offered` frames of the pool
/// are replayed, and the bytes of all of them.
fn offered_per_class(traffic: &Traffic, classes: usize, offered: u64) -> (Vec<(u64, u64)>, u64) {
    let n = traffic.len() as u64;
    let (rounds, rest) = (offered / n, (offered % n) as usize);
    let mut per = vec![(0u64, 0u64); classes];
    let mut bytes = 0u64;
    for i in 0..traffic.len() {
        let times = rounds + u64::from(i < rest);
        let len = traffic.frame(i).len() as u64;
        bytes += times * len;
        if let Some(c) = per.get_mut(usize::from(traffic.port(i))) {
            c.0 += times;
            c.1 += times * len;
        }
    }
    (per, bytes)
}

/// The bound of the module doc without the concurrency allowance.
struct Bound {
    /// The class's rate, bytes per second.
    rate_bytes: f64,
    /// Seconds measured.
    secs: f64,
    /// [`refill_excess`].
    excess: f64,
    /// The bucket's depth, bytes.
    burst: u64,
    /// Frames of the class offered.
    packets: u64,
}

impl Bound {
    /// `R T (1 + e)`: the most the refills add on one thread.
    fn rate_time(&self) -> f64 {
        self.rate_bytes * self.secs * (1.0 + self.excess)
    }

    /// `R T (1 + e) + B`.
    fn limit(&self) -> f64 {
        self.rate_time() + self.burst as f64
    }

    /// [`Bound::limit`] plus a token per packet.
    fn allowed(&self) -> f64 {
        self.limit() + self.packets as f64 / f64::from(1u32 << TOKEN_FRAC_BITS)
    }
}

/// Points per octave of [`refill_excess`]'s sweep.
const SWEEP_STEPS_PER_OCTAVE: u32 = 1024;
/// Octaves of [`refill_excess`]'s sweep: every time the time's table is looked up by, 1 ns
/// to 2^32 ns (a longer time is looked up shifted right into the top octave, its low bits
/// dropped, which only lowers the refill).
const SWEEP_OCTAVES: std::ops::Range<u32> = 0..32;
/// Refills below this many tokens (a byte) are left out of the sweep: their rounding, half
/// a token, is the bound's token per packet.
const SWEEP_MIN_TOKENS: u64 = 1 << TOKEN_FRAC_BITS;
/// Added to the sweep's largest excess, for the times between its points.
const SWEEP_MARGIN: f64 = 1e-3;

/// The largest relative excess of the limiter's refill over the exact product at
/// `bytes_per_s`, `credit / exact - 1` (at least 0; 0 for exact arithmetic), over times
/// swept at 1024 points per octave from 1 ns to 2^32 ns (refills of
/// a byte or more), plus a margin of 0.1%. The rate's table errs by one factor at one
/// rate; the time's table and the antilog's are uniform populations, whose entries span a
/// fixed share of an octave (a 64th for the time, a 256th or 128th for the antilog), so
/// 1024 points per octave meet every entry's worst case to within less than the margin.
/// Runs the lookups from the control side ([`Nimble::credit`]) on the tables as installed:
/// ADA's controller keeps the table fitted to the same, constant rates during a run.
pub fn refill_excess(nimble: &Nimble, bytes_per_s: u64) -> f64 {
    if nimble.config().arithmetic == Arithmetic::Exact {
        return 0.0;
    }
    let mut worst = 0.0f64;
    for octave in SWEEP_OCTAVES {
        for step in 0..SWEEP_STEPS_PER_OCTAVE {
            let at = f64::from(octave) + f64::from(step) / f64::from(SWEEP_STEPS_PER_OCTAVE);
            let dt = at.exp2() as u64;
            let exact = exact_credit(bytes_per_s, dt);
            if exact < SWEEP_MIN_TOKENS {
                continue;
            }
            let got = nimble.credit(bytes_per_s, dt);
            worst = worst.max(got as f64 / exact as f64 - 1.0);
        }
    }
    worst + SWEEP_MARGIN
}

/// One class's record in the plain loop: the program's six words as local state.
#[derive(Clone, Copy, Debug, Default)]
struct PlainClass {
    /// Bytes per second.
    rate: u64,
    /// The bucket's depth, tokens.
    burst: i64,
    /// The last packet's clock reading, ns.
    last: u64,
    /// Tokens (1/1024 byte).
    tokens: i64,
    packets: u64,
    bytes: u64,
}

/// The plain loop: the limiter's per-packet work on `packets` frames of `traffic`
/// (replayed), one thread, no engine, over local class records:
///
/// 1. classify: the class is the ingress port (`no_class` beyond the classes); the rate
///    and depth come from the class's record; the clock is read once per `batch` frames
///    (a PPE thread reads it once per batch) and raised into the record's last time;
/// 2. refill: the same multiplication through the same tables as the program (its
///    [`Nimble`]'s, from the control side: [`Nimble::credit`]'s rate, time and antilog
///    lookups, and under ADA the monitoring lookup too), or the exact product;
/// 3. bucket: add the credit, clamp to the depth, test and take the packet's tokens;
/// 4. admit: count the packet and its bytes.
///
/// Not included: loading a head into local memory (the program reads none of it), the
/// engine's dispatch, reordering and egress, and ADA's controller (no epochs run while
/// the loop does; its table stays as the emulator left it). Returns the rate and checks
/// every class against the bucket's bound with `excess` (module doc), without the
/// concurrency allowance.
pub fn plain_loop(
    nimble: &Nimble,
    traffic: &Traffic,
    cfg: &NimbleBenchConfig,
    packets: u64,
    excess: f64,
) -> PlainLoopReport {
    let ncfg = nimble.config();
    let burst = i64::try_from(ncfg.burst_bytes << TOKEN_FRAC_BITS).unwrap_or(i64::MAX);
    let mut recs: Vec<PlainClass> = ncfg
        .rates_bps
        .iter()
        .map(|&r| PlainClass {
            rate: r / 8,
            burst,
            tokens: burst,
            ..PlainClass::default()
        })
        .collect();
    let monitor = match ncfg.arithmetic {
        Arithmetic::Ada(_) => nimble.ada().map(|a| a.monitor()),
        _ => None,
    };
    let batch = cfg.engine.batch_size.max(1) as u64;
    let (mut rate_exceeded, mut no_class) = (0u64, 0u64);
    let n = traffic.len();
    let start = Instant::now();
    let mut now = 0u64;
    let mut done = 0u64;
    while done < packets {
        let take = (packets - done).min(n as u64) as usize;
        for i in 0..take {
            if (done + i as u64).is_multiple_of(batch) {
                now = start.elapsed().as_nanos() as u64;
            }
            let frame = black_box(traffic.frame(i));
            // 1. classify
            let Some(c) = recs.get_mut(usize::from(traffic.port(i))) else {
                no_class += 1;
                continue;
            };
            let last = c.last;
            c.last = c.last.max(now);
            let dt = now.saturating_sub(last);
            // 2. refill
            let (key, _) = rate_key(c.rate);
            if let (Some(m), true) = (monitor, key != 0 && dt != 0) {
                m.lookup(key);
            }
            let credit = nimble.credit(c.rate, dt) as i64;
            // 3. bucket
            c.tokens = (c.tokens + credit).min(c.burst);
            let need = (frame.len() as i64) << TOKEN_FRAC_BITS;
            if c.tokens < need {
                rate_exceeded += 1;
                continue;
            }
            c.tokens -= need;
            // 4. admit
            c.packets += 1;
            c.bytes += frame.len() as u64;
        }
        done += take as u64;
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    black_box(&recs);
    let admitted: u64 = recs.iter().map(|c| c.packets).sum();
    let (per, _) = offered_per_class(traffic, recs.len(), packets);
    let within = recs.iter().zip(&per).all(|(c, &(op, _))| {
        let bound = Bound {
            rate_bytes: c.rate as f64,
            secs,
            excess,
            burst: ncfg.burst_bytes,
            packets: op,
        };
        c.bytes as f64 <= bound.allowed()
    });
    PlainLoopReport {
        packets,
        elapsed_s: secs,
        mpps: packets as f64 / secs / 1e6,
        admitted,
        rate_exceeded,
        no_class,
        verified: within && admitted + rate_exceeded + no_class == packets,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(arithmetic: ArithmeticChoice) -> NimbleBenchConfig {
        NimbleBenchConfig {
            arithmetic,
            packets: 40_000,
            flows: 64,
            engine: EngineSettings {
                ppe_threads: 2,
                ..EngineSettings::default()
            },
            ..NimbleBenchConfig::default()
        }
    }

    #[test]
    fn small_runs_are_verified_with_every_arithmetic() {
        for a in [
            ArithmeticChoice::Exact,
            ArithmeticChoice::Uniform,
            ArithmeticChoice::Static,
            ArithmeticChoice::Ada,
        ] {
            let r = run(&small(a)).expect("runs");
            assert!(r.verified, "{}: {r:#?}", r.arithmetic);
            assert_eq!(r.stats.packets_in, 40_000);
            assert_eq!(r.admitted + r.rate_exceeded + r.no_class, 40_000);
            assert_eq!(r.classes.len(), 4);
            assert!(r.classes.iter().all(|c| c.offered_packets > 0));
            assert_eq!(r.ada.is_some(), a == ArithmeticChoice::Ada);
            if a == ArithmeticChoice::Exact {
                assert_eq!(r.tcam_lookups_per_packet, 0.0);
            }
        }
    }

    /// The sweep's excess bounds the refill at times it did not visit too (random times up
    /// to 2^32 ns), up to the token of rounding the bound allows.
    #[test]
    fn refill_excess_bounds_the_refill_at_any_time() {
        let mut rng = crate::rng::SplitMix64::new(7);
        for (a, rate_gbps) in [
            (ArithmeticChoice::Exact, 0.25),
            (ArithmeticChoice::Uniform, 0.25),
            (ArithmeticChoice::Uniform, 0.3),
            (ArithmeticChoice::Static, 0.25),
            (ArithmeticChoice::Ada, 0.07),
        ] {
            let cfg = NimbleBenchConfig {
                rate_gbps,
                ..small(a)
            };
            let mem = SharedMemory::new(&MemConfig::default()).expect("memory");
            let n = Nimble::install(&mem, cfg.nimble_config().expect("valid")).expect("installs");
            let rate = cfg.rate_bps().expect("valid") / 8;
            let e = refill_excess(&n, rate);
            match a {
                ArithmeticChoice::Exact => assert_eq!(e, 0.0),
                // Within the uniform population's bound with 2 significant bits; ADA's
                // table is fitted to the rate.
                ArithmeticChoice::Uniform => {
                    assert!((SWEEP_MARGIN..Op::Mul.error_bound(2)).contains(&e), "{e}")
                }
                _ => assert!(e < 0.02, "{e}"),
            }
            for _ in 0..20_000 {
                let dt = rng.below(1 << 32) >> rng.below(32);
                let exact = exact_credit(rate, dt) as f64;
                let got = n.credit(rate, dt) as f64;
                assert!(
                    got <= exact * (1.0 + e) + 1.0,
                    "{rate_gbps} Gbit/s {}: {dt} ns credits {got}, exact {exact}, excess {e}",
                    a.arithmetic().name()
                );
            }
        }
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let good = small(ArithmeticChoice::Ada);
        for (setting, cfg) in [
            (
                "classes",
                NimbleBenchConfig {
                    classes: 0,
                    ..good.clone()
                },
            ),
            (
                "rate_gbps",
                NimbleBenchConfig {
                    rate_gbps: 0.0,
                    ..good.clone()
                },
            ),
            (
                "rate_gbps",
                NimbleBenchConfig {
                    rate_gbps: f64::NAN,
                    ..good.clone()
                },
            ),
            (
                "rate_gbps",
                NimbleBenchConfig {
                    rate_gbps: 1000.0,
                    ..good.clone()
                },
            ),
            (
                "size",
                NimbleBenchConfig {
                    size: 63,
                    ..good.clone()
                },
            ),
            (
                "flows",
                NimbleBenchConfig {
                    flows: 3,
                    ..good.clone()
                },
            ),
            (
                "packets",
                NimbleBenchConfig {
                    packets: 0,
                    ..good.clone()
                },
            ),
            (
                "burst_bytes",
                NimbleBenchConfig {
                    burst_bytes: 0,
                    ..good.clone()
                },
            ),
        ] {
            assert_eq!(prepare(&cfg).expect_err(setting).setting, setting);
        }
    }
}
