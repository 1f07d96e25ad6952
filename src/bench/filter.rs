//! The filter benchmark: the paper's filter on pre-generated traffic through the full PFE.
//!
//! Traffic is generated before the clock starts (a pool of up to [`POOL_MAX`] frames,
//! replayed until `packets` frames have been offered); the clock runs from the first
//! injected frame until the engine has drained, so every packet counted has left.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::traffic::{FrameClass, Traffic, TrafficSpec};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::{Filter, FilterCounts};
use crate::pfe::{CountingSink, Pfe};
use crate::ConfigError;

/// Most distinct frames generated for one run; longer runs replay them.
pub const POOL_MAX: usize = 1 << 20;

/// One benchmark configuration.
#[derive(Clone, Debug, Serialize)]
pub struct FilterBenchConfig {
    /// PPE threads.
    pub ppe_threads: usize,
    /// Frames offered.
    pub packets: u64,
    /// Frame size in bytes.
    pub size: usize,
    /// Distinct flows.
    pub flows: u32,
    /// Per-flow reordering.
    pub reorder: bool,
    /// Packets per dispatch batch.
    pub batch_size: usize,
    /// In-flight capacity.
    pub capacity: usize,
    /// Reorder contexts flows are folded into.
    pub reorder_contexts: usize,
    /// Pin PPE threads to cores.
    pub pin: bool,
    /// Traffic seed.
    pub seed: u64,
}

/// The result of one run.
#[derive(Clone, Debug, Serialize)]
pub struct FilterBenchReport {
    /// The configuration measured.
    pub config: FilterBenchConfig,
    /// PPE threads (repeated at top level for scripts).
    pub ppe_threads: usize,
    /// Frames offered.
    pub packets_in: u64,
    /// Frames forwarded.
    pub packets_out: u64,
    /// Drops over all reasons.
    pub dropped_total: u64,
    /// Drops by reason.
    pub dropped: BTreeMap<String, u64>,
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
    /// Counters match the generated traffic exactly and every packet is accounted for.
    pub verified: bool,
    /// Fewest and most packets one PPE thread processed.
    pub per_ppe_min_max: (u64, u64),
    /// Packets the reorder engine held for an earlier packet of their flow.
    pub reorder_held: u64,
}

/// Runs the filter benchmark once.
pub fn run(cfg: &FilterBenchConfig) -> Result<FilterBenchReport, ConfigError> {
    if cfg.packets == 0 {
        return Err(ConfigError::new("packets", "must be at least 1"));
    }
    let pool = (cfg.packets as usize).min(POOL_MAX);
    let spec = TrafficSpec {
        packets: pool,
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
    let mem = Arc::new(SharedMemory::new(&MemConfig {
        dram_bytes: 0,
        ..MemConfig::default()
    })?);
    let filter = Filter::install(&mem).map_err(|e| ConfigError::new("memory", e.to_string()))?;
    let sink = Arc::new(CountingSink::new(4));
    let mut pfe = Pfe::builder()
        .program(filter.program())
        .memory(mem)
        .ppe_threads(cfg.ppe_threads)
        .reorder(cfg.reorder)
        .batch_size(cfg.batch_size)
        .capacity(cfg.capacity)
        .reorder_contexts(cfg.reorder_contexts)
        .pin_threads(cfg.pin)
        .sink(sink.clone())
        .build()?;
    pfe.start()
        .map_err(|e| ConfigError::new("start", e.to_string()))?;

    let n = traffic.len() as u64;
    let full_rounds = cfg.packets / n;
    let rest = (cfg.packets % n) as usize;
    let start = Instant::now();
    for _ in 0..full_rounds {
        pfe.inject_burst((0..traffic.len()).map(|i| (traffic.port(i), traffic.frame(i))))
            .map_err(|e| ConfigError::new("start", e.to_string()))?;
    }
    pfe.inject_burst((0..rest).map(|i| (traffic.port(i), traffic.frame(i))))
        .map_err(|e| ConfigError::new("start", e.to_string()))?;
    pfe.drain();
    let elapsed = start.elapsed().as_secs_f64();

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
        && stats.packets_out == expect(&[FrameClass::Ipv4]).0
        && sink.total_packets() == stats.packets_out
        && stats.is_conserved()
        && stats.in_flight == 0;

    let bytes: u64 = stats.packets_in * cfg.size as u64;
    let min = stats.per_ppe_packets.iter().copied().min().unwrap_or(0);
    let max = stats.per_ppe_packets.iter().copied().max().unwrap_or(0);
    let processed = stats.processed().max(1) as f64;
    Ok(FilterBenchReport {
        config: cfg.clone(),
        ppe_threads: cfg.ppe_threads,
        packets_in: stats.packets_in,
        packets_out: stats.packets_out,
        dropped_total: stats.dropped,
        dropped: stats.dropped_by_reason.clone(),
        elapsed_s: elapsed,
        mpps: stats.packets_in as f64 / elapsed / 1e6,
        gbps: bytes as f64 * 8.0 / elapsed / 1e9,
        instructions_per_packet: stats.instructions_per_packet(),
        xtxns_per_packet: stats.xtxns.values().sum::<u64>() as f64 / processed,
        counters,
        verified,
        per_ppe_min_max: (min, max),
        reorder_held: stats.reorder_held,
    })
}

fn count_prefix(traffic: &Traffic, class: FrameClass, n: usize) -> (u64, u64) {
    (0..n)
        .filter(|&i| traffic.class(i) == class)
        .fold((0, 0), |(p, b), i| {
            (p + 1, b + traffic.frame(i).len() as u64)
        })
}
