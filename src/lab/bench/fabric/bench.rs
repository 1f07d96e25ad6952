//! `pfemu bench fabric`: how fast each architecture simulates, against the traffic alone.

use std::time::Instant;

use serde::Serialize;

use super::{bad, FabricLatencyConfig, MAX_CYCLES};
use crate::fabric::{simulate, Architecture, Depth, FabricConfig, Traffic, TrafficGen};
use crate::lab::bench::experiments::ExperimentError;

// ----- the benchmark -----------------------------------------------------------------------

/// `pfemu bench fabric`: how fast each architecture simulates. As command-line options,
/// those of `pfemu bench fabric`.
#[derive(Clone, Debug, Serialize, clap::Args)]
pub struct FabricBenchConfig {
    /// Ports P.
    #[arg(long, default_value_t = FabricBenchConfig::default().ports, help = "Ports of the switch, P (2 to 64)")]
    pub ports: usize,
    /// Input rate r (uniform Bernoulli).
    #[arg(long, default_value_t = FabricBenchConfig::default().load, help = "Input rate r, uniform Bernoulli traffic, in (0, 1]")]
    pub load: f64,
    /// Measured cycles per architecture.
    #[arg(long, default_value_t = FabricBenchConfig::default().cycles, help = "Cycles per architecture (1 to 1e10)")]
    pub cycles: u64,
}

impl Default for FabricBenchConfig {
    /// 16 ports at r = 0.9, 10^6 cycles.
    fn default() -> Self {
        FabricBenchConfig {
            ports: 16,
            load: 0.9,
            cycles: 1_000_000,
        }
    }
}

/// One architecture's speed.
#[derive(Clone, Debug, Serialize)]
pub struct SpeedRow {
    /// As the paper names it.
    pub architecture: String,
    /// Cycles simulated (window and drain) times ports, per second, on one core.
    pub port_cycles_per_s: f64,
    /// Its speed over the traffic-only loop's.
    pub ratio_to_traffic_only: f64,
}

/// The report of [`fabric_bench`].
#[derive(Clone, Debug, Serialize)]
pub struct FabricBenchReport {
    /// What was run.
    pub config: FabricBenchConfig,
    /// One row per architecture of Figure 11.
    pub rows: Vec<SpeedRow>,
    /// All architectures together: port-cycles per second on one core.
    pub port_cycles_per_s: f64,
    /// A loop that only draws the traffic, the same cycles: port-cycles per second.
    pub traffic_only_port_cycles_per_s: f64,
    /// The time Figure 11's default sweep would take on this machine at these speeds, on
    /// every core (the target: under 2 minutes).
    pub figure_11_estimate_s: f64,
}

/// Runs each architecture for `cycles` cycles on one thread, timing it, and the traffic
/// generator alone, interleaved (traffic, architecture, traffic, ...) so that a slow phase
/// of the machine affects both.
pub fn fabric_bench(cfg: &FabricBenchConfig) -> Result<FabricBenchReport, ExperimentError> {
    FabricConfig::new(Architecture::OqXbar, cfg.ports, Depth::Infinite)
        .validate()
        .map_err(|e| ExperimentError::Option {
            option: "--ports",
            reason: e.reason,
        })?;
    if !(cfg.load > 0.0 && cfg.load <= 1.0) {
        return bad(
            "--load",
            format!("{}: an input rate is in (0, 1]", cfg.load),
        );
    }
    if cfg.cycles == 0 || cfg.cycles > MAX_CYCLES {
        return bad("--cycles", format!("{}: 1 to {MAX_CYCLES}", cfg.cycles));
    }
    let ports = cfg.ports as f64;
    let mut traffic_s = 0.0;
    let mut traffic_cycles = 0u64;
    let mut total_s = 0.0;
    let mut total_cycles = 0u64;
    let mut timed = Vec::new();
    for (i, a) in Architecture::FIGURE_11.iter().enumerate() {
        let t = Instant::now();
        let mut gen = TrafficGen::new(Traffic::Bernoulli, cfg.ports, cfg.load, i as u64)
            .map_err(|e| ExperimentError::Setup(e.to_string()))?;
        let mut cells = Vec::with_capacity(cfg.ports);
        let mut sink = 0u64;
        for _ in 0..cfg.cycles {
            gen.generate(&mut cells);
            sink = sink.wrapping_add(cells.len() as u64);
        }
        std::hint::black_box(sink);
        traffic_s += t.elapsed().as_secs_f64();
        traffic_cycles += cfg.cycles;

        let config = FabricConfig::new(*a, cfg.ports, Depth::Infinite);
        let t = Instant::now();
        let r = simulate(
            &config,
            Traffic::Bernoulli,
            cfg.load,
            0,
            cfg.cycles,
            i as u64,
        )
        .map_err(|e| ExperimentError::Setup(e.to_string()))?;
        let s = t.elapsed().as_secs_f64();
        // A saturated run stops at its backlog bound, without a drain.
        let cycles = r
            .saturated_at
            .map_or(cfg.cycles + r.drain_cycles, |c| c + 1);
        total_s += s;
        total_cycles += cycles;
        timed.push((a.name(), cycles as f64 * ports / s.max(1e-9)));
    }
    let traffic_only = traffic_cycles as f64 * ports / traffic_s.max(1e-9);
    let rows = timed
        .into_iter()
        .map(|(architecture, speed)| SpeedRow {
            architecture,
            port_cycles_per_s: speed,
            ratio_to_traffic_only: speed / traffic_only,
        })
        .collect();
    let per_core = total_cycles as f64 * ports / total_s.max(1e-9);
    // Figure 11's default: 3 traffic models x 11 rates x 12 architectures, each 1.1 x 10^6
    // cycles of 16 ports (and a drain, not counted here).
    let d = FabricLatencyConfig::default();
    let port_cycles = 3.0
        * d.loads.len() as f64
        * 12.0
        * (d.switch.cycles + d.switch.warmup) as f64
        * d.switch.ports as f64;
    Ok(FabricBenchReport {
        config: cfg.clone(),
        rows,
        port_cycles_per_s: per_core,
        traffic_only_port_cycles_per_s: traffic_only,
        figure_11_estimate_s: port_cycles / per_core / d.switch.threads.max(1) as f64,
    })
}

impl FabricBenchReport {
    /// A readable table.
    pub fn table(&self) -> String {
        let mut t = format!(
            "pfemu bench fabric: {p} x {p}, uniform Bernoulli r = {}, {} cycles each, one core\n",
            self.config.load,
            self.config.cycles,
            p = self.config.ports
        );
        t += &format!("{:<10} {:>18} {:>12}\n", "", "port-cycles/s", "vs traffic");
        for r in &self.rows {
            t += &format!(
                "{:<10} {:>18.3e} {:>11.2}x\n",
                r.architecture, r.port_cycles_per_s, r.ratio_to_traffic_only
            );
        }
        t += &format!(
            "{:<10} {:>18.3e}\nall        {:>18.3e}\n",
            "traffic", self.traffic_only_port_cycles_per_s, self.port_cycles_per_s
        );
        t += &format!(
            "Figure 11's default sweep would take about {:.0} s on this machine's cores",
            self.figure_11_estimate_s
        );
        t
    }
}
