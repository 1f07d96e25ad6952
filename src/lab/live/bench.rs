//! The filter through real interfaces (`pfemu bench ports`), beside the same filter fed in
//! process (`pfemu bench filter`).
//!
//! ```text
//! generator thread --sendmmsg--> OFFER veth ==> port 0's veth --ring--> PFE (filter)
//!                                                                          |
//!                           port 1's veth <==sendmmsg (PPE threads) <------+
//! ```
//!
//! A thread sends plain IPv4 frames (every one forwarded by the filter) into the offer
//! interface, whose veth peer is bound to port 0, as fast as one `sendmmsg` loop goes, for
//! the run's duration; port 1 sends them out. The report gives the rates offered, taken
//! by port 0 and sent out of port 1, where frames were lost (on the veth, whose backlog
//! overflows before the ring when the receiver is slower than the sender: the offer
//! interface's `tx_dropped` and port 0's `rx_dropped`; in the ring; on the way out), and
//! the in-process filter's rate on the same frames, PPE threads and duration. Every
//! frame sent is accounted for: [`PortsBenchReport::accounted`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::lab::bench::filter::{self, FilterBenchConfig};
use crate::lab::bench::settings::EngineSettings;
use crate::lab::bench::traffic::{Traffic, TrafficSpec};
use crate::lab::live::{Live, LiveConfig, LiveError, LiveProgram, LiveReport};
use crate::lab::ports::{PortKind, PortSpec, PortsConfig, RawSocket};

/// A run's settings.
#[derive(Clone, Debug)]
pub struct PortsBenchConfig {
    /// The interface the generator sends into: a veth whose peer is port 0's interface.
    pub offer: String,
    /// Port 0's and port 1's interfaces (port 1: where the filter forwards).
    pub port0: String,
    /// See `port0`.
    pub port1: String,
    /// Frame size, bytes.
    pub size: usize,
    /// Flows.
    pub flows: u32,
    /// How long the generator sends, seconds.
    pub duration_s: f64,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Also run the in-process filter on the same frames for comparison.
    pub in_process: bool,
}

/// What a run measured.
#[derive(Clone, Debug, Serialize)]
pub struct PortsBenchReport {
    /// Frame size, bytes.
    pub size: usize,
    /// PPE threads.
    pub ppe_threads: usize,
    /// Seconds the generator sent.
    pub elapsed_s: f64,
    /// Frames the generator's `sendmmsg` calls took.
    pub offered: u64,
    /// Frames the kernel refused to the generator.
    pub offer_errors: u64,
    /// `offered` per second, millions.
    pub offered_mpps: f64,
    /// Frames lost on the veth between the generator and port 0 (its backlog was full):
    /// the offer interface's `tx_dropped` and port 0's `rx_dropped` over the run.
    pub veth_dropped: u64,
    /// Frames port 0 injected into the engine.
    pub port_in: u64,
    /// `port_in` per second, millions.
    pub port_in_mpps: f64,
    /// Frames lost at port 0: ring full, cut, unread at the stop.
    pub port_dropped: u64,
    /// Frames port 1 sent out.
    pub port_out: u64,
    /// `port_out` per second, millions.
    pub port_out_mpps: f64,
    /// The in-process filter's rate on the same frames, PPE threads and duration.
    pub in_process_mpps: Option<f64>,
    /// The live run's full report (ports, engine).
    pub live: LiveReport,
}

impl PortsBenchReport {
    /// Every frame offered is accounted for: lost on the veth, injected, or lost at
    /// port 0; every frame injected left port 1 (the filter forwards them all) or was
    /// counted as a drop; and the live run accounted for all of its frames.
    pub fn accounted(&self) -> bool {
        self.offered == self.veth_dropped + self.port_in + self.port_dropped
            && self.live.accounted()
    }
}

/// A counter of `/sys/class/net/IFACE/statistics/` (0 when it cannot be read).
fn if_stat(iface: &str, name: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{iface}/statistics/{name}"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs the benchmark (see the module docs).
pub fn run(cfg: &PortsBenchConfig) -> Result<PortsBenchReport, LiveError> {
    let length = crate::duration::secs_setting("duration", cfg.duration_s)?;
    let traffic = Traffic::generate(&TrafficSpec {
        packets: 4096,
        frame_size: cfg.size,
        flows: cfg.flows,
        mix: "ipv4=100".parse()?,
        seed: 1,
        ..TrafficSpec::default()
    })?;
    let live_cfg = LiveConfig {
        ppe_threads: cfg.ppe_threads,
        ..LiveConfig::new(
            LiveProgram::Filter,
            PortsConfig::new(vec![
                PortSpec {
                    port: 0,
                    kind: PortKind::Interface(cfg.port0.clone()),
                },
                PortSpec {
                    port: 1,
                    kind: PortKind::Interface(cfg.port1.clone()),
                },
            ]),
        )
    };
    let tx = RawSocket::open(&cfg.offer, false)?;
    let live = Live::start(&live_cfg)?;
    let dropped_before = if_stat(&cfg.offer, "tx_dropped") + if_stat(&cfg.port0, "rx_dropped");

    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let (offered, errors) = std::thread::scope(|s| {
        let gen = s.spawn(|| {
            let (mut sent, mut errors) = (0u64, 0u64);
            let n = traffic.len();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let burst = (0..256).map(|k| traffic.frame((i + k) % n));
                let (ok, err) = tx.send(burst);
                sent += ok;
                errors += 256 - ok;
                if err.is_some() && ok == 0 {
                    // The kernel refuses every frame (the link went down): stop offering.
                    break;
                }
                i = (i + 256) % n;
            }
            (sent, errors)
        });
        // The run's clock: the scope waits for the generator, which looks at `stop`.
        std::thread::sleep(length);
        stop.store(true, Ordering::Relaxed);
        gen.join().unwrap_or((0, 0))
    });
    let elapsed = start.elapsed().as_secs_f64();
    let live = live.stop()?;
    let veth_dropped = (if_stat(&cfg.offer, "tx_dropped") + if_stat(&cfg.port0, "rx_dropped"))
        .saturating_sub(dropped_before);

    let in_process_mpps = if cfg.in_process {
        let fcfg = FilterBenchConfig {
            engine: EngineSettings {
                ppe_threads: cfg.ppe_threads,
                ..EngineSettings::default()
            },
            size: cfg.size,
            flows: cfg.flows,
            duration_s: Some(cfg.duration_s),
            ..FilterBenchConfig::default()
        };
        Some(filter::run_with_progress(&fcfg, &traffic, |_, _| {})?.mpps)
    } else {
        None
    };
    let p0 = live.ports.ports.first().cloned().unwrap_or_default();
    let p1 = live.ports.ports.get(1).cloned().unwrap_or_default();
    let mpps = |n: u64| n as f64 / elapsed.max(1e-9) / 1e6;
    Ok(PortsBenchReport {
        size: cfg.size,
        ppe_threads: cfg.ppe_threads,
        elapsed_s: elapsed,
        offered,
        offer_errors: errors,
        offered_mpps: mpps(offered),
        veth_dropped,
        port_in: p0.rx_frames,
        port_in_mpps: mpps(p0.rx_frames),
        port_dropped: p0.rx_dropped(),
        port_out: p1.tx_frames,
        port_out_mpps: mpps(p1.tx_frames),
        in_process_mpps,
        live,
    })
}
