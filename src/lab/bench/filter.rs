//! The filter benchmark: the paper's filter on pre-generated traffic through the full PFE.
//!
//! Traffic is generated before the clock starts (a pool of up to [`POOL_MAX`] frames,
//! replayed until `packets` frames have been offered, or for `duration_s`); the clock runs
//! from the first injected frame until the engine has drained, so every packet counted has
//! left. The report carries the common [`Summary`] (rates, drops, latency, PPE load, the
//! plain loop's rate and the emulator's overhead against it).

use crate::pfe::Stats;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::report::{RunLength, Summary};
use super::traffic::{FrameClass, Traffic, TrafficSpec};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::{Filter, FilterCounts};
use crate::pfe::{CountingSink, Pfe};
use crate::ConfigError;

use super::EngineSettings;

/// Most distinct frames generated for one run; longer runs replay them.
pub const POOL_MAX: usize = 1 << 20;

/// Most frames the plain loop runs over ([`plain_loop_mpps`]).
pub const PLAIN_LOOP_MAX: u64 = 1 << 24;

/// One benchmark configuration; as command-line options, those of `pfemu run` and
/// `pfemu bench filter` (defaults from [`FilterBenchConfig::default`]).
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FilterBenchConfig {
    /// The engine.
    #[serde(flatten)]
    #[command(flatten)]
    pub engine: EngineSettings,
    /// Frames to offer.
    #[arg(long, default_value_t = FilterBenchConfig::default().packets)]
    pub packets: u64,
    /// Frame size in bytes (64..=9216).
    #[arg(long, default_value_t = FilterBenchConfig::default().size)]
    pub size: usize,
    /// Distinct flows (IPv4 5-tuples).
    #[arg(long, default_value_t = FilterBenchConfig::default().flows)]
    pub flows: u32,
    /// Seed of the traffic generator.
    #[arg(long, default_value_t = FilterBenchConfig::default().seed)]
    pub seed: u64,
    /// Offer frames for this many seconds instead of `packets` frames (`--duration`).
    #[arg(long = "duration", value_name = "SECONDS", value_parser = super::settings::parse_secs,
          help = "Offer frames for this many seconds instead of --packets frames")]
    pub duration_s: Option<f64>,
}

impl Default for FilterBenchConfig {
    /// 10M 64-byte frames over 1024 flows, the default [`EngineSettings`] (PPE threads =
    /// cores, reordering on, latency measured).
    fn default() -> Self {
        FilterBenchConfig {
            engine: EngineSettings::default(),
            packets: 10_000_000,
            size: 64,
            flows: 1024,
            seed: 1,
            duration_s: None,
        }
    }
}

impl FilterBenchConfig {
    /// Distinct frames the run generates and replays: `packets`, at most [`POOL_MAX`].
    pub fn pool_frames(&self) -> usize {
        usize::try_from(self.packets)
            .unwrap_or(usize::MAX)
            .min(POOL_MAX)
    }

    /// How long a run goes on; refuses a `duration_s` that is not a positive number of
    /// seconds up to [`crate::duration::MAX_SECS`].
    pub fn length(&self) -> Result<RunLength, ConfigError> {
        Ok(match self.duration_s {
            Some(s) => RunLength::Duration(crate::duration::secs_setting("duration", s)?),
            None => RunLength::Packets(self.packets),
        })
    }
}

/// The result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct FilterBenchReport {
    /// The configuration measured.
    pub config: FilterBenchConfig,
    /// PPE threads (repeated at top level for scripts).
    pub ppe_threads: usize,
    /// The engine's counters of the run (frames offered `packets_in`, forwarded
    /// `packets_out`, `dropped` and `dropped_by_reason`, `per_ppe_packets`, `reorder_held`,
    /// ...), at the report's top level in JSON.
    #[serde(flatten)]
    pub stats: Stats,
    /// Seconds from the first frame in to the last frame out.
    pub elapsed_s: f64,
    /// Million packets per second offered and fully processed.
    pub mpps: f64,
    /// Gbit/s of frames processed (frame bytes only).
    pub gbps: f64,
    /// Mean instructions per packet.
    pub instructions_per_packet: f64,
    /// Mean XTXNs per packet.
    pub xtxns_per_packet: f64,
    /// The filter's shared-memory counters (non-IP, IP options).
    pub counters: FilterCounts,
    /// Distinct frames in the pool the run replayed (the plain loop runs over the same
    /// pool: one larger than the caches is streamed from memory).
    pub pool_frames: usize,
    /// Counters match the generated traffic exactly and every packet is accounted for.
    pub verified: bool,
    /// The common report: rates in and out, drops, latency, PPE load, the plain loop.
    pub summary: Summary,
}

/// Runs the filter benchmark once.
pub fn run(cfg: &FilterBenchConfig) -> Result<FilterBenchReport, ConfigError> {
    if cfg.packets == 0 {
        return Err(ConfigError::new("packets", "must be at least 1"));
    }
    cfg.length()?;
    let spec = TrafficSpec {
        packets: cfg.pool_frames(),
        frame_size: cfg.size,
        flows: cfg.flows,
        seed: cfg.seed,
        ..Default::default()
    };
    let traffic = Traffic::generate(&spec)?;
    run_on(cfg, &traffic)
}

/// Runs the filter benchmark once on pre-generated traffic (replayed to `cfg.packets`).
pub fn run_on(
    cfg: &FilterBenchConfig,
    traffic: &Traffic,
) -> Result<FilterBenchReport, ConfigError> {
    run_with_progress(cfg, traffic, |_, _| {})
}

/// [`run_on`], calling `progress(fraction done, frames offered)` as the run goes on.
pub fn run_with_progress(
    cfg: &FilterBenchConfig,
    traffic: &Traffic,
    mut progress: impl FnMut(f64, u64),
) -> Result<FilterBenchReport, ConfigError> {
    let length = cfg.length()?;
    if cfg.packets == 0 {
        return Err(ConfigError::new("packets", "must be at least 1"));
    }
    if traffic.is_empty() {
        return Err(ConfigError::new("traffic", "no frames to replay"));
    }
    let mem = Arc::new(SharedMemory::new(&MemConfig {
        dram_bytes: 0,
        ..MemConfig::default()
    })?);
    let filter = Filter::install(&mem).map_err(|e| ConfigError::new("memory", e.to_string()))?;
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = cfg
        .engine
        .apply(Pfe::builder())
        .program(filter.program())
        .memory(mem)
        .sink(sink.clone())
        .build()?;
    pfe.start()
        .map_err(|e| ConfigError::new("start", e.to_string()))?;

    let n = traffic.len() as u64;
    let start = Instant::now();
    let frame = |i| (traffic.port(i), traffic.frame(i));
    let offered = length.offer(&pfe, start, traffic.len(), frame, &mut progress)?;
    pfe.drain();
    let elapsed_d = start.elapsed();
    let elapsed = elapsed_d.as_secs_f64();
    let full_rounds = offered / n;
    let rest = (offered % n) as usize;

    let counters = filter
        .counts(pfe.memory())
        .map_err(|e| ConfigError::new("memory", e.to_string()))?;
    let stats = pfe.shutdown();

    // What the counters must say, from the traffic itself. The filter's IP test is
    // EtherType 0x0800, so it counts IPv6 frames as non-IP.
    let expect = |classes: &[FrameClass]| {
        classes.iter().fold((0, 0), |(p, b), &class| {
            let (p_all, b_all) = traffic.count(class);
            let (p_rest, b_rest) = count_prefix(traffic, class, rest);
            (
                p + p_all * full_rounds + p_rest,
                b + b_all * full_rounds + b_rest,
            )
        })
    };
    let verified = counters.non_ip == expect(&[FrameClass::NonIp, FrameClass::Ipv6])
        && counters.ip_options == expect(&[FrameClass::Ipv4Options])
        // The generator makes no frame too short for its IPv4 header.
        && counters.truncated == (0, 0)
        && stats.packets_out == expect(&[FrameClass::Ipv4]).0
        && sink.total_packets() == stats.packets_out
        && stats.is_conserved()
        && stats.in_flight == 0;

    // The frames offered, replayed from the pool (whose sizes may vary).
    let bytes: u64 = full_rounds * traffic.total_bytes()
        + (0..rest)
            .map(|i| traffic.frame(i).len() as u64)
            .sum::<u64>();
    let summary = Summary::from_stats("filter", &stats, elapsed_d, bytes)
        .with_plain_loop(plain_loop_mpps(traffic, offered));
    let processed = stats.processed().max(1) as f64;
    Ok(FilterBenchReport {
        config: cfg.clone(),
        ppe_threads: cfg.engine.ppe_threads,
        pool_frames: traffic.len(),
        elapsed_s: elapsed,
        mpps: stats.packets_in as f64 / elapsed / 1e6,
        gbps: bytes as f64 * 8.0 / elapsed / 1e9,
        instructions_per_packet: stats.instructions_per_packet(),
        xtxns_per_packet: stats.xtxns.values().sum::<u64>() as f64 / processed,
        counters,
        verified,
        summary,
        stats,
    })
}

/// The plain loop: the filter's work on the same frames, one thread, no engine: read the
/// EtherType, and for IPv4 the version and header length; count the non-IP and IP-options
/// frames (packets and bytes) and the frames forwarded. Returns million frames per second
/// over `packets` frames of `traffic`, replayed (at least a million, for a stable figure,
/// and at most [`PLAIN_LOOP_MAX`]: a rate needs no more, and a long run's plain loop would
/// otherwise take half as long again, with no output).
pub fn plain_loop_mpps(traffic: &Traffic, packets: u64) -> f64 {
    let packets = packets.clamp(1 << 20, PLAIN_LOOP_MAX);
    let mut counters = [[0u64; 2]; 2];
    let mut forwarded = 0u64;
    let start = Instant::now();
    let mut done = 0u64;
    while done < packets {
        for f in traffic.iter().take((packets - done) as usize) {
            let f = std::hint::black_box(f);
            let class = if f.len() < 34 || f[12..14] != [0x08, 0x00] {
                Some(0)
            } else if f[14] != 0x45 {
                Some(1)
            } else {
                None
            };
            match class {
                Some(c) => {
                    counters[c][0] += 1;
                    counters[c][1] += f.len() as u64;
                }
                None => forwarded += 1,
            }
        }
        done += (traffic.len() as u64).min(packets - done);
    }
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    std::hint::black_box((counters, forwarded));
    packets as f64 / secs / 1e6
}

fn count_prefix(traffic: &Traffic, class: FrameClass, n: usize) -> (u64, u64) {
    (0..n)
        .filter(|&i| traffic.class(i) == class)
        .fold((0, 0), |(p, b), i| {
            (p + 1, b + traffic.frame(i).len() as u64)
        })
}
