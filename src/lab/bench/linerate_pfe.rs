//! The PFE as a device under test for [`super::linerate`]: a running engine with a shipped
//! program, fed by a paced generator, so that `pfemu linerate` and `pfemu latency` measure
//! it the way RFC 2544 measures a router.
//!
//! A trial offers frames at the requested rate in bursts ([`PfeDeviceConfig::burst`] frames,
//! burst `k` due at `k x burst / rate` after the start) with [`Pfe::offer_burst`]: frames
//! that find the engine full are dropped at its input, as a receive ring overflows. The
//! generator stops at the trial's end; frames it had no time to offer count as not offered
//! (the search then fails the rate: the generator, not the device, was the limit). The
//! engine then drains, and the frames that left are the trial's received count. Latency is
//! the engine's own ingress-to-egress measurement over the trial.
//!
//! The traffic is the program's forwarding case, so that every frame the engine accepts
//! should leave: for the filter, plain IPv4/UDP over 1024 flows; for l3fwd, IPv4/UDP to
//! addresses the routes cover. Frames are generated at the
//! full frame size (RFC 2544 sizes count the FCS; here its 4 bytes are carried as payload).
//! The generator runs on the calling thread, which shares the machine with the PPE threads.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::l3fwd;
use super::linerate::{Device, DeviceError, LatencySummary, Trial};
use super::traffic::{Mix, Pacer, Traffic, TrafficSpec};
use crate::mem::{MemConfig, SharedMemory};
use crate::microcode::filter::Filter;
use crate::microcode::l3fwd::L3fwd;
use crate::packet::Port;
use crate::pfe::{CountingSink, Pfe};
use crate::program::Program;
use crate::ConfigError;

/// Frames of one size, by ingress port, ready to offer by reference.
type Pool = Vec<(Port, Arc<[u8]>)>;

/// Distinct frames generated per frame size (replayed).
const POOL_FRAMES: usize = 4096;

/// The program under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum DeviceProgram {
    /// The paper's packet filter, on plain IPv4 traffic (all forwarded).
    Filter,
    /// l3fwd with this many generated routes, on IPv4 traffic to addresses they cover
    /// (all forwarded; `pfemu bench l3fwd`'s workload).
    L3fwd {
        /// Routes generated (with the bench's seed).
        routes: usize,
    },
}

/// How the engine under test is built and fed.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PfeDeviceConfig {
    /// The program.
    pub program: DeviceProgram,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Frames per burst of the generator, 1 to [`MAX_BURST`].
    pub burst: usize,
    /// Distinct flows of the traffic.
    pub flows: u32,
    /// Traffic seed.
    pub seed: u64,
}

impl Default for PfeDeviceConfig {
    /// The filter, PPE threads = cores, bursts of 32 frames, 1024 flows, seed 1.
    fn default() -> Self {
        PfeDeviceConfig {
            program: DeviceProgram::Filter,
            ppe_threads: crate::pfe::default_ppe_threads(),
            burst: 32,
            flows: 1024,
            seed: 1,
        }
    }
}

/// The most frames [`PfeDeviceConfig::burst`] takes: a large NIC receive ring.
pub const MAX_BURST: usize = 4096;

/// A running engine with its program, and the traffic generated so far per frame size.
pub struct PfeDevice {
    cfg: PfeDeviceConfig,
    pfe: Pfe,
    pools: HashMap<usize, Pool>,
}

impl PfeDevice {
    /// Builds and starts the engine.
    pub fn new(cfg: PfeDeviceConfig) -> Result<PfeDevice, ConfigError> {
        if !(1..=MAX_BURST).contains(&cfg.burst) {
            return Err(ConfigError::new(
                "burst",
                format!(
                    "{} frames is out of range; accepted 1..={MAX_BURST} (a receive ring's worth)",
                    cfg.burst
                ),
            ));
        }
        let (mem, program, ports): (_, Program, usize) = match cfg.program {
            DeviceProgram::Filter => {
                let mem = Arc::new(SharedMemory::new(&MemConfig {
                    dram_bytes: 0,
                    ..MemConfig::default()
                })?);
                let filter =
                    Filter::install(&mem).map_err(|e| ConfigError::new("memory", e.to_string()))?;
                (mem, filter.program(), crate::pfe::DEFAULT_PORTS)
            }
            DeviceProgram::L3fwd { .. } => {
                let w = l3fwd::prepare(&l3fwd_config(&cfg, 64))?;
                let mem = Arc::new(SharedMemory::new(&MemConfig {
                    dram_bytes: MemConfig::default()
                        .dram_bytes
                        .max(w.table().dram_bytes().next_multiple_of(64)),
                    sram_bytes: MemConfig::default()
                        .sram_bytes
                        .max((w.table().sram_bytes() + 64).next_multiple_of(64)),
                    acc_bytes: 0,
                    ..MemConfig::default()
                })?);
                let l3 = L3fwd::install_table(&mem, w.table())
                    .map_err(|e| ConfigError::new("memory", e.to_string()))?;
                (mem, l3.program(), usize::from(w.ports()))
            }
        };
        let mut pfe = Pfe::builder()
            .program(program)
            .memory(mem)
            .ports(ports)
            .ppe_threads(cfg.ppe_threads)
            .latency(true)
            .sink(Arc::new(CountingSink::new(ports)))
            .build()?;
        pfe.start()
            .map_err(|e| ConfigError::new("start", e.to_string()))?;
        Ok(PfeDevice {
            cfg,
            pfe,
            pools: HashMap::new(),
        })
    }

    /// The engine (for its counters).
    pub fn pfe(&self) -> &Pfe {
        &self.pfe
    }

    fn pool(&mut self, frame_size: usize) -> Result<&Pool, ConfigError> {
        if !self.pools.contains_key(&frame_size) {
            if let DeviceProgram::L3fwd { .. } = self.cfg.program {
                let w = l3fwd::prepare(&l3fwd_config(&self.cfg, frame_size))?;
                let frames = (0..w.len())
                    .map(|i| (w.in_port(i), Arc::from(w.frame(i))))
                    .collect();
                self.pools.insert(frame_size, frames);
                return Ok(&self.pools[&frame_size]);
            }
            let traffic = Traffic::generate(&TrafficSpec {
                packets: POOL_FRAMES,
                frame_size,
                flows: self.cfg.flows,
                mix: Mix {
                    ipv4: 100,
                    ipv4_options: 0,
                    ipv6: 0,
                    non_ip: 0,
                },
                seed: self.cfg.seed,
                ..TrafficSpec::default()
            })?;
            let frames = (0..traffic.len())
                .map(|i| (traffic.port(i), Arc::from(traffic.frame(i))))
                .collect();
            self.pools.insert(frame_size, frames);
        }
        Ok(&self.pools[&frame_size])
    }
}

/// The l3fwd bench's workload settings for the device's routes and frames of `size` bytes.
fn l3fwd_config(cfg: &PfeDeviceConfig, size: usize) -> l3fwd::L3fwdBenchConfig {
    let routes = match cfg.program {
        DeviceProgram::L3fwd { routes } => routes,
        DeviceProgram::Filter => 0,
    };
    l3fwd::L3fwdBenchConfig {
        packets: POOL_FRAMES as u64,
        size,
        routes,
        flows: cfg.flows,
        seed: cfg.seed,
        ..l3fwd::L3fwdBenchConfig::default()
    }
}

impl Device for PfeDevice {
    fn trial(
        &mut self,
        frame_size: usize,
        offered_pps: f64,
        duration: Duration,
    ) -> Result<Trial, DeviceError> {
        let burst = self.cfg.burst as u64;
        // Settle: nothing in flight, a fresh latency window.
        self.pfe.drain();
        self.pfe.reset_latency();
        let before = self.pfe.stats();
        let pool = self.pool(frame_size)?.to_vec();
        let pfe = &self.pfe;
        let expected = (offered_pps * duration.as_secs_f64()).round() as u64;
        let pacer = Pacer::new(offered_pps, self.cfg.burst as u32)?;
        let start = Instant::now();
        let end = start + duration;
        let (mut offered, mut k, mut at) = (0u64, 0u64, 0usize);
        while offered < expected {
            let now = Instant::now();
            if now >= end {
                break;
            }
            let due = start + Duration::from_nanos(pacer.deadline_ns(k));
            if now < due {
                // Ahead of schedule: sleep when far ahead (the kernel's timer slack is tens
                // of microseconds), otherwise let the PPE threads have the core.
                let ahead = due - now;
                if ahead > Duration::from_micros(500) {
                    std::thread::sleep(ahead - Duration::from_micros(200));
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            let n = burst.min(expected - offered) as usize;
            let frames = (0..n).map(|i| pool[(at + i) % pool.len()].clone());
            pfe.offer_shared(frames)?;
            at = (at + n) % pool.len();
            offered += n as u64;
            k += 1;
        }
        pfe.drain();
        let after = pfe.stats();
        let latency = after
            .latency
            .filter(|l| l.count > 0)
            .map(|l| LatencySummary {
                count: l.count,
                p50_ns: l.p50_ns,
                p99_ns: l.p99_ns,
                p999_ns: l.p999_ns,
                max_ns: l.max_ns,
                mean_ns: l.mean_ns,
            });
        Ok(Trial {
            offered,
            received: after.frames_tx - before.frames_tx,
            latency,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slow trial (far below the engine's capacity): everything offered comes out, and no
    /// more is offered than the rate asks for; for both programs, and for two frame sizes in
    /// turn.
    #[test]
    fn a_slow_trial_loses_nothing() {
        for program in [DeviceProgram::Filter, DeviceProgram::L3fwd { routes: 1000 }] {
            let mut dev = PfeDevice::new(PfeDeviceConfig {
                program,
                ppe_threads: 2,
                ..PfeDeviceConfig::default()
            })
            .unwrap();
            for size in [128, 1518] {
                let t = dev
                    .trial(size, 20_000.0, Duration::from_millis(100))
                    .unwrap();
                // How many the generator offered before the trial's end depends on how
                // busy the machine is (at most what the rate asks for); none is lost.
                assert!(t.offered > 0 && t.offered <= 2_000, "{program:?}: {t:?}");
                assert_eq!(t.received, t.offered, "{program:?}");
                assert_eq!(t.latency.map(|l| l.count), Some(t.received));
            }
            let stats = dev.pfe().stats();
            assert!(stats.is_conserved() && stats.dropped == 0, "{stats:?}");
        }
    }
}
